//! The key server's state at rest: a restored server goes on exactly as the one that saved it
//! would have (same keys, same epochs, same messages, byte for byte), what was queued or not yet
//! sent survives, and a state that is altered, cut, another group's or opened with another
//! identity is refused with a typed error.

use conclave_crypto::{GroupKey, Identity, SigScheme};
use conclave_keygraph::{GraphKind, Server, ServerConfig, Signing, StateError, Strategy, UserId};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn identity(seed: u8) -> Identity {
    Identity::ed25519_from_seed(&[seed; 32]).unwrap()
}

fn key(rng: &mut ChaCha20Rng) -> GroupKey {
    let mut k = [0u8; 32];
    rng.fill_bytes(&mut k);
    GroupKey::from_bytes(k)
}

fn drain(s: &mut Server) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| s.poll_transmit().map(|t| t.bytes)).collect()
}

/// Every member's keys, and the group key.
type Keys = (
    Vec<Option<Vec<(conclave_wire::lkh::KeyRef, [u8; 32])>>>,
    Option<[u8; 32]>,
);
fn keys(s: &Server, users: u64) -> Keys {
    let members = (0..users)
        .map(|u| {
            s.member_keys(UserId(u))
                .map(|(_, ks)| ks.iter().map(|(r, k)| (*r, *k.expose())).collect())
        })
        .collect();
    (members, s.group_key().map(|(_, k)| *k.expose()))
}

/// A server of `graph` through joins, leaves (compaction moves members) and a queued batch.
fn busy_server(graph: GraphKind, strategy: Strategy, rng: &mut ChaCha20Rng) -> Server {
    let mut cfg = ServerConfig::new("feed", graph);
    cfg.strategy = strategy;
    cfg.signing = Signing::Batch;
    let mut s = Server::new(cfg, Some(identity(1))).unwrap();
    let n = if graph == GraphKind::Complete { 10 } else { 40 };
    for u in 0..n {
        s.join(UserId(u), &key(rng), rng).unwrap();
        drain(&mut s);
    }
    for u in (0..n).step_by(3) {
        s.leave(UserId(u), rng).unwrap();
        drain(&mut s);
    }
    if graph != GraphKind::Complete {
        s.queue_join(UserId(100), &key(rng)).unwrap();
        s.queue_leave(UserId(1)).unwrap();
    }
    s
}

#[test]
fn a_restored_server_goes_on_exactly_as_the_original() {
    for (graph, strategy) in [
        (GraphKind::Tree { degree: 4 }, Strategy::Key),
        (GraphKind::Tree { degree: 2 }, Strategy::User),
        (GraphKind::Star, Strategy::Group),
        (GraphKind::Complete, Strategy::Key),
    ] {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let mut original = busy_server(graph, strategy, &mut rng);
        let saved = original.save(&mut rng).unwrap();
        let mut restored = Server::restore(&saved, identity(1), Some("feed")).unwrap();
        assert_eq!(restored.epoch(), original.epoch(), "{graph:?}");
        assert_eq!(restored.members(), original.members());
        assert_eq!(keys(&restored, 101), keys(&original, 101), "{graph:?}");

        // The same requests with the same randomness give the same messages, byte for byte.
        let (mut a, mut b) = (rng.clone(), rng.clone());
        let steps = |s: &mut Server, rng: &mut ChaCha20Rng| -> Vec<Vec<u8>> {
            let mut out = Vec::new();
            if graph != GraphKind::Complete {
                s.rekey_batch(rng).unwrap();
                out.extend(drain(s));
            }
            s.leave(UserId(2), rng).unwrap();
            out.extend(drain(s));
            s.join(UserId(200), &GroupKey::from_bytes([9; 32]), rng)
                .unwrap();
            out.extend(drain(s));
            out
        };
        let sent = steps(&mut original, &mut a);
        assert!(!sent.is_empty());
        assert_eq!(steps(&mut restored, &mut b), sent, "{graph:?}");
        assert_eq!(keys(&restored, 201), keys(&original, 201));
    }
}

#[test]
fn messages_not_yet_sent_and_relocations_survive_a_restart() {
    let mut rng = ChaCha20Rng::seed_from_u64(4);
    let mut s = busy_server(GraphKind::Tree { degree: 4 }, Strategy::Key, &mut rng);
    s.rekey_batch(&mut rng).unwrap();
    // Saved after the rekey and before sending, as the service does.
    let saved = s.save(&mut rng).unwrap();
    let mut restored = Server::restore(&saved, identity(1), None).unwrap();
    let events: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
    let restored_events: Vec<_> = std::iter::from_fn(|| restored.poll_event()).collect();
    assert_eq!(restored_events, events);
    let sent = drain(&mut s);
    assert!(!sent.is_empty());
    assert_eq!(drain(&mut restored), sent);
}

