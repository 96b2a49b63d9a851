//! The key derivation of every protocol, pinned on a fixed seed (see `conclave_gka::kat`).

#[test]
fn known_answers_hold() {
    let want: serde_json::Value =
        serde_json::from_str(include_str!("vectors/gka-kat.json")).expect("vectors parse");
    let got = conclave_gka::kat::generate();
    assert_eq!(
        got, want,
        "key derivation changed; if intended, regenerate with \
         `cargo run -p conclave-gka --example gen_kat > crates/gka/tests/vectors/gka-kat.json`"
    );
}
