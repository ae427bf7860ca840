//! Control-plane SQL and slot errors against a real PostgreSQL: slot
//! lifecycle and inspection, publications with hostile names, WAL position,
//! and the typed errors for a slot held by another backend or missing.

use crate::common;

use std::time::Duration;

use outbox_cdc::Disposition;
use outbox_cdc::pg::control;
use outbox_cdc::pg::{
    Lsn, PgConnectConfig, PgError, QualifiedTable, ReplicationConnection, quote_ident,
};

const WAIT: Duration = Duration::from_secs(60);

fn outbox_config() -> PgConnectConfig {
    PgConnectConfig::parse(&common::pg_url()).expect("OUTBOX_CDC_TEST_PG parses")
}

/// The `outbox` role over our own transport (SCRAM, sslmode as in the URL).
async fn outbox_sql() -> tokio_postgres::Client {
    tokio::time::timeout(WAIT, outbox_config().connect_sql())
        .await
        .expect("connect within the deadline")
        .expect("connect_sql as outbox")
}

#[tokio::test]
async fn slot_lifecycle_and_inspection() {
    common::init_tracing();
    let client = outbox_sql().await;
    let slot = common::unique_name("ctl_slot");
    assert_eq!(control::slot_info(&client, &slot).await.unwrap(), None);

    let before = control::current_wal_lsn(&client).await.unwrap();
    let consistent = control::create_logical_slot(&client, &slot)
        .await
        .expect("create slot");
    assert!(
        consistent >= before,
        "consistent point {consistent} before {before}"
    );

    let info = control::slot_info(&client, &slot)
        .await
        .unwrap()
        .expect("slot listed");
    let db: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(info.slot_name, slot);
    assert_eq!(info.plugin.as_deref(), Some("pgoutput"));
    assert_eq!(info.database.as_deref(), Some(db.as_str()));
    assert_eq!(info.active_pid, None);
    assert_eq!(info.confirmed_flush_lsn, Some(consistent));
    assert!(info.restart_lsn.is_some_and(|r| r <= consistent));
    assert_eq!(info.wal_status.as_deref(), Some("reserved"));
    // NULL unless max_slot_wal_keep_size is set; then the bytes still writable.
    let keep_size: String = client
        .query_one("SELECT current_setting('max_slot_wal_keep_size')", &[])
        .await
        .unwrap()
        .get(0);
    if keep_size == "-1" {
        assert_eq!(info.safe_wal_size, None);
    } else {
        assert!(
            info.safe_wal_size.is_some_and(|b| b > 0),
            "max_slot_wal_keep_size = {keep_size}, safe_wal_size {:?}",
            info.safe_wal_size
        );
    }

    match control::create_logical_slot(&client, &slot).await {
        Err(e @ PgError::SlotExists { .. }) => {
            assert_eq!(e.disposition(), Disposition::Stop);
            assert_eq!(e.sqlstate(), Some("42710"));
        }
        other => panic!("expected SlotExists, got {other:?}"),
    }

    control::drop_slot(&client, &slot).await.expect("drop slot");
    assert_eq!(control::slot_info(&client, &slot).await.unwrap(), None);
    match control::drop_slot(&client, &slot).await {
        Err(e @ PgError::SlotMissing { .. }) => assert_eq!(e.disposition(), Disposition::Stop),
        other => panic!("expected SlotMissing, got {other:?}"),
    }
}

#[tokio::test]
async fn current_wal_lsn_moves_forward_and_system_identifier_reads() {
    common::init_tracing();
    let admin = common::admin_client().await;
    let a = control::current_wal_lsn(&admin).await.unwrap();
    admin
        .batch_execute("CREATE TEMP TABLE wal_probe AS SELECT generate_series(1, 1000) AS n")
        .await
        .unwrap();
    let b = control::current_wal_lsn(&admin).await.unwrap();
    assert!(b > a, "{b} should be after {a}");
    assert!(b.bytes_since(a) > 0);
    let id = control::system_identifier(&admin).await.unwrap();
    assert!(
        id.parse::<u64>().is_ok(),
        "system identifier {id:?} is a u64"
    );
}

