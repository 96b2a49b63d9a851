//! Group key agreement: GDH, CKD, TGDH, STR and BD (paper 000 §4) as pure state machines behind
//! one trait, [`KeyAgreement`], robust to membership events at any round of any protocol.
//!
//! The layer above feeds each new [`View`] and each received message; a protocol answers with
//! [`Transmit`]s and, once the run is complete, a [`SecureView`] holding the view's key. See
//! `core` for how cascaded events are handled, and each protocol module for the paper section it
//! implements and where it departs from it.

#[macro_use]
mod core;
pub mod api;
pub mod bd;
pub mod ckd;
pub mod gdh;
pub mod kat;
mod members;
mod ops;
pub mod script;
pub mod str_proto;
pub mod testbed;
pub mod tgdh;
mod tree;

pub use crate::core::seal;
pub use api::*;
pub use conclave_wire::gka::ProtocolId;

/// Limits a caller may want to check before building a group.
pub mod api_limits {
    /// Largest group a run supports (a message lists at most this many members).
    pub const MAX_GROUP: usize = conclave_wire::gka::MAX_MEMBERS;
}
