//! The outbox table's name as the catalog spells it: below `settings`,
//! which resolves it, and the sections that read it (`cloudevents`).

use std::fmt;

use crate::pg::quote_ident;

/// A table name resolved the way PostgreSQL resolves it: exact catalog spellings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    /// `pg_namespace.nspname`.
    pub schema: String,
    /// `pg_class.relname`.
    pub name: String,
}

impl TableName {
    /// Both parts double-quoted for use in SQL text.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}
