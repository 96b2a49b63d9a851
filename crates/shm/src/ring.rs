//! One ring of bytes in shared memory: a daemon writes, one client reads.
//!
//! Two memory objects, each written by one side only, and made so that the other side cannot
//! take it away:
//!
//! - the *data*, made by the producer: a page of the producer's words, then the data (a power of
//!   two of bytes), allocated at once. The producer maps it to write; the reader gets a
//!   read-only descriptor of its own, and the object's mode (owner read-only) keeps a reader of
//!   another user from opening it again to write;
//! - the *control* page, made by the consumer: its words. The consumer maps it to write and
//!   seals it (no resizing, no writes but through that mapping: no freed pages) before handing
//!   it over; the producer checks the seals and the allocation, maps it read-only, and believes
//!   nothing it reads there without a check.
//!
//! | object | offset | word | written by |
//! | --- | ---: | --- | --- |
//! | data | 0 | `tail`: bytes written | the producer |
//! | data | 64 | `producer_sleeps`: times the producer waited for room | the producer |
//! | data | 4096 | the data | the producer |
//! | control | 0 | `head`: bytes read | the consumer |
//! | control | 64 | `consumer_sleeps`: times the consumer waited for bytes | the consumer |
//!
//! Positions are counts of bytes since the ring was made, so that full and empty differ.
//!
//! Waking: a side with nothing to do (no bytes, or no room) counts a sleep in its word and looks
//! again before it sleeps; the other side, after publishing its position, reads that count and,
//! if it moved since the last time it rang, rings (a byte on the session's socket, or on the
//! signal socket). A sequentially consistent fence between the store and the load on each side
//! makes at least one of the two see the other's write: no wake-up is lost. A count the consumer
//! forges only costs the producer a doorbell more. The words of the other side are read with
//! relaxed loads and fences, which read-only memory allows.

use std::io::{Error, ErrorKind, IoSlice, Result};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{
    fence, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, Ordering::SeqCst,
};

/// Where the data starts: the producer's words have the first page to themselves.
pub const HEADER_BYTES: usize = 4096;
/// The control page's size.
pub const CONTROL_BYTES: usize = 4096;
/// The smallest ring: a reply of the largest message must fit.
pub const MIN_RING_BYTES: usize = 256 << 10;
/// The largest ring.
pub const MAX_RING_BYTES: usize = 1 << 30;

const TAIL: usize = 0;
const PRODUCER_SLEEPS: usize = 64;
const HEAD: usize = 0;
const CONSUMER_SLEEPS: usize = 64;

fn os_error(what: &str) -> Error {
    let e = Error::last_os_error();
    Error::new(e.kind(), format!("{what}: {e}"))
}

fn invalid(why: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidData, why.into())
}

/// A shared mapping, unmapped when dropped.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain shared memory; the words are accessed atomically, and the data is written only
// through the producer and read only through the consumer, each one `&mut` owner.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> Result<Mapping> {
        let prot = match writable {
            true => libc::PROT_READ | libc::PROT_WRITE,
            false => libc::PROT_READ,
        };
        // SAFETY: a fresh shared mapping of `len` bytes of `fd`; nothing else in this process
        // refers to that range.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mapping a ring"));
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at.is_multiple_of(64) && at + 8 <= self.len);
        // SAFETY: `at` is a 64-byte-aligned offset in the first page of a page-aligned mapping
        // that lives as long as `self`. A word in a read-only mapping is only ever loaded, and
        // relaxed (std's rule for atomics on read-only memory).
        unsafe { &*(self.ptr.add(at) as *const AtomicU64) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range this mapping made; no reference into it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The bytes of a ring of `cap` data bytes (rounded up to a power of two, within bounds).
pub fn ring_bytes(cap: usize) -> usize {
    cap.clamp(MIN_RING_BYTES, MAX_RING_BYTES)
        .next_power_of_two()
}

/// A new memory object of `len` bytes, allocated (a write to it never has to find a page).
fn new_memory(name: &std::ffi::CStr, len: usize) -> Result<OwnedFd> {
    // SAFETY: a C string and flags; the result is checked and owned once.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(os_error("creating a ring's memory"));
    }
    // SAFETY: just opened, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain calls on a descriptor this function owns; results checked.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
            return Err(os_error("sizing a ring's memory"));
        }
        if libc::fallocate(fd.as_raw_fd(), 0, 0, len as libc::off_t) != 0 {
            return Err(os_error("allocating a ring's memory"));
        }
    }
    Ok(fd)
}

