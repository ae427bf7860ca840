//! Liveness and readiness (`/health/live`, `/health/ready`): what the user
//! cares about, each reason named, judged from state the relay already keeps.
//!
//! Ready means all of:
//! - `streaming`: the replication stream from the slot is up (an HA standby
//!   waiting for the slot is live, not ready, and says so);
//! - `kafka_reachable`: a metadata request to Kafka succeeded recently (the
//!   probe runs next to the pipeline, every `health.kafka_probe_interval_ms`);
//! - `acknowledging`: the oldest unacknowledged event was committed less than
//!   `health.max_unacked_age_ms` ago (nothing unacknowledged is fine: no work;
//!   the cause says whether Kafka acknowledges meanwhile: a backlog);
//! - `sequence_gaps`: no aggregate has missed numbers for longer than
//!   `health.max_gap_open_ms` (a jump whose missing events did not follow).
//!
//! Each reason turns red within its bound and green again by itself when its
//! cause passes. `/health/ready` answers whoever reaches `http.listen`, so
//! its body lists every reason by name, with the name of the cause when it
//! does not hold ([`Readiness::public`]); the message that says what is wrong
//! and what to do names hosts, users, slots, aggregates and event ids, and is
//! only in the log and `outbox-cdc status` (`/health/ready/detail`, served to
//! this host alone). `/metrics` exports the same as `outbox_cdc_ready` and
//! `outbox_cdc_ready_reason{reason}`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::pg::PgTimestamp;

pub use crate::config::HealthSettings;
pub use crate::readiness::HealthState;
pub use crate::readiness::{
    ACKNOWLEDGING, KAFKA_REACHABLE, REASONS, RECONCILED, SEQUENCE_GAPS, STREAMING, cause,
};
use crate::readiness::{MAX_OPEN_GAPS, NotStreaming, OpenGap, lock};

/// One reason of readiness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    pub name: String,
    pub ok: bool,
    /// When it does not hold, why, as one of the names in [`cause`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// What holds, or what is wrong and what to do; empty in the public body.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The `/health/ready` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    pub reasons: Vec<Reason>,
}

impl Readiness {
    pub fn reason(&self, name: &str) -> Option<&Reason> {
        self.reasons.iter().find(|r| r.name == name)
    }

    /// What `/health/ready` shows whoever reaches it: each reason's name,
    /// whether it holds and the name of its cause; no message, which names
    /// hosts, users, slots, aggregates, event ids and error texts.
    pub fn public(&self) -> Readiness {
        Readiness {
            ready: self.ready,
            reasons: self
                .reasons
                .iter()
                .map(|r| Reason {
                    message: String::new(),
                    ..r.clone()
                })
                .collect(),
        }
    }
}

/// Judges readiness now from `metrics` and its health state, and sets
/// `outbox_cdc_ready` and `outbox_cdc_ready_reason` to match.
pub fn readiness(metrics: &Metrics) -> Readiness {
    let state = &metrics.health;
    let settings = state.settings();
    let now = Instant::now();
    // One lock at a time: each guard is dropped at the end of its statement.
    let (kafka_ok_age, kafka_error) = {
        let kafka = lock(&state.kafka);
        let error = kafka.last_error.as_ref();
        (
            kafka.last_ok.map(|t| now - t),
            error.map(|(t, e)| (now - *t, e.clone())),
        )
    };
    let slot = lock(&state.slot).clone();
    let not_streaming = lock(&state.not_streaming).clone();
    let gaps = lock(&state.gaps)
        .iter()
        .map(|g| (g.clone(), now - g.since))
        .collect();
    let inputs = Inputs {
        connected: metrics.is_connected(),
        slot,
        not_streaming,
        kafka_ok_age,
        kafka_error,
        unacked_age: age_since(state.oldest_unacked.load(Ordering::Relaxed)),
        last_ack_age: age_since(state.last_ack.load(Ordering::Relaxed)),
        gaps,
        unlisted_gaps: lock(&state.unlisted_gaps).map(|u| (u.count, now - u.since)),
        witness_unpublished: state.witness_unpublished.load(Ordering::Relaxed),
    };
    let readiness = judge(&inputs, &settings);
    metrics.set_readiness(
        readiness.ready,
        readiness.reasons.iter().map(|r| (r.name.as_str(), r.ok)),
    );
    readiness
}

