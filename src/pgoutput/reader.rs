//! The pgoutput decoder's reader: a [`Cursor`] over one pgoutput message.
//!
//! Every read checks the remaining length first and reports failures as a
//! [`DecodeError`] naming the message tag, the offset of the read and the field,
//! so no input can make the decoder index out of bounds or panic.

use bytes::Bytes;

use super::error::{BadString, DecodeError, DecodeErrorKind};
use crate::pg::Lsn;
use crate::pg::cursor::{BigEndian, Cursor, Fault};

pub(crate) struct Reader<'a> {
    cur: Cursor<'a>,
    tag: Option<u8>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a Bytes) -> Reader<'a> {
        Reader {
            cur: Cursor::new(buf),
            tag: None,
        }
    }

    /// Reads the first byte and remembers it for every later error.
    pub(crate) fn tag(&mut self) -> Result<u8, DecodeError> {
        let tag = self.u8("message tag")?;
        self.tag = Some(tag);
        Ok(tag)
    }

    pub(crate) fn remaining(&self) -> usize {
        self.cur.remaining()
    }

    pub(crate) fn error_at(
        &self,
        offset: usize,
        field: &'static str,
        kind: DecodeErrorKind,
    ) -> DecodeError {
        DecodeError::new(self.tag, offset, field, kind)
    }

    /// An error about the bytes just before the cursor (`len` of them).
    pub(crate) fn error_behind(
        &self,
        len: usize,
        field: &'static str,
        kind: DecodeErrorKind,
    ) -> DecodeError {
        self.error_at(self.cur.pos().saturating_sub(len), field, kind)
    }

    fn fault(&self, fault: Fault, field: &'static str) -> DecodeError {
        match fault {
            Fault::Truncated {
                at,
                needed,
                available,
            } => self.error_at(at, field, DecodeErrorKind::Truncated { needed, available }),
            Fault::NoNul { at } => {
                self.error_at(at, field, DecodeErrorKind::BadString(BadString::NoNul))
            }
            Fault::NotUtf8 { at } => {
                self.error_at(at, field, DecodeErrorKind::BadString(BadString::NotUtf8))
            }
            Fault::Trailing { at, count } => {
                self.error_at(at, field, DecodeErrorKind::TrailingBytes { count })
            }
        }
    }

    fn int<T: BigEndian>(&mut self, field: &'static str) -> Result<T, DecodeError> {
        self.cur.int().map_err(|f| self.fault(f, field))
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        self.int(field)
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.int(field)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.int(field)
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.int(field)
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.int(field)
    }

    pub(crate) fn lsn(&mut self, field: &'static str) -> Result<Lsn, DecodeError> {
        self.int(field).map(Lsn::new)
    }

    /// A non-negative Int32 length or count (PostgreSQL writes them signed).
    pub(crate) fn len_i32(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let raw = self.i32(field)?;
        usize::try_from(raw)
            .map_err(|_| self.error_behind(4, field, DecodeErrorKind::BadCount(i64::from(raw))))
    }

    /// `n` bytes as a slice of the input (no copy).
    pub(crate) fn bytes(&mut self, n: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        self.cur.bytes(n).map_err(|f| self.fault(f, field))
    }

    /// A NUL-terminated UTF-8 string; the cursor ends after the NUL.
    pub(crate) fn cstring(&mut self, field: &'static str) -> Result<String, DecodeError> {
        self.cur
            .cstr()
            .map(str::to_owned)
            .map_err(|f| self.fault(f, field))
    }

    /// Rejects bytes left over after a complete message.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        self.cur
            .finish()
            .map_err(|f| self.fault(f, "end of message"))
    }
}
