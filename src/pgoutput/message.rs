//! The typed pgoutput messages of protocol versions 1 and 2.
//!
//! Field order and widths follow PostgreSQL's `logicalrep_write_*` functions
//! (src/backend/replication/logical/proto.c); the layout is given on each type.
//! Version 2 adds the streaming of in-progress transactions: Stream Start,
//! Stream Stop, Stream Commit and Stream Abort, and between a Stream Start and
//! its Stream Stop every Relation, Type, Insert, Update, Delete, Truncate and
//! Message carries the xid of the (sub)transaction that made it, right after
//! the tag ([`crate::pgoutput::decode_streamed`]).

use bytes::Bytes;

use crate::pg::{Lsn, PgTimestamp};

/// One decoded pgoutput message (one XLogData payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin(Begin),
    Commit(Commit),
    Origin(Origin),
    Relation(Relation),
    Type(TypeInfo),
    Insert(Insert),
    Update(Update),
    Delete(Delete),
    Truncate(Truncate),
    Message(LogicalMessage),
    StreamStart(StreamStart),
    StreamStop,
    StreamCommit(StreamCommit),
    StreamAbort(StreamAbort),
}

impl Message {
    /// The protocol tag byte of this message (`b'B'`, `b'I'`, ...).
    pub fn tag(&self) -> u8 {
        match self {
            Message::Begin(_) => tag::BEGIN,
            Message::Commit(_) => tag::COMMIT,
            Message::Origin(_) => tag::ORIGIN,
            Message::Relation(_) => tag::RELATION,
            Message::Type(_) => tag::TYPE,
            Message::Insert(_) => tag::INSERT,
            Message::Update(_) => tag::UPDATE,
            Message::Delete(_) => tag::DELETE,
            Message::Truncate(_) => tag::TRUNCATE,
            Message::Message(_) => tag::MESSAGE,
            Message::StreamStart(_) => tag::STREAM_START,
            Message::StreamStop => tag::STREAM_STOP,
            Message::StreamCommit(_) => tag::STREAM_COMMIT,
            Message::StreamAbort(_) => tag::STREAM_ABORT,
        }
    }
}

/// Message tags (`LogicalRepMsgType` in PostgreSQL's logicalproto.h) and the
/// markers used inside messages.
pub(crate) mod tag {
    pub(crate) const BEGIN: u8 = b'B';
    pub(crate) const COMMIT: u8 = b'C';
    pub(crate) const ORIGIN: u8 = b'O';
    pub(crate) const RELATION: u8 = b'R';
    pub(crate) const TYPE: u8 = b'Y';
    pub(crate) const INSERT: u8 = b'I';
    pub(crate) const UPDATE: u8 = b'U';
    pub(crate) const DELETE: u8 = b'D';
    pub(crate) const TRUNCATE: u8 = b'T';
    pub(crate) const MESSAGE: u8 = b'M';
    pub(crate) const STREAM_START: u8 = b'S';
    pub(crate) const STREAM_STOP: u8 = b'E';
    pub(crate) const STREAM_COMMIT: u8 = b'c';
    pub(crate) const STREAM_ABORT: u8 = b'A';

    /// Tags PostgreSQL only sends with proto_version 3 (two-phase, which the
    /// connector never asks for), each with what it is.
    pub(crate) const NOT_DECODED: [(u8, &str); 5] = [
        (b'b', "Begin Prepare (proto_version 3+)"),
        (b'P', "Prepare (proto_version 3+)"),
        (b'K', "Commit Prepared (proto_version 3+)"),
        (b'r', "Rollback Prepared (proto_version 3+)"),
        (b'p', "Stream Prepare (proto_version 3+)"),
    ];

    /// Tuple markers in Insert/Update/Delete.
    pub(crate) const NEW_TUPLE: u8 = b'N';
    pub(crate) const OLD_KEY: u8 = b'K';
    pub(crate) const OLD_FULL: u8 = b'O';

    /// TupleData column kinds.
    pub(crate) const COLUMN_NULL: u8 = b'n';
    pub(crate) const COLUMN_UNCHANGED_TOAST: u8 = b'u';
    pub(crate) const COLUMN_TEXT: u8 = b't';
    pub(crate) const COLUMN_BINARY: u8 = b'b';
}

/// `B`: Int64 final LSN, Int64 commit time, Int32 xid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// The LSN of the transaction's commit record (equals [`Commit::commit_lsn`]).
    pub final_lsn: Lsn,
    pub commit_time: PgTimestamp,
    pub xid: u32,
}

/// `C`: Int8 flags (unused, 0), Int64 commit LSN, Int64 end LSN, Int64 commit time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    pub flags: u8,
    /// The LSN of the commit record.
    pub commit_lsn: Lsn,
    /// The end of the commit record: a transaction's position for acknowledgement.
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// `S`: Int32 xid of the top-level transaction, Int8 1 for its first
/// segment (0 for a later one). Opens a block of that transaction's changes,
/// closed by Stream Stop; other transactions may be sent between blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStart {
    pub xid: u32,
    pub first_segment: bool,
}

/// `c`: Int32 xid, then the fields of a Commit. Sent outside any block, after
/// the transaction's last segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCommit {
    pub xid: u32,
    pub commit: Commit,
}

/// `A`: Int32 xid of the top-level transaction, Int32 xid of the aborted
/// (sub)transaction (the same for a top-level abort); with proto_version 4
/// and `streaming 'parallel'` also Int64 abort LSN and Int64 abort time,
/// which the connector never asks for and ignores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamAbort {
    pub xid: u32,
    pub subxid: u32,
}

impl StreamAbort {
    /// The whole transaction rolled back, not one of its subtransactions.
    pub fn is_top_level(&self) -> bool {
        self.xid == self.subxid
    }
}

