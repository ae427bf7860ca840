//! The Kafka sink against the real test broker (OUTBOX_CDC_TEST_KAFKA):
//! what the sink produces is what a consumer reads, on the partition the Java
//! client would choose, in send order per key; an oversized record fails alone
//! as poison.

use crate::common;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use outbox_cdc::Disposition;
use outbox_cdc::outbox::OutboxEvent;
use outbox_cdc::pg::Lsn;
use outbox_cdc::sink::{
    Delivered, DeliveryReport, KafkaSettings, KafkaSink, SinkError, java_partition,
};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, Timestamp, TopicPartitionList};
use tokio::sync::mpsc::UnboundedReceiver;

const WAIT: Duration = Duration::from_secs(60);

fn sink_settings() -> KafkaSettings {
    let mut settings = KafkaSettings::new();
    settings.set("bootstrap.servers", common::kafka_bootstrap());
    settings
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn event(
    topic: &str,
    key: &str,
    seq: usize,
    i: usize,
    payload: String,
    base_ts: i64,
) -> OutboxEvent {
    let event_id = format!("00000000-0000-4000-8000-{i:012}");
    let lsn = Lsn::new(0x1_0000_0000 + i as u64 * 64);
    OutboxEvent {
        topic: topic.to_owned(),
        key: Bytes::from(key.to_owned()),
        payload: Bytes::from(payload),
        headers: vec![
            (Cow::Borrowed("event_id"), Bytes::from(event_id.clone())),
            (
                Cow::Borrowed("event_type"),
                Bytes::from_static(b"OrderPlaced"),
            ),
            (
                Cow::Borrowed("aggregate_type"),
                Bytes::from_static(b"order"),
            ),
            (Cow::Borrowed("aggregate_id"), Bytes::from(key.to_owned())),
            (
                Cow::Borrowed("aggregate_sequence"),
                Bytes::from(seq.to_string()),
            ),
            (Cow::Borrowed("schema_version"), Bytes::from_static(b"1")),
            (Cow::Borrowed("lsn"), Bytes::from(lsn.to_string())),
        ],
        // In the past: Kafka 4 refuses timestamps too far in the future by default.
        timestamp_ms: base_ts + i as i64,
        event_id,
        aggregate_type: "order".to_owned(),
        aggregate_id: key.to_owned(),
        aggregate_sequence: None,
        lsn,
        partition: None,
        trace_dropped: Default::default(),
    }
}

async fn next_report<T>(rx: &mut UnboundedReceiver<DeliveryReport<T>>) -> DeliveryReport<T> {
    match tokio::time::timeout(WAIT, rx.recv()).await {
        Ok(Some(report)) => report,
        Ok(None) => panic!("delivery report channel closed"),
        Err(_) => panic!("no delivery report within {WAIT:?}"),
    }
}

fn consumer_from_beginning(topic: &str, partitions: i32) -> StreamConsumer {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_bootstrap())
        .set("group.id", common::unique_name("sink_test_group"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .expect("assignment");
    }
    consumer.assign(&assignment).expect("assign");
    consumer
}

fn high_watermarks(consumer: &StreamConsumer, topic: &str, partitions: i32) -> i64 {
    (0..partitions)
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
            high - low
        })
        .sum()
}

