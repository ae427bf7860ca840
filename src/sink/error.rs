//! The sink's one error type, and its one answer: [`SinkError::disposition`].
//!
//! Classification is by librdkafka error code only (never by message text),
//! into three disjoint sets of codes:
//!
//! * transient (`retryable_code`): the cluster is unreachable, a leader is
//!   moving, replicas are missing, a request or the delivery timed out.
//!   Nothing is wrong with the record: the pipeline reconnects from the
//!   durable acked LSN with backoff and produces the same records again.
//! * refusing (`poison_code`): this record can never be accepted (too large,
//!   topic denied, invalid or missing) while other records may. The poison
//!   policy (`fail` or `dead-letter`) decides, also when the refusal broke
//!   the producer: with `enable.gapless.guarantee` a refused record in a batch
//!   is fatal, so nothing after it is written.
//! * producer-breaking (`fatal_code`): the idempotent producer itself is
//!   broken (out-of-order sequence, fenced epoch). Retrying on the same
//!   producer cannot help; a new session creates a new
//!   [`KafkaSink`](super::KafkaSink) and resumes from the durable acked LSN.
//!
//! The variant carrying the code matters as well:
//!
//! | variant             | transient | refusing      | producer-breaking | other |
//! |---------------------|-----------|---------------|-------------------|-------|
//! | `Produce`, `Delivery` | Retry   | RecordRefused | Retry             | Stop  |
//! | `Fatal`             | Retry     | RecordRefused | Retry             | Retry |
//! | `Flush`             | Retry     | Stop          | Retry             | Stop  |
//! | `Metadata`          | Retry     | Stop          | Stop              | Stop  |
//!
//! `Metadata` without a code (no answer) and `Task`, `TopicNotReady` retry;
//! `Config` and `ClientCreation` stop; `TopicMissing` is a refused record.
//!
//! A missing topic is a refused record ([`SinkError::TopicMissing`]), never a
//! retry: retrying from the durable LSN would re-publish everything in flight
//! each cycle and never get past it. Before the first record to a topic the
//! sink checks that it exists (and creates it when `[topics] create = true`,
//! see `topics.rs`); a delivery report that still says unknown topic (the
//! topic was deleted while in use; librdkafka then reports the records queued
//! for its vanished partitions as unknown partition) is refused the same way. librdkafka
//! retries unknown-partition answers internally while a topic propagates
//! (`topic.metadata.propagation.max.ms`), so such a report is final.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::Disposition;

