//! A ring member fed any sequence of packets (and timer firings) never panics and never holds
//! more than its windows allow.
#![no_main]
use conclave_gcs::{Ordering, OrderingConfig};
use conclave_wire::gcs::{Packet, RingId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ring = RingId {
        seq: 1,
        rep: 1,
        inc: 0,
    };
    let mut n = Ordering::new(OrderingConfig::default(), 2, ring, vec![1, 2, 3]);
    let mut rest = data;
    let mut now = conclave_gcs::Time::ZERO;
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize).min(tail.len());
        let (chunk, tail) = tail.split_at(len);
        rest = tail;
        now += std::time::Duration::from_micros(1_000);
        if let Ok(p) = Packet::decode(chunk) {
            n.handle_packet(now, p);
        } else {
            n.handle_timeout(now);
        }
        while n.poll_transmit().is_some() {}
        while n.poll_delivery().is_some() {}
        assert!(n.buffered() <= 4 * (400 + 30) + 1);
    }
});
