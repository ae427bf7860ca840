//! Opening a session: socket, TLS negotiation (SSLRequest), startup and
//! authentication, for both our replication transport and tokio-postgres.
//!
//! TLS negotiation: the client sends SSLRequest (code 80877103) and reads
//! exactly one byte, `S` (go ahead with the TLS handshake) or `N` (no TLS).
//! Nothing after that byte may be read before the handshake, or a
//! man-in-the-middle could inject plaintext (CVE-2021-23222).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_postgres::config::Host;

use crate::Disposition;

use super::auth::{AuthError, AuthRequest, Authenticator, check_first_request};
use super::config::{PgConnectConfig, ServerKind, SslMode, endpoint_name};
use super::error::PgError;
use super::tls;
use super::wire::{DEFAULT_MAX_FRAME, Frame, Tag, encode, next_frame, parse_error_fields, tag};

/// How long connecting (socket, TLS, startup, authentication) may take when
/// the connection string sets no `connect_timeout`.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A socket to PostgreSQL, encrypted or not.
pub(crate) enum PgStream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// What every [`PgStream`] variant is: the I/O traits go to it.
trait Socket: AsyncRead + AsyncWrite + Unpin {}

impl<T: AsyncRead + AsyncWrite + Unpin> Socket for T {}

impl PgStream {
    fn socket(self: Pin<&mut Self>) -> Pin<&mut dyn Socket> {
        match self.get_mut() {
            PgStream::Tcp(s) => Pin::new(s),
            #[cfg(unix)]
            PgStream::Unix(s) => Pin::new(s),
            PgStream::Tls(s) => Pin::new(s.as_mut()),
        }
    }
}

impl AsyncRead for PgStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.socket().poll_read(cx, buf)
    }
}

impl AsyncWrite for PgStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.socket().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.socket().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.socket().poll_shutdown(cx)
    }
}

impl PgStream {
    /// RFC 5929 `tls-server-end-point` data of a TLS session (see `tls.rs`).
    fn tls_server_end_point(&self) -> Option<Vec<u8>> {
        match self {
            PgStream::Tls(s) => {
                tls::tls_server_end_point(s.get_ref().1.peer_certificates()?.first()?)
            }
            _ => None,
        }
    }
}

