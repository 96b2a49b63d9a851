//! The registration exchange: an honest run gives both ends one individual key that admits the
//! member to the key graph; every hostile variation is a typed error and spends nothing the honest
//! run still needs.

use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{Group, Identity, PublicIdentity, Ristretto255, SigScheme};
use conclave_keygraph::{
    GraphKind, JoinAck, Member, MemberConfig, RegisterError, Registrar, Registration, Server,
    ServerConfig, Slot, UserId,
};
use conclave_wire::client::GroupViewId;
use conclave_wire::gcs::RingId;
use conclave_wire::keyserver::{Exchange, RegisterMsg};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

const GROUP: &str = "feed";
const SERVER: &str = "#ks#d1";
const ALICE: &str = "#alice#d2";

fn view(index: u64) -> GroupViewId {
    GroupViewId {
        ring: RingId {
            seq: 4,
            rep: 1,
            inc: 1,
        },
        index,
    }
}

struct World {
    rng: ChaCha20Rng,
    registrar: Registrar,
    server_id: PublicIdentity,
    alice_id: Identity,
    directory: Vec<(String, PublicIdentity)>,
}

impl World {
    fn new() -> World {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let server = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
        let alice = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
        World {
            server_id: server.public(),
            directory: vec![(ALICE.into(), alice.public())],
            registrar: Registrar::new(GROUP, SERVER, server).unwrap(),
            alice_id: alice,
            rng,
        }
    }
    fn alice(&self) -> Registration {
        Registration::new(
            GROUP,
            ALICE,
            SERVER,
            self.alice_id.clone(),
            self.server_id.clone(),
        )
        .unwrap()
    }
    /// Invite, then hello: returns the hello.
    fn hello(&mut self, alice: &mut Registration, v: GroupViewId) -> Vec<u8> {
        let invite = self.registrar.invite(ALICE, v, &mut self.rng).unwrap();
        alice
            .handle_invite(SERVER, &invite, v, &mut self.rng)
            .unwrap()
    }
    fn handle_hello(
        &mut self,
        from: &str,
        hello: &[u8],
    ) -> Result<conclave_keygraph::Registered, RegisterError> {
        self.handle_hello_admitting(from, hello, &mut |_, _| Ok(b"admitted".to_vec()))
    }
    fn handle_hello_admitting(
        &mut self,
        from: &str,
        hello: &[u8],
        admit: &mut conclave_keygraph::Admit<'_>,
    ) -> Result<conclave_keygraph::Registered, RegisterError> {
        let dir = self.directory.clone();
        let lookup = move |m: &str| dir.iter().find(|(n, _)| n == m).map(|(_, k)| k.clone());
        self.registrar
            .handle_hello(from, hello, &lookup, admit, &mut self.rng)
    }
}

/// A join ack as a test service would put it in the admission: user, slot, epoch.
fn encode_ack(a: &JoinAck) -> Vec<u8> {
    let mut v = a.user.0.to_be_bytes().to_vec();
    v.extend_from_slice(&a.slot.0.to_be_bytes());
    v.extend_from_slice(&a.epoch.to_be_bytes());
    v
}
fn decode_ack(b: &[u8]) -> JoinAck {
    JoinAck {
        user: UserId(u64::from_be_bytes(b[..8].try_into().unwrap())),
        slot: Slot(u32::from_be_bytes(b[8..12].try_into().unwrap())),
        epoch: u64::from_be_bytes(b[12..20].try_into().unwrap()),
    }
}

