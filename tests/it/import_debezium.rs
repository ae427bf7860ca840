//! `outbox-cdc import-debezium` as a user runs it: a Debezium connector's
//! Kafka Connect JSON in, a configuration that `validate-config` accepts out,
//! the settings without an equivalent on stderr; and the real-world
//! connector configurations of `tests/fixtures/debezium/`, each imported to a
//! configuration that passes `check`'s configuration-level judgement, with
//! exactly the settings named that have no equivalent. No servers needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use outbox_cdc::config::Config;
use outbox_cdc::debezium::{import, parse_connector};

const CONNECTOR: &str = r#"{
  "name": "inventory-outbox",
  "config": {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "database.hostname": "postgres",
    "database.port": "5432",
    "database.user": "postgres",
    "database.password": "pw-in-json",
    "database.dbname": "inventory",
    "topic.prefix": "dbserver1",
    "plugin.name": "pgoutput",
    "table.include.list": "inventory.outboxevent",
    "tombstones.on.delete": "false",
    "transforms": "outbox",
    "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
    "transforms.outbox.route.topic.replacement": "${routedByValue}.events",
    "transforms.outbox.table.fields.additional.placement": "type:header:eventType"
  }
}"#;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_outbox-cdc"))
}

#[test]
fn imports_a_connector_json_into_a_config_that_validates() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("connector.json");
    std::fs::write(&input, CONNECTOR).unwrap();
    let output = dir.path().join("outbox-cdc.toml");

    let run = bin()
        .arg("import-debezium")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let toml = std::fs::read_to_string(&output).unwrap();
    assert!(
        toml.contains(r#"table = "inventory.outboxevent""#),
        "{toml}"
    );
    assert!(
        toml.contains(r#"topic = "{aggregate_type}.events""#),
        "{toml}"
    );
    assert!(toml.contains(r#"slot = "debezium""#), "{toml}");
    assert!(
        !toml.contains("pw-in-json"),
        "the password reached the file: {toml}"
    );
    assert!(toml.contains(r#"connector "inventory-outbox""#), "{toml}");
    // Debezium's placement syntax is taken as it is.
    assert!(
        toml.contains(r#"additional_placement = ["type:header:eventType"]"#),
        "{toml}"
    );
    // Each setting without an equivalent is named with its reason.
    for key in ["database.password", "topic.prefix", "tombstones.on.delete"] {
        assert!(stderr.contains(key), "{key} missing from: {stderr}");
    }

    let validate = bin()
        .arg("validate-config")
        .arg("--config")
        .arg(&output)
        .output()
        .unwrap();
    assert!(
        validate.status.success(),
        "{}",
        String::from_utf8_lossy(&validate.stderr)
    );

    // An existing file is not overwritten.
    let again = bin()
        .arg("import-debezium")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert_eq!(std::fs::read_to_string(&output).unwrap(), toml);
}

#[test]
fn a_connector_without_the_outbox_router_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("plain.properties");
    std::fs::write(
        &input,
        "connector.class=io.debezium.connector.postgresql.PostgresConnector\n",
    )
    .unwrap();
    let run = bin().arg("import-debezium").arg(&input).output().unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("EventRouter"), "{stderr}");
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/debezium")
        .join(name)
}

/// One fixture: the keys its import notes (exactly), lines the imported file
/// must hold, and what a user gives as the notes ask (environment variables).
struct Case {
    file: &'static str,
    noted: &'static [&'static str],
    lines: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

/// Keys every connector config without a worker part gets noted: the
/// worker's bootstrap servers, Debezium's own topic prefix, and the
/// publication Debezium creates for all tables when not told otherwise.
const COMMON: [&str; 3] = [
    "bootstrap.servers",
    "publication.autocreate.mode",
    "topic.prefix",
];

const CASES: &[Case] = &[
    Case {
        file: "defaults.properties",
        noted: &["database.password", "key.converter", "value.converter"],
        lines: &[
            r#"url = "postgres://postgres@postgres:5432/postgres"  # password: PGPASSWORD"#,
            r#"slot = "debezium"  # Debezium's slot: resumed at its confirmed_flush_lsn"#,
            r#"publication = "dbz_publication""#,
            r#"table = "inventory.outboxevent""#,
            r#"topic = "outbox.event.{aggregate_type}""#,
            r#"payload_format = "json-string""#,
        ],
        env: &[],
    },
    Case {
        file: "event-type-header.json",
        noted: &["database.password"],
        lines: &[
            r#"additional_placement = ["type:header:eventType"]"#,
            r#"slot = "orders_outbox"  # Debezium's slot: resumed at its confirmed_flush_lsn"#,
            r#"payload_format = "json-string""#,
        ],
        env: &[],
    },
    Case {
        file: "expand-json-payload.json",
        noted: &["transforms.outbox.table.expand.json.payload"],
        lines: &[
            r#"url = "postgres://cdc@customers-db:5432/customers?sslmode=require"  # password: PGPASSWORD"#,
            r#"create_publication = false"#,
            r#"table = "public.outbox""#,
            r#"payload_format = "as-stored""#,
            "heartbeat_interval_ms = 30000",
        ],
        env: &[],
    },
    Case {
        file: "route-by-field.properties",
        noted: &["snapshot.mode", "tombstones.on.delete"],
        lines: &[
            r#"url = "postgres://shipping_cdc@10.0.3.17:5433/shipping"  # password: PGPASSWORD"#,
            r#"table = "shipping.outbox_messages""#,
            r#"topic = "{aggregate_type}.events""#,
            r#"payload_format = "as-stored""#,
            r#"event_id = "message_id""#,
            r#"aggregate_id = "aggregate_id""#,
            r#"aggregate_type = "aggregate_type""#,
            r#"payload = "body""#,
            r#""compression.type" = "lz4""#,
            r#""linger.ms" = "20""#,
        ],
        env: &[],
    },
    Case {
        file: "route-topic-regex.json",
        noted: &[],
        lines: &[
            "[outbox.route]",
            r#"regex = '(?<domain>[a-z]+)\.(?<kind>[A-Za-z]+)'"#,
            r#"replacement = "${domain}.events.${kind}""#,
        ],
        env: &[],
    },
    Case {
        file: "envelope-and-partition.properties",
        noted: &[],
        lines: &[
            r#"additional_placement = ["type:envelope:eventType", "tenant_id:header:tenant", "partition_key:partition"]"#,
        ],
        env: &[],
    },
    Case {
        file: "tombstone-on-empty-payload.json",
        noted: &[
            "transforms.outbox.route.tombstone.on.empty.payload",
            "transforms.outbox.table.field.event.timestamp",
        ],
        lines: &[r#"payload_format = "as-stored""#],
        env: &[],
    },
    Case {
        file: "secrets-file.properties",
        noted: &[
            "database.password",
            "database.user",
            "producer.override.sasl.jaas.config",
            "producer.override.ssl.truststore.location",
            "producer.override.ssl.truststore.password",
        ],
        lines: &[
            r#"url = "postgres://postgres@payments-db.prod.internal:5432/payments?sslmode=verify-full&sslrootcert=/opt/kafka/secrets/rds-ca.pem"  # password: PGPASSWORD"#,
            r#""security.protocol" = "SASL_SSL""#,
            r#""sasl.mechanism" = "SCRAM-SHA-512""#,
        ],
        env: &[
            (
                "OUTBOX_CDC__POSTGRES__URL",
                "postgres://payments_cdc@payments-db.prod.internal:5432/payments?sslmode=verify-full&sslrootcert=/opt/kafka/secrets/rds-ca.pem",
            ),
            ("OUTBOX_CDC__KAFKA__SASL_USERNAME", "payments-relay"),
            ("OUTBOX_CDC__KAFKA__SASL_PASSWORD", "from-the-secret-store"),
        ],
    },
    Case {
        file: "secrets-env.json",
        noted: &[
            "database.hostname",
            "database.password",
            "producer.override.sasl.jaas.config",
        ],
        lines: &[
            r#"url = "postgres://accounts_cdc@localhost:5432/accounts"  # password: PGPASSWORD"#,
            r#""bootstrap.servers" = "pkc-0000.eu-west-1.aws.confluent.cloud:9092""#,
            r#""sasl.username" = "ACCOUNTSKEY""#,
            r#""sasl.mechanism" = "PLAIN""#,
        ],
        env: &[
            (
                "OUTBOX_CDC__POSTGRES__URL",
                "postgres://accounts_cdc@accounts-db:5432/accounts",
            ),
            ("OUTBOX_CDC__KAFKA__SASL_PASSWORD", "from-the-secret-store"),
        ],
    },
    Case {
        file: "binary-payload.json",
        noted: &[
            "value.converter",
            "value.converter.delegate.converter.type",
            "value.converter.delegate.converter.type.schemas.enable",
        ],
        lines: &[r#"payload_format = "as-stored""#],
        env: &[],
    },
    Case {
        file: "legacy-1x.json",
        noted: &[
            "database.password",
            "database.server.name",
            "key.converter",
            "tombstones.on.delete",
            "value.converter",
        ],
        lines: &[
            r#"table = "inventory.outboxevent""#,
            r#"topic = "{aggregate_type}.events""#,
        ],
        env: &[],
    },
    Case {
        file: "predicate.properties",
        noted: &[
            "predicates",
            "predicates.isOutboxTable.pattern",
            "predicates.isOutboxTable.type",
            "transforms.outbox.predicate",
        ],
        lines: &["heartbeat_interval_ms = 10000"],
        env: &[],
    },
    Case {
        file: "issue-34.properties",
        noted: &[
            "database.password",
            "transforms.outbox.table.fields.additional.placement",
        ],
        lines: &[
            r#"additional_placement = ["event_type:header:event_type", "aggregate_sequence:header:aggregate_sequence", "schema_version:header:schema_version"]"#,
            r#"event_type = "event_type""#,
            r#"aggregate_sequence = "aggregate_sequence""#,
            r#"schema_version = "schema_version""#,
        ],
        env: &[],
    },
];

/// What `check` judges before it connects anywhere: the file loads, the
/// URL parses, the outbox table and mapped columns resolve, and librdkafka
/// creates a producer from `[kafka]` (it checks every property then).
fn config_level_check(config: &Config) -> Result<(), String> {
    outbox_cdc::pg::PgConnectConfig::parse_with_env(&config.postgres.url, |_| None)
        .map_err(|e| format!("postgres.url: {e}"))?;
    outbox_cdc::coverage::configured_table(&config.outbox).map_err(|e| e.to_string())?;
    config.outbox.mapped_columns().map_err(|e| e.to_string())?;
    let effective = config.kafka.effective().map_err(|e| e.to_string())?;
    let mut client = rdkafka::ClientConfig::new();
    for (k, v) in effective.iter() {
        client.set(k, v);
    }
    client
        .create::<rdkafka::producer::BaseProducer>()
        .map(drop)
        .map_err(|e| format!("librdkafka: {e}"))
}

#[test]
fn every_real_world_connector_imports_to_a_config_check_accepts_or_names_what_has_no_equivalent() {
    let mut files: BTreeSet<String> = std::fs::read_dir(fixture(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json") || n.ends_with(".properties"))
        .collect();
    for case in CASES {
        assert!(files.remove(case.file), "no fixture {}", case.file);
        let text = std::fs::read_to_string(fixture(case.file)).unwrap();
        let imported = import(&parse_connector(&text).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", case.file));
        let context = format!("{}:\n{}", case.file, imported.toml);
        // Exactly these keys are noted, each with a reason.
        let noted: BTreeSet<&str> = imported.notes.iter().map(|n| n.key.as_str()).collect();
        let mut expected: BTreeSet<&str> = case.noted.iter().copied().collect();
        for key in COMMON {
            let worker =
                text.contains(&format!("\"{key}\"")) || text.contains(&format!("\n{key}="));
            let bootstrap_given =
                key == "bootstrap.servers" && text.contains("producer.override.bootstrap.servers");
            let autocreate_off = key == "publication.autocreate.mode" && text.contains("disabled");
            if key == "topic.prefix" && !worker {
                continue;
            }
            if !bootstrap_given && !autocreate_off {
                expected.insert(key);
            }
        }
        assert_eq!(noted, expected, "{context}");
        for n in &imported.notes {
            assert!(!n.why.is_empty(), "{}: {} has no reason", case.file, n.key);
        }
        for line in case.lines {
            assert!(
                imported.toml.lines().any(|l| l == *line),
                "{line}\nnot in {context}"
            );
        }
        let env = case.env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let config = Config::from_sources(case.file, &imported.toml, env)
            .unwrap_or_else(|e| panic!("does not load: {e}\n{context}"));
        config_level_check(&config).unwrap_or_else(|e| panic!("{e}\n{context}"));
    }
    assert!(files.is_empty(), "fixtures without a case: {files:?}");
}

/// Issue 34 as the user ran it: the properties file with the placement line
/// imports, the report says each placement is already emitted, the output
/// validates.
#[test]
fn the_issue_34_properties_file_imports_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("outbox-cdc.toml");
    let run = bin()
        .arg("import-debezium")
        .arg(fixture("issue-34.properties"))
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    for entry in [
        "event_type:header:event_type",
        "aggregate_sequence:header:aggregate_sequence",
        "schema_version:header:schema_version",
    ] {
        assert!(
            stderr.contains(&format!("{entry}: already emitted: the standard header")),
            "{entry} not reported as already emitted: {stderr}"
        );
    }
    let validate = bin()
        .arg("validate-config")
        .arg("--config")
        .arg(&output)
        .output()
        .unwrap();
    assert!(
        validate.status.success(),
        "{}",
        String::from_utf8_lossy(&validate.stderr)
    );
    assert!(
        String::from_utf8_lossy(&validate.stdout)
            .contains("ok (slot orders_outbox, table public.outbox_events)"),
        "{}",
        String::from_utf8_lossy(&validate.stdout)
    );
}