/// Connects to the endpoints in order, as libpq does: an unreachable one is
/// passed over, and so is (under `target_session_attrs`) one whose kind does
/// not fit. `attempt` starts a session on an opened socket (TLS negotiated per
/// sslmode) and, when asked to, reports the server's kind.
pub(crate) async fn connect_first<T, F, Fut>(
    cfg: &PgConnectConfig,
    mut attempt: F,
) -> Result<T, PgError>
where
    F: FnMut(PgStream, String, bool) -> Fut,
    Fut: std::future::Future<Output = Result<(T, Option<ServerKind>), PgError>>,
{
    let tls = tls::client_config(cfg.tls()).map_err(|e| PgError::Config {
        key: "sslrootcert".into(),
        message: e.to_string(),
    })?;
    let timeout = connect_timeout(cfg);
    let attrs = cfg.session_attrs();
    let mut last_err = None;
    for wanted in attrs.passes() {
        for (host, port) in cfg.endpoints() {
            let addr = endpoint_name(&host, port);
            let attempt_open = open_one(&host, port, &addr, cfg.tls().mode, tls.clone());
            let opened = match tokio::time::timeout(timeout, attempt_open).await {
                Ok(r) => r,
                Err(_) => Err(PgError::Timeout {
                    addr: addr.clone(),
                    during: "connecting",
                    after: timeout,
                }),
            };
            let started = match opened {
                Ok(stream) => attempt(stream, addr.clone(), attrs.needs_check()).await,
                Err(e) => Err(e),
            };
            match started {
                Ok((value, kind)) if wanted.accepts(kind) => return Ok(value),
                Ok((_, kind)) => {
                    let got = kind.map_or("of an unknown kind", |k| k.describe());
                    tracing::debug!(addr = %addr, wanted = wanted.name(), got, "server passed over (target_session_attrs)");
                    last_err = Some(PgError::WrongServerKind {
                        addr,
                        wanted: attrs.name(),
                        got,
                    });
                }
                // An unreachable host (or one starting up): try the next one.
                Err(e) if e.disposition() == Disposition::Retry => {
                    tracing::debug!(addr = %addr, error = %e, "endpoint unavailable");
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
    }
    Err(last_err.unwrap_or_else(|| PgError::Config {
        key: "host".into(),
        message: "no host to connect to".into(),
    }))
}

pub(crate) fn connect_timeout(cfg: &PgConnectConfig) -> Duration {
    cfg.tokio_config()
        .get_connect_timeout()
        .copied()
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
}

async fn open_one(
    host: &Host,
    port: u16,
    addr: &str,
    mode: SslMode,
    tls: Option<Arc<ClientConfig>>,
) -> Result<PgStream, PgError> {
    let io_err = |action: &'static str| {
        let addr = addr.to_owned();
        move |source| PgError::Io {
            action,
            addr,
            source,
        }
    };
    let host_name = match host {
        #[cfg(unix)]
        Host::Unix(dir) => {
            // libpq does not use TLS over Unix sockets either.
            let path = dir.join(format!(".s.PGSQL.{port}"));
            let s = tokio::net::UnixStream::connect(path)
                .await
                .map_err(io_err("connecting to"))?;
            return Ok(PgStream::Unix(s));
        }
        Host::Tcp(h) => h,
    };
    let mut tcp = TcpStream::connect((host_name.as_str(), port))
        .await
        .map_err(io_err("connecting to"))?;
    tcp.set_nodelay(true)
        .map_err(io_err("configuring socket to"))?;
    let Some(tls) = tls else {
        return Ok(PgStream::Tcp(tcp));
    };

    let mut req = BytesMut::new();
    encode::ssl_request(&mut req);
    tcp.write_all(&req)
        .await
        .map_err(io_err("sending SSLRequest to"))?;
    let answer = match tcp.read_u8().await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(PgError::Closed {
                addr: addr.to_owned(),
                during: "negotiating TLS",
            });
        }
        Err(e) => return Err(io_err("negotiating TLS with")(e)),
    };
    match answer {
        b'S' => {}
        b'N' if mode.requires_tls() => {
            return Err(PgError::TlsUnsupported {
                addr: addr.to_owned(),
                mode,
            });
        }
        b'N' => return Ok(PgStream::Tcp(tcp)),
        other => {
            return Err(PgError::Unexpected {
                addr: addr.to_owned(),
                during: "negotiating TLS",
                tag: Tag(other),
            });
        }
    }
    let server_name = ServerName::try_from(host_name.clone()).map_err(|e| PgError::Config {
        key: "host".into(),
        message: format!("{host_name:?} is not a valid TLS server name: {e}"),
    })?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(|e| {
            // rustls reports certificate problems as InvalidData; other kinds
            // are the socket failing under us.
            if e.kind() == std::io::ErrorKind::InvalidData {
                PgError::Tls {
                    addr: addr.to_owned(),
                    mode,
                    message: e.to_string(),
                }
            } else {
                io_err("TLS handshake with")(e)
            }
        })?;
    Ok(PgStream::Tls(Box::new(stream)))
}

/// A started session on our own transport (replication connections).
pub(crate) struct Session {
    pub stream: PgStream,
    /// Received bytes not yet framed.
    pub buf: BytesMut,
    pub addr: String,
    pub backend_pid: Option<i32>,
    pub max_frame: usize,
}

