//! Metrics: names and HELP text in one place, lock-free updates on the hot path,
//! Prometheus text exposition.
//!
//! Values are plain atomics; the pipeline and the slot poller write them, the
//! HTTP endpoint and `status` read them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::checkpoint::DurableCommitTime;
use crate::pg::Lsn;

/// (name, type, help) for every exported metric.
pub const METRICS: &[(&str, &str, &str)] = &[
    (
        SLOT_LAG_BYTES,
        "gauge",
        "WAL bytes between pg_current_wal_lsn() and the slot's confirmed_flush_lsn (-1 while unknown or the slot is missing).",
    ),
    (
        SLOT_RESTART_LAG_BYTES,
        "gauge",
        "WAL bytes between pg_current_wal_lsn() and the slot's restart_lsn, i.e. WAL the server retains for us (-1 while unknown or the slot is missing).",
    ),
    (
        SLOT_SAFE_WAL_SIZE_BYTES,
        "gauge",
        "The slot's safe_wal_size: bytes that can still be written before the slot is at risk of being lost (-1 when unlimited, lost or unknown).",
    ),
    (
        SLOT_WAL_STATUS,
        "gauge",
        "1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others.",
    ),
    (
        SLOT_EXISTS,
        "gauge",
        "1 when the slot exists, 0 when the last poll found it missing, -1 before the first poll.",
    ),
    (
        SLOT_ACTIVE,
        "gauge",
        "1 when a backend streams from the slot (this instance or another), 0 when none, -1 before the first poll.",
    ),
    (
        SLOT_LAST_POLL,
        "gauge",
        "Unix time in seconds of the last successful slot poll (0 before the first).",
    ),
    (
        SLOT_POLL_ERRORS,
        "counter",
        "Slot polls that failed (connection or query errors); the poller reconnects by itself.",
    ),
    (
        HEARTBEATS,
        "counter",
        "Heartbeat messages written with pg_logical_emit_message.",
    ),
    (
        HEARTBEAT_ERRORS,
        "counter",
        "Heartbeats that failed; the heartbeat reconnects by itself.",
    ),
    (
        RECEIVED_LSN,
        "gauge",
        "Highest WAL position received from the server, as a number.",
    ),
    (
        ACKED_LSN,
        "gauge",
        "Highest WAL position persisted locally and reported to the server as flushed, as a number.",
    ),
    (EVENTS_PUBLISHED, "counter", "Events acknowledged by Kafka."),
    (
        EVENTS_FAILED,
        "counter",
        "Events whose delivery to Kafka failed.",
    ),
    (
        EVENTS_DEDUPLICATED,
        "counter",
        "Events dropped on restart because their transaction was already acknowledged.",
    ),
    (
        EVENTS_DEAD_LETTERED,
        "counter",
        "Events published to the dead-letter topic, by the topic they were meant for.",
    ),
    (
        IN_FLIGHT_EVENTS,
        "gauge",
        "Events sent to Kafka and not yet acknowledged.",
    ),
    (
        IN_FLIGHT_BYTES,
        "gauge",
        "Bytes of events sent to Kafka and not yet acknowledged.",
    ),
    (
        OLDEST_UNACKED_AGE,
        "gauge",
        "Age in seconds of the commit time of the oldest transaction not yet acknowledged (0 when none).",
    ),
    (
        COMMIT_TO_ACK,
        "histogram",
        "Seconds from a transaction's commit to Kafka acknowledging all of its events.",
    ),
    (
        CONNECTED,
        "gauge",
        "1 while the replication stream is connected and streaming.",
    ),
    (
        RECONNECTS,
        "counter",
        "Reconnects after a retryable failure.",
    ),
    (
        SEQUENCE_GAPS,
        "counter",
        "Events whose aggregate_sequence does not follow the aggregate's last published one (a jump, an old number again, or a first event above 1), by aggregate type.",
    ),
    (
        REPAIR_ROWS,
        "counter",
        "Retained outbox rows published again by gap repair after a lost slot.",
    ),
    (
        REPAIR_ROWS_LEFT,
        "gauge",
        "Rows the running gap repair has still to publish (0 when none runs).",
    ),
    (
        PRUNED_ROWS,
        "counter",
        "Outbox rows deleted by pruning ([prune] retention), by batch delete or partition drop.",
    ),
    (
        OUTBOX_ROWS,
        "gauge",
        "Estimated rows in the outbox table (pg_class.reltuples of the table or its partitions; -1 until pruning measured it).",
    ),
    (
        OUTBOX_BYTES,
        "gauge",
        "On-disk size of the outbox table with indexes and TOAST, partitions included (-1 until pruning measured it).",
    ),
    (
        OLDEST_RETAINED_AGE,
        "gauge",
        "Age in seconds of the oldest outbox row's occurred_at (0 when the table is empty, -1 until pruning measured it).",
    ),
];

