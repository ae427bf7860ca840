//! The `[kafka]` configuration: librdkafka properties passed through, with
//! the few the relay's guarantees depend on enforced.
//!
//! Enforced (set by us; a user value that contradicts them is refused):
//! * `enable.idempotence=true`: retries cannot reorder or duplicate records
//!   within a partition, which per-aggregate order (DESIGN.md §2.3) relies on.
//! * `acks=all` (`-1`; alias `request.required.acks`): a record is acknowledged
//!   only once every in-sync replica has it, so an acked LSN never covers a
//!   record a broker failure can still lose.
//! * `partitioner=murmur2_random`: the same key lands on the same partition as
//!   with the Java client's default partitioner (consumers and other producers
//!   agree on where an aggregate lives).
//! * no `transactional.id`: the relay uses the idempotent producer without
//!   Kafka transactions.
//!
//! * `message.timeout.ms=0` (and `delivery.timeout.ms`, its alias, 0 if set):
//!   records never time out. librdkafka's gapless guarantee does not cover
//!   timed-out records: with a finite timeout, e2 of an aggregate could time out
//!   while e3 (same key) is written, and the replay after the failure would
//!   put e2 after e3 in the partition. While Kafka is down the in-flight limits
//!   fill, the replication socket is not read, and the lag and oldest-unacked
//!   gauges rise: that is the alert, not a timeout.
//! * `enable.gapless.guarantee=true`: any other error that would leave a gap in
//!   a partition's sequence is fatal to the producer; the pipeline recreates it
//!   and replays from the durable acked LSN. librdkafka calls the property
//!   experimental and warns (CONFWARN) at every producer's creation; that
//!   warning is logged at DEBUG (client_log.rs).
//!
//! Defaulted (set by us unless the user sets it):
//! * `max.in.flight.requests.per.connection=1` (alias `max.in.flight`): one
//!   produce request at a time per broker. A broker that holds no state for
//!   the producer on a partition (a partition just created, the first write
//!   of a new producer, state expired after `producer.id.expiration.ms`)
//!   accepts any first sequence number (KAFKA-19880). With several requests
//!   in flight, a first batch refused with NOT_LEADER_OR_FOLLOWER while its
//!   successor is accepted leaves a gap that librdkafka can then report as
//!   delivered: records lost behind an acknowledged LSN. With one request in
//!   flight no later batch can overtake a refused one. The benchmark showed
//!   no throughput cost on one broker (docs/performance.md); a user who raises
//!   it accepts that window for throughput on a high-latency link.
//!
//! Record size: with the defaults, librdkafka's `message.max.bytes` (1,000,000)
//! is below the broker's (1,048,588), so a record that is too large is refused
//! locally, alone, when it is produced. If a topic's `max.message.bytes` is
//! smaller than the producer's `message.max.bytes`, the broker rejects the
//! whole batch and every record in it gets a poison report: set the producer's
//! `message.max.bytes` no larger than the smallest topic limit.
//!
//! Secrets (`*password*`, `*secret*`, private keys, PEM material, SASL
//! credentials and OAUTHBEARER configuration) are redacted in `Debug`,
//! `Display` and in every error.

use std::collections::BTreeMap;
use std::fmt;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::error::SinkError;

pub(crate) const REDACTED: &str = "[redacted]";

/// The delivery timeout (librdkafka `message.timeout.ms`): 0, infinite. See the module docs.
pub const DEFAULT_MESSAGE_TIMEOUT_MS: u32 = 0;

/// Produce requests in flight per broker unless `[kafka]` says otherwise. See the module docs.
pub const DEFAULT_MAX_IN_FLIGHT: &str = "1";

/// librdkafka properties for the producer, as given in the `[kafka]` table.
///
/// Values may be written as TOML strings, integers, floats or booleans; they
/// are kept as the strings librdkafka expects.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaSettings(BTreeMap<String, String>);

impl KafkaSettings {
    pub fn new() -> KafkaSettings {
        KafkaSettings::default()
    }

