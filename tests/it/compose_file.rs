//! docker-compose.yml and the Dockerfile stay in step with scripts/env.sh
//! (its settings in scripts/env/common.sh, PostgreSQL's in scripts/env/pg.sh),
//! Cargo.toml and config/docker.toml. No YAML parser is a dependency, so the
//! compose file is read by indentation, which its layout (two spaces a level,
//! block style) allows.

use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_content(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && !t.starts_with('#')
}

/// The lines nested under the mapping key `key` (e.g. "services") found at
/// indentation `at` among `lines`, comments and blank lines dropped.
fn block<'a>(lines: &[&'a str], at: usize, key: &str) -> Vec<&'a str> {
    let header = format!("{key}:");
    let start = lines
        .iter()
        .position(|l| {
            is_content(l)
                && indent(l) == at
                && l.trim_end() == format!("{}{header}", " ".repeat(at))
        })
        .unwrap_or_else(|| panic!("docker-compose.yml has no `{key}:` at indentation {at}"));
    lines[start + 1..]
        .iter()
        .copied()
        .filter(|l| is_content(l))
        .take_while(|l| indent(l) > at)
        .collect()
}

fn service<'a>(lines: &[&'a str], name: &str) -> Vec<&'a str> {
    let services = block(lines, 0, "services");
    block(&services, 2, name)
}

/// The scalar value of `key: value` directly inside a block at `at`; in a
/// sequence item `- key: value` the key counts as indented past the dash.
fn scalar<'a>(lines: &[&'a str], at: usize, key: &str) -> Option<&'a str> {
    let prefix = format!("{key}:");
    lines
        .iter()
        .map(|l| match l.trim_start().strip_prefix("- ") {
            Some(item) => (indent(l) + 2, item),
            None => (indent(l), l.trim_start()),
        })
        .filter(|(i, _)| *i == at)
        .find_map(|(_, text)| text.trim_end().strip_prefix(prefix.as_str()))
        .map(|v| v.trim().trim_matches('"'))
        .filter(|v| !v.is_empty())
}

/// The items of a block sequence `key:` / `- item` inside a service.
fn list<'a>(svc: &[&'a str], key: &str) -> Vec<&'a str> {
    block(svc, 4, key)
        .into_iter()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|v| v.trim().trim_matches('"'))
        .collect()
}

/// The value scripts/env.sh gives `NAME` by default, from a line of its
/// settings (scripts/env/common.sh) such as `PG_PORT=54329` or
/// `PG_PORT="${OUTBOX_CDC_PG_PORT:-54329}"`.
fn env_sh_value(env_sh: &str, name: &str) -> String {
    let prefix = format!("{name}=");
    let raw = env_sh
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().trim_matches('"'))
        .unwrap_or_else(|| panic!("scripts/env/common.sh does not set {name}"));
    match raw.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
        Some(expansion) => expansion
            .split_once(":-")
            .map(|(_, default)| default.to_string())
            .unwrap_or_else(|| {
                panic!("scripts/env/common.sh sets {name} without a default: {raw}")
            }),
        None => raw.to_string(),
    }
}

fn bin_name() -> String {
    let cargo = read("Cargo.toml");
    let mut in_bin = false;
    for line in cargo.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(v) = line.strip_prefix("name") {
            return v
                .trim_start()
                .trim_start_matches('=')
                .trim()
                .trim_matches('"')
                .to_string();
        }
    }
    panic!("Cargo.toml declares no [[bin]] name")
}

