//! Secure runs (`conclave sim --secure`): every client's groups are secure groups (the secure
//! layer of the client library, `conclave-secure`, over the client's session core), with
//! identities and a trust directory naming every client; in a third of the seeds the groups take
//! their keys from the daemons (Integrated VS) instead of agreeing them, and in half of those
//! the groups are EVS groups the daemons reseal late messages of (Optimized EVS); in a third of
//! the rest a key-graph server (an extra client, `ks`, on the first daemon) keys every group, and
//! it crashes and restarts from its saved state with the workload's disconnects and its daemon's
//! crashes. The history gains each client's secure
//! views (keys by fingerprint), the messages its secure layer took and delivered (named by a
//! digest, never the plaintext), what its key agreement took in and the layer's refusals, for
//! the checker's K properties.

use super::*;
use bytes::Bytes;
use conclave_crypto::{Identity, SigScheme};
use conclave_gka::{Directory, ProtocolId, SharedDirectory};
use conclave_history::ViewId;
use conclave_secure::{
    KeyServerConfig, KeyServerNode, KeyServerOutput, KeySource, SecureConfig, SecureGroup,
};
use conclave_wire::client::GroupViewId;
use conclave_wire::gcs::ServiceType;
use std::sync::{Arc, RwLock};

pub(super) struct Security {
    pub(super) protocol: ProtocolId,
    keys: KeySource,
    /// EVS groups resealed by the daemons (Optimized EVS), with keys from the daemons.
    evs: bool,
    identities: BTreeMap<String, Identity>,
    directory: SharedDirectory,
    seed: u64,
    /// Secure groups made so far, to seed each one's randomness differently.
    made: u64,
    /// The key server of key-graph runs.
    pub(super) server: Option<KeyServerSim>,
}

/// The private name of the key server's client in key-graph runs.
pub(super) const KEY_SERVER: &str = "ks";

/// The key server's client: a node per group while its session lasts, and each group's last
/// saved state, which outlives the session (as a file would).
pub(super) struct KeyServerSim {
    pub(super) ci: usize,
    identity: Identity,
    nodes: BTreeMap<String, KeyServerNode>,
    saved: BTreeMap<String, Vec<u8>>,
    /// Groups whose `key_server` record this session's incarnation has.
    recorded: BTreeSet<String>,
    /// Sessions the server started, to seed each one's randomness differently.
    sessions: u64,
}

impl Security {
    pub(super) fn new(
        clients: &[SimClient],
        protocol: ProtocolId,
        keys: KeySource,
        evs: bool,
        seed: u64,
    ) -> Security {
        let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x6b657973);
        let mut directory = Directory::new();
        let mut identities = BTreeMap::new();
        for c in clients {
            let id = Identity::generate(SigScheme::Ed25519, &mut rng).expect("an Ed25519 key");
            directory.insert(c.private.clone(), id.public());
            identities.insert(c.private.clone(), id);
        }
        let server = (keys == KeySource::KeyGraph).then(|| {
            let identity =
                Identity::generate(SigScheme::Ed25519, &mut rng).expect("an Ed25519 key");
            directory.insert(KEY_SERVER.to_owned(), identity.public());
            KeyServerSim {
                ci: clients
                    .iter()
                    .position(|c| c.private == KEY_SERVER)
                    .expect("key-graph runs have the key server's client"),
                identity,
                nodes: BTreeMap::new(),
                saved: BTreeMap::new(),
                recorded: BTreeSet::new(),
                sessions: 0,
            }
        });
        Security {
            protocol,
            keys,
            evs,
            identities,
            directory: Arc::new(RwLock::new(directory)),
            seed,
            made: 0,
            server,
        }
    }
}

/// A view's id as the daemons' recorders name it.
fn view_id(v: GroupViewId) -> ViewId {
    conclave_node::record::group_view_id(&name(v.ring.rep), v)
}

impl World {
    /// Client `ci`'s session had an event: its secure group takes it. What the client sends
    /// back, framed.
    pub(super) fn secure_event(&mut self, ci: usize, ev: ClientEvent) -> Vec<u8> {
        if self.is_key_server(ci) {
            return self.key_server_event(ci, ev);
        }
        let Some(group) = ev.group().map(str::to_owned) else {
            return Vec::new();
        };
        let left = matches!(ev, ClientEvent::Left { .. });
        let Some(g) = self.clients[ci].secure.get_mut(&group) else {
            return Vec::new();
        };
        g.handle_event(ev);
        let out = self.secure_pump(ci, &group);
        if left {
            self.clients[ci].secure.remove(&group);
        }
        out
    }

