//! The named scenarios of docs/reliability.md (faults §3) for the group communication core: each a
//! script of partitions, merges, crashes and client requests, timed or triggered by a phase of
//! the membership protocol, run over several seeds (loss, duplication, client traffic of every
//! service type), every history judged by the checker. Each test also checks that every step of
//! its script happened, so that none passes by missing its moment.

use conclave_gcs::Phase;
use conclave_history::{check, Config};
use conclave_sim::{run_membership, Action, FaultChoice, FaultSet, MembershipSimConfig, Trigger};

fn scenario(daemons: usize, script: Vec<(Trigger, Action)>) {
    for seed in 0..6 {
        let mut m = MembershipSimConfig::new(seed);
        m.daemons = daemons;
        m.faults = FaultChoice::List(FaultSet::parse("loss,dup").expect("faults"));
        m.script = script.clone();
        let r = run_membership(&m);
        assert_eq!(
            r.stats.script_steps,
            script.len(),
            "seed {seed}: the script stopped at step {}",
            r.stats.script_steps
        );
        let cfg = Config {
            max_views_after_stable: m.max_views_after_stable(),
        };
        let v = check(&r.history, &cfg);
        assert!(v.is_empty(), "seed {seed}: {v:?}");
        assert!(r.completed, "seed {seed}: no single ring after the script");
        assert!(r.delivered > 0, "seed {seed}: nothing delivered");
    }
}

fn at(ms: u64, a: Action) -> (Trigger, Action) {
    (Trigger::At(ms), a)
}

fn split(parts: &[&[usize]]) -> Action {
    Action::Partition(parts.iter().map(|p| p.to_vec()).collect())
}

#[test]
fn partition_during_a_membership_round() {
    scenario(
        5,
        vec![
            at(100, split(&[&[0, 1], &[2, 3, 4]])),
            at(600, Action::Heal),
            (Trigger::Phase(Phase::Commit), split(&[&[0, 2, 4], &[1, 3]])),
            at(1_300, Action::Heal),
        ],
    );
}

#[test]
fn partition_during_a_merge() {
    scenario(
        5,
        vec![
            at(100, split(&[&[0, 1], &[2, 3, 4]])),
            at(600, Action::Heal),
            (Trigger::Phase(Phase::Gather), split(&[&[0, 1, 2], &[3, 4]])),
            at(1_300, Action::Heal),
        ],
    );
}

#[test]
fn partition_during_delivery_of_the_old_view() {
    scenario(
        5,
        vec![
            at(100, split(&[&[0, 1, 2], &[3, 4]])),
            (
                Trigger::Phase(Phase::Recovery),
                split(&[&[0], &[1, 2], &[3, 4]]),
            ),
            at(1_300, Action::Heal),
        ],
    );
}

#[test]
fn crash_of_the_ring_representative() {
    scenario(
        5,
        vec![
            at(300, Action::CrashRepresentative(1)),
            at(900, Action::RestartCrashed),
            at(1_200, Action::CrashRepresentative(1)),
        ],
    );
}

#[test]
fn three_components_merge_at_once() {
    scenario(
        5,
        vec![
            at(100, split(&[&[0, 1], &[2, 3], &[4]])),
            at(700, Action::Heal),
        ],
    );
}

#[test]
fn four_components_merge_at_once() {
    scenario(
        8,
        vec![
            at(100, split(&[&[0, 1], &[2, 3], &[4, 5], &[6, 7]])),
            at(700, Action::Heal),
        ],
    );
}

#[test]
fn a_join_during_a_partition() {
    scenario(
        5,
        vec![
            at(100, split(&[&[0, 1], &[2, 3, 4]])),
            at(300, Action::Join(0, "s".into())),
            at(300, Action::Join(6, "s".into())),
            at(800, Action::Heal),
        ],
    );
}

#[test]
fn leave_and_rejoin_of_one_member() {
    scenario(
        5,
        vec![
            at(200, Action::Join(0, "s".into())),
            at(200, Action::Join(5, "s".into())),
            at(500, Action::Leave(0, "s".into())),
            at(500, Action::Join(0, "s".into())),
            at(900, Action::Leave(0, "s".into())),
            at(950, Action::Join(0, "s".into())),
        ],
    );
}
