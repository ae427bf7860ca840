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

use tracing::warn;

use crate::checkpoint::{OffsetStore, StoreError, sequence_key};
use crate::config::AuditSettings;
use crate::metrics::Metrics;
use crate::outbox::OutboxEvent;
use crate::pg::Lsn;

use crate::error::{GapKind, PipelineError, SequenceGap};

/// Aggregates kept in memory before the map is cleared (the store keeps all).
const MAX_IN_MEMORY: usize = 200_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Numbering {
    Consecutive,
    Increasing,
}

pub(crate) struct SequenceWatch {
    numbering: Option<Numbering>,
    pub(crate) stop_on_gap: bool,
    /// Last number and LSN per aggregate, by the store's key
    /// ([`sequence_key`]'s bytes).
    known: HashMap<Box<[u8]>, Entry>,
    /// Keys of the `known` entries changed since they were last taken for
    /// the store; `known` keeps those entries whatever its size.
    unsaved: Vec<Box<[u8]>>,
    /// The key of the event being observed, built here to look it up
    /// without allocating.
    scratch: Vec<u8>,
    /// `known` is trimmed to its unsaved entries when it reaches this size.
    trim_at: usize,
}

#[derive(Clone, Copy)]
struct Entry {
    seq: i64,
    lsn: Lsn,
    unsaved: bool,
}

/// Where an aggregate's state comes from when it is not in memory: the
/// offset store, given the aggregate's key.
pub(crate) type Lookup<'a> = &'a mut dyn FnMut(&[u8]) -> Result<Option<(i64, Lsn)>, StoreError>;

