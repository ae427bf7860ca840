//! Kafka client security against the real test broker (scripts/env.sh makes
//! its listeners): TLS, SASL_SSL with SCRAM-SHA-512, and TLS with a client
//! certificate. The connector publishes through each (its producer and its
//! topic admin client both use the configured security), and a wrong
//! password, an unknown CA and an expired client certificate each give one
//! error that names the cause, in `check` and in `run`.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::init_tracing;
use common::relay::{Fixture, Running, consume_ids};
use outbox_cdc::Disposition;
use outbox_cdc::config::Config;
use outbox_cdc::pipeline::{PipelineError, RunOptions};
use outbox_cdc::sink::{KafkaSettings, check_reachable};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start the test servers with `scripts/env.sh up` and source target/env/test.env")
    })
}

fn tls_file(name: &str) -> String {
    format!("{}/{name}", env("OUTBOX_CDC_TEST_KAFKA_TLS_DIR"))
}

/// One way of reaching the broker: a listener and the client properties it needs.
struct Access {
    name: &'static str,
    properties: Vec<(&'static str, String)>,
}

impl Access {
    fn ssl(ca: &str) -> Access {
        Access {
            name: "SSL",
            properties: vec![
                ("bootstrap.servers", env("OUTBOX_CDC_TEST_KAFKA_SSL")),
                ("security.protocol", "ssl".to_owned()),
                ("ssl.ca.location", tls_file(ca)),
            ],
        }
    }

    fn scram(password: &str) -> Access {
        Access {
            name: "SASL_SSL SCRAM-SHA-512",
            properties: vec![
                ("bootstrap.servers", env("OUTBOX_CDC_TEST_KAFKA_SASL_SSL")),
                ("security.protocol", "sasl_ssl".to_owned()),
                ("ssl.ca.location", tls_file("ca.pem")),
                ("sasl.mechanisms", "SCRAM-SHA-512".to_owned()),
                ("sasl.username", env("OUTBOX_CDC_TEST_KAFKA_SCRAM_USER")),
                ("sasl.password", password.to_owned()),
            ],
        }
    }

    fn mtls(client: &str) -> Access {
        Access {
            name: "mTLS",
            properties: vec![
                ("bootstrap.servers", env("OUTBOX_CDC_TEST_KAFKA_MTLS")),
                ("security.protocol", "ssl".to_owned()),
                ("ssl.ca.location", tls_file("ca.pem")),
                (
                    "ssl.certificate.location",
                    tls_file(&format!("{client}.pem")),
                ),
                ("ssl.key.location", tls_file(&format!("{client}.key"))),
            ],
        }
    }

    fn settings(&self) -> KafkaSettings {
        self.properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    /// The fixture's config with this access in `[kafka]`.
    fn config(&self, f: &Fixture) -> Config {
        let plain = format!(
            "\"bootstrap.servers\" = \"{}\"",
            env("OUTBOX_CDC_TEST_KAFKA")
        );
        let text = f.config_text();
        assert!(text.contains(&plain), "fixture config has no {plain}");
        let secured: String = self
            .properties
            .iter()
            .map(|(k, v)| format!("\"{k}\" = \"{v}\"\n"))
            .collect();
        let text = text.replace(&format!("{plain}\n"), &secured);
        Config::from_sources("secured.toml", &text, Vec::<(String, String)>::new())
            .unwrap_or_else(|e| panic!("{} config invalid: {e}", self.name))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_through_each_secured_listener() {
    init_tracing();
    for access in [
        Access::ssl("ca.pem"),
        Access::scram(&env("OUTBOX_CDC_TEST_KAFKA_SCRAM_PASSWORD")),
        Access::mtls("client"),
    ] {
        let info = check_reachable(&access.settings(), Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("{}: check: {e}", access.name));
        assert_eq!(info.broker_count, 1, "{}: {info:?}", access.name);

        let f = Fixture::new("sec").await;
        let running = Running::start(access.config(&f)).await;
        let mut written = BTreeSet::new();
        for i in 0..3 {
            written.extend(f.write_numbered("a", i).await);
        }
        // Read back over the plaintext listener: the records are on the broker.
        let records = consume_ids(
            &f.topic_prefix,
            &written,
            Duration::from_secs(60),
            Duration::ZERO,
        );
        assert_eq!(records.len(), 3, "{}", access.name);
        running
            .stop()
            .await
            .unwrap_or_else(|e| panic!("{}: stop: {e}", access.name));
        f.cleanup().await;
    }
}

/// Each refusal is one error that names its cause and the keys to check,
/// from `check` and from `run`, which stops (no retry loop) before it
/// touches the database: no slot is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_names_its_cause_in_check_and_run() {
    init_tracing();
    let cases = [
        (
            Access::scram("wrong-password"),
            "invalid credentials",
            "sasl.password",
        ),
        (
            Access::ssl("other-ca.pem"),
            "certificate verify failed",
            "ssl.ca.location",
        ),
        (
            Access::mtls("expired"),
            "SSL alert",
            "ssl.certificate.location",
        ),
    ];
    for (access, cause, key) in cases {
        let err = check_reachable(&access.settings(), Duration::from_secs(10))
            .await
            .map(|info| info.broker_count)
            .expect_err(access.name);
        let text = err.to_string();
        assert_eq!(
            err.disposition(),
            Disposition::Stop,
            "{}: {text}",
            access.name
        );
        assert!(
            text.contains(cause) && text.contains(key),
            "{}: check said: {text}",
            access.name
        );

        let f = Fixture::new("secbad").await;
        let running = Running::spawn(access.config(&f), RunOptions::default());
        let result = running.finished(Duration::from_secs(60)).await;
        match result {
            Err(PipelineError::Sink(e)) => {
                let text = e.to_string();
                assert_eq!(
                    e.disposition(),
                    Disposition::Stop,
                    "{}: {text}",
                    access.name
                );
                assert!(
                    text.contains(cause) && text.contains(key),
                    "{}: run said: {text}",
                    access.name
                );
            }
            other => panic!(
                "{}: run should stop on the refusal, got {other:?}",
                access.name
            ),
        }
        assert_eq!(
            f.slot_confirmed_flush().await,
            None,
            "{}: a slot was created",
            access.name
        );
        f.cleanup().await;
    }
}
