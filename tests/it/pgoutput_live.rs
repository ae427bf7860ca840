//! The decoder against a live PostgreSQL: a workload of inserts, updates,
//! deletes, a truncate, an ALTER TABLE mid-stream, logical decoding messages,
//! a commit and a rollback, read back through a pgoutput slot in one decoding
//! session (as a replication stream would deliver it) and checked message by
//! message.
//!
//! Everything runs in a database of its own, because a slot also receives the
//! logical decoding messages of every other session in its database.

use crate::common;

use std::panic::AssertUnwindSafe;

use bytes::Bytes;
use futures_util::FutureExt;
use outbox_cdc::pg::Lsn;
use outbox_cdc::pgoutput::{
    Begin, ColumnValue, Message, OldTuple, Relation, RelationCache, TupleData, decode,
};
use tokio_postgres::{Client, NoTls};

struct Names {
    database: String,
    slot: String,
    publication: String,
}

#[tokio::test]
async fn decodes_the_exact_stream_of_a_committed_and_rolled_back_workload() {
    common::init_tracing();
    let admin = common::admin_client().await;
    let names = Names {
        database: common::unique_name("pgoutput_live"),
        slot: common::unique_name("pgoutput_live_slot"),
        publication: common::unique_name("pgoutput_live_pub"),
    };
    admin
        .batch_execute(&format!("CREATE DATABASE {}", names.database))
        .await
        .expect("CREATE DATABASE");

    let outcome = AssertUnwindSafe(run(&names)).catch_unwind().await;

    // The slot pins WAL and blocks DROP DATABASE: always remove both.
    let dropped_slot = admin
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&names.slot],
        )
        .await;
    let dropped_db = admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            names.database
        ))
        .await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    dropped_slot.expect("dropping the slot");
    dropped_db.expect("dropping the database");
}

