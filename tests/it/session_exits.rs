//! A session that ends on an error keeps what was acknowledged (issue 11):
//! before reconnecting, it takes the delivery reports that arrive and persists
//! the acknowledged prefix, so the next session re-sends only what was really
//! in flight.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::init_tracing;
use common::relay::{Fixture, Running, consume, consume_ids, eventually};

use crate::no_silent_skip::insert;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_exit_persists_the_acknowledged_prefix_before_reconnecting() {
    init_tracing();
    let f = Fixture::new("errexit").await;
    // No periodic persist during the test: only the exit path can persist.
    let config = f.config_with("OUTBOX_CDC__OFFSETS__FLUSH_INTERVAL_MS=60000");
    let running = Running::start(config).await;
    let mut written = Vec::new();
    for i in 0..5 {
        written.extend(
            f.write_tx(&[("order", "a", format!(r#"{{"n":{i}}}"#))], true)
                .await,
        );
    }
    consume(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(30),
        Duration::ZERO,
    );
    // Everything is acknowledged by Kafka, nothing persisted since the start.
    let reconnects = || running.metrics.reconnects();
    assert_eq!(reconnects(), 0);
    f.admin
        .execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
            &[&f.slot],
        )
        .await
        .expect("terminate the walsender");
    eventually(
        "the session reconnects",
        Duration::from_secs(30),
        || async { reconnects() >= 1 && running.metrics.is_connected() },
    )
    .await;
    // The new session resumed after the acknowledged transactions: no copy.
    let records = consume(
        &f.topic_prefix,
        written.len(),
        Duration::from_secs(30),
        Duration::from_secs(3),
    );
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for r in &records {
        *copies.entry(r.header("event_id").to_owned()).or_default() += 1;
    }
    let resent: Vec<_> = copies.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        resent.is_empty() && copies.len() == written.len(),
        "re-sent after the error exit: {resent:?} ({} records for {} events)",
        records.len(),
        written.len()
    );
    running.stop().await.expect("clean stop");
    f.cleanup().await;
}

/// Issue 50 F6 (b): a stop asked while the connector is still starting is
/// obeyed at once. Here the slot's creation waits for a transaction that
/// stays open (a logical slot waits for every running transaction): SIGTERM
/// ends the process within seconds, not when the transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_the_slot_is_being_created_ends_the_start() {
    stop_while_the_slot_is_being_created(&[], |status, log| {
        assert!(status.success(), "{status:?}: {log}");
    })
    .await;
}

/// The chaos harness arms `during-shutdown` with a SIGTERM at a random
/// moment, the start included: a stop that ends the start passes the crash
/// point too (without it the connector exited 0 and the chaos run failed,
/// "ended unexpectedly: exit status: 0 after SIGTERM").
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_that_ends_the_start_passes_the_shutdown_crash_point() {
    use std::os::unix::process::ExitStatusExt as _;
    stop_while_the_slot_is_being_created(
        &[("OUTBOX_CDC_FAILPOINT", "during-shutdown:1")],
        |status, log| {
            assert_eq!(status.signal(), Some(9), "{status:?}: {log}");
            assert!(log.contains("stop asked while starting"), "{log}");
        },
    )
    .await;
}

/// Starts the connector while a transaction holds its slot's creation,
/// sends SIGTERM, and judges how it ended with `judge(status, log)`.
async fn stop_while_the_slot_is_being_created(
    env: &[(&str, &str)],
    judge: impl FnOnce(std::process::ExitStatus, &str),
) {
    init_tracing();
    let fx = Fixture::new("stop_starting").await;
    let holder = common::admin_client().await;
    holder
        .batch_execute("BEGIN; SELECT pg_current_xact_id();")
        .await
        .expect("an open transaction with an id");
    let config = fx.write_config_file();
    let mut child = common::relay::spawn_binary_with(&config, env);
    eventually(
        "the slot exists, its creation waiting",
        Duration::from_secs(30),
        || async {
            fx.admin
                .query_opt(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                    &[&fx.slot],
                )
                .await
                .ok()
                .flatten()
                .is_some()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(child.try_wait().is_none(), "the connector ended by itself");
    let status = child.terminate(Duration::from_secs(10));
    judge(status, &common::relay::log_of(&config));
    holder.batch_execute("ROLLBACK").await.expect("ROLLBACK");
    fx.cleanup().await;
}

/// Issue 50 F6 (c): the catalog lookup of a relation the stream names for
/// the first time (here a partition created while streaming) runs inside the
/// stream's receive. On a connection that stalls (its backend stopped with
/// SIGSTOP, as in a network partition) it is bounded: SIGTERM ends the
/// connector within seconds instead of when TCP gives up, and the next
/// start publishes the row. Without the bound it did not exit at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_catalog_lookup_does_not_hold_a_stop() {
    init_tracing();
    let f = crate::no_silent_skip::partitioned_fixture("stall_lookup", false).await;
    let t = f.table.clone();
    // The SQL connections of this connector alone carry this name.
    let app = format!("stall_{}", f.name);
    let url = format!("{}?application_name={app}", common::pg_url());
    let config = f.write_config_file();
    let env = [
        ("OUTBOX_CDC__POSTGRES__URL", url.as_str()),
        ("OUTBOX_CDC__LIMITS__SHUTDOWN_TIMEOUT_MS", "2000"),
        ("NO_COLOR", "1"),
    ];
    let mut child = common::relay::spawn_binary_with(&config, &env);
    // Rows committed before the slot exists are not its to send.
    eventually("the connector streams", Duration::from_secs(60), || async {
        common::relay::log_of(&config).contains("bootstrap: streaming")
    })
    .await;
    let aggregates = vec!["a".to_owned()];
    let first = insert(&f.admin, &t, &aggregates, 1, "now()").await;
    consume_ids(
        &f.topic_prefix,
        &first.iter().cloned().collect(),
        Duration::from_secs(60),
        Duration::ZERO,
    );

    let pids: Vec<i32> = f
        .admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND backend_type = 'client backend'",
            &[&app],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!pids.is_empty(), "no SQL connection named {app}");
    let stalled = Stalled::stop(&pids);
    f.admin
        .batch_execute(&format!(
            "CREATE TABLE public.{t}_2100 PARTITION OF public.{t} FOR VALUES FROM ('2100-01-01') TO ('2101-01-01')"
        ))
        .await
        .expect("a new partition");
    let late = insert(&f.admin, &t, &aggregates, 2, "'2100-06-01'").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(child.try_wait().is_none(), "the connector ended by itself");
    let asked = Instant::now();
    let status = child.terminate(Duration::from_secs(30));
    let took = asked.elapsed();
    let log = common::relay::log_of(&config);
    assert!(
        log.contains("looking up a relation the stream describes in the catalog"),
        "the stop ended something else than the stalled lookup ({status:?} after {took:?}): {log}"
    );
    eprintln!("stop with a stalled catalog lookup: {status:?} after {took:?}");
    drop(stalled);

    let mut child = common::relay::spawn_binary(&config);
    consume_ids(
        &f.topic_prefix,
        &late.iter().cloned().collect(),
        Duration::from_secs(60),
        Duration::ZERO,
    );
    assert!(child.terminate(Duration::from_secs(30)).success());
    f.cleanup().await;
}

/// PostgreSQL backends stopped with SIGSTOP; continued when dropped, so a
/// failing test leaves no stopped backend behind.
struct Stalled(Vec<i32>);

impl Stalled {
    fn stop(pids: &[i32]) -> Stalled {
        signal("-STOP", pids);
        Stalled(pids.to_vec())
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        signal("-CONT", &self.0);
    }
}

fn signal(which: &str, pids: &[i32]) {
    let status = std::process::Command::new("kill")
        .arg(which)
        .args(pids.iter().map(i32::to_string))
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pids:?}");
}
