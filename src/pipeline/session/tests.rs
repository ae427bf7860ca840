//! The session's rules, with the delivery in memory and no servers: what is
//! persisted, what is reported to PostgreSQL and when, how a session ends.
//! The same rules are proved end to end against real servers in `tests/`.

use super::*;
use crate::coverage::Coverage;
use crate::pg::{DurableLsn, FeedbackHandle, QualifiedTable};
use crate::pgoutput::encode::{encode_streamed, encoded};
use crate::pgoutput::{
    Begin, ColumnValue, Commit, Insert, Relation, StreamAbort, StreamCommit, StreamStart, TupleData,
};
use crate::pipeline::delivery::memory::MemoryDelivery;
use crate::sink::SinkError;
use bytes::Bytes;
use rdkafka::types::RDKafkaErrorCode;

const SLOT: &str = "outbox_slot";
const SYSTEM_ID: &str = "7301234567890123456";
const OUTBOX_OID: u32 = 16400;
const START: Lsn = Lsn::new(0x100);

/// One session over a memory delivery, its store in a temporary directory.
struct Harness {
    session: Session<'static, MemoryDelivery>,
    store: &'static Arc<OffsetStore>,
    next_lsn: u64,
    next_xid: u32,
    next_sequence: u64,
    _dir: tempfile::TempDir,
}

fn config(extra_env: &[(&str, &str)]) -> &'static Config {
    config_with_kafka("", extra_env)
}

/// `kafka`: more `[kafka]` properties (TOML lines).
fn config_with_kafka(kafka: &str, extra_env: &[(&str, &str)]) -> &'static Config {
    let text = format!(
        r#"
        [postgres]
        url = "postgres://outbox:secret@127.0.0.1:54329/app"
        slot = "outbox_slot"
        [kafka]
        "bootstrap.servers" = "127.0.0.1:19092"
        {kafka}
        [offsets]
        flush_interval_ms = 1
        [audit]
        save_interval_ms = 1
    "#
    );
    let env = extra_env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()));
    let config = Config::from_sources("test.toml", &text, env).expect("a valid configuration");
    Box::leak(Box::new(config))
}

impl Harness {
    /// A session that started at [`START`] (stored, reported), with the
    /// coverage of the default outbox table proved for good.
    fn new(config: &'static Config, delivery: MemoryDelivery) -> Harness {
        Harness::starting(config, delivery, START, START)
    }

    /// A new session that has been sent the outbox table's Relation.
    async fn with_outbox(config: &'static Config, delivery: MemoryDelivery) -> Harness {
        let mut h = Harness::new(config, delivery);
        h.describe_outbox().await;
        h
    }

    /// A session whose stored offset is `durable`, of which the server heard
    /// `reported` (behind it while the sequence audit's numbers are replayed).
    fn starting(
        config: &'static Config,
        delivery: MemoryDelivery,
        durable: Lsn,
        reported: Lsn,
    ) -> Harness {
        let positions = StartPositions {
            durable: DurableLsn::for_test(durable),
            reported,
            resent_from: reported,
            paged_through: durable,
        };
        Harness::streaming_from(config, delivery, positions)
    }

