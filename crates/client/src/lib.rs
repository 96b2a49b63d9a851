//! The Conclave client library: a session with a daemon over TCP, TLS or a Unix socket.
//!
//! ```no_run
//! # async fn demo() -> Result<(), conclave_client::ClientError> {
//! use conclave_client::{Client, ServiceType};
//! let mut c = Client::connect(&"127.0.0.1:4901".parse()?, "alice").await?;
//! c.join("chat").await?;
//! c.multicast(ServiceType::Agreed, &["chat"], b"hello").await?;
//! let event = c.receive().await?;   // views, messages, transitional signals, flush requests
//! # Ok(()) }
//! ```
//!
//! Sending is flow-controlled: at most a window of messages (a place per group for each 32 KiB
//! of a message) is on its way to the daemon and not yet acknowledged by it
//! ([`ClientEvent::Sent`]; a lone acknowledgement may wait for the delivery of its message, up
//! to the daemon's `ack_delay_us`); `multicast` waits past that, so
//! a fast sender waits for the ring instead of being refused. A command is checked before it
//! waits or travels ([`core::SessionCore`]): one the daemon would refuse, or a message to more
//! groups than the window holds, fails at once.
//!
//! **Events must be taken.** A task reads the connection all the time, so acknowledgements
//! always arrive and a sender never waits for ever. The events the application has not taken
//! with `receive` are held, up to [`EVENT_QUEUE`] events and [`EVENT_QUEUE_BYTES`] bytes of
//! messages; past either the session ends with
//! [`ClientError::Overflow`] (the daemon would close a client that does not read anyway), and
//! every call waiting or made later fails with it. An application that sends and receives from
//! one place should [`Client::split`] the client and receive in a task of its own.
//!
//! **A lost connection.** If the daemon goes away (it crashed, or it closed the session because
//! the client did not read its events or answer a flush request in time), `receive` returns
//! [`ClientError::Disconnected`] (or [`ClientError::Closed`] with the daemon's reason) and every
//! later call fails. For the group, the client has left every group: the other members see a
//! view without it. Messages the daemon had acknowledged (`Sent`) are delivered to the members
//! of the view they were sent in that stay connected; one not yet acknowledged may or may not
//! have been. To go on, connect again (to this daemon or another) and join again: the client is
//! a new member.
//!
//! **A message's payload is not copied** out of what the library read from the daemon: it is a
//! view of the buffer it was read into (64 KiB, shared by the messages read with it, and more
//! only when a larger message began at its end), so keeping one message keeps that buffer. An
//! application that keeps a few small messages of many for long copies their payloads
//! (`Bytes::copy_from_slice`). The events held for the application are counted by their
//! payloads' bytes ([`EVENT_QUEUE_BYTES`]), not by the buffers those payloads keep.
//!
//! Refusals ([`ClientError::Refused`], with a code) are not fatal: the daemon refused one
//! request (most are caught here before they travel) and the session goes on; what the refused
//! request would have changed (a group joined, a place in the window) is rolled back.

pub mod core;
mod group_table;
pub mod secure;
pub mod tls;

pub use crate::core::ClientError;
use crate::core::{Handled, ReplyDecoder, SessionCore};
use conclave_wire::client::ClientCommand;
pub use conclave_wire::client::Refusal;
pub use conclave_wire::client::{ClientEvent, GroupViewId, Reason};
pub use conclave_wire::gcs::ServiceType;
use std::path::PathBuf;
use std::sync::atomic::{
    AtomicBool, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, Semaphore};

/// Messages on their way to the daemon and not yet accepted, at most (a message to several
/// groups takes a place per group).
pub const DEFAULT_WINDOW: usize = 256;
/// Events received and not yet taken by `receive`, at most; past it the session ends with
/// [`ClientError::Overflow`].
pub const EVENT_QUEUE: usize = 65_536;
/// Bytes of messages held for the application, not yet taken, past which the session ends with
/// [`ClientError::Overflow`]: the count alone would let 64 KiB messages hold gigabytes.
pub const EVENT_QUEUE_BYTES: usize = 256 << 20;
/// Events the reading task decodes before handing them over together.
pub const EVENT_BATCH: usize = 256;

