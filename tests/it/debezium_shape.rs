//! Configured like Debezium's Outbox Event Router, the connector's record for
//! Debezium's documented example row has the topic, key, value bytes and
//! headers that Debezium's documentation shows for it (outbox-event-router,
//! "Expanding escaped JSON String as JSON": the default shape, JsonConverter
//! without expansion, so the value is the payload as a JSON string), plus a
//! `type:header:eventType` placement. docs/migrating-from-debezium.md.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Running, consume_ids};

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
