//! At-least-once delivery (the default): the idempotent producer. A record
//! is acknowledged when Kafka acknowledged it; after a failure everything
//! after the durable position is sent again (duplicates, never gaps).

use std::time::Instant;

use tokio::sync::mpsc;

use crate::checkpoint::AckTracker;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::outbox::OutboxEvent;
use crate::pg::{Lsn, PgTimestamp};
use crate::sink::{DeliveryReport, KafkaSink, SinkError};

use super::{Advanced, Delivery, InFlight, Input, StartContext, Unsent};
use crate::error::PipelineError;

pub(in crate::pipeline) struct AtLeastOnce {
    sink: KafkaSink<InFlight>,
    reports: mpsc::UnboundedReceiver<DeliveryReport<InFlight>>,
}

impl Delivery for AtLeastOnce {
    fn create(
        config: &Config,
        _metrics: &Metrics,
        _system_id: &str,
    ) -> Result<AtLeastOnce, PipelineError> {
        let (sink, reports) = KafkaSink::with_topics(&config.kafka, &config.topics)?;
        Ok(AtLeastOnce { sink, reports })
    }

    /// Nothing to prepare: the producer needs no state from the broker.
    async fn ready(&mut self, _start: StartContext<'_>) -> Result<(), PipelineError> {
        Ok(())
    }

    async fn send(
        &mut self,
        event: &OutboxEvent,
        in_flight: InFlight,
        _tracker: &mut AckTracker,
    ) -> Result<(), Unsent> {
        self.sink
            .send_or_return(event, in_flight)
            .await
            .map_err(Unsent::refused)
    }

    /// Nothing is batched: acknowledgements need no bookkeeping here.
    fn delivered(&mut self, _now: Instant) {}

    /// Each record stands alone: a commit ends nothing here.
    async fn committed(
        &mut self,
        _end: Lsn,
        _commit_time: PgTimestamp,
        _input: Input,
        _tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        Ok(Advanced(false))
    }

    /// No batch ages.
    async fn tick(
        &mut self,
        _inside_transaction: bool,
        _input: Input,
        _tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        Ok(Advanced(false))
    }

    /// The session waits for the outstanding reports itself.
    async fn finish(
        &mut self,
        _at_boundary: bool,
        _tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        Ok(Advanced(false))
    }

    /// Nothing is open: what was not acknowledged is sent again next time.
    fn abandon(&mut self) {}

    fn reports(&mut self) -> &mut mpsc::UnboundedReceiver<DeliveryReport<InFlight>> {
        &mut self.reports
    }

    fn fatal_error(&self) -> Option<SinkError> {
        self.sink.fatal_error()
    }
}
