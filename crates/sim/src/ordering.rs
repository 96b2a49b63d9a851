//! Ordering runs: one fixed ring of [`Ordering`]s over the core's test network
//! ([`conclave_gcs::testnet`]), with links that lose (uniformly or in bursts), duplicate, delay
//! and so reorder packets as the seed decides during the safety phase, and messages of every
//! service type submitted throughout it.

use crate::{name, pct, FaultMix, Network, Planted, SimConfig, SimResult, Stats, SERVICES};
use conclave_gcs::testnet::{Links, TestNet};
use conclave_gcs::{Ordering, OrderingConfig, Time};
use conclave_history::{Event, Record, ViewId};
use conclave_wire::gcs::{Body, DaemonId, Packet, RingId, ServiceType};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

/// The links of a run: the seed's faults while `faulty`, its delays always. They count what is
/// sent, and the token's arrivals at the first daemon (for the rotation time).
struct SimLinks {
    rng: ChaCha20Rng,
    net: Network,
    faulty: bool,
    burst_left: u32,
    packets: u64,
    token_packets: u64,
    data_packets: u64,
    wake_packets: u64,
    token_visits: Vec<u64>,
}

impl SimLinks {
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.rng.next_u64() as f64 / u64::MAX as f64) < p
    }
    fn delay(&mut self) -> Duration {
        let draw = self.rng.next_u64();
        Duration::from_micros(self.net.delay_us(draw))
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
}

impl Links for SimLinks {
    fn carry(&mut self, now: Time, _: DaemonId, to: DaemonId, packet: &Packet) -> Vec<Time> {
        self.packets += 1;
        let token = matches!(packet, Packet::Token(_));
        match packet {
            Packet::Token(_) => self.token_packets += 1,
            Packet::Wake { .. } => self.wake_packets += 1,
            _ => self.data_packets += 1,
        }
        if self.lost() {
            return Vec::new();
        }
        let mut at = vec![now + self.delay()];
        if self.faulty && self.chance(self.net.duplication) {
            at.push(now + self.delay());
        }
        if token && to == 1 {
            self.token_visits.extend(at.iter().map(|t| t.as_micros()));
        }
        at
    }
}

/// What the run saw delivered.
struct Tally {
    history: Vec<Record>,
    delivered: u64,
    view: ViewId,
    submitted: HashMap<String, u64>,
    agreed_lat: Vec<u64>,
    safe_lat: Vec<u64>,
}

impl Tally {
    fn record(&mut self, t: u64, p: &str, ev: Event) {
        self.history.push(Record {
            t,
            p: p.to_owned(),
            inc: 0,
            ev,
        });
    }

    /// Records what daemon `i` delivered.
    fn collect(&mut self, t: u64, i: usize, node: &mut Ordering) {
        // The send was recorded at submission: one fixed ring, nothing to wait for.
        while node.poll_sent().is_some() {}
        while let Some(d) = node.poll_delivery() {
            let Body::Client {
                service, payload, ..
            } = &*d.body
            else {
                continue;
            };
            let msg = String::from_utf8_lossy(payload).into_owned();
            self.delivered += 1;
            if let Some(at) = self.submitted.get(&msg) {
                match service {
                    ServiceType::Safe => self.safe_lat.push(t - at),
                    ServiceType::Agreed => self.agreed_lat.push(t - at),
                    _ => {}
                }
            }
            let ev = Event::Deliver {
                group: "g".into(),
                msg: msg.clone(),
                sender: name(d.sender),
                service: (*service).into(),
                view: self.view.clone(),
                transitional: false,
                payload: msg,
            };
            self.record(t, &name(i as DaemonId + 1), ev);
        }
    }
}

fn draw_network(rng: &mut ChaCha20Rng, faults: FaultMix) -> Network {
    match faults {
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
            let loss = r(rng, 0.3);
            let bursty = rng.next_u32().is_multiple_of(2);
            let duplication = r(rng, 0.5);
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
    }
}

