//! The store's copy of a parked-aggregates table shared between instances
//! (issue 49 F2). The table itself is read and written above this layer
//! (`crate::parking`); here are the two hooks it needs:
//!
//! - a [`ParkMirror`] that [`OffsetStore::park`] writes to before its own
//!   tree, so a park is in the table before anything after the poison event
//!   can be acknowledged;
//! - [`OffsetStore::sync_parked`], which makes the local copy equal to rows
//!   read from the table, unless a park was made here since they were read.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use super::{
    OffsetStore, ParkedAggregate, ParkedRecordV1, StoreError, aggregate_key, encode, parked_key,
};

/// Where a park goes before the offset store: the shared table.
pub trait ParkMirror: Send + Sync {
    /// Records the park; an aggregate already there keeps its first record.
    fn park(&self, parked: &ParkedAggregate) -> Result<(), StoreError>;
}

/// What one [`OffsetStore::sync_parked`] changed here.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ParkedSync {
    /// Parked in the table, not here yet (parked by another instance, or
    /// before this store existed).
    pub added: Vec<ParkedAggregate>,
    /// Parked here, gone from the table: released (by `outbox-cdc release`
    /// anywhere).
    pub released: Vec<(String, String)>,
}

impl ParkedSync {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.released.is_empty()
    }
}

/// Key (in the store's default tree) saying that this store's parked
/// aggregates were copied into the shared table once: from then on the
/// table is the authority and an entry missing from it was released.
const SHARED_MARKER: &[u8] = b"parking-shared-v1";

impl OffsetStore {
    /// Every later park is written to `mirror` first.
    pub fn set_park_mirror(&self, mirror: Arc<dyn ParkMirror>) {
        *self
            .park_mirror
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(mirror);
    }

    /// A number that changes with every park made here; read it before
    /// reading the table, and hand it to [`Self::sync_parked`].
    pub fn parked_generation(&self) -> u64 {
        self.parked_generation.load(Ordering::Acquire)
    }

    /// Whether this store's parks were copied into the shared table.
    pub fn parking_shared(&self) -> Result<bool, StoreError> {
        self.db
            .contains_key(SHARED_MARKER)
            .map_err(|source| StoreError::Read {
                path: self.path.clone(),
                key: "parking-shared marker".to_owned(),
                source,
            })
    }

    /// Records (durably) that this store's parks are in the shared table.
    pub fn mark_parking_shared(&self) -> Result<(), StoreError> {
        self.db
            .insert(SHARED_MARKER, &b"1"[..])
            .map_err(|source| StoreError::Write {
                path: self.path.clone(),
                op: "mark parking shared",
                key: "parking-shared marker".to_owned(),
                source,
            })?;
        self.flush("mark parking shared", "parking-shared marker".to_owned())?;
        Ok(())
    }

