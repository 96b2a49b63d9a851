//! The daemon's runtime: sockets, timers and tasks around a pure node ([`conclave_node::Node`]).
//!
//! One task owns the node. Each input (a datagram, bytes from a client connection, an admin
//! request, a timer) goes in with the time it arrived, together with every other datagram or
//! client input already waiting (up to 64 datagrams; 256 inputs or 256 KiB of client bytes);
//! then the node's outputs are drained in the
//! node's order: history records (written and flushed to the file), bytes and closings for the
//! client connections, datagrams to the other daemons. Accepting connections, reading and writing
//! clients' streams, the admin and metrics endpoints run in tasks of their own and talk to the
//! node's task over channels. Nothing here decides anything about the protocol: that is all in
//! the node, which the simulator runs too.

use crate::admin::{AdminReply, AdminRequest};
use crate::config::Config;
use crate::datagrams;
use crate::endpoints::{
    admin_session, read_token, serve_metrics, AdminGate, MetricsGate, RefusalLog,
};
use crate::metrics::Metrics;
use crate::record::HistoryFile;
use crate::session::{self, Written};
use anyhow::Context;
use bytes::BytesMut;
use conclave_crypto::identity_file::IdentityFile;
use conclave_node::{IdMap, Node, NodeOptions, SessionId, SessionOutput, Time};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Inputs waiting for the node's task, from all connections together.
const CORE_QUEUE: usize = 4096;
/// Bytes of client input one pass hands to the node before it drains the outputs and goes back
/// to the other daemons' datagrams: about 256 requests of 1 KiB. Handling every read already
/// waiting (up to 256 of 64 KiB) held the ring's token back and cost a fifth of the throughput.
const PASS_INPUT_BYTES: usize = 256 * 1024;

/// How a daemon is started, beyond its configuration.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Write the history (JSON lines) here.
    pub record: Option<PathBuf>,
    /// This run's incarnation; by default a clock reading, so that it grows at every restart.
    pub incarnation: Option<u32>,
    /// Seed of the fault injection's randomness (by default from the clock).
    pub seed: Option<u64>,
    /// The daemon's identity; by default read from the file its configuration entry names.
    pub identity: Option<Arc<IdentityFile>>,
}

/// Tenths of a second since 2024: grows between two starts of a daemon and two connections of a
/// client name, unless they come within a tenth of a second.
pub fn stamp() -> u32 {
    conclave_node::stamp(crate::record::wall_us())
}

pub(crate) enum ToCore {
    Open {
        id: SessionId,
        tx: mpsc::UnboundedSender<SessionOutput>,
        /// The connection's channel binding, when it is TLS.
        binding: Option<[u8; 32]>,
        /// The connection speaks Spread's protocol.
        spread: bool,
    },
    /// What one read of a connection brought; the permit bounds the reads in flight.
    Bytes {
        id: SessionId,
        bytes: bytes::Bytes,
        /// The node may keep views of `bytes` (a buffer of its own, counted: crate::reads).
        shared: bool,
        permit: OwnedSemaphorePermit,
    },
    Gone {
        id: SessionId,
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
    /// The Unix sockets to remove when the daemon stops.
    unix: Vec<PathBuf>,
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
        for p in &self.unix {
            let _ = std::fs::remove_file(p);
        }
        r
    }
}

/// The node's clock starts at an instant; its records are stamped with the wall-clock time of
/// that instant (`clock_base_us`) plus the node's time, and the checker compares the stamps of
/// different daemons (a delivery is not before its send). The two clocks are read in pairs,
/// a few times, and the pair read closest together is kept: read once, a daemon preempted
/// between the two reads stamped its records late by as long (a send 107 µs after another
/// daemon's delivery of it, seen under the load of the whole test suite).
fn clock_pair() -> (Instant, u64) {
    let mut best: Option<(Duration, Instant, u64)> = None;
    for _ in 0..5 {
        let before = Instant::now();
        let wall = crate::record::wall_us();
        let gap = before.elapsed();
        if best.as_ref().is_none_or(|(g, _, _)| gap < *g) {
            best = Some((gap, before, wall));
        }
    }
    let (_, start, wall) = best.expect("read five times");
    (start, wall)
}

