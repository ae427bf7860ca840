//! Topics must exist before a record is produced to them (DESIGN.md §6: "a
//! topic that does not exist is created (if configured) or is a clear stop,
//! never a replay loop").
//!
//! Before the first record to a topic in a producer's life, [`Topics::ensure`]
//! asks the cluster's metadata for that topic, with a separate admin client
//! whose `allow.auto.create.topics` is false (so asking never creates it,
//! whatever the broker's `auto.create.topics.enable` says):
//!
//! * it exists: remembered for this producer's life, the record goes out;
//! * it is missing and `[topics] create = true`: created with CreateTopics
//!   (`partitions`, `replication_factor`, `[topics.config]`; "already exists"
//!   from a race with another creator counts as success), then awaited until
//!   its metadata shows partitions and every partition's leader answers a
//!   ListOffsets request (bounded; after that a retryable error). Metadata
//!   alone is not enough: a broker lists a new partition's leader a moment
//!   before that leader holds the partition's log, and records produced in
//!   that moment get NOT_LEADER_OR_FOLLOWER. With the idempotent producer a
//!   first batch refused that way while the next batch is accepted is a gap
//!   the broker cannot see (it has no sequence state for this producer on a
//!   new partition, so it takes the later batch as the first), and
//!   librdkafka reports the refused batch as delivered once a later one is
//!   acknowledged. That is the likeliest reading of a loss CI saw on a
//!   loaded two-core machine (never reproduced locally): the first records
//!   of one partition of a topic created a moment before were missing on the
//!   broker, later ones were there, and every record had been reported
//!   delivered;
//! * it is missing and `create = false`, or Kafka refuses to describe or
//!   create it: [`SinkError::TopicMissing`], a *refused record* that names the
//!   topic and the fix. The pipeline's poison policy takes it from there:
//!   `fail` stops, `dead-letter` dead-letters the record (whose dead-letter
//!   topic goes through this same check).
//!
//! A metadata request that gets no answer (brokers down) is a retryable
//! [`SinkError::Metadata`]: the session restarts from the durable LSN with
//! backoff, as for any other Kafka outage.
//!
//! The blocking librdkafka metadata calls run on tokio's blocking pool.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use serde::Deserialize;

use super::client_error::LastClientError;
use super::error::blocking;
use super::error::{SinkError, poison_code, retryable_code};
use super::settings::creation_error;
use super::settings::{KafkaSettings, Scalar};
use crate::setting::InvalidSetting;

/// Default of `topics.partitions`.
pub const DEFAULT_PARTITIONS: i32 = 3;
/// Default of `topics.replication_factor`: -1, the broker's `default.replication.factor`.
pub const DEFAULT_REPLICATION_FACTOR: i32 = -1;

/// How long one metadata request for a topic may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the broker may take to create a topic (CreateTopics operation timeout).
const CREATE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a created topic may take until every partition has a leader that answers.
const VISIBLE_TIMEOUT: Duration = Duration::from_secs(30);
const VISIBLE_POLL: Duration = Duration::from_millis(100);

/// The `[topics]` section: what to do when a record's topic does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicSettings {
    /// Create a missing topic (CreateTopics, needs CREATE on the topic or the
    /// cluster). Default false: creating infrastructure is the operator's choice;
    /// a missing topic is then a refused record (see the module docs).
    pub create: bool,
    /// Partitions of a topic created by outbox-cdc. Default 3. Choose it once:
    /// adding partitions later moves keys, and with them per-aggregate order.
    pub partitions: i32,
    /// Replication factor of a topic created by outbox-cdc; -1 (default) is the
    /// broker's `default.replication.factor`.
    pub replication_factor: i32,
    /// Topic configs passed to CreateTopics (e.g. `"retention.ms" = "604800000"`).
    #[serde(deserialize_with = "scalar_map")]
    pub config: BTreeMap<String, String>,
}