#[test]
fn both_ends_derive_one_key_that_admits_the_member() {
    let mut w = World::new();
    let mut alice = w.alice();
    let hello = w.hello(&mut alice, view(1));
    assert!(alice.waiting());
    assert_eq!(w.registrar.waiting(), 1);
    let reg = w.handle_hello(ALICE, &hello).unwrap();
    assert_eq!(reg.member, ALICE);
    assert_eq!(w.registrar.waiting(), 0);
    let welcomed = alice.handle_welcome(SERVER, &reg.welcome).unwrap();
    assert_eq!(welcomed.key.expose(), reg.key.expose());
    assert_eq!(welcomed.admission, b"admitted");
    assert!(!alice.waiting());

    // A second registration gives another key, and admits the member to a key graph: the welcome
    // tells it its place, and the server's join rekey opens under the key.
    let mut server = Server::new(ServerConfig::new(GROUP, GraphKind::Tree { degree: 4 }), {
        let mut rng = ChaCha20Rng::seed_from_u64(6);
        Some(Identity::generate(SigScheme::Ed25519, &mut rng).unwrap())
    })
    .unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let hello = w.hello(&mut alice, view(2));
    let again = w
        .handle_hello_admitting(ALICE, &hello, &mut |_, key| {
            let ack = server
                .join(UserId(1), key, &mut rng)
                .map_err(|e| RegisterError::Admission(e.to_string()))?;
            Ok(encode_ack(&ack))
        })
        .unwrap();
    assert_ne!(again.key.expose(), reg.key.expose());
    let welcomed = alice.handle_welcome(SERVER, &again.welcome).unwrap();
    assert_eq!(welcomed.key.expose(), again.key.expose());
    let ack = decode_ack(&welcomed.admission);
    assert_eq!(ack.user, UserId(1));
    let cfg = MemberConfig {
        group: GROUP.into(),
        graph: GraphKind::Tree { degree: 4 },
        aead: AeadAlg::Aes256Gcm,
        server: server.public_identity(),
    };
    let mut member = Member::new(cfg, &ack, welcomed.key).unwrap();
    while let Some(t) = server.poll_transmit() {
        member.handle_rekey(&t.bytes).unwrap();
    }
    assert_eq!(
        member.group_key().map(|(r, k)| (r, *k.expose())),
        server.group_key().map(|(r, k)| (r, *k.expose()))
    );
}

#[test]
fn a_failed_admission_spends_nothing_and_a_done_one_cannot_be_replayed() {
    let mut w = World::new();
    let mut alice = w.alice();
    let hello = w.hello(&mut alice, view(1));
    assert_eq!(
        w.handle_hello_admitting(ALICE, &hello, &mut |_, _| Err(RegisterError::Admission(
            "group full".into()
        )))
        .err(),
        Some(RegisterError::Admission("group full".into()))
    );
    // The invitation still stands.
    let reg = w.handle_hello(ALICE, &hello).unwrap();
    alice.handle_welcome(SERVER, &reg.welcome).unwrap();

    // Once the member is admitted the invitation is spent, even if no welcome can follow (here an
    // admission too long to send): a replayed hello must not admit it twice.
    let hello = w.hello(&mut alice, view(2));
    let mut admitted = 0;
    assert!(matches!(
        w.handle_hello_admitting(ALICE, &hello, &mut |_, _| {
            admitted += 1;
            Ok(vec![0; 257])
        }),
        Err(RegisterError::AdmittedWithoutWelcome { ref member, .. }) if member == ALICE
    ));
    assert_eq!(
        w.handle_hello_admitting(ALICE, &hello, &mut |_, _| {
            admitted += 1;
            Ok(vec![])
        })
        .err(),
        Some(RegisterError::NotInvited)
    );
    assert_eq!(admitted, 1);
}

