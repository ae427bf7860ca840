//! What the session knows of each relation the stream described: the
//! outbox relations bound to the mapping (with their descriptions, for the
//! dead-letter record of a row that cannot be mapped), and the OIDs of the
//! other tables, whose changes are skipped.
//!
//! pgoutput describes a relation before its first change in a session and
//! again after it changed, so a change of an OID never described is a
//! protocol error, never skipped.

use std::collections::{HashMap, HashSet};

use crate::coverage::RelationKind;
use crate::outbox::{BoundRelation, OutboxMapper};
use crate::pg::Lsn;
use crate::pgoutput::{Relation, RelationCache};

use super::protocol;
use crate::error::PipelineError;

#[derive(Default)]
pub(super) struct StreamRelations {
    bound: HashMap<u32, BoundRelation>,
    descriptions: RelationCache,
    /// Relations positively known to be other tables. Only the OID is kept:
    /// under FOR ALL TABLES with table churn, a full description per table
    /// ever seen would grow without bound.
    others: HashSet<u32>,
}

/// Where a change's relation stands.
pub(super) enum Target<'r> {
    Outbox {
        bound: &'r BoundRelation,
        description: Option<&'r Relation>,
    },
    Other,
}

impl StreamRelations {
    /// Records a Relation message of `kind` (decided by the coverage): the
    /// outbox's is bound to the mapping, which may refuse its columns.
    pub(super) fn described(
        &mut self,
        relation: Relation,
        kind: RelationKind,
        mapper: &OutboxMapper,
        lsn: Lsn,
    ) -> Result<(), PipelineError> {
        match kind {
            RelationKind::Outbox => {
                let bound = mapper
                    .bind(&relation)
                    .map_err(|source| PipelineError::Mapping { lsn, source })?;
                self.bound.insert(relation.oid, bound);
                self.others.remove(&relation.oid);
                self.descriptions.apply(relation);
            }
            RelationKind::Other => {
                self.bound.remove(&relation.oid);
                self.descriptions.remove(relation.oid);
                self.others.insert(relation.oid);
            }
        }
        Ok(())
    }

    /// The relation of a change at `lsn`.
    pub(super) fn of_change(&self, oid: u32, lsn: Lsn) -> Result<Target<'_>, PipelineError> {
        match self.bound.get(&oid) {
            Some(bound) => Ok(Target::Outbox {
                bound,
                description: self.descriptions.get(oid),
            }),
            None if self.others.contains(&oid) => Ok(Target::Other),
            None => Err(protocol(
                lsn,
                format!("Insert for relation OID {oid} that was never described"),
            )),
        }
    }
}
