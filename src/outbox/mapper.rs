//! From decoded pgoutput rows and logical messages to [`OutboxEvent`]s.
//!
//! The mapper is built once from the settings and never changes. Column
//! positions are resolved once per Relation message ([`OutboxMapper::bind`]),
//! not per row. The caller keeps the bindings, keyed by relation OID, in a
//! [`RelationBindings`]: PostgreSQL sends a Relation message before the first
//! change of a relation in a stream and again after its definition changed
//! (e.g. ALTER TABLE ... ADD COLUMN), so every Relation message replaces the
//! binding of its OID.
//!
//! The record of a row: key = aggregate id, value = the payload column's text
//! exactly as PostgreSQL sent it (a slice of the received buffer, not a copy),
//! timestamp = commit time, headers in this order: `event_id`, `event_type`,
//! `aggregate_type`, `aggregate_id`, `aggregate_sequence` and `schema_version`
//! (each omitted when the layout has no such column), `lsn`, then the extra
//! header columns (omitted when NULL), then `traceparent` and `tracestate`
//! when the row carries a valid trace context ([`super::trace`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::cloudevents::{CloudEvents, EventAttributes};
use super::event::OutboxEvent;
use super::placement::{PayloadFormat, Placement, TopicRoute, shape_value};
use super::settings::{
    ColumnNames, ConfigError, OutboxSettings, StandardHeaders, TableName, TraceColumn,
};
use super::topic::TopicTemplate;
use super::trace::{self, TraceDropped};
use crate::Disposition;
use crate::pg::{Lsn, PgTimestamp};
use crate::pgoutput::{ColumnValue, LogicalMessage, Relation, TupleData};

/// Where in the stream a change sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeContext {
    /// WAL position of the change (the XLogData start of the Insert or Message);
    /// published as the `lsn` header.
    pub lsn: Lsn,
    /// Commit time of the enclosing transaction (from its Begin message).
    pub commit_time: PgTimestamp,
}

/// The row (or message) a mapping error is about, with what was known of it.
/// Aggregate identity is there so a dead-letter policy can park the aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowRef {
    /// `schema.table`, or `logical message "prefix"`.
    pub source: String,
    pub lsn: Lsn,
    pub event_id: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
}

impl fmt::Display for RowRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at LSN {}", self.source, self.lsn)?;
        match &self.event_id {
            Some(id) => write!(f, ", event_id {id}"),
            None => f.write_str(", event_id unknown"),
        }
    }
}

/// Why a row or message could not become an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("{at}: column {column:?} is NULL")]
    NullColumn { column: String, at: Box<RowRef> },
    #[error(
        "table {table} has no column {column:?}: add it, or map another column with outbox.columns / outbox.extra_headers"
    )]
    MissingColumn { table: String, column: String },
    #[error("{at}: column {column:?} is an unchanged TOAST value, its content was not sent")]
    UnchangedToast { column: String, at: Box<RowRef> },
    #[error("{at}: column {column:?} arrived in binary format; the stream must use text format")]
    BinaryValue { column: String, at: Box<RowRef> },
    #[error("{at}: column {column:?} is not valid UTF-8")]
    InvalidUtf8 { column: String, at: Box<RowRef> },
    #[error("{at}: topic {topic:?} is not a legal Kafka topic name: {reason}")]
    InvalidTopic {
        topic: String,
        reason: String,
        at: Box<RowRef>,
    },
    #[error("{at}: the record has {bytes} bytes, more than outbox.max_record_bytes = {max}")]
    TooLarge {
        bytes: usize,
        max: usize,
        at: Box<RowRef>,
    },
    #[error("{at}: bad event envelope: {reason}")]
    BadEnvelope { reason: String, at: Box<RowRef> },
    #[error(
        "{at}: column {column:?} (outbox.additional_placement partition) holds {value:?}, not a partition number (0, 1, ...)"
    )]
    BadPartition {
        column: String,
        value: String,
        at: Box<RowRef>,
    },
    #[error("{at}: the row has {got} columns but its Relation message announced {expected}")]
    ColumnCount {
        expected: usize,
        got: usize,
        at: Box<RowRef>,
    },
    #[error(
        "change at LSN {lsn} refers to relation OID {oid}, for which no Relation message was seen"
    )]
    UnknownRelation { oid: u32, lsn: Lsn },
    #[error(
        "table {table}: the payload column {column:?} has type {type_name}, whose text form is not the stored bytes (bytea arrives as \\x and hex digits); convert it to jsonb (e.g. ALTER TABLE {table} ALTER COLUMN {column} TYPE jsonb USING convert_from({column}, 'UTF8')::jsonb) or text, or map another column with outbox.columns.payload"
    )]
    PayloadType {
        table: String,
        column: String,
        type_name: &'static str,
    },
}

impl MapError {
    /// `RecordRefused` when the failure belongs to one row's content, so the
    /// poison policy (`fail` or `dead-letter`) decides. The others concern the
    /// table or the stream itself and would hit every row alike, so they
    /// `Stop`: a missing column (fix the table or `outbox.columns`, then
    /// restart; the slot still holds the rows), binary-format values (a stream
    /// option), a row that disagrees with its Relation message or an
    /// unannounced relation (protocol inconsistency).
    pub fn disposition(&self) -> Disposition {
        match self {
            MapError::NullColumn { .. }
            | MapError::UnchangedToast { .. }
            | MapError::InvalidUtf8 { .. }
            | MapError::InvalidTopic { .. }
            | MapError::TooLarge { .. }
            | MapError::BadEnvelope { .. }
            | MapError::BadPartition { .. } => Disposition::RecordRefused,
            MapError::MissingColumn { .. }
            | MapError::BinaryValue { .. }
            | MapError::ColumnCount { .. }
            | MapError::UnknownRelation { .. }
            | MapError::PayloadType { .. } => Disposition::Stop,
        }
    }

    /// The event id of the row, when the error happened after it was read.
    pub fn event_id(&self) -> Option<&str> {
        self.row().and_then(|r| r.event_id.as_deref())
    }

    /// `(aggregate_type, aggregate_id)` of the row, when both were read: what a
    /// dead-letter policy parks.
    pub fn aggregate(&self) -> Option<(&str, &str)> {
        let r = self.row()?;
        Some((r.aggregate_type.as_deref()?, r.aggregate_id.as_deref()?))
    }

    /// The row the error is about, when it is about one row.
    pub fn row(&self) -> Option<&RowRef> {
        match self {
            MapError::NullColumn { at, .. }
            | MapError::UnchangedToast { at, .. }
            | MapError::BinaryValue { at, .. }
            | MapError::InvalidUtf8 { at, .. }
            | MapError::InvalidTopic { at, .. }
            | MapError::TooLarge { at, .. }
            | MapError::BadEnvelope { at, .. }
            | MapError::BadPartition { at, .. }
            | MapError::ColumnCount { at, .. } => Some(at.as_ref()),
            MapError::MissingColumn { .. }
            | MapError::UnknownRelation { .. }
            | MapError::PayloadType { .. } => None,
        }
    }
}

const H_EVENT_ID: &str = "event_id";
const H_EVENT_TYPE: &str = "event_type";
const H_AGGREGATE_TYPE: &str = "aggregate_type";
const H_AGGREGATE_ID: &str = "aggregate_id";
const H_AGGREGATE_SEQUENCE: &str = "aggregate_sequence";
const H_SCHEMA_VERSION: &str = "schema_version";
const H_LSN: &str = "lsn";
/// Debezium's Outbox Event Router header for the event id (`debezium` layout).
const H_DEBEZIUM_ID: &str = "id";

/// Turns outbox rows and messages into events; built once from the settings.
#[derive(Debug, Clone)]
pub struct OutboxMapper {
    table: TableName,
    qualified: String,
    columns: ColumnNames,
    /// (header name, column) of the extra headers.
    extra_headers: Vec<(String, String)>,
    /// (member name, column) of the value's envelope; empty: no envelope.
    envelope: Vec<(String, String)>,
    /// The column whose integer value is the record's partition.
    partition: Option<String>,
    payload_format: PayloadFormat,
    /// `[outbox.route]`, which replaces the topic template when set.
    route: Option<TopicRoute>,
    topic: TopicTemplate,
    /// `None` when logical messages are not events.
    message_prefix: Option<String>,
    max_record_bytes: usize,
    cloudevents: Option<CloudEvents>,
    /// Which standard headers `outbox.headers` lists (`event_id` always).
    standard_headers: StandardHeaders,
    /// The `debezium` layout also writes the event id as `id`, the header
    /// Debezium's Outbox Event Router sets, so its consumers read it unchanged.
    id_header: bool,
    /// Where `traceparent` and `tracestate` come from.
    trace: (TraceColumn, TraceColumn),
}