    /// A session whose stored offset is `positions.durable`, of which the
    /// server heard `reported`, streaming from `resent_from` (the slot's
    /// position), the witness's pages stored through `paged_through`.
    fn streaming_from(
        config: &'static Config,
        delivery: MemoryDelivery,
        positions: StartPositions,
    ) -> Harness {
        let StartPositions {
            durable,
            reported,
            resent_from,
            paged_through,
        } = positions;
        let durable = durable.lsn();
        let dir = tempfile::tempdir().unwrap();
        let store: &'static Arc<OffsetStore> =
            Box::leak(Box::new(Arc::new(OffsetStore::open(dir.path()).unwrap())));
        let metrics: &'static Metrics = Box::leak(Box::default());
        let durable = store.persist(SLOT, durable, SYSTEM_ID).unwrap();
        let feedback = FeedbackHandle::detached();
        if reported >= durable.lsn() {
            feedback.set_flushed(durable);
        }
        let mut tracker = AckTracker::new(durable.lsn());
        tracker.lift_ceiling();
        let table = QualifiedTable::new("public", "outbox_events");
        let coverage = Coverage::of_table_alone(table, OUTBOX_OID);
        let session = Session {
            config,
            store,
            metrics,
            delivery,
            tracker,
            checkpoint: Checkpointer::new(
                config,
                store,
                metrics,
                SYSTEM_ID.to_owned(),
                feedback,
                StartPositions {
                    durable,
                    reported,
                    resent_from,
                    paged_through,
                },
            ),
            coverage: CoverageWatch::without_catalog(config, coverage),
            mapper: OutboxMapper::new(&config.outbox).unwrap(),
            poison: PoisonPolicyRouter::new(&config.outbox),
            sequences: SequenceWatch::new(&config.audit),
            relations: StreamRelations::default(),
            open: None,
            skip_through: durable.lsn(),
            stages: StageClock::new(),
            // A budget of a few records: streamed transactions go to files.
            spill: Some(Spill::open(&dir.path().join("spill"), 600).unwrap()),
            block: None,
            replay: None,
            unread: false,
            input: Input::CaughtUp,
            drop_every: None,
            inserts_seen: 0,
        };
        Harness {
            session,
            store,
            next_lsn: durable.lsn().as_u64() + 0x100,
            next_xid: 700,
            next_sequence: 0,
            _dir: dir,
        }
    }

    fn lsn(&mut self) -> Lsn {
        self.next_lsn += 0x10;
        Lsn::new(self.next_lsn)
    }

    async fn message(&mut self, message: Message) -> Result<(), PipelineError> {
        let lsn = self.lsn();
        self.session.on_message(lsn, message).await
    }

    /// Describes the outbox table (once per session, as pgoutput does).
    async fn describe_outbox(&mut self) {
        let columns = crate::outbox::mapper::SEED_COLS;
        let relation = Relation::of_text(OUTBOX_OID, "public", "outbox_events", &columns);
        self.message(Message::Relation(relation)).await.unwrap();
    }

    /// One committed transaction of `events` outbox rows of aggregate `a1`;
    /// returns its end LSN.
    async fn transaction(&mut self, events: usize) -> Result<Lsn, PipelineError> {
        let final_lsn = Lsn::new(self.next_lsn + 0x10 * (events as u64 + 2));
        let end_lsn = Lsn::new(final_lsn.as_u64() + 0x8);
        let commit_time = PgTimestamp::now();
        self.next_xid += 1;
        let xid = self.next_xid;
        self.message(Message::Begin(Begin {
            final_lsn,
            commit_time,
            xid,
        }))
        .await?;
        for _ in 0..events {
            let row = self.outbox_row();
            self.message(row).await?;
        }
        self.next_lsn = end_lsn.as_u64();
        self.session
            .on_message(
                final_lsn,
                Message::Commit(Commit {
                    flags: 0,
                    commit_lsn: final_lsn,
                    end_lsn,
                    commit_time,
                }),
            )
            .await?;
        Ok(end_lsn)
    }

