//! Secure groups over the daemons' own core: each member a `SecureGroup` composed with a client
//! of a `conclave_gcs::Daemon`, the daemons on the core's test network, which partitions and
//! heals on demand. The daemons deliver real views, flush requests and messages; nothing here
//! imitates them.

use bytes::Bytes;
use conclave_crypto::{Fingerprint, Identity, SigScheme};
use conclave_gcs::testnet::{Hop, Links, TestNet};
use conclave_gcs::{ClientEvent, ClientId, Daemon, DaemonConfig, LocalEvent, Time};
use conclave_gka::{Directory, ProtocolId, SharedDirectory};
use conclave_secure::{SecureConfig, SecureError, SecureEvent, SecureGroup};
use conclave_wire::client::ClientCommand;
use conclave_wire::gcs::{DaemonId, Packet, ServiceType};
use conclave_wire::secure::SecureMessage;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;
use std::sync::{Arc, RwLock};

const ALL: [ProtocolId; 5] = [
    ProtocolId::Gdh,
    ProtocolId::Ckd,
    ProtocolId::Tgdh,
    ProtocolId::Str,
    ProtocolId::Bd,
];

/// A perfect network that can be split into components (a daemon always reaches itself).
#[derive(Default)]
struct Components {
    hop: Hop,
    split: Option<Vec<Vec<DaemonId>>>,
}

impl Links for Components {
    fn carry(&mut self, now: Time, from: DaemonId, to: DaemonId, p: &Packet) -> Vec<Time> {
        let apart = self.split.as_ref().is_some_and(|parts| {
            from != to && !parts.iter().any(|c| c.contains(&from) && c.contains(&to))
        });
        if apart {
            return Vec::new();
        }
        self.hop.carry(now, from, to, p)
    }
}

struct Member {
    daemon: usize,
    id: ClientId,
    name: String,
    sg: SecureGroup,
    got: Vec<SecureEvent>,
    /// What the daemons delivered to this client, as they delivered it.
    raw: Vec<ClientEvent>,
    /// Data multicasts of this member the session refuses before they travel (as a client
    /// session does that saw the group's end first), this many of them.
    refuse_data: usize,
}

struct World {
    net: TestNet<Daemon, Components>,
    members: Vec<Member>,
    directory: SharedDirectory,
    identities: Vec<(String, Identity)>,
    rng: ChaCha20Rng,
}

impl World {
    fn new(daemons: u32, seed: u64) -> World {
        let nodes = (1..=daemons)
            .map(|id| Daemon::new(DaemonConfig::default(), id, 0, Time::ZERO))
            .collect();
        let mut w = World {
            net: TestNet::new(nodes, Components::default()),
            members: Vec::new(),
            directory: Arc::new(RwLock::new(Directory::new())),
            identities: Vec::new(),
            rng: ChaCha20Rng::seed_from_u64(seed),
        };
        assert!(w
            .net
            .run_until(1_000_000, |n| n.peers.iter().all(|d| d.ready())));
        w
    }

    /// An identity for `name`, in the directory if `trusted`.
    fn identity(&mut self, name: &str, trusted: bool) -> Identity {
        let id = Identity::generate(SigScheme::Ed25519, &mut self.rng).unwrap();
        if trusted {
            self.directory
                .write()
                .unwrap()
                .insert(name.to_owned(), id.public());
        }
        self.identities.push((name.to_owned(), id.clone()));
        id
    }

    /// Connects `name` to daemon `d` (an index) and joins group "g" securely.
    fn join(&mut self, d: usize, name: &str, protocol: ProtocolId, trusted: bool) -> usize {
        let name = format!("{name}#d{}", d + 1);
        let identity = self.identity(&name, trusted);
        let id = self.members.len() as ClientId;
        self.net.peers[d].connect(id, &name).unwrap();
        let cfg = SecureConfig {
            protocol,
            ..SecureConfig::default()
        };
        let rng = Box::new(ChaCha20Rng::seed_from_u64(id + 1000));
        let sg = SecureGroup::join("g", &name, identity, self.directory.clone(), cfg, rng);
        self.members.push(Member {
            daemon: d,
            id,
            name,
            sg,
            got: Vec::new(),
            raw: Vec::new(),
            refuse_data: 0,
        });
        self.pump();
        self.members.len() - 1
    }

