//! Experiment E1: the computation-only cost of each key agreement protocol per membership event,
//! against group size (slides 003; paper 000 Table II).
//!
//! For each protocol, event and size `n` the real protocol code runs over the in-memory
//! transport; we report the counted rounds, messages, exponentiations, signatures and
//! verifications along the critical path next to the Table I/II formulas, and the measured
//! serial computation time along that path. That time is a real member's, computing with its own
//! state: after the event, the critical path (the chain of steps with the most counted operations,
//! the one the counts describe) is timed again with each member on it replaying its inputs alone
//! on a copy of its state in memory of its own (`Testbed::replay_alone`): in place, a simulated
//! member's key tree lies scattered among the allocations of all the others, and walking it
//! cost a join at n = 1,024 more than its exponentiations. The *floor* is
//! what the counted operations alone cost (exponentiations x one measured exponentiation +
//! signatures x one signature + verifications x one verification + decodings of received group
//! elements x one decoding); `ratio` = measured / floor shows the overhead of everything else
//! (encoding, tree handling, hashing). The machine's speed drifts within seconds, so the unit
//! costs are measured again beside each of several replays, and the replay of median ratio is
//! kept.
//!
//! Each protocol's group of each size is formed once and copied for every event; a merge starts
//! from the halves its partition left. Forming a group of n costs O(n²) verifications that no
//! measured member makes, so while it forms the simulated members share their verifications (one
//! checks a broadcast's signature, the others take its word) and compute on every thread; beyond
//! n = 64 they do so during the event too, and then only the replay is timed
//! (`compute_shared_us`, the critical path as timed in place, and `compute_total_us`, every
//! member's computation added up, are left out).
//!
//! Events, with `n` the group size before the event: join (one member), leave (the member in the
//! middle of the agreed order), merge (the two halves of a partitioned group, `n/2` each, merging
//! back: the resulting group has `n` members, `m = n/2`), partition (into two halves: `p = n/2`).

use crate::plot::{Chart, Series};
use conclave_crypto::{Group, Identity, Modp1024, Ristretto255, SigScheme, Suite};
use conclave_gka::script::{parse, Action};
use conclave_gka::testbed::{Testbed, ViewRecord};
use conclave_gka::ProtocolId;
use rand_chacha::rand_core::SeedableRng;
use serde::Serialize;
use std::time::Instant;

pub const PROTOCOLS: [ProtocolId; 5] = ProtocolId::ALL;
pub const EVENTS: [&str; 4] = ["join", "leave", "merge", "partition"];

/// The cost of one operation of each kind, measured.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct UnitCosts {
    pub exp_us: f64,
    pub sign_us: f64,
    pub verify_us: f64,
    /// Decoding a received group element and checking it is in the group.
    pub decode_us: f64,
}

/// Measures one exponentiation, signature, verification and decoding: the median of `iters`
/// of each, taken in interleaved rounds after a warm-up, so that a burst of noise or a cold
/// vector unit does not land on one kind of operation alone.
pub fn unit_costs<G: Group>(scheme: SigScheme, iters: usize) -> UnitCosts {
    const ROUNDS: usize = 4;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite times"));
        v[v.len() / 2]
    };
    let time = |out: &mut Vec<f64>, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        out.push(t.elapsed().as_secs_f64() * 1e6);
    };
    let base = G::exp_g(&G::random_scalar(&mut rng));
    let s = G::random_scalar(&mut rng);
    let mut acc = base.clone();
    let encoded = G::encode(&acc);
    let id = Identity::generate(scheme, &mut rng).expect("identity");
    let pk = id.public();
    let msg = [7u8; 32];
    let sig = id.sign(&msg).expect("sign");
    let [mut exp, mut decode, mut sign, mut verify]: [Vec<f64>; 4] = Default::default();
    let per_round = iters.div_ceil(ROUNDS).max(1);
    for round in 0..=ROUNDS {
        // Round 0 warms up and is not kept.
        let keep = round > 0;
        let mut e = Vec::new();
        let mut d = Vec::new();
        let mut sg = Vec::new();
        let mut v = Vec::new();
        for _ in 0..per_round {
            time(&mut e, &mut || acc = G::exp(&acc, &s));
            time(&mut d, &mut || {
                std::hint::black_box(G::decode(&encoded, false).expect("a group element"));
            });
            time(&mut sg, &mut || {
                std::hint::black_box(id.sign(&msg).expect("sign"));
            });
            time(&mut v, &mut || pk.verify(&msg, &sig).expect("verify"));
        }
        if keep {
            exp.extend(e);
            decode.extend(d);
            sign.extend(sg);
            verify.extend(v);
        }
    }
    std::hint::black_box(&acc);
    UnitCosts {
        exp_us: median(exp),
        sign_us: median(sign),
        verify_us: median(verify),
        decode_us: median(decode),
    }
}

