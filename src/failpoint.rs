//! Crash-injection points for the chaos harness (cargo feature `failpoints`).
//!
//! `OUTBOX_CDC_FAILPOINT=<name>:<n>` makes the process kill itself with SIGKILL
//! (exactly like `kill -9`: no destructors, no flushes) on the n-th time the
//! named point is reached. Without the feature every point compiles to nothing.
//!
//! Points in the connector: `after-receive`, `after-produce-before-ack`,
//! `after-ack-before-persist`, `after-persist-before-status-update`,
//! `during-shutdown`.

/// Marks a crash point; see the module documentation.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        $crate::failpoint::hit($name);
    };
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    pub const ENV_VAR: &str = "OUTBOX_CDC_FAILPOINT";

    struct Armed {
        name: String,
        at: u64,
        hits: AtomicU64,
    }

    fn armed() -> Option<&'static Armed> {
        static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let spec = std::env::var(ENV_VAR).ok()?;
                let (name, at) = spec.rsplit_once(':').unwrap_or((spec.as_str(), "1"));
                let at = at.parse().ok().filter(|n| *n > 0)?;
                Some(Armed {
                    name: name.to_owned(),
                    at,
                    hits: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    pub fn hit(name: &'static str) {
        let Some(armed) = armed() else { return };
        if armed.name != name {
            return;
        }
        if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.at {
            eprintln!("failpoint {name}: killing the process (hit {})", armed.at);
            // SIGKILL ourselves: the same as an operator's kill -9.
            let _ = std::process::Command::new("kill")
                .args(["-9", &std::process::id().to_string()])
                .status();
            std::process::abort();
        }
    }
}

#[cfg(feature = "failpoints")]
pub use armed::{ENV_VAR, hit};

/// A deliberately broken behaviour, for proving that the chaos verdict can
/// fail: `OUTBOX_CDC_SABOTAGE=never-persist` makes a `failpoints` build never
/// persist an acknowledged offset after the session's start. Always false
/// without the feature.
pub fn sabotaged(what: &str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        static SABOTAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        SABOTAGE
            .get_or_init(|| std::env::var("OUTBOX_CDC_SABOTAGE").unwrap_or_default())
            .split(',')
            .any(|s| s.trim() == what)
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = what;
        false
    }
}
