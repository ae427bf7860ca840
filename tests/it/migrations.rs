//! The SQL migrations, applied twice to a fresh database of the test cluster:
//! they are idempotent, `outbox_emit` numbers each aggregate 1, 2, 3, ... in
//! commit order, and the publication carries inserts into the outbox table only.

use crate::common;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio_postgres::{Client, NoTls};

fn migration_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "expected the migrations in {}, found {files:?}",
        dir.display()
    );
    files
}

async fn connect_to(db: &str) -> Client {
    let mut config: tokio_postgres::Config = common::pg_admin_url()
        .parse()
        .expect("OUTBOX_CDC_TEST_PG_ADMIN is a PostgreSQL URL");
    config.dbname(db);
    let (client, conn) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to database {db}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Emits one event for aggregate (`order`, `aggregate_id`) and returns its sequence number.
async fn emit(client: &Client, aggregate_id: &str) -> i64 {
    let event_id: String = client
        .query_one(
            "SELECT public.outbox_emit('order', $1, 'OrderTouched', '{\"n\": 1}'::jsonb)::text",
            &[&aggregate_id],
        )
        .await
        .expect("outbox_emit")
        .get(0);
    client
        .query_one(
            "SELECT aggregate_sequence FROM public.outbox_events WHERE event_id = $1::text::uuid",
            &[&event_id],
        )
        .await
        .expect("the emitted row")
        .get(0)
}

async fn sequences(client: &Client, aggregate_id: &str) -> Vec<i64> {
    client
        .query(
            "SELECT aggregate_sequence FROM public.outbox_events \
             WHERE aggregate_type = 'order' AND aggregate_id = $1 ORDER BY aggregate_sequence",
            &[&aggregate_id],
        )
        .await
        .expect("select sequences")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn check_migrations(db: &str, slot: &str) {
    let client = connect_to(db).await;
    for pass in 1..=2 {
        for file in migration_files() {
            let sql = std::fs::read_to_string(&file).expect("read migration");
            client
                .batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("pass {pass}: {} failed: {e:?}", file.display()));
        }
    }

    // Per-aggregate numbering, interleaved aggregates.
    let mut got = Vec::new();
    for id in ["a", "a", "b", "a", "b"] {
        got.push(emit(&client, id).await);
    }
    assert_eq!(got, [1, 2, 1, 3, 2]);
    assert_eq!(sequences(&client, "a").await, [1, 2, 3]);
    assert_eq!(sequences(&client, "b").await, [1, 2]);

    // A rolled-back emit gives its number back.
    client.batch_execute("BEGIN").await.unwrap();
    assert_eq!(emit(&client, "a").await, 4);
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(emit(&client, "a").await, 4);

    // A second writer of the same aggregate waits for the first to commit and
    // then gets the next number: numbers follow commit order.
    client.batch_execute("BEGIN").await.unwrap();
    assert_eq!(emit(&client, "c").await, 1);
    let second = connect_to(db).await;
    let waiter = tokio::spawn(async move { emit(&second, "c").await });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&db],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second writer never waited for the aggregate lock"
        );
        assert!(
            !waiter.is_finished(),
            "the second writer did not wait for the first to commit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.batch_execute("COMMIT").await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("second writer finished after the first committed")
        .expect("second writer task");
    assert_eq!(next, 2);

    // The publication: inserts only, outbox table only.
    let row = client
        .query_one(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate \
             FROM pg_publication WHERE pubname = 'outbox_pub'",
            &[],
        )
        .await
        .expect("publication outbox_pub exists");
    let flags: (bool, bool, bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    assert_eq!(
        flags,
        (false, true, false, false, false),
        "(all tables, insert, update, delete, truncate)"
    );
    let tables: Vec<String> = client
        .query(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'outbox_pub'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(tables, ["public.outbox_events"]);
    // The inbox's retention DELETE is served by an index (review F5).
    let index: bool = client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_indexes WHERE schemaname = 'public' \
             AND tablename = 'processed_events' AND indexdef LIKE '%(processed_at)%')",
            &[],
        )
        .await
        .expect("read pg_indexes")
        .get(0);
    assert!(index, "no index on processed_events.processed_at");
    let outbox_role: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // scripts/env.sh creates the role before applying the migrations.
    assert!(outbox_role, "the test cluster has no role outbox");
    {
        let can_read: bool = client
            .query_one(
                "SELECT has_table_privilege('outbox', 'public.outbox_events', 'SELECT')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            can_read,
            "role outbox was not granted SELECT on outbox_events"
        );
    }

    // What the relay sees: the insert of the insert-then-delete writer pattern,
    // and nothing of the business table, the delete or a cleanup.
    client
        .query_one(
            "SELECT 1 FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .expect("create slot");
    client
        .batch_execute(
            "BEGIN;
             INSERT INTO public.orders (order_id, customer, amount_cents) VALUES ('o-1', 'c-1', 1200);
             DO $$ DECLARE v uuid; BEGIN
                 v := public.outbox_emit('order', 'o-1', 'OrderCreated', '{\"amount_cents\": 1200}');
                 DELETE FROM public.outbox_events WHERE event_id = v;
             END $$;
             COMMIT;
             DELETE FROM public.outbox_events WHERE aggregate_id = 'a';
             UPDATE public.outbox_events SET event_type = 'Changed' WHERE aggregate_id = 'b';",
        )
        .await
        .expect("writer pattern");
    let tags: Vec<String> = client
        .query(
            "SELECT chr(get_byte(data, 0)) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
             'proto_version', '1', 'publication_names', 'outbox_pub')",
            &[&slot],
        )
        .await
        .expect("peek changes")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let changes: Vec<&str> = tags
        .iter()
        .map(String::as_str)
        .filter(|t| matches!(*t, "I" | "U" | "D" | "T"))
        .collect();
    assert_eq!(changes, ["I"], "all messages: {tags:?}");
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM public.outbox_events WHERE aggregate_id = 'o-1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the writer pattern leaves the outbox table empty");
}

#[tokio::test]
async fn migrations_are_idempotent_and_set_up_the_outbox() {
    common::init_tracing();
    let admin = common::admin_client().await;
    let db = common::unique_name("outbox_migrations");
    let slot = common::unique_name("mig_slot");
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {db}: {e}"));

    let outcome = AssertUnwindSafe(check_migrations(&db, &slot))
        .catch_unwind()
        .await;

    admin
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap_or_else(|e| panic!("drop slot {slot}: {e}"));
    admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await
        .unwrap_or_else(|e| panic!("DROP DATABASE {db}: {e}"));
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
