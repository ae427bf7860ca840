//! Crash at every boundary and assert the four invariants (issue 5; the seed's
//! verification part; DESIGN.md §2).
//!
//! The real connector (built with `--features failpoints`) and the reference
//! consumer run as processes. A writer commits orders with 1-3 outbox rows per
//! transaction (about 10% rolled back, some transactions touching only other
//! tables) while both processes are killed at every failpoint and at random
//! moments, Kafka is stopped and started and PostgreSQL restarted. The verdict
//! and the invariants are in tests/chaos_support/verify.rs.
//!
//! This test stops shared servers: it must stay the only test in this file.
//! `OUTBOX_CDC_SOAK_CYCLES` sets the number of kill/restart cycles (default
//! 50); `scripts/soak.sh --cycles N` runs it with more.

mod chaos_support;
mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_boundary_keeps_the_four_invariants() {
    chaos_support::harness::run(chaos_support::harness::Options::from_env()).await;
}
