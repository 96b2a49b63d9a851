//! The daemons' configuration (TOML): every daemon of the network with its addresses, the
//! core's settings (the core's own config type, its defaults those deployed), the limits of
//! client sessions, and the faults to inject. Every daemon of a network reads the
//! same file and is told which one it is. Without a file, [`Config::local`] names three daemons
//! on this machine.
//!
//! ```toml
//! [[daemon]]
//! name = "d1"
//! peer = "127.0.0.1:4801"      # UDP, to the other daemons
//! client = "127.0.0.1:4901"    # TCP, for clients
//! tls = "0.0.0.0:4911"         # optional: TLS, for clients (the daemon proves its key)
//! unix = "/tmp/conclave-d1.sock"   # optional: clients on a Unix socket
//! shm = "/tmp/conclave-d1.shm"     # optional: clients on this machine, replies in shared memory
//! admin = "127.0.0.1:5001"     # optional: `conclave admin` (crate::admin: signed in)
//! metrics = "127.0.0.1:9101"   # optional: Prometheus text at any path, to a bearer token
//! metrics_token = "/etc/conclave/d1.metrics-token"  # the token's file (with metrics)
//! key = "ed25519:<64 hex digits>"  # its identity's public key (`conclave keygen`)
//! identity = "/etc/conclave/d1.identity"  # optional: its identity file, read by d1 only
//!
//! [links]                      # optional: how datagrams between daemons are protected
//! mode = "sealed"              # sealed (default), authenticated, or off (docs/links.md)
//!
//! [core.membership]            # optional: the core's settings (conclave_gcs::DaemonConfig)
//! token_loss_ms = 200
//!
//! [faults]                     # optional
//! drop = 0.01
//! partition = [["d1", "d2"], ["d3"]]
//!
//! [[access]]                   # optional, in order: who may join and send (crate::access)
//! groups = "ops*"              # a name, a prefix ending in '*', or '*'
//! join = ["alice", "svc-*"]    # absent: every client
//! send = ["alice"]             # absent: every member
//!
//! [resealing]                  # optional: old group keys kept for Optimized EVS (crate::reseal)
//! keys_per_group = 8           # key-out
//! key_timeout_ms = 30000       # time-out
//!
//! [[admin]]                    # optional: who may use `conclave admin`, besides each daemon's
//! name = "ops"                 # own identity
//! key = "ed25519:<64 hex digits>"
//! ```

use crate::faults::{Faults, LinkFaults};
use crate::link::LinkMode;
use conclave_crypto::identity_file::{parse_public_text, public_text, IdentityFile};
use conclave_crypto::{CryptoRng, PublicIdentity};
use conclave_gcs::DaemonConfig;
use conclave_wire::gcs::{DaemonId, MAX_NAME_BYTES, MAX_RING_MEMBERS};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;

/// One daemon of the network.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DaemonEntry {
    pub name: String,
    pub peer: SocketAddr,
    pub client: Option<SocketAddr>,
    /// TCP with TLS, for clients: the daemon proves its identity (docs/daemon.md).
    pub tls: Option<SocketAddr>,
    pub unix: Option<PathBuf>,
    /// A Unix socket for clients on the daemon's machine whose replies travel through shared
    /// memory (Linux; docs/daemon.md).
    pub shm: Option<PathBuf>,
    /// Spread 4.x clients' TCP port and Unix socket (docs/spread.md); neither unless configured.
    pub spread: Option<SocketAddr>,
    pub spread_unix: Option<PathBuf>,
    pub admin: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    /// The file holding the bearer token a scraper of `metrics` must send
    /// (`Authorization: Bearer <token>`); read by this daemon only. Required with `metrics`.
    pub metrics_token: Option<PathBuf>,
    /// The public key of the daemon's identity (`ed25519:` and 64 hex digits).
    pub key: Option<String>,
    /// Where the daemon finds its identity file (read by that daemon only; `--identity`
    /// overrides it).
    pub identity: Option<PathBuf>,
}

