//! A daemon as a pure state machine: the group communication core ([`conclave_gcs::Daemon`]),
//! its client sessions, the datagrams between daemons, fault injection, limits and the
//! recorder. Inputs are bytes with the time they arrived; outputs are polled. The daemon's tokio
//! runtime only moves bytes between sockets and a node; the simulator drives the same nodes with
//! a simulated network and clock, so what its seeds prove is the daemon that is deployed.
//!
//! Inputs (`now` is the node's clock, a [`Time`], never going back):
//! - [`Node::handle_datagram`]: a datagram from a peer address;
//! - [`Node::open_session`], [`Node::handle_session_bytes`], [`Node::handle_session_written`],
//!   [`Node::close_session`]: a client connection opened, sent bytes, had output written, ended;
//! - [`Node::handle_timeout`]: the time [`Node::poll_timeout`] asked for has come;
//! - [`Node::handle_admin`]: a request of `conclave admin`.
//!
//! Outputs, drained after each batch of inputs in this order (the order matters):
//! 0. [`Node::poll_token`]: the ring's token, when this batch passes it on (and answers no
//!    retransmission request), alone and before anything else is prepared. It carries no
//!    message, only the sequence numbers of those that follow: after a crash before they leave,
//!    no daemon can deliver them, and the ring's recovery treats them as lost, as it does any
//!    message of a daemon that crashed. A configuration this batch installed is recorded after
//!    the token has left: a crash in between leaves it out of this daemon's history, as a crash
//!    just before the batch would;
//! 1. [`Node::poll_record`]: history records, to be on disk before anything below leaves, so
//!    that every message another daemon delivers has its send recorded even after a crash;
//! 2. [`Node::poll_session`]: bytes for each connection (a client's replies keep the order of
//!    its requests), and the closing of connections;
//! 3. [`Node::poll_datagram`]: datagrams to peers, as few as carry what the core sends (small
//!    packets to one peer batched, large ones in fragments, [`crate::frag`]);
//! 4. [`Node::poll_timeout`]: when to call [`Node::handle_timeout`] next.
//!
//! The first poll after an input frames the core's client events and packs its packets; inputs
//! handled together (the datagrams that arrived at once) are drained together, which is what
//! lets one datagram carry many messages. A token passed on is the exception: the driver takes
//! it first, alone ([`Node::poll_token`]), before anything else is prepared.

use crate::access::Access;
use crate::admin::{AdminReply, AdminRequest, Status, MAX_PAUSE_MS};
use crate::config::{qualified_name, Config, ConfigError};
use crate::daemons_key::{is_reserved_group, member_name, ServersAgreement};
use crate::faults::{Faults, LinkFaults};
use crate::frag::{pack_with, Reassembly};
use crate::frames::{Frames, ViewBudget};
use crate::link::{LinkMode, LinkSetupError, Links, Opened};
use crate::metrics::Metrics;
use crate::record::Recorder;
use crate::session::{next_request, Session, SessionId, SessionOutput};
use bytes::{Bytes, BytesMut};
use conclave_crypto::identity_file::IdentityFile;
use conclave_crypto::CryptoRng;
use conclave_gcs::{ClientEvent, Daemon, Delivery, Dest, IdMap, LocalEvent, Phase, Time, Transmit};
use conclave_history::{Event, Record};
use conclave_wire::client::{ClientCommand, KeyBytes, Refusal, Reply, Request};
use conclave_wire::gcs::{DaemonId, Packet, RingId};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

#[path = "spread_session.rs"]
pub(crate) mod spread_session;

/// Most bytes queued for one client before it is disconnected for not reading.
pub const MAX_UNREAD_BYTES: usize = 64 << 20;
/// A session's framed replies are handed out when the node's outputs are drained, or once they
/// fill this many bytes (or half the replies a client may leave unread), and the next replies
/// are framed into a buffer of their own. A pass under full load frames a few hundred KiB for a
/// client: framed into one buffer, that buffer grew by doubling, and copying it as it grew was
/// 6% of a daemon's processor time. The driver writes a session's buffers with one vectored write
/// when the pass is over, so handing them out in pieces adds no write and no wake-up.
pub const CHUNK_BYTES: usize = 64 << 10;
/// Room of a fresh buffer for a session that filled one: a chunk and a frame of up to 16 KiB.
const CHUNK_ROOM: usize = CHUNK_BYTES + (16 << 10);
/// Bytes the frame begun in `input` still lacks: up to its length's 4 bytes, then up to its end
/// (a length past the request limit lacks nothing: reading it gives the error).
fn missing(input: &[u8]) -> usize {
    match input.get(..4) {
        None => 4 - input.len(),
        Some(h) => {
            let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
            if len > conclave_wire::client::MAX_REQUEST_BYTES {
                return 0;
            }
            (4 + len).saturating_sub(input.len())
        }
    }
}

/// Gauges that are sums over every session or group are refreshed at most this often.
const GAUGE_PERIOD: Duration = Duration::from_millis(100);

/// How a node starts, beyond its configuration.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// This run's incarnation (it must grow from one start of a daemon to the next).
    pub incarnation: u32,
    /// Seed of the fault injection's randomness.
    pub seed: u64,
    /// Keep a history of the node's clients and views for [`Node::poll_record`].
    pub record: bool,
    /// Record the ring's own sends and deliveries of client messages too.
    pub record_ring_messages: bool,
    /// Added to the node's clock in records and client incarnations (the daemon: wall-clock
    /// microseconds since the Unix epoch at its start).
    pub clock_base_us: u64,
    /// Client incarnations start above this (the simulator keeps restarts apart with it).
    pub client_incarnation_floor: u32,
    /// The daemon's identity, for its links (required unless they are off) and the daemons'
    /// key agreement (which runs whenever the daemon has one).
    pub identity: Option<Arc<IdentityFile>>,
    /// Where the daemons' key agreement draws its secrets (required with an identity).
    pub secret_rng: Option<SecretRng>,
    /// Random bits of this run's link epoch (docs/links.md): the system's RNG in the daemon, a
    /// seeded one in the simulator.
    pub link_salt: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("the configuration names no daemon {0:?}")]
    UnknownDaemon(String),
    #[error("{max} connections are already open")]
    TooManyConnections { max: usize },
    #[error("connection {0} is already open")]
    SessionExists(SessionId),
    #[error(transparent)]
    Link(#[from] LinkSetupError),
    #[error("the daemon has an identity but no source of secret randomness")]
    NoSecretRng,
}

/// A source of secret randomness for the node: the system's RNG in a daemon, a seeded one in
/// tests and the simulator. The node asks it for a generator whenever it starts a key agreement
/// member.
#[derive(Clone)]
pub struct SecretRng(Arc<dyn Fn() -> Box<dyn CryptoRng + Send> + Send + Sync>);

impl SecretRng {
    pub fn new(make: impl Fn() -> Box<dyn CryptoRng + Send> + Send + Sync + 'static) -> Self {
        SecretRng(Arc::new(make))
    }

    /// Generators drawn from `seed`, each different (tests and the simulator only).
    pub fn seeded(seed: u64) -> Self {
        let made = std::sync::atomic::AtomicU64::new(0);
        SecretRng::new(move || {
            let n = made.fetch_add(1, Relaxed);
            Box::new(rand_chacha::ChaCha20Rng::seed_from_u64(
                seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ))
        })
    }

    fn make(&self) -> Box<dyn CryptoRng + Send> {
        (self.0)()
    }
}

impl std::fmt::Debug for SecretRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretRng")
    }
}

/// The session id of the daemon's own member of the daemons' group; a driver never opens it.
pub const DAEMONS_MEMBER: SessionId = SessionId::MAX;

/// A datagram held back by an injected delay: when it goes, a tie-breaker, to whom, what.
type Delayed = (Time, u64, DaemonId, Vec<u8>);