impl Default for TopicSettings {
    fn default() -> Self {
        TopicSettings {
            create: false,
            partitions: DEFAULT_PARTITIONS,
            replication_factor: DEFAULT_REPLICATION_FACTOR,
            config: BTreeMap::new(),
        }
    }
}

impl TopicSettings {
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if self.partitions < 1 {
            return Err(InvalidSetting::new(
                "topics.partitions",
                self.partitions,
                "at least 1 (the partition count of topics outbox-cdc creates)",
            ));
        }
        if self.replication_factor != -1
            && !(1..=i32::from(i16::MAX)).contains(&self.replication_factor)
        {
            return Err(InvalidSetting::new(
                "topics.replication_factor",
                self.replication_factor,
                "-1 (the broker's default.replication.factor) or 1 to 32767",
            ));
        }
        for (key, value) in &self.config {
            if key.trim().is_empty() || key.chars().any(char::is_whitespace) {
                return Err(InvalidSetting::new(
                    format!("topics.config.{key:?}"),
                    value,
                    "a Kafka topic config name such as \"retention.ms\" (no spaces)",
                ));
            }
            if value.trim().is_empty() {
                return Err(InvalidSetting::new(
                    format!("topics.config.{key}"),
                    value,
                    "a non-empty value (leave the key out for the broker's default)",
                ));
            }
        }
        Ok(())
    }

    /// The command an operator can run to create `topic` by hand.
    fn create_command(&self, bootstrap: &str, topic: &str) -> String {
        let mut cmd = format!(
            "kafka-topics.sh --bootstrap-server {bootstrap} --create --topic {topic} --partitions {}",
            self.partitions
        );
        if self.replication_factor > 0 {
            cmd.push_str(&format!(
                " --replication-factor {}",
                self.replication_factor
            ));
        }
        for (k, v) in &self.config {
            cmd.push_str(&format!(" --config {k}={v}"));
        }
        cmd
    }
}

fn scalar_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let map = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(map.into_iter().map(|(k, Scalar(v))| (k, v)).collect())
}

/// Texts a [`SinkError::TopicMissing`] needs, fixed when the sink is created.
#[derive(Debug, Clone)]
pub(super) struct MissingTopicHint {
    settings: TopicSettings,
    bootstrap: String,
}

impl MissingTopicHint {
    /// The fix for a topic that does not exist.
    fn fix(&self, topic: &str) -> String {
        let command = self.settings.create_command(&self.bootstrap, topic);
        if self.settings.create {
            format!(
                "create it with `{command}`, or restart outbox-cdc to let it create the topic (topics.create = true)"
            )
        } else {
            format!(
                "create it with `{command}`, or set topics.create = true (OUTBOX_CDC__TOPICS__CREATE=true) to let outbox-cdc create missing topics"
            )
        }
    }

    /// A delivery (or produce) that failed because Kafka does not know the topic.
    pub(super) fn unknown_while_producing(
        &self,
        topic: &str,
        code: RDKafkaErrorCode,
        event_id: Option<String>,
    ) -> SinkError {
        SinkError::TopicMissing {
            topic: topic.to_owned(),
            reason: format!(
                "Kafka does not know it while producing ({code}): it was deleted or is not \
                 visible to this producer; {}",
                self.fix(topic)
            ),
            event_id,
        }
    }
}

/// Keeps the client error that explains a metadata timeout.
#[derive(Default)]
pub(super) struct AdminContext {
    last_error: LastClientError,
}

impl ClientContext for AdminContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, %reason, "Kafka admin client error");
        self.last_error.record(&error, reason);
    }
}

/// What the cluster says about one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopicState {
    Exists {
        partitions: usize,
    },
    Missing,
    /// A topic-level error other than "unknown topic".
    Error(RDKafkaErrorCode),
}

