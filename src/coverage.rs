//! What the replication stream is proven to carry (DESIGN.md §5a).
//!
//! An acknowledged LSN promises that every outbox row committed before it was
//! published, so a change may be skipped only when it is POSITIVELY known not
//! to be an outbox row. Two halves:
//!
//! - Before streaming, [`gather`] reads the catalog and [`judge`] (pure) proves
//!   that the publication publishes inserts of the configured table, or of
//!   every leaf partition of it, with no row filter and no column list that
//!   drops a mapped column. Any gap is a [`CoverageProblem`] carrying its SQL fix;
//!   `run` refuses to start and `check` prints the same items.
//! - While streaming, every Relation message is classified by
//!   [`Coverage::classify`]: the outbox (root or any partition, also partitions
//!   created while streaming), another table known to be published, or
//!   unaccounted for, which stops the connector ([`Unaccounted`]). A relation
//!   not known from start-up is looked up in the catalog ([`lookup`]) first.
//! - The proof is repeated while streaming; besides the state now, each one
//!   holds the identity of the catalog rows it rests on against the earlier
//!   proofs' ([`PublicationIdentity`], [`Coverage::reconfirm`]), so a narrowing
//!   undone between two proofs still stops the connector.
//!
//! Partitions: with `publish_via_partition_root = true` changes arrive under
//! the root's name; without it, under each leaf's name. Partitions always have
//! exactly their root's columns, so a Relation message (which describes the
//! table as it was when the change was made) that lacks a mapped column cannot
//! be an outbox partition.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use tokio_postgres::Client;

use crate::outbox::{ConfigError, OutboxSettings};
use crate::pg::control::query_value;
use crate::pg::{Lsn, PgError, PgTimestamp, QualifiedTable, quote_ident};
use crate::pgoutput::Relation;

/// The catalog facts the proof needs, read in one go before streaming.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatalogFacts {
    /// `server_version_num`, e.g. 150004.
    pub server_version: i32,
    /// The server's clock when the catalog was read.
    pub read_at: PgTimestamp,
    /// The configured table, `None` when no relation has that name.
    pub table: Option<TableFacts>,
    /// The configured publication, `None` when it does not exist.
    pub publication: Option<PublicationFacts>,
    /// Ordinary and partitioned tables of the database whose names look like an
    /// outbox (for a "did you mean" in the error of a typo'd name).
    pub similar_tables: Vec<QualifiedTable>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFacts {
    pub oid: u32,
    /// `pg_class.relkind`: `r` table, `p` partitioned table, others are not tables.
    pub relkind: char,
    /// `pg_class.relpersistence`: `p` permanent, `u` unlogged, `t` temporary.
    pub persistence: char,
    /// Column names (not dropped).
    pub columns: Vec<String>,
    /// Every partition below the table (intermediate and leaf), empty when it is
    /// not partitioned.
    pub partitions: Vec<Partition>,
    /// Tables the configured one is a partition of (nearest first).
    pub ancestors: Vec<(u32, QualifiedTable)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub oid: u32,
    pub table: QualifiedTable,
    pub is_leaf: bool,
    /// `pg_class.relkind`: `r` table, `p` partitioned, `f` foreign table.
    pub relkind: char,
    /// `pg_class.relpersistence`: `p` permanent, `u` unlogged, `t` temporary.
    pub persistence: char,
    /// xmin of its `pg_inherits` row: the transaction that created or
    /// attached it as a partition.
    pub attached_xmin: i64,
    /// Its heap has a page: a row was written to it once (a heap that never
    /// held a row has none).
    pub holds_rows: bool,
}

impl Partition {
    /// Why inserts into this partition never reach WAL, if they do not.
    fn outside_wal(&self) -> Option<&'static str> {
        outside_wal(self.relkind, self.persistence)
    }
}

/// Why inserts into a relation of this kind and persistence never reach WAL
/// (and so never the replication stream), if they do not.
fn outside_wal(relkind: char, persistence: char) -> Option<&'static str> {
    match (relkind, persistence) {
        ('f', _) => Some("a foreign table"),
        (_, 'u') => Some("UNLOGGED"),
        (_, 't') => Some("a temporary table"),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationFacts {
    pub all_tables: bool,
    pub insert: bool,
    pub via_root: bool,
    /// `pg_publication_tables`: the relations whose changes are sent, under
    /// the names they are sent with.
    pub published: Vec<(u32, QualifiedTable)>,
    /// Row filters and column lists (PostgreSQL 15+) on the configured table,
    /// its partitions or its ancestors.
    pub restrictions: Vec<Restriction>,
    /// The catalog rows this proof rests on, by identity.
    pub identity: PublicationIdentity,
}

/// The catalog rows a proof rests on, by identity: the publication's own
/// `pg_publication` row and its entries for the outbox tree
/// (`pg_publication_rel` of the table, its partitions and ancestors;
/// `pg_publication_namespace` of their schemas), each as (OID, xmin).
///
/// pgoutput applies the publication as of each change's LSN: rows committed
/// while it was narrowed are never sent, even if it was widened again before
/// the next proof, which then sees nothing wrong (audit F1). Every such change
/// rewrites or replaces one of these rows (ALTER PUBLICATION SET updates the
/// publication's row; DROP/ADD TABLE and SET TABLE ... WHERE replace entries; a
/// publication dropped and created again has a new OID), so a row of the
/// baseline that changed or vanished is caught however short the window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublicationIdentity {
    /// `pg_publication` (OID, xmin).
    pub publication: (u32, i64),
    /// `publish_via_partition_root` with the root itself published: every
    /// change to a partition arrives under the root's name. pgoutput sends a
    /// leaf under its own name whenever no ancestor is published, whatever
    /// `publish_via_partition_root` says (C1), so the option alone says
    /// nothing.
    pub leaves_as_root: bool,
    /// The `pg_publication_rel` and `pg_publication_namespace` entries.
    pub entries: BTreeSet<IdentityEntry>,
    /// `pg_class.relfilenode` of the table or of each leaf partition, by
    /// OID. `ALTER TABLE ... SET UNLOGGED` and `SET LOGGED` each rewrite the
    /// table into a new file: rows loaded in between never reached WAL, and
    /// once it is logged again nothing in the catalog but the new file says so.
    pub storage: BTreeMap<u32, u32>,
    /// The outbox table's OID.
    pub root: u32,
}

/// One publication entry for the outbox tree, by identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IdentityEntry {
    /// `'r'`: `pg_publication_rel`; `'n'`: `pg_publication_namespace`.
    pub kind: char,
    /// The entry's own OID.
    pub oid: u32,
    /// The entry's xmin (raw: freezing does not change it).
    pub xmin: i64,
    /// The relation (`'r'`) or schema (`'n'`) it publishes.
    pub target: u32,
}

/// What a later proof found about entries besides their identity: which
/// changes to them cannot have hidden an outbox row, and which can.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryFacts {
    /// Relations of earlier entries that no longer exist: dropping a table
    /// drops its entries with it, and a dropped partition holds no row that
    /// could still be written (C5).
    pub dropped: BTreeSet<u32>,
    /// Leaves published by an entry of their own, newer than their
    /// attachment, that held rows when the entry was first seen: rows
    /// written before the entry existed were never sent (C3).
    pub filled_before_published: Vec<QualifiedTable>,
    /// Earlier entries that still exist unchanged although their relation
    /// left the outbox tree (a partition detached, e.g. by `[prune]` before
    /// it drops it), or the last tree member in their schema did: no change.
    pub still_published: BTreeSet<u32>,
    /// Leaves new since the earlier proof that hold rows and were rewritten
    /// into a new file since they were created (made UNLOGGED, loaded, made
    /// LOGGED again): rows loaded meanwhile never reached WAL.
    pub rewritten_since_created: Vec<QualifiedTable>,
}

/// A `pg_publication_rel` entry that narrows what is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restriction {
    pub table: QualifiedTable,
    /// The row filter, as SQL.
    pub row_filter: Option<String>,
    /// The published columns, when the entry has a column list.
    pub columns: Option<Vec<String>>,
}

pub use crate::outbox::MappedColumn;

/// One reason the stream cannot be proven to carry every outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoverageProblem {
    TableMissing {
        table: QualifiedTable,
        similar: Vec<QualifiedTable>,
    },
    NotATable {
        table: QualifiedTable,
        relkind: char,
    },
    /// The configured table is a partition of a partitioned table.
    IsPartition {
        table: QualifiedTable,
        root: QualifiedTable,
    },
    ColumnMissing {
        table: QualifiedTable,
        column: MappedColumn,
    },
    PublicationMissing {
        publication: String,
        table: QualifiedTable,
        partitioned: bool,
    },
    NoInserts {
        publication: String,
    },
    NotPublished {
        publication: String,
        table: QualifiedTable,
        /// For a partitioned table: the leaves that are published (some are
        /// missing); empty when none is.
        published_leaves: Vec<QualifiedTable>,
        missing_leaves: Vec<QualifiedTable>,
    },
    RowFilter {
        publication: String,
        table: QualifiedTable,
        filter: String,
    },
    ColumnList {
        publication: String,
        table: QualifiedTable,
        missing: Vec<MappedColumn>,
    },
    /// The outbox table or one of its partitions is unlogged, temporary or
    /// foreign: its inserts are not written to WAL, so logical decoding never
    /// sees them, whatever the publication says.
    NotInWal {
        table: QualifiedTable,
        /// The configured outbox table.
        root: QualifiedTable,
        /// "UNLOGGED", "a temporary table" or "a foreign table".
        why: String,
    },
    /// A catalog row the last proof rested on changed or vanished while
    /// streaming (see [`PublicationIdentity`]): the publication may have
    /// carried less for a while, even if it is complete again now.
    PublicationChanged {
        publication: String,
        changed: String,
    },
}

