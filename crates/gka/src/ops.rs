//! Group operations that count themselves in a [`Meter`], so each protocol's cost can be held
//! against paper 000's Table II.

use conclave_crypto::{Group, GroupError, Meter};

pub(crate) fn exp<G: Group>(m: &mut Meter, b: &G::Element, s: &G::Scalar) -> G::Element {
    m.exps += 1;
    G::exp(b, s)
}
pub(crate) fn exp_g<G: Group>(m: &mut Meter, s: &G::Scalar) -> G::Element {
    m.exps += 1;
    G::exp_g(s)
}
/// `g^{s_i}` for every scalar, with the encodings, sharing work across the batch.
pub(crate) fn exp_g_batch<G: Group>(
    m: &mut Meter,
    s: &[G::Scalar],
) -> (Vec<G::Element>, Vec<Vec<u8>>) {
    m.exps += s.len() as u64;
    G::exp_g_batch(s)
}
/// Decodes a group element received from another member (never the identity).
pub(crate) fn decode<G: Group>(m: &mut Meter, bytes: &[u8]) -> Result<G::Element, GroupError> {
    m.decodes += 1;
    G::decode(bytes, false)
}
/// [`decode`] of a value that may be the identity (BD's `X` with two members).
pub(crate) fn decode_any<G: Group>(m: &mut Meter, bytes: &[u8]) -> Result<G::Element, GroupError> {
    m.decodes += 1;
    G::decode(bytes, true)
}
/// `1/s`; contributions are drawn non-zero, so this never fails for our own scalars.
pub(crate) fn inv<G: Group>(s: &G::Scalar) -> G::Scalar {
    G::scalar_inv(s).expect("contributions are non-zero")
}
/// Turns a Diffie-Hellman value into the next exponent (a TGDH/STR node key, a CKD channel key).
pub(crate) fn to_scalar<G: Group>(label: &[u8], e: &G::Element) -> G::Scalar {
    G::hash_to_scalar(label, e)
}
