//! Pruning (DESIGN.md §13): delete outbox rows older than `[prune] retention`
//! that are certainly published, so that a gap repair always finds what it
//! needs and nothing unpublished is ever lost to cleanup.
//!
//! A row is deleted only when BOTH hold, checked by the DELETE statement
//! itself (never by a list computed earlier):
//! - `occurred_at` is older than the retention;
//! - its transaction committed before the acknowledged position, proven by
//!   facts PostgreSQL keeps (never by `occurred_at`, which a writer may set
//!   to any time, audit F7):
//!   - by transaction id: an xid X such that every transaction older than X
//!     had ended before a WAL position P at or before the acknowledged LSN
//!     proves every row whose `xmin` precedes X committed before it. Two
//!     such witnesses: the slot's `catalog_xmin` (the oldest running xid of
//!     a running-transactions record at or before its `confirmed_flush_lsn`,
//!     which must be at or before the acknowledged LSN), and the last
//!     checkpoint's `oldest_active_xid` (`pg_control_checkpoint()`,
//!     computed before its record, which must be at or before the
//!     acknowledged LSN); the newer one is used.
//!
//!   Commit timestamps prove nothing here (review P1): they come from the
//!   wall clock, which can step back (NTP, a restored VM, a failover to a
//!   host whose clock is behind), so a transaction committed after the
//!   acknowledged LSN can carry a timestamp earlier than the acknowledged
//!   commit's by any amount. Transaction ids are assigned and retired by the
//!   server alone.
//!
//! Rows of aggregates parked by the dead-letter policy are not deleted while
//! parked (audit F5): a dead-lettered record may carry only a pointer to the
//! row (its payload was too large), and `outbox-cdc release` is still to
//! come. All their rows are kept, not only those from the park position on:
//! a row's LSN is not in the table.
//!
//! The acknowledged position (LSN and commit time) is the one the offset
//! store holds: read from the store by the one-shot `outbox-cdc prune`, and
//! from the running session's durable acked LSN and
//! [`DurableCommitTime`](crate::checkpoint::DurableCommitTime) (set after
//! each persist) by `run`. Without one nothing is deleted.
//!
//! Deletes go in batches of `batch_rows` rows, by `ctid` from an index scan on
//! `occurred_at`, each batch its own statement (its own short transaction).
//!
//! A partition is dropped for its bounds, never for its rows alone (audit
//! F3): only a leaf of a RANGE partitioning on `occurred_at` alone whose
//! upper bound is at or before the retention cutoff (compared by PostgreSQL,
//! in the key's type), so no row the application writes from now on can
//! belong to it. HASH, LIST and DEFAULT leaves, and ranges reaching past the
//! cutoff, only lose rows. Such a leaf is detached, then dropped only if
//! every row in it still qualifies (else attached again). Writers never wait
//! behind the pruner for longer than `prune.lock_timeout_ms`: PostgreSQL 14+
//! detaches `CONCURRENTLY` (no lock that conflicts with inserts; an
//! interrupted one stays pending and a later prune FINALIZEs it); PostgreSQL
//! 13, or a partitioned table with a DEFAULT partition (where `CONCURRENTLY`
//! is refused), detaches in a transaction whose lock wait and statement are
//! bounded by that timeout, and leaves the partition for a later prune when
//! the lock is not granted in time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::Client;
use tokio_postgres::types::Type;
use tracing::{debug, info, warn};

use crate::checkpoint::{OffsetStore, ParkedAggregate};
use crate::config::Config;
use crate::coverage;
use crate::metrics::Metrics;
use crate::pg::control::{query_value, server_version_num};
use crate::pg::{Lsn, PgConnectConfig, PgTimestamp, QualifiedTable, quote_ident};

use super::passed::{older, xid_witness};
use super::{micros_text, sql, table_columns};
use crate::error::{PipelineError, StartRefused};

/// Why pruning cannot run at all; the operator fixes the setup.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("cannot prune {table}: {reason}. Fix: {fix}")]
    Refused {
        table: String,
        reason: String,
        fix: String,
    },
    /// The offset store's position for the slot belongs to another database
    /// cluster (a restored or copied store, a URL pointing elsewhere): its
    /// acknowledged time says nothing about this cluster's rows.
    #[error(
        "cannot prune: the offset store holds slot {slot:?} for database cluster {stored}, but {key} is \
         cluster {server}. Fix: point {key} at the cluster the store belongs to, or give this cluster its \
         own offsets.path"
    )]
    OtherCluster {
        slot: String,
        stored: String,
        server: String,
        key: &'static str,
    },
}

impl From<crate::pg::PgError> for PruneError {
    fn from(e: crate::pg::PgError) -> Self {
        PruneError::Pipeline(PipelineError::Pg(e))
    }
}