/// Seals `fd` with `seals`, and against any further seal.
fn seal(fd: &OwnedFd, seals: libc::c_int) -> Result<()> {
    // SAFETY: a plain call on a live descriptor; checked.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals | libc::F_SEAL_SEAL) } != 0 {
        return Err(os_error("sealing a ring's memory"));
    }
    Ok(())
}

const RESIZE: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// A read-only descriptor of `fd` of its own (a new open file description, not a duplicate):
/// what the reader gets of the data.
fn read_only(fd: &OwnedFd) -> Result<OwnedFd> {
    // Owner read-only: a reader of another user cannot open it again to write through
    // /proc/PID/fd (memory objects are made open to all). One of the daemon's own user could,
    // as it could do anything else to the daemon.
    // SAFETY: a plain call on a descriptor the caller owns; checked.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o400) } != 0 {
        return Err(os_error("restricting a ring's memory"));
    }
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .expect("no NUL in a path of digits");
    // SAFETY: a C string and flags; the result is checked and owned once.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(os_error("reopening a ring's memory read-only"));
    }
    // SAFETY: just opened.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Size of the object behind `fd`.
fn size_of(fd: BorrowedFd<'_>) -> Result<u64> {
    // SAFETY: `st` is written by `fstat` before it is read; the result is checked.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(os_error("reading a ring's size"));
        }
        Ok(st.st_size as u64)
    }
}

/// Makes a ring of `cap` bytes of data ([`ring_bytes`]): its writing side, and the read-only
/// descriptor of the data to hand to the reader. The reader's control page comes later
/// ([`Producer::attach`]).
pub fn create(cap: usize) -> Result<(Producer, OwnedFd)> {
    let cap = ring_bytes(cap);
    let data = new_memory(c"conclave-ring", HEADER_BYTES + cap)?;
    seal(&data, RESIZE)?;
    let reader = read_only(&data)?;
    Ok((
        Producer {
            data_map: Mapping::map(data.as_fd(), HEADER_BYTES + cap, true)?,
            control_map: None,
            data,
            cap,
            tail: 0,
            head: 0,
            sleeps: 0,
            rung: None,
        },
        reader,
    ))
}

/// The consumer's control page: made, mapped to write, then sealed against resizing and
/// against any write but through that mapping (so that no one can free its page under the
/// producer's reads); the mapping, and the descriptor to hand to the producer.
fn control_page() -> Result<(Mapping, OwnedFd)> {
    let fd = new_memory(c"conclave-ring-control", CONTROL_BYTES)?;
    let map = Mapping::map(fd.as_fd(), CONTROL_BYTES, true)?;
    seal(&fd, RESIZE | libc::F_SEAL_FUTURE_WRITE)?;
    Ok((map, fd))
}

/// The seals a control page must have before its producer maps it.
const CONTROL_SEALS: libc::c_int = RESIZE | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;

/// Maps a ring handed over by its producer (the data, read-only): its reading side, and the
/// control page to hand back to the producer.
pub fn open(data: OwnedFd) -> Result<(Consumer, OwnedFd)> {
    let len = size_of(data.as_fd())?;
    let cap = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_sub(HEADER_BYTES))
        .filter(|c| (MIN_RING_BYTES..=MAX_RING_BYTES).contains(c) && c.is_power_of_two())
        .ok_or_else(|| {
            invalid(format!(
                "a shared ring of {len} bytes is not of this protocol"
            ))
        })?;
    // A ring that could shrink under the reader would fault it (SIGBUS).
    // SAFETY: a plain call; the result is checked.
    let seals = unsafe { libc::fcntl(data.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(invalid(
            "a shared ring that is not sealed against shrinking",
        ));
    }
    let data_map = Mapping::map(data.as_fd(), HEADER_BYTES + cap, false)?;
    let (control_map, control) = control_page()?;
    Ok((
        Consumer {
            data_map,
            control_map,
            cap,
            head: 0,
            sleeps: 0,
            signalled: 0,
        },
        control,
    ))
}

