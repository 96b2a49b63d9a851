//! A secure group whose keys come from the daemons (Integrated VS): each view's key arrives
//! after the view, and nothing is sealed or opened before it; a key of a view that is no longer
//! current is not taken; a member that runs a key agreement in such a group is told apart.
//! The daemons' side (who is handed which key) is tested in `conclave-node`'s group key tests;
//! here the session's events are written out by hand.

use bytes::Bytes;
use conclave_crypto::{GroupKey, Identity, SigScheme};
use conclave_gka::Directory;
use conclave_secure::{KeySource, SecureConfig, SecureError, SecureEvent, SecureGroup};
use conclave_wire::client::{ClientCommand, ClientEvent, GroupViewId, KeyBytes, Reason};
use conclave_wire::gcs::{RingId, ServiceType};
use conclave_wire::secure::SecureMessage;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;
use std::sync::{Arc, RwLock};

fn view_id(index: u64) -> GroupViewId {
    GroupViewId {
        ring: RingId {
            seq: 4,
            rep: 1,
            inc: 0,
        },
        index,
    }
}

fn member(me: &str) -> SecureGroup {
    member_with(me, false)
}

fn evs_member(me: &str) -> SecureGroup {
    let g = member_with(me, true);
    assert!(g.optimized_evs());
    g
}

/// A member keyed by the daemons, in a VS group or (`evs`) an EVS group.
fn member_with(me: &str, evs: bool) -> SecureGroup {
    let mut rng = ChaCha20Rng::seed_from_u64(me.len() as u64);
    let identity = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
    let cfg = SecureConfig {
        keys: KeySource::Daemons,
        evs,
        ..SecureConfig::default()
    };
    let mut g = SecureGroup::join(
        "g",
        me,
        identity,
        Arc::new(RwLock::new(Directory::new())),
        cfg,
        Box::new(rng),
    );
    assert_eq!(g.key_source(), KeySource::Daemons);
    assert_eq!(
        g.poll_command(),
        Some(ClientCommand::Join {
            group: "g".into(),
            vs: !evs
        })
    );
    g
}

fn view(index: u64, members: &[&str]) -> ClientEvent {
    ClientEvent::View {
        group: "g".into(),
        view: view_id(index),
        members: members.iter().map(|m| m.to_string()).collect(),
        transitional: Default::default(),
        reason: Reason::Join,
    }
}

fn key(index: u64, byte: u8) -> ClientEvent {
    ClientEvent::ViewKey {
        group: "g".into(),
        view: view_id(index),
        key: KeyBytes([byte; 32]),
    }
}

fn events(g: &mut SecureGroup) -> Vec<SecureEvent> {
    std::iter::from_fn(|| g.poll_event()).collect()
}

/// The payload of the next multicast `g` sends.
fn multicast(g: &mut SecureGroup) -> Bytes {
    loop {
        match g.poll_command() {
            Some(ClientCommand::Multicast { payload, .. }) => return payload,
            Some(_) => continue,
            None => panic!("no multicast"),
        }
    }
}

fn message(sender: &str, index: u64, payload: Bytes) -> ClientEvent {
    ClientEvent::Message {
        group: "g".into(),
        sender: sender.into(),
        service: ServiceType::Agreed,
        payload,
        view: view_id(index),
        transitional: false,
    }
}

#[test]
fn a_view_is_secure_once_its_key_is_handed_and_data_opens_under_it() {
    let (mut a, mut b) = (member("a"), member("b"));
    for m in [&mut a, &mut b] {
        m.handle_event(view(1, &["a", "b"]));
        assert!(
            m.secure_view().is_none(),
            "no key before the daemons hand it"
        );
    }
    // What a sends before its key waits for it.
    a.send(ServiceType::Agreed, Bytes::from_static(b"early"))
        .unwrap();
    assert_eq!(a.poll_command(), None);
    a.handle_event(key(1, 7));
    let got = events(&mut a);
    let [SecureEvent::View(info)] = got.as_slice() else {
        panic!("{got:?}")
    };
    assert_eq!(info.view, view_id(1));
    assert_eq!(info.members[..], ["a", "b"]);
    assert_eq!(info.epoch, 1);
    assert_eq!(
        info.fingerprint,
        GroupKey::from_bytes([7; 32]).fingerprint()
    );
    let sealed = multicast(&mut a);
    assert!(!sealed.windows(5).any(|w| w == b"early"), "sealed");

    // b has not its key yet: a's message waits, then opens.
    b.handle_event(message("a", 1, sealed));
    assert!(events(&mut b).is_empty());
    b.handle_event(key(1, 7));
    let got = events(&mut b);
    assert!(matches!(&got[0], SecureEvent::View(v) if v.fingerprint == info.fingerprint));
    assert!(
        matches!(&got[1], SecureEvent::Message { sender, payload, .. }
            if sender == "a" && payload.as_ref() == b"early"),
        "{got:?}"
    );
}

