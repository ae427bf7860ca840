//! Framing of the PostgreSQL frontend/backend protocol (v3) and a strict body
//! reader.
//!
//! Every backend message after startup is `tag: u8, len: i32, body` where `len`
//! counts itself but not the tag. [`next_frame`] splits one complete message
//! off a `BytesMut` without copying and returns `None` ("need more bytes") for
//! a partial one. [`Reader`] walks a body with bounds checks and reports the
//! tag and byte offset of anything malformed; `finish` rejects leftover bytes.

use bytes::{Buf, Bytes, BytesMut};
use postgres_protocol::message::frontend;

use super::cursor::{BigEndian, Cursor, Fault};
use super::error::{PgError, ServerError};
pub use super::malformed::{Tag, WireError};

/// Backend message tags we handle.
pub(crate) mod tag {
    pub const AUTHENTICATION: u8 = b'R';
    pub const BACKEND_KEY_DATA: u8 = b'K';
    pub const PARAMETER_STATUS: u8 = b'S';
    pub const READY_FOR_QUERY: u8 = b'Z';
    pub const ERROR_RESPONSE: u8 = b'E';
    pub const NOTICE_RESPONSE: u8 = b'N';
    pub const ROW_DESCRIPTION: u8 = b'T';
    pub const DATA_ROW: u8 = b'D';
    pub const COMMAND_COMPLETE: u8 = b'C';
    pub const EMPTY_QUERY: u8 = b'I';
    /// CopyBothResponse: the server entered streaming replication.
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
}

/// Upper bound for one message unless the caller chooses another. PostgreSQL
/// cannot send a single datum above 1 GiB, so a logical change plus its
/// headers fits.
pub(crate) const DEFAULT_MAX_FRAME: usize = (1 << 30) + (1 << 20);

/// Free space kept in a receive buffer before each socket read, so that a
/// busy stream is read in large chunks rather than BytesMut's small default
/// growth steps.
const READ_CHUNK: usize = 64 * 1024;

/// Makes room for the next socket read.
pub(crate) fn reserve_for_read(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// One complete backend message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub tag: u8,
    pub body: Bytes,
}

/// Splits the next complete message off the front of `buf`.
///
/// `Ok(None)` means more bytes are needed; `buf` then has capacity reserved
/// for the rest of the frame. A declared length above `max` is an error
/// before any of its body is buffered.
pub(crate) fn next_frame(buf: &mut BytesMut, max: usize) -> Result<Option<Frame>, WireError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let tag = buf[0];
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(WireError::BadLength { tag: Tag(tag), len });
    }
    let body_len = len as usize - 4;
    if body_len > max {
        return Err(WireError::TooLarge {
            tag: Tag(tag),
            len: body_len,
            max,
        });
    }
    let total = 5 + body_len;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(total);
    frame.advance(5);
    Ok(Some(Frame {
        tag,
        body: frame.freeze(),
    }))
}

/// Reads from `reader` into `buf` until one whole message is buffered and
/// returns it. A malformed frame is turned into an error by `invalid`; a read
/// error or the server closing the socket names `addr` and what was `during`.
pub(crate) async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    max: usize,
    addr: &str,
    during: &'static str,
    invalid: impl Fn(WireError) -> PgError,
) -> Result<Frame, PgError> {
    use tokio::io::AsyncReadExt as _;
    loop {
        if let Some(frame) = next_frame(buf, max).map_err(&invalid)? {
            return Ok(frame);
        }
        reserve_for_read(buf);
        let n = reader.read_buf(buf).await.map_err(|source| PgError::Io {
            action: "reading from",
            addr: addr.to_owned(),
            source,
        })?;
        if n == 0 {
            return Err(PgError::Closed {
                addr: addr.to_owned(),
                during,
            });
        }
    }
}

/// A bounds-checked cursor over one message body (a [`Cursor`] whose
/// failures name the message tag).
pub(crate) struct Reader<'a> {
    tag: Tag,
    cur: Cursor<'a>,
}

