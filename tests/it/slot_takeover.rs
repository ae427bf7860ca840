//! Slot takeover (the way in from Debezium, docs/migrating-from-debezium.md):
//! started with no stored offset on a slot that another consumer advanced,
//! the connector streams from the slot's confirmed_flush_lsn. Here the other
//! consumer is a real one, pg_recvlogical, reading and confirming the slot
//! up to a point; a Kafka consumer then checks that every row committed after
//! that point arrives and none confirmed before it is published again.

use crate::common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::relay::{Fixture, Running, consume_ids};
use common::{init_tracing, pg_admin_url};
use outbox_cdc::pg::Lsn;

fn pg_recvlogical() -> String {
    let bin = std::env::var("OUTBOX_CDC_PG_BIN").unwrap_or_else(|_| {
        panic!("OUTBOX_CDC_PG_BIN is not set: start the test servers with `scripts/env.sh up` and source target/env/test.env")
    });
    format!("{bin}/pg_recvlogical")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_over_a_slot_another_consumer_advanced() {
    init_tracing();
    let f = Fixture::new("takeover").await;
    f.admin
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&f.slot],
        )
        .await
        .expect("create the slot the other consumer uses");
    let mut before = BTreeSet::new();
    let mut end = Lsn::ZERO;
    for i in 0..5 {
        let (ids, ended_by) = f
            .write_tx_ended_by(&[("order", &format!("b{i}"), format!(r#"{{"i":{i}}}"#))])
            .await;
        before.extend(ids);
        end = ended_by;
    }

    // The other consumer reads the slot up to `end` and confirms it.
    let out = Command::new(pg_recvlogical())
        .args([
            "--dbname",
            &pg_admin_url(),
            "--slot",
            &f.slot,
            "--start",
            "--no-loop",
        ])
        .args(["--endpos", &end.to_string(), "--file", "/dev/null"])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={}", f.publication))
        .output()
        .expect("run pg_recvlogical");
    assert!(
        out.status.success(),
        "pg_recvlogical: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let confirmed = f.confirmed_lsn().await;
    assert!(
        confirmed >= end,
        "pg_recvlogical confirmed {confirmed}, short of {end}"
    );

    // Rows committed after the other consumer stopped and before the
    // connector starts are the ones a takeover could lose.
    let mut after = BTreeSet::new();
    let write = async |i: usize| f.write_numbered("a", i).await;
    for i in 0..5 {
        after.extend(write(i).await);
    }
    let running = Running::start(f.config()).await;
    for i in 5..8 {
        after.extend(write(i).await);
    }
    // Read until the rows after the takeover arrived, then a little longer:
    // a row from before it would have been published first.
    let records = consume_ids(
        &f.topic_prefix,
        &after,
        Duration::from_secs(60),
        Duration::from_secs(3),
    );
    running.stop().await.expect("stop");
    let seen: BTreeSet<String> = records
        .iter()
        .map(|r| r.header("event_id").to_owned())
        .collect();
    let republished: Vec<&String> = before.intersection(&seen).collect();
    assert!(
        republished.is_empty(),
        "rows the previous consumer confirmed were published again: {republished:?}"
    );
    // The connector's own acknowledged position starts from the takeover point.
    let now = f.confirmed_lsn().await;
    assert!(
        now > confirmed,
        "the connector never advanced the slot ({now})"
    );
    f.cleanup().await;
}

/// A slot still being created has no confirmed position yet: its creation
/// waits for the transactions running when it began (in any database). A
/// connector started then (say, restarted after being killed while it
/// created the slot, whose walsender finishes the creation alone) waits for
/// it; it does not take the slot over at 0/0 and then stop because the slot
/// is "ahead" of that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_still_being_created_is_waited_for_not_taken_over_at_zero() {
    init_tracing();
    let f = Fixture::new("creating").await;
    // A transaction with an xid, open while the slot is created.
    let (blocker, connection) = tokio_postgres::connect(&pg_admin_url(), tokio_postgres::NoTls)
        .await
        .expect("connect the blocking session");
    tokio::spawn(connection);
    blocker
        .batch_execute("BEGIN; SELECT txid_current()")
        .await
        .expect("open a transaction");
    let (creator, connection) = tokio_postgres::connect(&pg_admin_url(), tokio_postgres::NoTls)
        .await
        .expect("connect the creating session");
    tokio::spawn(connection);
    let slot = f.slot.clone();
    let creating = tokio::spawn(async move {
        creator
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot],
            )
            .await
    });
    common::relay::eventually("the slot appears, unconfirmed", Duration::from_secs(30), || async {
        f.admin
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NULL",
                &[&f.slot],
            )
            .await
            .expect("read the slot")
            .is_some()
    })
    .await;
    let running = Running::spawn(f.config(), Default::default());
    // Several attempts of the connector while the slot is being created.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !running.is_finished(),
        "the connector stopped on a slot being created"
    );
    blocker
        .batch_execute("COMMIT")
        .await
        .expect("end the transaction");
    creating
        .await
        .expect("creating task")
        .expect("the slot is created once the transaction ended");
    running.wait_streaming().await;
    let mut written = BTreeSet::new();
    for i in 0..3 {
        written.extend(f.write_numbered("c", i).await);
    }
    let records = consume_ids(
        &f.topic_prefix,
        &written,
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    running
        .stop()
        .await
        .expect("the connector ran until stopped");
    let seen: BTreeSet<String> = records
        .iter()
        .map(|r| r.header("event_id").to_owned())
        .collect();
    assert!(
        written.is_subset(&seen),
        "rows written after the slot was created are missing: {:?}",
        written.difference(&seen).collect::<Vec<_>>()
    );
    f.cleanup().await;
}
