//! Seeds of the simulator, judged by the checker.

use conclave_history::{check, Config};
use conclave_sim::{run, FaultMix, SimConfig};

/// CI runs these 500 seeds; `conclave sim --seeds A..B` runs more on demand.
#[test]
fn swarm_seeds_pass_the_checker_and_deliver_everything() {
    for seed in 0..500 {
        let cfg = SimConfig::new(seed);
        let r = run(&cfg);
        let v = check(&r.history, &Config::default());
        assert!(
            v.is_empty(),
            "seed {seed} ({:?}): {}",
            r.network,
            v.iter().map(|v| v.to_string()).collect::<String>()
        );
        assert!(
            r.completed,
            "seed {seed} ({:?}) did not deliver everything",
            r.network
        );
    }
}

#[test]
fn a_seed_replays_exactly() {
    let a = run(&SimConfig::new(77));
    let b = run(&SimConfig::new(77));
    assert_eq!(a.history, b.history);
    assert_eq!(a.packets, b.packets);
    let c = run(&SimConfig::new(78));
    assert_ne!(a.history, c.history);
}

#[test]
fn a_perfect_network_delivers_everything_in_one_order() {
    let mut cfg = SimConfig::new(1);
    cfg.faults = FaultMix::None;
    cfg.daemons = 3;
    cfg.messages = 200;
    let r = run(&cfg);
    assert!(r.completed);
    assert_eq!(r.delivered, 3 * 3 * 200);
    assert!(check(&r.history, &Config::default()).is_empty());
}

/// Seed 0 once stalled: a late retransmitted message made the last token holder believe its
/// successor had the token, so a lost token was never sent again.
#[test]
fn regression_seed_0_late_retransmission_stopped_token_retransmission() {
    let r = run(&SimConfig::new(0));
    assert!(r.completed);
    assert!(check(&r.history, &Config::default()).is_empty());
}

/// A ring of one daemon once ignored its own token when it came back, so nothing was delivered.
#[test]
fn regression_a_ring_of_one_delivers() {
    for seed in 0..20 {
        let mut cfg = SimConfig::new(seed);
        cfg.daemons = 1;
        let r = run(&cfg);
        assert!(r.completed, "seed {seed}");
        assert!(check(&r.history, &Config::default()).is_empty());
    }
}

#[test]
fn membership_seeds_converge_and_pass_the_checker() {
    use conclave_sim::{run_membership, MembershipSimConfig};
    for seed in 0..40 {
        let r = run_membership(&MembershipSimConfig::new(seed));
        let cfg = Config {
            max_views_after_stable: Config::default().max_views_after_stable + 5,
        };
        let v = check(&r.history, &cfg);
        assert!(
            v.is_empty(),
            "membership seed {seed}: {}",
            v.iter().map(|v| v.to_string()).collect::<String>()
        );
        assert!(r.completed, "membership seed {seed} did not converge");
        assert!(r.delivered > 0, "membership seed {seed} delivered nothing");
    }
}

/// Seed 1195 (5 daemons) once broke O4: recovery ended at each member as soon as it had every
/// member's recovery marker. One member lost the new ring just before its last marker arrived,
/// went back to gather, and never received a safe message of the old ring that the others
/// delivered in a transitional configuration naming it. Recovery now ends only once every member
/// holds every marker (the token's `aru` has covered them twice), so whoever installs, the others
/// hold all it delivered and deliver it too.
#[test]
fn regression_membership_seed_1195_recovery_ended_before_everyone_had_the_markers() {
    use conclave_sim::{run_membership, MembershipSimConfig};
    let r = run_membership(&MembershipSimConfig::new(1195));
    assert!(r.completed);
    let cfg = Config {
        max_views_after_stable: Config::default().max_views_after_stable + 5,
    };
    let v = check(&r.history, &cfg);
    assert!(v.is_empty(), "{v:?}");
}

/// Seed 879 (5 daemons) once never converged: the representative formed a ring of the two
/// daemons it had heard from while the others, knowing all five, took part with their own member
/// list, so every commit token came back with the wrong members. The token now lists the
/// members from the start and a daemon takes part only in the ring it would have formed. (Since
/// messages joined membership runs the seed draws a different schedule; it stays as one more
/// seed.)
#[test]
fn regression_membership_seed_879_commit_token_with_other_members() {
    use conclave_sim::{run_membership, MembershipSimConfig};
    let r = run_membership(&MembershipSimConfig::new(879));
    assert!(r.completed);
    let cfg = Config {
        max_views_after_stable: Config::default().max_views_after_stable + 5,
    };
    assert!(check(&r.history, &cfg).is_empty());
}

/// The checker can fail: each fault the simulator can plant in a run is caught.
#[test]
fn planted_faults_are_caught() {
    use conclave_sim::Planted;
    for (fault, expect) in [
        (Planted::SkipMessage, &["V1", "O3", "L2", "O4"][..]),
        (Planted::WrongView, &["M3", "D2"][..]),
        (Planted::SwapAgreed, &["O3"][..]),
        (Planted::ViewWithoutMember, &["M4"][..]),
    ] {
        for seed in 0..10 {
            let mut cfg = SimConfig::new(seed);
            cfg.daemons = 3;
            cfg.messages = 20;
            cfg.planted = Some(fault);
            let r = run(&cfg);
            let v = check(&r.history, &Config::default());
            assert!(
                v.iter().any(|v| expect.contains(&v.property)),
                "{fault:?} in seed {seed} not caught as {expect:?}: {:?}",
                v.iter().map(|v| v.property).collect::<Vec<_>>()
            );
        }
    }
}

/// 9,000 agreed messages from each daemon, under loss, duplication and reordering: one order
/// everywhere (O3), everything delivered (L2).
#[test]
fn nine_thousand_agreed_messages_per_daemon_in_one_order() {
    let mut cfg = SimConfig::new(9000);
    cfg.daemons = 3;
    cfg.messages = 9000;
    cfg.safety_ms = 2_000;
    cfg.service = Some(conclave_wire::gcs::ServiceType::Agreed);
    let r = run(&cfg);
    assert!(r.completed);
    assert_eq!(r.delivered, 3 * 3 * 9000);
    let v = check(&r.history, &Config::default());
    assert!(
        v.is_empty(),
        "{}",
        v.iter().map(|v| v.to_string()).collect::<String>()
    );
}
