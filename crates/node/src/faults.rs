//! Fault injection inside the daemon, for tests and demonstrations on a machine without netem:
//! per-link loss, delay with jitter and duplication, partitions into named sets, and pauses.
//!
//! The decisions are pure (the randomness is an input), so they are tested here; the daemon's
//! runtime applies them to every datagram it sends and receives. A partition is applied on both
//! sides: a daemon neither sends to nor accepts from a daemon outside its set, so setting the
//! partition at one daemon is enough to cut it off.

use conclave_wire::gcs::DaemonId;
use rand_core::RngCore;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What happens to datagrams on one link.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkFaults {
    /// Probability that a datagram is lost (0 to 1).
    pub drop: f64,
    /// Delay added to every datagram, milliseconds.
    pub delay_ms: u64,
    /// A further delay drawn uniformly from 0 to this, milliseconds (reorders datagrams).
    pub jitter_ms: u64,
    /// Probability that a datagram is sent twice.
    pub dup: f64,
}

impl LinkFaults {
    pub fn validate(&self) -> Result<(), String> {
        for (what, p) in [("drop", self.drop), ("dup", self.dup)] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{what} must be a probability from 0 to 1, not {p}"));
            }
        }
        if self.delay_ms > 60_000 || self.jitter_ms > 60_000 {
            return Err("delays are at most 60000 ms".into());
        }
        Ok(())
    }
    fn is_clean(&self) -> bool {
        self.drop == 0.0 && self.dup == 0.0 && self.delay_ms == 0 && self.jitter_ms == 0
    }
}

/// The faults a daemon applies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// For links without an entry of their own.
    pub all: LinkFaults,
    pub links: BTreeMap<DaemonId, LinkFaults>,
    /// Named sets of daemons; a daemon reaches only those of its own set (a daemon in no set is
    /// alone). `None`: no partition.
    pub partition: Option<BTreeMap<String, BTreeSet<DaemonId>>>,
}

fn uniform(rng: &mut impl RngCore) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

impl Faults {
    fn link(&self, peer: DaemonId) -> &LinkFaults {
        self.links.get(&peer).unwrap_or(&self.all)
    }

    /// Whether `me` and `peer` are on the same side of the partition.
    pub fn reachable(&self, me: DaemonId, peer: DaemonId) -> bool {
        match &self.partition {
            _ if me == peer => true,
            None => true,
            Some(sets) => sets.values().any(|s| s.contains(&me) && s.contains(&peer)),
        }
    }

    /// Whether a datagram from `peer` is taken in.
    pub fn accept(&self, me: DaemonId, peer: DaemonId) -> bool {
        self.reachable(me, peer)
    }

    /// The delays (milliseconds) after which copies of a datagram to `peer` go out: none if it
    /// is lost, two if it is duplicated.
    pub fn send(&self, me: DaemonId, peer: DaemonId, rng: &mut impl RngCore) -> Vec<u64> {
        if !self.reachable(me, peer) {
            return Vec::new();
        }
        let l = self.link(peer);
        if l.is_clean() {
            return vec![0];
        }
        if l.drop > 0.0 && uniform(rng) < l.drop {
            return Vec::new();
        }
        let copies = if l.dup > 0.0 && uniform(rng) < l.dup {
            2
        } else {
            1
        };
        (0..copies)
            .map(|_| {
                let jitter = if l.jitter_ms > 0 {
                    rng.next_u64() % (l.jitter_ms + 1)
                } else {
                    0
                };
                l.delay_ms + jitter
            })
            .collect()
    }

    /// Whether any fault is set (the status report says so).
    pub fn active(&self) -> bool {
        self.partition.is_some()
            || !self.all.is_clean()
            || self.links.values().any(|l| !l.is_clean())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn no_faults_send_everything_at_once() {
        let f = Faults::default();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..100 {
            assert_eq!(f.send(1, 2, &mut rng), vec![0]);
        }
        assert!(!f.active());
    }

    #[test]
    fn a_partition_cuts_both_ways_and_unlisted_daemons_are_alone() {
        let mut f = Faults::default();
        let sets = BTreeMap::from([
            ("a".to_string(), BTreeSet::from([1, 2])),
            ("b".to_string(), BTreeSet::from([3])),
        ]);
        f.partition = Some(sets);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(f.send(1, 2, &mut rng), vec![0]);
        assert!(f.send(1, 3, &mut rng).is_empty());
        assert!(!f.accept(3, 1));
        assert!(!f.reachable(4, 1));
        assert!(f.active());
    }

    #[test]
    fn loss_delay_and_duplication_follow_their_rates() {
        let mut f = Faults {
            all: LinkFaults {
                drop: 0.25,
                delay_ms: 5,
                jitter_ms: 10,
                dup: 0.5,
            },
            ..Faults::default()
        };
        f.links.insert(3, LinkFaults::default());
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (mut lost, mut dup) = (0, 0);
        for _ in 0..10_000 {
            let d = f.send(1, 2, &mut rng);
            match d.len() {
                0 => lost += 1,
                2 => dup += 1,
                _ => {}
            }
            assert!(d.iter().all(|&ms| (5..=15).contains(&ms)));
        }
        assert!((2_200..2_800).contains(&lost), "{lost}");
        assert!((3_400..4_100).contains(&dup), "{dup}");
        // The link with its own (clean) entry.
        assert_eq!(f.send(1, 3, &mut rng), vec![0]);
        assert!(LinkFaults {
            drop: 1.5,
            ..Default::default()
        }
        .validate()
        .is_err());
    }
}
