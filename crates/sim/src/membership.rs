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
use conclave_gcs::{
    ClientCommand, ClientEvent, Daemon, DaemonConfig, Dest, GroupViewId, Phase, RingEvent, Transmit,
};
use conclave_history::wire::{client_event, Naming};
use conclave_history::{Event, Record, Service, ViewId};
use conclave_wire::gcs::{Body, DaemonId, RingId};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// The faults of a full run, by name.
pub const FAULT_NAMES: [&str; 12] = [
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
    /// The daemons hold an idle token this long (microseconds; 0: never), as real daemons do.
    pub idle_hold_us: u64,
    /// Bytes of messages per token visit (the core's default: no limit).
    pub max_visit_bytes: usize,
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
            idle_hold_us: 0,
            max_visit_bytes: usize::MAX,
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

fn client_name(d: usize, j: usize) -> String {
    format!("c{}.{j}", d + 1)
}

fn ring_view(ring: RingId) -> ViewId {
    ViewId(ring.seq, format!("{}.{}", name(ring.rep), ring.inc))
}

/// A group view in the history: the ring's number, then the group's count on that ring.
fn group_view(v: GroupViewId) -> ViewId {
    ViewId(
        conclave_history::wire::group_view_number(v),
        format!("{}.{}", name(v.ring.rep), v.ring.inc),
    )
}

/// One simulated client: which daemon it is on, its incarnation, what it has joined.
struct SimClient {
    daemon: usize,
    name: String,
    inc: u32,
    connected: bool,
    groups: BTreeMap<String, bool>,
    sent: u64,
}

struct World {
    multi_group: bool,
    nodes: Vec<Daemon>,
    clients: Vec<SimClient>,
    history: Vec<Record>,
    dinc: Vec<u32>,
    delivered: u64,
    views: u64,
    now: u64,
}

impl World {
    fn push(&mut self, p: &str, inc: u32, ev: Event) {
        self.history.push(Record {
            t: self.now,
            p: p.to_owned(),
            inc,
            ev,
        });
    }

    fn client_index(&self, name: &str) -> Option<usize> {
        self.clients.iter().position(|c| c.name == name)
    }

    /// Records what daemon `i` reported, at both levels; VS clients acknowledge flushes at once.
    fn record(&mut self, i: usize) {
        let dname = name(i as DaemonId + 1);
        let dinc = self.dinc[i];
        let msg_of = |body: &Body| match body {
            Body::Client {
                service: s,
                payload,
                ..
            } => Some((
                Service::from(*s),
                format!("r:{}", String::from_utf8_lossy(payload)),
            )),
            _ => None,
        };
        while let Some(ev) = self.nodes[i].poll_ring_event() {
            let ev = match ev {
                RingEvent::Sent { ring, body, .. } => match msg_of(&body) {
                    Some((service, msg)) => Event::Send {
                        group: String::new(),
                        msg: msg.clone(),
                        service,
                        view: ring_view(ring),
                        payload: msg,
                    },
                    None => continue,
                },
                RingEvent::Deliver {
                    ring,
                    sender,
                    body,
                    transitional,
                    ..
                } => match msg_of(&body) {
                    Some((service, msg)) => Event::Deliver {
                        group: String::new(),
                        msg: msg.clone(),
                        sender: name(sender),
                        service,
                        view: ring_view(ring),
                        transitional,
                        payload: msg,
                    },
                    None => continue,
                },
                RingEvent::TransitionalSignal { .. } => Event::TransSignal {
                    group: String::new(),
                },
                RingEvent::Configuration(c) => {
                    self.views += 1;
                    Event::View {
                        group: String::new(),
                        view: ring_view(c.ring),
                        members: c.members.iter().map(|m| name(*m)).collect(),
                        transitional: c.transitional.iter().map(|m| name(*m)).collect(),
                    }
                }
            };
            self.push(&dname, dinc, ev);
        }
        let mut acks = Vec::new();
        while let Some((client, ev)) = self.nodes[i].poll_event() {
            let Some(ci) = self.client_index(&client) else {
                continue;
            };
            let inc = self.clients[ci].inc;
            let text = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
            let naming = Naming {
                view: &group_view,
                msg: &|_: &str, group: &str, p: &[u8]| format!("{}@{group}", text(p)),
                payload: &text,
            };
            let ev = match ev {
                ClientEvent::FlushRequest { group, view } => {
                    acks.push((client.clone(), group, view));
                    continue;
                }
                ClientEvent::Closed { .. } => {
                    self.client_crash(ci);
                    continue;
                }
                ev => {
                    if matches!(ev, ClientEvent::Message { .. }) {
                        self.delivered += 1;
                    }
                    match client_event(&client, ev, &naming) {
                        Some(ev) => ev,
                        None => continue,
                    }
                }
            };
            self.push(&client, inc, ev);
        }
        let again = !acks.is_empty();
        for (client, group, view) in acks {
            let now = self.now;
            // A client that left meanwhile has nothing to acknowledge.
            let ack = ClientCommand::FlushAck { group, view };
            let _ = self.nodes[i].handle_client(now, &client, ack);
        }
        if again {
            self.record(i);
        }
    }

    fn connect(&mut self, ci: usize) {
        let d = self.clients[ci].daemon;
        let name = self.clients[ci].name.clone();
        if self.nodes[d].connect(&name).is_ok() {
            self.clients[ci].connected = true;
            self.clients[ci].groups.clear();
        }
    }

    /// A client crashes or disconnects: its incarnation ends.
    fn client_crash(&mut self, ci: usize) {
        let c = &mut self.clients[ci];
        if !c.connected {
            return;
        }
        c.connected = false;
        c.groups.clear();
        let (name, inc) = (c.name.clone(), c.inc);
        c.inc += 1;
        self.push(&name, inc, Event::Crash);
    }

    /// One step of client `ci`'s workload.
    fn act(
        &mut self,
        ci: usize,
        rng: &mut ChaCha20Rng,
        groups: usize,
        calm: bool,
        disconnects: bool,
    ) {
        let d = self.clients[ci].daemon;
        let now = self.now;
        if !self.clients[ci].connected {
            if !calm {
                self.connect(ci);
            }
            return;
        }
        let roll = rng.next_u32() % 100;
        // Membership requests wait while the daemon's configuration changes (a client would
        // see the transitional signal); messages may be sent at any time.
        let roll = if self.nodes[d].ready() { roll } else { 100 };
        let joined: Vec<String> = self.clients[ci].groups.keys().cloned().collect();
        let name = self.clients[ci].name.clone();
        let pick = format!("g{}", rng.next_u32() as usize % groups.max(1));
        if (joined.is_empty() && roll < 100) || (!calm && roll < 6) {
            if !self.clients[ci].groups.contains_key(&pick) {
                let vs = rng.next_u32().is_multiple_of(2);
                let cmd = ClientCommand::Join {
                    group: pick.clone(),
                    vs,
                };
                if self.nodes[d].handle_client(now, &name, cmd).is_ok() {
                    self.clients[ci].groups.insert(pick, vs);
                }
            }
        } else if !calm && roll < 10 {
            let g = joined[rng.next_u32() as usize % joined.len()].clone();
            let cmd = ClientCommand::Leave { group: g.clone() };
            if self.nodes[d].handle_client(now, &name, cmd).is_ok() {
                self.clients[ci].groups.remove(&g);
            }
        } else if !calm && roll < 12 && disconnects {
            let _ = self.nodes[d].disconnect(now, &name);
            self.client_crash(ci);
        } else if !joined.is_empty() {
            let k = rng.next_u32() as usize % joined.len();
            let s = SERVICES[(rng.next_u32() % 6) as usize];
            let c = &mut self.clients[ci];
            let msg = format!("{}/{}/{}", c.name, c.inc, c.sent);
            // Every fifth message of a client in several groups goes to two of them.
            let mut groups = vec![joined[k].clone()];
            if self.multi_group && c.sent % 5 == 4 && joined.len() > 1 {
                groups.push(joined[(k + 1) % joined.len()].clone());
            }
            c.sent += 1;
            let cmd = ClientCommand::Multicast {
                service: s,
                groups,
                payload: msg.into_bytes().into(),
            };
            // A full queue refuses; the message was never sent.
            let _ = self.nodes[d].handle_client(now, &name, cmd);
        }
    }
}

// In flight: (arrival, order, from, to, bytes).
type InFlight = Reverse<(u64, u64, usize, usize, Vec<u8>)>;

/// The simulated network between the daemons, with the faults a seed drew. The basic faults draw
/// from the run's main generator (so that their schedules replay as they always did); the others
/// from their own.
struct Wire {
    n: usize,
    net: Network,
    faults: FaultSet,
    rng2: ChaCha20Rng,
    queue: BinaryHeap<InFlight>,
    order: u64,
    packets: u64,
    /// Partition components.
    comp: Vec<usize>,
    /// Directed links cut on top of the components (one-way and non-transitive partitions).
    cut: BTreeSet<(usize, usize)>,
    /// A flapping link: its ends, whether it is down now, and when it toggles next.
    flap: Option<(usize, usize, bool, u64)>,
    burst_left: u32,
    /// A window of delay spikes (packets late enough for false suspicion).
    spike: (u64, u64),
    next_spike: u64,
    /// A paused daemon handles nothing until then (and its peers suspect it meanwhile).
    paused_until: Vec<u64>,
    next_pause: u64,
}

impl Wire {
    fn reach(&self, i: usize, j: usize) -> bool {
        let flapped = self
            .flap
            .is_some_and(|(a, b, down, _)| down && ((a, b) == (i, j) || (a, b) == (j, i)));
        self.comp[i] == self.comp[j] && !self.cut.contains(&(i, j)) && !flapped
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.rng2.next_u32() as f64 / u32::MAX as f64) < p
    }

    fn send(&mut self, rng: &mut ChaCha20Rng, now: u64, faulty: bool, i: usize, t: Transmit) {
        let unit = |rng: &mut ChaCha20Rng| rng.next_u32() as f64 / u32::MAX as f64;
        let bytes = t.packet.encode();
        let targets: Vec<usize> = match t.to {
            Dest::One(d) => vec![d as usize - 1],
            Dest::AllOthers => (0..self.n).filter(|j| *j != i).collect(),
        };
        for j in targets {
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
                continue;
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
    }

    /// The extra faults of a new topology: a partition into up to as many components as
    /// daemons, a one-way cut, a non-transitive cut, a flapping link.
    fn extra_topology(&mut self, now: u64) {
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
    fn plain(&self, now: u64) -> bool {
        self.cut.is_empty() && self.flap.is_none() && self.paused_until.iter().all(|p| *p <= now)
    }

    fn heal(&mut self) {
        self.comp = vec![0; self.n];
        self.cut.clear();
        self.flap = None;
        self.spike = (0, 0);
        self.paused_until = vec![0; self.n];
    }
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
    let mut dcfg = DaemonConfig {
        record_ring: true,
        ..DaemonConfig::default()
    };
    dcfg.membership.ordering.idle_hold_us = cfg.idle_hold_us;
    dcfg.membership.ordering.max_visit_bytes = cfg.max_visit_bytes;
    let safety = cfg.safety_ms * 1000;
    let mut wire = Wire {
        n,
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
        next_pause: if faults.has("pause") {
            rng2.next_u64() % safety.max(1)
        } else {
            u64::MAX
        },
        rng2,
    };
    let mut timers: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut w = World {
        multi_group: cfg.multi_group,
        nodes: (1..=n as DaemonId)
            .map(|d| Daemon::new(dcfg.clone(), d, 0, 0))
            .collect(),
        clients: (0..n)
            .flat_map(|d| {
                (0..cfg.clients_per_daemon).map(move |j| SimClient {
                    daemon: d,
                    name: client_name(d, j),
                    inc: 0,
                    connected: false,
                    groups: BTreeMap::new(),
                    sent: 0,
                })
            })
            .collect(),
        history: Vec::new(),
        dinc: vec![0; n],
        delivered: 0,
        views: 0,
        now: 0,
    };
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
            while let Some(t) = w.nodes[i].poll_transmit() {
                wire.send(&mut rng, w.now, faulty, i, t);
            }
            w.record(i);
            if let Some(t) = w.nodes[i].poll_timeout() {
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
            let seen = (0..n).any(|i| alive[i] && w.nodes[i].membership().phase() == *p);
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
                &dcfg,
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
                let mut have = w.nodes[i].membership().ring_members();
                have.sort_unstable();
                w.nodes[i].ready() && have == want
            });
            if settled {
                settle.push(now - since);
                changed_at = None;
            }
        }
        // Convergence: one ring of everyone with its groups settled, after the faults stopped.
        if stable_at.is_some() && converged_at.is_none() {
            let r0 = w.nodes[0].membership().ring();
            let one_ring = w.nodes.iter().all(|d| {
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
                    restart(i, &mut w, &mut alive, &mut armed, &dcfg);
                    touched.push(i);
                }
            }
            stable_at = Some(now);
            let mut processes = dnames.clone();
            processes.extend(
                w.clients
                    .iter()
                    .filter(|c| c.connected)
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
                &dcfg,
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
                    restart(i, &mut w, &mut alive, &mut armed, &dcfg);
                    touched.push(i);
                }
                _ => {}
            }
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
                let _ = w.nodes[to].handle_packet(now, from as DaemonId + 1, &bytes);
                touched.push(to);
            }
        } else if next_timer == Some(t) {
            let Reverse((_, i)) = timers.pop().expect("peeked");
            if wire.paused_until[i] > now {
                timers.push(Reverse((wire.paused_until[i], i)));
                armed[i] = Some(wire.paused_until[i]);
            } else if armed[i] == Some(t) && alive[i] {
                armed[i] = None;
                w.nodes[i].handle_timeout(now);
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
            ..Stats::default()
        },
        history: w.history,
    }
}

