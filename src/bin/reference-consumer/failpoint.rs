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

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const ENV_VAR: &str = "OUTBOX_CDC_CONSUMER_FAILPOINT";

pub(crate) const NAMES: [&str; 4] = [
    "after-receive",
    "before-business-commit",
    "after-business-commit-before-offset-commit",
    "after-offset-commit",
];

struct Armed {
    name: String,
    at: u64,
    hits: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| parse(&std::env::var(ENV_VAR).ok()?))
        .as_ref()
}

fn parse(spec: &str) -> Option<Armed> {
    let (name, at) = spec.rsplit_once(':').unwrap_or((spec, "1"));
    let at = at.trim().parse().ok().filter(|n| *n > 0)?;
    Some(Armed {
        name: name.trim().to_owned(),
        at,
        hits: AtomicU64::new(0),
    })
}

/// The armed point, for the start-up log line.
pub(crate) fn describe() -> Option<String> {
    armed().map(|a| format!("{}:{}", a.name, a.at))
}

/// Marks a crash point.
pub(crate) fn hit(name: &'static str) {
    debug_assert!(NAMES.contains(&name), "unknown consumer failpoint {name}");
    let Some(armed) = armed() else { return };
    if armed.name != name {
        return;
    }
    if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.at {
        eprintln!("failpoint {name}: killing the process (hit {})", armed.at);
        // SIGKILL ourselves, as an operator's kill -9 would.
        let _ = std::process::Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn spec_parsing() {
        let a = parse("after-offset-commit:3").unwrap();
        assert_eq!((a.name.as_str(), a.at), ("after-offset-commit", 3));
        let a = parse("after-receive").unwrap();
        assert_eq!((a.name.as_str(), a.at), ("after-receive", 1));
        assert!(parse("after-receive:0").is_none());
        assert!(parse("after-receive:x").is_none());
    }
}
