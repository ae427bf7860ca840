//! Exactly-once delivery (`[delivery] mode = "exactly-once"`, DESIGN.md §14):
//! whole PostgreSQL transactions go into Kafka transactions, each ending with
//! a marker of its last PostgreSQL commit in the offsets topic.
//!
//! The first record after a Kafka commit begins the next Kafka transaction,
//! and the tracker holds the acknowledged position at the last PostgreSQL
//! commit before it until that transaction commits: nothing it carries is
//! persisted (or reported to PostgreSQL) before `read_committed` consumers
//! can see it. When to commit is [`BatchPolicy`]'s decision.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::checkpoint::AckTracker;
use crate::config::{Config, DeliverySettings};
use crate::metrics::{KafkaTransactionCounter, Metrics};
use crate::outbox::OutboxEvent;
use crate::pg::{Lsn, PgTimestamp};
use crate::sink::{
    DeliveryReport, KafkaSettings, Marker, MarkerRole, SinkError, TransactionalSink,
};

use super::batch::{BatchPolicy, Overrun};
use super::{Advanced, Delivery, InFlight, Input, StartContext, Unsent};
use crate::error::PipelineError;

pub(in crate::pipeline) struct ExactlyOnce {
    settings: DeliverySettings,
    /// For reading the marker back at the start.
    kafka: KafkaSettings,
    slot: String,
    transactions: KafkaTransactionCounter,
    sink: TransactionalSink<InFlight>,
    reports: mpsc::UnboundedReceiver<DeliveryReport<InFlight>>,
    policy: BatchPolicy,
    system_id: String,
    /// Where this stream's markers go (set by `ready`).
    marker_topic: String,
    marker_partition: i32,
    /// The commit time of the last PostgreSQL transaction read (a marker
    /// carries it).
    last_commit_time: Option<PgTimestamp>,
    /// How long a stop waits for the last commit: `shutdown_timeout_ms`,
    /// at most the transaction timeout.
    last_commit_bound: Duration,
}

impl Delivery for ExactlyOnce {
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
            sink,
            reports,
            policy: BatchPolicy::new(delivery, config.limits.max_in_flight_events),
            system_id: system_id.to_owned(),
            marker_topic: delivery.offsets_topic.clone(),
            marker_partition: 0,
            last_commit_time: None,
            last_commit_bound: timeout
                .min(Duration::from_millis(config.limits.shutdown_timeout_ms)),
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
        // In steps: a stop asked meanwhile ends the start between two.
        self.sink.init_transactions_yielding(timeout).await?;
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
        // With no store (lost, or new), a slot confirmed at or past the
        // marker (the usual state: keepalives move it on after the last
        // Kafka commit) is where to resume, as at least once does: a
        // position is confirmed only once persisted, and persisted only up
        // to what Kafka committed (review F4). Adopting the older marker
        // would be refused as a slot ahead of the stored offset.
        let slot_past_marker = |m: &Marker| {
            start
                .slot_info
                .and_then(|i| i.confirmed_flush_lsn)
                .is_some_and(|confirmed| confirmed >= m.lsn)
        };
        if let Some(marker) = marker
            && !start.repair_pending
            && match &stored {
                None => !slot_past_marker(&marker),
                Some(s) => s.system_id == start.system_id && s.lsn < marker.lsn,
            }
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
    /// acknowledged until it commits.
    async fn send(
        &mut self,
        event: &OutboxEvent,
        in_flight: InFlight,
        tracker: &mut AckTracker,
    ) -> Result<(), Unsent> {
        if !self.policy.is_open() {
            if let Some(at) = self.policy.next_begin(Instant::now()) {
                tokio::time::sleep_until(at.into()).await;
            }
            self.sink
                .begin_transaction()
                .map_err(|e| Unsent::Failed(e.into()))?;
            self.policy.opened(Instant::now());
            let held = tracker.hold_at_last_commit();
            debug!(held_at = %held, "Kafka transaction begun");
            // The opening marker: it registers the offsets partition in the
            // transaction now, beside the first record's partition, rather
            // than during the commit (one round trip to the coordinator
            // less there). It repeats a position already covered (`held`:
            // everything before it is committed or has no records), and the
            // closing marker follows it in the same partition and
            // transaction, so a reader, who takes the last one, never stops
            // at it.
            self.send_marker(held, MarkerRole::Opening)
                .await
                .map_err(|e| Unsent::Failed(e.into()))?;
        }
        let size = event.size_bytes();
        self.sink
            .send_or_return(event, in_flight)
            .await
            .map_err(Unsent::refused)?;
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
        input: Input,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        self.last_commit_time = Some(commit_time);
        match self.policy.due_at_commit(Instant::now(), input) {
            true => {
                self.commit(end, self.settings.transaction_timeout(), tracker)
                    .await
            }
            false => Ok(Advanced(false)),
        }
    }

