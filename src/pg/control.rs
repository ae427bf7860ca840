//! Control-plane SQL on a tokio-postgres client: slots, publications, WAL
//! position and the cluster's identity. Names travel as bind parameters where
//! SQL allows it and as quoted identifiers where it does not (DDL).

use tokio_postgres::Client;
use tokio_postgres::types::{FromSql, ToSql};

use super::Lsn;
use super::error::{PgError, ServerError};
use super::ident::QualifiedTable;

/// A row of pg_replication_slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    pub slot_name: String,
    pub plugin: Option<String>,
    pub database: Option<String>,
    /// The backend streaming from the slot, if any.
    pub active_pid: Option<i32>,
    pub confirmed_flush_lsn: Option<Lsn>,
    pub restart_lsn: Option<Lsn>,
    /// reserved, extended, unreserved or lost.
    pub wal_status: Option<String>,
    /// Bytes of WAL that can still be written before the slot is lost.
    pub safe_wal_size: Option<i64>,
}

fn server_error(e: &tokio_postgres::Error) -> Option<ServerError> {
    let db = e.as_db_error()?;
    Some(ServerError {
        severity: db
            .parsed_severity()
            .map_or_else(|| db.severity().to_owned(), |s| s.to_string()),
        code: db.code().code().to_owned(),
        message: db.message().to_owned(),
        detail: db.detail().map(str::to_owned),
        hint: db.hint().map(str::to_owned),
    })
}

/// Lifts the slot SQLSTATEs into typed variants; any other failure keeps
/// the tokio-postgres error.
fn slot_sql_error(slot: &str, during: &str, e: tokio_postgres::Error) -> PgError {
    let failed = |e| PgError::sql(format!("{during} replication slot {slot:?}"), e);
    match server_error(&e) {
        Some(server) => PgError::from_slot_response(slot, server, |_| failed(e)),
        None => failed(e),
    }
}

fn parse_lsn(text: &str, what: &'static str) -> Result<Lsn, PgError> {
    text.parse().map_err(|e| PgError::BadReply {
        addr: "control connection".into(),
        command: what,
        message: format!("{e}"),
    })
}

/// Creates a logical slot with pgoutput; returns its consistent point (the
/// first position the slot will decode from).
pub async fn create_logical_slot(client: &Client, slot: &str) -> Result<Lsn, PgError> {
    create_logical_slot_with(client, slot, false).await
}

/// [`create_logical_slot`], with `failover` (PostgreSQL 17+: the slot is
/// synchronised to standbys that set `sync_replication_slots`).
pub async fn create_logical_slot_with(
    client: &Client,
    slot: &str,
    failover: bool,
) -> Result<Lsn, PgError> {
    // (name, plugin, temporary, twophase, failover): the five-argument form exists from 17 on.
    let sql = if failover {
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
    } else {
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
    };
    let row = client
        .query_one(sql, &[&slot])
        .await
        .map_err(|e| slot_sql_error(slot, "creating", e))?;
    let lsn: String = row
        .try_get(0)
        .map_err(|e| PgError::sql("reading the new slot's LSN", e))?;
    parse_lsn(&lsn, "pg_create_logical_replication_slot")
}

/// How an instance holds its slot's advisory lock (audit F6): `Starting`
/// (shared) from reading the slot until START_REPLICATION made the slot
/// its own; `Repairing` (exclusive) for a whole gap repair, during which the
/// recreated slot is inactive and a peer would otherwise stream from it
/// before the repaired older rows are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotLock {
    Starting,
    Repairing,
}

/// The advisory lock key of `slot` (a bigint, one per slot name).
const SLOT_LOCK_KEY: &str = "hashtextextended('outbox-cdc slot ' || $1, 0)";