    /// One outbox row of aggregate `a1`, numbered after the previous one.
    fn outbox_row(&mut self) -> Message {
        let id = uuid_like(self.next_lsn);
        self.next_sequence += 1;
        let sequence = self.next_sequence.to_string();
        let text = |s: &str| ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()));
        let new = TupleData {
            columns: vec![
                text(&id),
                text("order"),
                text("a1"),
                text(&sequence),
                text("Created"),
                text("1"),
                text("{}"),
                text("2026-01-01 00:00:00+00"),
            ],
        };
        Message::Insert(Insert {
            relation_oid: OUTBOX_OID,
            new,
        })
    }

    /// One XLogData payload as the server sends it.
    async fn xlog(&mut self, data: Bytes) -> Result<(), PipelineError> {
        let lsn = self.lsn();
        let event = ReplicationEvent::XLogData {
            wal_start: lsn,
            wal_end: lsn,
            server_time: PgTimestamp::now(),
            data,
        };
        self.session.on_replication_event(event).await
    }

    /// One streamed block of transaction `xid`: `rows` outbox rows made by
    /// subtransaction `sub` (the first block describes the outbox table,
    /// as pgoutput does inside every streamed transaction).
    async fn block(&mut self, xid: u32, first: bool, sub: u32, rows: usize) -> Vec<String> {
        let start = Message::StreamStart(StreamStart {
            xid,
            first_segment: first,
        });
        self.xlog(encoded(&start)).await.unwrap();
        let mut messages = Vec::new();
        if first {
            let columns = crate::outbox::mapper::SEED_COLS;
            let relation = Relation::of_text(OUTBOX_OID, "public", "outbox_events", &columns);
            messages.push(Message::Relation(relation));
        }
        let mut ids = Vec::new();
        for _ in 0..rows {
            ids.push(uuid_like(self.next_lsn));
            messages.push(self.outbox_row());
        }
        for message in messages {
            let mut data = bytes::BytesMut::new();
            encode_streamed(sub, &message, &mut data);
            self.xlog(data.freeze()).await.unwrap();
        }
        self.xlog(encoded(&Message::StreamStop)).await.unwrap();
        ids
    }

    /// Stream Commit of `xid`, and its spilled changes read back as the
    /// loop does; returns its end LSN.
    async fn stream_commit(&mut self, xid: u32) -> Result<Lsn, PipelineError> {
        let commit_lsn = self.lsn();
        let end_lsn = Lsn::new(commit_lsn.as_u64() + 0x8);
        let commit = Message::StreamCommit(StreamCommit {
            xid,
            commit: Commit {
                flags: 0,
                commit_lsn,
                end_lsn,
                commit_time: PgTimestamp::now(),
            },
        });
        self.xlog(encoded(&commit)).await?;
        while self.session.replay.is_some() {
            self.session.replay_next().await?;
        }
        self.next_lsn = end_lsn.as_u64();
        Ok(end_lsn)
    }

    async fn stream_abort(&mut self, xid: u32, subxid: u32) {
        let abort = Message::StreamAbort(StreamAbort { xid, subxid });
        self.xlog(encoded(&abort)).await.unwrap();
    }

    async fn keepalive(&mut self, wal_end: Lsn) {
        let keepalive = ReplicationEvent::Keepalive {
            wal_end,
            server_time: PgTimestamp::now(),
            reply_requested: false,
        };
        self.session.on_replication_event(keepalive).await.unwrap();
    }

    /// Takes the reports waiting on the delivery's channel, as the loop does.
    fn take_reports(&mut self) -> Result<(), PipelineError> {
        while let Ok(report) = self.session.delivery.reports().try_recv() {
            self.session.on_report(report, Now::read())?;
        }
        Ok(())
    }

    /// A tick, and the persist it started run to its end.
    async fn tick_and_persist(&mut self) {
        // Past offsets.flush_interval_ms since anything became persistable.
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.session.on_tick().await.unwrap();
        if self.session.checkpoint.is_persisting() {
            let persisted = self.session.checkpoint.persisted().await.unwrap();
            self.session
                .checkpoint
                .flushed(persisted, &self.session.tracker);
        }
    }

    fn stored(&self) -> Lsn {
        self.store.load(SLOT).unwrap().expect("an offset").lsn
    }

    fn reported(&self) -> Lsn {
        self.session.checkpoint.reported_to_server()
    }
}

