//! Everything before the first replication message (DESIGN.md §5a, §5): the
//! producer, both connections, the coverage proof and the features of the
//! server's major, the resume decision (create, resume, or repair a lost
//! slot), the first persist and START_REPLICATION.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::checkpoint::{
    DurableLsn, OffsetStore, PendingRepair, StoreError, StoredOffset, WitnessPosition,
};
use crate::config::{Config, Streaming};
use crate::metrics::Metrics;
use crate::outbox::OutboxMapper;
use crate::parking::ParkedTable;
use crate::pg::control::{self, SlotInfo, SlotLock};
use crate::pg::{
    Lsn, PgConnectConfig, PgError, PgTimestamp, ReplicationConnection, ReplicationStream,
    StartOptions, StreamOptions, SystemIdentity,
};

use super::coverage_watch::{self, ProofRecord, ProofTarget, StartProof};
use super::protocol;
use crate::error::PipelineError;
use crate::error::StartRefused;
use crate::pipeline::delivery::{Delivery, StartContext};
use crate::pipeline::options::{BreakRepair, RunOptions};
use crate::pipeline::resume::{self, ResumeInputs, ResumePlan};
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
    /// See `StartPositions::paged_through`.
    pub(super) paged_through: Lsn,
    /// The server streams large transactions in progress (pgoutput protocol 2).
    pub(super) streaming: bool,
}

/// How long the start-up waits for the broker to accept (or refuse) the
/// configured credentials; a broker that does not answer is not a refusal.
const KAFKA_SECURITY_PROBE: Duration = Duration::from_secs(5);

/// What every step may use: this run's settings, flags, store and metrics.
#[derive(Clone, Copy)]
struct Run<'a> {
    config: &'a Config,
    options: &'a RunOptions,
    store: &'a Arc<OffsetStore>,
    metrics: &'a Metrics,
    /// The parked aggregates shared with the other instances (dead-letter).
    parking: Option<&'a Arc<ParkedTable>>,
}

/// Everything before the first replication message (DESIGN.md §5a, §5), as
/// five steps: the connections and the producer, the coverage proof and the
/// server's features, the slot taken, the resume decision (create, resume,
/// or repair a lost slot), then the first persist and START_REPLICATION.
/// `None`: a repair-only run that is done.
pub(super) async fn bootstrap<D: Delivery>(
    config: &Config,
    options: &RunOptions,
    store: &Arc<OffsetStore>,
    metrics: &Metrics,
) -> Result<Option<Started<D>>, PipelineError> {
    let target = ProofTarget::of(config)?;
    let mut conn = Connections::<D>::open(config, metrics).await?;
    let server = ServerFacts::prove(config, store, &conn, target, options.break_repair).await?;
    // Parks made by another instance, before a lost slot's repair reads them.
    let parking = ParkedTable::of(config)?.map(Arc::new);
    if let Some(table) = &parking {
        table.share_into(store).await?;
    }
    let (slot_info, paged_through) = take_slot(store, &mut conn).await?;
    let run = Run {
        config,
        options,
        store,
        metrics,
        parking: parking.as_ref(),
    };
    let decision = StartDecision {
        paged_through,
        ..decide_start(run, &mut conn, slot_info.as_ref(), &server).await?
    };
    if options.repair_only {
        let slot = config.postgres.slot.as_str();
        info!(slot, start = %decision.start, "repair finished (or none was needed); not streaming (outbox-cdc repair)");
        let _ = conn.repl.close().await;
        return Ok(None);
    }
    start_streaming(run, conn, server, decision).await.map(Some)
}

/// Step 1: the replication connection, the producer, the broker's verdict
/// on the credentials, and the SQL connection.
struct Connections<D> {
    pg: PgConnectConfig,
    mapper: OutboxMapper,
    repl: ReplicationConnection,
    identity: SystemIdentity,
    delivery: D,
    client: tokio_postgres::Client,
    database: String,
    slot: String,
}

