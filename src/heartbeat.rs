//! The optional heartbeat: every `monitor.heartbeat_interval_ms`,
//! `SELECT pg_logical_emit_message(false, <monitor.heartbeat_prefix>, now()::text)`
//! on its own SQL connection.
//!
//! Why: the pipeline acknowledges a keepalive's `wal_end` only when a keepalive
//! reaches it while nothing is in flight (the idle-advance rule). When this
//! database is quiet, whether and when the server sends one depends on what its
//! walsender happens to read, so on a server whose other databases write a lot
//! the slot's `restart_lsn` can stay behind and pin their WAL. A heartbeat puts
//! a record into THIS database's WAL every interval, so something reaches the
//! connector and the slot advances at least that often.
//!
//! The message is non-transactional (written at once, no transaction, never an
//! event: the pipeline only maps transactional messages, and config validation
//! keeps its prefix apart from `outbox.message_prefix`). Failures count
//! `outbox_cdc_heartbeat_errors_total` and reconnect on the next tick.
//!
//! When the connector decodes on a standby, the heartbeat goes to
//! `postgres.primary_url` (its WAL reaches the standby); without one it is off.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::pg::{PgConnectConfig, PgError};

use crate::periodic::{self, Step, Wording, connected};

const HEARTBEAT_SQL: &str = "SELECT pg_logical_emit_message(false, $1, now()::text)::text";

/// Upper bound of one heartbeat (connect + statement).
const BEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the heartbeat when `monitor.heartbeat_interval_ms` is not 0.
pub(crate) fn spawn(
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let interval = config.monitor.heartbeat_interval()?;
    Some(tokio::spawn(run(config, interval, metrics, shutdown)))
}

async fn run(
    config: Arc<Config>,
    interval: Duration,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) {
    // On a standby (decoding there, PostgreSQL 16+) the heartbeat must be
    // written on the primary: postgres.primary_url.
    let (url, key) = match &config.postgres.primary_url {
        Some(primary) => (primary.as_str(), "postgres.primary_url"),
        None => (config.postgres.url.as_str(), "postgres.url"),
    };
    let pg = match PgConnectConfig::parse(url) {
        Ok(pg) => pg,
        Err(e) => {
            warn!(error = %e, "heartbeat disabled: {key} does not parse");
            return;
        }
    };
    let mut client: Option<tokio_postgres::Client> = None;
    if config.postgres.primary_url.is_none()
        && let Ok(c) = connected(&pg, &mut client).await
        && crate::pg::control::in_recovery(c).await.unwrap_or(false)
    {
        warn!(
            "heartbeat disabled: postgres.url is a standby, where no WAL can be written; set postgres.primary_url \
             to write the heartbeat on the primary"
        );
        return;
    }
    let prefix = config.monitor.heartbeat_prefix.clone();
    info!(
        prefix,
        interval_ms = interval.as_millis() as u64,
        "heartbeat on"
    );
    let beat = Beat {
        pg,
        prefix,
        metrics,
    };
    let words = Wording {
        task: "heartbeat",
        failed: "heartbeat failed",
        again: "heartbeat: writing again",
    };
    periodic::run_every(beat, client, interval, BEAT_TIMEOUT, words, shutdown).await;
}

/// Why a heartbeat was not written.
#[derive(Debug, thiserror::Error)]
enum BeatError {
    #[error(transparent)]
    Connect(#[from] PgError),
    #[error("pg_logical_emit_message(false, {prefix:?}, ...): {source}")]
    Emit {
        prefix: String,
        source: tokio_postgres::Error,
    },
}

/// One heartbeat: a non-transactional logical message into this database's WAL.
struct Beat {
    pg: PgConnectConfig,
    prefix: String,
    metrics: Arc<Metrics>,
}

impl Step for Beat {
    type Error = BeatError;

    async fn run(&mut self, client: &mut Option<tokio_postgres::Client>) -> Result<(), BeatError> {
        let c = connected(&self.pg, client).await?;
        let emit = |source| BeatError::Emit {
            prefix: self.prefix.clone(),
            source,
        };
        let row = c
            .query_one(HEARTBEAT_SQL, &[&self.prefix])
            .await
            .map_err(emit)?;
        let lsn: String = row.try_get(0).map_err(emit)?;
        self.metrics.heartbeat_written();
        debug!(%lsn, "heartbeat written");
        Ok(())
    }

    fn failed(&mut self) {
        self.metrics.heartbeat_failed();
    }
}
