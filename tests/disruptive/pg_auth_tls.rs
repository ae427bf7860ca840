//! Authentication and TLS of both connections (replication transport and the
//! tokio-postgres control client).
//!
//! - SCRAM-SHA-256 and wrong/missing passwords against the real server.
//! - md5 and cleartext against an in-test server that replays PostgreSQL's
//!   side of the exchange: the shared test cluster only allows SCRAM
//!   (`host all all 127.0.0.1/32 scram-sha-256`), under which an md5 or
//!   cleartext exchange cannot be provoked.
//! - sslmode=require against the server without TLS, then TLS for real: the
//!   test makes a CA and a server certificate with openssl, turns `ssl = on`
//!   with ALTER SYSTEM + pg_reload_conf, checks every sslmode, and restores.

use crate::common;
use common::fake_pg::{backend, openssl};

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, BytesMut};
use outbox_cdc::Disposition;
use outbox_cdc::pg::control;
use outbox_cdc::pg::{
    Lsn, PgConnectConfig, PgError, ReplicationConnection, ReplicationEvent, SslMode, quote_ident,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(60);

/// The pieces of the `outbox` URL, to build variants of it.
struct Target {
    host: String,
    port: u16,
    user: String,
    password: String,
    dbname: String,
}

fn target() -> Target {
    let cfg: tokio_postgres::Config = common::pg_url().parse().expect("OUTBOX_CDC_TEST_PG parses");
    let host = match cfg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        other => panic!("OUTBOX_CDC_TEST_PG must name a TCP host, got {other:?}"),
    };
    Target {
        host,
        port: cfg.get_ports().first().copied().unwrap_or(5432),
        user: cfg
            .get_user()
            .expect("user in OUTBOX_CDC_TEST_PG")
            .to_owned(),
        password: String::from_utf8(
            cfg.get_password()
                .expect("password in OUTBOX_CDC_TEST_PG")
                .to_vec(),
        )
        .expect("UTF-8 password"),
        dbname: cfg
            .get_dbname()
            .expect("dbname in OUTBOX_CDC_TEST_PG")
            .to_owned(),
    }
}

