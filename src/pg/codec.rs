//! The streaming-replication sub-protocol carried inside CopyData.
//!
//! From the server: `w` XLogData (u64 wal_start, u64 wal_end, i64 send time,
//! payload) and `k` primary keepalive (u64 wal_end, i64 send time, u8
//! reply_requested). To the server: `r` standby status update (u64 written,
//! u64 flushed, u64 applied, i64 client time, u8 reply_requested). Integers
//! are big-endian; times are microseconds since 2000-01-01.

use bytes::{BufMut, Bytes, BytesMut};

use super::wire::{Reader, Tag, WireError};
use super::{Lsn, PgTimestamp};

const XLOG_DATA: u8 = b'w';
const PRIMARY_KEEPALIVE: u8 = b'k';
const STANDBY_STATUS_UPDATE: u8 = b'r';

/// One message of a logical replication stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicationEvent {
    /// A chunk of decoded WAL; `data` is one pgoutput message, sliced from
    /// the received frame without copying.
    XLogData {
        wal_start: Lsn,
        wal_end: Lsn,
        server_time: PgTimestamp,
        data: Bytes,
    },
    /// The server's heartbeat. `wal_end` is the server's current WAL end; when
    /// `reply_requested` is set the transport answers with a status update.
    Keepalive {
        wal_end: Lsn,
        server_time: PgTimestamp,
        reply_requested: bool,
    },
}

impl ReplicationEvent {
    /// Decodes the body of one CopyData message received during replication
    /// (pure; for tools and fuzzing, the stream does this itself).
    pub fn parse(body: &Bytes) -> Result<ReplicationEvent, WireError> {
        parse_copy_data(body)
    }
}

/// Decodes the body of one CopyData message received during replication.
pub(crate) fn parse_copy_data(body: &Bytes) -> Result<ReplicationEvent, WireError> {
    let Some(&kind) = body.first() else {
        return Err(WireError::Truncated {
            tag: Tag(b'd'),
            offset: 0,
            needed: 1,
            what: "replication message kind",
        });
    };
    let mut r = Reader::new(kind, body);
    r.u8("kind")?;
    match kind {
        XLOG_DATA => {
            let wal_start = Lsn::new(r.u64("wal_start")?);
            let wal_end = Lsn::new(r.u64("wal_end")?);
            let server_time = PgTimestamp(r.i64("send time")?);
            Ok(ReplicationEvent::XLogData {
                wal_start,
                wal_end,
                server_time,
                data: r.rest(),
            })
        }
        PRIMARY_KEEPALIVE => {
            let wal_end = Lsn::new(r.u64("wal_end")?);
            let server_time = PgTimestamp(r.i64("send time")?);
            let at = r.offset();
            let reply_requested = match r.u8("reply_requested")? {
                0 => false,
                1 => true,
                _ => return Err(r.invalid(at, "reply_requested flag (expected 0 or 1)")),
            };
            r.finish()?;
            Ok(ReplicationEvent::Keepalive {
                wal_end,
                server_time,
                reply_requested,
            })
        }
        other => Err(WireError::UnknownTag {
            tag: Tag(other),
            context: "replication CopyData",
        }),
    }
}

/// Positions reported in a standby status update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StatusUpdate {
    pub written: Lsn,
    pub flushed: Lsn,
    pub applied: Lsn,
    pub client_time: PgTimestamp,
    pub reply_requested: bool,
}

/// Length of the `r` payload: kind + 3 LSNs + time + flag.
const STATUS_UPDATE_LEN: usize = 1 + 8 + 8 + 8 + 8 + 1;

