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
    /// The aggregate's sequence number (the `aggregate_sequence` column or
    /// envelope field read as a number), whatever headers are configured:
    /// live gap detection follows it. `None`: no such column, NULL, or not
    /// a number.
    pub aggregate_sequence: Option<i64>,
    /// WAL position of the change that produced this event.
    pub lsn: Lsn,
    /// An explicit partition (Debezium's `partition` placement); `None`: the
    /// producer's partitioner picks it from the key.
    pub partition: Option<i32>,
    /// Trace context values of the row left out of the headers because they
    /// are not valid (counted by the session).
    pub trace_dropped: super::TraceDropped,
}

impl OutboxEvent {
    /// What Kafka counts against `message.max.bytes`: key, value and headers
    /// with their varint framing, plus the record's own overhead (an upper
    /// estimate of librdkafka's `rd_kafka_msg_max_wire_size`; the topic name
    /// is not part of the record).
    pub fn wire_size(&self) -> usize {
        /// Length, attributes, timestamp, offset, key/value lengths, header
        /// count: varints at their widest.
        const RECORD_OVERHEAD: usize = 40;
        /// Two varint lengths per header.
        const HEADER_OVERHEAD: usize = 10;
        RECORD_OVERHEAD
            + self.key.len()
            + self.payload.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| HEADER_OVERHEAD + k.len() + v.len())
                .sum::<usize>()
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_size_counts_what_kafka_counts() {
        let event = |topic: &str| OutboxEvent {
            topic: topic.into(),
            key: Bytes::from_static(b"k1"),
            payload: Bytes::from_static(b"{}"),
            headers: vec![(Cow::Borrowed("event_id"), Bytes::from_static(b"e"))],
            timestamp_ms: 0,
            event_id: "e".into(),
            aggregate_type: "t".into(),
            aggregate_sequence: None,
            aggregate_id: "k1".into(),
            lsn: Lsn::ZERO,
            partition: None,
            trace_dropped: Default::default(),
        };
        // The topic is not part of the record.
        assert_eq!(event("a").wire_size(), event(&"a".repeat(200)).wire_size());
        // key 2 + value 2 + header (10 + 8 + 1) + record overhead 40.
        assert_eq!(event("a").wire_size(), 2 + 2 + 19 + 40);
    }
}
