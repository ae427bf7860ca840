//! The chaos run of tests/chaos.rs with a hash-partitioned outbox published
//! by leaf names (no `publish_via_partition_root`): every row arrives under a
//! partition's name and must be resolved to the outbox (DESIGN.md §5a).
//!
//! This test stops shared servers: it must stay the only test in this file.
//! `OUTBOX_CDC_SOAK_CYCLES` sets the number of kill/restart cycles (default 50).

mod chaos_support;
mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_boundary_with_a_partitioned_outbox() {
    let options = chaos_support::harness::Options {
        partitioned: true,
        ..chaos_support::harness::Options::from_env()
    };
    chaos_support::harness::run(options).await;
}