#[test]
fn the_server_refuses_replayed_stale_forged_and_unknown_hellos() {
    let mut w = World::new();
    let mut alice = w.alice();

    // Replayed: the nonce is spent by its first use.
    let hello = w.hello(&mut alice, view(1));
    w.handle_hello(ALICE, &hello).unwrap();
    assert_eq!(
        w.handle_hello(ALICE, &hello).err(),
        Some(RegisterError::NotInvited)
    );

    // Stale: a new view voids the invitations of the old one.
    let hello = w.hello(&mut alice, view(2));
    w.registrar.new_view();
    assert_eq!(
        w.handle_hello(ALICE, &hello).err(),
        Some(RegisterError::NotInvited)
    );

    // Never invited.
    let mut fresh = World::new();
    assert_eq!(
        fresh.handle_hello(ALICE, &hello).err(),
        Some(RegisterError::NotInvited)
    );
    // Invited in another view than the hello names, with the same nonce.
    let invite = w.registrar.invite(ALICE, view(2), &mut w.rng).unwrap();
    let RegisterMsg::Invite { mut exchange, .. } = RegisterMsg::decode(&invite).unwrap() else {
        panic!("an invite")
    };
    exchange.view = view(3);
    let element = Ristretto255::encode(&Ristretto255::exp_g(&Ristretto255::random_scalar(
        &mut w.rng,
    )))
    .try_into()
    .unwrap();
    let moved = signed_hello(&w.alice_id, exchange, element);
    assert_eq!(
        w.handle_hello(ALICE, &moved).err(),
        Some(RegisterError::NotInvited)
    );

    // Sent by someone else than the member it names.
    let hello = w.hello(&mut alice, view(3));
    assert_eq!(
        w.handle_hello("#mallory#d3", &hello).err(),
        Some(RegisterError::WrongSender("#mallory#d3".into()))
    );

    // Altered in flight: the signature covers the element, the nonce and the names.
    let RegisterMsg::Hello {
        exchange,
        element,
        signature,
    } = RegisterMsg::decode(&hello).unwrap()
    else {
        panic!("a hello")
    };
    let mut other = element;
    other[0] ^= 1;
    let altered = RegisterMsg::Hello {
        exchange: exchange.clone(),
        element: other,
        signature: signature.clone(),
    };
    assert_eq!(
        w.handle_hello(ALICE, &altered.encode()).err(),
        Some(RegisterError::BadSignature(ALICE.into()))
    );
    // A refused hello spends nothing: the genuine one still registers.
    w.handle_hello(ALICE, &hello).unwrap();

    // Signed by an impostor holding another identity.
    let mallory = Identity::generate(SigScheme::Ed25519, &mut w.rng).unwrap();
    let mut impostor =
        Registration::new(GROUP, ALICE, SERVER, mallory, w.server_id.clone()).unwrap();
    let forged = w.hello(&mut impostor, view(4));
    assert_eq!(
        w.handle_hello(ALICE, &forged).err(),
        Some(RegisterError::BadSignature(ALICE.into()))
    );

    // Unknown to the directory; the invitation stands for when it is known.
    let directory = std::mem::take(&mut w.directory);
    let hello = w.hello(&mut alice, view(5));
    assert_eq!(
        w.handle_hello(ALICE, &hello).err(),
        Some(RegisterError::UnknownIdentity(ALICE.into()))
    );
    w.directory = directory;
    w.handle_hello(ALICE, &hello).unwrap();

    // Names the wire cannot carry are refused, not a panic.
    assert_eq!(
        w.registrar.invite("", view(6), &mut w.rng).err(),
        Some(RegisterError::BadName)
    );
    assert_eq!(
        w.registrar
            .invite(&"m".repeat(65), view(6), &mut w.rng)
            .err(),
        Some(RegisterError::BadName)
    );
    assert!(Registrar::new("", SERVER, w.alice_id.clone()).is_err());
}

#[test]
fn the_server_refuses_the_identity_element_even_signed() {
    let mut w = World::new();
    let invite = w.registrar.invite(ALICE, view(1), &mut w.rng).unwrap();
    let RegisterMsg::Invite { exchange, .. } = RegisterMsg::decode(&invite).unwrap() else {
        panic!("an invite")
    };
    let identity: [u8; 32] = Ristretto255::encode(&Ristretto255::exp_small(
        &Ristretto255::exp_g(&Ristretto255::random_scalar(&mut w.rng)),
        0,
    ))
    .try_into()
    .unwrap();
    let hello = signed_hello(&w.alice_id, exchange, identity);
    assert_eq!(
        w.handle_hello(ALICE, &hello).err(),
        Some(RegisterError::BadElement)
    );
}

