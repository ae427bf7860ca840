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
//! Served by hyper (HTTP/1.1, one request per connection), with the bounds a
//! port anyone can reach needs: a connection cap that evicts idle clients
//! first, a time limit on the request head and on the whole exchange, and a
//! pause after a failed accept (see [`serve`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::{AbortHandle, JoinHandle};
use tracing::{debug, warn};

use crate::config::HttpSettings;
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

/// Starts serving `settings.listen` ("" disables). Returns the task, which
/// runs until aborted.
///
/// Bounds (issue 50, H2): at most `http.max_connections` connections are
/// open; a new one beyond it closes the oldest that has not sent a whole
/// request head yet (an idle or slow client), or is itself closed when every
/// open connection is being answered. A request head must arrive within
/// [`REQUEST_TIMEOUT`], and a whole exchange (a client that stops reading
/// included) ends within [`CONNECTION_TIMEOUT`]. An accept error (out of
/// file descriptors) waits [`ACCEPT_BACKOFF`] instead of spinning.
pub async fn serve(
    settings: &HttpSettings,
    metrics: Arc<Metrics>,
) -> std::io::Result<Option<JoinHandle<()>>> {
    if settings.listen.is_empty() {
        return Ok(None);
    }
    let listener = TcpListener::bind(&settings.listen).await?;
    let connections = Arc::new(Connections::new(settings.max_connections));
    Ok(Some(accept_loop(listener, connections, metrics)))
}

/// Accepts connections on `listener` until aborted (see [`serve`]).
fn accept_loop(
    listener: TcpListener,
    connections: Arc<Connections>,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut said_accept_error = false;
        loop {
            let (socket, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    if !said_accept_error {
                        warn!(error = %e, "http: accepting a connection failed; waiting before the next");
                        said_accept_error = true;
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            said_accept_error = false;
            let Some(id) = connections.admit() else {
                debug!(%peer, "http: every connection is being answered; closing a new one");
                continue;
            };
            let this_host = socket
                .local_addr()
                .is_ok_and(|local| same_host(peer.ip(), local.ip()));
            let task = tokio::spawn(answer(
                socket,
                this_host,
                metrics.clone(),
                connections.clone(),
                id,
            ));
            connections.started(id, task.abort_handle());
        }
    })
}

/// Serves one connection: one request, then closed.
async fn answer(
    socket: tokio::net::TcpStream,
    this_host: bool,
    metrics: Arc<Metrics>,
    connections: Arc<Connections>,
    id: u64,
) {
    let service = {
        let connections = connections.clone();
        service_fn(move |request: Request<Incoming>| {
            // A whole head arrived: no longer an idle connection to evict.
            connections.answering(id);
            let (status, content_type, body) = respond(
                request.method().as_str(),
                request.uri().path(),
                &metrics,
                this_host,
            );
            let response = Response::builder()
                .status(status)
                .header(CONTENT_TYPE, content_type)
                .body(Full::new(Bytes::from(body)));
            std::future::ready(response)
        })
    };
    let connection = http1::Builder::new()
        .keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .max_buf_size(MAX_REQUEST_HEAD)
        .serve_connection(TokioIo::new(socket), service);
    match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(error = %e, "http connection ended with an error"),
        Err(_) => debug!("http connection closed after {CONNECTION_TIMEOUT:?}"),
    }
    connections.ended(id);
}

/// The open connections, oldest first, each with whether it is still
/// waiting for its request head (so may be evicted).
struct Connections {
    max: usize,
    open: Mutex<ConnectionList>,
}

#[derive(Default)]
struct ConnectionList {
    next_id: u64,
    /// Connection id, its task (once spawned), and whether its head arrived.
    entries: std::collections::VecDeque<(u64, Option<AbortHandle>, bool)>,
}

