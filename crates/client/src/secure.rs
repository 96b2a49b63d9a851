//! Secure groups over a session: the layered architecture's secure layer (`conclave-secure`,
//! docs/secure.md) driven by the async client. Every view of a secure group gets a key its
//! members agree on (or, with [`KeySource::Daemons`], one the daemons derive and hand over: the
//! integrated architecture, docs/integrated.md); every message is sealed under the key of the
//! view it is sent in.
//!
//! ```no_run
//! # async fn demo(identity: conclave_crypto::Identity, directory: conclave_gka::Directory)
//! #     -> Result<(), conclave_client::secure::SecureClientError> {
//! use conclave_client::secure::{SecureClient, SecureConfig, SecureEvent};
//! use conclave_client::{Client, ServiceType};
//! let client = Client::connect(&"127.0.0.1:4901".parse()?, "alice").await?;
//! let mut s = SecureClient::new(client, identity, directory);
//! s.join_secure("chat", SecureConfig::default()).await?;
//! s.send("chat", ServiceType::Agreed, b"hello").await?; // waits for the key if need be
//! while let Ok(ev) = s.receive().await {
//!     if let SecureEvent::View(v) = ev {
//!         println!("{} members, key {}", v.members.len(), v.fingerprint);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! A `SecureClient` serves its secure groups only: events of other groups are dropped (use a
//! client of its own for plain groups). A task of its own drives the key agreement, so keys are
//! agreed whether or not the application is receiving; the events it has not taken wait, up to
//! [`crate::EVENT_QUEUE`], past which the session ends with [`ClientError::Overflow`]. Every
//! call is cancel-safe (a request to the task and its answer).
//!
//! For many messages, [`SecureSender::queue`] hands each to the task without waiting for its
//! answer; the task seals what has arrived and writes it out in one go. A queued message that
//! cannot go comes back from [`SecureReceiver::receive`] as an error that does not end the
//! session ([`SecureClientError::is_final`] tells the two kinds apart).

use crate::group_table::GroupTable;
use crate::{Client, ClientError, ClientEvent, ServiceType, EVENT_QUEUE};
use bytes::Bytes;
use conclave_crypto::Identity;
use conclave_gka::{Directory, SharedDirectory};
use conclave_wire::client::ClientCommand;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, oneshot};

use conclave_secure::SecureGroup;
pub use conclave_secure::{
    files, KeySource, SecureConfig, SecureError, SecureEvent, SecureViewInfo, ViewKey,
};

/// What a secure client's call can fail with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum SecureClientError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Secure(#[from] SecureError),
    #[error("not in secure group {0:?}")]
    NotJoined(String),
    #[error("already in secure group {0:?}")]
    AlreadyJoined(String),
}

impl SecureClientError {
    /// Whether the session is over: a refusal (of the daemon, or of a queued message) is not.
    pub fn is_final(&self) -> bool {
        matches!(self, SecureClientError::Client(e) if !matches!(e, ClientError::Refused { .. }))
    }
}

/// Requests waiting for the task; a sender queueing faster than the task seals waits for room.
const REQUEST_QUEUE: usize = 1024;
/// Requests (or events) the task takes in one go before it writes out what they made.
const BATCH: usize = 256;

type Reply = oneshot::Sender<Result<(), SecureClientError>>;
/// What the application receives.
type Item = Result<SecureEvent, SecureClientError>;

enum Request {
    Join(String, SecureConfig, Reply),
    Send(String, ServiceType, Bytes, Reply),
    /// A send whose outcome comes back as an event only if it fails.
    Queue(String, ServiceType, Bytes),
    Leave(String, Reply),
    ViewKey(String, oneshot::Sender<Option<ViewKey>>),
    Disconnect(Reply),
}

/// A client session whose groups are secure.
pub struct SecureClient {
    sender: SecureSender,
    receiver: SecureReceiver,
}

/// The half of a [`SecureClient`] that joins, sends and leaves. Dropping it ends the session.
pub struct SecureSender {
    name: String,
    requests: mpsc::Sender<Request>,
}

