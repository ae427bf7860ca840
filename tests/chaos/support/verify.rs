//! Reading everything back and checking the four invariants of the seed:
//!
//! 1. every committed business change has exactly one outbox row, every
//!    rolled-back one none (writer's ledger against the tables);
//! 2. every outbox row was published at least once (all topics read from the
//!    beginning by a fresh reader);
//! 3. the consumer's effect happened exactly once per event (effects table,
//!    which has no unique key, counted per event id);
//! 4. per aggregate, first deliveries arrive in increasing sequence within one
//!    partition; and duplicates are counted and must each straddle a crash or
//!    outage boundary (the in-flight window), never sit within one session,
//!    and be of a transaction that ended after the offset acknowledged when
//!    the last such boundary before the later copy began (or, across a gap
//!    repair, within the repair's own rule).
//!
//! With `[delivery] mode = "exactly-once"` ([`Delivery::ExactlyOnce`]) the
//! reader, a `read_committed` consumer like any application's, must see each
//! event exactly once: any duplicate is a violation, whatever crash preceded it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use outbox_cdc::pg::Lsn;

use super::schema::Names;
use super::workload::{Outcome, TxRecord};

pub type Tp = (String, i32);

/// One record as the fresh reader saw it.
#[derive(Debug, Clone)]
pub struct Rec {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub event_id: String,
    pub sequence: i64,
    pub lsn: String,
    /// Published from the table by the live witness (`repaired_by`), not
    /// from the stream.
    pub repaired: bool,
    /// Its insert was skipped by the connector's sabotage in some session
    /// (the harness sets it from the connector's log): whatever publishes
    /// it (the witness, a later session, a slot repair) may come after
    /// later events of its aggregate.
    pub skipped: bool,
}

impl Rec {
    fn place(&self) -> String {
        format!(
            "{}[{}]@{} lsn {}",
            self.topic, self.partition, self.offset, self.lsn
        )
    }
}

/// Reads the run's topics from the beginning, incrementally, as a
/// `read_committed` consumer: the records of aborted Kafka transactions
/// (exactly-once mode) are skipped, as an application's consumer skips them.
///
/// A transactional topic also holds commit and abort markers: each takes an
/// offset and is never returned to a consumer, and a read_committed consumer
/// can read only up to the last stable offset (the first offset of the oldest
/// open transaction), not up to the high watermark. So the ends are asked
/// with the same isolation level (the broker then answers the last stable
/// offset), and how far the reader got is the consumer's position, which
/// moves past the markers and aborted records it skipped, never "the last
/// record's offset + 1": a partition whose last entry is a marker would
/// never look read. Without transactions both are the same as before.
pub struct KafkaReader {
    consumer: BaseConsumer,
    /// Metadata and end offsets come from this client, never from `consumer`:
    /// metadata requests on a consumer that is fetching stalled its fetches
    /// (librdkafka 2.12, see tests/common/relay.rs `read_records`).
    meta: BaseConsumer,
    prefix: String,
    next: BTreeMap<Tp, i64>,
    pub records: Vec<Rec>,
    pub malformed: Vec<String>,
}

impl KafkaReader {
    pub fn new(bootstrap: &str, prefix: &str) -> KafkaReader {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", super::unique_name("chaos_reader"))
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .create()
            .expect("create the verification reader");
        let meta: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("allow.auto.create.topics", "false")
            // The ends it answers are then the last stable offsets (librdkafka
            // sends its isolation level in ListOffsets).
            .set("isolation.level", "read_committed")
            .create()
            .expect("create the verification reader's metadata client");
        KafkaReader {
            consumer,
            meta,
            prefix: format!("{prefix}."),
            next: BTreeMap::new(),
            records: Vec::new(),
            malformed: Vec::new(),
        }
    }

    /// End of every partition of the run's topics for a read_committed
    /// reader: the last stable offset, which is the high watermark while no
    /// Kafka transaction is open (always, in at-least-once mode).
    pub fn watermarks(&self, timeout: Duration) -> Result<BTreeMap<Tp, i64>, String> {
        let md = self
            .meta
            .fetch_metadata(None, timeout)
            .map_err(|e| format!("metadata: {e}"))?;
        let mut out = BTreeMap::new();
        for t in md
            .topics()
            .iter()
            .filter(|t| t.name().starts_with(&self.prefix))
        {
            for p in t.partitions() {
                let (_, high) = self
                    .meta
                    .fetch_watermarks(t.name(), p.id(), timeout)
                    .map_err(|e| format!("watermarks of {}[{}]: {e}", t.name(), p.id()))?;
                out.insert((t.name().to_owned(), p.id()), high);
            }
        }
        Ok(out)
    }

