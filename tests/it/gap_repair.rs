//! Gap repair after a lost slot (DESIGN.md §13): the slot dropped by hand
//! while writers commit, the repair under concurrent writes, a repair killed
//! half-way, and the refusal when the outbox no longer covers the gap.
//!
//! The repair killed half-way needs the connector's crash points: it is
//! compiled only with the cargo feature `failpoints`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Record, Running, consume};
use common::writer::spawn_writer;
use outbox_cdc::Disposition;
use outbox_cdc::pipeline::{PipelineError, RunOptions, StartRefused};

const TIMEOUT: Duration = Duration::from_secs(90);

/// Every committed id arrived; per aggregate, first deliveries are in one
/// partition in increasing sequence order.
fn assert_complete_and_ordered(records: &[Record], committed: &BTreeSet<String>) {
    let seen: BTreeSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    let lost: Vec<&String> = committed
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} committed events lost: {lost:?}",
        lost.len()
    );
    let mut first: BTreeMap<&str, &Record> = BTreeMap::new();
    for r in records {
        first
            .entry(r.header("event_id"))
            .and_modify(|f| {
                if (r.partition, r.offset) < (f.partition, f.offset) {
                    *f = r;
                }
            })
            .or_insert(r);
    }
    let mut by_key: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in first.values() {
        by_key.entry(r.key.as_str()).or_default().push(r);
    }
    for (key, mut recs) in by_key {
        let partitions: BTreeSet<i32> = recs.iter().map(|r| r.partition).collect();
        assert_eq!(
            partitions.len(),
            1,
            "aggregate {key} over partitions {partitions:?}"
        );
        recs.sort_by_key(|r| r.offset);
        let seqs: Vec<i64> = recs
            .iter()
            .map(|r| r.header("aggregate_sequence").parse().expect("sequence"))
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "aggregate {key}: first deliveries out of order {seqs:?}"
        );
    }
}

async fn refused_start(fx: &Fixture, options: RunOptions) -> PipelineError {
    Running::spawn(fx.config(), options)
        .finished(TIMEOUT)
        .await
        .expect_err("the start must be refused")
}

