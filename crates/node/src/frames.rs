//! A connection's framed replies, with large payloads left where they lie.
//!
//! A daemon delivers each message to each of its members: framing copied every payload once
//! more in user space before the socket's copy, and at full load that copy was the daemon's
//! largest single cost after the system calls. Now a delivery's frame is written up to its
//! payload, and the payload goes to the socket as a view of the buffer the message arrived in
//! (one vectored write takes both).
//!
//! A view keeps the whole buffer it is part of alive: a received datagram's of up to 64 KiB, a
//! client's read of 64 KiB, or a packet reassembled from fragments (its own size). A client
//! that reads slowly, in a group whose messages arrive among others', could then make its
//! daemon keep many times the bytes its unwritten replies count. So the views that handed-out
//! frames hold are counted across all of a node's connections ([`ViewBudget`]), and past
//! [`MAX_VIEWS`] payloads are copied, as they were before.

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Most payloads all of a node's frames may hold as views: each keeps at most 64 KiB beyond its
/// own bytes, so at most 64 MiB beyond what the frames count (as much as one client may leave
/// unread, [`crate::node::MAX_UNREAD_BYTES`]). A daemon writes a member's replies as they come,
/// but at full load with three senders 500 to 1,000 are out at once: with 512, one delivery in
/// seven was copied; with 1,024, one in 400.
pub const MAX_VIEWS: usize = 1024;

/// Payloads shorter than this are copied into the frame: a separate piece of a vectored write
/// costs more than copying a few hundred bytes.
pub const VIEW_MIN_BYTES: usize = 512;

/// The count of views held by a node's frames. The node takes views (on its own thread, at
/// every delivery it frames as a view) and counts them here without an atomic operation; the
/// frames it hands out give theirs back when they are dropped, wherever that is, through
/// [`ViewReturns`]. Both counts only grow: the views held are their difference.
#[derive(Debug, Default)]
pub struct ViewBudget {
    taken: usize,
    returned: ViewReturns,
}

impl ViewBudget {
    /// Views held now.
    pub fn held(&self) -> usize {
        self.taken.wrapping_sub(self.returned.0.load(Relaxed))
    }

    fn take(&mut self) -> bool {
        if self.held() >= MAX_VIEWS {
            return false;
        }
        self.taken = self.taken.wrapping_add(1);
        true
    }
}

/// Where frames give their views back to the [`ViewBudget`] they were taken from.
#[derive(Clone, Debug, Default)]
struct ViewReturns(Arc<AtomicUsize>);

impl ViewReturns {
    fn give_back(&self, n: usize) {
        if n > 0 {
            self.0.fetch_add(n, Relaxed);
        }
    }
}

/// Framed replies, in order: bytes, with payloads to be written after given offsets of them.
/// Its `Debug` gives sizes only: the frames may hold a group's key (`ViewKey`) or a message.
#[derive(Default)]
pub struct Frames {
    bytes: Vec<u8>,
    /// Each payload goes after `bytes[..at]`; `at` never decreases along the list.
    views: Vec<(usize, Bytes)>,
    view_bytes: usize,
    /// Where the views are given back, once there is one.
    budget: Option<ViewReturns>,
}

impl Frames {
    /// Frames to be appended to `bytes` (empty, or bytes already framed).
    pub fn from_vec(bytes: Vec<u8>) -> Frames {
        Frames {
            bytes,
            views: Vec::new(),
            view_bytes: 0,
            budget: None,
        }
    }

    /// The bytes framed so far, to append to (a frame is appended whole, after any view).
    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Appends `payload` after the bytes so far, as a view of its buffer when it is large and
    /// `budget` has room, as a copy otherwise.
    pub fn push_payload(&mut self, payload: &Bytes, budget: &mut ViewBudget) {
        if payload.len() < VIEW_MIN_BYTES || !budget.take() {
            self.bytes.extend_from_slice(payload);
            return;
        }
        if self.budget.is_none() {
            self.budget = Some(budget.returned.clone());
        }
        self.view_bytes += payload.len();
        self.views.push((self.bytes.len(), payload.clone()));
    }

