//! Persisting the acknowledged position and reporting it to PostgreSQL
//! (DESIGN.md §5): the tracker says what is acknowledged; this makes it
//! durable in the offset store on a blocking thread, and only a durable
//! position (a [`DurableLsn`]) ever reaches the feedback handle.
//!
//! With the sequence audit on, what is reported also waits for the
//! aggregates' numbers: a position is reported only once every number
//! recorded before it is in the store, because after a crash the server
//! sends that stretch again and the numbers are read back from it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::checkpoint::{AckTracker, DurableLsn, OffsetStore, StoreError};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pg::{FeedbackHandle, Lsn, PgTimestamp};

use crate::checkpoint::{Ledger, Page};
use crate::error::PipelineError;
use crate::pipeline::sequences::SequenceWatch;

/// A sequence audit record on its way to the store: key, number, position.
type SequenceEntry = (Box<[u8]>, i64, Lsn);

/// What a persist took from the session to write, given back when the write
/// failed: the next persist writes it before its offset. An offset stored
/// past fingerprints or numbers that were dropped would make the live
/// witness take delivered rows for missing (and publish them again) and the
/// sequence audit see gaps that are not there.
struct Taken {
    numbers: Vec<SequenceEntry>,
    page: Option<Page>,
}

/// A persist on its thread: what it made durable, or why not with what it
/// took (boxed: the error side is large).
type PersistResult = Result<Persisted, Box<(StoreError, Taken)>>;

/// What one persist made durable.
pub(super) struct Persisted {
    durable: DurableLsn,
    /// Every number recorded before the persist was in the store with it:
    /// the position may be reported to PostgreSQL.
    reportable: bool,
    /// Every event sent before the position has its witness fingerprint in
    /// the store (the stream had passed what the server sends again).
    pages_complete: bool,
}

pub(super) struct Checkpointer<'a> {
    store: &'a Arc<OffsetStore>,
    metrics: &'a Metrics,
    slot: String,
    system_id: String,
    feedback: FeedbackHandle,
    flush_every: Duration,
    save_every: Duration,
    durable: DurableLsn,
    /// The last position given to the feedback handle. It trails `durable`
    /// while numbers recorded for events before `durable` are not in the
    /// store.
    reported: Lsn,
    /// The server is sending again what came before the stored offset (set at
    /// the start when `reported` trails it): until the stream passes it, the
    /// numbers it carries are not all recorded, and nothing newer than
    /// `reported` may be reported.
    replaying: bool,
    /// Set when the tracker advanced past `durable`, or `durable` past `reported`.
    dirty_since: Option<Instant>,
    /// A persist running on a blocking thread (one at a time); its result is
    /// the only way a new flush position reaches the feedback handle.
    persisting: Option<JoinHandle<PersistResult>>,
    /// The numbers of a persist that failed, saved first by the next.
    given_back: Vec<SequenceEntry>,
    /// When the numbers were last taken for the store (`audit.save_interval_ms`).
    sequences_taken_at: Instant,
    /// The events sent, for the live witness (`None` with `[reconcile]` off):
    /// written to the store with the offset that covers them.
    ledger: Option<Ledger>,
    /// The stored pages hold every event an earlier session sent in a
    /// transaction committing before this: it persisted them before the
    /// offset (see [`StartPositions::paged_through`]).
    paged_through: Lsn,
    /// The server is sending again, from the slot's position, what came
    /// before the stored offset, and the pages stop short of it
    /// (exactly-once resumed at a Kafka marker ahead of the stored offset,
    /// whose events' pages died with the crash): the events past
    /// `paged_through` are recorded as they pass, and until the stream passed
    /// the offset the pages cover only the slot's position
    /// (`Metrics::witness_covered`).
    pages_behind: bool,
    /// The stream passed that stretch: its pages wait for a persist, even
    /// if nothing new is acknowledged.
    pages_due: bool,
}

/// Where a session starts.
pub(super) struct StartPositions {
    /// The stored offset.
    pub(super) durable: DurableLsn,
    /// What the server was told is flushed (behind `durable` while the
    /// sequence audit's numbers are read back).
    pub(super) reported: Lsn,
    /// Where the server streams from: the slot's position.
    pub(super) resent_from: Lsn,
    /// The last offset a session persisted after the witness pages of all
    /// it covers (`OffsetStore::witness_paged_through`: not an offset
    /// adopted from a Kafka marker; zero when unknown). An event of a
    /// transaction committing before it that is not in the pages was never
    /// sent: recording it when the server sends it again would hide a
    /// skipped row from the witness.
    pub(super) paged_through: Lsn,
}

