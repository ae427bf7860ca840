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
//! - `relations`: the outbox relations bound to the mapping, other tables' OIDs;
//! - `stages`: `outbox_cdc_stage_seconds`;
//! - `ending`: the drain, the error exit, and which failure decides;
//! - `streamed`: transactions streamed while in progress (protocol 2).
//!
//! With pgoutput protocol 2 (`[postgres] streaming`) a large transaction
//! arrives in blocks while in progress: its messages go to the [`Spill`]
//! and nothing of it is sent before its Stream Commit; then its messages are
//! read back one per turn of the loop, under the same in-flight limits, as if
//! it had arrived whole (`Replay`), and no other message is read meanwhile.

mod bootstrap;
mod checkpointer;
mod coverage_watch;
mod ending;
mod relations;
mod stages;
mod streamed;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::checkpoint::{AckTracker, OffsetStore};
use crate::config::{Config, DeliveryMode};
use crate::metrics::Metrics;
use crate::outbox::{ChangeContext, MapError, OutboxEvent, OutboxMapper};
use crate::pg::{EventPosition, Lsn, PgTimestamp, ReplicationEvent, ReplicationStream};
use crate::pgoutput::{self, Commit, Insert, LogicalMessage, Message};
use crate::sink::DeliveryReport;

use super::delivery::{AtLeastOnce, Delivery, ExactlyOnce, InFlight, Input, Unsent};
use super::options::RunOptions;
use super::sequences::SequenceWatch;
use super::spill::Spill;
use crate::error::PipelineError;
use crate::poison::{PoisonPolicyRouter, Route, row_as_json};
use bootstrap::Started;
use checkpointer::{Checkpointer, StartPositions};
use coverage_watch::CoverageWatch;
use ending::Refused;
use relations::{StreamRelations, Target};
use stages::{Now, StageClock};
use streamed::Replay;

/// One replication session, delivering as `[delivery] mode` says: the one
/// place the mode is decided.
pub(super) async fn run_session(
    config: &Config,
    options: RunOptions,
    store: &Arc<OffsetStore>,
    metrics: &Metrics,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    match config.delivery.mode {
        DeliveryMode::AtLeastOnce => {
            run::<AtLeastOnce>(config, options, store, metrics, shutdown).await
        }
        DeliveryMode::ExactlyOnce => {
            run::<ExactlyOnce>(config, options, store, metrics, shutdown).await
        }
    }
}

/// One session delivering with `D` (chosen by [`run_session`]): bootstrap,
/// stream until a stop is asked or an error ends it, drain. An error exit
/// still persists what was acknowledged ([`Session::keep_acknowledged`]).
async fn run<'a, D: Delivery>(
    config: &'a Config,
    options: RunOptions,
    store: &'a Arc<OffsetStore>,
    metrics: &'a Metrics,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    // A stop asked while starting (a slot creation waiting for running
    // transactions, a gap repair, a server that does not answer) ends the
    // start where it is: each step is safe to leave half done, as after a
    // crash (a slot still being created is dropped with its connection, a
    // repair is finished by the next start), and nothing was acknowledged.
    let mut stop = shutdown.clone();
    let starting = bootstrap::bootstrap::<D>(config, &options, store, metrics);
    let started = tokio::select! {
        started = starting => started?,
        () = stop_asked(&mut stop) => {
            info!("stop asked while starting: the start is left unfinished; the next one takes it up");
            // A crash while stopping, here as on the streaming path's stop.
            crate::failpoint!("during-shutdown");
            return Ok(());
        }
    };
    let Some(started) = started else {
        return Ok(());
    };
    let spill = match started.streaming {
        true => {
            let dir = config.offsets.path.join("spill");
            let budget = config.limits.max_spill_memory_bytes;
            Some(tokio::task::block_in_place(|| Spill::open(&dir, budget))?)
        }
        false => None,
    };
    let (mut session, mut stream) = Session::new(config, store, metrics, started, spill);
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

/// Resolves once a stop is asked (at once if it already was); never when
/// the sender is gone without asking.
async fn stop_asked(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|asked| *asked).await.is_err() {
        std::future::pending::<()>().await;
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
    relations: StreamRelations,
    open: Option<OpenTx>,
    skip_through: Lsn,
    stages: StageClock,
    /// Streamed transactions not yet committed; `None` with protocol 1.
    spill: Option<Spill>,
    /// The transaction whose streamed block is being read.
    block: Option<u32>,
    replay: Option<Replay>,
    /// Whether the stream had more bytes received than read when the last
    /// replication message was taken.
    unread: bool,
    /// Behind or not as judged at the last PostgreSQL commit (a batch may
    /// grow while behind); caught up once nothing received is unread.
    input: Input,
    /// Sabotage for the live witness's tests (`failpoints` builds only):
    /// skip every n-th decoded outbox insert, counted in `inserts_seen`.
    drop_every: Option<u64>,
    inserts_seen: u64,
}