/// The first column of the one row `sql` returns. Both ways it can fail (no
/// single row, a column of another type) come back as the client's error, for
/// the caller to name what it was reading.
pub(crate) async fn query_value<T: for<'r> FromSql<'r>>(
    client: &Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<T, tokio_postgres::Error> {
    client.query_one(sql, params).await?.try_get(0)
}

/// Tries to take `slot`'s advisory lock in `mode` on this session (held
/// until [`unlock_slot`] or the connection ends); `false` when another
/// session holds it in a conflicting mode. Advisory locks work on a standby too.
pub async fn try_lock_slot(client: &Client, slot: &str, mode: SlotLock) -> Result<bool, PgError> {
    let function = match mode {
        SlotLock::Starting => "pg_try_advisory_lock_shared",
        SlotLock::Repairing => "pg_try_advisory_lock",
    };
    let sql = format!("SELECT {function}({SLOT_LOCK_KEY})");
    query_value(client, &sql, &[&slot])
        .await
        .map_err(|e| PgError::sql("taking the slot's advisory lock", e))
}

/// Releases what [`try_lock_slot`] took in `mode`.
pub async fn unlock_slot(client: &Client, slot: &str, mode: SlotLock) -> Result<(), PgError> {
    let function = match mode {
        SlotLock::Starting => "pg_advisory_unlock_shared",
        SlotLock::Repairing => "pg_advisory_unlock",
    };
    client
        .query_one(&format!("SELECT {function}({SLOT_LOCK_KEY})"), &[&slot])
        .await
        .map_err(|e| PgError::sql("releasing the slot's advisory lock", e))?;
    Ok(())
}

/// The server's kind, as `target_session_attrs` judges it.
pub async fn server_kind(client: &Client) -> Result<super::config::ServerKind, PgError> {
    let during = "asking the server's kind (target_session_attrs)";
    let row = client
        .query_one(super::config::ServerKind::QUERY, &[])
        .await
        .map_err(|e| PgError::sql(during, e))?;
    let text = |i: usize| -> Result<String, PgError> {
        row.try_get(i).map_err(|e| PgError::sql(during, e))
    };
    Ok(super::config::ServerKind::from_text(&text(0)?, &text(1)?))
}

/// Where transaction ids stand now: the next one to be assigned (64-bit,
/// epoch included; every transaction from it on starts later) and the
/// start of the oldest transaction still writing (PostgreSQL microseconds
/// since 2000-01-01; now when none is).
pub async fn xid_horizon(client: &Client) -> Result<(u64, i64), PgError> {
    let during = "reading the next transaction id (pg_current_snapshot())";
    let row = client
        .query_one(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8, \
             ((extract(epoch FROM least(now(), \
               (SELECT min(xact_start) FROM pg_stat_activity WHERE backend_xid IS NOT NULL), \
               (SELECT min(prepared) FROM pg_prepared_xacts))) - 946684800) * 1e6)::int8",
            &[],
        )
        .await
        .map_err(|e| PgError::sql(during, e))?;
    let get = |i: usize| {
        row.try_get::<_, i64>(i)
            .map_err(|e| PgError::sql(during, e))
    };
    Ok((get(0)? as u64, get(1)?))
}

/// Whether the server is a standby (in recovery).
pub async fn in_recovery(client: &Client) -> Result<bool, PgError> {
    query_value(client, "SELECT pg_is_in_recovery()", &[])
        .await
        .map_err(|e| PgError::sql("reading pg_is_in_recovery()", e))
}

/// `server_version_num`, e.g. 170004.
pub async fn server_version_num(client: &Client) -> Result<i32, PgError> {
    let sql = "SELECT current_setting('server_version_num')::int";
    query_value(client, sql, &[])
        .await
        .map_err(|e| PgError::sql("reading server_version_num", e))
}

pub async fn drop_slot(client: &Client, slot: &str) -> Result<(), PgError> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .map_err(|e| slot_sql_error(slot, "dropping", e))?;
    Ok(())
}

