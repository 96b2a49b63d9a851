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
//! unix = "/tmp/conclave-d1.sock"   # optional: clients on a Unix socket
//! admin = "127.0.0.1:5001"     # optional: `conclave admin`
//! metrics = "127.0.0.1:9101"   # optional: Prometheus text at any path
//!
//! [core.membership]            # optional: the core's settings (conclave_gcs::DaemonConfig)
//! token_loss_ms = 200
//!
//! [faults]                     # optional
//! drop = 0.01
//! partition = [["d1", "d2"], ["d3"]]
//! ```

use crate::faults::{Faults, LinkFaults};
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
    pub unix: Option<PathBuf>,
    pub admin: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
}

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
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_connections: 2_000,
            max_unread_per_client: 10_000,
            handshake_ms: 5_000,
            request_ms: 10_000,
            max_incomplete_bytes: 64 << 20,
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
    /// `n` daemons on this machine: d1..dn with peer ports `base+i`, client ports `base+100+i`,
    /// admin ports `base+200+i` and metrics ports `base+300+i`.
    pub fn local(n: usize, base: u16) -> Config {
        let at = |p: usize| SocketAddr::from(([127, 0, 0, 1], base + p as u16));
        Config {
            daemon: (1..=n)
                .map(|i| DaemonEntry {
                    name: format!("d{i}"),
                    peer: at(i),
                    client: Some(at(100 + i)),
                    unix: None,
                    admin: Some(at(200 + i)),
                    metrics: Some(at(300 + i)),
                })
                .collect(),
            core: DaemonConfig::default(),
            sessions: SessionLimits::default(),
            faults: FaultsConfig::default(),
        }
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
            d.metrics = Some(tcp()?);
        }
        Ok(c)
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

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
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
            for a in [d.client, d.admin, d.metrics].into_iter().flatten() {
                if !tcp.insert(a) {
                    return bad(format!("address {a} is used twice"));
                }
            }
        }
        let core = &self.core;
        core.validate()
            .map_err(|e| ConfigError::Invalid(format!("core: {e}")))?;
        self.sessions.validate().map_err(ConfigError::Invalid)?;
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

    #[test]
    fn the_documented_example_parses() {
        let text = r#"
[[daemon]]
name = "d1"
peer = "127.0.0.1:4801"
client = "127.0.0.1:4901"
unix = "/tmp/conclave-d1.sock"
admin = "127.0.0.1:5001"
metrics = "127.0.0.1:9101"

[[daemon]]
name = "d2"
peer = "127.0.0.1:4802"

[[daemon]]
name = "d3"
peer = "127.0.0.1:4803"

[core.membership]
token_loss_ms = 200

[faults]
drop = 0.01
partition = [["d1", "d2"], ["d3"]]
"#;
        let c = Config::parse(text).unwrap();
        assert_eq!(c.daemon.len(), 3);
        assert_eq!(c.id_of("d3"), Some(3));
        assert_eq!(c.faults().all.drop, 0.01);
        assert_eq!(c.faults().partition.unwrap().len(), 2);
        assert_eq!(c.core.membership.token_loss_ms, 200);
        assert_eq!(c.core.membership.join_ms, 30);
    }

    #[test]
    fn bad_configurations_are_clear_errors() {
        let cases = [
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
        ];
        for (text, needle) in cases {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?} gave {e:?}");
        }
    }

    #[test]
    fn a_udp_and_a_tcp_socket_may_share_a_port_number() {
        let text =
            "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:7000\"\nclient = \"127.0.0.1:7000\"\n";
        Config::parse(text).unwrap();
        let text = "[[daemon]]\nname = \"d1\"\npeer = \"127.0.0.1:7000\"\nclient = \"127.0.0.1:7001\"\nadmin = \"127.0.0.1:7001\"\n";
        assert!(Config::parse(text)
            .unwrap_err()
            .to_string()
            .contains("used twice"));
    }

    #[test]
    fn the_local_default_is_valid_and_names_are_qualified() {
        Config::local(3, 4800).validate().unwrap();
        assert_eq!(qualified_name("alice", "d1").unwrap(), "alice#d1");
        assert!(qualified_name("a#b", "d1").is_err());
        assert!(qualified_name("", "d1").is_err());
        assert!(qualified_name(&"x".repeat(70), "d1").is_err());
    }
}