type Item = Result<ClientEvent, ClientError>;

/// Where a daemon takes clients: `host:port` or `tcp:host:port`, `tls:host:port` (its `tls`
/// port: the client must know the daemon's key, [`Options::daemon_key`]), `unix:/path`, or
/// `shm:/path` (its `shm` socket, on its machine: the daemon's replies come through shared
/// memory; Linux).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Tcp(String),
    Tls(String),
    Unix(PathBuf),
    Shm(PathBuf),
}

impl std::str::FromStr for Address {
    type Err = ClientError;
    fn from_str(s: &str) -> Result<Self, ClientError> {
        for (scheme, make) in [
            ("unix:", Address::Unix as fn(PathBuf) -> Address),
            ("shm:", Address::Shm),
        ] {
            if let Some(p) = s.strip_prefix(scheme) {
                if p.is_empty() {
                    return Err(ClientError::Invalid(format!("{scheme} needs a path")));
                }
                return Ok(make(p.into()));
            }
        }
        let (tls, hp) = match s.strip_prefix("tls:") {
            Some(hp) => (true, hp),
            None => (false, s.strip_prefix("tcp:").unwrap_or(s)),
        };
        if !hp.contains(':') {
            return Err(ClientError::Invalid(format!(
                "{s:?} is not host:port, tcp:host:port, tls:host:port, unix:/path or shm:/path"
            )));
        }
        Ok(match tls {
            true => Address::Tls(hp.to_owned()),
            false => Address::Tcp(hp.to_owned()),
        })
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(a) => write!(f, "{a}"),
            Address::Tls(a) => write!(f, "tls:{a}"),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Shm(p) => write!(f, "shm:{}", p.display()),
        }
    }
}

type Writer = BufWriter<Box<dyn AsyncWrite + Unpin + Send>>;

/// How a client connects.
#[derive(Clone, Debug)]
pub struct Options {
    /// Places for messages on their way to the daemon (a message takes one per group, and one
    /// more per group for each further [`core::PLACE_BYTES`] of its payload).
    pub window: usize,
    /// Events held for the application, not yet taken with `receive`, before the session ends
    /// with [`ClientError::Overflow`].
    pub event_queue: usize,
    /// Bytes of messages held that way, at most ([`EVENT_QUEUE_BYTES`]).
    pub event_queue_bytes: usize,
    /// The client's identity, to prove its name when the daemons know a key for it (their
    /// configuration's `[[client]]`); without it such a name is refused.
    pub identity: Option<conclave_crypto::Identity>,
    /// The daemon's identity key, which a TLS address needs: the daemon must prove it holds it.
    pub daemon_key: Option<conclave_crypto::PublicIdentity>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            window: DEFAULT_WINDOW,
            event_queue: EVENT_QUEUE,
            event_queue_bytes: EVENT_QUEUE_BYTES,
            identity: None,
            daemon_key: None,
        }
    }
}

/// What the sending half, the reading task and the receiving half share.
struct Shared {
    core: Mutex<SessionCore>,
    /// Why the session ended, once it has: every later call fails with it.
    ended: Mutex<Option<ClientError>>,
    /// Whether `ended` is set (read on every call, without the lock).
    is_ended: AtomicBool,
    /// Places in the window: taken by a message, given back as the daemon acknowledges it.
    window: Semaphore,
    /// How many places the window has.
    window_size: usize,
}

impl Shared {
    fn core(&self) -> std::sync::MutexGuard<'_, SessionCore> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ended(&self) -> Option<ClientError> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Ends the session (the first reason stays); a sender waiting for the window wakes.
    fn end(&self, why: ClientError) {
        let mut e = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        if e.is_none() {
            *e = Some(why);
        }
        self.is_ended.store(true, Release);
        self.window.close();
    }

