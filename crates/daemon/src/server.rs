//! The daemon's runtime: sockets, timers and tasks around the pure core ([`conclave_gcs::Daemon`]).
//!
//! One task owns the core and everything that touches its state: the UDP socket to the other
//! daemons, the faults to inject, the client sessions' queues and the recorder. Each input (a
//! datagram, a client request, an admin request, a timer) goes in with the time it arrived; after
//! each, the core's outputs are drained: client events first (recorded, then queued to their
//! sessions), then packets. Accepting connections, reading and writing clients' streams, the
//! admin and metrics endpoints run in tasks of their own and talk to the core over channels.

use crate::admin::{AdminReply, AdminRequest, Status, MAX_ADMIN_LINE};
use crate::config::{qualified_name, Config};
use crate::faults::{Faults, LinkFaults};
use crate::frag::{pack, Reassembly};
use crate::metrics::Metrics;
use crate::record::Recorder;
use crate::session::{self, Out, Unread};
use anyhow::Context;
use conclave_gcs::Dest;
use conclave_gcs::{ClientEvent, Daemon, Delivery, LocalEvent, Phase, RingEvent};
use conclave_history::Event;
use conclave_wire::client::{Reply, Request};
use conclave_wire::gcs::{DaemonId, Packet, RingId};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Most bytes queued for one client before it is disconnected for not reading.
pub const MAX_UNREAD_BYTES: usize = 64 << 20;
/// A session's framed replies go to its writer when the core's pass ends, or once they fill
/// this many bytes (or half the replies a client may leave unread). Handing them over every
/// 256 KiB was seen to cost the ring under heavy load (a daemon falsely suspected, 8 KiB messages
/// from five senders): the writers' wake-ups compete with the daemon cores.
const FLUSH_BYTES: usize = 4 << 20;
/// Longest pause `conclave admin pause` may ask for.
pub const MAX_PAUSE_MS: u64 = 60_000;
/// Requests waiting for the core, from all connections together.
const CORE_QUEUE: usize = 4096;

/// How a daemon is started, beyond its configuration.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Write the history (JSON lines) here.
    pub record: Option<PathBuf>,
    /// This run's incarnation; by default a clock reading, so that it grows at every restart.
    pub incarnation: Option<u32>,
    /// Seed of the fault injection's randomness (by default from the clock).
    pub seed: Option<u64>,
}

/// Tenths of a second since 2024: grows between two starts of a daemon and two connections of a
/// client name, unless they come within a tenth of a second.
pub fn stamp() -> u32 {
    let us = crate::record::wall_us();
    ((us / 100_000).saturating_sub(17_043_840_000)) as u32
}

pub(crate) enum ToCore {
    Open {
        id: u64,
        tx: mpsc::Sender<Out>,
        unread: Arc<Unread>,
    },
    Request {
        id: u64,
        req: Request,
    },
    /// The connection sent something undecodable (or nothing in time): refuse and close it.
    Garbage {
        id: u64,
        reason: String,
    },
    Gone {
        id: u64,
    },
    Admin {
        req: AdminRequest,
        reply: oneshot::Sender<AdminReply>,
    },
}

/// A running daemon.
pub struct Running {
    pub name: String,
    pub metrics: Arc<Metrics>,
    tx: mpsc::Sender<ToCore>,
    core: JoinHandle<anyhow::Result<()>>,
    tasks: Vec<JoinHandle<()>>,
    unix: Option<PathBuf>,
}

impl Running {
    pub async fn admin(&self, req: AdminRequest) -> AdminReply {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(ToCore::Admin { req, reply }).await.is_err() {
            return AdminReply::error("the daemon has stopped");
        }
        rx.await
            .unwrap_or_else(|_| AdminReply::error("the daemon has stopped"))
    }

    /// Closes every client session and stops.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.admin(AdminRequest::Shutdown).await;
        self.wait().await
    }

    /// Resolves when the daemon stops by itself (an admin `shutdown`); the daemon must then not
    /// be waited for again.
    pub async fn stopped(&mut self) -> anyhow::Result<()> {
        let r = (&mut self.core).await.context("the daemon's core task")?;
        linger().await;
        for t in &self.tasks {
            t.abort();
        }
        r
    }

    /// Waits until the daemon stops (an admin `shutdown`).
    pub async fn wait(self) -> anyhow::Result<()> {
        let r = self.core.await.context("the daemon's core task")?;
        linger().await;
        for t in &self.tasks {
            t.abort();
        }
        if let Some(p) = &self.unix {
            let _ = std::fs::remove_file(p);
        }
        r
    }
}

