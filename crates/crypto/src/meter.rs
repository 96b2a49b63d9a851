//! Counters of the operations that the papers' Table II counts.

use serde::{Deserialize, Serialize};

/// Expensive operations performed by one member (or along one path, see `critical` in `gka`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meter {
    /// Full exponentiations (scalar multiplications) with a secret or random exponent.
    pub exps: u64,
    /// Exponentiations with a small public exponent (BD's step 3; Table II leaves them out).
    pub small_exps: u64,
    /// Signatures made.
    pub sigs: u64,
    /// Signatures verified.
    pub verifs: u64,
    /// Group elements received and decoded (each checked to be in the group: a point
    /// decompression on ristretto255, a subgroup check, that is an exponentiation, with MODP).
    #[serde(default)]
    pub decodes: u64,
}

impl Meter {
    pub fn add(&mut self, other: &Meter) {
        self.exps += other.exps;
        self.small_exps += other.small_exps;
        self.sigs += other.sigs;
        self.verifs += other.verifs;
        self.decodes += other.decodes;
    }
    pub fn since(&self, earlier: &Meter) -> Meter {
        Meter {
            exps: self.exps - earlier.exps,
            small_exps: self.small_exps - earlier.small_exps,
            sigs: self.sigs - earlier.sigs,
            verifs: self.verifs - earlier.verifs,
            decodes: self.decodes - earlier.decodes,
        }
    }
    /// A total order used to pick the longer of two paths: weighted by the typical relative cost
    /// of each operation (a verification and an exponentiation cost about the same on ristretto255,
    /// a signature about half, a decoding about an eighth), ties broken by exponentiations, then
    /// verifications, signatures and decodings, so that two paths of equal weight are equal
    /// only if every count is.
    pub fn weight(&self) -> (u64, u64, u64, u64, u64) {
        (
            16 * self.exps + 8 * self.sigs + 16 * self.verifs + self.decodes,
            self.exps,
            self.verifs,
            self.sigs,
            self.decodes,
        )
    }
}
