//! `outbox-cdc import-debezium`: a Debezium PostgreSQL connector configured
//! with the Outbox Event Router, turned into an equivalent outbox-cdc
//! configuration, with every Debezium setting that has no equivalent named
//! and explained.
//!
//! Input: the connector's Kafka Connect JSON (`{"name": ..., "config": {...}}`
//! or the bare config object) or a `.properties` file. Output: TOML text that
//! [`Config::from_sources`](crate::config::Config::from_sources) accepts, and
//! the notes. Pure: no file, database or broker is touched.
//!
//! Defaults are Debezium's where Debezium has one (slot `debezium`,
//! publication `dbz_publication`, the router's column names and topic
//! `outbox.event.${routedByValue}`), so a connector that relied on them maps
//! to the same slot, publication, columns and topics. The slot is the one
//! Debezium consumed: started with no stored offset on an existing slot,
//! outbox-cdc resumes at its `confirmed_flush_lsn` (docs/migrating-from-debezium.md).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;

use crate::outbox::settings::{ColumnOverrides, StandardSource};
use crate::outbox::{Layout, OutboxSettings};

/// The router Debezium's outbox pattern uses.
const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";

/// The router's default `route.topic.regex`: the whole value.
const DEFAULT_ROUTE_REGEX: &str = "(?<routedByValue>.*)";

/// The router's topic placeholder for the routing column's value.
const ROUTED_BY_VALUE: &str = "${routedByValue}";

/// The table.fields.additional.placement key, for notes.
const PLACEMENT_KEY: &str = "table.fields.additional.placement";

/// Why a file cannot be imported at all.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImportError {
    #[error(
        "not a Kafka Connect connector config ({{\"name\": ..., \"config\": {{...}}}}, the bare config object, or a .properties file): {0}"
    )]
    Syntax(String),
    #[error(
        "connector.class = {0:?}: only io.debezium.connector.postgresql.PostgresConnector (Debezium's PostgreSQL connector) can be imported"
    )]
    NotPostgres(String),
    #[error(
        "transforms = {transforms:?}: none of them has transforms.<name>.type = {EVENT_ROUTER}; outbox-cdc relays an outbox table as the Outbox Event Router does, a connector with it can be imported, a plain Debezium change stream has no equivalent"
    )]
    NoEventRouter { transforms: String },
}

/// A Debezium setting the import did not carry over as it is, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub key: String,
    pub value: String,
    pub why: String,
}

/// What an import produced.
#[derive(Debug)]
pub struct Imported {
    /// The outbox-cdc configuration (TOML).
    pub toml: String,
    /// Settings carried over differently or not at all, in key order.
    pub notes: Vec<Note>,
    /// The secrets not written to the file, in key order: each has to be
    /// given in the environment.
    pub withheld: Vec<Withheld>,
}

/// A secret the import did not write, and where to give it instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    /// The Debezium key.
    pub key: String,
    /// The environment variable that takes it.
    pub instead: String,
}

/// Reads a connector config: JSON when it starts with `{`, `.properties` otherwise.
pub fn parse_connector(text: &str) -> Result<BTreeMap<String, String>, ImportError> {
    if text.trim_start().starts_with('{') {
        parse_json(text)
    } else {
        Ok(parse_properties(text))
    }
}

fn parse_json(text: &str) -> Result<BTreeMap<String, String>, ImportError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| ImportError::Syntax(e.to_string()))?;
    let object = match value.get("config") {
        Some(config) => config,
        None => &value,
    };
    let Some(map) = object.as_object() else {
        return Err(ImportError::Syntax(
            "expected a JSON object, or one with a \"config\" object".into(),
        ));
    };
    // Kafka Connect's REST shape keeps the connector's name beside its config.
    let name = value
        .get("name")
        .and_then(|n| n.as_str())
        .filter(|_| !map.contains_key("name"))
        .map(|n| ("name".to_owned(), n.to_owned()));
    Ok(map
        .iter()
        .filter_map(|(k, v)| {
            let text = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                _ => return None,
            };
            Some((k.clone(), text))
        })
        .chain(name)
        .collect())
}

/// Java `.properties`: `key=value`, `key: value` or `key value`; `#` and `!`
/// start comments; a trailing backslash continues the line.
fn parse_properties(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim_start();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!'))
        {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        let entry = std::mem::take(&mut pending);
        let split = entry.find(['=', ':', ' ', '\t']);
        let (key, value) = match split {
            Some(i) => (
                &entry[..i],
                entry[i + 1..].trim_start_matches(['=', ':', ' ', '\t']),
            ),
            None => (entry.as_str(), ""),
        };
        out.insert(unescape(key.trim()), unescape(value.trim()));
    }
    out
}

/// `.properties` escapes: `\\` is a backslash, `\t` `\n` `\r` `\f` control
/// characters, any other escaped character stands for itself (`\:`, `\=`).
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// The connector's settings, each read at most once, and the notes.
struct Reader<'a> {
    config: &'a BTreeMap<String, String>,
    used: BTreeSet<String>,
    notes: Vec<Note>,
    withheld: Vec<Withheld>,
    /// `[kafka]` keys whose secret is withheld, with their variable.
    kafka_withheld: BTreeMap<String, String>,
}

impl Reader<'_> {
    /// The value of `key`, which counts as carried over (or noted) from now on.
    fn get(&mut self, key: &str) -> Option<String> {
        let v = self.config.get(key)?;
        self.used.insert(key.to_owned());
        Some(v.clone())
    }

    fn note(&mut self, key: &str, value: &str, why: impl Into<String>) {
        self.used.insert(key.to_owned());
        self.notes.push(Note {
            key: key.to_owned(),
            value: value.to_owned(),
            why: why.into(),
        });
    }

    /// `key`'s secret is not written: `instead` takes it (for `[kafka]`
    /// key `kafka`, which the file then names in a comment).
    fn withhold(&mut self, key: &str, kafka: Option<&str>, instead: &str) {
        self.withheld.push(Withheld {
            key: key.to_owned(),
            instead: instead.to_owned(),
        });
        if let Some(kafka) = kafka {
            self.kafka_withheld
                .insert(kafka.to_owned(), instead.to_owned());
        }
    }

    /// A value that becomes part of postgres.url: `default` in its place
    /// when it is a config provider reference (noted).
    fn url_part(&mut self, key: &str, default: &str) -> String {
        match self.get(key) {
            None => default.to_owned(),
            Some(v) => match reference(&v) {
                Some(source) => {
                    self.note(
                        key,
                        &v,
                        format!(
                            "{source}: outbox-cdc does not resolve Kafka Connect config \
                             providers; postgres.url has {default:?} in its place: give the \
                             whole URL as OUTBOX_CDC__POSTGRES__URL"
                        ),
                    );
                    default.to_owned()
                }
                None => v,
            },
        }
    }
}

/// A Kafka Connect config provider reference (`${provider:[path:]key}`) in
/// `value`, described as where Kafka Connect read the value from.
/// `${routedByValue}` and other names without a colon are not references.
fn reference(value: &str) -> Option<String> {
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let body = &rest[start + 2..];
        let Some(end) = body.find('}') else {
            break;
        };
        let inner = &body[..end];
        if let Some((provider, path)) = inner.split_once(':')
            && !provider.is_empty()
            && provider
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Some(match (provider, path.rsplit_once(':')) {
                ("env", _) => format!(
                    "a config provider reference (${{{inner}}}: the Kafka Connect \
                     worker's environment variable {path})"
                ),
                (_, Some((file, key))) => format!(
                    "a config provider reference (${{{inner}}}: key {key} of {file}, read by \
                     the Kafka Connect worker's {provider} provider)"
                ),
                _ => format!(
                    "a config provider reference (${{{inner}}}: read by the Kafka Connect \
                     worker's {provider} provider)"
                ),
            });
        }
        rest = &body[end..];
    }
    None
}

