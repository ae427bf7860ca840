//! What the live witness (`src/witness/`) keeps in the offset store, tree
//! `witness`, per slot:
//!
//! - pages of fingerprints of the event ids the stream delivered, each named
//!   by the commit position of its last transaction. They are files in
//!   `<offsets.path>/witness-pages/<slot>/`, not sled values: sled keeps every
//!   value it holds in memory, about 8 MB per million unchecked events (a
//!   1,000,000-row backlog peaked 13-25 MiB above the witness off). A page is
//!   written and synced before the offset that covers it is persisted, so the
//!   pages on disk hold at least every event the durable offset covers. A page
//!   is one version byte then little-endian u64s (a page holds thousands of
//!   them; JSON would triple its size). Pages expire once every row they can
//!   match is checked. Stores written before the files still hold pages in
//!   the tree; they are read and expired the same way.
//! - the witness's position: below which transaction id every row is checked
//!   (JSON with a version field, like the other trees).
//! - the offset through which the pages are complete: the last one a session
//!   persisted after the pages of all it covers (an offset adopted from a
//!   Kafka marker is not; one version byte, then the LSN, little-endian).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{OffsetStore, StoreError, decode_versioned, encode};
use crate::pg::Lsn;

pub(super) const WITNESS_TREE: &str = "witness";
const PAGE_VERSION: u8 = 1;
const PAGE_TAG: u8 = b'p';
const POSITION_TAG: u8 = b's';
const PAGED_TAG: u8 = b'c';
const PAGES_DIR: &str = "witness-pages";
const PAGE_SUFFIX: &str = ".page";

/// Where the live witness has checked up to, for one slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessPosition {
    /// The database cluster the transaction ids belong to.
    pub system_id: String,
    /// Every visible outbox row whose transaction id (64-bit, epoch included)
    /// is below this was checked.
    pub checked_below_xid: u64,
    /// Rows of transactions at or above `checked_below_xid` are looked for
    /// from this time (PostgreSQL microseconds since 2000-01-01) minus the
    /// settle margin: when the position was set, no transaction that could
    /// still write had started before it.
    pub look_from_micros: i64,
}

#[derive(Serialize, Deserialize)]
struct PositionRecordV1 {
    v: u32,
    #[serde(flatten)]
    position: WitnessPosition,
}

fn prefix(slot: &str, tag: u8) -> Vec<u8> {
    let mut key = Vec::with_capacity(slot.len() + 2);
    key.extend_from_slice(slot.as_bytes());
    key.push(0);
    key.push(tag);
    key
}

fn position_key(slot: &str) -> String {
    format!("witness position of slot {slot:?}")
}

fn pages_key(slot: &str) -> String {
    format!("witness pages of slot {slot:?}")
}

