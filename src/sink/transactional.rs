//! Exactly-once delivery (`[delivery] mode = "exactly-once"`, DESIGN.md §14):
//! the transactional producer and the marker records.
//!
//! One Kafka transaction carries one or more whole PostgreSQL transactions and
//! ends with one marker record in a compacted offsets topic, keyed by the
//! cluster's system identifier and the slot, whose value is the end LSN of
//! the batch's last PostgreSQL transaction. The marker commits or aborts with
//! the events, so the last committed marker is exactly how far a
//! `read_committed` consumer has seen: after any crash the relay resumes after
//! max(its stored offset, that marker), and nothing is published twice.
//!
//! Order of a start (each step needs the one before): `init_transactions`
//! (it fences any older producer with the same transactional id and completes
//! or aborts its open transaction), then [`read_marker`] (with
//! `read_committed`, now that no transaction of ours is undecided).
//!
//! The blocking calls (`init`, `commit`, `abort`, `read_marker`) wait on the
//! network: call them from `block_in_place` or the blocking pool.

use std::borrow::Cow;
use std::ffi::CStr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::ClientConfig;
use rdkafka::bindings::{
    rd_kafka_commit_transaction, rd_kafka_error_code, rd_kafka_error_destroy, rd_kafka_error_string,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;

use super::error::{SinkError, retryable_code};
use super::partition::java_partition;
use super::producer::KafkaSink;
use super::settings::KafkaSettings;
use super::topics::TopicSettings;

/// The longest one step of [`TransactionalSink::init_transactions_yielding`]
/// blocks.
const INIT_STEP: Duration = Duration::from_millis(500);
use crate::outbox::OutboxEvent;
use crate::pg::{Lsn, PgTimestamp};
use tracing::debug;

/// The transactional id of one slot of one cluster: stable across restarts,
/// unique per slot, so a second instance of the same stream fences the first.
pub fn transactional_id(system_id: &str, slot: &str) -> String {
    format!("outbox-cdc.{system_id}.{slot}")
}

/// Where a committed batch ended: what the marker record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub system_id: String,
    pub slot: String,
    /// The end LSN of the last PostgreSQL transaction in the batch.
    pub lsn: Lsn,
    /// That transaction's commit time (what gap repair starts from).
    pub commit_time: Option<PgTimestamp>,
}

impl Marker {
    /// The record key: one key per stream, so compaction keeps the last.
    pub fn key(system_id: &str, slot: &str) -> String {
        format!("{system_id}/{slot}")
    }

    fn value(&self) -> String {
        serde_json::json!({
            "system_id": self.system_id,
            "slot": self.slot,
            "lsn": self.lsn.to_string(),
            "commit_time_us": self.commit_time.map(|t| t.0),
        })
        .to_string()
    }

    /// Reads a marker value; `None` when it is not one of ours.
    fn parse(value: &[u8]) -> Option<Marker> {
        let v: serde_json::Value = serde_json::from_slice(value).ok()?;
        Some(Marker {
            system_id: v.get("system_id")?.as_str()?.to_owned(),
            slot: v.get("slot")?.as_str()?.to_owned(),
            lsn: v.get("lsn")?.as_str()?.parse().ok()?,
            commit_time: v
                .get("commit_time_us")
                .and_then(serde_json::Value::as_i64)
                .map(PgTimestamp),
        })
    }
}

/// Which end of a Kafka transaction a marker record is at (its `marker`
/// header). A transaction opens with a marker repeating the position before
/// it, which puts the offsets partition into the transaction early, and
/// closes with the marker of its last PostgreSQL commit. Readers take the
/// last marker of a stream, which is always a closing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerRole {
    Opening,
    Closing,
}

impl MarkerRole {
    /// The value of the record's `marker` header.
    pub fn as_str(self) -> &'static str {
        match self {
            MarkerRole::Opening => "opening",
            MarkerRole::Closing => "closing",
        }
    }
}

/// A transaction step's error, with what the relay needs to decide.
fn transaction_error(op: &'static str, err: KafkaError, transactional_id: &str) -> SinkError {
    let (code, reason) = match &err {
        KafkaError::Transaction(e) => (e.code(), e.string()),
        other => (
            other.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
            other.to_string(),
        ),
    };
    SinkError::Transaction {
        op,
        code,
        reason,
        transactional_id: transactional_id.to_owned(),
    }
}

/// A transactional producer (`[delivery] mode = "exactly-once"`): a
/// [`KafkaSink`] with a transactional id. Transactions exist only on this
/// type, so one cannot be begun on the idempotent producer of at-least-once
/// delivery:
///
/// ```compile_fail,E0599
/// fn begin(sink: &outbox_cdc::sink::KafkaSink<()>) {
///     let _ = sink.begin_transaction();
/// }
/// ```
///
/// It sends records like any sink (it dereferences to one).
pub struct TransactionalSink<T: Send + 'static> {
    sink: KafkaSink<T>,
    transactional_id: String,
}

