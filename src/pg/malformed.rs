//! Malformed bytes from the server: the message tag and the fault, named
//! where they were found. Below `error` (a `PgError` carries them) and
//! `wire` (which finds them).

use std::fmt;

/// A message tag, shown as the character and its hex value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Tag(pub u8);

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_ascii_graphic() {
            write!(f, "'{}' (0x{:02x})", self.0 as char, self.0)
        } else {
            write!(f, "0x{:02x}", self.0)
        }
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Malformed bytes: always names the message tag and, inside a body, the
/// byte offset from the start of that body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message {tag} declares length {len}, below the minimum of 4")]
    BadLength { tag: Tag, len: i32 },
    #[error("message {tag} of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { tag: Tag, len: usize, max: usize },
    #[error("message {tag} truncated at offset {offset}: {needed} more bytes needed for {what}")]
    Truncated {
        tag: Tag,
        offset: usize,
        needed: usize,
        what: &'static str,
    },
    #[error("message {tag} has {extra} unexpected bytes at offset {offset}")]
    Trailing {
        tag: Tag,
        offset: usize,
        extra: usize,
    },
    #[error("message {tag}: string at offset {offset} has no terminating NUL")]
    MissingNul { tag: Tag, offset: usize },
    #[error("message {tag}: string at offset {offset} is not UTF-8")]
    BadUtf8 { tag: Tag, offset: usize },
    #[error("message {tag}: invalid {what} at offset {offset}")]
    Invalid {
        tag: Tag,
        offset: usize,
        what: &'static str,
    },
    #[error("unknown message tag {tag} in {context}")]
    UnknownTag { tag: Tag, context: &'static str },
}