/// Table I/II of paper 000: (rounds, messages, exps, sigs, verifs), `None` where the table gives
/// no closed form. `h` is the key tree height after the event.
pub fn table(p: ProtocolId, event: &str, n: u64, h: u64) -> Option<[f64; 5]> {
    let (m, pp) = (n / 2, n / 2);
    let nf = n as f64;
    let hf = h as f64;
    Some(match (p, event) {
        (ProtocolId::Gdh, "join") => [4.0, nf + 3.0, nf + 3.0, 4.0, nf + 3.0],
        (ProtocolId::Gdh, "leave") => [1.0, 1.0, nf - 1.0, 1.0, 1.0],
        (ProtocolId::Gdh, "merge") => {
            // The base group has n - m members and m merge into it.
            let b = (n - m) as f64;
            let m = m as f64;
            [
                m + 3.0,
                b + 2.0 * m + 1.0,
                b + 2.0 * m + 1.0,
                m + 3.0,
                b + 2.0 * m + 1.0,
            ]
        }
        (ProtocolId::Gdh, "partition") => [1.0, 1.0, (n - pp) as f64, 1.0, 1.0],
        (ProtocolId::Ckd, "join") => [3.0, 3.0, nf + 2.0, 3.0, 3.0],
        (ProtocolId::Ckd, "leave") => [1.0, 1.0, nf - 2.0, 1.0, 1.0],
        (ProtocolId::Ckd, "merge") => {
            let b = (n - m) as f64;
            let m = m as f64;
            [3.0, m + 2.0, b + 2.0 * m, 3.0, m + 2.0]
        }
        (ProtocolId::Ckd, "partition") => [1.0, 1.0, (n - pp) as f64 - 1.0, 1.0, 1.0],
        (ProtocolId::Tgdh, "join") | (ProtocolId::Tgdh, "merge") => [2.0, 3.0, 1.5 * hf, 2.0, 3.0],
        (ProtocolId::Tgdh, "leave") => [1.0, 1.0, 1.5 * hf, 1.0, 1.0],
        (ProtocolId::Tgdh, "partition") => [hf, 2.0 * hf, 3.0 * hf, hf, hf],
        (ProtocolId::Str, "join") => [2.0, 3.0, 7.0, 2.0, 3.0],
        (ProtocolId::Str, "leave") | (ProtocolId::Str, "partition") => {
            [1.0, 1.0, 1.5 * nf + 2.0, 1.0, 1.0]
        }
        (ProtocolId::Str, "merge") => [2.0, 3.0, 3.0 * m as f64 + 4.0, 2.0, 3.0],
        (ProtocolId::Bd, "join") => [2.0, 2.0 * nf + 2.0, 3.0, 2.0, nf + 3.0],
        (ProtocolId::Bd, "leave") => [2.0, 2.0 * nf - 2.0, 3.0, 2.0, nf + 1.0],
        (ProtocolId::Bd, "merge") => {
            let b = (n - m) as f64;
            let m = m as f64;
            [2.0, 2.0 * b + 2.0 * m, 3.0, 2.0, b + m + 2.0]
        }
        (ProtocolId::Bd, "partition") => [
            2.0,
            2.0 * nf - 2.0 * pp as f64,
            3.0,
            2.0,
            nf - pp as f64 + 2.0,
        ],
        _ => return None,
    })
}

/// Identities made once and shared by every run of a suite: RSA key generation takes about 0.1 s
/// a key, far longer than the runs it would otherwise precede.
#[derive(Default)]
pub struct IdentityPool {
    ids: std::collections::BTreeMap<(bool, String), Identity>,
    rng: Option<rand_chacha::ChaCha20Rng>,
}

impl IdentityPool {
    fn get(&mut self, scheme: SigScheme, name: &str) -> Identity {
        let rng = self
            .rng
            .get_or_insert_with(|| rand_chacha::ChaCha20Rng::seed_from_u64(99));
        self.ids
            .entry((scheme == SigScheme::Ed25519, name.to_owned()))
            .or_insert_with(|| Identity::generate(scheme, rng).expect("identity"))
            .clone()
    }
}

