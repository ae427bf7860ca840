//! The offset store: the acked LSN per slot and the parked aggregates, in sled.
//!
//! Every write is followed by `flush()` (sled's fsync of its log) before the
//! call returns, so whatever a method reports as written survives a crash.
//! Values are JSON objects with a version field `v`, readable with any sled
//! dump and decodable across upgrades; an unreadable value is an error naming
//! its key, never a panic.
//!
//! sled 0.34 takes an exclusive `flock` on `<path>/db` when opening; a second
//! open of the same path fails, from another process and from this one alike
//! (flock locks belong to the open file, not the process).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::Disposition;
use crate::pg::{DurableLsn, EventPosition, Lsn, PgTimestamp};

const OFFSETS_TREE: &str = "offsets";
const PARKED_TREE: &str = "parked";
const REPAIRS_TREE: &str = "repairs";
const SEQUENCES_TREE: &str = "sequences";
const COVERAGE_TREE: &str = "coverage";

mod parked_sync;
mod witness;
pub use parked_sync::{ParkMirror, ParkedSync};
pub use witness::WitnessPosition;
const ENCODING_VERSION: u32 = 1;
/// sled's page cache bound; the store holds a handful of small keys.
const CACHE_CAPACITY_BYTES: u64 = 8 * 1024 * 1024;
const LOCK_RETRIES: u32 = 10;
const LOCK_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Proof that the offset store has just flushed: what a [`DurableLsn`] is
/// made from. Only this module can make one (the field is private), after a
/// successful flush, so only the store can say an LSN is durable:
///
/// ```compile_fail,E0423
/// let forged = outbox_cdc::checkpoint::Flushed(());
/// ```
#[derive(Debug)]
pub struct Flushed(());

/// What is stored for one replication slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredOffset {
    pub lsn: Lsn,
    /// The database cluster's system identifier (IDENTIFY_SYSTEM `systemid`).
    pub system_id: String,
    pub updated_at_unix_ms: i64,
    /// Commit time of the last transaction the offset covers, when known
    /// (stores written before it was recorded have none): where gap repair
    /// starts after a lost slot.
    pub acked_commit_time: Option<PgTimestamp>,
    /// `acked_commit_time` is when the slot was (re)created, not the commit of
    /// an acknowledged transaction: nothing was acknowledged since.
    pub commit_time_is_slot_creation: bool,
}

/// A gap repair in progress (DESIGN.md §13): written before the lost slot is
/// recreated, removed once every retained row committed after `since` was
/// published, so a repair killed half-way is finished by the next start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRepair {
    pub v: u32,
    /// The offset stored for the lost slot.
    pub stored_lsn: Lsn,
    /// Rows committed at or after this time (microseconds since 2000-01-01)
    /// are published again.
    pub since_micros: i64,
    /// `commit-timestamp` (pg_xact_commit_timestamp) or `occurred-at`.
    pub bound: String,
}

/// What the coverage proofs of a slot rest on, kept next to its offset
/// (DESIGN.md §5a): the publication's catalog rows the last passing proof
/// saw, so a change made while the connector was stopped is caught at the
/// next start, and every coverage break not yet repaired, so a start after a
/// break refuses until the rows it may have hidden are published again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoverageRecord {
    pub v: u32,
    /// The database cluster (system identifier) the record belongs to.
    #[serde(default)]
    pub system_id: String,
    /// The outbox table's OID at that proof: a table dropped and created
    /// again under its name is a break.
    #[serde(default)]
    pub root: u32,
    /// The server's clock when the last passing proof read the catalog
    /// (microseconds since 2000-01-01).
    pub proven_at_micros: i64,
    /// `pg_publication` (OID, xmin) of that proof.
    pub publication: (u32, i64),
    /// Partitions' changes arrive under the root's name.
    pub leaves_as_root: bool,
    /// The publication's entries for the outbox tree: (kind, OID, xmin,
    /// relation or schema OID).
    pub entries: Vec<(char, u32, i64, u32)>,
    /// (OID, relfilenode) of the table or each leaf partition: a rewrite
    /// (SET UNLOGGED and back) is a break.
    #[serde(default)]
    pub storage: Vec<(u32, u32)>,
    /// Breaks found and not yet repaired, oldest first.
    pub breaks: Vec<CoverageBreak>,
}

/// A span during which the publication may not have carried every outbox
/// row: from the last passing proof before the change was seen to when it
/// was seen. Rows committed in it may never have been sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoverageBreak {
    /// The last passing proof before it (server clock, microseconds since
    /// 2000-01-01).
    pub since_micros: i64,
    /// When it was seen (server clock where known, else the local one).
    pub until_micros: i64,
    /// What was seen, as the proof said it.
    pub what: String,
}

/// An aggregate whose events go to the dead-letter topic until released,
/// because one of its events was poison (DESIGN.md §7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParkedAggregate {
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub reason: String,
    /// LSN of the first poison event (its change, not its commit).
    pub lsn: Lsn,
    /// Commit LSN of that event's transaction; `None` in records written
    /// before it was stored (they hold the change LSN only).
    pub commit_lsn: Option<Lsn>,
    pub parked_at_unix_ms: i64,
}

impl ParkedAggregate {
    /// The aggregate parked now, for `reason`, by its event at `at`.
    pub(crate) fn parked_now(
        aggregate_type: &str,
        aggregate_id: &str,
        reason: &str,
        at: EventPosition,
    ) -> ParkedAggregate {
        ParkedAggregate {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            reason: reason.to_owned(),
            lsn: at.change(),
            commit_lsn: Some(at.commit()),
            parked_at_unix_ms: PgTimestamp::now().unix_millis(),
        }
    }

    pub fn parked_at(&self) -> ParkedAt {
        ParkedAt {
            commit: self.commit_lsn,
            change: self.lsn,
        }
    }
}

/// Where an aggregate was parked: its events from there on, in commit order,
/// go to the dead-letter topic; its earlier ones (met again on a replay) do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParkedAt {
    commit: Option<Lsn>,
    change: Lsn,
}

impl ParkedAt {
    /// Whether an event at `at` is the one that parked the aggregate or
    /// follows it in commit order (audit F12: a later commit whose change has
    /// a lower LSN follows it too).
    pub fn covers(self, at: EventPosition) -> bool {
        match self.commit {
            Some(commit) => at >= EventPosition::new(commit, self.change),
            // Parked by a version that kept only the change LSN: its rule.
            None => at.change() >= self.change,
        }
    }