fn uuid_like(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

fn refused_for_size() -> SinkError {
    SinkError::Delivery {
        code: RDKafkaErrorCode::MessageSizeTooLarge,
        topic: "outbox.event.order".into(),
        event_id: Some("e".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offset_is_persisted_only_once_kafka_acknowledged() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    let end = h.transaction(2).await.unwrap();
    h.tick_and_persist().await;
    assert_eq!(h.stored(), START, "nothing acknowledged yet");
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    assert_eq!(
        h.stored(),
        START,
        "one of the transaction's two records is out"
    );
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    assert_eq!(h.stored(), end);
    assert_eq!(h.session.delivery.sent.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_hears_of_a_position_only_after_it_is_persisted() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    let end = h.transaction(1).await.unwrap();
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    // The persist runs on its own thread; until its result is taken the
    // server hears nothing new, even if the store already flushed.
    tokio::time::sleep(Duration::from_millis(2)).await;
    h.session.on_tick().await.unwrap();
    assert!(h.session.checkpoint.is_persisting());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.reported(), START);
    let persisted = h.session.checkpoint.persisted().await.unwrap();
    assert_eq!(h.stored(), end, "durable before it is reported");
    assert_eq!(h.reported(), START);
    h.session.checkpoint.flushed(persisted, &h.session.tracker);
    assert_eq!(h.reported(), end);
}

/// With the sequence audit on, a session whose store was behind what the
/// server had confirmed (the numbers of that stretch were lost) reports
/// nothing newer until the stream passed the stored offset again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_newer_is_reported_while_the_stretch_before_the_offset_is_replayed() {
    let config = config(&[("OUTBOX_CDC__AUDIT__SEQUENCES", "increasing")]);
    let behind = Lsn::new(0x80);
    let mut h = Harness::starting(config, MemoryDelivery::new(), START, behind);
    h.describe_outbox().await;
    h.tick_and_persist().await;
    assert_eq!(
        h.reported(),
        Lsn::ZERO,
        "the stored offset is not reported while replaying"
    );
    // The first transaction past the offset ends the replay.
    let end = h.transaction(1).await.unwrap();
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    assert_eq!(h.reported(), end);
}

/// A refused record ends the session by itself, even when the producer's
/// fatal error (which a refusal raises with the gapless guarantee) ended
/// the loop first: ending on the fatal error would restart without parking
/// or stopping, over and over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_decides_over_the_fatal_error_that_ended_the_loop() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    h.transaction(1).await.unwrap();
    h.transaction(1).await.unwrap();
    h.session.delivery.fatal = Some(SinkError::Fatal {
        code: RDKafkaErrorCode::MessageSizeTooLarge,
        reason: "gapless guarantee".into(),
        topic: None,
        event_id: None,
    });
    let failure = h.session.on_tick().await.unwrap_err();
    assert!(matches!(failure, PipelineError::Sink(_)), "{failure}");
    // Reported from the other polling thread, newest first: the purged
    // record's report arrives ahead of the refused one's.
    h.session.delivery.refuse_newest(SinkError::Delivery {
        code: RDKafkaErrorCode::PurgeQueue,
        topic: "outbox.event.order".into(),
        event_id: Some("e2".into()),
    });
    h.session.delivery.refuse(refused_for_size());
    let ended = h.session.keep_acknowledged(failure).await;
    assert!(matches!(ended, PipelineError::Poison { .. }), "{ended}");
    assert_eq!(ended.disposition(), crate::Disposition::Stop);
}

/// A graceful stop waits for the reports of what is in flight and persists
/// what they acknowledged; what stays unacknowledged at the deadline is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_drains_what_is_in_flight_and_persists_only_what_was_acknowledged() {
    let config = config(&[("OUTBOX_CDC__LIMITS__SHUTDOWN_TIMEOUT_MS", "300")]);
    let mut h = Harness::with_outbox(config, MemoryDelivery::new()).await;
    let first = h.transaction(1).await.unwrap();
    h.transaction(1).await.unwrap();
    // Acknowledged, its report not taken by the loop yet.
    h.session.delivery.ack(1);
    h.session.drain().await.unwrap();
    assert_eq!(h.stored(), first);
    assert_eq!(h.reported(), first);
    assert_eq!(h.session.delivery.outstanding(), 1, "never acknowledged");
}

/// The stream is not read while the in-flight limits are reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_waits_while_the_in_flight_limit_is_reached() {
    let config = config_with_kafka(
        r#""queue.buffering.max.messages" = 3"#,
        &[("OUTBOX_CDC__LIMITS__MAX_IN_FLIGHT_EVENTS", "3")],
    );
    let mut h = Harness::with_outbox(config, MemoryDelivery::new()).await;
    h.transaction(2).await.unwrap();
    assert!(h.session.has_room());
    h.transaction(1).await.unwrap();
    assert!(!h.session.has_room(), "three events in flight");
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    assert!(h.session.has_room());
}

