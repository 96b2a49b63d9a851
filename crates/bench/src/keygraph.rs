//! E5: the key-graph server (paper 001 §5): server time per join and leave, rekey messages sent
//! (Table 5) and received (Table 6), key changes per member (Fig 12), server memory; plus the two
//! things beyond the paper, batch rekeying and compaction.
//!
//! As in §5, a run builds a group of n members, then plays one seeded sequence of joins and
//! leaves (1:1), the same sequence for every configuration of one size. Time is the wall time of
//! the server's `join` or `leave` call and the draining of its messages: key generation, tree
//! update, encryption, encoding, digests and the signature, but not the admission exchange that
//! makes the individual key (the paper left that out too).

use crate::plot::{Chart, Series};
use conclave_crypto::{GroupKey, Identity, SigScheme};
use conclave_keygraph::{GraphKind, Server, ServerConfig, Signing, Strategy, UserId};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use std::time::Instant;

pub const STRATEGIES: [Strategy; 3] = [Strategy::User, Strategy::Key, Strategy::Group];
pub const SIGNINGS: [Signing; 3] = [Signing::None, Signing::PerMessage, Signing::Batch];

/// Average, least and greatest of a sample.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Stat {
    pub avg: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    fn of(v: &[f64]) -> Stat {
        if v.is_empty() {
            return Stat::default();
        }
        Stat {
            avg: v.iter().sum::<f64>() / v.len() as f64,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// Paper 001's figures for one configuration at n = 8,192 (DES, MD5, RSA-512 on a 1998 SGI).
#[derive(Clone, Debug, Serialize)]
pub struct PaperFigures {
    /// Table 4: server ms per join and leave, with one signature per message and per batch.
    pub join_ms_per_message_sig: Option<f64>,
    pub leave_ms_per_message_sig: Option<f64>,
    pub join_ms_batch_sig: Option<f64>,
    pub leave_ms_batch_sig: Option<f64>,
    /// Table 5: average size (bytes) and number of messages sent per join and leave.
    pub join_bytes: f64,
    pub leave_bytes: f64,
    pub join_messages: f64,
    pub leave_messages: f64,
    /// Table 6: average size of the message a member receives.
    pub recv_join_bytes: f64,
    pub recv_leave_bytes: f64,
}

/// Paper 001 Tables 4-6 (n = 8,192).
pub fn paper(degree: u32, strategy: Strategy) -> Option<PaperFigures> {
    // (join bytes, leave bytes, join msgs, leave msgs) from Table 5; Table 6 received sizes.
    let (t5, t6) = match (degree, strategy) {
        (4, Strategy::User) => ((312.8, 306.9, 7.0, 19.02), (209.3, 237.4)),
        (4, Strategy::Key) => ((352.8, 344.0, 7.0, 19.02), (227.9, 256.0)),
        (4, Strategy::Group) => ((525.5, 1005.7, 1.0, 1.0), (525.5, 1005.7)),
        (8, Strategy::User) => ((287.3, 285.9, 5.0, 29.01), (200.0, 242.0)),
        (8, Strategy::Key) => ((319.3, 314.3, 5.0, 29.01), (217.2, 259.2)),
        (8, Strategy::Group) => ((464.5, 1293.1, 1.0, 1.0), (464.5, 1293.1)),
        (16, Strategy::User) => ((274.0, 282.4, 4.0, 46.01), (197.8, 246.7)),
        (16, Strategy::Key) => ((302.0, 306.6, 4.0, 46.01), (214.3, 263.2)),
        (16, Strategy::Group) => ((427.8, 1869.1, 1.0, 1.0), (427.8, 1869.1)),
        _ => return None,
    };
    let t4 = match (degree, strategy) {
        (4, Strategy::User) => Some((76.7, 204.6, 13.6, 17.1)),
        (4, Strategy::Key) => Some((76.3, 203.8, 13.1, 15.9)),
        (4, Strategy::Group) => Some((11.9, 12.0, 11.9, 12.0)),
        _ => None,
    };
    Some(PaperFigures {
        join_ms_per_message_sig: t4.map(|t| t.0),
        leave_ms_per_message_sig: t4.map(|t| t.1),
        join_ms_batch_sig: t4.map(|t| t.2),
        leave_ms_batch_sig: t4.map(|t| t.3),
        join_bytes: t5.0,
        leave_bytes: t5.1,
        join_messages: t5.2,
        leave_messages: t5.3,
        recv_join_bytes: t6.0,
        recv_leave_bytes: t6.1,
    })
}

/// One configuration's measurements.
#[derive(Clone, Debug, Serialize)]
pub struct RekeyRow {
    pub experiment: &'static str,
    pub kind: &'static str,
    pub n: u64,
    pub graph: &'static str,
    pub degree: u32,
    pub strategy: Strategy,
    pub signing: Signing,
    pub ops: u64,
    pub height: u8,
    /// Mean server microseconds per join, per leave, and their average (Fig 10's "per request").
    pub join_us: f64,
    pub leave_us: f64,
    pub avg_us: f64,
    pub join_us_p99: f64,
    pub leave_us_p99: f64,
    /// Messages sent per join and leave (Table 5, right).
    pub join_messages: Stat,
    pub leave_messages: Stat,
    /// Size of the messages sent (Table 5, left).
    pub join_bytes: Stat,
    pub leave_bytes: Stat,
    /// Average size of the message a member receives (Table 6).
    pub recv_join_bytes: f64,
    pub recv_leave_bytes: f64,
    /// Keys encrypted per join and leave (Table 2).
    pub join_keys_encrypted: f64,
    pub leave_keys_encrypted: f64,
    /// Keys a member learns per request, averaged over members (Fig 12).
    pub key_changes_per_member: f64,
    pub signatures_per_op: f64,
    /// Heap bytes of the server after building the group, per member (measured by the
    /// allocator when the binary counts, else the server's own estimate).
    pub server_bytes_per_member: f64,
    pub paper: Option<PaperFigures>,
}

fn graph_name(g: GraphKind) -> &'static str {
    match g {
        GraphKind::Star => "star",
        GraphKind::Tree { .. } => "tree",
        GraphKind::Complete => "complete",
    }
}

fn random_key(rng: &mut ChaCha20Rng) -> [u8; 32] {
    let mut k = [0u8; 32];
    rng.fill_bytes(&mut k);
    k
}

/// A server of `n` members and the live member list.
fn build(
    cfg: ServerConfig,
    n: u64,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<(Server, Vec<u64>, f64)> {
    let id = Identity::generate(SigScheme::Ed25519, rng)?;
    let members: Vec<(UserId, [u8; 32])> = (0..n).map(|u| (UserId(u), random_key(rng))).collect();
    let input = members.capacity() * std::mem::size_of::<(UserId, [u8; 32])>();
    // The members' list is freed inside the window: add it back.
    let (server, measured) =
        crate::alloc::measure(|| Server::with_members(cfg, Some(id), members, rng));
    let server = server?;
    let measured = measured.wrapping_add(input) as isize;
    let bytes = if measured > 0 {
        measured as usize
    } else {
        server.heap_bytes()
    };
    Ok((server, (0..n).collect(), bytes as f64 / n.max(1) as f64))
}

fn p99(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)]
}

