//! Parked aggregates shared by every instance that can hold the slot
//! (DESIGN.md §7, review consumer-replay F2). Looks down at `config`, `pg`,
//! `checkpoint` and `metrics`; the pipeline, the relay and the CLI call it.
//!
//! With `on_poison = "dead-letter"` an aggregate parked by one instance of an
//! HA pair must stay parked when the other takes the slot over, or its later
//! events reach the main topic past the poison one. Each instance has its own
//! offset store, so the authority is a table in the source database
//! (`outbox.parked_table`, keyed by slot and aggregate), written on the
//! primary. The offset store keeps a copy, which the router reads per event.
//!
//! Why a table and not the dead-letter topic read back: the topic's retention
//! could drop a park silently, and a release would need a record of its own
//! that every instance consumes; the database is already the one place both
//! instances must reach.
//!
//! The rules that keep order:
//! - A park is written to the table before the offset store
//!   ([`ParkMirror`]), so before anything after the poison event is
//!   acknowledged: an instance that takes over streams from the slot's
//!   confirmed position and finds the park in the table. A table that cannot
//!   be written fails the session (a retry when the server went away).
//! - Every session copies the table into its store before it decides where to
//!   start, and again once START_REPLICATION has given it the slot and before
//!   the first event is routed: from then on nobody else can park.
//! - `outbox-cdc release` deletes the row; a running connector drops its copy
//!   within [`REFRESH_INTERVAL`] ([`spawn_refresh`]). Events routed before
//!   that still go to the dead-letter topic.
//! - A store used before parking was shared copies its parks into the table
//!   once; from then on an entry missing from the table was released.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard, watch};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tracing::{debug, info, warn};

use crate::Disposition;
use crate::checkpoint::{OffsetStore, ParkMirror, ParkedAggregate, ParkedSync, StoreError};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::outbox::PoisonPolicy;
use crate::outbox::settings::TableName;
use crate::pg::{Lsn, PgConnectConfig, PgError};

/// How often a running connector reads the table for releases.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(2);

/// Upper bound of one statement on the table, connecting included.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a start reads the table again when a park made here
/// raced with the read.
const SYNC_ATTEMPTS: usize = 5;

/// The shared table of one slot's parked aggregates.
pub struct ParkedTable {
    pg: PgConnectConfig,
    url_key: &'static str,
    table: TableName,
    slot: String,
    client: Mutex<Option<tokio_postgres::Client>>,
}

impl ParkedTable {
    /// The table, when parking is shared: with `on_poison = "dead-letter"`.
    pub fn of(config: &Config) -> Result<Option<ParkedTable>, StoreError> {
        if config.outbox.on_poison != PoisonPolicy::DeadLetter {
            return Ok(None);
        }
        // Written on the primary: with decoding on a standby, postgres.url is
        // read-only.
        let (url, url_key) = match &config.postgres.primary_url {
            Some(primary) => (primary.as_str(), "postgres.primary_url"),
            None => (config.postgres.url.as_str(), "postgres.url"),
        };
        let unusable = |reason: String| StoreError::SharedParking {
            table: config.outbox.parked_table.clone(),
            url_key,
            op: "configure",
            reason,
            retry: false,
        };
        let pg = PgConnectConfig::parse(url).map_err(|e| unusable(e.to_string()))?;
        let table = config
            .outbox
            .parked_table_name()
            .map_err(|e| unusable(e.to_string()))?;
        Ok(Some(ParkedTable {
            pg,
            url_key,
            table,
            slot: config.postgres.slot.clone(),
            client: Mutex::new(None),
        }))
    }

    /// The table's name as configured (`outbox.parked_table`).
    pub fn name(&self) -> String {
        self.table.to_string()
    }

    fn error(&self, op: &'static str, e: PgError) -> StoreError {
        StoreError::SharedParking {
            table: self.table.to_string(),
            url_key: self.url_key,
            op,
            retry: e.disposition() == Disposition::Retry,
            reason: e.to_string(),
        }
    }

    fn timed_out(&self, op: &'static str) -> StoreError {
        StoreError::SharedParking {
            table: self.table.to_string(),
            url_key: self.url_key,
            op,
            reason: format!("no answer within {} s", STATEMENT_TIMEOUT.as_secs()),
            retry: true,
        }
    }

