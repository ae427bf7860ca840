//! Reference consumer of the outbox topics, in one of two modes.
//!
//! **Inbox mode** (the default): the idempotent consumer of the inbox pattern.
//! Reads every topic matching a regex in a consumer group, with automatic
//! offset commits OFF. Per record: one PostgreSQL transaction inserts
//! (consumer_name, event_id) into the inbox with ON CONFLICT DO NOTHING and,
//! only when that inserted a row, applies the business effect (a demo
//! inventory reservation); it commits; only then the record's Kafka offset is
//! committed (synchronously). A crash anywhere redelivers at most the records
//! after the last committed offset, and the inbox turns each redelivery into a
//! no-op: at-least-once delivery, effectively-once effect.
//!
//! This covers effects in the consumer's own database only. A call to another
//! system (a payment provider, an e-mail service) cannot join this
//! transaction: pass `event_id` to it as the idempotency key instead.
//!
//! **No-inbox mode** (`--no-inbox`): no PostgreSQL, no business effect. Each
//! record's `event_id` is remembered in memory; a record whose `event_id` this
//! process has seen before is logged ("duplicate delivery") and counted, not
//! suppressed. Offsets are committed after each record as in inbox mode. The
//! final log line gives `records=N duplicates=D`, which makes this mode a
//! checker of what Kafka delivered. The memory grows with every distinct
//! event id and dies with the process: a duplicate across a restart is not
//! seen.
//!
//! Which one to use:
//! - The relay's default delivery mode is at-least-once: after a connector
//!   crash the records that were in flight may be published again, so a
//!   consumer whose effect must happen once needs the inbox.
//! - With `[delivery] mode = "exactly-once"` the relay writes each event in a
//!   Kafka transaction, and a `read_committed` consumer (`--isolation`, the
//!   default) sees each event once, without an inbox. A `read_uncommitted`
//!   consumer also sees the records of aborted Kafka transactions (a batch
//!   the relay sent and then abandoned, and sends again): duplicates. The
//!   consumer's own crash between its effect and its offset commit still
//!   redelivers; an effect that must not repeat then still needs the inbox
//!   (or an idempotency key).
//!
//! `--exit-after-idle-ms N` stops cleanly, with the final log line, after N ms
//! without a record (counted from the subscription): for tests that read a
//! finished topic to the end.
//!
//! Crash points for the chaos tests: see `failpoint.rs`.

mod failpoint;
mod inbox;
mod record;

use std::collections::HashSet;
use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use outbox_cdc::pg::{PgConnectConfig, QualifiedTable};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use inbox::{Inbox, Outcome};
use record::{InboxRecord, Place};

