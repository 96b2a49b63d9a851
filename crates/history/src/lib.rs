//! Histories of group communication runs and their checker.
//!
//! [`record`] is the history format (JSON lines), written by the simulator and by the daemons'
//! `--record`; [`check`] verifies a history against the properties of Conclave's reliability
//! specification and names every violation with the lines that show it.

pub mod check;
pub mod record;
pub mod wire;

pub use check::{check, Config, Violation, DAEMONS_GROUP};
pub use record::{Event, Record, Service, ViewId};
