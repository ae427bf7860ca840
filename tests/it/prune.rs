//! Pruning (DESIGN.md §13, `[prune]`): no row that was not yet published is
//! ever deleted, whatever races it; whole partitions go when every row in
//! them qualifies; without a stored acknowledged commit time nothing goes.
//!
//! A row counts as acknowledged when its transaction provably ended before
//! the acknowledged LSN: its xid precedes the slot's `catalog_xmin` (taken
//! from a running-transactions record the slot confirmed) or the last
//! acknowledged checkpoint's `oldest_active_xid`, never by its commit
//! timestamp (tests/disruptive/prune_commit_ts.rs). The tests run `CHECKPOINT` (which logs a
//! running-transactions record) where a busy server would have logged one.
//!
//! Issue 29: the last two run the pruner while transactions stay open across
//! the acknowledged commit, and while a gap repair runs, and time every
//! application insert against `prune.lock_timeout_ms`.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::relay::{Fixture, Running, consume, eventually, read_ids};
use common::writer::spawn_writer;
use common::{admin_client, init_tracing};
use outbox_cdc::checkpoint::{OffsetStore, StoreError};
use outbox_cdc::metrics::Metrics;
use outbox_cdc::pg::PgTimestamp;
use outbox_cdc::pipeline::{
    self, AckedPosition, PipelineError, PruneError, PruneReport, RunOptions,
};

const TIMEOUT: Duration = Duration::from_secs(90);

/// Short retention and margin, small batches (several per prune).
const PRUNE_ENV: &str = "OUTBOX_CDC__PRUNE__RETENTION=1s OUTBOX_CDC__PRUNE__BATCH_ROWS=7 \
                         OUTBOX_CDC__REPAIR__OCCURRED_AT_MARGIN_MS=200";

/// `CHECKPOINT` every second (a busy server's checkpoint_timeout, shortened)
/// until aborted.
fn spawn_checkpoints() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        let client = admin_client().await;
        loop {
            client
                .batch_execute("CHECKPOINT")
                .await
                .expect("checkpoint");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

async fn table_ids(fx: &Fixture) -> BTreeSet<String> {
    fx.admin
        .query(
            &format!("SELECT event_id::text FROM public.{}", fx.table),
            &[],
        )
        .await
        .expect("read the outbox")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The connector publishes, then stops while a writer goes on: the rows
/// written after the stop are not published, and are past the retention when
/// the one-shot prune runs (while the writer still writes). Every deleted row
/// was in Kafka before the prune started; the unpublished ones all remain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_racing_writers_never_deletes_an_unpublished_row() {
    init_tracing();
    let fx = Fixture::new("prunerace").await;
    fx.admin
        .batch_execute(&format!("GRANT DELETE ON public.{} TO outbox", fx.table))
        .await
        .expect("grant delete");
    let running = Running::start(fx.config_with(PRUNE_ENV)).await;
    let writer = spawn_writer(fx.table.clone(), "p");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The rows written so far become provably committed before what the
    // connector acknowledges.
    slot_passes_rows(&fx, &running).await;
    running.stop().await.expect("graceful stop");
    // Unpublished from here on; older than the retention by the prune.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // What Kafka holds before the prune (the connector is stopped: final).
    let published: BTreeSet<String> = consume(&fx.topic_prefix, 1, TIMEOUT, Duration::from_secs(2))
        .iter()
        .map(|r| r.header("event_id").to_owned())
        .collect();
    assert!(
        published.len() > 20,
        "too little published: {}",
        published.len()
    );

    let report = pipeline::prune_stored(&fx.config_with(PRUNE_ENV), &Metrics::default())
        .await
        .expect("prune");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let committed: BTreeSet<String> = writer.finish().await.ids.into_iter().collect();
    let after = table_ids(&fx).await;

    let deleted: BTreeSet<&String> = committed.difference(&after).collect();
    let unpublished: BTreeSet<&String> = committed.difference(&published).collect();
    assert!(report.skipped.is_none(), "{report}");
    assert!(!deleted.is_empty(), "the prune deleted nothing: {report}");
    assert_eq!(deleted.len() as u64, report.rows(), "{report}");
    assert!(
        unpublished.len() > 20,
        "the test needs unpublished rows past the retention: {}",
        unpublished.len()
    );
    println!(
        "committed {}, published {}, deleted {}, unpublished kept {}",
        committed.len(),
        published.len(),
        deleted.len(),
        unpublished.len()
    );
    let wrongly: Vec<&&String> = deleted
        .iter()
        .filter(|id| !published.contains(**id))
        .collect();
    assert!(
        wrongly.is_empty(),
        "{} deleted rows were never published: {wrongly:?}",
        wrongly.len()
    );
    fx.cleanup().await;
}

/// `run`'s pruner reads the commit time the running session persisted (the
/// store is locked): with the connector streaming and a writer racing, it
/// deletes only published rows, and every row it deletes is in Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_pruner_deletes_only_published_rows() {
    init_tracing();
    let fx = Fixture::new("prunerun").await;
    fx.admin
        .batch_execute(&format!("GRANT DELETE ON public.{} TO outbox", fx.table))
        .await
        .expect("grant delete");
    let env = format!("{PRUNE_ENV} OUTBOX_CDC__PRUNE__INTERVAL=1s");
    let config = Arc::new(fx.config_with(&env));
    let running = Running::start(fx.config_with(&env)).await;
    let (stop_pruner, pruner_rx) = tokio::sync::watch::channel(false);
    let pruner = tokio::spawn(pipeline::run_pruner(
        config,
        running.metrics.clone(),
        pruner_rx,
    ));
    let writer = spawn_writer(fx.table.clone(), "r");
    let checkpoints = spawn_checkpoints();
    let metrics = running.metrics.clone();
    eventually("the pruner deleted rows", TIMEOUT, || {
        let metrics = metrics.clone();
        async move { metrics.pruned_rows() > 20 }
    })
    .await;
    let committed: BTreeSet<String> = writer.finish().await.ids.into_iter().collect();
    checkpoints.abort();
    stop_pruner.send(true).expect("stop the pruner");
    pruner.await.expect("pruner task");
    let after = table_ids(&fx).await;
    let deleted: BTreeSet<&String> = committed.difference(&after).collect();
    let records = consume(
        &fx.topic_prefix,
        committed.len(),
        TIMEOUT,
        Duration::from_secs(1),
    );
    let published: BTreeSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    let lost: Vec<&&String> = deleted
        .iter()
        .filter(|id| !published.contains(id.as_str()))
        .collect();
    assert!(lost.is_empty(), "deleted and never published: {lost:?}");
    let text = running.metrics.render();
    for gauge in [
        "outbox_cdc_outbox_rows ",
        "outbox_cdc_outbox_bytes ",
        "outbox_cdc_oldest_retained_age_seconds ",
    ] {
        let line = text.lines().find(|l| l.starts_with(gauge)).expect(gauge);
        assert!(!line.ends_with(" -1"), "{line}: not measured");
    }
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// No acknowledged commit time stored (the connector never published):
/// nothing is deleted, however old the rows, and the report says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_without_a_stored_commit_time_deletes_nothing() {
    init_tracing();
    let fx = Fixture::new("prunenotime").await;
    fx.admin
        .batch_execute(&format!(
            "GRANT DELETE ON public.{t} TO outbox;
             INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
             SELECT gen_random_uuid(), 'order', 'old', n, 'Old', '{{}}', now() - interval '30 days'
             FROM generate_series(1, 25) AS n;",
            t = fx.table
        ))
        .await
        .expect("old rows");
    let report = pipeline::prune_stored(&fx.config_with(PRUNE_ENV), &Metrics::default())
        .await
        .expect("prune");
    assert!(
        report
            .skipped
            .as_deref()
            .is_some_and(|why| why.contains("no acknowledged commit time")),
        "{report}"
    );
    assert_eq!(report.rows(), 0);
    assert_eq!(table_ids(&fx).await.len(), 25);
    fx.cleanup().await;
}

