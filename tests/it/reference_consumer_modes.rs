//! The reference consumer run as a process against the test broker. Without
//! an inbox (`--no-inbox`) it needs no PostgreSQL and counts a repeated
//! event_id as a duplicate instead of suppressing it; `--isolation` decides
//! whether the records of an aborted Kafka transaction are read. With the
//! inbox, the same records apply each effect once. The records are produced
//! here, not by the relay, so that the counts are known in advance.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// The consumer stops this long after its last record. The broker starts
/// new groups at once (`group.initial.rebalance.delay.ms=0`), so the first
/// record comes well within it.
const IDLE_MS: u64 = 4_000;
/// A consumer still running after this is a failure (and is killed).
const RUN_LIMIT: Duration = Duration::from_secs(60);
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);

fn event_id(n: usize) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// One record as the relay would send it, reduced to what the consumer reads.
fn record<'a>(
    topic: &'a str,
    key: &'a str,
    payload: &'a str,
    event_id: &'a str,
) -> BaseRecord<'a, str, str> {
    BaseRecord::to(topic)
        .key(key)
        .payload(payload)
        .headers(OwnedHeaders::new().insert(Header {
            key: "event_id",
            value: Some(event_id),
        }))
}

/// Sends `(key, event_id)` pairs in order and waits for every delivery.
fn produce_plain(topic: &str, records: &[(String, String)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_bootstrap())
        .create()
        .expect("producer");
    for (key, id) in records {
        let payload = format!(r#"{{"event_id":"{id}"}}"#);
        producer
            .send(record(topic, key, &payload, id))
            .unwrap_or_else(|(e, _)| panic!("send {id} to {topic}: {e}"));
    }
    producer
        .flush(KAFKA_TIMEOUT)
        .expect("flush the plain producer");
}

/// One transaction of `aborted` records that is aborted after they reached
/// the log, then one of `committed` records that commits.
fn produce_aborted_then_committed(topic: &str, aborted: usize, committed: usize) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", common::kafka_bootstrap())
        .set("transactional.id", common::unique_name("consumer_modes_tx"))
        .create()
        .expect("transactional producer");
    producer
        .init_transactions(KAFKA_TIMEOUT)
        .expect("init_transactions");
    let mut n = 0;
    for (count, commit) in [(aborted, false), (committed, true)] {
        producer.begin_transaction().expect("begin_transaction");
        for _ in 0..count {
            n += 1;
            let id = event_id(n);
            let key = format!("order-{n}");
            let payload = format!(r#"{{"n":{n}}}"#);
            producer
                .send(record(topic, &key, &payload, &id))
                .unwrap_or_else(|(e, _)| panic!("send {id} to {topic}: {e}"));
        }
        if commit {
            producer
                .commit_transaction(KAFKA_TIMEOUT)
                .expect("commit_transaction");
        } else {
            // Abort purges what is still queued: flush first, so the aborted
            // records are in the log for a read_uncommitted consumer to see.
            producer.flush(KAFKA_TIMEOUT).expect("flush before abort");
            producer
                .abort_transaction(KAFKA_TIMEOUT)
                .expect("abort_transaction");
        }
    }
}

/// The counts of the consumer's final log line.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    records: u64,
    duplicates: u64,
}

/// Runs the built consumer without an inbox (and without CONSUMER_PG_URL)
/// on `topic` until it has been idle for `IDLE_MS`; returns its final counts
/// and its log.
fn run_without_inbox(topic: &str, isolation: &str) -> (Counts, String) {
    let log = run_consumer(topic, &["--no-inbox", "--isolation", isolation]);
    (final_counts(&log), log)
}

/// Runs the built consumer on `topic` with `args` until it has been idle for
/// `IDLE_MS`; returns its log.
fn run_consumer(topic: &str, args: &[&str]) -> String {
    run_consumer_matching(&format!("^{topic}$"), args)
}

/// [`run_consumer`] with the inbox and effects tables given, on the test
/// cluster as its superuser.
fn run_consumer_with_inbox(topic: &str, inbox_table: &str, effects_table: &str) -> String {
    let pg_url = common::pg_admin_url();
    run_consumer(
        topic,
        &[
            "--pg-url",
            &pg_url,
            "--inbox-table",
            inbox_table,
            "--effects-table",
            effects_table,
        ],
    )
}

/// [`run_consumer`] on the topics `topic_regex` matches.
fn run_consumer_matching(topic_regex: &str, args: &[&str]) -> String {
    let (status, text) = run_consumer_to_exit(topic_regex, args);
    assert!(
        status.success(),
        "the consumer failed ({status}); log:\n{text}"
    );
    text
}

