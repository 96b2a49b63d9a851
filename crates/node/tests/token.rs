//! A daemon passes the ring's token on in a datagram of its own, before the messages of its
//! visit (the driver sends it first: `Node::poll_token`), so the next holder has it while this
//! daemon packs and seals the rest. (On a network that loses nothing: a visit that answers
//! retransmission requests sends those first and packs the token after them.) A light visit's
//! few messages go before the token, and the successor's datagram, which carries it, last.

mod common;

use common::{network, Net};
use conclave_node::frag::Reassembly;
use conclave_node::link::LinkMode;
use conclave_wire::client::{ClientCommand, Request};
use conclave_wire::gcs::{Packet, ServiceType};

/// The packets of a datagram (links off, so the datagram is the packets).
fn packets(d: &[u8]) -> Vec<Packet> {
    let mut r = Reassembly::default();
    r.push(d)
        .unwrap()
        .iter()
        .map(|p| Packet::decode(p).unwrap())
        .collect()
}

/// Three daemons, links off, with a client of the first joined to `g`.
fn joined() -> Net {
    let (mut cfg, ids) = network(3, 11);
    cfg.links.mode = LinkMode::Off;
    let mut net = Net::new(&cfg, &ids);
    net.run(400);
    assert_eq!(net.ring(0).1, vec![1, 2, 3], "the ring formed");
    let now = net.time();
    net.nodes[0].open_session(now, 1).unwrap();
    net.request(0, 1, Request::Connect { name: "a".into() });
    let join = ClientCommand::Join {
        group: "g".into(),
        vs: false,
    };
    net.request(0, 1, Request::Command(join));
    net.run(50);
    net
}

#[test]
fn a_light_visit_sends_its_message_first_and_the_token_last() {
    let mut net = joined();
    let before = net.captured.len();
    let send = ClientCommand::Multicast {
        service: ServiceType::Agreed,
        groups: vec!["g".into()],
        payload: vec![7; 100].into(),
    };
    net.request(0, 1, Request::Command(send));
    net.run(50);
    // Node 1's datagrams that carry the message, in the order it sent them.
    let with_data: Vec<(usize, Vec<Packet>)> = net.captured[before..]
        .iter()
        .filter(|(f, _, _)| *f == 0)
        .map(|(_, t, d)| (*t, packets(d)))
        .filter(|(_, p)| p.iter().any(|p| matches!(p, Packet::Data(_))))
        .collect();
    assert_eq!(with_data.len(), 2, "{with_data:?}");
    assert_eq!(with_data[0].0, 2, "the third daemon first");
    assert!(matches!(with_data[0].1[..], [Packet::Data(_)]));
    assert_eq!(with_data[1].0, 1, "the successor last");
    assert!(
        matches!(with_data[1].1[..], [Packet::Data(_), Packet::Token(_)]),
        "the message, then the token: {:?}",
        with_data[1].1
    );
}

#[test]
fn a_visit_passes_the_token_alone_before_its_messages() {
    let mut net = joined();
    let before = net.captured.len();
    for k in 0..300u32 {
        let send = ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["g".into()],
            payload: vec![7; 1000 + k as usize % 24].into(),
        };
        net.request(0, 1, Request::Command(send));
    }
    net.run(50);
    // Node 1's datagrams to its successor, node 2, from the first visit that sent messages.
    let to_successor: Vec<Vec<Packet>> = net.captured[before..]
        .iter()
        .filter(|(f, t, _)| (*f, *t) == (0, 1))
        .map(|(_, _, d)| packets(d))
        .collect();
    let first_data = to_successor
        .iter()
        .position(|p| p.iter().any(|p| matches!(p, Packet::Data(_))))
        .expect("node 1 sent its messages");
    assert!(first_data > 0, "a token went before the first messages");
    let token = &to_successor[first_data - 1];
    assert!(
        token.len() == 1 && matches!(token[0], Packet::Token(_)),
        "the token went alone, just before the messages: {token:?}"
    );
    // No visit here is light: no datagram carries a token together with messages.
    for d in &to_successor {
        let tokens = d.iter().filter(|p| matches!(p, Packet::Token(_))).count();
        assert!(tokens == 0 || d.len() == 1, "a token packed with messages");
    }
    let visits = to_successor
        .iter()
        .filter(|d| matches!(d[..], [Packet::Token(_)]))
        .count();
    assert!(visits >= 2, "the 300 messages took several visits");
}