pub struct Node {
    me: DaemonId,
    name: String,
    inc: u32,
    cfg: Config,
    daemon: Daemon,
    peers: Vec<SocketAddr>,
    /// The daemons' names, by id from 1 (for counting what each sent).
    peer_names: Vec<String>,
    by_addr: HashMap<SocketAddr, DaemonId>,
    reassembly: IdMap<DaemonId, Reassembly>,
    links: Links,
    /// The daemons' key agreement (with an identity).
    servers: Option<ServersAgreement>,
    /// Group keys kept for resealing (Optimized EVS).
    old_keys: crate::reseal::OldKeys,
    /// The keys of the clients the configuration lists (`[[client]]`), and the generator of the
    /// nonces they sign.
    client_keys: std::collections::BTreeMap<String, conclave_crypto::PublicIdentity>,
    nonces: Option<Box<dyn CryptoRng + Send>>,
    refusal_log: RefusalLog,
    frag_id: u32,
    faults: Faults,
    rng: ChaCha8Rng,
    delayed: BinaryHeap<Reverse<Delayed>>,
    delayed_seq: u64,
    sessions: IdMap<SessionId, Session>,
    /// Spread sessions read no further until the core has room for their messages.
    paused: BTreeSet<SessionId>,
    /// When paused sessions are to be read on, in a step of their own
    /// ([`Node::resume_sessions`]).
    resume_at: Option<Time>,
    /// Sessions with replies framed, or an acknowledgement waiting, not yet handed out.
    dirty: Vec<SessionId>,
    /// When the acknowledgements held back for another reply ([`Node::flush_replies`]) go out
    /// anyway.
    acks_due: Option<Time>,
    /// Handshake and request deadlines, by time.
    deadlines: BTreeSet<(Time, SessionId)>,
    /// Bytes of incomplete requests held for all sessions together.
    incomplete_bytes: usize,
    /// Payloads that handed-out deliveries hold as views, for all sessions (crate::frames).
    views: ViewBudget,
    metrics: Arc<Metrics>,
    recorder: Option<Recorder>,
    datagrams: VecDeque<(SocketAddr, Vec<u8>)>,
    session_out: VecDeque<(SessionId, SessionOutput)>,
    /// Inputs were handled since the outputs were last prepared.
    unprepared: bool,
    paused_until: Option<Time>,
    clock_base_us: u64,
    last_client_inc: u32,
    last_ring: Option<RingId>,
    stopping: bool,
    gauges_at: Option<Time>,
    now: Time,
}

