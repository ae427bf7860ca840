//! Everything before the first replication message (DESIGN.md §5a, §5): the
//! producer, both connections, the coverage proof and the features of the
//! server's major, the resume decision (create, resume, or repair a lost
//! slot), the first persist and START_REPLICATION.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::checkpoint::{DurableLsn, OffsetStore, PendingRepair, StoreError, WitnessPosition};
use crate::config::{Config, Streaming};
use crate::metrics::Metrics;
use crate::outbox::OutboxMapper;
use crate::pg::control::{self, SlotLock};
use crate::pg::{
    Lsn, PgConnectConfig, PgError, PgTimestamp, ReplicationConnection, ReplicationStream,
    StartOptions, StreamOptions,
};

use super::coverage_watch::{self, ProofRecord, ProofTarget, StartProof};
use super::protocol;
use crate::pipeline::delivery::{Delivery, StartContext};
use crate::pipeline::error::PipelineError;
use crate::pipeline::options::RunOptions;
use crate::pipeline::resume::{self, ResumeInputs, ResumePlan, StartRefused};
use crate::retained::repair;

/// What bootstrap hands to streaming.
pub(super) struct Started<D> {
    pub(super) mapper: OutboxMapper,
    pub(super) delivery: D,
    /// The SQL connection bootstrap used; streaming keeps it for catalog
    /// lookups and re-proofs.
    pub(super) catalog: tokio_postgres::Client,
    pub(super) pg: PgConnectConfig,
    pub(super) stream: ReplicationStream,
    /// The start position, persisted and flushed.
    pub(super) durable: DurableLsn,
    pub(super) system_id: String,
    pub(super) proof: StartProof,
    /// The WAL position the start-up proof holds for.
    pub(super) proven_through: Lsn,
    pub(super) on_standby: bool,
    /// The live witness will check what this session delivers against the
    /// table (on, reading a primary, and the table has `occurred_at`).
    pub(super) witness_checks: bool,
    pub(super) skip_through: Lsn,
    /// What was reported to PostgreSQL at the start (see `Checkpointer::reported`).
    pub(super) reported: Lsn,
    /// Where the server streams from (the slot's position, which may be
    /// before the stored offset: see `Checkpointer::pages_behind`).
    pub(super) resent_from: Lsn,
    /// The server streams large transactions in progress (pgoutput protocol 2).
    pub(super) streaming: bool,
}

/// How long the start-up waits for the broker to accept (or refuse) the
/// configured credentials; a broker that does not answer is not a refusal.
const KAFKA_SECURITY_PROBE: Duration = Duration::from_secs(5);