#[test]
fn postgres_service_matches_env_sh() {
    let compose = read("docker-compose.yml");
    let lines: Vec<&str> = compose.lines().collect();
    let common_sh = read("scripts/env/common.sh");
    let pg_port = env_sh_value(&common_sh, "PG_PORT");
    let pg_sh = read("scripts/env/pg.sh");
    assert_eq!(pg_port, "54329");

    let pg = service(&lines, "postgres");
    assert_eq!(
        scalar(&pg, 4, "image"),
        Some("postgres:15"),
        "PostgreSQL 15, as scripts/env.sh installs"
    );
    let ports = list(&pg, "ports");
    assert_eq!(
        ports,
        [format!("127.0.0.1:{pg_port}:5432")],
        "postgres must publish loopback port {pg_port}"
    );

    // `command:` as a sequence of `-c`, `name=value` pairs.
    let command = list(&pg, "command");
    assert_eq!(command.first(), Some(&"postgres"));
    let settings: Vec<&str> = command
        .windows(2)
        .filter(|w| w[0] == "-c")
        .map(|w| w[1])
        .collect();
    for wanted in [
        "wal_level=logical",
        "max_replication_slots=32",
        "max_wal_senders=32",
        "password_encryption=scram-sha-256",
    ] {
        assert!(
            settings.contains(&wanted),
            "postgres command lacks -c {wanted}: {settings:?}"
        );
        assert!(
            pg_sh.contains(&wanted.replace('=', " = "))
                || pg_sh.contains(&wanted.replace("=", " = '")),
            "scripts/env/pg.sh does not set {wanted} like docker-compose.yml"
        );
    }

    let env = block(&pg, 4, "environment");
    assert_eq!(scalar(&env, 6, "POSTGRES_DB"), Some("app"));
    assert_eq!(scalar(&env, 6, "POSTGRES_PASSWORD"), Some("postgres"));
    assert_eq!(
        scalar(&env, 6, "POSTGRES_HOST_AUTH_METHOD"),
        Some("scram-sha-256")
    );
}

#[test]
fn migrations_are_mounted_and_applied_after_the_outbox_role() {
    let compose = read("docker-compose.yml");
    let lines: Vec<&str> = compose.lines().collect();
    let pg = service(&lines, "postgres");

    let volumes = list(&pg, "volumes");
    let mount = volumes
        .iter()
        .find(|v| v.starts_with("./migrations:"))
        .unwrap_or_else(|| panic!("postgres does not mount ./migrations: {volumes:?}"));
    let target = mount
        .trim_start_matches("./migrations:")
        .split(':')
        .next()
        .unwrap_or_default();
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .is_dir(),
        "docker-compose.yml mounts ./migrations, which does not exist"
    );

    // The init script (an inline config mounted into the image's init directory)
    // creates the role, then applies every *.sql of the mounted directory.
    let init = block(&pg, 4, "configs");
    let source = scalar(&init, 8, "source")
        .unwrap_or_else(|| panic!("postgres configs without a source: {init:?}"));
    let init_target = scalar(&init, 8, "target").unwrap_or_default();
    assert!(
        init_target.starts_with("/docker-entrypoint-initdb.d/") && init_target.ends_with(".sh"),
        "the init script must go into /docker-entrypoint-initdb.d/: {init_target}"
    );
    let configs = block(&lines, 0, "configs");
    let script = block(&configs, 2, source);
    let script: Vec<&str> = script.iter().map(|l| l.trim()).collect();
    let role = script
        .iter()
        .position(|l| l.starts_with("CREATE ROLE outbox LOGIN REPLICATION PASSWORD 'outbox'"))
        .unwrap_or_else(|| {
            panic!("init script {source} does not create the outbox role: {script:?}")
        });
    let apply = script
        .iter()
        .position(|l| {
            l.contains(&format!("find {target} ")) && l.contains("*.sql") && l.contains("sort")
        })
        .unwrap_or_else(|| {
            panic!("init script {source} does not apply {target}/*.sql in name order")
        });
    assert!(
        role < apply,
        "the outbox role must exist before the migrations run (they grant to it)"
    );
}