/// How the links between daemons are protected (`[links]`, docs/links.md).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LinksConfig {
    pub mode: LinkMode,
    /// The protocol the daemons agree their key with (tgdh unless another is named).
    pub agreement: crate::daemons_key::Agreement,
}

/// The secret identities of a network's daemons, by name, for running all of them in one process
/// (the demo, tests, benchmarks, the simulator). Wiped when dropped.
#[derive(Default)]
pub struct Identities(BTreeMap<String, std::sync::Arc<IdentityFile>>);

impl Identities {
    pub fn get(&self, daemon: &str) -> Option<std::sync::Arc<IdentityFile>> {
        self.0.get(daemon).cloned()
    }
}

/// The longest `ack_delay_us` allowed (a second).
pub const MAX_ACK_DELAY_US: u64 = 1_000_000;

/// What one connection may make its daemon hold, and how long it may take (`[sessions]`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SessionLimits {
    /// Client connections open at once (including ones not yet connected).
    pub max_connections: usize,
    /// Replies queued for one client and not yet written; a client that lets more pile up (it
    /// does not read) is disconnected.
    pub max_unread_per_client: usize,
    /// A connection that has not said who it is within this long is closed.
    pub handshake_ms: u64,
    /// A request must arrive whole within this long of its first byte, or its connection is
    /// closed: a client that stops in the middle of a frame holds its bytes.
    pub request_ms: u64,
    /// Bytes of incomplete requests all connections together may make the daemon hold; the
    /// connection that goes past it is closed.
    pub max_incomplete_bytes: usize,
    /// Refuse every client whose name no `[[client]]` lists (by default such a client connects
    /// under the name it gives, unproven).
    pub require_client_keys: bool,
    /// How long one acknowledgement (`Sent`) with nothing else for its client may wait for
    /// another reply to go with, in microseconds (the daemon's timer rounds it up to the
    /// millisecond); 0: handed out at once. A sender woken for an acknowledgement alone takes a
    /// processor while its message is on its way to the others.
    pub ack_delay_us: u64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_connections: 2_000,
            max_unread_per_client: 10_000,
            handshake_ms: 5_000,
            request_ms: 10_000,
            max_incomplete_bytes: 64 << 20,
            require_client_keys: false,
            // A sender gets its acknowledgement with the delivery of its message, usually well
            // within this (not a safe message, or on a slow ring). At 1,000 messages a second
            // as deployed, a sender's wake-ups per message fell from 4.0 to 3.5-3.6, and agreed
            // delivery's p50 by a few hundredths at most (docs/performance.md).
            ack_delay_us: 1_000,
        }
    }
}

