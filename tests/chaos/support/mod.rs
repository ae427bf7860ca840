//! The chaos harness (issue 5): the real connector and the
//! reference consumer run as processes and are killed at every failpoint and
//! at random moments while a writer commits and rolls back orders; Kafka is
//! stopped and PostgreSQL restarted on the way. At the end the four invariants
//! of the seed are checked (see `verify`).
//!
//! Shared by the runs of the chaos test binary (tests/chaos: at_least_once,
//! exactly_once, partitioned). A run stops shared servers: `harness::run`
//! holds `common::alone` for its whole length.
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
pub use crate::common::{
    kafka_bootstrap, pg_admin_url, pg_url, try_admin_client_named, unique_name,
};

/// How the harness's own sessions are named on the server.
const APPLICATION_NAME: &str = "chaos-harness";

/// A superuser client, retried for a while (PostgreSQL may be restarting).
pub async fn admin_client() -> tokio_postgres::Client {
    crate::common::admin_client_named_retried(APPLICATION_NAME).await
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
