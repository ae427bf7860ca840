//! The live witness (`[reconcile]`, DESIGN.md §13a): while `run` streams, the
//! outbox table is compared with what the stream delivered, and a committed
//! row the stream skipped, whatever skipped it, is published from the table.
//!
//! - the session's side, fingerprints of the event ids it sent, is
//!   `checkpoint::Ledger`, stored with the offsets;
//! - `breaks`: a stored coverage break repaired at start instead of refused;
//! - `round`: one comparison: which rows must have arrived, which did not,
//!   and their publication;
//! - `binary_copy`: the rows a round reads, from a binary COPY.

mod binary_copy;
mod breaks;
mod round;

pub use crate::checkpoint::{Ledger, fingerprint};
pub use breaks::break_repair;
pub use round::run_reconciler;
