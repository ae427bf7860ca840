//! The `[outbox]` configuration section: which table, which columns, which topic,
//! what to do with rows that cannot be mapped.
//!
//! Every field has a default, so an empty `[outbox]` section describes the
//! seed's `public.outbox_events` table routed to `outbox.event.{aggregate_type}`.
//! Values that parse but are not allowed are reported by [`OutboxSettings::validate`]
//! as a [`ConfigError`] naming the key (`outbox.topic`), the value and what is allowed.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use super::cloudevents::{CLOUDEVENTS_HEADERS, CloudEvents, CloudEventsSettings};
use super::placement::{PayloadFormat, Placement, RouteSettings, parse_placements};
use super::topic::{self, TopicTemplate};

/// Largest `max_record_bytes` accepted: librdkafka's upper bound for `message.max.bytes`.
const MAX_RECORD_BYTES_LIMIT: usize = 1_000_000_000;

/// Header names the mapper always writes; extra headers may not reuse them.
pub(crate) const STANDARD_HEADERS: [&str; 7] = [
    "event_id",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "aggregate_sequence",
    "schema_version",
    "lsn",
];

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
    /// standard headers. A NULL value omits that header. Default: none.
    pub extra_headers: Vec<String>,
    /// Logical decoding messages (`pg_logical_emit_message(true, prefix, envelope)`)
    /// with exactly this prefix are events too. Default `""`: off.
    pub message_prefix: String,
    /// What a row that cannot be mapped gets: `fail` (default) or `dead-letter`.
    pub on_poison: PoisonPolicy,
    /// Topic for dead-lettered rows when `on_poison = "dead-letter"`. Default `outbox.dlq`.
    pub dead_letter_topic: String,
    /// Largest record (topic + key + value + headers) published; a larger row is poison.
    /// Default 1000000 (Kafka's default `message.max.bytes` is about this size).
    pub max_record_bytes: usize,
    /// `[outbox.cloudevents]`: CloudEvents headers (binary mode). Default off.
    pub cloudevents: CloudEventsSettings,
    /// Debezium's `table.fields.additional.placement` entries:
    /// `column:header[:alias]`, `column:envelope[:alias]`, `column:partition`.
    /// Default none.
    pub additional_placement: Vec<String>,
    /// The record value: `as-stored` (default) or `json-string`.
    pub payload_format: PayloadFormat,
    /// `[outbox.route]`: Debezium's topic regex on the aggregate type. Default off.
    pub route: RouteSettings,
    /// The standard headers to write, in any order (they go out in the fixed
    /// order). Default all of them; `event_id` is required. The lean set
    /// `["event_id", "event_type", "aggregate_sequence"]` suits consumers that
    /// read the aggregate type from the topic and its id from the key.
    pub headers: Vec<String>,
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
            max_record_bytes: 1_000_000,
            cloudevents: CloudEventsSettings::default(),
            additional_placement: Vec::new(),
            payload_format: PayloadFormat::AsStored,
            route: RouteSettings::default(),
            headers: STANDARD_HEADERS.iter().map(|h| h.to_string()).collect(),
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
        match s {
            "seed" => Ok(Layout::Seed),
            "debezium" => Ok(Layout::Debezium),
            _ => Err(ConfigError::new(
                "outbox.layout",
                s,
                "one of \"seed\", \"debezium\"",
            )),
        }
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
        match s {
            "fail" => Ok(PoisonPolicy::Fail),
            "dead-letter" => Ok(PoisonPolicy::DeadLetter),
            _ => Err(ConfigError::new(
                "outbox.on_poison",
                s,
                "one of \"fail\", \"dead-letter\"",
            )),
        }
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

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
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
        self.check_extra_headers()?;
        self.cloud_events()?;
        self.route.compile()?;
        self.standard_headers()?;
        topic::validate_topic_name(&self.dead_letter_topic).map_err(|e| {
            ConfigError::new(
                "outbox.dead_letter_topic",
                &self.dead_letter_topic,
                format!("a Kafka topic name: {e}"),
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

    /// `outbox.headers` checked: standard names, each once, `event_id` among them.
    pub(crate) fn standard_headers(&self) -> Result<StandardHeaders, ConfigError> {
        let list = self.headers.join(",");
        for (i, h) in self.headers.iter().enumerate() {
            if !STANDARD_HEADERS.contains(&h.as_str()) || self.headers[..i].contains(h) {
                return Err(ConfigError::new(
                    "outbox.headers",
                    format!("[{list}]"),
                    format!("each of {} at most once", STANDARD_HEADERS.join(", ")),
                ));
            }
        }
        let has = |name: &str| self.headers.iter().any(|h| h == name);
        if !has("event_id") {
            return Err(ConfigError::new(
                "outbox.headers",
                format!("[{list}]"),
                "a list with event_id: every record carries its immutable event id, \
                 which consumers dedupe on",
            ));
        }
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

    /// The extra headers, (header name, column), from `extra_headers` and the
    /// header placements, checked against the headers the mapper writes.
    pub(crate) fn header_columns(&self) -> Result<Vec<(String, String)>, ConfigError> {
        let mut out: Vec<(String, String, &'static str)> = self
            .extra_headers
            .iter()
            .map(|h| (h.clone(), h.clone(), "outbox.extra_headers"))
            .collect();
        for p in self.placements()? {
            if let Placement::Header { column, name } = p {
                out.push((name, column, "outbox.additional_placement"));
            }
        }
        for (i, (name, _, key)) in out.iter().enumerate() {
            let problem = if name.is_empty() {
                Some("a column name, not empty".to_owned())
            } else if STANDARD_HEADERS.contains(&name.as_str()) {
                Some(format!(
                    "a header name that is not a standard header ({})",
                    STANDARD_HEADERS.join(", ")
                ))
            } else if self.layout == Layout::Debezium && name == "id" {
                Some(
                    "a header other than `id`: the debezium layout writes the event id as the \
                     `id` header, as Debezium's Outbox Event Router does"
                        .to_owned(),
                )
            } else if self.cloudevents.enabled && CLOUDEVENTS_HEADERS.contains(&name.as_str()) {
                Some(format!(
                    "a header name that is not a CloudEvents header ({})",
                    CLOUDEVENTS_HEADERS.join(", ")
                ))
            } else if out[..i].iter().any(|(n, _, _)| n == name) {
                Some("each header at most once".to_owned())
            } else {
                None
            };
            if let Some(allowed) = problem {
                return Err(ConfigError::new(*key, name, allowed));
            }
        }
        Ok(out.into_iter().map(|(n, c, _)| (n, c)).collect())
    }

    fn check_extra_headers(&self) -> Result<(), ConfigError> {
        self.header_columns().map(|_| ())
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
        let e = parse("layout = \"debezium\"\nextra_headers = [\"id\"]")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("outbox.extra_headers"), "{e}");
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
