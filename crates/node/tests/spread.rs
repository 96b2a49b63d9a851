//! Spread 4.x clients on the node (docs/spread.md), spoken to byte for byte by the tests' own
//! client ([`common::spread_client`]): the handshake and its rejects, joins, leaves and
//! disconnections as Spread shows them, data between Spread and Conclave clients, malformed
//! requests, and a partition and merge.

mod common;

use common::spread_client::{self as sc, Handshake, Message};
use common::{network, Net};
use conclave_node::{AdminRequest, SessionId};
use conclave_wire::client::{frame, ClientCommand, ClientEvent, Reply, Request};
use conclave_wire::gcs::ServiceType;
use std::sync::atomic::Ordering::Relaxed;

/// A Spread client of node `node`, on connection `id`.
struct Sp {
    node: usize,
    id: SessionId,
    pg: String,
    /// Bytes of the node's output read so far.
    read: usize,
}

fn open(net: &mut Net, node: usize, id: SessionId) {
    let now = net.time();
    net.spread.insert((node, id));
    net.nodes[node].open_spread_session(now, id).unwrap();
}

fn send(net: &mut Net, node: usize, id: SessionId, bytes: &[u8]) {
    let now = net.time();
    net.nodes[node].handle_session_bytes(now, id, bytes);
    net.run(1);
}

fn raw(net: &Net, node: usize, id: SessionId) -> Vec<u8> {
    net.raw.get(&(node, id)).cloned().unwrap_or_default()
}

/// Connects a Spread client as `name` (membership messages on) and checks the handshake's bytes.
fn connect(net: &mut Net, node: usize, id: SessionId, name: &str) -> Sp {
    open(net, node, id);
    send(net, node, id, &sc::connect(name, true));
    assert_eq!(raw(net, node, id), b"\x05NULL ", "the list of methods");
    send(net, node, id, &sc::null_auth());
    let bytes = raw(net, node, id);
    let Handshake::Accepted {
        methods,
        version,
        private_group,
        used,
    } = sc::handshake(&bytes)
    else {
        panic!("not accepted: {bytes:?}");
    };
    assert_eq!(methods, b"NULL ");
    assert_eq!(version, [4, 4, 0]);
    let daemon = format!("d{}", node + 1);
    if !name.is_empty() {
        assert_eq!(private_group, format!("#{name}#{daemon}"));
    }
    assert_eq!(used, bytes.len());
    Sp {
        node,
        id,
        pg: private_group,
        read: used,
    }
}

impl Sp {
    fn req(&self, net: &mut Net, kind: u32, groups: &[&str], mess_type: i16, data: &[u8]) {
        let b = sc::request(false, kind, &self.pg, groups, mess_type, data);
        send(net, self.node, self.id, &b);
    }

    /// The messages that arrived since the last call.
    fn take(&mut self, net: &Net) -> Vec<Message> {
        let bytes = raw(net, self.node, self.id);
        let (m, used) = sc::messages(&bytes[self.read..], &self.pg);
        self.read += used;
        m
    }
}

/// A Conclave client of node `node` on connection `id`, in `group`.
fn native(net: &mut Net, node: usize, id: SessionId, name: &str, group: &str) {
    let now = net.time();
    net.nodes[node].open_session(now, id).unwrap();
    let reqs = [
        Request::Connect { name: name.into() },
        // Without flushes: the test does not answer them.
        Request::Command(ClientCommand::Join {
            group: group.into(),
            vs: false,
        }),
    ];
    for r in reqs {
        let now = net.time();
        net.nodes[node].handle_session_bytes(now, id, &frame(&r.encode()));
    }
}

