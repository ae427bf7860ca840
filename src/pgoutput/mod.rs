//! The pgoutput logical replication protocol, version 1: a pure decoder and a
//! relation cache. No I/O, no async.
//!
//! Each XLogData payload of a logical replication stream started with
//! `proto_version '1'` is exactly one pgoutput message; [`decode`] turns it into
//! a [`Message`]. Protocol facts (PostgreSQL's proto.c and pgoutput.c):
//! - all integers are big-endian; strings are NUL-terminated;
//! - a committed transaction arrives as Begin, its changes (with Relation and
//!   Type messages before the first change that needs them), Commit; rolled
//!   back transactions are never sent;
//! - Insert/Update/Delete name their relation only by OID: keep the latest
//!   Relation per OID in a [`RelationCache`] (a table altered mid-stream is
//!   described again before its next change);
//! - version 1 never sends the streaming or two-phase messages; they are
//!   rejected as [`DecodeErrorKind::Unsupported`].

mod decode;
mod error;
mod message;
mod reader;
mod relation_cache;

#[cfg(test)]
pub(crate) mod encode;
#[cfg(test)]
mod proptests;

pub use decode::decode;
pub use error::{BadString, DecodeError, DecodeErrorKind};
pub(crate) use message::tag;
pub use message::{
    Begin, ColumnValue, Commit, Delete, Insert, LogicalMessage, Message, OldTuple, Origin,
    Relation, RelationColumn, Truncate, TupleData, TypeInfo, Update,
};
pub use relation_cache::RelationCache;