impl Node {
    /// The node of daemon `name` of the configuration, starting at `now`.
    pub fn new(cfg: Config, name: &str, opts: NodeOptions, now: Time) -> Result<Node, NodeError> {
        cfg.validate()?;
        let me = cfg
            .id_of(name)
            .ok_or_else(|| NodeError::UnknownDaemon(name.to_owned()))?;
        let recorder = opts.record.then(|| {
            let names = cfg.daemon.iter().map(|d| d.name.clone()).collect();
            let mut r = Recorder::new(names, opts.clock_base_us);
            r.ring_messages = opts.record_ring_messages;
            r
        });
        let mut dcfg = cfg.core.clone();
        dcfg.record_ring = recorder.is_some();
        // A client's name ends in `#` and its daemon's name: a daemon speaks for its own alone.
        dcfg.daemon_names = cfg
            .daemon
            .iter()
            .enumerate()
            .map(|(i, d)| (i as DaemonId + 1, d.name.clone()))
            .collect();
        let epoch = (opts.incarnation as u64) << 32 | opts.link_salt as u64;
        let dh = opts.identity.as_ref().map(|i| i.static_dh());
        let links = Links::new(cfg.links.mode, me, epoch, dh.as_ref(), &cfg.roster())?;
        let servers = match &opts.identity {
            Some(identity) => {
                let rng = opts.secret_rng.as_ref().ok_or(NodeError::NoSecretRng)?;
                Some(ServersAgreement::new(
                    name,
                    identity.identity(),
                    &cfg.roster(),
                    cfg.links.agreement,
                    rng.make(),
                ))
            }
            None => None,
        };
        let client_keys = cfg.client_keys()?;
        let nonces = if client_keys.is_empty() {
            None
        } else {
            Some(
                opts.secret_rng
                    .as_ref()
                    .ok_or(NodeError::NoSecretRng)?
                    .make(),
            )
        };
        if cfg.links.mode == LinkMode::Off {
            tracing::warn!(
                daemon = name,
                "LINKS BETWEEN DAEMONS ARE OFF: anyone who reaches the peer port can read the \
                 ring's traffic, forge tokens and membership messages, and inject messages \
                 ([links] mode = \"off\"; for benchmarks and trusted networks only)"
            );
        }
        let mut daemon = Daemon::new(dcfg, me, opts.incarnation, now);
        if servers.is_some() {
            // The first client of a new core, under a name of at most 17 bytes (daemon names
            // have 16 at most) and an id no session takes: the core cannot refuse it.
            daemon
                .connect(DAEMONS_MEMBER, &member_name(name))
                .expect("the daemon's first client");
        }
        let mut node = Node {
            links,
            servers,
            old_keys: crate::reseal::OldKeys::new(cfg.resealing.clone()),
            client_keys,
            nonces,
            refusal_log: RefusalLog::default(),
            me,
            name: name.to_owned(),
            inc: opts.incarnation,
            daemon,
            peers: cfg.daemon.iter().map(|d| d.peer).collect(),
            peer_names: cfg.daemon.iter().map(|d| d.name.clone()).collect(),
            by_addr: cfg
                .daemon
                .iter()
                .enumerate()
                .map(|(i, d)| (d.peer, i as DaemonId + 1))
                .collect(),
            reassembly: IdMap::default(),
            frag_id: 0,
            faults: cfg.faults(),
            rng: ChaCha8Rng::seed_from_u64(opts.seed),
            delayed: BinaryHeap::new(),
            delayed_seq: 0,
            sessions: IdMap::default(),
            paused: BTreeSet::new(),
            resume_at: None,
            dirty: Vec::new(),
            acks_due: None,
            deadlines: BTreeSet::new(),
            incomplete_bytes: 0,
            views: ViewBudget::default(),
            metrics: Arc::new(Metrics::default()),
            recorder,
            datagrams: VecDeque::new(),
            session_out: VecDeque::new(),
            unprepared: true,
            paused_until: None,
            clock_base_us: opts.clock_base_us,
            last_client_inc: opts.client_incarnation_floor,
            last_ring: None,
            stopping: false,
            gauges_at: None,
            now,
            cfg,
        };
        node.servers_pump();
        Ok(node)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> DaemonId {
        self.me
    }

    pub fn incarnation(&self) -> u32 {
        self.inc
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The group communication core (for its state: ring, members, readiness).
    pub fn core(&self) -> &Daemon {
        &self.daemon
    }

    /// The node's counters and gauges (shared: a metrics endpoint reads them).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Whether an admin `shutdown` asked the node to stop (the driver then calls
    /// [`Node::shutdown`]).
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// An admin `pause`: until when the driver should handle nothing.
    pub fn take_pause(&mut self) -> Option<Time> {
        self.paused_until.take()
    }

    fn input(&mut self, now: Time) {
        debug_assert!(now >= self.now, "the node's clock went back");
        self.now = self.now.max(now);
        self.unprepared = true;
    }

    // ---- datagrams ----

    /// A datagram from `from`. One from an address that is no configured daemon, or that its
    /// link refuses (forged, altered, replayed: docs/links.md), or that does not decode, is
    /// dropped and counted, and changes nothing. The datagram is opened in place, and the client
    /// messages it carries keep views of it: the driver hands over a buffer not much larger than
    /// the datagram, since each message keeps all of it.
    pub fn handle_datagram(&mut self, now: Time, from: SocketAddr, mut datagram: BytesMut) {
        self.input(now);
        let m = &self.metrics;
        m.bytes_received.fetch_add(datagram.len() as u64, Relaxed);
        let Some(&peer) = self.by_addr.get(&from) else {
            m.bad_datagrams.fetch_add(1, Relaxed);
            m.peer_refused("unknown", "unknown_sender");
            self.refusal_log
                .note(self.now, "unknown", "unknown_sender", true);
            return;
        };
        if !self.faults.accept(self.me, peer) {
            m.fault_drops.fetch_add(1, Relaxed);
            return;
        }
        let name = &self.peer_names[(peer - 1) as usize];
        let body = match self.links.open(self.now, peer, &mut datagram) {
            Ok(Opened::Data(range)) => datagram.freeze().slice(range),
            Ok(Opened::Control) => return,
            Err(e) => {
                m.bad_datagrams.fetch_add(1, Relaxed);
                m.peer_refused(name, e.name());
                self.refusal_log.note(self.now, name, e.name(), e.hostile());
                return;
            }
        };
        let (now, me) = (self.now, self.me);
        let daemon = &mut self.daemon;
        let r = self
            .reassembly
            .entry(peer)
            .or_default()
            .push_each(&body, |packet| {
                trace_membership(me, peer, &packet);
                m.packets_to_core.fetch_add(1, Relaxed);
                match daemon.handle_packet(now, peer, &packet) {
                    Ok(()) => {
                        m.packets_received.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        m.bad_datagrams.fetch_add(1, Relaxed);
                        m.peer_refused(name, e.name());
                        tracing::debug!(peer, error = %e, "packet refused");
                    }
                }
            });
        if let Err(e) = r {
            m.bad_datagrams.fetch_add(1, Relaxed);
            m.peer_refused(name, "bad_datagram");
            tracing::debug!(peer, error = %e, "bad datagram");
        }
    }

    /// The link layer (its epoch and what it knows of its peers').
    pub fn links(&self) -> &Links {
        &self.links
    }

    // ---- timers ----

    /// When [`Node::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Time> {
        let core = self.daemon.poll_timeout();
        let delayed = self.delayed.peek().map(|Reverse((t, ..))| *t);
        let session = self.deadlines.first().map(|(t, _)| *t);
        [core, delayed, session, self.resume_at, self.acks_due]
            .into_iter()
            .flatten()
            .min()
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.input(now);
        let now = self.now;
        while self
            .delayed
            .peek()
            .is_some_and(|Reverse((t, ..))| *t <= now)
        {
            let Reverse((_, _, to, d)) = self.delayed.pop().expect("peeked");
            self.send_datagram(to, d);
        }
        if self.daemon.poll_timeout().is_some_and(|t| t <= now) {
            self.daemon.handle_timeout(now);
        }
        while let Some(&(t, id)) = self.deadlines.first() {
            if t > now {
                break;
            }
            self.deadlines.remove(&(t, id));
            if let Some(sp) = self.sessions.get(&id).and_then(|s| s.spread.as_deref()) {
                if sp.paused {
                    // Its input full, and none of it taken for the time a request may take.
                    self.metrics.closed_limits.fetch_add(1, Relaxed);
                }
                // As Spread does: the connection closes, with nothing sent.
                self.close(id, None);
                continue;
            }
            let connected = self.sessions.get(&id).is_some_and(|s| s.client.is_some());
            let reason = if connected {
                "a request did not arrive in time"
            } else {
                "no connect request in time"
            };
            self.refuse_next(id, Refusal::Timeout, reason.to_owned());
            self.close(id, None);
        }
    }

    // ---- sessions ----

    /// A client connection opened; it must connect within the handshake time. Past the
    /// connection limit it is refused, and the driver closes it.
    pub fn open_session(&mut self, now: Time, id: SessionId) -> Result<(), NodeError> {
        self.open_bound_session(now, id, None)
    }

    /// A client connection opened over TLS, `binding` its channel binding (the exporter of
    /// [`conclave_wire::client::TLS_EXPORTER_LABEL`]): a client that proves its name signs it,
    /// so the proof holds for this connection alone.
    pub fn open_bound_session(
        &mut self,
        now: Time,
        id: SessionId,
        binding: Option<[u8; 32]>,
    ) -> Result<(), NodeError> {
        self.input(now);
        if id == DAEMONS_MEMBER {
            return Err(NodeError::SessionExists(id));
        }
        let max = self.cfg.sessions.max_connections;
        if self.sessions.len() >= max {
            return Err(NodeError::TooManyConnections { max });
        }
        if self.sessions.contains_key(&id) {
            return Err(NodeError::SessionExists(id));
        }
        let mut session = Session::new();
        session.binding = binding;
        self.sessions.insert(id, session);
        self.metrics
            .connections
            .store(self.sessions.len() as u64, Relaxed);
        let deadline = self.now + Duration::from_millis(self.cfg.sessions.handshake_ms);
        self.set_deadline(id, Some(deadline));
        Ok(())
    }

    /// Bytes a connection sent. Complete requests are handled at once, each one's replies framed
    /// before the next is handled; the start of an incomplete one is kept, within a request's
    /// size and the node's budget for incomplete requests, and must complete within
    /// `request_ms`.
    pub fn handle_session_bytes(&mut self, now: Time, id: SessionId, bytes: &[u8]) {
        self.session_bytes(now, id, bytes, None)
    }

    /// [`Node::handle_session_bytes`] of a buffer the node may keep views of: the payloads of
    /// the messages in it are not copied out (the driver reads into a buffer of its own, and a
    /// copy per message cost the daemon an allocation and a cold line or two).
    pub fn handle_session_shared(&mut self, now: Time, id: SessionId, bytes: &Bytes) {
        self.session_bytes(now, id, bytes, Some(bytes))
    }

    fn session_bytes(&mut self, now: Time, id: SessionId, bytes: &[u8], shared: Option<&Bytes>) {
        self.input(now);
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.spread.is_some() {
            return self.spread_bytes(id, bytes);
        }
        let mut input = std::mem::take(&mut s.input);
        let had = input.len();
        self.incomplete_bytes -= had;
        let mut rest = bytes;
        let mut used = 0;
        if !input.is_empty() {
            // The request begun earlier takes only the bytes it lacks (its length's, then its
            // body's); the rest is read where it lies.
            loop {
                let lacks = missing(&input);
                if lacks == 0 || rest.is_empty() {
                    break;
                }
                let take = lacks.min(rest.len());
                input.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
            }
            if missing(&input) == 0 {
                let Some(n) = self.requests(id, &input, None) else {
                    return;
                };
                input.drain(..n);
                used += n;
            }
        }
        if input.is_empty() {
            let Some(n) = self.requests(id, rest, shared) else {
                return;
            };
            input.extend_from_slice(&rest[n..]);
            used += n;
        } else {
            // Still incomplete: every byte went into it.
            debug_assert!(rest.is_empty());
        }
        let now = self.now;
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        let connected = s.client.is_some();
        let left = input.len();
        s.input = input;
        self.incomplete_bytes += left;
        if connected {
            if left == 0 {
                self.set_deadline(id, None);
            } else if had == 0 || used > 0 {
                // A new request began: it has `request_ms` to arrive whole.
                self.set_deadline(
                    id,
                    Some(now + Duration::from_millis(self.cfg.sessions.request_ms)),
                );
            }
        }
        self.metrics
            .incomplete_bytes
            .store(self.incomplete_bytes as u64, Relaxed);
        if left > 0 && self.incomplete_bytes > self.cfg.sessions.max_incomplete_bytes {
            self.metrics.closed_limits.fetch_add(1, Relaxed);
            self.refuse_next(
                id,
                Refusal::Overloaded,
                "the daemon holds too many incomplete requests".into(),
            );
            self.close(id, None);
        }
    }

    /// Handles the complete requests at the start of `stream`; the bytes they took, or `None` if
    /// the session ended.
    fn requests(&mut self, id: SessionId, stream: &[u8], shared: Option<&Bytes>) -> Option<usize> {
        let mut used = 0;
        loop {
            match next_request(&stream[used..], shared) {
                Ok(None) => return Some(used),
                Ok(Some((req, n))) => {
                    used += n;
                    if let Some(s) = self.sessions.get_mut(&id) {
                        s.requests += 1;
                    }
                    self.request(id, req);
                    // Its events are framed now: a client's replies keep the order of its
                    // requests (a refusal of the next one comes after them), and a
                    // disconnection in the same pass does not lose them.
                    self.client_events();
                    if !self.sessions.contains_key(&id) {
                        return None;
                    }
                }
                Err(e) => {
                    // The request that could not be read counts as the connection's next.
                    self.refuse_next(id, Refusal::BadRequest, e.to_string());
                    self.close(id, None);
                    return None;
                }
            }
        }
    }

    /// [`Node::handle_session_written`] of one output written whole: its buffer is given back
    /// and its views let go.
    pub fn handle_frames_written(&mut self, id: SessionId, frames: Frames, replies: usize) {
        let len = frames.len();
        self.handle_session_written(id, len, replies, [frames.into_buffer()]);
    }

    /// The driver wrote `bytes` holding `replies` replies of a connection's output, and may give
    /// back the buffers they came in, to frame into again.
    pub fn handle_session_written(
        &mut self,
        id: SessionId,
        bytes: usize,
        replies: usize,
        spare: impl IntoIterator<Item = Vec<u8>>,
    ) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        s.unwritten_bytes = s.unwritten_bytes.saturating_sub(bytes);
        s.unwritten_replies = s.unwritten_replies.saturating_sub(replies);
        for b in spare {
            s.give_back(b);
        }
    }

    /// The connection ended (the client closed it, or writing to it failed): its client leaves
    /// every group.
    pub fn close_session(&mut self, now: Time, id: SessionId) {
        self.input(now);
        // What the core did for the client before (a waiting message of its accepted) is told
        // and recorded while its session is still there.
        self.client_events();
        self.close(id, None);
    }

