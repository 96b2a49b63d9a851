//! The ordering state machine alone: three members over the test network, and hostile input.

use conclave_gcs::testnet::{Hop, Step, TestNet};
use conclave_gcs::{Ordering, OrderingConfig, OrderingError, Time};
use conclave_wire::gcs::{Body, Data, Packet, RingId, ServiceType, Token};

fn ring() -> RingId {
    RingId {
        seq: 1,
        rep: 1,
        inc: 0,
    }
}

fn msg(service: ServiceType, tag: u8) -> Body {
    sized_msg(service, tag, 1)
}

/// A message of `size` bytes, each `tag`.
fn sized_msg(service: ServiceType, tag: u8, size: usize) -> Body {
    Body::Client {
        client: "c".into(),
        groups: [("g".into(), 0)].into_iter().collect(),
        service,
        payload: vec![tag; size].into(),
        spread: None,
    }
}

/// Three members over a perfect network, whose idle token never rests.
fn three() -> TestNet<Ordering> {
    three_resting(0)
}

/// Three members over a perfect network, whose idle token rests `hold` µs at each (up to
/// 33 ms: the token's retransmission timeout is 200 ms here).
fn three_resting(hold: u64) -> TestNet<Ordering> {
    let cfg = OrderingConfig {
        idle_hold_us: hold,
        token_retransmit_ms: 200,
        ..OrderingConfig::default()
    };
    let nodes = (1..=3)
        .map(|m| Ordering::new(cfg.clone(), m, ring(), vec![1, 2, 3]))
        .collect();
    TestNet::new(nodes, Hop::default())
}

/// Rounds of one message of `service` at a member other than the one resting the token, each
/// once the ring is idle again; each must be delivered everywhere within a tenth of a hold
/// (`hold`, far longer than the hops): a message that waited out a hold anywhere fails.
fn at_an_idle_ring_none_waits_out_a_hold(service: ServiceType, rounds: u8) {
    let hold = 20_000;
    let mut net = three_resting(hold);
    start(&mut net);
    for round in 0..rounds {
        net.run_to(net.now() + std::time::Duration::from_millis(35));
        // Then on to the next rest, should that instant fall on a hop.
        let resting = |net: &mut TestNet<Ordering>| net.peers.iter().any(|n| n.holds_idle_token());
        assert!(
            net.run_until(100, resting),
            "an idle ring rests its token somewhere"
        );
        let holder = net.peers.iter().position(|n| n.holds_idle_token());
        let holder = holder.expect("resting");
        // Each member but the holder, in turn: the holder's own message needs no asking.
        let at = (holder + 1 + round as usize % 2) % 3;
        net.peers[at].submit(msg(service, round)).unwrap();
        net.send(at);
        let asked = net.now();
        let n = round as u64 + 1;
        let all = |net: &mut TestNet<Ordering>| net.peers.iter().all(|p| p.delivered_up_to() == n);
        assert!(net.run_until(10_000, all));
        let waited = net.now().as_micros() - asked.as_micros();
        assert!(
            waited < hold / 10,
            "round {round}: delivered {waited} µs after it was submitted at member {}, the token \
             resting at member {}",
            at + 1,
            holder + 1
        );
    }
    assert!(net.refusals.is_empty(), "{:?}", net.refusals);
}

/// The token of an idle ring (nothing sent, missing or waiting) on its `token_seq`-th pass.
fn idle_token(token_seq: u64) -> Token {
    Token {
        token_seq,
        ..Token::new(ring())
    }
}

/// The first member creates the token.
fn start(net: &mut TestNet<Ordering>) {
    net.peers[0].start(Time::ZERO);
    net.send_all();
}

#[test]
fn every_member_delivers_the_same_sequence() {
    let mut net = three();
    for (i, n) in net.peers.iter_mut().enumerate() {
        for k in 0..5 {
            n.submit(msg(ServiceType::Agreed, (i * 10 + k) as u8))
                .unwrap();
        }
    }
    start(&mut net);
    let all = |net: &mut TestNet<Ordering>| net.peers.iter().all(|n| n.delivered_up_to() == 15);
    assert!(net.run_until(10_000, all));
    let seqs: Vec<Vec<(u64, Body)>> = net
        .peers
        .iter_mut()
        .map(|n| {
            std::iter::from_fn(|| n.poll_delivery())
                .map(|d| (d.seq, std::sync::Arc::unwrap_or_clone(d.body)))
                .collect()
        })
        .collect();
    assert_eq!(
        seqs[0].iter().map(|d| d.0).collect::<Vec<_>>(),
        (1..=15).collect::<Vec<_>>()
    );
    assert!(seqs.iter().all(|s| *s == seqs[0]));
    assert!(net.refusals.is_empty(), "{:?}", net.refusals);
}

