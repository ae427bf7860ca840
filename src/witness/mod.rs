//! The live witness (`[reconcile]`, DESIGN.md §13a): while `run` streams, the
//! outbox table is compared with what the stream delivered, and a committed
//! row the stream skipped, whatever skipped it, is published from the table.
//!
//! - `ledger`: the session's side, fingerprints of the event ids it sent;
//! - `breaks`: a stored coverage break repaired at start instead of refused;
//! - `round`: one comparison: which rows must have arrived, which did not,
//!   and their publication.

mod breaks;
mod ledger;
mod round;

pub(crate) use breaks::repair_breaks;
pub use ledger::{Ledger, fingerprint};
pub use round::run_reconciler;
