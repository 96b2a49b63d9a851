//! The Conclave daemon (`conclave daemon`): the tokio runtime around a pure node
//! ([`conclave_node::Node`], docs/daemon.md). The node holds the group communication core, the
//! client sessions, datagram batching, fault injection and the recorder; this crate gives it
//! sockets (UDP to the other daemons, TCP, TLS and Unix sockets for clients, and rings of shared
//! memory for clients on its machine), a clock, an admin
//! endpoint, a metrics endpoint, and a file for the history.

pub mod datagrams;
pub mod endpoints;
pub mod reads;
pub mod record;
pub mod server;
pub mod session;
pub mod tls;

pub use conclave_node::{admin, config, faults, frag, link, metrics};
pub use conclave_node::{AdminReply, AdminRequest, Config, ConfigError, Status};
#[cfg(unix)]
pub use server::raise_open_files_limit;
pub use server::{read_identity, start, Options, Running};