    fn member(&self, name: &str) -> usize {
        self.members
            .iter()
            .position(|m| m.name.starts_with(&format!("{name}#")))
            .unwrap()
    }

    /// Hands the members' commands to their daemons and the daemons' events to their members.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            for m in &mut self.members {
                while let Some(cmd) = m.sg.poll_command() {
                    moved = true;
                    if m.refuse_data > 0 && is_data(&cmd) {
                        m.refuse_data -= 1;
                        m.sg.command_refused();
                        continue;
                    }
                    let now = self.net.now();
                    // A command of a client already gone is refused; that is no failure here.
                    let _ = self.net.peers[m.daemon].handle_client(now, m.id, cmd);
                }
            }
            for d in 0..self.net.peers.len() {
                self.net.send(d);
                while let Some((id, ev)) =
                    self.net.peers[d].poll_event().map(LocalEvent::into_event)
                {
                    moved = true;
                    let m = &mut self.members[id as usize];
                    m.raw.push(ev.clone());
                    m.sg.handle_event(ev);
                    while let Some(e) = m.sg.poll_event() {
                        m.got.push(e);
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Runs the network until `done`, handing commands and events across after every step.
    fn run_until(&mut self, what: &str, done: impl Fn(&World) -> bool) {
        for _ in 0..2_000_000 {
            self.pump();
            if done(self) {
                return;
            }
            if self.net.step().is_none() {
                break;
            }
        }
        for m in &self.members {
            let v = m.sg.secure_view().map(|v| (v.view, &v.members));
            eprintln!("{}: {v:?}", m.name);
            for e in m
                .got
                .iter()
                .filter(|e| !matches!(e, SecureEvent::Message { .. }))
            {
                eprintln!("    {e:?}");
            }
            for e in m.raw.iter() {
                if let ClientEvent::View {
                    view,
                    members,
                    transitional,
                    ..
                } = e
                {
                    eprintln!(
                        "    raw view {:?}/{} {members:?} trans {transitional:?}",
                        (view.ring.seq, view.ring.rep),
                        view.index
                    );
                }
            }
        }
        panic!("never got there: {what}");
    }

    /// Runs until every listed member's secure view has exactly the listed members.
    fn settle(&mut self, names: &[&str]) {
        let idx: Vec<usize> = names.iter().map(|n| self.member(n)).collect();
        let want: Vec<String> = idx.iter().map(|i| self.members[*i].name.clone()).collect();
        self.run_until(&format!("a secure view of {names:?}"), |w| {
            idx.iter().all(|i| {
                w.members[*i].sg.secure_view().is_some_and(|v| {
                    let mut got = v.members.to_vec();
                    got.sort();
                    let mut want = want.clone();
                    want.sort();
                    got == want
                })
            })
        });
    }

    fn fingerprint(&self, name: &str) -> Fingerprint {
        self.members[self.member(name)]
            .sg
            .secure_view()
            .unwrap()
            .fingerprint
    }

    fn send(&mut self, name: &str, service: ServiceType, text: &str) {
        let i = self.member(name);
        self.members[i]
            .sg
            .send(service, Bytes::copy_from_slice(text.as_bytes()))
            .unwrap();
        self.pump();
    }

    fn messages(&self, name: &str) -> Vec<(String, String)> {
        self.members[self.member(name)]
            .got
            .iter()
            .filter_map(|e| match e {
                SecureEvent::Message {
                    sender, payload, ..
                } => Some((
                    sender.split('#').next().unwrap().to_owned(),
                    String::from_utf8_lossy(payload).into_owned(),
                )),
                _ => None,
            })
            .collect()
    }

    fn refusals(&self, name: &str) -> Vec<SecureError> {
        self.members[self.member(name)]
            .got
            .iter()
            .filter_map(|e| match e {
                SecureEvent::Refused { error, .. } => Some(error.clone()),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn every_protocol_agrees_a_key_per_view_and_seals_the_data() {
    for p in ALL {
        let mut w = World::new(3, 1);
        w.join(0, "a", p, true);
        w.settle(&["a"]);
        w.join(1, "b", p, true);
        w.join(2, "c", p, true);
        w.settle(&["a", "b", "c"]);
        let fp = w.fingerprint("a");
        assert_eq!(w.fingerprint("b"), fp, "{p:?}");
        assert_eq!(w.fingerprint("c"), fp, "{p:?}");

        w.send("a", ServiceType::Agreed, "from a");
        w.send("b", ServiceType::Fifo, "from b");
        w.run_until("both messages everywhere", |w| {
            ["a", "b", "c"].iter().all(|n| w.messages(n).len() == 2)
        });
        for n in ["a", "b", "c"] {
            let mut got = w.messages(n);
            got.sort();
            assert_eq!(
                got,
                vec![("a".into(), "from a".into()), ("b".into(), "from b".into())],
                "{p:?} at {n}"
            );
            assert!(
                w.refusals(n).is_empty(),
                "{p:?} at {n}: {:?}",
                w.refusals(n)
            );
        }
        // The daemons carried no plaintext.
        for m in &w.members {
            for ev in &m.raw {
                if let ClientEvent::Message { payload, .. } = ev {
                    assert!(!payload.windows(6).any(|x| x == b"from a" || x == b"from b"));
                }
            }
        }

        // A leave gives the others a new key, one never seen before.
        let c = w.member("c");
        w.members[c].sg.leave();
        w.pump();
        w.settle(&["a", "b"]);
        let after = w.fingerprint("a");
        assert_eq!(w.fingerprint("b"), after);
        assert_ne!(after, fp, "{p:?}: the leaver's key is not reused");
        w.send("a", ServiceType::Safe, "after c left");
        w.run_until("the message at b", |w| w.messages("b").len() == 3);
        assert_eq!(
            w.messages("c").len(),
            2,
            "{p:?}: c gets nothing after it left"
        );
    }
}

#[test]
fn a_partition_gives_each_side_its_key_and_the_merge_one_new_key() {
    let mut w = World::new(2, 2);
    for (d, n) in [(0, "a"), (0, "b"), (1, "c"), (1, "d")] {
        w.join(d, n, ProtocolId::Tgdh, true);
    }
    w.settle(&["a", "b", "c", "d"]);
    let whole = w.fingerprint("a");
    w.net.links.split = Some(vec![vec![1], vec![2]]);
    w.settle(&["a", "b"]);
    w.settle(&["c", "d"]);
    let (left, right) = (w.fingerprint("a"), w.fingerprint("c"));
    assert_eq!(w.fingerprint("b"), left);
    assert_eq!(w.fingerprint("d"), right);
    assert!(left != right && left != whole && right != whole);
    // Each side talks under its own key.
    w.send("a", ServiceType::Agreed, "left side");
    w.run_until("b has it", |w| w.messages("b").len() == 1);
    assert!(w.messages("c").is_empty());

    w.net.links.split = None;
    w.settle(&["a", "b", "c", "d"]);
    let merged = w.fingerprint("a");
    for n in ["b", "c", "d"] {
        assert_eq!(w.fingerprint(n), merged);
    }
    assert!(![whole, left, right].contains(&merged));
    w.send("d", ServiceType::Agreed, "merged");
    w.run_until("everyone has it", |w| {
        ["a", "b", "c"]
            .iter()
            .all(|n| w.messages(n).iter().any(|m| m.1 == "merged"))
    });
}

#[test]
fn what_the_application_sends_before_the_key_goes_out_in_the_first_secure_view() {
    let mut w = World::new(2, 3);
    // b is in the group first, so that a's first view has b in it (had a joined first, its
    // first secure view could be of a alone, and the message would go out in that).
    w.join(1, "b", ProtocolId::Gdh, true);
    w.settle(&["b"]);
    let a = w.join(0, "a", ProtocolId::Gdh, true);
    // Queued: no view yet, no key.
    w.members[a]
        .sg
        .send(ServiceType::Agreed, Bytes::from_static(b"early"))
        .unwrap();
    w.settle(&["a", "b"]);
    w.run_until("b has a's early message", |w| !w.messages("b").is_empty());
    assert_eq!(w.messages("b"), vec![("a".into(), "early".into())]);
    // In a's first secure view.
    let first = w.members[a].got.iter().find_map(|e| match e {
        SecureEvent::View(v) => Some(v.view),
        _ => None,
    });
    let sent_in = w.members[a].got.iter().find_map(|e| match e {
        SecureEvent::Message { view, .. } => Some(*view),
        _ => None,
    });
    assert!(first.is_some());
    assert_eq!(sent_in, first);
}

fn is_data(cmd: &ClientCommand) -> bool {
    matches!(cmd, ClientCommand::Multicast { payload, .. }
        if matches!(SecureMessage::decode(payload), Ok(SecureMessage::Data { .. })))
}

#[test]
fn a_multicast_the_session_refuses_is_forgotten_and_what_follows_goes_on() {
    let mut w = World::new(2, 11);
    let a = w.join(0, "a", ProtocolId::Tgdh, true);
    w.join(1, "b", ProtocolId::Tgdh, true);
    w.settle(&["a", "b"]);
    w.members[a].refuse_data = 1;
    w.send("a", ServiceType::Agreed, "refused");
    w.send("a", ServiceType::Agreed, "kept");
    w.run_until("b has the second", |w| !w.messages("b").is_empty());
    // The refused message waits for no acknowledgement: a view change neither waits for it
    // nor sends it again under the next key.
    w.join(1, "c", ProtocolId::Tgdh, true);
    w.settle(&["a", "b", "c"]);
    w.send("a", ServiceType::Agreed, "after");
    w.run_until("b and c have it", |w| {
        ["b", "c"]
            .iter()
            .all(|n| w.messages(n).iter().any(|m| m.1 == "after"))
    });
    let texts = |n: &str| -> Vec<String> { w.messages(n).into_iter().map(|m| m.1).collect() };
    assert_eq!(texts("b"), ["kept", "after"]);
    assert_eq!(texts("c"), ["after"]);
    check_keys(&w, "after a refusal");
}

#[test]
fn a_newcomer_asking_for_another_protocol_is_refused_and_leaves() {
    let mut w = World::new(2, 4);
    w.join(0, "a", ProtocolId::Tgdh, true);
    w.settle(&["a"]);
    w.join(1, "b", ProtocolId::Gdh, true);
    w.run_until("b leaves", |w| {
        w.members[1]
            .got
            .iter()
            .any(|e| matches!(e, SecureEvent::Left { .. }))
    });
    assert!(w.refusals("b").iter().any(|e| matches!(
        e,
        SecureError::ProtocolMismatch {
            group_uses: ProtocolId::Tgdh,
            asked: ProtocolId::Gdh
        }
    )));
    w.settle(&["a"]);
    assert!(w.members[1].sg.secure_view().is_none());
    let lefts = w.members[1]
        .got
        .iter()
        .filter(|e| matches!(e, SecureEvent::Left { .. }))
        .count();
    assert_eq!(lefts, 1, "told once: {:?}", w.members[1].got);
}

#[test]
fn a_view_with_an_untrusted_member_gets_no_key() {
    let mut w = World::new(2, 5);
    w.join(0, "a", ProtocolId::Str, true);
    w.join(1, "b", ProtocolId::Str, true);
    w.settle(&["a", "b"]);
    let before = w.fingerprint("a");
    let m = w.join(1, "mallory", ProtocolId::Str, false);
    w.run_until("a is told", |w| {
        w.members[0]
            .got
            .iter()
            .any(|e| matches!(e, SecureEvent::Untrusted { members, .. } if members[0].starts_with("mallory")))
    });
    assert!(
        w.members[0].sg.secure_view().is_none(),
        "no key in that view"
    );
    // Sends wait; once mallory is gone, a and b agree on a new key and the message goes out.
    w.send("a", ServiceType::Agreed, "not for mallory");
    w.members[m].sg.leave();
    w.pump();
    w.settle(&["a", "b"]);
    assert_ne!(w.fingerprint("a"), before);
    w.run_until("b has it", |w| !w.messages("b").is_empty());
    assert!(w.messages("mallory").is_empty());
}

#[test]
fn tampered_replayed_and_misplaced_data_are_refused() {
    let mut w = World::new(2, 6);
    w.join(0, "a", ProtocolId::Bd, true);
    let b = w.join(1, "b", ProtocolId::Bd, true);
    w.settle(&["a", "b"]);
    w.send("a", ServiceType::Agreed, "hello");
    w.run_until("b has it", |w| w.messages("b").len() == 1);
    let delivered = w.members[b]
        .raw
        .iter()
        .rev()
        .find(|e| matches!(e, ClientEvent::Message { .. }))
        .cloned()
        .unwrap();
    let with_payload = |p: Vec<u8>| match delivered.clone() {
        ClientEvent::Message {
            group,
            sender,
            service,
            view,
            transitional,
            ..
        } => ClientEvent::Message {
            group,
            sender,
            service,
            payload: p.into(),
            view,
            transitional,
        },
        _ => unreachable!(),
    };
    let ClientEvent::Message { payload, .. } = &delivered else {
        unreachable!()
    };
    let sg = &mut w.members[b].sg;
    // The same message again.
    sg.handle_event(delivered.clone());
    // Its number changed (the last byte of the counter): a number never seen, but the message
    // does not open under it.
    let mut renumbered = payload.to_vec();
    renumbered[2 + 24 + 7] ^= 1;
    sg.handle_event(with_payload(renumbered));
    // Its view changed (the last byte of the view's index).
    let mut moved = payload.to_vec();
    moved[2 + 23] ^= 1;
    sg.handle_event(with_payload(moved));
    // Garbage.
    sg.handle_event(with_payload(vec![1, 2, 3]));
    let mut got = Vec::new();
    while let Some(e) = sg.poll_event() {
        got.push(e);
    }
    let errors: Vec<_> = got
        .iter()
        .filter_map(|e| match e {
            SecureEvent::Refused { error, .. } => Some(error.clone()),
            SecureEvent::Message { .. } => panic!("delivered: {e:?}"),
            _ => None,
        })
        .collect();
    assert!(
        matches!(errors[0], SecureError::Replay { counter: 0 }),
        "{errors:?}"
    );
    assert!(matches!(errors[1], SecureError::OpenFailed), "{errors:?}");
    assert!(
        matches!(errors[2], SecureError::OtherView { .. }),
        "{errors:?}"
    );
    assert!(matches!(errors[3], SecureError::Malformed(_)), "{errors:?}");
    assert_eq!(errors.len(), 4);
}

/// Joins, leaves, partitions and heals, each landing at a random point of the runs the last ones
/// started (cascades), for every protocol; then the network heals and everyone settles.
/// Checked: every secure view's key is the same at all its members and no two secure views share
/// one (K1); a secure view is a view the daemons delivered, with the same members (K2); nothing
/// fails to open (K3); once stable, all members agree one key for the final view (K6).
#[test]
fn cascades_of_events_end_in_one_key_and_never_share_or_mix_keys() {
    use rand_chacha::rand_core::RngCore;
    for p in ALL {
        for seed in 0..12 {
            let mut w = World::new(3, 100 + seed);
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let mut next = 0;
            let mut present: Vec<String> = Vec::new();
            for _ in 0..3 {
                let d = (rng.next_u32() % 3) as usize;
                w.join(d, &format!("m{next}"), p, true);
                present.push(format!("m{next}"));
                next += 1;
            }
            for _ in 0..12 {
                match rng.next_u32() % 4 {
                    0 if present.len() < 6 => {
                        let d = (rng.next_u32() % 3) as usize;
                        w.join(d, &format!("m{next}"), p, true);
                        present.push(format!("m{next}"));
                        next += 1;
                    }
                    1 if present.len() > 1 => {
                        let k = (rng.next_u32() as usize) % present.len();
                        let n = present.remove(k);
                        let i = w.member(&n);
                        w.members[i].sg.leave();
                        w.pump();
                    }
                    2 => {
                        let alone = rng.next_u32() % 3 + 1;
                        let rest = (1..=3).filter(|d| *d != alone).collect();
                        w.net.links.split = Some(vec![vec![alone], rest]);
                    }
                    _ => w.net.links.split = None,
                }
                // Someone sends, whether or not it holds a key right now.
                let k = (rng.next_u32() as usize) % present.len();
                let services = [ServiceType::Fifo, ServiceType::Agreed, ServiceType::Safe];
                let service = services[(rng.next_u32() % 3) as usize];
                w.send(&present[k].clone(), service, "data");
                for _ in 0..rng.next_u32() % 300 {
                    w.pump();
                    w.net.step();
                }
            }
            w.net.links.split = None;
            let names: Vec<&str> = present.iter().map(|s| s.as_str()).collect();
            w.settle(&names);
            let fp = w.fingerprint(names[0]);
            for n in &names {
                assert_eq!(w.fingerprint(n), fp, "{p:?} seed {seed}: {n}");
            }
            check_keys(&w, &format!("{p:?} seed {seed}"));
        }
    }
}

/// K7: one script of membership events, each let settle before the next (joins, a leave, a
/// partition, its heal), gives the same secure views, ids and members, at every member with
/// every protocol; and each is a view the daemons delivered.
#[test]
fn the_five_protocols_give_the_same_secure_views_for_one_script() {
    type Views = Vec<(
        String,
        Vec<(conclave_wire::client::GroupViewId, Vec<String>)>,
    )>;
    let run = |p: ProtocolId| -> Views {
        let mut w = World::new(3, 7);
        w.join(0, "a", p, true);
        w.settle(&["a"]);
        w.join(1, "b", p, true);
        w.settle(&["a", "b"]);
        w.join(2, "c", p, true);
        w.settle(&["a", "b", "c"]);
        w.join(0, "d", p, true);
        w.settle(&["a", "b", "c", "d"]);
        let c = w.member("c");
        w.members[c].sg.leave();
        w.pump();
        w.settle(&["a", "b", "d"]);
        w.net.links.split = Some(vec![vec![1], vec![2, 3]]);
        w.settle(&["a", "d"]);
        w.settle(&["b"]);
        w.net.links.split = None;
        w.settle(&["a", "b", "d"]);
        w.join(2, "e", p, true);
        w.settle(&["a", "b", "d", "e"]);
        check_keys(&w, &format!("{p:?}"));
        w.members
            .iter()
            .map(|m| {
                let views = m
                    .got
                    .iter()
                    .filter_map(|e| match e {
                        SecureEvent::View(v) => Some((v.view, v.members.to_vec())),
                        _ => None,
                    })
                    .collect();
                (m.name.clone(), views)
            })
            .collect()
    };
    let first = run(ALL[0]);
    assert!(
        first.iter().all(|(_, v)| !v.is_empty()) && first[0].1.len() >= 6,
        "every member has secure views: {first:?}"
    );
    for p in &ALL[1..] {
        assert_eq!(run(*p), first, "{p:?} against {:?}", ALL[0]);
    }
}

/// K1, K2 and K3 over everything every member saw.
fn check_keys(w: &World, what: &str) {
    use std::collections::BTreeMap;
    let mut by_view: BTreeMap<_, Fingerprint> = BTreeMap::new();
    let mut by_key: BTreeMap<Fingerprint, _> = BTreeMap::new();
    for m in &w.members {
        let daemon_views: BTreeMap<_, Vec<String>> = m
            .raw
            .iter()
            .filter_map(|e| match e {
                ClientEvent::View { view, members, .. } => Some((*view, members.to_vec())),
                _ => None,
            })
            .collect();
        for e in &m.got {
            match e {
                SecureEvent::View(v) => {
                    assert_eq!(
                        daemon_views.get(&v.view),
                        Some(&v.members.to_vec()),
                        "{what}: {} has a secure view the daemons never gave it",
                        m.name
                    );
                    let fp = *by_view.entry(v.view).or_insert(v.fingerprint);
                    assert_eq!(fp, v.fingerprint, "{what}: two keys in view {:?}", v.view);
                    let view = *by_key.entry(v.fingerprint).or_insert(v.view);
                    assert_eq!(view, v.view, "{what}: one key in two views");
                }
                SecureEvent::Refused {
                    error: SecureError::OpenFailed | SecureError::Replay { .. },
                    ..
                } => panic!("{what}: {} refused data: {e:?}", m.name),
                _ => {}
            }
        }
    }
}
