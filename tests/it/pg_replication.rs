//! The replication transport against a real PostgreSQL: IDENTIFY_SYSTEM,
//! START_REPLICATION, XLogData, feedback that advances the slot, clean
//! shutdown and restart, and feedback that keeps a stalled consumer alive.
//!
//! The pgoutput payloads are only checked by their first byte (B, R, I, C);
//! decoding is the decoder's business. A Commit ('C') carries its end LSN at
//! bytes 10..18 (tag, flags u8, commit_lsn u64, end_lsn u64, timestamp i64).

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::relay::eventually;
use outbox_cdc::Disposition;
use outbox_cdc::checkpoint::OffsetStore;
use outbox_cdc::pg::control;
use outbox_cdc::pg::{
    DurableLsn, Lsn, PgConnectConfig, PgError, QualifiedTable, ReplicationConnection,
    ReplicationEvent, ReplicationStream, StreamOptions,
};

const WAIT: Duration = Duration::from_secs(60);

/// `lsn` made durable the only way there is: stored and flushed by an offset
/// store (`set_flushed` takes nothing else).
fn durable(lsn: Lsn) -> DurableLsn {
    let dir = tempfile::tempdir().expect("temp dir for an offset store");
    let store = OffsetStore::open(&dir.path().join("offsets")).expect("open the offset store");
    store
        .persist("pg_replication_test", lsn, "0")
        .expect("persist")
}

fn outbox_config() -> PgConnectConfig {
    PgConnectConfig::parse(&common::pg_url()).expect("OUTBOX_CDC_TEST_PG parses")
}

/// The outbox URL with `wal_sender_timeout` lowered for this connection only
/// (the setting is user-settable since PostgreSQL 12; it travels in the
/// startup packet's `options`), so no server-wide setting changes under
/// other tests.
fn outbox_config_with_wal_sender_timeout(timeout: &str) -> PgConnectConfig {
    let url = common::pg_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}options=-c%20wal_sender_timeout%3D{timeout}");
    PgConnectConfig::parse(&url).expect("URL with options parses")
}

/// A table with a publication and a slot, created as admin; dropped on `cleanup`.
struct Fixture {
    admin: tokio_postgres::Client,
    table: QualifiedTable,
    publication: String,
    slot: String,
}

impl Fixture {
    async fn new(prefix: &str) -> Fixture {
        let admin = common::admin_client().await;
        let table = QualifiedTable::new("public", common::unique_name(&format!("{prefix}_t")));
        let publication = common::unique_name(&format!("{prefix}_p"));
        let slot = common::unique_name(&format!("{prefix}_s"));
        admin
            .batch_execute(&format!(
                "CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text NOT NULL)"
            ))
            .await
            .expect("create table");
        control::create_publication(&admin, &publication, &table, false)
            .await
            .expect("create publication");
        control::create_logical_slot(&admin, &slot)
            .await
            .expect("create slot");
        Fixture {
            admin,
            table,
            publication,
            slot,
        }
    }

    async fn insert(&self, payloads: &[&str]) {
        let values: Vec<String> = payloads
            .iter()
            .map(|p| format!("('{}')", p.replace('\'', "''")))
            .collect();
        self.admin
            .batch_execute(&format!(
                "INSERT INTO {} (payload) VALUES {}",
                self.table,
                values.join(",")
            ))
            .await
            .expect("insert");
    }

    async fn start(&self, start: Lsn, options: StreamOptions) -> (ReplicationStream, i32) {
        self.start_with(&outbox_config(), start, options).await
    }

    async fn start_with(
        &self,
        cfg: &PgConnectConfig,
        start: Lsn,
        options: StreamOptions,
    ) -> (ReplicationStream, i32) {
        let mut conn = ReplicationConnection::connect(cfg, "outbox-cdc-test")
            .await
            .expect("replication connection as outbox");
        let pid = conn.backend_pid().expect("backend pid");
        conn.set_stream_options(options);
        let stream = conn
            .start_logical(&self.slot, start, &self.publication, false)
            .await
            .expect("START_REPLICATION");
        (stream, pid)
    }

