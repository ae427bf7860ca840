//! High availability (DESIGN.md §11, docs/operations.md "HA standby"): two
//! connector processes on one slot, each with its own offset store. PostgreSQL
//! lets one consumer stream from a slot, so the standby's start fails with
//! SlotActive and retries; after the active one is killed with SIGKILL, the
//! standby takes over from the slot's confirmed position and every event
//! written before, during and after arrives at least once.

use crate::common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::relay::{
    ChildProcess, Fixture, Record, consume, eventually, free_port, log_of, spawn_binary,
    spawn_binary_with,
};

const TIMEOUT: Duration = Duration::from_secs(120);

/// One instance's config: its own offsets directory and HTTP port, the shared
/// slot, and `allow_slot_ahead` (the peer advances the slot past this store).
fn instance_config(fx: &Fixture, dir: &Path, port: u16) -> PathBuf {
    let offsets = dir.join("offsets");
    let text = fx
        .config_text()
        .replace(
            &fx.offsets_path().display().to_string(),
            &offsets.display().to_string(),
        )
        .replace("listen = \"\"", &format!("listen = \"127.0.0.1:{port}\""))
        .replace(
            "status_interval_ms = 1000",
            "status_interval_ms = 1000\nallow_slot_ahead = true",
        );
    assert!(text.contains("allow_slot_ahead = true") && text.contains(&format!(":{port}")));
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!("{text}\n[monitor]\nslot_poll_interval_ms = 200\n"),
    )
    .expect("write config");
    path
}

async fn get(port: u16, path: &str) -> Option<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    outbox_cdc::http::get(addr, path, Duration::from_secs(2))
        .await
        .ok()
}

async fn streaming(port: u16) -> bool {
    get(port, "/readyz").await.is_some()
}