#[derive(Parser, Debug)]
#[command(
    name = "reference-consumer",
    about = "Idempotent consumer of the outbox topics: inbox row and business effect in one PostgreSQL transaction, Kafka offset committed after (or, with --no-inbox, a counter of duplicate deliveries)"
)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(
        long,
        env = "CONSUMER_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:19092"
    )]
    bootstrap_servers: String,
    /// PostgreSQL connection string (URL or key=value) of the consumer's
    /// database. Required in inbox mode; ignored with --no-inbox.
    #[arg(long, env = "CONSUMER_PG_URL")]
    pg_url: Option<String>,
    /// Run without an inbox: no PostgreSQL, no business effect; a record
    /// whose event_id this process has seen before is counted as a duplicate,
    /// not suppressed.
    #[arg(
        long,
        env = "CONSUMER_NO_INBOX",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    no_inbox: bool,
    /// Pass over a record that cannot be deduplicated (no `event_id` header,
    /// or one that is not a uuid) or applied (a value that is not a JSON
    /// object): logged at ERROR with where it is, counted (`unusable=`) and
    /// its offset committed. Off by default: such a record stops the consumer
    /// with its offset uncommitted, on every start, until it is dealt with
    /// (a consumer cannot apply it at most once, or apply it at all).
    #[arg(
        long,
        env = "CONSUMER_PASS_OVER_UNUSABLE",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pass_over_unusable: bool,
    /// Apply dead-lettered records and records of replay topics too. Off by
    /// default: they match `^outbox\..*` but are not live events (a
    /// dead-lettered event and its parked successors would be applied out of
    /// order); they are logged, counted and their offsets committed.
    #[arg(
        long,
        env = "CONSUMER_APPLY_SIDE_RECORDS",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    apply_side_records: bool,
    /// Kafka `isolation.level`: read_committed skips the records of aborted
    /// Kafka transactions, read_uncommitted delivers them too.
    #[arg(
        long,
        env = "CONSUMER_ISOLATION",
        value_enum,
        default_value_t = Isolation::ReadCommitted
    )]
    isolation: Isolation,
    /// Stop cleanly (with the final counts) after this many milliseconds
    /// without a record, counted from the subscription. Off by default.
    #[arg(long, env = "CONSUMER_EXIT_AFTER_IDLE_MS", value_name = "MS")]
    exit_after_idle_ms: Option<u64>,
    /// Kafka consumer group.
    #[arg(long, env = "CONSUMER_GROUP", default_value = "inventory")]
    group: String,
    /// Static group membership (`group.instance.id`): a restarted instance takes
    /// its partitions back at once instead of waiting for the session timeout.
    /// Caveat (the broker's, classic protocol): a restarted static member gets
    /// the previous assignment without a rebalance, so a topic matching the
    /// regex that appeared while it was down is assigned only at the next
    /// rebalance. Create topics before the consumers start, or do not use it.
    #[arg(long, env = "CONSUMER_INSTANCE_ID")]
    instance_id: Option<String>,
    /// The consumer's name in the inbox (one inbox serves several consumers;
    /// each needs an effects table of its own).
    #[arg(long, env = "CONSUMER_NAME", default_value = DEFAULT_CONSUMER_NAME)]
    consumer_name: String,
    /// Topics to read: a regular expression (librdkafka syntax, must start with `^`).
    #[arg(long, env = "CONSUMER_TOPIC_REGEX", default_value = r"^outbox\..*")]
    topic_regex: String,
    /// Inbox table: (consumer_name text, event_id uuid, PRIMARY KEY (consumer_name, event_id)).
    #[arg(
        long,
        env = "CONSUMER_INBOX_TABLE",
        default_value = "public.processed_events"
    )]
    inbox_table: String,
    /// Business effect table: (event_id uuid, order_id text, sku text, qty int).
    #[arg(
        long,
        env = "CONSUMER_EFFECTS_TABLE",
        default_value = DEFAULT_EFFECTS_TABLE
    )]
    effects_table: String,
    /// Consumer session timeout, in milliseconds.
    #[arg(long, env = "CONSUMER_SESSION_TIMEOUT_MS", default_value_t = 10_000)]
    session_timeout_ms: u32,
    /// How often new topics matching the regex are looked for, in milliseconds.
    #[arg(long, env = "CONSUMER_METADATA_REFRESH_MS", default_value_t = 5_000)]
    metadata_refresh_ms: u32,
    /// Longest wait between retries of a failed PostgreSQL transaction or offset commit, in milliseconds.
    #[arg(long, env = "CONSUMER_MAX_BACKOFF_MS", default_value_t = 5_000)]
    max_backoff_ms: u64,
    /// Extra librdkafka consumer settings, `key=value` (repeatable).
    #[arg(long = "kafka", value_name = "KEY=VALUE")]
    kafka: Vec<String>,
}

const DEFAULT_CONSUMER_NAME: &str = "inventory";
const DEFAULT_EFFECTS_TABLE: &str = "public.inventory_reservations";

/// `--isolation`: librdkafka's `isolation.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Isolation {
    #[value(name = "read_committed")]
    ReadCommitted,
    #[value(name = "read_uncommitted")]
    ReadUncommitted,
}