/// The acknowledged position rows are judged against: every transaction
/// whose commit record ends at or before `lsn` is in Kafka, the last of them
/// committed at `commit_time`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckedPosition {
    pub lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// What one prune did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Rows deleted by batch deletes.
    pub deleted_rows: u64,
    /// Leaf partitions detached and dropped, with their row counts.
    pub dropped_partitions: Vec<(String, u64)>,
    /// Set when nothing was tried, and why.
    pub skipped: Option<String>,
    /// The acknowledged commit time the rows were judged against.
    pub acked_commit_time: Option<PgTimestamp>,
    /// The witness that proved rows committed before the acknowledged LSN
    /// by their transaction id (None: none at or before it).
    pub witness: Option<String>,
    /// Parked aggregates whose rows were kept.
    pub parked_aggregates: usize,
    /// Partitions that qualify for dropping but were left for a later
    /// prune, and why (a lock not granted in time, a detach pending).
    pub deferred_partitions: Vec<(String, String)>,
}

impl PruneReport {
    pub fn rows(&self) -> u64 {
        self.deleted_rows + self.dropped_partitions.iter().map(|(_, n)| n).sum::<u64>()
    }
}

impl std::fmt::Display for PruneReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(why) = &self.skipped {
            return write!(f, "pruned nothing: {why}");
        }
        write!(f, "pruned {} rows", self.rows())?;
        if !self.dropped_partitions.is_empty() {
            f.write_str(" (dropped partitions: ")?;
            write_list(f, &self.dropped_partitions, |(p, n)| {
                format!("{p} ({n} rows)")
            })?;
            f.write_str(")")?;
        }
        if let Some(t) = self.acked_commit_time {
            write!(f, "; acknowledged commit time {}", micros_text(t.0))?;
        }
        if let Some(w) = &self.witness {
            write!(f, "; rows proven committed by {w}")?;
        }
        if !self.deferred_partitions.is_empty() {
            f.write_str("; left for a later prune: ")?;
            write_list(f, &self.deferred_partitions, |(p, why)| {
                format!("{p} ({why})")
            })?;
        }
        if self.parked_aggregates > 0 {
            write!(
                f,
                "; the rows of {} parked aggregates kept",
                self.parked_aggregates
            )?;
        }
        Ok(())
    }
}

/// Writes each item's text, separated by ", ".
fn write_list<T>(
    f: &mut std::fmt::Formatter<'_>,
    items: &[T],
    text: impl Fn(&T) -> String,
) -> std::fmt::Result {
    let texts: Vec<String> = items.iter().map(text).collect();
    f.write_str(&texts.join(", "))
}

/// The one-shot `outbox-cdc prune`: reads the acknowledged commit time from
/// the offset store (the connector must be stopped: it holds the store).
pub async fn prune_stored(config: &Config, metrics: &Metrics) -> Result<PruneReport, PruneError> {
    // No store, no acknowledged position (and no store is created here).
    // The store stays open (and published to `metrics`) until the prune
    // ends: the live witness's position in it bounds what may go.
    let (stored, parked, _store) = if !config.offsets.path.exists() {
        (None, Vec::new(), None)
    } else {
        let store = Arc::new(OffsetStore::open(&config.offsets.path).map_err(PipelineError::from)?);
        metrics.offset_store.publish(&store);
        // Rows of a coverage break's window may be unpublished although
        // acknowledged: the audit that republishes them needs them.
        let breaks = store
            .coverage(&config.postgres.slot)
            .map_err(PipelineError::from)?
            .map(|r| r.breaks)
            .unwrap_or_default();
        let margin = (config.repair.occurred_at_margin_ms as i64).saturating_mul(1000);
        let slot = &config.postgres.slot;
        if let Some(refused) =
            StartRefused::coverage_broken(slot, config.config_argument(), margin, &breaks)
        {
            return Err(PipelineError::from(refused).into());
        }
        (
            store
                .load(&config.postgres.slot)
                .map_err(PipelineError::from)?,
            store.parked().map_err(PipelineError::from)?,
            Some(store),
        )
    };
    let (url, key) = pruner_url(config);
    let client = PgConnectConfig::parse(url)?.connect_sql().await?;
    // `run` verifies the cluster before it streams; the one-shot prune must
    // too, or another cluster's acknowledged time would judge these rows.
    if let Some(stored) = &stored {
        let server = crate::pg::control::system_identifier(&client).await?;
        if stored.system_id != server {
            return Err(PruneError::OtherCluster {
                slot: config.postgres.slot.clone(),
                stored: stored.system_id.clone(),
                server,
                key,
            });
        }
    }
    // Parked by any instance (shared parking): their rows stay too.
    let mut parked = parked;
    if let Some(table) = crate::parking::ParkedTable::of(config).map_err(PipelineError::from)? {
        table.ensure().await.map_err(PipelineError::from)?;
        for p in table.list().await.map_err(PipelineError::from)? {
            let known = parked
                .iter()
                .any(|q| q.aggregate_type == p.aggregate_type && q.aggregate_id == p.aggregate_id);
            if !known {
                parked.push(p);
            }
        }
    }
    // A slot's creation time is no acknowledged commit: rows before it were
    // never in this slot.
    let acked = stored
        .filter(|s| !s.commit_time_is_slot_creation)
        .and_then(|s| {
            s.acked_commit_time.map(|commit_time| AckedPosition {
                lsn: s.lsn,
                commit_time,
            })
        });
    prune_once(&client, config, acked, &parked, metrics, None).await
}

