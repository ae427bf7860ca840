//! Gap repair with `track_commit_timestamp = on`: rows are chosen by their
//! transaction's commit timestamp, not by `occurred_at`. A row committed in
//! the gap with an `occurred_at` far in the past is repaired; rows committed
//! before the last acknowledged transaction are not published again.
//!
//! This test restarts the shared PostgreSQL twice (the setting needs a
//! restart). The setting is reset
//! when the test ends, however it ends.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::relay::{Fixture, Running, consume, read_ids};
use common::{TrackingOff, set_track_commit_timestamp};
use common::{admin_client, init_tracing};
use outbox_cdc::pipeline::RunOptions;

const TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_by_commit_timestamp_is_exact() {
    let _alone = common::alone().await;
    init_tracing();
    set_track_commit_timestamp(true);
    let _off = TrackingOff;
    let admin = admin_client().await;
    let on: String = admin
        .query_one("SHOW track_commit_timestamp", &[])
        .await
        .expect("show")
        .get(0);
    assert_eq!(on, "on");

    let fx = Fixture::new("repairts").await;
    // No margin: exactly the rows committed at or after the acknowledged one.
    let config = || fx.config_with("OUTBOX_CDC__REPAIR__COMMIT_TIME_MARGIN_MS=0");
    let running = Running::start(config()).await;
    let mut before = Vec::new();
    for i in 0..5 {
        before.extend(
            fx.write_tx(&[("order", "t", format!(r#"{{"n":{i}}}"#))], true)
                .await,
        );
    }
    consume(
        &fx.topic_prefix,
        before.len(),
        TIMEOUT,
        Duration::from_secs(1),
    );
    running.stop().await.expect("graceful stop");

    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    // Committed in the gap, but claiming to have occurred in 2001: an
    // occurred_at bound would leave it out.
    let old_looking: String = fx
        .admin
        .query_one(
            &format!(
                "INSERT INTO public.{} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
                 VALUES (gen_random_uuid(), 'order', 't', 6, 'Late', '{{}}', '2001-01-01')
                 RETURNING event_id::text",
                fx.table
            ),
            &[],
        )
        .await
        .expect("insert")
        .get(0);

    let running = Running::spawn(
        config(),
        RunOptions {
            recreate_slot: true,
            ..RunOptions::default()
        },
    );
    running.wait_streaming().await;
    let records = consume(
        &fx.topic_prefix,
        before.len() + 1,
        TIMEOUT,
        Duration::from_secs(3),
    );
    let mut copies: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &records {
        *copies.entry(r.header("event_id")).or_default() += 1;
    }
    assert_eq!(
        copies.get(old_looking.as_str()),
        Some(&1),
        "the row committed in the gap was not repaired: {copies:?}"
    );
    // The last acknowledged transaction itself is at the bound (ties are
    // included); the ones before it are not sent again.
    for id in &before[..before.len() - 1] {
        assert_eq!(
            copies.get(id.as_str()),
            Some(&1),
            "{id} sent again: {copies:?}"
        );
    }
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// Review R1: a row committed through a replication origin (a subscription,
/// pglogical, any `pg_replication_origin_session_setup()` writer) carries the
/// origin's commit timestamp, which says nothing about local WAL order. One
/// committed in the gap but stamped an hour before the acknowledged commit
/// is repaired all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_in_the_gap_with_an_old_origin_timestamp_is_repaired() {
    let _alone = common::alone().await;
    init_tracing();
    set_track_commit_timestamp(true);
    let _off = TrackingOff;

    let fx = Fixture::new("repairorigin").await;
    let config = || fx.config_with("OUTBOX_CDC__REPAIR__COMMIT_TIME_MARGIN_MS=0");
    let running = Running::start(config()).await;
    let before = fx
        .write_tx(&[("order", "t", r#"{"n":1}"#.to_owned())], true)
        .await;
    consume(
        &fx.topic_prefix,
        before.len(),
        TIMEOUT,
        Duration::from_secs(1),
    );
    running.stop().await.expect("graceful stop");

    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    // Committed in the gap by an origin session, stamped an hour ago (what a
    // subscription applying a backlog writes); occurred_at is left to now().
    let origin = format!("o_{}", fx.name);
    fx.admin
        .batch_execute(&format!(
            "SELECT pg_replication_origin_create('{origin}');
             SELECT pg_replication_origin_session_setup('{origin}');
             BEGIN;
             SELECT pg_replication_origin_xact_setup('0/1', now() - interval '1 hour');
             INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
             VALUES (gen_random_uuid(), 'order', 't', 2, 'FromOrigin', '{{}}');
             COMMIT;
             SELECT pg_replication_origin_session_reset();
             SELECT pg_replication_origin_drop('{origin}');",
            t = fx.table
        ))
        .await
        .expect("a row written with a replication origin");
    let (from_origin, stamped_early): (String, bool) = {
        let row = fx
            .admin
            .query_one(
                &format!(
                    "SELECT event_id::text, pg_xact_commit_timestamp(xmin) < now() - interval '50 minutes'
                     FROM public.{} WHERE event_type = 'FromOrigin'",
                    fx.table
                ),
                &[],
            )
            .await
            .expect("the origin row");
        (row.get(0), row.get(1))
    };
    assert!(
        stamped_early,
        "the row carries the origin's old commit timestamp"
    );

    Running::spawn(
        config(),
        RunOptions {
            recreate_slot: true,
            repair_only: true,
            ..RunOptions::default()
        },
    )
    .finished(TIMEOUT)
    .await
    .expect("repair");
    let wanted = BTreeSet::from([from_origin.clone()]);
    let records = read_ids(
        &fx.topic_prefix,
        &wanted,
        Duration::from_secs(20),
        Duration::ZERO,
    );
    assert!(
        records.is_ok(),
        "the row committed in the gap through a replication origin ({from_origin}) was not repaired; \
         published: {:?}",
        records
            .unwrap_or_else(|r| r)
            .iter()
            .map(|r| r.header("event_id").to_owned())
            .collect::<Vec<_>>()
    );
    fx.cleanup().await;
}
