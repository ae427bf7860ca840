//! Standby status updates, sent from their own task.
//!
//! The server drops a client that sends nothing for `wal_sender_timeout`. The
//! consumer of the stream may stall (a full pipeline, a slow broker), and then
//! nobody reads the socket. So the write half belongs to a writer task that
//! sends on a timer, soon after the flushed position moves (coalesced to at
//! most one update per `min_gap`), and at once when the server asks for a
//! reply. The read half is only read when the consumer asks for the next
//! event: a stalled consumer means TCP backpressure, never unbounded buffering.
//!
//! LSN rules (DESIGN.md §5): the transport never decides on its own what is
//! flushed. `flushed` only moves when the caller reports a position that is
//! durable locally; both positions only move forward; `written >= flushed` is
//! kept by raising `written`. `applied` is reported equal to `flushed`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, oneshot};
use tokio::time::{Instant, MissedTickBehavior};

use super::codec::{StatusUpdate, encode_status_update};
use super::error::PgError;
use super::wire::encode;
use super::{DurableLsn, Lsn, PgTimestamp};

/// State shared by the handle(s), the writer task and the reader.
#[derive(Default)]
pub(crate) struct FeedbackState {
    written: AtomicU64,
    flushed: AtomicU64,
    /// Send without waiting for the coalescing gap.
    urgent: AtomicBool,
    /// Set the reply flag in the next update.
    ask_reply: AtomicBool,
    kick: Notify,
    /// The writer's failure, surfaced by the next `recv`.
    failure: Mutex<Option<PgError>>,
    /// Set once `failure` was filled: `recv` checks this flag on every
    /// message and takes the lock only when it is set.
    has_failure: AtomicBool,
    pub(crate) failed: Notify,
}

impl FeedbackState {
    /// The server asked for a reply (keepalive with reply_requested).
    pub(crate) fn reply_now(&self) {
        self.urgent.store(true, Ordering::SeqCst);
        self.kick.notify_one();
    }

    pub(crate) fn take_failure(&self) -> Option<PgError> {
        if !self.has_failure.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().ok().and_then(|mut f| f.take())
    }

    fn fail(&self, e: PgError) {
        if let Ok(mut f) = self.failure.lock() {
            f.get_or_insert(e);
        }
        self.has_failure.store(true, Ordering::Release);
        self.failed.notify_one();
    }

    fn positions(&self) -> (Lsn, Lsn) {
        (
            Lsn::new(self.written.load(Ordering::SeqCst)),
            Lsn::new(self.flushed.load(Ordering::SeqCst)),
        )
    }

    fn next_update(&self) -> StatusUpdate {
        let (written, flushed) = self.positions();
        StatusUpdate {
            written,
            flushed,
            applied: flushed,
            client_time: PgTimestamp::now(),
            reply_requested: self.ask_reply.swap(false, Ordering::SeqCst),
        }
    }
}

/// Reports progress to the server. Cheap to clone; all clones share the
/// positions of one replication stream.
#[derive(Clone)]
pub struct FeedbackHandle {
    state: Arc<FeedbackState>,
}

impl FeedbackHandle {
    /// A handle no writer task serves: for unit tests that read back what
    /// was reported.
    #[cfg(test)]
    pub(crate) fn detached() -> FeedbackHandle {
        FeedbackHandle::new(Arc::new(FeedbackState::default()))
    }

    pub(crate) fn new(state: Arc<FeedbackState>) -> FeedbackHandle {
        FeedbackHandle { state }
    }

    /// Everything up to `lsn` has been received and handed on. A position
    /// behind the current one is ignored.
    pub fn set_written(&self, lsn: Lsn) {
        self.state.written.fetch_max(lsn.as_u64(), Ordering::SeqCst);
    }

    /// Everything up to `lsn` is durable locally; the server may recycle WAL
    /// and the slot advances to it (only the offset store makes a
    /// [`DurableLsn`]). A position behind the current one is ignored;
    /// `written` is raised to it if needed. The update is sent within `min_gap`.
    pub fn set_flushed(&self, lsn: DurableLsn) {
        let raw = lsn.lsn().as_u64();
        self.state.written.fetch_max(raw, Ordering::SeqCst);
        let previous = self.state.flushed.fetch_max(raw, Ordering::SeqCst);
        if raw > previous {
            self.state.kick.notify_one();
        }
    }

