//! Which LSN may be acknowledged, given Kafka's delivery reports.
//!
//! Transactions are kept in commit order in a `VecDeque`; transaction number
//! `seq` lives at index `seq - front_seq`, so a delivery report finds its
//! transaction in O(1) without hashing. A transaction leaves the front of the
//! queue once it is committed and every one of its events is delivered; the
//! acked LSN is then its `end_lsn`. Each transaction is popped once, so
//! `delivered` is O(1) amortized.
//!
//! The acked LSN is also held at or below a ceiling, when one is set
//! ([`AckTracker::prove_through`]): the WAL position at which the connector
//! last proved that the publication carries the outbox. pgoutput drops rows
//! silently once a publication is narrowed, so a position is acknowledged
//! only after a proof that began at or after it.
//!
//! Exactly-once delivery adds a second bound ([`AckTracker::hold_at_last_commit`]):
//! while a Kafka transaction is open, its records may be delivered and still
//! be aborted, so the acked LSN stays at the end of the last PostgreSQL
//! transaction before the Kafka transaction's first event, until the Kafka
//! transaction commits ([`AckTracker::release_hold`]).
//!
//! Invariant: the front entry, if any, is never finished unless it is a
//! committed transaction held above the ceiling or the hold. Hence "queue empty" is
//! exactly "nothing open, nothing in flight, nothing held".

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::pg::{Lsn, PgTimestamp};

/// One event registered with [`AckTracker::add_event`], carried through the
/// Kafka sink and handed back to [`AckTracker::delivered`] when Kafka
/// acknowledges the record. Hand each token back at most once.
///
/// A token names the tracker that issued it, so a late delivery report from
/// before a tracker was rebuilt (e.g. after a reconnect) can never be credited
/// to a transaction of the new tracker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventToken {
    tracker: u64,
    seq: u64,
    bytes: usize,
}

impl EventToken {
    /// Size counted against the in-flight byte budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

// Tokens ride along with every Kafka record (as delivery opaque), and the
// tracker moves into the pipeline's task.
const _: () = {
    const fn sendable<T: Send + 'static>() {}
    sendable::<AckTracker>();
    sendable::<EventToken>();
    assert!(std::mem::size_of::<EventToken>() <= 24);
};

/// Misuse of the tracker's begin/add/commit sequence. The replication stream
/// delivered something out of protocol order; none of these is retryable on
/// the same stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrackerError {
    #[error(
        "begin: a transaction is already open (last commit end_lsn {last_commit}); \
         the stream sent Begin without Commit"
    )]
    AlreadyOpen { last_commit: Lsn },
    #[error(
        "{op}: no transaction is open (last commit end_lsn {last_commit}); \
         the stream sent a change or Commit outside Begin/Commit"
    )]
    NotOpen { op: &'static str, last_commit: Lsn },
    #[error(
        "commit end_lsn {end_lsn} is not after the previous position {previous} \
         (last commit end_lsn or acked LSN); commits must arrive in increasing end_lsn order"
    )]
    CommitNotAfterPrevious { end_lsn: Lsn, previous: Lsn },
}

#[derive(Debug)]
enum TxState {
    Open,
    Committed(Lsn),
    /// Dropped by [`AckTracker::abandon_open`]: finished, with no LSN to ack.
    Abandoned,
}

#[derive(Debug)]
struct Tx {
    state: TxState,
    /// Registered events not yet delivered, and their bytes.
    remaining: usize,
    remaining_bytes: usize,
    commit_time: PgTimestamp,
}

impl Tx {
    fn is_finished(&self) -> bool {
        match self.state {
            TxState::Open => false,
            TxState::Committed(_) => self.remaining == 0,
            TxState::Abandoned => true,
        }
    }
}

