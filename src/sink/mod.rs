//! Kafka sink: one idempotent librdkafka producer (rdkafka), records in
//! commit order, delivery reports back to the ack tracker (DESIGN.md §6).
//!
//! * [`KafkaSettings`]: librdkafka properties from `[kafka]`, with the
//!   relay's required settings (`enable.idempotence=true`, `acks=all`,
//!   `partitioner=murmur2_random`) enforced and secrets redacted.
//! * [`KafkaSink`]: `send` an [`OutboxEvent`](crate::outbox::OutboxEvent) with
//!   an opaque token; a [`DeliveryReport`] with that token arrives on the
//!   channel returned by [`KafkaSink::new`] once Kafka acknowledged (or
//!   definitively failed) the record.
//! * [`SinkError`]: keeps the librdkafka code, the topic and the event id;
//!   its one [`disposition`](SinkError::disposition) decides what the pipeline does.
//! * [`TopicSettings`]: the `[topics]` section. Before the first record to a
//!   topic the sink checks that it exists, creates it when `create = true`,
//!   and otherwise refuses the record with [`SinkError::TopicMissing`].
//! * [`check_reachable`]: metadata fetch for `outbox-cdc check`.
//! * [`java_partition`]: where the Java client (and librdkafka's
//!   `murmur2_random`) puts a key.
//!
//! The pipeline's contract with the sink: a failed report (of any class)
//! means order is at risk, so the pipeline stops without acknowledging
//! anything at or after the failed record, and resumes from the durable acked
//! LSN (DESIGN.md §6). Nothing after a failed record is acknowledged to
//! PostgreSQL, so everything after it is produced again: duplicates, never gaps.

mod check;
mod client_error;
mod client_log;
mod error;
mod partition;
mod producer;
mod settings;
mod topics;
mod transactional;

#[cfg(test)]
mod tests;

pub(crate) use check::MetadataProbe;
pub(crate) use check::refuse_rejected_security;
pub use check::{BrokerInfo, check_reachable};
pub use error::SinkError;
pub use partition::{java_partition, murmur2};
pub use producer::{Delivered, DeliveryReport, KafkaSink};
pub use settings::{DEFAULT_MESSAGE_TIMEOUT_MS, KafkaSettings};
pub use topics::{DEFAULT_PARTITIONS, DEFAULT_REPLICATION_FACTOR, TopicSettings};
pub use transactional::{
    Marker, MarkerRole, TransactionalSink, read_committed_config, read_marker, transactional_id,
};
