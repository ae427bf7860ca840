//! Exactly-once delivery (`[delivery] mode = "exactly-once"`, DESIGN.md §14):
//! whole PostgreSQL transactions go into Kafka transactions, each ending with
//! a marker of its last PostgreSQL commit in the offsets topic.
//!
//! The first record after a Kafka commit begins the next Kafka transaction,
//! and the tracker holds the acknowledged position at the last PostgreSQL
//! commit before it until that transaction commits: nothing it carries is
//! persisted (or reported to PostgreSQL) before `read_committed` consumers
//! can see it. When to commit is [`BatchPolicy`]'s decision.
//!
//! A commit runs on a blocking thread while the session reads on
//! (issue 33): librdkafka runs one transaction per producer at a time, so the
//! records of the next batch wait in memory (at most the in-flight limits)
//! until the commit ends; then the hold moves to where that batch began,
//! its Kafka transaction is begun and they go to the producer in order. A
//! batch due while the previous commit still runs waits for it. Why this is
//! exactly-once: docs/guarantees.md, "Exactly-once: reading on during a
//! commit".

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle};
use tracing::{debug, info, warn};

use crate::checkpoint::AckTracker;
use crate::config::{Config, DeliverySettings};
use crate::metrics::{KafkaTransactionCounter, Metrics};
use crate::outbox::OutboxEvent;
use crate::pg::{Lsn, PgTimestamp};
use crate::sink::{DeliveryReport, KafkaSettings, Marker, SinkError, TransactionalSink};

use super::batch::{BatchPolicy, Overrun};
use super::{Advanced, Delivery, DeliveryError, InFlight, Next, StartContext};
use crate::pipeline::PipelineError;

pub(in crate::pipeline) struct ExactlyOnce {
    settings: DeliverySettings,
    /// For reading the marker back at the start.
    kafka: KafkaSettings,
    slot: String,
    transactions: KafkaTransactionCounter,
    /// Shared with the thread a commit runs on.
    sink: Arc<TransactionalSink<InFlight>>,
    reports: mpsc::UnboundedReceiver<DeliveryReport<InFlight>>,
    /// The batch being collected: begun in Kafka (`begun`) or waiting.
    policy: BatchPolicy,
    /// A Kafka transaction is begun on the producer and not yet committing.
    begun: bool,
    /// The last batch's commit, running while the session reads on.
    committing: Option<Committing>,
    /// The next batch's records, read while the last one commits.
    waiting: Option<Waiting>,
    system_id: String,
    /// Where this stream's markers go (set by `ready`).
    marker_topic: String,
    marker_partition: i32,
    /// The commit time of the last PostgreSQL transaction read (a marker
    /// carries it).
    last_commit_time: Option<PgTimestamp>,
}

/// A Kafka commit running on a blocking thread.
struct Committing {
    task: JoinHandle<Result<(), SinkError>>,
    marker: Lsn,
    started: Instant,
}

/// What a commit's thread ended with.
pub(in crate::pipeline) type CommitEnded = Result<Result<(), SinkError>, JoinError>;

/// Records read while the previous batch commits, in stream order.
struct Waiting {
    /// The position before the first of them: the hold once they are in
    /// a Kafka transaction.
    hold: Lsn,
    records: Vec<(OutboxEvent, InFlight)>,
}

impl Delivery for ExactlyOnce {
    type Done = CommitEnded;

    fn create(
        config: &Config,
        metrics: &Metrics,
        system_id: &str,
    ) -> Result<ExactlyOnce, PipelineError> {
        let delivery = &config.delivery;
        let id = crate::sink::transactional_id(system_id, &config.postgres.slot);
        let timeout = delivery.transaction_timeout();
        let (sink, reports) = TransactionalSink::new(&config.kafka, &config.topics, &id, timeout)?;
        Ok(ExactlyOnce {
            settings: delivery.clone(),
            kafka: config.kafka.clone(),
            slot: config.postgres.slot.clone(),
            transactions: metrics.kafka_transaction_counter(),
            sink: Arc::new(sink),
            reports,
            policy: BatchPolicy::new(delivery, config.limits.max_in_flight_events),
            begun: false,
            committing: None,
            waiting: None,
            system_id: system_id.to_owned(),
            marker_topic: delivery.offsets_topic.clone(),
            marker_partition: 0,
            last_commit_time: None,
        })
    }

