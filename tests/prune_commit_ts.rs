//! Pruning with `track_commit_timestamp = on`: rows are judged by their
//! transaction's commit timestamp. A row with an `occurred_at` far in the
//! past that committed after the acknowledged transaction is kept; rows
//! committed before it (minus `repair.commit_time_margin_ms`) go.
//!
//! This test restarts the test PostgreSQL twice (the setting needs a
//! restart): it must stay the only test in this file. The setting is reset
//! when the test ends, however it ends.

mod common;

use std::time::Duration;

use common::relay::Fixture;
use common::{TrackingOff, init_tracing, set_track_commit_timestamp};
use outbox_cdc::metrics::Metrics;
use outbox_cdc::pg::PgTimestamp;
use outbox_cdc::pipeline;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_by_commit_timestamp_keeps_old_rows_committed_after_the_acknowledged_one() {
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
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Old occurred_at, committed after the acknowledged position: unpublished.
    fx.admin
        .batch_execute(&insert("after"))
        .await
        .expect("rows not yet acknowledged");

    let config = fx.config_with(
        "OUTBOX_CDC__PRUNE__RETENTION=1h OUTBOX_CDC__REPAIR__COMMIT_TIME_MARGIN_MS=200",
    );
    let client = outbox_cdc::pg::PgConnectConfig::parse(&config.postgres.url)
        .expect("url")
        .connect_sql()
        .await
        .expect("connect as outbox");
    let report = pipeline::prune_once(
        &client,
        &config,
        Some(PgTimestamp(acked)),
        &Metrics::default(),
        None,
    )
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
    assert_eq!(left, vec![("after".to_owned(), 10)], "{report}");
    assert_eq!(report.rows(), 10, "{report}");
    fx.cleanup().await;
}