/// A partitioned outbox, retention 1 h: a leaf whose every row qualifies is
/// detached and dropped; a leaf past the retention that still holds rows
/// committed after the acknowledged position (unpublished, written with an
/// `occurred_at` in the past: audit F7) is only batch-deleted, those rows
/// kept; the DEFAULT partition and an empty future leaf are never dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_partitions_are_dropped_only_when_every_row_qualifies() {
    init_tracing();
    let fx = Fixture::new("pruneparts").await;
    let t = &fx.table;
    let split: String = fx
        .admin
        .query_one("SELECT (now() - interval '100 minutes')::text", &[])
        .await
        .expect("clock")
        .get(0);
    let insert = |agg: &str, n: i32, at: &str| {
        format!(
            "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
             SELECT gen_random_uuid(), 'order', '{agg}', n, 'E', '{{}}', {at} FROM generate_series(1, {n}) AS n;"
        )
    };
    fx.admin
        .batch_execute(&format!(
            "DROP PUBLICATION {p}; DROP TABLE public.{t};
             CREATE TABLE public.{t} (
                 event_id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
                 aggregate_sequence bigint NOT NULL, event_type text NOT NULL,
                 schema_version integer NOT NULL DEFAULT 1, payload jsonb NOT NULL,
                 occurred_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (event_id, occurred_at)) PARTITION BY RANGE (occurred_at);
             CREATE INDEX ON public.{t} (occurred_at);
             CREATE TABLE public.{t}_old PARTITION OF public.{t} FOR VALUES FROM ('2020-01-01') TO ('2021-01-01');
             CREATE TABLE public.{t}_held PARTITION OF public.{t} FOR VALUES FROM ('2021-01-01') TO ('{split}');
             CREATE TABLE public.{t}_now PARTITION OF public.{t} FOR VALUES FROM ('{split}') TO ('2200-01-01');
             CREATE TABLE public.{t}_future PARTITION OF public.{t} FOR VALUES FROM ('2200-01-01') TO ('2300-01-01');
             CREATE TABLE public.{t}_def PARTITION OF public.{t} DEFAULT;
             ALTER TABLE public.{t} OWNER TO outbox;
             ALTER TABLE public.{t}_old OWNER TO outbox;
             ALTER TABLE public.{t}_held OWNER TO outbox;
             ALTER TABLE public.{t}_now OWNER TO outbox;
             ALTER TABLE public.{t}_future OWNER TO outbox;
             ALTER TABLE public.{t}_def OWNER TO outbox;
             {old} {held} {young} {def}",
            p = fx.publication,
            old = insert("old", 30, "'2020-06-01'::timestamptz + n * interval '1 minute'"),
            held = insert("held", 20, "now() - interval '3 hours'"),
            young = insert("young", 30, "now()"),
            def = insert("def", 10, "'2019-01-01'::timestamptz + n * interval '1 minute'"),
        ))
        .await
        .expect("partitioned outbox");
    // Acknowledged: everything above.
    let acked = acknowledge_rows(&fx).await;
    // Committed after the acknowledged position, with an occurred_at past the
    // retention and before the acknowledged commit time: never published.
    fx.admin
        .batch_execute(&insert("unpublished", 5, "now() - interval '110 minutes'"))
        .await
        .expect("unpublished rows");
    let config = fx.config_with(
        "OUTBOX_CDC__PRUNE__RETENTION=1h OUTBOX_CDC__PRUNE__BATCH_ROWS=4 \
         OUTBOX_CDC__REPAIR__OCCURRED_AT_MARGIN_MS=0",
    );
    let client = outbox_cdc::pg::PgConnectConfig::parse(&config.postgres.url)
        .expect("url")
        .connect_sql()
        .await
        .expect("connect as outbox");
    let metrics = Metrics::default();
    let report = pipeline::prune_once(&client, &config, Some(acked), &[], &metrics, None)
        .await
        .expect("prune");

    let expect: BTreeSet<String> = ["held", "now", "future", "def"]
        .iter()
        .map(|p| format!("{t}_{p}"))
        .collect();
    assert_eq!(leaves(&fx).await, expect, "{report}");
    assert_eq!(
        report.dropped_partitions,
        vec![(format!("{t}_old"), 30)],
        "{report}"
    );
    assert_eq!(report.deleted_rows, 20 + 10, "{report}");
    assert_eq!(
        rows_by_aggregate(&fx).await,
        vec![("unpublished".to_owned(), 5), ("young".to_owned(), 30)]
    );
    assert_eq!(metrics.pruned_rows(), 60);
    fx.cleanup().await;
}

/// The leaf partitions of the fixture's table.
async fn leaves(fx: &Fixture) -> BTreeSet<String> {
    fx.admin
        .query(
            "SELECT relid::regclass::text FROM pg_partition_tree($1::text::regclass) WHERE isleaf",
            &[&format!("public.{}", fx.table)],
        )
        .await
        .expect("partitions")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Audit F16: the one-shot prune reads the acknowledged position from the
/// offset store; an offset stored for another database cluster (a restored
/// or cloned store, a config pointing elsewhere) is no position of this one:
/// the prune is refused, naming both clusters, and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_shot_prune_refuses_an_offset_of_another_cluster() {
    init_tracing();
    let fx = Fixture::new("pruneother").await;
    fx.admin
        .batch_execute(&format!(
            "GRANT DELETE ON public.{t} TO outbox;
             INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
             SELECT gen_random_uuid(), 'order', 'old', n, 'Old', '{{}}', now() - interval '30 days'
             FROM generate_series(1, 5) AS n;
             CHECKPOINT;",
            t = fx.table
        ))
        .await
        .expect("old rows");
    let lsn = fx.wal_insert_lsn().await;
    let now: i64 = fx
        .admin
        .query_one(
            "SELECT ((extract(epoch FROM clock_timestamp()) - 946684800) * 1e6)::int8",
            &[],
        )
        .await
        .expect("clock")
        .get(0);
    {
        let store = OffsetStore::open(&fx.offsets_path()).expect("store");
        store
            .persist_acked(&fx.slot, lsn, "1", Some(PgTimestamp(now)))
            .expect("an offset of cluster 1");
    }
    let err = pipeline::prune_stored(&fx.config_with(PRUNE_ENV), &Metrics::default())
        .await
        .expect_err("an offset of another cluster must not be pruned against");
    assert!(
        matches!(&err, PruneError::OtherCluster { stored, .. } if stored == "1"),
        "{err}"
    );
    assert_eq!(table_ids(&fx).await.len(), 5, "nothing deleted");
    fx.cleanup().await;
}

