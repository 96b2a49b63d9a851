//! The simulated cluster: a node per daemon, the client processes speaking the client protocol
//! to them, and the history both record.

use super::*;

/// One simulated client process: which daemon it talks to, its connection, what it has joined.
/// It speaks the client protocol in bytes, as a client library does.
pub(super) struct SimClient {
    pub(super) daemon: usize,
    /// Its private name, and as the daemons qualify it.
    pub(super) private: String,
    pub(super) name: String,
    pub(super) session: Option<SessionId>,
    /// The incarnation its daemon gave this connection, once a record shows it.
    pub(super) inc: Option<u32>,
    /// The client library's session core: the replies, the groups, the window.
    pub(super) core: SessionCore,
    pub(super) sent: u64,
    /// Its secure groups in this session (secure runs).
    pub(super) secure: BTreeMap<String, conclave_secure::SecureGroup>,
    /// Their commands waiting for room in the window, in order.
    pub(super) pending: std::collections::VecDeque<ClientCommand>,
    /// A client of Spread's protocol (docs/spread.md) instead of Conclave's.
    pub(super) spread: Option<SpreadSim>,
}

/// What a simulated Spread client keeps: the daemon's bytes not yet read, its private group once
/// accepted, the groups it asked to join. It reads every message as libspread would; a message
/// it cannot read stops its reading (and the history then lacks what the checker wants).
#[derive(Default)]
pub(super) struct SpreadSim {
    pub(super) input: Vec<u8>,
    pub(super) private_group: Option<String>,
    pub(super) groups: BTreeSet<String>,
    pub(super) broken: bool,
    /// Messages read, by kind (data, membership, transitional, self-leave, reject).
    pub(super) read: [u64; 5],
}

impl SpreadSim {
    fn feed(&mut self, bytes: &[u8]) {
        use conclave_wire::spread::client::{accepted, next_message, Message};
        if self.broken {
            return;
        }
        self.input.extend_from_slice(bytes);
        let mut at = 0;
        if self.private_group.is_none() {
            match accepted(&self.input) {
                Ok(Some((pg, used))) => {
                    self.private_group = Some(pg);
                    at = used;
                }
                Ok(None) => return,
                Err(_) => {
                    self.broken = true;
                    return;
                }
            }
        }
        loop {
            match next_message(&self.input[at..]) {
                Ok(Some((m, used))) => {
                    at += used;
                    let kind = match m {
                        Message::Data { .. } => 0,
                        Message::Membership { .. } => 1,
                        Message::Transitional { .. } => 2,
                        Message::SelfLeave { group } => {
                            self.groups.remove(&group);
                            3
                        }
                        Message::Reject { .. } => 4,
                    };
                    self.read[kind] += 1;
                }
                Ok(None) => break,
                Err(_) => {
                    self.broken = true;
                    break;
                }
            }
        }
        self.input.drain(..at);
    }
}

impl SimClient {
    /// A client of daemon `d` (an index), not yet connected; a Spread client if `spread`.
    pub(super) fn new(d: usize, private: String, spread: bool) -> SimClient {
        SimClient {
            daemon: d,
            name: format!("{private}#{}", super::name(d as DaemonId + 1)),
            private,
            session: None,
            inc: None,
            core: SessionCore::new(WINDOW),
            sent: 0,
            secure: BTreeMap::new(),
            pending: Default::default(),
            spread: spread.then(SpreadSim::default),
        }
    }

    pub(super) fn connected(&self) -> bool {
        self.session.is_some()
    }

    /// The groups it is in (or asked to be).
    pub(super) fn joined(&self) -> Vec<String> {
        match &self.spread {
            Some(s) => s.groups.iter().cloned().collect(),
            None => self.core.groups().map(str::to_owned).collect(),
        }
    }
}

pub(super) struct World {
    pub(super) multi_group: bool,
    /// Groups the workload draws from (`g0`, `g1`, ...).
    pub(super) groups: usize,
    pub(super) cfg: Config,
    /// The daemons' identities (drawn from the seed).
    pub(super) identities: Identities,
    /// Seed of the daemons' secret randomness (their key agreement's).
    pub(super) secret_seed: u64,
    pub(super) nodes: Vec<Node>,
    pub(super) clients: Vec<SimClient>,
    /// Which client each open connection belongs to.
    pub(super) sessions: BTreeMap<SessionId, usize>,
    pub(super) next_session: SessionId,
    pub(super) by_name: BTreeMap<String, usize>,
    pub(super) history: Vec<Record>,
    pub(super) dinc: Vec<u32>,
    /// Messages Spread clients read, and sessions of theirs that ended unreadable, so far.
    pub(super) spread_read: u64,
    pub(super) spread_broken: u64,
    pub(super) delivered: u64,
    pub(super) views: u64,
    pub(super) now: u64,
    /// Identities and the directory, in secure runs.
    pub(super) security: Option<super::secure::Security>,
}