pub const SLOT_LAG_BYTES: &str = "outbox_cdc_slot_lag_bytes";
pub const SLOT_RESTART_LAG_BYTES: &str = "outbox_cdc_slot_restart_lag_bytes";
pub const SLOT_SAFE_WAL_SIZE_BYTES: &str = "outbox_cdc_slot_safe_wal_size_bytes";
pub const SLOT_WAL_STATUS: &str = "outbox_cdc_slot_wal_status";
pub const SLOT_EXISTS: &str = "outbox_cdc_slot_exists";
pub const SLOT_ACTIVE: &str = "outbox_cdc_slot_active";
pub const SLOT_LAST_POLL: &str = "outbox_cdc_slot_last_poll_timestamp_seconds";
pub const SLOT_POLL_ERRORS: &str = "outbox_cdc_slot_poll_errors_total";
pub const HEARTBEATS: &str = "outbox_cdc_heartbeats_total";
pub const HEARTBEAT_ERRORS: &str = "outbox_cdc_heartbeat_errors_total";
pub const RECEIVED_LSN: &str = "outbox_cdc_received_lsn";
pub const ACKED_LSN: &str = "outbox_cdc_acked_lsn";
pub const EVENTS_PUBLISHED: &str = "outbox_cdc_events_published_total";
pub const EVENTS_FAILED: &str = "outbox_cdc_events_failed_total";
pub const EVENTS_DEDUPLICATED: &str = "outbox_cdc_events_deduplicated_total";
pub const EVENTS_DEAD_LETTERED: &str = "outbox_cdc_events_dead_lettered_total";
pub const IN_FLIGHT_EVENTS: &str = "outbox_cdc_in_flight_events";
pub const IN_FLIGHT_BYTES: &str = "outbox_cdc_in_flight_bytes";
pub const OLDEST_UNACKED_AGE: &str = "outbox_cdc_oldest_unacked_age_seconds";
pub const COMMIT_TO_ACK: &str = "outbox_cdc_commit_to_ack_seconds";
pub const CONNECTED: &str = "outbox_cdc_connected";
pub const RECONNECTS: &str = "outbox_cdc_reconnects_total";
pub const REPAIR_ROWS: &str = "outbox_cdc_repair_rows_total";
pub const SEQUENCE_GAPS: &str = "outbox_cdc_sequence_gaps_total";
pub const REPAIR_ROWS_LEFT: &str = "outbox_cdc_repair_rows_left";
pub const PRUNED_ROWS: &str = "outbox_cdc_pruned_rows_total";
pub const OUTBOX_ROWS: &str = "outbox_cdc_outbox_rows";
pub const OUTBOX_BYTES: &str = "outbox_cdc_outbox_bytes";
pub const OLDEST_RETAINED_AGE: &str = "outbox_cdc_oldest_retained_age_seconds";

/// Upper bounds of the commit-to-ack histogram buckets, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A fixed-bucket histogram of seconds, updated without locks.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe_micros(&self, micros: u64) {
        let secs = micros as f64 / 1e6;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// All metrics of one process. The slot gauges start at -1 (unknown) until the