#[tokio::test]
async fn records_arrive_once_on_the_java_partition_in_send_order() {
    common::init_tracing();
    const PARTITIONS: i32 = 6;
    const EVENTS: usize = 1000;
    const KEYS: usize = 50;
    let topic = common::unique_name("sink_test");
    common::create_topic(&topic, PARTITIONS, &[]).await;

    let base_ts = now_ms() - 86_400_000;
    let mut sequences = vec![0usize; KEYS];
    let events: Vec<OutboxEvent> = (0..EVENTS)
        .map(|i| {
            let k = (i * 7) % KEYS;
            sequences[k] += 1;
            let key = format!("order-{k}");
            let payload = format!(
                r#"{{"order_id":"{key}","n":{i},"items":[{{"sku":"s-{k}","qty":{}}}]}}"#,
                i % 5 + 1
            );
            event(&topic, &key, sequences[k], i, payload, base_ts)
        })
        .collect();

    let (sink, mut rx) = KafkaSink::<usize>::new(&sink_settings()).expect("sink");
    for (i, e) in events.iter().enumerate() {
        sink.send(e, i)
            .await
            .unwrap_or_else(|err| panic!("send {i}: {err}"));
    }
    let mut delivered: BTreeMap<usize, Delivered> = BTreeMap::new();
    for _ in 0..EVENTS {
        let report = next_report(&mut rx).await;
        let d = report
            .result
            .unwrap_or_else(|e| panic!("event {} not delivered: {e}", report.token));
        assert!(
            delivered.insert(report.token, d).is_none(),
            "token {} twice",
            report.token
        );
    }
    assert_eq!(delivered.len(), EVENTS);
    let sink = std::sync::Arc::new(sink);
    let flushing = std::sync::Arc::clone(&sink);
    tokio::task::spawn_blocking(move || flushing.flush(WAIT))
        .await
        .expect("flush task")
        .expect("flush");
    assert_eq!(sink.in_flight(), 0);

    // Per key, offsets follow send order, on the Java client's partition.
    let mut last_offset: HashMap<&[u8], i64> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        let d = delivered[&i];
        assert_eq!(d.partition, java_partition(&e.key, PARTITIONS), "event {i}");
        if let Some(prev) = last_offset.insert(&e.key, d.offset) {
            assert!(
                d.offset > prev,
                "event {i}: offset {} after {prev}",
                d.offset
            );
        }
    }

    // Read everything back from the beginning.
    let by_event_id: HashMap<&str, usize> = events
        .iter()
        .enumerate()
        .map(|(i, e)| (e.event_id.as_str(), i))
        .collect();
    let consumer = consumer_from_beginning(&topic, PARTITIONS);
    let mut seen = vec![0u32; EVENTS];
    let mut read = 0usize;
    while read < EVENTS {
        let msg = match tokio::time::timeout(WAIT, consumer.recv()).await {
            Ok(Ok(msg)) => msg,
            // A just-created topic may not be known to the fetcher yet.
            Ok(Err(e))
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Ok(Err(e)) => panic!("consume {topic}: {e}"),
            Err(_) => panic!("only {read} of {EVENTS} records read within {WAIT:?}"),
        };
        read += 1;
        let headers = msg.headers().expect("headers");
        let got_headers: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
            .collect();
        let event_id = got_headers
            .iter()
            .find(|(k, _)| k == "event_id")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .expect("event_id header");
        let i = *by_event_id
            .get(event_id.as_str())
            .unwrap_or_else(|| panic!("unknown event id {event_id}"));
        seen[i] += 1;
        let e = &events[i];
        assert_eq!(msg.key(), Some(e.key.as_ref()), "event {i} key");
        assert_eq!(msg.payload(), Some(e.payload.as_ref()), "event {i} value");
        let want_headers: Vec<(String, Vec<u8>)> = e
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        assert_eq!(got_headers, want_headers, "event {i} headers");
        assert_eq!(
            msg.timestamp(),
            Timestamp::CreateTime(e.timestamp_ms),
            "event {i} timestamp"
        );
        assert_eq!(
            msg.partition(),
            java_partition(&e.key, PARTITIONS),
            "event {i} partition"
        );
        let d = delivered[&i];
        assert_eq!(
            (msg.partition(), msg.offset()),
            (d.partition, d.offset),
            "event {i} position"
        );
    }
    assert!(seen.iter().all(|n| *n == 1), "every record exactly once");
    assert_eq!(
        high_watermarks(&consumer, &topic, PARTITIONS),
        EVENTS as i64,
        "no extra records in the topic"
    );
}