    pub(super) fn secure_join(&mut self, ci: usize, group: String) {
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        let c = &mut self.clients[ci];
        let Some(me) = c.core.name().map(str::to_owned) else {
            return;
        };
        if c.secure.contains_key(&group) || c.core.groups().any(|g| g == group) {
            return;
        }
        sec.made += 1;
        let rng = ChaCha20Rng::seed_from_u64(sec.seed ^ (sec.made << 20) ^ ci as u64);
        let cfg = SecureConfig {
            keys: sec.keys,
            protocol: sec.protocol,
            evs: sec.evs,
            key_server: sec
                .server
                .as_ref()
                .map(|_| format!("{KEY_SERVER}#{}", name(1))),
            ..SecureConfig::default()
        };
        let g = SecureGroup::join(
            &group,
            &me,
            sec.identities[&c.private].clone(),
            sec.directory.clone(),
            cfg,
            Box::new(rng),
        );
        // The keys are asked for before the join goes, so that the first view has its key.
        let asked = match g.key_source() {
            KeySource::Daemons => c.core.keys(&group).ok(),
            KeySource::Agreement | KeySource::KeyGraph => None,
        };
        c.secure.insert(group.clone(), g);
        if let (Some(bytes), Some(sid)) = (asked, c.session) {
            let now = Time::from_micros(self.now);
            self.nodes[c.daemon].handle_session_shared(now, sid, &bytes::Bytes::from(bytes));
        }
        self.secure_send_commands(ci, &group);
    }

    pub(super) fn secure_leave(&mut self, ci: usize, group: &str) {
        if let Some(g) = self.clients[ci].secure.get_mut(group) {
            g.leave();
            self.secure_send_commands(ci, group);
        }
    }

    pub(super) fn secure_send(&mut self, ci: usize, group: &str, s: ServiceType, payload: Bytes) {
        let c = &mut self.clients[ci];
        if let Some(g) = c.secure.get_mut(group) {
            let msg = conclave_node::record::message_name(&c.name, group, &payload);
            // A full queue refuses: the message was never sent.
            if g.send(s, payload).is_ok() {
                let (p, inc) = (c.name.clone(), c.inc.unwrap_or(0));
                self.history.push(Record {
                    t: self.now,
                    p,
                    inc,
                    ev: Event::SecureSend {
                        group: group.to_owned(),
                        msg,
                    },
                });
                self.secure_send_commands(ci, group);
            }
        }
    }

    fn secure_send_commands(&mut self, ci: usize, group: &str) {
        let bytes = self.secure_pump(ci, group);
        let c = &self.clients[ci];
        if let (Some(sid), false) = (c.session, bytes.is_empty()) {
            let now = Time::from_micros(self.now);
            self.nodes[c.daemon].handle_session_shared(now, sid, &bytes::Bytes::from(bytes));
        }
    }

    /// The group's commands, framed by the session core; its events, into the history.
    fn secure_pump(&mut self, ci: usize, group: &str) -> Vec<u8> {
        let now = self.now;
        let c = &mut self.clients[ci];
        let Some(g) = c.secure.get_mut(group) else {
            return Vec::new();
        };
        while let Some(cmd) = g.poll_command() {
            c.pending.push_back(cmd);
        }
        let (p, inc) = (c.name.clone(), c.inc.unwrap_or(0));
        let mut records = Vec::new();
        while let Some(c) = g.poll_consumed() {
            records.push(conclave_node::record::consumed(group, &c, &view_id));
        }
        while let Some(e) = g.poll_event() {
            records.extend(conclave_node::record::secure_event(&e, &view_id));
        }
        for ev in records {
            self.history.push(Record {
                t: now,
                p: p.clone(),
                inc,
                ev,
            });
        }
        self.send_pending(ci)
    }

    /// The client's waiting commands that the window has room for, framed, in order (as the
    /// client library's sender waits for room).
    pub(super) fn send_pending(&mut self, ci: usize) -> Vec<u8> {
        let c = &mut self.clients[ci];
        let mut out = Vec::new();
        while let Some(cmd) = c.pending.front() {
            if let ClientCommand::Multicast {
                groups, payload, ..
            } = cmd
            {
                if c.core.window_free() < c.core.places(payload.len(), groups.len()) {
                    break;
                }
            }
            let cmd = c.pending.pop_front().expect("peeked");
            // The session core refuses what the daemon would (a group left): the command is
            // dropped, as a client library reports it to the application.
            if let Ok(b) = c.core.command(cmd) {
                out.extend(b);
            }
        }
        out
    }
}

impl World {
    pub(super) fn is_key_server(&self, ci: usize) -> bool {
        self.security
            .as_ref()
            .and_then(|s| s.server.as_ref())
            .is_some_and(|k| k.ci == ci)
    }

