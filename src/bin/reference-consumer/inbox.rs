//! The inbox transaction: dedupe row and business effect commit together.
//!
//! Per record, in ONE PostgreSQL transaction:
//!   INSERT INTO <inbox> (consumer_name, event_id) ... ON CONFLICT DO NOTHING RETURNING
//!   -- only when a row came back (first delivery):
//!   INSERT INTO <effects> (event_id, order_id, sku, qty) ...
//!   -- otherwise: the recorded effect, compared with this record's
//!   SELECT order_id, sku, qty FROM <effects> WHERE event_id = ...
//!   COMMIT
//! A crash before COMMIT leaves neither; after COMMIT both, and the redelivered
//! record finds the inbox row and changes nothing. Writing the two in separate
//! transactions would reopen the dual-write gap the outbox closed upstream.

use outbox_cdc::Disposition;
use outbox_cdc::pg::{PgConnectConfig, PgError, QualifiedTable, sql_error_is_retryable};
use tokio_postgres::{Client, Statement};

use crate::failpoint;
use crate::record::InboxRecord;

/// What one delivery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// First delivery: the effect was applied.
    Applied,
    /// The inbox already held the event id: nothing changed.
    Duplicate,
    /// The inbox already held the event id, and the effect it recorded
    /// differs from what this record would apply (the same id given to two
    /// different events: a writer that supplies its own ids, or a foreign
    /// producer). Nothing changed; `stored` describes the recorded effect.
    Conflict { stored: String },
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum InboxError {
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(#[from] PgError),
    #[error(
        "inbox transaction for event {event_id} ({place}) failed during {during}: {}",
        with_causes(source)
    )]
    Sql {
        event_id: String,
        place: String,
        during: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
}

impl InboxError {
    /// Lost connections, restarts, overload and serialization failures pass;
    /// anything else (a missing table, a privilege, a value that does not
    /// fit its column: review F8) needs an operator.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            InboxError::Connect(e) => e.disposition() == Disposition::Retry,
            InboxError::Sql { source, .. } => sql_error_is_retryable(source),
        }
    }
}

/// `e` and its causes, `: `-separated: tokio-postgres's own text of a
/// client-side error ("error serializing parameter 3") does not say which
/// types clash; its cause does.
fn with_causes(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

struct Connected {
    client: Client,
    dedupe: Statement,
    effect: Statement,
    /// The effect recorded for an event id, to compare a duplicate with.
    recorded: Statement,
}

pub(crate) struct Inbox {
    pg: PgConnectConfig,
    consumer_name: String,
    inbox_table: QualifiedTable,
    effects_table: QualifiedTable,
    conn: Option<Connected>,
}

impl Inbox {
    pub(crate) fn new(
        pg: PgConnectConfig,
        consumer_name: String,
        inbox_table: QualifiedTable,
        effects_table: QualifiedTable,
    ) -> Inbox {
        Inbox {
            pg,
            consumer_name,
            inbox_table,
            effects_table,
            conn: None,
        }
    }

    /// Connects (if needed) and prepares the two statements.
    pub(crate) async fn connect(&mut self) -> Result<(), InboxError> {
        ensure_connected(
            &mut self.conn,
            &self.pg,
            &self.inbox_table,
            &self.effects_table,
        )
        .await?;
        Ok(())
    }

    /// One record, one transaction. On error the connection is dropped (the
    /// open transaction, if any, dies with it) and the caller may retry.
    pub(crate) async fn apply(&mut self, rec: &InboxRecord) -> Result<Outcome, InboxError> {
        let conn = ensure_connected(
            &mut self.conn,
            &self.pg,
            &self.inbox_table,
            &self.effects_table,
        )
        .await?;
        let result = apply_in(conn, &self.consumer_name, rec).await;
        if result.is_err() {
            self.conn = None;
        }
        result
    }
}

async fn ensure_connected<'c>(
    conn: &'c mut Option<Connected>,
    pg: &PgConnectConfig,
    inbox_table: &QualifiedTable,
    effects_table: &QualifiedTable,
) -> Result<&'c mut Connected, InboxError> {
    if conn.as_ref().is_some_and(|c| c.client.is_closed()) {
        *conn = None;
    }
    if let Some(c) = conn {
        return Ok(c);
    }
    let client = pg.connect_sql().await?;
    let sql_err = |during, source| InboxError::Sql {
        event_id: "-".into(),
        place: "-".into(),
        during,
        source,
    };
    let dedupe = client
        .prepare(&format!(
            "INSERT INTO {inbox_table} (consumer_name, event_id) VALUES ($1, $2::text::uuid) \
             ON CONFLICT DO NOTHING RETURNING event_id"
        ))
        .await
        .map_err(|e| sql_err("prepare the inbox insert", e))?;
    let effect = client
        .prepare(&format!(
            "INSERT INTO {effects_table} (event_id, order_id, sku, qty) VALUES ($1::text::uuid, $2, $3, $4)"
        ))
        .await
        .map_err(|e| sql_err("prepare the effect insert", e))?;
    let recorded = client
        .prepare(&format!(
            "SELECT order_id, sku, qty FROM {effects_table} WHERE event_id = $1::text::uuid LIMIT 1"
        ))
        .await
        .map_err(|e| sql_err("prepare the effect lookup", e))?;
    Ok(conn.insert(Connected {
        client,
        dedupe,
        effect,
        recorded,
    }))
}

async fn apply_in(
    conn: &mut Connected,
    consumer_name: &str,
    rec: &InboxRecord,
) -> Result<Outcome, InboxError> {
    let err = |during: &'static str| {
        move |source| InboxError::Sql {
            event_id: rec.event_id.clone(),
            place: rec.place.to_string(),
            during,
            source,
        }
    };
    let tx = conn.client.transaction().await.map_err(err("BEGIN"))?;
    let first = tx
        .query_opt(&conn.dedupe, &[&consumer_name, &rec.event_id])
        .await
        .map_err(err("the inbox insert"))?
        .is_some();
    let outcome = if first {
        tx.execute(
            &conn.effect,
            &[&rec.event_id, &rec.order_id, &rec.sku, &rec.qty],
        )
        .await
        .map_err(err("the effect insert"))?;
        Outcome::Applied
    } else {
        let stored = tx
            .query_opt(&conn.recorded, &[&rec.event_id])
            .await
            .map_err(err("the effect lookup"))?;
        // No recorded effect (applied into another effects table, or
        // removed): nothing to compare with.
        // Columns of other types than the effect writes: no comparison
        // (never a panic on a row).
        let stored = stored.and_then(|row| {
            let effect: (Option<String>, Option<String>, Option<i32>) = (
                row.try_get(0).ok()?,
                row.try_get(1).ok()?,
                row.try_get(2).ok()?,
            );
            Some(effect)
        });
        match stored {
            Some(effect) if effect != (Some(rec.order_id.clone()), rec.sku.clone(), rec.qty) => {
                Outcome::Conflict {
                    stored: format!(
                        "order_id={:?} sku={:?} qty={:?}",
                        effect.0, effect.1, effect.2
                    ),
                }
            }
            _ => Outcome::Duplicate,
        }
    };
    failpoint::hit("before-business-commit");
    tx.commit().await.map_err(err("COMMIT"))?;
    Ok(outcome)
}
