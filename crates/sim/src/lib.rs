//! A deterministic simulator: N daemons in one thread, on virtual time, over a network that loses,
//! duplicates, delays and reorders packets as the seed decides; every run is recorded as a
//! history (docs/history.md) and judged by the checker. One seed replays one run exactly.
//!
//! Two kinds of run: the ordering of one fixed ring (`conclave_gcs::ordering`) with messages of
//! every service type, under heavier loss, for the ordering protocol's own measurements; and
//! full daemon runs ([`run_membership`]): partitions, crashes and restarts, with messages of
//! every service type sent throughout, so that recovery and extended virtual synchrony are
//! checked across every ring change. Each has a safety phase with faults, then a fault-free
//! phase in which everything sent must be delivered everywhere, and one ring of all daemons form.
//! Client groups join as the daemon core grows (docs/gcs.md).

mod membership;
pub use membership::{
    run_membership, Action, FaultChoice, FaultSet, MembershipSimConfig, Trigger, FAULT_NAMES,
};

use conclave_gcs::{Dest, Ordering, OrderingConfig, Time};
use conclave_history::{Event, Record, ViewId};
use conclave_wire::gcs::{Body, DaemonId, Packet, RingId, ServiceType};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The faults a run draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultMix {
    /// A perfect network (delays still vary, so packets still reorder).
    None,
    /// Each seed draws its own loss (uniform or bursty), duplication and delay spread.
    Swarm,
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub daemons: usize,
    /// Messages each daemon sends during the safety phase.
    pub messages: usize,
    pub faults: FaultMix,
    /// Length of the safety phase, in simulated milliseconds.
    pub safety_ms: u64,
    /// The run is a failure if the liveness phase has not delivered everything by then.
    pub limit_ms: u64,
    /// Test only: a fault planted in what daemon d2 records, which the checker must catch.
    pub planted: Option<Planted>,
    /// Send every message with this service type (by default each draws one of the six).
    pub service: Option<ServiceType>,
}

/// Faults the simulator can plant in a run's history, to prove the checker catches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planted {
    /// d2 misses an agreed message.
    SkipMessage,
    /// d2 delivers a message in a view it was not sent in.
    WrongView,
    /// d2 delivers two agreed messages in the opposite order.
    SwapAgreed,
    /// d2 installs the first view without d3.
    ViewWithoutMember,
}

fn plant(history: &mut [Record], fault: Planted) -> Vec<Record> {
    let agreed = |r: &Record| {
        r.p == "d2" && matches!(&r.ev, Event::Deliver { service, .. } if service.at_least_agreed())
    };
    let mut h = history.to_vec();
    match fault {
        Planted::SkipMessage => {
            if let Some(i) = h.iter().position(agreed) {
                h.remove(i);
            }
        }
        Planted::WrongView => {
            if let Some(r) = h.iter_mut().find(|r| agreed(r)) {
                if let Event::Deliver { view, .. } = &mut r.ev {
                    *view = ViewId(view.0 + 1, view.1.clone());
                }
            }
        }
        Planted::SwapAgreed => {
            let idx: Vec<usize> = (0..h.len()).filter(|i| agreed(&h[*i])).take(2).collect();
            if let [a, b] = idx[..] {
                let (ta, tb) = (h[a].t, h[b].t);
                h.swap(a, b);
                h[a].t = ta;
                h[b].t = tb;
            }
        }
        Planted::ViewWithoutMember => {
            if let Some(r) = h
                .iter_mut()
                .find(|r| r.p == "d2" && matches!(r.ev, Event::View { .. }))
            {
                if let Event::View { members, .. } = &mut r.ev {
                    members.retain(|m| m != "d3");
                }
            }
        }
    }
    h
}

impl SimConfig {
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            daemons: 5,
            messages: 40,
            faults: FaultMix::Swarm,
            safety_ms: 500,
            limit_ms: 20_000,
            planted: None,
            service: None,
        }
    }
}

/// The network conditions one seed drew.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Network {
    pub loss: f64,
    pub bursty: bool,
    pub duplication: f64,
    pub delay_min_us: u64,
    pub delay_max_us: u64,
}

