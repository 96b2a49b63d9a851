//! The simulated network between the daemons: loss, bursts, duplication, delays and spikes,
//! partitions of every shape, a flapping link, pauses.

use super::*;

// In flight: (arrival, order, from, to, bytes).
type InFlight = Reverse<(u64, u64, usize, usize, Vec<u8>)>;

/// The simulated network between the daemons, with the faults a seed drew. The basic faults draw
/// from the run's main generator (so that their schedules replay as they always did); the others
/// from their own.
pub(super) struct Wire {
    pub(super) n: usize,
    /// The daemons' addresses, by index.
    pub(super) peers: Vec<SocketAddr>,
    pub(super) net: Network,
    pub(super) faults: FaultSet,
    pub(super) rng2: ChaCha20Rng,
    pub(super) queue: BinaryHeap<InFlight>,
    pub(super) order: u64,
    pub(super) packets: u64,
    /// Partition components.
    pub(super) comp: Vec<usize>,
    /// Directed links cut on top of the components (one-way and non-transitive partitions).
    pub(super) cut: BTreeSet<(usize, usize)>,
    /// A flapping link: its ends, whether it is down now, and when it toggles next.
    pub(super) flap: Option<(usize, usize, bool, u64)>,
    pub(super) burst_left: u32,
    /// A window of delay spikes (packets late enough for false suspicion).
    pub(super) spike: (u64, u64),
    pub(super) next_spike: u64,
    /// A paused daemon handles nothing until then (and its peers suspect it meanwhile).
    pub(super) paused_until: Vec<u64>,
    pub(super) next_pause: u64,
    /// The `hostile` fault, when links are protected.
    pub(super) attacker: Option<Attacker>,
}

impl Wire {
    pub(super) fn reach(&self, i: usize, j: usize) -> bool {
        let flapped = self
            .flap
            .is_some_and(|(a, b, down, _)| down && ((a, b) == (i, j) || (a, b) == (j, i)));
        self.comp[i] == self.comp[j] && !self.cut.contains(&(i, j)) && !flapped
    }

    pub(super) fn chance(&mut self, p: f64) -> bool {
        (self.rng2.next_u32() as f64 / u32::MAX as f64) < p
    }

    /// A datagram from daemon `i` to the daemon at `to`, through the faults.
    pub(super) fn send(
        &mut self,
        rng: &mut ChaCha20Rng,
        now: u64,
        faulty: bool,
        i: usize,
        to: SocketAddr,
        bytes: Vec<u8>,
    ) {
        let unit = |rng: &mut ChaCha20Rng| rng.next_u32() as f64 / u32::MAX as f64;
        let Some(j) = self.peers.iter().position(|a| *a == to) else {
            return;
        };
        self.packets += 1;
        let cut = !self.reach(i, j);
        let mut lost = faulty && unit(rng) < self.net.loss;
        if faulty && self.faults.has("burst") {
            if self.burst_left > 0 {
                self.burst_left -= 1;
                lost = true;
            } else if lost {
                self.burst_left = self.rng2.next_u32() % 8 + 1;
            }
        }
        if cut || lost {
            return;
        }
        let copies = if faulty && unit(rng) < self.net.duplication {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut d = self.net.delay_us(rng.next_u64());
            if faulty && now >= self.spike.0 && now < self.spike.1 && self.chance(0.3) {
                d += 100_000 + self.rng2.next_u64() % 300_000;
            }
            self.order += 1;
            self.queue
                .push(Reverse((now + d, self.order, i, j, bytes.clone())));
        }
    }