    /// Sets (or replaces) one property.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut KafkaSettings {
        self.0.insert(key.into(), value.into());
        self
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The configured bootstrap servers (`bootstrap.servers` or its alias
    /// `metadata.broker.list`).
    pub fn bootstrap_servers(&self) -> Option<&str> {
        self.get("bootstrap.servers")
            .or_else(|| self.get("metadata.broker.list"))
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    /// Checks the properties the relay's guarantees depend on. librdkafka
    /// itself checks names and value syntax when the producer is created.
    pub fn validate(&self) -> Result<(), SinkError> {
        if self.bootstrap_servers().is_none() {
            let (key, value) = match self.get("metadata.broker.list") {
                Some(v) => ("metadata.broker.list", v),
                None => (
                    "bootstrap.servers",
                    self.get("bootstrap.servers").unwrap_or("<unset>"),
                ),
            };
            return Err(config_error(
                key,
                value,
                "required: a comma-separated list of host:port of Kafka brokers",
            ));
        }
        if let Some(v) = self.get("enable.idempotence")
            && !is_true(v)
        {
            return Err(config_error(
                "enable.idempotence",
                v,
                "only `true` (set by outbox-cdc): the idempotent producer keeps \
                 per-partition order and avoids duplicates across retries",
            ));
        }
        for key in ["acks", "request.required.acks"] {
            if let Some(v) = self.get(key)
                && !matches!(v.trim().to_ascii_lowercase().as_str(), "all" | "-1")
            {
                return Err(config_error(
                    key,
                    v,
                    "only `all` or `-1` (set by outbox-cdc): an acknowledged record \
                     must be on every in-sync replica before its LSN is acknowledged",
                ));
            }
        }
        if let Some(v) = self.get("partitioner")
            && v.trim() != "murmur2_random"
        {
            return Err(config_error(
                "partitioner",
                v,
                "only `murmur2_random` (set by outbox-cdc): Java-client-compatible \
                 partitioning, so a key lands on the same partition as with Kafka's \
                 default partitioner",
            ));
        }
        for key in ["message.timeout.ms", "delivery.timeout.ms"] {
            if let Some(v) = self.get(key)
                && v.trim() != "0"
            {
                return Err(config_error(
                    key,
                    v,
                    "only `0` (infinite, set by outbox-cdc): a record that times out can \
                     be overtaken by a later record of the same aggregate, and the replay \
                     would then break per-aggregate order; watch \
                     outbox_cdc_oldest_unacked_age_seconds instead",
                ));
            }
        }
        if let Some(v) = self.get("enable.gapless.guarantee")
            && !is_true(v)
        {
            return Err(config_error(
                "enable.gapless.guarantee",
                v,
                "only `true` (set by outbox-cdc): a failed batch must stop the producer \
                 rather than leave a gap in an aggregate's sequence",
            ));
        }
        if let Some(v) = self.get("transactional.id") {
            return Err(config_error(
                "transactional.id",
                v,
                "not supported: outbox-cdc uses the idempotent producer without \
                 Kafka transactions; remove this key",
            ));
        }
        Ok(())
    }

    /// The effective properties: the user's, validated, plus ours.
    pub fn effective(&self) -> Result<KafkaSettings, SinkError> {
        self.validate()?;
        let mut out = self.clone();
        out.0.remove("request.required.acks");
        out.set("enable.idempotence", "true");
        out.set("acks", "all");
        out.set("partitioner", "murmur2_random");
        out.0.remove("delivery.timeout.ms");
        out.set("message.timeout.ms", DEFAULT_MESSAGE_TIMEOUT_MS.to_string());
        out.set("enable.gapless.guarantee", "true");
        if self.get("max.in.flight").is_none()
            && self.get("max.in.flight.requests.per.connection").is_none()
        {
            out.set(
                "max.in.flight.requests.per.connection",
                DEFAULT_MAX_IN_FLIGHT,
            );
        }
        Ok(out)
    }

    /// The rdkafka client configuration for the producer.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, SinkError> {
        let effective = self.effective()?;
        let mut config = ClientConfig::new();
        for (k, v) in effective.iter() {
            config.set(k, v);
        }
        Ok(config)
    }

    /// The value as it may be shown to a person or written to a log.
    pub fn display_value<'a>(&self, key: &str, value: &'a str) -> &'a str {
        if is_secret_key(key) { REDACTED } else { value }
    }
}

