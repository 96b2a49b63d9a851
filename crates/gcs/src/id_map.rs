//! Maps keyed by the daemon's own numbers (session and client ids, daemon ids).
//!
//! These keys are handed out by the daemon itself, never chosen by a peer or a client, so the
//! hash need not resist collisions made on purpose; std's SipHash cost a tenth of a
//! microsecond per lookup, several times per message on a daemon's path. A fixed hash also
//! makes iteration order the same in every run.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing: the multiply keeps consecutive ids apart in the low bits the table picks
/// a slot by (they are a bijection of the id's low bits) and spreads them over the top bits it
/// tags slots with.
#[derive(Clone, Copy, Default)]
pub struct IdHasher(u64);

const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(MULTIPLIER);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by ids the daemon hands out.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_ids_differ_in_the_high_bits() {
        let hash = |n: u64| {
            let mut h = IdHasher::default();
            h.write_u64(n);
            h.finish()
        };
        let tops: std::collections::BTreeSet<u64> = (0..128).map(|n| hash(n) >> 57).collect();
        assert!(tops.len() > 64, "{} distinct tags of 128", tops.len());
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut m: IdMap<u64, u64> = IdMap::default();
        for n in 0..10_000 {
            m.insert(n * 7, n);
        }
        assert!((0..10_000).all(|n| m.get(&(n * 7)) == Some(&n)));
        assert_eq!(m.get(&1), None);
    }
}