#[test]
fn a_message_at_an_idle_ring_asks_for_the_token_rather_than_wait_out_the_holds() {
    // Without asking, a message waits up to two holds.
    at_an_idle_ring_none_waits_out_a_hold(ServiceType::Agreed, 6);
}

#[test]
fn no_member_rests_the_token_while_a_safe_message_waits_for_its_second_aru() {
    // Each member delivers a safe message once it has seen the token's `aru` cover it on two
    // visits: a token rested after the first would keep the others waiting out the holds.
    at_an_idle_ring_none_waits_out_a_hold(ServiceType::Safe, 6);
    // And once every member has delivered it, the token rests again.
    let mut net = three_resting(20_000);
    start(&mut net);
    net.run_to(net.now() + std::time::Duration::from_millis(35));
    net.peers[0].submit(msg(ServiceType::Safe, 1)).unwrap();
    net.send(0);
    net.run_to(net.now() + std::time::Duration::from_millis(35));
    assert!(net.peers.iter().all(|p| p.delivered_up_to() == 1));
    assert!(net.peers.iter().any(|n| n.holds_idle_token()));
}

#[test]
fn a_large_ring_rests_its_token_less_at_each_member() {
    // A rotation of rests stays within half the token's retransmission timeout (20 ms), so
    // that no member takes a resting token for a lost one.
    for (members, rest_us) in [(1u32, 3_000u64), (3, 3_000), (8, 1_250), (20, 500)] {
        let cfg = OrderingConfig {
            idle_hold_us: 3_000,
            token_retransmit_ms: 20,
            ..OrderingConfig::default()
        };
        let mut o = Ordering::new(cfg, 1, ring(), (1..=members).collect());
        let idle = idle_token(1);
        let now = Time::ZERO + std::time::Duration::from_millis(5);
        o.handle_packet(now, Packet::Token(idle));
        assert!(o.holds_idle_token(), "{members} members");
        let until = now + std::time::Duration::from_micros(rest_us);
        assert_eq!(o.poll_timeout(), Some(until), "{members} members");
    }
}

#[test]
fn a_token_that_came_back_is_not_sent_again_while_it_rests() {
    let cfg = OrderingConfig {
        idle_hold_us: 3_000,
        token_retransmit_ms: 20,
        ..OrderingConfig::default()
    };
    let mut o = Ordering::new(cfg, 1, ring(), vec![1, 2, 3]);
    // Asked for by another member, the token is passed on at once.
    let t0 = Time::ZERO + std::time::Duration::from_millis(5);
    o.handle_packet(t0, Packet::Wake { ring: ring() });
    o.handle_packet(t0, Packet::Token(idle_token(3)));
    assert!(!o.holds_idle_token());
    assert!(
        matches!(o.poll_transmit().map(|t| t.packet), Some(Packet::Token(t)) if t.token_seq == 4)
    );
    // A slow rotation later it is back, and rests 3 ms: past the 20 ms after which the one
    // passed on would be sent again, had this one not proved that it arrived.
    let back = t0 + std::time::Duration::from_millis(19);
    o.handle_packet(back, Packet::Token(idle_token(6)));
    assert!(o.holds_idle_token());
    let rest_ends = back + std::time::Duration::from_millis(3);
    assert_eq!(o.poll_timeout(), Some(rest_ends));
    o.handle_timeout(t0 + std::time::Duration::from_millis(20));
    assert!(
        o.poll_transmit().is_none(),
        "a token sent again while it rests here"
    );
    o.handle_timeout(rest_ends);
    assert!(
        matches!(o.poll_transmit().map(|t| t.packet), Some(Packet::Token(t)) if t.token_seq == 7)
    );
}

#[test]
fn a_member_whose_messages_are_still_on_the_token_does_not_ask_for_it() {
    let mut o = Ordering::new(OrderingConfig::default(), 1, ring(), vec![1, 2, 3]);
    let t0 = Time::ZERO + std::time::Duration::from_millis(5);
    o.start(t0);
    // The first member's first visit, with nothing to send: the ring is idle, so a message
    // submitted after it asks for the token.
    while o.poll_transmit().is_some() {}
    o.submit(msg(ServiceType::Agreed, 1)).unwrap();
    let wakes = |o: &mut Ordering| {
        std::iter::from_fn(|| o.poll_transmit())
            .filter(|t| matches!(t.packet, Packet::Wake { .. }))
            .count()
    };
    assert_eq!(wakes(&mut o), 1);
    // Its next visit sends that message: until the visit after, the token carries it in its
    // `fcc`, no member rests it, and a message submitted meanwhile asks nobody.
    o.handle_packet(t0, Packet::Token(idle_token(3)));
    assert_eq!(o.queued(), 0);
    while o.poll_transmit().is_some() {}
    o.submit(msg(ServiceType::Agreed, 2)).unwrap();
    assert_eq!(wakes(&mut o), 0);
}

