//! A network for driving the core's state machines directly: [`Ordering`], [`Membership`] or
//! [`Daemon`] as peers numbered from 1, packets encoded as on the wire, each destination turned
//! into its peers, every copy carried by a [`Links`] model that decides when (or whether) it
//! arrives, and every peer's timer run. The tests of this crate and the simulator's ordering runs
//! drive the core through it; the simulator's full runs drive whole daemon nodes over datagrams
//! (`conclave-sim`), and the daemon's runtime drives one node over sockets.
//!
//! Deterministic: events at the same time run in the order they were scheduled.

use crate::membership::Membership;
use crate::ordering::{Dest, Ordering, PeerRefusal, Transmit};
use crate::time::Time;
use crate::Daemon;
use conclave_wire::gcs::{DaemonId, Packet};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// A state machine of the core as the network sees it.
pub trait Peer {
    fn poll_transmit(&mut self) -> Option<Transmit>;
    /// A packet from peer `from`, as it came off the wire.
    fn handle_bytes(&mut self, now: Time, from: DaemonId, bytes: &[u8]) -> Result<(), PeerRefusal>;
    fn poll_timeout(&self) -> Option<Time>;
    fn handle_timeout(&mut self, now: Time);
}

impl Peer for Ordering {
    fn poll_transmit(&mut self) -> Option<Transmit> {
        Ordering::poll_transmit(self)
    }
    fn handle_bytes(&mut self, now: Time, _: DaemonId, bytes: &[u8]) -> Result<(), PeerRefusal> {
        self.handle_packet(now, Packet::decode(bytes)?);
        self.take_refusals().into_iter().next().map_or(Ok(()), Err)
    }
    fn poll_timeout(&self) -> Option<Time> {
        Ordering::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Time) {
        Ordering::handle_timeout(self, now)
    }
}

impl Peer for Membership {
    fn poll_transmit(&mut self) -> Option<Transmit> {
        Membership::poll_transmit(self)
    }
    fn handle_bytes(&mut self, now: Time, from: DaemonId, bytes: &[u8]) -> Result<(), PeerRefusal> {
        self.handle_packet(now, from, Packet::decode(bytes)?)
    }
    fn poll_timeout(&self) -> Option<Time> {
        Membership::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Time) {
        Membership::handle_timeout(self, now)
    }
}

impl Peer for Daemon {
    fn poll_transmit(&mut self) -> Option<Transmit> {
        Daemon::poll_transmit(self)
    }
    fn handle_bytes(&mut self, now: Time, from: DaemonId, bytes: &[u8]) -> Result<(), PeerRefusal> {
        self.handle_packet(
            now,
            from,
            &conclave_wire::client::Bytes::copy_from_slice(bytes),
        )
    }
    fn poll_timeout(&self) -> Option<Time> {
        Daemon::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Time) {
        Daemon::handle_timeout(self, now)
    }
}

/// What the links do with one copy of a packet: the times its copies arrive at `to` (none: it
/// is lost; two: it is duplicated).
pub trait Links {
    fn carry(&mut self, now: Time, from: DaemonId, to: DaemonId, packet: &Packet) -> Vec<Time>;
}

/// A perfect network: every packet arrives once, after the same hop.
#[derive(Clone, Copy, Debug)]
pub struct Hop(pub Duration);

impl Default for Hop {
    fn default() -> Self {
        Hop(Duration::from_micros(10))
    }
}

impl Links for Hop {
    fn carry(&mut self, now: Time, _: DaemonId, _: DaemonId, _: &Packet) -> Vec<Time> {
        vec![now + self.0]
    }
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Pending {
    Arrive {
        to: usize,
        from: DaemonId,
        bytes: Vec<u8>,
    },
    Timer {
        peer: usize,
    },
}

/// What one [`TestNet::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A packet arrived at peer `peer` (an index, the peer's daemon id less one).
    Arrived { peer: usize },
    /// Peer `peer`'s timer ran.
    Timer { peer: usize },
}

impl Step {
    pub fn peer(self) -> usize {
        match self {
            Step::Arrived { peer } | Step::Timer { peer } => peer,
        }
    }
}

/// Peers, links between them, and the packets and timers on their way.
pub struct TestNet<P, L = Hop> {
    /// The peer of daemon id `i + 1` at index `i`.
    pub peers: Vec<P>,
    pub links: L,
    /// Input the peers refused, with the peer that refused it: empty on a correct run.
    pub refusals: Vec<(DaemonId, PeerRefusal)>,
    now: Time,
    queue: BinaryHeap<Reverse<(Time, u64, Pending)>>,
    scheduled: u64,
    armed: Vec<Option<Time>>,
}

impl<P: Peer, L: Links> TestNet<P, L> {
    /// A network of `peers` at time zero. What they have to send at once goes with the first
    /// [`TestNet::step`].
    pub fn new(peers: Vec<P>, links: L) -> TestNet<P, L> {
        let n = peers.len();
        let mut net = TestNet {
            peers,
            links,
            refusals: Vec::new(),
            now: Time::ZERO,
            queue: BinaryHeap::new(),
            scheduled: 0,
            armed: vec![None; n],
        };
        net.send_all();
        net
    }