fn q(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

impl Target {
    /// A key=value connection string with `extra` settings appended.
    fn kv(&self, host: &str, password: Option<&str>, extra: &str) -> PgConnectConfig {
        let mut s = format!(
            "host={} port={} user={} dbname={} connect_timeout=20 {extra}",
            q(host),
            self.port,
            q(&self.user),
            q(&self.dbname)
        );
        if let Some(pw) = password {
            s.push_str(&format!(" password={}", q(pw)));
        }
        PgConnectConfig::parse_with_env(&s, |_| None).expect("test connection string parses")
    }

    fn with(&self, extra: &str) -> PgConnectConfig {
        self.kv(&self.host, Some(&self.password), extra)
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

async fn server_ssl_is(admin: &tokio_postgres::Client) -> bool {
    let v: String = admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    v == "on"
}

#[tokio::test]
async fn scram_login_on_both_connections() {
    let _alone = common::alone().await;
    common::init_tracing();
    let t = target();
    let admin = common::admin_client().await;
    let stored: String = admin
        .query_one(
            "SELECT rolpassword FROM pg_authid WHERE rolname = $1",
            &[&t.user],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        stored.starts_with("SCRAM-SHA-256$"),
        "the outbox role has a SCRAM verifier"
    );

    let cfg = PgConnectConfig::parse(&common::pg_url()).unwrap();
    let mut repl = ReplicationConnection::connect(&cfg, "outbox-cdc-auth")
        .await
        .expect("SCRAM login");
    let id = repl.identify_system().await.unwrap();
    assert!(!id.system_id.is_empty());

    let client = cfg.connect_sql().await.expect("SCRAM login for SQL");
    let who: String = client
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(who, t.user);
}

#[tokio::test]
async fn wrong_password_is_a_definite_auth_error_naming_user_and_host() {
    let _alone = common::alone().await;
    common::init_tracing();
    let t = target();
    let cfg = t.kv(
        &t.host,
        Some("definitely-not-the-password"),
        "sslmode=disable",
    );
    let check = |e: PgError, which: &str| {
        assert!(
            matches!(e, PgError::Auth { .. }),
            "{which}: expected Auth, got {e:?}"
        );
        assert_eq!(e.sqlstate(), Some("28P01"), "{which}");
        assert_eq!(
            e.disposition(),
            Disposition::Stop,
            "{which}: a wrong password must not be retried"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("{:?}", t.user)),
            "{which}: names the user: {msg}"
        );
        assert!(msg.contains(&t.addr()), "{which}: names the host: {msg}");
        assert!(
            !msg.contains("definitely-not-the-password"),
            "{which}: {msg}"
        );
    };
    let e = ReplicationConnection::connect(&cfg, "outbox-cdc-auth")
        .await
        .err()
        .expect("login with a wrong password fails");
    check(e, "replication");
    let e = cfg
        .connect_sql()
        .await
        .expect_err("SQL login with a wrong password fails");
    check(e, "sql");
}

#[tokio::test]
async fn missing_password_fails_locally_with_a_hint() {
    let _alone = common::alone().await;
    common::init_tracing();
    let t = target();
    let cfg = t.kv(&t.host, None, "sslmode=disable");
    let e = ReplicationConnection::connect(&cfg, "outbox-cdc-auth")
        .await
        .err()
        .expect("SCRAM without a password fails");
    assert!(matches!(e, PgError::Auth { code: None, .. }), "{e:?}");
    assert_eq!(e.disposition(), Disposition::Stop);
    assert!(e.to_string().contains("PGPASSWORD"), "{e}");
}

#[tokio::test]
async fn require_against_a_server_without_tls_is_a_clear_error() {
    let _alone = common::alone().await;
    common::init_tracing();
    let admin = common::admin_client().await;
    assert!(
        !server_ssl_is(&admin).await,
        "the test server is expected to run without TLS"
    );
    let t = target();
    for mode in ["require", "verify-full sslrootcert=/nonexistent.pem"] {
        let cfg = t.with(&format!("sslmode={mode}"));
        let e = ReplicationConnection::connect(&cfg, "outbox-cdc-tls")
            .await
            .err()
            .expect("TLS is required");
        assert!(
            matches!(e, PgError::TlsUnsupported { .. } | PgError::Config { .. }),
            "{e:?}"
        );
        assert_eq!(e.disposition(), Disposition::Stop);
    }
    let cfg = t.with("sslmode=require");
    let expected = format!(
        "server does not support TLS (sslmode=require) at {}",
        t.addr()
    );
    let e = ReplicationConnection::connect(&cfg, "outbox-cdc-tls")
        .await
        .err()
        .unwrap();
    assert_eq!(e.to_string(), expected);
    let e = cfg.connect_sql().await.err().unwrap();
    assert_eq!(e.to_string(), expected);
    assert_eq!(e.disposition(), Disposition::Stop);

    // prefer falls back to plain text.
    let client = t
        .with("sslmode=prefer")
        .connect_sql()
        .await
        .expect("prefer connects");
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!ssl);
}

// ---------------------------------------------------------------- fake server

/// Reads the startup packet (after answering an SSLRequest with 'N') and
/// returns its parameters.
async fn fake_startup(sock: &mut TcpStream) -> Vec<(String, String)> {
    loop {
        let len = sock.read_i32().await.unwrap() as usize;
        let mut body = vec![0u8; len - 4];
        sock.read_exact(&mut body).await.unwrap();
        let code = i32::from_be_bytes(body[..4].try_into().unwrap());
        if code == 80877103 {
            sock.write_all(b"N").await.unwrap();
            continue;
        }
        assert_eq!(code, 196608, "protocol 3.0");
        let fields: Vec<String> = body[4..]
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8(s.to_vec()).unwrap())
            .collect();
        return fields
            .chunks(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect();
    }
}

async fn read_frontend(sock: &mut TcpStream) -> (u8, Vec<u8>) {
    let tag = sock.read_u8().await.unwrap();
    let len = sock.read_i32().await.unwrap() as usize;
    let mut body = vec![0u8; len - 4];
    sock.read_exact(&mut body).await.unwrap();
    (tag, body)
}

async fn fake_server_ready(sock: &mut TcpStream) {
    let mut out = backend(b'R', &0i32.to_be_bytes());
    out.extend(backend(b'S', b"server_version\x0015.0\x00"));
    let mut key = BytesMut::new();
    key.put_i32(4242);
    key.put_i32(7);
    out.extend(backend(b'K', &key));
    out.extend(backend(b'Z', b"I"));
    sock.write_all(&out).await.unwrap();
}

/// Replays the server side of one login with `request` (an Authentication
/// body) and checks the client's password message against `expected`.
async fn fake_login(
    request: Vec<u8>,
    expected_password: &'static [u8],
    accept: bool,
) -> (String, tokio::task::JoinHandle<Vec<(String, String)>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let params = fake_startup(&mut sock).await;
        sock.write_all(&backend(b'R', &request)).await.unwrap();
        let (tag, body) = read_frontend(&mut sock).await;
        assert_eq!(tag, b'p');
        assert_eq!(body, expected_password, "password message");
        if !accept {
            sock.write_all(&backend(
                b'E',
                b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"outbox_md5\"\0\0",
            ))
            .await
            .unwrap();
            return params;
        }
        fake_server_ready(&mut sock).await;
        // IDENTIFY_SYSTEM, answered as PostgreSQL 15 does.
        let (tag, body) = read_frontend(&mut sock).await;
        assert_eq!((tag, body.as_slice()), (b'Q', &b"IDENTIFY_SYSTEM\0"[..]));
        let mut row = BytesMut::new();
        row.put_i16(4);
        for v in [&b"7312345678901234567"[..], b"1", b"0/16B3748"] {
            row.put_i32(v.len() as i32);
            row.put_slice(v);
        }
        row.put_i32(-1);
        let mut out = backend(b'T', &fake_row_description());
        out.extend(backend(b'D', &row));
        out.extend(backend(b'C', b"IDENTIFY_SYSTEM\0"));
        out.extend(backend(b'Z', b"I"));
        sock.write_all(&out).await.unwrap();
        params
    });
    (
        format!(
            "host=127.0.0.1 port={port} user=outbox_md5 password=outbox_md5 dbname=app sslmode=prefer"
        ),
        task,
    )
}

