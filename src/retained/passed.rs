//! Which retained rows the slot has provably passed: their transaction ended
//! before the slot's `confirmed_flush_lsn`, so the stream has either
//! delivered them or skipped them, and a row of them that is not in Kafka is
//! missing. A row the slot has not passed yet is pending: the connector will
//! still send it, so a repair must not (review F4 of 2026-12-05).
//!
//! Two proofs, the better one wins:
//! - a snapshot taken now: every transaction id below its `xmin` had ended
//!   when the WAL position read after it was written; once the slot's
//!   confirmed position reaches that WAL position (a running connector
//!   acknowledges idle WAL within its status interval), those rows are
//!   passed. A subtransaction's id follows its parent's, so a row written in
//!   a savepoint is below `xmin` only if its top-level transaction is too;
//! - [`xid_witness`]: the slot's `catalog_xmin` or a checkpoint's oldest
//!   active transaction, each only when its WAL position is at or before
//!   the confirmed one (what `prune` trusts too).

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::error::PipelineError;
use crate::pg::Lsn;
use crate::pg::control::{query_value, slot_info};

use super::sql;

/// How often the slot's confirmed position is read while waiting for it.
const POLL: Duration = Duration::from_millis(200);

/// Which rows count as passed by the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassedBound {
    /// No slot (or a lost one): nothing holds rows back to deliver them, so
    /// every row is passed.
    NoSlot { why: String },
    /// Rows of transactions older than `xid` (32-bit, as `xmin` shows it)
    /// are passed; `what` says which proof gave it.
    Below { xid: u32, what: String },
    /// The slot exists and nothing proves any row passed.
    Nothing { what: String },
}

impl PassedBound {
    /// A boolean SQL expression over the outbox row aliased `o`: whether the
    /// slot has passed it. The xid is an integer printed here, never text
    /// from outside.
    pub fn sql(&self) -> String {
        match self {
            PassedBound::NoSlot { .. } => "true".to_owned(),
            PassedBound::Nothing { .. } => "false".to_owned(),
            // age() compares modulo 2^32 against the same reference; a
            // negative age is an xmin frozen long ago.
            PassedBound::Below { xid, .. } => {
                format!("(age(o.xmin) > age('{xid}'::xid) OR age(o.xmin) < 0)")
            }
        }
    }

    /// One line for a report.
    pub fn describe(&self) -> String {
        match self {
            PassedBound::NoSlot { why } => why.clone(),
            PassedBound::Below { what, .. } | PassedBound::Nothing { what } => what.clone(),
        }
    }
}

/// What the slot named `slot` has passed; waits up to `wait` for an active
/// slot to confirm a snapshot taken now.
pub async fn passed_bound(
    client: &Client,
    slot: &str,
    wait: Duration,
) -> Result<PassedBound, PipelineError> {
    let Some(info) = slot_info(client, slot).await? else {
        return Ok(PassedBound::NoSlot {
            why: format!("no slot {slot:?}: nothing holds rows back, so every row counts"),
        });
    };
    if info.wal_status.as_deref() == Some("lost") {
        return Ok(PassedBound::NoSlot {
            why: format!("slot {slot:?} is lost: it delivers nothing more, so every row counts"),
        });
    }
    let e = sql("taking a snapshot to compare with the slot");
    // One statement: its snapshot is taken before the position is read.
    let row = client
        .query_one(
            "SELECT (pg_snapshot_xmin(s)::text::int8 % 4294967296), \
                    (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                     ELSE pg_current_wal_insert_lsn() END - '0/0'::pg_lsn)::int8 \
               FROM pg_current_snapshot() AS s",
            &[],
        )
        .await
        .map_err(&e)?;
    let xmin = row.try_get::<_, i64>(0).map_err(&e)? as u32;
    let after = Lsn::new(row.try_get::<_, i64>(1).map_err(&e)? as u64);
    let mut confirmed = info.confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
    let deadline = Instant::now() + wait;
    while info.active_pid.is_some() && confirmed < after && Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        confirmed = match slot_info(client, slot).await? {
            Some(now) => now.confirmed_flush_lsn.unwrap_or(confirmed),
            None => break,
        };
    }
    // Ids 0-2 are special; a wrapped xmin there proves nothing useful.
    if confirmed >= after && xmin >= 3 {
        return Ok(PassedBound::Below {
            xid: xmin,
            what: format!(
                "slot {slot:?} confirmed {confirmed}, past a snapshot whose oldest running transaction was {xmin}"
            ),
        });
    }
    Ok(match xid_witness(client, slot, confirmed).await? {
        Some((xid, what)) => PassedBound::Below { xid, what },
        None => PassedBound::Nothing {
            what: format!(
                "slot {slot:?} confirmed {confirmed}: no transaction is proven to have ended before it"
            ),
        },
    })
}