    fn check_open(&self) -> Result<(), ClientError> {
        if !self.is_ended.load(Acquire) {
            return Ok(());
        }
        self.ended().map_or(Ok(()), Err)
    }
}

/// A connected client.
pub struct Client {
    sender: Sender,
    receiver: Receiver,
}

/// The sending half of a client. Dropping it ends the session (the daemon sees the connection
/// close), so a member that only receives keeps it.
pub struct Sender {
    name: String,
    w: Writer,
    shared: Arc<Shared>,
    /// A message framed by [`Sender::queue`], kept to frame the next one into.
    framed: Vec<u8>,
}

/// The receiving half of a client.
pub struct Receiver {
    rx: mpsc::UnboundedReceiver<Vec<Item>>,
    /// Events handed over by the reading task and not yet taken.
    waiting: Arc<AtomicUsize>,
    /// The bytes of the messages among them.
    waiting_bytes: Arc<AtomicUsize>,
    /// The rest of the last batch handed over.
    /// Taken from as it is: moving the events into a queue first was a copy of each.
    ready: std::vec::IntoIter<Item>,
    reader: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.reader.abort();
        // Nothing reads the daemon's acknowledgements any more: a sender waiting for room in
        // the window would wait for ever. The session ends, and the sending half is told.
        self.shared.end(ClientError::Invalid(
            "the client's receiving half was dropped: nothing reads its events".into(),
        ));
    }
}

impl Client {
    /// Connects to a daemon under a private name; the daemon qualifies it (`alice#d1`), see
    /// [`Client::name`].
    pub async fn connect(addr: &Address, name: &str) -> Result<Client, ClientError> {
        Self::connect_with_window(addr, name, DEFAULT_WINDOW).await
    }

    pub async fn connect_with_window(
        addr: &Address,
        name: &str,
        window: usize,
    ) -> Result<Client, ClientError> {
        let opts = Options {
            window,
            ..Options::default()
        };
        Self::connect_with(addr, name, opts).await
    }

