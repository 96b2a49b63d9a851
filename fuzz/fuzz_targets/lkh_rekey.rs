//! The rekey message decoder never panics, and what decodes re-encodes to the same bytes; a member
//! fed the same bytes returns an error or applies them, never panics.
#![no_main]
use conclave_crypto::aead::AeadAlg;
use conclave_crypto::GroupKey;
use conclave_keygraph::{GraphKind, JoinAck, Member, MemberConfig, Slot, UserId};
use conclave_wire::lkh::RekeyMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((msg, body_len)) = RekeyMessage::decode(data) {
        assert_eq!(msg.encode(), data, "rekey message round trip");
        assert_eq!(&data[..body_len], &msg.body()[..]);
    }
    for graph in [
        GraphKind::Tree { degree: 4 },
        GraphKind::Star,
        GraphKind::Complete,
    ] {
        let cfg = MemberConfig {
            group: "fuzz".into(),
            graph,
            aead: AeadAlg::Aes256Gcm,
            server: None,
        };
        let ack = JoinAck {
            user: UserId(1),
            slot: Slot(3),
            epoch: 1,
        };
        let mut m = Member::new(cfg, &ack, GroupKey::from_bytes([3; 32])).expect("slot 3 fits");
        let _ = m.handle_rekey(data);
    }
});
