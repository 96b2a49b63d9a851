//! The client-group daemon over a perfect network of two daemons, driven by hand: the limits on
//! what one client can make the daemons keep, and a flush acknowledgement that must not wait for
//! a full ring.

use conclave_gcs::testnet::{Hop, TestNet};
use conclave_gcs::{
    ClientCommand, ClientEvent, ClientId, Daemon, DaemonConfig, GroupViewId, LocalEvent, Time,
};
use conclave_wire::gcs::ServiceType;
use std::collections::HashMap;
use std::time::Duration;

struct Net {
    net: TestNet<Daemon>,
    events: Vec<(usize, String, ClientEvent)>,
    /// Each client's name and id (names are unique across the network's daemons here).
    ids: HashMap<String, ClientId>,
    names: HashMap<ClientId, String>,
}

impl Net {
    fn new(n: usize, cfg: DaemonConfig) -> Net {
        let nodes = (1..=n as u32)
            .map(|id| Daemon::new(cfg.clone(), id, 0, Time::ZERO))
            .collect();
        let mut net = Net {
            net: TestNet::new(nodes, Hop::default()),
            events: Vec::new(),
            ids: HashMap::new(),
            names: HashMap::new(),
        };
        net.run_until(|net| net.nodes().iter().all(|d| d.ready()));
        net
    }

    fn nodes(&self) -> &[Daemon] {
        &self.net.peers
    }

    fn now(&self) -> Time {
        self.net.now()
    }

    /// Runs the network (a hop takes 10 us), until `done` holds.
    fn run_until(&mut self, done: impl Fn(&Net) -> bool) {
        for _ in 0..1_000_000 {
            if done(self) {
                return;
            }
            let Some(step) = self.net.step() else { break };
            let d = step.peer();
            while let Some((c, ev)) = self.next_event(d) {
                self.events.push((d, c, ev));
            }
        }
        let tail: Vec<_> = self.events.iter().rev().take(12).collect();
        panic!("the network never got there; last events: {tail:#?}");
    }

    fn connect(&mut self, d: usize, name: &str) {
        let id = self.ids.len() as ClientId;
        self.net.peers[d].connect(id, name).expect("connected");
        self.ids.insert(name.to_owned(), id);
        self.names.insert(id, name.to_owned());
    }

    fn client(&mut self, d: usize, name: &str, cmd: ClientCommand) {
        let now = self.now();
        self.net.peers[d]
            .handle_client(now, self.ids[name], cmd)
            .expect("accepted");
        // What the command made the daemon send and tell its clients.
        self.net.send(d);
        while let Some((c, ev)) = self.next_event(d) {
            self.events.push((d, c, ev));
        }
    }

    /// The next event of a client of daemon `d`, with the client's name.
    fn next_event(&mut self, d: usize) -> Option<(String, ClientEvent)> {
        let (id, ev) = self.net.peers[d].poll_event().map(LocalEvent::into_event)?;
        Some((self.names[&id].clone(), ev))
    }

    fn views_of(&self, name: &str, group: &str) -> Vec<(GroupViewId, Vec<String>)> {
        self.events
            .iter()
            .filter_map(|(_, c, ev)| match ev {
                ClientEvent::View {
                    group: g,
                    view,
                    members,
                    ..
                } if c == name && g == group => Some((*view, members.to_vec())),
                _ => None,
            })
            .collect()
    }

    /// Acknowledges every flush request `client` (on daemon `d`) got after the first `acked`.
    fn ack_flushes(&mut self, d: usize, client: &str, group: &str, acked: &mut usize) {
        let requests: Vec<GroupViewId> = self
            .events
            .iter()
            .filter_map(|(_, c, e)| match e {
                ClientEvent::FlushRequest { view, .. } if c == client => Some(*view),
                _ => None,
            })
            .collect();
        for view in requests.into_iter().skip(*acked) {
            let group = group.into();
            self.client(d, client, ClientCommand::FlushAck { group, view });
            *acked += 1;
        }
    }