/// What a simulated Spread client asks of its daemon.
pub(super) enum SpreadRequest {
    Join(String),
    Leave(String),
    Kill,
    Send {
        service: conclave_wire::gcs::ServiceType,
        /// Groups (joined or not) and private groups.
        groups: Vec<String>,
        payload: Vec<u8>,
        self_discard: bool,
    },
}

/// Places in a simulated client's window (the library's default).
pub(super) const WINDOW: usize = conclave_client::DEFAULT_WINDOW;

impl World {
    pub(super) fn push(&mut self, p: &str, inc: u32, ev: Event) {
        self.history.push(Record {
            t: self.now,
            p: p.to_owned(),
            inc,
            ev,
        });
    }

    /// A new node for daemon `i`, starting now as its current incarnation.
    pub(super) fn node(&self, i: usize) -> Node {
        let opts = NodeOptions {
            incarnation: self.dinc[i],
            seed: i as u64,
            record: true,
            record_ring_messages: true,
            clock_base_us: 0,
            // Each incarnation's clients count from their own range, so a client's incarnations
            // grow across restarts of its daemon.
            client_incarnation_floor: self.dinc[i] * 1_000_000,
            identity: self.identities.get(&name(i as DaemonId + 1)),
            secret_rng: Some(conclave_node::SecretRng::seeded(
                self.secret_seed ^ (i as u64) << 40 ^ (self.dinc[i] as u64) << 8,
            )),
            link_salt: (self.dinc[i].wrapping_mul(0x9e37_79b9)) ^ i as u32,
        };
        Node::new(
            self.cfg.clone(),
            &name(i as DaemonId + 1),
            opts,
            Time::from_micros(self.now),
        )
        .expect("the simulated configuration is valid")
    }

    /// Drains what node `i` has for the history, its clients and the network; clients answer at
    /// once (VS clients acknowledge flushes), which may give the node more to drain.
    pub(super) fn drain(&mut self, i: usize, wire: &mut Wire, rng: &mut ChaCha20Rng, faulty: bool) {
        loop {
            // As the daemon's driver does: a token passed on goes before anything else.
            if let Some((addr, d)) = self.nodes[i].poll_token() {
                wire.send(rng, self.now, faulty, i, addr, d);
            }
            while let Some(r) = self.nodes[i].poll_record() {
                match &r.ev {
                    Event::View { group, .. } if group.is_empty() => self.views += 1,
                    Event::Deliver { group, .. } if !group.is_empty() => self.delivered += 1,
                    _ => {}
                }
                if let Some(&ci) = self.by_name.get(&r.p) {
                    let c = &mut self.clients[ci];
                    if c.connected() && c.inc.is_none() && r.ev != Event::Crash {
                        c.inc = Some(r.inc);
                    }
                }
                self.history.push(r);
            }
            let mut answers = Vec::new();
            while let Some((sid, out)) = self.nodes[i].poll_session() {
                let Some(&ci) = self.sessions.get(&sid) else {
                    continue;
                };
                match out {
                    SessionOutput::Bytes(frames, n) if self.clients[ci].spread.is_some() => {
                        if let Some(s) = self.clients[ci].spread.as_mut() {
                            s.feed(&frames.to_vec());
                        }
                        self.nodes[i].handle_frames_written(sid, frames, n);
                    }
                    SessionOutput::Bytes(frames, n) => {
                        // Piece by piece, as the daemon's vectored write takes them.
                        let buffer = self.clients[ci].core.buffer();
                        for piece in frames.slices() {
                            buffer.extend_from_slice(piece);
                        }
                        self.nodes[i].handle_frames_written(sid, frames, n);
                        if let Some(a) = self.replies(ci) {
                            answers.push((sid, a));
                        }
                    }
                    SessionOutput::Close => {
                        self.sessions.remove(&sid);
                        self.client_gone(ci);
                    }
                }
            }
            while let Some((addr, d)) = self.nodes[i].poll_datagram() {
                wire.send(rng, self.now, faulty, i, addr, d);
            }
            if answers.is_empty() {
                return;
            }
            let now = Time::from_micros(self.now);
            for (sid, bytes) in answers {
                self.nodes[i].handle_session_shared(now, sid, &bytes::Bytes::from(bytes));
            }
        }
    }

