//! Review streaming-eo F2 (the offsets path): a full disk under the offset
//! store is a failure that passes by itself once space is freed. The
//! connector does not exit: readiness is red with the cause `disk_full`,
//! nothing after the durable position is acknowledged, and once space is
//! back it goes on by itself and publishes every event (before, it stopped
//! as "needs an operator" while readiness stayed green).
//!
//! It also guards two defects a full disk showed: the live witness held the
//! store open while it waited for an acknowledgement, so the store could not
//! be opened again and the connector never came back (one run in four); and
//! a persist whose witness page failed dropped the page's fingerprints, so
//! the next persist stored the offset past them and the witness published
//! those delivered rows again.
//!
//! Needs root (it mounts a small tmpfs for the store), as `.ci/run` has; here
//! rather than in tests/it since it fills a disk the others do not share.
//! Files the connector deletes (expired witness pages) free room, so the
//! wait for `disk_full` tops the fill up.

use crate::common;

use std::collections::HashSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::relay::{Fixture, consume, eventually, free_port, log_of, spawn_binary};

const TIMEOUT: Duration = Duration::from_secs(120);

/// A tmpfs mounted for the test, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(at).expect("mount point");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs at {} failed (the test needs root): {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk(at.to_path_buf())
    }

    /// Appends zeros to `fill` until the filesystem refuses.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("fill");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open the fill file");
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Whether `/health/ready` answers 200, with its status line and body;
/// `None` when it does not answer (a loaded machine gets 10 s).
async fn ready(port: u16) -> Option<(bool, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (status, body) = outbox_cdc::http::get_any(addr, "/health/ready", Duration::from_secs(10))
        .await
        .ok()?;
    let ok = status.split_whitespace().nth(1) == Some("200");
    Some((ok, format!("{status}\n{body}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_offsets_disk_is_retried_and_the_connector_goes_on_once_space_is_freed() {
    common::init_tracing();
    let _alone = common::alone().await;
    let fx = Fixture::new("diskfull").await;
    let dir = tempfile::tempdir().expect("dir");
    let disk = SmallDisk::mount(&dir.path().join("disk"), "16m");
    let offsets = disk.0.join("offsets");
    let port = free_port();
    let text = fx
        .config_text()
        .replace(
            &fx.offsets_path().display().to_string(),
            &offsets.display().to_string(),
        )
        .replace("listen = \"\"", &format!("listen = \"127.0.0.1:{port}\""));
    assert!(text.contains(&format!(":{port}")));
    let config = dir.path().join("config.toml");
    std::fs::write(&config, text).expect("write config");

    let mut child = spawn_binary(&config);
    eventually("the connector streams", TIMEOUT, || async {
        ready(port).await.is_some_and(|(ok, _)| ok)
    })
    .await;
    let mut written = fx.write_numbered("before", 0).await;
    consume(&fx.topic_prefix, 1, TIMEOUT, Duration::from_millis(500));

    let fill = disk.fill();
    for i in 0..5 {
        written.extend(fx.write_numbered("full", i).await);
    }
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        // Room the connector freed (a file it deleted) is taken again.
        disk.fill();
        match ready(port).await {
            Some((false, body)) if body.contains("disk_full") => break,
            last => assert!(
                std::time::Instant::now() < deadline,
                "readiness did not name the full disk within {} s; last readiness: {last:?}\n{}",
                TIMEOUT.as_secs(),
                log_of(&config)
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let acked_while_full = fx.confirmed_lsn().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        child.try_wait().is_none(),
        "the connector must not exit on a full disk:\n{}",
        log_of(&config)
    );
    let log = log_of(&config);
    assert!(
        log.contains("the disk is full") && log.contains(&offsets.display().to_string()),
        "the log names the full disk and the path:\n{log}"
    );
    assert!(
        !log.contains("needs an operator"),
        "a full disk is not an operator stop:\n{log}"
    );

    std::fs::remove_file(&fill).expect("free the space");
    for i in 0..5 {
        written.extend(fx.write_numbered("freed", i).await);
    }
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match ready(port).await {
            Some((true, _)) => break,
            last => assert!(
                std::time::Instant::now() < deadline,
                "not ready again {} s after space was freed; last readiness: {last:?}\n{}",
                TIMEOUT.as_secs(),
                log_of(&config)
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let want: HashSet<&str> = written.iter().map(String::as_str).collect();
    let records = consume(
        &fx.topic_prefix,
        want.len(),
        TIMEOUT,
        Duration::from_secs(2),
    );
    let got: HashSet<&str> = records.iter().map(|r| r.header("event_id")).collect();
    let missing: Vec<&&str> = want.iter().filter(|id| !got.contains(**id)).collect();
    assert!(
        missing.is_empty(),
        "events lost across the full disk: {missing:?}\n{}",
        log_of(&config)
    );
    eventually(
        "acknowledged again once space is freed",
        TIMEOUT,
        || async { fx.confirmed_lsn().await > acked_while_full },
    )
    .await;
    // The events sent before the disk filled were acknowledged with their
    // witness fingerprints, or not at all: none is taken for missing.
    let log = log_of(&config);
    assert!(
        !log.contains("was not delivered by the stream"),
        "the live witness took delivered rows for missing:\n{log}"
    );
    let exit = child.terminate(Duration::from_secs(60));
    assert!(exit.success(), "stops gracefully: {exit}");
    drop(disk);
    fx.cleanup().await;
}
