//! The `[outbox]` configuration section: which table, which columns, which topic,
//! what to do with rows that cannot be mapped.
//!
//! Every field has a default, so an empty `[outbox]` section describes the
//! seed's `public.outbox_events` table routed to `outbox.event.{aggregate_type}`.
//! Values that parse but are not allowed are reported by [`OutboxSettings::validate`]
//! as a [`ConfigError`] naming the key (`outbox.topic`), the value and what is allowed.

use std::str::FromStr;

use serde::Deserialize;

use super::cloudevents::{CLOUDEVENTS_HEADERS, CloudEvents, CloudEventsSettings};
use super::placement::{PayloadFormat, Placement, RouteSettings, parse_placements};
pub use super::table_name::TableName;
use super::topic::{self, TopicTemplate};

/// Largest `max_record_bytes` accepted: librdkafka's upper bound for `message.max.bytes`.
const MAX_RECORD_BYTES_LIMIT: usize = 1_000_000_000;

/// Header names the mapper writes itself; an extra header or header
/// placement may use one only for the column that header carries.
pub(crate) const STANDARD_HEADERS: [&str; 7] = [
    "event_id",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "aggregate_sequence",
    "schema_version",
    "lsn",
];

/// What a header name that outbox-cdc writes itself carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StandardSource {
    /// The column that the config key `key` names.
    Column { key: &'static str, column: String },
    /// The config key `key` would name its column; none is set.
    NoColumn { key: &'static str },
    /// The event's WAL position (`lsn`).
    Position,
}

/// The header entries (`extra_headers`, header placements) resolved.
#[derive(Debug, Default)]
struct ResolvedHeaders {
    /// (header name, column) of the headers written after the standard ones.
    extra: Vec<(String, String)>,
    /// Standard headers that an entry maps to (so they are written).
    standard: Vec<&'static str>,
}

/// What `OutboxSettings::validate` refuses (the crate's one settings error).
pub use crate::setting::InvalidSetting as ConfigError;

/// The `[outbox]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxSettings {
    /// The outbox table, written as in SQL: `schema.name` or `name` (schema
    /// `public`); unquoted parts fold to lower case, `"Quoted"` parts keep their case.
    /// Default `public.outbox_events`.
    pub table: String,
    /// Topic template. Placeholders: `{aggregate_type}`, `{event_type}`, `{table}`
    /// (the table's name without schema). Default `outbox.event.{aggregate_type}`.
    /// `{event_type}` needs `allow_split_aggregates`.
    pub topic: String,
    /// Accept a topic template with `{event_type}`, which sends one aggregate's
    /// events to several topics: Kafka orders records only within one
    /// partition of one topic, so consumers lose the per-aggregate order across
    /// event types. Default false.
    pub allow_split_aggregates: bool,
    /// Column-name preset: `seed` (default) or `debezium`.
    pub layout: Layout,
    /// Per-column overrides on top of the preset. Default: none.
    pub columns: ColumnOverrides,
    /// Columns copied into record headers (header name = column name), after the
    /// standard headers. A NULL value omits that header. A column that a
    /// standard header of the same name carries is that header. Default: none.
    pub extra_headers: Vec<String>,
    /// Logical decoding messages (`pg_logical_emit_message(true, prefix, envelope)`)
    /// with exactly this prefix are events too. Default `""`: off.
    pub message_prefix: String,
    /// What a row that cannot be mapped gets: `fail` (default) or `dead-letter`.
    pub on_poison: PoisonPolicy,
    /// Topic for dead-lettered rows when `on_poison = "dead-letter"`. Default `outbox.dlq`.
    pub dead_letter_topic: String,
    /// With `on_poison = "dead-letter"`: the table in the source database that
    /// holds the parked aggregates, shared by every instance that can hold the
    /// slot (an HA pair); created when missing (`migrations/005_parked.sql`).
    /// Default `public.outbox_cdc_parked`.
    pub parked_table: String,
    /// Largest record (topic + key + value + headers) published; a larger row is poison.
    /// Default 1000000 (Kafka's default `message.max.bytes` is about this size).
    pub max_record_bytes: usize,
    /// `[outbox.cloudevents]`: CloudEvents headers (binary mode). Default off.
    pub cloudevents: CloudEventsSettings,
    /// Debezium's `table.fields.additional.placement` entries:
    /// `column:header[:alias]`, `column:envelope[:alias]`, `column:partition`.
    /// A header named as a standard header is that header when it carries the
    /// same column (written once, even if `headers` leaves it out), and is
    /// refused when it would put another column under that name. Default none.
    pub additional_placement: Vec<String>,
    /// The record value: `as-stored` (default) or `json-string`.
    pub payload_format: PayloadFormat,
    /// `[outbox.route]`: Debezium's topic regex on the aggregate type. Default off.
    pub route: RouteSettings,
    /// The standard headers to write, in any order (they go out in the fixed
    /// order), besides those a header placement or extra header names.
    /// Default all of them; `event_id` is required. The lean set
    /// `["event_id", "event_type", "aggregate_sequence"]` suits consumers that
    /// read the aggregate type from the topic and its id from the key.
    pub headers: Vec<String>,
    /// The column with the writer's W3C `traceparent`, copied (when valid)
    /// into the record header `traceparent`. Default (unset): the column
    /// `traceparent` when the table has one, otherwise none; `""`: off; a
    /// name: that column, which must exist.
    pub trace_column: Option<String>,
    /// The column with the writer's W3C `tracestate`, copied into the header
    /// `tracestate` alongside a valid `traceparent`. Default (unset): the
    /// column `tracestate` when the table has one and trace context is on;
    /// `""`: off; a name: that column, which must exist.
    pub tracestate_column: Option<String>,
}

/// Where a trace context header comes from (`outbox.trace_column`,
/// `outbox.tracestate_column`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceColumn {
    Off,
    /// The column of this name when the table has it (the default).
    IfPresent(String),
    /// The configured column, which must exist; `key` names the setting.
    Required {
        key: &'static str,
        column: String,
    },
}

impl TraceColumn {
    /// The column, when one is (or may be) read.
    pub fn column(&self) -> Option<&str> {
        match self {
            TraceColumn::Off => None,
            TraceColumn::IfPresent(c) | TraceColumn::Required { column: c, .. } => Some(c),
        }
    }
}

/// Which standard headers are written (`outbox.headers`); `event_id` always is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StandardHeaders {
    pub event_type: bool,
    pub aggregate_type: bool,
    pub aggregate_id: bool,
    pub aggregate_sequence: bool,
    pub schema_version: bool,
    pub lsn: bool,
}

