//! Which LSN may be acknowledged, given Kafka's delivery reports.
//!
//! Transactions are kept in commit order in a `VecDeque`; transaction number
//! `seq` lives at index `seq - front_seq`, so a delivery report finds its
//! transaction in O(1) without hashing. A transaction leaves the front of the
//! queue once it is committed and every one of its events is delivered; the
//! acked LSN is then its `end_lsn`. Each transaction is popped once, so
//! `delivered` is O(1) amortized.
//!
//! Invariant: the front entry, if any, is never finished (it is open, or
//! committed with undelivered events). Hence "queue empty" is exactly "nothing
//! open, nothing in flight".

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
}

impl AckTracker {
    /// A tracker resuming at `acked` (the durable resume point).
    pub fn new(acked: Lsn) -> AckTracker {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        AckTracker {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            acked,
            floor: acked,
            queue: VecDeque::new(),
            front_seq: 0,
            open: false,
            abandoned_in_queue: 0,
            in_flight_events: 0,
            in_flight_bytes: 0,
            stale_tokens: 0,
        }
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
        if !self.is_idle() || wal_end <= self.acked {
            return None;
        }
        self.acked = wal_end;
        self.floor = self.floor.max(wal_end);
        Some(wal_end)
    }

    /// Pops finished transactions off the front; returns the new acked LSN if
    /// one of them was a committed transaction beyond the current acked LSN.
    fn pop_finished(&mut self) -> Option<Lsn> {
        let mut advanced = None;
        while self.queue.front().is_some_and(Tx::is_finished) {
            let Some(tx) = self.queue.pop_front() else {
                break;
            };
            self.front_seq += 1;
            match tx.state {
                TxState::Committed(end_lsn) if end_lsn > self.acked => {
                    self.acked = end_lsn;
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

    /// Nothing open and nothing in flight.
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
