//! Audit 2026-12-02 F4 (issue 29): a man in the middle who answers the login
//! with AuthenticationSASL and then asks for the password in clear (or md5)
//! gets nothing, on either connection (replication transport and the
//! tokio-postgres control client).
//!
//! The man in the middle is an in-test server on 127.0.0.1 with TLS and a
//! throwaway self-signed certificate, which sslmode=require does not verify:
//! the case `channel_binding=require` exists for. It offers
//! SCRAM-SHA-256-PLUS, so the client binds, and records every message the
//! client sends after the startup packet. Needs no test servers.

use crate::common;
use common::fake_pg::{backend, openssl};

use std::sync::Arc;
use std::time::Duration;

use outbox_cdc::Disposition;
use outbox_cdc::pg::{PgConnectConfig, PgError, ReplicationConnection};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const PASSWORD: &str = "f4-secret-password";

/// The audit's settings, and the defaults (which refuse the same: a server
/// never changes method mid-login).
const SETTINGS: [&str; 2] = [
    "sslmode=require channel_binding=require require_auth=scram-sha-256",
    "sslmode=require",
];

/// Where in the SCRAM exchange the man in the middle switches method.
#[derive(Clone, Copy, Debug)]
enum When {
    /// Right after the client-first message (SASLInitialResponse).
    AfterSaslStart,
    /// After SASLContinue and the client's proof (SASLResponse).
    AfterClientProof,
}

#[derive(Clone, Copy, Debug)]
enum Connection {
    Replication,
    Control,
}

