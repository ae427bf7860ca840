//! Coverage breaks (issue 47, review coverage-health-security C1-C6) against
//! the real servers: leaves published through the root are the outbox, a
//! partition whose inserts never reach WAL is refused, a publication change
//! is remembered across restarts until `audit --repair` republishes its
//! window, new and dropped partitions of a leaf-list publication, and a
//! closed catalog connection that must not freeze acknowledgement.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::relay::{Fixture, Running, log_of, read_ids, spawn_binary_with};
use common::{init_tracing, pg_url};
use outbox_cdc::config::Config;
use outbox_cdc::coverage::CoverageProblem;
use outbox_cdc::pg::Lsn;
use outbox_cdc::pipeline::{PipelineError, RunOptions, StartRefused};

use super::no_silent_skip::{
    assert_not_acknowledged_past, hide_one_row, insert, partitioned_fixture,
    streaming_with_slow_proofs,
};

/// Calls `write` with `first`, `first + 1`, ..., `pause` apart, until the
/// connector stops (10 s at most).
async fn write_until_stopped(
    running: &Running,
    first: i64,
    pause: Duration,
    mut write: impl AsyncFnMut(i64),
) {
    let until = Instant::now() + Duration::from_secs(10);
    let mut n = first;
    while !running.is_finished() && Instant::now() < until {
        write(n).await;
        n += 1;
        tokio::time::sleep(pause).await;
    }
}

/// [`partitioned_fixture`] whose publication lists the two leaves instead of
/// the root: `FOR TABLE <t>_old, <t>_cur`.
async fn leaf_list_fixture(prefix: &str, via_root: bool) -> Fixture {
    let f = partitioned_fixture(prefix, false).await;
    let (t, p) = (&f.table, &f.publication);
    let via = if via_root {
        ", publish_via_partition_root = true"
    } else {
        ""
    };
    f.admin
        .batch_execute(&format!(
            "DROP PUBLICATION {p};
             CREATE PUBLICATION {p} FOR TABLE public.{t}_old, public.{t}_cur WITH (publish = 'insert'{via});"
        ))
        .await
        .unwrap_or_else(|e| panic!("leaf-list publication {p}: {e}"));
    f
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// Waits (bounded) for the pipeline to end by itself and returns its result;
/// panics, after stopping it, when it still runs after `within`.
async fn ends_within(running: Running, within: Duration, what: &str) -> Result<(), PipelineError> {
    let deadline = Instant::now() + within;
    while !running.is_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !running.is_finished() {
        let stopped = running.stop().await;
        panic!(
            "{what}: the connector still ran after {within:?} (then stopped on request: {stopped:?})"
        );
    }
    running.finished(Duration::from_secs(5)).await
}

/// The live witness off: the refusals below are what a start gives without
/// it (with it, the start repairs a stored break itself:
/// `the_witness_repairs_a_stored_break_at_restart`).
const WITNESS_OFF: &str = "OUTBOX_CDC__RECONCILE__ENABLED=false";

/// Starts the connector and returns the error it must refuse with; panics
/// when it starts streaming instead (checked for 30 s).
async fn start_refused(config: Config, what: &str) -> PipelineError {
    let running = Running::spawn(config, RunOptions::default());
    match ends_within(running, Duration::from_secs(30), what).await {
        Ok(()) => panic!("{what}: the connector returned Ok instead of refusing to start"),
        Err(e) => e,
    }
}

/// Keeps running for `period` (checked every 100 ms); panics with the
/// connector's error if it stops.
async fn keeps_running(running: Running, period: Duration, what: &str) -> Running {
    let deadline = Instant::now() + period;
    while Instant::now() < deadline {
        if running.is_finished() {
            let ended = running.finished(Duration::from_secs(5)).await;
            panic!("{what}: the connector stopped: {ended:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running
}

/// Reads every id of `ids` within 30 s; panics naming the missing ones.
fn arrive(f: &Fixture, ids: &BTreeSet<String>, what: &str) {
    if let Err(got) = read_ids(
        &f.topic_prefix,
        ids,
        Duration::from_secs(30),
        Duration::ZERO,
    ) {
        let seen: BTreeSet<&str> = got.iter().map(|r| r.header("event_id")).collect();
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| !seen.contains(id.as_str()))
            .collect();
        panic!(
            "{what}: {} of {} rows never reached Kafka within 30 s (first missing: {:?})",
            missing.len(),
            ids.len(),
            &missing[..missing.len().min(3)]
        );
    }
}

/// C1 (a): the publication lists the leaves, not the root, with
/// `publish_via_partition_root = true`. pgoutput sends each leaf under its
/// own name (no ancestor is published): those rows are the outbox, every
/// one is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaves_listed_with_publish_via_root_are_all_published() {
    init_tracing();
    let f = leaf_list_fixture("cbleafvia", true).await;
    let t = f.table.clone();
    // `check` tells how the leaves arrive: under their own names (no
    // ancestor is published), not "via the root".
    let report = outbox_cdc::check::render(&outbox_cdc::check::run(&f.config()).await);
    assert!(
        report.contains("are published under their own names"),
        "{report}"
    );
    let running = Running::start(f.config()).await;
    let mut written: BTreeSet<String> = BTreeSet::new();
    written.extend(insert(&f.admin, &t, &names("cur", 50), 1, "now()").await);
    written.extend(insert(&f.admin, &t, &names("old", 50), 1, "'2000-06-01'").await);
    assert_eq!(written.len(), 100);
    arrive(
        &f,
        &written,
        "leaves listed with publish_via_partition_root = true (skipped as another table?)",
    );
    let running = keeps_running(running, Duration::ZERO, "after the leaves' rows").await;
    running.stop().await.expect("graceful stop");
    f.cleanup().await;
}

/// C3, benign: a partition created and added to a leaf-list publication,
/// empty at the next proofs, then written to: its rows are published and
/// the connector keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_added_to_a_leaf_list_before_its_first_row_streams_on() {
    init_tracing();
    let f = leaf_list_fixture("cbnextok", false).await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    let running = streaming_with_slow_proofs(&f).await;
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{t}_next PARTITION OF public.{t} FOR VALUES FROM ('2100-01-01') TO ('2101-01-01')"
        ))
        .await
        .expect("create the next partition");
    f.admin
        .batch_execute(&format!("ALTER PUBLICATION {p} ADD TABLE public.{t}_next"))
        .await
        .expect("add the next partition to the publication");
    // Two proof intervals and more: proofs see it published and empty.
    let running = keeps_running(
        running,
        Duration::from_millis(7_000),
        "an empty partition added to the leaf-list publication",
    )
    .await;
    let mut written: BTreeSet<String> = BTreeSet::new();
    written.extend(insert(&f.admin, &t, &names("next", 5), 1, "'2100-06-01'").await);
    written.extend(insert(&f.admin, &t, &names("cur", 5), 1, "now()").await);
    arrive(
        &f,
        &written,
        "rows of the partition added before its first row",
    );
    let running = keeps_running(
        running,
        Duration::from_millis(4_000),
        "after rows in the added partition",
    )
    .await;
    running.stop().await.expect("graceful stop");
    f.cleanup().await;
}