impl Network {
    /// A packet's delay from one random draw.
    pub(crate) fn delay_us(&self, draw: u64) -> u64 {
        self.delay_min_us + draw % (self.delay_max_us - self.delay_min_us + 1)
    }
}

#[derive(Clone, Debug)]
pub struct SimResult {
    pub seed: u64,
    pub network: Network,
    pub history: Vec<Record>,
    /// Deliveries, summed over daemons.
    pub delivered: u64,
    pub views: u64,
    pub packets: u64,
    /// Simulated time at the end, in microseconds.
    pub sim_us: u64,
    /// Whether every message reached every daemon before the limit.
    pub completed: bool,
    pub stats: Stats,
}

/// What the ordering cost and how long delivery took.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Token and data packets sent (each copy to each daemon counts).
    pub token_packets: u64,
    pub data_packets: u64,
    /// Median and 99th percentile, submit to delivery, microseconds, over all deliveries.
    pub agreed_latency_us_p50: u64,
    pub agreed_latency_us_p99: u64,
    pub safe_latency_us_p50: u64,
    pub safe_latency_us_p99: u64,
    /// Mean time between two token visits at the first daemon, microseconds.
    pub rotation_us: u64,
    /// Membership runs: from the end of the faults to one ring of all daemons, microseconds.
    pub converge_us: u64,
    /// Membership runs: from each change of the network (partition, merge, crash, restart) to
    /// every live daemon operational in a ring of exactly the live daemons it can reach; one
    /// entry per change that settled before the next, microseconds.
    pub topology_settle_us: Vec<u64>,
    /// Full runs with a script: how many of its steps happened.
    pub script_steps: usize,
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum What {
    Arrive { to: usize, bytes: Vec<u8> },
    Timer { node: usize },
    Submit { node: usize, k: usize },
}

pub(crate) const SERVICES: [ServiceType; 6] = [
    ServiceType::Unreliable,
    ServiceType::Reliable,
    ServiceType::Fifo,
    ServiceType::Causal,
    ServiceType::Agreed,
    ServiceType::Safe,
];

fn name(d: DaemonId) -> String {
    format!("d{d}")
}

struct Sim {
    rng: ChaCha20Rng,
    now: u64,
    queue: BinaryHeap<Reverse<(u64, u64, What)>>,
    order: u64,
    nodes: Vec<Ordering>,
    timers: Vec<Option<u64>>,
    net: Network,
    faulty: bool,
    burst_left: u32,
    history: Vec<Record>,
    packets: u64,
    delivered: u64,
    view: ViewId,
    submitted: std::collections::HashMap<String, u64>,
    agreed_lat: Vec<u64>,
    safe_lat: Vec<u64>,
    token_visits: Vec<u64>,
    token_packets: u64,
    data_packets: u64,
}

