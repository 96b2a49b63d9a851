//! Spread's protocol decoders never panic: the daemon's (connect message, authentication choice,
//! request header and body) and the client's (handshake reply, daemon messages). A connect
//! message they accept encodes to one that reads the same; a request is complete exactly when
//! nothing is missing.
#![no_main]
use conclave_wire::spread::{self, client, Connect};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((c, used))) = Connect::parse(data) {
        let bytes = c.encode();
        assert_eq!(bytes.len(), used);
        assert_eq!(Connect::parse(&bytes), Ok(Some((c, used))));
    }
    if let Some(auth) = data.first_chunk::<{ spread::AUTH_REPLY_BYTES }>() {
        let _ = spread::check_auth_reply(auth);
    }
    let own = "#a#d";
    let mut rest = data;
    loop {
        let missing = spread::missing(rest, own);
        match spread::next_request(rest, own) {
            Ok(Some((_, used))) => {
                assert_eq!(missing, 0);
                rest = &rest[used..];
            }
            Ok(None) => {
                assert!(missing > 0);
                break;
            }
            Err(_) => break,
        }
    }
    let _ = client::accepted(data);
    let mut rest = data;
    while let Ok(Some((_, used))) = client::next_message(rest) {
        assert!(used > 0 && used <= rest.len());
        rest = &rest[used..];
    }
});
