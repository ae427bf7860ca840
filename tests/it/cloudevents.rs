//! CloudEvents in binary content mode on the real broker
//! (`[outbox.cloudevents]`, docs/operations.md "CloudEvents"): each record
//! keeps its key and value and gains the `ce_*` attribute headers and
//! `content-type`; with the section off (the default) none of them appears.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Running, consume_ids};
use outbox_cdc::pg::PgTimestamp;

/// Milliseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_carry_cloudevents_headers_when_enabled() {
    init_tracing();
    let f = Fixture::new("ce").await;
    let running = Running::start(f.config_with(
        "OUTBOX_CDC__OUTBOX__CLOUDEVENTS__ENABLED=true \
         OUTBOX_CDC__OUTBOX__CLOUDEVENTS__SOURCE=/orders-service",
    ))
    .await;
    // jsonb keeps this text as is (keys in its order, 1.10 as written).
    let payload = r#"{"sku": "A-1", "total": 1.10}"#;
    let ids: BTreeSet<String> = f
        .write_tx(
            &[
                ("order", "o-1", payload.to_owned()),
                ("order", "o-2", "{}".to_owned()),
            ],
            true,
        )
        .await
        .into_iter()
        .collect();
    let records = consume_ids(
        &f.topic_prefix,
        &ids,
        Duration::from_secs(60),
        Duration::ZERO,
    );
    running.stop().await.expect("stop");
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.header("ce_specversion"), "1.0");
        assert_eq!(r.header("ce_id"), r.header("event_id"));
        assert_eq!(r.header("ce_source"), "/orders-service");
        assert_eq!(r.header("ce_type"), r.header("event_type"));
        assert_eq!(r.header("ce_subject"), r.key);
        assert_eq!(r.header("content-type"), "application/json");
        // ce_time is the commit time, the record's timestamp, in RFC 3339.
        let ts = r.timestamp_ms.expect("record timestamp");
        assert_eq!(
            r.header("ce_time"),
            PgTimestamp((ts - PG_EPOCH_UNIX_MS) * 1000).rfc3339()
        );
        assert!(
            r.header("ce_time").ends_with('Z') && r.header("ce_time").len() == 24,
            "{r:?}"
        );
    }
    let o1 = records.iter().find(|r| r.key == "o-1").expect("o-1");
    assert_eq!(o1.payload, payload, "the value is the payload as stored");
    f.cleanup().await;

    // Off by default: no CloudEvents header at all.
    let f = Fixture::new("ceoff").await;
    let running = Running::start(f.config()).await;
    let ids: BTreeSet<String> = f
        .write_tx(&[("order", "o-3", "{}".to_owned())], true)
        .await
        .into_iter()
        .collect();
    let records = consume_ids(
        &f.topic_prefix,
        &ids,
        Duration::from_secs(60),
        Duration::ZERO,
    );
    running.stop().await.expect("stop");
    let ce: Vec<&String> = records[0]
        .headers
        .keys()
        .filter(|k| k.starts_with("ce_") || *k == "content-type")
        .collect();
    assert!(ce.is_empty(), "CloudEvents headers while off: {ce:?}");
    f.cleanup().await;
}