/// C3, the other order: a table holding rows (written while standalone, so
/// not outbox rows) is added to a leaf-list publication and then attached as
/// a partition. Its entry is older than its attachment: nothing written to it
/// as a partition went unsent, so the connector streams on, and rows routed
/// to it arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_published_before_it_was_attached_streams_on() {
    init_tracing();
    let f = leaf_list_fixture("cbpubfirst", false).await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{t}_next (LIKE public.{t} INCLUDING ALL)"
        ))
        .await
        .expect("a standalone outbox-shaped table");
    // Written while standalone and unpublished: never an outbox row.
    insert(
        &f.admin,
        &format!("{t}_next"),
        &["standalone".into()],
        1,
        "'2150-01-01'",
    )
    .await;
    let running = streaming_with_slow_proofs(&f).await;
    f.admin
        .batch_execute(&format!("ALTER PUBLICATION {p} ADD TABLE public.{t}_next"))
        .await
        .expect("publish it");
    f.admin
        .batch_execute(&format!(
            "ALTER TABLE public.{t} ATTACH PARTITION public.{t}_next \
             FOR VALUES FROM ('2100-01-01') TO ('2200-01-01')"
        ))
        .await
        .expect("attach it");
    let running = keeps_running(
        running,
        Duration::from_millis(7_000),
        "a partition published before it was attached",
    )
    .await;
    let routed: BTreeSet<String> = insert(&f.admin, &t, &names("next", 3), 1, "'2150-06-01'")
        .await
        .into_iter()
        .collect();
    arrive(
        &f,
        &routed,
        "rows routed to the partition published before its attach",
    );
    let running = keeps_running(running, Duration::from_millis(4_000), "after its rows").await;
    running.stop().await.expect("graceful stop");
    f.cleanup().await;
}

