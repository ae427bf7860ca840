//! The live witness (`[reconcile]`, issue 48) on real servers: rows the
//! stream never delivers are found in the outbox table and published from it,
//! each once, marked repaired; rows the stream did deliver are never taken
//! for missing (savepoints, rollbacks, restarts).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Record, Running, consume};

/// One transaction: a row at top level and one inside a released savepoint
/// (its xmin is the subtransaction's id, not the id the stream reports),
/// plus one in a savepoint rolled back (never an event). Returns the ids of
/// the committed rows.
async fn savepoint_tx(f: &Fixture, aggregate: &str, n: usize) -> Vec<String> {
    let t = &f.table;
    let insert = |seq: usize| {
        format!(
            "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
             VALUES (gen_random_uuid(), 'order', '{aggregate}', {seq}, 'TestEvent', '{{\"n\":{seq}}}')
             RETURNING event_id::text"
        )
    };
    let c = &f.admin;
    c.batch_execute("BEGIN").await.expect("BEGIN");
    let mut ids = Vec::new();
    ids.push(
        c.query_one(&insert(2 * n + 1), &[])
            .await
            .expect("insert")
            .get::<_, String>(0),
    );
    c.batch_execute("SAVEPOINT kept").await.expect("savepoint");
    ids.push(
        c.query_one(&insert(2 * n + 2), &[])
            .await
            .expect("insert")
            .get::<_, String>(0),
    );
    c.batch_execute("RELEASE SAVEPOINT kept; SAVEPOINT undone")
        .await
        .expect("savepoint");
    c.query_one(&insert(1_000_000 + n), &[])
        .await
        .expect("insert");
    c.batch_execute("ROLLBACK TO SAVEPOINT undone; COMMIT")
        .await
        .expect("commit");
    ids
}

/// Every written id among `records`, none unknown; returns the records by
/// id. A row the witness published (`repaired_by`) appears once. A row the
/// stream delivered appears once too, unless `resends` (at least once) and
/// `log` (the connector's, empty for an in-process run) shows a session that
/// ended and streamed again from the durable offset: at least once sends
/// the unacknowledged tail again then, which is the contract, not the
/// witness's doing.
fn each_once<'a>(
    records: &'a [Record],
    written: &BTreeSet<String>,
    log: &str,
    resends: bool,
) -> BTreeMap<&'a str, &'a Record> {
    let restarted = resends && log.contains("session failed; reconnecting");
    let mut by_id: BTreeMap<&str, &Record> = BTreeMap::new();
    for r in records {
        let id = r.header("event_id");
        assert!(
            written.contains(id),
            "a record for an event never written: {id}\n{log}"
        );
        let Some(earlier) = by_id.insert(id, r) else {
            continue;
        };
        let repaired = |r: &Record| r.headers.contains_key("repaired_by");
        assert!(
            restarted && !repaired(earlier) && !repaired(r),
            "event {id} published twice (by the witness: {}, {}); the connector's log:\n{log}",
            repaired(earlier),
            repaired(r)
        );
    }
    let missing: Vec<&String> = written
        .iter()
        .filter(|id| !by_id.contains_key(id.as_str()))
        .collect();
    assert!(missing.is_empty(), "never published: {missing:?}\n{log}");
    by_id
}

/// A sabotaged session skips every third outbox insert it decodes, as a cause
/// nobody has thought of would: the witness finds each of those rows in the
/// table (top-level and savepoint rows alike) and publishes it, once, with
/// the `repaired_by` header; the rows the stream delivered are not
/// published again.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_stream_skips_are_published_from_the_table() {
    rows_the_stream_skips_are_published("witnessskip", "").await;
}

/// The same in exactly-once mode: the repaired rows go in a Kafka
/// transaction of their own, so a read_committed reader sees every row
/// exactly once.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_stream_skips_are_published_once_in_exactly_once_mode() {
    let offsets = common::unique_name("witness_offsets");
    let delivery = format!(
        "\n[delivery]\nmode = \"exactly-once\"\noffsets_topic = \"{offsets}\"\nmax_batch_ms = 50\n"
    );
    let log = rows_the_stream_skips_are_published("witnesseo", &delivery).await;
    assert!(
        log.contains("publishing in a Kafka transaction of its own"),
        "the repaired rows did not go in a Kafka transaction:\n{log}"
    );
}

#[cfg(feature = "failpoints")]
/// Returns the connector's log.
async fn rows_the_stream_skips_are_published(prefix: &str, extra_config: &str) -> String {
    init_tracing();
    let f = Fixture::new(prefix).await;
    let config = f.write_config_file();
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("\n[reconcile]\ninterval_ms = 300\n");
    text.push_str(extra_config);
    std::fs::write(&config, text).expect("config");
    let mut child = common::relay::spawn_binary_with(
        &config,
        &[("OUTBOX_CDC_SABOTAGE", "drop-insert-every:3")],
    );
    f.wait_for_slot().await;
    // Rows are checked from the witness's first round on.
    let log_says = |what: &'static str| {
        let config = config.clone();
        move || {
            let found = common::relay::log_of(&config).contains(what);
            async move { found }
        }
    };
    common::relay::eventually(
        "the witness's first round",
        Duration::from_secs(30),
        log_says("live witness: rows of transactions from this id on are checked"),
    )
    .await;
    let mut written = BTreeSet::new();
    for n in 0..12 {
        written.extend(savepoint_tx(&f, &format!("a{}", n % 3), n).await);
    }
    let read = common::relay::read_records(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(90),
        Duration::from_secs(3),
    );
    let records = read.unwrap_or_else(|partial| {
        panic!(
            "{} of {} records; the connector's log:\n{}",
            partial.len(),
            written.len(),
            common::relay::log_of(&config)
        )
    });
    // Exactly once: a read_committed reader sees no record twice, restart or not.
    let log = common::relay::log_of(&config);
    let by_id = each_once(&records, &written, &log, extra_config.is_empty());
    let repaired = by_id
        .values()
        .filter(|r| r.headers.get("repaired_by").map(String::as_str) == Some("witness"))
        .count();
    // The 24 committed inserts are decoded (a savepoint rolled back in a
    // transaction small enough not to be streamed is never sent): every
    // third of them.
    assert_eq!(repaired, 8, "rows published from the table");
    assert_eq!(
        log.matches("was not delivered by the stream").count(),
        8,
        "one ERROR per row:\n{log}"
    );
    // Each names the row's aggregate, read from the table for the log.
    for line in log
        .lines()
        .filter(|l| l.contains("was not delivered by the stream"))
    {
        assert!(
            line.contains("aggregate_type=order") && line.contains("aggregate_id=a"),
            "an ERROR without the row's aggregate: {line}"
        );
    }
    child.terminate(Duration::from_secs(20));
    f.cleanup().await;
    log
}