impl Isolation {
    fn as_str(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Plain `key=value` fields when the log goes to a file or a pipe.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Counts for the final log line.
#[derive(Default)]
struct Counts {
    /// Every record handled (offset committed or attempted).
    records: u64,
    /// Inbox mode: first deliveries, whose effect was applied.
    applied: u64,
    /// Records whose event_id was seen before (inbox row or memory).
    duplicates: u64,
    /// Dead-lettered and replayed records, not applied.
    side_records: u64,
    /// Records without a usable event_id or value, passed over (--pass-over-unusable).
    unusable: u64,
    /// Inbox mode: duplicates whose content differs from the recorded effect
    /// (counted in `duplicates` too).
    conflicts: u64,
}

/// How a record is recognised as seen before.
enum Dedupe {
    /// The PostgreSQL inbox: a redelivery is suppressed (no second effect).
    /// Boxed: connection settings, client and statements dwarf the other variant.
    Inbox(Box<Inbox>),
    /// `--no-inbox`: event ids held in memory; a redelivery is only counted.
    Memory(SeenEventIds),
}

impl Dedupe {
    /// What happens to a record whose offset could not be committed.
    fn redelivery_note(&self) -> &'static str {
        match self {
            Dedupe::Inbox(_) => "the inbox makes that a no-op",
            Dedupe::Memory(_) => "this process would count it as a duplicate",
        }
    }
}

/// The event ids this process has read, for `--no-inbox`.
#[derive(Default)]
struct SeenEventIds(HashSet<String>);

impl SeenEventIds {
    /// True the first time `event_id` is offered. The inbox compares UUIDs,
    /// so case does not matter here either.
    fn first_time(&mut self, event_id: &str) -> bool {
        self.0.insert(event_id.to_ascii_lowercase())
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let inbox = match (&args.pg_url, args.no_inbox) {
        (Some(pg_url), false) => {
            let pg = PgConnectConfig::parse(pg_url).context("invalid --pg-url")?;
            let inbox_table =
                QualifiedTable::parse(&args.inbox_table).context("invalid --inbox-table")?;
            let effects_table =
                QualifiedTable::parse(&args.effects_table).context("invalid --effects-table")?;
            // The shipped effects table keys its rows by event_id alone: a
            // second consumer name applying the same events there fails on
            // its first event (review F9, E7).
            if args.consumer_name != DEFAULT_CONSUMER_NAME
                && args.effects_table == DEFAULT_EFFECTS_TABLE
            {
                anyhow::bail!(
                    "--consumer-name {:?} with the shipped effects table {DEFAULT_EFFECTS_TABLE}, whose primary key \
                     is event_id alone: consumer {DEFAULT_CONSUMER_NAME:?} applies the same events there, so the \
                     second name fails on its first event. Give this consumer an effects table of its own \
                     (--effects-table or CONSUMER_EFFECTS_TABLE); the inbox table is shared by name",
                    args.consumer_name
                );
            }
            Some(Inbox::new(
                pg,
                args.consumer_name.clone(),
                inbox_table,
                effects_table,
            ))
        }
        (None, false) => anyhow::bail!(
            "--pg-url (or CONSUMER_PG_URL) is required: the inbox lives in PostgreSQL. \
             Pass --no-inbox (or CONSUMER_NO_INBOX=true) to run without one."
        ),
        (pg_url, true) => {
            if pg_url.is_some() {
                warn!("--no-inbox: --pg-url (CONSUMER_PG_URL) is ignored");
            }
            None
        }
    };
    if !args.topic_regex.starts_with('^') {
        anyhow::bail!(
            "invalid --topic-regex {:?}: librdkafka takes a pattern only when it starts with ^",
            args.topic_regex
        );
    }
    // Installed first: a SIGTERM during start-up is a clean stop too.
    let mut stop = stop_signal()?;
    let max_backoff = Duration::from_millis(args.max_backoff_ms.max(1));
    let mut dedupe = match inbox {
        Some(mut inbox) => {
            // Before joining the group: a missing table or privilege stops us here.
            let mut backoff = Duration::from_millis(100).min(max_backoff);
            while let Err(e) = inbox.connect().await {
                if !e.is_retryable() {
                    return Err(e).context("cannot prepare the inbox statements");
                }
                warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "PostgreSQL not reachable yet");
                if !sleep_unless_stopped(backoff, &mut stop).await {
                    return Ok(());
                }
                backoff = (backoff * 2).min(max_backoff);
            }
            Dedupe::Inbox(Box::new(inbox))
        }
        None => Dedupe::Memory(SeenEventIds::default()),
    };
    let consumer = make_consumer(&args)?;
    consumer
        .subscribe(&[args.topic_regex.as_str()])
        .with_context(|| format!("cannot subscribe to {}", args.topic_regex))?;
    info!(
        group = %args.group,
        mode = if args.no_inbox { "no-inbox" } else { "inbox" },
        consumer_name = %args.consumer_name,
        topics = %args.topic_regex,
        isolation = args.isolation.as_str(),
        failpoint = failpoint::describe().as_deref().unwrap_or("none"),
        "consuming"
    );

