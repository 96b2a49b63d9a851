//! `conclave gka run`: a scripted sequence of membership events over the in-memory transport.

use anyhow::{bail, Context, Result};
use clap::{Subcommand, ValueEnum};
use conclave_crypto::{Group, Modp1024, Ristretto255, Suite};
use conclave_gka::script::parse;
use conclave_gka::testbed::Testbed;
use conclave_gka::ProtocolId;
use std::io::Write;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ProtocolArg {
    Gdh,
    Ckd,
    Tgdh,
    Str,
    Bd,
}

impl From<ProtocolArg> for ProtocolId {
    fn from(p: ProtocolArg) -> Self {
        match p {
            ProtocolArg::Gdh => ProtocolId::Gdh,
            ProtocolArg::Ckd => ProtocolId::Ckd,
            ProtocolArg::Tgdh => ProtocolId::Tgdh,
            ProtocolArg::Str => ProtocolId::Str,
            ProtocolArg::Bd => ProtocolId::Bd,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SuiteArg {
    Modern,
    Paper,
}

impl From<SuiteArg> for Suite {
    fn from(s: SuiteArg) -> Self {
        match s {
            SuiteArg::Modern => Suite::Modern,
            SuiteArg::Paper => Suite::Paper,
        }
    }
}

#[derive(Subcommand)]
pub enum GkaCommand {
    /// Run a script of membership events (docs/gka-script.md); one JSON line per completed secure
    /// view, then {"final": true, "stuck": [...]}.
    Run {
        #[arg(long, value_enum)]
        protocol: ProtocolArg,
        #[arg(long, value_enum, default_value = "modern")]
        suite: SuiteArg,
        /// The script file ("-" for standard input).
        #[arg(long)]
        script: PathBuf,
        /// Seed of the run's random number generator: the same seed replays the same run.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

pub fn run(cmd: GkaCommand) -> Result<()> {
    match cmd {
        GkaCommand::Run {
            protocol,
            suite,
            script,
            seed,
        } => {
            let text = if script.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
                    .context("reading the script from standard input")?
            } else {
                std::fs::read_to_string(&script)
                    .with_context(|| format!("reading {}", script.display()))?
            };
            let steps = parse(&text).with_context(|| format!("in {}", script.display()))?;
            if steps.is_empty() {
                bail!("{}: the script has no events", script.display());
            }
            match Suite::from(suite) {
                Suite::Modern => {
                    run_script::<Ristretto255>(protocol.into(), Suite::Modern, &steps, seed)
                }
                Suite::Paper => run_script::<Modp1024>(protocol.into(), Suite::Paper, &steps, seed),
            }
        }
    }
}

fn run_script<G: Group>(
    p: ProtocolId,
    suite: Suite,
    steps: &[conclave_gka::script::Step],
    seed: u64,
) -> Result<()> {
    let mut tb = Testbed::<G>::new(p, suite.sig_scheme(), seed);
    tb.run_script(steps)?;
    let mut out = std::io::stdout().lock();
    for r in &tb.records {
        writeln!(out, "{}", serde_json::to_string(r)?)?;
    }
    let errors: Vec<String> = tb.errors.iter().map(|(m, e)| format!("{m}: {e}")).collect();
    writeln!(
        out,
        "{}",
        serde_json::json!({ "final": true, "stuck": tb.stuck(), "errors": errors })
    )?;
    Ok(())
}
