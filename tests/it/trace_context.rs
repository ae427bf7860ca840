//! Issue 32, trace context: the writer's W3C `traceparent` (and `tracestate`)
//! in the outbox row reaches the Kafka record's headers byte for byte; an
//! invalid value is published without the header and counted, never a stop;
//! a table without the columns works as before; a configured column the
//! table lacks refuses the start naming the key.

use std::time::Duration;

use crate::common;
use crate::common::relay::{Fixture, Running, consume};

const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const STATE: &str = "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE";

/// Inserts one event row with the given trace columns; returns its id.
async fn insert(fx: &Fixture, agg: &str, parent: Option<&str>, state: Option<&str>) -> String {
    fx.admin
        .query_one(
            &format!(
                "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, traceparent, tracestate)
                 VALUES (gen_random_uuid(), 'order', $1,
                         (SELECT coalesce(max(aggregate_sequence), 0) + 1 FROM public.{t} WHERE aggregate_id = $1),
                         'Traced', '{{}}', $2, $3)
                 RETURNING event_id::text",
                t = fx.table
            ),
            &[&agg, &parent, &state],
        )
        .await
        .expect("insert a traced row")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_carries_the_writers_trace_context_byte_for_byte() {
    common::init_tracing();
    let fx = Fixture::new("trace").await;
    let running = Running::start(fx.config()).await;

    let valid = insert(&fx, "a", Some(PARENT), Some(STATE)).await;
    let upper = PARENT.to_uppercase();
    let invalid = insert(&fx, "b", Some(&upper), Some(STATE)).await;
    let bad_state = insert(&fx, "c", Some(PARENT), Some("a=1\tb=2")).await;
    let none = insert(&fx, "d", None, None).await;

    let records = consume(&fx.topic_prefix, 4, Duration::from_secs(60), Duration::ZERO);
    let by_id = |id: &str| {
        records
            .iter()
            .find(|r| r.header("event_id") == id)
            .unwrap_or_else(|| panic!("event {id} not published: {records:?}"))
    };
    let r = by_id(&valid);
    assert_eq!(
        r.headers.get("traceparent").map(String::as_str),
        Some(PARENT)
    );
    assert_eq!(r.headers.get("tracestate").map(String::as_str), Some(STATE));
    // Published, without the headers it could not carry.
    let r = by_id(&invalid);
    assert!(
        !r.headers.contains_key("traceparent") && !r.headers.contains_key("tracestate"),
        "{r:?}"
    );
    let r = by_id(&bad_state);
    assert_eq!(
        r.headers.get("traceparent").map(String::as_str),
        Some(PARENT)
    );
    assert!(!r.headers.contains_key("tracestate"), "{r:?}");
    let r = by_id(&none);
    assert!(!r.headers.keys().any(|k| k.starts_with("trace")), "{r:?}");

    let m = &running.metrics;
    assert_eq!(m.trace_dropped_count("traceparent"), 1);
    // The one without a valid traceparent, and the one that is not plausible.
    assert_eq!(m.trace_dropped_count("tracestate"), 2);
    let text = m.render();
    assert!(
        text.contains("outbox_cdc_trace_context_dropped_total{header=\"traceparent\"} 1\n"),
        "{text}"
    );
    assert!(!running.is_finished(), "an invalid trace value never stops");
    running.stop().await.expect("clean stop");
    fx.cleanup().await;
}

/// Without the columns the table works exactly as before; a column named in
/// `outbox.trace_column` that the table lacks refuses the start, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_columns_are_optional_unless_configured() {
    common::init_tracing();
    let fx = Fixture::new("notrace").await;
    fx.admin
        .batch_execute(&format!(
            "ALTER TABLE public.{} DROP COLUMN traceparent, DROP COLUMN tracestate",
            fx.table
        ))
        .await
        .expect("drop the trace columns");

    let refused = Running::spawn(
        fx.config_with("OUTBOX_CDC__OUTBOX__TRACE_COLUMN=traceparent"),
        Default::default(),
    )
    .finished(Duration::from_secs(60))
    .await
    .expect_err("a configured trace column the table lacks");
    let text = refused.to_string();
    assert!(
        text.contains("outbox.trace_column") && text.contains("traceparent"),
        "{text}"
    );

    let running = Running::start(fx.config()).await;
    let ids = fx
        .write_tx(&[("order", "x", r#"{"n": 1}"#.to_owned())], true)
        .await;
    let records = consume(&fx.topic_prefix, 1, Duration::from_secs(60), Duration::ZERO);
    assert_eq!(records[0].header("event_id"), ids[0]);
    assert!(!records[0].headers.keys().any(|k| k.starts_with("trace")));
    running.stop().await.expect("clean stop");
    fx.cleanup().await;
}