impl<'a> Reader<'a> {
    pub fn new(tag: u8, body: &'a Bytes) -> Reader<'a> {
        Reader {
            tag: Tag(tag),
            cur: Cursor::new(body),
        }
    }

    pub fn offset(&self) -> usize {
        self.cur.pos()
    }

    pub fn invalid(&self, offset: usize, what: &'static str) -> WireError {
        WireError::Invalid {
            tag: self.tag,
            offset,
            what,
        }
    }

    fn fault(&self, fault: Fault, what: &'static str) -> WireError {
        let tag = self.tag;
        match fault {
            Fault::Truncated {
                at,
                needed,
                available,
            } => WireError::Truncated {
                tag,
                offset: at,
                needed: needed - available,
                what,
            },
            Fault::NoNul { at } => WireError::MissingNul { tag, offset: at },
            Fault::NotUtf8 { at } => WireError::BadUtf8 { tag, offset: at },
            Fault::Trailing { at, count } => WireError::Trailing {
                tag,
                offset: at,
                extra: count,
            },
        }
    }

    fn int<T: BigEndian>(&mut self, what: &'static str) -> Result<T, WireError> {
        self.cur.int().map_err(|f| self.fault(f, what))
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        self.int(what)
    }

    pub fn i16(&mut self, what: &'static str) -> Result<i16, WireError> {
        self.int(what)
    }

    pub fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        self.int(what)
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        self.int(what)
    }

    pub fn i64(&mut self, what: &'static str) -> Result<i64, WireError> {
        self.int(what)
    }

    /// `n` bytes as a zero-copy slice of the body.
    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<Bytes, WireError> {
        self.cur.bytes(n).map_err(|f| self.fault(f, what))
    }

    /// Everything left, zero-copy.
    pub fn rest(&mut self) -> Bytes {
        self.cur.rest()
    }

    /// A NUL-terminated UTF-8 string.
    pub fn cstr(&mut self) -> Result<&'a str, WireError> {
        self.cur.cstr().map_err(|f| self.fault(f, "string"))
    }

    /// Requires that the whole body was consumed.
    pub fn finish(&self) -> Result<(), WireError> {
        self.cur
            .finish()
            .map_err(|f| self.fault(f, "end of message"))
    }
}

/// Parses an ErrorResponse or NoticeResponse body: `(field type u8, cstring)*`
/// terminated by a zero byte.
pub(crate) fn parse_error_fields(tag: u8, body: &Bytes) -> Result<ServerError, WireError> {
    let mut r = Reader::new(tag, body);
    let mut localized_severity = None;
    let mut severity = None;
    let mut code = None;
    let mut message = None;
    let mut detail = None;
    let mut hint = None;
    loop {
        let field = r.u8("field type")?;
        if field == 0 {
            break;
        }
        let value = r.cstr()?.to_owned();
        match field {
            b'S' => localized_severity = Some(value),
            b'V' => severity = Some(value),
            b'C' => code = Some(value),
            b'M' => message = Some(value),
            b'D' => detail = Some(value),
            b'H' => hint = Some(value),
            // Position, where, schema, table, file, line, routine...: not needed.
            _ => {}
        }
    }
    r.finish()?;
    let end = r.offset();
    Ok(ServerError {
        severity: severity
            .or(localized_severity)
            .ok_or(r.invalid(end, "error response without severity"))?,
        code: code.ok_or(r.invalid(end, "error response without SQLSTATE"))?,
        message: message.unwrap_or_default(),
        detail,
        hint,
    })
}

/// Frontend encoders. postgres-protocol's fail only on strings with an
/// embedded NUL or an over-long message; those become `PgError::Encode`.
pub(crate) mod encode {
    use super::*;

    fn enc(what: &'static str, r: std::io::Result<()>) -> Result<(), PgError> {
        r.map_err(|source| PgError::Encode { what, source })
    }

    pub fn ssl_request(out: &mut BytesMut) {
        frontend::ssl_request(out);
    }

