//! The chaos run of `at_least_once` with `[delivery] mode = "exactly-once"`
//! (issue 15): the connector writes each batch of whole PostgreSQL
//! transactions and its offsets marker in one Kafka transaction, and a
//! `read_committed` reader must see every committed event exactly once across
//! every crash: duplicates=0, lost=0, per-aggregate order. Besides the
//! failpoints of `at_least_once` the connector dies at `before-kafka-commit`
//! and `after-kafka-commit-before-persist`; the slot is never lost (the gap
//! repair is at-least-once by design). See `harness::Options::exactly_once`.
//!
//! Exactly-once whatever `OUTBOX_CDC_CHAOS_MODE` says. `OUTBOX_CDC_SOAK_CYCLES`
//! sets the number of kill/restart cycles (default 30, for the CI's time);
//! `scripts/soak.sh --mode exactly-once --cycles N` runs it with more.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_boundary_delivers_each_event_exactly_once() {
    let options = crate::support::harness::Options {
        exactly_once: true,
        ..crate::support::harness::Options::from_env_with_cycles(30)
    };
    crate::support::harness::run(options).await;
}