/// One measurement, as one JSON line.
#[derive(Clone, Debug, Serialize)]
pub struct E1Row {
    pub experiment: &'static str,
    pub protocol: &'static str,
    pub suite: &'static str,
    pub event: &'static str,
    /// Group size before the event.
    pub n: u64,
    /// Members of the resulting view.
    pub members: u64,
    pub tree_height: Option<u64>,
    pub rounds: u32,
    pub messages: u64,
    pub unicasts: u64,
    pub broadcasts: u64,
    /// Bytes of all the event's messages, envelopes and signatures included (a broadcast once).
    pub bytes: u64,
    pub exps: u64,
    pub sigs: u64,
    pub verifs: u64,
    pub table_rounds: Option<f64>,
    pub table_messages: Option<f64>,
    pub table_exps: Option<f64>,
    pub table_sigs: Option<f64>,
    pub table_verifs: Option<f64>,
    pub decodes: u64,
    /// Serial computation along the critical path, each member on it replayed alone.
    pub compute_us: f64,
    /// The same, measured with all members' states in one process, as the run went (none when
    /// the simulated members shared their verifications, beyond n = 64).
    pub compute_shared_us: Option<f64>,
    /// Every member's computation added up, in place (none beyond n = 64, as above).
    pub compute_total_us: Option<f64>,
    pub floor_us: f64,
    pub ratio: f64,
    pub units: UnitCosts,
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i:04}")).collect()
}

/// The event, for a group of `n` (before the event). A merge starts from the two halves a
/// partition of the group left (a partition healing: each half keyed on its own).
fn script_for(event: &str, n: usize) -> String {
    let names = names(n);
    let second_half = || names[n - n / 2..].join(" ");
    match event {
        "join" => "join x".into(),
        "leave" => format!("leave {}", names[n / 2]),
        "merge" => format!("merge {}", second_half()),
        "partition" => format!("partition {}", second_half()),
        other => panic!("unknown event {other}"),
    }
}

/// Beyond this size the simulated members share their signature verifications during an event
/// too (see [`Testbed::share_verifications`]), and compute on every thread: at n = 1,024, BD's
/// n² verifications would take minutes per event. Only in-place times suffer (they are not
/// reported then); the critical path replayed alone verifies everything itself.
const SHARE_VERIFICATIONS_ABOVE: usize = 64;

/// A group of `n` members, keyed and quiet, ready to be copied for each event. Its members share
/// their signature verifications and compute on every thread while it forms: set-up is no part
/// of what is measured, and at n = 1,024 it would otherwise cost a million verifications.
fn form_group<G: Group>(
    p: ProtocolId,
    scheme: SigScheme,
    n: usize,
    seed: u64,
    pool: &mut IdentityPool,
) -> Testbed<G> {
    let mut tb = Testbed::<G>::new(p, scheme, seed);
    // Identities first: RSA key generation is slow and is no part of any event.
    let mut all = names(n);
    all.push("x".into());
    for name in &all {
        tb.adopt_identity(name, pool.get(scheme, name));
    }
    tb.share_verifications(true);
    tb.parallel = true;
    tb.apply(&Action::Init(names(n))).expect("the group forms");
    tb.run_until_quiet();
    assert!(tb.errors.is_empty(), "{p:?} n={n}: {:?}", tb.errors);
    tb
}

/// `base` split in halves, each keyed: where a merge starts.
fn halves<G: Group>(base: &Testbed<G>, p: ProtocolId, n: usize) -> Testbed<G> {
    let mut tb = base.clone();
    tb.share_verifications(true);
    tb.parallel = true;
    run_event(&mut tb, p, "partition", n);
    tb
}

/// Applies `event` to `tb` and delivers every message it causes.
fn run_event<G: Group>(tb: &mut Testbed<G>, p: ProtocolId, event: &str, n: usize) {
    let action: Action = parse(&script_for(event, n))
        .expect("event parses")
        .remove(0)
        .action;
    tb.apply(&action).expect("event applies");
    tb.run_until_quiet();
    assert!(tb.errors.is_empty(), "{p:?} {event} n={n}: {:?}", tb.errors);
}