    async fn cleanup(self) {
        // The slot may still be held for a moment by a walsender that is exiting.
        let deadline = Instant::now() + WAIT;
        loop {
            match control::drop_slot(&self.admin, &self.slot).await {
                Ok(()) | Err(PgError::SlotMissing { .. }) => break,
                Err(PgError::SlotActive { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Err(e) => panic!("dropping slot {}: {e}", self.slot),
            }
        }
        self.admin
            .batch_execute(&format!(
                "DROP PUBLICATION IF EXISTS \"{}\"; DROP TABLE IF EXISTS {}",
                self.publication, self.table
            ))
            .await
            .expect("cleanup");
    }
}

/// One transaction as seen on the wire: the first byte of each pgoutput
/// message from B to C, the payloads, and the commit's end LSN.
#[derive(Debug)]
struct Txn {
    tags: Vec<u8>,
    messages: Vec<Bytes>,
    end_lsn: Lsn,
}

/// Receives until a whole transaction has arrived, skipping keepalives and,
/// before PostgreSQL 15, the empty transactions (Begin directly followed by
/// Commit) pgoutput sends for other sessions' writes to unpublished tables.
async fn recv_txn(stream: &mut ReplicationStream) -> Txn {
    let mut tags = Vec::new();
    let mut messages = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, stream.recv())
            .await
            .expect("a transaction within the deadline")
            .expect("recv")
            .expect("stream still open");
        let ReplicationEvent::XLogData { data, .. } = event else {
            continue;
        };
        let tag = *data.first().expect("non-empty pgoutput message");
        tags.push(tag);
        messages.push(data.clone());
        if tag == b'C' && tags.len() == 2 {
            tags.clear();
            messages.clear();
            continue;
        }
        if tag == b'C' {
            let end = u64::from_be_bytes(data[10..18].try_into().expect("commit is 26 bytes"));
            return Txn {
                tags,
                messages,
                end_lsn: Lsn::new(end),
            };
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn identify_system_matches_the_server() {
    common::init_tracing();
    let admin = common::admin_client().await;
    let before = control::current_wal_lsn(&admin).await.unwrap();
    let mut conn = ReplicationConnection::connect(&outbox_config(), "outbox-cdc-test")
        .await
        .expect("replication connection as outbox (scram-sha-256)");
    let id = conn.identify_system().await.expect("IDENTIFY_SYSTEM");
    let after = control::current_wal_lsn(&admin).await.unwrap();

    assert_eq!(
        id.system_id,
        control::system_identifier(&admin).await.unwrap()
    );
    let timeline: i32 = admin
        .query_one("SELECT timeline_id FROM pg_control_checkpoint()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(i64::from(id.timeline), i64::from(timeline));
    assert!(
        before <= id.xlogpos && id.xlogpos <= after,
        "xlogpos {} outside [{before}, {after}]",
        id.xlogpos
    );
    let db: String = admin
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(id.dbname.as_deref(), Some(db.as_str()));
}

#[tokio::test]
async fn streams_confirms_shuts_down_and_resumes_without_resending() {
    common::init_tracing();
    let fx = Fixture::new("repl").await;
    let (mut stream, pid) = fx.start(Lsn::ZERO, StreamOptions::default()).await;

    fx.insert(&["first-a", "first-b", "first-c"]).await;
    let txn = recv_txn(&mut stream).await;
    assert_eq!(txn.tags.first(), Some(&b'B'), "{:?}", txn.tags);
    assert_eq!(txn.tags.last(), Some(&b'C'));
    let body: Vec<u8> = txn.tags[1..txn.tags.len() - 1].to_vec();
    assert_eq!(body, b"RIII", "relation then three inserts: {:?}", txn.tags);
    assert!(contains(&txn.messages[2], b"first-a"));

    let slot_before = control::slot_info(&fx.admin, &fx.slot)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(slot_before.active_pid, Some(pid));
    assert!(slot_before.confirmed_flush_lsn.unwrap() < txn.end_lsn);

    // Only what the caller reports as flushed is confirmed.
    let feedback = stream.feedback();
    feedback.set_flushed(durable(txn.end_lsn));
    eventually(
        "confirmed_flush_lsn to reach the commit end",
        WAIT,
        || async {
            let s = control::slot_info(&fx.admin, &fx.slot)
                .await
                .unwrap()
                .unwrap();
            s.confirmed_flush_lsn == Some(txn.end_lsn)
        },
    )
    .await;

    tokio::time::timeout(WAIT, stream.shutdown())
        .await
        .expect("shutdown is bounded")
        .expect("clean shutdown");
    eventually("the slot to be released", WAIT, || async {
        let s = control::slot_info(&fx.admin, &fx.slot)
            .await
            .unwrap()
            .unwrap();
        s.active_pid.is_none()
    })
    .await;
    let s = control::slot_info(&fx.admin, &fx.slot)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        s.confirmed_flush_lsn,
        Some(txn.end_lsn),
        "the final update did not regress"
    );

    // A transaction committed while nobody streams, then a restart from the
    // flushed position: the first transaction is not sent again.
    fx.insert(&["second"]).await;
    let (mut stream, _) = fx.start(txn.end_lsn, StreamOptions::default()).await;
    let next = recv_txn(&mut stream).await;
    assert!(next.end_lsn > txn.end_lsn);
    assert!(next.messages.iter().any(|m| contains(m, b"second")));
    assert!(
        !next.messages.iter().any(|m| contains(m, b"first-")),
        "{next:?}"
    );
    stream.shutdown().await.expect("clean shutdown");
    fx.cleanup().await;
}

async fn walsender_alive(admin: &tokio_postgres::Client, pid: i32) -> bool {
    admin
        .query_opt("SELECT 1 FROM pg_stat_replication WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .is_some()
}

/// Enough rows that the server's sends block on a full socket while we stall.
const STALL_ROWS: usize = 4000;

async fn insert_many(fx: &Fixture, marker: &str) {
    fx.admin
        .batch_execute(&format!(
            "INSERT INTO {} (payload) SELECT '{marker}' || repeat('x', 1000) FROM generate_series(1, {STALL_ROWS})",
            fx.table
        ))
        .await
        .expect("bulk insert");
}

#[tokio::test]
async fn stalled_consumer_keeps_its_connection_because_feedback_flows() {
    common::init_tracing();
    let fx = Fixture::new("stall").await;
    let options = StreamOptions {
        status_interval: Duration::from_secs(1),
        ..StreamOptions::default()
    };
    let cfg = outbox_config_with_wal_sender_timeout("3s");
    let (mut stream, pid) = fx.start_with(&cfg, Lsn::ZERO, options).await;
    fx.insert(&["warm-up"]).await;
    let first = recv_txn(&mut stream).await;
    stream.feedback().set_flushed(durable(first.end_lsn));

    insert_many(&fx, "stalled").await;
    // The consumer stalls for more than three times wal_sender_timeout.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        walsender_alive(&fx.admin, pid).await,
        "walsender {pid} was cut"
    );

    let big = recv_txn(&mut stream).await;
    let inserts = big.tags.iter().filter(|t| **t == b'I').count();
    assert_eq!(inserts, STALL_ROWS);
    stream.feedback().set_flushed(durable(big.end_lsn));
    fx.insert(&["after-stall"]).await;
    let after = recv_txn(&mut stream).await;
    assert!(after.messages.iter().any(|m| contains(m, b"after-stall")));
    assert!(walsender_alive(&fx.admin, pid).await);
    stream.shutdown().await.expect("clean shutdown");
    fx.cleanup().await;
}

/// Negative control: with status updates slower than wal_sender_timeout the
/// same stall gets the connection cut, so the test above would catch broken
/// feedback.
#[tokio::test]
async fn stalled_consumer_without_timely_feedback_is_cut() {
    common::init_tracing();
    let fx = Fixture::new("cut").await;
    let options = StreamOptions {
        status_interval: Duration::from_secs(120),
        ..StreamOptions::default()
    };
    let cfg = outbox_config_with_wal_sender_timeout("3s");
    let (mut stream, pid) = fx.start_with(&cfg, Lsn::ZERO, options).await;
    fx.insert(&["warm-up"]).await;
    recv_txn(&mut stream).await;

    insert_many(&fx, "stalled").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !walsender_alive(&fx.admin, pid).await,
        "walsender {pid} survived without feedback"
    );

    // What was buffered before the cut may still arrive; then the stream fails.
    let deadline = Instant::now() + WAIT;
    let err = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.recv())
            .await
            .expect("an error within the deadline")
        {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the server ended the copy instead of cutting us"),
            Err(e) => break e,
        }
    };
    assert_eq!(
        err.disposition(),
        Disposition::Retry,
        "a cut connection is retryable: {err}"
    );
    drop(stream);
    fx.cleanup().await;
}