#[tokio::test]
async fn publication_names_cannot_inject_sql() {
    common::init_tracing();
    let admin = common::admin_client().await;
    let schema = format!("{} \"s\"", common::unique_name("Ctl"));
    let table = QualifiedTable::new(schema.clone(), "outbox\"; DROP TABLE x; --");
    let publication = format!("{} pub'; DROP", common::unique_name("P"));
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {}; CREATE TABLE {table} (id int PRIMARY KEY)",
            quote_ident(&schema)
        ))
        .await
        .expect("create hostile schema and table");

    assert!(
        !control::publication_exists(&admin, &publication)
            .await
            .unwrap()
    );
    control::create_publication(&admin, &publication, &table, false)
        .await
        .expect("create publication");
    assert!(
        control::publication_exists(&admin, &publication)
            .await
            .unwrap()
    );

    let row = admin
        .query_one(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&publication],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), table.schema);
    assert_eq!(row.get::<_, String>(1), table.name);
    let (ins, upd, del): (bool, bool, bool) = {
        let r = admin
            .query_one(
                "SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = $1",
                &[&publication],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        (ins, upd, del),
        (true, false, false),
        "publish = 'insert' only"
    );

    // Creating it twice is a definite error from the server, not a retry.
    let err = control::create_publication(&admin, &publication, &table, false)
        .await
        .expect_err("duplicate publication");
    assert_eq!(err.sqlstate(), Some("42710"));
    assert_eq!(err.disposition(), Disposition::Stop);

    admin
        .batch_execute(&format!(
            "DROP PUBLICATION {}; DROP SCHEMA {} CASCADE",
            quote_ident(&publication),
            quote_ident(&schema)
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn slot_held_by_another_backend_is_slot_active_with_its_pid() {
    common::init_tracing();
    let admin = common::admin_client().await;
    let slot = common::unique_name("ctl_active");
    let publication = common::unique_name("ctl_active_pub");
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} ",
            quote_ident(&publication)
        ))
        .await
        .unwrap();
    control::create_logical_slot(&admin, &slot).await.unwrap();

    let holder = ReplicationConnection::connect(&outbox_config(), "outbox-cdc-holder")
        .await
        .unwrap();
    let holder_pid = holder.backend_pid().expect("backend pid");
    let stream = holder
        .start_logical(&slot, Lsn::ZERO, &publication, false)
        .await
        .expect("first stream");

    let second = ReplicationConnection::connect(&outbox_config(), "outbox-cdc-second")
        .await
        .unwrap();
    match second
        .start_logical(&slot, Lsn::ZERO, &publication, false)
        .await
    {
        Err(e @ PgError::SlotActive { .. }) => {
            let PgError::SlotActive {
                pid, slot: ref s, ..
            } = e
            else {
                unreachable!()
            };
            assert_eq!(pid, Some(holder_pid));
            assert_eq!(s, &slot);
            assert_eq!(
                e.disposition(),
                Disposition::Retry,
                "another instance may let go of the slot"
            );
            assert!(e.to_string().contains(&holder_pid.to_string()), "{e}");
        }
        Err(other) => panic!("expected SlotActive, got {other}"),
        Ok(_) => panic!("a second stream on an active slot must fail"),
    }
    match control::drop_slot(&admin, &slot).await {
        Err(PgError::SlotActive { pid, .. }) => assert_eq!(pid, Some(holder_pid)),
        other => panic!("expected SlotActive from drop, got {other:?}"),
    }

    stream.shutdown().await.expect("clean shutdown");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match control::drop_slot(&admin, &slot).await {
            Ok(()) => break,
            Err(PgError::SlotActive { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("drop after shutdown: {e}"),
        }
    }
    admin
        .batch_execute(&format!("DROP PUBLICATION {}", quote_ident(&publication)))
        .await
        .unwrap();
}

#[tokio::test]
async fn missing_slot_is_slot_missing() {
    common::init_tracing();
    let conn = ReplicationConnection::connect(&outbox_config(), "outbox-cdc-missing")
        .await
        .unwrap();
    let slot = common::unique_name("ctl_missing");
    match conn.start_logical(&slot, Lsn::ZERO, "nopub", true).await {
        Err(e @ PgError::SlotMissing { .. }) => {
            assert_eq!(e.disposition(), Disposition::Stop);
            assert_eq!(e.sqlstate(), Some("42704"));
            assert!(e.to_string().contains(&slot), "{e}");
        }
        Err(other) => panic!("expected SlotMissing, got {other}"),
        Ok(_) => panic!("streaming from a missing slot must fail"),
    }
}
