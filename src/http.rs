//! A minimal HTTP/1.1 endpoint for `/metrics`, `/health/live` and
//! `/health/ready` (with `/healthz` and `/readyz`, their older names, as
//! aliases), and the matching client `status` uses to read a running
//! connector.
//!
//! `/health/ready` names reasons and causes only: it answers anyone who
//! reaches `http.listen`. The messages (hosts, users, aggregates, event ids,
//! error texts) are served at `/health/ready/detail` to a client on this host
//! alone (loopback, or the address the connection came in on), which is
//! where `outbox-cdc status` runs.
//!
//! Only GET of a few fixed paths, one request per connection, a request head
//! read whole (however it is segmented) up to a bound: small enough that a
//! framework would add more than it saves.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::metrics::Metrics;

/// Largest response body [`get`] accepts.
const MAX_RESPONSE_BYTES: u64 = 4 * 1024 * 1024;

/// Why [`get`] got no body.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("http.listen = {listen:?} is not an IP:port address")]
    Address { listen: String },
    #[error("GET http://{addr}{path}: {source}")]
    Io {
        addr: SocketAddr,
        path: String,
        source: std::io::Error,
    },
    #[error("GET http://{addr}{path}: no answer within {timeout:?}")]
    Timeout {
        addr: SocketAddr,
        path: String,
        timeout: Duration,
    },
    #[error("GET http://{addr}{path}: {status}")]
    Status {
        addr: SocketAddr,
        path: String,
        status: String,
    },
}

/// Where a client on this host reaches a server listening on `listen`: an
/// unspecified address (`0.0.0.0`, `::`) is reached on loopback.
pub fn client_address(listen: &str) -> Result<SocketAddr, HttpError> {
    let mut addr: SocketAddr = listen.parse().map_err(|_| HttpError::Address {
        listen: listen.to_owned(),
    })?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    Ok(addr)
}

/// `GET path` with `Connection: close`; the body of a 200 answer.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, HttpError> {
    let (status, body) = get_any(addr, path, timeout).await?;
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(HttpError::Status {
            addr,
            path: path.to_owned(),
            status,
        });
    }
    Ok(body)
}

/// `GET path` with `Connection: close`: the status line and the body,
/// whatever the status (`/health/ready` explains a 503 in its body).
pub async fn get_any(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(String, String), HttpError> {
    let request = async {
        let mut socket = tokio::net::TcpStream::connect(addr).await?;
        let head = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        socket.write_all(head.as_bytes()).await?;
        let mut raw = Vec::new();
        socket
            .take(MAX_RESPONSE_BYTES)
            .read_to_end(&mut raw)
            .await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| HttpError::Timeout {
            addr,
            path: path.to_owned(),
            timeout,
        })?
        .map_err(|source| HttpError::Io {
            addr,
            path: path.to_owned(),
            source,
        })?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = match head.lines().next().unwrap_or_default() {
        "" => "empty answer".to_owned(),
        line => line.to_owned(),
    };
    Ok((status, body.to_owned()))
}

/// Starts serving on `listen` ("" disables). Returns the task, which runs until aborted.
pub async fn serve(listen: &str, metrics: Arc<Metrics>) -> std::io::Result<Option<JoinHandle<()>>> {
    if listen.is_empty() {
        return Ok(None);
    }
    let listener = TcpListener::bind(listen).await?;
    Ok(Some(tokio::spawn(async move {
        loop {
            let Ok((mut socket, peer)) = listener.accept().await else {
                continue;
            };
            let this_host = socket
                .local_addr()
                .is_ok_and(|local| same_host(peer.ip(), local.ip()));
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let read = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut socket)).await;
                let (status, content_type, body) = match read {
                    Ok(Ok(Head::Complete(head))) => respond(&head, &metrics, this_host),
                    Ok(Ok(Head::TooLarge)) => (
                        "431 Request Header Fields Too Large",
                        "text/plain",
                        format!("request head over {MAX_REQUEST_HEAD} bytes\n"),
                    ),
                    // Closed before a whole head, a read error, or too slow.
                    Ok(Ok(Head::Closed)) | Ok(Err(_)) | Err(_) => return,
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                if let Err(e) = socket.write_all(head.as_bytes()).await {
                    debug!(error = %e, "http write failed");
                    return;
                }
                let _ = socket.write_all(body.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    })))
}

/// Whether a connection from `peer` to `local` comes from this host: from
/// loopback, or from the very address it reached (a connection to a
/// specific address of this host). Anything else, a container's gateway or
/// another pod, is remote.
fn same_host(peer: IpAddr, local: IpAddr) -> bool {
    let peer = peer.to_canonical();
    peer.is_loopback() || peer == local.to_canonical()
}

/// Largest request head (request line and headers) the server reads.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What a client sent before the blank line that ends an HTTP request head.
enum Head {
    Complete(Vec<u8>),
    TooLarge,
    Closed,
}

/// Reads up to the end of the request head (`\r\n\r\n`, or `\n\n` from a
/// lenient client), however many segments it arrives in.
async fn read_head<R: tokio::io::AsyncRead + Unpin>(socket: &mut R) -> std::io::Result<Head> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        // Search from just before the new bytes: the terminator may straddle reads.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        let tail = &head[from..];
        let ended =
            tail.windows(4).any(|w| w == b"\r\n\r\n") || tail.windows(2).any(|w| w == b"\n\n");
        if head.len() > MAX_REQUEST_HEAD {
            return Ok(Head::TooLarge);
        }
        if ended {
            return Ok(Head::Complete(head));
        }
    }
}

