//! Errors from talking to PostgreSQL, and the one place where SQLSTATEs are
//! classified into "a retry can cure this" and "a person must act", and where
//! the answer to a slot command becomes `SlotActive` (with the holder's PID),
//! `SlotMissing` or `SlotExists` (`PgError::from_slot_response`).
//!
//! The pipeline decides whether to reconnect from [`PgError::disposition`],
//! never from message text.

use std::fmt;
use std::time::Duration;

use super::Lsn;
use super::malformed::{Tag, WireError};
use super::sslmode::SslMode;
use crate::Disposition;

/// The fields of a PostgreSQL ErrorResponse that matter to us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    /// Non-localized severity (`ERROR`, `FATAL`, `PANIC`) when the server sent one.
    pub severity: String,
    /// The five-character SQLSTATE.
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.code, self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " (detail: {detail})")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, " (hint: {hint})")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong on a replication or control connection.
///
/// `addr` is always `host:port` (or the socket path); it never contains a password.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("invalid connection setting {key}: {message}")]
    Config { key: String, message: String },

    #[error("{action} {addr} failed: {source}")]
    Io {
        action: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },

    #[error("connection to {addr} closed by the server while {during}")]
    Closed { addr: String, during: &'static str },

    #[error("timed out after {after:?} while {during} ({addr})")]
    Timeout {
        addr: String,
        during: &'static str,
        after: Duration,
    },

    #[error("server does not support TLS (sslmode={mode}) at {addr}")]
    TlsUnsupported { addr: String, mode: SslMode },

    #[error("TLS with {addr} failed (sslmode={mode}): {message}")]
    Tls {
        addr: String,
        mode: SslMode,
        message: String,
    },

    #[error("authentication of user {user:?} at {addr} failed: {reason}")]
    Auth {
        user: String,
        addr: String,
        reason: String,
        /// SQLSTATE when the server rejected us (28P01, 28000), `None` for a
        /// local failure such as a missing password.
        code: Option<String>,
    },

    #[error("replication slot {slot:?} is active for PID {}", display_pid(*.pid))]
    SlotActive {
        slot: String,
        /// The holder's PID as the server reported it; `None` if the message
        /// had an unexpected shape.
        pid: Option<i32>,
        server: Box<ServerError>,
    },

    #[error("replication slot {slot:?} does not exist")]
    SlotMissing {
        slot: String,
        server: Box<ServerError>,
    },

    #[error("replication slot {slot:?} already exists")]
    SlotExists {
        slot: String,
        server: Box<ServerError>,
    },

    #[error("server at {addr} failed {during}: {server}")]
    Server {
        addr: String,
        during: String,
        server: Box<ServerError>,
    },

    #[error("{during} failed: {source}")]
    Sql {
        during: String,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error("malformed message from {addr} while {during}: {source}")]
    Protocol {
        addr: String,
        during: String,
        #[source]
        source: WireError,
    },

    #[error("malformed replication message from {addr} after LSN {after}: {source}")]
    Replication {
        addr: String,
        after: Lsn,
        #[source]
        source: WireError,
    },

    #[error("unexpected message {tag} from {addr} while {during}")]
    Unexpected {
        addr: String,
        during: &'static str,
        tag: Tag,
    },

    #[error("unexpected reply from {addr} to {command}: {message}")]
    BadReply {
        addr: String,
        command: &'static str,
        message: String,
    },

    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("{what}: {message}")]
    Internal { what: &'static str, message: String },

    /// No host of the list is the kind `target_session_attrs` asks for (during
    /// a failover: the old primary is down and the standby not yet promoted).
    #[error(
        "no server fits target_session_attrs={wanted}: the last one tried, {addr}, is {got}; retrying \
         (a failover in progress ends when a standby is promoted)"
    )]
    WrongServerKind {
        addr: String,
        wanted: &'static str,
        got: &'static str,
    },
}