/// One E5 configuration: n members, then `ops` joins and leaves (1:1, from `seed`).
pub fn run_rekey(
    n: u64,
    graph: GraphKind,
    strategy: Strategy,
    signing: Signing,
    ops: u64,
    seed: u64,
) -> anyhow::Result<RekeyRow> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut cfg = ServerConfig::new("e5", graph);
    cfg.strategy = strategy;
    cfg.signing = signing;
    let (mut server, mut live, bytes_per_member) = build(cfg, n, &mut rng)?;
    // The request sequence depends on the seed alone, not on the configuration.
    let mut seq = ChaCha20Rng::seed_from_u64(seed ^ 0x5e9);
    let mut next = n;
    let (mut jt, mut lt) = (Vec::new(), Vec::new());
    let (mut jm, mut lm, mut jb, mut lb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut jk, mut lk) = (0u64, 0u64);
    let (mut jrecv, mut jdel, mut lrecv, mut ldel) = (0u64, 0u64, 0u64, 0u64);
    let (mut changes, mut sigs) = (0f64, 0u64);
    let mut sink = Vec::new();
    for _ in 0..ops {
        let join = live.is_empty() || seq.next_u32() % 2 == 0;
        if join {
            let k = GroupKey::from_bytes(random_key(&mut seq));
            let t0 = Instant::now();
            server.join(UserId(next), &k, &mut rng)?;
            while let Some(t) = server.poll_transmit() {
                sink.push(t);
            }
            jt.push(t0.elapsed().as_secs_f64() * 1e6);
            live.push(next);
            next += 1;
        } else {
            let i = (seq.next_u64() % live.len() as u64) as usize;
            let u = live.swap_remove(i);
            let t0 = Instant::now();
            server.leave(UserId(u), &mut rng)?;
            while let Some(t) = server.poll_transmit() {
                sink.push(t);
            }
            lt.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        while server.poll_event().is_some() {}
        let st = server.last_rekey().expect("a rekey ran");
        let sizes = sink.iter().map(|t| t.bytes.len() as f64);
        if join {
            jm.push(st.messages as f64);
            jb.extend(sizes);
            jk += st.keys_encrypted;
            jrecv += st.bytes_received;
            jdel += st.deliveries;
        } else {
            lm.push(st.messages as f64);
            lb.extend(sizes);
            lk += st.keys_encrypted;
            lrecv += st.bytes_received;
            ldel += st.deliveries;
        }
        changes += st.key_changes as f64 / st.members.max(1) as f64;
        sigs += st.signatures;
        sink.clear();
    }
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let (join_us, leave_us) = (mean(&jt), mean(&lt));
    let degree = match graph {
        GraphKind::Tree { degree } => degree,
        _ => 0,
    };
    Ok(RekeyRow {
        experiment: "E5",
        kind: "rekey",
        n,
        graph: graph_name(graph),
        degree,
        strategy,
        signing,
        ops,
        height: server.height(),
        join_us,
        leave_us,
        avg_us: (join_us + leave_us) / 2.0,
        join_us_p99: p99(&mut jt),
        leave_us_p99: p99(&mut lt),
        join_messages: Stat::of(&jm),
        leave_messages: Stat::of(&lm),
        join_bytes: Stat::of(&jb),
        leave_bytes: Stat::of(&lb),
        recv_join_bytes: jrecv as f64 / jdel.max(1) as f64,
        recv_leave_bytes: lrecv as f64 / ldel.max(1) as f64,
        join_keys_encrypted: jk as f64 / jm.len().max(1) as f64,
        leave_keys_encrypted: lk as f64 / lm.len().max(1) as f64,
        key_changes_per_member: changes / ops.max(1) as f64,
        signatures_per_op: sigs as f64 / ops.max(1) as f64,
        server_bytes_per_member: bytes_per_member,
        paper: if n == 8192 && signing != Signing::None {
            paper(degree, strategy)
        } else {
            None
        },
    })
}