/// Appends a complete CopyData frame carrying `update`.
pub(crate) fn encode_status_update(update: &StatusUpdate, out: &mut BytesMut) {
    out.reserve(5 + STATUS_UPDATE_LEN);
    out.put_u8(b'd');
    out.put_i32((4 + STATUS_UPDATE_LEN) as i32);
    out.put_u8(STANDBY_STATUS_UPDATE);
    out.put_u64(update.written.as_u64());
    out.put_u64(update.flushed.as_u64());
    out.put_u64(update.applied.as_u64());
    out.put_i64(update.client_time.0);
    out.put_u8(u8::from(update.reply_requested));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_xlogdata_zero_copy() {
        let mut raw = vec![b'w'];
        raw.extend_from_slice(&0x0000_0001_0000_0010u64.to_be_bytes());
        raw.extend_from_slice(&0x0000_0001_0000_0020u64.to_be_bytes());
        raw.extend_from_slice(&(-5i64).to_be_bytes());
        raw.extend_from_slice(b"Bpayload");
        let body = Bytes::from(raw);
        let ev = parse_copy_data(&body).unwrap();
        let ReplicationEvent::XLogData {
            wal_start,
            wal_end,
            server_time,
            data,
        } = ev
        else {
            panic!("expected XLogData, got {ev:?}");
        };
        assert_eq!(wal_start.to_string(), "1/10");
        assert_eq!(wal_end.to_string(), "1/20");
        assert_eq!(server_time, PgTimestamp(-5));
        assert_eq!(&data[..], b"Bpayload");
        assert_eq!(
            data.as_ptr(),
            body[25..].as_ptr(),
            "payload must alias the frame"
        );
    }

    #[test]
    fn parses_keepalive() {
        let mut raw = vec![b'k'];
        raw.extend_from_slice(&0x0000_0002_0000_0003u64.to_be_bytes());
        raw.extend_from_slice(&7i64.to_be_bytes());
        raw.push(1);
        assert_eq!(
            parse_copy_data(&Bytes::from(raw.clone())).unwrap(),
            ReplicationEvent::Keepalive {
                wal_end: Lsn::new(0x2_0000_0003),
                server_time: PgTimestamp(7),
                reply_requested: true
            }
        );
        raw[17] = 2;
        assert_eq!(
            parse_copy_data(&Bytes::from(raw.clone())),
            Err(WireError::Invalid {
                tag: Tag(b'k'),
                offset: 17,
                what: "reply_requested flag (expected 0 or 1)"
            })
        );
        raw[17] = 0;
        raw.push(0);
        assert_eq!(
            parse_copy_data(&Bytes::from(raw)),
            Err(WireError::Trailing {
                tag: Tag(b'k'),
                offset: 18,
                extra: 1
            })
        );
    }

    #[test]
    fn malformed_messages_name_tag_and_offset() {
        assert_eq!(
            parse_copy_data(&Bytes::from_static(b"w\0\0\0\0\0\0\0\x01\0\0")),
            Err(WireError::Truncated {
                tag: Tag(b'w'),
                offset: 9,
                needed: 6,
                what: "wal_end"
            })
        );
        assert_eq!(
            parse_copy_data(&Bytes::from_static(b"q123")),
            Err(WireError::UnknownTag {
                tag: Tag(b'q'),
                context: "replication CopyData"
            })
        );
        assert!(matches!(
            parse_copy_data(&Bytes::new()),
            Err(WireError::Truncated { offset: 0, .. })
        ));
    }

    #[test]
    fn status_update_is_byte_exact() {
        let mut out = BytesMut::new();
        encode_status_update(
            &StatusUpdate {
                written: Lsn::new(0x0000_0001_2345_6789),
                flushed: Lsn::new(0x0000_0001_0000_0000),
                applied: Lsn::new(0x0000_0001_0000_0000),
                client_time: PgTimestamp(0x0102_0304_0506_0708),
                reply_requested: false,
            },
            &mut out,
        );
        let expected: &[u8] = &[
            b'd', 0, 0, 0, 38, b'r', // frame header, kind
            0, 0, 0, 1, 0x23, 0x45, 0x67, 0x89, // written
            0, 0, 0, 1, 0, 0, 0, 0, // flushed
            0, 0, 0, 1, 0, 0, 0, 0, // applied
            1, 2, 3, 4, 5, 6, 7, 8, // client time
            0, // reply requested
        ];
        assert_eq!(&out[..], expected);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..64)) {
            let body = Bytes::from(raw);
            match parse_copy_data(&body) {
                Ok(ReplicationEvent::XLogData { data, .. }) => prop_assert_eq!(data.len(), body.len() - 25),
                Ok(ReplicationEvent::Keepalive { .. }) => prop_assert_eq!(body.len(), 18),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }

        #[test]
        fn valid_prefixes_are_truncation_errors(
            kind in prop_oneof![Just(b'w'), Just(b'k')],
            cut in 1usize..18,
        ) {
            let mut raw = vec![kind];
            raw.extend_from_slice(&[0u8; 17]);
            let body = Bytes::from(raw[..cut].to_vec());
            let truncated = matches!(
                parse_copy_data(&body),
                Err(WireError::Truncated { offset, .. }) if (1..=cut).contains(&offset)
            );
            prop_assert!(truncated);
        }
    }
}