/// The PID that ends the server's "is active for PID n" message; `None` when
/// the message has another shape (e.g. translated by `lc_messages`).
fn holder_pid(message: &str) -> Option<i32> {
    message.rsplit(' ').next().and_then(|p| p.parse().ok())
}

fn display_pid(pid: Option<i32>) -> String {
    pid.map_or_else(|| "unknown".to_owned(), |p| p.to_string())
}

impl PgError {
    /// Whether reconnecting (with backoff) can cure this error: the one place
    /// that decides. A PostgreSQL error never refuses a single record.
    pub fn disposition(&self) -> Disposition {
        let retry = match self {
            PgError::Io { .. } | PgError::Closed { .. } | PgError::Timeout { .. } => true,
            // The slot is the HA lock: another instance holds it, and may let go.
            PgError::SlotActive { .. } => true,
            PgError::WrongServerKind { .. } => true,
            PgError::Server { server, .. } => sqlstate_is_retryable(&server.code),
            PgError::Sql { source, .. } => sql_error_is_retryable(source),
            PgError::Config { .. }
            | PgError::TlsUnsupported { .. }
            | PgError::Tls { .. }
            | PgError::Auth { .. }
            | PgError::SlotMissing { .. }
            | PgError::SlotExists { .. }
            | PgError::Protocol { .. }
            | PgError::Replication { .. }
            | PgError::Unexpected { .. }
            | PgError::BadReply { .. }
            | PgError::Encode { .. }
            | PgError::Internal { .. } => false,
        };
        if retry {
            Disposition::Retry
        } else {
            Disposition::Stop
        }
    }

    /// The SQLSTATE the server sent, if this error came from the server.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            PgError::Auth { code, .. } => code.as_deref(),
            PgError::SlotActive { server, .. }
            | PgError::SlotMissing { server, .. }
            | PgError::SlotExists { server, .. }
            | PgError::Server { server, .. } => Some(&server.code),
            PgError::Sql { source, .. } => source.code().map(|c| c.code()),
            _ => None,
        }
    }

    /// A server error of class 28 (invalid authorization specification:
    /// wrong password, no pg_hba.conf entry) is [`PgError::Auth`] for `user`
    /// at `addr`; any other code is `None`.
    pub(crate) fn auth_refusal(
        user: &str,
        addr: &str,
        code: &str,
        message: &str,
    ) -> Option<PgError> {
        code.starts_with("28").then(|| PgError::Auth {
            user: user.to_owned(),
            addr: addr.to_owned(),
            reason: message.to_owned(),
            code: Some(code.to_owned()),
        })
    }

    /// What the server's ErrorResponse to a command on replication slot
    /// `slot` means: the slot SQLSTATEs become their variants, and any other
    /// is `otherwise(server)`. Both the control connection's SQL functions and
    /// the replication commands answer with these codes.
    pub(crate) fn from_slot_response(
        slot: &str,
        server: ServerError,
        otherwise: impl FnOnce(ServerError) -> PgError,
    ) -> PgError {
        let slot = slot.to_owned();
        match server.code.as_str() {
            // object_in_use: "replication slot \"s\" is active for PID 1234".
            "55006" => PgError::SlotActive {
                slot,
                pid: holder_pid(&server.message),
                server: Box::new(server),
            },
            // undefined_object
            "42704" => PgError::SlotMissing {
                slot,
                server: Box::new(server),
            },
            // duplicate_object
            "42710" => PgError::SlotExists {
                slot,
                server: Box::new(server),
            },
            _ => otherwise(server),
        }
    }

    /// Wraps a tokio-postgres error from the control connection, naming what
    /// was being done.
    pub(crate) fn sql(during: impl Into<String>, source: tokio_postgres::Error) -> PgError {
        PgError::Sql {
            during: during.into(),
            source,
        }
    }
}

