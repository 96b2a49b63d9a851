//! The buffers connections read into, and the bound on what the node's views of them hold.
//!
//! The node keeps a request's payload as a view of the buffer it was read into
//! ([`conclave_node::Node::handle_session_shared`]) until every daemon has the message: no copy
//! and no allocation per message. A view keeps its whole buffer, so a client that pads tiny
//! messages with bytes the daemon lets go (requests it refuses, say) could make it hold a
//! buffer per message, far beyond the byte budgets that count payloads. So the daemon counts the
//! buffers views hold, all connections together: a read goes into a buffer of its own, to be
//! shared, only while they are within [`SHARED_READ_BYTES`], and only a read of at least
//! [`SHARED_READ_MIN_BYTES`] is shared (a smaller one is read as before, its payloads copied
//! out, and its buffer is read into again).

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Most bytes of read buffers that views may hold at once, all connections together: at full
/// load the ring's messages hold a few MiB of them.
pub const SHARED_READ_BYTES: usize = 32 << 20;
/// Smallest read whose payloads are kept as views: a view then holds at most four times what
/// was read.
pub const SHARED_READ_MIN_BYTES: usize = 16 << 10;

/// The count of read buffers held by views, shared by a daemon's connections.
#[derive(Debug)]
pub struct SharedReads {
    held: AtomicUsize,
    budget: usize,
}

impl SharedReads {
    pub fn new(budget: usize) -> Arc<SharedReads> {
        Arc::new(SharedReads {
            held: AtomicUsize::new(0),
            budget,
        })
    }

    /// Bytes of read buffers held now.
    pub fn held(&self) -> usize {
        self.held.load(Relaxed)
    }

    /// Whether a new buffer of `capacity` may be read into to be shared.
    pub fn may_share(&self, capacity: usize) -> bool {
        self.held().saturating_add(capacity) <= self.budget
    }

    /// `buf`, a read, as shared bytes whose buffer counts as held until the last view of it is
    /// dropped; `None` (and `buf` back) when the read is too small to be shared.
    pub fn share(self: &Arc<Self>, buf: Vec<u8>) -> Result<Bytes, Vec<u8>> {
        if buf.len() < SHARED_READ_MIN_BYTES {
            return Err(buf);
        }
        let capacity = buf.capacity();
        self.held.fetch_add(capacity, Relaxed);
        Ok(Bytes::from_owner(Held {
            buf,
            reads: self.clone(),
        }))
    }
}

/// A read buffer held by views; its capacity is counted until it is dropped.
struct Held {
    buf: Vec<u8>,
    reads: Arc<SharedReads>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.reads.held.fetch_sub(self.buf.capacity(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_read_counts_until_its_last_view_is_dropped() {
        let reads = SharedReads::new(256 << 10);
        let mut buf = Vec::with_capacity(64 << 10);
        buf.resize(20 << 10, 7u8);
        let bytes = reads.share(buf).unwrap();
        assert_eq!(reads.held(), 64 << 10);
        let view = bytes.slice(100..200);
        drop(bytes);
        assert_eq!(reads.held(), 64 << 10, "a view still holds the buffer");
        assert_eq!(&view[..], &[7u8; 100][..]);
        drop(view);
        assert_eq!(reads.held(), 0);
    }

    #[test]
    fn a_small_read_is_not_shared() {
        let reads = SharedReads::new(256 << 10);
        let buf = vec![1u8; SHARED_READ_MIN_BYTES - 1];
        let back = reads.share(buf).unwrap_err();
        assert_eq!(back.len(), SHARED_READ_MIN_BYTES - 1);
        assert_eq!(reads.held(), 0);
    }

    #[test]
    fn past_the_budget_reads_are_not_shared() {
        let reads = SharedReads::new(128 << 10);
        let full = |n| {
            let mut b = Vec::with_capacity(64 << 10);
            b.resize(n, 0u8);
            b
        };
        assert!(reads.may_share(64 << 10));
        let a = reads.share(full(32 << 10)).unwrap();
        assert!(reads.may_share(64 << 10));
        let b = reads.share(full(32 << 10)).unwrap();
        assert!(
            !reads.may_share(64 << 10),
            "two buffers of 64 KiB fill 128 KiB"
        );
        drop(a);
        assert!(reads.may_share(64 << 10));
        drop(b);
        assert_eq!(reads.held(), 0);
    }
}
