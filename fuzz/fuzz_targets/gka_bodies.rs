//! Every protocol body decoder (the first byte picks the step kind): never panics, and what
//! decodes re-encodes to the same bytes.
#![no_main]
use conclave_wire::gka::{BdMsg, CkdMsg, GdhMsg, StrMsg, TgdhMsg};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    if let Ok(m) = GdhMsg::decode(kind, body) {
        assert_eq!(m.encode(), body);
    }
    if let Ok(m) = CkdMsg::decode(kind, body) {
        assert_eq!(m.encode(), body);
    }
    if let Ok(m) = TgdhMsg::decode(kind, body) {
        assert_eq!(m.encode(), body);
    }
    if let Ok(m) = StrMsg::decode(kind, body) {
        assert_eq!(m.encode(), body);
    }
    if let Ok(m) = BdMsg::decode(kind, body) {
        assert_eq!(m.encode(), body);
    }
});