impl Connections {
    fn new(max: usize) -> Connections {
        Connections {
            max: max.max(1),
            open: Mutex::default(),
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, ConnectionList> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Room for one more connection: its id, after closing the oldest one
    /// still waiting for its head when full; `None` when every open one is
    /// being answered.
    fn admit(&self) -> Option<u64> {
        let mut list = self.list();
        if list.entries.len() >= self.max {
            let idle = list
                .entries
                .iter()
                .position(|(_, _, answering)| !answering)?;
            if let Some((_, Some(task), _)) = list.entries.remove(idle) {
                task.abort();
            }
        }
        list.next_id += 1;
        let id = list.next_id;
        list.entries.push_back((id, None, false));
        Some(id)
    }

    fn started(&self, id: u64, task: AbortHandle) {
        let mut list = self.list();
        match list.entries.iter_mut().find(|(i, _, _)| *i == id) {
            Some(entry) => entry.1 = Some(task),
            // Ended (or evicted) before it was registered.
            None => task.abort(),
        }
    }

    fn answering(&self, id: u64) {
        if let Some(entry) = self.list().entries.iter_mut().find(|(i, _, _)| *i == id) {
            entry.2 = true;
        }
    }

    fn ended(&self, id: u64) {
        self.list().entries.retain(|(i, _, _)| *i != id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.list().entries.len()
    }
}

/// Whether a connection from `peer` to `local` comes from this host: from
/// loopback, or from the very address it reached (a connection to a
/// specific address of this host). Anything else, a container's gateway or
/// another pod, is remote.
fn same_host(peer: IpAddr, local: IpAddr) -> bool {
    let peer = peer.to_canonical();
    peer.is_loopback() || peer == local.to_canonical()
}

/// Largest request head (request line and headers) the server reads
/// (hyper's smallest read buffer).
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may last, answer written included.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// The wait after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The answer to `method path`: status, content type and body;
/// `this_host`: the client runs on this host (see [`same_host`]), the only
/// one shown readiness details.
fn respond(
    method: &str,
    path: &str,
    metrics: &Metrics,
    this_host: bool,
) -> (StatusCode, &'static str, String) {
    if method != "GET" {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
    }
    const JSON: &str = "application/json";
    match path {
        "/metrics" => {
            // The readiness gauges as of this scrape.
            crate::health::readiness(metrics);
            (
                StatusCode::OK,
                "text/plain; version=0.0.4",
                metrics.render(),
            )
        }
        "/health/live" | "/healthz" => (StatusCode::OK, JSON, "{\"live\":true}\n".into()),
        "/health/ready" | "/readyz" | "/health/ready/detail" => {
            let detail = path == "/health/ready/detail";
            if detail && !this_host {
                return (
                    StatusCode::FORBIDDEN,
                    "text/plain",
                    "readiness details are shown on the connector's host only: run \
                     `outbox-cdc status` there, or read the log\n"
                        .into(),
                );
            }
            let readiness = crate::health::readiness(metrics);
            let status = match readiness.ready {
                true => StatusCode::OK,
                false => StatusCode::SERVICE_UNAVAILABLE,
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
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`respond`] to a raw request's first line; the status as its line
    /// reads ("200 OK").
    fn route(request: &[u8], m: &Metrics, this_host: bool) -> (String, &'static str, String) {
        let line = request
            .split(|b| *b == b'\r' || *b == b'\n')
            .next()
            .unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut parts = line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (status, content_type, body) = respond(method, path, m, this_host);
        let status = format!(
            "{} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
        (status, content_type, body)
    }

    fn settings(addr: SocketAddr, max_connections: usize) -> HttpSettings {
        HttpSettings {
            listen: addr.to_string(),
            max_connections,
        }
    }

    fn free_address() -> SocketAddr {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    }

    #[test]
    fn routes() {
        let m = Metrics::default();
        assert_eq!(
            route(b"GET /healthz HTTP/1.1\r\n\r\n", &m, false).0,
            "200 OK"
        );
        assert_eq!(
            route(b"GET /readyz HTTP/1.1\r\n\r\n", &m, false).0,
            "503 Service Unavailable"
        );
        m.set_connected(true);
        // Streaming, but Kafka has not answered the probe yet.
        let (status, _, body) = route(b"GET /health/ready HTTP/1.1\r\n\r\n", &m, false);
        assert_eq!(status, "503 Service Unavailable");
        let r: crate::health::Readiness = serde_json::from_str(&body).unwrap();
        assert!(!r.ready && r.reason("streaming").unwrap().ok, "{body}");
        assert!(!r.reason("kafka_reachable").unwrap().ok, "{body}");
        m.health.kafka_reached();
        for ready in ["/readyz", "/health/ready"] {
            let (status, content_type, body) = route(
                format!("GET {ready} HTTP/1.1\r\n\r\n").as_bytes(),
                &m,
                false,
            );
            assert_eq!(
                (status.as_str(), content_type),
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
            assert_eq!(route(request.as_bytes(), &m, false).0, "200 OK", "{live}");
        }
        let (status, _, body) = route(b"GET /metrics HTTP/1.1\r\n\r\n", &m, false);
        assert_eq!(status, "200 OK");
        assert!(body.contains("outbox_cdc_connected 1"));
        assert!(body.contains("outbox_cdc_ready 1\n"), "{body}");
        assert!(
            body.contains("outbox_cdc_ready_reason{reason=\"kafka_reachable\"} 1\n"),
            "{body}"
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n", &m, false).0,
            "405 Method Not Allowed"
        );
        assert_eq!(
            route(b"GET /nope HTTP/1.1\r\n\r\n", &m, false).0,
            "404 Not Found"
        );
        assert_eq!(route(b"", &m, false).0, "405 Method Not Allowed");
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
            .session_ended(ended.slot_holder(), ended.disk_full(), ended.to_string());
        m.health.kafka_unreachable(
            "kafka-1.internal:9093/1: SASL authentication failed for relay".into(),
        );
        m.health
            .gap_opened("order", "customer-42", 1, 5, crate::pg::Lsn::new(16));
        std::thread::sleep(Duration::from_millis(5));
        for path in ["/health/ready", "/readyz"] {
            let (status, _, body) =
                route(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes(), &m, false);
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
        let (status, _, body) = route(detail, &m, false);
        assert_eq!(status, "403 Forbidden", "{body}");
        assert!(!body.contains("db.internal"), "{body}");
        let (status, _, body) = route(detail, &m, true);
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
        let addr = free_address();
        let server = serve(&settings(addr, 8), m).await.unwrap().unwrap();
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
        let addr = free_address();
        let server = serve(&settings(addr, 8), m.clone()).await.unwrap().unwrap();
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

    /// H2: a port anyone can reach stays answerable and bounded while
    /// hundreds of clients connect and say nothing, or send their request
    /// a byte at a time: the oldest of those are closed to make room, and a
    /// real request is answered at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_and_slow_clients_neither_starve_nor_exhaust_the_server() {
        const CAP: usize = 32;
        let m = Arc::new(Metrics::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(Connections::new(CAP));
        let server = accept_loop(listener, connections.clone(), m);
        let mut idle = Vec::new();
        for _ in 0..600 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let mut slow = Vec::new();
        for _ in 0..20 {
            let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
            socket.write_all(b"GE").await.unwrap();
            slow.push(socket);
        }
        let started = std::time::Instant::now();
        let body = get(addr, "/health/live", Duration::from_secs(1))
            .await
            .expect("answered within a second");
        assert!(body.contains("\"live\":true"), "{body}");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(
            connections.len() <= CAP,
            "{} connections open, over the cap of {CAP}",
            connections.len()
        );
        // The first idle clients were closed to make room (end of stream).
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(1), idle[0].read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        server.abort();
    }

    #[test]
    fn a_full_house_closes_the_oldest_idle_connection_first() {
        let c = Connections::new(2);
        let (a, b) = (c.admit().unwrap(), c.admit().unwrap());
        c.answering(a);
        // Full: b, still waiting for its head, makes room for the third.
        let third = c.admit().unwrap();
        assert_eq!(c.len(), 2);
        c.answering(third);
        // Every open connection is being answered: a new one is refused.
        assert_eq!(c.admit(), None);
        c.ended(a);
        assert!(c.admit().is_some());
        let _ = b;
    }
}
