//! Why a session ends, when delivery reports disagree: a record Kafka
//! refused for good decides over any other failure (DESIGN.md §7).

use tracing::warn;

use crate::Disposition;
use crate::checkpoint::OffsetStore;
use crate::pg::EventPosition;
use crate::sink::SinkError;

use crate::pipeline::PipelineError;

/// A record Kafka will not take. Under the dead-letter policy
/// (`dead_letters`) a refused main-topic record parks its aggregate and ends
/// the session: later events of that aggregate may already be queued behind
/// it, so the stream is replayed from the durable LSN, where the parked
/// aggregate's events go to the dead-letter topic in order. Anything else
/// stops the session.
pub(super) struct Refused {
    pub(super) source: SinkError,
    pub(super) at: EventPosition,
    pub(super) event_id: String,
    pub(super) aggregate_type: String,
    pub(super) aggregate_id: String,
    /// Already on its way to the dead-letter topic: a refusal now is final.
    pub(super) dead_lettered: bool,
}

impl Refused {
    pub(super) fn into_error(self, dead_letters: bool, store: &OffsetStore) -> PipelineError {
        let Refused {
            source,
            at,
            event_id,
            aggregate_type,
            aggregate_id,
            dead_lettered,
        } = self;
        let lsn = at.change();
        match source.disposition() {
            Disposition::RecordRefused
                if dead_letters && !dead_lettered && !aggregate_id.is_empty() =>
            {
                let reason = source.to_string();
                let parked = tokio::task::block_in_place(|| {
                    store.park(&aggregate_type, &aggregate_id, &reason, at)
                });
                if let Err(e) = parked {
                    return e.into();
                }
                PipelineError::Parked {
                    aggregate_type,
                    aggregate_id,
                    lsn,
                    reason,
                }
            }
            Disposition::RecordRefused => PipelineError::Poison {
                event_id,
                lsn,
                reason: source.to_string(),
                refusal: Some(Box::new(source)),
            },
            Disposition::Retry | Disposition::Stop => PipelineError::Delivery {
                event_id,
                lsn,
                source,
            },
        }
    }
}

/// Why a session ended, given the failure that ended its loop and the first
/// error a delivery report gave while draining: a record refused for good
/// (parked, or poison) decides; any other report error does not replace the
/// failure.
/// Of the errors drained reports gave, the one kept: the first refused
/// record (it decides how the session ends), else the first error.
pub(super) fn keep_refusal(kept: Option<PipelineError>, next: PipelineError) -> PipelineError {
    let refused = |e: &PipelineError| {
        matches!(
            e,
            PipelineError::Parked { .. } | PipelineError::Poison { .. }
        )
    };
    match kept {
        Some(kept) if refused(&kept) || !refused(&next) => kept,
        _ => next,
    }
}

pub(super) fn prefer_refusal(
    failure: PipelineError,
    drained: Option<PipelineError>,
) -> PipelineError {
    match drained {
        Some(refused @ (PipelineError::Parked { .. } | PipelineError::Poison { .. })) => {
            if !matches!(
                failure,
                PipelineError::Parked { .. } | PipelineError::Poison { .. }
            ) {
                warn!(error = %failure, "a record refused by Kafka decides how this session ends");
            }
            refused
        }
        _ => failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::Lsn;

    fn parked() -> PipelineError {
        PipelineError::Parked {
            aggregate_type: "order".into(),
            aggregate_id: "o1".into(),
            lsn: Lsn::new(50),
            reason: "Broker: Message size too large".into(),
        }
    }

    /// Audit F13: two purged records reported ahead of the refused one (the
    /// reports come from two threads in any order) must not hide it.
    #[test]
    fn a_refusal_among_drained_reports_is_kept_whatever_came_before_it() {
        let purged = || PipelineError::Delivery {
            event_id: "e0".into(),
            lsn: Lsn::new(40),
            source: crate::sink::SinkError::Delivery {
                code: rdkafka::types::RDKafkaErrorCode::PurgeQueue,
                topic: "t".into(),
                event_id: Some("e0".into()),
            },
        };
        let drained = [purged(), purged(), parked(), purged()]
            .into_iter()
            .fold(None, |kept, next| Some(keep_refusal(kept, next)));
        let ended = prefer_refusal(PipelineError::StreamEnded, drained);
        assert!(matches!(ended, PipelineError::Parked { .. }), "{ended}");
        // Without a refusal the first error is kept (and the failure decides).
        let drained = [purged(), purged()]
            .into_iter()
            .fold(None, |kept, next| Some(keep_refusal(kept, next)));
        assert!(matches!(drained, Some(PipelineError::Delivery { .. })));
    }

    #[test]
    fn a_refused_record_decides_over_the_fatal_error_that_ended_the_loop() {
        // The fatal error alone is retryable: a new session, no parking, and
        // the same refusal again, forever.
        let fatal = PipelineError::StreamEnded;
        assert_eq!(fatal.disposition(), Disposition::Retry);
        assert!(matches!(
            prefer_refusal(fatal, Some(parked())),
            PipelineError::Parked { .. }
        ));
        let poison = PipelineError::Poison {
            event_id: "e1".into(),
            lsn: Lsn::new(50),
            reason: "too large".into(),
            refusal: None,
        };
        let ended = prefer_refusal(PipelineError::StreamEnded, Some(poison));
        assert!(matches!(ended, PipelineError::Poison { .. }));
        assert_eq!(ended.disposition(), Disposition::Stop);
        // Other report errors do not hide why the loop ended.
        assert!(matches!(
            prefer_refusal(
                PipelineError::StreamEnded,
                Some(PipelineError::Protocol {
                    lsn: Lsn::ZERO,
                    what: "x".into()
                })
            ),
            PipelineError::StreamEnded
        ));
        assert!(matches!(
            prefer_refusal(PipelineError::StreamEnded, None),
            PipelineError::StreamEnded
        ));
    }
}