// ------------------------------------------------------------ scripted server
//
// The conversations below are hard to provoke from a real server on demand (a
// keepalive that requests a reply, a server that goes silent), so an in-test
// server speaks PostgreSQL's side of the replication protocol.

mod scripted {
    use bytes::{BufMut, BytesMut};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::net::tcp::OwnedWriteHalf;
    use tokio::sync::mpsc;

    pub use crate::common::fake_pg::backend;

    pub fn keepalive(wal_end: u64, reply: bool) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_u8(b'k');
        b.put_u64(wal_end);
        b.put_i64(0);
        b.put_u8(u8::from(reply));
        backend(b'd', &b)
    }

    pub fn xlogdata(start: u64, payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_u8(b'w');
        b.put_u64(start);
        b.put_u64(start + payload.len() as u64);
        b.put_i64(0);
        b.put_slice(payload);
        backend(b'd', &b)
    }

    /// A frontend message: tag and body.
    pub type Msg = (u8, Vec<u8>);

    /// Accepts one client, completes a trust login, answers START_REPLICATION
    /// with CopyBothResponse and then hands over: every later frontend
    /// message arrives on the channel, and the write half is returned.
    pub async fn listen() -> (
        String,
        tokio::task::JoinHandle<(OwnedWriteHalf, mpsc::UnboundedReceiver<Msg>, String)>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            let (mut r, mut w) = sock.into_split();
            let len = r.read_i32().await.unwrap() as usize;
            let mut startup = vec![0u8; len - 4];
            r.read_exact(&mut startup).await.unwrap();
            let mut out = backend(b'R', &0i32.to_be_bytes());
            out.extend(backend(b'K', &[0, 0, 0x10, 0x92, 0, 0, 0, 1]));
            out.extend(backend(b'Z', b"I"));
            w.write_all(&out).await.unwrap();
            let (tx, rx) = mpsc::unbounded_channel();
            let mut first = None;
            tokio::spawn(async move {
                loop {
                    let Ok(tag) = r.read_u8().await else { return };
                    let len = r.read_i32().await.unwrap() as usize;
                    let mut body = vec![0u8; len - 4];
                    r.read_exact(&mut body).await.unwrap();
                    if tx.send((tag, body)).is_err() {
                        return;
                    }
                }
            });
            let mut rx = rx;
            if let Some((b'Q', body)) = rx.recv().await {
                first = Some(String::from_utf8(body).unwrap());
            }
            w.write_all(&backend(b'W', &[0, 0, 0])).await.unwrap();
            (w, rx, first.unwrap_or_default())
        });
        (
            format!("host=127.0.0.1 port={port} user=u dbname=d sslmode=disable"),
            task,
        )
    }

    /// The next standby status update: (written, flushed, applied, reply flag).
    pub async fn next_status(
        rx: &mut mpsc::UnboundedReceiver<Msg>,
    ) -> Option<(u64, u64, u64, bool)> {
        loop {
            let (tag, body) = rx.recv().await?;
            if tag == b'd' && body.first() == Some(&b'r') {
                assert_eq!(body.len(), 34, "status update length");
                let u = |i: usize| u64::from_be_bytes(body[i..i + 8].try_into().unwrap());
                return Some((u(1), u(9), u(17), body[33] == 1));
            }
            if tag == b'c' {
                return None;
            }
        }
    }
}