    /// Reads up to the current end (see [`KafkaReader::watermarks`]) of every partition.
    pub fn catch_up(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let ends = self.watermarks(Duration::from_secs(10))?;
        let behind = |next: &BTreeMap<Tp, i64>| {
            ends.iter()
                .any(|(tp, end)| next.get(tp).copied().unwrap_or(0) < *end)
        };
        if !behind(&self.next) {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for tp in ends.keys() {
            let at = self.next.get(tp).copied().unwrap_or(0);
            tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(at))
                .map_err(|e| format!("assign {}[{}]: {e}", tp.0, tp.1))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| format!("assign: {e}"))?;
        while behind(&self.next) {
            if Instant::now() > deadline {
                return Err(format!(
                    "reader did not reach the end offsets {ends:?} within {timeout:?} (at {:?})",
                    self.next
                ));
            }
            if let Some(Ok(m)) = self.consumer.poll(Duration::from_millis(200)) {
                {
                    let tp = (m.topic().to_owned(), m.partition());
                    let next = self.next.entry(tp).or_insert(0);
                    *next = (*next).max(m.offset() + 1);
                    let header = |name: &str| {
                        m.headers()
                            .and_then(|h| h.iter().find(|x| x.key == name).and_then(|x| x.value))
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    };
                    let rec = Rec {
                        topic: m.topic().to_owned(),
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m
                            .key()
                            .map(|k| String::from_utf8_lossy(k).into_owned())
                            .unwrap_or_default(),
                        event_id: header("event_id").unwrap_or_default(),
                        sequence: header("aggregate_sequence")
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(-1),
                        lsn: header("lsn").unwrap_or_default(),
                        repaired: header(outbox_cdc::retained::H_REPAIRED).as_deref()
                            == Some("witness"),
                        skipped: false,
                    };
                    if rec.event_id.is_empty() || rec.sequence < 0 {
                        self.malformed.push(rec.place());
                    }
                    self.records.push(rec);
                }
            }
            self.follow_position()?;
        }
        Ok(())
    }

    /// Moves `next` up to the consumer's position: past the transaction
    /// markers and aborted records that a poll consumed without returning.
    fn follow_position(&mut self) -> Result<(), String> {
        let position = self
            .consumer
            .position()
            .map_err(|e| format!("the reader's position: {e}"))?;
        for e in position.elements() {
            if let Offset::Offset(at) = e.offset() {
                let next = self
                    .next
                    .entry((e.topic().to_owned(), e.partition()))
                    .or_insert(0);
                *next = (*next).max(at);
            }
        }
        Ok(())
    }

    pub fn distinct_event_ids(&self) -> HashSet<&str> {
        self.records.iter().map(|r| r.event_id.as_str()).collect()
    }
}

/// One outbox row as stored.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub line_id: Option<String>,
}

/// What the database holds at the end.
pub struct DbState {
    pub outbox: Vec<OutboxRow>,
    pub lines: HashSet<String>,
    /// Effect rows per event id (no unique key: a double effect is a count of 2).
    pub effects: HashMap<String, u64>,
    pub inbox: HashSet<String>,
}

impl DbState {
    pub async fn read(client: &tokio_postgres::Client, names: &Names) -> DbState {
        let q = |sql: String| async move {
            client
                .query(&sql, &[])
                .await
                .unwrap_or_else(|e| panic!("verification query failed: {sql}: {e}"))
        };
        let outbox = q(format!(
            "SELECT event_id::text, aggregate_type, aggregate_id, aggregate_sequence, payload->>'line_id' FROM public.{}",
            names.outbox
        ))
        .await
        .iter()
        .map(|r| OutboxRow {
            event_id: r.get(0),
            aggregate_type: r.get(1),
            aggregate_id: r.get(2),
            sequence: r.get(3),
            line_id: r.get(4),
        })
        .collect();
        let lines = q(format!("SELECT line_id FROM public.{}", names.lines))
            .await
            .iter()
            .map(|r| r.get(0))
            .collect();
        let effects = q(format!(
            "SELECT event_id::text, count(*) FROM public.{} GROUP BY 1",
            names.effects
        ))
        .await
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        .collect();
        let inbox = q(format!(
            "SELECT event_id::text FROM public.{} WHERE consumer_name = '{}'",
            names.inbox, names.consumer_name
        ))
        .await
        .iter()
        .map(|r| r.get(0))
        .collect();
        DbState {
            outbox,
            lines,
            effects,
            inbox,
        }
    }
}

/// The delivery contract the run holds the connector to (`[delivery] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// A duplicate must straddle a crash or outage, and its transaction must
    /// have ended after the offset acknowledged when the last of them before
    /// the later copy began.
    AtLeastOnce,
    /// No duplicate at all among the committed records (read_committed).
    ExactlyOnce,
}

/// Findings; every list holds printable details of one violation each.
#[derive(Debug, Default)]
pub struct Verdict {
    pub events: usize,
    pub records: usize,
    pub duplicates: usize,
    pub committed_txs: usize,
    pub rolled_back_txs: usize,
    pub failed_txs: usize,
    pub unknown_committed: usize,
    pub unknown_rolled_back: usize,
    /// Invariant 1 (ledger against tables).
    pub outbox_mismatches: Vec<String>,
    /// Invariant 2.
    pub lost: Vec<String>,
    /// Published but never committed (invariant 1 seen from Kafka).
    pub phantoms: Vec<String>,
    /// Invariant 3.
    pub double_effects: Vec<String>,
    pub missing_effects: Vec<String>,
    /// Invariant 4.
    pub order_violations: Vec<String>,
    /// Events first published by the live witness.
    pub repaired: usize,
    /// Events the live witness published that the stream did not skip (a
    /// false positive, or a skip nobody planned).
    pub false_repairs: Vec<String>,
    /// Events the stream skipped (sabotage) arrive after later events of
    /// their aggregate: they are left out of the order check, listed here
    /// when they did.
    pub repaired_late: Vec<String>,
    pub unexplained_duplicates: Vec<String>,
    /// Duplicates across a crash or outage of transactions whose end the
    /// writer could not read (COMMIT's reply lost): not bounded.
    pub unbounded_duplicates: usize,
    /// Invariant 4 under [`Delivery::ExactlyOnce`]: every event read twice.
    pub exactly_once_duplicates: Vec<String>,
    pub malformed: Vec<String>,
    /// The connector's progress, checked by the harness: the stored offset
    /// and the slot after each crash, and catching up while idle.
    pub progress: Vec<String>,
}

