//! Issue 32, readiness on the real servers (the ones that leave the shared
//! servers running): an HA standby is live and not ready, saying who holds
//! the slot, and becomes ready by itself once it is released; a slot taken
//! by another replication client turns readiness red and green again; a
//! stalled acknowledgement (a topic that needs more in-sync replicas than
//! the broker has) turns `acknowledging` red within its bound and green
//! once Kafka acknowledges. Kafka stopped: `tests/disruptive/health_ready.rs`.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_cdc::health::Readiness;

use crate::common;
use crate::common::relay::{Fixture, Running};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The status code and body of `/health/ready` (or `None`: no answer).
async fn ready(port: u16) -> Option<(u16, Readiness)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (status, body) = outbox_cdc::http::get_any(addr, "/health/ready", Duration::from_secs(2))
        .await
        .ok()?;
    let code = status.split_whitespace().nth(1)?.parse().ok()?;
    let readiness = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("/health/ready body is not the documented JSON ({e}): {body}"));
    Some((code, readiness))
}

/// `/health/ready/detail`, the messages `/health/ready` leaves out, which
/// this host (the test's client on loopback) is shown.
async fn detail(port: u16) -> Readiness {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (_, body) = outbox_cdc::http::get_any(addr, "/health/ready/detail", Duration::from_secs(2))
        .await
        .expect("the detail answers");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("not readiness JSON ({e}): {body}"))
}

/// The public body names the reason's cause, never its message.
fn cause<'r>(r: &'r Readiness, name: &str) -> Option<&'r str> {
    let reason = r.reason(name).unwrap();
    assert!(
        reason.message.is_empty(),
        "/health/ready shows a message: {r:#?}"
    );
    reason.cause.as_deref()
}

async fn live(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    outbox_cdc::http::get(addr, "/health/live", Duration::from_secs(2))
        .await
        .is_ok()
}

