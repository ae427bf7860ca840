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

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The router Debezium's outbox pattern uses.
const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";

/// The router's default `route.topic.regex`: the whole value.
const DEFAULT_ROUTE_REGEX: &str = "(?<routedByValue>.*)";

/// The router's topic placeholder for the routing column's value.
const ROUTED_BY_VALUE: &str = "${routedByValue}";

/// Why a file cannot be imported at all.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImportError {
    #[error("not a Kafka Connect connector config: {0}")]
    Syntax(String),
    #[error(
        "connector.class is {0:?}, not io.debezium.connector.postgresql.PostgresConnector: only Debezium's PostgreSQL connector can be imported"
    )]
    NotPostgres(String),
    #[error(
        "no transform of type {EVENT_ROUTER} in `transforms`: outbox-cdc relays an outbox table as the Outbox Event Router does; a plain Debezium change stream has no equivalent"
    )]
    NoEventRouter,
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
    /// Settings without an equivalent, in key order.
    pub notes: Vec<Note>,
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

/// Builds the outbox-cdc configuration from a parsed connector config.
pub fn import(config: &BTreeMap<String, String>) -> Result<Imported, ImportError> {
    let used: RefCell<Vec<String>> = RefCell::new(Vec::new());
    let mut notes: Vec<Note> = Vec::new();
    let get = |key: &str| -> Option<String> {
        let v = config.get(key)?;
        used.borrow_mut().push(key.to_owned());
        Some(v.clone())
    };

    let class = get("connector.class").unwrap_or_default();
    if !class.ends_with("PostgresConnector") {
        return Err(ImportError::NotPostgres(class));
    }
    let transforms = get("transforms").unwrap_or_default();
    let router = transforms
        .split(',')
        .map(str::trim)
        .find(|name| {
            config
                .get(&format!("transforms.{name}.type"))
                .map(String::as_str)
                == Some(EVENT_ROUTER)
        })
        .ok_or(ImportError::NoEventRouter)?
        .to_owned();
    let t = |key: &str| format!("transforms.{router}.{key}");
    get(&t("type"));

    // [postgres]
    let host = get("database.hostname").unwrap_or_else(|| "localhost".into());
    let port = get("database.port").unwrap_or_else(|| "5432".into());
    let user = get("database.user").unwrap_or_else(|| "postgres".into());
    let dbname = get("database.dbname").unwrap_or_else(|| "postgres".into());
    let mut query = Vec::new();
    if let Some(mode) = get("database.sslmode") {
        query.push(format!("sslmode={}", url_escape(&mode)));
    }
    if let Some(root) = get("database.sslrootcert") {
        query.push(format!("sslrootcert={}", url_escape(&root)));
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
    let mut notes_later: Vec<(String, String, String)> = Vec::new();
    if let Some(pw) = get("database.password") {
        notes_later.push((
            "database.password".into(),
            pw,
            "not written to the file: give it as PGPASSWORD, or inside OUTBOX_CDC__POSTGRES__URL"
                .into(),
        ));
    }
    let slot = get("slot.name").unwrap_or_else(|| "debezium".into());
    let publication = get("publication.name").unwrap_or_else(|| "dbz_publication".into());
    let autocreate = get("publication.autocreate.mode").unwrap_or_else(|| "all_tables".into());
    let create_publication = autocreate != "disabled";
    if create_publication {
        notes_later.push((
            "publication.autocreate.mode".into(),
            autocreate,
            "outbox-cdc creates a missing publication FOR TABLE the outbox (inserts only), \
             not for all tables; an existing publication is used as it is, once proven to \
             carry the outbox"
                .into(),
        ));
    }
    if let Some(plugin) = get("plugin.name")
        && plugin != "pgoutput"
    {
        notes_later.push((
            "plugin.name".into(),
            plugin,
            "outbox-cdc decodes pgoutput only: create a new slot with pgoutput (set \
             postgres.slot to a new name; the old slot is then Debezium's to drop)"
                .into(),
        ));
    }

    // [outbox]
    let include = get("table.include.list").or_else(|| get("table.whitelist"));
    let table = match include.as_deref().map(|l| {
        l.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
    }) {
        Some(tables) if tables.len() == 1 => unregex(tables[0]),
        Some(tables) => {
            notes_later.push((
                "table.include.list".into(),
                tables.join(","),
                "several tables: outbox-cdc relays one outbox table per connector; outbox.table \
                 is set to the first, run one connector (one slot) per outbox table"
                    .into(),
            ));
            tables
                .first()
                .map(|t| unregex(t))
                .unwrap_or_else(|| "public.outbox".into())
        }
        None => {
            notes_later.push((
                "table.include.list".into(),
                String::new(),
                "not set: outbox.table is set to public.outbox, Debezium's usual name; check it"
                    .into(),
            ));
            "public.outbox".into()
        }
    };

    let mut columns: Vec<(&str, String)> = Vec::new();
    for (key, ours, default) in [
        ("table.field.event.id", "event_id", "id"),
        ("table.field.event.key", "aggregate_id", "aggregateid"),
        ("route.by.field", "aggregate_type", "aggregatetype"),
        ("table.field.event.type", "event_type", "type"),
        ("table.field.event.payload", "payload", "payload"),
    ] {
        if let Some(column) = get(&t(key))
            && column != default
        {
            columns.push((ours, column));
        }
    }
    let replacement = get(&t("route.topic.replacement"))
        .unwrap_or_else(|| format!("outbox.event.{ROUTED_BY_VALUE}"));
    let regex = get(&t("route.topic.regex")).filter(|r| r != DEFAULT_ROUTE_REGEX);
    // The default regex is the whole value: a template says the same. Any
    // other regex (or a replacement with other groups) goes to [outbox.route].
    let (topic, route) = match regex {
        None if !replacement.replace(ROUTED_BY_VALUE, "").contains('$') => (
            replacement.replace(ROUTED_BY_VALUE, "{aggregate_type}"),
            None,
        ),
        regex => (
            "outbox.event.{aggregate_type}".to_owned(),
            Some((
                regex.unwrap_or_else(|| DEFAULT_ROUTE_REGEX.to_owned()),
                replacement.clone(),
            )),
        ),
    };
    // Debezium's own syntax, taken as it is.
    let placements: Vec<String> = get(&t("table.fields.additional.placement"))
        .map(|p| {
            p.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    // Without expansion Debezium's value is the payload as a string, which
    // the JSON converter (Kafka Connect's default) quotes; StringConverter
    // and ByteArray-style converters write the text as it is.
    let expand = get(&t("table.expand.json.payload")).is_some_and(|v| v == "true");
    let value_converter = config.get("value.converter").cloned().unwrap_or_default();
    let json_converter = value_converter.is_empty() || value_converter.ends_with("JsonConverter");
    let payload_format = if json_converter && !expand {
        "json-string"
    } else {
        "as-stored"
    };
    if expand {
        notes_later.push((
            t("table.expand.json.payload"),
            "true".into(),
            "the value is the payload column's JSON as PostgreSQL sends it: the same document \
             Debezium expands, not necessarily the same bytes (spacing, key order of json)"
                .into(),
        ));
    }
    if let Some(ts) = get(&t("table.field.event.timestamp")) {
        notes_later.push((
            t("table.field.event.timestamp"),
            ts,
            "the record timestamp is always the transaction's commit time".into(),
        ));
    }

    // [kafka]
    let mut kafka: BTreeMap<String, String> = BTreeMap::new();
    let bootstrap = get("bootstrap.servers").or_else(|| get("producer.override.bootstrap.servers"));
    for (key, value) in config {
        if let Some(prop) = key.strip_prefix("producer.override.") {
            used.borrow_mut().push(key.clone());
            if prop == "bootstrap.servers" {
                continue;
            }
            match enforced(prop, value) {
                Some(why) => notes_later.push((key.clone(), value.clone(), why.into())),
                None => {
                    kafka.insert(prop.to_owned(), value.clone());
                }
            }
        }
    }
    match &bootstrap {
        Some(b) => {
            kafka.insert("bootstrap.servers".into(), b.clone());
        }
        None => {
            notes_later.push((
                "bootstrap.servers".into(),
                String::new(),
                "Kafka Connect keeps it in the worker's config, not the connector's: \
                 [kafka] \"bootstrap.servers\" is a placeholder to replace"
                    .into(),
            ));
            kafka.insert("bootstrap.servers".into(), "127.0.0.1:9092".into());
        }
    }

    // [monitor]
    let heartbeat = get("heartbeat.interval.ms");

    for (key, value, why) in notes_later {
        notes.push(Note { key, value, why });
    }
    let consumed = ["name", "tasks.max"];
    for (key, value) in config {
        if used.borrow().contains(key) || consumed.contains(&key.as_str()) {
            continue;
        }
        let why = explain_unmapped(key, &router);
        notes.push(Note {
            key: key.clone(),
            value: value.clone(),
            why,
        });
    }
    notes.sort_by(|a, b| a.key.cmp(&b.key));

    let mut out = String::new();
    let name = config.get("name").cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "# outbox-cdc configuration imported from the Debezium connector {}\n\
         # by `outbox-cdc import-debezium`. Settings without an equivalent are listed\n\
         # at the end. Check it with `outbox-cdc check --config <this file>`.\n",
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
    if !columns.is_empty() {
        let _ = writeln!(out, "\n[outbox.columns]");
        for (ours, column) in &columns {
            let _ = writeln!(out, "{ours} = {}", quote(column));
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
    if let Some(ms) = heartbeat.as_deref().and_then(|v| v.parse::<u64>().ok()) {
        let _ = writeln!(out, "\n[monitor]\nheartbeat_interval_ms = {ms}");
    }
    if !notes.is_empty() {
        let _ = writeln!(out, "\n# Debezium settings without an equivalent:");
        for n in &notes {
            let value = if n.key.contains("password") {
                "[redacted]"
            } else {
                &n.value
            };
            let _ = writeln!(out, "#   {} = {}: {}", n.key, value, n.why);
        }
    }
    Ok(Imported { toml: out, notes })
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
        "transactional.id" => Some("outbox-cdc does not use Kafka transactions"),
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
    } else if key.starts_with("transforms") || key.starts_with("predicates") {
        "single message transforms do not exist in outbox-cdc; its record shape is fixed \
         (docs/migrating-from-debezium.md)"
    } else if key.ends_with(".converter") || key.contains(".converter.") {
        "records are bytes: key = aggregate id as text, value per outbox.payload_format \
         (set from value.converter and table.expand.json.payload); JsonConverter with \
         schemas.enable=true wraps values in a schema envelope outbox-cdc does not write"
    } else if key.starts_with("snapshot.") {
        "outbox-cdc takes no snapshot: rows committed before the slot are not published \
         (use `outbox-cdc replay --since`)"
    } else if key == "topic.prefix" || key == "database.server.name" {
        "names Debezium's own topics and offsets; outbox-cdc routes with outbox.topic only"
    } else if key.starts_with("offset.") || key.starts_with("errors.") {
        "Kafka Connect's; outbox-cdc keeps its offset in [offsets] path and follows outbox.on_poison"
    } else {
        "no equivalent"
    };
    why.to_owned()
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
            "value.converter",
        ] {
            assert!(noted.contains(&key), "{key} not noted: {noted:?}");
        }
        assert!(!noted.contains(&"slot.name") && !noted.contains(&"tasks.max"));
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
            ImportError::NoEventRouter
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
}
