//! The commit time of the last acknowledged transaction, as the running
//! pipeline last persisted it: how `run`'s pruner learns what is safe to
//! delete without opening the offset store (the pipeline holds its lock).

use std::sync::atomic::{AtomicI64, Ordering};

use crate::pg::PgTimestamp;

/// Shared between the session (writer) and the pruner (reader). Set only
/// after the offset store flushed the position the time belongs to.
#[derive(Debug)]
pub struct DurableCommitTime(AtomicI64);

/// No time known yet.
const UNKNOWN: i64 = i64::MIN;

impl Default for DurableCommitTime {
    fn default() -> Self {
        DurableCommitTime(AtomicI64::new(UNKNOWN))
    }
}

impl DurableCommitTime {
    /// Records the commit time of a persisted offset; `None` (the persist
    /// kept the stored time) changes nothing.
    pub fn set(&self, time: Option<PgTimestamp>) {
        if let Some(t) = time {
            self.0.store(t.0, Ordering::Release);
        }
    }

    pub fn get(&self) -> Option<PgTimestamp> {
        match self.0.load(Ordering::Acquire) {
            UNKNOWN => None,
            t => Some(PgTimestamp(t)),
        }
    }
}
