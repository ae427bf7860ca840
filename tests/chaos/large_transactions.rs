//! The chaos run of `at_least_once` with one more writer whose transactions
//! each add hundreds of rows (a fifth of them with a rolled-back savepoint
//! of as many again), and a server work memory of 64kB for the connector's
//! decoding: from PostgreSQL 14 they are streamed while in progress
//! (pgoutput protocol 2), and with a 16 KiB spill budget the connector
//! keeps them in spill files, so the kills land while transactions are
//! streamed into the spill and while they are published from it. The run
//! fails if, on 14+, no transaction was streamed or no connector death
//! found a spill file.
//!
//! `OUTBOX_CDC_SOAK_CYCLES` sets the number of kill/restart cycles (default
//! 50); `OUTBOX_CDC_CHAOS_BULK_ROWS` the rows of each of a large
//! transaction's two statements (default 100; one such transaction, open
//! for 1.5 s after its statements, every 3.5 s or so: the reference
//! consumer applies a few hundred events a second).

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_at_every_boundary_with_large_streamed_transactions() {
    let mut options = crate::support::harness::Options::from_env();
    options.workload.bulk_rows =
        crate::support::harness::env_num("OUTBOX_CDC_CHAOS_BULK_ROWS", 100);
    options.small_work_mem = true;
    crate::support::harness::run(options).await;
}
