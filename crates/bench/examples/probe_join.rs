use conclave_crypto::{Ristretto255, SigScheme};
use conclave_gka::script::parse;
use conclave_gka::testbed::Testbed;
use conclave_gka::ProtocolId;
use std::time::Instant;
fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(64);
    let names: Vec<String> = (0..n).map(|i| format!("m{i:04}")).collect();
    for p in [ProtocolId::Tgdh, ProtocolId::Str] {
        let mut tb = Testbed::<Ristretto255>::new(p, SigScheme::Ed25519, 3);
        let mut all = names.clone(); all.push("x".into());
        tb.provision(&all).unwrap();
        let t = Instant::now();
        tb.run_script(&parse(&format!("init {}\n", names.join(" "))).unwrap()).unwrap();
        let setup = t.elapsed();
        tb.apply(&parse("join x").unwrap()[0].action).unwrap();
        // Step through messages, timing each delivery.
        while tb.queued() > 0 {
            let q = tb.queue_snapshot();
            let (from, to, bytes) = &q[0];
            let t = Instant::now();
            tb.run_messages(1);
            println!("  {p:?} msg from {from} to {} members, {} bytes: {:?}", to.len(), bytes.len(), t.elapsed());
        }
        let r = tb.records.iter().rev().find(|r| r.members.contains(&"m0000".to_string())).unwrap();
        println!("{p:?} setup {setup:?} critical {} us exps {}", r.compute_us, r.exps_critical);
    }
}