/// Everything before the first replication message (DESIGN.md §5a, §5): the
/// producer, both connections, the coverage proof and the features of the
/// server's major, the resume decision (create, resume, or repair a lost
/// slot), the first persist and START_REPLICATION. `None`: a repair-only run
/// that is done.
pub(super) async fn bootstrap<D: Delivery>(
    config: &Config,
    options: &RunOptions,
    store: &Arc<OffsetStore>,
    metrics: &Metrics,
) -> Result<Option<Started<D>>, PipelineError> {
    let pg = PgConnectConfig::parse(&config.postgres.url)?;
    let slot = config.postgres.slot.as_str();
    let mapper = OutboxMapper::new(&config.outbox)?;
    let target = ProofTarget::of(config)?;

    let mut repl = ReplicationConnection::connect(&pg, &config.postgres.application_name).await?;
    repl.set_stream_options(StreamOptions {
        status_interval: Duration::from_millis(config.postgres.status_interval_ms),
        ..StreamOptions::default()
    });
    let identity = repl.identify_system().await?;
    // The producer (its transactional id needs the cluster's identity): a
    // Kafka property librdkafka refuses fails here, before the slot or the
    // publication is touched.
    let mut delivery = D::create(config, metrics, &identity.system_id)?;
    // A password, CA or client certificate the broker refuses stops here,
    // with its cause, before anything is done on the database.
    crate::sink::refuse_rejected_security(&config.kafka, KAFKA_SECURITY_PROBE).await?;
    let client = pg.connect_sql().await?;
    let database = identity
        .dbname
        .clone()
        .or_else(|| pg.tokio_config().get_dbname().map(str::to_owned))
        .unwrap_or_default();

    // Proof before the slot is touched (DESIGN.md §5a): the publication
    // carries every row of the outbox table, or the start is refused.
    let record = ProofRecord::of(config, store, &identity.system_id);
    let (proof, proven_through) =
        coverage_watch::prove_at_start(&client, config, target, record).await?;
    // Features older majors lack: refused before the slot is touched.
    let server_version = control::server_version_num(&client).await?;
    if config.postgres.failover_slot && server_version < 170000 {
        return Err(StartRefused::FailoverSlotUnsupported { server_version }.into());
    }
    if mapper.wants_messages() && server_version < 140000 {
        return Err(StartRefused::MessagesUnsupported { server_version }.into());
    }
    let on_standby = control::in_recovery(&client).await?;
    let streaming = match config.postgres.streaming {
        Streaming::Off => false,
        Streaming::On if server_version < 140000 => {
            return Err(StartRefused::StreamingUnsupported { server_version }.into());
        }
        Streaming::On => true,
        // A streamed logical message does not say which savepoint wrote it.
        Streaming::Auto => server_version >= 140000 && !mapper.wants_messages(),
    };
    if on_standby && server_version < 160000 {
        return Err(StartRefused::StandbyDecodingUnsupported { server_version }.into());
    }

    // Held from reading the slot until START_REPLICATION made it ours: a peer
    // repairing this slot's gap holds it exclusively (audit F6).
    if !control::try_lock_slot(&client, slot, SlotLock::Starting).await? {
        return Err(PipelineError::RepairRunning {
            slot: slot.to_owned(),
        });
    }
    let slot_info = control::slot_info(&client, slot).await?;
    // A logical slot has no confirmed position until it reached a consistent
    // point, which waits for every transaction running when it was created
    // (in any database); a creator that died meanwhile leaves its walsender
    // finishing the creation. Taking such a slot over would store 0/0 and
    // then find the slot "ahead" of it.
    if let Some(info) = slot_info.as_ref().filter(|i| {
        i.plugin.is_some()
            && i.confirmed_flush_lsn.is_none()
            && i.wal_status.as_deref() != Some("lost")
    }) {
        return Err(PipelineError::SlotNotReady {
            slot: slot.to_owned(),
            pid: info.active_pid,
        });
    }
    delivery
        .ready(StartContext {
            store,
            system_id: &identity.system_id,
            slot_info: slot_info.as_ref(),
            repair_pending: store.pending_repair(slot)?.is_some(),
        })
        .await?;
    let stored = store.load(slot)?;
    let pending = store.pending_repair(slot)?;
    let mut created_at: Option<PgTimestamp> = None;
    let mut witness_from: Option<WitnessPosition> = None;
    let repair_locked = std::sync::atomic::AtomicBool::new(false);
    // Both ways into a gap repair (an interrupted one, a lost slot) end here.
    let mut repair = async |pending: &PendingRepair, existing: Option<Lsn>| {
        // Exclusive for the whole repair and until this instance streams:
        // no peer starts on the recreated slot meanwhile.
        if !control::try_lock_slot(&client, slot, SlotLock::Repairing).await? {
            return Err(PipelineError::RepairRunning {
                slot: slot.to_owned(),
            });
        }
        repair_locked.store(true, std::sync::atomic::Ordering::Relaxed);
        repair_lost_slot(
            &mut repl,
            &client,
            config,
            store,
            metrics,
            slot,
            &identity.system_id,
            pending,
            existing,
        )
        .await
    };
    let (start, skip_through) = if let Some(pending) = pending {
        // A repair that did not finish: finish it before anything else.
        if let Some(stored) = stored
            .as_ref()
            .filter(|s| s.system_id != identity.system_id)
        {
            return Err(StartRefused::OtherCluster {
                slot: slot.to_owned(),
                stored_lsn: stored.lsn,
                stored_system_id: stored.system_id.clone(),
                server_system_id: identity.system_id.clone(),
            }
            .into());
        }
        warn!(slot, stored = %pending.stored_lsn, "finishing a gap repair that was interrupted");
        let confirmed = slot_info
            .as_ref()
            .map(|s| s.confirmed_flush_lsn.unwrap_or(Lsn::ZERO));
        let at = repair(&pending, confirmed).await?;
        (at, Lsn::ZERO)
    } else {
        let plan = resume::decide(&ResumeInputs {
            slot,
            database: &database,
            server_system_id: &identity.system_id,
            server_flush_lsn: identity.xlogpos,
            stored: stored.as_ref(),
            slot_info: slot_info.as_ref(),
            create_slot: config.postgres.create_slot,
            recreate_slot: options.recreate_slot,
            allow_slot_ahead: config.postgres.allow_slot_ahead,
        })?;
        match plan {
            ResumePlan::CreateSlot => {
                // What a gap repair would start from if this slot were
                // lost before any transaction is acknowledged: everything
                // the slot will carry commits after this moment.
                created_at = Some(server_clock(&client).await?);
                let creating =
                    control::create_logical_slot_with(&client, slot, config.postgres.failover_slot);
                let at = match on_standby {
                    true => with_standby_snapshots(config, creating).await?,
                    false => creating.await?,
                };
                witness_from = witness_start(config, &client, &identity.system_id).await?;
                info!(slot, lsn = %at, failover = config.postgres.failover_slot, "created replication slot");
                (at, Lsn::ZERO)
            }
            ResumePlan::RecreateSlot {
                forgotten,
                drop_invalidated,
            } => {
                let Some(stored) = stored.as_ref() else {
                    return Err(protocol(
                        forgotten,
                        "recreate planned without a stored offset",
                    ));
                };
                let parked = tokio::task::block_in_place(|| store.parked())?;
                let pending =
                    repair::plan(&client, config, stored, &parked, options.accept_gap).await?;
                tokio::task::block_in_place(|| store.begin_repair(slot, &pending))?;
                if drop_invalidated {
                    control::drop_slot(&client, slot).await?;
                    warn!(slot, "dropped the invalidated replication slot");
                }
                warn!(slot, lost_at = %forgotten, bound = %pending.bound,
                        "replication slot lost: recreating it and repairing the gap from the outbox table");
                let at = repair(&pending, None).await?;
                (at, Lsn::ZERO)
            }
            ResumePlan::Resume {
                start,
                skip_through,
            } => {
                if stored.is_none() {
                    // An existing slot and no offset of ours: another consumer
                    // (Debezium, pg_recvlogical, an earlier store) confirmed it
                    // this far, and what it confirmed is its to have delivered.
                    warn!(slot, confirmed_flush_lsn = %start,
                        "taking over an existing slot with no offset stored here: streaming from its \
                         confirmed_flush_lsn; changes its previous consumer confirmed are not published again \
                         (outbox-cdc replay --since publishes retained rows for a consumer that needs them)");
                }
                (start, skip_through)
            }
        }
    };
    if options.repair_only {
        info!(slot, start = %start, "repair finished (or none was needed); not streaming (outbox-cdc repair)");
        let _ = repl.close().await;
        return Ok(None);
    }

    // Persist the start before streaming: it records the cluster identity on
    // first start and gives the first reportable (durable) position.
    let durable = tokio::task::block_in_place(|| match created_at {
        Some(at) => store.persist_created(slot, start, &identity.system_id, at, witness_from),
        None => store.persist(slot, start, &identity.system_id),
    })?;
    let stream = repl
        .start_logical_with(
            slot,
            start,
            &config.postgres.publication,
            StartOptions {
                messages: mapper.wants_messages(),
                streaming,
            },
        )
        .await?;
    // With the sequence audit on, the numbers of events between the slot's
    // position and the stored offset may be missing from the store (a crash
    // before they were saved): the server sends them again from `start`, and
    // reporting the offset now would let a second crash skip them.
    let reported = if config.audit.sequences != "off" && start < durable.lsn() {
        start
    } else {
        stream.feedback().set_flushed(durable);
        durable.lsn()
    };
    // The slot is active and ours now: peers see it busy. The session's
    // locks on the slot go (the exclusive one only if a repair took it).
    control::unlock_slot(&client, slot, SlotLock::Starting).await?;
    if repair_locked.load(std::sync::atomic::Ordering::Relaxed) {
        control::unlock_slot(&client, slot, SlotLock::Repairing).await?;
    }
    metrics.set_acked(durable.lsn());
    metrics.set_connected(true);
    // The stored offset was accepted for this cluster: the pruner may use its time.
    let stored_time = stored
        .as_ref()
        .filter(|s| !s.commit_time_is_slot_creation)
        .and_then(|s| s.acked_commit_time);
    metrics.durable_commit_time.set(stored_time);
    let witness_checks = config.reconcile.enabled
        && !on_standby
        && crate::retained::table_columns(
            &client,
            &crate::coverage::configured_table(&config.outbox)?,
        )
        .await?
        .iter()
        .any(|(name, _)| name == "occurred_at");
    info!(slot, start = %start, skip_through = %skip_through, system_id = %identity.system_id, "streaming");
    Ok(Some(Started {
        mapper,
        delivery,
        catalog: client,
        pg,
        stream,
        durable,
        system_id: identity.system_id,
        proof,
        proven_through,
        on_standby,
        witness_checks,
        skip_through,
        reported,
        resent_from: start,
        streaming,
    }))
}