#[tokio::test]
async fn keepalive_requesting_a_reply_is_answered_and_shutdown_is_clean() {
    common::init_tracing();
    let (url, server) = scripted::listen().await;
    let cfg = PgConnectConfig::parse_with_env(&url, |_| None).unwrap();
    let mut conn = ReplicationConnection::connect(&cfg, "scripted")
        .await
        .unwrap();
    assert_eq!(conn.backend_pid(), Some(0x1092));
    conn.set_stream_options(StreamOptions {
        status_interval: Duration::from_secs(3600),
        ..StreamOptions::default()
    });
    let mut stream = conn
        .start_logical("my \"slot\"", Lsn::new(0x1_0000_0010), "p'ub", false)
        .await
        .unwrap();
    let (mut w, mut rx, command) = server.await.unwrap();
    assert_eq!(
        command,
        "START_REPLICATION SLOT \"my \"\"slot\"\"\" LOGICAL 1/10 (proto_version '1', publication_names '\"p''ub\"')\0"
    );
    // The writer's first update goes out at once.
    assert_eq!(scripted::next_status(&mut rx).await, Some((0, 0, 0, false)));

    use tokio::io::AsyncWriteExt;
    w.write_all(&scripted::keepalive(0x99, true)).await.unwrap();
    let ev = stream.recv().await.unwrap().unwrap();
    assert_eq!(
        ev,
        ReplicationEvent::Keepalive {
            wal_end: Lsn::new(0x99),
            server_time: outbox_cdc::pg::PgTimestamp(0),
            reply_requested: true
        }
    );
    // Answered at once although the timer is an hour away; the transport
    // does not report the keepalive's wal_end as flushed on its own.
    let answer = tokio::time::timeout(Duration::from_secs(5), scripted::next_status(&mut rx))
        .await
        .expect("a status update in reply to the keepalive");
    assert_eq!(answer, Some((0, 0, 0, false)));

    // A new flushed position goes out soon, without waiting for the timer.
    stream.feedback().set_flushed(durable(Lsn::new(0x50)));
    let flushed = tokio::time::timeout(Duration::from_secs(5), scripted::next_status(&mut rx))
        .await
        .expect("a status update after set_flushed");
    assert_eq!(flushed, Some((0x50, 0x50, 0x50, false)));

    let mut out = scripted::xlogdata(0x100, b"Bpayload");
    out.extend(scripted::backend(b'c', b""));
    w.write_all(&out).await.unwrap();
    match stream.recv().await.unwrap() {
        Some(ReplicationEvent::XLogData {
            wal_start, data, ..
        }) => {
            assert_eq!(wal_start, Lsn::new(0x100));
            assert_eq!(&data[..], b"Bpayload");
        }
        other => panic!("expected XLogData, got {other:?}"),
    }
    assert_eq!(
        stream.recv().await.unwrap(),
        None,
        "server CopyDone ends the stream"
    );

    // Shutdown: final update, CopyDone, then the server's CommandComplete +
    // ReadyForQuery, then Terminate.
    let shutdown = tokio::spawn(stream.shutdown());
    let last = scripted::next_status(&mut rx).await;
    assert_eq!(last, Some((0x50, 0x50, 0x50, false)));
    assert_eq!(
        scripted::next_status(&mut rx).await,
        None,
        "CopyDone after the final update"
    );
    let mut out = scripted::backend(b'C', b"COPY 0\0");
    out.extend(scripted::backend(b'Z', b"I"));
    w.write_all(&out).await.unwrap();
    shutdown.await.unwrap().expect("clean shutdown");
    assert_eq!(rx.recv().await.map(|m| m.0), Some(b'X'), "Terminate");
}