/// Computes the acked LSN: the `end_lsn` of the longest prefix of
/// transactions (in commit order) whose events Kafka has all acknowledged.
///
/// The acked LSN never goes backwards. It is not yet durable: persist it with
/// [`OffsetStore::persist`](super::OffsetStore::persist) before reporting it.
#[derive(Debug)]
pub struct AckTracker {
    id: u64,
    acked: Lsn,
    /// Commit time of the last transaction the acked LSN covers (None until
    /// one is acked in this tracker's life): what gap repair starts from.
    acked_commit_time: Option<PgTimestamp>,
    /// Highest of: the starting acked LSN, the last commit's end_lsn and any
    /// idle advance. The next commit must be beyond it.
    floor: Lsn,
    queue: VecDeque<Tx>,
    /// Sequence number of `queue[0]` (or of the next transaction when empty).
    front_seq: u64,
    open: bool,
    abandoned_in_queue: usize,
    in_flight_events: usize,
    in_flight_bytes: usize,
    stale_tokens: u64,
    /// The acked LSN never passes it; `None`: no ceiling.
    ceiling: Option<Lsn>,
    /// The acked LSN never passes it either: the position before an open
    /// Kafka transaction (exactly-once delivery); `None`: none open.
    hold: Option<Lsn>,
}

impl AckTracker {
    /// A tracker resuming at `acked` (the durable resume point).
    pub fn new(acked: Lsn) -> AckTracker {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        AckTracker {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            acked,
            acked_commit_time: None,
            floor: acked,
            queue: VecDeque::new(),
            front_seq: 0,
            open: false,
            abandoned_in_queue: 0,
            in_flight_events: 0,
            in_flight_bytes: 0,
            stale_tokens: 0,
            ceiling: None,
            hold: None,
        }
    }

    /// The publication was proven to carry the outbox at WAL position
    /// `through`: from now on the acked LSN may reach it, but not pass it
    /// (until a later proof). The ceiling only rises. Returns the new acked
    /// LSN if transactions held below it are now acked.
    pub fn prove_through(&mut self, through: Lsn) -> Option<Lsn> {
        if self.ceiling.is_some_and(|c| c >= through) {
            return None;
        }
        self.ceiling = Some(through);
        self.pop_finished()
    }

    /// Removes the ceiling for good (the server is shutting down: nothing can
    /// commit any more). Returns the new acked LSN if held transactions are
    /// now acked.
    pub fn lift_ceiling(&mut self) -> Option<Lsn> {
        self.ceiling = None;
        self.pop_finished()
    }

    /// A Kafka transaction opens with the open PostgreSQL transaction's
    /// first event: nothing after the last commit before it is acked until
    /// [`release_hold`](Self::release_hold). Returns the position held at.
    pub fn hold_at_last_commit(&mut self) -> Lsn {
        *self.hold.get_or_insert(self.floor)
    }

    /// The Kafka transaction committed: what it carried may be acked.
    /// Returns the new acked LSN if held transactions are now acked.
    pub fn release_hold(&mut self) -> Option<Lsn> {
        self.hold = None;
        self.pop_finished()
    }

    /// Whether a position is at or below the ceiling and the hold.
    fn proven(&self, lsn: Lsn) -> bool {
        self.ceiling.is_none_or(|c| lsn <= c) && self.hold.is_none_or(|h| lsn <= h)
    }

    fn next_seq(&self) -> u64 {
        self.front_seq + self.queue.len() as u64
    }

    /// Opens a transaction whose Begin carried `commit_time`.
    pub fn begin(&mut self, commit_time: PgTimestamp) -> Result<(), TrackerError> {
        if self.open {
            return Err(TrackerError::AlreadyOpen {
                last_commit: self.floor,
            });
        }
        self.queue.push_back(Tx {
            state: TxState::Open,
            remaining: 0,
            remaining_bytes: 0,
            commit_time,
        });
        self.open = true;
        Ok(())
    }

    /// Registers one event of the open transaction, `bytes` long.
    pub fn add_event(&mut self, bytes: usize) -> Result<EventToken, TrackerError> {
        if !self.open {
            return Err(TrackerError::NotOpen {
                op: "add_event",
                last_commit: self.floor,
            });
        }
        let seq = self.next_seq() - 1;
        if let Some(tx) = self.queue.back_mut() {
            tx.remaining += 1;
            tx.remaining_bytes += bytes;
        }
        self.in_flight_events += 1;
        self.in_flight_bytes += bytes;
        Ok(EventToken {
            tracker: self.id,
            seq,
            bytes,
        })
    }