impl CoverageProblem {
    /// The SQL (or configuration) that fixes it.
    pub fn fix(&self) -> String {
        match self {
            CoverageProblem::TableMissing { similar, .. } => {
                let mut fix = "apply migrations/001_outbox.sql (docs/outbox-table.md), or set \
                               outbox.table to the existing outbox table"
                    .to_owned();
                if !similar.is_empty() {
                    let names: Vec<String> = similar.iter().map(ToString::to_string).collect();
                    fix.push_str(&format!(
                        "; tables with similar names: {}",
                        names.join(", ")
                    ));
                }
                fix
            }
            CoverageProblem::NotATable { .. } => {
                "set outbox.table to the outbox table itself".to_owned()
            }
            CoverageProblem::IsPartition { root, .. } => format!(
                "set outbox.table = \"{}\" (the partitioned table): the connector reads all of its partitions",
                plain(root)
            ),
            CoverageProblem::ColumnMissing { table, column } => format!(
                "ALTER TABLE {} ADD COLUMN {} ...;  -- or set {} to an existing column",
                table,
                quote_ident(&column.column),
                column.key
            ),
            CoverageProblem::PublicationMissing {
                publication,
                table,
                partitioned,
            } => format!(
                "{}  -- as the table's owner\nor set postgres.create_publication = true",
                crate::pg::control::create_publication_sql(publication, table, *partitioned)
            ),
            CoverageProblem::NoInserts { publication } => format!(
                "ALTER PUBLICATION {} SET (publish = 'insert');",
                quote_ident(publication)
            ),
            CoverageProblem::NotPublished {
                publication, table, ..
            } => format!(
                "ALTER PUBLICATION {} ADD TABLE {};",
                quote_ident(publication),
                table
            ),
            CoverageProblem::RowFilter {
                publication, table, ..
            }
            | CoverageProblem::ColumnList {
                publication, table, ..
            } => {
                let p = quote_ident(publication);
                let t = table;
                format!(
                    "BEGIN; ALTER PUBLICATION {p} DROP TABLE {t}; ALTER PUBLICATION {p} ADD TABLE {t}; COMMIT;  \
                     -- publishes every row and column of {table}"
                )
            }
            CoverageProblem::NotInWal { table, root, why } => match why.as_str() {
                _ if table == root && why != "UNLOGGED" => format!(
                    "create {table} again as an ordinary (logged) table, or set outbox.table to one"
                ),
                "UNLOGGED" => format!(
                    "ALTER TABLE {table} SET LOGGED;  -- rows already in it were never sent: once the connector \
                     runs again, publish them with `outbox-cdc audit --since <when it was made unlogged> --repair`"
                ),
                _ => format!(
                    "ALTER TABLE {root} DETACH PARTITION {table};  -- and route outbox rows to ordinary \
                     (logged) partitions only"
                ),
            },
            CoverageProblem::PublicationChanged { .. } => "the change is recorded in the offset store: every \
                 start refuses until the rows committed while it may have hidden them are published again. \
                 The start's refusal names the exact `outbox-cdc audit --since ... --until ... --repair` \
                 command (docs/operations.md, \"Publication changed while streaming\")"
                .to_owned(),
        }
    }

    /// Whether rows committed while it held may never have been sent (a
    /// coverage break): the publication left them out, or they never reached
    /// WAL. A table missing under its configured name (renamed, dropped) or a
    /// mapped column gone is not: the stream still carries its rows, and the
    /// relation check stops on them.
    pub fn hides_rows(&self) -> bool {
        !matches!(
            self,
            CoverageProblem::TableMissing { .. }
                | CoverageProblem::NotATable { .. }
                | CoverageProblem::IsPartition { .. }
                | CoverageProblem::ColumnMissing { .. }
        )
    }

    /// The `check` item this problem belongs to.
    pub fn check_item(&self) -> CheckItem {
        match self {
            CoverageProblem::TableMissing { .. }
            | CoverageProblem::NotATable { .. }
            | CoverageProblem::IsPartition { .. } => CheckItem::Table,
            CoverageProblem::ColumnMissing { .. } => CheckItem::Columns,
            CoverageProblem::PublicationMissing { .. } => CheckItem::Publication,
            CoverageProblem::NoInserts { .. } => CheckItem::Publishes,
            CoverageProblem::NotPublished { .. }
            | CoverageProblem::RowFilter { .. }
            | CoverageProblem::ColumnList { .. }
            | CoverageProblem::NotInWal { .. }
            | CoverageProblem::PublicationChanged { .. } => CheckItem::Tables,
        }
    }
}

/// The `check` lines the proof's problems are reported under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckItem {
    Table,
    Columns,
    Publication,
    Publishes,
    Tables,
}

impl fmt::Display for CoverageProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoverageProblem::TableMissing { table, .. } => {
                write!(f, "table {table} (outbox.table) does not exist")
            }
            CoverageProblem::NotATable { table, relkind } => write!(
                f,
                "{table} is not a table (pg_class.relkind = '{relkind}'); only tables can be published"
            ),
            CoverageProblem::IsPartition { table, root } => write!(
                f,
                "{table} is a partition of {root}: rows of its sibling partitions would not be read"
            ),
            CoverageProblem::ColumnMissing { table, column } => write!(
                f,
                "table {table} has no column {:?} ({})",
                column.column, column.key
            ),
            CoverageProblem::PublicationMissing { publication, .. } => write!(
                f,
                "publication {publication:?} (postgres.publication) does not exist"
            ),
            CoverageProblem::NoInserts { publication } => write!(
                f,
                "publication {publication:?} does not publish inserts, so no outbox row would reach the connector"
            ),
            CoverageProblem::NotPublished {
                publication,
                table,
                published_leaves,
                missing_leaves,
            } => {
                if published_leaves.is_empty() {
                    write!(
                        f,
                        "publication {publication:?} does not carry {table}: its rows would never reach the connector"
                    )
                } else {
                    let missing: Vec<String> =
                        missing_leaves.iter().map(ToString::to_string).collect();
                    write!(
                        f,
                        "publication {publication:?} carries only some partitions of {table}; not: {}",
                        missing.join(", ")
                    )
                }
            }
            CoverageProblem::RowFilter {
                publication,
                table,
                filter,
            } => write!(
                f,
                "publication {publication:?} filters {table} with WHERE {filter}: filtered rows would never be published"
            ),
            CoverageProblem::ColumnList {
                publication,
                table,
                missing,
            } => {
                let names: Vec<String> = missing
                    .iter()
                    .map(|c| format!("{} ({})", c.column, c.key))
                    .collect();
                write!(
                    f,
                    "publication {publication:?} publishes only some columns of {table}; missing: {}",
                    names.join(", ")
                )
            }
            CoverageProblem::NotInWal { table, root, why } if table == root => write!(
                f,
                "the outbox table {table} is {why}: its inserts are not written to WAL, so the replication \
                 stream never carries them"
            ),
            CoverageProblem::NotInWal { table, root, why } => write!(
                f,
                "partition {table} of the outbox table {root} is {why}: its inserts are not written to WAL, so \
                 the replication stream never carries them"
            ),
            CoverageProblem::PublicationChanged {
                publication,
                changed,
            } => write!(
                f,
                "publication {publication:?} was changed since the last coverage proof ({changed}); PostgreSQL \
                 does not send rows committed while a publication leaves them out"
            ),
        }
    }
}

/// `run` refused to start: the stream is not proven to carry every outbox row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render_problems(.problems))]
pub struct NotCovered {
    pub problems: Vec<CoverageProblem>,
}

fn render_problems(problems: &[CoverageProblem]) -> String {
    let mut out = String::from(
        "refusing to start: the replication stream is not proven to carry every outbox row (nothing was read or acknowledged)",
    );
    for p in problems {
        out.push_str(&format!("\n  - {p}\n    fix: {}", p.fix()));
    }
    out
}

/// What start-up proved: the relations the stream may carry, by OID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    table: QualifiedTable,
    root_oid: u32,
    /// The root, every partition and every ancestor-free member of the tree.
    outbox: HashMap<u32, QualifiedTable>,
    /// Other published tables, with the names they had at start-up.
    others: HashMap<u32, QualifiedTable>,
    /// Column names the mapping reads.
    mapped: Vec<String>,
    /// The columns of the mapping's identity (event id, aggregate type and
    /// id, payload): an outbox table never lacked them, whatever optional
    /// columns were added since.
    identity: Vec<String>,
    /// The catalog rows the proofs so far rested on.
    publication: PublicationIdentity,
}

/// The configuration keys of the columns every outbox row has always had.
const IDENTITY_KEYS: [&str; 4] = [
    "outbox.columns.event_id",
    "outbox.columns.aggregate_type",
    "outbox.columns.aggregate_id",
    "outbox.columns.payload",
];

