//! A delivery in memory, for unit tests of the session's rules: it keeps
//! what it is given and reports only when the test says so (acknowledged,
//! refused), in the order the test chooses.
//!
//! With `transactions` on it behaves as exactly-once delivery does towards
//! the tracker: the first record after a commit holds the acknowledged
//! position at the last PostgreSQL commit, and a commit (every PostgreSQL
//! commit, or on command) releases it.

use std::collections::VecDeque;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::checkpoint::AckTracker;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::outbox::OutboxEvent;
use crate::pg::{Lsn, PgTimestamp};
use crate::sink::{Delivered, DeliveryReport, SinkError};

use super::{Advanced, Delivery, InFlight, Input, StartContext, Unsent};
use crate::error::PipelineError;

pub(in crate::pipeline) struct MemoryDelivery {
    /// The records handed over, in order (their event ids).
    pub(in crate::pipeline) sent: Vec<String>,
    /// Tokens of records not reported yet, oldest first.
    outstanding: VecDeque<InFlight>,
    to_reports: mpsc::UnboundedSender<DeliveryReport<InFlight>>,
    reports: mpsc::UnboundedReceiver<DeliveryReport<InFlight>>,
    /// Refuses the next record before it leaves.
    pub(in crate::pipeline) refuse_next: Option<SinkError>,
    /// What `fatal_error` says.
    pub(in crate::pipeline) fatal: Option<SinkError>,
    /// Behave as exactly-once delivery towards the tracker.
    pub(in crate::pipeline) transactions: bool,
    /// Commit the open transaction at every PostgreSQL commit (else only at
    /// `finish`, or when a test calls `commit`).
    pub(in crate::pipeline) commit_at_every_commit: bool,
    open: bool,
    pub(in crate::pipeline) abandoned: u32,
}

impl MemoryDelivery {
    pub(in crate::pipeline) fn new() -> MemoryDelivery {
        let (to_reports, reports) = mpsc::unbounded_channel();
        MemoryDelivery {
            sent: Vec::new(),
            outstanding: VecDeque::new(),
            to_reports,
            reports,
            refuse_next: None,
            fatal: None,
            transactions: false,
            commit_at_every_commit: true,
            open: false,
            abandoned: 0,
        }
    }

    pub(in crate::pipeline) fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Kafka acknowledges the `n` oldest outstanding records.
    pub(in crate::pipeline) fn ack(&mut self, n: usize) {
        for _ in 0..n {
            let token = self
                .outstanding
                .pop_front()
                .expect("a record to acknowledge");
            self.report(
                token,
                Ok(Delivered {
                    partition: 0,
                    offset: 0,
                }),
            );
        }
    }

    /// Kafka refuses the oldest outstanding record with `error`.
    pub(in crate::pipeline) fn refuse(&mut self, error: SinkError) {
        let token = self.outstanding.pop_front().expect("a record to refuse");
        self.report(token, Err(error));
    }

    /// Kafka reports the newest outstanding record first (reports come from
    /// two polling threads, in any order).
    pub(in crate::pipeline) fn refuse_newest(&mut self, error: SinkError) {
        let token = self.outstanding.pop_back().expect("a record to refuse");
        self.report(token, Err(error));
    }

    fn report(&mut self, token: InFlight, result: Result<Delivered, SinkError>) {
        let report = DeliveryReport {
            token,
            result,
            reported_at: Instant::now(),
        };
        self.to_reports.send(report).expect("the receiver is ours");
    }

    /// Commits the open transaction (exactly-once behaviour).
    pub(in crate::pipeline) fn commit(&mut self, tracker: &mut AckTracker) -> Advanced {
        if !self.open {
            return Advanced(false);
        }
        self.open = false;
        Advanced(tracker.release_hold().is_some())
    }
}

impl Delivery for MemoryDelivery {
    fn create(_: &Config, _: &Metrics, _: &str) -> Result<MemoryDelivery, PipelineError> {
        Ok(MemoryDelivery::new())
    }

    async fn ready(&mut self, _start: StartContext<'_>) -> Result<(), PipelineError> {
        Ok(())
    }

    async fn send(
        &mut self,
        event: &OutboxEvent,
        in_flight: InFlight,
        tracker: &mut AckTracker,
    ) -> Result<(), Unsent> {
        if let Some(error) = self.refuse_next.take() {
            return Err(Unsent::Refused(error, in_flight));
        }
        if self.transactions && !self.open {
            self.open = true;
            tracker.hold_at_last_commit();
        }
        self.sent.push(event.event_id.clone());
        self.outstanding.push_back(in_flight);
        Ok(())
    }

    fn delivered(&mut self, _now: Instant) {}

    async fn committed(
        &mut self,
        _end: Lsn,
        _commit_time: PgTimestamp,
        _input: Input,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        match self.commit_at_every_commit {
            true => Ok(self.commit(tracker)),
            false => Ok(Advanced(false)),
        }
    }

    async fn tick(
        &mut self,
        _inside_transaction: bool,
        _input: Input,
        _tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        Ok(Advanced(false))
    }

    async fn finish(
        &mut self,
        at_boundary: bool,
        tracker: &mut AckTracker,
    ) -> Result<Advanced, PipelineError> {
        if at_boundary {
            return Ok(self.commit(tracker));
        }
        self.abandon();
        Ok(Advanced(false))
    }

    fn abandon(&mut self) {
        if self.open {
            self.open = false;
            self.abandoned += 1;
        }
    }

    fn reports(&mut self) -> &mut mpsc::UnboundedReceiver<DeliveryReport<InFlight>> {
        &mut self.reports
    }

    fn fatal_error(&self) -> Option<SinkError> {
        self.fatal.clone()
    }
}
