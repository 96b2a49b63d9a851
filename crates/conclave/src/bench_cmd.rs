//! `conclave bench ...`: the experiments. JSON lines on standard output, plots into `--out`.

use anyhow::{Context, Result};
use clap::Subcommand;
use conclave_bench::gka::{self, E1Row, EVENTS, PROTOCOLS};
use conclave_crypto::Suite;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Messages per second delivered at each member: real daemons on this machine, 1 and 5
    /// senders, sizes 100 B to 64 KiB, every service type.
    Throughput(crate::net_bench::ThroughputArgs),
    /// Send-to-delivery latency (p50, p99, max) at light and heavy load.
    Latency(crate::net_bench::LatencyArgs),
    /// Time from a join, leave, partition and merge to the new view at every member (Time_max
    /// and Time_avg), over 3 to 13 daemons and 2 to 50 clients.
    Membership(crate::net_bench::MembershipArgs),
    /// E2: time from a join, leave, partition and merge to the new secure view at every member
    /// (Time_max and Time_avg), per key agreement protocol, over real daemons.
    Secure(crate::secure_bench::SecureArgs),
    /// E6: fresh keys for 1 to 10,000 groups after a daemon partition and a merge, and a join
    /// and a leave of one group, layered (TGDH among the members) against integrated (keys
    /// from the daemons' key), next to paper 002's values.
    Integrated(crate::integrated_bench::IntegratedArgs),
    /// E7: agreed throughput against message size, 1 and 5 senders, for data in the clear,
    /// links authenticated, links sealed, and sealed by the members (layered and Integrated VS).
    Sealed(crate::sealed_bench::SealedArgs),
    /// E5 over real daemons: a key server and a key-graph group's members as clients of daemons
    /// in this process; time from a leave and from a batch of joins and leaves to the new key at
    /// every member, and the server's cost per rekey.
    Keyserver(crate::keyserver_bench::KeyserverArgs),
    /// One member process of `bench throughput --processes`, stepped through its standard
    /// input; not for direct use.
    #[command(hide = true)]
    Member(crate::process_bench::MemberArgs),
    /// One relay of `bench throughput --processes --limit` or `bench latency --processes
    /// --limit`; not for direct use.
    #[command(hide = true)]
    Relay(crate::limit_bench::RelayArgs),
    /// E1: computation cost of GDH, CKD, TGDH, STR and BD per event (join, leave, merge,
    /// partition) against group size, next to paper 000's Tables I and II.
    Gka {
        /// Largest group size. Sizes run 2..64 (the papers' range) and double beyond, up to this.
        #[arg(long, default_value_t = 64)]
        n: usize,
        /// Exact sizes to run instead (comma separated); overrides --n.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Suites: modern, paper, or both.
        #[arg(long, default_value = "modern")]
        suite: String,
        /// Protocols to run (comma separated; default all).
        #[arg(long, value_delimiter = ',')]
        protocols: Vec<String>,
        /// Events to run (comma separated; default all).
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
        /// Runs per configuration up to n = 64 (the median is reported); one run beyond.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Directory for the SVG plots (one per event and suite).
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// The OpenMLS peer's program (peers/openmls: `cargo build --release --manifest-path
        /// peers/openmls/Cargo.toml`, then `peers/openmls/target/release/conclave-peer-openmls`):
        /// after the protocols, each size also runs OpenMLS removing a member, in an `E1-peer`
        /// row beside TGDH's join and leave.
        #[arg(long)]
        peer: Option<PathBuf>,
    },
    /// E5: the key-graph (LKH) server of paper 001: server time per join and leave, rekey
    /// messages sent and received, key changes per member, memory; batch rekeying and compaction.
    Keygraph {
        /// Largest group size. Sizes run 32..8192 (the paper's range) by doubling, then by
        /// fourfold steps up to this (1000000 for the performance goal).
        #[arg(long, default_value_t = 8192)]
        n: u64,
        /// Exact sizes to run instead (comma separated); overrides --n.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<u64>,
        /// Key tree degrees.
        #[arg(long, value_delimiter = ',', default_values_t = [4u32, 8, 16])]
        degrees: Vec<u32>,
        /// Rekeying strategies: user, key, group (default all).
        #[arg(long, value_delimiter = ',')]
        strategies: Vec<String>,
        /// Signing modes: none, per-message, batch (default all).
        #[arg(long, value_delimiter = ',')]
        signing: Vec<String>,
        /// Also run star key graphs (sizes up to 8192).
        #[arg(long)]
        star: bool,
        /// Joins and leaves per configuration (1:1, as in the paper).
        #[arg(long, default_value_t = 1000)]
        ops: u64,
        /// Requests per rekey for the batch-rekeying runs (0 to skip them).
        #[arg(long, value_delimiter = ',', default_values_t = [1u64, 10, 100, 1000])]
        batch: Vec<u64>,
        /// Skip the compaction runs (a group shrinking sixteenfold, with and without).
        #[arg(long)]
        no_balance: bool,
        /// Seed of the keys and of the request sequence.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Directory for the SVG plots.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
}

