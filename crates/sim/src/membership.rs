//! Daemon membership under partitions, merges, crashes and restarts, loss and delay, with
//! messages of all six service types sent throughout: the daemons' configurations, transitional
//! signals, sends and deliveries are recorded (group "" in the history) and judged by the
//! checker, so extended virtual synchrony across ring changes is checked; after the faults stop
//! (crashed daemons restarted), every daemon must end in one ring of all daemons, without
//! flapping, and everything sent in it must be delivered everywhere.

use crate::{service, Network, SimResult, Stats, SERVICES};
use conclave_gcs::{Dest, Membership, MembershipConfig, RingEvent};
use conclave_history::{Event, Record, ViewId};
use conclave_wire::gcs::{Body, DaemonId, Packet, RingId};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Clone, Debug)]
pub struct MembershipSimConfig {
    pub seed: u64,
    pub daemons: usize,
    /// Length of the safety phase (partitions, loss), simulated milliseconds.
    pub safety_ms: u64,
    /// How long the fault-free phase may take to converge.
    pub settle_ms: u64,
}

impl MembershipSimConfig {
    pub fn new(seed: u64) -> Self {
        MembershipSimConfig {
            seed,
            daemons: 5,
            safety_ms: 2_000,
            settle_ms: 8_000,
        }
    }
}

fn name(d: DaemonId) -> String {
    format!("d{d}")
}

fn view_id(ring: RingId) -> ViewId {
    ViewId(ring.seq, format!("{}.{}", name(ring.rep), ring.inc))
}

/// Records what daemon `i` reports: its sends, deliveries, transitional signals and
/// configurations. Returns the number of deliveries and of configurations.
fn record_events(
    node: &mut Membership,
    who: &str,
    inc: u32,
    now: u64,
    history: &mut Vec<Record>,
) -> (u64, u64) {
    let (mut delivered, mut views) = (0, 0);
    let rec = |ev| Record {
        t: now,
        p: who.to_owned(),
        inc,
        ev,
    };
    let client = |body: &Body| match body {
        Body::Client {
            service: s,
            payload,
            ..
        } => Some((service(*s), String::from_utf8_lossy(payload).into_owned())),
        _ => None,
    };
    while let Some(ev) = node.poll_event() {
        match ev {
            RingEvent::Sent { ring, body, .. } => {
                if let Some((service, msg)) = client(&body) {
                    history.push(rec(Event::Send {
                        group: String::new(),
                        msg: msg.clone(),
                        service,
                        view: view_id(ring),
                        payload: msg,
                    }));
                }
            }
            RingEvent::Deliver {
                ring,
                sender,
                body,
                transitional,
                ..
            } => {
                if let Some((service, msg)) = client(&body) {
                    delivered += 1;
                    history.push(rec(Event::Deliver {
                        group: String::new(),
                        msg: msg.clone(),
                        sender: name(sender),
                        service,
                        view: view_id(ring),
                        transitional,
                        payload: msg,
                    }));
                }
            }
            RingEvent::TransitionalSignal { .. } => {
                history.push(rec(Event::TransSignal {
                    group: String::new(),
                }));
            }
            RingEvent::Configuration(c) => {
                views += 1;
                history.push(rec(Event::View {
                    group: String::new(),
                    view: view_id(c.ring),
                    members: c.members.iter().map(|m| name(*m)).collect(),
                    transitional: c.transitional.iter().map(|m| name(*m)).collect(),
                }));
            }
        }
    }
    (delivered, views)
}

