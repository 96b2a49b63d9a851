//! The membership with its ring: what a daemon takes from the other daemons.

use conclave_gcs::testnet::{Hop, TestNet};
use conclave_gcs::{Membership, MembershipConfig, OrderingConfig, Time};
use conclave_wire::gcs::Packet;
use std::time::Duration;

#[test]
fn only_a_member_of_the_ring_can_ask_for_its_resting_token() {
    // Rests far longer than anything else here (3.3 ms: a third of half the token's
    // retransmission timeout, for three members), so a release shows as an early deadline.
    let cfg = MembershipConfig {
        ordering: OrderingConfig {
            idle_hold_us: 9_000,
            ..OrderingConfig::default()
        },
        ..MembershipConfig::default()
    };
    let nodes = (1..=3)
        .map(|id| Membership::new(cfg.clone(), id, 0, Time::ZERO))
        .collect();
    let mut net = TestNet::new(nodes, Hop::default());
    let formed = |net: &mut TestNet<Membership>| {
        net.peers
            .iter()
            .all(|m| m.is_operational() && m.ring().is_some() && m.ring() == net.peers[0].ring())
            && net.peers.iter().any(Membership::holds_idle_token)
    };
    assert!(net.run_until(100_000, formed), "no ring of three");
    let ring = net.peers[0].ring().expect("formed");
    let holder = net
        .peers
        .iter()
        .position(Membership::holds_idle_token)
        .unwrap();
    let member = ((holder + 1) % 3 + 1) as u32;
    let now = net.now() + Duration::from_micros(1);
    let rests_until = net.peers[holder].poll_timeout().expect("a rest ends");
    assert!(rests_until > now + Duration::from_millis(1));

    let h = &mut net.peers[holder];
    // A daemon outside the ring (an authenticated one, with a stale view), and the holder
    // itself, cannot.
    for outsider in [9, holder as u32 + 1] {
        h.handle_packet(now, outsider, Packet::Wake { ring })
            .unwrap();
        assert!(h.holds_idle_token());
        assert_eq!(h.poll_timeout(), Some(rests_until), "woken by {outsider}");
    }
    // A wake of another ring changes nothing either.
    let other = conclave_wire::gcs::RingId {
        seq: ring.seq + 1,
        ..ring
    };
    h.handle_packet(now, member, Packet::Wake { ring: other })
        .unwrap();
    assert_eq!(h.poll_timeout(), Some(rests_until));
    // A member of the ring can: the token goes at once.
    h.handle_packet(now, member, Packet::Wake { ring }).unwrap();
    assert!(h.poll_timeout().is_some_and(|t| t <= now), "still resting");
    h.handle_timeout(now);
    assert!(!h.holds_idle_token());
}