    /// Whether `at` is the very event that parked the aggregate.
    pub fn is(self, at: EventPosition) -> bool {
        at.change() == self.change && self.commit.is_none_or(|c| c == at.commit())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "offset store {path}: the lock on its files is held by another process \
         (or another open store in this process); stop the other connector or \
         give this one its own state directory"
    )]
    Locked { path: PathBuf, source: sled::Error },
    #[error("offset store {path}: cannot open: {source}")]
    Open { path: PathBuf, source: sled::Error },
    /// The table of parked aggregates shared by the instances that can hold
    /// the slot (`outbox.parked_table`) could not be read or written.
    #[error("parked aggregates table {table} ({url_key}): {op} failed: {reason}")]
    SharedParking {
        table: String,
        url_key: &'static str,
        op: &'static str,
        reason: String,
        /// A lost connection or a server going away: a new session retries.
        retry: bool,
    },
    #[error("offset store {path}: {op} of {key} failed: {source}")]
    Write {
        path: PathBuf,
        op: &'static str,
        key: String,
        source: sled::Error,
    },
    #[error("offset store {path}: reading {key} failed: {source}")]
    Read {
        path: PathBuf,
        key: String,
        source: sled::Error,
    },
    #[error(
        "offset store {path}: flush after {op} of {key} failed, so it is not \
         durable: {source}"
    )]
    Flush {
        path: PathBuf,
        op: &'static str,
        key: String,
        source: sled::Error,
    },
    #[error("offset store {path}: {op} failed: {source}")]
    PageFile {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("offset store {path}: cannot encode the value of {key}: {source}")]
    Encode {
        path: PathBuf,
        key: String,
        source: serde_json::Error,
    },
    #[error("offset store {path}: tree {tree:?} key {key} holds an unreadable value: {reason}")]
    Corrupt {
        path: PathBuf,
        tree: &'static str,
        key: String,
        reason: String,
    },
    #[error(
        "offset store {path}: slot {slot:?} has offset {stored_lsn} from database \
         system {stored}, not from {given}; refusing to overwrite it (remove the \
         offset explicitly to start over against the new cluster)"
    )]
    SystemIdMismatch {
        path: PathBuf,
        slot: String,
        stored_lsn: Lsn,
        stored: String,
        given: String,
    },
}

impl StoreError {
    /// What may go away by itself is `Retry`: a lock held by another instance
    /// (an HA peer exiting), a shared table's server coming back, a full disk
    /// (space freed; nothing past what is durable was acknowledged). Other
    /// disk and data errors need a person: `Stop`.
    pub fn disposition(&self) -> Disposition {
        match self {
            StoreError::Locked { .. } => Disposition::Retry,
            StoreError::SharedParking { retry: true, .. } => Disposition::Retry,
            e if e.is_disk_full() => Disposition::Retry,
            _ => Disposition::Stop,
        }
    }

    /// Whether a write failed for want of space: ENOSPC, or EDQUOT (a quota).
    pub fn is_disk_full(&self) -> bool {
        let io = match self {
            StoreError::Open { source, .. }
            | StoreError::Write { source, .. }
            | StoreError::Read { source, .. }
            | StoreError::Flush { source, .. } => match source {
                sled::Error::Io(e) => Some(e),
                _ => None,
            },
            StoreError::PageFile { source, .. } => Some(source),
            _ => None,
        };
        io.and_then(std::io::Error::raw_os_error)
            .is_some_and(|code| code == libc::ENOSPC || code == libc::EDQUOT)
    }
}

#[derive(Serialize, Deserialize)]
struct Version {
    v: u32,
}

#[derive(Serialize, Deserialize)]
struct OffsetRecordV1 {
    v: u32,
    lsn: Lsn,
    system_id: String,
    updated_at_unix_ms: i64,
    /// Microseconds since 2000-01-01; absent in stores written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acked_commit_time: Option<i64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    commit_time_is_slot_creation: bool,
}

#[derive(Serialize, Deserialize)]
struct ParkedRecordV1 {
    v: u32,
    aggregate_type: String,
    aggregate_id: String,
    reason: String,
    lsn: Lsn,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    commit_lsn: Option<Lsn>,
    parked_at_unix_ms: i64,
}

impl From<ParkedAggregate> for ParkedRecordV1 {
    fn from(p: ParkedAggregate) -> ParkedRecordV1 {
        ParkedRecordV1 {
            v: ENCODING_VERSION,
            aggregate_type: p.aggregate_type,
            aggregate_id: p.aggregate_id,
            reason: p.reason,
            lsn: p.lsn,
            commit_lsn: p.commit_lsn,
            parked_at_unix_ms: p.parked_at_unix_ms,
        }
    }
}

impl From<ParkedRecordV1> for ParkedAggregate {
    fn from(r: ParkedRecordV1) -> ParkedAggregate {
        ParkedAggregate {
            aggregate_type: r.aggregate_type,
            aggregate_id: r.aggregate_id,
            reason: r.reason,
            lsn: r.lsn,
            commit_lsn: r.commit_lsn,
            parked_at_unix_ms: r.parked_at_unix_ms,
        }
    }
}

/// Persistent acked LSNs (tree `offsets`, keyed by slot name) and parked
/// aggregates (tree `parked`), flushed on every write.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_cdc::checkpoint::OffsetStore;
/// use outbox_cdc::pg::Lsn;
///
/// let dir = tempfile::tempdir()?;
/// let store = OffsetStore::open(dir.path())?;
/// let durable = store.persist("outbox_slot", Lsn::new(0x16_B374_D848), "7301234567890123456")?;
/// assert_eq!(durable.lsn().to_string(), "16/B374D848");
/// // Going back is refused: the stored, durable LSN is returned instead.
/// assert_eq!(store.persist("outbox_slot", Lsn::new(1), "7301234567890123456")?, durable);
/// # Ok(())
/// # }
/// ```
pub struct OffsetStore {
    path: PathBuf,
    db: sled::Db,
    offsets: sled::Tree,
    parked: sled::Tree,
    repairs: sled::Tree,
    sequences: sled::Tree,
    coverage: sled::Tree,
    /// The live witness's pages and position (`witness.rs`).
    witness: sled::Tree,
    /// aggregate_type → aggregate ids; mirrors the `parked` tree. Writers
    /// hold the write lock across the sled write and flush.
    /// type -> id -> the position of the event that parked it.
    parked_cache: RwLock<HashMap<String, HashMap<String, ParkedAt>>>,
    /// Number of parked aggregates; lets `is_parked` skip the lock when zero.
    parked_count: AtomicUsize,
    /// Where a park is written first when parking is shared between
    /// instances (`parked_sync.rs`); none for a store used alone.
    park_mirror: RwLock<Option<Arc<dyn ParkMirror>>>,
    /// Bumped by every park made here, so that a copy of the shared table
    /// read before it is not applied over it (`sync_parked`).
    parked_generation: AtomicU64,
}

