//! Everything that talks to PostgreSQL: the LSN type, wire timestamps, and
//! (added by the source work) the replication transport and control SQL.

pub mod lsn;
pub mod time;

pub use lsn::Lsn;
pub use time::PgTimestamp;
