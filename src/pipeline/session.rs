//! One replication session: connect, decide where to resume, stream until a
//! failure or shutdown. A new session is started by the caller after a failure.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::Disposition;
use crate::checkpoint::{AckTracker, DurableLsn, EventToken, OffsetStore, StoreError};
use crate::config::Config;
use crate::coverage::{self, Coverage, CoverageProblem, Known, NotCovered, RelationKind};
use crate::metrics::{Metrics, Stage};
use crate::outbox::{BoundRelation, ChangeContext, OutboxEvent, OutboxMapper};
use crate::pg::control::{self, SlotLock};
use crate::pg::{
    EventPosition, FeedbackHandle, Lsn, PgConnectConfig, PgError, PgTimestamp,
    ReplicationConnection, ReplicationEvent, StreamOptions,
};
use crate::pgoutput::{self, Message, RelationCache};
use crate::sink::{DeliveryReport, KafkaSink, Marker};

use super::batch::{BatchPolicy, Overrun};
use super::poison::{PoisonPolicyRouter, Route, row_as_json};
use super::repair;
use super::resume::{self, ResumeInputs, ResumePlan, StartRefused};
use super::sequences::SequenceWatch;
use super::{PipelineError, RunOptions};

/// What travels with each record through librdkafka and comes back in its report.
#[derive(Debug)]
pub(crate) struct InFlight {
    token: EventToken,
    commit_time: PgTimestamp,
    at: EventPosition,
    /// Moved out of the event (the sink does not read them): what a broker-side
    /// poison failure parks under the dead-letter policy.
    aggregate_type: String,
    aggregate_id: String,
    /// Already on its way to the dead-letter topic: a refusal now is final.
    dead_lettered: bool,
    /// When it was handed to the producer.
    produced_at: Instant,
}

/// The transaction being received.
struct OpenTx {
    commit_time: PgTimestamp,
    /// Where its commit record starts (Begin's final_lsn): its events' place
    /// in commit order.
    commit_lsn: Lsn,
    /// Already acknowledged before a restart: its events are dropped, not re-sent.
    replayed: bool,
}

/// Exactly-once delivery in a session (`[delivery] mode = "exactly-once"`).
struct Transactions {
    policy: BatchPolicy,
    /// Where this stream's markers go.
    topic: String,
    partition: i32,
}

/// SQLSTATE `cannot_connect_now`: "the database system is shutting down".
const SHUTTING_DOWN: &str = "57P03";

/// A coverage re-proof: the problems found, and the WAL position it holds for.
/// A re-proof's problems, the WAL position it proves through and the
/// catalog rows it rests on (none without a publication).
type ReproofTask = JoinHandle<
    Result<
        (
            Vec<CoverageProblem>,
            Lsn,
            Option<coverage::PublicationIdentity>,
        ),
        PgError,
    >,
>;

pub(crate) struct Session<'a> {
    config: &'a Config,
    store: &'a Arc<OffsetStore>,
    metrics: &'a Metrics,
    mapper: OutboxMapper,
    sink: KafkaSink<InFlight>,
    reports: mpsc::UnboundedReceiver<DeliveryReport<InFlight>>,
    tracker: AckTracker,
    feedback: FeedbackHandle,
    durable: DurableLsn,
    system_id: String,
    /// Descriptions of the outbox relations (root, partitions), for the
    /// dead-letter record of a row that cannot be mapped.
    relations: RelationCache,
    /// Relations positively known to be other tables: their changes are skipped.
    other_tables: HashSet<u32>,
    bound: HashMap<u32, BoundRelation>,
    /// What start-up proved the stream carries; decides every Relation.
    coverage: Coverage,
    /// Control connection for looking up relations start-up did not know and
    /// for re-proving coverage.
    catalog: Arc<tokio_postgres::Client>,
    /// The running re-proof of coverage (its problems, and the WAL position
    /// it holds for), and when the last one started.
    reproof: Option<ReproofTask>,
    reproof_started: Instant,
    open: Option<OpenTx>,
    skip_through: Lsn,
    /// The server was a standby when the session started: its shutdown never
    /// lifts the proof ceiling (see [`Session::reprove_coverage`]).
    on_standby: bool,
    poison: PoisonPolicyRouter,
    /// Live gap detection over aggregate sequences.
    sequences: SequenceWatch,
    /// The send time and arrival of the XLogData being handled (for
    /// `outbox_cdc_stage_seconds`).
    sent_at: PgTimestamp,
    received_at: Instant,
    /// When the numbers were last taken for the store (`audit.save_interval_ms`).
    sequences_taken_at: Instant,
    /// The last position given to the feedback handle. It trails `durable`
    /// while numbers recorded for events before `durable` are not in the
    /// store: after a crash the server sends that stretch again, and the
    /// numbers are read back from it.
    reported: Lsn,
    /// The server is sending again what came before `skip_through` (set at
    /// the start when `reported` trails the offset): until the stream passes
    /// it, the numbers it carries are not all recorded, and nothing newer
    /// than `reported` may be reported.
    replaying: bool,
    /// Set when the tracker advanced past `durable`, or `durable` past `reported`.
    dirty_since: Option<Instant>,
    /// A persist running on a blocking thread (one at a time); its result is
    /// the only way a new flush position reaches the feedback handle.
    persisting: Option<JoinHandle<Result<Persisted, StoreError>>>,
    /// Exactly-once delivery's Kafka transactions; `None`: at least once.
    transactions: Option<Transactions>,
    /// The commit time of the last transaction read past the resume point
    /// (a marker carries it).
    last_commit_time: Option<PgTimestamp>,
}

/// What one persist made durable.
struct Persisted {
    durable: DurableLsn,
    /// Every number recorded before the persist was in the store with it:
    /// the position may be reported to PostgreSQL.
    reportable: bool,
}

/// What bootstrap hands to streaming.
struct Started {
    mapper: OutboxMapper,
    sink: KafkaSink<InFlight>,
    reports: mpsc::UnboundedReceiver<DeliveryReport<InFlight>>,
    /// The SQL connection bootstrap used; streaming keeps it for catalog
    /// lookups and re-proofs.
    catalog: tokio_postgres::Client,
    stream: crate::pg::ReplicationStream,
    /// The start position, persisted and flushed.
    durable: DurableLsn,
    system_id: String,
    coverage: Coverage,
    /// The WAL position the start-up proof holds for.
    proven_through: Lsn,
    on_standby: bool,
    skip_through: Lsn,
    /// What was reported to PostgreSQL at the start (see `Session::reported`).
    reported: Lsn,
    transactions: Option<Transactions>,
}

/// How long the start-up waits for the broker to accept (or refuse) the
/// configured credentials; a broker that does not answer is not a refusal.
const KAFKA_SECURITY_PROBE: Duration = Duration::from_secs(5);