/// C5: a leaf-list publication; an expired partition whose rows were all
/// published is dropped (as `[prune]` or a DBA does). Nothing was lost: the
/// connector keeps running and later rows arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_published_partition_of_a_leaf_list_streams_on() {
    init_tracing();
    let f = leaf_list_fixture("cbdropleaf", false).await;
    let t = f.table.clone();
    let running = streaming_with_slow_proofs(&f).await;
    let old: BTreeSet<String> = insert(&f.admin, &t, &names("old", 3), 1, "'2000-06-01'")
        .await
        .into_iter()
        .collect();
    arrive(&f, &old, "rows of the old partition before its drop");
    f.admin
        .batch_execute(&format!("DROP TABLE public.{t}_old"))
        .await
        .expect("drop the old partition");
    let running = keeps_running(
        running,
        Duration::from_millis(7_000),
        "the old, fully published partition dropped from a leaf-list publication",
    )
    .await;
    let later: BTreeSet<String> = insert(&f.admin, &t, &names("cur", 3), 1, "now()")
        .await
        .into_iter()
        .collect();
    arrive(&f, &later, "rows after the drop of the old partition");
    let running = keeps_running(running, Duration::from_millis(500), "after the later rows").await;
    running.stop().await.expect("graceful stop");
    f.cleanup().await;
}

