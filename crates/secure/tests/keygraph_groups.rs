//! Key-graph groups over the daemons' own core: a `KeyServerNode` and members' `SecureGroup`s in
//! the key-graph mode, each composed with a client of a `conclave_gcs::Daemon` on the core's
//! test network. The daemons deliver real views and messages; the server registers, rekeys and
//! binds views to keys as it does over real daemons.

use bytes::Bytes;
use conclave_crypto::{Fingerprint, Identity, SigScheme};
use conclave_gcs::testnet::{Hop, TestNet};
use conclave_gcs::{ClientEvent, ClientId, Daemon, DaemonConfig, LocalEvent, Time};
use conclave_gka::{Directory, SharedDirectory};
use conclave_secure::keyserver::KeyServerOutput;
use conclave_secure::{
    KeyGraphError, KeyServerConfig, KeyServerEvent, KeyServerNode, KeySource, SecureConfig,
    SecureError, SecureEvent, SecureGroup, ViewKey,
};
use conclave_wire::client::ClientCommand;
use conclave_wire::gcs::ServiceType;
use conclave_wire::keyserver::ServiceMsg;
use conclave_wire::secure::SecureMessage;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;
use std::sync::{Arc, RwLock};

const SERVER: &str = "ks#d1";

enum Role {
    Member(Box<SecureGroup>),
    Server(Box<KeyServerNode>),
}

struct Client {
    daemon: usize,
    id: ClientId,
    name: String,
    role: Role,
    got: Vec<SecureEvent>,
    raw: Vec<ClientEvent>,
    gone: bool,
}

struct World {
    net: TestNet<Daemon, Hop>,
    clients: Vec<Client>,
    directory: SharedDirectory,
    server_identity: Identity,
    /// The server's last saved state, and every service message it sent.
    saved: Option<Vec<u8>>,
    server_sent: Vec<Vec<u8>>,
    server_events: Vec<KeyServerEvent>,
    rng: ChaCha20Rng,
}

impl World {
    fn new(daemons: u32, seed: u64) -> World {
        let nodes = (1..=daemons)
            .map(|id| Daemon::new(DaemonConfig::default(), id, 0, Time::ZERO))
            .collect();
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let server_identity = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
        let directory: SharedDirectory = Arc::new(RwLock::new(Directory::new()));
        directory
            .write()
            .unwrap()
            .insert(SERVER.to_owned(), server_identity.public());
        let mut w = World {
            net: TestNet::new(nodes, Hop::default()),
            clients: Vec::new(),
            directory,
            server_identity,
            saved: None,
            server_sent: Vec::new(),
            server_events: Vec::new(),
            rng,
        };
        assert!(w
            .net
            .run_until(1_000_000, |n| n.peers.iter().all(|d| d.ready())));
        w
    }

    fn now_ms(&self) -> u64 {
        self.net.now().as_micros() / 1000
    }

    fn connect(&mut self, d: usize, name: &str, role: Role) -> usize {
        let id = self.clients.len() as ClientId;
        self.net.peers[d].connect(id, name).unwrap();
        self.clients.push(Client {
            daemon: d,
            id,
            name: name.to_owned(),
            role,
            got: Vec::new(),
            raw: Vec::new(),
            gone: false,
        });
        self.pump();
        self.clients.len() - 1
    }

    fn start_server(&mut self, batch_ms: u64) -> usize {
        let mut cfg = KeyServerConfig::new("g", SERVER);
        cfg.batch_ms = batch_ms;
        let rng = Box::new(ChaCha20Rng::seed_from_u64(self.clients.len() as u64 + 77));
        let node = match self.saved.clone() {
            Some(state) => KeyServerNode::restore(
                cfg,
                &state,
                self.server_identity.clone(),
                self.directory.clone(),
                rng,
            )
            .unwrap(),
            None => KeyServerNode::new(
                cfg,
                self.server_identity.clone(),
                self.directory.clone(),
                rng,
            )
            .unwrap(),
        };
        self.connect(0, SERVER, Role::Server(Box::new(node)))
    }