/// Recreates the lost slot with an exported snapshot (or, for an interrupted
/// repair, takes the slot it created, confirmed at `existing`), publishes the
/// retained rows `pending` chooses, then stores the new slot's position as the
/// offset and ends the repair. Returns where streaming starts.
#[allow(clippy::too_many_arguments)]
async fn repair_lost_slot(
    repl: &mut ReplicationConnection,
    client: &tokio_postgres::Client,
    config: &Config,
    store: &Arc<OffsetStore>,
    metrics: &Metrics,
    slot: &str,
    system_id: &str,
    pending: &PendingRepair,
    existing: Option<Lsn>,
) -> Result<Lsn, PipelineError> {
    let (at, snapshot) = match existing {
        Some(confirmed) => (confirmed, None),
        None => {
            let failover = config.postgres.failover_slot;
            let created = repl.create_slot_exporting_snapshot(slot, failover).await?;
            info!(slot, lsn = %created.consistent_point, failover, "recreated the replication slot with an exported snapshot");
            (created.consistent_point, Some(created.snapshot))
        }
    };
    let witness_from = witness_start(config, client, system_id).await?;
    // The commit time the new offset stands for: everything before the
    // slot's consistent point committed before this moment.
    let now = server_clock(client).await?;
    let rows = repair::publish(
        client,
        config,
        store,
        metrics,
        pending,
        snapshot.as_deref(),
        at,
    )
    .await?;
    tokio::task::block_in_place(|| -> Result<(), StoreError> {
        store.remove(slot)?;
        store.persist_created(slot, at, system_id, now, witness_from)?;
        store.end_repair(slot)
    })?;
    info!(slot, rows, start = %at, "gap repair finished: every retained row committed after the lost position was published");
    Ok(at)
}

