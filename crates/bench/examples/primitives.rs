//! Measures the primitives the protocols are made of (release build):
//! `cargo run --release -p conclave-bench --example primitives`.
use conclave_crypto::{Group, Ristretto255};
use std::time::Instant;
fn t<F: FnMut()>(name: &str, n: usize, mut f: F) {
    let s = Instant::now();
    for _ in 0..n {
        f()
    }
    println!(
        "{name}: {:.2} us",
        s.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
fn main() {
    use rand_chacha::rand_core::SeedableRng;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
    let s = Ristretto255::random_scalar(&mut rng);
    let p = Ristretto255::exp_g(&s);
    let e = Ristretto255::encode(&p);
    t("exp", 2000, || {
        std::hint::black_box(Ristretto255::exp(&p, &s));
    });
    t("exp_g", 2000, || {
        std::hint::black_box(Ristretto255::exp_g(&s));
    });
    t("compress", 2000, || {
        std::hint::black_box(Ristretto255::encode(&p));
    });
    t("decompress", 2000, || {
        std::hint::black_box(Ristretto255::decode(&e, false).unwrap());
    });
    t("invert", 2000, || {
        std::hint::black_box(Ristretto255::scalar_inv(&s));
    });
    t("hash_to_scalar", 2000, || {
        std::hint::black_box(Ristretto255::hash_to_scalar(b"x", &p));
    });
    let big = vec![1u8; 75_000];
    t("sha256 75KB", 200, || {
        use sha2::Digest;
        std::hint::black_box(sha2::Sha256::digest(&big));
    });
    let id =
        conclave_crypto::Identity::generate(conclave_crypto::SigScheme::Ed25519, &mut rng).unwrap();
    t("ed25519 sign 57B", 2000, || {
        std::hint::black_box(id.sign(&[7u8; 57]).unwrap());
    });
    let sig = id.sign(&[7u8; 57]).unwrap();
    let public = id.public();
    t("ed25519 verify 57B", 2000, || {
        public
            .verify(std::hint::black_box(&[7u8; 57]), &sig)
            .unwrap();
    });
    let key = [9u8; 32];
    t("aes-256-gcm key setup + seal 32B", 20000, || {
        let a = conclave_crypto::aead::Aead::new(conclave_crypto::aead::AeadAlg::Aes256Gcm, &key);
        std::hint::black_box(a.seal([0; 12], b"aad", &[1u8; 32]));
    });
    let kp = aws_lc_rs::signature::Ed25519KeyPair::from_seed_unchecked(&[5u8; 32]).unwrap();
    t("aws-lc ed25519 sign 57B", 2000, || {
        std::hint::black_box(kp.sign(&[7u8; 57]));
    });
    let small = [3u8; 86];
    t("sha256 86B (sha2)", 200000, || {
        use sha2::Digest;
        std::hint::black_box(sha2::Sha256::digest(std::hint::black_box(&small)));
    });
    t("sha256 86B (aws-lc)", 200000, || {
        std::hint::black_box(aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA256,
            std::hint::black_box(&small),
        ));
    });
    t("chacha20-poly1305 key setup + seal 32B", 20000, || {
        let a = conclave_crypto::aead::Aead::new(
            conclave_crypto::aead::AeadAlg::ChaCha20Poly1305,
            &key,
        );
        std::hint::black_box(a.seal([0; 12], b"aad", &[1u8; 32]));
    });
}