async fn connect(database: &str) -> Client {
    let mut config: tokio_postgres::Config =
        common::pg_admin_url().parse().expect("admin URL parses");
    config.dbname(database);
    let (client, conn) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to database {database}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// The lower 32 bits of the current transaction's xid8: what Begin carries.
async fn current_xid(tx: &tokio_postgres::Transaction<'_>) -> u32 {
    let full: i64 = tx
        .query_one("SELECT pg_current_xact_id()::text::bigint", &[])
        .await
        .expect("pg_current_xact_id")
        .get(0);
    (full & 0xFFFF_FFFF) as u32
}

async fn run(names: &Names) {
    let mut db = connect(&names.database).await;
    db.batch_execute(&format!(
        "CREATE TABLE orders (id integer PRIMARY KEY, status text NOT NULL, amount numeric(10,2));
         CREATE TABLE audit (id bigint, note text);
         ALTER TABLE audit REPLICA IDENTITY FULL;
         CREATE TABLE unpublished (id integer PRIMARY KEY);
         CREATE PUBLICATION {pub} FOR TABLE orders, audit;",
        pub = names.publication
    ))
    .await
    .expect("schema");
    db.query_one(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&names.slot],
    )
    .await
    .expect("create slot");

    // Committed transaction ids in commit order, to compare with Begin.xid.
    let mut xids = Vec::new();

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute("INSERT INTO orders VALUES (1, 'new', 10.50), (2, 'new', NULL)")
        .await
        .expect("insert");
    xids.push(current_xid(&tx).await);
    tx.commit().await.expect("commit");

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute(
        "UPDATE orders SET status = 'paid' WHERE id = 1;
         UPDATE orders SET id = 20 WHERE id = 2;",
    )
    .await
    .expect("update");
    xids.push(current_xid(&tx).await);
    tx.commit().await.expect("commit");

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute(
        "INSERT INTO audit VALUES (7, 'created');
         UPDATE audit SET note = 'updated' WHERE id = 7;
         DELETE FROM audit WHERE id = 7;
         INSERT INTO unpublished VALUES (1);",
    )
    .await
    .expect("audit");
    xids.push(current_xid(&tx).await);
    tx.commit().await.expect("commit");

    // Only an unpublished table: pgoutput sends nothing, not even Begin/Commit.
    db.batch_execute("INSERT INTO unpublished VALUES (2)")
        .await
        .expect("unpublished");

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute("DELETE FROM orders WHERE id = 20")
        .await
        .expect("delete");
    xids.push(current_xid(&tx).await);
    tx.commit().await.expect("commit");

    db.batch_execute("ALTER TABLE orders ADD COLUMN note text")
        .await
        .expect("alter");

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute("INSERT INTO orders VALUES (3, 'new', 1, 'after alter')")
        .await
        .expect("insert after alter");
    xids.push(current_xid(&tx).await);
    tx.commit().await.expect("commit");

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute(
        "INSERT INTO orders (id, status) VALUES (4, 'new');
         SELECT pg_logical_emit_message(true, 'live', 'in the transaction');",
    )
    .await
    .expect("transactional message");
    xids.push(current_xid(&tx).await);
    tx.commit().await.expect("commit");

    db.batch_execute("SELECT pg_logical_emit_message(false, 'live', 'on its own')")
        .await
        .expect("non-transactional message");

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute(
        "INSERT INTO orders (id, status) VALUES (99, 'rolled back');
         UPDATE orders SET status = 'rolled back' WHERE id = 1;
         SELECT pg_logical_emit_message(true, 'live', 'rolled back');",
    )
    .await
    .expect("work to roll back");
    tx.rollback().await.expect("rollback");

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute("TRUNCATE audit").await.expect("truncate");
    xids.push(current_xid(&tx).await);
    tx.commit().await.expect("commit");

    let tx = db.transaction().await.expect("begin");
    tx.batch_execute("INSERT INTO orders (id, status) VALUES (5, 'after rollback')")
        .await
        .expect("insert after rollback");
    xids.push(current_xid(&tx).await);
    tx.commit().await.expect("commit");

    let version: i32 = db
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server_version_num")
        .get(0);
    // pgoutput decodes logical decoding messages from PostgreSQL 14 on (13
    // refuses the option).
    let messages = version >= 140000;
    // One call = one decoding session, like one replication connection.
    let rows = db
        .query(
            &format!(
                "SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL, \
                 'proto_version', '1', 'publication_names', $2{})",
                if messages { ", 'messages', 'true'" } else { "" }
            ),
            &[&names.slot, &names.publication],
        )
        .await
        .expect("pg_logical_slot_get_binary_changes");
    let mut stream: Vec<(Lsn, Message)> = rows
        .iter()
        .map(|row| {
            let lsn: Lsn = row.get::<_, String>(0).parse().expect("lsn");
            let data: Vec<u8> = row.get(1);
            let message = decode(&Bytes::from(data)).unwrap_or_else(|e| panic!("at {lsn}: {e}"));
            (lsn, message)
        })
        .collect();
    if version < 150000 {
        // Before 15, pgoutput also sends the transactions that changed no
        // published table (here: the unpublished insert and the ALTER TABLE),
        // as a Begin directly followed by its Commit.
        let all = stream.len();
        stream = without_empty_transactions(stream);
        assert_eq!(
            all - stream.len(),
            4,
            "PostgreSQL {version}: two empty transactions"
        );
    }

    check_transactions(&stream, &xids);

    let mut cache = RelationCache::new();
    let got: Vec<String> = stream
        .iter()
        .map(|(_, m)| describe(m, &mut cache))
        .collect();
    let expected = [
        "B",
        "R public.orders d [id* int4, status text, amount numeric(10,2)]",
        "I orders new=[1, new, 10.50]",
        "I orders new=[2, new, NULL]",
        "C",
        "B",
        "U orders new=[1, paid, 10.50]",
        "U orders old=K[2, NULL, NULL] new=[20, new, NULL]",
        "C",
        "B",
        "R public.audit f [id* int8, note* text]",
        "I audit new=[7, created]",
        "U audit old=O[7, created] new=[7, updated]",
        "D audit old=O[7, updated]",
        "C",
        "B",
        "D orders old=K[20, NULL, NULL]",
        "C",
        "B",
        "R public.orders d [id* int4, status text, amount numeric(10,2), note text]",
        "I orders new=[3, new, 1.00, after alter]",
        "C",
        "B",
        "I orders new=[4, new, NULL, NULL]",
        "M transactional live: in the transaction",
        "C",
        "M non-transactional live: on its own",
        "B",
        // TRUNCATE gives the table a new file, which invalidates pgoutput's
        // cached schema: the same Relation is sent again.
        "R public.audit f [id* int8, note* text]",
        "T [audit] cascade=false restart_identity=false",
        "C",
        "B",
        "I orders new=[5, after rollback, NULL, NULL]",
        "C",
    ];
    let expected: Vec<&str> = expected
        .into_iter()
        .filter(|line| messages || !line.starts_with("M "))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(cache.len(), 2);
}

/// The stream without Begin/Commit pairs that hold nothing.
fn without_empty_transactions(stream: Vec<(Lsn, Message)>) -> Vec<(Lsn, Message)> {
    let mut out: Vec<(Lsn, Message)> = Vec::with_capacity(stream.len());
    for (lsn, m) in stream {
        if matches!(m, Message::Commit(_)) && matches!(out.last(), Some((_, Message::Begin(_)))) {
            out.pop();
            continue;
        }
        out.push((lsn, m));
    }
    out
}

