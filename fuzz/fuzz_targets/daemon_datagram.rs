//! Datagrams between daemons: any sequence of datagrams from a peer is reassembled without panic
//! and within its bounds, and a packet that comes out is handed to the packet decoder.
#![no_main]
use conclave_node::frag::{Reassembly, MAX_PACKET_BYTES};
use conclave_wire::client::Bytes;
use conclave_wire::gcs::Packet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = Reassembly::default();
    // The input is datagrams, each behind a two-byte length.
    let mut rest = data;
    while rest.len() >= 2 {
        let n = u16::from_be_bytes([rest[0], rest[1]]) as usize;
        rest = &rest[2..];
        let d = &rest[..n.min(rest.len())];
        rest = &rest[d.len()..];
        // As the daemon does: packets are views of the datagram, decoded with shared payloads.
        let _ = r.push_each(&Bytes::copy_from_slice(d), |p| {
            assert!(p.len() <= MAX_PACKET_BYTES);
            let _ = Packet::decode_shared(&p);
        });
    }
});
