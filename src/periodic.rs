//! One SQL step every interval on a connection of its own, next to the
//! pipeline: the slot monitor and the heartbeat.
//!
//! The loop is the same for both: wait for the tick (or the stop signal), run
//! the step bounded by a timeout, and on a failure or a timeout drop the
//! connection (the next step reconnects), count the failure and log it, at
//! warn the first time and at debug while it goes on, then once at info when
//! a step succeeds again. A step still running when the stop signal comes is
//! abandoned.

use std::fmt::Display;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::pg::{PgConnectConfig, PgError};

/// What one periodic task does each tick.
pub(crate) trait Step {
    type Error: Display;

    /// One run of the step on `client`: an open connection, or `None` (the
    /// step connects with [`connected`]).
    async fn run(&mut self, client: &mut Option<tokio_postgres::Client>)
    -> Result<(), Self::Error>;

    /// A step failed or timed out (count it in the task's error metric).
    fn failed(&mut self);
}

/// How a task names itself in its log lines.
pub(crate) struct Wording {
    /// The task, e.g. `"slot monitor"`.
    pub task: &'static str,
    /// First failure, e.g. `"slot monitor: poll failed"`.
    pub failed: &'static str,
    /// Success after failures, e.g. `"slot monitor: polling again"`.
    pub again: &'static str,
}

/// Runs `step` every `interval`, each run bounded by `timeout`, until
/// `shutdown` turns true or its sender is dropped.
pub(crate) async fn run_every<S: Step>(
    mut step: S,
    mut client: Option<tokio_postgres::Client>,
    interval: Duration,
    timeout: Duration,
    words: Wording,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        if !next_tick(&mut tick, &mut shutdown).await {
            debug!(task = words.task, "stopped");
            return;
        }
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(timeout, step.run(&mut client)) => outcome,
            _ = shutdown.changed() => {
                debug!(task = words.task, "stopped during a step");
                return;
            }
        };
        let error = match outcome {
            Ok(Ok(())) => {
                if failing {
                    info!("{}", words.again);
                    failing = false;
                }
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", timeout.as_millis()),
        };
        client = None;
        step.failed();
        if failing {
            debug!(%error, "{}", words.failed);
        } else {
            warn!(%error, "{}; retrying every interval", words.failed);
            failing = true;
        }
    }
}

/// Waits for `tick`'s next tick: `true` when it came, `false` once
/// `shutdown` turned true or its sender was dropped (a change that leaves it
/// false is waited through).
pub(crate) async fn next_tick(
    tick: &mut tokio::time::Interval,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    loop {
        tokio::select! {
            _ = tick.tick() => return true,
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return false;
                }
            }
        }
    }
}

/// The open SQL connection in `client`, or a new one if there is none or it closed.
pub(crate) async fn connected<'a>(
    pg: &PgConnectConfig,
    client: &'a mut Option<tokio_postgres::Client>,
) -> Result<&'a tokio_postgres::Client, PgError> {
    if client.as_ref().is_some_and(|c| c.is_closed()) {
        *client = None;
    }
    match client {
        Some(c) => Ok(c),
        None => Ok(client.insert(pg.connect_sql().await?)),
    }
}
