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

mod ordering;
pub use ordering::run;

use conclave_history::Record;
use conclave_wire::gcs::{DaemonId, ServiceType};

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
    /// Token, data and wake packets sent (each copy to each daemon counts).
    pub token_packets: u64,
    pub data_packets: u64,
    pub wake_packets: u64,
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
    /// Full runs with Spread clients: messages they read, and clients whose daemon sent them
    /// bytes they could not read as Spread's protocol (a failure of the run).
    pub spread_messages: u64,
    pub spread_unreadable: u64,
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
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
