//! Why a run or one of its sessions ended (`PipelineError`), classified for
//! the reconnect decision, with the errors it carries that belong to no
//! lower layer: a refused start (`refused`), a sequence gap, a spill
//! failure. Below the pipeline and `retained`, which both fail with it.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::Disposition;
use crate::checkpoint::StoreError;
use crate::coverage::{NotCovered, Unaccounted};
use crate::outbox::MapError;
use crate::pg::{Lsn, PgError};
use crate::pgoutput::DecodeError;
use crate::sink::SinkError;

mod refused;

pub use refused::StartRefused;

/// Why the spill failed; the path says where.
#[derive(Debug, thiserror::Error)]
#[error("spill of streamed transactions at {}: {source}", path.display())]
pub struct SpillError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// What kind of break in an aggregate's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapKind {
    /// N then N+2 or more.
    Jump,
    /// A number at or below the last published one, not a replay.
    Repeat,
    /// The first event of an aggregate numbered above 1.
    FirstAboveOne,
}

/// A break in one aggregate's numbering.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "aggregate {aggregate_type}/{aggregate_id}: aggregate_sequence {got} at LSN {lsn} after {} ({kind:?}); \
     events of this aggregate may be missing. Check with the outbox table (docs/operations.md, \"After an \
     incident\"); set audit.on_gap = \"warn\" to go on, or audit.sequences = \"increasing\" / \"off\" for writers \
     that do not number consecutively",
    previous.map_or_else(|| "none".to_owned(), |p| p.to_string())
)]
pub struct SequenceGap {
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub previous: Option<i64>,
    pub got: i64,
    pub lsn: Lsn,
    pub kind: GapKind,
}