impl Default for OutboxSettings {
    fn default() -> OutboxSettings {
        OutboxSettings {
            table: "public.outbox_events".to_owned(),
            topic: "outbox.event.{aggregate_type}".to_owned(),
            allow_split_aggregates: false,
            layout: Layout::Seed,
            columns: ColumnOverrides::default(),
            extra_headers: Vec::new(),
            message_prefix: String::new(),
            on_poison: PoisonPolicy::Fail,
            dead_letter_topic: "outbox.dlq".to_owned(),
            parked_table: "public.outbox_cdc_parked".to_owned(),
            max_record_bytes: 1_000_000,
            cloudevents: CloudEventsSettings::default(),
            additional_placement: Vec::new(),
            payload_format: PayloadFormat::AsStored,
            route: RouteSettings::default(),
            headers: STANDARD_HEADERS.iter().map(|h| h.to_string()).collect(),
            trace_column: None,
            tracestate_column: None,
        }
    }
}

/// Column-name presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// The seed's table: `event_id`, `aggregate_type`, `aggregate_id`,
    /// `aggregate_sequence`, `event_type`, `schema_version`, `payload`.
    #[default]
    Seed,
    /// Debezium's outbox table: `id`, `aggregatetype`, `aggregateid`, `type`,
    /// `payload`; no sequence or schema-version column (those headers are omitted).
    Debezium,
}

impl FromStr for Layout {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Layout, ConfigError> {
        let choices = [("seed", Layout::Seed), ("debezium", Layout::Debezium)];
        crate::setting::one_of("outbox.layout", s, &choices)
    }
}

/// What happens to a row that cannot be mapped (DESIGN.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoisonPolicy {
    /// Stop without advancing and alert; the operator repairs and restarts.
    #[default]
    Fail,
    /// Publish the row to the dead-letter topic with the reason, and park later
    /// events of the same aggregate so its order is never silently broken.
    DeadLetter,
}

impl FromStr for PoisonPolicy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<PoisonPolicy, ConfigError> {
        let choices = [
            ("fail", PoisonPolicy::Fail),
            ("dead-letter", PoisonPolicy::DeadLetter),
        ];
        crate::setting::one_of("outbox.on_poison", s, &choices)
    }
}

/// Deserializes through `FromStr` so a bad value reads like every other config error.
macro_rules! deserialize_from_str {
    ($t:ty) => {
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
deserialize_from_str!(Layout);
deserialize_from_str!(PoisonPolicy);
deserialize_from_str!(PayloadFormat);

/// Column-name overrides (`[outbox.columns]`); an unset field keeps the preset's name.
/// For the optional `aggregate_sequence` and `schema_version`, `""` means "no such
/// column": the header is omitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ColumnOverrides {
    pub event_id: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub aggregate_sequence: Option<String>,
    pub event_type: Option<String>,
    pub schema_version: Option<String>,
    pub payload: Option<String>,
}

/// The column names in effect after preset and overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnNames {
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub aggregate_sequence: Option<String>,
    pub event_type: String,
    pub schema_version: Option<String>,
    pub payload: String,
}

/// Splits `schema.name` into catalog names: unquoted identifiers fold to ASCII
/// lower case as PostgreSQL folds them, `"quoted"` ones are taken literally
/// (`""` inside stands for one quote).
fn parse_table(input: &str) -> Option<TableName> {
    let mut idents = Vec::with_capacity(2);
    let mut chars = input.chars().peekable();
    loop {
        let mut ident = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        ident.push('"');
                    }
                    '"' => break,
                    c => ident.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                let start = ident.is_empty();
                let ok =
                    c.is_alphabetic() || c == '_' || (!start && (c.is_ascii_digit() || c == '$'));
                if !ok {
                    break;
                }
                ident.push(c.to_ascii_lowercase());
                chars.next();
            }
        }
        if ident.is_empty() {
            return None;
        }
        idents.push(ident);
        match chars.next() {
            None => break,
            Some('.') if idents.len() < 2 => continue,
            Some(_) => return None,
        }
    }
    let name = idents.pop()?;
    let schema = idents.pop().unwrap_or_else(|| "public".to_owned());
    Some(TableName { schema, name })
}

impl OutboxSettings {
    /// The configured table as catalog names.
    pub fn table_name(&self) -> Result<TableName, ConfigError> {
        parse_table(&self.table).ok_or_else(|| {
            ConfigError::new(
                "outbox.table",
                &self.table,
                "a table name as written in SQL: name or schema.name, \"quoted\" where needed",
            )
        })
    }

    /// The parked-aggregates table as catalog names.
    pub fn parked_table_name(&self) -> Result<TableName, ConfigError> {
        parse_table(&self.parked_table).ok_or_else(|| {
            ConfigError::new(
                "outbox.parked_table",
                &self.parked_table,
                "a table name as written in SQL: name or schema.name, \"quoted\" where needed",
            )
        })
    }

    /// The parsed topic template (`{table}` already resolved).
    pub(crate) fn topic_template(&self) -> Result<TopicTemplate, ConfigError> {
        let table = self.table_name()?;
        TopicTemplate::parse(&self.topic, &table.name)
            .map_err(|e| ConfigError::new("outbox.topic", &self.topic, e.to_string()))
    }

    /// Column names after applying the layout preset and the overrides.
    pub fn column_names(&self) -> Result<ColumnNames, ConfigError> {
        let o = &self.columns;
        let required = |field: &str, over: &Option<String>, preset: &str| match over {
            None => Ok(preset.to_owned()),
            Some(s) if s.is_empty() => Err(ConfigError::new(
                format!("outbox.columns.{field}"),
                s,
                "a column name (this column is required)",
            )),
            Some(s) => Ok(s.clone()),
        };
        let optional = |over: &Option<String>, preset: Option<&str>| match over {
            None => preset.map(str::to_owned),
            Some(s) if s.is_empty() => None,
            Some(s) => Some(s.clone()),
        };
        let (seq, ver) = match self.layout {
            Layout::Seed => (Some("aggregate_sequence"), Some("schema_version")),
            Layout::Debezium => (None, None),
        };
        let preset = |seed: &'static str, debezium: &'static str| match self.layout {
            Layout::Seed => seed,
            Layout::Debezium => debezium,
        };
        Ok(ColumnNames {
            event_id: required("event_id", &o.event_id, preset("event_id", "id"))?,
            aggregate_type: required(
                "aggregate_type",
                &o.aggregate_type,
                preset("aggregate_type", "aggregatetype"),
            )?,
            aggregate_id: required(
                "aggregate_id",
                &o.aggregate_id,
                preset("aggregate_id", "aggregateid"),
            )?,
            aggregate_sequence: optional(&o.aggregate_sequence, seq),
            event_type: required("event_type", &o.event_type, preset("event_type", "type"))?,
            schema_version: optional(&o.schema_version, ver),
            payload: required("payload", &o.payload, "payload")?,
        })
    }