impl<T: Send + 'static> std::ops::Deref for TransactionalSink<T> {
    type Target = KafkaSink<T>;

    fn deref(&self) -> &KafkaSink<T> {
        &self.sink
    }
}

impl<T: Send + 'static> TransactionalSink<T> {
    /// A transactional producer with `transactional_id` and `timeout` as its
    /// `transaction.timeout.ms`. Call [`init_transactions`](Self::init_transactions)
    /// before anything else.
    pub fn new(
        settings: &KafkaSettings,
        topics: &TopicSettings,
        transactional_id: &str,
        timeout: Duration,
    ) -> Result<
        (
            TransactionalSink<T>,
            tokio::sync::mpsc::UnboundedReceiver<super::DeliveryReport<T>>,
        ),
        SinkError,
    > {
        let (sink, reports) =
            KafkaSink::create(settings, topics, Some((transactional_id, timeout)))?;
        let sink = TransactionalSink {
            sink,
            transactional_id: transactional_id.to_owned(),
        };
        Ok((sink, reports))
    }

    fn id(&self) -> &str {
        &self.transactional_id
    }

    /// Registers the transactional id with its coordinator: fences older
    /// producers with the same id and completes or aborts their open
    /// transaction. Blocking.
    pub fn init_transactions(&self, timeout: Duration) -> Result<(), SinkError> {
        self.sink
            .producer
            .init_transactions(timeout)
            .map_err(|e| transaction_error("init", e, self.id()))
    }

    /// [`Self::init_transactions`] in steps of at most [`INIT_STEP`],
    /// pausing 50 ms between them, so that a caller raced against a stop (the
    /// start of a session) can leave while the coordinator does not answer
    /// (Kafka down): one call would hold the thread for the whole
    /// `timeout`. librdkafka documents a timed-out init as retriable, the
    /// next call resuming the one under way. Needs the multi-thread runtime.
    pub async fn init_transactions_yielding(&self, timeout: Duration) -> Result<(), SinkError> {
        let deadline = Instant::now() + timeout;
        loop {
            let step = deadline
                .saturating_duration_since(Instant::now())
                .min(INIT_STEP);
            match tokio::task::block_in_place(|| self.init_transactions(step)) {
                // Retriable, and what a longer call would have waited out.
                Err(SinkError::Transaction {
                    code:
                        RDKafkaErrorCode::OperationTimedOut
                        | RDKafkaErrorCode::CoordinatorNotAvailable
                        | RDKafkaErrorCode::ConcurrentTransactions,
                    ..
                }) if Instant::now() < deadline => {
                    // A pause, not a spin, should one return at once.
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                done => return done,
            }
        }
    }

    pub fn begin_transaction(&self) -> Result<(), SinkError> {
        self.sink
            .producer
            .begin_transaction()
            .map_err(|e| transaction_error("begin", e, self.id()))
    }

    /// Flushes the transaction's records and commits it. Blocking. After an
    /// error the transaction's outcome may be unknown (a timeout): the
    /// caller ends the session, and the next producer's `init_transactions`
    /// settles it; the marker then says which way.
    ///
    /// librdkafka's commit is called directly: rust-rdkafka's
    /// `commit_transaction` first flushes by polling the main queue in steps
    /// of up to 100 ms, and with the producer's polling thread taking the
    /// delivery reports from that queue each step waited its full 100 ms
    /// (measured: every Kafka transaction took about 100 ms longer, 9,116
    /// events/s against 112,461 at least once). librdkafka's commit flushes
    /// by itself while the polling thread serves the reports.
    pub fn commit_transaction(&self, timeout: Duration) -> Result<(), SinkError> {
        let client = self.sink.producer.client();
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the handle is the live client of this producer (borrowed
        // for the call); librdkafka returns NULL or an error object that we
        // own and destroy below, after reading its code and string.
        let error = unsafe { rd_kafka_commit_transaction(client.native_ptr(), timeout_ms) };
        if error.is_null() {
            return Ok(());
        }
        // SAFETY: `error` is a valid, not yet destroyed error object;
        // rd_kafka_error_string returns a NUL-terminated string it owns.
        let (code, reason) = unsafe {
            let code = RDKafkaErrorCode::from(rd_kafka_error_code(error));
            let reason = CStr::from_ptr(rd_kafka_error_string(error))
                .to_string_lossy()
                .into_owned();
            rd_kafka_error_destroy(error);
            (code, reason)
        };
        Err(SinkError::Transaction {
            op: "commit",
            code,
            reason,
            transactional_id: self.id().to_owned(),
        })
    }

    /// Aborts the open transaction (its records stay invisible to
    /// `read_committed` consumers). Blocking.
    pub fn abort_transaction(&self, timeout: Duration) -> Result<(), SinkError> {
        self.sink
            .producer
            .abort_transaction(timeout)
            .map_err(|e| transaction_error("abort", e, self.id()))
    }

    /// Makes sure the offsets topic exists (creating it compacted); returns
    /// the partition `marker`s of this stream go to.
    pub async fn offsets_partition(&self, topic: &str, key: &str) -> Result<i32, SinkError> {
        let partitions = self.sink.topics.ensure_compacted(topic).await?;
        Ok(java_partition(
            key.as_bytes(),
            i32::try_from(partitions).unwrap_or(i32::MAX),
        ))
    }

    /// Adds the marker to the open transaction.
    pub async fn send_marker(
        &self,
        topic: &str,
        partition: i32,
        marker: &Marker,
        role: MarkerRole,
    ) -> Result<(), SinkError> {
        let key = Marker::key(&marker.system_id, &marker.slot);
        let record = OutboxEvent {
            topic: topic.to_owned(),
            key: Bytes::from(key.clone()),
            payload: Bytes::from(marker.value()),
            headers: vec![
                (Cow::Borrowed("lsn"), Bytes::from(marker.lsn.to_string())),
                (
                    Cow::Borrowed("marker"),
                    Bytes::from_static(role.as_str().as_bytes()),
                ),
            ],
            timestamp_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            event_id: format!("{} marker {key} {}", role.as_str(), marker.lsn),
            aggregate_type: String::new(),
            aggregate_id: String::new(),
            aggregate_sequence: None,
            lsn: marker.lsn,
            partition: Some(partition),
            trace_dropped: Default::default(),
        };
        self.sink
            .send_record(&record, None)
            .await
            .map_err(|(e, _)| e)
    }
}

/// Between two reads of the end offsets while the brokers come back.
const WATERMARKS_PAUSE: Duration = Duration::from_millis(200);

/// The last committed marker of `system_id`/`slot` in the offsets topic,
/// read with `read_committed` to the partition's end as it is now. Blocking
/// (bounded by `timeout`). Call after `init_transactions`: an undecided
/// transaction of ours would hold the end back until it times out.
///
/// A broker that is unreachable or electing a leader is waited for until
/// `timeout` (the consumer reconnects by itself), then reported as a
/// [`SinkError::OffsetsTopicUnavailable`], which retries; only a record with this
/// stream's key that is not a marker, or a code no retry cures (a denied
/// ACL), needs an operator.
pub fn read_marker(
    settings: &KafkaSettings,
    topic: &str,
    partition: i32,
    system_id: &str,
    slot: &str,
    timeout: Duration,
) -> Result<Option<Marker>, SinkError> {
    let failed = |what: &str, e: KafkaError| {
        SinkError::offsets_topic(topic, format!("{what}: {e}"), e.rdkafka_error_code())
    };
    let consumer: BaseConsumer =
        consumer_config(settings)
            .create()
            .map_err(|e| SinkError::OffsetsTopicRefused {
                topic: topic.to_owned(),
                reason: format!("cannot create its reader from [kafka]: {e}"),
            })?;
    let deadline = Instant::now() + timeout;
    // Brokers coming back answer with stale metadata (the partition
    // "unknown" until its leader is known again) for a moment: asked again
    // until the deadline; what is still wrong then is reported as it is.
    let (low, high) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_watermarks(topic, partition, left) {
            Ok(ends) => break ends,
            Err(e)
                if Instant::now() + WATERMARKS_PAUSE < deadline
                    && e.rdkafka_error_code().is_some_and(|code| {
                        retryable_code(code)
                            || matches!(
                                code,
                                RDKafkaErrorCode::UnknownPartition
                                    | RDKafkaErrorCode::UnknownTopicOrPartition
                            )
                    }) =>
            {
                debug!(topic, partition, error = %e, "offsets topic: end offsets not readable yet; asking again");
                std::thread::sleep(WATERMARKS_PAUSE);
            }
            Err(e) => {
                return Err(failed(
                    &format!("reading the end offsets of partition {partition}"),
                    e,
                ));
            }
        }
    };
    if high <= low {
        return Ok(None);
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Beginning)
        .map_err(|e| failed("assigning it", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| failed("assigning it", e))?;
    let key = Marker::key(system_id, slot);
    let mut last = None;
    // The last transient error the consumer reported: it reconnects by
    // itself, so it only matters if the deadline passes.
    let mut transient: Option<KafkaError> = None;
    // The end is `high` as read above: commit and abort markers occupy
    // offsets too, so the position (not the last record seen) says when the
    // reader is past it.
    while position(&consumer, topic, partition).is_none_or(|p| p < high) {
        if Instant::now() >= deadline {
            let at = position(&consumer, topic, partition);
            let reason = match &transient {
                Some(e) => format!(
                    "could not read partition {partition} to offset {high} within {timeout:?} \
                     (at {at:?}); the last error: {e}"
                ),
                None => format!(
                    "could not read partition {partition} to offset {high} within {timeout:?} \
                     (at {at:?}): a transaction of another producer may be open on it"
                ),
            };
            return Err(SinkError::OffsetsTopicUnavailable {
                topic: topic.to_owned(),
                reason,
            });
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.key() == Some(key.as_bytes()) => {
                let value = m.payload().unwrap_or_default();
                let marker = Marker::parse(value).ok_or_else(|| SinkError::OffsetsTopicRefused {
                    topic: topic.to_owned(),
                    reason: format!(
                        "the record at partition {partition} offset {} has this stream's key {key:?} \
                         but is not a marker ({:?}); remove it (produce a tombstone for the key only \
                         if the stream should start over) and restart",
                        m.offset(),
                        String::from_utf8_lossy(value)
                    ),
                })?;
                last = Some(marker);
            }
            Some(Ok(_)) | None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) if e.rdkafka_error_code().is_some_and(retryable_code) => {
                debug!(topic, partition, error = %e, "offsets topic: transient read error; the reader reconnects");
                transient = Some(e);
            }
            Some(Err(e)) => return Err(failed("reading it", e)),
        }
    }
    Ok(last)
}

