//! Sealed links between nodes: the daemons form their ring through them, and what an attacker
//! can send (datagrams recorded and replayed, altered, forged by an impostor under a configured
//! name, from an unconfigured address, or in the clear) is refused, counted, and changes
//! nothing: no packet reaches the core, the ring stays as it was.

mod common;

use common::{network, node, Net};
use conclave_node::config::Identities;
use conclave_node::frag::Reassembly;
use conclave_node::link::LinkMode;
use conclave_node::{Config, Node, NodeOptions, Time};
use conclave_wire::gcs::Packet;
use conclave_wire::link::{LinkHeader, LinkKind, HEADER_BYTES, TAG_BYTES};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;

fn to_epoch(d: &[u8]) -> u64 {
    header(d).to_epoch
}

fn formed(cfg: &Config, ids: &Identities) -> Net {
    let mut net = Net::new(cfg, ids);
    net.run(2_000);
    let n = net.nodes.len() as u32;
    for i in 0..net.nodes.len() {
        assert_eq!(net.ring(i).1, (1..=n).collect::<Vec<_>>(), "node {i}");
    }
    net
}

#[test]
fn daemons_form_their_ring_over_sealed_links() {
    let (cfg, ids) = network(3, 1);
    let net = formed(&cfg, &ids);
    for node in &net.nodes {
        assert!(node.metrics().packets_received.load(Relaxed) > 0);
        assert_eq!(node.metrics().bad_datagrams.load(Relaxed), 0);
    }
    // Every datagram went through the link, and none carries the ring's packets in the clear.
    let data: Vec<&Vec<u8>> = net
        .captured
        .iter()
        .map(|(_, _, d)| d)
        .filter(|d| header(d).kind == LinkKind::Data)
        .collect();
    assert!(data.len() > 10);
    assert_eq!(data.iter().filter(|d| readable(d)).count(), 0);
}

#[test]
fn authenticated_links_carry_the_packets_in_the_clear() {
    let (mut cfg, ids) = network(2, 5);
    cfg.links.mode = LinkMode::Authenticated;
    let net = formed(&cfg, &ids);
    let data = net
        .captured
        .iter()
        .filter(|(_, _, d)| header(d).kind == LinkKind::Data);
    assert!(data.clone().count() > 10);
    assert!(data.clone().all(|(_, _, d)| readable(d)));
}

fn header(d: &[u8]) -> LinkHeader {
    LinkHeader::decode(d).unwrap()
}

/// Whether the body of a datagram, read as it stands, holds daemon packets.
fn readable(d: &[u8]) -> bool {
    let body = &d[HEADER_BYTES..d.len() - TAG_BYTES];
    match Reassembly::default().push(body) {
        Ok(packets) => !packets.is_empty() && packets.iter().all(|p| Packet::decode(p).is_ok()),
        Err(_) => false,
    }
}