/// One prune of the configured outbox against `acked` (the acknowledged
/// position), keeping the rows of the `parked` aggregates (read after
/// `acked`: an aggregate is parked before the position passes its first
/// refused row), then the size gauges. `stop` ends it between batches.
pub async fn prune_once(
    client: &Client,
    config: &Config,
    acked: Option<AckedPosition>,
    parked: &[ParkedAggregate],
    metrics: &Metrics,
    stop: Option<&watch::Receiver<bool>>,
) -> Result<PruneReport, PruneError> {
    let table = coverage::configured_table(&config.outbox).map_err(|e| PruneError::Refused {
        table: config.outbox.table.clone(),
        reason: e.to_string(),
        fix: "set outbox.table".into(),
    })?;
    let Some(retention) = config.prune.retention() else {
        return Err(PruneError::Refused {
            table: table.to_string(),
            reason: "prune.retention is not set (pruning is off)".into(),
            fix: "set [prune] retention, e.g. \"7d\"".into(),
        });
    };
    let columns = table_columns(client, &table).await?;
    if columns.is_empty() {
        return Err(PruneError::Refused {
            table: table.to_string(),
            reason: "the table does not exist (or this role cannot see it)".into(),
            fix: "check outbox.table and the role's privileges".into(),
        });
    }
    if !columns.iter().any(|(n, _)| n == "occurred_at") {
        return Err(PruneError::Refused {
            table: table.to_string(),
            reason: "it has no occurred_at column; retention is by occurred_at".into(),
            fix: "add `occurred_at timestamptz NOT NULL DEFAULT now()` or leave [prune] retention empty"
                .into(),
        });
    }
    let names = config
        .outbox
        .column_names()
        .map_err(|e| PruneError::Refused {
            table: table.to_string(),
            reason: e.to_string(),
            fix: "fix outbox.columns".into(),
        })?;
    let mut report = PruneReport {
        acked_commit_time: acked.map(|a| a.commit_time),
        parked_aggregates: parked.len(),
        ..PruneReport::default()
    };
    let result = match acked {
        None => {
            report.skipped = Some(
                "no acknowledged commit time is stored yet (nothing published, or an offset written \
                 by an older version): no row is known to be published"
                    .into(),
            );
            Ok(())
        }
        Some(acked) => {
            let aggregate = (names.aggregate_type.as_str(), names.aggregate_id.as_str());
            let checked_below = witness_bound(config, metrics)?;
            prune_rows(
                client,
                config,
                &table,
                retention,
                (acked, parked, aggregate, checked_below),
                &mut report,
                stop,
            )
            .await
        }
    };
    metrics.pruned(report.rows());
    if let Err(e) = measure(client, &table, metrics).await {
        debug!(error = %e, "measuring the outbox table failed");
    }
    result?;
    Ok(report)
}

/// `$n` (microseconds since 2000-01-01, float8) as a timestamptz.
fn ts(param: &str) -> String {
    format!("to_timestamp({param}::float8 / 1e6 + 946684800)")
}

/// Below which transaction id the live witness has checked every row, when
/// it is on and has a position (read from the store the pipeline or the
/// one-shot prune opened).
fn witness_bound(config: &Config, metrics: &Metrics) -> Result<Option<u64>, PruneError> {
    if !config.reconcile.enabled {
        return Ok(None);
    }
    let Some(store) = metrics.offset_store.get() else {
        return Ok(None);
    };
    let position = tokio::task::block_in_place(|| store.witness_position(&config.postgres.slot))
        .map_err(PipelineError::from)?;
    Ok(position.map(|p| p.checked_below_xid))
}

/// The `WHERE` clause both the choice and the DELETE apply, over the table
/// aliased `o`. `$1`: the retention cutoff (microseconds since 2000-01-01,
/// float8), `$2`: the xid witness (text, see [`xid_witness`]), the proof of
/// "committed before the acknowledged position", `$3` and `$4`: the types
/// and ids of the parked aggregates (text[]), whose rows are kept;
/// `aggregate`: the names of the aggregate type and id columns.
fn qualifies(aggregate: (&str, &str)) -> String {
    // age() compares xids modulo 2^32 against the same reference; a negative
    // age is an xmin more than 2^31 transactions old (frozen, long before any
    // witness).
    format!(
        "o.occurred_at < {} AND (age(o.xmin) > age($2::text::xid) OR age(o.xmin) < 0) \
         AND NOT EXISTS (SELECT FROM unnest($3::text[], $4::text[]) \
         AS p(t, i) WHERE p.t = o.{}::text AND p.i = o.{}::text)",
        ts("$1"),
        quote_ident(aggregate.0),
        quote_ident(aggregate.1)
    )
}

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// A predicate's parameters, `$1` to `$COUNT`; a statement's own follow.
struct Params {
    cutoff: f64,
    xid: String,
    parked_types: Vec<String>,
    parked_ids: Vec<String>,
}

impl Params {
    const COUNT: usize = 4;

