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
    },
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
        BenchCommand::Gka {
            n,
            sizes,
            suite,
            protocols,
            events,
            repeat,
            out,
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
            let bar = if std::io::stderr().is_terminal() {
                let b = ProgressBar::new(total);
                b.set_style(
                    ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} [{elapsed} < {eta}]")
                        .expect("template"),
                );
                b
            } else {
                ProgressBar::hidden()
            };
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
            Ok(())
        }
    }
}
