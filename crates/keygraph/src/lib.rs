//! Key-graph group key distribution (Wong, Gouda, Lam, SIGCOMM 1998: paper 001), for large
//! one-to-many groups whose members trust one key server.
//!
//! - [`index`]: key tree arithmetic with typed indices;
//! - [`tree`] and [`complete`]: the key graphs (a star is a tree of height 1) and their rekeying,
//!   user-, key- and group-oriented (§3), plus batch rekeying;
//! - [`merkle`]: one signature for a batch of rekey messages (§4);
//! - [`server`] and [`member`]: the two ends, as pure state machines.
//!
//! Departures from the 1998 choices, and why: keys travel under AES-256-GCM (or
//! ChaCha20-Poly1305) instead of DES-CBC, whose 56-bit keys fall to exhaustive search; digests are
//! SHA-256 instead of MD5, which has practical collisions; signatures are Ed25519 (RSA-2048 in
//! the paper suite) instead of RSA-512, which has been factored. Each item's associated data binds
//! group, epoch and key references, which DES-CBC could not.

pub mod complete;
pub mod index;
pub mod member;
pub mod merkle;
pub mod persist;
pub mod register;
pub mod seal;
pub mod server;
pub mod tree;

pub use index::{NodeIndex, Slot};
pub use member::{Applied, Member, MemberConfig, MemberError};
pub use persist::StateError;
pub use register::{Admit, RegisterError, Registered, Registrar, Registration, Welcomed};
pub use server::{
    JoinAck, RekeyStats, Server, ServerConfig, ServerError, ServerEvent, Transmit, UserId,
};

/// The class of key graph (paper 001 §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GraphKind {
    /// One group key over the individual keys.
    Star,
    /// A key tree of the given degree.
    Tree { degree: u32 },
    /// A key for every subset of members; at most `complete::MAX_COMPLETE_MEMBERS`.
    Complete,
}

/// How new keys are packed into rekey messages (paper 001 §3.3-§3.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// One message per set of members needing the same keys, all of them under one key.
    User,
    /// Each new key encrypted once, messages combining what each set of members needs.
    Key,
    /// One message for the whole group.
    Group,
}

/// How rekey messages are authenticated (paper 001 §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Signing {
    /// No signature: members trust whoever holds the keys (insiders could forge).
    None,
    /// One signature per message.
    PerMessage,
    /// One signature per rekey over a Merkle tree of its messages.
    Batch,
}
