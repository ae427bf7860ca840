//! Exactly-once delivery (`[delivery] mode = "exactly-once"`, DESIGN.md §14)
//! on the real servers; a `read_committed` reader without any inbox must see
//! every committed event exactly once.
//!
//! - In-process: poison records and dead letters go through the same Kafka
//!   transactions (a record the mapper refuses, and one the broker refuses,
//!   which aborts its whole transaction and replays it), and a PostgreSQL
//!   transaction too large for one Kafka transaction stops the connector
//!   naming the limits, with nothing of it visible or acknowledged.
//! - The binary: killed between sending a Kafka transaction and committing
//!   it, between the commit and the offset store (with the store kept, then
//!   with it wiped), where a `read_uncommitted` reader sees the aborted copies
//!   (so the first reader could have seen them too, had they been committed);
//!   this one needs the connector's crash points (cargo feature `failpoints`)
//!   and is compiled only with them. And a frozen instance fenced by a second
//!   one.
//!
//! Kafka outages in this mode stop the shared broker: `disruptive::exactly_once`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::relay::{
    ChildProcess, Fixture, Running, consume, log_of, read_exactly_once, read_records,
    read_uncommitted, spawn_binary_with,
};
use common::{create_topic, init_tracing, unique_name};
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
    init_tracing();
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

