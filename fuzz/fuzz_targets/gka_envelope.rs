//! The signed envelope decoder: never panics; what decodes re-encodes to the same bytes.
#![no_main]
use conclave_wire::gka::Envelope;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((env, signed_len)) = Envelope::decode(data) {
        let again = env.encode();
        assert_eq!(again, data, "envelope round trip");
        assert_eq!(&data[..signed_len], &env.signed_part()[..]);
    }
});
