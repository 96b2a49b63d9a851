//! `conclave daemon` and `conclave admin`.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use conclave_crypto::identity_file::IdentityFile;
use conclave_daemon::{AdminRequest, Config, Options};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct DaemonArgs {
    /// The network's configuration (TOML, docs/daemon.md); without it, three daemons d1..d3 on
    /// 127.0.0.1 (peers on UDP 4801-4803, clients on TCP 4901-4903, admin 5001-5003).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Which daemon of the configuration this is.
    #[arg(long, default_value = "d1")]
    name: String,
    /// This daemon's identity file (`conclave keygen`); by default the file its configuration
    /// entry names.
    #[arg(long)]
    identity: Option<PathBuf>,
    /// Write the history of this daemon's clients (JSON lines, docs/history.md).
    #[arg(long)]
    record: Option<PathBuf>,
    /// Seed of the fault injection's randomness.
    #[arg(long)]
    seed: Option<u64>,
    /// Log filter (tracing's env-filter syntax); RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    log: String,
    /// Worker threads of the daemon's runtime, shared by the protocol and the connections. With
    /// 1 (the default) the connections are read and written on the thread that runs the
    /// protocol, and no input waits for a wake-up from another thread: with three daemons and
    /// their members on two processors that delivered about a tenth more. A daemon with a TLS
    /// port takes 2 by default, so that a flood of handshakes cannot hold the protocol's thread
    /// (and the ring's token) for long.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
}

/// How long the daemon's allocator keeps freed pages before it returns them: a quarter of
/// mimalloc's default second kept three daemons at full load under 100 MiB together in most runs
/// (92-96 MiB at their peak in alternated runs, against 97-134), with no loss of throughput
/// beyond the noise.
const PURGE_DELAY_MS: u32 = 250;

/// The configuration a command uses: the file, or the three local daemons.
pub fn load_config(path: &Option<PathBuf>) -> Result<Config> {
    Ok(match path {
        Some(p) => Config::load(p)?,
        None => local_network()?,
    })
}

/// The three local daemons of [`Config::local`], their identities kept in a directory of this
/// user's (made on first use, readable by its owner alone), so that daemons started without a
/// configuration file still seal their links.
fn local_network() -> Result<Config> {
    let dir = local_identity_dir();
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let mut cfg = Config::local(3, 4800);
    for d in &mut cfg.daemon {
        let path = dir.join(format!("{}.identity", d.name));
        if !path.exists() {
            // Written aside and linked into place: a daemon starting at the same moment reads
            // either no file or a whole one, and one of them wins.
            let id = IdentityFile::generate(&d.name, &mut rand_core::OsRng);
            let tmp = dir.join(format!(".{}.{}", d.name, std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            crate::secure_cmd::write_private(&tmp, &id.to_text())?;
            let _ = std::fs::hard_link(&tmp, &path);
            let _ = std::fs::remove_file(&tmp);
        }
        let id = conclave_daemon::read_identity(&path)?;
        d.key = Some(id.public_text());
        d.identity = Some(path);
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Where the local daemons' identities are kept: `$XDG_STATE_HOME/conclave/local`, or
/// `~/.local/state/conclave/local`.
fn local_identity_dir() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("conclave").join("local")
}

pub fn run_daemon(args: DaemonArgs) -> Result<()> {
    // First: the runtime's threads do not exist yet.
    conclave_bench::alloc::purge_freed_pages_after(PURGE_DELAY_MS);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log))
        .context("--log")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    #[cfg(unix)]
    match conclave_daemon::raise_open_files_limit() {
        Ok(n) => tracing::debug!(limit = n, "open descriptors"),
        Err(e) => tracing::warn!(error = %e, "could not raise the limit of open descriptors"),
    }
    let cfg = load_config(&args.config)?;
    let tls = cfg
        .id_of(&args.name)
        .and_then(|id| cfg.entry(id))
        .is_some_and(|e| e.tls.is_some());
    let rt = match args.threads.unwrap_or(if tls { 2 } else { 1 }) {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n as usize);
            b
        }
    }
    .enable_all()
    .build()?;
    rt.block_on(async move {
        let opts = Options {
            record: args.record,
            incarnation: None,
            seed: args.seed,
            identity: match &args.identity {
                Some(p) => Some(Arc::new(conclave_daemon::read_identity(p)?)),
                None => None,
            },
        };
        let mut d = conclave_daemon::start(cfg, &args.name, opts).await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            r = d.stopped() => return r,
        }
        tracing::info!("shutting down");
        d.shutdown().await
    })
}

