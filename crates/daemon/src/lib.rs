//! The Conclave daemon (`conclave daemon`): the tokio shell around the group communication core
//! (docs/daemon.md). The core ([`conclave_gcs::Daemon`]) is a pure state machine; this crate
//! gives it sockets (UDP to the other daemons, TCP and Unix sockets for clients), a clock, a
//! configuration, an admin endpoint with fault injection, metrics, and a recorder of the history.

pub mod admin;
pub mod config;
pub mod faults;
pub mod frag;
pub mod metrics;
pub mod record;
pub mod server;
pub mod session;

pub use admin::{AdminReply, AdminRequest, Status};
pub use config::{Config, ConfigError};
pub use server::{start, Options, Running};
