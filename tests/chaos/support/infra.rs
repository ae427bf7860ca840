//! Stopping and starting the shared servers through `scripts/env.sh`, with a
//! guard that brings them back when the test fails half-way.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Runs env.sh sub-commands; remembers what it took down until it is back.
pub struct Infra {
    env_sh: PathBuf,
    kafka_down: Arc<AtomicBool>,
    pg_down: Arc<AtomicBool>,
}

impl Infra {
    /// `OUTBOX_CDC_ENV_SH` (written to test.env by `scripts/env.sh up`) names the
    /// script that manages the servers the other variables point at.
    pub fn from_env() -> Infra {
        let env_sh = match std::env::var("OUTBOX_CDC_ENV_SH") {
            Ok(v) if !v.is_empty() => PathBuf::from(v),
            _ => panic!(
                "OUTBOX_CDC_ENV_SH is not set: the chaos test stops and starts the test servers with it. \
                 Run `scripts/env.sh up && . target/env/test.env` (or `scripts/test.sh`) first."
            ),
        };
        assert!(
            env_sh.is_file(),
            "OUTBOX_CDC_ENV_SH={} is not a file",
            env_sh.display()
        );
        Infra {
            env_sh,
            kafka_down: Arc::new(AtomicBool::new(false)),
            pg_down: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stops Kafka, keeps it down for `down_for`, starts it and waits until it serves.
    pub async fn kafka_outage(&self, down_for: Duration) -> Result<Duration, String> {
        let t0 = Instant::now();
        self.kafka_down.store(true, Ordering::SeqCst);
        self.run("kafka-stop").await?;
        tokio::time::sleep(down_for).await;
        self.run("kafka-start").await?;
        self.kafka_down.store(false, Ordering::SeqCst);
        Ok(t0.elapsed())
    }

    /// Restarts PostgreSQL (fast shutdown: sessions and walsenders are cut).
    pub async fn pg_restart(&self) -> Result<Duration, String> {
        let t0 = Instant::now();
        self.pg_down.store(true, Ordering::SeqCst);
        self.run("pg-restart").await?;
        self.pg_down.store(false, Ordering::SeqCst);
        Ok(t0.elapsed())
    }

    async fn run(&self, command: &'static str) -> Result<(), String> {
        let env_sh = self.env_sh.clone();
        tokio::task::spawn_blocking(move || run_env_sh(&env_sh, command))
            .await
            .map_err(|e| format!("env.sh {command}: {e}"))?
    }
}

fn run_env_sh(env_sh: &PathBuf, command: &str) -> Result<(), String> {
    let out = Command::new("bash")
        .arg(env_sh)
        .arg(command)
        .output()
        .map_err(|e| format!("cannot run {} {command}: {e}", env_sh.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {command} failed ({}): {}",
            env_sh.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Drop for Infra {
    fn drop(&mut self) {
        // A failed test must not leave the shared servers down for the next one.
        for (flag, command) in [
            (&self.kafka_down, "kafka-start"),
            (&self.pg_down, "pg-start"),
        ] {
            if flag.load(Ordering::SeqCst) {
                eprintln!("chaos: restoring the test servers: env.sh {command}");
                if let Err(e) = run_env_sh(&self.env_sh, command) {
                    eprintln!("chaos: {e}");
                }
            }
        }
    }
}
