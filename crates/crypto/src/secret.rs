//! Secret key material: zeroized on drop, redacted in `Debug`, compared in constant time.

use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// A 256-bit group key (or any 32-byte secret).
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct GroupKey([u8; 32]);

impl GroupKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        GroupKey(bytes)
    }
    /// The raw bytes, for feeding a KDF or an AEAD. Do not log them.
    pub fn expose(&self) -> &[u8; 32] {
        &self.0
    }
    /// A public, one-way short name of the key, safe to print and compare across members.
    pub fn fingerprint(&self) -> Fingerprint {
        // Label and key fit one block, hashed with no general context: a member takes a key
        // per group at every view change, and this is a share of what that costs.
        let d = crate::hash::one_block(&[b"conclave key fp v2", &self.0]);
        let mut f = [0u8; 8];
        f.copy_from_slice(&d[..8]);
        Fingerprint(f)
    }
}

impl PartialEq for GroupKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}
impl Eq for GroupKey {}

impl core::fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "GroupKey(<redacted> fp={})", self.fingerprint())
    }
}

/// First 8 bytes of a domain-separated SHA-256 of a key, printed as hex.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fingerprint(pub [u8; 8]);

impl core::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}
impl core::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn debug_is_redacted_and_eq_works() {
        let k = GroupKey::from_bytes([0xAB; 32]);
        let s = format!("{k:?}");
        assert!(!s.to_lowercase().contains("abab"), "{s}");
        assert_eq!(k, GroupKey::from_bytes([0xAB; 32]));
        assert_ne!(k, GroupKey::from_bytes([0xAC; 32]));
        assert_ne!(
            k.fingerprint(),
            GroupKey::from_bytes([0xAC; 32]).fingerprint()
        );
    }
}
