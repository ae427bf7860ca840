//! Rows of `COPY (...) TO STDOUT (FORMAT binary)`, parsed as the chunks
//! arrive: the live witness reads every row of its window, and a row through
//! the extended query protocol cost an allocation and a stream poll each.
//!
//! Format facts (PostgreSQL docs, COPY, "Binary Format"): an 11-byte
//! signature `PGCOPY\n\xff\r\n\0`, a 32-bit flags field (bit 16 set: OIDs
//! included, which a `COPY (query)` never sends), a 32-bit length of a header
//! extension to skip; then per tuple a 16-bit field count and per field a
//! 32-bit length (-1: NULL) and the bytes in the type's binary form; a field
//! count of -1 ends the data. Integers are big-endian.

use bytes::{Buf, BytesMut};

const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";

/// A binary COPY stream that does not follow the format.
#[derive(Debug, thiserror::Error)]
#[error("binary COPY data from the server: {0}")]
pub(super) struct Malformed(String);

impl Malformed {
    pub(super) fn new(what: &str) -> Malformed {
        Malformed(what.to_owned())
    }
}

#[derive(Debug, Default)]
pub(super) struct BinaryCopyReader {
    buf: BytesMut,
    header_read: bool,
    ended: bool,
    /// Field bounds of the tuple `next_tuple` last returned, in `buf`.
    fields: Vec<Option<(usize, usize)>>,
    /// Bytes of that tuple, dropped from `buf` at the next call.
    consumed: usize,
}

impl BinaryCopyReader {
    pub(super) fn push(&mut self, chunk: &[u8]) {
        self.buf.advance(std::mem::take(&mut self.consumed));
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole tuple's fields (`None` for NULL), or `None` when the
    /// data so far holds no whole tuple (push more) or the end was read.
    pub(super) fn next_tuple(&mut self) -> Result<Option<Tuple<'_>>, Malformed> {
        self.buf.advance(std::mem::take(&mut self.consumed));
        if !self.header_read && !self.read_header()? {
            return Ok(None);
        }
        if self.ended {
            return Ok(None);
        }
        let b = &self.buf[..];
        let Some(count) = b.get(..2).map(|c| i16::from_be_bytes([c[0], c[1]])) else {
            return Ok(None);
        };
        if count == -1 {
            self.ended = true;
            self.consumed = 2;
            return Ok(None);
        }
        let count =
            usize::try_from(count).map_err(|_| Malformed(format!("a tuple of {count} fields")))?;
        self.fields.clear();
        let mut at = 2;
        for _ in 0..count {
            let Some(len) = b.get(at..at + 4) else {
                return Ok(None);
            };
            let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            at += 4;
            if len == -1 {
                self.fields.push(None);
                continue;
            }
            let len =
                usize::try_from(len).map_err(|_| Malformed(format!("a field of length {len}")))?;
            if b.len() < at + len {
                return Ok(None);
            }
            self.fields.push(Some((at, at + len)));
            at += len;
        }
        self.consumed = at;
        Ok(Some(Tuple {
            buf: &self.buf[..at],
            fields: &self.fields,
        }))
    }

    /// After the last chunk: the data ended with its trailer.
    pub(super) fn finish(&self) -> Result<(), Malformed> {
        match self.ended {
            true => Ok(()),
            false => Err(Malformed(format!(
                "it ended without its trailer ({} bytes left over)",
                self.buf.len() - self.consumed
            ))),
        }
    }

    fn read_header(&mut self) -> Result<bool, Malformed> {
        const FIXED: usize = 11 + 4 + 4;
        if self.buf.len() < FIXED {
            return Ok(false);
        }
        if &self.buf[..11] != SIGNATURE {
            return Err(Malformed(
                "it does not start with the PGCOPY signature".into(),
            ));
        }
        let word = |at: usize| {
            u32::from_be_bytes([
                self.buf[at],
                self.buf[at + 1],
                self.buf[at + 2],
                self.buf[at + 3],
            ])
        };
        let (flags, extension) = (word(11), word(15) as usize);
        if flags & (1 << 16) != 0 {
            return Err(Malformed(
                "it includes OIDs, which were not asked for".into(),
            ));
        }
        if self.buf.len() < FIXED + extension {
            return Ok(false);
        }
        self.buf.advance(FIXED + extension);
        self.header_read = true;
        Ok(true)
    }
}