/// How long ago `since` (PostgreSQL microseconds) was; `i64::MIN`: never.
fn age_since(since: i64) -> Option<Duration> {
    match since {
        i64::MIN => None,
        since => Some(Duration::from_micros(
            PgTimestamp::now().0.saturating_sub(since).max(0) as u64,
        )),
    }
}

/// Kafka acknowledged within this: it takes what is sent, and an old
/// unacknowledged event is a backlog being worked through.
const ACKNOWLEDGING_NOW: Duration = Duration::from_secs(10);

/// What readiness is judged from, at one moment.
struct Inputs {
    connected: bool,
    slot: String,
    not_streaming: Option<NotStreaming>,
    /// Since the last successful metadata request.
    kafka_ok_age: Option<Duration>,
    kafka_error: Option<(Duration, String)>,
    unacked_age: Option<Duration>,
    /// Since Kafka last acknowledged an event.
    last_ack_age: Option<Duration>,
    /// Open gaps with how long each has been open.
    gaps: Vec<(OpenGap, Duration)>,
    /// Gaps beyond the listed ones: how many, and how long since the first.
    unlisted_gaps: Option<(u64, Duration)>,
    witness_unpublished: u64,
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The pure decision.
fn judge(i: &Inputs, s: &HealthSettings) -> Readiness {
    let slot = if i.slot.is_empty() {
        "the replication slot".to_owned()
    } else {
        format!("replication slot {:?}", i.slot)
    };
    let streaming = match (&i.connected, &i.not_streaming) {
        (true, _) => (true, None, format!("streaming from {slot}")),
        (
            false,
            Some(NotStreaming {
                holder: Some(pid), ..
            }),
        ) => {
            let pid = pid.map_or_else(|| "another process".to_owned(), |p| format!("PID {p}"));
            (
                false,
                Some(cause::SLOT_IN_USE),
                format!(
                    "standby: {slot} is in use by {pid} (another outbox-cdc instance or a \
                     replication client); this instance starts streaming by itself once it is \
                     released. On an HA standby nothing is wrong; otherwise find the holder with \
                     SELECT active_pid FROM pg_replication_slots and stop it"
                ),
            )
        }
        (
            false,
            Some(NotStreaming {
                disk_full: true,
                error,
                ..
            }),
        ) => (
            false,
            Some(cause::DISK_FULL),
            format!(
                "not streaming: the offset store's disk is full ({error}). Nothing after the \
                 durable position is acknowledged; free space on offsets.path and the connector \
                 goes on by itself"
            ),
        ),
        (false, Some(NotStreaming { error, .. })) => (
            false,
            Some(cause::SESSION_ERROR),
            format!(
                "not streaming: the last session ended with: {error}. The connector reconnects \
                 with backoff by itself; if this lasts, run `outbox-cdc check` and see \
                 docs/operations.md, \"Readiness\""
            ),
        ),
        (false, None) => (
            false,
            Some(cause::STARTING),
            format!("not streaming yet: the session is starting (connecting to {slot})"),
        ),
    };
    let bound = s.kafka_bound();
    let kafka = match (i.kafka_ok_age, &i.kafka_error) {
        (Some(ok), err) if ok <= bound && err.as_ref().is_none_or(|(e, _)| *e >= ok) => (
            true,
            None,
            format!("Kafka answered a metadata request {} ago", secs(ok)),
        ),
        (ok, err) => {
            let last = ok.map_or_else(
                || "has not answered a metadata request yet".to_owned(),
                |ok| format!("last answered a metadata request {} ago", secs(ok)),
            );
            let error = err
                .as_ref()
                .map_or_else(String::new, |(_, e)| format!(" (last error: {e})"));
            (
                false,
                Some(cause::KAFKA_UNREACHABLE),
                format!(
                    "Kafka {last}{error}. Start or reach the brokers in kafka \
                     bootstrap.servers (network, listeners, TLS/SASL settings); events wait in \
                     the slot meanwhile and the connector resumes by itself"
                ),
            )
        }
    };
    let max_unacked = Duration::from_millis(s.max_unacked_age_ms);
    let acknowledging = match i.unacked_age {
        None => (true, None, "nothing is waiting for Kafka".to_owned()),
        Some(age) if age <= max_unacked => (
            true,
            None,
            format!(
                "the oldest unacknowledged event was committed {} ago (bound \
                 health.max_unacked_age_ms = {})",
                secs(age),
                s.max_unacked_age_ms
            ),
        ),
        Some(age) if i.last_ack_age.is_some_and(|a| a <= ACKNOWLEDGING_NOW) => (
            false,
            Some(cause::CATCHING_UP),
            format!(
                "the oldest unacknowledged event was committed {} ago, more than \
                 health.max_unacked_age_ms = {}, while Kafka acknowledges (the last event {} \
                 ago): the connector is working through a backlog (after an outage, a restart \
                 or a burst) and this clears once it has caught up. If the age keeps growing, \
                 the connector is slower than the writers: see slot lag and the tuning in \
                 docs/performance.md",
                secs(age),
                s.max_unacked_age_ms,
                secs(i.last_ack_age.unwrap_or_default())
            ),
        ),
        Some(age) => (
            false,
            Some(cause::ACKNOWLEDGEMENT_OVERDUE),
            format!(
                "the oldest unacknowledged event was committed {} ago, more than \
                 health.max_unacked_age_ms = {}: Kafka does not acknowledge (broker down or \
                 stalled, too few in-sync replicas for acks=all, throttling). Look at \
                 kafka_reachable, the log and the broker; the connector keeps retrying and \
                 this clears once Kafka acknowledges",
                secs(age),
                s.max_unacked_age_ms
            ),
        ),
    };
    let max_gap = Duration::from_millis(s.max_gap_open_ms);
    let overdue: Vec<&(OpenGap, Duration)> =
        i.gaps.iter().filter(|(_, open)| *open > max_gap).collect();
    let unlisted_overdue = i.unlisted_gaps.filter(|(_, open)| *open > max_gap);
    let gaps = match (overdue.first(), unlisted_overdue) {
        (None, Some((count, open))) => (
            false,
            Some(cause::SEQUENCE_GAP_OPEN),
            format!(
                "{count} sequence gap(s) opened while {MAX_OPEN_GAPS} others were listed, the first \
                 {} ago (health.max_gap_open_ms = {}); their numbers were not kept, so no late \
                 commit clears them. Events may be missing: the log names each jump (WARN \
                 \"aggregate sequence gap\"); find them with `outbox-cdc audit --since <time \
                 before the first>` and republish with `--repair`, then restart the connector to \
                 clear this",
                secs(open),
                s.max_gap_open_ms
            ),
        ),
        (None, None) if i.gaps.is_empty() && i.unlisted_gaps.is_none() => (
            true,
            None,
            "no aggregate misses sequence numbers".to_owned(),
        ),
        (None, None) => (
            true,
            None,
            format!(
                "{} open sequence gap(s), each younger than health.max_gap_open_ms = {}",
                i.gaps.len() as u64 + i.unlisted_gaps.map_or(0, |(n, _)| n),
                s.max_gap_open_ms
            ),
        ),
        (Some((g, open)), _) => (
            false,
            Some(cause::SEQUENCE_GAP_OPEN),
            format!(
                "{} sequence gap(s) open longer than health.max_gap_open_ms = {}; the oldest: \
                 aggregate {}/{} misses aggregate_sequence {}..={} for {} (the jump came at \
                 LSN {}). Events may be missing: find them with `outbox-cdc audit --since \
                 <time before the gap>` and republish with `--repair`, then restart the \
                 connector to clear this; a late commit of the missing numbers clears it by \
                 itself",
                overdue.len(),
                s.max_gap_open_ms,
                g.aggregate_type,
                g.aggregate_id,
                g.from,
                g.to,
                secs(*open),
                g.lsn
            ),
        ),
    };
    let reconciled = match i.witness_unpublished {
        0 => (
            true,
            None,
            "the live witness holds no row it found missing".to_owned(),
        ),
        n => (
            false,
            Some(cause::ROWS_NOT_REPUBLISHED),
            format!(
                "the live witness found {n} committed outbox row(s) the stream did not deliver and \
                 is publishing them from the table; the log names each (ERROR \"not delivered by \
                 the stream\"). This clears once they are in Kafka"
            ),
        ),
    };
    let reasons: Vec<Reason> = [
        (STREAMING, streaming),
        (KAFKA_REACHABLE, kafka),
        (ACKNOWLEDGING, acknowledging),
        (SEQUENCE_GAPS, gaps),
        (RECONCILED, reconciled),
    ]
    .into_iter()
    .map(|(name, (ok, cause, message))| Reason {
        name: name.to_owned(),
        ok,
        cause: cause.map(str::to_owned),
        message,
    })
    .collect();
    Readiness {
        ready: reasons.iter().all(|r| r.ok),
        reasons,
    }
}

/// Starts the Kafka probe: a metadata request every
/// `health.kafka_probe_interval_ms` on a client of its own; it returns when
/// `shutdown` turns true or its sender is dropped.
pub(crate) fn spawn_kafka_probe(
    config: std::sync::Arc<Config>,
    metrics: std::sync::Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let interval = config.health.probe_interval();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut probe = None;
        let mut failing = false;
        while crate::periodic::next_tick(&mut tick, &mut shutdown).await {
            if probe.is_none() {
                match crate::sink::MetadataProbe::new(&config.kafka) {
                    Ok(p) => probe = Some(p),
                    Err(e) => {
                        metrics.health.kafka_unreachable(e.to_string());
                        continue;
                    }
                }
            }
            let Some(p) = &probe else { continue };
            let outcome = tokio::select! {
                outcome = p.fetch(interval) => outcome,
                _ = shutdown.changed() => return,
            };
            match outcome {
                Ok(()) => {
                    metrics.health.kafka_reached();
                    if failing {
                        info!("Kafka probe: the brokers answer again");
                        failing = false;
                    }
                }
                Err(e) => {
                    metrics.health.kafka_unreachable(e.to_string());
                    if failing {
                        debug!(error = %e, "Kafka probe failed");
                    } else {
                        warn!(error = %e, "Kafka probe: no metadata from the brokers; readiness reason kafka_reachable turns red if this lasts");
                        failing = true;
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::Lsn;

    fn healthy() -> Inputs {
        Inputs {
            connected: true,
            slot: "s".into(),
            not_streaming: None,
            kafka_ok_age: Some(Duration::from_secs(1)),
            kafka_error: None,
            unacked_age: None,
            last_ack_age: None,
            gaps: Vec::new(),
            unlisted_gaps: None,
            witness_unpublished: 0,
        }
    }

    #[test]
    fn rows_the_witness_found_keep_readiness_red_until_published() {
        let mut i = healthy();
        i.witness_unpublished = 3;
        assert_eq!(red(&i), [RECONCILED]);
        let r = judge(&i, &HealthSettings::default());
        let reason = r.reason(RECONCILED).unwrap();
        assert_eq!(reason.cause.as_deref(), Some(cause::ROWS_NOT_REPUBLISHED));
        assert!(
            reason.message.contains("found 3 committed"),
            "{}",
            reason.message
        );
        i.witness_unpublished = 0;
        assert!(red(&i).is_empty());
    }

    fn red(i: &Inputs) -> Vec<String> {
        judge(i, &HealthSettings::default())
            .reasons
            .into_iter()
            .filter(|r| !r.ok)
            .map(|r| r.name)
            .collect()
    }

    #[test]
    fn every_reason_is_listed_and_all_green_is_ready() {
        let r = judge(&healthy(), &HealthSettings::default());
        assert!(r.ready, "{r:?}");
        let names: Vec<&str> = r.reasons.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, REASONS);
    }

    #[test]
    fn a_standby_says_who_holds_the_slot() {
        let mut i = healthy();
        i.connected = false;
        i.not_streaming = Some(NotStreaming {
            holder: Some(Some(4242)),
            disk_full: false,
            error: "x".into(),
        });
        let r = judge(&i, &HealthSettings::default());
        assert!(!r.ready);
        let m = &r.reason(STREAMING).unwrap().message;
        assert!(m.starts_with("standby:") && m.contains("PID 4242"), "{m}");
        assert_eq!(red(&i), [STREAMING]);
    }

    #[test]
    fn a_full_offsets_disk_is_its_own_cause() {
        let mut i = healthy();
        i.connected = false;
        i.not_streaming = Some(NotStreaming {
            holder: None,
            disk_full: true,
            error: "offset store /x: flush failed: No space left on device".into(),
        });
        let r = judge(&i, &HealthSettings::default());
        assert!(!r.ready);
        let reason = r.reason(STREAMING).unwrap();
        assert_eq!(reason.cause.as_deref(), Some(cause::DISK_FULL));
        assert!(
            reason.message.contains("free space on offsets.path"),
            "{}",
            reason.message
        );
        assert_eq!(red(&i), [STREAMING]);
    }

    #[test]
    fn kafka_is_red_when_the_last_answer_is_old_or_an_error_is_newer() {
        let mut i = healthy();
        i.kafka_ok_age = Some(Duration::from_secs(16));
        assert_eq!(red(&i), [KAFKA_REACHABLE]);
        i.kafka_ok_age = Some(Duration::from_secs(3));
        i.kafka_error = Some((Duration::from_secs(1), "timed out".into()));
        assert_eq!(red(&i), [KAFKA_REACHABLE]);
        i.kafka_error = Some((Duration::from_secs(4), "timed out".into()));
        assert!(red(&i).is_empty(), "an answer after the error");
        i.kafka_ok_age = None;
        assert_eq!(red(&i), [KAFKA_REACHABLE]);
    }

    /// Review H3: catching up a backlog older than the bound while Kafka
    /// acknowledges is not "Kafka does not acknowledge".
    #[test]
    fn an_old_backlog_while_kafka_acknowledges_is_catching_up() {
        let mut i = healthy();
        i.unacked_age = Some(Duration::from_secs(300));
        i.last_ack_age = Some(Duration::from_millis(20));
        let r = judge(&i, &HealthSettings::default());
        let reason = r.reason(ACKNOWLEDGING).unwrap();
        assert!(!reason.ok);
        assert_eq!(reason.cause.as_deref(), Some(cause::CATCHING_UP));
        assert!(
            reason.message.contains("working through a backlog")
                && !reason.message.contains("Kafka does not acknowledge"),
            "{}",
            reason.message
        );
        for silent in [None, Some(Duration::from_secs(11))] {
            i.last_ack_age = silent;
            let r = judge(&i, &HealthSettings::default());
            let reason = r.reason(ACKNOWLEDGING).unwrap();
            assert_eq!(
                reason.cause.as_deref(),
                Some(cause::ACKNOWLEDGEMENT_OVERDUE),
                "last ack {silent:?}"
            );
        }
    }

    /// The last acknowledgement reaches the judgement from `Metrics`.
    #[test]
    fn an_acknowledgement_is_recorded_for_readiness() {
        let metrics = Metrics::default();
        metrics.health.configure(&HealthSettings::default(), "s");
        metrics.health.unacked_age(300_000_000);
        let cause_now = |m: &Metrics| {
            readiness(m)
                .reason(ACKNOWLEDGING)
                .and_then(|r| r.cause.clone())
        };
        assert_eq!(
            cause_now(&metrics).as_deref(),
            Some(cause::ACKNOWLEDGEMENT_OVERDUE)
        );
        metrics.published(1_000);
        assert_eq!(cause_now(&metrics).as_deref(), Some(cause::CATCHING_UP));
    }

    #[test]
    fn acknowledging_is_judged_only_while_there_is_work() {
        let mut i = healthy();
        i.unacked_age = Some(Duration::from_secs(59));
        assert!(red(&i).is_empty());
        i.unacked_age = Some(Duration::from_secs(61));
        assert_eq!(red(&i), [ACKNOWLEDGING]);
    }

    #[test]
    fn gaps_turn_red_after_the_bound_and_close_when_filled() {
        let state = HealthState::default();
        state.gap_opened("order", "o-1", 2, 6, Lsn::new(16));
        state.sequence_arrived("order", "o-1", 4);
        state.sequence_arrived("order", "o-2", 3);
        let gaps: Vec<(i64, i64)> = lock(&state.gaps).iter().map(|g| (g.from, g.to)).collect();
        assert_eq!(gaps, [(3, 3), (5, 5)]);
        let mut i = healthy();
        i.gaps = lock(&state.gaps)
            .iter()
            .map(|g| (g.clone(), Duration::from_secs(61)))
            .collect();
        assert_eq!(red(&i), [SEQUENCE_GAPS]);
        let m = judge(&i, &HealthSettings::default());
        let m = &m.reason(SEQUENCE_GAPS).unwrap().message;
        assert!(
            m.contains("order/o-1 misses aggregate_sequence 3..=3"),
            "{m}"
        );
        state.sequence_arrived("order", "o-1", 3);
        state.sequence_arrived("order", "o-1", 5);
        assert_eq!(state.open_gaps.load(Ordering::Relaxed), 0);
    }

    /// Review H4: a gap opened while the list was full was forgotten, so
    /// readiness stayed green once the listed ones closed.
    #[test]
    fn gaps_beyond_the_listed_ones_are_counted_and_turn_red() {
        let metrics = Metrics::default();
        let settings = HealthSettings {
            max_gap_open_ms: 1,
            ..HealthSettings::default()
        };
        metrics.health.configure(&settings, "s");
        let state = &metrics.health;
        for n in 0..=MAX_OPEN_GAPS {
            state.gap_opened("order", &format!("o-{n}"), 1, 3, Lsn::new(16));
        }
        for n in 0..MAX_OPEN_GAPS {
            state.sequence_arrived("order", &format!("o-{n}"), 2);
        }
        assert_eq!(state.open_gaps.load(Ordering::Relaxed), 0);
        std::thread::sleep(Duration::from_millis(5));
        let r = readiness(&metrics);
        let gaps = r.reason(SEQUENCE_GAPS).unwrap();
        assert!(!gaps.ok, "{}", gaps.message);
        assert_eq!(gaps.cause.as_deref(), Some(cause::SEQUENCE_GAP_OPEN));
        assert!(
            gaps.message
                .starts_with("1 sequence gap(s) opened while 1000 others were listed"),
            "{}",
            gaps.message
        );
    }

    #[test]
    fn settings_name_their_key() {
        let e = HealthSettings {
            kafka_probe_interval_ms: 0,
            ..HealthSettings::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.key, "health.kafka_probe_interval_ms");
    }
}