/// Raises this process's soft limit of open descriptors to its hard limit, and returns it: a
/// daemon holds one per client connection (`max_connections` is 2,000 by default, where the
/// usual soft limit is 1,024), and the descriptors it hands to clients on its `shm` socket count
/// against the same limit while they are in flight.
#[cfg(unix)]
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a live struct the calls read and write; results are checked.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // An unlimited hard limit is the kernel's `nr_open` for descriptors.
        let most = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
            .map_or(l.rlim_max, |n| n.min(l.rlim_max));
        if l.rlim_cur < most {
            l.rlim_cur = most;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    // `rlim_t` is not u64 everywhere.
    #[allow(clippy::unnecessary_cast)]
    Ok(l.rlim_cur as u64)
}

/// A daemon's identity file. One that others may read is used, with a warning: the secret in it
/// is what keeps outsiders off the links.
pub fn read_identity(path: &std::path::Path) -> anyhow::Result<IdentityFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the identity file {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path) {
            if m.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    file = %path.display(),
                    "the identity file is readable by others than its owner (chmod 600 it)"
                );
            }
        }
    }
    IdentityFile::parse(&text).with_context(|| format!("reading {}", path.display()))
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
    let admin_keys = cfg.admin_keys(name)?;
    let udp =
        bind_udp(entry.peer).with_context(|| format!("binding the peer address {}", entry.peer))?;
    let recorder = match &opts.record {
        Some(p) => Some(
            HistoryFile::create(p)
                .with_context(|| format!("opening the history file {}", p.display()))?,
        ),
        None => None,
    };
    let identity = match (&opts.identity, &entry.identity) {
        (Some(id), _) => Some(id.clone()),
        (None, Some(path)) => Some(Arc::new(read_identity(path)?)),
        (None, None) => None,
    };
    let tls_acceptor = match (entry.tls, &identity) {
        (None, _) => None,
        (Some(_), None) => {
            anyhow::bail!("a TLS port needs the daemon's identity (identity = ... or --identity)")
        }
        (Some(_), Some(id)) => Some(tokio_rustls::TlsAcceptor::from(crate::tls::server_config(
            id,
        )?)),
    };
    let handshake = Duration::from_millis(cfg.sessions.handshake_ms);
    let max_connections = cfg.sessions.max_connections;
    let (start, clock_base_us) = clock_pair();
    let inc = opts.incarnation.unwrap_or_else(stamp);
    let node_opts = NodeOptions {
        incarnation: inc,
        seed: opts.seed.unwrap_or_else(crate::record::wall_us),
        record: recorder.is_some(),
        record_ring_messages: false,
        clock_base_us,
        client_incarnation_floor: 0,
        identity,
        secret_rng: Some(conclave_node::SecretRng::new(|| Box::new(rand_core::OsRng))),
        link_salt: rand_core::RngCore::next_u32(&mut rand_core::OsRng),
    };
    let node = Node::new(cfg, name, node_opts, Time::ZERO)?;
    let metrics = node.metrics().clone();
    let (tx, rx) = mpsc::channel(CORE_QUEUE);
    let (written_tx, written_rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    let sessions = Sessions {
        core: tx.clone(),
        written: written_tx,
        next_id: Arc::new(std::sync::atomic::AtomicU64::new(1)),
        shm_rings: Arc::new(tokio::sync::Semaphore::new(max_connections)),
        shared_reads: crate::reads::SharedReads::new(
            crate::reads::SHARED_READ_BYTES,
            metrics.clone(),
        ),
    };
    if let Some(addr) = entry.client {
        tasks.push(listen_tcp(addr, sessions.clone(), false, "client").await?);
    }
    if let Some(addr) = entry.spread {
        tasks.push(listen_tcp(addr, sessions.clone(), true, "Spread").await?);
    }
    if let (Some(addr), Some(acceptor)) = (entry.tls, tls_acceptor) {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the TLS address {addr}"))?;
        let sessions = sessions.clone();
        let metrics = metrics.clone();
        // Handshakes under way at once, at most: each holds a socket until it ends or times out,
        // and the node counts a connection only once its handshake is done.
        let handshakes = Arc::new(tokio::sync::Semaphore::new(max_connections));
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((s, from)) = l.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                    metrics.tls_handshakes_failed.fetch_add(1, Relaxed);
                    continue;
                };
                let _ = s.set_nodelay(true);
                let (acceptor, sessions, metrics) =
                    (acceptor.clone(), sessions.clone(), metrics.clone());
                // Each handshake in a task of its own: a client that stalls in it holds no one
                // else up, and is dropped at the handshake time.
                tokio::spawn(async move {
                    let tls = tokio::time::timeout(handshake, acceptor.accept(s)).await;
                    drop(permit);
                    let bound = match tls {
                        Ok(Ok(t)) => crate::tls::binding(&t)
                            .map(|b| (t, b))
                            .map_err(|e| e.to_string()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("no handshake in time".to_owned()),
                    };
                    match bound {
                        Ok((t, b)) => sessions.serve(t, Some(b), false),
                        Err(e) => {
                            metrics.tls_handshakes_failed.fetch_add(1, Relaxed);
                            tracing::debug!(from = %from, error = e, "TLS handshake failed");
                        }
                    }
                });
            }
        }));
    }
    #[cfg(unix)]
    for (path, spread) in [(&entry.unix, false), (&entry.spread_unix, true)] {
        if let Some(path) = path {
            tasks.push(listen_unix(path, sessions.clone(), spread, false)?);
        }
    }
    #[cfg(target_os = "linux")]
    if let Some(path) = &entry.shm {
        tasks.push(listen_unix(path, sessions.clone(), false, true)?);
    }
    if let Some(addr) = entry.admin {
        let gate = Arc::new(AdminGate {
            daemon: name.to_owned(),
            keys: admin_keys,
            metrics: metrics.clone(),
            log: RefusalLog::default(),
        });
        if gate.keys.is_empty() {
            tracing::warn!(
                "the admin port is open but no key may sign in to it: name this daemon's key, \
                 or an [[admin]]"
            );
        }
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the admin address {addr}"))?;
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                if let Ok((s, _)) = l.accept().await {
                    tokio::spawn(admin_session(s, gate.clone(), tx.clone()));
                }
            }
        }));
    }
    if let Some(addr) = entry.metrics {
        let path = entry
            .metrics_token
            .as_ref()
            .expect("validated: metrics has a token");
        let gate = Arc::new(MetricsGate {
            token: read_token(path)?,
            metrics: metrics.clone(),
            log: RefusalLog::default(),
        });
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics address {addr}"))?;
        tasks.push(tokio::spawn(async move {
            loop {
                if let Ok((s, _)) = l.accept().await {
                    tokio::spawn(serve_metrics(s, gate.clone()));
                }
            }
        }));
    }
    tracing::info!(daemon = name, incarnation = inc, "started");
    let pump = Pump {
        node,
        udp: Arc::new(udp),
        writers: IdMap::default(),
        written: written_rx,
        recorder,
        start,
        held_reads: IdMap::default(),
    };
    let core = tokio::spawn(pump.run(rx));
    Ok(Running {
        name: name.to_owned(),
        metrics,
        tx,
        core,
        tasks,
        unix: [entry.unix, entry.shm, entry.spread_unix]
            .into_iter()
            .flatten()
            .collect(),
    })
}