    /// Every client is told, and its session closed (an admin `shutdown`).
    pub fn shutdown(&mut self, now: Time) {
        self.input(now);
        let mut ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.close(id, Some("the daemon is shutting down"));
        }
    }

    fn set_deadline(&mut self, id: SessionId, at: Option<Time>) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if let Some(old) = s.deadline.take() {
            self.deadlines.remove(&(old, id));
        }
        if let Some(at) = at {
            s.deadline = Some(at);
            self.deadlines.insert((at, id));
        }
    }

    fn next_client_inc(&mut self) -> u32 {
        let stamp = crate::stamp(self.clock_base_us + self.now.as_micros());
        self.last_client_inc = stamp.max(self.last_client_inc + 1);
        self.last_client_inc
    }

    fn request(&mut self, id: SessionId, req: Request) {
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        let now = self.now;
        match (req, s.client.is_some()) {
            (Request::Connect { .. }, false) if s.challenged.is_some() => {
                let reason = "a proof of the name is due, not another connect".to_owned();
                self.refuse(id, Refusal::BadRequest, reason);
                self.close(id, None);
            }
            (Request::Connect { name }, false) => {
                let q = match qualified_name(&name, &self.name) {
                    Ok(q) => q,
                    Err(reason) => {
                        self.refuse(id, Refusal::BadName, reason);
                        self.close(id, None);
                        return;
                    }
                };
                if self.client_keys.contains_key(&name) {
                    // A name the daemons know a key for is proven before it is taken.
                    let mut nonce = [0u8; 32];
                    // Node::new refuses listed clients without a generator of secrets.
                    let Some(rng) = self.nonces.as_mut() else {
                        return;
                    };
                    rng.fill_bytes(&mut nonce);
                    if let Some(s) = self.sessions.get_mut(&id) {
                        s.challenged = Some((name, nonce));
                    }
                    self.reply(id, Reply::Challenge { name: q, nonce });
                } else if self.cfg.sessions.require_client_keys {
                    self.metrics.client_proofs_refused.fetch_add(1, Relaxed);
                    let reason =
                        format!("no [[client]] names {name:?}: only known clients connect");
                    self.refuse(id, Refusal::NotAllowed, reason);
                    self.close(id, None);
                } else {
                    self.admit(id, q);
                }
            }
            (Request::Prove { signature }, false) if s.challenged.is_some() => {
                let Some((name, nonce, binding)) = self
                    .sessions
                    .get_mut(&id)
                    .and_then(|s| Some((s.challenged.take()?, s.binding)))
                    .map(|((n, c), b)| (n, c, b))
                else {
                    return;
                };
                let q = qualified_name(&name, &self.name).unwrap_or_default();
                let proven = self.client_keys.get(&name).is_some_and(|key| {
                    key.verify(
                        &conclave_wire::client::proof_message(&q, &nonce, binding.as_ref()),
                        &signature,
                    )
                    .is_ok()
                });
                if proven {
                    self.admit(id, q);
                } else {
                    self.metrics.client_proofs_refused.fetch_add(1, Relaxed);
                    let reason = format!("the proof of {name:?} does not verify under its key");
                    self.refuse(id, Refusal::NotAllowed, reason);
                    self.close(id, None);
                }
            }
            (Request::Prove { .. }, true) => {
                self.refuse(id, Refusal::AlreadyConnected, "already connected".into());
            }
            (Request::Connect { .. }, true) => {
                self.refuse(id, Refusal::AlreadyConnected, "already connected".into());
            }
            (_, false) => {
                self.refuse(
                    id,
                    Refusal::BadRequest,
                    "the first request must be a connect".into(),
                );
                self.close(id, None);
            }
            (Request::Command(cmd), true) => {
                if let Some(g) = reserved_group(&cmd) {
                    self.refuse_reserved(id, g);
                    return;
                }
                let client = private_name(s.client.as_ref());
                if let Err(d) = Access::new(&self.cfg.access).command(client, &cmd) {
                    self.refuse_access(id, d);
                    return;
                }
                let is_msg = matches!(cmd, ClientCommand::Multicast { .. });
                let mut cmd = cmd;
                self.reseal_outgoing(id, &mut cmd);
                match self.daemon.handle_client(now, id, cmd) {
                    Ok(()) => {
                        if is_msg {
                            self.metrics.messages_accepted.fetch_add(1, Relaxed);
                        }
                    }
                    Err(e) => self.refuse(id, e.refusal(), e.to_string()),
                }
            }
            (Request::Disconnect, true) => self.close(id, None),
            (Request::Keys { group }, true) => {
                let client = private_name(s.client.as_ref());
                if is_reserved_group(&group) {
                    self.refuse_reserved(id, &group);
                } else if let Err(d) = Access::new(&self.cfg.access).join(client, &group) {
                    self.refuse_access(id, d);
                } else if self.servers.is_none() {
                    let reason = "this daemon has no identity, so no daemons' key to derive \
                                  group keys from"
                        .to_owned();
                    self.refuse(id, Refusal::NotAllowed, reason);
                } else if let Some(s) = self.sessions.get_mut(&id) {
                    // As many as the groups a client may be in: the map is the session's to keep.
                    let max = self.cfg.core.max_groups_per_client;
                    if s.keyed.len() >= max && !s.keyed.contains_key(group.as_str()) {
                        let reason = format!("keys asked for {max} groups already");
                        self.refuse(id, Refusal::TooManyGroups, reason);
                    } else {
                        s.keyed.entry(group.into()).or_insert(None);
                    }
                }
            }
        }
    }

    /// Connects session `id` as client `q` (its qualified name), proven if it had to be.
    fn admit(&mut self, id: SessionId, q: String) {
        if let Err(e) = self.daemon.connect(id, &q) {
            self.refuse(id, e.refusal(), e.to_string());
            self.close(id, None);
            return;
        }
        let inc = self.next_client_inc();
        if let Some(s) = self.sessions.get_mut(&id) {
            s.client = Some((q.clone(), inc));
        }
        self.set_deadline(id, None);
        self.metrics.clients.fetch_add(1, Relaxed);
        self.reply(id, Reply::Connected { name: q });
    }

    /// Refuses the request of `id` handled last.
    fn refuse(&mut self, id: SessionId, code: Refusal, reason: String) {
        let Some(request) = self.sessions.get(&id).map(|s| s.requests) else {
            return;
        };
        self.metrics.refusals.fetch_add(1, Relaxed);
        self.reply(
            id,
            Reply::Refused {
                request,
                code,
                reason,
            },
        );
    }

    /// Refuses the request of `id` handled last, which named a group of the daemons' own.
    fn refuse_reserved(&mut self, id: SessionId, group: &str) {
        let reason = format!("group {group:?}: names beginning with '#' are the daemons'");
        self.refuse(id, Refusal::NotAllowed, reason);
    }

    /// Refuses the request of `id` handled last, which the access policy forbids.
    fn refuse_access(&mut self, id: SessionId, d: crate::access::Denied) {
        self.metrics.access_refusals.fetch_add(1, Relaxed);
        self.refuse(id, Refusal::NotAllowed, d.to_string());
    }

    /// Refuses the request of `id` that did not arrive, or could not be read.
    fn refuse_next(&mut self, id: SessionId, code: Refusal, reason: String) {
        if let Some(s) = self.sessions.get_mut(&id) {
            s.requests += 1;
        }
        self.refuse(id, code, reason);
    }

    /// Queues a reply, framed at once; the session's replies are handed out together when the
    /// outputs are drained. A client whose unwritten replies pass the limits (it does not read)
    /// is disconnected.
    fn reply(&mut self, id: SessionId, r: Reply) {
        self.frame(id, |out| r.frame_into(out));
    }

    /// [`Node::reply`], for a reply `frame_into` appends in its frame.
    fn frame(&mut self, id: SessionId, frame_into: impl FnOnce(&mut Vec<u8>)) {
        self.frame_pieces(id, |out, _| frame_into(out.bytes_mut()));
    }

    /// [`Node::frame`] of a reply that may leave its payload where it lies, as a view counted in
    /// the node's budget.
    fn frame_pieces(
        &mut self,
        id: SessionId,
        frame_into: impl FnOnce(&mut Frames, &mut ViewBudget),
    ) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.nothing_pending() {
            self.dirty.push(id);
        }
        s.frame_sent_run();
        frame_into(&mut s.pending, &mut self.views);
        s.pending_replies += 1;
        self.check_unread(id);
    }

    /// Hands a session's framed replies out once they make a chunk, and disconnects a client
    /// whose unwritten replies pass the limits.
    fn check_unread(&mut self, id: SessionId) {
        let max_replies = self.cfg.sessions.max_unread_per_client;
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        let bytes = s.unwritten_bytes + s.pending.len();
        let replies = s.unwritten_replies + s.pending_replies;
        if bytes > MAX_UNREAD_BYTES || replies > max_replies {
            s.pending.clear();
            s.pending_replies = 0;
            s.sent_run = None;
            self.slow(id);
        } else if s.pending.len() >= CHUNK_BYTES || s.pending_replies >= max_replies / 2 {
            self.flush_session(id);
        }
    }

    fn slow(&mut self, id: SessionId) {
        self.metrics.closed_slow_clients.fetch_add(1, Relaxed);
        tracing::info!(session = id, "a client that does not read is disconnected");
        self.close(id, None);
    }

    /// Hands every session's framed replies out, but for a session with nothing but one
    /// acknowledgement: that waits for another reply to its client (usually the delivery of the
    /// message it acknowledges) or until `ack_delay_us` after the first such wait began. Woken
    /// for an acknowledgement alone, a sender took a processor from the daemons while its
    /// message was on its way.
    fn flush_replies(&mut self) {
        let delay = self.cfg.sessions.ack_delay_us;
        let due = delay == 0 || self.acks_due.is_some_and(|t| t <= self.now);
        let mut waiting = Vec::new();
        for id in std::mem::take(&mut self.dirty) {
            if !due
                && self
                    .sessions
                    .get(&id)
                    .is_some_and(Session::only_a_lone_acknowledgement)
            {
                waiting.push(id);
            } else {
                self.flush_session(id);
            }
        }
        // A session handed out mid-pass (a chunk's worth framed) and pushed again is here twice.
        waiting.sort_unstable();
        waiting.dedup();
        self.acks_due = match (waiting.is_empty(), self.acks_due) {
            (true, _) => None,
            (false, None) => Some(self.now + Duration::from_micros(delay)),
            (false, due_at) => due_at,
        };
        self.dirty.extend(waiting);
    }

    fn flush_session(&mut self, id: SessionId) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.nothing_pending() {
            return;
        }
        s.frame_sent_run();
        // The next pass likely frames as much: room for it saves growing the buffer step by step.
        let copied = s.pending.copied_len();
        let room = (copied + copied / 4).min(CHUNK_ROOM);
        let fresh = Frames::from_vec(s.buffer(room));
        let frames = std::mem::replace(&mut s.pending, fresh);
        let n = std::mem::take(&mut s.pending_replies);
        s.unwritten_bytes += frames.len();
        s.unwritten_replies += n;
        self.session_out
            .push_back((id, SessionOutput::Bytes(frames, n)));
    }

    /// Ends a session: its client leaves every group, and the connection closes once what is
    /// queued for it is written.
    fn close(&mut self, id: SessionId, reason: Option<&str>) {
        let spread = self.sessions.get(&id).is_some_and(|s| s.spread.is_some());
        if let (Some(reason), false) = (reason, spread) {
            self.reply(
                id,
                Reply::Event(ClientEvent::Closed {
                    reason: reason.to_owned(),
                }),
            );
        }
        self.flush_session(id);
        self.set_deadline(id, None);
        let Some(s) = self.sessions.remove(&id) else {
            return;
        };
        self.paused.remove(&id);
        self.incomplete_bytes -= match s.spread.as_deref() {
            Some(sp) => sp.counted,
            None => s.input.len(),
        };
        self.metrics
            .incomplete_bytes
            .store(self.incomplete_bytes as u64, Relaxed);
        self.metrics
            .connections
            .store(self.sessions.len() as u64, Relaxed);
        self.session_out.push_back((id, SessionOutput::Close));
        if let Some((name, inc)) = s.client {
            self.metrics.clients.fetch_sub(1, Relaxed);
            let _ = self.daemon.disconnect(self.now, id);
            if let Some(r) = self.recorder.as_mut() {
                r.push(self.now, &name, inc, Event::Crash);
            }
        }
    }

    // ---- admin ----

    pub fn handle_admin(&mut self, now: Time, req: AdminRequest) -> AdminReply {
        self.input(now);
        let metrics = matches!(req, AdminRequest::Metrics);
        let r = self.admin(req);
        match r {
            Err(e) => AdminReply::error(e),
            Ok(()) if metrics => {
                let mut reply = AdminReply::ok();
                reply.metrics = Some(self.metrics.render());
                reply
            }
            Ok(()) => {
                let mut reply = AdminReply::ok();
                reply.status = Some(self.status());
                reply
            }
        }
    }

    fn admin(&mut self, req: AdminRequest) -> Result<(), String> {
        let peer_id = |cfg: &Config, p: &Option<String>| -> Result<Option<DaemonId>, String> {
            match p {
                None => Ok(None),
                Some(n) => cfg
                    .id_of(n)
                    .map(Some)
                    .ok_or_else(|| format!("no daemon {n:?}")),
            }
        };
        let set_link =
            |f: &mut Faults, peer: Option<DaemonId>, edit: &dyn Fn(&mut LinkFaults)| match peer {
                None => edit(&mut f.all),
                Some(p) => {
                    let all = f.all.clone();
                    edit(f.links.entry(p).or_insert(all));
                }
            };
        match req {
            AdminRequest::Status | AdminRequest::Metrics => {}
            AdminRequest::Partition { sets } => {
                self.faults.partition = Some(self.cfg.partition_sets(&sets)?);
            }
            AdminRequest::Heal => self.faults.partition = None,
            AdminRequest::Drop { rate, peer } => {
                let p = peer_id(&self.cfg, &peer)?;
                LinkFaults {
                    drop: rate,
                    ..Default::default()
                }
                .validate()?;
                set_link(&mut self.faults, p, &|l| l.drop = rate);
            }
            AdminRequest::Dup { rate, peer } => {
                let p = peer_id(&self.cfg, &peer)?;
                LinkFaults {
                    dup: rate,
                    ..Default::default()
                }
                .validate()?;
                set_link(&mut self.faults, p, &|l| l.dup = rate);
            }
            AdminRequest::Delay {
                ms,
                jitter_ms,
                peer,
            } => {
                let p = peer_id(&self.cfg, &peer)?;
                LinkFaults {
                    delay_ms: ms,
                    jitter_ms,
                    ..Default::default()
                }
                .validate()?;
                set_link(&mut self.faults, p, &|l| {
                    l.delay_ms = ms;
                    l.jitter_ms = jitter_ms;
                });
            }
            AdminRequest::Pause { ms } => {
                if ms > MAX_PAUSE_MS {
                    return Err(format!("a pause is at most {MAX_PAUSE_MS} ms"));
                }
                self.paused_until = Some(self.now + Duration::from_millis(ms));
            }
            AdminRequest::Clear => self.faults = Faults::default(),
            AdminRequest::Shutdown => self.stopping = true,
        }
        Ok(())
    }

    pub fn status(&self) -> Status {
        let ring = self.daemon.membership();
        let name = |id: DaemonId| {
            self.cfg
                .entry(id)
                .map(|e| e.name.clone())
                .unwrap_or_else(|| format!("#{id}"))
        };
        Status {
            daemon: self.name.clone(),
            incarnation: self.inc,
            phase: match ring.phase() {
                Phase::Operational => "operational",
                Phase::Gather => "gather",
                Phase::Commit => "commit",
                Phase::Recovery => "recovery",
            }
            .into(),
            ring: ring.ring().map(|r| format!("{}@{}", r.seq, name(r.rep))),
            members: ring.ring_members().into_iter().map(name).collect(),
            ready: self.daemon.ready(),
            clients: self
                .daemon
                .client_count()
                .saturating_sub(self.servers.is_some() as usize),
            groups: self.daemon.group_count(),
            daemons_key: self.daemons_key().map(|k| crate::admin::DaemonsKeyStatus {
                view: format!(
                    "{}@{}/{}",
                    k.view.ring.seq,
                    name(k.view.ring.rep),
                    k.view.index
                ),
                members: k.members.iter().map(|&m| name(m)).collect(),
                fingerprint: k.fingerprint.to_string(),
                peers_on_it: self.links.peers_on_ring_key(),
            }),
            connections: self.sessions.len(),
            faults: self.faults.active(),
            progress: ring.progress(),
            peer_refusals: self.metrics.peer_refusals().into_iter().fold(
                std::collections::BTreeMap::new(),
                |mut m, ((peer, reason), n)| {
                    m.entry(peer)
                        .or_insert_with(std::collections::BTreeMap::new)
                        .insert(reason.to_owned(), n);
                    m
                },
            ),
        }
    }

    // ---- outputs ----

    /// The next history record (with [`NodeOptions::record`]).
    pub fn poll_record(&mut self) -> Option<Record> {
        self.prepare();
        self.recorder.as_mut()?.pop()
    }

    /// The next output for a connection.
    pub fn poll_session(&mut self) -> Option<(SessionId, SessionOutput)> {
        self.prepare();
        self.session_out.pop_front()
    }

    /// The next datagram to send, and where.
    pub fn poll_datagram(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.prepare();
        self.datagrams.pop_front()
    }

    /// The datagram that passes the ring's token on, when the core's next packet is the token;
    /// nothing else is prepared. The driver sends it before it polls anything else: the next
    /// holder then has the token while this daemon frames its deliveries and encodes, packs and
    /// seals the messages of its visit (the Accelerated Ring's point, which a token packed with
    /// the first of those messages lost: at full load the next holder waited about 0.4 ms
    /// for it). A visit that answers retransmission requests sends those first, and the token
    /// goes packed after them, as before; so does a light visit's (`light_visit`: a few small
    /// messages, then the token), which then also waits for this pass's deliveries to be
    /// framed, a small cost at the light load where such visits happen. `None` also when the
    /// link cannot seal it yet (the peer's run is unknown: a hello goes with the step's other
    /// datagrams) or the injected faults drop or delay it; a duplicate the faults make goes with
    /// the other datagrams.
    pub fn poll_token(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        let token = |t: &Transmit| matches!(t.packet, Packet::Token(_));
        if !self.daemon.peek_transmit().is_some_and(token) {
            return None;
        }
        let queued = self.datagrams.len();
        let t = self.daemon.poll_transmit()?;
        self.send_packets(vec![t]);
        // Nothing but the token (and a duplicate of it) was queued here: hellos wait for the
        // step's other datagrams.
        if self.datagrams.len() > queued {
            self.datagrams.remove(queued)
        } else {
            None
        }
    }

    /// Gauges that are sums over every session or group, at most every [`GAUGE_PERIOD`].
    fn refresh_gauges(&mut self) {
        if self.gauges_at.is_some_and(|t| self.now < t + GAUGE_PERIOD) {
            return;
        }
        self.gauges_at = Some(self.now);
        let unread: usize = self.sessions.values().map(|s| s.unwritten_bytes).sum();
        self.metrics.unread_bytes.store(unread as u64, Relaxed);
        let groups = self.daemon.group_count() as u64;
        self.metrics.groups.store(groups, Relaxed);
        let dropped = self.daemon.sync_changes_dropped();
        self.metrics.sync_changes_dropped.store(dropped, Relaxed);
        let foreign = self.daemon.foreign_names();
        self.metrics.foreign_client_names.store(foreign, Relaxed);
        let keyed = self.links.peers_on_ring_key() as u64;
        self.metrics.links_on_daemons_key.store(keyed, Relaxed);
        let views = self.views.held() as u64;
        self.metrics.delivery_views.store(views, Relaxed);
    }

    /// Payloads of deliveries framed and not yet written (or dropped) that are views of the
    /// buffers they arrived in (crate::frames), all sessions together.
    pub fn delivery_views(&self) -> usize {
        self.views.held()
    }

    /// The core's outputs after the inputs since the last call: ring events recorded, client
    /// events framed into their sessions, packets packed into datagrams (through the faults).
    fn prepare(&mut self) {
        if !self.unprepared {
            return;
        }
        self.unprepared = false;
        self.refresh_gauges();
        while let Some(ev) = self.daemon.poll_ring_event() {
            let Some(r) = self.recorder.as_mut() else {
                break;
            };
            if let Some(e) = r.ring_event(&ev) {
                r.push(self.now, &self.name, self.inc, e);
            }
        }
        let ring = self.daemon.membership().ring();
        if ring.is_some() && ring != self.last_ring {
            self.last_ring = ring;
            self.metrics.views.fetch_add(1, Relaxed);
            tracing::info!(daemon = %self.name, ring = ?ring, members = ?self.daemon.membership().ring_members(), "new configuration");
        }
        self.resume_sessions();
        // A slow client closed while its replies are handed over leaves events for the others.
        loop {
            self.client_events();
            self.flush_replies();
            if !self.daemon.has_events() {
                break;
            }
        }
        self.transmit();
    }

    /// Everything the core has to send.
    fn transmit(&mut self) {
        let daemon = &mut self.daemon;
        let packets: Vec<Transmit> = std::iter::from_fn(|| daemon.poll_transmit()).collect();
        self.send_packets(packets);
        self.emit_hellos();
    }

    /// `packets` by destination, in order, in as few datagrams as will carry them.
    fn send_packets(&mut self, packets: Vec<Transmit>) {
        let n = self.peers.len();
        let mut per_peer: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
        for (at, t) in packets.iter().enumerate() {
            if let Packet::Token(tok) = &t.packet {
                if !tok.rtr.is_empty() {
                    self.metrics
                        .retransmit_requests
                        .fetch_add(tok.rtr.len() as u64, Relaxed);
                }
            }
            self.metrics.packets_sent.fetch_add(1, Relaxed);
            match t.to {
                Dest::One(d) if (d as usize) <= n && d > 0 => per_peer[d as usize].push(at),
                Dest::One(_) => {}
                Dest::AllOthers => {
                    for (d, list) in per_peer.iter_mut().enumerate().skip(1) {
                        if d as DaemonId != self.me {
                            list.push(at);
                        }
                    }
                }
            }
        }
        // A light visit's successor last (its messages, then the token): once it has the token
        // it may run before this daemon sends the others the messages that went ahead of it.
        // A token with messages after it (answered requests, then the visit's own) keeps its
        // place, as it should not wait behind the others' copies.
        let token_last = |l: &[usize]| {
            l.last()
                .is_some_and(|&i| matches!(packets[i].packet, Packet::Token(_)))
        };
        let mut order: Vec<usize> = (1..=n).collect();
        order.sort_by_key(|&p| token_last(&per_peer[p]));
        // Peers sent the same packets (a visit's messages go to all) share their datagrams:
        // encoded and packed once, copied whole for each further peer, sealed for each.
        let room = self.links.room();
        for peer in order {
            let list = std::mem::take(&mut per_peer[peer]);
            if list.is_empty() {
                continue;
            }
            let mut others = Vec::new();
            for (other, l) in per_peer.iter_mut().enumerate().skip(1) {
                if *l == list {
                    l.clear();
                    others.push(other as DaemonId);
                }
            }
            let chosen: Vec<&Packet> = list.iter().map(|&i| &packets[i].packet).collect();
            let datagrams = match pack_with(
                &chosen,
                |p| p.size_hint(),
                |p, w| p.encode_into(w),
                &mut self.frag_id,
                room,
            ) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "a packet too large to send");
                    continue;
                }
            };
            // The further peers' copies are sealed from the plaintext before it is sealed for
            // `peer` where it lies; `peer` still gets its datagrams first.
            let mut sealed: Vec<Vec<Vec<u8>>> = vec![Vec::new(); others.len() + 1];
            let now = self.now;
            for d in datagrams {
                for (k, &to) in others.iter().enumerate() {
                    let copy = self.links.seal_framed_copy(now, to, &d);
                    sealed[k + 1].extend(self.sealed_or_waiting(copy));
                }
                let d = self.links.seal_framed(now, peer as DaemonId, d);
                sealed[0].extend(self.sealed_or_waiting(d));
            }
            let to = std::iter::once(peer as DaemonId).chain(others);
            for (to, datagrams) in to.zip(sealed) {
                for d in datagrams {
                    self.emit(to, d);
                }
            }
        }
    }

    /// A datagram the link sealed; one it cannot seal yet (it waits for its hello) is counted.
    fn sealed_or_waiting(&self, d: Option<Vec<u8>>) -> Option<Vec<u8>> {
        if d.is_none() {
            self.metrics.link_waiting.fetch_add(1, Relaxed);
        }
        d
    }

    fn emit_hellos(&mut self) {
        while let Some((peer, d)) = self.links.poll_hello() {
            self.metrics.link_hellos.fetch_add(1, Relaxed);
            self.emit(peer, d);
        }
    }

    /// A datagram, as the link sealed it, through the injected faults: lost, duplicated (the
    /// same bytes, as a network duplicates them) or delayed.
    fn emit(&mut self, peer: DaemonId, d: Vec<u8>) {
        let copies = self.faults.send(self.me, peer, &mut self.rng);
        if copies.is_empty() {
            self.metrics.fault_drops.fetch_add(1, Relaxed);
        }
        let last = copies.len().saturating_sub(1);
        let mut d = Some(d);
        for (k, delay_ms) in copies.into_iter().enumerate() {
            let copy = if k == last {
                d.take().expect("one per copy")
            } else {
                d.clone().expect("one per copy")
            };
            if delay_ms == 0 {
                self.send_datagram(peer, copy);
            } else {
                self.delayed_seq += 1;
                let at = self.now + Duration::from_millis(delay_ms);
                self.delayed
                    .push(Reverse((at, self.delayed_seq, peer, copy)));
            }
        }
    }

    fn send_datagram(&mut self, peer: DaemonId, d: Vec<u8>) {
        let Some(&addr) = self.peers.get((peer as usize).wrapping_sub(1)) else {
            return;
        };
        self.metrics.bytes_sent.fetch_add(d.len() as u64, Relaxed);
        self.datagrams.push_back((addr, d));
    }

    fn client_events(&mut self) {
        // Counted here and added to the shared metric once per batch of events, not by an
        // atomic add per delivery.
        let mut delivered = 0;
        while let Some(ev) = self.daemon.poll_event() {
            let spread =
                |s: &IdMap<SessionId, Session>, id| s.get(&id).is_some_and(|s| s.spread.is_some());
            match ev {
                LocalEvent::Message(d) if spread(&self.sessions, d.client()) => {
                    self.spread_deliver(&d)
                }
                LocalEvent::SpreadView { client, view, sets } => {
                    self.record_event(client, &view);
                    self.spread_event(client, view, &sets);
                }
                // The bulk: framed from the ring's message, with nothing copied but the frame.
                LocalEvent::Message(d)
                    if self.recorder.is_none() && d.client() != DAEMONS_MEMBER =>
                {
                    delivered += 1;
                    self.deliver(&d)
                }
                ev => {
                    let (client, ev) = ev.into_event();
                    if client == DAEMONS_MEMBER {
                        self.servers_event(ev);
                    } else {
                        self.client_event(client, ev);
                    }
                }
            }
        }
        if delivered > 0 {
            self.metrics
                .messages_delivered
                .fetch_add(delivered, Relaxed);
        }
    }

    /// An event for the daemon's member of the daemons' group.
    fn servers_event(&mut self, ev: ClientEvent) {
        let Some(s) = self.servers.as_mut() else {
            return;
        };
        if let Some(r) = self.recorder.as_mut() {
            if let Some(e) = r.client_event(&member_name(&self.name), &ev) {
                r.push(self.now, &member_name(&self.name), self.inc, e);
            }
        }
        s.handle_event(ev);
        self.servers_pump();
    }

    /// The daemons' key agreement's commands, into the core; a key it agreed, to the links; its
    /// events, to the recorder.
    fn servers_pump(&mut self) {
        let Some(s) = self.servers.as_mut() else {
            return;
        };
        while let Some(cmd) = s.poll_command() {
            let multicast = matches!(cmd, ClientCommand::Multicast { .. });
            if let Err(e) = self.daemon.handle_client(self.now, DAEMONS_MEMBER, cmd) {
                tracing::warn!(error = %e, "the daemons' group refused a command of this daemon");
                // The layer accounts for multicasts that never went; nothing else is undone.
                if multicast {
                    s.command_refused();
                }
            }
        }
        let before = s.agreed();
        let groups_ring = s.groups_ring();
        let membership = self.daemon.membership();
        let (ring, ring_members) = (membership.ring(), membership.ring_members());
        s.update(self.now, &mut self.links, ring, &ring_members);
        if s.agreed() != before {
            self.metrics
                .daemons_keys
                .fetch_add(s.agreed() - before, Relaxed);
        }
        let new_groups_ring = s.groups_ring() != groups_ring;
        let me = member_name(&self.name);
        while let Some(c) = s.poll_consumed() {
            if let Some(r) = self.recorder.as_mut() {
                let e = r.consumed(&c);
                r.push(self.now, &me, self.inc, e);
            }
        }
        while let Some(ev) = s.poll_event() {
            if let Some(r) = self.recorder.as_mut() {
                if let Some(e) = r.secure_event(&ev) {
                    r.push(self.now, &me, self.inc, e);
                }
            }
        }
        if new_groups_ring {
            self.hand_waiting_keys();
        }
    }

    /// The keys of the views given to clients that asked for their groups' keys while the
    /// daemons of the views' ring had not agreed theirs.
    fn hand_waiting_keys(&mut self) {
        let Some(ring) = self.servers.as_ref().and_then(|s| s.groups_ring()) else {
            return;
        };
        // One pass over the waiting slots, taking those of the ring: after a configuration
        // change a daemon may owe its clients a key for each of thousands of groups. Each
        // session's slots are lent out for its pass, so that no group's name is copied.
        let ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for id in ids {
            let Some(mut keyed) = self
                .sessions
                .get_mut(&id)
                .map(|s| std::mem::take(&mut s.keyed))
            else {
                continue;
            };
            for (group, slot) in keyed.iter_mut() {
                let Some(view) = slot.filter(|v| v.ring == ring) else {
                    continue;
                };
                *slot = None;
                if let Some(key) = self.servers.as_ref().and_then(|s| s.group_key(group, view)) {
                    self.give_key(id, group, view, key);
                }
                if !self.sessions.contains_key(&id) {
                    // Closed for not reading: its other keys would go nowhere.
                    break;
                }
            }
            if let Some(s) = self.sessions.get_mut(&id) {
                s.keyed = keyed;
            }
        }
    }

    /// Hands session `id` the key of `view` of `group` if it can be derived now; else it waits
    /// for the daemons' key of the view's ring.
    fn hand_key(&mut self, id: SessionId, group: &str, view: conclave_wire::client::GroupViewId) {
        let key = self.servers.as_ref().and_then(|s| s.group_key(group, view));
        if let Some(slot) = self
            .sessions
            .get_mut(&id)
            .and_then(|s| s.keyed.get_mut(group))
        {
            *slot = if key.is_some() { None } else { Some(view) };
        }
        if let Some(key) = key {
            self.give_key(id, group, view, key);
        }
    }

    /// Gives session `id` the key of `view` of `group` (no longer waiting for it).
    fn give_key(
        &mut self,
        id: SessionId,
        group: &str,
        view: conclave_wire::client::GroupViewId,
        key: KeyBytes,
    ) {
        self.metrics.group_keys.fetch_add(1, Relaxed);
        if self
            .sessions
            .get(&id)
            .is_some_and(|s| !s.evs.is_empty() && s.evs.contains(group))
        {
            let k = conclave_crypto::GroupKey::from_bytes(key.0);
            self.old_keys.remember(self.now, group, view, k);
        }
        if let (Some(r), Some((client, inc))) = (
            self.recorder.as_mut(),
            self.sessions.get(&id).and_then(|s| s.client.as_ref()),
        ) {
            let e = r.group_key(group, view, &key);
            r.push(self.now, client, *inc, e);
        }
        self.frame(id, |out| {
            conclave_wire::client::frame_view_key_into(out, group, &view, &key)
        });
    }

    /// The daemons' key in force at this daemon.
    pub fn daemons_key(&self) -> Option<&crate::daemons_key::DaemonsKey> {
        self.servers.as_ref()?.current()
    }

    fn deliver(&mut self, d: &Delivery) {
        let id = d.client();
        let m = d.message();
        match self.resealed(id, m.group, m.sender, m.service, m.view, m.payload) {
            None => self.frame_pieces(id, |out, budget| {
                m.frame_head_into(out.bytes_mut());
                out.push_payload(d.payload(), budget);
            }),
            Some(payload) => self.frame(id, |out| {
                conclave_wire::client::MessageRef {
                    payload: &payload,
                    ..m
                }
                .frame_into(out)
            }),
        }
    }

    /// What session `id` gets instead of `payload`, a message of `group` delivered in `view`,
    /// if the message needs resealing (crate::reseal): only for EVS groups the client takes its
    /// keys from the daemons for, only for data sealed under another view's key.
    fn resealed(
        &mut self,
        id: SessionId,
        group: &str,
        sender: &str,
        service: conclave_wire::gcs::ServiceType,
        view: conclave_wire::client::GroupViewId,
        payload: &[u8],
    ) -> Option<Vec<u8>> {
        // No key kept: no session takes resealed messages (the common case, at no cost).
        if self.old_keys.is_empty() {
            return None;
        }
        let s = self.sessions.get(&id)?;
        if !s.evs.contains(group) || !s.keyed.contains_key(group) {
            return None;
        }
        let me = self.name.clone();
        self.reseal_to(&me, group, sender, service, view, payload)
    }

    /// `payload` resealed by `resealer` (this daemon's name, or its name for outgoing messages)
    /// under `view`'s key, if it was sealed under another view's.
    fn reseal_to(
        &mut self,
        resealer: &str,
        group: &str,
        sender: &str,
        service: conclave_wire::gcs::ServiceType,
        view: conclave_wire::client::GroupViewId,
        payload: &[u8],
    ) -> Option<Vec<u8>> {
        if conclave_secure::sealed_view(payload).is_none_or(|v| v == view) {
            return None;
        }
        let now = self.now;
        let servers = self.servers.as_ref();
        let derive = |v| {
            servers
                .and_then(|s| s.group_key(group, v))
                .map(|k| conclave_crypto::GroupKey::from_bytes(k.0))
        };
        let Some(key) = self.old_keys.get(now, group, view).or_else(|| derive(view)) else {
            self.metrics.reseals_failed.fetch_add(1, Relaxed);
            return None;
        };
        let r = conclave_secure::Resealing {
            alg: conclave_secure::SecureConfig::default().aead,
            group,
            sender,
            service,
            daemon: resealer,
            view,
            key: &key,
            counter: self.old_keys.next_counter(),
        };
        let old_keys = &mut self.old_keys;
        let got = conclave_secure::reseal(&r, payload, |v| {
            old_keys.get(now, group, v).or_else(|| derive(v))
        });
        match got {
            Ok(resealed) => {
                self.metrics.messages_resealed.fetch_add(1, Relaxed);
                Some(resealed)
            }
            Err(conclave_secure::ResealError::NotStale) => None,
            Err(_) => {
                self.metrics.reseals_failed.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// A message of client `id` to an EVS group it takes its keys from the daemons for, sealed
    /// under another view's key than the client's current one (it sent before it took the view
    /// in): resealed under the current one before it goes, since this daemon has both keys and
    /// the daemons elsewhere may hold neither.
    fn reseal_outgoing(&mut self, id: SessionId, cmd: &mut ClientCommand) {
        if self.old_keys.is_empty() {
            return;
        }
        let ClientCommand::Multicast {
            service,
            groups,
            payload,
        } = cmd
        else {
            return;
        };
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        let ([group], Some((client, _))) = (groups.as_slice(), s.client.as_ref()) else {
            return;
        };
        let Some(&view) = s.evs_views.get(group) else {
            return;
        };
        if !s.keyed.contains_key(group.as_str()) {
            return;
        }
        let (group, client) = (group.clone(), client.clone());
        let out = format!("{}+out", self.name);
        if let Some(resealed) = self.reseal_to(&out, &group, &client, *service, view, payload) {
            *payload = resealed.into();
        }
    }

    /// Records an event of a client's, if the node records.
    fn record_event(&mut self, id: SessionId, ev: &ClientEvent) {
        let Some((client, inc)) = self.sessions.get(&id).and_then(|s| s.client.as_ref()) else {
            return;
        };
        if let Some(r) = self.recorder.as_mut() {
            if let Some(e) = r.client_event(client, ev) {
                r.push(self.now, client, *inc, e);
            }
        }
    }

    fn client_event(&mut self, id: SessionId, mut ev: ClientEvent) {
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        if s.client.is_none() {
            return;
        }
        let spread = s.spread.is_some();
        self.record_event(id, &ev);
        if spread {
            return self.spread_event(id, ev, &[]);
        }
        let ev = match ev {
            ClientEvent::Message {
                ref group,
                ref sender,
                service,
                ref mut payload,
                view,
                ..
            } => {
                self.metrics.messages_delivered.fetch_add(1, Relaxed);
                if let Some(resealed) = self.resealed(id, group, sender, service, view, payload) {
                    *payload = resealed.into();
                }
                ev
            }
            ClientEvent::Joined { ref group, vs } => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    match vs {
                        false => s.evs.insert(group.clone()),
                        true => s.evs.remove(group),
                    };
                }
                ev
            }
            ClientEvent::View {
                ref group, view, ..
            } => {
                self.metrics.group_views.fetch_add(1, Relaxed);
                if let Some(s) = self.sessions.get_mut(&id).filter(|s| s.evs.contains(group)) {
                    s.evs_views.insert(group.clone(), view);
                }
                let keyed = self
                    .sessions
                    .get(&id)
                    .is_some_and(|s| s.keyed.contains_key(group.as_str()));
                if keyed {
                    let group = group.clone();
                    self.reply(id, Reply::Event(ev));
                    self.hand_key(id, &group, view);
                    return;
                }
                ev
            }
            ClientEvent::Left { ref group } => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.keyed.remove(group.as_str());
                    s.evs.remove(group);
                    s.evs_views.remove(group);
                }
                ev
            }
            // The client has its payload: the acknowledgement does not carry it back. A run of
            // them in a row goes as one reply.
            ClientEvent::Sent {
                group,
                service,
                view,
                ..
            } => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    if s.nothing_pending() {
                        self.dirty.push(id);
                    }
                    if s.sent(group, service, view) {
                        self.check_unread(id);
                    }
                }
                return;
            }
            ClientEvent::Closed { .. } => {
                self.reply(id, Reply::Event(ev));
                // The core has already disconnected it, and the Crash is recorded above.
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.client = None;
                }
                self.metrics.clients.fetch_sub(1, Relaxed);
                self.close(id, None);
                return;
            }
            ev => ev,
        };
        self.reply(id, Reply::Event(ev));
    }
}

