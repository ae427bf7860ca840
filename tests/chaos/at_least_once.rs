//! Crash at every boundary and assert the four invariants (issue 5; the seed's
//! verification part; DESIGN.md §2).
//!
//! The real connector (built with `--features failpoints`) and the reference
//! consumer run as processes. A writer commits orders with 1-3 outbox rows per
//! transaction (about 10% rolled back, some transactions touching only other
//! tables) while both processes are killed at every failpoint and at random
//! moments, Kafka is stopped and started and PostgreSQL restarted. The verdict
//! and the invariants are in tests/chaos/support/verify.rs.
//!
//! At-least-once unless `OUTBOX_CDC_CHAOS_MODE` says otherwise.
//! `OUTBOX_CDC_SOAK_CYCLES` sets the number of kill/restart cycles (default
//! 50); `scripts/soak.sh --cycles N` runs it with more.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_boundary_keeps_the_four_invariants() {
    crate::support::harness::run(crate::support::harness::Options::from_env()).await;
}
