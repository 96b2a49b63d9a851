//! Member identities: Ed25519 (default) or RSA-2048 PKCS#1 v1.5 with SHA-256 (the "paper" suite,
//! signing only, from `aws-lc-rs`). Ed25519 signs with `aws-lc-rs` (9 us here against 15 us for
//! `ed25519-dalek`; Ed25519 signatures are deterministic, so both give the same bytes) and verifies
//! with `ed25519-dalek`'s strict check, which refuses non-canonical and small-order encodings. The papers used 1024-bit RSA; `aws-lc-rs` generates no key
//! below 2048 bits, so the paper suite signs with 2048-bit keys and is slower than theirs in
//! proportion.

use crate::CryptoRng;
use std::sync::Arc;

/// Which signature scheme a suite uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SigScheme {
    Ed25519,
    Rsa2048,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigError {
    #[error("signature does not verify")]
    BadSignature,
    #[error("signature or key has the wrong length or format")]
    Malformed,
    #[error("key generation failed")]
    KeyGen,
    #[error("signing failed")]
    Sign,
}

/// A member's private signing identity.
#[derive(Clone)]
pub enum Identity {
    Ed25519(Arc<Ed25519Key>),
    Rsa(Arc<aws_lc_rs::rsa::KeyPair>),
}

impl core::fmt::Debug for Identity {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Identity::Ed25519(_) => f.write_str("Identity::Ed25519(<redacted>)"),
            Identity::Rsa(_) => f.write_str("Identity::Rsa(<redacted>)"),
        }
    }
}

/// One Ed25519 key, held by both libraries: `aws-lc-rs` signs, `ed25519-dalek` names the public
/// key.
pub struct Ed25519Key {
    signer: aws_lc_rs::signature::Ed25519KeyPair,
    public: ed25519_dalek::VerifyingKey,
}

/// A member's public verification key.
#[derive(Clone, Debug)]
pub enum PublicIdentity {
    Ed25519(ed25519_dalek::VerifyingKey),
    Rsa(Arc<Vec<u8>>),
}

impl Identity {
    /// A fresh identity. Ed25519 keys come from `rng` (reproducible); RSA keys from the system RNG.
    pub fn generate(scheme: SigScheme, rng: &mut dyn CryptoRng) -> Result<Identity, SigError> {
        match scheme {
            SigScheme::Ed25519 => {
                let mut seed = zeroize::Zeroizing::new([0u8; 32]);
                rng.fill_bytes(seed.as_mut());
                Identity::ed25519_from_seed(&seed)
            }
            SigScheme::Rsa2048 => {
                let kp = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048)
                    .map_err(|_| SigError::KeyGen)?;
                Ok(Identity::Rsa(Arc::new(kp)))
            }
        }
    }

    /// The Ed25519 identity of a 32-byte secret seed (what an identity file keeps).
    pub fn ed25519_from_seed(seed: &[u8; 32]) -> Result<Identity, SigError> {
        let signer = aws_lc_rs::signature::Ed25519KeyPair::from_seed_unchecked(&seed[..])
            .map_err(|_| SigError::KeyGen)?;
        let public = ed25519_dalek::SigningKey::from_bytes(seed).verifying_key();
        Ok(Identity::Ed25519(Arc::new(Ed25519Key { signer, public })))
    }

    pub fn scheme(&self) -> SigScheme {
        match self {
            Identity::Ed25519(_) => SigScheme::Ed25519,
            Identity::Rsa(_) => SigScheme::Rsa2048,
        }
    }

    pub fn public(&self) -> PublicIdentity {
        match self {
            Identity::Ed25519(k) => PublicIdentity::Ed25519(k.public),
            Identity::Rsa(kp) => {
                use aws_lc_rs::signature::KeyPair;
                PublicIdentity::Rsa(Arc::new(kp.public_key().as_ref().to_vec()))
            }
        }
    }

    pub fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, SigError> {
        match self {
            Identity::Ed25519(k) => Ok(k.signer.sign(msg).as_ref().to_vec()),
            Identity::Rsa(kp) => {
                let mut sig = vec![0u8; kp.public_modulus_len()];
                // PKCS#1 v1.5 is deterministic; the RNG argument is unused by the scheme.
                let rng = aws_lc_rs::rand::SystemRandom::new();
                kp.sign(&aws_lc_rs::signature::RSA_PKCS1_SHA256, &rng, msg, &mut sig)
                    .map_err(|_| SigError::Sign)?;
                Ok(sig)
            }
        }
    }
}