/// The topic-existence check of one producer (see the module docs).
pub(super) struct Topics {
    hint: MissingTopicHint,
    admin: Arc<AdminClient<AdminContext>>,
    /// Topics seen to exist during this producer's life.
    known: Mutex<HashSet<String>>,
}

impl Topics {
    pub(super) fn new(
        kafka: &KafkaSettings,
        settings: &TopicSettings,
    ) -> Result<Topics, SinkError> {
        let mut config = kafka.client_config()?;
        // The admin client only reads metadata and creates topics: it needs the
        // connection and security settings, not the idempotent producer, and
        // must never have the broker auto-create a topic it merely asks about.
        config.remove("enable.idempotence");
        config.remove("enable.gapless.guarantee");
        config.set("allow.auto.create.topics", "false");
        let admin = AdminClient::from_config_and_context(&config, AdminContext::default())
            .map_err(creation_error)?;
        Ok(Topics {
            hint: MissingTopicHint {
                settings: settings.clone(),
                bootstrap: kafka.bootstrap_servers().unwrap_or_default().to_owned(),
            },
            admin: Arc::new(admin),
            known: Mutex::new(HashSet::new()),
        })
    }

    pub(super) fn hint(&self) -> &MissingTopicHint {
        &self.hint
    }

    /// Whether `topic` was already seen to exist (the per-record fast path).
    pub(super) fn is_known(&self, topic: &str) -> bool {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(topic)
    }

    fn remember(&self, topic: &str) {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(topic.to_owned());
    }

    /// Makes sure `topic` exists (creating it when configured to). `event_id`
    /// is the record waiting for it, named in a refusal.
    pub(super) async fn ensure(&self, topic: &str, event_id: &str) -> Result<(), SinkError> {
        let refused = |reason: String| SinkError::TopicMissing {
            topic: topic.to_owned(),
            reason,
            event_id: Some(event_id.to_owned()),
        };
        match self.describe(topic).await? {
            TopicState::Exists { .. } => {
                self.remember(topic);
                Ok(())
            }
            TopicState::Error(code) if poison_code(code) => Err(refused(format!(
                "Kafka refuses to describe it ({code}); grant this principal DESCRIBE and WRITE on the topic"
            ))),
            TopicState::Error(code) => {
                // Transient (e.g. no leader yet): the producer waits for it as
                // for any leaderless partition. Not remembered: asked again.
                tracing::debug!(topic, code = ?code, "topic metadata has a transient error; producing anyway");
                Ok(())
            }
            TopicState::Missing if !self.hint.settings.create => Err(refused(format!(
                "it does not exist and topics.create = false; {}",
                self.hint.fix(topic)
            ))),
            TopicState::Missing => {
                let s = &self.hint.settings;
                self.create(topic, s.partitions, &s.config, refused).await?;
                self.wait_writable(topic, VISIBLE_TIMEOUT).await?;
                self.remember(topic);
                Ok(())
            }
        }
    }

    /// Makes sure the compacted topic of the exactly-once markers exists:
    /// created if missing (whatever `topics.create` says) with one partition,
    /// the configured replication factor and `cleanup.policy=compact`.
    /// Returns its partition count.
    pub(super) async fn ensure_compacted(&self, topic: &str) -> Result<usize, SinkError> {
        let refused = |reason: String| SinkError::OffsetsTopicRefused {
            topic: topic.to_owned(),
            reason,
        };
        match self.describe(topic).await? {
            TopicState::Exists { partitions } => return Ok(partitions),
            TopicState::Error(code) if retryable_code(code) => {
                return Err(SinkError::OffsetsTopicUnavailable {
                    topic: topic.to_owned(),
                    reason: format!("its metadata says {code}"),
                });
            }
            TopicState::Error(code) => {
                return Err(refused(format!(
                    "Kafka refuses to describe it ({code}); grant this principal DESCRIBE, READ and \
                     WRITE on it"
                )));
            }
            TopicState::Missing => {}
        }
        let compact = BTreeMap::from([("cleanup.policy".to_owned(), "compact".to_owned())]);
        self.create(topic, 1, &compact, refused).await?;
        self.wait_writable(topic, VISIBLE_TIMEOUT).await?;
        Ok(1)
    }

