//! Where to start streaming: the stored offset against the slot (DESIGN.md §5).
//!
//! Pure decision, no I/O. Rules:
//! - an offset stored for another cluster (system identifier) is refused;
//! - slot missing with an offset stored: events may be lost, refused unless the
//!   operator passes the explicit recreate flag;
//! - slot missing, nothing stored: create it (if allowed) and start there;
//! - slot present: start at max(stored, confirmed_flush_lsn). A slot whose
//!   confirmed position is AHEAD of the stored offset was advanced by someone
//!   else or recreated; this instance never reports beyond what it stored, so
//!   starting would skip events it has not published. Refused unless
//!   `allow_slot_ahead` (an HA standby taking over from another instance).

use crate::checkpoint::StoredOffset;
use crate::error::StartRefused;
use crate::pg::Lsn;
use crate::pg::control::SlotInfo;

/// What the caller must do before streaming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumePlan {
    /// Create the slot and start at its consistent point (first start).
    CreateSlot,
    /// The operator asked to recreate a lost slot: repair the gap from the
    /// outbox table, create the slot, start at its consistent point. A slot
    /// that still exists but was invalidated (`wal_status = lost`) is dropped
    /// first (`drop_invalidated`).
    RecreateSlot {
        forgotten: Lsn,
        drop_invalidated: bool,
    },
    /// Stream from `start`; transactions ending at or before `skip_through` are dropped.
    Resume { start: Lsn, skip_through: Lsn },
}

/// Inputs of the decision.
pub struct ResumeInputs<'a> {
    pub slot: &'a str,
    pub database: &'a str,
    pub server_system_id: &'a str,
    /// The server's current WAL flush position (IDENTIFY_SYSTEM xlogpos).
    pub server_flush_lsn: Lsn,
    pub stored: Option<&'a StoredOffset>,
    pub slot_info: Option<&'a SlotInfo>,
    pub create_slot: bool,
    pub recreate_slot: bool,
    pub allow_slot_ahead: bool,
}

pub fn decide(input: &ResumeInputs<'_>) -> Result<ResumePlan, StartRefused> {
    let slot = input.slot.to_owned();
    if let Some(stored) = input.stored {
        refuse_foreign_offset(input, stored)?;
    }
    let Some(info) = input.slot_info else {
        return match input.stored {
            Some(stored) if input.recreate_slot => Ok(ResumePlan::RecreateSlot {
                forgotten: stored.lsn,
                drop_invalidated: false,
            }),
            Some(stored) => Err(StartRefused::SlotLost {
                slot,
                stored_lsn: stored.lsn,
            }),
            None if input.create_slot || input.recreate_slot => Ok(ResumePlan::CreateSlot),
            None => Err(StartRefused::SlotMissing { slot }),
        };
    };
    refuse_foreign_slot(input, info)?;
    if info.wal_status.as_deref() == Some("lost") {
        // It exists, but the server removed WAL it needed: as lost as a
        // dropped slot.
        return match input.stored {
            Some(stored) if input.recreate_slot => Ok(ResumePlan::RecreateSlot {
                forgotten: stored.lsn,
                drop_invalidated: true,
            }),
            _ => Err(StartRefused::SlotInvalidated {
                slot,
                stored_lsn: input.stored.map(|s| s.lsn),
            }),
        };
    }
    let confirmed = info.confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
    match input.stored {
        None => Ok(ResumePlan::Resume {
            start: confirmed,
            skip_through: Lsn::ZERO,
        }),
        Some(stored) if confirmed > stored.lsn && !input.allow_slot_ahead => {
            Err(StartRefused::SlotAhead {
                slot,
                stored_lsn: stored.lsn,
                confirmed,
            })
        }
        // From the slot's position, not the offset: what lies between is sent
        // again and dropped (`skip_through`), and the sequence audit reads
        // back from it the numbers a crash kept from the store.
        Some(stored) => Ok(ResumePlan::Resume {
            start: confirmed,
            skip_through: stored.lsn,
        }),
    }
}

/// The stored offset must be this cluster's, and a position it had flushed:
/// a server behind it has lost or never had that WAL.
fn refuse_foreign_offset(
    input: &ResumeInputs<'_>,
    stored: &StoredOffset,
) -> Result<(), StartRefused> {
    let slot = input.slot.to_owned();
    if stored.system_id != input.server_system_id {
        return Err(StartRefused::OtherCluster {
            slot,
            stored_lsn: stored.lsn,
            stored_system_id: stored.system_id.clone(),
            server_system_id: input.server_system_id.to_owned(),
        });
    }
    if stored.lsn > input.server_flush_lsn {
        return Err(StartRefused::OffsetAheadOfServer {
            slot,
            stored_lsn: stored.lsn,
            server_flush_lsn: input.server_flush_lsn,
        });
    }
    Ok(())
}

