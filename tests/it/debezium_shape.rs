//! Configured like Debezium's Outbox Event Router, the connector's record for
//! Debezium's documented example row has the topic, key, value bytes and
//! headers that Debezium's documentation shows for it (outbox-event-router,
//! "Expanding escaped JSON String as JSON": the default shape, JsonConverter
//! without expansion, so the value is the payload as a JSON string), plus a
//! `type:header:eventType` placement. docs/migrating-from-debezium.md.
//!
//! Then both shapes side by side (issue 34): a Debezium connector config of
//! `tests/fixtures/debezium/` goes through `import-debezium`, the imported
//! configuration runs against the test servers, and its record is compared
//! with the record Debezium's router publishes for the same row and config
//! ([`debezium_record`], written from the router's documentation, not from
//! the import): topic, key, value bytes, and every header Debezium writes,
//! present exactly once with the same value.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::relay::{Fixture, Running, consume_ids};
use common::{init_tracing, kafka_bootstrap, pg_url};
use outbox_cdc::config::Config;
use outbox_cdc::debezium;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};

/// The documented row (Debezium's example outbox table: id, aggregatetype,
/// aggregateid, type, payload).
const EVENT_ID: &str = "406c07f3-26f0-4eea-a50c-109940064b8f";
const PAYLOAD: &str = r#"{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}"#;
/// The value Debezium's documentation shows for it.
const DOCUMENTED_VALUE: &str = r#""{\"id\": 1, \"lineItems\": [{\"id\": 1, \"item\": \"Debezium in Action\", \"status\": \"ENTERED\", \"quantity\": 2, \"totalPrice\": 39.98}, {\"id\": 2, \"item\": \"Debezium for Dummies\", \"status\": \"ENTERED\", \"quantity\": 1, \"totalPrice\": 29.99}], \"orderDate\": \"2019-01-31T12:13:01\", \"customerId\": 123}""#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_match_debeziums_documented_outbox_message() {
    init_tracing();
    let f = Fixture::new("dbz").await;
    let table = format!("dbz_{}", f.name);
    let publication = format!("dbzpub_{}", f.name);
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{table} (
                 id uuid PRIMARY KEY,
                 aggregatetype varchar(255) NOT NULL,
                 aggregateid varchar(255) NOT NULL,
                 type varchar(255) NOT NULL,
                 payload jsonb);
             GRANT SELECT ON public.{table} TO outbox;
             CREATE PUBLICATION {publication} FOR TABLE public.{table} WITH (publish = 'insert');"
        ))
        .await
        .expect("create Debezium's outbox table");
    // Debezium: route.topic.replacement = <prefix>.event.${routedByValue}.
    let running = Running::start(f.config_with(&format!(
        "OUTBOX_CDC__OUTBOX__TABLE=public.{table} OUTBOX_CDC__POSTGRES__PUBLICATION={publication} \
         OUTBOX_CDC__OUTBOX__LAYOUT=debezium OUTBOX_CDC__OUTBOX__PAYLOAD_FORMAT=json-string \
         OUTBOX_CDC__OUTBOX__ROUTE__REGEX=(?<routedByValue>.*) \
         OUTBOX_CDC__OUTBOX__ROUTE__REPLACEMENT={}.event.${{routedByValue}} \
         OUTBOX_CDC__OUTBOX__ADDITIONAL_PLACEMENT=type:header:eventType",
        f.topic_prefix
    )))
    .await;
    f.admin
        .execute(
            &format!(
                "INSERT INTO public.{table} (id, aggregatetype, aggregateid, type, payload)
                 VALUES ($1::text::uuid, 'order', '1', 'OrderCreated', $2::text::jsonb)"
            ),
            &[&EVENT_ID, &PAYLOAD],
        )
        .await
        .expect("insert the documented row");
    let ids: BTreeSet<String> = [EVENT_ID.to_owned()].into();
    let records = consume_ids(
        &f.topic_prefix,
        &ids,
        Duration::from_secs(60),
        Duration::ZERO,
    );
    running.stop().await.expect("stop");
    let r = &records[0];
    assert_eq!(r.topic, format!("{}.event.order", f.topic_prefix));
    assert_eq!(r.key, "1");
    assert_eq!(
        r.payload, DOCUMENTED_VALUE,
        "the value bytes Debezium documents"
    );
    assert_eq!(r.header("id"), EVENT_ID, "Debezium's id header");
    assert_eq!(r.header("eventType"), "OrderCreated");
    assert!(r.timestamp_ms.is_some());
    f.admin
        .batch_execute(&format!(
            "DROP PUBLICATION {publication}; DROP TABLE public.{table};"
        ))
        .await
        .expect("drop");
    f.cleanup().await;
}

/// A record as Debezium's Outbox Event Router publishes it.
#[derive(Debug, PartialEq, Eq)]
struct DebeziumRecord {
    topic: String,
    key: String,
    /// In Debezium's order: `id`, then the header placements.
    headers: Vec<(String, String)>,
    value: String,
}

