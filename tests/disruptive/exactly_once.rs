//! Exactly-once delivery across Kafka outages (issue 28, audit F8 and F9):
//! a connector that starts while the broker is down waits for it and then
//! streams; a broker outage inside a PostgreSQL transaction larger than
//! `limits.max_in_flight_events` aborts the Kafka transaction and retries
//! from the durable LSN. Neither is an operator stop, and a `read_committed`
//! reader sees every committed row exactly once. Stops the shared broker.
//! The exactly-once tests that leave the servers alone: `it::exactly_once`.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::KafkaStopped;
use common::relay::{Fixture, Running, read_exactly_once};
use common::{init_tracing, unique_name};
use outbox_cdc::pipeline::RunOptions;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Keeps checking, for `how_long`, that the connector has not stopped.
async fn still_running_for(running: &Running, how_long: Duration, what: &str) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        assert!(
            !running.is_finished(),
            "{what}: the connector stopped (a broker outage must be a retry)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_retries_through_kafka_outages_at_start_and_inside_a_large_transaction() {
    let _alone = common::alone().await;
    init_tracing();
    let fx = Fixture::new("eo_outage").await;
    let offsets_topic = unique_name("eo_outage_offsets");
    // A 10 s transaction timeout: a PostgreSQL transaction may keep a Kafka
    // transaction open for 7.5 s. 100 events in flight: a 500-row
    // transaction cannot be read whole while Kafka does not acknowledge.
    let config = || {
        fx.config_with(&format!(
            "OUTBOX_CDC__DELIVERY__MODE=exactly-once \
             OUTBOX_CDC__DELIVERY__OFFSETS_TOPIC={offsets_topic} \
             OUTBOX_CDC__DELIVERY__TRANSACTION_TIMEOUT_MS=10000 \
             OUTBOX_CDC__DELIVERY__MAX_BATCH_MS=50 \
             OUTBOX_CDC__LIMITS__MAX_IN_FLIGHT_EVENTS=100"
        ))
    };
    let mut committed = BTreeSet::new();

    // The slot and the offsets topic exist (a first start creates the slot
    // where it begins: rows written before it are not the relay's).
    let first = Running::start(config()).await;
    committed.extend(fx.write_tx(&[("order", "a", "{}".into())], true).await);
    read_exactly_once(&fx, &committed, TIMEOUT, "before any outage");
    first.stop().await.expect("graceful stop");

    // 1. A start while the broker is down (CI seed 1796243835680920946: the
    //    start met the broker coming back and stopped for good).
    let mut kafka = KafkaStopped::stop();
    for i in 0..5 {
        let agg = format!("s{}", i % 2);
        committed.extend(
            fx.write_tx(&[("order", agg.as_str(), "{}".into())], true)
                .await,
        );
    }
    let running = Running::spawn(config(), RunOptions::default());
    still_running_for(&running, Duration::from_secs(15), "started with Kafka down").await;
    kafka.restore();
    read_exactly_once(&fx, &committed, TIMEOUT, "after a start with Kafka down");
    assert!(
        running.metrics.reconnects() > 0,
        "the start against a stopped broker must have been retried"
    );

    // 2. Kafka stops inside a PostgreSQL transaction of 500 rows (audit F9:
    //    TransactionTooLarge stopped the connector 7.5 s later).
    let reconnects_before = running.metrics.reconnects();
    let mut kafka = KafkaStopped::stop();
    let rows: Vec<(&str, String, String)> = (0..500)
        .map(|i| ("order", format!("b{}", i % 7), format!("{{\"n\":{i}}}")))
        .collect();
    let refs: Vec<(&str, &str, String)> = rows
        .iter()
        .map(|(t, a, p)| (*t, a.as_str(), p.clone()))
        .collect();
    committed.extend(fx.write_tx(&refs, true).await);
    still_running_for(
        &running,
        Duration::from_secs(20),
        "Kafka down inside a large transaction",
    )
    .await;
    assert!(
        running.metrics.reconnects() > reconnects_before,
        "the stalled Kafka transaction must have been abandoned and the session restarted"
    );
    kafka.restore();
    read_exactly_once(
        &fx,
        &committed,
        TIMEOUT,
        "after an outage inside a large transaction",
    );

    running
        .stop()
        .await
        .expect("graceful stop after the outages");
    fx.cleanup().await;
}

/// Issue 50 F6 (a): a stop while a Kafka transaction is open and the broker
/// is gone. The last commit waits no longer than `shutdown_timeout_ms` (it
/// waited `transaction_timeout_ms`, 60 s by default, past what orchestrators
/// allow a stop); its outcome is then unknown, and the next start learns it
/// from the marker, as after a crash there: every row once. A start while
/// Kafka is still gone ends as promptly at a stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_kafka_gone_and_a_transaction_open_is_bounded() {
    let _alone = common::alone().await;
    init_tracing();
    let fx = Fixture::new("eo_stop_gone").await;
    let offsets_topic = unique_name("eo_stop_gone_offsets");
    // A Kafka transaction stays open up to 15 s after its first record.
    let config = || {
        fx.config_with(&format!(
            "OUTBOX_CDC__DELIVERY__MODE=exactly-once \
             OUTBOX_CDC__DELIVERY__OFFSETS_TOPIC={offsets_topic} \
             OUTBOX_CDC__DELIVERY__MAX_BATCH_MS=15000 \
             OUTBOX_CDC__LIMITS__SHUTDOWN_TIMEOUT_MS=2000"
        ))
    };
    let mut committed = BTreeSet::new();
    let running = Running::start(config()).await;
    committed.extend(fx.write_tx(&[("order", "a", "{}".into())], true).await);
    read_exactly_once(&fx, &committed, TIMEOUT, "before the outage");

    committed.extend(fx.write_tx(&[("order", "a", "{}".into())], true).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut kafka = KafkaStopped::stop();
    let asked = Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(20), running.stop()).await;
    let took = asked.elapsed();
    eprintln!("stop with Kafka gone and a transaction open: {stopped:?} after {took:?}");
    assert!(
        stopped.is_ok() && took < Duration::from_secs(12),
        "the stop took {took:?} (shutdown_timeout_ms 2000): {stopped:?}"
    );

    // A start while Kafka is still gone waits and retries; a stop asked
    // meanwhile ends it at once. (A broker that answers while its
    // transaction coordinator does not holds the start in init_transactions
    // instead: the unit test sink::transactional::tests::
    // a_waiting_init_lets_a_stop_in_between_its_steps covers that wait.)
    let starting = Running::spawn(config(), RunOptions::default());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !starting.is_finished(),
        "a start with Kafka gone ended by itself (it must wait and retry)"
    );
    let asked = Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(20), starting.stop()).await;
    let took = asked.elapsed();
    eprintln!("stop during a start with Kafka gone: {stopped:?} after {took:?}");
    assert!(
        matches!(stopped, Ok(Ok(()))) && took < Duration::from_secs(5),
        "the stop during the start took {took:?}: {stopped:?}"
    );

    kafka.restore();
    let running = Running::start(config()).await;
    read_exactly_once(&fx, &committed, TIMEOUT, "after the stop");
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}