    /// Every byte, views included.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.view_bytes
    }

    /// The bytes framed here, views left out: what a buffer to frame into needs room for.
    pub fn copied_len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payloads held as views.
    pub fn views(&self) -> usize {
        self.views.len()
    }

    /// The pieces to write, in order (none empty).
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let last = self.views.last().map_or(0, |(at, _)| *at);
        debug_assert!(
            last <= self.bytes.len(),
            "framed bytes taken back from under a view"
        );
        self.views
            .iter()
            .scan(0, |from, (at, view)| {
                let before = &self.bytes[*from..*at];
                *from = *at;
                Some([before, &view[..]])
            })
            .flatten()
            .chain(std::iter::once(&self.bytes[last..]))
            .filter(|s| !s.is_empty())
    }

    /// Every byte in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        for s in self.slices() {
            out.extend_from_slice(s);
        }
        out
    }

    /// Drops everything framed, giving the views back.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.release();
    }

    /// The buffer the bytes were framed in, empty, to frame into again; the views are given
    /// back.
    pub fn into_buffer(mut self) -> Vec<u8> {
        let mut b = std::mem::take(&mut self.bytes);
        b.clear();
        b
    }

    fn release(&mut self) {
        if let Some(b) = &self.budget {
            b.give_back(self.views.len());
        }
        self.views.clear();
        self.view_bytes = 0;
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for Frames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frames")
            .field("len", &self.len())
            .field("views", &self.views.len())
            .finish()
    }
}

impl From<Vec<u8>> for Frames {
    fn from(bytes: Vec<u8>) -> Frames {
        Frames::from_vec(bytes)
    }
}

/// Frames are equal when they would write the same bytes.
impl PartialEq for Frames {
    fn eq(&self, other: &Frames) -> bool {
        self.len() == other.len() && self.to_vec() == other.to_vec()
    }
}

impl Eq for Frames {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_in_order_and_views_counted_until_dropped() {
        let mut budget = ViewBudget::default();
        let big = Bytes::from(vec![9u8; VIEW_MIN_BYTES]);
        let small = Bytes::from_static(b"tiny");
        let mut f = Frames::from_vec(b"ab".to_vec());
        f.push_payload(&big, &mut budget);
        f.push_payload(&big, &mut budget);
        f.bytes_mut().extend_from_slice(b"cd");
        f.push_payload(&small, &mut budget);
        f.push_payload(&big, &mut budget);
        assert_eq!(f.views(), 3);
        assert_eq!(budget.held(), 3);
        let mut want = b"ab".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(&big);
        want.extend_from_slice(b"cdtiny");
        want.extend_from_slice(&big);
        assert_eq!(f.len(), want.len());
        assert_eq!(f.to_vec(), want);
        assert_eq!(f.slices().count(), 5);
        assert!(f.slices().all(|s| !s.is_empty()));
        let buffer = f.into_buffer();
        assert!(buffer.is_empty() && buffer.capacity() >= 6);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn past_the_budget_payloads_are_copied() {
        let mut budget = ViewBudget::default();
        let big = Bytes::from(vec![1u8; 1024]);
        let mut held = Frames::default();
        for _ in 0..MAX_VIEWS {
            held.push_payload(&big, &mut budget);
        }
        assert_eq!(budget.held(), MAX_VIEWS);
        let mut f = Frames::default();
        f.push_payload(&big, &mut budget);
        assert_eq!((f.views(), f.len()), (0, 1024));
        held.clear();
        assert_eq!(budget.held(), 0);
        f.push_payload(&big, &mut budget);
        assert_eq!((f.views(), f.len()), (1, 2048));
        drop(f);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn equal_when_they_write_the_same_bytes() {
        let mut budget = ViewBudget::default();
        let mut viewed = Frames::from_vec(b"x".to_vec());
        viewed.push_payload(&Bytes::from(vec![3u8; 600]), &mut budget);
        let mut flat = b"x".to_vec();
        flat.extend_from_slice(&[3u8; 600]);
        assert_eq!(viewed, Frames::from(flat));
        assert_ne!(viewed, Frames::from(b"x".to_vec()));
        assert!(Frames::default().slices().next().is_none());
    }

    #[test]
    fn debug_shows_sizes_not_bytes() {
        let mut budget = ViewBudget::default();
        let mut f = Frames::from_vec(b"secret-key-bytes".to_vec());
        f.push_payload(&Bytes::from(vec![b'k'; VIEW_MIN_BYTES]), &mut budget);
        let shown = format!("{f:?}");
        assert_eq!(
            shown,
            format!("Frames {{ len: {}, views: 1 }}", 16 + VIEW_MIN_BYTES)
        );
        let out = crate::SessionOutput::Bytes(f, 1);
        assert!(
            !format!("{out:?}").contains("107"),
            "no byte values printed"
        );
    }
}