    /// Refused while another process holds the slot (a standby waiting for
    /// it must not fence the instance that streams); then fences any older
    /// producer of this stream and reads its last committed marker: a marker
    /// beyond the stored offset becomes the stored offset (the resume point
    /// is the greater of the two).
    async fn ready(&mut self, start: StartContext<'_>) -> Result<(), PipelineError> {
        let slot = self.slot.as_str();
        if let Some(pid) = start.slot_info.and_then(|s| s.active_pid) {
            return Err(PipelineError::SlotBusy {
                slot: slot.to_owned(),
                pid,
            });
        }
        let timeout = self.settings.transaction_timeout();
        tokio::task::block_in_place(|| self.sink.init_transactions(timeout))?;
        let key = Marker::key(start.system_id, slot);
        let topic = self.marker_topic.clone();
        self.marker_partition = self.sink.offsets_partition(&topic, &key).await?;
        let (kafka, partition) = (&self.kafka, self.marker_partition);
        let marker = tokio::task::block_in_place(|| {
            crate::sink::read_marker(kafka, &topic, partition, start.system_id, slot, timeout)
        })?;
        let store = start.store;
        let stored = store.load(slot)?;
        info!(slot, transactional_id = %crate::sink::transactional_id(start.system_id, slot),
            offsets_topic = %topic, marker = ?marker.as_ref().map(|m| m.lsn),
            stored = ?stored.as_ref().map(|s| s.lsn), "exactly-once delivery: transactional producer ready");
        if let Some(marker) = marker
            && !start.repair_pending
            && stored
                .as_ref()
                .is_none_or(|s| s.system_id == start.system_id && s.lsn < marker.lsn)
        {
            // Committed in Kafka, not yet stored here (a crash between the two,
            // or a store lost or new): what the marker covers is published.
            warn!(slot, marker = %marker.lsn, stored = ?stored.as_ref().map(|s| s.lsn),
                "the last committed Kafka transaction is beyond the stored offset: resuming after it");
            tokio::task::block_in_place(|| {
                store.persist_acked(slot, marker.lsn, start.system_id, marker.commit_time)
            })?;
        }
        Ok(())
    }

    /// The first record after a Kafka commit begins the next Kafka
    /// transaction, and nothing after the last PostgreSQL commit is
    /// acknowledged until it commits. While the last batch commits, records
    /// wait for it.
    async fn send(
        &mut self,
        event: OutboxEvent,
        in_flight: InFlight,
        tracker: &mut AckTracker,
    ) -> Result<(), DeliveryError> {
        let size = event.size_bytes();
        if self.committing.is_some() {
            if !self.policy.is_open() {
                self.policy.opened(Instant::now());
            }
            let waiting = self.waiting.get_or_insert_with(|| Waiting {
                hold: tracker.last_commit_lsn(),
                records: Vec::new(),
            });
            waiting.records.push((event, in_flight));
            self.policy.added(size);
            return Ok(());
        }
        if !self.policy.is_open() {
            self.policy.opened(Instant::now());
        }
        if !self.begun {
            self.begin()?;
            let held = tracker.hold_at_last_commit();
            debug!(held_at = %held, "Kafka transaction begun");
        }
        self.sink
            .send_or_return(&event, in_flight)
            .await
            .map_err(DeliveryError::refused(&event))?;
        self.policy.added(size);
        Ok(())
    }

    fn delivered(&mut self, now: Instant) {
        self.policy.delivered(now);
    }