    pub async fn connect_with(
        addr: &Address,
        name: &str,
        opts: Options,
    ) -> Result<Client, ClientError> {
        let mut binding = None;
        let (r, w): (
            Box<dyn AsyncRead + Unpin + Send>,
            Box<dyn AsyncWrite + Unpin + Send>,
        ) = match addr {
            Address::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a).await?;
                s.set_nodelay(true)?;
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Address::Tls(a) => {
                let Some(key) = &opts.daemon_key else {
                    return Err(ClientError::Invalid(format!(
                        "{addr}: TLS needs the daemon's key, to know it is talking to the daemon"
                    )));
                };
                let (s, b) = tls::connect(a, key).await?;
                binding = Some(b);
                let (r, w) = tokio::io::split(s);
                (Box::new(r), Box::new(w))
            }
            #[cfg(unix)]
            Address::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await?;
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            #[cfg(not(unix))]
            Address::Unix(_) => return Err(ClientError::Invalid("no Unix sockets here".into())),
            #[cfg(target_os = "linux")]
            Address::Shm(p) => {
                let (r, w) = conclave_shm::connect(p).await?;
                (Box::new(r), Box::new(w))
            }
            #[cfg(not(target_os = "linux"))]
            Address::Shm(_) => {
                return Err(ClientError::Invalid(
                    "shared-memory sessions need Linux".into(),
                ))
            }
        };
        Self::handshake(r, w, name, opts, binding).await
    }

    async fn handshake(
        mut r: Box<dyn AsyncRead + Unpin + Send>,
        w: Box<dyn AsyncWrite + Unpin + Send>,
        name: &str,
        opts: Options,
        binding: Option<[u8; 32]>,
    ) -> Result<Client, ClientError> {
        let window = opts.window.max(1);
        let mut w = BufWriter::with_capacity(64 * 1024, w);
        let mut core = SessionCore::new(window);
        w.write_all(&core.connect(name)).await?;
        w.flush().await?;
        let full = loop {
            match core.next_reply()? {
                Some(Handled::Refused { code, reason }) => {
                    return Err(ClientError::Refused { code, reason })
                }
                Some(Handled::Closed(reason)) => return Err(ClientError::Closed(reason)),
                Some(Handled::Challenge { name: asked, nonce }) => {
                    // Only a proof of the name this client asked for: a proof of another would
                    // let whoever relayed the challenge connect under that name.
                    if !asked.strip_prefix(name).is_some_and(|d| d.starts_with('#')) {
                        return Err(ClientError::Invalid(format!(
                            "the daemon asks for a proof of {asked:?}, not of {name:?}"
                        )));
                    }
                    let name = asked;
                    let Some(id) = &opts.identity else {
                        return Err(ClientError::Invalid(format!(
                            "the daemon asks for a proof of the name {name:?}: connect with its \
                             identity"
                        )));
                    };
                    let msg = conclave_wire::client::proof_message(&name, &nonce, binding.as_ref());
                    let signature = id
                        .sign(&msg)
                        .map_err(|e| ClientError::Invalid(format!("signing the proof: {e}")))?;
                    if signature.len() > conclave_wire::client::MAX_SIGNATURE_BYTES {
                        return Err(ClientError::Invalid(
                            "only an Ed25519 identity proves a client's name".into(),
                        ));
                    }
                    w.write_all(&core.prove(signature)).await?;
                    w.flush().await?;
                    continue;
                }
                Some(_) => {
                    if let Some(n) = core.name() {
                        break n.to_owned();
                    }
                    continue;
                }
                None => {}
            }
            if r.read_buf(core.buffer()).await? == 0 {
                return Err(ClientError::Disconnected);
            }
        };
        let dec = core.take_input();
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            ended: Mutex::new(None),
            is_ended: AtomicBool::new(false),
            window: Semaphore::new(window),
            window_size: window,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let waiting_bytes = Arc::new(AtomicUsize::new(0));
        let queue = (opts.event_queue.max(1), opts.event_queue_bytes.max(1));
        let reader = tokio::spawn(read_replies(
            r,
            dec,
            tx,
            shared.clone(),
            (waiting.clone(), waiting_bytes.clone()),
            queue,
        ));
        Ok(Client {
            sender: Sender {
                name: full,
                w,
                shared: shared.clone(),
                framed: Vec::new(),
            },
            receiver: Receiver {
                rx,
                waiting,
                waiting_bytes,
                ready: Default::default(),
                reader,
                shared,
            },
        })
    }

    /// The client's name as the group sees it.
    pub fn name(&self) -> &str {
        &self.sender.name
    }

    /// Joins a group (EVS: no flush requests).
    pub async fn join(&mut self, group: &str) -> Result<(), ClientError> {
        self.sender.join(group, false).await
    }

    /// Joins a group with virtual synchrony: before each view change the client gets a
    /// [`ClientEvent::FlushRequest`] and must answer with [`Client::flush_ack`].
    pub async fn join_vs(&mut self, group: &str) -> Result<(), ClientError> {
        self.sender.join(group, true).await
    }

    pub async fn leave(&mut self, group: &str) -> Result<(), ClientError> {
        self.sender.leave(group).await
    }

    /// Sends a message. Waiting for room in the window, it does not take events: an application
    /// that sends faster than the ring and receives in the same task should `split` the client.
    pub async fn multicast(
        &mut self,
        service: ServiceType,
        groups: &[&str],
        payload: &[u8],
    ) -> Result<(), ClientError> {
        self.sender.multicast(service, groups, payload).await
    }

    pub async fn flush_ack(&mut self, group: &str, view: GroupViewId) -> Result<(), ClientError> {
        self.sender.flush_ack(group, view).await
    }

    /// The next event: a message, a view, a transitional signal, a flush request, or an
    /// acknowledgement of the client's own requests.
    pub async fn receive(&mut self) -> Result<ClientEvent, ClientError> {
        self.receiver.receive().await
    }

    /// Leaves every group and closes the session.
    pub async fn disconnect(mut self) -> Result<(), ClientError> {
        self.sender.disconnect().await
    }

    /// The two halves, to send and receive from different tasks.
    pub fn split(self) -> (Sender, Receiver) {
        (self.sender, self.receiver)
    }
}