/// Waits until reason `name` is `ok` (and the answer's status matches the
/// whole readiness); returns how long it took and the last answer.
async fn until_reason(port: u16, name: &str, ok: bool, within: Duration) -> (Duration, Readiness) {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < within {
        if let Some((code, r)) = ready(port).await {
            assert_eq!(code == 200, r.ready, "status {code} for {r:?}");
            if r.reason(name).is_some_and(|reason| reason.ok == ok) {
                return (started.elapsed(), r);
            }
            last = Some(r);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("reason {name} did not become ok={ok} within {within:?}; last: {last:#?}");
}

async fn until_ready(port: u16, within: Duration) -> Readiness {
    let started = Instant::now();
    loop {
        match ready(port).await {
            Some((200, r)) => return r,
            last => assert!(
                started.elapsed() < within,
                "not ready within {within:?}: {last:#?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn slot_pid(fx: &Fixture) -> Option<i32> {
    fx.admin
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("read the slot")
        .and_then(|r| r.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_live_not_ready_and_takes_over_by_itself() {
    common::init_tracing();
    let fx = Fixture::new("hastandby").await;
    let (pa, pb) = (free_port(), free_port());
    let active = Running::start(fx.config_with(&format!(
        "OUTBOX_CDC__HTTP__LISTEN=127.0.0.1:{pa} OUTBOX_CDC__POSTGRES__ALLOW_SLOT_AHEAD=true"
    )))
    .await;
    until_ready(pa, Duration::from_secs(30)).await;

    let standby_offsets = tempfile::tempdir().unwrap();
    let standby = Running::spawn(
        fx.config_with(&format!(
            "OUTBOX_CDC__HTTP__LISTEN=127.0.0.1:{pb} OUTBOX_CDC__POSTGRES__ALLOW_SLOT_AHEAD=true \
             OUTBOX_CDC__OFFSETS__PATH={}",
            standby_offsets.path().join("offsets").display()
        )),
        Default::default(),
    );
    let holder = slot_pid(&fx)
        .await
        .expect("the active instance holds the slot");
    let (_, r) = until_reason(pb, "streaming", false, Duration::from_secs(30)).await;
    // It must have tried the slot: the cause is the slot in use (the
    // message, on this host only, names the holder).
    let (_, r) = if cause(&r, "streaming") == Some("slot_in_use") {
        (Duration::ZERO, r)
    } else {
        let started = Instant::now();
        loop {
            let (_, r) = ready(pb).await.expect("the standby answers");
            if cause(&r, "streaming") == Some("slot_in_use") {
                break (started.elapsed(), r);
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{r:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert!(live(pb).await, "a standby is live");
    let (code, _) = ready(pb).await.unwrap();
    assert_eq!(code, 503, "a standby is not ready");
    let d = detail(pb).await;
    let message = &d.reason("streaming").unwrap().message;
    assert!(message.starts_with("standby:"), "{message}");
    assert!(message.contains(&format!("PID {holder}")), "{message}");
    assert!(r.reason("kafka_reachable").unwrap().ok, "{r:#?}");

    active
        .stop()
        .await
        .expect("the active instance stops cleanly");
    until_ready(pb, Duration::from_secs(60)).await;
    standby.stop().await.expect("clean stop");
    fx.cleanup().await;
}

/// `pg_recvlogical` holding the slot (streaming the pgoutput protocol from it).
fn recvlogical(fx: &Fixture) -> Child {
    let bin = std::env::var("OUTBOX_CDC_PG_BIN").unwrap_or_else(|_| "/usr/bin".into());
    Command::new(format!("{bin}/pg_recvlogical"))
        .args([
            "-d",
            &common::pg_url(),
            "--slot",
            &fx.slot,
            "--start",
            "-f",
            "/dev/null",
        ])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={}", fx.publication))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pg_recvlogical")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_taken_by_another_process_turns_readiness_red_then_green() {
    common::init_tracing();
    let fx = Fixture::new("slottaken").await;
    let port = free_port();
    // A slow retry leaves time for the other process to take the slot.
    let running = Running::start(fx.config_with(&format!(
        "OUTBOX_CDC__HTTP__LISTEN=127.0.0.1:{port} OUTBOX_CDC__POSTGRES__ALLOW_SLOT_AHEAD=true \
         OUTBOX_CDC__RETRY__INITIAL_BACKOFF_MS=3000 OUTBOX_CDC__RETRY__MAX_BACKOFF_MS=3000"
    )))
    .await;
    until_ready(port, Duration::from_secs(30)).await;
    let ours = slot_pid(&fx).await.expect("streaming");

    let mut taker = None;
    for _ in 0..20 {
        fx.admin
            .execute("SELECT pg_terminate_backend($1)", &[&ours])
            .await
            .expect("terminate our walsender");
        let mut child = recvlogical(&fx);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            if slot_pid(&fx).await.is_some_and(|p| p != ours) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if child.try_wait().unwrap().is_none() && slot_pid(&fx).await.is_some_and(|p| p != ours) {
            taker = Some(child);
            break;
        }
        let _ = child.kill();
        let _ = child.wait();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut taker = taker.expect("pg_recvlogical took the slot");
    let theirs = slot_pid(&fx).await.unwrap();
    let (took, r) = until_reason(port, "streaming", false, Duration::from_secs(10)).await;
    assert!(took < Duration::from_secs(10));
    // The first reconnect names the holder, as a standby's wait.
    let started = Instant::now();
    let mut r = r;
    while cause(&r, "streaming") != Some("slot_in_use") {
        assert!(started.elapsed() < Duration::from_secs(15), "{r:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        r = ready(port).await.unwrap().1;
    }
    assert!(!r.ready);
    let d = detail(port).await;
    let message = &d.reason("streaming").unwrap().message;
    assert!(
        message.starts_with("standby:") && message.contains(&format!("PID {theirs}")),
        "{message}"
    );
    assert!(live(port).await);

    taker.kill().expect("stop pg_recvlogical");
    let _ = taker.wait();
    let (back, _) = until_reason(port, "streaming", true, Duration::from_secs(30)).await;
    assert!(back < Duration::from_secs(30));
    until_ready(port, Duration::from_secs(10)).await;
    assert!(!running.is_finished());
    running.stop().await.expect("clean stop");
    fx.cleanup().await;
}

/// Issue 50 H2: against the running connector's HTTP port, 2,000 clients
/// that connect and say nothing, and slow readers that ask for `/metrics`
/// and never read: `/health/live` still answers within a second, the
/// connector holds no more connections than `http.max_connections`, and a
/// row written meanwhile is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_http_clients_neither_starve_probes_nor_stop_streaming() {
    common::init_tracing();
    let fx = Fixture::new("httpflood").await;
    let config = fx.write_config_file();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    const CAP: usize = 64;
    let mut child = common::relay::spawn_binary_with(
        &config,
        &[
            ("OUTBOX_CDC__HTTP__LISTEN", listen.as_str()),
            ("OUTBOX_CDC__HTTP__MAX_CONNECTIONS", "64"),
        ],
    );
    until_ready(port, Duration::from_secs(60)).await;
    let pid = child.pid();
    let open_files = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let before = open_files();
    let addr: SocketAddr = listen.parse().unwrap();
    let mut idle = Vec::new();
    for _ in 0..2000 {
        idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tokio::io::AsyncWriteExt::write_all(&mut socket, b"GET /metrics HTTP/1.1\r\n\r\n")
            .await
            .expect("send a request");
        slow.push(socket);
    }
    let asked = Instant::now();
    let live = outbox_cdc::http::get(addr, "/health/live", Duration::from_secs(1))
        .await
        .expect("/health/live answered within a second");
    assert!(live.contains("\"live\":true"), "{live}");
    assert!(asked.elapsed() < Duration::from_secs(1));
    // Evicted connections close as their tasks are cancelled, an instant
    // after the accept that evicted them.
    let bound = before + CAP + 8;
    let settled = Instant::now() + Duration::from_secs(2);
    let mut during = open_files();
    while during > bound && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(50)).await;
        during = open_files();
    }
    assert!(
        during <= bound,
        "the connector holds {during} files with 2,050 clients at its port \
         ({before} before; http.max_connections = {CAP})"
    );
    let ids: std::collections::BTreeSet<String> = fx
        .write_tx(&[("order", "flood-1", r#"{"n": 1}"#.to_owned())], true)
        .await
        .into_iter()
        .collect();
    let read = common::relay::read_ids(
        &fx.topic_prefix,
        &ids,
        Duration::from_secs(60),
        Duration::from_millis(200),
    );
    assert!(
        read.is_ok(),
        "the row written during the flood was not published"
    );
    drop((idle, slow));
    child.terminate(Duration::from_secs(30));
    fx.cleanup().await;
}