/// A hello as a misbehaving member would sign it (the signed bytes as `Registration` makes them).
fn signed_hello(id: &Identity, exchange: Exchange, element: [u8; 32]) -> Vec<u8> {
    let mut w = conclave_wire::Writer::new();
    exchange.write(&mut w);
    let mut signed = b"conclave keyserver hello v1".to_vec();
    signed.extend_from_slice(w.as_slice());
    signed.extend_from_slice(&element);
    RegisterMsg::Hello {
        exchange,
        element,
        signature: id.sign(&signed).unwrap(),
    }
    .encode()
}

#[test]
fn the_member_refuses_foreign_stale_replayed_and_forged_messages() {
    let mut w = World::new();
    let mut alice = w.alice();

    // An invitation from someone else than the server, for another view, or for someone else.
    let invite = w.registrar.invite(ALICE, view(1), &mut w.rng).unwrap();
    assert_eq!(
        alice
            .handle_invite("#mallory#d3", &invite, view(1), &mut w.rng)
            .err(),
        Some(RegisterError::WrongSender("#mallory#d3".into()))
    );
    assert!(matches!(
        alice.handle_invite(SERVER, &invite, view(2), &mut w.rng),
        Err(RegisterError::StaleView { .. })
    ));
    let for_bob = w.registrar.invite("#bob#d2", view(1), &mut w.rng).unwrap();
    assert_eq!(
        alice
            .handle_invite(SERVER, &for_bob, view(1), &mut w.rng)
            .err(),
        Some(RegisterError::Misaddressed)
    );
    assert_eq!(
        alice
            .handle_invite(SERVER, b"\x01\x09", view(1), &mut w.rng)
            .err(),
        Some(RegisterError::Decode(conclave_wire::DecodeError::BadTag {
            what: "registration kind",
            tag: 9
        }))
    );

    // An invitation signed by someone else than the server, or not by the server it names.
    let rogue_id = Identity::generate(SigScheme::Ed25519, &mut w.rng).unwrap();
    let mut rogue = Registrar::new(GROUP, SERVER, rogue_id.clone()).unwrap();
    let rogue_invite = rogue.invite(ALICE, view(1), &mut w.rng).unwrap();
    assert_eq!(
        alice
            .handle_invite(SERVER, &rogue_invite, view(1), &mut w.rng)
            .err(),
        Some(RegisterError::BadSignature(SERVER.into()))
    );
    assert!(!alice.waiting(), "a refused invite draws no ephemeral");

    // A replayed invite gets the same hello, so either copy's welcome registers.
    let hello = alice
        .handle_invite(SERVER, &invite, view(1), &mut w.rng)
        .unwrap();
    assert_eq!(
        alice
            .handle_invite(SERVER, &invite, view(1), &mut w.rng)
            .unwrap(),
        hello
    );

    // A welcome whose signature is another identity's.
    let reg = w.handle_hello(ALICE, &hello).unwrap();
    let RegisterMsg::Welcome {
        exchange,
        member_element,
        element,
        admission,
        ..
    } = RegisterMsg::decode(&reg.welcome).unwrap()
    else {
        panic!("a welcome")
    };
    let rogue_welcome = RegisterMsg::Welcome {
        exchange,
        member_element,
        element,
        admission,
        signature: rogue_id.sign(&reg.welcome).unwrap(),
    }
    .encode();
    assert_eq!(
        alice.handle_welcome(SERVER, &rogue_welcome).err(),
        Some(RegisterError::BadSignature(SERVER.into()))
    );
    assert!(
        alice.waiting(),
        "a refused welcome leaves the member waiting"
    );

    // The genuine welcome, then the same welcome again.
    // Wrong kinds at each end.
    assert_eq!(
        alice.handle_welcome(SERVER, &invite).err(),
        Some(RegisterError::WrongKind)
    );
    assert_eq!(
        w.handle_hello(ALICE, &reg.welcome).err(),
        Some(RegisterError::WrongKind)
    );
    // A welcome altered in flight: the server's element, or the admission.
    let RegisterMsg::Welcome {
        exchange,
        member_element,
        element,
        admission,
        signature,
    } = RegisterMsg::decode(&reg.welcome).unwrap()
    else {
        panic!("a welcome")
    };
    let mut other = element;
    other[5] ^= 4;
    let mut other_admission = admission.clone();
    other_admission[0] ^= 1;
    for (element, admission) in [(other, admission), (element, other_admission)] {
        let altered = RegisterMsg::Welcome {
            exchange: exchange.clone(),
            member_element,
            element,
            admission,
            signature: signature.clone(),
        }
        .encode();
        assert_eq!(
            alice.handle_welcome(SERVER, &altered).err(),
            Some(RegisterError::BadSignature(SERVER.into()))
        );
    }
    alice.handle_welcome(SERVER, &reg.welcome).unwrap();
    assert_eq!(
        alice.handle_welcome(SERVER, &reg.welcome).err(),
        Some(RegisterError::NotWaiting)
    );
}