#[test]
fn kafka_service_matches_env_sh_and_connector_config() {
    let compose = read("docker-compose.yml");
    let lines: Vec<&str> = compose.lines().collect();
    let common_sh = read("scripts/env/common.sh");
    let kafka_port = env_sh_value(&common_sh, "KAFKA_PORT");
    assert_eq!(kafka_port, "19092");
    let kafka_version = env_sh_value(&common_sh, "KAFKA_VERSION");

    let kafka = service(&lines, "kafka");
    let image = scalar(&kafka, 4, "image").unwrap_or_default();
    assert!(
        kafka_version.contains(image.trim_start_matches("apache/kafka:"))
            && image.starts_with("apache/kafka:"),
        "kafka image {image} differs from the version scripts/env.sh runs ({kafka_version})"
    );
    assert_eq!(
        list(&kafka, "ports"),
        [format!("127.0.0.1:{kafka_port}:{kafka_port}")]
    );

    let env = block(&kafka, 4, "environment");
    assert_eq!(
        scalar(&env, 6, "KAFKA_PROCESS_ROLES"),
        Some("broker,controller")
    );
    assert_eq!(
        scalar(&env, 6, "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"),
        Some("1")
    );
    assert_eq!(
        scalar(&env, 6, "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"),
        Some("1")
    );
    let advertised = scalar(&env, 6, "KAFKA_ADVERTISED_LISTENERS").unwrap_or_default();
    assert!(
        advertised.contains(&format!("//127.0.0.1:{kafka_port}")),
        "Kafka must advertise 127.0.0.1:{kafka_port} to the host: {advertised}"
    );

    // The connector's config names hosts of the compose network.
    let config = read("config/docker.toml");
    let bootstrap = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"bootstrap.servers\""))
        .map(|v| {
            v.trim_start()
                .trim_start_matches('=')
                .trim()
                .trim_matches('"')
        })
        .unwrap_or_else(|| panic!("config/docker.toml sets no bootstrap.servers"));
    assert!(
        advertised
            .split(',')
            .any(|l| l.ends_with(&format!("//{bootstrap}"))),
        "config/docker.toml bootstraps from {bootstrap}, which Kafka does not advertise ({advertised})"
    );
    assert!(
        config.contains("@postgres:5432/app"),
        "config/docker.toml must reach PostgreSQL as postgres:5432/app"
    );
}

#[test]
fn connector_service_runs_the_binary_built_by_the_dockerfile() {
    let compose = read("docker-compose.yml");
    let lines: Vec<&str> = compose.lines().collect();
    let bin = bin_name();

    let svc = service(&lines, "outbox-cdc");
    assert_eq!(scalar(&svc, 4, "build"), Some("."));
    let volumes = list(&svc, "volumes");
    assert!(
        volumes.contains(&"./config/docker.toml:/etc/outbox-cdc/config.toml:ro"),
        "the connector must get config/docker.toml as /etc/outbox-cdc/config.toml: {volumes:?}"
    );
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("config/docker.toml")
            .is_file()
    );
    let command = scalar(&svc, 4, "command").unwrap_or_default();
    assert!(
        command.contains("\"--config\", \"/etc/outbox-cdc/config.toml\""),
        "the connector's command must pass --config /etc/outbox-cdc/config.toml: {command}"
    );
    let depends = block(&svc, 4, "depends_on");
    for dep in ["postgres", "kafka"] {
        let cond = block(&depends, 6, dep);
        assert_eq!(
            scalar(&cond, 8, "condition"),
            Some("service_healthy"),
            "{dep} must be healthy first"
        );
        let healthcheck = block(&service(&lines, dep), 4, "healthcheck");
        assert!(
            scalar(&healthcheck, 6, "test").is_some(),
            "{dep} has no healthcheck test"
        );
    }

    let dockerfile = read("Dockerfile");
    let instructions: Vec<&str> = dockerfile.lines().filter(|l| is_content(l)).collect();
    assert!(
        instructions
            .iter()
            .any(|l| l.contains(&format!("cargo build --release --locked --bin {bin}"))),
        "the Dockerfile must build the `{bin}` binary"
    );
    assert!(
        instructions
            .iter()
            .any(|l| l.starts_with("FROM rust:") && l.ends_with(" AS build"))
    );
    assert!(instructions.contains(&"FROM debian:bookworm-slim"));
    assert!(
        instructions
            .iter()
            .any(|l| l.starts_with("COPY --from=build ")
                && l.ends_with(&format!("/usr/local/bin/{bin}"))),
        "the runtime stage must copy the `{bin}` binary"
    );
    assert!(
        instructions
            .iter()
            .any(|l| l.starts_with("USER ") && !l.ends_with(" root"))
    );
    assert!(instructions.contains(&format!("ENTRYPOINT [\"{bin}\"]").as_str()));
}