/// first poll.
pub struct Metrics {
    pub slot_lag_bytes: AtomicI64,
    pub slot_restart_lag_bytes: AtomicI64,
    pub slot_safe_wal_size_bytes: AtomicI64,
    /// Index into `WAL_STATUSES`, or -1 when unknown.
    pub slot_wal_status: AtomicI64,
    pub slot_exists: AtomicI64,
    pub slot_active: AtomicI64,
    pub slot_last_poll_unix_ms: AtomicU64,
    pub slot_poll_errors: AtomicU64,
    pub heartbeats: AtomicU64,
    pub heartbeat_errors: AtomicU64,
    pub received_lsn: AtomicU64,
    pub acked_lsn: AtomicU64,
    pub events_published: AtomicU64,
    pub events_failed: AtomicU64,
    pub events_deduplicated: AtomicU64,
    /// Total dead-lettered events; [`Metrics::record_dead_lettered`] also keeps
    /// the count per original topic.
    pub events_dead_lettered: AtomicU64,
    dead_lettered_by_topic: Mutex<BTreeMap<String, u64>>,
    sequence_gaps_by_type: Mutex<BTreeMap<String, u64>>,
    pub in_flight_events: AtomicU64,
    pub in_flight_bytes: AtomicU64,
    pub oldest_unacked_age_micros: AtomicU64,
    pub commit_to_ack: Histogram,
    pub connected: AtomicU64,
    pub reconnects: AtomicU64,
    pub repair_rows: AtomicU64,
    pub repair_rows_left: AtomicU64,
    pub pruned_rows: AtomicU64,
    pub outbox_rows: AtomicI64,
    pub outbox_bytes: AtomicI64,
    /// Milliseconds; -1 while unknown.
    pub oldest_retained_age_ms: AtomicI64,
    /// Commit time of the last acknowledged transaction the session
    /// persisted: the pruner's bound while `run` holds the offset store.
    pub durable_commit_time: Arc<DurableCommitTime>,
}

/// The values of pg_replication_slots.wal_status, in the order of their index.
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            slot_lag_bytes: AtomicI64::new(-1),
            slot_restart_lag_bytes: AtomicI64::new(-1),
            slot_safe_wal_size_bytes: AtomicI64::new(-1),
            slot_wal_status: AtomicI64::new(-1),
            slot_exists: AtomicI64::new(-1),
            slot_active: AtomicI64::new(-1),
            slot_last_poll_unix_ms: AtomicU64::new(0),
            slot_poll_errors: AtomicU64::new(0),
            heartbeats: AtomicU64::new(0),
            heartbeat_errors: AtomicU64::new(0),
            received_lsn: AtomicU64::new(0),
            acked_lsn: AtomicU64::new(0),
            events_published: AtomicU64::new(0),
            events_failed: AtomicU64::new(0),
            events_deduplicated: AtomicU64::new(0),
            events_dead_lettered: AtomicU64::new(0),
            dead_lettered_by_topic: Mutex::new(BTreeMap::new()),
            sequence_gaps_by_type: Mutex::new(BTreeMap::new()),
            in_flight_events: AtomicU64::new(0),
            in_flight_bytes: AtomicU64::new(0),
            oldest_unacked_age_micros: AtomicU64::new(0),
            commit_to_ack: Histogram::default(),
            connected: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            repair_rows: AtomicU64::new(0),
            repair_rows_left: AtomicU64::new(0),
            pruned_rows: AtomicU64::new(0),
            outbox_rows: AtomicI64::new(-1),
            outbox_bytes: AtomicI64::new(-1),
            oldest_retained_age_ms: AtomicI64::new(-1),
            durable_commit_time: Arc::default(),
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