/// Batch rekeying: the same requests folded `batch` at a time into one rekey.
#[derive(Clone, Debug, Serialize)]
pub struct BatchRow {
    pub experiment: &'static str,
    pub kind: &'static str,
    pub n: u64,
    pub degree: u32,
    pub batch: u64,
    pub ops: u64,
    /// Server microseconds, bytes sent, keys encrypted and signatures, per request.
    pub us_per_request: f64,
    pub bytes_per_request: f64,
    pub keys_encrypted_per_request: f64,
    pub signatures_per_request: f64,
}

pub fn run_batch(n: u64, degree: u32, batch: u64, ops: u64, seed: u64) -> anyhow::Result<BatchRow> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut cfg = ServerConfig::new("e5", GraphKind::Tree { degree });
    cfg.strategy = Strategy::Group;
    let (mut server, mut live, _) = build(cfg, n, &mut rng)?;
    let mut seq = ChaCha20Rng::seed_from_u64(seed ^ 0x5e9);
    let mut next = n;
    let (mut us, mut bytes, mut keys, mut sigs) = (0f64, 0u64, 0u64, 0u64);
    let mut queued = 0;
    let flush = |server: &mut Server,
                 rng: &mut ChaCha20Rng,
                 acc: (&mut f64, &mut u64, &mut u64, &mut u64)|
     -> anyhow::Result<()> {
        let t0 = Instant::now();
        let ran = server.rekey_batch(rng)?;
        let mut b = 0;
        while let Some(t) = server.poll_transmit() {
            b += t.bytes.len() as u64;
        }
        *acc.0 += t0.elapsed().as_secs_f64() * 1e6;
        while server.poll_event().is_some() {}
        if ran {
            let st = server.last_rekey().expect("a rekey ran");
            *acc.1 += b;
            *acc.2 += st.keys_encrypted;
            *acc.3 += st.signatures;
        }
        Ok(())
    };
    for _ in 0..ops {
        let t0 = Instant::now();
        if live.is_empty() || seq.next_u32() % 2 == 0 {
            let k = GroupKey::from_bytes(random_key(&mut seq));
            server.queue_join(UserId(next), &k)?;
            live.push(next);
            next += 1;
        } else {
            let i = (seq.next_u64() % live.len() as u64) as usize;
            server.queue_leave(UserId(live.swap_remove(i)))?;
        }
        us += t0.elapsed().as_secs_f64() * 1e6;
        queued += 1;
        if queued == batch {
            flush(
                &mut server,
                &mut rng,
                (&mut us, &mut bytes, &mut keys, &mut sigs),
            )?;
            queued = 0;
        }
    }
    flush(
        &mut server,
        &mut rng,
        (&mut us, &mut bytes, &mut keys, &mut sigs),
    )?;
    let per = |x: f64| x / ops.max(1) as f64;
    Ok(BatchRow {
        experiment: "E5",
        kind: "batch",
        n,
        degree,
        batch,
        ops,
        us_per_request: per(us),
        bytes_per_request: per(bytes as f64),
        keys_encrypted_per_request: per(keys as f64),
        signatures_per_request: per(sigs as f64),
    })
}

