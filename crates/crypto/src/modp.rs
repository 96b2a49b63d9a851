//! Finite-field groups: the prime-order subgroups of RFC 5114 §2.1 (1024-bit p, 160-bit q, the
//! size the papers measured) and §2.3 (2048-bit p, 256-bit q).
//!
//! Arithmetic is `crypto-bigint`'s constant-time Montgomery form. Exponents are scalars modulo
//! `q`, so an exponentiation costs `bits(q)` squarings, as with the papers' 160-bit exponents.
//! Decoding checks `0 < x < p` and `x^q = 1` (and refuses the identity unless asked to accept it), which costs one (short) exponentiation per decoded
//! element; the papers' code skipped this check, we do not (wire input is hostile).

use crate::group::{Group, GroupError};
use crate::CryptoRng;
use crypto_bigint::modular::runtime_mod::{DynResidue, DynResidueParams};
use crypto_bigint::{Encoding, NonZero, RandomMod, Uint, U256, U512};
use sha2::{Digest, Sha512};
use std::sync::OnceLock;

/// A scalar modulo a subgroup order of at most 256 bits.
#[derive(Clone, PartialEq, Eq)]
pub struct ModpScalar(U256);

impl zeroize::Zeroize for ModpScalar {
    // Through the integer's own `Zeroize` (volatile writes): a plain store of zero into a value
    // about to be dropped is one the compiler may leave out.
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}
impl Drop for ModpScalar {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(self);
    }
}

struct Params<const L: usize> {
    p: Uint<L>,
    p_params: DynResidueParams<L>,
    g: DynResidue<L>,
    q: U256,
    q_params: DynResidueParams<4>,
    q_bits: usize,
}

macro_rules! modp_group {
    ($name:ident, $limbs:expr, $label:expr, $p:expr, $g:expr, $q:expr, $doc:expr) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name;

        impl $name {
            fn params() -> &'static Params<$limbs> {
                static P: OnceLock<Params<$limbs>> = OnceLock::new();
                P.get_or_init(|| {
                    let p = Uint::<$limbs>::from_be_hex($p);
                    let p_params = DynResidueParams::new(&p);
                    let g = DynResidue::new(&Uint::<$limbs>::from_be_hex($g), p_params);
                    let q = U256::from_be_hex($q);
                    let q_params = DynResidueParams::new(&q);
                    let q_bits = q.bits() as usize;
                    Params {
                        p,
                        p_params,
                        g,
                        q,
                        q_params,
                        q_bits,
                    }
                })
            }
        }

        impl Group for $name {
            type Scalar = ModpScalar;
            type Element = DynResidue<$limbs>;
            const NAME: &'static str = $label;
            const ELEMENT_BYTES: usize = $limbs * 8;
            const SCALAR_BYTES: usize = 32;

            fn random_scalar(rng: &mut dyn CryptoRng) -> ModpScalar {
                let q = NonZero::new(Self::params().q).unwrap();
                let mut rng = RngAdapter(rng);
                loop {
                    let s = U256::random_mod(&mut rng, &q);
                    if s != U256::ZERO {
                        return ModpScalar(s);
                    }
                }
            }
            fn exp_g(s: &ModpScalar) -> Self::Element {
                let pr = Self::params();
                pr.g.pow_bounded_exp(&s.0, pr.q_bits)
            }
            fn exp(b: &Self::Element, s: &ModpScalar) -> Self::Element {
                b.pow_bounded_exp(&s.0, Self::params().q_bits)
            }
            fn mul(a: &Self::Element, b: &Self::Element) -> Self::Element {
                a * b
            }
            fn div(a: &Self::Element, b: &Self::Element) -> Self::Element {
                // b is a non-zero residue (decoded elements are in the subgroup), so it is invertible.
                let (inv, _) = b.invert();
                a * inv
            }
            fn exp_small(b: &Self::Element, k: u64) -> Self::Element {
                b.pow_bounded_exp(&Uint::<1>::from_u64(k), 64)
            }
            fn identity() -> Self::Element {
                DynResidue::one(Self::params().p_params)
            }
            fn is_identity(e: &Self::Element) -> bool {
                *e == Self::identity()
            }
            fn scalar_mul(a: &ModpScalar, b: &ModpScalar) -> ModpScalar {
                let qp = Self::params().q_params;
                ModpScalar((DynResidue::new(&a.0, qp) * DynResidue::new(&b.0, qp)).retrieve())
            }
            fn scalar_inv(a: &ModpScalar) -> Option<ModpScalar> {
                if a.0 == U256::ZERO {
                    return None;
                }
                let (inv, ok) = DynResidue::new(&a.0, Self::params().q_params).invert();
                if bool::from(ok) {
                    Some(ModpScalar(inv.retrieve()))
                } else {
                    None
                }
            }
            fn scalar_from_u64(k: u64) -> ModpScalar {
                let q = NonZero::new(Self::params().q).unwrap();
                ModpScalar(U256::from_u64(k).rem(&q))
            }
            fn hash_to_scalar(domain: &[u8], e: &Self::Element) -> ModpScalar {
                let mut h = Sha512::new();
                h.update((domain.len() as u64).to_be_bytes());
                h.update(domain);
                h.update(Self::encode(e));
                let wide = U512::from_be_slice(&h.finalize());
                let q = NonZero::new(Self::params().q.resize::<8>()).unwrap();
                let s: U256 = wide.rem(&q).resize();
                // A zero scalar has probability 2^-160 or less; map it to one so callers need no case.
                ModpScalar(if s == U256::ZERO { U256::ONE } else { s })
            }
            fn encode(e: &Self::Element) -> Vec<u8> {
                e.retrieve().to_be_bytes().as_ref().to_vec()
            }
            fn decode(bytes: &[u8], allow_identity: bool) -> Result<Self::Element, GroupError> {
                let pr = Self::params();
                if bytes.len() != Self::ELEMENT_BYTES {
                    return Err(GroupError::BadLength {
                        expected: Self::ELEMENT_BYTES,
                        got: bytes.len(),
                    });
                }
                let x = Uint::<$limbs>::from_be_slice(bytes);
                if x == Uint::ZERO || x >= pr.p {
                    return Err(GroupError::NotInGroup);
                }
                let r = DynResidue::new(&x, pr.p_params);
                if r.pow_bounded_exp(&pr.q, pr.q_bits) != Self::identity() {
                    return Err(GroupError::NotInGroup);
                }
                if !allow_identity && r == Self::identity() {
                    return Err(GroupError::Identity);
                }
                Ok(r)
            }
            fn encode_scalar(s: &ModpScalar) -> zeroize::Zeroizing<Vec<u8>> {
                zeroize::Zeroizing::new(s.0.to_be_bytes().to_vec())
            }
            fn decode_scalar(bytes: &[u8]) -> Result<ModpScalar, GroupError> {
                if bytes.len() != 32 {
                    return Err(GroupError::BadLength {
                        expected: 32,
                        got: bytes.len(),
                    });
                }
                let s = U256::from_be_slice(bytes);
                if s == U256::ZERO || s >= Self::params().q {
                    return Err(GroupError::BadScalar);
                }
                Ok(ModpScalar(s))
            }
        }
    };
}

