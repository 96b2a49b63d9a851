//! The client protocol decoders never panic, and whatever they accept encodes back to the same
//! bytes and decodes to the same message.
#![no_main]
use conclave_wire::client::{next_frame, Reply, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A payload read as a view of the input is the same message as one copied out of it.
    let shared = bytes::Bytes::copy_from_slice(data);
    assert_eq!(
        Request::decode_within(&shared, &shared[..]),
        Request::decode(data)
    );
    if let Ok(q) = Request::decode(data) {
        let bytes = q.encode();
        assert_eq!(bytes, data);
        assert_eq!(Request::decode(&bytes).unwrap(), q);
    }
    if let Ok(p) = Reply::decode(data) {
        let bytes = p.encode();
        assert_eq!(bytes, data);
        assert_eq!(Reply::decode(&bytes).unwrap(), p);
    }
    let mut rest = data;
    while let Ok(Some((m, used))) = next_frame(rest) {
        let _ = Request::decode(m);
        rest = &rest[used..];
    }
});