/// How a header placement's column and name would be written.
fn header_entry(entry: &str) -> Option<(&str, &str)> {
    let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
    match parts.as_slice() {
        [column, "header"] => Some((column, column)),
        [column, "header", name] => Some((column, name)),
        _ => None,
    }
}

/// Builds the outbox-cdc configuration from a parsed connector config.
pub fn import(config: &BTreeMap<String, String>) -> Result<Imported, ImportError> {
    let mut r = Reader {
        config,
        used: BTreeSet::new(),
        notes: Vec::new(),
        withheld: Vec::new(),
        kafka_withheld: BTreeMap::new(),
    };

    let class = r.get("connector.class").unwrap_or_default();
    if !class.ends_with("PostgresConnector") {
        return Err(ImportError::NotPostgres(class));
    }
    let transforms = r.get("transforms").unwrap_or_default();
    let router = transforms
        .split(',')
        .map(str::trim)
        .find(|name| {
            config
                .get(&format!("transforms.{name}.type"))
                .map(String::as_str)
                == Some(EVENT_ROUTER)
        })
        .ok_or_else(|| ImportError::NoEventRouter {
            transforms: transforms.clone(),
        })?
        .to_owned();
    let t = |key: &str| format!("transforms.{router}.{key}");
    r.get(&t("type"));

    // [postgres]
    let host = r.url_part("database.hostname", "localhost");
    let port = r.url_part("database.port", "5432");
    let user = r.url_part("database.user", "postgres");
    let dbname = r.url_part("database.dbname", "postgres");
    let mut query = Vec::new();
    for (key, param) in [
        ("database.sslmode", "sslmode"),
        ("database.sslrootcert", "sslrootcert"),
    ] {
        if let Some(v) = r.get(key) {
            match reference(&v) {
                Some(source) => r.note(
                    key,
                    &v,
                    format!(
                        "{source}: outbox-cdc does not resolve Kafka Connect config providers; \
                         postgres.url has no {param}: give the whole URL as \
                         OUTBOX_CDC__POSTGRES__URL"
                    ),
                ),
                None => query.push(format!("{param}={}", url_escape(&v))),
            }
        }
    }
    let mut url = format!(
        "postgres://{}@{}:{}/{}",
        url_escape(&user),
        host,
        port,
        url_escape(&dbname)
    );
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    if let Some(pw) = r.get("database.password") {
        let why = match reference(&pw) {
            Some(source) => format!(
                "{source}: not written to the file: give the password as PGPASSWORD, or inside \
                 OUTBOX_CDC__POSTGRES__URL"
            ),
            None => "not written to the file: give it as PGPASSWORD, or inside \
                     OUTBOX_CDC__POSTGRES__URL"
                .to_owned(),
        };
        r.note("database.password", &pw, why);
        r.withhold("database.password", None, "PGPASSWORD");
    }
    let slot = r.get("slot.name").unwrap_or_else(|| "debezium".into());
    let publication = r
        .get("publication.name")
        .unwrap_or_else(|| "dbz_publication".into());
    let autocreate = r
        .get("publication.autocreate.mode")
        .unwrap_or_else(|| "all_tables".into());
    let create_publication = autocreate != "disabled";
    if create_publication {
        r.note(
            "publication.autocreate.mode",
            &autocreate,
            "outbox-cdc creates a missing publication FOR TABLE the outbox (inserts only), \
             not for all tables; an existing publication is used as it is, once proven to \
             carry the outbox",
        );
    }
    if let Some(plugin) = r.get("plugin.name")
        && plugin != "pgoutput"
    {
        r.note(
            "plugin.name",
            &plugin,
            "outbox-cdc decodes pgoutput only: create a new slot with pgoutput (set \
             postgres.slot to a new name; the old slot is then Debezium's to drop)",
        );
    }

    // [outbox]
    let include_key = if config.contains_key("table.include.list") {
        "table.include.list"
    } else {
        "table.whitelist"
    };
    let include = r.get(include_key);
    let table = match include.as_deref().map(|l| {
        l.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
    }) {
        Some(tables) if tables.len() == 1 => unregex(tables[0]),
        Some(tables) => {
            r.note(
                include_key,
                &tables.join(","),
                "several tables: outbox-cdc relays one outbox table per connector; outbox.table \
                 is set to the first, run one connector (one slot) per outbox table",
            );
            tables
                .first()
                .map(|t| unregex(t))
                .unwrap_or_else(|| "public.outbox".into())
        }
        None => {
            r.note(
                "table.include.list",
                "",
                "not set: outbox.table is set to public.outbox, Debezium's usual name; check it",
            );
            "public.outbox".into()
        }
    };

    // The columns the router reads, where they differ from Debezium's defaults
    // (`table.field.event.type` is Debezium 1.x's).
    let mut columns = ColumnOverrides::default();
    for (key, default) in [
        ("table.field.event.id", "id"),
        ("table.field.event.key", "aggregateid"),
        ("route.by.field", "aggregatetype"),
        ("table.field.event.type", "type"),
        ("table.field.event.payload", "payload"),
    ] {
        let Some(column) = r.get(&t(key)).filter(|c| c != default) else {
            continue;
        };
        let slot = match key {
            "table.field.event.id" => &mut columns.event_id,
            "table.field.event.key" => &mut columns.aggregate_id,
            "route.by.field" => &mut columns.aggregate_type,
            "table.field.event.type" => &mut columns.event_type,
            _ => &mut columns.payload,
        };
        *slot = Some(column);
    }
    let event_type_set = config.contains_key(&t("table.field.event.type"));

    let placements = import_placements(&mut r, &t(PLACEMENT_KEY), &mut columns, event_type_set);

    let replacement = r
        .get(&t("route.topic.replacement"))
        .unwrap_or_else(|| format!("outbox.event.{ROUTED_BY_VALUE}"));
    let regex = r
        .get(&t("route.topic.regex"))
        .filter(|re| re != DEFAULT_ROUTE_REGEX);
    // The default regex is the whole value: a template says the same. Any
    // other regex (or a replacement with other groups, or Java's `\`
    // escapes, which [outbox.route] reads as Debezium does) goes to
    // [outbox.route].
    let (topic, route) = match regex {
        None if !replacement
            .replace(ROUTED_BY_VALUE, "")
            .contains(['$', '\\']) =>
        {
            (
                replacement.replace(ROUTED_BY_VALUE, "{aggregate_type}"),
                None,
            )
        }
        regex => (
            "outbox.event.{aggregate_type}".to_owned(),
            Some((
                regex.unwrap_or_else(|| DEFAULT_ROUTE_REGEX.to_owned()),
                replacement.clone(),
            )),
        ),
    };
    // What Java's replacement syntax refuses, Debezium's router refuses at
    // the first record: noted, left out, so that the file still loads.
    let route = match route {
        Some((regex, replacement)) => {
            let settings = crate::outbox::RouteSettings {
                regex: regex.clone(),
                replacement: replacement.clone(),
            };
            match settings.compile() {
                Ok(_) => Some((regex, replacement)),
                Err(e) => {
                    let (key, value) = if e.key == "outbox.route.regex" {
                        (t("route.topic.regex"), regex)
                    } else {
                        (t("route.topic.replacement"), replacement)
                    };
                    r.note(
                        &key,
                        &value,
                        format!(
                            "{e}. [outbox.route] is left out and outbox.topic is \
                             Debezium's default: fix it, then set [outbox.route]"
                        ),
                    );
                    None
                }
            }
        }
        None => None,
    };
    let expand = r
        .get(&t("table.expand.json.payload"))
        .is_some_and(|v| v == "true");
    if expand {
        r.note(
            &t("table.expand.json.payload"),
            "true",
            "the value is the payload column's JSON as PostgreSQL sends it: the same document \
             Debezium expands, not necessarily the same bytes (spacing, key order of json)",
        );
    }
    let payload_format = converters(&mut r, expand);
    if let Some(ts) = r.get(&t("table.field.event.timestamp")) {
        r.note(
            &t("table.field.event.timestamp"),
            &ts,
            "the record timestamp is always the transaction's commit time",
        );
    }
    if let Some(v) = r.get(&t("route.tombstone.on.empty.payload")) {
        r.note(
            &t("route.tombstone.on.empty.payload"),
            &v,
            "outbox-cdc writes no tombstones: a row whose payload is NULL cannot be published \
             and is a poison row (outbox.on_poison); an empty text payload is an empty value",
        );
    }
    if let Some(v) = r.get(&t("table.fields.additional.error.on.missing"))
        && v != "true"
    {
        r.note(
            &t("table.fields.additional.error.on.missing"),
            &v,
            "a placed column missing from the outbox table always stops outbox-cdc (and \
             `check` reports it), as with Debezium's default `true`",
        );
    }
    for key in ["predicate", "negate"] {
        if let Some(v) = r.get(&t(key)) {
            r.note(
                &t(key),
                &v,
                "outbox-cdc reads only the outbox table, so no predicate is needed to keep \
                 other records from the router",
            );
        }
    }
    if let Some(v) = r.get("tombstones.on.delete") {
        r.note(
            "tombstones.on.delete",
            &v,
            "outbox-cdc publishes inserts only: deleting an outbox row publishes nothing \
             (no delete event, no tombstone)",
        );
    }

    // [kafka]
    let kafka = import_kafka(&mut r);

    // [monitor]
    let heartbeat = r.get("heartbeat.interval.ms");

    let consumed = ["name", "tasks.max"];
    for (key, value) in config {
        if r.used.contains(key) || consumed.contains(&key.as_str()) {
            continue;
        }
        let why = explain_unmapped(key, &router);
        r.note(key, value, why);
    }
    let mut notes = r.notes;
    notes.sort_by(|a, b| a.key.cmp(&b.key));
    let mut withheld = r.withheld;
    withheld.sort_by(|a, b| a.key.cmp(&b.key));

    let mut out = String::new();
    let name = config.get("name").cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "# outbox-cdc configuration imported from the Debezium connector {}\n\
         # by `outbox-cdc import-debezium`. Settings carried over differently or\n\
         # without an equivalent are listed at the end. Check it with\n\
         # `outbox-cdc check --config <this file>`.\n",
        quote(&name)
    );
    let _ = writeln!(out, "[postgres]");
    let _ = writeln!(out, "url = {}  # password: PGPASSWORD", quote(&url));
    let _ = writeln!(
        out,
        "slot = {}  # Debezium's slot: resumed at its confirmed_flush_lsn",
        quote(&slot)
    );
    let _ = writeln!(out, "publication = {}", quote(&publication));
    let _ = writeln!(out, "create_publication = {create_publication}");
    let _ = writeln!(out, "\n[outbox]");
    let _ = writeln!(out, "table = {}", quote(&table));
    let _ = writeln!(out, "layout = \"debezium\"");
    let _ = writeln!(out, "topic = {}", quote(&topic));
    let _ = writeln!(out, "payload_format = {}", quote(payload_format));
    if !placements.is_empty() {
        let list: Vec<String> = placements.iter().map(|h| quote(h)).collect();
        let _ = writeln!(out, "additional_placement = [{}]", list.join(", "));
    }
    let overrides = [
        ("event_id", &columns.event_id),
        ("aggregate_id", &columns.aggregate_id),
        ("aggregate_type", &columns.aggregate_type),
        ("event_type", &columns.event_type),
        ("aggregate_sequence", &columns.aggregate_sequence),
        ("schema_version", &columns.schema_version),
        ("payload", &columns.payload),
    ];
    if overrides.iter().any(|(_, c)| c.is_some()) {
        let _ = writeln!(out, "\n[outbox.columns]");
        for (ours, column) in overrides {
            if let Some(column) = column {
                let _ = writeln!(out, "{ours} = {}", quote(column));
            }
        }
    }
    if let Some((regex, replacement)) = &route {
        let _ = writeln!(out, "\n[outbox.route]");
        let _ = writeln!(out, "regex = {}", quote(regex));
        let _ = writeln!(out, "replacement = {}", quote(replacement));
    }
    let _ = writeln!(out, "\n[kafka]");
    for (k, v) in &kafka {
        let _ = writeln!(out, "{} = {}", quote(k), quote(v));
    }
    for (k, env) in &r.kafka_withheld {
        let _ = writeln!(
            out,
            "# {} is a secret, not written here: set {env}",
            quote(k)
        );
    }
    if let Some(ms) = heartbeat.as_deref().and_then(|v| v.parse::<u64>().ok()) {
        let _ = writeln!(out, "\n[monitor]\nheartbeat_interval_ms = {ms}");
    }
    if !notes.is_empty() {
        let _ = writeln!(
            out,
            "\n# Debezium settings carried over differently, or without an equivalent:"
        );
        for n in &notes {
            let why = n.why.replace('\n', " ");
            if !n.value.is_empty() && why.starts_with(&format!("{}: ", n.value)) {
                // A placement entry: the reason names it already.
                let _ = writeln!(out, "#   {}: {why}", n.key);
                continue;
            }
            let value = if secret(&n.key) {
                "[redacted]"
            } else {
                &n.value
            };
            let _ = writeln!(out, "#   {} = {}: {why}", n.key, value);
        }
    }
    Ok(Imported {
        toml: out,
        notes,
        withheld,
    })
}