    /// The connection, opened (again) when there is none or it closed.
    async fn client(
        &self,
        op: &'static str,
    ) -> Result<MutexGuard<'_, Option<tokio_postgres::Client>>, StoreError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            *guard = None;
            let c = self.pg.connect_sql().await.map_err(|e| self.error(op, e))?;
            *guard = Some(c);
        }
        Ok(guard)
    }

    /// Runs one statement's worth of work with the connection, bounded in
    /// time; a failed one drops the connection so the next opens a new one.
    async fn with_client<T>(
        &self,
        op: &'static str,
        work: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, StoreError> {
        let attempt = async {
            let mut guard = self.client(op).await?;
            let Some(c) = guard.as_ref() else {
                unreachable!("client() leaves a connection");
            };
            match work(c).await {
                Ok(v) => Ok(v),
                Err(source) => {
                    *guard = None;
                    Err(self.error(
                        op,
                        PgError::Sql {
                            during: format!("{op} on {}", self.table),
                            source,
                        },
                    ))
                }
            }
        };
        match tokio::time::timeout(STATEMENT_TIMEOUT, attempt).await {
            Ok(result) => result,
            Err(_) => {
                if let Ok(mut guard) = self.client.try_lock() {
                    *guard = None;
                }
                Err(self.timed_out(op))
            }
        }
    }

    /// Creates the table when it does not exist (checked first: creating
    /// needs CREATE on the schema even when the table is there).
    pub async fn ensure(&self) -> Result<(), StoreError> {
        let quoted = self.table.quoted();
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {quoted} (\
               slot_name text NOT NULL, \
               aggregate_type text NOT NULL, \
               aggregate_id text NOT NULL, \
               reason text NOT NULL, \
               lsn pg_lsn NOT NULL, \
               commit_lsn pg_lsn, \
               parked_at timestamptz NOT NULL DEFAULT now(), \
               PRIMARY KEY (slot_name, aggregate_type, aggregate_id))"
        );
        let created = self
            .with_client("create", async |c| {
                let row = c
                    .query_one("SELECT to_regclass($1) IS NOT NULL", &[&quoted])
                    .await?;
                if row.get::<_, bool>(0) {
                    return Ok(false);
                }
                match c.batch_execute(&create).await {
                    // Another instance created it at the same moment.
                    Err(e)
                        if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                            || e.code() == Some(&SqlState::DUPLICATE_TABLE) =>
                    {
                        Ok(false)
                    }
                    done => done.map(|()| true),
                }
            })
            .await
            .map_err(|e| match e {
                StoreError::SharedParking {
                    table,
                    url_key,
                    op,
                    reason,
                    retry: false,
                } => StoreError::SharedParking {
                    table,
                    url_key,
                    op,
                    reason: format!(
                        "{reason}; create it as a role that may (migrations/005_parked.sql), \
                         or set outbox.parked_table to a table this role can write"
                    ),
                    retry: false,
                },
                other => other,
            })?;
        if created {
            info!(table = %self.table, "created the table of parked aggregates (outbox.parked_table)");
        }
        Ok(())
    }

    /// What the role may do with the table, for `outbox-cdc check`: whether
    /// it exists, whether the role may read, insert and delete there, and
    /// (when it does not exist) whether it may create it. Changes nothing.
    pub async fn probe(&self) -> Result<TableAccess, StoreError> {
        let quoted = self.table.quoted();
        let schema = self.table.schema.clone();
        self.with_client("check", async |c| {
            let row = c
                .query_one(
                    "SELECT to_regclass($1) IS NOT NULL,                             coalesce(has_table_privilege(to_regclass($1), 'SELECT')                                  AND has_table_privilege(to_regclass($1), 'INSERT')                                  AND has_table_privilege(to_regclass($1), 'DELETE'), false),                             coalesce((SELECT has_schema_privilege(n.oid, 'CREATE')                                         FROM pg_namespace n WHERE n.nspname = $2), false)",
                    &[&quoted, &schema],
                )
                .await?;
            Ok(TableAccess {
                exists: row.get(0),
                usable: row.get(1),
                creatable: row.get(2),
            })
        })
        .await
    }

    /// Every aggregate parked for this slot.
    pub async fn list(&self) -> Result<Vec<ParkedAggregate>, StoreError> {
        let sql = format!(
            "SELECT aggregate_type, aggregate_id, reason, lsn::text, commit_lsn::text, \
                    (extract(epoch FROM parked_at) * 1000)::bigint \
               FROM {} WHERE slot_name = $1 ORDER BY aggregate_type, aggregate_id",
            self.table.quoted()
        );
        let rows = self
            .with_client("read", async |c| c.query(&sql, &[&self.slot]).await)
            .await?;
        rows.iter()
            .map(|row| {
                let lsn = |text: &str| {
                    text.parse::<Lsn>().map_err(|e| StoreError::SharedParking {
                        table: self.table.to_string(),
                        url_key: self.url_key,
                        op: "read",
                        reason: format!("LSN {text:?}: {e}"),
                        retry: false,
                    })
                };
                let commit: Option<String> = row.get(4);
                Ok(ParkedAggregate {
                    aggregate_type: row.get(0),
                    aggregate_id: row.get(1),
                    reason: row.get(2),
                    lsn: lsn(row.get(3))?,
                    commit_lsn: commit.as_deref().map(lsn).transpose()?,
                    parked_at_unix_ms: row.get(5),
                })
            })
            .collect()
    }

    /// Records a park; one already there keeps its first record.
    pub async fn insert(&self, p: &ParkedAggregate) -> Result<bool, StoreError> {
        let sql = format!(
            "INSERT INTO {} (slot_name, aggregate_type, aggregate_id, reason, lsn, commit_lsn, parked_at) \
             VALUES ($1, $2, $3, $4, $5::text::pg_lsn, $6::text::pg_lsn, to_timestamp($7::float8 / 1000)) \
             ON CONFLICT DO NOTHING",
            self.table.quoted()
        );
        let lsn = p.lsn.to_string();
        let commit = p.commit_lsn.map(|l| l.to_string());
        let at_ms = p.parked_at_unix_ms as f64;
        let inserted = self
            .with_client("park", async |c| {
                c.execute(
                    &sql,
                    &[
                        &self.slot,
                        &p.aggregate_type,
                        &p.aggregate_id,
                        &p.reason,
                        &lsn,
                        &commit,
                        &at_ms,
                    ],
                )
                .await
            })
            .await?;
        Ok(inserted == 1)
    }

    /// Releases an aggregate; whether it was parked.
    pub async fn release(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<bool, StoreError> {
        let sql = format!(
            "DELETE FROM {} WHERE slot_name = $1 AND aggregate_type = $2 AND aggregate_id = $3",
            self.table.quoted()
        );
        let deleted = self
            .with_client("release", async |c| {
                c.execute(&sql, &[&self.slot, &aggregate_type, &aggregate_id])
                    .await
            })
            .await?;
        Ok(deleted > 0)
    }

    /// Makes `store` a copy of the table and routes its later parks through
    /// the table first. A store that kept parks before they were shared
    /// copies them into the table once.
    pub async fn share_into(
        self: &Arc<Self>,
        store: &OffsetStore,
    ) -> Result<ParkedSync, StoreError> {
        self.ensure().await?;
        if !blocking(|| store.parking_shared())? {
            let local = blocking(|| store.parked())?;
            for p in &local {
                self.insert(p).await?;
            }
            blocking(|| store.mark_parking_shared())?;
            if !local.is_empty() {
                info!(table = %self.table, parked = local.len(),
                      "copied this store's parked aggregates into the shared table");
            }
        }
        store.set_park_mirror(self.clone());
        for _ in 0..SYNC_ATTEMPTS {
            if let Some(sync) = self.sync_once(store).await? {
                self.report(&sync);
                return Ok(sync);
            }
        }
        Err(StoreError::SharedParking {
            table: self.table.to_string(),
            url_key: self.url_key,
            op: "read",
            reason: format!("parks made here kept racing with {SYNC_ATTEMPTS} reads of the table"),
            retry: true,
        })
    }

    /// One read of the table applied to `store`; `None` when a park made
    /// here since the read makes it stale.
    async fn sync_once(&self, store: &OffsetStore) -> Result<Option<ParkedSync>, StoreError> {
        let generation = store.parked_generation();
        let rows = self.list().await?;
        blocking(|| store.sync_parked(&rows, generation))
    }

    fn report(&self, sync: &ParkedSync) {
        for p in &sync.added {
            warn!(aggregate_type = %p.aggregate_type, aggregate_id = %p.aggregate_id, lsn = %p.lsn,
                  reason = %p.reason, table = %self.table,
                  "aggregate parked (by the shared table): its events go to the dead-letter topic until `outbox-cdc release`");
        }
        for (t, id) in &sync.released {
            info!(aggregate_type = %t, aggregate_id = %id, table = %self.table,
                  "aggregate released (gone from the shared table): its next events go to their topic");
        }
    }
}

