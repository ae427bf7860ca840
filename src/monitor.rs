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
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::pg::{PgConnectConfig, PgError, PgTimestamp};
use crate::status;

use crate::periodic::{self, Step, Wording, connected};

/// Upper bound of one poll (connect + two queries); a hung server must not stop
/// the poller for longer than this.
const POLL_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the poller; it returns when `shutdown` turns true or its sender is dropped.
pub(crate) fn spawn(
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let pg = match PgConnectConfig::parse(&config.postgres.url) {
            Ok(pg) => pg,
            Err(e) => {
                // `run` parses the same URL and refuses it with the same error.
                warn!(error = %e, "slot monitor disabled: postgres.url does not parse");
                return;
            }
        };
        let poll = Poll {
            pg,
            slot: config.postgres.slot.clone(),
            metrics,
        };
        let words = Wording {
            task: "slot monitor",
            failed: "slot monitor: poll failed",
            again: "slot monitor: polling again",
        };
        let interval = config.monitor.slot_poll_interval();
        periodic::run_every(poll, None, interval, POLL_TIMEOUT, words, shutdown).await;
    })
}

/// One poll: the slot's row and the server's WAL position into the gauges.
struct Poll {
    pg: PgConnectConfig,
    slot: String,
    metrics: Arc<Metrics>,
}

impl Step for Poll {
    type Error = PgError;

    async fn run(&mut self, client: &mut Option<tokio_postgres::Client>) -> Result<(), PgError> {
        let c = connected(&self.pg, client).await?;
        let snapshot = status::poll_slot(c, &self.slot).await?;
        let gauges = snapshot.slot.as_ref().map(|s| s.gauges());
        let now_ms = u64::try_from(PgTimestamp::now().unix_millis()).unwrap_or(0);
        self.metrics.set_slot(gauges.as_ref(), now_ms);
        Ok(())
    }

    fn failed(&mut self) {
        self.metrics.slot_poll_failed();
    }
}