/// Proves (pure) that the facts cover the configured table; the mapped
/// columns are those the mapping reads.
pub fn judge(
    facts: &CatalogFacts,
    table: &QualifiedTable,
    publication: &str,
    mapped: &[MappedColumn],
) -> Result<Coverage, Vec<CoverageProblem>> {
    let mut problems = Vec::new();
    let Some(t) = &facts.table else {
        problems.push(CoverageProblem::TableMissing {
            table: table.clone(),
            similar: facts.similar_tables.clone(),
        });
        if facts.publication.is_none() {
            problems.push(CoverageProblem::PublicationMissing {
                publication: publication.to_owned(),
                table: table.clone(),
                partitioned: false,
            });
        }
        return Err(problems);
    };
    if t.relkind != 'r' && t.relkind != 'p' {
        problems.push(CoverageProblem::NotATable {
            table: table.clone(),
            relkind: t.relkind,
        });
        return Err(problems);
    }
    if let Some((_, root)) = t.ancestors.last() {
        problems.push(CoverageProblem::IsPartition {
            table: table.clone(),
            root: root.clone(),
        });
    }
    for column in mapped {
        if !t.columns.contains(&column.column) {
            problems.push(CoverageProblem::ColumnMissing {
                table: table.clone(),
                column: column.clone(),
            });
        }
    }
    let partitioned = t.relkind == 'p';
    let Some(p) = &facts.publication else {
        problems.push(CoverageProblem::PublicationMissing {
            publication: publication.to_owned(),
            table: table.clone(),
            partitioned,
        });
        return Err(problems);
    };
    if !p.insert {
        problems.push(CoverageProblem::NoInserts {
            publication: publication.to_owned(),
        });
    }
    let published: HashMap<u32, &QualifiedTable> =
        p.published.iter().map(|(oid, t)| (*oid, t)).collect();
    if !published.contains_key(&t.oid) {
        let leaves: Vec<&Partition> = t.partitions.iter().filter(|m| m.is_leaf).collect();
        let (present, missing): (Vec<&Partition>, Vec<&Partition>) = leaves
            .iter()
            .partition(|leaf| published.contains_key(&leaf.oid));
        // A partitioned table without partitions has nothing to publish yet; it
        // is covered once the publication carries it (leaves attached later
        // are published through it). A leaf not yet published that never held
        // a row hides nothing yet (a partition created, then added in another
        // transaction): once it holds rows it must be published, and if it is
        // added after that the proofs see it (C3).
        if !partitioned || present.is_empty() || missing.iter().any(|m| m.holds_rows) {
            problems.push(CoverageProblem::NotPublished {
                publication: publication.to_owned(),
                table: table.clone(),
                published_leaves: present.iter().map(|m| m.table.clone()).collect(),
                missing_leaves: missing.iter().map(|m| m.table.clone()).collect(),
            });
        }
    }
    // Inserts that never reach WAL never reach the stream (C4).
    let not_in_wal = |member: &QualifiedTable, why: &str| CoverageProblem::NotInWal {
        table: member.clone(),
        root: table.clone(),
        why: why.to_owned(),
    };
    if let Some(why) = outside_wal(t.relkind, t.persistence) {
        problems.push(not_in_wal(table, why));
    }
    for leaf in t.partitions.iter().filter(|m| m.is_leaf) {
        if let Some(why) = leaf.outside_wal() {
            problems.push(not_in_wal(&leaf.table, why));
        }
    }
    for r in &p.restrictions {
        if let Some(filter) = &r.row_filter {
            problems.push(CoverageProblem::RowFilter {
                publication: publication.to_owned(),
                table: r.table.clone(),
                filter: filter.clone(),
            });
        }
        if let Some(columns) = &r.columns {
            let missing: Vec<MappedColumn> = mapped
                .iter()
                .filter(|m| !columns.contains(&m.column))
                .cloned()
                .collect();
            if !missing.is_empty() {
                problems.push(CoverageProblem::ColumnList {
                    publication: publication.to_owned(),
                    table: r.table.clone(),
                    missing,
                });
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut outbox: HashMap<u32, QualifiedTable> = t
        .partitions
        .iter()
        .map(|m| (m.oid, m.table.clone()))
        .collect();
    outbox.insert(t.oid, table.clone());
    let others = p
        .published
        .iter()
        .filter(|(oid, _)| !outbox.contains_key(oid))
        .map(|(oid, t)| (*oid, t.clone()))
        .collect();
    Ok(Coverage {
        table: table.clone(),
        root_oid: t.oid,
        outbox,
        others,
        mapped: mapped.iter().map(|m| m.column.clone()).collect(),
        identity: mapped
            .iter()
            .filter(|m| IDENTITY_KEYS.contains(&m.key.as_str()))
            .map(|m| m.column.clone())
            .collect(),
        publication: p.identity.clone(),
    })
}

/// What a Relation message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelationKind {
    /// The outbox table or one of its partitions: bind and map its inserts.
    Outbox,
    /// Positively another table: its changes are skipped.
    Other,
}

/// The first answer from what start-up proved, before any catalog lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    Is(RelationKind),
    /// Not known from start-up: look it up ([`lookup`]) and [`Coverage::resolve`].
    LookUp,
}

/// The catalog's present view of a relation (by OID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogRelation {
    pub table: QualifiedTable,
    /// The relation is the outbox table or one of its partitions now.
    pub inside_outbox: bool,
    /// The outbox table is one of this relation's partitions now.
    pub contains_outbox: bool,
}

/// A Relation that is neither the outbox nor positively another table: the
/// connector stops before acknowledging anything after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "relation {relation} (OID {oid}) at LSN {lsn} is not accounted for: {why}. Nothing at or after it was \
     acknowledged. Fix: {fix}"
)]
pub struct Unaccounted {
    pub relation: QualifiedTable,
    pub oid: u32,
    pub lsn: Lsn,
    pub why: String,
    pub fix: String,
}

impl Coverage {
    /// The coverage of `table` alone (OID `root_oid`), published by itself:
    /// for unit tests of what consumes a coverage.
    #[cfg(test)]
    pub(crate) fn of_table_alone(table: QualifiedTable, root_oid: u32) -> Coverage {
        Coverage {
            outbox: HashMap::from([(root_oid, table.clone())]),
            table,
            root_oid,
            others: HashMap::new(),
            mapped: Vec::new(),
            identity: Vec::new(),
            publication: PublicationIdentity::default(),
        }
    }

    /// The configured table's OID at start-up.
    pub fn root_oid(&self) -> u32 {
        self.root_oid
    }

    /// Holds a later proof's catalog rows against those the proofs so far
    /// rested on: a row that changed or vanished is a problem (whatever the
    /// catalog says now), except an entry whose relation was dropped since
    /// (`found.dropped`, C5); rows only added widen the publication and
    /// become part of the baseline, except a leaf's own entry added after
    /// rows were written to it (`found.filled_before_published`, C3).
    pub fn reconfirm(
        &mut self,
        publication: &str,
        now: &PublicationIdentity,
        found: &EntryFacts,
    ) -> Result<(), CoverageProblem> {
        let changed = |changed: String| CoverageProblem::PublicationChanged {
            publication: publication.to_owned(),
            changed,
        };
        let (oid, xmin) = self.publication.publication;
        if now.publication.0 != oid {
            return Err(changed(format!(
                "it was dropped and created again (OID {oid} is now {})",
                now.publication.0
            )));
        }
        if now.publication.1 != xmin {
            return Err(changed(
                "its options were altered (ALTER PUBLICATION ... SET)".to_owned(),
            ));
        }
        if self.publication.root != 0 && now.root != self.publication.root {
            return Err(changed(format!(
                "the outbox table was dropped and created again under its name (OID {} is now {})",
                self.publication.root, now.root
            )));
        }
        if now.leaves_as_root != self.publication.leaves_as_root {
            return Err(changed(format!(
                "the partitioned outbox's root was {} the publication, so partitions' changes now arrive under {}",
                if now.leaves_as_root {
                    "added to"
                } else {
                    "dropped from"
                },
                if now.leaves_as_root {
                    "the root's name"
                } else {
                    "their own names"
                },
            )));
        }
        let gone: Vec<String> = self
            .publication
            .entries
            .difference(&now.entries)
            .filter(|e| {
                let exempt = match e.kind {
                    'r' if e.target != self.publication.root => {
                        found.dropped.contains(&e.target) || found.still_published.contains(&e.oid)
                    }
                    'n' => found.still_published.contains(&e.oid),
                    _ => false,
                };
                !exempt
            })
            .map(|e| match e.kind {
                'n' => format!("schema entry {} (schema OID {})", e.oid, e.target),
                _ => format!("table entry {} (relation OID {})", e.oid, e.target),
            })
            .collect();
        if !gone.is_empty() {
            return Err(changed(format!(
                "its entries for the outbox were dropped or replaced: {} (DROP TABLE/ADD TABLE, \
                 SET TABLE, a row filter or column list changed)",
                gone.join(", ")
            )));
        }
        let rewritten: Vec<String> = self
            .publication
            .storage
            .iter()
            .filter(|(oid, node)| now.storage.get(oid).is_some_and(|n| n != *node))
            .map(|(oid, _)| match self.outbox.get(oid) {
                Some(name) => name.to_string(),
                None => format!("OID {oid}"),
            })
            .chain(
                found
                    .rewritten_since_created
                    .iter()
                    .map(ToString::to_string),
            )
            .collect();
        if !rewritten.is_empty() {
            return Err(changed(format!(
                "outbox table or partition {} was rewritten into a new file (ALTER TABLE ... SET UNLOGGED or \
                 SET LOGGED, also TRUNCATE, VACUUM FULL, CLUSTER, SET TABLESPACE or a column type change): rows \
                 written while it was unlogged never reached WAL",
                rewritten.join(", ")
            )));
        }
        if !found.filled_before_published.is_empty() {
            let late: Vec<String> = found
                .filled_before_published
                .iter()
                .map(ToString::to_string)
                .collect();
            return Err(changed(format!(
                "partition {} was added to it after it was created or attached and already holds rows: rows \
                 written to it before it was added were never sent (create and add a partition in one \
                 transaction, or publish the partitioned table itself)",
                late.join(", ")
            )));
        }
        self.publication = now.clone();
        Ok(())
    }

    /// The catalog rows the proofs so far rested on.
    pub fn identity(&self) -> &PublicationIdentity {
        &self.publication
    }

    /// The same coverage, holding later proofs against `baseline` (what an
    /// earlier session's proofs rested on) instead of today's rows.
    pub fn resting_on(mut self, baseline: PublicationIdentity) -> Coverage {
        self.publication = baseline;
        self
    }

    /// Classifies `rel` from start-up knowledge alone where that is certain.
    /// Another table known from start-up is trusted without a lookup only
    /// when it lacks a mapped column: one with the outbox's columns may have
    /// been attached as a partition since (audit F2), so the catalog decides.
    pub fn classify(&self, rel: &Relation) -> Known {
        let name = relation_name(rel);
        if name == self.table {
            return Known::Is(RelationKind::Outbox);
        }
        // Published through the root, a partition's changes never carry its
        // own name: one that does was detached before that change (audit F15).
        if self.outbox.get(&rel.oid) == Some(&name)
            && rel.oid != self.root_oid
            && !self.publication.leaves_as_root
        {
            return Known::Is(RelationKind::Outbox);
        }
        if self.others.get(&rel.oid) == Some(&name) && lacks_any(rel, &self.mapped) {
            return Known::Is(RelationKind::Other);
        }
        Known::LookUp
    }

