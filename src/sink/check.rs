//! Preflight for `outbox-cdc check`: can we reach the cluster with the
//! configured settings (addresses, TLS, SASL)?

use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

use super::client_error::LastClientError;
use super::error::blocking;
use super::error::{SinkError, security_code};
use super::settings::KafkaSettings;
use super::settings::creation_error;

/// What the cluster told us about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerInfo {
    /// Number of brokers in the cluster metadata.
    pub broker_count: usize,
    /// `id@host:port` of each broker.
    pub brokers: Vec<String>,
    /// The broker that answered the metadata request (`host:port/id`).
    pub answered_by: String,
}

/// Keeps the client error that explains a metadata timeout (e.g. an
/// authentication or TLS failure) better than the timeout itself.
#[derive(Default)]
struct CheckContext {
    last_error: LastClientError,
}

impl ClientContext for CheckContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        super::client_log::log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, %reason, "Kafka client error during check");
        self.last_error.record(&error, reason);
    }
}

impl ProducerContext for CheckContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// How long a failed metadata request waits for the client error that
/// explains it.
const ERROR_GRACE: Duration = Duration::from_millis(1500);

/// Connects with `settings` (validated as for the real producer) and fetches
/// cluster metadata within `timeout`. Runs the blocking librdkafka calls on
/// tokio's blocking pool.
pub async fn check_reachable(
    settings: &KafkaSettings,
    timeout: Duration,
) -> Result<BrokerInfo, SinkError> {
    let config = settings.client_config()?;
    let bootstrap = settings.bootstrap_servers().unwrap_or_default().to_owned();
    blocking(move || {
        let producer = BaseProducer::from_config_and_context(&config, CheckContext::default())
            .map_err(creation_error)?;
        match producer.client().fetch_metadata(None, timeout) {
            Ok(metadata) => Ok(BrokerInfo {
                broker_count: metadata.brokers().len(),
                brokers: metadata
                    .brokers()
                    .iter()
                    .map(|b| format!("{}@{}:{}", b.id(), b.host(), b.port()))
                    .collect(),
                answered_by: metadata.orig_broker_name().to_owned(),
            }),
            Err(err) => Err(metadata_error(&producer, bootstrap, &err, ERROR_GRACE)),
        }
    })
    .await?
}

/// A failed metadata request, explained by the client error that caused it.
/// Error callbacks are queued until the client is polled, and the one that
/// explains a refusal can trail the failed request by a moment: up to
/// `grace` is waited for it. Blocking.
fn metadata_error(
    producer: &BaseProducer<CheckContext>,
    bootstrap: String,
    err: &KafkaError,
    grace: Duration,
) -> SinkError {
    producer.poll(Duration::ZERO);
    let until = std::time::Instant::now() + grace;
    while !producer.context().last_error.holds_refusal() && std::time::Instant::now() < until {
        producer.poll(Duration::from_millis(50));
    }
    let (code, detail) = producer.context().last_error.explain(err);
    SinkError::Metadata {
        code,
        bootstrap,
        detail,
    }
}

/// A client kept open for readiness: one metadata request at a time
/// (`health.kafka_probe_interval_ms`), on the connections librdkafka keeps
/// and re-opens by itself.
pub(crate) struct MetadataProbe {
    producer: std::sync::Arc<BaseProducer<CheckContext>>,
    bootstrap: String,
}

impl MetadataProbe {
    pub(crate) fn new(settings: &KafkaSettings) -> Result<MetadataProbe, SinkError> {
        let config = settings.client_config()?;
        let producer = BaseProducer::from_config_and_context(&config, CheckContext::default())
            .map_err(creation_error)?;
        Ok(MetadataProbe {
            producer: std::sync::Arc::new(producer),
            bootstrap: settings.bootstrap_servers().unwrap_or_default().to_owned(),
        })
    }

    /// Asks for the cluster's brokers (no topics) within `timeout`.
    pub(crate) async fn fetch(&self, timeout: Duration) -> Result<(), SinkError> {
        let producer = self.producer.clone();
        let bootstrap = self.bootstrap.clone();
        blocking(move || {
            // Serves the client's error callbacks (what explains a failure).
            producer.poll(Duration::ZERO);
            let topic: Option<&str> = None;
            match producer.client().fetch_metadata(topic, timeout) {
                Ok(_) => Ok(()),
                Err(err) => Err(metadata_error(&producer, bootstrap, &err, Duration::ZERO)),
            }
        })
        .await?
    }
}

/// Refuses a start whose Kafka credentials or certificates the broker
/// rejects: a configuration error that no retry cures, reported with its
/// cause instead of a producer that retries in the background forever. Any
/// other outcome (a broker that does not answer within `timeout` included)
/// is left to the producer's own retries.
pub async fn refuse_rejected_security(
    settings: &KafkaSettings,
    timeout: Duration,
) -> Result<(), SinkError> {
    match check_reachable(settings, timeout).await {
        Err(e) if e.code().is_some_and(security_code) => Err(e),
        _ => Ok(()),
    }
}
