//! What readiness is judged from, as the pipeline and its companions record
//! it (the session's end, the Kafka probe, open sequence gaps, the witness's
//! unpublished rows), and the names of the reasons and causes. Below
//! `metrics`, which carries the state to every writer, and `health`, which
//! judges it; it judges nothing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::config::HealthSettings;
use crate::pg::{Lsn, PgTimestamp};

/// The reasons, in the order the JSON body lists them.
pub const REASONS: [&str; 5] = [
    STREAMING,
    KAFKA_REACHABLE,
    ACKNOWLEDGING,
    SEQUENCE_GAPS,
    RECONCILED,
];
pub const STREAMING: &str = "streaming";
pub const KAFKA_REACHABLE: &str = "kafka_reachable";
pub const ACKNOWLEDGING: &str = "acknowledging";
pub const SEQUENCE_GAPS: &str = "sequence_gaps";
pub const RECONCILED: &str = "reconciled";

/// The causes of a reason that does not hold, as [`Reason::cause`] names them.
pub mod cause {
    /// streaming: the slot is held by another process (an HA standby waits).
    pub const SLOT_IN_USE: &str = "slot_in_use";
    /// streaming: the last session ended with an error; it reconnects.
    pub const SESSION_ERROR: &str = "session_error";
    /// streaming: the offset store's disk is full; it retries by itself.
    pub const DISK_FULL: &str = "disk_full";
    /// streaming: the first session is starting.
    pub const STARTING: &str = "starting";
    /// kafka_reachable: no recent answer to a metadata request.
    pub const KAFKA_UNREACHABLE: &str = "kafka_unreachable";
    /// acknowledging: the oldest unacknowledged event is older than the
    /// bound and Kafka has not acknowledged anything lately.
    pub const ACKNOWLEDGEMENT_OVERDUE: &str = "acknowledgement_overdue";
    /// acknowledging: the oldest unacknowledged event is older than the
    /// bound while Kafka acknowledges: a backlog is being worked through.
    pub const CATCHING_UP: &str = "catching_up";
    /// sequence_gaps: an aggregate misses numbers for longer than the bound.
    pub const SEQUENCE_GAP_OPEN: &str = "sequence_gap_open";
    /// reconciled: the live witness found committed rows the stream skipped
    /// and has not published them yet.
    pub const ROWS_NOT_REPUBLISHED: &str = "rows_not_republished";
}

/// Open gaps kept; beyond this, new ones are counted but not listed.
pub(crate) const MAX_OPEN_GAPS: usize = 1000;

/// Gaps opened while [`MAX_OPEN_GAPS`] were listed: counted, with the time
/// of the first. Their numbers are not kept, so no late commit closes them;
/// they stay until the process restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnlistedGaps {
    pub(crate) count: u64,
    pub(crate) since: Instant,
}

/// Why the stream is not up, from the last session's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotStreaming {
    /// The PID holding the slot, when that is why (the HA standby's wait).
    pub(crate) holder: Option<Option<i32>>,
    /// The offset store's disk is full.
    pub(crate) disk_full: bool,
    pub(crate) error: String,
}

#[derive(Debug, Default)]
pub(crate) struct KafkaProbe {
    pub(crate) last_ok: Option<Instant>,
    pub(crate) last_error: Option<(Instant, String)>,
}

/// Missed sequence numbers of one aggregate: `from..=to` did not arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenGap {
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) from: i64,
    pub(crate) to: i64,
    pub(crate) lsn: Lsn,
    pub(crate) since: Instant,
}

/// The state readiness is judged from, written by the pipeline and its
/// companions; part of `Metrics` so that every writer already has it.
#[derive(Debug)]
pub struct HealthState {
    pub(crate) settings: Mutex<HealthSettings>,
    pub(crate) slot: Mutex<String>,
    pub(crate) not_streaming: Mutex<Option<NotStreaming>>,
    pub(crate) kafka: Mutex<KafkaProbe>,
    /// Commit time (PostgreSQL microseconds) of the oldest unacknowledged
    /// transaction as the session last saw it; `i64::MIN`: none.
    pub(crate) oldest_unacked: AtomicI64,
    /// When Kafka last acknowledged an event (PostgreSQL microseconds);
    /// `i64::MIN`: never in this process.
    pub(crate) last_ack: AtomicI64,
    pub(crate) gaps: Mutex<Vec<OpenGap>>,
    pub(crate) unlisted_gaps: Mutex<Option<UnlistedGaps>>,
    /// `gaps.len()`, read without the lock on every event.
    pub(crate) open_gaps: AtomicUsize,
    /// Rows the live witness found missing and has not published yet.
    pub(crate) witness_unpublished: AtomicU64,
}

impl Default for HealthState {
    fn default() -> HealthState {
        HealthState {
            settings: Mutex::default(),
            slot: Mutex::default(),
            not_streaming: Mutex::default(),
            kafka: Mutex::default(),
            oldest_unacked: AtomicI64::new(i64::MIN),
            last_ack: AtomicI64::new(i64::MIN),
            gaps: Mutex::default(),
            unlisted_gaps: Mutex::default(),
            open_gaps: AtomicUsize::new(0),
            witness_unpublished: AtomicU64::new(0),
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
    pub(crate) fn session_ended(
        &self,
        holder: Option<Option<i32>>,
        disk_full: bool,
        error: String,
    ) {
        *lock(&self.not_streaming) = Some(NotStreaming {
            holder,
            disk_full,
            error,
        });
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

    /// An event of a transaction committed at `commit_time` goes to Kafka:
    /// the oldest waiting work when none is recorded. The session's tick
    /// records the tracker's oldest, but a send that waits for Kafka (a
    /// topic's metadata while the broker is down) keeps the tick from
    /// running, and the wait would count for nothing.
    pub(crate) fn waiting_since(&self, commit_time: PgTimestamp) {
        if self.oldest_unacked.load(Ordering::Relaxed) == i64::MIN {
            self.oldest_unacked.store(commit_time.0, Ordering::Relaxed);
        }
    }

    /// Kafka acknowledged an event now.
    pub(crate) fn acknowledged(&self) {
        self.last_ack.store(PgTimestamp::now().0, Ordering::Relaxed);
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
            let mut unlisted = lock(&self.unlisted_gaps);
            let counted = unlisted.get_or_insert(UnlistedGaps {
                count: 0,
                since: Instant::now(),
            });
            counted.count += 1;
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
