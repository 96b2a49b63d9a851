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
}

impl SimClient {
    pub(super) fn connected(&self) -> bool {
        self.session.is_some()
    }
}

pub(super) struct World {
    pub(super) multi_group: bool,
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
    pub(super) delivered: u64,
    pub(super) views: u64,
    pub(super) now: u64,
    /// Identities and the directory, in secure runs.
    pub(super) security: Option<super::secure::Security>,
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
                    SessionOutput::Bytes(bytes, n) => {
                        self.clients[ci].core.buffer().extend_from_slice(&bytes);
                        self.nodes[i].handle_session_written(sid, bytes.len(), n, [bytes]);
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
                self.nodes[i].handle_session_bytes(now, sid, &bytes);
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
        (!out.is_empty()).then_some(out)
    }

    /// Client `ci` sends a command, if its session core lets it go.
    pub(super) fn command(&mut self, ci: usize, cmd: ClientCommand) {
        let c = &mut self.clients[ci];
        let Some(sid) = c.session else {
            return;
        };
        let Ok(bytes) = c.core.command(cmd) else {
            return;
        };
        let now = Time::from_micros(self.now);
        self.nodes[c.daemon].handle_session_bytes(now, sid, &bytes);
    }

    pub(super) fn connect(&mut self, ci: usize) {
        let d = self.clients[ci].daemon;
        let sid = self.next_session;
        self.next_session += 1;
        let now = Time::from_micros(self.now);
        if self.nodes[d].open_session(now, sid).is_err() {
            return;
        }
        self.sessions.insert(sid, ci);
        let c = &mut self.clients[ci];
        c.session = Some(sid);
        c.inc = None;
        c.core = SessionCore::new(WINDOW);
        let hello = c.core.connect(&c.private);
        self.nodes[d].handle_session_bytes(now, sid, &hello);
    }

    /// The client's connection ended (the daemon recorded the end of its incarnation).
    pub(super) fn client_gone(&mut self, ci: usize) {
        let c = &mut self.clients[ci];
        c.session = None;
        c.inc = None;
        c.core = SessionCore::new(WINDOW);
        c.secure.clear();
        c.pending.clear();
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