impl Sim {
    fn at(&mut self, t: u64, what: What) {
        self.order += 1;
        self.queue.push(Reverse((t, self.order, what)));
    }
    fn record(&mut self, p: &str, ev: Event) {
        self.history.push(Record {
            t: self.now,
            p: p.to_owned(),
            inc: 0,
            ev,
        });
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.rng.next_u64() as f64 / u64::MAX as f64) < p
    }
    fn delay(&mut self) -> u64 {
        let draw = self.rng.next_u64();
        self.net.delay_us(draw)
    }
    fn lost(&mut self) -> bool {
        if !self.faulty {
            return false;
        }
        if self.burst_left > 0 {
            self.burst_left -= 1;
            return true;
        }
        let lost = self.chance(self.net.loss);
        if lost && self.net.bursty {
            self.burst_left = (self.rng.next_u32() % 8) + 1;
        }
        lost
    }
    /// Sends what node `i` has to send, collects what it delivered, re-arms its timer.
    fn drain(&mut self, i: usize) {
        while let Some(t) = self.nodes[i].poll_transmit() {
            let bytes = t.packet.encode();
            let targets: Vec<usize> = match t.to {
                Dest::One(d) => vec![d as usize - 1],
                Dest::AllOthers => (0..self.nodes.len()).filter(|j| *j != i).collect(),
            };
            let is_token = matches!(t.packet, Packet::Token(_));
            for j in targets {
                self.packets += 1;
                if is_token {
                    self.token_packets += 1;
                } else {
                    self.data_packets += 1;
                }
                if self.lost() {
                    continue;
                }
                let d = self.delay();
                self.at(
                    self.now + d,
                    What::Arrive {
                        to: j,
                        bytes: bytes.clone(),
                    },
                );
                if self.faulty && self.chance(self.net.duplication) {
                    let d = self.delay();
                    self.at(
                        self.now + d,
                        What::Arrive {
                            to: j,
                            bytes: bytes.clone(),
                        },
                    );
                }
            }
        }
        // The send was recorded at submission: one fixed ring, nothing to wait for.
        while self.nodes[i].poll_sent().is_some() {}
        while let Some(d) = self.nodes[i].poll_delivery() {
            if let Body::Client {
                service: s,
                payload,
                ..
            } = &*d.body
            {
                let msg = String::from_utf8_lossy(payload).into_owned();
                let view = self.view.clone();
                self.delivered += 1;
                if let Some(at) = self.submitted.get(&msg) {
                    let lat = self.now - at;
                    match s {
                        ServiceType::Safe => self.safe_lat.push(lat),
                        ServiceType::Agreed => self.agreed_lat.push(lat),
                        _ => {}
                    }
                }
                self.record(
                    &name(i as DaemonId + 1),
                    Event::Deliver {
                        group: "g".into(),
                        msg: msg.clone(),
                        sender: name(d.sender),
                        service: (*s).into(),
                        view,
                        transitional: false,
                        payload: msg,
                    },
                );
            }
        }
        if let Some(t) = self.nodes[i].poll_timeout().map(Time::as_micros) {
            // A deadline already past fires now (time never runs backwards).
            let t = t.max(self.now);
            if self.timers[i] != Some(t) {
                self.timers[i] = Some(t);
                self.at(t, What::Timer { node: i });
            }
        }
    }
}

