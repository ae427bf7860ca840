//! One replication session: start, stream until a failure or a stop, drain.
//! A new session is started by the caller after a failure.
//!
//! The session reads the stream in commit order, maps outbox rows to records
//! and hands them to its [`Delivery`]; the ack tracker learns of each event,
//! commit and acknowledgement, and the [`Checkpointer`] makes what the tracker
//! acknowledges durable, then reports it to PostgreSQL. The [`CoverageWatch`]
//! keeps proving that the stream carries every outbox row.
//!
//! - `bootstrap`: everything before the first message;
//! - `checkpointer`: persisting and reporting the acknowledged position;
//! - `coverage_watch`: the publication's coverage, and what each relation is;
//! - `ending`: which failure decides how a session ends.

mod bootstrap;
mod checkpointer;
mod coverage_watch;
mod ending;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::checkpoint::{AckTracker, OffsetStore};
use crate::config::{Config, DeliveryMode};
use crate::coverage::RelationKind;
use crate::metrics::{Metrics, Stage};
use crate::outbox::{BoundRelation, ChangeContext, OutboxEvent, OutboxMapper};
use crate::pg::{EventPosition, Lsn, PgTimestamp, ReplicationEvent, ReplicationStream};
use crate::pgoutput::{self, Message, RelationCache};
use crate::sink::DeliveryReport;

use super::delivery::{AtLeastOnce, Delivery, ExactlyOnce, InFlight, Unsent};
use super::poison::{PoisonPolicyRouter, Route, row_as_json};
use super::sequences::SequenceWatch;
use super::{PipelineError, RunOptions};
use bootstrap::Started;
use checkpointer::Checkpointer;
use coverage_watch::CoverageWatch;
use ending::{Refused, keep_refusal, prefer_refusal};

/// One session: bootstrap, stream until a stop is asked or an error ends
/// it, drain. An error exit still persists what was acknowledged
/// ([`Session::keep_acknowledged`]). The delivery mode is decided here, once.
pub(crate) async fn run(
    config: &Config,
    options: RunOptions,
    store: &Arc<OffsetStore>,
    metrics: &Metrics,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    match config.delivery.mode {
        DeliveryMode::AtLeastOnce => {
            run_with::<AtLeastOnce>(config, options, store, metrics, shutdown).await
        }
        DeliveryMode::ExactlyOnce => {
            run_with::<ExactlyOnce>(config, options, store, metrics, shutdown).await
        }
    }
}

async fn run_with<'a, D: Delivery>(
    config: &'a Config,
    options: RunOptions,
    store: &'a Arc<OffsetStore>,
    metrics: &'a Metrics,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let Some(started) = bootstrap::bootstrap::<D>(config, &options, store, metrics).await? else {
        return Ok(());
    };
    let (mut session, mut stream) = Session::new(config, store, metrics, started);
    match session.stream(&mut stream, shutdown).await {
        Ok(()) => {
            if let Err(e) = stream.shutdown().await {
                warn!(error = %e, "closing the replication stream failed; the server will notice the disconnect");
            }
            Ok(())
        }
        Err(failure) => Err(session.keep_acknowledged(failure).await),
    }
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

pub(super) struct Session<'a, D> {
    config: &'a Config,
    store: &'a Arc<OffsetStore>,
    metrics: &'a Metrics,
    delivery: D,
    tracker: AckTracker,
    checkpoint: Checkpointer<'a>,
    coverage: CoverageWatch,
    mapper: OutboxMapper,
    poison: PoisonPolicyRouter,
    /// Live gap detection over aggregate sequences.
    sequences: SequenceWatch,
    /// Descriptions of the outbox relations (root, partitions), for the
    /// dead-letter record of a row that cannot be mapped.
    relations: RelationCache,
    /// Relations positively known to be other tables: their changes are skipped.
    other_tables: HashSet<u32>,
    bound: HashMap<u32, BoundRelation>,
    open: Option<OpenTx>,
    skip_through: Lsn,
    /// The send time and arrival of the XLogData being handled (for
    /// `outbox_cdc_stage_seconds`).
    sent_at: PgTimestamp,
    received_at: Instant,
}

