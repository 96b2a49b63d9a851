//! The admin protocol: one JSON object a line each way over TCP (`conclave admin` speaks it).
//!
//! Whoever reaches the admin port could shut the daemon down or cut the network in two, so a
//! connection must first prove it holds an administrator's identity key: the daemon opens with a
//! fresh nonce, the administrator answers with its name and its Ed25519 signature of
//! [`admin_proof_message`]. The keys that may are the daemon's own (the operator running it holds
//! its identity file) and those `[[admin]]` lists. Anything else is refused, counted
//! (`conclave_admin_refusals`) and the connection closed.
//!
//! ```text
//! <- {"daemon":"d1","challenge":"<64 hex digits>"}
//! -> {"name":"ops","signature":"<128 hex digits>"}
//! <- {"ok":true}
//! ```
//!
//! Then requests, each answered by one line:
//!
//! ```text
//! {"cmd":"status"}
//! {"cmd":"partition","sets":[["d1","d2"],["d3"]]}
//! {"cmd":"heal"}
//! {"cmd":"drop","rate":0.1}                       (optionally "peer":"d2")
//! {"cmd":"delay","ms":20,"jitter_ms":5}           (optionally "peer":"d2")
//! {"cmd":"dup","rate":0.05}                       (optionally "peer":"d2")
//! {"cmd":"pause","ms":1000}
//! {"cmd":"clear"}                                 (every fault off)
//! {"cmd":"shutdown"}
//! {"cmd":"metrics"}                               (the metrics endpoint's text)
//! ```
//!
//! Each request gets one line back: `{"ok":true,...}` or `{"ok":false,"error":"..."}`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest admin request line, in bytes.
pub const MAX_ADMIN_LINE: usize = 64 * 1024;
/// Longest pause `conclave admin pause` may ask for.
pub const MAX_PAUSE_MS: u64 = 60_000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    Status,
    Partition {
        sets: Vec<Vec<String>>,
    },
    Heal,
    Drop {
        rate: f64,
        #[serde(default)]
        peer: Option<String>,
    },
    Delay {
        ms: u64,
        #[serde(default)]
        jitter_ms: u64,
        #[serde(default)]
        peer: Option<String>,
    },
    Dup {
        rate: f64,
        #[serde(default)]
        peer: Option<String>,
    },
    Pause {
        ms: u64,
    },
    Clear,
    Shutdown,
    /// The daemon's metrics in Prometheus' text format (what the metrics endpoint serves).
    Metrics,
}

/// The daemon's first line on an admin connection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminChallenge {
    pub daemon: String,
    /// 32 bytes, in hex.
    pub challenge: String,
}

/// The administrator's answer to the challenge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminProof {
    /// An `[[admin]]` name, or the daemon's own.
    pub name: String,
    /// Ed25519 signature of [`admin_proof_message`], in hex.
    pub signature: String,
}

/// What an administrator signs to be let in: bound to the daemon, so that a proof made for one
/// daemon cannot be replayed to another, and to its fresh nonce.
pub fn admin_proof_message(daemon: &str, nonce: &[u8; 32]) -> Vec<u8> {
    let mut m = b"conclave admin proof v1\0".to_vec();
    m.extend_from_slice(daemon.as_bytes());
    m.push(0);
    m.extend_from_slice(nonce);
    m
}

/// The daemon's state, as `status` reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub daemon: String,
    pub incarnation: u32,
    /// The phase of the ring protocol: operational, gather, commit or recovery.
    pub phase: String,
    /// The current ring, `seq@rep`, if one is installed.
    pub ring: Option<String>,
    pub members: Vec<String>,
    /// Client groups and connections are accepted.
    pub ready: bool,
    pub clients: usize,
    /// Client groups with members or changes on their way.
    #[serde(default)]
    pub groups: usize,
    pub connections: usize,
    pub faults: bool,
    /// The ring's progress: highest sequence number seen, all received up to, delivered up to,
    /// messages waiting for the token.
    #[serde(default)]
    pub progress: Option<(u64, u64, u64, usize)>,
    /// Input refused from each peer (a daemon's name, or "unknown" for an address that is no
    /// configured daemon), by reason.
    #[serde(default)]
    pub peer_refusals: BTreeMap<String, BTreeMap<String, u64>>,
    /// The key the daemons of the ring agreed among themselves, if one is.
    #[serde(default)]
    pub daemons_key: Option<DaemonsKeyStatus>,
}

/// The daemons' key in force at a daemon (its fingerprint only: never the key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonsKeyStatus {
    /// The view of the daemons' group it was agreed for: `ring seq@representative/index`.
    pub view: String,
    pub members: Vec<String>,
    pub fingerprint: String,
    /// Peers (this daemon among them) its links send to under it.
    pub peers_on_it: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdminReply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

impl AdminReply {
    pub fn ok() -> Self {
        AdminReply {
            ok: true,
            error: None,
            status: None,
            metrics: None,
        }
    }
    pub fn error(e: impl Into<String>) -> Self {
        AdminReply {
            ok: false,
            error: Some(e.into()),
            status: None,
            metrics: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_requests_parse() {
        for line in [
            r#"{"cmd":"status"}"#,
            r#"{"cmd":"partition","sets":[["d1","d2"],["d3"]]}"#,
            r#"{"cmd":"heal"}"#,
            r#"{"cmd":"drop","rate":0.1}"#,
            r#"{"cmd":"drop","rate":0.1,"peer":"d2"}"#,
            r#"{"cmd":"delay","ms":20,"jitter_ms":5}"#,
            r#"{"cmd":"dup","rate":0.05}"#,
            r#"{"cmd":"pause","ms":1000}"#,
            r#"{"cmd":"clear"}"#,
            r#"{"cmd":"shutdown"}"#,
            r#"{"cmd":"metrics"}"#,
        ] {
            let r: AdminRequest = serde_json::from_str(line).unwrap();
            let back: AdminRequest =
                serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
            assert_eq!(r, back);
        }
        assert!(serde_json::from_str::<AdminRequest>(r#"{"cmd":"explode"}"#).is_err());
    }
}