/// C6: the connector's SQL (catalog) backend is terminated while its
/// walsender survives. Acknowledgement must not freeze: within 15 s the
/// slot's confirmed position passes rows committed after the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_catalog_connection_does_not_freeze_acknowledgement() {
    init_tracing();
    let f = Fixture::new("cbcatalog").await;
    // The fixture sets no application_name: give this connector's SQL
    // connections one of their own, so that only they are terminated.
    let app = format!("oc_{}", f.name);
    let url = pg_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let config = f.config_with(&format!(
        "OUTBOX_CDC__MONITOR__SLOT_POLL_INTERVAL_MS=500 OUTBOX_CDC__POSTGRES__URL={url}{sep}application_name={app}"
    ));
    let running = Running::start(config).await;
    let first: BTreeSet<String> = f
        .write_tx(&[("order", "a", r#"{"n":1}"#.to_owned())], true)
        .await
        .into_iter()
        .collect();
    arrive(&f, &first, "the first row");

    let terminated = f
        .admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            &[&app],
        )
        .await
        .expect("terminate the connector's SQL backends");
    assert!(
        !terminated.is_empty(),
        "no client backend with application_name {app}: the test did not hit the catalog connection"
    );

    let mut ids: BTreeSet<String> = BTreeSet::new();
    let mut committed = Lsn::new(0);
    for n in 2..7 {
        let (written, end) = f
            .write_tx_ended_by(&[("order", "a", format!(r#"{{"n":{n}}}"#))])
            .await;
        ids.extend(written);
        committed = end;
    }
    arrive(&f, &ids, "rows after the catalog connection was terminated");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let confirmed = f.confirmed_lsn().await;
        if confirmed >= committed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "acknowledgement froze after the catalog connection was terminated: slot confirmed {confirmed} \
             stays below {committed} (rows committed after the kill) for 15 s; connector finished: {}",
            running.is_finished()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let running = keeps_running(running, Duration::ZERO, "after the catalog kill").await;
    running.stop().await.expect("graceful stop");
    f.cleanup().await;
}

/// C3: a leaf-list publication; a new partition is created, a row lands in
/// it, and only then is it added to the publication. pgoutput never sends
/// that row: the connector must stop (the partition's publication entry is
/// newer than the partition) and not acknowledge past the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_written_before_it_joined_a_leaf_list_stops_the_connector() {
    init_tracing();
    let f = leaf_list_fixture("cbnextlost", false).await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    let running = streaming_with_slow_proofs(&f).await;
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{t}_next PARTITION OF public.{t} FOR VALUES FROM ('2100-01-01') TO ('2101-01-01')"
        ))
        .await
        .expect("create the next partition");
    let before_row = f.wal_insert_lsn().await;
    let lost = insert(&f.admin, &t, &["early".to_owned()], 1, "'2100-06-01'").await;
    f.admin
        .batch_execute(&format!("ALTER PUBLICATION {p} ADD TABLE public.{t}_next"))
        .await
        .expect("add the next partition to the publication");
    // Rows the publication sends, for three proof intervals at most.
    write_until_stopped(&running, 2, Duration::from_millis(50), async |n| {
        f.write_tx(&[("order", "a", format!(r#"{{"n":{n}}}"#))], true)
            .await;
    })
    .await;
    let what = format!("row {lost:?} written to a partition before it joined the publication");
    match ends_within(running, Duration::from_secs(20), &what).await {
        // NotPublished: a proof fell between the insert and the ADD (also right).
        Err(PipelineError::CoverageLost(lost)) => {
            let next = format!("{t}_next");
            assert!(
                lost.problems.iter().any(|p| match p {
                    CoverageProblem::PublicationChanged { changed, .. } => changed.contains(&next),
                    CoverageProblem::NotPublished { missing_leaves, .. } =>
                        missing_leaves.iter().any(|l| l.name == next),
                    _ => false,
                }),
                "{what}: stopped without naming {next}: {lost}"
            )
        }
        other => panic!("{what}: expected CoverageLost(PublicationChanged), got {other:?}"),
    }
    assert_not_acknowledged_past(&f, before_row, "the row in the late-added partition").await;
    f.cleanup().await;
}

/// Streams with re-proofs every 3 s, hides one row from the stream
/// ([`hide_one_row`]) and writes on until the connector stops (10 s at
/// most); returns where the change began, the hidden row, what it is (for
/// messages) and how the connector ended.
async fn stopped_on_a_hidden_row(
    f: &Fixture,
) -> (Lsn, BTreeSet<String>, String, Result<(), PipelineError>) {
    let running = streaming_with_slow_proofs(f).await;
    let (narrowed, hidden) = hide_one_row(f).await;
    write_until_stopped(&running, 3, Duration::from_millis(50), async |n| {
        f.write_tx(&[("order", "a", format!(r#"{{"n":{n}}}"#))], true)
            .await;
    })
    .await;
    let what = format!("row {hidden:?} committed while the outbox was out of the publication");
    let ended = ends_within(running, Duration::from_secs(20), &what).await;
    (narrowed, hidden, what, ended)
}

/// The break a start must refuse with: its window (`since`, `until`), after
/// checking that it names this slot and the exact repair command.
fn coverage_broken(err: PipelineError, slot: &str, what: &str) -> (String, String) {
    match err {
        PipelineError::Refused(refusal @ StartRefused::CoverageBroken { .. }) => {
            let text = refusal.to_string();
            let StartRefused::CoverageBroken {
                slot: broken_slot,
                since,
                until,
                ..
            } = refusal
            else {
                unreachable!()
            };
            assert_eq!(
                broken_slot, slot,
                "{what}: the refusal names another slot: {text}"
            );
            assert!(
                text.contains("outbox-cdc audit --config"),
                "{what}: the refusal does not name the audit command: {text}"
            );
            let window = format!("--since '{since}' --until '{until}' --repair");
            assert!(
                text.contains(&window),
                "{what}: the refusal does not give the exact window `{window}`: {text}"
            );
            (since, until)
        }
        other => panic!("{what}: expected Refused(CoverageBroken), got {other:?}"),
    }
}

/// Runs the built binary's `audit --repair` over a break's window; it must
/// exit 0.
fn audit_repair(f: &Fixture, since: &str, until: &str) {
    let config = f.write_config_file();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["audit", "--config"])
        .arg(&config)
        .args(["--since", since, "--until", until, "--repair"])
        .output()
        .expect("run outbox-cdc audit --repair");
    assert!(
        output.status.success(),
        "outbox-cdc audit --since '{since}' --until '{until}' --repair exited {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// After a repair the break is cleared: the connector starts, streams, and a
/// new row arrives.
async fn streams_again(f: &Fixture, what: &str) {
    let running = Running::start(f.config()).await;
    let next: BTreeSet<String> = insert(&f.admin, &f.table, &["next".to_owned()], 1, "now()")
        .await
        .into_iter()
        .collect();
    arrive(f, &next, what);
    let running = keeps_running(running, Duration::ZERO, what).await;
    running.stop().await.expect("graceful stop");
}

/// Whether `problems` has a NotInWal naming partition `name`.
fn names_not_in_wal(problems: &[CoverageProblem], name: &str) -> bool {
    problems
        .iter()
        .any(|p| matches!(p, CoverageProblem::NotInWal { table, .. } if table.schema == "public" && table.name == name))
}

/// C4 at start: an UNLOGGED partition of an outbox published through its
/// root. Its inserts never reach WAL, so the start is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlogged_partition_refuses_the_start() {
    init_tracing();
    let f = partitioned_fixture("cbunlogstart", true).await;
    let t = f.table.clone();
    f.admin
        .batch_execute(&format!(
            "CREATE UNLOGGED TABLE public.{t}_bulk PARTITION OF public.{t} FOR VALUES FROM ('2100-01-01') TO ('2101-01-01')"
        ))
        .await
        .expect("an unlogged partition");
    let what = "an UNLOGGED partition at start";
    match start_refused(f.config_with(WITNESS_OFF), what).await {
        PipelineError::NotCovered(nc) => assert!(
            names_not_in_wal(&nc.problems, &format!("{t}_bulk")),
            "{what}: refused without NotInWal naming {t}_bulk: {nc}"
        ),
        other => panic!("{what}: expected NotCovered(NotInWal), got {other:?}"),
    }
    f.cleanup().await;
}

/// C4 while streaming: the receiving partition is made UNLOGGED (a bulk
/// load). The next proof stops the connector naming it, and nothing past the
/// first row written to it is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_made_unlogged_while_streaming_stops_the_connector() {
    init_tracing();
    let f = partitioned_fixture("cbunlogrun", false).await;
    let t = f.table.clone();
    let running = streaming_with_slow_proofs(&f).await;
    f.admin
        .batch_execute(&format!("ALTER TABLE public.{t}_cur SET UNLOGGED"))
        .await
        .expect("make the receiving partition unlogged");
    let unlogged = f.wal_insert_lsn().await;
    let hidden = insert(&f.admin, &t, &names("bulk", 3), 1, "now()").await;
    // Logged rows (the old partition) keep the stream moving until it stops.
    write_until_stopped(&running, 2, Duration::from_millis(50), async |n| {
        insert(&f.admin, &t, &["old".to_owned()], n, "'2000-06-01'").await;
    })
    .await;
    let what = format!("rows {hidden:?} written to a partition made UNLOGGED");
    match ends_within(running, Duration::from_secs(20), &what).await {
        Err(PipelineError::CoverageLost(nc)) => assert!(
            names_not_in_wal(&nc.problems, &format!("{t}_cur")),
            "{what}: stopped without NotInWal naming {t}_cur: {nc}"
        ),
        other => panic!("{what}: expected CoverageLost(NotInWal), got {other:?}"),
    }
    assert_not_acknowledged_past(&f, unlogged, "the first row in the unlogged partition").await;

    // The fix the refusal gives, then a plain restart: the rows written
    // while it was unlogged are still unpublished, so the start refuses
    // until `audit --repair` has published them.
    f.admin
        .batch_execute(&format!("ALTER TABLE public.{t}_cur SET LOGGED"))
        .await
        .expect("make the partition logged again");
    let what = "restart after the unlogged partition was made logged again";
    let (since, until) = coverage_broken(
        start_refused(f.config_with(WITNESS_OFF), what).await,
        &f.slot,
        what,
    );
    audit_repair(&f, &since, &until);
    arrive(
        &f,
        &hidden.iter().cloned().collect(),
        "rows written while unlogged, after audit --repair",
    );
    streams_again(&f, "the start after the repair").await;
    f.cleanup().await;
}

/// C2: the outbox dropped from the publication, a row X committed, the
/// outbox added again, between two proofs. The connector stops (as before)
/// and remembers it: a plain restart refuses naming the window and the
/// repair command; `audit --repair` over that window publishes X and clears
/// the break, and the next start streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_change_seen_while_streaming_is_refused_until_repaired() {
    init_tracing();
    let f = Fixture::new("cbchanged").await;
    let (narrowed, hidden, what, ended) = stopped_on_a_hidden_row(&f).await;
    match ended {
        Err(PipelineError::CoverageLost(lost)) => assert!(
            lost.problems
                .iter()
                .any(|p| matches!(p, CoverageProblem::PublicationChanged { .. })),
            "{what}: {lost}"
        ),
        other => panic!("{what}: expected CoverageLost(PublicationChanged), got {other:?}"),
    }
    assert_not_acknowledged_past(&f, narrowed, "the change").await;

    // A plain restart (a supervisor's) refuses, and again the next time.
    let mut windows = Vec::new();
    for attempt in ["first", "second"] {
        let what = format!("{attempt} restart after the break");
        windows.push(coverage_broken(
            start_refused(f.config_with(WITNESS_OFF), &what).await,
            &f.slot,
            &what,
        ));
    }
    assert_not_acknowledged_past(&f, narrowed, "the change (after the refused restarts)").await;
    let (since, until) = windows.pop().expect("two refusals");
    // The binary, as a supervisor restarts it: exit 1, the command in its log.
    let config = f.write_config_file();
    let mut child = spawn_binary_with(&config, &[("OUTBOX_CDC__RECONCILE__ENABLED", "false")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the binary did not refuse within 30 s after the break: {}",
            log_of(&config)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = log_of(&config);
    assert!(
        !status.success() && log.contains(&format!("--since '{since}' --until '{until}' --repair")),
        "the binary after the break: {status}, log:\n{log}"
    );
    audit_repair(&f, &since, &until);
    arrive(&f, &hidden, "the hidden row after audit --repair");
    streams_again(&f, "the start after the repair").await;
    f.cleanup().await;
}

/// C1 (b) / C2 while stopped: `publish_via_partition_root` flipped from false
/// to true while the connector was stopped, with rows before and after the
/// flip. pgoutput sends the row before the flip under its leaf's name: the
/// start refuses (it cannot prove the backlog), `audit --repair` over the
/// window publishes every row, and the next start streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_via_root_flip_while_stopped_is_refused_until_repaired() {
    init_tracing();
    let f = partitioned_fixture("cbflipstop", false).await;
    let (t, p) = (f.table.clone(), f.publication.clone());
    let running = Running::start(f.config()).await;
    let a = insert(&f.admin, &t, &["a".to_owned()], 1, "now()").await;
    arrive(&f, &a.iter().cloned().collect(), "row A before the stop");
    running.stop().await.expect("graceful stop");
    let stopped = f.wal_insert_lsn().await;

    let b = insert(&f.admin, &t, &["b".to_owned()], 1, "now()").await;
    f.admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {p} SET (publish_via_partition_root = true)"
        ))
        .await
        .expect("flip publish_via_partition_root");
    let c = insert(&f.admin, &t, &["c".to_owned()], 1, "now()").await;

    let what = format!("publish_via_partition_root flipped while stopped (row B {b:?} before it)");
    let err = start_refused(f.config_with(WITNESS_OFF), &what).await;
    let (since, until) = coverage_broken(err, &f.slot, &what);
    assert_not_acknowledged_past(&f, stopped, "the rows written while stopped").await;
    audit_repair(&f, &since, &until);
    let all: BTreeSet<String> = a.into_iter().chain(b).chain(c).collect();
    arrive(&f, &all, "rows A, B, C after audit --repair");
    streams_again(&f, "the start after the repair").await;
    f.cleanup().await;
}

/// No re-proof within these tests (the session's end must catch the change).
const NO_REPROOF: &str = "OUTBOX_CDC__MONITOR__SLOT_POLL_INTERVAL_MS=600000";

/// Streaming with no periodic re-proof, past a first row; then the outbox is
/// dropped from the publication, a row X committed and the outbox added
/// again. Returns the connector, X's id and the position before the change.
async fn changed_without_a_reproof(f: &Fixture) -> (Running, BTreeSet<String>, Lsn) {
    // The witness off: with it, the reconnect's start would repair the
    // break and stream on.
    let running = Running::start(f.config_with(&format!("{NO_REPROOF} {WITNESS_OFF}"))).await;
    let first: BTreeSet<String> = f
        .write_tx(&[("order", "a", r#"{"n":1}"#.to_owned())], true)
        .await
        .into_iter()
        .collect();
    arrive(f, &first, "the first row");
    let (narrowed, hidden) = hide_one_row(f).await;
    (running, hidden, narrowed)
}

/// C2 at a reconnect: the change happens between two proofs and the session
/// then ends with a retryable error (its walsender terminated). The next
/// session must not prove today's publication and acknowledge past X: the
/// connector stops (or refuses), a restart refuses, and the repair
/// publishes X.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_change_before_a_reconnect_is_not_forgotten() {
    init_tracing();
    let f = Fixture::new("cbreconnect").await;
    let (running, hidden, narrowed) = changed_without_a_reproof(&f).await;
    f.admin
        .query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
            &[&f.slot],
        )
        .await
        .expect("terminate the walsender");
    write_until_stopped(&running, 3, Duration::from_millis(100), async |n| {
        f.write_tx(&[("order", "a", format!(r#"{{"n":{n}}}"#))], true)
            .await;
    })
    .await;
    let what = format!("row {hidden:?} hidden by a change, then a reconnect");
    match ends_within(running, Duration::from_secs(20), &what).await {
        Err(PipelineError::CoverageLost(lost)) => assert!(
            lost.problems
                .iter()
                .any(|p| matches!(p, CoverageProblem::PublicationChanged { .. })),
            "{what}: {lost}"
        ),
        Err(PipelineError::Refused(StartRefused::CoverageBroken { .. })) => {}
        other => panic!("{what}: expected a stop on the changed publication, got {other:?}"),
    }
    assert_not_acknowledged_past(&f, narrowed, "the change").await;
    let err = start_refused(f.config_with(WITNESS_OFF), "restart after the reconnect").await;
    let (since, until) = coverage_broken(err, &f.slot, "restart after the reconnect");
    audit_repair(&f, &since, &until);
    arrive(&f, &hidden, "the hidden row after audit --repair");
    streams_again(&f, "the start after the repair").await;
    f.cleanup().await;
}

/// C2 at a graceful stop: the change happens after the last proof and the
/// connector is stopped (SIGTERM) before the next. The restart refuses and
/// the repair publishes X.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_change_before_a_graceful_stop_is_refused_at_restart() {
    init_tracing();
    let f = Fixture::new("cbstopchg").await;
    let (running, hidden, narrowed) = changed_without_a_reproof(&f).await;
    // A row after the change, so that the stream has passed it when stopped.
    let after: BTreeSet<String> = f
        .write_tx(&[("order", "a", r#"{"n":3}"#.to_owned())], true)
        .await
        .into_iter()
        .collect();
    arrive(&f, &after, "the row after the change");
    let stopped = running.stop().await;
    assert_not_acknowledged_past(&f, narrowed, "the change (at the graceful stop)").await;
    let what = format!("restart after a change seen at the stop (which returned {stopped:?})");
    let err = start_refused(f.config_with(WITNESS_OFF), &what).await;
    let (since, until) = coverage_broken(err, &f.slot, &what);
    audit_repair(&f, &since, &until);
    arrive(&f, &hidden, "the hidden row after audit --repair");
    streams_again(&f, "the start after the repair").await;
    f.cleanup().await;
}

/// C4, a bulk load between two proofs: the receiving partition is made
/// UNLOGGED, loaded and made LOGGED again before the next proof. The loaded
/// rows never reach WAL as inserts (SET LOGGED copies the heap, it does not
/// decode as inserts): the connector must stop, not acknowledge past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlogged_bulk_load_between_two_proofs_stops_the_connector() {
    init_tracing();
    let f = partitioned_fixture("cbunlogload", false).await;
    let t = f.table.clone();
    let running = streaming_with_slow_proofs(&f).await;
    let before = f.wal_insert_lsn().await;
    f.admin
        .batch_execute(&format!("ALTER TABLE public.{t}_cur SET UNLOGGED"))
        .await
        .expect("make the receiving partition unlogged");
    let loaded = insert(&f.admin, &t, &names("bulk", 3), 1, "now()").await;
    f.admin
        .batch_execute(&format!("ALTER TABLE public.{t}_cur SET LOGGED"))
        .await
        .expect("make it logged again");
    write_until_stopped(&running, 2, Duration::from_millis(50), async |n| {
        insert(&f.admin, &t, &["a".to_owned()], n, "now()").await;
    })
    .await;
    let what = format!("rows {loaded:?} loaded while the partition was UNLOGGED");
    if running.is_finished() {
        match running.finished(Duration::from_secs(5)).await {
            Err(PipelineError::CoverageLost(_)) => {}
            other => panic!("{what}: expected CoverageLost, got {other:?}"),
        }
        assert_not_acknowledged_past(&f, before, "the unlogged load").await;
    } else {
        // Still running: acceptable only if the loaded rows were published.
        let ids: BTreeSet<String> = loaded.iter().cloned().collect();
        let arrived = read_ids(
            &f.topic_prefix,
            &ids,
            Duration::from_secs(10),
            Duration::ZERO,
        );
        let confirmed = f.confirmed_lsn().await;
        let stopped = running.stop().await;
        assert!(
            arrived.is_ok(),
            "{what}: silently lost: not in Kafka, the connector ran on for 10 s and beyond (3 s proofs), \
             slot confirmed {confirmed} past the load at {before}; stop: {stopped:?}"
        );
    }
    f.cleanup().await;
}

/// C4 while stopped: the same bulk load (SET UNLOGGED; insert B; SET LOGGED)
/// while the connector is stopped. The start must refuse, or B must arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlogged_bulk_load_while_stopped_is_refused_or_published() {
    init_tracing();
    let f = partitioned_fixture("cbunlogstop", false).await;
    let t = f.table.clone();
    let running = Running::start(f.config()).await;
    let a = insert(&f.admin, &t, &["a".to_owned()], 1, "now()").await;
    arrive(&f, &a.into_iter().collect(), "row A before the stop");
    running.stop().await.expect("graceful stop");
    f.admin
        .batch_execute(&format!("ALTER TABLE public.{t}_cur SET UNLOGGED"))
        .await
        .expect("make the receiving partition unlogged");
    let b = insert(&f.admin, &t, &["b".to_owned()], 1, "now()").await;
    f.admin
        .batch_execute(&format!("ALTER TABLE public.{t}_cur SET LOGGED"))
        .await
        .expect("make it logged again");
    let c: BTreeSet<String> = insert(&f.admin, &t, &["c".to_owned()], 1, "now()")
        .await
        .into_iter()
        .collect();
    let running = Running::spawn(f.config(), RunOptions::default());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !running.is_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if running.is_finished() {
        let refused = running.finished(Duration::from_secs(5)).await;
        assert!(refused.is_err(), "the start returned Ok: {refused:?}");
    } else {
        // Started: acceptable only if B (loaded while unlogged) is published.
        arrive(&f, &c, "row C after the bulk load");
        let ids: BTreeSet<String> = b.iter().cloned().collect();
        let arrived = read_ids(
            &f.topic_prefix,
            &ids,
            Duration::from_secs(10),
            Duration::ZERO,
        );
        let stopped = running.stop().await;
        assert!(
            arrived.is_ok(),
            "row B {b:?} loaded while the partition was UNLOGGED (connector stopped) is silently lost: \
             the start streamed and C arrived, B never did; stop: {stopped:?}"
        );
    }
    f.cleanup().await;
}

/// C4 at start, a foreign partition (an archive range on another server):
/// its rows are not in this server's WAL, so the start is refused naming it.
/// A handler-less foreign-data wrapper is enough for the catalog; a
/// partitioned table with a unique index takes no foreign partition, so the
/// primary key goes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_partition_refuses_the_start() {
    init_tracing();
    let f = partitioned_fixture("cbforeign", true).await;
    let t = f.table.clone();
    let (fdw, server) = (format!("fdw_{}", f.name), format!("srv_{}", f.name));
    f.admin
        .batch_execute(&format!(
            "ALTER TABLE public.{t} DROP CONSTRAINT {t}_pkey;
             CREATE FOREIGN DATA WRAPPER {fdw};
             CREATE SERVER {server} FOREIGN DATA WRAPPER {fdw};
             CREATE FOREIGN TABLE public.{t}_archive PARTITION OF public.{t}
                 FOR VALUES FROM ('1990-01-01') TO ('2000-01-01') SERVER {server};"
        ))
        .await
        .expect("a foreign partition");
    let what = "a foreign partition at start";
    let refused = start_refused(f.config_with(WITNESS_OFF), what).await;
    f.admin
        .batch_execute(&format!(
            "DROP FOREIGN TABLE public.{t}_archive; DROP SERVER {server}; DROP FOREIGN DATA WRAPPER {fdw};"
        ))
        .await
        .expect("drop the foreign partition");
    match refused {
        PipelineError::NotCovered(nc) => assert!(
            names_not_in_wal(&nc.problems, &format!("{t}_archive")),
            "{what}: refused without NotInWal naming {t}_archive: {nc}"
        ),
        other => panic!("{what}: expected NotCovered(NotInWal), got {other:?}"),
    }
    f.cleanup().await;
}

/// Issue 48: with the live witness on (the default), a stored break does not
/// wait for an operator. The outbox leaves the publication and comes back
/// between two proofs, hiding row X; the connector stops as before, and a
/// plain restart (a supervisor's) audits the break's window, publishes X
/// from the table, logs it at ERROR, clears the break and streams on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_witness_repairs_a_stored_break_at_restart() {
    init_tracing();
    let f = Fixture::new("cbwitness").await;
    let (narrowed, hidden, what, ended) = stopped_on_a_hidden_row(&f).await;
    assert!(
        matches!(ended, Err(PipelineError::CoverageLost(_))),
        "{what}: the connector did not stop on the change"
    );
    assert_not_acknowledged_past(&f, narrowed, "the change").await;
    {
        let store = outbox_cdc::checkpoint::OffsetStore::open(&f.offsets_path()).expect("store");
        let record = store.coverage(&f.slot).expect("read").expect("a record");
        assert_eq!(
            record.breaks.len(),
            1,
            "the break is stored: {:?}",
            record.breaks
        );
    }
    // The binary, as a supervisor restarts it, with the defaults.
    let config = f.write_config_file();
    let mut child = spawn_binary_with(&config, &[]);
    // Written while the start repairs: the slot delivers it (the audit
    // after the repair may see it missing meanwhile; that keeps no break).
    let next: BTreeSet<String> = insert(&f.admin, &f.table, &["next".to_owned()], 1, "now()")
        .await
        .into_iter()
        .collect();
    if read_ids(
        &f.topic_prefix,
        &hidden,
        Duration::from_secs(40),
        Duration::ZERO,
    )
    .is_err()
    {
        panic!(
            "the hidden row did not arrive after a plain restart; log:\n{}",
            log_of(&config)
        );
    }

    if read_ids(
        &f.topic_prefix,
        &next,
        Duration::from_secs(40),
        Duration::ZERO,
    )
    .is_err()
    {
        panic!(
            "a row after the repaired start did not arrive; log:\n{}",
            log_of(&config)
        );
    }
    let log = log_of(&config);
    assert!(
        log.contains("ERROR") && log.contains("a coverage break is stored"),
        "the repair is not logged at ERROR:\n{log}"
    );
    assert!(
        log.contains("the break is cleared"),
        "the break is not cleared:\n{log}"
    );
    child.terminate(Duration::from_secs(20));
    let store = outbox_cdc::checkpoint::OffsetStore::open(&f.offsets_path()).expect("store");
    let record = store.coverage(&f.slot).expect("read").expect("a record");
    assert!(
        record.breaks.is_empty(),
        "the break is still stored: {:?}",
        record.breaks
    );
    f.cleanup().await;
}
