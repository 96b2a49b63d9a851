//! The secure layer's message decoder: never panics; what decodes re-encodes to the same bytes.
#![no_main]
use conclave_wire::secure::SecureMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = SecureMessage::decode(data) {
        assert_eq!(m.encode(), data, "secure message round trip");
    }
});
