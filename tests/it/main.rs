//! The integration tests that share the test servers without stopping or
//! reconfiguring them, in one test binary so that they link once; libtest
//! runs them in parallel. Tests that stop a server, restart it, or change a
//! server-wide setting are in tests/disruptive; the chaos runs in tests/chaos;
//! those that need a standby in tests/standby.
//!
//! The few tests that arm the connector's crash points (in exactly_once and
//! gap_repair) are compiled only with the `failpoints` feature
//! (`#[cfg(feature = "failpoints")]`), which scripts/test.sh passes.
//!
//! Run one module with `cargo test --test it pipeline::`.

#[path = "../common/mod.rs"]
mod common;

mod audit;
mod cloudevents;
mod compose_file;
mod coverage_break;
mod dead_letter;
mod debezium_shape;
mod docs_commands;
mod env_servers;
mod exactly_once;
mod gap_repair;
mod ha_takeover;
mod health;
mod import_debezium;
mod kafka_security;
mod kubernetes;
mod large_transactions;
mod migrations;
mod missing_topics;
mod no_silent_skip;
mod operations;
mod pg_auth_downgrade;
mod pg_control;
mod pg_replication;
mod pgoutput_golden;
mod pgoutput_live;
mod pgoutput_stream_golden;
mod pipeline;
mod prune;
mod reference_consumer_modes;
mod repair_lock;
mod replay;
mod rolled_back_work;
mod sequence_gaps;
mod session_exits;
mod sink_kafka;
mod slot_takeover;
mod trace_context;
mod version_features;
mod witness;
