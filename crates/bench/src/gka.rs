//! Experiment E1: the computation-only cost of each key agreement protocol per membership event,
//! against group size (slides 003; paper 000 Table II).
//!
//! For each protocol, event and size `n` the real protocol code runs over the in-memory
//! transport; we report the counted rounds, messages, exponentiations, signatures and
//! verifications along the critical path next to the Table I/II formulas, and the measured
//! serial computation time along that path. That time is a real member's, computing with its own
//! state: after the event, the critical path found in place is timed again with each member on it
//! replaying its inputs alone on a copy of its state (`Testbed::replay_alone`);
//! `compute_shared_us` keeps the time measured in place, where the simulated members' states
//! compete for the processor's caches between a member's steps. The *floor* is what the counted operations alone cost
//! (exponentiations x one measured exponentiation + signatures x one signature + verifications x
//! one verification + decodings of received group elements x one decoding, measured in the same
//! run); `ratio` = measured / floor shows the overhead of everything else (encoding, tree
//! handling, hashing). `compute_total_us` adds up every member's computation: what members that
//! share a processor spend between them.
//!
//! Events, with `n` the group size before the event: join (one member), leave (the member in the
//! middle of the agreed order), merge (a group of `n/2` merging with one of `n/2`: the resulting
//! group has `n` members, `m = n/2`), partition (into two halves: `p = n/2`).

use crate::plot::{Chart, Series};
use conclave_crypto::{Group, Identity, Modp1024, Ristretto255, SigScheme, Suite};
use conclave_gka::script::{parse, Action};
use conclave_gka::testbed::{Testbed, ViewRecord};
use conclave_gka::ProtocolId;
use rand_chacha::rand_core::SeedableRng;
use serde::Serialize;
use std::time::Instant;

pub const PROTOCOLS: [ProtocolId; 5] = [
    ProtocolId::Gdh,
    ProtocolId::Ckd,
    ProtocolId::Tgdh,
    ProtocolId::Str,
    ProtocolId::Bd,
];
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

