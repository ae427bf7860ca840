//! Pruning with `track_commit_timestamp = on`: commit timestamps do not
//! decide, transaction ids do. A row with an `occurred_at` far in the past
//! that committed after the acknowledged transaction is kept; rows committed
//! before it (proven by a checkpoint's oldest running xid) go. A row written
//! with a replication origin carries the origin's commit timestamp, not one
//! in local WAL order (audit F7b), so one committed after the acknowledged
//! position with an old origin timestamp is kept too; and so is a row
//! committed after it while the clocks disagree (review P1).
//!
//! This test restarts the test PostgreSQL twice (the setting needs a
//! restart). The setting is reset
//! when the test ends, however it ends.

use crate::common;

use std::time::Duration;

use common::relay::Fixture;
use common::{TrackingOff, init_tracing, set_track_commit_timestamp};
use outbox_cdc::pg::PgTimestamp;
use outbox_cdc::pipeline::AckedPosition;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_commit_timestamps_tracked_old_rows_committed_after_the_acknowledged_one_stay() {
    let _alone = common::alone().await;
    init_tracing();
    set_track_commit_timestamp(true);
    let _reset = TrackingOff;
    let fx = Fixture::new("prunects").await;
    let t = &fx.table;
    let insert = |agg: &str| {
        format!(
            "GRANT DELETE ON public.{t} TO outbox;
             INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
             SELECT gen_random_uuid(), 'order', '{agg}', n, 'E', '{{}}', now() - interval '1 day'
             FROM generate_series(1, 10) AS n;"
        )
    };
    fx.admin
        .batch_execute(&insert("before"))
        .await
        .expect("rows acknowledged");
    // The proof that "before" committed before the acknowledged position:
    // this checkpoint's oldest running xid is newer than theirs.
    fx.admin
        .batch_execute("CHECKPOINT")
        .await
        .expect("checkpoint");
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The acknowledged transaction's commit time: after "before" committed.
    let acked: i64 = fx
        .admin
        .query_one(
            "SELECT ((extract(epoch FROM clock_timestamp()) - 946684800) * 1e6)::int8",
            &[],
        )
        .await
        .expect("clock")
        .get(0);
    let acked = AckedPosition {
        lsn: fx.wal_insert_lsn().await,
        commit_time: PgTimestamp(acked),
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Old occurred_at, committed after the acknowledged position: unpublished.
    fx.admin
        .batch_execute(&insert("after"))
        .await
        .expect("rows not yet acknowledged");
    // The same through a replication origin whose commit timestamp is a day
    // old (what a subscription applying a backlog writes).
    let origin = format!("o_{}", fx.name);
    fx.admin
        .batch_execute(&format!(
            "SELECT pg_replication_origin_create('{origin}');
             SELECT pg_replication_origin_session_setup('{origin}');
             BEGIN;
             SELECT pg_replication_origin_xact_setup('0/1', now() - interval '1 day');
             {}
             COMMIT;
             SELECT pg_replication_origin_session_reset();
             SELECT pg_replication_origin_drop('{origin}');",
            insert("origin")
        ))
        .await
        .expect("rows written with a replication origin");
    let origin_ts: bool = fx
        .admin
        .query_one(
            &format!(
                "SELECT bool_and(pg_xact_commit_timestamp(xmin) < now() - interval '1 hour')
                 FROM public.{t} WHERE aggregate_id = 'origin'"
            ),
            &[],
        )
        .await
        .expect("origin commit timestamps")
        .get(0);
    assert!(
        origin_ts,
        "the origin rows carry the origin's old commit timestamp"
    );

    let config = fx.config_with(
        "OUTBOX_CDC__PRUNE__RETENTION=1h OUTBOX_CDC__REPAIR__COMMIT_TIME_MARGIN_MS=200",
    );
    let client = outbox_cdc::pg::PgConnectConfig::parse(&config.postgres.url)
        .expect("url")
        .connect_sql()
        .await
        .expect("connect as outbox");
    let report = common::prune_now(&client, &config, acked)
        .await
        .expect("prune");
    let left: Vec<(String, i64)> = fx
        .admin
        .query(
            &format!("SELECT aggregate_id, count(*) FROM public.{t} GROUP BY 1 ORDER BY 1"),
            &[],
        )
        .await
        .expect("rows left")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        left,
        vec![("after".to_owned(), 10), ("origin".to_owned(), 10)],
        "{report}"
    );
    assert_eq!(report.rows(), 10, "{report}");
    fx.cleanup().await;
}

/// Review P1: commit timestamps come from the wall clock, which can step
/// back (NTP, a restored VM, a failover to a host whose clock is behind).
/// Here the acknowledged commit was stamped by a clock an hour ahead; a row
/// committed after the acknowledged LSN, with an `occurred_at` past the
/// retention, must stay: nothing proves it published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_after_the_acknowledged_lsn_stays_whatever_the_clocks_say() {
    let _alone = common::alone().await;
    init_tracing();
    set_track_commit_timestamp(true);
    let _reset = TrackingOff;
    let fx = Fixture::new("prunestep").await;
    let t = &fx.table;
    fx.admin
        .batch_execute(&format!("GRANT DELETE ON public.{t} TO outbox"))
        .await
        .expect("grant");
    let acked_lsn = fx.wal_insert_lsn().await;
    let now: i64 = fx
        .admin
        .query_one(
            "SELECT ((extract(epoch FROM clock_timestamp()) - 946684800) * 1e6)::int8",
            &[],
        )
        .await
        .expect("clock")
        .get(0);
    // Committed after acked_lsn, so not yet published.
    let id: String = fx
        .admin
        .query_one(
            &format!(
                "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
                 VALUES (gen_random_uuid(), 'order', 'late', 1, 'E', '{{}}', '2000-01-01')
                 RETURNING event_id::text"
            ),
            &[],
        )
        .await
        .expect("insert")
        .get(0);
    let acked = AckedPosition {
        lsn: acked_lsn,
        commit_time: PgTimestamp(now + 3_600_000_000),
    };
    let config = fx.config_with("OUTBOX_CDC__PRUNE__RETENTION=1h");
    let client = outbox_cdc::pg::PgConnectConfig::parse(&config.postgres.url)
        .expect("url")
        .connect_sql()
        .await
        .expect("connect as outbox");
    let report = common::prune_now(&client, &config, acked)
        .await
        .expect("prune");
    let left: i64 = fx
        .admin
        .query_one(
            &format!("SELECT count(*) FROM public.{t} WHERE event_id::text = $1"),
            &[&id],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(
        left, 1,
        "a row committed after the acknowledged LSN was pruned: {report}"
    );
    fx.cleanup().await;
}
