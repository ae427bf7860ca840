//! Test-only encoder: writes a [`Message`] the way PostgreSQL's pgoutput does,
//! so tests (here and in other modules) can build streams without a server.

use bytes::{BufMut, BytesMut};

use super::message::{ColumnValue, Message, OldTuple, TupleData, tag};

/// Appends the pgoutput encoding of `msg` to `out`. `pg_catalog` namespaces are
/// written as "" like PostgreSQL does. Counts that do not fit their field are
/// truncated, which only a test that wants a malformed message would do.
pub(crate) fn encode(msg: &Message, out: &mut BytesMut) {
    out.put_u8(msg.tag());
    match msg {
        Message::Begin(b) => {
            out.put_u64(b.final_lsn.as_u64());
            out.put_i64(b.commit_time.0);
            out.put_u32(b.xid);
        }
        Message::Commit(c) => commit(out, c),
        Message::Origin(o) => {
            out.put_u64(o.commit_lsn.as_u64());
            cstring(out, &o.name);
        }
        Message::Relation(r) => {
            out.put_u32(r.oid);
            namespace(out, &r.namespace);
            cstring(out, &r.name);
            out.put_u8(r.replica_identity);
            out.put_u16(r.columns.len() as u16);
            for c in &r.columns {
                out.put_u8(c.flags);
                cstring(out, &c.name);
                out.put_u32(c.type_oid);
                out.put_i32(c.type_modifier);
            }
        }
        Message::Type(t) => {
            out.put_u32(t.oid);
            namespace(out, &t.namespace);
            cstring(out, &t.name);
        }
        Message::Insert(i) => {
            out.put_u32(i.relation_oid);
            out.put_u8(tag::NEW_TUPLE);
            tuple(out, &i.new);
        }
        Message::Update(u) => {
            out.put_u32(u.relation_oid);
            if let Some(old) = &u.old {
                old_tuple(out, old);
            }
            out.put_u8(tag::NEW_TUPLE);
            tuple(out, &u.new);
        }
        Message::Delete(d) => {
            out.put_u32(d.relation_oid);
            old_tuple(out, &d.old);
        }
        Message::Truncate(t) => {
            out.put_i32(t.relation_oids.len() as i32);
            out.put_u8(t.options);
            for oid in &t.relation_oids {
                out.put_u32(*oid);
            }
        }
        Message::Message(m) => {
            out.put_u8(u8::from(m.transactional));
            out.put_u64(m.lsn.as_u64());
            cstring(out, &m.prefix);
            out.put_i32(m.content.len() as i32);
            out.put_slice(&m.content);
        }
        Message::StreamStart(s) => {
            out.put_u32(s.xid);
            out.put_u8(u8::from(s.first_segment));
        }
        Message::StreamStop => {}
        Message::StreamCommit(s) => {
            out.put_u32(s.xid);
            commit(out, &s.commit);
        }
        Message::StreamAbort(a) => {
            out.put_u32(a.xid);
            out.put_u32(a.subxid);
        }
    }
}

/// Appends `msg` as pgoutput writes it inside a streamed block: changes,
/// Relation and Type messages carry `xid` after the tag.
pub(crate) fn encode_streamed(xid: u32, msg: &Message, out: &mut BytesMut) {
    let mut plain = BytesMut::new();
    encode(msg, &mut plain);
    out.put_u8(plain[0]);
    if matches!(
        msg,
        Message::Relation(_)
            | Message::Type(_)
            | Message::Insert(_)
            | Message::Update(_)
            | Message::Delete(_)
            | Message::Truncate(_)
            | Message::Message(_)
    ) {
        out.put_u32(xid);
    }
    out.put_slice(&plain[1..]);
}

fn commit(out: &mut BytesMut, c: &super::message::Commit) {
    out.put_u8(c.flags);
    out.put_u64(c.commit_lsn.as_u64());
    out.put_u64(c.end_lsn.as_u64());
    out.put_i64(c.commit_time.0);
}

/// Convenience: the encoding of `msg` as frozen bytes.
pub(crate) fn encoded(msg: &Message) -> bytes::Bytes {
    let mut out = BytesMut::new();
    encode(msg, &mut out);
    out.freeze()
}

fn cstring(out: &mut BytesMut, s: &str) {
    out.put_slice(s.as_bytes());
    out.put_u8(0);
}

fn namespace(out: &mut BytesMut, s: &str) {
    cstring(out, if s == "pg_catalog" { "" } else { s });
}

fn old_tuple(out: &mut BytesMut, old: &OldTuple) {
    let (marker, t) = match old {
        OldTuple::Key(t) => (tag::OLD_KEY, t),
        OldTuple::Full(t) => (tag::OLD_FULL, t),
    };
    out.put_u8(marker);
    tuple(out, t);
}

fn tuple(out: &mut BytesMut, t: &TupleData) {
    out.put_u16(t.columns.len() as u16);
    for c in &t.columns {
        match c {
            ColumnValue::Null => out.put_u8(tag::COLUMN_NULL),
            ColumnValue::UnchangedToast => out.put_u8(tag::COLUMN_UNCHANGED_TOAST),
            ColumnValue::Text(b) | ColumnValue::Binary(b) => {
                out.put_u8(if matches!(c, ColumnValue::Text(_)) {
                    tag::COLUMN_TEXT
                } else {
                    tag::COLUMN_BINARY
                });
                out.put_i32(b.len() as i32);
                out.put_slice(b);
            }
        }
    }
}
