//! The replication connection: startup with `replication=database`,
//! IDENTIFY_SYSTEM, and START_REPLICATION ... LOGICAL, after which the session
//! is in CopyBoth mode and becomes a [`ReplicationStream`].
//!
//! ```text
//!  server ──CopyData(w/k)──► read half ──recv()──► consumer
//!     ▲                                               │ set_flushed(durable LSN)
//!     └──CopyData(r)── write half ◄── writer task ◄── FeedbackHandle
//! ```
//!
//! The read half is only read inside `recv`, so a stalled consumer stalls the
//! socket (TCP backpressure); the writer task keeps status updates flowing so
//! the server does not time us out meanwhile (see `feedback.rs`).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::Lsn;
use super::codec::{ReplicationEvent, parse_copy_data};
use super::config::PgConnectConfig;
use super::connect::{PgStream, Session, log_notice};
use super::error::{PgError, ServerError};
use super::feedback::{FeedbackHandle, FeedbackState, FeedbackTiming, run_writer};
use super::ident::{quote_ident, quote_replication_literal};
use super::wire::{
    DEFAULT_MAX_FRAME, Frame, Tag, encode, next_frame, parse_error_fields, read_frame,
    reserve_for_read, tag,
};

/// What IDENTIFY_SYSTEM reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemIdentity {
    /// The cluster's unique system identifier (a u64 in decimal text).
    pub system_id: String,
    pub timeline: u32,
    /// The current WAL flush position.
    pub xlogpos: Lsn,
    /// The database of a `replication=database` connection.
    pub dbname: Option<String>,
}

/// A logical slot created with an exported snapshot
/// ([`ReplicationConnection::create_slot_exporting_snapshot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedSlot {
    /// The first position the slot decodes from: every transaction committed
    /// before it is visible in the snapshot, every later one comes through
    /// the slot.
    pub consistent_point: Lsn,
    /// For `SET TRANSACTION SNAPSHOT` on another connection; valid until the
    /// next command on this replication connection.
    pub snapshot: String,
}

/// Tuning of a replication stream.
#[derive(Clone, Copy, Debug)]
pub struct StreamOptions {
    /// Status updates are sent at least this often. Default 10 s, well under
    /// the server's default wal_sender_timeout of 60 s.
    pub status_interval: Duration,
    /// After `set_flushed`, at most one update per this gap. Default 100 ms.
    pub min_feedback_gap: Duration,
    /// Largest accepted message. Default a little over 1 GiB.
    pub max_frame: usize,
    /// Bound on `shutdown`. Default 10 s.
    pub shutdown_timeout: Duration,
    /// Dead-peer detection while `recv` waits: after this long without a
    /// byte from the server, ask it for a keepalive; after twice this long,
    /// fail with a (retryable) timeout. Default 30 s.
    pub idle_timeout: Duration,
}