    fn count(&self, name: &str, what: fn(&ClientEvent) -> bool) -> usize {
        self.events
            .iter()
            .filter(|(_, c, ev)| c == name && what(ev))
            .count()
    }
}

fn join(group: &str, vs: bool) -> ClientCommand {
    ClientCommand::Join {
        group: group.into(),
        vs,
    }
}

fn leave(group: &str) -> ClientCommand {
    ClientCommand::Leave {
        group: group.into(),
    }
}

#[test]
fn a_client_joining_and_leaving_in_a_loop_cannot_grow_the_queue_of_changes() {
    let cfg = DaemonConfig {
        max_changes_per_client: 2,
        ..DaemonConfig::default()
    };
    let mut net = Net::new(2, cfg);
    // A VS member on d2 that does not acknowledge flushes yet: every change waits.
    net.connect(1, "slow");
    net.client(1, "slow", join("g", true));
    net.run_until(|n| n.views_of("slow", "g").len() == 1);
    net.connect(0, "loop");
    for _ in 0..20 {
        net.client(0, "loop", join("g", false));
        net.client(0, "loop", leave("g"));
    }
    let flush_asked =
        |n: &Net| n.count("slow", |e| matches!(e, ClientEvent::FlushRequest { .. })) == 1;
    net.run_until(flush_asked);
    // Let everything in flight arrive; the flush still waits for "slow".
    let settle = net.now() + Duration::from_millis(50);
    net.run_until(|n| n.now() >= settle);
    let accepted =
        |e: &ClientEvent| matches!(e, ClientEvent::Joined { .. } | ClientEvent::Left { .. });
    assert_eq!(
        net.count("loop", accepted),
        2,
        "past the limit, the client's joins and leaves wait in its own queue"
    );
    // The acknowledgement lets the changes in; the client's queue drains a batch per flush.
    let mut acked = 0;
    while net.count("loop", accepted) < 40 {
        net.ack_flushes(1, "slow", "g", &mut acked);
        let before = net.count("loop", accepted);
        let seen = net.events.len();
        net.run_until(|n| n.events.len() > seen || n.count("loop", accepted) > before);
    }
    let last = net.views_of("slow", "g").last().cloned().unwrap();
    let settle = net.now() + Duration::from_millis(50);
    loop {
        net.ack_flushes(1, "slow", "g", &mut acked);
        let seen = net.events.len();
        let deadline = net.now() + Duration::from_millis(50);
        net.run_until(|n| n.events.len() > seen || n.now() >= deadline);
        if net.now() >= settle && net.events.len() == seen {
            break;
        }
    }
    let (view, members) = net.views_of("slow", "g").last().cloned().unwrap();
    assert!(view.index >= last.0.index);
    assert_eq!(
        members,
        vec!["slow".to_string()],
        "the loop ended with a leave"
    );
    // No VS member was closed for a late acknowledgement.
    assert_eq!(
        net.count("slow", |e| matches!(e, ClientEvent::Closed { .. })),
        0
    );
}