/// The slot must decode with pgoutput for this database.
fn refuse_foreign_slot(input: &ResumeInputs<'_>, info: &SlotInfo) -> Result<(), StartRefused> {
    let slot = input.slot.to_owned();
    if let Some(plugin) = info.plugin.as_deref()
        && plugin != "pgoutput"
    {
        return Err(StartRefused::WrongPlugin {
            slot,
            plugin: plugin.to_owned(),
        });
    }
    if let Some(db) = info.database.as_deref()
        && db != input.database
    {
        return Err(StartRefused::WrongDatabase {
            slot,
            slot_database: db.to_owned(),
            database: input.database.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(lsn: u64, sys: &str) -> StoredOffset {
        StoredOffset {
            lsn: Lsn::new(lsn),
            system_id: sys.to_owned(),
            updated_at_unix_ms: 0,
            acked_commit_time: None,
            commit_time_is_slot_creation: false,
        }
    }

    fn slot(confirmed: u64) -> SlotInfo {
        SlotInfo {
            slot_name: "s".into(),
            plugin: Some("pgoutput".into()),
            database: Some("app".into()),
            active_pid: None,
            confirmed_flush_lsn: Some(Lsn::new(confirmed)),
            restart_lsn: Some(Lsn::new(confirmed)),
            wal_status: Some("reserved".into()),
            safe_wal_size: None,
        }
    }

    fn inputs<'a>(
        stored: Option<&'a StoredOffset>,
        info: Option<&'a SlotInfo>,
    ) -> ResumeInputs<'a> {
        ResumeInputs {
            slot: "s",
            database: "app",
            server_system_id: "42",
            server_flush_lsn: Lsn::new(10_000),
            stored,
            slot_info: info,
            create_slot: true,
            recreate_slot: false,
            allow_slot_ahead: false,
        }
    }

    #[test]
    fn first_start_creates_the_slot() {
        assert_eq!(decide(&inputs(None, None)), Ok(ResumePlan::CreateSlot));
        assert!(matches!(
            decide(&ResumeInputs {
                create_slot: false,
                ..inputs(None, None)
            }),
            Err(StartRefused::SlotMissing { .. })
        ));
    }

    #[test]
    fn resumes_from_the_slot_and_drops_through_the_stored_offset_when_the_slot_lags_it() {
        let st = stored(500, "42");
        let info = slot(300);
        assert_eq!(
            decide(&inputs(Some(&st), Some(&info))),
            Ok(ResumePlan::Resume {
                start: Lsn::new(300),
                skip_through: Lsn::new(500)
            })
        );
    }

    #[test]
    fn refuses_another_cluster() {
        let st = stored(500, "41");
        let info = slot(300);
        let err = decide(&inputs(Some(&st), Some(&info))).unwrap_err();
        assert!(matches!(err, StartRefused::OtherCluster { .. }));
        assert!(err.to_string().contains("41") && err.to_string().contains("42"));
    }

    #[test]
    fn refuses_an_offset_beyond_the_servers_wal() {
        let st = stored(20_000, "42");
        let info = slot(300);
        let err = decide(&inputs(Some(&st), Some(&info))).unwrap_err();
        assert!(
            matches!(err, StartRefused::OffsetAheadOfServer { .. }),
            "{err}"
        );
    }

    #[test]
    fn lost_slot_with_offset_is_refused_unless_recreate_is_asked() {
        let st = stored(500, "42");
        let err = decide(&inputs(Some(&st), None)).unwrap_err();
        assert!(matches!(err, StartRefused::SlotLost { .. }));
        assert!(err.to_string().contains("outbox-cdc repair"));
        assert_eq!(
            decide(&ResumeInputs {
                recreate_slot: true,
                ..inputs(Some(&st), None)
            }),
            Ok(ResumePlan::RecreateSlot {
                forgotten: Lsn::new(500),
                drop_invalidated: false,
            })
        );
    }

    #[test]
    fn an_invalidated_slot_is_lost_too() {
        let st = stored(500, "42");
        let mut info = slot(500);
        info.wal_status = Some("lost".into());
        let err = decide(&inputs(Some(&st), Some(&info))).unwrap_err();
        assert!(
            matches!(err, StartRefused::SlotInvalidated { stored_lsn: Some(l), .. } if l == Lsn::new(500)),
            "{err}"
        );
        assert_eq!(
            decide(&ResumeInputs {
                recreate_slot: true,
                ..inputs(Some(&st), Some(&info))
            }),
            Ok(ResumePlan::RecreateSlot {
                forgotten: Lsn::new(500),
                drop_invalidated: true,
            })
        );
        // Nothing stored here: nothing to repair from, refused with the drop.
        let err = decide(&inputs(None, Some(&info))).unwrap_err();
        assert!(
            err.to_string().contains("pg_drop_replication_slot"),
            "{err}"
        );
    }

    #[test]
    fn slot_ahead_of_the_offset_is_refused_unless_allowed() {
        let st = stored(500, "42");
        let info = slot(900);
        assert!(matches!(
            decide(&inputs(Some(&st), Some(&info))),
            Err(StartRefused::SlotAhead { .. })
        ));
        assert_eq!(
            decide(&ResumeInputs {
                allow_slot_ahead: true,
                ..inputs(Some(&st), Some(&info))
            }),
            Ok(ResumePlan::Resume {
                start: Lsn::new(900),
                skip_through: Lsn::new(500)
            })
        );
    }

    #[test]
    fn refuses_foreign_plugin_and_database() {
        let mut info = slot(1);
        info.plugin = Some("test_decoding".into());
        assert!(matches!(
            decide(&inputs(None, Some(&info))),
            Err(StartRefused::WrongPlugin { .. })
        ));
        let mut info = slot(1);
        info.database = Some("other".into());
        assert!(matches!(
            decide(&inputs(None, Some(&info))),
            Err(StartRefused::WrongDatabase { .. })
        ));
    }
}