#[tokio::test]
async fn record_larger_than_the_topic_limit_is_refused_and_stops_the_producer() {
    common::init_tracing();
    let topic = common::unique_name("sink_test_small");
    common::create_topic(&topic, 1, &[("max.message.bytes", "2048")]).await;
    let base_ts = now_ms() - 86_400_000;
    let (sink, mut rx) = KafkaSink::<usize>::new(&sink_settings()).expect("sink");

    let sizes = [100usize, 20_000];
    let mut results = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let payload = format!(r#"{{"pad":"{}"}}"#, "p".repeat(*size));
        let e = event(&topic, "order-1", i + 1, i, payload, base_ts);
        sink.send(&e, i)
            .await
            .unwrap_or_else(|err| panic!("send {i}: {err}"));
        let report = next_report(&mut rx).await;
        assert_eq!(report.token, i);
        results.push(report.result);
    }
    assert!(results[0].is_ok(), "{:?}", results[0]);
    let err = results[1].as_ref().expect_err("oversized record refused");
    assert_eq!(err.disposition(), Disposition::RecordRefused, "{err}");
    assert_eq!(
        err.code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge),
        "{err}"
    );
    assert_eq!(err.topic(), Some(topic.as_str()));
    assert_eq!(err.event_id(), Some("00000000-0000-4000-8000-000000000001"));
    // enable.gapless.guarantee: nothing can follow the refused record on this
    // producer (the pipeline recreates it and applies the poison policy).
    assert!(matches!(err, SinkError::Fatal { .. }), "{err}");
    assert!(sink.fatal_error().is_some());

    // A new producer carries on.
    let (sink, mut rx) = KafkaSink::<usize>::new(&sink_settings()).expect("sink");
    let e = event(
        &topic,
        "order-1",
        3,
        2,
        r#"{"pad":"small"}"#.to_owned(),
        base_ts,
    );
    sink.send(&e, 2).await.expect("send after the refusal");
    next_report(&mut rx)
        .await
        .result
        .expect("delivered by a new producer");

    let consumer = consumer_from_beginning(&topic, 1);
    assert_eq!(
        high_watermarks(&consumer, &topic, 1),
        2,
        "only the two small records"
    );
}

/// A healthy start logs no WARN. librdkafka warns (CONFWARN) about every
/// experimental property set, and outbox-cdc sets `enable.gapless.guarantee`
/// on purpose: that warning says nothing an operator can act on. The real
/// binary streams one event through the real broker; its log at level info
/// has no WARN line, and the warning is there at DEBUG, naming the property.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_start_logs_no_warning() {
    common::init_tracing();
    use common::relay::{Fixture, log_of, read_records, spawn_binary_with};
    let fx = Fixture::new("nowarn").await;
    let config = fx.write_config_file();
    let mut child = spawn_binary_with(&config, &[("RUST_LOG", "info,librdkafka=debug")]);
    // A row written before the slot exists would not be streamed.
    fx.wait_for_slot().await;
    let ids = fx
        .write_tx(&[("order", "w1", r#"{"n": 1}"#.to_owned())], true)
        .await;
    let records = read_records(
        &fx.topic_prefix,
        1,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .unwrap_or_else(|_| panic!("the event did not arrive; log:\n{}", log_of(&config)));
    assert_eq!(records[0].header("event_id"), ids[0]);
    child.terminate(Duration::from_secs(30));
    let log = log_of(&config);
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        warnings.is_empty(),
        "a healthy start logged warnings:\n{}\n\nwhole log:\n{log}",
        warnings.join("\n")
    );
    assert!(
        log.lines().any(|l| l.contains(" DEBUG ")
            && l.contains("CONFWARN")
            && l.contains("enable.gapless.guarantee")
            && l.contains("on purpose")),
        "the expected CONFWARN at DEBUG:\n{log}"
    );
    fx.cleanup().await;
}
