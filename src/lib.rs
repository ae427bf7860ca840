//! outbox-cdc: a transactional-outbox relay from PostgreSQL logical replication
//! (`pgoutput`) to Kafka, with the last acknowledged LSN kept locally in sled.
//!
//! Data flow (DESIGN.md §3): `pg` (replication transport, control SQL) →
//! `pgoutput` (decoder, relation cache) → `outbox` (mapping, routing) → `sink`
//! (Kafka) → `checkpoint` (ack tracker, offset store) → back to `pg` as the
//! flushed LSN in standby status updates. `pipeline` wires them.

pub mod audit;
pub mod check;
pub mod checkpoint;
pub mod config;
pub mod coverage;
pub mod debezium;
mod disposition;
pub mod error;
pub mod failpoint;
pub mod health;
mod heartbeat;
pub mod http;
pub mod metrics;
mod monitor;
pub mod outbox;
pub mod parking;
mod periodic;
pub mod pg;
pub mod pgoutput;
pub mod pipeline;
pub(crate) mod poison;
pub mod readiness;
pub mod relay;
pub mod retained;
pub(crate) mod setting;
pub mod sink;
pub mod status;
pub mod witness;

pub use disposition::Disposition;