impl Metrics {
    /// Records a successful poll; `None` means the slot does not exist.
    pub fn set_slot(&self, slot: Option<&SlotGauges>, now_unix_ms: u64) {
        let as_gauge = |v: Option<u64>| v.map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX));
        let r = Ordering::Relaxed;
        match slot {
            Some(s) => {
                self.slot_lag_bytes.store(as_gauge(s.lag_bytes), r);
                self.slot_restart_lag_bytes
                    .store(as_gauge(s.restart_lag_bytes), r);
                self.slot_safe_wal_size_bytes
                    .store(s.safe_wal_size.unwrap_or(-1), r);
                self.set_wal_status(s.wal_status.as_deref());
                self.slot_exists.store(1, r);
                self.slot_active.store(i64::from(s.active), r);
            }
            None => {
                self.slot_lag_bytes.store(-1, r);
                self.slot_restart_lag_bytes.store(-1, r);
                self.slot_safe_wal_size_bytes.store(-1, r);
                self.set_wal_status(None);
                self.slot_exists.store(0, r);
                self.slot_active.store(0, r);
            }
        }
        self.slot_last_poll_unix_ms.store(now_unix_ms, r);
    }

    /// Counts one event published to the dead-letter topic instead of `original_topic`.
    pub fn record_dead_lettered(&self, original_topic: &str) {
        self.events_dead_lettered.fetch_add(1, Ordering::Relaxed);
        let mut by_topic = self
            .dead_lettered_by_topic
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *by_topic.entry(original_topic.to_owned()).or_default() += 1;
    }

    /// Counts a sequence gap of an aggregate of `aggregate_type`.
    pub fn record_sequence_gap(&self, aggregate_type: &str) {
        let mut by_type = self
            .sequence_gaps_by_type
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *by_type.entry(aggregate_type.to_owned()).or_default() += 1;
    }

    /// Sequence gaps counted for `aggregate_type`.
    pub fn sequence_gaps(&self, aggregate_type: &str) -> u64 {
        self.sequence_gaps_by_type
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(aggregate_type)
            .copied()
            .unwrap_or(0)
    }

    /// One event acknowledged by Kafka, `commit_to_ack_micros` after its commit.
    pub fn published(&self, commit_to_ack_micros: u64) {
        self.events_published.fetch_add(1, Ordering::Relaxed);
        self.commit_to_ack.observe_micros(commit_to_ack_micros);
    }

    /// One event not re-sent: its transaction was acknowledged before a restart.
    pub fn deduplicated(&self) {
        self.events_deduplicated.fetch_add(1, Ordering::Relaxed);
    }

    /// One event Kafka or the mapper refused.
    pub fn failed(&self) {
        self.events_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// What is in flight: events, their bytes, and the age of the oldest
    /// unacknowledged commit (0 when nothing is).
    pub fn set_in_flight(&self, events: usize, bytes: usize, oldest_age_micros: Option<u64>) {
        self.in_flight_events
            .store(events as u64, Ordering::Relaxed);
        self.in_flight_bytes.store(bytes as u64, Ordering::Relaxed);
        if let Some(age) = oldest_age_micros {
            self.oldest_unacked_age_micros.store(age, Ordering::Relaxed);
        }
    }

    /// Whether the replication stream is up (`/readyz`).
    pub fn set_connected(&self, connected: bool) {
        self.connected
            .store(i64::from(connected) as _, Ordering::Relaxed);
    }

    /// One reconnect after a retryable session failure.
    pub fn reconnecting(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_received(&self, lsn: Lsn) {
        self.received_lsn.fetch_max(lsn.as_u64(), Ordering::Relaxed);
    }

    pub fn set_acked(&self, lsn: Lsn) {
        self.acked_lsn.fetch_max(lsn.as_u64(), Ordering::Relaxed);
    }

    pub fn acked(&self) -> Lsn {
        Lsn::new(self.acked_lsn.load(Ordering::Relaxed))
    }

    pub fn set_wal_status(&self, status: Option<&str>) {
        let idx = status
            .and_then(|s| WAL_STATUSES.iter().position(|w| *w == s))
            .map_or(-1, |i| i as i64);
        self.slot_wal_status.store(idx, Ordering::Relaxed);
    }

    /// Prometheus text exposition format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let geti = |a: &AtomicI64| a.load(Ordering::Relaxed);
        for (name, kind, help) in METRICS {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            match *name {
                SLOT_LAG_BYTES => sample(&mut out, name, geti(&self.slot_lag_bytes)),
                SLOT_EXISTS => sample(&mut out, name, geti(&self.slot_exists)),
                SLOT_ACTIVE => sample(&mut out, name, geti(&self.slot_active)),
                SLOT_LAST_POLL => {
                    let _ = writeln!(
                        out,
                        "{name} {}",
                        get(&self.slot_last_poll_unix_ms) as f64 / 1e3
                    );
                }
                SLOT_POLL_ERRORS => sample(&mut out, name, get(&self.slot_poll_errors)),
                HEARTBEATS => sample(&mut out, name, get(&self.heartbeats)),
                HEARTBEAT_ERRORS => sample(&mut out, name, get(&self.heartbeat_errors)),
                SLOT_RESTART_LAG_BYTES => {
                    sample(&mut out, name, geti(&self.slot_restart_lag_bytes))
                }
                SLOT_SAFE_WAL_SIZE_BYTES => {
                    sample(&mut out, name, geti(&self.slot_safe_wal_size_bytes))
                }
                SLOT_WAL_STATUS => {
                    let current = geti(&self.slot_wal_status);
                    for (i, status) in WAL_STATUSES.iter().enumerate() {
                        let _ = writeln!(
                            out,
                            "{name}{{status=\"{status}\"}} {}",
                            u8::from(current == i as i64)
                        );
                    }
                }
                RECEIVED_LSN => sample(&mut out, name, get(&self.received_lsn)),
                ACKED_LSN => sample(&mut out, name, get(&self.acked_lsn)),
                EVENTS_PUBLISHED => sample(&mut out, name, get(&self.events_published)),
                EVENTS_FAILED => sample(&mut out, name, get(&self.events_failed)),
                EVENTS_DEDUPLICATED => sample(&mut out, name, get(&self.events_deduplicated)),
                EVENTS_DEAD_LETTERED => self.render_dead_lettered(&mut out, name),
                IN_FLIGHT_EVENTS => sample(&mut out, name, get(&self.in_flight_events)),
                IN_FLIGHT_BYTES => sample(&mut out, name, get(&self.in_flight_bytes)),
                OLDEST_UNACKED_AGE => {
                    let _ = writeln!(
                        out,
                        "{name} {}",
                        get(&self.oldest_unacked_age_micros) as f64 / 1e6
                    );
                }
                COMMIT_TO_ACK => {
                    let h = &self.commit_to_ack;
                    for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&h.buckets) {
                        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", get(bucket));
                    }
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", get(&h.count));
                    let _ = writeln!(out, "{name}_sum {}", get(&h.sum_micros) as f64 / 1e6);
                    let _ = writeln!(out, "{name}_count {}", get(&h.count));
                }
                CONNECTED => sample(&mut out, name, get(&self.connected)),
                RECONNECTS => sample(&mut out, name, get(&self.reconnects)),
                REPAIR_ROWS => sample(&mut out, name, get(&self.repair_rows)),
                SEQUENCE_GAPS => {
                    let by_type = self
                        .sequence_gaps_by_type
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    for (t, n) in &by_type {
                        let _ =
                            writeln!(out, "{name}{{aggregate_type=\"{}\"}} {n}", escape_label(t));
                    }
                }
                REPAIR_ROWS_LEFT => sample(&mut out, name, get(&self.repair_rows_left)),
                PRUNED_ROWS => sample(&mut out, name, get(&self.pruned_rows)),
                OUTBOX_ROWS => sample(&mut out, name, geti(&self.outbox_rows)),
                OUTBOX_BYTES => sample(&mut out, name, geti(&self.outbox_bytes)),
                OLDEST_RETAINED_AGE => match geti(&self.oldest_retained_age_ms) {
                    -1 => sample(&mut out, name, -1),
                    ms => sample(&mut out, name, ms as f64 / 1e3),
                },
                _ => {}
            }
        }
        out
    }

    /// One series per original topic. Events counted only in the total (without
    /// a topic) appear under `topic=""`. No series until the first one.
    fn render_dead_lettered(&self, out: &mut String, name: &str) {
        let total = self.events_dead_lettered.load(Ordering::Relaxed);
        let by_topic = self
            .dead_lettered_by_topic
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut labelled = 0u64;
        for (topic, n) in &by_topic {
            labelled += n;
            let _ = writeln!(out, "{name}{{topic=\"{}\"}} {n}", escape_label(topic));
        }
        if total > labelled {
            let _ = writeln!(out, "{name}{{topic=\"\"}} {}", total - labelled);
        }
    }
}

