//! `outbox-cdc status`: the stored offset and the slot's position and lag, for a
//! person (a table) or a script (JSON); and the slot poll the running connector's
//! monitor shares with it.
//!
//! A running connector holds the sled store's lock for its whole life, so while
//! it runs the acknowledged position is read from its `/metrics` at `http.listen`
//! (`outbox_cdc_acked_lsn` is only ever set from a flushed store write, so it is
//! the stored offset). The store is opened only when no connector answers there,
//! and never created: `status` has no side effects on a connector's state.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use tokio_postgres::Client;

use crate::checkpoint::{OffsetStore, StoreError};
use crate::config::Config;
use crate::http;
use crate::metrics::{self, SlotGauges};
use crate::pg::control;
use crate::pg::{Lsn, PgConnectConfig, PgError};

/// How long `status` waits for the running connector's `/metrics`.
const METRICS_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything `status` reports. Field names are the JSON keys.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    pub slot_name: String,
    /// The acknowledged LSN this instance stored; `None` before the first start
    /// or when it cannot be read (then `stored_lsn_note` says why).
    pub stored_lsn: Option<Lsn>,
    /// `"store"` (read from the offset store: no connector running here) or
    /// `"connector"` (the running connector's `/metrics`, which holds the store).
    pub stored_lsn_source: Option<&'static str>,
    pub stored_system_id: Option<String>,
    /// When the stored LSN was written (Unix milliseconds; only read from the
    /// store). Replays after a lost slot start from about this time.
    pub stored_at_unix_ms: Option<i64>,
    pub stored_lsn_note: Option<String>,
    /// The running connector, when one answers at `http.listen`.
    pub connector: Option<ConnectorStatus>,
    pub current_wal_lsn: Option<Lsn>,
    /// Why the database could not be asked (then `slot` is unknown, not missing).
    pub database_error: Option<String>,
    /// `None`: the slot does not exist (or the database could not be asked).
    pub slot: Option<SlotStatus>,
}

/// What the running connector's `/metrics` says about itself.
#[derive(Debug, Serialize, PartialEq)]
pub struct ConnectorStatus {
    pub metrics_url: String,
    pub connected: bool,
    pub acked_lsn: Option<Lsn>,
    pub received_lsn: Option<Lsn>,
    pub events_published: Option<u64>,
    pub events_failed: Option<u64>,
    pub in_flight_events: Option<u64>,
    pub oldest_unacked_age_seconds: Option<f64>,
    pub reconnects: Option<u64>,
    /// Streamed transactions not yet committed, their bytes, the largest's.
    pub spill_transactions: Option<u64>,
    pub spill_bytes: Option<u64>,
    pub spill_largest_transaction_bytes: Option<u64>,
    /// The live witness: how long ago the last checked round's snapshot was
    /// taken (`None`: off or before its first round), rows checked, rows it
    /// found the stream had not delivered.
    pub reconcile_lag_seconds: Option<f64>,
    pub reconcile_checked_rows: Option<u64>,
    pub reconcile_missing: Option<u64>,
    /// Its `/health/ready/detail` (else `/health/ready`, names only): whether
    /// it is ready, and each reason with what holds or what to do (`None`
    /// when it did not answer with one).
    pub readiness: Option<crate::health::Readiness>,
}

/// The slot's row with lags computed against `pg_current_wal_lsn()`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SlotStatus {
    pub confirmed_flush_lsn: Option<Lsn>,
    pub restart_lsn: Option<Lsn>,
    pub active_pid: Option<i32>,
    pub lag_bytes: Option<u64>,
    pub restart_lag_bytes: Option<u64>,
    pub wal_status: Option<String>,
    pub safe_wal_size: Option<i64>,
}

impl SlotStatus {
    /// The values the slot gauges show.
    pub fn gauges(&self) -> SlotGauges {
        SlotGauges {
            lag_bytes: self.lag_bytes,
            restart_lag_bytes: self.restart_lag_bytes,
            safe_wal_size: self.safe_wal_size,
            wal_status: self.wal_status.clone(),
            active: self.active_pid.is_some(),
        }
    }
}

