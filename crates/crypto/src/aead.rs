//! AEAD for group data: AES-256-GCM (default, hardware accelerated) and ChaCha20-Poly1305, both
//! from `aws-lc-rs`, which measured 2-4x faster here than the pure-Rust `aes-gcm`.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AeadAlg {
    Aes256Gcm,
    ChaCha20Poly1305,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AeadError {
    #[error("authentication failed")]
    Auth,
    #[error("ciphertext shorter than the tag")]
    Truncated,
}

pub const NONCE_BYTES: usize = 12;
pub const TAG_BYTES: usize = 16;

/// A keyed AEAD. The key lives inside `aws-lc-rs`, which cleanses it when dropped.
pub struct Aead {
    key: LessSafeKey,
}

impl core::fmt::Debug for Aead {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Aead({:?}, <redacted>)", self.key.algorithm())
    }
}

impl Aead {
    pub fn new(alg: AeadAlg, key: &[u8; 32]) -> Aead {
        let a = match alg {
            AeadAlg::Aes256Gcm => &AES_256_GCM,
            AeadAlg::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        };
        // Both algorithms take exactly 32-byte keys, so this cannot fail.
        let ub = UnboundKey::new(a, key).expect("32-byte key");
        Aead {
            key: LessSafeKey::new(ub),
        }
    }

    /// Encrypts `plaintext`, returning ciphertext with the tag appended. The caller guarantees
    /// that a nonce is never reused under one key.
    pub fn seal(&self, nonce: [u8; NONCE_BYTES], aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut buf = Vec::with_capacity(plaintext.len() + TAG_BYTES);
        buf.extend_from_slice(plaintext);
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf,
            )
            .expect("plaintext within AEAD limits");
        buf
    }

    /// Encrypts `buf` in place and appends the tag: no copy of the plaintext is left behind.
    pub fn seal_in_place(&self, nonce: [u8; NONCE_BYTES], aad: &[u8], buf: &mut Vec<u8>) {
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), buf)
            .expect("plaintext within AEAD limits");
    }

    /// Encrypts `buf[from..]` in place and appends the tag; what is before `from` (a header
    /// the caller wrote) stays as it is.
    pub fn seal_tail(&self, nonce: [u8; NONCE_BYTES], aad: &[u8], buf: &mut Vec<u8>, from: usize) {
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf[from..],
            )
            .expect("plaintext within AEAD limits");
        buf.extend_from_slice(tag.as_ref());
    }

    /// Encrypts `plaintext` into `out`, which must be `TAG_BYTES` longer: the ciphertext, then
    /// the tag. `plaintext` is left as it is, so one buffer can be sealed for several keys
    /// without a copy of it for each.
    pub fn seal_into(
        &self,
        nonce: [u8; NONCE_BYTES],
        aad: &[u8],
        plaintext: &[u8],
        out: &mut [u8],
    ) {
        assert_eq!(out.len(), plaintext.len() + TAG_BYTES, "room for the tag");
        let (ciphertext, tag) = out.split_at_mut(plaintext.len());
        self.key
            .seal_out_of_place_scatter(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                plaintext,
                ciphertext,
                &[],
                tag,
            )
            .expect("plaintext within AEAD limits");
    }

    /// The tag of `aad` alone (no ciphertext): authentication without encryption.
    pub fn tag(&self, nonce: [u8; NONCE_BYTES], aad: &[u8]) -> [u8; TAG_BYTES] {
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut [],
            )
            .expect("associated data within AEAD limits");
        let mut out = [0u8; TAG_BYTES];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Decrypts `buf` (ciphertext and tag) in place; gives the plaintext's length (it is
    /// `buf[..len]`). On failure `buf` holds nothing of the plaintext.
    pub fn open_in_place(
        &self,
        nonce: [u8; NONCE_BYTES],
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<usize, AeadError> {
        if buf.len() < TAG_BYTES {
            return Err(AeadError::Truncated);
        }
        self.key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), buf)
            .map(|p| p.len())
            .map_err(|_| AeadError::Auth)
    }

    pub fn open(
        &self,
        nonce: [u8; NONCE_BYTES],
        aad: &[u8],
        ciphertext: &[u8],
    ) -> Result<Vec<u8>, AeadError> {
        if ciphertext.len() < TAG_BYTES {
            return Err(AeadError::Truncated);
        }
        let mut buf = ciphertext.to_vec();
        let n = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf,
            )
            .map_err(|_| AeadError::Auth)?
            .len();
        buf.truncate(n);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn round_trip_and_tamper() {
        for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
            let a = Aead::new(alg, &[7; 32]);
            let c = a.seal([1; 12], b"hdr", b"secret data");
            assert_eq!(a.open([1; 12], b"hdr", &c).unwrap(), b"secret data");
            assert_eq!(a.open([1; 12], b"hdx", &c), Err(AeadError::Auth));
            let mut t = c.clone();
            t[0] ^= 1;
            assert_eq!(a.open([1; 12], b"hdr", &t), Err(AeadError::Auth));
            assert_eq!(a.open([1; 12], b"hdr", &c[..3]), Err(AeadError::Truncated));
        }
    }

    #[test]
    fn a_tag_alone_is_a_seal_of_nothing_and_opens_as_one() {
        let a = Aead::new(AeadAlg::Aes256Gcm, &[3; 32]);
        let tag = a.tag([4; 12], b"all of it in the clear");
        assert_eq!(tag[..], a.seal([4; 12], b"all of it in the clear", b"")[..]);
        assert_eq!(
            a.open([4; 12], b"all of it in the clear", &tag).unwrap(),
            b""
        );
        assert_eq!(
            a.open([4; 12], b"all of it in the clear!", &tag),
            Err(AeadError::Auth)
        );
    }

    #[test]
    fn sealing_a_tail_leaves_the_head_and_matches_seal() {
        let a = Aead::new(AeadAlg::Aes256Gcm, &[9; 32]);
        let mut buf = b"head:secret data".to_vec();
        a.seal_tail([2; 12], b"aad", &mut buf, 5);
        assert_eq!(&buf[..5], b"head:");
        assert_eq!(buf[5..], a.seal([2; 12], b"aad", b"secret data")[..]);
        assert_eq!(a.open([2; 12], b"aad", &buf[5..]).unwrap(), b"secret data");
        let mut inplace = buf[5..].to_vec();
        let n = a.open_in_place([2; 12], b"aad", &mut inplace).unwrap();
        assert_eq!(&inplace[..n], b"secret data");
        inplace = buf[5..].to_vec();
        inplace[0] ^= 1;
        assert_eq!(
            a.open_in_place([2; 12], b"aad", &mut inplace),
            Err(AeadError::Auth)
        );
        assert_eq!(
            a.open_in_place([2; 12], b"aad", &mut [0u8; 3]),
            Err(AeadError::Truncated)
        );
    }

    #[test]
    fn sealing_into_another_buffer_matches_seal() {
        for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
            let a = Aead::new(alg, &[5; 32]);
            // Longer than a few blocks, and not a whole number of them.
            let plaintext: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
            let mut out = vec![0u8; plaintext.len() + TAG_BYTES];
            a.seal_into([6; 12], b"aad", &plaintext, &mut out);
            assert_eq!(out, a.seal([6; 12], b"aad", &plaintext));
            assert_eq!(a.open([6; 12], b"aad", &out).unwrap(), plaintext);
            let mut empty = [0u8; TAG_BYTES];
            a.seal_into([6; 12], b"aad", &[], &mut empty);
            assert_eq!(empty[..], a.tag([6; 12], b"aad")[..]);
        }
    }
}
