//! Hostile input: stale, replayed, foreign, misplaced, forged and malformed messages are typed
//! errors, produce no answer, and leave the member's state as it was: the run then completes
//! with exactly the keys of an undisturbed run on the same seed.

mod common;
use common::*;
use conclave_gka::script::Action;
use conclave_gka::GkaError;
use conclave_wire::gka::Envelope;
use proptest::prelude::*;

fn final_keys(tb: &conclave_gka::testbed::Testbed<conclave_crypto::Ristretto255>) -> Vec<String> {
    tb.records
        .iter()
        .map(|r| r.keys.values().next().unwrap().clone())
        .collect()
}

fn reencode(bytes: &[u8], f: impl FnOnce(&mut Envelope)) -> Vec<u8> {
    let (mut e, _) = Envelope::decode(bytes).unwrap();
    f(&mut e);
    e.encode()
}

#[test]
fn hostile_messages_are_typed_errors_and_change_nothing() {
    for p in ALL {
        let control = run(p, "init a b c d\njoin e\n", 5);

        let mut tb = testbed(p, 5);
        tb.apply(&action("init a b c d")).unwrap();
        let stale = tb.queue_snapshot();
        tb.run_until_quiet();
        tb.apply(&action("join e")).unwrap();
        // Deliver one message, then attack a recipient of the next one.
        tb.run_messages(1);
        let queued = tb.queue_snapshot();
        let (from, to, bytes) = queued
            .first()
            .cloned()
            .expect("the join run has more messages");
        let victim = to[0].clone();
        let (old_from, _, old_bytes) = stale.first().cloned().expect("init sent something");

        let expect = |tb: &mut conclave_gka::testbed::Testbed<_>,
                      sender: &str,
                      b: &[u8],
                      what: &str,
                      ok: fn(&GkaError) -> bool| {
            let (r, sent) = tb.inject(&victim, sender, b);
            let e = r.expect_err(what);
            assert!(ok(&e), "{p:?} {what}: unexpected {e:?}");
            assert_eq!(sent, 0, "{p:?} {what}: answered a hostile message");
        };
        expect(&mut tb, &old_from, &old_bytes, "stale", |e| {
            matches!(e, GkaError::Stale { .. })
        });
        expect(
            &mut tb,
            &from,
            &bytes[..bytes.len() / 2],
            "truncated",
            |e| matches!(e, GkaError::Malformed(_)),
        );
        expect(&mut tb, &from, &[0xff; 40], "garbage", |e| {
            matches!(e, GkaError::Malformed(_))
        });
        let foreign = reencode(&bytes, |e| e.group = "other".into());
        expect(&mut tb, &from, &foreign, "foreign", |e| {
            matches!(e, GkaError::ForeignGroup(_))
        });
        let future = reencode(&bytes, |e| e.view.index += 5);
        expect(&mut tb, &from, &future, "future", |e| {
            matches!(e, GkaError::Future { .. })
        });
        // The ring orders first: an older ring is stale whatever its index, and a ring of another
        // representative is not this view's.
        let older_ring = reencode(&bytes, |e| {
            e.view.ring.seq -= 1;
            e.view.index += 100;
        });
        expect(&mut tb, &from, &older_ring, "older ring", |e| {
            matches!(e, GkaError::Stale { .. })
        });
        let other_ring = reencode(&bytes, |e| e.view.ring.rep += 1);
        expect(&mut tb, &from, &other_ring, "other ring", |e| {
            matches!(e, GkaError::Future { .. })
        });
        expect(&mut tb, "mallory", &bytes, "spoofed sender", |e| {
            matches!(e, GkaError::SenderMismatch { .. })
        });
        let outsider = reencode(&bytes, |e| e.sender = "mallory".into());
        expect(&mut tb, "mallory", &outsider, "outsider", |e| {
            matches!(e, GkaError::NotAMember(_))
        });
        let forged = reencode(&bytes, |e| {
            if let Some(b) = e.body.last_mut() {
                *b ^= 1;
            }
        });
        // Content may be checked before the signature: either way a typed error.
        expect(&mut tb, &from, &forged, "forged", |e| {
            matches!(
                e,
                GkaError::BadSignature(_)
                    | GkaError::BadElement(_)
                    | GkaError::Malformed(_)
                    | GkaError::Misplaced(_)
            )
        });
        let resigned_by_other = reencode(&bytes, |e| e.signature[0] ^= 0x40);
        expect(&mut tb, &from, &resigned_by_other, "bad signature", |e| {
            matches!(e, GkaError::BadSignature(_))
        });

        // The genuine message, delivered by the transport, then once more: a replay.
        tb.run_messages(1);
        expect(&mut tb, &from, &bytes, "replay", |e| {
            matches!(e, GkaError::Replay)
        });
        tb.run_until_quiet();
        let keys = final_keys(&tb);
        assert_eq!(
            keys,
            final_keys(&control),
            "{p:?}: hostile input changed the outcome"
        );
        assert!(tb.stuck().is_empty(), "{p:?}: stuck after hostile input");
    }
}

