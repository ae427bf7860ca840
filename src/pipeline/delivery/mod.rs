//! How records reach Kafka: the one place that knows the delivery mode
//! (`[delivery] mode`, DESIGN.md §6 and §14).
//!
//! The session hands each record to a [`Delivery`] with the token it wants
//! back in the record's report, and tells it when a PostgreSQL transaction
//! commits, on every tick and when the session ends. A delivery owns the
//! producer and its report channel; exactly-once delivery also owns the open
//! Kafka transaction, its batch policy and the marker. The session owns the
//! ack tracker and lends it to each call: only a delivery may hold the
//! acknowledged position back (exactly-once, until its Kafka commit).
//!
//! - [`AtLeastOnce`]: the idempotent producer; every hook but `send` does
//!   nothing, and says so.
//! - [`ExactlyOnce`]: the transactional producer, fenced at the start, and
//!   the marker of the last commit adopted into the offset store.
//! - `MemoryDelivery` (tests): acknowledges, refuses and delays on command.

mod at_least_once;
mod batch;
mod exactly_once;
#[cfg(test)]
pub(super) mod memory;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::checkpoint::{AckTracker, EventToken, OffsetStore};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::outbox::OutboxEvent;
use crate::pg::control::SlotInfo;
use crate::pg::{EventPosition, Lsn, PgTimestamp};
use crate::sink::{DeliveryReport, SinkError};

use crate::error::PipelineError;

pub(super) use at_least_once::AtLeastOnce;
pub(super) use exactly_once::ExactlyOnce;

/// What travels with each record through the producer and comes back in its report.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub(super) token: EventToken,
    pub(super) commit_time: PgTimestamp,
    pub(super) at: EventPosition,
    /// Moved out of the event (the sink does not read them): what a broker-side
    /// poison failure parks under the dead-letter policy.
    pub(super) aggregate_type: String,
    pub(super) aggregate_id: String,
    /// Already on its way to the dead-letter topic: a refusal now is final.
    pub(super) dead_lettered: bool,
    /// When it was handed to the producer.
    pub(super) produced_at: Instant,
}

/// Why a record was not handed to the producer.
pub(super) enum Unsent {
    /// The sink refused this record before it left (e.g. over
    /// `message.max.bytes`, a missing topic): the poison policy decides, as
    /// for a refusal the broker reports.
    Refused(SinkError, InFlight),
    /// Delivery itself failed (exactly-once: beginning the Kafka transaction).
    Failed(PipelineError),
}

impl Unsent {
    /// A record the sink gave back: the token always comes back with a
    /// record it refused; without it, the sink failed.
    fn refused((source, in_flight): (SinkError, Option<InFlight>)) -> Unsent {
        match in_flight {
            Some(in_flight) => Unsent::Refused(source, in_flight),
            None => Unsent::Failed(source.into()),
        }
    }
}

/// The tracker's acknowledged position moved: the session persists it.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Advanced(pub(super) bool);

/// Whether the connector is behind the server: a batching delivery lets a
/// batch grow past its age while it is (its events are late already, and
/// fewer commits catch up sooner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Input {
    /// Nothing received is left unread, or what is unread was sent promptly.
    CaughtUp,
    /// A backlog or a burst: see [`Input::at_commit`].
    Behind,
}

impl Input {
    /// At a PostgreSQL commit that the walsender sent at `sent_at`: behind
    /// only when bytes received are still unread *and* the server sent the
    /// commit at least `late_from` after it happened (both times from the
    /// server's clock). Unread bytes alone are no sign: at a steady rate,
    /// what arrived while the last Kafka commit ran is still being read when
    /// the next batch is due, and holding batches open for it made the
    /// half-load tail (docs/performance.md). A real backlog or a burst larger
    /// than the socket's buffers is sent late, since the walsender waits for
    /// the connector to read.
    pub(super) fn at_commit(
        unread: bool,
        commit_time: PgTimestamp,
        sent_at: PgTimestamp,
        late_from: Duration,
    ) -> Input {
        let late_by = sent_at.0.saturating_sub(commit_time.0);
        if unread && late_by >= late_from.as_micros() as i64 {
            Input::Behind
        } else {
            Input::CaughtUp
        }
    }
}