/// Everything that can go wrong in the Kafka sink.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SinkError {
    /// A configuration property is missing, unknown, or contradicts what the
    /// relay's guarantees need. Secret values are already redacted here.
    #[error("kafka setting `{key}` = `{value}` is not allowed: {allowed}")]
    Config {
        key: String,
        value: String,
        allowed: String,
    },

    /// librdkafka refused to create the client (e.g. conflicting settings
    /// detected when the configuration is finalised).
    #[error("cannot create the Kafka producer: {reason}")]
    ClientCreation { reason: String },

    /// The record was refused before it entered the producer queue.
    #[error("cannot produce event {event_id} to topic `{topic}`: {code}")]
    Produce {
        code: RDKafkaErrorCode,
        topic: String,
        event_id: String,
    },

    /// The record entered the producer but Kafka did not acknowledge it.
    #[error("delivery of event {} to topic `{topic}` failed: {code}", event_id.as_deref().unwrap_or("<unknown>"))]
    Delivery {
        code: RDKafkaErrorCode,
        topic: String,
        event_id: Option<String>,
    },

    /// The producer hit a fatal (unrecoverable) error: it must be recreated.
    /// `code` is the code observed where this error surfaced (for records
    /// failed after the fatal error, often a purge code); `reason` is
    /// librdkafka's description of the fatal error itself.
    #[error(
        "fatal Kafka producer error ({code}){}: {reason}; the producer must be recreated",
        fatal_context(topic, event_id)
    )]
    Fatal {
        code: RDKafkaErrorCode,
        reason: String,
        topic: Option<String>,
        event_id: Option<String>,
    },

    /// `flush` returned before every record was acknowledged or failed.
    #[error("flush did not complete: {code}; {in_flight} records still in flight")]
    Flush {
        code: RDKafkaErrorCode,
        in_flight: i32,
    },

    /// Fetching cluster metadata (the reachability check) failed. `detail`
    /// is librdkafka's last client error (e.g. an authentication failure), if any.
    #[error("cannot fetch Kafka metadata from `{bootstrap}`: {}{}{}", code.map(|c| c.to_string()).unwrap_or_else(|| "no answer".to_owned()), if detail.is_empty() { String::new() } else { format!(" ({detail})") }, security_fix(*code, detail))]
    Metadata {
        code: Option<RDKafkaErrorCode>,
        bootstrap: String,
        detail: String,
    },

    /// A blocking task running producer work was cancelled or panicked.
    #[error("Kafka sink task did not complete: {reason}")]
    Task { reason: String },

    /// The record's topic does not exist (or this principal cannot see or
    /// create it), and outbox-cdc will not or could not create it. A refused
    /// record: the poison policy decides. `reason` says why and how to fix it.
    #[error("topic `{topic}` is missing{}: {reason}", event_id.as_deref().map(|e| format!(" (event {e})")).unwrap_or_default())]
    TopicMissing {
        topic: String,
        reason: String,
        event_id: Option<String>,
    },

    /// A topic outbox-cdc created (or is creating) is not usable yet. Retryable.
    #[error("topic `{topic}` is not ready: {reason}")]
    TopicNotReady { topic: String, reason: String },

    /// A Kafka transaction step failed (`[delivery] mode = "exactly-once"`).
    /// Nothing of the transaction is acknowledged; the next session resumes
    /// from the last committed marker.
    #[error("Kafka transaction {op} failed ({code}): {reason}{}", transaction_fix(*code))]
    Transaction {
        op: &'static str,
        code: RDKafkaErrorCode,
        reason: String,
        transactional_id: String,
    },

    /// Exactly-once: the offsets topic could not be prepared or read to its
    /// end now (the broker unreachable or electing a leader, or a transaction
    /// of another producer holding the partition's end). Retryable.
    #[error("offsets topic `{topic}`: {reason}; retrying")]
    OffsetsTopicUnavailable { topic: String, reason: String },

    /// Exactly-once: the offsets topic cannot be used until an operator acts
    /// (a denied ACL, a refused creation, a record with this stream's key
    /// that is not a marker); `reason` says what to do.
    #[error("offsets topic `{topic}`: {reason}")]
    OffsetsTopicRefused { topic: String, reason: String },
}

impl SinkError {
    /// An offsets-topic failure with librdkafka's `code`, if any: transient
    /// codes and none (a timeout) retry, any other code needs an operator.
    pub(super) fn offsets_topic(
        topic: &str,
        reason: String,
        code: Option<RDKafkaErrorCode>,
    ) -> SinkError {
        let topic = topic.to_owned();
        match code {
            Some(code) if !retryable_code(code) => SinkError::OffsetsTopicRefused { topic, reason },
            _ => SinkError::OffsetsTopicUnavailable { topic, reason },
        }
    }
}

/// Another producer took the transactional id over (a second instance with
/// the same slot, or a transaction the broker aborted after its timeout).
pub(super) fn fenced_code(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::Fenced
    )
}

fn transaction_fix(code: RDKafkaErrorCode) -> &'static str {
    if fenced_code(code) {
        ". This producer was fenced: another outbox-cdc instance started with the same \
         transactional.id (same cluster and slot) and owns the stream now; this instance stops. \
         If no other instance runs, the broker fenced a transaction open longer than \
         delivery.transaction_timeout_ms: raise it (and the broker's transaction.max.timeout.ms) \
         and restart"
    } else if matches!(
        code,
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
    ) {
        ". Grant this principal WRITE and DESCRIBE on the transactional id (ACL resource \
         TransactionalId) and IDEMPOTENT_WRITE on the cluster"
    } else {
        ""
    }
}

fn fatal_context(topic: &Option<String>, event_id: &Option<String>) -> String {
    match (topic, event_id) {
        (Some(t), Some(e)) => format!(" for event {e} to topic `{t}`"),
        (Some(t), None) => format!(" for topic `{t}`"),
        (None, Some(e)) => format!(" for event {e}"),
        (None, None) => String::new(),
    }
}