/// Maps a client-creation failure, keeping secrets out of the message.
pub(crate) fn creation_error(err: KafkaError) -> SinkError {
    match err {
        KafkaError::ClientConfig(_, description, key, value) => {
            config_error(&key, &value, &description)
        }
        KafkaError::ClientCreation(reason) => SinkError::ClientCreation { reason },
        other => SinkError::ClientCreation {
            reason: other.to_string(),
        },
    }
}

/// A config error whose value is redacted when the key names a secret.
pub(crate) fn config_error(key: &str, value: &str, allowed: &str) -> SinkError {
    let secret = is_secret_key(key);
    SinkError::Config {
        key: key.to_owned(),
        value: if secret {
            REDACTED.to_owned()
        } else {
            value.to_owned()
        },
        allowed: if secret && allowed.contains(value) && !value.is_empty() {
            allowed.replace(value, REDACTED)
        } else {
            allowed.to_owned()
        },
    }
}

/// librdkafka's boolean true spellings.
fn is_true(v: &str) -> bool {
    let v = v.trim();
    v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("t") || v == "1"
}

/// Whether a property's value must never be shown (the properties librdkafka
/// itself marks sensitive, plus anything named like a password or secret).
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "private",
        ".pem",
        "credential",
    ]
    .iter()
    .any(|needle| k.contains(needle))
        || matches!(
            k.as_str(),
            "ssl_key" | "ssl.key.location" | "sasl.username" | "sasl.oauthbearer.config"
        )
}

impl fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, self.display_value(k, v))))
            .finish()
    }
}