fn fake_row_description() -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_i16(4);
    for (name, oid) in [
        ("systemid", 25),
        ("timeline", 23),
        ("xlogpos", 25),
        ("dbname", 25),
    ] {
        b.put_slice(name.as_bytes());
        b.put_u8(0);
        b.put_i32(0);
        b.put_i16(0);
        b.put_i32(oid);
        b.put_i16(-1);
        b.put_i32(-1);
        b.put_i16(0);
    }
    b.to_vec()
}

#[tokio::test]
async fn md5_login_replays_the_server_exchange() {
    let _alone = common::alone().await;
    common::init_tracing();
    let mut request = 5i32.to_be_bytes().to_vec();
    request.extend_from_slice(&[0x9a, 0x1b, 0x2c, 0x3d]);
    // md5(md5(password + user) + salt), computed independently of the code under test.
    let (url, server) = fake_login(request, b"md59c1fdc0175a8ece8d185396ee5a2bf3b\0", true).await;
    let cfg = PgConnectConfig::parse_with_env(&url, |_| None).unwrap();
    let mut conn = ReplicationConnection::connect(&cfg, "fake-md5")
        .await
        .expect("md5 login");
    assert_eq!(conn.backend_pid(), Some(4242));
    let id = conn.identify_system().await.expect("IDENTIFY_SYSTEM");
    assert_eq!(id.system_id, "7312345678901234567");
    assert_eq!(id.timeline, 1);
    assert_eq!(id.xlogpos, "0/16B3748".parse::<Lsn>().unwrap());
    assert_eq!(id.dbname, None);
    let params = server.await.unwrap();
    for (k, v) in [
        ("user", "outbox_md5"),
        ("database", "app"),
        ("replication", "database"),
        ("application_name", "fake-md5"),
    ] {
        assert!(
            params.contains(&(k.to_owned(), v.to_owned())),
            "startup has {k}={v}: {params:?}"
        );
    }
}

#[tokio::test]
async fn cleartext_login_and_server_rejection() {
    let _alone = common::alone().await;
    common::init_tracing();
    let (url, server) = fake_login(3i32.to_be_bytes().to_vec(), b"outbox_md5\0", true).await;
    let cfg = PgConnectConfig::parse_with_env(&url, |_| None).unwrap();
    ReplicationConnection::connect(&cfg, "fake-clear")
        .await
        .expect("cleartext login");
    drop(server);

    let mut request = 5i32.to_be_bytes().to_vec();
    request.extend_from_slice(&[0x9a, 0x1b, 0x2c, 0x3d]);
    let (url, server) = fake_login(request, b"md59c1fdc0175a8ece8d185396ee5a2bf3b\0", false).await;
    let cfg = PgConnectConfig::parse_with_env(&url, |_| None).unwrap();
    let e = ReplicationConnection::connect(&cfg, "fake-reject")
        .await
        .err()
        .expect("rejected");
    assert!(matches!(e, PgError::Auth { .. }), "{e:?}");
    assert_eq!(e.sqlstate(), Some("28P01"));
    assert_eq!(e.disposition(), Disposition::Stop);
    server.await.unwrap();
}