    pub fn startup<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
        out: &mut BytesMut,
    ) -> Result<(), PgError> {
        enc("startup message", frontend::startup_message(params, out))
    }

    pub fn password(password: &[u8], out: &mut BytesMut) -> Result<(), PgError> {
        enc(
            "password message",
            frontend::password_message(password, out),
        )
    }

    pub fn sasl_initial(mechanism: &str, data: &[u8], out: &mut BytesMut) -> Result<(), PgError> {
        enc(
            "SASL initial response",
            frontend::sasl_initial_response(mechanism, data, out),
        )
    }

    pub fn sasl_response(data: &[u8], out: &mut BytesMut) -> Result<(), PgError> {
        enc("SASL response", frontend::sasl_response(data, out))
    }

    pub fn query(sql: &str, out: &mut BytesMut) -> Result<(), PgError> {
        enc("query", frontend::query(sql, out))
    }

    pub fn copy_done(out: &mut BytesMut) {
        frontend::copy_done(out);
    }

    pub fn terminate(out: &mut BytesMut) {
        frontend::terminate(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn splits_frames_fed_byte_by_byte() {
        let mut wire = frame(b'Z', b"I");
        wire.extend(frame(b'd', b"hello"));
        wire.extend(frame(b'c', b""));
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for b in wire {
            buf.extend_from_slice(&[b]);
            while let Some(f) = next_frame(&mut buf, 1024).unwrap() {
                got.push((f.tag, f.body.to_vec()));
            }
        }
        assert_eq!(
            got,
            vec![
                (b'Z', b"I".to_vec()),
                (b'd', b"hello".to_vec()),
                (b'c', vec![])
            ]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn partial_frame_reserves_the_rest() {
        let wire = frame(b'd', &[7u8; 100]);
        let mut buf = BytesMut::from(&wire[..10]);
        assert_eq!(next_frame(&mut buf, 1024).unwrap(), None);
        assert!(buf.capacity() >= wire.len());
        assert_eq!(buf.len(), 10);
    }

    #[test]
    fn rejects_bad_and_oversized_lengths() {
        let mut buf = BytesMut::from(&[b'd', 0, 0, 0, 3][..]);
        assert_eq!(
            next_frame(&mut buf, 1024),
            Err(WireError::BadLength {
                tag: Tag(b'd'),
                len: 3
            })
        );
        let mut buf = BytesMut::from(&[b'd', 0x7f, 0, 0, 0][..]);
        assert!(matches!(
            next_frame(&mut buf, 1024),
            Err(WireError::TooLarge { max: 1024, .. })
        ));
        let mut buf = BytesMut::from(&[b'd', 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            next_frame(&mut buf, 1024),
            Err(WireError::BadLength { len: -1, .. })
        ));
    }

    #[test]
    fn reader_reports_offsets() {
        let body = Bytes::from_static(b"\x00\x01ab");
        let mut r = Reader::new(b'x', &body);
        assert_eq!(r.i16("n").unwrap(), 1);
        assert_eq!(
            r.cstr(),
            Err(WireError::MissingNul {
                tag: Tag(b'x'),
                offset: 2
            })
        );
        assert_eq!(
            r.i32("len"),
            Err(WireError::Truncated {
                tag: Tag(b'x'),
                offset: 2,
                needed: 2,
                what: "len"
            })
        );
        assert_eq!(
            r.finish(),
            Err(WireError::Trailing {
                tag: Tag(b'x'),
                offset: 2,
                extra: 2
            })
        );
    }

    #[test]
    fn parses_error_response_fields() {
        let body = Bytes::from_static(
            b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"x\"\0Ffile.c\0L1\0Rauth_failed\0\0",
        );
        let e = parse_error_fields(b'E', &body).unwrap();
        assert_eq!(e.severity, "FATAL");
        assert_eq!(e.code, "28P01");
        assert_eq!(e.message, "password authentication failed for user \"x\"");
        assert_eq!(e.detail, None);

        let body = Bytes::from_static(b"SERROR\0C55006\0Mm\0Dd\0Hh\0\0");
        let e = parse_error_fields(b'E', &body).unwrap();
        assert_eq!(
            (e.severity.as_str(), e.detail.as_deref(), e.hint.as_deref()),
            ("ERROR", Some("d"), Some("h"))
        );

        for bad in [
            &b"SERROR\0C55006\0Mm"[..],
            b"SERROR\0Mm\0\0",
            b"SERROR\0\0x",
        ] {
            assert!(parse_error_fields(b'E', &Bytes::copy_from_slice(bad)).is_err());
        }
    }

    proptest::proptest! {
        /// Arbitrary bytes, cut at arbitrary points: frames come out whole and
        /// in order or a typed error is returned; nothing panics.
        #[test]
        fn arbitrary_streams_never_panic(
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            chunk in 1usize..17,
        ) {
            let mut buf = BytesMut::new();
            let mut consumed = 0usize;
            'feed: for piece in raw.chunks(chunk) {
                buf.extend_from_slice(piece);
                loop {
                    match next_frame(&mut buf, 64) {
                        Ok(Some(f)) => consumed += 5 + f.body.len(),
                        Ok(None) => break,
                        Err(e) => {
                            proptest::prop_assert!(!e.to_string().is_empty());
                            break 'feed;
                        }
                    }
                }
            }
            proptest::prop_assert!(consumed <= raw.len());
        }

        #[test]
        fn error_fields_never_panic(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let _ = parse_error_fields(b'E', &Bytes::from(raw));
        }
    }

    #[test]
    fn tag_display_is_readable() {
        assert_eq!(Tag(b'w').to_string(), "'w' (0x77)");
        assert_eq!(Tag(0).to_string(), "0x00");
    }
}