/// Each Kafka transaction opens with a marker repeating the position before
/// it (so the offsets partition is in the transaction before the commit) and
/// closes with the marker of its last PostgreSQL commit; what a start reads,
/// the last marker, is a closing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kafka_transaction_opens_and_closes_with_a_marker() {
    init_tracing();
    let fx = Fixture::new("eo_markers").await;
    // The offsets topic under a prefix of its own: read with the helpers
    // that read a prefix's topics.
    let markers = unique_name("eo_markers");
    let offsets_topic = format!("{markers}.offsets");
    let env = format!(
        "OUTBOX_CDC__DELIVERY__MODE=exactly-once OUTBOX_CDC__DELIVERY__OFFSETS_TOPIC={offsets_topic} \
         OUTBOX_CDC__DELIVERY__MAX_BATCH_MS=50"
    );
    let running = Running::start(fx.config_with(&env)).await;
    let mut committed = BTreeSet::new();
    for i in 0..3 {
        let aggregate = format!("m{i}");
        committed.extend(
            fx.write_tx(&[("order", &aggregate, "{}".into())], true)
                .await,
        );
        // Visible only once its Kafka transaction committed: the next row
        // goes into a transaction of its own.
        read_exactly_once(&fx, &committed, TIMEOUT, "after each row");
    }
    let records = consume(&markers, 6, TIMEOUT, Duration::from_secs(2));
    running.stop().await.expect("clean stop");
    let system_id: String = fx
        .admin
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .expect("system identifier")
        .get(0);
    let key = outbox_cdc::sink::Marker::key(&system_id, &fx.slot);
    let lsn = |r: &common::relay::Record| -> outbox_cdc::pg::Lsn {
        r.header("lsn").parse().expect("an LSN header")
    };
    let roles: Vec<&str> = records.iter().map(|r| r.header("marker")).collect();
    assert_eq!(
        roles,
        ["opening", "closing"].repeat(3),
        "three Kafka transactions, each opened and closed by a marker: {records:#?}"
    );
    assert!(records.iter().all(|r| r.key == key), "{records:#?}");
    for (i, pair) in records.chunks(2).enumerate() {
        let (opening, closing) = (lsn(&pair[0]), lsn(&pair[1]));
        assert!(
            opening < closing,
            "transaction {i}: the opening marker repeats an earlier position ({opening} < {closing})"
        );
        if i > 0 {
            let before = lsn(&records[2 * i - 1]);
            assert!(
                opening >= before,
                "transaction {i}: the opening marker ({opening}) is not behind the last commit ({before})"
            );
        }
    }
    let settings: outbox_cdc::sink::KafkaSettings =
        [("bootstrap.servers", common::kafka_bootstrap())]
            .into_iter()
            .collect();
    let read = tokio::task::block_in_place(|| {
        outbox_cdc::sink::read_marker(&settings, &offsets_topic, 0, &system_id, &fx.slot, TIMEOUT)
    })
    .expect("read the marker")
    .expect("a committed marker");
    assert_eq!(
        read.lsn,
        lsn(&records[5]),
        "a start reads the last closing marker"
    );
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_too_large_for_one_kafka_transaction_stops_naming_the_limits() {
    init_tracing();
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

/// The fixture's configuration in exactly-once mode, written to a file.
fn write_config(fx: &Fixture, offsets_topic: &str, extra: &str) -> PathBuf {
    // Coverage proofs every 200 ms: the acknowledged position would
    // otherwise stay at the start-up proof for the length of these tests,
    // hiding an acknowledgement that ran ahead of the Kafka commit.
    let text = format!(
        "{}\n[monitor]\nslot_poll_interval_ms = 200\n\n[delivery]\nmode = \"exactly-once\"\noffsets_topic = \"{offsets_topic}\"\n{extra}\n",
        fx.config_text()
    );
    let path = fx.offsets_dir.path().join("config.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// Waits for a process that is to kill itself at a crash point.
fn wait_dead(p: &mut ChildProcess, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(status) = p.try_wait() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still running after {TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_fences_a_frozen_one() {
    init_tracing();
    let fx = Fixture::new("eo_fence").await;
    let offsets_topic = unique_name("eo_offsets");
    // A long batch age: the first instance holds its transaction open while frozen.
    let config = write_config(&fx, &offsets_topic, "max_batch_ms = 6000");
    let mut a = spawn_binary_with(&config, &[]);
    fx.wait_for_slot().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let committed: BTreeSet<String> = fx
        .write_tx(
            &[("order", "f1", "{}".into()), ("order", "f2", "{}".into())],
            true,
        )
        .await
        .into_iter()
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let pid = a.pid();
    signal(pid, "-STOP");
    let frozen_at = Instant::now();
    let produced = read_uncommitted(&fx.topic_prefix, 2, TIMEOUT, Duration::from_millis(200));
    assert!(
        produced.as_ref().is_ok_and(|r| r.len() == 2),
        "the frozen instance had sent its open transaction: {produced:?}"
    );
    // Its walsender goes (as when a network partition outlasts
    // wal_sender_timeout): the slot is free for the second instance.
    fx.admin
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("terminate the walsender");
    let b_dir = tempfile::tempdir().expect("second instance's dir");
    let b_offsets = b_dir.path().join("offsets");
    let b_config = b_dir.path().join("config.toml");
    std::fs::write(
        &b_config,
        std::fs::read_to_string(&config)
            .expect("config")
            .replace(
                &fx.offsets_path().display().to_string(),
                &b_offsets.display().to_string(),
            )
            .replace("max_batch_ms = 6000", "max_batch_ms = 50"),
    )
    .expect("second config");
    let mut b = spawn_binary_with(&b_config, &[]);
    read_exactly_once(
        &fx,
        &committed,
        TIMEOUT,
        "after the second instance took over",
    );
    // Thawed once its batch is due: its first act is to commit it.
    tokio::time::sleep(Duration::from_millis(6500).saturating_sub(frozen_at.elapsed())).await;
    signal(pid, "-CONT");
    let status = wait_dead(&mut a, "the fenced instance");
    assert!(!status.success(), "{status:?}");
    let log = log_of(&config);
    assert!(
        log.contains("fenced"),
        "the first instance says it was fenced:\n{log}"
    );
    // Nothing of the fenced instance became visible.
    read_exactly_once(
        &fx,
        &committed,
        TIMEOUT,
        "after the fenced instance stopped",
    );
    b.terminate(TIMEOUT);
    fx.cleanup().await;
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// The crash at the Kafka commit: the connector's crash points, compiled in
/// only with the `failpoints` feature.
#[cfg(feature = "failpoints")]
mod crash_points {
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::time::Duration;

    use super::{TIMEOUT, wait_dead, write_config};
    use crate::common::relay::{
        ChildProcess, Fixture, log_of, read_exactly_once, read_uncommitted, spawn_binary_with,
    };
    use crate::common::{init_tracing, kafka_bootstrap, unique_name};
    use outbox_cdc::checkpoint::OffsetStore;
    use outbox_cdc::pg::Lsn;
    use outbox_cdc::sink::{KafkaSettings, read_marker};

    fn stored(fx: &Fixture) -> Option<Lsn> {
        let store = OffsetStore::open(&fx.offsets_path()).expect("open the offset store");
        store
            .load(&fx.slot)
            .expect("load the stored offset")
            .map(|s| s.lsn)
    }

    async fn system_id(fx: &Fixture) -> String {
        fx.admin
            .query_one(
                "SELECT system_identifier::text FROM pg_control_system()",
                &[],
            )
            .await
            .expect("system identifier")
            .get(0)
    }

    /// One committed transaction of `n` outbox rows over three aggregates;
    /// returns their event ids.
    async fn write_rows(fx: &Fixture, first: usize, n: usize) -> Vec<String> {
        let rows: Vec<(&str, String, String)> = (first..first + n)
            .map(|i| ("order", format!("o{}", i % 3), format!("{{\"n\":{i}}}")))
            .collect();
        let refs: Vec<(&str, &str, String)> = rows
            .iter()
            .map(|(t, id, payload)| (*t, id.as_str(), payload.clone()))
            .collect();
        fx.write_tx(&refs, true).await
    }

    /// The connector armed to kill itself at `point` the first time; `extra`
    /// more environment.
    fn crashing_at(config: &Path, point: &str, extra: &[(&str, &str)]) -> ChildProcess {
        let spec = format!("{point}:1");
        let mut env = vec![("OUTBOX_CDC_FAILPOINT", spec.as_str())];
        env.extend_from_slice(extra);
        spawn_binary_with(config, &env)
    }

    /// The stream's last committed marker, read as a start reads it.
    async fn last_marker(fx: &Fixture, offsets_topic: &str) -> outbox_cdc::sink::Marker {
        let settings: KafkaSettings = [("bootstrap.servers", kafka_bootstrap())]
            .into_iter()
            .collect();
        let system_id = system_id(fx).await;
        read_marker(
            &settings,
            offsets_topic,
            0,
            &system_id,
            &fx.slot,
            Duration::from_secs(30),
        )
        .expect("read the marker")
        .expect("a marker after a committed transaction")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crashes_around_the_kafka_commit_publish_nothing_twice() {
        init_tracing();
        let fx = Fixture::new("eo_crash").await;
        let offsets_topic = unique_name("eo_offsets");
        let config = write_config(&fx, &offsets_topic, "max_batch_ms = 50");
        let mut committed = BTreeSet::new();

        // 1. Killed with the batch sent but not committed: the next start's
        //    producer aborts it, and the rows are published again, once. A batch
        //    age long enough for its records to reach the broker before the kill
        //    (they would otherwise die in the producer's queue, unseen).
        let slow = [("OUTBOX_CDC__DELIVERY__MAX_BATCH_MS", "1500")];
        let mut a = crashing_at(&config, "before-kafka-commit", &slow);
        fx.wait_for_slot().await;
        committed.extend(write_rows(&fx, 0, 3).await);
        let status = wait_dead(&mut a, "killed before the Kafka commit");
        assert!(!status.success(), "{status:?}");
        let mut b = spawn_binary_with(&config, &[]);
        read_exactly_once(&fx, &committed, TIMEOUT, "after a kill before the commit");
        let all = read_uncommitted(&fx.topic_prefix, 6, TIMEOUT, Duration::from_secs(1))
            .unwrap_or_else(|got| {
                panic!(
                    "read_uncommitted: {} records, expected the aborted 3 and the committed 3",
                    got.len()
                )
            });
        assert_eq!(all.len(), 6, "read_uncommitted sees the aborted batch too");
        b.terminate(TIMEOUT);

        // 2. Killed after the commit, before the offset store: the marker is
        //    ahead of the store, and the restart resumes after the marker.
        let mut c = crashing_at(&config, "after-kafka-commit-before-persist", &[]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = fx.wal_insert_lsn().await;
        committed.extend(write_rows(&fx, 3, 2).await);
        let status = wait_dead(&mut c, "killed after the Kafka commit");
        assert!(!status.success(), "{status:?}: {}", log_of(&config));
        assert!(
            stored(&fx).is_some_and(|s| s <= before),
            "the store must not have reached the committed transaction ({:?} vs {before})",
            stored(&fx)
        );
        let marker = last_marker(&fx, &offsets_topic).await;
        assert!(
            marker.lsn > before,
            "the marker covers the committed transaction"
        );
        // The live witness's rounds every 100 ms: the first one runs while
        // the server still sends what the marker covers, whose events the
        // crash kept from the witness's pages (published twice before
        // Metrics::witness_covered).
        let mut d = spawn_binary_with(&config, &[("OUTBOX_CDC__RECONCILE__INTERVAL_MS", "100")]);
        read_exactly_once(
            &fx,
            &committed,
            TIMEOUT,
            "after a kill between the commit and the store",
        );
        d.terminate(TIMEOUT);

        // 3. The same crash, then the offset store is lost: the marker alone
        //    says where to resume (the slot is behind it).
        let mut e = crashing_at(&config, "after-kafka-commit-before-persist", &[]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        committed.extend(write_rows(&fx, 5, 3).await);
        let status = wait_dead(&mut e, "killed after the Kafka commit (store to be wiped)");
        assert!(!status.success(), "{status:?}");
        std::fs::remove_dir_all(fx.offsets_path()).expect("wipe the offset store");
        let confirmed = fx.confirmed_lsn().await;
        let marker = last_marker(&fx, &offsets_topic).await;
        assert!(
            confirmed < marker.lsn,
            "the slot ({confirmed}) must be behind the marker ({}) for this to prove anything",
            marker.lsn
        );
        let mut f = spawn_binary_with(&config, &[]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        committed.extend(write_rows(&fx, 8, 2).await);
        read_exactly_once(&fx, &committed, TIMEOUT, "after the store was wiped");
        assert!(
            log_of(&config).contains("resuming after it"),
            "the restart resumed from the marker"
        );
        // 4. Idle after the last Kafka commit, so the slot is confirmed past
        //    the marker (the usual state), stopped, then the store lost: the
        //    start takes over from the slot, as docs/guarantees.md says,
        //    instead of refusing it as ahead of the marker (review F4).
        let marker = last_marker(&fx, &offsets_topic).await;
        crate::common::relay::eventually("the slot confirmed past the marker", TIMEOUT, || async {
            fx.confirmed_lsn().await > marker.lsn
        })
        .await;
        f.terminate(TIMEOUT);
        std::fs::remove_dir_all(fx.offsets_path()).expect("wipe the offset store");
        let mut g = spawn_binary_with(&config, &[]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        committed.extend(write_rows(&fx, 10, 2).await);
        read_exactly_once(
            &fx,
            &committed,
            TIMEOUT,
            "after the store was lost while idle",
        );
        assert!(
            g.try_wait().is_none(),
            "the start was refused: {}",
            log_of(&config)
        );
        g.terminate(TIMEOUT);
        fx.cleanup().await;
    }
}
