//! The outbox table as the second source of truth (DESIGN.md §13): the
//! commands that work on retained rows rather than on the stream.
//!
//! - `repair`: after a lost slot, publish the rows committed after the
//!   acknowledged position (run by the connector's start);
//! - `replay`: publish retained rows on demand (`outbox-cdc replay`);
//! - `prune`: delete rows provably published (`[prune]`, `outbox-cdc prune`);
//! - here: reading rows as text through a synthetic [`Relation`], mapping
//!   them like streamed inserts, and sending them with bounded in-flight
//!   records (also used by `audit`).
//!
//! Rows are read with `query_raw`, which streams: memory holds at most the
//! rows the connection has buffered plus `limits.max_in_flight_events`
//! records waiting for Kafka.

use std::collections::HashMap;

use bytes::Bytes;
use tokio_postgres::{Client, Row};

use crate::config::Config;
use crate::coverage;
use crate::outbox::settings::ColumnNames;
use crate::outbox::{BoundRelation, ChangeContext, MapError, OutboxEvent, OutboxMapper};
use crate::pg::control::query_value;
use crate::pg::{Lsn, PgError, PgTimestamp, QualifiedTable, quote_ident};
use crate::pgoutput::{ColumnValue, Relation, RelationColumn, TupleData};
use crate::sink::{DeliveryReport, KafkaSink};

use crate::error::PipelineError;

mod passed;
mod prune;
pub(crate) mod repair;
mod replay;

pub use passed::{PassedBound, passed_bound};
pub use prune::{AckedPosition, PruneError, PruneReport, prune_once, prune_stored, run_pruner};
pub use replay::{
    EventIdSet, H_REPAIRED, ReplayError, ReplayOptions, ReplayReport, replay, replay_with,
};

pub(crate) fn sql(during: &str) -> impl Fn(tokio_postgres::Error) -> PipelineError + '_ {
    move |e| PipelineError::Pg(PgError::sql(during.to_owned(), e))
}

/// The configured outbox table as the catalog shows it now, bound to the
/// mapper through a synthetic Relation (the columns a pgoutput Relation
/// message would carry).
pub(crate) struct RetainedTable {
    pub(crate) table: QualifiedTable,
    pub(crate) names: ColumnNames,
    /// `(name, type OID)` in attribute order.
    pub(crate) columns: Vec<(String, u32)>,
    mapper: OutboxMapper,
    bound: BoundRelation,
    relation: Relation,
}