    async fn committed(
        &mut self,
        end: Lsn,
        commit_time: PgTimestamp,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, DeliveryError> {
        self.last_commit_time = Some(commit_time);
        match self.policy.due_at_commit(Instant::now()) {
            true => self.commit(end, tracker).await,
            false => Ok(Advanced(false)),
        }
    }

    /// A batch past `max_batch_ms` is committed between PostgreSQL
    /// transactions; one PostgreSQL transaction that has held a Kafka
    /// transaction open too long ends the session.
    async fn tick(
        &mut self,
        inside_transaction: bool,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, DeliveryError> {
        let now = Instant::now();
        if !inside_transaction {
            if self.policy.due_between(now) {
                return self.commit(tracker.last_commit_lsn(), tracker).await;
            }
            return Ok(Advanced(false));
        }
        let Some(overrun) = self.policy.overrun(now) else {
            return Ok(Advanced(false));
        };
        let after = tracker.last_commit_lsn();
        let error = match overrun {
            Overrun::TooLarge { events, open_for } => PipelineError::TransactionTooLarge {
                after,
                events,
                open_for,
                timeout_ms: self.settings.transaction_timeout_ms,
            },
            Overrun::KafkaStalled {
                events,
                undelivered,
                stalled_for,
            } => PipelineError::KafkaStalled {
                after,
                events,
                undelivered,
                stalled_for,
            },
        };
        Err(error.into())
    }

    /// The last batch commits at a transaction boundary, or (the grace ran
    /// out inside a transaction) is aborted and sent again by the next session.
    async fn finish(
        &mut self,
        at_boundary: bool,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, DeliveryError> {
        if !at_boundary {
            return match self.abandon() {
                Some(e) => Err(e.into()),
                None => Ok(Advanced(false)),
            };
        }
        let committed = self.commit(tracker.last_commit_lsn(), tracker).await?;
        let settled = self.wait_for_commit(tracker).await?;
        Ok(Advanced(committed.0 || settled.0))
    }

    /// The open Kafka transaction is aborted now rather than when the next
    /// producer starts (or the broker's timeout passes), so `read_committed`
    /// consumers are not held back meanwhile. Nothing it carried was
    /// acknowledged.
    fn abandon(&mut self) -> Option<PipelineError> {
        // A commit under way cannot be called back: its outcome is what the
        // marker says at the next start. It ends before the abort below.
        let failed = self.committing.take().and_then(|committing| {
            let ended = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(committing.task)
            });
            self.commit_result(ended).err().map(PipelineError::from)
        });
        // Waiting records never reached the producer.
        self.waiting = None;
        self.policy.closed();
        if !self.begun {
            return failed;
        }
        self.begun = false;
        self.transactions.inc("aborted");
        let timeout = Duration::from_secs(5);
        match tokio::task::block_in_place(|| self.sink.abort_transaction(timeout)) {
            Ok(()) => {
                info!("aborted the open Kafka transaction; the next session publishes it again")
            }
            Err(e) => {
                warn!(error = %e, "aborting the open Kafka transaction failed; the next producer aborts it")
            }
        }
        failed
    }

    fn reports(&mut self) -> &mut mpsc::UnboundedReceiver<DeliveryReport<InFlight>> {
        &mut self.reports
    }

    /// A report, or the end of the commit under way (first).
    async fn next(&mut self) -> Option<Next<CommitEnded>> {
        match self.committing.as_mut() {
            None => self.reports.recv().await.map(Next::Report),
            Some(committing) => tokio::select! {
                biased;
                ended = &mut committing.task => Some(Next::Done(ended)),
                report = self.reports.recv() => report.map(Next::Report),
            },
        }
    }

    /// The commit under way ended: what it carried may be acknowledged, and
    /// the records that waited for it go to the producer in a new Kafka
    /// transaction, held where they began.
    async fn settle(
        &mut self,
        ended: CommitEnded,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, DeliveryError> {
        let committing = self
            .committing
            .take()
            .expect("settle follows a commit's end");
        self.commit_result(ended)?;
        crate::failpoint!("after-kafka-commit-before-persist");
        debug!(marker = %committing.marker, took_ms = committing.started.elapsed().as_millis() as u64,
            "Kafka transaction committed");
        self.transactions.inc("committed");
        let Some(waiting) = self.waiting.take() else {
            return Ok(Advanced(tracker.release_hold().is_some()));
        };
        let advanced = tracker.move_hold(waiting.hold).is_some();
        self.begin()?;
        debug!(held_at = %waiting.hold, records = waiting.records.len(), "Kafka transaction begun for the records that waited");
        for (event, in_flight) in waiting.records {
            self.sink
                .send_or_return(&event, in_flight)
                .await
                .map_err(DeliveryError::refused(&event))?;
        }
        Ok(Advanced(advanced))
    }

    fn waiting(&self) -> usize {
        self.waiting.as_ref().map_or(0, |w| w.records.len())
    }

    fn fatal_error(&self) -> Option<SinkError> {
        self.sink.fatal_error()
    }
}

impl ExactlyOnce {
    /// What a commit's thread ended with (a panic there goes on here).
    fn commit_result(&self, ended: CommitEnded) -> Result<(), SinkError> {
        match ended {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(SinkError::Transaction {
                op: "commit",
                code: RDKafkaErrorCode::Fail,
                reason: format!("the thread committing was cancelled ({e})"),
                transactional_id: self.sink.id().to_owned(),
            }),
        }
    }

    fn begin(&mut self) -> Result<(), SinkError> {
        self.sink.begin_transaction()?;
        self.begun = true;
        Ok(())
    }

    /// Ends the batch with the marker of `lsn` (the end of the last
    /// PostgreSQL transaction in it) and starts its commit; only once that
    /// ends may what it carried be acknowledged (persisted in sled by the
    /// next persist, then reported to PostgreSQL). A commit still under way
    /// is waited for first: its waiting records belong to this batch.
    async fn commit(
        &mut self,
        lsn: Lsn,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, DeliveryError> {
        if !self.policy.is_open() {
            return Ok(Advanced(false));
        }
        let settled = self.wait_for_commit(tracker).await?;
        let marker = Marker {
            system_id: self.system_id.clone(),
            slot: self.slot.clone(),
            lsn,
            commit_time: self.last_commit_time,
        };
        self.sink
            .send_marker(&self.marker_topic, self.marker_partition, &marker)
            .await?;
        crate::failpoint!("before-kafka-commit");
        let timeout = self.settings.transaction_timeout();
        let sink = Arc::clone(&self.sink);
        self.committing = Some(Committing {
            task: tokio::task::spawn_blocking(move || {
                crate::failpoint::delay("kafka-commit");
                sink.commit_transaction(timeout)
            }),
            marker: lsn,
            started: Instant::now(),
        });
        self.begun = false;
        self.policy.closed();
        Ok(settled)
    }

    /// Waits for the commit under way, if any, and settles it.
    async fn wait_for_commit(
        &mut self,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, DeliveryError> {
        let Some(committing) = self.committing.as_mut() else {
            return Ok(Advanced(false));
        };
        let ended = (&mut committing.task).await;
        self.settle(ended, tracker).await
    }
}
