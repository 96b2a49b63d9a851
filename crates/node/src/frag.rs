//! Datagrams between daemons: a daemon packet in one UDP datagram, several small packets to the
//! same daemon in one datagram (the messages of a token visit: one system call instead of many,
//! which is most of what a message costs on loopback), or one large packet split in fragments.
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
//! kind 2    = (length (u32) packet)*                    -- several whole packets, in order
//! ```

use bytes::Bytes;
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
    #[error("a batch of fewer than two packets")]
    BadBatch,
}

enum Packets<'a> {
    None,
    One(&'a [u8]),
    Owned(Vec<u8>),
    Many(Vec<&'a [u8]>),
}

/// Bytes each datagram leaves free before and after itself: the link's header and tag, so that
/// the link seals the datagram where it lies ([`crate::link::Links::seal_framed`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Room {
    pub head: usize,
    pub tail: usize,
}

impl Room {
    /// A writer for a datagram of `n` bytes, its head room already there (zeroed).
    fn writer(self, n: usize) -> Writer {
        let mut v = Vec::with_capacity(self.head + n + self.tail);
        v.resize(self.head, 0);
        Writer::from_vec(v)
    }
}

/// Splits a packet into the datagrams that carry it. `id` names the packet among the sender's
/// fragmented packets.
pub fn split(packet: &[u8], id: u32) -> Result<Vec<Vec<u8>>, DatagramError> {
    split_with(packet, id, Room::default())
}

