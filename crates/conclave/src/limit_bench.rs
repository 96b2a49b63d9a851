//! The machine's limit for `conclave bench throughput --processes --limit` and `bench latency
//! --processes --limit`: the byte flow of a deployed run with the protocol left out, so that the
//! README can say how close to the machine Conclave runs. Each daemon is replaced by a `conclave
//! bench relay` process and each member by a skeleton member:
//!
//! - a member writes its messages to its relay over TCP, 32 length-prefixed frames a write (as
//!   the client library batches), or, for latency, one frame a write at its rate, stamped with
//!   the system clock;
//! - a relay packs what it reads into datagrams of up to 60,000 bytes (a daemon's largest part),
//!   sends each to every other relay over UDP with the daemons' socket buffers, and hands every
//!   datagram, its own and the others', to each of its members over TCP;
//! - a member counts the frames it reads (and, for latency, notes each one's delay).
//!
//! No ordering, token, acknowledgement, membership, codec or sealing: what remains is system
//! calls, copies and wake-ups between processes, which no protocol can avoid. Nothing paces the
//! relays either (that is the token's work), so a datagram can be lost to a full socket buffer;
//! a run reports the fewest frames a member read beside those sent.

use anyhow::{Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;

/// Largest datagram a relay sends (a daemon's largest packet part).
const DATAGRAM_BYTES: usize = 60_000;

/// Largest message a relay carries: one frame in one datagram (a daemon splits larger packets
/// into parts; the relays do not).
pub(crate) const MAX_MESSAGE: usize = DATAGRAM_BYTES - 4;

/// `conclave bench relay`: one relay of the limit run (not for direct use).
#[derive(Args)]
pub struct RelayArgs {
    /// Where its members connect (TCP).
    #[arg(long)]
    listen: SocketAddr,
    /// Its UDP address.
    #[arg(long)]
    peer: SocketAddr,
    /// The other relays' UDP addresses.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<SocketAddr>,
}

/// Datagrams on their way to one member.
type Queue = mpsc::UnboundedSender<Arc<[u8]>>;

/// A relay's members, each with its queue of datagrams to write, and the bytes queued to them
/// all.
#[derive(Clone, Default)]
struct Members {
    queues: Arc<Mutex<Vec<Queue>>>,
    queued: Arc<AtomicUsize>,
}

/// Bytes a relay may have queued for its members before it stops reading its own members'
/// messages: the pacing the token gives the daemons, in its crudest form (without it, senders
/// outrun receivers, and a relay's queues grew past 2 GB in a 4-second run).
const QUEUED_BYTES: usize = 8 << 20;

/// Runs a relay until its standard input closes; says `{"listening":true}` once it takes members.
pub fn run_relay(args: RelayArgs) -> Result<()> {
    // The daemon's runtime (one thread, as `conclave daemon` by default), so that the limit's
    // threads are those of a daemon.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let udp = Arc::new(bind_udp(args.peer)?);
        let listener = TcpListener::bind(args.listen).await?;
        let members = Members::default();
        tokio::spawn(from_peers(udp.clone(), members.clone()));
        let peers = Arc::new(args.peers);
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let _ = s.set_nodelay(true);
                tokio::spawn(serve(s, udp.clone(), peers.clone(), members.clone()));
            }
        });
        println!("{}", serde_json::json!({ "listening": true }));
        // The bench ends the relay by closing its input.
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        anyhow::Ok(())
    })
}

/// The UDP socket, with a daemon's buffers.
fn bind_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    UdpSocket::from_std(s.into())
}

/// Every datagram of another relay goes to each member.
async fn from_peers(udp: Arc<UdpSocket>, members: Members) {
    let mut buf = vec![0u8; 65_536];
    while let Ok(n) = udp.recv(&mut buf).await {
        deliver(&members, buf[..n].into());
    }
}

fn deliver(members: &Members, d: Arc<[u8]>) {
    if let Ok(mut ms) = members.queues.lock() {
        // Counted before it is queued, so that the writer never takes back more than was added;
        // a member that is gone is dropped from the list.
        ms.retain(|m| {
            members.queued.fetch_add(d.len(), Relaxed);
            let sent = m.send(d.clone()).is_ok();
            if !sent {
                members.queued.fetch_sub(d.len(), Relaxed);
            }
            sent
        });
    }
}

