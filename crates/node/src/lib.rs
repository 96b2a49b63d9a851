//! A Conclave daemon as a pure state machine ([`Node`], docs/daemon.md): the group communication
//! core with its client sessions, the datagrams between daemons, fault injection, limits and the
//! recorder of the history, driven with bytes and time and drained of bytes. No I/O, clock,
//! thread or global randomness here: the daemon's runtime (`conclave-daemon`) moves bytes between
//! sockets and a node, and the simulator (`conclave-sim`) runs the same nodes on a simulated
//! network, with the same configuration and defaults.

pub mod access;
pub mod admin;
pub mod config;
pub mod daemons_key;
pub mod faults;
pub mod frag;
pub mod frames;
pub mod link;
pub mod metrics;
pub mod node;
pub mod record;
pub mod reseal;
pub mod session;

pub use admin::{AdminReply, AdminRequest, Status};
pub use conclave_gcs::{IdMap, Time};
pub use config::{Config, ConfigError};
pub use frames::Frames;
pub use node::{Node, NodeError, NodeOptions, SecretRng};
pub use session::{SessionId, SessionOutput};

/// Tenths of a second since 2024 at `unix_us` (microseconds since the Unix epoch): grows between
/// two starts of a daemon and two connections of a client name, unless they come within a tenth
/// of a second.
pub fn stamp(unix_us: u64) -> u32 {
    ((unix_us / 100_000).saturating_sub(17_043_840_000)) as u32
}