    /// Sends a status update now with the reply flag set, so the server
    /// answers with a keepalive carrying its current WAL end.
    pub fn request_reply(&self) {
        self.state.ask_reply.store(true, Ordering::SeqCst);
        self.state.reply_now();
    }

    /// The position last passed to `set_written` (or raised by `set_flushed`).
    pub fn written(&self) -> Lsn {
        self.state.positions().0
    }

    /// The position last passed to `set_flushed`.
    pub fn flushed(&self) -> Lsn {
        self.state.positions().1
    }
}

/// When the writer sends.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FeedbackTiming {
    pub interval: Duration,
    pub min_gap: Duration,
}

/// The writer task: owns the write half until asked to stop, then sends a
/// final update and CopyDone and gives the write half back. On a write error
/// the error is parked in the shared state and the task ends.
pub(crate) async fn run_writer<W: AsyncWrite + Unpin>(
    mut w: W,
    addr: String,
    state: Arc<FeedbackState>,
    timing: FeedbackTiming,
    mut stop: oneshot::Receiver<()>,
) -> Option<W> {
    let mut ticker = tokio::time::interval(timing.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_sent: Option<(Lsn, Lsn)> = None;
    let mut last_send_at = Instant::now();
    let mut out = BytesMut::with_capacity(64);
    loop {
        tokio::select! {
            biased;
            stopped = &mut stop => {
                // A dropped sender means the stream is gone: nothing to say.
                stopped.ok()?;
                out.clear();
                encode_status_update(&state.next_update(), &mut out);
                encode::copy_done(&mut out);
                return match write(&mut w, &out).await {
                    Ok(()) => Some(w),
                    Err(source) => {
                        state.fail(PgError::Io { action: "ending replication with", addr, source });
                        None
                    }
                };
            }
            _ = state.kick.notified() => {
                let urgent = state.urgent.swap(false, Ordering::SeqCst);
                if !urgent {
                    if last_sent == Some(state.positions()) {
                        continue;
                    }
                    let since = last_send_at.elapsed();
                    if since < timing.min_gap {
                        tokio::time::sleep(timing.min_gap - since).await;
                    }
                }
            }
            _ = ticker.tick() => {}
        }
        let update = state.next_update();
        out.clear();
        encode_status_update(&update, &mut out);
        if let Err(source) = write(&mut w, &out).await {
            state.fail(PgError::Io {
                action: "sending feedback to",
                addr,
                source,
            });
            return None;
        }
        tracing::trace!(written = %update.written, flushed = %update.flushed, "sent standby status update");
        last_sent = Some((update.written, update.flushed));
        last_send_at = Instant::now();
        ticker.reset();
    }
}

async fn write<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Disposition;
    use tokio::io::AsyncReadExt;

    fn handle() -> (FeedbackHandle, Arc<FeedbackState>) {
        let state = Arc::new(FeedbackState::default());
        (FeedbackHandle::new(state.clone()), state)
    }

    #[test]
    fn positions_only_move_forward_and_flush_raises_write() {
        let (h, _) = handle();
        h.set_written(Lsn::new(100));
        h.set_written(Lsn::new(50));
        assert_eq!(h.written(), Lsn::new(100));
        h.set_flushed(DurableLsn::for_test(Lsn::new(200)));
        assert_eq!((h.written(), h.flushed()), (Lsn::new(200), Lsn::new(200)));
        h.set_flushed(DurableLsn::for_test(Lsn::new(150)));
        assert_eq!(h.flushed(), Lsn::new(200));
    }

    /// Parses the `r` messages out of what the writer sent.
    fn updates(mut raw: &[u8]) -> Vec<(u64, u64, u64, bool)> {
        let mut v = Vec::new();
        while raw.len() >= 39 && raw[0] == b'd' {
            let u = |i: usize| u64::from_be_bytes(raw[i..i + 8].try_into().unwrap());
            assert_eq!(raw[5], b'r');
            v.push((u(6), u(14), u(22), raw[38] == 1));
            raw = &raw[39..];
        }
        v
    }

    /// A writer running on an in-memory pipe, reporting every `interval` and
    /// a flush at most every 100 ms.
    struct Running {
        handle: FeedbackHandle,
        server: tokio::io::DuplexStream,
        stop: oneshot::Sender<()>,
        task: tokio::task::JoinHandle<Option<tokio::io::DuplexStream>>,
    }

    fn start_writer(interval: Duration) -> Running {
        let (handle, state) = handle();
        let (client, server) = tokio::io::duplex(64 * 1024);
        let (stop, stop_rx) = oneshot::channel();
        let timing = FeedbackTiming {
            interval,
            min_gap: Duration::from_millis(100),
        };
        let task = tokio::spawn(run_writer(client, "test".into(), state, timing, stop_rx));
        Running {
            handle,
            server,
            stop,
            task,
        }
    }

    impl Running {
        /// Stops the writer: whether it gave its stream back, and all it sent.
        async fn stop(mut self) -> (bool, Vec<u8>) {
            self.stop.send(()).unwrap();
            let gave_back = self.task.await.unwrap().is_some();
            let mut raw = Vec::new();
            self.server.read_to_end(&mut raw).await.unwrap();
            (gave_back, raw)
        }
    }

    /// Real time (tokio's test-util clock is not enabled in this crate), so
    /// the assertions allow for a loaded machine.
    #[tokio::test]
    async fn writer_sends_on_timer_on_flush_and_on_stop() {
        let writer = start_writer(Duration::from_millis(700));
        let h = &writer.handle;
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.set_flushed(DurableLsn::for_test(Lsn::new(0x10)));
        tokio::time::sleep(Duration::from_millis(300)).await;
        h.set_written(Lsn::new(0x20));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        h.request_reply();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (gave_back, raw) = writer.stop().await;
        assert!(gave_back);
        let got = updates(&raw);

        assert_eq!(
            got[0],
            (0, 0, 0, false),
            "the first tick fires at once: {got:?}"
        );
        let flush_update = got.iter().position(|u| u.1 == 0x10).expect("flush sent");
        assert!(
            flush_update == 1 && got[1] == (0x10, 0x10, 0x10, false),
            "set_flushed is sent before the timer: {got:?}"
        );
        let reply_at = got.iter().position(|u| u.3).expect("reply flag sent");
        assert_eq!(got.iter().filter(|u| u.3).count(), 1);
        assert!(
            got[..reply_at].contains(&(0x20, 0x10, 0x10, false)),
            "the timer reports the new written position: {got:?}"
        );
        assert_eq!(got[reply_at], (0x20, 0x10, 0x10, true));
        assert_eq!(
            *got.last().unwrap(),
            (0x20, 0x10, 0x10, false),
            "final update on stop"
        );
        assert_eq!(
            &raw[raw.len() - 5..],
            b"c\0\0\0\x04",
            "CopyDone ends the stream"
        );
    }

    #[tokio::test]
    async fn flush_updates_are_coalesced() {
        let writer = start_writer(Duration::from_secs(60));
        let h = &writer.handle;
        let started = std::time::Instant::now();
        for i in 1..=200u64 {
            h.set_flushed(DurableLsn::for_test(Lsn::new(i)));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let elapsed_ms = started.elapsed().as_millis() as usize;
        let (_, raw) = writer.stop().await;
        let got = updates(&raw);
        // Initial tick + at most one per 100 ms + the final update.
        assert!(
            got.len() <= 2 + elapsed_ms / 100 + 1,
            "{} updates in {elapsed_ms} ms",
            got.len()
        );
        assert!(got.len() < 50, "{} updates for 200 flushes", got.len());
        // The last flush reached the server before stop (not only in the final update).
        assert_eq!(got[got.len() - 2].1, 200);
    }

    #[tokio::test]
    async fn write_failure_is_parked_for_the_reader() {
        let (_h, state) = handle();
        let (client, server) = tokio::io::duplex(64);
        drop(server);
        let (_stop_tx, stop_rx) = oneshot::channel();
        let timing = FeedbackTiming {
            interval: Duration::from_millis(10),
            min_gap: Duration::from_millis(1),
        };
        let w = run_writer(client, "127.0.0.1:1".into(), state.clone(), timing, stop_rx).await;
        assert!(w.is_none());
        let e = state.take_failure().expect("failure parked");
        assert_eq!(e.disposition(), Disposition::Retry, "{e}");
    }
}