/// The values of one event's standard headers.
struct Standard<'a> {
    event_id: &'a Bytes,
    event_type: &'a Bytes,
    aggregate_type: &'a Bytes,
    aggregate_id: &'a Bytes,
    sequence: Option<Bytes>,
    schema_version: Option<Bytes>,
    lsn: Lsn,
}

/// Column positions of one version of the outbox table (one Relation message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundRelation {
    oid: u32,
    width: usize,
    event_id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    aggregate_sequence: Option<usize>,
    event_type: usize,
    schema_version: Option<usize>,
    payload: usize,
    /// The payload column is `json` or `jsonb`.
    payload_is_json: bool,
    /// (header name, column, position).
    extra: Vec<(String, String, usize)>,
    /// (envelope member, column, position).
    envelope: Vec<(String, String, usize)>,
    /// (column, position) of the partition column.
    partition: Option<(String, usize)>,
    /// Positions of the `traceparent` and `tracestate` columns, when read.
    traceparent: Option<usize>,
    tracestate: Option<usize>,
}

impl BoundRelation {
    /// The relation OID this binding belongs to.
    pub fn oid(&self) -> u32 {
        self.oid
    }
}

/// The row being mapped, as far as it is known, for error messages.
struct Partial<'a> {
    source: &'a str,
    lsn: Lsn,
    event_id: Option<&'a str>,
    aggregate_type: Option<&'a str>,
    aggregate_id: Option<&'a str>,
}

impl Partial<'_> {
    fn at(&self) -> Box<RowRef> {
        Box::new(RowRef {
            source: self.source.to_owned(),
            lsn: self.lsn,
            event_id: self.event_id.map(str::to_owned),
            aggregate_type: self.aggregate_type.map(str::to_owned),
            aggregate_id: self.aggregate_id.map(str::to_owned),
        })
    }

    /// The text bytes of column `idx`, which must be non-NULL.
    fn text<'t>(
        &self,
        tuple: &'t TupleData,
        idx: usize,
        column: &str,
    ) -> Result<&'t Bytes, MapError> {
        let column = || column.to_owned();
        match tuple.columns.get(idx) {
            Some(ColumnValue::Text(b)) => Ok(b),
            Some(ColumnValue::Null) | None => Err(MapError::NullColumn {
                column: column(),
                at: self.at(),
            }),
            Some(ColumnValue::UnchangedToast) => Err(MapError::UnchangedToast {
                column: column(),
                at: self.at(),
            }),
            Some(ColumnValue::Binary(_)) => Err(MapError::BinaryValue {
                column: column(),
                at: self.at(),
            }),
        }
    }

    fn utf8<'t>(&self, bytes: &'t Bytes, column: &str) -> Result<&'t str, MapError> {
        std::str::from_utf8(bytes).map_err(|_| MapError::InvalidUtf8 {
            column: column.to_owned(),
            at: self.at(),
        })
    }
}

/// The JSON content of a logical decoding message that is an event. The
/// payload is borrowed unparsed from the message (serde_json checks that it is
/// valid JSON while skipping it) so its bytes are published as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    event_id: String,
    aggregate_type: String,
    aggregate_id: String,
    #[serde(default)]
    aggregate_sequence: Option<i64>,
    event_type: String,
    #[serde(default)]
    schema_version: Option<i32>,
    #[serde(borrow)]
    payload: &'a RawValue,
}

/// PostgreSQL's type OID of `bytea` (pg_type.dat), as sent in Relation messages.
const BYTEA_OID: u32 = 17;
/// Type OIDs of `json` and `jsonb` (pg_type.dat).
const JSON_OID: u32 = 114;
const JSONB_OID: u32 = 3802;

impl OutboxMapper {
    /// Validates the settings and prepares everything that does not depend on a row.
    pub fn new(settings: &OutboxSettings) -> Result<OutboxMapper, ConfigError> {
        settings.validate()?;
        let table = settings.table_name()?;
        Ok(OutboxMapper {
            qualified: table.to_string(),
            table,
            columns: settings.column_names()?,
            extra_headers: settings.header_columns()?,
            envelope: settings
                .placements()?
                .into_iter()
                .filter_map(|p| match p {
                    Placement::Envelope { column, name } => Some((name, column)),
                    _ => None,
                })
                .collect(),
            partition: settings.placements()?.into_iter().find_map(|p| match p {
                Placement::Partition { column } => Some(column),
                _ => None,
            }),
            payload_format: settings.payload_format,
            route: settings.route.compile()?,
            topic: settings.topic_template()?,
            message_prefix: (!settings.message_prefix.is_empty())
                .then(|| settings.message_prefix.clone()),
            max_record_bytes: settings.max_record_bytes,
            cloudevents: settings.cloud_events()?,
            id_header: settings.layout == super::settings::Layout::Debezium,
            standard_headers: settings.standard_headers()?,
            trace: settings.trace_columns()?,
        })
    }

    /// Whether `rel` is the configured outbox table.
    pub fn matches(&self, rel: &Relation) -> bool {
        rel.namespace == self.table.schema && rel.name == self.table.name
    }

    /// Resolves the configured columns in `rel` (the outbox table).
    pub fn bind(&self, rel: &Relation) -> Result<BoundRelation, MapError> {
        let find = |column: &str| {
            rel.column_index(column)
                .ok_or_else(|| MapError::MissingColumn {
                    table: rel.qualified_name(),
                    column: column.to_owned(),
                })
        };
        let find_opt = |column: &Option<String>| column.as_deref().map(find).transpose();
        let find_trace = |trace: &TraceColumn| match trace {
            TraceColumn::Off => Ok(None),
            TraceColumn::IfPresent(column) => Ok(rel.column_index(column)),
            TraceColumn::Required { column, .. } => find(column).map(Some),
        };
        let c = &self.columns;
        let payload = find(&c.payload)?;
        // A domain over bytea arrives with the domain's OID; `check` resolves
        // domains to their base type and refuses those too.
        if rel.columns[payload].type_oid == BYTEA_OID {
            return Err(MapError::PayloadType {
                table: rel.qualified_name(),
                column: c.payload.clone(),
                type_name: "bytea",
            });
        }
        Ok(BoundRelation {
            oid: rel.oid,
            width: rel.columns.len(),
            event_id: find(&c.event_id)?,
            aggregate_type: find(&c.aggregate_type)?,
            aggregate_id: find(&c.aggregate_id)?,
            aggregate_sequence: find_opt(&c.aggregate_sequence)?,
            event_type: find(&c.event_type)?,
            schema_version: find_opt(&c.schema_version)?,
            payload,
            payload_is_json: matches!(rel.columns[payload].type_oid, JSON_OID | JSONB_OID),
            extra: self
                .extra_headers
                .iter()
                .map(|(name, column)| Ok((name.clone(), column.clone(), find(column)?)))
                .collect::<Result<_, MapError>>()?,
            envelope: self
                .envelope
                .iter()
                .map(|(name, column)| Ok((name.clone(), column.clone(), find(column)?)))
                .collect::<Result<_, MapError>>()?,
            partition: self
                .partition
                .as_ref()
                .map(|column| Ok((column.clone(), find(column)?)))
                .transpose()?,
            traceparent: find_trace(&self.trace.0)?,
            tracestate: find_trace(&self.trace.1)?,
        })
    }