/// `O`: Int64 commit LSN on the origin server, String origin name. Sent after
/// Begin for transactions that were replayed from a replication origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub commit_lsn: Lsn,
    pub name: String,
}

/// `R`: Int32 OID, String namespace, String name, Int8 replica identity,
/// Int16 column count, then per column Int8 flags, String name, Int32 type OID,
/// Int32 type modifier.
///
/// Sent before the first change of a relation in a stream and again after its
/// definition changed (ALTER TABLE): cache the latest by OID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    /// The schema; PostgreSQL sends `pg_catalog` as an empty string and the
    /// decoder restores the name.
    pub namespace: String,
    pub name: String,
    /// `relreplident`: `d` default (primary key), `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    /// The columns in tuple order (dropped and generated columns are not sent).
    pub columns: Vec<RelationColumn>,
}

impl Relation {
    /// A relation of `text` columns (type OID 25), replica identity default:
    /// for unit tests.
    #[cfg(test)]
    pub(crate) fn of_text(oid: u32, namespace: &str, name: &str, columns: &[&str]) -> Relation {
        Relation {
            oid,
            namespace: namespace.into(),
            name: name.into(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .map(|c| RelationColumn {
                    flags: 0,
                    name: (*c).into(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    /// Position of the column called `name` (exact, case-sensitive match).
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// `namespace.name`, unquoted.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }

    /// The value of column `column` in a tuple of this relation; `None` when the
    /// relation has no such column or the tuple is shorter than the relation.
    pub fn value<'a>(&self, tuple: &'a TupleData, column: &str) -> Option<&'a ColumnValue> {
        tuple.columns.get(self.column_index(column)?)
    }
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Bit 0: the column is part of the replica identity (the key).
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    /// `atttypmod`, e.g. `VARHDRSZ + 40` for `varchar(40)`; -1 when none.
    pub type_modifier: i32,
}

impl RelationColumn {
    /// Whether the column is part of the relation's replica identity.
    pub fn is_key(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// `Y`: Int32 type OID, String namespace, String name. Sent before a Relation
/// that has a column of a non-built-in type; for a domain the names are those
/// of its base type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeInfo {
    pub oid: u32,
    /// As for [`Relation::namespace`], `pg_catalog` is restored from "".
    pub namespace: String,
    pub name: String,
}

/// `I`: Int32 relation OID, Byte1 `N`, TupleData.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    pub relation_oid: u32,
    pub new: TupleData,
}

/// `U`: Int32 relation OID, optionally Byte1 `K` or `O` and the old TupleData,
/// then Byte1 `N` and the new TupleData.
///
/// The old part is present only when the replica identity changed (`K`, key
/// columns only; the other columns are sent as nulls) or the relation has
/// REPLICA IDENTITY FULL (`O`, the whole old row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub relation_oid: u32,
    pub old: Option<OldTuple>,
    pub new: TupleData,
}

/// The old row of an Update or Delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `K`: the replica identity columns.
    Key(TupleData),
    /// `O`: the whole old row (REPLICA IDENTITY FULL).
    Full(TupleData),
}

impl OldTuple {
    pub fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

/// `D`: Int32 relation OID, Byte1 `K` or `O`, TupleData.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    pub relation_oid: u32,
    pub old: OldTuple,
}

/// `T`: Int32 relation count, Int8 options, Int32 OID per relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Bit 0: CASCADE; bit 1: RESTART IDENTITY.
    pub options: u8,
    pub relation_oids: Vec<u32>,
}

impl Truncate {
    pub fn cascade(&self) -> bool {
        self.options & 1 != 0
    }

    pub fn restart_identity(&self) -> bool {
        self.options & 2 != 0
    }
}

/// `M`: Int8 flags (bit 0: transactional), Int64 LSN, String prefix,
/// Int32 length, content bytes. Sent only with `messages 'true'`.
///
/// A transactional message arrives between Begin and Commit and only if the
/// transaction committed; a non-transactional one arrives on its own, at once,
/// whatever becomes of the transaction that emitted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalMessage {
    pub transactional: bool,
    /// The end of the message's WAL record (what `pg_logical_emit_message`
    /// returned); for the last change of a transaction it equals the commit LSN.
    pub lsn: Lsn,
    pub prefix: String,
    /// Arbitrary bytes, a slice of the decoded payload.
    pub content: Bytes,
}

/// TupleData: Int16 column count, then per column a kind byte and, for `t` and
/// `b`, an Int32 length and the value bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TupleData {
    pub columns: Vec<ColumnValue>,
}

impl TupleData {
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<&ColumnValue> {
        self.columns.get(index)
    }
}

/// One column of a TupleData.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    /// `n`
    Null,
    /// `u`: a value stored out of line (TOAST) that the change did not modify;
    /// its content is not sent.
    UnchangedToast,
    /// `t`: the type's text output, a slice of the decoded payload.
    Text(Bytes),
    /// `b`: the type's binary send format (only with the `binary` option).
    Binary(Bytes),
}

impl ColumnValue {
    pub fn is_null(&self) -> bool {
        matches!(self, ColumnValue::Null)
    }

    pub fn is_unchanged_toast(&self) -> bool {
        matches!(self, ColumnValue::UnchangedToast)
    }

    /// The raw bytes of a text or binary value.
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            ColumnValue::Text(b) | ColumnValue::Binary(b) => Some(b),
            ColumnValue::Null | ColumnValue::UnchangedToast => None,
        }
    }

    /// A text value as `&str`; `None` for other kinds and for text that is not
    /// UTF-8 (possible when the database encoding is not UTF-8).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            ColumnValue::Text(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
}
