//! Full runs: daemons with their clients and groups, under partitions, merges, crashes and
//! restarts, loss, duplication and delay. Clients join and leave groups (some asking for virtual
//! synchrony), send messages of all six service types, disconnect and reconnect; a daemon's crash
//! takes its clients with it. Two levels are recorded in one history and judged by the checker:
//! each client's group views, transitional signals, flush acknowledgements, sends and deliveries
//! (groups `g0`..), and each daemon's configurations and the ring-level sends and deliveries of
//! the clients' messages (group "", messages named `r:` and the client's message), so that
//! recovery and extended virtual synchrony of the ring are checked too. After the faults stop
//! (crashed daemons restarted, their clients reconnected), every daemon must end in one ring of
//! all daemons, every group in one view of its connected members, without flapping, and
//! everything sent in the final views be delivered everywhere.

use crate::{Network, SimResult, Stats, SERVICES};
use conclave_client::core::{Handled, SessionCore};
use conclave_gcs::Phase;
use conclave_history::{Event, Record};
use conclave_node::config::Identities;
use conclave_node::link::LinkMode;
use conclave_node::{Config, Node, NodeOptions, SessionId, SessionOutput, Time};
use conclave_wire::client::{ClientCommand, ClientEvent};
use conclave_wire::gcs::DaemonId;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;

mod cluster;
mod network;
mod scripts;
mod secure;
mod workload;

use cluster::{SimClient, World};
use network::Wire;
use scripts::{crash, restart, scripted};

/// The faults of a full run, by name.
pub const FAULT_NAMES: [&str; 13] = [
    "loss",
    "burst",
    "dup",
    "partition",
    "oneway",
    "nontransitive",
    "flap",
    "crash",
    "pause",
    "spike",
    "disconnect",
    "shatter",
    "hostile",
];

/// A set of faults (bits in the order of [`FAULT_NAMES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSet(pub u32);

impl FaultSet {
    /// The faults of the first full runs: uniform loss, duplication, partitions into up to three
    /// components, crashes and restarts, client disconnections.
    pub const BASIC: FaultSet = FaultSet(1 | 1 << 2 | 1 << 3 | 1 << 7 | 1 << 10);
    pub const ALL: FaultSet = FaultSet((1 << FAULT_NAMES.len()) - 1);
    pub const NONE: FaultSet = FaultSet(0);

    pub fn has(self, name: &str) -> bool {
        FAULT_NAMES
            .iter()
            .position(|n| *n == name)
            .is_some_and(|i| self.0 & (1 << i) != 0)
    }

    /// Parses a comma-separated list of fault names.
    pub fn parse(list: &str) -> Result<FaultSet, String> {
        let mut bits = 0;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let i = FAULT_NAMES.iter().position(|n| *n == name).ok_or_else(|| {
                format!(
                    "unknown fault {name:?}; the faults are {}",
                    FAULT_NAMES.join(",")
                )
            })?;
            bits |= 1 << i;
        }
        Ok(FaultSet(bits))
    }

    pub fn names(self) -> Vec<&'static str> {
        FAULT_NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

/// Which faults a full run draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultChoice {
    /// The basic faults always, each other fault with probability 1/2, as the seed draws.
    Swarm,
    List(FaultSet),
}

/// When a scripted step happens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// At this simulated time, in milliseconds (or as soon as the previous step has happened).
    At(u64),
    /// As soon as a live daemon is in this phase of the membership protocol, after the previous
    /// step.
    Phase(Phase),
}

/// A scripted step of a named scenario. Daemons and clients are numbered from 0 (client `c` is
/// the `c % clients_per_daemon`-th client of daemon `c / clients_per_daemon`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The daemons split into these components; a daemon listed in none is alone.
    Partition(Vec<Vec<usize>>),
    Heal,
    Crash(usize),
    /// Crashes the representative of the ring daemon `d` is in.
    CrashRepresentative(usize),
    Restart(usize),
    /// Restarts every crashed daemon.
    RestartCrashed,
    Join(usize, String),
    Leave(usize, String),
}

