//! The Conclave client library: a session with a daemon over TCP or a Unix socket.
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
//! Sending is flow-controlled: at most a window of messages is on its way to the daemon and not
//! yet accepted by it (acknowledged with [`ClientEvent::Sent`]); `multicast` waits past that, so
//! a fast sender waits for the ring instead of being refused.
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
//! Refusals ([`ClientError::Refused`]) are not fatal: the daemon refused one request (most are
//! caught here before they travel) and the session goes on.

pub mod core;

pub use crate::core::ClientError;
use crate::core::{ReplyDecoder, SessionState};
use conclave_wire::client::{frame, Reply, Request};
pub use conclave_wire::client::{ClientCommand, ClientEvent, GroupViewId, Reason};
pub use conclave_wire::gcs::ServiceType;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, Semaphore};

/// Messages on their way to the daemon and not yet accepted, at most.
pub const DEFAULT_WINDOW: usize = 256;
/// Events received and not yet taken by `receive`, at most (and one batch more); past it the
/// library stops reading, and a daemon whose client does not read disconnects it.
pub const EVENT_QUEUE: usize = 65_536;
/// Events the reading task decodes before handing them over together.
pub const EVENT_BATCH: usize = 256;

type Item = Result<ClientEvent, ClientError>;

/// Where a daemon takes clients: `host:port` or `tcp:host:port`, or `unix:/path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Tcp(String),
    Unix(PathBuf),
}

impl std::str::FromStr for Address {
    type Err = ClientError;
    fn from_str(s: &str) -> Result<Self, ClientError> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(ClientError::Invalid("unix: needs a path".into()));
            }
            return Ok(Address::Unix(p.into()));
        }
        let hp = s.strip_prefix("tcp:").unwrap_or(s);
        if !hp.contains(':') {
            return Err(ClientError::Invalid(format!(
                "{s:?} is not host:port, tcp:host:port or unix:/path"
            )));
        }
        Ok(Address::Tcp(hp.to_owned()))
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(a) => write!(f, "{a}"),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

type Writer = BufWriter<Box<dyn AsyncWrite + Unpin + Send>>;

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
    state: SessionState,
    window: Arc<Semaphore>,
}

/// The receiving half of a client.
pub struct Receiver {
    rx: mpsc::Receiver<Vec<Item>>,
    /// Room for events in the channel: the reading task takes it, `receive` gives it back.
    room: Arc<Semaphore>,
    /// The rest of the last batch handed over.
    ready: std::collections::VecDeque<Item>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.reader.abort();
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
            #[cfg(unix)]
            Address::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await?;
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            #[cfg(not(unix))]
            Address::Unix(_) => return Err(ClientError::Invalid("no Unix sockets here".into())),
        };
        Self::handshake(r, w, name, window.max(1)).await
    }

    async fn handshake(
        mut r: Box<dyn AsyncRead + Unpin + Send>,
        w: Box<dyn AsyncWrite + Unpin + Send>,
        name: &str,
        window: usize,
    ) -> Result<Client, ClientError> {
        let mut w = BufWriter::with_capacity(64 * 1024, w);
        let hello = Request::Connect {
            name: name.to_owned(),
        };
        w.write_all(&frame(&hello.encode())).await?;
        w.flush().await?;
        let mut dec = ReplyDecoder::default();
        let full = loop {
            if let Some(reply) = dec.next_reply()? {
                match reply {
                    Reply::Connected { name } => break name,
                    Reply::Refused { reason } => return Err(ClientError::Refused(reason)),
                    Reply::Event(_) => continue,
                }
            }
            if r.read_buf(dec.buffer()).await? == 0 {
                return Err(ClientError::Disconnected);
            }
        };
        let window = Arc::new(Semaphore::new(window));
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let room = Arc::new(Semaphore::new(EVENT_QUEUE));
        let reader = tokio::spawn(read_replies(r, dec, tx, room.clone(), window.clone()));
        Ok(Client {
            sender: Sender {
                name: full,
                w,
                state: SessionState::default(),
                window,
            },
            receiver: Receiver {
                rx,
                room,
                ready: Default::default(),
                reader,
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

    async fn send(&mut self, cmd: ClientCommand, flush: bool) -> Result<(), ClientError> {
        let bytes = self.state.command(cmd)?;
        self.w
            .write_all(&bytes)
            .await
            .map_err(|_| ClientError::Disconnected)?;
        if flush {
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends what [`Sender::queue`] buffered.
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        self.w.flush().await.map_err(|_| ClientError::Disconnected)
    }

    pub async fn join(&mut self, group: &str, vs: bool) -> Result<(), ClientError> {
        let cmd = ClientCommand::Join {
            group: group.to_owned(),
            vs,
        };
        self.send(cmd, true).await
    }

    pub async fn leave(&mut self, group: &str) -> Result<(), ClientError> {
        let cmd = ClientCommand::Leave {
            group: group.to_owned(),
        };
        self.send(cmd, true).await
    }

    pub async fn flush_ack(&mut self, group: &str, view: GroupViewId) -> Result<(), ClientError> {
        let cmd = ClientCommand::FlushAck {
            group: group.to_owned(),
            view,
        };
        self.send(cmd, true).await
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
        let n = groups.len() as u32;
        let permit = match self.window.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                // Everything buffered goes before waiting, or the wait would never end.
                self.flush().await?;
                self.window
                    .clone()
                    .acquire_many_owned(n)
                    .await
                    .map_err(|_| ClientError::Disconnected)?
            }
        };
        let cmd = ClientCommand::Multicast {
            service,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            payload: conclave_wire::client::Bytes::copy_from_slice(payload),
        };
        self.send(cmd, false).await?;
        // Given back one by one as the daemon acknowledges the message in each group.
        permit.forget();
        Ok(())
    }

    pub async fn disconnect(&mut self) -> Result<(), ClientError> {
        let _ = self
            .w
            .write_all(&frame(&Request::Disconnect.encode()))
            .await;
        let _ = self.w.flush().await;
        let _ = self.w.shutdown().await;
        Ok(())
    }
}

impl Receiver {
    pub async fn receive(&mut self) -> Result<ClientEvent, ClientError> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return item;
            }
            match self.rx.recv().await {
                Some(batch) => {
                    self.room.add_permits(batch.len());
                    self.ready.extend(batch);
                }
                None => return Err(ClientError::Disconnected),
            }
        }
    }
}

