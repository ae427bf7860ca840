//! How a session ends: gracefully (drain) or after a failure (keep what was
//! acknowledged), and which failure decides when delivery reports disagree:
//! a record Kafka refused for good decides over any other (DESIGN.md §7).

use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::Disposition;
use crate::checkpoint::OffsetStore;
use crate::sink::SinkError;

use super::{Now, Session};
use crate::error::PipelineError;
use crate::pipeline::delivery::{Delivery, InFlight};

/// A record Kafka will not take. Under the dead-letter policy
/// (`dead_letters`) a refused main-topic record parks its aggregate and ends
/// the session: later events of that aggregate may already be queued behind
/// it, so the stream is replayed from the durable LSN, where the parked
/// aggregate's events go to the dead-letter topic in order. Anything else
/// stops the session.
pub(super) struct Refused {
    pub(super) source: SinkError,
    pub(super) event_id: String,
    pub(super) record: InFlight,
}

impl Refused {
    pub(super) fn into_error(self, dead_letters: bool, store: &OffsetStore) -> PipelineError {
        let Refused {
            source,
            event_id,
            record:
                InFlight {
                    at,
                    aggregate_type,
                    aggregate_id,
                    dead_lettered,
                    ..
                },
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
fn keep_refusal(kept: Option<PipelineError>, next: PipelineError) -> PipelineError {
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

fn prefer_refusal(failure: PipelineError, drained: Option<PipelineError>) -> PipelineError {
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

impl<D: Delivery> Session<'_, D> {
    /// Takes the reports that arrive before `deadline`, while any record is
    /// outstanding. Every report still due is taken, not only those before
    /// the first failure: reports come from two polling threads in any
    /// order, and purged records reported ahead of a refused one must not
    /// hide the refusal (audit F13). Returns the error to keep (a refusal
    /// first).
    async fn take_reports(&mut self, deadline: Instant) -> Option<PipelineError> {
        let mut kept = None;
        let mut outstanding = self.tracker.in_flight_events();
        while outstanding > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.delivery.reports().recv()).await {
                Ok(Some(report)) => {
                    outstanding -= 1;
                    if let Err(e) = self.on_report(report, Now::read()) {
                        kept = Some(keep_refusal(kept, e));
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        kept
    }

    /// After a session failed: take the delivery reports that arrive within a
    /// short bound and persist the acknowledged prefix, so the next session
    /// re-sends only what was really unacknowledged. It also waits for a
    /// persist still running, so no write of this session can land after the
    /// next one loaded the offset.
    ///
    /// Returns why the session ended: a record the broker refused for good
    /// wins over the failure that ended the loop. With the gapless guarantee a
    /// refusal also raises the producer's fatal error, which the tick may see
    /// before the refused record's report arrives; ending on the fatal error
    /// would restart without parking or stopping, over and over.
    pub(super) async fn keep_acknowledged(&mut self, failure: PipelineError) -> PipelineError {
        let bound = Duration::from_millis(self.config.limits.shutdown_timeout_ms.min(5_000));
        let refusal = self.take_reports(Instant::now() + bound).await;
        self.delivery.abandon();
        if !matches!(
            failure,
            PipelineError::CoverageLost(_) | PipelineError::NotCovered(_)
        ) {
            self.coverage.final_proof(&mut self.tracker).await;
        }
        match self
            .checkpoint
            .persist_now(&self.tracker, &mut self.sequences)
            .await
        {
            Ok(()) => {
                debug!(acked = %self.checkpoint.durable(), error = %failure, "persisted the acknowledged prefix after a failure")
            }
            Err(e) => {
                warn!(error = %e, "persisting the acknowledged prefix after a failure failed; the next session re-sends from the last durable LSN")
            }
        }
        prefer_refusal(failure, refusal)
    }

    /// The graceful end: finishes the delivery at a transaction boundary (or
    /// gives the open transaction up), waits (bounded) for the deliveries in
    /// flight, proves coverage once more and persists the acknowledged
    /// position. The caller closes the stream.
    pub(super) async fn drain(&mut self) -> Result<(), PipelineError> {
        let deadline =
            Instant::now() + Duration::from_millis(self.config.limits.shutdown_timeout_ms);
        info!(
            in_flight = self.tracker.in_flight_events(),
            "shutting down: waiting for in-flight deliveries"
        );
        let at_boundary = self.open.is_none();
        if self
            .delivery
            .finish(at_boundary, &mut self.tracker)
            .await?
            .0
        {
            self.checkpoint.mark_dirty();
        }
        if let Some(e) = self.take_reports(deadline).await {
            warn!(error = %e, "delivery failed during shutdown; it will be re-sent on the next start");
        }
        if self.tracker.in_flight_events() > 0 {
            warn!(
                in_flight = self.tracker.in_flight_events(),
                "shutdown timeout: unacknowledged events will be re-sent on the next start"
            );
        }
        crate::failpoint!("during-shutdown");
        self.coverage.final_proof(&mut self.tracker).await;
        self.checkpoint
            .persist_now(&self.tracker, &mut self.sequences)
            .await?;
        info!(acked = %self.checkpoint.durable(), "final acknowledged position persisted");
        Ok(())
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