impl Session {
    /// Opens the socket, sends the startup packet with `params`, authenticates
    /// and waits for ReadyForQuery, all within the connect timeout.
    pub async fn start(cfg: &PgConnectConfig, params: &[(&str, &str)]) -> Result<Session, PgError> {
        connect_first(cfg, |stream, addr, check| async move {
            let mut session = Session::started_on(cfg, params, stream, addr).await?;
            let kind = match check {
                true => Some(session.server_kind().await?),
                false => None,
            };
            Ok((session, kind))
        })
        .await
    }

    /// The server's kind, for `target_session_attrs`.
    async fn server_kind(&mut self) -> Result<ServerKind, PgError> {
        const DURING: &str = "asking the server's kind (target_session_attrs)";
        let rows = self.simple_query(ServerKind::QUERY, DURING).await?;
        match rows.first().map(Vec::as_slice) {
            Some([Some(recovery), Some(read_only)]) => {
                Ok(ServerKind::from_text(recovery, read_only))
            }
            _ => Err(PgError::BadReply {
                addr: self.addr.clone(),
                command: "SELECT pg_is_in_recovery()",
                message: format!("expected one row of two values, got {rows:?}"),
            }),
        }
    }

    async fn started_on(
        cfg: &PgConnectConfig,
        params: &[(&str, &str)],
        stream: PgStream,
        addr: String,
    ) -> Result<Session, PgError> {
        let mut session = Session {
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
            addr,
            backend_pid: None,
            max_frame: DEFAULT_MAX_FRAME,
        };
        let timeout = connect_timeout(cfg);
        match tokio::time::timeout(timeout, session.startup(cfg, params)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(PgError::Timeout {
                    addr: session.addr,
                    during: "authenticating",
                    after: timeout,
                });
            }
        }
        Ok(session)
    }

    async fn startup(
        &mut self,
        cfg: &PgConnectConfig,
        params: &[(&str, &str)],
    ) -> Result<(), PgError> {
        let mut out = BytesMut::new();
        encode::startup(params.iter().copied(), &mut out)?;
        self.send(&out).await?;

        let mut auth = Authenticator::new(
            cfg.user(),
            cfg.password(),
            *cfg.auth(),
            self.stream.tls_server_end_point(),
        );
        loop {
            let frame = self.read_frame("authenticating").await?;
            match frame.tag {
                tag::AUTHENTICATION => {
                    let req = AuthRequest::parse(&frame.body)
                        .map_err(|source| self.protocol_error("authenticating", source))?;
                    out.clear();
                    let done = auth.step(req, &mut out).map_err(|e| PgError::Auth {
                        user: cfg.user().to_owned(),
                        addr: self.addr.clone(),
                        reason: e.to_string(),
                        code: None,
                    })?;
                    if !out.is_empty() {
                        self.send(&out).await?;
                    }
                    if done {
                        break;
                    }
                }
                tag::ERROR_RESPONSE => return Err(self.startup_error(cfg, &frame)),
                tag::NOTICE_RESPONSE => self.log_notice(&frame),
                other => return Err(self.unexpected("authenticating", other)),
            }
        }
        loop {
            let frame = self.read_frame("starting the session").await?;
            match frame.tag {
                tag::READY_FOR_QUERY => return Ok(()),
                tag::BACKEND_KEY_DATA => {
                    let mut r = super::wire::Reader::new(frame.tag, &frame.body);
                    let pid = r
                        .i32("process id")
                        .map_err(|source| self.protocol_error("starting the session", source))?;
                    self.backend_pid = Some(pid);
                }
                tag::PARAMETER_STATUS => {}
                tag::NOTICE_RESPONSE => self.log_notice(&frame),
                tag::ERROR_RESPONSE => return Err(self.startup_error(cfg, &frame)),
                other => return Err(self.unexpected("starting the session", other)),
            }
        }
    }

    /// Class 28 (invalid authorization) becomes `PgError::Auth`; the rest are
    /// server errors classified by SQLSTATE.
    fn startup_error(&self, cfg: &PgConnectConfig, frame: &Frame) -> PgError {
        match self.server_error("connecting", frame) {
            PgError::Server { server, .. }
                if let Some(auth) = PgError::auth_refusal(
                    cfg.user(),
                    &self.addr,
                    &server.code,
                    &server.message,
                ) =>
            {
                auth
            }
            other => other,
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), PgError> {
        let addr = &self.addr;
        let io = |source| PgError::Io {
            action: "writing to",
            addr: addr.clone(),
            source,
        };
        self.stream.write_all(bytes).await.map_err(io)?;
        self.stream.flush().await.map_err(io)
    }

    /// Reads until one whole message is buffered.
    pub async fn read_frame(&mut self, during: &'static str) -> Result<Frame, PgError> {
        let addr = self.addr.clone();
        super::wire::read_frame(
            &mut self.stream,
            &mut self.buf,
            self.max_frame,
            &addr,
            during,
            |source| PgError::Protocol {
                addr: addr.clone(),
                during: during.to_owned(),
                source,
            },
        )
        .await
    }

    pub fn server_error(&self, during: &str, frame: &Frame) -> PgError {
        match parse_error_fields(frame.tag, &frame.body) {
            Ok(server) => PgError::Server {
                addr: self.addr.clone(),
                during: during.to_owned(),
                server: Box::new(server),
            },
            Err(source) => self.protocol_error(during, source),
        }
    }

    pub fn protocol_error(&self, during: &str, source: super::wire::WireError) -> PgError {
        PgError::Protocol {
            addr: self.addr.clone(),
            during: during.to_owned(),
            source,
        }
    }

    pub fn unexpected(&self, during: &'static str, t: u8) -> PgError {
        PgError::Unexpected {
            addr: self.addr.clone(),
            during,
            tag: Tag(t),
        }
    }

    pub fn log_notice(&self, frame: &Frame) {
        log_notice(&self.addr, frame);
    }

    /// Runs a simple query whose result is at most a few text rows (replication
    /// commands such as IDENTIFY_SYSTEM) and waits for ReadyForQuery.
    pub async fn simple_query(
        &mut self,
        sql: &str,
        during: &'static str,
    ) -> Result<Vec<Vec<Option<String>>>, PgError> {
        let mut out = BytesMut::new();
        encode::query(sql, &mut out)?;
        self.send(&out).await?;
        let mut rows = Vec::new();
        let mut failure = None;
        loop {
            let frame = self.read_frame(during).await?;
            match frame.tag {
                tag::ROW_DESCRIPTION | tag::COMMAND_COMPLETE | tag::EMPTY_QUERY => {}
                tag::PARAMETER_STATUS => {}
                tag::DATA_ROW => rows.push(
                    parse_data_row(&frame).map_err(|source| self.protocol_error(during, source))?,
                ),
                tag::NOTICE_RESPONSE => self.log_notice(&frame),
                // The server still sends ReadyForQuery after an error.
                tag::ERROR_RESPONSE => failure = Some(self.server_error(during, &frame)),
                tag::READY_FOR_QUERY => {
                    return match failure {
                        Some(e) => Err(e),
                        None => Ok(rows),
                    };
                }
                other => return Err(self.unexpected(during, other)),
            }
        }
    }
}