/// One tuple's fields, borrowed from the reader until its next call.
pub(super) struct Tuple<'a> {
    buf: &'a [u8],
    fields: &'a [Option<(usize, usize)>],
}

impl<'a> Tuple<'a> {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.fields.len()
    }

    /// Field `i`'s bytes; `None` for NULL or a field the tuple lacks.
    pub(super) fn bytes(&self, i: usize) -> Option<&'a [u8]> {
        let (from, to) = (*self.fields.get(i)?)?;
        Some(&self.buf[from..to])
    }

    /// Field `i` as an `int8`.
    pub(super) fn int8(&self, i: usize) -> Result<Option<i64>, Malformed> {
        self.bytes(i)
            .map(|b| {
                <[u8; 8]>::try_from(b).map(i64::from_be_bytes).map_err(|_| {
                    Malformed(format!("field {i} holds {} bytes, not an int8", b.len()))
                })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Row = (Option<i64>, Option<String>);

    fn stream(rows: &[(Option<i64>, Option<&str>)], extension: &[u8]) -> Vec<u8> {
        let mut out = SIGNATURE.to_vec();
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&(extension.len() as u32).to_be_bytes());
        out.extend_from_slice(extension);
        for (n, s) in rows {
            out.extend_from_slice(&2i16.to_be_bytes());
            match n {
                Some(n) => {
                    out.extend_from_slice(&8i32.to_be_bytes());
                    out.extend_from_slice(&n.to_be_bytes());
                }
                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            }
            match s {
                Some(s) => {
                    out.extend_from_slice(&(s.len() as i32).to_be_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        out.extend_from_slice(&(-1i16).to_be_bytes());
        out
    }

    fn read_all(data: &[u8], chunk: usize) -> Result<Vec<Row>, Malformed> {
        let mut reader = BinaryCopyReader::default();
        let mut rows = Vec::new();
        for piece in data.chunks(chunk.max(1)) {
            reader.push(piece);
            while let Some(t) = reader.next_tuple()? {
                assert_eq!(t.len(), 2);
                let text = t.bytes(1).map(|b| String::from_utf8(b.to_vec()).unwrap());
                rows.push((t.int8(0)?, text));
            }
        }
        reader.finish()?;
        Ok(rows)
    }

    #[test]
    fn tuples_split_anywhere_across_chunks_read_the_same() {
        let rows = [
            (Some(7), Some("0b5c4a5e-1b1e-4c57-9b8e-1f0f7d1c2a01")),
            (None, Some("")),
            (Some(-1), None),
            (Some(i64::MAX), Some("é\t\n\\")),
        ];
        let want: Vec<_> = rows
            .iter()
            .map(|(n, s)| (*n, s.map(str::to_owned)))
            .collect();
        let data = stream(&rows, b"ext");
        for chunk in 1..=data.len() {
            assert_eq!(read_all(&data, chunk).unwrap(), want, "chunks of {chunk}");
        }
    }

    #[test]
    fn no_rows_is_the_header_and_the_trailer() {
        assert!(read_all(&stream(&[], b""), 3).unwrap().is_empty());
    }

    #[test]
    fn a_stream_cut_short_or_not_binary_copy_is_an_error() {
        let data = stream(&[(Some(1), Some("a"))], b"");
        let cut = read_all(&data[..data.len() - 2], 5)
            .unwrap_err()
            .to_string();
        assert!(cut.contains("without its trailer"), "{cut}");
        let text = read_all(b"1\tabc\n\\.\n..................", 4)
            .unwrap_err()
            .to_string();
        assert!(text.contains("PGCOPY signature"), "{text}");
        let mut short = stream(&[(Some(1), Some("a"))], b"");
        // The int8's length says 4 bytes: not an int8.
        let at = 11 + 8 + 2;
        short[at..at + 4].copy_from_slice(&4i32.to_be_bytes());
        short.drain(at + 4..at + 8);
        let err = read_all(&short, 64).unwrap_err().to_string();
        assert!(err.contains("not an int8"), "{err}");
    }
}