/// The writing side of a ring (the daemon's). Dropped, it frees the ring's pages, even though
/// the reader may still hold the memory objects: a reader cannot keep the daemon's memory after
/// its session by keeping the descriptors.
pub struct Producer {
    data_map: Mapping,
    /// The consumer's control page, once attached.
    control_map: Option<Mapping>,
    data: OwnedFd,
    /// Bytes of data, a power of two.
    cap: usize,
    /// Bytes written, as published.
    tail: u64,
    /// Bytes the consumer has read, as last checked.
    head: u64,
    /// Times this side waited for room, as published.
    sleeps: u64,
    /// The consumer's count of sleeps when it was last rung (none: ring at the next write).
    rung: Option<u64>,
}

impl Drop for Producer {
    fn drop(&mut self) {
        // SAFETY: a plain call on a descriptor this side owns. Should it fail, the pages are
        // freed with the object's last descriptor or mapping.
        unsafe {
            libc::fallocate(
                self.data.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                self.data_map.len as libc::off_t,
            )
        };
    }
}

impl Producer {
    /// Bytes of data the ring holds.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Takes the consumer's control page, once its seals (no resizing, no write but through the
    /// consumer's mapping, no further seal: no page of it can be freed), its size and its
    /// allocation are checked; mapped read-only.
    pub fn attach(&mut self, control: OwnedFd) -> Result<()> {
        // SAFETY: plain calls; results checked before `st` is read.
        let (seals, st) = unsafe {
            let seals = libc::fcntl(control.as_raw_fd(), libc::F_GET_SEALS);
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(control.as_raw_fd(), &mut st) != 0 {
                return Err(os_error("reading a control page's size"));
            }
            (seals, st)
        };
        if seals < 0 || seals & CONTROL_SEALS != CONTROL_SEALS {
            return Err(invalid(
                "a control page not sealed as this protocol seals it",
            ));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG
            || st.st_size != CONTROL_BYTES as libc::off_t
            || (st.st_blocks as u64) * 512 < CONTROL_BYTES as u64
        {
            return Err(invalid(
                "a control page of another kind or size, or not allocated",
            ));
        }
        self.control_map = Some(Mapping::map(control.as_fd(), CONTROL_BYTES, false)?);
        Ok(())
    }

    fn control(&self) -> Result<&Mapping> {
        self.control_map
            .as_ref()
            .ok_or_else(|| invalid("the ring's control page is not attached"))
    }

    /// Reads the consumer's position: it may only have moved forward, and not past what was
    /// written.
    fn refresh_head(&mut self) -> Result<()> {
        let h = self.control()?.word(HEAD).load(Relaxed);
        fence(Acquire);
        if h < self.head || h > self.tail {
            return Err(invalid(format!(
                "the reader of a shared ring says it has read {h} bytes, where {} were written \
                 and {} read before",
                self.tail, self.head
            )));
        }
        self.head = h;
        Ok(())
    }

    /// Bytes written and not yet read.
    pub fn unread(&mut self) -> Result<usize> {
        self.refresh_head()?;
        Ok((self.tail - self.head) as usize)
    }

    /// Copies as much of `bufs`, in order, as there is room for, and publishes it: the bytes
    /// written (0 if the ring is full, or `bufs` empty).
    pub fn write(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        let mut room = self.cap - self.unread()?;
        let mut written = 0;
        for b in bufs {
            if room == 0 {
                break;
            }
            let n = b.len().min(room);
            self.copy_in(&b[..n]);
            room -= n;
            written += n;
        }
        if written > 0 {
            self.data_map.word(TAIL).store(self.tail, Release);
        }
        Ok(written)
    }

    fn copy_in(&mut self, src: &[u8]) {
        let at = (self.tail as usize) & (self.cap - 1);
        let first = src.len().min(self.cap - at);
        // SAFETY: both pieces lie inside the data (`at + first <= cap`, and the rest, at most
        // `room <= cap` bytes, from its start), which only this producer writes.
        unsafe {
            let data = self.data_map.ptr.add(HEADER_BYTES);
            std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, src.len() - first);
        }
        self.tail += src.len() as u64;
    }

