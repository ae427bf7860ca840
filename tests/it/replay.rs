//! Replay on demand (`outbox-cdc replay`): retained rows published again by
//! time, by aggregate, from an event id, with a topic suffix, or only counted
//! (dry run). No connector runs: replay reads the table and produces.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Record, consume};
use common::topic_partitions;
use outbox_cdc::pipeline::{self, ReplayError, ReplayOptions};

const TIMEOUT: Duration = Duration::from_secs(90);

/// Rows with explicit times (2026-01-01T00:0m:00Z): aggregate order/A at
/// minutes 1, 3, then 2 (its third event's transaction started before the
/// second's); order/B at 2, 4; invoice/C at 6, 7. Returns event ids by
/// (aggregate id, sequence).
async fn seed(fx: &Fixture) -> BTreeMap<(String, i64), String> {
    let rows = [
        ("order", "A", 1, 1_i32),
        ("order", "B", 1, 2),
        ("order", "A", 2, 3),
        ("order", "B", 2, 4),
        ("order", "A", 3, 2),
        ("invoice", "C", 1, 6),
        ("invoice", "C", 2, 7),
    ];
    let mut ids = BTreeMap::new();
    for (agg_type, agg_id, seq, minute) in rows {
        let row = fx
            .admin
            .query_one(
                &format!(
                    "INSERT INTO public.{} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
                     VALUES (gen_random_uuid(), $1, $2, $3::int8, 'E', jsonb_build_object('seq', $3::int8),
                             '2026-01-01T00:00:00Z'::timestamptz + $4::int4 * interval '1 minute')
                     RETURNING event_id::text",
                    fx.table
                ),
                &[&agg_type, &agg_id, &(seq as i64), &minute],
            )
            .await
            .expect("seed row");
        ids.insert((agg_id.to_owned(), seq as i64), row.get(0));
    }
    ids
}

fn options(since: &str, suffix: &str) -> ReplayOptions {
    ReplayOptions {
        since: since.to_owned(),
        topic_suffix: suffix.to_owned(),
        ..ReplayOptions::default()
    }
}

/// (aggregate id, sequence) of `records` on topics ending in `suffix`, in
/// each partition's order.
fn seen(records: &[Record], suffix: &str) -> Vec<(String, i64)> {
    let mut mine: Vec<&Record> = records
        .iter()
        .filter(|r| r.topic.ends_with(suffix))
        .collect();
    mine.sort_by_key(|r| (r.topic.clone(), r.partition, r.offset));
    mine.iter()
        .map(|r| {
            (
                r.key.clone(),
                r.header("aggregate_sequence").parse().expect("sequence"),
            )
        })
        .collect()
}

