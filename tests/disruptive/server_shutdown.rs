//! A PostgreSQL restart (`pg_ctl restart -m fast`) while the connector
//! streams: the server's walsender waits, before the shutdown can finish,
//! until the connector confirms everything it was sent. The connector must
//! let it go promptly (it notices the shutdown and confirms without a
//! coverage proof, which cannot run any more) rather than hold the restart
//! for `wal_sender_timeout`, then resume without loss. Restarts the shared
//! server.

use crate::common;

use std::time::{Duration, Instant};

use common::relay::{Fixture, Running, consume};
use common::{admin_client, env_sh, init_tracing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_is_not_held_up_and_streaming_resumes() {
    let _alone = common::alone().await;
    init_tracing();
    let fx = Fixture::new("shutdown").await;
    let running = Running::start(fx.config()).await;
    let mut written = fx
        .write_tx(&[("order", "s1", r#"{"n":1}"#.to_owned())], true)
        .await;
    consume(&fx.topic_prefix, 1, Duration::from_secs(60), Duration::ZERO);
    // Written after the last coverage proof: what the walsender will wait for.
    written.extend(
        fx.write_tx(&[("order", "s1", r#"{"n":2}"#.to_owned())], true)
            .await,
    );
    consume(&fx.topic_prefix, 2, Duration::from_secs(60), Duration::ZERO);

    let timeout: String = fx
        .admin
        .query_one("SHOW wal_sender_timeout", &[])
        .await
        .expect("wal_sender_timeout")
        .get(0);
    let t0 = Instant::now();
    env_sh("pg-restart");
    let took = t0.elapsed();
    eprintln!(
        "PostgreSQL restart with the connector streaming: {took:?} (wal_sender_timeout {timeout})"
    );
    assert!(
        took < Duration::from_secs(30),
        "the restart took {took:?}: the connector held the walsender (wal_sender_timeout {timeout})"
    );

    running.wait_streaming().await;
    let admin = admin_client().await;
    admin.batch_execute("BEGIN").await.expect("begin");
    let id: String = admin
        .query_one(
            &format!(
                "INSERT INTO public.{} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, \
                 payload) VALUES (gen_random_uuid(), 'order', 's1', 3, 'Placed', '{{}}') RETURNING event_id::text",
                fx.table
            ),
            &[],
        )
        .await
        .expect("insert after the restart")
        .get(0);
    admin.batch_execute("COMMIT").await.expect("commit");
    written.push(id);
    let records = consume(
        &fx.topic_prefix,
        3,
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    for id in &written {
        assert!(
            records.iter().any(|r| r.header("event_id") == id),
            "{id} lost across the restart"
        );
    }
    running.stop().await.expect("clean stop");
}