impl SessionLimits {
    fn validate(&self) -> Result<(), String> {
        if [
            self.max_connections,
            self.max_unread_per_client,
            self.max_incomplete_bytes,
        ]
        .contains(&0)
            || self.handshake_ms == 0
            || self.request_ms == 0
        {
            return Err("sessions: every limit must be above 0".into());
        }
        if self.ack_delay_us > MAX_ACK_DELAY_US {
            // Senders would wait on their windows for acknowledgements held back.
            return Err(format!(
                "sessions: ack_delay_us must be at most {MAX_ACK_DELAY_US}"
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FaultsConfig {
    #[serde(flatten)]
    pub all: LinkFaults,
    /// Per-link faults, by peer name.
    pub link: BTreeMap<String, LinkFaults>,
    /// Sets of daemon names; a daemon reaches only those of its own set.
    pub partition: Option<Vec<Vec<String>>>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub daemon: Vec<DaemonEntry>,
    /// The group communication core's settings, as its own type: `[core]`, `[core.membership]`,
    /// `[core.membership.ordering]`; the defaults are the core's.
    #[serde(default)]
    pub core: DaemonConfig,
    #[serde(default)]
    pub sessions: SessionLimits,
    #[serde(default)]
    pub faults: FaultsConfig,
    #[serde(default)]
    pub links: LinksConfig,
    /// Who may join and send to which groups (`[[access]]`, in order; crate::access).
    #[serde(default)]
    pub access: Vec<crate::access::AccessRule>,
    /// Clients the daemons know an identity key for (`[[client]]`): one that connects under such
    /// a name must prove it holds the key.
    #[serde(default)]
    pub client: Vec<ClientEntry>,
    /// Administrators (`[[admin]]`): besides a daemon's own identity, these keys may sign in to
    /// its admin port (crate::admin).
    #[serde(default)]
    pub admin: Vec<ClientEntry>,
    /// How long old group keys are kept for resealing (Optimized EVS, crate::reseal).
    #[serde(default)]
    pub resealing: crate::reseal::ResealingConfig,
}

/// A client's (or an administrator's) name and the public key of its identity
/// (`conclave keygen`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientEntry {
    pub name: String,
    pub key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// `n` daemons on this machine: d1..dn with peer ports `base+i`, client ports `base+100+i`
    /// and admin ports `base+200+i` (no metrics endpoint: it needs a token).
    pub fn local(n: usize, base: u16) -> Config {
        let at = |p: usize| SocketAddr::from(([127, 0, 0, 1], base + p as u16));
        Config {
            daemon: (1..=n)
                .map(|i| DaemonEntry {
                    name: format!("d{i}"),
                    peer: at(i),
                    client: Some(at(100 + i)),
                    tls: None,
                    unix: None,
                    shm: None,
                    spread: None,
                    spread_unix: None,
                    admin: Some(at(200 + i)),
                    metrics: None,
                    metrics_token: None,
                    key: None,
                    identity: None,
                })
                .collect(),
            core: DaemonConfig::default(),
            sessions: SessionLimits::default(),
            faults: FaultsConfig::default(),
            links: LinksConfig::default(),
            access: Vec::new(),
            client: Vec::new(),
            admin: Vec::new(),
            resealing: Default::default(),
        }
    }

    /// Fresh identities for every daemon, their keys written into the configuration: a
    /// network run in one process. The seeds come from `rng` (the system's, outside tests and
    /// the simulator).
    pub fn with_identities(mut self, rng: &mut dyn CryptoRng) -> (Config, Identities) {
        let mut ids = BTreeMap::new();
        for d in &mut self.daemon {
            let file = IdentityFile::generate(&d.name, rng);
            d.key = Some(file.public_text());
            ids.insert(d.name.clone(), std::sync::Arc::new(file));
        }
        (self, Identities(ids))
    }

    /// Fresh identities for every daemon, written to `dir/<name>.identity` (readable by their
    /// owner alone) and named in the configuration with their keys: a network whose daemons run
    /// as processes of their own on this machine.
    pub fn with_identity_files(
        mut self,
        dir: &std::path::Path,
        rng: &mut dyn CryptoRng,
    ) -> std::io::Result<Config> {
        use std::io::Write;
        for d in &mut self.daemon {
            let file = IdentityFile::generate(&d.name, rng);
            let path = dir.join(format!("{}.identity", d.name));
            let mut o = std::fs::OpenOptions::new();
            o.write(true).create(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                o.mode(0o600);
            }
            o.open(&path)?.write_all(file.to_text().as_bytes())?;
            d.key = Some(file.public_text());
            d.identity = Some(path);
        }
        Ok(self)
    }

    /// Every daemon's name and public key, by id from 1.
    pub fn roster(&self) -> Vec<(String, Option<PublicIdentity>)> {
        self.daemon
            .iter()
            .map(|d| {
                let key = d
                    .key
                    .as_ref()
                    .and_then(|k| parse_public_text(&d.name, k).ok());
                (d.name.clone(), key)
            })
            .collect()
    }

    /// The line that names `file`'s key in a daemon's entry.
    pub fn key_line(file: &IdentityFile) -> String {
        format!("key = \"{}\"", public_text(&file.identity().public()))
    }

    /// `n` daemons on this machine on ports free right now (for tests and the demo).
    pub fn local_on_free_ports(n: usize) -> std::io::Result<Config> {
        let mut c = Config::local(n, 0);
        let mut held_udp = Vec::new();
        let mut held_tcp = Vec::new();
        let mut tcp = || -> std::io::Result<SocketAddr> {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let a = l.local_addr()?;
            held_tcp.push(l);
            Ok(a)
        };
        for d in &mut c.daemon {
            let u = std::net::UdpSocket::bind("127.0.0.1:0")?;
            d.peer = u.local_addr()?;
            held_udp.push(u);
            d.client = Some(tcp()?);
            d.admin = Some(tcp()?);
        }
        Ok(c)
    }

    /// A loopback TCP port free right now that no daemon of this configuration names (for
    /// tests and benches adding a TLS, Spread or metrics port). The ports `local_on_free_ports`
    /// picked are no longer held, so the kernel may offer one of them again: it is skipped.
    pub fn free_tcp_port(&self) -> std::io::Result<SocketAddr> {
        let named: BTreeSet<SocketAddr> = self
            .daemon
            .iter()
            .flat_map(|d| [d.client, d.tls, d.spread, d.admin, d.metrics])
            .flatten()
            .collect();
        let mut held = Vec::new();
        loop {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let a = l.local_addr()?;
            if !named.contains(&a) {
                return Ok(a);
            }
            // Held until a fresh port comes, so the kernel cannot offer this one again.
            held.push(l);
        }
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse(m) => ConfigError::Parse(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// The clients' keys by name (`[[client]]`).
    pub fn client_keys(&self) -> Result<BTreeMap<String, PublicIdentity>, ConfigError> {
        named_keys("client", &self.client)
    }

    /// Who may sign in to `daemon`'s admin port, by name: the `[[admin]]` entries and the
    /// daemon's own identity (under its name).
    pub fn admin_keys(
        &self,
        daemon: &str,
    ) -> Result<BTreeMap<String, PublicIdentity>, ConfigError> {
        let mut keys = named_keys("admin", &self.admin)?;
        if let Some(k) = self
            .daemon
            .iter()
            .find(|d| d.name == daemon)
            .and_then(|d| d.key.as_ref())
        {
            let key =
                parse_public_text(daemon, k).map_err(|e| ConfigError::Invalid(e.to_string()))?;
            keys.insert(daemon.to_owned(), key);
        }
        Ok(keys)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        crate::access::Access::validate(&self.access).map_err(ConfigError::Invalid)?;
        self.client_keys()?;
        named_keys("admin", &self.admin)?;
        if let Some(a) = self
            .admin
            .iter()
            .find(|a| self.daemon.iter().any(|d| d.name == a.name))
        {
            return bad(format!(
                "[[admin]] {:?} is a daemon's name: a daemon's own identity may administer it already",
                a.name
            ));
        }
        if self.daemon.is_empty() {
            return bad("no [[daemon]] is named".into());
        }
        if self.daemon.len() > MAX_RING_MEMBERS {
            return bad(format!("at most {MAX_RING_MEMBERS} daemons"));
        }
        let mut names = BTreeSet::new();
        // A UDP and a TCP socket may share a port number: the sets are per protocol.
        let (mut udp, mut tcp) = (BTreeSet::new(), BTreeSet::new());
        for d in &self.daemon {
            if d.name.is_empty()
                || d.name.len() > 16
                || !d
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return bad(format!(
                    "daemon name {:?}: 1 to 16 letters, digits, '-' or '_'",
                    d.name
                ));
            }
            if !names.insert(&d.name) {
                return bad(format!("daemon {:?} is named twice", d.name));
            }
            if !udp.insert(d.peer) {
                return bad(format!("peer address {} is used twice", d.peer));
            }
            if d.metrics.is_some() && d.metrics_token.is_none() {
                return bad(format!(
                    "daemon {:?} serves metrics but names no metrics_token: a file holding the \
                     bearer token scrapers must send (anyone else is refused)",
                    d.name
                ));
            }
            if d.tls.is_some() && d.key.is_none() {
                return bad(format!(
                    "daemon {:?} has a TLS port but no key: clients check the daemon's key",
                    d.name
                ));
            }
            let sockets = [
                ("unix", &d.unix),
                ("shm", &d.shm),
                ("spread_unix", &d.spread_unix),
            ];
            for (i, (a, pa)) in sockets.iter().enumerate() {
                for (b, pb) in &sockets[i + 1..] {
                    if pa.is_some() && pa == pb {
                        return bad(format!("daemon {:?}: {a} and {b} are one socket", d.name));
                    }
                }
            }
            if d.shm.is_some() && !cfg!(target_os = "linux") {
                return bad(format!(
                    "daemon {:?}: shm sockets need Linux (its shared memory objects)",
                    d.name
                ));
            }
            for a in [d.client, d.tls, d.spread, d.admin, d.metrics]
                .into_iter()
                .flatten()
            {
                if !tcp.insert(a) {
                    return bad(format!("address {a} is used twice"));
                }
            }
        }
        for d in &self.daemon {
            match &d.key {
                Some(k) => {
                    parse_public_text(&format!("daemon {:?}'s key", d.name), k)
                        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
                }
                None if self.links.mode != LinkMode::Off => {
                    return bad(format!(
                        "daemon {:?} has no key: links between daemons are {} by default, so \
                             every daemon names its identity's public key (`conclave keygen`), or \
                             [links] mode = \"off\"",
                        d.name,
                        self.links.mode.name()
                    ));
                }
                None => {}
            }
        }
        let mut keys = BTreeSet::new();
        for d in &self.daemon {
            if let Some(k) = &d.key {
                if !keys.insert(k.as_str()) {
                    return bad(format!("daemon {:?}'s key is another daemon's too", d.name));
                }
            }
        }
        let core = &self.core;
        core.validate()
            .map_err(|e| ConfigError::Invalid(format!("core: {e}")))?;
        self.sessions.validate().map_err(ConfigError::Invalid)?;
        self.resealing.validate().map_err(ConfigError::Invalid)?;
        self.faults.all.validate().map_err(ConfigError::Invalid)?;
        for (peer, l) in &self.faults.link {
            if !names.contains(peer) {
                return bad(format!("faults.link names no daemon {peer:?}"));
            }
            l.validate().map_err(ConfigError::Invalid)?;
        }
        if let Some(sets) = &self.faults.partition {
            self.partition_sets(sets).map_err(ConfigError::Invalid)?;
        }
        Ok(())
    }

    /// The id of a daemon: its place in the list, from 1.
    pub fn id_of(&self, name: &str) -> Option<DaemonId> {
        self.daemon
            .iter()
            .position(|d| d.name == name)
            .map(|i| i as DaemonId + 1)
    }

    pub fn entry(&self, id: DaemonId) -> Option<&DaemonEntry> {
        self.daemon.get((id as usize).checked_sub(1)?)
    }

    /// Partition sets given by daemon names, as ids (each set named by its first daemon).
    pub fn partition_sets(
        &self,
        sets: &[Vec<String>],
    ) -> Result<BTreeMap<String, BTreeSet<DaemonId>>, String> {
        let mut seen = BTreeSet::new();
        let mut out = BTreeMap::new();
        for (i, set) in sets.iter().enumerate() {
            let mut ids = BTreeSet::new();
            for n in set {
                let id = self
                    .id_of(n)
                    .ok_or_else(|| format!("the partition names no daemon {n:?}"))?;
                if !seen.insert(id) {
                    return Err(format!("daemon {n:?} is in two sets of the partition"));
                }
                ids.insert(id);
            }
            out.insert(format!("{i}"), ids);
        }
        Ok(out)
    }

    /// The faults the configuration sets.
    pub fn faults(&self) -> Faults {
        Faults {
            all: self.faults.all.clone(),
            links: self
                .faults
                .link
                .iter()
                .filter_map(|(n, l)| Some((self.id_of(n)?, l.clone())))
                .collect(),
            partition: self
                .faults
                .partition
                .as_ref()
                .and_then(|s| self.partition_sets(s).ok()),
        }
    }
}

/// Names and keys of `[[what]]` entries: names of a client's form, keys that parse, no name twice.
fn named_keys(
    what: &str,
    entries: &[ClientEntry],
) -> Result<BTreeMap<String, PublicIdentity>, ConfigError> {
    let mut keys = BTreeMap::new();
    for c in entries {
        if qualified_name(&c.name, "d").is_err() {
            return Err(ConfigError::Invalid(format!(
                "[[{what}]] {:?}: not a name (1 to 62 bytes, no '#' or control characters)",
                c.name
            )));
        }
        let key = parse_public_text("key", &c.key)
            .map_err(|e| ConfigError::Invalid(format!("[[{what}]] {:?}: key: {e}", c.name)))?;
        if keys.insert(c.name.clone(), key).is_some() {
            return Err(ConfigError::Invalid(format!(
                "[[{what}]] {:?} is named twice",
                c.name
            )));
        }
    }
    Ok(keys)
}

/// A client's name as the daemons know it: its private name and its daemon's, so that names are
/// unique across the network (`alice#d1`).
pub fn qualified_name(private: &str, daemon: &str) -> Result<String, String> {
    let full = format!("{private}#{daemon}");
    if private.is_empty()
        || private.contains('#')
        || private.chars().any(|c| c.is_control())
        || full.len() > MAX_NAME_BYTES
    {
        return Err(format!(
            "a client name is 1 to {} bytes without '#' or control characters",
            MAX_NAME_BYTES - daemon.len() - 1
        ));
    }
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid key line for the tests' configurations.
    fn key(i: u8) -> String {
        let id = conclave_crypto::Identity::ed25519_from_seed(&[i; 32]).unwrap();
        format!("key = \"{}\"\n", public_text(&id.public()))
    }

    #[test]
    fn the_documented_example_parses() {
        let text = format!(
            r#"
[[daemon]]
name = "d1"
peer = "127.0.0.1:4801"
client = "127.0.0.1:4901"
unix = "/tmp/conclave-d1.sock"
shm = "/tmp/conclave-d1.shm"
admin = "127.0.0.1:5001"
metrics = "127.0.0.1:9101"
metrics_token = "/etc/conclave/d1.metrics-token"
{}identity = "/etc/conclave/d1.identity"

[[daemon]]
name = "d2"
peer = "127.0.0.1:4802"
{}
[[daemon]]
name = "d3"
peer = "127.0.0.1:4803"
{}
[core.membership]
token_loss_ms = 200

[faults]
drop = 0.01
partition = [["d1", "d2"], ["d3"]]

[[access]]
groups = "ops*"
join = ["alice", "svc-*"]
send = ["alice"]

[[admin]]
name = "ops"
{}"#,
            key(1),
            key(2),
            key(3),
            key(4)
        );
        let c = Config::parse(&text).unwrap();
        assert_eq!(c.links.mode, LinkMode::Sealed);
        assert!(c.roster().iter().all(|(_, k)| k.is_some()));
        assert_eq!(c.daemon.len(), 3);
        assert_eq!(c.id_of("d3"), Some(3));
        assert_eq!(c.faults().all.drop, 0.01);
        assert_eq!(c.faults().partition.unwrap().len(), 2);
        assert_eq!(c.core.membership.token_loss_ms, 200);
        assert_eq!(c.core.membership.join_ms, 30);
        assert_eq!(c.access.len(), 1);
        assert_eq!(c.access[0].send.as_deref(), Some(&["alice".to_owned()][..]));
        let admins: Vec<String> = c.admin_keys("d2").unwrap().into_keys().collect();
        assert_eq!(admins, ["d2", "ops"]);
    }

    #[test]
    fn bad_configurations_are_clear_errors() {
        let off = "[links]\nmode = \"off\"\n";
        let cases = [
            ("[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n", "has no key"),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\nkey = \"ed25519:00\"\n",
                "32 bytes",
            ),
            (
                &format!(
                    "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n{}[[daemon]]\nname = \"d2\"\npeer = \"127.0.0.1:2\"\n{}",
                    key(1),
                    key(1)
                ),
                "another daemon's",
            ),
            ("[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[links]\nmode = \"open\"\n", "unknown variant"),
            ("", "daemon"),
            ("[[daemon]]\nname = \"d1\"\npeer = \"nowhere\"\n", "invalid"),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:2\"\n",
                "named twice",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[[daemon]]\nname = \"d2\"\npeer = \"127.0.0.1:1\"\n",
                "used twice",
            ),
            ("[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\ncolour = 3\n", "colour"),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[[access]]\ngroups = \"a*b\"\n",
                "access pattern",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[faults]\ndrop = 2.0\n",
                "probability",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[faults]\npartition = [[\"d9\"]]\n",
                "d9",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[core.membership]\ntoken_loss_ms = 5\n[core.membership.ordering]\ntoken_retransmit_ms = 10\n",
                "token_loss_ms",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[core]\nflush_timeout = 9\n",
                "flush_timeout",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[sessions]\nrequest_ms = 0\n",
                "above 0",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[sessions]\nack_delay_us = 1000001\n",
                "ack_delay_us must be at most 1000000",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\nmetrics = \"127.0.0.1:9\"\n",
                "metrics_token",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\nunix = \"/tmp/s\"\nshm = \"/tmp/s\"\n",
                "unix and shm are one socket",
            ),
            (
                "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:1\"\n[[admin]]\nname = \"d1\"\nkey = \"ed25519:00\"\n",
                "32 bytes",
            ),
        ];
        for (text, needle) in cases {
            // Keys are beside the point of the others: links off.
            let text = if needle.contains("key")
                || needle.contains("bytes")
                || needle.contains("daemon's")
                || needle.contains("variant")
            {
                text.to_string()
            } else {
                format!("{text}{off}")
            };
            let text = text.as_str();
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?} gave {e:?}");
        }
    }

    #[test]
    fn a_udp_and_a_tcp_socket_may_share_a_port_number() {
        let text = format!(
            "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:7000\"\nclient = \"127.0.0.1:7000\"\n{}",
            key(1)
        );
        Config::parse(&text).unwrap();
        let text = format!("[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:7000\"\nclient = \"127.0.0.1:7001\"\nadmin = \"127.0.0.1:7001\"\n{}", key(1));
        assert!(Config::parse(&text)
            .unwrap_err()
            .to_string()
            .contains("used twice"));
    }

    #[test]
    fn the_local_default_is_valid_with_identities_and_names_are_qualified() {
        assert!(Config::local(3, 4800).validate().is_err());
        let mut rng = <rand_chacha::ChaCha8Rng as rand_core::SeedableRng>::seed_from_u64(1);
        let (c, ids) = Config::local(3, 4800).with_identities(&mut rng);
        c.validate().unwrap();
        let d2 = ids.get("d2").unwrap();
        assert_eq!(
            c.roster()[1].1.as_ref().unwrap().ed25519_bytes(),
            Some(d2.static_dh().ed25519_public())
        );
        assert_eq!(qualified_name("alice", "d1").unwrap(), "alice#d1");
        assert!(qualified_name("a#b", "d1").is_err());
        assert!(qualified_name("", "d1").is_err());
        assert!(qualified_name(&"x".repeat(70), "d1").is_err());
    }
}
