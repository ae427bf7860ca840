//! No silent skip (DESIGN.md §5a): partitioned outbox tables in both
//! publication styles, a start refused before the slot is touched whenever the
//! publication is not proven to carry every outbox row, and a loud stop on a
//! relation the start-up proof did not account for (rename, a new table).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::relay::{Fixture, Record, Running, consume, read_ids, read_versus_ends, spawn_binary};
use common::{admin_client, init_tracing, kafka_log_lines};
use outbox_cdc::checkpoint::OffsetStore;
use outbox_cdc::coverage::CoverageProblem;
use outbox_cdc::outbox::MapError;
use outbox_cdc::pg::Lsn;
use outbox_cdc::pipeline::{PipelineError, RunOptions, StartRefused};

/// Replaces the fixture's plain table by a range-partitioned one with the same
/// columns (primary key including the partition key), two monthly partitions
/// for 2026-11 and 2026-12 plus one for "old" rows, and a publication created
/// the plain way (`via_root = false`) or through the root.
pub(crate) async fn partitioned_fixture(prefix: &str, via_root: bool) -> Fixture {
    let f = Fixture::new(prefix).await;
    let (t, p) = (&f.table, &f.publication);
    let via = if via_root {
        ", publish_via_partition_root = true"
    } else {
        ""
    };
    f.admin
        .batch_execute(&format!(
            "DROP PUBLICATION {p}; DROP TABLE public.{t};
             CREATE TABLE public.{t} (
                 event_id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
                 aggregate_sequence bigint NOT NULL, event_type text NOT NULL,
                 schema_version integer NOT NULL DEFAULT 1, payload jsonb NOT NULL,
                 occurred_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (event_id, occurred_at)
             ) PARTITION BY RANGE (occurred_at);
             CREATE TABLE public.{t}_old PARTITION OF public.{t} FOR VALUES FROM ('2000-01-01') TO ('2001-01-01');
             CREATE TABLE public.{t}_cur PARTITION OF public.{t} FOR VALUES FROM ('2001-01-01') TO ('2100-01-01');
             GRANT SELECT ON public.{t} TO outbox;
             CREATE PUBLICATION {p} FOR TABLE public.{t} WITH (publish = 'insert'{via});"
        ))
        .await
        .unwrap_or_else(|e| panic!("partitioned outbox {t}: {e}"));
    f
}

/// Inserts one event per aggregate in one transaction, at `occurred_at`
/// (an SQL expression), numbering each aggregate's events from `seq`.
pub(crate) async fn insert(
    client: &tokio_postgres::Client,
    table: &str,
    aggregates: &[String],
    seq: i64,
    occurred_at: &str,
) -> Vec<String> {
    client.batch_execute("BEGIN").await.expect("BEGIN");
    let mut ids = Vec::new();
    for agg in aggregates {
        let row = client
            .query_one(
                &format!(
                    "INSERT INTO public.{table} (event_id, aggregate_type, aggregate_id, aggregate_sequence, \
                     event_type, payload, occurred_at) \
                     VALUES (gen_random_uuid(), 'order', $1, $2, 'Placed', '{{\"n\": 1}}', {occurred_at}) \
                     RETURNING event_id::text"
                ),
                &[agg, &seq],
            )
            .await
            .unwrap_or_else(|e| panic!("insert into {table}: {e}"));
        ids.push(row.get(0));
    }
    client.batch_execute("COMMIT").await.expect("COMMIT");
    ids
}

/// Every written id arrived, and each aggregate's records are in one
/// partition in sequence order (by offset).
fn assert_all_in_order(records: &[Record], written: &BTreeSet<String>) {
    let seen: BTreeSet<String> = records
        .iter()
        .map(|r| r.header("event_id").to_owned())
        .collect();
    let missing: Vec<&String> = written.difference(&seen).collect();
    assert!(
        missing.is_empty(),
        "{} events lost: {missing:?}",
        missing.len()
    );
    let mut by_key: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_key.entry(r.key.as_str()).or_default().push(r);
    }
    for (key, mut recs) in by_key {
        let partitions: BTreeSet<i32> = recs.iter().map(|r| r.partition).collect();
        assert_eq!(partitions.len(), 1, "aggregate {key} split over partitions");
        recs.sort_by_key(|r| r.offset);
        let seqs: Vec<i64> = recs
            .iter()
            .map(|r| r.header("aggregate_sequence").parse().expect("sequence"))
            .collect();
        let mut dedup = seqs.clone();
        dedup.dedup();
        assert!(
            dedup.windows(2).all(|w| w[0] < w[1]),
            "aggregate {key} out of order: {seqs:?}"
        );
    }
}