    /// The predicate's parameter types, then `extra`.
    fn types(extra: &[Type]) -> Vec<Type> {
        let mut types = vec![Type::FLOAT8, Type::TEXT, Type::TEXT_ARRAY, Type::TEXT_ARRAY];
        types.extend_from_slice(extra);
        types
    }

    /// The predicate's values, then `extra`.
    fn values<'a>(&'a self, extra: &[Param<'a>]) -> Vec<Param<'a>> {
        let mut values: Vec<Param<'a>> = vec![
            &self.cutoff,
            &self.xid,
            &self.parked_types,
            &self.parked_ids,
        ];
        values.extend_from_slice(extra);
        values
    }
}

async fn prune_rows(
    client: &Client,
    config: &Config,
    table: &QualifiedTable,
    retention: Duration,
    (acked, parked, aggregate, checked_below): (
        AckedPosition,
        &[ParkedAggregate],
        (&str, &str),
        Option<u64>,
    ),
    report: &mut PruneReport,
    stop: Option<&watch::Receiver<bool>>,
) -> Result<(), PruneError> {
    let e = sql("pruning the outbox");
    let version = server_version_num(client).await?;
    let mut witness = xid_witness(client, &config.postgres.slot, acked.lsn).await?;
    // The live witness has not checked rows from its position on: they stay
    // until it has (it publishes from them what the stream skipped).
    if let (Some((xid, what)), Some(below)) = (witness.as_mut(), checked_below) {
        let live = below as u32;
        if older(client, live, *xid).await? {
            *what = format!(
                "the live witness's position, transaction {below} (not yet checked from there)"
            );
            *xid = live;
        }
    }
    report.witness = witness.as_ref().map(|(_, what)| what.clone());
    let Some((xid, _)) = witness else {
        report.skipped = Some(format!(
            "nothing proves a row committed before the acknowledged position {} yet: the slot has \
             not confirmed a running-transactions record, nor is the last checkpoint before it. \
             Rows become prunable once the connector has acknowledged past the next one \
             (PostgreSQL logs one every 15 s while busy, and at each checkpoint)",
            acked.lsn
        ));
        return Ok(());
    };
    let select = "SELECT ((extract(epoch FROM clock_timestamp()) - 946684800) * 1e6)::float8";
    let now: f64 = query_value(client, select, &[]).await.map_err(&e)?;
    let cutoff = now - retention.as_micros() as f64;
    let pred = qualifies(aggregate);
    debug!(table = %table, cutoff = %micros_text(cutoff as i64), acked_lsn = %acked.lsn,
        acked_commit_time = %micros_text(acked.commit_time.0), witness = ?report.witness,
        "pruning the outbox");

    let params = Params {
        cutoff,
        xid: xid.to_string(),
        parked_types: parked.iter().map(|p| p.aggregate_type.clone()).collect(),
        parked_ids: parked.iter().map(|p| p.aggregate_id.clone()).collect(),
    };
    // Every lock the pruner waits for, for at most this long.
    client
        .batch_execute(&format!(
            "SET lock_timeout = '{}ms'",
            config.prune.lock_timeout_ms
        ))
        .await
        .map_err(&e)?;
    let outcome = prune_leaves(client, config, table, version, &pred, &params, report, stop).await;
    let _ = client.batch_execute("RESET lock_timeout").await;
    outcome
}

/// Deletes the qualifying rows of `table`, or of each of its leaf
/// partitions, dropping the leaves that may go whole.
#[allow(clippy::too_many_arguments)]
async fn prune_leaves(
    client: &Client,
    config: &Config,
    table: &QualifiedTable,
    version: i32,
    pred: &str,
    params: &Params,
    report: &mut PruneReport,
    stop: Option<&watch::Receiver<bool>>,
) -> Result<(), PruneError> {
    let leaves = Leaf::list(client, table, version).await?;
    if leaves.is_empty() {
        report.deleted_rows +=
            delete_batches(client, &table.to_string(), pred, params, config, stop).await?;
        return Ok(());
    }
    let detach = Detach {
        client,
        pred,
        params,
        concurrently: version >= 140000,
        timeout_ms: config.prune.lock_timeout_ms,
    };
    for leaf in leaves {
        if stop.is_some_and(|s| *s.borrow()) {
            break;
        }
        let droppable = leaf.upper_bound_before(client, params.cutoff).await?;
        if leaf.detach_pending {
            // Not part of the outbox any more for new queries; ours (a range
            // past the cutoff) is finished, anyone else's left alone.
            if droppable {
                match detach.finalize(&leaf).await? {
                    Dropped(rows) => report.dropped_partitions.push((leaf.name, rows)),
                    Kept(why) => report.deferred_partitions.push((leaf.name, why)),
                }
            }
            continue;
        }
        if droppable {
            match detach.drop_whole(&leaf).await? {
                Dropped(rows) => {
                    info!(partition = %leaf.name, rows, "pruned: detached and dropped a partition past the retention whose every row is published");
                    report.dropped_partitions.push((leaf.name, rows));
                    continue;
                }
                Kept(why) if why.is_empty() => {}
                Kept(why) => {
                    info!(partition = %leaf.name, reason = %why, "partition left for a later prune; deleting its rows in batches");
                    report.deferred_partitions.push((leaf.name.clone(), why));
                }
            }
        }
        report.deleted_rows +=
            delete_batches(client, &leaf.name, pred, params, config, stop).await?;
    }
    Ok(())
}