    /// Maps one inserted row of the outbox table.
    pub fn map_insert(
        &self,
        bound: &BoundRelation,
        tuple: &TupleData,
        ctx: &ChangeContext,
    ) -> Result<OutboxEvent, MapError> {
        let c = &self.columns;
        let mut row = Partial {
            source: &self.qualified,
            lsn: ctx.lsn,
            event_id: None,
            aggregate_type: None,
            aggregate_id: None,
        };
        if tuple.columns.len() != bound.width {
            return Err(MapError::ColumnCount {
                expected: bound.width,
                got: tuple.columns.len(),
                at: row.at(),
            });
        }
        let event_id_b = row.text(tuple, bound.event_id, &c.event_id)?;
        let event_id = row.utf8(event_id_b, &c.event_id)?;
        row.event_id = Some(event_id);
        let aggregate_type_b = row.text(tuple, bound.aggregate_type, &c.aggregate_type)?;
        let aggregate_type = row.utf8(aggregate_type_b, &c.aggregate_type)?;
        row.aggregate_type = Some(aggregate_type);
        let aggregate_id_b = row.text(tuple, bound.aggregate_id, &c.aggregate_id)?;
        let aggregate_id = row.utf8(aggregate_id_b, &c.aggregate_id)?;
        row.aggregate_id = Some(aggregate_id);
        let event_type_b = row.text(tuple, bound.event_type, &c.event_type)?;
        let event_type = row.utf8(event_type_b, &c.event_type)?;
        let optional = |idx: Option<usize>, column: &Option<String>| match (idx, column) {
            (Some(i), Some(name)) => row.text(tuple, i, name).map(|b| Some(b.clone())),
            _ => Ok(None),
        };
        let sequence = optional(bound.aggregate_sequence, &c.aggregate_sequence)?;
        let sequence_number = sequence
            .as_ref()
            .and_then(|text| std::str::from_utf8(text).ok()?.parse().ok());
        let version = optional(bound.schema_version, &c.schema_version)?;
        let payload = row.text(tuple, bound.payload, &c.payload)?.clone();

        let mut headers = Vec::with_capacity(7 + bound.extra.len());
        self.push_standard(
            &mut headers,
            Standard {
                event_id: event_id_b,
                event_type: event_type_b,
                aggregate_type: aggregate_type_b,
                aggregate_id: aggregate_id_b,
                sequence,
                schema_version: version,
                lsn: ctx.lsn,
            },
        );
        for (name, column, idx) in &bound.extra {
            match tuple.columns.get(*idx) {
                Some(ColumnValue::Null) => {}
                _ => headers.push((
                    Cow::Owned(name.clone()),
                    row.text(tuple, *idx, column)?.clone(),
                )),
            }
        }
        let trace_dropped = push_trace(&mut headers, tuple, bound);
        let payload = self.shape_row_value(&row, tuple, bound, payload)?;
        let partition = match &bound.partition {
            Some((column, idx)) => Some(Self::partition_of(&row, tuple, column, *idx)?),
            None => None,
        };
        if let Some(ce) = &self.cloudevents {
            ce.append(
                &mut headers,
                EventAttributes {
                    id: event_id_b,
                    event_type: event_type_b,
                    aggregate_id: aggregate_id_b,
                    commit_time: ctx.commit_time,
                },
            );
        }

        let topic = self.render_topic(&row, aggregate_type, event_type)?;
        self.finish(
            &row,
            OutboxEvent {
                topic,
                key: aggregate_id_b.clone(),
                payload,
                headers,
                timestamp_ms: ctx.commit_time.unix_millis(),
                event_id: event_id.to_owned(),
                aggregate_type: aggregate_type.to_owned(),
                aggregate_id: aggregate_id.to_owned(),
                aggregate_sequence: sequence_number,
                lsn: ctx.lsn,
                partition,
                trace_dropped,
            },
        )
    }

    /// Whether `msg` carries the event prefix but was emitted
    /// non-transactionally: it looks like an event and can never be one.
    pub fn is_stray_event_message(&self, msg: &LogicalMessage) -> bool {
        !msg.transactional && self.message_prefix.as_deref() == Some(msg.prefix.as_str())
    }

    /// Maps a logical decoding message. `None` when messages are off
    /// (`message_prefix = ""`), when the prefix differs, and for
    /// non-transactional messages: those are sent at once, even when the
    /// emitting transaction later rolls back, so they cannot be events.
    ///
    /// The content is a JSON envelope, see docs/outbox-table.md. Its payload
    /// goes out as the bytes written in the message (a slice of it, not a
    /// copy), except that a JSON string is text and goes out unquoted and
    /// unescaped, as a `text` column would. Extra headers do not apply: a
    /// message has no columns.
    pub fn map_message(
        &self,
        msg: &LogicalMessage,
        ctx: &ChangeContext,
    ) -> Result<Option<OutboxEvent>, MapError> {
        match &self.message_prefix {
            Some(prefix) if msg.transactional && msg.prefix == *prefix => {}
            _ => return Ok(None),
        }
        let source = format!("logical message {:?}", msg.prefix);
        let mut row = Partial {
            source: &source,
            lsn: ctx.lsn,
            event_id: None,
            aggregate_type: None,
            aggregate_id: None,
        };
        let env: Envelope =
            serde_json::from_slice(&msg.content).map_err(|e| MapError::BadEnvelope {
                reason: e.to_string(),
                at: row.at(),
            })?;
        row.event_id = Some(&env.event_id);
        row.aggregate_type = Some(&env.aggregate_type);
        row.aggregate_id = Some(&env.aggregate_id);
        if env.event_id.is_empty() {
            return Err(MapError::BadEnvelope {
                reason: "\"event_id\" is empty".into(),
                at: row.at(),
            });
        }
        let raw = env.payload.get();
        let payload = match raw.as_bytes().first() {
            Some(b'n') => {
                return Err(MapError::BadEnvelope {
                    reason: "\"payload\" is null".into(),
                    at: row.at(),
                });
            }
            Some(b'"') => {
                let text: String =
                    serde_json::from_str(raw).map_err(|e| MapError::BadEnvelope {
                        reason: format!("\"payload\": {e}"),
                        at: row.at(),
                    })?;
                Bytes::from(text)
            }
            // The borrowed RawValue lies inside the message content.
            _ => msg.content.slice_ref(raw.as_bytes()),
        };
        // A message has no columns, so no envelope; the format still applies.
        let payload = shape_value(self.payload_format, &payload, false, &[]).map_err(|_| {
            MapError::BadEnvelope {
                reason: "\"payload\" is not UTF-8".into(),
                at: row.at(),
            }
        })?;

        let event_id_b = Bytes::copy_from_slice(env.event_id.as_bytes());
        let event_type_b = Bytes::copy_from_slice(env.event_type.as_bytes());
        let aggregate_id_b = Bytes::copy_from_slice(env.aggregate_id.as_bytes());
        let mut headers = Vec::with_capacity(7);
        self.push_standard(
            &mut headers,
            Standard {
                event_id: &event_id_b,
                event_type: &event_type_b,
                aggregate_type: &Bytes::copy_from_slice(env.aggregate_type.as_bytes()),
                aggregate_id: &aggregate_id_b,
                sequence: env.aggregate_sequence.map(|n| Bytes::from(n.to_string())),
                schema_version: env.schema_version.map(|v| Bytes::from(v.to_string())),
                lsn: ctx.lsn,
            },
        );
        if let Some(ce) = &self.cloudevents {
            ce.append(
                &mut headers,
                EventAttributes {
                    id: &event_id_b,
                    event_type: &event_type_b,
                    aggregate_id: &aggregate_id_b,
                    commit_time: ctx.commit_time,
                },
            );
        }

        let topic = self.render_topic(&row, &env.aggregate_type, &env.event_type)?;
        let event = OutboxEvent {
            topic,
            key: aggregate_id_b,
            payload,
            headers,
            timestamp_ms: ctx.commit_time.unix_millis(),
            event_id: env.event_id.clone(),
            aggregate_type: env.aggregate_type.clone(),
            aggregate_id: env.aggregate_id.clone(),
            aggregate_sequence: env.aggregate_sequence,
            lsn: ctx.lsn,
            partition: None,
            trace_dropped: TraceDropped::default(),
        };
        self.finish(&row, event).map(Some)
    }

    /// Whether logical decoding messages can be events (`message_prefix` set):
    /// the stream must then be started with pgoutput's `messages 'true'`.
    pub fn wants_messages(&self) -> bool {
        self.message_prefix.is_some()
    }