impl Default for StreamOptions {
    fn default() -> StreamOptions {
        StreamOptions {
            status_interval: Duration::from_secs(10),
            min_feedback_gap: Duration::from_millis(100),
            max_frame: DEFAULT_MAX_FRAME,
            shutdown_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// A session started with `replication=database`, before streaming.
pub struct ReplicationConnection {
    session: Session,
    options: StreamOptions,
}

impl ReplicationConnection {
    /// Connects as the configured user to the configured database, with TLS
    /// per sslmode, announcing `application_name` (shown in pg_stat_replication).
    pub async fn connect(
        cfg: &PgConnectConfig,
        application_name: &str,
    ) -> Result<ReplicationConnection, PgError> {
        let mut params = vec![
            ("user", cfg.user()),
            ("database", cfg.dbname()),
            ("replication", "database"),
            ("application_name", application_name),
        ];
        if let Some(options) = cfg.tokio_config().get_options() {
            params.push(("options", options));
        }
        let session = Session::start(cfg, &params).await?;
        tracing::debug!(addr = %session.addr, pid = ?session.backend_pid, "replication connection established");
        Ok(ReplicationConnection {
            session,
            options: StreamOptions::default(),
        })
    }

    pub fn set_stream_options(&mut self, options: StreamOptions) {
        self.options = options;
    }

    /// The server process serving this connection (as in pg_stat_replication.pid).
    pub fn backend_pid(&self) -> Option<i32> {
        self.session.backend_pid
    }

    /// `host:port` of the server.
    pub fn addr(&self) -> &str {
        &self.session.addr
    }

    pub async fn identify_system(&mut self) -> Result<SystemIdentity, PgError> {
        const COMMAND: &str = "IDENTIFY_SYSTEM";
        let rows = self
            .session
            .simple_query(COMMAND, "running IDENTIFY_SYSTEM")
            .await?;
        let bad = bad_reply(&self.session.addr, COMMAND);
        let row = single_row(&rows, &bad)?;
        let [Some(system_id), Some(timeline), Some(xlogpos), dbname, ..] = row else {
            return Err(bad(format!("unexpected columns {row:?}")));
        };
        Ok(SystemIdentity {
            system_id: system_id.clone(),
            timeline: timeline
                .parse()
                .map_err(|_| bad(format!("timeline {timeline:?} is not a number")))?,
            xlogpos: xlogpos.parse().map_err(|e| bad(format!("xlogpos: {e}")))?,
            dbname: dbname.clone(),
        })
    }

    /// `CREATE_REPLICATION_SLOT ... LOGICAL pgoutput EXPORT_SNAPSHOT` (the form
    /// every supported major accepts), or with `failover` (PostgreSQL 17+,
    /// `postgres.failover_slot`) the option form `(SNAPSHOT 'export',
    /// FAILOVER)`, so that a recreated slot survives a promotion like the
    /// one it replaces. The snapshot stays usable until the next command on
    /// this connection, so read it before [`start_logical`](Self::start_logical).
    pub async fn create_slot_exporting_snapshot(
        &mut self,
        slot: &str,
        failover: bool,
    ) -> Result<ExportedSlot, PgError> {
        const COMMAND: &str = "CREATE_REPLICATION_SLOT";
        let command = if failover {
            format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER)",
                quote_ident(slot)
            )
        } else {
            format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT",
                quote_ident(slot)
            )
        };
        let rows = match self
            .session
            .simple_query(&command, "creating a replication slot with a snapshot")
            .await
        {
            Ok(rows) => rows,
            Err(PgError::Server {
                addr,
                during,
                server,
            }) => {
                return Err(PgError::from_slot_response(slot, *server, |server| {
                    PgError::Server {
                        addr,
                        during,
                        server: Box::new(server),
                    }
                }));
            }
            Err(e) => return Err(e),
        };
        let bad = bad_reply(&self.session.addr, COMMAND);
        let row = single_row(&rows, &bad)?;
        let [_, Some(consistent_point), Some(snapshot), ..] = row else {
            return Err(bad(format!("unexpected columns {row:?}")));
        };
        Ok(ExportedSlot {
            consistent_point: consistent_point
                .parse()
                .map_err(|e| bad(format!("consistent_point: {e}")))?,
            snapshot: snapshot.clone(),
        })
    }

    /// Ends the session politely (Terminate) instead of just dropping the socket.
    pub async fn close(mut self) -> Result<(), PgError> {
        let mut out = BytesMut::new();
        encode::terminate(&mut out);
        self.session.send(&out).await?;
        let _ = self.session.stream.shutdown().await;
        Ok(())
    }

    /// Starts logical decoding from `slot` with pgoutput protocol version 1
    /// (logical decoding messages too with `messages`). `start` = 0/0 lets
    /// the server start at the slot's confirmed position; the server never
    /// sends a transaction that ends before the slot's confirmed_flush_lsn,
    /// whatever `start` says.
    pub async fn start_logical(
        self,
        slot: &str,
        start: Lsn,
        publication: &str,
        messages: bool,
    ) -> Result<ReplicationStream, PgError> {
        let options = StartOptions {
            messages,
            streaming: false,
        };
        self.start_logical_with(slot, start, publication, options)
            .await
    }

    /// [`start_logical`](Self::start_logical) with protocol version 2 when
    /// `options.streaming`.
    pub async fn start_logical_with(
        mut self,
        slot: &str,
        start: Lsn,
        publication: &str,
        options: StartOptions,
    ) -> Result<ReplicationStream, PgError> {
        let command = start_replication_command(slot, start, publication, options);
        let mut out = BytesMut::new();
        encode::query(&command, &mut out)?;
        self.session.send(&out).await?;
        loop {
            let frame = self.session.read_frame("starting replication").await?;
            match frame.tag {
                tag::COPY_BOTH_RESPONSE => break,
                tag::ERROR_RESPONSE => {
                    return Err(match parse_error_fields(frame.tag, &frame.body) {
                        Ok(server) => slot_error(slot, server, &self.session.addr),
                        Err(source) => self.session.protocol_error("starting replication", source),
                    });
                }
                tag::NOTICE_RESPONSE => self.session.log_notice(&frame),
                tag::PARAMETER_STATUS => {}
                other => return Err(self.session.unexpected("starting replication", other)),
            }
        }
        tracing::info!(slot = %slot, start = %start, publication = %publication, addr = %self.session.addr, "replication started");
        Ok(ReplicationStream::new(self.session, self.options, slot))
    }
}