/// Audit F7(a): with `track_commit_timestamp = off` a writer may set
/// `occurred_at` itself (event time, an import, a backfill): a row committed
/// after the acknowledged position with an `occurred_at` far in the past was
/// judged acknowledged by its `occurred_at` and deleted before it was ever
/// published. Whether a row is acknowledged is never judged by
/// `occurred_at`: only rows provably committed before the acknowledged LSN go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backdated_row_committed_after_the_acknowledged_position_is_kept() {
    init_tracing();
    let fx = Fixture::new("prunelate").await;
    let t = &fx.table;
    let insert = |agg: &str| {
        format!(
            "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
             SELECT gen_random_uuid(), 'order', '{agg}', n, 'E', '{{}}', now() - interval '8 days'
             FROM generate_series(1, 5) AS n;"
        )
    };
    fx.admin
        .batch_execute(&format!(
            "GRANT DELETE ON public.{t} TO outbox; {}",
            insert("acked")
        ))
        .await
        .expect("acknowledged rows");
    // The acknowledged position: after "acked" committed.
    let acked = acknowledge_rows(&fx).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Committed after the acknowledged position, occurred_at 8 days back.
    fx.admin
        .batch_execute(&insert("late"))
        .await
        .expect("rows not yet acknowledged");

    let config = fx.config_with("OUTBOX_CDC__PRUNE__RETENTION=7d");
    let client = outbox_cdc::pg::PgConnectConfig::parse(&config.postgres.url)
        .expect("url")
        .connect_sql()
        .await
        .expect("connect as outbox");
    let report = common::prune_now(&client, &config, acked)
        .await
        .expect("prune");
    assert_eq!(
        rows_by_aggregate(&fx).await,
        vec![("late".to_owned(), 5)],
        "{report}"
    );
    assert_eq!(report.rows(), 5, "{report}");
    fx.cleanup().await;
}

/// Waits until the running connector's slot has confirmed a
/// running-transactions record (a `CHECKPOINT` logs one) newer than every row
/// now in the table: from then on they are provably committed before what
/// the connector acknowledges. Then, since the pruner keeps the rows the live
/// witness (on by default) has not checked yet, until its rounds have
/// checked them all (it checks by transaction id, oldest first, so having
/// checked as many rows as are now in the table means it passed them).
async fn slot_passes_rows(fx: &Fixture, running: &Running) {
    let (newest, rows): (String, i64) = {
        let row = fx
            .admin
            .query_one(
                &format!(
                    "SELECT max(xmin::text::int8)::text, count(*) FROM public.{}",
                    fx.table
                ),
                &[],
            )
            .await
            .expect("xmin");
        (row.get(0), row.get(1))
    };
    let metrics = running.metrics.clone();
    eventually("the live witness checks the rows", TIMEOUT, || {
        let checked = metrics.reconcile_checked_rows();
        async move { checked >= rows as u64 }
    })
    .await;
    eventually(
        "the slot's catalog_xmin passes the rows",
        TIMEOUT,
        || async {
            fx.admin
                .batch_execute("CHECKPOINT")
                .await
                .expect("checkpoint");
            fx.admin
                .query_one(
                    "SELECT coalesce(age(catalog_xmin) < age($2::text::xid), false)
                 FROM pg_replication_slots WHERE slot_name = $1",
                    &[&fx.slot, &newest],
                )
                .await
                .expect("slot")
                .get::<_, bool>(0)
        },
    )
    .await;
}

/// Acknowledges every row now in the fixture's table as a connector would:
/// its slot (created here when absent, advanced as a consumer confirms)
/// confirms a running-transactions record newer than them (a `CHECKPOINT`
/// logs one; repeated while another session's older transaction holds the
/// oldest running xid back). Returns the slot's confirmed position and the
/// server's clock as the acknowledged position.
async fn acknowledge_rows(fx: &Fixture) -> AckedPosition {
    fx.admin
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')
             WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)",
            &[&fx.slot],
        )
        .await
        .expect("create the slot");
    let proven = format!(
        "SELECT coalesce(bool_and(age(o.xmin) > age(s.catalog_xmin)), true)
         FROM public.{} o, pg_replication_slots s WHERE s.slot_name = $1",
        fx.table
    );
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        fx.admin
            .batch_execute("CHECKPOINT")
            .await
            .expect("checkpoint");
        fx.admin
            .execute(
                "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())",
                &[&fx.slot],
            )
            .await
            .expect("advance the slot");
        let done: bool = fx
            .admin
            .query_one(&proven, &[&fx.slot])
            .await
            .expect("catalog_xmin")
            .get(0);
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot's catalog_xmin never passed the table's rows"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let row = fx
        .admin
        .query_one(
            "SELECT confirmed_flush_lsn::text,
                    ((extract(epoch FROM clock_timestamp()) - 946684800) * 1e6)::int8
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("confirmed position");
    AckedPosition {
        lsn: row.get::<_, String>(0).parse().expect("an LSN"),
        commit_time: PgTimestamp(row.get(1)),
    }
}

/// `(aggregate_id, rows)` left in the fixture's table, by aggregate id.
async fn rows_by_aggregate(fx: &Fixture) -> Vec<(String, i64)> {
    fx.admin
        .query(
            &format!(
                "SELECT aggregate_id, count(*) FROM public.{} GROUP BY 1 ORDER BY 1",
                fx.table
            ),
            &[],
        )
        .await
        .expect("rows left")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Audit F5: a dead-lettered event's record may carry only "read it from the
/// outbox table" (payload over max_record_bytes/2), so the row is the only
/// full copy while its aggregate is parked awaiting `outbox-cdc release`: the
/// rows of a parked aggregate are not pruned, whatever their age and however
/// far the connector acknowledged; once released they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_aggregate_keeps_its_rows_until_released() {
    init_tracing();
    let fx = Fixture::new("pruneparked").await;
    fx.admin
        .batch_execute(&format!("GRANT DELETE ON public.{} TO outbox", fx.table))
        .await
        .expect("grant delete");
    let env = format!(
        "{PRUNE_ENV} OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter \
         OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={p}.dlq OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=2000",
        p = fx.topic_prefix
    );
    let running = Running::start(fx.config_with(&env)).await;
    let small = r#"{"n": 1}"#.to_owned();
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    fx.write_tx(&[("order", "a2", small.clone())], true).await;
    fx.write_tx(&[("order", "a1", huge)], true).await;
    fx.write_tx(&[("order", "a1", small.clone())], true).await;
    let records = consume(&fx.topic_prefix, 3, TIMEOUT, Duration::from_secs(1));
    assert_eq!(
        records.iter().filter(|r| r.topic.ends_with(".dlq")).count(),
        2,
        "the poison event and the parked one are dead-lettered: {records:#?}"
    );
    // Acknowledged past every row, then past the retention (1 s).
    slot_passes_rows(&fx, &running).await;
    fx.write_tx(&[("order", "a3", small)], true).await;
    running.stop().await.expect("graceful stop");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let config = fx.config_with(&env);
    let report = pipeline::prune_stored(&config, &Metrics::default())
        .await
        .expect("prune");
    let left = rows_by_aggregate(&fx).await;
    assert!(
        left.contains(&("a1".to_owned(), 2)) && !left.iter().any(|(a, _)| a == "a2"),
        "the parked aggregate's rows stay, the others go: {left:?}; {report}"
    );
    // Review consumer-replay F2: an HA peer's store that never saw the poison
    // event (here: this store with its copy released) still keeps the rows
    // while the shared table parks the aggregate.
    {
        let store = OffsetStore::open(&fx.offsets_path()).expect("store");
        assert!(store.release("order", "a1").expect("release"));
    }
    let report = pipeline::prune_stored(&config, &Metrics::default())
        .await
        .expect("prune");
    let left = rows_by_aggregate(&fx).await;
    assert!(
        left.contains(&("a1".to_owned(), 2)),
        "parked in the shared table only: its rows stay: {left:?}; {report}"
    );
    // As `outbox-cdc release` does: the shared table's row goes.
    let table = outbox_cdc::parking::ParkedTable::of(&config)
        .expect("parking settings")
        .expect("dead-letter parking is shared");
    assert!(
        table
            .release("order", "a1")
            .await
            .expect("release in the table")
    );
    let report = pipeline::prune_stored(&config, &Metrics::default())
        .await
        .expect("prune");
    let left = rows_by_aggregate(&fx).await;
    assert!(
        !left.iter().any(|(a, _)| a == "a1"),
        "released: its rows go: {left:?}; {report}"
    );
    fx.cleanup().await;
}

