//! The daemon packet decoder never panics, what decodes re-encodes to the same bytes, and
//! decoding with shared payloads (the daemon's) decodes alike.
#![no_main]
use conclave_wire::client::Bytes;
use conclave_wire::gcs::Packet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = Packet::decode(data);
    let shared = Packet::decode_shared(&Bytes::copy_from_slice(data));
    assert_eq!(p, shared, "shared decoding differs");
    if let Ok(p) = p {
        assert_eq!(p.encode(), data, "packet round trip");
    }
});