impl PublicIdentity {
    /// An Ed25519 public key from its 32 bytes; refused if they are no point of the curve.
    pub fn ed25519_from_bytes(bytes: &[u8; 32]) -> Result<PublicIdentity, SigError> {
        ed25519_dalek::VerifyingKey::from_bytes(bytes)
            .map(PublicIdentity::Ed25519)
            .map_err(|_| SigError::Malformed)
    }

    /// The 32 bytes of an Ed25519 public key (`None` for RSA).
    pub fn ed25519_bytes(&self) -> Option<[u8; 32]> {
        match self {
            PublicIdentity::Ed25519(vk) => Some(vk.to_bytes()),
            PublicIdentity::Rsa(_) => None,
        }
    }

    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<(), SigError> {
        match self {
            PublicIdentity::Ed25519(vk) => {
                let sig =
                    ed25519_dalek::Signature::from_slice(sig).map_err(|_| SigError::Malformed)?;
                vk.verify_strict(msg, &sig)
                    .map_err(|_| SigError::BadSignature)
            }
            PublicIdentity::Rsa(der) => {
                let pk = aws_lc_rs::signature::UnparsedPublicKey::new(
                    &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
                    der.as_slice(),
                );
                pk.verify(msg, sig).map_err(|_| SigError::BadSignature)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    #[test]
    fn ed25519_sign_verify() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
        let id = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
        let sig = id.sign(b"hello").unwrap();
        id.public().verify(b"hello", &sig).unwrap();
        assert_eq!(
            id.public().verify(b"hellp", &sig),
            Err(SigError::BadSignature)
        );
        assert_eq!(
            id.public().verify(b"hello", &sig[1..]),
            Err(SigError::Malformed)
        );
        assert!(!format!("{id:?}").contains(&hex::encode(&sig[..4])));
    }

    #[test]
    fn ed25519_signatures_match_the_reference_implementation() {
        use rand_core::RngCore;
        for seed in 0..8 {
            let id = Identity::generate(
                SigScheme::Ed25519,
                &mut rand_chacha::ChaCha20Rng::seed_from_u64(seed),
            )
            .unwrap();
            let mut sk = [0u8; 32];
            rand_chacha::ChaCha20Rng::seed_from_u64(seed).fill_bytes(&mut sk);
            let dalek = ed25519_dalek::SigningKey::from_bytes(&sk);
            use ed25519_dalek::Signer;
            let msg = [seed as u8; 77];
            assert_eq!(id.sign(&msg).unwrap(), dalek.sign(&msg).to_bytes().to_vec());
            assert_eq!(
                format!("{:?}", id.public()),
                format!("{:?}", PublicIdentity::Ed25519(dalek.verifying_key()))
            );
        }
    }

    #[test]
    fn an_identity_comes_back_from_its_seed_and_its_public_key_from_its_bytes() {
        let seed = [9u8; 32];
        let a = Identity::ed25519_from_seed(&seed).unwrap();
        let b = Identity::ed25519_from_seed(&seed).unwrap();
        assert_eq!(a.sign(b"m").unwrap(), b.sign(b"m").unwrap());
        let bytes = a.public().ed25519_bytes().unwrap();
        let p = PublicIdentity::ed25519_from_bytes(&bytes).unwrap();
        p.verify(b"m", &a.sign(b"m").unwrap()).unwrap();
        // Not every 32 bytes are a point.
        let mut bad = [0u8; 32];
        bad[31] = 0x80;
        bad[0] = 2;
        assert!((0..=255u8).any(|x| {
            bad[1] = x;
            PublicIdentity::ed25519_from_bytes(&bad).is_err()
        }));
    }

    #[test]
    fn rsa_sign_verify() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
        let id = Identity::generate(SigScheme::Rsa2048, &mut rng).unwrap();
        let sig = id.sign(b"hello").unwrap();
        id.public().verify(b"hello", &sig).unwrap();
        assert_eq!(
            id.public().verify(b"hellp", &sig),
            Err(SigError::BadSignature)
        );
    }
}
