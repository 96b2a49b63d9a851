//! Conclave's wire formats: versioned, bounded, and decoded without trusting a single byte.
//!
//! Every length on the wire is checked against a named limit before anything is allocated, every
//! tag is matched exhaustively, trailing bytes are an error, and no decoder panics on any input
//! (each has a fuzz target in `fuzz/` and a round-trip property test).

pub mod client;
pub mod codec;
pub mod gcs;
pub mod gka;
pub mod keyserver;
pub mod link;
pub mod lkh;
pub mod secure;
pub mod spread;

pub use codec::{DecodeError, Reader, Writer};