/// The answer to `request`; `this_host`: the client runs on this host (see
/// [`same_host`]), the only one shown readiness details.
fn respond(
    request: &[u8],
    metrics: &Metrics,
    this_host: bool,
) -> (&'static str, &'static str, String) {
    let line = request
        .split(|b| *b == b'\r' || *b == b'\n')
        .next()
        .unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return ("405 Method Not Allowed", "text/plain", "only GET\n".into());
    }
    const JSON: &str = "application/json";
    match path {
        "/metrics" => {
            // The readiness gauges as of this scrape.
            crate::health::readiness(metrics);
            ("200 OK", "text/plain; version=0.0.4", metrics.render())
        }
        "/health/live" | "/healthz" => ("200 OK", JSON, "{\"live\":true}\n".into()),
        "/health/ready" | "/readyz" | "/health/ready/detail" => {
            let detail = path == "/health/ready/detail";
            if detail && !this_host {
                return (
                    "403 Forbidden",
                    "text/plain",
                    "readiness details are shown on the connector's host only: run \
                     `outbox-cdc status` there, or read the log\n"
                        .into(),
                );
            }
            let readiness = crate::health::readiness(metrics);
            let status = if readiness.ready {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let shown = if detail {
                readiness
            } else {
                readiness.public()
            };
            let mut body = serde_json::to_string_pretty(&shown).unwrap_or_default();
            body.push('\n');
            (status, JSON, body)
        }
        _ => ("404 Not Found", "text/plain", "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let m = Metrics::default();
        assert_eq!(
            respond(b"GET /healthz HTTP/1.1\r\n\r\n", &m, false).0,
            "200 OK"
        );
        assert_eq!(
            respond(b"GET /readyz HTTP/1.1\r\n\r\n", &m, false).0,
            "503 Service Unavailable"
        );
        m.set_connected(true);
        // Streaming, but Kafka has not answered the probe yet.
        let (status, _, body) = respond(b"GET /health/ready HTTP/1.1\r\n\r\n", &m, false);
        assert_eq!(status, "503 Service Unavailable");
        let r: crate::health::Readiness = serde_json::from_str(&body).unwrap();
        assert!(!r.ready && r.reason("streaming").unwrap().ok, "{body}");
        assert!(!r.reason("kafka_reachable").unwrap().ok, "{body}");
        m.health.kafka_reached();
        for ready in ["/readyz", "/health/ready"] {
            let (status, content_type, body) = respond(
                format!("GET {ready} HTTP/1.1\r\n\r\n").as_bytes(),
                &m,
                false,
            );
            assert_eq!(
                (status, content_type),
                ("200 OK", "application/json"),
                "{ready}"
            );
            let r: crate::health::Readiness = serde_json::from_str(&body).unwrap();
            assert!(
                r.ready && r.reasons.len() == crate::health::REASONS.len(),
                "{body}"
            );
        }
        for live in ["/healthz", "/health/live"] {
            let request = format!("GET {live} HTTP/1.1\r\n\r\n");
            assert_eq!(respond(request.as_bytes(), &m, false).0, "200 OK", "{live}");
        }
        let (status, _, body) = respond(b"GET /metrics HTTP/1.1\r\n\r\n", &m, false);
        assert_eq!(status, "200 OK");
        assert!(body.contains("outbox_cdc_connected 1"));
        assert!(body.contains("outbox_cdc_ready 1\n"), "{body}");
        assert!(
            body.contains("outbox_cdc_ready_reason{reason=\"kafka_reachable\"} 1\n"),
            "{body}"
        );
        assert_eq!(
            respond(b"POST /metrics HTTP/1.1\r\n\r\n", &m, false).0,
            "405 Method Not Allowed"
        );
        assert_eq!(
            respond(b"GET /nope HTTP/1.1\r\n\r\n", &m, false).0,
            "404 Not Found"
        );
        assert_eq!(respond(b"", &m, false).0, "405 Method Not Allowed");
    }

    /// H5: `/health/ready` answers whoever reaches http.listen (0.0.0.0 in
    /// the docker and kubernetes configs): reason names only, never the
    /// details (hosts, users, aggregate and event ids, error texts), which
    /// the log and `outbox-cdc status` show.
    #[test]
    fn readiness_names_reasons_without_details() {
        let m = Metrics::default();
        m.health.configure(
            &crate::health::HealthSettings {
                max_gap_open_ms: 0,
                ..Default::default()
            },
            "orders_slot",
        );
        let ended = crate::pipeline::PipelineError::Pg(crate::pg::PgError::Config {
            key: "host".into(),
            message: "postgres://outbox@db.internal:5432/app: event 7f3c9a refused".into(),
        });
        m.health
            .session_ended(ended.slot_holder(), ended.to_string());
        m.health.kafka_unreachable(
            "kafka-1.internal:9093/1: SASL authentication failed for relay".into(),
        );
        m.health
            .gap_opened("order", "customer-42", 1, 5, crate::pg::Lsn::new(16));
        std::thread::sleep(Duration::from_millis(5));
        for path in ["/health/ready", "/readyz"] {
            let (status, _, body) =
                respond(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes(), &m, false);
            assert_eq!(status, "503 Service Unavailable");
            for detail in [
                "db.internal",
                "outbox@",
                "7f3c9a",
                "kafka-1",
                "relay",
                "customer-42",
                "orders_slot",
            ] {
                assert!(!body.contains(detail), "{path} shows {detail}: {body}");
            }
            let r: crate::health::Readiness = serde_json::from_str(&body).unwrap();
            let causes: Vec<(&str, Option<&str>)> = r
                .reasons
                .iter()
                .map(|r| (r.name.as_str(), r.cause.as_deref()))
                .collect();
            assert_eq!(
                causes,
                [
                    ("streaming", Some("session_error")),
                    ("kafka_reachable", Some("kafka_unreachable")),
                    ("acknowledging", None),
                    ("sequence_gaps", Some("sequence_gap_open")),
                    ("reconciled", None),
                ]
            );
        }
        // The details: for `outbox-cdc status` on this host, for nobody else.
        let detail = b"GET /health/ready/detail HTTP/1.1\r\n\r\n";
        let (status, _, body) = respond(detail, &m, false);
        assert_eq!(status, "403 Forbidden", "{body}");
        assert!(!body.contains("db.internal"), "{body}");
        let (status, _, body) = respond(detail, &m, true);
        assert_eq!(status, "503 Service Unavailable");
        let r: crate::health::Readiness = serde_json::from_str(&body).unwrap();
        let streaming = &r.reason("streaming").unwrap().message;
        assert!(streaming.contains("db.internal:5432"), "{body}");
        let gaps = &r.reason("sequence_gaps").unwrap().message;
        assert!(gaps.contains("order/customer-42"), "{body}");
    }

    #[test]
    fn only_this_host_is_this_host() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(same_host(ip("127.0.0.1"), ip("0.0.0.0")));
        assert!(same_host(ip("::1"), ip("::")));
        assert!(same_host(ip("::ffff:127.0.0.1"), ip("::")));
        assert!(same_host(ip("10.0.0.5"), ip("10.0.0.5")));
        assert!(same_host(ip("::ffff:10.0.0.5"), ip("10.0.0.5")));
        assert!(!same_host(ip("172.17.0.1"), ip("172.17.0.2")));
        assert!(!same_host(ip("10.0.0.6"), ip("10.0.0.5")));
    }

    #[tokio::test]
    async fn a_request_head_split_over_segments_is_read_whole() {
        let m = Arc::new(Metrics::default());
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let server = serve(&addr.to_string(), m).await.unwrap().unwrap();
        let exchange = async |parts: &[&[u8]]| {
            let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
            socket.set_nodelay(true).unwrap();
            for part in parts {
                socket.write_all(part).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut answer = String::new();
            socket.read_to_string(&mut answer).await.unwrap();
            answer
        };
        let answer = exchange(&[b"GE", b"T /heal", b"thz HTTP/1.1\r\nHost: x\r", b"\n\r\n"]).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.ends_with("{\"live\":true}\n"), "{answer}");
        let huge = format!(
            "GET /healthz HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(9000)
        );
        let answer = exchange(&[huge.as_bytes()]).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        server.abort();
    }

    #[test]
    fn clients_reach_wildcard_listeners_on_loopback() {
        assert_eq!(
            client_address("0.0.0.0:9187").unwrap(),
            "127.0.0.1:9187".parse().unwrap()
        );
        assert_eq!(
            client_address("[::]:9187").unwrap(),
            "[::1]:9187".parse().unwrap()
        );
        assert_eq!(
            client_address("127.0.0.2:1").unwrap(),
            "127.0.0.2:1".parse().unwrap()
        );
        assert!(matches!(
            client_address("localhost:1"),
            Err(HttpError::Address { .. })
        ));
    }

    #[tokio::test]
    async fn the_client_reads_what_the_server_serves() {
        let m = Arc::new(Metrics::default());
        m.set_connected(true);
        m.health.kafka_reached();
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let server = serve(&addr.to_string(), m.clone()).await.unwrap().unwrap();
        let body = get(addr, "/metrics", Duration::from_secs(5)).await.unwrap();
        assert!(body.contains("outbox_cdc_connected 1\n"), "{body}");
        let ready = get(addr, "/readyz", Duration::from_secs(5)).await.unwrap();
        assert!(ready.contains("\"ready\": true"), "{ready}");
        m.set_connected(false);
        let (status, body) = get_any(addr, "/health/ready", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(status.contains("503"), "{status}");
        assert!(body.contains("\"cause\": \"starting\""), "{body}");
        assert!(!body.contains("not streaming yet"), "{body}");
        // The client is on this host: it is shown the details.
        let (status, body) = get_any(addr, "/health/ready/detail", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(status.contains("503"), "{status}");
        assert!(body.contains("not streaming yet"), "{body}");
        let missing = get(addr, "/nope", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(&missing, HttpError::Status { status, .. } if status.contains("404")),
            "{missing}"
        );
        server.abort();
        let _ = server.await;
        let refused = get(addr, "/metrics", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(refused, HttpError::Io { .. }), "{refused}");
    }
}