fn of(aggregate: &str, seen: &[(String, i64)]) -> Vec<i64> {
    seen.iter()
        .filter(|(a, _)| a == aggregate)
        .map(|(_, s)| *s)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_by_time_aggregate_event_id_with_suffix_and_dry_run() {
    init_tracing();
    let fx = Fixture::new("replay").await;
    let ids = seed(&fx).await;
    let mut config = fx.config();
    // The seeded rows are minutes apart: a margin of half a minute keeps
    // "--since minute 2" from reaching back to minute 1.
    config.repair.occurred_at_margin_ms = 30_000;
    let order = format!("{}.order", fx.topic_prefix);
    let invoice = format!("{}.invoice", fx.topic_prefix);

    // Dry run: counts per topic, sends nothing (not even a topic is created).
    let dry = pipeline::replay(
        &config,
        &ReplayOptions {
            dry_run: true,
            ..options("2026-01-01T00:00:00Z", "")
        },
    )
    .await
    .expect("dry run");
    assert_eq!(
        dry.by_topic,
        BTreeMap::from([(order.clone(), 5), (invoice.clone(), 2)])
    );
    assert_eq!(
        topic_partitions(&order),
        None,
        "the dry run created {order}"
    );
    assert_eq!(topic_partitions(&invoice), None);

    // By time, with --until, into suffixed topics.
    let report = pipeline::replay(
        &config,
        &ReplayOptions {
            until: Some("2026-01-01T00:06:00Z".into()),
            ..options("2026-01-01T00:02:00Z", ".r1")
        },
    )
    .await
    .expect("replay by time");
    assert_eq!(
        report.by_topic,
        BTreeMap::from([(format!("{order}.r1"), 4)])
    );

    // By aggregate.
    pipeline::replay(
        &config,
        &ReplayOptions {
            aggregate_type: Some("order".into()),
            aggregate_id: Some("A".into()),
            ..options("2026-01-01T00:00:00Z", ".r2")
        },
    )
    .await
    .expect("replay by aggregate");

    // From an event id: A from its sequence 2 on (3 although it is at minute
    // 2); the others from minute 3 on: B 2 (minute 4), C 1 and 2.
    // The id in capitals matches too (review F14: the uuid is compared as
    // a uuid, not as text).
    let upper = ids[&("A".to_owned(), 2)].to_uppercase();
    pipeline::replay(&config, &options(&upper, ".r3"))
        .await
        .expect("replay from an event id");

    let records = consume(&fx.topic_prefix, 4 + 3 + 5, TIMEOUT, Duration::from_secs(1));
    assert!(
        records
            .iter()
            .all(|r| !r.topic.ends_with(".order") && !r.topic.ends_with(".invoice")),
        "a replay wrote into an unsuffixed topic"
    );
    let r1 = seen(&records, ".r1");
    assert_eq!(of("A", &r1), vec![2, 3], "{r1:?}");
    assert_eq!(of("B", &r1), vec![1, 2], "{r1:?}");
    let r2 = seen(&records, ".r2");
    assert_eq!(r2, vec![("A".into(), 1), ("A".into(), 2), ("A".into(), 3)]);
    let r3 = seen(&records, ".r3");
    assert_eq!(of("A", &r3), vec![2, 3], "{r3:?}");
    assert_eq!(of("B", &r3), vec![2], "{r3:?}");
    assert_eq!(of("C", &r3), vec![1, 2], "{r3:?}");
    // The records are the rows: event ids and keys as stored.
    for r in records.iter().filter(|r| r.topic.ends_with(".r2")) {
        let seq: i64 = r.header("aggregate_sequence").parse().unwrap();
        assert_eq!(r.header("event_id"), ids[&("A".to_owned(), seq)]);
        assert_eq!(r.key, "A");
    }
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_refuses_bad_times_unknown_event_ids_and_bad_suffixes() {
    init_tracing();
    let fx = Fixture::new("replaybad").await;
    seed(&fx).await;
    let config = fx.config();
    let dry = |since: &str, suffix: &str| ReplayOptions {
        dry_run: true,
        ..options(since, suffix)
    };
    for bad in ["2026-13-01T00:00:00Z", "2026-01-01 10:00", "2026-01-01"] {
        let err = pipeline::replay(&config, &dry(bad, "")).await.unwrap_err();
        assert!(
            matches!(&err, ReplayError::BadTime { flag: "since", .. }),
            "{bad}: {err}"
        );
    }
    // PostgreSQL's own text form, as `audit` prints its window (review F16).
    let report = pipeline::replay(&config, &dry("2026-01-01 00:00:00.5+00", ""))
        .await
        .expect("PostgreSQL's text form of a time");
    assert_eq!(report.total(), 7, "{report:?}");
    let err = pipeline::replay(
        &config,
        &ReplayOptions {
            until: Some("soon".into()),
            ..dry("2026-01-01T00:00:00Z", "")
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ReplayError::BadTime { flag: "until", .. }),
        "{err}"
    );
    for unknown in ["yesterday", "6f1c1a52-8d0e-4c59-a1b7-3c5f0d6f2a10"] {
        let err = pipeline::replay(&config, &dry(unknown, ""))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ReplayError::UnknownEventId(_)),
            "{unknown}: {err}"
        );
    }
    let err = pipeline::replay(&config, &dry("2026-01-01T00:00:00Z", "/x"))
        .await
        .unwrap_err();
    assert!(matches!(&err, ReplayError::BadTopic { .. }), "{err}");
    fx.cleanup().await;
}

