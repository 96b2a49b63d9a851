//! Client connections (TCP or Unix socket): frames in, replies out, with every limit a hostile or
//! slow client could push against.
//!
//! The reader splits frames off the stream and hands each request to the daemon's core over one
//! bounded channel shared by all connections, so a client that sends faster than the daemon
//! works waits on its socket (TCP flow control) instead of filling memory. The writer writes what
//! the core queued for the client; the core bounds that queue in count and bytes and disconnects
//! a client that lets it fill (it does not read). A write that does not progress for
//! [`WRITE_TIMEOUT`] ends the connection. A connection that does not say who it is within the
//! handshake time is closed.

use crate::server::ToCore;
use conclave_wire::client::{next_frame, Request};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// A write to a client that makes no progress for this long ends its connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the core queues for a connection.
pub enum Out {
    /// Replies the core has framed (in one pass over its outputs), and how many.
    Frames(Vec<u8>, usize),
    /// Write what is queued before this, then close.
    Close,
}

/// What the core has queued for a connection and the writer has not yet written: the core
/// bounds both, and disconnects a client that lets them grow (it does not read).
#[derive(Default, Debug)]
pub struct Unread {
    pub bytes: AtomicUsize,
    pub replies: AtomicUsize,
    /// Buffers the writer is done with, for the core to frame into again: a fresh buffer per
    /// pass cost growing it step by step and the kernel zeroing its new pages.
    spare: Mutex<Vec<Vec<u8>>>,
}

/// Buffers kept for reuse per connection, and the largest kept: a pass under heavy load frames
/// a few hundred KiB for a client, and an idle connection should not hold a burst's worth.
const SPARE_BUFFERS: usize = 2;
const SPARE_MAX_BYTES: usize = 1 << 20;

impl Unread {
    /// An empty buffer to frame into, reused if the writer gave one back.
    pub fn buffer(&self, room: usize) -> Vec<u8> {
        let spare = self.spare.lock().ok().and_then(|mut s| s.pop());
        spare.unwrap_or_else(|| Vec::with_capacity(room))
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > SPARE_MAX_BYTES {
            return;
        }
        buf.clear();
        if let Ok(mut spare) = self.spare.lock() {
            if spare.len() < SPARE_BUFFERS {
                spare.push(buf);
            }
        }
    }
}

/// Runs one connection until either side ends it.
pub(crate) async fn run<S>(
    stream: S,
    id: u64,
    core: mpsc::Sender<ToCore>,
    queue: usize,
    handshake: Duration,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (tx, rx) = mpsc::channel(queue.max(1));
    let unread = Arc::new(Unread::default());
    if core
        .send(ToCore::Open {
            id,
            tx,
            unread: unread.clone(),
        })
        .await
        .is_err()
    {
        return;
    }
    let (r, w) = tokio::io::split(stream);
    let writer = write(w, rx, unread);
    tokio::pin!(writer);
    tokio::select! {
        _ = read(r, id, core.clone(), handshake) => {
            // The client is gone or misbehaved; what the core still queues for it (a refusal
            // with the reason) is written before the connection closes.
            let _ = core.send(ToCore::Gone { id }).await;
            let _ = tokio::time::timeout(WRITE_TIMEOUT, &mut writer).await;
        }
        _ = &mut writer => {
            let _ = core.send(ToCore::Gone { id }).await;
        }
    }
}

async fn read<R: AsyncRead + Unpin>(
    mut r: R,
    id: u64,
    core: mpsc::Sender<ToCore>,
    handshake: Duration,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut start = 0;
    let mut greeted = false;
    let deadline = tokio::time::Instant::now() + handshake;
    loop {
        loop {
            match next_frame(&buf[start..]) {
                Ok(Some((body, used))) => {
                    let req = match Request::decode(body) {
                        Ok(req) => req,
                        Err(e) => {
                            let reason = format!("undecodable request: {e}");
                            let _ = core.send(ToCore::Garbage { id, reason }).await;
                            return;
                        }
                    };
                    greeted = true;
                    if core.send(ToCore::Request { id, req }).await.is_err() {
                        return;
                    }
                    start += used;
                }
                Ok(None) => break,
                Err(e) => {
                    let reason = format!("bad frame: {e}");
                    let _ = core.send(ToCore::Garbage { id, reason }).await;
                    return;
                }
            }
        }
        buf.drain(..start);
        start = 0;
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        let n = if greeted {
            r.read_buf(&mut buf).await
        } else {
            match tokio::time::timeout_at(deadline, r.read_buf(&mut buf)).await {
                Ok(n) => n,
                Err(_) => {
                    let reason = "no connect request in time".to_string();
                    let _ = core.send(ToCore::Garbage { id, reason }).await;
                    return;
                }
            }
        };
        match n {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

async fn write<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::Receiver<Out>, unread: Arc<Unread>) {
    let mut out = Vec::new();
    while let Some(first) = rx.recv().await {
        // Everything already queued goes out in one write.
        let mut next = Some(first);
        let mut close = false;
        let mut replies = 0;
        while let Some(o) = next.take() {
            match o {
                Out::Frames(frames, n) => {
                    if out.is_empty() {
                        unread.give_back(std::mem::replace(&mut out, frames));
                    } else {
                        out.extend_from_slice(&frames);
                        unread.give_back(frames);
                    }
                    replies += n;
                }
                Out::Close => {
                    close = true;
                    break;
                }
            }
            if out.len() < 256 * 1024 {
                next = rx.try_recv().ok();
            }
        }
        match tokio::time::timeout(WRITE_TIMEOUT, w.write_all(&out)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        unread.bytes.fetch_sub(out.len(), Relaxed);
        unread.replies.fetch_sub(replies, Relaxed);
        out.clear();
        if close {
            let _ = w.flush().await;
            // Give the client a moment to read the last replies before the socket goes.
            let _ = tokio::time::timeout(Duration::from_millis(100), w.shutdown()).await;
            return;
        }
    }
}