/// Recreates the fixture's table as a partitioned outbox owned by the
/// connector's role (dropping a partition needs ownership): `by` is the
/// `PARTITION BY` clause, `key` the primary key's columns (they must include
/// the partition key), `leaves` each leaf's suffix and bound clause.
async fn partitioned(fx: &Fixture, by: &str, key: &str, leaves: &[(&str, String)]) {
    let t = &fx.table;
    let mut ddl = format!(
        "DROP PUBLICATION {p}; DROP TABLE public.{t};
         CREATE TABLE public.{t} (
             event_id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
             aggregate_sequence bigint NOT NULL, event_type text NOT NULL,
             schema_version integer NOT NULL DEFAULT 1, payload jsonb NOT NULL,
             occurred_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY ({key})) PARTITION BY {by};
         CREATE INDEX ON public.{t} (occurred_at);
         ALTER TABLE public.{t} OWNER TO outbox;",
        p = fx.publication
    );
    for (suffix, bound) in leaves {
        ddl.push_str(&format!(
            "CREATE TABLE public.{t}_{suffix} PARTITION OF public.{t} {bound};
             ALTER TABLE public.{t}_{suffix} OWNER TO outbox;"
        ));
    }
    fx.admin
        .batch_execute(&ddl)
        .await
        .expect("partitioned outbox");
}

/// Inserts `n` rows of aggregate `agg` with `occurred_at` = `at` (SQL).
async fn insert_rows(fx: &Fixture, agg: &str, n: i32, at: &str) {
    fx.admin
        .batch_execute(&format!(
            "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
             SELECT gen_random_uuid(), 'order', '{agg}', n, 'E', '{{}}', {at} FROM generate_series(1, {n}) AS n;",
            t = fx.table
        ))
        .await
        .expect("insert rows");
}

/// The fixture's configuration with `env`, and a connection as the
/// connector's role.
async fn outbox_client(
    fx: &Fixture,
    env: &str,
) -> (outbox_cdc::config::Config, tokio_postgres::Client) {
    let config = fx.config_with(env);
    let client = outbox_cdc::pg::PgConnectConfig::parse(&config.postgres.url)
        .expect("url")
        .connect_sql()
        .await
        .expect("connect as outbox");
    (config, client)
}

/// Audit F3: a partition is dropped for its bounds, not for its rows. A
/// quiet outbox whose current RANGE partition (FROM now-30d TO now+30d)
/// holds only acknowledged rows past the retention keeps that partition (its
/// rows are deleted): the application's next insert still finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_current_range_partition_is_not_dropped() {
    init_tracing();
    let fx = Fixture::new("prunecurrent").await;
    let row = fx
        .admin
        .query_one(
            "SELECT (now() - interval '30 days')::text, (now() + interval '30 days')::text",
            &[],
        )
        .await
        .expect("clock");
    let (from, to): (String, String) = (row.get(0), row.get(1));
    partitioned(
        &fx,
        "RANGE (occurred_at)",
        "event_id, occurred_at",
        &[("cur", format!("FOR VALUES FROM ('{from}') TO ('{to}')"))],
    )
    .await;
    insert_rows(&fx, "quiet", 10, "now() - interval '8 days'").await;
    let acked = acknowledge_rows(&fx).await;
    let (config, client) = outbox_client(&fx, "OUTBOX_CDC__PRUNE__RETENTION=7d").await;
    let report = common::prune_now(&client, &config, acked)
        .await
        .expect("prune");
    assert!(report.dropped_partitions.is_empty(), "{report}");
    assert_eq!(report.deleted_rows, 10, "{report}");
    fx.admin
        .batch_execute(&format!(
            "INSERT INTO public.{} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
             VALUES (gen_random_uuid(), 'order', 'next', 1, 'E', '{{}}')",
            fx.table
        ))
        .await
        .unwrap_or_else(|e| panic!("the application's insert after the prune failed: {e}; {report}"));
    fx.cleanup().await;
}

/// Audit F3: HASH (and LIST) partitions take rows of any time: a bucket whose
/// rows are all acknowledged and past the retention is emptied by batch
/// deletes, never dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_hash_partition_is_not_dropped() {
    init_tracing();
    let fx = Fixture::new("prunehash").await;
    partitioned(
        &fx,
        "HASH (aggregate_id)",
        "event_id, aggregate_id",
        &[
            ("h0", "FOR VALUES WITH (MODULUS 2, REMAINDER 0)".into()),
            ("h1", "FOR VALUES WITH (MODULUS 2, REMAINDER 1)".into()),
        ],
    )
    .await;
    for i in 0..10 {
        insert_rows(&fx, &format!("q{i}"), 2, "now() - interval '8 days'").await;
    }
    // Which bucket each aggregate went to: "q0"'s bucket stays quiet, the
    // other one also gets young rows.
    let buckets: Vec<(String, String)> = fx
        .admin
        .query(
            &format!(
                "SELECT DISTINCT aggregate_id, tableoid::regclass::text FROM public.{}",
                fx.table
            ),
            &[],
        )
        .await
        .expect("buckets")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let quiet = &buckets.iter().find(|(a, _)| a == "q0").expect("q0").1;
    let busy = buckets
        .iter()
        .find(|(_, b)| b != quiet)
        .expect("both buckets used");
    insert_rows(&fx, &busy.0, 3, "now()").await;
    let acked = acknowledge_rows(&fx).await;
    let (config, client) = outbox_client(&fx, "OUTBOX_CDC__PRUNE__RETENTION=7d").await;
    let report = common::prune_now(&client, &config, acked)
        .await
        .expect("prune");
    assert!(report.dropped_partitions.is_empty(), "{report}");
    assert_eq!(report.deleted_rows, 20, "{report}");
    assert_eq!(leaves(&fx).await.len(), 2, "{report}");
    insert_rows(&fx, "q0", 1, "now()").await;
    fx.cleanup().await;
}