impl<D: Delivery> Connections<D> {
    async fn open(config: &Config, metrics: &Metrics) -> Result<Connections<D>, PipelineError> {
        let pg = PgConnectConfig::parse(&config.postgres.url)?;
        let mapper = OutboxMapper::new(&config.outbox)?;
        let mut repl =
            ReplicationConnection::connect(&pg, &config.postgres.application_name).await?;
        repl.set_stream_options(StreamOptions {
            status_interval: Duration::from_millis(config.postgres.status_interval_ms),
            ..StreamOptions::default()
        });
        let identity = repl.identify_system().await?;
        // The producer (its transactional id needs the cluster's identity): a
        // Kafka property librdkafka refuses fails here, before the slot or the
        // publication is touched.
        let delivery = D::create(config, metrics, &identity.system_id)?;
        // A password, CA or client certificate the broker refuses stops here,
        // with its cause, before anything is done on the database.
        crate::sink::refuse_rejected_security(&config.kafka, KAFKA_SECURITY_PROBE).await?;
        let client = pg.connect_sql().await?;
        let database = identity
            .dbname
            .clone()
            .or_else(|| pg.tokio_config().get_dbname().map(str::to_owned))
            .unwrap_or_default();
        Ok(Connections {
            pg,
            mapper,
            repl,
            identity,
            delivery,
            client,
            database,
            slot: config.postgres.slot.clone(),
        })
    }
}

/// Step 2: what the server proves and offers, all checked before the slot
/// is touched.
struct ServerFacts {
    proof: StartProof,
    proven_through: Lsn,
    on_standby: bool,
    streaming: bool,
}

impl ServerFacts {
    async fn prove<D>(
        config: &Config,
        store: &Arc<OffsetStore>,
        conn: &Connections<D>,
        target: ProofTarget,
        break_repair: Option<BreakRepair>,
    ) -> Result<ServerFacts, PipelineError> {
        let client = &conn.client;
        // Proof before the slot is touched (DESIGN.md §5a): the publication
        // carries every row of the outbox table, or the start is refused.
        let record = ProofRecord::of(config, store, &conn.identity.system_id);
        let (proof, proven_through) =
            coverage_watch::prove_at_start(client, config, target, record, break_repair).await?;
        let server_version = control::server_version_num(client).await?;
        let on_standby = control::in_recovery(client).await?;
        let streaming = refuse_missing_features(config, &conn.mapper, server_version, on_standby)?;
        Ok(ServerFacts {
            proof,
            proven_through,
            on_standby,
            streaming,
        })
    }
}

/// Features older majors lack are refused; returns whether the server
/// streams large transactions in progress.
fn refuse_missing_features(
    config: &Config,
    mapper: &OutboxMapper,
    server_version: i32,
    on_standby: bool,
) -> Result<bool, StartRefused> {
    if config.postgres.failover_slot && server_version < 170000 {
        return Err(StartRefused::FailoverSlotUnsupported { server_version });
    }
    if mapper.wants_messages() && server_version < 140000 {
        return Err(StartRefused::MessagesUnsupported { server_version });
    }
    let streaming = match config.postgres.streaming {
        Streaming::Off => false,
        Streaming::On if server_version < 140000 => {
            return Err(StartRefused::StreamingUnsupported { server_version });
        }
        Streaming::On => true,
        // A streamed logical message does not say which savepoint wrote it.
        Streaming::Auto => server_version >= 140000 && !mapper.wants_messages(),
    };
    if on_standby && server_version < 160000 {
        return Err(StartRefused::StandbyDecodingUnsupported { server_version });
    }
    Ok(streaming)
}