/// The slot is dropped behind the connector's back while a writer commits:
/// a plain start is refused; `--recreate-slot` repairs the gap from the
/// outbox table while the writer goes on, then streams. Nothing committed is
/// lost, first deliveries keep each aggregate's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_slot_is_repaired_while_writers_commit() {
    init_tracing();
    let fx = Fixture::new("repair").await;
    let mut committed: BTreeSet<String> = BTreeSet::new();
    let running = Running::start(fx.config()).await;
    let writer = spawn_writer(fx.table.clone(), "a");
    tokio::time::sleep(Duration::from_millis(800)).await;
    running.stop().await.expect("graceful stop");

    // The slot goes while the writer keeps committing: those rows are in the gap.
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let err = refused_start(&fx, RunOptions::default()).await;
    assert!(
        matches!(err, PipelineError::Refused(StartRefused::SlotLost { .. })),
        "{err}"
    );

    let running = Running::spawn(
        fx.config(),
        RunOptions {
            recreate_slot: true,
            ..RunOptions::default()
        },
    );
    running.wait_streaming().await;
    let repaired = running.metrics.repair_rows();
    assert!(repaired > 0, "the repair published nothing");
    // The writer goes on after the repair: the new slot carries those rows.
    tokio::time::sleep(Duration::from_millis(800)).await;
    committed.extend(writer.finish().await.ids);

    let records = consume(
        &fx.topic_prefix,
        committed.len(),
        TIMEOUT,
        Duration::from_secs(2),
    );
    assert_complete_and_ordered(&records, &committed);
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// Rows deleted from the outbox before they were published cannot be
/// repaired: with no row left from before the last acknowledged commit, the
/// repair is refused unless the operator accepts the gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_the_outbox_cannot_cover_is_refused_unless_accepted() {
    init_tracing();
    let fx = Fixture::new("repairgap").await;
    let running = Running::start(fx.config()).await;
    fx.write_tx(&[("order", "g", r#"{"n":1}"#.to_owned())], true)
        .await;
    consume(&fx.topic_prefix, 1, TIMEOUT, Duration::ZERO);
    running.stop().await.expect("graceful stop");

    fx.admin
        .batch_execute(&format!("DELETE FROM public.{}", fx.table))
        .await
        .expect("prune everything");
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    let late = fx
        .write_tx(&[("order", "g", r#"{"n":2}"#.to_owned())], true)
        .await;
    let recreate = RunOptions {
        recreate_slot: true,
        ..RunOptions::default()
    };
    let err = refused_start(&fx, recreate).await;
    assert!(
        matches!(&err, PipelineError::RepairRefused { fix, .. } if fix.contains("--accept-gap")),
        "{err}"
    );
    assert_eq!(err.disposition(), Disposition::Stop);
    // Nothing was recreated: the refusal comes before the slot.
    assert!(fx.slot_confirmed_flush().await.is_none());

    let running = Running::spawn(
        fx.config(),
        RunOptions {
            accept_gap: true,
            ..recreate
        },
    );
    running.wait_streaming().await;
    let records = consume(&fx.topic_prefix, 2, TIMEOUT, Duration::from_secs(1));
    assert!(
        records.iter().any(|r| r.header("event_id") == late[0]),
        "the row committed in the gap was not repaired: {records:?}"
    );
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// Review R2: rows of a parked aggregate are kept by pruning whatever their
/// age, so they say nothing about how far deletes reached. With only such a
/// row from 30 days ago left and the gap's rows deleted, the repair is
/// refused unless the operator accepts the gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_aggregates_old_row_does_not_prove_the_gap_covered() {
    init_tracing();
    let fx = Fixture::new("repairparked").await;
    let env = format!(
        "OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={}.dlq \
         OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=2000",
        fx.topic_prefix
    );
    let running = Running::start(fx.config_with(&env)).await;
    // Too large for a record: dead-lettered, its aggregate parked.
    fx.admin
        .execute(
            &format!(
                "INSERT INTO public.{} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at)
                 VALUES (gen_random_uuid(), 'order', 'parked', 1, 'Huge', jsonb_build_object('blob', repeat('x', 5000)),
                         now() - interval '30 days')",
                fx.table
            ),
            &[],
        )
        .await
        .expect("insert the poison row");
    fx.write_tx(&[("order", "g", r#"{"n":1}"#.to_owned())], true)
        .await;
    consume(&fx.topic_prefix, 2, TIMEOUT, Duration::ZERO);
    running.stop().await.expect("graceful stop");
    {
        let store = outbox_cdc::checkpoint::OffsetStore::open(&fx.offsets_path()).unwrap();
        assert!(store.is_parked("order", "parked").unwrap());
    }

    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    // Committed in the gap, then removed by something other than the
    // pruner (a cleanup job) before it was published.
    fx.write_tx(&[("order", "g", r#"{"n":2}"#.to_owned())], true)
        .await;
    fx.admin
        .batch_execute(&format!(
            "DELETE FROM public.{} WHERE aggregate_id <> 'parked'",
            fx.table
        ))
        .await
        .expect("delete the gap's rows");

    let err = Running::spawn(
        fx.config_with(&env),
        RunOptions {
            recreate_slot: true,
            repair_only: true,
            ..RunOptions::default()
        },
    )
    .finished(TIMEOUT)
    .await
    .expect_err("a repair the table cannot cover must be refused");
    assert!(
        matches!(&err, PipelineError::RepairRefused { fix, .. } if fix.contains("--accept-gap")),
        "{err}"
    );
    assert!(fx.slot_confirmed_flush().await.is_none());
    fx.cleanup().await;
}

/// The repair killed half-way (SIGKILL at its third record): the next start
/// finds the unfinished repair and the new slot, publishes again, and
/// nothing is lost.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_killed_half_way_finishes_on_the_next_start() {
    init_tracing();
    let fx = Fixture::new("repairkill").await;
    let running = Running::start(fx.config()).await;
    let mut committed: BTreeSet<String> = BTreeSet::new();
    committed.extend(
        fx.write_tx(&[("order", "k", r#"{"n":0}"#.to_owned())], true)
            .await,
    );
    consume(&fx.topic_prefix, 1, TIMEOUT, Duration::ZERO);
    running.stop().await.expect("graceful stop");
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    for i in 1..=20 {
        committed.extend(
            fx.write_tx(&[("order", "k", format!(r#"{{"n":{i}}}"#))], true)
                .await,
        );
    }

    let config = fx.write_config_file();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["repair", "--config"])
        .arg(&config)
        .env("OUTBOX_CDC_FAILPOINT", "during-repair:3")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run outbox-cdc repair");
    assert!(!status.success(), "the repair was not killed: {status:?}");
    // The slot was recreated before the kill; the repair is unfinished.
    common::relay::eventually("the recreated slot", TIMEOUT, || async {
        fx.slot_confirmed_flush().await.is_some()
    })
    .await;

    // A plain start (no flag) finishes the repair, then streams.
    let running = Running::start(fx.config()).await;
    committed.extend(
        fx.write_tx(&[("order", "k", r#"{"n":21}"#.to_owned())], true)
            .await,
    );
    let records = consume(
        &fx.topic_prefix,
        committed.len(),
        TIMEOUT,
        Duration::from_secs(2),
    );
    assert_complete_and_ordered(&records, &committed);
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// The slot lost before the connector acknowledged any transaction: the
/// offset stored when the slot was created carries the creation time, so the
/// repair still knows where to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lost_before_anything_was_acknowledged_is_repaired() {
    init_tracing();
    let fx = Fixture::new("repairfresh").await;
    let running = Running::start(fx.config()).await;
    running.stop().await.expect("graceful stop");
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    let gap = fx
        .write_tx(&[("order", "f", r#"{"n":1}"#.to_owned())], true)
        .await;
    let running = Running::spawn(
        fx.config(),
        RunOptions {
            recreate_slot: true,
            ..RunOptions::default()
        },
    );
    running.wait_streaming().await;
    let records = consume(&fx.topic_prefix, 1, TIMEOUT, Duration::from_secs(1));
    assert!(
        records.iter().any(|r| r.header("event_id") == gap[0]),
        "the row committed while the slot was gone was not repaired"
    );
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}
