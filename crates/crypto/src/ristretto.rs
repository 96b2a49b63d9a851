//! ristretto255 (RFC 9496) from `curve25519-dalek`: the default group.

use crate::group::{Group, GroupError};
use crate::CryptoRng;
use curve25519_dalek::constants::RISTRETTO_BASEPOINT_TABLE;
use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::Identity;
use sha2::{Digest, Sha512};

/// The ristretto255 prime-order group.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ristretto255;

impl Group for Ristretto255 {
    type Scalar = Scalar;
    type Element = RistrettoPoint;
    const NAME: &'static str = "ristretto255";
    const ELEMENT_BYTES: usize = 32;
    const SCALAR_BYTES: usize = 32;

    fn random_scalar(rng: &mut dyn CryptoRng) -> Scalar {
        loop {
            let mut wide = [0u8; 64];
            rng.fill_bytes(&mut wide);
            let s = Scalar::from_bytes_mod_order_wide(&wide);
            zeroize::Zeroize::zeroize(&mut wide);
            if s != Scalar::ZERO {
                return s;
            }
        }
    }
    fn exp_g(s: &Scalar) -> RistrettoPoint {
        s * RISTRETTO_BASEPOINT_TABLE
    }
    fn exp(b: &RistrettoPoint, s: &Scalar) -> RistrettoPoint {
        b * s
    }
    fn mul(a: &RistrettoPoint, b: &RistrettoPoint) -> RistrettoPoint {
        a + b
    }
    fn div(a: &RistrettoPoint, b: &RistrettoPoint) -> RistrettoPoint {
        a - b
    }
    fn exp_small(b: &RistrettoPoint, k: u64) -> RistrettoPoint {
        b * Scalar::from(k)
    }
    fn identity() -> RistrettoPoint {
        RistrettoPoint::identity()
    }
    fn is_identity(e: &RistrettoPoint) -> bool {
        *e == RistrettoPoint::identity()
    }
    fn scalar_mul(a: &Scalar, b: &Scalar) -> Scalar {
        a * b
    }
    fn scalar_inv(a: &Scalar) -> Option<Scalar> {
        if *a == Scalar::ZERO {
            None
        } else {
            Some(a.invert())
        }
    }
    fn scalar_from_u64(k: u64) -> Scalar {
        Scalar::from(k)
    }
    fn hash_to_scalar(domain: &[u8], e: &RistrettoPoint) -> Scalar {
        let mut h = Sha512::new();
        h.update((domain.len() as u64).to_be_bytes());
        h.update(domain);
        h.update(e.compress().as_bytes());
        Scalar::from_hash(h)
    }
    fn encode(e: &RistrettoPoint) -> Vec<u8> {
        e.compress().as_bytes().to_vec()
    }
    // Computing with half the exponent and then `double_and_compress_batch` yields the encodings
    // of the results with one field inversion for the whole batch instead of one per element.
    fn exp_batch(bases: &[&RistrettoPoint], s: &Scalar) -> (Vec<RistrettoPoint>, Vec<Vec<u8>>) {
        let half = s * Scalar::from(2u64).invert();
        let halves: Vec<RistrettoPoint> = bases.iter().map(|b| *b * half).collect();
        let enc = RistrettoPoint::double_and_compress_batch(&halves)
            .into_iter()
            .map(|c| c.as_bytes().to_vec())
            .collect();
        let elems = halves.iter().map(|h| h + h).collect();
        (elems, enc)
    }
    fn exp_g_batch_encoded(scalars: &[Scalar]) -> Vec<Vec<u8>> {
        let inv2 = Scalar::from(2u64).invert();
        let halves: Vec<RistrettoPoint> = scalars
            .iter()
            .map(|s| &(s * inv2) * RISTRETTO_BASEPOINT_TABLE)
            .collect();
        RistrettoPoint::double_and_compress_batch(&halves)
            .into_iter()
            .map(|c| c.as_bytes().to_vec())
            .collect()
    }
    fn decode(bytes: &[u8], allow_identity: bool) -> Result<RistrettoPoint, GroupError> {
        let c = CompressedRistretto::from_slice(bytes).map_err(|_| GroupError::BadLength {
            expected: 32,
            got: bytes.len(),
        })?;
        let p = c.decompress().ok_or(GroupError::NotInGroup)?;
        if !allow_identity && p == RistrettoPoint::identity() {
            return Err(GroupError::Identity);
        }
        Ok(p)
    }
    fn encode_scalar(s: &Scalar) -> zeroize::Zeroizing<Vec<u8>> {
        zeroize::Zeroizing::new(s.to_bytes().to_vec())
    }
    fn decode_scalar(bytes: &[u8]) -> Result<Scalar, GroupError> {
        let arr: [u8; 32] = bytes.try_into().map_err(|_| GroupError::BadLength {
            expected: 32,
            got: bytes.len(),
        })?;
        let s = Option::<Scalar>::from(Scalar::from_canonical_bytes(arr))
            .ok_or(GroupError::BadScalar)?;
        if s == Scalar::ZERO {
            return Err(GroupError::BadScalar);
        }
        Ok(s)
    }
}