    /// After a write: whether the consumer went to sleep since it was last rung, and must be
    /// rung now.
    pub fn consumer_to_ring(&mut self) -> bool {
        fence(SeqCst);
        let Ok(control) = self.control() else {
            return false;
        };
        let s = control.word(CONSUMER_SLEEPS).load(Relaxed);
        if self.rung == Some(s) {
            return false;
        }
        self.rung = Some(s);
        true
    }

    /// The doorbell could not be rung: the next write rings again.
    pub fn ring_again(&mut self) {
        self.rung = None;
    }

    /// The producer waits for the consumer to read (for room, or for the ring to drain): counts
    /// a sleep, then looks again. The bytes still unread: if they are already few enough, the
    /// producer need not sleep.
    pub fn prepare_to_wait(&mut self) -> Result<usize> {
        count_sleep(&mut self.sleeps, self.data_map.word(PRODUCER_SLEEPS));
        self.unread()
    }
}

/// The reading side of a ring (the client's).
pub struct Consumer {
    data_map: Mapping,
    control_map: Mapping,
    cap: usize,
    /// Bytes read, as published.
    head: u64,
    /// Times this side waited for bytes, as published.
    sleeps: u64,
    /// The producer's count of sleeps when it was last signalled.
    signalled: u64,
}

/// What a read of a [`Consumer`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Read {
    pub bytes: usize,
    /// The producer went to sleep waiting for room since it was last signalled.
    pub wake_producer: bool,
}

impl Consumer {
    /// Bytes of data the ring holds.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Bytes written and not yet read, checked against what the ring can hold.
    fn ready(&self) -> Result<usize> {
        let t = self.data_map.word(TAIL).load(Relaxed);
        fence(Acquire);
        match t.checked_sub(self.head) {
            Some(n) if n <= self.cap as u64 => Ok(n as usize),
            // The producer's end frees the pages, which then read as zeros.
            _ if t == 0 => Err(freed()),
            _ => Err(invalid(format!(
                "the writer of a shared ring says it has written {t} bytes, where {} were read",
                self.head
            ))),
        }
    }

    /// Copies what waits, as much as fits, into `out`.
    pub fn read(&mut self, out: &mut [std::mem::MaybeUninit<u8>]) -> Result<Read> {
        let n = self.ready()?.min(out.len());
        if n == 0 {
            return Ok(Read {
                bytes: 0,
                wake_producer: false,
            });
        }
        let at = (self.head as usize) & (self.cap - 1);
        let first = n.min(self.cap - at);
        // SAFETY: both pieces lie inside the data and inside `out` (`n <= out.len()`); the
        // producer does not write them again until `head` moves past them.
        unsafe {
            let data = self.data_map.ptr.add(HEADER_BYTES);
            let dst = out.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(data.add(at), dst, first);
            std::ptr::copy_nonoverlapping(data, dst.add(first), n - first);
        }
        // Freed while it was copied (its first page goes first): what was copied may be zeros.
        fence(Acquire);
        if self.data_map.word(TAIL).load(Relaxed) == 0 {
            return Err(freed());
        }
        self.head += n as u64;
        self.control_map.word(HEAD).store(self.head, Release);
        fence(SeqCst);
        let s = self.data_map.word(PRODUCER_SLEEPS).load(Relaxed);
        let wake_producer = s != self.signalled;
        self.signalled = s;
        Ok(Read {
            bytes: n,
            wake_producer,
        })
    }

    /// Nothing to read: counts a sleep, then looks again. True if bytes arrived meanwhile (the
    /// consumer need not sleep).
    pub fn prepare_to_wait(&mut self) -> Result<bool> {
        count_sleep(&mut self.sleeps, self.control_map.word(CONSUMER_SLEEPS));
        Ok(self.ready()? > 0)
    }
}

/// Counts a sleep of one side in its word, then fences: the other side, which fences between
/// its store of a position and its load of this word, either sees the sleep and rings, or this
/// side's next look sees its position (no wake-up is lost).
fn count_sleep(sleeps: &mut u64, word: &AtomicU64) {
    *sleeps += 1;
    word.store(*sleeps, Relaxed);
    fence(SeqCst);
}

/// The producer ended the session and freed the ring.
fn freed() -> Error {
    Error::new(
        ErrorKind::ConnectionAborted,
        "the writer of the shared ring freed it",
    )
}