/// Begin/Commit pairs: matching LSNs and times, the xids the transactions
/// reported, commits moving forward, nothing outside a transaction but
/// non-transactional messages.
fn check_transactions(stream: &[(Lsn, Message)], xids: &[u32]) {
    let mut open: Option<Begin> = None;
    let mut seen_xids = Vec::new();
    let mut last_end = Lsn::ZERO;
    for (lsn, m) in stream {
        match m {
            Message::Begin(b) => {
                assert!(open.is_none(), "Begin at {lsn} inside a transaction");
                seen_xids.push(b.xid);
                open = Some(*b);
            }
            Message::Commit(c) => {
                let b = open
                    .take()
                    .unwrap_or_else(|| panic!("Commit at {lsn} without Begin"));
                assert_eq!(c.flags, 0);
                assert_eq!(b.final_lsn, c.commit_lsn);
                assert_eq!(b.commit_time, c.commit_time);
                assert!(c.end_lsn > c.commit_lsn);
                assert_eq!(c.end_lsn, *lsn, "a Commit is reported at its end LSN");
                assert!(c.end_lsn > last_end, "commits move forward");
                last_end = c.end_lsn;
            }
            Message::Message(msg) if !msg.transactional => {
                assert!(
                    open.is_none(),
                    "non-transactional message inside a transaction"
                );
                assert_eq!(msg.lsn, *lsn);
            }
            other => assert!(open.is_some(), "{other:?} at {lsn} outside a transaction"),
        }
    }
    assert!(open.is_none(), "the stream ends inside a transaction");
    assert_eq!(
        seen_xids, xids,
        "one Begin per committed transaction, in order"
    );
}

/// One line per message; changes are resolved to names through the cache.
fn describe(m: &Message, cache: &mut RelationCache) -> String {
    let name = |cache: &RelationCache, oid: u32| -> String {
        cache
            .get(oid)
            .unwrap_or_else(|| panic!("relation {oid} used before its Relation message"))
            .name
            .clone()
    };
    match m {
        Message::Begin(_) => "B".to_owned(),
        Message::Commit(_) => "C".to_owned(),
        Message::Relation(r) => {
            let line = format!(
                "R {} {} [{}]",
                r.qualified_name(),
                char::from(r.replica_identity),
                columns(r)
            );
            cache.apply(r.clone());
            line
        }
        Message::Insert(i) => {
            let rel = cache.get(i.relation_oid);
            if let Some(rel) = rel {
                // Access by name agrees with position.
                assert_eq!(rel.value(&i.new, "id"), i.new.get(0));
            }
            format!("I {} new={}", name(cache, i.relation_oid), row(&i.new))
        }
        Message::Update(u) => {
            let old = match &u.old {
                None => String::new(),
                Some(old) => format!("old={} ", old_row(old)),
            };
            format!("U {} {old}new={}", name(cache, u.relation_oid), row(&u.new))
        }
        Message::Delete(d) => format!("D {} old={}", name(cache, d.relation_oid), old_row(&d.old)),
        Message::Truncate(t) => {
            let tables: Vec<String> = t.relation_oids.iter().map(|o| name(cache, *o)).collect();
            format!(
                "T [{}] cascade={} restart_identity={}",
                tables.join(", "),
                t.cascade(),
                t.restart_identity()
            )
        }
        Message::Message(msg) => format!(
            "M {} {}: {}",
            if msg.transactional {
                "transactional"
            } else {
                "non-transactional"
            },
            msg.prefix,
            String::from_utf8_lossy(&msg.content)
        ),
        other => format!("unexpected {other:?}"),
    }
}

fn columns(r: &Relation) -> String {
    r.columns
        .iter()
        .map(|c| {
            let ty = match (c.type_oid, c.type_modifier) {
                (23, -1) => "int4".to_owned(),
                (20, -1) => "int8".to_owned(),
                (25, -1) => "text".to_owned(),
                // numeric typmod: ((precision << 16) | scale) + VARHDRSZ
                (1700, m) if m >= 4 => format!("numeric({},{})", (m - 4) >> 16, (m - 4) & 0xFFFF),
                (oid, m) => format!("{oid}/{m}"),
            };
            format!("{}{} {ty}", c.name, if c.is_key() { "*" } else { "" })
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn row(t: &TupleData) -> String {
    let values: Vec<String> = t
        .columns
        .iter()
        .map(|v| match v {
            ColumnValue::Null => "NULL".to_owned(),
            ColumnValue::UnchangedToast => "<unchanged toast>".to_owned(),
            ColumnValue::Text(b) => String::from_utf8_lossy(b).into_owned(),
            ColumnValue::Binary(b) => format!("{b:?}"),
        })
        .collect();
    format!("[{}]", values.join(", "))
}

fn old_row(old: &OldTuple) -> String {
    match old {
        OldTuple::Key(t) => format!("K{}", row(t)),
        OldTuple::Full(t) => format!("O{}", row(t)),
    }
}
