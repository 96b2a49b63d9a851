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

/// Full runs (daemons, clients, groups, every fault as each seed draws): 500 seeds, in two halves
/// so that both cores work.
fn full_swarm_seeds(seeds: std::ops::Range<u64>) {
    full_swarm_seeds_with(seeds, None, None);
}

fn full_swarm_seeds_with(
    seeds: std::ops::Range<u64>,
    idle_hold_us: Option<u64>,
    max_visit_bytes: Option<usize>,
) {
    for seed in seeds {
        full_run_passes(seed, |m| {
            m.idle_hold_us = idle_hold_us;
            m.max_visit_bytes = max_visit_bytes;
        });
    }
}

/// A full run of `seed`, configured by `edit`, that the checker finds clean and that converges
/// with messages delivered.
fn full_run_passes(
    seed: u64,
    edit: impl FnOnce(&mut conclave_sim::MembershipSimConfig),
) -> conclave_sim::SimResult {
    let mut m = conclave_sim::MembershipSimConfig::new(seed);
    edit(&mut m);
    let r = conclave_sim::run_membership(&m);
    let cfg = Config {
        max_views_after_stable: m.max_views_after_stable(),
    };
    let v = check(&r.history, &cfg);
    assert!(
        v.is_empty(),
        "full seed {seed}: {}",
        v.iter().map(|v| v.to_string()).collect::<String>()
    );
    assert!(r.completed, "full seed {seed} did not converge");
    assert!(r.delivered > 0, "full seed {seed} delivered nothing");
    assert_eq!(
        r.stats.spread_unreadable, 0,
        "full seed {seed}: a Spread client could not read its daemon"
    );
    r
}

/// Every second client speaks Spread's protocol (the swarm draws it for half the seeds): open
/// groups, private groups, SELF_DISCARD and KILL_MESS among the faults, and every message the
/// daemons send those clients reads as Spread's.
#[test]
fn full_seeds_with_spread_clients() {
    let mut read = 0;
    for seed in 3000..3060 {
        read += full_run_passes(seed, |m| m.spread = Some(true))
            .stats
            .spread_messages;
    }
    assert!(read > 0);
}

#[test]
fn full_swarm_seeds_first_half() {
    full_swarm_seeds(0..250);
}

#[test]
fn full_swarm_seeds_second_half() {
    full_swarm_seeds(250..500);
}

/// A visit's byte budget small enough that the simulator's small messages meet it, and a ring
/// whose idle token never rests.
#[test]
fn full_swarm_seeds_with_a_small_byte_budget_and_no_idle_hold() {
    full_swarm_seeds_with(1000..1100, Some(0), Some(1024));
}

/// Seed 394 (basic faults) fails when recovery ends at each member as soon as it has every
/// member's recovery marker (first found as seed 1195 of the daemon-only runs, which broke O4;
/// each seed below was found again by reverting its fix on today's protocol): one member loses
/// the new ring just before its last marker arrives, goes back to gather, and never receives a
/// safe message of the old ring that the others delivered in a transitional configuration naming
/// it. Recovery now ends only once every member holds every marker (the token's `aru` has covered
/// them twice), so whoever installs, the others hold all it delivered and deliver it too.
#[test]
fn regression_full_seed_394_recovery_ended_before_everyone_had_the_markers() {
    full_seed_passes(394);
}

/// A full run of `seed` with the basic faults (`conclave sim --seeds N --faults
/// loss,dup,partition,crash,disconnect`), as deployed and with the idle token's rest of 100 µs
/// under which the regression seeds were found (a rest changes every seed's schedule).
fn full_seed_passes(seed: u64) {
    use conclave_sim::{run_membership, FaultChoice, FaultSet, MembershipSimConfig};
    for idle_hold_us in [None, Some(FOUND_WITH_IDLE_HOLD_US)] {
        let mut m = MembershipSimConfig::new(seed);
        m.faults = FaultChoice::List(FaultSet::BASIC);
        m.idle_hold_us = idle_hold_us;
        let r = run_membership(&m);
        assert!(
            r.completed,
            "seed {seed} ({idle_hold_us:?}) did not converge"
        );
        let cfg = Config {
            max_views_after_stable: m.max_views_after_stable(),
        };
        let v = check(&r.history, &cfg);
        assert!(v.is_empty(), "seed {seed} ({idle_hold_us:?}): {v:?}");
    }
}

/// The idle token's rest when the regression seeds were found.
const FOUND_WITH_IDLE_HOLD_US: u64 = 100;

/// Seed 18 (first found as 2728) breaks D1 without the check: a daemon installed a group view when
/// the last flush marker arrived, and a client there sent in it; the ring broke, and another
/// daemon, whose part of the old ring lacked that marker, received the message in the old ring's
/// transitional part past the hole and delivered it in the previous view. A client message now
/// names its view, and a daemon that never installed that view drops it.
#[test]
fn regression_full_seed_18_message_of_a_view_never_installed_here() {
    full_seed_passes(18);
}