fn native_events(net: &Net, node: usize, id: SessionId, from: usize) -> Vec<ClientEvent> {
    net.replies[from..]
        .iter()
        .filter(|(n, s, _)| (*n, *s) == (node, id))
        .filter_map(|(_, _, r)| match r {
            Reply::Event(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

fn membership(m: &Message) -> (u32, Vec<String>, Vec<Vec<String>>, Vec<String>) {
    match m {
        Message::Membership {
            service,
            members,
            vs_sets,
            local,
            ..
        } => (*service, members.clone(), vs_sets.clone(), local.clone()),
        m => panic!("not a membership: {m:?}"),
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_handshake_accepts_and_refuses_as_spread_does() {
    let (cfg, ids) = network(2, 51);
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    let _alice = connect(&mut net, 0, 1, "alice");
    // Anonymous: the daemon picks `r<k>-<connection>`.
    let anon = connect(&mut net, 0, 2, "");
    assert!(
        anon.pg.starts_with("#r") && anon.pg.ends_with("-2#d1"),
        "{}",
        anon.pg
    );

    let reject = |net: &mut Net, id, first: &[u8], then: Option<&[u8]>, code: u8| {
        open(net, 0, id);
        send(net, 0, id, first);
        if let Some(b) = then {
            send(net, 0, id, b);
        }
        let got = raw(net, 0, id);
        assert_eq!(got.last(), Some(&code), "connection {id}: {got:?}");
        assert!(net.closed.contains(&(0, id)), "connection {id} is closed");
    };
    // Version 3.0.0: REJECT_VERSION.
    reject(&mut net, 10, b"\x03\x00\x01\x01a", None, 0xf9);
    // Eleven bytes, or a '#': REJECT_ILLEGAL_NAME.
    reject(&mut net, 11, b"\x04\x04\x00\x01\x0babcdefghijk", None, 0xfb);
    reject(&mut net, 12, b"\x04\x04\x00\x01\x03a#b", None, 0xfb);
    // A name in use: REJECT_NOT_UNIQUE.
    reject(&mut net, 13, &sc::connect("alice", true), None, 0xfa);
    // A method other than NULL: REJECT_AUTH.
    let mut pword = vec![0u8; 90];
    pword[..5].copy_from_slice(b"PWORD");
    reject(&mut net, 14, &sc::connect("bob", true), Some(&pword), 0xf7);
    assert_eq!(net.nodes[0].metrics().spread_refused.load(Relaxed), 5);

    // A client that says nothing is closed at the handshake time, with nothing sent.
    open(&mut net, 0, 20);
    net.run(6_000);
    assert!(net.closed.contains(&(0, 20)));
    assert_eq!(raw(&net, 0, 20), b"");

    // A 3.14 library: no patch byte, no authentication, straight to the accept.
    open(&mut net, 0, 21);
    send(&mut net, 0, 21, b"\x03\x0e\x01\x03old");
    assert_eq!(raw(&net, 0, 21), b"\x01\x04\x04\x07#old#d1");
}

#[test]
fn spread_and_conclave_clients_share_a_group() {
    let (cfg, ids) = network(2, 52);
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    let mut alice = connect(&mut net, 0, 1, "alice");
    let mut carol = connect(&mut net, 1, 3, "carol");

    alice.req(&mut net, sc::JOIN, &["g"], 0, b"");
    net.run(100);
    let m = alice.take(&net);
    assert_eq!(m.len(), 1, "{m:?}");
    let (service, members, sets, local) = membership(&m[0]);
    assert_eq!(service, sc::REG_MEMB | sc::CAUSED_BY_JOIN);
    assert_eq!(members, ["#alice#d1"]);
    assert_eq!(sets, [vec!["#alice#d1".to_string()]]);
    assert_eq!(local, ["#alice#d1"]);

    // Bob, a Conclave client of d2, joins: Spread's members are in daemon order, then by name.
    native(&mut net, 1, 2, "bob", "g");
    net.run(100);
    carol.req(&mut net, sc::JOIN, &["g"], 0, b"");
    net.run(100);
    let m = alice.take(&net);
    assert_eq!(m.len(), 2, "{m:?}");
    let (service, members, sets, _) = membership(&m[1]);
    assert_eq!(service, sc::REG_MEMB | sc::CAUSED_BY_JOIN);
    assert_eq!(members, strings(&["#alice#d1", "#bob#d2", "#carol#d2"]));
    assert_eq!(sets, [vec!["#carol#d2".to_string()]]);
    let Message::Membership { index, gid, .. } = &m[1] else {
        unreachable!()
    };
    assert_eq!(*index, 0);
    let Message::Membership { gid: gid0, .. } = &m[0] else {
        unreachable!()
    };
    assert_ne!(gid, gid0, "each view its own id");
    let m = carol.take(&net);
    let Message::Membership { index, .. } = &m[0] else {
        panic!("{m:?}")
    };
    assert_eq!(*index, 2);

    // Bob's message reaches the Spread members, agreed, from `#bob#d2`, mess_type 0.
    let from = net.replies.len();
    let msg = Request::Command(ClientCommand::Multicast {
        service: ServiceType::Agreed,
        groups: vec!["g".into()],
        payload: b"from bob".to_vec().into(),
    });
    let now = net.time();
    net.nodes[1].handle_session_bytes(now, 2, &frame(&msg.encode()));
    net.run(100);
    for c in [&mut alice, &mut carol] {
        assert_eq!(
            c.take(&net),
            [Message::Data {
                service: sc::AGREED,
                sender: "#bob#d2".into(),
                groups: vec!["g".into()],
                mess_type: 0,
                endian_mismatch: false,
                data: b"from bob".to_vec(),
            }]
        );
    }

    // Alice writes big-endian (as Java does), to g twice and to her own private group, with a
    // mess_type and SELF_DISCARD: Carol gets one copy listing the three names as sent, the
    // hint's byte order intact; Bob gets it in g; Alice does not get it.
    let b = sc::request(
        true,
        sc::SAFE | sc::SELF_DISCARD,
        &alice.pg,
        &["g", "g"],
        0x1234,
        b"from alice",
    );
    send(&mut net, 0, 1, &b);
    net.run(100);
    assert_eq!(
        carol.take(&net),
        [Message::Data {
            service: sc::SAFE | sc::SELF_DISCARD,
            sender: "#alice#d1".into(),
            groups: vec!["g".into(), "g".into()],
            mess_type: 0x1234,
            endian_mismatch: true,
            data: b"from alice".to_vec(),
        }]
    );
    assert_eq!(alice.take(&net), []);
    let got: Vec<_> = native_events(&net, 1, 2, from)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::Message {
                sender,
                payload,
                service,
                ..
            } => Some((sender, payload.to_vec(), service)),
            _ => None,
        })
        .collect();
    assert_eq!(
        got,
        [
            ("bob#d2".into(), b"from bob".to_vec(), ServiceType::Agreed),
            ("alice#d1".into(), b"from alice".to_vec(), ServiceType::Safe)
        ]
    );

    // Carol leaves: she is told she left; the others see the leave of Carol.
    carol.req(&mut net, sc::LEAVE, &["g"], 0, b"");
    net.run(100);
    assert_eq!(carol.take(&net), [Message::SelfLeave { group: "g".into() }]);
    let m = alice.take(&net);
    let (service, members, sets, _) = membership(&m[0]);
    assert_eq!(service, sc::REG_MEMB | sc::CAUSED_BY_LEAVE);
    assert_eq!(members, strings(&["#alice#d1", "#bob#d2"]));
    assert_eq!(sets, [vec!["#carol#d2".to_string()]]);
    // A leave of a group not joined, and a second join, are ignored.
    carol.req(&mut net, sc::LEAVE, &["g"], 0, b"");
    alice.req(&mut net, sc::JOIN, &["g"], 0, b"");
    net.run(100);
    assert_eq!(carol.take(&net), []);
    assert_eq!(alice.take(&net), []);

    // Bob disconnects: a disconnect of Bob.
    let now = net.time();
    net.nodes[1].close_session(now, 2);
    net.run(100);
    let m = alice.take(&net);
    let (service, members, sets, _) = membership(&m[0]);
    assert_eq!(service, sc::REG_MEMB | sc::CAUSED_BY_DISCONNECT);
    assert_eq!(members, ["#alice#d1"]);
    assert_eq!(sets, [vec!["#bob#d2".to_string()]]);
}

#[test]
fn a_malformed_request_closes_that_session_alone() {
    let (cfg, ids) = network(1, 53);
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    let mut alice = connect(&mut net, 0, 1, "alice");
    let bob = connect(&mut net, 0, 2, "bob");
    alice.req(&mut net, sc::JOIN, &["g"], 0, b"");
    bob.req(&mut net, sc::JOIN, &["g"], 0, b"");
    net.run(100);
    alice.take(&net);
    // A data message with the reject bit set: Spread 4.4.0 forwards it, and every receiver
    // loses its framing. Here Bob's session closes and Alice sees Bob disconnect.
    bob.req(&mut net, sc::AGREED | sc::REJECT, &["g"], 0, b"x");
    net.run(100);
    assert!(net.closed.contains(&(0, 2)));
    let m = alice.take(&net);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(membership(&m[0]).0, sc::REG_MEMB | sc::CAUSED_BY_DISCONNECT);
    assert_eq!(net.nodes[0].metrics().spread_refused.load(Relaxed), 1);

    // Each rule of the header: a session per case, every one closed.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "two services",
            sc::request(false, sc::AGREED | sc::SAFE, "#c3#d1", &["g"], 0, b""),
        ),
        (
            "service and join",
            sc::request(false, sc::AGREED | sc::JOIN, "#c4#d1", &["g"], 0, b""),
        ),
        ("no type", sc::request(false, 0, "#c5#d1", &["g"], 0, b"")),
        (
            "GROUPS_MESS",
            sc::request(false, 0x8_0000, "#c6#d1", &["g"], 0, b""),
        ),
        (
            "another's name",
            sc::request(false, sc::AGREED, "#alice#d1", &["g"], 0, b""),
        ),
        ("join without a NUL", {
            let mut b = sc::request(false, sc::JOIN, "#c8#d1", &[], 0, b"");
            b[36] = 1;
            b.extend_from_slice(&[b'x'; 32]);
            b
        }),
        (
            "join of a '#' name",
            sc::request(false, sc::JOIN, "#c9#d1", &["#x"], 0, b""),
        ),
        (
            "join of two groups",
            sc::request(false, sc::JOIN, "#c10#d1", &["a", "b"], 0, b""),
        ),
        ("101 groups", {
            let names: Vec<String> = (0..101).map(|i| format!("g{i}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            sc::request(false, sc::AGREED, "#c11#d1", &names, 0, b"")
        }),
        (
            "too long",
            sc::request(false, sc::AGREED, "#c12#d1", &["g"], 0, &vec![0; 143_921]),
        ),
        ("hint bits", {
            let mut b = sc::request(false, sc::AGREED, "#c13#d1", &["g"], 0, b"");
            b[40] = 0x81;
            b
        }),
    ];
    for (i, (what, bytes)) in cases.into_iter().enumerate() {
        let id = 3 + i as SessionId;
        connect(&mut net, 0, id, &format!("c{id}"));
        send(&mut net, 0, id, &bytes);
        net.run(10);
        assert!(net.closed.contains(&(0, id)), "{what}: not closed");
    }
    assert_eq!(net.nodes[0].metrics().spread_refused.load(Relaxed), 12);

    // The largest message Spread's limit allows goes through.
    let mut carol = connect(&mut net, 0, 40, "carol");
    carol.req(&mut net, sc::JOIN, &["g"], 0, b"");
    net.run(100);
    carol.take(&net);
    alice.take(&net);
    alice.req(&mut net, sc::FIFO, &["g"], 7, &vec![9; 143_920]);
    net.run(100);
    let m = carol.take(&net);
    assert!(
        matches!(&m[..], [Message::Data { data, mess_type: 7, .. }] if data.len() == 143_920),
        "{}",
        m.len()
    );
}

#[test]
fn spread_clients_see_partitions_and_merges_with_their_sets() {
    let (cfg, ids) = network(3, 54);
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    let mut cs: Vec<Sp> = (0..3)
        .map(|i| connect(&mut net, i, 1, &format!("p{}", i + 1)))
        .collect();
    for c in &cs {
        c.req(&mut net, sc::JOIN, &["g"], 0, b"");
    }
    net.run(200);
    for c in &mut cs {
        c.take(&net);
    }
    // d3 parts from d1 and d2.
    let sets = vec![vec!["d1".into(), "d2".into()], vec!["d3".into()]];
    for i in 0..3 {
        let now = net.time();
        let r = net.nodes[i].handle_admin(now, AdminRequest::Partition { sets: sets.clone() });
        assert!(r.ok, "{r:?}");
    }
    net.run(3_000);
    let m = cs[0].take(&net);
    assert!(
        matches!(&m[0], Message::Transitional { group, .. } if group == "g"),
        "{m:?}"
    );
    let (service, members, vs, local) = membership(&m[1]);
    assert_eq!(service, sc::REG_MEMB | sc::CAUSED_BY_NETWORK);
    assert_eq!(members, strings(&["#p1#d1", "#p2#d2"]));
    assert_eq!(vs, [strings(&["#p1#d1", "#p2#d2"])]);
    assert_eq!(local, strings(&["#p1#d1", "#p2#d2"]));
    let m = cs[2].take(&net);
    let (_, members, vs, _) = membership(m.last().unwrap());
    assert_eq!(members, ["#p3#d3"]);
    assert_eq!(vs, [vec!["#p3#d3".to_string()]]);

    // They merge: two sets, each member's offset pointing at its own.
    for i in 0..3 {
        let now = net.time();
        net.nodes[i].handle_admin(now, AdminRequest::Heal);
    }
    net.run(3_000);
    let all = strings(&["#p1#d1", "#p2#d2", "#p3#d3"]);
    for (i, c) in cs.iter_mut().enumerate() {
        let m = c.take(&net);
        let last = m.last().unwrap_or_else(|| panic!("client {i}: nothing"));
        let (service, members, vs, local) = membership(last);
        assert_eq!(service, sc::REG_MEMB | sc::CAUSED_BY_NETWORK, "client {i}");
        assert_eq!(members, all);
        assert_eq!(vs, [strings(&["#p1#d1", "#p2#d2"]), strings(&["#p3#d3"])]);
        let own = if i == 2 { &vs[1] } else { &vs[0] };
        assert_eq!(&local, own, "client {i}");
    }
}

#[test]
fn spread_groups_are_open_and_private_groups_reach_one_client() {
    let (cfg, ids) = network(2, 55);
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    let mut alice = connect(&mut net, 0, 1, "alice");
    let mut carol = connect(&mut net, 1, 3, "carol");
    native(&mut net, 1, 2, "bob", "g");
    net.run(100);
    carol.req(&mut net, sc::JOIN, &["g"], 0, b"");
    net.run(100);
    carol.take(&net);
    let from = net.replies.len();

    // Alice is in no group: she sends to g all the same, and to Carol's private group.
    alice.req(&mut net, sc::AGREED, &["g"], 3, b"to g");
    alice.req(&mut net, sc::RELIABLE, &["#carol#d2"], 4, b"to carol");
    // And to both at once: Carol gets one copy.
    alice.req(&mut net, sc::SAFE, &["g", "#carol#d2"], 5, b"to both");
    // Carol to Bob's private group: a Conclave client gets it under that name.
    carol.req(&mut net, sc::FIFO, &["#bob#d2"], 6, b"to bob");
    net.run(100);
    let got: Vec<(Vec<String>, i16, Vec<u8>)> = carol
        .take(&net)
        .into_iter()
        .map(|m| match m {
            Message::Data {
                groups,
                mess_type,
                data,
                sender,
                ..
            } => {
                assert_eq!(sender, "#alice#d1");
                (groups, mess_type, data)
            }
            m => panic!("{m:?}"),
        })
        .collect();
    assert_eq!(
        got,
        [
            (strings(&["g"]), 3, b"to g".to_vec()),
            (strings(&["#carol#d2"]), 4, b"to carol".to_vec()),
            (strings(&["g", "#carol#d2"]), 5, b"to both".to_vec()),
        ]
    );
    assert_eq!(alice.take(&net), []);
    let got: Vec<(String, String, Vec<u8>)> = native_events(&net, 1, 2, from)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::Message {
                group,
                sender,
                payload,
                ..
            } => Some((group, sender, payload.to_vec())),
            _ => None,
        })
        .collect();
    assert_eq!(
        got,
        [
            ("g".into(), "alice#d1".into(), b"to g".to_vec()),
            ("g".into(), "alice#d1".into(), b"to both".to_vec()),
            ("#bob#d2".into(), "carol#d2".into(), b"to bob".to_vec()),
        ]
    );
    // A private group nobody holds, a group nobody is in, and the daemons' own member (as a
    // private group): delivered to nobody.
    alice.req(
        &mut net,
        sc::AGREED,
        &["#nobody#d2", "empty", "##d2"],
        0,
        b"lost",
    );
    net.run(100);
    assert_eq!(carol.take(&net), []);
    assert!(!net.closed.contains(&(0, 1)));
}

#[test]
fn a_spread_client_sending_faster_than_the_ring_takes_is_read_no_further_until_it_can() {
    let (mut cfg, ids) = network(2, 56);
    cfg.core.max_held_per_client = 4;
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    let mut alice = connect(&mut net, 0, 1, "alice");
    let mut bob = connect(&mut net, 0, 2, "bob");
    alice.req(&mut net, sc::JOIN, &["g"], 0, b"");
    bob.req(&mut net, sc::JOIN, &["g"], 0, b"");
    net.run(100);
    alice.take(&net);
    bob.take(&net);
    // While the daemons form a new ring, messages wait; past four, Alice is read no further.
    let sets = vec![vec!["d1".into()], vec!["d2".into()]];
    for i in 0..2 {
        let now = net.time();
        net.nodes[i].handle_admin(now, AdminRequest::Partition { sets: sets.clone() });
    }
    for _ in 0..2_000 {
        if !net.nodes[0].core().ready() {
            break;
        }
        net.run(1);
    }
    assert!(!net.nodes[0].core().ready());
    // Twenty messages of 30 KB: the first few wait in the core, the rest in the session's
    // input, and past a bound the driver is told to read no further.
    let mut burst = Vec::new();
    for k in 0..20u8 {
        let mut data = vec![k; 30_000];
        data[0] = k;
        burst.extend(sc::request(false, sc::FIFO, &alice.pg, &["g"], 0, &data));
    }
    let now = net.time();
    net.nodes[0].handle_session_bytes(now, 1, &burst[..100_000]);
    assert!(!net.nodes[0].session_paused(1), "reads go on for a while");
    net.nodes[0].handle_session_bytes(now, 1, &burst[100_000..]);
    assert!(net.nodes[0].session_paused(1));
    net.run(3_000);
    assert!(!net.nodes[0].session_paused(1));
    let got: Vec<Vec<u8>> = bob
        .take(&net)
        .into_iter()
        .filter_map(|m| match m {
            Message::Data { data, .. } => Some(data),
            _ => None,
        })
        .collect();
    assert_eq!(
        got.iter().map(|d| (d[0], d.len())).collect::<Vec<_>>(),
        (0..20u8).map(|k| (k, 30_000)).collect::<Vec<_>>()
    );
    assert!(alice
        .take(&net)
        .iter()
        .all(|m| !matches!(m, Message::Reject { .. })));
    assert_eq!(net.nodes[0].metrics().spread_rejects.load(Relaxed), 0);
}

#[test]
fn membership_messages_only_to_who_asked_and_quota_at_the_connection_limit() {
    let (mut cfg, ids) = network(1, 57);
    cfg.sessions.max_connections = 3;
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    let mut alice = connect(&mut net, 0, 1, "alice");
    // Bob connects without membership messages (the flag byte's bit 0 clear).
    open(&mut net, 0, 2);
    let mut hello = sc::connect("bob", false);
    hello.extend(sc::null_auth());
    send(&mut net, 0, 2, &hello);
    let Handshake::Accepted {
        private_group,
        used,
        ..
    } = sc::handshake(&raw(&net, 0, 2))
    else {
        panic!("bob not accepted");
    };
    let mut bob = Sp {
        node: 0,
        id: 2,
        pg: private_group,
        read: used,
    };
    alice.req(&mut net, sc::JOIN, &["g"], 0, b"");
    bob.req(&mut net, sc::JOIN, &["g"], 0, b"");
    net.run(100);
    alice.req(&mut net, sc::AGREED, &["g"], 1, b"hi");
    bob.req(&mut net, sc::LEAVE, &["g"], 0, b"");
    net.run(100);
    // Bob gets the data, and neither the views nor his self-leave.
    let m = bob.take(&net);
    assert!(
        matches!(&m[..], [Message::Data { data, .. }] if data == b"hi"),
        "{m:?}"
    );
    assert_eq!(alice.take(&net).len(), 4, "join, join, hi, leave");
    // A third connection fits; a fourth gets REJECT_QUOTA (-3) and is closed.
    connect(&mut net, 0, 3, "carol");
    open(&mut net, 0, 4);
    net.run(1);
    assert_eq!(raw(&net, 0, 4), [0xfd]);
    assert!(net.closed.contains(&(0, 4)));
}

#[test]
fn sending_from_outside_a_group_takes_what_joining_it_takes() {
    let (mut cfg, ids) = network(1, 58);
    cfg.access = vec![conclave_node::access::AccessRule {
        groups: "ops*".into(),
        join: Some(vec!["alice".into()]),
        send: None,
    }];
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    let mut alice = connect(&mut net, 0, 1, "alice");
    let mut mallory = connect(&mut net, 0, 2, "mallory");
    alice.req(&mut net, sc::JOIN, &["ops"], 0, b"");
    net.run(100);
    alice.take(&net);
    mallory.req(&mut net, sc::AGREED, &["ops"], 0, b"intrusion");
    net.run(100);
    assert_eq!(alice.take(&net), []);
    let m = mallory.take(&net);
    assert!(
        matches!(&m[..], [Message::Reject { old_type, .. }] if *old_type == sc::AGREED),
        "{m:?}"
    );
    assert_eq!(net.nodes[0].metrics().access_refusals.load(Relaxed), 1);
}
