//! Bytes of one pgoutput message in, one typed [`Message`] out.

use bytes::Bytes;

use super::error::{DecodeError, DecodeErrorKind};
use super::message::{
    Begin, ColumnValue, Commit, Delete, Insert, LogicalMessage, Message, OldTuple, Origin,
    Relation, RelationColumn, StreamAbort, StreamCommit, StreamStart, Truncate, TupleData,
    TypeInfo, Update, tag,
};
use super::reader::Reader;
use crate::pg::PgTimestamp;

/// Smallest encoding of one Relation column: flags, empty name's NUL, type OID,
/// type modifier.
const MIN_RELATION_COLUMN_LEN: usize = 1 + 1 + 4 + 4;
/// Smallest encoding of one TupleData column: the kind byte alone (`n`, `u`).
const MIN_TUPLE_COLUMN_LEN: usize = 1;
const OID_LEN: usize = 4;

/// Decodes one pgoutput message read outside a streamed block: the payload of
/// one XLogData.
///
/// Text and binary column values and message content are slices of `data`
/// (no copy). The whole payload must be one message: leftover bytes are an
/// error. Never panics, whatever the input.
pub fn decode(data: &Bytes) -> Result<Message, DecodeError> {
    let mut r = Reader::new(data);
    let tag = r.tag()?;
    let message = body(&mut r, tag)?;
    r.finish()?;
    Ok(message)
}

/// A message read between Stream Start and Stream Stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    /// The (sub)transaction that made the change; `None` for the messages
    /// that carry none (Origin, Stream Stop, and those not allowed here,
    /// which the caller refuses).
    pub xid: Option<u32>,
    pub message: Message,
}

/// Decodes one pgoutput message read inside a streamed block, where changes,
/// Relation and Type messages carry the xid of their (sub)transaction.
pub fn decode_streamed(data: &Bytes) -> Result<Streamed, DecodeError> {
    let mut r = Reader::new(data);
    let tag = r.tag()?;
    let xid = match tag {
        tag::RELATION
        | tag::TYPE
        | tag::INSERT
        | tag::UPDATE
        | tag::DELETE
        | tag::TRUNCATE
        | tag::MESSAGE => Some(r.u32("xid")?),
        _ => None,
    };
    let message = body(&mut r, tag)?;
    r.finish()?;
    Ok(Streamed { xid, message })
}

/// The fields after the tag (and after a streamed change's xid).
fn body(r: &mut Reader<'_>, tag: u8) -> Result<Message, DecodeError> {
    Ok(match tag {
        tag::BEGIN => Message::Begin(begin(r)?),
        tag::COMMIT => Message::Commit(commit(r)?),
        tag::ORIGIN => Message::Origin(origin(r)?),
        tag::RELATION => Message::Relation(relation(r)?),
        tag::TYPE => Message::Type(type_info(r)?),
        tag::INSERT => Message::Insert(insert(r)?),
        tag::UPDATE => Message::Update(update(r)?),
        tag::DELETE => Message::Delete(delete(r)?),
        tag::TRUNCATE => Message::Truncate(truncate(r)?),
        tag::MESSAGE => Message::Message(logical_message(r)?),
        tag::STREAM_START => Message::StreamStart(StreamStart {
            xid: r.u32("xid")?,
            first_segment: r.u8("first segment")? == 1,
        }),
        tag::STREAM_STOP => Message::StreamStop,
        tag::STREAM_COMMIT => Message::StreamCommit(StreamCommit {
            xid: r.u32("xid")?,
            commit: commit(r)?,
        }),
        tag::STREAM_ABORT => {
            let abort = StreamAbort {
                xid: r.u32("xid")?,
                subxid: r.u32("subtransaction xid")?,
            };
            // proto_version 4 (streaming 'parallel') adds the abort's LSN and time.
            if r.remaining() == 16 {
                r.lsn("abort LSN")?;
                r.i64("abort time")?;
            }
            Message::StreamAbort(abort)
        }
        other => {
            let kind = match tag::NOT_DECODED.iter().find(|(t, _)| *t == other) {
                Some((_, what)) => DecodeErrorKind::Unsupported(what),
                None => DecodeErrorKind::UnknownTag,
            };
            return Err(r.error_at(0, "message tag", kind));
        }
    })
}

