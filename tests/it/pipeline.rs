//! The connector end to end against the real PostgreSQL and Kafka: what is
//! published, in which order, and what survives restarts (DESIGN.md §2, §5, §6).

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::relay::{
    Fixture, Record, Running, consume, consume_ids, eventually, partition_count, partition_ends,
    spawn_binary,
};
use outbox_cdc::Disposition;
use outbox_cdc::checkpoint::OffsetStore;
use outbox_cdc::outbox::MapError;
use outbox_cdc::pg::Lsn;
use outbox_cdc::pipeline::{PipelineError, RunOptions, StartRefused};
use outbox_cdc::sink::java_partition;

const TIMEOUT: Duration = Duration::from_secs(90);
const SETTLE: Duration = Duration::from_secs(2);

fn payload(i: usize) -> String {
    format!(r#"{{"n": {i}, "note": "order {i}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_committed_rows_with_key_partition_headers_and_payload() {
    common::init_tracing();
    let fx = Fixture::new("happy").await;
    let running = Running::start(fx.config()).await;

    let wal_before: Lsn = fx.current_wal_lsn().await;
    let mut committed: Vec<(String, &str, &str, String)> = Vec::new();
    for i in 0..20 {
        let agg_id = ["a1", "a2", "a3"][i % 3];
        let p = payload(i);
        let ids = fx.write_tx(&[("order", agg_id, p.clone())], true).await;
        committed.push((ids[0].clone(), "order", agg_id, p));
    }
    // Rolled back: must never appear.
    fx.write_tx(&[("order", "a1", payload(999))], false).await;
    // Another table in the same database: must never appear.
    fx.admin
        .batch_execute("CREATE TABLE IF NOT EXISTS public.pipeline_other (x int); INSERT INTO public.pipeline_other VALUES (1);")
        .await
        .unwrap();
    // A multi-event transaction over two aggregate types.
    let multi = fx
        .write_tx(
            &[
                ("order", "a2", payload(100)),
                ("invoice", "i1", payload(101)),
            ],
            true,
        )
        .await;
    committed.push((multi[0].clone(), "order", "a2", payload(100)));
    committed.push((multi[1].clone(), "invoice", "i1", payload(101)));

    let records = consume(&fx.topic_prefix, committed.len(), TIMEOUT, SETTLE);
    assert_eq!(
        records.len(),
        committed.len(),
        "exactly the committed rows, once each"
    );

    let wal_after: Lsn = fx.current_wal_lsn().await;
    let by_id: HashMap<&str, _> = records.iter().map(|r| (r.header("event_id"), r)).collect();
    for (event_id, agg_type, agg_id, p) in &committed {
        let r = by_id
            .get(event_id.as_str())
            .unwrap_or_else(|| panic!("event {event_id} was not published"));
        assert_eq!(r.topic, format!("{}.{agg_type}", fx.topic_prefix));
        assert_eq!(r.key, *agg_id);
        let stored: serde_json::Value = serde_json::from_str(p).unwrap();
        let got: serde_json::Value = serde_json::from_str(&r.payload).unwrap();
        assert_eq!(got, stored, "payload of {event_id}");
        assert_eq!(r.header("aggregate_type"), *agg_type);
        assert_eq!(r.header("aggregate_id"), *agg_id);
        assert_eq!(r.header("event_type"), "TestEvent");
        assert_eq!(r.header("schema_version"), "1");
        let stored_sequence: i64 = fx
            .admin
            .query_one(
                &format!(
                    "SELECT aggregate_sequence FROM public.{} WHERE event_id = $1::text::uuid",
                    fx.table
                ),
                &[event_id],
            )
            .await
            .expect("the row of a published event")
            .get(0);
        assert_eq!(
            r.header("aggregate_sequence"),
            stored_sequence.to_string(),
            "aggregate_sequence header of {event_id}"
        );
        let lsn: Lsn = r
            .header("lsn")
            .parse()
            .unwrap_or_else(|e| panic!("lsn header {:?}: {e}", r.header("lsn")));
        // The first change can start exactly where WAL was written up to.
        assert!(
            lsn >= wal_before && lsn < wal_after,
            "lsn header {lsn} of {event_id} outside the writes ({wal_before}..{wal_after})"
        );
        assert!(r.timestamp_ms.is_some_and(|t| t > 1_600_000_000_000));
        let n = partition_count(&r.topic);
        assert_eq!(
            r.partition,
            java_partition(agg_id.as_bytes(), n),
            "murmur2 partition of {agg_id}"
        );
    }

    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_aggregate_order_holds_over_interleaved_multi_event_transactions() {
    common::init_tracing();
    let fx = Fixture::new("order").await;
    let running = Running::start(fx.config()).await;

    let mut expected = 0;
    for t in 0..60 {
        // 1 to 5 events per transaction over 100 aggregates, interleaved.
        let n = 1 + t % 5;
        let ids: Vec<String> = (0..n)
            .map(|k| format!("agg-{}", (t * 7 + k * 13) % 100))
            .collect();
        let events: Vec<(&str, &str, String)> = ids
            .iter()
            .map(|id| ("order", id.as_str(), payload(t)))
            .collect();
        expected += fx.write_tx(&events, true).await.len();
    }
    let records = consume(&fx.topic_prefix, expected, TIMEOUT, SETTLE);
    assert_eq!(records.len(), expected);

    let mut by_key: BTreeMap<&str, Vec<(i32, i64, i64)>> = BTreeMap::new();
    for r in &records {
        let seq: i64 = r.header("aggregate_sequence").parse().unwrap();
        by_key
            .entry(&r.key)
            .or_default()
            .push((r.partition, r.offset, seq));
    }
    for (key, mut seen) in by_key {
        let partitions: BTreeSet<i32> = seen.iter().map(|s| s.0).collect();
        assert_eq!(
            partitions.len(),
            1,
            "aggregate {key} spread over partitions {partitions:?}"
        );
        seen.sort_by_key(|s| s.1);
        let seqs: Vec<i64> = seen.iter().map(|s| s.2).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "aggregate {key}: sequences out of order in its partition: {seqs:?}"
        );
        assert_eq!(seqs.first(), Some(&1), "aggregate {key} starts at 1");
    }

    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_restart_loses_nothing_and_duplicates_nothing() {
    common::init_tracing();
    let fx = Fixture::new("restart").await;
    let mut all = Vec::new();

    let running = Running::start(fx.config()).await;
    for i in 0..30 {
        all.extend(
            fx.write_tx(&[("order", &format!("g{}", i % 4), payload(i))], true)
                .await,
        );
    }
    let first = consume(&fx.topic_prefix, all.len(), TIMEOUT, SETTLE);
    assert_eq!(first.len(), all.len());
    running.stop().await.expect("graceful stop");

    // Written while the connector is down.
    for i in 30..60 {
        all.extend(
            fx.write_tx(&[("order", &format!("g{}", i % 4), payload(i))], true)
                .await,
        );
    }
    let running = Running::start(fx.config()).await;
    for i in 60..70 {
        all.extend(
            fx.write_tx(&[("order", &format!("g{}", i % 4), payload(i))], true)
                .await,
        );
    }
    let records = consume(&fx.topic_prefix, all.len(), TIMEOUT, Duration::from_secs(4));
    running.stop().await.expect("graceful stop");

    let mut counts: HashMap<&str, usize> = HashMap::new();
    for r in &records {
        *counts.entry(r.header("event_id")).or_default() += 1;
    }
    for id in &all {
        assert_eq!(
            counts.get(id.as_str()),
            Some(&1),
            "event {id}: lost or duplicated"
        );
    }
    assert_eq!(records.len(), all.len(), "no extra records");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_persists_and_exits_zero() {
    common::init_tracing();
    let fx = Fixture::new("sigterm").await;
    let config_path = fx.write_config_file();
    let mut child = spawn_binary(&config_path);
    fx.wait_for_slot().await;

    let mut all = Vec::new();
    for i in 0..50 {
        all.extend(
            fx.write_tx(&[("order", &format!("s{}", i % 3), payload(i))], true)
                .await,
        );
    }
    // Stop while events may still be in flight: SIGTERM waits for them.
    let status = child.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let flushed: Lsn = fx.slot_confirmed_flush().await.unwrap().parse().unwrap();

    let mut child = spawn_binary(&config_path);
    for i in 50..60 {
        all.extend(
            fx.write_tx(&[("order", &format!("s{}", i % 3), payload(i))], true)
                .await,
        );
    }
    let records = consume(&fx.topic_prefix, all.len(), TIMEOUT, Duration::from_secs(3));
    let status = child.terminate(Duration::from_secs(60));
    assert!(
        status.success(),
        "exit status after the second SIGTERM: {status}"
    );

    let mut counts: HashMap<&str, usize> = HashMap::new();
    for r in &records {
        *counts.entry(r.header("event_id")).or_default() += 1;
    }
    for id in &all {
        assert_eq!(
            counts.get(id.as_str()),
            Some(&1),
            "event {id}: lost or duplicated across SIGTERM"
        );
    }
    let after: Lsn = fx.slot_confirmed_flush().await.unwrap().parse().unwrap();
    assert!(
        after > flushed,
        "the final status update reported progress ({flushed} -> {after})"
    );
    fx.cleanup().await;
}

/// Waits until a walsender other than `previous` holds the fixture's slot;
/// returns its PID.
async fn wait_for_a_new_walsender(fx: &Fixture, previous: Option<i32>) -> i32 {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let pid = fx
            .admin
            .query_opt(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&fx.slot],
            )
            .await
            .expect("read the slot")
            .and_then(|row| row.get::<_, Option<i32>>(0))
            .filter(|p| Some(*p) != previous);
        if let Some(pid) = pid {
            return pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no new walsender on slot {} within {TIMEOUT:?} (previous: {previous:?})",
            fx.slot
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The partitions' end offsets after a kill, and the offset the killed
/// process had stored.
type AtKill = (BTreeMap<(String, i32), i64>, Option<Lsn>);

/// Killed three times while events flow: nothing is lost; every duplicate is
/// a resend by the process started after a kill, of a transaction that ended
/// after the offset the killed process had stored (DESIGN.md §2, contract 4);
/// each aggregate stays in one partition with its first deliveries in
/// sequence order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_restart_loses_nothing() {
    common::init_tracing();
    let fx = Fixture::new("kill").await;
    let config_path = fx.write_config_file();
    let mut all = Vec::new();
    // Event id -> an upper bound of its transaction's end LSN.
    let mut ended_by: HashMap<String, Lsn> = HashMap::new();
    // Per kill: the partitions' end offsets and the offset the dead process had stored.
    let mut kills: Vec<AtKill> = Vec::new();

    let mut child = spawn_binary(&config_path);
    fx.wait_for_slot().await;
    let mut streaming_pid = None;
    // Events flow while the process is killed at some point mid-stream.
    for round in 0..3 {
        // Each process streams before the round's writes, so that every kill
        // lands in a live session (a walsender of the killed process can hold
        // the slot for a moment, and the next start backs off).
        streaming_pid = Some(wait_for_a_new_walsender(&fx, streaming_pid).await);
        for i in 0..40 {
            let n = round * 100 + i;
            let (ids, end) = fx
                .write_tx_ended_by(&[
                    ("order", &format!("k{}", n % 5), payload(n)),
                    ("order", &format!("k{}", (n + 1) % 5), payload(n)),
                ])
                .await;
            ended_by.extend(ids.iter().map(|id| (id.clone(), end)));
            all.extend(ids);
        }
        tokio::time::sleep(Duration::from_millis(150 * round as u64)).await;
        child.kill9();
        // Produce requests the dead process had on the wire may still land.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ends = partition_ends(&fx.topic_prefix);
        let stored = OffsetStore::open(&fx.offsets_path())
            .and_then(|store| store.load(&fx.slot))
            .unwrap_or_else(|e| panic!("reading the offset store after kill -9: {e}"))
            .map(|s| s.lsn);
        kills.push((ends, stored));
        child = spawn_binary(&config_path);
    }
    // Until every event arrived: the replays after the kills send duplicates,
    // which would let a count be reached early.
    let ids: BTreeSet<String> = all.iter().cloned().collect();
    let records = consume_ids(&fx.topic_prefix, &ids, TIMEOUT, Duration::from_secs(3));
    child.kill9();

    let stored: Vec<Option<Lsn>> = kills.iter().map(|k| k.1).collect();
    assert!(
        stored.last().is_some_and(Option::is_some),
        "nothing was stored in three rounds of 40 transactions: {stored:?}"
    );
    assert!(
        stored.windows(2).all(|w| w[0].is_none() || w[0] <= w[1]),
        "the stored offset went back or vanished across kills: {stored:?}"
    );
    assert!(
        stored[2] > stored[0],
        "two processes streamed 80 transactions and stored nothing new: {stored:?}"
    );

    let seen: BTreeSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    let lost: Vec<&String> = all
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .collect();
    assert!(lost.is_empty(), "lost after kill -9: {lost:?}");
    assert_eq!(seen.len(), all.len(), "records of events never written");

    // Duplicates: the later copy was produced after some kill (it lies at or
    // beyond that kill's end offset, the earlier copy before it), and the
    // process started then resumed from the offset stored at that kill, so its
    // transaction must have ended after that offset.
    let mut copies: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in &records {
        copies.entry(r.header("event_id")).or_default().push(r);
    }
    let mut duplicates = 0;
    let mut violations = Vec::new();
    for (id, mut recs) in copies {
        recs.sort_by_key(|r| (r.topic.clone(), r.partition, r.offset));
        duplicates += recs.len() - 1;
        for pair in recs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if (&a.topic, a.partition) != (&b.topic, b.partition) {
                violations.push(format!(
                    "event {id} in two partitions: {}[{}] and {}[{}]",
                    a.topic, a.partition, b.topic, b.partition
                ));
                continue;
            }
            let tp = (a.topic.clone(), a.partition);
            let end_of = |ends: &BTreeMap<(String, i32), i64>| ends.get(&tp).copied().unwrap_or(0);
            // The last kill before the later copy was appended.
            let kill = kills
                .iter()
                .enumerate()
                .rev()
                .find(|(_, (ends, _))| end_of(ends) <= b.offset);
            let end = ended_by[id];
            match kill {
                Some((k, (ends, stored))) if a.offset < end_of(ends) => {
                    if stored.is_some_and(|s| end <= s) {
                        violations.push(format!(
                            "event {id}: copies at {}[{}]@{} and @{}; its transaction ended by {end}, \
                             at or before the offset {} stored at kill {k}: acknowledged, then sent again",
                            a.topic,
                            a.partition,
                            a.offset,
                            b.offset,
                            stored.unwrap_or(Lsn::ZERO)
                        ));
                    }
                }
                _ => violations.push(format!(
                    "event {id}: copies at {}[{}]@{} and @{} with no kill in between (ends at kills: {:?})",
                    a.topic,
                    a.partition,
                    a.offset,
                    b.offset,
                    kills.iter().map(|k| end_of(&k.0)).collect::<Vec<_>>()
                )),
            }
        }
    }
    let stored_text: Vec<String> = stored
        .iter()
        .map(|s| s.map_or_else(|| "none".to_owned(), |l| l.to_string()))
        .collect();
    eprintln!(
        "kill -9: {} events, {} records, {duplicates} duplicates; offsets stored at the kills: {}",
        all.len(),
        records.len(),
        stored_text.join(", ")
    );
    assert!(
        violations.is_empty(),
        "{} duplicates outside the contract:\n{}",
        violations.len(),
        violations.join("\n")
    );

    // Per aggregate: one partition for all its records (duplicates too), and
    // first deliveries in offset order carry its sequence 1, 2, 3, ...
    let mut by_key: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in &records {
        by_key.entry(r.key.as_str()).or_default().push(r);
    }
    for (key, mut recs) in by_key {
        let places: BTreeSet<(&str, i32)> = recs
            .iter()
            .map(|r| (r.topic.as_str(), r.partition))
            .collect();
        assert_eq!(places.len(), 1, "aggregate {key} split over {places:?}");
        recs.sort_by_key(|r| r.offset);
        let mut dedupe = BTreeSet::new();
        let first: Vec<i64> = recs
            .iter()
            .filter(|r| dedupe.insert(r.header("event_id")))
            .map(|r| r.header("aggregate_sequence").parse().expect("a sequence"))
            .collect();
        let expected: Vec<i64> = (1..=first.len() as i64).collect();
        assert_eq!(
            first, expected,
            "aggregate {key}: first deliveries out of sequence order"
        );
    }
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_advances_on_a_busy_database_without_outbox_traffic() {
    common::init_tracing();
    let fx = Fixture::new("idle").await;
    let running = Running::start(fx.config()).await;
    eventually(
        "the connector to create its slot and stream",
        TIMEOUT,
        || async { fx.slot_confirmed_flush().await.is_some() && running.metrics.is_connected() },
    )
    .await;
    let before: Lsn = fx.slot_confirmed_flush().await.unwrap().parse().unwrap();

    fx.admin
        .batch_execute(&format!(
            "CREATE TABLE public.busy_{} (x int, pad text)",
            fx.name
        ))
        .await
        .unwrap();
    let busy_table = format!("busy_{}", fx.name);
    let mut advanced = false;
    for _ in 0..40 {
        fx.admin
            .batch_execute(&format!(
                "INSERT INTO public.{busy_table} SELECT g, repeat('x', 100) FROM generate_series(1, 500) g"
            ))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now: Lsn = fx.slot_confirmed_flush().await.unwrap().parse().unwrap();
        if now > before {
            advanced = true;
            break;
        }
    }
    assert!(
        advanced,
        "confirmed_flush_lsn stayed at {before} while other tables were written"
    );
    running.stop().await.expect("graceful stop");
    fx.admin
        .batch_execute(&format!("DROP TABLE public.{busy_table}"))
        .await
        .unwrap();
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_when_the_slot_was_dropped_and_recreated() {
    common::init_tracing();
    let fx = Fixture::new("lost").await;
    let running = Running::start(fx.config()).await;
    fx.write_tx(&[("order", "l1", payload(1))], true).await;
    consume(&fx.topic_prefix, 1, TIMEOUT, Duration::from_millis(200));
    running.stop().await.expect("graceful stop");

    // Dropped behind the connector's back: refused, with the way forward.
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .unwrap();
    let err = Running::spawn(fx.config(), RunOptions::default())
        .finished(TIMEOUT)
        .await
        .expect_err("start must be refused when the slot is gone");
    assert!(
        matches!(err, PipelineError::Refused(StartRefused::SlotLost { .. })),
        "unexpected error: {err}"
    );
    assert_eq!(err.disposition(), Disposition::Stop);

    // ... and recreated by someone else: still refused (it is ahead of the offset).
    fx.write_tx(&[("order", "l1", payload(2))], true).await;
    fx.admin
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&fx.slot],
        )
        .await
        .unwrap();
    let err = Running::spawn(fx.config(), RunOptions::default())
        .finished(TIMEOUT)
        .await
        .expect_err("start must be refused when the slot was recreated");
    assert!(
        matches!(err, PipelineError::Refused(StartRefused::SlotAhead { .. })),
        "unexpected error: {err}"
    );

    // The explicit flag recreates and streams again.
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .unwrap();
    let running = Running::spawn(
        fx.config(),
        RunOptions {
            recreate_slot: true,
            ..RunOptions::default()
        },
    );
    eventually("the recreated slot to be active", TIMEOUT, || async {
        running.metrics.is_connected()
    })
    .await;
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_an_offset_stored_for_another_cluster() {
    common::init_tracing();
    let fx = Fixture::new("cluster").await;
    {
        let store = OffsetStore::open(&fx.offsets_path()).unwrap();
        store.persist(&fx.slot, Lsn::new(1), "1234567890").unwrap();
    }
    let err = Running::spawn(fx.config(), RunOptions::default())
        .finished(TIMEOUT)
        .await
        .expect_err("start must be refused for another cluster's offset");
    assert!(
        matches!(
            err,
            PipelineError::Refused(StartRefused::OtherCluster { .. })
        ),
        "unexpected error: {err}"
    );
    assert!(err.to_string().contains("1234567890"));
    fx.cleanup().await;
}

/// The record value is the payload as stored, whatever the column type and on
/// the message path too (docs/outbox-table.md, "What each row becomes"); a
/// bytea payload column stops `run` with the fix instead of publishing hex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_bytes_are_published_as_stored_on_every_path() {
    common::init_tracing();
    let fx = Fixture::new("bytes").await;
    let prefix = format!("msg_{}", fx.name);
    // pgoutput sends logical decoding messages from PostgreSQL 14 on (on 13 the
    // prefix is refused: tests/it/version_features.rs); there only the table path runs.
    let version: i32 = fx
        .admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    let messages = version >= 140000;
    let config = if messages {
        fx.config_with(&format!("OUTBOX_CDC__OUTBOX__MESSAGE_PREFIX={prefix}"))
    } else {
        fx.config()
    };
    let running = Running::start(config).await;
    let literal = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let insert = |agg: &str, payload: &str| {
        format!(
            "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
             VALUES (gen_random_uuid(), 'order', {agg}, 1, 'TestEvent', {payload});",
            t = fx.table,
            agg = literal(agg),
            payload = literal(payload),
        )
    };
    let alter = |ty: &str, using: &str| {
        format!(
            "ALTER TABLE public.{} ALTER COLUMN payload TYPE {ty} USING {using};",
            fx.table
        )
    };
    // (aggregate id, what is written, what the record value must be)
    let cases = [
        // jsonb keeps numeric scale and digits; its text form is canonical.
        (
            "jsonb",
            r#"{"a":1.10,"big":123456789012345678901234567890,"f":0.1234567890123456789}"#,
            r#"{"a": 1.10, "f": 0.1234567890123456789, "big": 123456789012345678901234567890}"#,
        ),
        // json is stored verbatim: whitespace, key order, duplicate keys.
        (
            "json",
            r#"{"z" : 1.10,  "z": 2}"#,
            r#"{"z" : 1.10,  "z": 2}"#,
        ),
        ("text", "plain text, not JSON", "plain text, not JSON"),
        ("msg-number", "1.10", "1.10"),
        (
            "msg-object",
            r#"{ "big": 123456789012345678901234567890, "x": 0.1234567890123456789 }"#,
            r#"{ "big": 123456789012345678901234567890, "x": 0.1234567890123456789 }"#,
        ),
        ("msg-text", r#""a \"text\" payload""#, r#"a "text" payload"#),
    ];
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|(agg, ..)| messages || !agg.starts_with("msg-"))
        .collect();
    let mut sql = String::new();
    for (agg, written, _) in &cases {
        match *agg {
            "json" => sql.push_str(&alter("json", "payload::json")),
            "text" => sql.push_str(&alter("text", "payload::text")),
            _ => {}
        }
        if let Some(rest) = agg.strip_prefix("msg-") {
            let envelope = format!(
                r#"{{"event_id":"{rest}-{name}","aggregate_type":"order","aggregate_id":"{agg}","event_type":"TestEvent","payload":{written}}}"#,
                name = fx.name
            );
            sql.push_str(&format!(
                "SELECT pg_logical_emit_message(true, {}, {});",
                literal(&prefix),
                literal(&envelope)
            ));
        } else {
            sql.push_str(&insert(agg, written));
        }
    }
    fx.admin.batch_execute(&sql).await.unwrap();

    let records = consume(&fx.topic_prefix, cases.len(), TIMEOUT, SETTLE);
    let by_key: HashMap<&str, &str> = records
        .iter()
        .map(|r| (r.key.as_str(), r.payload.as_str()))
        .collect();
    assert_eq!(records.len(), cases.len(), "{by_key:?}");
    for (agg, _, published) in &cases {
        assert_eq!(
            by_key.get(agg).copied(),
            Some(*published),
            "payload of {agg}"
        );
    }

    // bytea: refused when the Relation message binds, before any row goes out.
    fx.admin
        .batch_execute(&format!(
            "{}{}",
            alter("bytea", "convert_to(payload, 'UTF8')"),
            insert("bytea", r#"{"a": 1}"#)
        ))
        .await
        .unwrap();
    let err = running
        .finished(TIMEOUT)
        .await
        .expect_err("a bytea payload column must stop the connector");
    match &err {
        PipelineError::Mapping {
            source: MapError::PayloadType { column, .. },
            ..
        } => assert_eq!(column, "payload"),
        other => panic!("expected a payload type refusal, got {other}"),
    }
    assert!(err.to_string().contains("jsonb"), "{err}");
    fx.cleanup().await;
}
