//! A daemon's membership fed any sequence of packets from any daemon, and timer firings, never
//! panics.
#![no_main]
use conclave_gcs::{Membership, MembershipConfig};
use conclave_wire::gcs::Packet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut m = Membership::new(MembershipConfig::default(), 2, 0, conclave_gcs::Time::ZERO);
    let mut rest = data;
    let mut now = conclave_gcs::Time::ZERO;
    while let Some((&head, tail)) = rest.split_first() {
        let len = (head as usize & 0x7f).min(tail.len());
        let from = if head & 0x80 != 0 { 3 } else { 1 };
        let (chunk, tail) = tail.split_at(len);
        rest = tail;
        now += std::time::Duration::from_micros(10_000);
        match Packet::decode(chunk) {
            // A refusal is an answer like any other: the state machine goes on.
            Ok(p) => {
                let _ = m.handle_packet(now, from, p);
            }
            Err(_) => m.handle_timeout(now),
        }
        while m.poll_transmit().is_some() {}
        while m.poll_event().is_some() {}
    }
});
