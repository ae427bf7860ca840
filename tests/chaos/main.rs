//! The chaos runs (issue 5; DESIGN.md §2): the real connector (built with
//! `--features failpoints`) and the reference consumer run as processes and
//! are killed at every crash point and at random moments while a writer
//! commits, Kafka is stopped and started and PostgreSQL restarted; then the
//! four invariants are checked (`support::verify`). One run per delivery mode
//! and outbox shape, one with large transactions streamed into the
//! connector's spill, and one whose connector skips rows for the live witness
//! to find; each holds `common::alone` (in `support::harness::run`),
//! so the runs go one after another.
//!
//! `cargo test --features failpoints --test chaos at_least_once::` runs one;
//! `OUTBOX_CDC_SOAK_CYCLES` sets the number of kill/restart cycles;
//! scripts/soak.sh runs one with more.

#[path = "../common/mod.rs"]
mod common;
mod support;

mod at_least_once;
mod exactly_once;
mod large_transactions;
mod partitioned;
mod witness;