impl Verdict {
    pub fn soak_line(&self, cycles: u64) -> String {
        format!(
            "soak: cycles={cycles} events={} duplicates={} lost={} order_violations={} double_effects={}",
            self.events,
            self.duplicates,
            self.lost.len(),
            self.order_violations.len(),
            self.double_effects.len()
        )
    }

    pub fn is_clean(&self) -> bool {
        self.violations().iter().all(|(_, v)| v.is_empty())
    }

    pub fn violations(&self) -> Vec<(&'static str, &Vec<String>)> {
        vec![
            (
                "outbox rows not matching the committed business changes",
                &self.outbox_mismatches,
            ),
            ("committed events never published (lost)", &self.lost),
            ("published events that were never committed", &self.phantoms),
            (
                "events whose effect was applied more than once",
                &self.double_effects,
            ),
            (
                "events whose effect was never applied",
                &self.missing_effects,
            ),
            ("per-aggregate order violations", &self.order_violations),
            (
                "events the live witness published although the stream did not skip them",
                &self.false_repairs,
            ),
            (
                "duplicates outside any crash/outage window",
                &self.unexplained_duplicates,
            ),
            (
                "events read more than once although delivery is exactly-once (read_committed)",
                &self.exactly_once_duplicates,
            ),
            (
                "records without event_id/aggregate_sequence headers",
                &self.malformed,
            ),
            (
                "offset and slot progress violations (stored offset went back, vanished or never \
                 moved, slot confirmed beyond it, no catch-up while idle)",
                &self.progress,
            ),
        ]
    }

    pub fn details(&self) -> String {
        let mut out = String::new();
        for (what, list) in self.violations() {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(out, "{} {what}:", list.len());
            for line in list.iter().take(25) {
                let _ = writeln!(out, "  {line}");
            }
            if list.len() > 25 {
                let _ = writeln!(out, "  ... and {} more", list.len() - 25);
            }
        }
        out
    }
}

/// Marks unknown commits as committed or not from the tables.
fn resolve(tx: &TxRecord, db: &DbState, v: &mut Verdict) -> bool {
    match &tx.outcome {
        Outcome::Committed => {
            v.committed_txs += 1;
            true
        }
        Outcome::RolledBack => {
            v.rolled_back_txs += 1;
            false
        }
        Outcome::Failed(_) => {
            v.failed_txs += 1;
            false
        }
        Outcome::Unknown(why) => {
            let present = tx
                .lines
                .iter()
                .filter(|l| db.lines.contains(&l.line_id))
                .count();
            if present != 0 && present != tx.lines.len() {
                v.outbox_mismatches.push(format!(
                    "writer {} tx {} (commit reply lost: {why}): {present} of {} lines exist: a torn transaction",
                    tx.writer,
                    tx.number,
                    tx.lines.len()
                ));
            }
            if present > 0 {
                v.unknown_committed += 1;
            } else {
                v.unknown_rolled_back += 1;
            }
            present > 0
        }
    }
}

/// A crash or an outage: the partitions' end offsets when it began and when
/// it was over, and the offset acknowledged when it began.
#[derive(Debug, Clone)]
pub struct Window {
    /// What happened, for the findings.
    pub what: String,
    /// Read after `stored` (a connector's death: after it died; an outage:
    /// before it starts).
    pub before: BTreeMap<Tp, i64>,
    /// Read when nothing more of the broken session can be appended (a
    /// connector's death: just before anything else may append).
    pub after: BTreeMap<Tp, i64>,
    /// The connector's acknowledged (durably stored) offset when the window
    /// began: stored at its death, or from the running connector's
    /// `/metrics` (or its store) at an outage's start. Every session after
    /// it resumes at or after it, and one already running had not
    /// acknowledged a copy it appended after `before`, so a transaction that
    /// ended at or before it must not be sent again after this window.
    /// `None`: the store could not be read (itself a progress violation).
    pub stored: Option<Lsn>,
    /// The events a gap repair in this window publishes again by its own
    /// rule (committed since the acknowledged commit time minus its margin),
    /// whatever their transaction's end: the contract's wider window there.
    pub republished: HashSet<String>,
}

impl Window {
    /// Whether it began at or before offset `at` of `tp`: a copy at `at` was
    /// appended after the window's start (no end: the topic did not exist yet).
    fn began_by(&self, tp: &Tp, at: i64) -> bool {
        self.before.get(tp).copied().unwrap_or(0) <= at
    }

    /// Whether a copy at offset `at` of `tp` was in the log by its end.
    fn ended_after(&self, tp: &Tp, at: i64) -> bool {
        self.after.get(tp).is_some_and(|&end| at < end)
    }

    /// Whether transaction `end` (its `ended_by`) of event `id` may be sent
    /// again after this window.
    fn allows(&self, id: &str, end: Lsn) -> bool {
        match self.stored {
            Some(stored) => end > stored || self.republished.contains(id),
            None => true,
        }
    }
}

