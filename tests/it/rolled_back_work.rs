//! Rolled-back work that reaches the connector (DESIGN.md §2, contract 1).
//!
//! With pgoutput protocol v1 PostgreSQL drops an aborted top-level
//! transaction before it is sent. What is sent is a committed transaction
//! whose subtransactions (savepoints) were rolled back in between its other
//! writes: exactly the rows outside the rolled-back savepoints must be
//! published, in commit order, with the sequence numbers they were stored
//! with (a rolled-back row's number is handed out again).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::relay::{Fixture, Record, Running, consume};
use common::topic_partitions;

const TIMEOUT: Duration = Duration::from_secs(90);
const SETTLE: Duration = Duration::from_secs(3);

/// One outbox row as written: (event id, aggregate type, aggregate id, sequence).
type Row = (String, String, String, i64);

/// Inserts one event in the open transaction of `client`, numbered after the
/// aggregate's highest visible sequence; returns what was stored.
async fn emit(client: &tokio_postgres::Client, table: &str, agg_type: &str, agg_id: &str) -> Row {
    let row = client
        .query_one(
            &format!(
                "INSERT INTO public.{table} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
                 VALUES (gen_random_uuid(), $1, $2,
                         (SELECT coalesce(max(aggregate_sequence), 0) + 1 FROM public.{table}
                           WHERE aggregate_type = $1 AND aggregate_id = $2),
                         'TestEvent', jsonb_build_object('agg', $2::text))
                 RETURNING event_id::text, aggregate_sequence"
            ),
            &[&agg_type, &agg_id],
        )
        .await
        .unwrap_or_else(|e| panic!("insert into {table}: {e}"));
    (
        row.get(0),
        agg_type.to_owned(),
        agg_id.to_owned(),
        row.get(1),
    )
}

