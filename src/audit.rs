//! `outbox-cdc audit`: compares the retained outbox rows of a time window with
//! what Kafka holds, and answers "did we lose anything?".
//!
//! 1. The dead-letter topic (`outbox.dead_letter_topic`, when it exists) is
//!    read from its first offset to its end as it was then (`read_committed`):
//!    a poison event older than the window parks its aggregate as well.
//! 2. The rows with `occurred_at` in `[since, until)` (optionally of one
//!    aggregate type) are read as the connector maps them: event id, topic,
//!    aggregate, sequence. Rows from `repair.occurred_at_margin_ms` earlier
//!    are read too, but only to recognise their records (a transaction starts
//!    before it commits, and records carry the commit time).
//! 3. Every partition of every topic those rows route to is read with
//!    `isolation.level = read_committed`, from the first offset at or after
//!    `since` (by record timestamp) to the end as it was when the audit began.
//! 4. Findings: rows with no record in their topic but one on the dead-letter
//!    topic (dead-lettered: `on_poison = "dead-letter"` put them there; not a
//!    failure), rows with no record at all (missing; the exit status is
//!    non-zero), records in the window whose event id has no row (phantoms),
//!    event ids seen more than once (duplicates), and per key, first copies
//!    whose sequence does not increase or that sit in two partitions (order
//!    violations; non-zero exit). A missing row of an aggregate with a
//!    dead-lettered event that is not provably after it (at a lower or equal
//!    sequence, or a sequence unknown on either side) is also "held back":
//!    `--repair` does not publish it, since it would pass the poison event of
//!    a parked aggregate.
//!
//! Before anything is read, the slot is asked which rows it has provably
//! passed ([`crate::retained::passed_bound`]; with a running connector the
//! audit waits up to 15 s for it to confirm a snapshot taken then). A row
//! with no record whose transaction the slot has not passed is pending, not
//! missing: the connector will still send it, so `--repair` leaves it alone
//! (it would arrive twice). With no slot (or a lost one) nothing is pending.
//!
//! A row the connector cannot map (poison) has no record in a topic of its
//! own: it is counted (as a row, dead-lettered) only when its event id is on
//! the dead-letter topic.
//!
//! Memory stays bounded for large windows: event ids are kept as 127-bit
//! fingerprints (the low bit says whether the row is in the window) in a
//! sorted vector with a copy count each (18 bytes a row), per key only the
//! last sequence; the missing rows' details are read back in a second pass
//! over the table. Of the dead-letter topic, 16 bytes a record are kept, and
//! per parked aggregate its earliest dead-lettered event (a record without
//! the aggregate or sequence headers keeps its event id until its row is
//! read). The consumer's read-ahead is capped (8 MiB queued).

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
use crate::retained::{PassedBound, RetainedTable, passed_bound};

/// How long the audit waits for a running connector's slot to confirm the
/// snapshot it takes at its start (an idle connector confirms within a
/// second or two; a busy one may take longer, and its rows then count as
/// pending unless an older proof covers them).
const SLOT_WAIT: Duration = Duration::from_secs(15);

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

impl MissingRow {
    fn of(r: Row) -> MissingRow {
        MissingRow {
            event_id: r.event_id,
            aggregate_type: r.aggregate_type,
            aggregate_id: r.aggregate_id,
            aggregate_sequence: r.sequence,
            topic: r.topic,
            occurred_at: r.occurred_at,
        }
    }
}

/// A row whose record is on the dead-letter topic, not on its own topic.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeadLettered {
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub aggregate_sequence: Option<i64>,
    /// The topic the row maps to; empty for a row that cannot be mapped.
    pub topic: String,
    pub occurred_at: String,
}

/// A missing row that `--repair` leaves alone: its aggregate has a
/// dead-lettered event that is not provably after it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HeldBack {
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub aggregate_sequence: Option<i64>,
    /// The dead-lettered event it would pass.
    pub behind: String,
    pub reason: String,
}

impl HeldBack {
    fn new(row: &Row, behind: &str) -> HeldBack {
        let (t, id, ev) = (&row.aggregate_type, &row.aggregate_id, &row.event_id);
        HeldBack {
            event_id: ev.clone(),
            aggregate_type: t.clone(),
            aggregate_id: id.clone(),
            aggregate_sequence: row.sequence,
            behind: behind.to_owned(),
            reason: format!(
                "parked behind dead-lettered event {behind}: publishing it would pass that event. \
                 Deal with the dead-lettered events, `outbox-cdc release --config FILE {t} {id}`, \
                 then `outbox-cdc replay --aggregate-type {t} --aggregate-id {id} --since {ev}` \
                 publishes it in order"
            ),
        }
    }
}

