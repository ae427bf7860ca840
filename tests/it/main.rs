//! The integration tests that share the test servers without stopping or
//! reconfiguring them, in one test binary so that they link once. Tests that
//! stop a server, restart it, or change a server-wide setting
//! (chaos, outage_kafka, ops_kafka_down, server_shutdown, fenced_primary,
//! pg_auth_tls, slot_invalidated, *_commit_ts, failover, standby_decoding)
//! stay in their own files: libtest runs the tests of one binary in parallel.
//! So does gap_repair, whose crash test needs the `failpoints` feature.
//!
//! Run one module with `cargo test --test it pipeline::`.

#[path = "../common/mod.rs"]
mod common;

mod audit;
mod cloudevents;
mod compose_file;
mod dead_letter;
mod debezium_shape;
mod env_servers;
mod exactly_once;
mod ha_takeover;
mod health;
mod import_debezium;
mod kafka_security;
mod kubernetes;
mod migrations;
mod missing_topics;
mod no_silent_skip;
mod operations;
mod pg_control;
mod pg_replication;
mod pgoutput_golden;
mod pgoutput_live;
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
