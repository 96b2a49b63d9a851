//! The registration decoder never panics, and what decodes re-encodes to the same bytes; both
//! ends of the exchange, fed the input or a genuine message altered by it, return an error or a
//! result, never panic; and an altered message never registers anyone.
#![no_main]
use conclave_crypto::Identity;
use conclave_keygraph::{Registrar, Registration};
use conclave_wire::client::GroupViewId;
use conclave_wire::gcs::RingId;
use conclave_wire::keyserver::RegisterMsg;
use libfuzzer_sys::fuzz_target;
use rand_chacha::rand_core::SeedableRng;

/// `genuine` with `data` XORed over it (and whatever of `data` is longer, appended).
fn altered(genuine: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = genuine.to_vec();
    for (i, d) in data.iter().enumerate() {
        match out.get_mut(i) {
            Some(b) => *b ^= d,
            None => out.push(*d),
        }
    }
    out
}

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
    let lookup = |_: &str| Some(member_public.clone());
    let mut registrar = Registrar::new("g", "s", server.clone()).expect("names");
    let mut registration = Registration::new("g", "m", "s", member, server.public()).expect("names");
    let changed = data.iter().any(|&b| b != 0);

    // The member side: an invite, then welcomes.
    let invite = registrar.invite("m", view, &mut rng).expect("invite");
    let _ = registration.handle_invite("s", data, view, &mut rng);
    if changed {
        let bad = registration.handle_invite("s", &altered(&invite, data), view, &mut rng);
        assert!(bad.is_err(), "an altered invite was taken");
    }
    let hello = registration
        .handle_invite("s", &invite, view, &mut rng)
        .expect("the genuine invite");
    let _ = registration.handle_welcome("s", data);

    // The server side: hellos, the genuine one last.
    let mut admit = |_: &str, _: &conclave_crypto::GroupKey| Ok(vec![1]);
    let _ = registrar.handle_hello("m", data, &lookup, &mut admit, &mut rng);
    if changed {
        let bad = registrar.handle_hello("m", &altered(&hello, data), &lookup, &mut admit, &mut rng);
        assert!(bad.is_err(), "an altered hello registered");
    }
    let welcome = registrar
        .handle_hello("m", &hello, &lookup, &mut admit, &mut rng)
        .expect("the genuine hello")
        .welcome;
    if changed {
        let bad = registration.handle_welcome("s", &altered(&welcome, data));
        assert!(bad.is_err(), "an altered welcome was taken");
    }
    registration
        .handle_welcome("s", &welcome)
        .expect("the genuine welcome");
});
