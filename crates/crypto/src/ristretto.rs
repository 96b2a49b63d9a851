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

/// A ristretto255 exponent, wiped when dropped. `curve25519-dalek`'s `Scalar` is `Copy`, so a
/// secret held as one would stay behind in every place it was copied to; this one is moved or
/// cloned, and each copy is wiped (temporaries inside one operation are the library's).
#[derive(Clone, PartialEq, Eq)]
pub struct WipedScalar(Scalar);

impl zeroize::Zeroize for WipedScalar {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}

impl Drop for WipedScalar {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

/// `g^{s/2}` for each `s`: doubled and compressed in one batch, they give the encodings of the
/// `g^s` with one field inversion for the lot.
fn halves_of_g(scalars: &[WipedScalar]) -> Vec<RistrettoPoint> {
    let inv2 = Scalar::from(2u64).invert();
    scalars
        .iter()
        .map(|s| &WipedScalar(s.0 * inv2).0 * RISTRETTO_BASEPOINT_TABLE)
        .collect()
}

/// The encodings of `2h` for each `h`, with one field inversion for the lot.
fn double_and_encode(halves: &[RistrettoPoint]) -> Vec<Vec<u8>> {
    RistrettoPoint::double_and_compress_batch(halves)
        .into_iter()
        .map(|c| c.as_bytes().to_vec())
        .collect()
}

impl Group for Ristretto255 {
    type Scalar = WipedScalar;
    type Element = RistrettoPoint;
    const NAME: &'static str = "ristretto255";
    const ELEMENT_BYTES: usize = 32;
    const SCALAR_BYTES: usize = 32;

    fn random_scalar(rng: &mut dyn CryptoRng) -> WipedScalar {
        loop {
            let mut wide = [0u8; 64];
            rng.fill_bytes(&mut wide);
            let s = WipedScalar(Scalar::from_bytes_mod_order_wide(&wide));
            zeroize::Zeroize::zeroize(&mut wide);
            if s.0 != Scalar::ZERO {
                return s;
            }
        }
    }
    fn exp_g(s: &WipedScalar) -> RistrettoPoint {
        &s.0 * RISTRETTO_BASEPOINT_TABLE
    }
    fn exp(b: &RistrettoPoint, s: &WipedScalar) -> RistrettoPoint {
        b * s.0
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
    fn scalar_mul(a: &WipedScalar, b: &WipedScalar) -> WipedScalar {
        WipedScalar(a.0 * b.0)
    }
    fn scalar_inv(a: &WipedScalar) -> Option<WipedScalar> {
        if a.0 == Scalar::ZERO {
            None
        } else {
            Some(WipedScalar(a.0.invert()))
        }
    }
    fn scalar_from_u64(k: u64) -> WipedScalar {
        WipedScalar(Scalar::from(k))
    }
    fn hash_to_scalar(domain: &[u8], e: &RistrettoPoint) -> WipedScalar {
        let mut h = Sha512::new();
        h.update((domain.len() as u64).to_be_bytes());
        h.update(domain);
        h.update(e.compress().as_bytes());
        WipedScalar(Scalar::from_hash(h))
    }
    fn encode(e: &RistrettoPoint) -> Vec<u8> {
        e.compress().as_bytes().to_vec()
    }
    // Computing with half the exponent and then `double_and_compress_batch` yields the encodings
    // of the results with one field inversion for the whole batch instead of one per element.
    fn exp_batch(
        bases: &[&RistrettoPoint],
        s: &WipedScalar,
    ) -> (Vec<RistrettoPoint>, Vec<Vec<u8>>) {
        let half = WipedScalar(s.0 * Scalar::from(2u64).invert());
        let half = &half.0;
        let halves: Vec<RistrettoPoint> = bases.iter().map(|b| *b * half).collect();
        let enc = double_and_encode(&halves);
        let elems = halves.iter().map(|h| h + h).collect();
        (elems, enc)
    }
    fn exp_g_batch(scalars: &[WipedScalar]) -> (Vec<RistrettoPoint>, Vec<Vec<u8>>) {
        let halves = halves_of_g(scalars);
        let enc = double_and_encode(&halves);
        (halves.iter().map(|h| h + h).collect(), enc)
    }
    fn exp_g_batch_encoded(scalars: &[WipedScalar]) -> Vec<Vec<u8>> {
        double_and_encode(&halves_of_g(scalars))
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
    fn encode_scalar(s: &WipedScalar) -> zeroize::Zeroizing<Vec<u8>> {
        let mut b = s.0.to_bytes();
        let v = zeroize::Zeroizing::new(b.to_vec());
        zeroize::Zeroize::zeroize(&mut b);
        v
    }
    fn decode_scalar(bytes: &[u8]) -> Result<WipedScalar, GroupError> {
        let arr: [u8; 32] = bytes.try_into().map_err(|_| GroupError::BadLength {
            expected: 32,
            got: bytes.len(),
        })?;
        let s = WipedScalar(
            Option::<Scalar>::from(Scalar::from_canonical_bytes(arr))
                .ok_or(GroupError::BadScalar)?,
        );
        if s.0 == Scalar::ZERO {
            return Err(GroupError::BadScalar);
        }
        Ok(s)
    }
}
