//! `conclave`: the one binary. Subcommands: `demo`, `daemon`, `admin`, `user`, `keygen`, `keyserver`, `gka run`, `sim`,
//! `check`, `bench gka`, `bench keygraph`.

mod bench_cmd;
mod check_cmd;
mod daemon_cmd;
mod demo;
mod gka_cmd;
mod gka_peer;
mod integrated_bench;
mod keys_demo;
mod keyserver_bench;
mod keyserver_cmd;
mod limit_bench;
mod net_bench;
mod process_bench;
mod sealed_bench;
mod secure_bench;
mod secure_cmd;
mod secure_demo;
mod sim_cmd;
mod spread_bench;
mod spread_user;
mod user_cmd;
mod view_timing;

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
    /// A secure group over three daemons on this machine: a key per view, sealed messages, a leave,
    /// a partition and a merge (--plain: the group without keys; --keys: the key agreement alone).
    Demo(demo::DemoArgs),
    /// Run a daemon.
    Daemon(daemon_cmd::DaemonArgs),
    /// Ask running daemons for their status, or inject faults: partition, heal, drop, delay, dup, pause.
    Admin(daemon_cmd::AdminArgs),
    /// A client: commands on stdin (join, leave, send, ack), events on stdout (--json for JSON lines;
    /// --secure for secure groups).
    User(user_cmd::UserArgs),
    /// Make an identity (an Ed25519 key, private to its owner): a member's, added to a trust
    /// directory, or a daemon's, named by its `key` in the configuration.
    Keygen(secure_cmd::KeygenArgs),
    /// Run a key-graph server for one group (docs/keygraph.md): it registers the group's members
    /// and rekeys the group on every join and leave; members join with --keys key-graph.
    Keyserver(keyserver_cmd::KeyserverArgs),
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
        Command::Daemon(args) => daemon_cmd::run_daemon(args),
        Command::Admin(args) => daemon_cmd::run_admin(args),
        Command::User(args) => user_cmd::run_user(args),
        Command::Keygen(args) => secure_cmd::run_keygen(args),
        Command::Keyserver(args) => keyserver_cmd::run_keyserver(args),
        Command::Gka { command } => gka_cmd::run(command),
        Command::Bench { command } => bench_cmd::run(command),
        Command::Check(args) => check_cmd::run(args),
        Command::Sim(args) => sim_cmd::run_sim(args),
    }
}