impl SinkError {
    /// The librdkafka error code behind this error, when there is one.
    pub fn code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            SinkError::Produce { code, .. }
            | SinkError::Delivery { code, .. }
            | SinkError::Fatal { code, .. }
            | SinkError::Flush { code, .. } => Some(*code),
            SinkError::Metadata { code, .. } => *code,
            SinkError::Transaction { code, .. } => Some(*code),
            SinkError::OffsetsTopicUnavailable { .. }
            | SinkError::OffsetsTopicRefused { .. }
            | SinkError::Config { .. }
            | SinkError::ClientCreation { .. }
            | SinkError::Task { .. }
            | SinkError::TopicMissing { .. }
            | SinkError::TopicNotReady { .. } => None,
        }
    }

    /// The topic the failed record was meant for, when known.
    pub fn topic(&self) -> Option<&str> {
        match self {
            SinkError::Produce { topic, .. }
            | SinkError::Delivery { topic, .. }
            | SinkError::TopicMissing { topic, .. }
            | SinkError::TopicNotReady { topic, .. } => Some(topic),
            SinkError::Fatal { topic, .. } => topic.as_deref(),
            _ => None,
        }
    }

    /// The event id of the failed record, when known.
    pub fn event_id(&self) -> Option<&str> {
        match self {
            SinkError::Produce { event_id, .. } => Some(event_id),
            SinkError::Delivery { event_id, .. }
            | SinkError::Fatal { event_id, .. }
            | SinkError::TopicMissing { event_id, .. } => event_id.as_deref(),
            _ => None,
        }
    }

    /// What the pipeline does about this error: the one place that decides.
    pub fn disposition(&self) -> Disposition {
        use Disposition::{RecordRefused, Retry, Stop};
        match self {
            SinkError::Config { .. } | SinkError::ClientCreation { .. } => Stop,
            // A fenced producer stops: another instance owns the transactional id.
            SinkError::Transaction { code, .. } | SinkError::Fatal { code, .. }
                if fenced_code(*code) =>
            {
                Stop
            }
            SinkError::Transaction {
                code:
                    RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                    | RDKafkaErrorCode::ClusterAuthorizationFailed,
                ..
            } => Stop,
            // Aborted or undecided: the next session's producer completes or
            // aborts it, and the marker says which.
            SinkError::Transaction { .. } => Retry,
            SinkError::OffsetsTopicUnavailable { .. } => Retry,
            SinkError::OffsetsTopicRefused { .. } => Stop,
            SinkError::Task { .. } | SinkError::TopicNotReady { .. } => Retry,
            SinkError::TopicMissing { .. } => RecordRefused,
            SinkError::Metadata { code: None, .. } => Retry,
            SinkError::Metadata {
                code: Some(code), ..
            } if retryable_code(*code) => Retry,
            SinkError::Metadata { .. } => Stop,
            // A refused record decides even when it also broke the producer:
            // with `enable.gapless.guarantee` a refusal in a batch is fatal.
            SinkError::Produce { code, .. }
            | SinkError::Delivery { code, .. }
            | SinkError::Fatal { code, .. }
                if poison_code(*code) =>
            {
                RecordRefused
            }
            // A new session brings a new producer, which cures a broken one.
            SinkError::Fatal { .. } => Retry,
            SinkError::Produce { code, .. }
            | SinkError::Delivery { code, .. }
            | SinkError::Flush { code, .. }
                if retryable_code(*code) || fatal_code(*code) =>
            {
                Retry
            }
            SinkError::Produce { .. } | SinkError::Delivery { .. } | SinkError::Flush { .. } => {
                Stop
            }
        }
    }

    /// Converts an error returned by a librdkafka call into a `SinkError`
    /// for the given record.
    pub(crate) fn from_produce(err: &KafkaError, topic: &str, event_id: &str) -> SinkError {
        SinkError::Produce {
            code: err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
            topic: topic.to_owned(),
            event_id: event_id.to_owned(),
        }
    }
}

/// Transient conditions of the cluster or the network.
pub(super) fn retryable_code(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::Resolve
            | C::BrokerDestroy
            | C::DestroyBroker
            | C::MessageTimedOut
            | C::OperationTimedOut
            | C::TimedOutQueue
            | C::RequestTimedOut
            | C::QueueFull
            | C::ISRInsufficient
            | C::NodeUpdate
            | C::Retry
            | C::Interrupted
            // Records purged by the application (shutdown, producer drop):
            // they were not acknowledged and will be produced again after a
            // restart from the durable LSN.
            | C::PurgeQueue
            | C::PurgeInflight
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::BrokerNotAvailable
            | C::ReplicaNotAvailable
            | C::NetworkException
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend
            | C::KafkaStorageError
            | C::InvalidMessage
            | C::FencedLeaderEpoch
            | C::UnknownLeaderEpoch
            | C::PreferredLeaderNotAvailable
            | C::EligibleLeadersNotAvailable
            | C::ThrottlingQuotaExceeded
            | C::RebootstrapRequired
            | C::CoordinatorNotAvailable
            | C::CoordinatorLoadInProgress
            | C::NotCoordinator
            | C::NotController
    )
}