/// A leaf partition of the outbox, as the catalog describes it.
#[derive(Debug)]
struct Leaf {
    name: String,
    parent: String,
    /// `FOR VALUES ...` or `DEFAULT`, as `pg_get_expr(relpartbound)` prints it.
    bound: String,
    /// The parent is partitioned BY RANGE on `occurred_at` alone, and this
    /// is not its DEFAULT partition.
    range_on_occurred_at: bool,
    /// The parent has a DEFAULT partition (`DETACH CONCURRENTLY` is refused).
    parent_has_default: bool,
    /// The type of the parent's `occurred_at`.
    key_type: Option<String>,
    /// An interrupted `DETACH ... CONCURRENTLY` (PostgreSQL 14+).
    detach_pending: bool,
}

impl Leaf {
    /// Every leaf partition under `table` (none for a plain table), those
    /// pending detach included (read from `pg_inherits`, which still holds
    /// them).
    async fn list(
        client: &Client,
        table: &QualifiedTable,
        version: i32,
    ) -> Result<Vec<Leaf>, PipelineError> {
        let e = sql("listing the outbox partitions");
        let pending = if version >= 140000 {
            "i.inhdetachpending"
        } else {
            "false"
        };
        let rows = client
            .query(
                &format!(
                    "WITH RECURSIVE tree(relid) AS ( \
                       SELECT $1::text::regclass::oid \
                       UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid \
                       JOIN pg_class pc ON pc.oid = i.inhparent WHERE pc.relkind = 'p') \
                     SELECT c.oid::regclass::text, i.inhparent::regclass::text, \
                            coalesce(pg_get_expr(c.relpartbound, c.oid), ''), \
                            coalesce(p.partstrat = 'r' AND p.partnatts = 1 AND p.partattrs[0] = a.attnum \
                                     AND p.partdefid <> c.oid, false), \
                            coalesce(p.partdefid <> 0, false), \
                            format_type(a.atttypid, a.atttypmod), {pending} \
                     FROM tree JOIN pg_class c ON c.oid = tree.relid \
                     JOIN pg_inherits i ON i.inhrelid = c.oid \
                     LEFT JOIN pg_partitioned_table p ON p.partrelid = i.inhparent \
                     LEFT JOIN pg_attribute a ON a.attrelid = i.inhparent AND a.attname = 'occurred_at' \
                          AND NOT a.attisdropped \
                     WHERE c.relkind <> 'p' ORDER BY 1"
                ),
                &[&table.to_string()],
            )
            .await
            .map_err(&e)?;
        rows.iter()
            .map(|r| {
                Ok(Leaf {
                    name: r.try_get(0).map_err(&e)?,
                    parent: r.try_get(1).map_err(&e)?,
                    bound: r.try_get(2).map_err(&e)?,
                    range_on_occurred_at: r.try_get(3).map_err(&e)?,
                    parent_has_default: r.try_get(4).map_err(&e)?,
                    key_type: r.try_get(5).map_err(&e)?,
                    detach_pending: r.try_get(6).map_err(&e)?,
                })
            })
            .collect()
    }

    /// Whether every value this leaf can ever hold is before `cutoff`
    /// (microseconds since 2000-01-01): a RANGE leaf on `occurred_at` whose
    /// upper bound, cast by PostgreSQL to the key's type, is at or before it.
    async fn upper_bound_before(&self, client: &Client, cutoff: f64) -> Result<bool, PruneError> {
        let (true, Some(key_type), Some(UpperBound::Value(upper))) = (
            self.range_on_occurred_at,
            &self.key_type,
            upper_bound(&self.bound),
        ) else {
            return Ok(false);
        };
        let select = format!("SELECT $1::text::{key_type} <= {}", ts("$2"));
        let compared = query_value::<bool>(client, &select, &[&upper, &cutoff]).await;
        match compared {
            Ok(before) => Ok(before),
            Err(err) => {
                warn!(partition = %self.name, bound = %self.bound, error = %err,
                    "cannot compare the partition's upper bound with the retention; deleting its rows in batches");
                Ok(false)
            }
        }
    }
}

/// The upper bound of a single-column RANGE partition, from its
/// `FOR VALUES FROM (...) TO (...)`: a literal's text, or MAXVALUE/MINVALUE.
#[derive(Debug, PartialEq, Eq)]
enum UpperBound {
    Value(String),
    Unbounded,
}

fn upper_bound(bound: &str) -> Option<UpperBound> {
    let to = &bound[bound.find(") TO (")? + ") TO (".len()..];
    let inner = to.strip_suffix(')')?.trim();
    if inner == "MAXVALUE" || inner == "MINVALUE" {
        return Some(UpperBound::Unbounded);
    }
    // One quoted literal, '' for a quote inside; anything else (several
    // columns, an expression) is not judged.
    let body = inner.strip_prefix('\'')?.strip_suffix('\'')?;
    if body.replace("''", "").contains('\'') {
        return None;
    }
    Some(UpperBound::Value(body.replace("''", "'")))
}