/// Audit F3: pruning never makes the application's inserts wait longer than
/// `prune.lock_timeout_ms`, even while another application transaction
/// stays open on the outbox: detaching an old partition must not queue an
/// ACCESS EXCLUSIVE lock on the partitioned table in front of the writers
/// (PostgreSQL 14+ detaches CONCURRENTLY; an interrupted concurrent detach
/// is finalized by a later prune).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_never_wait_longer_than_the_lock_timeout() {
    init_tracing();
    let fx = Fixture::new("prunelock").await;
    let t = fx.table.clone();
    partitioned(
        &fx,
        "RANGE (occurred_at)",
        "event_id, occurred_at",
        &[
            (
                "old",
                "FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')".into(),
            ),
            ("now", "FOR VALUES FROM ('2021-01-01') TO (MAXVALUE)".into()),
        ],
    )
    .await;
    insert_rows(&fx, "old", 10, "'2020-06-01'").await;
    let acked = acknowledge_rows(&fx).await;
    let lock_timeout = Duration::from_millis(1000);
    let (config, client) = outbox_client(
        &fx,
        "OUTBOX_CDC__PRUNE__RETENTION=7d OUTBOX_CDC__PRUNE__LOCK_TIMEOUT_MS=1000",
    )
    .await;

    // An application transaction that stays open on the outbox for 3 s.
    let open = admin_client().await;
    open.batch_execute(&format!(
        "BEGIN; INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
         VALUES (gen_random_uuid(), 'order', 'open', 1, 'E', '{{}}')"
    ))
    .await
    .expect("open transaction");
    // Another application session inserting meanwhile, timing each insert.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn({
        let t = t.clone();
        async move {
            let client = admin_client().await;
            let mut slowest = Duration::ZERO;
            let mut n = 0;
            while !*stopped.borrow() {
                let started = std::time::Instant::now();
                client
                    .batch_execute(&format!(
                        "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
                         VALUES (gen_random_uuid(), 'order', 'w', 1, 'E', '{{}}')"
                    ))
                    .await
                    .expect("application insert");
                slowest = slowest.max(started.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (slowest, n)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let prune = tokio::spawn({
        let config = fx
            .config_with("OUTBOX_CDC__PRUNE__RETENTION=7d OUTBOX_CDC__PRUNE__LOCK_TIMEOUT_MS=1000");
        async move {
            let report = common::prune_now(&client, &config, acked).await;
            (client, report)
        }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    open.batch_execute("COMMIT").await.expect("commit");
    let (client, first) = prune.await.expect("prune task");
    let first = first.expect("prune while the transaction was open");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(true).expect("stop the writer");
    let (slowest, inserts) = writer.await.expect("writer");
    println!("{inserts} inserts, slowest {slowest:?}; first prune: {first}");
    assert!(
        slowest < lock_timeout + Duration::from_millis(500),
        "an application insert waited {slowest:?} (lock timeout {lock_timeout:?}); {first}"
    );
    assert!(inserts > 20, "the writer hardly wrote: {inserts}");
    // Once the transaction ended, a later prune finishes the job: the next
    // one, unless something else (autovacuum, a busy server) holds a lock on
    // the partition past the lock timeout again; the pruner runs on every
    // interval, so a few rounds here.
    let mut later = Vec::new();
    for _ in 0..5 {
        let report = common::prune_now(&client, &config, acked)
            .await
            .expect("prune after the transaction ended");
        let done = !report.dropped_partitions.is_empty() || !first.dropped_partitions.is_empty();
        later.push(report);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let dropped: Vec<&str> = first
        .dropped_partitions
        .iter()
        .chain(later.iter().flat_map(|r| &r.dropped_partitions))
        .map(|(p, _)| p.as_str())
        .collect();
    let reports: Vec<String> = later.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        dropped,
        vec![format!("{t}_old")],
        "{first} / {}",
        reports.join(" / ")
    );
    assert_eq!(leaves(&fx).await.len(), 1);
    fx.cleanup().await;
}

/// Audit F5 for `run`'s pruner, which cannot open the offset store (the
/// pipeline holds it): it reads the parked aggregates from the store the
/// pipeline opened, and keeps their rows while it deletes the others'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_pruner_keeps_the_rows_of_parked_aggregates() {
    init_tracing();
    let fx = Fixture::new("prunerunparked").await;
    fx.admin
        .batch_execute(&format!("GRANT DELETE ON public.{} TO outbox", fx.table))
        .await
        .expect("grant delete");
    let env = format!(
        "{PRUNE_ENV} OUTBOX_CDC__PRUNE__INTERVAL=1s OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter \
         OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={p}.dlq OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=2000",
        p = fx.topic_prefix
    );
    let running = Running::start(fx.config_with(&env)).await;
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    fx.write_tx(&[("order", "a1", huge)], true).await;
    fx.write_tx(&[("order", "a1", r#"{"n": 1}"#.to_owned())], true)
        .await;
    let writer = spawn_writer(fx.table.clone(), "w");
    let checkpoints = spawn_checkpoints();
    let metrics = running.metrics.clone();
    eventually("the pruner deleted rows", TIMEOUT, || {
        let metrics = metrics.clone();
        async move { metrics.pruned_rows() > 20 }
    })
    .await;
    writer.finish().await;
    checkpoints.abort();
    running.stop().await.expect("graceful stop");
    let left = rows_by_aggregate(&fx).await;
    assert!(
        left.contains(&("a1".to_owned(), 2)),
        "the parked aggregate's rows stay: {left:?}"
    );
    fx.cleanup().await;
}

/// `[prune] lock_timeout_ms` in the issue 29 tests below.
const LOCK_TIMEOUT: Duration = Duration::from_millis(1000);

/// What an application insert may take beyond the lock timeout: the test
/// servers share two busy cores with the connector, the pruner, a CHECKPOINT
/// every second and other tests, where a commit's fsync alone has taken
/// hundreds of milliseconds. An insert queued behind a detach that does not
/// bound its wait waits as long as the open transactions below (4 s and
/// more), well past this.
const SCHEDULING_ALLOWANCE: Duration = Duration::from_millis(1000);

/// Inserts `n` rows of aggregate `agg` with `occurred_at` = `at` (SQL) on
/// `client`, in its current transaction if one is open; returns their ids.
async fn insert_ids(
    client: &tokio_postgres::Client,
    table: &str,
    agg: &str,
    n: i32,
    at: &str,
) -> Vec<String> {
    client
        .query(
            &format!(
                "INSERT INTO public.{table} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
                 SELECT gen_random_uuid(), 'order', $1, n, 'E', '{{}}', {at} FROM generate_series(1, $2) AS n
                 RETURNING event_id::text"
            ),
            &[&agg, &n],
        )
        .await
        .expect("insert rows")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Which of `ids` never reached the topics of `fx` (read until all arrived,
/// or [`TIMEOUT`]; duplicates do not end the read early).
fn missing_from_kafka(fx: &Fixture, ids: &BTreeSet<String>) -> Vec<String> {
    let records = read_ids(&fx.topic_prefix, ids, TIMEOUT, Duration::from_secs(1))
        .unwrap_or_else(|partial| partial);
    let seen: BTreeSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    ids.iter()
        .filter(|id| !seen.contains(id.as_str()))
        .cloned()
        .collect()
}

/// The event ids in the topics of `fx`, read to their current end.
fn published_ids(fx: &Fixture, expected: usize) -> BTreeSet<String> {
    consume(&fx.topic_prefix, expected, TIMEOUT, Duration::from_secs(2))
        .iter()
        .map(|r| r.header("event_id").to_owned())
        .collect()
}

/// `CHECKPOINT`, then waits until the running connector has acknowledged
/// past it: from then on that checkpoint is at or before the acknowledged
/// position. With `past_rows`, the checkpoint is repeated while an older
/// transaction (here or elsewhere in the cluster) holds its oldest running
/// xid before the rows now in the table: it then proves every one of them
/// committed before the acknowledged position.
async fn acknowledged_checkpoint(fx: &Fixture, metrics: &Metrics, past_rows: bool) {
    let newest: Option<String> = fx
        .admin
        .query_one(
            &format!(
                "SELECT max(xmin::text::int8)::text FROM public.{}",
                fx.table
            ),
            &[],
        )
        .await
        .expect("xmin")
        .get(0);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let at: outbox_cdc::pg::Lsn = loop {
        fx.admin
            .batch_execute("CHECKPOINT")
            .await
            .expect("checkpoint");
        let row = fx
            .admin
            .query_one(
                "SELECT checkpoint_lsn::text, age(oldest_active_xid) < age($1::text::xid)
                 FROM pg_control_checkpoint()",
                &[&newest],
            )
            .await
            .expect("pg_control_checkpoint");
        if !past_rows || row.get::<_, Option<bool>>(1).unwrap_or(true) {
            break row.get::<_, String>(0).parse().expect("an LSN");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the checkpoints' oldest running xid never passed the table's rows"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eventually(
        "the connector acknowledges past the checkpoint",
        TIMEOUT,
        || async { metrics.acked() > at },
    )
    .await;
}

/// Issue 29: transactions that began (and wrote outbox rows, their
/// `occurred_at` their start or earlier, past the retention) before the
/// acknowledged commit and commit after it. While they are open the
/// connector acknowledges later-starting transactions and `run`'s pruner
/// prunes (and tries to drop the old partition, which these transactions
/// hold: the detach waits at most the lock timeout); then the connector
/// stops, they commit, and the one-shot prune runs before they are
/// published. None of their rows is deleted, every deleted row was in Kafka
/// (before the prune, for the one-shot), every row reaches Kafka once the
/// connector runs again, and no application insert waited longer than
/// `lock_timeout_ms` (plus [`SCHEDULING_ALLOWANCE`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_keeps_rows_of_transactions_open_across_the_acknowledged_commit() {
    init_tracing();
    let fx = Fixture::new("pruneopen").await;
    let t = fx.table.clone();
    partitioned(
        &fx,
        "RANGE (occurred_at)",
        "event_id, occurred_at",
        &[
            (
                "old",
                "FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')".into(),
            ),
            ("now", "FOR VALUES FROM ('2021-01-01') TO (MAXVALUE)".into()),
        ],
    )
    .await;
    fx.admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE public.{t} WITH (publish = 'insert', publish_via_partition_root = true)",
            fx.publication
        ))
        .await
        .expect("publication");
    let env = format!(
        "{PRUNE_ENV} OUTBOX_CDC__PRUNE__INTERVAL=1s OUTBOX_CDC__PRUNE__LOCK_TIMEOUT_MS={}",
        LOCK_TIMEOUT.as_millis()
    );
    let running = Running::start(fx.config_with(&env)).await;
    let metrics = running.metrics.clone();
    let bound = LOCK_TIMEOUT + SCHEDULING_ALLOWANCE;
    let writer = spawn_writer(t.clone(), "w");
    // Published rows of the old partition, which the pruner wants to drop.
    let old = insert_ids(&fx.admin, &t, "old", 10, "'2020-06-01'").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Open across the acknowledged commit: A's rows carry its start time
    // (the column's default), B's an hour before it.
    let open_a = admin_client().await;
    open_a.batch_execute("BEGIN").await.expect("BEGIN");
    let a = insert_ids(&open_a, &t, "open-a", 3, "now()").await;
    let open_b = admin_client().await;
    open_b.batch_execute("BEGIN").await.expect("BEGIN");
    let b = insert_ids(&open_b, &t, "open-b", 3, "now() - interval '1 hour'").await;
    let open: BTreeSet<String> = a.iter().chain(&b).cloned().collect();

    // The connector acknowledges transactions that started after them, and
    // the running pruner deletes rows while they are open.
    let checkpoints = spawn_checkpoints();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = fx.wal_insert_lsn().await;
    eventually(
        "the connector acknowledges later transactions",
        TIMEOUT,
        || async {
            writer.assert_no_insert_waits_longer_than(bound);
            metrics.acked() > later
        },
    )
    .await;
    eventually("the running pruner deleted rows", TIMEOUT, || async {
        writer.assert_no_insert_waits_longer_than(bound);
        metrics.pruned_rows() >= old.len() as u64
    })
    .await;
    // A few more passes while they stay open (each tries the detach).
    writer.watch(Duration::from_secs(3), bound).await;
    checkpoints.abort();
    acknowledged_checkpoint(&fx, &metrics, false).await;
    let pruned_while_open = metrics.pruned_rows();
    running.stop().await.expect("graceful stop");

    // They commit after the acknowledged position; the connector is stopped,
    // so what Kafka holds now is final until it runs again.
    let published = published_ids(&fx, 1);
    assert!(
        open.iter().all(|id| !published.contains(id)),
        "the open transactions' rows were published before they committed"
    );
    open_a.batch_execute("COMMIT").await.expect("commit A");
    open_b.batch_execute("COMMIT").await.expect("commit B");
    writer.watch(Duration::from_millis(1200), bound).await;
    let before = table_ids(&fx).await;
    let report = pipeline::prune_stored(&fx.config_with(&env), &Metrics::default())
        .await
        .expect("the one-shot prune");
    let after = table_ids(&fx).await;
    assert!(report.skipped.is_none(), "{report}");
    let gone: Vec<&String> = open.iter().filter(|id| !after.contains(*id)).collect();
    assert!(
        gone.is_empty(),
        "rows of transactions committed after the acknowledged position were deleted before they \
         were published: {gone:?}; {report}"
    );
    let unpublished: Vec<&String> = before
        .difference(&after)
        .filter(|id| !published.contains(*id))
        .collect();
    assert!(
        unpublished.is_empty(),
        "the one-shot prune deleted rows that were not in Kafka: {unpublished:?}; {report}"
    );

    // Running again, the connector publishes them; nothing was lost.
    let running = Running::start(fx.config_with(&env)).await;
    writer.watch(Duration::from_millis(500), bound).await;
    let written = writer.finish().await;
    let committed: BTreeSet<String> = written
        .ids
        .iter()
        .chain(&old)
        .chain(&open)
        .cloned()
        .collect();
    let lost = missing_from_kafka(&fx, &committed);
    running.stop().await.expect("graceful stop");
    let remaining = table_ids(&fx).await;
    println!(
        "committed {}, pruned while open {pruned_while_open}, one-shot: {report}; deleted in all {}, \
         leaves now {:?}; slowest insert {:?}",
        committed.len(),
        committed.difference(&remaining).count(),
        leaves(&fx).await,
        written.slowest
    );
    assert!(lost.is_empty(), "never published: {lost:?}");
    assert!(
        written.slowest < bound,
        "an application insert waited {:?} (lock timeout {LOCK_TIMEOUT:?})",
        written.slowest
    );
    fx.cleanup().await;
}

/// Issue 29: the slot is lost while the connector streams (its walsender
/// ended, the slot dropped; a peer's repair lock, audit F6, keeps the
/// connector from recreating it at once), rows are written in the gap, then
/// the connector repairs it (`--recreate-slot`), and that repair is cut off
/// half-way (its connection terminated) and resumed from the current state
/// of the table: there a row deleted early is lost for good. Meanwhile
/// `run`'s pruner goes on (every second, against the session's last durable
/// position), and so does a pruner pass every 100 ms against the same
/// acknowledged LSN, whose reports show what it could prove; the one-shot
/// prune is refused (the connector holds the offset store).
///
/// No row of the repair window is deleted until the repair has finished (a
/// sampler reads them every 50 ms; the pruner's proof may only move past them
/// with the acknowledged position, which moves once the repair's offset is
/// stored), every committed row reaches Kafka, and no application insert
/// waited longer than `lock_timeout_ms` (plus [`SCHEDULING_ALLOWANCE`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_while_gap_repair_runs_keeps_the_repair_window() {
    init_tracing();
    let fx = Fixture::new("prunerepair").await;
    let t = fx.table.clone();
    fx.admin
        .batch_execute(&format!("GRANT DELETE ON public.{t} TO outbox"))
        .await
        .expect("grant delete");
    // Rows committed up to 10 s before the acknowledged commit are repaired
    // (a slow insert on a busy machine is not a row the repair's margin
    // leaves out), one record in flight at a time (the repair lasts seconds).
    let env = format!(
        "OUTBOX_CDC__PRUNE__RETENTION=1s OUTBOX_CDC__PRUNE__BATCH_ROWS=7 OUTBOX_CDC__PRUNE__INTERVAL=1s \
         OUTBOX_CDC__PRUNE__LOCK_TIMEOUT_MS={} OUTBOX_CDC__REPAIR__OCCURRED_AT_MARGIN_MS=10000 \
         OUTBOX_CDC__LIMITS__MAX_IN_FLIGHT_EVENTS=1",
        LOCK_TIMEOUT.as_millis()
    );
    let bound = LOCK_TIMEOUT + SCHEDULING_ALLOWANCE;
    let running = Running::spawn(
        fx.config_with(&env),
        RunOptions {
            recreate_slot: true,
            ..RunOptions::default()
        },
    );
    running.wait_streaming().await;
    let metrics = running.metrics.clone();

    // Streaming: the running pruner deletes published rows.
    let writer = spawn_writer(t.clone(), "w");
    let checkpoints = spawn_checkpoints();
    eventually("the running pruner deleted rows", TIMEOUT, || async {
        writer.assert_no_insert_waits_longer_than(bound);
        metrics.pruned_rows() > 0
    })
    .await;
    checkpoints.abort();
    // Acknowledged before the loss, past the retention only during the
    // repair (a writer's clock 10 s ahead): the pruner may delete them then,
    // if the last checkpoint is still the one acknowledged below.
    let aging = insert_ids(&fx.admin, &t, "aging", 20, "now() + interval '10 s'").await;
    acknowledged_checkpoint(&fx, &metrics, true).await;

    // The slot is lost while the connector streams.
    let peer = admin_client().await;
    let lock = "hashtextextended('outbox-cdc slot ' || $1, 0)";
    peer.query_one(
        &format!("SELECT pg_advisory_lock({lock})::text"),
        &[&fx.slot],
    )
    .await
    .expect("a peer's repair lock");
    fx.admin
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
            &[&fx.slot],
        )
        .await
        .expect("end the walsender");
    eventually("the slot is dropped", TIMEOUT, || async {
        writer.assert_no_insert_waits_longer_than(bound);
        fx.admin
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                 WHERE slot_name = $1 AND NOT active",
                &[&fx.slot],
            )
            .await
            .expect("drop the slot")
            == 1
    })
    .await;
    eventually("the session ended", TIMEOUT, || async {
        !metrics.is_connected()
    })
    .await;
    let acked_at_loss = metrics.acked();

    // The repair window: rows committed from now on (after the last
    // acknowledged commit), aggregates "g...".
    let gap = spawn_writer(t.clone(), "g");
    let sampler = tokio::spawn({
        let (metrics, t) = (metrics.clone(), t.clone());
        async move {
            let client = admin_client().await;
            let (mut seen, mut vanished) = (BTreeSet::new(), BTreeSet::new());
            let mut samples = 0;
            loop {
                if metrics.is_connected() {
                    return (seen, vanished, samples);
                }
                let now: BTreeSet<String> = client
                    .query(
                        &format!(
                            "SELECT event_id::text FROM public.{t} WHERE aggregate_id LIKE 'g%'"
                        ),
                        &[],
                    )
                    .await
                    .expect("sample the window")
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                // Read while the repair was unfinished from start to end.
                if !metrics.is_connected() {
                    vanished.extend(seen.difference(&now).cloned());
                    seen.extend(now);
                    samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    // The pruner `run` starts, with 100 ms between passes: the session's
    // acknowledged LSN (its commit time matters only with
    // track_commit_timestamp = on: none given, only the proof by xid).
    let (stop_pruning, pruning_stopped) = tokio::sync::watch::channel(false);
    let pruner = tokio::spawn({
        let metrics = metrics.clone();
        let (config, client) = outbox_client(&fx, &env).await;
        async move {
            let mut reports = Vec::new();
            while !*pruning_stopped.borrow() {
                let repairing = !metrics.is_connected();
                let acked = AckedPosition {
                    lsn: metrics.acked(),
                    commit_time: PgTimestamp(0),
                };
                let report = common::prune_now(&client, &config, acked)
                    .await
                    .expect("prune");
                reports.push((repairing && !metrics.is_connected(), report));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            reports
        }
    });
    let bulk = insert_ids(&fx.admin, &t, "g-bulk", 300, "now()").await;
    gap.watch(Duration::from_secs(2), bound).await;

    // The one-shot prune cannot judge by a stale store: refused.
    let one_shot = {
        let config = fx.config_with(&env);
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(pipeline::prune_stored(&config, &Metrics::default()))
        })
        .join()
        .expect("one-shot prune thread")
    };
    assert!(
        matches!(
            &one_shot,
            Err(PruneError::Pipeline(PipelineError::Store(
                StoreError::Locked { .. }
            )))
        ),
        "the one-shot prune ran while the connector held the store: {one_shot:?}"
    );

    // The peer goes: the connector repairs; cut off half-way, it resumes.
    peer.query_one(
        &format!("SELECT pg_advisory_unlock({lock})::text"),
        &[&fx.slot],
    )
    .await
    .expect("release the repair lock");
    eventually("the repair publishes", TIMEOUT, || async {
        gap.assert_no_insert_waits_longer_than(bound);
        assert!(
            !metrics.is_connected(),
            "the repair finished before it was cut off"
        );
        metrics.repair_rows() > 100
    })
    .await;
    let cut = fx
        .admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE usename = 'outbox' AND query LIKE 'SELECT %::int8 FROM %' || $1 || '% AS o WHERE % ORDER BY %'",
            &[&t],
        )
        .await
        .expect("terminate the repair's connection");
    assert_eq!(cut, 1, "the repair's connection was not found");
    let first_attempt = metrics.repair_rows();
    eventually("the resumed repair finished", TIMEOUT, || async {
        gap.assert_no_insert_waits_longer_than(bound);
        metrics.is_connected()
    })
    .await;
    gap.watch(Duration::from_millis(500), bound).await;
    let (seen, vanished, samples) = sampler.await.expect("sampler");
    stop_pruning.send(true).expect("stop pruning");
    let reports = pruner.await.expect("pruner");
    let in_gap = gap.finish().await;
    let window: BTreeSet<String> = in_gap.ids.iter().cloned().chain(bulk).collect();
    let before = writer.finish().await;
    let slowest = before.slowest.max(in_gap.slowest);

    let aging_left = table_ids(&fx).await;
    let aging_deleted = aging.iter().filter(|id| !aging_left.contains(*id)).count();
    let committed: BTreeSet<String> = before
        .ids
        .iter()
        .chain(&window)
        .chain(&aging)
        .cloned()
        .collect();
    let lost = missing_from_kafka(&fx, &committed);
    running.stop().await.expect("graceful stop");
    let during: Vec<&PruneReport> = reports
        .iter()
        .filter(|(repairing, _)| *repairing)
        .map(|(_, r)| r)
        .collect();
    println!(
        "acked at the loss {acked_at_loss}; window {} rows ({} seen by {samples} samples); repair published \
         {first_attempt} rows before it was cut off, {} in all; {} prune passes while repairing deleted {} rows \
         (witnesses {:?}); rows acknowledged before the loss and past the retention only during the repair: \
         {aging_deleted} of {} deleted by the end; slowest insert {slowest:?}",
        window.len(),
        seen.len(),
        metrics.repair_rows(),
        during.len(),
        during.iter().map(|r| r.rows()).sum::<u64>(),
        during
            .iter()
            .map(|r| r.witness.clone().unwrap_or_default())
            .collect::<BTreeSet<_>>(),
        aging.len(),
    );
    assert!(
        vanished.is_empty(),
        "{} rows of the repair window were deleted before the repair finished ({} rows never \
         reached Kafka): {vanished:?}",
        vanished.len(),
        lost.len()
    );
    assert!(
        during.len() >= 3 && samples >= 20,
        "the pruner ({}) or the sampler ({samples}) hardly ran during the repair",
        during.len()
    );
    let lost_in_window = lost.iter().filter(|id| window.contains(*id)).count();
    let lost_aging = lost.iter().filter(|id| aging.contains(*id)).count();
    let lost_left = lost.iter().filter(|id| aging_left.contains(*id)).count();
    assert!(
        lost.is_empty(),
        "{} rows never published ({lost_in_window} of the window, {lost_aging} aging, {lost_left} \
         still in the table): {lost:?}",
        lost.len()
    );
    assert!(
        slowest < bound,
        "an application insert waited {slowest:?} (lock timeout {LOCK_TIMEOUT:?})"
    );
    fx.cleanup().await;
}

/// Issue 47: while a coverage break is stored, rows of its window may be
/// unpublished although acknowledged; the one-shot prune refuses (naming the
/// audit that republishes them) and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_coverage_break_stops_the_one_shot_prune() {
    init_tracing();
    let fx = Fixture::new("prunebreak").await;
    fx.admin
        .batch_execute(&format!("GRANT DELETE ON public.{} TO outbox", fx.table))
        .await
        .expect("grant delete");
    let running = Running::start(fx.config_with(PRUNE_ENV)).await;
    fx.write_tx(&[("order", "a", r#"{"n":1}"#.to_owned())], true)
        .await;
    consume(&fx.topic_prefix, 1, TIMEOUT, Duration::ZERO);
    running.stop().await.expect("graceful stop");
    {
        let store = OffsetStore::open(&fx.offsets_path()).expect("store");
        let mut record = store
            .coverage(&fx.slot)
            .expect("read")
            .expect("a coverage record after a run");
        let now = PgTimestamp::now().0;
        record.breaks.push(outbox_cdc::checkpoint::CoverageBreak {
            since_micros: now - 60_000_000,
            until_micros: now,
            what: "a test break".to_owned(),
        });
        store.save_coverage(&fx.slot, &record).expect("save");
    }
    let before = table_ids(&fx).await;
    match pipeline::prune_stored(&fx.config_with(PRUNE_ENV), &Metrics::default()).await {
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("outbox-cdc audit") && text.contains("--repair"),
                "{text}"
            );
        }
        Ok(report) => panic!("the prune ran although a coverage break is stored: {report}"),
    }
    assert_eq!(table_ids(&fx).await, before, "rows were deleted");
    fx.cleanup().await;
}

/// Issue 48: the pruner never deletes a row the live witness has not checked
/// (it would publish from it what the stream skipped). With the witness's
/// stored position below the rows, the one-shot prune keeps them and says
/// why; once the position passes them, they go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_live_witness_has_not_checked_are_not_pruned() {
    init_tracing();
    let fx = Fixture::new("prunewitness").await;
    fx.admin
        .batch_execute(&format!("GRANT DELETE ON public.{} TO outbox", fx.table))
        .await
        .expect("grant delete");
    let running = Running::start(fx.config_with(PRUNE_ENV)).await;
    for n in 0..5 {
        fx.write_tx(&[("order", "a", format!(r#"{{"n":{n}}}"#))], true)
            .await;
    }
    consume(&fx.topic_prefix, 5, TIMEOUT, Duration::ZERO);
    slot_passes_rows(&fx, &running).await;
    running.stop().await.expect("graceful stop");
    tokio::time::sleep(Duration::from_millis(1500)).await; // past the retention
    let oldest: i64 = fx
        .admin
        .query_one(
            &format!("SELECT min(xmin::text::int8) FROM public.{}", fx.table),
            &[],
        )
        .await
        .expect("xmin")
        .get(0);
    let set_position = |below: u64| {
        let store = OffsetStore::open(&fx.offsets_path()).expect("store");
        let system_id = store
            .load(&fx.slot)
            .expect("load")
            .expect("offset")
            .system_id;
        let position = outbox_cdc::checkpoint::WitnessPosition {
            system_id,
            checked_below_xid: below,
            look_from_micros: 0,
        };
        store
            .save_witness_position(&fx.slot, &position)
            .expect("save");
    };
    set_position(oldest as u64);
    let before = table_ids(&fx).await;
    assert_eq!(before.len(), 5);
    let report = pipeline::prune_stored(&fx.config_with(PRUNE_ENV), &Metrics::default())
        .await
        .expect("prune");
    assert_eq!(report.rows(), 0, "{report}");
    assert!(
        report
            .witness
            .as_deref()
            .unwrap_or("")
            .contains("live witness"),
        "{report}"
    );
    assert_eq!(
        table_ids(&fx).await,
        before,
        "rows the witness has not checked were deleted"
    );
    let now: i64 = fx
        .admin
        .query_one(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8",
            &[],
        )
        .await
        .expect("xmax")
        .get(0);
    set_position(now as u64);
    let report = pipeline::prune_stored(&fx.config_with(PRUNE_ENV), &Metrics::default())
        .await
        .expect("prune");
    assert_eq!(report.rows(), 5, "{report}");
    fx.cleanup().await;
}