#[test]
fn misplaced_messages_are_refused() {
    // A genuine message of this run handed to a member it was not meant for, or at a stage where it
    // does not fit, is refused without changing anything.
    for p in ALL {
        let mut tb = testbed(p, 9);
        tb.apply(&action("init a b c d e")).unwrap();
        tb.run_until_quiet();
        tb.apply(&action("leave c")).unwrap();
        let q = tb.queue_snapshot();
        for (from, to, bytes) in &q {
            for m in tb.member_names() {
                if m == *from || to.contains(&m) {
                    continue;
                }
                let (r, sent) = tb.inject(&m, from, bytes);
                if let Err(e) = r {
                    assert!(!matches!(e, GkaError::BadSignature(_)), "{p:?}: {e:?}");
                }
                assert_eq!(sent, 0, "{p:?}: answered a message not meant for it");
            }
        }
        tb.run_until_quiet();
        check(p, &tb, "misplaced");
        let _ = Action::Leave("c".into());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Random bytes and random corruptions of genuine messages never panic a member.
    #[test]
    fn no_input_panics(garbage in proptest::collection::vec(any::<u8>(), 0..300), flip in any::<usize>(), p_idx in 0usize..5) {
        let p = ALL[p_idx];
        let mut tb = testbed(p, 3);
        tb.apply(&action("init a b c")).unwrap();
        let q = tb.queue_snapshot();
        for (from, to, bytes) in q {
            let _ = tb.inject(&to[0], &from, &garbage);
            let mut b = bytes.clone();
            let i = flip % b.len();
            b[i] ^= 1 << (flip % 8);
            let _ = tb.inject(&to[0], &from, &b);
        }
        tb.run_until_quiet();
    }
}

/// A signed message from an insider that carries a bad value for one member is refused by every
/// member, not only by the one whose value is bad: otherwise members that move together would
/// disagree on whether the run completed.
#[test]
fn a_bad_entry_for_one_member_is_refused_by_all() {
    use conclave_wire::gka::{CkdMsg, GdhMsg};
    for p in [conclave_gka::ProtocolId::Gdh, conclave_gka::ProtocolId::Ckd] {
        let mut tb = testbed(p, 21);
        tb.apply(&action("init a b c d")).unwrap();
        tb.run_until_quiet();
        tb.apply(&action("leave b")).unwrap();
        let (from, to, bytes) = tb
            .queue_snapshot()
            .into_iter()
            .next()
            .expect("the refresh message");
        let (env, _) = Envelope::decode(&bytes).unwrap();
        let victim = to.iter().find(|m| **m != from).unwrap().clone();
        let bad = vec![0xffu8; 32];
        let body = match p {
            conclave_gka::ProtocolId::Gdh => match GdhMsg::decode(env.kind, &env.body).unwrap() {
                GdhMsg::Partials {
                    roster,
                    mut partials,
                } => {
                    partials.iter_mut().find(|(m, _)| *m == victim).unwrap().1 = bad;
                    GdhMsg::Partials { roster, partials }.encode()
                }
                other => panic!("unexpected {other:?}"),
            },
            _ => match CkdMsg::decode(env.kind, &env.body).unwrap() {
                CkdMsg::KeyDist {
                    roster,
                    mut entries,
                } => {
                    entries.iter_mut().find(|(m, _)| *m == victim).unwrap().1 = bad;
                    CkdMsg::KeyDist { roster, entries }.encode()
                }
                other => panic!("unexpected {other:?}"),
            },
        };
        // Signed for the view the others are in (the members, in the view's order).
        let forged = conclave_gka::seal(
            tb.identity(&from).unwrap(),
            Envelope {
                body,
                signature: vec![],
                ..env
            },
            &tb.member_names(),
        )
        .unwrap();
        for m in &to {
            let (r, sent) = tb.inject(m, &from, &forged);
            assert!(
                matches!(r, Err(GkaError::BadElement(_))),
                "{p:?} {m}: {r:?}"
            );
            assert_eq!(sent, 0);
        }
        assert!(
            tb.records.iter().all(|r| r.view == 1),
            "{p:?}: a run completed on a bad message"
        );
        tb.run_until_quiet();
        check(p, &tb, "after a refused insider message");
    }
}

/// A forger's key distribution (CKD) is refused for its signature before any of its entries is
/// decoded: with MODP each decoding is a subgroup check, an exponentiation, which a forger must
/// not make every member spend n times over.
#[test]
fn a_forged_key_distribution_is_refused_before_its_entries_are_decoded() {
    use conclave_wire::gka::CkdMsg;
    let p = conclave_gka::ProtocolId::Ckd;
    let mut tb = testbed(p, 22);
    tb.apply(&action("init a b c d")).unwrap();
    tb.run_until_quiet();
    tb.apply(&action("leave b")).unwrap();
    let (from, to, bytes) = tb
        .queue_snapshot()
        .into_iter()
        .next()
        .expect("the refresh message");
    let (env, _) = Envelope::decode(&bytes).unwrap();
    let body = match CkdMsg::decode(env.kind, &env.body).unwrap() {
        CkdMsg::KeyDist {
            roster,
            mut entries,
        } => {
            // Every entry undecodable: a member that decoded first would answer BadElement.
            for e in entries.iter_mut() {
                e.1 = vec![0xffu8; 32];
            }
            CkdMsg::KeyDist { roster, entries }.encode()
        }
        other => panic!("unexpected {other:?}"),
    };
    // Signed, but by another member than the controller it names.
    let other = to.iter().find(|m| **m != from).unwrap().clone();
    let forged = conclave_gka::seal(
        tb.identity(&other).unwrap(),
        Envelope {
            body,
            signature: vec![],
            ..env
        },
        &tb.member_names(),
    )
    .unwrap();
    for m in to.iter().filter(|m| **m != other) {
        let (r, sent) = tb.inject(m, &from, &forged);
        assert!(matches!(r, Err(GkaError::BadSignature(_))), "{m}: {r:?}");
        assert_eq!(sent, 0);
    }
    tb.run_until_quiet();
    check(p, &tb, "after a forged key distribution");
}

/// A message signed by a member for another member list than the recipient's view has (a
/// member that would be in the view, or one that would not) is refused: signatures cover the
/// view's member list, which the message does not carry.
#[test]
fn a_message_signed_for_another_member_list_is_refused() {
    for p in ALL {
        let mut tb = testbed(p, 9);
        tb.apply(&action("init a b c d")).unwrap();
        tb.run_until_quiet();
        tb.apply(&action("join e")).unwrap();
        let (from, to, bytes) = tb
            .queue_snapshot()
            .into_iter()
            .next()
            .expect("the join run sends");
        let (env, _) = Envelope::decode(&bytes).unwrap();
        let identity = tb.identity(&from).unwrap().clone();
        let members = tb.member_names();
        let mut fewer = members.clone();
        fewer.retain(|m| *m != to[0] && *m != from);
        let mut more = members.clone();
        more.push("mallory".into());
        let mut reordered = members.clone();
        reordered.reverse();
        for list in [fewer, more, reordered] {
            let forged = conclave_gka::seal(&identity, env.clone(), &list).unwrap();
            let (r, sent) = tb.inject(&to[0], &from, &forged);
            assert!(
                matches!(r, Err(GkaError::BadSignature(_))),
                "{p:?} {list:?}: {r:?}"
            );
            assert_eq!(sent, 0);
        }
        // Signed for the right list, it is the message itself, and it is taken.
        let honest = conclave_gka::seal(&identity, env, &members).unwrap();
        assert_eq!(honest, bytes, "{p:?}: signing is deterministic");
    }
}

/// With verifications shared (as the benchmark forms large groups), one member's good verdict
/// covers exactly the bytes it verified: the same signature on altered contents meets the same
/// refusal as without sharing.
#[test]
fn a_shared_verification_never_passes_an_altered_message() {
    for p in ALL {
        let mut tb = testbed(p, 5);
        tb.share_verifications(true);
        tb.apply(&action("init a b c d")).unwrap();
        tb.run_until_quiet();
        tb.apply(&action("join e")).unwrap();
        // The run's first broadcast (GDH's comes after its unicast upflow).
        let (from, to, bytes) = loop {
            let queued = tb.queue_snapshot();
            if let Some(b) = queued.iter().find(|(_, to, _)| to.len() >= 2) {
                break b.clone();
            }
            assert!(!queued.is_empty(), "{p:?}: the join run broadcasts");
            tb.run_messages(1);
        };
        let altered = reencode(&bytes, |e| {
            if let Some(b) = e.body.last_mut() {
                *b ^= 1;
            }
        });
        for victim in &to {
            // Unshared, what the altered message meets.
            let mut alone = tb.clone();
            alone.share_verifications(false);
            let (want, _) = alone.inject(victim, &from, &altered);
            // Shared, after a copy of the victim has verified the genuine message.
            let mut shared = tb.clone();
            shared.share_verifications(true);
            let mut witness = shared.clone();
            let (genuine, _) = witness.inject(victim, &from, &bytes);
            genuine.unwrap_or_else(|e| panic!("{p:?}: the genuine message was refused: {e:?}"));
            let (got, sent) = shared.inject(victim, &from, &altered);
            assert_eq!(got, want, "{p:?} {victim}");
            if got.is_err() {
                assert_eq!(sent, 0, "{p:?} {victim}");
            }
        }
    }
}