async fn sql(client: &tokio_postgres::Client, statement: &str) {
    client
        .batch_execute(statement)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// The records are exactly `kept` (each once), none of `rolled_back`, and per
/// aggregate, in one partition, in the order they were written with the
/// stored sequence numbers.
fn assert_exactly_in_order(fx: &Fixture, records: &[Record], kept: &[Row], rolled_back: &[Row]) {
    let published: Vec<&str> = records.iter().map(|r| r.header("event_id")).collect();
    for (id, agg_type, agg_id, seq) in rolled_back {
        assert!(
            !published.contains(&id.as_str()),
            "rolled-back row {id} ({agg_type}/{agg_id} #{seq}) was published"
        );
    }
    let unique: BTreeSet<&str> = published.iter().copied().collect();
    assert_eq!(
        unique.len(),
        published.len(),
        "an event was published twice"
    );
    let expected: BTreeSet<&str> = kept.iter().map(|k| k.0.as_str()).collect();
    assert_eq!(unique, expected, "published events against the kept rows");

    let mut want: BTreeMap<(&str, &str), Vec<(&str, i64)>> = BTreeMap::new();
    for (id, agg_type, agg_id, seq) in kept {
        want.entry((agg_type.as_str(), agg_id.as_str()))
            .or_default()
            .push((id.as_str(), *seq));
    }
    let mut got: BTreeMap<(&str, &str), Vec<&Record>> = BTreeMap::new();
    for r in records {
        got.entry((r.header("aggregate_type"), r.key.as_str()))
            .or_default()
            .push(r);
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "aggregates published"
    );
    for ((agg_type, agg_id), mut recs) in got {
        assert!(
            recs.iter()
                .all(|r| r.topic == format!("{}.{agg_type}", fx.topic_prefix)),
            "{agg_type}/{agg_id}: on another topic"
        );
        let partitions: BTreeSet<i32> = recs.iter().map(|r| r.partition).collect();
        assert_eq!(
            partitions.len(),
            1,
            "{agg_type}/{agg_id} split: {partitions:?}"
        );
        recs.sort_by_key(|r| r.offset);
        let seen: Vec<(&str, i64)> = recs
            .iter()
            .map(|r| {
                let seq = r.header("aggregate_sequence").parse().unwrap_or_else(|e| {
                    panic!(
                        "aggregate_sequence {:?}: {e}",
                        r.header("aggregate_sequence")
                    )
                });
                (r.header("event_id"), seq)
            })
            .collect();
        assert_eq!(
            seen,
            want[&(agg_type, agg_id)],
            "{agg_type}/{agg_id}: (event id, sequence) in partition order against the commit order"
        );
        let seqs: Vec<i64> = seen.iter().map(|s| s.1).collect();
        let consecutive: Vec<i64> = (1..=seqs.len() as i64).collect();
        assert_eq!(seqs, consecutive, "{agg_type}/{agg_id}: sequences");
    }
}

/// Savepoints rolled back (plainly, after an error, twice over, nested in a
/// released one) between the committed writes of one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_savepoints_publish_exactly_the_kept_rows_in_order() {
    common::init_tracing();
    let fx = Fixture::new("savepoint").await;
    let running = Running::start(fx.config()).await;
    let (c, t) = (&fx.admin, fx.table.as_str());
    let mut kept = Vec::new();
    let mut rolled_back = Vec::new();

    sql(c, "BEGIN").await;
    kept.push(emit(c, t, "order", "a1").await);
    kept.push(emit(c, t, "order", "a2").await);
    sql(c, "SAVEPOINT s1").await;
    rolled_back.push(emit(c, t, "order", "a1").await);
    rolled_back.push(emit(c, t, "order", "a3").await);
    rolled_back.push(emit(c, t, "invoice", "i1").await);
    sql(c, "ROLLBACK TO SAVEPOINT s1").await;
    // The numbers the rolled-back rows held are handed out again.
    kept.push(emit(c, t, "order", "a1").await);
    kept.push(emit(c, t, "order", "a3").await);
    sql(c, "SAVEPOINT s2").await;
    kept.push(emit(c, t, "order", "a1").await);
    sql(c, "SAVEPOINT s3").await;
    rolled_back.push(emit(c, t, "order", "a2").await);
    sql(c, "ROLLBACK TO SAVEPOINT s3").await;
    kept.push(emit(c, t, "order", "a2").await);
    sql(c, "RELEASE SAVEPOINT s2").await;
    // Rolled back twice to the same savepoint.
    sql(c, "SAVEPOINT s4").await;
    rolled_back.push(emit(c, t, "order", "a1").await);
    sql(c, "ROLLBACK TO SAVEPOINT s4").await;
    rolled_back.push(emit(c, t, "order", "a1").await);
    rolled_back.push(emit(c, t, "invoice", "i1").await);
    sql(c, "ROLLBACK TO SAVEPOINT s4").await;
    kept.push(emit(c, t, "order", "a1").await);
    // Aborted by an error (the usual application pattern), then rolled back.
    sql(c, "SAVEPOINT s5").await;
    rolled_back.push(emit(c, t, "order", "a2").await);
    let duplicate = c
        .execute(
            &format!(
                "INSERT INTO public.{t} SELECT * FROM public.{t} WHERE event_id = $1::text::uuid"
            ),
            &[&kept[0].0],
        )
        .await;
    assert!(duplicate.is_err(), "a duplicate event_id must fail");
    sql(c, "ROLLBACK TO SAVEPOINT s5").await;
    kept.push(emit(c, t, "invoice", "i1").await);
    sql(c, "COMMIT").await;

    // A rolled-back transaction, then a committed one: the stream goes on.
    sql(c, "BEGIN").await;
    emit(c, t, "order", "a3").await;
    sql(c, "ROLLBACK").await;
    sql(c, "BEGIN").await;
    kept.push(emit(c, t, "order", "a1").await);
    kept.push(emit(c, t, "order", "a3").await);
    sql(c, "COMMIT").await;

    // The database agrees: the rolled-back rows do not exist.
    let ids: Vec<String> = rolled_back.iter().map(|r| r.0.clone()).collect();
    let stored: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM public.{t} WHERE event_id::text = ANY($1)"),
            &[&ids],
        )
        .await
        .expect("count rolled-back rows")
        .get(0);
    assert_eq!(stored, 0, "rolled-back rows in the table");

    let records = consume(&fx.topic_prefix, kept.len(), TIMEOUT, SETTLE);
    assert_exactly_in_order(&fx, &records, &kept, &rolled_back);

    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// The same on a list-partitioned outbox published by leaf names: a
