//! Sink tests against librdkafka's in-process mock cluster (fast, with broker
//! error injection). The real-broker proof is `tests/it/sink_kafka.rs`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaErrorCode, RDKafkaRespErr};
use tokio::sync::mpsc::UnboundedReceiver;

use super::*;
use crate::Disposition;
use crate::outbox::OutboxEvent;
use crate::pg::Lsn;

const WAIT: Duration = Duration::from_secs(30);

fn mock(partitions: i32, topic: &str) -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(3).expect("mock cluster");
    cluster
        .create_topic(topic, partitions, 3)
        .expect("mock topic");
    cluster
}

fn settings_for(cluster: &MockCluster<'_, DefaultProducerContext>) -> KafkaSettings {
    let mut s = KafkaSettings::new();
    s.set("bootstrap.servers", cluster.bootstrap_servers());
    s
}

fn event(topic: &str, key: &str, i: usize, payload_len: usize) -> OutboxEvent {
    let event_id = format!("evt-{i}");
    OutboxEvent {
        topic: topic.to_owned(),
        key: Bytes::from(key.to_owned()),
        payload: Bytes::from(format!(
            "{{\"i\":{i},\"pad\":\"{}\"}}",
            "x".repeat(payload_len)
        )),
        headers: vec![
            (Cow::Borrowed("event_id"), Bytes::from(event_id.clone())),
            (Cow::Borrowed("aggregate_id"), Bytes::from(key.to_owned())),
        ],
        timestamp_ms: 1_700_000_000_000 + i as i64,
        event_id,
        aggregate_type: "order".to_owned(),
        aggregate_id: key.to_owned(),
        aggregate_sequence: None,
        lsn: Lsn::new(i as u64),
        partition: None,
        trace_dropped: Default::default(),
    }
}

type Reports = UnboundedReceiver<DeliveryReport<usize>>;

/// A sink on the mock cluster, with `extra` producer settings.
fn sink_with(
    cluster: &MockCluster<'_, DefaultProducerContext>,
    extra: &[(&str, &str)],
) -> (KafkaSink<usize>, Reports) {
    let mut settings = settings_for(cluster);
    for (key, value) in extra {
        settings.set(*key, *value);
    }
    KafkaSink::new(&settings).unwrap()
}

/// Sends one record and waits until it is delivered.
async fn deliver(sink: &KafkaSink<usize>, rx: &mut Reports, event: OutboxEvent, token: usize) {
    sink.send(&event, token).await.unwrap();
    collect(rx, 1).await.remove(0).result.unwrap();
}

/// A sink on a new one-partition `topic` that delivered a first record
/// (`token`): the topic check of the first record needs the cluster, later
/// records' do not.
async fn past_first_record(
    topic: &str,
    extra: &[(&str, &str)],
    token: usize,
) -> (
    MockCluster<'static, DefaultProducerContext>,
    KafkaSink<usize>,
    Reports,
) {
    let cluster = mock(1, topic);
    let (sink, mut rx) = sink_with(&cluster, extra);
    deliver(&sink, &mut rx, event(topic, "k", token, 10), token).await;
    (cluster, sink, rx)
}

/// `err` is the producer's fatal error (retried with a new producer) for
/// the event `event_id`.
fn assert_retried_fatal(err: &SinkError, event_id: &str) {
    assert!(matches!(err, SinkError::Fatal { .. }), "{err:?}");
    assert_eq!(err.disposition(), Disposition::Retry, "{err}");
    assert_eq!(err.event_id(), Some(event_id));
}

async fn collect<T>(
    rx: &mut UnboundedReceiver<DeliveryReport<T>>,
    n: usize,
) -> Vec<DeliveryReport<T>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(report)) => out.push(report),
            Ok(None) => panic!("report channel closed after {} of {n} reports", out.len()),
            Err(_) => panic!("timed out after {} of {n} reports", out.len()),
        }
    }
    out
}

