//! Shared helpers for integration tests: where the test servers are, unique names.
//!
//! `scripts/env.sh up` starts PostgreSQL and Kafka and writes `target/env/test.env`
//! with the variables read here. A missing variable is a test failure, never a skip.
#![allow(dead_code)]

pub mod relay;

use std::sync::atomic::{AtomicU32, Ordering};

fn required(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{var} is not set: the integration tests need the test servers. \
             Run `scripts/env.sh up && . target/env/test.env` (or `scripts/test.sh`) first."
        ),
    }
}

/// URL of the `outbox` role (LOGIN REPLICATION, scram-sha-256) on the test cluster.
pub fn pg_url() -> String {
    required("OUTBOX_CDC_TEST_PG")
}

/// URL of a superuser on the test cluster, for set-up and inspection.
pub fn pg_admin_url() -> String {
    required("OUTBOX_CDC_TEST_PG_ADMIN")
}

/// Kafka bootstrap servers of the test broker.
pub fn kafka_bootstrap() -> String {
    required("OUTBOX_CDC_TEST_KAFKA")
}

/// A name unique to this test process and call, safe as a slot, publication,
/// table or topic name (lower-case letters, digits, underscores).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}_{}_{n}_{nanos:x}", std::process::id())
}

/// Connects a tokio-postgres client with the admin URL and drives its connection.
pub async fn admin_client() -> tokio_postgres::Client {
    let url = pg_admin_url();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test PostgreSQL as admin ({url}): {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Installs a tracing subscriber once (RUST_LOG controls it; silent by default).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
