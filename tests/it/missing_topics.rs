//! Topics that do not exist, on a broker that does not create them on first use
//! (`auto.create.topics.enable=false`, as scripts/env.sh runs it): with
//! `[topics] create = true` the connector creates them as configured; without,
//! the record is refused and the poison policy decides (stop, or dead-letter).
//! Never a replay loop.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::relay::{Fixture, Record, Running, consume};
use outbox_cdc::Disposition;
use outbox_cdc::checkpoint::OffsetStore;
use outbox_cdc::pg::Lsn;
use outbox_cdc::pipeline::{PipelineError, RunOptions};
use outbox_cdc::sink::SinkError;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

const TIMEOUT: Duration = Duration::from_secs(90);
/// A missing topic must stop the connector within this (no replay loop).
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// The value of one config of `topic`, as the broker describes it.
async fn topic_config(topic: &str, name: &str) -> Option<String> {
    let bootstrap = common::kafka_bootstrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap_or_else(|e| panic!("admin client for {bootstrap}: {e}"));
    let results = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .unwrap_or_else(|e| panic!("describe configs of {topic}: {e}"));
    let resource = results
        .into_iter()
        .next()
        .expect("one result")
        .unwrap_or_else(|code| panic!("describe configs of {topic}: {code}"));
    resource.get(name).and_then(|entry| entry.value.clone())
}