/// Runs one seed of the membership simulation.
pub fn run_membership(cfg: &MembershipSimConfig) -> SimResult {
    let mut rng = ChaCha20Rng::seed_from_u64(cfg.seed ^ 0x6d656d62);
    let n = cfg.daemons.max(1);
    let unit = |rng: &mut ChaCha20Rng| rng.next_u32() as f64 / u32::MAX as f64;
    let net = Network {
        loss: unit(&mut rng) * 0.1,
        bursty: false,
        duplication: unit(&mut rng) * 0.2,
        delay_min_us: 50,
        delay_max_us: 50 + rng.next_u64() % 1_000,
    };
    // In flight: (arrival, order, from, to, bytes).
    type InFlight = Reverse<(u64, u64, usize, usize, Vec<u8>)>;
    let mut queue: BinaryHeap<InFlight> = BinaryHeap::new();
    let mut timers: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut order = 0u64;
    let mut nodes: Vec<Membership> = (1..=n as DaemonId)
        .map(|d| Membership::new(MembershipConfig::default(), d, 0, 0))
        .collect();
    let mut comp: Vec<usize> = vec![0; n];
    let mut history: Vec<Record> = Vec::new();
    let names: Vec<String> = (1..=n as DaemonId).map(name).collect();
    for p in &names {
        history.push(Record {
            t: 0,
            p: p.clone(),
            inc: 0,
            ev: Event::Join {
                group: String::new(),
                vs: false,
            },
        });
    }
    let mut next_change = 100_000 + rng.next_u64() % 400_000;
    let safety = cfg.safety_ms * 1000;
    let end = safety + cfg.settle_ms * 1000;
    let mut now = 0u64;
    let mut faulty = true;
    let (mut packets, mut views, mut delivered) = (0u64, 0u64, 0u64);
    // Messages: one every `send_gap_us` on average, from a daemon drawn at random, until
    // shortly after the run has converged (so that everything sent can still be delivered).
    let send_gap_us = 500 + rng.next_u64() % 10_000;
    let mut next_send = rng.next_u64() % send_gap_us;
    let mut sent_count: Vec<u64> = vec![0; n];
    let mut stable_at: Option<u64> = None;
    let mut converged_at: Option<u64> = None;
    let mut armed: Vec<Option<u64>> = vec![None; n];
    // Crashes: a dead daemon neither sends nor receives; it comes back as a new incarnation.
    let mut alive: Vec<bool> = vec![true; n];
    let mut inc: Vec<u32> = vec![0; n];
    let mut changed_at: Option<u64> = None;
    let mut settle: Vec<u64> = Vec::new();
    let mut touched: Vec<usize> = (0..n).collect();
    loop {
        // Outputs of the daemons that just ran.
        for i in std::mem::take(&mut touched) {
            if !alive[i] {
                continue;
            }
            while let Some(t) = nodes[i].poll_transmit() {
                let bytes = t.packet.encode();
                let targets: Vec<usize> = match t.to {
                    Dest::One(d) => vec![d as usize - 1],
                    Dest::AllOthers => (0..n).filter(|j| *j != i).collect(),
                };
                for j in targets {
                    packets += 1;
                    let cut = comp[i] != comp[j];
                    let lost = faulty && unit(&mut rng) < net.loss;
                    if cut || lost {
                        continue;
                    }
                    let copies = if faulty && unit(&mut rng) < net.duplication {
                        2
                    } else {
                        1
                    };
                    for _ in 0..copies {
                        let d = net.delay_us(rng.next_u64());
                        order += 1;
                        queue.push(Reverse((now + d, order, i, j, bytes.clone())));
                    }
                }
            }
            let (d, v) = record_events(&mut nodes[i], &names[i], inc[i], now, &mut history);
            delivered += d;
            views += v;
            if let Some(t) = nodes[i].poll_timeout() {
                if armed[i] != Some(t) {
                    armed[i] = Some(t);
                    timers.push(Reverse((t, i)));
                }
            }
        }
        // After a change of the network: has every live daemon a ring of exactly the live
        // daemons of its component?
        if let Some(since) = changed_at {
            let settled = (0..n).filter(|i| alive[*i]).all(|i| {
                let mut want: Vec<DaemonId> = (0..n)
                    .filter(|j| alive[*j] && comp[*j] == comp[i])
                    .map(|j| j as DaemonId + 1)
                    .collect();
                want.sort_unstable();
                let mut have = nodes[i].ring_members();
                have.sort_unstable();
                nodes[i].is_operational() && have == want
            });
            if settled {
                settle.push(now - since);
                changed_at = None;
            }
        }
        // Convergence: one operational ring of everyone, after the faults stopped.
        if stable_at.is_some() && converged_at.is_none() {
            let r0 = nodes[0].ring();
            if nodes.iter().all(|m| m.is_operational() && m.ring() == r0) && views > 0 {
                let last_view_members = history.iter().rev().find_map(|r| match &r.ev {
                    Event::View { members, .. } => Some(members.len()),
                    _ => None,
                });
                if last_view_members == Some(n) {
                    converged_at = Some(now);
                }
            }
        }
        // Watch a while after convergence for flapping, then stop.
        if converged_at.is_some_and(|c| now > c + 1_000_000) || now > end {
            break;
        }
        let next_packet = queue.peek().map(|Reverse((t, ..))| *t);
        let next_timer = timers.peek().map(|Reverse((t, _))| *t);
        let next_topology = if faulty {
            Some(next_change.min(safety))
        } else {
            None
        };
        let sending = converged_at.is_none_or(|c| next_send < c + 500_000);
        let next_submit = sending.then_some(next_send);
        let Some(t) = [next_packet, next_timer, next_topology, next_submit]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        now = t;
        if faulty && now >= safety {
            faulty = false;
            comp = vec![0; n];
            for i in 0..n {
                if !alive[i] {
                    restart(
                        i,
                        now,
                        &mut nodes,
                        &mut alive,
                        &mut inc,
                        &mut armed,
                        &mut history,
                    );
                    touched.push(i);
                }
            }
            stable_at = Some(now);
            history.push(Record {
                t: now,
                p: String::new(),
                inc: 0,
                ev: Event::Stable {
                    processes: names.clone(),
                },
            });
            continue;
        }
        if faulty && now >= next_change {
            // A new topology: one to three components, each daemon placed at random.
            let k = 1 + (rng.next_u32() % 3) as usize;
            comp = (0..n).map(|_| (rng.next_u32() as usize) % k).collect();
            next_change = now + 100_000 + rng.next_u64() % 400_000;
            changed_at = Some(now);
            // Sometimes a daemon crashes, or a crashed one restarts.
            let i = (rng.next_u32() as usize) % n;
            match rng.next_u32() % 4 {
                0 if alive[i] => {
                    alive[i] = false;
                    history.push(Record {
                        t: now,
                        p: name(i as DaemonId + 1),
                        inc: inc[i],
                        ev: Event::Crash,
                    });
                }
                1 if !alive[i] => {
                    restart(
                        i,
                        now,
                        &mut nodes,
                        &mut alive,
                        &mut inc,
                        &mut armed,
                        &mut history,
                    );
                    touched.push(i);
                }
                _ => {}
            }
            continue;
        }
        if next_submit == Some(t) {
            next_send = now + 1 + rng.next_u64() % (2 * send_gap_us);
            let i = (rng.next_u32() as usize) % n;
            let s = SERVICES[(rng.next_u32() % 6) as usize];
            if alive[i] {
                let msg = format!("{}/{}/{}", names[i], inc[i], sent_count[i]);
                sent_count[i] += 1;
                let body = Body::Client {
                    client: names[i].clone(),
                    groups: vec!["daemons".into()],
                    service: s,
                    payload: msg.into_bytes(),
                };
                // A full queue refuses; the message was never sent.
                let _ = nodes[i].submit(body);
                touched.push(i);
            }
            continue;
        }
        if next_packet == Some(t) {
            let Reverse((_, _, from, to, bytes)) = queue.pop().expect("peeked");
            if alive[to] {
                if let Ok(p) = Packet::decode(&bytes) {
                    nodes[to].handle_packet(now, from as DaemonId + 1, p);
                }
                touched.push(to);
            }
        } else if next_timer == Some(t) {
            let Reverse((_, i)) = timers.pop().expect("peeked");
            if armed[i] == Some(t) && alive[i] {
                armed[i] = None;
                nodes[i].handle_timeout(now);
                touched.push(i);
            }
        }
    }
    SimResult {
        seed: cfg.seed,
        network: net,
        history,
        delivered,
        views,
        packets,
        sim_us: now,
        completed: converged_at.is_some(),
        stats: Stats {
            converge_us: match (stable_at, converged_at) {
                (Some(s), Some(c)) => c - s,
                _ => 0,
            },
            topology_settle_us: settle,
            ..Stats::default()
        },
    }
}

/// A crashed daemon comes back with no state, as the next incarnation.
fn restart(
    i: usize,
    now: u64,
    nodes: &mut [Membership],
    alive: &mut [bool],
    inc: &mut [u32],
    armed: &mut [Option<u64>],
    history: &mut Vec<Record>,
) {
    alive[i] = true;
    inc[i] += 1;
    armed[i] = None;
    nodes[i] = Membership::new(MembershipConfig::default(), i as DaemonId + 1, inc[i], now);
    history.push(Record {
        t: now,
        p: name(i as DaemonId + 1),
        inc: inc[i],
        ev: Event::Join {
            group: String::new(),
            vs: false,
        },
    });
}