#[tokio::test]
async fn a_server_shutting_down_ends_the_stream_with_command_complete() {
    common::init_tracing();
    let (url, server) = scripted::listen().await;
    let cfg = PgConnectConfig::parse_with_env(&url, |_| None).unwrap();
    let conn = ReplicationConnection::connect(&cfg, "scripted")
        .await
        .unwrap();
    let mut stream = conn.start_logical("s", Lsn::ZERO, "p", true).await.unwrap();
    let (mut w, _rx, _) = server.await.unwrap();
    // What a walsender sends at a fast shutdown when caught up: the last data,
    // then CommandComplete (no CopyDone), then it closes the connection.
    let mut out = scripted::xlogdata(0x200, b"Cdone");
    out.extend(scripted::backend(b'C', b"COPY 0\0"));
    use tokio::io::AsyncWriteExt;
    w.write_all(&out).await.unwrap();
    drop(w);
    assert!(matches!(
        stream.recv().await.unwrap(),
        Some(ReplicationEvent::XLogData { .. })
    ));
    assert_eq!(
        stream
            .recv()
            .await
            .expect("CommandComplete is an orderly end, not an error"),
        None
    );
}

#[tokio::test]
async fn a_silent_server_is_asked_for_a_keepalive_then_timed_out() {
    common::init_tracing();
    let (url, server) = scripted::listen().await;
    let cfg = PgConnectConfig::parse_with_env(&url, |_| None).unwrap();
    let mut conn = ReplicationConnection::connect(&cfg, "scripted")
        .await
        .unwrap();
    conn.set_stream_options(StreamOptions {
        status_interval: Duration::from_secs(3600),
        idle_timeout: Duration::from_millis(300),
        ..StreamOptions::default()
    });
    let mut stream = conn.start_logical("s", Lsn::ZERO, "p", true).await.unwrap();
    let (_w, mut rx, _) = server.await.unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(WAIT, stream.recv())
        .await
        .expect("recv gives up on a silent server")
        .expect_err("a silent server is an error");
    assert!(matches!(err, PgError::Timeout { .. }), "{err:?}");
    assert_eq!(err.disposition(), Disposition::Retry);
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(scripted::next_status(&mut rx).await, Some((0, 0, 0, false)));
    assert_eq!(
        scripted::next_status(&mut rx).await,
        Some((0, 0, 0, true)),
        "asked the server for a keepalive before giving up"
    );
}