/// What became of a leaf that may be dropped whole.
enum DropOutcome {
    Dropped(u64),
    /// Rows deleted in batches instead; why it was not dropped when it
    /// should have been (empty: it still holds rows that do not qualify).
    Kept(String),
}
use DropOutcome::{Dropped, Kept};

/// Detaching and dropping leaves without stalling the application.
struct Detach<'a> {
    client: &'a Client,
    pred: &'a str,
    params: &'a Params,
    concurrently: bool,
    timeout_ms: u64,
}

impl Detach<'_> {
    /// `(rows that do not qualify, rows)` of `relation`.
    async fn count(&self, relation: &str) -> Result<(i64, i64), tokio_postgres::Error> {
        let statement = self
            .client
            .prepare_typed(
                &format!(
                    "SELECT count(*) FILTER (WHERE NOT coalesce({}, false)), count(*) FROM {relation} AS o",
                    self.pred
                ),
                &Params::types(&[]),
            )
            .await?;
        let row = self
            .client
            .query_one(&statement, &self.params.values(&[]))
            .await?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }

    /// Drops `leaf` (a range past the cutoff) when every row in it
    /// qualifies: detached first, then checked again and dropped.
    async fn drop_whole(&self, leaf: &Leaf) -> Result<DropOutcome, PruneError> {
        let e = sql("checking a partition before dropping it");
        let (not_yet, _) = self.count(&leaf.name).await.map_err(&e)?;
        if not_yet > 0 {
            return Ok(Kept(String::new()));
        }
        let (parent, name) = (&leaf.parent, &leaf.name);
        let detached = if self.concurrently && !leaf.parent_has_default {
            // Takes no lock that conflicts with inserts; waits (bounded by
            // lock_timeout) for the transactions that use the table.
            self.client
                .batch_execute(&format!(
                    "ALTER TABLE {parent} DETACH PARTITION {name} CONCURRENTLY"
                ))
                .await
        } else {
            self.in_bounded_transaction(&format!("ALTER TABLE {parent} DETACH PARTITION {name}"))
                .await
        };
        if let Err(err) = detached {
            let pending = self.concurrently && self.pending(name).await.map_err(&e)?;
            return Ok(Kept(if pending {
                format!(
                    "detach pending, finished by a later prune: {}",
                    error_text(&err)
                )
            } else {
                format!("not detached: {}", error_text(&err))
            }));
        }
        self.drop_detached(leaf).await
    }

    /// Finishes an interrupted `DETACH ... CONCURRENTLY` of `leaf`, then
    /// drops it as [`Self::drop_whole`] does.
    async fn finalize(&self, leaf: &Leaf) -> Result<DropOutcome, PruneError> {
        let finalized = self
            .client
            .batch_execute(&format!(
                "ALTER TABLE {} DETACH PARTITION {} FINALIZE",
                leaf.parent, leaf.name
            ))
            .await;
        match finalized {
            Ok(()) => {
                info!(partition = %leaf.name, "finished the pending detach of a partition");
                self.drop_detached(leaf).await
            }
            Err(err) => Ok(Kept(format!(
                "detach pending, not finished yet: {}",
                error_text(&err)
            ))),
        }
    }

    /// `leaf` is detached: drop it if every row still qualifies, else attach
    /// it again (rows that do not qualify arrived meanwhile).
    async fn drop_detached(&self, leaf: &Leaf) -> Result<DropOutcome, PruneError> {
        let (parent, name) = (&leaf.parent, &leaf.name);
        let dropped = async {
            self.client
                .batch_execute(&format!(
                    "BEGIN; LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE"
                ))
                .await?;
            let (not_yet, rows) = self.count(name).await?;
            if not_yet > 0 {
                return Ok(None);
            }
            self.client
                .batch_execute(&format!("DROP TABLE {name}; COMMIT"))
                .await?;
            Ok::<_, tokio_postgres::Error>(Some(rows as u64))
        }
        .await;
        let why = match dropped {
            Ok(Some(rows)) => return Ok(Dropped(rows)),
            Ok(None) => "rows not yet prunable arrived while it was detached".to_owned(),
            Err(err) => format!("not dropped: {}", error_text(&err)),
        };
        let _ = self.client.batch_execute("ROLLBACK").await;
        let attach = format!(
            "ALTER TABLE {parent} ATTACH PARTITION {name} {}",
            leaf.bound
        );
        match self.client.batch_execute(&attach).await {
            Ok(()) => Ok(Kept(format!("{why}; attached again"))),
            Err(err) => Err(PruneError::Refused {
                table: name.clone(),
                reason: format!(
                    "the partition was detached from {parent} to be dropped, but {why}, and \
                     attaching it again failed: {}. Its rows are outside the outbox until it \
                     is attached",
                    error_text(&err)
                ),
                fix: format!("{attach};"),
            }),
        }
    }

    /// Runs `statement` in its own transaction, its lock waits and itself
    /// bounded by the lock timeout (what writers queued behind it wait).
    async fn in_bounded_transaction(&self, statement: &str) -> Result<(), tokio_postgres::Error> {
        let run = async {
            self.client
                .batch_execute(&format!(
                    "BEGIN; SET LOCAL statement_timeout = '{}ms'",
                    self.timeout_ms
                ))
                .await?;
            self.client.batch_execute(statement).await?;
            self.client.batch_execute("COMMIT").await
        }
        .await;
        if run.is_err() {
            let _ = self.client.batch_execute("ROLLBACK").await;
        }
        run
    }

    async fn pending(&self, leaf: &str) -> Result<bool, tokio_postgres::Error> {
        let select = "SELECT coalesce(bool_or(inhdetachpending), false) FROM pg_inherits \
                      WHERE inhrelid = $1::text::regclass";
        query_value(self.client, select, &[&leaf]).await
    }
}

