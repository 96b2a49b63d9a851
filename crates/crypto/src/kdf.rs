//! HKDF-SHA256 (RFC 5869).

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
}