pub(crate) fn log_notice(addr: &str, frame: &Frame) {
    match parse_error_fields(frame.tag, &frame.body) {
        Ok(n) => {
            tracing::info!(addr = %addr, code = %n.code, severity = %n.severity, "server notice: {}", n.message)
        }
        Err(e) => tracing::warn!(addr = %addr, error = %e, "malformed notice from server"),
    }
}

/// A DataRow body: i16 column count, then per column i32 length (-1 = NULL)
/// and that many bytes of text.
fn parse_data_row(frame: &Frame) -> Result<Vec<Option<String>>, super::wire::WireError> {
    let mut r = super::wire::Reader::new(frame.tag, &frame.body);
    let count = r.i16("column count")?;
    let mut row = Vec::with_capacity(count.max(0) as usize);
    for _ in 0..count {
        let at = r.offset();
        let len = r.i32("column length")?;
        if len == -1 {
            row.push(None);
            continue;
        }
        let len = usize::try_from(len).map_err(|_| r.invalid(at, "column length"))?;
        let value = r.bytes(len, "column value")?;
        let text = String::from_utf8(value.to_vec())
            .map_err(|_| r.invalid(at + 4, "UTF-8 column value"))?;
        row.push(Some(text));
    }
    r.finish()?;
    Ok(row)
}