impl<'a, D: Delivery> Session<'a, D> {
    fn new(
        config: &'a Config,
        store: &'a Arc<OffsetStore>,
        metrics: &'a Metrics,
        started: Started<D>,
        spill: Option<Spill>,
    ) -> (Session<'a, D>, ReplicationStream) {
        let mut tracker = AckTracker::new(started.durable.lsn());
        tracker.prove_through(started.proven_through);
        let checkpoint = Checkpointer::new(
            config,
            store,
            metrics,
            started.system_id,
            started.stream.feedback(),
            StartPositions {
                durable: started.durable,
                reported: started.reported,
                resent_from: started.resent_from,
                paged_through: started.paged_through,
            },
        );
        let coverage = CoverageWatch::new(
            config,
            started.proof,
            started.catalog,
            started.pg,
            started.on_standby,
            started.witness_checks,
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
            relations: StreamRelations::default(),
            open: None,
            skip_through: started.skip_through,
            stages: StageClock::new(),
            spill,
            block: None,
            replay: None,
            unread: false,
            input: Input::CaughtUp,
            drop_every: crate::failpoint::sabotage_count("drop-insert-every"),
            inserts_seen: 0,
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
            // 5. The next message of a streamed transaction being read back,
            //    or else the next replication message, while the in-flight
            //    limits leave room.
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
                () = std::future::ready(()), if has_room && self.replay.is_some() => {
                    self.replay_next().await?;
                }
                event = stream.recv(), if has_room && self.replay.is_none() => match event? {
                    Some(event) => {
                        self.unread = stream.has_unread();
                        if !self.unread {
                            self.input = Input::CaughtUp;
                        }
                        self.on_replication_event(event).await?
                    }
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
                self.stages.arrived(&data, server_time);
                self.metrics.set_received(wal_end.max(wal_start));
                let decode_error = |source| PipelineError::Decode {
                    lsn: wal_start,
                    source,
                };
                if let Some(xid) = self.block {
                    let streamed = pgoutput::decode_streamed(&data).map_err(decode_error)?;
                    return self.on_streamed(wal_start, xid, streamed, &data);
                }
                let message = pgoutput::decode(&data).map_err(decode_error)?;
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
            Message::Begin(begin) => self.begin(lsn, begin.final_lsn, begin.commit_time)?,
            Message::Commit(commit) => self.commit(lsn, commit).await?,
            Message::Relation(relation) => {
                let kind = self.coverage.kind_of(&relation, lsn).await?;
                self.relations
                    .described(relation, kind, &self.mapper, lsn)?;
            }
            Message::Insert(insert) => self.insert(lsn, insert).await?,
            Message::Message(msg) => self.logical_message(lsn, msg).await?,
            // Updates, deletes and truncates of the outbox table are not events
            // (the Debezium-style writer deletes its rows in the same transaction).
            Message::Update(_)
            | Message::Delete(_)
            | Message::Truncate(_)
            | Message::Type(_)
            | Message::Origin(_) => {}
            Message::StreamStart(start) => self.stream_start(lsn, start)?,
            Message::StreamStop => {
                return Err(protocol(lsn, "Stream Stop outside a streamed block"));
            }
            Message::StreamCommit(commit) => self.stream_commit(lsn, commit)?,
            Message::StreamAbort(abort) => self.stream_abort(lsn, abort)?,
        }
        Ok(())
    }

    /// A transaction's Commit: acknowledged as the tracker allows, and
    /// handed to the delivery (exactly-once may commit its Kafka
    /// transaction); one sent before the restart is only dropped.
    async fn commit(&mut self, lsn: Lsn, commit: Commit) -> Result<(), PipelineError> {
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
            self.input = Input::at_commit(
                self.unread,
                tx.commit_time,
                self.stages.sent_at(),
                self.config.delivery.max_batch_age(),
            );
            let committed = self.delivery.committed(
                commit.end_lsn,
                tx.commit_time,
                self.input,
                &mut self.tracker,
            );
            if committed.await?.0 {
                self.checkpoint.mark_dirty();
            }
        }
        self.checkpoint.written(commit.end_lsn);
        Ok(())
    }