    /// A batch past its age (see [`BatchPolicy`]) is committed between
    /// PostgreSQL transactions; one PostgreSQL transaction that has held a
    /// Kafka transaction open too long ends the session.
    async fn tick(
        &mut self,
        inside_transaction: bool,
        input: Input,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        let now = Instant::now();
        if !inside_transaction {
            if self.policy.due_between(now, input) {
                let bound = self.settings.transaction_timeout();
                return self.commit(tracker.last_commit_lsn(), bound, tracker).await;
            }
            return Ok(Advanced(false));
        }
        let Some(overrun) = self.policy.overrun(now) else {
            return Ok(Advanced(false));
        };
        let after = tracker.last_commit_lsn();
        Err(match overrun {
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
        })
    }

    /// The last batch commits at a transaction boundary, or (the grace ran
    /// out inside a transaction) is aborted and sent again by the next session.
    async fn finish(
        &mut self,
        at_boundary: bool,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        if at_boundary {
            let lsn = tracker.last_commit_lsn();
            return match self.commit(lsn, self.last_commit_bound, tracker).await {
                // An unreachable broker would hold the stop for the whole
                // transaction timeout. Nothing the transaction carried is
                // acknowledged; the next start reads the marker to learn
                // whether it committed, as after a crash at this point.
                Err(PipelineError::Sink(e)) => {
                    warn!(error = %e, marker = %lsn, bound_ms = self.last_commit_bound.as_millis() as u64,
                        "the last Kafka transaction did not commit within the stop's bound; \
                        the next start learns from its marker whether it did and sends it again if not");
                    Ok(Advanced(false))
                }
                other => other,
            };
        }
        self.abandon();
        Ok(Advanced(false))
    }

    /// The open Kafka transaction is aborted now rather than when the next
    /// producer starts (or the broker's timeout passes), so `read_committed`
    /// consumers are not held back meanwhile. Nothing it carried was
    /// acknowledged.
    fn abandon(&mut self) {
        if !self.policy.is_open() {
            return;
        }
        self.policy.aborted();
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
    }

    fn reports(&mut self) -> &mut mpsc::UnboundedReceiver<DeliveryReport<InFlight>> {
        &mut self.reports
    }

    fn fatal_error(&self) -> Option<SinkError> {
        self.sink.fatal_error()
    }
}

impl ExactlyOnce {
    /// Adds a marker of `lsn` to the open transaction.
    async fn send_marker(&self, lsn: Lsn, role: MarkerRole) -> Result<(), SinkError> {
        let marker = Marker {
            system_id: self.system_id.clone(),
            slot: self.slot.clone(),
            lsn,
            commit_time: self.last_commit_time,
        };
        self.sink
            .send_marker(&self.marker_topic, self.marker_partition, &marker, role)
            .await
    }

    /// Ends the open Kafka transaction with the marker of `lsn` (the end of
    /// the last PostgreSQL transaction in it) and commits it; only then may
    /// what it carried be acknowledged (persisted in sled by the next
    /// persist, then reported to PostgreSQL). Waits at most `timeout`.
    async fn commit(
        &mut self,
        lsn: Lsn,
        timeout: Duration,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        if !self.policy.is_open() {
            return Ok(Advanced(false));
        }
        self.send_marker(lsn, MarkerRole::Closing).await?;
        crate::failpoint!("before-kafka-commit");
        let started = Instant::now();
        tokio::task::block_in_place(|| self.sink.commit_transaction(timeout))?;
        crate::failpoint!("after-kafka-commit-before-persist");
        debug!(marker = %lsn, took_ms = started.elapsed().as_millis() as u64, "Kafka transaction committed");
        self.transactions.inc("committed");
        self.policy.committed(Instant::now());
        Ok(Advanced(tracker.release_hold().is_some()))
    }
}