/// Exactly-once: records sent in an open Kafka transaction are not
/// acknowledged before it commits, however Kafka acknowledged them and
/// however far the server's keepalives say it is; the commit releases them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_acknowledged_inside_an_open_kafka_transaction() {
    let mut delivery = MemoryDelivery::new();
    delivery.transactions = true;
    delivery.commit_at_every_commit = false;
    let mut h = Harness::with_outbox(config(&[]), delivery).await;
    let end = h.transaction(2).await.unwrap();
    h.session.delivery.ack(2);
    h.take_reports().unwrap();
    let wal_end = Lsn::new(end.as_u64() + 0x1000);
    h.keepalive(wal_end).await;
    h.tick_and_persist().await;
    assert_eq!(
        h.stored(),
        START,
        "held until the Kafka transaction commits"
    );
    let advanced = h.session.delivery.commit(&mut h.session.tracker);
    if advanced.0 {
        h.session.checkpoint.mark_dirty();
    }
    h.tick_and_persist().await;
    assert_eq!(h.stored(), end);
    // Between transactions, with nothing held, a keepalive moves it on.
    h.keepalive(wal_end).await;
    h.tick_and_persist().await;
    assert_eq!(h.stored(), wal_end);
}

/// Behind is judged at each PostgreSQL commit: bytes left unread and a
/// commit the server sent late (a backlog), not unread bytes alone (what
/// arrived while a Kafka commit ran, at a steady rate); caught up as soon as
/// nothing is unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_is_judged_at_each_commit_by_unread_bytes_sent_late() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    let hour_later = PgTimestamp(PgTimestamp::now().0 + 3_600_000_000);
    let sent = |h: &mut Harness, at: PgTimestamp, unread: bool| {
        h.session.stages.arrived(&[], at);
        h.session.unread = unread;
    };
    sent(&mut h, hour_later, true);
    h.transaction(1).await.unwrap();
    assert_eq!(h.session.input, Input::Behind, "unread, sent an hour late");
    sent(&mut h, PgTimestamp::now(), true);
    h.transaction(1).await.unwrap();
    assert_eq!(h.session.input, Input::CaughtUp, "unread, sent at once");
    sent(&mut h, hour_later, false);
    h.transaction(1).await.unwrap();
    assert_eq!(h.session.input, Input::CaughtUp, "nothing unread");
}

/// A streamed transaction is published only once its Stream Commit arrived,
/// all its rows in order, after the transactions that committed before it
/// (one arrived whole between its blocks); its position is acknowledged
/// only when all of them were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_transaction_is_published_at_its_commit_in_order() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    let mut streamed = h.block(900, true, 900, 3).await;
    h.transaction(1).await.unwrap();
    let small = h.session.delivery.sent.clone();
    streamed.extend(h.block(900, false, 900, 4).await);
    assert_eq!(
        h.session.delivery.sent, small,
        "nothing streamed is sent before its commit"
    );
    assert!(h.session.spill.as_ref().unwrap().stats().bytes > 0);
    let end = h.stream_commit(900).await.unwrap();
    let mut expected = small.clone();
    expected.extend(streamed);
    assert_eq!(h.session.delivery.sent, expected);
    h.session.delivery.ack(expected.len() - 1);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    assert!(
        h.stored() < end,
        "one of the streamed rows is not acknowledged"
    );
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    assert_eq!(h.stored(), end);
    assert_eq!(
        h.session.spill.as_ref().unwrap().stats(),
        Default::default()
    );
}