// The pipeline shares one store between its tasks.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<OffsetStore>();
};

impl fmt::Debug for OffsetStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OffsetStore")
            .field("path", &self.path)
            .field("parked", &self.parked_count.load(Ordering::Relaxed))
            .finish()
    }
}

impl OffsetStore {
    /// Opens (creating if needed) the store in directory `path`, and loads the
    /// parked aggregates into memory.
    pub fn open(path: &Path) -> Result<OffsetStore, StoreError> {
        let path = path.to_path_buf();
        // sled's file lock outlives the last handle of a store closed in this
        // process by a moment (its flusher thread lets go of it), so a lock
        // conflict is tried again briefly before it is reported: another
        // process holding the store still fails within a second.
        let mut attempts = 0;
        let db = loop {
            let opened = sled::Config::new()
                .path(&path)
                .cache_capacity(CACHE_CAPACITY_BYTES)
                .open();
            match opened {
                Err(source) if is_lock_conflict(&source) && attempts < LOCK_RETRIES => {
                    attempts += 1;
                    std::thread::sleep(LOCK_RETRY_PAUSE);
                }
                Err(source) if is_lock_conflict(&source) => {
                    return Err(StoreError::Locked {
                        path: path.clone(),
                        source,
                    });
                }
                Err(source) => {
                    return Err(StoreError::Open {
                        path: path.clone(),
                        source,
                    });
                }
                Ok(db) => break db,
            }
        };
        let open_tree = |name: &str| {
            db.open_tree(name).map_err(|source| StoreError::Open {
                path: path.clone(),
                source,
            })
        };
        let offsets = open_tree(OFFSETS_TREE)?;
        let parked = open_tree(PARKED_TREE)?;
        let repairs = open_tree(REPAIRS_TREE)?;
        let sequences = open_tree(SEQUENCES_TREE)?;
        let coverage = open_tree(COVERAGE_TREE)?;
        let witness = open_tree(witness::WITNESS_TREE)?;
        let store = OffsetStore {
            path,
            db,
            offsets,
            parked,
            repairs,
            sequences,
            coverage,
            witness,
            parked_cache: RwLock::new(HashMap::new()),
            parked_count: AtomicUsize::new(0),
            park_mirror: RwLock::new(None),
            parked_generation: AtomicU64::new(0),
        };
        let mut cache = HashMap::<String, HashMap<String, ParkedAt>>::new();
        let mut count = 0;
        for p in store.parked()? {
            let at = p.parked_at();
            if cache
                .entry(p.aggregate_type)
                .or_default()
                .insert(p.aggregate_id, at)
                .is_none()
            {
                count += 1;
            }
        }
        *store
            .parked_cache
            .write()
            .unwrap_or_else(PoisonError::into_inner) = cache;
        store.parked_count.store(count, Ordering::Release);
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored offset of `slot`, if any.
    pub fn load(&self, slot: &str) -> Result<Option<StoredOffset>, StoreError> {
        let raw = self.offsets.get(slot).map_err(|source| StoreError::Read {
            path: self.path.clone(),
            key: slot_key(slot),
            source,
        })?;
        raw.map(|raw| self.decode_offset(slot, &raw)).transpose()
    }

    /// The stored LSN of `slot` as a [`DurableLsn`]: read, then flushed, so
    /// even a value whose own flush failed earlier is durable when returned.
    pub fn durable_lsn(&self, slot: &str) -> Result<Option<DurableLsn>, StoreError> {
        let Some(stored) = self.load(slot)? else {
            return Ok(None);
        };
        let flushed = self.flush("read", slot_key(slot))?;
        Ok(Some(DurableLsn::new(stored.lsn, flushed)))
    }

    /// Stores `lsn` for `slot` and flushes it. The stored LSN never goes
    /// back: when the stored one is at or beyond `lsn`, nothing is written and
    /// the stored one is returned (flushed). An offset stored for another
    /// `system_id` is never overwritten; [`Self::remove`] it first.
    ///
    /// Blocks on the flush (an fsync): call it from a blocking context such as
    /// `tokio::task::spawn_blocking`, not on an async worker thread.
    pub fn persist(&self, slot: &str, lsn: Lsn, system_id: &str) -> Result<DurableLsn, StoreError> {
        self.persist_with(slot, lsn, system_id, None, false)
    }

    /// [`Self::persist`] for a slot (re)created at `created_at`: the time a gap
    /// repair starts from until a transaction is acknowledged. The live
    /// witness starts over with the new slot: what the old one delivered (and
    /// what a gap repair published outside the stream) is not in its pages;
    /// it checks from `witness_from` (read just after the slot was created,
    /// so that rows committed before its first round are checked too).
    pub fn persist_created(
        &self,
        slot: &str,
        lsn: Lsn,
        system_id: &str,
        created_at: PgTimestamp,
        witness_from: Option<WitnessPosition>,
    ) -> Result<DurableLsn, StoreError> {
        self.clear_witness(slot)?;
        if let Some(position) = witness_from {
            self.save_witness_position(slot, &position)?;
        }
        self.persist_with(slot, lsn, system_id, Some(created_at), true)
    }

    /// [`Self::persist`], recording the commit time of the last transaction
    /// `lsn` covers (`None`: keep the one stored, e.g. for an idle advance).
    pub fn persist_acked(
        &self,
        slot: &str,
        lsn: Lsn,
        system_id: &str,
        acked_commit_time: Option<PgTimestamp>,
    ) -> Result<DurableLsn, StoreError> {
        self.persist_with(slot, lsn, system_id, acked_commit_time, false)
    }

    fn persist_with(
        &self,
        slot: &str,
        lsn: Lsn,
        system_id: &str,
        acked_commit_time: Option<PgTimestamp>,
        slot_creation: bool,
    ) -> Result<DurableLsn, StoreError> {
        loop {
            let current = self.offsets.get(slot).map_err(|source| StoreError::Read {
                path: self.path.clone(),
                key: slot_key(slot),
                source,
            })?;
            if let Some(raw) = &current {
                let stored = self.decode_offset(slot, raw)?;
                if stored.system_id != system_id {
                    return Err(StoreError::SystemIdMismatch {
                        path: self.path.clone(),
                        slot: slot.to_owned(),
                        stored_lsn: stored.lsn,
                        stored: stored.system_id,
                        given: system_id.to_owned(),
                    });
                }
                if stored.lsn >= lsn {
                    let flushed = self.flush("persist", slot_key(slot))?;
                    return Ok(DurableLsn::new(stored.lsn, flushed));
                }
            }
            let previous = match &current {
                Some(raw) => {
                    let p = self.decode_offset(slot, raw)?;
                    (p.acked_commit_time, p.commit_time_is_slot_creation)
                }
                None => (None, false),
            };
            let (commit_time, is_creation) = match acked_commit_time {
                Some(t) => (Some(t), slot_creation),
                None => previous,
            };
            let record = OffsetRecordV1 {
                v: ENCODING_VERSION,
                lsn,
                system_id: system_id.to_owned(),
                updated_at_unix_ms: PgTimestamp::now().unix_millis(),
                acked_commit_time: commit_time.map(|t| t.0),
                commit_time_is_slot_creation: is_creation,
            };
            let swapped = self
                .offsets
                .compare_and_swap(
                    slot,
                    current,
                    Some(encode(&self.path, slot_key(slot), &record)?),
                )
                .map_err(|source| StoreError::Write {
                    path: self.path.clone(),
                    op: "persist",
                    key: slot_key(slot),
                    source,
                })?;
            // A concurrent persist won the race: re-read and compare again.
            if swapped.is_ok() {
                break;
            }
        }
        let flushed = self.flush("persist", slot_key(slot))?;
        Ok(DurableLsn::new(lsn, flushed))
    }

    /// Forgets the offset of `slot` (the explicit recreate-slot path).
    /// Returns whether one was stored.
    pub fn remove(&self, slot: &str) -> Result<bool, StoreError> {
        let removed = self
            .offsets
            .remove(slot)
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "remove",
                key: slot_key(slot),
                source,
            })?;
        self.flush("remove", slot_key(slot))?;
        Ok(removed.is_some())
    }

    /// The last published sequence of the aggregate whose
    /// [`sequence_key`] this is, with the LSN of that event.
    pub fn last_sequence(&self, key: &[u8]) -> Result<Option<(i64, Lsn)>, StoreError> {
        let raw = self.sequences.get(key).map_err(|source| StoreError::Read {
            path: self.path.clone(),
            key: parked_key_display(key),
            source,
        })?;
        Ok(raw.and_then(|raw| {
            let bytes: [u8; 16] = raw.as_ref().try_into().ok()?;
            let (seq, lsn) = bytes.split_at(8);
            Some((
                i64::from_be_bytes(seq.try_into().ok()?),
                Lsn::new(u64::from_be_bytes(lsn.try_into().ok()?)),
            ))
        }))
    }

    /// Records last published sequences, by [`sequence_key`]; durable with
    /// the next flush (the next offset persist), which is all the detector
    /// needs. One insert per entry: sled's batches held their whole content
    /// in memory (10,000-entry batches grew a test process to 0.9 GiB where
    /// single inserts stay under 80 MiB). Atomicity is not needed: each
    /// aggregate's entry only has to be written before the position that
    /// covers it is reported to PostgreSQL.
    pub fn save_sequences(&self, entries: &[(Box<[u8]>, i64, Lsn)]) -> Result<(), StoreError> {
        for (key, seq, lsn) in entries {
            let mut value = [0u8; 16];
            value[..8].copy_from_slice(&seq.to_be_bytes());
            value[8..].copy_from_slice(&lsn.as_u64().to_be_bytes());
            self.sequences
                .insert(&key[..], &value[..])
                .map_err(|source| StoreError::Write {
                    path: self.path.clone(),
                    op: "save sequences",
                    key: parked_key_display(key),
                    source,
                })?;
        }
        Ok(())
    }

    /// Records a gap repair about to start for `slot` (flushed).
    pub fn begin_repair(&self, slot: &str, repair: &PendingRepair) -> Result<(), StoreError> {
        let value = encode(&self.path, repair_key(slot), repair)?;
        self.repairs
            .insert(slot, value)
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "begin repair",
                key: repair_key(slot),
                source,
            })?;
        self.flush("begin repair", repair_key(slot)).map(drop)
    }

    /// The repair of `slot` that has not finished, if any.
    pub fn pending_repair(&self, slot: &str) -> Result<Option<PendingRepair>, StoreError> {
        let raw = self.repairs.get(slot).map_err(|source| StoreError::Read {
            path: self.path.clone(),
            key: repair_key(slot),
            source,
        })?;
        raw.map(|raw| {
            serde_json::from_slice(&raw)
                .map_err(|e| self.corrupt(REPAIRS_TREE, repair_key(slot), e.to_string()))
        })
        .transpose()
    }

    /// The repair of `slot` finished (flushed).
    pub fn end_repair(&self, slot: &str) -> Result<(), StoreError> {
        self.repairs
            .remove(slot)
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "end repair",
                key: repair_key(slot),
                source,
            })?;
        self.flush("end repair", repair_key(slot)).map(drop)
    }

    /// What the coverage proofs of `slot` rest on, if anything was stored.
    pub fn coverage(&self, slot: &str) -> Result<Option<CoverageRecord>, StoreError> {
        let raw = self.coverage.get(slot).map_err(|source| StoreError::Read {
            path: self.path.clone(),
            key: coverage_key(slot),
            source,
        })?;
        raw.map(|raw| {
            serde_json::from_slice(&raw)
                .map_err(|e| self.corrupt(COVERAGE_TREE, coverage_key(slot), e.to_string()))
        })
        .transpose()
    }

    /// Stores what the coverage proofs of `slot` rest on (flushed).
    pub fn save_coverage(&self, slot: &str, record: &CoverageRecord) -> Result<(), StoreError> {
        let value = encode(&self.path, coverage_key(slot), record)?;
        self.coverage
            .insert(slot, value)
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "save coverage",
                key: coverage_key(slot),
                source,
            })?;
        self.flush("save coverage", coverage_key(slot)).map(drop)
    }

    /// Forgets the breaks of `slot` that lie within `[since, until]`
    /// (microseconds since 2000-01-01): their rows were published again.
    /// Returns those forgotten (flushed).
    pub fn clear_coverage_breaks(
        &self,
        slot: &str,
        since_micros: i64,
        until_micros: i64,
    ) -> Result<Vec<CoverageBreak>, StoreError> {
        let Some(mut record) = self.coverage(slot)? else {
            return Ok(Vec::new());
        };
        let (cleared, kept): (Vec<CoverageBreak>, Vec<CoverageBreak>) = record
            .breaks
            .into_iter()
            .partition(|b| since_micros <= b.since_micros && b.until_micros <= until_micros);
        record.breaks = kept;
        if !cleared.is_empty() {
            self.save_coverage(slot, &record)?;
        }
        Ok(cleared)
    }

    /// Parks an aggregate: its later events go to the dead-letter topic until
    /// [`Self::release`]. Returns false (and keeps the first reason and LSN)
    /// when it was already parked.
    pub fn park(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        reason: &str,
        at: EventPosition,
    ) -> Result<bool, StoreError> {
        if self.parked_since(aggregate_type, aggregate_id)?.is_some() {
            return Ok(false);
        }
        let parked = ParkedAggregate::parked_now(aggregate_type, aggregate_id, reason, at);
        // The shared table first, outside the cache's lock (a table refresh
        // takes that lock): once this returns, an instance that takes the
        // slot over finds the park there.
        let mirror = self
            .park_mirror
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(mirror) = mirror {
            mirror.park(&parked)?;
        }
        let mut cache = self
            .parked_cache
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if cache
            .get(aggregate_type)
            .is_some_and(|ids| ids.contains_key(aggregate_id))
        {
            return Ok(false);
        }
        self.parked_generation.fetch_add(1, Ordering::AcqRel);
        let record = ParkedRecordV1::from(parked);
        let key = parked_key(aggregate_type, aggregate_id);
        let value = encode(
            &self.path,
            aggregate_key(aggregate_type, aggregate_id),
            &record,
        )?;
        self.parked
            .insert(key, value)
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "park",
                key: aggregate_key(aggregate_type, aggregate_id),
                source,
            })?;
        self.flush("park", aggregate_key(aggregate_type, aggregate_id))?;
        cache.entry(aggregate_type.to_owned()).or_default().insert(
            aggregate_id.to_owned(),
            ParkedAt {
                commit: Some(at.commit()),
                change: at.change(),
            },
        );
        self.parked_count.fetch_add(1, Ordering::Release);
        Ok(true)
    }

    /// Whether the aggregate is parked. Answered from memory; lock-free while
    /// nothing is parked. The `Result` leaves room for a disk fallback.
    pub fn is_parked(&self, aggregate_type: &str, aggregate_id: &str) -> Result<bool, StoreError> {
        Ok(self.parked_since(aggregate_type, aggregate_id)?.is_some())
    }

    /// Where the aggregate was parked, if it is: events at or after it in
    /// commit order are dead-lettered, events before it (met again on a
    /// replay) are not.
    pub fn parked_since(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Option<ParkedAt>, StoreError> {
        if self.parked_count.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        let cache = self
            .parked_cache
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(cache
            .get(aggregate_type)
            .and_then(|ids| ids.get(aggregate_id))
            .copied())
    }

    /// Releases a parked aggregate. Returns whether it was parked.
    pub fn release(&self, aggregate_type: &str, aggregate_id: &str) -> Result<bool, StoreError> {
        let mut cache = self
            .parked_cache
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let removed = self
            .parked
            .remove(parked_key(aggregate_type, aggregate_id))
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "release",
                key: aggregate_key(aggregate_type, aggregate_id),
                source,
            })?;
        if removed.is_none() {
            return Ok(false);
        }
        self.flush("release", aggregate_key(aggregate_type, aggregate_id))?;
        if let Some(ids) = cache.get_mut(aggregate_type) {
            if ids.remove(aggregate_id).is_some() {
                self.parked_count.fetch_sub(1, Ordering::Release);
            }
            if ids.is_empty() {
                cache.remove(aggregate_type);
            }
        }
        Ok(true)
    }

    /// One parked aggregate's record (reason and LSN), read from disk; `None`
    /// when it is not parked.
    pub fn parked_aggregate(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Option<ParkedAggregate>, StoreError> {
        let key = parked_key(aggregate_type, aggregate_id);
        let raw = self.parked.get(&key).map_err(|source| StoreError::Read {
            path: self.path.clone(),
            key: aggregate_key(aggregate_type, aggregate_id),
            source,
        })?;
        raw.map(|raw| self.decode_parked(&key, &raw)).transpose()
    }

    /// All parked aggregates, read from disk, ordered by type then id bytes.
    pub fn parked(&self) -> Result<Vec<ParkedAggregate>, StoreError> {
        let mut out = Vec::new();
        for entry in self.parked.iter() {
            let (key, value) = entry.map_err(|source| StoreError::Read {
                path: self.path.clone(),
                key: format!("tree {PARKED_TREE:?}"),
                source,
            })?;
            out.push(self.decode_parked(&key, &value)?);
        }
        Ok(out)
    }

    fn flush(&self, op: &'static str, key: String) -> Result<Flushed, StoreError> {
        self.db.flush().map_err(|source| StoreError::Flush {
            path: self.path.clone(),
            op,
            key,
            source,
        })?;
        Ok(Flushed(()))
    }

    fn decode_offset(&self, slot: &str, raw: &[u8]) -> Result<StoredOffset, StoreError> {
        let record: OffsetRecordV1 = decode_versioned(raw)
            .map_err(|reason| self.corrupt(OFFSETS_TREE, slot_key(slot), reason))?;
        Ok(StoredOffset {
            lsn: record.lsn,
            system_id: record.system_id,
            updated_at_unix_ms: record.updated_at_unix_ms,
            acked_commit_time: record.acked_commit_time.map(PgTimestamp),
            commit_time_is_slot_creation: record.commit_time_is_slot_creation,
        })
    }

    fn decode_parked(&self, key: &[u8], raw: &[u8]) -> Result<ParkedAggregate, StoreError> {
        let corrupt = |reason: String| self.corrupt(PARKED_TREE, parked_key_display(key), reason);
        let record: ParkedRecordV1 = decode_versioned(raw).map_err(corrupt)?;
        if parked_key(&record.aggregate_type, &record.aggregate_id) != key {
            return Err(corrupt(format!(
                "value names aggregate {}, not the key's",
                aggregate_key(&record.aggregate_type, &record.aggregate_id)
            )));
        }
        Ok(ParkedAggregate::from(record))
    }

    fn corrupt(&self, tree: &'static str, key: String, reason: String) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            tree,
            key,
            reason,
        }
    }
}