impl<'a, D: Delivery> Session<'a, D> {
    fn new(
        config: &'a Config,
        store: &'a Arc<OffsetStore>,
        metrics: &'a Metrics,
        started: Started<D>,
    ) -> (Session<'a, D>, ReplicationStream) {
        let mut tracker = AckTracker::new(started.durable.lsn());
        tracker.prove_through(started.proven_through);
        let checkpoint = Checkpointer::new(
            config,
            store,
            metrics,
            started.system_id,
            started.stream.feedback(),
            started.durable,
            started.reported,
        );
        let coverage = CoverageWatch::new(
            config,
            started.coverage,
            started.target,
            started.catalog,
            started.pg,
            started.on_standby,
        );
        let session = Session {
            config,
            store,
            metrics,
            delivery: started.delivery,
            tracker,
            checkpoint,
            coverage,
            mapper: started.mapper,
            poison: PoisonPolicyRouter::new(&config.outbox),
            sequences: SequenceWatch::new(&config.audit),
            relations: RelationCache::new(),
            other_tables: HashSet::new(),
            bound: HashMap::new(),
            open: None,
            skip_through: started.skip_through,
            sent_at: PgTimestamp(0),
            received_at: Instant::now(),
        };
        (session, started.stream)
    }

    /// Streams until a stop is asked (then finishes the open transaction and
    /// drains) or an error ends the session.
    async fn stream(
        &mut self,
        stream: &mut ReplicationStream,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), PipelineError> {
        let flush_every = Duration::from_millis(self.config.offsets.flush_interval_ms);
        let mut tick = tokio::time::interval(flush_every.min(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let shutdown_grace = Duration::from_millis(self.config.limits.shutdown_timeout_ms / 2);
        let mut phase = Phase::Streaming;
        loop {
            // Stop at a transaction boundary: a transaction whose events are out
            // but whose Commit has not been read would be re-sent after a
            // graceful restart. Reading on until its Commit is bounded.
            if let Phase::Finishing { since } = phase
                && (self.open.is_none() || since.elapsed() >= shutdown_grace)
            {
                return self.drain().await;
            }
            let has_room = self.has_room();
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
                persisted = self.checkpoint.persisted(), if self.checkpoint.is_persisting() => {
                    self.checkpoint.flushed(persisted?, &self.tracker);
                }
                Some(report) = self.delivery.reports().recv() => {
                    let now = Now::read();
                    self.on_report(report, now)?;
                    // Take what else has arrived in one go, bounded, then read again.
                    for _ in 0..1024 {
                        match self.delivery.reports().try_recv() {
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

    /// Transactions without events still wait in the tracker behind an
    /// unacknowledged one: bound them too, or a Kafka outage during heavy
    /// traffic on other published tables would grow memory without limit.
    fn has_room(&self) -> bool {
        let limits = &self.config.limits;
        self.tracker.in_flight_events() < limits.max_in_flight_events
            && self.tracker.in_flight_bytes() < limits.max_in_flight_bytes
            && self.tracker.pending_transactions() < limits.max_in_flight_events.saturating_mul(4)
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
                        self.checkpoint.replay_done();
                    }
                    self.checkpoint.written(wal_end);
                    if self.tracker.idle_advance(wal_end).is_some() {
                        self.checkpoint.mark_dirty();
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
                    self.checkpoint.replay_done();
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
                    let tracked = self.tracker.commit(commit.end_lsn);
                    if tracked.map_err(|e| protocol(lsn, e))?.is_some() {
                        self.checkpoint.mark_dirty();
                    }
                    let committed =
                        self.delivery
                            .committed(commit.end_lsn, tx.commit_time, &mut self.tracker);
                    if committed.await?.0 {
                        self.checkpoint.mark_dirty();
                    }
                }
                self.checkpoint.written(commit.end_lsn);
            }
            Message::Relation(relation) => match self.coverage.kind_of(&relation, lsn).await? {
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
            },
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
                        self.follow_sequence(&event, lsn, false)?;
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
                let Some(tx) = self.open.as_ref().filter(|_| msg.transactional) else {
                    return Ok(()); // non-transactional messages are not events
                };
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
                            self.follow_sequence(&event, lsn, false)?;
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
                self.follow_sequence(&event, lsn, true)?;
                (event, false)
            }
            Route::DeadLetter(event) => {
                let original = header_text(&event, super::poison::H_DLQ_ORIGINAL_TOPIC);
                self.metrics.record_dead_lettered(&original);
                (event, true)
            }
        };
        let token = self
            .tracker
            .add_event(event.size_bytes())
            .map_err(|e| protocol(lsn, e))?;
        let produced_at = Instant::now();
        self.observe_arrival(commit_time, produced_at);
        let in_flight = InFlight {
            token,
            commit_time,
            at,
            aggregate_type: std::mem::take(&mut event.aggregate_type),
            aggregate_id: std::mem::take(&mut event.aggregate_id),
            dead_lettered,
            produced_at,
        };
        match self
            .delivery
            .send(&event, in_flight, &mut self.tracker)
            .await
        {
            Ok(()) => {}
            Err(Unsent::Failed(e)) => return Err(e),
            // Refused before it left (e.g. over message.max.bytes): the same
            // policy as a refusal reported by the broker.
            Err(Unsent::Refused(source, in_flight)) => {
                let (aggregate_type, aggregate_id) = in_flight
                    .map(|f| (f.aggregate_type, f.aggregate_id))
                    .unwrap_or_default();
                return Err(self.refused(Refused {
                    source,
                    at,
                    event_id: event.event_id.clone(),
                    aggregate_type,
                    aggregate_id,
                    dead_lettered,
                }));
            }
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

    /// Live gap detection (`[audit]`). An event about to be published is
    /// `judged`: a number that does not follow the aggregate's last published
    /// one is counted and logged, and under `on_gap = "stop"` ends the
    /// session before the event is produced. An event sent again after a
    /// restart only moves the aggregate's state (it may not have reached the
    /// store).
    fn follow_sequence(
        &mut self,
        event: &OutboxEvent,
        lsn: Lsn,
        judged: bool,
    ) -> Result<(), PipelineError> {
        let Some(seq) = event.aggregate_sequence else {
            return Ok(());
        };
        let store = self.store;
        let lookup = &mut |key: &[u8]| tokio::task::block_in_place(|| store.last_sequence(key));
        let (kind, id) = (&event.aggregate_type, &event.aggregate_id);
        if !judged {
            self.sequences.replayed(lookup, kind, id, seq, lsn)?;
            return Ok(());
        }
        let Some(gap) = self.sequences.observe(lookup, kind, id, seq, lsn)? else {
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

    fn refused(&mut self, refused: Refused) -> PipelineError {
        self.metrics.failed();
        refused.into_error(self.poison.dead_letters(), self.store)
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
            at,
            aggregate_type,
            aggregate_id,
            dead_lettered,
            produced_at,
        } = report.token;
        let source = match report.result {
            Ok(_) => {
                let reported_at = report.reported_at;
                let m = self.metrics;
                m.stage(
                    Stage::ProduceToAck,
                    reported_at.duration_since(produced_at).as_secs_f64(),
                );
                m.stage(
                    Stage::AckToTracker,
                    now.instant
                        .saturating_duration_since(reported_at)
                        .as_secs_f64(),
                );
                m.published(now.wall.0.saturating_sub(commit_time.0).max(0) as u64);
                self.delivery.delivered(now.instant);
                if self.tracker.delivered(token).is_some() {
                    self.checkpoint.mark_dirty();
                }
                crate::failpoint!("after-ack-before-persist");
                return Ok(());
            }
            Err(source) => source,
        };
        let event_id = source.event_id().unwrap_or("unknown").to_owned();
        Err(self.refused(Refused {
            source,
            at,
            event_id,
            aggregate_type,
            aggregate_id,
            dead_lettered,
        }))
    }

    async fn on_tick(&mut self) -> Result<(), PipelineError> {
        let inside = self.open.is_some();
        if self.delivery.tick(inside, &mut self.tracker).await?.0 {
            self.checkpoint.mark_dirty();
        }
        if self.coverage.poll(&mut self.tracker)?.0 {
            self.checkpoint.mark_dirty();
        }
        self.checkpoint.tick(&self.tracker, &mut self.sequences);
        let age = self.tracker.oldest_unacked_commit_time().map_or(0, |t| {
            PgTimestamp::now().0.saturating_sub(t.0).max(0) as u64
        });
        self.metrics.set_in_flight(
            self.tracker.in_flight_events(),
            self.tracker.in_flight_bytes(),
            Some(age),
        );
        if let Some(fatal) = self.delivery.fatal_error() {
            return Err(PipelineError::Sink(fatal));
        }
        Ok(())
    }

    /// Takes the reports that arrive before `deadline`, while any record is
    /// outstanding. Every report still due is taken, not only those before
    /// the first failure: reports come from two polling threads in any
    /// order, and purged records reported ahead of a refused one must not
    /// hide the refusal (audit F13). Returns the error to keep (a refusal
    /// first).
    async fn take_reports(&mut self, deadline: Instant) -> Option<PipelineError> {
        let mut kept = None;
        let mut outstanding = self.tracker.in_flight_events();
        while outstanding > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.delivery.reports().recv()).await {
                Ok(Some(report)) => {
                    outstanding -= 1;
                    if let Err(e) = self.on_report(report, Now::read()) {
                        kept = Some(keep_refusal(kept, e));
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        kept
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
        let refusal = self.take_reports(Instant::now() + bound).await;
        self.delivery.abandon();
        if !matches!(
            failure,
            PipelineError::CoverageLost(_) | PipelineError::NotCovered(_)
        ) {
            self.coverage.final_proof(&mut self.tracker).await;
        }
        match self
            .checkpoint
            .persist_now(&self.tracker, &mut self.sequences)
            .await
        {
            Ok(()) => {
                debug!(acked = %self.checkpoint.durable(), error = %failure, "persisted the acknowledged prefix after a failure")
            }
            Err(e) => {
                warn!(error = %e, "persisting the acknowledged prefix after a failure failed; the next session re-sends from the last durable LSN")
            }
        }
        prefer_refusal(failure, refusal)
    }

    /// The graceful end: finishes the delivery at a transaction boundary (or
    /// gives the open transaction up), waits (bounded) for the deliveries in
    /// flight, proves coverage once more and persists the acknowledged
    /// position. The caller closes the stream.
    async fn drain(&mut self) -> Result<(), PipelineError> {
        let deadline =
            Instant::now() + Duration::from_millis(self.config.limits.shutdown_timeout_ms);
        info!(
            in_flight = self.tracker.in_flight_events(),
            "shutting down: waiting for in-flight deliveries"
        );
        let at_boundary = self.open.is_none();
        if self
            .delivery
            .finish(at_boundary, &mut self.tracker)
            .await?
            .0
        {
            self.checkpoint.mark_dirty();
        }
        if let Some(e) = self.take_reports(deadline).await {
            warn!(error = %e, "delivery failed during shutdown; it will be re-sent on the next start");
        }
        if self.tracker.in_flight_events() > 0 {
            warn!(
                in_flight = self.tracker.in_flight_events(),
                "shutdown timeout: unacknowledged events will be re-sent on the next start"
            );
        }
        crate::failpoint!("during-shutdown");
        self.coverage.final_proof(&mut self.tracker).await;
        self.checkpoint
            .persist_now(&self.tracker, &mut self.sequences)
            .await?;
        info!(acked = %self.checkpoint.durable(), "final acknowledged position persisted");
        Ok(())
    }
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

fn protocol(lsn: Lsn, what: impl std::fmt::Display) -> PipelineError {
    PipelineError::Protocol {
        lsn,
        what: what.to_string(),
    }
}

/// A header's value as text ("" when absent); for cold paths only.
fn header_text(event: &OutboxEvent, name: &str) -> String {
    event
        .headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}
