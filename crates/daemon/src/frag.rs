//! Datagrams between daemons: a daemon packet in one UDP datagram, or split in fragments when it
//! is larger than a datagram may safely be.
//!
//! The ring protocol already copes with lost packets (it retransmits), so a lost fragment simply
//! loses its packet: there is no fragment retransmission. Reassembly keeps at most
//! [`MAX_PARTIAL`] packets in progress per peer (the oldest is dropped for a newer one) and never
//! more than [`MAX_PACKET_BYTES`] for one packet, so a hostile peer cannot make a daemon hold
//! more than a few megabytes.
//!
//! ```text
//! datagram  = version (1) kind (1) body
//! kind 0    = the whole packet
//! kind 1    = id (u32) index (u16) count (u16) part     -- part `index` of `count` of packet `id`
//! ```

use conclave_wire::{DecodeError, Reader, Writer};
use std::collections::VecDeque;

pub const DATAGRAM_VERSION: u8 = 1;
/// Largest part of a packet carried by one datagram (well under UDP's 65,507 bytes).
pub const MAX_PART_BYTES: usize = 60_000;
/// Largest packet reassembled.
pub const MAX_PACKET_BYTES: usize = 4 << 20;
/// Most fragments of one packet.
pub const MAX_FRAGMENTS: usize = MAX_PACKET_BYTES.div_ceil(MAX_PART_BYTES);
/// Packets in reassembly at once, per peer.
pub const MAX_PARTIAL: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatagramError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("a packet of {0} bytes is over the limit of {MAX_PACKET_BYTES}")]
    TooLarge(usize),
    #[error("fragment {index} of {count} does not fit its packet")]
    BadFragment { index: u16, count: u16 },
}

/// Splits a packet into the datagrams that carry it. `id` names the packet among the sender's
/// fragmented packets.
pub fn split(packet: &[u8], id: u32) -> Result<Vec<Vec<u8>>, DatagramError> {
    if packet.len() > MAX_PACKET_BYTES {
        return Err(DatagramError::TooLarge(packet.len()));
    }
    if packet.len() <= MAX_PART_BYTES {
        let mut w = Writer::with_capacity(packet.len() + 2);
        w.u8(DATAGRAM_VERSION);
        w.u8(0);
        w.raw(packet);
        return Ok(vec![w.into_vec()]);
    }
    let count = packet.len().div_ceil(MAX_PART_BYTES) as u16;
    Ok(packet
        .chunks(MAX_PART_BYTES)
        .enumerate()
        .map(|(i, part)| {
            let mut w = Writer::with_capacity(part.len() + 10);
            w.u8(DATAGRAM_VERSION);
            w.u8(1);
            w.u32(id);
            w.u16(i as u16);
            w.u16(count);
            w.raw(part);
            w.into_vec()
        })
        .collect())
}

struct Partial {
    id: u32,
    parts: Vec<Option<Vec<u8>>>,
    missing: usize,
    bytes: usize,
}

/// Reassembles the packets of one peer.
#[derive(Default)]
pub struct Reassembly {
    partial: VecDeque<Partial>,
}

