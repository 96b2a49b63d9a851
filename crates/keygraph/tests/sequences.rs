//! Random sequences of joins and leaves, at once or in batches, against every key graph, strategy
//! and signing mode: after every rekey each member holds exactly the server's keys for its slot
//! (so the same group key), every member takes exactly the messages addressed to it and refuses
//! the others, no departed member can open anything sent after it left, and no joiner anything
//! sent before it joined.

mod common;
use common::{config, World};
use conclave_keygraph::{GraphKind, Signing, Strategy as Rekeying};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Join,
    /// Leave of the i-th member (modulo the group size).
    Leave(usize),
    QueueJoin,
    QueueLeave(usize),
    /// Many joins in one batch (the tree may grow by several levels).
    QueueMany(u8),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Join),
        3 => any::<usize>().prop_map(Op::Leave),
        2 => Just(Op::QueueJoin),
        2 => any::<usize>().prop_map(Op::QueueLeave),
        1 => (2u8..24).prop_map(Op::QueueMany),
        1 => Just(Op::Flush),
    ]
}

fn graph() -> impl Strategy<Value = GraphKind> {
    prop_oneof![
        Just(GraphKind::Star),
        (2u32..6).prop_map(|degree| GraphKind::Tree { degree }),
        Just(GraphKind::Complete),
    ]
}

fn strategy() -> impl Strategy<Value = Rekeying> {
    prop_oneof![
        Just(Rekeying::User),
        Just(Rekeying::Key),
        Just(Rekeying::Group)
    ]
}

fn signing() -> impl Strategy<Value = Signing> {
    prop_oneof![
        Just(Signing::None),
        Just(Signing::PerMessage),
        Just(Signing::Batch)
    ]
}

fn run(
    graph: GraphKind,
    strategy: Rekeying,
    signing: Signing,
    compact: bool,
    initial: u64,
    ops: &[Op],
    seed: u64,
) {
    let mut w = if initial > 0 && graph != GraphKind::Complete {
        World::with_members(config(graph, strategy, signing, compact), seed, initial)
    } else {
        World::new(config(graph, strategy, signing, compact), seed)
    };
    let batching = graph != GraphKind::Complete;
    let mut next_user = 1_000u64;
    for op in ops {
        let live: Vec<u64> = w.members.keys().copied().collect();
        match op {
            Op::Join | Op::QueueJoin if graph == GraphKind::Complete && live.len() >= 10 => {}
            Op::Join => {
                w.join(next_user);
                next_user += 1;
            }
            Op::QueueJoin if batching => {
                w.queue_join(next_user);
                next_user += 1;
            }
            Op::Leave(i) if !live.is_empty() => {
                // A pending batch is rekeyed first and may take this member out already.
                w.flush();
                let live: Vec<u64> = w.members.keys().copied().collect();
                if !live.is_empty() {
                    w.leave(live[i % live.len()]);
                }
            }
            Op::QueueLeave(i) if batching && !live.is_empty() => {
                w.queue_leave(live[i % live.len()])
            }
            Op::QueueMany(k) if batching => {
                for _ in 0..*k {
                    w.queue_join(next_user);
                    next_user += 1;
                }
            }
            Op::Flush => w.flush(),
            _ => {}
        }
    }
    w.flush();
    w.check();
    w.check_secrecy();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_members_in_step_and_secrets_secret(
        graph in graph(),
        strategy in strategy(),
        signing in signing(),
        compact in any::<bool>(),
        initial in 0u64..40,
        ops in prop::collection::vec(op(), 1..40),
        seed in any::<u64>(),
    ) {
        run(graph, strategy, signing, compact, initial, &ops, seed);
    }
}

/// Grow, then shrink far: compaction moves members down and the tree loses levels; without it the
/// tree keeps its height.
#[test]
fn compaction_lowers_the_tree_after_members_leave() {
    for compact in [true, false] {
        let mut w = World::with_members(
            config(
                GraphKind::Tree { degree: 2 },
                Rekeying::Key,
                Signing::Batch,
                compact,
            ),
            11,
            64,
        );
        w.track_keys = false;
        assert_eq!(w.server.height(), 6);
        // Leave from the bottom of the slot range, so the members left sit high.
        for u in 0..56 {
            w.leave(u);
        }
        let h = w.server.height();
        if compact {
            assert_eq!(h, 3, "8 members fit a tree of height 3");
        } else {
            assert_eq!(h, 6);
        }
    }
}