/// Everything before the first replication message (DESIGN.md §5a, §5): the
/// producer, both connections, the coverage proof and the features of the
/// server's major, the resume decision (create, resume, or repair a lost
/// slot), the first persist and START_REPLICATION. `None`: a repair-only run
/// that is done.
async fn bootstrap(
    config: &Config,
    options: &RunOptions,
    store: &Arc<OffsetStore>,
    metrics: &Metrics,
) -> Result<Option<Started>, PipelineError> {
    let pg = PgConnectConfig::parse(&config.postgres.url)?;
    let slot = config.postgres.slot.as_str();
    let mapper = OutboxMapper::new(&config.outbox)?;

    // The producer first: a Kafka property librdkafka refuses fails here,
    // before anything is done on the database. A transactional producer's
    // id needs the cluster's identity: it is created below, and this one
    // only checks the properties.
    let (sink, reports) = KafkaSink::with_topics(&config.kafka, &config.topics)?;
    // A password, CA or client certificate the broker refuses stops here,
    // with its cause, before anything is done on the database.
    crate::sink::refuse_rejected_security(&config.kafka, KAFKA_SECURITY_PROBE).await?;

    let client = pg.connect_sql().await?;
    let mut repl = ReplicationConnection::connect(&pg, &config.postgres.application_name).await?;
    repl.set_stream_options(StreamOptions {
        status_interval: Duration::from_millis(config.postgres.status_interval_ms),
        ..StreamOptions::default()
    });
    let identity = repl.identify_system().await?;
    let database = identity
        .dbname
        .clone()
        .or_else(|| pg.tokio_config().get_dbname().map(str::to_owned))
        .unwrap_or_default();

    // Proof before the slot is touched (DESIGN.md §5a): the publication
    // carries every row of the outbox table, or the start is refused.
    let (coverage, proven_through) = prove_coverage(&client, config).await?;
    // Features older majors lack: refused before the slot is touched.
    let server_version = control::server_version_num(&client).await?;
    if config.postgres.failover_slot && server_version < 170000 {
        return Err(StartRefused::FailoverSlotUnsupported { server_version }.into());
    }
    if mapper.wants_messages() && server_version < 140000 {
        return Err(StartRefused::MessagesUnsupported { server_version }.into());
    }
    let on_standby = control::in_recovery(&client).await?;
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
    let (sink, reports, transactions) = if config.delivery.exactly_once() {
        drop(sink);
        let pending = store.pending_repair(slot)?.is_some();
        start_transactions(
            config,
            store,
            &identity.system_id,
            slot_info.as_ref(),
            pending,
        )
        .await?
    } else {
        (sink, reports, None)
    };
    let stored = store.load(slot)?;
    let pending = store.pending_repair(slot)?;
    let mut created_at: Option<PgTimestamp> = None;
    let repair_locked = std::sync::atomic::AtomicBool::new(false);
    // Both ways into a gap repair (an interrupted one, a lost slot) end here.
    let mut repair = async |pending: &crate::checkpoint::PendingRepair, existing: Option<Lsn>| {
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
                let pending = repair::plan(&client, config, stored, options.accept_gap).await?;
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
        Some(at) => store.persist_created(slot, start, &identity.system_id, at),
        None => store.persist(slot, start, &identity.system_id),
    })?;
    let stream = repl
        .start_logical(
            slot,
            start,
            &config.postgres.publication,
            mapper.wants_messages(),
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
    info!(slot, start = %start, skip_through = %skip_through, system_id = %identity.system_id, "streaming");
    Ok(Some(Started {
        mapper,
        sink,
        reports,
        catalog: client,
        stream,
        durable,
        system_id: identity.system_id,
        coverage,
        proven_through,
        on_standby,
        skip_through,
        reported,
        transactions,
    }))
}

/// Exactly-once start (DESIGN.md §14): the transactional producer, fencing
/// any older one of this stream, then the last committed marker; a marker
/// beyond the stored offset becomes the stored offset (the resume point is
/// the greater of the two). Refused while another process holds the slot:
/// a standby waiting for the slot must not fence the instance that streams.
async fn start_transactions(
    config: &Config,
    store: &Arc<OffsetStore>,
    system_id: &str,
    slot_info: Option<&control::SlotInfo>,
    repair_pending: bool,
) -> Result<
    (
        KafkaSink<InFlight>,
        mpsc::UnboundedReceiver<DeliveryReport<InFlight>>,
        Option<Transactions>,
    ),
    PipelineError,
> {
    let slot = config.postgres.slot.as_str();
    if let Some(pid) = slot_info.and_then(|s| s.active_pid) {
        return Err(PipelineError::SlotBusy {
            slot: slot.to_owned(),
            pid,
        });
    }
    let delivery = &config.delivery;
    let id = crate::sink::transactional_id(system_id, slot);
    let timeout = delivery.transaction_timeout();
    let (sink, reports) = KafkaSink::transactional(&config.kafka, &config.topics, &id, timeout)?;
    tokio::task::block_in_place(|| sink.init_transactions(timeout))?;
    let key = Marker::key(system_id, slot);
    let topic = delivery.offsets_topic.clone();
    let partition = sink.offsets_partition(&topic, &key).await?;
    let marker = tokio::task::block_in_place(|| {
        crate::sink::read_marker(&config.kafka, &topic, partition, system_id, slot, timeout)
    })?;
    let stored = store.load(slot)?;
    info!(slot, transactional_id = %id, offsets_topic = %topic, marker = ?marker.as_ref().map(|m| m.lsn),
        stored = ?stored.as_ref().map(|s| s.lsn), "exactly-once delivery: transactional producer ready");
    if let Some(marker) = marker
        && !repair_pending
        && stored
            .as_ref()
            .is_none_or(|s| s.system_id == system_id && s.lsn < marker.lsn)
    {
        // Committed in Kafka, not yet stored here (a crash between the two,
        // or a store lost or new): what the marker covers is published.
        warn!(slot, marker = %marker.lsn, stored = ?stored.as_ref().map(|s| s.lsn),
            "the last committed Kafka transaction is beyond the stored offset: resuming after it");
        tokio::task::block_in_place(|| {
            store.persist_acked(slot, marker.lsn, system_id, marker.commit_time)
        })?;
    }
    let transactions = Transactions {
        policy: BatchPolicy::new(delivery, config.limits.max_in_flight_events),
        topic,
        partition,
    };
    Ok((sink, reports, Some(transactions)))
}

/// Where the streaming loop is.
#[derive(Clone, Copy)]
enum Phase {
    Streaming,
    /// A stop was asked at `since`: reading on to the end of the open
    /// transaction (bounded by half of `limits.shutdown_timeout_ms`), then
    /// draining.
    Finishing {
        since: Instant,
    },
}

impl<'a> Session<'a> {
    /// One session: bootstrap, stream until a stop is asked or an error
    /// ends it, drain. An error exit still persists what was acknowledged
    /// ([`Session::keep_acknowledged`]).
    pub(crate) async fn run(
        config: &'a Config,
        options: RunOptions,
        store: &'a Arc<OffsetStore>,
        metrics: &'a Metrics,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), PipelineError> {
        let Some(started) = bootstrap(config, &options, store, metrics).await? else {
            return Ok(());
        };
        let (mut session, stream) = Session::new(config, store, metrics, started);
        match session.stream(stream, shutdown).await {
            Ok(()) => Ok(()),
            Err(failure) => Err(session.keep_acknowledged(failure).await),
        }
    }