/// `windows`: every crash and outage of the run, in the order they began;
/// under [`Delivery::AtLeastOnce`] a duplicate must straddle one and is
/// judged by the last one before its later copy, under
/// [`Delivery::ExactlyOnce`] none may exist.
pub fn verify(
    ledger: &[TxRecord],
    db: &DbState,
    records: &[Rec],
    windows: &[Window],
    delivery: Delivery,
) -> Verdict {
    let mut v = Verdict::default();

    // 1. Ledger against tables.
    let mut rows_by_line: HashMap<&str, Vec<&OutboxRow>> = HashMap::new();
    for row in &db.outbox {
        match row.line_id.as_deref() {
            Some(l) => rows_by_line.entry(l).or_default().push(row),
            None => v
                .outbox_mismatches
                .push(format!("outbox row {} has no line_id", row.event_id)),
        }
    }
    let mut known_lines = HashSet::new();
    for tx in ledger {
        let committed = resolve(tx, db, &mut v);
        for line in &tx.lines {
            known_lines.insert(line.line_id.as_str());
            let rows = rows_by_line
                .get(line.line_id.as_str())
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let has_line = db.lines.contains(&line.line_id);
            if committed {
                if !has_line {
                    v.outbox_mismatches.push(format!(
                        "committed line {} (writer {} tx {}) is missing",
                        line.line_id, tx.writer, tx.number
                    ));
                }
                match rows {
                    [row]
                        if row.event_id == line.event_id
                            && row.sequence == line.aggregate_sequence => {}
                    _ => v.outbox_mismatches.push(format!(
                        "committed line {} (event {}, {} seq {}) has {} outbox rows: {:?}",
                        line.line_id,
                        line.event_id,
                        tx.aggregate_id,
                        line.aggregate_sequence,
                        rows.len(),
                        rows.iter()
                            .map(|r| (&r.event_id, r.sequence))
                            .collect::<Vec<_>>()
                    )),
                }
            } else if has_line || !rows.is_empty() {
                v.outbox_mismatches.push(format!(
                    "line {} of a transaction that did not commit ({:?}) exists: line row {has_line}, {} outbox rows",
                    line.line_id,
                    tx.outcome,
                    rows.len()
                ));
            }
        }
    }
    for row in &db.outbox {
        if let Some(l) = row.line_id.as_deref()
            && !known_lines.contains(l)
        {
            v.outbox_mismatches.push(format!(
                "outbox row {} for line {l}, which no writer wrote",
                row.event_id
            ));
        }
    }

    // 2. Published at least once.
    let committed: HashMap<&str, &OutboxRow> =
        db.outbox.iter().map(|r| (r.event_id.as_str(), r)).collect();
    v.events = committed.len();
    v.records = records.len();
    let mut copies: HashMap<&str, Vec<&Rec>> = HashMap::new();
    for r in records {
        copies.entry(r.event_id.as_str()).or_default().push(r);
    }
    v.duplicates = records.len() - copies.len();
    let partitions_of: HashMap<&str, BTreeSet<i32>> =
        records.iter().fold(HashMap::new(), |mut m, r| {
            m.entry(r.topic.as_str()).or_default().insert(r.partition);
            m
        });
    for (id, row) in &committed {
        if !copies.contains_key(id) {
            let topic_hint = partitions_of
                .iter()
                .find(|(t, _)| t.ends_with(&format!(".{}", row.aggregate_type)))
                .map(|(t, ps)| {
                    let n = ps.iter().max().map_or(1, |m| m + 1);
                    format!(
                        "{t}[{}]",
                        outbox_cdc::sink::java_partition(row.aggregate_id.as_bytes(), n)
                    )
                })
                .unwrap_or_else(|| "no topic yet".into());
            v.lost.push(format!(
                "event {id}: {} {} seq {} line {:?}, expected in {topic_hint}",
                row.aggregate_type, row.aggregate_id, row.sequence, row.line_id
            ));
        }
    }
    for (id, recs) in &copies {
        if !committed.contains_key(id) {
            v.phantoms.push(format!(
                "event {id} at {}",
                recs.iter()
                    .map(|r| r.place())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        } else if let Some(r) = recs.iter().find(|r| r.sequence != committed[id].sequence) {
            v.order_violations.push(format!(
                "event {id} carries sequence {} at {}, stored {}",
                r.sequence,
                r.place(),
                committed[id].sequence
            ));
        }
    }

    // 4a. Duplicates only across crash/outage boundaries, and only of
    // transactions that ended after the offset stored at that crash; none at
    // all under exactly-once delivery.
    let ended_by: HashMap<&str, Lsn> = ledger
        .iter()
        .filter_map(|tx| tx.ended_by.map(|end| (tx, end)))
        .flat_map(|(tx, end)| tx.lines.iter().map(move |l| (l.event_id.as_str(), end)))
        .collect();
    for (id, recs) in &copies {
        let mut recs: Vec<&&Rec> = recs.iter().collect();
        recs.sort_by_key(|r| (r.partition, r.offset));
        if delivery == Delivery::ExactlyOnce && recs.len() > 1 {
            v.exactly_once_duplicates.push(format!(
                "event {id}: {} copies, at {}",
                recs.len(),
                recs.iter()
                    .map(|r| r.place())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for pair in recs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if a.topic != b.topic || a.partition != b.partition {
                v.order_violations.push(format!(
                    "event {id} published to two partitions: {} and {}",
                    a.place(),
                    b.place()
                ));
                continue;
            }
            if delivery == Delivery::ExactlyOnce {
                continue; // listed above: no crash excuses it
            }
            // The later copy comes from the session that followed the last
            // window begun before it was appended (or from one already
            // running then): that window's acknowledged offset bounds it,
            // however lenient an earlier window was (as tests/it/pipeline.rs
            // kill_9 does with its kills).
            let tp = (a.topic.clone(), a.partition);
            let last = windows.iter().rposition(|w| w.began_by(&tp, b.offset));
            let end = ended_by.get(&**id).copied();
            match last.map(|i| &windows[i]) {
                Some(w) if w.ended_after(&tp, a.offset) => match end {
                    // Published again by the live witness, whose progress is
                    // its own position, stored after it publishes (not the
                    // acknowledged offset): a crash between the two makes
                    // the next process publish the row once more.
                    _ if b.repaired => {}
                    Some(end) if !w.allows(id, end) => {
                        v.unexplained_duplicates.push(format!(
                            "event {id}: copies at {} and {}, but its transaction ended by {end}, at or \
                             before the offset acknowledged before {}, the last crash or outage \
                             before the later copy: it was acknowledged and must not be sent again",
                            a.place(),
                            b.place(),
                            w.what
                        ));
                    }
                    Some(_) => {}
                    // An outcome the writer could not see (COMMIT's reply
                    // lost) or an end it could not read: not bounded.
                    None => v.unbounded_duplicates += 1,
                },
                Some(w) => v.unexplained_duplicates.push(format!(
                    "event {id}: copies at {} and {} with no crash in between (the last crash or \
                     outage before the later copy, {}, was over at {:?} of this partition)",
                    a.place(),
                    b.place(),
                    w.what,
                    w.after.get(&tp)
                )),
                None => v.unexplained_duplicates.push(format!(
                    "event {id}: copies at {} and {} with no crash in between",
                    a.place(),
                    b.place()
                )),
            }
        }
    }

    // 4b. Per aggregate, first deliveries in increasing sequence in one partition.
    let mut first: HashMap<&str, &Rec> = HashMap::new();
    for r in records {
        first
            .entry(r.event_id.as_str())
            .and_modify(|f| {
                if (r.partition, r.offset) < (f.partition, f.offset) {
                    *f = r;
                }
            })
            .or_insert(r);
    }
    let mut by_aggregate: BTreeMap<(&str, &str), Vec<&Rec>> = BTreeMap::new();
    for r in first.values() {
        by_aggregate
            .entry((r.topic.as_str(), r.key.as_str()))
            .or_default()
            .push(r);
    }
    let mut falsely: BTreeSet<&str> = BTreeSet::new();
    for r in records.iter().filter(|r| r.repaired && !r.skipped) {
        if falsely.insert(r.event_id.as_str()) {
            v.false_repairs.push(format!(
                "event {} (seq {}) published by the live witness at {}, though the stream did not skip it",
                r.event_id,
                r.sequence,
                r.place()
            ));
        }
    }
    v.repaired = records
        .iter()
        .filter(|r| r.repaired)
        .map(|r| r.event_id.as_str())
        .collect::<HashSet<_>>()
        .len();
    for ((topic, key), mut recs) in by_aggregate {
        let parts: BTreeSet<i32> = recs.iter().map(|r| r.partition).collect();
        if parts.len() > 1 {
            v.order_violations.push(format!(
                "aggregate {key} in {topic} spread over partitions {parts:?}"
            ));
            continue;
        }
        recs.sort_by_key(|r| r.offset);
        let skipped = |r: &&Rec| r.repaired || r.skipped;
        for (i, late) in recs.iter().enumerate().filter(|(_, r)| skipped(r)) {
            if let Some(passed) = recs[..i].iter().find(|r| r.sequence > late.sequence) {
                v.repaired_late.push(format!(
                    "aggregate {key}: seq {} (event {}, skipped by the stream{}) at {}, after seq {} at {}",
                    late.sequence,
                    late.event_id,
                    if late.repaired { ", published by the witness" } else { "" },
                    late.place(),
                    passed.sequence,
                    passed.place()
                ));
            }
        }
        recs.retain(|r| !skipped(r));
        for pair in recs.windows(2) {
            if pair[0].sequence >= pair[1].sequence {
                v.order_violations.push(format!(
                    "aggregate {key}: seq {} (event {} at {}) before seq {} (event {} at {})",
                    pair[0].sequence,
                    pair[0].event_id,
                    pair[0].place(),
                    pair[1].sequence,
                    pair[1].event_id,
                    pair[1].place()
                ));
            }
        }
    }

    // 3. Effects exactly once.
    for id in committed.keys() {
        let places = || {
            copies
                .get(id)
                .map(|rs| rs.iter().map(|r| r.place()).collect::<Vec<_>>().join(", "))
                .unwrap_or_default()
        };
        match db.effects.get(*id).copied().unwrap_or(0) {
            1 => {}
            0 => v
                .missing_effects
                .push(format!("event {id} (published at {})", places())),
            n => v.double_effects.push(format!(
                "event {id}: effect applied {n} times (published at {})",
                places()
            )),
        }
        if db.effects.contains_key(*id) != db.inbox.contains(*id) {
            v.missing_effects.push(format!(
                "event {id}: inbox row {} but effect rows {:?}",
                db.inbox.contains(*id),
                db.effects.get(*id)
            ));
        }
    }
    for (id, n) in &db.effects {
        if !committed.contains_key(id.as_str()) {
            v.double_effects.push(format!(
                "effect for event {id} ({n} rows), which was never committed"
            ));
        }
    }
    v
}

/// The connector must have acknowledged work during the run: the offsets it
/// stored (read after each of its deaths) and the slot's confirmed position
/// must both have advanced. A connector that never acknowledges would
/// otherwise pass, every resend "explained" by a crash.
pub fn offsets_advanced(
    stored: &[Lsn],
    confirmed_at_start: Option<Lsn>,
    confirmed_at_end: Option<Lsn>,
) -> Result<(), String> {
    match (stored.first(), stored.last()) {
        (Some(first), Some(last)) if last > first => {}
        _ => {
            return Err(format!(
                "the stored offset did not advance across the connector's deaths: {stored:?}"
            ));
        }
    }
    match (confirmed_at_start, confirmed_at_end) {
        (Some(start), Some(end)) if end > start => Ok(()),
        (start, end) => Err(format!(
            "the slot's confirmed_flush_lsn did not advance during the run: {start:?} -> {end:?}"
        )),
    }
}

/// The checks must be able to fail: a hand-made run with one violation of
/// each kind, and its corrected twin, which must pass. Run before the chaos.
pub fn self_check() {
    use super::workload::Line;
    let tp = |p: i32| ("t.order".to_owned(), p);
    let line = |id: &str, ev: &str, seq: i64| Line {
        line_id: id.into(),
        event_id: ev.into(),
        aggregate_sequence: seq,
    };
    let tx = |n: u64, agg: &str, lines: Vec<Line>, outcome: Outcome| TxRecord {
        writer: 0,
        number: n,
        aggregate_type: "order".into(),
        aggregate_id: agg.into(),
        lines,
        ended_by: matches!(outcome, Outcome::Committed).then(|| Lsn::new(0x100 * n)),
        outcome,
    };
    let ledger = vec![
        tx(
            1,
            "a",
            vec![line("l1", "e1", 1), line("l2", "e2", 2)],
            Outcome::Committed,
        ),
        tx(2, "a", vec![line("l3", "e3", 3)], Outcome::RolledBack),
        tx(
            3,
            "b",
            vec![line("l4", "e4", 1)],
            Outcome::Unknown("lost".into()),
        ),
        tx(4, "b", vec![line("l5", "e5", 2)], Outcome::Committed),
    ];
    let row = |ev: &str, agg: &str, seq: i64, l: &str| OutboxRow {
        event_id: ev.into(),
        aggregate_type: "order".into(),
        aggregate_id: agg.into(),
        sequence: seq,
        line_id: Some(l.into()),
    };
    let rec = |ev: &str, key: &str, seq: i64, p: i32, off: i64| Rec {
        topic: "t.order".into(),
        partition: p,
        offset: off,
        key: key.into(),
        event_id: ev.into(),
        sequence: seq,
        lsn: "0/1".into(),
        repaired: false,
        skipped: false,
    };
    let good_db = || DbState {
        outbox: vec![
            row("e1", "a", 1, "l1"),
            row("e2", "a", 2, "l2"),
            row("e4", "b", 1, "l4"),
            row("e5", "b", 2, "l5"),
        ],
        lines: ["l1", "l2", "l4", "l5"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        effects: ["e1", "e2", "e4", "e5"]
            .iter()
            .map(|s| (s.to_string(), 1))
            .collect(),
        inbox: ["e1", "e2", "e4", "e5"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    // The connector died having stored 0/FF; transaction 1 (e1, e2) ended
    // by 0/100, after it, so sending e1 again is within the contract.
    let window = Window {
        what: "a crash".into(),
        before: BTreeMap::from([(tp(0), 2), (tp(1), 1)]),
        after: BTreeMap::from([(tp(0), 2), (tp(1), 1)]),
        stored: Some(Lsn::new(0xFF)),
        republished: HashSet::new(),
    };
    // Clean: e1 resent across the crash window.
    let good_records = vec![
        rec("e1", "a", 1, 0, 0),
        rec("e2", "a", 2, 0, 1),
        rec("e1", "a", 1, 0, 2),
        rec("e4", "b", 1, 1, 0),
        rec("e5", "b", 2, 1, 1),
    ];
    let v = verify(
        &ledger,
        &good_db(),
        &good_records,
        std::slice::from_ref(&window),
        Delivery::AtLeastOnce,
    );
    assert!(
        v.is_clean(),
        "harness self-check: a clean run was flagged:\n{}",
        v.details()
    );
    assert_eq!((v.events, v.duplicates, v.unknown_committed), (4, 1, 1));

    // Exactly-once: the same resend across the same crash is a violation
    // (no window excuses it); without the resend the run is clean.
    let v = verify(
        &ledger,
        &good_db(),
        &good_records,
        std::slice::from_ref(&window),
        Delivery::ExactlyOnce,
    );
    assert!(
        !v.is_clean()
            && v.exactly_once_duplicates.len() == 1
            && v.exactly_once_duplicates[0].starts_with("event e1: 2 copies")
            && v.unexplained_duplicates.is_empty()
            && v.soak_line(1).contains(" duplicates=1 "),
        "harness self-check: a duplicate under exactly-once delivery was not flagged:\n{}",
        v.details()
    );
    let once: Vec<Rec> = good_records[..2]
        .iter()
        .chain(&good_records[3..])
        .cloned()
        .collect();
    let v = verify(
        &ledger,
        &good_db(),
        &once,
        std::slice::from_ref(&window),
        Delivery::ExactlyOnce,
    );
    assert!(
        v.is_clean() && v.duplicates == 0,
        "harness self-check: a clean exactly-once run was flagged:\n{}",
        v.details()
    );

    // Broken: the same resend after a crash whose stored offset already
    // covered transaction 1 (a connector that re-sends acknowledged work).
    let acked_window = Window {
        stored: Some(Lsn::new(0x100)),
        ..window.clone()
    };
    let v = verify(
        &ledger,
        &good_db(),
        &good_records,
        std::slice::from_ref(&acked_window),
        Delivery::AtLeastOnce,
    );
    assert!(
        v.unexplained_duplicates.len() == 1 && v.unexplained_duplicates[0].contains("acknowledged"),
        "harness self-check: a resend of an acknowledged transaction was not flagged:\n{}",
        v.details()
    );
    // Unless the stream skipped e1 and the live witness published it, then
    // again after the crash (its position not yet stored): the witness's
    // bound is its own position, not the acknowledged offset.
    let by_witness: Vec<Rec> = good_records
        .iter()
        .cloned()
        .map(|mut r| {
            if r.event_id == "e1" {
                (r.repaired, r.skipped) = (true, true);
            }
            r
        })
        .collect();
    let v = verify(
        &ledger,
        &good_db(),
        &by_witness,
        std::slice::from_ref(&acked_window),
        Delivery::AtLeastOnce,
    );
    assert!(
        v.unexplained_duplicates.is_empty(),
        "harness self-check: the witness publishing a skipped row again after a crash was flagged:\n{}",
        v.details()
    );

    // The same across a Kafka outage (its bound is the offset the running
    // connector had acknowledged when it began): within the contract while
    // transaction 1 ended after it, flagged once it had been acknowledged.
    let outage = |stored: u64| Window {
        what: "a Kafka outage".into(),
        before: BTreeMap::from([(tp(0), 2), (tp(1), 2)]),
        after: BTreeMap::from([(tp(0), 2), (tp(1), 2)]),
        stored: Some(Lsn::new(stored)),
        republished: HashSet::new(),
    };
    let judge = |windows: &[Window]| {
        verify(
            &ledger,
            &good_db(),
            &good_records,
            windows,
            Delivery::AtLeastOnce,
        )
    };
    let v = judge(&[outage(0xFF)]);
    assert!(
        v.is_clean(),
        "harness self-check: a resend across a Kafka outage of a transaction acknowledged after it began was flagged:\n{}",
        v.details()
    );
    let v = judge(&[outage(0x100)]);
    assert!(
        v.unexplained_duplicates.len() == 1
            && v.unexplained_duplicates[0].contains("acknowledged before a Kafka outage"),
        "harness self-check: a resend across a Kafka outage of a transaction acknowledged before it was not flagged:\n{}",
        v.details()
    );
    // A pair spanning two windows is judged by the later one, not excused by
    // the more lenient earlier one (the crash at 0/FF, then the outage).
    let crash_first = Window {
        before: BTreeMap::from([(tp(0), 1), (tp(1), 1)]),
        after: BTreeMap::from([(tp(0), 1), (tp(1), 1)]),
        ..window.clone()
    };
    let v = judge(&[crash_first.clone(), outage(0x100)]);
    assert!(
        v.unexplained_duplicates.len() == 1
            && v.unexplained_duplicates[0].contains("a Kafka outage"),
        "harness self-check: a resend excused by an earlier, more lenient window was not flagged:\n{}",
        v.details()
    );
    // A window over before either copy was appended explains nothing.
    let early = Window {
        before: BTreeMap::from([(tp(0), 0), (tp(1), 0)]),
        after: BTreeMap::from([(tp(0), 0), (tp(1), 0)]),
        ..window.clone()
    };
    let v = judge(&[early]);
    assert!(
        v.unexplained_duplicates.len() == 1
            && v.unexplained_duplicates[0].contains("no crash in between"),
        "harness self-check: a resend after every window was not flagged:\n{}",
        v.details()
    );
    // A gap repair publishes again what its rule chooses, acknowledged or
    // not; anything else across it is bounded by the stored offset.
    let repair = |republished: &[&str]| Window {
        what: "a slot repair".into(),
        republished: republished.iter().map(|s| s.to_string()).collect(),
        ..outage(0x100)
    };
    let v = judge(&[repair(&["e1", "e2"])]);
    assert!(
        v.is_clean(),
        "harness self-check: a row the repair's rule republishes was flagged:\n{}",
        v.details()
    );
    let v = judge(&[repair(&["e2"])]);
    assert!(
        v.unexplained_duplicates.len() == 1
            && v.unexplained_duplicates[0].contains("a slot repair"),
        "harness self-check: an acknowledged row outside the repair's rule sent again was not flagged:\n{}",
        v.details()
    );
    // A connector that never acknowledges anything: its stored offset never
    // advances, whatever its duplicates look like.
    assert!(
        offsets_advanced(
            &[Lsn::new(0x50), Lsn::new(0x50)],
            Some(Lsn::new(0x50)),
            Some(Lsn::new(0x50))
        )
        .is_err(),
        "harness self-check: a never-acknowledging connector was not flagged"
    );
    assert!(offsets_advanced(&[], None, None).is_err());
    assert!(
        offsets_advanced(
            &[Lsn::new(0x50), Lsn::new(0x80)],
            Some(Lsn::new(0x40)),
            Some(Lsn::new(0x90))
        )
        .is_ok()
    );

    // A row the stream skipped arrives late from the witness: out of order
    // by design, not a violation; the same record with no skip behind it is
    // a false repair, and a late row nobody skipped stays an order violation.
    let late = |skipped: bool, repaired: bool| {
        let mut e1 = rec("e1", "a", 1, 0, 1);
        e1.skipped = skipped;
        e1.repaired = repaired;
        vec![
            rec("e2", "a", 2, 0, 0),
            e1,
            rec("e4", "b", 1, 1, 0),
            rec("e5", "b", 2, 1, 1),
        ]
    };
    let v = verify(
        &ledger,
        &good_db(),
        &late(true, true),
        &[],
        Delivery::AtLeastOnce,
    );
    assert!(
        v.is_clean() && v.repaired == 1 && v.repaired_late.len() == 1,
        "harness self-check: a skipped row published late by the witness was flagged:\n{}",
        v.details()
    );
    let v = verify(
        &ledger,
        &good_db(),
        &late(false, true),
        &[],
        Delivery::AtLeastOnce,
    );
    assert!(
        v.false_repairs.len() == 1,
        "harness self-check: the witness publishing a row the stream did not skip was not flagged:\n{}",
        v.details()
    );
    let v = verify(
        &ledger,
        &good_db(),
        &late(false, false),
        &[],
        Delivery::AtLeastOnce,
    );
    assert!(
        v.order_violations.len() == 1,
        "harness self-check: a late row nobody skipped was not flagged:\n{}",
        v.details()
    );

    // Broken: the rolled-back l3 has an outbox row, e5 is lost, e9 was never
    // written, aggregate a arrives out of order, e2 is resent with no crash
    // in between, e1's effect applied twice, e4's never.
    let mut db = good_db();
    db.outbox.push(row("e3", "a", 3, "l3"));
    db.effects.insert("e1".into(), 2);
    db.effects.remove("e4");
    db.inbox.remove("e4");
    let records = vec![
        rec("e2", "a", 2, 0, 0),
        rec("e1", "a", 1, 0, 1),
        rec("e2", "a", 2, 0, 3),
        rec("e3", "a", 3, 0, 4),
        rec("e4", "b", 1, 1, 0),
        rec("e9", "c", 1, 1, 1),
    ];
    let v = verify(&ledger, &db, &records, &[], Delivery::AtLeastOnce);
    for (what, list) in [
        ("rolled-back row", &v.outbox_mismatches),
        ("lost", &v.lost),
        ("phantom", &v.phantoms),
        ("order", &v.order_violations),
        ("unexplained duplicate", &v.unexplained_duplicates),
        ("double effect", &v.double_effects),
        ("missing effect", &v.missing_effects),
    ] {
        assert!(
            !list.is_empty(),
            "harness self-check: the {what} check did not fire:\n{}",
            v.details()
        );
    }
}

/// The reader against a real transactional topic, before an exactly-once
/// run: two committed records, an aborted one, a committed one, and one in a
/// transaction still open. The reader must return exactly the committed
/// records and end at the open transaction (the last stable offset), then
/// read the last record once it commits. A reader that counted its progress
/// from the records it saw would wait for the marker at the end for ever.
pub async fn reader_self_check(bootstrap: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

    const TIMEOUT: Duration = Duration::from_secs(30);
    let prefix = super::unique_name("chaos_reader_check");
    let topic = format!("{prefix}.order");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("create the Kafka admin client");
    let options = AdminOptions::new();
    let created = admin
        .create_topics(
            [&NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .unwrap_or_else(|e| panic!("harness self-check: creating topic {topic}: {e}"));
    if let Some(Err((t, code))) = created.into_iter().next() {
        panic!("harness self-check: creating topic {t}: {code}");
    }
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", &prefix)
        .create()
        .expect("create the self-check's transactional producer");
    let step = |what: &str, r: rdkafka::error::KafkaResult<()>| {
        r.unwrap_or_else(|e| panic!("harness self-check: {what} on {topic}: {e}"))
    };
    let send = |event_id: &str| {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "event_id",
                value: Some(event_id),
            })
            .insert(Header {
                key: "aggregate_sequence",
                value: Some("1"),
            });
        let record = BaseRecord::to(&topic)
            .key("k")
            .payload("{}")
            .headers(headers);
        step("send", producer.send(record).map_err(|(e, _)| e));
    };
    step("init_transactions", producer.init_transactions(TIMEOUT));
    step("begin", producer.begin_transaction());
    send("a");
    send("b");
    step("commit", producer.commit_transaction(TIMEOUT));
    step("begin", producer.begin_transaction());
    send("aborted");
    step("flush", producer.flush(TIMEOUT)); // in the log before the abort
    step("abort", producer.abort_transaction(TIMEOUT));
    step("begin", producer.begin_transaction());
    send("c");
    step("commit", producer.commit_transaction(TIMEOUT));
    step("begin", producer.begin_transaction());
    send("d");
    step("flush", producer.flush(TIMEOUT));

    let mut reader = KafkaReader::new(bootstrap, &prefix);
    // The last stable offset moves past a transaction once the coordinator
    // has written its commit markers, which may be a moment after
    // commit_transaction returned: a read that ends short of `expected` is
    // read again (each read must end); one that returns anything else fails.
    let read = |reader: &mut KafkaReader, expected: &[&str]| {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            reader.catch_up(TIMEOUT).unwrap_or_else(|e| {
                panic!(
                    "harness self-check: the reader did not end on the transactional topic {topic}: {e}"
                )
            });
            let ids: Vec<&str> = reader.records.iter().map(|r| r.event_id.as_str()).collect();
            if ids == expected {
                return;
            }
            assert!(
                expected.starts_with(&ids) && Instant::now() < deadline,
                "harness self-check: what a read_committed reader returns from {topic}: {ids:?}, expected {expected:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    read(&mut reader, &["a", "b", "c"]);
    step("commit", producer.commit_transaction(TIMEOUT));
    read(&mut reader, &["a", "b", "c", "d"]);
    let _ = admin.delete_topics(&[&topic], &options).await;
}

#[cfg(test)]
mod tests {
    /// The same self-check every chaos run starts with, without servers.
    #[test]
    fn the_verdict_checks_can_fire() {
        super::self_check();
    }
}