    /// `name` on daemon `d` joins group "g" with keys from the server; in the directory if
    /// `trusted`.
    fn join(&mut self, d: usize, name: &str, trusted: bool) -> usize {
        let name = format!("{name}#d{}", d + 1);
        let identity = Identity::generate(SigScheme::Ed25519, &mut self.rng).unwrap();
        if trusted {
            self.directory
                .write()
                .unwrap()
                .insert(name.clone(), identity.public());
        }
        let cfg = SecureConfig {
            keys: KeySource::KeyGraph,
            key_server: Some(SERVER.to_owned()),
            ..SecureConfig::default()
        };
        let rng = Box::new(ChaCha20Rng::seed_from_u64(self.clients.len() as u64 + 1000));
        let sg = SecureGroup::join("g", &name, identity, self.directory.clone(), cfg, rng);
        self.connect(d, &name, Role::Member(Box::new(sg)))
    }

    fn client(&self, name: &str) -> usize {
        self.clients
            .iter()
            .rposition(|c| c.name.starts_with(&format!("{name}#")))
            .unwrap()
    }

    fn sg(&self, name: &str) -> &SecureGroup {
        match &self.clients[self.client(name)].role {
            Role::Member(sg) => sg,
            Role::Server(_) => panic!("{name} is the server"),
        }
    }

    fn sg_mut(&mut self, name: &str) -> &mut SecureGroup {
        let i = self.client(name);
        match &mut self.clients[i].role {
            Role::Member(sg) => sg,
            Role::Server(_) => panic!("{name} is the server"),
        }
    }

    /// The client's daemon loses it (a crash of the process).
    fn crash(&mut self, i: usize) {
        let now = self.net.now();
        let (d, id) = (self.clients[i].daemon, self.clients[i].id);
        self.net.peers[d].disconnect(now, id).unwrap();
        self.clients[i].gone = true;
        self.pump();
    }