/// What [`ParkedTable::probe`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableAccess {
    pub exists: bool,
    /// SELECT, INSERT and DELETE on it.
    pub usable: bool,
    /// CREATE on its schema.
    pub creatable: bool,
}

impl ParkMirror for ParkedTable {
    fn park(&self, parked: &ParkedAggregate) -> Result<(), StoreError> {
        // Called by the router, inside the runtime: parks are rare, and
        // nothing after the poison event may be routed before the table has it.
        let handle = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| handle.block_on(self.insert(parked))).map(|_| ())
    }
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Reads the table every [`REFRESH_INTERVAL`] into the offset store the
/// pipeline has open (once a session has shared it), so a release made
/// anywhere takes effect while the connector runs. `None` unless parking
/// is shared.
pub fn spawn_refresh(
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let table = match ParkedTable::of(&config) {
        Ok(Some(table)) => table,
        Ok(None) => return None,
        Err(e) => {
            // The session reports the same error and stops.
            debug!(error = %e, "parked aggregates: no refresh");
            return None;
        }
    };
    Some(tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            let Some(store) = metrics.offset_store.get() else {
                continue;
            };
            match blocking(|| store.parking_shared()) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    debug!(error = %e, "parked aggregates: cannot read the store");
                    continue;
                }
            }
            match table.sync_once(&store).await {
                Ok(Some(sync)) => {
                    table.report(&sync);
                    if failing {
                        info!(table = %table.table, "parked aggregates: the shared table is readable again");
                    }
                    failing = false;
                }
                Ok(None) => {}
                Err(e) if !failing => {
                    warn!(error = %e, "parked aggregates: cannot read the shared table; a release made elsewhere \
                                       takes effect once it can (a park still needs it, and fails the session)");
                    failing = true;
                }
                Err(e) => {
                    debug!(error = %e, "parked aggregates: still cannot read the shared table")
                }
            }
        }
    }))
}