fn position(consumer: &BaseConsumer, topic: &str, partition: i32) -> Option<i64> {
    let list = consumer.position().ok()?;
    match list.find_partition(topic, partition)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// A consumer configuration with the connection and security settings of
/// `[kafka]` (the producer's settings left out), reading committed records
/// only, committing no offsets. The caller names its group.
pub fn read_committed_config(settings: &KafkaSettings) -> ClientConfig {
    const CONNECTION: [&str; 7] = [
        "bootstrap.servers",
        "security.",
        "ssl.",
        "sasl.",
        "socket.",
        "broker.",
        "client.",
    ];
    let mut client = ClientConfig::new();
    for (key, value) in settings.iter() {
        if CONNECTION
            .iter()
            .any(|p| key == *p || (p.ends_with('.') && key.starts_with(p)))
        {
            client.set(key, value);
        }
    }
    client
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    client
}

fn consumer_config(settings: &KafkaSettings) -> ClientConfig {
    let mut client = read_committed_config(settings);
    client
        .set("group.id", "outbox-cdc-marker-reader")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 50 F6 (a): with the transaction coordinator out of reach (the
    /// only broker down), the init waits out its timeout; a caller racing
    /// it against a stop leaves between two steps (one call held the thread
    /// for the whole timeout, so the stop waited as long).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_init_lets_a_stop_in_between_its_steps() {
        let cluster = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
        let mut settings = KafkaSettings::new();
        settings.set("bootstrap.servers", cluster.bootstrap_servers());
        cluster.broker_down(1).expect("broker down");
        let (sink, _reports) = TransactionalSink::<u64>::new(
            &settings,
            &TopicSettings::default(),
            "init-steps",
            Duration::from_secs(60),
        )
        .expect("producer");
        let started = Instant::now();
        let outcome = tokio::select! {
            done = sink.init_transactions_yielding(Duration::from_secs(20)) => Some(done),
            () = tokio::time::sleep(Duration::from_secs(1)) => None,
        };
        let took = started.elapsed();
        assert!(outcome.is_none(), "the init ended first: {outcome:?}");
        assert!(
            took < Duration::from_secs(3),
            "the stop came after {took:?}"
        );
    }

    #[test]
    fn marker_values_round_trip_and_strangers_are_not_markers() {
        let m = Marker {
            system_id: "7312".into(),
            slot: "outbox_cdc".into(),
            lsn: Lsn::new(0x1_0000_00A0),
            commit_time: Some(PgTimestamp(849_000_000_123)),
        };
        assert_eq!(Marker::parse(m.value().as_bytes()), Some(m.clone()));
        assert_eq!(Marker::key("7312", "outbox_cdc"), "7312/outbox_cdc");
        assert_eq!(Marker::parse(b"{\"lsn\":\"0/1\"}"), None);
        assert_eq!(Marker::parse(b"not json"), None);
        assert_ne!(
            transactional_id("7312", "a"),
            transactional_id("7312", "b"),
            "one id per slot"
        );
    }
}
