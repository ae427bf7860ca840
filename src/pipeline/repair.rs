//! Gap repair after a lost slot (DESIGN.md §13): the outbox table is the
//! second source of truth.
//!
//! A lost slot cannot deliver the changes committed after its confirmed
//! position. The repair recreates it with an exported snapshot and, inside
//! that snapshot, publishes every retained outbox row committed after the
//! last acknowledged transaction, in per-aggregate sequence order; then the
//! new slot streams from its consistent point. The snapshot shows exactly the
//! transactions committed before that point, so nothing falls between the
//! two. Rows published twice carry the same `event_id` (the contract allows
//! duplicates, never loss).
//!
//! "Committed after the acknowledged position": by
//! `pg_xact_commit_timestamp(xmin)` when `track_commit_timestamp = on`, from
//! the acknowledged transaction's commit time (kept in the offset store) minus
//! `repair.commit_time_margin_ms` (commit timestamps and WAL order can differ
//! for concurrent commits); otherwise by `occurred_at` minus
//! `repair.occurred_at_margin_ms` (it is the writing transaction's start).
//!
//! Resumable: the plan is stored before the slot is recreated and removed
//! after the new offset is persisted. A repair killed half-way finds its plan
//! and the new slot on the next start and publishes the same rows again, now
//! from the current state (which also holds rows the slot will deliver:
//! duplicates, never loss).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::{StreamExt as _, pin_mut};
use tokio_postgres::Client;
use tracing::{info, warn};

use crate::checkpoint::{OffsetStore, PendingRepair, StoredOffset};
use crate::config::Config;
use crate::coverage;
use crate::metrics::Metrics;
use crate::outbox::{ChangeContext, OutboxMapper};
use crate::pg::{Lsn, PgError, PgTimestamp, QualifiedTable, quote_ident};
use crate::pgoutput::{ColumnValue, Relation, RelationColumn, TupleData};
use crate::sink::KafkaSink;

use super::PipelineError;
use super::poison::{PoisonPolicyRouter, Route};

/// Which rows a repair publishes: committed at or after `since`, judged by
/// the commit timestamp or by `occurred_at`.
const BY_COMMIT_TIMESTAMP: &str = "commit-timestamp";
const BY_OCCURRED_AT: &str = "occurred-at";

/// Why a repair cannot start; the operator decides.
fn refused(reason: impl Into<String>, fix: impl Into<String>) -> PipelineError {
    PipelineError::RepairRefused {
        reason: reason.into(),
        fix: fix.into(),
    }
}

fn sql(during: &str) -> impl Fn(tokio_postgres::Error) -> PipelineError + '_ {
    move |e| PipelineError::Pg(PgError::sql(during.to_owned(), e))
}

/// Plans the repair of a lost slot from its stored offset: which bound, from
/// when, and whether the retained rows can cover the gap at all.
pub(crate) async fn plan(
    client: &Client,
    config: &Config,
    stored: &StoredOffset,
    accept_gap: bool,
) -> Result<PendingRepair, PipelineError> {
    let e = sql("planning the gap repair");
    let table =
        coverage::configured_table(&config.outbox).map_err(|e| PipelineError::Protocol {
            lsn: Lsn::ZERO,
            what: format!("invalid outbox settings: {e}"),
        })?;
    let Some(acked) = stored.acked_commit_time else {
        return Err(refused(
            format!(
                "the offset store holds {} for the lost slot but not the commit time of the last acknowledged \
                 transaction (it was written by an older version), so the rows to publish again cannot be chosen",
                stored.lsn
            ),
            "replay the outbox rows committed since the slot was lost by hand (docs/operations.md, \"Slot \
             lost\"), then start with --recreate-slot --accept-gap",
        ));
    };
    let track: String = client
        .query_one("SELECT current_setting('track_commit_timestamp')", &[])
        .await
        .map_err(&e)?
        .try_get(0)
        .map_err(&e)?;
    let columns = table_columns(client, &table).await?;
    let has_occurred_at = columns.iter().any(|(name, _)| name == "occurred_at");
    let (bound, margin_ms) = if track == "on" {
        (BY_COMMIT_TIMESTAMP, config.repair.commit_time_margin_ms)
    } else if has_occurred_at {
        (BY_OCCURRED_AT, config.repair.occurred_at_margin_ms)
    } else {
        return Err(refused(
            format!(
                "track_commit_timestamp is off and {table} has no occurred_at column: the rows committed after \
                 the lost slot's position cannot be told apart"
            ),
            "ALTER SYSTEM SET track_commit_timestamp = on; (restart PostgreSQL) for future repairs; for this \
             one, replay by hand and start with --recreate-slot --accept-gap",
        ));
    };
    let since = PgTimestamp(acked.0 - (margin_ms as i64) * 1000);
    // The table proves the gap is covered only if it still holds a row from
    // before the acknowledged commit: otherwise rows in between may have been
    // pruned already.
    let oldest: Option<f64> = if has_occurred_at {
        client
            .query_one(
                &format!(
                    "SELECT ((extract(epoch FROM min(occurred_at)) - 946684800) * 1e6)::float8 FROM {table}"
                ),
                &[],
            )
            .await
            .map_err(&e)?
            .try_get(0)
            .map_err(&e)?
    } else {
        Some(f64::MIN) // no time column: the table's history cannot be judged
    };
    let covered = oldest.is_some_and(|o| o <= acked.0 as f64);
    if !covered && !accept_gap {
        let from = micros_text(acked.0);
        let window = match oldest {
            Some(o) => format!("{from} to {}", micros_text(o as i64)),
            None => format!("{from} to now (the table is empty)"),
        };
        return Err(refused(
            format!(
                "{table} holds no row older than the last acknowledged commit ({from}), so rows committed \
                 in {window} may have been deleted before they were published: they cannot be repaired"
            ),
            "if nothing was deleted early (or you accept the loss in that window), start again with \
             --accept-gap; keep outbox rows longer than a slot can be lost for (docs/outbox-table.md)",
        ));
    }
    if !covered {
        warn!(
            since = %micros_text(acked.0),
            "--accept-gap: rows deleted from the outbox before they were published are not repaired"
        );
    }
    Ok(PendingRepair {
        v: 1,
        stored_lsn: stored.lsn,
        since_micros: since.0,
        bound: bound.to_owned(),
    })
}