/// What to check after a security refusal (empty for other errors).
fn security_fix(code: Option<RDKafkaErrorCode>, detail: &str) -> &'static str {
    match code {
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed)
            if detail.contains("SASL")
                || code == Some(RDKafkaErrorCode::SaslAuthenticationFailed) =>
        {
            "; the broker refused the SASL login: check [kafka] sasl.username, sasl.password and \
             sasl.mechanisms (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) against the user on the cluster"
        }
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SSL) => {
            "; the TLS handshake failed: check [kafka] ssl.ca.location (the CA that signed the \
             broker's certificate) and, when the listener requires a client certificate, \
             ssl.certificate.location and ssl.key.location (a certificate the broker's CA signed, \
             not expired)"
        }
        _ => "",
    }
}

/// The client's credentials or certificates were refused (or it refused the
/// broker's certificate): an operator must fix the configuration.
pub(super) fn security_code(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SSL
            | RDKafkaErrorCode::SaslAuthenticationFailed
    )
}

/// Failures that belong to one record (or its topic) and that no retry fixes.
pub(super) fn poison_code(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        // librdkafka reports both the local size check (record larger than
        // the producer's `message.max.bytes`) and the broker's answer with this code.
        C::MessageSizeTooLarge
            | C::InvalidMessageSize
            // Kafka's RECORD_LIST_TOO_LARGE.
            | C::MessageBatchTooLarge
            | C::TopicAuthorizationFailed
            | C::InvalidTopic
            | C::InvalidRecord
            | C::InvalidTimestamp
            | C::PolicyViolation
            | C::UnsupportedForMessageFormat
            // The topic does not exist (see the module documentation).
            | C::UnknownTopicOrPartition
            | C::UnknownTopic
            // librdkafka's local code for records whose partition vanished from
            // the metadata: partitions are never removed, so the topic was deleted
            // (or recreated with fewer partitions).
            | C::UnknownPartition
    )
}

/// Errors after which librdkafka's idempotent producer state cannot be trusted.
fn fatal_code(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::Fatal
            | C::Fenced
            | C::GaplessGuarantee
            | C::Inconsistent
            | C::OutOfOrderSequenceNumber
            | C::InvalidProducerEpoch
            | C::InvalidProducerIdMapping
            | C::ProducerFenced
            | C::UnknownProducerId
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
    )
}

#[cfg(test)]
impl SinkError {
    /// Every variant that carries a code, with every code librdkafka knows,
    /// plus the variants without one.
    pub(crate) fn every_kind() -> Vec<SinkError> {
        let mut all = vec![
            SinkError::Config {
                key: "acks".into(),
                value: "1".into(),
                allowed: "all".into(),
            },
            SinkError::ClientCreation { reason: "r".into() },
            SinkError::Task { reason: "r".into() },
            SinkError::TopicMissing {
                topic: "t".into(),
                reason: "r".into(),
                event_id: None,
            },
            SinkError::TopicNotReady {
                topic: "t".into(),
                reason: "r".into(),
            },
            SinkError::Metadata {
                code: None,
                bootstrap: "b".into(),
                detail: String::new(),
            },
        ];
        for raw in -200..200 {
            let Ok(resp) = rdkafka::types::RDKafkaRespErr::try_from(raw) else {
                continue;
            };
            let code = RDKafkaErrorCode::from(resp);
            all.push(SinkError::Produce {
                code,
                topic: "t".into(),
                event_id: "e".into(),
            });
            all.push(SinkError::Delivery {
                code,
                topic: "t".into(),
                event_id: Some("e".into()),
            });
            all.push(SinkError::Fatal {
                code,
                reason: "r".into(),
                topic: None,
                event_id: None,
            });
            all.push(SinkError::Flush { code, in_flight: 1 });
            all.push(SinkError::Metadata {
                code: Some(code),
                bootstrap: "b".into(),
                detail: String::new(),
            });
        }
        all
    }
}

