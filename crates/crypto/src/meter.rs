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
}

impl Meter {
    pub fn add(&mut self, other: &Meter) {
        self.exps += other.exps;
        self.small_exps += other.small_exps;
        self.sigs += other.sigs;
        self.verifs += other.verifs;
    }
    pub fn since(&self, earlier: &Meter) -> Meter {
        Meter {
            exps: self.exps - earlier.exps,
            small_exps: self.small_exps - earlier.small_exps,
            sigs: self.sigs - earlier.sigs,
            verifs: self.verifs - earlier.verifs,
        }
    }
    /// A total order used to pick the longer of two paths: weighted by the typical relative cost
    /// of each operation (a verification and an exponentiation cost about the same on ristretto255,
    /// a signature about half), ties broken by exponentiations.
    pub fn weight(&self) -> (u64, u64) {
        (2 * self.exps + self.sigs + 2 * self.verifs, self.exps)
    }
}