#[test]
fn empty_groups_are_forgotten_and_view_ids_are_never_reused() {
    let mut net = Net::new(2, DaemonConfig::default());
    net.connect(0, "a");
    net.connect(1, "b");
    for round in 0..3 {
        for i in 0..20 {
            let g = format!("g{i}");
            net.client(0, "a", join(&g, false));
            net.client(1, "b", join(&g, round == 1));
            net.run_until(|n| {
                n.views_of("a", &g).last().is_some_and(|v| v.1.len() == 2)
                    && n.views_of("b", &g).last().is_some_and(|v| v.1.len() == 2)
            });
            net.client(0, "a", leave(&g));
            net.client(1, "b", leave(&g));
        }
        let left = |n: &Net| {
            n.count("a", |e| matches!(e, ClientEvent::Left { .. })) == 20 * (round + 1)
                && n.count("b", |e| matches!(e, ClientEvent::Left { .. })) == 20 * (round + 1)
                && n.nodes().iter().all(|d| d.group_count() == 0)
        };
        net.run_until(left);
        for d in net.nodes() {
            assert_eq!(d.group_count(), 0, "nobody is in any group");
        }
    }
    // One ring throughout; every view of a group, seen by anyone, has its own id, and a member's
    // ids of one group increase.
    for g in (0..20).map(|i| format!("g{i}")) {
        let mut all: Vec<(GroupViewId, Vec<String>)> = Vec::new();
        for c in ["a", "b"] {
            let views = net.views_of(c, &g);
            assert!(views.windows(2).all(|w| w[0].0.index < w[1].0.index));
            all.extend(views);
        }
        for (id, members) in &all {
            for (id2, members2) in &all {
                if id == id2 {
                    assert_eq!(
                        members, members2,
                        "view {id:?} of {g} with two member lists"
                    );
                }
            }
        }
    }
    // The message path still works on a group created again.
    let before = net.views_of("a", "g0").len();
    net.client(0, "a", join("g0", false));
    net.run_until(|n| n.views_of("a", "g0").len() > before);
    net.client(
        0,
        "a",
        ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["g0".into()],
            payload: b"hi".to_vec().into(),
        },
    );
    net.run_until(|n| n.count("a", |e| matches!(e, ClientEvent::Message { .. })) == 1);
}

fn multicast(groups: &[&str]) -> ClientCommand {
    multicast_of(groups, b"m")
}

fn multicast_of(groups: &[&str], payload: &[u8]) -> ClientCommand {
    ClientCommand::Multicast {
        service: ServiceType::Agreed,
        groups: groups.iter().map(|g| g.to_string()).collect(),
        payload: payload.to_vec().into(),
    }
}

impl Net {
    /// The flush requests `client` got for `group`, in order.
    fn flush_requests(&self, client: &str, group: &str) -> Vec<GroupViewId> {
        self.events
            .iter()
            .filter_map(|(_, c, e)| match e {
                ClientEvent::FlushRequest { group: g, view } if c == client && g == group => {
                    Some(*view)
                }
                _ => None,
            })
            .collect()
    }

    /// Runs until `client` has a view of `group` with `n` members, acknowledging every flush
    /// `client` is asked for on the way.
    fn settle_view(&mut self, d: usize, client: &str, group: &str, n: usize) {
        let mut acked = self.flush_requests(client, group).len();
        loop {
            let seen = self.events.len();
            self.run_until(|net| {
                net.events.len() > seen
                    || net
                        .views_of(client, group)
                        .last()
                        .is_some_and(|v| v.1.len() == n)
            });
            let requests = self.flush_requests(client, group);
            for view in requests.into_iter().skip(acked) {
                let group = group.into();
                self.client(d, client, ClientCommand::FlushAck { group, view });
                acked += 1;
            }
            if self
                .views_of(client, group)
                .last()
                .is_some_and(|v| v.1.len() == n)
            {
                return;
            }
        }
    }
}

/// Two daemons where "c" (VS, on d1) is in g and h, "x" is in g, "f" is alone in k, and a
/// flush of h waits for "v" while c has acknowledged it (c's messages to h wait); a flush of g
/// has been asked of c and is not acknowledged yet. Gives the network and that view of g.
fn a_flush_of_h_held_up(max_queued: usize) -> (Net, GroupViewId) {
    let mut cfg = DaemonConfig::default();
    cfg.membership.ordering.max_queued = max_queued;
    let mut net = Net::new(2, cfg);
    // "c" (VS) is in g and h; "v" (VS) is in h and will not acknowledge the next flush of h.
    net.connect(0, "c");
    net.client(0, "c", join("g", true));
    net.settle_view(0, "c", "g", 1);
    net.client(0, "c", join("h", true));
    net.settle_view(0, "c", "h", 1);
    net.connect(1, "x");
    net.client(1, "x", join("g", false));
    net.settle_view(0, "c", "g", 2);
    net.connect(1, "v");
    net.client(1, "v", join("h", true));
    net.settle_view(0, "c", "h", 2);
    net.connect(0, "f");
    net.client(0, "f", join("k", false));
    net.run_until(|n| n.views_of("f", "k").len() == 1);

    // A flush of h that "c" acknowledges and "v" holds up: c's messages to h now wait.
    net.connect(1, "y");
    net.client(1, "y", join("h", false));
    let h_flushes = net.flush_requests("c", "h").len();
    net.run_until(|n| n.flush_requests("c", "h").len() > h_flushes);
    let view = *net.flush_requests("c", "h").last().unwrap();
    net.client(
        0,
        "c",
        ClientCommand::FlushAck {
            group: "h".into(),
            view,
        },
    );
    // A flush of g, not yet acknowledged.
    net.connect(1, "z");
    net.client(1, "z", join("g", false));
    let g_flushes = net.flush_requests("c", "g").len();
    net.run_until(|n| n.flush_requests("c", "g").len() > g_flushes);
    let g_view = *net.flush_requests("c", "g").last().unwrap();

    (net, g_view)
}