fn progress(total: u64) -> ProgressBar {
    if std::io::stderr().is_terminal() {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} [{elapsed} < {eta}]")
                .expect("template"),
        );
        b
    } else {
        ProgressBar::hidden()
    }
}

fn keygraph_sizes(max: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut n = 32;
    while n <= max.min(8192) {
        v.push(n);
        n *= 2;
    }
    let mut n = 8192 * 4;
    while n < max {
        v.push(n);
        n *= 4;
    }
    if !v.contains(&max) {
        v.push(max);
    }
    v
}

fn parse_list<T: Copy>(
    given: &[String],
    all: &[T],
    name: impl Fn(T) -> &'static str,
    what: &str,
) -> Result<Vec<T>> {
    if given.is_empty() {
        return Ok(all.to_vec());
    }
    given
        .iter()
        .map(|g| {
            all.iter()
                .copied()
                .find(|x| name(*x) == g.to_lowercase())
                .with_context(|| format!("unknown {what} {g:?}"))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn run_keygraph(
    n: u64,
    sizes: Vec<u64>,
    degrees: Vec<u32>,
    strategies: Vec<String>,
    signing: Vec<String>,
    star: bool,
    ops: u64,
    batch: Vec<u64>,
    no_balance: bool,
    seed: u64,
    out: PathBuf,
) -> Result<()> {
    use conclave_bench::keygraph as e5;
    use conclave_keygraph::{GraphKind, Signing, Strategy};
    let max = conclave_keygraph::server::MAX_MEMBERS as u64;
    let sizes = if sizes.is_empty() {
        keygraph_sizes(n)
    } else {
        sizes
    };
    if sizes.iter().any(|s| *s < 2 || *s > max) {
        anyhow::bail!("group sizes must be between 2 and {max}");
    }
    if let Some(d) = degrees
        .iter()
        .find(|d| !(2..=conclave_keygraph::server::MAX_DEGREE).contains(*d))
    {
        anyhow::bail!(
            "degree {d} is outside 2..={}",
            conclave_keygraph::server::MAX_DEGREE
        );
    }
    let strategies = parse_list(
        &strategies,
        &e5::STRATEGIES,
        |s| match s {
            Strategy::User => "user",
            Strategy::Key => "key",
            Strategy::Group => "group",
        },
        "strategy",
    )?;
    let signings = parse_list(
        &signing,
        &e5::SIGNINGS,
        |s| match s {
            Signing::None => "none",
            Signing::PerMessage => "per-message",
            Signing::Batch => "batch",
        },
        "signing mode",
    )?;
    let mut graphs: Vec<GraphKind> = degrees
        .iter()
        .map(|d| GraphKind::Tree { degree: *d })
        .collect();
    if star {
        graphs.push(GraphKind::Star);
    }
    let batch: Vec<u64> = batch.into_iter().filter(|b| *b > 0).collect();
    let batch_sizes: Vec<u64> = {
        let mut v: Vec<u64> = sizes
            .iter()
            .copied()
            .filter(|s| *s <= 8192)
            .max()
            .into_iter()
            .collect();
        if let Some(&top) = sizes.iter().max() {
            if !v.contains(&top) {
                v.push(top);
            }
        }
        v
    };
    let balance_n = sizes.iter().copied().filter(|s| *s <= 65536).max();
    let mut configs: Vec<(u64, GraphKind, Strategy, Signing)> = Vec::new();
    for &n in &sizes {
        for &g in &graphs {
            if g == GraphKind::Star && n > 8192 {
                continue;
            }
            for &st in &strategies {
                for &x in &signings {
                    configs.push((n, g, st, x));
                }
            }
        }
    }
    let total = configs.len() as u64
        + (batch.len() * batch_sizes.len()) as u64
        + if no_balance || balance_n.is_none() {
            0
        } else {
            2
        };
    let bar = progress(total);
    let mut stdout = std::io::stdout().lock();
    let mut rows = Vec::new();
    for (n, g, s, x) in configs {
        bar.set_message(format!("n={n} {g:?} {s:?} {x:?}"));
        let r = e5::run_rekey(n, g, s, x, ops, seed)?;
        writeln!(stdout, "{}", serde_json::to_string(&r)?)?;
        rows.push(r);
        bar.inc(1);
    }
    let mut batches = Vec::new();
    for &n in &batch_sizes {
        for &b in &batch {
            bar.set_message(format!("batch n={n} {b} per rekey"));
            let r = e5::run_batch(n, 4, b, ops.max(b), seed)?;
            writeln!(stdout, "{}", serde_json::to_string(&r)?)?;
            batches.push(r);
            bar.inc(1);
        }
    }
    if let (false, Some(n)) = (no_balance, balance_n) {
        for compact in [false, true] {
            bar.set_message(format!("compaction n={n} {compact}"));
            let r = e5::run_balance(n, 4, compact, seed)?;
            writeln!(stdout, "{}", serde_json::to_string(&r)?)?;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    for (name, chart) in e5::charts(&rows, &batches) {
        let path = out.join(name);
        std::fs::write(&path, chart.to_svg())
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn sizes_up_to(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [2, 4, 8, 12, 16, 24, 32, 48, 64]
        .into_iter()
        .filter(|n| *n <= max)
        .collect();
    let mut n = 128;
    while n <= max {
        v.push(n);
        n *= 2;
    }
    if max > 64 && !v.contains(&max) {
        v.push(max);
    }
    v
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Throughput(a) => crate::net_bench::run_throughput(a),
        BenchCommand::Latency(a) => crate::net_bench::run_latency(a),
        BenchCommand::Membership(a) => crate::net_bench::run_membership(a),
        BenchCommand::Secure(a) => crate::secure_bench::run(a),
        BenchCommand::Integrated(a) => crate::integrated_bench::run(a),
        BenchCommand::Sealed(a) => crate::sealed_bench::run(a),
        BenchCommand::Keyserver(a) => crate::keyserver_bench::run(a),
        BenchCommand::Member(a) => crate::process_bench::run_member(a),
        BenchCommand::Relay(a) => crate::limit_bench::run_relay(a),
        BenchCommand::Keygraph {
            n,
            sizes,
            degrees,
            strategies,
            signing,
            star,
            ops,
            batch,
            no_balance,
            seed,
            out,
        } => run_keygraph(
            n, sizes, degrees, strategies, signing, star, ops, batch, no_balance, seed, out,
        ),
        BenchCommand::Gka {
            n,
            sizes,
            suite,
            protocols,
            events,
            repeat,
            out,
            peer,
        } => {
            let sizes = if sizes.is_empty() {
                sizes_up_to(n)
            } else {
                sizes
            };
            if sizes
                .iter()
                .any(|n| *n < 2 || *n > conclave_gka::api_limits::MAX_GROUP)
            {
                anyhow::bail!(
                    "group sizes must be between 2 and {}",
                    conclave_gka::api_limits::MAX_GROUP
                );
            }
            let suites: Vec<Suite> = match suite.as_str() {
                "both" => vec![Suite::Modern, Suite::Paper],
                s => vec![s.parse().map_err(anyhow::Error::msg)?],
            };
            let protocols: Vec<_> = if protocols.is_empty() {
                PROTOCOLS.to_vec()
            } else {
                protocols
                    .iter()
                    .map(|p| {
                        PROTOCOLS
                            .iter()
                            .copied()
                            .find(|x| conclave_gka::kat::protocol_name(*x) == p.to_lowercase())
                            .with_context(|| format!("unknown protocol {p:?}"))
                    })
                    .collect::<Result<_>>()?
            };
            let events: Vec<&'static str> = if events.is_empty() {
                EVENTS.to_vec()
            } else {
                events
                    .iter()
                    .map(|e| {
                        EVENTS.iter().copied().find(|x| x == e).with_context(|| {
                            format!("unknown event {e:?} (join, leave, merge, partition)")
                        })
                    })
                    .collect::<Result<_>>()?
            };
            let total = (suites.len() * protocols.len() * events.len() * sizes.len()) as u64;
            let bar = progress(total);
            let mut rows: Vec<E1Row> = Vec::new();
            let mut stdout = std::io::stdout().lock();
            for s in suites {
                gka::run_suite(s, &sizes, &protocols, &events, repeat, |r| {
                    bar.set_message(format!("{} {} {} n={}", r.suite, r.protocol, r.event, r.n));
                    bar.inc(1);
                    let _ = writeln!(
                        stdout,
                        "{}",
                        serde_json::to_string(&r).expect("row serializes")
                    );
                    rows.push(r);
                });
            }
            bar.finish_and_clear();
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for (name, chart) in gka::charts(&rows) {
                let path = out.join(name);
                std::fs::write(&path, chart.to_svg())
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            if let Some(peer) = &peer {
                // The peer removes a member other than the group's creator and the receiver.
                for &n in sizes.iter().filter(|&&n| n >= 4) {
                    let row = crate::gka_peer::compare(peer, n, &rows)?;
                    writeln!(stdout, "{row}")?;
                }
            }
            Ok(())
        }
    }
}