#[test]
fn each_save_is_sealed_under_its_own_key() {
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let s = busy_server(GraphKind::Tree { degree: 4 }, Strategy::Key, &mut rng);
    let one = s.save(&mut rng).unwrap();
    let two = s.save(&mut rng).unwrap();
    // The same plaintext under two keys: the ciphertexts after the headers differ throughout.
    let header = 8 + 1 + 1 + "feed".len() + 32;
    assert_eq!(one.len(), two.len());
    let same = one[header..]
        .iter()
        .zip(&two[header..])
        .filter(|(a, b)| a == b)
        .count();
    assert!(same < one.len() / 64, "{same} equal bytes");
    // No key of the tree appears in the clear.
    let (members, group) = keys(&s, 101);
    let group = group.unwrap();
    assert!(!one.windows(32).any(|w| w == group));
    let first = &members.iter().flatten().next().unwrap()[0].1;
    assert!(!one.windows(32).any(|w| w == first));
    for saved in [one, two] {
        let r = Server::restore(&saved, identity(1), None).unwrap();
        assert_eq!(keys(&r, 101), keys(&s, 101));
    }
}

#[test]
fn altered_cut_foreign_and_misopened_states_are_refused() {
    let mut rng = ChaCha20Rng::seed_from_u64(6);
    let s = busy_server(GraphKind::Tree { degree: 4 }, Strategy::Key, &mut rng);
    let saved = s.save(&mut rng).unwrap();

    assert_eq!(
        Server::restore(&saved, identity(2), None).err(),
        Some(StateError::Open),
        "another identity"
    );
    assert_eq!(
        Server::restore(&saved, identity(1), Some("other")).err(),
        Some(StateError::OtherGroup("feed".into()))
    );
    for i in (0..saved.len()).step_by(97).chain([8, saved.len() - 1]) {
        let mut bad = saved.clone();
        bad[i] ^= 0x20;
        assert!(
            Server::restore(&bad, identity(1), None).is_err(),
            "byte {i} altered"
        );
    }
    for cut in [0, 5, 20, 60, saved.len() - 1] {
        assert!(
            Server::restore(&saved[..cut], identity(1), None).is_err(),
            "cut at {cut}"
        );
    }
    assert_eq!(
        Server::restore(b"not a state at all", identity(1), None).err(),
        Some(StateError::NotState)
    );

    // Persistence needs an identity to derive the key from.
    let mut cfg = ServerConfig::new("plain", GraphKind::Tree { degree: 4 });
    cfg.signing = Signing::None;
    let unsigned = Server::new(cfg, None).unwrap();
    assert_eq!(unsigned.save(&mut rng).err(), Some(StateError::NoIdentity));
}

#[test]
fn an_rsa_identity_finds_its_state_again() {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let id = Identity::generate(SigScheme::Rsa2048, &mut rng).unwrap();
    let mut cfg = ServerConfig::new("feed", GraphKind::Tree { degree: 4 });
    cfg.signing = Signing::PerMessage;
    let mut s = Server::new(cfg, Some(id.clone())).unwrap();
    for u in 0..5 {
        s.join(UserId(u), &key(&mut rng), &mut rng).unwrap();
    }
    let saved = s.save(&mut rng).unwrap();
    let r = Server::restore(&saved, id, None).unwrap();
    assert_eq!(keys(&r, 5), keys(&s, 5));
    let other = Identity::generate(SigScheme::Rsa2048, &mut rng).unwrap();
    assert_eq!(
        Server::restore(&saved, other, None).err(),
        Some(StateError::Open)
    );
}

#[test]
fn the_annex_is_sealed_with_the_state_and_given_back() {
    let mut rng = ChaCha20Rng::seed_from_u64(8);
    let s = busy_server(GraphKind::Tree { degree: 4 }, Strategy::Key, &mut rng);
    let annex = b"the names of the members, say".to_vec();
    let saved = s.save_with(&mut rng, &annex).unwrap();
    assert!(!saved.windows(annex.len()).any(|w| w == annex));
    let (r, back) = Server::restore_with(&saved, identity(1), Some("feed")).unwrap();
    assert_eq!(back.as_slice(), annex.as_slice());
    assert_eq!(keys(&r, 101), keys(&s, 101));
    // A state saved without an annex gives an empty one.
    let (_, none) = Server::restore_with(&s.save(&mut rng).unwrap(), identity(1), None).unwrap();
    assert!(none.is_empty());
    // Altering the annex's bytes breaks the seal like any other.
    let mut bad = saved.clone();
    let last = bad.len() - 20;
    bad[last] ^= 1;
    assert!(Server::restore_with(&bad, identity(1), None).is_err());
}
