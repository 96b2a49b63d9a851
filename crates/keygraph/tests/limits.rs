//! Limits: a batch too large for one message is cut by subtrees; recipients names that do not
//! exist reach nobody.

use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{GroupKey, Identity, SigScheme};
use conclave_keygraph::{
    GraphKind, JoinAck, Member, MemberConfig, Server, ServerConfig, Signing, Strategy, UserId,
};
use conclave_wire::lkh::{Recipients, RekeyMessage, MAX_ITEMS};
use rand_chacha::rand_core::SeedableRng;

#[test]
fn a_batch_over_the_item_limit_is_cut_into_messages_every_member_can_use() {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
    let id = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
    let mut cfg = ServerConfig::new("big", GraphKind::Tree { degree: 4 });
    cfg.strategy = Strategy::Group;
    cfg.signing = Signing::Batch;
    let mut s = Server::new(cfg, Some(id)).unwrap();
    let n = 70_000u64;
    let mut acks: Vec<(JoinAck, GroupKey)> = Vec::new();
    for u in 0..n {
        let k = GroupKey::from_bytes([(u % 251) as u8; 32]);
        acks.push((s.queue_join(UserId(u), &k).unwrap(), k));
    }
    assert!(s.rekey_batch(&mut rng).unwrap());
    let mut msgs = Vec::new();
    while let Some(t) = s.poll_transmit() {
        let (m, _) = RekeyMessage::decode(&t.bytes).unwrap();
        assert!(m.items.len() <= MAX_ITEMS);
        msgs.push((t, m));
    }
    assert!(msgs.len() > 1, "cut into several messages");
    let (_, gk) = s.group_key().unwrap();
    let cfg = MemberConfig {
        group: "big".into(),
        graph: GraphKind::Tree { degree: 4 },
        aead: AeadAlg::Aes256Gcm,
        server: s.public_identity(),
    };
    for i in [0usize, 1, 4_095, 4_096, 35_000, 65_535, 69_999] {
        let (ack, k) = &acks[i];
        let mut m = Member::new(cfg.clone(), ack, k.clone()).unwrap();
        let mut applied = 0;
        for (t, _) in &msgs {
            let reach = s.recipients(&t.recipients);
            let r = m.handle_rekey(&t.bytes);
            if reach.contains(&ack.user) {
                r.unwrap();
                applied += 1;
            } else {
                assert!(r.is_err());
            }
        }
        assert_eq!(applied, 1, "member {i}");
        assert_eq!(m.group_key().unwrap().1, &gk);
    }
}

#[test]
fn recipients_that_name_no_node_reach_nobody() {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(6);
    let mut cfg = ServerConfig::new("g", GraphKind::Tree { degree: 3 });
    cfg.signing = Signing::None;
    let mut s = Server::new(cfg, None).unwrap();
    for u in 0..10 {
        s.join(UserId(u), &GroupKey::from_bytes([1; 32]), &mut rng)
            .unwrap();
    }
    for id in [u64::MAX, 40 << 32, 3 << 32 | 7, 1 << 32 | 1_000_000] {
        assert!(s.recipients(&Recipients::Holders(id)).is_empty());
        assert!(s.recipients(&Recipients::HoldersExcept(id, 0)).is_empty());
    }
    assert_eq!(s.recipients(&Recipients::All).len(), 10);
}