async fn gauge(port: u16, name: &str) -> Option<f64> {
    let body = get(port, "/metrics").await?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

async fn slot_active_pid(fx: &Fixture) -> Option<i32> {
    fx.admin
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("read the slot")
        .and_then(|r| r.get(0))
}

fn payload(phase: &str, i: usize) -> String {
    format!(r#"{{"phase": "{phase}", "n": {i}}}"#)
}

async fn write_events(fx: &Fixture, phase: &str, n: usize, into: &mut Vec<String>) {
    for i in 0..n {
        let agg = format!("{phase}-{}", i % 4);
        into.extend(
            fx.write_tx(&[("order", agg.as_str(), payload(phase, i))], true)
                .await,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_waits_on_the_slot_and_takes_over_when_the_active_one_dies() {
    common::init_tracing();
    let fx = Fixture::new("ha").await;
    let dir_a = tempfile::tempdir().expect("dir for the active instance");
    let dir_b = tempfile::tempdir().expect("dir for the standby");
    let (port_a, port_b) = (free_port(), free_port());
    let config_a = instance_config(&fx, dir_a.path(), port_a);
    let config_b = instance_config(&fx, dir_b.path(), port_b);

    let mut active: ChildProcess = spawn_binary(&config_a);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !streaming(port_a).await {
        assert!(
            Instant::now() < deadline,
            "active instance not streaming:\n{}",
            log_of(&config_a)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let holder = slot_active_pid(&fx)
        .await
        .expect("the active instance holds the slot");

    let mut standby: ChildProcess = spawn_binary(&config_b);
    eventually(
        "the standby retries with SlotActive naming the holder",
        TIMEOUT,
        || async {
            let log = log_of(&config_b);
            log.matches("is active for PID").count() >= 2 && log.contains(&format!("PID {holder}"))
        },
    )
    .await;
    assert!(
        !streaming(port_b).await,
        "the standby must not stream while the slot is held"
    );
    assert_eq!(gauge(port_b, "outbox_cdc_connected").await, Some(0.0));
    assert!(
        gauge(port_b, "outbox_cdc_reconnects_total")
            .await
            .is_some_and(|n| n >= 1.0)
    );
    eventually(
        "the standby's monitor sees the slot held by someone",
        TIMEOUT,
        || async { gauge(port_b, "outbox_cdc_slot_active").await == Some(1.0) },
    )
    .await;

    let mut written = Vec::new();
    write_events(&fx, "before", 20, &mut written).await;
    let seen = consume(
        &fx.topic_prefix,
        written.len(),
        TIMEOUT,
        Duration::from_secs(1),
    );
    let seen_ids: std::collections::BTreeSet<&str> =
        seen.iter().map(|r| r.header("event_id")).collect();
    let missing: Vec<&String> = written
        .iter()
        .filter(|id| !seen_ids.contains(id.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not published before the takeover: {missing:?}"
    );

    // Some of these are still in flight or unacknowledged when the active dies.
    write_events(&fx, "during", 10, &mut written).await;
    active.kill9();
    write_events(&fx, "during", 20, &mut written).await;

    let deadline = Instant::now() + TIMEOUT;
    while !streaming(port_b).await {
        assert!(
            Instant::now() < deadline,
            "the standby did not take over:\n{}",
            log_of(&config_b)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new_holder = slot_active_pid(&fx).await;
    assert!(
        new_holder.is_some_and(|p| p != holder),
        "a new walsender streams the slot"
    );

    write_events(&fx, "after", 20, &mut written).await;

    let expected: HashSet<&str> = written.iter().map(String::as_str).collect();
    let mut want = expected.len();
    let deadline = Instant::now() + TIMEOUT;
    let missing = loop {
        let records = consume(&fx.topic_prefix, want, TIMEOUT, Duration::from_secs(3));
        let got: HashSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
        let missing: Vec<&str> = expected
            .iter()
            .filter(|id| !got.contains(*id))
            .copied()
            .collect();
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        // Duplicates of the in-flight window count toward `want`; wait for more.
        want = records.len() + missing.len();
    };
    assert!(
        missing.is_empty(),
        "{} of {} events never arrived after the takeover, e.g. {:?}\nstandby log:\n{}",
        missing.len(),
        expected.len(),
        &missing[..missing.len().min(5)],
        log_of(&config_b)
    );
    assert!(
        gauge(port_b, "outbox_cdc_events_published_total")
            .await
            .is_some_and(|n| n >= 20.0)
    );

    let exit = standby.terminate(Duration::from_secs(60));
    assert!(exit.success(), "standby stops gracefully: {exit}");
    fx.cleanup().await;
}

/// Review consumer-replay F2: with `on_poison = "dead-letter"`, an aggregate
/// parked by the active instance stays parked when the standby, whose own
/// store never saw the poison event, takes the slot over (before, its next
/// event went to the main topic past the poison one). `parked` and `release`
/// work on the standby while it runs, and a released aggregate's next event
/// goes to its topic, after its earlier ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_aggregate_stays_parked_when_the_standby_takes_over() {
    common::init_tracing();
    let fx = Fixture::new("haparked").await;
    let dlq = format!("{}.dlq", fx.topic_prefix);
    let main_topic = format!("{}.order", fx.topic_prefix);
    let env = [
        ("OUTBOX_CDC__OUTBOX__ON_POISON", "dead-letter"),
        ("OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC", dlq.as_str()),
        ("OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES", "2000"),
    ];
    let dir_a = tempfile::tempdir().expect("dir for instance A");
    let dir_b = tempfile::tempdir().expect("dir for instance B");
    let (port_a, port_b) = (free_port(), free_port());
    let config_a = instance_config(&fx, dir_a.path(), port_a);
    let config_b = instance_config(&fx, dir_b.path(), port_b);
    let wait_streaming = async |port: u16, config: &Path| {
        let deadline = Instant::now() + TIMEOUT;
        while !streaming(port).await {
            assert!(
                Instant::now() < deadline,
                "instance not streaming:\n{}",
                log_of(config)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let small = |n: usize| format!(r#"{{"n": {n}}}"#);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
            .arg(args[0])
            .arg("--config")
            .arg(&config_b)
            .args(&args[1..])
            .envs(env.iter().copied())
            .output()
            .expect("run outbox-cdc");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "outbox-cdc {args:?}: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };

    let mut a = spawn_binary_with(&config_a, &env);
    wait_streaming(port_a, &config_a).await;
    let first = fx.write_tx(&[("order", "a1", small(1))], true).await;
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    let poison = fx.write_tx(&[("order", "a1", huge)], true).await;
    let other = fx.write_tx(&[("order", "a2", small(2))], true).await;
    let records = consume(&fx.topic_prefix, 3, TIMEOUT, Duration::from_secs(1));
    let topic_of = |records: &[Record], id: &str| -> Vec<String> {
        records
            .iter()
            .filter(|r| r.header("event_id") == id)
            .map(|r| r.topic.clone())
            .collect()
    };
    assert_eq!(topic_of(&records, &poison[0]), vec![dlq.clone()]);
    assert_eq!(topic_of(&records, &other[0]), vec![main_topic.clone()]);
    let exit = a.terminate(Duration::from_secs(60));
    assert!(exit.success(), "A stops gracefully: {exit}");

    // B has its own store, which never saw the poison event.
    let mut b = spawn_binary_with(&config_b, &env);
    wait_streaming(port_b, &config_b).await;
    let after = fx.write_tx(&[("order", "a1", small(3))], true).await;
    let records = consume(&fx.topic_prefix, 4, TIMEOUT, Duration::from_secs(2));
    assert_eq!(
        topic_of(&records, &after[0]),
        vec![dlq.clone()],
        "after the takeover, a1 is still parked: its event follows the poison one to the dead-letter topic\n{}",
        log_of(&config_b)
    );
    let listed = cli(&["parked"]);
    assert!(
        listed.lines().any(|l| l.starts_with("order\ta1\t")),
        "`parked` on B, while B runs, lists a1: {listed:?}"
    );

    let released = cli(&["release", "order", "a1"]);
    assert!(released.contains("released order/a1"), "{released}");
    eventually("B takes up the release", TIMEOUT, || async {
        log_of(&config_b).contains("aggregate released")
    })
    .await;
    let last = fx.write_tx(&[("order", "a1", small(4))], true).await;
    let records = consume(&fx.topic_prefix, 5, TIMEOUT, Duration::from_secs(2));
    let order_on = |topic: &str| -> Vec<String> {
        let mut on: Vec<&Record> = records
            .iter()
            .filter(|r| r.topic == topic && r.key == "a1")
            .collect();
        on.sort_by_key(|r| (r.partition, r.offset));
        let mut ids: Vec<String> = Vec::new();
        for r in on {
            let id = r.header("event_id").to_owned();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    };
    assert_eq!(
        order_on(&main_topic),
        vec![first[0].clone(), last[0].clone()],
        "a1 on its topic: the event before the poison one, then the one after the release"
    );
    assert_eq!(
        order_on(&dlq),
        vec![poison[0].clone(), after[0].clone()],
        "a1 on the dead-letter topic: the poison event, then the one B parked"
    );
    let exit = b.terminate(Duration::from_secs(60));
    assert!(exit.success(), "B stops gracefully: {exit}");
    fx.cleanup().await;
}