/// Writers commit continuously while a partition is created, a standalone
/// table is attached, and the old partition is detached and dropped; every
/// committed row arrives, in order per aggregate, in both publication styles.
async fn partitioned_outbox_with_partition_churn(via_root: bool) {
    init_tracing();
    let f = partitioned_fixture(if via_root { "pviaroot" } else { "pleaves" }, via_root).await;
    let t = f.table.clone();
    let running = Running::start(f.config()).await;

    // A writer on its own connection, committing until told to stop.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let writer_table = t.clone();
    let writer = tokio::spawn(async move {
        let client = admin_client().await;
        let aggregates: Vec<String> = (0..4).map(|i| format!("w{i}")).collect();
        let mut ids = Vec::new();
        let mut seq = 1;
        while !*stop_rx.borrow_and_update() {
            ids.extend(insert(&client, &writer_table, &aggregates, seq, "now()").await);
            seq += 1;
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        ids
    });

    let mut written: BTreeSet<String> = BTreeSet::new();
    let old: Vec<String> = (0..3).map(|i| format!("old{i}")).collect();
    written.extend(insert(&f.admin, &t, &old, 1, "'2000-06-01'").await);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A partition created while streaming, and a table attached as one.
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{t}_2100 PARTITION OF public.{t} FOR VALUES FROM ('2100-01-01') TO ('2101-01-01');
             CREATE TABLE public.{t}_2101 (LIKE public.{t} INCLUDING DEFAULTS);
             ALTER TABLE public.{t} ATTACH PARTITION public.{t}_2101 FOR VALUES FROM ('2101-01-01') TO ('2102-01-01');"
        ))
        .await
        .expect("new partitions");
    let future: Vec<String> = (0..3).map(|i| format!("future{i}")).collect();
    written.extend(insert(&f.admin, &t, &future, 1, "'2100-03-01'").await);
    written.extend(insert(&f.admin, &t, &future, 2, "'2101-03-01'").await);
    written.extend(insert(&f.admin, &t, &old, 2, "'2000-07-01'").await);

    // Retention: the old partition goes while the writer keeps committing.
    f.admin
        .batch_execute(&format!(
            "ALTER TABLE public.{t} DETACH PARTITION public.{t}_old; DROP TABLE public.{t}_old;"
        ))
        .await
        .expect("drop the old partition");
    written.extend(insert(&f.admin, &t, &future, 3, "'2100-04-01'").await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_tx.send(true).expect("stop the writer");
    written.extend(writer.await.expect("writer"));

    let records = match read_ids(
        &f.topic_prefix,
        &written,
        Duration::from_secs(60),
        Duration::from_secs(2),
    ) {
        Ok(records) => records,
        Err(partial) => {
            let seen: BTreeSet<String> = partial
                .iter()
                .map(|r| r.header("event_id").to_owned())
                .collect();
            let missing: Vec<String> = written.difference(&seen).cloned().collect();
            let rows = f
                .admin
                .query(
                    &format!(
                        "SELECT event_id::text, tableoid::regclass::text, aggregate_id, aggregate_sequence, \
                         occurred_at::text, xmin::text FROM public.{t} WHERE event_id::text = ANY($1)"
                    ),
                    &[&missing],
                )
                .await
                .expect("describe the missing rows");
            let described: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "{} in {} ({} #{}, at {}, xid {})",
                        r.get::<_, String>(0),
                        r.get::<_, String>(1),
                        r.get::<_, String>(2),
                        r.get::<_, i64>(3),
                        r.get::<_, String>(4),
                        r.get::<_, String>(5)
                    )
                })
                .collect();
            let state = match running.stop().await {
                Ok(()) => "the connector was running and stopped cleanly".to_owned(),
                Err(e) => format!("the connector had stopped: {e}"),
            };
            panic!(
                "{} of {} records arrived within 60 s; {state}; missing: {described:?} (ids {missing:?}); {:?}; \
                 the broker's log about the topics: {:#?}",
                partial.len(),
                written.len(),
                read_versus_ends(&f.topic_prefix, &partial),
                kafka_log_lines(&f.topic_prefix, 40)
            );
        }
    };
    assert_all_in_order(&records, &written);
    assert!(
        written.len() > 20,
        "the writer committed too little: {}",
        written.len()
    );
    running.stop().await.expect("clean stop");
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_outbox_published_by_leaf_names() {
    partitioned_outbox_with_partition_churn(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_outbox_published_via_the_root() {
    partitioned_outbox_with_partition_churn(true).await;
}

/// Recognises the problem a narrowed publication must produce.
type IsProblem = fn(&CoverageProblem) -> bool;

/// The problems of a refused start (in process).
async fn refused(config: outbox_cdc::config::Config) -> Vec<CoverageProblem> {
    let running = Running::spawn(config, RunOptions::default());
    match running.finished(Duration::from_secs(30)).await {
        Err(PipelineError::NotCovered(refusal)) => refusal.problems,
        other => panic!("expected a refused start, got {other:?}"),
    }
}

async fn server_version(f: &Fixture) -> i32 {
    f.admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server_version_num")
        .get(0)
}

/// Each way a publication can fail to carry the outbox refuses the start
/// before the slot moves; rows committed before it was narrowed are published
/// once it is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_is_refused_before_the_slot_moves() {
    init_tracing();
    let f = Fixture::new("refuse").await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    // First start: creates the slot; then stop, so the slot has a position.
    let running = Running::start(f.config()).await;
    let mut written: BTreeSet<String> = BTreeSet::new();
    written.extend(
        f.write_tx(&[("order", "a", r#"{"n":0}"#.to_owned())], true)
            .await,
    );
    consume(&f.topic_prefix, 1, Duration::from_secs(30), Duration::ZERO);
    running.stop().await.expect("clean stop");
    let confirmed = f.slot_confirmed_flush().await.expect("slot exists");

    // A typo'd table name.
    let problems =
        refused(f.config_with(&format!("OUTBOX_CDC__OUTBOX__TABLE=public.{t}_typo"))).await;
    assert!(
        matches!(&problems[..], [CoverageProblem::TableMissing { similar, .. }] if similar.iter().any(|s| s.name == t)),
        "{problems:?}"
    );

    // An existing table that is not in the publication.
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{t}_other (LIKE public.{t} INCLUDING ALL)"
        ))
        .await
        .expect("other table");
    let problems =
        refused(f.config_with(&format!("OUTBOX_CDC__OUTBOX__TABLE=public.{t}_other"))).await;
    assert!(
        matches!(&problems[..], [CoverageProblem::NotPublished { .. }]),
        "{problems:?}"
    );

    let cases: [(&str, IsProblem); 3] = [
        ("SET (publish = 'update, delete')", |p| {
            matches!(p, CoverageProblem::NoInserts { .. })
        }),
        (
            "SET TABLE public.{t} WHERE (aggregate_id <> 'hidden')",
            |p| matches!(p, CoverageProblem::RowFilter { .. }),
        ),
        (
            "SET TABLE public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version)",
            |p| matches!(p, CoverageProblem::ColumnList { missing, .. } if missing.iter().any(|m| m.column == "payload")),
        ),
    ];
    // Row filters and column lists exist from PostgreSQL 15 on.
    let narrowing = if server_version(&f).await >= 150000 {
        &cases[..]
    } else {
        &cases[..1]
    };
    for (i, (alter, expected)) in narrowing.iter().enumerate() {
        // Committed while the publication still carried them (pgoutput applies
        // a publication as it was when the row was written): they must
        // arrive once the connector runs again.
        written.extend(
            f.write_tx(
                &[
                    ("order", "hidden", format!(r#"{{"case":{i}}}"#)),
                    ("order", "b", format!(r#"{{"case":{i}}}"#)),
                ],
                true,
            )
            .await,
        );
        f.admin
            .batch_execute(&format!(
                "ALTER PUBLICATION {p} {}",
                alter.replace("{t}", &t)
            ))
            .await
            .unwrap_or_else(|e| panic!("ALTER PUBLICATION {alter}: {e}"));
        let problems = refused(f.config()).await;
        assert!(
            problems.iter().any(expected),
            "ALTER PUBLICATION {alter}: {problems:?}"
        );
        f.admin
            .batch_execute(&format!(
                "ALTER PUBLICATION {p} SET TABLE public.{t}; ALTER PUBLICATION {p} SET (publish = 'insert')"
            ))
            .await
            .expect("restore the publication");
    }
    assert_eq!(
        f.slot_confirmed_flush().await.as_deref(),
        Some(confirmed.as_str()),
        "a refused start moved the slot"
    );

    // The real binary: non-zero exit, the fix on stderr.
    written.extend(
        f.write_tx(&[("order", "hidden", r#"{"n":9}"#.to_owned())], true)
            .await,
    );
    let row_filters = narrowing.len() > 1;
    let (narrow, says, fix) = if row_filters {
        (
            "SET TABLE public.{t} WHERE (aggregate_id <> 'hidden')",
            "filters",
            "fix: BEGIN; ALTER PUBLICATION",
        )
    } else {
        (
            "SET (publish = 'update, delete')",
            "does not publish inserts",
            "SET (publish = 'insert')",
        )
    };
    f.admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {p} {}",
            narrow.replace("{t}", &t)
        ))
        .await
        .expect("narrowing the publication");
    let config = f.write_config_file();
    let mut child = spawn_binary(&config);
    let status = wait_exit(&mut child, Duration::from_secs(30));
    assert!(!status.success(), "the binary started: {status:?}");
    let log = std::fs::read_to_string(config.with_file_name("connector.log")).expect("log");
    assert!(log.contains(says) && log.contains(fix), "{log}");
    assert_eq!(
        f.slot_confirmed_flush().await.as_deref(),
        Some(confirmed.as_str()),
        "the refused binary moved the slot"
    );

    // Fixed: the publication was changed while the connector was stopped,
    // so the first start that can prove it again refuses, naming the audit
    // that republishes the window (issue 47), and keeps refusing.
    f.admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {p} SET TABLE public.{t}; ALTER PUBLICATION {p} SET (publish = 'insert')"
        ))
        .await
        .expect("restore");
    // (With the live witness off: on, the start repairs the break itself,
    // it::coverage_break::the_witness_repairs_a_stored_break_at_restart.)
    for _ in 0..2 {
        let witness_off = f.config_with("OUTBOX_CDC__RECONCILE__ENABLED=false");
        let running = Running::spawn(witness_off, RunOptions::default());
        match running.finished(Duration::from_secs(30)).await {
            Err(PipelineError::Refused(refusal @ StartRefused::CoverageBroken { .. })) => {
                let text = refusal.to_string();
                assert!(
                    text.contains("outbox-cdc audit") && text.contains("--repair"),
                    "{text}"
                );
            }
            other => {
                panic!("expected a start refused for the change made while stopped, got {other:?}")
            }
        }
    }
    assert_eq!(
        f.slot_confirmed_flush().await.as_deref(),
        Some(confirmed.as_str()),
        "a refused start moved the slot"
    );
    // Nothing was written while it was narrowed here (every row was written
    // before a narrowing), so the break is cleared as a repair would: then
    // everything written during the refusals arrives from the stream.
    let cleared = OffsetStore::open(&f.offsets_path())
        .expect("offset store")
        .clear_coverage_breaks(&f.slot, i64::MIN / 2, i64::MAX / 2)
        .expect("clear");
    assert_eq!(cleared.len(), 1, "{cleared:?}");
    let running = Running::start(f.config()).await;
    let records = consume(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(30),
        Duration::from_secs(1),
    );
    assert_all_in_order(&records, &written);
    running.stop().await.expect("clean stop");
    f.admin
        .batch_execute(&format!("DROP TABLE public.{t}_other"))
        .await
        .expect("drop");
    f.cleanup().await;
}

fn wait_exit(
    child: &mut common::relay::ChildProcess,
    within: Duration,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the binary did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The outbox renamed while streaming: a stop naming the new name, nothing
/// after the rename acknowledged; with the configuration fixed, the rows
/// written after the rename are published. Then a mapped column renamed:
/// the same kind of stop, got past by configuration alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_stop_and_resume_after_the_config_is_fixed() {
    init_tracing();
    let f = Fixture::new("rename").await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    // The periodic re-proof would also stop it (the configured name is gone);
    // this test is about the stop at the renamed Relation.
    let no_reproof = "OUTBOX_CDC__MONITOR__SLOT_POLL_INTERVAL_MS=600000";
    let running = Running::start(f.config_with(no_reproof)).await;
    let mut written: BTreeSet<String> = BTreeSet::new();
    written.extend(
        f.write_tx(&[("order", "a", r#"{"n":1}"#.to_owned())], true)
            .await,
    );
    consume(&f.topic_prefix, 1, Duration::from_secs(30), Duration::ZERO);

    f.admin
        .batch_execute(&format!("ALTER TABLE public.{t} RENAME TO {t}_v2"))
        .await
        .expect("rename");
    let after_rename = insert(&f.admin, &format!("{t}_v2"), &["a".to_owned()], 2, "now()").await;
    match running.finished(Duration::from_secs(30)).await {
        Err(PipelineError::Unaccounted(u)) => {
            assert_eq!(u.relation.name, format!("{t}_v2"), "{u}");
            assert!(
                u.fix.contains(&format!("outbox.table = \"public.{t}_v2\"")),
                "{u}"
            );
        }
        other => panic!("expected a stop on the renamed outbox, got {other:?}"),
    }
    let records = consume(
        &f.topic_prefix,
        1,
        Duration::from_secs(10),
        Duration::from_secs(2),
    );
    assert_eq!(records.len(), 1, "published past the rename: {records:?}");

    // Fixed configuration: the row written after the rename arrives.
    let renamed = format!("OUTBOX_CDC__OUTBOX__TABLE=public.{t}_v2");
    let running = Running::start(f.config_with(&format!("{renamed} {no_reproof}"))).await;
    written.extend(after_rename);
    let records = consume(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(30),
        Duration::from_secs(1),
    );
    assert_all_in_order(&records, &written);

    // A mapped column renamed mid-stream.
    f.admin
        .batch_execute(&format!(
            "ALTER TABLE public.{t}_v2 RENAME COLUMN payload TO body"
        ))
        .await
        .expect("rename column");
    f.admin
        .batch_execute(&format!(
            "INSERT INTO public.{t}_v2 (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, body) \
             VALUES (gen_random_uuid(), 'order', 'a', 3, 'Placed', '{{\"n\": 3}}')"
        ))
        .await
        .expect("insert after the column rename");
    match running.finished(Duration::from_secs(30)).await {
        Err(PipelineError::Mapping {
            source: MapError::MissingColumn { column, .. },
            ..
        }) => assert_eq!(column, "payload"),
        other => panic!("expected a stop on the missing column, got {other:?}"),
    }
    let text = f
        .config_text()
        .replace("[outbox]\n", "[outbox]\ncolumns.payload = \"body\"\n");
    let (key, value) = renamed.split_once('=').expect("key=value");
    let config = outbox_cdc::config::Config::from_sources(
        "fixed.toml",
        &text,
        vec![(key.to_owned(), value.to_owned())],
    )
    .expect("fixed config");
    let running = Running::start(config).await;
    let records = consume(
        &f.topic_prefix,
        written.len() + 1,
        Duration::from_secs(30),
        Duration::from_secs(1),
    );
    assert!(
        records
            .iter()
            .any(|r| r.header("aggregate_sequence") == "3"),
        "the row after the column rename was not published: {records:?}"
    );
    running.stop().await.expect("clean stop");
    f.admin
        .batch_execute(&format!(
            "DROP PUBLICATION IF EXISTS {p}; DROP TABLE IF EXISTS public.{t}_v2"
        ))
        .await
        .expect("drop");
    f.cleanup().await;
}

/// A table added to the publication while streaming: one shaped like the
/// outbox stops the connector (it cannot be told from a detached partition);
/// one without the outbox's columns is positively another table and skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_added_to_the_publication_while_streaming() {
    init_tracing();
    let f = Fixture::new("added").await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{t}_audit (id bigint, what text);
             CREATE TABLE public.{t}_shadow (LIKE public.{t} INCLUDING ALL);"
        ))
        .await
        .expect("extra tables");
    let running = Running::start(f.config()).await;
    f.admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {p} ADD TABLE public.{t}_audit;
             INSERT INTO public.{t}_audit VALUES (1, 'x');"
        ))
        .await
        .expect("audit table");
    let mut written: BTreeSet<String> = BTreeSet::new();
    written.extend(
        f.write_tx(&[("order", "a", r#"{"n":1}"#.to_owned())], true)
            .await,
    );
    consume(&f.topic_prefix, 1, Duration::from_secs(30), Duration::ZERO);

    f.admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {p} ADD TABLE public.{t}_shadow;"
        ))
        .await
        .expect("shadow table");
    insert(
        &f.admin,
        &format!("{t}_shadow"),
        &["s".to_owned()],
        1,
        "now()",
    )
    .await;
    match running.finished(Duration::from_secs(30)).await {
        Err(PipelineError::Unaccounted(u)) => {
            assert_eq!(u.relation.name, format!("{t}_shadow"), "{u}")
        }
        other => panic!("expected a stop on the outbox-shaped table, got {other:?}"),
    }
    f.admin
        .batch_execute(&format!(
            "DROP PUBLICATION {p}; DROP TABLE public.{t}_audit, public.{t}_shadow;"
        ))
        .await
        .expect("drop");
    f.cleanup().await;
}

/// A connector re-proving coverage every 3 s, streaming and past its first row.
pub(crate) async fn streaming_with_slow_proofs(f: &Fixture) -> Running {
    let running =
        Running::start(f.config_with("OUTBOX_CDC__MONITOR__SLOT_POLL_INTERVAL_MS=3000")).await;
    f.write_tx(&[("order", "a", r#"{"n":1}"#.to_owned())], true)
        .await;
    consume(&f.topic_prefix, 1, Duration::from_secs(30), Duration::ZERO);
    running
}

/// Neither the stored offset nor the slot's confirmed position passed `lsn`
/// (where `what` happened).
pub(crate) async fn assert_not_acknowledged_past(f: &Fixture, lsn: Lsn, what: &str) {
    let stored = OffsetStore::open(&f.offsets_path())
        .expect("offset store")
        .load(&f.slot)
        .expect("load")
        .expect("an offset")
        .lsn;
    let confirmed: Lsn = f
        .slot_confirmed_flush()
        .await
        .expect("slot")
        .parse()
        .expect("lsn");
    assert!(
        stored <= lsn && confirmed <= lsn,
        "acknowledged past {what} at {lsn}: stored {stored}, slot confirmed {confirmed}"
    );
}

/// A publication narrowed while streaming (here: a row filter): PostgreSQL
/// silently stops sending the filtered rows from then on, so the connector
/// re-proves coverage periodically and stops loudly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_narrowed_while_streaming_stops_the_connector() {
    init_tracing();
    let f = Fixture::new("narrowed").await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    let running = streaming_with_slow_proofs(&f).await;
    // Row filters exist from PostgreSQL 15 on; before, inserts stop being published.
    let row_filter = server_version(&f).await >= 150000;
    let narrow = if row_filter {
        format!("ALTER PUBLICATION {p} SET TABLE public.{t} WHERE (aggregate_id <> 'hidden')")
    } else {
        format!("ALTER PUBLICATION {p} SET (publish = 'update, delete')")
    };
    f.admin.batch_execute(&narrow).await.expect(&narrow);
    let narrowed = f.wal_insert_lsn().await;
    // A row the narrowed publication hides, then rows it still sends (with a
    // row filter) until the connector stops: their deliveries must not
    // acknowledge past the hidden one.
    f.write_tx(&[("order", "hidden", r#"{"n":2}"#.to_owned())], true)
        .await;
    let mut n = 3;
    while !running.is_finished() && n < 400 {
        f.write_tx(&[("order", "a", format!(r#"{{"n":{n}}}"#))], true)
            .await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match running.finished(Duration::from_secs(30)).await {
        Err(PipelineError::CoverageLost(lost)) => assert!(
            if row_filter {
                matches!(&lost.problems[..], [CoverageProblem::RowFilter { .. }])
            } else {
                matches!(&lost.problems[..], [CoverageProblem::NoInserts { .. }])
            },
            "{lost}"
        ),
        other => panic!("expected a stop on the narrowed publication, got {other:?}"),
    }
    assert_not_acknowledged_past(&f, narrowed, "the narrowing").await;
    f.cleanup().await;
}

/// Audit F2: a table that the publication carries on its own when the
/// connector starts (listed explicitly here; FOR ALL TABLES without
/// publish_via_partition_root, Debezium's default publication, does the same),
/// with the outbox's columns, is attached as a partition of the outbox while
/// the connector streams. Its rows from then on are outbox rows: they must be
/// published, not skipped as "another table" known from start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_table_attached_as_a_partition_while_streaming_is_the_outbox() {
    init_tracing();
    let f = partitioned_fixture("attachpub", false).await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{t}_next (LIKE public.{t} INCLUDING ALL);
             ALTER PUBLICATION {p} ADD TABLE public.{t}_next;"
        ))
        .await
        .expect("a standalone outbox-shaped table in the publication");
    let running = Running::start(f.config()).await;

    // Written while it is standalone: not an outbox row. The outbox row after
    // it arriving shows the stream has passed it.
    insert(
        &f.admin,
        &format!("{t}_next"),
        &["standalone".into()],
        1,
        "'2150-01-01'",
    )
    .await;
    let before: BTreeSet<String> = insert(&f.admin, &t, &["a".into()], 1, "now()")
        .await
        .into_iter()
        .collect();
    read_ids(
        &f.topic_prefix,
        &before,
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .unwrap_or_else(|got| panic!("the first outbox row did not arrive ({} read)", got.len()));

    f.admin
        .batch_execute(&format!(
            "ALTER TABLE public.{t} ATTACH PARTITION public.{t}_next \
             FOR VALUES FROM ('2100-01-01') TO ('2200-01-01')"
        ))
        .await
        .expect("attach");
    // Routed to the attached leaf, sent under its name.
    let attached: BTreeSet<String> = insert(&f.admin, &t, &["b".into()], 1, "'2150-01-01'")
        .await
        .into_iter()
        .collect();
    let after: BTreeSet<String> = insert(&f.admin, &t, &["a".into()], 2, "now()")
        .await
        .into_iter()
        .collect();
    let all: BTreeSet<String> = before
        .iter()
        .chain(&attached)
        .chain(&after)
        .cloned()
        .collect();
    let records = read_ids(
        &f.topic_prefix,
        &all,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .unwrap_or_else(|got| {
        let seen: BTreeSet<&str> = got.iter().map(|r| r.header("event_id")).collect();
        let lost: Vec<&String> = all
            .iter()
            .filter(|id| !seen.contains(id.as_str()))
            .collect();
        panic!("rows of the attached partition were skipped: {lost:?}")
    });
    assert!(
        records.iter().all(|r| r.key != "standalone"),
        "a row written before the attach is not an outbox row"
    );
    assert!(!running.is_finished(), "the connector streams on");
    running.stop().await.expect("graceful stop");
    f.admin
        .batch_execute(&format!("DROP PUBLICATION {p}"))
        .await
        .expect("drop publication");
    f.cleanup().await;
}

/// The outbox dropped from the publication, one row committed, the outbox
/// added again: PostgreSQL never sends that row. Returns the WAL position
/// before the change and the row's event id.
pub(crate) async fn hide_one_row(f: &Fixture) -> (Lsn, BTreeSet<String>) {
    let (t, p) = (&f.table, &f.publication);
    let narrowed = f.wal_insert_lsn().await;
    f.admin
        .batch_execute(&format!("ALTER PUBLICATION {p} DROP TABLE public.{t}"))
        .await
        .expect("drop the outbox from the publication");
    let hidden = f
        .write_tx(&[("order", "hidden", r#"{"n":2}"#.to_owned())], true)
        .await
        .into_iter()
        .collect();
    f.admin
        .batch_execute(&format!("ALTER PUBLICATION {p} ADD TABLE public.{t}"))
        .await
        .expect("add it again");
    (narrowed, hidden)
}

/// Audit F1: the outbox dropped from the publication, a row committed, the
/// outbox added again, all between two coverage proofs. Both proofs see a
/// complete publication now, but PostgreSQL never sends the row committed in
/// between: the connector must notice the catalog rows changed and stop
/// before acknowledging past the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_narrowing_undone_between_two_proofs_stops_the_connector() {
    init_tracing();
    let f = Fixture::new("narrowundone").await;
    let running = streaming_with_slow_proofs(&f).await;
    let (narrowed, hidden) = hide_one_row(&f).await;
    // Rows the publication sends again, for three proof intervals at most.
    let mut n = 3;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !running.is_finished() && std::time::Instant::now() < until {
        f.write_tx(&[("order", "a", format!(r#"{{"n":{n}}}"#))], true)
            .await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match running.finished(Duration::from_secs(30)).await {
        Err(PipelineError::CoverageLost(lost)) => assert!(
            matches!(
                &lost.problems[..],
                [CoverageProblem::PublicationChanged { .. }]
            ),
            "{lost}"
        ),
        other => panic!(
            "expected a stop on the changed publication (row {hidden:?} was never sent), got {other:?}"
        ),
    }
    assert_not_acknowledged_past(&f, narrowed, "the change").await;
    f.cleanup().await;
}