#[test]
fn a_safe_message_waits_until_every_member_has_it() {
    let mut net = three();
    net.peers[0].submit(msg(ServiceType::Safe, 1)).unwrap();
    start(&mut net);
    // The holder sent it and passed the token on: it has it, but may not deliver it yet.
    assert!(net.peers[0].poll_delivery().is_none());
    // The token comes back once: every member has the message, but the first cannot know yet.
    while net.step() != Some(Step::Arrived { peer: 0 }) {}
    assert!(
        net.peers[0].poll_delivery().is_none(),
        "not after one visit"
    );
    let all = |net: &mut TestNet<Ordering>| net.peers.iter().all(|n| n.delivered_up_to() == 1);
    assert!(net.run_until(10_000, all));
    for n in &mut net.peers {
        assert_eq!(n.poll_delivery().map(|d| d.seq), Some(1));
    }
}

#[test]
fn a_full_queue_is_a_typed_error() {
    let cfg = OrderingConfig {
        max_queued: 2,
        ..OrderingConfig::default()
    };
    let mut n = Ordering::new(cfg, 1, ring(), vec![1]);
    n.submit(msg(ServiceType::Fifo, 1)).unwrap();
    n.submit(msg(ServiceType::Fifo, 2)).unwrap();
    assert_eq!(
        n.submit(msg(ServiceType::Fifo, 3)),
        Err(OrderingError::QueueFull { max: 2 })
    );
}

#[test]
fn impossible_tokens_and_far_messages_are_refused() {
    let mut n = Ordering::new(OrderingConfig::default(), 2, ring(), vec![1, 2, 3]);
    let bad = Token {
        token_seq: u64::MAX,
        seq: u64::MAX,
        ..Token::new(ring())
    };
    n.handle_packet(Time::from_micros(1), Packet::Token(bad.clone()));
    n.handle_packet(
        Time::from_micros(2),
        Packet::Token(Token {
            token_seq: 5,
            aru: 10,
            seq: 3,
            ..bad
        }),
    );
    n.handle_packet(
        Time::from_micros(3),
        Packet::Data(Data {
            ring: ring(),
            seq: u64::MAX,
            sender: 1,
            origin: None,
            body: msg(ServiceType::Agreed, 0).into(),
        }),
    );
    assert_eq!(n.refused(), 3);
    assert_eq!(n.buffered(), 0);
    assert!(n.poll_transmit().is_none());
}

/// What a member holds ahead of what it has in order is bounded (the windows bound what an
/// honest ring sends before everyone has it): a message at the bound is held, one past it is
/// refused; and a newer token numbering fewer messages than the member holds is refused.
#[test]
fn the_horizon_bounds_what_is_held_and_tokens_behind_it_are_refused() {
    let cfg = OrderingConfig::default();
    let horizon = 4 * (cfg.window + cfg.max_per_visit as u64);
    let mut n = Ordering::new(cfg, 2, ring(), vec![1, 2, 3]);
    let data = |seq| {
        Packet::Data(Data {
            ring: ring(),
            seq,
            sender: 1,
            origin: None,
            body: msg(ServiceType::Agreed, 0).into(),
        })
    };
    n.handle_packet(Time::from_micros(1), data(horizon + 1));
    assert_eq!((n.refused(), n.buffered()), (1, 0));
    n.handle_packet(Time::from_micros(2), data(horizon));
    assert_eq!((n.refused(), n.buffered()), (1, 1));
    for seq in 1..=3 {
        n.handle_packet(Time::from_micros(3), data(seq));
    }
    assert_eq!(n.my_aru(), 3);
    let behind = Token {
        token_seq: 1,
        seq: 2,
        ..Token::new(ring())
    };
    n.handle_packet(Time::from_micros(4), Packet::Token(behind));
    assert_eq!(n.refused(), 2);
    assert!(n.poll_transmit().is_none());
}

