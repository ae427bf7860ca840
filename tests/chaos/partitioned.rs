//! The chaos run of `at_least_once` with a hash-partitioned outbox published
//! by leaf names (no `publish_via_partition_root`): every row arrives under a
//! partition's name and must be resolved to the outbox (DESIGN.md §5a).
//!
//! `OUTBOX_CDC_SOAK_CYCLES` sets the number of kill/restart cycles (default 50).

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_boundary_with_a_partitioned_outbox() {
    let options = crate::support::harness::Options {
        partitioned: true,
        ..crate::support::harness::Options::from_env()
    };
    crate::support::harness::run(options).await;
}