/// Runs the consumer until it exits (at most [`RUN_LIMIT`]); its status and log.
fn run_consumer_to_exit(topic_regex: &str, args: &[&str]) -> (std::process::ExitStatus, String) {
    let log_path: PathBuf = [
        env!("CARGO_TARGET_TMPDIR"),
        &format!("{}.log", common::unique_name("reference_consumer")),
    ]
    .iter()
    .collect();
    let log = std::fs::File::create(&log_path).expect("consumer log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_reference-consumer"))
        .args(args)
        .arg("--bootstrap-servers")
        .arg(common::kafka_bootstrap())
        .arg("--topic-regex")
        .arg(topic_regex)
        .arg("--group")
        .arg(common::unique_name("consumer_modes_group"))
        .args(["--exit-after-idle-ms", &IDLE_MS.to_string()])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("CONSUMER_PG_URL")
        .env_remove("CONSUMER_NO_INBOX")
        .env_remove("CONSUMER_ISOLATION")
        .env_remove("CONSUMER_EXIT_AFTER_IDLE_MS")
        .env_remove("CONSUMER_APPLY_SIDE_RECORDS")
        .env_remove("OUTBOX_CDC_CONSUMER_FAILPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn the reference consumer");
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the consumer") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the consumer did not stop within {RUN_LIMIT:?} (--exit-after-idle-ms {IDLE_MS}); log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log_path).expect("read the consumer log");
    (status, text)
}

/// The consumer's final log line.
fn final_line(log: &str) -> &str {
    log.lines()
        .rfind(|l| l.contains("stopping") && l.contains("records="))
        .unwrap_or_else(|| panic!("no final counts line in the consumer log:\n{log}"))
}

fn final_counts(log: &str) -> Counts {
    let last = final_line(log);
    Counts {
        records: field(last, "records"),
        duplicates: field(last, "duplicates"),
    }
}

/// The number after `name=` in a log line.
fn field(line: &str, name: &str) -> u64 {
    let pattern = format!("{name}=");
    let start = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix(pattern.as_str()))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"));
    start
        .parse()
        .unwrap_or_else(|e| panic!("{name}= in {line:?}: {e}"))
}

/// Eight `(key, event_id)` sends of five events: the first is sent three
/// times, the fourth twice, so three repeats, spread over the partitions
/// (the keys differ).
fn repeated_sends() -> Vec<(String, String)> {
    [1, 2, 1, 3, 4, 1, 5, 4]
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("order-{i}"), event_id(*n)))
        .collect()
}

#[tokio::test]
async fn without_an_inbox_a_repeated_event_id_is_counted_as_a_duplicate() {
    let topic = common::unique_name("consumer_modes_dup");
    common::create_topic(&topic, 2, &[]).await;
    let (counts, log) = tokio::task::spawn_blocking(move || {
        produce_plain(&topic, &repeated_sends());
        run_without_inbox(&topic, "read_committed")
    })
    .await
    .expect("produce and consume");
    assert_eq!(
        counts,
        Counts {
            records: 8,
            duplicates: 3
        },
        "log:\n{log}"
    );
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("duplicate delivery"))
        .collect::<Vec<_>>();
    assert_eq!(warned.len(), 3, "one warning per repeat; log:\n{log}");
    assert!(
        warned.iter().all(|l| l.contains("event_id=")
            && l.contains("topic=")
            && l.contains("partition=")
            && l.contains("offset=")),
        "{warned:#?}"
    );
}

#[tokio::test]
async fn read_committed_skips_an_aborted_transaction_and_read_uncommitted_does_not() {
    let topic = common::unique_name("consumer_modes_tx");
    common::create_topic(&topic, 1, &[]).await;
    let (committed, uncommitted) = tokio::task::spawn_blocking(move || {
        produce_aborted_then_committed(&topic, 3, 2);
        (
            run_without_inbox(&topic, "read_committed"),
            run_without_inbox(&topic, "read_uncommitted"),
        )
    })
    .await
    .expect("produce and consume");
    assert_eq!(
        committed.0,
        Counts {
            records: 2,
            duplicates: 0
        },
        "read_committed log:\n{}",
        committed.1
    );
    assert_eq!(
        uncommitted.0,
        Counts {
            records: 5,
            duplicates: 0
        },
        "read_uncommitted log:\n{}",
        uncommitted.1
    );
}