/// Why a session ended, classified for the reconnect decision.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Refused(#[from] StartRefused),
    #[error("PostgreSQL: {0}")]
    Pg(#[from] PgError),
    #[error("Kafka: {0}")]
    Sink(#[from] SinkError),
    #[error("offset store: {0}")]
    Store(#[from] StoreError),
    /// The local spill of streamed transactions could not be written or read
    /// (a full or failing disk under [offsets] path): retried, since the
    /// server sends those transactions again.
    #[error("{0}; check the disk under [offsets] path")]
    Spill(#[from] SpillError),
    #[error("cannot decode pgoutput message at LSN {lsn}: {source}")]
    Decode {
        lsn: Lsn,
        #[source]
        source: DecodeError,
    },
    /// The replication stream broke the protocol (e.g. a Commit without Begin).
    #[error("protocol violation at LSN {lsn}: {what}")]
    Protocol { lsn: Lsn, what: String },
    /// An `[outbox]` setting the relay cannot run with; the error names the key.
    #[error("{source}; correct it in the configuration and restart")]
    Config {
        #[from]
        source: crate::outbox::ConfigError,
    },
    /// A task of the relay itself ended without an answer (it panicked, or
    /// was cancelled while the runtime shut down).
    #[error(
        "internal failure: {what}. Unless the process was shutting down this is a bug in \
         outbox-cdc: report it with this log"
    )]
    Internal { what: String },
    #[error(
        "poison event {event_id} at LSN {lsn} (on_poison = fail): {reason}. \
         Fix or remove the row's cause and restart, or set outbox.on_poison = \"dead-letter\""
    )]
    Poison {
        event_id: String,
        lsn: Lsn,
        reason: String,
        /// The sink's error when Kafka refused the record (e.g.
        /// [`SinkError::TopicMissing`]); `None` when the row could not be mapped.
        refusal: Option<Box<SinkError>>,
    },
    #[error("outbox mapping at LSN {lsn}: {source}")]
    Mapping {
        lsn: Lsn,
        #[source]
        source: MapError,
    },
    #[error("Kafka delivery of event {event_id} (LSN {lsn}) failed: {source}")]
    Delivery {
        event_id: String,
        lsn: Lsn,
        #[source]
        source: SinkError,
    },
    #[error(
        "Kafka refused event at LSN {lsn} for good ({reason}); aggregate {aggregate_type}/{aggregate_id} is parked \
         and the stream restarts from the durable LSN to dead-letter it"
    )]
    Parked {
        aggregate_type: String,
        aggregate_id: String,
        lsn: Lsn,
        reason: String,
    },
    #[error("the replication stream ended (server closed the copy)")]
    StreamEnded,
    /// Start refused: the publication does not prove it carries every outbox row.
    #[error(transparent)]
    NotCovered(#[from] NotCovered),
    /// A break in an aggregate's numbering under `audit.on_gap = "stop"`.
    #[error(transparent)]
    SequenceGap(#[from] SequenceGap),
    /// Gap repair cannot start safely; the operator decides.
    #[error("gap repair refused: {reason}. Fix: {fix}")]
    RepairRefused { reason: String, fix: String },
    /// The publication stopped covering the outbox while streaming.
    #[error(
        "the publication stopped carrying every outbox row while streaming: PostgreSQL does not send rows \
         committed after such a change, so some may never be published. {0}\n\
         Where the change may have hidden rows it is recorded in the offset store as a coverage break: \
         every start refuses, naming the `outbox-cdc audit ... --repair` that republishes them \
         (docs/operations.md, \"Publication changed while streaming\")"
    )]
    CoverageLost(NotCovered),
    /// A relation in the stream that is neither the outbox nor positively
    /// another table: stopped before acknowledging past it.
    #[error(transparent)]
    Unaccounted(#[from] Unaccounted),
    /// Exactly-once: one PostgreSQL transaction kept a Kafka transaction open
    /// for most of its timeout; it cannot be published whole in one.
    #[error(
        "the PostgreSQL transaction after LSN {after} has kept a Kafka transaction open for {open_for:?} \
         ({events} events so far), three quarters of delivery.transaction_timeout_ms ({timeout_ms}): \
         it cannot be published in one Kafka transaction. Raise delivery.transaction_timeout_ms (at most \
         the broker's transaction.max.timeout.ms, default 900000) and, if Kafka is slow to take the \
         records, limits.max_in_flight_events; then restart"
    )]
    TransactionTooLarge {
        after: Lsn,
        events: usize,
        open_for: Duration,
        timeout_ms: u64,
    },
    /// Exactly-once: Kafka stopped acknowledging the records of the open
    /// Kafka transaction while one PostgreSQL transaction kept it open; it is
    /// aborted and the session retries (a broker outage passes by itself).
    #[error(
        "Kafka acknowledged none of the {undelivered} outstanding records (of {events}) of the open Kafka \
         transaction for {stalled_for:?} while the PostgreSQL transaction after LSN {after} kept it open: \
         the broker is unreachable or stalled. The Kafka transaction is aborted and the session restarts \
         from the durable acknowledged LSN"
    )]
    KafkaStalled {
        after: Lsn,
        events: usize,
        undelivered: usize,
        stalled_for: Duration,
    },
    /// Another instance is repairing the slot's gap (it holds the slot's
    /// advisory lock): streaming now would publish newer events before the
    /// repaired older ones.
    #[error(
        "a gap repair of replication slot {slot:?} is running in another outbox-cdc instance (it holds the \
         slot's advisory lock): waiting for it to finish; retrying"
    )]
    RepairRunning { slot: String },
    /// The live witness could not audit a stored coverage break's window
    /// (Kafka unreachable): the start tries again.
    #[error("repairing a stored coverage break failed: {what}; retrying")]
    BreakRepair { what: String },
    /// Exactly-once: another process streams from the slot; this one waits
    /// instead of fencing it (the HA standby's wait).
    #[error(
        "replication slot {slot:?} is in use by PID {pid}: exactly-once delivery starts its transactional \
         producer only once the slot is free (starting it would fence the instance that streams); retrying"
    )]
    SlotBusy { slot: String, pid: i32 },
    /// The slot exists without a confirmed position: it is still being
    /// created (by `pid`, or by a walsender whose client died).
    #[error(
        "replication slot {slot:?} is still being created (creator PID {pid:?}): a logical slot gets its \
         position once the transactions running at its creation have ended; retrying"
    )]
    SlotNotReady { slot: String, pid: Option<i32> },
}