    /// Closes the open transaction at `end_lsn`. Returns the new acked LSN if
    /// it advanced (the transaction was at the head and had nothing left in
    /// flight).
    ///
    /// `end_lsn` must be beyond [`Self::last_commit_lsn`]; on error the
    /// transaction stays open. Transactions replayed at or below the resume
    /// point are to be skipped before `begin` (their Begin's `final_lsn` is
    /// already below it), or dropped with [`Self::abandon_open`].
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<Option<Lsn>, TrackerError> {
        if !self.open {
            return Err(TrackerError::NotOpen {
                op: "commit",
                last_commit: self.floor,
            });
        }
        if end_lsn <= self.floor {
            return Err(TrackerError::CommitNotAfterPrevious {
                end_lsn,
                previous: self.floor,
            });
        }
        if let Some(tx) = self.queue.back_mut() {
            tx.state = TxState::Committed(end_lsn);
        }
        self.open = false;
        self.floor = end_lsn;
        Ok(self.pop_finished())
    }

    /// Drops the open transaction, if any, with its events (the stream broke
    /// before its Commit; it will be replayed). Its events leave the in-flight
    /// counts now; when Kafka later reports them delivered, those reports are
    /// ignored and counted as stale, never a panic, and never credited to
    /// another transaction (sequence numbers are not reused).
    pub fn abandon_open(&mut self) {
        if !self.open {
            return;
        }
        self.open = false;
        if let Some(tx) = self.queue.back_mut() {
            self.in_flight_events -= tx.remaining;
            self.in_flight_bytes -= tx.remaining_bytes;
            tx.state = TxState::Abandoned;
            tx.remaining = 0;
            tx.remaining_bytes = 0;
            self.abandoned_in_queue += 1;
        }
        self.pop_finished();
    }

    /// Kafka acknowledged one event. Returns the new acked LSN if it advanced.
    /// Tokens that belong to no live event (issued by another tracker, or of a
    /// transaction already finished or abandoned) are ignored and counted. A
    /// token handed back twice is caught only once its transaction has no
    /// undelivered events left.
    pub fn delivered(&mut self, token: EventToken) -> Option<Lsn> {
        let idx = token
            .seq
            .checked_sub(self.front_seq)
            .filter(|_| token.tracker == self.id);
        let Some(idx) = idx else {
            self.stale_tokens += 1;
            return None;
        };
        let live = usize::try_from(idx)
            .ok()
            .and_then(|i| self.queue.get_mut(i))
            .filter(|tx| !matches!(tx.state, TxState::Abandoned) && tx.remaining > 0);
        let Some(tx) = live else {
            self.stale_tokens += 1;
            return None;
        };
        // A token's bytes are what add_event counted, unless the caller
        // forged it; saturate so a forged one cannot underflow the budget.
        let bytes = token.bytes.min(tx.remaining_bytes);
        tx.remaining -= 1;
        tx.remaining_bytes -= bytes;
        self.in_flight_events -= 1;
        self.in_flight_bytes -= bytes;
        if idx == 0 { self.pop_finished() } else { None }
    }

    /// A keepalive reported `wal_end`. When nothing is open or in flight, every
    /// transaction the server sent before this point is acked, so `wal_end`
    /// itself may become the acked LSN (if greater). Returns it if it advanced.
    pub fn idle_advance(&mut self, wal_end: Lsn) -> Option<Lsn> {
        let target = [self.ceiling, self.hold]
            .into_iter()
            .flatten()
            .fold(wal_end, Lsn::min);
        if !self.is_idle() || target <= self.acked {
            return None;
        }
        self.acked = target;
        self.floor = self.floor.max(target);
        Some(target)
    }