/// An acceptor for a fresh self-signed ECDSA P-256 certificate (signed with
/// SHA-256, so the client has `tls-server-end-point` data).
fn tls_acceptor() -> (tempfile::TempDir, TlsAcceptor) {
    let dir = tempfile::tempdir().unwrap();
    openssl(
        dir.path(),
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
         -keyout key.pem -out cert.pem -days 2 -subj /CN=outbox-cdc-mitm",
    );
    let cert = std::fs::read(dir.path().join("cert.pem")).unwrap();
    let key = std::fs::read(dir.path().join("key.pem")).unwrap();
    let certs = rustls_pemfile::certs(&mut &cert[..])
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pemfile::private_key(&mut &key[..])
        .unwrap()
        .expect("a private key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    (dir, TlsAcceptor::from(Arc::new(config)))
}

fn auth_request(code: i32, rest: &[u8]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    body.extend_from_slice(rest);
    backend(b'R', &body)
}

/// One frontend message, or `None` once the client closed the connection.
async fn read_message(sock: &mut (impl AsyncRead + Unpin)) -> Option<(u8, Vec<u8>)> {
    let tag = sock.read_u8().await.ok()?;
    let len = sock.read_i32().await.ok()? as usize;
    let mut body = vec![0u8; len.checked_sub(4)?];
    sock.read_exact(&mut body).await.ok()?;
    Some((tag, body))
}

/// Plays the man in the middle for one login: TLS, AuthenticationSASL
/// offering SCRAM-SHA-256-PLUS, then at `when` the `downgrade` request
/// (an Authentication body). Returns every message the client sent after
/// the startup packet.
async fn mitm(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    when: When,
    downgrade: Vec<u8>,
) -> Vec<(u8, Vec<u8>)> {
    let (mut tcp, _) = listener.accept().await.unwrap();
    let (len, code) = (tcp.read_i32().await.unwrap(), tcp.read_i32().await.unwrap());
    assert_eq!((len, code), (8, 80877103), "SSLRequest first");
    tcp.write_all(b"S").await.unwrap();
    let mut sock = acceptor.accept(tcp).await.unwrap();
    let len = sock.read_i32().await.unwrap() as usize;
    let mut startup = vec![0u8; len - 4];
    sock.read_exact(&mut startup).await.unwrap();
    sock.write_all(&auth_request(10, b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"))
        .await
        .unwrap();
    let mut sent = Vec::new();
    let first = read_message(&mut sock)
        .await
        .expect("a client-first message");
    sent.push(first.clone());
    if let When::AfterClientProof = when {
        let text = String::from_utf8_lossy(&first.1).into_owned();
        // The nonce is any printable character but ',': it may hold "r=",
        // so it is what follows the first ",r=" (after "n=").
        let nonce = text.split_once(",r=").expect("a client nonce").1.to_owned();
        let server_first = format!("r={nonce}mitm,s=c2FsdHNhbHQ=,i=4096");
        sock.write_all(&auth_request(11, server_first.as_bytes()))
            .await
            .unwrap();
        sent.push(
            read_message(&mut sock)
                .await
                .expect("a client-final message"),
        );
    }
    sock.write_all(&backend(b'R', &downgrade)).await.unwrap();
    // The client must close; an answer is recorded (and ends the login, so
    // that a client that answers and then waits does not hang the test).
    if let Ok(Some(answer)) =
        tokio::time::timeout(Duration::from_secs(20), read_message(&mut sock)).await
    {
        sent.push(answer);
    }
    sent
}

async fn login(
    acceptor: &TlsAcceptor,
    settings: &str,
    when: When,
    downgrade: &[u8],
    connection: Connection,
) -> (PgError, Vec<(u8, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(mitm(listener, acceptor.clone(), when, downgrade.to_vec()));
    let cfg = PgConnectConfig::parse_with_env(
        &format!(
            "host=127.0.0.1 port={port} user=u password={PASSWORD} dbname=app connect_timeout=30 {settings}"
        ),
        |_| None,
    )
    .unwrap();
    let refused = match connection {
        Connection::Replication => ReplicationConnection::connect(&cfg, "f4-mitm").await.err(),
        Connection::Control => cfg.connect_sql().await.err(),
    };
    let sent = server.await.unwrap();
    let case = format!("{connection:?} [{settings}] {when:?}");
    (refused.unwrap_or_else(|| panic!("{case}: logged in")), sent)
}

#[tokio::test]
async fn sasl_then_a_password_request_gets_no_password_on_either_connection() {
    common::init_tracing();
    let (_dir, acceptor) = tls_acceptor();
    let cleartext = 3i32.to_be_bytes().to_vec();
    let mut md5 = 5i32.to_be_bytes().to_vec();
    md5.extend_from_slice(&[1, 2, 3, 4]);
    let downgrades = [
        (cleartext, "AuthenticationCleartextPassword"),
        (md5, "AuthenticationMD5Password"),
    ];
    for settings in SETTINGS {
        for when in [When::AfterSaslStart, When::AfterClientProof] {
            for (downgrade, request) in &downgrades {
                for connection in [Connection::Replication, Connection::Control] {
                    let case = format!("{connection:?} [{settings}] {request} {when:?}");
                    let (e, sent) = login(&acceptor, settings, when, downgrade, connection).await;
                    for (tag, body) in &sent {
                        let text = String::from_utf8_lossy(body);
                        assert!(
                            !text.contains(PASSWORD) && !text.starts_with("md5"),
                            "{case}: the client sent the password: {:?} {text:?}",
                            *tag as char
                        );
                    }
                    // Only SCRAM messages, bound to the TLS channel.
                    let scram: &[&[u8]] = match when {
                        When::AfterSaslStart => &[b"SCRAM-SHA-256-PLUS\0"],
                        When::AfterClientProof => &[b"SCRAM-SHA-256-PLUS\0", b"c=cD10bHMt"],
                    };
                    assert_eq!(sent.len(), scram.len(), "{case}: {sent:?}");
                    for ((tag, body), prefix) in sent.iter().zip(scram) {
                        assert!(*tag == b'p' && body.starts_with(prefix), "{case}: {sent:?}");
                    }
                    assert!(
                        matches!(e, PgError::Auth { code: None, .. }),
                        "{case}: {e:?}"
                    );
                    assert_eq!(e.disposition(), Disposition::Stop, "{case}");
                    if let Connection::Replication = connection {
                        let msg = e.to_string();
                        assert!(
                            msg.contains(request) && msg.contains("man in the middle"),
                            "{case}: {msg}"
                        );
                        if settings.contains("require_auth") {
                            assert!(msg.contains("require_auth=scram-sha-256"), "{case}: {msg}");
                        }
                    }
                }
            }
        }
    }
}
