//! The key-graph server as a client of the daemons (paper 001 §2-§4 with §5's batch rekeying;
//! docs/keygraph.md, "Running the server"): a pure state machine over the client session, like
//! [`crate::SecureGroup`]. It joins its group, registers every member of each view it holds no
//! keys for (the registration exchange, `conclave_keygraph::register`), folds the view's joins
//! and leaves into one rekey of its key graph, multicasts the rekey messages (agreed service,
//! batch-signed), and then binds the view to the new group key with a signed view key. Time and
//! randomness are inputs; saving the state is an output the shell must carry out before it sends
//! what follows it.
//!
//! Departures from paper 001, and why:
//! - members are not registered by a request of their own but by the views the daemons deliver:
//!   a member joins the daemons' group and the server invites it, so the group's membership has
//!   one source, and a member that leaves (or crashes) is rekeyed out without saying so;
//! - a rekey waits until every invited member of the view answered (or `register_timeout_ms`
//!   passed) and `batch_ms` after the first change, so a view's changes go in one batch;
//! - the tree is not compacted (a moved member would need a signed notice of its new place,
//!   which the service does not send yet).
//!
//! What a member that is registered but lacks its keys does (it missed a rekey, or it is a new
//! process under an old name): it knocks, and the server registers it again. Its keys then count
//! from the next view: the server binds one key to a view.

use crate::KeyGraphError;
use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{CryptoRng, GroupKey, Identity};
use conclave_gka::SharedDirectory;
use conclave_keygraph::{
    GraphKind, RegisterError, Registrar, RekeyStats, Server, ServerConfig, Strategy, UserId,
};
use conclave_wire::client::{ClientCommand, ClientEvent, GroupViewId};
use conclave_wire::gcs::{ServiceType, MAX_NAME_BYTES};
use conclave_wire::keyserver::{Admission, LateKeyMsg, RegisterMsg, ServiceMsg, ViewKeyMsg};
use conclave_wire::secure::SecureMessage;
use conclave_wire::{Reader, Writer};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How the server runs; the defaults suit most groups.
#[derive(Clone, Debug)]
pub struct KeyServerConfig {
    pub group: String,
    /// The name the daemon gave the server's session, as views list it (members name their
    /// server by it, and the directory holds its identity under it).
    pub name: String,
    /// The key tree's degree (paper 001 finds 4 best).
    pub degree: u32,
    pub strategy: Strategy,
    pub aead: AeadAlg,
    /// Milliseconds from a view's first change to its rekey, to fold more changes into one
    /// batch; 0 rekeys as soon as the view's members are registered.
    pub batch_ms: u64,
    /// How long the server waits for the members it invited before it rekeys without them.
    pub register_timeout_ms: u64,
}

impl KeyServerConfig {
    pub fn new(group: &str, name: &str) -> KeyServerConfig {
        KeyServerConfig {
            group: group.to_owned(),
            name: name.to_owned(),
            degree: 4,
            strategy: Strategy::Key,
            aead: AeadAlg::Aes256Gcm,
            batch_ms: 0,
            register_timeout_ms: 2_000,
        }
    }
}

/// What the shell must do, in order.
#[derive(Debug)]
pub enum KeyServerOutput {
    /// Write this sealed state durably (replacing the last) before carrying out what follows.
    Save(Vec<u8>),
    Command(ClientCommand),
}

/// What the server did, for logs and metrics.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyServerEvent {
    Registered {
        member: String,
    },
    /// A member left the view, or registered again: its keys are rekeyed out.
    Removed {
        member: String,
    },
    Rekeyed(RekeyStats),
    /// The view's members seal under the group key of `epoch`; `excluded` hold no keys.
    Announced {
        view: GroupViewId,
        epoch: u64,
        excluded: Vec<String>,
    },
    Refused {
        sender: String,
        error: KeyGraphError,
    },
}