#[test]
fn batches_fold_many_requests_into_one_rekey() {
    let mut w = World::with_members(
        config(
            GraphKind::Tree { degree: 4 },
            Rekeying::Group,
            Signing::Batch,
            true,
        ),
        12,
        256,
    );
    let e = w.server.epoch();
    for u in 0..20 {
        w.queue_leave(u * 7);
    }
    for u in 0..15 {
        w.queue_join(5_000 + u);
    }
    w.flush();
    assert_eq!(w.server.epoch(), e + 1);
    let st = w.server.last_rekey().unwrap();
    assert_eq!((st.joins, st.leaves, st.messages), (15, 20, 1));
    w.check_secrecy();
}

#[test]
fn an_immediate_request_rekeys_a_pending_batch_first() {
    let mut w = World::with_members(
        config(
            GraphKind::Tree { degree: 4 },
            Rekeying::Key,
            Signing::Batch,
            true,
        ),
        13,
        20,
    );
    let e = w.server.epoch();
    w.server.queue_leave(conclave_keygraph::UserId(3)).unwrap();
    let k = conclave_crypto::GroupKey::from_bytes([9; 32]);
    let ack = w
        .server
        .join(conclave_keygraph::UserId(77), &k, &mut w.rng)
        .unwrap();
    assert_eq!((ack.epoch, w.server.epoch()), (e + 2, e + 2));
    let mut epochs = std::collections::BTreeSet::new();
    while let Some(t) = w.server.poll_transmit() {
        let (m, _) = conclave_wire::lkh::RekeyMessage::decode(&t.bytes).unwrap();
        epochs.insert(m.epoch);
    }
    assert_eq!(epochs.into_iter().collect::<Vec<_>>(), vec![e + 1, e + 2]);
}

/// A batch that grows the tree by several levels: the nodes above the old root that hold only
/// joiners must not be encrypted under the old root's key (the old members would read them and,
/// once they leave, every later group key).
#[test]
fn a_batch_that_grows_the_tree_by_levels_keeps_old_members_out_of_new_branches() {
    for compact in [false, true] {
        let mut w = World::with_members(
            config(
                GraphKind::Tree { degree: 2 },
                Rekeying::Group,
                Signing::Batch,
                compact,
            ),
            21,
            2,
        );
        for u in 100..103 {
            w.queue_join(u);
        }
        w.flush();
        assert_eq!(w.server.height(), 3);
        w.leave(0);
        w.join(200);
        w.leave(100);
        w.check_secrecy();
    }
}

/// A batch that grows the tree by two levels while the joiners that would have filled the first
/// new level's left branch left again before the rekey: that branch holds only the old members, no
/// changed leaf lies below it, and it still needs a key (their path runs through it).
#[test]
fn a_batch_that_grows_the_tree_past_emptied_slots_keys_the_old_members_branch() {
    for strategy in [Rekeying::User, Rekeying::Key, Rekeying::Group] {
        for signing in [Signing::None, Signing::Batch] {
            for compact in [false, true] {
                let mut w = World::with_members(
                    config(GraphKind::Tree { degree: 2 }, strategy, signing, compact),
                    31,
                    2,
                );
                assert_eq!(w.server.height(), 1);
                // Slots 2..8; the joiners in 2 and 3 leave before the rekey, so slots 4..8
                // need height 3 and the node over slots 0..4 holds only members 0 and 1.
                for u in 100..106 {
                    w.queue_join(u);
                }
                w.queue_leave(100);
                w.queue_leave(101);
                w.flush();
                assert_eq!(w.server.height(), 3);
                w.leave(102);
                w.join(200);
                w.leave(0);
                w.check();
                w.check_secrecy();
            }
        }
    }
}