/// pgoutput options of START_REPLICATION beyond the publication.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// Logical decoding messages (`messages 'true'`).
    pub messages: bool,
    /// In-progress transactions streamed (`proto_version '2', streaming
    /// 'on'`, PostgreSQL 14+).
    pub streaming: bool,
}

/// The START_REPLICATION command. The slot is a quoted identifier; the
/// publication list is a string literal holding a quoted identifier (pgoutput
/// splits it like SQL identifiers). `messages` and `streaming` are sent only
/// when wanted: both are off by default, and PostgreSQL 13's pgoutput refuses
/// them altogether.
pub(crate) fn start_replication_command(
    slot: &str,
    start: Lsn,
    publication: &str,
    options: StartOptions,
) -> String {
    format!(
        "START_REPLICATION SLOT {} LOGICAL {start} (proto_version '{}', publication_names {}{}{})",
        quote_ident(slot),
        if options.streaming { 2 } else { 1 },
        quote_replication_literal(&quote_ident(publication)),
        if options.messages {
            ", messages 'true'"
        } else {
            ""
        },
        if options.streaming {
            ", streaming 'on'"
        } else {
            ""
        },
    )
}

/// Maps the slot errors of START_REPLICATION to typed variants.
fn slot_error(slot: &str, server: ServerError, addr: &str) -> PgError {
    PgError::from_slot_response(slot, server, |server| PgError::Server {
        addr: addr.to_owned(),
        during: format!("starting replication from slot {slot:?}"),
        server: Box::new(server),
    })
}

