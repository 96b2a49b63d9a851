//! Client connections (TCP, TLS or Unix socket): bytes in, bytes out. What the bytes mean, the
//! handshake, the limits and when a connection must close are the node's
//! ([`conclave_node::Node`]); here are only the two tasks that read and write a socket.
//!
//! The reader hands what each read brings to the daemon's core over one bounded channel shared
//! by all connections, and has at most [`READS_IN_FLIGHT`] reads of [`READ_BYTES`] on their way
//! to the core: a client that sends faster than the daemon works waits on its socket (TCP flow
//! control) instead of filling memory. The writer writes what the node framed for the client and
//! reports what it wrote (the node bounds what a client leaves unwritten); a write that does not
//! progress for [`WRITE_TIMEOUT`] ends the connection.

use crate::server::ToCore;
use bytes::BytesMut;
use conclave_node::{SessionId, SessionOutput};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

/// A write to a client that makes no progress for this long ends its connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes one read of a connection takes.
pub const READ_BYTES: usize = 64 * 1024;
/// Reads of one connection on their way to the core at once.
pub const READS_IN_FLIGHT: usize = 4;

/// What a writer reports to the core: bytes and replies written, and buffers to frame into again.
pub(crate) struct Written {
    pub id: SessionId,
    pub bytes: usize,
    pub replies: usize,
    pub spare: Vec<Vec<u8>>,
}

/// Runs one connection until either side ends it.
pub(crate) async fn run<S>(
    stream: S,
    id: SessionId,
    binding: Option<[u8; 32]>,
    spread: bool,
    core: mpsc::Sender<ToCore>,
    written: mpsc::UnboundedSender<Written>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let open = ToCore::Open {
        id,
        tx,
        binding,
        spread,
    };
    if core.send(open).await.is_err() {
        return;
    }
    let (r, w) = tokio::io::split(stream);
    let writer = write(w, id, rx, written);
    tokio::pin!(writer);
    tokio::select! {
        _ = read(r, id, core.clone()) => {
            // The client is gone; what the node still queues for it is written before the
            // connection closes.
            let _ = core.send(ToCore::Gone { id }).await;
            let _ = tokio::time::timeout(WRITE_TIMEOUT, &mut writer).await;
        }
        _ = &mut writer => {
            let _ = core.send(ToCore::Gone { id }).await;
        }
    }
}

async fn read<R: AsyncRead + Unpin>(mut r: R, id: SessionId, core: mpsc::Sender<ToCore>) {
    let in_flight = Arc::new(Semaphore::new(READS_IN_FLIGHT));
    // One buffer, read into again once the node is done with what was read before (a fresh
    // buffer per read is memory the cache has not seen, for the kernel's copy and the node's).
    let mut buf = BytesMut::with_capacity(READ_BYTES);
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        buf.reserve(READ_BYTES);
        match r.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let bytes = buf.split().freeze();
        let msg = ToCore::Bytes { id, bytes, permit };
        if core.send(msg).await.is_err() {
            return;
        }
    }
}

async fn write<W: AsyncWrite + Unpin>(
    mut w: W,
    id: SessionId,
    mut rx: mpsc::UnboundedReceiver<SessionOutput>,
    written: mpsc::UnboundedSender<Written>,
) {
    let mut out = Vec::new();
    while let Some(first) = rx.recv().await {
        // Everything already queued goes out in one write.
        let mut next = Some(first);
        let mut close = false;
        let mut replies = 0;
        let mut spare = Vec::new();
        while let Some(o) = next.take() {
            match o {
                SessionOutput::Bytes(frames, n) => {
                    if out.is_empty() {
                        spare.push(std::mem::replace(&mut out, frames));
                    } else {
                        out.extend_from_slice(&frames);
                        spare.push(frames);
                    }
                    replies += n;
                }
                SessionOutput::Close => {
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
        spare.retain(|b| b.capacity() > 0);
        let _ = written.send(Written {
            id,
            bytes: out.len(),
            replies,
            spare,
        });
        out.clear();
        if close {
            let _ = w.flush().await;
            // Give the client a moment to read the last replies before the socket goes.
            let _ = tokio::time::timeout(Duration::from_millis(100), w.shutdown()).await;
            return;
        }
    }
}
