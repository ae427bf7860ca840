//! `outbox-cdc run` as one composition: the pipeline with its companions
//! (the HTTP endpoint, the slot monitor, the Kafka probe of readiness, the
//! optional heartbeat, the pruner, the live witness),
//! all stopped by one signal. The binary adds only the process signals
//! ([`run_until_signal`]); tests call [`run`] with their own stop channel, so
//! they exercise the same wiring.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::pipeline::{self, PipelineError, RunOptions};
use crate::{health, heartbeat, http, monitor};

#[derive(Debug, Error)]
pub enum RelayError {
    #[error(
        "cannot listen on http.listen = {listen}: {source}; choose a free address or \"\" to disable it"
    )]
    Listen {
        listen: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

/// How long `run` waits for its companions after the pipeline returned; each
/// stops as soon as it sees the stop signal, even mid-query.
const COMPANION_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the relay until `stop` turns true (Ok) or the pipeline stops with an
/// error; the companions stop with it either way.
pub async fn run(
    config: Arc<Config>,
    options: RunOptions,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    metrics
        .health
        .configure(&config.health, &config.postgres.slot);
    let http = http::serve(&config.http, metrics.clone())
        .await
        .map_err(|source| RelayError::Listen {
            listen: config.http.listen.clone(),
            source,
        })?;
    // The companions' own stop: the caller's, or the pipeline having returned.
    let (companions_stop, companions_rx) = watch::channel(false);
    let mut caller_stop = stop.clone();
    let forward = tokio::spawn({
        let companions_stop = companions_stop.clone();
        async move {
            while !*caller_stop.borrow_and_update() {
                if caller_stop.changed().await.is_err() {
                    return;
                }
            }
            companions_stop.send_replace(true);
        }
    });
    let monitor = monitor::spawn(config.clone(), metrics.clone(), companions_rx.clone());
    let kafka_probe =
        health::spawn_kafka_probe(config.clone(), metrics.clone(), companions_rx.clone());
    let heartbeat = heartbeat::spawn(config.clone(), metrics.clone(), companions_rx.clone());
    let parking =
        crate::parking::spawn_refresh(config.clone(), metrics.clone(), companions_rx.clone());
    let pruner = tokio::spawn(pipeline::run_pruner(
        config.clone(),
        metrics.clone(),
        companions_rx.clone(),
    ));
    let witness = tokio::spawn(crate::witness::run_reconciler(
        config.clone(),
        metrics.clone(),
        companions_rx,
    ));

    // A stored coverage break is repaired by the live witness at start.
    let options = RunOptions {
        break_repair: Some(crate::witness::break_repair()),
        ..options
    };
    let result = pipeline::run(config, options, metrics, stop).await;

    companions_stop.send_replace(true);
    forward.abort();
    let companions = async {
        let _ = monitor.await;
        let _ = kafka_probe.await;
        if let Some(h) = heartbeat {
            let _ = h.await;
        }
        if let Some(h) = parking {
            let _ = h.await;
        }
        let _ = pruner.await;
        let _ = witness.await;
    };
    if tokio::time::timeout(COMPANION_STOP_TIMEOUT, companions)
        .await
        .is_err()
    {
        warn!(
            "slot monitor, heartbeat, pruner or live witness did not stop in time; leaving them to the runtime's shutdown"
        );
    }
    if let Some(h) = http {
        h.abort();
    }
    Ok(result?)
}

/// [`run`] until SIGTERM or SIGINT, which stop it gracefully.
pub async fn run_until_signal(config: Arc<Config>, options: RunOptions) -> Result<(), RelayError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let signals = tokio::spawn(async move {
        wait_for_signal().await;
        info!("signal received: stopping");
        stop_tx.send_replace(true);
    });
    let result = run(config, options, Arc::new(Metrics::default()), stop_rx).await;
    signals.abort();
    result
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the process still stops on SIGKILL; nothing else to do.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