/// The record Debezium's router publishes for an inserted `row` (column ->
/// text) under `connector`, as its documentation describes it: topic =
/// `route.topic.replacement` with `${routedByValue}` the `route.by.field`
/// column; key = the `table.field.event.key` column (StringConverter); the
/// header `id` = the `table.field.event.id` column, then one header per
/// `column:header[:alias]` placement (SimpleHeaderConverter: the text); value
/// = the `table.field.event.payload` column, a JSON string under JsonConverter
/// without schemas and without `table.expand.json.payload`. Shapes outside
/// this are not modelled and panic.
fn debezium_record(connector: &BTreeMap<String, String>, row: &[(&str, &str)]) -> DebeziumRecord {
    let router = connector
        .iter()
        .find(|(k, v)| {
            k.ends_with(".type") && v.as_str() == "io.debezium.transforms.outbox.EventRouter"
        })
        .map(|(k, _)| k.trim_end_matches(".type").to_owned())
        .expect("an Outbox Event Router");
    let option = |key: &str, default: &str| {
        connector
            .get(&format!("{router}.{key}"))
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    };
    let column = |name: &str| {
        row.iter()
            .find(|(c, _)| *c == name)
            .map(|(_, v)| v.to_string())
            .unwrap_or_else(|| panic!("the row has no column {name}"))
    };
    assert_eq!(
        option("route.topic.regex", "(?<routedByValue>.*)"),
        "(?<routedByValue>.*)"
    );
    assert_eq!(option("table.expand.json.payload", "false"), "false");
    assert!(connector["key.converter"].ends_with("StringConverter"));
    let topic = option("route.topic.replacement", "outbox.event.${routedByValue}").replace(
        "${routedByValue}",
        &column(&option("route.by.field", "aggregatetype")),
    );
    let mut headers = vec![(
        "id".to_owned(),
        column(&option("table.field.event.id", "id")),
    )];
    for entry in option("table.fields.additional.placement", "")
        .split(',')
        .filter(|e| !e.is_empty())
    {
        let parts: Vec<&str> = entry.split(':').collect();
        match parts.as_slice() {
            [c, "header"] => headers.push((c.to_string(), column(c))),
            [c, "header", alias] => headers.push((alias.to_string(), column(c))),
            _ => panic!("placement {entry} is not modelled"),
        }
    }
    let payload = column(&option("table.field.event.payload", "payload"));
    let value = match connector["value.converter"].as_str() {
        c if c.ends_with("JsonConverter") => {
            assert_eq!(connector["value.converter.schemas.enable"], "false");
            serde_json::Value::String(payload).to_string()
        }
        c if c.ends_with("StringConverter") => payload,
        c => panic!("value.converter {c} is not modelled"),
    };
    DebeziumRecord {
        topic,
        key: column(&option("table.field.event.key", "aggregateid")),
        headers,
        value,
    }
}

/// The headers of one record exactly as the broker holds them (a name may
/// repeat: a consumer map would hide that).
fn raw_headers(topic: &str, partition: i32, offset: i64) -> Vec<(String, String)> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", common::unique_name("raw"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .expect("assignment");
    consumer.assign(&tpl).expect("assign");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200))
            && m.offset() == offset
        {
            return m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|x| {
                            let v = x.value.map(|v| String::from_utf8_lossy(v).into_owned());
                            (x.key.to_owned(), v.unwrap_or_default())
                        })
                        .collect()
                })
                .unwrap_or_default();
        }
    }
    panic!("no record at {topic}[{partition}]@{offset} within 30 s");
}