/// The name a client connected with, without its daemon's suffix (what the access policy names).
fn private_name(client: Option<&(String, u32)>) -> &str {
    client
        .and_then(|(name, _)| name.split('#').next())
        .unwrap_or("")
}

/// A group of the daemons' own that a client's command names.
fn reserved_group(cmd: &ClientCommand) -> Option<&str> {
    match cmd {
        ClientCommand::Join { group, .. }
        | ClientCommand::Leave { group }
        | ClientCommand::FlushAck { group, .. } => Some(group.as_str()),
        ClientCommand::Multicast { groups, .. } => groups
            .iter()
            .map(String::as_str)
            .find(|g| is_reserved_group(g)),
    }
    .filter(|g| is_reserved_group(g))
}

/// The membership protocol's packets and the ring's wakes, at trace level, for following a ring
/// change in the logs (`RUST_LOG=conclave_node=trace`).
fn trace_membership(me: DaemonId, peer: DaemonId, packet: &[u8]) {
    if !tracing::enabled!(tracing::Level::TRACE) {
        return;
    }
    match Packet::decode(packet) {
        Ok(Packet::Join(j)) => tracing::trace!(
            me, peer, ring_seq = j.ring_seq, procs = ?j.procs, failed = ?j.failed, "join"
        ),
        Ok(Packet::Commit(c)) => tracing::trace!(
            me, peer, ring = ?c.ring, rotation = c.rotation,
            members = ?c.members.iter().map(|m| m.id).collect::<Vec<_>>(), "commit"
        ),
        Ok(Packet::MergeDetect { ring }) => tracing::trace!(me, peer, ?ring, "merge detect"),
        Ok(Packet::Wake { ring }) => tracing::trace!(me, peer, ?ring, "wake"),
        _ => {}
    }
}

/// Refused datagrams in the log: at most one line a second for each reason, with how many were
/// refused in between, so a flood cannot fill the disk.
#[derive(Default)]
struct RefusalLog {
    last: HashMap<&'static str, (Time, u64)>,
}

impl RefusalLog {
    const GAP: Duration = Duration::from_secs(1);

    fn note(&mut self, now: Time, peer: &str, reason: &'static str, hostile: bool) {
        let e = self.last.entry(reason).or_insert((Time::ZERO, 0));
        if e.1 > 0 && now < e.0 + Self::GAP {
            e.1 += 1;
            return;
        }
        let since = std::mem::replace(e, (now, 1)).1.saturating_sub(1);
        if hostile {
            tracing::warn!(
                peer,
                reason,
                more_since_last_line = since,
                "datagram refused"
            );
        } else {
            tracing::debug!(
                peer,
                reason,
                more_since_last_line = since,
                "datagram refused"
            );
        }
    }
}
