//! Gap repair and a peer instance (audit F6): a repair recreates the slot and
//! publishes the retained rows while the new slot is inactive; a peer that
//! started streaming from it meanwhile would publish newer events before the
//! repaired older ones. A repairing instance holds the slot's advisory lock
//! exclusively, and every instance takes it shared from reading the slot until
//! START_REPLICATION: here the test holds it the way a peer would.

use crate::common;

use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Running, consume};
use outbox_cdc::pipeline::RunOptions;

/// Takes `slot`'s advisory lock (exclusive or shared) on `client`'s session.
async fn lock(client: &tokio_postgres::Client, slot: &str, exclusive: bool) {
    let function = if exclusive {
        "pg_advisory_lock"
    } else {
        "pg_advisory_lock_shared"
    };
    client
        .query_one(
            &format!("SELECT {function}(hashtextextended('outbox-cdc slot ' || $1, 0))::text"),
            &[&slot],
        )
        .await
        .expect("take the slot's advisory lock");
}

/// Stays quiet for `how_long`: neither streaming nor ended.
async fn waits(running: &Running, how_long: Duration, what: &str) {
    let until = std::time::Instant::now() + how_long;
    while std::time::Instant::now() < until {
        assert!(!running.is_finished(), "{what}: the connector ended");
        assert!(
            !running.metrics.is_connected(),
            "{what}: the connector streams"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_instance_streams_while_a_peer_repairs_and_no_repair_runs_while_a_peer_starts() {
    init_tracing();
    let fx = Fixture::new("repairlock").await;
    let first = Running::start(fx.config()).await;
    fx.write_tx(&[("order", "r1", "{}".into())], true).await;
    consume(&fx.topic_prefix, 1, Duration::from_secs(30), Duration::ZERO);
    first.stop().await.expect("graceful stop");

    // A peer repairing this slot: nobody streams from it meanwhile.
    let peer = common::admin_client().await;
    lock(&peer, &fx.slot, true).await;
    let waiting = Running::spawn(fx.config(), RunOptions::default());
    waits(
        &waiting,
        Duration::from_secs(5),
        "a peer holds the repair lock",
    )
    .await;
    assert!(
        waiting.metrics.reconnects() > 0,
        "the start is retried while the repair runs"
    );
    drop(peer); // its session ends, and the lock with it
    waiting.wait_streaming().await;
    waiting.stop().await.expect("graceful stop");

    // The slot lost, a repair asked for, while a peer is between reading the
    // slot and streaming: the repair waits for it.
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    let peer = common::admin_client().await;
    lock(&peer, &fx.slot, false).await;
    let repairing = Running::spawn(
        fx.config(),
        RunOptions {
            recreate_slot: true,
            accept_gap: true,
            repair_only: true,
            ..RunOptions::default()
        },
    );
    waits(&repairing, Duration::from_secs(5), "a peer is starting").await;
    assert_eq!(
        fx.slot_confirmed_flush().await,
        None,
        "no slot may be recreated while a peer holds the lock"
    );
    drop(peer);
    repairing
        .finished(Duration::from_secs(60))
        .await
        .expect("the repair runs once the peer is gone");
    assert!(
        fx.slot_confirmed_flush().await.is_some(),
        "the repair recreated the slot"
    );
    fx.cleanup().await;
}
