//! Prints outbox events as a Kafka consumer reads them (used by `scripts/demo.sh`).
//!
//! Usage: `tail_events <bootstrap> [topic-regex]` (default `^outbox\.event\..*`).

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().unwrap_or_else(|| "127.0.0.1:19092".to_owned());
    let pattern = args
        .next()
        .unwrap_or_else(|| r"^outbox\.event\..*".to_owned());
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set(
            "group.id",
            format!("outbox-cdc-demo-{}", std::process::id()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("topic.metadata.refresh.interval.ms", "2000")
        .create()?;
    consumer.subscribe(&[pattern.as_str()])?;
    eprintln!("tail_events: reading {pattern} from {bootstrap} (Ctrl-C stops)");
    loop {
        let msg = match tokio::time::timeout(Duration::from_secs(3600), consumer.recv()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                eprintln!("tail_events: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(_) => continue,
        };
        let header = |name: &str| {
            msg.headers()
                .and_then(|h| h.iter().find(|x| x.key == name).and_then(|x| x.value))
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        println!(
            "{} p{} @{} key={} seq={} type={} lsn={} {}",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.key().map(String::from_utf8_lossy).unwrap_or_default(),
            header("aggregate_sequence"),
            header("event_type"),
            header("lsn"),
            msg.payload()
                .map(String::from_utf8_lossy)
                .unwrap_or_default(),
        );
    }
}