#[derive(Clone, Debug)]
pub struct MembershipSimConfig {
    pub seed: u64,
    /// Some messages go to two groups at once.
    pub multi_group: bool,
    pub faults: FaultChoice,
    /// Scripted steps, in order, on top of the faults (named scenarios).
    pub script: Vec<(Trigger, Action)>,
    pub daemons: usize,
    /// Clients connected to each daemon.
    pub clients_per_daemon: usize,
    /// Groups the clients choose from.
    pub groups: usize,
    /// Length of the safety phase (partitions, loss), simulated milliseconds.
    pub safety_ms: u64,
    /// How long the fault-free phase may take to converge.
    pub settle_ms: u64,
    /// Instead of the deployed default: how long the daemons hold an idle token (microseconds;
    /// 0: never).
    pub idle_hold_us: Option<u64>,
    /// Instead of the deployed default: bytes of messages per token visit.
    pub max_visit_bytes: Option<usize>,
    /// Every group is a secure group (docs/secure.md), with the protocol the seed draws (or
    /// this one), and the history holds each client's secure views for the checker's K1-K6.
    pub secure: bool,
    pub protocol: Option<conclave_gka::ProtocolId>,
    /// Where the secure groups' keys come from: the seed draws the daemons (Integrated VS) one
    /// time in three, or this.
    pub keys: Option<conclave_secure::KeySource>,
    /// With keys from the daemons: the groups are EVS groups whose late messages the daemons
    /// reseal (Optimized EVS); the seed draws it one time in two, or this.
    pub evs: Option<bool>,
    /// Every second client of each daemon speaks Spread's protocol (docs/spread.md): the seed
    /// draws it one time in two, or this (never in secure runs: Spread clients have no secure
    /// layer).
    pub spread: Option<bool>,
}

impl MembershipSimConfig {
    pub fn new(seed: u64) -> Self {
        MembershipSimConfig {
            seed,
            faults: FaultChoice::Swarm,
            multi_group: true,
            script: Vec::new(),
            daemons: 5,
            clients_per_daemon: 2,
            groups: 3,
            safety_ms: 2_000,
            settle_ms: 8_000,
            idle_hold_us: None,
            max_visit_bytes: None,
            secure: false,
            protocol: None,
            keys: None,
            evs: None,
            spread: None,
        }
    }

    /// The checker's bound on views after the faults stop (L3): merges may come one component
    /// at a time, and clients left with no group join one then.
    pub fn max_views_after_stable(&self) -> usize {
        conclave_history::Config::default().max_views_after_stable
            + self.daemons
            + self.daemons * self.clients_per_daemon
    }
}

fn name(d: DaemonId) -> String {
    format!("d{d}")
}

/// The configuration the simulated daemons run: the deployed defaults (links sealed), on
/// addresses that only name them (no socket is opened), with identities drawn from the seed.
pub fn sim_config(daemons: usize, seed: u64) -> (Config, Identities) {
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x6c696e6b);
    Config::local(daemons, 4800).with_identities(&mut rng)
}