/// Measures one exponentiation, signature, verification and decoding (median of `iters`).
pub fn unit_costs<G: Group>(scheme: SigScheme, iters: usize) -> UnitCosts {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let base = G::exp_g(&G::random_scalar(&mut rng));
    let s = G::random_scalar(&mut rng);
    let mut acc = base.clone();
    let exp = (0..iters)
        .map(|_| {
            let t = Instant::now();
            acc = G::exp(&acc, &s);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    std::hint::black_box(&acc);
    let encoded = G::encode(&acc);
    let decode = (0..iters)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(G::decode(&encoded, false).expect("a group element"));
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let id = Identity::generate(scheme, &mut rng).expect("identity");
    let pk = id.public();
    let msg = [7u8; 32];
    let sig = id.sign(&msg).expect("sign");
    let sign = (0..iters)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(id.sign(&msg).expect("sign"));
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let verify = (0..iters)
        .map(|_| {
            let t = Instant::now();
            pk.verify(&msg, &sig).expect("verify");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
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
    /// The same, measured with all members' states in one process, as the run went.
    pub compute_shared_us: f64,
    pub compute_total_us: f64,
    pub floor_us: f64,
    pub ratio: f64,
    pub units: UnitCosts,
}

fn script_for(event: &str, n: usize) -> (String, Vec<String>) {
    let names: Vec<String> = (0..n).map(|i| format!("m{i:04}")).collect();
    match event {
        "join" => (format!("init {}\n", names.join(" ")), vec!["join x".into()]),
        "leave" => (
            format!("init {}\n", names.join(" ")),
            vec![format!("leave {}", names[n / 2])],
        ),
        "merge" => {
            let (a, b) = names.split_at(n - n / 2);
            (
                format!("init {}\n", a.join(" ")),
                vec![format!("merge {}", b.join(" "))],
            )
        }
        "partition" => {
            let away: Vec<String> = names.iter().skip(n - n / 2).cloned().collect();
            (
                format!("init {}\n", names.join(" ")),
                vec![format!("partition {}", away.join(" "))],
            )
        }
        other => panic!("unknown event {other}"),
    }
}

/// Runs one protocol, event and size; returns the record of the event's view that keeps the
/// first member (the group's side of a partition), with the times of its members replayed alone,
/// the tree height, and the critical path's time as measured in place.
fn measure_one<G: Group>(
    p: ProtocolId,
    scheme: SigScheme,
    event: &str,
    n: usize,
    seed: u64,
    pool: &mut IdentityPool,
) -> (ViewRecord, Option<usize>, f64) {
    let (setup, events) = script_for(event, n);
    let mut tb = Testbed::<G>::new(p, scheme, seed);
    // Identities first: RSA key generation is slow and is no part of any event.
    let mut all: Vec<String> = (0..n).map(|i| format!("m{i:04}")).collect();
    all.push("x".into());
    for name in &all {
        tb.adopt_identity(name, pool.get(scheme, name));
    }
    tb.run_script(&parse(&setup).expect("setup parses"))
        .expect("setup runs");
    let before = tb.records.len();
    tb.record();
    for e in &events {
        let action: Action = parse(e).expect("event parses").remove(0).action;
        tb.apply(&action).expect("event applies");
        tb.run_until_quiet();
    }
    assert!(tb.errors.is_empty(), "{p:?} {event} n={n}: {:?}", tb.errors);
    let mut rec = tb.records[before..]
        .iter()
        .rev()
        .find(|r| r.members.iter().any(|m| m == "m0000"))
        .unwrap_or_else(|| panic!("{p:?} {event} n={n}: the event's view did not complete"))
        .clone();
    // A real member computes with its own state: the critical path is timed again with each
    // member on it replayed alone (see `Testbed::replay_alone`).
    let alone = tb
        .replay_alone(rec.view)
        .expect("the event was recorded and produced a key");
    let shared = rec.compute_us;
    rec.compute_us = alone;
    (rec, tb.tree_height("m0000"), shared)
}

fn protocol_name(p: ProtocolId) -> &'static str {
    conclave_gka::kat::protocol_name(p)
}

/// Runs E1 for one suite; calls `row` for each measurement.
/// Each configuration runs `repeat` times (on different seeds) up to n = 64 and once beyond; the
/// row reports the median time.
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
    let units = unit_costs::<G>(scheme, if suite == Suite::Modern { 400 } else { 40 });
    for &p in protocols {
        for &event in events {
            for &n in sizes {
                // A leave or partition of a two-member group leaves one member: nothing to agree on.
                if n < 2 || (n < 3 && (event == "leave" || event == "partition")) {
                    continue;
                }
                let runs = if n <= 64 { repeat.max(1) } else { 1 };
                let mut measured: Vec<(ViewRecord, Option<usize>, f64)> = (0..runs)
                    .map(|i| {
                        measure_one::<G>(
                            p,
                            scheme,
                            event,
                            n,
                            1000 + n as u64 + 7919 * i as u64,
                            &mut pool,
                        )
                    })
                    .collect();
                measured.sort_by(|a, b| {
                    a.0.compute_us
                        .partial_cmp(&b.0.compute_us)
                        .expect("finite times")
                });
                let (r, h, shared) = measured.swap_remove(runs / 2);
                let floor_us = r.exps_critical as f64 * units.exp_us
                    + r.sigs_critical as f64 * units.sign_us
                    + r.verifs_critical as f64 * units.verify_us
                    + r.decodes_critical as f64 * units.decode_us;
                let t = table(p, event, n as u64, h.unwrap_or(0) as u64);
                row(E1Row {
                    experiment: "E1",
                    protocol: protocol_name(p),
                    suite: suite.name(),
                    event,
                    n: n as u64,
                    members: r.members.len() as u64,
                    tree_height: h.map(|h| h as u64),
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
                    compute_shared_us: shared,
                    compute_total_us: r.compute_total_us,
                    floor_us,
                    ratio: if floor_us > 0.0 {
                        r.compute_us / floor_us
                    } else {
                        0.0
                    },
                    units,
                });
            }
        }
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