    /// Pops finished transactions off the front; returns the new acked LSN if
    /// one of them was a committed transaction beyond the current acked LSN.
    fn pop_finished(&mut self) -> Option<Lsn> {
        let mut advanced = None;
        while self.queue.front().is_some_and(|tx| {
            tx.is_finished() && !matches!(tx.state, TxState::Committed(end) if !self.proven(end))
        }) {
            let Some(tx) = self.queue.pop_front() else {
                break;
            };
            self.front_seq += 1;
            match tx.state {
                TxState::Committed(end_lsn) if end_lsn > self.acked => {
                    self.acked = end_lsn;
                    self.acked_commit_time = Some(tx.commit_time);
                    advanced = Some(end_lsn);
                }
                TxState::Abandoned => self.abandoned_in_queue -= 1,
                _ => {}
            }
        }
        advanced
    }

    /// The highest LSN whose preceding transactions are all delivered.
    pub fn acked(&self) -> Lsn {
        self.acked
    }

    /// Commit time of the last transaction [`Self::acked`] covers, once one
    /// was acknowledged by this tracker.
    pub fn acked_commit_time(&self) -> Option<PgTimestamp> {
        self.acked_commit_time
    }

    /// The end_lsn of the last committed transaction (or the acked LSN, if
    /// later). Transactions replayed after a reconnect at or below it are
    /// already tracked and must be skipped.
    pub fn last_commit_lsn(&self) -> Lsn {
        self.floor
    }

    /// Registered events not yet delivered (abandoned ones excluded).
    pub fn in_flight_events(&self) -> usize {
        self.in_flight_events
    }

    /// Bytes of the events counted by [`Self::in_flight_events`].
    pub fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    /// Commit time of the oldest transaction that is open or not fully acked.
    pub fn oldest_unacked_commit_time(&self) -> Option<PgTimestamp> {
        self.queue
            .iter()
            .find(|tx| !matches!(tx.state, TxState::Abandoned))
            .map(|tx| tx.commit_time)
    }

    /// Nothing open, nothing in flight and nothing held above the ceiling.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Transactions open or committed but not yet acked.
    pub fn pending_transactions(&self) -> usize {
        self.queue.len() - self.abandoned_in_queue
    }