    fn new(
        config: &'a Config,
        store: &'a Arc<OffsetStore>,
        metrics: &'a Metrics,
        started: Started,
    ) -> (Session<'a>, crate::pg::ReplicationStream) {
        let mut tracker = AckTracker::new(started.durable.lsn());
        tracker.prove_through(started.proven_through);
        let session = Session {
            config,
            store,
            metrics,
            mapper: started.mapper,
            sink: started.sink,
            reports: started.reports,
            tracker,
            feedback: started.stream.feedback(),
            durable: started.durable,
            system_id: started.system_id,
            relations: RelationCache::new(),
            other_tables: HashSet::new(),
            bound: HashMap::new(),
            coverage: started.coverage,
            catalog: Arc::new(started.catalog),
            reproof: None,
            reproof_started: Instant::now(),
            open: None,
            skip_through: started.skip_through,
            on_standby: started.on_standby,
            poison: PoisonPolicyRouter::new(&config.outbox),
            sequences: SequenceWatch::new(&config.audit),
            sequences_taken_at: Instant::now(),
            sent_at: PgTimestamp(0),
            received_at: Instant::now(),
            reported: started.reported,
            replaying: started.reported < started.durable.lsn(),
            dirty_since: (started.reported < started.durable.lsn()).then(Instant::now),
            persisting: None,
            transactions: started.transactions,
            last_commit_time: None,
        };
        (session, started.stream)
    }