    async fn create(
        &self,
        topic: &str,
        partitions: i32,
        config: &BTreeMap<String, String>,
        refused: impl Fn(String) -> SinkError,
    ) -> Result<(), SinkError> {
        let s = &self.hint.settings;
        let mut new = NewTopic::new(
            topic,
            partitions,
            TopicReplication::Fixed(s.replication_factor),
        );
        for (k, v) in config {
            new = new.set(k, v);
        }
        let options = AdminOptions::new()
            .operation_timeout(Some(CREATE_TIMEOUT))
            .request_timeout(Some(CREATE_TIMEOUT + METADATA_TIMEOUT));
        let cannot = |what: String| {
            refused(format!(
                "outbox-cdc could not create it (topics.create = true): {what}; grant this principal \
                 CREATE on the topic or the cluster, fix [topics] (partitions, replication_factor, config), \
                 or create it with `{}`",
                s.create_command(&self.hint.bootstrap, topic)
            ))
        };
        let not_ready = |what: String| SinkError::TopicNotReady {
            topic: topic.to_owned(),
            reason: format!("creating it did not complete: {what}"),
        };
        let results = match self.admin.create_topics([&new], &options).await {
            Ok(results) => results,
            Err(err) => {
                let code = match &err {
                    KafkaError::AdminOp(code) => Some(*code),
                    other => other.rdkafka_error_code(),
                };
                return Err(match code {
                    Some(code) if retryable_code(code) => not_ready(err.to_string()),
                    _ => cannot(err.to_string()),
                });
            }
        };
        for result in results {
            match result {
                Ok(_) => {
                    tracing::info!(
                        topic,
                        partitions,
                        replication_factor = s.replication_factor,
                        "created missing topic"
                    );
                }
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    tracing::info!(topic, "topic was created by someone else meanwhile");
                }
                Err((_, code)) if retryable_code(code) => return Err(not_ready(code.to_string())),
                Err((_, code)) => return Err(cannot(format!("{code} ({code:?})"))),
            }
        }
        Ok(())
    }

    /// Waits (bounded) until a created topic's metadata shows its partitions
    /// and each partition's leader answers ListOffsets (see the module docs).
    async fn wait_writable(&self, topic: &str, timeout: Duration) -> Result<(), SinkError> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.describe(topic).await {
                Ok(TopicState::Exists { partitions }) => {
                    match self.unready_partitions(topic, partitions).await {
                        Ok(unready) if unready.is_empty() => {
                            tracing::debug!(topic, partitions, "created topic is writable");
                            return Ok(());
                        }
                        Ok(unready) => format!("partitions without a ready leader: {unready:?}"),
                        Err(e) => e.to_string(),
                    }
                }
                Ok(state) => format!("{state:?}"),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(SinkError::TopicNotReady {
                    topic: topic.to_owned(),
                    reason: format!(
                        "created, but its partitions did not all get a leader that answers within {timeout:?} (last: {last})"
                    ),
                });
            }
            tokio::time::sleep(VISIBLE_POLL).await;
        }
    }

    /// The partitions of `topic` (ids `0..partitions`) whose leader does not
    /// answer a ListOffsets request yet, with the code it gave; on the
    /// blocking pool.
    async fn unready_partitions(
        &self,
        topic: &str,
        partitions: usize,
    ) -> Result<Vec<(i32, RDKafkaErrorCode)>, SinkError> {
        let admin = Arc::clone(&self.admin);
        let name = topic.to_owned();
        blocking(move || {
            (0..i32::try_from(partitions).unwrap_or(i32::MAX))
                .filter_map(
                    |p| match admin.inner().fetch_watermarks(&name, p, METADATA_TIMEOUT) {
                        Ok(_) => None,
                        Err(e) => {
                            Some((p, e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail)))
                        }
                    },
                )
                .collect()
        })
        .await
    }

    /// One metadata request for `topic`, on the blocking pool.
    async fn describe(&self, topic: &str) -> Result<TopicState, SinkError> {
        let admin = Arc::clone(&self.admin);
        let name = topic.to_owned();
        let bootstrap = self.hint.bootstrap.clone();
        blocking(move || describe_blocking(&admin, &name, &bootstrap)).await?
    }
}

