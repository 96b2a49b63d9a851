//! `conclave keyserver`: the shell around `conclave_secure::KeyServerNode` (docs/keygraph.md,
//! "Running the server"). It connects to a daemon like any client, hands the node the session's
//! events and the time, writes the node's sealed state to disk before it sends what follows
//! each save, and prints what the server does as text or JSON lines.

use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_client::{Address, Client, ClientError};
use conclave_keygraph::Strategy;
use conclave_secure::files::parse_directory;
use conclave_secure::{KeyServerConfig, KeyServerEvent, KeyServerNode, KeyServerOutput};
use conclave_wire::client::ClientCommand;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct KeyserverArgs {
    /// The group the server keys.
    #[arg(long)]
    group: String,
    /// The daemon: host:port, tls:host:port (with --daemon-key), unix:/path or shm:/path (its
    /// `shm` socket: replies through shared memory).
    #[arg(long, default_value = "127.0.0.1:4901")]
    daemon: String,
    /// The server's private name (the daemon makes it name#daemon: members name the server by
    /// that, and the directory must hold the server's identity under it).
    #[arg(long, default_value = "keyserver")]
    name: String,
    /// The server's identity file (`conclave keygen`): it signs invitations, welcomes, rekey
    /// messages and view keys, and seals the saved state.
    #[arg(long)]
    identity: PathBuf,
    /// The trust directory: who may register.
    #[arg(long)]
    directory: PathBuf,
    /// Where the sealed state lives: read at start if the file exists, replaced after every
    /// rekey (before its messages go out).
    #[arg(long)]
    state: PathBuf,
    /// The key tree's degree.
    #[arg(long, default_value_t = 4)]
    degree: u32,
    /// How new keys are packed into rekey messages: user, key or group (paper 001 §3).
    #[arg(long, default_value = "key")]
    strategy: String,
    /// Batch rekeying: milliseconds from a change to its rekey, folding the changes that come
    /// meanwhile into one; 0 rekeys each view's changes at once.
    #[arg(long, default_value_t = 0)]
    batch_ms: u64,
    /// How long to wait for invited members before rekeying without them (milliseconds).
    #[arg(long, default_value_t = 2000)]
    register_timeout_ms: u64,
    /// The daemon's identity key, which a `tls:` address needs.
    #[arg(long)]
    daemon_key: Option<String>,
    /// One JSON object per event on stdout instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_strategy(s: &str) -> Result<Strategy> {
    Ok(match s {
        "user" => Strategy::User,
        "key" => Strategy::Key,
        "group" => Strategy::Group,
        other => bail!("unknown strategy {other:?} (user, key or group)"),
    })
}

/// Sends one of the node's commands on the session.
pub(crate) async fn carry(
    tx: &mut conclave_client::Sender,
    c: ClientCommand,
) -> Result<(), ClientError> {
    match c {
        ClientCommand::Join { group, vs } => tx.join(&group, vs).await,
        ClientCommand::Leave { group } => tx.leave(&group).await,
        ClientCommand::FlushAck { group, view } => tx.flush_ack(&group, view).await,
        ClientCommand::Multicast {
            service,
            groups,
            payload,
        } => {
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            tx.multicast(service, &groups, &payload).await
        }
    }
}

pub fn run_keyserver(args: KeyserverArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(keyserver(args))
}

/// Replaces `path` with `bytes` durably: a file beside it, synced, renamed over it, and the
/// directory synced, so a crash leaves the old state or the new one, whole.
fn write_state(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = path.with_extension("tmp");
    {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.mode(0o600);
        }
        let mut f = o
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}

fn event_line(e: &KeyServerEvent) -> (serde_json::Value, String) {
    match e {
        KeyServerEvent::Registered { member } => (
            json!({"ev": "registered", "member": member}),
            format!("registered {member}"),
        ),
        KeyServerEvent::Removed { member } => (
            json!({"ev": "removed", "member": member}),
            format!("removed {member}"),
        ),
        KeyServerEvent::Rekeyed(s) => (
            json!({"ev": "rekeyed", "stats": s}),
            format!(
                "rekeyed: epoch {}, {} joins, {} leaves, {} members, {} messages, {} bytes",
                s.epoch, s.joins, s.leaves, s.members, s.messages, s.bytes_sent
            ),
        ),
        KeyServerEvent::Announced {
            view,
            epoch,
            excluded,
        } => (
            json!({"ev": "view_key", "view": crate::user_cmd::view_text(view), "epoch": epoch,
                   "excluded": excluded}),
            format!(
                "view {} keyed with epoch {epoch}{}",
                crate::user_cmd::view_text(view),
                match excluded.is_empty() {
                    true => String::new(),
                    false => format!(" (without {})", excluded.join(", ")),
                }
            ),
        ),
        KeyServerEvent::Refused { sender, error } => (
            json!({"ev": "refused", "sender": sender, "kind": error.kind(),
                   "error": error.to_string()}),
            format!("refused from {sender}: {error}"),
        ),
    }
}