/// A PostgreSQL error's own message (tokio-postgres' Display says only "db error").
fn error_text(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => err.to_string(),
    }
}

/// Deletes qualifying rows of one table (a plain table or a leaf), a batch
/// per statement, until a batch comes back short.
async fn delete_batches(
    client: &Client,
    relation: &str,
    pred: &str,
    params: &Params,
    config: &Config,
    stop: Option<&watch::Receiver<bool>>,
) -> Result<u64, PruneError> {
    let e = sql("deleting a batch of outbox rows");
    let limit = config.prune.batch_rows as i64;
    // The predicate is in the DELETE too: a ctid chosen by the subquery can
    // only ever delete a row that qualifies itself.
    let sql_text = format!(
        "DELETE FROM {relation} AS o WHERE o.ctid = ANY(ARRAY(SELECT o.ctid FROM {relation} AS o \
         WHERE {pred} ORDER BY o.occurred_at LIMIT ${limit_param})) AND {pred}",
        limit_param = Params::COUNT + 1
    );
    let statement = client
        .prepare_typed(&sql_text, &Params::types(&[Type::INT8]))
        .await
        .map_err(&e)?;
    let mut total = 0u64;
    loop {
        let n = client
            .execute(&statement, &params.values(&[&limit]))
            .await
            .map_err(&e)?;
        total += n;
        if n > 0 {
            debug!(relation, rows = n, "pruned a batch");
        }
        if (n as i64) < limit || stop.is_some_and(|s| *s.borrow()) {
            return Ok(total);
        }
    }
}

/// Sets the size gauges: estimated rows, bytes on disk, oldest row's age.
async fn measure(
    client: &Client,
    table: &QualifiedTable,
    metrics: &Metrics,
) -> Result<(), PipelineError> {
    let e = sql("measuring the outbox table");
    let row = client
        .query_one(
            "SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::int8, \
                    coalesce(sum(pg_total_relation_size(t.relid)), 0)::int8 \
             FROM pg_partition_tree($1::text::regclass) t JOIN pg_class c ON c.oid = t.relid",
            &[&table.to_string()],
        )
        .await
        .map_err(&e)?;
    let (rows, bytes): (i64, i64) = (row.try_get(0).map_err(&e)?, row.try_get(1).map_err(&e)?);
    let select =
        format!("SELECT (extract(epoch FROM now() - min(occurred_at)) * 1000)::int8 FROM {table}");
    let age: Option<i64> = query_value(client, &select, &[]).await.map_err(&e)?;
    metrics.set_outbox_size(rows, bytes, age.unwrap_or(0));
    Ok(())
}

/// `run`'s pruner: every `prune.interval`, prunes against the commit time
/// the running session last persisted. Returns when `shutdown` turns true.
/// Failures are logged and retried at the next interval.
pub async fn run_pruner(
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    let Some(retention) = config.prune.retention() else {
        return;
    };
    let (url, key) = pruner_url(&config);
    let pg = match PgConnectConfig::parse(url) {
        Ok(pg) => pg,
        Err(e) => {
            warn!(error = %e, "pruner disabled: {key} does not parse");
            return;
        }
    };
    info!(
        retention_s = retention.as_secs(),
        interval_s = config.prune.interval().as_secs(),
        "pruner started"
    );
    let mut tick = tokio::time::interval(config.prune.interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<Client> = None;
    let mut said_no_time = false;
    let mut stop = shutdown.clone();
    while crate::periodic::next_tick(&mut tick, &mut stop).await {
        // Both durable: the commit time set after each persist, the LSN by
        // the session once the store flushed it.
        let acked = metrics
            .durable_commit_time
            .get()
            .map(|commit_time| AckedPosition {
                lsn: metrics.acked(),
                commit_time,
            });
        if acked.is_none() && !said_no_time {
            info!(
                "pruner: no acknowledged commit time yet; nothing is pruned until the connector persists one"
            );
            said_no_time = true;
        }
        // Read after the position: a refused row's aggregate is parked before
        // the acknowledged position passes it.
        let parked = match (acked, metrics.offset_store.get()) {
            (None, _) => Vec::new(),
            (Some(_), Some(store)) => match tokio::task::block_in_place(|| store.parked()) {
                Ok(parked) => parked,
                Err(e) => {
                    warn!(error = %e, "pruner: cannot read the parked aggregates; retrying at the next interval");
                    continue;
                }
            },
            (Some(_), None) => {
                debug!("pruner: the offset store is not open (yet); retrying at the next interval");
                continue;
            }
        };
        let connected = match client.take() {
            Some(c) if !c.is_closed() => Ok(c),
            _ => pg.connect_sql().await,
        };
        let c = match connected {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "pruner: cannot connect; retrying at the next interval");
                continue;
            }
        };
        let run = prune_once(&c, &config, acked, &parked, &metrics, Some(&shutdown));
        let outcome = tokio::select! {
            r = run => Some(r),
            _ = wait_true(shutdown.clone()) => None,
        };
        match outcome {
            None => return,
            Some(Ok(report)) if report.rows() > 0 => info!(rows = report.rows(), "{report}"),
            Some(Ok(report)) => debug!("{report}"),
            Some(Err(e)) => warn!(error = %e, "pruning failed; retrying at the next interval"),
        }
        client = Some(c);
    }
}

