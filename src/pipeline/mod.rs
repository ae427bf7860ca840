//! Wiring: replication stream → decoder → outbox mapping → Kafka → ack tracker →
//! offset store → standby status updates; plus reconnects and shutdown.
//!
//! Invariants enforced here (DESIGN.md §5–6):
//! - records are produced in commit order, from this one task;
//! - the flush position sent to PostgreSQL only ever comes from a
//!   [`DurableLsn`](crate::checkpoint::DurableLsn), i.e. after a sled flush;
//! - at most `limits.max_in_flight_*` unacknowledged events: when full, the
//!   replication socket is not read (feedback keeps flowing from its own task);
//! - any delivery failure stops the session without advancing; the next
//!   session starts from the durable acked LSN, after a backoff with jitter.

mod delivery;
mod options;
mod resume;
mod sequences;
mod session;
mod spill;

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt as _;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::Disposition;
use crate::checkpoint::OffsetStore;
use crate::config::Config;
use crate::metrics::Metrics;

// The retained-row commands' API, where callers have always found it.
pub use crate::error::{GapKind, PipelineError, SequenceGap, StartRefused};
pub use crate::retained::{
    AckedPosition, EventIdSet, PruneError, PruneReport, ReplayError, ReplayOptions, ReplayReport,
    prune_once, prune_stored, replay, run_pruner,
};
pub use options::{BreakRepair, RunOptions};

/// Runs sessions until shutdown is signalled (returns Ok) or a definite error
/// occurs. Retryable failures reconnect with exponential backoff and full jitter.
///
/// Needs a multi-threaded tokio runtime: offsets are flushed to disk with
/// `block_in_place`, which keeps the replication task's order of events and
/// lets other tasks (the feedback writer among them) run meanwhile.
pub async fn run(
    config: Arc<Config>,
    options: RunOptions,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut store: Option<Arc<OffsetStore>> = None;
    let mut backoff = config.retry.initial_backoff();
    loop {
        let started = std::time::Instant::now();
        // Opened inside the loop: a `status` or `release` run may hold the store
        // for a moment (StoreError::Locked is retryable).
        let result = match &store {
            Some(open) => {
                session::run_session(&config, options, open, &metrics, shutdown.clone()).await
            }
            None => match open_store(&config) {
                Ok(open) => {
                    let open = Arc::new(open);
                    metrics.offset_store.publish(&open);
                    store = Some(open);
                    continue;
                }
                Err(e) => Err(e),
            },
        };
        metrics.set_connected(false);
        let e = match result {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        metrics
            .health
            .session_ended(e.slot_holder(), e.disk_full(), e.to_string());
        if e.disk_full() {
            // sled is not asked to go on after a failed write: the next
            // attempt opens the store again, as after a crash.
            store = None;
            let path = &config.offsets.path;
            warn!(path = %path.display(), free_bytes = ?free_bytes(path),
                  "offsets.path: the disk is full; nothing after the durable position is acknowledged, \
                   and the connector goes on by itself once space is freed");
        }
        match e.disposition() {
            Disposition::Retry => {
                if started.elapsed() > Duration::from_secs(60) {
                    backoff = config.retry.initial_backoff();
                }
                let wait = jitter(backoff);
                warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "session failed; reconnecting from the durable acked LSN");
                metrics.reconnecting();
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => {
                        info!("shutdown requested during backoff");
                        return Ok(());
                    }
                }
                backoff = (backoff * 2).min(config.retry.max_backoff());
            }
            Disposition::RecordRefused | Disposition::Stop => {
                error!(error = %e, "stopping: this failure needs an operator");
                return Err(e);
            }
        }
    }
}

/// Opens the sled store named by `offsets.path`.
pub fn open_store(config: &Config) -> Result<OffsetStore, PipelineError> {
    Ok(OffsetStore::open(&config.offsets.path)?)
}

/// Bytes an unprivileged writer may still use on the filesystem of `path`
/// (or of its nearest existing parent).
fn free_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists())?;
    let c_path = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is a valid NUL-terminated string and stat a writable
    // statvfs; it is read only when the call succeeded.
    let done = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if done != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Full jitter: uniformly between half the backoff and the backoff.
fn jitter(backoff: Duration) -> Duration {
    let ms = backoff.as_millis().max(2) as u64;
    Duration::from_millis(rand::rng().random_range(ms / 2..=ms))
}