/// An xid every older transaction of which had ended before a WAL position
/// at or before `acked`: the newer of the slot's `catalog_xmin` and the last
/// checkpoint's `oldest_active_xid`, each only when its position is at or
/// before `acked`. Returns the xid and what it is.
pub(crate) async fn xid_witness(
    client: &Client,
    slot: &str,
    acked: Lsn,
) -> Result<Option<(u32, String)>, PipelineError> {
    let e = sql("reading the slot's catalog_xmin and the last checkpoint");
    // A slot's catalog_xmin comes from a running-transactions record at or
    // before its confirmed_flush_lsn; in PostgreSQL 17+ it may consider only
    // its own database's transactions, hence current_database(). A
    // checkpoint's oldest_active_xid is 0 after a shutdown checkpoint.
    let row = client
        .query_opt(
            "SELECT w.xid::text::int8, w.what FROM ( \
               SELECT s.catalog_xmin AS xid, \
                      format('slot %s catalog_xmin %s (confirmed %s)', s.slot_name, s.catalog_xmin, \
                             s.confirmed_flush_lsn) AS what \
                 FROM pg_replication_slots s \
                WHERE s.slot_name = $1 AND s.slot_type = 'logical' AND s.database = current_database() \
                  AND s.catalog_xmin IS NOT NULL AND s.confirmed_flush_lsn <= $2::text::pg_lsn \
               UNION ALL \
               SELECT c.oldest_active_xid, \
                      format('checkpoint %s oldest_active_xid %s', c.checkpoint_lsn, c.oldest_active_xid) \
                 FROM pg_control_checkpoint() c \
                WHERE c.checkpoint_lsn <= $2::text::pg_lsn AND c.oldest_active_xid::text::int8 >= 3 \
             ) w ORDER BY age(w.xid) LIMIT 1",
            &[&slot, &acked.to_string()],
        )
        .await
        .map_err(&e)?;
    row.map(|r| {
        let xid: i64 = r.try_get(0).map_err(&e)?;
        Ok((xid as u32, r.try_get(1).map_err(&e)?))
    })
    .transpose()
}

/// Whether transaction `a` is older than `b` (32-bit ids, compared by age on
/// the server as `xmin` comparisons are).
pub(crate) async fn older(client: &Client, a: u32, b: u32) -> Result<bool, PipelineError> {
    let select = "SELECT age($1::text::xid) > age($2::text::xid)";
    query_value(client, select, &[&a.to_string(), &b.to_string()])
        .await
        .map_err(sql("comparing transaction ids"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_predicate_is_fixed_sql_or_an_inlined_integer() {
        let no_slot = PassedBound::NoSlot { why: "x".into() };
        let nothing = PassedBound::Nothing { what: "y".into() };
        let below = PassedBound::Below {
            xid: 4_000_000_000,
            what: "z".into(),
        };
        assert_eq!(no_slot.sql(), "true");
        assert_eq!(nothing.sql(), "false");
        assert_eq!(
            below.sql(),
            "(age(o.xmin) > age('4000000000'::xid) OR age(o.xmin) < 0)"
        );
        assert_eq!(below.describe(), "z");
    }
}