    /// The key server's session had an event: the group's node takes it (the nodes are made once
    /// the session has its name, from the saved states if any). What the server sends back.
    fn key_server_event(&mut self, ci: usize, ev: ClientEvent) -> Vec<u8> {
        self.key_server_start(ci);
        let now_ms = self.now / 1000;
        let group = ev.group().map(str::to_owned);
        let is_view = matches!(ev, ClientEvent::View { .. });
        if let (Some(group), Some(k)) = (group, self.key_server_mut()) {
            if let Some(node) = k.nodes.get_mut(&group) {
                node.handle_event(ev, now_ms);
                if is_view && k.recorded.insert(group.clone()) {
                    let c = &self.clients[ci];
                    let (p, inc) = (c.name.clone(), c.inc.unwrap_or(0));
                    self.push(&p, inc, Event::KeyServer { group });
                }
            }
        }
        self.key_server_pump(ci)
    }

    fn key_server_mut(&mut self) -> Option<&mut KeyServerSim> {
        self.security.as_mut()?.server.as_mut()
    }

    /// Makes the server's nodes for every group once its session has a name.
    pub(super) fn key_server_start(&mut self, ci: usize) {
        let groups = self.groups;
        let Some(me) = self.clients[ci].core.name().map(str::to_owned) else {
            return;
        };
        let Some(sec) = self.security.as_mut() else {
            return;
        };
        let (directory, seed) = (sec.directory.clone(), sec.seed);
        let Some(k) = sec.server.as_mut() else {
            return;
        };
        if !k.nodes.is_empty() {
            return;
        }
        k.sessions += 1;
        k.recorded.clear();
        for g in 0..groups {
            let group = format!("g{g}");
            let rng = ChaCha20Rng::seed_from_u64(seed ^ 0x6b73 ^ (k.sessions << 24) ^ g as u64);
            let cfg = KeyServerConfig::new(&group, &me);
            let node = match k.saved.get(&group) {
                Some(state) => KeyServerNode::restore(
                    cfg,
                    state,
                    k.identity.clone(),
                    directory.clone(),
                    Box::new(rng),
                ),
                None => {
                    KeyServerNode::new(cfg, k.identity.clone(), directory.clone(), Box::new(rng))
                }
            }
            .expect("the key server's state is its own");
            k.nodes.insert(group, node);
        }
    }

    /// The server's commands, queued for the window; its saves, kept.
    pub(super) fn key_server_pump(&mut self, ci: usize) -> Vec<u8> {
        let Some(sec) = self.security.as_mut() else {
            return Vec::new();
        };
        let Some(k) = sec.server.as_mut() else {
            return Vec::new();
        };
        let c = &mut self.clients[ci];
        for (group, node) in k.nodes.iter_mut() {
            while let Some(o) = node.poll_output() {
                match o {
                    KeyServerOutput::Save(state) => {
                        k.saved.insert(group.clone(), state);
                    }
                    KeyServerOutput::Command(cmd) => c.pending.push_back(cmd),
                }
            }
            while node.poll_event().is_some() {}
        }
        self.send_pending(ci)
    }

    /// When the key server has something to do without an event (a rekey whose batch or
    /// registration wait ends), in microseconds.
    pub(super) fn key_server_deadline(&self) -> Option<u64> {
        let k = self.security.as_ref()?.server.as_ref()?;
        if !self.clients[k.ci].connected() {
            return None;
        }
        k.nodes
            .values()
            .filter_map(KeyServerNode::next_deadline)
            .min()
            .map(|ms| (ms * 1000).max(self.now))
    }

    /// Time passed for the key server: what it sends, to its daemon.
    pub(super) fn key_server_tick(&mut self) {
        let now_ms = self.now / 1000;
        let Some(ci) = self
            .security
            .as_ref()
            .and_then(|s| s.server.as_ref())
            .map(|k| k.ci)
        else {
            return;
        };
        if let Some(k) = self.key_server_mut() {
            for node in k.nodes.values_mut() {
                node.tick(now_ms);
            }
        }
        let bytes = self.key_server_pump(ci);
        let c = &self.clients[ci];
        if let (Some(sid), false) = (c.session, bytes.is_empty()) {
            let now = Time::from_micros(self.now);
            self.nodes[c.daemon].handle_session_shared(now, sid, &bytes::Bytes::from(bytes));
        }
    }

    /// The key server's session ended: its nodes go (their state stays saved).
    pub(super) fn key_server_gone(&mut self, ci: usize) {
        if let Some(k) = self.key_server_mut().filter(|k| k.ci == ci) {
            k.nodes.clear();
        }
    }
}
