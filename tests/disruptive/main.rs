//! The integration tests that stop, restart or reconfigure a shared test
//! server: Kafka stopped (outage_kafka, ops_kafka_down, exactly_once,
//! health_ready),
//! PostgreSQL restarted (server_shutdown, and the `*_commit_ts` tests, whose
//! setting needs a restart), or a server-wide setting changed (fenced_primary,
//! pg_auth_tls, slot_invalidated), or a filesystem mounted and filled under
//! the connector's store (disk_full). Each test holds `common::alone` for its
//! whole run, so they run one at a time; cargo runs this binary apart from
//! tests/it, whose tests share the servers in parallel.
//!
//! Run one module with `cargo test --test disruptive server_shutdown::`.

#[path = "../common/mod.rs"]
mod common;

mod disk_full;
mod exactly_once;
mod fenced_primary;
mod gap_repair_commit_ts;
mod health_ready;
mod ops_kafka_down;
mod outage_kafka;
mod pg_auth_tls;
mod prune_commit_ts;
mod server_shutdown;
mod slot_invalidated;
