//! The record the relay publishes: the output of outbox mapping, the input of the sink.

use bytes::Bytes;
use std::borrow::Cow;

use crate::pg::Lsn;

/// One outbox event, ready to be produced to Kafka.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEvent {
    /// Kafka topic, already rendered from the template and validated.
    pub topic: String,
    /// Record key: the aggregate id (same key → same partition → per-aggregate order).
    pub key: Bytes,
    /// Record value: the payload exactly as stored (JSON text).
    pub payload: Bytes,
    /// Record headers, in a stable order (`event_id` first).
    pub headers: Vec<(Cow<'static, str>, Bytes)>,
    /// Record timestamp: the transaction's commit time, Unix milliseconds.
    pub timestamp_ms: i64,
    /// The immutable event id (consumers dedupe on it); also used in error messages.
    pub event_id: String,
    /// Aggregate identity, used for parking poison aggregates and in error messages.
    pub aggregate_type: String,
    pub aggregate_id: String,
    /// WAL position of the change that produced this event.
    pub lsn: Lsn,
}

impl OutboxEvent {
    /// Approximate bytes this record holds in memory and on the wire (for in-flight limits).
    pub fn size_bytes(&self) -> usize {
        self.topic.len()
            + self.key.len()
            + self.payload.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}
