//! Live sequence-gap detection (`[audit]`): a row inserted with a skipped
//! number is counted and logged; with `on_gap = "stop"` the connector stops
//! before publishing it, and nothing after it is acknowledged.

mod common;

use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Running, consume};
use outbox_cdc::pg::Lsn;
use outbox_cdc::pipeline::{GapKind, PipelineError};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Inserts one event of aggregate `agg` with an explicit sequence number.
async fn insert(fx: &Fixture, agg: &str, seq: i64) -> String {
    fx.admin
        .query_one(
            &format!(
                "INSERT INTO public.{} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
                 VALUES (gen_random_uuid(), 'order', $1, $2, 'Numbered', '{{}}') RETURNING event_id::text",
                fx.table
            ),
            &[&agg, &seq],
        )
        .await
        .expect("insert")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_number_is_counted_and_stops_when_asked() {
    init_tracing();
    let fx = Fixture::new("seqgap").await;
    let running = Running::start(fx.config()).await;
    insert(&fx, "a", 1).await;
    insert(&fx, "a", 2).await;
    insert(&fx, "a", 4).await; // 3 is missing
    insert(&fx, "b", 1).await;
    consume(&fx.topic_prefix, 4, TIMEOUT, Duration::from_secs(1));
    assert_eq!(running.metrics.sequence_gaps("order"), 1);
    running.stop().await.expect("graceful stop");

    // Under "stop": the next break ends the connector before the event is
    // published, and the offset stays before it.
    let config = fx.config_with("OUTBOX_CDC__AUDIT__ON_GAP=stop");
    let running = Running::start(config).await;
    insert(&fx, "b", 2).await;
    consume(&fx.topic_prefix, 5, TIMEOUT, Duration::from_secs(1));
    // The skipped number, and a WAL position inside its transaction, after
    // the insert: acknowledging the transaction would confirm beyond it.
    fx.admin.batch_execute("BEGIN").await.expect("begin");
    let skipped = insert(&fx, "b", 5).await;
    let inside: String = fx
        .admin
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);
    fx.admin.batch_execute("COMMIT").await.expect("commit");
    match running.finished(TIMEOUT).await {
        Err(PipelineError::SequenceGap(gap)) => {
            assert_eq!(
                (gap.aggregate_id.as_str(), gap.got, gap.previous),
                ("b", 5, Some(2))
            );
            assert_eq!(gap.kind, GapKind::Jump);
        }
        other => panic!("expected a stop on the gap, got {other:?}"),
    }
    let records = consume(&fx.topic_prefix, 5, TIMEOUT, Duration::from_secs(2));
    assert!(
        records.iter().all(|r| r.header("event_id") != skipped),
        "the event after the gap was published"
    );
    let confirmed: Lsn = fx
        .slot_confirmed_flush()
        .await
        .expect("slot")
        .parse()
        .expect("lsn");
    let inside: Lsn = inside.parse().expect("lsn");
    assert!(
        confirmed < inside,
        "acknowledged past the gap: slot confirmed {confirmed}, the gap's transaction ends after {inside}"
    );
    fx.cleanup().await;
}
