//! Arbitrary bytes into the pgoutput decoder: it must return, never panic, and
//! its errors must name the input's first byte and an offset inside the input.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outbox_cdc::pgoutput::{DecodeErrorKind, decode};

fuzz_target!(|data: &[u8]| {
    let input = Bytes::copy_from_slice(data);
    match decode(&input) {
        Ok(message) => assert_eq!(Some(&message.tag()), data.first()),
        Err(e) => {
            assert_eq!(e.tag(), data.first().copied());
            assert!(e.offset() <= data.len(), "{e}");
            if let DecodeErrorKind::Truncated { needed, available } = e.kind() {
                assert!(needed > available, "{e}");
                assert_eq!(e.offset() + available, data.len(), "{e}");
            }
        }
    }
});