/// The control connection's socket as tokio-postgres sees it: our stream,
/// whose TLS (if any) is already in place, handed over as a "TLS stream" so
/// that tokio-postgres binds SCRAM to our session's certificate
/// (`channel_binding`). During authentication the server's messages are
/// watched: the first request is checked against `require_auth` and
/// `channel_binding` (tokio-postgres knows no `require_auth`), failing the
/// read before tokio-postgres can answer it. The first is enough:
/// tokio-postgres answers one method request, then accepts only
/// AuthenticationOk after a password, and only SASLContinue, SASLFinal, Ok
/// after SASL (`connect_raw.rs`, `authenticate` and `authenticate_sasl`), so a
/// second method request mid-login is refused (audit F4, proven by
/// tests/it/pg_auth_downgrade.rs). Reads also record whether the
/// socket failed, so that a startup failure on a healthy socket is known to
/// be tokio-postgres refusing the server (e.g. a wrong SCRAM server
/// signature), not a retryable network error.
struct SqlStream {
    inner: PgStream,
    end_point: Option<Vec<u8>>,
    settings: super::config::AuthSettings,
    /// Server bytes not yet framed, while authentication is watched.
    pending: Option<BytesMut>,
    first_seen: bool,
    outcome: Arc<std::sync::Mutex<AuthOutcome>>,
}

#[derive(Default)]
struct AuthOutcome {
    refused: Option<AuthError>,
    socket_failed: bool,
}

impl SqlStream {
    fn outcome(&self) -> std::sync::MutexGuard<'_, AuthOutcome> {
        self.outcome.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks at newly read bytes until authentication has ended.
    fn inspect(&mut self, new: &[u8]) -> std::io::Result<()> {
        let invalid = |e: super::wire::WireError| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
        };
        let Some(pending) = self.pending.as_mut() else {
            return Ok(());
        };
        pending.extend_from_slice(new);
        while let Some(frame) = next_frame(pending, DEFAULT_MAX_FRAME).map_err(invalid)? {
            if frame.tag != tag::AUTHENTICATION {
                self.pending = None;
                return Ok(());
            }
            let req = AuthRequest::parse(&frame.body).map_err(invalid)?;
            if !self.first_seen {
                self.first_seen = true;
                if let Err(e) = check_first_request(self.settings, &req, self.end_point.is_some()) {
                    let message = e.to_string();
                    self.outcome().refused = Some(e);
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        message,
                    ));
                }
            }
            if req == AuthRequest::Ok {
                self.pending = None;
                return Ok(());
            }
        }
        Ok(())
    }
}

impl AsyncRead for SqlStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before => {
                this.outcome().socket_failed = true;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(())) => Poll::Ready(this.inspect(&buf.filled()[before..])),
            Poll::Ready(Err(e)) => {
                this.outcome().socket_failed = true;
                Poll::Ready(Err(e))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for SqlStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tokio_postgres::tls::TlsStream for SqlStream {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        match &self.end_point {
            Some(data) => tokio_postgres::tls::ChannelBinding::tls_server_end_point(data.clone()),
            None => tokio_postgres::tls::ChannelBinding::none(),
        }
    }
}

/// Hands our stream to tokio-postgres unchanged (see [`SqlStream`]).
struct AlreadyNegotiated;

impl tokio_postgres::tls::TlsConnect<SqlStream> for AlreadyNegotiated {
    type Stream = SqlStream;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<SqlStream, std::io::Error>>;