/// Rows of a rolled-back savepoint and of a rolled-back streamed transaction
/// are never published; the rest of the transaction is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_savepoints_and_streamed_transactions_publish_nothing() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    let mut kept = h.block(910, true, 910, 2).await;
    let rolled_back = h.block(910, false, 911, 2).await;
    kept.extend(h.block(910, false, 912, 2).await);
    h.stream_abort(910, 911).await;
    let gone = h.block(920, true, 920, 3).await;
    h.stream_abort(920, 920).await;
    h.stream_commit(910).await.unwrap();
    assert_eq!(h.session.delivery.sent, kept);
    for id in rolled_back.iter().chain(&gone) {
        assert!(
            !h.session.delivery.sent.contains(id),
            "{id} was rolled back"
        );
    }
    let failure = h.stream_commit(920).await.unwrap_err();
    assert!(
        matches!(failure, PipelineError::Protocol { .. }),
        "{failure}"
    );
}

/// A block of a transaction whose first block never arrived cannot be
/// completed: a stop, not a skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_segment_without_its_first_stops_the_connector() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    let start = Message::StreamStart(StreamStart {
        xid: 930,
        first_segment: false,
    });
    let failure = h.xlog(encoded(&start)).await.unwrap_err();
    assert!(
        matches!(failure, PipelineError::Protocol { .. }),
        "{failure}"
    );
    assert_eq!(failure.disposition(), crate::Disposition::Stop);
}

/// The live witness's pages: a sent event's fingerprint reaches the store
/// with the offset that covers its transaction, not before (it would stand
/// for an event that may yet be lost), and not only after (a crash between
/// would make a delivered row look missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_events_are_stored_for_the_witness_with_the_offset_that_covers_them() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    let first = h.transaction(2).await.unwrap();
    h.transaction(1).await.unwrap();
    let ids = h.session.delivery.sent.clone();
    assert_eq!(ids.len(), 3);
    h.session.delivery.ack(2);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    assert_eq!(h.stored(), first);
    let mut expected: Vec<u64> = ids[..2]
        .iter()
        .map(|id| crate::checkpoint::fingerprint(id))
        .collect();
    expected.sort_unstable();
    assert_eq!(h.store.witness_fingerprints(SLOT).unwrap(), expected);
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    let mut expected: Vec<u64> = ids
        .iter()
        .map(|id| crate::checkpoint::fingerprint(id))
        .collect();
    expected.sort_unstable();
    assert_eq!(h.store.witness_fingerprints(SLOT).unwrap(), expected);
}

/// A persist whose witness page could not be written (a full disk) gives
/// the page's fingerprints back: the persist of the acknowledged prefix
/// after the failure stores them before its offset. Before, they were
/// dropped while that persist stored the offset and the pages' extent past
/// them, and the witness published the delivered rows again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_persist_gives_its_fingerprints_back_to_the_next() {
    let mut h = Harness::with_outbox(config(&[]), MemoryDelivery::new()).await;
    let end = h.transaction(2).await.unwrap();
    let ids = h.session.delivery.sent.clone();
    h.session.delivery.ack(2);
    h.take_reports().unwrap();
    // The pages' directory cannot be made: a file stands in its place.
    let pages = h.store.path().join("witness-pages");
    std::fs::write(&pages, b"not a directory").unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    h.session.on_tick().await.unwrap();
    assert!(h.session.checkpoint.is_persisting());
    let Err(failure) = h.session.checkpoint.persisted().await else {
        panic!("the persist succeeded without its pages' directory");
    };
    assert!(matches!(failure, PipelineError::Store(_)), "{failure}");
    assert!(h.store.load(SLOT).unwrap().unwrap().lsn < end);
    // Room again before the session ends.
    std::fs::remove_file(&pages).unwrap();
    h.session.keep_acknowledged(failure).await;
    assert_eq!(h.stored(), end);
    let mut expected: Vec<u64> = ids
        .iter()
        .map(|id| crate::checkpoint::fingerprint(id))
        .collect();
    expected.sort_unstable();
    assert_eq!(h.store.witness_fingerprints(SLOT).unwrap(), expected);
}

/// Where a session starts whose server sends again, from `slot_position`,
/// what came before the stored offset [`START`] (reported at once: the
/// sequence audit is off), the witness's pages stored through `paged_through`.
fn resending(config: &'static Config, slot_position: Lsn, paged_through: Lsn) -> Harness {
    let positions = StartPositions {
        durable: DurableLsn::for_test(START),
        reported: START,
        resent_from: slot_position,
        paged_through,
    };
    Harness::streaming_from(config, MemoryDelivery::new(), positions)
}