/// What a delivery needs from the session's start: the cluster and slot it
/// streams, what the store holds, and whether the slot is held by another
/// process (exactly-once must not fence an instance that streams).
pub(super) struct StartContext<'s> {
    pub(super) store: &'s Arc<OffsetStore>,
    pub(super) system_id: &'s str,
    pub(super) slot_info: Option<&'s SlotInfo>,
    pub(super) repair_pending: bool,
}

/// A way of delivering records to Kafka. Every method is called from the
/// session's one task, in the order of the stream.
pub(super) trait Delivery: Sized + Send {
    /// Creates the producer: a property librdkafka refuses fails here,
    /// before the slot or the publication is touched. Nothing is sent yet.
    fn create(config: &Config, metrics: &Metrics, system_id: &str) -> Result<Self, PipelineError>;

    /// Once the slot was read, before the resume decision: whatever must
    /// happen before the stored offset is loaded.
    fn ready(
        &mut self,
        start: StartContext<'_>,
    ) -> impl Future<Output = Result<(), PipelineError>> + Send;

    /// Hands one record to the producer, in commit order; its report comes
    /// back with `in_flight` on [`Delivery::reports`].
    fn send(
        &mut self,
        event: &OutboxEvent,
        in_flight: InFlight,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<(), Unsent>> + Send;

    /// Kafka acknowledged one of the records at `now`.
    fn delivered(&mut self, now: Instant);

    /// A PostgreSQL transaction ending at `end`, committed at `commit_time`,
    /// was read whole (the tracker has its commit); `input`: whether more of
    /// the stream waits to be read.
    fn committed(
        &mut self,
        end: Lsn,
        commit_time: PgTimestamp,
        input: Input,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<Advanced, PipelineError>> + Send;

    /// The session's tick; `inside_transaction`: a PostgreSQL transaction is
    /// being read (a batch may not end inside it); `input` as for
    /// [`Delivery::committed`].
    fn tick(
        &mut self,
        inside_transaction: bool,
        input: Input,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<Advanced, PipelineError>> + Send;

    /// A graceful end: what was sent is finished at a transaction boundary
    /// (`at_boundary`), or given up when the grace ran out inside one.
    fn finish(
        &mut self,
        at_boundary: bool,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<Advanced, PipelineError>> + Send;

    /// The session ends on an error: nothing more is committed.
    fn abandon(&mut self);

    /// The records' reports, in no particular order.
    fn reports(&mut self) -> &mut mpsc::UnboundedReceiver<DeliveryReport<InFlight>>;

    /// A fatal producer error, once the producer has one.
    fn fatal_error(&self) -> Option<SinkError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Behind needs both: bytes left unread and a commit the server sent
    /// late. Unread bytes of commits sent at once (a steady rate read after
    /// a Kafka commit) are caught up.
    #[test]
    fn behind_is_unread_bytes_of_a_commit_sent_late() {
        let at = |ms: i64| PgTimestamp(1_000_000_000 + ms * 1000);
        let ten = Duration::from_millis(10);
        assert_eq!(Input::at_commit(true, at(0), at(10), ten), Input::Behind);
        assert_eq!(Input::at_commit(true, at(0), at(5_000), ten), Input::Behind);
        assert_eq!(Input::at_commit(true, at(0), at(9), ten), Input::CaughtUp);
        assert_eq!(
            Input::at_commit(false, at(0), at(5_000), ten),
            Input::CaughtUp
        );
        // The clock of a standby that decodes may be behind the primary's.
        assert_eq!(Input::at_commit(true, at(0), at(-50), ten), Input::CaughtUp);
    }
}