/// One poll of the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSnapshot {
    pub current_wal_lsn: Lsn,
    pub slot: Option<SlotStatus>,
}

/// Reads the slot's row, then the server's WAL position (in this order, so
/// that the lags are never negative): `pg_current_wal_lsn()` on a primary,
/// `pg_last_wal_replay_lsn()` on a standby.
pub async fn poll_slot(client: &Client, slot: &str) -> Result<SlotSnapshot, PgError> {
    let info = control::slot_info(client, slot).await?;
    let current_wal_lsn = control::wal_position(client).await?;
    let slot = info.map(|info| SlotStatus {
        lag_bytes: info
            .confirmed_flush_lsn
            .map(|l| current_wal_lsn.bytes_since(l)),
        restart_lag_bytes: info.restart_lsn.map(|l| current_wal_lsn.bytes_since(l)),
        confirmed_flush_lsn: info.confirmed_flush_lsn,
        restart_lsn: info.restart_lsn,
        active_pid: info.active_pid,
        wal_status: info.wal_status,
        safe_wal_size: info.safe_wal_size,
    });
    Ok(SlotSnapshot {
        current_wal_lsn,
        slot,
    })
}

/// Gathers the report. Fails only on a configuration error; an unreachable
/// database or an unreadable store is reported in the fields.
pub async fn collect(config: &Config) -> anyhow::Result<StatusReport> {
    let slot_name = config.postgres.slot.clone();
    let connector = running_connector(&config.http.listen).await;

    let mut stored = Stored::default();
    match &connector {
        Some(c) => {
            stored.lsn = c.acked_lsn;
            stored.source = c.acked_lsn.map(|_| "connector");
            stored.note = Some(format!(
                "a connector is running here: it holds the offset store, so the stored LSN is its \
                 outbox_cdc_acked_lsn from {}",
                c.metrics_url
            ));
        }
        None => stored = read_store(config),
    }

    let pg = PgConnectConfig::parse(&config.postgres.url)?;
    let (current_wal_lsn, slot, database_error) = match pg.connect_sql().await {
        Ok(client) => match poll_slot(&client, &slot_name).await {
            Ok(snapshot) => (Some(snapshot.current_wal_lsn), snapshot.slot, None),
            Err(e) => (None, None, Some(e.to_string())),
        },
        Err(e) => (None, None, Some(e.to_string())),
    };
    Ok(StatusReport {
        slot_name,
        stored_lsn: stored.lsn,
        stored_lsn_source: stored.source,
        stored_system_id: stored.system_id,
        stored_at_unix_ms: stored.at_unix_ms,
        stored_lsn_note: stored.note,
        connector,
        current_wal_lsn,
        database_error,
        slot,
    })
}

#[derive(Default)]
struct Stored {
    lsn: Option<Lsn>,
    source: Option<&'static str>,
    system_id: Option<String>,
    at_unix_ms: Option<i64>,
    note: Option<String>,
}

fn read_store(config: &Config) -> Stored {
    let path = &config.offsets.path;
    let note = |text: String| Stored {
        note: Some(text),
        ..Stored::default()
    };
    // sled creates a missing directory on open; status must not.
    if !path.exists() {
        return note(format!(
            "no offset store at {} (offsets.path): this instance never started",
            path.display()
        ));
    }
    let store = match OffsetStore::open(path) {
        Ok(store) => store,
        Err(e @ StoreError::Locked { .. }) => {
            let hint = if config.http.listen.is_empty() {
                "http.listen is \"\", so its position cannot be read".to_owned()
            } else {
                format!("nothing answered at http.listen = {}", config.http.listen)
            };
            return note(format!("{e}; a connector probably runs but {hint}"));
        }
        Err(e) => return note(e.to_string()),
    };
    match store.load(&config.postgres.slot) {
        Ok(Some(offset)) => Stored {
            lsn: Some(offset.lsn),
            source: Some("store"),
            system_id: Some(offset.system_id),
            at_unix_ms: Some(offset.updated_at_unix_ms),
            note: None,
        },
        Ok(None) => note(format!(
            "no offset stored for slot {:?} in {}",
            config.postgres.slot,
            path.display()
        )),
        Err(e) => note(e.to_string()),
    }
}