/// Step 3: the slot locked for the start (held until START_REPLICATION made
/// it ours: a peer repairing this slot's gap holds it exclusively, audit F6),
/// read, and handed to the delivery, which may adopt a position of its own
/// (exactly-once: the last Kafka commit's marker). Returns the slot's facts
/// and how far the witness's pages are complete (see
/// `StartPositions::paged_through`).
async fn take_slot<D: Delivery>(
    store: &Arc<OffsetStore>,
    conn: &mut Connections<D>,
) -> Result<(Option<SlotInfo>, Lsn), PipelineError> {
    let slot = conn.slot.as_str();
    if !control::try_lock_slot(&conn.client, slot, SlotLock::Starting).await? {
        return Err(PipelineError::RepairRunning {
            slot: slot.to_owned(),
        });
    }
    let slot_info = control::slot_info(&conn.client, slot).await?;
    refuse_unfinished_slot(slot, slot_info.as_ref())?;
    let paged_through = store.witness_paged_through(slot)?;
    conn.delivery
        .ready(StartContext {
            store,
            system_id: &conn.identity.system_id,
            slot_info: slot_info.as_ref(),
            repair_pending: store.pending_repair(slot)?.is_some(),
        })
        .await?;
    Ok((slot_info, paged_through))
}

/// A logical slot has no confirmed position until it reached a consistent
/// point, which waits for every transaction running when it was created (in
/// any database); a creator that died meanwhile leaves its walsender
/// finishing the creation. Taking such a slot over would store 0/0 and then
/// find the slot "ahead" of it.
fn refuse_unfinished_slot(slot: &str, info: Option<&SlotInfo>) -> Result<(), PipelineError> {
    match info.filter(|i| {
        i.plugin.is_some()
            && i.confirmed_flush_lsn.is_none()
            && i.wal_status.as_deref() != Some("lost")
    }) {
        Some(info) => Err(PipelineError::SlotNotReady {
            slot: slot.to_owned(),
            pid: info.active_pid,
        }),
        None => Ok(()),
    }
}

/// Step 4's outcome: where streaming starts and what the start must record.
struct StartDecision {
    start: Lsn,
    /// Transactions ending at or before it are dropped (sent before).
    skip_through: Lsn,
    /// Set when the slot was just created: what a gap repair would start
    /// from if it were lost before anything is acknowledged.
    created_at: Option<PgTimestamp>,
    witness_from: Option<WitnessPosition>,
    /// See `StartPositions::paged_through`.
    paged_through: Lsn,
    /// A gap repair took the slot's exclusive lock, to release once streaming.
    repair_locked: bool,
    /// The commit time of the offset stored before the start, once it was
    /// accepted for this cluster: the pruner's bound until the first persist.
    stored_time: Option<PgTimestamp>,
}

impl StartDecision {
    fn at(start: Lsn, skip_through: Lsn) -> StartDecision {
        StartDecision {
            start,
            skip_through,
            created_at: None,
            witness_from: None,
            paged_through: Lsn::ZERO,
            repair_locked: false,
            stored_time: None,
        }
    }

    fn repaired(start: Lsn) -> StartDecision {
        StartDecision {
            repair_locked: true,
            ..StartDecision::at(start, Lsn::ZERO)
        }
    }
}

/// Step 4: where streaming starts (see [`choose_start`]), with the stored
/// offset's commit time.
async fn decide_start<D>(
    run: Run<'_>,
    conn: &mut Connections<D>,
    slot_info: Option<&SlotInfo>,
    server: &ServerFacts,
) -> Result<StartDecision, PipelineError> {
    let Run { store, .. } = run;
    let stored = store.load(&conn.slot)?;
    let stored_time = stored
        .as_ref()
        .filter(|s| !s.commit_time_is_slot_creation)
        .and_then(|s| s.acked_commit_time);
    let at = StartAt {
        stored,
        slot_info,
        on_standby: server.on_standby,
    };
    let decision = choose_start(run, conn, at).await?;
    Ok(StartDecision {
        stored_time,
        ..decision
    })
}

/// What the start is decided from.
struct StartAt<'a> {
    stored: Option<StoredOffset>,
    slot_info: Option<&'a SlotInfo>,
    on_standby: bool,
}