    /// The extra faults of a new topology: a partition into up to as many components as
    /// daemons, a one-way cut, a non-transitive cut, a flapping link.
    pub(super) fn extra_topology(&mut self, now: u64) {
        self.cut.clear();
        self.flap = None;
        let n = self.n;
        if n < 2 {
            return;
        }
        if self.faults.has("shatter") && self.chance(0.3) {
            let k = 2 + self.rng2.next_u32() as usize % (n - 1);
            self.comp = (0..n).map(|_| self.rng2.next_u32() as usize % k).collect();
        }
        let pair = |w: &mut Wire| {
            let a = w.rng2.next_u32() as usize % n;
            let b = (a + 1 + w.rng2.next_u32() as usize % (n - 1)) % n;
            (a, b)
        };
        if self.faults.has("oneway") && self.chance(0.5) {
            let (a, b) = pair(self);
            self.cut.insert((a, b));
        }
        if self.faults.has("nontransitive") && self.chance(0.5) {
            let (a, b) = pair(self);
            self.cut.insert((a, b));
            self.cut.insert((b, a));
        }
        if self.faults.has("flap") && self.chance(0.3) {
            let (a, b) = pair(self);
            self.flap = Some((a, b, true, now + 20_000 + self.rng2.next_u64() % 40_000));
        }
    }

    /// Whether the network is a plain partition now (so the ring each daemon should reach is
    /// its component).
    pub(super) fn plain(&self, now: u64) -> bool {
        self.cut.is_empty() && self.flap.is_none() && self.paused_until.iter().all(|p| *p <= now)
    }

    pub(super) fn heal(&mut self) {
        self.comp = vec![0; self.n];
        self.cut.clear();
        self.flap = None;
        self.spike = (0, 0);
        self.paused_until = vec![0; self.n];
    }
}

/// An attacker on the wire (the `hostile` fault): it sees every datagram delivered and now and
/// then sends the receiver one of its own making. It holds no daemon's identity.
pub(super) struct Attacker {
    rng: ChaCha20Rng,
    /// Datagrams delivered lately: to whom, that daemon's incarnation then, the bytes.
    seen: std::collections::VecDeque<(usize, u32, Vec<u8>)>,
}

/// An address no daemon of the simulated configuration has.
const STRANGER: ([u8; 4], u16) = ([10, 66, 6, 6], 6666);

impl Attacker {
    pub(super) fn new(seed: u64) -> Attacker {
        Attacker {
            rng: ChaCha20Rng::seed_from_u64(seed ^ 0x686f7374),
            seen: Default::default(),
        }
    }

    /// After `bytes` (as sent) went from daemon `from` to daemon `to` (now in incarnation
    /// `inc`): sometimes a datagram to send `to`, its kind and the address it comes from.
    pub(super) fn strike(
        &mut self,
        peers: &[SocketAddr],
        from: usize,
        to: usize,
        inc: u32,
        bytes: &[u8],
    ) -> Option<(&'static str, SocketAddr, Vec<u8>)> {
        if self.seen.len() == 256 {
            self.seen.pop_front();
        }
        self.seen.push_back((to, inc, bytes.to_vec()));
        if !self.rng.next_u32().is_multiple_of(16) {
            return None;
        }
        let r = &mut self.rng;
        let pick = r.next_u32() as usize;
        Some(match pick % 5 {
            0 => {
                // One this incarnation of `to` already took.
                let mine: Vec<&Vec<u8>> = self
                    .seen
                    .iter()
                    .filter(|(t, i, _)| (*t, *i) == (to, inc))
                    .map(|(_, _, b)| b)
                    .collect();
                let d = mine[(pick / 5) % mine.len()].clone();
                ("replay", peers[from], d)
            }
            1 => {
                let mut d = bytes.to_vec();
                let at = (r.next_u32() as usize) % d.len();
                d[at] ^= 1 << (r.next_u32() % 8);
                ("altered", peers[from], d)
            }
            2 => {
                // The genuine header, a body and tag of its own.
                let mut d = bytes.to_vec();
                let keep = conclave_wire::link::HEADER_BYTES.min(d.len());
                r.fill_bytes(&mut d[keep..]);
                ("forged", peers[from], d)
            }
            3 => {
                let mut d = vec![0u8; 1 + r.next_u32() as usize % 200];
                r.fill_bytes(&mut d);
                ("garbage", peers[from], d)
            }
            _ => ("stranger", SocketAddr::from(STRANGER), bytes.to_vec()),
        })
    }
}