    fn connect(self, stream: SqlStream) -> Self::Future {
        std::future::ready(Ok(stream))
    }
}

/// A tokio-postgres client over our transport (same hosts, TLS policy,
/// authentication policy and timeouts as the replication connection); its
/// connection task is spawned.
pub(crate) async fn connect_sql(cfg: &PgConnectConfig) -> Result<tokio_postgres::Client, PgError> {
    connect_first(cfg, |stream, addr, check| async move {
        let client = sql_on(cfg, stream, addr.clone()).await?;
        if !check {
            return Ok((client, None));
        }
        let kind = super::control::server_kind(&client).await?;
        Ok((client, Some(kind)))
    })
    .await
}

/// A tokio-postgres client on an opened socket.
async fn sql_on(
    cfg: &PgConnectConfig,
    stream: PgStream,
    addr: String,
) -> Result<tokio_postgres::Client, PgError> {
    let outcome = Arc::new(std::sync::Mutex::new(AuthOutcome::default()));
    let stream = SqlStream {
        end_point: stream.tls_server_end_point(),
        inner: stream,
        settings: *cfg.auth(),
        pending: Some(BytesMut::new()),
        first_seen: false,
        outcome: outcome.clone(),
    };
    let mut tokio_cfg = cfg.tokio_config().clone();
    // TLS is already in place on `stream`: with sslmode=require and direct
    // negotiation tokio-postgres sends no SSLRequest and takes the stream from
    // `AlreadyNegotiated` as is, with its channel-binding data.
    tokio_cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
    tokio_cfg.ssl_negotiation(tokio_postgres::config::SslNegotiation::Direct);
    let timeout = connect_timeout(cfg);
    let connected =
        tokio::time::timeout(timeout, tokio_cfg.connect_raw(stream, AlreadyNegotiated)).await;
    let auth_error = {
        let mut o = outcome.lock().unwrap_or_else(|p| p.into_inner());
        match (o.refused.take(), &connected) {
            (Some(e), _) => Some(e.to_string()),
            // tokio-postgres refused what the server sent during startup on a
            // healthy socket (a SCRAM signature that does not verify, a
            // message out of order): definite, not a network failure.
            (None, Ok(Err(e))) if e.as_db_error().is_none() && !o.socket_failed => Some(format!(
                "the control connection refused the server's startup messages: {e}"
            )),
            _ => None,
        }
    };
    if let Some(reason) = auth_error {
        return Err(PgError::Auth {
            user: cfg.user().to_owned(),
            addr,
            reason,
            code: None,
        });
    }
    let (client, connection) = match connected {
        Err(_) => {
            return Err(PgError::Timeout {
                addr,
                during: "authenticating",
                after: timeout,
            });
        }
        Ok(Err(e)) => {
            let refusal = e.as_db_error().and_then(|db| {
                PgError::auth_refusal(cfg.user(), &addr, db.code().code(), db.message())
            });
            return Err(refusal.unwrap_or_else(|| PgError::sql(format!("connecting to {addr}"), e)));
        }
        Ok(Ok(pair)) => pair,
    };
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(addr = %addr, error = %e, "SQL connection ended with an error");
        }
    });
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn parses_data_rows() {
        let body =
            Bytes::from_static(b"\x00\x03\x00\x00\x00\x02ab\xff\xff\xff\xff\x00\x00\x00\x00");
        let row = parse_data_row(&Frame { tag: b'D', body }).unwrap();
        assert_eq!(row, vec![Some("ab".to_owned()), None, Some(String::new())]);
        let body = Bytes::from_static(b"\x00\x01\x00\x00\x00\x05ab");
        assert!(parse_data_row(&Frame { tag: b'D', body }).is_err());
        let body = Bytes::from_static(b"\x00\x01\xff\xff\xff\xfe");
        assert!(parse_data_row(&Frame { tag: b'D', body }).is_err());
    }
}