/// One event's place in its aggregate's numbering: what is followed.
#[derive(Clone, Copy)]
pub(crate) struct Numbered<'a> {
    pub(crate) aggregate_type: &'a str,
    pub(crate) aggregate_id: &'a str,
    pub(crate) seq: i64,
    pub(crate) lsn: Lsn,
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
            unsaved: Vec::new(),
            scratch: Vec::new(),
            trim_at: MAX_IN_MEMORY,
        }
    }

    /// Whether sequences are followed at all (`audit.sequences` not "off").
    pub(crate) fn is_on(&self) -> bool {
        self.numbering.is_some()
    }

    /// Judges one event about to be published and records it.
    pub(crate) fn observe(
        &mut self,
        lookup: Lookup<'_>,
        event: Numbered<'_>,
    ) -> Result<Option<SequenceGap>, StoreError> {
        let Some(numbering) = self.numbering else {
            return Ok(None);
        };
        let Some(last) = self.follow(lookup, event)? else {
            return Ok(None); // a replay: already judged
        };
        Ok(
            judge(numbering, last, event.seq, event.lsn).map(|kind| SequenceGap {
                aggregate_type: event.aggregate_type.to_owned(),
                aggregate_id: event.aggregate_id.to_owned(),
                previous: last.map(|(seq, _)| seq),
                got: event.seq,
                lsn: event.lsn,
                kind,
            }),
        )
    }

    /// Records an event published before a restart and sent again by the
    /// server (dropped, not published): its number may not have reached the
    /// store, which is only required to hold what was reported to
    /// PostgreSQL. Not judged.
    pub(crate) fn replayed(
        &mut self,
        lookup: Lookup<'_>,
        event: Numbered<'_>,
    ) -> Result<(), StoreError> {
        if self.numbering.is_some() {
            self.follow(lookup, event)?;
        }
        Ok(())
    }

    /// Moves the aggregate's state to the event's number and LSN unless it is
    /// already at or past that LSN. `Some(last)`: the state before, to judge
    /// the number against; `None`: the event is at or before the recorded
    /// one (a replay).
    #[allow(clippy::type_complexity)]
    fn follow(
        &mut self,
        lookup: Lookup<'_>,
        event: Numbered<'_>,
    ) -> Result<Option<Option<(i64, Lsn)>>, StoreError> {
        let Numbered {
            aggregate_type,
            aggregate_id,
            seq: got,
            lsn,
        } = event;
        self.scratch.clear();
        self.scratch
            .extend_from_slice(&(aggregate_type.len() as u32).to_be_bytes());
        self.scratch.extend_from_slice(aggregate_type.as_bytes());
        self.scratch.extend_from_slice(aggregate_id.as_bytes());
        debug_assert_eq!(self.scratch, sequence_key(aggregate_type, aggregate_id));
        // One hash lookup for an aggregate in memory (the usual case).
        if let Some(entry) = self.known.get_mut(self.scratch.as_slice()) {
            let last = (entry.seq, entry.lsn);
            if lsn <= last.1 {
                return Ok(None);
            }
            entry.seq = entry.seq.max(got);
            entry.lsn = lsn;
            if !entry.unsaved {
                entry.unsaved = true;
                self.unsaved.push(self.scratch.as_slice().into());
            }
            return Ok(Some(Some(last)));
        }
        let last = lookup(&self.scratch)?;
        if last.is_some_and(|(_, at)| lsn <= at) {
            return Ok(None);
        }
        let seq = last.map_or(got, |(seq, _)| seq.max(got));
        if self.known.len() >= self.trim_at {
            self.known.retain(|_, entry| entry.unsaved);
            self.trim_at = MAX_IN_MEMORY.max(self.known.len() * 2);
        }
        let key: Box<[u8]> = self.scratch.as_slice().into();
        self.unsaved.push(key.clone());
        self.known.insert(
            key,
            Entry {
                seq,
                lsn,
                unsaved: true,
            },
        );
        Ok(Some(last))
    }

    /// Follows one event's number, with the offset store as the source of
    /// aggregates not in memory (read off the async worker). An event about
    /// to be published is `judged`: a number that does not follow the
    /// aggregate's last published one is counted and logged, and under
    /// `on_gap = "stop"` ends the session before the event is produced. An
    /// event sent again after a restart is only recorded.
    pub(crate) fn follow_event(
        &mut self,
        store: &OffsetStore,
        metrics: &Metrics,
        event: &OutboxEvent,
        lsn: Lsn,
        judged: bool,
    ) -> Result<(), PipelineError> {
        let Some(seq) = event.aggregate_sequence else {
            return Ok(());
        };
        let lookup = &mut |key: &[u8]| tokio::task::block_in_place(|| store.last_sequence(key));
        let (kind, id) = (&event.aggregate_type, &event.aggregate_id);
        let numbered = Numbered {
            aggregate_type: kind,
            aggregate_id: id,
            seq,
            lsn,
        };
        if !judged {
            self.replayed(lookup, numbered)?;
            return Ok(());
        }
        metrics.health.sequence_arrived(kind, id, seq);
        let Some(gap) = self.observe(lookup, numbered)? else {
            return Ok(());
        };
        if let (GapKind::Jump, Some(previous)) = (gap.kind, gap.previous) {
            metrics
                .health
                .gap_opened(kind, id, previous, gap.got, gap.lsn);
        }
        metrics.record_sequence_gap(&gap.aggregate_type);
        warn!(aggregate_type = %gap.aggregate_type, aggregate_id = %gap.aggregate_id,
            previous = ?gap.previous, got = gap.got, lsn = %gap.lsn, kind = ?gap.kind,
            "aggregate sequence gap");
        if self.stop_on_gap {
            return Err(PipelineError::SequenceGap(gap));
        }
        Ok(())
    }

    /// Whether some recorded numbers have not been taken for the store.
    pub(crate) fn has_unsaved(&self) -> bool {
        !self.unsaved.is_empty()
    }

    /// The records not yet written to the store, by key.
    pub(crate) fn take_unsaved(&mut self) -> Vec<(Box<[u8]>, i64, Lsn)> {
        let mut taken = Vec::with_capacity(self.unsaved.len());
        for key in self.unsaved.drain(..) {
            if let Some(entry) = self.known.get_mut(&key) {
                entry.unsaved = false;
                taken.push((key, entry.seq, entry.lsn));
            }
        }
        taken
    }
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
            save_interval_ms: 1000,
        }
    }

    fn numbered<'a>(
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        seq: i64,
        lsn: u64,
    ) -> Numbered<'a> {
        Numbered {
            aggregate_type,
            aggregate_id,
            seq,
            lsn: Lsn::new(lsn),
        }
    }

    /// A watch and the offset store it looks aggregates up in (kept with
    /// its directory).
    fn watch_with_store(sequences: &str) -> (tempfile::TempDir, OffsetStore, SequenceWatch) {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        (dir, store, SequenceWatch::new(&settings(sequences)))
    }

    #[test]
    fn consecutive_numbering_flags_jumps_repeats_and_late_starts() {
        let (_dir, store, mut w) = watch_with_store("consecutive");
        let mut stored = |key: &[u8]| store.last_sequence(key);
        let mut at = |agg: &str, seq: i64, lsn: u64| {
            w.observe(&mut stored, numbered("order", agg, seq, lsn))
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
        let (_dir, store, mut w) = watch_with_store("consecutive");
        let mut stored = |key: &[u8]| store.last_sequence(key);
        assert_eq!(
            w.observe(&mut stored, numbered("order", "a", 1, 10))
                .unwrap(),
            None
        );
        store.save_sequences(&w.take_unsaved()).unwrap();
        let mut again = SequenceWatch::new(&settings("consecutive"));
        assert_eq!(
            again
                .observe(&mut stored, numbered("order", "a", 3, 30))
                .unwrap()
                .map(|g| (g.kind, g.previous)),
            Some((GapKind::Jump, Some(1)))
        );
    }

    #[test]
    fn increasing_and_off() {
        let (_dir, store, mut w) = watch_with_store("increasing");
        let mut stored = |key: &[u8]| store.last_sequence(key);
        assert_eq!(
            w.observe(&mut stored, numbered("o", "a", 5, 1)).unwrap(),
            None
        );
        assert_eq!(
            w.observe(&mut stored, numbered("o", "a", 9, 2)).unwrap(),
            None
        );
        assert!(
            w.observe(&mut stored, numbered("o", "a", 9, 3))
                .unwrap()
                .is_some()
        );
        let mut off = SequenceWatch::new(&settings("off"));
        assert_eq!(
            off.observe(&mut stored, numbered("o", "a", 1, 4)).unwrap(),
            None
        );
        assert!(off.take_unsaved().is_empty());
    }

    #[test]
    fn a_replayed_event_moves_the_state_without_being_judged() {
        let mut w = SequenceWatch::new(&settings("consecutive"));
        let mut nothing_stored = |_: &[u8]| Ok(None);
        // 2 and 3 were published before a crash and never reached the
        // store; the server sends them again.
        w.replayed(&mut nothing_stored, numbered("order", "a", 2, 20))
            .unwrap();
        w.replayed(&mut nothing_stored, numbered("order", "a", 3, 30))
            .unwrap();
        assert_eq!(
            w.observe(&mut nothing_stored, numbered("order", "a", 4, 40))
                .unwrap(),
            None,
            "4 follows the replayed 3"
        );
        let saved = w.take_unsaved();
        assert_eq!(saved.len(), 1);
        assert_eq!((saved[0].1, saved[0].2), (4, Lsn::new(40)));
        assert!(!w.has_unsaved());
        // A replay older than the stored state changes nothing.
        let mut stored = |_: &[u8]| Ok(Some((9, Lsn::new(90))));
        w.replayed(&mut stored, numbered("order", "b", 5, 50))
            .unwrap();
        assert!(!w.has_unsaved());
    }

    #[test]
    fn known_aggregates_are_not_looked_up_and_trimming_keeps_unsaved_ones() {
        let mut w = SequenceWatch::new(&settings("consecutive"));
        let mut lookups = 0;
        let mut count = |_: &[u8]| {
            lookups += 1;
            Ok(None)
        };
        for i in 0..MAX_IN_MEMORY {
            let id = i.to_string();
            assert_eq!(
                w.observe(&mut count, numbered("o", &id, 1, 1)).unwrap(),
                None
            );
            assert_eq!(
                w.observe(&mut count, numbered("o", &id, 2, 2)).unwrap(),
                None
            );
        }
        assert_eq!(w.take_unsaved().len(), MAX_IN_MEMORY);
        // Full: the saved entries go, the unsaved one stays.
        w.observe(&mut count, numbered("o", "new", 1, 3)).unwrap();
        w.observe(&mut count, numbered("o", "newer", 1, 4)).unwrap();
        w.observe(&mut count, numbered("o", "new", 2, 5)).unwrap();
        w.observe(&mut count, numbered("o", "0", 3, 6)).unwrap();
        assert_eq!(
            lookups,
            MAX_IN_MEMORY + 3,
            "one lookup per aggregate, and one for a trimmed one"
        );
        let mut saved: Vec<_> = w
            .take_unsaved()
            .into_iter()
            .map(|(_, seq, lsn)| (seq, lsn))
            .collect();
        saved.sort();
        assert_eq!(
            saved,
            [(1, Lsn::new(4)), (2, Lsn::new(5)), (3, Lsn::new(6))]
        );
    }
}