modp_group!(
    Modp1024,
    16,
    "modp1024-160",
    "B10B8F96A080E01DDE92DE5EAE5D54EC52C99FBCFB06A3C69A6A9DCA52D23B616073E28675A23D189838EF1E2EE652C013ECB4AEA906112324975C3CD49B83BFACCBDD7D90C4BD7098488E9C219A73724EFFD6FAE5644738FAA31A4FF55BCCC0A151AF5F0DC8B4BD45BF37DF365C1A65E68CFDA76D4DA708DF1FB2BC2E4A4371",
    "A4D1CBD5C3FD34126765A442EFB99905F8104DD258AC507FD6406CFF14266D31266FEA1E5C41564B777E690F5504F213160217B4B01B886A5E91547F9E2749F4D7FBD7D3B9A92EE1909D0D2263F80A76A6A24C087A091F531DBF0A0169B6A28AD662A4D18E73AFA32D779D5918D08BC8858F4DCEF97C2A24855E6EEB22B3B2E5",
    "000000000000000000000000F518AA8781A8DF278ABA4E7D64B7CB9D49462353",
    "RFC 5114 §2.1: 1024-bit MODP group with a 160-bit prime-order subgroup (the papers' size)."
);

modp_group!(
    Modp2048,
    32,
    "modp2048-256",
    "87A8E61DB4B6663CFFBBD19C651959998CEEF608660DD0F25D2CEED4435E3B00E00DF8F1D61957D4FAF7DF4561B2AA3016C3D91134096FAA3BF4296D830E9A7C209E0C6497517ABD5A8A9D306BCF67ED91F9E6725B4758C022E0B1EF4275BF7B6C5BFC11D45F9088B941F54EB1E59BB8BC39A0BF12307F5C4FDB70C581B23F76B63ACAE1CAA6B7902D52526735488A0EF13C6D9A51BFA4AB3AD8347796524D8EF6A167B5A41825D967E144E5140564251CCACB83E6B486F6B3CA3F7971506026C0B857F689962856DED4010ABD0BE621C3A3960A54E710C375F26375D7014103A4B54330C198AF126116D2276E11715F693877FAD7EF09CADB094AE91E1A1597",
    "3FB32C9B73134D0B2E77506660EDBD484CA7B18F21EF205407F4793A1A0BA12510DBC15077BE463FFF4FED4AAC0BB555BE3A6C1B0C6B47B1BC3773BF7E8C6F62901228F8C28CBB18A55AE31341000A650196F931C77A57F2DDF463E5E9EC144B777DE62AAAB8A8628AC376D282D6ED3864E67982428EBC831D14348F6F2F9193B5045AF2767164E1DFC967C1FB3F2E55A4BD1BFFE83B9C80D052B985D182EA0ADB2A3B7313D3FE14C8484B1E052588B9B7D2BBD2DF016199ECD06E1557CD0915B3353BBB64E0EC377FD028370DF92B52C7891428CDC67EB6184B523D1DB246C32F63078490F00EF8D647D148D47954515E2327CFEF98C582664B4C0F6CC41659",
    "8CF83642A709A097B447997640129DA299B1A47D1EB3750BA308B0FE64F5FBD3",
    "RFC 5114 §2.3: 2048-bit MODP group with a 256-bit prime-order subgroup."
);

