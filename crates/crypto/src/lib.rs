//! Cryptographic building blocks for Conclave.
//!
//! Nothing here is a hand-written primitive: the groups come from `curve25519-dalek` (ristretto255)
//! and `crypto-bigint` (constant-time Montgomery arithmetic for the finite-field groups),
//! signatures from `ed25519-dalek` and `aws-lc-rs` (RSA, for the "paper" suite only), AEAD from
//! `aws-lc-rs`, HKDF from `hkdf` (and from `aws-lc-rs`'s HMAC where one secret gives many keys). This crate adds the shapes the protocols need: one prime-order
//! [`Group`] abstraction, a [`Suite`] choosing group and signature scheme, secrets that are zeroized,
//! redacted and compared in constant time, and a [`Meter`] that counts the expensive operations the
//! papers' cost tables count.
//!
//! Randomness is always passed in (`&mut dyn CryptoRng`); nothing here reads a clock or a global RNG,
//! so a seeded RNG replays a run exactly. The one exception is RSA key generation, which `aws-lc-rs`
//! only offers from its own system RNG; RSA is for reproducing the papers' measurements, never a
//! default.

pub mod aead;
pub mod group;
pub mod hash;
pub mod identity_file;
pub mod kdf;
pub mod meter;
pub mod modp;
pub mod ristretto;
pub mod secret;
pub mod sign;
pub mod static_dh;
pub mod suite;

pub use group::{Group, GroupError};
pub use meter::Meter;
pub use modp::{Modp1024, Modp2048};
pub use ristretto::Ristretto255;
pub use secret::{Fingerprint, GroupKey};
pub use sign::{Identity, PublicIdentity, SigError, SigScheme};
pub use static_dh::{DhError, StaticDh};
pub use suite::Suite;

/// The RNG every API takes: cryptographically secure and object safe.
pub trait CryptoRng: rand_core::RngCore + rand_core::CryptoRng {}
impl<T: rand_core::RngCore + rand_core::CryptoRng> CryptoRng for T {}