    /// An insert: an outbox row is mapped and published (or dead-lettered);
    /// one of a transaction sent before the restart is only recorded.
    async fn insert(&mut self, lsn: Lsn, insert: Insert) -> Result<(), PipelineError> {
        let Some(tx) = self.open.as_ref() else {
            return Err(protocol(lsn, "Insert outside a transaction"));
        };
        let Target::Outbox { bound, description } =
            self.relations.of_change(insert.relation_oid, lsn)?
        else {
            return Ok(()); // another table in the publication
        };
        let ctx = ChangeContext {
            lsn,
            commit_time: tx.commit_time,
        };
        if tx.replayed {
            let commit = tx.commit_lsn;
            let record = self.checkpoint.records_resent(commit);
            let mapped = (self.sequences.is_on() || record)
                .then(|| self.mapper.map_insert(bound, &insert.new, &ctx));
            // Sent by an earlier session whose pages did not reach the
            // store (exactly-once resumed at a Kafka marker ahead of the
            // stored offset).
            let event_id = match &mapped {
                Some(Ok(event)) => Some(event.event_id.as_str()),
                Some(Err(poison)) => poison.event_id(),
                None => None,
            };
            if let Some(id) = event_id.filter(|_| record) {
                self.checkpoint.record_sent(commit, id);
            }
            let mapped = mapped.filter(|_| self.sequences.is_on());
            return self.replayed(mapped, lsn);
        }
        let (commit_time, at) = (tx.commit_time, EventPosition::new(tx.commit_lsn, lsn));
        let mapped = self.mapper.map_insert(bound, &insert.new, &ctx);
        if let Some(every) = self.drop_every {
            self.inserts_seen += 1;
            if self.inserts_seen.is_multiple_of(every) {
                let event_id = mapped.as_ref().ok().map(|e| e.event_id.as_str());
                warn!(lsn = %lsn, event_id, "sabotage drop-insert-every: this outbox insert is skipped");
                return Ok(());
            }
        }
        let max_raw = self.config.outbox.max_record_bytes / 2;
        let raw = || row_as_json(description, &insert.new, max_raw);
        let route = self
            .poison
            .route(mapped, raw, self.store, at, commit_time)?;
        self.publish(route, at, commit_time).await?;
        Ok(())
    }

    /// A logical message: a transactional one with the event prefix is an
    /// event; a non-transactional one with it is refused loudly.
    async fn logical_message(
        &mut self,
        lsn: Lsn,
        msg: LogicalMessage,
    ) -> Result<(), PipelineError> {
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
            Some(mapped) if replayed => self.replayed(Some(mapped), lsn)?,
            Some(mapped) => {
                let raw = || msg.content.clone();
                let route = self
                    .poison
                    .route(mapped, raw, self.store, at, commit_time)?;
                self.publish(route, at, commit_time).await?;
            }
        }
        Ok(())
    }

    /// A transaction whose commit record starts at `commit_lsn` begins.
    pub(super) fn begin(
        &mut self,
        lsn: Lsn,
        commit_lsn: Lsn,
        commit_time: PgTimestamp,
    ) -> Result<(), PipelineError> {
        if self.open.is_some() {
            return Err(protocol(lsn, "a transaction begins inside an open one"));
        }
        // A transaction's commit record starts at its commit LSN and ends at
        // its end_lsn; offsets are end_lsns or record boundaries after them,
        // so a commit that starts before the stored offset ended at or before it.
        let replayed = commit_lsn < self.skip_through;
        if !replayed {
            self.checkpoint.replay_done();
            self.tracker
                .begin(commit_time)
                .map_err(|e| protocol(lsn, e))?;
        }
        self.open = Some(OpenTx {
            commit_time,
            commit_lsn,
            replayed,
        });
        Ok(())
    }

    /// A change of a transaction acknowledged before the restart: dropped,
    /// the number of its event (when mapped) still followed.
    fn replayed(
        &mut self,
        mapped: Option<Result<OutboxEvent, MapError>>,
        lsn: Lsn,
    ) -> Result<(), PipelineError> {
        self.metrics.deduplicated();
        match mapped {
            Some(Ok(event)) => {
                self.sequences
                    .follow_event(self.store, self.metrics, &event, lsn, false)
            }
            _ => Ok(()),
        }
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
                self.sequences
                    .follow_event(self.store, self.metrics, &event, lsn, true)?;
                (event, false)
            }
            Route::DeadLetter(event) => {
                let original = header_text(&event, crate::poison::H_DLQ_ORIGINAL_TOPIC);
                self.metrics.record_dead_lettered(&original);
                (event, true)
            }
        };
        self.metrics.trace_dropped(event.trace_dropped);
        self.checkpoint.record_sent(at.commit(), &event.event_id);
        let token = self
            .tracker
            .add_event(event.size_bytes())
            .map_err(|e| protocol(lsn, e))?;
        self.metrics.health.waiting_since(commit_time);
        let produced_at = Instant::now();
        self.stages.produced(self.metrics, commit_time, produced_at);
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
            Err(Unsent::Refused(source, record)) => {
                let event_id = event.event_id.clone();
                return Err(self.refused(Refused {
                    source,
                    event_id,
                    record,
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
        let record = report.token;
        let source = match report.result {
            Ok(_) => {
                let (produced_at, committed) = (record.produced_at, record.commit_time);
                now.acknowledged(self.metrics, report.reported_at, produced_at, committed);
                self.delivery.delivered(now.instant);
                if self.tracker.delivered(record.token).is_some() {
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
            event_id,
            record,
        }))
    }

    async fn on_tick(&mut self) -> Result<(), PipelineError> {
        let inside = self.open.is_some();
        if self
            .delivery
            .tick(inside, self.input, &mut self.tracker)
            .await?
            .0
        {
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
        if let Some(spill) = &self.spill {
            let s = spill.stats();
            let largest = s.largest_bytes;
            (self.metrics).set_spill(s.transactions, s.bytes, s.memory_bytes, largest);
        }
        if let Some(fatal) = self.delivery.fatal_error() {
            return Err(PipelineError::Sink(fatal));
        }
        Ok(())
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