impl Sender {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Groups the client is in, as the daemon has confirmed them.
    pub fn groups(&self) -> Vec<String> {
        self.shared.core().groups().map(str::to_owned).collect()
    }

    async fn write(&mut self, bytes: &[u8], flush: bool) -> Result<(), ClientError> {
        let r = self.w.write_all(bytes).await;
        let r = match r {
            Ok(()) if flush => self.w.flush().await,
            r => r,
        };
        r.map_err(|_| {
            self.shared.end(ClientError::Disconnected);
            self.shared.ended().unwrap_or(ClientError::Disconnected)
        })
    }

    /// A command that takes no place in the window.
    async fn send(&mut self, cmd: ClientCommand) -> Result<(), ClientError> {
        self.shared.check_open()?;
        let bytes = self.shared.core().command(cmd)?;
        self.write(&bytes, true).await
    }

    /// What the session would refuse of `cmd` (its form, and this session's groups), without
    /// sending it.
    pub(crate) fn check(&self, cmd: &ClientCommand) -> Result<(), ClientError> {
        self.shared.core().check(cmd)
    }

    /// Sends what [`Sender::queue`] buffered.
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        self.shared.check_open()?;
        self.w.flush().await.map_err(|_| ClientError::Disconnected)
    }

    pub async fn join(&mut self, group: &str, vs: bool) -> Result<(), ClientError> {
        let cmd = ClientCommand::Join {
            group: group.to_owned(),
            vs,
        };
        self.send(cmd).await
    }

    /// Asks the daemon for `group`'s keys, before joining it: each view of the group then comes
    /// with its key, which the daemons derive from their own ([`ClientEvent::ViewKey`]).
    pub async fn keys(&mut self, group: &str) -> Result<(), ClientError> {
        self.shared.check_open()?;
        let bytes = self.shared.core().keys(group)?;
        self.write(&bytes, true).await
    }

    pub async fn leave(&mut self, group: &str) -> Result<(), ClientError> {
        let cmd = ClientCommand::Leave {
            group: group.to_owned(),
        };
        self.send(cmd).await
    }

    pub async fn flush_ack(&mut self, group: &str, view: GroupViewId) -> Result<(), ClientError> {
        let cmd = ClientCommand::FlushAck {
            group: group.to_owned(),
            view,
        };
        self.send(cmd).await
    }

    /// Sends a message now (after waiting for room in the window).
    pub async fn multicast(
        &mut self,
        service: ServiceType,
        groups: &[&str],
        payload: &[u8],
    ) -> Result<(), ClientError> {
        self.queue(service, groups, payload).await?;
        self.flush().await
    }

    /// Buffers a message; it leaves with the next [`Sender::flush`] (or when the buffer fills,
    /// or when the window is full and the library must wait). For senders of many messages.
    pub async fn queue(
        &mut self,
        service: ServiceType,
        groups: &[&str],
        payload: &[u8],
    ) -> Result<(), ClientError> {
        self.shared.check_open()?;
        // With room in the window, the message is checked once, as it is counted; without, it
        // is checked before the wait too, so that a message that cannot go fails at once.
        let n = match self.try_take_places(groups.len(), payload.len()) {
            Some(n) => n,
            None => {
                self.shared.core().check_multicast(groups, payload.len())?;
                self.take_places(groups.len(), payload.len()).await?
            }
        };
        // Framed from the borrowed parts (no list, name or payload copied on the way: they
        // were a tenth of a sending member's time), into the buffer of the message before.
        let mut framed = std::mem::take(&mut self.framed);
        framed.clear();
        // The groups may have changed while it waited: checked again as it is counted.
        let counted = self
            .shared
            .core()
            .multicast_into(service, groups, payload, &mut framed);
        if let Err(e) = counted {
            self.shared.window.add_permits(n);
            return Err(e);
        }
        let written = self.write(&framed, false).await;
        self.framed = framed;
        written
    }

    /// [`Sender::queue`] of a multicast command already built (its payload is not copied again).
    pub(crate) async fn queue_multicast(&mut self, cmd: ClientCommand) -> Result<(), ClientError> {
        // Checked before any wait: a command that cannot go fails at once.
        self.shared.check_open()?;
        self.shared.core().check(&cmd)?;
        let n = match &cmd {
            ClientCommand::Multicast {
                groups, payload, ..
            } => self.take_places(groups.len(), payload.len()).await?,
            _ => 0,
        };
        // The groups may have changed while it waited: checked again as it is counted.
        let framed = self.shared.core().command(cmd);
        match framed {
            Ok(bytes) => self.write(&bytes, false).await,
            Err(e) => {
                self.shared.window.add_permits(n);
                Err(e)
            }
        }
    }

    /// [`Sender::take_places`] if they are free now, without a wait or a flush.
    fn try_take_places(&mut self, groups: usize, payload_len: usize) -> Option<usize> {
        let n = core::places(payload_len, groups, self.shared.window_size) * groups;
        if n > self.shared.window_size {
            return None;
        }
        let permit = self.shared.window.try_acquire_many(n as u32).ok()?;
        permit.forget();
        Some(n)
    }

    /// Takes the places in the window of a message to `groups` groups of `payload_len` bytes,
    /// waiting for them if need be, and says how many: they are given back as the daemon
    /// acknowledges the message in each group, or refuses it.
    async fn take_places(
        &mut self,
        groups: usize,
        payload_len: usize,
    ) -> Result<usize, ClientError> {
        let each = core::places(payload_len, groups, self.shared.window_size);
        let n = each * groups;
        let shared = self.shared.clone();
        let permit = match shared.window.try_acquire_many(n as u32) {
            Ok(p) => p,
            Err(_) => {
                // Everything buffered goes before waiting, or the wait would never end.
                self.flush().await?;
                match shared.window.acquire_many(n as u32).await {
                    Ok(p) => p,
                    Err(_) => return Err(shared.ended().unwrap_or(ClientError::Disconnected)),
                }
            }
        };
        permit.forget();
        Ok(n)
    }

    pub async fn disconnect(&mut self) -> Result<(), ClientError> {
        let bytes = self.shared.core().disconnect();
        let _ = self.w.write_all(&bytes).await;
        let _ = self.w.flush().await;
        let _ = self.w.shutdown().await;
        self.shared.end(ClientError::Disconnected);
        Ok(())
    }
}

