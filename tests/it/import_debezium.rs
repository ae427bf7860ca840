//! `outbox-cdc import-debezium` as a user runs it: a Debezium connector's
//! Kafka Connect JSON in, a configuration that `validate-config` accepts out,
//! the settings without an equivalent on stderr. No servers needed.

use std::process::Command;

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
