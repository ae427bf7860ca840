//! The producer's share of the connector's CPU (bench/run.sh, `floor`).
//!
//! Produces records shaped like the benchmark's drain (the same key spread,
//! ~300-byte payloads, the `[outbox] headers` of the configuration with
//! values of the same lengths) through the connector's own `KafkaSink`, with
//! its Kafka settings and the same in-flight bound, and waits for every
//! delivery report. What this costs is what the connector cannot save by
//! changing anything before the producer: its CPU per event is the floor of
//! the connector's.
//!
//! Usage: `produce_floor <config.toml> <topic> <events> [aggregates]`. The
//! configuration is read like `outbox-cdc run` reads it (OUTBOX_CDC__*
//! overrides included). When done it prints one JSON line (events, seconds,
//! events_per_s) and waits for SIGTERM or Ctrl-C, so that the caller can
//! read its CPU time and peak RSS from /proc first.

use std::borrow::Cow;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use bytes::Bytes;
use outbox_cdc::config::Config;
use outbox_cdc::outbox::OutboxEvent;
use outbox_cdc::pg::Lsn;
use outbox_cdc::sink::KafkaSink;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, topic, events, rest @ ..] = args.as_slice() else {
        bail!("usage: produce_floor <config.toml> <topic> <events> [aggregates]");
    };
    let events: u64 = events.parse().context("events: not a number")?;
    let aggregates: u64 = match rest.first() {
        Some(n) => n.parse().context("aggregates: not a number")?,
        None => 10_000,
    };
    let config = Config::load(Path::new(config))?;
    let limit = config.limits.max_in_flight_events as u64;
    let (sink, mut reports) = KafkaSink::<u64>::with_topics(&config.kafka, &config.topics)?;
    let keys: Vec<Bytes> = (0..aggregates)
        .map(|i| Bytes::from(format!("agg-{i}")))
        .collect();
    let payload = Bytes::from(sample_payload());
    let wanted = &config.outbox.headers;

    let started = Instant::now();
    let (mut sent, mut acked) = (0u64, 0u64);
    while acked < events {
        while sent < events && sent - acked < limit {
            let event = record(topic, &keys, &payload, wanted, aggregates, sent);
            sink.send(&event, sent).await?;
            sent += 1;
        }
        let Some(report) = reports.recv().await else {
            bail!("the producer closed its report channel after {acked} reports");
        };
        if let Err(e) = report.result {
            bail!("record {} was not delivered: {e}", report.token);
        }
        acked += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"events\": {events}, \"seconds\": {seconds:.3}, \"events_per_s\": {:.0}}}",
        events as f64 / seconds
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

/// Event number `i`, with what the mapper would give it for the benchmark's
/// row `i` (bench/sql/setup.sql: aggregate `agg-<i % aggregates>`, sequence
/// `i / aggregates + 1`) and the headers `wanted`, in their order.
fn record(
    topic: &str,
    keys: &[Bytes],
    payload: &Bytes,
    wanted: &[String],
    aggregates: u64,
    i: u64,
) -> OutboxEvent {
    let key = keys[(i % aggregates) as usize].clone();
    let sequence = (i / aggregates + 1) as i64;
    let event_id = format!("00000000-0000-4000-8000-{i:012}");
    let lsn = Lsn::new(0x1_0000_0000 + i * 864);
    let headers: Vec<(Cow<'static, str>, Bytes)> = wanted
        .iter()
        .filter_map(|name| {
            // Static names, as the mapper's standard headers are.
            let header: (&'static str, Bytes) = match name.as_str() {
                "event_id" => ("event_id", Bytes::from(event_id.clone())),
                "event_type" => ("event_type", Bytes::from_static(b"OrderPlaced")),
                "aggregate_type" => ("aggregate_type", Bytes::from_static(b"drain1")),
                "aggregate_id" => ("aggregate_id", key.clone()),
                "aggregate_sequence" => ("aggregate_sequence", Bytes::from(sequence.to_string())),
                "schema_version" => ("schema_version", Bytes::from_static(b"1")),
                "lsn" => ("lsn", Bytes::from(lsn.to_string())),
                _ => return None,
            };
            Some((Cow::Borrowed(header.0), header.1))
        })
        .collect();
    OutboxEvent {
        topic: topic.to_owned(),
        key: key.clone(),
        payload: payload.clone(),
        headers,
        timestamp_ms: 1_764_547_200_000 + i as i64,
        event_id,
        aggregate_type: "drain1".to_owned(),
        aggregate_id: String::from_utf8_lossy(&key).into_owned(),
        aggregate_sequence: Some(sequence),
        lsn,
        partition: None,
        trace_dropped: Default::default(),
    }
}

/// About 300 bytes of JSON, like bench_payload()'s rows as text.
fn sample_payload() -> String {
    let mut payload =
        String::from(r#"{"order_id": 123456, "customer": "customer-4242", "lines": ["#);
    for n in 0..4 {
        payload.push_str(&format!(
            r#"{{"sku": "sku-{n:05}", "quantity": {q}, "price_cents": {p}}}, "#,
            q = n + 1,
            p = 1999 + n * 100
        ));
    }
    payload.push_str(r#"{"note": "gift wrap"}], "currency": "EUR"}"#);
    payload
}
