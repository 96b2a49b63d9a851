//! The Group Keys Engine (integrated architecture): a client that asks for its group's keys is
//! handed, after each view, the view's key derived from the daemons' key; every member that
//! asked, on whichever daemon, gets the same key for the same view, a new one for every view,
//! and no one else gets it.

mod common;

use common::{network, Net};
use conclave_node::Time;
use conclave_wire::client::{ClientCommand, ClientEvent, GroupViewId, Refusal, Reply, Request};
use conclave_wire::gcs::ServiceType;
use std::collections::BTreeMap;

fn connect(net: &mut Net, i: usize, id: u64, name: &str) {
    let now = net.time();
    net.nodes[i].open_session(now, id).unwrap();
    net.request(i, id, Request::Connect { name: name.into() });
}

fn join(net: &mut Net, i: usize, id: u64, group: &str, keys: bool) {
    if keys {
        net.request(
            i,
            id,
            Request::Keys {
                group: group.into(),
            },
        );
    }
    let join = ClientCommand::Join {
        group: group.into(),
        vs: true,
    };
    net.request(i, id, Request::Command(join));
}

/// The keys session `id` of node `i` was handed, by view, in order.
fn keys(net: &Net, i: usize, id: u64) -> Vec<(GroupViewId, [u8; 32])> {
    net.replies
        .iter()
        .filter(|(n, s, _)| (*n, *s) == (i, id))
        .filter_map(|(_, _, r)| match r {
            Reply::Event(ClientEvent::ViewKey { view, key, .. }) => Some((*view, key.0)),
            _ => None,
        })
        .collect()
}

/// The views of `group` session `id` of node `i` was given, in order.
fn views(net: &Net, i: usize, id: u64) -> Vec<GroupViewId> {
    net.replies
        .iter()
        .filter(|(n, s, _)| (*n, *s) == (i, id))
        .filter_map(|(_, _, r)| match r {
            Reply::Event(ClientEvent::View { view, .. }) => Some(*view),
            _ => None,
        })
        .collect()
}

/// Acknowledges every flush request the clients got (they are VS members).
fn ack_flushes(net: &mut Net, acked: &mut usize) {
    let fresh: Vec<(usize, u64, String, GroupViewId)> = net.replies[*acked..]
        .iter()
        .filter_map(|(n, s, r)| match r {
            Reply::Event(ClientEvent::FlushRequest { group, view }) => {
                Some((*n, *s, group.clone(), *view))
            }
            _ => None,
        })
        .collect();
    *acked = net.replies.len();
    for (i, id, group, view) in fresh {
        net.request(
            i,
            id,
            Request::Command(ClientCommand::FlushAck { group, view }),
        );
    }
}

fn run(net: &mut Net, ms: u64, acked: &mut usize) {
    for _ in 0..ms / 10 {
        net.run(10);
        ack_flushes(net, acked);
    }
}