    /// The standard headers `outbox.headers` lists, in their fixed order;
    /// those not listed are not even formatted.
    fn push_standard(&self, headers: &mut Vec<(Cow<'static, str>, Bytes)>, v: Standard<'_>) {
        let on = &self.standard_headers;
        headers.push((Cow::Borrowed(H_EVENT_ID), v.event_id.clone()));
        if on.event_type {
            headers.push((Cow::Borrowed(H_EVENT_TYPE), v.event_type.clone()));
        }
        if on.aggregate_type {
            headers.push((Cow::Borrowed(H_AGGREGATE_TYPE), v.aggregate_type.clone()));
        }
        if on.aggregate_id {
            headers.push((Cow::Borrowed(H_AGGREGATE_ID), v.aggregate_id.clone()));
        }
        if let Some(seq) = v.sequence.filter(|_| on.aggregate_sequence) {
            headers.push((Cow::Borrowed(H_AGGREGATE_SEQUENCE), seq));
        }
        if let Some(version) = v.schema_version.filter(|_| on.schema_version) {
            headers.push((Cow::Borrowed(H_SCHEMA_VERSION), version));
        }
        if on.lsn {
            headers.push((Cow::Borrowed(H_LSN), lsn_text(v.lsn)));
        }
        if self.id_header {
            headers.push((Cow::Borrowed(H_DEBEZIUM_ID), v.event_id.clone()));
        }
    }

    /// The record value of a row: the payload, shaped by `payload_format`
    /// and the envelope placements.
    fn shape_row_value(
        &self,
        row: &Partial<'_>,
        tuple: &TupleData,
        bound: &BoundRelation,
        payload: Bytes,
    ) -> Result<Bytes, MapError> {
        if bound.envelope.is_empty() && self.payload_format == PayloadFormat::AsStored {
            return Ok(payload);
        }
        let mut fields = Vec::with_capacity(bound.envelope.len());
        for (name, column, idx) in &bound.envelope {
            let value = match tuple.columns.get(*idx) {
                Some(ColumnValue::Null) => None,
                _ => Some(&row.text(tuple, *idx, column)?[..]),
            };
            fields.push((name.as_str(), value));
        }
        shape_value(
            self.payload_format,
            &payload,
            bound.payload_is_json,
            &fields,
        )
        .map_err(|_| MapError::InvalidUtf8 {
            column: self.columns.payload.clone(),
            at: row.at(),
        })
    }

    /// The partition named by the partition column (Debezium's `partition` placement).
    fn partition_of(
        row: &Partial<'_>,
        tuple: &TupleData,
        column: &str,
        idx: usize,
    ) -> Result<i32, MapError> {
        let text = row.text(tuple, idx, column)?;
        std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .filter(|p| *p >= 0)
            .ok_or_else(|| MapError::BadPartition {
                column: column.to_owned(),
                value: String::from_utf8_lossy(text).into_owned(),
                at: row.at(),
            })
    }

    fn render_topic(
        &self,
        row: &Partial<'_>,
        aggregate_type: &str,
        event_type: &str,
    ) -> Result<String, MapError> {
        if let Some(route) = &self.route {
            let topic = route
                .topic(aggregate_type)
                .ok_or_else(|| MapError::InvalidTopic {
                    topic: String::new(),
                    reason: format!(
                        "outbox.route.regex {} does not match the aggregate type {aggregate_type:?}",
                        route.regex()
                    ),
                    at: row.at(),
                })?;
            return match super::topic::validate_topic_name(&topic) {
                Ok(()) => Ok(topic),
                Err(e) => Err(MapError::InvalidTopic {
                    topic,
                    reason: e.to_string(),
                    at: row.at(),
                }),
            };
        }
        self.topic
            .render(aggregate_type, event_type)
            .map_err(|(topic, e)| MapError::InvalidTopic {
                topic,
                reason: e.to_string(),
                at: row.at(),
            })
    }

    fn finish(&self, row: &Partial<'_>, event: OutboxEvent) -> Result<OutboxEvent, MapError> {
        let bytes = event.wire_size();
        if bytes > self.max_record_bytes {
            return Err(MapError::TooLarge {
                bytes,
                max: self.max_record_bytes,
                at: row.at(),
            });
        }
        Ok(event)
    }
}

/// What a relation OID is to the mapper.
#[derive(Debug, Clone)]
enum Binding {
    /// Another table of the publication: its changes are not events.
    Other,
    Outbox(BoundRelation),
    /// The outbox table, but its columns do not fit the settings; every row errs.
    Unusable(MapError),
}

/// The caller-side cache of bindings, keyed by relation OID.
///
/// Every Relation message goes through [`RelationBindings::observe`]; every
/// Insert through [`RelationBindings::map_insert`]. A failed binding is kept,
/// so rows of a table that cannot be mapped fail rather than vanish.
#[derive(Debug, Clone, Default)]
pub struct RelationBindings {
    by_oid: HashMap<u32, Binding>,
}

impl RelationBindings {
    pub fn new() -> RelationBindings {
        RelationBindings::default()
    }

    /// Records (or replaces) the binding for `rel`. `Ok(true)`: `rel` is the
    /// outbox table and is bound; `Ok(false)`: another table.
    pub fn observe(&mut self, mapper: &OutboxMapper, rel: &Relation) -> Result<bool, MapError> {
        if !mapper.matches(rel) {
            self.by_oid.insert(rel.oid, Binding::Other);
            return Ok(false);
        }
        match mapper.bind(rel) {
            Ok(bound) => {
                self.by_oid.insert(rel.oid, Binding::Outbox(bound));
                Ok(true)
            }
            Err(e) => {
                self.by_oid.insert(rel.oid, Binding::Unusable(e.clone()));
                Err(e)
            }
        }
    }

    /// The binding of `oid` when it is the (usable) outbox table.
    pub fn get(&self, oid: u32) -> Option<&BoundRelation> {
        match self.by_oid.get(&oid) {
            Some(Binding::Outbox(b)) => Some(b),
            _ => None,
        }
    }