/// The aggregates with events on the dead-letter topic, each with the
/// earliest of them by sequence (and one whose sequence is unknown, if any).
#[derive(Debug, Default)]
pub(crate) struct Parked {
    by_aggregate: HashMap<(String, String), ParkedBy>,
}

#[derive(Debug, Default)]
struct ParkedBy {
    lowest: Option<(i64, String)>,
    unknown: Option<String>,
}

impl Parked {
    /// A dead-lettered event of an aggregate, at `sequence` when known.
    pub(crate) fn add(
        &mut self,
        aggregate_type: &str,
        aggregate_id: &str,
        sequence: Option<i64>,
        event_id: &str,
    ) {
        let by = self
            .by_aggregate
            .entry((aggregate_type.to_owned(), aggregate_id.to_owned()))
            .or_default();
        match sequence {
            Some(s) if by.lowest.as_ref().is_none_or(|(low, _)| s < *low) => {
                by.lowest = Some((s, event_id.to_owned()));
            }
            Some(_) => {}
            None if by.unknown.is_none() => by.unknown = Some(event_id.to_owned()),
            None => {}
        }
    }

    /// The dead-lettered event that an event of this aggregate at `sequence`
    /// would pass if it were published now: one at a lower or equal sequence,
    /// or one of which either sequence is unknown (nothing proves the order).
    pub(crate) fn holding(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        sequence: Option<i64>,
    ) -> Option<&str> {
        let by = self
            .by_aggregate
            .get(&(aggregate_type.to_owned(), aggregate_id.to_owned()))?;
        match (&by.lowest, sequence) {
            (Some((low, event)), Some(s)) if *low <= s => return Some(event),
            (Some((_, event)), None) => return Some(event),
            _ => {}
        }
        by.unknown.as_deref()
    }
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
    /// What the slot has provably passed ([`PassedBound::describe`]).
    pub slot: String,
    /// Rows with no record that the slot has not passed yet: the connector
    /// will still send them (not a failure; never repaired).
    pub pending: u64,
    pub pending_rows: Vec<MissingRow>,
    /// `outbox.dead_letter_topic`, and how many records it held (all of
    /// them are read; 0 when the topic does not exist).
    pub dead_letter_topic: String,
    pub dead_letter_records: u64,
    /// Rows whose record is on the dead-letter topic only (not a failure).
    pub dead_lettered: u64,
    pub dead_lettered_rows: Vec<DeadLettered>,
    /// Missing rows that `--repair` does not publish: they are parked
    /// behind a dead-lettered event of their aggregate (counted in `missing` too).
    pub held_back: u64,
    pub held_back_rows: Vec<HeldBack>,
    pub phantoms: u64,
    pub phantom_records: Vec<Phantom>,
    pub duplicates: u64,
    pub duplicate_event_ids: Vec<String>,
    pub order_violations: u64,
    pub order_violation_details: Vec<String>,
    /// Every missing row's event id (the details above are only examples).
    #[serde(skip)]
    pub missing_ids: EventIdSet,
    /// Every held-back row's event id.
    #[serde(skip)]
    pub held_ids: EventIdSet,
    /// Every pending row's event id.
    #[serde(skip)]
    pending_ids: EventIdSet,
    /// The window in RFC 3339 (UTC), as `replay` takes it.
    #[serde(skip)]
    window: (String, String),
    /// The same window, in microseconds since 2000-01-01.
    #[serde(skip)]
    window_micros: (i64, i64),
}

impl AuditReport {
    /// The audited window, in microseconds since 2000-01-01.
    pub fn window_micros(&self) -> (i64, i64) {
        self.window_micros
    }

    /// Whether nothing that breaks the contract was found (dead-lettered
    /// rows, duplicates and phantoms are reported, but do not fail the audit).
    pub fn passed(&self) -> bool {
        self.missing == 0 && self.order_violations == 0
    }