/// Compaction: a group that shrinks from n to n/16 (three leaves for each join), with and
/// without moving members down.
#[derive(Clone, Debug, Serialize)]
pub struct BalanceRow {
    pub experiment: &'static str,
    pub kind: &'static str,
    pub n_start: u64,
    pub n_end: u64,
    pub degree: u32,
    pub compact: bool,
    pub height_start: u8,
    pub height_end: u8,
    /// Height the final group needs at least.
    pub height_min: u8,
    pub moves: u64,
    pub ops: u64,
    pub us_per_request: f64,
    pub keys_encrypted_per_request: f64,
    /// Over the last 1,000 requests (or fewer): what a request costs once the group has shrunk.
    pub keys_encrypted_per_request_at_end: f64,
    pub bytes_per_request: f64,
}

pub fn run_balance(n: u64, degree: u32, compact: bool, seed: u64) -> anyhow::Result<BalanceRow> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut cfg = ServerConfig::new("e5", GraphKind::Tree { degree });
    cfg.strategy = Strategy::Key;
    cfg.compact = compact;
    let (mut server, mut live, _) = build(cfg, n, &mut rng)?;
    let height_start = server.height();
    let mut seq = ChaCha20Rng::seed_from_u64(seed ^ 0xba1);
    let mut next = n;
    let target = (n / 16).max(1);
    let (mut us, mut bytes, mut moves, mut ops) = (0f64, 0u64, 0u64, 0u64);
    let mut keys: Vec<u64> = Vec::new();
    while live.len() as u64 > target {
        let t0 = Instant::now();
        if seq.next_u32() % 4 == 0 {
            let k = GroupKey::from_bytes(random_key(&mut seq));
            server.join(UserId(next), &k, &mut rng)?;
            live.push(next);
            next += 1;
        } else {
            let i = (seq.next_u64() % live.len() as u64) as usize;
            server.leave(UserId(live.swap_remove(i)), &mut rng)?;
        }
        while let Some(t) = server.poll_transmit() {
            bytes += t.bytes.len() as u64;
        }
        us += t0.elapsed().as_secs_f64() * 1e6;
        while server.poll_event().is_some() {}
        let st = server.last_rekey().expect("a rekey ran");
        moves += st.moves as u64;
        keys.push(st.keys_encrypted);
        ops += 1;
    }
    let tail = &keys[keys.len().saturating_sub(1000)..];
    Ok(BalanceRow {
        experiment: "E5",
        kind: "balance",
        n_start: n,
        n_end: live.len() as u64,
        degree,
        compact,
        height_start,
        height_end: server.height(),
        height_min: conclave_keygraph::index::height_for(degree, live.len() as u64),
        moves,
        ops,
        us_per_request: us / ops.max(1) as f64,
        keys_encrypted_per_request: keys.iter().sum::<u64>() as f64 / ops.max(1) as f64,
        keys_encrypted_per_request_at_end: tail.iter().sum::<u64>() as f64
            / tail.len().max(1) as f64,
        bytes_per_request: bytes as f64 / ops.max(1) as f64,
    })
}

fn label(s: Strategy, g: Signing) -> String {
    let s = match s {
        Strategy::User => "user",
        Strategy::Key => "key",
        Strategy::Group => "group",
    };
    let g = match g {
        Signing::None => "no signature",
        Signing::PerMessage => "signature per message",
        Signing::Batch => "one signature per batch",
    };
    format!("{s}-oriented, {g}")
}