impl fmt::Display for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}={}", self.display_value(k, v))?;
        }
        Ok(())
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for KafkaSettings {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> KafkaSettings {
        KafkaSettings(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl From<BTreeMap<String, String>> for KafkaSettings {
    fn from(map: BTreeMap<String, String>) -> KafkaSettings {
        KafkaSettings(map)
    }
}

/// One property value: any TOML scalar, kept as librdkafka's string form.
pub(super) struct Scalar(pub(super) String);

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        struct ScalarVisitor;
        impl Visitor<'_> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, integer, float or boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
                Ok(Scalar(v))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(ScalarVisitor)
    }
}

impl<'de> serde::Deserialize<'de> for KafkaSettings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KafkaSettings, D::Error> {
        struct MapVisitor;
        impl<'de> Visitor<'de> for MapVisitor {
            type Value = KafkaSettings;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of librdkafka properties")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KafkaSettings, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    let Scalar(value) = map.next_value::<Scalar>().map_err(|e| {
                        de::Error::custom(format_args!("kafka property `{key}`: {e}"))
                    })?;
                    out.insert(key, value);
                }
                Ok(KafkaSettings(out))
            }
        }
        d.deserialize_map(MapVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> KafkaSettings {
        let mut s: KafkaSettings = pairs.iter().copied().collect();
        if s.get("bootstrap.servers").is_none() {
            s.set("bootstrap.servers", "127.0.0.1:19092");
        }
        s
    }

    /// `key = value` is refused, naming that key and value; what is allowed.
    fn refused(key: &str, value: &str) -> String {
        match settings(&[(key, value)]).validate() {
            Err(SinkError::Config {
                key: named,
                value: shown,
                allowed,
            }) => {
                assert_eq!((named.as_str(), shown.as_str()), (key, value));
                allowed
            }
            other => panic!("{key}={value} should be refused, got {other:?}"),
        }
    }

    #[test]
    fn refuses_weaker_acks() {
        let allowed = refused("acks", "1");
        assert!(allowed.contains("all"), "{allowed}");
        refused("request.required.acks", "0");
        for ok in ["all", "-1", "ALL"] {
            settings(&[("acks", ok)]).validate().unwrap();
        }
    }

    #[test]
    fn refuses_disabled_idempotence() {
        let allowed = refused("enable.idempotence", "false");
        assert!(allowed.contains("true"), "{allowed}");
        settings(&[("enable.idempotence", "true")])
            .validate()
            .unwrap();
    }

    #[test]
    fn refuses_other_partitioners_with_the_reason() {
        let allowed = refused("partitioner", "consistent_random");
        assert!(allowed.contains("murmur2_random"), "{allowed}");
        assert!(allowed.contains("Java-client-compatible"), "{allowed}");
    }

    #[test]
    fn refuses_transactions() {
        refused("transactional.id", "x");
    }

    #[test]
    fn requires_bootstrap_servers() {
        let s: KafkaSettings = [("linger.ms", "5")].into_iter().collect();
        match s.validate() {
            Err(SinkError::Config { key, value, .. }) => {
                assert_eq!(key, "bootstrap.servers");
                assert_eq!(value, "<unset>");
            }
            other => panic!("{other:?}"),
        }
        let s: KafkaSettings = [("bootstrap.servers", "  ")].into_iter().collect();
        assert!(
            matches!(s.validate(), Err(SinkError::Config { key, .. }) if key == "bootstrap.servers")
        );
        let s: KafkaSettings = [("metadata.broker.list", "h:1")].into_iter().collect();
        s.validate().unwrap();
    }

    #[test]
    fn effective_adds_ours_and_refuses_finite_timeouts() {
        let e = settings(&[("linger.ms", "1")]).effective().unwrap();
        assert_eq!(e.get("enable.idempotence"), Some("true"));
        assert_eq!(e.get("acks"), Some("all"));
        assert_eq!(e.get("partitioner"), Some("murmur2_random"));
        assert_eq!(e.get("message.timeout.ms"), Some("0"));
        assert_eq!(e.get("enable.gapless.guarantee"), Some("true"));
        assert_eq!(e.get("linger.ms"), Some("1"));
        assert_eq!(e.get("max.in.flight.requests.per.connection"), Some("1"));
        // The in-flight default yields to the user's value, under either name.
        for key in ["max.in.flight", "max.in.flight.requests.per.connection"] {
            let e = settings(&[(key, "5")]).effective().unwrap();
            assert_eq!(e.get(key), Some("5"), "{key}");
            let other = e
                .iter()
                .filter(|(k, _)| k.starts_with("max.in.flight"))
                .count();
            assert_eq!(other, 1, "{key}: one in-flight key, not two");
        }
        let e = settings(&[("delivery.timeout.ms", "0")])
            .effective()
            .unwrap();
        assert_eq!(e.get("delivery.timeout.ms"), None);
        assert_eq!(e.get("message.timeout.ms"), Some("0"));
        for key in ["message.timeout.ms", "delivery.timeout.ms"] {
            let err = settings(&[(key, "1000")]).effective().unwrap_err();
            assert!(
                matches!(&err, SinkError::Config { key: k, .. } if k == key),
                "{err}"
            );
        }
        let err = settings(&[("enable.gapless.guarantee", "false")])
            .validate()
            .unwrap_err();
        assert!(
            matches!(&err, SinkError::Config { key, .. } if key == "enable.gapless.guarantee"),
            "{err}"
        );
    }

    #[test]
    fn redacts_secrets_in_debug_display_and_errors() {
        let s = settings(&[
            ("sasl.password", "hunter2"),
            ("ssl.key.password", "s3cret-key"),
            ("sasl.oauthbearer.client.secret", "oauth-secret"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
        ]);
        for text in [format!("{s:?}"), s.to_string()] {
            for secret in ["hunter2", "s3cret-key", "oauth-secret"] {
                assert!(!text.contains(secret), "{text}");
            }
            assert!(text.contains("SCRAM-SHA-512"), "{text}");
            assert!(text.contains(REDACTED), "{text}");
        }
        let e = config_error("sasl.password", "hunter2", "bad value \"hunter2\"");
        let text = format!("{e} {e:?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("sasl.password"), "{text}");
        assert!(is_secret_key("my.custom.secret"));
        assert!(is_secret_key("ssl.keystore.password"));
        assert!(!is_secret_key("bootstrap.servers"));
    }

    #[test]
    fn deserializes_scalars_from_toml() {
        #[derive(serde::Deserialize)]
        struct Doc {
            kafka: KafkaSettings,
        }
        let doc: Doc = toml::from_str(
            r#"
            [kafka]
            "bootstrap.servers" = "127.0.0.1:19092"
            "linger.ms" = 5
            "enable.idempotence" = true
            "batch.num.messages" = 10000
            "#,
        )
        .unwrap();
        assert_eq!(doc.kafka.get("linger.ms"), Some("5"));
        assert_eq!(doc.kafka.get("enable.idempotence"), Some("true"));
        doc.kafka.validate().unwrap();

        let err = toml::from_str::<Doc>(
            r#"
            [kafka]
            "linger.ms" = [1, 2]
            "#,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("linger.ms"), "{err}");
    }
}
