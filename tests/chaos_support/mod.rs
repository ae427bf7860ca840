//! The chaos harness of tests/chaos.rs (issue 5): the real connector and the
//! reference consumer run as processes and are killed at every failpoint and
//! at random moments while a writer commits and rolls back orders; Kafka is
//! stopped and PostgreSQL restarted on the way. At the end the four invariants
//! of the seed are checked (see `verify`).
//!
//! Included by tests/chaos.rs, tests/chaos_partitioned.rs and
//! tests/chaos_exactly_once.rs, each a one-test binary: the run stops shared
//! servers, so it must run alone in its test binary.
#![allow(dead_code)]

pub mod harness;
pub mod infra;
pub mod procs;
pub mod rng;
pub mod schema;
pub mod verify;
pub mod workload;

// Where the servers are and unique names: the same helpers as every other
// integration test (they fail, never skip, when the servers are missing).
pub use crate::common::{kafka_bootstrap, pg_admin_url, pg_url, unique_name};

/// A superuser client, or the error while the server is unreachable.
pub async fn try_admin_client() -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    try_admin_client_named("chaos-harness").await
}

/// The same, with the application_name the server shows (writers are found by it).
pub async fn try_admin_client_named(
    application_name: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = pg_admin_url().parse()?;
    config.application_name(application_name);
    let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// A superuser client, retried for a while (PostgreSQL may be restarting).
pub async fn admin_client() -> tokio_postgres::Client {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match try_admin_client().await {
            Ok(c) => return c,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            Err(e) => panic!(
                "cannot connect to the test PostgreSQL as admin ({}): {e}",
                pg_admin_url()
            ),
        }
    }
}

/// A superuser client that reconnects after PostgreSQL restarts.
#[derive(Default)]
pub struct Admin(Option<tokio_postgres::Client>);

impl Admin {
    pub async fn get(&mut self) -> &tokio_postgres::Client {
        if self.0.as_ref().is_some_and(|c| c.is_closed()) {
            self.0 = None;
        }
        if self.0.is_none() {
            self.0 = Some(admin_client().await);
        }
        match &self.0 {
            Some(c) => c,
            None => unreachable!("set above"),
        }
    }
}
