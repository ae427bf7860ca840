//! W3C Trace Context (level 1) carried by an outbox row: the writer's
//! `traceparent` (and `tracestate`) copied into the record's headers of the
//! same names, byte for byte, when valid.
//!
//! A value that is not valid is left out of the record and counted
//! (`outbox_cdc_trace_context_dropped_total`): the event itself is good, so
//! a bad trace value never refuses a row or stops the connector.

/// The record header of the parent span (W3C Trace Context).
pub const TRACEPARENT: &str = "traceparent";
/// The record header of vendor trace state (W3C Trace Context).
pub const TRACESTATE: &str = "tracestate";

/// Longest `tracestate` copied: the length every W3C participant must
/// propagate (32 list members, 512 characters).
pub const MAX_TRACESTATE_LEN: usize = 512;

/// Trace values a row carried that did not go into the record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceDropped {
    /// A `traceparent` was given and is not valid.
    pub traceparent: bool,
    /// A `tracestate` was given and is not plausible, or came without a valid
    /// `traceparent` (the specification lets it travel only with one).
    pub tracestate: bool,
}

impl TraceDropped {
    pub fn any(self) -> bool {
        self.traceparent || self.tracestate
    }
}

fn lower_hex(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

fn not_all_zero(bytes: &[u8]) -> bool {
    bytes.iter().any(|b| *b != b'0')
}

/// Whether `value` is a valid `traceparent`: `version-traceid-parentid-flags`
/// with two lower-case hex digits of version (`ff` is invalid), 32 of trace
/// id and 16 of parent id (neither all zeros) and two of flags. Version `00`
/// is exactly 55 characters; a later version may continue after a `-`.
pub fn valid_traceparent(value: &[u8]) -> bool {
    const LEN: usize = 55;
    if value.len() < LEN {
        return false;
    }
    let (version, trace_id, parent_id, flags) =
        (&value[0..2], &value[3..35], &value[36..52], &value[53..55]);
    let dashes = value[2] == b'-' && value[35] == b'-' && value[52] == b'-';
    let known = dashes
        && lower_hex(version)
        && version != b"ff"
        && lower_hex(trace_id)
        && not_all_zero(trace_id)
        && lower_hex(parent_id)
        && not_all_zero(parent_id)
        && lower_hex(flags);
    if !known {
        return false;
    }
    match (version, &value[LEN..]) {
        (_, []) => true,
        (b"00", _) => false,
        (_, rest) => rest[0] == b'-',
    }
}

/// Whether `value` is a plausible `tracestate` list: at most
/// [`MAX_TRACESTATE_LEN`] characters, printable ASCII only.
pub fn plausible_tracestate(value: &[u8]) -> bool {
    value.len() <= MAX_TRACESTATE_LEN && value.iter().all(|b| (0x20..=0x7e).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn version_00_is_exactly_55_lower_case_hex_characters() {
        assert!(valid_traceparent(VALID.as_bytes()));
        assert!(valid_traceparent(
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        ));
        for bad in [
            "",
            "00",
            // upper case
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
            // all-zero ids
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // version ff, a non-hex version
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // wrong lengths and separators
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // non-hex in an id
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert!(!valid_traceparent(bad.as_bytes()), "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_may_carry_more_after_a_dash() {
        let v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(v1.as_bytes()));
        assert!(valid_traceparent(
            format!("{v1}-what-comes-next").as_bytes()
        ));
        assert!(!valid_traceparent(format!("{v1}x").as_bytes()));
        assert!(!valid_traceparent(format!("{VALID}-more").as_bytes()));
    }

    #[test]
    fn tracestate_is_short_printable_ascii() {
        assert!(plausible_tracestate(
            b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
        ));
        assert!(plausible_tracestate("a".repeat(512).as_bytes()));
        assert!(!plausible_tracestate("a".repeat(513).as_bytes()));
        assert!(!plausible_tracestate(b"a=1\nb=2"));
        assert!(!plausible_tracestate(b"a=1\x7f"));
        assert!(!plausible_tracestate("a=\u{e9}".as_bytes()));
    }
}
