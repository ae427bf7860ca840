//! A bounds-checked big-endian cursor over one pgoutput message.
//!
//! Every read checks the remaining length first and reports failures as a
//! [`DecodeError`] naming the message tag, the offset of the read and the field,
//! so no input can make the decoder index out of bounds or panic.

use bytes::Bytes;

use super::error::{BadString, DecodeError, DecodeErrorKind};
use crate::pg::Lsn;

pub(crate) struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    tag: Option<u8>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a Bytes) -> Reader<'a> {
        Reader {
            buf,
            pos: 0,
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
        self.buf.len().saturating_sub(self.pos)
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
        self.error_at(self.pos.saturating_sub(len), field, kind)
    }

    /// The next `n` bytes; the only place that advances the cursor over data.
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let buf: &'a Bytes = self.buf;
        let start = self.pos;
        match start.checked_add(n).and_then(|end| buf.get(start..end)) {
            Some(slice) => {
                self.pos = start + n;
                Ok(slice)
            }
            None => Err(self.error_at(
                start,
                field,
                DecodeErrorKind::Truncated {
                    needed: n,
                    available: self.remaining(),
                },
            )),
        }
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        // `take` returns exactly N bytes or an error.
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.array(field).map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_be_bytes)
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.array(field).map(i32::from_be_bytes)
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.array(field).map(i64::from_be_bytes)
    }

    pub(crate) fn lsn(&mut self, field: &'static str) -> Result<Lsn, DecodeError> {
        self.array(field).map(|b| Lsn::new(u64::from_be_bytes(b)))
    }

    /// A non-negative Int32 length or count (PostgreSQL writes them signed).
    pub(crate) fn len_i32(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let raw = self.i32(field)?;
        usize::try_from(raw)
            .map_err(|_| self.error_behind(4, field, DecodeErrorKind::BadCount(i64::from(raw))))
    }

    /// `n` bytes as a slice of the input (no copy).
    pub(crate) fn bytes(&mut self, n: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        self.take(n, field)?;
        Ok(self.buf.slice(start..start + n))
    }

    /// A NUL-terminated UTF-8 string; the cursor ends after the NUL.
    pub(crate) fn cstring(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let start = self.pos;
        let rest = self.buf.get(start..).unwrap_or_default();
        let Some(len) = rest.iter().position(|&b| b == 0) else {
            return Err(self.error_at(start, field, DecodeErrorKind::BadString(BadString::NoNul)));
        };
        let text = std::str::from_utf8(&rest[..len]).map_err(|_| {
            self.error_at(start, field, DecodeErrorKind::BadString(BadString::NotUtf8))
        })?;
        self.pos = start + len + 1;
        Ok(text.to_owned())
    }

    /// Rejects bytes left over after a complete message.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(self.error_at(
                self.pos,
                "end of message",
                DecodeErrorKind::TrailingBytes { count },
            )),
        }
    }
}
