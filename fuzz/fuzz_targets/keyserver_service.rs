//! The key-graph service's decoders never panic and re-encode what they decode; a key server and
//! a key-graph member fed views and messages made of the fuzzer's bytes (under any sender's name,
//! the server's included) never panic, the server registers nobody (nobody's signature can be
//! forged) and the member never gets a key.
#![no_main]
use conclave_crypto::Identity;
use conclave_gka::Directory;
use conclave_secure::{
    KeyServerConfig, KeyServerEvent, KeyServerNode, KeySource, SecureConfig, SecureEvent,
    SecureGroup,
};
use conclave_wire::client::{ClientEvent, GroupViewId, Reason};
use conclave_wire::gcs::{RingId, ServiceType};
use conclave_wire::keyserver::{Admission, ServiceMsg};
use conclave_wire::secure::SecureMessage;
use libfuzzer_sys::fuzz_target;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::{Arc, RwLock};

fn view(index: u64) -> GroupViewId {
    GroupViewId {
        ring: RingId {
            seq: 4,
            rep: 1,
            inc: 0,
        },
        index,
    }
}

const NAMES: [&str; 3] = ["ks#d1", "a#d1", "b#d1"];

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ServiceMsg::decode(data) {
        assert_eq!(m.encode(), data, "service message round trip");
    }
    if let Ok(a) = Admission::decode(data) {
        assert_eq!(a.encode(), data, "admission round trip");
    }
    let directory = Arc::new(RwLock::new(Directory::new()));
    let ids: Vec<Identity> = (0..3u8)
        .map(|i| Identity::ed25519_from_seed(&[i + 1; 32]).expect("seed"))
        .collect();
    for (n, id) in NAMES.iter().zip(&ids) {
        directory.write().unwrap().insert((*n).into(), id.public());
    }
    let rng = ChaCha8Rng::seed_from_u64(1);
    let mut server = KeyServerNode::new(
        KeyServerConfig::new("g", NAMES[0]),
        ids[0].clone(),
        directory.clone(),
        Box::new(rng.clone()),
    )
    .expect("a server");
    let cfg = SecureConfig {
        keys: KeySource::KeyGraph,
        key_server: Some(NAMES[0].into()),
        ..SecureConfig::default()
    };
    let mut member = SecureGroup::join("g", NAMES[1], ids[1].clone(), directory, cfg, Box::new(rng));
    let mut index = 1;
    let mut now = 0;
    let first = ClientEvent::View {
        group: "g".into(),
        view: view(index),
        members: NAMES.iter().map(|n| n.to_string()).collect(),
        transitional: vec![NAMES[1].into()].into(),
        reason: Reason::Join,
    };
    server.handle_event(first.clone(), now);
    member.handle_event(first);
    for chunk in data.split(|b| *b == 0xff) {
        let Some((&op, rest)) = chunk.split_first() else {
            continue;
        };
        now += u64::from(op & 0x0f) * 300;
        let ev = match op % 4 {
            0 => {
                index += 1;
                let members: Vec<String> = NAMES
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i == 1 || op & (0x10 << i) != 0)
                    .map(|(_, n)| n.to_string())
                    .collect();
                ClientEvent::View {
                    group: "g".into(),
                    view: view(index),
                    transitional: members.clone().into(),
                    members: members.into(),
                    reason: Reason::Network,
                }
            }
            1 => ClientEvent::FlushRequest {
                group: "g".into(),
                view: view(index),
            },
            n => {
                // Raw bytes, or the bytes as a service message's body.
                let payload = match n {
                    2 => rest.to_vec(),
                    _ => SecureMessage::KeyGraph(rest).encode(),
                };
                ClientEvent::Message {
                    group: "g".into(),
                    sender: NAMES[(op as usize >> 4) % 3].into(),
                    service: ServiceType::Agreed,
                    payload: payload.into(),
                    view: view(index),
                    transitional: false,
                }
            }
        };
        server.handle_event(ev.clone(), now);
        server.tick(now);
        member.handle_event(ev);
        while server.poll_output().is_some() {}
        while member.poll_command().is_some() {}
        while let Some(e) = server.poll_event() {
            assert!(!matches!(e, KeyServerEvent::Registered { .. }), "{e:?}");
        }
        while let Some(e) = member.poll_event() {
            assert!(
                !matches!(e, SecureEvent::View(_) | SecureEvent::Message { .. }),
                "{e:?}"
            );
        }
    }
});
