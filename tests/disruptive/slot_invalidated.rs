//! A slot really invalidated by the server (`max_slot_wal_keep_size`
//! exceeded while the connector was stopped and writers went on): `run`
//! refuses, `repair` drops and recreates it and republishes the gap from the
//! outbox table, and streaming continues. Nothing committed is lost.
//!
//! This test changes `max_slot_wal_keep_size` of the shared test server (and
//! so invalidates every idle slot on it). The setting is reset when the test
//! ends, however it ends.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::relay::{Fixture, Running, consume};
use common::{admin_client, init_tracing};
use outbox_cdc::pipeline::{PipelineError, RunOptions, StartRefused};

const TIMEOUT: Duration = Duration::from_secs(90);

/// Resets `max_slot_wal_keep_size` when dropped.
struct ResetKeepSize;

impl Drop for ResetKeepSize {
    fn drop(&mut self) {
        let url = common::pg_admin_url();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    for sql in [
                        "ALTER SYSTEM RESET max_slot_wal_keep_size",
                        "SELECT pg_reload_conf()",
                    ] {
                        let _ = client.batch_execute(sql).await;
                    }
                }
            });
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_is_refused_then_repaired() {
    let _alone = common::alone().await;
    init_tracing();
    let fx = Fixture::new("invalid").await;
    let mut committed: BTreeSet<String> = BTreeSet::new();
    let running = Running::start(fx.config()).await;
    for i in 0..5 {
        committed.extend(
            fx.write_tx(&[("order", "v", format!(r#"{{"n":{i}}}"#))], true)
                .await,
        );
    }
    consume(&fx.topic_prefix, committed.len(), TIMEOUT, Duration::ZERO);
    running.stop().await.expect("graceful stop");

    let _reset = ResetKeepSize;
    let admin = admin_client().await;
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
    ] {
        admin
            .batch_execute(sql)
            .await
            .expect("set max_slot_wal_keep_size");
    }
    // Writers go on while the connector is down, and WAL grows past what the
    // slot may keep.
    let deadline = std::time::Instant::now() + TIMEOUT;
    for n in 100.. {
        committed.extend(
            fx.write_tx(&[("order", "v", format!(r#"{{"n":{n}}}"#))], true)
                .await,
        );
        admin
            .batch_execute(
                "CREATE TEMP TABLE IF NOT EXISTS ballast (x text);
                 INSERT INTO ballast SELECT repeat('x', 1000) FROM generate_series(1, 2000);
                 SELECT pg_switch_wal();",
            )
            .await
            .expect("generate WAL");
        admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
        let status: Option<String> = admin
            .query_opt(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1",
                &[&fx.slot],
            )
            .await
            .expect("read the slot")
            .and_then(|r| r.get(0));
        if status.as_deref() == Some("lost") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot was not invalidated within {TIMEOUT:?} (wal_status {status:?})"
        );
    }

    let err = Running::spawn(fx.config(), RunOptions::default())
        .finished(TIMEOUT)
        .await
        .expect_err("an invalidated slot must be refused");
    assert!(
        matches!(
            err,
            PipelineError::Refused(StartRefused::SlotInvalidated { .. })
        ),
        "{err}"
    );

    let running = Running::spawn(
        fx.config(),
        RunOptions {
            recreate_slot: true,
            ..RunOptions::default()
        },
    );
    running.wait_streaming().await;
    committed.extend(
        fx.write_tx(&[("order", "v", r#"{"n":"after"}"#.to_owned())], true)
            .await,
    );
    let records = consume(
        &fx.topic_prefix,
        committed.len(),
        TIMEOUT,
        Duration::from_secs(2),
    );
    let seen: BTreeSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    let lost: Vec<&String> = committed
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .collect();
    assert!(lost.is_empty(), "lost across the invalidation: {lost:?}");
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}