    let idle_limit = args.exit_after_idle_ms.map(Duration::from_millis);
    let mut idle_deadline = idle_limit.map(|d| Instant::now() + d);
    let mut counts = Counts::default();
    loop {
        let message = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            () = sleep_until(idle_deadline) => {
                info!(idle_ms = args.exit_after_idle_ms, "no record within --exit-after-idle-ms: stopping");
                break;
            }
            message = consumer.recv() => message,
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                // Broker outages and rebalances surface here; the client retries by itself.
                warn!(error = %e, "Kafka consumer error");
                if !sleep_unless_stopped(Duration::from_millis(200), &mut stop).await {
                    break;
                }
                continue;
            }
        };
        idle_deadline = idle_limit.map(|d| Instant::now() + d);
        failpoint::hit("after-receive");
        if !args.apply_side_records
            && let Some(why) = side_record_of(&message)
        {
            counts.side_records += 1;
            warn!(
                topic = message.topic(),
                partition = message.partition(),
                offset = message.offset(),
                "not applied: {why}; it is not a live event (--apply-side-records applies such records)"
            );
            pass_over(&consumer, &message, max_backoff).await;
            continue;
        }
        let rec = match parse_message(&message) {
            Ok(rec) => rec,
            Err(e) if args.pass_over_unusable => {
                counts.unusable += 1;
                error!(
                    topic = message.topic(),
                    partition = message.partition(),
                    offset = message.offset(),
                    error = %e,
                    "passed over (--pass-over-unusable): a record that cannot be deduplicated or applied is not"
                );
                pass_over(&consumer, &message, max_backoff).await;
                continue;
            }
            Err(e) => {
                return Err(e).context(
                    "refusing to skip a record that cannot be deduplicated or applied (its offset \
                     stays uncommitted, so every start stops here): fix or remove its producer's record, \
                     or pass it over with --pass-over-unusable (CONSUMER_PASS_OVER_UNUSABLE=true)",
                );
            }
        };
        match &mut dedupe {
            Dedupe::Inbox(inbox) => {
                let Some(outcome) = apply_with_retry(inbox, &rec, max_backoff, &mut stop).await?
                else {
                    // Stopped while retrying: the offset stays, the record comes again.
                    break;
                };
                match outcome {
                    Outcome::Applied => {
                        counts.applied += 1;
                        debug!(event_id = %rec.event_id, at = %rec.place, lsn = %rec.lsn, "applied");
                    }
                    Outcome::Duplicate => {
                        counts.duplicates += 1;
                        info!(event_id = %rec.event_id, at = %rec.place, lsn = %rec.lsn, "duplicate delivery: effect already applied, nothing changed");
                    }
                    Outcome::Conflict { stored } => {
                        counts.duplicates += 1;
                        counts.conflicts += 1;
                        error!(event_id = %rec.event_id, at = %rec.place, lsn = %rec.lsn, %stored,
                            order_id = %rec.order_id, sku = ?rec.sku, qty = ?rec.qty,
                            "the same event_id with different content: the effect recorded first stands and \
                            this record is NOT applied; two events share an id (a writer that supplies its \
                            own ids, or another producer): fix the producer and apply this one by hand");
                    }
                }
                failpoint::hit("after-business-commit-before-offset-commit");
            }
            Dedupe::Memory(seen) => {
                if seen.first_time(&rec.event_id) {
                    debug!(event_id = %rec.event_id, at = %rec.place, lsn = %rec.lsn, "first delivery");
                } else {
                    counts.duplicates += 1;
                    warn!(
                        event_id = %rec.event_id,
                        topic = %rec.place.topic,
                        partition = rec.place.partition,
                        offset = rec.place.offset,
                        lsn = %rec.lsn,
                        "duplicate delivery: event_id already read by this process (no inbox: counted, not suppressed)"
                    );
                }
            }
        }
        counts.records += 1;
        commit_with_retry(
            &consumer,
            &message,
            &rec,
            max_backoff,
            dedupe.redelivery_note(),
        )
        .await;
        failpoint::hit("after-offset-commit");
    }
    match dedupe {
        Dedupe::Inbox(_) => info!(
            records = counts.records,
            duplicates = counts.duplicates,
            applied = counts.applied,
            conflicts = counts.conflicts,
            side_records = counts.side_records,
            unusable = counts.unusable,
            "stopping"
        ),
        Dedupe::Memory(_) => info!(
            records = counts.records,
            duplicates = counts.duplicates,
            distinct = counts.records - counts.duplicates,
            side_records = counts.side_records,
            unusable = counts.unusable,
            "stopping"
        ),
    }
    Ok(())
}

