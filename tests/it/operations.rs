//! Operating the connector against the real PostgreSQL and Kafka (issue 6):
//! the metrics move, `status` works while the connector runs and after it
//! stopped, `check` names each misconfiguration with its fix, the heartbeat
//! reaches the WAL. Every test runs the real binary; none stops a shared server.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::relay::{
    ChildProcess, Fixture, consume, eventually, free_port, metric, scrape, spawn_binary,
};
use outbox_cdc::check::Item;
use outbox_cdc::pg::Lsn;

const TIMEOUT: Duration = Duration::from_secs(90);
const BIN: &str = env!("CARGO_BIN_EXE_outbox-cdc");

/// The fixture's config with the HTTP endpoint on `port`, a fast slot monitor
/// and `extra` TOML appended; written next to the offsets.
fn write_config(fx: &Fixture, port: u16, extra: &str) -> PathBuf {
    let text = fx
        .config_text()
        .replace("listen = \"\"", &format!("listen = \"127.0.0.1:{port}\""));
    let text = format!("{text}\n[monitor]\nslot_poll_interval_ms = 200\n{extra}\n");
    let path = fx.offsets_dir.path().join("ops.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// Starts the binary and waits until /readyz says it streams.
async fn start_connector(config: &Path, port: u16) -> ChildProcess {
    let child = spawn_binary(config);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let log = config.with_file_name("connector.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    while outbox_cdc::http::get(addr, "/readyz", Duration::from_secs(1))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "connector not streaming within 60 s; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child
}

/// Runs `outbox-cdc <args>` with extra environment; returns (exit code, stdout, stderr).
async fn run_cli(args: &[&str], env: &[(&str, String)]) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args).env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("outbox-cdc finished within 60 s")
        .expect("run outbox-cdc");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn status_json(config: &Path) -> serde_json::Value {
    let path = config.to_str().expect("utf-8 path");
    let (code, stdout, stderr) = run_cli(&["status", "--json", "--config", path], &[]).await;
    assert_eq!(code, 0, "status failed: {stdout}\n{stderr}");
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {stdout}"))
}

fn lsn(v: &serde_json::Value) -> Lsn {
    v.as_str()
        .unwrap_or_else(|| panic!("expected an LSN string, got {v}"))
        .parse()
        .expect("LSN")
}

fn payload(i: usize) -> String {
    format!(r#"{{"n": {i}}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_pipeline_and_the_slot() {
    common::init_tracing();
    let fx = Fixture::new("opsmetrics").await;
    let port = free_port();
    let config = write_config(&fx, port, "");
    let mut child = start_connector(&config, port).await;

    // The monitor's first poll may come before the stream starts (the slot
    // exists, nobody holds it yet): wait for a poll that sees it held.
    eventually(
        "the slot monitor saw the slot held by our own walsender",
        TIMEOUT,
        || async {
            metric(port, "outbox_cdc_slot_exists").await == 1.0
                && metric(port, "outbox_cdc_slot_active").await == 1.0
        },
    )
    .await;
    assert_eq!(metric(port, "outbox_cdc_connected").await, 1.0);
    let acked_before = metric(port, "outbox_cdc_acked_lsn").await;
    let published_before = metric(port, "outbox_cdc_events_published_total").await;
    let poll_before = metric(port, "outbox_cdc_slot_last_poll_timestamp_seconds").await;
    assert!(acked_before > 0.0, "acked LSN is set at stream start");
    assert_eq!(published_before, 0.0);

    let mut ids = Vec::new();
    for i in 0..12 {
        ids.extend(
            fx.write_tx(&[("order", ["a", "b", "c"][i % 3], payload(i))], true)
                .await,
        );
    }
    let records = consume(&fx.topic_prefix, ids.len(), TIMEOUT, Duration::from_secs(1));
    assert_eq!(records.len(), ids.len());

    eventually("published_total counts every event", TIMEOUT, || async {
        metric(port, "outbox_cdc_events_published_total").await >= ids.len() as f64
    })
    .await;
    eventually("acked_lsn moved past the events", TIMEOUT, || async {
        metric(port, "outbox_cdc_acked_lsn").await > acked_before
    })
    .await;
    let samples = scrape(port).await.expect("metrics");
    assert_eq!(samples["outbox_cdc_events_failed_total"], 0.0);
    assert!(samples["outbox_cdc_received_lsn"] >= samples["outbox_cdc_acked_lsn"]);
    assert_eq!(
        samples["outbox_cdc_commit_to_ack_seconds_count"],
        ids.len() as f64
    );
    assert!(
        samples["outbox_cdc_slot_last_poll_timestamp_seconds"] > poll_before,
        "the poller keeps polling"
    );
    let lag = samples["outbox_cdc_slot_lag_bytes"];
    let retained = samples["outbox_cdc_slot_restart_lag_bytes"];
    assert!(lag >= 0.0, "slot lag computed: {lag}");
    assert!(
        retained >= lag,
        "restart_lsn is never after confirmed_flush_lsn: {retained} < {lag}"
    );
    assert_eq!(
        samples["outbox_cdc_slot_wal_status{status=\"reserved\"}"],
        1.0
    );
    assert_eq!(samples["outbox_cdc_slot_poll_errors_total"], 0.0);

    // The slot's confirmed position follows the acked LSN: the gauge agrees with the server.
    let acked = Lsn::new(metric(port, "outbox_cdc_acked_lsn").await as u64);
    eventually("the slot confirmed the acked LSN", TIMEOUT, || async {
        fx.slot_confirmed_flush()
            .await
            .and_then(|c| c.parse::<Lsn>().ok())
            .is_some_and(|c| c >= acked)
    })
    .await;

    let status = child.terminate(Duration::from_secs(60));
    assert!(status.success(), "graceful stop: {status}");
    fx.cleanup().await;
}

/// The library's composition of `run` (what the binary calls) brings up the
/// HTTP endpoint and the slot monitor beside the pipeline, and stops them
/// with it: the in-process tests run the same wiring as the binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_relay_runs_the_companions_of_the_binary() {
    common::init_tracing();
    let fx = Fixture::new("opsrelay").await;
    let port = free_port();
    let config = outbox_cdc::config::Config::load(&write_config(&fx, port, "")).expect("config");
    let running = common::relay::Running::spawn(config, Default::default());
    running.wait_streaming().await;
    // A poll from before the stream started sees the slot not yet held:
    // wait for one that sees it held.
    eventually(
        "the slot monitor polled through the relay",
        TIMEOUT,
        || async {
            scrape(port).await.is_some_and(|m| {
                m.get("outbox_cdc_slot_exists") == Some(&1.0)
                    && m.get("outbox_cdc_slot_active") == Some(&1.0)
            })
        },
    )
    .await;
    assert!(
        running
            .metrics
            .render()
            .contains("outbox_cdc_slot_active 1\n"),
        "the monitor writes the metrics the pipeline's caller holds"
    );
    running.stop().await.expect("clean stop");
    eventually(
        "the HTTP endpoint stopped with the relay",
        TIMEOUT,
        || async { scrape(port).await.is_none() },
    )
    .await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_while_running_and_while_stopped() {
    common::init_tracing();
    let fx = Fixture::new("opsstatus").await;
    let port = free_port();
    let config = write_config(&fx, port, "");

    // Never started: no store yet, and status does not create one.
    let before = status_json(&config).await;
    assert!(before["stored_lsn"].is_null(), "{before}");
    assert!(
        before["slot"].is_null(),
        "the slot does not exist yet: {before}"
    );
    assert!(
        !fx.offsets_path().exists(),
        "status must not create the offset store"
    );

    let mut child = start_connector(&config, port).await;
    let ids = fx
        .write_tx(
            &[("order", "s1", payload(1)), ("order", "s2", payload(2))],
            true,
        )
        .await;
    consume(&fx.topic_prefix, ids.len(), TIMEOUT, Duration::from_secs(1));
    eventually("the events are acknowledged", TIMEOUT, || async {
        metric(port, "outbox_cdc_events_published_total").await >= 2.0
    })
    .await;

    let running = status_json(&config).await;
    assert_eq!(running["stored_lsn_source"], "connector", "{running}");
    assert_eq!(running["connector"]["connected"], true, "{running}");
    assert!(
        running["stored_lsn_note"]
            .as_str()
            .is_some_and(|n| n.contains("/metrics")),
        "says where the LSN came from: {running}"
    );
    let stored = lsn(&running["stored_lsn"]);
    let slot = &running["slot"];
    assert!(
        slot["active_pid"].as_i64().is_some_and(|p| p > 0),
        "{running}"
    );
    assert!(slot["lag_bytes"].as_u64().is_some(), "{running}");
    assert_eq!(slot["wal_status"], "reserved");
    let confirmed = lsn(&slot["confirmed_flush_lsn"]);
    assert!(lsn(&slot["restart_lsn"]) <= confirmed);
    assert!(stored > Lsn::ZERO);
    let path = config.to_str().expect("utf-8 path");
    let (code, table, _) = run_cli(&["status", "--config", path], &[]).await;
    assert_eq!(code, 0);
    assert!(
        table.contains("streaming") && table.contains("confirmed_flush_lsn"),
        "{table}"
    );

    let exit = child.terminate(Duration::from_secs(60));
    assert!(exit.success(), "graceful stop: {exit}");
    eventually("the walsender let go of the slot", TIMEOUT, || async {
        let s = status_json(&config).await;
        s["slot"]["active_pid"].is_null()
    })
    .await;

    let stopped = status_json(&config).await;
    assert_eq!(stopped["stored_lsn_source"], "store", "{stopped}");
    assert!(stopped["connector"].is_null(), "{stopped}");
    assert!(
        stopped["stored_system_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    assert!(
        stopped["stored_at_unix_ms"]
            .as_i64()
            .is_some_and(|t| t > 1_600_000_000_000),
        "{stopped}"
    );
    let stored_after = lsn(&stopped["stored_lsn"]);
    let confirmed_after = lsn(&stopped["slot"]["confirmed_flush_lsn"]);
    assert!(stored_after >= stored, "the stored offset never moves back");
    assert!(
        confirmed_after <= stored_after,
        "the server was never told more than was stored: confirmed {confirmed_after} > stored {stored_after}"
    );
    assert!(stopped["slot"]["lag_bytes"].as_u64().is_some());
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exits_non_zero_when_the_database_cannot_be_asked() {
    let fx = Fixture::new("opsstatusdown").await;
    let config = fx.write_config_file();
    let path = config.to_str().expect("utf-8 path");
    let env = [(
        "OUTBOX_CDC__POSTGRES__URL",
        "postgres://outbox:outbox@127.0.0.1:1/app".to_owned(),
    )];
    let (code, stdout, _) = run_cli(&["status", "--json", "--config", path], &env).await;
    assert_eq!(code, 1, "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&stdout).expect("JSON even when the database is down");
    assert!(
        v["database_error"].as_str().is_some_and(|e| !e.is_empty()),
        "{v}"
    );
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_writes_messages_into_this_databases_wal() {
    common::init_tracing();
    let fx = Fixture::new("opsheart").await;
    // A test_decoding slot of our own shows every message written to the WAL.
    let watch_slot = format!("watch_{}", fx.name);
    fx.admin
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'test_decoding')",
            &[&watch_slot],
        )
        .await
        .expect("create the watching slot");
    let prefix = format!("hb-{}", fx.name);
    let port = free_port();
    let config = write_config(
        &fx,
        port,
        &format!("heartbeat_interval_ms = 200\nheartbeat_prefix = \"{prefix}\""),
    );
    let mut child = start_connector(&config, port).await;
    eventually("heartbeats are counted", TIMEOUT, || async {
        metric(port, "outbox_cdc_heartbeats_total").await >= 3.0
    })
    .await;
    assert_eq!(metric(port, "outbox_cdc_heartbeat_errors_total").await, 0.0);
    let needle = format!("message: transactional: 0 prefix: {prefix}, ");
    let row = fx
        .admin
        .query_one(
            "SELECT count(*) FROM pg_logical_slot_peek_changes($1, NULL, NULL) WHERE data LIKE $2 || '%'",
            &[&watch_slot, &needle],
        )
        .await
        .expect("peek the watching slot");
    let seen: i64 = row.get(0);
    assert!(
        seen >= 2,
        "expected heartbeat messages with prefix {prefix} in the WAL, saw {seen}"
    );

    let exit = child.terminate(Duration::from_secs(60));
    assert!(exit.success());
    let _ = fx
        .admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&watch_slot])
        .await;
    fx.cleanup().await;
}

// ---- check ----------------------------------------------------------------

/// Runs `check` with the fixture's config and `env` overrides.
async fn check(fx: &Fixture, env: &[(&str, String)]) -> (i32, String) {
    let config = fx.write_config_file();
    let path = config.to_str().expect("utf-8 path");
    let (code, stdout, stderr) = run_cli(&["check", "--config", path], env).await;
    (code, format!("{stdout}{stderr}"))
}

/// The FAIL line of `name` and its fix lines, or a panic showing the report.
fn failure(report: &str, item: Item) -> &str {
    let name = item.name();
    let start = report
        .find(&format!("FAIL  {name} "))
        .unwrap_or_else(|| panic!("no FAIL line for {name:?} in:\n{report}"));
    let rest = &report[start..];
    let end = rest[1..]
        .find("\nPASS  ")
        .into_iter()
        .chain(rest[1..].find("\nFAIL  "))
        .chain(rest[1..].find("\nSKIP  "))
        .chain(rest[1..].find("\ncheck "))
        .min()
        .map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

fn assert_passes(report: &str, item: Item) {
    let name = item.name();
    assert!(
        report.contains(&format!("PASS  {name} ")),
        "expected PASS for {name:?} in:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_on_a_correct_setup() {
    let fx = Fixture::new("chkok").await;
    let (code, report) = check(&fx, &[]).await;
    assert_eq!(code, 0, "{report}");
    for item in [
        Item::PostgresConnection,
        Item::WalLevel,
        Item::ReplicationSlots,
        Item::Slot,
        Item::WalSenders,
        Item::ReplicationPrivilege,
        Item::OutboxTable,
        Item::SelectPrivilege,
        Item::OutboxColumns,
        Item::Publication,
        Item::PublicationTables,
        Item::PublicationPublishes,
        Item::Kafka,
    ] {
        assert_passes(&report, item);
    }
    assert!(
        !report.contains("FAIL") && report.contains("check OK"),
        "{report}"
    );
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_missing_publication_with_the_create_statement() {
    let fx = Fixture::new("chknopub").await;
    let missing = format!("nopub_{}", fx.name);
    let (code, report) = check(
        &fx,
        &[("OUTBOX_CDC__POSTGRES__PUBLICATION", missing.clone())],
    )
    .await;
    assert_eq!(code, 1, "{report}");
    let f = failure(&report, Item::Publication);
    assert!(f.contains("does not exist"), "{f}");
    let create = format!(
        "CREATE PUBLICATION \"{missing}\" FOR TABLE \"public\".\"{}\" WITH (publish = 'insert');",
        fx.table
    );
    assert!(
        f.contains(&create),
        "fix names the statement {create}:\n{f}"
    );
    assert!(f.contains("postgres.create_publication = true"), "{f}");
    assert!(report.contains("SKIP  publication tables"), "{report}");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_publication_without_the_outbox_table() {
    let fx = Fixture::new("chkwrongtab").await;
    let other = format!("other_{}", fx.name);
    let publication = format!("pubother_{}", fx.name);
    fx.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{other} (x int); CREATE PUBLICATION {publication} FOR TABLE public.{other} WITH (publish = 'insert');"
        ))
        .await
        .expect("create the wrong publication");
    let (code, report) = check(
        &fx,
        &[("OUTBOX_CDC__POSTGRES__PUBLICATION", publication.clone())],
    )
    .await;
    assert_eq!(code, 1, "{report}");
    let f = failure(&report, Item::PublicationTables);
    assert!(
        f.contains(&format!(
            "ALTER PUBLICATION \"{publication}\" ADD TABLE \"public\".\"{}\";",
            fx.table
        )),
        "{f}"
    );
    assert!(
        f.contains(&format!(
            "ALTER PUBLICATION \"{publication}\" DROP TABLE \"public\".\"{other}\";"
        )),
        "{f}"
    );
    assert_passes(&report, Item::Publication);
    fx.admin
        .batch_execute(&format!(
            "DROP PUBLICATION {publication}; DROP TABLE public.{other};"
        ))
        .await
        .expect("drop the wrong publication");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_publication_that_also_publishes_updates() {
    let fx = Fixture::new("chkupd").await;
    let publication = format!("pubupd_{}", fx.name);
    fx.admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {publication} FOR TABLE public.{} WITH (publish = 'insert, update');",
            fx.table
        ))
        .await
        .expect("create the publication");
    let (code, report) = check(
        &fx,
        &[("OUTBOX_CDC__POSTGRES__PUBLICATION", publication.clone())],
    )
    .await;
    assert_eq!(code, 1, "{report}");
    let f = failure(&report, Item::PublicationPublishes);
    assert!(f.contains("also publishes update"), "{f}");
    assert!(
        f.contains(&format!(
            "ALTER PUBLICATION \"{publication}\" SET (publish = 'insert');"
        )),
        "{f}"
    );
    assert_passes(&report, Item::PublicationTables);
    fx.admin
        .batch_execute(&format!("DROP PUBLICATION {publication};"))
        .await
        .expect("drop the publication");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_missing_and_mistyped_columns() {
    let fx = Fixture::new("chkcols").await;
    let table = format!("cols_{}", fx.name);
    let publication = format!("pubcols_{}", fx.name);
    fx.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{table} (LIKE public.outbox_events INCLUDING ALL);
             ALTER TABLE public.{table} DROP COLUMN event_type;
             ALTER TABLE public.{table} ALTER COLUMN aggregate_sequence TYPE text;
             ALTER TABLE public.{table} ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8');
             GRANT SELECT ON public.{table} TO outbox;
             CREATE PUBLICATION {publication} FOR TABLE public.{table} WITH (publish = 'insert');"
        ))
        .await
        .expect("create the broken outbox table");
    let env = [
        ("OUTBOX_CDC__OUTBOX__TABLE", format!("public.{table}")),
        ("OUTBOX_CDC__POSTGRES__PUBLICATION", publication.clone()),
    ];
    let (code, report) = check(&fx, &env).await;
    assert_eq!(code, 1, "{report}");
    let f = failure(&report, Item::OutboxColumns);
    let quoted = format!("\"public\".\"{table}\"");
    for expected in [
        "column \"event_type\" (outbox.columns.event_type) is missing".to_owned(),
        format!("ALTER TABLE {quoted} ADD COLUMN \"event_type\" text;"),
        "column \"aggregate_sequence\" (outbox.columns.aggregate_sequence) is text".to_owned(),
        format!(
            "ALTER TABLE {quoted} ALTER COLUMN \"aggregate_sequence\" TYPE bigint USING \"aggregate_sequence\"::bigint;"
        ),
        "column \"payload\" (outbox.columns.payload) is bytea".to_owned(),
        format!("ALTER TABLE {quoted} ALTER COLUMN \"payload\" TYPE jsonb"),
    ] {
        assert!(f.contains(&expected), "expected {expected:?} in:\n{f}");
    }
    assert_passes(&report, Item::OutboxTable);
    fx.admin
        .batch_execute(&format!(
            "DROP PUBLICATION {publication}; DROP TABLE public.{table};"
        ))
        .await
        .expect("drop the broken table");
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_role_without_select_and_replication() {
    let fx = Fixture::new("chkrole").await;
    let role = format!("norole_{}", fx.name);
    fx.admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD 'pw_{role}'"))
        .await
        .expect("create a throwaway role");
    let url = common::pg_url();
    let (_, host) = url
        .split_once('@')
        .expect("user@host in OUTBOX_CDC_TEST_PG");
    let env = [(
        "OUTBOX_CDC__POSTGRES__URL",
        format!("postgres://{role}:pw_{role}@{host}"),
    )];
    let (code, report) = check(&fx, &env).await;
    let _ = fx
        .admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await;
    assert_eq!(code, 1, "{report}");
    let f = failure(&report, Item::SelectPrivilege);
    assert!(
        f.contains(&format!(
            "GRANT SELECT ON \"public\".\"{}\" TO \"{role}\";",
            fx.table
        )),
        "{f}"
    );
    let f = failure(&report, Item::ReplicationPrivilege);
    assert!(
        f.contains(&format!("ALTER ROLE \"{role}\" WITH REPLICATION;")),
        "{f}"
    );
    assert_passes(&report, Item::PostgresConnection);
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_an_unreachable_kafka() {
    let fx = Fixture::new("chkkafka").await;
    let env = [(
        "OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS",
        "127.0.0.1:1".to_owned(),
    )];
    let (code, report) = check(&fx, &env).await;
    assert_eq!(code, 1, "{report}");
    let f = failure(&report, Item::Kafka);
    assert!(
        f.contains("127.0.0.1:1") && f.contains("bootstrap.servers"),
        "{f}"
    );
    assert_passes(&report, Item::PublicationPublishes);
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_lost_slot_and_a_slot_it_may_not_create() {
    common::init_tracing();
    let fx = Fixture::new("chkslot").await;
    // create_slot = false and nothing stored: the start would be refused.
    let (code, report) = check(
        &fx,
        &[("OUTBOX_CDC__POSTGRES__CREATE_SLOT", "false".to_owned())],
    )
    .await;
    assert_eq!(code, 1, "{report}");
    let f = failure(&report, Item::Slot);
    assert!(
        f.contains(&format!(
            "SELECT pg_create_logical_replication_slot('{}', 'pgoutput');",
            fx.slot
        )),
        "{f}"
    );

    // Run once so an offset is stored, stop, then lose the slot.
    let port = free_port();
    let config = write_config(&fx, port, "");
    let mut child = start_connector(&config, port).await;
    assert!(child.terminate(Duration::from_secs(60)).success());
    eventually("the slot is inactive and dropped", TIMEOUT, || async {
        fx.admin
            .execute("SELECT pg_drop_replication_slot($1)", &[&fx.slot])
            .await
            .is_ok()
    })
    .await;
    let (code, report) = check(&fx, &[]).await;
    assert_eq!(code, 1, "{report}");
    let f = failure(&report, Item::Slot);
    assert!(
        f.contains("the slot was lost") && f.contains("outbox-cdc repair"),
        "{f}"
    );
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_monitor_counts_failures_quietly_while_the_database_is_unreachable() {
    common::init_tracing();
    let fx = Fixture::new("opsmondown").await;
    let port = free_port();
    let config = write_config(&fx, port, "");
    let text = std::fs::read_to_string(&config)
        .expect("read config")
        .replace(
            &common::pg_url(),
            "postgres://outbox:outbox@127.0.0.1:1/app",
        );
    std::fs::write(&config, text).expect("write config");
    let mut child = spawn_binary(&config);
    eventually("poll errors are counted", TIMEOUT, || async {
        match scrape(port).await {
            Some(m) => m
                .get("outbox_cdc_slot_poll_errors_total")
                .is_some_and(|n| *n >= 5.0),
            None => false,
        }
    })
    .await;
    let samples = scrape(port).await.expect("metrics");
    assert_eq!(
        samples["outbox_cdc_slot_exists"], -1.0,
        "never polled successfully"
    );
    assert_eq!(samples["outbox_cdc_slot_last_poll_timestamp_seconds"], 0.0);
    assert_eq!(samples["outbox_cdc_connected"], 0.0);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    assert!(
        outbox_cdc::http::get(addr, "/healthz", Duration::from_secs(2))
            .await
            .is_ok()
    );
    assert!(
        outbox_cdc::http::get(addr, "/readyz", Duration::from_secs(2))
            .await
            .is_err()
    );
    let log = std::fs::read_to_string(config.with_file_name("connector.log")).unwrap_or_default();
    assert_eq!(
        log.matches("slot monitor: poll failed").count(),
        1,
        "one warning per outage, not one per poll:\n{log}"
    );
    let started = Instant::now();
    let exit = child.terminate(Duration::from_secs(30));
    assert!(
        exit.success(),
        "stops cleanly during the reconnect backoff: {exit}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped in {:?}",
        started.elapsed()
    );
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_and_release_work_on_a_stopped_connectors_store() {
    let fx = Fixture::new("opsrelease").await;
    let config = fx.write_config_file();
    let path = config.to_str().expect("utf-8 path");
    {
        let store =
            outbox_cdc::checkpoint::OffsetStore::open(&fx.offsets_path()).expect("open store");
        assert!(
            store
                .park(
                    "order",
                    "o-7",
                    "payload is null",
                    outbox_cdc::pg::EventPosition::at(Lsn::new(0x1234))
                )
                .expect("park")
        );
    }
    let (code, out, err) = run_cli(&["parked", "--config", path], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("order\to-7\tLSN 0/1234\tpayload is null"),
        "{out}"
    );

    let (code, out, err) = run_cli(&["release", "--config", path, "order", "o-7"], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("released order/o-7"), "{out}");
    let (code, out, _) = run_cli(&["release", "--config", path, "order", "o-7"], &[]).await;
    assert_eq!(code, 1, "releasing twice says it was not parked: {out}");
    assert!(out.contains("was not parked"), "{out}");

    let store =
        outbox_cdc::checkpoint::OffsetStore::open(&fx.offsets_path()).expect("reopen store");
    assert!(!store.is_parked("order", "o-7").expect("is_parked"));

    // Held by a running connector (here: this process): named as such, with
    // what to do, not "give this one its own state directory" (review F13).
    let (code, _, err) = run_cli(&["release", "--config", path, "order", "o-7"], &[]).await;
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("a running connector holds it"), "{err}");
    assert!(!err.contains("its own state directory"), "{err}");
    drop(store);

    // A mistyped offsets.path: refused, and nothing is created there (review
    // F12: `parked` printed nothing and exited 0, `release` said "was not
    // parked", and both created the directory).
    let typo = fx.offsets_path().with_file_name("offsetz");
    let text = fx.config_text().replace(
        &fx.offsets_path().display().to_string(),
        &typo.display().to_string(),
    );
    let typo_config = config.with_file_name("typo.toml");
    std::fs::write(&typo_config, text).expect("write config");
    let typo_path = typo_config.to_str().expect("utf-8 path");
    for args in [
        vec!["parked", "--config", typo_path],
        vec!["release", "--config", typo_path, "order", "o-7"],
    ] {
        let (code, out, err) = run_cli(&args, &[]).await;
        assert_ne!(code, 0, "{args:?}: {out}{err}");
        assert!(
            err.contains("no offset store at") && err.contains("offsetz"),
            "{args:?}: {err}"
        );
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
    }
    fx.cleanup().await;
}

/// Runs `outbox-cdc run` with stderr to a pipe until it streams, stops it
/// with SIGTERM and returns what it wrote to stderr.
async fn run_logs(fx: &Fixture, config: &Path, env: &[(&str, &str)]) -> Vec<u8> {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["run", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn outbox-cdc");
    fx.wait_for_slot().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = child.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .expect("connector output");
    assert!(out.status.success(), "exit status {:?}", out.status);
    out.stderr
}

/// A log written to a file or a pipe has no colour escapes; `log.format =
/// "json"` (here through its environment override) writes one JSON object
/// per line with the level, the message and the command's span fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_pipe_are_plain_text_or_json_lines() {
    common::init_tracing();
    let fx = Fixture::new("logs").await;
    let config = fx.write_config_file();

    let text = run_logs(&fx, &config, &[]).await;
    let shown = String::from_utf8_lossy(&text).into_owned();
    assert!(shown.lines().count() >= 2, "{shown}");
    assert!(!text.contains(&0x1b), "ESC in a piped log:\n{shown}");
    assert!(shown.contains("command=run"), "{shown}");

    let json = run_logs(&fx, &config, &[("OUTBOX_CDC__LOG__FORMAT", "json")]).await;
    let shown = String::from_utf8_lossy(&json).into_owned();
    assert!(!json.contains(&0x1b), "{shown}");
    let (mut lines, mut in_span) = (0, 0);
    for line in shown.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(v["level"].is_string(), "{line}");
        assert!(v["message"].is_string(), "{line}");
        lines += 1;
        // librdkafka's own threads log outside the command's span.
        if !v["span"].is_null() {
            assert_eq!(v["span"]["command"], "run", "{line}");
            assert_eq!(v["spans"][0]["name"], "outbox_cdc", "{line}");
            in_span += 1;
        }
    }
    assert!(lines >= 2 && in_span >= 1, "{shown}");
    fx.cleanup().await;
}
