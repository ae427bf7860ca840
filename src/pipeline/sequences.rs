//! Live sequence-gap detection: the connector follows each aggregate's
//! `aggregate_sequence` as it publishes (`[audit]`).
//!
//! For every published event the last number and the event's LSN are kept
//! per aggregate: in memory (bounded: the map is cleared when it grows past
//! [`MAX_IN_MEMORY`]) and in the offset store's `sequences` tree, written in
//! batches with each offset persist, so the state survives restarts. An event
//! at or before the recorded LSN is a replay (a resend after a restart) and
//! is not judged. Otherwise, with `consecutive` numbering, the number must be
//! the last one plus 1 (1 for an aggregate never seen); with `increasing`,
//! larger than the last one. Anything else is a gap: a jump (N then N+2: an
//! event lost or not yet written), an old number again, or a first event
//! above 1.

use std::collections::HashMap;

use crate::checkpoint::{OffsetStore, StoreError};
use crate::config::AuditSettings;
use crate::pg::Lsn;

/// Aggregates kept in memory before the map is cleared (the store keeps all).
const MAX_IN_MEMORY: usize = 200_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Numbering {
    Consecutive,
    Increasing,
}

/// What kind of break in an aggregate's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapKind {
    /// N then N+2 or more.
    Jump,
    /// A number at or below the last published one, not a replay.
    Repeat,
    /// The first event of an aggregate numbered above 1.
    FirstAboveOne,
}

/// A break in one aggregate's numbering.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "aggregate {aggregate_type}/{aggregate_id}: aggregate_sequence {got} at LSN {lsn} after {} ({kind:?}); \
     events of this aggregate may be missing. Check with the outbox table (docs/operations.md, \"After an \
     incident\"); set audit.on_gap = \"warn\" to go on, or audit.sequences = \"increasing\" / \"off\" for writers \
     that do not number consecutively",
    previous.map_or_else(|| "none".to_owned(), |p| p.to_string())
)]
pub struct SequenceGap {
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub previous: Option<i64>,
    pub got: i64,
    pub lsn: Lsn,
    pub kind: GapKind,
}

pub(crate) struct SequenceWatch {
    numbering: Option<Numbering>,
    pub(crate) stop_on_gap: bool,
    known: HashMap<(String, String), (i64, Lsn)>,
    unsaved: HashMap<(String, String), (i64, Lsn)>,
}

impl SequenceWatch {
    pub(crate) fn new(settings: &AuditSettings) -> SequenceWatch {
        SequenceWatch {
            numbering: match settings.sequences.as_str() {
                "consecutive" => Some(Numbering::Consecutive),
                "increasing" => Some(Numbering::Increasing),
                _ => None,
            },
            stop_on_gap: settings.on_gap == "stop",
            known: HashMap::new(),
            unsaved: HashMap::new(),
        }
    }

    /// Judges one event about to be published and records it.
    pub(crate) fn observe(
        &mut self,
        store: &OffsetStore,
        aggregate_type: &str,
        aggregate_id: &str,
        got: i64,
        lsn: Lsn,
    ) -> Result<Option<SequenceGap>, StoreError> {
        let Some(numbering) = self.numbering else {
            return Ok(None);
        };
        let key = (aggregate_type.to_owned(), aggregate_id.to_owned());
        let last = match self.known.get(&key) {
            Some(last) => Some(*last),
            None => store.last_sequence(aggregate_type, aggregate_id)?,
        };
        let verdict = judge(numbering, last, got, lsn);
        if last.is_some_and(|(_, at)| lsn <= at) {
            return Ok(None); // a replay: already judged
        }
        let next = match last {
            Some((seq, _)) if seq >= got => (seq, lsn),
            _ => (got, lsn),
        };
        if self.known.len() >= MAX_IN_MEMORY {
            self.known.clear();
        }
        self.known.insert(key.clone(), next);
        self.unsaved.insert(key, next);
        Ok(verdict.map(|kind| SequenceGap {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            previous: last.map(|(seq, _)| seq),
            got,
            lsn,
            kind,
        }))
    }

    /// The records not yet written to the store; written with the next persist.
    pub(crate) fn take_unsaved(&mut self) -> Vec<(String, String, i64, Lsn)> {
        self.unsaved
            .drain()
            .map(|((t, i), (seq, lsn))| (t, i, seq, lsn))
            .collect()
    }
}

/// The event's `aggregate_sequence` header as a number (None when the layout
/// has no such column).
pub(crate) fn sequence_of(event: &crate::outbox::OutboxEvent) -> Option<i64> {
    let (_, value) = event
        .headers
        .iter()
        .find(|(name, _)| name == "aggregate_sequence")?;
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The pure decision: `None` when `got` follows `last`.
fn judge(numbering: Numbering, last: Option<(i64, Lsn)>, got: i64, lsn: Lsn) -> Option<GapKind> {
    match last {
        Some((_, at)) if lsn <= at => None,
        None if numbering == Numbering::Consecutive && got > 1 => Some(GapKind::FirstAboveOne),
        None => None,
        Some((seq, _)) if got <= seq => Some(GapKind::Repeat),
        Some((seq, _)) if numbering == Numbering::Consecutive && got > seq + 1 => {
            Some(GapKind::Jump)
        }
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(sequences: &str) -> AuditSettings {
        AuditSettings {
            sequences: sequences.into(),
            on_gap: "warn".into(),
        }
    }

    #[test]
    fn consecutive_numbering_flags_jumps_repeats_and_late_starts() {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        let mut w = SequenceWatch::new(&settings("consecutive"));
        let mut at = |agg: &str, seq: i64, lsn: u64| {
            w.observe(&store, "order", agg, seq, Lsn::new(lsn))
                .unwrap()
                .map(|g| g.kind)
        };
        assert_eq!(at("a", 1, 10), None);
        assert_eq!(at("a", 2, 20), None);
        assert_eq!(at("a", 4, 30), Some(GapKind::Jump));
        assert_eq!(at("a", 5, 40), None, "numbering continues after a jump");
        assert_eq!(at("a", 3, 50), Some(GapKind::Repeat));
        // A replay after a restart (at or before the recorded LSN) is not judged.
        assert_eq!(at("a", 2, 20), None);
        assert_eq!(at("b", 7, 60), Some(GapKind::FirstAboveOne));
    }

    #[test]
    fn state_survives_a_restart_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        let mut w = SequenceWatch::new(&settings("consecutive"));
        assert_eq!(
            w.observe(&store, "order", "a", 1, Lsn::new(10)).unwrap(),
            None
        );
        store.save_sequences(&w.take_unsaved()).unwrap();
        let mut again = SequenceWatch::new(&settings("consecutive"));
        assert_eq!(
            again
                .observe(&store, "order", "a", 3, Lsn::new(30))
                .unwrap()
                .map(|g| (g.kind, g.previous)),
            Some((GapKind::Jump, Some(1)))
        );
    }

    #[test]
    fn increasing_and_off() {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        let mut w = SequenceWatch::new(&settings("increasing"));
        assert_eq!(w.observe(&store, "o", "a", 5, Lsn::new(1)).unwrap(), None);
        assert_eq!(w.observe(&store, "o", "a", 9, Lsn::new(2)).unwrap(), None);
        assert!(
            w.observe(&store, "o", "a", 9, Lsn::new(3))
                .unwrap()
                .is_some()
        );
        let mut off = SequenceWatch::new(&settings("off"));
        assert_eq!(off.observe(&store, "o", "a", 1, Lsn::new(4)).unwrap(), None);
        assert!(off.take_unsaved().is_empty());
    }
}