/// Publishes the rows `pending` chooses, as `client` sees them: inside the
/// exported snapshot, or (a resumed repair) the current state. `at` is the new
/// slot's consistent point, the `lsn` header of every repaired record. Returns
/// the number of rows published; all are acknowledged by Kafka on return.
pub(crate) async fn publish(
    client: &Client,
    config: &Config,
    store: &OffsetStore,
    metrics: &Metrics,
    pending: &PendingRepair,
    snapshot: Option<&str>,
    at: Lsn,
) -> Result<u64, PipelineError> {
    let e = sql("reading the outbox rows to repair");
    let invalid = |e: crate::outbox::ConfigError| PipelineError::Protocol {
        lsn: Lsn::ZERO,
        what: format!("invalid outbox settings: {e}"),
    };
    let table = coverage::configured_table(&config.outbox).map_err(invalid)?;
    let names = config.outbox.column_names().map_err(invalid)?;
    let mapper = OutboxMapper::new(&config.outbox).map_err(invalid)?;
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
        .map_err(|source| PipelineError::Mapping { lsn: at, source })?;

    let time = match pending.bound.as_str() {
        BY_COMMIT_TIMESTAMP => "coalesce(pg_xact_commit_timestamp(xmin), occurred_at)",
        _ => "occurred_at",
    };
    // Rows whose commit timestamp is unknown (frozen, or committed before it
    // was tracked) fall back to occurred_at, which is earlier still.
    let time = if pending.bound == BY_COMMIT_TIMESTAMP
        && !columns.iter().any(|(n, _)| n == "occurred_at")
    {
        "pg_xact_commit_timestamp(xmin)"
    } else {
        time
    };
    let micros = format!("((extract(epoch FROM {time}) - 946684800) * 1e6)::float8");
    // Qualified: a bare name in ORDER BY would sort by the ::text output
    // column of the same name (10 before 2).
    let mut order = vec![
        format!("o.{}", quote_ident(&names.aggregate_type)),
        format!("o.{}", quote_ident(&names.aggregate_id)),
    ];
    match &names.aggregate_sequence {
        Some(seq) => order.push(format!("o.{}", quote_ident(seq))),
        None => order.push(micros.clone()),
    }
    let select: Vec<String> = columns
        .iter()
        .map(|(name, _)| format!("{}::text", quote_ident(name)))
        .collect();
    let filter = format!("{micros} >= $1::float8");
    if let Some(snapshot) = snapshot {
        client
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET TRANSACTION SNAPSHOT '{}'",
                snapshot.replace('\'', "''")
            ))
            .await
            .map_err(&e)?;
    }
    let since = pending.since_micros as f64;
    let total: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE {filter}"),
            &[&since],
        )
        .await
        .map_err(&e)?
        .try_get(0)
        .map_err(&e)?;
    metrics
        .repair_rows_left
        .store(total.max(0) as u64, Ordering::Relaxed);
    info!(rows = total, table = %table, bound = %pending.bound, since = %micros_text(pending.since_micros),
        at = %at, "gap repair: publishing retained outbox rows");

    let (sink, mut reports) = KafkaSink::<u64>::with_topics(&config.kafka, &config.topics)?;
    let router = PoisonPolicyRouter::new(&config.outbox);
    let query = format!(
        "SELECT {}, {micros}::int8 FROM {table} AS o WHERE {filter} ORDER BY {}",
        select.join(", "),
        order.join(", ")
    );
    let rows = client
        .query_raw(
            &query,
            [&since as &(dyn tokio_postgres::types::ToSql + Sync)],
        )
        .await
        .map_err(&e)?;
    pin_mut!(rows);
    let max_in_flight = config.limits.max_in_flight_events.max(1);
    let mut in_flight: HashMap<u64, String> = HashMap::new();
    // The last number published per aggregate, for live gap detection: the
    // stream continues after these (at LSNs beyond `at`).
    let mut last_sequences: HashMap<(String, String), i64> = HashMap::new();
    let mut sent: u64 = 0;
    let mut delivered: u64 = 0;
    while let Some(row) = rows.next().await {
        let row = row.map_err(&e)?;
        let values: Vec<ColumnValue> = (0..columns.len())
            .map(|i| {
                Ok(match row.try_get::<_, Option<String>>(i).map_err(&e)? {
                    Some(text) => ColumnValue::Text(Bytes::from(text)),
                    None => ColumnValue::Null,
                })
            })
            .collect::<Result<_, PipelineError>>()?;
        let commit_time = PgTimestamp(row.try_get::<_, i64>(columns.len()).map_err(&e)?);
        let tuple = TupleData { columns: values };
        let ctx = ChangeContext {
            lsn: at,
            commit_time,
        };
        let mapped = mapper.map_insert(&bound, &tuple, &ctx);
        let raw = || Bytes::from_static(b"{}");
        let event = match router.route(mapped, raw, store, at, commit_time)? {
            Route::Publish(event) | Route::DeadLetter(event) => event,
        };
        if let Some(seq) = super::sequences::sequence_of(&event) {
            let last = last_sequences
                .entry((event.aggregate_type.clone(), event.aggregate_id.clone()))
                .or_insert(seq);
            *last = (*last).max(seq);
        }
        while in_flight.len() >= max_in_flight {
            delivered += wait_report(&mut reports, &mut in_flight, metrics).await?;
        }
        sent += 1;
        in_flight.insert(sent, event.event_id.clone());
        sink.send(&event, sent).await?;
        crate::failpoint!("during-repair");
    }
    while !in_flight.is_empty() {
        delivered += wait_report(&mut reports, &mut in_flight, metrics).await?;
    }
    if snapshot.is_some() {
        client.batch_execute("COMMIT").await.map_err(&e)?;
    }
    metrics.repair_rows_left.store(0, Ordering::Relaxed);
    let sequences: Vec<(String, String, i64, Lsn)> = last_sequences
        .into_iter()
        .map(|((t, i), seq)| (t, i, seq, at))
        .collect();
    tokio::task::block_in_place(|| store.save_sequences(&sequences))?;
    Ok(delivered)
}

