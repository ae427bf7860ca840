//! With the witness on, a stored coverage break (issue 47: a window in which
//! the stream may have skipped outbox rows) does not wait for an operator:
//! the start audits the break's window against Kafka, publishes what is
//! missing from the table (what `outbox-cdc audit --repair` does), logs what
//! it found at ERROR, and clears the break once every missing row went out.
//! Otherwise the start is refused as before, naming the command.

use tracing::{error, info, warn};

use crate::audit::{AuditError, AuditOptions};
use crate::checkpoint::{CoverageBreak, OffsetStore};
use crate::config::Config;
use crate::pipeline::{PipelineError, StartRefused};

/// [`repair_breaks`] as the pipeline takes it (`RunOptions::break_repair`).
pub fn break_repair() -> crate::pipeline::BreakRepair {
    |config, store, breaks, refused| Box::pin(repair_breaks(config, store, breaks, refused))
}

/// Repairs the `breaks` of the configured slot over the window `refused`
/// names; returns whether they were cleared.
async fn repair_breaks(
    config: &Config,
    store: &OffsetStore,
    breaks: &[CoverageBreak],
    refused: &StartRefused,
) -> Result<bool, PipelineError> {
    let StartRefused::CoverageBroken {
        since, until, what, ..
    } = refused
    else {
        return Ok(false);
    };
    error!(since = %since, until = %until, what = %what,
        "live witness: a coverage break is stored (the stream may have skipped outbox rows in this window); \
         auditing it against Kafka and publishing what is missing from the table");
    let options = AuditOptions {
        since: since.clone(),
        until: Some(until.clone()),
        aggregate_type: None,
        max_examples: 100,
        progress: false,
    };
    let found = crate::audit::run(config, &options)
        .await
        .map_err(audit_failed)?;
    for row in &found.missing_rows {
        error!(event_id = %row.event_id, aggregate_type = %row.aggregate_type,
            aggregate_id = %row.aggregate_id, occurred_at = %row.occurred_at, window = %format!("{since} .. {until}"),
            "live witness: a committed outbox row of the coverage break's window is not in Kafka; publishing it from the table");
    }
    let outcome = crate::audit::repair(config, &options, &found)
        .await
        .map_err(audit_failed)?;
    // Rows committed after the connector stopped are in the slot, which
    // carries every outbox row again (the start's proof passed): the audit
    // after the repair may count them as missing until they are streamed,
    // so it does not decide. Every row the audit found missing must have
    // gone out, and none may be held back behind a parked aggregate.
    if found.held_back > 0 || outcome.replayed.total() < found.missing - found.held_back {
        warn!(
            missing = found.missing,
            republished = outcome.replayed.total(),
            held_back = found.held_back,
            "live witness: not every missing row of the coverage break's window could be published \
             (parked aggregates keep theirs until `outbox-cdc release`); the break stays"
        );
        return Ok(false);
    }
    let slot = &config.postgres.slot;
    let from = breaks.iter().map(|b| b.since_micros).min().unwrap_or(0);
    let to = breaks.iter().map(|b| b.until_micros).max().unwrap_or(0);
    let cleared = tokio::task::block_in_place(|| store.clear_coverage_breaks(slot, from, to))?;
    info!(
        rows = found.rows,
        missing = found.missing,
        republished = outcome.replayed.total(),
        breaks = cleared.len(),
        "live witness: the coverage break's window is repaired; the break is cleared"
    );
    Ok(true)
}

/// An audit that could not run: its connection or Kafka failing passes by
/// itself (a retry); anything else needs the operator.
fn audit_failed(e: AuditError) -> PipelineError {
    match e {
        AuditError::Pg(e) => PipelineError::Pg(e),
        AuditError::Pipeline(e) => e,
        AuditError::Kafka(what) => PipelineError::BreakRepair {
            what: format!("reading Kafka: {what}"),
        },
        AuditError::Config(what) => PipelineError::Internal {
            what: format!("the live witness cannot audit the coverage break's window: {what}"),
        },
    }
}
