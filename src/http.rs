//! A minimal HTTP/1.1 endpoint for `/metrics`, `/healthz` and `/readyz`.
//!
//! Only GET of three fixed paths, one request per connection, bounded request
//! size: small enough that a framework would add more than it saves.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::metrics::Metrics;

/// Starts serving on `listen` ("" disables). Returns the task, which runs until aborted.
pub async fn serve(listen: &str, metrics: Arc<Metrics>) -> std::io::Result<Option<JoinHandle<()>>> {
    if listen.is_empty() {
        return Ok(None);
    }
    let listener = TcpListener::bind(listen).await?;
    Ok(Some(tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let read = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await;
                let Ok(Ok(n)) = read else { return };
                let (status, content_type, body) = respond(&buf[..n], &metrics);
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

fn respond(request: &[u8], metrics: &Metrics) -> (&'static str, &'static str, String) {
    let line = request.split(|b| *b == b'\r' || *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return ("405 Method Not Allowed", "text/plain", "only GET\n".into());
    }
    match path {
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
        "/healthz" => ("200 OK", "text/plain", "ok\n".into()),
        "/readyz" if metrics.connected.load(Ordering::Relaxed) == 1 => ("200 OK", "text/plain", "streaming\n".into()),
        "/readyz" => ("503 Service Unavailable", "text/plain", "not streaming\n".into()),
        _ => ("404 Not Found", "text/plain", "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let m = Metrics::default();
        assert_eq!(respond(b"GET /healthz HTTP/1.1\r\n\r\n", &m).0, "200 OK");
        assert_eq!(respond(b"GET /readyz HTTP/1.1\r\n\r\n", &m).0, "503 Service Unavailable");
        m.connected.store(1, Ordering::Relaxed);
        assert_eq!(respond(b"GET /readyz HTTP/1.1\r\n\r\n", &m).0, "200 OK");
        let (status, _, body) = respond(b"GET /metrics HTTP/1.1\r\n\r\n", &m);
        assert_eq!(status, "200 OK");
        assert!(body.contains("outbox_cdc_connected 1"));
        assert_eq!(respond(b"POST /metrics HTTP/1.1\r\n\r\n", &m).0, "405 Method Not Allowed");
        assert_eq!(respond(b"GET /nope HTTP/1.1\r\n\r\n", &m).0, "404 Not Found");
        assert_eq!(respond(b"", &m).0, "405 Method Not Allowed");
    }
}