#[test]
fn a_flush_acknowledgement_goes_while_the_ring_takes_no_more_messages() {
    let (mut net, g_view) = a_flush_of_h_held_up(4);
    let mark = net.events.len();
    // With the network still, fill the ring's queue of messages to send.
    for _ in 0..6 {
        net.client(0, "f", multicast(&["k"]));
    }
    // A message to g and h waits (h is flushing), and c's acknowledgement of g queues behind it.
    net.client(0, "c", multicast(&["g", "h"]));
    net.client(
        0,
        "c",
        ClientCommand::FlushAck {
            group: "g".into(),
            view: g_view,
        },
    );
    let mut sent = 0;
    let mut acked = false;
    for (_, client, ev) in &net.events[mark..] {
        match ev {
            ClientEvent::Sent { .. } if client == "f" => sent += 1,
            ClientEvent::FlushAcked { group } if client == "c" && group == "g" => acked = true,
            _ => {}
        }
    }
    assert_eq!(
        sent, 4,
        "the ring took as many messages as it queues, no more"
    );
    assert!(
        acked,
        "the acknowledgement went at once, past the message waiting for h and the full ring"
    );
}

#[test]
fn a_message_does_not_overtake_an_earlier_one_that_waits() {
    let (mut net, g_view) = a_flush_of_h_held_up(10_000);
    let mark = net.events.len();
    // The first waits for h's flush; the second, to g alone, could go at once but must not.
    net.client(0, "c", multicast_of(&["g", "h"], b"first"));
    net.client(0, "c", multicast_of(&["g"], b"second"));
    let sent = net.events[mark..]
        .iter()
        .filter(|(_, client, ev)| client == "c" && matches!(ev, ClientEvent::Sent { .. }))
        .count();
    assert_eq!(sent, 0, "nothing of c's goes while its first message waits");
    // The flushes end; both messages reach x, in the order c sent them.
    net.client(
        0,
        "c",
        ClientCommand::FlushAck {
            group: "g".into(),
            view: g_view,
        },
    );
    let v_view = *net.flush_requests("v", "h").last().unwrap();
    net.client(
        1,
        "v",
        ClientCommand::FlushAck {
            group: "h".into(),
            view: v_view,
        },
    );
    let from_c = |n: &Net| -> Vec<Vec<u8>> {
        n.events
            .iter()
            .filter_map(|(_, to, e)| match e {
                ClientEvent::Message {
                    sender, payload, ..
                } if to == "x" && sender == "c" => Some(payload.to_vec()),
                _ => None,
            })
            .collect()
    };
    net.settle_view(0, "c", "g", 3);
    net.run_until(|n| from_c(n).len() == 2);
    assert_eq!(from_c(&net), vec![b"first".to_vec(), b"second".to_vec()]);
}