impl Receiver {
    /// An event if one has arrived, without waiting.
    pub fn try_receive(&mut self) -> Option<Result<ClientEvent, ClientError>> {
        if self.ready.as_slice().is_empty() {
            if let Ok(batch) = self.rx.try_recv() {
                self.ready = batch.into_iter();
            }
        }
        let item = self.ready.next()?;
        self.taken(&item);
        Some(item)
    }

    fn taken(&self, item: &Item) {
        self.waiting.fetch_sub(1, Relaxed);
        self.waiting_bytes.fetch_sub(item_bytes(item), Relaxed);
    }

    pub async fn receive(&mut self) -> Result<ClientEvent, ClientError> {
        loop {
            if let Some(item) = self.ready.next() {
                self.taken(&item);
                return item;
            }
            match self.rx.recv().await {
                Some(batch) => self.ready = batch.into_iter(),
                None => return Err(ClientError::Disconnected),
            }
        }
    }
}

/// The payload bytes an event holds (what the byte budget of held events counts).
fn item_bytes(item: &Item) -> usize {
    match item {
        Ok(ClientEvent::Message { payload, .. }) => payload.len(),
        _ => 0,
    }
}

/// Takes a full batch, leaving room for as many: growing each batch from empty cost a good
/// part of the reader's time under load.
fn next_batch(batch: &mut Vec<Item>) -> Vec<Item> {
    let room = batch.len();
    std::mem::replace(batch, Vec::with_capacity(room))
}

