//! Features that depend on the server's major (issue 13; DESIGN.md §15), each
//! checked for whichever behaviour the test server's major calls for;
//! scripts/test.sh runs these on every major of its matrix (13-18):
//! - `postgres.failover_slot`: on PostgreSQL 17+ the slot is created with
//!   `failover` (a standby with `sync_replication_slots = on` keeps it across a
//!   promotion); before 17 the start is refused naming the key, and no slot is made;
//! - `outbox.message_prefix`: pgoutput sends logical decoding messages from 14
//!   on; on 13 the start is refused naming the key.

use crate::common;

use std::time::Duration;

use common::relay::{Fixture, Running, consume};
use outbox_cdc::pipeline::{PipelineError, RunOptions, StartRefused};

const TIMEOUT: Duration = Duration::from_secs(60);

async fn server_version(fx: &Fixture) -> i32 {
    fx.admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server_version_num")
        .get(0)
}

async fn slot_failover(fx: &Fixture) -> Option<bool> {
    fx.admin
        .query_opt(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("reading pg_replication_slots.failover")
        .map(|row| row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_slot_is_created_on_17_and_refused_on_older_servers() {
    common::init_tracing();
    let fx = Fixture::new("failover").await;
    let version = server_version(&fx).await;
    let config = fx.config_with("OUTBOX_CDC__POSTGRES__FAILOVER_SLOT=true");
    if version >= 170000 {
        let running = Running::start(config).await;
        assert_eq!(
            slot_failover(&fx).await,
            Some(true),
            "slot {} was not created with failover on server_version_num {version}",
            fx.slot
        );
        // The failover slot streams like any other.
        let ids = fx
            .write_tx(&[("order", "a1", r#"{"n":1}"#.to_owned())], true)
            .await;
        let records = consume(
            &fx.topic_prefix,
            1,
            Duration::from_secs(30),
            Duration::from_millis(500),
        );
        assert_eq!(records.len(), 1, "records: {records:?}");
        assert_eq!(records[0].header("event_id"), ids[0]);
        running.stop().await.expect("clean stop");

        // Audit F11: a slot recreated by gap repair keeps `failover`.
        fx.admin
            .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
            .await
            .expect("drop the slot");
        let repair = RunOptions {
            recreate_slot: true,
            accept_gap: true,
            repair_only: true,
            ..RunOptions::default()
        };
        Running::spawn(
            fx.config_with("OUTBOX_CDC__POSTGRES__FAILOVER_SLOT=true"),
            repair,
        )
        .finished(TIMEOUT)
        .await
        .expect("the repair recreates the slot");
        assert_eq!(
            slot_failover(&fx).await,
            Some(true),
            "slot {} recreated by the repair without failover",
            fx.slot
        );

        // Without the key, a slot is created without failover, as before.
        let plain = Fixture::new("no_failover").await;
        let running = Running::start(plain.config()).await;
        assert_eq!(slot_failover(&plain).await, Some(false));
        running.stop().await.expect("clean stop");
        plain.cleanup().await;
    } else {
        let err = Running::spawn(config, RunOptions::default())
            .finished(TIMEOUT)
            .await
            .expect_err("failover_slot must be refused before PostgreSQL 17");
        assert!(
            matches!(
                err,
                PipelineError::Refused(StartRefused::FailoverSlotUnsupported { server_version })
                    if server_version == version
            ),
            "unexpected error: {err}"
        );
        assert!(
            err.to_string().contains("postgres.failover_slot"),
            "the error must name the key: {err}"
        );
        assert_eq!(
            fx.slot_confirmed_flush().await,
            None,
            "a refused start must not create the slot"
        );
    }
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_prefix_streams_from_14_and_is_refused_on_13() {
    common::init_tracing();
    let fx = Fixture::new("msgver").await;
    let version = server_version(&fx).await;
    let prefix = format!("msg_{}", fx.name);
    let config = fx.config_with(&format!("OUTBOX_CDC__OUTBOX__MESSAGE_PREFIX={prefix}"));
    if version >= 140000 {
        // Streams (the messages option is accepted); tests/it/pipeline.rs checks what they carry.
        let running = Running::start(config).await;
        running.stop().await.expect("clean stop");
    } else {
        let err = Running::spawn(config, RunOptions::default())
            .finished(TIMEOUT)
            .await
            .expect_err("message_prefix must be refused before PostgreSQL 14");
        assert!(
            matches!(
                err,
                PipelineError::Refused(StartRefused::MessagesUnsupported { server_version })
                    if server_version == version
            ),
            "unexpected error: {err}"
        );
        assert!(
            err.to_string().contains("outbox.message_prefix"),
            "the error must name the key: {err}"
        );
        assert_eq!(fx.slot_confirmed_flush().await, None);
    }
    fx.cleanup().await;
}
