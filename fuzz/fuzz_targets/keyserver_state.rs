//! The key server's state decoder (behind the sealing) never panics; a state it accepts saves
//! and restores to the same bytes, and takes requests without panicking.
#![no_main]
use conclave_crypto::{GroupKey, Identity};
use conclave_keygraph::{Server, UserId};
use libfuzzer_sys::fuzz_target;
use rand_chacha::rand_core::SeedableRng;

fuzz_target!(|data: &[u8]| {
    let identity = Identity::ed25519_from_seed(&[1; 32]).expect("seed");
    let Ok(mut server) = Server::restore_unsealed(data, identity.clone()) else {
        return;
    };
    assert_eq!(server.save_unsealed(), data, "state round trip");
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
    let sealed = server.save(&mut rng).expect("identity");
    let again = Server::restore(&sealed, identity, None).expect("own state");
    assert_eq!(again.save_unsealed(), data);
    let _ = server.rekey_batch(&mut rng);
    for u in (0..24).chain([1000]) {
        let _ = server.leave(UserId(u), &mut rng);
    }
    let _ = server.join(UserId(77), &GroupKey::from_bytes([5; 32]), &mut rng);
    while server.poll_transmit().is_some() {}
});
