//! HKDF-SHA256 (RFC 5869).

use crate::hash::{compress, state_bytes, SHA256_IV};
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
/// material and [`info`] of the same parts. HKDF-Expand of one block is HMAC(PRK, info || 1),
/// and HMAC keyed by the PRK starts from two SHA-256 states (the key's inner and outer pads,
/// each one compression) that are the same for every derivation: they are computed once here,
/// and a derivation of a context of up to 55 bytes is two compressions, one more per further 64
/// bytes (RFC 2104 §4 suggests exactly this precomputation). A daemon derives thousands of keys after each configuration change, and a
/// general HMAC context, copied and fed part by part, cost twice as much. The pads' states, the
/// PRK, the inner hash and the output are held in buffers zeroized when dropped; copies of them
/// that moves and the digest's conversion to bytes leave on the stack are not wiped, as the
/// `hkdf` crate's in [`derive`] are not. The compressions are the `sha2`
/// crate's, with the processor's SHA instructions where it has them (without them, aws-lc's
/// vectorized code would be faster). The known-answer tests below check the result against
/// [`derive`] across SHA-256's block boundaries.
pub struct Expander {
    inner: zeroize::Zeroizing<[u32; 8]>,
    outer: zeroize::Zeroizing<[u32; 8]>,
}

/// [`Expander::expand`] hashes a context of up to 247 bytes (this, and the room its padding
/// leaves) from the stack, a longer one from the heap; a daemon's is under 100 bytes.
const STACK_CONTEXT: usize = 192;

impl Expander {
    pub fn new(salt: &[u8], ikm: &[u8]) -> Expander {
        let mut prk = zeroize::Zeroizing::new([0u8; 32]);
        prk.copy_from_slice(hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, salt), ikm).as_ref());
        let pad = |byte: u8| {
            let mut block = zeroize::Zeroizing::new([byte; 64]);
            for (b, k) in block.iter_mut().zip(prk.iter()) {
                *b ^= k;
            }
            let mut state = zeroize::Zeroizing::new(SHA256_IV);
            compress(&mut state, &block[..]);
            state
        };
        Expander {
            inner: pad(0x36),
            outer: pad(0x5c),
        }
    }

    /// 32 bytes for the context `parts`, length-prefixed as [`info`] does.
    pub fn expand(&self, parts: &[&[u8]]) -> zeroize::Zeroizing<[u8; 32]> {
        let len: usize = parts.iter().map(|p| 4 + p.len()).sum::<usize>() + 1;
        // The context (public: names and view numbers), then SHA-256's padding: 0x80, zeros,
        // and the bit length of everything hashed after the pad block.
        let mut stack = [0u8; STACK_CONTEXT + 72];
        let mut heap = Vec::new();
        let padded = (len + 9).div_ceil(64) * 64;
        let msg: &mut [u8] = if padded <= stack.len() {
            &mut stack[..padded]
        } else {
            heap.resize(padded, 0);
            &mut heap[..]
        };
        let mut at = 0;
        for p in parts {
            msg[at..at + 4].copy_from_slice(&(p.len() as u32).to_be_bytes());
            msg[at + 4..at + 4 + p.len()].copy_from_slice(p);
            at += 4 + p.len();
        }
        msg[at] = 1;
        msg[at + 1] = 0x80;
        let bits = ((64 + len) as u64) * 8;
        msg[padded - 8..].copy_from_slice(&bits.to_be_bytes());
        let mut state = zeroize::Zeroizing::new(*self.inner);
        compress(&mut state, msg);
        // The inner hash, padded: the outer hash's one block after its pad block.
        let mut block = [0u8; 64];
        let inner = zeroize::Zeroizing::new(state_bytes(&state));
        block[..32].copy_from_slice(&inner[..]);
        block[32] = 0x80;
        block[56..].copy_from_slice(&(((64 + 32) as u64) * 8).to_be_bytes());
        *state = *self.outer;
        compress(&mut state, &block[..]);
        zeroize::Zeroize::zeroize(&mut block[..32]);
        zeroize::Zeroizing::new(state_bytes(&state))
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
            for a in [0usize, 1, 20, 51, 52, 55, 56, 60, 119, 200, 231, 232, 300] {
                let first: Vec<u8> = (0..a).map(|i| i as u8).collect();
                let view = [7u8; 24];
                let parts: [&[u8]; 2] = [&first, &view];
                let want = super::derive::<32>(&salt, &ikm, &super::info(&parts));
                assert_eq!(*e.expand(&parts), *want, "salt {salt_len}, part {a}");
            }
        }
    }
}