struct CurrentView {
    id: GroupViewId,
    members: Vec<String>,
    /// Invited and not yet answered (nor refused).
    awaiting: BTreeSet<String>,
    /// When the server stops waiting for `awaiting`.
    deadline: u64,
    /// When the view's changes may be rekeyed (`batch_ms` after the first).
    batch_at: Option<u64>,
    announced: bool,
    /// The group key the view is bound to once announced, and its epoch: what a member
    /// registered later in the view gets ([`LateKeyMsg`]).
    bound: Option<(u64, GroupKey)>,
    /// The view's members the announcement named as holding no key.
    excluded: Vec<String>,
    knocked: BTreeSet<String>,
}

/// The key server of one group (see the module doc).
pub struct KeyServerNode {
    cfg: KeyServerConfig,
    server: Server,
    registrar: Registrar,
    identity: Identity,
    directory: SharedDirectory,
    rng: Box<dyn CryptoRng + Send>,
    /// Registered members and their ids in the graph.
    names: BTreeMap<String, u64>,
    next_user: u64,
    view: Option<CurrentView>,
    out: VecDeque<KeyServerOutput>,
    events: VecDeque<KeyServerEvent>,
}

/// Members a saved annex may name (the graph's own limit is higher; names cost 65 bytes each).
const MAX_SAVED_NAMES: usize = 1 << 24;

impl KeyServerNode {
    /// A new server with an empty key graph; its first command joins the group.
    pub fn new(
        cfg: KeyServerConfig,
        identity: Identity,
        directory: SharedDirectory,
        rng: Box<dyn CryptoRng + Send>,
    ) -> Result<KeyServerNode, KeyGraphError> {
        let mut scfg = ServerConfig::new(&cfg.group, GraphKind::Tree { degree: cfg.degree });
        scfg.strategy = cfg.strategy;
        scfg.aead = cfg.aead;
        scfg.compact = false;
        let server = Server::new(scfg, Some(identity.clone())).map_err(KeyGraphError::Server)?;
        Self::with_server(cfg, server, identity, directory, rng, BTreeMap::new(), 0)
    }

    /// A server from the state it saved (its identity must be the one that saved it); it goes
    /// on from its tree. The rekey messages the state holds are not sent again: they may have
    /// gone out before the crash, and a copy would be a second message with the same bytes. A
    /// member that missed them knocks and registers again.
    pub fn restore(
        cfg: KeyServerConfig,
        state: &[u8],
        identity: Identity,
        directory: SharedDirectory,
        rng: Box<dyn CryptoRng + Send>,
    ) -> Result<KeyServerNode, KeyGraphError> {
        let (server, annex) = Server::restore_with(state, identity.clone(), Some(&cfg.group))
            .map_err(KeyGraphError::State)?;
        // The service runs uncompacted, batch-signed trees: another state is not the service's.
        let sc = server.config();
        if !matches!(sc.graph, GraphKind::Tree { .. })
            || sc.compact
            || sc.signing != conclave_keygraph::Signing::Batch
        {
            return Err(KeyGraphError::State(
                conclave_keygraph::StateError::Damaged("not a key server service's state"),
            ));
        }
        let (names, next_user) = read_annex(&annex).ok_or(KeyGraphError::State(
            conclave_keygraph::StateError::Damaged("member names"),
        ))?;
        if names.values().any(|&u| !server.is_member(UserId(u))) || names.len() != server.members()
        {
            return Err(KeyGraphError::State(
                conclave_keygraph::StateError::Damaged("member names differ from the graph's"),
            ));
        }
        let mut server = server;
        while server.poll_transmit().is_some() {}
        Self::with_server(cfg, server, identity, directory, rng, names, next_user)
    }

