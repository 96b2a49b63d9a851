//! Known-answer vectors: every protocol run on a fixed seed and script over the modern suite.
//! `cargo run -p conclave-gka --example gen_kat > crates/gka/tests/vectors/gka-kat.json`
//! regenerates them; a test holds the code to them, so any change to a key derivation shows.

use crate::script::parse;
use crate::testbed::Testbed;
use crate::ProtocolId;
use conclave_crypto::{Group, Ristretto255, SigScheme};
use serde_json::{json, Value};

pub const KAT_SEED: u64 = 20_041_129;
pub const KAT_SCRIPT: &str = "init a b c d\njoin e\nleave b\nmerge f g\npartition c d\n+2 join h\n";

pub fn protocol_name(p: ProtocolId) -> &'static str {
    match p {
        ProtocolId::Gdh => "gdh",
        ProtocolId::Ckd => "ckd",
        ProtocolId::Tgdh => "tgdh",
        ProtocolId::Str => "str",
        ProtocolId::Bd => "bd",
    }
}

/// The vectors, as the generator prints them.
pub fn generate() -> Value {
    let steps = parse(KAT_SCRIPT).expect("the KAT script parses");
    let mut protocols = serde_json::Map::new();
    for p in ProtocolId::ALL {
        let mut tb = Testbed::<Ristretto255>::new(p, SigScheme::Ed25519, KAT_SEED);
        tb.measure_time = false;
        tb.run_script(&steps).expect("the KAT script runs");
        let views: Vec<Value> = tb
            .records
            .iter()
            .map(|r| {
                json!({
                    "view": r.view,
                    "members": r.members,
                    "key": r.keys.values().next().cloned().unwrap_or_default(),
                    "secret": r.secret_fingerprints.values().next().map(|f| f.to_string()).unwrap_or_default(),
                })
            })
            .collect();
        protocols.insert(protocol_name(p).into(), Value::Array(views));
    }
    json!({
        "suite": "modern",
        "group": Ristretto255::NAME,
        "seed": KAT_SEED,
        "script": KAT_SCRIPT,
        "protocols": protocols,
    })
}
