//! The header of a datagram between daemons when their links are protected (docs/links.md).
//!
//! ```text
//! datagram = header (42) body tag (16)
//! header   = version (1) kind (1) from (u32) to (u32) from_epoch (u64) to_epoch (u64)
//!            key (u64) counter (u64)
//! kind 0   = data: the body is a datagram of `conclave_node::frag`
//! kind 1   = hello: no body; tells the receiver the sender's epoch
//! key      = data: the key it is under (0: the pair's static key; else the id of the daemons'
//!            agreed key); hello (always under the static key): the daemons' key the sender
//!            holds (0: none)
//! ```
//!
//! The whole header is authenticated (it is the AEAD's associated data); the counter is the
//! nonce, and never repeats under one key since a key serves one pair of epochs and the counter
//! only grows within a run (whatever the key). `to_epoch` is 0 when the sender does not know the
//! receiver's epoch yet. The key id is public: a one-way digest of the daemons' key.

use crate::{DecodeError, Reader, Writer};

pub const LINK_VERSION: u8 = 3;
pub const HEADER_BYTES: usize = 42;
pub const TAG_BYTES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Data,
    Hello,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkHeader {
    pub kind: LinkKind,
    pub from: u32,
    pub to: u32,
    pub from_epoch: u64,
    pub to_epoch: u64,
    /// Data: the id of the daemons' key it is under (0: the pair's static key). Hello: the id
    /// of the daemons' key the sender holds (0: none).
    pub key: u64,
    pub counter: u64,
}

impl LinkHeader {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut w = Writer::from_vec(std::mem::take(out));
        w.u8(LINK_VERSION);
        w.u8(match self.kind {
            LinkKind::Data => 0,
            LinkKind::Hello => 1,
        });
        w.u32(self.from);
        w.u32(self.to);
        w.u64(self.from_epoch);
        w.u64(self.to_epoch);
        w.u64(self.key);
        w.u64(self.counter);
        *out = w.into_vec();
    }

    /// The header at the start of `datagram`; the datagram must also hold at least a tag.
    pub fn decode(datagram: &[u8]) -> Result<LinkHeader, DecodeError> {
        if datagram.len() < HEADER_BYTES + TAG_BYTES {
            return Err(DecodeError::Truncated {
                what: "link datagram",
                need: HEADER_BYTES + TAG_BYTES - datagram.len(),
            });
        }
        let mut r = Reader::new(&datagram[..HEADER_BYTES]);
        let version = r.u8("link version")?;
        if version != LINK_VERSION {
            return Err(DecodeError::BadVersion(version));
        }
        let kind = match r.u8("link kind")? {
            0 => LinkKind::Data,
            1 => LinkKind::Hello,
            tag => {
                return Err(DecodeError::BadTag {
                    what: "link kind",
                    tag,
                })
            }
        };
        let h = LinkHeader {
            kind,
            from: r.u32("link sender")?,
            to: r.u32("link receiver")?,
            from_epoch: r.u64("sender epoch")?,
            to_epoch: r.u64("receiver epoch")?,
            key: r.u64("link key")?,
            counter: r.u64("link counter")?,
        };
        r.finish()?;
        Ok(h)
    }

    /// The AEAD nonce of this datagram.
    pub fn nonce(&self) -> [u8; 12] {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&self.counter.to_be_bytes());
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_header_round_trips_and_short_input_is_refused() {
        let h = LinkHeader {
            kind: LinkKind::Hello,
            from: 3,
            to: 1,
            from_epoch: 7 << 32 | 9,
            to_epoch: 0,
            key: 5,
            counter: 42,
        };
        let mut v = Vec::new();
        h.encode_into(&mut v);
        assert_eq!(v.len(), HEADER_BYTES);
        v.extend_from_slice(&[0; TAG_BYTES]);
        assert_eq!(LinkHeader::decode(&v).unwrap(), h);
        assert!(LinkHeader::decode(&v[..v.len() - 1]).is_err());
        v[1] = 9;
        assert!(LinkHeader::decode(&v).is_err());
        v[1] = 0;
        v[0] = 1;
        assert!(LinkHeader::decode(&v).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = LinkHeader::decode(&bytes);
        }
    }
}
