//! Kafka stopped for 30 s mid-stream, then started: the connector rides it out
//! (librdkafka retries, backpressure stops reading the slot) and everything
//! arrives, in order per aggregate. Stops the shared broker.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::KafkaStopped;
use common::relay::{Fixture, Running, consume};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_down_for_30_seconds_then_everything_arrives_in_order() {
    let _alone = common::alone().await;
    common::init_tracing();
    let fx = Fixture::new("kafkadown").await;
    let running = Running::start(fx.config()).await;

    let mut written = Vec::new();
    let mut next = 0usize;
    let mut write_batch = async |fx: &Fixture, count: usize, written: &mut Vec<String>| {
        for _ in 0..count {
            let agg = format!("k{}", next % 10);
            let p = format!(r#"{{"n": {next}}}"#);
            written.extend(fx.write_tx(&[("order", agg.as_str(), p)], true).await);
            next += 1;
        }
    };

    write_batch(&fx, 20, &mut written).await;
    let before = consume(
        &fx.topic_prefix,
        written.len(),
        Duration::from_secs(60),
        Duration::ZERO,
    );
    assert_eq!(before.len(), 20, "delivery works before the outage");

    {
        let _kafka = KafkaStopped::stop();
        let outage = tokio::time::Instant::now();
        while outage.elapsed() < Duration::from_secs(30) {
            write_batch(&fx, 5, &mut written).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let m = &running.metrics;
        // No delivery timeout (message.timeout.ms = 0): the producer holds
        // them and the session does not end.
        assert!(
            m.in_flight_events() > 0,
            "while Kafka is down, events must be held in flight"
        );
    } // Kafka starts again here.

    write_batch(&fx, 20, &mut written).await;
    let records = consume(
        &fx.topic_prefix,
        written.len(),
        Duration::from_secs(240),
        Duration::from_secs(3),
    );

    let seen: BTreeSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    let lost: Vec<&String> = written
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} events lost across the outage: {lost:?}",
        lost.len()
    );

    let mut first: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    let mut dedupe = BTreeSet::new();
    for r in &records {
        if dedupe.insert(r.header("event_id")) {
            first
                .entry(&r.key)
                .or_default()
                .push((r.offset, r.header("aggregate_sequence").parse().unwrap()));
        }
    }
    for (key, mut v) in first {
        v.sort();
        let seqs: Vec<i64> = v.iter().map(|x| x.1).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "aggregate {key} out of order: {seqs:?}"
        );
    }

    running
        .stop()
        .await
        .expect("graceful stop after the outage");
    fx.cleanup().await;
}