/// Where the pruner connects, and the key that names it: the primary. With
/// decoding on a standby (`postgres.primary_url` set), `postgres.url` is
/// read-only and every DELETE would fail there.
fn pruner_url(config: &Config) -> (&str, &'static str) {
    match &config.postgres.primary_url {
        Some(primary) => (primary.as_str(), "postgres.primary_url"),
        None => (config.postgres.url.as_str(), "postgres.url"),
    }
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGG: (&str, &str) = ("aggregate_type", "Aggregate Id");

    #[test]
    fn the_predicate_never_judges_acknowledgement_by_occurred_at() {
        let pred = qualifies(AGG);
        assert!(
            pred.starts_with("o.occurred_at < to_timestamp($1"),
            "{pred}"
        );
        assert_eq!(pred.matches("occurred_at").count(), 1, "{pred}");
        assert!(pred.contains("age(o.xmin) > age($2::text::xid)"), "{pred}");
        // Review P1: nor by a commit timestamp (the wall clock).
        assert!(!pred.contains("commit_timestamp"), "{pred}");
        // F5: the rows of parked aggregates are never chosen.
        assert!(
            pred.ends_with(
                "AND NOT EXISTS (SELECT FROM unnest($3::text[], $4::text[]) AS p(t, i) \
                 WHERE p.t = o.\"aggregate_type\"::text AND p.i = o.\"Aggregate Id\"::text)"
            ),
            "{pred}"
        );
    }

    #[test]
    fn only_a_single_literal_upper_bound_is_judged() {
        assert_eq!(
            upper_bound("FOR VALUES FROM ('2020-01-01 00:00:00+00') TO ('2021-01-01 00:00:00+00')"),
            Some(UpperBound::Value("2021-01-01 00:00:00+00".into()))
        );
        assert_eq!(
            upper_bound("FOR VALUES FROM ('2021-01-01 00:00:00+00') TO (MAXVALUE)"),
            Some(UpperBound::Unbounded)
        );
        assert_eq!(
            upper_bound("FOR VALUES FROM ('a') TO ('it''s')"),
            Some(UpperBound::Value("it's".into()))
        );
        for other in [
            "FOR VALUES WITH (modulus 2, remainder 0)",
            "FOR VALUES IN ('order')",
            "DEFAULT",
            "",
            "FOR VALUES FROM ('a', 1) TO ('b', 2)",
            "FOR VALUES FROM ('a', 'b') TO ('c', 'd')",
        ] {
            assert_eq!(upper_bound(other), None, "{other}");
        }
    }

    fn config(extra: &str) -> Config {
        Config::from_sources(
            "test.toml",
            &format!(
                "[postgres]\nurl = \"postgres://outbox@standby:5432/app\"\n{extra}\n\
                 [kafka]\n\"bootstrap.servers\" = \"127.0.0.1:9092\"\n"
            ),
            Vec::new(),
        )
        .expect("config")
    }

    /// F10(a): with decoding on a standby, `postgres.url` is read-only; rows
    /// are deleted on the primary, as the heartbeat writes there.
    #[test]
    fn the_pruner_writes_on_the_primary() {
        let c = config("primary_url = \"postgres://outbox@primary:5432/app\"");
        assert_eq!(
            pruner_url(&c),
            ("postgres://outbox@primary:5432/app", "postgres.primary_url")
        );
        let c = config("");
        assert_eq!(
            pruner_url(&c),
            ("postgres://outbox@standby:5432/app", "postgres.url")
        );
    }

    #[test]
    fn reports_say_what_was_done() {
        let r = PruneReport {
            skipped: Some("no acknowledged commit time".into()),
            ..PruneReport::default()
        };
        assert_eq!(r.to_string(), "pruned nothing: no acknowledged commit time");
        let r = PruneReport {
            deleted_rows: 3,
            dropped_partitions: vec![("p1".into(), 5)],
            ..PruneReport::default()
        };
        assert_eq!(r.rows(), 8);
        assert!(
            r.to_string()
                .starts_with("pruned 8 rows (dropped partitions: p1 (5 rows))")
        );
    }
}
