//! Why the connector refuses to start ([`StartRefused`]): each message says
//! what to do.

use crate::checkpoint::CoverageBreak;
use crate::pg::{Lsn, PgTimestamp};

/// Why the connector refuses to start. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartRefused {
    #[error(
        "the offset store holds slot {slot:?} at {stored_lsn} for database cluster {stored_system_id}, \
         but the server is cluster {server_system_id}: refusing to start against a different cluster. \
         Point postgres.url at the original cluster, or use a fresh offsets.path for this one"
    )]
    OtherCluster {
        slot: String,
        stored_lsn: Lsn,
        stored_system_id: String,
        server_system_id: String,
    },
    #[error(
        "the offset store holds slot {slot:?} at {stored_lsn}, beyond the server's WAL end {server_flush_lsn}: \
         this server is behind the one the offset came from (a restored backup or a promoted standby \
         of the same cluster), so changes it commits between those positions would be skipped. \
         Move the offset store aside (offsets.path) and start with --recreate-slot after checking \
         which outbox rows need replaying"
    )]
    OffsetAheadOfServer {
        slot: String,
        stored_lsn: Lsn,
        server_flush_lsn: Lsn,
    },
    #[error(
        "replication slot {slot:?} does not exist, but events up to {stored_lsn} were published from it: \
         the slot was dropped, so changes committed after {stored_lsn} are not in any slot. \
         To continue, run `outbox-cdc repair` (or `run --recreate-slot`): it recreates the slot and \
         publishes the retained outbox rows committed since (gap repair)"
    )]
    SlotLost { slot: String, stored_lsn: Lsn },
    #[error(
        "the offset store records that the publication may not have carried every outbox row of slot {slot:?} \
         between {since} and {until} ({what}): PostgreSQL never sends rows committed while a publication \
         leaves them out, so some may never have been published. Every start refuses until they are \
         published again: run `outbox-cdc audit --config {config} --since '{since}' --until \
         '{until}' --repair` (it republishes the rows of that window Kafka lacks and, once none is missing, \
         clears this record); then start again"
    )]
    CoverageBroken {
        slot: String,
        /// The `--config` argument of the command named.
        config: String,
        /// The audit window's start (RFC 3339): the break's start less
        /// `repair.occurred_at_margin_ms`, since rows are chosen by `occurred_at`.
        since: String,
        /// The audit window's end (RFC 3339).
        until: String,
        what: String,
    },
    #[error(
        "replication slot {slot:?} was invalidated (wal_status = lost): the server removed WAL it needed, \
         so changes committed after its position can no longer be decoded. To continue, run \
         `outbox-cdc repair` (or `run --recreate-slot`): it drops and recreates the slot and publishes the \
         retained outbox rows committed since the last acknowledged transaction (gap repair){}",
        match stored_lsn { Some(_) => "", None => "; with no offset stored here, drop the slot first: SELECT pg_drop_replication_slot(...)" }
    )]
    SlotInvalidated {
        slot: String,
        stored_lsn: Option<Lsn>,
    },
    #[error(
        "replication slot {slot:?} does not exist and postgres.create_slot = false: create it with \
         SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput'); or set create_slot = true"
    )]
    SlotMissing { slot: String },
    #[error(
        "replication slot {slot:?} uses plugin {plugin:?}; outbox-cdc needs pgoutput. \
         Drop it or choose another postgres.slot"
    )]
    WrongPlugin { slot: String, plugin: String },
    #[error(
        "replication slot {slot:?} belongs to database {slot_database:?}, not {database:?}: \
         choose another postgres.slot"
    )]
    WrongDatabase {
        slot: String,
        slot_database: String,
        database: String,
    },
    #[error(
        "replication slot {slot:?} is confirmed up to {confirmed}, ahead of the stored offset {stored_lsn}: \
         another consumer advanced it, or it was dropped and recreated, so events in between may not \
         have been published by this instance. If another outbox-cdc instance published them (HA \
         takeover), set postgres.allow_slot_ahead = true; otherwise treat it as a lost slot"
    )]
    SlotAhead {
        slot: String,
        stored_lsn: Lsn,
        confirmed: Lsn,
    },
    #[error(
        "postgres.failover_slot = true needs PostgreSQL 17 or later (failover slots), but the server's \
         server_version_num is {server_version}: set postgres.failover_slot = false, or upgrade the server"
    )]
    FailoverSlotUnsupported { server_version: i32 },
    #[error(
        "outbox.message_prefix is set, but pgoutput sends logical decoding messages only from PostgreSQL 14 on \
         (the server's server_version_num is {server_version}): leave outbox.message_prefix empty and publish \
         through the outbox table, or upgrade the server"
    )]
    MessagesUnsupported { server_version: i32 },
    #[error(
        "postgres.url reaches a standby (in recovery), and logical decoding on a standby needs PostgreSQL 16 or \
         later (the server's server_version_num is {server_version}): point postgres.url at the primary, or \
         add target_session_attrs=read-write to a multi-host URL"
    )]
    StandbyDecodingUnsupported { server_version: i32 },
    #[error(
        "postgres.streaming = \"on\" needs PostgreSQL 14 or later (pgoutput protocol 2; the server's \
         server_version_num is {server_version}): set it to \"auto\" or \"off\", or upgrade the server"
    )]
    StreamingUnsupported { server_version: i32 },
}

impl StartRefused {
    /// The refusal while coverage breaks of `slot` are stored (issue 47):
    /// one audit window over all of them, reaching back by `margin_micros`
    /// (`repair.occurred_at_margin_ms`: audits choose rows by `occurred_at`,
    /// which precedes the commit). `None` without breaks.
    pub fn coverage_broken(
        slot: &str,
        config: String,
        margin_micros: i64,
        breaks: &[CoverageBreak],
    ) -> Option<StartRefused> {
        let since = breaks.iter().map(|b| b.since_micros).min()?;
        let until = breaks.iter().map(|b| b.until_micros).max()?;
        let what: Vec<&str> = breaks.iter().map(|b| b.what.as_str()).collect();
        Some(StartRefused::CoverageBroken {
            slot: slot.to_owned(),
            config,
            since: PgTimestamp(since.saturating_sub(margin_micros)).rfc3339(),
            // As far ahead: `occurred_at` may come from another clock (a
            // writer's, or the primary's when the break was seen on a standby).
            until: PgTimestamp(
                until
                    .saturating_add(margin_micros)
                    .saturating_add(1_000_000),
            )
            .rfc3339(),
            what: what.join("; "),
        })
    }
}
