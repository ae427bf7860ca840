//! `outbox-cdc audit` against the real servers: a clean run has no findings;
//! rows never published, records with no row (a foreign producer) and copies
//! of a record are each found exactly; missing rows fail the audit.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::relay::{Fixture, Running, consume};
use common::{init_tracing, kafka_bootstrap};
use outbox_cdc::audit::{AuditOptions, run};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

const TIMEOUT: Duration = Duration::from_secs(60);

async fn produce(topic: &str, key: &str, event_id: &str, sequence: &str) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("producer");
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "event_id",
            value: Some(event_id),
        })
        .insert(Header {
            key: "aggregate_sequence",
            value: Some(sequence),
        });
    producer
        .send(
            FutureRecord::to(topic)
                .key(key)
                .payload("{}")
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .expect("produce");
}

/// The audit window's start: a second before now (server clock).
async fn window_start(fx: &Fixture) -> String {
    fx.admin
        .query_one("SELECT (now() - interval '1 second')::text", &[])
        .await
        .expect("now")
        .get(0)
}

/// The dead-letter topic and the settings that park an aggregate behind an
/// event over 2,000 bytes.
fn dead_letter_env(fx: &Fixture) -> (String, String) {
    let dlq_topic = format!("{}.dlq", fx.topic_prefix);
    let env = format!(
        "OUTBOX_CDC__OUTBOX__ON_POISON=dead-letter OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC={dlq_topic} \
         OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES=2000"
    );
    (dlq_topic, env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_finds_exactly_what_is_missing_foreign_or_repeated() {
    init_tracing();
    let fx = Fixture::new("audit").await;
    let since = window_start(&fx).await;
    let running = Running::start(fx.config()).await;
    let mut published = Vec::new();
    for i in 0..12 {
        let agg = format!("a{}", i % 3);
        published.extend(
            fx.write_tx(&[("order", agg.as_str(), format!(r#"{{"n":{i}}}"#))], true)
                .await,
        );
    }
    let records = consume(
        &fx.topic_prefix,
        published.len(),
        TIMEOUT,
        Duration::from_secs(1),
    );
    running.stop().await.expect("graceful stop");
    let options = AuditOptions {
        since: since.clone(),
        until: None,
        aggregate_type: None,
        max_examples: 100,
        progress: false,
    };
    let clean = run(&fx.config(), &options).await.expect("audit");
    assert_eq!(
        (
            clean.rows,
            clean.records,
            clean.missing,
            clean.phantoms,
            clean.duplicates,
            clean.order_violations
        ),
        (12, 12, 0, 0, 0, 0),
        "{}",
        clean.to_text()
    );
    assert!(clean.passed());

    // Rows the connector has not sent yet (it is stopped; the slot holds
    // them), a foreign record, and a second copy of a published one.
    let mut unpublished = BTreeSet::new();
    for i in 0..3 {
        unpublished.extend(
            fx.write_tx(&[("order", "late", format!(r#"{{"late":{i}}}"#))], true)
                .await,
        );
    }
    let topic = format!("{}.order", fx.topic_prefix);
    produce(&topic, "zz", "00000000-0000-0000-0000-000000000001", "1").await;
    let copied = &records[0];
    produce(
        &copied.topic,
        &copied.key,
        copied.header("event_id"),
        copied.header("aggregate_sequence"),
    )
    .await;

    let report = run(&fx.config(), &options).await.expect("audit");
    let pending: BTreeSet<String> = report
        .pending_rows
        .iter()
        .map(|m| m.event_id.clone())
        .collect();
    assert_eq!(pending, unpublished, "{}", report.to_text());
    assert_eq!(
        (report.pending, report.missing),
        (3, 0),
        "the slot still holds them: pending, not missing (review F4): {}",
        report.to_text()
    );
    assert!(report.passed(), "{}", report.to_text());

    // The slot lost (dropped): nothing will send them any more, so they are
    // missing.
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    let report = run(&fx.config(), &options).await.expect("audit");
    let missing: BTreeSet<String> = report
        .missing_rows
        .iter()
        .map(|m| m.event_id.clone())
        .collect();
    assert_eq!(missing, unpublished, "{}", report.to_text());
    assert_eq!((report.missing, report.pending), (3, 0));
    assert_eq!(report.phantoms, 1, "{}", report.to_text());
    assert_eq!(
        report.phantom_records[0].event_id,
        "00000000-0000-0000-0000-000000000001"
    );
    assert_eq!(report.duplicates, 1, "{}", report.to_text());
    assert_eq!(report.duplicate_event_ids, [copied.header("event_id")]);
    assert!(!report.passed());

    // The binary exits non-zero on missing rows; --aggregate-type narrows it.
    let config = fx.write_config_file();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["audit", "--json", "--since", &since, "--config"])
        .arg(&config)
        .output()
        .expect("run outbox-cdc audit");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("audit --json prints JSON");
    assert_eq!(json["missing"], 3);
    let narrowed = run(
        &fx.config(),
        &AuditOptions {
            aggregate_type: Some("invoice".into()),
            ..options
        },
    )
    .await
    .expect("audit");
    assert_eq!((narrowed.rows, narrowed.missing), (0, 0));
    fx.cleanup().await;
}

/// Records deleted from a topic (the delete-records admin call, as retention
/// or an operator's mistake would) are exactly the audit's missing rows, and
/// `audit --repair` publishes them again so that nothing is missing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_records_are_found_and_repaired() {
    init_tracing();
    let fx = Fixture::new("auditdel").await;
    let since = window_start(&fx).await;
    let running = Running::start(fx.config()).await;
    let mut published = Vec::new();
    for i in 0..24 {
        let agg = format!("d{}", i % 6);
        published.extend(
            fx.write_tx(&[("order", agg.as_str(), format!(r#"{{"n":{i}}}"#))], true)
                .await,
        );
    }
    let records = consume(
        &fx.topic_prefix,
        published.len(),
        TIMEOUT,
        Duration::from_secs(1),
    );
    // The connector keeps running: the audit waits for its slot to confirm
    // the snapshot it takes, so the rows count as passed by the slot.

    // Delete the first two records of every partition that has at least three.
    let mut per_partition: std::collections::BTreeMap<(String, i32), Vec<&common::relay::Record>> =
        Default::default();
    for r in &records {
        per_partition
            .entry((r.topic.clone(), r.partition))
            .or_default()
            .push(r);
    }
    let mut cut = rdkafka::TopicPartitionList::new();
    let mut deleted = BTreeSet::new();
    for ((topic, partition), mut recs) in per_partition {
        recs.sort_by_key(|r| r.offset);
        if recs.len() < 3 {
            continue;
        }
        let low = recs[0].offset;
        cut.add_partition_offset(&topic, partition, rdkafka::Offset::Offset(low + 2))
            .expect("partition offset");
        deleted.extend(recs[..2].iter().map(|r| r.header("event_id").to_owned()));
    }
    assert!(!deleted.is_empty(), "no partition had three records");
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .create()
            .expect("admin client");
    let result = admin
        .delete_records(&cut, &rdkafka::admin::AdminOptions::new())
        .await
        .expect("delete records");
    for e in result.elements() {
        assert!(e.error().is_ok(), "delete records in {e:?}");
    }

    let options = AuditOptions {
        since: since.clone(),
        until: None,
        aggregate_type: None,
        max_examples: 100,
        progress: false,
    };
    let report = run(&fx.config(), &options).await.expect("audit");
    let missing: BTreeSet<String> = report
        .missing_rows
        .iter()
        .map(|m| m.event_id.clone())
        .collect();
    assert_eq!(missing, deleted, "{}", report.to_text());
    assert_eq!(
        (report.missing, report.phantoms, report.duplicates),
        (deleted.len() as u64, 0, 0),
        "{}",
        report.to_text()
    );

    // The binary's --repair republishes exactly the missing rows and passes.
    let config = fx.write_config_file();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["audit", "--repair", "--json", "--since", &since, "--config"])
        .arg(&config)
        .output()
        .expect("run outbox-cdc audit --repair");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("audit --repair prints JSON ({e}): {output:?}"));
    assert_eq!(output.status.code(), Some(0), "{json:#}");
    assert_eq!(json["found"]["missing"], deleted.len(), "{json:#}");
    assert_eq!(json["republished"], deleted.len(), "{json:#}");
    assert_eq!(json["after"]["missing"], 0, "{json:#}");
    assert_eq!(json["after"]["duplicates"], 0, "{json:#}");

    // The republished records are in Kafka now, each once.
    let after = consume(
        &fx.topic_prefix,
        published.len(),
        TIMEOUT,
        Duration::from_secs(1),
    );
    let ids: Vec<String> = after
        .iter()
        .map(|r| r.header("event_id").to_owned())
        .collect();
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(ids.len(), unique.len(), "a record arrived twice");
    assert_eq!(
        unique,
        published.iter().cloned().collect::<BTreeSet<String>>()
    );
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// Review R3: with `on_poison = "dead-letter"`, a poison event and the later
/// events of its (now parked) aggregate are on the dead-letter topic. The
/// audit must not call them missing, and `--repair` must not publish a row of
/// that aggregate to the main topic past the poison event (only `release`
/// lets the aggregate flow again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettered_events_are_not_missing_and_repair_keeps_their_aggregate_parked() {
    init_tracing();
    let fx = Fixture::new("auditdlq").await;
    let (dlq_topic, env) = dead_letter_env(&fx);
    let since = window_start(&fx).await;
    let running = Running::start(fx.config_with(&env)).await;
    let small = |n: usize| format!(r#"{{"n": {n}}}"#);
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    fx.write_tx(&[("order", "a1", small(1))], true).await;
    let poison = fx.write_tx(&[("order", "a1", huge)], true).await;
    let parked = fx.write_tx(&[("order", "a1", small(3))], true).await;
    fx.write_tx(&[("order", "a2", small(4))], true).await;
    let records = consume(&fx.topic_prefix, 4, TIMEOUT, Duration::from_secs(2));
    let on_dlq: BTreeSet<&str> = records
        .iter()
        .filter(|r| r.topic == dlq_topic)
        .map(|r| r.header("event_id"))
        .collect();
    assert_eq!(
        on_dlq,
        BTreeSet::from([poison[0].as_str(), parked[0].as_str()]),
        "the fixture: the poison event and the parked one are dead-lettered"
    );
    running.stop().await.expect("graceful stop");

    let options = AuditOptions {
        since: since.clone(),
        until: None,
        aggregate_type: None,
        max_examples: 100,
        progress: false,
    };
    let report = run(&fx.config_with(&env), &options).await.expect("audit");
    assert_eq!(report.missing, 0, "{}", report.to_text());
    assert!(report.passed(), "{}", report.to_text());
    // The poison row (unmappable: too large) and the parked one are counted
    // as dead-lettered, with the other two rows published.
    assert_eq!(
        (
            report.rows,
            report.records,
            report.dead_letter_records,
            report.dead_lettered
        ),
        (4, 2, 2, 2),
        "{}",
        report.to_text()
    );
    let listed: BTreeSet<&str> = report
        .dead_lettered_rows
        .iter()
        .map(|d| d.event_id.as_str())
        .collect();
    assert_eq!(listed, on_dlq, "{}", report.to_text());
    assert!(report.to_text().contains("dead-lettered: 2"));

    // A later event of the parked aggregate written while the connector is
    // stopped, and the slot lost: no record anywhere, missing, but parked
    // behind the poison event, so the repair must not publish it.
    let later = fx.write_tx(&[("order", "a1", small(5))], true).await;
    fx.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
        .await
        .expect("drop the slot");
    let report = run(&fx.config_with(&env), &options).await.expect("audit");
    assert_eq!(report.missing, 1, "{}", report.to_text());
    assert_eq!(report.missing_rows[0].event_id, later[0]);
    assert_eq!(report.held_back, 1, "{}", report.to_text());
    let held = &report.held_back_rows[0];
    assert_eq!(
        (held.event_id.as_str(), held.behind.as_str()),
        (later[0].as_str(), poison[0].as_str()),
        "held back behind the poison event (sequence 2, read from its row): {}",
        report.to_text()
    );
    let outcome = outbox_cdc::audit::repair(&fx.config_with(&env), &options, &report)
        .await
        .expect("audit --repair");
    assert_eq!(
        outcome.replayed.total(),
        0,
        "nothing of a parked aggregate is republished: {}",
        outcome.replayed
    );
    assert_eq!(outcome.skipped, 1);
    assert_eq!(outcome.skipped_rows[0].event_id, later[0]);
    assert!(
        outcome.skipped_rows[0]
            .reason
            .contains("parked behind dead-lettered event"),
        "{}",
        outcome.skipped_rows[0].reason
    );

    // The binary: still missing after the repair (exit 1), with what it
    // skipped and why.
    let config_file = fx.write_config_file();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["audit", "--repair", "--since", &since, "--config"])
        .arg(&config_file)
        .env("OUTBOX_CDC__OUTBOX__ON_POISON", "dead-letter")
        .env("OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC", &dlq_topic)
        .env("OUTBOX_CDC__OUTBOX__MAX_RECORD_BYTES", "2000")
        .output()
        .expect("run outbox-cdc audit --repair");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(stdout.contains("published 0 records"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "skipped order/a1 {}: parked behind dead-lettered event {}",
            later[0], poison[0]
        )),
        "{stdout}"
    );
    let main_topic = format!("{}.order", fx.topic_prefix);
    let after = consume(&fx.topic_prefix, 4, TIMEOUT, Duration::from_secs(2));
    let a1_on_main = after
        .iter()
        .filter(|r| r.topic == main_topic && r.key == "a1")
        .count();
    assert_eq!(
        a1_on_main, 1,
        "only a1's event before the poison one is on {main_topic}"
    );
    fx.cleanup().await;
}

/// Review F4: a row the slot still holds (the connector is stopped) has no
/// record yet, but it is not missing: `audit --repair` must not publish it,
/// or it arrives twice once the connector runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_slot_still_holds_are_pending_and_never_republished() {
    init_tracing();
    let fx = Fixture::new("auditpend").await;
    let since = window_start(&fx).await;
    let running = Running::start(fx.config()).await;
    let mut written = fx
        .write_tx(&[("order", "p1", r#"{"n":1}"#.into())], true)
        .await;
    consume(&fx.topic_prefix, 1, TIMEOUT, Duration::from_secs(1));
    running.stop().await.expect("graceful stop");
    let held = fx
        .write_tx(&[("order", "p1", r#"{"n":2}"#.into())], true)
        .await;
    written.extend(held.iter().cloned());

    let config = fx.write_config_file();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["audit", "--repair", "--json", "--since", &since, "--config"])
        .arg(&config)
        .output()
        .expect("run outbox-cdc audit --repair");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("audit --repair prints JSON ({e}): {output:?}"));
    assert_eq!(output.status.code(), Some(0), "{json:#}");
    assert_eq!(
        (&json["found"]["missing"], &json["found"]["pending"]),
        (&serde_json::json!(0), &serde_json::json!(1)),
        "{json:#}"
    );
    assert_eq!(
        json["found"]["pending_rows"][0]["event_id"], held[0],
        "{json:#}"
    );
    assert_eq!(json["republished"], 0, "{json:#}");

    // The connector sends it, once; an audit while it runs finds nothing
    // pending (it waits for the slot to confirm its snapshot).
    let running = Running::start(fx.config()).await;
    let records = consume(&fx.topic_prefix, 2, TIMEOUT, Duration::from_secs(2));
    let ids: Vec<&str> = records.iter().map(|r| r.header("event_id")).collect();
    assert_eq!(
        ids,
        written.iter().map(String::as_str).collect::<Vec<_>>(),
        "each once, in order"
    );
    let options = AuditOptions {
        since,
        until: None,
        aggregate_type: None,
        max_examples: 100,
        progress: false,
    };
    let report = run(&fx.config(), &options).await.expect("audit");
    assert_eq!(
        (
            report.rows,
            report.records,
            report.missing,
            report.pending,
            report.duplicates
        ),
        (2, 2, 0, 0, 0),
        "{}",
        report.to_text()
    );
    running.stop().await.expect("graceful stop");
    fx.cleanup().await;
}

/// Review F1: `audit --repair` (a replay of only the missing rows) routes
/// every row of its window, also those it does not republish: a poison row
/// parks its aggregate for the repair, so a missing later event of that
/// aggregate goes to the dead-letter topic, never to its topic past the
/// poison event. Here the dead-letter topic holds nothing the audit could
/// read (the rows were never streamed, and no slot holds them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_never_publishes_past_a_poison_row_it_does_not_republish() {
    init_tracing();
    let fx = Fixture::new("auditpoison").await;
    let (dlq_topic, env) = dead_letter_env(&fx);
    let since = window_start(&fx).await;
    let small = |n: usize| format!(r#"{{"n": {n}}}"#);
    let huge = format!(r#"{{"blob": "{}"}}"#, "x".repeat(5000));
    let first = fx.write_tx(&[("order", "a1", small(1))], true).await;
    fx.write_tx(&[("order", "a1", huge)], true).await;
    let after_poison = fx.write_tx(&[("order", "a1", small(3))], true).await;
    let other = fx.write_tx(&[("order", "a2", small(4))], true).await;

    let options = AuditOptions {
        since,
        until: None,
        aggregate_type: None,
        max_examples: 100,
        progress: false,
    };
    let config = fx.config_with(&env);
    let report = run(&config, &options).await.expect("audit");
    assert_eq!(
        (report.missing, report.pending, report.held_back),
        (3, 0, 0),
        "no slot: the three mappable rows are missing, none known parked: {}",
        report.to_text()
    );
    outbox_cdc::audit::repair(&config, &options, &report)
        .await
        .expect("audit --repair");
    let records = consume(&fx.topic_prefix, 3, TIMEOUT, Duration::from_secs(2));
    let on = |topic: &str| -> Vec<&str> {
        records
            .iter()
            .filter(|r| r.topic == topic)
            .map(|r| r.header("event_id"))
            .collect()
    };
    let main_topic = format!("{}.order", fx.topic_prefix);
    let mut on_main = on(&main_topic);
    on_main.sort_unstable();
    let mut expected = vec![first[0].as_str(), other[0].as_str()];
    expected.sort_unstable();
    assert_eq!(
        on_main, expected,
        "a1's event after the poison row is not on {main_topic}"
    );
    assert_eq!(
        on(&dlq_topic),
        [after_poison[0].as_str()],
        "it follows the poison row to {dlq_topic}"
    );
    fx.cleanup().await;
}