/// Runs one seed.
pub fn run(cfg: &SimConfig) -> SimResult {
    let mut rng = ChaCha20Rng::seed_from_u64(cfg.seed);
    let n = cfg.daemons.max(1);
    let network = draw_network(&mut rng, cfg.faults);
    let ring = RingId {
        seq: 1,
        rep: 1,
        inc: 0,
    };
    let members: Vec<DaemonId> = (1..=n as DaemonId).collect();
    let names: Vec<String> = members.iter().map(|m| name(*m)).collect();
    let mut tally = Tally {
        history: Vec::new(),
        delivered: 0,
        view: ViewId(ring.seq, name(ring.rep)),
        submitted: HashMap::new(),
        agreed_lat: Vec::new(),
        safe_lat: Vec::new(),
    };
    for p in &names {
        let join = Event::Join {
            group: "g".into(),
            vs: false,
        };
        tally.record(0, p, join);
        let view = Event::View {
            group: "g".into(),
            view: tally.view.clone(),
            members: names.clone(),
            transitional: vec![p.clone()],
        };
        tally.record(0, p, view);
    }
    // Every message's time and sender, drawn up front.
    let mut submits = BinaryHeap::new();
    for i in 0..n {
        for k in 0..cfg.messages {
            let t = rng.next_u64() % (cfg.safety_ms * 1000).max(1);
            submits.push(Reverse((t, i, k)));
        }
    }
    let nodes: Vec<Ordering> = members
        .iter()
        .map(|m| Ordering::new(OrderingConfig::default(), *m, ring, members.clone()))
        .collect();
    let links = SimLinks {
        rng,
        net: network,
        faulty: cfg.faults != FaultMix::None,
        burst_left: 0,
        packets: 0,
        token_packets: 0,
        data_packets: 0,
        wake_packets: 0,
        token_visits: Vec::new(),
    };
    let mut net = TestNet::new(nodes, links);
    net.peers[0].start(Time::ZERO);
    net.send(0);
    tally.collect(0, 0, &mut net.peers[0]);

    let total = (n * cfg.messages * n) as u64;
    let mut stable = false;
    let limit = cfg.limit_ms * 1000;
    let mut now = 0;
    loop {
        let next_submit = submits.peek().map(|Reverse((t, ..))| *t);
        let next_net = net.next_at().map(Time::as_micros);
        // A message submitted at the time a packet arrives goes first.
        let t = match (next_submit, next_net) {
            (Some(s), Some(p)) => s.min(p),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => break,
            },
        };
        now = t;
        if !stable && t >= cfg.safety_ms * 1000 {
            stable = true;
            net.links.faulty = false;
            let ev = Event::Stable {
                processes: names.clone(),
            };
            tally.record(t, "", ev);
        }
        if tally.delivered >= total || t > limit {
            break;
        }
        if next_submit == Some(t) {
            let Some(Reverse((_, node, k))) = submits.pop() else {
                break;
            };
            net.advance_to(Time::from_micros(t));
            // A full queue holds the message back, as a daemon holds a client's command until
            // the ring takes more (it is not lost): tried again after the next token visit or so.
            if !net.peers[node].can_submit() {
                submits.push(Reverse((t + 200, node, k)));
                continue;
            }
            let drawn = SERVICES[(net.links.rng.next_u32() % 6) as usize];
            let service = cfg.service.unwrap_or(drawn);
            let sender = name(node as DaemonId + 1);
            let msg = format!("{sender}/0/{k}");
            let body = Body::Client {
                client: sender.as_str().into(),
                groups: [("g".into(), 0)].into_iter().collect(),
                service,
                payload: msg.clone().into_bytes().into(),
                spread: None,
            };
            if net.peers[node].submit(body).is_ok() {
                tally.submitted.insert(msg.clone(), t);
                let ev = Event::Send {
                    group: "g".into(),
                    msg: msg.clone(),
                    service: service.into(),
                    view: tally.view.clone(),
                    payload: msg,
                };
                tally.record(t, &sender, ev);
            }
            // A token held while idle goes at once now.
            net.send(node);
            continue;
        }
        if let Some(step) = net.step() {
            let i = step.peer();
            let t = net.now().as_micros();
            tally.collect(t, i, &mut net.peers[i]);
        }
    }
    if !stable {
        let ev = Event::Stable { processes: names };
        tally.record(now, "", ev);
    }
    let links = &mut net.links;
    links.token_visits.retain(|t| *t <= now);
    links.token_visits.sort_unstable();
    let rotation_us = match links.token_visits.as_slice() {
        [first, .., last] => (last - first) / (links.token_visits.len() as u64 - 1),
        _ => 0,
    };
    let stats = Stats {
        token_packets: links.token_packets,
        data_packets: links.data_packets,
        wake_packets: links.wake_packets,
        agreed_latency_us_p50: pct(&mut tally.agreed_lat, 0.5),
        agreed_latency_us_p99: pct(&mut tally.agreed_lat, 0.99),
        safe_latency_us_p50: pct(&mut tally.safe_lat, 0.5),
        safe_latency_us_p99: pct(&mut tally.safe_lat, 0.99),
        rotation_us,
        converge_us: 0,
        topology_settle_us: Vec::new(),
        script_steps: 0,
        spread_messages: 0,
        spread_unreadable: 0,
    };
    if let Some(fault) = cfg.planted {
        tally.history = plant(&mut tally.history, fault);
    }
    SimResult {
        stats,
        seed: cfg.seed,
        network: links.net,
        delivered: tally.delivered,
        views: n as u64,
        packets: links.packets,
        sim_us: now,
        completed: tally.delivered >= total,
        history: tally.history,
    }
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
