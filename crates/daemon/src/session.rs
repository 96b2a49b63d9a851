//! Client connections (TCP, TLS, Unix socket, or a Unix socket with replies in shared memory):
//! bytes in, bytes out. What the bytes mean, the
//! handshake, the limits and when a connection must close are the node's
//! ([`conclave_node::Node`]); here are only the two tasks that read and write a socket.
//!
//! The reader hands what each read brings to the daemon's core over one bounded channel shared
//! by all connections, and has at most [`READS_IN_FLIGHT`] reads of [`READ_BYTES`] on their way
//! to the core: a client that sends faster than the daemon works waits on its socket (TCP flow
//! control) instead of filling memory. The writer writes what the node framed for the client and
//! reports what it wrote (the node bounds what a client leaves unwritten); a write that does not
//! progress for [`WRITE_TIMEOUT`] ends the connection.

use crate::reads::SharedReads;
use crate::server::ToCore;
use bytes::Bytes;
use conclave_node::{Frames, SessionId, SessionOutput};
use std::io::IoSlice;
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

/// Where a connection's tasks send what they read and wrote, and the count of read buffers
/// the node's views hold (all connections together).
pub(crate) struct Daemon {
    pub core: mpsc::Sender<ToCore>,
    pub written: mpsc::UnboundedSender<Written>,
    pub shared: Arc<SharedReads>,
}

/// Runs one connection until either side ends it: its requests are read from `r` and its
/// replies written to `w` (a socket's halves, or a socket and a shared-memory ring).
pub(crate) async fn run<R, W>(
    r: R,
    w: W,
    id: SessionId,
    binding: Option<[u8; 32]>,
    spread: bool,
    daemon: Daemon,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let Daemon {
        core,
        written,
        shared,
    } = daemon;
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
    let writer = write(w, id, rx, written);
    tokio::pin!(writer);
    tokio::select! {
        _ = read(r, id, core.clone(), shared) => {
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

async fn read<R: AsyncRead + Unpin>(
    mut r: R,
    id: SessionId,
    core: mpsc::Sender<ToCore>,
    shared: Arc<SharedReads>,
) {
    let in_flight = Arc::new(Semaphore::new(READS_IN_FLIGHT));
    // One buffer, read into again unless a read is handed over in it to be shared
    // (crate::reads): a fresh buffer per read is memory the cache has not seen, for the kernel's
    // copy and the node's.
    let mut buf = Vec::with_capacity(READ_BYTES);
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        buf.clear();
        match r.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let msg = match shared.share(&mut buf) {
            Some(bytes) => ToCore::Bytes {
                id,
                bytes,
                shared: true,
                permit,
            },
            None => ToCore::Bytes {
                id,
                bytes: Bytes::copy_from_slice(&buf),
                shared: false,
                permit,
            },
        };
        if core.send(msg).await.is_err() {
            return;
        }
    }
}

/// Most bytes, and most buffers, one write of a connection takes: what is queued beyond them
/// waits for the next write, so that the node hears of written bytes as they go.
const WRITE_BYTES: usize = 1 << 20;
const WRITE_BUFFERS: usize = 64;

async fn write<W: AsyncWrite + Unpin>(
    mut w: W,
    id: SessionId,
    mut rx: mpsc::UnboundedReceiver<SessionOutput>,
    written: mpsc::UnboundedSender<Written>,
) {
    while let Some(first) = rx.recv().await {
        // Everything already queued goes out in one write, as the node framed it: a vectored
        // write copies each buffer once, into the socket.
        let mut next = Some(first);
        let mut close = false;
        let (mut bytes, mut replies) = (0, 0);
        let mut bufs = Vec::new();
        while let Some(o) = next.take() {
            match o {
                SessionOutput::Bytes(frames, n) => {
                    bytes += frames.len();
                    replies += n;
                    bufs.push(frames);
                }
                SessionOutput::Close => {
                    close = true;
                    break;
                }
            }
            if bytes < WRITE_BYTES && bufs.len() < WRITE_BUFFERS {
                next = rx.try_recv().ok();
            }
        }
        match tokio::time::timeout(WRITE_TIMEOUT, write_all(&mut w, &bufs)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        // Dropping the frames gives their payloads' views back at once.
        let spare = bufs
            .into_iter()
            .map(Frames::into_buffer)
            .filter(|b| b.capacity() > 0)
            .collect();
        let _ = written.send(Written {
            id,
            bytes,
            replies,
            spare,
        });
        if close {
            let _ = w.flush().await;
            // Give the client a moment to read the last replies before the socket goes.
            let _ = tokio::time::timeout(Duration::from_millis(100), w.shutdown()).await;
            return;
        }
    }
}

/// Writes every byte of `bufs`, in order, with vectored writes (the system takes at most
/// `IOV_MAX`, 1,024 on Linux, pieces a call; the rest go in the next).
async fn write_all<W: AsyncWrite + Unpin>(w: &mut W, bufs: &[Frames]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = bufs
        .iter()
        .flat_map(Frames::slices)
        .map(IoSlice::new)
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = w.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_node::frames::{ViewBudget, VIEW_MIN_BYTES};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A writer that takes at most `step` bytes per write, as a full socket may.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.step);
            self.got.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            // Up to `step` bytes, across as many slices as that takes.
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.step - n);
                self.got.extend_from_slice(&b[..take]);
                n += take;
                if n == self.step {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn partial_vectored_writes_write_every_buffer_in_order() {
        let mut budget = ViewBudget::default();
        let payload = Bytes::from(vec![b'p'; VIEW_MIN_BYTES]);
        let mut viewed = Frames::from(b"de".to_vec());
        viewed.push_payload(&payload, &mut budget);
        viewed.bytes_mut().extend_from_slice(b"fgh");
        let bufs: Vec<Frames> = vec![
            b"abc".to_vec().into(),
            Vec::new().into(),
            viewed,
            b"i".to_vec().into(),
        ];
        assert_eq!(budget.held(), 1);
        let mut want = b"abcde".to_vec();
        want.extend_from_slice(&payload);
        want.extend_from_slice(b"fghi");
        for step in [1, 2, 4, 100, 10_000] {
            let mut w = Trickle {
                got: Vec::new(),
                step,
            };
            write_all(&mut w, &bufs).await.unwrap();
            assert_eq!(w.got, want, "step {step}");
        }
    }

    #[tokio::test]
    async fn the_writer_writes_queued_outputs_and_gives_their_buffers_back() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (wtx, mut wrx) = mpsc::unbounded_channel();
        let mut budget = ViewBudget::default();
        let mut two = Frames::from(b"two".to_vec());
        two.push_payload(&Bytes::from(vec![b'!'; VIEW_MIN_BYTES]), &mut budget);
        tx.send(SessionOutput::Bytes(b"one".to_vec().into(), 1))
            .unwrap();
        tx.send(SessionOutput::Bytes(two, 2)).unwrap();
        tx.send(SessionOutput::Close).unwrap();
        let (client, server) = tokio::io::duplex(2);
        let reading = tokio::spawn(async move {
            let mut client = client;
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        write(server, 7, rx, wtx).await;
        let mut want = b"onetwo".to_vec();
        want.extend_from_slice(&[b'!'; VIEW_MIN_BYTES]);
        assert_eq!(reading.await.unwrap(), want);
        let w = wrx.recv().await.unwrap();
        assert_eq!((w.id, w.bytes, w.replies), (7, want.len(), 3));
        assert_eq!(w.spare.len(), 2);
        // Written, the payload's view is let go.
        assert_eq!(budget.held(), 0);
    }
}
