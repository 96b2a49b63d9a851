//! Writes real rekey messages (every graph, strategy and signing mode) into a directory, as a seed
//! corpus for the `lkh_rekey` fuzz target: `cargo run -p conclave-keygraph --example rekey_corpus
//! -- fuzz/corpus/lkh_rekey`.

use conclave_crypto::{GroupKey, Identity, SigScheme};
use conclave_keygraph::{GraphKind, Server, ServerConfig, Signing, Strategy, UserId};
use rand_chacha::rand_core::SeedableRng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: rekey_corpus DIR")?;
    std::fs::create_dir_all(&dir)?;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
    let mut n = 0;
    for graph in [
        GraphKind::Tree { degree: 4 },
        GraphKind::Star,
        GraphKind::Complete,
    ] {
        for strategy in [Strategy::User, Strategy::Key, Strategy::Group] {
            for signing in [Signing::None, Signing::PerMessage, Signing::Batch] {
                let mut cfg = ServerConfig::new("fuzz", graph);
                cfg.strategy = strategy;
                cfg.signing = signing;
                let id = Identity::generate(SigScheme::Ed25519, &mut rng)?;
                let mut s = Server::new(cfg, Some(id))?;
                for u in 0..6 {
                    s.join(UserId(u), &GroupKey::from_bytes([u as u8; 32]), &mut rng)?;
                }
                s.leave(UserId(2), &mut rng)?;
                while let Some(t) = s.poll_transmit() {
                    std::fs::write(format!("{dir}/msg-{n:04}"), &t.bytes)?;
                    n += 1;
                }
            }
        }
    }
    println!("wrote {n} messages to {dir}");
    Ok(())
}
