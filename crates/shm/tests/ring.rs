#![cfg(target_os = "linux")]

use conclave_shm::ring::{self, CONTROL_BYTES, HEADER_BYTES, MIN_RING_BYTES};
use proptest::prelude::*;
use std::io::{ErrorKind, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The byte at position `i` of every stream these tests send.
fn byte(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

/// A ring with its reader attached, as the greeting and its answer make it; and the reader's
/// descriptor of the data.
fn ring_pair() -> (ring::Producer, ring::Consumer, OwnedFd) {
    let (mut p, data) = ring::create(0).unwrap();
    let (c, control) = ring::open(data.try_clone().unwrap()).unwrap();
    p.attach(control).unwrap();
    (p, c, data)
}

/// A shared mapping of the first page of `fd`, writable: what a peer that misbehaves writes.
struct Page {
    ptr: *mut u8,
}

impl Page {
    fn map(fd: &OwnedFd) -> Page {
        // SAFETY: a fresh shared mapping, unmapped on drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        Page { ptr: ptr.cast() }
    }
    fn put(&self, at: usize, v: u64) {
        // SAFETY: inside the mapped page.
        unsafe { std::ptr::write_volatile(self.ptr.add(at).cast::<u64>(), v) }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), 4096) };
    }
}

/// A memory object of `len` bytes, allocated; sealed with `seals` after `before_seal` ran on it.
fn memory(len: usize, seals: libc::c_int, before_seal: impl FnOnce(&OwnedFd)) -> OwnedFd {
    let raw =
        unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    assert_eq!(
        unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) },
        0
    );
    if len > 0 {
        assert_eq!(
            unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len as libc::off_t) },
            0
        );
    }
    before_seal(&fd);
    assert_eq!(
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) },
        0
    );
    fd
}

const CONTROL_SEALS: libc::c_int =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;

/// A control page sealed as a client seals it, with the page the test writes it through: a
/// client that writes what it likes there.
fn hostile_control() -> (OwnedFd, Page) {
    let mut page = None;
    let fd = memory(CONTROL_BYTES, CONTROL_SEALS, |fd| {
        page = Some(Page::map(fd))
    });
    (fd, page.unwrap())
}

fn read_all(c: &mut ring::Consumer, n: usize) -> Vec<u8> {
    let mut out = vec![MaybeUninit::new(0u8); n];
    let r = c.read(&mut out).unwrap();
    out[..r.bytes]
        .iter()
        .map(|b| unsafe { b.assume_init() })
        .collect()
}

#[test]
fn a_ring_carries_a_long_stream_in_order_across_its_wrap_between_threads() {
    let (mut p, mut c, _) = ring_pair();
    assert_eq!(p.capacity(), MIN_RING_BYTES);
    let total: u64 = 16 << 20;
    let producer = std::thread::spawn(move || {
        let mut sent = 0u64;
        let mut step = 1usize;
        while sent < total {
            // Pieces of many sizes, two slices at a time, some larger than the ring.
            step = (step * 7 + 13) % 300_000 + 1;
            let n = step.min((total - sent) as usize);
            let piece: Vec<u8> = (sent..sent + n as u64).map(byte).collect();
            let (a, b) = piece.split_at(n / 3);
            let w = p.write(&[IoSlice::new(a), IoSlice::new(b)]).unwrap();
            sent += w as u64;
            if w == 0 && p.prepare_to_wait().unwrap() == p.capacity() {
                std::thread::yield_now();
            }
        }
        // Dropped, it would free the ring before the reader is done.
        p
    });
    let mut got = 0u64;
    let mut size = 5usize;
    while got < total {
        size = (size * 11 + 3) % 200_000 + 1;
        let bytes = read_all(&mut c, size);
        for (k, b) in bytes.iter().enumerate() {
            assert_eq!(*b, byte(got + k as u64), "at byte {}", got + k as u64);
        }
        got += bytes.len() as u64;
        if bytes.is_empty() && !c.prepare_to_wait().unwrap() {
            std::thread::yield_now();
        }
    }
    let _p = producer.join().unwrap();
}

