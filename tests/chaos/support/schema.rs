//! Private objects of one chaos run: tables, publication, slot, topics and
//! consumer group all carry one unique name, so no other test's data mixes in.

use std::path::{Path, PathBuf};

use super::{kafka_bootstrap, pg_url};

/// The `[repair]` margins of the run's connector: the verdict allows a
/// duplicate across the gap repair of any row within them (harness.rs
/// `republished_by_repair`). `occurred_at` is the writing transaction's start,
/// and the writers' transactions last milliseconds: one minute instead of the
/// default hour keeps the repair's duplicates a bounded set, not the whole run.
pub struct RepairMargins {
    pub commit_time_margin_ms: u64,
    pub occurred_at_margin_ms: u64,
}

pub const REPAIR: RepairMargins = RepairMargins {
    commit_time_margin_ms: 10_000,
    occurred_at_margin_ms: 60_000,
};

pub struct Names {
    pub base: String,
    /// Outbox table (same shape as public.outbox_events).
    pub outbox: String,
    /// The business table: one row per order (the aggregate).
    pub orders: String,
    /// The business change each event describes: one row per order line.
    pub lines: String,
    /// Written by transactions that touch no outbox row at all.
    pub noise: String,
    /// The consumer's inbox (same shape as public.processed_events).
    pub inbox: String,
    /// The consumer's business effect, deliberately WITHOUT a unique key on
    /// event_id: a second application of an event would show as a second row.
    pub effects: String,
    pub publication: String,
    pub slot: String,
    pub topic_prefix: String,
    /// `[delivery] offsets_topic` of an exactly-once run: outside the
    /// `topic_prefix.` namespace, so neither the reader nor the consumer reads it.
    pub offsets_topic: String,
    pub group: String,
    pub consumer_name: String,
    /// The outbox is hash-partitioned on aggregate_id (three leaves, published
    /// under their own names).
    pub partitioned: bool,
}

impl Names {
    pub fn new(base: String, partitioned: bool) -> Names {
        Names {
            partitioned,
            outbox: format!("ob_{base}"),
            orders: format!("orders_{base}"),
            lines: format!("lines_{base}"),
            noise: format!("noise_{base}"),
            inbox: format!("inbox_{base}"),
            effects: format!("eff_{base}"),
            publication: format!("pub_{base}"),
            slot: format!("slot_{base}"),
            topic_prefix: base.clone(),
            offsets_topic: format!("offsets_{base}"),
            group: format!("g_{base}"),
            consumer_name: format!("inventory_{base}"),
            base,
        }
    }

    /// The topics the writer's two aggregate types route to.
    pub fn topics(&self) -> Vec<String> {
        super::workload::AGGREGATE_TYPES
            .iter()
            .map(|t| format!("{}.{t}", self.topic_prefix))
            .collect()
    }

    /// Creates the run's topics (3 partitions) before any consumer joins: a
    /// restarted static group member keeps its old assignment, so a topic
    /// appearing between two restarts would never be assigned (see
    /// reference-consumer's --instance-id).
    pub async fn create_topics(&self) {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .create()
            .expect("create the Kafka admin client");
        let names = self.topics();
        let topics: Vec<NewTopic<'_>> = names
            .iter()
            .map(|t| NewTopic::new(t, 3, TopicReplication::Fixed(1)))
            .collect();
        let results = admin
            .create_topics(&topics, &AdminOptions::new())
            .await
            .unwrap_or_else(|e| panic!("creating topics {names:?}: {e}"));
        for r in results {
            if let Err((topic, code)) = r {
                panic!("creating topic {topic}: {code}");
            }
        }
    }

    /// Deletes the run's topics and offsets topic (after a passing run).
    pub async fn delete_topics(&self) {
        use rdkafka::admin::{AdminClient, AdminOptions};
        use rdkafka::client::DefaultClientContext;
        let Ok(admin) = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .create::<AdminClient<DefaultClientContext>>()
        else {
            return;
        };
        let mut names = self.topics();
        names.push(self.offsets_topic.clone());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let _ = admin.delete_topics(&refs, &AdminOptions::new()).await;
    }

    /// librdkafka regex subscription of this run's topics.
    pub fn topic_regex(&self) -> String {
        format!("^{}\\..*", self.topic_prefix)
    }

