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

/// Events sent and not yet in the store, in commit order.
#[derive(Debug, Default)]
pub struct Ledger {
    pending: VecDeque<(Lsn, u64)>,
}

impl Ledger {
    /// An event of the transaction whose commit record starts at `commit` was sent.
    pub fn record(&mut self, commit: Lsn, event_id: &str) {
        self.pending.push_back((commit, fingerprint(event_id)));
    }

    /// Takes the fingerprints of the transactions acknowledged at `acked`
    /// (their commit records start before it: an acknowledged position is a
    /// transaction's end or a point between transactions), with the commit
    /// position of the last; `None` when there are none.
    pub fn take_acknowledged(&mut self, acked: Lsn) -> Option<(Lsn, Vec<u64>)> {
        let n = self.pending.partition_point(|(commit, _)| *commit < acked);
        if n == 0 {
            return None;
        }
        let through = self.pending[n - 1].0;
        let taken = self.pending.drain(..n).map(|(_, f)| f).collect();
        Some((through, taken))
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
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
        let (through, taken) = l.take_acknowledged(Lsn::new(20)).unwrap();
        assert_eq!(through, Lsn::new(10));
        assert_eq!(taken, [fingerprint("a"), fingerprint("b")]);
        assert_eq!(l.len(), 1);
        assert_eq!(
            l.take_acknowledged(Lsn::new(31)).unwrap().1,
            [fingerprint("c")]
        );
        assert!(l.is_empty());
    }
}