/// One login against a scripted server: it sends `first` (an Authentication
/// body) and, for SCRAM, answers the client-first message with a nonce that
/// extends the client's, then sends `after_proof` (raw backend messages).
/// Returns what the client sent after the first request: the tags of its
/// messages until it closed the socket.
async fn scripted_login(
    first: Vec<u8>,
    after_proof: Vec<u8>,
) -> (u16, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        fake_startup(&mut sock).await;
        let scram = first[..4] == 10i32.to_be_bytes();
        sock.write_all(&backend(b'R', &first)).await.unwrap();
        let mut sent = Vec::new();
        loop {
            let tag = match sock.read_u8().await {
                Ok(t) => t,
                Err(_) => return sent, // the client closed
            };
            let len = sock.read_i32().await.unwrap() as usize;
            let mut body = vec![0u8; len - 4];
            sock.read_exact(&mut body).await.unwrap();
            sent.push(tag);
            if !scram || tag != b'p' {
                continue;
            }
            if sent.len() == 1 {
                let text = String::from_utf8_lossy(&body).into_owned();
                // The nonce is any printable character but ',': it may hold "r=",
                // so it is what follows the first ",r=" (after "n=").
                let nonce = text.split_once(",r=").unwrap().1.to_owned();
                let mut cont = 11i32.to_be_bytes().to_vec();
                cont.extend_from_slice(format!("r={nonce}srv,s=c2FsdHNhbHQ=,i=4096").as_bytes());
                sock.write_all(&backend(b'R', &cont)).await.unwrap();
            } else if sent.len() == 2 {
                sock.write_all(&after_proof).await.unwrap();
            }
        }
    });
    (port, task)
}

fn scripted_cfg(port: u16, extra: &str) -> PgConnectConfig {
    PgConnectConfig::parse_with_env(
        &format!("host=127.0.0.1 port={port} user=u password=pw dbname=app sslmode=prefer {extra}"),
        |_| None,
    )
    .unwrap()
}

/// Logs in to a fresh scripted server with both connections; returns the
/// errors (replication, SQL) and what each client sent.
async fn both_logins(first: &[u8], after_proof: &[u8], extra: &str) -> [(PgError, Vec<u8>); 2] {
    let (port, server) = scripted_login(first.to_vec(), after_proof.to_vec()).await;
    let repl = ReplicationConnection::connect(&scripted_cfg(port, extra), "scripted")
        .await
        .err()
        .expect("the replication login must be refused");
    let repl_sent = server.await.unwrap();
    let (port, server) = scripted_login(first.to_vec(), after_proof.to_vec()).await;
    let sql = scripted_cfg(port, extra)
        .connect_sql()
        .await
        .expect_err("the SQL login must be refused");
    let sql_sent = server.await.unwrap();
    [(repl, repl_sent), (sql, sql_sent)]
}

fn sasl_request() -> Vec<u8> {
    let mut r = 10i32.to_be_bytes().to_vec();
    r.extend_from_slice(b"SCRAM-SHA-256\0\0");
    r
}

fn ok_and_ready() -> Vec<u8> {
    let mut out = backend(b'R', &0i32.to_be_bytes());
    out.extend(backend(b'Z', b"I"));
    out
}