/// One measured event.
struct Measured {
    rec: ViewRecord,
    height: Option<usize>,
    /// The critical path's time as measured in place, and every member's time added up (both
    /// `None` when the members shared their verifications).
    shared_us: Option<f64>,
    total_us: Option<f64>,
    /// The unit costs, measured just before the replay whose time is kept (the machine's speed
    /// drifts).
    units: UnitCosts,
}

/// Runs one event on `tb`; returns the record of the event's view that keeps the first member
/// (the group's side of a partition), with the times of its members replayed alone, the tree
/// height, and the critical path's time as measured in place; and the group after the event.
fn measure_one<G: Group>(
    mut tb: Testbed<G>,
    p: ProtocolId,
    scheme: SigScheme,
    event: &str,
    n: usize,
) -> (Measured, Testbed<G>) {
    let share = n > SHARE_VERIFICATIONS_ABOVE;
    tb.share_verifications(share);
    // In-place times are not reported beyond this size: members may use every thread.
    tb.parallel = share;
    let before = tb.records.len();
    tb.record();
    run_event(&mut tb, p, event, n);
    let mut rec = tb.records[before..]
        .iter()
        .rev()
        .find(|r| r.members.iter().any(|m| m == "m0000"))
        .unwrap_or_else(|| panic!("{p:?} {event} n={n}: the event's view did not complete"))
        .clone();
    // A real member computes with its own state: the critical path is timed again with each
    // member on it replayed alone (see `Testbed::replay_alone`), verifying every signature. The
    // machine's speed drifts within seconds, so the unit costs are measured again beside each of
    // several replays, and the row keeps the replay whose ratio to its floor is the median.
    let replays = if share { REPLAYS_LARGE } else { REPLAYS };
    let mut trials: Vec<(f64, UnitCosts, f64)> = (0..replays)
        .map(|_| {
            let units = unit_costs::<G>(scheme, unit_iterations(scheme));
            let alone = tb
                .replay_alone(rec.view)
                .expect("the event was recorded and produced a key");
            let floor = floor_us(&rec, &units);
            let ratio = if floor > 0.0 { alone / floor } else { 0.0 };
            (alone, units, ratio)
        })
        .collect();
    trials.sort_by(|a, b| a.2.partial_cmp(&b.2).expect("finite ratios"));
    let (alone, units, _) = trials.swap_remove(replays / 2);
    let shared = rec.compute_us;
    rec.compute_us = alone;
    let m = Measured {
        height: tb.tree_height("m0000"),
        shared_us: (!share).then_some(shared),
        total_us: (!share).then_some(rec.compute_total_us),
        rec,
        units,
    };
    (m, tb)
}

/// Replays of each event's critical path, each beside its own measurement of the unit costs.
const REPLAYS: usize = 5;
/// Beyond n = 64, where a replay is long enough to average out noise by itself.
const REPLAYS_LARGE: usize = 3;

/// What the counted operations on the critical path cost at `units`.
fn floor_us(r: &ViewRecord, units: &UnitCosts) -> f64 {
    r.exps_critical as f64 * units.exp_us
        + r.sigs_critical as f64 * units.sign_us
        + r.verifs_critical as f64 * units.verify_us
        + r.decodes_critical as f64 * units.decode_us
}

/// Enough of each operation for a stable median: ~25 ms with Ed25519, ~0.2 s with RSA.
fn unit_iterations(scheme: SigScheme) -> usize {
    match scheme {
        SigScheme::Ed25519 => 200,
        _ => 20,
    }
}

fn protocol_name(p: ProtocolId) -> &'static str {
    conclave_gka::kat::protocol_name(p)
}