/// The connector at `listen`, if one answers `/metrics` there.
async fn running_connector(listen: &str) -> Option<ConnectorStatus> {
    if listen.is_empty() {
        return None;
    }
    let addr = http::client_address(listen).ok()?;
    let body = http::get(addr, "/metrics", METRICS_TIMEOUT).await.ok()?;
    let samples = parse_samples(&body);
    // Something else may listen there; only our own exposition counts.
    samples.get(metrics::CONNECTED)?;
    let mut status = connector_status(format!("http://{addr}/metrics"), &samples);
    // The details are served to this host only; a connector that predates
    // them, or one reached on an address it does not take for this host,
    // still names the reasons and causes.
    for path in ["/health/ready/detail", "/health/ready"] {
        status.readiness = http::get_any(addr, path, METRICS_TIMEOUT)
            .await
            .ok()
            .and_then(|(_, body)| serde_json::from_str(&body).ok());
        if status.readiness.is_some() {
            break;
        }
    }
    Some(status)
}

fn connector_status(metrics_url: String, samples: &HashMap<&str, &str>) -> ConnectorStatus {
    let int = |name: &str| samples.get(name).and_then(|v| v.parse::<u64>().ok());
    let lsn = |name: &str| int(name).filter(|v| *v != 0).map(Lsn::new);
    ConnectorStatus {
        metrics_url,
        connected: int(metrics::CONNECTED) == Some(1),
        acked_lsn: lsn(metrics::ACKED_LSN),
        received_lsn: lsn(metrics::RECEIVED_LSN),
        events_published: int(metrics::EVENTS_PUBLISHED),
        events_failed: int(metrics::EVENTS_FAILED),
        in_flight_events: int(metrics::IN_FLIGHT_EVENTS),
        oldest_unacked_age_seconds: samples
            .get(metrics::OLDEST_UNACKED_AGE)
            .and_then(|v| v.parse().ok()),
        reconnects: int(metrics::RECONNECTS),
        spill_transactions: int(metrics::SPILL_TRANSACTIONS),
        spill_bytes: int(metrics::SPILL_BYTES),
        spill_largest_transaction_bytes: int(metrics::SPILL_LARGEST_BYTES),
        reconcile_lag_seconds: samples
            .get(metrics::RECONCILE_LAG)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|lag| *lag >= 0.0),
        reconcile_checked_rows: int(metrics::RECONCILE_CHECKED),
        reconcile_missing: int(metrics::RECONCILE_MISSING),
        readiness: None,
    }
}

/// Unlabelled samples of a Prometheus text exposition: name → value text.
fn parse_samples(text: &str) -> HashMap<&str, &str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.contains('{'))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, value)| (name, value.trim()))
        .collect()
}