/// Commits the offset of a record that is not applied; a failed commit
/// only means the record is passed over again after a restart.
async fn pass_over(
    consumer: &StreamConsumer<LogRebalance>,
    message: &BorrowedMessage<'_>,
    max_backoff: Duration,
) {
    if !commit_offset(consumer, message, max_backoff).await {
        warn!(
            topic = message.topic(),
            offset = message.offset(),
            "offset not committed; the record is passed over again after a restart"
        );
    }
}

/// Sleeps until `deadline`; never returns without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Logs every assignment change: which partitions this instance owns is the
/// first question when records seem not to arrive.
struct LogRebalance;

impl ClientContext for LogRebalance {}

impl ConsumerContext for LogRebalance {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => info!(partitions = %partitions(tpl), "partitions assigned"),
            Rebalance::Revoke(tpl) => info!(partitions = %partitions(tpl), "partitions revoked"),
            Rebalance::Error(e) => warn!(error = %e, "rebalance failed"),
        }
    }
}

fn partitions(tpl: &TopicPartitionList) -> String {
    let list: Vec<String> = tpl
        .elements()
        .iter()
        .map(|e| format!("{}[{}]", e.topic(), e.partition()))
        .collect();
    list.join(",")
}

fn make_consumer(args: &Args) -> anyhow::Result<StreamConsumer<LogRebalance>> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("group.id", &args.group)
        // Offsets are committed by hand, after the inbox transaction commits.
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", args.session_timeout_ms.to_string())
        .set(
            "topic.metadata.refresh.interval.ms",
            args.metadata_refresh_ms.to_string(),
        )
        .set("isolation.level", args.isolation.as_str());
    if let Some(id) = &args.instance_id {
        config.set("group.instance.id", id);
    }
    for kv in &args.kafka {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("invalid --kafka {kv:?}: expected key=value"))?;
        if k.trim() == "enable.auto.commit" && v.trim() != "false" {
            anyhow::bail!(
                "invalid --kafka {kv:?}: offsets must be committed after the inbox transaction"
            );
        }
        if k.trim() == "isolation.level" {
            anyhow::bail!(
                "invalid --kafka {kv:?}: use --isolation read_committed|read_uncommitted"
            );
        }
        config.set(k.trim(), v.trim());
    }
    config
        .create_with_context(LogRebalance)
        .context("cannot create the Kafka consumer")
}

fn parse_message(m: &BorrowedMessage<'_>) -> Result<InboxRecord, record::RecordError> {
    let place = Place {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
    };
    let headers = m
        .headers()
        .map(|h| h.iter().map(|x| (x.key, x.value)).collect::<Vec<_>>());
    record::parse(place, m.key(), m.payload(), headers.unwrap_or_default())
}

fn side_record_of(m: &BorrowedMessage<'_>) -> Option<String> {
    let headers = m
        .headers()
        .map(|h| h.iter().map(|x| (x.key, x.value)).collect::<Vec<_>>());
    record::side_record(m.topic(), headers.unwrap_or_default())
}