/// The slot's row, or `None` when no slot has that name.
pub async fn slot_info(client: &Client, slot: &str) -> Result<Option<SlotInfo>, PgError> {
    let during = || format!("reading replication slot {slot:?}");
    let row = client
        .query_opt(
            "SELECT slot_name::text, plugin::text, database::text, active_pid, \
                    confirmed_flush_lsn::text, restart_lsn::text, wal_status, safe_wal_size \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| PgError::sql(during(), e))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let lsn = |i: usize| -> Result<Option<Lsn>, PgError> {
        let text: Option<String> = row.try_get(i).map_err(|e| PgError::sql(during(), e))?;
        text.map(|t| parse_lsn(&t, "pg_replication_slots"))
            .transpose()
    };
    Ok(Some(SlotInfo {
        slot_name: row.try_get(0).map_err(|e| PgError::sql(during(), e))?,
        plugin: row.try_get(1).map_err(|e| PgError::sql(during(), e))?,
        database: row.try_get(2).map_err(|e| PgError::sql(during(), e))?,
        active_pid: row.try_get(3).map_err(|e| PgError::sql(during(), e))?,
        confirmed_flush_lsn: lsn(4)?,
        restart_lsn: lsn(5)?,
        wal_status: row.try_get(6).map_err(|e| PgError::sql(during(), e))?,
        safe_wal_size: row.try_get(7).map_err(|e| PgError::sql(during(), e))?,
    }))
}

/// The server's WAL position: where WAL is written on a primary, where it is
/// replayed on a standby.
pub async fn wal_position(client: &Client) -> Result<Lsn, PgError> {
    let sql = "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                          ELSE pg_current_wal_lsn() END)::text";
    let text: String = query_value(client, sql, &[])
        .await
        .map_err(|e| PgError::sql("reading the server's WAL position", e))?;
    parse_lsn(&text, "the WAL position")
}

pub async fn current_wal_lsn(client: &Client) -> Result<Lsn, PgError> {
    let text: String = query_value(client, "SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(|e| PgError::sql("reading pg_current_wal_lsn()", e))?;
    parse_lsn(&text, "pg_current_wal_lsn")
}

pub async fn publication_exists(client: &Client, publication: &str) -> Result<bool, PgError> {
    let sql = "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)";
    query_value(client, sql, &[&publication])
        .await
        .map_err(|e| PgError::sql(format!("looking up publication {publication:?}"), e))
}

/// `CREATE PUBLICATION` for the outbox, inserts only; a partitioned table is
/// published under its root's name.
pub fn create_publication_sql(
    publication: &str,
    table: &QualifiedTable,
    partitioned: bool,
) -> String {
    let via_root = if partitioned {
        ", publish_via_partition_root = true"
    } else {
        ""
    };
    format!(
        "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert'{via_root});",
        super::quote_ident(publication),
        table
    )
}

/// Creates the outbox publication, inserts only (the outbox is append-only);
/// a partitioned table is published under its root's name
/// ([`create_publication_sql`]).
pub async fn create_publication(
    client: &Client,
    publication: &str,
    table: &QualifiedTable,
    partitioned: bool,
) -> Result<(), PgError> {
    let sql = create_publication_sql(publication, table, partitioned);
    client.batch_execute(&sql).await.map_err(|e| {
        PgError::sql(
            format!("creating publication {publication:?} for {table}"),
            e,
        )
    })
}

/// The cluster's system identifier (decimal text, as IDENTIFY_SYSTEM reports it).
pub async fn system_identifier(client: &Client) -> Result<String, PgError> {
    let sql = "SELECT system_identifier::text FROM pg_control_system()";
    query_value(client, sql, &[])
        .await
        .map_err(|e| PgError::sql("reading pg_control_system()", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publication_ddl_quotes_every_name() {
        assert_eq!(
            create_publication_sql(
                "outbox_pub",
                &QualifiedTable::new("public", "outbox_events"),
                false
            ),
            "CREATE PUBLICATION \"outbox_pub\" FOR TABLE \"public\".\"outbox_events\" WITH (publish = 'insert');"
        );
        assert_eq!(
            create_publication_sql(
                "p\"; DROP TABLE t; --",
                &QualifiedTable::new("s", "t\" , \"u"),
                false
            ),
            "CREATE PUBLICATION \"p\"\"; DROP TABLE t; --\" FOR TABLE \"s\".\"t\"\" , \"\"u\" WITH (publish = 'insert');"
        );
    }

    #[test]
    fn a_partitioned_outbox_is_published_via_its_root() {
        assert_eq!(
            create_publication_sql("p", &QualifiedTable::new("public", "outbox"), true),
            "CREATE PUBLICATION \"p\" FOR TABLE \"public\".\"outbox\" WITH (publish = 'insert', publish_via_partition_root = true);"
        );
    }
}