impl StatusReport {
    pub fn to_table(&self) -> String {
        let mut rows: Vec<(&str, String)> = vec![
            ("slot", self.slot_name.clone()),
            ("stored acked LSN", shown(self.stored_lsn)),
            ("  read from", shown(self.stored_lsn_source)),
            ("stored system id", shown(self.stored_system_id.as_ref())),
            ("stored at (unix ms)", shown(self.stored_at_unix_ms)),
        ];
        if let Some(note) = &self.stored_lsn_note {
            rows.push(("  note", note.clone()));
        }
        match &self.connector {
            None => rows.push(("connector", "not answering at http.listen".to_owned())),
            Some(c) => {
                let state = if c.connected {
                    "streaming"
                } else {
                    "running, not streaming"
                };
                rows.push(("connector", format!("{state} ({})", c.metrics_url)));
                rows.push(("  received LSN", shown(c.received_lsn)));
                rows.push(("  acked LSN", shown(c.acked_lsn)));
                rows.push(("  events published", shown(c.events_published)));
                rows.push(("  events failed", shown(c.events_failed)));
                rows.push(("  in flight", shown(c.in_flight_events)));
                rows.push(("  oldest unacked (s)", shown(c.oldest_unacked_age_seconds)));
                rows.push(("  reconnects", shown(c.reconnects)));
                rows.push((
                    "  streamed, uncommitted",
                    match (c.spill_transactions, c.spill_bytes) {
                        (Some(n), Some(b)) => format!(
                            "{n} transactions, {b} bytes (largest {})",
                            c.spill_largest_transaction_bytes.unwrap_or(0)
                        ),
                        _ => "-".to_owned(),
                    },
                ));
                rows.push((
                    "  live witness",
                    match c.reconcile_lag_seconds {
                        None => "off, or before its first round".to_owned(),
                        Some(lag) => format!(
                            "rows committed before {lag:.1} s ago checked; {} rows checked, {} not \
                             delivered by the stream (published from the table)",
                            shown(c.reconcile_checked_rows),
                            shown(c.reconcile_missing)
                        ),
                    },
                ));
                if let Some(r) = &c.readiness {
                    let ready = if r.ready { "yes" } else { "NO" };
                    rows.push(("  ready", ready.to_owned()));
                    for reason in &r.reasons {
                        let ok = if reason.ok { "ok" } else { "NOT OK" };
                        let why = match (&reason.cause, reason.message.is_empty()) {
                            (_, false) => reason.message.clone(),
                            (Some(cause), true) => format!("{cause} (details in the log)"),
                            (None, true) => "-".to_owned(),
                        };
                        rows.push((reason_label(&reason.name), format!("{ok}: {why}")));
                    }
                }
            }
        }
        if let Some(e) = &self.database_error {
            rows.push(("database", format!("UNREACHABLE: {e}")));
        } else {
            rows.push(("current WAL LSN", shown(self.current_wal_lsn)));
            match &self.slot {
                None => rows.push(("slot state", "MISSING".to_owned())),
                Some(s) => {
                    rows.push(("confirmed_flush_lsn", shown(s.confirmed_flush_lsn)));
                    rows.push(("restart_lsn", shown(s.restart_lsn)));
                    rows.push((
                        "active pid",
                        s.active_pid
                            .map_or_else(|| "- (no consumer)".to_owned(), |p| p.to_string()),
                    ));
                    rows.push(("lag (bytes)", shown(s.lag_bytes)));
                    rows.push(("retained WAL (bytes)", shown(s.restart_lag_bytes)));
                    rows.push(("wal_status", shown(s.wal_status.as_ref())));
                    rows.push((
                        "safe_wal_size",
                        s.safe_wal_size
                            .map_or_else(|| "- (unlimited)".to_owned(), |b| b.to_string()),
                    ));
                }
            }
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(k, v)| format!("{k:<width$}  {v}\n"))
            .collect()
    }
}