    /// Hands commands to the daemons and events to the clients until nothing moves.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            let now_ms = self.now_ms();
            for c in &mut self.clients {
                if c.gone {
                    continue;
                }
                let mut cmds = Vec::new();
                match &mut c.role {
                    Role::Member(sg) => {
                        while let Some(cmd) = sg.poll_command() {
                            cmds.push(cmd);
                        }
                    }
                    Role::Server(node) => {
                        node.tick(now_ms);
                        while let Some(o) = node.poll_output() {
                            match o {
                                KeyServerOutput::Save(s) => self.saved = Some(s),
                                KeyServerOutput::Command(cmd) => {
                                    if let ClientCommand::Multicast { payload, .. } = &cmd {
                                        self.server_sent.push(payload.to_vec());
                                    }
                                    cmds.push(cmd);
                                }
                            }
                        }
                        while let Some(e) = node.poll_event() {
                            self.server_events.push(e);
                        }
                    }
                }
                for cmd in cmds {
                    moved = true;
                    let now = self.net.now();
                    let _ = self.net.peers[c.daemon].handle_client(now, c.id, cmd);
                }
            }
            for d in 0..self.net.peers.len() {
                self.net.send(d);
                while let Some((id, ev)) =
                    self.net.peers[d].poll_event().map(LocalEvent::into_event)
                {
                    moved = true;
                    let c = &mut self.clients[id as usize];
                    if c.gone {
                        continue;
                    }
                    c.raw.push(ev.clone());
                    match &mut c.role {
                        Role::Member(sg) => {
                            sg.handle_event(ev);
                            while let Some(e) = sg.poll_event() {
                                c.got.push(e);
                            }
                        }
                        Role::Server(node) => node.handle_event(ev, now_ms),
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

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
        for c in &self.clients {
            eprintln!("{} (gone: {}):", c.name, c.gone);
            for e in c
                .got
                .iter()
                .filter(|e| !matches!(e, SecureEvent::Message { .. }))
            {
                eprintln!("    {e:?}");
            }
        }
        for e in &self.server_events {
            eprintln!("server: {e:?}");
        }
        panic!("never got there: {what}");
    }

    /// Runs until every listed member's secure view has exactly the listed members (and the
    /// server, if `with_server`).
    fn settle(&mut self, names: &[&str], with_server: bool) {
        let idx: Vec<usize> = names.iter().map(|n| self.client(n)).collect();
        let mut want: Vec<String> = idx.iter().map(|i| self.clients[*i].name.clone()).collect();
        if with_server {
            want.push(SERVER.to_owned());
        }
        want.sort();
        self.run_until(&format!("a secure view of {names:?}"), |w| {
            idx.iter().all(|i| match &w.clients[*i].role {
                Role::Member(sg) => sg.secure_view().is_some_and(|v| {
                    let mut got = v.members.to_vec();
                    got.sort();
                    got == want
                }),
                Role::Server(_) => false,
            })
        });
    }

    fn fingerprint(&self, name: &str) -> Fingerprint {
        self.sg(name).secure_view().unwrap().fingerprint
    }

    fn send(&mut self, name: &str, text: &str) {
        self.sg_mut(name)
            .send(ServiceType::Agreed, Bytes::copy_from_slice(text.as_bytes()))
            .unwrap();
        self.pump();
    }

    fn messages(&self, name: &str) -> Vec<String> {
        self.clients[self.client(name)]
            .got
            .iter()
            .filter_map(|e| match e {
                SecureEvent::Message { payload, .. } => {
                    Some(String::from_utf8_lossy(payload).into_owned())
                }
                _ => None,
            })
            .collect()
    }

    fn refusals(&self, name: &str) -> Vec<SecureError> {
        self.clients[self.client(name)]
            .got
            .iter()
            .filter_map(|e| match e {
                SecureEvent::Refused { error, .. } => Some(error.clone()),
                _ => None,
            })
            .collect()
    }

    /// Data of the group as the daemons delivered it to `name` (sender, payload).
    fn sealed_at(&self, name: &str) -> Vec<(String, Bytes)> {
        self.clients[self.client(name)]
            .raw
            .iter()
            .filter_map(|e| match e {
                ClientEvent::Message {
                    sender, payload, ..
                } if matches!(
                    SecureMessage::decode(payload),
                    Ok(SecureMessage::Data { .. })
                ) =>
                {
                    Some((sender.clone(), payload.clone()))
                }
                _ => None,
            })
            .collect()
    }

    fn rekeys(&self) -> usize {
        self.server_events
            .iter()
            .filter(|e| matches!(e, KeyServerEvent::Rekeyed(_)))
            .count()
    }
}

fn opens(key: &ViewKey, sealed: &[(String, Bytes)]) -> usize {
    sealed
        .iter()
        .filter(|(s, p)| key.open(s, ServiceType::Agreed, p).is_ok())
        .count()
}

#[test]
fn members_get_a_new_key_on_every_join_and_leave_from_the_server() {
    let mut w = World::new(3, 1);
    w.start_server(0);
    w.join(0, "a", true);
    w.settle(&["a"], true);
    w.join(1, "b", true);
    w.join(2, "c", true);
    w.settle(&["a", "b", "c"], true);
    let fp = w.fingerprint("a");
    assert_eq!(w.fingerprint("b"), fp);
    assert_eq!(w.fingerprint("c"), fp);
    w.send("a", "from a");
    w.send("c", "from c");
    w.run_until("both messages everywhere", |w| {
        ["a", "b", "c"].iter().all(|n| w.messages(n).len() == 2)
    });
    for n in ["a", "b", "c"] {
        assert!(w.refusals(n).is_empty(), "{n}: {:?}", w.refusals(n));
    }
    // The daemons carried no plaintext.
    for c in &w.clients {
        for ev in &c.raw {
            if let ClientEvent::Message { payload, .. } = ev {
                assert!(!payload.windows(6).any(|x| x == b"from a" || x == b"from c"));
            }
        }
    }
    let c_key = w.sg("c").view_key().unwrap();

    // c leaves: a and b get a key c cannot compute, and c opens nothing sent after.
    w.sg_mut("c").leave();
    w.pump();
    w.settle(&["a", "b"], true);
    assert_ne!(w.fingerprint("a"), fp);
    assert_eq!(w.fingerprint("a"), w.fingerprint("b"));
    w.send("a", "after c left");
    w.run_until("the message at b", |w| w.messages("b").len() == 3);
    let after_leave = w.sealed_at("b");
    assert_eq!(
        opens(&c_key, &after_leave),
        2,
        "only what c saw before it left"
    );

    // d joins: a new key again, and d opens nothing sent before it joined.
    let before_join = w.sealed_at("a");
    w.join(1, "d", true);
    w.settle(&["a", "b", "d"], true);
    let d_key = w.sg("d").view_key().unwrap();
    assert_eq!(opens(&d_key, &before_join), 0);
    w.send("d", "from d");
    w.run_until("d's message at a", |w| w.messages("a").len() == 4);
    assert!(w.rekeys() >= 4, "a rekey for each change: {}", w.rekeys());
}

#[test]
fn a_server_crash_does_not_stop_the_group_and_the_restarted_server_goes_on() {
    let mut w = World::new(2, 2);
    let ks = w.start_server(0);
    w.join(0, "a", true);
    w.join(1, "b", true);
    w.join(1, "c", true);
    w.settle(&["a", "b", "c"], true);
    let fp = w.fingerprint("a");
    let epoch = w.sg("a").secure_view().unwrap().epoch;

    // The server crashes: the holders are the same, so the members keep their group key (the
    // epoch) and talk; the new view still has a key of its own.
    w.crash(ks);
    w.settle(&["a", "b", "c"], false);
    let down = w.fingerprint("b");
    assert_ne!(down, fp);
    assert_eq!(w.fingerprint("a"), down);
    assert_eq!(w.fingerprint("c"), down);
    assert_eq!(w.sg("b").secure_view().unwrap().epoch, epoch);
    w.send("b", "while the server is down");
    w.run_until("the message at a and c", |w| {
        w.messages("a").len() == 1 && w.messages("c").len() == 1
    });

    // Restarted from its saved state: the members keep the same key, nobody registers again.
    let registrations = |w: &World| {
        w.server_events
            .iter()
            .filter(|e| matches!(e, KeyServerEvent::Registered { .. }))
            .count()
    };
    let before = registrations(&w);
    w.start_server(0);
    w.settle(&["a", "b", "c"], true);
    assert_eq!(w.fingerprint("c"), w.fingerprint("a"));
    assert!(![fp, down].contains(&w.fingerprint("c")));
    assert_eq!(w.sg("c").secure_view().unwrap().epoch, epoch);
    assert_eq!(registrations(&w), before);

    // And it rekeys from its saved tree: c's leave gives a and b a new key of the next epoch.
    w.sg_mut("c").leave();
    w.pump();
    w.settle(&["a", "b"], true);
    assert_ne!(w.fingerprint("a"), fp);
    assert_eq!(w.fingerprint("a"), w.fingerprint("b"));
    assert!(w.sg("a").secure_view().unwrap().epoch > epoch);
    w.send("a", "after the restart");
    w.run_until("the message at b", |w| w.messages("b").len() == 2);
    for n in ["a", "b"] {
        let odd: Vec<_> = w
            .refusals(n)
            .into_iter()
            .filter(|e| e.kind() != "stale_rekey")
            .collect();
        assert!(odd.is_empty(), "{n}: {odd:?}");
    }
}

#[test]
fn batching_folds_a_views_changes_into_one_rekey() {
    let mut w = World::new(2, 3);
    w.start_server(200);
    w.join(0, "a", true);
    w.settle(&["a"], true);
    let before = w.rekeys();
    // Three joins inside one batch interval: one rekey covers them all.
    w.join(1, "b", true);
    w.join(1, "c", true);
    w.join(0, "d", true);
    w.settle(&["a", "b", "c", "d"], true);
    let batches: Vec<_> = w
        .server_events
        .iter()
        .filter_map(|e| match e {
            KeyServerEvent::Rekeyed(s) => Some(s.joins),
            _ => None,
        })
        .skip(before)
        .collect();
    assert!(
        batches.len() < 3 && batches.iter().sum::<u32>() == 3,
        "three joins in {batches:?}"
    );
}

#[test]
fn unknown_identities_forgeries_and_replays_are_refused_and_counted() {
    let mut w = World::new(2, 4);
    w.start_server(0);
    w.join(0, "a", true);
    w.join(1, "b", true);
    w.settle(&["a", "b"], true);

    // A client the directory does not know: its registration is refused, the view is keyed
    // without it, and it is named as holding no key.
    w.join(1, "x", false);
    w.run_until("x's registration refused", |w| {
        w.server_events.iter().any(|e| {
            matches!(
                e,
                KeyServerEvent::Refused {
                    error: KeyGraphError::Register(
                        conclave_keygraph::RegisterError::UnknownIdentity(_)
                    ),
                    ..
                }
            )
        })
    });
    w.run_until("the view announced without x", |w| {
        w.server_events.iter().any(|e| {
            matches!(e, KeyServerEvent::Announced { excluded, .. } if excluded.len() == 1 && excluded[0].starts_with("x#"))
        })
    });
    w.settle(&["a", "b"], true);
    assert!(w.sg("x").secure_view().is_none());

    // x replays, under its own name, the server's service messages: nobody takes them.
    let replays: Vec<Vec<u8>> = w.server_sent.clone();
    let x = w.client("x");
    let (d, id) = (w.clients[x].daemon, w.clients[x].id);
    for p in replays {
        let now = w.net.now();
        let _ = w.net.peers[d].handle_client(
            now,
            id,
            ClientCommand::Multicast {
                service: ServiceType::Agreed,
                groups: vec!["g".into()],
                payload: p.into(),
            },
        );
    }
    w.pump();
    w.run_until("a refuses them", |w| {
        w.refusals("a")
            .iter()
            .any(|e| matches!(e, SecureError::KeyGraph(KeyGraphError::NotServer(_))))
    });

    // The server replays an old rekey (as from a saved state): refused as stale, keys unchanged.
    // (The rekey of the epoch just applied is let pass: with the key-oriented strategy its
    // siblings, for other members, come after the one a member applies.)
    w.join(0, "c", true);
    w.settle(&["a", "b", "c"], true);
    let fp = w.fingerprint("a");
    let old = w
        .server_sent
        .iter()
        .find(|p| match SecureMessage::decode(p) {
            Ok(SecureMessage::KeyGraph(b)) => {
                matches!(ServiceMsg::decode(b), Ok(ServiceMsg::Rekey(_)))
            }
            _ => false,
        })
        .cloned()
        .unwrap();
    let ks = w.client("ks");
    let (d, id) = (w.clients[ks].daemon, w.clients[ks].id);
    let now = w.net.now();
    w.net.peers[d]
        .handle_client(
            now,
            id,
            ClientCommand::Multicast {
                service: ServiceType::Agreed,
                groups: vec!["g".into()],
                payload: old.into(),
            },
        )
        .unwrap();
    w.pump();
    w.run_until("a refuses the stale rekey", |w| {
        w.refusals("a").iter().any(|e| e.kind() == "stale_rekey")
    });
    assert_eq!(w.fingerprint("a"), fp);
    w.send("a", "still keyed");
    w.run_until("b and c have it", |w| {
        w.messages("b").len() == 1 && w.messages("c").len() == 1
    });
    assert!(w.messages("x").is_empty());
}

#[test]
fn a_new_process_under_a_registered_name_gets_the_views_key_late() {
    let mut w = World::new(2, 5);
    let ks = w.start_server(0);
    w.join(0, "a", true);
    w.join(1, "b", true);
    w.settle(&["a", "b"], true);

    // While the server is down, b's process is replaced by a new one under the same name.
    w.crash(ks);
    let b = w.client("b");
    w.crash(b);
    let identity = Identity::generate(SigScheme::Ed25519, &mut w.rng).unwrap();
    w.directory
        .write()
        .unwrap()
        .insert("b#d2".into(), identity.public());
    let cfg = SecureConfig {
        keys: KeySource::KeyGraph,
        key_server: Some(SERVER.to_owned()),
        ..SecureConfig::default()
    };
    let rng = Box::new(ChaCha20Rng::seed_from_u64(99));
    let sg = SecureGroup::join("g", "b#d2", identity, w.directory.clone(), cfg, rng);
    w.connect(1, "b#d2", Role::Member(Box::new(sg)));

    // The restarted server trusts its saved registrations in its first view: the new b lacks
    // the key it is counted a holder of, knocks, registers again and gets that view's key.
    w.start_server(0);
    w.settle(&["a", "b"], true);
    assert_eq!(w.fingerprint("a"), w.fingerprint("b"));
    assert!(w.server_events.iter().any(|e| matches!(
        e,
        KeyServerEvent::Registered { member } if member == "b#d2"
    )));
    let late = w
        .server_sent
        .iter()
        .any(|p| match SecureMessage::decode(p) {
            Ok(SecureMessage::KeyGraph(b)) => {
                matches!(ServiceMsg::decode(b), Ok(ServiceMsg::LateKey(_)))
            }
            _ => false,
        });
    assert!(late, "the new b got its key late, in the view");
    w.send("b", "from the new b");
    w.run_until("a has it", |w| w.messages("a").len() == 1);
    assert!(w.refusals("a").iter().all(|e| e.kind() == "stale_rekey"));
}