/// An interrupted gap repair is finished first; otherwise the stored offset
/// and the slot decide (`resume::decide`): create the slot, recreate a lost
/// one and repair the gap, or resume.
async fn choose_start<D>(
    run: Run<'_>,
    conn: &mut Connections<D>,
    at: StartAt<'_>,
) -> Result<StartDecision, PipelineError> {
    let Run {
        config,
        options,
        store,
        ..
    } = run;
    let StartAt {
        stored,
        slot_info,
        on_standby,
    } = at;
    let slot = conn.slot.clone();
    if let Some(pending) = store.pending_repair(&slot)? {
        return finish_interrupted_repair(run, conn, slot_info, stored, &pending).await;
    }
    let plan = resume::decide(&ResumeInputs {
        slot: &slot,
        database: &conn.database,
        server_system_id: &conn.identity.system_id,
        server_flush_lsn: conn.identity.xlogpos,
        stored: stored.as_ref(),
        slot_info,
        create_slot: config.postgres.create_slot,
        recreate_slot: options.recreate_slot,
        allow_slot_ahead: config.postgres.allow_slot_ahead,
    })?;
    match plan {
        ResumePlan::CreateSlot => create_slot(config, conn, on_standby).await,
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
            let lost = LostSlot {
                stored,
                forgotten,
                drop_invalidated,
            };
            recreate_lost_slot(run, conn, lost).await
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
            Ok(StartDecision::at(start, skip_through))
        }
    }
}

/// A slot lost behind the stored offset.
struct LostSlot<'a> {
    stored: &'a StoredOffset,
    /// Where the slot had been when it was lost.
    forgotten: Lsn,
    /// It still exists, invalidated: dropped first.
    drop_invalidated: bool,
}

/// The gap's repair planned from the retained rows and recorded (so that an
/// interrupted one is finished at the next start), the invalidated slot
/// dropped, then the slot recreated and the gap published.
async fn recreate_lost_slot<D>(
    run: Run<'_>,
    conn: &mut Connections<D>,
    lost: LostSlot<'_>,
) -> Result<StartDecision, PipelineError> {
    let Run {
        config,
        options,
        store,
        ..
    } = run;
    let slot = conn.slot.clone();
    let parked = tokio::task::block_in_place(|| store.parked())?;
    let pending = repair::plan(
        &conn.client,
        config,
        lost.stored,
        &parked,
        options.accept_gap,
    )
    .await?;
    tokio::task::block_in_place(|| store.begin_repair(&slot, &pending))?;
    if lost.drop_invalidated {
        control::drop_slot(&conn.client, &slot).await?;
        warn!(slot, "dropped the invalidated replication slot");
    }
    warn!(slot, lost_at = %lost.forgotten, bound = %pending.bound,
            "replication slot lost: recreating it and repairing the gap from the outbox table");
    let at = locked_repair(run, conn, &pending, None).await?;
    Ok(StartDecision::repaired(at))
}

/// A gap repair that did not finish: finished before anything else, on the
/// slot it created (refused against another cluster).
async fn finish_interrupted_repair<D>(
    run: Run<'_>,
    conn: &mut Connections<D>,
    slot_info: Option<&SlotInfo>,
    stored: Option<StoredOffset>,
    pending: &PendingRepair,
) -> Result<StartDecision, PipelineError> {
    let system_id = &conn.identity.system_id;
    if let Some(stored) = stored.filter(|s| &s.system_id != system_id) {
        return Err(StartRefused::OtherCluster {
            slot: conn.slot.clone(),
            stored_lsn: stored.lsn,
            stored_system_id: stored.system_id,
            server_system_id: system_id.clone(),
        }
        .into());
    }
    warn!(slot = %conn.slot, stored = %pending.stored_lsn, "finishing a gap repair that was interrupted");
    let confirmed = slot_info.map(|s| s.confirmed_flush_lsn.unwrap_or(Lsn::ZERO));
    let at = locked_repair(run, conn, pending, confirmed).await?;
    Ok(StartDecision::repaired(at))
}

