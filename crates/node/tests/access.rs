//! The daemons' access policy (`[[access]]`): a client may join (or ask the keys of) only the
//! groups a rule lets it, and send only where it lets it; each refusal is typed, names the rule,
//! and is counted.

mod common;

use common::{network, Net};
use conclave_node::access::AccessRule;
use conclave_wire::client::{ClientCommand, ClientEvent, Refusal, Reply, Request};
use conclave_wire::gcs::ServiceType;
use std::sync::atomic::Ordering::Relaxed;

fn join(group: &str) -> Request {
    Request::Command(ClientCommand::Join {
        group: group.into(),
        vs: false,
    })
}

/// Refusals since reply `from`: (node, session, reason).
fn refused(net: &Net, from: usize) -> Vec<(usize, u64, String)> {
    net.replies[from..]
        .iter()
        .filter_map(|(n, s, r)| match r {
            Reply::Refused {
                code: Refusal::NotAllowed,
                reason,
                ..
            } => Some((*n, *s, reason.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn the_access_policy_refuses_joins_keys_and_sends_it_does_not_allow() {
    let (mut cfg, ids) = network(2, 41);
    cfg.access = vec![AccessRule {
        groups: "ops*".into(),
        join: Some(vec!["alice".into(), "bob".into()]),
        send: Some(vec!["alice".into()]),
    }];
    let mut net = Net::new(&cfg, &ids);
    net.run(600);
    for (i, id, name) in [(0, 1, "alice"), (1, 2, "bob"), (1, 3, "mallory")] {
        let now = net.time();
        net.nodes[i].open_session(now, id).unwrap();
        net.request(i, id, Request::Connect { name: name.into() });
    }
    let from = net.replies.len();
    net.request(1, 3, join("ops-db"));
    net.request(
        1,
        3,
        Request::Keys {
            group: "ops".into(),
        },
    );
    net.request(1, 3, join("chat"));
    net.request(0, 1, join("ops-db"));
    net.request(1, 2, join("ops-db"));
    net.run(200);
    let no = refused(&net, from);
    assert_eq!(no.len(), 2, "{no:?}");
    assert!(no
        .iter()
        .all(|(n, s, why)| (*n, *s) == (1, 3) && why.contains("access rule 1")));
    let mut joined: Vec<(u64, String)> = net.replies[from..]
        .iter()
        .filter_map(|(_, s, r)| match r {
            Reply::Event(ClientEvent::Joined { group, .. }) => Some((*s, group.clone())),
            _ => None,
        })
        .collect();
    joined.sort();
    assert_eq!(
        joined,
        [
            (1, "ops-db".into()),
            (2, "ops-db".into()),
            (3, "chat".into())
        ]
    );
    assert_eq!(net.nodes[1].metrics().access_refusals.load(Relaxed), 2);

    // Bob is in the group but may not send to it; Alice may, and Bob gets her message.
    let msg = || {
        Request::Command(ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["ops-db".into()],
            payload: b"from alice".to_vec().into(),
        })
    };
    let from = net.replies.len();
    net.request(1, 2, msg());
    net.request(0, 1, msg());
    net.run(100);
    let no = refused(&net, from);
    assert_eq!(no.len(), 1, "{no:?}");
    assert_eq!((no[0].0, no[0].1), (1, 2));
    assert!(net.replies[from..].iter().any(|(n, s, r)| (*n, *s) == (1, 2)
        && matches!(r, Reply::Event(ClientEvent::Message { sender, .. }) if sender == "alice#d1")));
    assert_eq!(net.nodes[1].metrics().access_refusals.load(Relaxed), 3);
}