#[test]
fn a_key_of_a_view_gone_is_not_taken_and_each_view_has_its_own() {
    let mut a = member("a");
    a.handle_event(view(1, &["a", "b"]));
    a.handle_event(key(1, 1));
    let first = a.secure_view().unwrap().fingerprint;
    a.handle_event(view(2, &["a", "b"]));
    assert!(a.secure_view().is_none(), "a new view ends the old key");
    // A key handed for the view before, or one handed twice, changes nothing.
    a.handle_event(key(1, 9));
    assert!(a.secure_view().is_none());
    a.handle_event(key(2, 2));
    let second = a.secure_view().unwrap().clone();
    assert_ne!(second.fingerprint, first);
    assert_eq!(second.epoch, 2);
    a.handle_event(key(2, 3));
    assert_eq!(a.secure_view(), Some(&second));

    // Data sealed under view 1's key is refused in view 2.
    let mut b = member("b");
    b.handle_event(view(1, &["a", "b"]));
    b.handle_event(key(1, 1));
    b.send(ServiceType::Agreed, Bytes::from_static(b"old"))
        .unwrap();
    let old = multicast(&mut b);
    events(&mut a);
    a.handle_event(message("b", 2, old));
    assert!(matches!(
        events(&mut a).as_slice(),
        [SecureEvent::Refused {
            error: SecureError::OtherView { .. },
            ..
        }]
    ));
}

#[test]
fn a_newcomer_that_meets_a_key_agreement_leaves_and_an_old_member_reports_it() {
    let agreement = SecureMessage::KeyAgreement {
        to: None,
        envelope: b"a key agreement message",
    }
    .encode();
    let mut new = member("n");
    let mut joined = view(1, &["a", "n"]);
    if let ClientEvent::View { transitional, .. } = &mut joined {
        *transitional = vec!["n".into()].into();
    }
    new.handle_event(joined);
    // The daemons' key comes with the view: having it does not make the newcomer an old member.
    new.handle_event(key(1, 5));
    assert!(new.secure_view().is_some());
    new.handle_event(message("a", 1, agreement.clone().into()));
    let got: Vec<SecureEvent> = events(&mut new)
        .into_iter()
        .filter(|e| !matches!(e, SecureEvent::View(_)))
        .collect();
    assert!(
        matches!(
            &got[0],
            SecureEvent::Refused {
                error: SecureError::KeySourceMismatch {
                    mine: KeySource::Daemons
                },
                ..
            }
        ),
        "{got:?}"
    );
    assert!(matches!(&got[1], SecureEvent::Left { .. }), "{got:?}");
    assert_eq!(
        new.poll_command(),
        Some(ClientCommand::Leave { group: "g".into() })
    );

    let mut old = member("a");
    old.handle_event(view(1, &["a"]));
    old.handle_event(key(1, 4));
    old.handle_event(view(2, &["a", "x"]));
    old.handle_event(message("x", 2, agreement.into()));
    let got = events(&mut old);
    assert!(
        matches!(
            got.last(),
            Some(SecureEvent::Refused {
                error: SecureError::KeySourceMismatch { .. },
                ..
            })
        ),
        "{got:?}"
    );
    assert_eq!(old.poll_command(), None, "an old member stays");
}

