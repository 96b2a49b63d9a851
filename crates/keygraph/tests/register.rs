//! The registration exchange: an honest run gives both ends one individual key that admits the
//! member to the key graph; every hostile variation is a typed error and spends nothing the honest
//! run still needs.

use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{Group, Identity, PublicIdentity, Ristretto255, SigScheme};
use conclave_keygraph::{
    GraphKind, Member, MemberConfig, RegisterError, Registrar, Registration, Server, ServerConfig,
    UserId,
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
            registrar: Registrar::new(GROUP, SERVER, server),
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
    }
    /// Invite, then hello: returns the hello.
    fn hello(&mut self, alice: &mut Registration, v: GroupViewId) -> Vec<u8> {
        let invite = self.registrar.invite(ALICE, v, &mut self.rng);
        alice
            .handle_invite(SERVER, &invite, v, &mut self.rng)
            .unwrap()
    }
    fn handle_hello(
        &mut self,
        from: &str,
        hello: &[u8],
    ) -> Result<conclave_keygraph::Registered, RegisterError> {
        let dir = self.directory.clone();
        let lookup = move |m: &str| dir.iter().find(|(n, _)| n == m).map(|(_, k)| k.clone());
        self.registrar
            .handle_hello(from, hello, &lookup, &mut self.rng)
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
    let key = alice.handle_welcome(SERVER, &reg.welcome).unwrap();
    assert_eq!(key.expose(), reg.key.expose());
    assert!(!alice.waiting());

    // A second registration gives another key.
    let hello = w.hello(&mut alice, view(2));
    let again = w.handle_hello(ALICE, &hello).unwrap();
    assert_ne!(again.key.expose(), reg.key.expose());
    let alice_key = alice.handle_welcome(SERVER, &again.welcome).unwrap();
    assert_eq!(alice_key.expose(), again.key.expose());

    // The key admits the member: the server's join rekey opens under it.
    let mut server = Server::new(ServerConfig::new(GROUP, GraphKind::Tree { degree: 4 }), {
        let mut rng = ChaCha20Rng::seed_from_u64(6);
        Some(Identity::generate(SigScheme::Ed25519, &mut rng).unwrap())
    })
    .unwrap();
    let ack = server.join(UserId(1), &again.key, &mut w.rng).unwrap();
    let cfg = MemberConfig {
        group: GROUP.into(),
        graph: GraphKind::Tree { degree: 4 },
        aead: AeadAlg::Aes256Gcm,
        server: server.public_identity(),
    };
    let mut member = Member::new(cfg, &ack, alice_key).unwrap();
    while let Some(t) = server.poll_transmit() {
        member.handle_rekey(&t.bytes).unwrap();
    }
    assert_eq!(
        member.group_key().map(|(r, k)| (r, *k.expose())),
        server.group_key().map(|(r, k)| (r, *k.expose()))
    );
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

    // Never invited, or invited in another view than the hello names.
    let mut fresh = World::new();
    assert_eq!(
        fresh.handle_hello(ALICE, &hello).err(),
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
    let mut impostor = Registration::new(GROUP, ALICE, SERVER, mallory, w.server_id.clone());
    let forged = w.hello(&mut impostor, view(4));
    assert_eq!(
        w.handle_hello(ALICE, &forged).err(),
        Some(RegisterError::BadSignature(ALICE.into()))
    );

    // Unknown to the directory.
    w.directory.clear();
    let hello = w.hello(&mut alice, view(5));
    assert_eq!(
        w.handle_hello(ALICE, &hello).err(),
        Some(RegisterError::UnknownIdentity(ALICE.into()))
    );
}

#[test]
fn the_server_refuses_the_identity_element_even_signed() {
    let mut w = World::new();
    let invite = w.registrar.invite(ALICE, view(1), &mut w.rng);
    let RegisterMsg::Invite(exchange) = RegisterMsg::decode(&invite).unwrap() else {
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
    let invite = w.registrar.invite(ALICE, view(1), &mut w.rng);
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
    let for_bob = w.registrar.invite("#bob#d2", view(1), &mut w.rng);
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

    // A welcome signed by another server identity.
    let hello = alice
        .handle_invite(SERVER, &invite, view(1), &mut w.rng)
        .unwrap();
    let mut rogue = Registrar::new(
        GROUP,
        SERVER,
        Identity::generate(SigScheme::Ed25519, &mut w.rng).unwrap(),
    );
    let rogue_invite = rogue.invite(ALICE, view(1), &mut w.rng);
    // The rogue needs the nonce of the hello it answers: it answers a hello made for its own invite.
    let mut alice2 = w.alice();
    let rogue_hello = alice2
        .handle_invite(SERVER, &rogue_invite, view(1), &mut w.rng)
        .unwrap();
    let lookup = |_: &str| Some(w.alice_id.public());
    let rogue_reg = rogue
        .handle_hello(ALICE, &rogue_hello, &lookup, &mut w.rng)
        .unwrap();
    assert_eq!(
        alice2.handle_welcome(SERVER, &rogue_reg.welcome).err(),
        Some(RegisterError::BadSignature(SERVER.into()))
    );
    assert!(
        alice2.waiting(),
        "a refused welcome leaves the member waiting"
    );

    // The genuine welcome, then the same welcome again.
    let reg = w.handle_hello(ALICE, &hello).unwrap();
    // Wrong kinds at each end.
    assert_eq!(
        alice.handle_welcome(SERVER, &invite).err(),
        Some(RegisterError::WrongKind)
    );
    assert_eq!(
        w.handle_hello(ALICE, &reg.welcome).err(),
        Some(RegisterError::WrongKind)
    );
    // A welcome altered in flight.
    let RegisterMsg::Welcome {
        exchange,
        member_element,
        element,
        signature,
    } = RegisterMsg::decode(&reg.welcome).unwrap()
    else {
        panic!("a welcome")
    };
    let mut other = element;
    other[5] ^= 4;
    let altered = RegisterMsg::Welcome {
        exchange,
        member_element,
        element: other,
        signature,
    }
    .encode();
    assert_eq!(
        alice.handle_welcome(SERVER, &altered).err(),
        Some(RegisterError::BadSignature(SERVER.into()))
    );
    alice.handle_welcome(SERVER, &reg.welcome).unwrap();
    assert_eq!(
        alice.handle_welcome(SERVER, &reg.welcome).err(),
        Some(RegisterError::NotWaiting)
    );
}
