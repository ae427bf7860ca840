//! Metrics: each one registered once with its name and help text in a
//! `prometheus_client` registry, updated through methods named for what
//! happened, exposed in the Prometheus text format (0.0.4).
//!
//! Updates are atomics (the commit-to-ack histogram takes an uncontended
//! lock); the pipeline, the slot monitor, the heartbeat and the pruner write,
//! the HTTP endpoint and `status` read.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

use crate::checkpoint::{DurableCommitTime, SharedStore};
use crate::pg::Lsn;

/// Exported names that other code reads back (`status` parses `/metrics`).
pub const RECEIVED_LSN: &str = "outbox_cdc_received_lsn";
pub const ACKED_LSN: &str = "outbox_cdc_acked_lsn";
pub const EVENTS_PUBLISHED: &str = "outbox_cdc_events_published_total";
pub const EVENTS_FAILED: &str = "outbox_cdc_events_failed_total";
pub const IN_FLIGHT_EVENTS: &str = "outbox_cdc_in_flight_events";
pub const OLDEST_UNACKED_AGE: &str = "outbox_cdc_oldest_unacked_age_seconds";
pub const CONNECTED: &str = "outbox_cdc_connected";
pub const RECONNECTS: &str = "outbox_cdc_reconnects_total";
pub const SPILL_TRANSACTIONS: &str = "outbox_cdc_spill_transactions";
pub const SPILL_BYTES: &str = "outbox_cdc_spill_bytes";
pub const SPILL_LARGEST_BYTES: &str = "outbox_cdc_spill_largest_transaction_bytes";
pub const RECONCILE_LAG: &str = "outbox_cdc_reconcile_lag_seconds";
pub const RECONCILE_CHECKED: &str = "outbox_cdc_reconcile_checked_rows_total";
pub const RECONCILE_MISSING: &str = "outbox_cdc_reconcile_missing_total";

/// Upper bounds of the commit-to-ack histogram buckets, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Upper bounds of the per-stage histogram buckets, in seconds.
const STAGE_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Where an event's time from commit to acknowledgement goes, one series of
/// `outbox_cdc_stage_seconds` each. Server and connector times are compared
/// as wall clocks (exact on one host, skewed by the clock difference across
/// hosts); the connector's own stages use its monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The transaction's commit to the walsender sending the change (the
    /// XLogData send time): decoding, and the server's queue.
    CommitToSend,
    /// The walsender's send time to the connector handling the change.
    SendToReceive,
    /// Handling the change (decode, map, route) until the producer took it.
    ReceiveToProduce,
    /// The producer taking the record to its delivery report (librdkafka's
    /// batching, the broker's write and replication, acks=all).
    ProduceToAck,
    /// The delivery report to the session counting it.
    AckToTracker,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Stage::CommitToSend,
        Stage::SendToReceive,
        Stage::ReceiveToProduce,
        Stage::ProduceToAck,
        Stage::AckToTracker,
    ];

    /// The `stage` label.
    pub fn label(self) -> &'static str {
        match self {
            Stage::CommitToSend => "commit_to_send",
            Stage::SendToReceive => "send_to_receive",
            Stage::ReceiveToProduce => "receive_to_produce",
            Stage::ProduceToAck => "produce_to_ack",
            Stage::AckToTracker => "ack_to_tracker",
        }
    }
}

type StageFamily = Family<Label, Histogram, fn() -> Histogram>;

/// The values of pg_replication_slots.wal_status, one series each.
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