impl PipelineError {
    /// The PID holding the slot, when that ended the session (`Some(None)`:
    /// held by a process the server did not name): readiness says the slot
    /// is in use, as an HA standby's wait.
    pub fn slot_holder(&self) -> Option<Option<i32>> {
        match self {
            PipelineError::Pg(PgError::SlotActive { pid, .. }) => Some(*pid),
            PipelineError::SlotBusy { pid, .. } => Some(Some(*pid)),
            _ => None,
        }
    }

    /// Whether the offset store's disk is full: readiness names it, and the
    /// store is opened again for the next session.
    pub fn disk_full(&self) -> bool {
        matches!(self, PipelineError::Store(e) if e.is_disk_full())
    }

    /// Whether a new session (after a backoff) may cure this: the one place
    /// that decides for the reconnect loop. Never `RecordRefused`: the poison
    /// policy has had its say before an error ends a session, so a refusal
    /// that gets here stops.
    pub fn disposition(&self) -> Disposition {
        use Disposition::{RecordRefused, Retry, Stop};
        match self {
            PipelineError::Pg(e) => e.disposition(),
            PipelineError::Sink(e) => match e.disposition() {
                Retry => Retry,
                RecordRefused | Stop => Stop,
            },
            PipelineError::Store(e) => e.disposition(),
            PipelineError::Decode { source, .. } => source.disposition(),
            // The record was not refused: producing it again from the durable
            // LSN (with a new producer, if this one broke) may succeed.
            PipelineError::Delivery { source, .. } => match source.disposition() {
                RecordRefused => Stop,
                Retry | Stop => Retry,
            },
            PipelineError::StreamEnded
            | PipelineError::Spill(_)
            | PipelineError::Parked { .. }
            | PipelineError::SlotBusy { .. }
            | PipelineError::SlotNotReady { .. }
            | PipelineError::RepairRunning { .. }
            | PipelineError::BreakRepair { .. }
            | PipelineError::KafkaStalled { .. } => Retry,
            PipelineError::Refused(_)
            | PipelineError::Protocol { .. }
            | PipelineError::Config { .. }
            | PipelineError::Internal { .. }
            | PipelineError::Poison { .. }
            | PipelineError::Mapping { .. }
            | PipelineError::NotCovered(_)
            | PipelineError::CoverageLost(_)
            | PipelineError::RepairRefused { .. }
            | PipelineError::SequenceGap(_)
            | PipelineError::Unaccounted(_)
            | PipelineError::TransactionTooLarge { .. } => Stop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode as C;

    fn sink(code: C) -> SinkError {
        SinkError::Produce {
            code,
            topic: "t".into(),
            event_id: "e".into(),
        }
    }

    fn delivery(source: SinkError) -> PipelineError {
        PipelineError::Delivery {
            event_id: "e".into(),
            lsn: Lsn::new(1),
            source,
        }
    }

    fn server(code: &str) -> Box<crate::pg::ServerError> {
        Box::new(crate::pg::ServerError {
            severity: "ERROR".into(),
            code: code.into(),
            message: "m".into(),
            detail: None,
            hint: None,
        })
    }

    fn store_error(locked: bool) -> PipelineError {
        let (path, source) = ("p".into(), sled::Error::Unsupported("x".into()));
        PipelineError::Store(match locked {
            true => StoreError::Locked { path, source },
            false => StoreError::Open { path, source },
        })
    }

    fn bad_table() -> crate::outbox::ConfigError {
        crate::outbox::ConfigError {
            key: "outbox.table".into(),
            value: "a.b.c".into(),
            allowed: "`name` or `schema.name`".into(),
        }
    }

    #[test]
    fn invalid_outbox_settings_are_config_errors_naming_the_key() {
        let e = PipelineError::from(bad_table());
        assert!(matches!(&e, PipelineError::Config { source } if source.key == "outbox.table"));
        let text = e.to_string();
        assert!(
            text.contains("outbox.table") && text.contains("\"a.b.c\"") && !text.contains("LSN"),
            "{text}"
        );
    }

    /// The reconnect loop's truth table. It is the one `is_retryable` gave
    /// before `disposition()` replaced it (checked against it when it came in).
    #[test]
    fn dispositions_of_kafka_and_postgres_failures() {
        use Disposition::{Retry, Stop};
        let rows = [
            // Kafka: a refused record that reaches the loop stops (the poison
            // policy already had its say); a broken producer retries.
            (PipelineError::Sink(sink(C::MessageTimedOut)), Retry),
            (
                PipelineError::Sink(sink(C::OutOfOrderSequenceNumber)),
                Retry,
            ),
            (PipelineError::Sink(sink(C::MessageSizeTooLarge)), Stop),
            (PipelineError::Sink(sink(C::Fail)), Stop),
            // A delivery failure that is not a refusal always retries.
            (delivery(sink(C::MessageTimedOut)), Retry),
            (delivery(sink(C::Fail)), Retry),
            (delivery(sink(C::MessageSizeTooLarge)), Stop),
            (
                PipelineError::Pg(PgError::SlotActive {
                    slot: "s".into(),
                    pid: Some(7),
                    server: server("55006"),
                }),
                Retry,
            ),
            (
                PipelineError::Pg(PgError::Server {
                    addr: "a".into(),
                    during: "d".into(),
                    server: server("57P01"),
                }),
                Retry,
            ),
            (
                PipelineError::Pg(PgError::SlotMissing {
                    slot: "s".into(),
                    server: server("42704"),
                }),
                Stop,
            ),
        ];
        assert_dispositions(rows);
    }

    #[test]
    fn dispositions_of_store_session_and_transaction_failures() {
        use Disposition::{Retry, Stop};
        let rows = [
            (store_error(true), Retry),
            (store_error(false), Stop),
            (PipelineError::StreamEnded, Retry),
            (
                PipelineError::Parked {
                    aggregate_type: "a".into(),
                    aggregate_id: "1".into(),
                    lsn: Lsn::new(1),
                    reason: "r".into(),
                },
                Retry,
            ),
            (
                PipelineError::Protocol {
                    lsn: Lsn::new(1),
                    what: "w".into(),
                },
                Stop,
            ),
            (
                PipelineError::Poison {
                    event_id: "e".into(),
                    lsn: Lsn::new(1),
                    reason: "r".into(),
                    refusal: None,
                },
                Stop,
            ),
            (
                PipelineError::RepairRefused {
                    reason: "r".into(),
                    fix: "f".into(),
                },
                Stop,
            ),
            // Exactly-once, audit F9: a broker that stopped acknowledging
            // inside a large transaction retries; a transaction that did not
            // fit while Kafka kept acknowledging stops with the limits to raise.
            (
                PipelineError::KafkaStalled {
                    after: Lsn::new(1),
                    events: 100,
                    undelivered: 100,
                    stalled_for: Duration::from_secs(45),
                },
                Retry,
            ),
            (
                PipelineError::TransactionTooLarge {
                    after: Lsn::new(1),
                    events: 100,
                    open_for: Duration::from_secs(45),
                    timeout_ms: 60_000,
                },
                Stop,
            ),
            (
                PipelineError::Sink(SinkError::OffsetsTopicUnavailable {
                    topic: "o".into(),
                    reason: "r".into(),
                }),
                Retry,
            ),
            // Reported as Protocol (which stops) before they had variants.
            (PipelineError::from(bad_table()), Stop),
            (PipelineError::Internal { what: "w".into() }, Stop),
        ];
        assert_dispositions(rows);
    }

    fn assert_dispositions(rows: impl IntoIterator<Item = (PipelineError, Disposition)>) {
        for (e, want) in rows {
            assert_eq!(e.disposition(), want, "{e:?}");
        }
    }
}
