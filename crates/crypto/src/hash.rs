//! SHA-256 from aws-lc-rs, for digests the protocols take of long inputs at every view (a
//! member list of 1,024 names is about 9 KiB). On processors without SHA instructions its
//! vectorized code is faster than the `sha2` crate's portable one; the digest is the same.

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
}