/// One label: its name and value.
type Label = [(&'static str, String); 1];
type SecondsGauge = Gauge<f64, AtomicU64>;
type UnsignedGauge = Gauge<u64, AtomicU64>;

/// `outbox_cdc_kafka_transactions_total{outcome}` (shares the registered family).
#[derive(Clone)]
pub(crate) struct KafkaTransactionCounter(Family<Label, Counter>);

impl KafkaTransactionCounter {
    pub(crate) fn inc(&self, outcome: &'static str) {
        self.0.get_or_create(&label("outcome", outcome)).inc();
    }
}

/// All metrics of one process. The slot gauges read -1 (unknown) until the
/// first poll, the outbox size gauges until the pruner measured the table.
pub struct Metrics {
    registry: Registry,
    slot_lag_bytes: Gauge,
    slot_restart_lag_bytes: Gauge,
    slot_safe_wal_size_bytes: Gauge,
    slot_wal_status: Family<Label, Gauge>,
    slot_exists: Gauge,
    slot_active: Gauge,
    slot_last_poll: SecondsGauge,
    slot_poll_errors: Counter,
    heartbeats: Counter,
    heartbeat_errors: Counter,
    received_lsn: UnsignedGauge,
    acked_lsn: UnsignedGauge,
    events_published: Counter,
    events_failed: Counter,
    events_deduplicated: Counter,
    dead_lettered_by_topic: Family<Label, Counter>,
    /// The sum of `dead_lettered_by_topic`, which a family cannot give.
    dead_lettered: AtomicU64,
    in_flight_events: UnsignedGauge,
    in_flight_bytes: UnsignedGauge,
    oldest_unacked_age: SecondsGauge,
    /// Streamed transactions not yet committed (pgoutput protocol 2).
    spill: [UnsignedGauge; 4],
    commit_to_ack: Histogram,
    /// `outbox_cdc_stage_seconds`, one histogram per [`Stage`], in its order.
    stages: [Histogram; 5],
    connected: UnsignedGauge,
    reconnects: Counter,
    sequence_gaps_by_type: Family<Label, Counter>,
    /// Exactly-once delivery: Kafka transactions by outcome.
    kafka_transactions: Family<Label, Counter>,
    repair_rows: Counter,
    repair_rows_left: UnsignedGauge,
    pruned_rows: Counter,
    reconcile_missing: Counter,
    reconcile_repaired: Counter,
    reconcile_checked: Counter,
    reconcile_lag: SecondsGauge,
    outbox_rows: Gauge,
    outbox_bytes: Gauge,
    oldest_retained_age: SecondsGauge,
    /// Trace context values left out of records, by header.
    trace_dropped: Family<Label, Counter>,
    /// `outbox_cdc_ready`: 1 while every readiness reason holds.
    ready: Gauge,
    /// `outbox_cdc_ready_reason{reason}`: 1 while that reason holds.
    ready_reasons: Family<Label, Gauge>,
    /// What `/health/ready` judges from (readiness reasons).
    pub health: crate::readiness::HealthState,
    /// Commit time of the last acknowledged transaction the session
    /// persisted: the pruner's bound while `run` holds the offset store.
    pub(crate) durable_commit_time: Arc<DurableCommitTime>,
    /// The offset store the pipeline opened: where the pruner reads the
    /// parked aggregates while `run` holds the store.
    pub(crate) offset_store: SharedStore,
    /// How far the stored witness pages are complete: the live witness
    /// compares only transactions committed before it. It trails the durable
    /// position while the server sends again what an earlier session sent
    /// and did not record (exactly-once resuming at a Kafka marker ahead of
    /// the stored offset), and may go back when a new session starts.
    witness_covered: AtomicU64,
}

/// Registers each metric as it is made, so a metric cannot exist unexported.
struct Registrar(Registry);

impl Registrar {
    /// `help` without a final period: the library adds one.
    fn add<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M {
        self.0.register(name, help, metric.clone());
        metric
    }

    /// A counter (or a family of counters) under its exported name, which ends
    /// in `_total`; the library adds that suffix itself.
    fn counter<M: Metric + Clone + Default>(&mut self, name: &str, help: &str) -> M {
        let base = name
            .strip_suffix("_total")
            .expect("counter names end in _total");
        self.add(base, help, M::default())
    }

    fn gauge(&mut self, name: &str, help: &str, initial: i64) -> Gauge {
        let gauge = Gauge::default();
        gauge.set(initial);
        self.add(name, help, gauge)
    }

    fn seconds(&mut self, name: &str, help: &str, initial: f64) -> SecondsGauge {
        let gauge = SecondsGauge::default();
        gauge.set(initial);
        self.add(name, help, gauge)
    }

    fn unsigned(&mut self, name: &str, help: &str) -> UnsignedGauge {
        self.add(name, help, UnsignedGauge::default())
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut r = Registrar(Registry::default());
        let slot_lag_bytes = r.gauge(
            "outbox_cdc_slot_lag_bytes",
            "WAL bytes between pg_current_wal_lsn() and the slot's confirmed_flush_lsn (-1 while unknown or the slot is missing)",
            -1,
        );
        let slot_restart_lag_bytes = r.gauge(
            "outbox_cdc_slot_restart_lag_bytes",
            "WAL bytes between pg_current_wal_lsn() and the slot's restart_lsn, i.e. WAL the server retains for us (-1 while unknown or the slot is missing)",
            -1,
        );
        let slot_safe_wal_size_bytes = r.gauge(
            "outbox_cdc_slot_safe_wal_size_bytes",
            "The slot's safe_wal_size: bytes that can still be written before the slot is at risk of being lost (-1 when unlimited, lost or unknown)",
            -1,
        );
        let slot_wal_status: Family<Label, Gauge> = r.add(
            "outbox_cdc_slot_wal_status",
            "1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others",
            Family::default(),
        );
        create_members(&slot_wal_status, "status", &WAL_STATUSES);
        let slot_exists = r.gauge(
            "outbox_cdc_slot_exists",
            "1 when the slot exists, 0 when the last poll found it missing, -1 before the first poll",
            -1,
        );
        let slot_active = r.gauge(
            "outbox_cdc_slot_active",
            "1 when a backend streams from the slot (this instance or another), 0 when none, -1 before the first poll",
            -1,
        );
        let slot_last_poll = r.seconds(
            "outbox_cdc_slot_last_poll_timestamp_seconds",
            "Unix time in seconds of the last successful slot poll (0 before the first)",
            0.0,
        );
        let slot_poll_errors = r.counter(
            "outbox_cdc_slot_poll_errors_total",
            "Slot polls that failed (connection or query errors); the poller reconnects by itself",
        );
        let heartbeats = r.counter(
            "outbox_cdc_heartbeats_total",
            "Heartbeat messages written with pg_logical_emit_message",
        );
        let heartbeat_errors = r.counter(
            "outbox_cdc_heartbeat_errors_total",
            "Heartbeats that failed; the heartbeat reconnects by itself",
        );
        let received_lsn = r.unsigned(
            RECEIVED_LSN,
            "Highest WAL position received from the server, as a number",
        );
        let acked_lsn = r.unsigned(
            ACKED_LSN,
            "Highest WAL position persisted locally and reported to the server as flushed, as a number",
        );
        let events_published = r.counter(EVENTS_PUBLISHED, "Events acknowledged by Kafka");
        let events_failed = r.counter(EVENTS_FAILED, "Events whose delivery to Kafka failed");
        let events_deduplicated = r.counter(
            "outbox_cdc_events_deduplicated_total",
            "Events dropped on restart because their transaction was already acknowledged",
        );
        let dead_lettered_by_topic = r.counter(
            "outbox_cdc_events_dead_lettered_total",
            "Events published to the dead-letter topic, by the topic they were meant for",
        );
        let in_flight_events = r.unsigned(
            IN_FLIGHT_EVENTS,
            "Events sent to Kafka and not yet acknowledged",
        );
        let in_flight_bytes = r.unsigned(
            "outbox_cdc_in_flight_bytes",
            "Bytes of events sent to Kafka and not yet acknowledged",
        );
        let oldest_unacked_age = r.seconds(
            OLDEST_UNACKED_AGE,
            "Age in seconds of the commit time of the oldest transaction not yet acknowledged (0 when none)",
            0.0,
        );
        let spill = [
            r.unsigned(
                SPILL_TRANSACTIONS,
                "Streamed transactions received in part and not yet committed or rolled back ([postgres] streaming)",
            ),
            r.unsigned(
                SPILL_BYTES,
                "Bytes of those transactions' changes held by the connector, in memory and in spill files",
            ),
            r.unsigned(
                "outbox_cdc_spill_memory_bytes",
                "Memory the buffers of those transactions hold, as allocated (bounded by [limits] max_spill_memory_bytes)",
            ),
            r.unsigned(
                SPILL_LARGEST_BYTES,
                "Bytes of the largest of those transactions (0 when none)",
            ),
        ];
        let commit_to_ack = r.add(
            "outbox_cdc_commit_to_ack_seconds",
            "Seconds from a transaction's commit to Kafka acknowledging all of its events",
            Histogram::new(LATENCY_BUCKETS),
        );
        let stage_family: StageFamily = r.add(
            "outbox_cdc_stage_seconds",
            "Seconds each event spent in one stage between its commit and the session counting its acknowledgement (stage: commit_to_send, send_to_receive, receive_to_produce, produce_to_ack, ack_to_tracker)",
            Family::new_with_constructor(|| Histogram::new(STAGE_BUCKETS)),
        );
        let stages = Stage::ALL.map(|stage| {
            stage_family
                .get_or_create(&label("stage", stage.label()))
                .clone()
        });
        let connected = r.unsigned(
            CONNECTED,
            "1 while the replication stream is connected and streaming",
        );
        let reconnects = r.counter(RECONNECTS, "Reconnects after a retryable failure");
        let sequence_gaps_by_type = r.counter(
            "outbox_cdc_sequence_gaps_total",
            "Events whose aggregate_sequence does not follow the aggregate's last published one (a jump, an old number again, or a first event above 1), by aggregate type",
        );
        let kafka_transactions = r.counter(
            "outbox_cdc_kafka_transactions_total",
            "Kafka transactions of the exactly-once mode, by outcome (committed, aborted)",
        );
        let repair_rows = r.counter(
            "outbox_cdc_repair_rows_total",
            "Retained outbox rows published again by gap repair after a lost slot",
        );
        let repair_rows_left = r.unsigned(
            "outbox_cdc_repair_rows_left",
            "Rows the running gap repair has still to publish (0 when none runs)",
        );
        let pruned_rows = r.counter(
            "outbox_cdc_pruned_rows_total",
            "Outbox rows deleted by pruning ([prune] retention), by batch delete or partition drop",
        );
        let reconcile_missing = r.counter(
            RECONCILE_MISSING,
            "Committed outbox rows the live witness found that the stream did not deliver ([reconcile])",
        );
        let reconcile_repaired = r.counter(
            "outbox_cdc_reconcile_repaired_total",
            "Rows the live witness found missing and published from the table (marked by the header repaired_by: witness)",
        );
        let reconcile_checked = r.counter(
            RECONCILE_CHECKED,
            "Outbox rows the live witness checked against what the stream delivered",
        );
        let reconcile_lag = r.seconds(
            RECONCILE_LAG,
            "Age of the oldest committed outbox row not yet checked by the live witness (-1 until its first round; with it off)",
            -1.0,
        );
        let outbox_rows = r.gauge(
            "outbox_cdc_outbox_rows",
            "Estimated rows in the outbox table (pg_class.reltuples of the table or its partitions; -1 until pruning measured it)",
            -1,
        );
        let outbox_bytes = r.gauge(
            "outbox_cdc_outbox_bytes",
            "On-disk size of the outbox table with indexes and TOAST, partitions included (-1 until pruning measured it)",
            -1,
        );
        let oldest_retained_age = r.seconds(
            "outbox_cdc_oldest_retained_age_seconds",
            "Age in seconds of the oldest outbox row's occurred_at (0 when the table is empty, -1 until pruning measured it)",
            -1.0,
        );
        let trace_dropped: Family<Label, Counter> = r.counter(
            "outbox_cdc_trace_context_dropped_total",
            "Trace context values of outbox rows left out of the record because they are not valid W3C Trace Context (header: traceparent, tracestate); the event is published without them",
        );
        create_members(&trace_dropped, "header", &["traceparent", "tracestate"]);
        let ready = r.gauge(
            "outbox_cdc_ready",
            "1 while every readiness reason of /health/ready holds, 0 otherwise (as of the last scrape)",
            0,
        );
        let ready_reasons: Family<Label, Gauge> = r.add(
            "outbox_cdc_ready_reason",
            "1 while the readiness reason holds, 0 while it does not (reason: streaming, kafka_reachable, acknowledging, sequence_gaps); /health/ready names the cause, the log and `outbox-cdc status` say why",
            Family::default(),
        );
        create_members(&ready_reasons, "reason", &crate::readiness::REASONS);
        Metrics {
            registry: r.0,
            slot_lag_bytes,
            slot_restart_lag_bytes,
            slot_safe_wal_size_bytes,
            slot_wal_status,
            slot_exists,
            slot_active,
            slot_last_poll,
            slot_poll_errors,
            heartbeats,
            heartbeat_errors,
            received_lsn,
            acked_lsn,
            events_published,
            events_failed,
            events_deduplicated,
            dead_lettered_by_topic,
            dead_lettered: AtomicU64::new(0),
            in_flight_events,
            in_flight_bytes,
            oldest_unacked_age,
            spill,
            commit_to_ack,
            stages,
            connected,
            reconnects,
            sequence_gaps_by_type,
            kafka_transactions,
            repair_rows,
            repair_rows_left,
            pruned_rows,
            reconcile_missing,
            reconcile_repaired,
            reconcile_checked,
            reconcile_lag,
            outbox_rows,
            outbox_bytes,
            oldest_retained_age,
            trace_dropped,
            ready,
            ready_reasons,
            health: crate::readiness::HealthState::default(),
            durable_commit_time: Arc::default(),
            offset_store: SharedStore::default(),
            witness_covered: AtomicU64::new(0),
        }
    }
}

/// One poll of the slot, as the gauges show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotGauges {
    pub lag_bytes: Option<u64>,
    pub restart_lag_bytes: Option<u64>,
    pub safe_wal_size: Option<i64>,
    pub wal_status: Option<String>,
    pub active: bool,
}

fn label(name: &'static str, value: &str) -> Label {
    [(name, value.to_owned())]
}

/// Creates the family's member for each label value, so that every one is
/// exported (at zero) before it is first set.
fn create_members<M, C: MetricConstructor<M>>(
    family: &Family<Label, M, C>,
    name: &'static str,
    values: &[&str],
) {
    for value in values {
        drop(family.get_or_create(&label(name, value)));
    }
}

impl Metrics {
    /// Records a successful poll; `None` means the slot does not exist.
    pub fn set_slot(&self, slot: Option<&SlotGauges>, now_unix_ms: u64) {
        let as_gauge = |v: Option<u64>| v.map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX));
        match slot {
            Some(s) => {
                self.slot_lag_bytes.set(as_gauge(s.lag_bytes));
                self.slot_restart_lag_bytes
                    .set(as_gauge(s.restart_lag_bytes));
                self.slot_safe_wal_size_bytes
                    .set(s.safe_wal_size.unwrap_or(-1));
                self.set_wal_status(s.wal_status.as_deref());
                self.slot_exists.set(1);
                self.slot_active.set(i64::from(s.active));
            }
            None => {
                self.slot_lag_bytes.set(-1);
                self.slot_restart_lag_bytes.set(-1);
                self.slot_safe_wal_size_bytes.set(-1);
                self.set_wal_status(None);
                self.slot_exists.set(0);
                self.slot_active.set(0);
            }
        }
        self.slot_last_poll.set(now_unix_ms as f64 / 1e3);
    }

    fn set_wal_status(&self, current: Option<&str>) {
        for status in WAL_STATUSES {
            let series = self.slot_wal_status.get_or_create(&label("status", status));
            series.set(i64::from(current == Some(status)));
        }
    }

    /// A slot poll failed; the monitor reconnects by itself.
    pub fn slot_poll_failed(&self) {
        self.slot_poll_errors.inc();
    }

    pub fn heartbeat_written(&self) {
        self.heartbeats.inc();
    }

    pub fn heartbeat_failed(&self) {
        self.heartbeat_errors.inc();
    }

    /// Counts one event published to the dead-letter topic instead of `original_topic`.
    pub fn record_dead_lettered(&self, original_topic: &str) {
        self.dead_lettered_by_topic
            .get_or_create(&label("topic", original_topic))
            .inc();
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }

    /// Events dead-lettered, all topics together.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }

    /// Counts a sequence gap of an aggregate of `aggregate_type`.
    pub fn record_sequence_gap(&self, aggregate_type: &str) {
        self.sequence_gaps_by_type
            .get_or_create(&label("aggregate_type", aggregate_type))
            .inc();
    }

    /// One Kafka transaction ended (`committed` or `aborted`).
    pub fn kafka_transaction(&self, outcome: &'static str) {
        self.kafka_transactions
            .get_or_create(&label("outcome", outcome))
            .inc();
    }

    /// Kafka transactions that ended with `outcome`.
    /// `outbox_cdc_kafka_transactions_total`, for the exactly-once delivery,
    /// which outlives a borrow of the metrics.
    pub(crate) fn kafka_transaction_counter(&self) -> KafkaTransactionCounter {
        KafkaTransactionCounter(self.kafka_transactions.clone())
    }

    pub fn kafka_transactions(&self, outcome: &'static str) -> u64 {
        self.kafka_transactions
            .get(&label("outcome", outcome))
            .map_or(0, |c| c.get())
    }

    /// Sequence gaps counted for `aggregate_type`.
    pub fn sequence_gaps(&self, aggregate_type: &str) -> u64 {
        self.sequence_gaps_by_type
            .get(&label("aggregate_type", aggregate_type))
            .map_or(0, |c| c.get())
    }

    /// Counts the trace context values one published event left out.
    pub fn trace_dropped(&self, dropped: crate::outbox::TraceDropped) {
        if !dropped.any() {
            return;
        }
        for (header, hit) in [
            ("traceparent", dropped.traceparent),
            ("tracestate", dropped.tracestate),
        ] {
            if hit {
                self.trace_dropped
                    .get_or_create(&label("header", header))
                    .inc();
            }
        }
    }

    /// Trace context values dropped for `header` (`traceparent`, `tracestate`).
    pub fn trace_dropped_count(&self, header: &str) -> u64 {
        self.trace_dropped
            .get(&label("header", header))
            .map_or(0, |c| c.get())
    }

    /// Time one event spent in `stage`.
    pub fn stage(&self, stage: Stage, seconds: f64) {
        self.stages[stage as usize].observe(seconds);
    }

    /// One event acknowledged by Kafka, `commit_to_ack_micros` after its commit.
    pub fn published(&self, commit_to_ack_micros: u64) {
        self.events_published.inc();
        self.health.acknowledged();
        self.commit_to_ack
            .observe(commit_to_ack_micros as f64 / 1e6);
    }

    pub fn events_published(&self) -> u64 {
        self.events_published.get()
    }

    /// One event not re-sent: its transaction was acknowledged before a restart.
    pub fn deduplicated(&self) {
        self.events_deduplicated.inc();
    }

    /// One event Kafka or the mapper refused.
    pub fn failed(&self) {
        self.events_failed.inc();
    }

    /// What is in flight: events, their bytes, and the age of the oldest
    /// unacknowledged commit (0 when nothing is).
    ///
    /// Called twice per event: plain stores, not the gauges' `set`, which
    /// swaps (a locked instruction on x86) to return the old value.
    pub fn set_in_flight(&self, events: usize, bytes: usize, oldest_age_micros: Option<u64>) {
        let r = Ordering::Relaxed;
        self.in_flight_events.inner().store(events as u64, r);
        self.in_flight_bytes.inner().store(bytes as u64, r);
        if let Some(age) = oldest_age_micros {
            self.health.unacked_age(age);
            // An f64 gauge keeps the value's bits in its AtomicU64.
            let seconds = age as f64 / 1e6;
            self.oldest_unacked_age.inner().store(seconds.to_bits(), r);
        }
    }

    /// What the spill of streamed transactions holds.
    pub fn set_spill(&self, transactions: usize, bytes: u64, memory_bytes: usize, largest: u64) {
        let values = [transactions as u64, bytes, memory_bytes as u64, largest];
        for (gauge, value) in self.spill.iter().zip(values) {
            gauge.inner().store(value, Ordering::Relaxed);
        }
    }

    pub fn in_flight_events(&self) -> u64 {
        self.in_flight_events.get()
    }

    /// Whether the replication stream is up (`/readyz`).
    pub fn set_connected(&self, connected: bool) {
        self.connected.set(u64::from(connected));
    }

    pub fn is_connected(&self) -> bool {
        self.connected.get() == 1
    }

    /// One reconnect after a retryable session failure.
    pub fn reconnecting(&self) {
        self.reconnects.inc();
    }

    pub fn reconnects(&self) -> u64 {
        self.reconnects.get()
    }

    pub fn set_received(&self, lsn: Lsn) {
        self.received_lsn
            .inner()
            .fetch_max(lsn.as_u64(), Ordering::Relaxed);
    }

    pub fn set_acked(&self, lsn: Lsn) {
        self.acked_lsn
            .inner()
            .fetch_max(lsn.as_u64(), Ordering::Relaxed);
    }

    pub fn acked(&self) -> Lsn {
        Lsn::new(self.acked_lsn.get())
    }

    /// Every event the sessions sent in transactions committed before `lsn`
    /// has its fingerprint in the store (see the field).
    pub fn set_witness_covered(&self, lsn: Lsn) {
        self.witness_covered.store(lsn.as_u64(), Ordering::Relaxed);
    }

    pub fn witness_covered(&self) -> Lsn {
        Lsn::new(self.witness_covered.load(Ordering::Relaxed))
    }

    /// A gap repair starts with `rows` retained rows to publish.
    pub fn repair_started(&self, rows: u64) {
        self.repair_rows_left.set(rows);
    }

    /// The gap repair published `rows` more.
    pub fn repair_published(&self, rows: u64) {
        self.repair_rows.inc_by(rows);
        let _ = self.repair_rows_left.inner().fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |left| Some(left.saturating_sub(rows)),
        );
    }

    pub fn repair_finished(&self) {
        self.repair_rows_left.set(0);
    }

    pub fn repair_rows(&self) -> u64 {
        self.repair_rows.get()
    }

    /// One pruning pass deleted `rows`.
    /// The live witness found `missing` rows the stream did not deliver.
    pub(crate) fn reconcile_found(&self, missing: u64) {
        self.reconcile_missing.inc_by(missing);
    }

    pub(crate) fn reconcile_repaired(&self, rows: u64) {
        self.reconcile_repaired.inc_by(rows);
    }

    /// A round checked `rows`; every row committed more than `lag` ago is checked.
    pub(crate) fn reconcile_round(&self, rows: u64, lag: Duration) {
        self.reconcile_checked.inc_by(rows);
        self.reconcile_lag.set(lag.as_secs_f64());
    }

    pub fn reconcile_missing(&self) -> u64 {
        self.reconcile_missing.get()
    }

    /// Seconds since the rows the witness checked were committed; `None`
    /// before its first round.
    pub fn reconcile_lag(&self) -> Option<f64> {
        let lag = self.reconcile_lag.get();
        (lag >= 0.0).then_some(lag)
    }

    pub fn reconcile_checked_rows(&self) -> u64 {
        self.reconcile_checked.get()
    }

    pub fn reconcile_repaired_rows(&self) -> u64 {
        self.reconcile_repaired.get()
    }

    pub fn pruned(&self, rows: u64) {
        self.pruned_rows.inc_by(rows);
    }

    pub fn pruned_rows(&self) -> u64 {
        self.pruned_rows.get()
    }

    /// The outbox table as the pruner measured it: estimated rows, bytes on
    /// disk, and the age of its oldest row (0 when empty).
    pub fn set_outbox_size(&self, rows: i64, bytes: i64, oldest_age_ms: i64) {
        self.outbox_rows.set(rows);
        self.outbox_bytes.set(bytes);
        self.oldest_retained_age
            .set(oldest_age_ms.max(0) as f64 / 1e3);
    }

    /// Readiness as judged (`health::readiness`): `outbox_cdc_ready` and
    /// one `outbox_cdc_ready_reason` per reason.
    pub fn set_readiness<'r>(
        &self,
        ready: bool,
        reasons: impl IntoIterator<Item = (&'r str, bool)>,
    ) {
        self.ready.set(i64::from(ready));
        for (name, ok) in reasons {
            self.ready_reasons
                .get_or_create(&label("reason", name))
                .set(i64::from(ok));
        }
    }

    /// The Prometheus text exposition format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names in the exposition's `# TYPE` lines, with the sample names a
    /// histogram adds (`_bucket`, `_sum`, `_count`).
    fn exported_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            names.push(name.to_owned());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.push(format!("{name}{suffix}"));
                }
            }
        }
        names
    }

    fn populated() -> Metrics {
        let m = Metrics::default();
        m.published(4_000);
        m.published(4_000);
        m.published(4_000);
        m.record_dead_lettered("t.order");
        m.record_sequence_gap("order");
        m.record_sequence_gap("order");
        m.kafka_transaction("committed");
        m.set_slot(
            Some(&SlotGauges {
                lag_bytes: Some(1),
                restart_lag_bytes: Some(2),
                safe_wal_size: Some(3),
                wal_status: Some("extended".into()),
                active: true,
            }),
            1,
        );
        m
    }

    #[test]
    fn every_metric_has_help_type_and_a_sample() {
        let text = populated().render();
        let typed: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert_eq!(typed.len(), 42, "metrics exported:\n{text}");
        for name in typed {
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} lacks HELP"
            );
            let has_sample = text
                .lines()
                .any(|l| !l.starts_with('#') && l.starts_with(name));
            assert!(has_sample, "{name} has no sample in\n{text}");
        }
        for line in [
            "outbox_cdc_events_published_total 3\n",
            "outbox_cdc_sequence_gaps_total{aggregate_type=\"order\"} 2\n",
            "outbox_cdc_commit_to_ack_seconds_bucket{le=\"0.005\"} 3\n",
            "outbox_cdc_commit_to_ack_seconds_bucket{le=\"0.0025\"} 0\n",
            "outbox_cdc_commit_to_ack_seconds_bucket{le=\"+Inf\"} 3\n",
            "outbox_cdc_commit_to_ack_seconds_count 3\n",
            "outbox_cdc_slot_wal_status{status=\"extended\"} 1\n",
            "outbox_cdc_slot_wal_status{status=\"reserved\"} 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(
            !text.contains(".."),
            "help text ends in one period, not two:\n{text}"
        );
    }

    #[test]
    fn slot_gauges_are_unknown_until_polled_then_follow_the_slot() {
        let m = Metrics::default();
        let text = m.render();
        assert!(text.contains("outbox_cdc_slot_lag_bytes -1\n"), "{text}");
        assert!(text.contains("outbox_cdc_slot_exists -1\n"));
        assert!(text.contains("outbox_cdc_slot_wal_status{status=\"lost\"} 0\n"));
        let polled = SlotGauges {
            lag_bytes: Some(4096),
            restart_lag_bytes: Some(8192),
            safe_wal_size: None,
            wal_status: Some("reserved".into()),
            active: true,
        };
        m.set_slot(Some(&polled), 1_700_000_000_500);
        let text = m.render();
        for line in [
            "outbox_cdc_slot_lag_bytes 4096\n",
            "outbox_cdc_slot_restart_lag_bytes 8192\n",
            "outbox_cdc_slot_safe_wal_size_bytes -1\n",
            "outbox_cdc_slot_wal_status{status=\"reserved\"} 1\n",
            "outbox_cdc_slot_wal_status{status=\"lost\"} 0\n",
            "outbox_cdc_slot_exists 1\n",
            "outbox_cdc_slot_active 1\n",
            "outbox_cdc_slot_last_poll_timestamp_seconds 1700000000.5\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        m.set_slot(None, 1_700_000_001_000);
        let text = m.render();
        assert!(text.contains("outbox_cdc_slot_exists 0\n"));
        assert!(text.contains("outbox_cdc_slot_lag_bytes -1\n"));
        assert!(!text.contains("outbox_cdc_slot_wal_status{status=\"reserved\"} 1"));
    }

    #[test]
    fn dead_letters_are_counted_per_original_topic() {
        let m = Metrics::default();
        assert!(
            !m.render()
                .lines()
                .any(|l| l.starts_with("outbox_cdc_events_dead_lettered_total")),
            "no series before the first"
        );
        m.record_dead_lettered("orders");
        m.record_dead_lettered("orders");
        m.record_dead_lettered("we\"ird");
        let text = m.render();
        assert!(
            text.contains("outbox_cdc_events_dead_lettered_total{topic=\"orders\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("outbox_cdc_events_dead_lettered_total{topic=\"we\\\"ird\"} 1\n"),
            "{text}"
        );
        assert_eq!(m.dead_lettered(), 3);
    }

    #[test]
    fn repair_and_outbox_gauges_follow_their_updates() {
        let m = Metrics::default();
        assert!(
            m.render()
                .contains("outbox_cdc_oldest_retained_age_seconds -1")
        );
        m.repair_started(10);
        m.repair_published(4);
        m.set_outbox_size(7, 8192, 1_500);
        let text = m.render();
        for line in [
            "outbox_cdc_repair_rows_total 4\n",
            "outbox_cdc_repair_rows_left 6\n",
            "outbox_cdc_outbox_rows 7\n",
            "outbox_cdc_outbox_bytes 8192\n",
            "outbox_cdc_oldest_retained_age_seconds 1.5\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        m.repair_published(100);
        assert!(m.render().contains("outbox_cdc_repair_rows_left 0\n"));
        assert_eq!(m.repair_rows(), 104);
    }

    #[test]
    fn each_stage_is_its_own_series() {
        let m = Metrics::default();
        m.stage(Stage::ProduceToAck, 0.003);
        m.stage(Stage::ProduceToAck, 0.2);
        m.stage(Stage::CommitToSend, 0.00005);
        let text = m.render();
        for line in [
            "outbox_cdc_stage_seconds_count{stage=\"produce_to_ack\"} 2\n",
            "outbox_cdc_stage_seconds_bucket{stage=\"produce_to_ack\",le=\"0.005\"} 1\n",
            "outbox_cdc_stage_seconds_bucket{stage=\"commit_to_send\",le=\"0.0001\"} 1\n",
            "outbox_cdc_stage_seconds_count{stage=\"ack_to_tracker\"} 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    /// Every `outbox_cdc_*` name in the alert rules and the dashboard is one the
    /// code exports.
    #[test]
    fn alert_rules_and_dashboard_name_only_exported_metrics() {
        let exported = exported_names(&populated().render());
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for (file, must_use) in [
            (
                "docs/alerts/prometheus-rules.yml",
                ["outbox_cdc_slot_lag_bytes", OLDEST_UNACKED_AGE, CONNECTED],
            ),
            (
                "docs/operations.md",
                [
                    "outbox_cdc_slot_lag_bytes",
                    "outbox_cdc_slot_safe_wal_size_bytes",
                    CONNECTED,
                ],
            ),
            (
                "docs/dashboards/outbox-cdc.json",
                [
                    "outbox_cdc_slot_lag_bytes",
                    OLDEST_UNACKED_AGE,
                    "outbox_cdc_commit_to_ack_seconds",
                ],
            ),
        ] {
            let text =
                std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            if file.ends_with(".json") {
                let parsed: Result<serde_json::Value, _> = serde_json::from_str(&text);
                assert!(parsed.is_ok(), "{file} is not JSON: {:?}", parsed.err());
            }
            let names = metric_names_in(&text);
            assert!(!names.is_empty(), "{file} names no metric");
            for name in &names {
                assert!(
                    exported.contains(name),
                    "{file} uses {name}, which the code does not export"
                );
            }
            for name in must_use {
                assert!(
                    names.iter().any(|n| n.starts_with(name)),
                    "{file} does not use {name}"
                );
            }
        }
    }

    fn metric_names_in(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("outbox_cdc_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            names.push(tail[..end].to_owned());
            rest = &tail[end..];
        }
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn metric_names_are_found_in_text() {
        assert_eq!(
            metric_names_in(
                "rate(outbox_cdc_events_published_total[5m]) > outbox_cdc_x_bucket{le=\"1\"}"
            ),
            vec![
                "outbox_cdc_events_published_total".to_owned(),
                "outbox_cdc_x_bucket".to_owned()
            ]
        );
    }

    #[test]
    fn lsn_gauges_only_move_forward() {
        let m = Metrics::default();
        m.set_acked(Lsn::new(100));
        m.set_acked(Lsn::new(50));
        assert_eq!(m.acked(), Lsn::new(100));
    }
}
