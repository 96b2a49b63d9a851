//! The prime-order group abstraction shared by every key agreement protocol.
//!
//! GDH factors contributions out (it needs `1/r mod q`) and BD divides elements, so the group must
//! have prime order `q` with every operation well defined; ristretto255 and the RFC 5114 subgroups
//! of MODP groups both qualify. Elements decoded from the wire are checked to lie in the group.

use crate::CryptoRng;

/// Why bytes could not be turned into a group element or scalar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("element encoding has {got} bytes, expected {expected}")]
    BadLength { expected: usize, got: usize },
    #[error("bytes do not encode an element of the group")]
    NotInGroup,
    #[error("the identity element is not allowed here")]
    Identity,
    #[error("scalar encoding is not reduced or is zero")]
    BadScalar,
}

/// A cyclic group of prime order `q`, written multiplicatively as in the papers
/// (`exp(b, s)` is `b^s`; for ristretto255 that is a scalar multiplication).
pub trait Group: Clone + Send + Sync + 'static {
    /// An exponent modulo `q`. Zeroized on drop by the implementation's type.
    type Scalar: Clone + Send + Sync + zeroize::Zeroize;
    /// A group element.
    type Element: Clone + PartialEq + Send + Sync + core::fmt::Debug;

    /// Short name used in reports ("ristretto255", "modp1024-160").
    const NAME: &'static str;
    /// Bytes in an encoded element.
    const ELEMENT_BYTES: usize;
    /// Bytes in an encoded scalar.
    const SCALAR_BYTES: usize;

    /// A uniformly random non-zero scalar.
    fn random_scalar(rng: &mut dyn CryptoRng) -> Self::Scalar;
    /// `g^s` for the fixed generator (may use precomputed tables).
    fn exp_g(s: &Self::Scalar) -> Self::Element;
    /// `b^s`.
    fn exp(b: &Self::Element, s: &Self::Scalar) -> Self::Element;
    /// `a * b`.
    fn mul(a: &Self::Element, b: &Self::Element) -> Self::Element;
    /// `a / b`.
    fn div(a: &Self::Element, b: &Self::Element) -> Self::Element;
    /// `b^k` for a small public integer `k` (BD's "small exponentiations").
    fn exp_small(b: &Self::Element, k: u64) -> Self::Element;
    /// The neutral element.
    fn identity() -> Self::Element;
    fn is_identity(e: &Self::Element) -> bool;

    fn scalar_mul(a: &Self::Scalar, b: &Self::Scalar) -> Self::Scalar;
    /// `1/a mod q`; `None` for zero.
    fn scalar_inv(a: &Self::Scalar) -> Option<Self::Scalar>;
    fn scalar_from_u64(k: u64) -> Self::Scalar;

    /// Maps an element to a scalar through SHA-512 with a domain label, so that a DH value can
    /// serve as the next exponent (the key of a TGDH/STR node, a CKD pairwise key).
    fn hash_to_scalar(domain: &[u8], e: &Self::Element) -> Self::Scalar;

    fn encode(e: &Self::Element) -> Vec<u8>;
    /// `b^s` for every base, with the results' encodings: what a controller does before
    /// broadcasting a list of values. Implementations may share work across the batch.
    fn exp_batch(bases: &[&Self::Element], s: &Self::Scalar) -> (Vec<Self::Element>, Vec<Vec<u8>>) {
        let elems: Vec<Self::Element> = bases.iter().map(|b| Self::exp(b, s)).collect();
        let enc = elems.iter().map(Self::encode).collect();
        (elems, enc)
    }
    /// `g^{s_i}` for every scalar, with the results' encodings, batched as [`Group::exp_batch`].
    fn exp_g_batch(scalars: &[Self::Scalar]) -> (Vec<Self::Element>, Vec<Vec<u8>>) {
        let elems: Vec<Self::Element> = scalars.iter().map(Self::exp_g).collect();
        let enc = elems.iter().map(Self::encode).collect();
        (elems, enc)
    }
    /// The encodings of `g^{s_i}`, batched as [`Group::exp_batch`].
    fn exp_g_batch_encoded(scalars: &[Self::Scalar]) -> Vec<Vec<u8>> {
        scalars
            .iter()
            .map(|s| Self::encode(&Self::exp_g(s)))
            .collect()
    }
    /// Decodes and checks membership in the prime-order group. Rejects the identity unless
    /// `allow_identity`.
    fn decode(bytes: &[u8], allow_identity: bool) -> Result<Self::Element, GroupError>;
    fn encode_scalar(s: &Self::Scalar) -> zeroize::Zeroizing<Vec<u8>>;
    fn decode_scalar(bytes: &[u8]) -> Result<Self::Scalar, GroupError>;
}