/// Where the live witness starts checking with a slot just created: from
/// the next transaction id on, since every transaction from it starts after
/// the slot exists and is streamed (one still running at the creation is
/// not checked). `None` with the witness off.
async fn witness_start(
    config: &Config,
    client: &tokio_postgres::Client,
    system_id: &str,
) -> Result<Option<WitnessPosition>, PipelineError> {
    if !config.reconcile.enabled {
        return Ok(None);
    }
    let (next_xid, look_from_micros) = control::xid_horizon(client).await?;
    info!(
        from_xid = next_xid,
        "live witness: rows of transactions from this id on are checked (the slot was just created)"
    );
    Ok(Some(WitnessPosition {
        system_id: system_id.to_owned(),
        checked_below_xid: next_xid,
        look_from_micros,
    }))
}

/// The server's clock now, as a commit-time bound.
async fn server_clock(client: &tokio_postgres::Client) -> Result<PgTimestamp, PgError> {
    let sql = "SELECT ((extract(epoch FROM clock_timestamp()) - 946684800) * 1e6)::int8";
    control::query_value(client, sql, &[])
        .await
        .map(PgTimestamp)
        .map_err(|e| PgError::sql("reading the server clock", e))
}

/// Creating a slot on a standby waits for a running-transactions record from
/// the primary (written every 15 s while it is busy). With
/// `postgres.primary_url` the primary is asked for one every second until the
/// slot exists.
async fn with_standby_snapshots<T>(
    config: &Config,
    creating: impl std::future::Future<Output = Result<T, PgError>>,
) -> Result<T, PgError> {
    let Some(primary) = config.postgres.primary_url.as_deref() else {
        warn!(
            "creating the slot on a standby: it waits for the primary's next running-transactions record \
             (set postgres.primary_url to ask the primary for one)"
        );
        return creating.await;
    };
    let primary = crate::pg::PgConnectConfig::parse(primary)?;
    let asking = async move {
        let client = match primary.connect_sql().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "postgres.primary_url: cannot connect to ask for a standby snapshot");
                return std::future::pending().await;
            }
        };
        loop {
            if let Err(e) = client
                .execute("SELECT pg_log_standby_snapshot()", &[])
                .await
            {
                let why = e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned());
                warn!(error = %why, "pg_log_standby_snapshot() on postgres.primary_url failed (the role needs \
                    GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO <role>)");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        created = creating => created,
        never = asking => never,
    }
}