    /// Makes the parked aggregates here equal to `table` (all rows of the
    /// shared table for this slot), read after [`Self::parked_generation`]
    /// returned `generation`. `None`, and nothing changed, when a park was
    /// made here since: the rows may predate it, so read them again.
    pub fn sync_parked(
        &self,
        table: &[ParkedAggregate],
        generation: u64,
    ) -> Result<Option<ParkedSync>, StoreError> {
        let mut cache = self
            .parked_cache
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if self.parked_generation.load(Ordering::Acquire) != generation {
            return Ok(None);
        }
        let wanted: HashMap<(&str, &str), &ParkedAggregate> = table
            .iter()
            .map(|p| ((p.aggregate_type.as_str(), p.aggregate_id.as_str()), p))
            .collect();
        let mut sync = ParkedSync::default();
        for (t, ids) in cache.iter() {
            for id in ids.keys() {
                if !wanted.contains_key(&(t.as_str(), id.as_str())) {
                    sync.released.push((t.clone(), id.clone()));
                }
            }
        }
        for p in table {
            let here = cache
                .get(&p.aggregate_type)
                .and_then(|ids| ids.get(&p.aggregate_id));
            if here.is_none() {
                sync.added.push(p.clone());
            }
        }
        if sync.is_empty() {
            return Ok(Some(sync));
        }
        for (t, id) in &sync.released {
            self.parked
                .remove(parked_key(t, id))
                .map_err(|source| StoreError::Write {
                    path: self.path.clone(),
                    op: "release (shared table)",
                    key: aggregate_key(t, id),
                    source,
                })?;
        }
        for p in &sync.added {
            let key = aggregate_key(&p.aggregate_type, &p.aggregate_id);
            let value = encode(&self.path, key.clone(), &ParkedRecordV1::from(p.clone()))?;
            self.parked
                .insert(parked_key(&p.aggregate_type, &p.aggregate_id), value)
                .map_err(|source| StoreError::Write {
                    path: self.path.clone(),
                    op: "park (shared table)",
                    key,
                    source,
                })?;
        }
        self.flush("sync with the shared table", "parked".to_owned())?;
        for (t, id) in &sync.released {
            if let Some(ids) = cache.get_mut(t) {
                ids.remove(id);
                if ids.is_empty() {
                    cache.remove(t);
                }
            }
        }
        for p in &sync.added {
            cache
                .entry(p.aggregate_type.clone())
                .or_default()
                .insert(p.aggregate_id.clone(), p.parked_at());
        }
        let count = cache.values().map(HashMap::len).sum();
        self.parked_count.store(count, Ordering::Release);
        Ok(Some(sync))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::pg::{EventPosition, Lsn};

    fn parked(t: &str, id: &str, lsn: u64) -> ParkedAggregate {
        ParkedAggregate::parked_now(t, id, "poison", EventPosition::at(Lsn::new(lsn)))
    }

    #[derive(Default)]
    struct Recorder(Mutex<Vec<ParkedAggregate>>);

    impl ParkMirror for Recorder {
        fn park(&self, p: &ParkedAggregate) -> Result<(), StoreError> {
            self.0.lock().unwrap().push(p.clone());
            Ok(())
        }
    }

    struct Refusing;

    impl ParkMirror for Refusing {
        fn park(&self, _: &ParkedAggregate) -> Result<(), StoreError> {
            Err(StoreError::SharedParking {
                table: "public.outbox_cdc_parked".into(),
                url_key: "postgres.url",
                op: "park",
                reason: "connection closed".into(),
                retry: true,
            })
        }
    }

    #[test]
    fn a_park_goes_to_the_mirror_first_and_not_here_when_the_mirror_fails() {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        store.set_park_mirror(Arc::new(Refusing));
        let err = store
            .park("order", "o1", "poison", EventPosition::at(Lsn::new(5)))
            .unwrap_err();
        assert_eq!(err.disposition(), crate::Disposition::Retry, "{err}");
        assert!(!store.is_parked("order", "o1").unwrap());

        let recorder = Arc::new(Recorder::default());
        store.set_park_mirror(recorder.clone());
        assert!(
            store
                .park("order", "o1", "poison", EventPosition::at(Lsn::new(5)))
                .unwrap()
        );
        assert!(store.is_parked("order", "o1").unwrap());
        let seen = recorder.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].lsn, Lsn::new(5));
        // Already parked: the mirror is not asked again.
        assert!(
            !store
                .park("order", "o1", "again", EventPosition::at(Lsn::new(9)))
                .unwrap()
        );
        assert_eq!(recorder.0.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_sync_makes_the_store_equal_to_the_table_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        store
            .park("order", "here", "r", EventPosition::at(Lsn::new(3)))
            .unwrap();
        let table = vec![parked("order", "elsewhere", 7)];
        let sync = store
            .sync_parked(&table, store.parked_generation())
            .unwrap()
            .unwrap();
        assert_eq!(sync.released, vec![("order".to_owned(), "here".to_owned())]);
        assert_eq!(sync.added.len(), 1);
        assert!(!store.is_parked("order", "here").unwrap());
        let since = store.parked_since("order", "elsewhere").unwrap().unwrap();
        assert!(since.is(EventPosition::at(Lsn::new(7))));
        drop(store);
        let store = OffsetStore::open(dir.path()).unwrap();
        let all = store.parked().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].aggregate_id, "elsewhere");
        assert!(!store.parking_shared().unwrap());
        store.mark_parking_shared().unwrap();
        drop(store);
        assert!(
            OffsetStore::open(dir.path())
                .unwrap()
                .parking_shared()
                .unwrap()
        );
    }

    #[test]
    fn rows_read_before_a_park_made_here_are_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        let generation = store.parked_generation();
        // The table was read (empty), then this instance parked o1.
        store
            .park("order", "o1", "r", EventPosition::at(Lsn::new(3)))
            .unwrap();
        assert_eq!(store.sync_parked(&[], generation).unwrap(), None);
        assert!(store.is_parked("order", "o1").unwrap());
    }
}