/// `table.fields.additional.placement`: Debezium's syntax, taken as it is.
/// Debezium's router has no event type, sequence or schema version column:
/// a header placement under one of those standard names says which column
/// it is (unless `table.field.event.type` named the event type already).
/// Each entry is then checked as `outbox.additional_placement` checks it;
/// one that maps to a standard header is noted as already emitted, one that
/// cannot be carried over is left out and noted with the reason.
fn import_placements(
    r: &mut Reader<'_>,
    key: &str,
    columns: &mut ColumnOverrides,
    event_type_set: bool,
) -> Vec<String> {
    let entries: Vec<String> = r
        .get(key)
        .map(|p| {
            p.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let mut inferred: Vec<&str> = Vec::new();
    for entry in &entries {
        let Some((column, name)) = header_entry(entry) else {
            continue;
        };
        let slot = match name {
            "event_type" if !event_type_set => &mut columns.event_type,
            "aggregate_sequence" => &mut columns.aggregate_sequence,
            "schema_version" => &mut columns.schema_version,
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(column.to_owned());
            inferred.push(name);
        }
    }
    let mut probe = OutboxSettings {
        layout: Layout::Debezium,
        columns: columns.clone(),
        ..OutboxSettings::default()
    };
    let names = probe.column_names().ok();
    let mut kept: Vec<String> = Vec::new();
    for entry in &entries {
        probe.additional_placement = kept.iter().cloned().chain([entry.clone()]).collect();
        let extra = match probe.placements().and_then(|_| probe.header_columns()) {
            Ok(extra) => extra,
            Err(e) => {
                r.note(
                    key,
                    entry,
                    format!("{entry}: not imported, it has no equivalent: {}", e.allowed),
                );
                continue;
            }
        };
        let standard = header_entry(entry).filter(|(_, n)| !extra.iter().any(|(x, _)| x == n));
        if let (Some((column, name)), Some(names)) = (standard, &names) {
            let source = match probe.standard_header_source(name, names) {
                Some(StandardSource::Column { key: k, .. }) => k,
                _ => "outbox.columns",
            };
            let header = if name == "id" {
                "the debezium layout's event id header id".to_owned()
            } else {
                format!("the standard header {name}")
            };
            let mut why =
                format!("{entry}: already emitted: {header} carries column {column} ({source})");
            if inferred.contains(&name) {
                let _ = write!(
                    why,
                    ", set from this entry since Debezium's router has no such column"
                );
            }
            if name == "aggregate_sequence" {
                why.push_str(
                    "; the column must hold an integer and never be NULL, and outbox-cdc \
                     follows each aggregate's numbers with it ([audit])",
                );
            } else if name == "schema_version" {
                why.push_str("; the column must hold an integer and never be NULL");
            }
            r.note(key, entry, why);
        }
        kept.push(entry.clone());
    }
    kept
}

/// `payload_format` from the converters, noting what they write that
/// outbox-cdc does not. Without expansion Debezium's value is the payload
/// as a string, which the JSON converter quotes; StringConverter writes the
/// text as it is.
fn converters(r: &mut Reader<'_>, expand: bool) -> &'static str {
    let value_converter = r.get("value.converter");
    let schemas = r.get("value.converter.schemas.enable");
    let json_string = |expand: bool| if expand { "as-stored" } else { "json-string" };
    let format = match value_converter.as_deref() {
        None => {
            r.note(
                "value.converter",
                "",
                "not in the connector's config, so the worker's converter applied: \
                 payload_format = \"json-string\" is what JsonConverter writes with \
                 schemas.enable=false (Debezium's documented shape); with schemas enabled, \
                 JsonConverter's default, each value had a schema envelope, which outbox-cdc \
                 does not write",
            );
            json_string(expand)
        }
        Some(c) if c.ends_with("JsonConverter") => {
            if schemas.as_deref() != Some("false") {
                r.note(
                    "value.converter",
                    c,
                    "JsonConverter without value.converter.schemas.enable=false wraps each \
                     value in a schema envelope, which outbox-cdc does not write: consumers \
                     get the plain value",
                );
            }
            json_string(expand)
        }
        Some(c) if c.ends_with("StringConverter") => "as-stored",
        Some(c) if c.ends_with("BinaryDataConverter") || c.ends_with("ByteArrayConverter") => {
            r.note(
                "value.converter",
                c,
                "no equivalent for a bytea payload: outbox-cdc publishes json, jsonb and text \
                 payload columns as their text (payload_format = \"as-stored\"), and `check` \
                 refuses a bytea payload column",
            );
            "as-stored"
        }
        Some(c) => {
            r.note(
                "value.converter",
                c,
                "no equivalent: outbox-cdc writes no schema-registry format; the value is the \
                 payload column's text as stored (payload_format = \"as-stored\")",
            );
            "as-stored"
        }
    };
    match r.get("key.converter").as_deref() {
        Some(c) if c.ends_with("StringConverter") => {}
        Some(c) => r.note(
            "key.converter",
            c,
            "the key is the aggregate id's text, as StringConverter writes it; this converter \
             wrote other bytes (JsonConverter: a quoted JSON string, with schemas enabled an \
             envelope)",
        ),
        None => r.note(
            "key.converter",
            "",
            "not in the connector's config, so the worker's converter applied: the key is the \
             aggregate id's text, as StringConverter writes it (JsonConverter, Kafka Connect's \
             default, wrote a quoted JSON string)",
        ),
    }
    if let Some(c) = r.get("header.converter")
        && !c.ends_with("SimpleHeaderConverter")
    {
        r.note(
            "header.converter",
            &c,
            "header values are the columns' text, as SimpleHeaderConverter (the default) \
             writes them",
        );
    }
    format
}

/// `[kafka]`: the worker's `bootstrap.servers` when the file has it, and the
/// producer overrides librdkafka accepts as they are.
fn import_kafka(r: &mut Reader<'_>) -> BTreeMap<String, String> {
    let mut kafka: BTreeMap<String, String> = BTreeMap::new();
    let bootstrap = r
        .get("bootstrap.servers")
        .map(|b| ("bootstrap.servers", b))
        .or_else(|| {
            r.get("producer.override.bootstrap.servers")
                .map(|b| ("producer.override.bootstrap.servers", b))
        });
    let overrides: Vec<(String, String)> = r
        .config
        .iter()
        .filter(|(k, _)| k.starts_with("producer.override.") && !k.ends_with(".bootstrap.servers"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in overrides {
        r.used.insert(key.clone());
        let prop = &key["producer.override.".len()..];
        if prop == "sasl.jaas.config" {
            jaas(r, &key, &value, &mut kafka);
            continue;
        }
        let env = format!(
            "OUTBOX_CDC__KAFKA__{}",
            prop.to_ascii_uppercase().replace('.', "_")
        );
        let why = if let Some(why) = enforced(prop, &value) {
            why.to_owned()
        } else if prop == "plugin.library.paths" {
            "librdkafka plugins are not loaded from an imported configuration".to_owned()
        } else if secret(prop) && librdkafka_has(prop) {
            // Never written, nor checked: librdkafka's refusal could quote it.
            r.withhold(&key, Some(prop), &env);
            match reference(&value) {
                Some(source) => format!(
                    "{source}: outbox-cdc does not resolve Kafka Connect config providers: \
                     give the value as {env}"
                ),
                None => format!("a secret, not written to the file: give it as {env}"),
            }
        } else if let Some(problem) = librdkafka_refuses(prop, &value) {
            problem
        } else if let Some(source) = reference(&value) {
            format!(
                "{source}: outbox-cdc does not resolve Kafka Connect config providers: give \
                 the value as {env}"
            )
        } else {
            kafka.insert(prop.to_owned(), value);
            continue;
        };
        r.note(&key, &value, why);
    }
    let placeholder = match bootstrap {
        Some((_, b)) if reference(&b).is_none() => {
            kafka.insert("bootstrap.servers".into(), b);
            None
        }
        Some((key, b)) => {
            let why = format!(
                "{}: outbox-cdc does not resolve Kafka Connect config providers: [kafka] \
                 \"bootstrap.servers\" is a placeholder to replace (or give \
                 OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS)",
                reference(&b).unwrap_or_default()
            );
            Some((key, b, why))
        }
        None => Some((
            "bootstrap.servers",
            String::new(),
            "Kafka Connect keeps it in the worker's config, not the connector's: [kafka] \
             \"bootstrap.servers\" is a placeholder to replace"
                .to_owned(),
        )),
    };
    if let Some((key, value, why)) = placeholder {
        r.note(key, &value, why);
        kafka.insert("bootstrap.servers".into(), "127.0.0.1:9092".into());
    }
    kafka
}

/// What librdkafka (outbox-cdc's Kafka client) says of `prop = value`, when
/// it refuses it. Only the configuration is parsed: nothing connects.
fn librdkafka_refuses(prop: &str, value: &str) -> Option<String> {
    let mut probe = ClientConfig::new();
    probe.set(prop, value);
    match probe.create_native_config() {
        Ok(_) => None,
        Err(KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, ..)) => Some(format!(
            "librdkafka, outbox-cdc's Kafka client, has no property {prop} (a Java client \
             one){}",
            java_only(prop)
        )),
        Err(KafkaError::ClientConfig(_, description, ..)) => Some(format!(
            "librdkafka, outbox-cdc's Kafka client, refuses this value: {description}"
        )),
        Err(e) => Some(format!(
            "librdkafka, outbox-cdc's Kafka client, refuses it: {e}"
        )),
    }
}

/// Whether librdkafka has property `prop` (probed with a placeholder value).
fn librdkafka_has(prop: &str) -> bool {
    let mut probe = ClientConfig::new();
    probe.set(prop, "placeholder");
    !matches!(
        probe.create_native_config(),
        Err(KafkaError::ClientConfig(
            RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
            ..
        ))
    )
}

/// Where the Java producer's property lives in librdkafka, if anywhere.
fn java_only(prop: &str) -> &'static str {
    match prop {
        "ssl.truststore.password" | "ssl.truststore.type" => {
            "; give the CA certificates as PEM in ssl.ca.location instead of a truststore"
        }
        "ssl.keystore.type" => "; ssl.keystore.location reads a PKCS#12 file",
        "buffer.memory" => "; queue.buffering.max.kbytes bounds the producer's memory",
        "max.request.size" => "; message.max.bytes is librdkafka's limit",
        "max.block.ms" => "; outbox-cdc never blocks on a full queue, it reads less",
        _ => "",
    }
}

/// `sasl.jaas.config`, Java's login module, as librdkafka's `sasl.username`
/// and `sasl.password` (PLAIN and SCRAM). The password is never written.
fn jaas(r: &mut Reader<'_>, key: &str, value: &str, kafka: &mut BTreeMap<String, String>) {
    let module = value.split_whitespace().next().unwrap_or_default();
    if !(module.ends_with("PlainLoginModule") || module.ends_with("ScramLoginModule")) {
        r.note(
            key,
            value,
            format!(
                "no equivalent for the login module {module}: outbox-cdc's Kafka client \
                 (librdkafka) takes sasl.mechanism with sasl.username and sasl.password, or \
                 sasl.oauthbearer.* for OAUTHBEARER"
            ),
        );
        return;
    }
    let option = |name: &str| {
        let start = value.find(&format!("{name}=\""))? + name.len() + 2;
        let end = value[start..].find('"')?;
        Some(value[start..start + end].to_owned())
    };
    let mut why =
        vec!["Java's login module as librdkafka's sasl.username and sasl.password".to_owned()];
    match option("username") {
        Some(u) => match reference(&u) {
            Some(source) => why.push(format!(
                "the username is {source}, not resolved: give it as \
                 OUTBOX_CDC__KAFKA__SASL_USERNAME"
            )),
            None => {
                kafka.insert("sasl.username".into(), u);
                why.push("sasl.username is written".to_owned());
            }
        },
        None => why.push("no username in it: set sasl.username".to_owned()),
    }
    match option("password").as_deref().map(reference) {
        Some(Some(source)) => why.push(format!(
            "the password is {source}, not resolved: give it as \
             OUTBOX_CDC__KAFKA__SASL_PASSWORD"
        )),
        Some(None) => {
            r.withhold(
                key,
                Some("sasl.password"),
                "OUTBOX_CDC__KAFKA__SASL_PASSWORD",
            );
            why.push(
                "the password is not written to the file: give it as \
                 OUTBOX_CDC__KAFKA__SASL_PASSWORD"
                    .to_owned(),
            )
        }
        None => {
            why.push("no password in it: give it as OUTBOX_CDC__KAFKA__SASL_PASSWORD".to_owned())
        }
    }
    r.note(key, value, why.join("; "));
}

/// Why a producer override cannot be carried over, if it cannot.
fn enforced(prop: &str, value: &str) -> Option<&'static str> {
    match prop {
        "acks" | "request.required.acks" if !matches!(value, "all" | "-1") => {
            Some("outbox-cdc always produces with acks=all")
        }
        "enable.idempotence" if value != "true" => {
            Some("outbox-cdc always uses the idempotent producer")
        }
        "transactional.id" => Some(
            "outbox-cdc names its own transactional producer ([delivery] mode = \"exactly-once\")",
        ),
        "partitioner" | "partitioner.class" => {
            Some("outbox-cdc always partitions as the Java client's default (murmur2)")
        }
        "delivery.timeout.ms" | "message.timeout.ms" | "request.timeout.ms" | "retries" => {
            Some("outbox-cdc never times records out; a finite timeout could reorder an aggregate")
        }
        "key.serializer" | "value.serializer" => {
            Some("records are bytes: key = aggregate id, value = payload as stored")
        }
        _ => None,
    }
}

fn explain_unmapped(key: &str, router: &str) -> String {
    let why = if key.starts_with(&format!("transforms.{router}.")) {
        "an Outbox Event Router option outbox-cdc does not have"
    } else if key.starts_with("predicates") {
        "a Kafka Connect predicate, which picks the records a transform applies to; \
         outbox-cdc reads only the outbox table"
    } else if key.starts_with("transforms") {
        "single message transforms do not exist in outbox-cdc; its record shape is fixed \
         (docs/migrating-from-debezium.md)"
    } else if key.ends_with(".converter") || key.contains(".converter.") {
        "records are bytes: key = aggregate id as text, value per outbox.payload_format \
         (set from value.converter and table.expand.json.payload)"
    } else if key.starts_with("snapshot.") {
        "outbox-cdc takes no snapshot: rows committed before the slot are not published \
         (use `outbox-cdc replay --since`)"
    } else if key == "topic.prefix" || key == "database.server.name" {
        "names Debezium's own topics and offsets; outbox-cdc routes with outbox.topic only"
    } else if key.starts_with("offset.") || key.starts_with("errors.") {
        "Kafka Connect's; outbox-cdc keeps its offset in [offsets] path and follows outbox.on_poison"
    } else if key.starts_with("config.providers") {
        "Kafka Connect's config providers: outbox-cdc resolves no ${...} reference (each \
         setting that used one is noted)"
    } else {
        "no equivalent"
    };
    why.to_owned()
}

/// Whether a setting's value must not be written to the file: passwords,
/// secrets, JAAS configs, credentials, private keys (also inline PEM) and
/// tokens (a token endpoint's URL is none).
fn secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "jaas",
        "credential",
        "private",
        "passphrase",
        "key.pem",
        "keystore.key",
    ]
    .iter()
    .any(|s| k.contains(s))
        || (k.contains("token") && !k.ends_with(".url"))
}