/// Runs E1 for one suite; calls `row` for each measurement.
/// Each configuration runs `repeat` times (on different seeds) up to n = 64 and once beyond; the
/// row reports the run of median ratio to its floor. Each protocol's group of each size is formed once per seed and
/// copied for every event.
pub fn run_suite(
    suite: Suite,
    sizes: &[usize],
    protocols: &[ProtocolId],
    events: &[&'static str],
    repeat: usize,
    mut row: impl FnMut(E1Row),
) {
    match suite {
        Suite::Modern => {
            run_group::<Ristretto255>(suite, sizes, protocols, events, repeat, &mut row)
        }
        Suite::Paper => run_group::<Modp1024>(suite, sizes, protocols, events, repeat, &mut row),
    }
}

fn run_group<G: Group>(
    suite: Suite,
    sizes: &[usize],
    protocols: &[ProtocolId],
    events: &[&'static str],
    repeat: usize,
    row: &mut impl FnMut(E1Row),
) {
    let scheme = suite.sig_scheme();
    let mut pool = IdentityPool::default();
    for &p in protocols {
        for &n in sizes {
            // A leave or partition of a two-member group leaves one member: nothing to agree on.
            let events: Vec<&'static str> = events
                .iter()
                .copied()
                .filter(|e| n >= 3 || (*e != "leave" && *e != "partition"))
                .collect();
            if n < 2 || events.is_empty() {
                continue;
            }
            let runs = if n <= 64 { repeat.max(1) } else { 1 };
            let mut measured: Vec<Vec<Measured>> = events.iter().map(|_| Vec::new()).collect();
            // A merge goes last, to start from what the partition left.
            let mut order: Vec<usize> = (0..events.len()).collect();
            order.sort_by_key(|&k| events[k] == "merge");
            for i in 0..runs {
                let seed = 1000 + n as u64 + 7919 * i as u64;
                let base = form_group::<G>(p, scheme, n, seed, &mut pool);
                let mut split = None;
                for &k in &order {
                    let event = events[k];
                    let start = match event {
                        "merge" => split.take().unwrap_or_else(|| halves(&base, p, n)),
                        _ => base.clone(),
                    };
                    let (m, after) = measure_one(start, p, scheme, event, n);
                    if event == "partition" {
                        split = Some(after);
                    }
                    measured[k].push(m);
                }
            }
            for (event, mut runs) in events.into_iter().zip(measured) {
                let ratio = |m: &Measured| {
                    let floor = floor_us(&m.rec, &m.units);
                    if floor > 0.0 {
                        m.rec.compute_us / floor
                    } else {
                        0.0
                    }
                };
                runs.sort_by(|a, b| ratio(a).partial_cmp(&ratio(b)).expect("finite ratios"));
                let m = runs.swap_remove(runs.len() / 2);
                row(e1_row(suite, p, event, n, m));
            }
        }
    }
}

fn e1_row(suite: Suite, p: ProtocolId, event: &'static str, n: usize, m: Measured) -> E1Row {
    let units = m.units;
    let r = m.rec;
    let floor_us = floor_us(&r, &units);
    let t = table(p, event, n as u64, m.height.unwrap_or(0) as u64);
    E1Row {
        experiment: "E1",
        protocol: protocol_name(p),
        suite: suite.name(),
        event,
        n: n as u64,
        members: r.members.len() as u64,
        tree_height: m.height.map(|h| h as u64),
        rounds: r.rounds,
        messages: r.messages,
        unicasts: r.unicasts,
        broadcasts: r.broadcasts,
        bytes: r.bytes,
        exps: r.exps_critical,
        sigs: r.sigs_critical,
        verifs: r.verifs_critical,
        decodes: r.decodes_critical,
        table_rounds: t.map(|t| t[0]),
        table_messages: t.map(|t| t[1]),
        table_exps: t.map(|t| t[2]),
        table_sigs: t.map(|t| t[3]),
        table_verifs: t.map(|t| t[4]),
        compute_us: r.compute_us,
        compute_shared_us: m.shared_us,
        compute_total_us: m.total_us,
        floor_us,
        ratio: if floor_us > 0.0 {
            r.compute_us / floor_us
        } else {
            0.0
        },
        units,
    }
}

/// One chart per event and suite: serial computation time against group size, a line per protocol
/// (the slides' "computation only" graphs).
pub fn charts(rows: &[E1Row]) -> Vec<(String, Chart)> {
    let mut out = Vec::new();
    let mut keys: Vec<(&str, &str)> = rows.iter().map(|r| (r.suite, r.event)).collect();
    keys.sort();
    keys.dedup();
    for (suite, event) in keys {
        let series = PROTOCOLS
            .iter()
            .map(|&p| Series {
                name: protocol_name(p).to_uppercase(),
                points: rows
                    .iter()
                    .filter(|r| {
                        r.suite == suite && r.event == event && r.protocol == protocol_name(p)
                    })
                    .map(|r| (r.n as f64, r.compute_us / 1000.0))
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        out.push((
            format!("e1-{suite}-{event}.svg"),
            Chart {
                title: format!("E1 {event}: serial computation, {suite} suite"),
                x_label: "group size n (before the event)".into(),
                y_label: "time along the critical path (ms)".into(),
                log_y: true,
                series,
            },
        ));
    }
    out
}