/// No false positives: savepoints, rolled-back savepoints and transactions,
/// a transaction large enough to be streamed in blocks, and a restart in the
/// middle; the witness checks every committed row and finds none missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_stream_delivered_are_never_taken_for_missing() {
    init_tracing();
    let f = Fixture::new("witnessnone").await;
    let config = || f.config_with("OUTBOX_CDC__RECONCILE__INTERVAL_MS=200");
    let mut written = BTreeSet::new();
    let mut checked = 0;
    for session in 0..2 {
        let running = Running::start(config()).await;
        // Rows are checked from the witness's first round on.
        common::relay::eventually("the witness's first round", Duration::from_secs(30), || {
            let lag = running.metrics.reconcile_lag();
            async move { lag.is_some() }
        })
        .await;
        for n in 0..10 {
            written.extend(savepoint_tx(&f, &format!("s{session}-{}", n % 4), n).await);
            f.write_tx(&[("order", "rolled", "{}".to_owned())], false)
                .await;
        }
        // Large enough to be streamed while in progress where the server
        // streams (logical_decoding_work_mem of the test cluster).
        let big: Vec<(&str, &str, String)> = (0..3000)
            .map(|i| {
                (
                    "order",
                    "big",
                    format!(r#"{{"i":{i},"pad":"{}"}}"#, "x".repeat(200)),
                )
            })
            .collect();
        if session == 0 {
            written.extend(f.write_tx(&big, true).await);
        }
        let target = written.len() as u64;
        common::relay::eventually(
            "the witness checked every row",
            Duration::from_secs(60),
            || {
                let c = checked + running.metrics.reconcile_checked_rows();
                async move { c >= target }
            },
        )
        .await;
        assert_eq!(
            running.metrics.reconcile_missing(),
            0,
            "rows taken for missing"
        );
        assert_eq!(running.metrics.reconcile_repaired_rows(), 0);
        checked += running.metrics.reconcile_checked_rows();
        running.stop().await.expect("clean stop");
    }
    let records = consume(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(60),
        Duration::from_secs(2),
    );
    let by_id = each_once(&records, &written, "", false);
    assert!(
        by_id
            .values()
            .all(|r| !r.headers.contains_key("repaired_by"))
    );
    f.cleanup().await;
}

/// A publication narrowed and restored between two coverage proofs (the
/// outbox dropped from it, a row committed, the outbox added again) while a
/// `failpoints` build has its coverage checks off, as if the proofs missed
/// it: PostgreSQL never sends the row, and nothing in the stream says so.
/// The witness finds it in the table and publishes it while the connector
/// streams on.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_hidden_from_the_stream_is_published_by_the_witness() {
    init_tracing();
    let f = Fixture::new("witnesshidden").await;
    let config = f.write_config_file();
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("\n[reconcile]\ninterval_ms = 300\n");
    std::fs::write(&config, text).expect("config");
    let mut child = common::relay::spawn_binary_with(
        &config,
        &[("OUTBOX_CDC_SABOTAGE", "coverage-checks-off")],
    );
    f.wait_for_slot().await;
    let first_round = {
        let config = config.clone();
        move || {
            let log = common::relay::log_of(&config);
            async move { log.contains("live witness: rows of transactions from this id on are checked") }
        }
    };
    common::relay::eventually(
        "the witness's first round",
        Duration::from_secs(30),
        first_round,
    )
    .await;
    let mut written: BTreeSet<String> = f
        .write_tx(&[("order", "a", r#"{"n":1}"#.to_owned())], true)
        .await
        .into_iter()
        .collect();
    let (_, hidden) = super::no_silent_skip::hide_one_row(&f).await;
    written.extend(hidden.iter().cloned());
    written.extend(
        f.write_tx(&[("order", "a", r#"{"n":3}"#.to_owned())], true)
            .await,
    );
    let read = common::relay::read_records(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(60),
        Duration::from_secs(2),
    );
    let records = read.unwrap_or_else(|partial| {
        panic!(
            "{} of {} records: the hidden row {hidden:?} was not published; log:\n{}",
            partial.len(),
            written.len(),
            common::relay::log_of(&config)
        )
    });
    let log = common::relay::log_of(&config);
    let by_id = each_once(&records, &written, &log, true);
    for id in &hidden {
        assert_eq!(
            by_id[id.as_str()]
                .headers
                .get("repaired_by")
                .map(String::as_str),
            Some("witness"),
            "the hidden row came from the stream?"
        );
    }
    assert!(child.try_wait().is_none(), "the connector stopped");
    assert_eq!(
        log.matches("was not delivered by the stream").count(),
        1,
        "{log}"
    );
    child.terminate(Duration::from_secs(20));
    f.cleanup().await;
}