    /// Decides from the catalog's present view (`None`: no relation has that
    /// OID any more). A partition found is remembered.
    pub fn resolve(
        &mut self,
        rel: &Relation,
        lsn: Lsn,
        now: Option<&CatalogRelation>,
    ) -> Result<RelationKind, Unaccounted> {
        let name = relation_name(rel);
        let unaccounted = |why: String, fix: String| Unaccounted {
            relation: name.clone(),
            oid: rel.oid,
            lsn,
            why,
            fix,
        };
        let lacks_mapped = lacks_any(rel, &self.mapped);
        match now {
            Some(now) if rel.oid == self.root_oid => {
                if now.table == self.table {
                    // The configured table under an older name: it was renamed
                    // to what the configuration says since this change.
                    Ok(RelationKind::Outbox)
                } else {
                    Err(unaccounted(
                        format!(
                            "it is the outbox table {} under a new name (now {})",
                            self.table, now.table
                        ),
                        format!(
                            "if {} is still the outbox, set outbox.table = \"{}\" and restart (rows written to it \
                             after the rename are then published); otherwise rename it back",
                            now.table,
                            plain(&now.table)
                        ),
                    ))
                }
            }
            Some(now) if now.contains_outbox => Err(unaccounted(
                format!(
                    "the outbox table {} is a partition of it, so outbox rows may arrive under its name",
                    self.table
                ),
                format!(
                    "set outbox.table = \"{}\" (the partitioned root), or publish without publish_via_partition_root",
                    plain(&now.table)
                ),
            )),
            // Inside the outbox now: the outbox, whatever name it arrived
            // under (a change from before a publish_via_partition_root flip
            // arrives under the leaf's name).
            Some(now) if now.inside_outbox => {
                self.outbox.insert(rel.oid, name.clone());
                Ok(RelationKind::Outbox)
            }
            // Not a partition now and under its own name while the root is
            // published through the root: not a partition of the outbox at
            // this change (audit F15).
            _ if self.publication.leaves_as_root => {
                self.outbox.remove(&rel.oid);
                self.others.insert(rel.oid, name.clone());
                Ok(RelationKind::Other)
            }
            // Gone: only a relation without the outbox's identity columns is
            // certainly not a partition (audit F14: a dropped leaf whose
            // changes predate an optional mapped column must not be skipped).
            None if lacks_any(rel, &self.identity) => {
                self.others.insert(rel.oid, name.clone());
                Ok(RelationKind::Other)
            }
            Some(_) if lacks_mapped => {
                // Partitions have their root's columns: this cannot be one.
                self.others.insert(rel.oid, name.clone());
                Ok(RelationKind::Other)
            }
            Some(now) if self.others.contains_key(&rel.oid) && now.table == name => {
                self.others.insert(rel.oid, name.clone());
                Ok(RelationKind::Other)
            }
            Some(now) => Err(unaccounted(
                format!(
                    "it has the outbox's columns, was not published when the connector started, and is not a \
                     partition of {} now (now named {}); it may be a partition detached after this change",
                    self.table, now.table
                ),
                format!(
                    "if {name} never held outbox rows, restart the connector (it is then known from start-up); if \
                     it did, attach it again (ALTER TABLE {} ATTACH PARTITION ...) before restarting",
                    self.table
                ),
            )),
            None => Err(unaccounted(
                format!(
                    "it has the outbox's columns and no longer exists, so whether it was a partition of {} \
                     cannot be proven",
                    self.table
                ),
                "if it never held outbox rows, move the slot past this transaction by hand \
                 (pg_replication_slot_advance) after checking the WAL; otherwise restore it and restart"
                    .to_owned(),
            )),
        }
    }
}

/// Whether `rel` (as described at its change) lacks any of `columns`.
fn lacks_any(rel: &Relation, columns: &[String]) -> bool {
    columns.iter().any(|c| rel.column_index(c).is_none())
}

/// `schema.name` as `outbox.table` takes it (quoted parts only where needed).
fn plain(table: &QualifiedTable) -> String {
    let part = |s: &str| {
        let simple = !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit());
        if simple { s.to_owned() } else { quote_ident(s) }
    };
    format!("{}.{}", part(&table.schema), part(&table.name))
}

/// The configured outbox table as the catalog spells it.
pub fn configured_table(settings: &OutboxSettings) -> Result<QualifiedTable, ConfigError> {
    let t = settings.table_name()?;
    Ok(QualifiedTable::new(t.schema, t.name))
}

fn relation_name(rel: &Relation) -> QualifiedTable {
    QualifiedTable::new(rel.namespace.clone(), rel.name.clone())
}

fn db(during: &str) -> impl Fn(tokio_postgres::Error) -> PgError + '_ {
    move |e| PgError::sql(during.to_owned(), e)
}

/// Reads what [`judge`] needs.
pub async fn gather(
    client: &Client,
    table: &QualifiedTable,
    publication: &str,
) -> Result<CatalogFacts, PgError> {
    let during = format!("reading the catalog for {table} and publication {publication:?}");
    let e = db(&during);
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, \
                    ((extract(epoch FROM clock_timestamp()) - 946684800) * 1e6)::int8",
            &[],
        )
        .await
        .map_err(&e)?;
    let version: i32 = row.try_get(0).map_err(&e)?;
    let read_at = PgTimestamp(row.try_get(1).map_err(&e)?);
    let table_row = client
        .query_opt(
            "SELECT c.oid, c.relkind::text, c.relpersistence::text, \
                    ARRAY(SELECT a.attname::text FROM pg_attribute a \
                          WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(&e)?;
    let mut facts = CatalogFacts {
        server_version: version,
        read_at,
        ..CatalogFacts::default()
    };
    if let Some(row) = table_row {
        let oid: u32 = row.try_get(0).map_err(&e)?;
        let relkind: String = row.try_get(1).map_err(&e)?;
        let persistence: String = row.try_get(2).map_err(&e)?;
        let columns: Vec<String> = row.try_get(3).map_err(&e)?;
        let partitions = partitions(client, oid, &e).await?;
        let ancestors = named_relations(
            client,
            "SELECT a.relid, false FROM pg_partition_ancestors($1::oid::regclass) a WHERE a.relid <> $1",
            oid,
            &e,
        )
        .await?;
        facts.table = Some(TableFacts {
            oid,
            relkind: first_char(&relkind),
            persistence: first_char(&persistence),
            columns,
            partitions,
            ancestors: ancestors
                .into_iter()
                .map(|(oid, table, _)| (oid, table))
                .collect(),
        });
    } else {
        let rows = client
            .query(
                "SELECT n.nspname::text, c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
                   AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                   AND (c.relname ILIKE '%outbox%' OR c.relname ILIKE '%' || $1 || '%' \
                        OR $1 ILIKE '%' || c.relname || '%') \
                 ORDER BY 1, 2 LIMIT 5",
                &[&table.name],
            )
            .await
            .map_err(&e)?;
        for row in rows {
            facts.similar_tables.push(QualifiedTable::new(
                row.try_get::<_, String>(0).map_err(&e)?,
                row.try_get::<_, String>(1).map_err(&e)?,
            ));
        }
    }
    facts.publication =
        publication_facts(client, publication, facts.table.as_ref(), version, &e).await?;
    Ok(facts)
}

fn first_char(text: &str) -> char {
    text.chars().next().unwrap_or('?')
}

/// Every partition below the table `oid`, intermediate and leaf.
async fn partitions(
    client: &Client,
    oid: u32,
    e: &impl Fn(tokio_postgres::Error) -> PgError,
) -> Result<Vec<Partition>, PgError> {
    let rows = client
        .query(
            "SELECT t.relid::oid, n.nspname::text, c.relname::text, t.isleaf, c.relkind::text, \
                    c.relpersistence::text, \
                    (SELECT i.xmin::text::bigint FROM pg_inherits i WHERE i.inhrelid = t.relid LIMIT 1), \
                    coalesce(c.relkind = 'r' AND pg_relation_size(c.oid) > 0, false) \
             FROM pg_partition_tree($1::oid::regclass) t JOIN pg_class c ON c.oid = t.relid \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.relid <> $1",
            &[&oid],
        )
        .await
        .map_err(e)?;
    rows.iter()
        .map(|r| {
            Ok(Partition {
                oid: r.try_get(0).map_err(e)?,
                table: QualifiedTable::new(
                    r.try_get::<_, String>(1).map_err(e)?,
                    r.try_get::<_, String>(2).map_err(e)?,
                ),
                is_leaf: r.try_get(3).map_err(e)?,
                relkind: first_char(&r.try_get::<_, String>(4).map_err(e)?),
                persistence: first_char(&r.try_get::<_, String>(5).map_err(e)?),
                attached_xmin: r.try_get::<_, Option<i64>>(6).map_err(e)?.unwrap_or(0),
                holds_rows: r.try_get(7).map_err(e)?,
            })
        })
        .collect()
}

/// `(oid, name, flag)` rows from a query whose first two columns are an OID and
/// a boolean, given `$1` = `oid`.
async fn named_relations(
    client: &Client,
    sql: &str,
    oid: u32,
    e: &impl Fn(tokio_postgres::Error) -> PgError,
) -> Result<Vec<(u32, QualifiedTable, bool)>, PgError> {
    let wrapped = format!(
        "SELECT r.relid::oid, n.nspname::text, c.relname::text, r.flag \
         FROM ({sql}) AS r(relid, flag) JOIN pg_class c ON c.oid = r.relid \
         JOIN pg_namespace n ON n.oid = c.relnamespace"
    );
    let rows = client.query(&wrapped, &[&oid]).await.map_err(e)?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get(0).map_err(e)?,
                QualifiedTable::new(
                    r.try_get::<_, String>(1).map_err(e)?,
                    r.try_get::<_, String>(2).map_err(e)?,
                ),
                r.try_get(3).map_err(e)?,
            ))
        })
        .collect()
}