#[tokio::test]
async fn scram_without_a_verified_server_signature_is_refused() {
    let _alone = common::alone().await;
    common::init_tracing();
    // AuthenticationOk right after our proof, without SASLFinal.
    for (e, sent) in both_logins(&sasl_request(), &ok_and_ready(), "").await {
        assert_eq!(e.disposition(), Disposition::Stop, "{e:?}");
        assert_eq!(sent, b"pp", "client-first and client-final only");
        assert!(
            !matches!(e, PgError::Io { .. } | PgError::Closed { .. }),
            "a refusal, not a broken socket: {e:?}"
        );
    }
    let [(repl, _), _] = both_logins(&sasl_request(), &ok_and_ready(), "").await;
    assert!(matches!(repl, PgError::Auth { code: None, .. }), "{repl:?}");
    assert!(repl.to_string().contains("man in the middle"), "{repl}");

    // A SASLFinal whose signature was not made with the password.
    let mut forged = 12i32.to_be_bytes().to_vec();
    forged.extend_from_slice(b"v=dGhpcyBpcyBub3QgdGhlIHNpZ25hdHVyZSBvZiB0aGUgc2VydmVy");
    let mut after = backend(b'R', &forged);
    after.extend(ok_and_ready());
    for (e, sent) in both_logins(&sasl_request(), &after, "").await {
        assert_eq!(e.disposition(), Disposition::Stop, "{e:?}");
        assert_eq!(sent, b"pp");
    }
}

#[tokio::test]
async fn require_auth_refuses_cleartext_and_md5_before_sending_the_password() {
    let _alone = common::alone().await;
    common::init_tracing();
    let mut md5 = 5i32.to_be_bytes().to_vec();
    md5.extend_from_slice(&[1, 2, 3, 4]);
    let cleartext = 3i32.to_be_bytes().to_vec();
    for (request, method) in [(md5, "md5"), (cleartext, "password")] {
        for extra in ["require_auth=scram-sha-256", "require_auth=!password,!md5"] {
            for (e, sent) in both_logins(&request, &[], extra).await {
                assert!(sent.is_empty(), "{extra}: nothing sent, got {sent:?}");
                assert!(matches!(e, PgError::Auth { code: None, .. }), "{e:?}");
                assert_eq!(e.disposition(), Disposition::Stop);
                let msg = e.to_string();
                assert!(
                    msg.contains(method) && msg.contains("require_auth"),
                    "{msg}"
                );
            }
        }
        // channel_binding=require refuses them too: they cannot bind.
        for (e, sent) in both_logins(&request, &[], "channel_binding=require").await {
            assert!(sent.is_empty());
            assert!(e.to_string().contains("channel_binding=require"), "{e}");
        }
    }
}

#[tokio::test]
async fn channel_binding_and_require_auth_against_the_server_without_tls() {
    let _alone = common::alone().await;
    common::init_tracing();
    let admin = common::admin_client().await;
    assert!(!server_ssl_is(&admin).await);
    let t = target();
    let cfg = t.with("sslmode=prefer channel_binding=require");
    let e = ReplicationConnection::connect(&cfg, "outbox-cdc-cb")
        .await
        .err()
        .expect("no TLS, nothing to bind to");
    let sql = cfg
        .connect_sql()
        .await
        .expect_err("no TLS, nothing to bind to");
    for e in [e, sql] {
        assert!(matches!(e, PgError::Auth { code: None, .. }), "{e:?}");
        assert_eq!(e.disposition(), Disposition::Stop);
        assert!(e.to_string().contains("channel_binding=require"), "{e}");
    }
    // The test server asks for SCRAM: allowed when listed, refused when not.
    let ok = t.with("require_auth=scram-sha-256");
    ReplicationConnection::connect(&ok, "outbox-cdc-ra")
        .await
        .unwrap();
    ok.connect_sql().await.unwrap();
    let refused = t.with("require_auth=md5,password");
    let e = ReplicationConnection::connect(&refused, "outbox-cdc-ra")
        .await
        .err()
        .unwrap();
    let sql = refused.connect_sql().await.unwrap_err();
    for e in [e, sql] {
        assert!(matches!(e, PgError::Auth { code: None, .. }), "{e:?}");
        assert!(e.to_string().contains("require_auth=password,md5"), "{e}");
    }
}

// ---------------------------------------------------------------- real TLS

/// A CA, a server certificate for DNS name `localhost` signed by it, and an
/// unrelated CA. Returns (dir, ca.crt, other-ca.crt).
fn make_certs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    const EC: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    for ca in ["ca", "other-ca"] {
        openssl(
            &d,
            &format!(
                "req -x509 {EC} -keyout {ca}.key -out {ca}.crt -days 2 -subj /CN=outbox-cdc-test-{ca} \
                 -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
            ),
        );
    }
    openssl(
        &d,
        &format!("req {EC} -keyout server.key -out server.csr -subj /CN=localhost"),
    );
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        &d,
        "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
         -out server.crt -days 2 -extfile server.ext",
    );
    (dir, d.join("ca.crt"), d.join("other-ca.crt"))
}