/// Runs `work` (librdkafka calls that wait) on tokio's blocking pool; a task
/// that panicked or was cancelled is [`SinkError::Task`].
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SinkError::Task {
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(code: RDKafkaErrorCode) -> SinkError {
        SinkError::Delivery {
            code,
            topic: "t".into(),
            event_id: Some("e1".into()),
        }
    }

    /// A code of each class (see the module documentation), and one of none.
    const TRANSIENT: RDKafkaErrorCode = RDKafkaErrorCode::MessageTimedOut;
    const REFUSING: RDKafkaErrorCode = RDKafkaErrorCode::MessageSizeTooLarge;
    const BREAKING: RDKafkaErrorCode = RDKafkaErrorCode::OutOfOrderSequenceNumber;
    const OTHER: RDKafkaErrorCode = RDKafkaErrorCode::Fail;

    fn class_representative(code: RDKafkaErrorCode) -> RDKafkaErrorCode {
        // Fenced codes are producer-breaking too, but a fenced producer stops.
        if fenced_code(code) {
            return RDKafkaErrorCode::ProducerFenced;
        }
        match (retryable_code(code), poison_code(code), fatal_code(code)) {
            (true, false, false) => TRANSIENT,
            (false, true, false) => REFUSING,
            (false, false, true) => BREAKING,
            (false, false, false) => OTHER,
            classes => panic!("{code:?} is in more than one class: {classes:?}"),
        }
    }

    /// The same error with another code (errors without one stay as they are).
    fn with_code(e: &SinkError, to: RDKafkaErrorCode) -> SinkError {
        let mut e = e.clone();
        match &mut e {
            SinkError::Produce { code, .. }
            | SinkError::Delivery { code, .. }
            | SinkError::Fatal { code, .. }
            | SinkError::Flush { code, .. } => *code = to,
            SinkError::Metadata {
                code: Some(code), ..
            } => *code = to,
            _ => {}
        }
        e
    }

    /// The table of the module documentation, row by row. The pipeline's
    /// reconnect decision and poison policy before `disposition()` gave the
    /// same answers (checked against the removed predicates when it came in).
    #[test]
    fn disposition_table() {
        use Disposition::{RecordRefused as Refused, Retry, Stop};
        let columns = [TRANSIENT, REFUSING, BREAKING, OTHER];
        type Row = (fn(RDKafkaErrorCode) -> SinkError, [Disposition; 4]);
        let rows: [Row; 5] = [
            (
                |code| SinkError::Produce {
                    code,
                    topic: "t".into(),
                    event_id: "e".into(),
                },
                [Retry, Refused, Retry, Stop],
            ),
            (delivery, [Retry, Refused, Retry, Stop]),
            (
                |code| SinkError::Fatal {
                    code,
                    reason: "r".into(),
                    topic: None,
                    event_id: None,
                },
                [Retry, Refused, Retry, Retry],
            ),
            (
                |code| SinkError::Flush { code, in_flight: 1 },
                [Retry, Stop, Retry, Stop],
            ),
            (
                |code| SinkError::Metadata {
                    code: Some(code),
                    bootstrap: "b".into(),
                    detail: String::new(),
                },
                [Retry, Stop, Stop, Stop],
            ),
        ];
        for (make, expected) in rows {
            for (code, want) in columns.into_iter().zip(expected) {
                let e = make(code);
                assert_eq!(e.disposition(), want, "{e:?}");
            }
        }
        let codeless = [
            (
                SinkError::Metadata {
                    code: None,
                    bootstrap: "b".into(),
                    detail: String::new(),
                },
                Retry,
            ),
            (SinkError::Task { reason: "r".into() }, Retry),
            (
                SinkError::TopicNotReady {
                    topic: "t".into(),
                    reason: "r".into(),
                },
                Retry,
            ),
            (
                SinkError::Config {
                    key: "acks".into(),
                    value: "1".into(),
                    allowed: "all".into(),
                },
                Stop,
            ),
            (SinkError::ClientCreation { reason: "r".into() }, Stop),
            (
                SinkError::TopicMissing {
                    topic: "t".into(),
                    reason: "r".into(),
                    event_id: None,
                },
                Refused,
            ),
        ];
        for (e, want) in codeless {
            assert_eq!(e.disposition(), want, "{e:?}");
        }
    }

    /// Every code decides like its class's representative in the table: the
    /// answer depends on the class of the code, not on the code itself.
    #[test]
    fn every_code_decides_by_its_class() {
        for e in SinkError::every_kind() {
            let Some(code) = e.code() else { continue };
            let representative = with_code(&e, class_representative(code));
            assert_eq!(e.disposition(), representative.disposition(), "{e:?}");
        }
    }

    #[test]
    fn classifies_the_documented_cases() {
        use Disposition::{RecordRefused, Retry};
        use RDKafkaErrorCode as C;
        for c in [
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::MessageTimedOut,
            C::LeaderNotAvailable,
            C::NotEnoughReplicas,
        ] {
            assert_eq!(delivery(c).disposition(), Retry, "{c:?}");
        }
        for c in [
            C::MessageSizeTooLarge,
            C::MessageBatchTooLarge,
            C::TopicAuthorizationFailed,
            C::InvalidTopic,
            C::UnknownTopicOrPartition,
            C::UnknownTopic,
        ] {
            assert_eq!(delivery(c).disposition(), RecordRefused, "{c:?}");
        }
        // A broken producer: a new session brings a new one.
        for c in [C::Fatal, C::OutOfOrderSequenceNumber, C::ProducerFenced] {
            assert_eq!(delivery(c).disposition(), Retry, "{c:?}");
        }
        let fatal = SinkError::Fatal {
            code: C::PurgeQueue,
            reason: "x".into(),
            topic: None,
            event_id: None,
        };
        assert_eq!(fatal.disposition(), Retry);
    }

    #[test]
    fn a_missing_topic_is_a_refused_record_never_a_retry() {
        use RDKafkaErrorCode as C;
        // A delivery report saying the topic is unknown (deleted while in use),
        // also when it broke the idempotent producer.
        for c in [
            C::UnknownTopicOrPartition,
            C::UnknownTopic,
            C::UnknownPartition,
        ] {
            let e = delivery(c);
            assert_eq!(e.disposition(), Disposition::RecordRefused, "{e}");
            let fatal = SinkError::Fatal {
                code: c,
                reason: "x".into(),
                topic: Some("t".into()),
                event_id: None,
            };
            assert_eq!(fatal.disposition(), Disposition::RecordRefused, "{fatal}");
        }
        let missing = SinkError::TopicMissing {
            topic: "orders".into(),
            reason: "it does not exist and topics.create = false; create it".into(),
            event_id: Some("e1".into()),
        };
        assert_eq!(missing.disposition(), Disposition::RecordRefused);
        assert_eq!(missing.topic(), Some("orders"));
        assert_eq!(missing.event_id(), Some("e1"));
        let text = missing.to_string();
        assert!(text.contains("`orders`") && text.contains("e1"), "{text}");
        let not_ready = SinkError::TopicNotReady {
            topic: "orders".into(),
            reason: "slow".into(),
        };
        assert_eq!(not_ready.disposition(), Disposition::Retry);
    }

    /// Audit F8 (CI seed 1796243835680920946): a broker restarting while an
    /// exactly-once start reads its marker is a retry, never an operator
    /// stop; only a code no retry cures, or a record that is not a marker,
    /// stops.
    #[test]
    fn offsets_topic_failures_retry_unless_an_operator_must_act() {
        use RDKafkaErrorCode as C;
        let t = |code| SinkError::offsets_topic("o", "r".into(), code).disposition();
        for code in [
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::LeaderNotAvailable,
            C::NotLeaderForPartition,
            C::OperationTimedOut,
            C::CoordinatorLoadInProgress,
        ] {
            assert_eq!(t(Some(code)), Disposition::Retry, "{code:?}");
        }
        assert_eq!(t(None), Disposition::Retry, "a timeout");
        assert_eq!(t(Some(C::TopicAuthorizationFailed)), Disposition::Stop);
        assert_eq!(t(Some(C::PolicyViolation)), Disposition::Stop);
        let not_a_marker = SinkError::OffsetsTopicRefused {
            topic: "o".into(),
            reason: "not a marker".into(),
        };
        assert_eq!(not_a_marker.disposition(), Disposition::Stop);
        let retrying = SinkError::offsets_topic("o", "r".into(), Some(C::AllBrokersDown));
        assert!(retrying.to_string().ends_with("retrying"), "{retrying}");
        let stopping = SinkError::offsets_topic("o", "r".into(), Some(C::TopicAuthorizationFailed));
        assert!(!stopping.to_string().contains("retrying"), "{stopping}");
    }

    #[test]
    fn messages_name_topic_and_event() {
        let e = delivery(RDKafkaErrorCode::MessageSizeTooLarge);
        let text = e.to_string();
        assert!(text.contains("e1") && text.contains("`t`"), "{text}");
        assert_eq!(e.event_id(), Some("e1"));
        assert_eq!(e.topic(), Some("t"));
        assert_eq!(e.code(), Some(RDKafkaErrorCode::MessageSizeTooLarge));
    }
}