/// Label values escape backslash, double quote and newline (text format 0.0.4).
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn sample(out: &mut String, name: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{name} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_help_type_and_a_sample() {
        let m = Metrics::default();
        m.events_published.fetch_add(3, Ordering::Relaxed);
        m.commit_to_ack.observe_micros(4_000);
        m.set_wal_status(Some("extended"));
        m.record_dead_lettered("t.order");
        m.record_sequence_gap("order");
        m.record_sequence_gap("order");
        let text = m.render();
        for (name, kind, _) in METRICS {
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} lacks HELP"
            );
            assert!(
                text.contains(&format!("# TYPE {name} {kind}")),
                "{name} lacks TYPE"
            );
            let has_sample = text
                .lines()
                .any(|l| !l.starts_with('#') && l.starts_with(name));
            assert!(has_sample, "{name} has no sample");
        }
        assert!(text.contains("outbox_cdc_events_published_total 3\n"));
        assert!(text.contains("outbox_cdc_sequence_gaps_total{aggregate_type=\"order\"} 2\n"));
        assert!(text.contains("outbox_cdc_commit_to_ack_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("outbox_cdc_commit_to_ack_seconds_bucket{le=\"0.0025\"} 0\n"));
        assert!(text.contains("outbox_cdc_slot_wal_status{status=\"extended\"} 1\n"));
    }

    #[test]
    fn slot_gauges_are_unknown_until_polled_then_follow_the_slot() {
        let m = Metrics::default();
        let text = m.render();
        assert!(text.contains("outbox_cdc_slot_lag_bytes -1\n"), "{text}");
        assert!(text.contains("outbox_cdc_slot_exists -1\n"));
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
                .any(|l| l.starts_with(EVENTS_DEAD_LETTERED)),
            "no series before the first"
        );
        m.record_dead_lettered("orders");
        m.record_dead_lettered("orders");
        m.record_dead_lettered("we\"ird");
        m.events_dead_lettered.fetch_add(1, Ordering::Relaxed);
        let text = m.render();
        assert!(
            text.contains("outbox_cdc_events_dead_lettered_total{topic=\"orders\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("outbox_cdc_events_dead_lettered_total{topic=\"we\\\"ird\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("outbox_cdc_events_dead_lettered_total{topic=\"\"} 1\n"),
            "{text}"
        );
    }

    /// Every `outbox_cdc_*` name in the alert rules and the dashboard is one the
    /// code exports (histograms also as `_bucket`, `_sum`, `_count`).
    #[test]
    fn alert_rules_and_dashboard_name_only_exported_metrics() {
        let mut exported: Vec<String> = Vec::new();
        for (name, kind, _) in METRICS {
            exported.push((*name).to_owned());
            if *kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    exported.push(format!("{name}{suffix}"));
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for (file, must_use) in [
            (
                "docs/alerts/prometheus-rules.yml",
                [SLOT_LAG_BYTES, OLDEST_UNACKED_AGE, CONNECTED],
            ),
            (
                "docs/operations.md",
                [SLOT_LAG_BYTES, SLOT_SAFE_WAL_SIZE_BYTES, CONNECTED],
            ),
            (
                "docs/dashboards/outbox-cdc.json",
                [SLOT_LAG_BYTES, OLDEST_UNACKED_AGE, COMMIT_TO_ACK],
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
