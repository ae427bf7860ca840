//! Shared helpers for integration tests: where the test servers are, unique names.
//!
//! `scripts/env.sh up` starts PostgreSQL and Kafka and writes `target/env/test.env`
//! with the variables read here. A missing variable is a test failure, never a skip.
#![allow(dead_code)]

pub mod fake_pg;
pub mod ha;
pub mod relay;
pub mod writer;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

fn required(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{var} is not set: the integration tests need the test servers. \
             Run `scripts/env.sh up && . target/env/test.env` (or `scripts/test.sh`) first."
        ),
    }
}

/// URL of the `outbox` role (LOGIN REPLICATION, scram-sha-256) on the test cluster.
pub fn pg_url() -> String {
    required("OUTBOX_CDC_TEST_PG")
}

/// URL of a superuser on the test cluster, for set-up and inspection.
pub fn pg_admin_url() -> String {
    required("OUTBOX_CDC_TEST_PG_ADMIN")
}

/// Kafka bootstrap servers of the test broker.
pub fn kafka_bootstrap() -> String {
    required("OUTBOX_CDC_TEST_KAFKA")
}

/// A name unique to this test process and call, safe as a slot, publication,
/// table or topic name (lower-case letters, digits, underscores).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}_{}_{n}_{nanos:x}", std::process::id())
}

/// Connects a tokio-postgres client with the admin URL and drives its connection.
pub async fn admin_client() -> tokio_postgres::Client {
    let url = pg_admin_url();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test PostgreSQL as admin ({url}): {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A superuser client under `application_name` (how the server lists it, so
/// that its sessions can be found), or the error while the server is unreachable.
pub async fn try_admin_client_named(
    application_name: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = pg_admin_url().parse()?;
    config.application_name(application_name);
    let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// [`try_admin_client_named`], retried for up to 60 s: for tests that
/// restart PostgreSQL under it.
pub async fn admin_client_named_retried(application_name: &str) -> tokio_postgres::Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match try_admin_client_named(application_name).await {
            Ok(c) => return c,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!(
                "cannot connect to the test PostgreSQL as admin ({}): {e}",
                pg_admin_url()
            ),
        }
    }
}

/// Holds the test binary's one lock: for the tests that stop, restart or
/// reconfigure a shared server (tests/disruptive, tests/chaos, tests/standby),
/// each for its whole run. libtest runs the tests of a binary in parallel;
/// cargo runs the binaries one after another, so a test holding it runs
/// alone.
pub async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ALONE.lock().await
}

/// Creates `topic` on the test broker (replication factor 1) with
/// `partitions` partitions and the given topic configs, and waits until its
/// metadata shows every partition with a leader. Panics if it exists already.
///
/// The test broker, like a production one, does not create topics on first use
/// (`auto.create.topics.enable=false`): a test that produces without the
/// connector's `[topics] create = true` creates its topics with this.
pub async fn create_topic(topic: &str, partitions: i32, config: &[(&str, &str)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    let bootstrap = kafka_bootstrap();
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap_or_else(|e| panic!("admin client for {bootstrap}: {e}"));
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in config {
        new = new.set(k, v);
    }
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics([&new], &options)
        .await
        .unwrap_or_else(|e| panic!("create topic {topic} on {bootstrap}: {e}"));
    for result in results {
        if let Err((topic, code)) = result {
            panic!("create topic {topic} on {bootstrap}: {code}");
        }
    }
    let name = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while topic_partitions(&name) != Some(partitions as usize) {
            assert!(
                Instant::now() < deadline,
                "topic {name} did not show {partitions} partitions with leaders within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .expect("waiting for the topic's metadata");
}

/// The partitions of `topic` that have a leader, or `None` when the broker
/// does not know the topic. Asking never creates it.
pub fn topic_partitions(topic: &str) -> Option<usize> {
    use rdkafka::consumer::{BaseConsumer, Consumer};

    let bootstrap = kafka_bootstrap();
    let client: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("allow.auto.create.topics", "false")
        .create()
        .unwrap_or_else(|e| panic!("metadata client for {bootstrap}: {e}"));
    let metadata = client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata of {topic} from {bootstrap}: {e}"));
    let t = metadata.topics().iter().find(|t| t.name() == topic)?;
    if t.error().is_some() || t.partitions().is_empty() {
        return None;
    }
    Some(
        t.partitions()
            .iter()
            .filter(|p| p.error().is_none() && p.leader() >= 0)
            .count(),
    )
}

/// Runs `scripts/env.sh ARG` (stop or start a shared server); a failure is a
/// test failure. Tests that call it stop shared servers: they are in
/// tests/disruptive, tests/chaos or tests/standby and hold [`alone`]. The script is the one of the environment the tests
/// were given (`OUTBOX_CDC_ENV_SH`, written to test.env by `up`: a second
/// checkout's servers on other ports), else this checkout's.
pub fn env_sh(arg: &str) {
    let script = std::env::var("OUTBOX_CDC_ENV_SH")
        .unwrap_or_else(|_| format!("{}/scripts/env.sh", env!("CARGO_MANIFEST_DIR")));
    let status = std::process::Command::new("bash")
        .arg(&script)
        .arg(arg)
        .status()
        .unwrap_or_else(|e| panic!("scripts/env.sh {arg}: {e}"));
    assert!(status.success(), "scripts/env.sh {arg} failed: {status}");
}

/// The shared Kafka broker stopped (`scripts/env.sh kafka-stop`) until
/// [`KafkaStopped::restore`] or the end of the value's scope, so that a test
/// failing half-way still starts it again. For tests that hold [`alone`].
pub struct KafkaStopped {
    restored: bool,
}

impl KafkaStopped {
    pub fn stop() -> KafkaStopped {
        let stopped = KafkaStopped { restored: false };
        env_sh("kafka-stop");
        stopped
    }

    pub fn restore(&mut self) {
        if !self.restored {
            self.restored = true;
            env_sh("kafka-start");
        }
    }
}

impl Drop for KafkaStopped {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Turns `track_commit_timestamp` on or off (ALTER SYSTEM, then
/// `scripts/env.sh pg-restart`): for tests that hold [`alone`].
pub fn set_track_commit_timestamp(on: bool) {
    admin_statements(&[if on {
        "ALTER SYSTEM SET track_commit_timestamp = on"
    } else {
        "ALTER SYSTEM RESET track_commit_timestamp"
    }]);
    env_sh("pg-restart");
}

/// Runs `statements` one by one as the superuser, on a runtime of their own
/// (so that Drop guards can call it too).
pub fn admin_statements(statements: &[&str]) {
    let url = pg_admin_url();
    let statements: Vec<String> = statements.iter().map(|s| (*s).to_owned()).collect();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect as admin");
            tokio::spawn(conn);
            for sql in &statements {
                client.batch_execute(sql).await.expect(sql);
            }
        });
    })
    .join()
    .expect("admin statements");
}

/// Turns `track_commit_timestamp` off again (with a restart) when dropped.
pub struct TrackingOff;

impl Drop for TrackingOff {
    fn drop(&mut self) {
        set_track_commit_timestamp(false);
    }
}

/// Installs a tracing subscriber once (RUST_LOG controls it; silent by default).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        // The connector's info log is captured with the test's output, so a
        // failing test shows what the connector did, with librdkafka's own
        // warnings (RUST_LOG overrides).
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("outbox_cdc=info,rdkafka=warn")
            }),
        )
        .with_test_writer()
        .try_init();
}

