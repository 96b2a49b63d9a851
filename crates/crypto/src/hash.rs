//! SHA-256 from aws-lc-rs, for digests the protocols take of long inputs at every view (a
//! member list of 1,024 names is about 9 KiB). On processors without SHA instructions its
//! vectorized code is faster than the `sha2` crate's portable one; the digest is the same.
//! And bare compressions, for inputs of a block or two hashed by the thousand.

/// An incremental SHA-256.
#[derive(Clone)]
pub struct Sha256(aws_lc_rs::digest::Context);

impl Sha256 {
    pub fn new() -> Sha256 {
        Sha256(aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256))
    }
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data)
    }
    pub fn finish(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.finish().as_ref());
        out
    }
}

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

/// SHA-256's initial state (FIPS 180-4 §5.3.3).
pub(crate) const SHA256_IV: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// SHA-256's compression of whole 64-byte blocks into `state`: the `sha2` crate's, which uses
/// the processor's SHA instructions where it has them. For hashes of a block or two taken by
/// the thousand (a key per group at every view change), where a general context's set-up and
/// finish cost more than the compressions.
pub(crate) fn compress(state: &mut [u32; 8], blocks: &[u8]) {
    debug_assert_eq!(blocks.len() % 64, 0);
    for b in blocks.chunks_exact(64) {
        sha2::compress256(state, std::slice::from_ref(b.into()));
    }
}

/// The digest of `state` as bytes.
pub(crate) fn state_bytes(state: &[u32; 8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// SHA-256 of the concatenation of `parts`, at most 55 bytes in all (one block). The block,
/// which may hold a secret, is zeroized.
pub(crate) fn one_block(parts: &[&[u8]]) -> [u8; 32] {
    let mut block = zeroize::Zeroizing::new([0u8; 64]);
    let mut at = 0;
    for p in parts {
        block[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    assert!(at <= 55, "one block holds at most 55 bytes of input");
    block[at] = 0x80;
    block[56..].copy_from_slice(&((at as u64) * 8).to_be_bytes());
    let mut state = zeroize::Zeroizing::new(SHA256_IV);
    compress(&mut state, &block[..]);
    state_bytes(&state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    #[test]
    fn equals_sha2_across_block_boundaries() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        for split in [0, 1, 55, 56, 63, 64, 65, 200, 300] {
            let mut h = Sha256::new();
            h.update(&data[..split]);
            h.update(&data[split..]);
            let want: [u8; 32] = sha2::Sha256::digest(&data).into();
            assert_eq!(h.finish(), want, "split at {split}");
        }
    }

    #[test]
    fn one_block_equals_sha2() {
        let data: Vec<u8> = (0..55u32).map(|i| (i * 13) as u8).collect();
        for len in [0, 1, 18, 50, 54, 55] {
            for split in [0, len / 2, len] {
                let want: [u8; 32] = sha2::Sha256::digest(&data[..len]).into();
                let got = one_block(&[&data[..split], &data[split..len]]);
                assert_eq!(got, want, "{len} bytes split at {split}");
            }
        }
    }
}
