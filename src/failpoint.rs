//! Crash-injection points for the chaos harness (cargo feature `failpoints`).
//!
//! `OUTBOX_CDC_FAILPOINT=<name>:<n>` makes the process kill itself with SIGKILL
//! (exactly like `kill -9`: no destructors, no flushes) on the n-th time the
//! named point is reached. Without the feature every point compiles to nothing.
//!
//! Points in the connector: `after-receive`, `after-produce-before-ack`,
//! `after-ack-before-persist`, `after-persist-before-status-update`,
//! `during-shutdown`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Marks a crash point; see the module documentation.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        $crate::failpoint::hit($name);
    };
}

/// A crash point armed by a spec `<name>:<n>` (`<name>` alone is `<name>:1`):
/// the n-th time the named point is reached the process kills itself with
/// SIGKILL. Shared by the connector's points (behind the `failpoints`
/// feature) and the reference consumer's (always compiled, it is a test tool).
#[derive(Debug)]
pub struct CrashPoint {
    name: String,
    at: u64,
    hits: AtomicU64,
}

impl CrashPoint {
    /// Reads the spec from the environment variable `var`; `None` when it is
    /// unset or not a valid spec (a count of 0 or not a number).
    pub fn from_env(var: &str) -> Option<CrashPoint> {
        CrashPoint::parse(&std::env::var(var).ok()?)
    }

    pub fn parse(spec: &str) -> Option<CrashPoint> {
        let (name, at) = spec.rsplit_once(':').unwrap_or((spec, "1"));
        let at = at.trim().parse().ok().filter(|n| *n > 0)?;
        Some(CrashPoint {
            name: name.trim().to_owned(),
            at,
            hits: AtomicU64::new(0),
        })
    }

    /// `<name>:<n>`, for a start-up log line.
    pub fn describe(&self) -> String {
        format!("{}:{}", self.name, self.at)
    }

    /// Counts a pass through the point `name`; kills the process on the
    /// armed one's n-th pass. Other names are ignored.
    pub fn hit(&self, name: &str) {
        if self.name != name {
            return;
        }
        if self.hits.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            eprintln!("failpoint {name}: killing the process (hit {})", self.at);
            // SIGKILL ourselves, as an operator's kill -9 would: no
            // destructors, no flushes, no offset commit on the way out.
            let _ = std::process::Command::new("kill")
                .args(["-9", &std::process::id().to_string()])
                .status();
            std::process::abort();
        }
    }
}

/// The connector's armed point (`OUTBOX_CDC_FAILPOINT`).
#[cfg(feature = "failpoints")]
pub const ENV_VAR: &str = "OUTBOX_CDC_FAILPOINT";

/// Marks a connector crash point (through [`failpoint!`](crate::failpoint!)).
#[cfg(feature = "failpoints")]
pub fn hit(name: &'static str) {
    static ARMED: std::sync::OnceLock<Option<CrashPoint>> = std::sync::OnceLock::new();
    if let Some(armed) = ARMED.get_or_init(|| CrashPoint::from_env(ENV_VAR)) {
        armed.hit(name);
    }
}

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

/// A number given to a sabotage, `OUTBOX_CDC_SABOTAGE=<what>:<n>` (for
/// example `drop-insert-every:97`: the session skips every 97th outbox
/// insert it decodes, as an unknown cause of loss would); `None` without the
/// feature, when unset, or not a positive number.
pub fn sabotage_count(what: &str) -> Option<u64> {
    #[cfg(feature = "failpoints")]
    {
        std::env::var("OUTBOX_CDC_SABOTAGE")
            .unwrap_or_default()
            .split(',')
            .filter_map(|s| s.trim().split_once(':'))
            .find(|(name, _)| *name == what)
            .and_then(|(_, n)| n.trim().parse().ok())
            .filter(|n| *n > 0)
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = what;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::CrashPoint;

    #[test]
    fn spec_parsing() {
        let a = CrashPoint::parse("after-offset-commit:3").unwrap();
        assert_eq!(a.describe(), "after-offset-commit:3");
        let a = CrashPoint::parse("after-receive").unwrap();
        assert_eq!(a.describe(), "after-receive:1");
        assert!(CrashPoint::parse("after-receive:0").is_none());
        assert!(CrashPoint::parse("after-receive:x").is_none());
    }

    /// Plain `cargo test --all-targets` (no features) must not build a test
    /// that only works with crash points compiled in: every file under
    /// tests/ that arms one (sets `OUTBOX_CDC_FAILPOINT`) or refuses to run
    /// without them belongs to a test binary declared with
    /// `required-features = ["failpoints"]` (cargo skips it there), or keeps
    /// such tests behind `#[cfg(feature = "failpoints")]`; scripts/test.sh
    /// passes `--features failpoints` and runs them.
    #[test]
    fn tests_needing_failpoints_declare_the_feature() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let manifest: toml::Table =
            toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
        // The folder (tests/NAME/main.rs) or file (tests/NAME.rs) of each
        // gated binary.
        let gated: Vec<std::path::PathBuf> = manifest
            .get("test")
            .and_then(|t| t.as_array())
            .into_iter()
            .flatten()
            .filter(|t| {
                t.get("required-features")
                    .and_then(|f| f.as_array())
                    .is_some_and(|f| f.iter().any(|f| f.as_str() == Some("failpoints")))
            })
            .filter_map(|t| t.get("path").and_then(|p| p.as_str()))
            .map(|p| match p.strip_suffix("/main.rs") {
                Some(dir) => root.join(dir),
                None => root.join(p),
            })
            .collect();
        let mut files = Vec::new();
        let mut dirs = vec![root.join("tests")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        let mut needing = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            if text.contains("\"OUTBOX_CDC_FAILPOINT\"")
                || text.contains("cfg!(feature = \"failpoints\")")
            {
                needing.push(path);
            }
        }
        needing.sort();
        assert!(!needing.is_empty());
        for path in &needing {
            let in_gated_binary = gated.iter().any(|g| path.starts_with(g));
            let gated_itself = std::fs::read_to_string(path)
                .unwrap()
                .contains("#[cfg(feature = \"failpoints\")]");
            assert!(
                in_gated_binary || gated_itself,
                "{} needs --features failpoints: put its tests behind \
                 #[cfg(feature = \"failpoints\")], or in a test binary declared in Cargo.toml \
                 with required-features = [\"failpoints\"]",
                path.strip_prefix(root).unwrap_or(path).display()
            );
        }
    }
}