/// A table as Debezium's include list writes it (a regular expression,
/// usually `schema.table` or `schema\.table`), as outbox.table writes it.
fn unregex(pattern: &str) -> String {
    pattern.replace("\\.", ".")
}

fn quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// Percent-encodes what a URL's user, database or query value cannot hold as is.
fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::outbox::PayloadFormat;

    /// Debezium's documented outbox example, as a user would POST it to Kafka Connect.
    const CONNECTOR: &str = r#"{
      "name": "orders-outbox",
      "config": {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "db.internal",
        "database.port": "5432",
        "database.user": "debezium",
        "database.password": "s3cret",
        "database.dbname": "orders",
        "database.sslmode": "verify-full",
        "topic.prefix": "orders",
        "plugin.name": "pgoutput",
        "slot.name": "orders_outbox",
        "publication.name": "orders_pub",
        "publication.autocreate.mode": "disabled",
        "table.include.list": "public.outbox",
        "tombstones.on.delete": "false",
        "snapshot.mode": "initial",
        "heartbeat.interval.ms": 10000,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "producer.override.compression.type": "lz4",
        "producer.override.acks": "1",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.key": "aggregate_id",
        "transforms.outbox.route.by.field": "aggregate_type",
        "transforms.outbox.route.topic.replacement": "events.${routedByValue}",
        "transforms.outbox.table.fields.additional.placement": "tenant:header,version:envelope:v",
        "transforms.outbox.table.expand.json.payload": "true"
      }
    }"#;

    #[test]
    fn imports_the_documented_outbox_connector_into_a_config_that_loads() {
        let imported = import(&parse_connector(CONNECTOR).unwrap()).unwrap();
        let config = Config::from_sources("imported.toml", &imported.toml, Vec::new())
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        assert_eq!(
            config.postgres.url,
            "postgres://debezium@db.internal:5432/orders?sslmode=verify-full"
        );
        assert_eq!(config.postgres.slot, "orders_outbox");
        assert_eq!(config.postgres.publication, "orders_pub");
        assert!(!config.postgres.create_publication);
        assert_eq!(config.outbox.table, "public.outbox");
        assert_eq!(config.outbox.layout, crate::outbox::Layout::Debezium);
        assert_eq!(config.outbox.topic, "events.{aggregate_type}");
        assert_eq!(
            config.outbox.columns.aggregate_id.as_deref(),
            Some("aggregate_id")
        );
        assert_eq!(
            config.outbox.columns.aggregate_type.as_deref(),
            Some("aggregate_type")
        );
        assert_eq!(
            config.outbox.additional_placement,
            vec!["tenant:header".to_owned(), "version:envelope:v".to_owned()]
        );
        // StringConverter: the text as it is.
        assert_eq!(
            config.outbox.payload_format,
            crate::outbox::PayloadFormat::AsStored
        );
        assert_eq!(config.kafka.get("compression.type"), Some("lz4"));
        assert_eq!(config.kafka.get("acks"), None, "acks=1 is not carried over");
        assert_eq!(config.monitor.heartbeat_interval_ms, 10_000);
        // The password never reaches the file.
        assert!(!imported.toml.contains("s3cret"), "{}", imported.toml);

        let noted: Vec<&str> = imported.notes.iter().map(|n| n.key.as_str()).collect();
        for key in [
            "database.password",
            "producer.override.acks",
            "snapshot.mode",
            "topic.prefix",
            "tombstones.on.delete",
            "transforms.outbox.table.expand.json.payload",
        ] {
            assert!(noted.contains(&key), "{key} not noted: {noted:?}");
        }
        // StringConverter for key and value is what outbox-cdc writes.
        for key in ["slot.name", "tasks.max", "key.converter", "value.converter"] {
            assert!(!noted.contains(&key), "{key} noted: {noted:?}");
        }
    }

    #[test]
    fn debezium_defaults_map_to_the_same_slot_publication_and_topics() {
        let props = "\
# worker and connector in one file
name=outbox
connector.class=io.debezium.connector.postgresql.PostgresConnector
bootstrap.servers = kafka:9092
database.hostname: db
database.user=app user
database.dbname=app
table.include.list=public\\.outbox
transforms=router
transforms.router.type=io.debezium.transforms.outbox.EventRouter
";
        let imported = import(&parse_connector(props).unwrap()).unwrap();
        let config = Config::from_sources("imported.toml", &imported.toml, Vec::new())
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        assert_eq!(config.postgres.url, "postgres://app%20user@db:5432/app");
        assert_eq!(config.postgres.slot, "debezium");
        assert_eq!(config.postgres.publication, "dbz_publication");
        assert!(config.postgres.create_publication);
        assert_eq!(config.outbox.table, "public.outbox");
        assert_eq!(config.outbox.topic, "outbox.event.{aggregate_type}");
        assert_eq!(config.outbox.columns, Default::default());
        assert_eq!(config.kafka.bootstrap_servers(), Some("kafka:9092"));
        // No converter named: Kafka Connect's JsonConverter quotes the payload string.
        assert_eq!(
            config.outbox.payload_format,
            crate::outbox::PayloadFormat::JsonString
        );
        assert_eq!(config.outbox.route, Default::default());
    }

    #[test]
    fn a_custom_route_regex_becomes_outbox_route() {
        let props = "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
                     transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n\
                     transforms.o.route.topic.regex=(?<kind>[a-z]+)-v(?<v>\\\\d+)\n\
                     transforms.o.route.topic.replacement=${kind}.events.v${v}\n";
        let imported = import(&parse_connector(props).unwrap()).unwrap();
        let config = Config::from_sources("imported.toml", &imported.toml, Vec::new())
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        assert_eq!(config.outbox.route.regex, r"(?<kind>[a-z]+)-v(?<v>\d+)");
        assert_eq!(config.outbox.route.replacement, "${kind}.events.v${v}");
    }

    /// D1: Java's `$1_events` is group 1 then `_events`, not a group named
    /// `1_events`: the imported route sends events where Debezium did.
    #[test]
    fn a_java_group_reference_routes_as_debezium_does() {
        for (replacement, topic) in [
            ("$1_events", "order_events"),
            ("outbox.$1_v2", "outbox.order_v2"),
            // The .properties escape, then Java's: `\.` is a literal dot.
            (r"x\\.${routedByValue}", "x.order"),
        ] {
            let (imported, config) = import_text(&format!(
                "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
                 transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n\
                 transforms.o.route.topic.replacement={replacement}\n"
            ));
            let routed = match config.outbox.route.compile().unwrap() {
                Some(route) => route.topic("order"),
                None => Some(config.outbox.topic.replace("{aggregate_type}", "order")),
            };
            assert_eq!(routed.as_deref(), Some(topic), "{}", imported.toml);
        }
    }

    /// D1: a replacement Java refuses (a group the regex lacks) is noted,
    /// not written: the file still loads.
    #[test]
    fn a_replacement_java_refuses_is_noted_not_written() {
        let (imported, config) = import_text(
            "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
             transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n\
             transforms.o.route.topic.replacement=$2.events\n",
        );
        assert_eq!(config.outbox.route, Default::default());
        let notes = notes_of(&imported, "transforms.o.route.topic.replacement");
        assert!(notes[0].contains("there is no group 2"), "{notes:?}");
    }

    #[test]
    fn refuses_what_cannot_be_an_outbox_relay() {
        let mysql = r#"{"connector.class": "io.debezium.connector.mysql.MySqlConnector"}"#;
        assert!(matches!(
            import(&parse_connector(mysql).unwrap()),
            Err(ImportError::NotPostgres(_))
        ));
        let plain = r#"{"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                        "transforms": "unwrap",
                        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState"}"#;
        assert_eq!(
            import(&parse_connector(plain).unwrap()).unwrap_err(),
            ImportError::NoEventRouter {
                transforms: "unwrap".into()
            }
        );
        assert!(matches!(
            parse_connector("{ not json"),
            Err(ImportError::Syntax(_))
        ));
    }

    #[test]
    fn a_missing_bootstrap_is_a_noted_placeholder() {
        let props = "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
                     transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n";
        let imported = import(&parse_connector(props).unwrap()).unwrap();
        assert!(imported.notes.iter().any(|n| n.key == "bootstrap.servers"));
        assert!(imported.notes.iter().any(|n| n.key == "table.include.list"));
        Config::from_sources("imported.toml", &imported.toml, Vec::new()).unwrap();
    }
    fn import_text(text: &str) -> (Imported, Config) {
        let imported = import(&parse_connector(text).unwrap()).unwrap();
        let config = Config::from_sources("imported.toml", &imported.toml, Vec::new())
            .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
        (imported, config)
    }

    /// The notes about `key`, as `value: why`.
    fn notes_of(imported: &Imported, key: &str) -> Vec<String> {
        imported
            .notes
            .iter()
            .filter(|n| n.key == key)
            .map(|n| format!("{}: {}", n.value, n.why))
            .collect()
    }

    /// Issue 34: the connector of the seed's outbox table, whose placements
    /// put the event type, sequence and schema version under the standard
    /// headers' names.
    const ISSUE_34: &str = "\
connector.class=io.debezium.connector.postgresql.PostgresConnector
database.hostname=db
database.dbname=app
table.include.list=public.outbox_events
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=false
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=event_id
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.table.fields.additional.placement=event_type:header:event_type,aggregate_sequence:header:aggregate_sequence,schema_version:header:schema_version
";

    #[test]
    fn the_issue_placement_line_imports_its_standard_headers_as_already_emitted() {
        let (imported, config) = import_text(ISSUE_34);
        let o = &config.outbox;
        assert_eq!(
            o.additional_placement,
            [
                "event_type:header:event_type",
                "aggregate_sequence:header:aggregate_sequence",
                "schema_version:header:schema_version"
            ]
        );
        let c = o.column_names().unwrap();
        assert_eq!(c.event_type, "event_type");
        assert_eq!(c.aggregate_sequence.as_deref(), Some("aggregate_sequence"));
        assert_eq!(c.schema_version.as_deref(), Some("schema_version"));
        // Each is its standard header: no header is written twice.
        assert_eq!(o.header_columns().unwrap(), Vec::new());
        let notes = notes_of(
            &imported,
            "transforms.outbox.table.fields.additional.placement",
        );
        assert_eq!(notes.len(), 3, "{notes:?}");
        for (entry, name) in [
            ("event_type:header:event_type", "event_type"),
            (
                "aggregate_sequence:header:aggregate_sequence",
                "aggregate_sequence",
            ),
            ("schema_version:header:schema_version", "schema_version"),
        ] {
            let prefix = format!(
                "{entry}: {entry}: already emitted: the standard header {name} carries column \
                 {name} (outbox.columns.{name}), set from this entry"
            );
            assert!(
                notes.iter().any(|n| n.starts_with(&prefix)),
                "{prefix}\nnot in {notes:?}"
            );
        }
        // Debezium's documented `type:header:eventType` stays an extra header,
        // and `id:header` is the `id` header Debezium writes anyway.
        let (imported, config) = import_text(
            "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
             transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n\
             transforms.o.table.fields.additional.placement=type:header:eventType,id:header\n",
        );
        assert_eq!(
            config.outbox.header_columns().unwrap(),
            [("eventType".to_owned(), "type".to_owned())]
        );
        let notes = notes_of(&imported, "transforms.o.table.fields.additional.placement");
        assert_eq!(
            notes,
            [
                "id:header: id:header: already emitted: the debezium layout's event id header id \
              carries column id (outbox.columns.event_id)"
            ]
        );
    }

    #[test]
    fn a_placement_without_equivalent_is_left_out_and_named() {
        let (imported, config) = import_text(
            "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
             transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n\
             transforms.o.table.fields.additional.placement=tenant:header:aggregate_id,\
             trace:header:lsn,tenant:header,org:header:tenant,body:envelope:payload\n",
        );
        assert_eq!(config.outbox.additional_placement, ["tenant:header"]);
        let notes = notes_of(&imported, "transforms.o.table.fields.additional.placement");
        assert_eq!(
            notes,
            [
                "tenant:header:aggregate_id: tenant:header:aggregate_id: not imported, it has \
                 no equivalent: aggregate_id is a standard header and carries column \
                 aggregateid (outbox.columns.aggregate_id), not tenant: place tenant under a \
                 header name of its own (tenant:header:tenant), or set \
                 outbox.columns.aggregate_id = \"tenant\" if tenant holds the aggregate id",
                "trace:header:lsn: trace:header:lsn: not imported, it has no equivalent: lsn \
                 is a standard header, the event's WAL position, not a column: place trace \
                 under a header name of its own (trace:header:trace)",
                "org:header:tenant: org:header:tenant: not imported, it has no equivalent: \
                 header tenant is already written by the outbox.additional_placement entry \
                 tenant:header: each header name at most once; place org under a header name \
                 of its own (org:header:org)",
                "body:envelope:payload: body:envelope:payload: not imported, it has no \
                 equivalent: payload is the envelope's member for the payload itself: give \
                 the column another member name, such as body:envelope:body",
            ]
        );
        // Debezium 1.x named the event type column: a placement of another
        // column under event_type is then not that header.
        let (imported, config) = import_text(
            "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
             transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n\
             transforms.o.table.field.event.type=kind\n\
             transforms.o.table.fields.additional.placement=category:header:event_type\n",
        );
        assert_eq!(config.outbox.column_names().unwrap().event_type, "kind");
        assert!(config.outbox.additional_placement.is_empty());
        let notes = notes_of(&imported, "transforms.o.table.fields.additional.placement");
        assert!(notes[0].contains("carries column kind"), "{notes:?}");
    }

    #[test]
    fn config_provider_references_are_named_never_taken_as_values() {
        let (imported, config) = import_text(
            "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
             database.hostname=${env:PG_HOST}\n\
             database.user=${file:/opt/connect/secrets/pg.properties:user}\n\
             database.password=${file:/opt/connect/secrets/pg.properties:password}\n\
             database.dbname=orders\n\
             producer.override.bootstrap.servers=${env:KAFKA_BOOTSTRAP}\n\
             producer.override.ssl.key.password=${env:KEY_PASSWORD}\n\
             transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n\
             transforms.o.route.topic.replacement=${routedByValue}.events\n",
        );
        assert_eq!(
            config.postgres.url,
            "postgres://postgres@localhost:5432/orders"
        );
        assert_eq!(config.kafka.bootstrap_servers(), Some("127.0.0.1:9092"));
        assert_eq!(config.kafka.get("ssl.key.password"), None);
        // ${routedByValue} is the router's, not a reference.
        assert_eq!(config.outbox.topic, "{aggregate_type}.events");
        let written: Vec<&str> = imported
            .toml
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect();
        assert!(
            !written.iter().any(|l| l.contains("${")),
            "{}",
            imported.toml
        );
        assert_eq!(
            notes_of(&imported, "database.hostname"),
            [
                "${env:PG_HOST}: a config provider reference (${env:PG_HOST}: the Kafka Connect \
              worker's environment variable PG_HOST): outbox-cdc does not resolve Kafka \
              Connect config providers; postgres.url has \"localhost\" in its place: give the \
              whole URL as OUTBOX_CDC__POSTGRES__URL"
            ]
        );
        assert!(
            notes_of(&imported, "database.user")[0].contains(
                "key user of /opt/connect/secrets/pg.properties, read by the Kafka Connect \
                 worker's file provider"
            ),
            "{:?}",
            imported.notes
        );
        assert!(
            notes_of(&imported, "database.password")[0].contains("give the password as PGPASSWORD")
        );
        assert!(
            notes_of(&imported, "producer.override.bootstrap.servers")[0]
                .contains("placeholder to replace")
        );
        assert!(
            notes_of(&imported, "producer.override.ssl.key.password")[0]
                .ends_with("give the value as OUTBOX_CDC__KAFKA__SSL_KEY_PASSWORD")
        );
    }

    #[test]
    fn producer_overrides_librdkafka_lacks_are_named() {
        let (imported, config) = import_text(
            "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
             bootstrap.servers=kafka:9093\n\
             producer.override.security.protocol=SASL_SSL\n\
             producer.override.sasl.mechanism=SCRAM-SHA-512\n\
             producer.override.sasl.jaas.config=org.apache.kafka.common.security.scram.\
             ScramLoginModule required username=\"relay\" password=\"hunter2\";\n\
             producer.override.ssl.truststore.location=/etc/kafka/truststore.jks\n\
             producer.override.linger.ms=abc\n\
             producer.override.compression.type=lz4\n\
             transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n",
        );
        let k = &config.kafka;
        assert_eq!(k.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(k.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(k.get("sasl.username"), Some("relay"));
        assert_eq!(k.get("compression.type"), Some("lz4"));
        for absent in [
            "sasl.jaas.config",
            "sasl.password",
            "ssl.truststore.location",
            "linger.ms",
        ] {
            assert_eq!(k.get(absent), None, "{absent}");
        }
        assert!(!imported.toml.contains("hunter2"), "{}", imported.toml);
        assert!(
            notes_of(&imported, "producer.override.sasl.jaas.config")[0]
                .contains("give it as OUTBOX_CDC__KAFKA__SASL_PASSWORD")
        );
        assert!(
            notes_of(&imported, "producer.override.ssl.truststore.location")[0]
                .contains("refuses this value: Java TrustStores are not supported"),
            "{:?}",
            imported.notes
        );
        assert!(
            notes_of(&imported, "producer.override.linger.ms")[0].contains("refuses this value"),
            "{:?}",
            imported.notes
        );
        // What is written, with the password given as the note says, makes a producer.
        let config = Config::from_sources(
            "imported.toml",
            &imported.toml,
            [(
                "OUTBOX_CDC__KAFKA__SASL_PASSWORD".to_owned(),
                "hunter2".to_owned(),
            )],
        )
        .unwrap();
        let producer: Result<rdkafka::producer::BaseProducer, _> =
            config.kafka.client_config().unwrap().create();
        producer.unwrap();
    }

    /// D2: secrets among the producer overrides are never written to the
    /// file; [kafka] says which environment variable to set instead, and
    /// the import names every key it withheld.
    #[test]
    fn producer_override_secrets_are_withheld_and_named() {
        let (imported, config) = import_text(
            "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
             bootstrap.servers=kafka:9093\n\
             database.password=hunter1\n\
             producer.override.security.protocol=SSL\n\
             producer.override.ssl.keystore.location=/etc/kafka/client.p12\n\
             producer.override.ssl.key.password=hunter2\n\
             producer.override.ssl.keystore.password=hunter3\n\
             producer.override.sasl.oauthbearer.client.secret=hunter4\n\
             producer.override.sasl.password=hunter5\n\
             producer.override.ssl.truststore.password=hunter6\n\
             producer.override.sasl.jaas.config=org.apache.kafka.common.security.plain.\
             PlainLoginModule required username=\"relay\" password=\"hunter7\";\n\
             transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n",
        );
        for n in 1..=7 {
            let secret = format!("hunter{n}");
            assert!(
                !imported.toml.contains(&secret),
                "{secret}:\n{}",
                imported.toml
            );
        }
        let k = &config.kafka;
        assert_eq!(
            k.get("ssl.keystore.location"),
            Some("/etc/kafka/client.p12")
        );
        for absent in [
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "sasl.password",
        ] {
            assert_eq!(k.get(absent), None, "{absent}");
            let env = format!(
                "OUTBOX_CDC__KAFKA__{}",
                absent.to_ascii_uppercase().replace('.', "_")
            );
            assert!(
                imported.toml.contains(&format!(
                    "# \"{absent}\" is a secret, not written here: set {env}"
                )),
                "{absent}:\n{}",
                imported.toml
            );
        }
        let withheld: Vec<(&str, &str)> = imported
            .withheld
            .iter()
            .map(|w| (w.key.as_str(), w.instead.as_str()))
            .collect();
        assert_eq!(
            withheld,
            [
                ("database.password", "PGPASSWORD"),
                (
                    "producer.override.sasl.jaas.config",
                    "OUTBOX_CDC__KAFKA__SASL_PASSWORD"
                ),
                (
                    "producer.override.sasl.oauthbearer.client.secret",
                    "OUTBOX_CDC__KAFKA__SASL_OAUTHBEARER_CLIENT_SECRET"
                ),
                (
                    "producer.override.sasl.password",
                    "OUTBOX_CDC__KAFKA__SASL_PASSWORD"
                ),
                (
                    "producer.override.ssl.key.password",
                    "OUTBOX_CDC__KAFKA__SSL_KEY_PASSWORD"
                ),
                (
                    "producer.override.ssl.keystore.password",
                    "OUTBOX_CDC__KAFKA__SSL_KEYSTORE_PASSWORD"
                ),
            ]
        );
        // A Java-only secret librdkafka lacks is noted as such, never shown.
        assert!(
            notes_of(&imported, "producer.override.ssl.truststore.password")[0]
                .contains("has no property"),
            "{:?}",
            imported.notes
        );
        assert!(!imported.notes.iter().any(|n| n.why.contains("hunter")));
    }

    #[test]
    fn converters_decide_the_payload_format_and_name_what_differs() {
        let base = "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
                    transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n";
        let cases = [
            (
                "value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=false\n",
                PayloadFormat::JsonString,
                None,
            ),
            (
                "value.converter=org.apache.kafka.connect.json.JsonConverter\n",
                PayloadFormat::JsonString,
                Some("schema envelope"),
            ),
            (
                "value.converter=org.apache.kafka.connect.storage.StringConverter\n",
                PayloadFormat::AsStored,
                None,
            ),
            (
                "value.converter=io.debezium.converters.BinaryDataConverter\n",
                PayloadFormat::AsStored,
                Some("bytea"),
            ),
            (
                "value.converter=io.confluent.connect.avro.AvroConverter\n",
                PayloadFormat::AsStored,
                Some("schema-registry"),
            ),
            ("", PayloadFormat::JsonString, Some("worker's converter")),
        ];
        for (converter, format, note) in cases {
            let (imported, config) = import_text(&format!("{base}{converter}"));
            assert_eq!(config.outbox.payload_format, format, "{converter}");
            let notes = notes_of(&imported, "value.converter");
            match note {
                None => assert!(notes.is_empty(), "{converter}: {notes:?}"),
                Some(text) => assert!(notes[0].contains(text), "{converter}: {notes:?}"),
            }
        }
    }

    /// Each import error names the key (or the file), the value and what
    /// would be accepted.
    #[test]
    fn import_error_not_json() {
        let e = parse_connector("{ not json").unwrap_err();
        assert!(matches!(e, ImportError::Syntax(_)));
        assert!(
            e.to_string().starts_with(
                "not a Kafka Connect connector config ({\"name\": ..., \"config\": {...}}, \
                 the bare config object, or a .properties file): key must be a string"
            ),
            "{e}"
        );
    }

    #[test]
    fn import_error_json_not_an_object() {
        let e = parse_connector("{\"config\": [1]}").unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a Kafka Connect connector config ({\"name\": ..., \"config\": {...}}, the \
             bare config object, or a .properties file): expected a JSON object, or one with \
             a \"config\" object"
        );
    }

    #[test]
    fn import_error_not_postgres() {
        let e = import(
            &parse_connector("connector.class=io.debezium.connector.mysql.MySqlConnector").unwrap(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "connector.class = \"io.debezium.connector.mysql.MySqlConnector\": only \
             io.debezium.connector.postgresql.PostgresConnector (Debezium's PostgreSQL \
             connector) can be imported"
        );
    }

    #[test]
    fn import_error_no_event_router() {
        let e = import(
            &parse_connector(
                "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
                 transforms=unwrap\n\
                 transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState\n",
            )
            .unwrap(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "transforms = \"unwrap\": none of them has transforms.<name>.type = \
             io.debezium.transforms.outbox.EventRouter; outbox-cdc relays an outbox table as \
             the Outbox Event Router does, a connector with it can be imported, a plain \
             Debezium change stream has no equivalent"
        );
    }
}