fn begin(r: &mut Reader<'_>) -> Result<Begin, DecodeError> {
    Ok(Begin {
        final_lsn: r.lsn("final LSN")?,
        commit_time: PgTimestamp(r.i64("commit time")?),
        xid: r.u32("xid")?,
    })
}

fn commit(r: &mut Reader<'_>) -> Result<Commit, DecodeError> {
    Ok(Commit {
        flags: r.u8("commit flags")?,
        commit_lsn: r.lsn("commit LSN")?,
        end_lsn: r.lsn("end LSN")?,
        commit_time: PgTimestamp(r.i64("commit time")?),
    })
}

fn origin(r: &mut Reader<'_>) -> Result<Origin, DecodeError> {
    Ok(Origin {
        commit_lsn: r.lsn("origin commit LSN")?,
        name: r.cstring("origin name")?,
    })
}

/// PostgreSQL writes the `pg_catalog` namespace as an empty string.
fn namespace(r: &mut Reader<'_>, field: &'static str) -> Result<String, DecodeError> {
    let name = r.cstring(field)?;
    Ok(if name.is_empty() {
        "pg_catalog".to_owned()
    } else {
        name
    })
}

fn relation(r: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let oid = r.u32("relation oid")?;
    let namespace = namespace(r, "relation namespace")?;
    let name = r.cstring("relation name")?;
    let replica_identity = r.u8("replica identity")?;
    let count = usize::from(r.u16("column count")?);
    let mut columns = Vec::with_capacity(count.min(r.remaining() / MIN_RELATION_COLUMN_LEN));
    for _ in 0..count {
        columns.push(RelationColumn {
            flags: r.u8("column flags")?,
            name: r.cstring("column name")?,
            type_oid: r.u32("column type oid")?,
            type_modifier: r.i32("column type modifier")?,
        });
    }
    Ok(Relation {
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn type_info(r: &mut Reader<'_>) -> Result<TypeInfo, DecodeError> {
    Ok(TypeInfo {
        oid: r.u32("type oid")?,
        namespace: namespace(r, "type namespace")?,
        name: r.cstring("type name")?,
    })
}

fn insert(r: &mut Reader<'_>) -> Result<Insert, DecodeError> {
    let relation_oid = r.u32("relation oid")?;
    expect_new_tuple_marker(r)?;
    Ok(Insert {
        relation_oid,
        new: tuple_data(r)?,
    })
}

fn update(r: &mut Reader<'_>) -> Result<Update, DecodeError> {
    let relation_oid = r.u32("relation oid")?;
    let old = match r.u8("tuple marker")? {
        tag::NEW_TUPLE => None,
        tag::OLD_KEY => Some(OldTuple::Key(old_then_new_marker(r)?)),
        tag::OLD_FULL => Some(OldTuple::Full(old_then_new_marker(r)?)),
        other => {
            return Err(r.error_behind(
                1,
                "tuple marker",
                DecodeErrorKind::UnknownOldTupleKind(other),
            ));
        }
    };
    Ok(Update {
        relation_oid,
        old,
        new: tuple_data(r)?,
    })
}

/// The old tuple of an Update, and the `N` that must follow it.
fn old_then_new_marker(r: &mut Reader<'_>) -> Result<TupleData, DecodeError> {
    let old = tuple_data(r)?;
    expect_new_tuple_marker(r)?;
    Ok(old)
}

fn delete(r: &mut Reader<'_>) -> Result<Delete, DecodeError> {
    let relation_oid = r.u32("relation oid")?;
    let old = match r.u8("old tuple marker")? {
        tag::OLD_KEY => OldTuple::Key(tuple_data(r)?),
        tag::OLD_FULL => OldTuple::Full(tuple_data(r)?),
        other => {
            return Err(r.error_behind(
                1,
                "old tuple marker",
                DecodeErrorKind::UnknownOldTupleKind(other),
            ));
        }
    };
    Ok(Delete { relation_oid, old })
}

fn expect_new_tuple_marker(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    match r.u8("new tuple marker")? {
        tag::NEW_TUPLE => Ok(()),
        other => Err(r.error_behind(
            1,
            "new tuple marker",
            DecodeErrorKind::MissingNewTuple(other),
        )),
    }
}

fn tuple_data(r: &mut Reader<'_>) -> Result<TupleData, DecodeError> {
    let count = usize::from(r.u16("tuple column count")?);
    let mut columns = Vec::with_capacity(count.min(r.remaining() / MIN_TUPLE_COLUMN_LEN));
    for _ in 0..count {
        let value = match r.u8("tuple column kind")? {
            tag::COLUMN_NULL => ColumnValue::Null,
            tag::COLUMN_UNCHANGED_TOAST => ColumnValue::UnchangedToast,
            tag::COLUMN_TEXT => {
                let len = r.len_i32("column value length")?;
                ColumnValue::Text(r.bytes(len, "column value")?)
            }
            tag::COLUMN_BINARY => {
                let len = r.len_i32("column value length")?;
                ColumnValue::Binary(r.bytes(len, "column value")?)
            }
            other => {
                return Err(r.error_behind(
                    1,
                    "tuple column kind",
                    DecodeErrorKind::UnknownTupleKind(other),
                ));
            }
        };
        columns.push(value);
    }
    Ok(TupleData { columns })
}

fn truncate(r: &mut Reader<'_>) -> Result<Truncate, DecodeError> {
    let count = r.len_i32("relation count")?;
    let options = r.u8("truncate options")?;
    let mut relation_oids = Vec::with_capacity(count.min(r.remaining() / OID_LEN));
    for _ in 0..count {
        relation_oids.push(r.u32("relation oid")?);
    }
    Ok(Truncate {
        options,
        relation_oids,
    })
}

fn logical_message(r: &mut Reader<'_>) -> Result<LogicalMessage, DecodeError> {
    let flags = r.u8("message flags")?;
    let lsn = r.lsn("message LSN")?;
    let prefix = r.cstring("message prefix")?;
    let len = r.len_i32("message content length")?;
    Ok(LogicalMessage {
        transactional: flags & 1 != 0,
        lsn,
        prefix,
        content: r.bytes(len, "message content")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::Lsn;
    use crate::pgoutput::BadString;

    fn bytes(parts: &[&[u8]]) -> Bytes {
        Bytes::from(parts.concat())
    }

    fn ok(parts: &[&[u8]]) -> Message {
        decode(&bytes(parts)).unwrap_or_else(|e| panic!("decode failed: {e}"))
    }

    fn err(parts: &[&[u8]]) -> DecodeError {
        match decode(&bytes(parts)) {
            Ok(m) => panic!("decoded {m:?}, expected an error"),
            Err(e) => e,
        }
    }

    fn truncated(needed: usize, available: usize) -> DecodeErrorKind {
        DecodeErrorKind::Truncated { needed, available }
    }

    fn text(s: &str) -> ColumnValue {
        ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    const LSN_A: [u8; 8] = [0, 0, 0, 1, 0x53, 0x82, 0x78, 0x00];
    const LSN_B: [u8; 8] = [0, 0, 0, 1, 0x53, 0x82, 0x78, 0x30];
    const TIME: [u8; 8] = [0x00, 0x03, 0x04, 0x78, 0x4e, 0x9c, 0xa7, 0x36];
    const OID: [u8; 4] = [0, 0, 0x40, 0x09];

    #[test]
    fn begin() {
        let m = ok(&[b"B", &LSN_A, &TIME, &[0, 0, 2, 0xdc]]);
        assert_eq!(
            m,
            Message::Begin(Begin {
                final_lsn: Lsn::new(0x1_5382_7800),
                commit_time: PgTimestamp(0x0003_0478_4e9c_a736),
                xid: 732,
            })
        );
        assert_eq!(m.tag(), b'B');
    }

    #[test]
    fn commit() {
        let m = ok(&[b"C", &[0], &LSN_A, &LSN_B, &TIME]);
        assert_eq!(
            m,
            Message::Commit(Commit {
                flags: 0,
                commit_lsn: Lsn::new(0x1_5382_7800),
                end_lsn: Lsn::new(0x1_5382_7830),
                commit_time: PgTimestamp(0x0003_0478_4e9c_a736),
            })
        );
    }

    #[test]
    fn origin() {
        let m = ok(&[b"O", &LSN_B, b"pg_16395\0"]);
        assert_eq!(
            m,
            Message::Origin(Origin {
                commit_lsn: Lsn::new(0x1_5382_7830),
                name: "pg_16395".to_owned(),
            })
        );
    }

    #[test]
    fn relation() {
        let m = ok(&[
            b"R",
            &OID,
            b"app\0accounts\0",
            b"d",
            &[0, 2],
            &[1],
            b"id\0",
            &[0, 0, 0, 23],
            &[0xff, 0xff, 0xff, 0xff],
            &[0],
            b"name\0",
            &[0, 0, 4, 0x13],
            &[0, 0, 0, 44],
        ]);
        let Message::Relation(rel) = m else {
            panic!("not a relation: {m:?}")
        };
        assert_eq!(rel.oid, 0x4009);
        assert_eq!(rel.namespace, "app");
        assert_eq!(rel.name, "accounts");
        assert_eq!(rel.qualified_name(), "app.accounts");
        assert_eq!(rel.replica_identity, b'd');
        assert_eq!(
            rel.columns,
            vec![
                RelationColumn {
                    flags: 1,
                    name: "id".to_owned(),
                    type_oid: 23,
                    type_modifier: -1,
                },
                RelationColumn {
                    flags: 0,
                    name: "name".to_owned(),
                    type_oid: 1043,
                    type_modifier: 44,
                },
            ]
        );
        assert!(rel.columns[0].is_key());
        assert!(!rel.columns[1].is_key());
        assert_eq!(rel.column_index("name"), Some(1));
    }

    #[test]
    fn empty_namespace_means_pg_catalog() {
        let Message::Relation(rel) = ok(&[b"R", &OID, b"\0t\0", b"n", &[0, 0]]) else {
            panic!("not a relation")
        };
        assert_eq!(rel.namespace, "pg_catalog");
        assert!(rel.columns.is_empty());
        let Message::Type(ty) = ok(&[b"Y", &[0, 0, 0x40, 2], b"\0mood\0"]) else {
            panic!("not a type")
        };
        assert_eq!(ty.namespace, "pg_catalog");
    }

    #[test]
    fn type_info() {
        let m = ok(&[b"Y", &[0, 0, 0x40, 2], b"app\0mood\0"]);
        assert_eq!(
            m,
            Message::Type(TypeInfo {
                oid: 0x4002,
                namespace: "app".to_owned(),
                name: "mood".to_owned(),
            })
        );
    }

    #[test]
    fn insert_with_every_column_kind() {
        let input = bytes(&[
            b"I",
            &OID,
            b"N",
            &[0, 4],
            b"t",
            &[0, 0, 0, 5],
            b"alice",
            b"n",
            b"u",
            b"b",
            &[0, 0, 0, 2],
            &[0, 0xff],
        ]);
        let m = decode(&input).expect("decodes");
        let Message::Insert(ins) = &m else {
            panic!("not an insert: {m:?}")
        };
        assert_eq!(ins.relation_oid, 0x4009);
        assert_eq!(
            ins.new.columns,
            vec![
                text("alice"),
                ColumnValue::Null,
                ColumnValue::UnchangedToast,
                ColumnValue::Binary(Bytes::from_static(&[0, 0xff])),
            ]
        );
        assert_eq!(ins.new.columns[0].as_str(), Some("alice"));
        // Values are slices of the input buffer, not copies.
        let value = ins.new.columns[0].bytes().expect("text value");
        let range = input.as_ptr_range();
        assert!(range.contains(&value.as_ptr()), "value was copied");
    }

    #[test]
    fn empty_text_value_and_empty_tuple() {
        let Message::Insert(ins) = ok(&[b"I", &OID, b"N", &[0, 1], b"t", &[0, 0, 0, 0]]) else {
            panic!("not an insert")
        };
        assert_eq!(ins.new.columns, vec![text("")]);
        let Message::Insert(ins) = ok(&[b"I", &OID, b"N", &[0, 0]]) else {
            panic!("not an insert")
        };
        assert!(ins.new.is_empty());
    }

    #[test]
    fn update_without_old_tuple() {
        let m = ok(&[b"U", &OID, b"N", &[0, 2], b"t", &[0, 0, 0, 1], b"1", b"u"]);
        assert_eq!(
            m,
            Message::Update(Update {
                relation_oid: 0x4009,
                old: None,
                new: TupleData {
                    columns: vec![text("1"), ColumnValue::UnchangedToast],
                },
            })
        );
    }

    #[test]
    fn update_with_old_key_and_with_old_row() {
        let key = ok(&[
            b"U",
            &OID,
            b"K",
            &[0, 2],
            b"t",
            &[0, 0, 0, 1],
            b"2",
            b"n",
            b"N",
            &[0, 2],
            b"t",
            &[0, 0, 0, 2],
            b"20",
            b"t",
            &[0, 0, 0, 3],
            b"bob",
        ]);
        assert_eq!(
            key,
            Message::Update(Update {
                relation_oid: 0x4009,
                old: Some(OldTuple::Key(TupleData {
                    columns: vec![text("2"), ColumnValue::Null],
                })),
                new: TupleData {
                    columns: vec![text("20"), text("bob")],
                },
            })
        );
        let full = ok(&[
            b"U",
            &OID,
            b"O",
            &[0, 1],
            b"t",
            &[0, 0, 0, 1],
            b"a",
            b"N",
            &[0, 1],
            b"t",
            &[0, 0, 0, 1],
            b"b",
        ]);
        let Message::Update(Update { old: Some(old), .. }) = full else {
            panic!("no old tuple: {full:?}")
        };
        assert_eq!(
            old,
            OldTuple::Full(TupleData {
                columns: vec![text("a")],
            })
        );
        assert_eq!(old.tuple().columns, vec![text("a")]);
    }

    #[test]
    fn delete_with_old_key_and_with_old_row() {
        let m = ok(&[b"D", &OID, b"K", &[0, 2], b"t", &[0, 0, 0, 1], b"7", b"n"]);
        assert_eq!(
            m,
            Message::Delete(Delete {
                relation_oid: 0x4009,
                old: OldTuple::Key(TupleData {
                    columns: vec![text("7"), ColumnValue::Null],
                }),
            })
        );
        let m = ok(&[b"D", &OID, b"O", &[0, 1], b"t", &[0, 0, 0, 1], b"7"]);
        assert!(matches!(
            m,
            Message::Delete(Delete {
                old: OldTuple::Full(_),
                ..
            })
        ));
    }

    #[test]
    fn truncate() {
        let m = ok(&[
            b"T",
            &[0, 0, 0, 2],
            &[3],
            &[0, 0, 0x40, 0x10],
            &[0, 0, 0x40, 0x15],
        ]);
        let Message::Truncate(t) = m else {
            panic!("not a truncate: {m:?}")
        };
        assert_eq!(t.relation_oids, vec![0x4010, 0x4015]);
        assert_eq!(t.options, 3);
        assert!(t.cascade() && t.restart_identity());
        let Message::Truncate(t) = ok(&[b"T", &[0, 0, 0, 1], &[2], &OID]) else {
            panic!("not a truncate")
        };
        assert!(!t.cascade() && t.restart_identity());
    }

    #[test]
    fn logical_messages() {
        let m = ok(&[
            b"M",
            &[1],
            &LSN_A,
            b"outbox\0",
            &[0, 0, 0, 3],
            &[0, 0xff, 1],
        ]);
        assert_eq!(
            m,
            Message::Message(LogicalMessage {
                transactional: true,
                lsn: Lsn::new(0x1_5382_7800),
                prefix: "outbox".to_owned(),
                content: Bytes::from_static(&[0, 0xff, 1]),
            })
        );
        let Message::Message(m) = ok(&[b"M", &[0], &LSN_B, b"\0", &[0, 0, 0, 0]]) else {
            panic!("not a message")
        };
        assert!(!m.transactional);
        assert_eq!(m.prefix, "");
        assert!(m.content.is_empty());
    }

    // ---- errors ----

    #[test]
    fn empty_payload_is_truncated_without_tag() {
        let e = err(&[]);
        assert_eq!(e.tag(), None);
        assert_eq!(e.offset(), 0);
        assert_eq!(e.kind(), &truncated(1, 0));
    }

    #[test]
    fn unknown_tags() {
        for t in [b'Z', 0, 0xff, b'n', b'k', b'w'] {
            let e = err(&[&[t], &[0; 16]]);
            assert_eq!(e.kind(), &DecodeErrorKind::UnknownTag, "tag {t:#x}");
            assert_eq!((e.tag(), e.offset()), (Some(t), 0));
        }
    }

    #[test]
    fn two_phase_tags_are_unsupported() {
        for t in *b"bPKrp" {
            let e = err(&[&[t], &[0; 30]]);
            assert!(
                matches!(e.kind(), DecodeErrorKind::Unsupported(_)),
                "tag {}: {e}",
                t as char
            );
            assert_eq!(e.tag(), Some(t));
        }
        assert!(
            err(&[b"b"])
                .to_string()
                .contains("Begin Prepare (proto_version 3+) is not expected")
        );
    }

    #[test]
    fn truncated_fixed_fields_name_offset_needed_and_available() {
        let e = err(&[b"B", &LSN_A, &TIME, &[0, 0]]);
        assert_eq!(e.tag(), Some(b'B'));
        assert_eq!(e.offset(), 17);
        assert_eq!(e.field(), "xid");
        assert_eq!(e.kind(), &truncated(4, 2));
        assert_eq!(
            e.to_string(),
            "pgoutput message 'B' at offset 17: truncated: needed 4 bytes, 2 available (reading xid)"
        );
        // Every strict prefix of a valid commit fails as truncated.
        let full = [b"C".as_slice(), &[0], &LSN_A, &LSN_B, &TIME].concat();
        for cut in 1..full.len() {
            let e = decode(&Bytes::copy_from_slice(&full[..cut])).expect_err("prefix");
            assert!(
                matches!(e.kind(), DecodeErrorKind::Truncated { .. }),
                "{cut}: {e}"
            );
            assert!(e.offset() <= cut);
        }
    }

    #[test]
    fn truncated_column_value() {
        let e = err(&[b"I", &OID, b"N", &[0, 1], b"t", &[0, 0, 0, 5], b"ab"]);
        assert_eq!(e.offset(), 13);
        assert_eq!(e.field(), "column value");
        assert_eq!(e.kind(), &truncated(5, 2));
    }

    #[test]
    fn trailing_bytes_after_a_complete_message() {
        let e = err(&[b"B", &LSN_A, &TIME, &[0, 0, 2, 0xdc], &[9, 9, 9]]);
        assert_eq!(e.kind(), &DecodeErrorKind::TrailingBytes { count: 3 });
        assert_eq!(e.offset(), 21);
        // A tuple with fewer columns than bytes also leaves bytes over.
        let e = err(&[b"I", &OID, b"N", &[0, 1], b"n", b"n"]);
        assert_eq!(e.kind(), &DecodeErrorKind::TrailingBytes { count: 1 });
        assert_eq!(e.offset(), 9);
    }

    #[test]
    fn strings_without_nul_or_not_utf8() {
        let e = err(&[b"Y", &OID, b"app\0mood"]);
        assert_eq!(e.kind(), &DecodeErrorKind::BadString(BadString::NoNul));
        assert_eq!((e.offset(), e.field()), (9, "type name"));

        let e = err(&[b"R", &OID, b"app\0", &[0x61, 0xff, 0xfe, 0], b"d", &[0, 0]]);
        assert_eq!(e.kind(), &DecodeErrorKind::BadString(BadString::NotUtf8));
        assert_eq!((e.offset(), e.field()), (9, "relation name"));

        let e = err(&[b"M", &[1], &LSN_A, b"pre"]);
        assert_eq!(e.kind(), &DecodeErrorKind::BadString(BadString::NoNul));
        assert_eq!(e.field(), "message prefix");
        assert!(
            e.to_string().contains("bad string: no NUL terminator"),
            "{e}"
        );
    }

    #[test]
    fn unknown_tuple_column_kind() {
        let e = err(&[b"I", &OID, b"N", &[0, 2], b"n", b"x"]);
        assert_eq!(e.kind(), &DecodeErrorKind::UnknownTupleKind(b'x'));
        assert_eq!((e.offset(), e.field()), (9, "tuple column kind"));
    }

    #[test]
    fn unknown_old_tuple_kind() {
        let e = err(&[b"U", &OID, b"X", &[0, 0]]);
        assert_eq!(e.kind(), &DecodeErrorKind::UnknownOldTupleKind(b'X'));
        assert_eq!(e.offset(), 5);
        // Delete always carries an old tuple: 'N' is not one.
        let e = err(&[b"D", &OID, b"N", &[0, 0]]);
        assert_eq!(e.kind(), &DecodeErrorKind::UnknownOldTupleKind(b'N'));
        assert_eq!((e.tag(), e.offset()), (Some(b'D'), 5));
    }

    #[test]
    fn missing_new_tuple_marker() {
        let e = err(&[b"I", &OID, b"K", &[0, 0]]);
        assert_eq!(e.kind(), &DecodeErrorKind::MissingNewTuple(b'K'));
        assert_eq!(e.offset(), 5);
        let e = err(&[b"U", &OID, b"K", &[0, 1], b"n", b"O", &[0, 0]]);
        assert_eq!(e.kind(), &DecodeErrorKind::MissingNewTuple(b'O'));
        assert_eq!(e.offset(), 9);
    }

    #[test]
    fn negative_counts_and_lengths() {
        let e = err(&[b"T", &(-1i32).to_be_bytes(), &[0]]);
        assert_eq!(e.kind(), &DecodeErrorKind::BadCount(-1));
        assert_eq!((e.offset(), e.field()), (1, "relation count"));

        let e = err(&[b"M", &[1], &LSN_A, b"p\0", &i32::MIN.to_be_bytes()]);
        assert_eq!(e.kind(), &DecodeErrorKind::BadCount(i64::from(i32::MIN)));
        assert_eq!(e.offset(), 12);

        let e = err(&[b"I", &OID, b"N", &[0, 1], b"t", &(-2i32).to_be_bytes()]);
        assert_eq!(e.kind(), &DecodeErrorKind::BadCount(-2));
        assert_eq!((e.offset(), e.field()), (9, "column value length"));
    }

    #[test]
    fn huge_counts_fail_without_allocating_for_them() {
        let e = err(&[b"T", &i32::MAX.to_be_bytes(), &[0], &OID]);
        assert_eq!(e.kind(), &truncated(4, 0));
        let e = err(&[b"I", &OID, b"N", &[0xff, 0xff], b"n"]);
        assert!(matches!(e.kind(), DecodeErrorKind::Truncated { .. }), "{e}");
        let e = err(&[b"R", &OID, b"a\0b\0d", &[0xff, 0xff]]);
        assert!(matches!(e.kind(), DecodeErrorKind::Truncated { .. }), "{e}");
        let e = err(&[b"M", &[1], &LSN_A, b"p\0", &i32::MAX.to_be_bytes(), b"x"]);
        assert_eq!(e.kind(), &truncated(i32::MAX as usize, 1));
    }
}