/// Runs one seed of the full simulation.
pub fn run_membership(cfg: &MembershipSimConfig) -> SimResult {
    let mut rng = ChaCha20Rng::seed_from_u64(cfg.seed ^ 0x6d656d62);
    let n = cfg.daemons.max(1);
    let unit = |rng: &mut ChaCha20Rng| rng.next_u32() as f64 / u32::MAX as f64;
    let mut rng2 = ChaCha20Rng::seed_from_u64(cfg.seed ^ 0x6661756c);
    let faults = match cfg.faults {
        FaultChoice::Swarm => FaultSet(FaultSet::BASIC.0 | (rng2.next_u32() & FaultSet::ALL.0)),
        FaultChoice::List(f) => f,
    };
    let mut net = Network {
        loss: unit(&mut rng) * 0.1,
        bursty: faults.has("burst"),
        duplication: unit(&mut rng) * 0.2,
        delay_min_us: 50,
        delay_max_us: 50 + rng.next_u64() % 1_000,
    };
    if !faults.has("loss") {
        net.loss = 0.0;
    }
    if !faults.has("dup") {
        net.duplication = 0.0;
    }
    let (mut config, identities) = sim_config(n, cfg.seed);
    // Most seeds run the deployed default; some authenticate only, and some run with links off,
    // where the core meets duplicates and garbage itself.
    config.links.mode = match cfg.seed % 8 {
        7 => LinkMode::Off,
        6 => LinkMode::Authenticated,
        _ => LinkMode::Sealed,
    };
    let attacker = (faults.has("hostile") && config.links.mode != LinkMode::Off)
        .then(|| network::Attacker::new(cfg.seed));
    if let Some(us) = cfg.idle_hold_us {
        config.core.membership.ordering.idle_hold_us = us;
    }
    if let Some(b) = cfg.max_visit_bytes {
        config.core.membership.ordering.max_visit_bytes = b;
    }
    let safety = cfg.safety_ms * 1000;
    let mut wire = Wire {
        n,
        peers: config.daemon.iter().map(|d| d.peer).collect(),
        net,
        faults,
        queue: BinaryHeap::new(),
        order: 0,
        packets: 0,
        comp: vec![0; n],
        cut: BTreeSet::new(),
        flap: None,
        burst_left: 0,
        spike: (0, 0),
        next_spike: if faults.has("spike") {
            rng2.next_u64() % safety.max(1)
        } else {
            u64::MAX
        },
        paused_until: vec![0; n],
        attacker,
        next_pause: if faults.has("pause") {
            rng2.next_u64() % safety.max(1)
        } else {
            u64::MAX
        },
        rng2,
    };
    let mut timers: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    // Drawn from a stream of its own, so that the faults stay the seed's.
    let spread = !cfg.secure
        && cfg
            .spread
            .unwrap_or(ChaCha20Rng::seed_from_u64(cfg.seed ^ 0x7370_7264).next_u32() % 2 == 0);
    let mut w = World {
        multi_group: cfg.multi_group,
        groups: cfg.groups,
        cfg: config,
        identities,
        secret_seed: cfg.seed ^ 0x7365_6372_6574,
        nodes: Vec::new(),
        clients: (0..n)
            .flat_map(|d| {
                (0..cfg.clients_per_daemon).map(move |j| {
                    SimClient::new(d, format!("c{}.{j}", d + 1), spread && j % 2 == 1)
                })
            })
            .collect(),
        sessions: BTreeMap::new(),
        next_session: 1,
        by_name: BTreeMap::new(),
        history: Vec::new(),
        dinc: vec![0; n],
        spread_read: 0,
        spread_broken: 0,
        delivered: 0,
        views: 0,
        now: 0,
        security: None,
    };
    if cfg.secure {
        // The protocol is drawn from its own stream, so that the faults stay the seed's.
        let mut prng = ChaCha20Rng::seed_from_u64(cfg.seed ^ 0x73656375);
        let all = [
            conclave_gka::ProtocolId::Gdh,
            conclave_gka::ProtocolId::Ckd,
            conclave_gka::ProtocolId::Tgdh,
            conclave_gka::ProtocolId::Str,
            conclave_gka::ProtocolId::Bd,
        ];
        let protocol = cfg.protocol.unwrap_or(all[(prng.next_u32() % 5) as usize]);
        let keys = cfg.keys.unwrap_or(if prng.next_u32() % 3 == 0 {
            conclave_secure::KeySource::Daemons
        } else if prng.next_u32() % 3 == 0 {
            conclave_secure::KeySource::KeyGraph
        } else {
            conclave_secure::KeySource::Agreement
        });
        if keys == conclave_secure::KeySource::KeyGraph {
            w.clients
                .push(SimClient::new(0, secure::KEY_SERVER.to_owned(), false));
        }
        let evs = keys == conclave_secure::KeySource::Daemons
            && cfg.evs.unwrap_or(prng.next_u32() % 2 == 0);
        w.security = Some(secure::Security::new(
            &w.clients, protocol, keys, evs, cfg.seed,
        ));
    }
    w.by_name = w
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.clone(), i))
        .collect();
    w.nodes = (0..n).map(|i| w.node(i)).collect();
    for ci in 0..w.clients.len() {
        w.connect(ci);
    }
    let dnames: Vec<String> = (1..=n as DaemonId).map(name).collect();
    for p in &dnames {
        w.push(
            p,
            0,
            Event::Join {
                group: String::new(),
                vs: false,
            },
        );
    }
    let mut next_change = 100_000 + rng.next_u64() % 400_000;
    let end = safety + cfg.settle_ms * 1000;
    let mut faulty = true;
    // Client actions: one every `act_gap_us` on average, from a client drawn at random, until
    // shortly after the run has converged (so that everything sent can still be delivered).
    let act_gap_us = 300 + rng.next_u64() % 5_000;
    let mut next_act = rng.next_u64() % act_gap_us;
    let mut stable_at: Option<u64> = None;
    let mut converged_at: Option<u64> = None;
    let mut armed: Vec<Option<u64>> = vec![None; n];
    // Crashes: a dead daemon neither sends nor receives; it comes back as a new incarnation.
    let mut alive: Vec<bool> = vec![true; n];
    let mut changed_at: Option<u64> = None;
    let mut settle: Vec<u64> = Vec::new();
    let mut touched: Vec<usize> = (0..n).collect();
    let mut step = 0;
    loop {
        // Outputs of the daemons that just ran.
        touched.sort_unstable();
        touched.dedup();
        for i in std::mem::take(&mut touched) {
            if !alive[i] {
                continue;
            }
            w.drain(i, &mut wire, &mut rng, faulty);
            if let Some(t) = w.nodes[i].poll_timeout().map(Time::as_micros) {
                // A deadline already past fires now (time never runs backwards).
                let t = t.max(w.now);
                if armed[i] != Some(t) {
                    armed[i] = Some(t);
                    timers.push(Reverse((t, i)));
                }
            }
        }
        let now = w.now;
        // Scripted steps waiting for a phase.
        while let Some((Trigger::Phase(p), action)) = cfg.script.get(step) {
            let seen = (0..n).any(|i| alive[i] && w.nodes[i].core().membership().phase() == *p);
            if !seen || !faulty {
                break;
            }
            step += 1;
            changed_at = Some(now);
            scripted(
                action,
                &mut w,
                &mut wire,
                &mut alive,
                &mut armed,
                &mut touched,
            );
        }
        // After a change of the network: has every live daemon a ring of exactly the live
        // daemons of its component?
        if let Some(since) = changed_at.filter(|_| wire.plain(now)) {
            let settled = (0..n).filter(|i| alive[*i]).all(|i| {
                let mut want: Vec<DaemonId> = (0..n)
                    .filter(|j| alive[*j] && wire.comp[*j] == wire.comp[i])
                    .map(|j| j as DaemonId + 1)
                    .collect();
                want.sort_unstable();
                let core = w.nodes[i].core();
                let mut have = core.membership().ring_members();
                have.sort_unstable();
                core.ready() && have == want
            });
            if settled {
                settle.push(now - since);
                changed_at = None;
            }
        }
        // Convergence: one ring of everyone with its groups settled, after the faults stopped.
        if stable_at.is_some() && converged_at.is_none() {
            let r0 = w.nodes[0].core().membership().ring();
            let one_ring = w.nodes.iter().map(Node::core).all(|d| {
                d.ready() && d.membership().ring() == r0 && d.membership().ring_members().len() == n
            });
            if one_ring {
                converged_at = Some(now);
            }
        }
        // Watch a while after convergence for flapping, then stop.
        if converged_at.is_some_and(|c| now > c + 1_000_000) || now > end {
            break;
        }
        let next_packet = wire.queue.peek().map(|Reverse((t, ..))| *t);
        let next_timer = timers.peek().map(|Reverse((t, _))| *t);
        let next_topology = if faulty {
            let flap = wire.flap.map_or(u64::MAX, |f| f.3);
            Some(
                next_change
                    .min(safety)
                    .min(flap)
                    .min(wire.next_pause)
                    .min(wire.next_spike),
            )
        } else {
            None
        };
        let acting = converged_at.is_none_or(|c| next_act < c + 500_000);
        let next_action = acting.then_some(next_act);
        // A paused daemon's clients wait for it too.
        let next_key_server = w.key_server_deadline().map(|t| t.max(wire.paused_until[0]));
        let next_step = match cfg.script.get(step) {
            Some((Trigger::At(ms), _)) if faulty => Some((ms * 1000).max(now)),
            _ => None,
        };
        let Some(t) = [
            next_packet,
            next_timer,
            next_topology,
            next_action,
            next_step,
            next_key_server,
        ]
        .into_iter()
        .flatten()
        .min() else {
            break;
        };
        w.now = t;
        let now = t;
        if faulty && now >= safety {
            faulty = false;
            wire.heal();
            for i in 0..n {
                if !alive[i] {
                    restart(i, &mut w, &mut alive, &mut armed);
                    touched.push(i);
                }
            }
            // The key server is back for the calm (the groups need it to key their views).
            if let Some(ci) = (0..w.clients.len()).find(|&ci| w.is_key_server(ci)) {
                if !w.clients[ci].connected() {
                    w.connect(ci);
                    touched.push(w.clients[ci].daemon);
                }
            }
            stable_at = Some(now);
            let mut processes = dnames.clone();
            processes.extend(
                w.clients
                    .iter()
                    .filter(|c| c.connected())
                    .map(|c| c.name.clone()),
            );
            w.push("", 0, Event::Stable { processes });
            continue;
        }
        if next_step == Some(t) {
            let action = cfg.script[step].1.clone();
            step += 1;
            changed_at = Some(now);
            scripted(
                &action,
                &mut w,
                &mut wire,
                &mut alive,
                &mut armed,
                &mut touched,
            );
            continue;
        }
        if faulty && wire.flap.is_some_and(|f| now >= f.3) {
            if let Some(f) = &mut wire.flap {
                f.2 = !f.2;
                f.3 = now + 20_000 + wire.rng2.next_u64() % 40_000;
            }
            continue;
        }
        if faulty && now >= wire.next_pause {
            let i = wire.rng2.next_u32() as usize % n;
            let len = 250_000 + wire.rng2.next_u64() % 450_000;
            wire.paused_until[i] = now + len;
            wire.next_pause = now + 300_000 + wire.rng2.next_u64() % 700_000;
            continue;
        }
        if faulty && now >= wire.next_spike {
            let len = 50_000 + wire.rng2.next_u64() % 250_000;
            wire.spike = (now, now + len);
            wire.next_spike = now + len + 200_000 + wire.rng2.next_u64() % 600_000;
            continue;
        }
        if faulty && now >= next_change {
            // A new topology: one to three components, each daemon placed at random.
            let k = 1 + (rng.next_u32() % 3) as usize;
            let comp: Vec<usize> = (0..n).map(|_| (rng.next_u32() as usize) % k).collect();
            if faults.has("partition") {
                wire.comp = comp;
            }
            wire.extra_topology(now);
            next_change = now + 100_000 + rng.next_u64() % 400_000;
            changed_at = Some(now);
            // Sometimes a daemon crashes, or a crashed one restarts.
            let i = (rng.next_u32() as usize) % n;
            match rng.next_u32() % 4 {
                _ if !faults.has("crash") => {}
                0 if alive[i] => crash(i, &mut w, &mut alive),
                1 if !alive[i] => {
                    restart(i, &mut w, &mut alive, &mut armed);
                    touched.push(i);
                }
                _ => {}
            }
            continue;
        }
        if next_key_server == Some(t) && alive[0] {
            w.key_server_tick();
            touched.push(0);
            continue;
        }
        if next_action == Some(t) {
            next_act = now + 1 + rng.next_u64() % (2 * act_gap_us);
            let ci = (rng.next_u32() as usize) % w.clients.len().max(1);
            if let Some(c) = w.clients.get(ci) {
                let d = c.daemon;
                if alive[d] && wire.paused_until[d] <= now {
                    w.act(ci, &mut rng, cfg.groups, !faulty, faults.has("disconnect"));
                    touched.push(d);
                }
            }
            continue;
        }
        if next_packet == Some(t) {
            let Reverse((_, _, from, to, bytes)) = wire.queue.pop().expect("peeked");
            if wire.paused_until[to] > now {
                // A paused daemon reads its socket when it resumes.
                wire.order += 1;
                let at = wire.paused_until[to];
                wire.queue.push(Reverse((at, wire.order, from, to, bytes)));
            } else if alive[to] {
                // The wire is hostile even here: a packet that does not decode is refused.
                let at = Time::from_micros(now);
                let sent = wire.attacker.is_some().then(|| bytes.clone());
                w.nodes[to].handle_datagram(
                    at,
                    wire.peers[from],
                    bytes::BytesMut::from(&bytes[..]),
                );
                touched.push(to);
                if let (Some(a), Some(sent)) = (wire.attacker.as_mut(), sent) {
                    if let Some((kind, src, d)) = a.strike(&wire.peers, from, to, w.dinc[to], &sent)
                    {
                        let core = |w: &World| w.nodes[to].metrics().packets_to_core.load(Relaxed);
                        let before = core(&w);
                        w.nodes[to].handle_datagram(at, src, bytes::BytesMut::from(&d[..]));
                        let taken = core(&w) - before;
                        let kind = kind.to_owned();
                        w.push(
                            &name(to as DaemonId + 1),
                            w.dinc[to],
                            Event::Hostile { kind, taken },
                        );
                    }
                }
            }
        } else if next_timer == Some(t) {
            let Reverse((_, i)) = timers.pop().expect("peeked");
            if wire.paused_until[i] > now {
                timers.push(Reverse((wire.paused_until[i], i)));
                armed[i] = Some(wire.paused_until[i]);
            } else if armed[i] == Some(t) && alive[i] {
                armed[i] = None;
                w.nodes[i].handle_timeout(Time::from_micros(now));
                touched.push(i);
            }
        }
    }
    SimResult {
        seed: cfg.seed,
        network: wire.net,
        delivered: w.delivered,
        views: w.views,
        packets: wire.packets,
        sim_us: w.now,
        completed: converged_at.is_some(),
        stats: Stats {
            converge_us: match (stable_at, converged_at) {
                (Some(s), Some(c)) => c - s,
                _ => 0,
            },
            topology_settle_us: settle,
            script_steps: step,
            spread_messages: w.spread_read
                + w.clients
                    .iter()
                    .filter_map(|c| c.spread.as_ref())
                    .map(|s| s.read.iter().sum::<u64>())
                    .sum::<u64>(),
            spread_unreadable: w
                .clients
                .iter()
                .filter_map(|c| c.spread.as_ref())
                .filter(|s| s.broken)
                .count() as u64
                + w.spread_broken,
            ..Stats::default()
        },
        history: w.history,
    }
}