/// savepoint that wrote the only rows of a partition in the transaction, and
/// one that created a partition and wrote to it, are rolled back; the
/// partition's first committed row later arrives with its own relation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_savepoints_on_a_partitioned_outbox() {
    common::init_tracing();
    let fx = Fixture::new("savepart").await;
    let (c, t, p) = (&fx.admin, fx.table.as_str(), fx.publication.as_str());
    sql(
        c,
        &format!(
            "DROP PUBLICATION {p}; DROP TABLE public.{t};
             CREATE TABLE public.{t} (
                 event_id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
                 aggregate_sequence bigint NOT NULL, event_type text NOT NULL,
                 schema_version integer NOT NULL DEFAULT 1, payload jsonb NOT NULL,
                 occurred_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (event_id, aggregate_type)
             ) PARTITION BY LIST (aggregate_type);
             CREATE TABLE public.{t}_order PARTITION OF public.{t} FOR VALUES IN ('order');
             CREATE TABLE public.{t}_invoice PARTITION OF public.{t} FOR VALUES IN ('invoice');
             GRANT SELECT ON public.{t} TO outbox;
             CREATE PUBLICATION {p} FOR TABLE public.{t} WITH (publish = 'insert');"
        ),
    )
    .await;
    let running = Running::start(fx.config()).await;
    let mut kept = Vec::new();
    let mut rolled_back = Vec::new();

    sql(c, "BEGIN").await;
    kept.push(emit(c, t, "order", "a1").await);
    sql(c, "SAVEPOINT s1").await;
    // The invoice partition's only rows in this transaction.
    rolled_back.push(emit(c, t, "invoice", "i1").await);
    rolled_back.push(emit(c, t, "invoice", "i2").await);
    rolled_back.push(emit(c, t, "order", "a1").await);
    sql(c, "ROLLBACK TO SAVEPOINT s1").await;
    sql(c, "SAVEPOINT s2").await;
    // A partition created and written in a savepoint that is rolled back.
    sql(
        c,
        &format!("CREATE TABLE public.{t}_refund PARTITION OF public.{t} FOR VALUES IN ('refund')"),
    )
    .await;
    rolled_back.push(emit(c, t, "refund", "r1").await);
    sql(c, "ROLLBACK TO SAVEPOINT s2").await;
    kept.push(emit(c, t, "order", "a1").await);
    sql(c, "COMMIT").await;

    sql(c, "BEGIN").await;
    kept.push(emit(c, t, "invoice", "i1").await);
    sql(c, "SAVEPOINT s3").await;
    rolled_back.push(emit(c, t, "order", "a1").await);
    sql(c, "ROLLBACK TO SAVEPOINT s3").await;
    kept.push(emit(c, t, "order", "a1").await);
    kept.push(emit(c, t, "invoice", "i2").await);
    sql(c, "COMMIT").await;

    let records = consume(&fx.topic_prefix, kept.len(), TIMEOUT, SETTLE);
    assert_exactly_in_order(&fx, &records, &kept, &rolled_back);
    let refund_topic = format!("{}.refund", fx.topic_prefix);
    assert_eq!(
        topic_partitions(&refund_topic),
        None,
        "topic {refund_topic} created for a rolled-back row"
    );

    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}