/// Takes a full batch, leaving room for as many: growing each batch from empty cost a good
/// part of the reader's time under load.
fn next_batch(batch: &mut Vec<Item>) -> Vec<Item> {
    let room = batch.len();
    std::mem::replace(batch, Vec::with_capacity(room))
}

async fn read_replies(
    mut r: Box<dyn AsyncRead + Unpin + Send>,
    mut dec: ReplyDecoder,
    tx: mpsc::Sender<Vec<Item>>,
    room: Arc<Semaphore>,
    window: Arc<Semaphore>,
) {
    let hand_over = |batch: Vec<Item>| {
        let (tx, room) = (&tx, &room);
        async move {
            match room.acquire_many(batch.len() as u32).await {
                Ok(p) => p.forget(),
                Err(_) => return false,
            }
            tx.send(batch).await.is_ok()
        }
    };
    // What one read brought is decoded, then handed over at once: one wake-up of the receiving
    // task for many events.
    let mut batch = Vec::new();
    let end = loop {
        match dec.next_reply() {
            Err(e) => break ClientError::Protocol(e),
            Ok(Some(Reply::Event(ClientEvent::Closed { reason }))) => {
                break ClientError::Closed(reason)
            }
            Ok(Some(reply)) => {
                let item = match reply {
                    Reply::Event(ev) => {
                        if matches!(ev, ClientEvent::Sent { .. }) {
                            window.add_permits(1);
                        }
                        Ok(ev)
                    }
                    Reply::Refused { reason } => Err(ClientError::Refused(reason)),
                    Reply::Connected { .. } => continue,
                };
                batch.push(item);
                if batch.len() >= EVENT_BATCH && !hand_over(next_batch(&mut batch)).await {
                    return;
                }
                continue;
            }
            Ok(None) => {
                if !batch.is_empty() && !hand_over(next_batch(&mut batch)).await {
                    return;
                }
            }
        }
        match r.read_buf(dec.buffer()).await {
            Ok(0) | Err(_) => break ClientError::Disconnected,
            Ok(_) => {}
        }
    };
    window.close();
    batch.push(Err(end));
    let _ = tx.send(batch).await;
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
        assert!("nowhere".parse::<Address>().is_err());
        assert!("unix:".parse::<Address>().is_err());
    }
}
