//! The one question every error answers for the reconnect loop and the
//! poison policy: what now?
//!
//! Each error type decides its disposition in one `disposition()` method;
//! callers match on the answer and never re-derive it from variants or codes.

/// What the relay does about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// A new session (after a backoff) may succeed: the connection, the
    /// broker or the producer failed, not the data or the configuration.
    /// The session resumes from the durable acked LSN.
    Retry,
    /// This one record can never be accepted while others may be: the
    /// poison policy (`outbox.on_poison`) decides between stopping and the
    /// dead-letter topic.
    RecordRefused,
    /// Retrying cannot help: an operator must act (the error says how).
    Stop,
}