#[tokio::test]
async fn with_the_inbox_a_repeated_event_id_is_applied_once() {
    let schema = common::unique_name("consumer_modes_inbox");
    let admin = common::admin_client().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.processed_events (consumer_name text NOT NULL, event_id uuid NOT NULL,
                                                     PRIMARY KEY (consumer_name, event_id));
             -- No unique key: a second application would be a second row.
             CREATE TABLE {schema}.effects (event_id uuid, order_id text, sku text, qty int);"
        ))
        .await
        .expect("inbox tables");
    let topic = common::unique_name("consumer_modes_inbox");
    common::create_topic(&topic, 2, &[]).await;
    let inbox_table = format!("{schema}.processed_events");
    let effects_table = format!("{schema}.effects");
    let log = tokio::task::spawn_blocking(move || {
        produce_plain(&topic, &repeated_sends());
        run_consumer_with_inbox(&topic, &inbox_table, &effects_table)
    })
    .await
    .expect("produce and consume");
    let last = final_line(&log);
    assert_eq!(
        (
            field(last, "records"),
            field(last, "duplicates"),
            field(last, "applied")
        ),
        (8, 3, 5),
        "log:\n{log}"
    );
    let (rows, distinct): (i64, i64) = {
        let row = admin
            .query_one(
                &format!("SELECT count(*), count(DISTINCT event_id) FROM {schema}.effects"),
                &[],
            )
            .await
            .expect("count the effects");
        (row.get(0), row.get(1))
    };
    assert_eq!(
        (rows, distinct),
        (5, 5),
        "one effect per event; log:\n{log}"
    );
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop the inbox schema");
}

#[test]
fn the_inbox_mode_without_a_database_is_refused_with_the_way_out() {
    // Bounded even if it wrongly started consuming.
    let out = Command::new(env!("CARGO_BIN_EXE_reference-consumer"))
        .args(["--exit-after-idle-ms", "1000"])
        .env("NO_COLOR", "1")
        .env_remove("CONSUMER_PG_URL")
        .env_remove("CONSUMER_NO_INBOX")
        .output()
        .expect("run the reference consumer");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--pg-url") && stderr.contains("--no-inbox"),
        "{stderr}"
    );
}

/// Review 2026-12-05 F3 (issue 49): a subscription that also matches the
/// dead-letter and replay topics, as the default `^outbox\..*` does for the
/// default names, applies only the live events; a dead-lettered record and
/// a replayed copy are logged, counted and passed over.
/// `--apply-side-records` reads them as before.
#[tokio::test]
async fn dead_lettered_and_replayed_records_are_not_applied_by_default() {
    let prefix = common::unique_name("consumer_side");
    let live = format!("{prefix}.event.order");
    let dlq = format!("{prefix}.dlq");
    let replay = format!("{prefix}.event.order.replay");
    for topic in [&live, &dlq, &replay] {
        common::create_topic(topic, 1, &[]).await;
    }
    let (by_default, applying_all) = tokio::task::spawn_blocking(move || {
        produce_plain(
            &live,
            &[("o1".into(), event_id(1)), ("o1".into(), event_id(2))],
        );
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", common::kafka_bootstrap())
            .create()
            .expect("producer");
        let id = event_id(3);
        producer
            .send(
                BaseRecord::to(dlq.as_str())
                    .key("o1")
                    .payload(r#"{"too":"large"}"#)
                    .headers(
                        OwnedHeaders::new()
                            .insert(Header {
                                key: "event_id",
                                value: Some(id.as_str()),
                            })
                            .insert(Header {
                                key: "dlq_reason",
                                value: Some("Broker: Message size too large"),
                            }),
                    ),
            )
            .unwrap_or_else(|(e, _)| panic!("send the dead-lettered record: {e}"));
        producer.flush(KAFKA_TIMEOUT).expect("flush");
        produce_plain(&replay, &[("o1".into(), event_id(1))]);
        let regex = format!("^{prefix}\\..*");
        (
            run_consumer_matching(&regex, &["--no-inbox"]),
            run_consumer_matching(&regex, &["--no-inbox", "--apply-side-records"]),
        )
    })
    .await
    .expect("producer and consumers");
    let last = final_line(&by_default);
    assert_eq!(
        (
            field(last, "records"),
            field(last, "duplicates"),
            field(last, "side_records")
        ),
        (2, 0, 2),
        "only the two live events are read; log:\n{by_default}"
    );
    assert!(
        by_default.contains("not applied: a dead-lettered record (Broker: Message size too large)")
            && by_default.contains("not applied: a record of a replay topic"),
        "each side record is reported with why; log:\n{by_default}"
    );
    let last = final_line(&applying_all);
    assert_eq!(
        (
            field(last, "records"),
            field(last, "duplicates"),
            field(last, "side_records")
        ),
        (4, 1, 0),
        "--apply-side-records reads all four (the replayed copy a duplicate); log:\n{applying_all}"
    );
}

/// Review F8: a value that does not fit its column (the effects table's `qty`
/// is `bigint`, the consumer binds an `int4`) fails the same way every time:
/// the consumer stops at once naming the clashing types, instead of retrying
/// the record forever.
#[tokio::test]
async fn a_type_mismatch_stops_the_consumer_naming_the_types() {
    let schema = common::unique_name("consumer_modes_types");
    let admin = common::admin_client().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.processed_events (consumer_name text NOT NULL, event_id uuid NOT NULL,
                                                     PRIMARY KEY (consumer_name, event_id));
             CREATE TABLE {schema}.effects (event_id uuid, order_id text, sku text, qty bigint);"
        ))
        .await
        .expect("inbox tables");
    let topic = common::unique_name("consumer_modes_types");
    common::create_topic(&topic, 1, &[]).await;
    let inbox_table = format!("{schema}.processed_events");
    let effects_table = format!("{schema}.effects");
    let started = Instant::now();
    let (status, log) = tokio::task::spawn_blocking(move || {
        produce_plain(&topic, &[("k".to_owned(), event_id(1))]);
        let pg_url = common::pg_admin_url();
        run_consumer_to_exit(
            &format!("^{topic}$"),
            &[
                "--pg-url",
                &pg_url,
                "--inbox-table",
                &inbox_table,
                "--effects-table",
                &effects_table,
            ],
        )
    })
    .await
    .expect("produce and consume");
    assert!(!status.success(), "the consumer must stop; log:\n{log}");
    assert!(
        log.contains("int8") && log.contains("i32"),
        "the error names both types; log:\n{log}"
    );
    assert!(
        !log.contains("retrying the same record"),
        "not retried; log:\n{log}"
    );
    assert!(started.elapsed() < RUN_LIMIT);
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop the inbox schema");
}