#[test]
fn a_full_ring_takes_nothing_until_read_and_the_reader_wakes_a_waiting_writer_once() {
    let (mut p, mut c, _) = ring_pair();
    let big = vec![7u8; MIN_RING_BYTES + 10];
    assert_eq!(p.write(&[IoSlice::new(&big)]).unwrap(), MIN_RING_BYTES);
    assert_eq!(p.write(&[IoSlice::new(b"x")]).unwrap(), 0);
    assert_eq!(p.prepare_to_wait().unwrap(), MIN_RING_BYTES, "full");
    let r = c.read(&mut [MaybeUninit::new(0u8); 100]).unwrap();
    assert_eq!(r.bytes, 100);
    assert!(r.wake_producer, "the producer said it sleeps");
    assert!(
        !c.read(&mut [MaybeUninit::new(0u8); 1])
            .unwrap()
            .wake_producer
    );
    assert_eq!(
        p.prepare_to_wait().unwrap(),
        MIN_RING_BYTES - 101,
        "room was freed"
    );
    assert_eq!(p.write(&[IoSlice::new(&big)]).unwrap(), 101);
}

#[test]
fn an_empty_ring_asks_to_be_woken_and_the_next_write_rings_once_or_again_if_it_failed() {
    let (mut p, mut c, _) = ring_pair();
    assert!(!c.prepare_to_wait().unwrap());
    p.write(&[IoSlice::new(b"hello")]).unwrap();
    assert!(p.consumer_to_ring());
    p.write(&[IoSlice::new(b"!")]).unwrap();
    assert!(!p.consumer_to_ring(), "rung once a sleep");
    p.ring_again();
    assert!(
        p.consumer_to_ring(),
        "a doorbell that failed rings at the next write"
    );
    assert!(c.prepare_to_wait().unwrap(), "bytes wait: no sleep");
    assert_eq!(read_all(&mut c, 64), b"hello!");
}

#[test]
fn a_ring_or_a_control_page_not_of_the_protocol_is_refused() {
    let resize = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    for len in [0usize, 100, HEADER_BYTES, HEADER_BYTES + MIN_RING_BYTES + 1] {
        let e = ring::open(memory(len, resize, |_| {}))
            .err()
            .expect("refused");
        assert_eq!(e.kind(), ErrorKind::InvalidData, "{len}: {e}");
    }
    let len = HEADER_BYTES + MIN_RING_BYTES;
    let e = ring::open(memory(len, libc::F_SEAL_GROW, |_| {}))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("shrinking"), "{e}");
    // Control pages the client could free, resize, or that are not one page.
    let unsealed = [
        memory(CONTROL_BYTES, resize, |_| {}),
        memory(
            CONTROL_BYTES,
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL,
            |_| {},
        ),
        memory(2 * CONTROL_BYTES, CONTROL_SEALS, |_| {}),
    ];
    for control in unsealed {
        let (mut p, _) = ring::create(0).unwrap();
        let e = p.attach(control).expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
    }
}

#[test]
fn the_reader_can_neither_write_resize_nor_free_the_data_and_nobody_frees_its_control_page() {
    let (_p, _c, data) = ring_pair();
    let fd = data.as_raw_fd();
    let len = (HEADER_BYTES + MIN_RING_BYTES) as libc::off_t;
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    unsafe {
        assert!(libc::write(fd, b"x".as_ptr().cast(), 1) < 0, "write");
        assert_ne!(libc::ftruncate(fd, 4096), 0, "shrink");
        assert_ne!(libc::ftruncate(fd, 2 * len), 0, "grow");
        assert_ne!(libc::fallocate(fd, punch, 0, len), 0, "free pages");
        assert_ne!(
            libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_WRITE),
            0,
            "seal"
        );
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let m = libc::mmap(std::ptr::null_mut(), 4096, rw, libc::MAP_SHARED, fd, 0);
        assert_eq!(m, libc::MAP_FAILED, "map to write");
        let ro = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(ro, libc::MAP_FAILED);
        assert_ne!(libc::mprotect(ro, 4096, rw), 0, "make the view writable");
        assert_ne!(
            libc::madvise(ro, 4096, libc::MADV_REMOVE),
            0,
            "free pages by advice"
        );
        libc::munmap(ro, 4096);
        // The object is its owner's to read only: another user cannot open it again to write.
        let mut st: libc::stat = std::mem::zeroed();
        assert_eq!(libc::fstat(fd, &mut st), 0);
        assert_eq!(st.st_mode & 0o777, 0o400);
    }
    // A control page as the client seals it: no one frees it, even with a writable descriptor.
    let (control, _page) = hostile_control();
    let c = control.as_raw_fd();
    unsafe {
        assert_ne!(
            libc::fallocate(c, punch, 0, 4096),
            0,
            "free the control page"
        );
        assert!(
            libc::write(c, b"x".as_ptr().cast(), 1) < 0,
            "write the control page"
        );
        assert_ne!(libc::ftruncate(c, 0), 0, "shrink the control page");
    }
}