impl Reassembly {
    /// A datagram from the peer: the packet it completes, if any.
    pub fn push(&mut self, datagram: &[u8]) -> Result<Option<Vec<u8>>, DatagramError> {
        let mut r = Reader::new(datagram);
        let version = r.u8("datagram version")?;
        if version != DATAGRAM_VERSION {
            return Err(DecodeError::BadVersion(version).into());
        }
        match r.u8("datagram kind")? {
            0 => Ok(Some(r.take(r.remaining(), "packet")?.to_vec())),
            1 => {
                let id = r.u32("fragment id")?;
                let index = r.u16("fragment index")?;
                let count = r.u16("fragment count")?;
                let part = r.take(r.remaining(), "fragment")?;
                let bad = DatagramError::BadFragment { index, count };
                if count < 2
                    || index >= count
                    || count as usize > MAX_FRAGMENTS
                    || part.is_empty()
                    || part.len() > MAX_PART_BYTES
                    // Every part but the last is full.
                    || (index + 1 < count && part.len() != MAX_PART_BYTES)
                {
                    return Err(bad);
                }
                let at = match self.partial.iter().position(|p| p.id == id) {
                    Some(at) => at,
                    None => {
                        if self.partial.len() >= MAX_PARTIAL {
                            self.partial.pop_front();
                        }
                        self.partial.push_back(Partial {
                            id,
                            parts: vec![None; count as usize],
                            missing: count as usize,
                            bytes: 0,
                        });
                        self.partial.len() - 1
                    }
                };
                let p = &mut self.partial[at];
                if p.parts.len() != count as usize {
                    return Err(bad);
                }
                let slot = &mut p.parts[index as usize];
                if slot.is_some() {
                    return Ok(None); // a duplicate
                }
                p.bytes += part.len();
                if p.bytes > MAX_PACKET_BYTES {
                    self.partial.remove(at);
                    return Err(DatagramError::TooLarge(MAX_PACKET_BYTES + 1));
                }
                *slot = Some(part.to_vec());
                p.missing -= 1;
                if p.missing > 0 {
                    return Ok(None);
                }
                let p = self.partial.remove(at).expect("present");
                Ok(Some(p.parts.into_iter().flatten().flatten().collect()))
            }
            tag => Err(DecodeError::BadTag {
                what: "datagram kind",
                tag,
            }
            .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_packets_travel_whole_and_large_ones_in_parts() {
        let mut r = Reassembly::default();
        let small = vec![7u8; 100];
        let d = split(&small, 0).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(r.push(&d[0]).unwrap(), Some(small));

        let large: Vec<u8> = (0..150_000u32).map(|i| i as u8).collect();
        let d = split(&large, 9).unwrap();
        assert_eq!(d.len(), 3);
        // Out of order, with a duplicate.
        assert_eq!(r.push(&d[2]).unwrap(), None);
        assert_eq!(r.push(&d[0]).unwrap(), None);
        assert_eq!(r.push(&d[0]).unwrap(), None);
        assert_eq!(r.push(&d[1]).unwrap(), Some(large));
        assert!(split(&vec![0; MAX_PACKET_BYTES + 1], 0).is_err());
    }

    #[test]
    fn a_lost_fragment_loses_its_packet_and_old_partials_are_dropped() {
        let mut r = Reassembly::default();
        let large = vec![1u8; 130_000];
        for id in 0..(MAX_PARTIAL as u32 + 3) {
            let d = split(&large, id).unwrap();
            assert_eq!(r.push(&d[0]).unwrap(), None);
        }
        assert_eq!(r.partial.len(), MAX_PARTIAL);
    }

    #[test]
    fn malformed_fragments_are_errors() {
        let mut r = Reassembly::default();
        assert!(r.push(&[]).is_err());
        assert!(r.push(&[9, 0]).is_err());
        assert!(r.push(&[DATAGRAM_VERSION, 7]).is_err());
        // index past count; a short middle part; count 1.
        for (index, count, len) in [(3u16, 2u16, 10usize), (0, 3, 10), (0, 1, 10)] {
            let mut w = Writer::new();
            w.u8(DATAGRAM_VERSION);
            w.u8(1);
            w.u32(1);
            w.u16(index);
            w.u16(count);
            w.raw(&vec![0; len]);
            assert!(r.push(&w.into_vec()).is_err());
        }
    }

    proptest! {
        #[test]
        fn any_datagram_is_handled_without_panic(d in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Reassembly::default().push(&d);
        }

        #[test]
        fn split_then_push_gives_the_packet(len in 0usize..200_000, id: u32) {
            let p: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
            let mut r = Reassembly::default();
            let mut out = None;
            for d in split(&p, id).unwrap() {
                if let Some(x) = r.push(&d).unwrap() { out = Some(x); }
            }
            prop_assert_eq!(out, Some(p));
        }
    }
}
