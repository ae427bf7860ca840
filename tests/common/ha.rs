//! Failover helpers: the standby `scripts/env.sh up --standby` makes, a
//! multi-host URL over both servers, and a writer that commits until the
//! primary goes away.

use std::time::Duration;

use super::{required, unique_name};

/// The connector's URL over the primary, then the standby, keeping only a
/// read-write server (libpq's `target_session_attrs`).
pub fn multi_host_url() -> String {
    let primary = super::pg_url();
    let port = required("OUTBOX_CDC_PG_STANDBY_PORT");
    let at = primary.rfind('@').expect("user in the test URL") + 1;
    let slash = at + primary[at..].find('/').expect("database in the test URL");
    format!(
        "{}{},127.0.0.1:{port}{}?target_session_attrs=read-write",
        &primary[..at],
        &primary[at..slash],
        &primary[slash..]
    )
}

/// A superuser on the standby (the new primary after a promotion).
pub async fn standby_admin() -> tokio_postgres::Client {
    let url = required("OUTBOX_CDC_TEST_PG_STANDBY_ADMIN");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to the standby {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// The slot on the standby: (synced, confirmed_flush_lsn), if it exists there.
pub async fn slot_on_standby(
    standby: &tokio_postgres::Client,
    slot: &str,
) -> Option<(bool, Option<String>)> {
    standby
        .query_opt(
            "SELECT synced, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("pg_replication_slots on the standby")
        .map(|r| (r.get(0), r.get(1)))
}

/// Commits one outbox row per transaction on its own connection to the
/// primary, until the primary stops answering or `stop` is set; returns the
/// event ids whose COMMIT succeeded.
pub fn spawn_primary_writer(
    table: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let client = super::admin_client().await;
        let mut ids = Vec::new();
        let aggregate = unique_name("w");
        for seq in 1i64.. {
            if *stop.borrow() {
                break;
            }
            let inserted = client
                .query_one(
                    &format!(
                        "INSERT INTO public.{table} (event_id, aggregate_type, aggregate_id, aggregate_sequence, \
                         event_type, payload) VALUES (gen_random_uuid(), 'order', $1, $2, 'Placed', '{{}}') \
                         RETURNING event_id::text"
                    ),
                    &[&aggregate, &seq],
                )
                .await;
            match inserted {
                Ok(row) => ids.push(row.get(0)),
                Err(_) => break, // the primary is gone
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ids
    })
}

/// Event ids of the table as the promoted standby has them.
pub async fn ids_on(client: &tokio_postgres::Client, table: &str) -> Vec<String> {
    client
        .query(&format!("SELECT event_id::text FROM public.{table}"), &[])
        .await
        .unwrap_or_else(|e| panic!("reading {table}: {e}"))
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `outbox-cdc check` with `config` and environment overrides; its report.
pub fn check_report(config: &std::path::Path, env: &[(&str, String)]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["check", "--config"])
        .arg(config)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run outbox-cdc check");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The report's line for check `name`.
pub fn check_line<'a>(report: &'a str, name: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(name)))
        .unwrap_or_else(|| panic!("no {name:?} line in the check report:\n{report}"))
}
