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
//! latency stays bounded at low traffic. While the connector is behind (more
//! of the stream received than read, of a commit the server sent at least
//! `max_batch_ms` late: a backlog, a burst; see [`Input::at_commit`]) the age that closes
//! a batch is ten times `max_batch_ms`: each commit stops the reading for a
//! round trip to the coordinator and its markers, so a backlog read in
//! batches of 10 ms would spend about half its time committing, and its
//! events are late already. After a commit, the next transaction begins only
//! after a short gap (see [`GAP_AFTER_COMMIT`]). A single PostgreSQL transaction that
//! keeps one Kafka transaction open for most of `transaction_timeout_ms`
//! cannot be carried whole: the session stops with the limits to raise,
//! unless Kafka itself stalled meanwhile (records outstanding and none
//! acknowledged for a while): then the transaction is aborted and the
//! session retries from the durable LSN, as for any broker outage.

use std::time::{Duration, Instant};

use crate::config::DeliverySettings;

use super::Input;

/// While the connector is behind, a batch is closed by age only once it is
/// this many times `max_batch_ms` old.
const BEHIND_AGE_FACTOR: u32 = 10;

/// After a commit, the next Kafka transaction begins no sooner than this.
/// The coordinator answers the commit (EndTxn) before it has written the
/// transaction's markers, and until it has, it refuses the next
/// transaction's partitions (AddPartitionsToTxn) with
/// CONCURRENT_TRANSACTIONS; librdkafka retries only after a fixed 20 ms,
/// which every record of the new transaction waits for. On one local broker,
/// a first record sent at once was refused in most transactions and one
/// sent 5 ms later in about 2 % (docs/performance.md). Waiting only when
/// caught up was tried: the stream often has bytes unread at a commit even
/// at half load, and the refusals came back.
const GAP_AFTER_COMMIT: Duration = Duration::from_millis(5);

/// The open Kafka transaction.
#[derive(Debug, Clone, Copy)]
struct Open {
    since: Instant,
    events: usize,
    bytes: usize,
    /// PostgreSQL transactions committed while it was open.
    transactions: usize,
    /// Records of it that Kafka acknowledged, and when it last did.
    delivered: usize,
    last_delivery: Option<Instant>,
}

/// Why the open Kafka transaction cannot be carried on (see [`BatchPolicy::overrun`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Overrun {
    /// Kafka kept acknowledging, and still one PostgreSQL transaction did
    /// not fit in the timeout: an operator must raise the limits.
    TooLarge { events: usize, open_for: Duration },
    /// Records are outstanding and Kafka acknowledged none of them for
    /// `stalled_for`: a broker outage, which passes by itself.
    KafkaStalled {
        events: usize,
        undelivered: usize,
        stalled_for: Duration,
    },
}

#[derive(Debug)]
pub(super) struct BatchPolicy {
    max_events: usize,
    max_bytes: usize,
    max_transactions: usize,
    max_age: Duration,
    /// `max_age` while the connector is behind.
    max_age_behind: Duration,
    /// The share of `transaction.timeout.ms` one PostgreSQL transaction may
    /// keep a Kafka transaction open: the rest is for the commit itself.
    limit: Duration,
    open: Option<Open>,
    /// Reports still due for records of transactions already closed: they
    /// come first (a transaction closes once its records were reported by
    /// the producer, and the session reads the reports in order), and are
    /// not the open transaction's.
    owed: usize,
    /// The next Kafka transaction begins no sooner (see [`GAP_AFTER_COMMIT`]).
    next_begin: Option<Instant>,
}