/// sled 0.34 reports a held lock only as an `io::ErrorKind::Other` whose text
/// starts with "could not acquire lock" (config.rs `try_lock`); the test
/// `second_open_of_same_path_is_locked` pins this for upgrades.
fn is_lock_conflict(err: &sled::Error) -> bool {
    match err {
        sled::Error::Io(io) => {
            io.kind() == std::io::ErrorKind::Other
                && io.to_string().starts_with("could not acquire lock")
        }
        _ => false,
    }
}

/// A record of the encoding version this build reads, or what is wrong with it.
fn decode_versioned<T: DeserializeOwned>(raw: &[u8]) -> Result<T, String> {
    let version: Version =
        serde_json::from_slice(raw).map_err(|e| format!("not a versioned JSON record: {e}"))?;
    if version.v != ENCODING_VERSION {
        return Err(format!(
            "encoding version {} is not supported (this build reads version {ENCODING_VERSION})",
            version.v
        ));
    }
    serde_json::from_slice(raw).map_err(|e| e.to_string())
}

fn encode<T: Serialize>(path: &Path, key: String, record: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(record).map_err(|source| StoreError::Encode {
        path: path.to_path_buf(),
        key,
        source,
    })
}

fn coverage_key(slot: &str) -> String {
    format!("coverage of slot {slot:?}")
}