/// `crypto-bigint` wants `impl CryptoRngCore`; our APIs pass `&mut dyn CryptoRng`.
struct RngAdapter<'a>(&'a mut dyn CryptoRng);
impl rand_core::RngCore for RngAdapter<'_> {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill_bytes(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.0.try_fill_bytes(dest)
    }
}
impl rand_core::CryptoRng for RngAdapter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    fn check_group<G: Group>() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let a = G::random_scalar(&mut rng);
        let b = G::random_scalar(&mut rng);
        // (g^a)^b == (g^b)^a
        let ga = G::exp_g(&a);
        let gb = G::exp_g(&b);
        assert_eq!(G::exp(&ga, &b), G::exp(&gb, &a));
        // batched exponentiations agree with single ones
        let (els, enc) = G::exp_batch(&[&ga, &gb], &b);
        assert_eq!(els, vec![G::exp(&ga, &b), G::exp(&gb, &b)]);
        assert_eq!(enc, vec![G::encode(&els[0]), G::encode(&els[1])]);
        assert_eq!(
            G::exp_g_batch_encoded(&[a.clone(), b.clone()]),
            vec![G::encode(&ga), G::encode(&gb)]
        );
        assert_eq!(
            G::exp_g_batch(&[a.clone(), b.clone()]),
            (
                vec![ga.clone(), gb.clone()],
                vec![G::encode(&ga), G::encode(&gb)]
            )
        );
        // inverse exponents factor out
        let ainv = G::scalar_inv(&a).unwrap();
        assert_eq!(G::exp(&G::exp(&gb, &a), &ainv), gb);
        // mul/div and small exponents
        assert_eq!(G::div(&G::mul(&ga, &gb), &gb), ga);
        assert_eq!(G::exp_small(&ga, 3), G::mul(&ga, &G::mul(&ga, &ga)));
        // encoding round trip and membership checks
        let enc = G::encode(&ga);
        assert_eq!(enc.len(), G::ELEMENT_BYTES);
        assert_eq!(G::decode(&enc, false).unwrap(), ga);
        assert!(G::decode(&enc[1..], false).is_err());
        assert_eq!(
            G::decode(&G::encode(&G::identity()), false),
            Err(GroupError::Identity)
        );
        assert!(G::decode(&G::encode(&G::identity()), true).is_ok());
        let s = G::encode_scalar(&a);
        assert!(G::decode_scalar(&s).is_ok());
    }

    #[test]
    fn modp1024_is_a_prime_order_group() {
        let pr = Modp1024::params();
        // g generates the order-q subgroup: g != 1 and g^q == 1.
        assert_ne!(pr.g, Modp1024::identity());
        assert_eq!(pr.g.pow_bounded_exp(&pr.q, pr.q_bits), Modp1024::identity());
        assert_eq!(pr.q_bits, 160);
        check_group::<Modp1024>();
    }

    #[test]
    fn modp2048_is_a_prime_order_group() {
        let pr = Modp2048::params();
        assert_ne!(pr.g, Modp2048::identity());
        assert_eq!(pr.g.pow_bounded_exp(&pr.q, pr.q_bits), Modp2048::identity());
        assert_eq!(pr.q_bits, 256);
        check_group::<Modp2048>();
    }

    #[test]
    fn ristretto_group_laws() {
        check_group::<crate::Ristretto255>();
    }

    #[test]
    fn modp_rejects_non_members() {
        // 2 is not in the order-q subgroup of the RFC 5114 groups (it would need 2^q == 1).
        let mut two = vec![0u8; Modp1024::ELEMENT_BYTES];
        *two.last_mut().unwrap() = 2;
        assert_eq!(Modp1024::decode(&two, false), Err(GroupError::NotInGroup));
        let p = Modp1024::params().p.to_be_bytes();
        assert_eq!(
            Modp1024::decode(p.as_ref(), false),
            Err(GroupError::NotInGroup)
        );
        assert_eq!(
            Modp1024::decode(&[0u8; 128], false),
            Err(GroupError::NotInGroup)
        );
    }
}