/// The single SQLSTATE table.
///
/// Retryable: connection exceptions (class 08), insufficient resources (class
/// 53, e.g. 53300 too many connections), operator intervention (57P01 admin
/// shutdown, 57P02 crash shutdown, 57P03 cannot connect now, 57014 canceled),
/// 55006 object in use (a slot held by another backend), and serialization
/// failures/deadlocks (40001, 40P01).
/// Everything else is definite, notably 28P01/28000 (authentication), 42704
/// (undefined object), 42501 (privilege), 55000 (e.g. wal_level not logical),
/// 3D000 (no such database).
pub(crate) fn sqlstate_is_retryable(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "57014" | "55006" | "40001" | "40P01"
        )
}

/// Whether a failed statement may succeed if tried again: a retryable
/// SQLSTATE ([`sqlstate_is_retryable`]), a closed connection, or no SQLSTATE
/// with an I/O error underneath. Also the reference consumer's rule.
pub fn sql_error_is_retryable(e: &tokio_postgres::Error) -> bool {
    if let Some(code) = e.code() {
        return sqlstate_is_retryable(code.code());
    }
    if e.is_closed() {
        return true;
    }
    // Without a SQLSTATE, only an I/O failure underneath is a lost connection;
    // anything else (type conversion, bad configuration) will fail again.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str) -> ServerError {
        ServerError {
            severity: "FATAL".into(),
            code: code.into(),
            message: "m".into(),
            detail: None,
            hint: None,
        }
    }

    #[test]
    fn classifies_sqlstates() {
        for code in [
            "08006", "08001", "57P01", "57P03", "53300", "55006", "40001",
        ] {
            assert!(sqlstate_is_retryable(code), "{code} should be retryable");
        }
        for code in [
            "28P01", "28000", "42704", "55000", "42501", "3D000", "42710", "XX000",
        ] {
            assert!(!sqlstate_is_retryable(code), "{code} should be definite");
        }
    }

    #[test]
    fn slot_responses_become_slot_variants() {
        let answer = |code: &str, message: &str| {
            let mut server = server(code);
            server.message = message.into();
            PgError::from_slot_response("s", server, |server| PgError::Server {
                addr: "a".into(),
                during: "d".into(),
                server: Box::new(server),
            })
        };
        let active = answer("55006", "replication slot \"s\" is active for PID 4242");
        assert!(
            matches!(&active, PgError::SlotActive { slot, pid: Some(4242), .. } if slot == "s")
        );
        assert_eq!(active.disposition(), Disposition::Retry);
        assert!(matches!(
            answer("55006", "le slot est actif"),
            PgError::SlotActive { pid: None, .. }
        ));
        assert!(matches!(
            answer("42704", "replication slot \"s\" does not exist"),
            PgError::SlotMissing { .. }
        ));
        assert!(matches!(
            answer("42710", "replication slot \"s\" already exists"),
            PgError::SlotExists { .. }
        ));
        let other = answer("55000", "x");
        assert!(matches!(&other, PgError::Server { server, .. } if server.code == "55000"));
    }

    #[test]
    fn classifies_variants() {
        let addr = "127.0.0.1:5432".to_owned();
        let e = PgError::Server {
            addr: addr.clone(),
            during: "x".into(),
            server: Box::new(server("57P01")),
        };
        assert_eq!(e.disposition(), Disposition::Retry);
        assert_eq!(e.sqlstate(), Some("57P01"));
        let e = PgError::Auth {
            user: "u".into(),
            addr: addr.clone(),
            reason: "r".into(),
            code: Some("28P01".into()),
        };
        assert_eq!(e.disposition(), Disposition::Stop);
        let e = PgError::TlsUnsupported {
            addr,
            mode: SslMode::Require,
        };
        assert_eq!(e.disposition(), Disposition::Stop);
        assert_eq!(
            e.to_string(),
            "server does not support TLS (sslmode=require) at 127.0.0.1:5432"
        );
        let e = PgError::SlotActive {
            slot: "s".into(),
            pid: Some(42),
            server: Box::new(server("55006")),
        };
        assert_eq!(e.disposition(), Disposition::Retry);
        assert_eq!(e.to_string(), "replication slot \"s\" is active for PID 42");
    }
}
