//! The metrics say why while Kafka is down: slot lag and the oldest
//! unacknowledged age rise, the acked LSN stands still; after Kafka is back the
//! events arrive and the lag falls. Stops the shared broker
//! (`scripts/env.sh kafka-stop`, then `kafka-start`, also on failure).

use crate::common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::KafkaStopped;
use common::relay::{Fixture, consume, eventually, free_port, log_of, metric, spawn_binary};

const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_and_unacked_age_rise_while_kafka_is_down_and_fall_after() {
    let _alone = common::alone().await;
    common::init_tracing();
    let fx = Fixture::new("opskafka").await;
    let port = free_port();
    let text = fx
        .config_text()
        .replace("listen = \"\"", &format!("listen = \"127.0.0.1:{port}\""));
    let config = fx.offsets_dir.path().join("ops.toml");
    std::fs::write(
        &config,
        format!("{text}\n[monitor]\nslot_poll_interval_ms = 200\n"),
    )
    .expect("write config");
    let mut child = spawn_binary(&config);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(60);
    while outbox_cdc::http::get(addr, "/readyz", Duration::from_secs(1))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "not streaming:\n{}",
            log_of(&config)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut written = Vec::new();
    for i in 0..5 {
        written.extend(
            fx.write_tx(&[("order", "k", format!(r#"{{"n": {i}}}"#))], true)
                .await,
        );
    }
    consume(&fx.topic_prefix, written.len(), TIMEOUT, Duration::ZERO);
    eventually("the first events are acknowledged", TIMEOUT, || async {
        metric(port, "outbox_cdc_events_published_total").await >= 5.0
    })
    .await;

    let mut kafka = KafkaStopped::stop();
    let before = fx.current_wal_lsn().await;
    for i in 5..25 {
        written.extend(
            fx.write_tx(&[("order", "k", format!(r#"{{"n": {i}}}"#))], true)
                .await,
        );
    }
    let wal_written = fx.current_wal_lsn().await.bytes_since(before) as f64;
    let acked_at_outage = metric(port, "outbox_cdc_acked_lsn").await;

    eventually(
        "slot lag covers the WAL written during the outage",
        Duration::from_secs(60),
        || async { metric(port, "outbox_cdc_slot_lag_bytes").await >= wal_written },
    )
    .await;
    eventually(
        "the oldest unacknowledged event ages",
        Duration::from_secs(60),
        || async { metric(port, "outbox_cdc_oldest_unacked_age_seconds").await >= 2.0 },
    )
    .await;
    assert!(
        metric(port, "outbox_cdc_acked_lsn").await <= before.as_u64() as f64,
        "nothing written during the outage is acknowledged"
    );
    assert!(metric(port, "outbox_cdc_acked_lsn").await >= acked_at_outage);
    assert!(metric(port, "outbox_cdc_events_published_total").await < 25.0);
    let lag_during = metric(port, "outbox_cdc_slot_lag_bytes").await;

    kafka.restore();

    let expected: HashSet<&str> = written.iter().map(String::as_str).collect();
    let records = consume(
        &fx.topic_prefix,
        expected.len(),
        TIMEOUT,
        Duration::from_secs(2),
    );
    let got: HashSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    let missing: Vec<&&str> = expected.iter().filter(|id| !got.contains(**id)).collect();
    assert!(
        missing.is_empty(),
        "events lost over the outage: {missing:?}\n{}",
        log_of(&config)
    );
    eventually("the lag falls once Kafka acknowledges", TIMEOUT, || async {
        metric(port, "outbox_cdc_slot_lag_bytes").await < lag_during
            && metric(port, "outbox_cdc_oldest_unacked_age_seconds").await == 0.0
    })
    .await;
    assert!(metric(port, "outbox_cdc_acked_lsn").await > before.as_u64() as f64);

    let exit = child.terminate(Duration::from_secs(60));
    assert!(exit.success(), "graceful stop: {exit}");
    fx.cleanup().await;
}
