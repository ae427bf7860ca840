//! Issue 32: readiness with Kafka stopped. `kafka_reachable` turns red within
//! its bound (three probe intervals), while nothing waits for Kafka
//! `acknowledging` stays green (no work, nothing stalls), the process stays
//! live; with Kafka started again everything is green by itself. Stops the
//! shared broker.

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
    let running = Running::start(fx.config_with(&format!(
        "OUTBOX_CDC__HTTP__LISTEN=127.0.0.1:{port} OUTBOX_CDC__HEALTH__KAFKA_PROBE_INTERVAL_MS={}",
        interval.as_millis()
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

    kafka.restore();
    until(port, Duration::from_secs(60), |code, r| {
        code == 200 && r.ready
    })
    .await;
    // And it still publishes.
    let ids = fx
        .write_tx(&[("order", "k", r#"{"n": 1}"#.to_owned())], true)
        .await;
    let records =
        common::relay::consume(&fx.topic_prefix, 1, Duration::from_secs(60), Duration::ZERO);
    assert_eq!(records[0].header("event_id"), ids[0]);
    running.stop().await.expect("clean stop");
    fx.cleanup().await;
}
