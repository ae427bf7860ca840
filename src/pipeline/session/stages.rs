//! `outbox_cdc_stage_seconds`: where an event's time goes, from its commit
//! to Kafka's acknowledgement (commit to send, send to receive, receive to
//! produce, produce to ack, ack to tracker).

use std::time::Instant;

use crate::metrics::{Metrics, Stage};
use crate::pg::PgTimestamp;
use crate::pgoutput;

/// The send time and arrival of the XLogData being handled.
pub(super) struct StageClock {
    sent_at: PgTimestamp,
    received_at: Instant,
}

impl StageClock {
    pub(super) fn new() -> StageClock {
        StageClock {
            sent_at: PgTimestamp(0),
            received_at: Instant::now(),
        }
    }

    /// When the walsender sent the XLogData being handled (its clock).
    pub(super) fn sent_at(&self) -> PgTimestamp {
        self.sent_at
    }

    /// An XLogData sent by the walsender at `server_time` arrived. The clock
    /// is read only for the messages that can become events (Insert,
    /// Message): three per one-event transaction would be read otherwise.
    pub(super) fn arrived(&mut self, data: &[u8], server_time: PgTimestamp) {
        if matches!(
            data.first(),
            Some(&(pgoutput::tag::INSERT | pgoutput::tag::MESSAGE))
        ) {
            self.received_at = Instant::now();
        }
        self.sent_at = server_time;
    }

    /// The stages of an event before the producer: commit to the walsender's
    /// send, send to arrival (wall clocks), arrival to `produced_at`.
    pub(super) fn produced(&self, m: &Metrics, commit_time: PgTimestamp, produced_at: Instant) {
        let seconds = |micros: i64| micros.max(0) as f64 / 1e6;
        let handled = produced_at.duration_since(self.received_at);
        // The wall clock is read once, here: the arrival is now minus the
        // handling measured on the monotonic clock.
        let arrived = PgTimestamp::now().0 - handled.as_micros() as i64;
        m.stage(Stage::CommitToSend, seconds(self.sent_at.0 - commit_time.0));
        m.stage(Stage::SendToReceive, seconds(arrived - self.sent_at.0));
        m.stage(Stage::ReceiveToProduce, handled.as_secs_f64());
    }
}

/// Both clocks, read once for a batch of delivery reports (handled within
/// microseconds).
#[derive(Clone, Copy)]
pub(super) struct Now {
    pub(super) instant: Instant,
    wall: PgTimestamp,
}

impl Now {
    pub(super) fn read() -> Now {
        Now {
            instant: Instant::now(),
            wall: PgTimestamp::now(),
        }
    }

    /// Kafka acknowledged, at `reported_at`, a record produced at
    /// `produced_at` of a transaction committed at `commit_time`.
    pub(super) fn acknowledged(
        self,
        m: &Metrics,
        reported_at: Instant,
        produced_at: Instant,
        commit_time: PgTimestamp,
    ) {
        let to_ack = reported_at.duration_since(produced_at);
        m.stage(Stage::ProduceToAck, to_ack.as_secs_f64());
        let to_tracker = self.instant.saturating_duration_since(reported_at);
        m.stage(Stage::AckToTracker, to_tracker.as_secs_f64());
        m.published(self.wall.0.saturating_sub(commit_time.0).max(0) as u64);
    }
}