#[test]
fn recovered_messages_from_outsiders_or_past_the_limits_are_refused() {
    use conclave_gcs::ordering::UNSEQUENCED;
    let mut n = Ordering::new(OrderingConfig::default(), 2, ring(), vec![1, 2, 3]);
    let max_queued = OrderingConfig::default().max_queued as u64;
    // Not a member of the ring: neither sequenced nor unsequenced messages are kept, whatever
    // sender id a hostile peer makes up.
    for sender in [0, 4, 9, u32::MAX] {
        n.insert_recovered(1, sender, msg(ServiceType::Agreed, 0).into());
        n.insert_recovered(UNSEQUENCED, sender, msg(ServiceType::Agreed, 0).into());
    }
    assert_eq!(n.refused(), 8);
    // A member, but past what a ring could have sent or a member could have queued.
    n.insert_recovered(u64::MAX >> 2, 1, msg(ServiceType::Agreed, 0).into());
    n.insert_recovered(
        UNSEQUENCED | (2 * max_queued),
        1,
        msg(ServiceType::Agreed, 0).into(),
    );
    assert_eq!(n.refused(), 10);
    assert_eq!(n.buffered(), 0);
    // What a member legitimately retransmits is kept and delivered when the ring finishes.
    n.insert_recovered(1, 1, msg(ServiceType::Agreed, 1).into());
    n.insert_recovered(UNSEQUENCED, 3, msg(ServiceType::Agreed, 2).into());
    assert_eq!(n.refused(), 10);
    let finished = n.finish(0);
    assert_eq!(finished.len(), 2, "{finished:?}");
}

/// `can_submit` says exactly whether `submit` takes a message, whatever its size: the daemon
/// acknowledges a client's message on its word, so a refusal after a yes lost messages.
#[test]
fn a_queue_full_of_bytes_is_a_typed_error_and_one_message_always_fits() {
    let big = |k: u8| Body::Client {
        client: "c".into(),
        groups: [("g".into(), 0)].into_iter().collect(),
        service: ServiceType::Fifo,
        payload: vec![k; 100_000].into(),
        spread: None,
    };
    let cfg = OrderingConfig {
        max_queued_bytes: 200_000,
        ..OrderingConfig::default()
    };
    let mut n = Ordering::new(cfg, 1, ring(), vec![1]);
    n.submit(big(1)).unwrap();
    // Under the budget: taken, though it goes past it.
    assert!(n.can_submit());
    n.submit(big(2)).unwrap();
    assert!(!n.can_submit());
    assert_eq!(
        n.submit(msg(ServiceType::Fifo, 3)),
        Err(OrderingError::QueueBytesFull { max_bytes: 200_000 })
    );
    // An empty queue takes a message larger than the budget.
    let cfg = OrderingConfig {
        max_queued_bytes: 10,
        ..OrderingConfig::default()
    };
    let mut n = Ordering::new(cfg, 1, ring(), vec![1]);
    n.submit(big(4)).unwrap();
    assert!(!n.can_submit());
}

/// What the first member transmits on the first visit of a ring, with `n` messages queued:
/// `true` for each message, `false` for the token.
fn first_visit(n: u8) -> Vec<bool> {
    first_visit_of(n, 1)
}

/// [`first_visit`] with messages of `size` bytes.
fn first_visit_of(n: u8, size: usize) -> Vec<bool> {
    let mut m = Ordering::new(OrderingConfig::default(), 1, ring(), vec![1, 2, 3]);
    for k in 0..n {
        m.submit(sized_msg(ServiceType::Agreed, k, size)).unwrap();
    }
    m.start(Time::ZERO);
    std::iter::from_fn(|| m.poll_transmit())
        .map(|t| match t.packet {
            Packet::Data(_) => true,
            Packet::Token(_) => false,
            p => panic!("not a visit's packet: {p:?}"),
        })
        .collect()
}

#[test]
fn a_light_visit_sends_its_messages_before_the_token_and_a_heavier_one_after_it() {
    let light = OrderingConfig::default().light_visit as u8;
    assert!(light > 0);
    let mut before = vec![true; light as usize];
    before.push(false);
    assert_eq!(first_visit(light), before);
    assert_eq!(first_visit(1), vec![true, false]);
    // One message more: the token first (the Accelerated Ring), as at full load.
    let mut after = vec![false];
    after.extend(vec![true; light as usize + 1]);
    assert_eq!(first_visit(light + 1), after);
    assert_eq!(first_visit(0), vec![false]);
    // Few, but large: the token first, so that it does not wait behind their datagrams.
    assert_eq!(first_visit_of(2, 6_000), vec![true, true, false]);
    assert_eq!(first_visit_of(2, 10_000), vec![false, true, true]);
}