/// A gap repair under the slot's exclusive lock, held for the whole repair
/// and until this instance streams: no peer starts on the recreated slot
/// meanwhile.
async fn locked_repair<D>(
    run: Run<'_>,
    conn: &mut Connections<D>,
    pending: &PendingRepair,
    existing: Option<Lsn>,
) -> Result<Lsn, PipelineError> {
    let Run {
        config,
        store,
        metrics,
        ..
    } = run;
    if !control::try_lock_slot(&conn.client, &conn.slot, SlotLock::Repairing).await? {
        return Err(PipelineError::RepairRunning {
            slot: conn.slot.clone(),
        });
    }
    repair_lost_slot(
        &mut conn.repl,
        &conn.client,
        config,
        store,
        metrics,
        &conn.slot,
        &conn.identity.system_id,
        pending,
        existing,
    )
    .await
}

/// A new slot (on a standby, helped by the primary's snapshots), with the
/// time and transaction id everything it carries comes after.
async fn create_slot<D>(
    config: &Config,
    conn: &Connections<D>,
    on_standby: bool,
) -> Result<StartDecision, PipelineError> {
    let (client, slot) = (&conn.client, conn.slot.as_str());
    // What a gap repair would start from if this slot were lost before any
    // transaction is acknowledged: everything the slot will carry commits
    // after this moment.
    let created_at = server_clock(client).await?;
    let creating = control::create_logical_slot_with(client, slot, config.postgres.failover_slot);
    let at = match on_standby {
        true => with_standby_snapshots(config, creating).await?,
        false => creating.await?,
    };
    let witness_from = witness_start(config, client, &conn.identity.system_id).await?;
    info!(slot, lsn = %at, failover = config.postgres.failover_slot, "created replication slot");
    Ok(StartDecision {
        created_at: Some(created_at),
        witness_from,
        ..StartDecision::at(at, Lsn::ZERO)
    })
}

/// Step 5: the start persisted (it records the cluster identity on first
/// start and gives the first reportable, durable position), then
/// START_REPLICATION; the slot is ours, so the start's locks go.
async fn start_streaming<D>(
    run: Run<'_>,
    conn: Connections<D>,
    server: ServerFacts,
    decision: StartDecision,
) -> Result<Started<D>, PipelineError> {
    let Run {
        config,
        store,
        metrics,
        parking,
        ..
    } = run;
    let Connections {
        pg,
        mapper,
        repl,
        identity,
        delivery,
        client,
        slot,
        ..
    } = conn;
    let StartDecision {
        start,
        skip_through,
        created_at,
        witness_from,
        paged_through,
        repair_locked,
        stored_time,
    } = decision;
    let durable = tokio::task::block_in_place(|| match created_at {
        Some(at) => store.persist_created(&slot, start, &identity.system_id, at, witness_from),
        None => store.persist(&slot, start, &identity.system_id),
    })?;
    let options = StartOptions {
        messages: mapper.wants_messages(),
        streaming: server.streaming,
    };
    let publication = &config.postgres.publication;
    let stream = repl
        .start_logical_with(&slot, start, publication, options)
        .await?;
    let reported = first_report(config, &stream, start, durable);
    // The slot is ours now, so nobody else parks: the last parks another
    // instance made before it let go are read before the first event.
    if let Some(table) = parking {
        table.share_into(store).await?;
    }
    // The slot is active and ours now: peers see it busy.
    control::unlock_slot(&client, &slot, SlotLock::Starting).await?;
    if repair_locked {
        control::unlock_slot(&client, &slot, SlotLock::Repairing).await?;
    }
    metrics.set_acked(durable.lsn());
    metrics.set_connected(true);
    // The stored offset was accepted for this cluster: the pruner may use its time.
    metrics.durable_commit_time.set(stored_time);
    let witness_checks = witness_checks(config, &client, server.on_standby).await?;
    info!(slot, start = %start, skip_through = %skip_through, system_id = %identity.system_id, "streaming");
    Ok(Started {
        mapper,
        delivery,
        catalog: client,
        pg,
        stream,
        durable,
        system_id: identity.system_id,
        proof: server.proof,
        proven_through: server.proven_through,
        on_standby: server.on_standby,
        witness_checks,
        skip_through,
        reported,
        resent_from: start,
        paged_through,
        streaming: server.streaming,
    })
}

