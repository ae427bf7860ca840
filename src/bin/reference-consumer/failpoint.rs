//! Crash points of the reference consumer, always compiled (it is a test tool).
//!
//! `OUTBOX_CDC_CONSUMER_FAILPOINT=<name>:<n>` kills the process with SIGKILL on
//! the n-th time the named point is reached (no destructors, no flushes, no
//! offset commit on the way out: exactly like `kill -9`). Names other than the
//! ones below are ignored, so a variable meant for another process is harmless.
//!
//! - `after-receive`: a record was read from Kafka, nothing done yet;
//! - `before-business-commit`: inbox row and effect written, transaction open;
//! - `after-business-commit-before-offset-commit`: the window that makes the
//!   inbox necessary: the effect is durable, Kafka will redeliver the record;
//! - `after-offset-commit`: everything done for this record.
//!
//! With `--no-inbox` there is no business transaction: only `after-receive`
//! and `after-offset-commit` are reached.

use std::sync::OnceLock;

use outbox_cdc::failpoint::CrashPoint;

pub(crate) const ENV_VAR: &str = "OUTBOX_CDC_CONSUMER_FAILPOINT";

pub(crate) const NAMES: [&str; 4] = [
    "after-receive",
    "before-business-commit",
    "after-business-commit-before-offset-commit",
    "after-offset-commit",
];

fn armed() -> Option<&'static CrashPoint> {
    static ARMED: OnceLock<Option<CrashPoint>> = OnceLock::new();
    ARMED.get_or_init(|| CrashPoint::from_env(ENV_VAR)).as_ref()
}

/// The armed point, for the start-up log line.
pub(crate) fn describe() -> Option<String> {
    armed().map(CrashPoint::describe)
}

/// Marks a crash point.
pub(crate) fn hit(name: &'static str) {
    debug_assert!(NAMES.contains(&name), "unknown consumer failpoint {name}");
    if let Some(armed) = armed() {
        armed.hit(name);
    }
}