#[test]
fn replayed_altered_and_forged_datagrams_change_nothing() {
    let (cfg, ids) = network(2, 2);
    let mut net = formed(&cfg, &ids);
    let before = (net.ring(0), net.ring(1));
    let received = net.nodes[0].metrics().packets_received.load(Relaxed);
    let d2 = net.addrs[1];
    let to_d1: Vec<Vec<u8>> = net.sent(1, 0);
    assert!(to_d1.len() > 10);
    let now = net.time();
    // Replayed, every one of them.
    for d in &to_d1 {
        net.nodes[0].handle_datagram(now, d2, bytes::BytesMut::from(&d[..]));
    }
    // A question ("I do not know your epoch") is answered again, within its limit, and changes
    // nothing else; everything else is refused.
    let questions = to_d1.iter().filter(|d| to_epoch(d) == 0).count() as u64;
    assert_eq!(
        net.refusals(0, "d2", "link_replayed"),
        to_d1.len() as u64 - questions
    );
    let link_refusals = |net: &Net| -> u64 {
        net.nodes[0]
            .metrics()
            .peer_refusals()
            .iter()
            .filter(|((p, r), _)| p == "d2" && r.starts_with("link_"))
            .map(|(_, n)| *n)
            .sum()
    };
    let so_far = link_refusals(&net);
    // Altered: a bit flipped in the header, the body or the tag. (A changed counter or epoch
    // may be refused as a replay before it is found not to authenticate.)
    let mut altered = 0;
    for (k, d) in to_d1.iter().enumerate() {
        let mut x = d.clone();
        let at = [1, 10, 20, 30, 40, x.len() - 1][k % 6].min(x.len() - 1);
        x[at] ^= 0x10;
        net.nodes[0].handle_datagram(now, d2, bytes::BytesMut::from(&x[..]));
        altered += 1;
    }
    assert_eq!(link_refusals(&net) - so_far, altered);
    assert!(net.refusals(0, "d2", "link_forged") > 0);
    // An impostor: a daemon that calls itself d2 under a key of its own.
    let (mut fake_cfg, fake_ids) = network(2, 99);
    fake_cfg.daemon[0].key = cfg.daemon[0].key.clone();
    let impostor_ids = fake_ids;
    let opts = NodeOptions {
        incarnation: 5,
        identity: impostor_ids.get("d2"),
        secret_rng: Some(conclave_node::SecretRng::seeded(7)),
        ..Default::default()
    };
    let mut impostor = Node::new(fake_cfg, "d2", opts, Time::ZERO).unwrap();
    let forged_before = net.refusals(0, "d2", "link_forged");
    let mut forged = 0;
    for step in 0..200u64 {
        let t = Time::from_micros(net.now + step * 1_000);
        impostor.handle_timeout(t);
        while let Some((to, d)) = impostor.poll_datagram() {
            if to == net.addrs[0] {
                net.nodes[0].handle_datagram(now, d2, bytes::BytesMut::from(&d[..]));
                forged += 1;
            }
        }
    }
    assert!(forged > 0);
    assert_eq!(net.refusals(0, "d2", "link_forged") - forged_before, forged);
    // From an address no daemon has, and in the clear.
    let stranger: SocketAddr = "127.0.0.1:9".parse().unwrap();
    net.nodes[0].handle_datagram(now, stranger, bytes::BytesMut::from(&to_d1[0][..]));
    assert_eq!(net.refusals(0, "unknown", "unknown_sender"), 1);
    net.nodes[0].handle_datagram(now, d2, bytes::BytesMut::from(&[1u8, 0, 1, 2, 3][..]));
    assert!(net.refusals(0, "d2", "link_malformed") >= 1);
    // Nothing reached the core, and the ring is the same.
    assert_eq!(
        net.nodes[0].metrics().packets_received.load(Relaxed),
        received
    );
    assert_eq!((net.ring(0), net.ring(1)), before);
    // And the real d2 still gets through.
    net.run(500);
    assert!(net.nodes[0].metrics().packets_received.load(Relaxed) > received);
    assert_eq!((net.ring(0), net.ring(1)), before);
}

#[test]
fn a_restarted_daemon_rejoins_and_its_old_runs_datagrams_are_refused() {
    let (cfg, ids) = network(2, 3);
    let mut net = formed(&cfg, &ids);
    let old: Vec<Vec<u8>> = net.sent(1, 0);
    let old_to_d2: Vec<Vec<u8>> = net.sent(0, 1);
    // d2 restarts, a later incarnation.
    net.nodes[1] = node(&cfg, &ids, "d2", 2);
    // Let the clock pass the restart.
    net.run(3_000);
    assert_eq!(net.ring(0).1, vec![1, 2]);
    assert_eq!(net.ring(1).1, vec![1, 2]);
    assert_eq!(
        net.nodes[0].links().peer_epoch(2),
        Some(2 << 32 | (2 ^ 0x5a5a))
    );
    let received = net.nodes[0].metrics().packets_received.load(Relaxed);
    let received2 = net.nodes[1].metrics().packets_received.load(Relaxed);
    let ring = (net.ring(0), net.ring(1));
    let now = net.time();
    let (d1, d2) = (net.addrs[0], net.addrs[1]);
    for d in &old {
        net.nodes[0].handle_datagram(now, d2, bytes::BytesMut::from(&d[..]));
    }
    for d in &old_to_d2 {
        net.nodes[1].handle_datagram(now, d1, bytes::BytesMut::from(&d[..]));
    }
    let questions = old.iter().filter(|d| to_epoch(d) == 0).count() as u64;
    assert_eq!(
        net.refusals(0, "d2", "link_old_epoch"),
        old.len() as u64 - questions
    );
    // Bound to d2's earlier run; those under the daemons' key of that run name a key the new
    // run never held.
    let refused = net.refusals(1, "d1", "link_stale") + net.refusals(1, "d1", "link_unknown_key");
    let questions_to_d2 = old_to_d2.iter().filter(|d| to_epoch(d) == 0).count() as u64;
    assert!(refused >= old_to_d2.len() as u64 - questions_to_d2);
    assert!(old_to_d2.iter().any(|d| header(d).key != 0));
    assert_eq!(
        net.nodes[0].metrics().packets_received.load(Relaxed),
        received
    );
    assert_eq!(
        net.nodes[1].metrics().packets_received.load(Relaxed),
        received2
    );
    assert_eq!((net.ring(0), net.ring(1)), ring);
}

