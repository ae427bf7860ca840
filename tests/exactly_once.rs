//! Exactly-once delivery (`[delivery] mode = "exactly-once"`, DESIGN.md §14)
//! on the real servers: the connector (the binary, with its crash points) is
//! killed between sending a Kafka transaction and committing it, between the
//! commit and the offset store (with the store kept, then with it wiped), and
//! a frozen instance is fenced by a second one. A `read_committed` reader
//! without any inbox must see every committed event exactly once; a
//! `read_uncommitted` reader sees the aborted copies (so the first reader
//! could have seen them too, had they been committed).
//!
//! Needs the connector's crash points (cargo feature `failpoints`).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::relay::{
    ChildProcess, Fixture, assert_exactly_once, consume_ids, read_uncommitted, spawn_binary_with,
};
use common::{init_tracing, kafka_bootstrap, unique_name};
use outbox_cdc::checkpoint::OffsetStore;
use outbox_cdc::pg::Lsn;
use outbox_cdc::sink::{KafkaSettings, read_marker};

const TIMEOUT: Duration = Duration::from_secs(90);

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

fn log_of(config: &Path) -> String {
    std::fs::read_to_string(config.with_file_name("connector.log")).unwrap_or_default()
}

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

/// Reads (read_committed) until every committed id arrived; each exactly once.
fn read_exactly_once(fx: &Fixture, committed: &BTreeSet<String>, when: &str) {
    let records = consume_ids(&fx.topic_prefix, committed, TIMEOUT, Duration::from_secs(3));
    assert_exactly_once(&records, committed, when);
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
    read_exactly_once(&fx, &committed, "after a kill before the commit");
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
    let mut d = spawn_binary_with(&config, &[]);
    read_exactly_once(
        &fx,
        &committed,
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
    read_exactly_once(&fx, &committed, "after the store was wiped");
    assert!(
        log_of(&config).contains("resuming after it"),
        "the restart resumed from the marker"
    );
    f.terminate(TIMEOUT);
    fx.cleanup().await;
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
    read_exactly_once(&fx, &committed, "after the second instance took over");
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
    read_exactly_once(&fx, &committed, "after the fenced instance stopped");
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