    pub fn create_sql(&self) -> String {
        let Names {
            outbox,
            orders,
            lines,
            noise,
            inbox,
            effects,
            publication,
            ..
        } = self;
        let outbox_table = if self.partitioned {
            // Every unique key of a partitioned table includes its partition key.
            format!(
                "CREATE TABLE public.{outbox} (LIKE public.outbox_events INCLUDING DEFAULTS,
                     PRIMARY KEY (event_id, aggregate_id),
                     UNIQUE (aggregate_type, aggregate_id, aggregate_sequence)
                 ) PARTITION BY HASH (aggregate_id);
                 CREATE TABLE public.{outbox}_h0 PARTITION OF public.{outbox} FOR VALUES WITH (MODULUS 3, REMAINDER 0);
                 CREATE TABLE public.{outbox}_h1 PARTITION OF public.{outbox} FOR VALUES WITH (MODULUS 3, REMAINDER 1);
                 CREATE TABLE public.{outbox}_h2 PARTITION OF public.{outbox} FOR VALUES WITH (MODULUS 3, REMAINDER 2);"
            )
        } else {
            format!("CREATE TABLE public.{outbox} (LIKE public.outbox_events INCLUDING ALL);")
        };
        format!(
            "{outbox_table}
             GRANT SELECT ON public.{outbox} TO outbox;
             CREATE TABLE public.{orders} (order_id text PRIMARY KEY, customer text, changes int NOT NULL DEFAULT 0);
             CREATE TABLE public.{lines} (line_id text PRIMARY KEY, order_id text NOT NULL, sku text, qty int);
             CREATE TABLE public.{noise} (id bigserial PRIMARY KEY, note text);
             CREATE TABLE public.{inbox} (LIKE public.processed_events INCLUDING ALL);
             CREATE TABLE public.{effects} (event_id uuid NOT NULL, order_id text, sku text, qty int,
                                            applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
             -- The orders table is published too: its inserts reach the relay and must be ignored.
             CREATE PUBLICATION {publication} FOR TABLE public.{outbox}, public.{orders} WITH (publish = 'insert');"
        )
    }

    pub fn drop_sql(&self) -> String {
        format!(
            "DROP PUBLICATION IF EXISTS {}; DROP TABLE IF EXISTS public.{}, public.{}, public.{}, public.{}, public.{}, public.{};",
            self.publication,
            self.outbox,
            self.orders,
            self.lines,
            self.noise,
            self.inbox,
            self.effects
        )
    }

    /// The connector's configuration file; `exactly_once` adds the
    /// `[delivery]` section of the transactional mode, with short batches:
    /// many Kafka transactions, so many commits for the crash points to hit.
    /// With `small_work_mem`, the connector's sessions decode with
    /// logical_decoding_work_mem = 64kB (the server's smallest), and the
    /// connector keeps at most 16 KiB of streamed transactions in memory, so
    /// that kills find spill files on disk.
    pub fn connector_config(
        &self,
        offsets: &Path,
        exactly_once: bool,
        small_work_mem: bool,
    ) -> String {
        let url = match small_work_mem {
            true => {
                let url = pg_url();
                let sep = if url.contains('?') { "&" } else { "?" };
                format!("{url}{sep}options=-c%20logical_decoding_work_mem%3D64kB")
            }
            false => pg_url(),
        };
        let spill_budget = match small_work_mem {
            true => "max_spill_memory_bytes = 16384\n",
            false => "",
        };
        let delivery = if exactly_once {
            format!(
                r#"
[delivery]
mode = "exactly-once"
max_batch_ms = 50
offsets_topic = "{}"
"#,
                self.offsets_topic
            )
        } else {
            String::new()
        };
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
"linger.ms" = "5"

[offsets]
path = "{offsets}"
flush_interval_ms = 20

[limits]
shutdown_timeout_ms = 5000
{spill_budget}
# Each connector process serves /metrics on a port of its own
# (OUTBOX_CDC__HTTP__LISTEN, procs.rs); the repair and the audit none.
[http]
listen = ""

[repair]
commit_time_margin_ms = {commit_time_margin_ms}
occurred_at_margin_ms = {occurred_at_margin_ms}

[retry]
initial_backoff_ms = 100
max_backoff_ms = 1000
{delivery}"#,
            slot = self.slot,
            publication = self.publication,
            table = self.outbox,
            prefix = self.topic_prefix,
            kafka = kafka_bootstrap(),
            offsets = offsets.display(),
            commit_time_margin_ms = REPAIR.commit_time_margin_ms,
            occurred_at_margin_ms = REPAIR.occurred_at_margin_ms,
        )
    }

    /// Arguments of the reference consumer (static membership, so that a
    /// restarted instance gets its partitions back without a session timeout).
    pub fn consumer_args(&self) -> Vec<String> {
        [
            "--bootstrap-servers",
            &kafka_bootstrap(),
            "--pg-url",
            &super::pg_admin_url(),
            "--group",
            &self.group,
            "--instance-id",
            &format!("{}_1", self.group),
            "--consumer-name",
            &self.consumer_name,
            "--topic-regex",
            &self.topic_regex(),
            "--inbox-table",
            &format!("public.{}", self.inbox),
            "--effects-table",
            &format!("public.{}", self.effects),
            "--session-timeout-ms",
            "6000",
            "--metadata-refresh-ms",
            "500",
            "--max-backoff-ms",
            "1000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

/// Where this run's files go: config, offsets, process logs. Kept when the test fails.
pub fn work_dir(base: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("chaos")
        .join(base);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}