/// Runs one seed.
pub fn run(cfg: &SimConfig) -> SimResult {
    let mut rng = ChaCha20Rng::seed_from_u64(cfg.seed);
    let n = cfg.daemons.max(1);
    let net = match cfg.faults {
        FaultMix::None => Network {
            loss: 0.0,
            bursty: false,
            duplication: 0.0,
            delay_min_us: 50,
            delay_max_us: 300,
        },
        FaultMix::Swarm => {
            let r =
                |rng: &mut ChaCha20Rng, max: f64| (rng.next_u32() as f64 / u32::MAX as f64) * max;
            let loss = r(&mut rng, 0.3);
            let bursty = rng.next_u32() % 2 == 0;
            let duplication = r(&mut rng, 0.5);
            let delay_min_us = 20 + rng.next_u64() % 200;
            let delay_max_us = delay_min_us + rng.next_u64() % 3_000;
            Network {
                loss,
                bursty,
                duplication,
                delay_min_us,
                delay_max_us,
            }
        }
    };
    let ring = RingId {
        seq: 1,
        rep: 1,
        inc: 0,
    };
    let members: Vec<DaemonId> = (1..=n as DaemonId).collect();
    let mut sim = Sim {
        rng,
        now: 0,
        queue: BinaryHeap::new(),
        order: 0,
        nodes: members
            .iter()
            .map(|m| Ordering::new(OrderingConfig::default(), *m, ring, members.clone()))
            .collect(),
        timers: vec![None; n],
        net,
        faulty: cfg.faults != FaultMix::None,
        burst_left: 0,
        history: Vec::new(),
        packets: 0,
        delivered: 0,
        view: ViewId(ring.seq, name(ring.rep)),
        submitted: std::collections::HashMap::new(),
        agreed_lat: Vec::new(),
        safe_lat: Vec::new(),
        token_visits: Vec::new(),
        token_packets: 0,
        data_packets: 0,
    };
    let names: Vec<String> = members.iter().map(|m| name(*m)).collect();
    for p in &names {
        sim.record(
            p,
            Event::Join {
                group: "g".into(),
                vs: false,
            },
        );
        let view = sim.view.clone();
        sim.record(
            p,
            Event::View {
                group: "g".into(),
                view,
                members: names.clone(),
                transitional: vec![p.clone()],
            },
        );
    }
    for i in 0..n {
        for k in 0..cfg.messages {
            let t = sim.rng.next_u64() % (cfg.safety_ms * 1000).max(1);
            sim.at(t, What::Submit { node: i, k });
        }
    }
    for i in 0..n {
        sim.nodes[i].start(Time::ZERO);
        sim.drain(i);
    }
    let total = (n * cfg.messages * n) as u64;
    let mut stable = false;
    let limit = cfg.limit_ms * 1000;
    while let Some(Reverse((t, _, what))) = sim.queue.pop() {
        sim.now = t;
        if !stable && t >= cfg.safety_ms * 1000 {
            stable = true;
            sim.faulty = false;
            sim.history.push(Record {
                t,
                p: String::new(),
                inc: 0,
                ev: Event::Stable {
                    processes: names.clone(),
                },
            });
        }
        if sim.delivered >= total || t > limit {
            break;
        }
        match what {
            What::Arrive { to, bytes } => {
                // The wire is hostile even here: a packet that does not decode is dropped.
                if let Ok(p) = Packet::decode(&bytes) {
                    if to == 0 && matches!(p, Packet::Token(_)) {
                        sim.token_visits.push(t);
                    }
                    sim.nodes[to].handle_packet(Time::from_micros(t), p);
                }
                sim.drain(to);
            }
            What::Timer { node } => {
                if sim.timers[node] == Some(t) {
                    sim.timers[node] = None;
                    sim.nodes[node].handle_timeout(Time::from_micros(t));
                    sim.drain(node);
                }
            }
            What::Submit { node, k } => {
                let drawn = SERVICES[(sim.rng.next_u32() % 6) as usize];
                let s = cfg.service.unwrap_or(drawn);
                let msg = format!("{}/0/{k}", name(node as DaemonId + 1));
                let body = Body::Client {
                    client: name(node as DaemonId + 1),
                    groups: vec![("g".into(), 0)],
                    service: s,
                    payload: msg.clone().into_bytes().into(),
                };
                if sim.nodes[node].submit(body).is_ok() {
                    sim.submitted.insert(msg.clone(), t);
                    let view = sim.view.clone();
                    sim.record(
                        &name(node as DaemonId + 1),
                        Event::Send {
                            group: "g".into(),
                            msg: msg.clone(),
                            service: s.into(),
                            view,
                            payload: msg,
                        },
                    );
                }
            }
        }
    }
    if !stable {
        sim.history.push(Record {
            t: sim.now,
            p: String::new(),
            inc: 0,
            ev: Event::Stable { processes: names },
        });
    }
    let rotation_us = match sim.token_visits.as_slice() {
        [first, .., last] => (last - first) / (sim.token_visits.len() as u64 - 1),
        _ => 0,
    };
    let stats = Stats {
        token_packets: sim.token_packets,
        data_packets: sim.data_packets,
        agreed_latency_us_p50: pct(&mut sim.agreed_lat, 0.5),
        agreed_latency_us_p99: pct(&mut sim.agreed_lat, 0.99),
        safe_latency_us_p50: pct(&mut sim.safe_lat, 0.5),
        safe_latency_us_p99: pct(&mut sim.safe_lat, 0.99),
        rotation_us,
        converge_us: 0,
        topology_settle_us: Vec::new(),
        script_steps: 0,
    };
    if let Some(fault) = cfg.planted {
        sim.history = plant(&mut sim.history, fault);
    }
    SimResult {
        stats,
        seed: cfg.seed,
        network: sim.net,
        delivered: sim.delivered,
        views: n as u64,
        packets: sim.packets,
        sim_us: sim.now,
        completed: sim.delivered >= total,
        history: sim.history,
    }
}