/// Seed 102 (first found as 111) breaks X1 without the fix: a VS client acknowledged a flush that a
/// configuration change had already cut short; the acknowledgement was recorded, and the client's
/// next message then went out in the same view. A stale acknowledgement is now dropped.
#[test]
fn regression_full_seed_102_stale_flush_acknowledgement() {
    full_seed_passes(102);
}

/// Seed 2403 (first found as 5548) breaks V1 without the rule: two clients whose last view was one
/// of ring 8 met again on ring 28 after rings on which their groups never settled; their daemons
/// had left ring 8 in different components and delivered different parts of that view, yet the
/// state exchange counted them as coming together. A client's view now counts as where it comes
/// from only if it belongs to the ring that just ended.
#[test]
fn regression_full_seed_2403_clients_from_a_view_of_an_older_ring() {
    full_seed_passes(2403);
}

/// Seed 1285 (all faults, messages to two groups; first found as 170) breaks L1 without the fix:
/// a client whose leave waited behind a
/// message to two groups was asked to acknowledge a flush, and its acknowledgement was refused as
/// from a non-member; the group's views stopped changing. A client leaving a group may still
/// acknowledge, and an acknowledgement never waits behind a message to several groups.
#[test]
fn regression_full_seed_1285_acknowledgement_of_a_leaving_client() {
    full_swarm_seeds(1285..1286);
    full_swarm_seeds_with(1285..1286, Some(FOUND_WITH_IDLE_HOLD_US), None);
}

/// Seed 879 (5 daemons) once never converged: the representative formed a ring of the two
/// daemons it had heard from while the others, knowing all five, took part with their own member
/// list, so every commit token came back with the wrong members. The token now lists the
/// members from the start and a daemon takes part only in the ring it would have formed. (Since
/// messages joined membership runs the seed draws a different schedule; it stays as one more
/// seed.)
#[test]
fn regression_membership_seed_879_commit_token_with_other_members() {
    full_seed_passes(879);
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

/// Secure runs (`conclave sim --secure`): every group a secure group, the protocol each seed
/// draws, every fault; the checker's key properties (K1-K6) on top of the others, and every
/// run ends with secure views. The layer's deliveries and key agreement intake are in the
/// histories, so that the checks over them judge something.
#[test]
fn secure_swarm_seeds() {
    use conclave_history::Event;
    let (mut delivered, mut consumed) = (0, 0);
    for seed in 0..300 {
        let r = full_run_passes(seed, |m| m.secure = true);
        assert!(
            r.history
                .iter()
                .any(|rec| matches!(rec.ev, Event::SecureView { .. })),
            "secure seed {seed} agreed no key"
        );
        for rec in &r.history {
            match rec.ev {
                Event::SecureDeliver { .. } => delivered += 1,
                Event::SecureConsumed { .. } => consumed += 1,
                _ => {}
            }
        }
    }
    assert!(
        delivered > 10_000 && consumed > 1_000,
        "{delivered} deliveries, {consumed} key agreement messages taken in"
    );
}

/// Key-graph runs: a key server keys every group, crashing and restarting from its saved state
/// (with the workload's disconnects and its daemon's crashes); the members' key properties hold,
/// every run ends with secure views, and the server does restart in some of them.
#[test]
fn key_graph_swarm_seeds() {
    use conclave_history::Event;
    let mut restarts = 0;
    for seed in 0..60 {
        let r = full_run_passes(seed, |m| {
            m.secure = true;
            m.keys = Some(conclave_secure::KeySource::KeyGraph);
        });
        assert!(
            r.history
                .iter()
                .any(|rec| matches!(rec.ev, Event::SecureView { .. })),
            "key-graph seed {seed} installed no key"
        );
        let mut incs: Vec<u32> = r
            .history
            .iter()
            .filter(|rec| matches!(rec.ev, Event::KeyServer { .. }))
            .map(|rec| rec.inc)
            .collect();
        incs.dedup();
        restarts += incs.len().saturating_sub(1);
    }
    assert!(restarts > 20, "the key server restarted {restarts} times");
}

/// An attacker on the wire replays, alters, forges and makes up datagrams, and sends some from
/// an address no daemon has: with links sealed or authenticated, every one is refused before the
/// core, and the runs stay clean and converge.
#[test]
fn an_attacker_on_the_wire_reaches_no_core() {
    let faults = conclave_sim::FaultSet::parse("hostile,loss,dup,crash,partition").unwrap();
    let mut kinds = std::collections::BTreeMap::new();
    // Seeds 6 and 7 (mod 8) authenticate only and turn links off: the attacker skips the latter.
    for seed in [3000, 3001, 3002, 3006, 3008, 3014] {
        let r = full_run_passes(seed, |m| m.faults = conclave_sim::FaultChoice::List(faults));
        for rec in &r.history {
            if let conclave_history::Event::Hostile { kind, taken } = &rec.ev {
                assert_eq!(*taken, 0, "seed {seed}: {rec:?}");
                *kinds.entry(kind.clone()).or_insert(0u32) += 1;
            }
        }
    }
    for kind in ["replay", "altered", "forged", "garbage", "stranger"] {
        assert!(kinds.get(kind).is_some_and(|n| *n > 10), "{kinds:?}");
    }
}