/// What the server hears as flushed at the start. With the sequence audit
/// on, the numbers of events between the slot's position (`start`) and the
/// stored offset may be missing from the store (a crash before they were
/// saved): the server sends them again from `start`, and reporting the
/// offset now would let a second crash skip them.
fn first_report(
    config: &Config,
    stream: &ReplicationStream,
    start: Lsn,
    durable: DurableLsn,
) -> Lsn {
    if config.audit.sequences != "off" && start < durable.lsn() {
        return start;
    }
    stream.feedback().set_flushed(durable);
    durable.lsn()
}

/// Whether the live witness checks this session's deliveries: on, reading
/// a primary, and the table has `occurred_at`.
async fn witness_checks(
    config: &Config,
    client: &tokio_postgres::Client,
    on_standby: bool,
) -> Result<bool, PipelineError> {
    if !config.reconcile.enabled || on_standby {
        return Ok(false);
    }
    let table = crate::coverage::configured_table(&config.outbox)?;
    let columns = crate::retained::table_columns(client, &table).await?;
    Ok(columns.iter().any(|(name, _)| name == "occurred_at"))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra_env: &[(&str, &str)]) -> Config {
        let text = r#"
            [postgres]
            url = "postgres://outbox:secret@127.0.0.1:54329/app"
            slot = "outbox_slot"
            [kafka]
            "bootstrap.servers" = "127.0.0.1:19092"
        "#;
        let env = extra_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()));
        Config::from_sources("test.toml", text, env).expect("a valid configuration")
    }

    fn features(config: &Config, version: i32, on_standby: bool) -> Result<bool, StartRefused> {
        let mapper = OutboxMapper::new(&config.outbox).unwrap();
        refuse_missing_features(config, &mapper, version, on_standby)
    }

    #[test]
    fn features_an_older_major_lacks_are_refused_before_the_slot_is_touched() {
        let auto = config(&[]);
        assert_eq!(
            features(&auto, 130000, false),
            Ok(false),
            "auto: no streaming on 13"
        );
        assert_eq!(features(&auto, 140000, false), Ok(true));
        assert!(matches!(
            features(&auto, 150000, true),
            Err(StartRefused::StandbyDecodingUnsupported { .. })
        ));
        assert_eq!(features(&auto, 160000, true), Ok(true));
        let on = config(&[("OUTBOX_CDC__POSTGRES__STREAMING", "on")]);
        assert!(matches!(
            features(&on, 130000, false),
            Err(StartRefused::StreamingUnsupported { .. })
        ));
        let off = config(&[("OUTBOX_CDC__POSTGRES__STREAMING", "off")]);
        assert_eq!(features(&off, 180000, false), Ok(false));
        let failover = config(&[("OUTBOX_CDC__POSTGRES__FAILOVER_SLOT", "true")]);
        assert!(matches!(
            features(&failover, 160000, false),
            Err(StartRefused::FailoverSlotUnsupported { .. })
        ));
        assert_eq!(features(&failover, 170000, false), Ok(true));
    }

    #[test]
    fn a_slot_still_being_created_is_not_taken_over() {
        let info = |confirmed: Option<Lsn>, wal_status: &str| SlotInfo {
            slot_name: "outbox_slot".into(),
            plugin: Some("pgoutput".into()),
            database: Some("app".into()),
            active_pid: Some(4242),
            confirmed_flush_lsn: confirmed,
            restart_lsn: None,
            wal_status: Some(wal_status.into()),
            safe_wal_size: None,
        };
        let creating = info(None, "reserved");
        assert!(matches!(
            refuse_unfinished_slot("outbox_slot", Some(&creating)),
            Err(PipelineError::SlotNotReady {
                pid: Some(4242),
                ..
            })
        ));
        // A lost slot has no position either: the resume decision repairs it.
        assert!(refuse_unfinished_slot("outbox_slot", Some(&info(None, "lost"))).is_ok());
        let ready = info(Some(Lsn::new(0x100)), "reserved");
        assert!(refuse_unfinished_slot("outbox_slot", Some(&ready)).is_ok());
        assert!(refuse_unfinished_slot("outbox_slot", None).is_ok());
    }
}
