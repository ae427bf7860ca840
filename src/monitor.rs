//! The slot-lag poller: every `monitor.slot_poll_interval_ms` it reads
//! `pg_replication_slots` and `pg_current_wal_lsn()` on its own SQL connection
//! and sets the `outbox_cdc_slot_*` gauges.
//!
//! It runs next to the pipeline, not inside it: lag must stay visible exactly
//! when the pipeline is down (Kafka unreachable, slot held by another instance,
//! reconnect backoff). A failed poll counts `outbox_cdc_slot_poll_errors_total`,
//! drops the connection and reconnects on the next tick; the gauges keep their
//! last value and `outbox_cdc_slot_last_poll_timestamp_seconds` shows its age.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use outbox_cdc::config::Config;
use outbox_cdc::metrics::Metrics;
use outbox_cdc::pg::{PgConnectConfig, PgError, PgTimestamp};
use outbox_cdc::status;

/// Upper bound of one poll (connect + two queries); a hung server must not stop
/// the poller for longer than this.
const POLL_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the poller; it returns when `shutdown` turns true or its sender is dropped.
pub(crate) fn spawn(
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(run(config, metrics, shutdown))
}

async fn run(config: Arc<Config>, metrics: Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
    let pg = match PgConnectConfig::parse(&config.postgres.url) {
        Ok(pg) => pg,
        Err(e) => {
            // `run` parses the same URL and refuses it with the same error.
            warn!(error = %e, "slot monitor disabled: postgres.url does not parse");
            return;
        }
    };
    let slot = config.postgres.slot.as_str();
    let mut tick = tokio::time::interval(config.monitor.slot_poll_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<tokio_postgres::Client> = None;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    debug!("slot monitor stopped");
                    return;
                }
                continue;
            }
        }
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(POLL_TIMEOUT, poll(&pg, slot, &mut client, &metrics)) => outcome,
            _ = shutdown.changed() => {
                debug!("slot monitor stopped during a poll");
                return;
            }
        };
        match outcome {
            Ok(Ok(())) => {
                if failing {
                    info!(slot, "slot monitor: polling again");
                    failing = false;
                }
            }
            Ok(Err(e)) => {
                client = None;
                metrics.slot_poll_errors.fetch_add(1, Ordering::Relaxed);
                if !failing {
                    warn!(slot, error = %e, "slot monitor: poll failed; retrying every interval");
                    failing = true;
                } else {
                    debug!(slot, error = %e, "slot monitor: poll failed");
                }
            }
            Err(_) => {
                client = None;
                metrics.slot_poll_errors.fetch_add(1, Ordering::Relaxed);
                if !failing {
                    warn!(
                        slot,
                        timeout_ms = POLL_TIMEOUT.as_millis() as u64,
                        "slot monitor: poll timed out"
                    );
                    failing = true;
                }
            }
        }
    }
}

async fn poll(
    pg: &PgConnectConfig,
    slot: &str,
    client: &mut Option<tokio_postgres::Client>,
    metrics: &Metrics,
) -> Result<(), PgError> {
    let c = connected(pg, client).await?;
    let snapshot = status::poll_slot(c, slot).await?;
    let gauges = snapshot.slot.as_ref().map(|s| s.gauges());
    let now_ms = u64::try_from(PgTimestamp::now().unix_millis()).unwrap_or(0);
    metrics.set_slot(gauges.as_ref(), now_ms);
    Ok(())
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
