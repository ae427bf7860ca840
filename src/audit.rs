//! `outbox-cdc audit`: compares the retained outbox rows of a time window with
//! what Kafka holds, and answers "did we lose anything?".
//!
//! 1. The rows with `occurred_at` in `[since, until)` (optionally of one
//!    aggregate type) are read as the connector maps them: event id, topic,
//!    aggregate, sequence. Rows from `repair.occurred_at_margin_ms` earlier
//!    are read too, but only to recognise their records (a transaction starts
//!    before it commits, and records carry the commit time).
//! 2. Every partition of every topic those rows route to is read with
//!    `isolation.level = read_committed`, from the first offset at or after
//!    `since` (by record timestamp) to the end as it was when the audit began.
//! 3. Findings: rows with no record (missing; the exit status is non-zero),
//!    records in the window whose event id has no row (phantoms), event ids
//!    seen more than once (duplicates), and per key, first copies whose
//!    sequence does not increase or that sit in two partitions (order
//!    violations; non-zero exit).
//!
//! Memory stays bounded for large windows: event ids are kept as 127-bit
//! fingerprints (the low bit says whether the row is in the window) in a
//! sorted vector with a copy count each (18 bytes a row), per key only the
//! last sequence; the missing rows' details are read back in a second pass
//! over the table. The consumer's read-ahead is capped (8 MiB queued).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use futures_util::{StreamExt as _, pin_mut};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use tokio_postgres::Client;

use crate::config::Config;
use crate::outbox::ChangeContext;
use crate::pg::{Lsn, PgConnectConfig, PgError, PgTimestamp, quote_ident};
use crate::pipeline::{EventIdSet, ReplayOptions, ReplayReport};
use crate::retained::RetainedTable;

/// What to audit.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Start of the window, as PostgreSQL reads a `timestamptz` (RFC 3339 works).
    pub since: String,
    /// End of the window (exclusive); `None`: now.
    pub until: Option<String>,
    pub aggregate_type: Option<String>,
    /// Details kept per finding kind (the counts are always complete).
    pub max_examples: usize,
    /// Keep a progress line on stderr (for a terminal).
    pub progress: bool,
}

/// One line on stderr, rewritten at most four times a second.
struct Progress {
    enabled: bool,
    last: Option<std::time::Instant>,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        Progress {
            enabled,
            last: None,
        }
    }

    fn show(&mut self, line: impl FnOnce() -> String) {
        if !self.enabled
            || self
                .last
                .is_some_and(|t| t.elapsed() < Duration::from_millis(250))
        {
            return;
        }
        self.last = Some(std::time::Instant::now());
        eprint!("\r\x1b[2K{}", line());
    }

    fn finish(&mut self) {
        if self.enabled && self.last.is_some() {
            eprint!("\r\x1b[2K");
        }
    }
}

/// A row with no record in Kafka.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MissingRow {
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub aggregate_sequence: Option<i64>,
    pub topic: String,
    pub occurred_at: String,
}

/// A record in the window whose event id matches no retained row.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Phantom {
    pub event_id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

#[derive(Debug, Default, Serialize)]
pub struct AuditReport {
    pub since: String,
    pub until: String,
    pub rows: u64,
    pub records: u64,
    pub topics: Vec<String>,
    pub missing: u64,
    pub missing_rows: Vec<MissingRow>,
    pub phantoms: u64,
    pub phantom_records: Vec<Phantom>,
    pub duplicates: u64,
    pub duplicate_event_ids: Vec<String>,
    pub order_violations: u64,
    pub order_violation_details: Vec<String>,
    /// Every missing row's event id (the details above are only examples).
    #[serde(skip)]
    pub missing_ids: EventIdSet,
    /// The window in RFC 3339 (UTC), as `replay` takes it.
    #[serde(skip)]
    window: (String, String),
    /// The same window, in microseconds since 2000-01-01.
    #[serde(skip)]
    window_micros: (i64, i64),
}

impl AuditReport {
    /// Whether nothing that breaks the contract was found (duplicates and
    /// phantoms are reported, but do not fail the audit).
    pub fn window_micros(&self) -> (i64, i64) {
        self.window_micros
    }

    pub fn passed(&self) -> bool {
        self.missing == 0 && self.order_violations == 0
    }