#[test]
fn links_off_and_sealed_do_not_mix_and_off_needs_no_keys() {
    let (cfg, ids) = network(2, 4);
    let mut plain = Config::local(2, 4800);
    plain.links.mode = LinkMode::Off;
    let mut sealed = node(&cfg, &ids, "d1", 1);
    let mut open = Node::new(plain, "d2", NodeOptions::default(), Time::ZERO).unwrap();
    for step in 1..100u64 {
        let t = Time::from_micros(step * 1_000);
        open.handle_timeout(t);
        while let Some((_, d)) = open.poll_datagram() {
            sealed.handle_datagram(t, cfg.daemon[1].peer, bytes::BytesMut::from(&d[..]));
        }
    }
    let refused = sealed.metrics().peer_refusals();
    assert!(
        refused[&("d2".to_string(), "link_malformed")] > 0,
        "{refused:?}"
    );
    assert_eq!(sealed.metrics().packets_received.load(Relaxed), 0);
}

/// The daemons' key in force at node `i`: its fingerprint and holders.
fn daemons_key(net: &Net, i: usize) -> Option<(String, Vec<u32>)> {
    let k = net.nodes[i].daemons_key()?;
    Some((k.fingerprint.to_string(), k.members.clone()))
}

/// Data datagrams from `from` to `to` captured since `since`, and those under a daemons' key.
fn under_daemons_key(net: &Net, since: usize, from: usize, to: usize) -> (usize, usize) {
    let data: Vec<&Vec<u8>> = net.captured[since..]
        .iter()
        .filter(|(f, t, d)| (*f, *t) == (from, to) && header(d).kind == LinkKind::Data)
        .map(|(_, _, d)| d)
        .collect();
    let keyed = data.iter().filter(|d| header(d).key != 0).count();
    (data.len(), keyed)
}

#[test]
fn the_daemons_agree_a_key_and_their_links_go_under_it() {
    let (cfg, ids) = network(3, 11);
    let mut net = formed(&cfg, &ids);
    let (fingerprint, members) = daemons_key(&net, 0).expect("a daemons' key");
    assert_eq!(members, vec![1, 2, 3]);
    for i in 0..3 {
        assert_eq!(daemons_key(&net, i).unwrap().0, fingerprint);
        assert_eq!(net.nodes[i].links().peers_on_ring_key(), 3);
        // Perhaps one first for a ring of its own, before the others were heard.
        assert!(net.nodes[i].metrics().daemons_keys.load(Relaxed) >= 1);
        // Hellos naming the key came before either end held it: none was refused.
        assert_eq!(net.nodes[i].metrics().bad_datagrams.load(Relaxed), 0);
    }
    let since = net.captured.len();
    net.run(200);
    for (a, b) in [(0, 1), (1, 2), (2, 0)] {
        let (data, keyed) = under_daemons_key(&net, since, a, b);
        assert!(data > 0 && keyed == data, "{a}->{b}: {keyed} of {data}");
    }
    let status = net.nodes[1].status().daemons_key.expect("in the status");
    assert_eq!(status.fingerprint, fingerprint);
    assert_eq!(status.members, vec!["d1", "d2", "d3"]);
}

#[test]
fn every_ring_after_a_partition_and_after_the_merge_gets_a_fresh_key() {
    use conclave_node::AdminRequest;
    let (cfg, ids) = network(3, 12);
    let mut net = formed(&cfg, &ids);
    let first = daemons_key(&net, 0).unwrap().0;
    let split = AdminRequest::Partition {
        sets: vec![vec!["d1".into(), "d2".into()], vec!["d3".into()]],
    };
    for n in &mut net.nodes {
        let now = Time::from_micros(net.now);
        assert!(n.handle_admin(now, split.clone()).ok);
    }
    net.run(3_000);
    let (pair, pair_members) = daemons_key(&net, 0).unwrap();
    assert_eq!(pair_members, vec![1, 2]);
    assert_eq!(daemons_key(&net, 1).unwrap().0, pair);
    let (alone, alone_members) = daemons_key(&net, 2).unwrap();
    assert_eq!(alone_members, vec![3]);
    assert!(pair != first && alone != first && alone != pair);
    for n in &mut net.nodes {
        let now = Time::from_micros(net.now);
        assert!(n.handle_admin(now, AdminRequest::Heal).ok);
    }
    net.run(3_000);
    let (merged, members) = daemons_key(&net, 0).unwrap();
    assert_eq!(members, vec![1, 2, 3]);
    assert!(![&first, &pair, &alone].contains(&&merged));
    let since = net.captured.len();
    net.run(200);
    for i in 0..3 {
        assert_eq!(daemons_key(&net, i).unwrap().0, merged);
        assert_eq!(net.nodes[i].links().peers_on_ring_key(), 3);
    }
    let (data, keyed) = under_daemons_key(&net, since, 2, 0);
    assert!(data > 0 && keyed == data);
}