/// Blocks of storage the memory object holds.
fn blocks(fd: &OwnedFd) -> i64 {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_blocks as i64
}

#[test]
fn a_reader_that_keeps_the_descriptor_does_not_keep_the_writers_pages() {
    let (mut p, mut c, data) = ring_pair();
    assert!(
        blocks(&data) * 512 >= (HEADER_BYTES + MIN_RING_BYTES) as i64,
        "allocated at once"
    );
    assert_eq!(p.write(&[IoSlice::new(b"last words")]).unwrap(), 10);
    assert_eq!(read_all(&mut c, 5), b"last ");
    drop(p);
    assert_eq!(blocks(&data), 0, "the session's end freed the ring");
    // What was not read by then is gone, and the reader is told so, not handed zeros.
    let e = c.read(&mut [MaybeUninit::new(0u8); 64]).expect_err("freed");
    assert_eq!(e.kind(), ErrorKind::ConnectionAborted);
}

proptest! {
    /// Whatever a hostile reader writes as its position, the writer takes it only if it is
    /// possible (not behind what it read before, not past what was written): then the room is
    /// what that position frees, and otherwise the write errs.
    #[test]
    fn the_writer_believes_no_impossible_head(
        written in 0..=MIN_RING_BYTES,
        head in prop_oneof![any::<u64>(), 0..300_000u64],
    ) {
        let (mut p, _) = ring::create(0).unwrap();
        let (control, h) = hostile_control();
        p.attach(control).unwrap();
        prop_assert_eq!(p.write(&[IoSlice::new(&vec![1u8; written])]).unwrap(), written);
        h.put(0, head);
        let big = vec![2u8; 2 * MIN_RING_BYTES];
        match p.write(&[IoSlice::new(&big)]) {
            Ok(n) => {
                prop_assert!(head <= written as u64);
                prop_assert_eq!(n as u64, MIN_RING_BYTES as u64 - (written as u64 - head));
                if head > 0 {
                    h.put(0, head - 1);
                    prop_assert!(p.write(&[IoSlice::new(b"z")]).is_err(), "a head that went back");
                }
            }
            Err(e) => {
                prop_assert!(head > written as u64);
                prop_assert_eq!(e.kind(), ErrorKind::InvalidData);
            }
        }
    }

    /// Whatever a misbehaving writer publishes as its position, the reader (some way into the
    /// stream, across the ring's wrap) takes only what the ring can hold and errs otherwise.
    #[test]
    fn the_reader_believes_no_impossible_tail(
        read in 0..3 * MIN_RING_BYTES as u64,
        tail in prop_oneof![any::<u64>(), 0..4 * MIN_RING_BYTES as u64],
    ) {
        let mut page = None;
        let data = memory(HEADER_BYTES + MIN_RING_BYTES, libc::F_SEAL_SHRINK, |fd| {
            page = Some(Page::map(fd))
        });
        let d = page.unwrap();
        let (mut c, _control) = ring::open(data).unwrap();
        // The reader reads `read` bytes first, in pieces of at most the ring.
        let mut done = 0;
        while done < read {
            let n = (read - done).min(MIN_RING_BYTES as u64);
            d.put(0, done + n);
            prop_assert_eq!(read_all(&mut c, n as usize).len() as u64, n);
            done += n;
        }
        d.put(0, tail);
        let mut out = vec![MaybeUninit::new(0u8); 2 * MIN_RING_BYTES];
        let fits = tail >= read && tail - read <= MIN_RING_BYTES as u64;
        match c.read(&mut out) {
            Ok(r) => prop_assert!(fits && r.bytes as u64 == tail - read),
            Err(e) if tail == 0 && read > 0 => {
                prop_assert_eq!(e.kind(), ErrorKind::ConnectionAborted)
            }
            Err(e) => {
                prop_assert!(!fits);
                prop_assert_eq!(e.kind(), ErrorKind::InvalidData);
            }
        }
    }
}