#[test]
fn a_replayed_invite_cannot_push_out_the_exchange_the_server_answers() {
    let mut w = World::new();
    let mut alice = w.alice();
    // The server invites five times in one view; only its last invitation stands.
    let invites: Vec<Vec<u8>> = (0..5)
        .map(|_| w.registrar.invite(ALICE, view(1), &mut w.rng).unwrap())
        .collect();
    let hellos: Vec<Vec<u8>> = invites
        .iter()
        .map(|i| alice.handle_invite(SERVER, i, view(1), &mut w.rng).unwrap())
        .collect();
    // The first hello was dropped to make room; replaying its invite draws nothing new.
    for _ in 0..5 {
        assert_eq!(
            alice
                .handle_invite(SERVER, &invites[0], view(1), &mut w.rng)
                .err(),
            Some(RegisterError::ReplayedInvite)
        );
    }
    let reg = w.handle_hello(ALICE, &hellos[4]).unwrap();
    alice.handle_welcome(SERVER, &reg.welcome).unwrap();
}

/// Many members invited under one signature: each finds its own invitation, the exchange goes on
/// as with a single one, and an altered list or a list without the member gives nothing.
#[test]
fn invitations_for_many_members_register_each() {
    let mut w = World::new();
    let mut alice = w.alice();
    let others: Vec<String> = (0..1500).map(|i| format!("#m{i}#d3")).collect();
    let mut names = others.clone();
    names.insert(700, ALICE.into());
    let msgs = w
        .registrar
        .invite_many(&names, view(1), &mut w.rng)
        .unwrap();
    assert_eq!(msgs.len(), 2, "at most MAX_INVITED to a message");
    assert_eq!(w.registrar.waiting(), names.len());
    // The message that does not name alice is not hers.
    assert_eq!(
        alice
            .handle_invitations(SERVER, &msgs[1], view(1), &mut w.rng)
            .unwrap(),
        None
    );
    // Altered: another nonce for alice breaks the signature.
    let mut bad = msgs[0].clone();
    let at = bad.invited.iter().position(|(m, _)| m == ALICE).unwrap();
    bad.invited[at].1[0] ^= 1;
    assert!(matches!(
        alice.handle_invitations(SERVER, &bad, view(1), &mut w.rng),
        Err(RegisterError::BadSignature(_))
    ));
    // From someone else, or of another view.
    assert!(alice
        .handle_invitations(ALICE, &msgs[0], view(1), &mut w.rng)
        .is_err());
    assert!(matches!(
        alice.handle_invitations(SERVER, &msgs[0], view(2), &mut w.rng),
        Err(RegisterError::StaleView { .. })
    ));
    let hello = alice
        .handle_invitations(SERVER, &msgs[0], view(1), &mut w.rng)
        .unwrap()
        .unwrap();
    // The same invitations again give the same hello.
    let again = alice
        .handle_invitations(SERVER, &msgs[0], view(1), &mut w.rng)
        .unwrap()
        .unwrap();
    assert_eq!(hello, again);
    let reg = w.handle_hello(ALICE, &hello).unwrap();
    let welcomed = alice.handle_welcome(SERVER, &reg.welcome).unwrap();
    assert_eq!(welcomed.key.expose(), reg.key.expose());
    assert_eq!(w.registrar.waiting(), names.len() - 1);
}