    /// Client `ci` reads the replies that arrived; what it sends back, if anything.
    pub(super) fn replies(&mut self, ci: usize) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        // The daemon's bytes are trusted here no more than anywhere: what does not decode ends
        // the reading (the history will lack what it should hold).
        while let Ok(Some(h)) = self.clients[ci].core.next_reply() {
            let Handled::Event(ev) = h else {
                continue;
            };
            if self.security.is_some() {
                out.extend(self.secure_event(ci, ev));
                out.extend(self.send_pending(ci));
                continue;
            }
            if let ClientEvent::FlushRequest { group, view } = ev {
                let core = &mut self.clients[ci].core;
                if let Ok(b) = core.command(ClientCommand::FlushAck { group, view }) {
                    out.extend(b);
                }
            }
        }
        if self.is_key_server(ci) {
            // Its nodes join their groups once the session has its name.
            self.key_server_start(ci);
            out.extend(self.key_server_pump(ci));
        }
        (!out.is_empty()).then_some(out)
    }

    /// Client `ci` sends a command, if its session core lets it go (a Spread client sends it as
    /// Spread's request).
    pub(super) fn command(&mut self, ci: usize, cmd: ClientCommand) {
        let c = &mut self.clients[ci];
        let Some(sid) = c.session else {
            return;
        };
        if c.spread.is_some() {
            let req = match cmd {
                ClientCommand::Join { group, .. } => SpreadRequest::Join(group),
                ClientCommand::Leave { group } => SpreadRequest::Leave(group),
                ClientCommand::Multicast {
                    service,
                    groups,
                    payload,
                } => SpreadRequest::Send {
                    service,
                    groups,
                    payload: payload.to_vec(),
                    self_discard: false,
                },
                ClientCommand::FlushAck { .. } => return,
            };
            return self.spread_request(ci, req);
        }
        let Ok(bytes) = c.core.command(cmd) else {
            return;
        };
        let now = Time::from_micros(self.now);
        self.nodes[c.daemon].handle_session_shared(now, sid, &bytes::Bytes::from(bytes));
    }

    pub(super) fn connect(&mut self, ci: usize) {
        let d = self.clients[ci].daemon;
        let sid = self.next_session;
        self.next_session += 1;
        let now = Time::from_micros(self.now);
        if self.clients[ci].spread.is_some() {
            if self.nodes[d].open_spread_session(now, sid).is_err() {
                return;
            }
            self.sessions.insert(sid, ci);
            self.client_gone(ci);
            let c = &mut self.clients[ci];
            c.session = Some(sid);
            let hello = conclave_wire::spread::client::hello(&c.private, true);
            self.nodes[d].handle_session_shared(now, sid, &bytes::Bytes::from(hello));
            return;
        }
        if self.nodes[d].open_session(now, sid).is_err() {
            return;
        }
        self.sessions.insert(sid, ci);
        let c = &mut self.clients[ci];
        c.session = Some(sid);
        c.inc = None;
        c.core = SessionCore::new(WINDOW);
        let hello = c.core.connect(&c.private);
        self.nodes[d].handle_session_shared(now, sid, &bytes::Bytes::from(hello));
    }

    /// The client's connection ended (the daemon recorded the end of its incarnation).
    pub(super) fn client_gone(&mut self, ci: usize) {
        self.key_server_gone(ci);
        let c = &mut self.clients[ci];
        c.session = None;
        c.inc = None;
        c.core = SessionCore::new(WINDOW);
        c.secure.clear();
        c.pending.clear();
        if let Some(s) = c.spread.as_mut() {
            self.spread_read += s.read.iter().sum::<u64>();
            self.spread_broken += u64::from(s.broken);
            *s = SpreadSim::default();
        }
    }

    /// Spread client `ci` sends a request (once its daemon has accepted it).
    pub(super) fn spread_request(&mut self, ci: usize, req: SpreadRequest) {
        use conclave_wire::spread::{self as sp, client::request};
        let c = &mut self.clients[ci];
        let (Some(sid), Some(s)) = (c.session, c.spread.as_mut()) else {
            return;
        };
        let Some(pg) = s.private_group.clone() else {
            return;
        };
        let bytes = match req {
            SpreadRequest::Join(g) => {
                s.groups.insert(g.clone());
                request(sp::JOIN_MESS, &pg, &[&g], 0, &[])
            }
            SpreadRequest::Leave(g) => {
                s.groups.remove(&g);
                request(sp::LEAVE_MESS, &pg, &[&g], 0, &[])
            }
            SpreadRequest::Kill => request(sp::KILL_MESS, &pg, &[&pg], 0, &[]),
            SpreadRequest::Send {
                service,
                groups,
                payload,
                self_discard,
            } => {
                let bit = sp::service_bit(service);
                let kind = bit | if self_discard { sp::SELF_DISCARD } else { 0 };
                let names: Vec<&str> = groups.iter().map(String::as_str).collect();
                request(kind, &pg, &names, 1, &payload)
            }
        };
        let now = Time::from_micros(self.now);
        let d = c.daemon;
        self.nodes[d].handle_session_shared(now, sid, &bytes::Bytes::from(bytes));
    }

    /// The client's daemon crashed: the client's incarnation ends with it.
    pub(super) fn client_crash(&mut self, ci: usize) {
        if let Some(sid) = self.clients[ci].session {
            self.sessions.remove(&sid);
        }
        let (name, inc) = (self.clients[ci].name.clone(), self.clients[ci].inc);
        self.client_gone(ci);
        if let Some(inc) = inc {
            self.push(&name, inc, Event::Crash);
        }
    }
}