impl RetainedTable {
    pub(crate) async fn load(client: &Client, config: &Config) -> Result<Self, PipelineError> {
        let table = coverage::configured_table(&config.outbox)?;
        let names = config.outbox.column_names()?;
        let mapper = OutboxMapper::new(&config.outbox)?;
        let columns = table_columns(client, &table).await?;
        let relation = Relation {
            oid: 0,
            namespace: table.schema.clone(),
            name: table.name.clone(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .map(|(name, type_oid)| RelationColumn {
                    flags: 0,
                    name: name.clone(),
                    type_oid: *type_oid,
                    type_modifier: -1,
                })
                .collect(),
        };
        let bound = mapper
            .bind(&relation)
            .map_err(|source| PipelineError::Mapping {
                lsn: Lsn::ZERO,
                source,
            })?;
        Ok(RetainedTable {
            table,
            names,
            columns,
            mapper,
            bound,
            relation,
        })
    }

    pub(crate) fn has_column(&self, name: &str) -> bool {
        self.columns.iter().any(|(n, _)| n == name)
    }

    /// Every column as text, in attribute order: what [`Self::map`] reads
    /// from the first `columns.len()` fields of a row.
    pub(crate) fn select_list(&self) -> String {
        self.columns
            .iter()
            .map(|(name, _)| format!("{}::text", quote_ident(name)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Per-aggregate order: type, id, then the sequence (or `fallback` when
    /// the table has none). Qualified with alias `o`: a bare name would sort
    /// by the `::text` output column of the same name (10 before 2).
    pub(crate) fn order_by(&self, fallback: &str) -> String {
        let mut order = vec![
            format!("o.{}", quote_ident(&self.names.aggregate_type)),
            format!("o.{}", quote_ident(&self.names.aggregate_id)),
        ];
        match &self.names.aggregate_sequence {
            Some(seq) => order.push(format!("o.{}", quote_ident(seq))),
            None => order.push(fallback.to_owned()),
        }
        order.join(", ")
    }

    /// Maps one row read with [`Self::select_list`] first.
    pub(crate) fn map(
        &self,
        row: &Row,
        ctx: &ChangeContext,
    ) -> Result<Result<OutboxEvent, MapError>, PipelineError> {
        let tuple = self.tuple(row)?;
        Ok(self.mapper.map_insert(&self.bound, &tuple, ctx))
    }

    /// The row as the stream dead-letters an insert it cannot map: its
    /// columns by name as a JSON object, values over `max_bytes` in all
    /// shortened (review F15: a replay sent `{}`).
    pub(crate) fn row_json(&self, row: &Row, max_bytes: usize) -> Result<Bytes, PipelineError> {
        let tuple = self.tuple(row)?;
        Ok(crate::poison::row_as_json(
            Some(&self.relation),
            &tuple,
            max_bytes,
        ))
    }

    /// The first `columns.len()` fields of a row read with
    /// [`Self::select_list`], as a streamed insert carries them (text).
    fn tuple(&self, row: &Row) -> Result<TupleData, PipelineError> {
        let e = sql("reading retained outbox rows");
        let columns = (0..self.columns.len())
            .map(|i| {
                Ok(match row.try_get::<_, Option<String>>(i).map_err(&e)? {
                    Some(text) => ColumnValue::Text(Bytes::from(text)),
                    None => ColumnValue::Null,
                })
            })
            .collect::<Result<_, PipelineError>>()?;
        Ok(TupleData { columns })
    }
}

impl RetainedTable {
    /// Maps one row read as `SELECT <select_list>, <commit time>::int8`: the
    /// row's event (or why it is none) as if it had been streamed at `at`,
    /// and its commit time.
    pub(crate) fn read(
        &self,
        row: &Row,
        at: Lsn,
    ) -> Result<(Result<OutboxEvent, MapError>, PgTimestamp), PipelineError> {
        let e = sql("reading retained outbox rows");
        let commit_time = PgTimestamp(row.try_get::<_, i64>(self.columns.len()).map_err(&e)?);
        let ctx = ChangeContext {
            lsn: at,
            commit_time,
        };
        Ok((self.map(row, &ctx)?, commit_time))
    }
}

/// Whether the server keeps commit timestamps (`track_commit_timestamp`).
pub(crate) async fn tracks_commit_timestamps(client: &Client) -> Result<bool, PipelineError> {
    let e = sql("reading track_commit_timestamp");
    let select = "SELECT current_setting('track_commit_timestamp') = 'on'";
    query_value(client, select, &[]).await.map_err(&e)
}

/// The producer of a [`BoundedSender`]: idempotent, or transactional (all
/// its records in one Kafka transaction, committed by `finish`).
enum Producer {
    Idempotent(KafkaSink<u64>),
    Transactional(crate::sink::TransactionalSink<u64>),
}

impl Producer {
    fn sink(&self) -> &KafkaSink<u64> {
        match self {
            Producer::Idempotent(sink) => sink,
            Producer::Transactional(sink) => sink,
        }
    }
}

/// A Kafka producer with at most `max` records in flight; a failed delivery
/// ends the caller's work with the event id.
pub(crate) struct BoundedSender {
    sink: Producer,
    reports: tokio::sync::mpsc::UnboundedReceiver<DeliveryReport<u64>>,
    in_flight: HashMap<u64, String>,
    sent: u64,
    max: usize,
}

impl BoundedSender {
    pub(crate) fn new(config: &Config) -> Result<Self, PipelineError> {
        let (sink, reports) = KafkaSink::<u64>::with_topics(&config.kafka, &config.topics)?;
        Ok(BoundedSender {
            sink: Producer::Idempotent(sink),
            reports,
            in_flight: HashMap::new(),
            sent: 0,
            max: config.limits.max_in_flight_events.max(1),
        })
    }

    /// A sender whose records all go in one Kafka transaction of
    /// `transactional_id` (begun here, committed by [`Self::finish`]), for
    /// read_committed consumers of the exactly-once mode. An error leaves
    /// the transaction open: the next producer with that id aborts it.
    pub(crate) fn transactional(
        config: &Config,
        transactional_id: &str,
    ) -> Result<Self, PipelineError> {
        let timeout = config.delivery.transaction_timeout();
        let (sink, reports) = crate::sink::TransactionalSink::<u64>::new(
            &config.kafka,
            &config.topics,
            transactional_id,
            timeout,
        )?;
        tokio::task::block_in_place(|| {
            sink.init_transactions(timeout)?;
            sink.begin_transaction()
        })?;
        Ok(BoundedSender {
            sink: Producer::Transactional(sink),
            reports,
            in_flight: HashMap::new(),
            sent: 0,
            max: config.limits.max_in_flight_events.max(1),
        })
    }

    /// Sends one record after waiting for room; returns how many earlier
    /// records Kafka acknowledged meanwhile.
    pub(crate) async fn send(&mut self, event: &OutboxEvent) -> Result<u64, PipelineError> {
        let mut delivered = 0;
        while self.in_flight.len() >= self.max {
            delivered += self.wait_report().await?;
        }
        self.sent += 1;
        self.sink.sink().send(event, self.sent).await?;
        self.in_flight.insert(self.sent, event.event_id.clone());
        Ok(delivered)
    }

    /// Waits for every record in flight (and commits the transaction of a
    /// transactional sender); returns how many were acknowledged.
    pub(crate) async fn finish(&mut self) -> Result<u64, PipelineError> {
        let mut delivered = 0;
        while !self.in_flight.is_empty() {
            delivered += self.wait_report().await?;
        }
        if let Producer::Transactional(sink) = &self.sink {
            let timeout = std::time::Duration::from_secs(60);
            tokio::task::block_in_place(|| sink.commit_transaction(timeout))?;
        }
        Ok(delivered)
    }

    async fn wait_report(&mut self) -> Result<u64, PipelineError> {
        let Some(report) = self.reports.recv().await else {
            return Err(PipelineError::Internal {
                what: format!(
                    "the Kafka producer's delivery reports ended while {} retained outbox rows were in flight",
                    self.in_flight.len()
                ),
            });
        };
        let event_id = self.in_flight.remove(&report.token).unwrap_or_default();
        match report.result {
            Ok(_) => Ok(1),
            Err(source) => Err(PipelineError::Delivery {
                event_id,
                lsn: Lsn::ZERO,
                source,
            }),
        }
    }
}

/// `(name, type OID)` of the table's columns, in attribute order.
pub(crate) async fn table_columns(
    client: &Client,
    table: &QualifiedTable,
) -> Result<Vec<(String, u32)>, PipelineError> {
    let e = sql("reading the outbox table's columns");
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(&e)?;
    rows.iter()
        .map(|r| Ok((r.try_get(0).map_err(&e)?, r.try_get(1).map_err(&e)?)))
        .collect()
}

/// A time (microseconds since 2000-01-01) as RFC 3339 text, for messages.
pub(crate) fn micros_text(micros_since_2000: i64) -> String {
    crate::pg::PgTimestamp(micros_since_2000).rfc3339()
}

/// A timestamp expression as microseconds since 2000-01-01, float8.
pub(crate) fn micros_of(expr: &str) -> String {
    format!("((extract(epoch FROM {expr}) - 946684800) * 1e6)::float8")
}
