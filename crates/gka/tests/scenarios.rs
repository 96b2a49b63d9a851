//! One set of membership scenarios, run against all five protocols over the in-memory ordered
//! transport. Each run asserts: all members of a view hold the same key, no two views share a key
//! (nor a raw secret), no process outside a view obtains its key, nobody is stuck.

mod common;
use common::*;
use conclave_gka::script::parse;

#[test]
fn basic_story_for_every_protocol() {
    for p in ALL {
        run(
            p,
            "init a b c d\njoin e\nleave b\nmerge f g\npartition c d\n",
            1,
        );
    }
}

#[test]
fn join_then_leave_never_restores_a_key() {
    for p in ALL {
        let tb = run(p, "init a b c\njoin d\nleave d\njoin d2\nleave d2\n", 2);
        assert_eq!(tb.records.len(), 5, "{p:?}");
    }
}

#[test]
fn a_members_epochs_count_its_keys() {
    for p in ALL {
        let tb = run(p, "init a b c\njoin d\nleave b\npartition c\nmerge c\n", 6);
        for m in ["a", "c", "d"] {
            let epochs: Vec<u64> = tb
                .key_log
                .iter()
                .filter(|(who, _)| who == m)
                .map(|(_, k)| k.epoch)
                .collect();
            let want: Vec<u64> = (1..=epochs.len() as u64).collect();
            assert_eq!(epochs, want, "{p:?} {m}");
        }
        // d's first key is the group's second: epochs are not agreed, view ids are.
        let first_of_d = tb.key_log.iter().find(|(who, _)| who == "d").unwrap();
        assert_eq!(first_of_d.1.epoch, 1);
        assert!(tb
            .key_log
            .iter()
            .any(|(who, k)| who == "a" && k.view_id == first_of_d.1.view_id && k.epoch == 2));
    }
}

#[test]
fn controller_and_sponsor_leave() {
    // First member (CKD controller), last member (GDH controller), rightmost (TGDH/STR sponsors).
    for p in ALL {
        run(p, "init a b c d e f\nleave a\nleave f\nleave c\n", 3);
    }
}

#[test]
fn partition_and_merge_back() {
    for p in ALL {
        let tb = run(
            p,
            "init a b c d e f g h\npartition a c e g\nmerge a c e g\n",
            4,
        );
        let last = last(&tb);
        assert_eq!(last.members.len(), 8, "{p:?}");
    }
}

/// Members that joined late hold only what they need (TGDH: their co-path; STR: the chain above
/// them) and then sponsor, as the rightmost or topmost member, merges and departures.
#[test]
fn late_joiners_sponsor_merges_and_departures() {
    for p in ALL {
        for script in [
            "init a b c d e f\njoin x\njoin y\npartition a b c\nmerge a b c\npartition d e f x y\nmerge a b c\n",
            "init a b c d e f\njoin x\njoin y\npartition a b y\nmerge a b y\nleave d\nleave x\njoin z\npartition a e z\nmerge a e z\n",
            "init a b\njoin c\njoin d\njoin e\npartition a\npartition b\nmerge a b\nleave e\npartition c d\nmerge c d\n",
        ] {
            let tb = run(p, script, 5);
            assert!(last(&tb).members.len() >= 4, "{p:?} {script}");
        }
    }
}

#[test]
fn single_member_views() {
    for p in ALL {
        run(
            p,
            "init a\njoin b\nleave a\njoin c\npartition c\nmerge c\n",
            5,
        );
    }
}

#[test]
fn paper_suite_runs_every_protocol() {
    // 1024-bit MODP group with a 160-bit subgroup and RSA signatures, as in the papers.
    use conclave_crypto::{Modp1024, SigScheme};
    use conclave_gka::testbed::Testbed;
    for p in ALL {
        let mut tb = Testbed::<Modp1024>::new(p, SigScheme::Rsa2048, 8);
        tb.measure_time = false;
        tb.run_script(&steps("init a b c\njoin d\n+1 leave a\n"))
            .unwrap();
        assert!(
            tb.errors.is_empty() && tb.stuck().is_empty(),
            "{p:?}: {:?}",
            tb.errors
        );
        let last = tb.records.last().unwrap();
        assert_eq!(last.members, vec!["b", "c", "d"]);
        let fps: std::collections::BTreeSet<_> = last.keys.values().collect();
        assert_eq!(fps.len(), 1, "{p:?}");
    }
}

/// Simulated members that share their verifications and compute on several threads (how the
/// benchmark forms large groups) run exactly as they do alone: the same views, keys and counts.
#[test]
fn shared_verifications_and_threads_change_nothing() {
    let script = "init m0 m1 m2 m3 m4 m5 m6 m7 m8 m9 m10 m11 m12 m13 m14 m15 m16 m17 m18 m19\n\
                  join x\nleave m3\npartition m10 m11 m12 m13 m14 m15 m16 m17 m18 m19\n\
                  merge m10 m11 m12 m13 m14 m15 m16 m17 m18 m19\n";
    for p in ALL {
        let control = run(p, script, 11);
        let mut tb = testbed(p, 11);
        tb.share_verifications(true);
        tb.parallel = true;
        tb.run_script(&parse(script).unwrap()).unwrap();
        check(p, &tb, script);
        assert_eq!(tb.records.len(), control.records.len(), "{p:?}");
        for (a, b) in tb.records.iter().zip(&control.records) {
            assert_eq!(a.keys, b.keys, "{p:?} view {}", a.view);
            assert_eq!(
                (a.messages, a.bytes, a.exps, a.verifs, a.decodes),
                (b.messages, b.bytes, b.exps, b.verifs, b.decodes),
                "{p:?} view {}",
                a.view
            );
        }
        // A copy of the testbed goes on as the original would.
        let mut copy = tb.clone();
        for t in [&mut tb, &mut copy] {
            t.apply(&action("join y")).unwrap();
            t.run_until_quiet();
        }
        assert_eq!(
            tb.records.last().unwrap().keys,
            copy.records.last().unwrap().keys,
            "{p:?}"
        );
    }
}