/// One member: its frames go out in datagrams; everything delivered here is written to it.
async fn serve(s: TcpStream, udp: Arc<UdpSocket>, peers: Arc<Vec<SocketAddr>>, members: Members) {
    let (mut r, mut w) = s.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Arc<[u8]>>();
    if let Ok(mut ms) = members.queues.lock() {
        ms.push(tx);
    }
    let queued = members.queued.clone();
    tokio::spawn(async move {
        while let Some(d) = rx.recv().await {
            let written = w.write_all(&d).await;
            queued.fetch_sub(d.len(), Relaxed);
            if written.is_err() {
                break;
            }
        }
        // What is still queued for a member that is gone no longer holds the relay back.
        rx.close();
        while let Ok(d) = rx.try_recv() {
            queued.fetch_sub(d.len(), Relaxed);
        }
    });
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut chunk = vec![0u8; 256 << 10];
    loop {
        while members.queued.load(Relaxed) > QUEUED_BYTES {
            tokio::time::sleep(std::time::Duration::from_micros(200)).await;
        }
        let n = match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        // Whole frames, packed into datagrams; a partial frame waits for its rest.
        let mut start = 0;
        let mut end = 0;
        while buf.len() - end >= 4 {
            let len = u32::from_be_bytes(buf[end..end + 4].try_into().unwrap()) as usize;
            // A frame no datagram carries would only grow the buffer: the member is dropped.
            if len > MAX_MESSAGE {
                return;
            }
            if buf.len() - end < 4 + len {
                break;
            }
            if end > start && end + 4 + len - start > DATAGRAM_BYTES {
                send(&udp, &peers, &members, &buf[start..end]).await;
                start = end;
            }
            end += 4 + len;
        }
        if end > start {
            send(&udp, &peers, &members, &buf[start..end]).await;
        }
        buf.drain(..end);
    }
}

async fn send(udp: &UdpSocket, peers: &[SocketAddr], members: &Members, d: &[u8]) {
    for p in peers {
        let _ = udp.send_to(d, p).await;
    }
    deliver(members, d.into());
}

/// A skeleton member's side: writes `payload` as frames, 32 a write, until `until`.
pub(crate) async fn send_frames(
    w: &mut tokio::net::tcp::OwnedWriteHalf,
    payload: &mut [u8],
    until: std::time::Instant,
) -> Result<u64> {
    let mut batch = Vec::with_capacity(32 * (payload.len() + 4));
    let mut sent = 0u64;
    while std::time::Instant::now() < until {
        batch.clear();
        for _ in 0..32 {
            payload[8..16].copy_from_slice(&sent.to_be_bytes());
            push_frame(&mut batch, payload);
            sent += 1;
        }
        w.write_all(&batch).await.context("writing to the relay")?;
    }
    Ok(sent)
}

/// A skeleton member's side, for latency: one frame, written at once.
pub(crate) async fn send_frame(
    w: &mut tokio::net::tcp::OwnedWriteHalf,
    frame: &mut Vec<u8>,
    payload: &[u8],
) -> Result<()> {
    frame.clear();
    push_frame(frame, payload);
    w.write_all(frame).await.context("writing to the relay")
}

/// `payload` as a length-prefixed frame at the end of `buf`.
fn push_frame(buf: &mut Vec<u8>, payload: &[u8]) {
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(payload);
}

/// A skeleton member's side: reads frames, calling `each` with every one's payload, and `settled`
/// before each read.
pub(crate) async fn count_frames(
    mut r: tokio::net::tcp::OwnedReadHalf,
    each: impl Fn(&[u8]),
    mut settled: impl FnMut(),
) {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut chunk = vec![0u8; 256 << 10];
    loop {
        settled();
        let n = match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while buf.len() - at >= 4 {
            let len = u32::from_be_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            if len > MAX_MESSAGE {
                return;
            }
            if buf.len() - at < 4 + len {
                break;
            }
            each(&buf[at + 4..at + 4 + len]);
            at += 4 + len;
        }
        buf.drain(..at);
    }
}

/// The machine's own hiccups, beside a latency limit: the most a thread that sleeps 200 µs at a
/// time, doing nothing else, overslept over `seconds` (in microseconds). A virtual machine whose
/// processors the host takes away now and then shows it here, with no protocol and no load.
pub(crate) fn oversleep_max_us(seconds: f64) -> u64 {
    let nap = std::time::Duration::from_micros(200);
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
    let mut most = std::time::Duration::ZERO;
    while std::time::Instant::now() < until {
        let t = std::time::Instant::now();
        std::thread::sleep(nap);
        most = most.max(t.elapsed().saturating_sub(nap));
    }
    most.as_micros() as u64
}