/// A socket path of its own for each test.
fn socket_path(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("conclave-shm-{tag}-{}.sock", std::process::id()))
}

/// A Unix socket listening at a fresh path of its own (what a daemon's `shm` socket is).
fn listen(tag: &str) -> (std::path::PathBuf, tokio::net::UnixListener) {
    let path = socket_path(tag);
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    (path, l)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_a_ring_carries_replies_and_requests_and_ends_after_the_last_reply() {
    // A lost wake-up would hang: it fails instead.
    tokio::time::timeout(std::time::Duration::from_secs(60), session())
        .await
        .expect("the session ended");
}

async fn session() {
    let (path, l) = listen("session");
    let total: usize = 8 << 20;
    let daemon = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let (mut requests, mut w) = conclave_shm::accept(s, 0).await.unwrap();
        assert_eq!(w.capacity(), MIN_RING_BYTES);
        let mut asked = [0u8; 5];
        requests.read_exact(&mut asked).await.unwrap();
        assert_eq!(&asked, b"hello");
        // Replies in pieces of many sizes; a pause now and then lets the client sleep.
        let mut sent = 0;
        let mut step = 3usize;
        while sent < total {
            step = (step * 13 + 5) % 70_000 + 1;
            let n = step.min(total - sent);
            let piece: Vec<u8> = (sent..sent + n).map(|i| byte(i as u64)).collect();
            w.write_all(&piece).await.unwrap();
            sent += n;
            if step.is_multiple_of(17) {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        w.shutdown().await.unwrap();
    });
    let (mut r, mut w) = conclave_shm::connect(&path).await.unwrap();
    w.write_all(b"hello").await.unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 50_000];
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        // A slow reader now and then: the daemon finds the ring full and waits for room.
        if got.len() % 7 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
    daemon.await.unwrap();
    assert_eq!(got.len(), total);
    assert!(got.iter().enumerate().all(|(i, b)| *b == byte(i as u64)));
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_socket_that_greets_otherwise_is_not_taken_for_a_daemons_ring() {
    let (path, l) = listen("stranger");
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        s.write_all(b"CNCLRNG1").await.unwrap();
        s
    });
    let e = conclave_shm::connect(&path).await.err().expect("refused");
    assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
    drop(server.await);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_reader_is_gone_errs_instead_of_waiting_or_spinning() {
    let (path, l) = listen("gone");
    let daemon = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let (_requests, mut w) = conclave_shm::accept(s, 0).await.unwrap();
        // More than the ring holds: the write waits for room, which never comes.
        let big = vec![3u8; 2 * MIN_RING_BYTES];
        tokio::time::timeout(std::time::Duration::from_secs(20), w.write_all(&big)).await
    });
    let (r, w) = conclave_shm::connect(&path).await.unwrap();
    drop(r);
    let ended = daemon
        .await
        .unwrap()
        .expect("the write ended before its time-out");
    assert!(ended.is_err(), "a reader that is gone cannot free room");
    drop(w);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_client_that_answers_without_its_control_page_is_refused() {
    let (path, l) = listen("answer");
    let daemon = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        conclave_shm::accept(s, 0).await.map(|_| ())
    });
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut greeting = [0u8; 8];
    s.read_exact(&mut greeting).await.unwrap();
    assert_eq!(&greeting, b"CNCLRNG1");
    s.write_all(b"CNCLCTL1").await.unwrap();
    let e = daemon.await.unwrap().expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
    let _ = std::fs::remove_file(&path);
}
