//! `conclave sim`: runs seeds of the deterministic simulator and judges each history.

use anyhow::{Context, Result};
use conclave_history::{check, Config};
use conclave_sim::{run, FaultChoice, FaultMix, FaultSet, SimConfig};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct SimArgs {
    /// Seeds to run, as A..B (B excluded) or one number.
    #[arg(long, default_value = "0..100")]
    pub seeds: String,
    #[arg(long, default_value_t = 5)]
    pub daemons: usize,
    /// Clients connected to each daemon.
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// Fault mix: swarm (each seed draws its own), none, or a list of
    /// loss,burst,dup,partition,shatter,oneway,nontransitive,flap,crash,pause,spike,disconnect.
    #[arg(long, default_value = "swarm")]
    pub faults: String,
    /// Instead of full runs (daemons, clients, groups, every fault), the ordering of one fixed
    /// ring under loss, duplication and reordering.
    #[arg(long)]
    pub ordering: bool,
    /// Ordering runs: messages each daemon sends during the safety phase.
    #[arg(long, default_value_t = 40)]
    pub messages: usize,
    /// Write the history of the last seed run to this file (JSON lines).
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// Full runs, instead of the deployed default (3000): the daemons hold an idle token this
    /// long, microseconds (0: never).
    #[arg(long)]
    pub idle_hold_us: Option<u64>,
    /// Full runs, instead of the deployed default (1 MiB): bytes of messages one token visit may
    /// send.
    #[arg(long)]
    pub max_visit_bytes: Option<usize>,
    /// Full runs: every group is a secure group (a key agreed per view, sealed data), and the
    /// checker verifies the secure layer's properties too.
    #[arg(long, conflicts_with = "ordering")]
    pub secure: bool,
    /// Secure runs: this key agreement protocol (gdh, ckd, tgdh, str, bd) instead of the one
    /// each seed draws.
    #[arg(long, requires = "secure")]
    pub protocol: Option<String>,
    /// Secure runs: where the groups' keys come from (agreement, daemons or key-graph) instead of the
    /// seed's draw (the daemons one seed in three, a key-graph server a third of the rest).
    #[arg(long, requires = "secure")]
    pub keys: Option<conclave_secure::KeySource>,
    /// Secure runs with keys from the daemons: EVS groups resealed by the daemons (Optimized
    /// EVS) if true, VS groups if false, instead of the seed's draw (one in two).
    #[arg(long, requires = "secure")]
    pub evs: Option<bool>,
    /// Every second client of each daemon speaks Spread's client protocol if true, none if
    /// false, instead of the seed's draw (one in two; never in secure runs).
    #[arg(long, conflicts_with = "secure")]
    pub spread: Option<bool>,
}

fn parse_seeds(s: &str) -> Result<std::ops::Range<u64>> {
    if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().context("seed range start")?;
        let b: u64 = b.trim().parse().context("seed range end")?;
        anyhow::ensure!(a < b, "empty seed range {s}");
        Ok(a..b)
    } else {
        let a: u64 = s.trim().parse().context("seed")?;
        Ok(a..a + 1)
    }
}

/// One JSON line per seed and a summary; fails if any seed violates a property.
pub fn run_sim(args: SimArgs) -> Result<()> {
    let seeds = parse_seeds(&args.seeds)?;
    let (faults, full_faults) = match args.faults.as_str() {
        "swarm" => (FaultMix::Swarm, FaultChoice::Swarm),
        "none" => (FaultMix::None, FaultChoice::List(FaultSet::NONE)),
        list if !args.ordering => (
            FaultMix::Swarm,
            FaultChoice::List(FaultSet::parse(list).map_err(anyhow::Error::msg)?),
        ),
        f => anyhow::bail!(
            "unknown fault mix {f:?}: ordering runs take swarm or none (lists are for full runs)"
        ),
    };
    anyhow::ensure!(
        (1..=64).contains(&args.clients),
        "clients per daemon must be between 1 and 64"
    );
    anyhow::ensure!(
        (1..=64).contains(&args.daemons),
        "daemons must be between 1 and 64"
    );
    let mut out = std::io::stdout().lock();
    let started = Instant::now();
    let (mut failed, mut sim_us, mut runs) = (Vec::new(), 0u64, 0u64);
    let mut last = None;
    for seed in seeds {
        let mut cfg = SimConfig::new(seed);
        cfg.daemons = args.daemons;
        cfg.messages = args.messages;
        cfg.faults = faults;
        let (r, bound) = if !args.ordering {
            let mut m = conclave_sim::MembershipSimConfig::new(seed);
            m.daemons = args.daemons;
            m.clients_per_daemon = args.clients;
            m.faults = full_faults;
            m.idle_hold_us = args.idle_hold_us;
            m.max_visit_bytes = args.max_visit_bytes;
            m.secure = args.secure;
            m.protocol = args
                .protocol
                .as_deref()
                .map(crate::secure_cmd::parse_protocol)
                .transpose()?;
            m.keys = args.keys;
            m.evs = args.evs;
            m.spread = args.spread;
            (conclave_sim::run_membership(&m), m.max_views_after_stable())
        } else {
            (run(&cfg), Config::default().max_views_after_stable)
        };
        let v = check(
            &r.history,
            &Config {
                max_views_after_stable: bound,
            },
        );
        let ok = v.is_empty() && r.completed && r.stats.spread_unreadable == 0;
        sim_us += r.sim_us;
        runs += 1;
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "seed": seed, "ok": ok, "violations": v.len(), "completed": r.completed,
                "views": r.views, "delivered": r.delivered, "packets": r.packets,
                "sim_ms": r.sim_us as f64 / 1000.0, "network": r.network, "stats": r.stats,
            })
        )?;
        if !ok {
            for x in v.iter().take(5) {
                eprint!("seed {seed}: {x}");
            }
            let mut kind = if args.ordering {
                format!("--ordering --messages {}", args.messages)
            } else {
                format!("--clients {}", args.clients)
            };
            // The same run needs the same choices the seed did not make itself.
            if args.secure {
                kind += " --secure";
            }
            if let Some(p) = &args.protocol {
                kind += &format!(" --protocol {p}");
            }
            if let Some(k) = args.keys {
                kind += &format!(" --keys {k}");
            }
            if let Some(e) = args.evs {
                kind += &format!(" --evs {e}");
            }
            if let Some(sp) = args.spread {
                kind += &format!(" --spread {sp}");
            }
            eprintln!(
                "replay: conclave sim --seeds {seed} --daemons {} {kind} --faults {} --history seed-{seed}.jsonl",
                args.daemons, args.faults,
            );
            failed.push(seed);
        }
        last = Some(r);
    }
    if let (Some(path), Some(r)) = (&args.history, &last) {
        let f =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        conclave_history::record::write(&r.history, std::io::BufWriter::new(f))?;
    }
    let wall = started.elapsed().as_secs_f64();
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "seeds": runs, "failed": failed.len(), "failed_seeds": &failed[..failed.len().min(100)],
            "wall_s": wall,
            "daemon_sim_s_per_wall_s": (sim_us as f64 / 1e6) * args.daemons as f64 / wall.max(1e-9),
        })
    )?;
    if !failed.is_empty() {
        anyhow::bail!("{} seed(s) failed", failed.len());
    }
    Ok(())
}