/// `target_session_attrs` over a multi-host URL: a host that does not answer
/// and one of the wrong kind are passed over, on both the replication and the
/// SQL connection; when no host fits, the error names the wish and what was
/// found, and is retryable (a failover may be in progress).
#[tokio::test]
async fn target_session_attrs_picks_the_fitting_host() {
    let url = common::pg_url();
    // postgres://user:password@host:port/db[?...]: a closed port first
    // (nothing listens on port 1), then the server.
    let at = url.rfind('@').expect("user in the test URL") + 1;
    let slash = at + url[at..].find('/').expect("database in the test URL");
    let (head, server, tail) = (&url[..at], &url[at..slash], &url[slash..]);
    let multi = |attrs: &str| {
        let sep = if tail.contains('?') { '&' } else { '?' };
        PgConnectConfig::parse(&format!(
            "{head}127.0.0.1:1,{server}{tail}{sep}target_session_attrs={attrs}"
        ))
        .expect("multi-host URL parses")
    };
    for attrs in ["read-write", "primary", "any", "prefer-standby"] {
        let cfg = multi(attrs);
        let mut conn = ReplicationConnection::connect(&cfg, "outbox-cdc-test")
            .await
            .unwrap_or_else(|e| panic!("replication connection with {attrs}: {e}"));
        conn.identify_system().await.expect("identify");
        let client = cfg
            .connect_sql()
            .await
            .unwrap_or_else(|e| panic!("SQL connection with {attrs}: {e}"));
        let one: i32 = client
            .query_one("SELECT 1", &[])
            .await
            .expect("query")
            .get(0);
        assert_eq!(one, 1);
    }
    for attrs in ["standby", "read-only"] {
        let err = ReplicationConnection::connect(&multi(attrs), "outbox-cdc-test")
            .await
            .err()
            .unwrap_or_else(|| panic!("{attrs}: a primary was accepted"));
        assert!(
            matches!(&err, PgError::WrongServerKind { wanted, .. } if *wanted == attrs),
            "{attrs}: {err}"
        );
        assert_eq!(err.disposition(), Disposition::Retry, "{err}");
        let err = multi(attrs).connect_sql().await.expect_err("SQL refused");
        assert!(matches!(err, PgError::WrongServerKind { .. }), "{err}");
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    let bad = PgConnectConfig::parse(&format!("{url}{sep}target_session_attrs=leader"));
    assert!(
        matches!(&bad, Err(PgError::Config { key, .. }) if key == "target_session_attrs"),
        "{bad:?}"
    );
}