/// After the core stops, the connections' tasks get a moment to write what is queued (the
/// answer to an admin `shutdown`, the clients' `Closed`) before the process may exit.
async fn linger() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Binds the daemon's sockets and starts it.
pub async fn start(cfg: Config, name: &str, opts: Options) -> anyhow::Result<Running> {
    cfg.validate()?;
    let me = cfg
        .id_of(name)
        .with_context(|| format!("the configuration names no daemon {name:?}"))?;
    let entry = cfg.entry(me).expect("named").clone();
    let udp =
        bind_udp(entry.peer).with_context(|| format!("binding the peer address {}", entry.peer))?;
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = mpsc::channel(CORE_QUEUE);
    let mut tasks = Vec::new();
    let limits = cfg.limits.clone();
    let sessions = Sessions {
        core: tx.clone(),
        permits: Arc::new(Semaphore::new(limits.max_connections)),
        next_id: Arc::new(std::sync::atomic::AtomicU64::new(1)),
        metrics: metrics.clone(),
        queue: limits.max_unread_per_client,
        handshake: Duration::from_millis(limits.handshake_ms),
    };
    if let Some(addr) = entry.client {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the client address {addr}"))?;
        let sessions = sessions.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                match l.accept().await {
                    Ok((s, _)) => {
                        let _ = s.set_nodelay(true);
                        sessions.serve(s);
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }));
    }
    #[cfg(unix)]
    if let Some(path) = &entry.unix {
        // A socket file left by an earlier run that is no longer served.
        if std::os::unix::net::UnixStream::connect(path).is_err() {
            let _ = std::fs::remove_file(path);
        }
        let l = tokio::net::UnixListener::bind(path)
            .with_context(|| format!("binding the Unix socket {}", path.display()))?;
        let sessions = sessions.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                match l.accept().await {
                    Ok((s, _)) => sessions.serve(s),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }));
    }
    if let Some(addr) = entry.admin {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the admin address {addr}"))?;
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                if let Ok((s, _)) = l.accept().await {
                    tokio::spawn(admin_session(s, tx.clone()));
                }
            }
        }));
    }
    if let Some(addr) = entry.metrics {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics address {addr}"))?;
        let m = metrics.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                if let Ok((s, _)) = l.accept().await {
                    tokio::spawn(serve_metrics(s, m.clone()));
                }
            }
        }));
    }
    let names: Vec<String> = cfg.daemon.iter().map(|d| d.name.clone()).collect();
    let recorder = match &opts.record {
        Some(p) => Some(
            Recorder::create(p, names.clone())
                .with_context(|| format!("opening the history file {}", p.display()))?,
        ),
        None => None,
    };
    let inc = opts.incarnation.unwrap_or_else(stamp);
    let mut dcfg = cfg.daemon_config();
    dcfg.record_ring = recorder.is_some();
    let core = Core {
        me,
        name: name.to_owned(),
        inc,
        daemon: Daemon::new(dcfg, me, inc, 0),
        udp: Arc::new(udp),
        peers: cfg.daemon.iter().map(|d| d.peer).collect(),
        by_addr: cfg
            .daemon
            .iter()
            .enumerate()
            .map(|(i, d)| (d.peer, i as DaemonId + 1))
            .collect(),
        reassembly: HashMap::new(),
        frag_id: 0,
        faults: cfg.faults(),
        rng: ChaCha8Rng::seed_from_u64(opts.seed.unwrap_or_else(crate::record::wall_us)),
        delayed: BinaryHeap::new(),
        delayed_seq: 0,
        sessions: HashMap::new(),
        dirty: Vec::new(),
        by_name: HashMap::new(),
        metrics: metrics.clone(),
        recorder,
        start: Instant::now(),
        paused_until: None,
        last_stamp: 0,
        last_ring: None,
        stopping: false,
        gauges_at: Instant::now(),
        cfg,
    };
    tracing::info!(daemon = name, incarnation = inc, "started");
    let core = tokio::spawn(core.run(rx));
    Ok(Running {
        name: name.to_owned(),
        metrics,
        tx,
        core,
        tasks,
        unix: entry.unix,
    })
}

