//! The daemon packet decoder never panics, and what decodes re-encodes to the same bytes.
#![no_main]
use conclave_wire::gcs::Packet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::decode(data) {
        assert_eq!(p.encode(), data, "packet round trip");
    }
});
