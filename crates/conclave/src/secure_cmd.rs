//! `conclave keygen` (an identity and its line in a trust directory) and `conclave user --secure`
//! (a client whose groups are secure: docs/secure.md).

use crate::user_cmd::{parse_line, service_name, view_text, Line};
use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_client::secure::files::{directory_text, parse_directory, IdentityFile};
use conclave_client::secure::{KeySource, SecureClient, SecureConfig, SecureEvent};
use conclave_client::{Address, Client};
use conclave_gka::ProtocolId;
use serde_json::json;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncBufReadExt, BufReader};

#[derive(Args)]
pub struct KeygenArgs {
    /// The member's private name (what it connects as), or the daemon's name.
    #[arg(long)]
    name: String,
    /// Where to write the identity (readable by its owner only). Refuses to overwrite one.
    #[arg(long)]
    out: PathBuf,
    /// A trust directory to add the member to (created if missing).
    #[arg(long)]
    directory: Option<PathBuf>,
}

/// Creates `path` readable and writable by its owner alone, refusing to replace a file.
pub fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = o
        .open(path)
        .with_context(|| format!("creating {} (it must not exist)", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

pub fn run_keygen(args: KeygenArgs) -> Result<()> {
    let id = IdentityFile::generate(&args.name, &mut rand_core::OsRng);
    write_private(&args.out, &id.to_text())?;
    println!(
        "wrote the identity of {:?} to {} ({})",
        args.name,
        args.out.display(),
        id.public_text()
    );
    println!(
        "for a daemon, its [[daemon]] entry: {}",
        conclave_daemon::Config::key_line(&id)
    );
    println!(
        "for a client the daemons know, its entry: [[client]] name = {:?} {}",
        args.name,
        conclave_daemon::Config::key_line(&id)
    );
    println!(
        "for an administrator (`conclave admin --identity`), its entry: [[admin]] name = {:?} {}",
        args.name,
        conclave_daemon::Config::key_line(&id)
    );
    if let Some(dir) = &args.directory {
        let mut entries: Vec<(String, conclave_crypto::PublicIdentity)> =
            match std::fs::read_to_string(dir) {
                Ok(text) => parse_directory(&text)
                    .with_context(|| format!("reading {}", dir.display()))?
                    .iter()
                    .map(|(n, k)| (n.clone(), k.clone()))
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
            };
        if entries.iter().any(|(n, _)| *n == args.name) {
            bail!("{} already lists {:?}", dir.display(), args.name);
        }
        entries.push((args.name.clone(), id.identity().public()));
        std::fs::write(dir, directory_text(&entries))
            .with_context(|| format!("writing {}", dir.display()))?;
        println!("added {:?} to {}", args.name, dir.display());
    }
    Ok(())
}

/// The secure part of `conclave user`'s arguments.
#[derive(Args)]
pub struct SecureArgs {
    /// Secure groups (docs/secure.md): every view gets a key, every message is sealed.
    #[arg(long)]
    pub secure: bool,
    /// Where the groups' keys come from: `agreement` (the members agree each view's key; needs
    /// --identity and --directory), `daemons` (the daemons derive it from their own key and
    /// hand it over with the view: the integrated architecture, docs/integrated.md) or
    /// `key-graph` (a key server, `conclave keyserver`, registers the members and rekeys the
    /// group: needs --key-server, --identity and --directory; docs/keygraph.md).
    #[arg(long, default_value = "agreement", requires = "secure")]
    pub keys: conclave_client::secure::KeySource,
    /// With --keys daemons: EVS groups (no flush before a view change) whose messages the
    /// daemons reseal when they go out or arrive in a later view than their key's (Optimized
    /// EVS, docs/integrated.md).
    #[arg(long, requires = "secure")]
    pub evs: bool,
    /// With --keys key-graph: the key server's name, as views list it (its identity is the
    /// directory's entry under that name).
    #[arg(long, requires = "secure")]
    pub key_server: Option<String>,
    /// The key agreement protocol a group this client creates uses: gdh, ckd, tgdh, str or bd.
    #[arg(long, default_value = "tgdh")]
    pub protocol: String,
    /// This client's identity file (`conclave keygen`): it signs the key agreement, and proves
    /// the client's name to daemons that know a key for it (with or without --secure).
    #[arg(long)]
    pub identity: Option<PathBuf>,
    /// The trust directory: who may take part.
    #[arg(long)]
    pub directory: Option<PathBuf>,
    /// The daemon's identity key (`ed25519:` and 64 hex digits, its configuration entry's
    /// `key`), which a `tls:` address needs: the connection goes on only if the daemon proves it.
    #[arg(long)]
    pub daemon_key: Option<String>,
}

impl SecureArgs {
    /// The key `--daemon-key` names, if any.
    pub fn daemon_key(&self) -> Result<Option<conclave_crypto::PublicIdentity>> {
        self.daemon_key
            .as_deref()
            .map(|k| {
                conclave_crypto::identity_file::parse_public_text("--daemon-key", k)
                    .map_err(Into::into)
            })
            .transpose()
    }
}

/// An identity file (`conclave keygen`).
pub fn read_identity(path: &Path) -> Result<IdentityFile> {
    IdentityFile::parse(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("reading {}", path.display()))
}

pub fn parse_protocol(s: &str) -> Result<ProtocolId> {
    Ok(match s {
        "gdh" => ProtocolId::Gdh,
        "ckd" => ProtocolId::Ckd,
        "tgdh" => ProtocolId::Tgdh,
        "str" => ProtocolId::Str,
        "bd" => ProtocolId::Bd,
        other => bail!("unknown protocol {other:?} (gdh, ckd, tgdh, str, bd)"),
    })
}

/// A secure event as a JSON object and a line of text.
pub fn secure_event(ev: &SecureEvent) -> (serde_json::Value, String) {
    match ev {
        SecureEvent::View(v) => (
            json!({"ev": "secure_view", "group": v.group, "view": view_text(&v.view),
                   "members": &v.members[..], "epoch": v.epoch, "key": v.fingerprint.to_string()}),
            format!(
                "secure view {} of {} (key {}, epoch {}): {}",
                view_text(&v.view),
                v.group,
                v.fingerprint,
                v.epoch,
                v.members.join(" ")
            ),
        ),
        SecureEvent::Message {
            group,
            sender,
            service,
            view,
            payload,
        } => {
            let text = String::from_utf8_lossy(payload);
            (
                json!({"ev": "message", "group": group, "sender": sender,
                       "service": service_name(*service), "view": view_text(view),
                       "payload": text}),
                format!(
                    "{group} <{sender}> [{}, sealed] {text}",
                    service_name(*service)
                ),
            )
        }
        SecureEvent::ViewEnding { group, view } => (
            json!({"ev": "view_ending", "group": group, "view": view_text(view)}),
            format!(
                "{group}: view {} ending; what is sent now goes in the next",
                view_text(view)
            ),
        ),
        SecureEvent::Untrusted {
            group,
            view,
            members,
        } => (
            json!({"ev": "untrusted", "group": group, "view": view_text(view), "members": members}),
            format!(
                "{group}: view {} has members the directory does not know ({}): no key",
                view_text(view),
                members.join(" ")
            ),
        ),
        SecureEvent::Refused {
            group,
            sender,
            error,
        } => (
            json!({"ev": "refused_input", "group": group, "sender": sender, "error": error.to_string()}),
            format!("{group}: refused from {sender}: {error}"),
        ),
        SecureEvent::Left { group, reason } => (
            json!({"ev": "left", "group": group, "reason": reason}),
            format!("left {group}: {reason}"),
        ),
    }
}

/// `conclave user --secure`: the same commands as a plain user (`join GROUP`, `leave GROUP`,
/// `send [SERVICE] GROUP TEXT`, `sleep MS`, `quit`); every group is secure.
pub async fn secure_user(
    addr: &Address,
    name: &str,
    json_lines: bool,
    linger: u64,
    args: &SecureArgs,
) -> Result<()> {
    let protocol = parse_protocol(&args.protocol)?;
    if args.evs && args.keys != KeySource::Daemons {
        bail!("--evs takes --keys daemons: members that agree their keys need VS");
    }
    if (args.keys == KeySource::KeyGraph) != args.key_server.is_some() {
        bail!("--keys key-graph and --key-server NAME go together");
    }
    let (identity, directory) = match (args.keys, &args.identity, &args.directory) {
        (_, Some(id_path), Some(dir_path)) => {
            let identity = read_identity(id_path)?;
            let directory = parse_directory(
                &std::fs::read_to_string(dir_path)
                    .with_context(|| format!("reading {}", dir_path.display()))?,
            )
            .with_context(|| format!("reading {}", dir_path.display()))?;
            (identity.identity(), directory)
        }
        // The daemons vouch for the members and hand the keys: no identity signs anything.
        (KeySource::Daemons, None, None) => (
            conclave_crypto::Identity::generate(
                conclave_crypto::SigScheme::Ed25519,
                &mut rand_core::OsRng,
            )
            .context("an Ed25519 key")?,
            conclave_gka::Directory::new(),
        ),
        (KeySource::Agreement, _, _) => {
            bail!("--secure with keys agreed by the members needs --identity and --directory")
        }
        (KeySource::KeyGraph, _, _) => {
            bail!("--keys key-graph needs --identity and --directory")
        }
        (KeySource::Daemons, _, _) => {
            bail!("--keys daemons takes neither --identity nor --directory, or both")
        }
    };
    let opts = conclave_client::Options {
        identity: Some(identity.clone()),
        daemon_key: args.daemon_key()?,
        ..Default::default()
    };
    let client = Client::connect_with(addr, name, opts)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let say = |v: serde_json::Value, t: String| {
        if json_lines {
            println!("{v}");
        } else {
            println!("{t}");
        }
    };
    say(
        json!({"ev": "connected", "name": client.name()}),
        match args.keys {
            KeySource::Agreement => {
                format!("connected as {} (secure, {:?})", client.name(), protocol)
            }
            KeySource::Daemons => format!(
                "connected as {} (secure, keys from the daemons)",
                client.name()
            ),
            KeySource::KeyGraph => format!(
                "connected as {} (secure, keys from the key server {})",
                client.name(),
                args.key_server.as_deref().unwrap_or_default()
            ),
        },
    );
    let mut s = SecureClient::new(client, identity, directory);
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut input_open = true;
    let mut linger_until: Option<tokio::time::Instant> = None;
    loop {
        let until = linger_until
            .unwrap_or_else(|| tokio::time::Instant::now() + std::time::Duration::from_secs(3600));
        tokio::select! {
            ev = s.receive() => match ev {
                Ok(ev) => {
                    let (v, t) = secure_event(&ev);
                    say(v, t);
                }
                Err(e) if !e.is_final() => say(json!({"ev": "refused", "error": e.to_string()}), format!("refused: {e}")),
                Err(e) => {
                    say(json!({"ev": "disconnected", "reason": e.to_string()}), e.to_string());
                    bail!("{e}");
                }
            },
            _ = tokio::time::sleep_until(until), if linger_until.is_some() => break,
            line = stdin.next_line(), if input_open => {
                let Some(line) = line? else {
                    input_open = false;
                    linger_until = Some(tokio::time::Instant::now() + std::time::Duration::from_millis(linger));
                    continue;
                };
                let r = match parse_line(&line) {
                    Err(e) => Err(e),
                    Ok(Line::Join(g, _)) => s
                        .join_secure(&g, SecureConfig { keys: args.keys, protocol, evs: args.evs, key_server: args.key_server.clone(), ..SecureConfig::default() })
                        .await
                        .map_err(Into::into),
                    Ok(Line::Leave(g)) => s.leave(&g).await.map_err(Into::into),
                    Ok(Line::Send(service, groups, text)) => match groups.as_slice() {
                        [g] => s.send(g, service, text.as_bytes()).await.map_err(Into::into),
                        _ => Err(anyhow::anyhow!("a secure message goes to one group")),
                    },
                    Ok(Line::Sleep(ms)) => {
                        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                        Ok(())
                    }
                    Ok(Line::Quit) => break,
                    Ok(Line::Ack(_)) => Err(anyhow::anyhow!("secure groups acknowledge flushes themselves")),
                    Ok(Line::Nothing) => Ok(()),
                };
                if let Err(e) = r {
                    say(json!({"ev": "error", "error": format!("{e:#}")}), format!("error: {e:#}"));
                }
            },
        }
    }
    let _ = s.disconnect().await;
    Ok(())
}
