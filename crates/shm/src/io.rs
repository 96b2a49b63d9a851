//! The two ends as tokio streams: the daemon writes a [`RingWriter`], the client reads a
//! [`RingReader`], and the code above them is the same as over a socket.

use crate::fds;
use crate::ring::{self, Consumer, Producer};
use std::io::{Error, ErrorKind, IoSlice, Result};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// The bytes the daemon's greeting carries with the descriptors: this protocol, version 1.
const GREETING: &[u8; 8] = b"CNCLRNG1";
/// A ring's data by default: at full load a few milliseconds of a member's deliveries (rings of
/// 512 KiB, 2 MiB and 8 MiB measured alike).
pub const DEFAULT_RING_BYTES: usize = 1 << 20;
/// How long a client waits for the daemon's greeting (a socket that is not a daemon's `shm`
/// socket sends none: the daemon waits for the client to speak first there).
pub const GREETING_TIMEOUT: Duration = Duration::from_secs(5);

/// The daemon's end: replies go into the ring, and a byte on the socket wakes a client that
/// sleeps. Writes wait for room (a byte in the pipe) when the ring is full.
pub struct RingWriter {
    ring: Producer,
    doorbell: OwnedWriteHalf,
    /// The read end of the pipe the client signals room on (the client holds the write end).
    room: AsyncFd<OwnedFd>,
}

/// The client's end: replies come out of the ring; an empty ring waits for the daemon's byte on
/// the socket, and the end of the session (the socket closed, or the ring freed), once the ring
/// is drained, is the end of the stream.
pub struct RingReader {
    ring: Consumer,
    doorbell: OwnedReadHalf,
    /// The write end of the pipe the daemon waits for room on.
    room: OwnedFd,
    closed: bool,
}

/// The daemon's side of a new connection on its `shm` socket: makes a ring of `ring_bytes`
/// ([`ring::ring_bytes`]) and hands it over. The socket's reading half (the client's requests)
/// and the writer of its replies.
pub async fn accept(s: UnixStream, ring_bytes: usize) -> Result<(OwnedReadHalf, RingWriter)> {
    let ring = ring::create(ring_bytes)?;
    let (room, signal) = fds::pipe()?;
    let [data, control] = ring.for_reader();
    let handed = [data.as_raw_fd(), control.as_raw_fd(), signal.as_raw_fd()];
    let sent = s
        .async_io(Interest::WRITABLE, || {
            fds::send_with_fds(s.as_raw_fd(), GREETING, &handed)
        })
        .await?;
    if sent != GREETING.len() {
        return Err(Error::new(
            ErrorKind::WriteZero,
            "the greeting did not go out whole",
        ));
    }
    let (r, w) = s.into_split();
    Ok((
        r,
        RingWriter {
            ring,
            doorbell: w,
            // SAFETY: the pipe's end is owned by the `AsyncFd` and closed only with it.
            room: unsafe { AsyncFd::register_with_interest(room, Interest::READABLE)? },
        },
    ))
}

/// The client's side: connects to a daemon's `shm` socket and takes the ring it hands over.
/// The reader of the daemon's replies, and the socket's writing half (the client's requests).
pub async fn connect(path: &std::path::Path) -> Result<(RingReader, OwnedWriteHalf)> {
    let s = UnixStream::connect(path).await?;
    let greeting = tokio::time::timeout(GREETING_TIMEOUT, async {
        let mut buf = [0u8; GREETING.len()];
        let mut got = 0;
        let mut fds = Vec::new();
        // The descriptors come with the greeting's first byte; the rest may come later.
        while got < buf.len() {
            let (n, more) = s
                .async_io(Interest::READABLE, || {
                    fds::recv_with_fds(s.as_raw_fd(), &mut buf[got..])
                })
                .await?;
            if n == 0 {
                return Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    "the daemon closed the connection before its greeting",
                ));
            }
            got += n;
            fds.extend(more);
        }
        Ok((buf, fds))
    })
    .await
    .map_err(|_| {
        Error::new(
            ErrorKind::TimedOut,
            format!(
                "no greeting from {} (is it a daemon's `shm` socket?)",
                path.display()
            ),
        )
    })??;
    let (bytes, fds) = greeting;
    let Ok::<[OwnedFd; 3], _>([data, control, room]) = fds.try_into() else {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!(
                "{} does not greet as a daemon's `shm` socket",
                path.display()
            ),
        ));
    };
    if &bytes != GREETING {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!(
                "{} greets with {bytes:?}, not as a daemon's `shm` socket",
                path.display()
            ),
        ));
    }
    let ring = ring::open(data, control)?;
    let (r, w) = s.into_split();
    Ok((
        RingReader {
            ring,
            doorbell: r,
            room,
            closed: false,
        },
        w,
    ))
}