    /// Streams until a stop is asked (then finishes the open transaction and
    /// drains) or an error ends the session.
    async fn stream(
        &mut self,
        mut stream: crate::pg::ReplicationStream,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), PipelineError> {
        let flush_every = Duration::from_millis(self.config.offsets.flush_interval_ms);
        let mut tick = tokio::time::interval(flush_every.min(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let limits = &self.config.limits;
        let shutdown_grace = Duration::from_millis(limits.shutdown_timeout_ms / 2);
        let mut phase = Phase::Streaming;
        loop {
            // Transactions without events still wait in the tracker behind an
            // unacknowledged one: bound them too, or a Kafka outage during heavy
            // traffic on other published tables would grow memory without limit.
            let has_room = self.tracker.in_flight_events() < limits.max_in_flight_events
                && self.tracker.in_flight_bytes() < limits.max_in_flight_bytes
                && self.tracker.pending_transactions()
                    < limits.max_in_flight_events.saturating_mul(4);
            // Stop at a transaction boundary: a transaction whose events are out
            // but whose Commit has not been read would be re-sent after a
            // graceful restart. Reading on until its Commit is bounded.
            if let Phase::Finishing { since } = phase
                && (self.open.is_none() || since.elapsed() >= shutdown_grace)
            {
                return self.drain(stream).await;
            }
            // Biased: the branches in priority order.
            // 1. A stop request (while streaming): finish the open transaction.
            // 2. The tick (persist, feedback, proofs): before everything that
            //    can flood, so a steady stream of delivery reports never
            //    starves persisting, and so feedback.
            // 3. A finished persist: its durable position goes to the server.
            // 4. Delivery reports, up to 1024 at a time.
            // 5. The next replication message, while the in-flight limits
            //    leave room.
            tokio::select! {
                biased;
                changed = shutdown.changed(), if matches!(phase, Phase::Streaming) => {
                    if changed.is_err() || *shutdown.borrow() {
                        phase = Phase::Finishing { since: Instant::now() };
                    }
                }
                _ = tick.tick() => self.on_tick().await?,
                done = async {
                    match self.persisting.as_mut() {
                        Some(running) => running.await,
                        None => std::future::pending().await,
                    }
                }, if self.persisting.is_some() => {
                    self.persisting = None;
                    let durable = done.map_err(|e| self.persist_failed(e))??;
                    self.flushed(durable);
                }
                Some(report) = self.reports.recv() => {
                    let now = Now::read();
                    self.on_report(report, now)?;
                    // Take what else has arrived in one go, bounded, then read again.
                    for _ in 0..1024 {
                        match self.reports.try_recv() {
                            Ok(report) => self.on_report(report, now)?,
                            Err(_) => break,
                        }
                    }
                }
                event = stream.recv(), if has_room => match event? {
                    Some(event) => self.on_replication_event(event).await?,
                    None => return Err(PipelineError::StreamEnded),
                },
            }
        }
    }

    async fn on_replication_event(&mut self, event: ReplicationEvent) -> Result<(), PipelineError> {
        match event {
            ReplicationEvent::XLogData {
                wal_start,
                wal_end,
                server_time,
                data,
            } => {
                // The stage clock is read only for the messages that can
                // become events (Insert, Message): three per one-event
                // transaction would be read otherwise.
                if matches!(
                    data.first(),
                    Some(&(pgoutput::tag::INSERT | pgoutput::tag::MESSAGE))
                ) {
                    self.received_at = Instant::now();
                }
                self.sent_at = server_time;
                self.metrics.set_received(wal_end.max(wal_start));
                let message = pgoutput::decode(&data).map_err(|source| PipelineError::Decode {
                    lsn: wal_start,
                    source,
                })?;
                crate::failpoint!("after-receive");
                self.on_message(wal_start, message).await
            }
            ReplicationEvent::Keepalive { wal_end, .. } => {
                self.metrics.set_received(wal_end);
                if self.open.is_none() {
                    if wal_end >= self.skip_through {
                        self.replaying = false;
                    }
                    self.feedback.set_written(wal_end.max(self.durable.lsn()));
                    if self.tracker.idle_advance(wal_end).is_some() {
                        self.mark_dirty();
                    }
                }
                Ok(())
            }
        }
    }

    async fn on_message(&mut self, lsn: Lsn, message: Message) -> Result<(), PipelineError> {
        match message {
            Message::Begin(begin) => {
                if self.open.is_some() {
                    return Err(protocol(lsn, "Begin inside an open transaction"));
                }
                // A transaction's commit record starts at final_lsn and ends at its
                // end_lsn; offsets are end_lsns or record boundaries after them, so a
                // commit that starts before the stored offset ended at or before it.
                let replayed = begin.final_lsn < self.skip_through;
                if !replayed {
                    self.replaying = false;
                    self.tracker
                        .begin(begin.commit_time)
                        .map_err(|e| protocol(lsn, e))?;
                }
                self.open = Some(OpenTx {
                    commit_time: begin.commit_time,
                    commit_lsn: begin.final_lsn,
                    replayed,
                });
            }
            Message::Commit(commit) => {
                let Some(tx) = self.open.take() else {
                    return Err(protocol(lsn, "Commit without Begin"));
                };
                if tx.replayed {
                    if commit.end_lsn > self.skip_through {
                        return Err(protocol(
                            lsn,
                            format!(
                                "transaction ending at {} was treated as already acknowledged (offset {}); refusing to continue",
                                commit.end_lsn, self.skip_through
                            ),
                        ));
                    }
                    debug!(end_lsn = %commit.end_lsn, "dropped a transaction acknowledged before the restart");
                } else {
                    if self
                        .tracker
                        .commit(commit.end_lsn)
                        .map_err(|e| protocol(lsn, e))?
                        .is_some()
                    {
                        self.mark_dirty();
                    }
                    self.last_commit_time = Some(tx.commit_time);
                    let now = Instant::now();
                    if self
                        .transactions
                        .as_mut()
                        .is_some_and(|t| t.policy.due_at_commit(now))
                    {
                        self.commit_kafka_transaction(commit.end_lsn).await?;
                    }
                }
                self.feedback.set_written(commit.end_lsn);
            }
            Message::Relation(relation) => {
                let kind = match self.coverage.classify(&relation) {
                    Known::Is(kind) => kind,
                    Known::LookUp => {
                        let now =
                            coverage::lookup(&self.catalog, relation.oid, self.coverage.root_oid())
                                .await?;
                        self.coverage.resolve(&relation, lsn, now.as_ref())?
                    }
                };
                match kind {
                    RelationKind::Outbox => {
                        let bound = self
                            .mapper
                            .bind(&relation)
                            .map_err(|source| PipelineError::Mapping { lsn, source })?;
                        self.bound.insert(relation.oid, bound);
                        self.other_tables.remove(&relation.oid);
                        self.relations.apply(relation);
                    }
                    RelationKind::Other => {
                        // Only the OID is kept: under FOR ALL TABLES with table
                        // churn, a full description per table ever seen would
                        // grow without bound.
                        self.bound.remove(&relation.oid);
                        self.relations.remove(relation.oid);
                        self.other_tables.insert(relation.oid);
                    }
                }
            }
            Message::Insert(insert) => {
                let Some(tx) = self.open.as_ref() else {
                    return Err(protocol(lsn, "Insert outside a transaction"));
                };
                let Some(bound) = self.bound.get(&insert.relation_oid) else {
                    if !self.other_tables.contains(&insert.relation_oid) {
                        return Err(protocol(
                            lsn,
                            format!(
                                "Insert for relation OID {} that was never described",
                                insert.relation_oid
                            ),
                        ));
                    }
                    return Ok(()); // another table in the publication
                };
                let ctx = ChangeContext {
                    lsn,
                    commit_time: tx.commit_time,
                };
                if tx.replayed {
                    self.metrics.deduplicated();
                    if self.sequences.is_on()
                        && let Ok(event) = self.mapper.map_insert(bound, &insert.new, &ctx)
                    {
                        self.replayed_sequence(&event, lsn)?;
                    }
                    return Ok(());
                }
                let (commit_time, at) = (tx.commit_time, EventPosition::new(tx.commit_lsn, lsn));
                let mapped = self.mapper.map_insert(bound, &insert.new, &ctx);
                let relation = self.relations.get(insert.relation_oid);
                let max_raw = self.config.outbox.max_record_bytes / 2;
                let raw = || row_as_json(relation, &insert.new, max_raw);
                let route = self
                    .poison
                    .route(mapped, raw, self.store, at, commit_time)?;
                self.publish(route, at, commit_time).await?;
            }
            Message::Message(msg) => {
                if self.mapper.is_stray_event_message(&msg) {
                    // Sent at once, even if the emitting transaction rolls
                    // back: never an event, but the writer meant one.
                    self.metrics.failed();
                    warn!(lsn = %lsn, prefix = %msg.prefix,
                        "a non-transactional logical message carries the event prefix and is NOT published: \
                         emit events with pg_logical_emit_message(true, ...)");
                    return Ok(());
                }
                let Some(tx) = self.open.as_ref() else {
                    return Ok(()); // non-transactional messages are not events
                };
                if !msg.transactional {
                    return Ok(());
                }
                let ctx = ChangeContext {
                    lsn,
                    commit_time: tx.commit_time,
                };
                let (replayed, commit_time) = (tx.replayed, tx.commit_time);
                let at = EventPosition::new(tx.commit_lsn, lsn);
                match self.mapper.map_message(&msg, &ctx).transpose() {
                    None => {}
                    Some(mapped) if replayed => {
                        self.metrics.deduplicated();
                        if let Ok(event) = mapped {
                            self.replayed_sequence(&event, lsn)?;
                        }
                    }
                    Some(mapped) => {
                        let raw = || msg.content.clone();
                        let route = self
                            .poison
                            .route(mapped, raw, self.store, at, commit_time)?;
                        self.publish(route, at, commit_time).await?;
                    }
                }
            }
            // Updates, deletes and truncates of the outbox table are not events
            // (the Debezium-style writer deletes its rows in the same transaction).
            Message::Update(_)
            | Message::Delete(_)
            | Message::Truncate(_)
            | Message::Type(_)
            | Message::Origin(_) => {}
        }
        Ok(())
    }

    /// Sends one routed record, in commit order.
    async fn publish(
        &mut self,
        route: Route,
        at: EventPosition,
        commit_time: PgTimestamp,
    ) -> Result<(), PipelineError> {
        let lsn = at.change();
        let (mut event, dead_lettered) = match route {
            Route::Publish(event) => {
                self.check_sequence(&event, lsn)?;
                (event, false)
            }
            Route::DeadLetter(event) => {
                self.metrics.record_dead_lettered(&header_text(
                    &event,
                    super::poison::H_DLQ_ORIGINAL_TOPIC,
                ));
                (event, true)
            }
        };
        let token = self
            .tracker
            .add_event(event.size_bytes())
            .map_err(|e| protocol(lsn, e))?;
        let produced_at = Instant::now();
        self.observe_arrival(commit_time, produced_at);
        let size = event.size_bytes();
        self.begin_kafka_transaction()?;
        let in_flight = InFlight {
            token,
            commit_time,
            at,
            aggregate_type: std::mem::take(&mut event.aggregate_type),
            aggregate_id: std::mem::take(&mut event.aggregate_id),
            dead_lettered,
            produced_at,
        };
        if let Err((source, in_flight)) = self.sink.send_or_return(&event, in_flight).await {
            // Refused before it left (e.g. over message.max.bytes): the same
            // policy as a refusal reported by the broker.
            let (aggregate_type, aggregate_id) = in_flight
                .map(|f| (f.aggregate_type, f.aggregate_id))
                .unwrap_or_default();
            return Err(self.refused(
                source,
                at,
                event.event_id.clone(),
                aggregate_type,
                aggregate_id,
                dead_lettered,
            ));
        }
        if let Some(t) = self.transactions.as_mut() {
            t.policy.added(size);
        }
        crate::failpoint!("after-produce-before-ack");
        self.metrics.set_in_flight(
            self.tracker.in_flight_events(),
            self.tracker.in_flight_bytes(),
            None,
        );
        Ok(())
    }

    /// The stages of an event before the producer: commit to the walsender's
    /// send, send to arrival (wall clocks), arrival to `produced_at`.
    fn observe_arrival(&self, commit_time: PgTimestamp, produced_at: Instant) {
        let seconds = |micros: i64| micros.max(0) as f64 / 1e6;
        let handled = produced_at.duration_since(self.received_at);
        // The wall clock is read once, here: the arrival is now minus the
        // handling measured on the monotonic clock.
        let arrived = PgTimestamp::now().0 - handled.as_micros() as i64;
        let m = self.metrics;
        m.stage(Stage::CommitToSend, seconds(self.sent_at.0 - commit_time.0));
        m.stage(Stage::SendToReceive, seconds(arrived - self.sent_at.0));
        m.stage(Stage::ReceiveToProduce, handled.as_secs_f64());
    }

    /// Live gap detection (`[audit]`): a number that does not follow the
    /// aggregate's last published one is counted and logged, and under
    /// `on_gap = "stop"` ends the session before the event is produced.
    fn check_sequence(&mut self, event: &OutboxEvent, lsn: Lsn) -> Result<(), PipelineError> {
        let Some(seq) = event.aggregate_sequence else {
            return Ok(());
        };
        let gap = self.sequences.observe(
            &mut stored_sequence(self.store),
            &event.aggregate_type,
            &event.aggregate_id,
            seq,
            lsn,
        )?;
        let Some(gap) = gap else {
            return Ok(());
        };
        self.metrics.record_sequence_gap(&gap.aggregate_type);
        warn!(aggregate_type = %gap.aggregate_type, aggregate_id = %gap.aggregate_id,
            previous = ?gap.previous, got = gap.got, lsn = %gap.lsn, kind = ?gap.kind,
            "aggregate sequence gap");
        if self.sequences.stop_on_gap {
            return Err(PipelineError::SequenceGap(gap));
        }
        Ok(())
    }

    /// An event sent again after a restart: its number moves the
    /// aggregate's state (it may not have reached the store), unjudged.
    fn replayed_sequence(&mut self, event: &OutboxEvent, lsn: Lsn) -> Result<(), PipelineError> {
        let Some(seq) = event.aggregate_sequence else {
            return Ok(());
        };
        self.sequences.replayed(
            &mut stored_sequence(self.store),
            &event.aggregate_type,
            &event.aggregate_id,
            seq,
            lsn,
        )?;
        Ok(())
    }

    /// A record Kafka will not take. Under the dead-letter policy a refused
    /// main-topic record parks its aggregate and ends the session: later events
    /// of that aggregate may already be queued behind it, so the stream is
    /// replayed from the durable LSN, where the parked aggregate's events go to
    /// the dead-letter topic in order. Anything else stops the session.
    fn refused(
        &mut self,
        source: crate::sink::SinkError,
        at: EventPosition,
        event_id: String,
        aggregate_type: String,
        aggregate_id: String,
        dead_lettered: bool,
    ) -> PipelineError {
        let lsn = at.change();
        self.metrics.failed();
        match source.disposition() {
            Disposition::RecordRefused
                if self.poison.dead_letters() && !dead_lettered && !aggregate_id.is_empty() =>
            {
                let reason = source.to_string();
                let parked = tokio::task::block_in_place(|| {
                    self.store.park(&aggregate_type, &aggregate_id, &reason, at)
                });
                if let Err(e) = parked {
                    return e.into();
                }
                PipelineError::Parked {
                    aggregate_type,
                    aggregate_id,
                    lsn,
                    reason,
                }
            }
            Disposition::RecordRefused => PipelineError::Poison {
                event_id,
                lsn,
                reason: source.to_string(),
                refusal: Some(Box::new(source)),
            },
            Disposition::Retry | Disposition::Stop => PipelineError::Delivery {
                event_id,
                lsn,
                source,
            },
        }
    }

    /// One delivery report, taken at `now` (read once per batch of reports:
    /// the batch is handled within microseconds).
    fn on_report(
        &mut self,
        report: DeliveryReport<InFlight>,
        now: Now,
    ) -> Result<(), PipelineError> {
        let InFlight {
            token,
            commit_time,
            at: position,
            aggregate_type,
            aggregate_id,
            dead_lettered,
            produced_at,
        } = report.token;
        match report.result {
            Ok(_) => {
                let at = report.reported_at;
                self.metrics.stage(
                    Stage::ProduceToAck,
                    at.duration_since(produced_at).as_secs_f64(),
                );
                self.metrics.stage(
                    Stage::AckToTracker,
                    now.instant.saturating_duration_since(at).as_secs_f64(),
                );
                let age = now.wall.0.saturating_sub(commit_time.0).max(0) as u64;
                self.metrics.published(age);
                if let Some(t) = self.transactions.as_mut() {
                    t.policy.delivered(now.instant);
                }
                if self.tracker.delivered(token).is_some() {
                    self.mark_dirty();
                }
                crate::failpoint!("after-ack-before-persist");
                Ok(())
            }
            Err(source) => {
                let event_id = source.event_id().unwrap_or("unknown").to_owned();
                Err(self.refused(
                    source,
                    position,
                    event_id,
                    aggregate_type,
                    aggregate_id,
                    dead_lettered,
                ))
            }
        }
    }

    fn mark_dirty(&mut self) {
        if self.dirty_since.is_none() {
            self.dirty_since = Some(Instant::now());
        }
    }

    /// Exactly-once: the first event after a Kafka commit begins the next
    /// Kafka transaction, and nothing after the last PostgreSQL commit is
    /// acknowledged until it commits.
    fn begin_kafka_transaction(&mut self) -> Result<(), PipelineError> {
        let Some(t) = self.transactions.as_mut() else {
            return Ok(());
        };
        if t.policy.is_open() {
            return Ok(());
        }
        self.sink.begin_transaction()?;
        t.policy.opened(Instant::now());
        let held = self.tracker.hold_at_last_commit();
        debug!(held_at = %held, "Kafka transaction begun");
        Ok(())
    }

    /// Exactly-once: ends the open Kafka transaction with the marker of
    /// `lsn` (the end of the last PostgreSQL transaction in it) and commits
    /// it; only then may what it carried be acknowledged (persisted in sled
    /// by the next persist, then reported to PostgreSQL).
    async fn commit_kafka_transaction(&mut self, lsn: Lsn) -> Result<(), PipelineError> {
        let Some(t) = self.transactions.as_ref() else {
            return Ok(());
        };
        if !t.policy.is_open() {
            return Ok(());
        }
        let marker = Marker {
            system_id: self.system_id.clone(),
            slot: self.config.postgres.slot.clone(),
            lsn,
            commit_time: self.last_commit_time,
        };
        self.sink
            .send_marker(&t.topic, t.partition, &marker)
            .await?;
        crate::failpoint!("before-kafka-commit");
        let timeout = self.config.delivery.transaction_timeout();
        let started = Instant::now();
        tokio::task::block_in_place(|| self.sink.commit_transaction(timeout))?;
        crate::failpoint!("after-kafka-commit-before-persist");
        debug!(marker = %lsn, took_ms = started.elapsed().as_millis() as u64, "Kafka transaction committed");
        self.metrics.kafka_transaction("committed");
        if let Some(t) = self.transactions.as_mut() {
            t.policy.closed();
        }
        if self.tracker.release_hold().is_some() {
            self.mark_dirty();
        }
        Ok(())
    }

    /// Exactly-once, when a session ends without committing: the open Kafka
    /// transaction is aborted now rather than when the next producer starts
    /// (or the broker's timeout passes), so `read_committed` consumers are
    /// not held back meanwhile. Nothing it carried was acknowledged.
    fn abort_kafka_transaction(&mut self) {
        let Some(t) = self.transactions.as_mut() else {
            return;
        };
        if !t.policy.is_open() {
            return;
        }
        t.policy.closed();
        self.metrics.kafka_transaction("aborted");
        let timeout = Duration::from_secs(5);
        match tokio::task::block_in_place(|| self.sink.abort_transaction(timeout)) {
            Ok(()) => {
                info!("aborted the open Kafka transaction; the next session publishes it again")
            }
            Err(e) => {
                warn!(error = %e, "aborting the open Kafka transaction failed; the next producer aborts it")
            }
        }
    }

    /// Exactly-once, on the tick: a batch past `max_batch_ms` is committed
    /// between PostgreSQL transactions; one PostgreSQL transaction that has
    /// held a Kafka transaction open too long stops the session.
    async fn on_tick_transactions(&mut self) -> Result<(), PipelineError> {
        let Some(t) = self.transactions.as_ref() else {
            return Ok(());
        };
        let now = Instant::now();
        if self.open.is_none() {
            if t.policy.due_between(now) {
                let lsn = self.tracker.last_commit_lsn();
                self.commit_kafka_transaction(lsn).await?;
            }
        } else if let Some(overrun) = t.policy.overrun(now) {
            let after = self.tracker.last_commit_lsn();
            return Err(match overrun {
                Overrun::TooLarge { events, open_for } => PipelineError::TransactionTooLarge {
                    after,
                    events,
                    open_for,
                    timeout_ms: self.config.delivery.transaction_timeout_ms,
                },
                Overrun::KafkaStalled {
                    events,
                    undelivered,
                    stalled_for,
                } => PipelineError::KafkaStalled {
                    after,
                    events,
                    undelivered,
                    stalled_for,
                },
            });
        }
        Ok(())
    }

    async fn on_tick(&mut self) -> Result<(), PipelineError> {
        self.on_tick_transactions().await?;
        self.reprove_coverage()?;
        let flush_every = Duration::from_millis(self.config.offsets.flush_interval_ms);
        if self.dirty_since.is_some_and(|t| t.elapsed() >= flush_every) {
            self.persist();
        }
        let age = self.tracker.oldest_unacked_commit_time().map_or(0, |t| {
            PgTimestamp::now().0.saturating_sub(t.0).max(0) as u64
        });
        self.metrics.set_in_flight(
            self.tracker.in_flight_events(),
            self.tracker.in_flight_bytes(),
            Some(age),
        );
        if let Some(fatal) = self.sink.fatal_error() {
            return Err(PipelineError::Sink(fatal));
        }
        Ok(())
    }

    /// Re-proves, every `monitor.slot_poll_interval_ms`, that the publication
    /// still carries the outbox. pgoutput applies a publication as it was when
    /// each change was written, and says nothing when it is narrowed: rows
    /// committed after an `ALTER PUBLICATION` that drops the table, adds a row
    /// filter or stops publishing inserts are never sent. The stream cannot
    /// show it, the catalog can: stop loudly.
    ///
    /// Each proof reads the WAL position before the catalog; a passing proof
    /// lets the acked LSN reach that position, never beyond (the tracker's
    /// ceiling). So a narrowing stops the connector before anything written
    /// after it is acknowledged, however long the proof interval.
    fn reprove_coverage(&mut self) -> Result<(), PipelineError> {
        if let Some(running) = self.reproof.as_mut() {
            let Some(done) = futures_util::FutureExt::now_or_never(running) else {
                return Ok(());
            };
            self.reproof = None;
            match done {
                Ok(Ok((problems, _, _))) if !problems.is_empty() => {
                    return Err(PipelineError::CoverageLost(NotCovered { problems }));
                }
                Ok(Ok((_, through, identity))) => {
                    // Also what the catalog looked like in between: a
                    // narrowing undone since leaves its trace here.
                    if let Some(identity) = identity {
                        self.coverage
                            .reconfirm(&self.config.postgres.publication, &identity)
                            .map_err(|problem| {
                                PipelineError::CoverageLost(NotCovered {
                                    problems: vec![problem],
                                })
                            })?;
                    }
                    if self.tracker.prove_through(through).is_some() {
                        self.mark_dirty();
                    }
                }
                // On a standby the ceiling stays: a PG16 run lost rows when the
                // position a shutting-down standby's walsender reported was
                // acknowledged (CI, tests/standby_decoding.rs); its restart
                // then waits up to wal_sender_timeout instead.
                Ok(Err(e)) if e.sqlstate() == Some(SHUTTING_DOWN) && !self.on_standby => {
                    // No transaction can commit any more, and the server's
                    // walsender waits (up to wal_sender_timeout) for us to
                    // confirm everything it sent before it lets the shutdown
                    // finish: acknowledge the rest without a proof.
                    info!(
                        "the server is shutting down: acknowledging what it sends without a coverage proof"
                    );
                    if self.tracker.lift_ceiling().is_some() {
                        self.mark_dirty();
                    }
                }
                Ok(Err(e @ PgError::WrongServerKind { .. })) => {
                    // Fenced (made read-only) or demoted while we streamed:
                    // leave it; the reconnect passes it over.
                    warn!(error = %e, "the server no longer fits target_session_attrs; reconnecting");
                    return Err(PipelineError::Pg(e));
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "re-proving the publication's coverage failed; trying again later")
                }
                Err(e) => {
                    warn!(error = %e, "the coverage re-proof task failed; trying again later")
                }
            }
        }
        // A closed catalog connection is asked about at once (a server
        // shutdown closes it first, then waits for us to confirm its WAL).
        if self.reproof_started.elapsed() < self.config.monitor.slot_poll_interval()
            && !(self.catalog.is_closed()
                && self.reproof_started.elapsed() >= Duration::from_millis(500))
        {
            return Ok(());
        }
        self.reproof_started = Instant::now();
        let client = Arc::clone(&self.catalog);
        let publication = self.config.postgres.publication.clone();
        let (Ok(table), Ok(mapped)) = (
            coverage::configured_table(&self.config.outbox),
            coverage::mapped_columns(&self.config.outbox),
        ) else {
            return Ok(()); // validated before streaming
        };
        let pg = PgConnectConfig::parse(&self.config.postgres.url);
        let attrs = pg.as_ref().map(|pg| pg.session_attrs()).unwrap_or_default();
        self.reproof = Some(tokio::spawn(async move {
            if client.is_closed() {
                // Closed under us: a new connection says why (57P03 while the
                // server shuts down).
                let pg = pg?;
                pg.connect_sql().await?;
                return Err(PgError::Closed {
                    addr: pg.redacted(),
                    during: "re-proving coverage (the session's SQL connection closed)",
                });
            }
            if attrs.needs_check() {
                let kind = control::server_kind(&client).await?;
                if !attrs.accepts(Some(kind)) {
                    return Err(PgError::WrongServerKind {
                        addr: "the connected server".into(),
                        wanted: attrs.name(),
                        got: kind.describe(),
                    });
                }
            }
            let through = control::wal_position(&client).await?;
            let facts = coverage::gather(&client, &table, &publication).await?;
            let problems = coverage::judge(&facts, &table, &publication, &mapped)
                .err()
                .unwrap_or_default();
            Ok((problems, through, facts.publication.map(|p| p.identity)))
        }));
        Ok(())
    }

    /// Persist the acked LSN (flushed to disk), then let PostgreSQL know.
    /// Starts persisting the acked LSN on a blocking thread (sled flushes to
    /// disk); the stream keeps moving meanwhile. PostgreSQL hears of it only
    /// in [`Session::flushed`], after the flush.
    fn persist(&mut self) {
        if self.persisting.is_some() {
            return; // the tick after it finishes picks up what is new
        }
        let acked = self.tracker.acked();
        let save_due = !self.replaying
            && (!self.sequences.has_unsaved()
                || self.sequences_taken_at.elapsed()
                    >= Duration::from_millis(self.config.audit.save_interval_ms));
        let report_due = save_due && self.reported < self.durable.lsn();
        if acked <= self.durable.lsn() && !report_due {
            if self.reported >= self.durable.lsn() {
                self.dirty_since = None;
            }
            return;
        }
        if crate::failpoint::sabotaged("never-persist") {
            self.dirty_since = None;
            return;
        }
        self.dirty_since = None;
        let acked = acked.max(self.durable.lsn());
        let store = Arc::clone(self.store);
        let slot = self.config.postgres.slot.clone();
        let system_id = self.system_id.clone();
        let commit_time = self.tracker.acked_commit_time();
        let sequences = if save_due {
            self.sequences_taken_at = Instant::now();
            self.sequences.take_unsaved()
        } else {
            Vec::new()
        };
        let durable_commit_time = Arc::clone(&self.metrics.durable_commit_time);
        self.persisting = Some(tokio::task::spawn_blocking(move || {
            store.save_sequences(&sequences)?;
            let durable = store.persist_acked(&slot, acked, &system_id, commit_time)?;
            durable_commit_time.set(commit_time);
            Ok(Persisted {
                durable,
                reportable: save_due,
            })
        }));
    }

    /// The persist task panicked or was cancelled: what was durable before it
    /// still is, and nothing past it was reported to PostgreSQL.
    fn persist_failed(&self, e: tokio::task::JoinError) -> PipelineError {
        PipelineError::Internal {
            what: format!(
                "the offset persist task failed with the durable acked LSN at {}: {e}",
                self.durable.lsn()
            ),
        }
    }

    /// A persist finished: the position is durable, so it may be reported.
    fn flushed(&mut self, persisted: Persisted) {
        let Persisted {
            durable,
            reportable,
        } = persisted;
        crate::failpoint!("after-persist-before-status-update");
        if reportable {
            self.feedback.set_flushed(durable);
            self.reported = self.reported.max(durable.lsn());
        }
        self.metrics.set_acked(durable.lsn());
        if durable.lsn() > self.durable.lsn() {
            self.durable = durable;
        }
        if self.tracker.acked() > self.durable.lsn() || self.reported < self.durable.lsn() {
            self.mark_dirty();
        }
    }

    /// Persists synchronously (after any persist still running): for shutdown.
    async fn persist_now(&mut self) -> Result<(), PipelineError> {
        if let Some(running) = self.persisting.take() {
            let durable = running.await.map_err(|e| self.persist_failed(e))??;
            self.flushed(durable);
        }
        self.dirty_since = None;
        let acked = self.tracker.acked().max(self.durable.lsn());
        let behind = acked > self.durable.lsn() || self.reported < self.durable.lsn();
        if behind && !crate::failpoint::sabotaged("never-persist") {
            let commit_time = self.tracker.acked_commit_time();
            let sequences = self.sequences.take_unsaved();
            self.sequences_taken_at = Instant::now();
            let durable = tokio::task::block_in_place(|| {
                self.store.save_sequences(&sequences)?;
                self.store.persist_acked(
                    &self.config.postgres.slot,
                    acked,
                    &self.system_id,
                    commit_time,
                )
            })?;
            self.metrics.durable_commit_time.set(commit_time);
            self.flushed(Persisted {
                durable,
                reportable: !self.replaying,
            });
        }
        Ok(())
    }

    /// At a stop: one more coverage proof, so that what was delivered since
    /// the last one is acknowledged (bounded; on failure the next start
    /// re-sends it, or refuses to start if the publication was narrowed).
    async fn final_proof(&mut self) {
        let (Ok(table), Ok(mapped)) = (
            coverage::configured_table(&self.config.outbox),
            coverage::mapped_columns(&self.config.outbox),
        ) else {
            return;
        };
        let publication = self.config.postgres.publication.as_str();
        let proof = async {
            let through = control::wal_position(&self.catalog).await?;
            let facts = coverage::gather(&self.catalog, &table, publication).await?;
            Ok::<_, PgError>((
                coverage::judge(&facts, &table, publication, &mapped),
                through,
            ))
        };
        match tokio::time::timeout(Duration::from_secs(5), proof).await {
            Ok(Ok((Ok(_), through))) => {
                self.tracker.prove_through(through);
            }
            Ok(Ok((Err(problems), _))) => warn!(
                problems = %NotCovered { problems },
                "the publication no longer carries the outbox: what was delivered since the last proof is not \
                 acknowledged"
            ),
            Ok(Err(e)) => {
                warn!(error = %e, "the final coverage proof failed; the next start re-sends what was delivered since the last one")
            }
            Err(_) => warn!(
                "the final coverage proof timed out; the next start re-sends what was delivered since the last one"
            ),
        }
    }

    /// After a session failed: take the delivery reports that arrive within a
    /// short bound and persist the acknowledged prefix, so the next session
    /// re-sends only what was really unacknowledged. It also waits for a
    /// persist still running, so no write of this session can land after the
    /// next one loaded the offset.
    ///
    /// Returns why the session ended: a record the broker refused for good
    /// wins over the failure that ended the loop. With the gapless guarantee a
    /// refusal also raises the producer's fatal error, which the tick may see
    /// before the refused record's report arrives; ending on the fatal error
    /// would restart without parking or stopping, over and over.
    async fn keep_acknowledged(&mut self, failure: PipelineError) -> PipelineError {
        let bound = Duration::from_millis(self.config.limits.shutdown_timeout_ms.min(5_000));
        let deadline = Instant::now() + bound;
        // Every report still due is taken (within the bound), not only those
        // before the first failure: reports come from two polling threads in
        // any order, and purged records reported ahead of a refused one
        // must not hide the refusal (audit F13).
        let mut refusal = None;
        let mut outstanding = self.tracker.in_flight_events();
        while outstanding > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.reports.recv()).await {
                Ok(Some(report)) => {
                    outstanding -= 1;
                    if let Err(e) = self.on_report(report, Now::read()) {
                        refusal = Some(keep_refusal(refusal, e));
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        self.abort_kafka_transaction();
        if !matches!(
            failure,
            PipelineError::CoverageLost(_) | PipelineError::NotCovered(_)
        ) {
            self.final_proof().await;
        }
        match self.persist_now().await {
            Ok(()) => {
                debug!(acked = %self.durable.lsn(), error = %failure, "persisted the acknowledged prefix after a failure")
            }
            Err(e) => {
                warn!(error = %e, "persisting the acknowledged prefix after a failure failed; the next session re-sends from the last durable LSN")
            }
        }
        prefer_refusal(failure, refusal)
    }

    /// Stop reading, wait (bounded) for in-flight deliveries, persist, send a
    /// final status update, close the stream.
    /// The graceful end: waits (bounded) for the deliveries in flight,
    /// proves coverage once more, persists the acknowledged position and
    /// closes the stream.
    async fn drain(&mut self, stream: crate::pg::ReplicationStream) -> Result<(), PipelineError> {
        let deadline =
            Instant::now() + Duration::from_millis(self.config.limits.shutdown_timeout_ms);
        info!(
            in_flight = self.tracker.in_flight_events(),
            "shutting down: waiting for in-flight deliveries"
        );
        // Exactly-once: the last batch commits at a transaction boundary, or
        // (the grace ran out inside a transaction) is aborted and re-sent.
        if self.open.is_none() {
            let lsn = self.tracker.last_commit_lsn();
            self.commit_kafka_transaction(lsn).await?;
        } else {
            self.abort_kafka_transaction();
        }
        while self.tracker.in_flight_events() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                warn!(
                    in_flight = self.tracker.in_flight_events(),
                    "shutdown timeout: unacknowledged events will be re-sent on the next start"
                );
                break;
            }
            match tokio::time::timeout(left, self.reports.recv()).await {
                Ok(Some(report)) => {
                    if let Err(e) = self.on_report(report, Now::read()) {
                        warn!(error = %e, "delivery failed during shutdown; it will be re-sent on the next start");
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        crate::failpoint!("during-shutdown");
        self.final_proof().await;
        self.persist_now().await?;
        info!(acked = %self.durable.lsn(), "final acknowledged position persisted");
        if let Err(e) = stream.shutdown().await {
            warn!(error = %e, "closing the replication stream failed; the server will notice the disconnect");
        }
        Ok(())
    }
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
    pending: &crate::checkpoint::PendingRepair,
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
        store.persist_created(slot, at, system_id, now)?;
        store.end_repair(slot)
    })?;
    info!(slot, rows, start = %at, "gap repair finished: every retained row committed after the lost position was published");
    Ok(at)
}

/// The server's clock now, as a commit-time bound.
async fn server_clock(client: &tokio_postgres::Client) -> Result<PgTimestamp, PgError> {
    client
        .query_one(
            "SELECT ((extract(epoch FROM clock_timestamp()) - 946684800) * 1e6)::int8",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map(PgTimestamp)
        .map_err(|e| PgError::sql("reading the server clock", e))
}

/// Why a session ended, given the failure that ended its loop and the first
/// error a delivery report gave while draining: a record refused for good
/// (parked, or poison) decides; any other report error does not replace the
/// failure.
/// Of the errors drained reports gave, the one kept: the first refused
/// record (it decides how the session ends), else the first error.
fn keep_refusal(kept: Option<PipelineError>, next: PipelineError) -> PipelineError {
    let refused = |e: &PipelineError| {
        matches!(
            e,
            PipelineError::Parked { .. } | PipelineError::Poison { .. }
        )
    };
    match kept {
        Some(kept) if refused(&kept) || !refused(&next) => kept,
        _ => next,
    }
}

fn prefer_refusal(failure: PipelineError, drained: Option<PipelineError>) -> PipelineError {
    match drained {
        Some(refused @ (PipelineError::Parked { .. } | PipelineError::Poison { .. })) => {
            if !matches!(
                failure,
                PipelineError::Parked { .. } | PipelineError::Poison { .. }
            ) {
                warn!(error = %failure, "a record refused by Kafka decides how this session ends");
            }
            refused
        }
        _ => failure,
    }
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

/// Gathers the catalog facts (creating the publication first when configured
/// to and missing) and proves the publication covers the outbox table.
/// Returns the coverage and the WAL position the proof holds for (read
/// before the catalog, see [`Session::reprove_coverage`]).
async fn prove_coverage(
    client: &tokio_postgres::Client,
    config: &Config,
) -> Result<(Coverage, Lsn), PipelineError> {
    let publication = config.postgres.publication.as_str();
    let table = coverage::configured_table(&config.outbox)?;
    let mapped = coverage::mapped_columns(&config.outbox)?;
    let through = control::wal_position(client).await?;
    let mut facts = coverage::gather(client, &table, publication).await?;
    if config.postgres.create_publication
        && facts.publication.is_none()
        && let Some(t) = &facts.table
    {
        let partitioned = t.relkind == 'p';
        control::create_publication(client, publication, &table, partitioned).await?;
        info!(publication, table = %table, partitioned, "created publication");
        facts = coverage::gather(client, &table, publication).await?;
    }
    let coverage = coverage::judge(&facts, &table, publication, &mapped)
        .map_err(|problems| PipelineError::NotCovered(NotCovered { problems }))?;
    Ok((coverage, through))
}

/// Both clocks, read once for a batch of delivery reports.
#[derive(Clone, Copy)]
struct Now {
    instant: Instant,
    wall: PgTimestamp,
}

impl Now {
    fn read() -> Now {
        Now {
            instant: Instant::now(),
            wall: PgTimestamp::now(),
        }
    }
}

/// The offset store as the sequence audit's source for aggregates not in
/// memory (a sled read: off the async worker).
fn stored_sequence(
    store: &OffsetStore,
) -> impl FnMut(&[u8]) -> Result<Option<(i64, Lsn)>, StoreError> + '_ {
    move |key| tokio::task::block_in_place(|| store.last_sequence(key))
}

fn protocol(lsn: Lsn, what: impl std::fmt::Display) -> PipelineError {
    PipelineError::Protocol {
        lsn,
        what: what.to_string(),
    }
}

/// A header's value as text ("" when absent); for cold paths only.
fn header_text(event: &crate::outbox::OutboxEvent, name: &str) -> String {
    event
        .headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked() -> PipelineError {
        PipelineError::Parked {
            aggregate_type: "order".into(),
            aggregate_id: "o1".into(),
            lsn: Lsn::new(50),
            reason: "Broker: Message size too large".into(),
        }
    }

    /// Audit F13: two purged records reported ahead of the refused one (the
    /// reports come from two threads in any order) must not hide it.
    #[test]
    fn a_refusal_among_drained_reports_is_kept_whatever_came_before_it() {
        let purged = || PipelineError::Delivery {
            event_id: "e0".into(),
            lsn: Lsn::new(40),
            source: crate::sink::SinkError::Delivery {
                code: rdkafka::types::RDKafkaErrorCode::PurgeQueue,
                topic: "t".into(),
                event_id: Some("e0".into()),
            },
        };
        let drained = [purged(), purged(), parked(), purged()]
            .into_iter()
            .fold(None, |kept, next| Some(keep_refusal(kept, next)));
        let ended = prefer_refusal(PipelineError::StreamEnded, drained);
        assert!(matches!(ended, PipelineError::Parked { .. }), "{ended}");
        // Without a refusal the first error is kept (and the failure decides).
        let drained = [purged(), purged()]
            .into_iter()
            .fold(None, |kept, next| Some(keep_refusal(kept, next)));
        assert!(matches!(drained, Some(PipelineError::Delivery { .. })));
    }

    #[test]
    fn a_refused_record_decides_over_the_fatal_error_that_ended_the_loop() {
        // The fatal error alone is retryable: a new session, no parking, and
        // the same refusal again, forever.
        let fatal = PipelineError::StreamEnded;
        assert_eq!(fatal.disposition(), Disposition::Retry);
        assert!(matches!(
            prefer_refusal(fatal, Some(parked())),
            PipelineError::Parked { .. }
        ));
        let poison = PipelineError::Poison {
            event_id: "e1".into(),
            lsn: Lsn::new(50),
            reason: "too large".into(),
            refusal: None,
        };
        let ended = prefer_refusal(PipelineError::StreamEnded, Some(poison));
        assert!(matches!(ended, PipelineError::Poison { .. }));
        assert_eq!(ended.disposition(), Disposition::Stop);
        // Other report errors do not hide why the loop ended.
        assert!(matches!(
            prefer_refusal(
                PipelineError::StreamEnded,
                Some(PipelineError::Protocol {
                    lsn: Lsn::ZERO,
                    what: "x".into()
                })
            ),
            PipelineError::StreamEnded
        ));
        assert!(matches!(
            prefer_refusal(PipelineError::StreamEnded, None),
            PipelineError::StreamEnded
        ));
    }
}