    pub fn now(&self) -> Time {
        self.now
    }

    /// Sends what every peer has to send and arms its timer: after the caller gave peers
    /// input directly (a client command, a submitted message).
    pub fn send_all(&mut self) {
        for i in 0..self.peers.len() {
            self.send(i);
        }
    }

    /// Sends what peer `i` has to send, each destination turned into its peers, and arms its
    /// timer.
    pub fn send(&mut self, i: usize) {
        let from = i as DaemonId + 1;
        let n = self.peers.len();
        while let Some(t) = self.peers[i].poll_transmit() {
            let bytes = t.packet.encode();
            let to: Vec<usize> = match t.to {
                Dest::One(d) => vec![(d as usize).wrapping_sub(1)],
                Dest::AllOthers => (0..n).filter(|j| *j != i).collect(),
            };
            for j in to.into_iter().filter(|j| *j < n) {
                for at in self
                    .links
                    .carry(self.now, from, j as DaemonId + 1, &t.packet)
                {
                    let bytes = bytes.clone();
                    self.schedule(at, Pending::Arrive { to: j, from, bytes });
                }
            }
        }
        if let Some(t) = self.peers[i].poll_timeout() {
            // A deadline already past runs now: time never goes back.
            let t = t.max(self.now);
            if self.armed[i] != Some(t) {
                self.armed[i] = Some(t);
                self.schedule(t, Pending::Timer { peer: i });
            }
        }
    }

    fn schedule(&mut self, at: Time, what: Pending) {
        self.scheduled += 1;
        self.queue
            .push(Reverse((at.max(self.now), self.scheduled, what)));
    }

    /// When the next packet arrives or timer runs.
    pub fn next_at(&self) -> Option<Time> {
        self.queue.peek().map(|Reverse((t, ..))| *t)
    }

    /// Moves the clock to `t` (never back) without running anything: for input at a time of
    /// the caller's choosing.
    pub fn advance_to(&mut self, t: Time) {
        self.now = self.now.max(t);
    }

    /// Runs the next event (a packet arriving, a timer), then sends what its peer has to send.
    /// `None` once nothing is on its way and no timer is armed.
    pub fn step(&mut self) -> Option<Step> {
        loop {
            let Reverse((t, _, what)) = self.queue.pop()?;
            self.now = self.now.max(t);
            let step = match what {
                Pending::Arrive { to, from, bytes } => {
                    if let Err(r) = self.peers[to].handle_bytes(self.now, from, &bytes) {
                        self.refusals.push((to as DaemonId + 1, r));
                    }
                    Step::Arrived { peer: to }
                }
                // A timer re-armed since is not due.
                Pending::Timer { peer } if self.armed[peer] != Some(t) => continue,
                Pending::Timer { peer } => {
                    self.armed[peer] = None;
                    self.peers[peer].handle_timeout(self.now);
                    Step::Timer { peer }
                }
            };
            self.send(step.peer());
            return Some(step);
        }
    }

    /// Steps until `done` holds (true), or `max_steps` went by or nothing is left to run
    /// (false).
    pub fn run_until(&mut self, max_steps: usize, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if self.step().is_none() {
                return done(self);
            }
        }
        done(self)
    }

    /// Steps through everything due up to `t`, then moves the clock there.
    pub fn run_to(&mut self, t: Time) {
        while self.next_at().is_some_and(|at| at <= t) {
            self.step();
        }
        self.advance_to(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MembershipConfig;

    /// A perfect network with one daemon that can be cut off from the others (not from itself:
    /// a ring of one passes its token to itself).
    struct Isolate {
        hop: Hop,
        cut: Option<DaemonId>,
    }

    impl Links for Isolate {
        fn carry(&mut self, now: Time, from: DaemonId, to: DaemonId, p: &Packet) -> Vec<Time> {
            if from != to && self.cut.is_some_and(|c| c == from || c == to) {
                return Vec::new();
            }
            self.hop.carry(now, from, to, p)
        }
    }

    fn rings(net: &TestNet<Membership, Isolate>) -> Vec<Vec<DaemonId>> {
        net.peers.iter().map(|m| m.ring_members()).collect()
    }

    #[test]
    fn daemons_form_a_ring_split_when_one_is_cut_off_and_merge_when_it_returns() {
        let peers = (1..=3)
            .map(|id| Membership::new(MembershipConfig::default(), id, 0, Time::ZERO))
            .collect();
        let links = Isolate {
            hop: Hop::default(),
            cut: None,
        };
        let mut net = TestNet::new(peers, links);
        let all = vec![vec![1, 2, 3]; 3];
        assert!(
            net.run_until(100_000, |n| rings(n) == all),
            "{:?}",
            rings(&net)
        );
        net.links.cut = Some(3);
        let split = vec![vec![1, 2], vec![1, 2], vec![3]];
        assert!(
            net.run_until(100_000, |n| rings(n) == split),
            "{:?}",
            rings(&net)
        );
        net.links.cut = None;
        assert!(
            net.run_until(100_000, |n| rings(n) == all),
            "{:?}",
            rings(&net)
        );
        assert!(net.refusals.is_empty(), "{:?}", net.refusals);
    }
}