/// The socket to the other daemons, with buffers large enough for a token visit's burst (the
/// kernel caps them at its `rmem_max` and `wmem_max`): a datagram lost to a full buffer costs a
/// retransmission, and too many of them a storm.
fn bind_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    let _ = s.set_recv_buffer_size(UDP_BUFFER_BYTES);
    let _ = s.set_send_buffer_size(UDP_BUFFER_BYTES);
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    UdpSocket::from_std(s.into())
}

/// Asked of the kernel for each daemon socket's receive and send buffers.
const UDP_BUFFER_BYTES: usize = 4 << 20;

/// The membership protocol's packets, at trace level, for following a ring change in the logs
/// (`RUST_LOG=conclave_daemon=trace`).
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
        _ => {}
    }
}

/// What accepting a client connection needs, shared by the TCP and Unix listeners.
#[derive(Clone)]
struct Sessions {
    core: mpsc::Sender<ToCore>,
    permits: Arc<Semaphore>,
    next_id: Arc<std::sync::atomic::AtomicU64>,
    metrics: Arc<Metrics>,
    queue: usize,
    handshake: Duration,
}

impl Sessions {
    /// Runs a new connection's session, or closes it at once past the connection limit.
    fn serve<S>(&self, s: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return;
        };
        let id = self.next_id.fetch_add(1, Relaxed);
        let (core, m) = (self.core.clone(), self.metrics.clone());
        let (queue, handshake) = (self.queue, self.handshake);
        tokio::spawn(async move {
            m.connections.fetch_add(1, Relaxed);
            session::run(s, id, core, queue, handshake).await;
            m.connections.fetch_sub(1, Relaxed);
            drop(permit);
        });
    }
}

async fn admin_session(s: tokio::net::TcpStream, core: mpsc::Sender<ToCore>) {
    let (r, mut w) = s.into_split();
    let mut lines = BufReader::new(r.take(u64::MAX));
    let mut line = String::new();
    loop {
        line.clear();
        let mut limited = (&mut lines).take(MAX_ADMIN_LINE as u64 + 1);
        match limited.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let reply = if line.len() > MAX_ADMIN_LINE {
            AdminReply::error(format!("a request is at most {MAX_ADMIN_LINE} bytes"))
        } else {
            match serde_json::from_str::<AdminRequest>(line.trim()) {
                Err(e) => AdminReply::error(format!("bad request: {e}")),
                Ok(req) => {
                    let (reply, rx) = oneshot::channel();
                    if core.send(ToCore::Admin { req, reply }).await.is_err() {
                        return;
                    }
                    rx.await
                        .unwrap_or_else(|_| AdminReply::error("the daemon has stopped"))
                }
            }
        };
        let mut out = serde_json::to_vec(&reply).expect("replies serialize");
        out.push(b'\n');
        if w.write_all(&out).await.is_err() || line.len() > MAX_ADMIN_LINE {
            return;
        }
    }
}