    /// Maps an insert into relation `oid`: `None` for other tables.
    pub fn map_insert(
        &self,
        mapper: &OutboxMapper,
        oid: u32,
        tuple: &TupleData,
        ctx: &ChangeContext,
    ) -> Result<Option<OutboxEvent>, MapError> {
        match self.by_oid.get(&oid) {
            Some(Binding::Outbox(bound)) => mapper.map_insert(bound, tuple, ctx).map(Some),
            Some(Binding::Other) => Ok(None),
            Some(Binding::Unusable(e)) => Err(e.clone()),
            None => Err(MapError::UnknownRelation { oid, lsn: ctx.lsn }),
        }
    }
}

/// Appends the row's trace context headers: a valid `traceparent`, then a
/// plausible `tracestate` with it. NULL or `''` is no value; any other value
/// that cannot go out is left out and reported, never an error: the event
/// itself is good.
fn push_trace(
    headers: &mut Vec<(Cow<'static, str>, Bytes)>,
    tuple: &TupleData,
    bound: &BoundRelation,
) -> TraceDropped {
    /// `None`: no value; `Some(None)`: a value that is not text.
    fn value(tuple: &TupleData, idx: Option<usize>) -> Option<Option<&Bytes>> {
        match tuple.columns.get(idx?)? {
            ColumnValue::Null => None,
            ColumnValue::Text(b) if b.is_empty() => None,
            ColumnValue::Text(b) => Some(Some(b)),
            ColumnValue::UnchangedToast | ColumnValue::Binary(_) => Some(None),
        }
    }
    let mut dropped = TraceDropped::default();
    let parent = match value(tuple, bound.traceparent) {
        None => false,
        Some(Some(b)) if trace::valid_traceparent(b) => {
            headers.push((Cow::Borrowed(trace::TRACEPARENT), b.clone()));
            true
        }
        Some(_) => {
            dropped.traceparent = true;
            false
        }
    };
    match value(tuple, bound.tracestate) {
        None => {}
        Some(Some(b)) if parent && trace::plausible_tracestate(b) => {
            headers.push((Cow::Borrowed(trace::TRACESTATE), b.clone()));
        }
        Some(_) => dropped.tracestate = true,
    }
    dropped
}

/// The `lsn` header: `X/Y` in upper-case hexadecimal without leading zeros,
/// exactly as [`Lsn`]'s `Display`, written without the formatting machinery
/// (it runs once per event).
fn lsn_text(lsn: Lsn) -> Bytes {
    fn push_hex(out: &mut [u8; 17], mut at: usize, half: u32) -> usize {
        const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
        let digits = ((32 - half.leading_zeros()).div_ceil(4)).max(1);
        for i in (0..digits).rev() {
            out[at] = DIGITS[((half >> (4 * i)) & 0xF) as usize];
            at += 1;
        }
        at
    }
    let raw = lsn.as_u64();
    let mut out = [0u8; 17];
    let at = push_hex(&mut out, 0, (raw >> 32) as u32);
    out[at] = b'/';
    let len = push_hex(&mut out, at + 1, raw as u32);
    Bytes::copy_from_slice(&out[..len])
}

/// The columns of the outbox table `migrations/` create, in order, without the
/// optional trace context columns (`traceparent`, `tracestate`): for unit
/// tests.
#[cfg(test)]
pub(crate) const SEED_COLS: [&str; 8] = [
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "aggregate_sequence",
    "event_type",
    "schema_version",
    "payload",
    "occurred_at",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::settings::Layout;

    #[test]
    fn lsn_header_matches_lsn_display() {
        for raw in [
            0,
            1,
            0xF,
            0x10,
            0x1_0000_0000,
            0x16_B374_D848,
            0xFFFF_FFFF,
            0x0000_0001_0000_000A,
            u64::MAX,
        ] {
            let lsn = Lsn::new(raw);
            assert_eq!(lsn_text(lsn), Bytes::from(lsn.to_string()), "{raw:#x}");
        }
    }

    const UUID: &str = "0b7f1c1e-3d2a-4c55-9a8e-6f0d2b1c9e01";

    fn rel(oid: u32, namespace: &str, name: &str, cols: &[&str]) -> Relation {
        Relation::of_text(oid, namespace, name, cols)
    }

    fn seed_rel() -> Relation {
        rel(16400, "public", "outbox_events", &SEED_COLS)
    }

    fn text(s: &str) -> ColumnValue {
        ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn seed_row() -> TupleData {
        TupleData {
            columns: vec![
                text(UUID),
                text("order"),
                text("o-42"),
                text("7"),
                text("OrderCreated"),
                text("2"),
                text(r#"{"amount": 100, "sku": "A-1"}"#),
                text("2026-01-01 00:00:00+00"),
            ],
        }
    }

    fn ctx() -> ChangeContext {
        ChangeContext {
            lsn: Lsn::new(0x16_B374_D848),
            commit_time: PgTimestamp(1_000_000),
        }
    }

    fn mapper(settings: OutboxSettings) -> OutboxMapper {
        OutboxMapper::new(&settings).unwrap()
    }

    fn header_list(e: &OutboxEvent) -> Vec<(String, String)> {
        e.headers
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8(v.to_vec()).unwrap()))
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn maps_a_seed_row_to_the_exact_record() {
        let m = mapper(OutboxSettings::default());
        let r = seed_rel();
        assert!(m.matches(&r));
        let bound = m.bind(&r).unwrap();
        let row = seed_row();
        let e = m.map_insert(&bound, &row, &ctx()).unwrap();
        assert_eq!(e.topic, "outbox.event.order");
        assert_eq!(e.key, Bytes::from_static(b"o-42"));
        assert_eq!(
            e.payload,
            Bytes::from_static(br#"{"amount": 100, "sku": "A-1"}"#)
        );
        assert_eq!(e.timestamp_ms, 946_684_801_000);
        assert_eq!(e.event_id, UUID);
        assert_eq!(e.aggregate_type, "order");
        assert_eq!(e.aggregate_id, "o-42");
        assert_eq!(e.lsn, ctx().lsn);
        assert_eq!(
            header_list(&e),
            pairs(&[
                ("event_id", UUID),
                ("event_type", "OrderCreated"),
                ("aggregate_type", "order"),
                ("aggregate_id", "o-42"),
                ("aggregate_sequence", "7"),
                ("schema_version", "2"),
                ("lsn", "16/B374D848"),
            ])
        );
        let names: Vec<&str> = e.headers.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(names, crate::outbox::settings::STANDARD_HEADERS);
        // The payload is a view of the received bytes, not a copy.
        let ColumnValue::Text(stored) = &row.columns[6] else {
            unreachable!()
        };
        assert_eq!(e.payload.as_ptr(), stored.as_ptr());
    }

    #[test]
    fn cloudevents_add_binary_mode_headers_after_the_standard_ones() {
        let m = mapper(OutboxSettings {
            cloudevents: crate::outbox::CloudEventsSettings {
                enabled: true,
                source: "/orders-service".into(),
                ..Default::default()
            },
            ..OutboxSettings::default()
        });
        let bound = m.bind(&seed_rel()).unwrap();
        let e = m.map_insert(&bound, &seed_row(), &ctx()).unwrap();
        let headers = header_list(&e);
        assert_eq!(headers.len(), 7 + 7, "{headers:?}");
        assert_eq!(
            headers[7..],
            pairs(&[
                ("ce_specversion", "1.0"),
                ("ce_id", UUID),
                ("ce_source", "/orders-service"),
                ("ce_type", "OrderCreated"),
                ("ce_time", "2000-01-01T00:00:01.000Z"),
                ("ce_subject", "o-42"),
                ("content-type", "application/json"),
            ])[..]
        );
        // The value and key are those of the plain record.
        let plain = mapper(OutboxSettings::default());
        let p = plain.map_insert(&bound, &seed_row(), &ctx()).unwrap();
        assert_eq!((&e.key, &e.payload), (&p.key, &p.payload));
    }

    #[test]
    fn the_lean_header_set_writes_only_what_it_lists() {
        let m = mapper(OutboxSettings {
            headers: vec![
                "aggregate_sequence".into(),
                "event_id".into(),
                "event_type".into(),
            ],
            ..OutboxSettings::default()
        });
        let bound = m.bind(&seed_rel()).unwrap();
        let e = m.map_insert(&bound, &seed_row(), &ctx()).unwrap();
        assert_eq!(
            header_list(&e),
            pairs(&[
                ("event_id", UUID),
                ("event_type", "OrderCreated"),
                ("aggregate_sequence", "7"),
            ])
        );
        // Identity the pipeline needs is carried outside the headers.
        assert_eq!(
            (e.aggregate_type.as_str(), e.aggregate_id.as_str()),
            ("order", "o-42")
        );
        for bad in [
            vec!["event_type"],
            vec!["event_id", "event_id"],
            vec!["event_id", "trace"],
        ] {
            let settings = OutboxSettings {
                headers: bad.iter().map(|h| h.to_string()).collect(),
                ..OutboxSettings::default()
            };
            let e = settings.validate().unwrap_err();
            assert!(e.to_string().contains("outbox.headers"), "{bad:?}: {e}");
        }
    }

    /// `public.outbox` with Debezium's column names and two more.
    fn debezium_rel(more: [&str; 2]) -> Relation {
        let mut columns = vec!["id", "aggregatetype", "aggregateid", "type", "payload"];
        columns.extend(more);
        rel(1, "public", "outbox", &columns)
    }

    #[test]
    fn debezium_placements_payload_format_and_route() {
        let settings = OutboxSettings {
            table: "outbox".into(),
            layout: Layout::Debezium,
            additional_placement: vec![
                "type:header:eventType".into(),
                "tenant:envelope".into(),
                "shard:partition".into(),
            ],
            payload_format: crate::outbox::PayloadFormat::JsonString,
            route: crate::outbox::RouteSettings {
                regex: "(?<routedByValue>.*)".into(),
                replacement: "events.${routedByValue}".into(),
            },
            ..OutboxSettings::default()
        };
        let m = mapper(settings);
        let bound = m.bind(&debezium_rel(["tenant", "shard"])).unwrap();
        let row = |shard: &str| TupleData {
            columns: vec![
                text(UUID),
                text("Order"),
                text("9"),
                text("Paid"),
                text(r#"{"a": 1}"#),
                text("acme"),
                text(shard),
            ],
        };
        let e = m.map_insert(&bound, &row("2"), &ctx()).unwrap();
        assert_eq!(e.topic, "events.Order");
        assert_eq!(e.partition, Some(2));
        assert_eq!(
            header_list(&e).last().unwrap(),
            &("eventType".to_owned(), "Paid".to_owned())
        );
        // An envelope with the payload as a JSON string, as Debezium writes it
        // without JSON expansion; the test relation's payload column is text.
        let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(v["payload"], r#"{"a": 1}"#);
        assert_eq!(v["tenant"], "acme");
        let bad = m.map_insert(&bound, &row("x"), &ctx()).unwrap_err();
        assert!(matches!(bad, MapError::BadPartition { .. }), "{bad}");
        assert_eq!(bad.disposition(), Disposition::RecordRefused);

        // A route whose regex does not match is a refused record naming it.
        let m = mapper(OutboxSettings {
            route: crate::outbox::RouteSettings {
                regex: "[a-z]+".into(),
                replacement: "t.$0".into(),
            },
            ..OutboxSettings::default()
        });
        let bound = m.bind(&seed_rel()).unwrap();
        let e = m.map_insert(&bound, &seed_row(), &ctx()).unwrap();
        assert_eq!(e.topic, "t.order");
        assert_eq!(e.partition, None);
    }

    #[test]
    fn debezium_layout_omits_sequence_and_version_and_adds_extra_headers() {
        let settings = OutboxSettings {
            table: "outbox".into(),
            layout: Layout::Debezium,
            topic: "{table}.{aggregate_type}.{event_type}".into(),
            allow_split_aggregates: true,
            extra_headers: vec!["tenant".into(), "trace_id".into()],
            ..OutboxSettings::default()
        };
        let m = mapper(settings);
        let bound = m.bind(&debezium_rel(["tenant", "trace_id"])).unwrap();
        let row = TupleData {
            columns: vec![
                text(UUID),
                text("Order"),
                text("9"),
                text("Paid"),
                text("{}"),
                text("acme"),
                ColumnValue::Null,
            ],
        };
        let e = m.map_insert(&bound, &row, &ctx()).unwrap();
        assert_eq!(e.topic, "outbox.Order.Paid");
        assert_eq!(
            header_list(&e),
            pairs(&[
                ("event_id", UUID),
                ("event_type", "Paid"),
                ("aggregate_type", "Order"),
                ("aggregate_id", "9"),
                ("lsn", "16/B374D848"),
                // As Debezium's Outbox Event Router sets it.
                ("id", UUID),
                ("tenant", "acme"),
            ])
        );
    }

    #[test]
    fn matches_only_the_configured_table() {
        let m = mapper(OutboxSettings::default());
        assert!(!m.matches(&rel(1, "other", "outbox_events", &SEED_COLS)));
        assert!(!m.matches(&rel(1, "public", "orders", &SEED_COLS)));
        assert!(!m.matches(&rel(1, "public", "Outbox_Events", &SEED_COLS)));
    }

    #[test]
    fn missing_column_names_table_and_column_and_is_not_poison() {
        let m = mapper(OutboxSettings::default());
        let mut cols = SEED_COLS.to_vec();
        cols.retain(|c| *c != "aggregate_sequence");
        let e = m
            .bind(&rel(1, "public", "outbox_events", &cols))
            .unwrap_err();
        assert_eq!(
            e,
            MapError::MissingColumn {
                table: "public.outbox_events".into(),
                column: "aggregate_sequence".into()
            }
        );
        assert!(e.to_string().contains("public.outbox_events"));
        assert!(e.to_string().contains("\"aggregate_sequence\""));
        assert_eq!(e.disposition(), Disposition::Stop);
        let extra = mapper(OutboxSettings {
            extra_headers: vec!["trace_id".into()],
            ..Default::default()
        });
        assert!(
            matches!(extra.bind(&seed_rel()), Err(MapError::MissingColumn { column, .. }) if column == "trace_id")
        );
    }

    fn map_with(column: usize, value: ColumnValue) -> MapError {
        let m = mapper(OutboxSettings::default());
        let bound = m.bind(&seed_rel()).unwrap();
        let mut row = seed_row();
        row.columns[column] = value;
        m.map_insert(&bound, &row, &ctx()).unwrap_err()
    }

    #[test]
    fn null_columns_are_poison_naming_column_and_event() {
        let e = map_with(2, ColumnValue::Null);
        assert!(matches!(&e, MapError::NullColumn { column, .. } if column == "aggregate_id"));
        assert_eq!(e.disposition(), Disposition::RecordRefused);
        let at = e.row().unwrap();
        assert_eq!(at.event_id.as_deref(), Some(UUID));
        assert_eq!(at.aggregate_type.as_deref(), Some("order"));
        assert_eq!(at.aggregate_id, None);
        assert_eq!(
            e.to_string(),
            format!(
                "public.outbox_events at LSN 16/B374D848, event_id {UUID}: column \"aggregate_id\" is NULL"
            )
        );
        assert_eq!(e.event_id(), Some(UUID));
        assert_eq!(e.aggregate(), None);
        let e = map_with(0, ColumnValue::Null);
        assert!(e.to_string().contains("event_id unknown"), "{e}");
        assert_eq!(e.event_id(), None);
        assert_eq!(
            map_with(6, ColumnValue::Null).aggregate(),
            Some(("order", "o-42"))
        );
        assert!(
            matches!(map_with(6, ColumnValue::Null), MapError::NullColumn { column, .. } if column == "payload")
        );
        assert!(
            matches!(map_with(3, ColumnValue::Null), MapError::NullColumn { column, .. } if column == "aggregate_sequence")
        );
    }

    #[test]
    fn toast_binary_and_utf8_errors() {
        let e = map_with(6, ColumnValue::UnchangedToast);
        assert!(matches!(&e, MapError::UnchangedToast { column, .. } if column == "payload"));
        assert_eq!(e.disposition(), Disposition::RecordRefused);
        assert!(e.to_string().contains(UUID));

        let e = map_with(4, ColumnValue::Binary(Bytes::from_static(b"x")));
        assert!(matches!(&e, MapError::BinaryValue { column, .. } if column == "event_type"));
        assert_eq!(e.disposition(), Disposition::Stop);

        let e = map_with(1, ColumnValue::Text(Bytes::from_static(b"\xff\xfe")));
        assert!(matches!(&e, MapError::InvalidUtf8 { column, .. } if column == "aggregate_type"));
        assert_eq!(e.disposition(), Disposition::RecordRefused);
        assert!(e.to_string().contains("\"aggregate_type\""));
    }

    #[test]
    fn invalid_topic_is_a_refused_record_not_a_panic() {
        let e = map_with(1, text("order/x"));
        match &e {
            MapError::InvalidTopic { topic, reason, at } => {
                assert_eq!(topic, "outbox.event.order/x");
                assert!(reason.contains("'/'"), "{reason}");
                assert_eq!(at.aggregate_id.as_deref(), Some("o-42"));
            }
            other => panic!("expected InvalidTopic, got {other:?}"),
        }
        assert_eq!(e.disposition(), Disposition::RecordRefused);
        assert!(e.to_string().contains(UUID));
    }

    #[test]
    fn oversize_record_is_refused() {
        let m = mapper(OutboxSettings {
            max_record_bytes: 100,
            ..Default::default()
        });
        let bound = m.bind(&seed_rel()).unwrap();
        let mut row = seed_row();
        row.columns[6] = text(&format!("\"{}\"", "x".repeat(100)));
        let e = m.map_insert(&bound, &row, &ctx()).unwrap_err();
        assert!(matches!(e, MapError::TooLarge { max: 100, bytes, .. } if bytes > 100));
        assert_eq!(e.disposition(), Disposition::RecordRefused);
        assert!(e.to_string().contains("outbox.max_record_bytes = 100"));
    }

    #[test]
    fn row_width_must_match_its_relation() {
        let e = {
            let m = mapper(OutboxSettings::default());
            let bound = m.bind(&seed_rel()).unwrap();
            let mut row = seed_row();
            row.columns.pop();
            m.map_insert(&bound, &row, &ctx()).unwrap_err()
        };
        assert!(matches!(
            e,
            MapError::ColumnCount {
                expected: 8,
                got: 7,
                ..
            }
        ));
        assert_eq!(e.disposition(), Disposition::Stop);
    }

    #[test]
    fn rebinds_when_the_relation_changes() {
        let m = mapper(OutboxSettings {
            extra_headers: vec!["trace_id".into()],
            ..Default::default()
        });
        let mut bindings = RelationBindings::new();
        // The table exists without trace_id: the binding fails and rows fail too.
        assert!(bindings.observe(&m, &seed_rel()).is_err());
        let err = bindings
            .map_insert(&m, 16400, &seed_row(), &ctx())
            .unwrap_err();
        assert!(matches!(err, MapError::MissingColumn { ref column, .. } if column == "trace_id"));

        // ALTER TABLE ... ADD COLUMN trace_id, placed before payload in this test:
        // a new Relation message re-binds every position.
        let mut cols = SEED_COLS.to_vec();
        cols.insert(1, "trace_id");
        let altered = rel(16400, "public", "outbox_events", &cols);
        assert!(bindings.observe(&m, &altered).unwrap());
        let mut row = seed_row();
        row.columns.insert(1, text("t-1"));
        let e = bindings
            .map_insert(&m, 16400, &row, &ctx())
            .unwrap()
            .unwrap();
        assert_eq!(e.key, Bytes::from_static(b"o-42"));
        assert_eq!(
            e.payload,
            Bytes::from_static(br#"{"amount": 100, "sku": "A-1"}"#)
        );
        assert_eq!(
            header_list(&e).last().unwrap(),
            &("trace_id".to_string(), "t-1".to_string())
        );
        assert_eq!(bindings.get(16400).map(BoundRelation::oid), Some(16400));

        // Other tables of the publication are not events; unknown OIDs are a stream error.
        assert!(
            !bindings
                .observe(&m, &rel(17000, "public", "orders", &["order_id"]))
                .unwrap()
        );
        assert_eq!(
            bindings
                .map_insert(&m, 17000, &TupleData::default(), &ctx())
                .unwrap(),
            None
        );
        let e = bindings
            .map_insert(&m, 99, &TupleData::default(), &ctx())
            .unwrap_err();
        assert_eq!(
            e,
            MapError::UnknownRelation {
                oid: 99,
                lsn: ctx().lsn
            }
        );
        assert_eq!(e.disposition(), Disposition::Stop);

        // A rename away from the configured name unbinds the OID.
        assert!(
            !bindings
                .observe(&m, &rel(16400, "public", "outbox_old", &cols))
                .unwrap()
        );
        assert_eq!(bindings.map_insert(&m, 16400, &row, &ctx()).unwrap(), None);
    }

    fn message(transactional: bool, prefix: &str, content: &str) -> LogicalMessage {
        LogicalMessage {
            transactional,
            lsn: Lsn::new(0x16_B374_D848),
            prefix: prefix.into(),
            content: Bytes::copy_from_slice(content.as_bytes()),
        }
    }

    const ENVELOPE: &str = r#"{"event_id":"e-1","aggregate_type":"order","aggregate_id":"o-1",
        "aggregate_sequence":3,"event_type":"Shipped","schema_version":1,"payload":{"carrier":"dhl"}}"#;

    #[test]
    fn maps_a_message_envelope() {
        let m = mapper(OutboxSettings {
            message_prefix: "outbox".into(),
            ..Default::default()
        });
        let e = m
            .map_message(&message(true, "outbox", ENVELOPE), &ctx())
            .unwrap()
            .unwrap();
        assert_eq!(e.topic, "outbox.event.order");
        assert_eq!(e.key, Bytes::from_static(b"o-1"));
        assert_eq!(e.payload, Bytes::from_static(br#"{"carrier":"dhl"}"#));
        assert_eq!(e.timestamp_ms, 946_684_801_000);
        assert_eq!(
            header_list(&e),
            pairs(&[
                ("event_id", "e-1"),
                ("event_type", "Shipped"),
                ("aggregate_type", "order"),
                ("aggregate_id", "o-1"),
                ("aggregate_sequence", "3"),
                ("schema_version", "1"),
                ("lsn", "16/B374D848"),
            ])
        );
        let minimal = r#"{"event_id":"e-2","aggregate_type":"order","aggregate_id":"o-1","event_type":"X","payload":[1]}"#;
        let e = m
            .map_message(&message(true, "outbox", minimal), &ctx())
            .unwrap()
            .unwrap();
        assert_eq!(header_list(&e).len(), 5);
        assert_eq!(e.payload, Bytes::from_static(b"[1]"));
    }

    /// The message path publishes the payload's bytes as written: no number is
    /// re-formatted or rounded, whitespace and key order stay; a JSON string
    /// payload is text and goes out as that text, as from a `text` column.
    #[test]
    fn a_non_transactional_message_with_the_event_prefix_is_a_stray() {
        let m = mapper(OutboxSettings {
            message_prefix: "outbox".into(),
            ..Default::default()
        });
        assert!(m.is_stray_event_message(&message(false, "outbox", "{}")));
        assert!(!m.is_stray_event_message(&message(true, "outbox", "{}")));
        assert!(!m.is_stray_event_message(&message(false, "heartbeat", "{}")));
        let off = mapper(OutboxSettings::default());
        assert!(!off.is_stray_event_message(&message(false, "outbox", "{}")));
    }

    #[test]
    fn message_payload_bytes_are_published_as_written() {
        let m = mapper(OutboxSettings {
            message_prefix: "outbox".into(),
            ..Default::default()
        });
        let with_payload = |payload: &str| {
            format!(
                r#"{{"event_id":"e-1","aggregate_type":"order","aggregate_id":"o-1","event_type":"X","payload": {payload} }}"#
            )
        };
        for payload in [
            "1.10",
            "0.1234567890123456789",
            "123456789012345678901234567890",
            "-18446744073709551616",
            "1E+2",
            r#"{"z": 1.10,  "a" : [0.1234567890123456789, 123456789012345678901234567890]}"#,
            r#"{"dup": 1, "dup": 2}"#,
            r#"["é", "\/"]"#,
            "true",
        ] {
            let content = with_payload(payload);
            let msg = message(true, "outbox", &content);
            let e = m.map_message(&msg, &ctx()).unwrap().unwrap();
            assert_eq!(
                std::str::from_utf8(&e.payload).unwrap(),
                payload,
                "{content}"
            );
            // A view of the received message, not a copy.
            let start = content.find(payload).unwrap();
            assert_eq!(e.payload.as_ptr(), msg.content[start..].as_ptr());
        }
        for (payload, published) in [
            (r#""plain text""#, "plain text"),
            (r#""caf\u00e9 \"quoted\"\n""#, "caf\u{e9} \"quoted\"\n"),
            (r#""""#, ""),
            (r#""{\"a\": 1.10}""#, r#"{"a": 1.10}"#),
        ] {
            let e = m
                .map_message(&message(true, "outbox", &with_payload(payload)), &ctx())
                .unwrap()
                .unwrap();
            assert_eq!(std::str::from_utf8(&e.payload).unwrap(), published);
        }
    }

    fn typed_rel(payload_type: u32) -> Relation {
        let mut r = seed_rel();
        r.columns[6].type_oid = payload_type;
        r
    }

    /// bytea's text form is `\x` and hex digits, never the stored bytes: a
    /// payload column of that type is refused when the relation is bound, with
    /// the column and the fix, before any row is published.
    #[test]
    fn bytea_payload_column_is_refused_at_bind() {
        let m = mapper(OutboxSettings::default());
        let e = m.bind(&typed_rel(17)).unwrap_err();
        assert_eq!(
            e,
            MapError::PayloadType {
                table: "public.outbox_events".into(),
                column: "payload".into(),
                type_name: "bytea",
            }
        );
        assert_eq!(e.disposition(), Disposition::Stop);
        let text = e.to_string();
        assert!(
            text.contains("\"payload\"") && text.contains("bytea"),
            "{text}"
        );
        assert!(
            text.contains("jsonb") && text.contains("outbox.columns.payload"),
            "{text}"
        );
        let mut bindings = RelationBindings::new();
        assert!(bindings.observe(&m, &typed_rel(17)).is_err());
        assert!(matches!(
            bindings.map_insert(&m, 16400, &seed_row(), &ctx()),
            Err(MapError::PayloadType { .. })
        ));
        // jsonb, json, text, varchar: bound, and the value goes out as sent.
        for oid in [3802, 114, 25, 1043] {
            let bound = m.bind(&typed_rel(oid)).unwrap();
            let e = m.map_insert(&bound, &seed_row(), &ctx()).unwrap();
            assert_eq!(
                e.payload,
                Bytes::from_static(br#"{"amount": 100, "sku": "A-1"}"#)
            );
        }
        // Other columns of type bytea are headers' business, not refused here.
        let mut r = seed_rel();
        r.columns[7].type_oid = 17;
        assert!(m.bind(&r).is_ok());
    }

    #[test]
    fn messages_that_are_not_events() {
        let off = mapper(OutboxSettings::default());
        assert!(!off.wants_messages());
        let m = mapper(OutboxSettings {
            message_prefix: "outbox".into(),
            ..Default::default()
        });
        // Off, no prefix is taken; on, only the configured one, exactly.
        for (mapper, prefix) in [(&off, ""), (&off, "outbox"), (&m, "outbox2"), (&m, "outbo")] {
            let mapped = mapper.map_message(&message(true, prefix, ENVELOPE), &ctx());
            assert_eq!(mapped.unwrap(), None, "{prefix:?}");
        }
        let stray = message(false, "outbox", ENVELOPE);
        assert_eq!(m.map_message(&stray, &ctx()).unwrap(), None);
    }

    #[test]
    fn bad_envelopes_are_poison() {
        let m = mapper(OutboxSettings {
            message_prefix: "outbox".into(),
            ..Default::default()
        });
        let bad = [
            "not json",
            r#"{"event_id":"e","aggregate_type":"a","aggregate_id":"i","event_type":"t"}"#,
            r#"{"event_id":"e","aggregate_type":"a","aggregate_id":"i","event_type":"t","payload":null}"#,
            r#"{"event_id":"e","aggregate_type":"a","aggregate_id":"i","event_type":"t","payload" :  null }"#,
            r#"{"event_id":"e","aggregate_type":"a","aggregate_id":"i","event_type":"t","payload":[1,}"#,
            r#"{"event_id":"","aggregate_type":"a","aggregate_id":"i","event_type":"t","payload":1}"#,
            r#"{"event_id":"e","aggregate_type":"a","aggregate_id":"i","event_type":"t","payload":1,"extra":1}"#,
            r#"{"event_id":"e","aggregate_type":"a","aggregate_id":"i","event_type":"t","payload":1,"aggregate_sequence":"x"}"#,
        ];
        for content in bad {
            let e = m
                .map_message(&message(true, "outbox", content), &ctx())
                .unwrap_err();
            assert!(
                matches!(e, MapError::BadEnvelope { .. }),
                "{content}: {e:?}"
            );
            assert_eq!(e.disposition(), Disposition::RecordRefused);
            assert!(
                e.to_string()
                    .starts_with("logical message \"outbox\" at LSN 16/B374D848"),
                "{e}"
            );
        }
        let null_payload = r#"{"event_id":"e-9","aggregate_type":"a","aggregate_id":"i","event_type":"t","payload":null}"#;
        let e = m
            .map_message(&message(true, "outbox", null_payload), &ctx())
            .unwrap_err();
        assert!(e.to_string().contains("event_id e-9"), "{e}");
        let bad_topic = r#"{"event_id":"e","aggregate_type":"a b","aggregate_id":"i","event_type":"t","payload":1}"#;
        let e = m
            .map_message(&message(true, "outbox", bad_topic), &ctx())
            .unwrap_err();
        assert!(matches!(e, MapError::InvalidTopic { .. }));
    }

    /// The seed's columns plus `traceparent` and `tracestate`, and a row
    /// carrying `parent` and `state` (`None`: NULL).
    fn traced(parent: Option<&str>, state: Option<&str>) -> (Relation, TupleData) {
        let mut cols = SEED_COLS.to_vec();
        cols.extend(["traceparent", "tracestate"]);
        let mut row = seed_row();
        for v in [parent, state] {
            row.columns.push(v.map_or(ColumnValue::Null, text));
        }
        (rel(16400, "public", "outbox_events", &cols), row)
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn trace_headers(e: &OutboxEvent) -> Vec<(String, String)> {
        header_list(e)
            .into_iter()
            .filter(|(k, _)| k.starts_with("trace"))
            .collect()
    }

    #[test]
    fn a_valid_trace_context_goes_out_byte_for_byte_after_the_other_headers() {
        let m = mapper(OutboxSettings::default());
        let (r, row) = traced(Some(PARENT), Some("congo=t61rcWkgMzE"));
        let e = m.map_insert(&m.bind(&r).unwrap(), &row, &ctx()).unwrap();
        let names: Vec<&str> = e.headers.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(names[7..], ["traceparent", "tracestate"]);
        assert_eq!(
            trace_headers(&e),
            pairs(&[("traceparent", PARENT), ("tracestate", "congo=t61rcWkgMzE")])
        );
        assert_eq!(e.trace_dropped, TraceDropped::default());
        // NULL and '' are no trace context: nothing written, nothing counted.
        for (parent, state) in [(None, None), (Some(""), Some(""))] {
            let (r, row) = traced(parent, state);
            let e = m.map_insert(&m.bind(&r).unwrap(), &row, &ctx()).unwrap();
            assert!(trace_headers(&e).is_empty());
            assert!(!e.trace_dropped.any());
        }
    }

    #[test]
    fn an_invalid_trace_context_is_left_out_and_reported_never_refused() {
        let m = mapper(OutboxSettings::default());
        let upper = PARENT.to_uppercase();
        let (r, row) = traced(Some(&upper), Some("congo=t61rcWkgMzE"));
        let e = m.map_insert(&m.bind(&r).unwrap(), &row, &ctx()).unwrap();
        assert!(trace_headers(&e).is_empty(), "{:?}", header_list(&e));
        assert!(e.trace_dropped.traceparent && e.trace_dropped.tracestate);
        // A tracestate that is not plausible goes; the traceparent stays.
        let (r, row) = traced(Some(PARENT), Some("a=1\nb=2"));
        let e = m.map_insert(&m.bind(&r).unwrap(), &row, &ctx()).unwrap();
        assert_eq!(trace_headers(&e), pairs(&[("traceparent", PARENT)]));
        assert_eq!(
            e.trace_dropped,
            TraceDropped {
                traceparent: false,
                tracestate: true
            }
        );
        // A tracestate without a traceparent cannot travel.
        let (r, row) = traced(None, Some("congo=1"));
        let e = m.map_insert(&m.bind(&r).unwrap(), &row, &ctx()).unwrap();
        assert!(trace_headers(&e).is_empty());
        assert!(!e.trace_dropped.traceparent && e.trace_dropped.tracestate);
    }

    #[test]
    fn trace_columns_follow_the_table_unless_configured() {
        // The seed's table without the columns: as before.
        let m = mapper(OutboxSettings::default());
        let e = m
            .map_insert(&m.bind(&seed_rel()).unwrap(), &seed_row(), &ctx())
            .unwrap();
        assert!(trace_headers(&e).is_empty());
        // Off: the columns are not read.
        let off = mapper(OutboxSettings {
            trace_column: Some(String::new()),
            ..OutboxSettings::default()
        });
        let (r, row) = traced(Some(PARENT), None);
        let e = off
            .map_insert(&off.bind(&r).unwrap(), &row, &ctx())
            .unwrap();
        assert!(trace_headers(&e).is_empty());
        // A column of another name, which must exist.
        let named = mapper(OutboxSettings {
            trace_column: Some("tp".into()),
            ..OutboxSettings::default()
        });
        assert!(matches!(
            named.bind(&seed_rel()),
            Err(MapError::MissingColumn { column, .. }) if column == "tp"
        ));
        let mut cols = SEED_COLS.to_vec();
        cols.push("tp");
        let mut row = seed_row();
        row.columns.push(text(PARENT));
        let r = rel(1, "public", "outbox_events", &cols);
        let e = named
            .map_insert(&named.bind(&r).unwrap(), &row, &ctx())
            .unwrap();
        assert_eq!(trace_headers(&e), pairs(&[("traceparent", PARENT)]));
    }
}