impl<'a> Checkpointer<'a> {
    pub(super) fn new(
        config: &Config,
        store: &'a Arc<OffsetStore>,
        metrics: &'a Metrics,
        system_id: String,
        feedback: FeedbackHandle,
        start: StartPositions,
    ) -> Checkpointer<'a> {
        let StartPositions {
            durable,
            reported,
            resent_from,
            paged_through,
        } = start;
        let replaying = reported < durable.lsn();
        let pages_behind = resent_from < durable.lsn() && paged_through < durable.lsn();
        metrics.set_witness_covered(match pages_behind {
            true => resent_from,
            false => durable.lsn(),
        });
        Checkpointer {
            store,
            metrics,
            slot: config.postgres.slot.clone(),
            system_id,
            feedback,
            flush_every: Duration::from_millis(config.offsets.flush_interval_ms),
            save_every: Duration::from_millis(config.audit.save_interval_ms),
            durable,
            reported,
            replaying,
            dirty_since: replaying.then(Instant::now),
            persisting: None,
            given_back: Vec::new(),
            sequences_taken_at: Instant::now(),
            ledger: config.reconcile.enabled.then(Ledger::default),
            paged_through,
            pages_behind,
            pages_due: false,
        }
    }

    /// An event of the transaction committing at `commit` was sent (or
    /// dead-lettered): the live witness will not take its row for missing.
    pub(super) fn record_sent(&mut self, commit: Lsn, event_id: &str) {
        if let Some(ledger) = self.ledger.as_mut() {
            ledger.record(commit, event_id);
        }
    }

    /// Whether an event of a transaction acknowledged before the restart,
    /// committing at `commit`, is recorded as sent when the server sends it
    /// again: only past the pages an earlier session stored. Before them,
    /// an event missing from the pages was skipped, not sent (the cause the
    /// witness exists for), and must stay missing.
    pub(super) fn records_resent(&self, commit: Lsn) -> bool {
        self.ledger.is_some() && commit >= self.paged_through
    }

    pub(super) fn durable(&self) -> Lsn {
        self.durable.lsn()
    }

    /// The flush position the feedback handle would send the server.
    #[cfg(test)]
    pub(super) fn reported_to_server(&self) -> Lsn {
        self.feedback.flushed()
    }

    /// The stream passed what the server sends again after a restart.
    pub(super) fn replay_done(&mut self) {
        self.replaying = false;
        if self.pages_behind {
            self.pages_behind = false;
            self.pages_due = true;
            self.mark_dirty();
        }
    }

    /// Between transactions: the server's WAL end, as written (never behind
    /// the durable position).
    pub(super) fn written(&self, wal_end: Lsn) {
        self.feedback.set_written(wal_end.max(self.durable.lsn()));
    }

    /// Something new may be persisted or reported.
    pub(super) fn mark_dirty(&mut self) {
        if self.dirty_since.is_none() {
            self.dirty_since = Some(Instant::now());
        }
    }

    /// On the tick: persists when something has waited `offsets.flush_interval_ms`.
    pub(super) fn tick(&mut self, tracker: &AckTracker, sequences: &mut SequenceWatch) {
        if self
            .dirty_since
            .is_some_and(|t| t.elapsed() >= self.flush_every)
        {
            self.persist(tracker, sequences);
        }
    }

    pub(super) fn is_persisting(&self) -> bool {
        self.persisting.is_some()
    }

    /// The running persist's result (pending while none runs).
    pub(super) async fn persisted(&mut self) -> Result<Persisted, PipelineError> {
        let Some(running) = self.persisting.as_mut() else {
            return std::future::pending().await;
        };
        let done = running.await;
        self.persisting = None;
        match done {
            Err(e) => Err(self.persist_failed(e)),
            Ok(Ok(persisted)) => Ok(persisted),
            Ok(Err(failed)) => {
                let (e, taken) = *failed;
                self.give_back(taken);
                Err(e.into())
            }
        }
    }

    /// See [`Taken`].
    fn give_back(&mut self, taken: Taken) {
        if let (Some(ledger), Some(page)) = (self.ledger.as_mut(), taken.page) {
            ledger.restore(page);
        }
        self.given_back = taken.numbers;
        self.pages_due = true;
    }

    /// The numbers a persist saves: any given back first (older), then the
    /// ones recorded since.
    fn take_numbers(&mut self, sequences: &mut SequenceWatch) -> Vec<SequenceEntry> {
        self.sequences_taken_at = Instant::now();
        let mut numbers = std::mem::take(&mut self.given_back);
        numbers.extend(sequences.take_unsaved());
        numbers
    }

    /// Starts persisting the acked LSN on a blocking thread (sled flushes to
    /// disk); the stream keeps moving meanwhile. PostgreSQL hears of it only
    /// in [`Checkpointer::flushed`], after the flush.
    fn persist(&mut self, tracker: &AckTracker, sequences: &mut SequenceWatch) {
        if self.persisting.is_some() {
            return; // the tick after it finishes picks up what is new
        }
        let acked = tracker.acked();
        let save_due = !self.replaying
            && (!sequences.has_unsaved() || self.sequences_taken_at.elapsed() >= self.save_every);
        let report_due = save_due && self.reported < self.durable.lsn();
        if acked <= self.durable.lsn() && !report_due && !self.pages_due {
            if self.reported >= self.durable.lsn() {
                self.dirty_since = None;
            }
            return;
        }
        if crate::failpoint::sabotaged("never-persist") {
            self.dirty_since = None;
            return;
        }
        self.dirty_since = None;
        let acked = acked.max(self.durable.lsn());
        let store = Arc::clone(self.store);
        let slot = self.slot.clone();
        let system_id = self.system_id.clone();
        let commit_time = tracker.acked_commit_time();
        let numbers = if save_due {
            self.take_numbers(sequences)
        } else {
            Vec::new()
        };
        let durable_commit_time = Arc::clone(&self.metrics.durable_commit_time);
        let page = self
            .ledger
            .as_mut()
            .and_then(|l| l.take_acknowledged(acked));
        let pages_complete = !self.pages_behind;
        let paged = (self.ledger.is_some() && pages_complete).then_some(acked);
        self.pages_due = false;
        self.persisting = Some(tokio::task::spawn_blocking(move || {
            let taken = Taken { numbers, page };
            match write_persist(&store, &slot, &taken, paged, acked, &system_id, commit_time) {
                Ok(durable) => {
                    durable_commit_time.set(commit_time);
                    Ok(Persisted {
                        durable,
                        reportable: save_due,
                        pages_complete,
                    })
                }
                Err(e) => Err(Box::new((e, taken))),
            }
        }));
    }

    /// The persist task panicked or was cancelled: what was durable before it
    /// still is, and nothing past it was reported to PostgreSQL.
    fn persist_failed(&self, e: tokio::task::JoinError) -> PipelineError {
        PipelineError::Internal {
            what: format!(
                "the offset persist task failed with the durable acked LSN at {}: {e}",
                self.durable.lsn()
            ),
        }
    }

    /// A persist finished: the position is durable, so it may be reported.
    pub(super) fn flushed(&mut self, persisted: Persisted, tracker: &AckTracker) {
        let Persisted {
            durable,
            reportable,
            pages_complete,
        } = persisted;
        crate::failpoint!("after-persist-before-status-update");
        if reportable {
            self.feedback.set_flushed(durable);
            self.reported = self.reported.max(durable.lsn());
        }
        self.metrics.set_acked(durable.lsn());
        if pages_complete {
            self.metrics.set_witness_covered(durable.lsn());
        }
        if durable.lsn() > self.durable.lsn() {
            self.durable = durable;
        }
        if tracker.acked() > self.durable.lsn() || self.reported < self.durable.lsn() {
            self.mark_dirty();
        }
    }

    /// Persists synchronously (after any persist still running): for the
    /// end of a session.
    pub(super) async fn persist_now(
        &mut self,
        tracker: &AckTracker,
        sequences: &mut SequenceWatch,
    ) -> Result<(), PipelineError> {
        if self.persisting.is_some() {
            let persisted = self.persisted().await?;
            self.flushed(persisted, tracker);
        }
        self.dirty_since = None;
        let acked = tracker.acked().max(self.durable.lsn());
        let behind =
            acked > self.durable.lsn() || self.reported < self.durable.lsn() || self.pages_due;
        if behind && !crate::failpoint::sabotaged("never-persist") {
            let commit_time = tracker.acked_commit_time();
            let numbers = self.take_numbers(sequences);
            let page = self
                .ledger
                .as_mut()
                .and_then(|l| l.take_acknowledged(acked));
            let paged = (self.ledger.is_some() && !self.pages_behind).then_some(acked);
            let taken = Taken { numbers, page };
            let written = tokio::task::block_in_place(|| {
                write_persist(
                    self.store,
                    &self.slot,
                    &taken,
                    paged,
                    acked,
                    &self.system_id,
                    commit_time,
                )
            });
            let durable = match written {
                Ok(durable) => durable,
                Err(e) => {
                    self.give_back(taken);
                    return Err(e.into());
                }
            };
            self.metrics.durable_commit_time.set(commit_time);
            let reportable = !self.replaying;
            let pages_complete = !self.pages_behind;
            self.pages_due = false;
            self.flushed(
                Persisted {
                    durable,
                    reportable,
                    pages_complete,
                },
                tracker,
            );
        }
        Ok(())
    }
}

/// One persist's writes, in the order that keeps the store consistent after
/// a crash at any point: the sequence numbers, the witness page (before the
/// offset: the pages on disk cover what it covers), the pages' extent, then
/// the offset.
fn write_persist(
    store: &OffsetStore,
    slot: &str,
    taken: &Taken,
    paged: Option<Lsn>,
    acked: Lsn,
    system_id: &str,
    commit_time: Option<PgTimestamp>,
) -> Result<DurableLsn, StoreError> {
    store.save_sequences(&taken.numbers)?;
    if let Some(page) = &taken.page {
        let chunks: Vec<&[u64]> = page.chunks().collect();
        store.save_witness_page(slot, page.through, &chunks)?;
    }
    if let Some(acked) = paged {
        store.save_witness_paged_through(slot, acked)?;
    }
    store.persist_acked(slot, acked, system_id, commit_time)
}