/// Accepts client connections on `addr` (Spread's protocol if `spread`).
async fn listen_tcp(
    addr: SocketAddr,
    sessions: Sessions,
    spread: bool,
    what: &str,
) -> anyhow::Result<JoinHandle<()>> {
    let l = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {what} address {addr}"))?;
    Ok(tokio::spawn(async move {
        loop {
            match l.accept().await {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    sessions.serve(s, None, spread);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }))
}

/// Accepts client connections on the Unix socket `path` (Spread's protocol if `spread`; replies
/// through a shared-memory ring if `shm`).
#[cfg(unix)]
fn listen_unix(
    path: &std::path::Path,
    sessions: Sessions,
    spread: bool,
    shm: bool,
) -> anyhow::Result<JoinHandle<()>> {
    #[cfg(not(target_os = "linux"))]
    let _ = shm;
    // A socket file left by an earlier run that is no longer served.
    if std::os::unix::net::UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    let l = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding the Unix socket {}", path.display()))?;
    Ok(tokio::spawn(async move {
        loop {
            match l.accept().await {
                #[cfg(target_os = "linux")]
                Ok((s, _)) if shm => sessions.serve_shm(s),
                Ok((s, _)) => sessions.serve(s, None, spread),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }))
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

/// What accepting a client connection needs, shared by the TCP and Unix listeners.
#[derive(Clone)]
struct Sessions {
    core: mpsc::Sender<ToCore>,
    written: mpsc::UnboundedSender<Written>,
    next_id: Arc<std::sync::atomic::AtomicU64>,
    /// Shared-memory rings the daemon may hold at once, greetings included (`max_connections`).
    shm_rings: Arc<tokio::sync::Semaphore>,
    /// The read buffers the node's views hold, all connections together.
    shared_reads: Arc<crate::reads::SharedReads>,
}

impl Sessions {
    fn daemon(&self) -> session::Daemon {
        session::Daemon {
            core: self.core.clone(),
            written: self.written.clone(),
            shared: self.shared_reads.clone(),
        }
    }

    /// Runs a new connection's session (the node closes it at once past its connection limit).
    fn serve<S>(&self, s: S, binding: Option<[u8; 32]>, spread: bool)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    {
        let id = self.next_id.fetch_add(1, Relaxed);
        let (r, w) = tokio::io::split(s);
        tokio::spawn(session::run(r, w, id, binding, spread, self.daemon()));
    }

    /// Runs a new connection on the `shm` socket: the client's requests come over the socket,
    /// and the replies go through a ring of shared memory handed to it first.
    #[cfg(target_os = "linux")]
    fn serve_shm(&self, s: tokio::net::UnixStream) {
        let id = self.next_id.fetch_add(1, Relaxed);
        let daemon = self.daemon();
        // A ring is memory the daemon holds for the session's life: at most one per connection
        // the daemon admits, and none for a connection past the limit.
        let Ok(ring) = self.shm_rings.clone().try_acquire_owned() else {
            tracing::debug!("a shared-memory session refused: as many as max_connections run");
            return;
        };
        tokio::spawn(async move {
            match conclave_shm::accept(s, conclave_shm::DEFAULT_RING_BYTES).await {
                Ok((r, w)) => session::run(r, w, id, None, false, daemon).await,
                Err(e) => tracing::debug!(error = %e, "a shared-memory session failed to start"),
            }
            drop(ring);
        });
    }
}

/// What woke the node's task.
enum Woke {
    Datagram(SocketAddr),
    Input(ToCore),
    Closed,
    Timer,
}

/// Room for the largest datagram.
const DATAGRAM_ROOM: usize = 65_536;

/// Where datagrams are received, and what each is handed to the node in. The client messages a
/// datagram carries keep views of its buffer (no copy per message), so the buffer must not be
/// much larger than the datagram: a small one is copied out to a buffer of its size and the room
/// received into again; a large one keeps its room (at most four times its size) and the next
/// datagram gets fresh room.
struct Inbox {
    room: BytesMut,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            room: BytesMut::with_capacity(DATAGRAM_ROOM),
        }
    }
}

impl Inbox {
    /// The datagram just received into `room`.
    fn take(&mut self) -> BytesMut {
        if self.room.len() < DATAGRAM_ROOM / 4 {
            let d = BytesMut::from(&self.room[..]);
            self.room.clear();
            d
        } else {
            std::mem::take(self).room
        }
    }
}

/// The node's task: inputs in, outputs out, nothing decided.
struct Pump {
    node: Node,
    udp: Arc<UdpSocket>,
    /// Each open connection's writer.
    writers: IdMap<SessionId, mpsc::UnboundedSender<SessionOutput>>,
    written: mpsc::UnboundedReceiver<Written>,
    recorder: Option<HistoryFile>,
    start: Instant,
    /// The read permits of connections the node reads no further for now
    /// ([`Node::session_paused`]): kept, their readers stop, and TCP holds their clients back.
    held_reads: IdMap<SessionId, Vec<OwnedSemaphorePermit>>,
}

impl Pump {
    /// The node's clock: microseconds since the daemon started.
    /// The node's clock: time since this daemon started.
    fn now(&self) -> Time {
        Time::from_micros(self.start.elapsed().as_micros() as u64)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<ToCore>) -> anyhow::Result<()> {
        let udp = self.udp.clone();
        let mut inbox = Inbox::default();
        while !self.node.is_stopping() {
            if let Some(until) = self.node.take_pause() {
                tokio::time::sleep_until(self.start + Duration::from_micros(until.as_micros()))
                    .await;
            }
            let wake = self
                .node
                .poll_timeout()
                .map(|t| self.start + Duration::from_micros(t.as_micros()))
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let woke = tokio::select! {
                r = udp.recv_buf_from(&mut inbox.room) => match r {
                    Ok((_, from)) => Woke::Datagram(from),
                    Err(_) => Woke::Timer,
                },
                m = rx.recv() => m.map_or(Woke::Closed, Woke::Input),
                _ = tokio::time::sleep_until(wake) => Woke::Timer,
            };
            // What the writers wrote meanwhile, before anything frames more for them.
            while let Ok(w) = self.written.try_recv() {
                self.node
                    .handle_session_written(w.id, w.bytes, w.replies, w.spare);
            }
            let now = self.now();
            match woke {
                Woke::Datagram(from) => {
                    self.node.handle_datagram(now, from, inbox.take());
                    // Take in what else has arrived before answering.
                    for _ in 0..64 {
                        match udp.try_recv_buf_from(&mut inbox.room) {
                            Ok((_, from)) => self.node.handle_datagram(now, from, inbox.take()),
                            Err(_) => break,
                        }
                    }
                }
                Woke::Input(m) => {
                    let mut budget = PASS_INPUT_BYTES.saturating_sub(self.input(now, m));
                    // Inputs already waiting are handled before the outputs are drained: one
                    // pass over them (and one write per client) for many, but not so many that
                    // the ring's token waits long behind them.
                    for _ in 0..256 {
                        if budget == 0 {
                            break;
                        }
                        match rx.try_recv() {
                            Ok(m) => budget = budget.saturating_sub(self.input(now, m)),
                            Err(_) => break,
                        }
                    }
                }
                Woke::Closed => break,
                Woke::Timer => self.node.handle_timeout(now),
            }
            self.drain().await;
        }
        // Clean shutdown: every client is told.
        let now = self.now();
        self.node.shutdown(now);
        self.drain().await;
        tracing::info!(daemon = %self.node.name(), "stopped");
        Ok(())
    }

    /// Hands one input to the node; the bytes it carried.
    fn input(&mut self, now: Time, m: ToCore) -> usize {
        let mut size = 0;
        match m {
            ToCore::Open {
                id,
                tx,
                spread: true,
                ..
            } => {
                // The node may refuse it with bytes of its own (Spread's REJECT_QUOTA).
                self.writers.insert(id, tx);
                if let Err(e) = self.node.open_spread_session(now, id) {
                    self.writers.remove(&id);
                    tracing::debug!(session = id, error = %e, "connection refused");
                }
            }
            ToCore::Open {
                id, tx, binding, ..
            } => {
                match self.node.open_bound_session(now, id, binding) {
                    Ok(()) => {
                        self.writers.insert(id, tx);
                    }
                    // Dropping the writer's channel closes the connection.
                    Err(e) => tracing::debug!(session = id, error = %e, "connection refused"),
                }
            }
            ToCore::Bytes {
                id,
                bytes,
                shared,
                permit,
            } => {
                size = bytes.len();
                if shared {
                    self.node.handle_session_shared(now, id, &bytes);
                } else {
                    self.node.handle_session_bytes(now, id, &bytes);
                }
                if self.node.session_paused(id) {
                    self.held_reads.entry(id).or_default().push(permit);
                }
            }
            ToCore::Gone { id } => self.node.close_session(now, id),
            ToCore::Admin { req, reply } => {
                let _ = reply.send(self.node.handle_admin(now, req));
            }
        }
        size
    }

    /// The node's outputs: a token it passes on first ([`Node::poll_token`]), then in its order
    /// records, connections, datagrams.
    async fn drain(&mut self) {
        if let Some((addr, d)) = self.node.poll_token() {
            send(&self.udp, addr, &d).await;
        }
        while let Some(r) = self.node.poll_record() {
            if let Some(f) = self.recorder.as_mut() {
                f.write(&r);
            }
        }
        if let Some(f) = self.recorder.as_mut() {
            f.flush();
        }
        while let Some((id, out)) = self.node.poll_session() {
            let close = out == SessionOutput::Close;
            if let Some(w) = self.writers.get(&id) {
                let _ = w.send(out);
            }
            if close {
                self.writers.remove(&id);
            }
        }
        let batch: Vec<_> = std::iter::from_fn(|| self.node.poll_datagram()).collect();
        datagrams::send_all(&self.udp, &batch).await;
        if !self.held_reads.is_empty() {
            // The node read on in the sessions it has room for again: their readers go on.
            let node = &self.node;
            self.held_reads.retain(|id, _| node.session_paused(*id));
        }
    }
}

/// Sends a datagram, waiting for room in the socket's buffer if it has none.
async fn send(udp: &UdpSocket, addr: SocketAddr, d: &[u8]) {
    match udp.try_send_to(d, addr) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            let _ = udp.send_to(d, addr).await;
        }
        // Lost, as the network may lose it: the ring retransmits.
        Err(_) => {}
    }
}
