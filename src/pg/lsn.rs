//! Log sequence numbers.
//!
//! A PostgreSQL LSN is a 64-bit byte position in the write-ahead log, shown as
//! two hexadecimal halves `X/Y` (high 32 bits / low 32 bits). Ordering is plain
//! numeric ordering; the distance between two LSNs is a number of WAL bytes.

use std::fmt;
use std::str::FromStr;

/// A position in the PostgreSQL write-ahead log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(u64);

impl Lsn {
    /// `0/0`: "no position" on the wire (e.g. START_REPLICATION from the slot's own position).
    pub const ZERO: Lsn = Lsn(0);

    pub const fn new(raw: u64) -> Lsn {
        Lsn(raw)
    }

    pub const fn as_u64(self) -> u64 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// WAL bytes from `older` up to `self`; zero when `older` is ahead.
    pub fn bytes_since(self, older: Lsn) -> u64 {
        self.0.saturating_sub(older.0)
    }
}

/// Where one change sits in the order consumers see events: its transaction's
/// commit LSN first, then the change's own LSN inside that transaction.
///
/// Change LSNs alone are not commit order: two transactions interleave their
/// changes in the WAL, and the one that commits first is sent (and published)
/// first whatever its changes' LSNs.
///
/// ```
/// use outbox_cdc::pg::{EventPosition, Lsn};
///
/// // T1 inserted at 0/100 and commits at 0/500; T2 inserted at 0/300 and committed at 0/400.
/// let t1 = EventPosition::new(Lsn::new(0x500), Lsn::new(0x100));
/// let t2 = EventPosition::new(Lsn::new(0x400), Lsn::new(0x300));
/// assert!(t1 > t2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventPosition {
    // Field order is the comparison order (derived `Ord`).
    commit: Lsn,
    change: Lsn,
}

impl EventPosition {
    pub const fn new(commit: Lsn, change: Lsn) -> EventPosition {
        EventPosition { commit, change }
    }

    /// Rows read back from the table (replay, gap repair) have no WAL
    /// position of their own: they all sit at the position they were read at.
    pub const fn at(lsn: Lsn) -> EventPosition {
        EventPosition::new(lsn, lsn)
    }

    /// The commit LSN of the change's transaction.
    pub const fn commit(self) -> Lsn {
        self.commit
    }

    /// The change's own LSN.
    pub const fn change(self) -> Lsn {
        self.change
    }
}

/// An LSN that is durable in the offset store: flushed to disk by a
/// successful [`OffsetStore::persist`](crate::checkpoint::OffsetStore::persist),
/// or read back by
/// [`OffsetStore::durable_lsn`](crate::checkpoint::OffsetStore::durable_lsn)
/// and then flushed.
///
/// This is the only type [`FeedbackHandle::set_flushed`](crate::pg::FeedbackHandle::set_flushed)
/// takes, so the flush position reported to PostgreSQL (which lets it recycle
/// WAL and advance the slot) cannot be beyond what is durable locally. Making
/// one needs a [`Flushed`](crate::checkpoint::Flushed) proof, which only the
/// offset store can make; neither a forged value nor a plain [`Lsn`] compiles:
///
/// ```compile_fail,E0423
/// let forged = outbox_cdc::pg::DurableLsn(outbox_cdc::pg::Lsn::new(1));
/// ```
///
/// ```compile_fail,E0308
/// fn report(feedback: &outbox_cdc::pg::FeedbackHandle) {
///     feedback.set_flushed(outbox_cdc::pg::Lsn::new(1));
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DurableLsn(Lsn);

impl DurableLsn {
    /// `lsn` is durable: the store has just flushed it (the proof says so).
    pub fn new(lsn: Lsn, _flushed: crate::checkpoint::Flushed) -> DurableLsn {
        DurableLsn(lsn)
    }

    pub fn lsn(&self) -> Lsn {
        self.0
    }

    /// For the feedback task's own unit tests, which have no store.
    #[cfg(test)]
    pub(crate) fn for_test(lsn: Lsn) -> DurableLsn {
        DurableLsn(lsn)
    }
}

impl fmt::Display for DurableLsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// Why a text LSN was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid LSN {input:?}: expected two hexadecimal halves of at most 8 digits, like 16/B374D848"
)]
pub struct ParseLsnError {
    input: String,
}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Lsn, ParseLsnError> {
        let err = || ParseLsnError {
            input: s.to_owned(),
        };
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let half = |h: &str| {
            if h.is_empty() || h.len() > 8 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            u32::from_str_radix(h, 16).map_err(|_| err())
        };
        Ok(Lsn((u64::from(half(hi)?) << 32) | u64::from(half(lo)?)))
    }
}

impl serde::Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Lsn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_as_two_hex_halves() {
        assert_eq!(Lsn::new(0x16_B374_D848).to_string(), "16/B374D848");
        assert_eq!(Lsn::ZERO.to_string(), "0/0");
        assert_eq!(Lsn::new(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
    }

    #[test]
    fn parses_what_postgres_prints() {
        assert_eq!(
            "16/B374D848".parse::<Lsn>().unwrap(),
            Lsn::new(0x16_B374_D848)
        );
        assert_eq!("0/0".parse::<Lsn>().unwrap(), Lsn::ZERO);
        assert_eq!("a/1".parse::<Lsn>().unwrap(), Lsn::new(0xA_0000_0001));
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "/",
            "1/",
            "/1",
            "1",
            "x/1",
            "1/2/3",
            "123456789/0",
            "-1/0",
            " 1/0",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn round_trips_and_orders() {
        for raw in [0u64, 1, 0xFFFF_FFFF, 0x1_0000_0000, u64::MAX] {
            let lsn = Lsn::new(raw);
            assert_eq!(lsn.to_string().parse::<Lsn>().unwrap(), lsn);
        }
        assert!(Lsn::new(0x1_0000_0000) > Lsn::new(0xFFFF_FFFF));
    }

    #[test]
    fn byte_distance_saturates() {
        assert_eq!(Lsn::new(100).bytes_since(Lsn::new(40)), 60);
        assert_eq!(Lsn::new(40).bytes_since(Lsn::new(100)), 0);
    }
}
