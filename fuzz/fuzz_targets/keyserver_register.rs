//! The registration decoder never panics, and what decodes re-encodes to the same bytes; both
//! ends of the exchange fed the same bytes return an error or a result, never panic.
#![no_main]
use conclave_crypto::Identity;
use conclave_keygraph::{Registrar, Registration};
use conclave_wire::client::GroupViewId;
use conclave_wire::gcs::RingId;
use conclave_wire::keyserver::RegisterMsg;
use libfuzzer_sys::fuzz_target;
use rand_chacha::rand_core::SeedableRng;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = RegisterMsg::decode(data) {
        assert_eq!(msg.encode(), data, "registration message round trip");
    }
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
    let server = Identity::ed25519_from_seed(&[1; 32]).expect("seed");
    let member = Identity::ed25519_from_seed(&[2; 32]).expect("seed");
    let view = GroupViewId {
        ring: RingId {
            seq: 1,
            rep: 1,
            inc: 1,
        },
        index: 1,
    };
    let member_public = member.public();
    let mut registrar = Registrar::new("g", "s", server.clone());
    let _ = registrar.invite("m", view, &mut rng);
    let lookup = |_: &str| Some(member_public.clone());
    let _ = registrar.handle_hello("m", data, &lookup, &mut rng);
    let mut registration = Registration::new("g", "m", "s", member, server.public());
    let _ = registration.handle_invite("s", data, view, &mut rng);
    let _ = registration.handle_welcome("s", data);
});