/// A logical replication stream in CopyBoth mode.
///
/// `recv` is cancel-safe: a frame is taken from the buffer only when complete.
/// Dropping the stream aborts the writer task and closes the connection
/// without a goodbye; `shutdown` ends it cleanly.
pub struct ReplicationStream {
    reader: ReadHalf<PgStream>,
    buf: BytesMut,
    addr: String,
    slot: String,
    state: Arc<FeedbackState>,
    writer: Option<JoinHandle<Option<WriteHalf<PgStream>>>>,
    stop: Option<oneshot::Sender<()>>,
    options: StreamOptions,
    /// The last WAL position seen, for error context.
    last_lsn: Lsn,
    /// The server ended the copy (CopyDone).
    server_done: bool,
    /// When the last bytes arrived, and when we then asked for a keepalive:
    /// kept here, not in `fill`, because callers drop and recreate the `recv`
    /// future (e.g. in a `select!`), which must not restart the clock.
    last_read_at: tokio::time::Instant,
    reply_asked_at: Option<tokio::time::Instant>,
    /// Fires at or before the idle deadline. Armed lazily: a read only moves
    /// `last_read_at`, and the timer is re-armed when it fires early, so a busy
    /// stream does not register and cancel a timer on every socket read.
    idle_timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl ReplicationStream {
    fn new(session: Session, options: StreamOptions, slot: &str) -> ReplicationStream {
        let (reader, write_half) = tokio::io::split(session.stream);
        let state = Arc::new(FeedbackState::default());
        let (stop_tx, stop_rx) = oneshot::channel();
        let timing = FeedbackTiming {
            interval: options.status_interval,
            min_gap: options.min_feedback_gap,
        };
        let writer = tokio::spawn(run_writer(
            write_half,
            session.addr.clone(),
            state.clone(),
            timing,
            stop_rx,
        ));
        ReplicationStream {
            reader,
            buf: session.buf,
            addr: session.addr,
            slot: slot.to_owned(),
            state,
            writer: Some(writer),
            stop: Some(stop_tx),
            options,
            last_lsn: Lsn::ZERO,
            server_done: false,
            last_read_at: tokio::time::Instant::now(),
            reply_asked_at: None,
            idle_timer: Box::pin(tokio::time::sleep(options.idle_timeout)),
        }
    }

    /// A handle to report progress; usable from any task.
    pub fn feedback(&self) -> FeedbackHandle {
        FeedbackHandle::new(self.state.clone())
    }

    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// Whether bytes already received wait to be read (the rest of a
    /// message, or more messages): the reader is behind the server.
    pub fn has_unread(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The next message, or `None` once the server has ended the copy.
    /// A failure of the feedback writer is returned here.
    pub async fn recv(&mut self) -> Result<Option<ReplicationEvent>, PgError> {
        loop {
            if let Some(e) = self.state.take_failure() {
                return Err(e);
            }
            if self.server_done {
                return Ok(None);
            }
            let next = next_frame(&mut self.buf, self.options.max_frame).map_err(|source| {
                PgError::Replication {
                    addr: self.addr.clone(),
                    after: self.last_lsn,
                    source,
                }
            })?;
            if let Some(frame) = next {
                match self.handle(frame)? {
                    Some(event) => return Ok(Some(event)),
                    None => continue,
                }
            }
            self.fill().await?;
        }
    }

    /// Reads more bytes into the buffer, watching for a writer failure and
    /// for a silent server (see `StreamOptions::idle_timeout`).
    async fn fill(&mut self) -> Result<(), PgError> {
        reserve_for_read(&mut self.buf);
        loop {
            tokio::select! {
                biased;
                _ = self.state.failed.notified() => return Ok(()),
                read = self.reader.read_buf(&mut self.buf) => match read {
                    Ok(0) => return Err(PgError::Closed { addr: self.addr.clone(), during: "streaming" }),
                    Ok(_) => {
                        self.last_read_at = tokio::time::Instant::now();
                        self.reply_asked_at = None;
                        return Ok(());
                    }
                    Err(source) => return Err(PgError::Io { action: "reading from", addr: self.addr.clone(), source }),
                },
                () = self.idle_timer.as_mut() => {
                    let idle = self.options.idle_timeout;
                    let deadline = match self.reply_asked_at {
                        None => self.last_read_at + idle,
                        Some(asked) => asked + idle,
                    };
                    if tokio::time::Instant::now() < deadline {
                        // Bytes arrived since the timer was armed.
                        self.idle_timer.as_mut().reset(deadline);
                    } else if self.reply_asked_at.is_none() {
                        // A live server answers a reply request with a keepalive at once.
                        let now = tokio::time::Instant::now();
                        self.reply_asked_at = Some(now);
                        self.idle_timer.as_mut().reset(now + idle);
                        self.feedback().request_reply();
                    } else {
                        return Err(PgError::Timeout {
                            addr: self.addr.clone(),
                            during: "waiting for the server (no keepalive in reply to a request)",
                            after: idle * 2,
                        });
                    }
                }
            }
        }
    }

    fn handle(&mut self, frame: Frame) -> Result<Option<ReplicationEvent>, PgError> {
        match frame.tag {
            tag::COPY_DATA => {
                let event =
                    parse_copy_data(&frame.body).map_err(|source| PgError::Replication {
                        addr: self.addr.clone(),
                        after: self.last_lsn,
                        source,
                    })?;
                match &event {
                    ReplicationEvent::XLogData { wal_start, .. } => {
                        self.last_lsn = self.last_lsn.max(*wal_start);
                    }
                    ReplicationEvent::Keepalive {
                        wal_end,
                        reply_requested,
                        ..
                    } => {
                        self.last_lsn = self.last_lsn.max(*wal_end);
                        if *reply_requested {
                            self.state.reply_now();
                        }
                    }
                }
                Ok(Some(event))
            }
            // A walsender shutting down (WalSndDone, e.g. `pg_ctl stop -m fast`
            // while we are caught up) ends the copy with CommandComplete and
            // exits, without CopyDone: the stream is over, not malformed.
            tag::COPY_DONE | tag::COMMAND_COMPLETE => {
                self.server_done = true;
                Ok(None)
            }
            tag::ERROR_RESPONSE => Err(match parse_error_fields(frame.tag, &frame.body) {
                Ok(server) => PgError::Server {
                    addr: self.addr.clone(),
                    during: format!(
                        "streaming from slot {:?} after {}",
                        self.slot, self.last_lsn
                    ),
                    server: Box::new(server),
                },
                Err(source) => PgError::Replication {
                    addr: self.addr.clone(),
                    after: self.last_lsn,
                    source,
                },
            }),
            tag::NOTICE_RESPONSE => {
                log_notice(&self.addr, &frame);
                Ok(None)
            }
            tag::PARAMETER_STATUS => Ok(None),
            other => Err(PgError::Unexpected {
                addr: self.addr.clone(),
                during: "streaming",
                tag: Tag(other),
            }),
        }
    }

    /// Ends streaming: a last status update with the current positions,
    /// CopyDone, then reads (and discards) until the server's ReadyForQuery,
    /// then Terminate. Bounded by `StreamOptions::shutdown_timeout`.
    /// Messages still in flight are dropped; they were not reported flushed,
    /// so the server sends them again on the next start.
    pub async fn shutdown(mut self) -> Result<(), PgError> {
        let limit = self.options.shutdown_timeout;
        match tokio::time::timeout(limit, self.shutdown_inner()).await {
            Ok(r) => r,
            Err(_) => Err(PgError::Timeout {
                addr: self.addr.clone(),
                during: "ending replication",
                after: limit,
            }),
        }
    }

    async fn shutdown_inner(&mut self) -> Result<(), PgError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let writer = self.writer.take();
        let joined = match writer {
            Some(handle) => handle.await.map_err(|e| PgError::Internal {
                what: "feedback writer",
                message: e.to_string(),
            })?,
            None => None,
        };
        let Some(mut write_half) = joined else {
            return Err(self
                .state
                .take_failure()
                .unwrap_or_else(|| PgError::Internal {
                    what: "feedback writer",
                    message: "ended before shutdown".into(),
                }));
        };
        loop {
            let (addr, after) = (self.addr.clone(), self.last_lsn);
            let frame = read_frame(
                &mut self.reader,
                &mut self.buf,
                self.options.max_frame,
                &self.addr,
                "ending replication",
                |source| PgError::Replication {
                    addr: addr.clone(),
                    after,
                    source,
                },
            )
            .await?;
            match frame.tag {
                tag::READY_FOR_QUERY => break,
                tag::COPY_DATA | tag::COPY_DONE | tag::COMMAND_COMPLETE | tag::PARAMETER_STATUS => {
                }
                tag::NOTICE_RESPONSE => log_notice(&self.addr, &frame),
                // An ErrorResponse or an unknown tag becomes the error.
                _ => {
                    self.handle(frame)?;
                }
            }
        }
        let mut out = BytesMut::new();
        encode::terminate(&mut out);
        let io = |source| PgError::Io {
            action: "closing",
            addr: self.addr.clone(),
            source,
        };
        write_half.write_all(&out).await.map_err(io)?;
        write_half.flush().await.map_err(io)?;
        let _ = write_half.shutdown().await;
        tracing::info!(slot = %self.slot, flushed = %FeedbackHandle::new(self.state.clone()).flushed(), "replication ended");
        Ok(())
    }
}

impl Drop for ReplicationStream {
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            writer.abort();
        }
    }
}