/// A session whose server sends again what came before the stored offset
/// (the slot's position trails it: exactly-once resumed at a Kafka marker
/// ahead of the stored offset, whose events' pages died with the crash)
/// records those events as sent, and the live witness's horizon stays at
/// the slot's position until they are in the store: a witness round
/// comparing before would take them for missing and publish them twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_sent_again_by_the_server_are_stored_for_the_witness_before_it_compares() {
    let config = config(&[]);
    let slot_position = Lsn::new(0x80);
    // The offset before the marker was adopted: the slot's position.
    let mut h = resending(config, slot_position, slot_position);
    h.describe_outbox().await;
    let metrics = h.session.metrics;
    assert_eq!(metrics.witness_covered(), slot_position);
    // A transaction the earlier session sent and Kafka committed: dropped.
    h.next_lsn = slot_position.as_u64();
    let resent_id = uuid_like(h.next_lsn + 0x10);
    h.transaction(1).await.unwrap();
    assert!(h.session.delivery.sent.is_empty(), "not sent twice");
    h.tick_and_persist().await;
    assert_eq!(
        metrics.witness_covered(),
        slot_position,
        "its fingerprint is not stored yet"
    );
    // Nor is the stored offset (adopted from the marker) taken for paged:
    // a crash now, and the next start must record the resent events again.
    assert!(h.store.witness_paged_through(SLOT).unwrap() < START);
    // The stream passes the offset (a keepalive there, nothing new to
    // acknowledge): the page is persisted all the same.
    h.keepalive(START).await;
    h.tick_and_persist().await;
    assert_eq!(metrics.witness_covered(), START);
    assert_eq!(h.store.witness_paged_through(SLOT).unwrap(), START);
    let stored = h.store.witness_fingerprints(SLOT).unwrap();
    let fingerprint = crate::checkpoint::fingerprint(&resent_id);
    assert!(
        stored.binary_search(&fingerprint).is_ok(),
        "the resent event {resent_id} is among the stored pages {stored:?}"
    );
    // New transactions move it with the durable position.
    h.next_lsn = START.as_u64() + 0x100;
    let end = h.transaction(1).await.unwrap();
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    assert_eq!(h.stored(), end);
    assert_eq!(metrics.witness_covered(), end);
    assert_eq!(h.store.witness_paged_through(SLOT).unwrap(), end);
}

/// A session whose server sends again what came before the stored offset,
/// all of it covered by pages an earlier session stored (at least once: the
/// offset is persisted after them), does not record a resent event as sent:
/// one missing from the pages was skipped by that session, and recording it
/// would hide the row from the witness for good (a chaos run lost one so).
/// The pages cover the stored offset from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_event_the_stored_pages_lack_stays_missing_for_the_witness() {
    let config = config(&[]);
    let slot_position = Lsn::new(0x80);
    let mut h = resending(config, slot_position, START);
    h.describe_outbox().await;
    let metrics = h.session.metrics;
    assert_eq!(metrics.witness_covered(), START);
    h.next_lsn = slot_position.as_u64();
    let skipped_id = uuid_like(h.next_lsn + 0x10);
    h.transaction(1).await.unwrap();
    assert!(h.session.delivery.sent.is_empty(), "not sent again");
    h.keepalive(START).await;
    h.next_lsn = START.as_u64() + 0x100;
    let sent_id = uuid_like(h.next_lsn + 0x10);
    let end = h.transaction(1).await.unwrap();
    h.session.delivery.ack(1);
    h.take_reports().unwrap();
    h.tick_and_persist().await;
    assert_eq!(h.stored(), end);
    assert_eq!(metrics.witness_covered(), end);
    assert_eq!(h.store.witness_paged_through(SLOT).unwrap(), end);
    let stored = h.store.witness_fingerprints(SLOT).unwrap();
    assert_eq!(
        stored,
        vec![crate::checkpoint::fingerprint(&sent_id)],
        "only the event sent now is in the pages, not the resent {skipped_id}"
    );
}