    /// Checks every value; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.topic_template()?.uses_event_type() && !self.allow_split_aggregates {
            return Err(ConfigError::new(
                "outbox.topic",
                &self.topic,
                "a template without {event_type}: it would send the events of one aggregate \
                 to several topics, and Kafka keeps order only within one partition of one \
                 topic, so consumers could see an aggregate's events out of order (DESIGN.md \
                 §2.3). Route by {aggregate_type} and/or {table}, or set \
                 outbox.allow_split_aggregates = true if no consumer needs the order across \
                 event types",
            ));
        }
        self.column_names()?;
        self.parked_table_name()?;
        self.check_extra_headers()?;
        self.cloud_events()?;
        self.route.compile()?;
        self.standard_headers()?;
        self.trace_columns()?;
        topic::validate_topic_name(&self.dead_letter_topic).map_err(|e| {
            ConfigError::new(
                "outbox.dead_letter_topic",
                &self.dead_letter_topic,
                format!("{e}; give a Kafka topic name such as outbox.dlq (the default)"),
            )
        })?;
        if self.max_record_bytes == 0 || self.max_record_bytes > MAX_RECORD_BYTES_LIMIT {
            return Err(ConfigError::new(
                "outbox.max_record_bytes",
                self.max_record_bytes.to_string(),
                format!("an integer from 1 to {MAX_RECORD_BYTES_LIMIT}"),
            ));
        }
        Ok(())
    }

    /// The CloudEvents headers to add, `None` when off.
    pub(crate) fn cloud_events(&self) -> Result<Option<CloudEvents>, ConfigError> {
        self.cloudevents.build(&self.table_name()?)
    }

    /// Placements parsed (`outbox.additional_placement`).
    pub(crate) fn placements(&self) -> Result<Vec<Placement>, ConfigError> {
        parse_placements(&self.additional_placement)
    }

    /// The standard headers written: those `outbox.headers` lists (checked:
    /// standard names, each once, `event_id` among them), plus those a header
    /// placement or extra header maps to.
    pub(crate) fn standard_headers(&self) -> Result<StandardHeaders, ConfigError> {
        let list = self.headers.join(",");
        for (i, h) in self.headers.iter().enumerate() {
            let problem = if !STANDARD_HEADERS.contains(&h.as_str()) {
                format!("{h} is not a standard header")
            } else if self.headers[..i].contains(h) {
                format!("{h} is listed twice")
            } else {
                continue;
            };
            return Err(ConfigError::new(
                "outbox.headers",
                format!("[{list}]"),
                format!(
                    "{problem}: list each of {} at most once (a column of your own \
                     goes in outbox.extra_headers or outbox.additional_placement)",
                    STANDARD_HEADERS.join(", ")
                ),
            ));
        }
        let listed = |name: &str| self.headers.iter().any(|h| h == name);
        if !listed("event_id") {
            let mut fixed = vec!["\"event_id\"".to_owned()];
            fixed.extend(self.headers.iter().map(|h| format!("{h:?}")));
            return Err(ConfigError::new(
                "outbox.headers",
                format!("[{list}]"),
                format!(
                    "a list with event_id, such as [{}]: every record carries its \
                     immutable event id, which consumers dedupe on",
                    fixed.join(", ")
                ),
            ));
        }
        let mapped = self.resolve_headers()?.standard;
        let has = |name: &str| listed(name) || mapped.contains(&name);
        Ok(StandardHeaders {
            event_type: has("event_type"),
            aggregate_type: has("aggregate_type"),
            aggregate_id: has("aggregate_id"),
            aggregate_sequence: has("aggregate_sequence"),
            schema_version: has("schema_version"),
            lsn: has("lsn"),
        })
    }

    /// The columns `additional_placement` reads, each once.
    pub fn placement_columns(&self) -> Result<Vec<String>, ConfigError> {
        let mut out: Vec<String> = Vec::new();
        for p in self.placements()? {
            let column = match p {
                Placement::Header { column, .. }
                | Placement::Envelope { column, .. }
                | Placement::Partition { column } => column,
            };
            if !out.contains(&column) {
                out.push(column);
            }
        }
        Ok(out)
    }

    /// What the header `name` carries when outbox-cdc writes it itself;
    /// `None` when `name` is free for a column (neither a standard header nor
    /// the debezium layout's `id`).
    pub(crate) fn standard_header_source(
        &self,
        name: &str,
        columns: &ColumnNames,
    ) -> Option<StandardSource> {
        let column = |key: &'static str, column: &str| StandardSource::Column {
            key,
            column: column.to_owned(),
        };
        let optional = |key: &'static str, c: &Option<String>| match c {
            Some(c) => column(key, c),
            None => StandardSource::NoColumn { key },
        };
        Some(match name {
            "event_id" => column("outbox.columns.event_id", &columns.event_id),
            "id" if self.layout == Layout::Debezium => {
                column("outbox.columns.event_id", &columns.event_id)
            }
            "event_type" => column("outbox.columns.event_type", &columns.event_type),
            "aggregate_type" => column("outbox.columns.aggregate_type", &columns.aggregate_type),
            "aggregate_id" => column("outbox.columns.aggregate_id", &columns.aggregate_id),
            "aggregate_sequence" => optional(
                "outbox.columns.aggregate_sequence",
                &columns.aggregate_sequence,
            ),
            "schema_version" => optional("outbox.columns.schema_version", &columns.schema_version),
            "lsn" => StandardSource::Position,
            _ => return None,
        })
    }

    /// The extra headers, (header name, column), from `extra_headers` and the
    /// header placements, checked against the headers the mapper writes; an
    /// entry that names a standard header carrying the same column is that
    /// header, not an extra one.
    pub(crate) fn header_columns(&self) -> Result<Vec<(String, String)>, ConfigError> {
        Ok(self.resolve_headers()?.extra)
    }

    fn resolve_headers(&self) -> Result<ResolvedHeaders, ConfigError> {
        let columns = self.column_names()?;
        // (header name, column, config key, the entry as written)
        let mut wanted: Vec<(String, String, &'static str, String)> = self
            .extra_headers
            .iter()
            .map(|h| (h.clone(), h.clone(), "outbox.extra_headers", h.clone()))
            .collect();
        for (entry, p) in self.additional_placement.iter().zip(self.placements()?) {
            if let Placement::Header { column, name } = p {
                wanted.push((name, column, "outbox.additional_placement", entry.clone()));
            }
        }
        let mut out = ResolvedHeaders::default();
        // (header name, config key, entry) of the extra headers accepted so far.
        let mut taken: Vec<(&str, &str, &str)> = Vec::new();
        for (name, column, key, entry) in &wanted {
            let refuse = |why: String| Err(ConfigError::new(*key, entry, why));
            if name.is_empty() {
                return refuse("a column name, not empty".to_owned());
            }
            // How the column could be written under a name of its own.
            let own = |column: &str| {
                let free = |n: &str| {
                    self.standard_header_source(n, &columns).is_none()
                        && !(self.cloudevents.enabled && CLOUDEVENTS_HEADERS.contains(&n))
                        && !taken.iter().any(|(t, _, _)| *t == n)
                };
                let alias = if free(column) {
                    column.to_owned()
                } else {
                    format!("{column}_column")
                };
                let placement = format!("{column}:header:{alias}");
                match *key {
                    "outbox.extra_headers" => format!(
                        "write the column under a header name of its own with \
                         outbox.additional_placement = [\"{placement}\"]"
                    ),
                    _ => format!("place {column} under a header name of its own ({placement})"),
                }
            };
            if let Some(source) = self.standard_header_source(name, &columns) {
                let why = match source {
                    StandardSource::Column { column: c, .. } if c == *column => {
                        // The standard header itself: written once, as that header.
                        if let Some(n) = STANDARD_HEADERS.iter().find(|n| **n == name.as_str()) {
                            out.standard.push(n);
                        }
                        continue;
                    }
                    StandardSource::Column { key: k, column: c } => {
                        let what = k.trim_start_matches("outbox.columns.").replace('_', " ");
                        let what = if name == "id" {
                            "the event id".to_owned()
                        } else {
                            format!("the {what}")
                        };
                        let header = if name == "id" {
                            "id is the debezium layout's event id header".to_owned()
                        } else {
                            format!("{name} is a standard header")
                        };
                        format!(
                            "{header} and carries column {c} ({k}), not {column}: {}, or set \
                             {k} = \"{column}\" if {column} holds {what}",
                            own(column)
                        )
                    }
                    StandardSource::NoColumn { key: k } => format!(
                        "{name} is a standard header, written from the column that {k} \
                         names, and none is set: set {k} = \"{column}\" to write {column} \
                         as that header, or {}",
                        own(column)
                    ),
                    StandardSource::Position => format!(
                        "{name} is a standard header, the event's WAL position, not a \
                         column: {}",
                        own(column)
                    ),
                };
                return refuse(why);
            }
            if self.cloudevents.enabled && CLOUDEVENTS_HEADERS.contains(&name.as_str()) {
                return refuse(format!(
                    "{name} is a CloudEvents header, written by outbox-cdc while \
                     outbox.cloudevents.enabled = true: {}",
                    own(column)
                ));
            }
            if let Some((_, other_key, other)) = taken.iter().find(|(t, _, _)| *t == name.as_str())
            {
                if *key == "outbox.extra_headers" {
                    let once: Vec<String> = self
                        .extra_headers
                        .iter()
                        .enumerate()
                        .filter(|(i, h)| !self.extra_headers[..*i].contains(h))
                        .map(|(_, h)| format!("{h:?}"))
                        .collect();
                    return refuse(format!(
                        "{name} is listed twice: each column once, \
                         outbox.extra_headers = [{}]",
                        once.join(", ")
                    ));
                }
                return refuse(format!(
                    "header {name} is already written by the {other_key} entry {other}: \
                     each header name at most once; {}",
                    own(column)
                ));
            }
            taken.push((name, key, entry));
            out.extra.push((name.clone(), column.clone()));
        }
        Ok(out)
    }

    fn check_extra_headers(&self) -> Result<(), ConfigError> {
        self.header_columns().map(|_| ())
    }

    /// The `traceparent` and `tracestate` columns. Unset keys follow the
    /// table (the column of the header's name, when present), unless an
    /// extra header or header placement already writes that header: such a
    /// configuration keeps working as before. A column set explicitly must
    /// exist, and refuses such a second writer of its header.
    pub fn trace_columns(&self) -> Result<(TraceColumn, TraceColumn), ConfigError> {
        use super::trace::{TRACEPARENT, TRACESTATE};
        let written = self.header_columns()?;
        let taken = |header: &str| {
            written
                .iter()
                .find(|(name, _)| name == header)
                .map(|(_, column)| column.clone())
        };
        let resolve = |key: &'static str,
                       value: &Option<String>,
                       header: &'static str|
         -> Result<TraceColumn, ConfigError> {
            match value.as_deref() {
                Some("") => Ok(TraceColumn::Off),
                None if taken(header).is_some() => Ok(TraceColumn::Off),
                None => Ok(TraceColumn::IfPresent(header.to_owned())),
                Some(column) => match taken(header) {
                    Some(other) => Err(ConfigError::new(
                        key,
                        column,
                        format!(
                            "no other writer of the header {header}: column {other} is already \
                             written as {header} by outbox.extra_headers or \
                             outbox.additional_placement; remove that entry, or set {key} = \"\" \
                             to copy {other} unchecked as before"
                        ),
                    )),
                    None => Ok(TraceColumn::Required {
                        key,
                        column: column.to_owned(),
                    }),
                },
            }
        };
        let parent = resolve("outbox.trace_column", &self.trace_column, TRACEPARENT)?;
        if parent == TraceColumn::Off {
            return match self.tracestate_column.as_deref() {
                None | Some("") => Ok((TraceColumn::Off, TraceColumn::Off)),
                Some(column) => Err(ConfigError::new(
                    "outbox.tracestate_column",
                    column,
                    "\"\" while outbox.trace_column is off: a tracestate travels only with its \
                     traceparent",
                )),
            };
        }
        let state = resolve(
            "outbox.tracestate_column",
            &self.tracestate_column,
            TRACESTATE,
        )?;
        if let (Some(p), TraceColumn::Required { column, .. }) = (parent.column(), &state)
            && p == column
        {
            return Err(ConfigError::new(
                "outbox.tracestate_column",
                column,
                "a column other than outbox.trace_column's",
            ));
        }
        Ok((parent, state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<OutboxSettings, toml::de::Error> {
        toml::from_str(toml_text)
    }

    #[test]
    fn the_debezium_layout_keeps_the_id_header_for_the_event_id() {
        // Another column under `id` is refused, naming the event id column.
        let e = parse(
            "layout = \"debezium\"\nextra_headers = [\"id\"]\n[columns]\nevent_id = \"event_id\"",
        )
        .unwrap()
        .validate()
        .unwrap_err();
        assert_eq!(e.key, "outbox.extra_headers", "{e}");
        assert!(e.to_string().contains("outbox.columns.event_id"), "{e}");
        // The event id column itself is the `id` header, written once.
        let s = parse("layout = \"debezium\"\nextra_headers = [\"id\"]").unwrap();
        s.validate().unwrap();
        assert_eq!(s.header_columns().unwrap(), Vec::new());
        // The seed layout has no `id` header: a column of that name may be one.
        parse("extra_headers = [\"id\"]")
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn empty_section_gives_documented_defaults() {
        let s = parse("").unwrap();
        assert_eq!(s, OutboxSettings::default());
        assert_eq!(s.table, "public.outbox_events");
        assert_eq!(s.topic, "outbox.event.{aggregate_type}");
        assert_eq!(s.layout, Layout::Seed);
        assert!(s.extra_headers.is_empty());
        assert_eq!(s.message_prefix, "");
        assert_eq!(s.on_poison, PoisonPolicy::Fail);
        assert_eq!(s.dead_letter_topic, "outbox.dlq");
        assert_eq!(s.max_record_bytes, 1_000_000);
        s.validate().unwrap();
        assert_eq!(
            s.table_name().unwrap(),
            TableName {
                schema: "public".into(),
                name: "outbox_events".into()
            }
        );
        assert_eq!(
            s.column_names().unwrap(),
            ColumnNames {
                event_id: "event_id".into(),
                aggregate_type: "aggregate_type".into(),
                aggregate_id: "aggregate_id".into(),
                aggregate_sequence: Some("aggregate_sequence".into()),
                event_type: "event_type".into(),
                schema_version: Some("schema_version".into()),
                payload: "payload".into(),
            }
        );
    }

    #[test]
    fn debezium_preset_and_overrides() {
        let s = parse("layout = \"debezium\"\ntable = \"outbox\"\n").unwrap();
        s.validate().unwrap();
        assert_eq!(
            s.column_names().unwrap(),
            ColumnNames {
                event_id: "id".into(),
                aggregate_type: "aggregatetype".into(),
                aggregate_id: "aggregateid".into(),
                aggregate_sequence: None,
                event_type: "type".into(),
                schema_version: None,
                payload: "payload".into(),
            }
        );
        let s = parse(
            "layout = \"debezium\"\n[columns]\naggregate_sequence = \"seq\"\npayload = \"body\"\n",
        )
        .unwrap();
        let c = s.column_names().unwrap();
        assert_eq!(c.aggregate_sequence.as_deref(), Some("seq"));
        assert_eq!(c.payload, "body");
        assert_eq!(c.event_id, "id");
        // "" turns an optional column off in the seed layout.
        let s = parse("[columns]\nschema_version = \"\"\n").unwrap();
        assert_eq!(s.column_names().unwrap().schema_version, None);
    }

    /// `{event_type}` sends one aggregate's events to several topics, where
    /// Kafka keeps no order between them: refused unless the user opts in.
    #[test]
    fn event_type_in_the_topic_needs_an_explicit_opt_in() {
        for topic in ["{event_type}", "outbox.{aggregate_type}.{event_type}"] {
            let s = parse(&format!("topic = \"{topic}\"")).unwrap();
            let e = s.validate().unwrap_err();
            assert_eq!(e.key, "outbox.topic", "{e}");
            let text = e.to_string();
            assert!(text.contains(topic), "{text}");
            assert!(
                text.contains("order") && text.contains("outbox.allow_split_aggregates = true"),
                "{text}"
            );
            let s = parse(&format!(
                "topic = \"{topic}\"\nallow_split_aggregates = true"
            ))
            .unwrap();
            s.validate().unwrap();
        }
        parse("topic = \"{table}.{aggregate_type}\"")
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn full_example_parses() {
        let s = parse(
            r#"
table = "app.outbox_events"
topic = "{table}.{aggregate_type}.{event_type}"
allow_split_aggregates = true
layout = "seed"
extra_headers = ["occurred_at", "trace_id"]
message_prefix = "outbox"
on_poison = "dead-letter"
dead_letter_topic = "outbox.dead"
max_record_bytes = 500000
[columns]
event_id = "id"
"#,
        )
        .unwrap();
        s.validate().unwrap();
        assert_eq!(s.on_poison, PoisonPolicy::DeadLetter);
        assert_eq!(
            s.topic_template()
                .unwrap()
                .render("order", "created")
                .unwrap(),
            "outbox_events.order.created"
        );
    }

    #[test]
    fn table_names_follow_sql_identifier_rules() {
        let t = |s: &str| parse_table(s);
        assert_eq!(
            t("Outbox").unwrap(),
            TableName {
                schema: "public".into(),
                name: "outbox".into()
            }
        );
        assert_eq!(
            t("App.T_1$").unwrap(),
            TableName {
                schema: "app".into(),
                name: "t_1$".into()
            }
        );
        assert_eq!(
            t("\"My Schema\".\"Out\"\"box\"").unwrap(),
            TableName {
                schema: "My Schema".into(),
                name: "Out\"box".into()
            }
        );
        assert_eq!(t("\"a.b\"").unwrap().name, "a.b");
        for bad in [
            "", ".", "a.", ".a", "a.b.c", "a b", "1abc", "\"open", "\"\"", "a-b", "a.\"b\"x",
        ] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
        assert_eq!(
            t("\"My Schema\".\"T\"").unwrap().quoted(),
            "\"My Schema\".\"T\""
        );
    }

    fn config_err(toml_text: &str) -> ConfigError {
        match parse(toml_text) {
            Ok(s) => s.validate().expect_err(toml_text),
            Err(e) => panic!("{toml_text:?} should parse and fail validation, got {e}"),
        }
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        let cases = [
            ("table = \"a b\"", "outbox.table", "a b"),
            (
                "topic = \"outbox/{aggregate_type}\"",
                "outbox.topic",
                "outbox/{aggregate_type}",
            ),
            (
                "topic = \"outbox.{aggregate}\"",
                "outbox.topic",
                "outbox.{aggregate}",
            ),
            ("topic = \"\"", "outbox.topic", ""),
            ("[columns]\nevent_id = \"\"", "outbox.columns.event_id", ""),
            (
                "[columns]\naggregate_type = \"\"",
                "outbox.columns.aggregate_type",
                "",
            ),
            (
                "[columns]\naggregate_id = \"\"",
                "outbox.columns.aggregate_id",
                "",
            ),
            (
                "[columns]\nevent_type = \"\"",
                "outbox.columns.event_type",
                "",
            ),
            ("[columns]\npayload = \"\"", "outbox.columns.payload", ""),
            ("extra_headers = [\"\"]", "outbox.extra_headers", ""),
            ("extra_headers = [\"lsn\"]", "outbox.extra_headers", "lsn"),
            (
                "extra_headers = [\"a\", \"a\"]",
                "outbox.extra_headers",
                "a",
            ),
            (
                "dead_letter_topic = \"..\"",
                "outbox.dead_letter_topic",
                "..",
            ),
            ("max_record_bytes = 0", "outbox.max_record_bytes", "0"),
            (
                "max_record_bytes = 1000000001",
                "outbox.max_record_bytes",
                "1000000001",
            ),
        ];
        for (text, key, value) in cases {
            let e = config_err(text);
            assert_eq!((e.key.as_str(), e.value.as_str()), (key, value), "{text}");
            assert!(!e.allowed.is_empty());
            assert!(
                e.to_string()
                    .starts_with(&format!("invalid {key} = {value:?}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn enum_values_and_unknown_keys_are_rejected_at_parse_time() {
        let e = parse("layout = \"kafka-connect\"").unwrap_err().to_string();
        assert!(
            e.contains("invalid outbox.layout = \"kafka-connect\": one of \"seed\", \"debezium\""),
            "{e}"
        );
        let e = parse("on_poison = \"skip\"").unwrap_err().to_string();
        assert!(
            e.contains("invalid outbox.on_poison = \"skip\": one of \"fail\", \"dead-letter\""),
            "{e}"
        );
        let e = parse("topics = \"x\"").unwrap_err().to_string();
        assert!(e.contains("topics"), "{e}");
        let e = parse("[columns]\nsequence = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sequence"), "{e}");
    }
}

/// Issue 34: a header placement (or extra header) that names a standard
/// header maps to it when that header carries the same column, and is
/// refused, saying so, when it would put another column under that name.
#[cfg(test)]
mod standard_header_names {
    use super::*;
    use crate::outbox::mapper::{ChangeContext, OutboxMapper};
    use crate::pg::{Lsn, PgTimestamp};
    use crate::pgoutput::{ColumnValue, Relation, TupleData};
    use bytes::Bytes;

    fn parse(toml_text: &str) -> OutboxSettings {
        toml::from_str(toml_text).unwrap_or_else(|e| panic!("{toml_text}: {e}"))
    }

    /// The issue's placement line on the seed's table, as Debezium users of
    /// that table write it (the columns named as the standard headers).
    const ISSUE_LINE: &str = r#"
layout = "debezium"
additional_placement = ["event_type:header:event_type", "aggregate_sequence:header:aggregate_sequence", "schema_version:header:schema_version"]
[columns]
event_id = "event_id"
aggregate_type = "aggregate_type"
aggregate_id = "aggregate_id"
event_type = "event_type"
aggregate_sequence = "aggregate_sequence"
schema_version = "schema_version"
"#;

    #[test]
    fn a_placement_under_a_standard_header_of_its_own_column_is_that_header() {
        let s = parse(ISSUE_LINE);
        s.validate().unwrap();
        assert_eq!(s.header_columns().unwrap(), Vec::new(), "no extra header");
        // The placement asks for the header: written even when outbox.headers omits it.
        let mut lean = s.clone();
        lean.headers = vec!["event_id".into()];
        let on = lean.standard_headers().unwrap();
        assert!(on.event_type && on.aggregate_sequence && on.schema_version);
        assert!(!on.aggregate_type && !on.aggregate_id && !on.lsn);
        // The same for the seed layout, and for extra_headers naming a column
        // that its standard header carries.
        let seed = parse(
            r#"additional_placement = ["event_type:header:event_type"]
extra_headers = ["aggregate_sequence"]"#,
        );
        seed.validate().unwrap();
        assert_eq!(seed.header_columns().unwrap(), Vec::new());
        // The debezium layout's `id` header carries the event id column.
        let id = parse("layout = \"debezium\"\nadditional_placement = [\"id:header\"]");
        id.validate().unwrap();
        assert_eq!(id.header_columns().unwrap(), Vec::new());
        assert_eq!(
            id.standard_header_source("id", &id.column_names().unwrap()),
            Some(StandardSource::Column {
                key: "outbox.columns.event_id",
                column: "id".into()
            })
        );
    }

    fn relation(columns: &[&str]) -> Relation {
        Relation::of_text(1, "public", "outbox_events", columns)
    }

    /// The record of the issue's configuration carries each header once,
    /// with the values Debezium's placements give them.
    #[test]
    fn the_issue_placements_write_each_header_once() {
        let m = OutboxMapper::new(&parse(ISSUE_LINE)).unwrap();
        // The migration's columns but occurred_at.
        let rel = relation(&crate::outbox::mapper::SEED_COLS[..7]);
        let bound = m.bind(&rel).unwrap();
        let text = |s: &str| ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()));
        let row = TupleData {
            columns: vec![
                text("406c07f3-26f0-4eea-a50c-109940064b8f"),
                text("order"),
                text("1"),
                text("7"),
                text("OrderCreated"),
                text("2"),
                text("{}"),
            ],
        };
        let ctx = ChangeContext {
            lsn: Lsn::new(0x16_B374_D848),
            commit_time: PgTimestamp(1_000_000),
        };
        let e = m.map_insert(&bound, &row, &ctx).unwrap();
        let names: Vec<&str> = e.headers.iter().map(|(k, _)| k.as_ref()).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            names.len(),
            "a header written twice: {names:?}"
        );
        let value = |name: &str| {
            e.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8(v.to_vec()).unwrap())
        };
        assert_eq!(
            value("id").as_deref(),
            Some("406c07f3-26f0-4eea-a50c-109940064b8f")
        );
        assert_eq!(value("event_type").as_deref(), Some("OrderCreated"));
        assert_eq!(value("aggregate_sequence").as_deref(), Some("7"));
        assert_eq!(value("schema_version").as_deref(), Some("2"));
    }

    #[test]
    fn another_column_under_a_standard_header_name_is_refused_saying_so() {
        let e = parse(
            "layout = \"debezium\"\nadditional_placement = [\"event_type:header:event_type\"]",
        )
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid outbox.additional_placement = \"event_type:header:event_type\": \
             event_type is a standard header and carries column type \
             (outbox.columns.event_type), not event_type: place event_type under a \
             header name of its own (event_type:header:event_type_column), or set \
             outbox.columns.event_type = \"event_type\" if event_type holds the event type"
        );
        let e = parse("additional_placement = [\"tenant:header:lsn\"]")
            .validate()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid outbox.additional_placement = \"tenant:header:lsn\": lsn is a \
             standard header, the event's WAL position, not a column: place tenant under \
             a header name of its own (tenant:header:tenant)"
        );
        let e = parse(
            "layout = \"debezium\"\nadditional_placement = [\"seq:header:aggregate_sequence\"]",
        )
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid outbox.additional_placement = \"seq:header:aggregate_sequence\": \
             aggregate_sequence is a standard header, written from the column that \
             outbox.columns.aggregate_sequence names, and none is set: set \
             outbox.columns.aggregate_sequence = \"seq\" to write seq as that header, \
             or place seq under a header name of its own (seq:header:seq)"
        );
    }
}

/// Every validation error of the `[outbox]` section, one test each (issue
/// 34): the message names the key and the rejected value, says what would
/// be accepted, and what it proposes is accepted, so that it cannot
/// contradict itself. Cases: table, topic (each template error, the
/// `{event_type}` opt-in), the required columns, extra headers, placements
/// (their syntax and the header names they may use), CloudEvents, route,
/// headers, dead-letter topic, record size, and the three enumerations.
#[cfg(test)]
mod messages {
    use super::*;

    /// `bad` fails validation with `key` = `value`; the message contains
    /// `proposal`, and `fixed` (the proposal applied) validates.
    fn check(bad: &str, key: &str, value: &str, proposal: &str, fixed: &str) {
        let settings: OutboxSettings =
            toml::from_str(bad).unwrap_or_else(|e| panic!("{bad:?} should parse: {e}"));
        let e = settings.validate().expect_err(bad);
        let text = e.to_string();
        assert_eq!((e.key.as_str(), e.value.as_str()), (key, value), "{text}");
        assert!(
            text.starts_with(&format!("invalid {key} = {value:?}: ")),
            "{text}"
        );
        assert!(text.contains(proposal), "{proposal:?} not in: {text}");
        assert_ne!(proposal, value, "the proposal is the refused value: {text}");
        let fixed_settings: OutboxSettings =
            toml::from_str(fixed).unwrap_or_else(|e| panic!("{fixed:?} should parse: {e}"));
        if let Err(again) = fixed_settings.validate() {
            panic!("{text}\nproposes {proposal:?}, but {fixed:?} is refused too: {again}");
        }
    }

    /// The enumerations are refused while parsing: the message lists the
    /// accepted values, the refused one is not among them, each listed one parses.
    fn check_enum<T: FromStr<Err = ConfigError>>(field: &str, value: &str, accepted: &[&str]) {
        let e = value.parse::<T>().err().expect(value);
        let text = e.to_string();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            (&*format!("outbox.{field}"), value)
        );
        let list: Vec<String> = accepted.iter().map(|a| format!("{a:?}")).collect();
        assert!(
            text.ends_with(&format!(": one of {}", list.join(", "))),
            "{text}"
        );
        assert!(!accepted.contains(&value));
        for a in accepted {
            a.parse::<T>()
                .unwrap_or_else(|e| panic!("{text}\nlists {a}, refused: {e}"));
        }
        let in_file = toml::from_str::<OutboxSettings>(&format!("{field} = {value:?}"))
            .unwrap_err()
            .to_string();
        assert!(in_file.contains(&text), "{in_file}");
    }

    macro_rules! refused {
        ($($name:ident: $bad:expr => $key:expr, $value:expr; $proposal:expr => $fixed:expr;)*) => {
            $(#[test] fn $name() { check($bad, $key, $value, $proposal, $fixed) })*
        };
    }

    refused! {
        table_not_sql: "table = \"a b\"" => "outbox.table", "a b";
            "schema.name" => "table = \"app.outbox\"";
        topic_illegal_character: "topic = \"outbox/{aggregate_type}\"" => "outbox.topic", "outbox/{aggregate_type}";
            "placeholders {aggregate_type}" => "topic = \"outbox.{aggregate_type}\"";
        topic_unknown_placeholder: "topic = \"outbox.{aggregate}\"" => "outbox.topic", "outbox.{aggregate}";
            "{aggregate_type}" => "topic = \"outbox.{aggregate_type}\"";
        topic_unclosed_brace: "topic = \"outbox.{aggregate_type\"" => "outbox.topic", "outbox.{aggregate_type";
            "{aggregate_type}" => "topic = \"outbox.{aggregate_type}\"";
        topic_stray_brace: "topic = \"outbox.}\"" => "outbox.topic", "outbox.}";
            "{aggregate_type}" => "topic = \"outbox.{aggregate_type}\"";
        topic_empty: "topic = \"\"" => "outbox.topic", "";
            "{aggregate_type}" => "topic = \"{aggregate_type}\"";
        topic_dot_dot: "topic = \"..\"" => "outbox.topic", "..";
            "{aggregate_type}" => "topic = \"outbox.{aggregate_type}\"";
        topic_event_type_without_opt_in: "topic = \"o.{event_type}\"" => "outbox.topic", "o.{event_type}";
            "outbox.allow_split_aggregates = true" => "topic = \"o.{event_type}\"\nallow_split_aggregates = true";
        column_event_id_empty: "[columns]\nevent_id = \"\"" => "outbox.columns.event_id", "";
            "a column name" => "[columns]\nevent_id = \"id\"";
        column_aggregate_type_empty: "[columns]\naggregate_type = \"\"" => "outbox.columns.aggregate_type", "";
            "a column name" => "[columns]\naggregate_type = \"t\"";
        column_aggregate_id_empty: "[columns]\naggregate_id = \"\"" => "outbox.columns.aggregate_id", "";
            "a column name" => "[columns]\naggregate_id = \"a\"";
        column_event_type_empty: "[columns]\nevent_type = \"\"" => "outbox.columns.event_type", "";
            "a column name" => "[columns]\nevent_type = \"type\"";
        column_payload_empty: "[columns]\npayload = \"\"" => "outbox.columns.payload", "";
            "a column name" => "[columns]\npayload = \"body\"";
        extra_header_empty: "extra_headers = [\"\"]" => "outbox.extra_headers", "";
            "a column name" => "extra_headers = [\"tenant\"]";
        extra_header_lsn: "extra_headers = [\"lsn\"]" => "outbox.extra_headers", "lsn";
            "lsn:header:lsn_column" => "additional_placement = [\"lsn:header:lsn_column\"]";
        extra_header_standard_of_another_column: "layout = \"debezium\"\nextra_headers = [\"event_type\"]" => "outbox.extra_headers", "event_type";
            "event_type:header:event_type_column" => "layout = \"debezium\"\nadditional_placement = [\"event_type:header:event_type_column\"]";
        extra_header_twice: "extra_headers = [\"a\", \"a\"]" => "outbox.extra_headers", "a";
            "extra_headers = [\"a\"]" => "extra_headers = [\"a\"]";
        placement_under_a_standard_header_of_another_column: "additional_placement = [\"tenant:header:event_type\"]" => "outbox.additional_placement", "tenant:header:event_type";
            "tenant:header:tenant" => "additional_placement = [\"tenant:header:tenant\"]";
        placement_under_a_standard_header_without_column: "layout = \"debezium\"\nadditional_placement = [\"seq:header:aggregate_sequence\"]" => "outbox.additional_placement", "seq:header:aggregate_sequence";
            "outbox.columns.aggregate_sequence = \"seq\"" => "layout = \"debezium\"\nadditional_placement = [\"seq:header:aggregate_sequence\"]\n[columns]\naggregate_sequence = \"seq\"";
        placement_under_lsn: "additional_placement = [\"tenant:header:lsn\"]" => "outbox.additional_placement", "tenant:header:lsn";
            "tenant:header:tenant" => "additional_placement = [\"tenant:header:tenant\"]";
        placement_under_debeziums_id: "layout = \"debezium\"\nadditional_placement = [\"tenant:header:id\"]" => "outbox.additional_placement", "tenant:header:id";
            "tenant:header:tenant" => "layout = \"debezium\"\nadditional_placement = [\"tenant:header:tenant\"]";
        placement_under_a_cloudevents_header: "additional_placement = [\"kind:header:ce_type\"]\n[cloudevents]\nenabled = true" => "outbox.additional_placement", "kind:header:ce_type";
            "kind:header:kind" => "additional_placement = [\"kind:header:kind\"]\n[cloudevents]\nenabled = true";
        placement_header_taken_by_an_extra_header: "extra_headers = [\"tenant\"]\nadditional_placement = [\"org:header:tenant\"]" => "outbox.additional_placement", "org:header:tenant";
            "org:header:org" => "extra_headers = [\"tenant\"]\nadditional_placement = [\"org:header:org\"]";
        placement_empty_part: "additional_placement = [\"x::y\"]" => "outbox.additional_placement", "x::y";
            "column:header[:alias]" => "additional_placement = [\"x:header:y\"]";
        placement_without_placement: "additional_placement = [\"x\"]" => "outbox.additional_placement", "x";
            "x:header" => "additional_placement = [\"x:header\"]";
        placement_unknown_placement: "additional_placement = [\"x:body\"]" => "outbox.additional_placement", "x:body";
            "column:envelope[:alias]" => "additional_placement = [\"x:envelope\"]";
        placement_too_many_parts: "additional_placement = [\"x:header:y:z\"]" => "outbox.additional_placement", "x:header:y:z";
            "column:header[:alias]" => "additional_placement = [\"x:header:y\"]";
        placement_envelope_payload: "additional_placement = [\"body:envelope:payload\"]" => "outbox.additional_placement", "body:envelope:payload";
            "body:envelope:body" => "additional_placement = [\"body:envelope:body\"]";
        placement_second_partition: "additional_placement = [\"a:partition\", \"b:partition\"]" => "outbox.additional_placement", "b:partition";
            "a:partition" => "additional_placement = [\"a:partition\"]";
        placement_envelope_member_twice: "additional_placement = [\"a:envelope:m\", \"b:envelope:m\"]" => "outbox.additional_placement", "b:envelope:m";
            "b:envelope:b" => "additional_placement = [\"a:envelope:m\", \"b:envelope:b\"]";
        cloudevents_source_with_space: "[cloudevents]\nenabled = true\nsource = \"/my service\"" => "outbox.cloudevents.source", "/my service";
            "/orders-service" => "[cloudevents]\nenabled = true\nsource = \"/orders-service\"";
        cloudevents_content_type_control: "[cloudevents]\nenabled = true\ncontent_type = \"a\\nb\"" => "outbox.cloudevents.content_type", "a\nb";
            "application/json" => "[cloudevents]\nenabled = true\ncontent_type = \"application/json\"";
        route_regex_invalid: "[route]\nregex = \"(\"" => "outbox.route.regex", "(";
            "(?<routedByValue>.*)" => "[route]\nregex = \"(?<routedByValue>.*)\"";
        route_replacement_empty: "[route]\nregex = \".*\"\nreplacement = \"\"" => "outbox.route.replacement", "";
            "outbox.event.${routedByValue}" => "[route]\nregex = \"(?<routedByValue>.*)\"\nreplacement = \"outbox.event.${routedByValue}\"";
        headers_unknown_name: "headers = [\"event_id\", \"trace\"]" => "outbox.headers", "[event_id,trace]";
            "event_id, event_type" => "headers = [\"event_id\", \"event_type\"]";
        headers_twice: "headers = [\"event_id\", \"lsn\", \"lsn\"]" => "outbox.headers", "[event_id,lsn,lsn]";
            "at most once" => "headers = [\"event_id\", \"lsn\"]";
        headers_without_event_id: "headers = [\"event_type\"]" => "outbox.headers", "[event_type]";
            "[\"event_id\", \"event_type\"]" => "headers = [\"event_id\", \"event_type\"]";
        dead_letter_topic_dot_dot: "dead_letter_topic = \"..\"" => "outbox.dead_letter_topic", "..";
            "outbox.dlq" => "dead_letter_topic = \"outbox.dlq\"";
        dead_letter_topic_illegal: "dead_letter_topic = \"dead letters\"" => "outbox.dead_letter_topic", "dead letters";
            "outbox.dlq" => "dead_letter_topic = \"outbox.dlq\"";
        max_record_bytes_zero: "max_record_bytes = 0" => "outbox.max_record_bytes", "0";
            "1 to 1000000000" => "max_record_bytes = 1";
        max_record_bytes_too_large: "max_record_bytes = 1000000001" => "outbox.max_record_bytes", "1000000001";
            "1 to 1000000000" => "max_record_bytes = 1000000000";
    }

    #[test]
    fn trace_columns_default_to_the_table_and_refuse_a_second_writer() {
        let parse = |text: &str| toml::from_str::<OutboxSettings>(text).unwrap();
        let columns = |text: &str| parse(text).trace_columns();
        let auto = |c: &str| TraceColumn::IfPresent(c.into());
        assert_eq!(
            columns("").unwrap(),
            (auto("traceparent"), auto("tracestate"))
        );
        assert_eq!(
            columns("trace_column = \"\"").unwrap(),
            (TraceColumn::Off, TraceColumn::Off)
        );
        assert_eq!(
            columns("trace_column = \"tp\"\ntracestate_column = \"\"").unwrap(),
            (
                TraceColumn::Required {
                    key: "outbox.trace_column",
                    column: "tp".into()
                },
                TraceColumn::Off
            )
        );
        // An extra header already writing traceparent keeps doing so.
        assert_eq!(
            columns("extra_headers = [\"traceparent\"]").unwrap(),
            (TraceColumn::Off, TraceColumn::Off)
        );
        let e = columns("extra_headers = [\"traceparent\"]\ntrace_column = \"tp\"").unwrap_err();
        assert_eq!(e.key, "outbox.trace_column");
        let e = columns("trace_column = \"\"\ntracestate_column = \"ts\"").unwrap_err();
        assert_eq!(e.key, "outbox.tracestate_column");
        let e = columns("trace_column = \"t\"\ntracestate_column = \"t\"").unwrap_err();
        assert_eq!(e.key, "outbox.tracestate_column");
        // Set explicitly, a column is required (check and the start-up proof).
        let mapped = parse("trace_column = \"tp\"").mapped_columns().unwrap();
        let last = mapped.last().unwrap();
        assert_eq!(
            (last.key.as_str(), last.column.as_str()),
            ("outbox.trace_column", "tp")
        );
        let default = OutboxSettings::default().mapped_columns().unwrap();
        assert!(default.iter().all(|m| !m.column.starts_with("trace")));
    }

    #[test]
    fn layout_unknown() {
        check_enum::<Layout>("layout", "kafka-connect", &["seed", "debezium"]);
    }

    #[test]
    fn on_poison_unknown() {
        check_enum::<PoisonPolicy>("on_poison", "skip", &["fail", "dead-letter"]);
    }

    #[test]
    fn payload_format_unknown() {
        check_enum::<PayloadFormat>("payload_format", "json", &["as-stored", "json-string"]);
    }
}