/// Commits the record's offset, retrying a few times; false if it was not
/// committed (the record is then delivered again after a restart).
async fn commit_offset(
    consumer: &StreamConsumer<LogRebalance>,
    message: &BorrowedMessage<'_>,
    max_backoff: Duration,
) -> bool {
    let mut backoff = Duration::from_millis(100).min(max_backoff);
    for attempt in 1..=5 {
        // A synchronous commit blocks on the broker's reply.
        match tokio::task::block_in_place(|| consumer.commit_message(message, CommitMode::Sync)) {
            Ok(()) => return true,
            Err(e) => {
                warn!(error = %e, topic = message.topic(), offset = message.offset(), attempt, "offset commit failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(max_backoff);
            }
        }
    }
    false
}

/// Retries the inbox transaction until it commits, fails for good, or a stop
/// is asked (`None`). The record's offset is not committed meanwhile, so
/// giving up (exiting) is safe: the next instance reads the record again.
async fn apply_with_retry(
    inbox: &mut Inbox,
    rec: &InboxRecord,
    max_backoff: Duration,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<Option<Outcome>> {
    let mut backoff = Duration::from_millis(100).min(max_backoff);
    loop {
        match inbox.apply(rec).await {
            Ok(outcome) => return Ok(Some(outcome)),
            Err(e) if e.is_retryable() => {
                warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "inbox transaction failed; retrying the same record");
                if !sleep_unless_stopped(backoff, stop).await {
                    return Ok(None);
                }
                backoff = (backoff * 2).min(max_backoff);
            }
            Err(e) => {
                return Err(e)
                    .context("inbox transaction failed for good; the offset was not committed");
            }
        }
    }
}

/// Commits the offset after `message`. A commit that keeps failing (the group
/// moved the partition away, the broker is down for long) is given up after a
/// few tries: a later commit covers it, or the record is delivered again and
/// the inbox absorbs it (without an inbox: it is counted as a duplicate).
async fn commit_with_retry(
    consumer: &StreamConsumer<LogRebalance>,
    message: &BorrowedMessage<'_>,
    rec: &InboxRecord,
    max_backoff: Duration,
    redelivery_note: &str,
) {
    if !commit_offset(consumer, message, max_backoff).await {
        warn!(at = %rec.place, event_id = %rec.event_id, "offset not committed; the record may be delivered again ({redelivery_note})");
    }
}

/// A flag that turns true on SIGTERM or SIGINT. The handlers are installed
/// by the time this returns.
fn stop_signal() -> anyhow::Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        info!("signal received: stopping after the current record");
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// Sleeps; false when a stop was asked meanwhile (or before).
async fn sleep_unless_stopped(pause: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let asked = tokio::select! {
        _ = tokio::time::sleep(pause) => false,
        r = stop.wait_for(|s| *s) => r.is_ok(),
    };
    !asked && !*stop.borrow()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_event_ids_count_a_uuid_once_whatever_its_case() {
        let mut seen = SeenEventIds::default();
        assert!(seen.first_time("0b7f5c9e-3d1a-4c8e-9f00-1234567890ab"));
        assert!(!seen.first_time("0b7f5c9e-3d1a-4c8e-9f00-1234567890ab"));
        assert!(!seen.first_time("0B7F5C9E-3D1A-4C8E-9F00-1234567890AB"));
        assert!(seen.first_time("0b7f5c9e-3d1a-4c8e-9f00-1234567890ac"));
    }

    #[test]
    fn isolation_takes_librdkafka_spellings_only() {
        let parse = |v: &str| Args::try_parse_from(["reference-consumer", "--isolation", v]);
        for level in ["read_committed", "read_uncommitted"] {
            let args = parse(level).unwrap();
            assert_eq!(args.isolation.as_str(), level);
        }
        let e = parse("read-committed").unwrap_err().to_string();
        assert!(
            e.contains("--isolation") && e.contains("read_committed, read_uncommitted"),
            "{e}"
        );
    }
}