/// Makes the producer's client fatal with `code`, as librdkafka does when
/// the idempotent producer breaks.
fn raise_fatal(sink: &KafkaSink<usize>, code: RDKafkaRespErr) {
    let reason = std::ffi::CString::new("injected by test").unwrap();
    // SAFETY: the pointer is the live producer's handle; the reason is a valid C string.
    let raised = unsafe {
        rdkafka::bindings::rd_kafka_test_fatal_error(
            sink.producer().client().native_ptr(),
            code,
            reason.as_ptr(),
        )
    };
    assert_eq!(raised, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
}

/// Asserts every token 0..n arrived once, delivered, and that per key the
/// offsets follow send order. Returns (token → delivery).
fn assert_all_delivered(
    reports: Vec<DeliveryReport<usize>>,
    keys: &[String],
) -> BTreeMap<usize, Delivered> {
    let n = reports.len();
    let mut by_token = BTreeMap::new();
    for r in reports {
        let d = r
            .result
            .unwrap_or_else(|e| panic!("token {} failed: {e}", r.token));
        assert!(
            by_token.insert(r.token, d).is_none(),
            "token {} reported twice",
            r.token
        );
    }
    assert_eq!(
        by_token.keys().copied().collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    let mut last: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for (token, d) in &by_token {
        let key = keys[*token].as_str();
        if let Some(prev) = last.insert((key, d.partition), d.offset) {
            assert!(
                d.offset > prev,
                "key {key}: token {token} at offset {} after {prev}",
                d.offset
            );
        }
    }
    by_token
}

#[tokio::test]
async fn delivers_every_record_with_its_token_in_send_order() {
    let topic = "orders";
    let cluster = mock(4, topic);
    let (sink, mut rx) = sink_with(&cluster, &[]);
    let keys: Vec<String> = (0..300).map(|i| format!("agg-{}", i % 20)).collect();
    for (i, key) in keys.iter().enumerate() {
        sink.send(&event(topic, key, i, 10), i).await.unwrap();
    }
    let reports = collect(&mut rx, keys.len()).await;
    let delivered = assert_all_delivered(reports, &keys);
    for (token, d) in delivered {
        assert_eq!(d.partition, java_partition(keys[token].as_bytes(), 4));
    }
    tokio::task::spawn_blocking(move || sink.flush(WAIT).map(|_| sink.in_flight()))
        .await
        .unwrap()
        .map(|in_flight| assert_eq!(in_flight, 0))
        .unwrap();
}

#[tokio::test]
async fn librdkafka_murmur2_random_lands_on_the_java_partition() {
    let topic = "partitioning";
    let partitions = 7;
    let cluster = mock(partitions, topic);
    let (sink, mut rx) = sink_with(&cluster, &[]);
    let mut keys: Vec<String> = [
        "21",
        "foobar",
        "a-little-bit-long-string",
        "a-little-bit-longer-string",
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
        "abc",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    keys.extend((0..200).map(|i| format!("{i:x}-aggregate-{}", i * 7919)));
    for (i, key) in keys.iter().enumerate() {
        sink.send(&event(topic, key, i, 0), i).await.unwrap();
    }
    let delivered = assert_all_delivered(collect(&mut rx, keys.len()).await, &keys);
    let mut used = HashSet::new();
    for (token, d) in delivered {
        let expected = java_partition(keys[token].as_bytes(), partitions);
        assert_eq!(d.partition, expected, "key {}", keys[token]);
        used.insert(d.partition);
    }
    assert_eq!(
        used.len(),
        partitions as usize,
        "keys should spread over all partitions"
    );
}

#[tokio::test]
async fn not_enough_replicas_is_retried_then_delivered() {
    let topic = "retried";
    let cluster = mock(1, topic);
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ],
    );
    let (sink, mut rx) = sink_with(&cluster, &[("retry.backoff.ms", "10")]);
    let keys: Vec<String> = (0..5).map(|_| "k".to_owned()).collect();
    for (i, key) in keys.iter().enumerate() {
        sink.send(&event(topic, key, i, 10), i).await.unwrap();
    }
    let delivered = assert_all_delivered(collect(&mut rx, keys.len()).await, &keys);
    let offsets: Vec<i64> = delivered.values().map(|d| d.offset).collect();
    assert_eq!(offsets, vec![0, 1, 2, 3, 4], "each record once, in order");
}

#[tokio::test]
async fn broker_message_too_large_is_a_refused_record_that_stops_the_producer() {
    let topic = "too-large";
    let cluster = mock(1, topic);
    let (sink, mut rx) = sink_with(&cluster, &[]);
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    sink.send(&event(topic, "k", 0, 10), 0).await.unwrap();
    let report = collect(&mut rx, 1).await.remove(0);
    assert_eq!(report.token, 0);
    let err = report.result.expect_err("the broker refused the record");
    assert_eq!(err.disposition(), Disposition::RecordRefused, "{err}");
    assert_eq!(err.code(), Some(RDKafkaErrorCode::MessageSizeTooLarge));
    assert_eq!(err.event_id(), Some("evt-0"));
    assert_eq!(err.topic(), Some(topic));
    // enable.gapless.guarantee: a refused record in a batch stops the producer, so
    // no later record of the same partition can be written after the gap.
    assert!(matches!(err, SinkError::Fatal { .. }), "{err}");
    assert!(
        sink.fatal_error().is_some(),
        "the producer must be recreated"
    );
}

#[tokio::test]
async fn record_over_the_producer_limit_is_refused_at_send_as_poison() {
    let topic = "local-limit";
    let cluster = mock(1, topic);
    let (sink, mut rx) = sink_with(&cluster, &[("message.max.bytes", "2000")]);
    let err = sink
        .send(&event(topic, "k", 0, 5000), 0)
        .await
        .expect_err("record larger than message.max.bytes");
    assert!(matches!(err, SinkError::Produce { .. }), "{err:?}");
    assert_eq!(err.disposition(), Disposition::RecordRefused, "{err}");
    assert_eq!(err.code(), Some(RDKafkaErrorCode::MessageSizeTooLarge));
    assert_eq!(err.event_id(), Some("evt-0"));
    // The caller gets its token back (what it carried: the aggregate to park).
    let (err, token) = sink
        .send_or_return(&event(topic, "k", 7, 5000), 7)
        .await
        .expect_err("still too large");
    assert_eq!(
        (err.code(), token),
        (Some(RDKafkaErrorCode::MessageSizeTooLarge), Some(7))
    );
    sink.send(&event(topic, "k", 1, 10), 1).await.unwrap();
    let report = collect(&mut rx, 1).await.remove(0);
    assert_eq!(report.token, 1, "no report for the refused record");
    report.result.unwrap();
}

#[tokio::test]
async fn queue_full_waits_and_still_delivers_everything_in_order() {
    let topic = "queue-full";
    let cluster = mock(3, topic);
    let (sink, mut rx) = sink_with(&cluster, &[("queue.buffering.max.messages", "5")]);
    let keys: Vec<String> = (0..400).map(|i| format!("key-{}", i % 9)).collect();
    let sender = async {
        for (i, key) in keys.iter().enumerate() {
            sink.send(&event(topic, key, i, 50), i).await.unwrap();
        }
    };
    let (_, reports) = tokio::join!(sender, collect(&mut rx, keys.len()));
    assert!(sink.queue_full_waits() > 0, "the test should hit QueueFull");
    let delivered = assert_all_delivered(reports, &keys);
    // Per partition, offsets follow send order (not only per key).
    let mut last: BTreeMap<i32, i64> = BTreeMap::new();
    for d in delivered.values() {
        if let Some(prev) = last.insert(d.partition, d.offset) {
            assert_eq!(d.offset, prev + 1, "partition {}", d.partition);
        }
    }
}

#[tokio::test]
async fn brokers_down_means_waiting_not_failing() {
    // Records never time out (message.timeout.ms=0): with every broker down the
    // record stays in flight, and arrives once a broker is back.
    let topic = "down";
    // Reconnect quickly once the brokers are back (the default backoff grows to 10 s).
    let reconnect = [("reconnect.backoff.max.ms", "200")];
    let (cluster, sink, mut rx) = past_first_record(topic, &reconnect, 6).await;
    for broker in 1..=3 {
        cluster.broker_down(broker).unwrap();
    }
    sink.send(&event(topic, "k", 7, 10), 7).await.unwrap();
    let early = tokio::time::timeout(Duration::from_millis(1500), rx.recv()).await;
    assert!(
        early.is_err(),
        "no report while every broker is down: {early:?}"
    );
    assert_eq!(sink.in_flight(), 1);
    for broker in 1..=3 {
        cluster.broker_up(broker).unwrap();
    }
    let report = collect(&mut rx, 1).await.remove(0);
    assert_eq!(report.token, 7);
    report.result.expect("delivered once a broker is back");
}

#[tokio::test]
async fn fatal_producer_error_requires_a_new_producer() {
    let topic = "fatal";
    let (_cluster, sink, _rx) = past_first_record(topic, &[], 0).await;

    raise_fatal(
        &sink,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
    );

    let fatal = sink.fatal_error().expect("fatal error recorded");
    assert!(
        matches!(fatal, SinkError::Fatal { .. }) && fatal.disposition() == Disposition::Retry,
        "{fatal}"
    );
    assert_eq!(
        fatal.code(),
        Some(RDKafkaErrorCode::OutOfOrderSequenceNumber)
    );

    let err = sink
        .send(&event(topic, "k", 1, 10), 1)
        .await
        .expect_err("a fatal producer refuses new records");
    assert_retried_fatal(&err, "evt-1");
}

#[tokio::test]
async fn check_reachable_counts_brokers() {
    let cluster = mock(1, "check");
    let info = check_reachable(&settings_for(&cluster), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(info.broker_count, 3);
    assert_eq!(info.brokers.len(), 3);
}

#[tokio::test]
async fn check_reachable_fails_retryably_when_nothing_listens() {
    // Bind and drop a listener to get a loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut settings = KafkaSettings::new();
    settings.set("bootstrap.servers", format!("127.0.0.1:{port}"));
    let err = check_reachable(&settings, Duration::from_secs(2))
        .await
        .expect_err("no broker");
    assert!(matches!(err, SinkError::Metadata { .. }), "{err:?}");
    assert_eq!(err.disposition(), Disposition::Retry, "{err:?}");
}

#[test]
fn creation_errors_name_the_key_and_redact_secrets() {
    let cluster = mock(1, "config");
    let mut settings = settings_for(&cluster);
    settings.set("linger.ms", "soon");
    match KafkaSink::<()>::new(&settings).map(|_| ()) {
        Err(SinkError::Config { key, value, .. }) => {
            assert_eq!((key.as_str(), value.as_str()), ("linger.ms", "soon"));
        }
        other => panic!("{other:?}"),
    }

    let mut settings = settings_for(&cluster);
    settings.set("no.such.secret", "hunter2");
    let err = KafkaSink::<()>::new(&settings).map(|_| ()).unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(
        matches!(&err, SinkError::Config { key, .. } if key == "no.such.secret"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");

    let mut settings = settings_for(&cluster);
    settings.set("acks", "1");
    let err = KafkaSink::<()>::new(&settings).map(|_| ()).unwrap_err();
    assert!(
        matches!(&err, SinkError::Config { key, value, .. } if key == "acks" && value == "1"),
        "{err}"
    );
}

#[test]
fn sink_and_its_send_future_can_move_between_threads() {
    fn assert_send_sync<S: Send + Sync>() {}
    fn assert_send<F: Send>(_: &F) {}
    // A token that is Send but not Sync is enough.
    type Token = std::cell::Cell<u64>;
    assert_send_sync::<KafkaSink<Token>>();
    assert_send::<DeliveryReport<Token>>(&DeliveryReport {
        token: Token::new(0),
        result: Ok(Delivered {
            partition: 0,
            offset: 0,
        }),
        reported_at: std::time::Instant::now(),
    });
    let cluster = mock(1, "threads");
    let (sink, _rx) = KafkaSink::<Token>::new(&settings_for(&cluster)).unwrap();
    let e = event("threads", "k", 0, 0);
    let fut = sink.send(&e, Token::new(1));
    assert_send(&fut);
}

#[tokio::test]
async fn records_queued_when_the_producer_turns_fatal_are_reported_fatal() {
    let topic = "fatal-queued";
    let (cluster, sink, mut rx) = past_first_record(topic, &[], 9).await;
    for broker in 1..=3 {
        cluster.broker_down(broker).unwrap();
    }
    for i in 0..3 {
        sink.send(&event(topic, "k", i, 10), i).await.unwrap();
    }
    raise_fatal(&sink, RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED);
    let mut tokens = Vec::new();
    for report in collect(&mut rx, 3).await {
        let err = report.result.expect_err("purged by the fatal error");
        assert_retried_fatal(&err, &format!("evt-{}", report.token));
        tokens.push(report.token);
    }
    // Records purged from the broker's in-flight requests and from the queue
    // may be reported in any order; the ack tracker orders them.
    tokens.sort_unstable();
    assert_eq!(tokens, vec![0, 1, 2]);
}

#[tokio::test]
async fn a_missing_topic_is_refused_at_send_naming_the_topic_and_the_fix() {
    let cluster = mock(1, "present");
    let (sink, mut rx) = sink_with(&cluster, &[]);
    let err = sink
        .send(&event("absent", "k", 0, 10), 0)
        .await
        .expect_err("the topic does not exist and topics.create = false");
    assert!(
        matches!(&err, SinkError::TopicMissing { topic, .. } if topic == "absent"),
        "{err:?}"
    );
    assert_eq!(err.disposition(), Disposition::RecordRefused, "{err}");
    assert_eq!(err.event_id(), Some("evt-0"));
    let text = err.to_string();
    assert!(
        text.contains("kafka-topics.sh") && text.contains("topics.create = true"),
        "the message names the fix: {text}"
    );
    // Asking did not create it, and other topics still work.
    sink.send(&event("present", "k", 1, 10), 1).await.unwrap();
    let report = collect(&mut rx, 1).await.remove(0);
    assert_eq!(report.token, 1, "no report for the refused record");
    report.result.unwrap();
    let again = sink.send(&event("absent", "k", 2, 10), 2).await;
    assert!(
        matches!(again, Err(SinkError::TopicMissing { .. })),
        "{again:?}"
    );
}

/// A topic deleted while records to it are in flight: the report says unknown
/// topic, and that is a refused record naming the topic, never a retry.
#[tokio::test]
async fn a_delivery_report_with_unknown_topic_is_refused_not_retried() {
    let topic = "deleted";
    let cluster = mock(1, topic);
    // Let the producer see the changed metadata quickly.
    let (sink, mut rx) = sink_with(
        &cluster,
        &[
            ("topic.metadata.refresh.interval.ms", "100"),
            ("topic.metadata.propagation.max.ms", "100"),
            ("retry.backoff.ms", "10"),
        ],
    );
    deliver(&sink, &mut rx, event(topic, "k", 0, 10), 0).await;

    cluster
        .topic_error(
            topic,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
        )
        .unwrap();
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART; 50],
    );
    sink.send(&event(topic, "k", 1, 10), 1).await.unwrap();
    let report = collect(&mut rx, 1).await.remove(0);
    assert_eq!(report.token, 1);
    let mut err = report.result.expect_err("the topic is gone");
    if matches!(
        err,
        SinkError::Delivery {
            code: RDKafkaErrorCode::BrokerDestroy,
            ..
        }
    ) {
        // librdkafka can tear the vanished topic's partition down before it
        // fails the record with the topic's error; the record then comes back
        // as `BrokerDestroy` (about 1 run in 20 here). That is a retry, and
        // the retry, like the session's, meets the missing topic.
        assert_eq!(err.disposition(), Disposition::Retry, "{err:?}");
        err = match sink.send(&event(topic, "k", 1, 10), 1).await {
            Err(refused) => refused,
            Ok(()) => collect(&mut rx, 1)
                .await
                .remove(0)
                .result
                .expect_err("the topic is still gone"),
        };
    }
    assert_eq!(err.disposition(), Disposition::RecordRefused, "{err:?}");
    assert_eq!(err.topic(), Some(topic), "{err:?}");
    assert_eq!(err.event_id(), Some("evt-1"), "{err:?}");
    assert!(
        matches!(&err, SinkError::TopicMissing { topic: t, .. } if t == topic),
        "the report is a missing topic, naming it: {err:?}"
    );
}

/// One record in `topic` of the mock cluster (so that the marker reader has
/// an end to read to), with a key that is not any stream's.
async fn one_record(cluster: &MockCluster<'static, DefaultProducerContext>, topic: &str) {
    let (sink, mut rx) = sink_with(cluster, &[]);
    deliver(&sink, &mut rx, event(topic, "other", 1, 10), 1).await;
}

/// Audit F8 (CI seed 1796243835680920946): the exactly-once start met the
/// broker coming back while reading its marker and stopped for good. A broker
/// that is down while the marker is read is a retry; one that comes back
/// within the read's timeout is simply waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_marker_read_waits_for_a_broker_coming_back_and_retries_one_that_stays_down() {
    let topic = "offsets";
    let cluster = mock(1, topic);
    one_record(&cluster, topic).await;
    let mut settings = settings_for(&cluster);
    settings.set("reconnect.backoff.max.ms", "200");
    let read = |settings: &KafkaSettings, timeout| {
        tokio::task::block_in_place(|| read_marker(settings, topic, 0, "7", "s", timeout))
    };

    for broker in 1..=3 {
        cluster.broker_down(broker).unwrap();
    }
    let down = read(&settings, Duration::from_secs(2)).expect_err("every broker is down");
    assert_eq!(down.disposition(), Disposition::Retry, "{down}");

    let reader = std::thread::spawn(move || read_marker(&settings, topic, 0, "7", "s", WAIT));
    std::thread::sleep(Duration::from_secs(1));
    for broker in 1..=3 {
        cluster.broker_up(broker).unwrap();
    }
    let back = reader.join().unwrap();
    assert_eq!(
        back.expect("the brokers came back within the timeout"),
        None
    );
}