impl RingWriter {
    /// Bytes of data the ring holds.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Ready once the client has signalled that it read (the signal is taken: the ring is to
    /// be looked at again).
    fn poll_room_signal(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut ready = ready!(self.room.poll_read_ready(cx))?;
        // Taken here, or by an earlier poll (then the readiness is cleared and the ring looked at
        // again all the same). The daemon's end is its own: the client cannot make it block.
        let _ = ready.try_io(|fd| fds::drain(fd.get_ref().as_fd()));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for RingWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<Result<usize>> {
        let this = self.get_mut();
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        loop {
            let n = this.ring.write(bufs)?;
            if n > 0 {
                if this.ring.consumer_to_ring() {
                    // A full socket is one with doorbells the client has yet to take; a broken
                    // one ends the session through its reading half.
                    let _ = fds::poke(this.doorbell.as_ref().as_fd(), true);
                }
                return Poll::Ready(Ok(n));
            }
            if this.ring.prepare_to_wait()? < this.ring.capacity() {
                continue;
            }
            ready!(this.poll_room_signal(cx))?;
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Waits for the client to read what the ring holds, then closes the socket. (Dropped, the
    /// writer frees the ring: what the client has not read by then is lost, as the caller's
    /// time-out for a shutdown says.)
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        while this.ring.prepare_to_wait()? > 0 {
            ready!(this.poll_room_signal(cx))?;
        }
        Pin::new(&mut this.doorbell).poll_shutdown(cx)
    }
}

impl RingReader {
    /// Bytes of data the ring holds.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// One round of reading: bytes into `buf`, or nothing yet (`Pending`), or the end.
    fn poll_once(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<Result<()>> {
        loop {
            // SAFETY: `read` initializes the first `bytes` of the unfilled part, and only those
            // are then marked initialized.
            let r = self.ring.read(unsafe { buf.unfilled_mut() })?;
            if r.bytes > 0 {
                unsafe { buf.assume_init(r.bytes) };
                buf.advance(r.bytes);
                if r.wake_producer {
                    // A full pipe holds signals the daemon has yet to take; a broken one is a
                    // daemon gone, which the socket says.
                    let _ = fds::poke(self.room.as_fd(), false);
                }
                return Poll::Ready(Ok(()));
            }
            if self.closed || self.ring.prepare_to_wait()? {
                // Closed and drained: the end (no bytes read).
                if self.closed {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut bells = [0u8; 64];
            let mut bells = ReadBuf::new(&mut bells);
            match ready!(Pin::new(&mut self.doorbell).poll_read(cx, &mut bells)) {
                // The daemon closed the socket: what the ring holds is read before the end.
                Ok(()) => self.closed = bells.filled().is_empty(),
                Err(_) => self.closed = true,
            }
        }
    }
}

impl AsyncRead for RingReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        match self.get_mut().poll_once(cx, buf) {
            // The daemon ended the session and freed the ring: the end.
            Poll::Ready(Err(e)) if e.kind() == ErrorKind::ConnectionAborted => Poll::Ready(Ok(())),
            p => p,
        }
    }
}