/// Figures 10-12 and the batch-rekeying chart.
pub fn charts(rows: &[RekeyRow], batches: &[BatchRow]) -> Vec<(String, Chart)> {
    let mut out = Vec::new();
    let trees = || rows.iter().filter(|r| r.graph == "tree");
    // Fig 10: time per request against group size, degree 4.
    let mut fig10 = Vec::new();
    let mut fig11 = Vec::new();
    let big = trees()
        .map(|r| r.n)
        .filter(|n| *n <= 8192)
        .max()
        .unwrap_or(0);
    for s in STRATEGIES {
        for g in SIGNINGS {
            let pts: Vec<(f64, f64)> = trees()
                .filter(|r| r.degree == 4 && r.strategy == s && r.signing == g)
                .map(|r| ((r.n as f64).log2(), r.avg_us))
                .collect();
            if !pts.is_empty() {
                fig10.push(Series {
                    name: label(s, g),
                    points: pts,
                });
            }
            let pts: Vec<(f64, f64)> = trees()
                .filter(|r| r.n == big && r.strategy == s && r.signing == g)
                .map(|r| (r.degree as f64, r.avg_us))
                .collect();
            if pts.len() > 1 {
                fig11.push(Series {
                    name: label(s, g),
                    points: pts,
                });
            }
        }
    }
    out.push((
        "e5-fig10-time-vs-size.svg".into(),
        Chart {
            title: "E5 (paper 001 Fig 10): server time per request, key tree degree 4".into(),
            x_label: "log2 of group size".into(),
            y_label: "microseconds per join/leave (average)".into(),
            log_y: true,
            series: fig10,
        },
    ));
    if !fig11.is_empty() {
        out.push((
            "e5-fig11-time-vs-degree.svg".into(),
            Chart {
                title: format!("E5 (paper 001 Fig 11): server time per request, n = {big}"),
                x_label: "key tree degree".into(),
                y_label: "microseconds per join/leave (average)".into(),
                log_y: true,
                series: fig11,
            },
        ));
    }
    // Fig 12: key changes per member, against degree and against size.
    let mut by_degree = Vec::new();
    let mut by_size = Vec::new();
    for s in STRATEGIES {
        let pts: Vec<(f64, f64)> = trees()
            .filter(|r| r.n == big && r.strategy == s && r.signing == Signing::Batch)
            .map(|r| (r.degree as f64, r.key_changes_per_member))
            .collect();
        if pts.len() > 1 {
            by_degree.push(Series {
                name: format!("{s:?}-oriented"),
                points: pts,
            });
        }
        let pts: Vec<(f64, f64)> = trees()
            .filter(|r| r.degree == 4 && r.strategy == s && r.signing == Signing::Batch)
            .map(|r| ((r.n as f64).log2(), r.key_changes_per_member))
            .collect();
        if !pts.is_empty() {
            by_size.push(Series {
                name: format!("{s:?}-oriented"),
                points: pts,
            });
        }
    }
    let analytic: Vec<(f64, f64)> = [4.0, 8.0, 16.0]
        .iter()
        .map(|d| (*d, d / (d - 1.0)))
        .collect();
    by_degree.push(Series {
        name: "d/(d-1) (Table 3)".into(),
        points: analytic,
    });
    out.push((
        "e5-fig12-key-changes-vs-degree.svg".into(),
        Chart {
            title: format!("E5 (paper 001 Fig 12): key changes per member per request, n = {big}"),
            x_label: "key tree degree".into(),
            y_label: "keys changed per member".into(),
            log_y: false,
            series: by_degree,
        },
    ));
    out.push((
        "e5-fig12-key-changes-vs-size.svg".into(),
        Chart {
            title: "E5 (paper 001 Fig 12): key changes per member per request, degree 4".into(),
            x_label: "log2 of group size".into(),
            y_label: "keys changed per member".into(),
            log_y: false,
            series: by_size,
        },
    ));
    if !batches.is_empty() {
        let mut series = Vec::new();
        let mut ns: Vec<u64> = batches.iter().map(|b| b.n).collect();
        ns.dedup();
        for n in ns {
            series.push(Series {
                name: format!("n = {n}, degree {}", batches[0].degree),
                points: batches
                    .iter()
                    .filter(|b| b.n == n)
                    .map(|b| ((b.batch as f64).log10(), b.us_per_request))
                    .collect(),
            });
        }
        out.push((
            "e5-batch-rekeying.svg".into(),
            Chart {
                title: "E5: batch rekeying, server time per request".into(),
                x_label: "log10 of requests per rekey".into(),
                y_label: "microseconds per request".into(),
                log_y: true,
                series,
            },
        ));
    }
    out
}
