//! When an exactly-once Kafka transaction is committed (`[delivery]`,
//! DESIGN.md §14): a pure policy, the session does the I/O.
//!
//! A Kafka transaction opens with the first event after the last commit and
//! is committed only at a PostgreSQL transaction boundary (never inside one):
//! at the first PostgreSQL commit after it holds `max_batch_events` events,
//! `max_batch_bytes` bytes or `limits.max_in_flight_events` PostgreSQL
//! transactions (each waits in the ack tracker until the Kafka commit, and the
//! stream is not read while too many wait), or, once it is `max_batch_ms` old, at the next
//! boundary (the tick commits it when no PostgreSQL transaction is open), so
//! latency stays bounded at low traffic. A single PostgreSQL transaction that
//! keeps one Kafka transaction open for most of `transaction_timeout_ms`
//! cannot be carried whole: the session stops with the limits to raise.

use std::time::{Duration, Instant};

use crate::config::DeliverySettings;

/// The open Kafka transaction.
#[derive(Debug, Clone, Copy)]
struct Open {
    since: Instant,
    events: usize,
    bytes: usize,
    /// PostgreSQL transactions committed while it was open.
    transactions: usize,
}

#[derive(Debug)]
pub(super) struct BatchPolicy {
    max_events: usize,
    max_bytes: usize,
    max_transactions: usize,
    max_age: Duration,
    /// The share of `transaction.timeout.ms` one PostgreSQL transaction may
    /// keep a Kafka transaction open: the rest is for the commit itself.
    limit: Duration,
    open: Option<Open>,
}

impl BatchPolicy {
    /// `max_transactions`: `limits.max_in_flight_events`.
    pub(super) fn new(settings: &DeliverySettings, max_transactions: usize) -> BatchPolicy {
        BatchPolicy {
            max_events: settings.max_batch_events,
            max_bytes: settings.max_batch_bytes,
            max_transactions,
            max_age: settings.max_batch_age(),
            limit: settings.transaction_timeout() * 3 / 4,
            open: None,
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// A Kafka transaction was begun.
    pub(super) fn opened(&mut self, now: Instant) {
        self.open = Some(Open {
            since: now,
            events: 0,
            bytes: 0,
            transactions: 0,
        });
    }

    /// One record of `bytes` entered the open transaction.
    pub(super) fn added(&mut self, bytes: usize) {
        if let Some(open) = self.open.as_mut() {
            open.events += 1;
            open.bytes += bytes;
        }
    }

    /// At a PostgreSQL commit (a boundary), which it counts: whether to
    /// commit now.
    pub(super) fn due_at_commit(&mut self, now: Instant) -> bool {
        let Some(o) = self.open.as_mut() else {
            return false;
        };
        o.transactions += 1;
        o.events >= self.max_events
            || o.bytes >= self.max_bytes
            || o.transactions >= self.max_transactions
            || now.duration_since(o.since) >= self.max_age
    }

    /// Between PostgreSQL transactions, on the tick: whether to commit now.
    pub(super) fn due_between(&self, now: Instant) -> bool {
        self.open
            .is_some_and(|o| now.duration_since(o.since) >= self.max_age)
    }

    /// Inside a PostgreSQL transaction: `Some((events, open for))` when the
    /// Kafka transaction has been open too long to carry it whole.
    pub(super) fn too_long(&self, now: Instant) -> Option<(usize, Duration)> {
        let o = self.open?;
        let age = now.duration_since(o.since);
        (age >= self.limit).then_some((o.events, age))
    }

    /// The transaction was committed or aborted.
    pub(super) fn closed(&mut self) {
        self.open = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BatchPolicy {
        let settings = DeliverySettings {
            max_batch_events: 3,
            max_batch_bytes: 1000,
            max_batch_ms: 100,
            transaction_timeout_ms: 4000,
            ..DeliverySettings::default()
        };
        BatchPolicy::new(&settings, 5)
    }

    #[test]
    fn a_batch_is_due_by_events_bytes_or_age_and_only_when_open() {
        let t0 = Instant::now();
        let mut p = policy();
        assert!(!p.due_at_commit(t0 + Duration::from_secs(9)), "none open");
        assert!(!p.due_between(t0 + Duration::from_secs(9)));
        p.opened(t0);
        p.added(10);
        p.added(10);
        assert!(!p.due_at_commit(t0), "2 events, 20 bytes, new");
        p.added(10);
        assert!(p.due_at_commit(t0), "3 events");
        p.closed();
        p.opened(t0);
        p.added(1000);
        assert!(p.due_at_commit(t0), "1000 bytes");
        p.closed();
        p.opened(t0);
        p.added(1);
        assert!(!p.due_between(t0 + Duration::from_millis(99)));
        assert!(p.due_between(t0 + Duration::from_millis(100)));
        assert!(p.due_at_commit(t0 + Duration::from_millis(100)));
    }

    /// Transactions without events (other tables, heartbeats) wait in the
    /// ack tracker until the Kafka commit too: their number closes a batch.
    #[test]
    fn a_batch_is_due_after_as_many_transactions_as_may_wait() {
        let t0 = Instant::now();
        let mut p = policy();
        p.opened(t0);
        p.added(1);
        for _ in 0..4 {
            assert!(!p.due_at_commit(t0));
        }
        assert!(p.due_at_commit(t0), "the fifth PostgreSQL commit");
    }

    #[test]
    fn a_transaction_open_for_three_quarters_of_the_timeout_is_too_long() {
        let t0 = Instant::now();
        let mut p = policy();
        p.opened(t0);
        p.added(1);
        assert_eq!(p.too_long(t0 + Duration::from_millis(2999)), None);
        assert_eq!(
            p.too_long(t0 + Duration::from_millis(3000)),
            Some((1, Duration::from_millis(3000)))
        );
        p.closed();
        assert_eq!(p.too_long(t0 + Duration::from_secs(60)), None);
    }
}