/// Review F9: a record that cannot be deduplicated (no `event_id` header)
/// stops the consumer, its offset uncommitted, with the way out named;
/// `--pass-over-unusable` logs it, counts it and goes on. A second consumer
/// name on the shipped effects table (keyed by event_id alone) is refused
/// before it fails on its first event.
#[tokio::test]
async fn a_record_without_event_id_stops_the_consumer_unless_passed_over() {
    let topic = common::unique_name("consumer_modes_unusable");
    common::create_topic(&topic, 1, &[]).await;
    let produced = topic.clone();
    let (stopped, passed) = tokio::task::spawn_blocking(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", common::kafka_bootstrap())
            .create()
            .expect("producer");
        producer
            .send(BaseRecord::<str, str>::to(&produced).key("k").payload("{}"))
            .unwrap_or_else(|(e, _)| panic!("send to {produced}: {e}"));
        producer.flush(KAFKA_TIMEOUT).expect("flush");
        produce_plain(&produced, &[("k".to_owned(), event_id(1))]);
        let regex = format!("^{produced}$");
        let stopped = run_consumer_to_exit(&regex, &["--no-inbox"]);
        let passed = run_consumer_to_exit(&regex, &["--no-inbox", "--pass-over-unusable"]);
        (stopped, passed)
    })
    .await
    .expect("produce and consume");
    let (status, log) = stopped;
    assert!(!status.success(), "stops by default; log:\n{log}");
    assert!(
        log.contains("no event_id header") && log.contains("--pass-over-unusable"),
        "names the record's fault and the way out; log:\n{log}"
    );
    let (status, log) = passed;
    assert!(status.success(), "log:\n{log}");
    let last = final_line(&log);
    assert_eq!(
        (field(last, "unusable"), field(last, "records")),
        (1, 1),
        "one passed over, the next one handled; log:\n{log}"
    );

    let output = Command::new(env!("CARGO_BIN_EXE_reference-consumer"))
        .args([
            "--consumer-name",
            "billing",
            "--pg-url",
            &common::pg_admin_url(),
        ])
        .args(["--bootstrap-servers", &common::kafka_bootstrap()])
        .args(["--exit-after-idle-ms", "1000"])
        .env_remove("CONSUMER_EFFECTS_TABLE")
        .env_remove("CONSUMER_NO_INBOX")
        .output()
        .expect("run the reference consumer");
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{err}");
    assert!(
        err.contains("effects table of its own"),
        "refused with the way out: {err}"
    );
}