/// The half of a [`SecureClient`] that receives.
pub struct SecureReceiver {
    /// Batches of events, one per batch of the task's work: one wake-up for many.
    events: mpsc::UnboundedReceiver<Vec<Item>>,
    /// The rest of the last batch.
    ready: VecDeque<Item>,
    /// Events handed over and not yet taken.
    waiting: Arc<AtomicUsize>,
}

impl SecureClient {
    /// Secure groups over `client`, as `identity`, trusting the members `directory` names.
    pub fn new(client: Client, identity: Identity, directory: Directory) -> SecureClient {
        let (requests, rx) = mpsc::channel(REQUEST_QUEUE);
        let (tx, events) = mpsc::unbounded_channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let name = client.name().to_owned();
        let driver = Driver {
            client,
            identity,
            directory: Arc::new(RwLock::new(directory)),
            groups: GroupTable::default(),
            events: tx,
            waiting: waiting.clone(),
            out: Vec::new(),
        };
        // It ends when the session does, or when the sending half is dropped.
        tokio::spawn(driver.run(rx));
        SecureClient {
            sender: SecureSender { name, requests },
            receiver: SecureReceiver {
                events,
                ready: VecDeque::new(),
                waiting,
            },
        }
    }

    /// The client's name as views list it.
    pub fn name(&self) -> &str {
        &self.sender.name
    }

    /// The two halves, to send and receive from different tasks.
    pub fn split(self) -> (SecureSender, SecureReceiver) {
        (self.sender, self.receiver)
    }

    pub async fn join_secure(
        &mut self,
        group: &str,
        cfg: SecureConfig,
    ) -> Result<(), SecureClientError> {
        self.sender.join_secure(group, cfg).await
    }

    pub async fn send(
        &mut self,
        group: &str,
        service: ServiceType,
        payload: &[u8],
    ) -> Result<(), SecureClientError> {
        self.sender.send(group, service, payload).await
    }

    pub async fn leave(&mut self, group: &str) -> Result<(), SecureClientError> {
        self.sender.leave(group).await
    }

    pub async fn view_key(&mut self, group: &str) -> Result<Option<ViewKey>, SecureClientError> {
        self.sender.view_key(group).await
    }

    pub async fn receive(&mut self) -> Result<SecureEvent, SecureClientError> {
        self.receiver.receive().await
    }

    /// Leaves every group and closes the session.
    pub async fn disconnect(self) -> Result<(), SecureClientError> {
        self.sender.disconnect().await
    }
}

impl SecureSender {
    /// The client's name as views list it.
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn ask(&self, make: impl FnOnce(Reply) -> Request) -> Result<(), SecureClientError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(make(tx))
            .await
            .map_err(|_| ClientError::Disconnected)?;
        rx.await.unwrap_or(Err(ClientError::Disconnected.into()))
    }

    /// Joins `group` securely (with VS); the group's first member chose its protocol, and a
    /// member asking for another is refused ([`SecureError::ProtocolMismatch`], then
    /// [`SecureEvent::Left`]).
    pub async fn join_secure(
        &mut self,
        group: &str,
        cfg: SecureConfig,
    ) -> Result<(), SecureClientError> {
        self.ask(|r| Request::Join(group.to_owned(), cfg, r)).await
    }

    /// Sends to a secure group, sealed under the current view's key; with no key yet (a key
    /// agreement under way), the message waits for the next secure view.
    pub async fn send(
        &mut self,
        group: &str,
        service: ServiceType,
        payload: &[u8],
    ) -> Result<(), SecureClientError> {
        let payload = Bytes::copy_from_slice(payload);
        self.ask(|r| Request::Send(group.to_owned(), service, payload, r))
            .await
    }

    /// Sends like [`SecureSender::send`] without waiting for the task's answer: it returns once
    /// the task has room for the message, and a failure (not in the group, the queue of a key
    /// agreement full, ...) comes back from [`SecureReceiver::receive`] as an error that does not
    /// end the session. Messages queued one after another go out in their order, written in
    /// batches: the way to send many.
    pub async fn queue(
        &mut self,
        group: &str,
        service: ServiceType,
        payload: &[u8],
    ) -> Result<(), SecureClientError> {
        let req = Request::Queue(group.to_owned(), service, Bytes::copy_from_slice(payload));
        self.requests
            .send(req)
            .await
            .map_err(|_| ClientError::Disconnected.into())
    }

    pub async fn leave(&mut self, group: &str) -> Result<(), SecureClientError> {
        self.ask(|r| Request::Leave(group.to_owned(), r)).await
    }

    /// A copy of the key of the group's current secure view (see [`ViewKey`]: it is a secret).
    pub async fn view_key(&mut self, group: &str) -> Result<Option<ViewKey>, SecureClientError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::ViewKey(group.to_owned(), tx))
            .await
            .map_err(|_| ClientError::Disconnected)?;
        rx.await.map_err(|_| ClientError::Disconnected.into())
    }

    /// Leaves every group and closes the session.
    pub async fn disconnect(self) -> Result<(), SecureClientError> {
        self.ask(Request::Disconnect).await
    }
}