async fn serve_metrics(mut s: tokio::net::TcpStream, m: Arc<Metrics>) {
    let mut buf = [0u8; 4096];
    // The request itself does not matter; a client that sends nothing still gets its answer.
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
    let body = m.render();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// A datagram held back by an injected delay: when it goes, a tie-breaker, to whom, what.
type Delayed = (Instant, u64, DaemonId, Vec<u8>);

struct Session {
    /// The client's qualified name, once connected.
    name: Option<String>,
    inc: u32,
    tx: mpsc::Sender<Out>,
    unread: Arc<Unread>,
    /// Replies framed since the core last handed this session's output to its writer.
    pending: Vec<u8>,
    pending_replies: usize,
}

struct Core {
    me: DaemonId,
    name: String,
    inc: u32,
    cfg: Config,
    daemon: Daemon,
    udp: Arc<UdpSocket>,
    peers: Vec<SocketAddr>,
    by_addr: HashMap<SocketAddr, DaemonId>,
    reassembly: HashMap<DaemonId, Reassembly>,
    frag_id: u32,
    faults: Faults,
    rng: ChaCha8Rng,
    /// Datagrams held back by an injected delay: when, tie-breaker, to whom, what.
    delayed: BinaryHeap<Reverse<Delayed>>,
    delayed_seq: u64,
    sessions: HashMap<u64, Session>,
    /// Sessions with replies framed and not yet handed to their writers.
    dirty: Vec<u64>,
    by_name: HashMap<String, u64>,
    metrics: Arc<Metrics>,
    recorder: Option<Recorder>,
    start: Instant,
    paused_until: Option<Instant>,
    last_stamp: u32,
    last_ring: Option<RingId>,
    stopping: bool,
    /// When the gauges that are sums over sessions and groups were last refreshed.
    gauges_at: Instant,
}

impl Core {
    /// The core's clock: microseconds since the daemon started.
    fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    async fn run(mut self, mut rx: mpsc::Receiver<ToCore>) -> anyhow::Result<()> {
        let udp = self.udp.clone();
        let mut buf = vec![0u8; 65_536];
        while !self.stopping {
            if let Some(until) = self.paused_until.take() {
                tokio::time::sleep_until(until).await;
            }
            let wake = self.next_wake();
            tokio::select! {
                r = udp.recv_from(&mut buf) => {
                    if let Ok((n, from)) = r {
                        self.datagram(&buf[..n], from);
                    }
                    // Take in what else has arrived before answering.
                    for _ in 0..64 {
                        match udp.try_recv_from(&mut buf) {
                            Ok((n, from)) => self.datagram(&buf[..n], from),
                            Err(_) => break,
                        }
                    }
                }
                m = rx.recv() => match m {
                    Some(m) => {
                        self.message(m);
                        // Every request already waiting is handled before the core's outputs
                        // are drained: one pass over them (and one write per client) for many.
                        for _ in 0..256 {
                            match rx.try_recv() {
                                Ok(m) => self.message(m),
                                Err(_) => break,
                            }
                        }
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(wake) => self.timers(),
            }
            self.drain().await;
        }
        // Clean shutdown: every client is told.
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        for id in ids {
            self.close(id, Some("the daemon is shutting down"));
        }
        if let Some(r) = self.recorder.as_mut() {
            r.flush();
        }
        tracing::info!(daemon = %self.name, "stopped");
        Ok(())
    }

    fn next_wake(&self) -> Instant {
        let core = self
            .daemon
            .poll_timeout()
            .map(|us| self.start + Duration::from_micros(us));
        let delayed = self.delayed.peek().map(|Reverse((t, ..))| *t);
        [core, delayed]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }

    fn datagram(&mut self, d: &[u8], from: SocketAddr) {
        let m = &self.metrics;
        m.bytes_received.fetch_add(d.len() as u64, Relaxed);
        let Some(&peer) = self.by_addr.get(&from) else {
            m.bad_datagrams.fetch_add(1, Relaxed);
            return;
        };
        if !self.faults.accept(self.me, peer) {
            m.fault_drops.fetch_add(1, Relaxed);
            return;
        }
        let now = self.now();
        let me = self.me;
        let daemon = &mut self.daemon;
        let r = self
            .reassembly
            .entry(peer)
            .or_default()
            .push_each(d, |packet| {
                trace_membership(me, peer, packet);
                match daemon.handle_packet(now, peer, packet) {
                    Ok(()) => {
                        m.packets_received.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        m.bad_datagrams.fetch_add(1, Relaxed);
                        tracing::debug!(peer, error = %e, "bad packet");
                    }
                }
            });
        if let Err(e) = r {
            m.bad_datagrams.fetch_add(1, Relaxed);
            tracing::debug!(peer, error = %e, "bad datagram");
        }
    }

    fn timers(&mut self) {
        let now_i = Instant::now();
        while self
            .delayed
            .peek()
            .is_some_and(|Reverse((t, ..))| *t <= now_i)
        {
            let Reverse((_, _, to, d)) = self.delayed.pop().expect("peeked");
            self.send_datagram(to, &d);
        }
        let now = self.now();
        if self.daemon.poll_timeout().is_some_and(|t| t <= now) {
            self.daemon.handle_timeout(now);
        }
    }

    fn message(&mut self, m: ToCore) {
        match m {
            ToCore::Open { id, tx, unread } => {
                self.sessions.insert(
                    id,
                    Session {
                        name: None,
                        inc: 0,
                        tx,
                        unread,
                        pending: Vec::new(),
                        pending_replies: 0,
                    },
                );
            }
            ToCore::Request { id, req } => {
                self.request(id, req);
                // Its events are framed now: a client's replies keep the order of its requests
                // (a refusal of the next one comes after them), and a disconnection in the same
                // pass does not lose them.
                self.client_events();
            }
            ToCore::Garbage { id, reason } => {
                self.reply(id, Reply::Refused { reason });
                self.close(id, None);
            }
            ToCore::Gone { id } => self.close(id, None),
            ToCore::Admin { req, reply } => {
                let r = self.admin(req);
                let _ = reply.send(r);
            }
        }
    }

    fn next_client_inc(&mut self) -> u32 {
        self.last_stamp = stamp().max(self.last_stamp + 1);
        self.last_stamp
    }

    fn request(&mut self, id: u64, req: Request) {
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        let now = self.now();
        match (req, s.name.clone()) {
            (Request::Connect { name }, None) => {
                let q = match qualified_name(&name, &self.name) {
                    Ok(q) => q,
                    Err(reason) => {
                        self.refuse(id, reason);
                        self.close(id, None);
                        return;
                    }
                };
                if let Err(e) = self.daemon.connect(&q) {
                    self.refuse(id, e.to_string());
                    self.close(id, None);
                    return;
                }
                let inc = self.next_client_inc();
                let s = self.sessions.get_mut(&id).expect("present");
                s.name = Some(q.clone());
                s.inc = inc;
                self.by_name.insert(q.clone(), id);
                self.metrics.clients.fetch_add(1, Relaxed);
                self.reply(id, Reply::Connected { name: q });
            }
            (Request::Connect { .. }, Some(_)) => {
                self.refuse(id, "already connected".into());
            }
            (_, None) => {
                self.refuse(id, "the first request must be a connect".into());
                self.close(id, None);
            }
            (Request::Command(cmd), Some(name)) => {
                let is_msg = matches!(cmd, conclave_wire::client::ClientCommand::Multicast { .. });
                match self.daemon.handle_client(now, &name, cmd) {
                    Ok(()) => {
                        if is_msg {
                            self.metrics.messages_accepted.fetch_add(1, Relaxed);
                        }
                    }
                    Err(e) => self.refuse(id, e.to_string()),
                }
            }
            (Request::Disconnect, Some(_)) => self.close(id, None),
        }
    }

    fn refuse(&mut self, id: u64, reason: String) {
        self.metrics.refusals.fetch_add(1, Relaxed);
        self.reply(id, Reply::Refused { reason });
    }

    /// Queues a reply, framed at once; the session's replies go to its writer together, once
    /// the core's outputs of this pass are drained ([`Core::flush_replies`]). A client whose
    /// unwritten replies pass the limits (it does not read) is disconnected.
    fn reply(&mut self, id: u64, r: Reply) {
        self.frame(id, |out| r.frame_into(out));
    }

    /// [`Core::reply`], for a reply `frame_into` appends in its frame.
    fn frame(&mut self, id: u64, frame_into: impl FnOnce(&mut Vec<u8>)) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.pending.is_empty() {
            self.dirty.push(id);
        }
        frame_into(&mut s.pending);
        s.pending_replies += 1;
        let bytes = s.unread.bytes.load(Relaxed) + s.pending.len();
        let replies = s.unread.replies.load(Relaxed) + s.pending_replies;
        if bytes > MAX_UNREAD_BYTES || replies > self.cfg.limits.max_unread_per_client {
            s.pending.clear();
            s.pending_replies = 0;
            self.slow(id);
        } else if s.pending.len() >= FLUSH_BYTES
            || s.pending_replies >= self.cfg.limits.max_unread_per_client / 2
        {
            // A long pass (a recovery's deliveries) lets the writer work meanwhile, and counts
            // against the limits only what it could not write.
            self.flush_session(id);
        }
    }

    fn slow(&mut self, id: u64) {
        self.metrics.closed_slow_clients.fetch_add(1, Relaxed);
        tracing::info!(session = id, "a client that does not read is disconnected");
        self.close(id, None);
    }

    /// Hands every session's framed replies to its writer.
    fn flush_replies(&mut self) {
        for id in std::mem::take(&mut self.dirty) {
            self.flush_session(id);
        }
    }

    fn flush_session(&mut self, id: u64) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.pending.is_empty() {
            return;
        }
        // The next pass likely frames as much: room for it saves growing the buffer step by step.
        let room = s.pending.len().min(64 * 1024);
        let frames = std::mem::replace(&mut s.pending, s.unread.buffer(room));
        let (bytes, n) = (frames.len(), std::mem::take(&mut s.pending_replies));
        // Counted before the writer can see them, which uncounts them once written.
        s.unread.bytes.fetch_add(bytes, Relaxed);
        s.unread.replies.fetch_add(n, Relaxed);
        if s.tx.try_send(Out::Frames(frames, n)).is_err() {
            s.unread.bytes.fetch_sub(bytes, Relaxed);
            s.unread.replies.fetch_sub(n, Relaxed);
            self.slow(id);
        }
    }

    /// Ends a session: its client leaves every group, and the connection closes once what is
    /// queued for it is written.
    fn close(&mut self, id: u64, reason: Option<&str>) {
        if let Some(reason) = reason {
            self.reply(
                id,
                Reply::Event(ClientEvent::Closed {
                    reason: reason.to_owned(),
                }),
            );
        }
        self.flush_session(id);
        let Some(s) = self.sessions.remove(&id) else {
            return;
        };
        let _ = s.tx.try_send(Out::Close);
        if let Some(name) = s.name {
            self.by_name.remove(&name);
            self.metrics.clients.fetch_sub(1, Relaxed);
            let now = self.now();
            // Already gone from the core if the core closed it.
            let _ = self.daemon.disconnect(now, &name);
            if let Some(r) = self.recorder.as_mut() {
                r.push(&name, s.inc, Event::Crash);
            }
        }
    }

    fn admin(&mut self, req: AdminRequest) -> AdminReply {
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
        let r: Result<(), String> = (|| {
            match req {
                AdminRequest::Status => {}
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
                    self.paused_until = Some(Instant::now() + Duration::from_millis(ms));
                }
                AdminRequest::Clear => self.faults = Faults::default(),
                AdminRequest::Shutdown => self.stopping = true,
            }
            Ok(())
        })();
        match r {
            Err(e) => AdminReply::error(e),
            Ok(()) => {
                let mut reply = AdminReply::ok();
                reply.status = Some(self.status());
                reply
            }
        }
    }

    fn status(&self) -> Status {
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
            clients: self.by_name.len(),
            groups: self.daemon.group_count(),
            connections: self.sessions.len(),
            faults: self.faults.active(),
            progress: ring.progress(),
        }
    }

    /// The core's outputs after an input: client events (recorded, then queued), then packets.
    /// Gauges that are sums over every session or group: refreshed at most ten times a second.
    fn refresh_gauges(&mut self) {
        if self.gauges_at.elapsed() < Duration::from_millis(100) {
            return;
        }
        self.gauges_at = Instant::now();
        let unread: usize = self
            .sessions
            .values()
            .map(|s| s.unread.bytes.load(Relaxed))
            .sum();
        self.metrics.unread_bytes.store(unread as u64, Relaxed);
        let groups = self.daemon.group_count() as u64;
        self.metrics.groups.store(groups, Relaxed);
    }

    async fn drain(&mut self) {
        self.refresh_gauges();
        while let Some(ev) = self.daemon.poll_ring_event() {
            let Some(r) = self.recorder.as_mut() else {
                break;
            };
            match ev {
                RingEvent::Configuration(c) => {
                    let names = |ids: &[DaemonId]| {
                        ids.iter()
                            .map(|&i| {
                                self.cfg
                                    .entry(i)
                                    .map(|e| e.name.clone())
                                    .unwrap_or_default()
                            })
                            .collect::<Vec<_>>()
                    };
                    let ev = Event::View {
                        group: String::new(),
                        view: r.ring_view(c.ring),
                        members: names(&c.members),
                        transitional: names(&c.transitional),
                    };
                    r.push(&self.name, self.inc, ev);
                }
                RingEvent::TransitionalSignal { .. } => {
                    r.push(
                        &self.name,
                        self.inc,
                        Event::TransSignal {
                            group: String::new(),
                        },
                    );
                }
                _ => {}
            }
        }
        let ring = self.daemon.membership().ring();
        if ring.is_some() && ring != self.last_ring {
            self.last_ring = ring;
            self.metrics.views.fetch_add(1, Relaxed);
            tracing::info!(daemon = %self.name, ring = ?ring, members = ?self.daemon.membership().ring_members(), "new configuration");
        }
        // A slow client closed while its replies are handed over leaves events for the others.
        loop {
            self.client_events();
            self.flush_replies();
            if !self.daemon.has_events() {
                break;
            }
        }
        if let Some(r) = self.recorder.as_mut() {
            r.flush();
        }
        // Everything the core has to send, by destination, in order; then as few datagrams as
        // will carry it.
        let n = self.peers.len();
        let mut encoded: Vec<Vec<u8>> = Vec::new();
        let mut per_peer: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
        let mut any = false;
        while let Some(t) = self.daemon.poll_transmit() {
            if let Packet::Token(tok) = &t.packet {
                if !tok.rtr.is_empty() {
                    self.metrics
                        .retransmit_requests
                        .fetch_add(tok.rtr.len() as u64, Relaxed);
                }
            }
            let at = encoded.len();
            encoded.push(t.packet.encode());
            self.metrics.packets_sent.fetch_add(1, Relaxed);
            any = true;
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
        if !any {
            return;
        }
        for (peer, packets) in per_peer.into_iter().enumerate().skip(1) {
            if packets.is_empty() {
                continue;
            }
            let peer = peer as DaemonId;
            let packets: Vec<&[u8]> = packets.iter().map(|&i| encoded[i].as_slice()).collect();
            let datagrams = match pack(&packets, &mut self.frag_id) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "a packet too large to send");
                    continue;
                }
            };
            for d in datagrams {
                let copies = self.faults.send(self.me, peer, &mut self.rng);
                if copies.is_empty() {
                    self.metrics.fault_drops.fetch_add(1, Relaxed);
                }
                for delay in copies {
                    if delay == 0 {
                        self.send_now(peer, &d).await;
                    } else {
                        self.delayed_seq += 1;
                        let at = Instant::now() + Duration::from_millis(delay);
                        self.delayed
                            .push(Reverse((at, self.delayed_seq, peer, d.clone())));
                    }
                }
            }
        }
    }

    fn client_events(&mut self) {
        while let Some(ev) = self.daemon.pop_event() {
            match ev {
                // The bulk: framed from the ring's message, with nothing copied but the frame.
                LocalEvent::Message(d) if self.recorder.is_none() => self.deliver(&d),
                ev => {
                    let (client, ev) = ev.into_event();
                    self.client_event(client, ev);
                }
            }
        }
    }

    fn deliver(&mut self, d: &Delivery) {
        let Some(&id) = self.by_name.get(d.client()) else {
            return;
        };
        self.metrics.messages_delivered.fetch_add(1, Relaxed);
        self.frame(id, |out| d.message().frame_into(out));
    }

    fn client_event(&mut self, client: String, ev: ClientEvent) {
        let Some(&id) = self.by_name.get(&client) else {
            return;
        };
        let inc = self.sessions.get(&id).map_or(0, |s| s.inc);
        if let Some(r) = self.recorder.as_mut() {
            if let Some(e) = r.client_event(&client, &ev) {
                r.push(&client, inc, e);
            }
        }
        let ev = match ev {
            ClientEvent::Message { .. } => {
                self.metrics.messages_delivered.fetch_add(1, Relaxed);
                ev
            }
            ClientEvent::View { .. } => {
                self.metrics.group_views.fetch_add(1, Relaxed);
                ev
            }
            // The client has its payload: the acknowledgement does not carry it back.
            ClientEvent::Sent {
                group,
                service,
                view,
                ..
            } => ClientEvent::Sent {
                group,
                service,
                payload: Default::default(),
                view,
            },
            ClientEvent::Closed { .. } => {
                self.reply(id, Reply::Event(ev));
                // The core has already disconnected it.
                if let Some(s) = self.sessions.get_mut(&id) {
                    if let Some(r) = self.recorder.as_mut() {
                        if let Some(n) = &s.name {
                            r.push(n, s.inc, Event::Crash);
                        }
                    }
                    s.name = None;
                }
                self.by_name.remove(&client);
                self.metrics.clients.fetch_sub(1, Relaxed);
                self.close(id, None);
                return;
            }
            ev => ev,
        };
        self.reply(id, Reply::Event(ev));
    }

    fn send_datagram(&mut self, peer: DaemonId, d: &[u8]) {
        let Some(&addr) = self.peers.get(peer as usize - 1) else {
            return;
        };
        self.metrics.bytes_sent.fetch_add(d.len() as u64, Relaxed);
        // A full socket buffer loses the datagram, as the network may: the ring retransmits.
        let _ = self.udp.try_send_to(d, addr);
    }

    async fn send_now(&mut self, peer: DaemonId, d: &[u8]) {
        let Some(&addr) = self.peers.get(peer as usize - 1) else {
            return;
        };
        self.metrics.bytes_sent.fetch_add(d.len() as u64, Relaxed);
        match self.udp.try_send_to(d, addr) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let _ = self.udp.send_to(d, addr).await;
            }
            Err(_) => {}
        }
    }
}