/// The lines of the test broker's log (`$OUTBOX_CDC_ENV_DIR/kafka.log`) that
/// mention `needle`, at most the last `max`: evidence for a failure message.
pub fn kafka_log_lines(needle: &str, max: usize) -> Vec<String> {
    let Some(dir) = std::env::var_os("OUTBOX_CDC_ENV_DIR") else {
        return vec!["(OUTBOX_CDC_ENV_DIR is not set: no broker log)".to_owned()];
    };
    let path = std::path::Path::new(&dir).join("kafka.log");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let lines: Vec<String> = text
                .lines()
                .filter(|l| l.contains(needle))
                .map(str::to_owned)
                .collect();
            lines[lines.len().saturating_sub(max)..].to_vec()
        }
        Err(e) => vec![format!("(cannot read {}: {e})", path.display())],
    }
}

/// One prune pass as the running pruner makes one, with `acked` as the
/// acknowledged position: no aggregate parked, metrics of its own.
pub async fn prune_now(
    client: &tokio_postgres::Client,
    config: &outbox_cdc::config::Config,
    acked: outbox_cdc::pipeline::AckedPosition,
) -> Result<outbox_cdc::pipeline::PruneReport, outbox_cdc::pipeline::PruneError> {
    let metrics = outbox_cdc::metrics::Metrics::default();
    outbox_cdc::pipeline::prune_once(client, config, Some(acked), &[], &metrics, None).await
}