fn describe_blocking(
    admin: &AdminClient<AdminContext>,
    topic: &str,
    bootstrap: &str,
) -> Result<TopicState, SinkError> {
    let metadata = match admin.inner().fetch_metadata(Some(topic), METADATA_TIMEOUT) {
        Ok(metadata) => metadata,
        Err(err) => {
            let (code, detail) = admin.inner().context().last_error.explain(&err);
            return Err(SinkError::Metadata {
                code,
                bootstrap: bootstrap.to_owned(),
                detail: format!(
                    "asking for topic `{topic}`{}{detail}",
                    if detail.is_empty() { "" } else { ": " }
                ),
            });
        }
    };
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(TopicState::Missing);
    };
    Ok(match t.error().map(RDKafkaErrorCode::from) {
        None if t.partitions().is_empty() => TopicState::Missing,
        None => TopicState::Exists {
            partitions: t.partitions().len(),
        },
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            TopicState::Missing
        }
        Some(code) => TopicState::Error(code),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    /// A mock cluster with `topic`, whose leaders answer the first `refusals`
    /// ListOffsets requests with "not leader for partition".
    fn mock_topics(
        topic: &str,
        refusals: usize,
    ) -> (MockCluster<'static, DefaultProducerContext>, Topics) {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic(topic, 3, 1).expect("mock topic");
        let mut kafka = KafkaSettings::new();
        kafka.set("bootstrap.servers", cluster.bootstrap_servers());
        let topics = Topics::new(&kafka, &TopicSettings::default()).expect("topics");
        cluster.request_errors(
            RDKafkaApiKey::ListOffsets,
            &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; refusals],
        );
        (cluster, topics)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_topic_whose_leaders_do_not_answer_is_not_writable() {
        let (_cluster, topics) = mock_topics("leaderless", 1000);
        let err = topics
            .wait_writable("leaderless", Duration::from_secs(2))
            .await
            .expect_err("metadata shows the partitions, but no leader answers ListOffsets");
        assert!(
            matches!(&err, SinkError::TopicNotReady { reason, .. } if reason.contains("without a ready leader")),
            "{err}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_topic_becomes_writable_once_its_leaders_answer() {
        let (_cluster, topics) = mock_topics("settling", 3);
        topics
            .wait_writable("settling", Duration::from_secs(20))
            .await
            .expect("writable once the leader answers");
    }

    #[test]
    fn defaults_are_documented_values() {
        let s = TopicSettings::default();
        assert!(!s.create);
        assert_eq!(s.partitions, 3);
        assert_eq!(s.replication_factor, -1);
        assert!(s.config.is_empty());
        s.validate().unwrap();
    }

    #[test]
    fn create_command_names_topic_partitions_and_configs() {
        let mut s = TopicSettings {
            partitions: 6,
            replication_factor: 3,
            ..TopicSettings::default()
        };
        s.config.insert("retention.ms".into(), "1000".into());
        let cmd = s.create_command("b:9092", "orders");
        assert_eq!(
            cmd,
            "kafka-topics.sh --bootstrap-server b:9092 --create --topic orders --partitions 6 \
             --replication-factor 3 --config retention.ms=1000"
        );
        s.replication_factor = -1;
        assert!(!s.create_command("b", "t").contains("replication-factor"));
    }
}