    pub fn to_text(&self) -> String {
        let mut out = format!(
            "audit {} .. {}: {} rows, {} records in {} topic(s), {} in the dead-letter topic {}\n",
            self.since,
            self.until,
            self.rows,
            self.records,
            self.topics.len(),
            self.dead_letter_records,
            self.dead_letter_topic,
        );
        let counts = [
            ("missing", self.missing),
            ("pending (the slot has not passed them yet)", self.pending),
            ("dead-lettered", self.dead_lettered),
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
        if self.pending > 0 {
            out.push_str(&format!(
                "the slot has not passed {} row(s) without a record yet ({}): the connector will send \
                 them; audit again once it has caught up\n",
                self.pending, self.slot
            ));
        }
        for m in &self.pending_rows {
            out.push_str(&format!(
                "  pending {} ({}/{} seq {:?}, topic {}, occurred {})\n",
                m.event_id,
                m.aggregate_type,
                m.aggregate_id,
                m.aggregate_sequence,
                m.topic,
                m.occurred_at
            ));
        }
        if self.held_back > 0 {
            out.push_str(&format!(
                "held back from --repair (of the missing): {}\n",
                self.held_back
            ));
        }
        for h in &self.held_back_rows {
            out.push_str(&format!(
                "  held back {} ({}/{} seq {:?}): {}\n",
                h.event_id, h.aggregate_type, h.aggregate_id, h.aggregate_sequence, h.reason
            ));
        }
        for d in &self.dead_lettered_rows {
            let DeadLettered {
                event_id,
                aggregate_type: kind,
                aggregate_id: id,
                aggregate_sequence: seq,
                topic,
                occurred_at,
            } = d;
            let topic = match topic.is_empty() {
                true => "none: the row cannot be mapped",
                false => topic.as_str(),
            };
            out.push_str(&format!(
                "  dead-lettered {event_id} ({kind}/{id} seq {seq:?}, topic {topic}, occurred {occurred_at})\n"
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
    /// Whether the connector can map it; if not, `topic` is empty and the
    /// aggregate is what the mapping read before it failed.
    mapped: bool,
    topic: String,
    aggregate_type: String,
    aggregate_id: String,
    sequence: Option<i64>,
    occurred_at: String,
    in_window: bool,
    /// Whether the slot has provably passed the row's transaction.
    passed: bool,
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

    // Before any record is read: a row the slot passed was sent by then.
    let bound = match stored_break(config, report.window_micros) {
        Some(what) => PassedBound::NoSlot {
            why: format!(
                "a stored coverage break overlaps the window ({what}): the stream may skip its rows \
                 again, so every row counts"
            ),
        },
        None => passed_bound(&client, &config.postgres.slot, SLOT_WAIT).await?,
    };
    report.slot = bound.describe();

    let mut progress = Progress::new(options.progress);
    let consumer = consumer(config)?;

    // 1. The dead-letter topic, all of it: a poison event older than the
    // window parks its aggregate as well.
    let dlq_topic = config.outbox.dead_letter_topic.clone();
    report.dead_letter_topic = dlq_topic.clone();
    let mut dead_ids: Vec<u128> = Vec::new();
    let mut parked = Parked::default();
    // Records without the aggregate or sequence headers (an unmappable row's
    // record has no sequence): their row, if it is read, tells them.
    let mut unresolved: HashMap<u128, (Option<(String, String)>, String)> = HashMap::new();
    read_topic(&consumer, &dlq_topic, 0, |rec| {
        report.dead_letter_records += 1;
        progress.show(|| {
            format!(
                "audit: {} records read (dead-letter topic {dlq_topic})",
                report.dead_letter_records
            )
        });
        let label = match rec.event_id.is_empty() {
            true => format!(
                "(no event_id) at {dlq_topic}[{}]@{}",
                rec.partition, rec.offset
            ),
            false => rec.event_id.clone(),
        };
        match (rec.aggregate, rec.sequence) {
            (Some((t, id)), Some(seq)) => parked.add(&t, &id, Some(seq), &label),
            (Some((t, id)), None) if rec.event_id.is_empty() => parked.add(&t, &id, None, &label),
            (aggregate, _) if !rec.event_id.is_empty() => {
                let f = EventIdSet::fingerprint(&rec.event_id);
                unresolved.entry(f).or_insert((aggregate, label));
            }
            _ => {}
        }
        if !rec.event_id.is_empty() {
            dead_ids.push(EventIdSet::fingerprint(&rec.event_id));
        }
    })?;
    dead_ids.sort_unstable();
    dead_ids.dedup();
    let on_dlq = |f: u128| dead_ids.binary_search(&f).is_ok();

    // 2. The rows.
    // Fingerprint (low bit clear) | in-window flag.
    let mut ids: Vec<u128> = Vec::new();
    let mut topics: BTreeSet<String> = BTreeSet::new();
    // Rows of the window on the dead-letter topic (examples; a mappable one
    // counts only if its own topic has no copy).
    let mut dead_examples: Vec<(u128, DeadLettered)> = Vec::new();
    // Rows of the window the slot has not passed (16 bytes each).
    let mut not_passed: Vec<u128> = Vec::new();
    for_each_row(
        &client,
        config,
        options,
        &bound,
        since_ms - margin_ms,
        since_ms,
        until_ms,
        |r| {
            let f = EventIdSet::fingerprint(&r.event_id);
            let dead = on_dlq(f);
            if dead && let Some((aggregate, label)) = unresolved.remove(&f) {
                match (r.aggregate_type.is_empty(), aggregate) {
                    (false, _) => {
                        parked.add(&r.aggregate_type, &r.aggregate_id, r.sequence, &label)
                    }
                    (true, Some((t, id))) => parked.add(&t, &id, r.sequence, &label),
                    (true, None) => {}
                }
            }
            if r.in_window && (r.mapped || dead) {
                report.rows += 1;
            }
            progress.show(|| format!("audit: {} rows read", report.rows));
            if dead && r.in_window && dead_examples.len() < options.max_examples {
                dead_examples.push((
                    f | u128::from(r.mapped),
                    DeadLettered {
                        event_id: r.event_id.clone(),
                        aggregate_type: r.aggregate_type.clone(),
                        aggregate_id: r.aggregate_id.clone(),
                        aggregate_sequence: r.sequence,
                        topic: r.topic.clone(),
                        occurred_at: r.occurred_at.clone(),
                    },
                ));
            }
            if !r.mapped {
                // No record in a topic of its own; found only as dead-lettered.
                if dead && r.in_window {
                    report.dead_lettered += 1;
                }
                return;
            }
            topics.insert(r.topic.clone());
            if r.in_window && !r.passed {
                not_passed.push(f);
            }
            ids.push(f | u128::from(r.in_window));
        },
    )
    .await?;
    for (_, (aggregate, label)) in unresolved {
        if let Some((t, id)) = aggregate {
            parked.add(&t, &id, None, &label);
        }
    }
    ids.sort_unstable_by_key(|f| *f & !1);
    ids.dedup_by_key(|f| *f & !1);
    ids.shrink_to_fit();
    let mut copies: Vec<u16> = vec![0; ids.len()];
    report.topics = topics.iter().cloned().collect();

    // 3. The records.
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

    // 4. Rows with no record in their topic: dead-lettered, pending (the
    // slot has not passed them), or missing.
    not_passed.sort_unstable();
    let mut missing: Vec<u128> = Vec::new();
    let mut pending: Vec<u128> = Vec::new();
    for (f, n) in ids.iter().zip(&copies) {
        if *f & 1 == 0 || *n > 0 {
            continue;
        }
        let f = *f & !1;
        if on_dlq(f) {
            report.dead_lettered += 1;
        } else if not_passed.binary_search(&f).is_ok() {
            pending.push(f);
        } else {
            missing.push(f);
        }
    }
    drop(not_passed);
    let published = |f: u128| {
        ids.binary_search_by_key(&f, |x| *x & !1)
            .is_ok_and(|i| copies[i] > 0)
    };
    report.dead_lettered_rows = dead_examples
        .into_iter()
        .filter(|(f, _)| *f & 1 == 0 || !published(*f & !1))
        .map(|(_, d)| d)
        .collect();
    report.missing = missing.len() as u64;
    report.missing_ids = EventIdSet::from_fingerprints(missing);
    report.pending = pending.len() as u64;
    report.pending_ids = EventIdSet::from_fingerprints(pending);

    // 5. The missing rows' details, and which of them are parked behind a
    // dead-lettered event, from a second pass.
    if !report.missing_ids.is_empty() || !report.pending_ids.is_empty() {
        let mut details = Vec::new();
        let mut pending_details = Vec::new();
        let mut held: Vec<u128> = Vec::new();
        let mut held_rows = Vec::new();
        for_each_row(
            &client,
            config,
            options,
            &bound,
            since_ms,
            since_ms,
            until_ms,
            |r| {
                if !r.mapped || !r.in_window {
                    return;
                }
                if report.pending_ids.contains(&r.event_id) {
                    if pending_details.len() < options.max_examples {
                        pending_details.push(MissingRow::of(r));
                    }
                    return;
                }
                if !report.missing_ids.contains(&r.event_id) {
                    return;
                }
                if let Some(behind) = parked.holding(&r.aggregate_type, &r.aggregate_id, r.sequence)
                {
                    held.push(EventIdSet::fingerprint(&r.event_id));
                    if held_rows.len() < options.max_examples {
                        held_rows.push(HeldBack::new(&r, behind));
                    }
                }
                if details.len() < options.max_examples {
                    details.push(MissingRow::of(r));
                }
            },
        )
        .await?;
        report.missing_rows = details;
        report.pending_rows = pending_details;
        report.held_back = held.len() as u64;
        report.held_back_rows = held_rows;
        report.held_ids = EventIdSet::from_fingerprints(held);
    }
    progress.finish();
    Ok(report)
}

/// What `audit --repair` did: the rows it republished, those it left alone
/// (parked behind a dead-lettered event), and the audit after.
#[derive(Debug)]
pub struct RepairOutcome {
    pub replayed: ReplayReport,
    pub skipped: u64,
    pub skipped_rows: Vec<HeldBack>,
    pub after: AuditReport,
}

/// `audit --repair`: publishes every row `found` reports missing again (in
/// per-aggregate sequence order, through `replay` with the same window and
/// aggregate type), then audits the window again.
///
/// Never a held-back row (`found.held_ids`): its aggregate has a
/// dead-lettered event that it would pass, and is parked until `release`.
/// Dead-lettered rows are not missing, so they are never republished either.
///
/// A republished event lands after the later events of its aggregate that
/// did arrive, so the audit after may report those keys out of order;
/// consumers that order by the `aggregate_sequence` header are unaffected.
pub async fn repair(
    config: &Config,
    options: &AuditOptions,
    found: &AuditReport,
) -> Result<RepairOutcome, AuditError> {
    let to_publish = found.missing_ids.without(&found.held_ids);
    let replayed = if to_publish.is_empty() {
        ReplayReport::default()
    } else {
        let replay = ReplayOptions {
            since: found.window.0.clone(),
            until: Some(found.window.1.clone()),
            aggregate_type: options.aggregate_type.clone(),
            only: Some(to_publish),
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
    Ok(RepairOutcome {
        replayed,
        skipped: found.held_back,
        skipped_rows: found.held_back_rows.clone(),
        after,
    })
}

/// A coverage break stored for the slot (by a connector that stopped on it)
/// that overlaps `(since, until)` (microseconds), widened by the repair
/// margin as the start's refusal widens it. The stream is not trusted over
/// such a window: a row the slot has not passed would be skipped again. A
/// store that a running connector holds has none (it started, so it had
/// none or its live witness repaired them).
fn stored_break(config: &Config, (since, until): (i64, i64)) -> Option<String> {
    if !config.offsets.path.exists() {
        return None;
    }
    let store = crate::checkpoint::OffsetStore::open(&config.offsets.path).ok()?;
    let record = store.coverage(&config.postgres.slot).ok()??;
    let margin = (config.repair.occurred_at_margin_ms as i64).saturating_mul(1000);
    record
        .breaks
        .iter()
        .find(|b| {
            b.since_micros.saturating_sub(margin) < until
                && b.until_micros.saturating_add(margin) >= since
        })
        .map(|b| b.what.clone())
}

/// Streams the retained rows with `occurred_at` in `[from_ms, until_ms)`,
/// mapped as the connector maps them; `in_window` marks those at or after
/// `since_ms`, `passed` those the slot has passed (by `bound`).
#[allow(clippy::too_many_arguments)]
async fn for_each_row(
    client: &Client,
    config: &Config,
    options: &AuditOptions,
    bound: &PassedBound,
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
        "SELECT {}, (extract(epoch FROM o.occurred_at) * 1000)::int8, o.occurred_at::text, {} FROM {table} AS o \
         WHERE o.occurred_at >= to_timestamp($1::int8 / 1000.0) \
           AND o.occurred_at < to_timestamp($2::int8 / 1000.0){type_filter}",
        retained.select_list(),
        bound.sql()
    );
    let kind = options.aggregate_type.clone().unwrap_or_default();
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = match &options.aggregate_type {
        Some(_) => vec![&from_ms, &until_ms, &kind],
        None => vec![&from_ms, &until_ms],
    };
    let rows = client.query_raw(&query, params).await.map_err(&e)?;
    pin_mut!(rows);
    let n = retained.columns.len();
    let sequence_at = names
        .aggregate_sequence
        .as_ref()
        .and_then(|s| retained.columns.iter().position(|(c, _)| c == s));
    while let Some(row) = rows.next().await {
        let row = row.map_err(&e)?;
        let occurred_ms: i64 = row.try_get(n).map_err(&e)?;
        let occurred_at: String = row.try_get(n + 1).map_err(&e)?;
        let passed: bool = row.try_get(n + 2).map_err(&e)?;
        let ctx = ChangeContext {
            lsn: Lsn::ZERO,
            commit_time: PgTimestamp::now(),
        };
        let event = match retained.map(&row, &ctx)? {
            Ok(event) => event,
            // A row the connector cannot map (poison) has no record in a
            // topic of its own; with `on_poison = "dead-letter"` it has one
            // on the dead-letter topic, under its event id.
            Err(poison) => {
                let Some(event_id) = poison.event_id() else {
                    continue;
                };
                let (t, id) = poison.aggregate().unwrap_or_default();
                let sequence = sequence_at.and_then(|i| {
                    row.try_get::<_, Option<String>>(i)
                        .ok()
                        .flatten()?
                        .parse()
                        .ok()
                });
                each(Row {
                    event_id: event_id.to_owned(),
                    mapped: false,
                    topic: String::new(),
                    aggregate_type: t.to_owned(),
                    aggregate_id: id.to_owned(),
                    sequence,
                    occurred_at,
                    in_window: occurred_ms >= since_ms,
                    passed,
                });
                continue;
            }
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
            mapped: true,
            topic: event.topic,
            aggregate_type: event.aggregate_type,
            aggregate_id: event.aggregate_id,
            sequence,
            occurred_at,
            in_window: occurred_ms >= since_ms,
            passed,
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
    /// `aggregate_type` and `aggregate_id` headers, when both are there.
    aggregate: Option<(String, String)>,
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
    for t in metadata.topics() {
        match t.error() {
            None => {}
            Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
                return Ok(()); // no such topic: nothing to read
            }
            Some(e) => {
                return Err(AuditError::Kafka(format!(
                    "metadata of topic {topic:?}: {:?}",
                    rdkafka::error::RDKafkaErrorCode::from(e)
                )));
            }
        }
    }
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
                    aggregate: header("aggregate_type").zip(header("aggregate_id")),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_event_is_held_behind_a_dead_lettered_one_unless_provably_before_it() {
        let mut parked = Parked::default();
        parked.add("order", "a1", Some(5), "e5");
        parked.add("order", "a1", Some(3), "e3");
        parked.add("order", "a1", Some(7), "e7");
        // The earliest dead-lettered event is named; equal counts as behind.
        assert_eq!(parked.holding("order", "a1", Some(3)), Some("e3"));
        assert_eq!(parked.holding("order", "a1", Some(9)), Some("e3"));
        assert_eq!(parked.holding("order", "a1", Some(2)), None);
        // Without the row's sequence nothing proves it came first.
        assert_eq!(parked.holding("order", "a1", None), Some("e3"));
        // Other aggregates (same id, other type too) are not parked.
        assert_eq!(parked.holding("order", "a2", Some(1)), None);
        assert_eq!(parked.holding("invoice", "a1", Some(9)), None);
    }

    #[test]
    fn a_dead_lettered_event_of_unknown_sequence_holds_its_whole_aggregate() {
        let mut parked = Parked::default();
        parked.add("order", "a1", None, "poison");
        assert_eq!(parked.holding("order", "a1", Some(1)), Some("poison"));
        assert_eq!(parked.holding("order", "a1", None), Some("poison"));
        parked.add("order", "a1", Some(4), "e4");
        assert_eq!(parked.holding("order", "a1", Some(5)), Some("e4"));
        assert_eq!(parked.holding("order", "a1", Some(1)), Some("poison"));
    }

    #[test]
    fn event_id_sets_subtract() {
        let all =
            EventIdSet::from_fingerprints(["a", "b", "c"].map(EventIdSet::fingerprint).to_vec());
        let held = EventIdSet::from_fingerprints(vec![EventIdSet::fingerprint("b")]);
        let rest = all.without(&held);
        assert_eq!(rest.len(), 2);
        assert!(rest.contains("a") && rest.contains("c") && !rest.contains("b"));
    }
}
