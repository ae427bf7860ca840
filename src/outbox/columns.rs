//! The columns the mapping reads, once: each with the configuration key that
//! names it and its role, which says which column types carry what the
//! record needs. Start-up's coverage proof and `outbox-cdc check` both read
//! this list.

use super::settings::{ConfigError, OutboxSettings, TraceColumn};

/// What a mapped column is used for. The mapper takes every value in
/// PostgreSQL's text form; a role names the types whose text form means what
/// the record needs (a payload of type bytea would arrive as `\x...` hex).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnRole {
    /// event_id, aggregate_id: text-like, uuid or an integer.
    Id,
    /// aggregate_type, event_type, trace context: text-like (they become
    /// topic names and headers).
    Name,
    /// payload: JSON or text.
    Payload,
    /// aggregate_sequence, schema_version: an integer.
    Integer,
    /// extra header and placement columns: any type.
    Any,
}

const TEXT_TYPES: [&str; 5] = ["text", "varchar", "bpchar", "name", "citext"];
const INT_TYPES: [&str; 3] = ["int2", "int4", "int8"];

impl ColumnRole {
    /// Whether a column whose (base) type is `base_type` (`pg_type.typname`) fits.
    pub fn accepts(self, base_type: &str) -> bool {
        let text = TEXT_TYPES.contains(&base_type);
        let int = INT_TYPES.contains(&base_type);
        match self {
            ColumnRole::Id => text || int || base_type == "uuid",
            ColumnRole::Name => text,
            ColumnRole::Payload => text || base_type == "jsonb" || base_type == "json",
            ColumnRole::Integer => int,
            ColumnRole::Any => true,
        }
    }

    /// The types it accepts, for messages.
    pub fn allowed(self) -> &'static str {
        match self {
            ColumnRole::Id => "text, varchar, char, uuid or an integer type",
            ColumnRole::Name => "text, varchar or char",
            ColumnRole::Payload => "jsonb, json, text or varchar",
            ColumnRole::Integer => "smallint, integer or bigint",
            ColumnRole::Any => "any type",
        }
    }

    /// The type a fix should create or convert to.
    pub fn fix_type(self) -> &'static str {
        match self {
            ColumnRole::Id | ColumnRole::Name | ColumnRole::Any => "text",
            ColumnRole::Payload => "jsonb",
            ColumnRole::Integer => "bigint",
        }
    }
}

/// A column the mapping reads, with the configuration key that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedColumn {
    pub key: String,
    pub column: String,
    pub role: ColumnRole,
}

impl OutboxSettings {
    /// Every column the mapping reads, in this order: the standard columns
    /// (optional ones when configured), the extra header columns, the
    /// placement columns, the trace context columns set explicitly (the
    /// default ones are read only when the table has them). A column may
    /// appear under several keys.
    pub fn mapped_columns(&self) -> Result<Vec<MappedColumn>, ConfigError> {
        let c = self.column_names()?;
        let standard = [
            ("outbox.columns.event_id", Some(c.event_id), ColumnRole::Id),
            (
                "outbox.columns.aggregate_type",
                Some(c.aggregate_type),
                ColumnRole::Name,
            ),
            (
                "outbox.columns.aggregate_id",
                Some(c.aggregate_id),
                ColumnRole::Id,
            ),
            (
                "outbox.columns.aggregate_sequence",
                c.aggregate_sequence,
                ColumnRole::Integer,
            ),
            (
                "outbox.columns.event_type",
                Some(c.event_type),
                ColumnRole::Name,
            ),
            (
                "outbox.columns.schema_version",
                c.schema_version,
                ColumnRole::Integer,
            ),
            (
                "outbox.columns.payload",
                Some(c.payload),
                ColumnRole::Payload,
            ),
        ];
        let extra = self
            .extra_headers
            .iter()
            .cloned()
            .map(|column| ("outbox.extra_headers", Some(column), ColumnRole::Any));
        let placed = self
            .placement_columns()?
            .into_iter()
            .map(|column| ("outbox.additional_placement", Some(column), ColumnRole::Any));
        let (parent, state) = self.trace_columns()?;
        let trace = [parent, state].into_iter().filter_map(|t| match t {
            TraceColumn::Required { key, column } => Some((key, Some(column), ColumnRole::Name)),
            _ => None,
        });
        Ok(standard
            .into_iter()
            .chain(extra)
            .chain(placed)
            .chain(trace)
            .filter_map(|(key, column, role)| {
                column.map(|column| MappedColumn {
                    key: key.to_owned(),
                    column,
                    role,
                })
            })
            .collect())
    }
}
