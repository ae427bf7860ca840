//! Preflight for `outbox-cdc check`: can we reach the cluster with the
//! configured settings (addresses, TLS, SASL)?

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;

use super::error::SinkError;
use super::producer::creation_error;
use super::settings::KafkaSettings;

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

/// Remembers the last client error, which explains a metadata timeout
/// (e.g. an authentication or TLS failure) better than the timeout itself.
#[derive(Default)]
struct CheckContext {
    last_error: Mutex<Option<(Option<RDKafkaErrorCode>, String)>>,
}

impl ClientContext for CheckContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, %reason, "Kafka client error during check");
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some((error.rdkafka_error_code(), reason.to_owned()));
        }
    }
}

impl ProducerContext for CheckContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// Connects with `settings` (validated as for the real producer) and fetches
/// cluster metadata within `timeout`. Runs the blocking librdkafka calls on
/// tokio's blocking pool.
pub async fn check_reachable(
    settings: &KafkaSettings,
    timeout: Duration,
) -> Result<BrokerInfo, SinkError> {
    let config = settings.client_config()?;
    let bootstrap = settings.bootstrap_servers().unwrap_or_default().to_owned();
    tokio::task::spawn_blocking(move || {
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
            Err(err) => {
                let last = producer
                    .context()
                    .last_error
                    .lock()
                    .ok()
                    .and_then(|mut l| l.take());
                let (code, detail) = match last {
                    // A timeout says less than the error that caused it.
                    Some((Some(code), reason)) => (Some(code), reason),
                    Some((None, reason)) => (err.rdkafka_error_code(), reason),
                    None => (err.rdkafka_error_code(), String::new()),
                };
                Err(SinkError::Metadata {
                    code,
                    bootstrap,
                    detail,
                })
            }
        }
    })
    .await
    .map_err(|e| SinkError::Task {
        reason: e.to_string(),
    })?
}
