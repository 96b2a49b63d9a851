//! Hostile rekey messages: tampered, truncated, replayed, skipped, foreign, unsigned or signed by
//! someone else. Each is a typed error and leaves the member as it was; the genuine message still
//! applies afterwards.

use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{GroupKey, Identity, SigScheme};
use conclave_keygraph::{
    GraphKind, Member, MemberConfig, MemberError, Server, ServerConfig, Signing, Strategy, UserId,
};
use conclave_wire::lkh::{Auth, RekeyMessage};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

struct Setup {
    server: Server,
    members: Vec<Member>,
    rng: ChaCha20Rng,
}

fn setup(signing: Signing, strategy: Strategy) -> Setup {
    let mut rng = ChaCha20Rng::seed_from_u64(99);
    let id = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
    let mut cfg = ServerConfig::new("hostile", GraphKind::Tree { degree: 4 });
    cfg.signing = signing;
    cfg.strategy = strategy;
    let keys: Vec<(UserId, [u8; 32])> = (0..16)
        .map(|u| {
            let mut k = [0u8; 32];
            rng.fill_bytes(&mut k);
            (UserId(u), k)
        })
        .collect();
    let server = Server::with_members(cfg, Some(id), keys, &mut rng).unwrap();
    let members = (0..16)
        .map(|u| {
            let (slot, keys) = server.member_keys(UserId(u)).unwrap();
            Member::with_keys(
                member_config(&server),
                UserId(u),
                slot,
                0,
                keys,
                server.shape(),
            )
            .unwrap()
        })
        .collect();
    Setup {
        server,
        members,
        rng,
    }
}

fn member_config(server: &Server) -> MemberConfig {
    MemberConfig {
        group: server.config().group.clone(),
        graph: server.config().graph,
        aead: AeadAlg::Aes256Gcm,
        server: if server.config().signing == Signing::None {
            None
        } else {
            server.public_identity()
        },
    }
}

fn snapshot(m: &Member) -> (Option<u64>, Vec<(conclave_wire::lkh::KeyRef, GroupKey)>) {
    (m.epoch(), m.keys())
}

/// The message member 0 should apply after member 15 leaves.
fn message_for_member_0(s: &mut Setup) -> Vec<u8> {
    s.server.leave(UserId(15), &mut s.rng).unwrap();
    let mut mine = None;
    while let Some(t) = s.server.poll_transmit() {
        if s.server.recipients(&t.recipients).contains(&UserId(0)) {
            mine = Some(t.bytes);
        }
    }
    mine.expect("a message for member 0")
}

#[test]
fn tampered_and_truncated_messages_change_nothing() {
    for signing in [Signing::Batch, Signing::PerMessage, Signing::None] {
        let mut s = setup(signing, Strategy::Key);
        let fresh = |s: &Setup| {
            let (slot, keys) = s.server.member_keys(UserId(0)).unwrap();
            (slot, keys)
        };
        let (slot0, keys0) = fresh(&s);
        let bytes = message_for_member_0(&mut s);
        let before = snapshot(&s.members[0]);
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80] {
                let mut bad = bytes.clone();
                bad[i] ^= flip;
                let m = &mut s.members[0];
                match m.handle_rekey(&bad) {
                    Err(_) => assert_eq!(snapshot(m), before),
                    // Unsigned, only the items are protected (by the AEAD): a change to the
                    // addressing may pass, but never yields a key other than the server's.
                    Ok(_) if signing == Signing::None => {
                        assert_eq!(m.group_key().unwrap().1, &s.server.group_key().unwrap().1);
                        s.members[0] = Member::with_keys(
                            member_config(&s.server),
                            UserId(0),
                            slot0,
                            0,
                            keys0.clone(),
                            conclave_wire::lkh::GraphShape::Tree {
                                degree: 4,
                                height: 2,
                            },
                        )
                        .unwrap();
                    }
                    Ok(a) => {
                        panic!("{signing:?}: flipping bit {flip:#x} of byte {i} applied: {a:?}")
                    }
                }
            }
        }
        let m = &mut s.members[0];
        for cut in 0..bytes.len() {
            assert!(m.handle_rekey(&bytes[..cut]).is_err());
        }
        assert_eq!(snapshot(m), before);
        m.handle_rekey(&bytes).unwrap();
        assert!(matches!(
            m.handle_rekey(&bytes),
            Err(MemberError::Stale { .. })
        ));
    }
}

#[test]
fn signatures_are_required_and_checked() {
    let mut s = setup(Signing::Batch, Strategy::Group);
    let bytes = message_for_member_0(&mut s);
    let (msg, _) = RekeyMessage::decode(&bytes).unwrap();
    // Stripped of its signature.
    let mut unsigned = msg.clone();
    unsigned.auth = Auth::None;
    assert_eq!(
        s.members[0].handle_rekey(&unsigned.encode()),
        Err(MemberError::Unsigned)
    );
    // Signed by someone else.
    let mallory = Identity::generate(SigScheme::Ed25519, &mut s.rng).unwrap();
    let mut forged = msg.clone();
    forged.auth = Auth::Signed {
        signature: mallory
            .sign(&conclave_keygraph::merkle::signed_message(
                &conclave_keygraph::merkle::digest_of(&msg, &msg.body()),
            ))
            .unwrap(),
    };
    assert_eq!(
        s.members[0].handle_rekey(&forged.encode()),
        Err(MemberError::BadSignature)
    );
    // A path that does not fit its leaf count.
    let mut bad_path = msg.clone();
    if let Auth::Batch { leaf_count, .. } = &mut bad_path.auth {
        *leaf_count += 1;
    }
    assert!(s.members[0].handle_rekey(&bad_path.encode()).is_err());
    s.members[0].handle_rekey(&bytes).unwrap();
}

