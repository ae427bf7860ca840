//! Checkpointing: which LSN is acknowledged, and keeping it durable.
//!
//! LSN rules (DESIGN.md §5):
//! - A transaction's position is its Commit `end_lsn`. The acked LSN is the
//!   `end_lsn` of the longest prefix of transactions, in commit order, whose
//!   events Kafka has all acknowledged ([`AckTracker`]); a transaction without
//!   events is acked as soon as everything before it is. It never goes back.
//! - When nothing is open or in flight, a keepalive's `wal_end` may be acked,
//!   so an outbox-only slot does not pin WAL on a busy database.
//! - The acked LSN is persisted and flushed in sled ([`OffsetStore`]) before
//!   PostgreSQL hears of it: the only LSN the pipeline can report as flushed is
//!   a [`DurableLsn`], and only the store makes one.
//! - With the live witness on, the fingerprints of the events sent
//!   ([`Ledger`]) reach the store with the offset that covers them.
//! - The stored offset carries the cluster's system identifier; resume starts
//!   at max(stored LSN, slot `confirmed_flush_lsn`).

mod acked_time;
mod ledger;
mod shared_store;
mod store;
mod tracker;

pub use crate::pg::DurableLsn;
pub(crate) use acked_time::DurableCommitTime;
pub use ledger::{Ledger, Page, fingerprint};
pub(crate) use shared_store::SharedStore;
pub use store::{
    CoverageBreak, CoverageRecord, Flushed, OffsetStore, ParkMirror, ParkedAggregate, ParkedAt,
    ParkedSync, PendingRepair, StoreError, StoredOffset, WitnessPosition, sequence_key,
};
pub use tracker::{AckTracker, EventToken, TrackerError};
