//! Exactly-once delivery's edges on the real servers, in-process: poison
//! records and dead letters go through the same Kafka transactions (a record
//! the mapper refuses, and one the broker refuses, which aborts its whole
//! transaction and replays it), and a PostgreSQL transaction too large for one
//! Kafka transaction stops the connector naming the limits, with nothing of
//! it visible or acknowledged. The crash, fencing and lost-store cases need
//! the binary's crash points: tests/exactly_once.rs.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::relay::{Fixture, Running, consume, read_records};
use common::{create_topic, unique_name};
use outbox_cdc::pipeline::PipelineError;

const TIMEOUT: Duration = Duration::from_secs(90);

/// The fixture's environment overrides for exactly-once mode, its own offsets topic.
fn exactly_once(extra: &str) -> String {
    format!(
        "OUTBOX_CDC__DELIVERY__MODE=exactly-once OUTBOX_CDC__DELIVERY__OFFSETS_TOPIC={} \
         OUTBOX_CDC__DELIVERY__MAX_BATCH_MS=50 {extra}",
        unique_name("eo_offsets")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_broker_refusals_go_through_the_transactions() {
    common::init_tracing();
    let fx = Fixture::new("eo_dlq").await;
    let main_topic = format!("{}.order", fx.topic_prefix);
    let dlq_topic = format!("{}.dlq", fx.topic_prefix);
    // The main topic takes records of at most 3000 bytes: the broker refuses
    // a 5000-byte record the mapper lets through (max_record_bytes 20000).
    create_topic(&main_topic, 3, &[("max.message.bytes", "3000")]).await;
    let env = exactly_once(&format!(
        "OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={dlq_topic} \
         OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=20000"
    ));
    let running = Running::start(fx.config_with(&env)).await;
    let small = |n: usize| format!(r#"{{"n": {n}}}"#);
    let blob = |n: usize| format!(r#"{{"blob": "{}"}}"#, "x".repeat(n));
    let (main, dlq) = (main_topic.as_str(), dlq_topic.as_str());
    let mut expected: Vec<(String, &str)> = Vec::new();
    // The broker refuses a whole partition's batch: the refused aggregate
    // gets a partition of its own here, so that only its record is refused
    // (with a shared partition its neighbours would be refused, and parked,
    // too: docs/operations.md, "Poison event").
    let partition = |key: &str| outbox_cdc::sink::java_partition(key.as_bytes(), 3);
    let c1 = (0..100)
        .map(|i| format!("c{i}"))
        .find(|k| partition(k) != partition("a1") && partition(k) != partition("b1"))
        .expect("a key on another partition");
    let c1 = c1.as_str();
    let mut write = async |row: (&str, String), topic| {
        let ids = fx.write_tx(&[("order", row.0, row.1)], true).await;
        expected.push((ids[0].clone(), topic));
    };
    write(("a1", small(1)), main).await;
    // Refused by the mapper (over max_record_bytes): dead-lettered at once,
    // in the open Kafka transaction.
    write(("a1", blob(30_000)), dlq).await;
    write(("b1", small(2)), main).await;
    // Refused by the broker: the Kafka transaction holding it (and whatever
    // else it carried) aborts, the aggregate is parked, and the stream
    // replays from the last commit.
    write((c1, blob(5_000)), dlq).await;
    write((c1, small(3)), dlq).await;
    write(("b1", small(4)), main).await;

    let records = consume(
        &fx.topic_prefix,
        expected.len(),
        TIMEOUT,
        Duration::from_secs(3),
    );
    running.stop().await.expect("clean stop");
    let mut copies: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &records {
        copies
            .entry(r.header("event_id"))
            .or_default()
            .push(r.topic.as_str());
    }
    for (id, topic) in &expected {
        let got = copies.get(id.as_str()).cloned().unwrap_or_default();
        assert_eq!(
            got,
            vec![*topic],
            "event {id}: read_committed saw {got:?}; records: {records:#?}"
        );
    }
    assert_eq!(records.len(), expected.len(), "nothing else: {records:#?}");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_too_large_for_one_kafka_transaction_stops_naming_the_limits() {
    common::init_tracing();
    let fx = Fixture::new("eo_large").await;
    // One Kafka transaction may stay open 750 ms (3/4 of 1000), and five
    // records in flight make 5,000 records take longer than that.
    let env = exactly_once(
        "OUTBOX_CDC__DELIVERY__TRANSACTION_TIMEOUT_MS=1000 OUTBOX_CDC__LIMITS__MAX_IN_FLIGHT_EVENTS=5",
    );
    let running = Running::start(fx.config_with(&env)).await;
    let small = fx.write_tx(&[("order", "s1", "{}".into())], true).await;
    consume(&fx.topic_prefix, 1, TIMEOUT, Duration::from_millis(500));
    let before = fx.confirmed_lsn().await;
    fx.admin
        .batch_execute(&format!(
            "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
             SELECT gen_random_uuid(), 'order', 'big' || (i % 50), i, 'TestEvent', '{{}}'::jsonb
               FROM generate_series(1, 5000) AS i",
            t = fx.table
        ))
        .await
        .expect("one large transaction");
    let end = fx.wal_insert_lsn().await;
    let err = running
        .finished(TIMEOUT)
        .await
        .expect_err("the connector stops");
    assert!(
        matches!(err, PipelineError::TransactionTooLarge { .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("delivery.transaction_timeout_ms")
            && text.contains("transaction.max.timeout.ms"),
        "names the limits to raise: {text}"
    );
    let read = read_records(
        &fx.topic_prefix,
        5001,
        Duration::from_secs(8),
        Duration::ZERO,
    )
    .expect_err("fewer than 5001 records are visible");
    let ids: Vec<&str> = read.iter().map(|r| r.header("event_id")).collect();
    assert_eq!(
        ids,
        vec![small[0].as_str()],
        "nothing of the large transaction is visible to read_committed"
    );
    let confirmed = fx.confirmed_lsn().await;
    assert!(
        confirmed >= before && confirmed < end,
        "the slot was not confirmed past the large transaction ({confirmed}, it ended by {end})"
    );
    fx.cleanup().await;
}
