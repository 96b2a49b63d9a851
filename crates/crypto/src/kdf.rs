//! HKDF-SHA256 (RFC 5869).

use aws_lc_rs::hmac;
use hkdf::Hkdf;
use sha2::Sha256;

/// Derives `N` bytes from input keying material, a salt and a context label.
pub fn derive<const N: usize>(salt: &[u8], ikm: &[u8], info: &[u8]) -> zeroize::Zeroizing<[u8; N]> {
    let hk = Hkdf::<Sha256>::new(Some(salt), ikm);
    let mut out = zeroize::Zeroizing::new([0u8; N]);
    // N is a compile-time constant far below HKDF's 255*32 byte limit.
    hk.expand(info, out.as_mut())
        .expect("HKDF output length within limit");
    out
}

/// Length-prefixed concatenation, so that variable fields cannot be confused in a KDF `info`.
pub fn info(parts: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::with_capacity(parts.iter().map(|p| 4 + p.len()).sum());
    for p in parts {
        v.extend_from_slice(&(p.len() as u32).to_be_bytes());
        v.extend_from_slice(p);
    }
    v
}

/// HKDF with its extract step done once, for deriving many 32-byte keys from one secret (a
/// daemon derives a key per client group and view from the daemons' key).
///
/// [`Expander::expand`] gives what [`derive`]`::<32>` gives for the same salt, input keying
/// material and [`info`] of the same parts, at about a third of the cost: HKDF-Expand of one
/// block is HMAC(PRK, info || 1), and the HMAC state keyed by the PRK is computed once here and
/// copied per derivation. aws-lc-rs holds that state and cleanses it when dropped; the PRK and
/// each output pass through its `Tag`, a plain value on the stack, as they pass through the
/// `hkdf` crate's buffers in [`derive`].
pub struct Expander(hmac::Key);

impl Expander {
    pub fn new(salt: &[u8], ikm: &[u8]) -> Expander {
        let mut prk = zeroize::Zeroizing::new([0u8; 32]);
        prk.copy_from_slice(hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, salt), ikm).as_ref());
        Expander(hmac::Key::new(hmac::HMAC_SHA256, &prk[..]))
    }

    /// 32 bytes for the context `parts`, length-prefixed as [`info`] does.
    pub fn expand(&self, parts: &[&[u8]]) -> zeroize::Zeroizing<[u8; 32]> {
        let mut ctx = hmac::Context::with_key(&self.0);
        for p in parts {
            ctx.update(&(p.len() as u32).to_be_bytes());
            ctx.update(p);
        }
        ctx.update(&[1]);
        let tag = ctx.sign();
        let mut out = zeroize::Zeroizing::new([0u8; 32]);
        out.copy_from_slice(&tag.as_ref()[..32]);
        out
    }
}

impl std::fmt::Debug for Expander {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Expander(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc5869_case_1() {
        let ikm = [0x0b; 22];
        let salt = hex::decode("000102030405060708090a0b0c").unwrap();
        let info = hex::decode("f0f1f2f3f4f5f6f7f8f9").unwrap();
        let okm = super::derive::<42>(&salt, &ikm, &info);
        assert_eq!(
            hex::encode(okm.as_ref()),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
        );
    }

    #[test]
    fn expander_matches_derive() {
        for salt_len in [0usize, 8, 21, 64, 65, 100] {
            let salt = vec![0x5a; salt_len];
            let ikm: Vec<u8> = (0..32).collect();
            let e = super::Expander::new(&salt, &ikm);
            for a in [0usize, 1, 20, 51, 52, 55, 56, 60, 119, 200] {
                let first: Vec<u8> = (0..a).map(|i| i as u8).collect();
                let view = [7u8; 24];
                let parts: [&[u8]; 2] = [&first, &view];
                let want = super::derive::<32>(&salt, &ikm, &super::info(&parts));
                assert_eq!(*e.expand(&parts), *want, "salt {salt_len}, part {a}");
            }
        }
    }
}
