//! A static Diffie-Hellman secret between two Ed25519 identities, by the birational map from
//! Edwards25519 to Curve25519 (RFC 7748's X25519 on the Montgomery form of each key; the same
//! conversion as libsodium's `crypto_sign_ed25519_sk_to_curve25519`). It lets two daemons that
//! know each other's identity share a key before they have exchanged a message, at the price of
//! no forward secrecy: whoever later steals either identity can compute it again. The daemons use
//! it only to protect their links until their contributory key exists (docs/links.md).
//!
//! One key for signing and for key agreement: the signature uses the seed's hash as the Ed25519
//! scalar; X25519 uses the same scalar clamped. Both are standard uses of an Ed25519 key, and
//! what is derived from the shared secret is always bound to both public keys.

use crate::sign::PublicIdentity;
use zeroize::Zeroizing;

/// The X25519 half of an Ed25519 identity. Wiped when dropped.
pub struct StaticDh {
    scalar: Zeroizing<[u8; 32]>,
    public: [u8; 32],
}

impl core::fmt::Debug for StaticDh {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "StaticDh({}, <secret>)", hex::encode(&self.public[..4]))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    #[error("the peer's key is not an Ed25519 key")]
    NotEd25519,
    #[error("the peer's key has small order (it would give a known secret)")]
    WeakKey,
}

impl StaticDh {
    /// The X25519 secret of the Ed25519 identity with this seed (what an identity file keeps).
    pub fn from_ed25519_seed(seed: &[u8; 32]) -> StaticDh {
        let signing = ed25519_dalek::SigningKey::from_bytes(seed);
        let scalar = Zeroizing::new(signing.to_scalar_bytes());
        let public = signing.verifying_key().to_bytes();
        StaticDh { scalar, public }
    }

    /// The Ed25519 public key this secret belongs to.
    pub fn ed25519_public(&self) -> [u8; 32] {
        self.public
    }

    /// The 32-byte shared secret with `peer`; the same at both ends. Refused for keys of small
    /// order, whose result an outsider would know.
    pub fn agree(&self, peer: &PublicIdentity) -> Result<Zeroizing<[u8; 32]>, DhError> {
        let PublicIdentity::Ed25519(vk) = peer else {
            return Err(DhError::NotEd25519);
        };
        if vk.is_weak() {
            return Err(DhError::WeakKey);
        }
        let shared = vk.to_montgomery().mul_clamped(*self.scalar);
        let out = Zeroizing::new(shared.to_bytes());
        if out.iter().all(|&b| b == 0) {
            return Err(DhError::WeakKey);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(seed: &[u8; 32]) -> PublicIdentity {
        crate::Identity::ed25519_from_seed(seed).unwrap().public()
    }

    #[test]
    fn both_ends_get_the_same_secret_and_a_third_another() {
        let (a, b, c) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let (da, db, dc) = (
            StaticDh::from_ed25519_seed(&a),
            StaticDh::from_ed25519_seed(&b),
            StaticDh::from_ed25519_seed(&c),
        );
        let ab = da.agree(&public(&b)).unwrap();
        assert_eq!(*ab, *db.agree(&public(&a)).unwrap());
        assert_ne!(*ab, *dc.agree(&public(&a)).unwrap());
        assert_ne!(*ab, *dc.agree(&public(&b)).unwrap());
        assert_eq!(da.ed25519_public(), public(&a).ed25519_bytes().unwrap());
    }

    #[test]
    fn a_key_of_small_order_is_refused() {
        // The identity point: an Ed25519 key of order 1.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let weak = PublicIdentity::ed25519_from_bytes(&identity).unwrap();
        let d = StaticDh::from_ed25519_seed(&[7u8; 32]);
        assert_eq!(d.agree(&weak).unwrap_err(), DhError::WeakKey);
    }

    #[test]
    fn the_secret_is_x25519_of_the_montgomery_forms() {
        // RFC 7748's X25519 on the converted keys, computed another way: the scalar times the
        // peer's Montgomery point equals the peer's scalar times ours.
        let (a, b) = ([9u8; 32], [10u8; 32]);
        let sa = ed25519_dalek::SigningKey::from_bytes(&a);
        let sb = ed25519_dalek::SigningKey::from_bytes(&b);
        let pa = curve25519_dalek::MontgomeryPoint::mul_base_clamped(sa.to_scalar_bytes());
        assert_eq!(pa, sa.verifying_key().to_montgomery());
        let x = pa.mul_clamped(sb.to_scalar_bytes()).to_bytes();
        assert_eq!(
            *StaticDh::from_ed25519_seed(&a).agree(&public(&b)).unwrap(),
            x
        );
    }
}
