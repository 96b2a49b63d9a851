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

/// The bytes the daemon's greeting carries with its descriptors (the ring's data, read-only,
/// and the client's end of the signalling socket): this protocol, version 1.
const GREETING: &[u8; 8] = b"CNCLRNG1";
/// The bytes the client's answer carries with its descriptor (its control page).
const ANSWER: &[u8; 8] = b"CNCLCTL1";
/// A ring's data by default: at full load a few milliseconds of a member's deliveries (rings of
/// 512 KiB, 2 MiB and 8 MiB measured alike).
pub const DEFAULT_RING_BYTES: usize = 1 << 20;
/// How long a client waits for the daemon's greeting (a socket that is not a daemon's `shm`
/// socket sends none: the daemon waits for the client to speak first there).
pub const GREETING_TIMEOUT: Duration = Duration::from_secs(5);

/// The daemon's end: replies go into the ring, and a byte on the session's socket wakes a
/// client that sleeps. Writes wait for room (a byte on the signalling socket) when the ring is
/// full.
pub struct RingWriter {
    ring: Producer,
    doorbell: OwnedWriteHalf,
    /// The daemon's end of the socket the client signals room on.
    room: AsyncFd<OwnedFd>,
}

/// The client's end: replies come out of the ring; an empty ring waits for the daemon's byte on
/// the socket, and the end of the session (the socket closed, or the ring freed), once the ring
/// is drained, is the end of the stream.
pub struct RingReader {
    ring: Consumer,
    doorbell: OwnedReadHalf,
    /// The client's end of the socket the daemon waits for room on.
    room: OwnedFd,
    closed: bool,
}

/// Receives exactly `want.len()` bytes, equal to `want`, and `fds` descriptors with them, within
/// [`GREETING_TIMEOUT`].
async fn expect(s: &UnixStream, want: &[u8; 8], fds: usize, what: &str) -> Result<Vec<OwnedFd>> {
    let got = tokio::time::timeout(GREETING_TIMEOUT, async {
        let mut buf = [0u8; 8];
        let mut got = 0;
        let mut handed = Vec::new();
        // The descriptors come with the first byte; the rest may come later.
        while got < buf.len() {
            let (n, more) = s
                .async_io(Interest::READABLE, || {
                    fds::recv_with_fds(s.as_raw_fd(), &mut buf[got..])
                })
                .await?;
            if n == 0 {
                return Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("the connection closed before the {what}"),
                ));
            }
            got += n;
            handed.extend(more);
        }
        Ok((buf, handed))
    })
    .await
    .map_err(|_| Error::new(ErrorKind::TimedOut, format!("no {what}")))??;
    if &got.0 != want || got.1.len() != fds {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("a {what} not of this protocol"),
        ));
    }
    Ok(got.1)
}

/// Sends `bytes` with `fds` attached.
async fn hand(s: &UnixStream, bytes: &[u8; 8], fds: &[std::os::fd::RawFd]) -> Result<()> {
    let sent = s
        .async_io(Interest::WRITABLE, || {
            fds::send_with_fds(s.as_raw_fd(), bytes, fds)
        })
        .await?;
    if sent != bytes.len() {
        return Err(Error::new(
            ErrorKind::WriteZero,
            "a greeting did not go out whole",
        ));
    }
    Ok(())
}

/// The daemon's side of a new connection on its `shm` socket: makes a ring of `ring_bytes`
/// ([`ring::ring_bytes`]), hands the client its read-only view and a signalling socket, and
/// takes the client's control page in answer (within [`GREETING_TIMEOUT`]). The socket's reading
/// half (the client's requests) and the writer of its replies.
pub async fn accept(s: UnixStream, ring_bytes: usize) -> Result<(OwnedReadHalf, RingWriter)> {
    let (mut ring, reader_data) = ring::create(ring_bytes)?;
    let (room, signal) = fds::socketpair()?;
    hand(&s, GREETING, &[reader_data.as_raw_fd(), signal.as_raw_fd()]).await?;
    // The client's copies are in flight or taken; the daemon keeps none.
    drop((reader_data, signal));
    let mut control = expect(&s, ANSWER, 1, "control page").await?;
    ring.attach(control.remove(0))?;
    let (r, w) = s.into_split();
    Ok((
        r,
        RingWriter {
            ring,
            doorbell: w,
            // SAFETY: the socket's end is owned by the `AsyncFd` and closed only with it.
            room: unsafe { AsyncFd::register_with_interest(room, Interest::READABLE)? },
        },
    ))
}

/// The client's side: connects to a daemon's `shm` socket, takes the ring it hands over and
/// hands back its control page. The reader of the daemon's replies, and the socket's writing
/// half (the client's requests).
pub async fn connect(path: &std::path::Path) -> Result<(RingReader, OwnedWriteHalf)> {
    let s = UnixStream::connect(path).await?;
    let what = format!(
        "greeting of a daemon's `shm` socket from {}",
        path.display()
    );
    let [data, room]: [OwnedFd; 2] = expect(&s, GREETING, 2, &what)
        .await?
        .try_into()
        .map_err(|_| Error::new(ErrorKind::InvalidData, "two descriptors"))?;
    let (ring, control) = ring::open(data)?;
    hand(&s, ANSWER, &[control.as_raw_fd()]).await?;
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
        // again all the same). The daemon's end is its own: the client cannot make it block. A
        // client that closed its end is gone: the session ends, rather than the writer spinning.
        match ready.try_io(|fd| fds::drain(fd.get_ref().as_fd())) {
            Ok(Err(e)) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(())),
        }
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
                // A full socket is one with doorbells the client has yet to take; a broken one
                // ends the session through its reading half; any other failure rings again at
                // the next write.
                if this.ring.consumer_to_ring()
                    && fds::poke(this.doorbell.as_ref().as_fd()).is_err()
                {
                    this.ring.ring_again();
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
                    // A full socket holds signals the daemon has yet to take; a closed one is
                    // a daemon gone, which the session's socket says.
                    let _ = fds::poke(self.room.as_fd());
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