/// Records by event id; panics on an event published twice.
fn once_each(records: &[Record]) -> BTreeMap<String, &Record> {
    let mut out = BTreeMap::new();
    for r in records {
        let id = r.header("event_id").to_owned();
        if let Some(first) = out.insert(id.clone(), r) {
            panic!("event {id} published twice: {first:?} and {r:?}");
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_true_creates_the_topic_as_configured_and_every_event_arrives_once_in_order() {
    common::init_tracing();
    let fx = Fixture::new("mtcreate").await;
    let topic = format!("{}.order", fx.topic_prefix);
    assert_eq!(
        common::topic_partitions(&topic),
        None,
        "{topic} must not exist before the connector runs"
    );
    let config = fx.config_with(
        "OUTBOX_CDC__TOPICS__CREATE=true OUTBOX_CDC__TOPICS__PARTITIONS=5 \
         OUTBOX_CDC__TOPICS__REPLICATION_FACTOR=1 \
         OUTBOX_CDC__TOPICS__CONFIG__RETENTION_MS=3600000 \
         OUTBOX_CDC__TOPICS__CONFIG__CLEANUP_POLICY=delete",
    );
    let running = Running::start(config).await;

    let mut written = Vec::new();
    for n in 0..40 {
        let agg = format!("a{}", n % 8);
        written.extend(
            fx.write_tx(&[("order", agg.as_str(), format!(r#"{{"n": {n}}}"#))], true)
                .await,
        );
    }
    let records = consume(
        &fx.topic_prefix,
        written.len(),
        TIMEOUT,
        Duration::from_secs(3),
    );
    let by_id = once_each(&records);
    let expected: BTreeSet<&str> = written.iter().map(String::as_str).collect();
    let got: BTreeSet<&str> = by_id.keys().map(String::as_str).collect();
    assert_eq!(got, expected, "every event once, nothing else");

    let mut per_key: BTreeMap<&str, Vec<(i32, i64, i64)>> = BTreeMap::new();
    for r in &records {
        assert_eq!(r.topic, topic);
        per_key.entry(&r.key).or_default().push((
            r.partition,
            r.offset,
            r.header("aggregate_sequence").parse().expect("sequence"),
        ));
    }
    for (key, mut v) in per_key {
        v.sort();
        assert!(
            v.windows(2).all(|w| w[0].0 == w[1].0),
            "aggregate {key} spread over partitions: {v:?}"
        );
        let seqs: Vec<i64> = v.iter().map(|x| x.2).collect();
        assert_eq!(
            seqs,
            (1..=5).collect::<Vec<i64>>(),
            "aggregate {key} in commit order"
        );
    }

    assert_eq!(
        common::topic_partitions(&topic),
        Some(5),
        "created with topics.partitions"
    );
    assert_eq!(
        topic_config(&topic, "retention.ms").await.as_deref(),
        Some("3600000"),
        "created with [topics.config]"
    );
    assert_eq!(
        topic_config(&topic, "cleanup.policy").await.as_deref(),
        Some("delete")
    );
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_false_with_on_poison_fail_stops_quickly_naming_the_topic_without_advancing() {
    common::init_tracing();
    let fx = Fixture::new("mtfail").await;
    let order = format!("{}.order", fx.topic_prefix);
    let missing = format!("{}.invoice", fx.topic_prefix);
    common::create_topic(&order, 3, &[]).await;
    let env = "OUTBOX_CDC__TOPICS__CREATE=false OUTBOX_CDC__OUTBOX__ON_POISON=fail";
    let running = Running::start(fx.config_with(env)).await;

    let first = fx
        .write_tx(&[("order", "o1", r#"{"n": 1}"#.to_owned())], true)
        .await;
    let records = consume(&fx.topic_prefix, 1, TIMEOUT, Duration::ZERO);
    assert_eq!(records[0].header("event_id"), first[0]);
    // Let the first event's acknowledgement become durable before the refusal.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A WAL position inside the refused event's transaction, after its
    // insert: acknowledging that transaction would move the offset beyond it
    // (WAL before it, other sessions' included, may be acknowledged by an
    // idle advance).
    fx.admin.batch_execute("BEGIN").await.expect("BEGIN");
    let refused: Vec<String> = vec![
        fx.admin
            .query_one(
                &format!(
                    "INSERT INTO public.{} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
                     VALUES (gen_random_uuid(), 'invoice', 'i1', 1, 'TestEvent', '{{\"n\": 2}}') RETURNING event_id::text",
                    fx.table
                ),
                &[],
            )
            .await
            .expect("insert the refused event")
            .get(0),
    ];
    let before_refused: Lsn = fx
        .admin
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .expect("pg_current_wal_insert_lsn")
        .get::<_, String>(0)
        .parse()
        .expect("LSN");
    fx.admin.batch_execute("COMMIT").await.expect("COMMIT");
    let after = fx
        .write_tx(&[("order", "o1", r#"{"n": 3}"#.to_owned())], true)
        .await;
    let written_at = Instant::now();
    let result = running.finished(STOP_WITHIN + Duration::from_secs(5)).await;
    let stopped_after = written_at.elapsed();
    eprintln!("missing topic: connector stopped {stopped_after:?} after the event was committed");
    assert!(
        stopped_after < STOP_WITHIN,
        "the connector took {stopped_after:?} to stop"
    );
    let err = result.expect_err("a missing topic under on_poison = fail stops the connector");
    let refusal = match &err {
        PipelineError::Poison {
            event_id,
            refusal: Some(refusal),
            ..
        } => Some((event_id, refusal.as_ref())),
        _ => None,
    };
    match refusal {
        Some((event_id, SinkError::TopicMissing { topic, .. })) => {
            assert_eq!(topic, &missing, "{err}");
            assert_eq!(event_id, &refused[0], "{err}");
        }
        _ => panic!("expected a poison stop for a missing topic, got {err:?}"),
    }
    assert_eq!(err.disposition(), Disposition::Stop, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&missing) && text.contains("topics.create = true"),
        "the message names the topic and the fix: {text}"
    );
    assert!(
        common::topic_partitions(&missing).is_none(),
        "create = false: the topic was not created"
    );

    // Nothing at or after the refused event is acknowledged, locally or to the slot.
    let confirmed: Lsn = fx
        .slot_confirmed_flush()
        .await
        .expect("slot")
        .parse()
        .expect("LSN");
    assert!(
        confirmed < before_refused,
        "slot confirmed {confirmed} past the refused event (its transaction ends after {before_refused})"
    );
    {
        let store = OffsetStore::open(&fx.offsets_path()).expect("offset store");
        let stored = store.load(&fx.slot).expect("load").expect("an offset");
        assert!(
            stored.lsn < before_refused,
            "stored offset {} past the refused event (its transaction ends after {before_refused})",
            stored.lsn
        );
    }

    // Nothing was published twice, nothing after the refused event at all.
    let records = consume(&fx.topic_prefix, 1, TIMEOUT, Duration::from_secs(3));
    let by_id = once_each(&records);
    assert_eq!(
        by_id.keys().cloned().collect::<Vec<_>>(),
        first,
        "only the event before the refused one is published"
    );

    // The fix named in the error works: create the topic, start again, and the
    // stream resumes exactly at the refused event.
    common::create_topic(&missing, 3, &[]).await;
    let running = Running::start(fx.config_with(env)).await;
    let records = consume(&fx.topic_prefix, 3, TIMEOUT, Duration::from_secs(3));
    let by_id = once_each(&records);
    assert_eq!(by_id[&refused[0]].topic, missing);
    assert_eq!(by_id[&after[0]].topic, order);
    assert!(by_id.contains_key(&first[0]));
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_false_with_dead_letter_sends_the_event_to_the_dlq_and_others_flow_on() {
    common::init_tracing();
    let fx = Fixture::new("mtdlq").await;
    let order = format!("{}.order", fx.topic_prefix);
    let missing = format!("{}.invoice", fx.topic_prefix);
    let dlq = format!("{}.dlq", fx.topic_prefix);
    common::create_topic(&order, 3, &[]).await;
    common::create_topic(&dlq, 1, &[]).await;
    let env = format!(
        "OUTBOX_CDC__TOPICS__CREATE=false OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter \
         OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={dlq}"
    );
    let running = Running::start(fx.config_with(&env)).await;

    let small = |n: usize| format!(r#"{{"n": {n}}}"#);
    let e1 = fx.write_tx(&[("order", "o1", small(1))], true).await;
    let e2 = fx.write_tx(&[("invoice", "i1", small(2))], true).await;
    let e3 = fx.write_tx(&[("order", "o2", small(3))], true).await;
    let e4 = fx.write_tx(&[("invoice", "i1", small(4))], true).await;
    let e5 = fx.write_tx(&[("order", "o1", small(5))], true).await;

    let records = consume(&fx.topic_prefix, 5, TIMEOUT, Duration::from_secs(3));
    let find = |id: &str| -> Vec<&Record> {
        records
            .iter()
            .filter(|r| r.header("event_id") == id)
            .collect()
    };
    let dead = find(&e2[0]);
    assert_eq!(dead.len(), 1, "dead-lettered once: {dead:?}");
    let dead = dead[0];
    assert_eq!(
        dead.topic, dlq,
        "the refused event goes to the dead-letter topic"
    );
    assert_eq!(dead.key, "i1");
    assert_eq!(dead.header("dlq_original_topic"), missing);
    let reason = dead.header("dlq_reason");
    assert!(
        reason.starts_with(&format!("topic `{missing}` is missing"))
            && reason.contains("does not exist"),
        "the reason is the event's own refusal, naming the missing topic: {reason}"
    );
    let parked = find(&e4[0]);
    assert!(
        !parked.is_empty() && parked.iter().all(|r| r.topic == dlq),
        "later events of the parked aggregate follow it: {parked:?}"
    );
    for id in [&e1[0], &e3[0], &e5[0]] {
        let got = find(id);
        assert!(
            !got.is_empty() && got.iter().all(|r| r.topic == order),
            "event {id} of another aggregate is published to {order}: {got:?}"
        );
    }
    assert!(
        common::topic_partitions(&missing).is_none(),
        "create = false: the topic was not created"
    );
    assert!(running.metrics.dead_lettered() >= 2);
    running.stop().await.expect("the connector kept running");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_topic_with_create_false_stops_the_connector() {
    common::init_tracing();
    let fx = Fixture::new("mtnodlq").await;
    let dlq = format!("{}.dlq", fx.topic_prefix);
    let env = format!(
        "OUTBOX_CDC__TOPICS__CREATE=false OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter \
         OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={dlq}"
    );
    let running = Running::spawn(fx.config_with(&env), RunOptions::default());
    running.wait_streaming().await;
    let refused = fx
        .write_tx(&[("invoice", "i1", r#"{"n": 1}"#.to_owned())], true)
        .await;
    let written_at = Instant::now();
    let err = running
        .finished(STOP_WITHIN + Duration::from_secs(5))
        .await
        .expect_err("nowhere to put the record: stop");
    assert!(written_at.elapsed() < STOP_WITHIN);
    let refusal = match &err {
        PipelineError::Poison {
            event_id,
            refusal: Some(refusal),
            ..
        } => Some((event_id, refusal.as_ref())),
        _ => None,
    };
    match refusal {
        Some((event_id, SinkError::TopicMissing { topic, .. })) => {
            assert_eq!(topic, &dlq, "{err}");
            assert_eq!(event_id, &refused[0], "{err}");
        }
        _ => panic!("expected a stop naming the dead-letter topic, got {err:?}"),
    }
    fx.cleanup().await;
}