/// Gives the key to the server's OS user: PostgreSQL refuses a key that is
/// group/world readable or owned by someone else.
async fn hand_key_to_server(admin: &tokio_postgres::Client, dir: &Path) {
    let data_dir: String = admin
        .query_one("SHOW data_directory", &[])
        .await
        .unwrap()
        .get(0);
    let meta = std::fs::metadata(&data_dir).unwrap_or_else(|e| {
        panic!("the TLS test reads the owner of {data_dir} (the server must be local): {e}")
    });
    for f in ["server.key", "server.crt"] {
        let p = dir.join(f);
        std::os::unix::fs::chown(&p, Some(meta.uid()), Some(meta.gid())).unwrap_or_else(|e| {
            panic!(
                "chown {} to the server's user (uid {}) needs root or that user: {e}",
                p.display(),
                meta.uid()
            )
        });
    }
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
}

async fn set_ssl(admin: &tokio_postgres::Client, settings: &[String]) {
    // ALTER SYSTEM cannot share a multi-statement query.
    for sql in settings {
        admin
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
}

/// Waits until a new connection with sslmode=require succeeds (`on`) or
/// is told the server has no TLS (`!on`).
async fn wait_for_server_tls(t: &Target, on: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = t.with("sslmode=require").connect_sql().await;
        match (&r, on) {
            (Ok(_), true) | (Err(PgError::TlsUnsupported { .. }), false) => return,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            _ => panic!(
                "the server did not switch ssl {} after pg_reload_conf (see its log): last result {:?}",
                if on { "on" } else { "off" },
                r.err()
            ),
        }
    }
}

