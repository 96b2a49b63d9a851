//! OpenMLS 0.9, measured as the peer of Conclave's key agreement at scale (README, E1): the time
//! for a member of a group of n to remove another (create the commit and take its own new
//! epoch) and for a remaining member to process that commit (verify it, decrypt its path secret
//! and take the new epoch).
//!
//! The group is made as an application would make it in one go: its creator adds the n - 1 others
//! in one commit and each joins by the Welcome. The tree's inner nodes are then blank but for the
//! creator's path, so a commit encrypts its path secrets to many leaves: this is the state of a
//! group no member has updated since, which is where OpenMLS's remove is dearest.
//!
//! Output: one JSON line per run, as `conclave bench gka` writes its rows.
//! `cargo run --release --manifest-path peers/openmls/Cargo.toml -- [--sizes 64,1024] [--repeat 3]`

use openmls::prelude::tls_codec::{Deserialize as _, Serialize as _};
use openmls::prelude::*;
use openmls_basic_credential::SignatureKeyPair;
use openmls_rust_crypto::OpenMlsRustCrypto;
use std::time::Instant;

const SUITE: Ciphersuite = Ciphersuite::MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519;

struct Identity {
    signer: SignatureKeyPair,
    credential: CredentialWithKey,
}

fn identity(name: &str) -> Identity {
    let signer = SignatureKeyPair::new(SUITE.signature_algorithm()).expect("a signature key");
    let credential = CredentialWithKey {
        credential: BasicCredential::new(name.as_bytes().to_vec()).into(),
        signature_key: signer.to_public_vec().into(),
    };
    Identity { signer, credential }
}

fn key_package(provider: &OpenMlsRustCrypto, id: &Identity) -> KeyPackage {
    KeyPackage::builder()
        .build(SUITE, provider, &id.signer, id.credential.clone())
        .expect("a key package")
        .key_package()
        .clone()
}

fn ms(t: Instant) -> f64 {
    (t.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

fn args() -> (Vec<usize>, usize) {
    let mut sizes = vec![64, 1024];
    let mut repeat = 3;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().unwrap_or_default();
        match a.as_str() {
            "--sizes" => {
                sizes = v
                    .split(',')
                    .map(|s| s.trim().parse().expect("--sizes: numbers, comma-separated"))
                    .collect()
            }
            "--repeat" => repeat = v.parse().expect("--repeat: a number"),
            _ => {
                eprintln!("usage: conclave-peer-openmls [--sizes 64,1024] [--repeat 3]");
                std::process::exit(2);
            }
        }
    }
    assert!(
        sizes.iter().all(|&n| n >= repeat + 3),
        "each size must leave a member to remove per run"
    );
    (sizes, repeat)
}

fn main() {
    let (sizes, repeat) = args();
    let config = MlsGroupCreateConfig::builder()
        .ciphersuite(SUITE)
        .use_ratchet_tree_extension(true)
        .build();
    for n in sizes {
        let creator_provider = OpenMlsRustCrypto::default();
        let creator = identity("creator");
        let mut group = MlsGroup::new(
            &creator_provider,
            &creator.signer,
            &config,
            creator.credential.clone(),
        )
        .expect("a group");
        // The member who processes the commits joins last; the others' private keys are never
        // used and share one store.
        let others_provider = OpenMlsRustCrypto::default();
        let mut packages: Vec<KeyPackage> = (1..n - 1)
            .map(|i| key_package(&others_provider, &identity(&format!("member {i}"))))
            .collect();
        let member_provider = OpenMlsRustCrypto::default();
        let member = identity("receiver");
        packages.push(key_package(&member_provider, &member));
        let t = Instant::now();
        let (_, welcome, _) = group
            .add_members(&creator_provider, &creator.signer, &packages)
            .expect("the members added");
        group
            .merge_pending_commit(&creator_provider)
            .expect("the add merged");
        let add_ms = ms(t);
        let welcome = match MlsMessageIn::from(welcome).extract() {
            MlsMessageBodyIn::Welcome(w) => w,
            _ => panic!("a Welcome"),
        };
        let mut receiver =
            StagedWelcome::new_from_welcome(&member_provider, config.join_config(), welcome, None)
                .expect("the Welcome staged")
                .into_group(&member_provider)
                .expect("the receiver joined");
        for run in 0..repeat {
            // Leaves 1, 2, ...: members other than the creator (0) and the receiver (last).
            let leaf = LeafNodeIndex::new(1 + run as u32);
            let t = Instant::now();
            let (commit, _, _) = group
                .remove_members(&creator_provider, &creator.signer, &[leaf])
                .expect("the removal committed");
            group
                .merge_pending_commit(&creator_provider)
                .expect("the removal merged");
            let commit_ms = ms(t);
            let bytes = commit.tls_serialize_detached().expect("the commit encoded");
            let t = Instant::now();
            let message = MlsMessageIn::tls_deserialize_exact(&bytes).expect("the commit decoded");
            let processed = receiver
                .process_message(
                    &member_provider,
                    message
                        .try_into_protocol_message()
                        .expect("a handshake message"),
                )
                .expect("the commit processed");
            let ProcessedMessageContent::StagedCommitMessage(staged) = processed.into_content()
            else {
                panic!("a commit");
            };
            receiver
                .merge_staged_commit(&member_provider, *staged)
                .expect("the commit merged");
            let process_ms = ms(t);
            assert_eq!(
                group.epoch_authenticator().as_slice(),
                receiver.epoch_authenticator().as_slice(),
                "both in the same epoch"
            );
            let row = serde_json::json!({
                "bench": "gka-peer",
                "peer": "openmls 0.9.2",
                "suite": "MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519",
                "n": n - run,
                "event": "remove",
                "commit_ms": commit_ms,
                "process_ms": process_ms,
                "commit_bytes": bytes.len(),
                "setup_add_ms": add_ms,
            });
            println!("{row}");
        }
    }
}
