//! The reconciler: every `reconcile.interval_ms`, one round.
//!
//! 1. A mark: the WAL insert position `before`, then in one statement the
//!    statement's snapshot (its `xmin` and `xmax`, 64-bit) and the WAL insert
//!    position `after` (on a standby: the replay position). A visible row
//!    whose transaction id precedes the snapshot's `xmin` was written by a
//!    transaction that had ended when the snapshot was taken, so its commit
//!    record lies before `after`. This holds for rows written in savepoints
//!    too: a subtransaction gets its id after its parent, so its id precedes
//!    `xmin` only if the parent's does (DESIGN.md §13a).
//! 2. Wait until the position through which the stored pages are complete
//!    (`Metrics::witness_covered`: the durable acknowledged position, once
//!    the stream passed what the server sent again after a restart) passes
//!    `after`: every such row was then either delivered by the stream or
//!    skipped by it.
//! 3. The rows new since the last round (transaction id in
//!    `[checked_below, xmin)`) are read through `occurred_at` from the last
//!    round's start minus `reconcile.settle_margin_ms` (and from the start of
//!    the oldest transaction the last round could see running), and each
//!    event id is looked up among the fingerprints the session stored
//!    (`ledger`). A dead-lettered row was sent too (to the dead-letter topic).
//! 4. The rows not found are logged at ERROR, counted, and published from
//!    the table through `replay` (per-aggregate order, parked aggregates
//!    respected through the offset store, header `repaired_by:
//!    witness`); then the position moves to `xmin`.
//! 5. Pages whose transactions can match no row still unchecked expire: a
//!    transaction whose commit record started before a mark's `before` had
//!    all its (sub)transaction ids below that mark's `xmax`.
//!
//! Memory: the stored fingerprints of the unchecked horizon (8 bytes an
//! event) while a round compares, and the rows found missing.
//!
//! Limits (docs/guarantees.md): a row whose `occurred_at` lies before the
//! look-from time (a writer-set time in the past, a transaction open longer
//! than the settle margin that the connector's role cannot see in
//! `pg_stat_activity`) is not checked; nor is a row of a transaction that
//! ended before the witness's first round.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt as _, pin_mut};
use tokio::sync::watch;
use tokio_postgres::Client;
use tracing::{debug, error, info, warn};

use crate::checkpoint::{OffsetStore, WitnessPosition};
use crate::config::Config;
use crate::coverage;
use crate::metrics::Metrics;
use crate::pg::{Lsn, PgConnectConfig, PgTimestamp, quote_ident};
use crate::pipeline::{EventIdSet, PipelineError, ReplayOptions};
use crate::retained::{micros_of, sql, table_columns};

use super::binary_copy::{BinaryCopyReader, Malformed};
use crate::checkpoint::fingerprint;

/// Rows named one by one in the log per round; the rest are counted.
const LOGGED_ROWS: usize = 100;
/// A window wider than this many transaction ids is narrowed (the 32-bit
/// `xmin` of a row is widened against the window's end).
const MAX_WINDOW_XIDS: u64 = 1 << 30;