async fn ssl_in_use(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn tls_modes_against_the_server_with_a_test_certificate() {
    let _alone = common::alone().await;
    common::init_tracing();
    let admin = common::admin_client().await;
    assert!(
        !server_ssl_is(&admin).await,
        "the test server is expected to run without TLS"
    );
    let (dir, ca, other_ca) = make_certs();
    hand_key_to_server(&admin, dir.path()).await;
    let cert = dir.path().join("server.crt");
    let key = dir.path().join("server.key");
    set_ssl(
        &admin,
        &[
            format!(
                "ALTER SYSTEM SET ssl_cert_file = {}",
                q(&cert.display().to_string())
            ),
            format!(
                "ALTER SYSTEM SET ssl_key_file = {}",
                q(&key.display().to_string())
            ),
            "ALTER SYSTEM SET ssl = on".to_owned(),
        ],
    )
    .await;

    let t = target();
    let scenarios = tokio::spawn(async move {
        wait_for_server_tls(&t, true).await;
        let ca = q(&ca.display().to_string());
        let other_ca = q(&other_ca.display().to_string());

        // verify-full with the name in the certificate: both connections, and a stream.
        let full = t.kv(
            "localhost",
            Some(&t.password),
            &format!("sslmode=verify-full sslrootcert={ca}"),
        );
        assert_eq!(full.tls().mode, SslMode::VerifyFull);
        let client = full.connect_sql().await.expect("verify-full via localhost");
        assert!(ssl_in_use(&client).await);
        stream_over_tls(&full, &client).await;

        // verify-full with a name the certificate does not carry.
        let e = t
            .with(&format!("sslmode=verify-full sslrootcert={ca}"))
            .connect_sql()
            .await
            .expect_err("host name mismatch is refused");
        assert!(matches!(e, PgError::Tls { .. }), "{e:?}");
        assert_eq!(e.disposition(), Disposition::Stop);

        // verify-ca ignores the name but not the chain.
        let client = t
            .with(&format!("sslmode=verify-ca sslrootcert={ca}"))
            .connect_sql()
            .await
            .expect("verify-ca via 127.0.0.1");
        assert!(ssl_in_use(&client).await);
        let e = ReplicationConnection::connect(
            &t.with(&format!("sslmode=verify-ca sslrootcert={other_ca}")),
            "outbox-cdc-tls",
        )
        .await
        .err()
        .expect("an unknown CA is refused");
        assert!(matches!(e, PgError::Tls { .. }), "{e:?}");

        // require with sslrootcert verifies the chain as libpq does (review
        // A1): the right CA passes, another is refused, on both connections.
        let client = t
            .with(&format!("sslmode=require sslrootcert={ca}"))
            .connect_sql()
            .await
            .expect("require with the server's CA");
        assert!(ssl_in_use(&client).await);
        let wrong = t.with(&format!("sslmode=require sslrootcert={other_ca}"));
        let e = wrong
            .connect_sql()
            .await
            .expect_err("require with another CA is refused");
        assert!(matches!(e, PgError::Tls { .. }), "{e:?}");
        let e = ReplicationConnection::connect(&wrong, "outbox-cdc-tls")
            .await
            .err()
            .expect("require with another CA is refused (replication)");
        assert!(matches!(e, PgError::Tls { .. }), "{e:?}");

        // channel_binding=require: SCRAM-SHA-256-PLUS bound to the server's
        // certificate, on both connections (each refuses anything else).
        for mode in ["require", &format!("verify-ca sslrootcert={ca}")] {
            let cfg = t.with(&format!("sslmode={mode} channel_binding=require"));
            let client = cfg
                .connect_sql()
                .await
                .unwrap_or_else(|e| panic!("channel_binding=require, sslmode={mode}: {e}"));
            assert!(ssl_in_use(&client).await);
            let mut repl = ReplicationConnection::connect(&cfg, "outbox-cdc-cb")
                .await
                .unwrap_or_else(|e| panic!("replication channel_binding=require: {e}"));
            repl.identify_system().await.unwrap();
        }

        // require and prefer encrypt without checking; disable does not encrypt.
        for (mode, encrypted) in [("require", true), ("prefer", true), ("disable", false)] {
            let cfg = t.with(&format!("sslmode={mode}"));
            let client = cfg
                .connect_sql()
                .await
                .unwrap_or_else(|e| panic!("sslmode={mode}: {e}"));
            assert_eq!(ssl_in_use(&client).await, encrypted, "sslmode={mode}");
            let mut repl = ReplicationConnection::connect(&cfg, "outbox-cdc-tls")
                .await
                .unwrap_or_else(|e| panic!("replication sslmode={mode}: {e}"));
            repl.identify_system().await.unwrap();
        }
    })
    .await;

    set_ssl(
        &admin,
        &[
            "ALTER SYSTEM RESET ssl".to_owned(),
            "ALTER SYSTEM RESET ssl_cert_file".to_owned(),
            "ALTER SYSTEM RESET ssl_key_file".to_owned(),
        ],
    )
    .await;
    wait_for_server_tls(&target(), false).await;
    drop(dir);
    if let Err(e) = scenarios {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// START_REPLICATION over TLS: a transactional logical message arrives as
/// B, M, C (pgoutput with messages 'true').
async fn stream_over_tls(cfg: &PgConnectConfig, client: &tokio_postgres::Client) {
    let admin = common::admin_client().await;
    let slot = common::unique_name("tls_slot");
    let publication = common::unique_name("tls_pub");
    admin
        .batch_execute(&format!("CREATE PUBLICATION {}", quote_ident(&publication)))
        .await
        .unwrap();
    control::create_logical_slot(client, &slot).await.unwrap();
    let conn = ReplicationConnection::connect(cfg, "outbox-cdc-tls")
        .await
        .expect("replication over TLS");
    let mut stream = conn
        .start_logical(&slot, Lsn::ZERO, &publication, true)
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_logical_emit_message(true, 'outbox-cdc-tls', 'over tls')")
        .await
        .unwrap();
    let mut tags = Vec::new();
    let deadline = Instant::now() + WAIT;
    while tags.last() != Some(&b'C') {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, stream.recv())
            .await
            .expect("data in time")
            .unwrap()
            .unwrap();
        if let ReplicationEvent::XLogData { data, .. } = ev {
            let mut d = data.clone();
            tags.push(d.get_u8());
        }
    }
    assert_eq!(tags, b"BMC");
    stream.shutdown().await.expect("clean shutdown over TLS");
    let deadline = Instant::now() + WAIT;
    loop {
        match control::drop_slot(client, &slot).await {
            Ok(()) => break,
            Err(PgError::SlotActive { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("drop slot: {e}"),
        }
    }
    admin
        .batch_execute(&format!("DROP PUBLICATION {}", quote_ident(&publication)))
        .await
        .unwrap();
}
