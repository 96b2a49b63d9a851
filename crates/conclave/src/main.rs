//! `conclave`: the one binary. Subcommands: `demo`, `gka run`, `sim`, `check`, `bench gka`,
//! `bench keygraph`.

mod bench_cmd;
mod check_cmd;
mod demo;
mod gka_cmd;
mod sim_cmd;

use anyhow::Result;

// Counts live heap bytes so that the benchmarks report memory as measured.
#[global_allocator]
static ALLOC: conclave_bench::alloc::Counting = conclave_bench::alloc::Counting;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "conclave",
    version,
    about = "Secure group communication: ordered group messaging with group keys"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tell the story of a group's keys: it forms, a member joins, one leaves, it partitions and merges.
    Demo(demo::DemoArgs),
    /// Group key agreement tools.
    Gka {
        #[command(subcommand)]
        command: gka_cmd::GkaCommand,
    },
    /// Run seeds of the deterministic simulator and check each run's history.
    Sim(sim_cmd::SimArgs),
    /// Check a recorded history (JSON lines) against the reliability properties.
    Check(check_cmd::CheckArgs),
    /// Run an experiment and print JSON lines (and plots).
    Bench {
        #[command(subcommand)]
        command: bench_cmd::BenchCommand,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Gka { command } => gka_cmd::run(command),
        Command::Bench { command } => bench_cmd::run(command),
        Command::Check(args) => check_cmd::run(args),
        Command::Sim(args) => sim_cmd::run_sim(args),
    }
}
