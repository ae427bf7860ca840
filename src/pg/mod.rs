//! Everything that talks to PostgreSQL.
//!
//! - `config`: the connection string, parsed once, used by both connections.
//! - `connect` / `tls` / `auth`: socket, sslmode, startup and authentication.
//! - `wire` / `codec`: message framing; XLogData, keepalive, status update.
//! - `replication` / `feedback`: IDENTIFY_SYSTEM, START_REPLICATION, the stream
//!   and the standby status updates sent from their own task.
//! - `control`: slot and publication SQL on a tokio-postgres client.
//! - `error`: `PgError` and the one SQLSTATE classification table; below it
//!   `malformed` (`Tag`, `WireError`) and `sslmode`, which its variants carry.
//!
//! LSN rules kept here (DESIGN.md §5): the flushed position reported to the
//! server only comes from the caller (`FeedbackHandle::set_flushed`), and only
//! as a [`DurableLsn`], which only the offset store can make; reported
//! positions never move backwards, and written >= flushed.

mod auth;
mod codec;
mod config;
mod connect;
pub mod control;
pub(crate) mod cursor;
mod error;
mod feedback;
mod ident;
pub mod lsn;
mod malformed;
mod replication;
mod sslmode;
pub mod time;
mod tls;
mod wire;

pub use codec::ReplicationEvent;
pub use config::{
    AuthMethod, AuthSettings, ChannelBinding, PgConnectConfig, RequireAuth, SslMode, TlsSettings,
};
pub use control::SlotInfo;
pub use error::{PgError, ServerError, sql_error_is_retryable};
pub use feedback::FeedbackHandle;
pub use ident::{QualifiedTable, quote_ident};
pub use lsn::{DurableLsn, EventPosition, Lsn};
pub use replication::{
    ReplicationConnection, ReplicationStream, StartOptions, StreamOptions, SystemIdentity,
};
pub use time::PgTimestamp;
pub use wire::{Tag, WireError};

impl PgConnectConfig {
    /// A tokio-postgres client for control SQL, over the same transport,
    /// hosts and TLS policy as the replication connection. Its connection
    /// task is spawned on the current runtime.
    pub async fn connect_sql(&self) -> Result<tokio_postgres::Client, PgError> {
        connect::connect_sql(self).await
    }
}
