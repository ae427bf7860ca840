//! Review streaming-eo F2 (the offsets path): a full disk under the offset
//! store is a failure that passes by itself once space is freed. The
//! connector does not exit: readiness is red with the cause `disk_full`,
//! nothing after the durable position is acknowledged, and once space is
//! back it goes on by itself and publishes every event (before, it stopped
//! as "needs an operator" while readiness stayed green).
//!
//! Needs root (it mounts a small tmpfs for the store), as `.ci/run` has.

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

    /// Writes zeros into `fill` until the filesystem refuses.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("fill");
        let mut f = std::fs::File::create(&path).expect("create the fill file");
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

async fn ready(port: u16) -> Option<(bool, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let body = outbox_cdc::http::get(addr, "/health/ready", Duration::from_secs(2))
        .await
        .ok();
    match body {
        Some(body) => Some((true, body)),
        None => {
            // A 503 is an error for `get`: read the body with a raw request.
            let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream
                .write_all(b"GET /health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut text = String::new();
            stream.read_to_string(&mut text).await.ok()?;
            Some((false, text))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_offsets_disk_is_retried_and_the_connector_goes_on_once_space_is_freed() {
    common::init_tracing();
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
    eventually("readiness names the full disk", TIMEOUT, || async {
        ready(port)
            .await
            .is_some_and(|(ok, body)| !ok && body.contains("disk_full"))
    })
    .await;
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
    eventually("ready again once space is freed", TIMEOUT, || async {
        ready(port).await.is_some_and(|(ok, _)| ok)
    })
    .await;
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
    let exit = child.terminate(Duration::from_secs(60));
    assert!(exit.success(), "stops gracefully: {exit}");
    drop(disk);
    fx.cleanup().await;
}