/// Reads the connection until it ends, whatever the application does: the session core follows
/// every reply (and gives back places in the window), and events go to the receiving half.
async fn read_replies(
    mut r: Box<dyn AsyncRead + Unpin + Send>,
    mut dec: ReplyDecoder,
    tx: mpsc::UnboundedSender<Vec<Item>>,
    shared: Arc<Shared>,
    (waiting, waiting_bytes): (Arc<AtomicUsize>, Arc<AtomicUsize>),
    (queue, queue_bytes): (usize, usize),
) {
    let mut batch = Vec::new();
    let hand_over = |batch: Vec<Item>| -> Result<(), ClientError> {
        let n = batch.len();
        let bytes: usize = batch.iter().map(item_bytes).sum();
        let now = waiting.fetch_add(n, Relaxed) + n;
        let now_bytes = waiting_bytes.fetch_add(bytes, Relaxed) + bytes;
        if now > queue + EVENT_BATCH || now_bytes > queue_bytes.saturating_add(bytes) {
            return Err(ClientError::Overflow { waiting: now });
        }
        tx.send(batch).map_err(|_| ClientError::Disconnected)
    };
    let end = 'read: loop {
        // What one read brought is decoded, then handed over at once: one wake-up of the
        // receiving task for many events. The session core is locked once for all of it.
        let freed = {
            let mut core = shared.core();
            let free = core.window_free();
            loop {
                let reply = match dec.next_reply() {
                    Err(e) => break 'read ClientError::Protocol(e),
                    Ok(None) => break,
                    Ok(Some(r)) => r,
                };
                match core.handle(reply) {
                    // A challenge after the handshake is none the client answers.
                    Handled::Nothing | Handled::Challenge { .. } => {}
                    Handled::Closed(reason) => break 'read ClientError::Closed(reason),
                    Handled::Event(ev) => batch.push(Ok(ev)),
                    Handled::Refused { code, reason } => {
                        batch.push(Err(ClientError::Refused { code, reason }))
                    }
                }
                if batch.len() >= EVENT_BATCH {
                    if let Err(e) = hand_over(next_batch(&mut batch)) {
                        break 'read e;
                    }
                }
            }
            core.window_free() - free
        };
        if freed > 0 {
            shared.window.add_permits(freed);
        }
        if !batch.is_empty() {
            if let Err(e) = hand_over(next_batch(&mut batch)) {
                break e;
            }
        }
        match r.read_buf(dec.buffer()).await {
            Ok(0) | Err(_) => break ClientError::Disconnected,
            Ok(_) => {}
        }
    };
    shared.end(end.clone());
    batch.push(Err(end));
    waiting.fetch_add(batch.len(), Relaxed);
    waiting_bytes.fetch_add(batch.iter().map(item_bytes).sum(), Relaxed);
    let _ = tx.send(batch);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "127.0.0.1:4901".parse::<Address>().unwrap(),
            Address::Tcp("127.0.0.1:4901".into())
        );
        assert_eq!(
            "tcp:localhost:1".parse::<Address>().unwrap(),
            Address::Tcp("localhost:1".into())
        );
        assert_eq!(
            "unix:/tmp/x.sock".parse::<Address>().unwrap(),
            Address::Unix("/tmp/x.sock".into())
        );
        assert_eq!(
            "shm:/tmp/x.shm".parse::<Address>().unwrap(),
            Address::Shm("/tmp/x.shm".into())
        );
        assert_eq!(
            Address::Shm("/tmp/x.shm".into()).to_string(),
            "shm:/tmp/x.shm"
        );
        assert!("nowhere".parse::<Address>().is_err());
        assert!("unix:".parse::<Address>().is_err());
        assert!("shm:".parse::<Address>().is_err());
    }
}