    pub fn to_text(&self) -> String {
        let mut out = format!(
            "audit {} .. {}: {} rows, {} records in {} topic(s)\n",
            self.since,
            self.until,
            self.rows,
            self.records,
            self.topics.len(),
        );
        let counts = [
            ("missing", self.missing),
            ("phantoms", self.phantoms),
            ("duplicates", self.duplicates),
            ("order violations", self.order_violations),
        ];
        for (what, count) in counts {
            out.push_str(&format!("{what}: {count}\n"));
        }
        for m in &self.missing_rows {
            let MissingRow {
                event_id,
                aggregate_type: kind,
                aggregate_id: id,
                aggregate_sequence: seq,
                topic,
                occurred_at,
            } = m;
            out.push_str(&format!(
                "  missing {event_id} ({kind}/{id} seq {seq:?}, topic {topic}, occurred {occurred_at})\n"
            ));
        }
        for p in &self.phantom_records {
            out.push_str(&format!(
                "  phantom {} at {}[{}]@{}\n",
                p.event_id, p.topic, p.partition, p.offset
            ));
        }
        for d in &self.duplicate_event_ids {
            out.push_str(&format!("  duplicate {d}\n"));
        }
        for o in &self.order_violation_details {
            out.push_str(&format!("  order {o}\n"));
        }
        out.push_str(if self.passed() {
            "audit PASSED\n"
        } else {
            "audit FAILED\n"
        });
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("PostgreSQL: {0}")]
    Pg(#[from] PgError),
    #[error("Kafka: {0}")]
    Kafka(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Pipeline(#[from] crate::pipeline::PipelineError),
}

fn sql(during: &'static str) -> impl Fn(tokio_postgres::Error) -> AuditError {
    move |e| AuditError::Pg(PgError::sql(during, e))
}

/// One retained row as the connector would publish it.
struct Row {
    event_id: String,
    topic: String,
    aggregate_type: String,
    aggregate_id: String,
    sequence: Option<i64>,
    occurred_at: String,
    in_window: bool,
}

pub async fn run(config: &Config, options: &AuditOptions) -> Result<AuditReport, AuditError> {
    let pg = PgConnectConfig::parse(&config.postgres.url)?;
    let client = pg.connect_sql().await?;
    let e = sql("reading the audit window");
    let until = options.until.clone().unwrap_or_else(|| "now".to_owned());
    let row = client
        .query_one(
            "SELECT $1::text::timestamptz::text, $2::text::timestamptz::text, \
                    (extract(epoch FROM $1::text::timestamptz) * 1000)::int8, \
                    (extract(epoch FROM $2::text::timestamptz) * 1000)::int8, \
                    to_char($1::text::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
                    to_char($2::text::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
                    ((extract(epoch FROM $1::text::timestamptz) - 946684800) * 1e6)::int8, \
                    ((extract(epoch FROM $2::text::timestamptz) - 946684800) * 1e6)::int8",
            &[&options.since, &until],
        )
        .await
        .map_err(|err| AuditError::Config(format!("--since/--until: {err}")))?;
    let mut report = AuditReport {
        since: row.try_get(0).map_err(&e)?,
        until: row.try_get(1).map_err(&e)?,
        window: (row.try_get(4).map_err(&e)?, row.try_get(5).map_err(&e)?),
        window_micros: (row.try_get(6).map_err(&e)?, row.try_get(7).map_err(&e)?),
        ..AuditReport::default()
    };
    let (since_ms, until_ms): (i64, i64) =
        (row.try_get(2).map_err(&e)?, row.try_get(3).map_err(&e)?);
    let margin_ms = config.repair.occurred_at_margin_ms as i64;

    let mut progress = Progress::new(options.progress);

    // 1. The rows.
    // Fingerprint (low bit clear) | in-window flag.
    let mut ids: Vec<u128> = Vec::new();
    let mut topics: BTreeSet<String> = BTreeSet::new();
    for_each_row(
        &client,
        config,
        options,
        since_ms - margin_ms,
        since_ms,
        until_ms,
        |r| {
            if r.in_window {
                report.rows += 1;
            }
            progress.show(|| format!("audit: {} rows read", report.rows));
            topics.insert(r.topic.clone());
            ids.push(EventIdSet::fingerprint(&r.event_id) | u128::from(r.in_window));
        },
    )
    .await?;
    ids.sort_unstable_by_key(|f| *f & !1);
    ids.dedup_by_key(|f| *f & !1);
    ids.shrink_to_fit();
    let mut copies: Vec<u16> = vec![0; ids.len()];
    report.topics = topics.iter().cloned().collect();

    // 2. The records.
    let consumer = consumer(config)?;
    let mut last_by_key: HashMap<u64, (i32, i64)> = HashMap::new();
    for topic in &topics {
        read_topic(&consumer, topic, since_ms, |rec| {
            report.records += 1;
            progress.show(|| {
                format!(
                    "audit: {} rows, {} records read (topic {topic})",
                    report.rows, report.records
                )
            });
            let in_window = rec
                .timestamp_ms
                .is_some_and(|t| t >= since_ms && t < until_ms);
            let found =
                ids.binary_search_by_key(&EventIdSet::fingerprint(&rec.event_id), |f| *f & !1);
            let Ok(i) = found else {
                if in_window {
                    report.phantoms += 1;
                    if report.phantom_records.len() < options.max_examples {
                        report.phantom_records.push(Phantom {
                            event_id: rec.event_id.clone(),
                            topic: topic.clone(),
                            partition: rec.partition,
                            offset: rec.offset,
                        });
                    }
                }
                return;
            };
            copies[i] = copies[i].saturating_add(1);
            if copies[i] == 2 {
                report.duplicates += 1;
                if report.duplicate_event_ids.len() < options.max_examples {
                    report.duplicate_event_ids.push(rec.event_id.clone());
                }
            }
            if copies[i] > 1 {
                return; // order is judged on first copies
            }
            let mut key_hash = std::collections::hash_map::DefaultHasher::new();
            topic.hash(&mut key_hash);
            rec.key.hash(&mut key_hash);
            let key = key_hash.finish();
            let (seq, partition) = (rec.sequence.unwrap_or(i64::MIN), rec.partition);
            let violation = match last_by_key.get(&key) {
                Some((p, _)) if *p != partition => Some(format!(
                    "key {:?} in {topic} is in partitions {p} and {partition}",
                    rec.key
                )),
                Some((_, last)) if rec.sequence.is_some() && seq <= *last => Some(format!(
                    "key {:?} in {topic}: sequence {seq} at {partition}@{} after {last}",
                    rec.key, rec.offset
                )),
                _ => None,
            };
            if let Some(v) = violation {
                report.order_violations += 1;
                if report.order_violation_details.len() < options.max_examples {
                    report.order_violation_details.push(v);
                }
            }
            last_by_key.insert(key, (partition, seq));
        })?;
    }

    // 3. Missing rows, with their details from a second pass.
    let missing: Vec<u128> = ids
        .iter()
        .zip(&copies)
        .filter(|(f, n)| *f & 1 == 1 && **n == 0)
        .map(|(f, _)| *f & !1)
        .collect();
    report.missing = missing.len() as u64;
    report.missing_ids = EventIdSet::from_fingerprints(missing);
    if !report.missing_ids.is_empty() {
        let mut details = Vec::new();
        for_each_row(
            &client,
            config,
            options,
            since_ms,
            since_ms,
            until_ms,
            |r| {
                if details.len() < options.max_examples && report.missing_ids.contains(&r.event_id)
                {
                    details.push(MissingRow {
                        event_id: r.event_id,
                        aggregate_type: r.aggregate_type,
                        aggregate_id: r.aggregate_id,
                        aggregate_sequence: r.sequence,
                        topic: r.topic,
                        occurred_at: r.occurred_at,
                    });
                }
            },
        )
        .await?;
        report.missing_rows = details;
    }
    progress.finish();
    Ok(report)
}

/// What `audit --repair` did: the rows it republished, and the audit after.
#[derive(Debug)]
pub struct RepairOutcome {
    pub replayed: ReplayReport,
    pub after: AuditReport,
}

/// `audit --repair`: publishes every row `found` reports missing again (in
/// per-aggregate sequence order, through `replay` with the same window and
/// aggregate type), then audits the window again.
///
/// A republished event lands after the later events of its aggregate that
/// did arrive, so the audit after may report those keys out of order;
/// consumers that order by the `aggregate_sequence` header are unaffected.
pub async fn repair(
    config: &Config,
    options: &AuditOptions,
    found: &AuditReport,
) -> Result<RepairOutcome, AuditError> {
    let replayed = if found.missing_ids.is_empty() {
        ReplayReport::default()
    } else {
        let replay = ReplayOptions {
            since: found.window.0.clone(),
            until: Some(found.window.1.clone()),
            aggregate_type: options.aggregate_type.clone(),
            only: Some(found.missing_ids.clone()),
            ..ReplayOptions::default()
        };
        crate::pipeline::replay(config, &replay)
            .await
            .map_err(|e| match e {
                crate::pipeline::ReplayError::Pipeline(p) => AuditError::Pipeline(p),
                other => AuditError::Config(format!("replaying the missing rows: {other}")),
            })?
    };
    let after = run(
        config,
        &AuditOptions {
            since: found.window.0.clone(),
            until: Some(found.window.1.clone()),
            ..options.clone()
        },
    )
    .await?;
    Ok(RepairOutcome { replayed, after })
}

/// Streams the retained rows with `occurred_at` in `[from_ms, until_ms)`,
/// mapped as the connector maps them; `in_window` marks those at or after
/// `since_ms`.
async fn for_each_row(
    client: &Client,
    config: &Config,
    options: &AuditOptions,
    from_ms: i64,
    since_ms: i64,
    until_ms: i64,
    mut each: impl FnMut(Row),
) -> Result<(), AuditError> {
    let e = sql("reading the outbox rows");
    let retained = RetainedTable::load(client, config).await?;
    if !retained.has_column("occurred_at") {
        return Err(AuditError::Config(format!(
            "{} has no occurred_at column: the audit window cannot be chosen",
            retained.table
        )));
    }
    let (table, names) = (&retained.table, &retained.names);
    let type_filter = match &options.aggregate_type {
        Some(_) => format!(" AND o.{} = $3", quote_ident(&names.aggregate_type)),
        None => String::new(),
    };
    let query = format!(
        "SELECT {}, (extract(epoch FROM o.occurred_at) * 1000)::int8, o.occurred_at::text FROM {table} AS o \
         WHERE o.occurred_at >= to_timestamp($1::int8 / 1000.0) \
           AND o.occurred_at < to_timestamp($2::int8 / 1000.0){type_filter}",
        retained.select_list()
    );
    let kind = options.aggregate_type.clone().unwrap_or_default();
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = match &options.aggregate_type {
        Some(_) => vec![&from_ms, &until_ms, &kind],
        None => vec![&from_ms, &until_ms],
    };
    let rows = client.query_raw(&query, params).await.map_err(&e)?;
    pin_mut!(rows);
    let n = retained.columns.len();
    while let Some(row) = rows.next().await {
        let row = row.map_err(&e)?;
        let occurred_ms: i64 = row.try_get(n).map_err(&e)?;
        let occurred_at: String = row.try_get(n + 1).map_err(&e)?;
        let ctx = ChangeContext {
            lsn: Lsn::ZERO,
            commit_time: PgTimestamp::now(),
        };
        // A row the connector cannot map (poison) has no record to find.
        let Ok(event) = retained.map(&row, &ctx)? else {
            continue;
        };
        let sequence = names.aggregate_sequence.as_ref().and_then(|_| {
            event
                .headers
                .iter()
                .find(|(k, _)| k == "aggregate_sequence")
                .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
        });
        each(Row {
            event_id: event.event_id,
            topic: event.topic,
            aggregate_type: event.aggregate_type,
            aggregate_id: event.aggregate_id,
            sequence,
            occurred_at,
            in_window: occurred_ms >= since_ms,
        });
    }
    Ok(())
}

/// A Kafka consumer with the connection and security settings of `[kafka]`
/// (producer settings left out), reading committed records only.
fn consumer(config: &Config) -> Result<BaseConsumer, AuditError> {
    let mut client = crate::sink::read_committed_config(&config.kafka);
    client
        .set("group.id", "outbox-cdc-audit")
        .set("enable.partition.eof", "false")
        // librdkafka reads ahead up to 64 MiB a partition by default; the
        // audit reads one topic at a time and needs little buffered (without
        // a short backoff, a full queue slows fetching down by seconds).
        .set("queued.max.messages.kbytes", "8192")
        .set("queued.min.messages", "10000")
        .set("fetch.queue.backoff.ms", "10");
    client
        .create()
        .map_err(|e| AuditError::Kafka(format!("creating the audit consumer: {e}")))
}

struct Rec {
    event_id: String,
    key: Vec<u8>,
    sequence: Option<i64>,
    partition: i32,
    offset: i64,
    timestamp_ms: Option<i64>,
}

const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads `topic` from the first offset at or after `since_ms` to the end as
/// it is now, partition by partition.
fn read_topic(
    consumer: &BaseConsumer,
    topic: &str,
    since_ms: i64,
    mut each: impl FnMut(Rec),
) -> Result<(), AuditError> {
    let kafka = |what: &str, e: rdkafka::error::KafkaError| {
        AuditError::Kafka(format!("{what} of topic {topic:?}: {e}"))
    };
    let metadata = consumer
        .fetch_metadata(Some(topic), KAFKA_TIMEOUT)
        .map_err(|e| kafka("metadata", e))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut at_time = TopicPartitionList::new();
    for p in &partitions {
        at_time
            .add_partition_offset(topic, *p, Offset::Offset(since_ms))
            .map_err(|e| kafka("offsets", e))?;
    }
    let starts = consumer
        .offsets_for_times(at_time, KAFKA_TIMEOUT)
        .map_err(|e| kafka("offsets for the window's start", e))?;
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    for elem in starts.elements() {
        let (_, high) = consumer
            .fetch_watermarks(topic, elem.partition(), KAFKA_TIMEOUT)
            .map_err(|e| kafka("watermarks", e))?;
        let start = match elem.offset() {
            Offset::Offset(o) => o,
            _ => high, // nothing at or after the window's start
        };
        if start < high {
            ends.insert(elem.partition(), high);
            assignment
                .add_partition_offset(topic, elem.partition(), Offset::Offset(start))
                .map_err(|e| kafka("assignment", e))?;
        }
    }
    if ends.is_empty() {
        return Ok(());
    }
    consumer
        .assign(&assignment)
        .map_err(|e| kafka("assign", e))?;
    let mut idle_since = std::time::Instant::now();
    while !ends.is_empty() {
        // Transaction markers and aborted records (exactly-once delivery)
        // take offsets no record is read at: a partition is done when the
        // consumer's position has passed its end, whatever was last read.
        if let Ok(positions) = consumer.position() {
            for elem in positions.elements_for_topic(topic) {
                if let Offset::Offset(at) = elem.offset()
                    && ends.get(&elem.partition()).is_some_and(|end| at >= *end)
                {
                    ends.remove(&elem.partition());
                }
            }
            if ends.is_empty() {
                break;
            }
        }
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                idle_since = std::time::Instant::now();
                let partition = m.partition();
                let Some(&end) = ends.get(&partition) else {
                    continue;
                };
                if m.offset() >= end {
                    ends.remove(&partition);
                    continue;
                }
                let header = |name: &str| {
                    m.headers().and_then(|h| {
                        h.iter()
                            .find(|x| x.key == name)
                            .and_then(|x| x.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    })
                };
                each(Rec {
                    event_id: header("event_id").unwrap_or_default(),
                    key: m.key().map(<[u8]>::to_vec).unwrap_or_default(),
                    sequence: header("aggregate_sequence").and_then(|s| s.parse().ok()),
                    partition,
                    offset: m.offset(),
                    timestamp_ms: m.timestamp().to_millis(),
                });
                if m.offset() + 1 >= end {
                    ends.remove(&partition);
                }
            }
            Some(Err(e)) => return Err(kafka("reading", e)),
            None if idle_since.elapsed() > KAFKA_TIMEOUT => {
                return Err(AuditError::Kafka(format!(
                    "topic {topic:?}: no record for {KAFKA_TIMEOUT:?} before the end offsets {ends:?} \
                     (transaction markers or compaction can leave gaps; the records read so far are counted)"
                )));
            }
            None => {}
        }
    }
    consumer.unassign().map_err(|e| kafka("unassign", e))?;
    Ok(())
}