    fn with_server(
        cfg: KeyServerConfig,
        server: Server,
        identity: Identity,
        directory: SharedDirectory,
        rng: Box<dyn CryptoRng + Send>,
        names: BTreeMap<String, u64>,
        next_user: u64,
    ) -> Result<KeyServerNode, KeyGraphError> {
        let registrar = Registrar::new(&cfg.group, &cfg.name, identity.clone())
            .map_err(KeyGraphError::Register)?;
        let mut node = KeyServerNode {
            cfg,
            server,
            registrar,
            identity,
            directory,
            rng,
            names,
            next_user,
            view: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
        };
        node.command(ClientCommand::Join {
            group: node.cfg.group.clone(),
            vs: true,
        });
        Ok(node)
    }

    pub fn config(&self) -> &KeyServerConfig {
        &self.cfg
    }
    /// Members holding keys.
    pub fn members(&self) -> usize {
        self.names.len()
    }
    pub fn epoch(&self) -> u64 {
        self.server.epoch()
    }
    /// The current group key (for tests and audits: keep it as secret as the tree).
    pub fn group_key(&self) -> Option<GroupKey> {
        self.server.group_key().map(|(_, k)| k)
    }

    pub fn poll_output(&mut self) -> Option<KeyServerOutput> {
        self.out.pop_front()
    }
    pub fn poll_event(&mut self) -> Option<KeyServerEvent> {
        self.events.pop_front()
    }

    /// When [`KeyServerNode::tick`] has something to do, if ever.
    pub fn next_deadline(&self) -> Option<u64> {
        let v = self.view.as_ref()?;
        let waiting = (!v.awaiting.is_empty()).then_some(v.deadline);
        match (v.batch_at, waiting) {
            (Some(b), Some(w)) => Some(b.max(w)),
            (Some(b), None) => Some(b),
            (None, Some(w)) if !v.announced => Some(w),
            _ => None,
        }
    }

    /// Time passed: rekeys and announces what is due.
    pub fn tick(&mut self, now: u64) {
        self.try_rekey(now);
    }

    /// An event of the client session (those of other groups are ignored).
    pub fn handle_event(&mut self, ev: ClientEvent, now: u64) {
        if ev.group() != Some(self.cfg.group.as_str()) {
            return;
        }
        match ev {
            ClientEvent::View { .. } => {
                if let Some(v) = conclave_gka::View::from_event(&ev) {
                    self.on_view(v.view_id, v.members.to_vec(), now);
                }
            }
            ClientEvent::FlushRequest { view, .. } => {
                // Nothing of the server's must stay in a view: acknowledged at once.
                self.command(ClientCommand::FlushAck {
                    group: self.cfg.group.clone(),
                    view,
                });
            }
            ClientEvent::Message {
                sender,
                payload,
                view,
                ..
            } => self.on_message(sender, &payload, view, now),
            _ => {}
        }
    }

    fn command(&mut self, c: ClientCommand) {
        self.out.push_back(KeyServerOutput::Command(c));
    }

