//! Harness for end-to-end tests of the connector: a private outbox table,
//! publication and slot per test, the connector in-process or as a process,
//! and a Kafka consumer that reads everything back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_cdc::config::Config;
use outbox_cdc::metrics::Metrics;
use outbox_cdc::pg::Lsn;
use outbox_cdc::pipeline::{PipelineError, RunOptions};
use outbox_cdc::relay::{self, RelayError};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{admin_client, kafka_bootstrap, pg_url, unique_name};

/// One record as a consumer saw it.
#[derive(Debug, Clone)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub payload: String,
    pub timestamp_ms: Option<i64>,
    pub headers: BTreeMap<String, String>,
}

impl Record {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(String::as_str).unwrap_or("")
    }
}

/// A private outbox table + publication + slot + topic prefix + offsets dir.
pub struct Fixture {
    pub name: String,
    pub table: String,
    pub publication: String,
    pub slot: String,
    pub topic_prefix: String,
    pub offsets_dir: tempfile::TempDir,
    pub admin: tokio_postgres::Client,
}

impl Fixture {
    pub async fn new(prefix: &str) -> Fixture {
        let name = unique_name(prefix);
        let admin = admin_client().await;
        let table = format!("ob_{name}");
        let publication = format!("pub_{name}");
        let slot = format!("slot_{name}");
        admin
            .batch_execute(&format!(
                "CREATE TABLE public.{table} (LIKE public.outbox_events INCLUDING ALL);
                 GRANT SELECT ON public.{table} TO outbox;
                 CREATE PUBLICATION {publication} FOR TABLE public.{table} WITH (publish = 'insert');"
            ))
            .await
            .unwrap_or_else(|e| panic!("creating the fixture table {table}: {e}"));
        Fixture {
            topic_prefix: format!("t.{name}"),
            name,
            table,
            publication,
            slot,
            offsets_dir: tempfile::tempdir().expect("temp dir for offsets"),
            admin,
        }
    }

    pub fn offsets_path(&self) -> PathBuf {
        self.offsets_dir.path().join("offsets")
    }

    pub fn config_text(&self) -> String {
        format!(
            r#"
[postgres]
url = "{url}"
slot = "{slot}"
publication = "{publication}"
status_interval_ms = 1000

[outbox]
table = "public.{table}"
topic = "{prefix}.{{aggregate_type}}"

[kafka]
"bootstrap.servers" = "{kafka}"
"linger.ms" = "2"

# The test broker does not auto-create topics (as in production); the
# connector creates each test's topics on first use.
[topics]
create = true
partitions = 3
replication_factor = 1

[offsets]
path = "{offsets}"
flush_interval_ms = 20

[http]
listen = ""

[retry]
initial_backoff_ms = 200
max_backoff_ms = 2000
"#,
            url = pg_url(),
            slot = self.slot,
            publication = self.publication,
            table = self.table,
            prefix = self.topic_prefix,
            kafka = kafka_bootstrap(),
            offsets = self.offsets_path().display(),
        )
    }

    pub fn config(&self) -> Config {
        self.config_with("")
    }

    /// The fixture's config with extra TOML appended (later keys win per section
    /// only when the section is new; use env-style overrides for existing ones).
    pub fn config_with(&self, extra_env: &str) -> Config {
        let env: Vec<(String, String)> = extra_env
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Config::from_sources("fixture.toml", &self.config_text(), env)
            .unwrap_or_else(|e| panic!("fixture config invalid: {e}"))
    }

    pub fn write_config_file(&self) -> PathBuf {
        let path = self.offsets_dir.path().join("config.toml");
        std::fs::write(&path, self.config_text()).expect("write config file");
        path
    }

    /// Inserts `events` (aggregate_type, aggregate_id, payload JSON) in one
    /// transaction, committed or rolled back; returns the event ids.
    pub async fn write_tx(&self, events: &[(&str, &str, String)], commit: bool) -> Vec<String> {
        let mut ids = Vec::new();
        self.admin.batch_execute("BEGIN").await.expect("BEGIN");
        for (agg_type, agg_id, payload) in events {
            let row = self
                .admin
                .query_one(
                    &format!(
                        "INSERT INTO public.{t} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
                         VALUES (gen_random_uuid(), $1, $2,
                                 (SELECT coalesce(max(aggregate_sequence), 0) + 1 FROM public.{t}
                                   WHERE aggregate_type = $1 AND aggregate_id = $2),
                                 'TestEvent', $3::text::jsonb)
                         RETURNING event_id::text",
                        t = self.table
                    ),
                    &[agg_type, agg_id, payload],
                )
                .await
                .expect("insert outbox row");
            ids.push(row.get::<_, String>(0));
        }
        self.admin
            .batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
            .await
            .expect("end transaction");
        if commit { ids } else { Vec::new() }
    }

