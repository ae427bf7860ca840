//! The pgoutput logical replication protocol, versions 1 and 2: a pure
//! decoder and a relation cache. No I/O, no async.
//!
//! Each XLogData payload of a logical replication stream is exactly one
//! pgoutput message; [`decode`] turns it into
//! a [`Message`]. Protocol facts (PostgreSQL's proto.c and pgoutput.c):
//! - all integers are big-endian; strings are NUL-terminated;
//! - a committed transaction arrives as Begin, its changes (with Relation and
//!   Type messages before the first change that needs them), Commit; rolled
//!   back transactions are never sent;
//! - Insert/Update/Delete name their relation only by OID: keep the latest
//!   Relation per OID in a [`RelationCache`] (a table altered mid-stream is
//!   described again before its next change);
//! - with version 2 and `streaming 'on'` (PostgreSQL 14+), a transaction
//!   larger than the server's logical_decoding_work_mem is sent while in
//!   progress, in blocks (Stream Start .. Stream Stop) between which other
//!   transactions arrive whole; inside a block each change carries its
//!   (sub)transaction's xid ([`decode_streamed`]); Stream Commit or Stream
//!   Abort ends it, the abort possibly of one subtransaction only;
//! - the two-phase messages are never asked for; they are rejected as
//!   [`DecodeErrorKind::Unsupported`].

mod decode;
mod error;
mod message;
mod reader;
mod relation_cache;

#[cfg(test)]
pub(crate) mod encode;
#[cfg(test)]
mod proptests;

pub use decode::{Streamed, decode, decode_streamed};
pub use error::{BadString, DecodeError, DecodeErrorKind};
pub(crate) use message::tag;
pub use message::{
    Begin, ColumnValue, Commit, Delete, Insert, LogicalMessage, Message, OldTuple, Origin,
    Relation, RelationColumn, StreamAbort, StreamCommit, StreamStart, Truncate, TupleData,
    TypeInfo, Update,
};
pub use relation_cache::RelationCache;