/// Performs one scripted step.
fn scripted(
    action: &Action,
    w: &mut World,
    wire: &mut Wire,
    alive: &mut [bool],
    armed: &mut [Option<u64>],
    touched: &mut Vec<usize>,
    dcfg: &DaemonConfig,
) {
    let n = wire.n;
    let now = w.now;
    match action {
        Action::Partition(parts) => {
            wire.comp = (0..n)
                .map(|i| {
                    parts
                        .iter()
                        .position(|p| p.contains(&i))
                        .unwrap_or(parts.len() + i)
                })
                .collect();
        }
        Action::Heal => wire.comp = vec![0; n],
        Action::Crash(d) => crash(*d, w, alive),
        Action::CrashRepresentative(d) => {
            if let Some(rep) = w.nodes.get(*d).and_then(|x| x.membership().ring()) {
                crash(rep.rep as usize - 1, w, alive);
            }
        }
        Action::Restart(d) => {
            if *d < n && !alive[*d] {
                restart(*d, w, alive, armed, dcfg);
                touched.push(*d);
            }
        }
        Action::RestartCrashed => {
            for d in 0..n {
                if !alive[d] {
                    restart(d, w, alive, armed, dcfg);
                    touched.push(d);
                }
            }
        }
        Action::Join(c, group) | Action::Leave(c, group) => {
            let Some(cl) = w.clients.get(*c) else { return };
            let (d, name) = (cl.daemon, cl.name.clone());
            if !alive[d] || !cl.connected {
                return;
            }
            let join = matches!(action, Action::Join(..));
            let cmd = if join {
                ClientCommand::Join {
                    group: group.clone(),
                    vs: true,
                }
            } else {
                ClientCommand::Leave {
                    group: group.clone(),
                }
            };
            if w.nodes[d].handle_client(now, &name, cmd).is_ok() {
                if join {
                    w.clients[*c].groups.insert(group.clone(), true);
                } else {
                    w.clients[*c].groups.remove(group);
                }
            }
            touched.push(d);
        }
    }
}

/// A daemon crashes, and its clients with it.
fn crash(i: usize, w: &mut World, alive: &mut [bool]) {
    if i >= alive.len() || !alive[i] {
        return;
    }
    alive[i] = false;
    let di = w.dinc[i];
    w.push(&name(i as DaemonId + 1), di, Event::Crash);
    for ci in 0..w.clients.len() {
        if w.clients[ci].daemon == i {
            w.client_crash(ci);
        }
    }
}

/// A crashed daemon comes back with no state, as the next incarnation; its clients reconnect.
fn restart(
    i: usize,
    w: &mut World,
    alive: &mut [bool],
    armed: &mut [Option<u64>],
    dcfg: &DaemonConfig,
) {
    alive[i] = true;
    w.dinc[i] += 1;
    armed[i] = None;
    let inc = w.dinc[i];
    w.nodes[i] = Daemon::new(dcfg.clone(), i as DaemonId + 1, inc, w.now);
    w.push(
        &name(i as DaemonId + 1),
        inc,
        Event::Join {
            group: String::new(),
            vs: false,
        },
    );
    for ci in 0..w.clients.len() {
        if w.clients[ci].daemon == i {
            w.connect(ci);
        }
    }
}