#[test]
fn foreign_skipped_and_misaddressed_messages_are_refused() {
    let mut s = setup(Signing::Batch, Strategy::Key);
    let first = message_for_member_0(&mut s);
    // Another group's member refuses it.
    let mut other_cfg = member_config(&s.server);
    other_cfg.group = "elsewhere".into();
    let (slot, keys) = s.server.member_keys(UserId(1)).unwrap();
    let mut stranger =
        Member::with_keys(other_cfg, UserId(1), slot, 0, keys, s.server.shape()).unwrap();
    assert!(matches!(
        stranger.handle_rekey(&first),
        Err(MemberError::WrongGroup(_))
    ));
    // The next epoch's message before this one: a gap.
    s.server.leave(UserId(14), &mut s.rng).unwrap();
    let mut second = None;
    while let Some(t) = s.server.poll_transmit() {
        if s.server.recipients(&t.recipients).contains(&UserId(0)) {
            second = Some(t.bytes);
        }
    }
    let second = second.unwrap();
    assert!(matches!(
        s.members[0].handle_rekey(&second),
        Err(MemberError::Gap { .. })
    ));
    s.members[0].handle_rekey(&first).unwrap();
    s.members[0].handle_rekey(&second).unwrap();
    assert_eq!(
        s.members[0].group_key().unwrap().1,
        &s.server.group_key().unwrap().1
    );
}

#[test]
fn server_refuses_bad_requests_with_typed_errors() {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let cfg = ServerConfig::new("g", GraphKind::Tree { degree: 1 });
    assert!(Server::new(cfg, None).is_err());
    let cfg = ServerConfig::new("g", GraphKind::Tree { degree: 4 });
    assert!(matches!(
        Server::new(cfg.clone(), None),
        Err(conclave_keygraph::ServerError::NoIdentity)
    ));
    let id = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
    let mut s = Server::new(cfg, Some(id)).unwrap();
    let k = GroupKey::from_bytes([7; 32]);
    s.join(UserId(1), &k, &mut rng).unwrap();
    assert!(matches!(
        s.join(UserId(1), &k, &mut rng),
        Err(conclave_keygraph::ServerError::AlreadyMember(_))
    ));
    assert!(matches!(
        s.leave(UserId(2), &mut rng),
        Err(conclave_keygraph::ServerError::NotMember(_))
    ));
    let mut c = ServerConfig::new("c", GraphKind::Complete);
    c.signing = Signing::None;
    let mut s = Server::new(c, None).unwrap();
    for u in 0..12 {
        s.join(UserId(u), &k, &mut rng).unwrap();
    }
    assert!(matches!(
        s.join(UserId(12), &k, &mut rng),
        Err(conclave_keygraph::ServerError::Full { .. })
    ));
    assert!(matches!(
        s.queue_join(UserId(13), &k),
        Err(conclave_keygraph::ServerError::BatchOnComplete)
    ));
}

#[test]
fn members_refuse_slots_their_graph_cannot_have() {
    let cfg = MemberConfig {
        group: "c".into(),
        graph: GraphKind::Complete,
        aead: AeadAlg::Aes256Gcm,
        server: None,
    };
    let ack = conclave_keygraph::JoinAck {
        user: UserId(1),
        slot: conclave_keygraph::Slot(64),
        epoch: 1,
    };
    assert_eq!(
        Member::new(cfg.clone(), &ack, GroupKey::from_bytes([1; 32])).unwrap_err(),
        MemberError::BadSlot(conclave_keygraph::Slot(64))
    );
    let shape = conclave_wire::lkh::GraphShape::Complete { members: 1 };
    assert!(matches!(
        Member::with_keys(
            cfg,
            UserId(1),
            conclave_keygraph::Slot(12),
            0,
            vec![],
            shape
        ),
        Err(MemberError::BadSlot(_))
    ));
}

/// A message of the member's epoch is read before its signature only if its shape fits the
/// member's graph: a forged shape (degree 0, or a complete graph to a tree member) with
/// recipients that would make the reading divide by zero or shift past 64 bits is refused, never
/// a panic.
#[test]
fn forged_shapes_are_refused_before_they_are_read() {
    use conclave_wire::lkh::{GraphShape, Recipients};
    let mut s = setup(Signing::Batch, Strategy::Key);
    let genuine = message_for_member_0(&mut s);
    let (msg, _) = RekeyMessage::decode(&genuine).unwrap();
    let level1 = conclave_keygraph::NodeIndex::ancestor(conclave_keygraph::Slot(0), 4, 1).id();
    let forged = [
        (
            GraphShape::Tree {
                degree: 0,
                height: 3,
            },
            Recipients::Holders(level1),
        ),
        (
            GraphShape::Tree {
                degree: 1,
                height: 3,
            },
            Recipients::Holders(level1),
        ),
        (
            GraphShape::Complete { members: u64::MAX },
            Recipients::Holders(1 << 63),
        ),
    ];
    for (shape, recipients) in forged {
        let mut m = msg.clone();
        m.shape = shape;
        m.recipients = recipients;
        let before = snapshot(&s.members[0]);
        assert!(s.members[0].handle_rekey(&m.encode()).is_err());
        assert_eq!(snapshot(&s.members[0]), before);
    }
    s.members[0].handle_rekey(&genuine).unwrap();
}