    fn multicast(&mut self, msg: ServiceMsg<'_>) {
        let payload = SecureMessage::KeyGraph(&msg.encode()).encode();
        self.command(ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec![self.cfg.group.clone()],
            payload: payload.into(),
        });
    }

    fn refused(&mut self, sender: &str, error: KeyGraphError) {
        self.events.push_back(KeyServerEvent::Refused {
            sender: sender.to_owned(),
            error,
        });
    }

    fn on_view(&mut self, id: GroupViewId, members: Vec<String>, now: u64) {
        self.registrar.new_view();
        let present: BTreeSet<&String> = members.iter().collect();
        // A new process under a registered name lacks the old one's keys: it knocks on the view
        // key and registers again (its late key keeps the view on one key).
        let gone: Vec<String> = self
            .names
            .keys()
            .filter(|n| !present.contains(n))
            .cloned()
            .collect();
        let mut changed = false;
        for name in gone {
            changed |= self.remove(&name);
        }
        let mut v = CurrentView {
            id,
            members: members.clone(),
            awaiting: BTreeSet::new(),
            deadline: now + self.cfg.register_timeout_ms,
            // Changes queued in the last view are still to rekey.
            batch_at: self.view.as_ref().and_then(|v| v.batch_at),
            announced: false,
            bound: None,
            excluded: Vec::new(),
            knocked: BTreeSet::new(),
        };
        for m in &members {
            if *m != self.cfg.name && !self.names.contains_key(m) {
                v.awaiting.insert(m.clone());
            }
        }
        let invite: Vec<String> = v.awaiting.iter().cloned().collect();
        self.view = Some(v);
        self.invite(&invite, id);
        if changed {
            self.changed(now);
        }
        self.try_rekey(now);
    }

    /// Queues `name`'s leave; whether it held keys.
    fn remove(&mut self, name: &str) -> bool {
        let Some(&uid) = self.names.get(name) else {
            return false;
        };
        // The name goes with the graph's leave, or not at all (the two must agree).
        if let Err(e) = self.server.queue_leave(UserId(uid)) {
            self.refused(name, KeyGraphError::Server(e));
            return false;
        }
        self.names.remove(name);
        self.events.push_back(KeyServerEvent::Removed {
            member: name.to_owned(),
        });
        true
    }

    /// Invites `members` to register in `view`: one signed message for many.
    fn invite(&mut self, members: &[String], view: GroupViewId) {
        // Names the wire cannot carry are the daemons' to refuse, never the server's to send.
        let members: Vec<String> = members
            .iter()
            .filter(|m| !m.is_empty() && m.len() <= MAX_NAME_BYTES)
            .cloned()
            .collect();
        if members.is_empty() {
            return;
        }
        match self.registrar.invite_many(&members, view, &mut *self.rng) {
            Ok(msgs) => {
                for m in msgs {
                    self.multicast(ServiceMsg::Invitations(m));
                }
            }
            Err(e) => {
                let name = self.cfg.name.clone();
                self.refused(&name, KeyGraphError::Register(e));
            }
        }
    }

    /// A change to rekey: the batch's clock starts at the first.
    fn changed(&mut self, now: u64) {
        if let Some(v) = self.view.as_mut() {
            v.batch_at.get_or_insert(now + self.cfg.batch_ms);
        }
    }

    fn on_message(&mut self, sender: String, payload: &[u8], at: GroupViewId, now: u64) {
        if self.view.as_ref().map(|v| v.id) != Some(at) || sender == self.cfg.name {
            return;
        }
        let Ok(SecureMessage::KeyGraph(body)) = SecureMessage::decode(payload) else {
            // The members' data and anything else: not the server's.
            return;
        };
        let msg = match ServiceMsg::decode(body) {
            Ok(m) => m,
            Err(e) => return self.refused(&sender, KeyGraphError::Malformed(e)),
        };
        match msg {
            ServiceMsg::Register(b) => self.on_register(&sender, b, now),
            ServiceMsg::Knock { group, view } if group == self.cfg.group => {
                self.on_knock(&sender, view, now)
            }
            ServiceMsg::Knock { .. } => {
                self.refused(&sender, KeyGraphError::ViewKey("knock for another group"))
            }
            // Only the server sends these.
            ServiceMsg::Rekey(_)
            | ServiceMsg::ViewKey(_)
            | ServiceMsg::LateKey(_)
            | ServiceMsg::Invitations(_) => {
                self.refused(&sender, KeyGraphError::NotServer(sender.clone()))
            }
        }
    }

    fn on_register(&mut self, sender: &str, bytes: &[u8], now: u64) {
        match RegisterMsg::decode(bytes) {
            Ok(RegisterMsg::Hello { .. }) => {}
            Ok(_) => {
                return self.refused(sender, KeyGraphError::NotServer(sender.to_owned()));
            }
            Err(e) => return self.refused(sender, KeyGraphError::Register(e.into())),
        }
        let uid = self.next_user;
        // The graph's own configuration (a restored one's is the saved one's).
        let degree = match self.server.config().graph {
            GraphKind::Tree { degree } => degree,
            _ => self.cfg.degree,
        };
        let aead = self.server.config().aead;
        let server = &mut self.server;
        let mut admit = |_: &str, key: &GroupKey| {
            let ack = server
                .queue_join(UserId(uid), key)
                .map_err(|e| RegisterError::Admission(e.to_string()))?;
            Ok(Admission {
                user: ack.user.0,
                slot: ack.slot.0,
                epoch: ack.epoch,
                degree: Some(degree),
                aead: match aead {
                    AeadAlg::Aes256Gcm => 0,
                    AeadAlg::ChaCha20Poly1305 => 1,
                },
            }
            .encode())
        };
        let directory = self.directory.clone();
        let identity_of = |m: &str| {
            let dir = directory.read().unwrap_or_else(|p| p.into_inner());
            dir.get(m).cloned()
        };
        let result =
            self.registrar
                .handle_hello(sender, bytes, &identity_of, &mut admit, &mut *self.rng);
        match result {
            Ok(r) => {
                self.next_user += 1;
                self.names.insert(r.member.clone(), uid);
                if let Some(v) = self.view.as_mut() {
                    v.awaiting.remove(&r.member);
                }
                self.multicast(ServiceMsg::Register(&r.welcome));
                self.late_key(&r.member, &r.key);
                self.events
                    .push_back(KeyServerEvent::Registered { member: r.member });
                self.changed(now);
                self.try_rekey(now);
            }
            Err(e) => {
                if let RegisterError::AdmittedWithoutWelcome { .. } = e {
                    self.next_user += 1;
                    let _ = self.server.queue_leave(UserId(uid));
                }
                // Only a replay leaves the member's invitation worth waiting on.
                if !matches!(e, RegisterError::NotInvited) {
                    if let Some(v) = self.view.as_mut() {
                        v.awaiting.remove(sender);
                    }
                }
                self.refused(sender, KeyGraphError::Register(e));
                self.try_rekey(now);
            }
        }
    }

    fn on_knock(&mut self, sender: &str, view: GroupViewId, now: u64) {
        let Some(v) = self.view.as_mut() else {
            return;
        };
        if view != v.id {
            return self.refused(sender, KeyGraphError::ViewKey("knock of another view"));
        }
        if !v.knocked.insert(sender.to_owned()) {
            return;
        }
        // Its hello is worth waiting for, in one rekey with its leave.
        v.deadline = now + self.cfg.register_timeout_ms;
        v.awaiting.insert(sender.to_owned());
        if self.remove(sender) {
            self.changed(now);
        }
        self.invite(&[sender.to_owned()], view);
    }

    fn try_rekey(&mut self, now: u64) {
        let Some(v) = self.view.as_mut() else {
            return;
        };
        if !v.awaiting.is_empty() {
            if now < v.deadline {
                return;
            }
            // Those who did not answer in time go without a key in this view.
            v.awaiting.clear();
        }
        if let Some(at) = v.batch_at {
            if now < at {
                return;
            }
            if let Some(v) = self.view.as_mut() {
                v.batch_at = None;
            }
            match self.server.rekey_batch(&mut *self.rng) {
                Ok(true) => {
                    let annex = zeroize::Zeroizing::new(self.annex());
                    match self.server.save_with(&mut *self.rng, &annex) {
                        Ok(state) => self.out.push_back(KeyServerOutput::Save(state)),
                        Err(e) => {
                            let name = self.cfg.name.clone();
                            self.refused(&name, KeyGraphError::State(e));
                        }
                    }
                    while let Some(t) = self.server.poll_transmit() {
                        self.multicast(ServiceMsg::Rekey(&t.bytes));
                    }
                    if let Some(s) = self.server.last_rekey() {
                        self.events.push_back(KeyServerEvent::Rekeyed(s.clone()));
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    // No view key on the old group key, which leavers hold.
                    let name = self.cfg.name.clone();
                    return self.refused(&name, KeyGraphError::Server(e));
                }
            }
        }
        self.announce();
    }

    /// A member registered after the view's key was announced gets the group key the view is
    /// bound to, sealed for it alone: the view keeps one key, and the member had been counted
    /// a holder (or it registers late in a view it is a member of).
    fn late_key(&mut self, member: &str, individual: &GroupKey) {
        let Some(v) = self.view.as_ref() else {
            return;
        };
        let Some((epoch, graph_key)) = v.bound.as_ref() else {
            return;
        };
        // A member the view key named as holding none registered too late for this view: it
        // gets the next view's key (a late key would tell the others' applications wrong).
        if v.excluded.iter().any(|m| m == member) {
            return;
        }
        // The view's key, never the group key it comes from: that would open earlier views.
        let key = crate::keygraph_member::view_key(&self.cfg.group, graph_key, v.id, *epoch);
        let mut msg = LateKeyMsg {
            group: self.cfg.group.clone(),
            server: self.cfg.name.clone(),
            member: member.to_owned(),
            view: v.id,
            epoch: *epoch,
            excluded: v.excluded.clone(),
            sealed: Vec::new(),
            signature: Vec::new(),
        };
        msg.sealed = crate::keygraph_member::late_sealing(individual, &msg).seal(
            [0; conclave_crypto::aead::NONCE_BYTES],
            &msg.sealing_aad(),
            key.expose(),
        );
        match self.identity.sign(&msg.signed_bytes()) {
            Ok(sig) => msg.signature = sig,
            Err(_) => {
                let name = self.cfg.name.clone();
                return self.refused(&name, KeyGraphError::Register(RegisterError::Sign));
            }
        }
        self.multicast(ServiceMsg::LateKey(msg));
    }

    /// Binds the current view to the group key, once per view.
    fn announce(&mut self) {
        let Some(v) = self.view.as_ref() else {
            return;
        };
        if v.announced {
            return;
        }
        let Some((r, graph_key)) = self.server.group_key() else {
            // Nobody holds keys yet.
            return;
        };
        let excluded: Vec<String> = v
            .members
            .iter()
            .filter(|m| **m != self.cfg.name && !self.names.contains_key(*m))
            .cloned()
            .collect();
        let mut msg = ViewKeyMsg {
            group: self.cfg.group.clone(),
            server: self.cfg.name.clone(),
            view: v.id,
            epoch: self.server.epoch(),
            key_id: r.id,
            key_version: r.version,
            excluded,
            signature: Vec::new(),
        };
        match self.identity.sign(&msg.signed_bytes()) {
            Ok(sig) => msg.signature = sig,
            Err(_) => {
                let name = self.cfg.name.clone();
                return self.refused(&name, KeyGraphError::Register(RegisterError::Sign));
            }
        }
        let (view, epoch, excluded) = (msg.view, msg.epoch, msg.excluded.clone());
        self.multicast(ServiceMsg::ViewKey(msg));
        if let Some(v) = self.view.as_mut() {
            v.announced = true;
            v.bound = Some((epoch, graph_key));
            v.excluded = excluded.clone();
        }
        self.events.push_back(KeyServerEvent::Announced {
            view,
            epoch,
            excluded,
        });
    }

    fn annex(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(12 + self.names.len() * (MAX_NAME_BYTES + 9));
        w.u64(self.next_user);
        w.u32(self.names.len() as u32);
        for (n, u) in &self.names {
            w.name(n, MAX_NAME_BYTES);
            w.u64(*u);
        }
        w.into_vec()
    }
}

fn read_annex(b: &[u8]) -> Option<(BTreeMap<String, u64>, u64)> {
    let mut r = Reader::new(b);
    let next = r.u64("next user").ok()?;
    let n = r.u32("names").ok()? as usize;
    if n > MAX_SAVED_NAMES || n > r.remaining() / 10 {
        return None;
    }
    let mut names = BTreeMap::new();
    for _ in 0..n {
        let name = r.name("member", MAX_NAME_BYTES).ok()?;
        let uid = r.u64("user").ok()?;
        if uid >= next || names.insert(name, uid).is_some() {
            return None;
        }
    }
    r.finish().ok()?;
    Some((names, next))
}