async fn keyserver(args: KeyserverArgs) -> Result<()> {
    let strategy = parse_strategy(&args.strategy)?;
    if !(2..=conclave_keygraph::server::MAX_DEGREE).contains(&args.degree) {
        bail!(
            "--degree must be 2 to {}",
            conclave_keygraph::server::MAX_DEGREE
        );
    }
    let addr: Address = args.daemon.parse()?;
    let identity = crate::secure_cmd::read_identity(&args.identity)?.identity();
    let directory = parse_directory(
        &std::fs::read_to_string(&args.directory)
            .with_context(|| format!("reading {}", args.directory.display()))?,
    )
    .with_context(|| format!("reading {}", args.directory.display()))?;
    let daemon_key = args
        .daemon_key
        .as_deref()
        .map(|k| conclave_crypto::identity_file::parse_public_text("--daemon-key", k))
        .transpose()?;
    let saved = match std::fs::read(&args.state) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", args.state.display())),
    };
    let opts = conclave_client::Options {
        identity: Some(identity.clone()),
        daemon_key,
        ..Default::default()
    };
    let client = Client::connect_with(&addr, &args.name, opts)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let name = client.name().to_owned();
    // The directory's key is the server's if it verifies what the server signs.
    let probe = b"conclave keyserver directory probe";
    let listed = directory.get(&name).is_some_and(|public| {
        identity
            .sign(probe)
            .is_ok_and(|sig| public.verify(probe, &sig).is_ok())
    });
    if !listed {
        bail!(
            "the directory must hold this server's identity under {name:?}, the name its members \
             know it by"
        );
    }
    let mut cfg = KeyServerConfig::new(&args.group, &name);
    cfg.degree = args.degree;
    cfg.strategy = strategy;
    cfg.batch_ms = args.batch_ms;
    cfg.register_timeout_ms = args.register_timeout_ms;
    let directory = Arc::new(RwLock::new(directory));
    let rng = Box::new(rand_core::OsRng);
    let restored = saved.is_some();
    let mut node = match saved {
        Some(state) => KeyServerNode::restore(cfg, &state, identity, directory, rng)
            .with_context(|| format!("restoring {}", args.state.display()))?,
        None => KeyServerNode::new(cfg, identity, directory, rng)?,
    };
    let say = |v: serde_json::Value, t: String| {
        if args.json {
            println!("{v}");
        } else {
            println!("{t}");
        }
    };
    say(
        json!({"ev": "connected", "name": name, "group": args.group, "restored": restored,
               "epoch": node.epoch(), "members": node.members()}),
        format!(
            "key server {name} for {} ({}, epoch {}, {} members)",
            args.group,
            match restored {
                true => "restored",
                false => "new",
            },
            node.epoch(),
            node.members()
        ),
    );
    let start = Instant::now();
    let (mut tx, mut rx) = client.split();
    loop {
        let now = start.elapsed().as_millis() as u64;
        node.tick(now);
        while let Some(o) = node.poll_output() {
            match o {
                KeyServerOutput::Save(bytes) => write_state(&args.state, &bytes)?,
                KeyServerOutput::Command(c) => {
                    if let Err(e) = carry(&mut tx, c).await {
                        if !matches!(e, ClientError::Refused { .. }) {
                            bail!("the session ended: {e}");
                        }
                        say(
                            json!({"ev": "refused_by_session", "error": e.to_string()}),
                            format!("the session refused a command: {e}"),
                        );
                    }
                }
            }
        }
        while let Some(e) = node.poll_event() {
            let (v, t) = event_line(&e);
            say(v, t);
        }
        let wait = node
            .next_deadline()
            .map(|at| Duration::from_millis(at.saturating_sub(now)))
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            ev = rx.receive() => match ev {
                Ok(ev) => node.handle_event(ev, start.elapsed().as_millis() as u64),
                Err(e @ ClientError::Refused { .. }) => say(json!({"ev": "refused", "error": e.to_string()}),
                                               format!("refused: {e}")),
                Err(e) => bail!("the session ended: {e}"),
            },
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