#[derive(Args)]
pub struct AdminArgs {
    /// The network's configuration (default: the three local daemons).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The daemons to ask, by name (default: every daemon of the configuration).
    #[arg(long, value_delimiter = ',')]
    daemon: Vec<String>,
    /// The identity to sign in with: an administrator's that `[[admin]]` lists, or a daemon's
    /// own. By default each daemon is asked with the identity file its configuration entry
    /// names (the operator running the daemons holds them).
    #[arg(long)]
    identity: Option<PathBuf>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Each daemon's ring, members, clients and faults.
    Status,
    /// Cut the network into sets of daemons: `partition d1,d2 d3`.
    Partition { sets: Vec<String> },
    /// End the partition.
    Heal,
    /// Lose this fraction of datagrams (to one peer with --peer).
    Drop {
        rate: f64,
        #[arg(long)]
        peer: Option<String>,
    },
    /// Delay datagrams by MS milliseconds, plus up to --jitter.
    Delay {
        ms: u64,
        #[arg(long, default_value_t = 0)]
        jitter: u64,
        #[arg(long)]
        peer: Option<String>,
    },
    /// Send this fraction of datagrams twice.
    Dup {
        rate: f64,
        #[arg(long)]
        peer: Option<String>,
    },
    /// Stop the daemon for MS milliseconds (as if the process were suspended).
    Pause { ms: u64 },
    /// Every fault off.
    Clear,
    /// Stop the daemon, telling its clients.
    Shutdown,
    /// The daemon's metrics (Prometheus' text format, in the reply's `metrics`).
    Metrics,
}

impl AdminCommand {
    fn request(self) -> Result<AdminRequest> {
        Ok(match self {
            AdminCommand::Status => AdminRequest::Status,
            AdminCommand::Partition { sets } => {
                if sets.is_empty() {
                    bail!("name the sets: partition d1,d2 d3");
                }
                AdminRequest::Partition {
                    sets: sets
                        .iter()
                        .map(|s| s.split(',').map(str::to_owned).collect())
                        .collect(),
                }
            }
            AdminCommand::Heal => AdminRequest::Heal,
            AdminCommand::Drop { rate, peer } => AdminRequest::Drop { rate, peer },
            AdminCommand::Delay { ms, jitter, peer } => AdminRequest::Delay {
                ms,
                jitter_ms: jitter,
                peer,
            },
            AdminCommand::Dup { rate, peer } => AdminRequest::Dup { rate, peer },
            AdminCommand::Pause { ms } => AdminRequest::Pause { ms },
            AdminCommand::Clear => AdminRequest::Clear,
            AdminCommand::Shutdown => AdminRequest::Shutdown,
            AdminCommand::Metrics => AdminRequest::Metrics,
        })
    }
}

pub fn run_admin(args: AdminArgs) -> Result<()> {
    let cfg = load_config(&args.config)?;
    let names: Vec<String> = if args.daemon.is_empty() {
        cfg.daemon.iter().map(|d| d.name.clone()).collect()
    } else {
        args.daemon.clone()
    };
    let req = args.command.request()?;
    let given = match &args.identity {
        Some(p) => Some(Arc::new(conclave_daemon::read_identity(p)?)),
        None => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut failed = false;
    rt.block_on(async {
        for n in &names {
            let id = cfg
                .id_of(n)
                .with_context(|| format!("the configuration names no daemon {n:?}"))?;
            let entry = cfg.entry(id).expect("named");
            let Some(addr) = entry.admin else {
                bail!("daemon {n} has no admin address");
            };
            let identity = match (&given, &entry.identity) {
                (Some(id), _) => id.clone(),
                (None, Some(path)) => Arc::new(conclave_daemon::read_identity(path)?),
                (None, None) => bail!(
                    "daemon {n}'s entry names no identity file to sign in with: give --identity"
                ),
            };
            let line = match conclave_daemon::endpoints::ask(addr, n, &identity, &req).await {
                Ok(reply) => {
                    failed |= !reply.ok;
                    serde_json::json!({ "daemon": n, "reply": reply })
                }
                Err(e) => {
                    failed = true;
                    serde_json::json!({ "daemon": n, "reply": { "ok": false, "error": format!("{e:#}") } })
                }
            };
            println!("{line}");
        }
        Ok(())
    })?;
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
