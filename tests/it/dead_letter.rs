//! The dead-letter poison policy end to end: a poison row goes to the
//! dead-letter topic with its reason, its aggregate is parked so later events
//! of that aggregate follow it there in order, other aggregates flow on, and a
//! released aggregate flows to its topic again.

use crate::common;

use std::time::Duration;

use common::relay::{Fixture, Record, Running, consume};
use outbox_cdc::checkpoint::OffsetStore;

const TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_are_dead_lettered_and_park_their_aggregate_until_released() {
    common::init_tracing();
    let fx = Fixture::new("dlq").await;
    let dlq_topic = format!("{}.dlq", fx.topic_prefix);
    let env = format!(
        "OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={dlq_topic} \
         OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=2000"
    );
    let running = Running::start(fx.config_with(&env)).await;

    let small = |n: usize| format!(r#"{{"n": {n}}}"#);
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    let ok_before = fx.write_tx(&[("order", "a1", small(1))], true).await;
    let poison = fx.write_tx(&[("order", "a1", huge)], true).await;
    let parked_later = fx.write_tx(&[("order", "a1", small(3))], true).await;
    let other = fx.write_tx(&[("order", "a2", small(4))], true).await;

    let records = consume(&fx.topic_prefix, 4, TIMEOUT, Duration::from_secs(2));
    let find = |id: &str| {
        records
            .iter()
            .find(|r| r.header("event_id") == id)
            .unwrap_or_else(|| panic!("event {id} not published; got {records:#?}"))
    };
    assert_eq!(
        find(&ok_before[0]).topic,
        format!("{}.order", fx.topic_prefix)
    );
    assert_eq!(find(&other[0]).topic, format!("{}.order", fx.topic_prefix));

    let p = find(&poison[0]);
    assert_eq!(
        p.topic, dlq_topic,
        "the poison row goes to the dead-letter topic"
    );
    assert_eq!(p.key, "a1");
    assert!(
        p.header("dlq_reason").contains("max_record_bytes"),
        "reason: {}",
        p.header("dlq_reason")
    );
    let row: serde_json::Value =
        serde_json::from_str(&p.payload).expect("dead-letter payload is the row as JSON");
    assert_eq!(row["aggregate_id"], "a1");

    let later = find(&parked_later[0]);
    assert_eq!(
        later.topic, dlq_topic,
        "later events of a parked aggregate follow it"
    );
    assert_eq!(
        later.header("dlq_original_topic"),
        format!("{}.order", fx.topic_prefix)
    );
    assert!(later.header("dlq_reason").contains("parked"));
    // Exactly these four records: the dead-lettered events are on the
    // dead-letter topic only, never (also) on their own topic, and there in
    // commit order, in one partition.
    let main_topic = format!("{}.order", fx.topic_prefix);
    let mut on_main: Vec<&Record> = records.iter().filter(|r| r.topic == main_topic).collect();
    on_main.sort_by_key(|r| (r.partition, r.offset));
    let mut main_ids: Vec<&str> = on_main.iter().map(|r| r.header("event_id")).collect();
    main_ids.sort_unstable();
    let mut expected_main = vec![ok_before[0].as_str(), other[0].as_str()];
    expected_main.sort_unstable();
    assert_eq!(
        main_ids, expected_main,
        "the main topic holds the healthy events only (poison {}, parked {})",
        poison[0], parked_later[0]
    );
    let mut on_dlq: Vec<&Record> = records.iter().filter(|r| r.topic == dlq_topic).collect();
    on_dlq.sort_by_key(|r| (r.partition, r.offset));
    let dlq_order: Vec<(i32, &str)> = on_dlq
        .iter()
        .map(|r| (r.partition, r.header("event_id")))
        .collect();
    assert_eq!(
        dlq_order,
        vec![
            (p.partition, poison[0].as_str()),
            (p.partition, parked_later[0].as_str())
        ],
        "the dead-letter topic holds the poison event, then the parked one, in one partition"
    );
    assert_eq!(records.len(), 4, "no other records: {records:#?}");
    assert!(running.metrics.dead_lettered() >= 2);
    running.stop().await.expect("graceful stop");

    // Release the aggregate in the shared table (what `outbox-cdc release`
    // does) and restart: the start drops the store's copy.
    {
        let store = OffsetStore::open(&fx.offsets_path()).unwrap();
        assert!(
            store.is_parked("order", "a1").unwrap(),
            "the aggregate is parked in the store"
        );
    }
    let table = outbox_cdc::parking::ParkedTable::of(&fx.config_with(&env))
        .unwrap()
        .expect("dead-letter parking is shared");
    assert!(table.release("order", "a1").await.unwrap());
    let running = Running::start(fx.config_with(&env)).await;
    let released = fx.write_tx(&[("order", "a1", small(5))], true).await;
    let records = consume(&fx.topic_prefix, 5, TIMEOUT, Duration::from_secs(2));
    let released_at: Vec<&str> = records
        .iter()
        .filter(|r| r.header("event_id") == released[0])
        .map(|r| r.topic.as_str())
        .collect();
    assert_eq!(
        released_at,
        vec![main_topic.as_str()],
        "a released aggregate flows to its topic again, once"
    );
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// Audit F12: parking follows commit order, not the changes' own LSNs. T1
/// inserts a1's first event and stays open; T2 inserts a poison event of a1
/// (later in the WAL) and commits first, parking a1. T1 then commits: its event
/// comes after the poison one in commit order, so it must follow it to the
/// dead-letter topic, though its change LSN is lower. (Before, it went to the
/// main topic: a1's events there continued past a poison event.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_committed_after_the_poison_one_follows_it_though_inserted_before() {
    common::init_tracing();
    let fx = Fixture::new("dlqorder").await;
    let dlq_topic = format!("{}.dlq", fx.topic_prefix);
    let env = format!(
        "OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={dlq_topic} \
         OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=2000"
    );
    let running = Running::start(fx.config_with(&env)).await;

    let insert = format!(
        "INSERT INTO public.{} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
         VALUES (gen_random_uuid(), 'order', 'a1', $2, 'TestEvent', $1::text::jsonb)
         RETURNING event_id::text",
        fx.table
    );
    let t1 = common::admin_client().await;
    t1.batch_execute("BEGIN").await.expect("T1 BEGIN");
    let early: String = t1
        .query_one(&insert, &[&r#"{"n": 1}"#, &1_i64])
        .await
        .expect("T1 insert")
        .get(0);
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    let t2 = common::admin_client().await;
    t2.batch_execute("BEGIN").await.expect("T2 BEGIN");
    let poison: String = t2
        .query_one(&insert, &[&huge, &2_i64])
        .await
        .expect("T2 insert")
        .get(0);
    t2.batch_execute("COMMIT").await.expect("T2 COMMIT");
    t1.batch_execute("COMMIT").await.expect("T1 COMMIT");

    let records = consume(&fx.topic_prefix, 2, TIMEOUT, Duration::from_secs(2));
    let topic_of = |id: &str| -> Vec<&str> {
        records
            .iter()
            .filter(|r| r.header("event_id") == id)
            .map(|r| r.topic.as_str())
            .collect()
    };
    assert_eq!(topic_of(&poison), vec![dlq_topic.as_str()], "{records:#?}");
    assert_eq!(
        topic_of(&early),
        vec![dlq_topic.as_str()],
        "the event committed after the poison one follows it to the dead-letter topic: {records:#?}"
    );
    let mut on_dlq: Vec<&Record> = records.iter().filter(|r| r.topic == dlq_topic).collect();
    on_dlq.sort_by_key(|r| r.offset);
    let order: Vec<&str> = on_dlq.iter().map(|r| r.header("event_id")).collect();
    assert_eq!(order, vec![poison.as_str(), early.as_str()], "commit order");
    assert!(
        on_dlq[1].header("dlq_reason").contains("parked"),
        "{}",
        on_dlq[1].header("dlq_reason")
    );
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}