/// A value in the table, `-` when unknown.
fn shown(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A readiness reason's row label in the table.
fn reason_label(name: &str) -> &'static str {
    match name {
        crate::health::STREAMING => "    streaming",
        crate::health::KAFKA_REACHABLE => "    kafka_reachable",
        crate::health::ACKNOWLEDGING => "    acknowledging",
        crate::health::SEQUENCE_GAPS => "    sequence_gaps",
        crate::health::RECONCILED => "    reconciled",
        _ => "    (reason)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn reads_the_connector_back_from_its_own_exposition() {
        let m = Metrics::default();
        m.set_connected(true);
        m.set_acked(Lsn::new(0x16_B374_D848));
        m.set_received(Lsn::new(0x16_B374_D900));
        for _ in 0..42 {
            m.published(1);
        }
        m.set_in_flight(0, 0, Some(1_500_000));
        m.set_spill(2, 3000, 1000, 2500);
        m.reconcile_round(7, std::time::Duration::from_millis(2500));
        m.reconcile_found(1);
        let text = m.render();
        let samples = parse_samples(&text);
        let c = connector_status("u".into(), &samples);
        assert_eq!(
            c,
            ConnectorStatus {
                metrics_url: "u".into(),
                connected: true,
                acked_lsn: Some("16/B374D848".parse().unwrap()),
                received_lsn: Some("16/B374D900".parse().unwrap()),
                events_published: Some(42),
                events_failed: Some(0),
                in_flight_events: Some(0),
                oldest_unacked_age_seconds: Some(1.5),
                reconnects: Some(0),
                spill_transactions: Some(2),
                spill_bytes: Some(3000),
                spill_largest_transaction_bytes: Some(2500),
                reconcile_lag_seconds: Some(2.5),
                reconcile_checked_rows: Some(7),
                reconcile_missing: Some(1),
                readiness: None,
            }
        );
        let idle = Metrics::default();
        let c = connector_status("u".into(), &parse_samples(&idle.render()));
        assert_eq!(c.reconcile_lag_seconds, None, "-1: before the first round");
        assert!(!c.connected);
        assert_eq!(c.acked_lsn, None, "0 means not yet known");
    }

    #[test]
    fn json_has_the_documented_keys() {
        let report = StatusReport {
            slot_name: "s".into(),
            stored_lsn: Some(Lsn::new(16)),
            stored_lsn_source: Some("store"),
            stored_system_id: Some("7".into()),
            stored_at_unix_ms: Some(1_700_000_000_000),
            stored_lsn_note: None,
            connector: None,
            current_wal_lsn: Some(Lsn::new(32)),
            database_error: None,
            slot: Some(SlotStatus {
                confirmed_flush_lsn: Some(Lsn::new(16)),
                restart_lsn: Some(Lsn::new(8)),
                active_pid: None,
                lag_bytes: Some(16),
                restart_lag_bytes: Some(24),
                wal_status: Some("reserved".into()),
                safe_wal_size: None,
            }),
        };
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["stored_lsn"], "0/10");
        assert_eq!(v["slot"]["confirmed_flush_lsn"], "0/10");
        assert_eq!(v["slot"]["restart_lsn"], "0/8");
        assert!(v["slot"]["active_pid"].is_null());
        assert_eq!(v["slot"]["lag_bytes"], 16);
        assert_eq!(v["slot"]["wal_status"], "reserved");
        let table = report.to_table();
        assert!(
            table.contains("no consumer") && table.contains("unlimited"),
            "{table}"
        );
    }

    /// H5: the table prints each reason's message from the detail; a
    /// connector reached only through the public body gives the cause.
    #[tokio::test]
    async fn the_table_shows_readiness_details_read_on_this_host() {
        let m = std::sync::Arc::new(Metrics::default());
        m.health
            .kafka_unreachable("broker k1.internal:9093 refused".into());
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let server = http::serve(
            &crate::config::HttpSettings {
                listen: addr.to_string(),
                ..Default::default()
            },
            m,
        )
        .await
        .unwrap()
        .unwrap();
        let connector = running_connector(&addr.to_string()).await.unwrap();
        let r = connector.readiness.as_ref().unwrap();
        let kafka = r.reason("kafka_reachable").unwrap();
        assert!(kafka.message.contains("k1.internal:9093"), "{r:?}");
        server.abort();
        let mut report = StatusReport {
            slot_name: "s".into(),
            stored_lsn: None,
            stored_lsn_source: None,
            stored_system_id: None,
            stored_at_unix_ms: None,
            stored_lsn_note: None,
            connector: Some(connector),
            current_wal_lsn: None,
            database_error: None,
            slot: None,
        };
        assert!(report.to_table().contains("k1.internal:9093"));
        let c = report.connector.as_mut().unwrap();
        c.readiness = c.readiness.as_ref().map(|r| r.public());
        let table = report.to_table();
        assert!(
            table.contains("NOT OK: kafka_unreachable (details in the log)"),
            "{table}"
        );
    }
}
