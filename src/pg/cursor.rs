//! A bounds-checked big-endian cursor over one message's bytes: the one byte
//! reader under both the protocol framing (`pg::wire`) and the pgoutput
//! decoder. Every read checks the remaining length first, so no input can
//! make a reader index out of bounds or panic. A failure is a [`Fault`] at an
//! offset; each caller turns it into its own error naming the message tag and
//! the field.

use bytes::Bytes;

/// Why a read failed, and where (offsets into the message body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// `needed` bytes from `at`, only `available` left.
    Truncated {
        at: usize,
        needed: usize,
        available: usize,
    },
    /// A string starting at `at` has no terminating NUL.
    NoNul { at: usize },
    /// A string starting at `at` is not UTF-8.
    NotUtf8 { at: usize },
    /// `count` bytes left over at `at` after a complete message.
    Trailing { at: usize, count: usize },
}

/// A fixed-size big-endian integer.
pub(crate) trait BigEndian: Sized {
    const SIZE: usize;
    /// `bytes` is exactly `SIZE` long.
    fn from_be(bytes: &[u8]) -> Self;
}

macro_rules! big_endian {
    ($($t:ty),*) => {$(
        impl BigEndian for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_be(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(bytes);
                <$t>::from_be_bytes(raw)
            }
        }
    )*};
}
big_endian!(u8, i16, u16, i32, u32, i64, u64);

pub(crate) struct Cursor<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a Bytes) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
    }

    /// Offset of the next read.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes; the only place that advances the cursor over data.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Fault> {
        let buf: &'a Bytes = self.buf;
        let start = self.pos;
        match start.checked_add(n).and_then(|end| buf.get(start..end)) {
            Some(slice) => {
                self.pos = start + n;
                Ok(slice)
            }
            None => Err(Fault::Truncated {
                at: start,
                needed: n,
                available: self.remaining(),
            }),
        }
    }

    pub(crate) fn int<T: BigEndian>(&mut self) -> Result<T, Fault> {
        self.take(T::SIZE).map(T::from_be)
    }

    /// `n` bytes as a slice of the input (no copy).
    pub(crate) fn bytes(&mut self, n: usize) -> Result<Bytes, Fault> {
        let start = self.pos;
        self.take(n)?;
        Ok(self.buf.slice(start..start + n))
    }

    /// Everything left, no copy.
    pub(crate) fn rest(&mut self) -> Bytes {
        let start = self.pos.min(self.buf.len());
        self.pos = self.buf.len();
        self.buf.slice(start..)
    }

    /// A NUL-terminated UTF-8 string; the cursor ends after the NUL.
    pub(crate) fn cstr(&mut self) -> Result<&'a str, Fault> {
        let buf: &'a Bytes = self.buf;
        let start = self.pos;
        let rest = buf.get(start..).unwrap_or_default();
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(Fault::NoNul { at: start })?;
        let text = std::str::from_utf8(&rest[..len]).map_err(|_| Fault::NotUtf8 { at: start })?;
        self.pos = start + len + 1;
        Ok(text)
    }

    /// Requires that the whole message was read.
    pub(crate) fn finish(&self) -> Result<(), Fault> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(Fault::Trailing {
                at: self.pos,
                count,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_and_reports_offsets() {
        let buf = Bytes::from_static(b"\x00\x01\xff\xfeab\0rest");
        let mut c = Cursor::new(&buf);
        assert_eq!(c.int::<u16>(), Ok(1));
        assert_eq!(c.int::<i16>(), Ok(-2));
        assert_eq!(c.cstr(), Ok("ab"));
        assert_eq!(c.pos(), 7);
        assert_eq!(
            c.int::<i64>(),
            Err(Fault::Truncated {
                at: 7,
                needed: 8,
                available: 4
            })
        );
        assert_eq!(c.finish(), Err(Fault::Trailing { at: 7, count: 4 }));
        assert_eq!(c.cstr(), Err(Fault::NoNul { at: 7 }));
        assert_eq!(&c.rest()[..], b"rest");
        assert_eq!(c.finish(), Ok(()));
        assert_eq!(
            c.take(usize::MAX).unwrap_err(),
            Fault::Truncated {
                at: 11,
                needed: usize::MAX,
                available: 0
            }
        );
        let bad = Bytes::from_static(b"\xff\0");
        assert_eq!(Cursor::new(&bad).cstr(), Err(Fault::NotUtf8 { at: 0 }));
    }
}
