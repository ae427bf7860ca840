//! A session that ends on an error keeps what was acknowledged (issue 11):
//! before reconnecting, it takes the delivery reports that arrive and persists
//! the acknowledged prefix, so the next session re-sends only what was really
//! in flight.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Running, consume, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_exit_persists_the_acknowledged_prefix_before_reconnecting() {
    init_tracing();
    let f = Fixture::new("errexit").await;
    // No periodic persist during the test: only the exit path can persist.
    let config = f.config_with("OUTBOX_CDC__OFFSETS__FLUSH_INTERVAL_MS=60000");
    let running = Running::start(config).await;
    let mut written = Vec::new();
    for i in 0..5 {
        written.extend(
            f.write_tx(&[("order", "a", format!(r#"{{"n":{i}}}"#))], true)
                .await,
        );
    }
    consume(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(30),
        Duration::ZERO,
    );
    // Everything is acknowledged by Kafka, nothing persisted since the start.
    let reconnects = || running.metrics.reconnects();
    assert_eq!(reconnects(), 0);
    f.admin
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
            &[&f.slot],
        )
        .await
        .expect("terminate the walsender");
    eventually(
        "the session reconnects",
        Duration::from_secs(30),
        || async { reconnects() >= 1 && running.metrics.is_connected() },
    )
    .await;
    // The new session resumed after the acknowledged transactions: no copy.
    let records = consume(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(30),
        Duration::from_secs(3),
    );
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for r in &records {
        *copies.entry(r.header("event_id").to_owned()).or_default() += 1;
    }
    let resent: Vec<_> = copies.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        resent.is_empty() && copies.len() == written.len(),
        "re-sent after the error exit: {resent:?} ({} records for {} events)",
        records.len(),
        written.len()
    );
    running.stop().await.expect("clean stop");
    f.cleanup().await;
}
