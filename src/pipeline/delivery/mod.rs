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
use std::time::Instant;

use tokio::sync::{mpsc, watch};

use crate::checkpoint::{AckTracker, EventToken, OffsetStore};
use crate::config::{Config, DeliveryMode};
use crate::metrics::Metrics;
use crate::outbox::OutboxEvent;
use crate::pg::control::SlotInfo;
use crate::pg::{EventPosition, Lsn, PgTimestamp};
use crate::sink::{DeliveryReport, SinkError};

use super::{PipelineError, RunOptions, session};

pub(super) use at_least_once::AtLeastOnce;
pub(super) use exactly_once::ExactlyOnce;

/// One replication session, delivering as `[delivery] mode` says: the one
/// place the mode is decided.
pub(super) async fn run_session(
    config: &Config,
    options: RunOptions,
    store: &Arc<OffsetStore>,
    metrics: &Metrics,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    match config.delivery.mode {
        DeliveryMode::AtLeastOnce => {
            session::run::<AtLeastOnce>(config, options, store, metrics, shutdown).await
        }
        DeliveryMode::ExactlyOnce => {
            session::run::<ExactlyOnce>(config, options, store, metrics, shutdown).await
        }
    }
}

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

/// Why a delivery hook failed.
pub(super) enum DeliveryError {
    /// The sink refused a record before it left (e.g. over
    /// `message.max.bytes`, a missing topic): the poison policy decides, as
    /// for a refusal the broker reports.
    Refused(Refused),
    /// Delivery itself failed (e.g. beginning or committing a Kafka
    /// transaction).
    Failed(PipelineError),
}

/// A record Kafka will not take, with what the poison policy needs (see
/// `Refused::into_error` in the session).
pub(super) struct Refused {
    pub(super) source: SinkError,
    pub(super) event_id: String,
    pub(super) record: InFlight,
}

impl DeliveryError {
    /// What the sink gave back for `event`: the token always comes back with
    /// a record it refused; without it, the sink failed.
    fn refused(event: &OutboxEvent) -> impl FnOnce((SinkError, Option<InFlight>)) -> DeliveryError {
        move |(source, in_flight)| match in_flight {
            Some(record) => DeliveryError::Refused(Refused {
                source,
                event_id: event.event_id.clone(),
                record,
            }),
            None => DeliveryError::Failed(source.into()),
        }
    }
}

impl From<PipelineError> for DeliveryError {
    fn from(e: PipelineError) -> DeliveryError {
        DeliveryError::Failed(e)
    }
}

impl From<SinkError> for DeliveryError {
    fn from(e: SinkError) -> DeliveryError {
        DeliveryError::Failed(e.into())
    }
}

/// What [`Delivery::next`] has for the session.
// Not boxed: a report is moved once, and boxing it would allocate for every
// record on the hot path.
#[allow(clippy::large_enum_variant)]
pub(super) enum Next<D> {
    /// A record's delivery report.
    Report(DeliveryReport<InFlight>),
    /// Work the delivery ran in the background ended; hand it to
    /// [`Delivery::settle`].
    Done(D),
}

/// The tracker's acknowledged position moved: the session persists it.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Advanced(pub(super) bool);

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
    /// How work run in the background ends (exactly-once: a Kafka commit).
    type Done: Send;

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
    /// back with `in_flight` on [`Delivery::reports`] (exactly-once: once the
    /// Kafka transaction it waits for is begun, see [`Delivery::waiting`]).
    fn send(
        &mut self,
        event: OutboxEvent,
        in_flight: InFlight,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<(), DeliveryError>> + Send;

    /// Kafka acknowledged one of the records at `now`.
    fn delivered(&mut self, now: Instant);

    /// A PostgreSQL transaction ending at `end`, committed at `commit_time`,
    /// was read whole (the tracker has its commit).
    fn committed(
        &mut self,
        end: Lsn,
        commit_time: PgTimestamp,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<Advanced, DeliveryError>> + Send;

    /// The session's tick; `inside_transaction`: a PostgreSQL transaction is
    /// being read (a batch may not end inside it).
    fn tick(
        &mut self,
        inside_transaction: bool,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<Advanced, DeliveryError>> + Send;

    /// A graceful end: what was sent is finished at a transaction boundary
    /// (`at_boundary`), or given up when the grace ran out inside one.
    fn finish(
        &mut self,
        at_boundary: bool,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<Advanced, DeliveryError>> + Send;

    /// The session ends on an error: nothing more is committed. Returns how
    /// a commit already under way failed, if it did (a fenced producer must
    /// stop the connector whatever ended the session).
    fn abandon(&mut self) -> Option<PipelineError>;

    /// The records' reports, in no particular order.
    fn reports(&mut self) -> &mut mpsc::UnboundedReceiver<DeliveryReport<InFlight>>;

    /// The next report, or the end of work running in the background.
    /// Cancel-safe: nothing is lost when another branch of the session's
    /// loop wins. By default: the next report.
    fn next(&mut self) -> impl Future<Output = Option<Next<Self::Done>>> + Send {
        async move { self.reports().recv().await.map(Next::Report) }
    }

    /// Background work ended as `done` (from [`Delivery::next`]).
    fn settle(
        &mut self,
        done: Self::Done,
        tracker: &mut AckTracker,
    ) -> impl Future<Output = Result<Advanced, DeliveryError>> + Send;

    /// Records handed to `send` and not yet to the producer: no report comes
    /// for them before the background work ends. By default none wait.
    fn waiting(&self) -> usize {
        0
    }

    /// A fatal producer error, once the producer has one.
    fn fatal_error(&self) -> Option<SinkError>;
}
