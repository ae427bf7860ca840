//! What readiness is judged from, as the pipeline and its companions record
//! it (the session's end, the Kafka probe, open sequence gaps, the witness's
//! unpublished rows). Below `metrics`, which carries it to every writer;
//! judged in `health`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::config::HealthSettings;
use crate::pg::{Lsn, PgTimestamp};

/// Open gaps kept; beyond this, new ones are counted but not listed.
const MAX_OPEN_GAPS: usize = 1000;

/// Why the stream is not up, from the last session's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NotStreaming {
    /// The PID holding the slot, when that is why (the HA standby's wait).
    pub(super) holder: Option<Option<i32>>,
    pub(super) error: String,
}

#[derive(Debug, Default)]
pub(super) struct KafkaProbe {
    pub(super) last_ok: Option<Instant>,
    pub(super) last_error: Option<(Instant, String)>,
}

/// Missed sequence numbers of one aggregate: `from..=to` did not arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OpenGap {
    pub(super) aggregate_type: String,
    pub(super) aggregate_id: String,
    pub(super) from: i64,
    pub(super) to: i64,
    pub(super) lsn: Lsn,
    pub(super) since: Instant,
}

/// The state readiness is judged from, written by the pipeline and its
/// companions; part of `Metrics` so that every writer already has it.
#[derive(Debug)]
pub struct HealthState {
    pub(super) settings: Mutex<HealthSettings>,
    pub(super) slot: Mutex<String>,
    pub(super) not_streaming: Mutex<Option<NotStreaming>>,
    pub(super) kafka: Mutex<KafkaProbe>,
    /// Commit time (PostgreSQL microseconds) of the oldest unacknowledged
    /// transaction as the session last saw it; `i64::MIN`: none.
    pub(super) oldest_unacked: AtomicI64,
    pub(super) gaps: Mutex<Vec<OpenGap>>,
    /// `gaps.len()`, read without the lock on every event.
    pub(super) open_gaps: AtomicUsize,
    /// Rows the live witness found missing and has not published yet.
    pub(super) witness_unpublished: AtomicU64,
}

impl Default for HealthState {
    fn default() -> HealthState {
        HealthState {
            settings: Mutex::default(),
            slot: Mutex::default(),
            not_streaming: Mutex::default(),
            kafka: Mutex::default(),
            oldest_unacked: AtomicI64::new(i64::MIN),
            gaps: Mutex::default(),
            open_gaps: AtomicUsize::new(0),
            witness_unpublished: AtomicU64::new(0),
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl HealthState {
    /// The bounds and slot name of this run (`relay::run`).
    pub fn configure(&self, settings: &HealthSettings, slot: &str) {
        *lock(&self.settings) = settings.clone();
        *lock(&self.slot) = slot.to_owned();
    }

    pub fn settings(&self) -> HealthSettings {
        lock(&self.settings).clone()
    }

    /// A session ended with `error` (the stream is down until the next one);
    /// `holder`: the PID holding the slot, when that is why (`Some(None)`:
    /// held, by a process the server did not name).
    pub(crate) fn session_ended(&self, holder: Option<Option<i32>>, error: String) {
        *lock(&self.not_streaming) = Some(NotStreaming { holder, error });
    }

    /// Kafka answered a metadata request.
    pub fn kafka_reached(&self) {
        lock(&self.kafka).last_ok = Some(Instant::now());
    }

    /// A metadata request to Kafka failed.
    pub fn kafka_unreachable(&self, error: String) {
        lock(&self.kafka).last_error = Some((Instant::now(), error));
    }

    /// The oldest unacknowledged transaction is `age_micros` old (0: none).
    pub(crate) fn unacked_age(&self, age_micros: u64) {
        let since = if age_micros == 0 {
            i64::MIN
        } else {
            PgTimestamp::now().0.saturating_sub(age_micros as i64)
        };
        self.oldest_unacked.store(since, Ordering::Relaxed);
    }

    /// An aggregate jumped from `last` to `got`: the numbers between are missing.
    pub(crate) fn gap_opened(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        last: i64,
        got: i64,
        lsn: Lsn,
    ) {
        let mut gaps = lock(&self.gaps);
        if gaps.len() >= MAX_OPEN_GAPS {
            return;
        }
        gaps.push(OpenGap {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            from: last + 1,
            to: got - 1,
            lsn,
            since: Instant::now(),
        });
        self.open_gaps.store(gaps.len(), Ordering::Relaxed);
    }

    /// An aggregate's event numbered `seq` is published: it closes what it
    /// fills of an open gap (a writer that committed it late).
    pub(crate) fn sequence_arrived(&self, aggregate_type: &str, aggregate_id: &str, seq: i64) {
        if self.open_gaps.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut gaps = lock(&self.gaps);
        let mut split = None;
        for gap in gaps.iter_mut() {
            let fills = gap.aggregate_id == aggregate_id
                && gap.aggregate_type == aggregate_type
                && (gap.from..=gap.to).contains(&seq);
            if !fills {
                continue;
            }
            if seq > gap.from && seq < gap.to {
                let mut upper = gap.clone();
                upper.from = seq + 1;
                split = Some(upper);
                gap.to = seq - 1;
            } else if seq == gap.from {
                gap.from += 1;
            } else {
                gap.to -= 1;
            }
        }
        gaps.extend(split);
        gaps.retain(|g| g.from <= g.to);
        self.open_gaps.store(gaps.len(), Ordering::Relaxed);
    }

    /// The live witness holds `rows` found missing and not yet published (0: none).
    pub(crate) fn witness_unpublished(&self, rows: u64) {
        self.witness_unpublished.store(rows, Ordering::Relaxed);
    }
}
