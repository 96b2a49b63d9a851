//! A secure group member fed hostile input: views and messages made of the fuzzer's bytes. It
//! never panics and never hands the application a message it did not seal under its key.
#![no_main]
use conclave_crypto::{Identity, SigScheme};
use conclave_gka::{Directory, ProtocolId};
use conclave_secure::{SecureConfig, SecureEvent, SecureGroup};
use conclave_wire::client::{ClientEvent, GroupViewId, Reason};
use conclave_wire::gcs::{RingId, ServiceType};
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

fuzz_target!(|data: &[u8]| {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let directory = Arc::new(RwLock::new(Directory::new()));
    let mut me = None;
    for name in ["a#d1", "b#d1"] {
        let id = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
        directory.write().unwrap().insert(name.into(), id.public());
        if me.is_none() {
            me = Some(id);
        }
    }
    let protocol = [
        ProtocolId::Gdh,
        ProtocolId::Ckd,
        ProtocolId::Tgdh,
        ProtocolId::Str,
        ProtocolId::Bd,
    ][data.first().copied().unwrap_or(0) as usize % 5];
    let cfg = SecureConfig {
        protocol,
        ..SecureConfig::default()
    };
    let mut g = SecureGroup::join("g", "a#d1", me.unwrap(), directory, cfg, Box::new(rng));
    let mut index = 1;
    g.handle_event(ClientEvent::View {
        group: "g".into(),
        view: view(index),
        members: vec!["a#d1".into()].into(),
        transitional: vec!["a#d1".into()].into(),
        reason: Reason::Join,
    });
    for chunk in data.get(1..).unwrap_or(&[]).split(|b| *b == 0xff) {
        let Some((&op, rest)) = chunk.split_first() else {
            continue;
        };
        let ev = match op % 4 {
            0 => {
                index += 1;
                let members: Vec<String> = if op & 0x10 != 0 {
                    vec!["a#d1".into(), "b#d1".into()]
                } else {
                    vec!["a#d1".into()]
                };
                ClientEvent::View {
                    group: "g".into(),
                    view: view(index),
                    transitional: vec!["a#d1".into()].into(),
                    members: members.into(),
                    reason: Reason::Network,
                }
            }
            1 => ClientEvent::FlushRequest {
                group: "g".into(),
                view: view(index),
            },
            _ => ClientEvent::Message {
                group: "g".into(),
                sender: if op & 0x20 != 0 { "b#d1" } else { "a#d1" }.into(),
                service: ServiceType::Agreed,
                payload: rest.to_vec().into(),
                view: view(index),
                transitional: false,
            },
        };
        g.handle_event(ev);
        let _ = g.send(ServiceType::Fifo, rest.to_vec().into());
        // Some multicasts refused by the session, as a client's may be.
        while let Some(c) = g.poll_command() {
            if op & 0x40 != 0 && matches!(c, conclave_wire::client::ClientCommand::Multicast { .. })
            {
                g.command_refused();
            }
        }
        while let Some(e) = g.poll_event() {
            // Nothing the fuzzer makes opens: it holds no key.
            assert!(!matches!(e, SecureEvent::Message { .. }), "{e:?}");
        }
    }
});