/// Imports the connector config `file` with the test servers' table, slot,
/// publication and a topic of the test's own, runs the imported config,
/// inserts `row` into `table`, and compares the record with Debezium's.
async fn streams_like_debezium(
    f: &Fixture,
    file: &str,
    table: &str,
    publication: &str,
    row: &[(&str, &str)],
) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/debezium")
        .join(file);
    let mut connector = debezium::parse_connector(&std::fs::read_to_string(path).unwrap()).unwrap();
    let router = connector
        .iter()
        .find(|(_, v)| v.as_str() == "io.debezium.transforms.outbox.EventRouter")
        .map(|(k, _)| k.trim_end_matches(".type").to_owned())
        .unwrap();
    // The same connector on the test servers: only where it reads and where
    // its topics go change, for Debezium's record and outbox-cdc's alike.
    connector.insert("table.include.list".into(), format!("public.{table}"));
    connector.insert("slot.name".into(), f.slot.clone());
    connector.insert("publication.name".into(), publication.to_owned());
    let replacement = connector
        .get(&format!("{router}.route.topic.replacement"))
        .cloned()
        .unwrap_or_else(|| "outbox.event.${routedByValue}".into());
    connector.insert(
        format!("{router}.route.topic.replacement"),
        format!("{}.{replacement}", f.topic_prefix),
    );
    let expected = debezium_record(&connector, row);

    let imported = debezium::import(&connector).expect("import");
    let env: Vec<(String, String)> = [
        ("OUTBOX_CDC__POSTGRES__URL", pg_url()),
        ("OUTBOX_CDC__POSTGRES__STATUS_INTERVAL_MS", "1000".into()),
        ("OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap()),
        ("OUTBOX_CDC__KAFKA__LINGER_MS", "2".into()),
        ("OUTBOX_CDC__TOPICS__CREATE", "true".into()),
        ("OUTBOX_CDC__TOPICS__PARTITIONS", "3".into()),
        ("OUTBOX_CDC__TOPICS__REPLICATION_FACTOR", "1".into()),
        (
            "OUTBOX_CDC__OFFSETS__PATH",
            f.offsets_path().display().to_string(),
        ),
        ("OUTBOX_CDC__HTTP__LISTEN", String::new()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let config = Config::from_sources(file, &imported.toml, env)
        .unwrap_or_else(|e| panic!("the imported config does not load: {e}\n{}", imported.toml));
    let running = Running::start(config).await;
    let (columns, values): (Vec<&str>, Vec<String>) = row
        .iter()
        .map(|(c, v)| (*c, format!("'{}'", v.replace('\'', "''"))))
        .unzip();
    f.admin
        .batch_execute(&format!(
            "INSERT INTO public.{table} ({}) VALUES ({})",
            columns.join(", "),
            values.join(", ")
        ))
        .await
        .expect("insert the row");
    let id = expected.headers[0].1.clone();
    let records = consume_ids(
        &f.topic_prefix,
        &[id].into(),
        Duration::from_secs(60),
        Duration::ZERO,
    );
    running.stop().await.expect("stop");
    let r = &records[0];
    let ours = raw_headers(&r.topic, r.partition, r.offset);

    assert_eq!(r.topic, expected.topic, "{file}: topic");
    assert_eq!(r.key, expected.key, "{file}: key");
    assert_eq!(r.payload, expected.value, "{file}: value bytes");
    for (name, value) in &expected.headers {
        let found: Vec<&String> = ours
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v)
            .collect();
        assert_eq!(found, [value], "{file}: header {name} in {ours:?}");
    }
    // Besides Debezium's, only outbox-cdc's own standard headers, none twice.
    let standard = [
        "event_id",
        "event_type",
        "aggregate_type",
        "aggregate_id",
        "aggregate_sequence",
        "schema_version",
        "lsn",
    ];
    let mut names: Vec<&str> = ours.iter().map(|(n, _)| n.as_str()).collect();
    for n in &names {
        assert!(
            expected.headers.iter().any(|(d, _)| d == n) || standard.contains(n),
            "{file}: header {n} is neither Debezium's nor outbox-cdc's: {ours:?}"
        );
    }
    names.sort();
    let count = names.len();
    names.dedup();
    assert_eq!(
        names.len(),
        count,
        "{file}: a header written twice: {ours:?}"
    );
}

/// Issue 34's placement line on the seed's outbox table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issue_34_placements_stream_the_records_debezium_would() {
    init_tracing();
    let f = Fixture::new("dbz34").await;
    let row = [
        ("event_id", EVENT_ID),
        ("aggregate_type", "order"),
        ("aggregate_id", "1"),
        ("aggregate_sequence", "1"),
        ("event_type", "OrderCreated"),
        ("schema_version", "2"),
        ("payload", PAYLOAD),
    ];
    streams_like_debezium(&f, "issue-34.properties", &f.table, &f.publication, &row).await;
    f.cleanup().await;
}

/// Debezium's documented table and `type:header:eventType`, through the import.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_connector_streams_the_records_debezium_would() {
    init_tracing();
    let f = Fixture::new("dbzdoc").await;
    let table = format!("dbz_{}", f.name);
    let publication = format!("dbzpub_{}", f.name);
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{table} (
                 id uuid PRIMARY KEY,
                 aggregatetype varchar(255) NOT NULL,
                 aggregateid varchar(255) NOT NULL,
                 type varchar(255) NOT NULL,
                 payload jsonb);
             GRANT SELECT ON public.{table} TO outbox;
             CREATE PUBLICATION {publication} FOR TABLE public.{table} WITH (publish = 'insert');"
        ))
        .await
        .expect("create Debezium's outbox table");
    let row = [
        ("id", EVENT_ID),
        ("aggregatetype", "order"),
        ("aggregateid", "1"),
        ("type", "OrderCreated"),
        ("payload", PAYLOAD),
    ];
    streams_like_debezium(&f, "event-type-header.json", &table, &publication, &row).await;
    f.admin
        .batch_execute(&format!(
            "DROP PUBLICATION {publication}; DROP TABLE public.{table};"
        ))
        .await
        .expect("drop");
    f.cleanup().await;
}