/// What a round failed on; the next interval tries again.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error(transparent)]
    Store(#[from] crate::checkpoint::StoreError),
    #[error("republishing the rows the stream did not deliver: {0}")]
    Replay(#[from] crate::pipeline::ReplayError),
    #[error(transparent)]
    Setting(#[from] crate::setting::InvalidSetting),
    #[error("reading the outbox rows the live witness checks: {0}")]
    Copy(Malformed),
}

/// One snapshot's facts.
#[derive(Debug, Clone, Copy)]
struct Mark {
    /// WAL insert position read before the snapshot.
    before: Lsn,
    xmin: u64,
    xmax: u64,
    /// WAL position read after the snapshot.
    after: Lsn,
    /// The statement's time, PostgreSQL microseconds.
    taken_micros: i64,
    /// The earliest start of a transaction that could still write rows
    /// (running with an id, or prepared), and at most `taken_micros`.
    look_from_micros: i64,
}

/// Runs rounds until `shutdown`; returns at once with `[reconcile]` off.
pub async fn run_reconciler(
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    if !config.reconcile.enabled {
        info!(
            "live witness off ([reconcile] enabled = false): rows the stream skips are not looked for"
        );
        return;
    }
    let pg = match PgConnectConfig::parse(&config.postgres.url) {
        Ok(pg) => pg,
        Err(e) => {
            warn!(error = %e, "live witness disabled: postgres.url does not parse");
            return;
        }
    };
    let mut tick = tokio::time::interval(config.reconcile.interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut witness = Witness {
        config: config.clone(),
        metrics: metrics.clone(),
        marks: VecDeque::new(),
        said_no_column: false,
    };
    let mut client: Option<Client> = None;
    let mut failing = false;
    let mut stop = shutdown.clone();
    while crate::periodic::next_tick(&mut tick, &mut stop).await {
        let Some(store) = metrics.offset_store.get() else {
            debug!("live witness: the offset store is not open (yet)");
            continue;
        };
        let c = match crate::periodic::connected(&pg, &mut client).await {
            Ok(c) => c,
            Err(e) => {
                if !failing {
                    warn!(error = %e, "live witness: cannot connect; trying again at the next interval");
                }
                failing = true;
                continue;
            }
        };
        match witness.round(c, store, &mut shutdown).await {
            Ok(()) => {
                if failing {
                    info!("live witness: rounds succeed again");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, "live witness: the round failed; trying again at the next interval");
                } else {
                    debug!(error = %e, "live witness: the round failed again");
                }
                failing = true;
                client = None;
            }
        }
    }
}

struct Witness {
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    /// Marks whose `xmax` the position has not passed: the pages they
    /// would expire are still needed.
    marks: VecDeque<Mark>,
    said_no_column: bool,
}

impl Witness {
    async fn round(
        &mut self,
        client: &Client,
        store: Arc<OffsetStore>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), RoundError> {
        let slot = self.config.postgres.slot.clone();
        let table = coverage::configured_table(&self.config.outbox)?;
        let columns = table_columns(client, &table).await?;
        if !columns.iter().any(|(name, _)| name == "occurred_at") {
            if !self.said_no_column {
                warn!(table = %table, "live witness off: the outbox table has no occurred_at column, \
                    by which the rows of a round are found");
                self.said_no_column = true;
            }
            return Ok(());
        }
        let mark = take_mark(client).await?;
        // The pipeline's durable position, from its store (a restarted
        // session keeps the same store).
        let Some(system_id) = store.load(&slot)?.map(|o| o.system_id) else {
            debug!("live witness: no offset stored yet");
            return Ok(());
        };
        let position = store
            .witness_position(&slot)?
            .filter(|p| p.system_id == system_id);
        let Some(position) = position else {
            // From the snapshot's xmax, not its xmin: a transaction below it
            // may have ended before the slot existed (its rows were never
            // streamed, nor meant to be).
            info!(
                from_xid = mark.xmax,
                "live witness: rows of transactions from this id on are checked"
            );
            let first = WitnessPosition {
                system_id,
                checked_below_xid: mark.xmax,
                look_from_micros: mark.look_from_micros,
            };
            if store.replace_witness_position(&slot, None, &first)? {
                self.marks.push_back(mark);
            }
            self.metrics.reconcile_round(0, Duration::ZERO);
            return Ok(());
        };
        // Not held while waiting: the pipeline reopens the store after a
        // full disk, and cannot while a handle is open here (sled's file
        // lock), so the acknowledgement waited for would never come.
        drop(store);
        if !self.wait_for_acknowledgement(mark.after, shutdown).await {
            return Ok(());
        }
        let Some(store) = self.metrics.offset_store.get() else {
            return Ok(());
        };
        let mut lo = position.checked_below_xid;
        let hi = mark.xmin;
        if hi <= lo {
            // No transaction ended since: everything before the mark is checked.
            self.metrics
                .reconcile_round(0, lag_since(mark.taken_micros));
            return Ok(());
        }
        if hi - lo > MAX_WINDOW_XIDS {
            warn!(
                from = lo,
                to = hi,
                "live witness: the unchecked window is wider than 2^30 transaction ids; \
                checking only its newest part"
            );
            lo = hi - MAX_WINDOW_XIDS;
        }
        let margin = (self.config.reconcile.settle_margin_ms as i64) * 1000;
        let look_from = position.look_from_micros.saturating_sub(margin);
        let delivered = tokio::task::block_in_place(|| store.witness_fingerprints(&slot))?;
        // A slot (re)created since the round began cleared the pages and
        // set a new position: this round's window belongs to the old slot,
        // whose deliveries are no longer in the pages. Start over.
        if store.witness_position(&slot)?.as_ref() != Some(&position) {
            self.restart_after_new_slot();
            return Ok(());
        }
        let (checked, missing) = self
            .compare(client, &table, look_from, (lo, hi), &delivered)
            .await?;
        drop(delivered);
        if !missing.is_empty() {
            self.republish(client, &store, &system_id, look_from, (lo, hi), &missing)
                .await?;
        }
        let next = WitnessPosition {
            system_id,
            checked_below_xid: hi,
            look_from_micros: mark.look_from_micros,
        };
        if !store.replace_witness_position(&slot, Some(&position), &next)? {
            self.restart_after_new_slot();
            return Ok(());
        }
        self.marks.push_back(mark);
        let mut expire = None;
        while let Some(m) = self.marks.front().filter(|m| m.xmax <= hi) {
            expire = Some(m.before);
            self.marks.pop_front();
        }
        if let Some(through) = expire {
            let gone = tokio::task::block_in_place(|| store.expire_witness_pages(&slot, through))?;
            debug!(through = %through, fingerprints = gone, "live witness: pages expired");
        }
        (self.metrics).reconcile_round(checked, lag_since(mark.taken_micros));
        debug!(
            from_xid = lo,
            to_xid = hi,
            rows = checked,
            missing = missing.len(),
            "live witness: round done"
        );
        Ok(())
    }

    /// The slot was (re)created during a round: its marks were the old
    /// slot's pages.
    fn restart_after_new_slot(&mut self) {
        self.marks.clear();
        info!(
            "live witness: the slot was created anew during a round; checking from its new position"
        );
    }

    /// Waits until the stored pages are complete through `lsn`; false when a
    /// stop came first.
    async fn wait_for_acknowledgement(
        &self,
        lsn: Lsn,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        while self.metrics.witness_covered() < lsn {
            if *shutdown.borrow() {
                return false;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = shutdown.changed() => {}
            }
        }
        true
    }

    /// Reads the rows of transactions in `[lo, hi)` and looks each up among
    /// `delivered`; returns how many were checked and those not found.
    async fn compare(
        &self,
        client: &Client,
        table: &crate::pg::QualifiedTable,
        look_from: i64,
        (lo, hi): (u64, u64),
        delivered: &[u64],
    ) -> Result<(u64, Vec<MissingRow>), RoundError> {
        let e = sql("reading the outbox rows the live witness checks");
        let names = self.config.outbox.column_names()?;
        // The window is kept on the server (as `widen` keeps it here): a
        // round looks `settle_margin_ms` back by `occurred_at`, about 60
        // rounds' worth with the defaults, and sending every row of it made
        // the connector decode each row about 60 times in a steady load.
        // Binary COPY, two columns: the rows of a 1,000,000-row backlog are
        // all read once. COPY takes no parameters; all three are integers.
        let copy = format!(
            "COPY (SELECT o.xmin::text::int8, o.{}::text FROM {table} AS o \
             WHERE o.occurred_at >= to_timestamp({look_from}::float8 / 1e6 + 946684800) \
             AND (({hi_low_bits}::int8 - o.xmin::text::int8 + 4294967296) % 4294967296) \
             BETWEEN 1 AND {width}::int8) TO STDOUT (FORMAT binary)",
            quote_ident(&names.event_id),
            hi_low_bits = hi as u32,
            width = hi - lo,
        );
        let data = client.copy_out(copy.as_str()).await.map_err(&e)?;
        pin_mut!(data);
        let malformed = |m: Malformed| RoundError::Copy(m);
        let mut reader = BinaryCopyReader::default();
        let (mut checked, mut missing) = (0u64, Vec::new());
        // Looked up a chunk at a time in fingerprint order: one binary search
        // per row over the whole set missed the cache at nearly every step
        // (most of the witness's CPU in a 300,000-row drain, by perf). The
        // chunk's event ids wait in `ids`, to name the ones not found.
        let mut chunk: Vec<(u64, u64, usize, usize)> = Vec::with_capacity(CHUNK_ROWS);
        let mut ids: Vec<u8> = Vec::new();
        loop {
            let next = data.next().await.transpose().map_err(&e)?;
            let end = next.is_none();
            if let Some(bytes) = next {
                reader.push(&bytes);
            }
            loop {
                let Some(row) = reader.next_tuple().map_err(malformed)? else {
                    break;
                };
                let Some(xmin) = row.int8(0).map_err(malformed)? else {
                    continue;
                };
                let Some(xid) = widen(xmin as u32, hi).filter(|x| (lo..hi).contains(x)) else {
                    continue;
                };
                let Some(event_id) = row.bytes(1) else {
                    continue; // no event id: the stream could not publish it either
                };
                let event_id = std::str::from_utf8(event_id)
                    .map_err(|_| malformed(Malformed::new("an event id is not UTF-8")))?;
                checked += 1;
                chunk.push((fingerprint(event_id), xid, ids.len(), event_id.len()));
                ids.extend_from_slice(event_id.as_bytes());
                if chunk.len() == CHUNK_ROWS {
                    look_up(&mut chunk, &mut ids, delivered, &mut missing);
                }
            }
            if end {
                reader.finish().map_err(malformed)?;
                look_up(&mut chunk, &mut ids, delivered, &mut missing);
                break;
            }
        }
        if !missing.is_empty() {
            self.describe(client, table, look_from, &mut missing)
                .await?;
        }
        Ok((checked, missing))
    }

    /// Fills in the aggregate and time of the first missing rows, for the log.
    async fn describe(
        &self,
        client: &Client,
        table: &crate::pg::QualifiedTable,
        look_from: i64,
        missing: &mut [MissingRow],
    ) -> Result<(), RoundError> {
        let e = sql("reading the outbox rows the live witness found missing");
        let names = self.config.outbox.column_names()?;
        let col = |name: &str| format!("o.{}::text", quote_ident(name));
        let query = format!(
            "SELECT {}, {}, {}, {}::int8 FROM {table} AS o \
             WHERE o.occurred_at >= to_timestamp($1::float8 / 1e6 + 946684800) \
             AND {} = ANY($2::text[])",
            col(&names.event_id),
            col(&names.aggregate_type),
            col(&names.aggregate_id),
            micros_of("o.occurred_at"),
            col(&names.event_id),
        );
        let logged = missing.len().min(LOGGED_ROWS);
        let named = &mut missing[..logged];
        let wanted: Vec<&str> = named.iter().map(|r| r.event_id.as_str()).collect();
        let rows = client
            .query(&query, &[&(look_from as f64), &wanted])
            .await
            .map_err(&e)?;
        for row in rows {
            let event_id: String = row.try_get(0).map_err(&e)?;
            if let Some(m) = named.iter_mut().find(|m| m.event_id == event_id) {
                m.aggregate_type = row
                    .try_get::<_, Option<String>>(1)
                    .map_err(&e)?
                    .unwrap_or_default();
                m.aggregate_id = row
                    .try_get::<_, Option<String>>(2)
                    .map_err(&e)?
                    .unwrap_or_default();
                m.occurred_micros = row.try_get(3).map_err(&e)?;
            }
        }
        Ok(())
    }

    /// Logs, counts and publishes the rows the stream did not deliver.
    async fn republish(
        &self,
        client: &Client,
        store: &Arc<OffsetStore>,
        system_id: &str,
        look_from: i64,
        (lo, hi): (u64, u64),
        missing: &[MissingRow],
    ) -> Result<(), RoundError> {
        let n = missing.len() as u64;
        self.metrics.reconcile_found(n);
        self.metrics.health.witness_unpublished(n);
        for row in missing.iter().take(LOGGED_ROWS) {
            error!(
                event_id = %row.event_id,
                aggregate_type = %row.aggregate_type,
                aggregate_id = %row.aggregate_id,
                transaction = row.xid,
                occurred_at = %PgTimestamp(row.occurred_micros).rfc3339(),
                window = %format!("transactions {lo}..{hi}"),
                "live witness: a committed outbox row was not delivered by the stream; publishing it from the table"
            );
        }
        if missing.len() > LOGGED_ROWS {
            error!(
                more = missing.len() - LOGGED_ROWS,
                window = %format!("transactions {lo}..{hi}"),
                "live witness: more rows not delivered by the stream (not named one by one)"
            );
        }
        let only = EventIdSet::from_fingerprints(
            missing
                .iter()
                .map(|r| EventIdSet::fingerprint(&r.event_id))
                .collect(),
        );
        // Exactly-once: a Kafka transaction of their own, under an id of
        // the witness's (the stream's producer keeps its own id).
        let exactly_once = self.config.delivery.mode == crate::config::DeliveryMode::ExactlyOnce;
        let transactional_id = exactly_once.then(|| {
            let stream = crate::sink::transactional_id(system_id, &self.config.postgres.slot);
            format!("{stream}.witness")
        });
        let options = ReplayOptions {
            since: PgTimestamp(look_from).rfc3339(),
            only: Some(only),
            parking: Some(store.clone()),
            mark_repaired: Some("witness"),
            transactional_id,
            ..ReplayOptions::default()
        };
        if let Some(id) = &options.transactional_id {
            info!(transactional_id = %id, "live witness: publishing in a Kafka transaction of its own");
        }
        let report = crate::retained::replay_with(client, &self.config, &options).await?;
        self.metrics.reconcile_repaired(report.total());
        self.metrics.health.witness_unpublished(0);
        info!(
            rows = report.total(),
            "live witness: the rows the stream did not deliver are published"
        );
        Ok(())
    }
}

/// A row the stream did not deliver.
struct MissingRow {
    event_id: String,
    aggregate_type: String,
    aggregate_id: String,
    xid: u64,
    occurred_micros: i64,
}

async fn take_mark(client: &Client) -> Result<Mark, PipelineError> {
    let e = sql("taking the live witness's snapshot");
    let position = "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                    ELSE pg_current_wal_insert_lsn() END - '0/0'::pg_lsn)::int8";
    let before: i64 = client
        .query_one(&format!("SELECT {position}"), &[])
        .await
        .map_err(&e)?
        .try_get(0)
        .map_err(&e)?;
    // One statement: its snapshot is taken before the position is read.
    // Transactions of other roles show no xact_start without
    // pg_read_all_stats; the settle margin covers those.
    let select = format!(
        "SELECT pg_snapshot_xmin(s)::text::int8, pg_snapshot_xmax(s)::text::int8, {position}, \
         {}::int8, {}::int8 FROM pg_current_snapshot() AS s",
        micros_of("now()"),
        micros_of(
            "least(now(), (SELECT min(xact_start) FROM pg_stat_activity WHERE backend_xid IS NOT NULL), \
             (SELECT min(prepared) FROM pg_prepared_xacts))"
        ),
    );
    let row = client.query_one(&select, &[]).await.map_err(&e)?;
    let get = |i: usize| row.try_get::<_, i64>(i).map_err(&e);
    Ok(Mark {
        before: Lsn::new(before as u64),
        xmin: get(0)? as u64,
        xmax: get(1)? as u64,
        after: Lsn::new(get(2)? as u64),
        taken_micros: get(3)?,
        look_from_micros: get(4)?,
    })
}

/// Rows read before their fingerprints are looked up together.
const CHUNK_ROWS: usize = 1024;

/// Looks the chunk's rows up among `delivered` in fingerprint order and adds
/// those not found to `missing`; empties the chunk and its ids.
fn look_up(
    chunk: &mut Vec<(u64, u64, usize, usize)>,
    ids: &mut Vec<u8>,
    delivered: &[u64],
    missing: &mut Vec<MissingRow>,
) {
    chunk.sort_unstable_by_key(|(fp, ..)| *fp);
    let mut from = 0;
    for &(fp, xid, at, len) in chunk.iter() {
        from = first_at_least(delivered, from, fp);
        if delivered.get(from) == Some(&fp) {
            continue;
        }
        missing.push(MissingRow {
            event_id: String::from_utf8_lossy(&ids[at..at + len]).into_owned(),
            aggregate_type: String::new(),
            aggregate_id: String::new(),
            xid,
            occurred_micros: 0,
        });
    }
    chunk.clear();
    ids.clear();
}

/// The first index at or after `from` whose value in `sorted` is at least
/// `value` (`sorted.len()` when none is); every value before `from` must be
/// less than `value`. Gallops from `from`, so lookups in ascending order
/// read memory near the last one instead of halving the whole slice.
fn first_at_least(sorted: &[u64], from: usize, value: u64) -> usize {
    let (mut below, mut probe, mut step) = (from, from, 1);
    while probe < sorted.len() && sorted[probe] < value {
        below = probe + 1;
        probe += step;
        step *= 2;
    }
    let probe = probe.min(sorted.len());
    below + sorted[below..probe].partition_point(|v| *v < value)
}

/// How long ago `micros` (PostgreSQL time) was.
fn lag_since(micros: i64) -> Duration {
    Duration::from_micros(PgTimestamp::now().0.saturating_sub(micros).max(0) as u64)
}

/// A row's 32-bit transaction id as the 64-bit id it stands for, taken as
/// the nearest one at or before `reference` (a row newer than the window
/// maps to 4 billion ids back, outside it); `None` before id 0.
fn widen(xid: u32, reference: u64) -> Option<u64> {
    let back = u64::from((reference as u32).wrapping_sub(xid));
    reference.checked_sub(back)
}

#[cfg(test)]
mod tests {
    use super::{first_at_least, widen};

    /// In ascending order from where the last lookup ended, it finds what a
    /// binary search over the whole slice finds.
    #[test]
    fn lookups_in_order_find_what_a_binary_search_finds() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % 5_000
        };
        for len in [0, 1, 2, 3, 17, 1000] {
            let mut sorted: Vec<u64> = (0..len).map(|_| next()).collect();
            sorted.sort_unstable();
            let mut wanted: Vec<u64> = (0..300).map(|_| next()).collect();
            wanted.extend(sorted.iter().take(50));
            wanted.push(u64::MAX);
            wanted.push(0);
            wanted.sort_unstable();
            let mut from = 0;
            for w in wanted {
                from = first_at_least(&sorted, from, w);
                assert_eq!(from, sorted.partition_point(|v| *v < w), "len {len}, {w}");
                assert_eq!(
                    sorted.get(from) == Some(&w),
                    sorted.binary_search(&w).is_ok()
                );
            }
        }
    }

    #[test]
    fn a_row_id_is_widened_to_the_nearest_before_the_reference() {
        let epoch = 3u64 << 32;
        assert_eq!(widen(100, epoch + 200), Some(epoch + 100));
        assert_eq!(widen(200, epoch + 200), Some(epoch + 200));
        // Just before the epoch turned.
        assert_eq!(widen(u32::MAX - 5, epoch + 10), Some(epoch - 6));
        // Newer than the reference: far back, out of any window.
        assert_eq!(widen(300, epoch + 200), Some(epoch + 300 - (1 << 32)));
        assert_eq!(widen(300, 200), None);
    }
}
