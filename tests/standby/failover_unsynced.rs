//! A failover where the slot was NOT synced to the standby (no
//! `postgres.failover_slot`, or PostgreSQL before 17): the promoted standby
//! has no slot, and the connector refuses to go on (the "slot lost" refusal
//! with its fix) instead of creating a new slot past the rows it never read.
//! Needs `scripts/env.sh up --standby` and stops the primary: run by
//! `scripts/test.sh` (`cargo test --test standby failover_unsynced::`), not by
//! default.

use crate::common;

use std::time::Duration;

use common::ha::{
    check_line, check_report, multi_host_url, slot_on_standby, spawn_primary_writer, standby_admin,
};
use common::relay::{Fixture, Running};
use common::{env_sh, init_tracing};
use outbox_cdc::checkpoint::OffsetStore;
use outbox_cdc::pipeline::{PipelineError, StartRefused};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_without_the_slot_is_refused_loudly() {
    let _alone = common::alone().await;
    init_tracing();
    let fx = Fixture::new("unsynced").await;
    let config = fx.config_with(&format!(
        "OUTBOX_CDC__POSTGRES__URL={} OUTBOX_CDC__POSTGRES__FAILOVER_SLOT=false",
        multi_host_url()
    ));
    let running = Running::start(config).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writer = spawn_primary_writer(fx.table.clone(), stop_rx);
    common::relay::eventually("some events published", Duration::from_secs(60), || async {
        running.metrics.events_published() > 20
    })
    .await;
    let standby = standby_admin().await;
    assert_eq!(
        slot_on_standby(&standby, &fx.slot).await,
        None,
        "a slot created without FAILOVER is not synced"
    );
    let report = check_report(
        &fx.write_config_file(),
        &[("OUTBOX_CDC__POSTGRES__URL", multi_host_url())],
    );
    let line = check_line(&report, "failover");
    assert!(
        line.starts_with("WARN") && line.contains("created without failover"),
        "check warns that a failover would lose the slot:\n{report}"
    );

    env_sh("crash-primary");
    let _ = stop_tx.send(true);
    writer.await.expect("writer");
    env_sh("promote");

    // The slot is gone on the new primary: refused. (Without synchronized
    // standby slots the connector may also have published WAL the standby
    // never received: then the offset is ahead of the new primary, refused too.)
    let refusal = match running.finished(Duration::from_secs(60)).await {
        Err(PipelineError::Refused(refusal @ StartRefused::SlotLost { .. }))
        | Err(PipelineError::Refused(refusal @ StartRefused::OffsetAheadOfServer { .. })) => {
            refusal
        }
        other => panic!("expected a refusal after an unsynced failover, got {other:?}"),
    };
    let text = refusal.to_string();
    assert!(text.contains(&fx.slot), "{text}");
    assert!(
        text.contains("outbox-cdc repair") || text.contains("--recreate-slot"),
        "the refusal names the fix: {text}"
    );
    let stored = OffsetStore::open(&fx.offsets_path())
        .expect("offset store")
        .load(&fx.slot)
        .expect("load")
        .expect("an offset");
    assert!(stored.lsn > outbox_cdc::pg::Lsn::ZERO);
    assert_eq!(
        slot_on_standby(&standby, &fx.slot).await,
        None,
        "no slot was created behind the operator's back"
    );
}
