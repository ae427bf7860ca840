//! The latest Relation message per relation OID.
//!
//! Insert/Update/Delete carry only a relation OID and positional column
//! values; the column names come from the Relation message PostgreSQL sent
//! earlier in the stream. PostgreSQL sends a Relation again after the table's
//! definition changed (ALTER TABLE), before the first change that uses the new
//! definition, so the latest message for an OID is always the one that applies.

use std::collections::HashMap;

use super::message::Relation;

/// Relations seen in the stream, by OID.
#[derive(Debug, Default, Clone)]
pub struct RelationCache {
    by_oid: HashMap<u32, Relation>,
}

impl RelationCache {
    pub fn new() -> RelationCache {
        RelationCache::default()
    }

    /// Records `rel`, replacing any earlier definition of the same OID, and
    /// returns the replaced one.
    pub fn apply(&mut self, rel: Relation) -> Option<Relation> {
        self.by_oid.insert(rel.oid, rel)
    }

    pub fn get(&self, oid: u32) -> Option<&Relation> {
        self.by_oid.get(&oid)
    }

    /// Forgets `oid`'s description (a relation the caller no longer needs
    /// described); returns it.
    pub fn remove(&mut self, oid: u32) -> Option<Relation> {
        self.by_oid.remove(&oid)
    }

    pub fn len(&self) -> usize {
        self.by_oid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_oid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::{ColumnValue, RelationColumn, TupleData};
    use bytes::Bytes;

    fn column(name: &str, key: bool) -> RelationColumn {
        RelationColumn {
            flags: u8::from(key),
            name: name.to_owned(),
            type_oid: 25,
            type_modifier: -1,
        }
    }

    fn relation(oid: u32, columns: &[&str]) -> Relation {
        Relation {
            oid,
            namespace: "public".to_owned(),
            name: format!("t{oid}"),
            replica_identity: b'd',
            columns: columns
                .iter()
                .enumerate()
                .map(|(i, c)| column(c, i == 0))
                .collect(),
        }
    }

    #[test]
    fn removed_relations_are_forgotten() {
        let mut cache = RelationCache::new();
        cache.apply(relation(10, &["id"]));
        assert_eq!(cache.remove(10).map(|r| r.oid), Some(10));
        assert!(cache.get(10).is_none() && cache.is_empty());
        assert_eq!(cache.remove(10), None);
    }

    #[test]
    fn later_relation_for_the_same_oid_replaces_the_earlier() {
        let mut cache = RelationCache::new();
        assert!(cache.is_empty());
        assert_eq!(cache.apply(relation(10, &["id", "name"])), None);
        assert_eq!(cache.apply(relation(11, &["id"])), None);
        assert_eq!(cache.len(), 2);

        let replaced = cache.apply(relation(10, &["id", "name", "email"]));
        assert_eq!(replaced, Some(relation(10, &["id", "name"])));
        assert_eq!(cache.len(), 2);
        let current = cache.get(10).expect("relation 10 is cached");
        assert_eq!(current.column_index("email"), Some(2));
        assert_eq!(cache.get(11).map(|r| r.columns.len()), Some(1));
        assert!(cache.get(12).is_none());
    }

    #[test]
    fn values_are_found_by_column_name_through_the_relation() {
        let mut cache = RelationCache::new();
        cache.apply(relation(10, &["id", "name", "email"]));
        let rel = cache.get(10).expect("cached");
        let tuple = TupleData {
            columns: vec![
                ColumnValue::Text(Bytes::from_static(b"7")),
                ColumnValue::Null,
            ],
        };
        assert_eq!(
            rel.value(&tuple, "id"),
            Some(&ColumnValue::Text(Bytes::from_static(b"7")))
        );
        assert_eq!(rel.value(&tuple, "name"), Some(&ColumnValue::Null));
        // Column known to the relation but missing from a shorter tuple.
        assert_eq!(rel.value(&tuple, "email"), None);
        assert_eq!(rel.value(&tuple, "nope"), None);
        assert_eq!(rel.value(&tuple, "ID"), None, "names are case-sensitive");
        assert_eq!(rel.qualified_name(), "public.t10");
        assert!(rel.columns[0].is_key());
        assert!(!rel.columns[1].is_key());
    }
}