impl SecureReceiver {
    /// The next event of a secure group: a secure view, a message opened, a view ending, an
    /// untrusted view, a refusal, a leave. An error ends the session if
    /// [`SecureClientError::is_final`] says so; otherwise it is a refusal, and the session goes on.
    pub async fn receive(&mut self) -> Result<SecureEvent, SecureClientError> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                self.waiting.fetch_sub(1, Relaxed);
                return item;
            }
            match self.events.recv().await {
                Some(batch) => self.ready.extend(batch),
                None => return Err(ClientError::Disconnected.into()),
            }
        }
    }
}

/// The task that owns the session and the secure groups.
struct Driver {
    client: Client,
    identity: Identity,
    directory: SharedDirectory,
    /// Looked up at every event: a member in hundreds of groups pays no ordered search.
    groups: GroupTable,
    events: mpsc::UnboundedSender<Vec<Item>>,
    waiting: Arc<AtomicUsize>,
    /// Events of the batch under way, handed over at its end.
    out: Vec<Item>,
}

impl Driver {
    async fn run(mut self, mut requests: mpsc::Receiver<Request>) {
        let end = loop {
            // Both are cancel-safe: the losing branch loses nothing. Events first: a member that
            // falls behind its deliveries waits with its sends rather than see its session end
            // for want of reading.
            let r = tokio::select! {
                biased;
                ev = self.client.receiver.receive() => match self.events(ev).await {
                    // Then the application's requests: all that wait if the events are drained,
                    // one if more are waiting (a full batch), so that a steady stream of events
                    // keeps no leave or disconnect waiting while the member's sends still wait
                    // for its deliveries.
                    Ok(taken) => match requests.try_recv() {
                        Ok(req) => {
                            let most = if taken >= BATCH { 1 } else { BATCH };
                            self.requests(req, &mut requests, most).await
                        }
                        Err(mpsc::error::TryRecvError::Empty) => Ok(false),
                        Err(mpsc::error::TryRecvError::Disconnected) => Ok(true),
                    },
                    Err(e) => Err(e),
                },
                req = requests.recv() => match req {
                    Some(req) => self.requests(req, &mut requests, BATCH).await,
                    None => return,
                },
            };
            // What the batch made goes out before the task waits again.
            let r = match r {
                Ok(true) => {
                    // What the batch made still goes out (after a disconnect, nowhere).
                    let _ = self.hand_over();
                    let _ = self.client.sender.flush().await;
                    return;
                }
                Ok(false) => match self.hand_over() {
                    Ok(()) => self.client.sender.flush().await.map_err(Into::into),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                break e;
            }
        };
        self.out.push(Err(end));
        let _ = self.hand_over();
    }

    /// `first` and the requests waiting behind it, up to `most`; true once the session is closed.
    async fn requests(
        &mut self,
        first: Request,
        requests: &mut mpsc::Receiver<Request>,
        most: usize,
    ) -> Result<bool, SecureClientError> {
        let mut next = Some(first);
        for _ in 0..most {
            let Some(req) = next.take().or_else(|| requests.try_recv().ok()) else {
                break;
            };
            match req {
                Request::Disconnect(reply) => {
                    // What the batch gathered still reaches the application.
                    let _ = self.hand_over();
                    let r = self.client.sender.disconnect().await;
                    let _ = reply.send(r.map_err(Into::into));
                    return Ok(true);
                }
                Request::ViewKey(group, reply) => {
                    let _ = reply.send(self.groups.get(&group).and_then(|g| g.view_key()));
                }
                req => self.request(req).await?,
            }
        }
        Ok(false)
    }

    /// `first` and the events waiting behind it, up to a batch; how many it took.
    async fn events(
        &mut self,
        first: Result<ClientEvent, ClientError>,
    ) -> Result<usize, SecureClientError> {
        let mut next = Some(first);
        let mut taken = 0;
        while taken < BATCH {
            let Some(ev) = next.take().or_else(|| self.client.receiver.try_receive()) else {
                break;
            };
            taken += 1;
            match ev {
                Ok(ev) => self.event(ev).await?,
                // A refused request is not the session's end.
                Err(e @ ClientError::Refused { .. }) => self.emit(Err(e.into()))?,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(taken)
    }

    async fn request(&mut self, req: Request) -> Result<(), SecureClientError> {
        let (group, answer, reply) = match req {
            Request::Join(group, cfg, reply) => {
                let join = ClientCommand::Join {
                    group: group.clone(),
                    vs: true,
                };
                let answer = if self.groups.contains_key(&group) {
                    Err(SecureClientError::AlreadyJoined(group.clone()))
                } else if let Err(e) = self.client.sender.check(&join) {
                    // A name the daemons refuse, or a group this session is in already.
                    Err(e.into())
                } else {
                    let g = SecureGroup::join(
                        &group,
                        self.client.name(),
                        self.identity.clone(),
                        self.directory.clone(),
                        cfg,
                        Box::new(rand_core::OsRng),
                    );
                    // The keys are asked for before the join, so that the first view has its key.
                    let asked = match g.key_source() {
                        KeySource::Daemons => self.client.sender.keys(&group).await,
                        KeySource::Agreement | KeySource::KeyGraph => Ok(()),
                    };
                    asked
                        .map(|()| {
                            self.groups.insert(g);
                        })
                        .map_err(Into::into)
                };
                (group, answer, Some(reply))
            }
            Request::Send(group, service, payload, reply) => {
                let answer = self.send(&group, service, payload);
                (group, answer, Some(reply))
            }
            Request::Queue(group, service, payload) => {
                let answer = self.send(&group, service, payload);
                (group, answer, None)
            }
            Request::Leave(group, reply) => {
                let answer = match self.groups.get_mut(&group) {
                    Some(g) => {
                        g.leave();
                        Ok(())
                    }
                    None => Err(SecureClientError::NotJoined(group.clone())),
                };
                (group, answer, Some(reply))
            }
            Request::Disconnect(_) | Request::ViewKey(..) => unreachable!("handled by the batch"),
        };
        let (pumped, mut refused) = match self.pump(&group).await {
            Ok(refused) => (Ok(()), refused),
            Err(e) => (Err(e), Vec::new()),
        };
        // The request's own command refused by the session is the request's answer.
        let answer = match answer {
            Ok(()) if !refused.is_empty() => Err(refused.remove(0)),
            a => a,
        };
        match reply {
            Some(reply) => {
                let _ = reply.send(answer.and(pumped.clone()));
            }
            None => {
                if let Err(e) = answer {
                    self.emit(Err(e))?;
                }
            }
        }
        for e in refused {
            self.emit(Err(e))?;
        }
        pumped
    }

    fn send(
        &mut self,
        group: &str,
        service: ServiceType,
        payload: Bytes,
    ) -> Result<(), SecureClientError> {
        match self.groups.get_mut(group) {
            Some(g) => g.send(service, payload).map_err(Into::into),
            None => Err(SecureClientError::NotJoined(group.to_owned())),
        }
    }

    async fn event(&mut self, ev: ClientEvent) -> Result<(), SecureClientError> {
        let Some(g) = ev.group().and_then(|name| self.groups.get_mut(name)) else {
            return Ok(());
        };
        g.handle_event(ev);
        let pumped = pump(g, &mut self.client.sender, &mut self.out).await?;
        if let Some(name) = pumped.left {
            self.groups.remove(&name);
        }
        for e in pumped.refused {
            self.emit(Err(e))?;
        }
        Ok(())
    }

    /// An event for the application, handed over at the end of the batch.
    fn emit(&mut self, e: Item) -> Result<(), SecureClientError> {
        self.out.push(e);
        Ok(())
    }

    /// The batch's events to the application; past the queue's bound, the session ends.
    fn hand_over(&mut self) -> Result<(), SecureClientError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.out);
        let n = batch.len();
        let now = self.waiting.fetch_add(n, Relaxed) + n;
        // The batch that ends the session always goes.
        let last = matches!(batch.last(), Some(Err(e)) if e.is_final());
        if now > EVENT_QUEUE + BATCH && !last {
            return Err(ClientError::Overflow { waiting: now }.into());
        }
        self.events
            .send(batch)
            .map_err(|_| ClientError::Disconnected.into())
    }

    /// [`pump`] of one group; gives the session's refusals of its commands.
    async fn pump(&mut self, group: &str) -> Result<Vec<SecureClientError>, SecureClientError> {
        let Some(g) = self.groups.get_mut(group) else {
            return Ok(Vec::new());
        };
        let pumped = pump(g, &mut self.client.sender, &mut self.out).await?;
        if pumped.left.is_some() {
            self.groups.remove(group);
        }
        Ok(pumped.refused)
    }
}

/// What [`pump`] leaves to its caller.
struct Pumped {
    /// The group's name, if the member is out of it.
    left: Option<String>,
    /// Commands the session refused before they travelled, in order.
    refused: Vec<SecureClientError>,
}

/// Hands the group's events to the application and its commands to the session (written out at
/// the end of the batch).
async fn pump(
    g: &mut SecureGroup,
    sender: &mut crate::Sender,
    out: &mut Vec<Item>,
) -> Result<Pumped, SecureClientError> {
    let mut left = None;
    let mut refused = Vec::new();
    // A trace for histories (the simulator records it); nothing here records.
    while g.poll_consumed().is_some() {}
    while let Some(e) = g.poll_event() {
        if let SecureEvent::Left { group, .. } = &e {
            left = Some(group.clone());
        }
        out.push(Ok(e));
    }
    while let Some(c) = g.poll_command() {
        let multicast = matches!(c, ClientCommand::Multicast { .. });
        let joining = match &c {
            ClientCommand::Join { group, .. } => Some(group.clone()),
            _ => None,
        };
        let r = match c {
            ClientCommand::Join { group, vs } => sender.join(&group, vs).await,
            ClientCommand::Leave { group } => sender.leave(&group).await,
            ClientCommand::FlushAck { group, view } => sender.flush_ack(&group, view).await,
            c @ ClientCommand::Multicast { .. } => sender.queue_multicast(c).await,
        };
        match r {
            Ok(()) => {}
            // Refused before it travels (the session saw the group's end before this layer
            // did): the session goes on, and the group forgets what never went.
            Err(e @ ClientError::Refused { .. }) => {
                if multicast {
                    g.command_refused();
                }
                // A join the session's own checks refuse: the member never gets into the
                // group, so the group is dropped. (A join the daemon refuses later, past its
                // limit of groups per client, comes back as an event naming no group, and the
                // group stays until the application leaves it.)
                if joining.is_some() {
                    left = joining;
                }
                refused.push(e.into());
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Pumped { left, refused })
}
