//! The buffers connections read into, and the bound on what the node's views of them hold.
//!
//! The node keeps a request's payload as a view of the buffer it was read into
//! ([`conclave_node::Node::handle_session_shared`]) until every daemon has the message: no copy
//! and no allocation per message. A view keeps its whole buffer, so a client that pads tiny
//! messages with bytes the daemon lets go (requests it refuses, say) could make it hold a
//! buffer per message, far beyond the byte budgets that count payloads. So the daemon counts the
//! buffers views hold, all connections together: a read of at least [`SHARED_READ_MIN_BYTES`]
//! is handed over in its buffer, to be shared, if that buffer keeps them within
//! [`SHARED_READ_BYTES`]; any other read is copied out of the buffer, which the connection reads
//! into again, and the node copies its payloads out.

use bytes::Bytes;
use conclave_node::metrics::Metrics;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Most bytes of read buffers that views may hold at once, all connections together: at full
/// load the ring's messages hold a few MiB of them.
pub const SHARED_READ_BYTES: usize = 32 << 20;
/// Smallest read whose payloads are kept as views: a view then holds at most four times what
/// was read.
pub const SHARED_READ_MIN_BYTES: usize = 16 << 10;

/// The count of read buffers held by views, shared by a daemon's connections, and shown in
/// its metrics (`conclave_shared_read_bytes`).
#[derive(Debug)]
pub struct SharedReads {
    held: AtomicUsize,
    budget: usize,
    metrics: Arc<Metrics>,
}

impl SharedReads {
    pub fn new(budget: usize, metrics: Arc<Metrics>) -> Arc<SharedReads> {
        Arc::new(SharedReads {
            held: AtomicUsize::new(0),
            budget,
            metrics,
        })
    }

    fn show(&self, held: usize) {
        self.metrics.shared_read_bytes.store(held as u64, Relaxed);
    }

    /// Bytes of read buffers held now.
    pub fn held(&self) -> usize {
        self.held.load(Relaxed)
    }

    /// The read in `buf` as shared bytes, its buffer counted as held until the last view of it
    /// is dropped, and an empty buffer of the same capacity in its place; `None` (and `buf` as
    /// it was) when the read is too small or its buffer would take the views past the budget.
    pub fn share(self: &Arc<Self>, buf: &mut Vec<u8>) -> Option<Bytes> {
        if buf.len() < SHARED_READ_MIN_BYTES {
            return None;
        }
        let capacity = buf.capacity();
        // Counted before it is shared, and never past the budget, whatever the connections do
        // at once.
        let before = self
            .held
            .fetch_update(Relaxed, Relaxed, |held| {
                held.checked_add(capacity).filter(|&h| h <= self.budget)
            })
            .ok()?;
        self.show(before + capacity);
        let full = std::mem::replace(buf, Vec::with_capacity(capacity));
        Some(Bytes::from_owner(Held {
            buf: full,
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
        let capacity = self.buf.capacity();
        let before = self.reads.held.fetch_sub(capacity, Relaxed);
        self.reads.show(before - capacity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(n: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 << 10);
        b.resize(n, 7u8);
        b
    }

    #[test]
    fn a_shared_read_counts_until_its_last_view_is_dropped() {
        let reads = SharedReads::new(256 << 10, Default::default());
        let mut buf = read(20 << 10);
        let bytes = reads.share(&mut buf).unwrap();
        assert!(
            buf.is_empty() && buf.capacity() == 64 << 10,
            "a fresh buffer to read into"
        );
        assert_eq!(reads.held(), 64 << 10);
        assert_eq!(reads.metrics.shared_read_bytes.load(Relaxed), 64 << 10);
        let view = bytes.slice(100..200);
        drop(bytes);
        assert_eq!(reads.held(), 64 << 10, "a view still holds the buffer");
        assert_eq!(&view[..], &[7u8; 100][..]);
        drop(view);
        assert_eq!(reads.held(), 0);
        assert_eq!(reads.metrics.shared_read_bytes.load(Relaxed), 0);
    }

    #[test]
    fn a_small_read_is_not_shared() {
        let reads = SharedReads::new(256 << 10, Default::default());
        let mut buf = read(SHARED_READ_MIN_BYTES - 1);
        assert!(reads.share(&mut buf).is_none());
        assert_eq!(
            buf.len(),
            SHARED_READ_MIN_BYTES - 1,
            "the read is left where it was"
        );
        assert_eq!(reads.held(), 0);
    }

    #[test]
    fn past_the_budget_reads_are_not_shared() {
        let reads = SharedReads::new(128 << 10, Default::default());
        let a = reads.share(&mut read(32 << 10)).unwrap();
        let b = reads.share(&mut read(32 << 10)).unwrap();
        assert_eq!(reads.held(), 128 << 10);
        let mut third = read(32 << 10);
        assert!(
            reads.share(&mut third).is_none(),
            "two buffers of 64 KiB fill 128 KiB"
        );
        assert_eq!(third.len(), 32 << 10);
        assert_eq!(reads.held(), 128 << 10);
        drop(a);
        let c = reads.share(&mut third).unwrap();
        drop(b);
        assert_eq!(reads.held(), 64 << 10);
        drop(c);
        assert_eq!(reads.held(), 0);
    }
}
