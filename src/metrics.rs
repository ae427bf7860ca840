//! Metrics: names and HELP text in one place, lock-free updates on the hot path,
//! Prometheus text exposition.
//!
//! Values are plain atomics; the pipeline and the slot poller write them, the
//! HTTP endpoint and `status` read them.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::pg::Lsn;

/// (name, type, help) for every exported metric.
pub const METRICS: &[(&str, &str, &str)] = &[
    (SLOT_LAG_BYTES, "gauge", "WAL bytes between pg_current_wal_lsn() and the slot's confirmed_flush_lsn."),
    (SLOT_RESTART_LAG_BYTES, "gauge", "WAL bytes between pg_current_wal_lsn() and the slot's restart_lsn (WAL the server retains for us)."),
    (SLOT_SAFE_WAL_SIZE_BYTES, "gauge", "The slot's safe_wal_size: bytes that can still be written before the slot is at risk (-1 when unlimited)."),
    (SLOT_WAL_STATUS, "gauge", "1 for the slot's current wal_status (reserved, extended, unreserved, lost)."),
    (RECEIVED_LSN, "gauge", "Highest WAL position received from the server, as a number."),
    (ACKED_LSN, "gauge", "Highest WAL position persisted locally and reported to the server as flushed, as a number."),
    (EVENTS_PUBLISHED, "counter", "Events acknowledged by Kafka."),
    (EVENTS_FAILED, "counter", "Events whose delivery to Kafka failed."),
    (EVENTS_DEDUPLICATED, "counter", "Events dropped on restart because their transaction was already acknowledged."),
    (EVENTS_DEAD_LETTERED, "counter", "Events published to the dead-letter topic."),
    (IN_FLIGHT_EVENTS, "gauge", "Events sent to Kafka and not yet acknowledged."),
    (IN_FLIGHT_BYTES, "gauge", "Bytes of events sent to Kafka and not yet acknowledged."),
    (OLDEST_UNACKED_AGE, "gauge", "Age in seconds of the commit time of the oldest transaction not yet acknowledged (0 when none)."),
    (COMMIT_TO_ACK, "histogram", "Seconds from a transaction's commit to Kafka acknowledging all of its events."),
    (CONNECTED, "gauge", "1 while the replication stream is connected and streaming."),
    (RECONNECTS, "counter", "Reconnects after a retryable failure."),
];

pub const SLOT_LAG_BYTES: &str = "outbox_cdc_slot_lag_bytes";
pub const SLOT_RESTART_LAG_BYTES: &str = "outbox_cdc_slot_restart_lag_bytes";
pub const SLOT_SAFE_WAL_SIZE_BYTES: &str = "outbox_cdc_slot_safe_wal_size_bytes";
pub const SLOT_WAL_STATUS: &str = "outbox_cdc_slot_wal_status";
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

/// All metrics of one process.
#[derive(Default)]
pub struct Metrics {
    pub slot_lag_bytes: AtomicI64,
    pub slot_restart_lag_bytes: AtomicI64,
    pub slot_safe_wal_size_bytes: AtomicI64,
    /// Index into `WAL_STATUSES`, or -1 when unknown.
    pub slot_wal_status: AtomicI64,
    pub received_lsn: AtomicU64,
    pub acked_lsn: AtomicU64,
    pub events_published: AtomicU64,
    pub events_failed: AtomicU64,
    pub events_deduplicated: AtomicU64,
    pub events_dead_lettered: AtomicU64,
    pub in_flight_events: AtomicU64,
    pub in_flight_bytes: AtomicU64,
    pub oldest_unacked_age_micros: AtomicU64,
    pub commit_to_ack: Histogram,
    pub connected: AtomicU64,
    pub reconnects: AtomicU64,
}

/// The values of pg_replication_slots.wal_status, in the order of their index.
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

impl Metrics {
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
                SLOT_RESTART_LAG_BYTES => sample(&mut out, name, geti(&self.slot_restart_lag_bytes)),
                SLOT_SAFE_WAL_SIZE_BYTES => sample(&mut out, name, geti(&self.slot_safe_wal_size_bytes)),
                SLOT_WAL_STATUS => {
                    let current = geti(&self.slot_wal_status);
                    for (i, status) in WAL_STATUSES.iter().enumerate() {
                        let _ = writeln!(out, "{name}{{status=\"{status}\"}} {}", u8::from(current == i as i64));
                    }
                }
                RECEIVED_LSN => sample(&mut out, name, get(&self.received_lsn)),
                ACKED_LSN => sample(&mut out, name, get(&self.acked_lsn)),
                EVENTS_PUBLISHED => sample(&mut out, name, get(&self.events_published)),
                EVENTS_FAILED => sample(&mut out, name, get(&self.events_failed)),
                EVENTS_DEDUPLICATED => sample(&mut out, name, get(&self.events_deduplicated)),
                EVENTS_DEAD_LETTERED => sample(&mut out, name, get(&self.events_dead_lettered)),
                IN_FLIGHT_EVENTS => sample(&mut out, name, get(&self.in_flight_events)),
                IN_FLIGHT_BYTES => sample(&mut out, name, get(&self.in_flight_bytes)),
                OLDEST_UNACKED_AGE => {
                    let _ = writeln!(out, "{name} {}", get(&self.oldest_unacked_age_micros) as f64 / 1e6);
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
                _ => {}
            }
        }
        out
    }
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
        let text = m.render();
        for (name, kind, _) in METRICS {
            assert!(text.contains(&format!("# HELP {name} ")), "{name} lacks HELP");
            assert!(text.contains(&format!("# TYPE {name} {kind}")), "{name} lacks TYPE");
            let has_sample = text.lines().any(|l| !l.starts_with('#') && l.starts_with(name));
            assert!(has_sample, "{name} has no sample");
        }
        assert!(text.contains("outbox_cdc_events_published_total 3\n"));
        assert!(text.contains("outbox_cdc_commit_to_ack_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("outbox_cdc_commit_to_ack_seconds_bucket{le=\"0.0025\"} 0\n"));
        assert!(text.contains("outbox_cdc_slot_wal_status{status=\"extended\"} 1\n"));
    }

    #[test]
    fn lsn_gauges_only_move_forward() {
        let m = Metrics::default();
        m.set_acked(Lsn::new(100));
        m.set_acked(Lsn::new(50));
        assert_eq!(m.acked(), Lsn::new(100));
    }
}
