//! Issue 32: readiness with Kafka stopped. `kafka_reachable` turns red within
//! its bound (three probe intervals), while nothing waits for Kafka
//! `acknowledging` stays green (no work, nothing stalls); once an event waits,
//! `acknowledging` turns red within its bound, blaming Kafka (issue 50 H3);
//! the process stays live; with Kafka started again everything is green by
//! itself. Stops the shared broker.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::KafkaStopped;
use common::relay::{Fixture, Running};
use outbox_cdc::health::Readiness;

async fn ready(port: u16) -> Option<(u16, Readiness)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (status, body) = outbox_cdc::http::get_any(addr, "/health/ready", Duration::from_secs(2))
        .await
        .ok()?;
    let code = status.split_whitespace().nth(1)?.parse().ok()?;
    Some((
        code,
        serde_json::from_str(&body).expect("the documented JSON"),
    ))
}

/// Waits until `done` holds for `/health/ready`; how long that took.
async fn until(port: u16, within: Duration, done: impl Fn(u16, &Readiness) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let last = ready(port).await;
        if let Some((code, r)) = &last
            && done(*code, r)
        {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "not within {within:?}; last: {last:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ok(r: &Readiness, name: &str) -> bool {
    r.reason(name).is_some_and(|r| r.ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_stopped_turns_readiness_red_within_the_bound_and_green_after() {
    let _alone = common::alone().await;
    common::init_tracing();
    let fx = Fixture::new("readykafka").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let interval = Duration::from_millis(500);
    let ack_bound = Duration::from_millis(3000);
    let running = Running::start(fx.config_with(&format!(
        "OUTBOX_CDC__HTTP__LISTEN=127.0.0.1:{port} OUTBOX_CDC__HEALTH__KAFKA_PROBE_INTERVAL_MS={} \
         OUTBOX_CDC__HEALTH__MAX_UNACKED_AGE_MS={}",
        interval.as_millis(),
        ack_bound.as_millis()
    )))
    .await;
    until(port, Duration::from_secs(30), |code, r| {
        code == 200 && r.ready
    })
    .await;

    let mut kafka = KafkaStopped::stop();
    // Three intervals without an answer, plus the request in flight.
    let bound = interval * 3 + interval;
    let red = until(port, Duration::from_secs(30), |code, r| {
        code == 503 && !ok(r, "kafka_reachable")
    })
    .await;
    assert!(
        red <= bound + Duration::from_secs(2),
        "red after {red:?}, bound {bound:?}"
    );
    let (_, r) = ready(port).await.unwrap();
    assert!(ok(&r, "acknowledging"), "no work waits: {r:#?}");
    // /health/ready names the cause only; the message is for this host.
    let reason = r.reason("kafka_reachable").unwrap();
    assert_eq!(reason.cause.as_deref(), Some("kafka_unreachable"), "{r:#?}");
    assert!(reason.message.is_empty(), "{r:#?}");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (_, body) = outbox_cdc::http::get_any(addr, "/health/ready/detail", Duration::from_secs(2))
        .await
        .expect("the detail answers on loopback");
    let detail: Readiness = serde_json::from_str(&body).expect("readiness JSON");
    let message = &detail.reason("kafka_reachable").unwrap().message;
    assert!(message.contains("bootstrap.servers"), "{message}");
    outbox_cdc::http::get(addr, "/health/live", Duration::from_secs(2))
        .await
        .expect("live while Kafka is down");
    let text = outbox_cdc::http::get(addr, "/metrics", Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        text.contains("outbox_cdc_ready_reason{reason=\"kafka_reachable\"} 0\n")
            && text.contains("outbox_cdc_ready 0\n"),
        "{text}"
    );

    // Work waiting for the stopped broker: `acknowledging` turns red within
    // its bound, and its cause is Kafka (nothing acknowledged meanwhile), not
    // a backlog being worked through. (A topic that wants more in-sync
    // replicas than this single broker has does not stall acks=all on Kafka
    // 4.x: the broker caps min.insync.replicas at the replication factor.)
    let mut ids = fx
        .write_tx(&[("order", "w", r#"{"n": 0}"#.to_owned())], true)
        .await;
    let written = Instant::now();
    until(port, Duration::from_secs(30), |_, r| {
        !ok(r, "acknowledging")
    })
    .await;
    let red_after = written.elapsed();
    assert!(
        red_after + Duration::from_millis(200) >= ack_bound
            && red_after < ack_bound + Duration::from_secs(3),
        "acknowledging red after {red_after:?} for a bound of {ack_bound:?}"
    );
    let (_, r) = ready(port).await.unwrap();
    let reason = r.reason("acknowledging").unwrap();
    assert_eq!(
        reason.cause.as_deref(),
        Some("acknowledgement_overdue"),
        "{r:#?}"
    );

    kafka.restore();
    until(port, Duration::from_secs(60), |code, r| {
        code == 200 && r.ready
    })
    .await;
    // And it still publishes.
    ids.extend(
        fx.write_tx(&[("order", "k", r#"{"n": 1}"#.to_owned())], true)
            .await,
    );
    let records =
        common::relay::consume(&fx.topic_prefix, 2, Duration::from_secs(60), Duration::ZERO);
    let mut got: Vec<&str> = records.iter().map(|r| r.header("event_id")).collect();
    got.sort_unstable();
    ids.sort_unstable();
    assert_eq!(got, ids);
    running.stop().await.expect("clean stop");
    fx.cleanup().await;
}