/// Review F7: `replay --since TIME` sends every transaction that committed at
/// or after TIME, also one that began before it (`occurred_at` is the
/// transaction's start); a row written `repair.occurred_at_margin_ms` before
/// TIME and committed long before is not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_by_time_includes_transactions_that_began_before_and_committed_after() {
    init_tracing();
    let fx = Fixture::new("replaystraddle").await;
    let table = fx.table.clone();
    fx.admin
        .execute(
            &format!(
                "INSERT INTO public.{table} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
                 VALUES (gen_random_uuid(), 'order', 'old', 1, 'E', '{{}}'::jsonb, now() - interval '2 hours')"
            ),
            &[],
        )
        .await
        .expect("an old row");
    let mut client = common::admin_client().await;
    let tx = client.transaction().await.expect("begin");
    tx.execute(
        &format!(
            "INSERT INTO public.{table} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
             VALUES (gen_random_uuid(), 'order', 'straddle', 1, 'E', '{{}}'::jsonb)"
        ),
        &[],
    )
    .await
    .expect("insert");
    tx.execute("SELECT pg_sleep(1)", &[]).await.expect("sleep");
    let since: String = tx
        .query_one(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            &[],
        )
        .await
        .expect("the time between its start and its commit")
        .get(0);
    tx.commit().await.expect("commit");

    let report = pipeline::replay(
        &fx.config(),
        &ReplayOptions {
            dry_run: true,
            ..options(&since, "")
        },
    )
    .await
    .expect("replay --since");
    assert_eq!(
        report.by_topic,
        BTreeMap::from([(format!("{}.order", fx.topic_prefix), 1)]),
        "the row of the transaction that committed after {since}, and not the one from two hours before"
    );
    fx.cleanup().await;
}

/// Review F15: a row the connector cannot map goes to the dead-letter topic
/// as the stream sends it there, its columns as a JSON object (values over
/// the limit shortened), not as `{}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmappable_row_is_dead_lettered_with_its_columns() {
    init_tracing();
    let fx = Fixture::new("replaydlq").await;
    let dlq_topic = format!("{}.dlq", fx.topic_prefix);
    let env = format!(
        "OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={dlq_topic} \
         OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=2000"
    );
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    let poison = fx.write_tx(&[("order", "a1", huge)], true).await;
    pipeline::replay(
        &fx.config_with(&env),
        &options("2000-01-01T00:00:00Z", ".r"),
    )
    .await
    .expect("replay");
    let records = consume(&fx.topic_prefix, 1, TIMEOUT, Duration::from_secs(1));
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record.topic, format!("{dlq_topic}.r"));
    let payload: serde_json::Value = serde_json::from_str(&record.payload)
        .unwrap_or_else(|e| panic!("the payload is JSON ({e}): {record:?}"));
    assert_eq!(payload["aggregate_id"], "a1", "{payload}");
    assert_eq!(payload["event_id"], poison[0].as_str(), "{payload}");
    assert!(
        payload["payload"]
            .as_str()
            .is_some_and(|p| p.starts_with("(omitted:")),
        "the oversized value is shortened: {payload}"
    );
    fx.cleanup().await;
}

/// Review F16: a replay that stops part-way (here at a poison row with
/// `on_poison = "fail"`) says how many records it had sent and that a rerun
/// sends them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_stopped_part_way_says_what_it_had_sent() {
    init_tracing();
    let fx = Fixture::new("replaystop").await;
    let env = "OUTBOX_CDC__OUTBOX__ON_POISON=fail OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=2000";
    fx.write_tx(&[("order", "a1", r#"{"n": 1}"#.into())], true)
        .await;
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    let poison = fx.write_tx(&[("order", "a2", huge)], true).await;
    let err = pipeline::replay(&fx.config_with(env), &options("2000-01-01T00:00:00Z", ".r"))
        .await
        .unwrap_err();
    match &err {
        ReplayError::Stopped { sent, source, .. } => {
            assert_eq!(*sent, 1, "{err}");
            assert!(source.to_string().contains(&poison[0]), "{err}");
        }
        other => panic!("expected a stop that counts what was sent: {other}"),
    }
    assert!(
        err.to_string().contains("a rerun sends them again"),
        "{err}"
    );
    fx.cleanup().await;
}
