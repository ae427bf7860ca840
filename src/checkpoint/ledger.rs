//! The stream's side of the live witness: a fingerprint of every event id
//! the session sent, tagged with the commit position of its transaction,
//! until the offset that covers it is persisted (then the page goes to the
//! offset store, written before that offset).
//!
//! What it holds is bounded by the in-flight limits: an entry leaves at the
//! first persist after its transaction is acknowledged.

use std::collections::VecDeque;

use crate::pg::Lsn;

/// A stable 64-bit fingerprint of an event id (FNV-1a, then a 64-bit
/// finalizer to spread it): pages written by one version are read by the
/// next, so it must never depend on a hasher's seed or the standard
/// library's choice of algorithm.
pub fn fingerprint(event_id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in event_id.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Fingerprints per chunk: 64 KiB. A transaction of a million events is
/// held in chunks of this size, never in one buffer that doubles and copies
/// (which held it two to three times over while it grew, issue 50).
const CHUNK: usize = 8192;

/// Events sent and not yet in the store, in commit order: the transactions
/// (commit position, events) and their fingerprints, chunked.
#[derive(Debug, Default)]
pub struct Ledger {
    transactions: VecDeque<(Lsn, usize)>,
    chunks: VecDeque<Vec<u64>>,
    len: usize,
}

/// The fingerprints of acknowledged transactions, on their way to a page.
#[derive(Debug, PartialEq, Eq)]
pub struct Page {
    /// The commit position of the last transaction.
    pub through: Lsn,
    chunks: Vec<Vec<u64>>,
}

impl Page {
    /// The fingerprints, a chunk at a time.
    pub fn chunks(&self) -> impl Iterator<Item = &[u64]> {
        self.chunks.iter().map(Vec::as_slice)
    }

    pub fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Ledger {
    /// An event of the transaction whose commit record starts at `commit` was sent.
    pub fn record(&mut self, commit: Lsn, event_id: &str) {
        match self.transactions.back_mut() {
            Some((last, n)) if *last == commit => *n += 1,
            _ => self.transactions.push_back((commit, 1)),
        }
        match self.chunks.back_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(fingerprint(event_id)),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(fingerprint(event_id));
                self.chunks.push_back(chunk);
            }
        }
        self.len += 1;
    }

    /// Takes the fingerprints of the transactions acknowledged at `acked`
    /// (their commit records start before it: an acknowledged position is a
    /// transaction's end or a point between transactions), with the commit
    /// position of the last; `None` when there are none.
    pub fn take_acknowledged(&mut self, acked: Lsn) -> Option<Page> {
        let (mut through, mut events) = (None, 0);
        while let Some(&(commit, n)) = self.transactions.front().filter(|(c, _)| *c < acked) {
            through = Some(commit);
            events += n;
            self.transactions.pop_front();
        }
        let through = through?;
        self.len -= events;
        let mut chunks = Vec::new();
        while events > 0 {
            let front = self
                .chunks
                .front_mut()
                .expect("the chunks hold every event");
            if front.len() <= events {
                events -= front.len();
                chunks.push(self.chunks.pop_front().expect("a front chunk"));
            } else {
                chunks.push(front.drain(..events).collect());
                events = 0;
            }
        }
        Some(Page { through, chunks })
    }

    /// Puts back the page of a persist that failed, before everything
    /// recorded since: the next persist writes it before its offset.
    pub fn restore(&mut self, page: Page) {
        let n = page.len();
        if n == 0 {
            return;
        }
        self.transactions.push_front((page.through, n));
        for chunk in page.chunks.into_iter().rev() {
            self.chunks.push_front(chunk);
        }
        self.len += n;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_stable_across_versions() {
        // Pages on disk are compared with rows by these values: a change
        // here makes every stored page useless (and rows look missing).
        assert_eq!(fingerprint(""), fingerprint(""));
        assert_eq!(
            fingerprint("0b5c4a5e-1b1e-4c57-9b8e-1f0f7d1c2a01"),
            2_352_980_959_587_222_746
        );
        assert_ne!(fingerprint("a"), fingerprint("b"));
    }

    #[test]
    fn only_acknowledged_transactions_leave() {
        let mut l = Ledger::default();
        l.record(Lsn::new(10), "a");
        l.record(Lsn::new(10), "b");
        l.record(Lsn::new(30), "c");
        assert_eq!(l.take_acknowledged(Lsn::new(10)), None);
        let page = l.take_acknowledged(Lsn::new(20)).unwrap();
        assert_eq!(page.through, Lsn::new(10));
        assert_eq!(flat(&page), [fingerprint("a"), fingerprint("b")]);
        assert_eq!(l.len(), 1);
        assert_eq!(
            flat(&l.take_acknowledged(Lsn::new(31)).unwrap()),
            [fingerprint("c")]
        );
        assert!(l.is_empty());
    }

    fn flat(page: &Page) -> Vec<u64> {
        page.chunks().flatten().copied().collect()
    }

    #[test]
    fn a_large_transaction_is_held_in_fixed_chunks_and_split_where_acknowledged() {
        let mut l = Ledger::default();
        let ids: Vec<String> = (0..3 * CHUNK + 5).map(|i| format!("e{i}")).collect();
        // One large transaction, then a small one sharing its last chunk.
        for id in &ids[..2 * CHUNK + 3] {
            l.record(Lsn::new(100), id);
        }
        for id in &ids[2 * CHUNK + 3..] {
            l.record(Lsn::new(200), id);
        }
        assert_eq!(l.len(), ids.len());
        // No chunk ever grew past its size: nothing is copied as it grows.
        assert!(
            l.chunks.iter().all(|c| c.capacity() == CHUNK),
            "{:?}",
            l.chunks.iter().map(Vec::capacity).collect::<Vec<_>>()
        );
        let page = l.take_acknowledged(Lsn::new(150)).unwrap();
        assert_eq!(page.through, Lsn::new(100));
        assert_eq!(page.len(), 2 * CHUNK + 3);
        let want: Vec<u64> = ids[..2 * CHUNK + 3]
            .iter()
            .map(|i| fingerprint(i))
            .collect();
        assert_eq!(flat(&page), want);
        assert_eq!(l.len(), CHUNK + 2);
        let rest = l.take_acknowledged(Lsn::new(201)).unwrap();
        let want: Vec<u64> = ids[2 * CHUNK + 3..]
            .iter()
            .map(|i| fingerprint(i))
            .collect();
        assert_eq!((rest.through, flat(&rest)), (Lsn::new(200), want));
        assert!(l.is_empty() && l.chunks.is_empty() && l.transactions.is_empty());
    }

    #[test]
    fn a_page_given_back_is_taken_again_first() {
        let mut l = Ledger::default();
        l.record(Lsn::new(10), "a");
        l.record(Lsn::new(20), "b");
        let page = l.take_acknowledged(Lsn::new(21)).unwrap();
        l.record(Lsn::new(30), "c");
        l.restore(page);
        assert_eq!(l.len(), 3);
        let again = l.take_acknowledged(Lsn::new(31)).unwrap();
        assert_eq!(again.through, Lsn::new(30));
        assert_eq!(
            flat(&again),
            [fingerprint("a"), fingerprint("b"), fingerprint("c")]
        );
        assert!(l.is_empty());
    }
}