#[test]
fn members_that_ask_get_one_key_per_view_and_others_none() {
    let (cfg, ids) = network(3, 21);
    let mut net = Net::new(&cfg, &ids);
    let mut acked = 0;
    run(&mut net, 2_000, &mut acked);
    connect(&mut net, 0, 1, "alice");
    connect(&mut net, 1, 1, "bob");
    connect(&mut net, 2, 1, "carol");
    join(&mut net, 0, 1, "g", true);
    join(&mut net, 1, 1, "g", true);
    // Carol is a member but takes the group's keys from elsewhere (a key agreement).
    join(&mut net, 2, 1, "g", false);
    run(&mut net, 500, &mut acked);

    let (alice, bob) = (keys(&net, 0, 1), keys(&net, 1, 1));
    assert!(keys(&net, 2, 1).is_empty());
    // Every view each was given has its key, after it.
    assert_eq!(
        alice.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        views(&net, 0, 1)
    );
    let by_view: BTreeMap<GroupViewId, [u8; 32]> = alice.iter().cloned().collect();
    for (view, key) in &bob {
        if let Some(k) = by_view.get(view) {
            assert_eq!(k, key, "one key per view at every member");
        }
    }
    let last = views(&net, 0, 1).last().copied().unwrap();
    assert_eq!(views(&net, 1, 1).last().copied(), Some(last));
    assert_eq!(
        bob.last().unwrap().1,
        alice.last().unwrap().1,
        "the final view's key"
    );

    // Bob leaves: the next view has a fresh key, which bob does not get.
    net.request(
        1,
        1,
        Request::Command(ClientCommand::Leave { group: "g".into() }),
    );
    let bob_keys = keys(&net, 1, 1).len();
    run(&mut net, 500, &mut acked);
    let alice = keys(&net, 0, 1);
    let after = alice.last().unwrap();
    assert!(after.0 > last);
    let mut all: Vec<[u8; 32]> = alice.iter().map(|(_, k)| *k).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), alice.len(), "no key serves two views");
    assert_eq!(keys(&net, 1, 1).len(), bob_keys);
    let handed: u64 = net
        .nodes
        .iter()
        .map(|n| {
            n.metrics()
                .group_keys
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    assert_eq!(handed as usize, alice.len() + bob_keys);
}

#[test]
fn a_view_after_a_partition_waits_for_its_rings_daemons_key() {
    let (cfg, ids) = network(3, 22);
    let mut net = Net::new(&cfg, &ids);
    let mut acked = 0;
    run(&mut net, 2_000, &mut acked);
    connect(&mut net, 0, 1, "alice");
    connect(&mut net, 2, 1, "carol");
    join(&mut net, 0, 1, "g", true);
    join(&mut net, 2, 1, "g", true);
    run(&mut net, 500, &mut acked);
    let split = conclave_node::AdminRequest::Partition {
        sets: vec![vec!["d1".into(), "d2".into()], vec!["d3".into()]],
    };
    for n in &mut net.nodes {
        let now = Time::from_micros(net.now);
        assert!(n.handle_admin(now, split.clone()).ok);
    }
    run(&mut net, 3_000, &mut acked);
    // Each side has its view of the group, keyed from its own ring's daemons' key.
    let (a, c) = (keys(&net, 0, 1), keys(&net, 2, 1));
    let (va, ka) = *a.last().unwrap();
    let (vc, kc) = *c.last().unwrap();
    assert_ne!(va, vc);
    assert_ne!(ka, kc);
    assert_eq!(va.ring, net.nodes[0].daemons_key().unwrap().view.ring);
    assert_eq!(vc.ring, net.nodes[2].daemons_key().unwrap().view.ring);
    for n in &mut net.nodes {
        let now = Time::from_micros(net.now);
        assert!(n.handle_admin(now, conclave_node::AdminRequest::Heal).ok);
    }
    run(&mut net, 3_000, &mut acked);
    let (a, c) = (keys(&net, 0, 1), keys(&net, 2, 1));
    assert_eq!(a.last(), c.last(), "merged: one view, one key");
    assert_eq!(Some(&a.last().unwrap().0), views(&net, 0, 1).last());
}

#[test]
fn keys_of_the_daemons_groups_are_refused() {
    let (cfg, ids) = network(1, 23);
    let mut net = Net::new(&cfg, &ids);
    let mut acked = 0;
    run(&mut net, 500, &mut acked);
    connect(&mut net, 0, 1, "mallory");
    net.request(
        0,
        1,
        Request::Keys {
            group: "#daemons".into(),
        },
    );
    let msg = ClientCommand::Multicast {
        groups: vec!["#daemons".into()],
        service: ServiceType::Agreed,
        payload: b"x".to_vec().into(),
    };
    net.request(0, 1, Request::Command(msg));
    run(&mut net, 100, &mut acked);
    let refused = net
        .replies
        .iter()
        .filter(|(_, _, r)| {
            matches!(
                r,
                Reply::Refused {
                    code: Refusal::NotAllowed,
                    ..
                }
            )
        })
        .count();
    assert_eq!(refused, 2);
}

/// The payloads session `id` of node `i` was delivered in `group`, with their view.
fn delivered(net: &Net, i: usize, id: u64) -> Vec<(GroupViewId, String, Vec<u8>)> {
    net.replies
        .iter()
        .filter(|(n, s, _)| (*n, *s) == (i, id))
        .filter_map(|(_, _, r)| match r {
            Reply::Event(ClientEvent::Message {
                view,
                sender,
                payload,
                ..
            }) => Some((*view, sender.clone(), payload.to_vec())),
            _ => None,
        })
        .collect()
}

/// Optimized EVS: in a group joined without VS whose keys come from the daemons, a message a
/// member sealed under the key of a view it has left (it had not taken the new one in) is
/// resealed by its daemon under the new view's key before it goes, and reaches every member, a
/// member that joined in that view included. A message that does not open under its key is
/// delivered as it came. (Resealing at delivery, when a message goes out in one view and is
/// delivered in a later one, is run by the simulator's Optimized EVS seeds.)
#[test]
fn a_message_sealed_under_an_old_view_reaches_evs_members_resealed() {
    use conclave_crypto::GroupKey;
    use conclave_secure::ViewKey;
    let (cfg, ids) = network(3, 23);
    let mut net = Net::new(&cfg, &ids);
    let mut acked = 0;
    run(&mut net, 2_000, &mut acked);
    let evs_join = |net: &mut Net, i: usize, name: &str| {
        connect(net, i, 1, name);
        net.request(i, 1, Request::Keys { group: "g".into() });
        let join = ClientCommand::Join {
            group: "g".into(),
            vs: false,
        };
        net.request(i, 1, Request::Command(join));
    };
    evs_join(&mut net, 0, "alice");
    evs_join(&mut net, 1, "bob");
    run(&mut net, 500, &mut acked);
    let (old_view, old_key) = *keys(&net, 0, 1).last().unwrap();
    assert_eq!(keys(&net, 1, 1).last().unwrap().0, old_view);
    // Carol joins: a new view, a new key. Alice has not taken it in yet and seals under the old.
    evs_join(&mut net, 2, "carol");
    run(&mut net, 500, &mut acked);
    let (new_view, new_key) = *keys(&net, 0, 1).last().unwrap();
    assert!(new_view > old_view);
    let old = ViewKey::from_daemons("g", old_view, GroupKey::from_bytes(old_key));
    let sealed = old.seal("alice#d1", ServiceType::Agreed, 0, b"late");
    let bogus = ViewKey::from_daemons("g", old_view, GroupKey::from_bytes([1; 32])).seal(
        "alice#d1",
        ServiceType::Agreed,
        1,
        b"forged",
    );
    for payload in [sealed, bogus.clone()] {
        let send = ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["g".into()],
            payload: payload.into(),
        };
        net.request(0, 1, Request::Command(send));
    }
    run(&mut net, 500, &mut acked);
    let current = ViewKey::from_daemons("g", new_view, GroupKey::from_bytes(new_key));
    for i in 0..3 {
        let got = delivered(&net, i, 1);
        assert_eq!(got.len(), 2, "at d{}: {got:?}", i + 1);
        let (view, sender, payload) = &got[0];
        assert_eq!((*view, sender.as_str()), (new_view, "alice#d1"));
        let (by, plain) = current
            .open_resealed(sender, ServiceType::Agreed, payload)
            .unwrap();
        assert_eq!((by.as_str(), plain.as_slice()), ("d1+out", &b"late"[..]));
        // Bound to its sender: under another name it does not open.
        assert!(current
            .open_resealed("bob#d2", ServiceType::Agreed, payload)
            .is_err());
        // What does not open under its key is delivered as it came, and counted.
        assert_eq!(got[1].2, bogus);
        let m = net.nodes[i].metrics();
        let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        // Alice's daemon resealed it before it went, and tried the forgery twice (as it went,
        // and as it was delivered); the others tried the forgery once.
        let (resealed, failed) = if i == 0 { (1, 2) } else { (0, 1) };
        assert_eq!(
            (count(&m.messages_resealed), count(&m.reseals_failed)),
            (resealed, failed)
        );
    }
}