impl OffsetStore {
    /// Stores the fingerprints of events whose transactions committed at or
    /// before `through`, synced to disk before it returns (the persist of
    /// the offset that covers them comes after).
    pub fn save_witness_page(
        &self,
        slot: &str,
        through: Lsn,
        chunks: &[&[u64]],
    ) -> Result<(), StoreError> {
        if chunks.iter().all(|c| c.is_empty()) {
            return Ok(());
        }
        // Two pages may end at the same position (a restart replays it).
        let unique = self.db.generate_id().map_err(|source| StoreError::Write {
            path: self.path.clone(),
            op: "save witness page",
            key: pages_key(slot),
            source,
        })?;
        let dir = self.pages_dir(slot);
        let name = format!("{:016x}-{unique:016x}", through.as_u64());
        let fail = |op: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| StoreError::PageFile { path, op, source }
        };
        std::fs::create_dir_all(&dir)
            .map_err(fail("creating the witness pages' directory", &dir))?;
        let partial = dir.join(format!("{name}.partial"));
        let page = dir.join(format!("{name}{PAGE_SUFFIX}"));
        // Written a chunk at a time: a page of a million fingerprints is not
        // copied into one buffer first (issue 50).
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&partial)?;
            file.write_all(&[PAGE_VERSION])?;
            let mut bytes = Vec::new();
            for chunk in chunks {
                bytes.clear();
                bytes.extend(chunk.iter().flat_map(|f| f.to_le_bytes()));
                file.write_all(&bytes)?;
            }
            file.sync_all()
        };
        write().map_err(fail("writing a witness page", &partial))?;
        // Renamed whole, and the directory synced: a crash leaves the page
        // or nothing (a `.partial` file is never read, and goes at the next
        // clear).
        std::fs::rename(&partial, &page).map_err(fail("naming a witness page", &page))?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(fail("syncing the witness pages' directory", &dir))
    }

    /// Records that the pages hold every event sent in a transaction
    /// committing before `through`. Not flushed: the persist of that
    /// offset flushes it.
    pub fn save_witness_paged_through(&self, slot: &str, through: Lsn) -> Result<(), StoreError> {
        let mut value = Vec::with_capacity(9);
        value.push(PAGE_VERSION);
        value.extend_from_slice(&through.as_u64().to_le_bytes());
        self.witness
            .insert(prefix(slot, PAGED_TAG), value)
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "save witness pages' extent",
                key: pages_key(slot),
                source,
            })?;
        Ok(())
    }

    /// See [`Self::save_witness_paged_through`]; zero when none was saved
    /// (a store of an earlier version, the witness off, a new slot).
    pub fn witness_paged_through(&self, slot: &str) -> Result<Lsn, StoreError> {
        let raw = self
            .witness
            .get(prefix(slot, PAGED_TAG))
            .map_err(|source| StoreError::Read {
                path: self.path.clone(),
                key: pages_key(slot),
                source,
            })?;
        let Some(raw) = raw else {
            return Ok(Lsn::ZERO);
        };
        match raw.split_first() {
            Some((&PAGE_VERSION, body)) if body.len() == 8 => Ok(Lsn::new(u64::from_le_bytes(
                body.try_into().expect("8 bytes"),
            ))),
            _ => Err(self.corrupt(
                WITNESS_TREE,
                pages_key(slot),
                format!(
                    "the pages' extent of {} bytes is not version {PAGE_VERSION}",
                    raw.len()
                ),
            )),
        }
    }

    /// Every stored fingerprint of `slot`, sorted.
    pub fn witness_fingerprints(&self, slot: &str) -> Result<Vec<u64>, StoreError> {
        let files = self.page_files(slot)?;
        let bytes: u64 = files.iter().map(|(_, _, len)| len).sum();
        let mut all = Vec::with_capacity(usize::try_from(bytes / 8).unwrap_or(0));
        for (path, _, _) in &files {
            self.read_page_file(slot, path, &mut all)?;
        }
        for entry in self.witness.scan_prefix(prefix(slot, PAGE_TAG)) {
            let (_, value) = entry.map_err(|source| StoreError::Read {
                path: self.path.clone(),
                key: pages_key(slot),
                source,
            })?;
            all.extend(self.page_body(slot, &value)?);
        }
        all.sort_unstable();
        Ok(all)
    }

    /// Appends the fingerprints of one page file to `all`, read a block at a
    /// time (not the whole file first: issue 50). A file expired by a round
    /// since the listing adds nothing.
    fn read_page_file(
        &self,
        slot: &str,
        path: &Path,
        all: &mut Vec<u64>,
    ) -> Result<(), StoreError> {
        use std::io::Read;
        let fail = |source| StoreError::PageFile {
            path: path.to_owned(),
            op: "reading a witness page",
            source,
        };
        let mut file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(fail(source)),
        };
        let len = file.metadata().map_err(fail)?.len();
        let mut version = [0u8; 1];
        let versioned = len > 0 && file.read_exact(&mut version).is_ok();
        if !versioned || version[0] != PAGE_VERSION || (len - 1) % 8 != 0 {
            return Err(self.corrupt(
                WITNESS_TREE,
                pages_key(slot),
                format!(
                    "the page {} of {len} bytes is not version {PAGE_VERSION} fingerprints",
                    path.display()
                ),
            ));
        }
        let mut block = vec![0u8; 64 * 1024];
        let mut filled = 0;
        loop {
            let n = file.read(&mut block[filled..]).map_err(fail)?;
            filled += n;
            let whole = filled - filled % 8;
            all.extend(
                block[..whole]
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
            );
            block.copy_within(whole..filled, 0);
            filled -= whole;
            if n == 0 {
                break;
            }
        }
        if filled != 0 {
            return Err(fail(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the page ended inside a fingerprint",
            )));
        }
        Ok(())
    }

    /// The fingerprints of one page (a value of an older store).
    fn page_body<'a>(
        &self,
        slot: &str,
        raw: &'a [u8],
    ) -> Result<impl Iterator<Item = u64> + 'a, StoreError> {
        match raw.split_first() {
            Some((&PAGE_VERSION, body)) if body.len() % 8 == 0 => Ok(body
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))),
            _ => Err(self.corrupt(
                WITNESS_TREE,
                pages_key(slot),
                format!(
                    "a page of {} bytes is not version {PAGE_VERSION} fingerprints",
                    raw.len()
                ),
            )),
        }
    }

    fn pages_dir(&self, slot: &str) -> PathBuf {
        self.path.join(PAGES_DIR).join(slot)
    }

    /// The page files of `slot`: path, the position in its name, its length.
    fn page_files(&self, slot: &str) -> Result<Vec<(PathBuf, Lsn, u64)>, StoreError> {
        let dir = self.pages_dir(slot);
        let listing = match std::fs::read_dir(&dir) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(StoreError::PageFile {
                    path: dir,
                    op: "listing the witness pages",
                    source,
                });
            }
        };
        let mut files = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|source| StoreError::PageFile {
                path: dir.clone(),
                op: "listing the witness pages",
                source,
            })?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(PAGE_SUFFIX)) else {
                continue;
            };
            let through = stem
                .split_once('-')
                .and_then(|(lsn, _)| u64::from_str_radix(lsn, 16).ok())
                .ok_or_else(|| {
                    self.corrupt(
                        WITNESS_TREE,
                        pages_key(slot),
                        format!("the page file name {stem:?} is not <position>-<id>"),
                    )
                })?;
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            files.push((entry.path(), Lsn::new(through), len));
        }
        Ok(files)
    }

    /// Removes the pages of `slot` whose transactions all committed at or
    /// before `through`; returns how many fingerprints went.
    pub fn expire_witness_pages(&self, slot: &str, through: Lsn) -> Result<usize, StoreError> {
        let start = prefix(slot, PAGE_TAG);
        let mut end = start.clone();
        end.extend_from_slice(&through.as_u64().to_be_bytes());
        end.extend_from_slice(&u64::MAX.to_be_bytes());
        let mut removed = self.remove_witness_entries(slot, self.witness.range(start..=end))?;
        for (path, position, len) in self.page_files(slot)? {
            if position <= through {
                std::fs::remove_file(&path).map_err(|source| StoreError::PageFile {
                    path,
                    op: "removing an expired witness page",
                    source,
                })?;
                removed += usize::try_from(len.saturating_sub(1)).unwrap_or(0);
            }
        }
        Ok(removed / 8)
    }

    /// Removes the entries `entries` yields; returns the bytes their values
    /// held beyond the version byte.
    fn remove_witness_entries(
        &self,
        slot: &str,
        entries: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
    ) -> Result<usize, StoreError> {
        let mut bytes = 0;
        for entry in entries {
            let (key, value) = entry.map_err(|source| StoreError::Read {
                path: self.path.clone(),
                key: pages_key(slot),
                source,
            })?;
            self.witness
                .remove(key)
                .map_err(|source| StoreError::Write {
                    path: self.path.clone(),
                    op: "remove witness entries",
                    key: pages_key(slot),
                    source,
                })?;
            bytes += value.len().saturating_sub(1);
        }
        Ok(bytes)
    }

    pub fn witness_position(&self, slot: &str) -> Result<Option<WitnessPosition>, StoreError> {
        let raw = self
            .witness
            .get(prefix(slot, POSITION_TAG))
            .map_err(|source| StoreError::Read {
                path: self.path.clone(),
                key: position_key(slot),
                source,
            })?;
        raw.map(|raw| {
            decode_versioned::<PositionRecordV1>(&raw)
                .map(|r| r.position)
                .map_err(|reason| self.corrupt(WITNESS_TREE, position_key(slot), reason))
        })
        .transpose()
    }

    /// Stores the witness's position (flushed, with any pages expired before).
    pub fn save_witness_position(
        &self,
        slot: &str,
        position: &WitnessPosition,
    ) -> Result<(), StoreError> {
        let record = PositionRecordV1 {
            v: super::ENCODING_VERSION,
            position: position.clone(),
        };
        let value = encode(&self.path, position_key(slot), &record)?;
        self.witness
            .insert(prefix(slot, POSITION_TAG), value)
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "save witness position",
                key: position_key(slot),
                source,
            })?;
        self.flush("save witness position", position_key(slot))
            .map(drop)
    }

    /// Stores `position` only if the stored one is still `expected` (none
    /// stored: `None`), atomically; false when another writer (a slot
    /// created or recreated by the session meanwhile) changed it, which the
    /// caller's round then must not overwrite with its older view.
    pub fn replace_witness_position(
        &self,
        slot: &str,
        expected: Option<&WitnessPosition>,
        position: &WitnessPosition,
    ) -> Result<bool, StoreError> {
        let key = prefix(slot, POSITION_TAG);
        let current = self.witness.get(&key).map_err(|source| StoreError::Read {
            path: self.path.clone(),
            key: position_key(slot),
            source,
        })?;
        let decoded = current
            .as_ref()
            .map(|raw| {
                decode_versioned::<PositionRecordV1>(raw)
                    .map(|r| r.position)
                    .map_err(|reason| self.corrupt(WITNESS_TREE, position_key(slot), reason))
            })
            .transpose()?;
        if decoded.as_ref() != expected {
            return Ok(false);
        }
        let record = PositionRecordV1 {
            v: super::ENCODING_VERSION,
            position: position.clone(),
        };
        let value = encode(&self.path, position_key(slot), &record)?;
        let swapped = self
            .witness
            .compare_and_swap(key, current, Some(value))
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "save witness position",
                key: position_key(slot),
                source,
            })?;
        if swapped.is_err() {
            return Ok(false);
        }
        self.flush("save witness position", position_key(slot))?;
        Ok(true)
    }

    /// Forgets the witness's pages and position of `slot` (its offset was
    /// removed: a new slot's transactions are checked from its start).
    pub fn clear_witness(&self, slot: &str) -> Result<(), StoreError> {
        for tag in [PAGE_TAG, POSITION_TAG, PAGED_TAG] {
            self.remove_witness_entries(slot, self.witness.scan_prefix(prefix(slot, tag)))?;
        }
        self.flush("clear witness", position_key(slot))?;
        let dir = self.pages_dir(slot);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::PageFile {
                path: dir,
                op: "removing the witness pages",
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> (tempfile::TempDir, OffsetStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn a_position_changed_meanwhile_is_not_replaced() {
        let (_dir, store) = fresh();
        let at = |xid: u64| WitnessPosition {
            system_id: "sys".into(),
            checked_below_xid: xid,
            look_from_micros: 0,
        };
        assert!(store.replace_witness_position("s", None, &at(10)).unwrap());
        // The round read 10; a slot recreated meanwhile stored 20.
        store.save_witness_position("s", &at(20)).unwrap();
        assert!(
            !store
                .replace_witness_position("s", Some(&at(10)), &at(15))
                .unwrap()
        );
        assert_eq!(store.witness_position("s").unwrap(), Some(at(20)));
        assert!(
            store
                .replace_witness_position("s", Some(&at(20)), &at(25))
                .unwrap()
        );
        assert_eq!(store.witness_position("s").unwrap(), Some(at(25)));
        assert!(!store.replace_witness_position("s", None, &at(30)).unwrap());
    }

    #[test]
    fn pages_are_read_sorted_and_expire_by_position_per_slot() {
        let (_dir, store) = fresh();
        store
            .save_witness_page("s", Lsn::new(100), &[&[5], &[1]])
            .unwrap();
        store
            .save_witness_page("s", Lsn::new(200), &[&[3]])
            .unwrap();
        store
            .save_witness_page("s", Lsn::new(200), &[&[9]])
            .unwrap();
        store
            .save_witness_page("s2", Lsn::new(50), &[&[7]])
            .unwrap();
        store.save_witness_page("s", Lsn::new(300), &[&[]]).unwrap();
        assert_eq!(store.witness_fingerprints("s").unwrap(), [1, 3, 5, 9]);
        assert_eq!(store.expire_witness_pages("s", Lsn::new(199)).unwrap(), 2);
        assert_eq!(store.witness_fingerprints("s").unwrap(), [3, 9]);
        assert_eq!(store.expire_witness_pages("s", Lsn::new(200)).unwrap(), 2);
        assert!(store.witness_fingerprints("s").unwrap().is_empty());
        assert_eq!(store.witness_fingerprints("s2").unwrap(), [7]);
    }

    #[test]
    fn the_position_survives_a_reopen_and_clear_forgets_everything() {
        let dir = tempfile::tempdir().unwrap();
        let position = WitnessPosition {
            system_id: "7".into(),
            checked_below_xid: (1 << 32) + 5,
            look_from_micros: 42,
        };
        {
            let store = OffsetStore::open(dir.path()).unwrap();
            assert_eq!(store.witness_position("s").unwrap(), None);
            store.save_witness_page("s", Lsn::new(1), &[&[1]]).unwrap();
            store.save_witness_position("s", &position).unwrap();
        }
        let store = OffsetStore::open(dir.path()).unwrap();
        assert_eq!(store.witness_position("s").unwrap(), Some(position));
        assert_eq!(store.witness_fingerprints("s").unwrap(), [1]);
        store.clear_witness("s").unwrap();
        assert_eq!(store.witness_position("s").unwrap(), None);
        assert!(store.witness_fingerprints("s").unwrap().is_empty());
    }

    #[test]
    fn pages_are_files_beside_sled_and_a_partial_one_is_never_read() {
        let (dir, store) = fresh();
        store
            .save_witness_page("s", Lsn::new(0x10), &[&[4, 2]])
            .unwrap();
        // Not a sled value: sled keeps every value in memory.
        assert_eq!(store.witness.scan_prefix(prefix("s", PAGE_TAG)).count(), 0);
        let pages = dir.path().join(PAGES_DIR).join("s");
        let names: Vec<String> = std::fs::read_dir(&pages)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with("0000000000000010-"), "{names:?}");
        // A crash while a page was written leaves a partial file: not a page.
        std::fs::write(pages.join("0000000000000020-1.partial"), b"\x01abc").unwrap();
        assert_eq!(store.witness_fingerprints("s").unwrap(), [2, 4]);
        store.clear_witness("s").unwrap();
        assert!(!pages.exists());
    }

    #[test]
    fn pages_an_older_store_kept_in_sled_are_read_and_expired() {
        let (_dir, store) = fresh();
        let mut key = prefix("s", PAGE_TAG);
        key.extend_from_slice(&100u64.to_be_bytes());
        key.extend_from_slice(&1u64.to_be_bytes());
        let mut value = vec![PAGE_VERSION];
        value.extend_from_slice(&8u64.to_le_bytes());
        store.witness.insert(key, value).unwrap();
        store
            .save_witness_page("s", Lsn::new(300), &[&[6]])
            .unwrap();
        assert_eq!(store.witness_fingerprints("s").unwrap(), [6, 8]);
        assert_eq!(store.expire_witness_pages("s", Lsn::new(100)).unwrap(), 1);
        assert_eq!(store.witness_fingerprints("s").unwrap(), [6]);
    }

    #[test]
    fn a_damaged_page_file_is_an_error_naming_it() {
        let (dir, store) = fresh();
        let pages = dir.path().join(PAGES_DIR).join("s");
        std::fs::create_dir_all(&pages).unwrap();
        std::fs::write(pages.join("0000000000000001-2.page"), b"\x01abc").unwrap();
        let err = store.witness_fingerprints("s").unwrap_err().to_string();
        assert!(err.contains("witness pages of slot \"s\""), "{err}");
    }

    #[test]
    fn a_page_larger_than_a_read_block_comes_back_whole_from_its_chunks() {
        let (_dir, store) = fresh();
        // 3 chunks, 20,003 fingerprints: 160,024 bytes, read back 64 KiB at
        // a time (a short read that ends inside a fingerprint keeps its part
        // for the next).
        let all: Vec<u64> = (0..20_003u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let chunks: Vec<&[u64]> = all.chunks(8192).collect();
        store.save_witness_page("s", Lsn::new(7), &chunks).unwrap();
        let mut want = all.clone();
        want.sort_unstable();
        assert_eq!(store.witness_fingerprints("s").unwrap(), want);
    }

    #[test]
    fn a_damaged_page_is_an_error_naming_it() {
        let (_dir, store) = fresh();
        let mut key = prefix("s", PAGE_TAG);
        key.extend_from_slice(&[0; 16]);
        store.witness.insert(key, &b"\x02abc"[..]).unwrap();
        let err = store.witness_fingerprints("s").unwrap_err().to_string();
        assert!(err.contains("witness pages of slot \"s\""), "{err}");
    }
}