    /// One committed transaction of one `order` event on aggregate
    /// `<prefix><i>` with payload `{"i":<i>}`; its event id.
    pub async fn write_numbered(&self, prefix: &str, i: usize) -> Vec<String> {
        let aggregate = format!("{prefix}{i}");
        self.write_tx(&[("order", &aggregate, format!(r#"{{"i":{i}}}"#))], true)
            .await
    }

    /// Like [`Fixture::write_tx`] with a commit, and also returns
    /// `pg_current_wal_insert_lsn()` read right after COMMIT returned: an upper
    /// bound of the transaction's end LSN (its Commit `end_lsn`).
    pub async fn write_tx_ended_by(&self, events: &[(&str, &str, String)]) -> (Vec<String>, Lsn) {
        let ids = self.write_tx(events, true).await;
        (ids, self.wal_insert_lsn().await)
    }

    /// `pg_current_wal_insert_lsn()` now.
    pub async fn wal_insert_lsn(&self) -> Lsn {
        let text: String = self
            .admin
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .expect("pg_current_wal_insert_lsn")
            .get(0);
        text.parse().expect("an LSN")
    }

    /// `pg_current_wal_lsn()` now: the end of the WAL written so far.
    pub async fn current_wal_lsn(&self) -> Lsn {
        let text: String = self
            .admin
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("pg_current_wal_lsn")
            .get(0);
        text.parse().expect("an LSN")
    }

    /// Waits until the slot exists (a connector process created it).
    pub async fn wait_for_slot(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.slot_confirmed_flush().await.is_none() {
            assert!(
                Instant::now() < deadline,
                "slot {} was not created within 60 s",
                self.slot
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn slot_confirmed_flush(&self) -> Option<String> {
        let row = self
            .admin
            .query_opt(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .expect("read slot");
        row.and_then(|r| r.get::<_, Option<String>>(0))
    }

    /// The slot's `confirmed_flush_lsn`; panics when the slot is missing.
    pub async fn confirmed_lsn(&self) -> Lsn {
        let text = self
            .slot_confirmed_flush()
            .await
            .unwrap_or_else(|| panic!("slot {} does not exist", self.slot));
        text.parse().expect("confirmed_flush_lsn is an LSN")
    }

    /// Drops the slot (waiting for it to become inactive), publication and table.
    pub async fn cleanup(&self) {
        for _ in 0..50 {
            let active: Option<bool> = self
                .admin
                .query_opt(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                    &[&self.slot],
                )
                .await
                .ok()
                .flatten()
                .map(|r| r.get(0));
            match active {
                None => break,
                Some(false) => {
                    let _ = self
                        .admin
                        .execute("SELECT pg_drop_replication_slot($1)", &[&self.slot])
                        .await;
                    break;
                }
                Some(true) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        let _ = self
            .admin
            .batch_execute(&format!(
                "DROP PUBLICATION IF EXISTS {}; DROP TABLE IF EXISTS public.{};",
                self.publication, self.table
            ))
            .await;
    }
}

/// The connector running in this process.
pub struct Running {
    pub metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    handle: JoinHandle<Result<(), PipelineError>>,
}

impl Running {
    /// Starts the connector and waits until it streams (so that its slot
    /// exists before the test writes: a slot only sees changes made after it).
    pub async fn start(config: Config) -> Running {
        let running = Running::spawn(config, RunOptions::default());
        running.wait_streaming().await;
        running
    }

    /// Starts the connector without waiting (for starts that must be refused).
    pub fn spawn(config: Config, options: RunOptions) -> Running {
        let metrics = Arc::new(Metrics::default());
        let (stop, stop_rx) = watch::channel(false);
        // The binary's wiring (slot monitor, heartbeat, pruner, HTTP when
        // configured) around the pipeline; the tests' configurations disable
        // HTTP, so only the pipeline's own errors come back.
        let run = relay::run(Arc::new(config), options, metrics.clone(), stop_rx);
        let handle = tokio::spawn(async move {
            run.await.map_err(|e| match e {
                RelayError::Pipeline(e) => e,
                other => panic!("the relay did not start: {other}"),
            })
        });
        Running {
            metrics,
            stop,
            handle,
        }
    }

    pub async fn wait_streaming(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.metrics.is_connected() {
            assert!(
                !self.handle.is_finished(),
                "the connector stopped before streaming"
            );
            assert!(
                Instant::now() < deadline,
                "the connector did not start streaming within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the pipeline has returned (by itself: a refusal or a stop).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Signals a graceful stop and waits for the pipeline to return.
    pub async fn stop(self) -> Result<(), PipelineError> {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(60), self.handle)
            .await
            .expect("connector did not stop within 60 s")
            .expect("connector task panicked")
    }

    /// Waits for the pipeline to end by itself (e.g. a refused start).
    pub async fn finished(self, within: Duration) -> Result<(), PipelineError> {
        tokio::time::timeout(within, self.handle)
            .await
            .expect("connector did not finish in time")
            .expect("connector task panicked")
    }
}

/// The real binary running as a child process; killed (SIGKILL) when dropped,
/// so a failing test leaves nothing behind.
pub struct ChildProcess(std::process::Child);

impl ChildProcess {
    /// SIGTERM, then wait (bounded) for the exit status.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self.0.id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(
            sent.is_ok_and(|s| s.success()),
            "could not send SIGTERM to {pid}"
        );
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait for the connector") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "connector {pid} did not exit within {within:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status, if the process has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().expect("wait for the connector")
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL, like `kill -9`, and reap.
    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs the real binary with `config`; its log goes to `<config dir>/connector.log`.
pub fn spawn_binary(config: &Path) -> ChildProcess {
    spawn_binary_with(config, &[])
}

/// [`spawn_binary`] with extra environment variables (e.g. a crash point,
/// `OUTBOX_CDC_FAILPOINT`, or `OUTBOX_CDC__...` overrides).
pub fn spawn_binary_with(config: &Path, env: &[(&str, &str)]) -> ChildProcess {
    let log_path = config.with_file_name("connector.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .expect("open connector log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
        .args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn outbox-cdc");
    ChildProcess(child)
}

/// What the binary started with `config` logged so far (empty before its first line).
pub fn log_of(config: &Path) -> String {
    std::fs::read_to_string(config.with_file_name("connector.log")).unwrap_or_default()
}

/// Reads every record of topics matching `^<prefix>\.` until `expected`
/// records have arrived and then `settle` more time without new ones; panics
/// with what it has if `timeout` passes first.
pub fn consume(prefix: &str, expected: usize, timeout: Duration, settle: Duration) -> Vec<Record> {
    read_records(prefix, expected, timeout, settle).unwrap_or_else(|partial| {
        panic!(
            "consumer timed out after {timeout:?}: {} of {expected} records from topics {prefix}.*; {:?}",
            partial.len(),
            read_versus_ends(prefix, &partial)
        )
    })
}

/// [`read_ids`], panicking with what is missing and each partition's end
/// offset when `timeout` passes first.
pub fn consume_ids(
    prefix: &str,
    ids: &std::collections::BTreeSet<String>,
    timeout: Duration,
    settle: Duration,
) -> Vec<Record> {
    read_ids(prefix, ids, timeout, settle).unwrap_or_else(|partial| {
        let seen: std::collections::BTreeSet<&str> =
            partial.iter().map(|r| r.header("event_id")).collect();
        let missing: Vec<&String> = ids.iter().filter(|id| !seen.contains(id.as_str())).collect();
        panic!(
            "consumer timed out after {timeout:?}: {} of {} events from topics {prefix}.*, missing {missing:?}; {:?}",
            ids.len() - missing.len(),
            ids.len(),
            read_versus_ends(prefix, &partial)
        )
    })
}

/// Per partition of the topics `^<prefix>\.`, its end offset beside how many
/// records were read from it: tells a reader problem (the broker holds more)
/// from records that never reached the broker.
pub fn read_versus_ends(prefix: &str, read: &[Record]) -> Vec<String> {
    let mut counts: BTreeMap<(String, i32), usize> = BTreeMap::new();
    for r in read {
        *counts.entry((r.topic.clone(), r.partition)).or_default() += 1;
    }
    partition_ends(prefix)
        .into_iter()
        .map(|((t, p), high)| {
            let n = counts.get(&(t.clone(), p)).copied().unwrap_or(0);
            format!("{t}[{p}]: end offset {high}, read {n}")
        })
        .collect()
}

/// [`consume`], returning what arrived (`Err`) when `timeout` passes first,
/// so that a test can say which records are missing.
pub fn read_records(
    prefix: &str,
    expected: usize,
    timeout: Duration,
    settle: Duration,
) -> Result<Vec<Record>, Vec<Record>> {
    read_count(prefix, "read_committed", expected, timeout, settle)
}

/// Reads with `isolation` until `expected` records arrived (duplicates count).
fn read_count(
    prefix: &str,
    isolation: &str,
    expected: usize,
    timeout: Duration,
    settle: Duration,
) -> Result<Vec<Record>, Vec<Record>> {
    let mut count = 0;
    read_until(prefix, isolation, timeout, settle, expected == 0, |_| {
        count += 1;
        count >= expected
    })
}

/// Reads until a record with each of `ids` (header `event_id`) has arrived and
/// then `settle` more time without new ones; `Err` with what arrived when
/// `timeout` passes first. Unlike a count, duplicates (a replay after a
/// restart) cannot make it stop before the last row arrived.
pub fn read_ids(
    prefix: &str,
    ids: &std::collections::BTreeSet<String>,
    timeout: Duration,
    settle: Duration,
) -> Result<Vec<Record>, Vec<Record>> {
    let mut waiting: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    read_until(
        prefix,
        "read_committed",
        timeout,
        settle,
        ids.is_empty(),
        |r| {
            waiting.remove(r.header("event_id"));
            waiting.is_empty()
        },
    )
}

/// Each committed id was read exactly once (by a `read_committed` reader:
/// exactly-once delivery's promise).
pub fn assert_exactly_once(
    records: &[Record],
    committed: &std::collections::BTreeSet<String>,
    when: &str,
) {
    let mut copies: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records {
        *copies.entry(r.header("event_id")).or_default() += 1;
    }
    let twice: Vec<_> = copies.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{when}: read_committed saw duplicates {twice:?}"
    );
    let seen: std::collections::BTreeSet<String> = copies.keys().map(|s| (*s).to_owned()).collect();
    assert_eq!(&seen, committed, "{when}: committed versus read");
}

/// Reads (`read_committed`) from the fixture's topics until every committed
/// id arrived, within `timeout`; each must be there exactly once.
pub fn read_exactly_once(
    fx: &Fixture,
    committed: &std::collections::BTreeSet<String>,
    timeout: Duration,
    when: &str,
) {
    let records = consume_ids(&fx.topic_prefix, committed, timeout, Duration::from_secs(3));
    assert_exactly_once(&records, committed, when);
}

/// Every record of topics matching `^<prefix>\.`, those of aborted Kafka
/// transactions too (`isolation.level=read_uncommitted`), until `expected`
/// have arrived and `settle` passed without new ones (`Err` on `timeout`).
pub fn read_uncommitted(
    prefix: &str,
    expected: usize,
    timeout: Duration,
    settle: Duration,
) -> Result<Vec<Record>, Vec<Record>> {
    read_count(prefix, "read_uncommitted", expected, timeout, settle)
}

/// Reads every record of topics matching `^<prefix>\.`, passing each new one
/// to `enough` until it says so (or from the start when `enough_already`),
/// then `settle` more time without new records.
fn read_until(
    prefix: &str,
    isolation: &str,
    timeout: Duration,
    settle: Duration,
    enough_already: bool,
    mut enough: impl FnMut(&Record) -> bool,
) -> Result<Vec<Record>, Vec<Record>> {
    // Partitions are assigned by hand from offset 0, and the topic list is
    // refreshed from metadata: no consumer group, so no rebalance can re-read
    // or skip anything while the connector creates topics.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique_name("reader"))
        .set("enable.auto.commit", "false")
        .set("allow.auto.create.topics", "false")
        .set("isolation.level", isolation)
        // Should a partition's position ever be reset, read it again from
        // the start (records read twice are dropped below), never skip to
        // its end as the default `latest` would.
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("create consumer");
    // Topics are discovered through a client of their own: metadata requests
    // on the reading consumer itself stalled its fetching at random points
    // (librdkafka 2.12: 769 of 4850 records, then nothing for 30 s, no error).
    let discovery: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("create metadata client");
    let wanted = format!("{prefix}.");
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut assigned: std::collections::BTreeSet<(String, i32)> = std::collections::BTreeSet::new();
    let mut last_new = Instant::now();
    let mut last_refresh: Option<Instant> = None;
    let mut seen: std::collections::BTreeSet<(String, i32, i64)> =
        std::collections::BTreeSet::new();
    let mut done = enough_already;
    loop {
        if done && last_new.elapsed() >= settle {
            return Ok(out);
        }
        if Instant::now() > deadline {
            return Err(out);
        }
        if last_refresh.is_none_or(|t| t.elapsed() >= Duration::from_millis(500)) {
            last_refresh = Some(Instant::now());
            if let Ok(md) = discovery.fetch_metadata(None, Duration::from_secs(5)) {
                let mut grew = false;
                for t in md.topics().iter().filter(|t| t.name().starts_with(&wanted)) {
                    for p in t.partitions() {
                        grew |= assigned.insert((t.name().to_owned(), p.id()));
                    }
                }
                if grew {
                    // Re-assigning keeps the positions of partitions already
                    // read: each starts where it stands (new ones at 0).
                    let mut tpl = rdkafka::TopicPartitionList::new();
                    let positions = consumer.position().unwrap_or_default();
                    for (topic, partition) in &assigned {
                        let offset = positions
                            .find_partition(topic, *partition)
                            .map(|e| e.offset())
                            .filter(|o| matches!(o, rdkafka::Offset::Offset(_)))
                            .unwrap_or(rdkafka::Offset::Beginning);
                        tpl.add_partition_offset(topic, *partition, offset)
                            .expect("assignment");
                    }
                    consumer.assign(&tpl).expect("assign");
                }
            }
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                // Each record (topic, partition, offset) once.
                if !seen.insert((m.topic().to_owned(), m.partition(), m.offset())) {
                    continue;
                }
                last_new = Instant::now();
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| {
                                (
                                    x.key.to_owned(),
                                    x.value
                                        .map(|v| String::from_utf8_lossy(v).into_owned())
                                        .unwrap_or_default(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Record {
                    topic: m.topic().to_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m
                        .key()
                        .map(|k| String::from_utf8_lossy(k).into_owned())
                        .unwrap_or_default(),
                    payload: m
                        .payload()
                        .map(|p| String::from_utf8_lossy(p).into_owned())
                        .unwrap_or_default(),
                    timestamp_ms: m.timestamp().to_millis(),
                    headers,
                });
                if !done {
                    done = enough(out.last().expect("just pushed"));
                }
            }
            Some(Err(e)) => {
                // A partition whose leader is still being elected; it recovers.
                let _ = e;
            }
            None => {}
        }
    }
}

/// Number of partitions of `topic`.
pub fn partition_count(topic: &str) -> i32 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("create metadata client");
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("fetch metadata");
    md.topics()
        .first()
        .map(|t| t.partitions().len() as i32)
        .expect("topic in metadata")
}

/// Polls `check` every 200 ms until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("timed out after {timeout:?} waiting for: {what}");
}

/// The end offset (high watermark) of every partition of the topics matching
/// `^<prefix>\.`, keyed by (topic, partition). Topics not created yet are absent.
pub fn partition_ends(prefix: &str) -> BTreeMap<(String, i32), i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("create metadata client");
    let md = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("fetch metadata");
    let dotted = format!("{prefix}.");
    let mut out = BTreeMap::new();
    for t in md.topics().iter().filter(|t| t.name().starts_with(&dotted)) {
        for p in t.partitions() {
            let (_, high) = consumer
                .fetch_watermarks(t.name(), p.id(), Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("end offset of {}[{}]: {e}", t.name(), p.id()));
            out.insert((t.name().to_owned(), p.id()), high);
        }
    }
    out
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    probe.local_addr().expect("local addr").port()
}

/// Unlabelled samples from the connector's /metrics; `None` while it does not answer.
pub async fn scrape(port: u16) -> Option<std::collections::HashMap<String, f64>> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let body = outbox_cdc::http::get(addr, "/metrics", Duration::from_secs(2))
        .await
        .ok()?;
    Some(
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect(),
    )
}

pub async fn metric(port: u16, name: &str) -> f64 {
    let samples = scrape(port)
        .await
        .unwrap_or_else(|| panic!("the connector does not answer /metrics on port {port}"));
    *samples
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}
