//! A primary fenced while the connector streams from it (made read-only:
//! `default_transaction_read_only = on`, as failover tooling does to an old
//! primary). With `target_session_attrs=read-write` the connector leaves it
//! (the periodic re-proof asks the server's kind), keeps retrying while no
//! host fits, and resumes without loss once a read-write server is back.
//! Changes a server-wide setting.

use crate::common;

use std::time::Duration;

use common::relay::{Fixture, Running, consume, eventually};
use common::{admin_statements, init_tracing, pg_url};

/// Sets (or resets) `default_transaction_read_only` server-wide and reloads.
fn fence(read_only: bool) {
    admin_statements(&[
        "SET default_transaction_read_only = off",
        if read_only {
            "ALTER SYSTEM SET default_transaction_read_only = on"
        } else {
            "ALTER SYSTEM RESET default_transaction_read_only"
        },
        "SELECT pg_reload_conf()",
    ]);
}

/// Lifts the fence when dropped, so a failing test leaves the server writable.
struct Unfence;

impl Drop for Unfence {
    fn drop(&mut self) {
        fence(false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_primary_is_left_and_streaming_resumes_when_it_is_writable_again() {
    let _alone = common::alone().await;
    init_tracing();
    let fx = Fixture::new("fenced").await;
    let url = pg_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let config = fx.config_with(&format!(
        "OUTBOX_CDC__POSTGRES__URL={url}{sep}target_session_attrs=read-write \
         OUTBOX_CDC__MONITOR__SLOT_POLL_INTERVAL_MS=300"
    ));
    let running = Running::start(config).await;
    let mut written = fx
        .write_tx(&[("order", "f1", r#"{"n":1}"#.to_owned())], true)
        .await;
    consume(&fx.topic_prefix, 1, Duration::from_secs(60), Duration::ZERO);

    let guard = Unfence;
    fence(true);
    eventually(
        "the connector leaves the fenced primary",
        Duration::from_secs(30),
        || async { !running.metrics.is_connected() },
    )
    .await;
    // Still retrying (no host fits), not stopped.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !running.is_finished(),
        "the connector gave up on a fenced primary"
    );
    assert!(
        !running.metrics.is_connected(),
        "it reconnected to a read-only server"
    );

    drop(guard); // writable again
    running.wait_streaming().await;
    fx.admin
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .expect("fixture session read-write");
    written.extend(
        fx.write_tx(&[("order", "f1", r#"{"n":2}"#.to_owned())], true)
            .await,
    );
    let records = consume(
        &fx.topic_prefix,
        2,
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    for id in &written {
        assert!(
            records.iter().any(|r| r.header("event_id") == id),
            "{id} did not arrive: {records:?}"
        );
    }
    assert!(running.metrics.reconnects() > 0);
    running.stop().await.expect("clean stop");
    fx.cleanup().await;
}
