//! Decoding from a hot standby (PostgreSQL 16+): `postgres.url` points at the
//! standby, `postgres.primary_url` at the primary. The slot is created on the
//! standby, events written on the primary arrive through it, the standby is
//! restarted mid-stream without loss, lag is measured against the standby's
//! replay position and the heartbeat is written on the primary. Needs
//! `scripts/env.sh up --standby` and restarts the standby, so it is not a
//! default cargo target: scripts/test.sh runs it on a fresh pair per major
//! from 16 (by hand: `cargo test --test standby standby_decoding::`).

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::ha::{ids_on, spawn_primary_writer};
use common::relay::{Fixture, read_ids, spawn_binary};
use common::{env_sh, init_tracing, pg_url};

fn standby_url() -> String {
    std::env::var("OUTBOX_CDC_TEST_PG_STANDBY").expect(
        "OUTBOX_CDC_TEST_PG_STANDBY is not set: this test needs `scripts/env.sh up --standby`",
    )
}

/// A config file that decodes on the standby (the primary named for what
/// a standby cannot do), with `extra` appended; the connector's role may ask
/// the primary for a running-transactions record, so that creating the slot
/// on the standby does not wait for one.
async fn standby_config(fx: &Fixture, extra: &str) -> std::path::PathBuf {
    fx.admin
        .batch_execute("GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO outbox")
        .await
        .expect("grant pg_log_standby_snapshot");
    let text = fx.config_text().replacen(
        &format!("url = \"{}\"", pg_url()),
        &format!(
            "url = \"{}\"\nprimary_url = \"{}\"",
            standby_url(),
            pg_url()
        ),
        1,
    ) + "\n[monitor]\nheartbeat_interval_ms = 500\nslot_poll_interval_ms = 500\n"
        + extra;
    let config = fx.write_config_file().with_file_name("standby.toml");
    std::fs::write(&config, text).expect("write the standby config");
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_on_the_primary_arrive_through_a_slot_on_the_standby() {
    let _alone = common::alone().await;
    init_tracing();
    let fx = Fixture::new("standby").await;
    let config = standby_config(&fx, "").await;
    let log = config.with_file_name("connector.log");
    let mut connector = spawn_binary(&config);

    // The slot is created on the standby (not on the primary) and streams;
    // a slot only carries what is committed after it is consistent.
    common::relay::eventually(
        "the connector streams from the standby",
        Duration::from_secs(90),
        || {
            let log = log.clone();
            async move {
                std::fs::read_to_string(&log)
                    .is_ok_and(|l| l.contains("replication started") && l.contains("streaming"))
            }
        },
    )
    .await;
    let standby = common::ha::standby_admin().await;
    let on_standby: i64 = standby
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("slots on the standby")
        .get(0);
    assert_eq!(on_standby, 1, "the slot is not on the standby");
    let on_primary: i64 = fx
        .admin
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("slots on the primary")
        .get(0);
    assert_eq!(on_primary, 0, "the slot was created on the primary");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writer = spawn_primary_writer(fx.table.clone(), stop_rx);
    tokio::time::sleep(Duration::from_secs(2)).await;
    env_sh("standby-restart");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop_tx.send(true);
    let committed = writer.await.expect("writer");
    assert!(
        committed.len() > 50,
        "the writer committed {}",
        committed.len()
    );

    let expected: BTreeSet<String> = ids_on(&fx.admin, &fx.table).await.into_iter().collect();
    let records = read_ids(
        &fx.topic_prefix,
        &expected,
        Duration::from_secs(120),
        Duration::from_secs(2),
    )
    .unwrap_or_else(|partial| {
        panic!(
            "{} of {} events arrived through the standby; connector log:\n{}",
            partial.len(),
            expected.len(),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let seen: BTreeSet<String> = records
        .iter()
        .map(|r| r.header("event_id").to_owned())
        .collect();
    let missing: Vec<&String> = expected.difference(&seen).collect();
    assert!(missing.is_empty(), "lost through the standby: {missing:?}");

    // Lag is measured on the standby (status reads its replay position) and
    // the heartbeat writes on the primary without errors.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["status", "--config"])
        .arg(&config)
        .output()
        .expect("outbox-cdc status");
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    let lag_line = status
        .lines()
        .find(|l| l.trim_start().starts_with("lag (bytes)"))
        .unwrap_or_else(|| panic!("no lag line in the status:\n{status}"));
    assert!(
        lag_line
            .split_whitespace()
            .last()
            .is_some_and(|v| v.parse::<u64>().is_ok()),
        "lag against the standby's replay position: {status}"
    );
    let exit = connector.terminate(Duration::from_secs(60));
    assert!(exit.success(), "the connector exited with {exit}");
    let log = std::fs::read_to_string(&log).expect("connector log");
    assert!(log.contains("heartbeat on"), "{log}");
    assert!(
        !log.contains("heartbeat failed") && !log.contains("heartbeat disabled"),
        "the heartbeat must write on postgres.primary_url:\n{log}"
    );
    eprintln!(
        "standby decoding: {} rows, {} records, {} duplicates",
        expected.len(),
        records.len(),
        records.len() - seen.len()
    );
    fx.cleanup().await;
}

/// The live witness on a decoding standby (issue 48): a `failpoints` build
/// skips every fifth outbox insert it decodes; the witness reads the
/// standby (snapshot, replay position, the rows), never writes to it, and
/// publishes each skipped row once, marked `repaired_by: witness`.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_skipped_while_decoding_on_the_standby_are_published_by_the_witness() {
    let _alone = common::alone().await;
    init_tracing();
    let fx = Fixture::new("standbywitness").await;
    let config = standby_config(&fx, "\n[reconcile]\ninterval_ms = 300\n").await;
    let log = config.with_file_name("connector.log");
    let mut connector = common::relay::spawn_binary_with(
        &config,
        &[("OUTBOX_CDC_SABOTAGE", "drop-insert-every:5")],
    );
    common::relay::eventually(
        "the witness's first round on the standby",
        Duration::from_secs(90),
        || {
            let log = log.clone();
            async move {
                std::fs::read_to_string(&log).is_ok_and(|l| {
                    l.contains("live witness: rows of transactions from this id on are checked")
                })
            }
        },
    )
    .await;
    let mut written = BTreeSet::new();
    for n in 0..20 {
        written.extend(
            fx.write_tx(
                &[("order", &format!("s{}", n % 4), format!(r#"{{"n":{n}}}"#))],
                true,
            )
            .await,
        );
    }
    let records = read_ids(
        &fx.topic_prefix,
        &written,
        Duration::from_secs(120),
        Duration::from_secs(3),
    )
    .unwrap_or_else(|partial| {
        panic!(
            "{} of {} events arrived through the standby; connector log:\n{}",
            partial.len(),
            written.len(),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let mut seen = BTreeSet::new();
    for r in &records {
        assert!(
            seen.insert(r.header("event_id").to_owned()),
            "published twice: {}",
            r.header("event_id")
        );
    }
    let repaired = records
        .iter()
        .filter(|r| r.headers.get("repaired_by").map(String::as_str) == Some("witness"))
        .count();
    assert_eq!(
        repaired, 4,
        "every fifth of 20 rows, published from the standby's table"
    );
    let exit = connector.terminate(Duration::from_secs(60));
    assert!(exit.success(), "the connector exited with {exit}");
    fx.cleanup().await;
}
