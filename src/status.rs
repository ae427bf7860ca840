//! `outbox-cdc status`: the stored offset and the slot's position and lag, for a
//! person (a table) or a script (JSON).

use serde::Serialize;

use crate::checkpoint::OffsetStore;
use crate::config::Config;
use crate::pg::control;
use crate::pg::{Lsn, PgConnectConfig};

#[derive(Debug, Serialize)]
pub struct StatusReport {
    pub slot_name: String,
    /// The acked LSN in the local store; `None` before the first start. While the
    /// connector runs, the store is locked and this reads `stored_lsn_note`.
    pub stored_lsn: Option<Lsn>,
    pub stored_system_id: Option<String>,
    pub stored_lsn_note: Option<String>,
    pub current_wal_lsn: Lsn,
    pub slot: Option<SlotStatus>,
}

#[derive(Debug, Serialize)]
pub struct SlotStatus {
    pub confirmed_flush_lsn: Option<Lsn>,
    pub restart_lsn: Option<Lsn>,
    pub active_pid: Option<i32>,
    pub lag_bytes: Option<u64>,
    pub restart_lag_bytes: Option<u64>,
    pub wal_status: Option<String>,
    pub safe_wal_size: Option<i64>,
}

pub async fn collect(config: &Config) -> anyhow::Result<StatusReport> {
    let slot_name = config.postgres.slot.clone();
    let (stored_lsn, stored_system_id, stored_lsn_note) = match OffsetStore::open(&config.offsets.path) {
        Ok(store) => match store.load(&slot_name)? {
            Some(s) => (Some(s.lsn), Some(s.system_id), None),
            None => (None, None, Some("no offset stored yet".to_owned())),
        },
        Err(e) => (None, None, Some(format!("offset store unavailable ({e}); a running connector holds it"))),
    };
    let pg = PgConnectConfig::parse(&config.postgres.url)?;
    let client = pg.connect_sql().await?;
    let current_wal_lsn = control::current_wal_lsn(&client).await?;
    let slot = control::slot_info(&client, &slot_name).await?.map(|info| SlotStatus {
        lag_bytes: info.confirmed_flush_lsn.map(|l| current_wal_lsn.bytes_since(l)),
        restart_lag_bytes: info.restart_lsn.map(|l| current_wal_lsn.bytes_since(l)),
        confirmed_flush_lsn: info.confirmed_flush_lsn,
        restart_lsn: info.restart_lsn,
        active_pid: info.active_pid,
        wal_status: info.wal_status,
        safe_wal_size: info.safe_wal_size,
    });
    Ok(StatusReport {
        slot_name,
        stored_lsn,
        stored_system_id,
        stored_lsn_note,
        current_wal_lsn,
        slot,
    })
}

impl StatusReport {
    pub fn to_table(&self) -> String {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
        let mut rows: Vec<(&str, String)> = vec![
            ("slot", self.slot_name.clone()),
            ("stored acked LSN", opt(self.stored_lsn.map(|l| l.to_string()))),
            ("stored system id", opt(self.stored_system_id.clone())),
            ("current WAL LSN", self.current_wal_lsn.to_string()),
        ];
        if let Some(note) = &self.stored_lsn_note {
            rows.push(("note", note.clone()));
        }
        match &self.slot {
            None => rows.push(("slot state", "MISSING".to_owned())),
            Some(s) => {
                rows.push(("confirmed_flush_lsn", opt(s.confirmed_flush_lsn.map(|l| l.to_string()))));
                rows.push(("restart_lsn", opt(s.restart_lsn.map(|l| l.to_string()))));
                rows.push(("active pid", opt(s.active_pid.map(|p| p.to_string()))));
                rows.push(("lag (bytes)", opt(s.lag_bytes.map(|b| b.to_string()))));
                rows.push(("retained WAL (bytes)", opt(s.restart_lag_bytes.map(|b| b.to_string()))));
                rows.push(("wal_status", opt(s.wal_status.clone())));
                rows.push(("safe_wal_size", opt(s.safe_wal_size.map(|b| b.to_string()))));
            }
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect()
    }
}