/// While no ring is up every command waits; what one client's waiting commands hold is bounded
/// in bytes as well as in number.
#[test]
fn what_one_client_keeps_waiting_is_bounded_in_bytes() {
    let cfg = DaemonConfig {
        max_held_bytes_per_client: 300_000,
        ..DaemonConfig::default()
    };
    let mut d = Daemon::new(cfg, 1, 0, Time::ZERO);
    d.connect(1, "c").unwrap();
    let cmd = |k: u8| ClientCommand::Multicast {
        service: ServiceType::Agreed,
        groups: vec!["g".into()],
        payload: vec![k; 100_000].into(),
    };
    let join = ClientCommand::Join {
        group: "g".into(),
        vs: false,
    };
    assert!(!d.ready());
    d.handle_client(Time::ZERO, 1, join).unwrap();
    d.handle_client(Time::ZERO, 1, cmd(1)).unwrap();
    d.handle_client(Time::ZERO, 1, cmd(2)).unwrap();
    let e = d.handle_client(Time::ZERO, 1, cmd(3)).unwrap_err();
    assert!(
        matches!(
            e,
            conclave_gcs::DaemonError::TooManyHeldBytes { max_bytes: 300_000 }
        ),
        "{e}"
    );
    assert_eq!(e.refusal(), conclave_wire::client::Refusal::TooManyHeld);
}

/// A daemon speaks only for its own clients, whose names end in `#` and its name: a join of a
/// client named after another daemon is dropped, at every daemon alike (so views still agree),
/// and counted; the others' joins go on.
#[test]
fn a_daemon_cannot_put_another_daemons_client_into_a_group() {
    let cfg = DaemonConfig {
        daemon_names: [(1, "d1".to_owned()), (2, "d2".to_owned())].into(),
        ..DaemonConfig::default()
    };
    let mut net = Net::new(2, cfg);
    net.connect(0, "amy#d1");
    // Daemon 2's core takes what its driver gives it: a faulty driver names a client of d1's.
    net.connect(1, "eve#d1");
    net.connect(1, "bob#d2");
    net.client(0, "amy#d1", join("g", false));
    net.client(1, "eve#d1", join("g", false));
    net.client(1, "bob#d2", join("g", false));
    net.run_until(|n| {
        n.views_of("amy#d1", "g")
            .last()
            .is_some_and(|v| v.1 == ["amy#d1", "bob#d2"])
            && n.views_of("bob#d2", "g")
                .last()
                .is_some_and(|v| v.1 == ["amy#d1", "bob#d2"])
    });
    for c in ["amy#d1", "bob#d2", "eve#d1"] {
        assert!(
            net.views_of(c, "g")
                .iter()
                .all(|v| !v.1.contains(&"eve#d1".to_owned())),
            "{c} saw eve in a view"
        );
    }
    for d in net.nodes() {
        assert_eq!(d.foreign_names(), 1, "eve's join, dropped at every daemon");
    }
}

#[test]
fn a_vs_member_that_never_acknowledges_a_flush_is_closed_at_its_deadline_and_the_view_goes_on() {
    let cfg = DaemonConfig {
        flush_timeout_ms: 100,
        ..DaemonConfig::default()
    };
    let mut net = Net::new(2, cfg);
    net.connect(1, "slow");
    net.client(1, "slow", join("g", true));
    // Other groups with settled views: the late flush is found among them.
    for i in 0..10 {
        net.client(1, "slow", join(&format!("other{i}"), false));
    }
    net.run_until(|n| n.views_of("slow", "g").len() == 1);
    net.connect(0, "quick");
    net.client(0, "quick", join("g", false));
    let asked = |n: &Net| n.count("slow", |e| matches!(e, ClientEvent::FlushRequest { .. })) == 1;
    net.run_until(asked);
    let closed = |n: &Net| n.count("slow", |e| matches!(e, ClientEvent::Closed { .. }));
    let asked_at = net.now();
    // Not before its deadline.
    net.run_until(|n| n.now() >= asked_at + Duration::from_millis(90));
    assert_eq!(closed(&net), 0, "closed before its flush deadline");
    net.run_until(|n| closed(n) == 1);
    assert!(net.now() >= asked_at + Duration::from_millis(100));
    // The change goes on without it: the quick member's view has it alone.
    net.run_until(|n| {
        n.views_of("quick", "g")
            .last()
            .is_some_and(|(_, m)| m == &vec!["quick".to_string()])
    });
    assert_eq!(closed(&net), 1, "closed once");
}