async fn publication_facts(
    client: &Client,
    publication: &str,
    table: Option<&TableFacts>,
    version: i32,
    e: &impl Fn(tokio_postgres::Error) -> PgError,
) -> Result<Option<PublicationFacts>, PgError> {
    let Some(row) = client
        .query_opt(
            "SELECT puballtables, pubinsert, pubviaroot, oid, xmin::text::bigint \
             FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(e)?
    else {
        return Ok(None);
    };
    let mut facts = PublicationFacts {
        all_tables: row.try_get(0).map_err(e)?,
        insert: row.try_get(1).map_err(e)?,
        via_root: row.try_get(2).map_err(e)?,
        published: Vec::new(),
        restrictions: Vec::new(),
        identity: PublicationIdentity {
            publication: (row.try_get(3).map_err(e)?, row.try_get(4).map_err(e)?),
            leaves_as_root: false,
            entries: Default::default(),
            storage: BTreeMap::new(),
            root: 0,
        },
    };
    if let Some(t) = table {
        let mut oids: Vec<u32> = vec![t.oid];
        oids.extend(t.partitions.iter().map(|m| m.oid));
        oids.extend(t.ancestors.iter().map(|(oid, _)| *oid));
        // Schema entries (TABLES IN SCHEMA) exist from PostgreSQL 15 on.
        let schemas = if version >= 150000 {
            " UNION ALL SELECT 'n', pn.oid, pn.xmin::text::bigint, pn.pnnspid FROM pg_publication_namespace pn \
               WHERE pn.pnpubid = $1 AND pn.pnnspid IN \
                 (SELECT relnamespace FROM pg_class WHERE oid = ANY ($2::oid[]))"
        } else {
            ""
        };
        let rows = client
            .query(
                &format!(
                    "SELECT 'r'::text, pr.oid, pr.xmin::text::bigint, pr.prrelid FROM pg_publication_rel pr \
                     WHERE pr.prpubid = $1 AND pr.prrelid = ANY ($2::oid[]){schemas}"
                ),
                &[&facts.identity.publication.0, &oids],
            )
            .await
            .map_err(e)?;
        for r in &rows {
            let kind: String = r.try_get(0).map_err(e)?;
            facts.identity.entries.insert(IdentityEntry {
                kind: first_char(&kind),
                oid: r.try_get(1).map_err(e)?,
                xmin: r.try_get(2).map_err(e)?,
                target: r.try_get(3).map_err(e)?,
            });
        }
    }
    let rows = client
        .query(
            "SELECT c.oid, pt.schemaname::text, pt.tablename::text FROM pg_publication_tables pt \
             JOIN pg_namespace n ON n.nspname = pt.schemaname \
             JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename \
             WHERE pt.pubname = $1",
            &[&publication],
        )
        .await
        .map_err(e)?;
    for r in &rows {
        facts.published.push((
            r.try_get(0).map_err(e)?,
            QualifiedTable::new(
                r.try_get::<_, String>(1).map_err(e)?,
                r.try_get::<_, String>(2).map_err(e)?,
            ),
        ));
    }
    if let Some(t) = table {
        facts.identity.root = t.oid;
        facts.identity.leaves_as_root =
            facts.via_root && facts.published.iter().any(|(oid, _)| *oid == t.oid);
        let mut oids: Vec<u32> = vec![t.oid];
        oids.extend(t.partitions.iter().map(|m| m.oid));
        let rows = client
            .query(
                "SELECT oid, relfilenode FROM pg_class WHERE oid = ANY ($1::oid[]) AND relkind = 'r'",
                &[&oids],
            )
            .await
            .map_err(e)?;
        for r in &rows {
            facts
                .identity
                .storage
                .insert(r.try_get(0).map_err(e)?, r.try_get(1).map_err(e)?);
        }
    }
    // Row filters and column lists exist from PostgreSQL 15 on.
    if let Some(t) = table.filter(|_| version >= 150000) {
        let mut oids: Vec<u32> = vec![t.oid];
        oids.extend(t.partitions.iter().map(|m| m.oid));
        oids.extend(t.ancestors.iter().map(|(oid, _)| *oid));
        let rows = client
            .query(
                "SELECT n.nspname::text, c.relname::text, pg_get_expr(pr.prqual, pr.prrelid), \
                        CASE WHEN pr.prattrs IS NULL THEN NULL ELSE \
                          ARRAY(SELECT a.attname::text FROM pg_attribute a \
                                WHERE a.attrelid = pr.prrelid AND a.attnum = ANY (pr.prattrs::int2[])) END \
                 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid \
                 JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE p.pubname = $1 AND pr.prrelid = ANY ($2::oid[]) \
                   AND (pr.prqual IS NOT NULL OR pr.prattrs IS NOT NULL)",
                &[&publication, &oids],
            )
            .await
            .map_err(e)?;
        for r in &rows {
            facts.restrictions.push(Restriction {
                table: QualifiedTable::new(
                    r.try_get::<_, String>(0).map_err(e)?,
                    r.try_get::<_, String>(1).map_err(e)?,
                ),
                row_filter: r.try_get(2).map_err(e)?,
                columns: r.try_get(3).map_err(e)?,
            });
        }
    }
    Ok(Some(facts))
}

/// What the catalog says now about the entries `baseline` (an earlier
/// proof's) does not share with `facts` (this proof's), for
/// [`Coverage::reconfirm`].
pub async fn entry_facts(
    client: &Client,
    facts: &CatalogFacts,
    baseline: &PublicationIdentity,
) -> Result<EntryFacts, PgError> {
    let mut found = EntryFacts::default();
    let (Some(t), Some(p)) = (&facts.table, &facts.publication) else {
        return Ok(found);
    };
    let e = db("reading what became of the publication's entries");
    let vanished: Vec<u32> = baseline
        .entries
        .difference(&p.identity.entries)
        .filter(|entry| entry.kind == 'r')
        .map(|entry| entry.target)
        .collect();
    if !vanished.is_empty() {
        let rows = client
            .query(
                "SELECT v FROM unnest($1::oid[]) AS v WHERE NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = v)",
                &[&vanished],
            )
            .await
            .map_err(&e)?;
        for r in &rows {
            found.dropped.insert(r.try_get(0).map_err(&e)?);
        }
    }
    // Entries not read this time because their relation (or the last tree
    // member in their schema) left the tree: still there, unchanged?
    let unread: Vec<u32> = baseline
        .entries
        .difference(&p.identity.entries)
        .map(|entry| entry.oid)
        .collect();
    if !unread.is_empty() {
        let schemas = if facts.server_version >= 150000 {
            " UNION ALL SELECT pn.oid, pn.xmin::text::bigint FROM pg_publication_namespace pn \
              WHERE pn.oid = ANY ($1::oid[])"
        } else {
            ""
        };
        let sql = format!(
            "SELECT pr.oid, pr.xmin::text::bigint FROM pg_publication_rel pr WHERE pr.oid = ANY ($1::oid[]){schemas}"
        );
        let rows = client.query(&sql, &[&unread]).await.map_err(&e)?;
        for r in &rows {
            let (oid, xmin): (u32, i64) = (r.try_get(0).map_err(&e)?, r.try_get(1).map_err(&e)?);
            if baseline
                .entries
                .iter()
                .any(|entry| entry.oid == oid && entry.xmin == xmin)
            {
                found.still_published.insert(oid);
            }
        }
    }
    // A leaf new since the baseline holding rows in a file other than its
    // first: rewritten since it was created (a new relation's file number is
    // its OID).
    for leaf in t.partitions.iter().filter(|m| m.is_leaf && m.holds_rows) {
        let node = p.identity.storage.get(&leaf.oid);
        if !baseline.storage.contains_key(&leaf.oid) && node.is_some_and(|n| *n != leaf.oid) {
            found.rewritten_since_created.push(leaf.table.clone());
        }
    }
    // A leaf published by an entry of its own: rows written to it between
    // its creation (or attachment) and the entry were never sent. Only where
    // no ancestor or schema entry publishes it already.
    let ancestors: BTreeSet<u32> = std::iter::once(t.oid)
        .chain(t.ancestors.iter().map(|(oid, _)| *oid))
        .collect();
    let covered_above = p.all_tables
        || p.identity
            .entries
            .iter()
            .any(|entry| entry.kind == 'n' || ancestors.contains(&entry.target));
    if covered_above {
        return Ok(found);
    }
    let known: BTreeSet<u32> = baseline.entries.iter().map(|entry| entry.oid).collect();
    for entry in p
        .identity
        .entries
        .iter()
        .filter(|entry| !known.contains(&entry.oid))
    {
        let Some(leaf) = t
            .partitions
            .iter()
            .find(|m| m.is_leaf && m.oid == entry.target)
        else {
            continue;
        };
        // Added to the publication in the transaction that created or
        // attached it, or before (a table published on its own, then
        // attached): no window. age() compares both xids against one
        // reference, so wraparound does not matter.
        let sql = "SELECT age($1::text::xid) >= age($2::text::xid)";
        let (added, attached) = (entry.xmin.to_string(), leaf.attached_xmin.to_string());
        let added_first: bool = query_value(client, sql, &[&added, &attached])
            .await
            .map_err(&e)?;
        if added_first {
            continue;
        }
        // A rolled-back insert also leaves a page: a stop, not a loss.
        if leaf.holds_rows {
            found.filled_before_published.push(leaf.table.clone());
        }
    }
    Ok(found)
}

/// The catalog's present view of relation `oid` against the outbox root.
pub async fn lookup(
    client: &Client,
    oid: u32,
    root_oid: u32,
) -> Result<Option<CatalogRelation>, PgError> {
    let during = format!("looking up relation OID {oid} in the catalog");
    let e = db(&during);
    let row = client
        .query_opt(
            "SELECT n.nspname::text, c.relname::text, \
                    EXISTS (SELECT 1 FROM pg_partition_ancestors(c.oid) a WHERE a.relid = $2::oid), \
                    EXISTS (SELECT 1 FROM pg_partition_ancestors($2::oid::regclass) a WHERE a.relid = c.oid) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
            &[&oid, &root_oid],
        )
        .await
        .map_err(&e)?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(CatalogRelation {
        table: QualifiedTable::new(
            row.try_get::<_, String>(0).map_err(&e)?,
            row.try_get::<_, String>(1).map_err(&e)?,
        ),
        inside_outbox: row.try_get(2).map_err(&e)?,
        contains_outbox: row.try_get(3).map_err(&e)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: u32 = 100;
    const LEAF_A: u32 = 101;
    const LEAF_B: u32 = 102;
    const OTHER: u32 = 200;

    fn t(name: &str) -> QualifiedTable {
        QualifiedTable::new("public", name)
    }

    fn mapped() -> Vec<MappedColumn> {
        ["event_id", "aggregate_id", "payload", "schema_version"]
            .iter()
            .map(|c| MappedColumn {
                key: format!("outbox.columns.{c}"),
                column: (*c).to_owned(),
                role: crate::outbox::ColumnRole::Any,
            })
            .collect()
    }

    fn columns() -> Vec<String> {
        [
            "event_id",
            "aggregate_id",
            "payload",
            "schema_version",
            "occurred_at",
        ]
        .iter()
        .map(|c| (*c).to_owned())
        .collect()
    }

    fn partitioned(published: Vec<(u32, QualifiedTable)>, via_root: bool) -> CatalogFacts {
        let leaves_as_root = via_root && published.iter().any(|(oid, _)| *oid == ROOT);
        CatalogFacts {
            server_version: 150000,
            read_at: PgTimestamp(0),
            table: Some(TableFacts {
                oid: ROOT,
                relkind: 'p',
                persistence: 'p',
                columns: columns(),
                partitions: vec![
                    leaf(LEAF_A, "outbox_2026_11"),
                    leaf(LEAF_B, "outbox_2026_12"),
                ],
                ancestors: Vec::new(),
            }),
            publication: Some(PublicationFacts {
                all_tables: false,
                insert: true,
                via_root,
                published,
                identity: PublicationIdentity {
                    leaves_as_root,
                    ..PublicationIdentity::default()
                },
                restrictions: Vec::new(),
            }),
            similar_tables: Vec::new(),
        }
    }

    fn leaf(oid: u32, name: &str) -> Partition {
        Partition {
            oid,
            table: t(name),
            is_leaf: true,
            relkind: 'r',
            persistence: 'p',
            attached_xmin: 0,
            holds_rows: true,
        }
    }

    fn relation(oid: u32, name: &str, cols: &[&str]) -> Relation {
        Relation::of_text(oid, "public", name, cols)
    }

    const OUTBOX_COLS: [&str; 5] = [
        "event_id",
        "aggregate_id",
        "payload",
        "schema_version",
        "occurred_at",
    ];

    /// The partitioned outbox published leaf by leaf (not via its root).
    fn published_by_leaf() -> CatalogFacts {
        partitioned(
            vec![(LEAF_A, t("outbox_2026_11")), (LEAF_B, t("outbox_2026_12"))],
            false,
        )
    }

    fn proven(facts: &CatalogFacts) -> Coverage {
        judge(facts, &t("outbox"), "pub", &mapped()).expect("covered")
    }

    #[test]
    fn a_partitioned_table_is_covered_by_its_root_or_every_leaf() {
        proven(&partitioned(vec![(ROOT, t("outbox"))], true));
        proven(&published_by_leaf());
    }

    #[test]
    fn a_partitioned_table_with_a_leaf_missing_is_not_covered() {
        let problems = judge(
            &partitioned(vec![(LEAF_A, t("outbox_2026_11"))], false),
            &t("outbox"),
            "pub",
            &mapped(),
        )
        .unwrap_err();
        assert!(
            matches!(&problems[..], [CoverageProblem::NotPublished { missing_leaves, .. }]
                if missing_leaves == &vec![t("outbox_2026_12")]),
            "{problems:?}"
        );
        assert!(problems[0].fix().contains("ALTER PUBLICATION"));
    }

    #[test]
    fn a_table_the_publication_does_not_carry_is_not_covered() {
        let mut facts = partitioned(vec![(OTHER, t("orders"))], false);
        facts.table.as_mut().unwrap().relkind = 'r';
        facts.table.as_mut().unwrap().partitions.clear();
        let problems = judge(&facts, &t("outbox"), "pub", &mapped()).unwrap_err();
        assert!(matches!(
            &problems[..],
            [CoverageProblem::NotPublished { .. }]
        ));
        assert_eq!(
            problems[0].fix(),
            "ALTER PUBLICATION \"pub\" ADD TABLE \"public\".\"outbox\";"
        );
    }

    #[test]
    fn missing_table_publication_inserts_filters_and_columns_are_each_reported() {
        let missing = CatalogFacts {
            similar_tables: vec![t("outbox_events")],
            ..CatalogFacts::default()
        };
        let problems = judge(&missing, &t("outbox_event"), "pub", &mapped()).unwrap_err();
        assert!(matches!(problems[0], CoverageProblem::TableMissing { .. }));
        assert!(problems[0].fix().contains("\"public\".\"outbox_events\""));

        let mut facts = partitioned(vec![(ROOT, t("outbox"))], true);
        let p = facts.publication.as_mut().unwrap();
        p.insert = false;
        p.restrictions = vec![
            Restriction {
                table: t("outbox"),
                row_filter: Some("(aggregate_id <> 'x'::text)".into()),
                columns: None,
            },
            Restriction {
                table: t("outbox_2026_11"),
                row_filter: None,
                columns: Some(vec![
                    "event_id".into(),
                    "aggregate_id".into(),
                    "schema_version".into(),
                ]),
            },
        ];
        facts
            .table
            .as_mut()
            .unwrap()
            .columns
            .retain(|c| c != "event_id");
        let problems = judge(&facts, &t("outbox"), "pub", &mapped()).unwrap_err();
        let kinds: Vec<CheckItem> = problems.iter().map(CoverageProblem::check_item).collect();
        assert_eq!(
            kinds,
            [
                CheckItem::Columns,
                CheckItem::Publishes,
                CheckItem::Tables,
                CheckItem::Tables
            ],
            "{problems:?}"
        );
        assert!(
            matches!(&problems[3], CoverageProblem::ColumnList { missing, .. }
                if missing.len() == 1 && missing[0].column == "payload")
        );

        let none = CatalogFacts {
            publication: None,
            ..partitioned(Vec::new(), false)
        };
        let problems = judge(&none, &t("outbox"), "pub", &mapped()).unwrap_err();
        assert!(
            problems[0]
                .fix()
                .contains("publish_via_partition_root = true")
        );
    }

    #[test]
    fn a_partition_as_the_configured_table_is_refused() {
        let mut facts = partitioned(vec![(ROOT, t("outbox"))], true);
        facts.table.as_mut().unwrap().ancestors = vec![(7, t("all_events"))];
        let problems = judge(&facts, &t("outbox"), "pub", &mapped()).unwrap_err();
        assert!(matches!(problems[0], CoverageProblem::IsPartition { .. }));
    }

    #[test]
    fn start_up_relations_are_classified_without_a_lookup() {
        let c = proven(&partitioned(
            vec![
                (LEAF_A, t("outbox_2026_11")),
                (LEAF_B, t("outbox_2026_12")),
                (OTHER, t("orders")),
            ],
            false,
        ));
        let outbox = Known::Is(RelationKind::Outbox);
        assert_eq!(c.classify(&relation(ROOT, "outbox", &OUTBOX_COLS)), outbox);
        assert_eq!(
            c.classify(&relation(LEAF_B, "outbox_2026_12", &OUTBOX_COLS)),
            outbox
        );
        assert_eq!(
            c.classify(&relation(OTHER, "orders", &["id"])),
            Known::Is(RelationKind::Other)
        );
        // Renamed, or never seen: the catalog decides.
        assert_eq!(
            c.classify(&relation(ROOT, "outbox_old", &OUTBOX_COLS)),
            Known::LookUp
        );
        assert_eq!(
            c.classify(&relation(OTHER, "orders_v2", &["id"])),
            Known::LookUp
        );
        assert_eq!(
            c.classify(&relation(300, "outbox_2027_01", &OUTBOX_COLS)),
            Known::LookUp
        );
    }

    /// What `c` decides of `rel` when the catalog now shows it under its own
    /// name, `inside` the outbox or not, an ancestor that `contains` it or not.
    fn resolve_now(
        c: &mut Coverage,
        rel: &Relation,
        lsn: Lsn,
        inside: bool,
        contains: bool,
    ) -> Result<RelationKind, Unaccounted> {
        c.resolve(rel, lsn, Some(&now(&rel.name, inside, contains)))
    }

    /// [`resolve_now`] of a relation that `c` cannot classify without the
    /// catalog (asserted first), and that no ancestor contains.
    fn look_up_now(
        c: &mut Coverage,
        rel: &Relation,
        lsn: Lsn,
        inside: bool,
    ) -> Result<RelationKind, Unaccounted> {
        assert_eq!(c.classify(rel), Known::LookUp);
        resolve_now(c, rel, lsn, inside, false)
    }

    fn now(name: &str, inside: bool, contains: bool) -> CatalogRelation {
        CatalogRelation {
            table: t(name),
            inside_outbox: inside,
            contains_outbox: contains,
        }
    }

    #[test]
    fn lookups_accept_new_partitions_and_stop_on_everything_uncertain() {
        let mut c = proven(&published_by_leaf());
        let lsn = Lsn::new(0x1234);
        // A partition created while streaming: outbox, remembered.
        let new_leaf = relation(300, "outbox_2027_01", &OUTBOX_COLS);
        assert_eq!(
            resolve_now(&mut c, &new_leaf, lsn, true, false),
            Ok(RelationKind::Outbox)
        );
        assert_eq!(c.classify(&new_leaf), Known::Is(RelationKind::Outbox));
        // The outbox renamed away from the configured name: stop.
        let renamed = relation(ROOT, "outbox_old", &OUTBOX_COLS);
        let err = resolve_now(&mut c, &renamed, lsn, true, false).unwrap_err();
        assert_eq!((err.oid, err.lsn), (ROOT, lsn));
        assert!(
            err.fix.contains("outbox.table = \"public.outbox_old\""),
            "{err}"
        );
        // The configured table seen under its older name (renamed to the
        // configured one since): the outbox.
        assert_eq!(
            c.resolve(&renamed, lsn, Some(&now("outbox", true, false))),
            Ok(RelationKind::Outbox)
        );
        // A table without the outbox's columns cannot be a partition of it.
        let unrelated = relation(400, "audit_log", &["id", "what"]);
        assert_eq!(c.resolve(&unrelated, lsn, None), Ok(RelationKind::Other));
        assert_eq!(c.classify(&unrelated), Known::Is(RelationKind::Other));
        // Outbox-shaped, not a partition now, unknown at start-up: maybe a
        // partition detached since; gone: unprovable. Both stop.
        let shaped = relation(500, "outbox_2025_01", &OUTBOX_COLS);
        assert!(resolve_now(&mut c, &shaped, lsn, false, false).is_err());
        assert!(c.resolve(&shaped, lsn, None).is_err());
        // An ancestor of the outbox could carry its rows under its own name.
        let parent = relation(600, "all_events", &OUTBOX_COLS);
        assert!(resolve_now(&mut c, &parent, lsn, false, true).is_err());
    }

    #[test]
    fn an_outbox_shaped_table_published_at_start_up_is_another_table() {
        let mut c = proven(&partitioned(
            vec![(ROOT, t("outbox")), (OTHER, t("outbox_archive"))],
            true,
        ));
        let archive = relation(OTHER, "outbox_archive", &OUTBOX_COLS);
        // Outbox-shaped: the catalog decides, every time (audit F2).
        assert_eq!(
            look_up_now(&mut c, &archive, Lsn::new(1), false),
            Ok(RelationKind::Other)
        );
        assert_eq!(c.classify(&archive), Known::LookUp, "still not trusted");
        // Renamed since start-up but still the same standalone table.
        let renamed = relation(OTHER, "outbox_archive_2025", &OUTBOX_COLS);
        assert_eq!(
            look_up_now(&mut c, &renamed, Lsn::new(1), false),
            Ok(RelationKind::Other)
        );
    }

    /// Audit F2: FOR ALL TABLES without publish_via_partition_root (Debezium's
    /// default publication), a standalone table with the outbox's columns
    /// published at start-up, then attached as a partition: its rows are outbox
    /// rows from then on.
    #[test]
    fn a_published_table_attached_as_an_outbox_partition_becomes_the_outbox() {
        let mut c = proven(&partitioned(
            vec![
                (LEAF_A, t("outbox_2026_11")),
                (LEAF_B, t("outbox_2026_12")),
                (OTHER, t("outbox_2027_01")),
            ],
            false,
        ));
        let attached = relation(OTHER, "outbox_2027_01", &OUTBOX_COLS);
        assert_eq!(
            look_up_now(&mut c, &attached, Lsn::new(7), true),
            Ok(RelationKind::Outbox)
        );
        assert_eq!(c.classify(&attached), Known::Is(RelationKind::Outbox));
    }

    /// Audit F14: a relation that is gone is skipped only when it lacks the
    /// outbox's identity columns; one that lacks only an optional mapped
    /// column (added to the outbox later) may be a dropped leaf: stop.
    #[test]
    fn a_gone_relation_is_skipped_only_without_the_outbox_identity_columns() {
        let mut c = proven(&published_by_leaf());
        let lsn = Lsn::new(9);
        let optional = mapped()
            .into_iter()
            .find(|m| !IDENTITY_KEYS.contains(&m.key.as_str()))
            .expect("an optional mapped column in the fixture");
        let without_optional: Vec<&str> = OUTBOX_COLS
            .iter()
            .copied()
            .filter(|c| *c != optional.column)
            .collect();
        let old_leaf = relation(700, "outbox_2024_01", &without_optional);
        assert!(c.resolve(&old_leaf, lsn, None).is_err(), "a dropped leaf");
        // Still existing and not a partition: positively another table.
        assert_eq!(
            resolve_now(&mut c, &old_leaf, lsn, false, false),
            Ok(RelationKind::Other)
        );
        let unrelated = relation(701, "staging", &["id", "payload"]);
        assert_eq!(c.resolve(&unrelated, lsn, None), Ok(RelationKind::Other));
    }

    fn entry(kind: char, oid: u32, xmin: i64, target: u32) -> IdentityEntry {
        IdentityEntry {
            kind,
            oid,
            xmin,
            target,
        }
    }

    fn identity(publication: (u32, i64), entries: &[IdentityEntry]) -> PublicationIdentity {
        PublicationIdentity {
            publication,
            leaves_as_root: false,
            entries: entries.iter().copied().collect(),
            storage: BTreeMap::new(),
            root: 0,
        }
    }

    /// Audit F1: a later proof is held against the catalog rows the proofs
    /// so far rested on, not only against the state now.
    #[test]
    fn a_publication_changed_between_proofs_is_caught_by_its_rows() {
        let none = EntryFacts::default();
        let mut facts = partitioned(vec![(ROOT, t("outbox"))], false);
        facts.publication.as_mut().unwrap().identity =
            identity((7, 100), &[entry('r', 20, 101, ROOT)]);
        let mut c = proven(&facts);
        // Unchanged, then widened (an entry added): fine, and the new entry
        // joins the baseline.
        assert_eq!(
            c.reconfirm(
                "pub",
                &identity((7, 100), &[entry('r', 20, 101, ROOT)]),
                &none
            ),
            Ok(())
        );
        let wider = identity(
            (7, 100),
            &[entry('r', 20, 101, ROOT), entry('n', 30, 105, 2200)],
        );
        assert_eq!(c.reconfirm("pub", &wider, &none), Ok(()));
        // The table dropped and added again (a new entry), the schema entry
        // gone, options altered, the publication recreated, the root's
        // publishing of partitions flipped: each is caught although every
        // later state would pass the proof.
        let flipped = PublicationIdentity {
            leaves_as_root: true,
            ..wider.clone()
        };
        for (now, says) in [
            (
                identity(
                    (7, 100),
                    &[entry('r', 21, 110, ROOT), entry('n', 30, 105, 2200)],
                ),
                "table entry 20",
            ),
            (
                identity((7, 100), &[entry('r', 20, 101, ROOT)]),
                "schema entry 30",
            ),
            (
                identity(
                    (7, 111),
                    &[entry('r', 20, 101, ROOT), entry('n', 30, 105, 2200)],
                ),
                "options were altered",
            ),
            (
                identity(
                    (8, 112),
                    &[entry('r', 20, 101, ROOT), entry('n', 30, 105, 2200)],
                ),
                "dropped and created again",
            ),
            (flipped, "arrive under the root's name"),
        ] {
            let mut c = c.clone();
            let problem = c.reconfirm("pub", &now, &none).expect_err(says);
            assert!(
                matches!(&problem, CoverageProblem::PublicationChanged { changed, .. } if changed.contains(says)),
                "{problem}"
            );
            assert!(problem.fix().contains("audit"), "{}", problem.fix());
        }
    }

    /// C5: a leaf-list publication loses the entry of a partition that is
    /// dropped (by `[prune]` or a DBA); nothing could be written to it any
    /// more, so that is no change. An entry whose relation still exists is.
    #[test]
    fn the_entry_of_a_dropped_partition_vanishing_is_no_change() {
        let mut facts = published_by_leaf();
        let both = identity(
            (7, 100),
            &[entry('r', 20, 101, LEAF_A), entry('r', 21, 102, LEAF_B)],
        );
        facts.publication.as_mut().unwrap().identity = both;
        let c = proven(&facts);
        let only_b = identity((7, 100), &[entry('r', 21, 102, LEAF_B)]);
        let dropped = EntryFacts {
            dropped: [LEAF_A].into(),
            ..EntryFacts::default()
        };
        assert_eq!(c.clone().reconfirm("pub", &only_b, &dropped), Ok(()));
        let problem = c
            .clone()
            .reconfirm("pub", &only_b, &EntryFacts::default())
            .expect_err("leaf A still exists: its entry was dropped from the publication");
        assert!(problem.to_string().contains("table entry 20"), "{problem}");
    }

    /// The outbox dropped and created again under its name (while stopped):
    /// its old entry's relation is gone, but that is no dropped partition.
    #[test]
    fn the_outbox_recreated_under_its_name_is_a_change() {
        let mut before = identity((7, 100), &[entry('r', 20, 101, ROOT)]);
        before.root = ROOT;
        let mut facts = partitioned(vec![(ROOT, t("outbox"))], false);
        facts.publication.as_mut().unwrap().identity = before;
        let c = proven(&facts);
        let mut now = identity((7, 100), &[entry('r', 25, 140, 900)]);
        now.root = 900;
        let dropped = EntryFacts {
            dropped: [ROOT].into(),
            ..EntryFacts::default()
        };
        let problem = c
            .clone()
            .reconfirm("pub", &now, &dropped)
            .expect_err("recreated");
        assert!(
            problem.to_string().contains("dropped and created again"),
            "{problem}"
        );
        // Its entry alone gone with the relation is not exempt either.
        now.root = ROOT;
        let problem = c
            .clone()
            .reconfirm("pub", &now, &dropped)
            .expect_err("root entry");
        assert!(problem.to_string().contains("table entry 20"), "{problem}");
    }

    /// A leaf-list partition detached (by `[prune]` before it drops it, or
    /// kept as an archive) leaves the tree but keeps its entry: no change.
    /// Its entry dropped from the publication is one.
    #[test]
    fn a_detached_partition_keeping_its_entry_is_no_change() {
        let mut facts = published_by_leaf();
        let both = identity(
            (7, 100),
            &[entry('r', 20, 101, LEAF_A), entry('r', 21, 102, LEAF_B)],
        );
        facts.publication.as_mut().unwrap().identity = both;
        let c = proven(&facts);
        let only_b = identity((7, 100), &[entry('r', 21, 102, LEAF_B)]);
        let kept = EntryFacts {
            still_published: [20].into(),
            ..EntryFacts::default()
        };
        assert_eq!(c.clone().reconfirm("pub", &only_b, &kept), Ok(()));
        assert!(
            c.clone()
                .reconfirm("pub", &only_b, &EntryFacts::default())
                .is_err()
        );
        // A schema entry not read because no tree member is left in its
        // schema: the same.
        let mut facts = published_by_leaf();
        facts.publication.as_mut().unwrap().identity = identity(
            (7, 100),
            &[entry('r', 21, 102, LEAF_B), entry('n', 30, 105, 2300)],
        );
        let c = proven(&facts);
        let kept = EntryFacts {
            still_published: [30].into(),
            ..EntryFacts::default()
        };
        assert_eq!(c.clone().reconfirm("pub", &only_b, &kept), Ok(()));
        let problem = c
            .clone()
            .reconfirm("pub", &only_b, &EntryFacts::default())
            .unwrap_err();
        assert!(problem.to_string().contains("schema entry 30"), "{problem}");
    }

    /// A partition created since the last proof, made UNLOGGED, loaded and
    /// made LOGGED again: not in the baseline, so no file to compare, but its
    /// file is no longer its first.
    #[test]
    fn a_new_partition_rewritten_since_its_creation_is_a_change() {
        let c = proven(&partitioned(vec![(ROOT, t("outbox"))], false));
        let found = EntryFacts {
            rewritten_since_created: vec![t("outbox_2027_01")],
            ..EntryFacts::default()
        };
        let problem = c
            .clone()
            .reconfirm("pub", &PublicationIdentity::default(), &found)
            .expect_err("rewritten");
        assert!(problem.to_string().contains("outbox_2027_01"), "{problem}");
    }

    /// C3: a leaf added to a leaf-list publication after rows were written
    /// to it: those rows were never sent.
    #[test]
    fn a_partition_published_after_rows_were_written_to_it_is_a_change() {
        let mut c = proven(&published_by_leaf());
        let late = EntryFacts {
            filled_before_published: vec![t("outbox_2027_01")],
            ..EntryFacts::default()
        };
        let now = identity((0, 0), &[entry('r', 22, 300, 300)]);
        let problem = c
            .reconfirm("pub", &now, &late)
            .expect_err("rows before the entry");
        assert!(
            matches!(&problem, CoverageProblem::PublicationChanged { changed, .. }
                if changed.contains("outbox_2027_01") && changed.contains("already holds rows")),
            "{problem}"
        );
        assert_eq!(c.reconfirm("pub", &now, &EntryFacts::default()), Ok(()));
    }

    /// C4: a partition (or the table) whose inserts never reach WAL is
    /// refused by name, through the root or by leaf list alike.
    #[test]
    fn partitions_outside_wal_are_refused_by_name() {
        for published in [
            vec![(ROOT, t("outbox"))],
            vec![(LEAF_A, t("outbox_2026_11")), (LEAF_B, t("outbox_2026_12"))],
        ] {
            for (relkind, persistence, why) in [
                ('r', 'u', "UNLOGGED"),
                ('r', 't', "a temporary table"),
                ('f', 'p', "a foreign table"),
            ] {
                let mut facts = partitioned(published.clone(), true);
                let leaf_b = &mut facts.table.as_mut().unwrap().partitions[1];
                leaf_b.relkind = relkind;
                leaf_b.persistence = persistence;
                let problems = judge(&facts, &t("outbox"), "pub", &mapped()).expect_err(why);
                assert_eq!(
                    problems,
                    vec![CoverageProblem::NotInWal {
                        table: t("outbox_2026_12"),
                        root: t("outbox"),
                        why: why.to_owned(),
                    }]
                );
                let text = problems[0].to_string();
                assert!(
                    text.contains("outbox_2026_12") && text.contains(why),
                    "{text}"
                );
            }
        }
        let mut facts = partitioned(vec![(ROOT, t("outbox"))], true);
        facts.table.as_mut().unwrap().partitions[0].persistence = 'u';
        let fix = judge(&facts, &t("outbox"), "pub", &mapped()).unwrap_err()[0].fix();
        assert!(
            fix.starts_with("ALTER TABLE \"public\".\"outbox_2026_11\" SET LOGGED"),
            "{fix}"
        );
    }

    /// A partition made UNLOGGED for a bulk load and LOGGED again between two
    /// proofs (or while the connector was stopped) looks as before, but for
    /// its new file: rows loaded in between never reached WAL.
    #[test]
    fn a_partition_rewritten_between_proofs_is_a_change() {
        let mut facts = partitioned(vec![(ROOT, t("outbox"))], false);
        let mut before = identity((7, 100), &[entry('r', 20, 101, ROOT)]);
        before.storage = BTreeMap::from([(LEAF_A, LEAF_A), (LEAF_B, LEAF_B)]);
        facts.publication.as_mut().unwrap().identity = before.clone();
        let c = proven(&facts);
        let none = EntryFacts::default();
        assert_eq!(c.clone().reconfirm("pub", &before, &none), Ok(()));
        let mut rewritten = before.clone();
        rewritten.storage.insert(LEAF_B, 90_000);
        let problem = c
            .clone()
            .reconfirm("pub", &rewritten, &none)
            .expect_err("a new file");
        assert!(
            matches!(&problem, CoverageProblem::PublicationChanged { changed, .. }
                if changed.contains("outbox_2026_12") && changed.contains("SET UNLOGGED")),
            "{problem}"
        );
        // A leaf gone from the tree (dropped, detached) is not a rewrite.
        let mut gone = before;
        gone.storage.remove(&LEAF_A);
        assert_eq!(c.clone().reconfirm("pub", &gone, &none), Ok(()));
    }

    /// A leaf-list publication: a partition created and not yet added is no
    /// problem while it never held a row; once it does, it is.
    #[test]
    fn an_unpublished_leaf_is_refused_once_it_held_a_row() {
        let mut facts = partitioned(vec![(LEAF_A, t("outbox_2026_11"))], false);
        facts.table.as_mut().unwrap().partitions[1].holds_rows = false;
        proven(&facts);
        facts.table.as_mut().unwrap().partitions[1].holds_rows = true;
        let problems = judge(&facts, &t("outbox"), "pub", &mapped()).expect_err("rows in it");
        assert!(
            matches!(&problems[..], [CoverageProblem::NotPublished { missing_leaves, .. }]
                if missing_leaves == &vec![t("outbox_2026_12")]),
            "{problems:?}"
        );
    }

    /// C1: pgoutput sends a leaf under its own name whenever no ancestor is
    /// in the publication, whatever publish_via_partition_root says: leaves
    /// listed with it are the outbox.
    #[test]
    fn leaves_listed_through_the_root_are_the_outbox() {
        let mut c = proven(&partitioned(
            vec![(LEAF_A, t("outbox_2026_11")), (LEAF_B, t("outbox_2026_12"))],
            true,
        ));
        let leaf = relation(LEAF_A, "outbox_2026_11", &OUTBOX_COLS);
        assert_eq!(c.classify(&leaf), Known::Is(RelationKind::Outbox));
        // A partition created since, still in the tree: the outbox too.
        let new_leaf = relation(300, "outbox_2027_01", &OUTBOX_COLS);
        assert_eq!(
            look_up_now(&mut c, &new_leaf, Lsn::new(1), true),
            Ok(RelationKind::Outbox)
        );
    }

    /// Audit F15: with the root published through the root, a leaf of the
    /// outbox known from start-up that arrives under its own name and is no
    /// partition now was detached (and is published on its own, e.g. FOR ALL
    /// TABLES): its rows are not outbox rows. One still inside the outbox is
    /// the outbox: its change may predate a publish_via_partition_root flip
    /// (the flip is a break, but the backlog before its window is classified
    /// here).
    #[test]
    fn through_the_root_a_leaf_under_its_own_name_is_not_the_outbox() {
        let mut facts = partitioned(vec![(ROOT, t("outbox"))], true);
        facts.publication.as_mut().unwrap().all_tables = true;
        let mut c = proven(&facts);
        let detached = relation(LEAF_A, "outbox_2026_11", &OUTBOX_COLS);
        assert_eq!(c.classify(&detached), Known::LookUp);
        assert_eq!(
            resolve_now(&mut c, &detached, Lsn::new(3), true, false),
            Ok(RelationKind::Outbox)
        );
        assert_eq!(
            resolve_now(&mut c, &detached, Lsn::new(3), false, false),
            Ok(RelationKind::Other)
        );
        assert_eq!(
            c.resolve(&detached, Lsn::new(3), None),
            Ok(RelationKind::Other)
        );
        // The root itself, and an ancestor that could carry outbox rows, are
        // decided as before.
        assert_eq!(
            c.classify(&relation(ROOT, "outbox", &OUTBOX_COLS)),
            Known::Is(RelationKind::Outbox)
        );
        let parent = relation(600, "all_events", &OUTBOX_COLS);
        assert!(resolve_now(&mut c, &parent, Lsn::new(3), false, true).is_err());
    }

    #[test]
    fn plain_names_quote_only_where_needed() {
        assert_eq!(plain(&t("outbox_events")), "public.outbox_events");
        assert_eq!(plain(&QualifiedTable::new("My", "t")), "\"My\".t");
    }
}