/// Takes one delivery report: a failure ends the repair (its plan stays, the
/// next start repeats it).
async fn wait_report(
    reports: &mut tokio::sync::mpsc::UnboundedReceiver<crate::sink::DeliveryReport<u64>>,
    in_flight: &mut HashMap<u64, String>,
    metrics: &Metrics,
) -> Result<u64, PipelineError> {
    let Some(report) = reports.recv().await else {
        return Err(PipelineError::Protocol {
            lsn: Lsn::ZERO,
            what: "the Kafka producer stopped during the gap repair".into(),
        });
    };
    let event_id = in_flight.remove(&report.token).unwrap_or_default();
    match report.result {
        Ok(_) => {
            metrics.repair_rows.fetch_add(1, Ordering::Relaxed);
            let _ =
                metrics
                    .repair_rows_left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        Some(n.saturating_sub(1))
                    });
            Ok(1)
        }
        Err(source) => Err(PipelineError::Delivery {
            event_id,
            lsn: Lsn::ZERO,
            source,
        }),
    }
}

/// `(name, type OID)` of the table's columns, in attribute order.
async fn table_columns(
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

/// A time as RFC 3339 text, for messages.
fn micros_text(micros_since_2000: i64) -> String {
    let unix_ms = PgTimestamp(micros_since_2000).unix_millis();
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_rfc3339() {
        // 2000-01-01T00:00:00Z is PostgreSQL's epoch.
        assert_eq!(micros_text(0), "2000-01-01T00:00:00.000Z");
        // 2026-12-01T01:02:03.456Z
        let unix_ms: i64 = 1_796_086_923_456;
        let micros = (unix_ms - 946_684_800_000) * 1000;
        assert_eq!(micros_text(micros), "2026-12-01T01:02:03.456Z");
    }
}