/// Review F11: a record whose value is not JSON was applied as an effect of
/// NULLs. It is unusable now, like a record without an `event_id`: the
/// consumer stops naming it, or passes it over with `--pass-over-unusable`.
#[tokio::test]
async fn a_value_that_is_not_json_stops_the_consumer_unless_passed_over() {
    let topic = common::unique_name("consumer_modes_not_json");
    common::create_topic(&topic, 1, &[]).await;
    let produced = topic.clone();
    let (stopped, passed) = tokio::task::spawn_blocking(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", common::kafka_bootstrap())
            .create()
            .expect("producer");
        let id = event_id(7);
        producer
            .send(record(&produced, "k", "sku=1;qty=2", &id))
            .unwrap_or_else(|(e, _)| panic!("send to {produced}: {e}"));
        producer.flush(KAFKA_TIMEOUT).expect("flush");
        produce_plain(&produced, &[("k".to_owned(), event_id(8))]);
        let regex = format!("^{produced}$");
        let stopped = run_consumer_to_exit(&regex, &["--no-inbox"]);
        let passed = run_consumer_to_exit(&regex, &["--no-inbox", "--pass-over-unusable"]);
        (stopped, passed)
    })
    .await
    .expect("produce and consume");
    let (status, log) = stopped;
    assert!(!status.success(), "stops by default; log:\n{log}");
    assert!(
        log.contains("not a JSON object") && log.contains(&event_id(7)),
        "names the record and its fault; log:\n{log}"
    );
    let (status, log) = passed;
    assert!(status.success(), "log:\n{log}");
    let last = final_line(&log);
    assert_eq!(
        (field(last, "unusable"), field(last, "records")),
        (1, 1),
        "one passed over, the next one handled; log:\n{log}"
    );
}

/// Review F10: a second record with the same `event_id` and different
/// content was a silent duplicate (logged at info). The inbox compares it
/// with the effect recorded first: the first stands, the second is reported
/// at ERROR with both contents and counted as `conflicts=`.
#[tokio::test]
async fn the_same_event_id_with_different_content_is_reported() {
    let schema = common::unique_name("consumer_modes_conflict");
    let admin = common::admin_client().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.processed_events (consumer_name text NOT NULL, event_id uuid NOT NULL,
                                                     PRIMARY KEY (consumer_name, event_id));
             CREATE TABLE {schema}.effects (event_id uuid PRIMARY KEY, order_id text, sku text, qty int);"
        ))
        .await
        .expect("inbox tables");
    let topic = common::unique_name("consumer_modes_conflict");
    common::create_topic(&topic, 1, &[]).await;
    let inbox_table = format!("{schema}.processed_events");
    let effects_table = format!("{schema}.effects");
    let produced = topic.clone();
    let log = tokio::task::spawn_blocking(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", common::kafka_bootstrap())
            .create()
            .expect("producer");
        let (shared, same) = (event_id(21), event_id(22));
        for (id, payload) in [
            (&shared, r#"{"sku": "s-1", "qty": 1}"#),
            (&shared, r#"{"sku": "s-1", "qty": 5}"#),
            (&same, r#"{"sku": "s-2", "qty": 2}"#),
            (&same, r#"{"sku": "s-2", "qty": 2}"#),
        ] {
            producer
                .send(record(&produced, "o-1", payload, id))
                .unwrap_or_else(|(e, _)| panic!("send to {produced}: {e}"));
        }
        producer.flush(KAFKA_TIMEOUT).expect("flush");
        run_consumer_with_inbox(&produced, &inbox_table, &effects_table)
    })
    .await
    .expect("produce and consume");
    let last = final_line(&log);
    assert_eq!(
        (
            field(last, "applied"),
            field(last, "duplicates"),
            field(last, "conflicts")
        ),
        (2, 2, 1),
        "log:\n{log}"
    );
    let conflict = log
        .lines()
        .find(|l| l.contains("different content"))
        .unwrap_or_else(|| panic!("no conflict reported; log:\n{log}"));
    assert!(
        conflict.contains("ERROR")
            && conflict.contains(&event_id(21))
            && conflict.contains("qty=Some(1)")
            && conflict.contains("qty=Some(5)"),
        "{conflict}"
    );
    let qty: i32 = admin
        .query_one(
            &format!("SELECT qty FROM {schema}.effects WHERE event_id = $1::text::uuid"),
            &[&event_id(21)],
        )
        .await
        .expect("the recorded effect")
        .get(0);
    assert_eq!(qty, 1, "the effect recorded first stands");
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop the inbox schema");
}