/// Optimized EVS at a member: it joins without VS; what it sealed in a view and its daemon sent
/// in the next is not sent again (the daemons reseal it); a message a daemon resealed opens, at
/// a VS member of the group too; one whose daemon's name was altered does not.
#[test]
fn an_evs_member_leaves_resealing_to_the_daemons_and_opens_what_they_reseal() {
    let (a, b) = ("a#d1", "b#d2");
    let mut ma = evs_member(a);
    ma.handle_event(view(1, &[a, b]));
    ma.handle_event(key(1, 1));
    ma.send(ServiceType::Agreed, Bytes::from_static(b"late"))
        .unwrap();
    let sealed = multicast(&mut ma);
    ma.handle_event(view(2, &[a, b]));
    ma.handle_event(ClientEvent::Sent {
        group: "g".into(),
        service: ServiceType::Agreed,
        payload: Bytes::new(),
        view: view_id(2),
    });
    ma.handle_event(key(2, 2));
    while let Some(c) = ma.poll_command() {
        assert!(
            !matches!(c, ClientCommand::Multicast { .. }),
            "sent again: {c:?}"
        );
    }

    // b's daemon reseals it for delivery in view 2.
    let resealing = conclave_secure::Resealing {
        alg: SecureConfig::default().aead,
        group: "g",
        sender: a,
        service: ServiceType::Agreed,
        daemon: "d2",
        view: view_id(2),
        key: &GroupKey::from_bytes([2; 32]),
        counter: 1,
    };
    let resealed: Bytes = conclave_secure::reseal(&resealing, &sealed, |v| {
        (v == view_id(1)).then(|| GroupKey::from_bytes([1; 32]))
    })
    .unwrap()
    .into();
    assert!(matches!(
        SecureMessage::decode(&resealed),
        Ok(SecureMessage::Resealed { .. })
    ));
    let mut mb = evs_member(b);
    mb.handle_event(view(2, &[a, b]));
    mb.handle_event(key(2, 2));
    mb.handle_event(message(a, 2, resealed.clone()));
    let got = events(&mut mb);
    assert!(
        got.iter()
            .any(|e| matches!(e, SecureEvent::Message { sender, payload, .. }
            if sender == a && payload.as_ref() == b"late")),
        "{got:?}"
    );
    // The same again is a replay.
    mb.handle_event(message(a, 2, resealed.clone()));
    assert!(events(&mut mb).iter().any(|e| matches!(
        e,
        SecureEvent::Refused {
            error: SecureError::Replay { .. },
            ..
        }
    )),);
    // A VS member of the same group keyed by the daemons takes it too (an EVS member's daemon
    // reseals for the whole group).
    let mut vs = member("c#d2");
    vs.handle_event(view(2, &[a, "c#d2"]));
    vs.handle_event(key(2, 2));
    vs.handle_event(message(a, 2, resealed.clone()));
    assert!(events(&mut vs)
        .iter()
        .any(|e| matches!(e, SecureEvent::Message { .. })));
    // A resealed message under a name it was not resealed under opens under no key, and the
    // name is not kept.
    let mut forged = resealed.to_vec();
    let at = 2 + 24 + 8 + 1;
    forged[at] = b'x';
    let mut mc = evs_member("e#d3");
    mc.handle_event(view(2, &[a, "e#d3"]));
    mc.handle_event(key(2, 2));
    mc.handle_event(message(a, 2, forged.into()));
    assert!(events(&mut mc).iter().any(|e| matches!(
        e,
        SecureEvent::Refused {
            error: SecureError::OpenFailed,
            ..
        }
    )));
}

/// A Spread client may send to a group it is not in: a key agreement message from outside the
/// view is refused and moves nobody out of the group.
#[test]
fn a_message_from_outside_the_view_moves_nothing() {
    let agreement = SecureMessage::KeyAgreement {
        to: None,
        envelope: b"a key agreement message",
    }
    .encode();
    let mut new = member("n");
    let mut joined = view(1, &["a", "n"]);
    if let ClientEvent::View { transitional, .. } = &mut joined {
        *transitional = vec!["n".into()].into();
    }
    new.handle_event(joined);
    new.handle_event(key(1, 5));
    new.handle_event(message("outsider#d9", 1, agreement.into()));
    let got: Vec<SecureEvent> = events(&mut new)
        .into_iter()
        .filter(|e| !matches!(e, SecureEvent::View(_)))
        .collect();
    assert!(
        matches!(
            &got[..],
            [SecureEvent::Refused {
                error: SecureError::NotAMember,
                ..
            }]
        ),
        "{got:?}"
    );
    assert_eq!(new.poll_command(), None, "nobody leaves");
}