/// Blames a malformed reply to `command` on the server at `addr`.
fn bad_reply<'a>(addr: &'a str, command: &'static str) -> impl Fn(String) -> PgError + 'a {
    move |message| PgError::BadReply {
        addr: addr.to_owned(),
        command,
        message,
    }
}

/// The one row a replication command answers with.
fn single_row<'r>(
    rows: &'r [Vec<Option<String>>],
    bad: &impl Fn(String) -> PgError,
) -> Result<&'r [Option<String>], PgError> {
    match rows {
        [row] => Ok(row),
        _ => Err(bad(format!("{} rows instead of 1", rows.len()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_command_quotes_names() {
        let messages = StartOptions {
            messages: true,
            streaming: false,
        };
        let streaming = StartOptions {
            messages: false,
            streaming: true,
        };
        assert_eq!(
            start_replication_command("s1", Lsn::new(0x1_0000_00A0), "pub", messages),
            "START_REPLICATION SLOT \"s1\" LOGICAL 1/A0 (proto_version '1', publication_names '\"pub\"', messages 'true')"
        );
        assert_eq!(
            start_replication_command("s1", Lsn::new(0x1_0000_00A0), "pub", streaming),
            "START_REPLICATION SLOT \"s1\" LOGICAL 1/A0 (proto_version '2', publication_names '\"pub\"', streaming 'on')"
        );
        assert_eq!(
            start_replication_command("s", Lsn::ZERO, "it's \"x\"", StartOptions::default()),
            "START_REPLICATION SLOT \"s\" LOGICAL 0/0 (proto_version '1', publication_names '\"it''s \"\"x\"\"\"')"
        );
    }

    #[test]
    fn maps_slot_errors() {
        let server = |code: &str, message: &str| ServerError {
            severity: "ERROR".into(),
            code: code.into(),
            message: message.into(),
            detail: None,
            hint: None,
        };
        match slot_error(
            "s",
            server("55006", "replication slot \"s\" is active for PID 4242"),
            "a",
        ) {
            PgError::SlotActive { pid, .. } => assert_eq!(pid, Some(4242)),
            other => panic!("{other:?}"),
        }
        match slot_error("s", server("55006", "in use"), "a") {
            PgError::SlotActive { pid, .. } => assert_eq!(pid, None),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            slot_error(
                "s",
                server("42704", "replication slot \"s\" does not exist"),
                "a"
            ),
            PgError::SlotMissing { .. }
        ));
        assert!(matches!(
            slot_error("s", server("55000", "x"), "a"),
            PgError::Server { .. }
        ));
    }
}