fn split_with(packet: &[u8], id: u32, room: Room) -> Result<Vec<Vec<u8>>, DatagramError> {
    if packet.len() > MAX_PACKET_BYTES {
        return Err(DatagramError::TooLarge(packet.len()));
    }
    if packet.len() <= MAX_PART_BYTES {
        let mut w = room.writer(packet.len() + 2);
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
            let mut w = room.writer(part.len() + 10);
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

/// The datagrams that carry `packets` (in order) to one daemon: small ones packed together up to
/// [`MAX_PART_BYTES`], large ones alone or in fragments. `next_id` numbers fragmented packets;
/// each datagram comes after `room.head` zeroed bytes, with capacity for `room.tail` more.
pub fn pack(
    packets: &[&[u8]],
    next_id: &mut u32,
    room: Room,
) -> Result<Vec<Vec<u8>>, DatagramError> {
    pack_with(packets, |p| p.len(), |p, w| w.raw(p), next_id, room)
}

/// [`pack`] of packets that `encode` writes straight into their datagrams: a packet is not
/// first encoded on its own and then copied. `hint` tells about how many bytes a packet takes,
/// to choose its datagram before encoding it there; with exact hints the datagrams are those of
/// packing the encoded packets. (A packet that outgrows its datagram after all moves to the
/// next one; one too large for any is fragmented from a copy.)
pub fn pack_with<P>(
    packets: &[P],
    hint: impl Fn(&P) -> usize,
    encode: impl Fn(&P, &mut Writer),
    next_id: &mut u32,
    room: Room,
) -> Result<Vec<Vec<u8>>, DatagramError> {
    let mut out = Vec::new();
    // The datagram being filled (a batch, kind 2, after its head room), and its packets.
    let mut buf: Vec<u8> = Vec::new();
    let mut count = 0;
    // Room for the packets that will likely fill the datagram: it is not grown (and copied)
    // step by step.
    let fresh = |rest: &[P]| {
        let mut n = 2;
        for p in rest {
            let more = hint(p) + 4;
            if n + more > MAX_PART_BYTES + 2 {
                break;
            }
            n += more;
        }
        let mut w = room.writer(n);
        w.u8(DATAGRAM_VERSION);
        w.u8(2);
        w.into_vec()
    };
    let finish = |buf: &mut Vec<u8>, count: usize, out: &mut Vec<Vec<u8>>| {
        let mut d = std::mem::take(buf);
        if count > 0 {
            // The link's tag goes after it (a packet may have outgrown its hint).
            d.reserve(room.tail);
        }
        match count {
            0 => {}
            1 => {
                // A lone packet goes whole (kind 0), without its length.
                d[room.head + 1] = 0;
                d.drain(room.head + 2..room.head + 6);
                out.push(d);
            }
            _ => out.push(d),
        }
    };
    let encoded = |p: &P| {
        let mut w = Writer::with_capacity(hint(p));
        encode(p, &mut w);
        w.into_vec()
    };
    let mut fragment = |packet: &[u8], out: &mut Vec<Vec<u8>>| -> Result<(), DatagramError> {
        out.extend(split_with(packet, *next_id, room)?);
        *next_id = next_id.wrapping_add(1);
        Ok(())
    };
    for (i, p) in packets.iter().enumerate() {
        let h = hint(p) + 4;
        if h > MAX_PART_BYTES {
            // Likely fragmented: encoded on its own (a batch would only copy it out again).
            let packet = encoded(p);
            if packet.len() + 4 > MAX_PART_BYTES {
                finish(&mut buf, count, &mut out);
                count = 0;
                fragment(&packet, &mut out)?;
                continue;
            }
            if count > 0 && buf.len() - room.head - 2 + packet.len() + 4 > MAX_PART_BYTES {
                finish(&mut buf, count, &mut out);
                count = 0;
            }
            if count == 0 {
                buf = fresh(&packets[i..]);
            }
            let mut w = Writer::from_vec(std::mem::take(&mut buf));
            w.u32(packet.len() as u32);
            w.raw(&packet);
            buf = w.into_vec();
            count += 1;
            continue;
        }
        if count > 0 && buf.len() - room.head - 2 + h > MAX_PART_BYTES {
            finish(&mut buf, count, &mut out);
            count = 0;
        }
        if count == 0 {
            buf = fresh(&packets[i..]);
        }
        let at = buf.len();
        let mut w = Writer::from_vec(std::mem::take(&mut buf));
        w.u32(0);
        encode(p, &mut w);
        buf = w.into_vec();
        let len = buf.len() - at - 4;
        buf[at..at + 4].copy_from_slice(&(len as u32).to_be_bytes());
        if len + 4 > MAX_PART_BYTES {
            let packet = buf[at + 4..].to_vec();
            buf.truncate(at);
            finish(&mut buf, count, &mut out);
            count = 0;
            fragment(&packet, &mut out)?;
            continue;
        }
        if buf.len() - room.head - 2 > MAX_PART_BYTES {
            let moved = buf[at..].to_vec();
            buf.truncate(at);
            finish(&mut buf, count, &mut out);
            buf = fresh(&packets[i..]);
            buf.extend_from_slice(&moved);
            count = 0;
        }
        count += 1;
    }
    finish(&mut buf, count, &mut out);
    Ok(out)
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
    /// A datagram from the peer: the packets it carries or completes, in order.
    pub fn push(&mut self, datagram: &[u8]) -> Result<Vec<Vec<u8>>, DatagramError> {
        let mut out = Vec::new();
        self.push_each(&Bytes::copy_from_slice(datagram), |p| out.push(p.to_vec()))?;
        Ok(out)
    }

    /// As [`Reassembly::push`], handing each packet to `f` as a view of the datagram (no copy,
    /// but for reassembled fragments). A malformed datagram hands over nothing.
    pub fn push_each(
        &mut self,
        datagram: &Bytes,
        mut f: impl FnMut(Bytes),
    ) -> Result<(), DatagramError> {
        match self.push_one(datagram)? {
            Packets::None => {}
            Packets::One(p) => f(datagram.slice_ref(p)),
            Packets::Owned(p) => f(Bytes::from(p)),
            Packets::Many(v) => v.into_iter().for_each(|p| f(datagram.slice_ref(p))),
        }
        Ok(())
    }

    fn push_one<'a>(&mut self, datagram: &'a [u8]) -> Result<Packets<'a>, DatagramError> {
        let mut r = Reader::new(datagram);
        let version = r.u8("datagram version")?;
        if version != DATAGRAM_VERSION {
            return Err(DecodeError::BadVersion(version).into());
        }
        match r.u8("datagram kind")? {
            0 => Ok(Packets::One(r.take(r.remaining(), "packet")?)),
            2 => {
                let mut v = Vec::new();
                while r.remaining() > 0 {
                    let n = r.u32("packet length")? as usize;
                    v.push(r.take(n, "packet")?);
                }
                if v.len() < 2 {
                    return Err(DatagramError::BadBatch);
                }
                Ok(Packets::Many(v))
            }
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
                    return Ok(Packets::None); // a duplicate
                }
                p.bytes += part.len();
                if p.bytes > MAX_PACKET_BYTES {
                    self.partial.remove(at);
                    return Err(DatagramError::TooLarge(MAX_PACKET_BYTES + 1));
                }
                *slot = Some(part.to_vec());
                p.missing -= 1;
                if p.missing > 0 {
                    return Ok(Packets::None);
                }
                let p = self.partial.remove(at).expect("present");
                // Exactly its size: the packet's messages keep views of it, and a buffer grown
                // by doubling would keep up to twice the packet.
                let mut whole = Vec::with_capacity(p.bytes);
                for part in p.parts.into_iter().flatten() {
                    whole.extend_from_slice(&part);
                }
                Ok(Packets::Owned(whole))
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
        assert_eq!(r.push(&d[0]).unwrap(), vec![small]);

        let large: Vec<u8> = (0..150_000u32).map(|i| i as u8).collect();
        let d = split(&large, 9).unwrap();
        assert_eq!(d.len(), 3);
        // Out of order, with a duplicate.
        assert!(r.push(&d[2]).unwrap().is_empty());
        assert!(r.push(&d[0]).unwrap().is_empty());
        assert!(r.push(&d[0]).unwrap().is_empty());
        assert_eq!(r.push(&d[1]).unwrap(), vec![large]);
        assert!(split(&vec![0; MAX_PACKET_BYTES + 1], 0).is_err());
    }

    #[test]
    fn a_lost_fragment_loses_its_packet_and_old_partials_are_dropped() {
        let mut r = Reassembly::default();
        let large = vec![1u8; 130_000];
        for id in 0..(MAX_PARTIAL as u32 + 3) {
            let d = split(&large, id).unwrap();
            assert!(r.push(&d[0]).unwrap().is_empty());
        }
        assert_eq!(r.partial.len(), MAX_PARTIAL);
    }

    #[test]
    fn malformed_fragments_are_errors() {
        let mut r = Reassembly::default();
        assert!(r.push(&[]).is_err());
        assert!(r.push(&[9, 0]).is_err());
        assert!(r.push(&[DATAGRAM_VERSION, 7]).is_err());
        // A batch of one, and a batch whose length runs past its end.
        assert!(r.push(&[DATAGRAM_VERSION, 2, 0, 0, 0, 1, 9]).is_err());
        assert!(r.push(&[DATAGRAM_VERSION, 2, 0, 0, 0, 9, 9]).is_err());
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

    /// The packing [`pack_with`] replaced, kept as its model: each packet already encoded,
    /// copied into its datagram.
    fn copying_pack(
        packets: &[&[u8]],
        next_id: &mut u32,
        room: Room,
    ) -> Result<Vec<Vec<u8>>, DatagramError> {
        let mut out = Vec::new();
        let mut batch: Vec<&[u8]> = Vec::new();
        let mut batch_bytes = 0;
        let flush = |batch: &mut Vec<&[u8]>, out: &mut Vec<Vec<u8>>| {
            match batch.len() {
                0 => {}
                1 => out.extend(split_with(batch[0], 0, room).expect("small")),
                _ => {
                    let n: usize = batch.iter().map(|p| p.len() + 4).sum();
                    let mut w = room.writer(n + 2);
                    w.u8(DATAGRAM_VERSION);
                    w.u8(2);
                    for p in batch.iter() {
                        w.u32(p.len() as u32);
                        w.raw(p);
                    }
                    out.push(w.into_vec());
                }
            }
            batch.clear();
        };
        for &p in packets {
            if p.len() + 4 > MAX_PART_BYTES {
                flush(&mut batch, &mut out);
                batch_bytes = 0;
                out.extend(split_with(p, *next_id, room)?);
                *next_id = next_id.wrapping_add(1);
                continue;
            }
            if batch_bytes + p.len() + 4 > MAX_PART_BYTES {
                flush(&mut batch, &mut out);
                batch_bytes = 0;
            }
            batch.push(p);
            batch_bytes += p.len() + 4;
        }
        flush(&mut batch, &mut out);
        Ok(out)
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
            let mut out = Vec::new();
            for d in split(&p, id).unwrap() {
                out.extend(r.push(&d).unwrap());
            }
            prop_assert_eq!(out, vec![p]);
        }

        #[test]
        fn packed_packets_come_out_in_order(lens in proptest::collection::vec(0usize..70_000, 0..12)) {
            let packets: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(k, &n)| (0..n).map(|i| (i + k) as u8).collect())
                .collect();
            let mut id = 0;
            let slices: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
            let datagrams = pack(&slices, &mut id, Room::default()).unwrap();
            prop_assert!(datagrams.iter().all(|d| d.len() <= MAX_PART_BYTES + 10));
            prop_assert!(datagrams.len() <= packets.len().max(1) * 2);
            let mut r = Reassembly::default();
            let mut out = Vec::new();
            for d in &datagrams {
                out.extend(r.push(d).unwrap());
            }
            prop_assert_eq!(out, packets);
        }

        #[test]
        fn packed_as_encoded_are_the_datagrams_of_packing_encoded_packets(
            lens in proptest::collection::vec(
                prop_oneof![0usize..3_000, 19_000usize..21_000, 55_000usize..70_000],
                0..80,
            ),
            head in 0usize..64,
            tail in 0usize..32,
        ) {
            let packets: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(k, &n)| (0..n).map(|i| (i * 7 + k) as u8).collect())
                .collect();
            let slices: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
            let room = Room { head, tail };
            let (mut a, mut b) = (3, 3);
            let copied = copying_pack(&slices, &mut a, room).unwrap();
            let encoded = pack_with(&packets, Vec::len, |p, w| w.raw(p), &mut b, room).unwrap();
            prop_assert_eq!(a, b);
            prop_assert_eq!(&copied, &encoded);
            for d in &encoded {
                prop_assert!(d.capacity() >= d.len() + tail);
            }
        }

        #[test]
        fn packed_with_wrong_hints_still_carry_every_packet_in_order(
            packets in proptest::collection::vec(
                (prop_oneof![0usize..3_000, 19_000usize..21_000, 55_000usize..70_000],
                 prop_oneof![0usize..100, 0usize..80_000]),
                0..60,
            ),
            head in 0usize..64,
            tail in 0usize..32,
        ) {
            let hints: Vec<usize> = packets.iter().map(|&(_, h)| h).collect();
            let packets: Vec<Vec<u8>> = packets
                .iter()
                .enumerate()
                .map(|(k, &(n, _))| (0..n).map(|i| (i * 3 + k) as u8).collect())
                .collect();
            let indexed: Vec<usize> = (0..packets.len()).collect();
            let room = Room { head, tail };
            let datagrams = pack_with(
                &indexed,
                |&i| hints[i],
                |&i, w| w.raw(&packets[i]),
                &mut 0,
                room,
            )
            .unwrap();
            let mut r = Reassembly::default();
            let mut out = Vec::new();
            for d in &datagrams {
                prop_assert!(d.len() <= head + MAX_PART_BYTES + 10);
                prop_assert!(d.capacity() >= d.len() + tail);
                out.extend(r.push(&d[head..]).unwrap());
            }
            prop_assert_eq!(out, packets);
        }

        #[test]
        fn packed_with_room_are_the_same_datagrams_after_their_head_room(
            lens in proptest::collection::vec(0usize..70_000, 1..8),
            head in 0usize..64,
            tail in 0usize..32,
        ) {
            let packets: Vec<Vec<u8>> = lens.iter().map(|&n| vec![7; n]).collect();
            let slices: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
            let bare = pack(&slices, &mut 5, Room::default()).unwrap();
            let roomy = pack(&slices, &mut 5, Room { head, tail }).unwrap();
            prop_assert_eq!(bare.len(), roomy.len());
            for (b, r) in bare.iter().zip(&roomy) {
                prop_assert!(r[..head].iter().all(|&x| x == 0));
                prop_assert_eq!(&r[head..], &b[..]);
                prop_assert!(r.capacity() >= r.len() + tail);
            }
        }
    }
}
