//! Why a pgoutput message could not be decoded, and where.

use std::fmt;

use crate::Disposition;

/// A pgoutput message that could not be decoded.
///
/// Carries the message tag (absent only for an empty payload), the byte offset
/// inside the message where the failing read started (the tag is offset 0),
/// the field being read, and the kind of failure. The caller adds the LSN of
/// the XLogData that carried the message. Decoding errors are definite: the
/// same bytes fail the same way, so a retry cannot cure them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pgoutput message {tag} at offset {offset}: {kind} (reading {field})", tag = TagDisplay(*tag))]
pub struct DecodeError {
    tag: Option<u8>,
    offset: usize,
    field: &'static str,
    kind: DecodeErrorKind,
}

impl DecodeError {
    pub(crate) fn new(
        tag: Option<u8>,
        offset: usize,
        field: &'static str,
        kind: DecodeErrorKind,
    ) -> DecodeError {
        DecodeError {
            tag,
            offset,
            field,
            kind,
        }
    }

    /// The message's first byte; `None` only when the payload was empty.
    pub fn tag(&self) -> Option<u8> {
        self.tag
    }

    /// Byte offset inside the message where the failing read started.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The protocol field being read, e.g. `"relation oid"`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    pub fn kind(&self) -> &DecodeErrorKind {
        &self.kind
    }

    /// Always `Stop`: the server sends the same bytes for the same WAL again,
    /// so reconnecting cannot cure a decoding error.
    pub fn disposition(&self) -> Disposition {
        Disposition::Stop
    }
}

/// The ways a pgoutput message can be malformed or unexpected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The first byte is not a pgoutput message tag.
    #[error("unknown message tag")]
    UnknownTag,
    /// A real pgoutput tag of a protocol feature the connector never asks
    /// for (two-phase commit).
    #[error("{0} is not expected: the connector asks for proto_version 1 or 2 without two_phase")]
    Unsupported(&'static str),
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("{count} trailing bytes after a complete message")]
    TrailingBytes { count: usize },
    #[error("bad string: {0}")]
    BadString(BadString),
    /// A TupleData column kind other than `n`, `u`, `t`, `b`.
    #[error("unknown tuple column kind {}", ByteDisplay(*.0))]
    UnknownTupleKind(u8),
    /// The byte before an old tuple is not `K` (key) or `O` (old row).
    #[error("unknown old tuple kind {}", ByteDisplay(*.0))]
    UnknownOldTupleKind(u8),
    /// A new tuple must be announced by `N`.
    #[error("expected new tuple marker 'N', found {}", ByteDisplay(*.0))]
    MissingNewTuple(u8),
    /// A count or length field holds a value no valid message has (negative).
    #[error("bad count {0}")]
    BadCount(i64),
}

/// Why a NUL-terminated protocol string was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadString {
    /// No NUL byte before the end of the message.
    NoNul,
    /// The bytes before the NUL are not UTF-8.
    NotUtf8,
}

impl fmt::Display for BadString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadString::NoNul => "no NUL terminator",
            BadString::NotUtf8 => "not UTF-8",
        })
    }
}

/// A protocol byte as `'I'` when printable ASCII, else as `0x9F`.
struct ByteDisplay(u8);

impl fmt::Display for ByteDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_ascii_graphic() || self.0 == b' ' {
            write!(f, "'{}'", char::from(self.0))
        } else {
            write!(f, "0x{:02X}", self.0)
        }
    }
}

struct TagDisplay(Option<u8>);

impl fmt::Display for TagDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(tag) => ByteDisplay(tag).fmt(f),
            None => f.write_str("(empty)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_tag_offset_kind_and_field() {
        let e = DecodeError::new(
            Some(b'I'),
            7,
            "column value length",
            DecodeErrorKind::Truncated {
                needed: 4,
                available: 2,
            },
        );
        assert_eq!(
            e.to_string(),
            "pgoutput message 'I' at offset 7: truncated: needed 4 bytes, 2 available \
             (reading column value length)"
        );
        assert_eq!(e.disposition(), Disposition::Stop);
    }

    #[test]
    fn non_ascii_bytes_display_as_hex() {
        let e = DecodeError::new(Some(0x9f), 0, "message tag", DecodeErrorKind::UnknownTag);
        assert_eq!(
            e.to_string(),
            "pgoutput message 0x9F at offset 0: unknown message tag (reading message tag)"
        );
        let e = DecodeError::new(
            Some(b'I'),
            8,
            "tuple column kind",
            DecodeErrorKind::UnknownTupleKind(0),
        );
        assert!(
            e.to_string().contains("unknown tuple column kind 0x00"),
            "{e}"
        );
        let e = DecodeError::new(
            None,
            0,
            "message tag",
            DecodeErrorKind::Truncated {
                needed: 1,
                available: 0,
            },
        );
        assert!(
            e.to_string()
                .starts_with("pgoutput message (empty) at offset 0"),
            "{e}"
        );
    }
}