    /// Delivery reports ignored because their token matched no live event.
    pub fn stale_tokens(&self) -> u64 {
        self.stale_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lsn(n: u64) -> Lsn {
        Lsn::new(n)
    }

    fn ts(n: i64) -> PgTimestamp {
        PgTimestamp(n)
    }

    /// One committed transaction with `events` events; returns their tokens.
    fn tx(t: &mut AckTracker, events: usize, end: u64) -> (Vec<EventToken>, Option<Lsn>) {
        t.begin(ts(end as i64)).unwrap();
        let tokens = (0..events).map(|i| t.add_event(10 + i).unwrap()).collect();
        let advanced = t.commit(lsn(end)).unwrap();
        (tokens, advanced)
    }

    /// A committed transaction of one event; returns its token.
    fn one_event(t: &mut AckTracker, end: u64) -> EventToken {
        let (tokens, _) = tx(t, 1, end);
        tokens[0]
    }

    #[test]
    fn out_of_order_deliveries_across_transactions() {
        let mut t = AckTracker::new(lsn(100));
        let (a, _) = tx(&mut t, 2, 200);
        let b = one_event(&mut t, 300);
        let (c, _) = tx(&mut t, 2, 400);
        assert_eq!(t.in_flight_events(), 5);
        assert_eq!(t.in_flight_bytes(), 10 + 11 + 10 + 10 + 11);

        // Later transactions finishing first do not move the acked LSN.
        assert_eq!(t.delivered(c[1]), None);
        assert_eq!(t.delivered(b), None);
        assert_eq!(t.delivered(c[0]), None);
        assert_eq!(t.delivered(a[1]), None);
        assert_eq!(t.acked(), lsn(100));
        // The head's last event releases the whole finished prefix.
        assert_eq!(t.delivered(a[0]), Some(lsn(400)));
        assert_eq!(t.acked(), lsn(400));
        assert!(t.is_idle());
        assert_eq!((t.in_flight_events(), t.in_flight_bytes()), (0, 0));
        assert_eq!(t.stale_tokens(), 0);
    }

    /// Exactly-once: records Kafka acknowledged inside an open Kafka
    /// transaction are not acked until it commits; an idle keepalive cannot
    /// pass the hold either.
    #[test]
    fn nothing_is_acked_past_an_open_kafka_transaction() {
        let mut t = AckTracker::new(lsn(0));
        let a = one_event(&mut t, 10);
        assert_eq!(t.delivered(a), Some(lsn(10)), "before any hold");
        t.begin(ts(2)).unwrap();
        assert_eq!(t.hold_at_last_commit(), lsn(10), "held at the last commit");
        let b = t.add_event(5).unwrap();
        t.commit(lsn(20)).unwrap();
        let c = one_event(&mut t, 30);
        assert_eq!(
            t.hold_at_last_commit(),
            lsn(10),
            "a second begin keeps the hold"
        );
        assert_eq!(
            t.delivered(b),
            None,
            "delivered inside the open transaction"
        );
        assert_eq!(t.delivered(c), None);
        assert_eq!(t.acked(), lsn(10));
        assert_eq!(t.idle_advance(lsn(99)), None, "not idle while held");
        assert_eq!(
            t.release_hold(),
            Some(lsn(30)),
            "the Kafka commit releases both"
        );
        assert!(t.is_idle());
        assert_eq!(t.idle_advance(lsn(99)), Some(lsn(99)));
    }

    #[test]
    fn nothing_is_acked_past_the_last_proof() {
        let mut t = AckTracker::new(lsn(0));
        assert_eq!(t.prove_through(lsn(15)), None);
        let a = one_event(&mut t, 10);
        let b = one_event(&mut t, 20);
        t.begin(ts(3)).unwrap();
        t.commit(lsn(30)).unwrap();
        assert_eq!(t.delivered(b), None);
        assert_eq!(t.delivered(a), Some(lsn(10)), "up to the ceiling");
        assert_eq!(t.acked_commit_time(), Some(ts(10)));
        assert!(
            !t.is_idle(),
            "delivered transactions above the ceiling are held"
        );
        assert_eq!(t.idle_advance(lsn(40)), None, "no idle advance while held");
        assert_eq!(t.prove_through(lsn(12)), None, "the ceiling never falls");
        assert_eq!(t.prove_through(lsn(25)), Some(lsn(20)));
        assert_eq!(t.acked_commit_time(), Some(ts(20)));
        assert_eq!(t.prove_through(lsn(35)), Some(lsn(30)));
        assert!(t.is_idle());
        assert_eq!(
            t.idle_advance(lsn(50)),
            Some(lsn(35)),
            "idle advance stops at it too"
        );
        assert_eq!(t.prove_through(lsn(60)), None);
        assert_eq!(t.idle_advance(lsn(50)), Some(lsn(50)));
        let d = one_event(&mut t, 70);
        assert_eq!(t.delivered(d), None, "held above the ceiling");
        assert_eq!(t.lift_ceiling(), Some(lsn(70)));
        assert_eq!(t.idle_advance(lsn(90)), Some(lsn(90)));
    }

    #[test]
    fn prefix_stops_at_the_first_unfinished_transaction() {
        let mut t = AckTracker::new(lsn(0));
        let a = one_event(&mut t, 10);
        let b = one_event(&mut t, 20);
        let c = one_event(&mut t, 30);
        assert_eq!(t.delivered(c), None);
        assert_eq!(t.delivered(a), Some(lsn(10)));
        assert_eq!(t.pending_transactions(), 2);
        assert_eq!(t.delivered(b), Some(lsn(30)));
        assert_eq!(t.pending_transactions(), 0);
    }

    #[test]
    fn empty_transaction_between_two_pending_ones() {
        let mut t = AckTracker::new(lsn(0));
        let a = one_event(&mut t, 10);
        let (_, none) = tx(&mut t, 0, 20);
        assert_eq!(
            none, None,
            "an empty transaction behind a pending one waits"
        );
        let c = one_event(&mut t, 30);
        assert_eq!(t.pending_transactions(), 3);
        assert_eq!(t.delivered(a), Some(lsn(20)));
        assert_eq!(t.delivered(c), Some(lsn(30)));
    }

    #[test]
    fn empty_transaction_at_the_head_is_acked_on_commit() {
        let mut t = AckTracker::new(lsn(5));
        let (_, advanced) = tx(&mut t, 0, 10);
        assert_eq!(advanced, Some(lsn(10)));
        assert!(t.is_idle());
    }

    #[test]
    fn events_delivered_before_commit_ack_at_commit() {
        let mut t = AckTracker::new(lsn(0));
        t.begin(ts(1)).unwrap();
        let e = t.add_event(7).unwrap();
        assert_eq!(t.delivered(e), None, "an open transaction is never acked");
        assert_eq!(t.commit(lsn(50)).unwrap(), Some(lsn(50)));
    }

    #[test]
    fn idle_advance_refused_while_anything_is_pending_or_open() {
        let mut t = AckTracker::new(lsn(100));
        assert!(t.is_idle());
        assert_eq!(t.idle_advance(lsn(150)), Some(lsn(150)));

        t.begin(ts(1)).unwrap();
        assert!(!t.is_idle());
        assert_eq!(
            t.idle_advance(lsn(160)),
            None,
            "open transaction, no events"
        );
        let e = t.add_event(3).unwrap();
        assert_eq!(
            t.idle_advance(lsn(170)),
            None,
            "open transaction with events"
        );
        assert_eq!(t.commit(lsn(200)).unwrap(), None);
        assert_eq!(t.idle_advance(lsn(300)), None, "committed, in flight");
        assert_eq!(t.acked(), lsn(150));
        assert_eq!(t.delivered(e), Some(lsn(200)));
        assert_eq!(t.idle_advance(lsn(300)), Some(lsn(300)));
    }

    #[test]
    fn idle_advance_never_goes_backwards_and_bounds_later_commits() {
        let mut t = AckTracker::new(lsn(100));
        assert_eq!(t.idle_advance(lsn(100)), None);
        assert_eq!(t.idle_advance(lsn(90)), None);
        assert_eq!(t.acked(), lsn(100));
        assert_eq!(t.idle_advance(lsn(500)), Some(lsn(500)));
        t.begin(ts(1)).unwrap();
        assert_eq!(
            t.commit(lsn(400)),
            Err(TrackerError::CommitNotAfterPrevious {
                end_lsn: lsn(400),
                previous: lsn(500)
            })
        );
    }

    #[test]
    fn commit_must_be_after_previous_commit_and_names_both_lsns() {
        let mut t = AckTracker::new(lsn(0));
        tx(&mut t, 1, 0x1_0000_0020);
        t.begin(ts(2)).unwrap();
        let err = t.commit(lsn(0x1_0000_0020)).unwrap_err();
        assert_eq!(
            err,
            TrackerError::CommitNotAfterPrevious {
                end_lsn: lsn(0x1_0000_0020),
                previous: lsn(0x1_0000_0020)
            }
        );
        let text = err.to_string();
        assert!(text.contains("1/20"), "{text}");
        // The transaction stays open; a correct commit still works.
        assert!(t.commit(lsn(0x1_0000_0030)).is_ok());
    }

    #[test]
    fn commit_at_or_below_resume_point_is_rejected() {
        let mut t = AckTracker::new(lsn(100));
        t.begin(ts(1)).unwrap();
        assert!(matches!(
            t.commit(lsn(100)),
            Err(TrackerError::CommitNotAfterPrevious { .. })
        ));
    }

    #[test]
    fn protocol_order_errors() {
        let mut t = AckTracker::new(lsn(7));
        assert_eq!(
            t.add_event(1),
            Err(TrackerError::NotOpen {
                op: "add_event",
                last_commit: lsn(7)
            })
        );
        assert!(matches!(
            t.commit(lsn(8)),
            Err(TrackerError::NotOpen { op: "commit", .. })
        ));
        t.begin(ts(1)).unwrap();
        assert_eq!(
            t.begin(ts(2)),
            Err(TrackerError::AlreadyOpen {
                last_commit: lsn(7)
            })
        );
    }

    #[test]
    fn acked_never_goes_backwards() {
        let mut t = AckTracker::new(lsn(1000));
        let mut last = t.acked();
        let (a, _) = tx(&mut t, 3, 1100);
        let (b, _) = tx(&mut t, 2, 1200);
        for token in [b[1], a[2], b[0], a[0], a[1]] {
            t.delivered(token);
            assert!(t.acked() >= last);
            last = t.acked();
        }
        assert_eq!(last, lsn(1200));
        assert_eq!(t.idle_advance(lsn(1150)), None);
        assert_eq!(t.acked(), lsn(1200));
    }

    #[test]
    fn stale_and_foreign_tokens_are_ignored_and_counted() {
        let mut t = AckTracker::new(lsn(0));
        let a = one_event(&mut t, 10);
        let b = one_event(&mut t, 20);
        assert_eq!(t.delivered(a), Some(lsn(10)));
        // Already finished and popped.
        assert_eq!(t.delivered(a), None);
        assert_eq!(t.stale_tokens(), 1);

        // A token of another tracker never touches this one's transactions,
        // even when its sequence number collides.
        let mut other = AckTracker::new(lsn(0));
        let o = one_event(&mut other, 10);
        let o2 = one_event(&mut other, 20);
        assert_eq!(t.delivered(o), None);
        assert_eq!(t.delivered(o2), None);
        assert_eq!(t.stale_tokens(), 3);
        assert_eq!(t.in_flight_events(), 1);
        assert_eq!(t.delivered(b), Some(lsn(20)));

        // A token handed back twice once its transaction has nothing left.
        let c = one_event(&mut t, 30);
        let _d = one_event(&mut t, 40);
        t.begin(ts(5)).unwrap();
        let e = t.add_event(1).unwrap();
        assert_eq!(t.delivered(e), None);
        assert_eq!(t.delivered(e), None);
        assert_eq!(t.stale_tokens(), 4);
        assert_eq!(t.delivered(c), Some(lsn(30)));
    }

    #[test]
    fn abandoned_transaction_is_dropped_and_its_late_deliveries_ignored() {
        let mut t = AckTracker::new(lsn(0));
        let a = one_event(&mut t, 10);
        t.begin(ts(2)).unwrap();
        let x = t.add_event(100).unwrap();
        let y = t.add_event(200).unwrap();
        assert_eq!(t.in_flight_bytes(), 10 + 300);
        t.abandon_open();
        assert_eq!((t.in_flight_events(), t.in_flight_bytes()), (1, 10));
        assert_eq!(t.pending_transactions(), 1);
        assert_eq!(t.oldest_unacked_commit_time(), Some(ts(10)));

        // The replayed transaction gets a fresh sequence number.
        t.begin(ts(2)).unwrap();
        let x2 = t.add_event(100).unwrap();
        assert_eq!(t.commit(lsn(20)).unwrap(), None);

        assert_eq!(t.delivered(x), None);
        assert_eq!(t.delivered(y), None);
        assert_eq!(t.stale_tokens(), 2);
        assert_eq!(t.in_flight_events(), 2);
        assert_eq!(t.delivered(a), Some(lsn(10)));
        assert_eq!(t.delivered(x2), Some(lsn(20)));
        assert!(t.is_idle());
        assert_eq!(t.pending_transactions(), 0);

        // Abandoning at the head leaves the tracker idle; nothing open is a no-op.
        t.begin(ts(3)).unwrap();
        let z = t.add_event(1).unwrap();
        t.abandon_open();
        t.abandon_open();
        assert!(t.is_idle());
        assert_eq!(t.delivered(z), None);
        assert_eq!(t.idle_advance(lsn(30)), Some(lsn(30)));
    }

    #[test]
    fn oldest_unacked_commit_time_follows_the_head() {
        let mut t = AckTracker::new(lsn(0));
        assert_eq!(t.oldest_unacked_commit_time(), None);
        let a = one_event(&mut t, 10);
        let b = one_event(&mut t, 20);
        assert_eq!(t.oldest_unacked_commit_time(), Some(ts(10)));
        t.delivered(a);
        assert_eq!(t.oldest_unacked_commit_time(), Some(ts(20)));
        t.delivered(b);
        assert_eq!(t.oldest_unacked_commit_time(), None);
    }

    /// Reference model: transactions in commit order, acked computed by a
    /// plain scan of the prefix.
    #[derive(Default)]
    struct ModelTx {
        end: Option<u64>,
        total: usize,
        delivered: usize,
        abandoned: bool,
    }

    #[derive(Clone, Debug)]
    enum Op {
        Begin,
        AddEvent(usize),
        Commit(u64),
        Deliver(usize),
        Abandon,
        Idle(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Begin),
            6 => (0usize..1000).prop_map(Op::AddEvent),
            3 => (1u64..50).prop_map(Op::Commit),
            8 => any::<usize>().prop_map(Op::Deliver),
            1 => Just(Op::Abandon),
            1 => (0u64..50).prop_map(Op::Idle),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn acked_is_end_of_longest_fully_delivered_prefix(
            start in 0u64..1000,
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut t = AckTracker::new(lsn(start));
            // acked before txs[settled..]; earlier ones were settled by an idle advance
            let mut base = start;
            let mut settled = 0;
            let mut last_end = start;
            let mut txs: Vec<ModelTx> = Vec::new();
            let mut open = false;
            // (token, index into txs)
            let mut outstanding: Vec<(EventToken, usize)> = Vec::new();
            let mut prev_acked = t.acked();

            for op in ops {
                match op {
                    Op::Begin => {
                        let r = t.begin(ts(0));
                        prop_assert_eq!(r.is_ok(), !open);
                        if !open {
                            txs.push(ModelTx::default());
                            open = true;
                        }
                    }
                    Op::AddEvent(bytes) => {
                        let r = t.add_event(bytes);
                        prop_assert_eq!(r.is_ok(), open);
                        if let Ok(token) = r {
                            let i = txs.len() - 1;
                            txs[i].total += 1;
                            outstanding.push((token, i));
                        }
                    }
                    Op::Commit(step) => {
                        let end = last_end + step;
                        let r = t.commit(lsn(end));
                        prop_assert_eq!(r.is_ok(), open);
                        if open {
                            let i = txs.len() - 1;
                            txs[i].end = Some(end);
                            last_end = end;
                            open = false;
                        }
                    }
                    Op::Deliver(pick) => {
                        if !outstanding.is_empty() {
                            let (token, i) = outstanding.swap_remove(pick % outstanding.len());
                            t.delivered(token);
                            txs[i].delivered += 1;
                        }
                    }
                    Op::Abandon => {
                        t.abandon_open();
                        if open {
                            let i = txs.len() - 1;
                            txs[i].abandoned = true;
                            open = false;
                        }
                    }
                    Op::Idle(step) => {
                        let live = |tx: &ModelTx| !tx.abandoned;
                        let model_idle = !open && txs[settled..].iter().filter(|tx| live(tx)).all(|tx| {
                            tx.end.is_some() && tx.delivered == tx.total
                        });
                        prop_assert_eq!(t.is_idle(), model_idle);
                        let wal_end = last_end.max(base) + step;
                        let r = t.idle_advance(lsn(wal_end));
                        if model_idle {
                            let acked_now = model_acked(base, &txs[settled..]);
                            prop_assert_eq!(r.is_some(), wal_end > acked_now);
                            base = acked_now.max(wal_end);
                            last_end = last_end.max(base);
                            settled = txs.len();
                        } else {
                            prop_assert_eq!(r, None);
                        }
                    }
                }
                let expected = model_acked(base, &txs[settled..]);
                prop_assert_eq!(t.acked(), lsn(expected));
                prop_assert!(t.acked() >= prev_acked);
                prev_acked = t.acked();
                let live_outstanding = outstanding.iter().filter(|(_, i)| !txs[*i].abandoned);
                prop_assert_eq!(t.in_flight_events(), live_outstanding.clone().count());
                prop_assert_eq!(
                    t.in_flight_bytes(),
                    live_outstanding.map(|(tok, _)| tok.bytes()).sum::<usize>()
                );
            }
        }
    }

    fn model_acked(base: u64, txs: &[ModelTx]) -> u64 {
        let mut acked = base;
        for tx in txs.iter().filter(|tx| !tx.abandoned) {
            match tx.end {
                Some(end) if tx.delivered == tx.total => acked = end,
                _ => break,
            }
        }
        acked
    }
}