impl BatchPolicy {
    /// `max_transactions`: `limits.max_in_flight_events`.
    pub(super) fn new(settings: &DeliverySettings, max_transactions: usize) -> BatchPolicy {
        let max_age = settings.max_batch_age();
        let limit = settings.transaction_timeout() * 3 / 4;
        BatchPolicy {
            max_events: settings.max_batch_events,
            max_bytes: settings.max_batch_bytes,
            max_transactions,
            max_age,
            max_age_behind: (max_age * BEHIND_AGE_FACTOR).min(limit / 2).max(max_age),
            limit,
            open: None,
            owed: 0,
            next_begin: None,
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
            delivered: 0,
            last_delivery: None,
        });
    }

    /// Kafka acknowledged one record of the open transaction at `now`.
    pub(super) fn delivered(&mut self, now: Instant) {
        if self.owed > 0 {
            self.owed -= 1;
            return;
        }
        if let Some(open) = self.open.as_mut() {
            open.delivered += 1;
            open.last_delivery = Some(now);
        }
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
    pub(super) fn due_at_commit(&mut self, now: Instant, input: Input) -> bool {
        let age = self.age_limit(input);
        let Some(o) = self.open.as_mut() else {
            return false;
        };
        o.transactions += 1;
        o.events >= self.max_events
            || o.bytes >= self.max_bytes
            || o.transactions >= self.max_transactions
            || now.duration_since(o.since) >= age
    }

    /// Between PostgreSQL transactions, on the tick: whether to commit now.
    pub(super) fn due_between(&self, now: Instant, input: Input) -> bool {
        let age = self.age_limit(input);
        self.open
            .is_some_and(|o| now.duration_since(o.since) >= age)
    }

    fn age_limit(&self, input: Input) -> Duration {
        match input {
            Input::CaughtUp => self.max_age,
            Input::Behind => self.max_age_behind,
        }
    }

    /// Inside a PostgreSQL transaction: `Some` when the Kafka transaction
    /// has been open too long to carry it whole, and whose fault that is.
    /// Kafka counts as stalled when records are outstanding and none was
    /// acknowledged for an eighth of the limit (a healthy broker acknowledges
    /// every few milliseconds under load).
    pub(super) fn overrun(&self, now: Instant) -> Option<Overrun> {
        let o = self.open?;
        let open_for = now.duration_since(o.since);
        if open_for < self.limit {
            return None;
        }
        let stalled_for = now.duration_since(o.last_delivery.unwrap_or(o.since));
        let undelivered = o.events.saturating_sub(o.delivered);
        Some(if undelivered > 0 && stalled_for >= self.limit / 8 {
            Overrun::KafkaStalled {
                events: o.events,
                undelivered,
                stalled_for,
            }
        } else {
            Overrun::TooLarge {
                events: o.events,
                open_for,
            }
        })
    }

    /// The transaction's commit began (all its records were reported by
    /// the producer) or ended.
    pub(super) fn closed(&mut self) {
        if let Some(o) = self.open.take() {
            self.owed += o.events.saturating_sub(o.delivered);
        }
    }

    /// The transaction committed at `now`.
    pub(super) fn committed(&mut self, now: Instant) {
        self.closed();
        self.next_begin = Some(now + GAP_AFTER_COMMIT);
    }

    /// When the next Kafka transaction may begin, if not at once.
    pub(super) fn next_begin(&self, now: Instant) -> Option<Instant> {
        self.next_begin.filter(|at| *at > now)
    }

    /// The transaction was aborted: the session ends, and no report is owed.
    pub(super) fn aborted(&mut self) {
        self.open = None;
        self.owed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAUGHT_UP: Input = Input::CaughtUp;

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

    /// [`policy`] with a batch opened at `t0` holding one event.
    fn one_event_batch(t0: Instant) -> BatchPolicy {
        let mut p = policy();
        p.opened(t0);
        p.added(1);
        p
    }

    #[test]
    fn a_batch_is_due_by_events_bytes_or_age_and_only_when_open() {
        let t0 = Instant::now();
        let mut p = policy();
        assert!(
            !p.due_at_commit(t0 + Duration::from_secs(9), CAUGHT_UP),
            "none open"
        );
        assert!(!p.due_between(t0 + Duration::from_secs(9), CAUGHT_UP));
        p.opened(t0);
        p.added(10);
        p.added(10);
        assert!(!p.due_at_commit(t0, CAUGHT_UP), "2 events, 20 bytes, new");
        p.added(10);
        assert!(p.due_at_commit(t0, CAUGHT_UP), "3 events");
        p.closed();
        p.opened(t0);
        p.added(1000);
        assert!(p.due_at_commit(t0, CAUGHT_UP), "1000 bytes");
        p.closed();
        p.opened(t0);
        p.added(1);
        assert!(!p.due_between(t0 + Duration::from_millis(99), CAUGHT_UP));
        assert!(p.due_between(t0 + Duration::from_millis(100), CAUGHT_UP));
        assert!(p.due_at_commit(t0 + Duration::from_millis(100), CAUGHT_UP));
    }

    /// Behind (a backlog), a batch grows to ten times `max_batch_ms` (here
    /// 100 ms) unless its size closes it first; caught up again, the usual
    /// age applies at once.
    #[test]
    fn behind_a_batch_is_closed_by_age_only_at_ten_times_max_batch_ms() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut p = one_event_batch(t0);
        assert!(!p.due_between(at(100), Input::Behind));
        assert!(!p.due_at_commit(at(999), Input::Behind));
        assert!(p.due_between(at(100), CAUGHT_UP));
        assert!(p.due_between(at(1000), Input::Behind));
        assert!(p.due_at_commit(at(1000), Input::Behind));
        let mut p = one_event_batch(t0);
        p.added(1);
        p.added(1);
        assert!(
            p.due_at_commit(t0, Input::Behind),
            "3 events close it behind too"
        );
        // Never more than half the share of the transaction timeout.
        let settings = DeliverySettings {
            max_batch_ms: 1000,
            transaction_timeout_ms: 4000,
            ..DeliverySettings::default()
        };
        let mut p = BatchPolicy::new(&settings, 5);
        p.opened(t0);
        p.added(1);
        assert!(!p.due_between(at(1499), Input::Behind));
        assert!(p.due_between(at(1500), Input::Behind));
    }

    /// A commit delays the next transaction by the gap, and only it.
    #[test]
    fn after_a_commit_the_next_transaction_waits_for_the_gap() {
        let t0 = Instant::now();
        let mut p = one_event_batch(t0);
        assert_eq!(p.next_begin(t0), None, "no commit yet");
        p.committed(t0);
        assert!(!p.is_open());
        assert_eq!(p.next_begin(t0), Some(t0 + GAP_AFTER_COMMIT));
        let after = t0 + GAP_AFTER_COMMIT;
        assert_eq!(p.next_begin(after), None, "the gap passed");
        p.opened(after);
        p.added(1);
        assert_eq!(
            p.next_begin(after),
            None,
            "an open transaction waits for nothing"
        );
    }

    /// Transactions without events (other tables, heartbeats) wait in the
    /// ack tracker until the Kafka commit too: their number closes a batch.
    #[test]
    fn a_batch_is_due_after_as_many_transactions_as_may_wait() {
        let t0 = Instant::now();
        let mut p = one_event_batch(t0);
        for _ in 0..4 {
            assert!(!p.due_at_commit(t0, CAUGHT_UP));
        }
        assert!(
            p.due_at_commit(t0, CAUGHT_UP),
            "the fifth PostgreSQL commit"
        );
    }

    /// The reports of a closed batch that the session reads after the next
    /// one opened are not the new batch's: a stall in it is still seen.
    #[test]
    fn reports_a_closed_batch_still_owes_do_not_count_for_the_next() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = policy();
        p.opened(t0);
        p.added(1);
        p.added(1);
        p.delivered(t0);
        p.closed();
        p.opened(t0);
        p.added(1);
        p.delivered(t0 + ms(10));
        assert_eq!(
            p.overrun(t0 + ms(3000)),
            Some(Overrun::KafkaStalled {
                events: 1,
                undelivered: 1,
                stalled_for: ms(3000)
            })
        );
    }

    #[test]
    fn a_transaction_open_for_three_quarters_of_the_timeout_is_too_long() {
        let t0 = Instant::now();
        let mut p = one_event_batch(t0);
        p.delivered(t0 + Duration::from_millis(2900));
        assert_eq!(p.overrun(t0 + Duration::from_millis(2999)), None);
        assert_eq!(
            p.overrun(t0 + Duration::from_millis(3000)),
            Some(Overrun::TooLarge {
                events: 1,
                open_for: Duration::from_millis(3000)
            })
        );
        p.closed();
        assert_eq!(p.overrun(t0 + Duration::from_secs(60)), None);
    }

    /// Audit F9: a broker outage inside a large PostgreSQL transaction is a
    /// retry, not a stop asking for bigger limits.
    #[test]
    fn a_transaction_kafka_stopped_acknowledging_is_a_stall_not_too_large() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = policy();
        p.opened(t0);
        for _ in 0..3 {
            p.added(1);
        }
        p.delivered(t0 + ms(100));
        // The limit is 3 s, a stall an eighth of it (375 ms) without an
        // acknowledgement while records are outstanding.
        assert_eq!(
            p.overrun(t0 + ms(3000)),
            Some(Overrun::KafkaStalled {
                events: 3,
                undelivered: 2,
                stalled_for: ms(2900)
            })
        );
        // Acknowledgements kept coming: the transaction itself is too large.
        p.delivered(t0 + ms(2800));
        assert!(matches!(
            p.overrun(t0 + ms(3000)),
            Some(Overrun::TooLarge { events: 3, .. })
        ));
        // Nothing outstanding: whatever the last acknowledgement, not Kafka's fault.
        p.delivered(t0 + ms(2900));
        assert!(matches!(
            p.overrun(t0 + ms(9000)),
            Some(Overrun::TooLarge { .. })
        ));
        // Nothing ever acknowledged.
        p.closed();
        p.opened(t0);
        p.added(1);
        assert!(matches!(
            p.overrun(t0 + ms(3000)),
            Some(Overrun::KafkaStalled { undelivered: 1, .. })
        ));
    }
}