fn repair_key(slot: &str) -> String {
    format!("repair of slot {slot:?}")
}

fn slot_key(slot: &str) -> String {
    format!("slot {slot:?}")
}

fn aggregate_key(aggregate_type: &str, aggregate_id: &str) -> String {
    format!("aggregate {aggregate_type:?}/{aggregate_id:?}")
}

/// The store's key of an aggregate's sequence entry (the same bytes as its
/// parked entry's key).
pub fn sequence_key(aggregate_type: &str, aggregate_id: &str) -> Vec<u8> {
    parked_key(aggregate_type, aggregate_id)
}

/// `u32` big-endian length of the type, the type, then the id: unambiguous
/// for any strings, and ordered by type first.
fn parked_key(aggregate_type: &str, aggregate_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(4 + aggregate_type.len() + aggregate_id.len());
    key.extend_from_slice(&(aggregate_type.len() as u32).to_be_bytes());
    key.extend_from_slice(aggregate_type.as_bytes());
    key.extend_from_slice(aggregate_id.as_bytes());
    key
}

fn parked_key_display(key: &[u8]) -> String {
    let split = key.split_first_chunk::<4>().and_then(|(len, rest)| {
        let len = u32::from_be_bytes(*len) as usize;
        let t = std::str::from_utf8(rest.get(..len)?).ok()?;
        let id = std::str::from_utf8(rest.get(len..)?).ok()?;
        Some(aggregate_key(t, id))
    });
    split.unwrap_or_else(|| format!("{key:02x?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYSID: &str = "7301234567890123456";

    /// An offset store in a new directory (removed when the guard drops).
    fn fresh() -> (tempfile::TempDir, OffsetStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        (dir, store)
    }

    /// Parks an aggregate where reason and position do not matter; whether
    /// it was newly parked.
    fn park(store: &OffsetStore, aggregate_type: &str, aggregate_id: &str) -> bool {
        store
            .park(aggregate_type, aggregate_id, "r", EventPosition::at(lsn(1)))
            .unwrap()
    }

    fn lsn(n: u64) -> Lsn {
        Lsn::new(n)
    }

    /// Issue 47: a coverage break outlives the process, and only an audit
    /// window that covers it whole clears it.
    #[test]
    fn coverage_breaks_survive_reopen_and_clear_only_when_covered() {
        let dir = tempfile::tempdir().unwrap();
        let found = |since_micros, until_micros| CoverageBreak {
            since_micros,
            until_micros,
            what: format!("change {since_micros}"),
        };
        {
            let store = OffsetStore::open(dir.path()).unwrap();
            assert_eq!(store.coverage("s").unwrap(), None);
            let record = CoverageRecord {
                v: 1,
                system_id: "7301".to_owned(),
                root: 16000,
                proven_at_micros: 50,
                publication: (7, 100),
                leaves_as_root: true,
                entries: vec![('r', 20, 101, 16000), ('n', 30, 105, 2200)],
                storage: vec![(16000, 16000)],
                breaks: vec![found(100, 200), found(300, 400)],
            };
            store.save_coverage("s", &record).unwrap();
        }
        let store = OffsetStore::open(dir.path()).unwrap();
        let record = store.coverage("s").unwrap().expect("stored");
        assert_eq!(record.entries[1], ('n', 30, 105, 2200));
        assert!(record.leaves_as_root);
        assert_eq!(record.breaks.len(), 2);
        // Partly covered: kept.
        assert_eq!(
            store.clear_coverage_breaks("s", 150, 1000).unwrap(),
            vec![found(300, 400)]
        );
        assert_eq!(store.clear_coverage_breaks("s", 0, 199).unwrap(), vec![]);
        assert_eq!(
            store.clear_coverage_breaks("other", 0, 1000).unwrap(),
            vec![]
        );
        assert_eq!(
            store.coverage("s").unwrap().unwrap().breaks,
            vec![found(100, 200)]
        );
        assert_eq!(
            store.clear_coverage_breaks("s", 100, 200).unwrap(),
            vec![found(100, 200)]
        );
        let left = store.coverage("s").unwrap().unwrap();
        assert!(left.breaks.is_empty());
        assert_eq!(left.publication, (7, 100), "the baseline stays");
    }

    #[test]
    fn persisted_offset_survives_reopen() {
        let (dir, store) = fresh();
        assert_eq!(store.load("slot_a").unwrap(), None);
        assert_eq!(store.durable_lsn("slot_a").unwrap(), None);
        let before = PgTimestamp::now().unix_millis();
        let durable = store.persist("slot_a", lsn(0x16_B374_D848), SYSID).unwrap();
        assert_eq!(durable.lsn(), lsn(0x16_B374_D848));
        assert_eq!(durable.to_string(), "16/B374D848");
        drop(store);

        let store = OffsetStore::open(dir.path()).unwrap();
        let stored = store.load("slot_a").unwrap().unwrap();
        assert_eq!(stored.lsn, lsn(0x16_B374_D848));
        assert_eq!(stored.system_id, SYSID);
        assert!(stored.updated_at_unix_ms >= before);
        assert_eq!(
            store.durable_lsn("slot_a").unwrap().map(|d| d.lsn()),
            Some(lsn(0x16_B374_D848))
        );
        assert_eq!(
            store.load("slot_b").unwrap(),
            None,
            "slots are separate keys"
        );
    }

    #[test]
    fn persist_never_moves_the_offset_back() {
        let (dir, store) = fresh();
        assert_eq!(store.persist("s", lsn(500), SYSID).unwrap().lsn(), lsn(500));
        let stamped = store.load("s").unwrap().unwrap().updated_at_unix_ms;
        assert_eq!(store.persist("s", lsn(400), SYSID).unwrap().lsn(), lsn(500));
        assert_eq!(store.persist("s", lsn(500), SYSID).unwrap().lsn(), lsn(500));
        assert_eq!(store.load("s").unwrap().unwrap().lsn, lsn(500));
        assert_eq!(
            store.load("s").unwrap().unwrap().updated_at_unix_ms,
            stamped,
            "a refused write leaves the record untouched"
        );
        assert_eq!(store.persist("s", lsn(600), SYSID).unwrap().lsn(), lsn(600));
        drop(store);
        let store = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(store.load("s").unwrap().unwrap().lsn, lsn(600));
    }

    #[test]
    fn concurrent_persists_keep_the_highest() {
        let (_dir, store) = fresh();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let store = &store;
                scope.spawn(move || {
                    for i in 0..25u64 {
                        let n = 1 + i * 4 + t;
                        let durable = store.persist("s", lsn(n), SYSID).unwrap();
                        assert!(durable.lsn() >= lsn(n));
                    }
                });
            }
        });
        assert_eq!(store.load("s").unwrap().unwrap().lsn, lsn(100));
    }

    #[test]
    fn offset_of_another_cluster_is_not_overwritten() {
        let (_dir, store) = fresh();
        store.persist("s", lsn(10), SYSID).unwrap();
        let err = store.persist("s", lsn(20), "999").unwrap_err();
        match &err {
            StoreError::SystemIdMismatch {
                slot,
                stored,
                given,
                stored_lsn,
                ..
            } => {
                assert_eq!(
                    (slot.as_str(), stored.as_str(), given.as_str(), *stored_lsn),
                    ("s", SYSID, "999", lsn(10))
                );
            }
            other => panic!("expected SystemIdMismatch, got {other:?}"),
        }
        assert_eq!(err.disposition(), Disposition::Stop);
        assert_eq!(store.load("s").unwrap().unwrap().lsn, lsn(10));

        // The explicit recreate path: remove, then the new cluster may store.
        assert!(store.remove("s").unwrap());
        assert!(!store.remove("s").unwrap());
        assert_eq!(store.persist("s", lsn(5), "999").unwrap().lsn(), lsn(5));
    }

    #[test]
    fn removal_survives_reopen() {
        let (dir, store) = fresh();
        store.persist("s", lsn(10), SYSID).unwrap();
        store.remove("s").unwrap();
        drop(store);
        let store = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(store.load("s").unwrap(), None);
    }

    #[test]
    fn encoding_is_versioned_json() {
        let (_dir, store) = fresh();
        store.persist("s", lsn(0x1_0000_0002), SYSID).unwrap();
        let raw = store.offsets.get("s").unwrap().unwrap();
        let value: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(value["v"], 1);
        assert_eq!(value["lsn"], "1/2");
        assert_eq!(value["system_id"], SYSID);
        assert!(value["updated_at_unix_ms"].is_i64());
    }

    #[test]
    fn corrupt_values_are_errors_naming_the_key() {
        let (_dir, store) = fresh();
        let cases: [&[u8]; 4] = [
            b"\x00\xffgarbage",
            br#"{"v":2,"lsn":"0/1","system_id":"x","updated_at_unix_ms":0}"#,
            br#"{"v":1,"lsn":"not-an-lsn","system_id":"x","updated_at_unix_ms":0}"#,
            br#"{"v":1,"lsn":"0/1"}"#,
        ];
        for (i, raw) in cases.into_iter().enumerate() {
            let slot = format!("broken_{i}");
            store.offsets.insert(slot.as_str(), raw).unwrap();
            let err = store.load(&slot).unwrap_err();
            match &err {
                StoreError::Corrupt { tree, key, .. } => {
                    assert_eq!(*tree, "offsets");
                    assert!(key.contains(&slot), "{key}");
                }
                other => panic!("case {i}: expected Corrupt, got {other:?}"),
            }
            assert!(err.to_string().contains(&slot), "{err}");
            assert!(
                matches!(
                    store.persist(&slot, lsn(1), "x"),
                    Err(StoreError::Corrupt { .. })
                ),
                "persist must not overwrite what it cannot read"
            );
        }
        let err = store.load("broken_1").unwrap_err().to_string();
        assert!(err.contains("version 2"), "{err}");
    }

    #[test]
    fn second_open_of_same_path_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        let first = OffsetStore::open(dir.path()).unwrap();
        let err = OffsetStore::open(dir.path()).unwrap_err();
        match &err {
            StoreError::Locked { path, .. } => assert_eq!(path, dir.path()),
            other => panic!("expected Locked, got {other:?}"),
        }
        assert_eq!(err.disposition(), Disposition::Retry);
        let text = err.to_string();
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(text.contains("another process"), "{text}");
        // The failed open leaves the first one working, and the lock goes
        // with the first store.
        first.persist("s", lsn(1), SYSID).unwrap();
        drop(first);
        let again = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(again.load("s").unwrap().unwrap().lsn, lsn(1));
    }

    #[test]
    fn unusable_path_is_an_open_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let err = OffsetStore::open(&file).unwrap_err();
        match &err {
            StoreError::Open { path, .. } => assert_eq!(path, &file),
            other => panic!("expected Open, got {other:?}"),
        }
        assert_eq!(err.disposition(), Disposition::Stop);
        assert!(err.to_string().contains("not-a-dir"), "{err}");
    }

    #[test]
    fn a_full_disk_is_retried_and_other_write_errors_stop() {
        let full = StoreError::Flush {
            path: "/x".into(),
            op: "persist",
            key: "slot".into(),
            source: sled::Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)),
        };
        assert!(full.is_disk_full());
        assert_eq!(full.disposition(), Disposition::Retry);
        let quota = StoreError::PageFile {
            path: "/x".into(),
            op: "write",
            source: std::io::Error::from_raw_os_error(libc::EDQUOT),
        };
        assert_eq!(quota.disposition(), Disposition::Retry);
        let broken = StoreError::Flush {
            path: "/x".into(),
            op: "persist",
            key: "slot".into(),
            source: sled::Error::Io(std::io::Error::from_raw_os_error(libc::EIO)),
        };
        assert!(!broken.is_disk_full());
        assert_eq!(broken.disposition(), Disposition::Stop);
    }

    #[test]
    fn parked_aggregates_survive_reopen_until_released() {
        let (dir, store) = fresh();
        assert!(!store.is_parked("order", "42").unwrap());
        assert!(
            store
                .park("order", "42", "null event_id", EventPosition::at(lsn(100)))
                .unwrap()
        );
        assert!(
            !store
                .park("order", "42", "second reason", EventPosition::at(lsn(200)))
                .unwrap()
        );
        assert!(
            store
                .park(
                    "customer",
                    "7",
                    "topic not authorized",
                    EventPosition::at(lsn(150))
                )
                .unwrap()
        );
        assert!(store.is_parked("order", "42").unwrap());
        assert!(!store.is_parked("order", "43").unwrap());
        assert!(!store.is_parked("customer", "42").unwrap());
        drop(store);

        let store = OffsetStore::open(dir.path()).unwrap();
        assert!(store.is_parked("order", "42").unwrap());
        assert!(store.is_parked("customer", "7").unwrap());
        let parked = store.parked().unwrap();
        assert_eq!(parked.len(), 2);
        let order = parked.iter().find(|p| p.aggregate_type == "order").unwrap();
        assert_eq!(
            (
                order.aggregate_id.as_str(),
                order.reason.as_str(),
                order.lsn
            ),
            ("42", "null event_id", lsn(100)),
            "the first reason is kept"
        );

        assert!(store.release("order", "42").unwrap());
        assert!(!store.release("order", "42").unwrap());
        assert!(!store.is_parked("order", "42").unwrap());
        drop(store);

        let store = OffsetStore::open(dir.path()).unwrap();
        assert!(!store.is_parked("order", "42").unwrap());
        assert!(store.is_parked("customer", "7").unwrap());
        assert!(store.release("customer", "7").unwrap());
        assert!(store.parked().unwrap().is_empty());
        assert_eq!(store.parked_count.load(Ordering::Relaxed), 0);
    }

    /// Audit F12: T1 inserts X's event at 0/100 and commits at 0/500; T2
    /// inserts X's event at 0/300 and commits first, at 0/400, and parks X. T1's
    /// event follows T2's in commit order, so it is dead-lettered too, though
    /// its change LSN is lower; an event of a transaction committed before the
    /// parking one is not.
    #[test]
    fn parking_follows_commit_order_not_change_lsns() {
        let (dir, store) = fresh();
        let t2 = EventPosition::new(lsn(0x400), lsn(0x300));
        assert!(store.park("order", "x", "refused", t2).unwrap());
        drop(store);
        let store = OffsetStore::open(dir.path()).unwrap();
        let parked = store.parked_since("order", "x").unwrap().unwrap();
        assert!(parked.is(t2));
        assert!(parked.covers(t2), "the parking event itself");
        let t1 = EventPosition::new(lsn(0x500), lsn(0x100));
        assert!(parked.covers(t1), "a later commit with a lower change LSN");
        assert!(!parked.is(t1));
        let later_in_t2 = EventPosition::new(lsn(0x400), lsn(0x380));
        assert!(parked.covers(later_in_t2));
        let earlier_in_t2 = EventPosition::new(lsn(0x400), lsn(0x200));
        assert!(!parked.covers(earlier_in_t2));
        let committed_before = EventPosition::new(lsn(0x350), lsn(0x340));
        assert!(
            !parked.covers(committed_before),
            "committed before the parking transaction, though inserted after it"
        );
        let record = store.parked_aggregate("order", "x").unwrap().unwrap();
        assert_eq!(
            (record.lsn, record.commit_lsn),
            (lsn(0x300), Some(lsn(0x400)))
        );
    }

    /// A record written before the commit LSN was stored keeps its old rule:
    /// change LSNs compared.
    #[test]
    fn a_parked_record_without_a_commit_lsn_compares_change_lsns() {
        let (dir, store) = fresh();
        let old = serde_json::json!({
            "v": ENCODING_VERSION, "aggregate_type": "order", "aggregate_id": "x",
            "reason": "refused", "lsn": "0/300", "parked_at_unix_ms": 1
        });
        store
            .parked
            .insert(parked_key("order", "x"), old.to_string().as_bytes())
            .unwrap();
        store.db.flush().unwrap();
        drop(store);
        let store = OffsetStore::open(dir.path()).unwrap();
        let parked = store.parked_since("order", "x").unwrap().unwrap();
        assert!(parked.covers(EventPosition::new(lsn(0x200), lsn(0x300))));
        assert!(parked.is(EventPosition::new(lsn(0x900), lsn(0x300))));
        assert!(!parked.covers(EventPosition::new(lsn(0x500), lsn(0x100))));
        let record = store.parked_aggregate("order", "x").unwrap().unwrap();
        assert_eq!(record.commit_lsn, None);
    }

    #[test]
    fn parked_keys_are_unambiguous() {
        let (_dir, store) = fresh();
        park(&store, "ab", "c");
        assert!(!store.is_parked("a", "bc").unwrap());
        assert!(park(&store, "a", "bc"));
        assert_eq!(store.parked().unwrap().len(), 2);
        assert_ne!(parked_key("ab", "c"), parked_key("a", "bc"));
    }

    #[test]
    fn corrupt_parked_value_fails_open_naming_the_aggregate() {
        let (dir, store) = fresh();
        store
            .parked
            .insert(parked_key("order", "42"), &b"{not json"[..])
            .unwrap();
        store.db.flush().unwrap();
        drop(store);
        let err = OffsetStore::open(dir.path()).unwrap_err();
        match &err {
            StoreError::Corrupt { tree, key, .. } => {
                assert_eq!(*tree, "parked");
                assert_eq!(key, r#"aggregate "order"/"42""#);
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn parked_value_for_another_key_is_corrupt() {
        let (_dir, store) = fresh();
        park(&store, "order", "1");
        let raw = store.parked.get(parked_key("order", "1")).unwrap().unwrap();
        store.parked.insert(parked_key("order", "2"), raw).unwrap();
        assert!(matches!(
            store.parked(),
            Err(StoreError::Corrupt { tree: "parked", .. })
        ));
    }

    #[test]
    fn undecodable_parked_key_is_shown_as_bytes() {
        assert_eq!(parked_key_display(b"\x00"), "[00]");
        assert_eq!(
            parked_key_display(&parked_key("t", "i")),
            r#"aggregate "t"/"i""#
        );
    }
}
