//! Clients over TLS (the client-daemon hop of Three-Step Client-Server): the daemon proves its
//! identity key, a client that expects another key does not connect, and a listed client's
//! proof of its name goes over the TLS session.

use conclave_client::{Address, Client, ClientError, ClientEvent, Options, ServiceType};
use conclave_crypto::identity_file::{parse_public_text, public_text};
use conclave_crypto::{Identity, SigScheme};
use std::time::Duration;

mod common;
use common::one_daemon;

async fn ends<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the call never ended")
}

#[tokio::test]
async fn a_client_over_tls_talks_to_the_daemon_whose_key_it_knows() {
    let alice = Identity::generate(SigScheme::Ed25519, &mut rand_core::OsRng).unwrap();
    let key = public_text(&alice.public());
    let (d, _, cfg) = one_daemon(|c| {
        c.daemon[0].tls = Some(c.free_tcp_port().unwrap());
        c.client = vec![conclave_daemon::config::ClientEntry {
            name: "alice".into(),
            key,
        }];
        c.sessions.require_client_keys = true;
    })
    .await;
    let daemon_key = parse_public_text("d1", cfg.daemon[0].key.as_ref().unwrap()).unwrap();
    let port = cfg.daemon[0].tls.unwrap();
    let addr: Address = format!("tls:{port}").parse().unwrap();
    let opts = |daemon_key, identity| Options {
        daemon_key,
        identity,
        ..Options::default()
    };

    let mut c = ends(Client::connect_with(
        &addr,
        "alice",
        opts(Some(daemon_key.clone()), Some(alice.clone())),
    ))
    .await
    .unwrap();
    assert_eq!(c.name(), "alice#d1");
    c.join("g").await.unwrap();
    c.multicast(ServiceType::Agreed, &["g"], b"over tls")
        .await
        .unwrap();
    loop {
        if let ClientEvent::Message { payload, .. } = ends(c.receive()).await.unwrap() {
            assert_eq!(&payload[..], b"over tls");
            break;
        }
    }
    // Payloads the daemon writes as views of the buffers they arrived in, with the frames
    // around them, through TLS: whole and in order.
    let sent: Vec<Vec<u8>> = (0..40u32)
        .map(|k| {
            let mut p = vec![k as u8; 600 + (k as usize * 1_777) % 70_000];
            p[..4].copy_from_slice(&k.to_be_bytes());
            p
        })
        .collect();
    for p in &sent {
        c.multicast(ServiceType::Agreed, &["g"], p).await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < sent.len() {
        if let ClientEvent::Message { payload, .. } = ends(c.receive()).await.unwrap() {
            got.push(payload.to_vec());
        }
    }
    assert_eq!(got, sent);

    // A client that expects another daemon's key does not connect: the handshake fails.
    let impostor = Identity::generate(SigScheme::Ed25519, &mut rand_core::OsRng).unwrap();
    let wrong = ends(Client::connect_with(
        &addr,
        "alice",
        opts(Some(impostor.public()), Some(alice.clone())),
    ))
    .await;
    assert!(
        matches!(&wrong, Err(ClientError::Io(why)) if why.contains("TLS")),
        "{:?}",
        wrong.as_ref().err()
    );
    // Without the daemon's key there is nothing to check the daemon against.
    let blind = ends(Client::connect_with(
        &addr,
        "alice",
        opts(None, Some(alice)),
    ))
    .await;
    assert!(
        matches!(&blind, Err(ClientError::Invalid(why)) if why.contains("daemon's key")),
        "{:?}",
        blind.as_ref().err()
    );
    // Plain TCP spoken to the TLS port is no handshake: the daemon drops it and counts it.
    let plain = Address::Tcp(port.to_string());
    assert!(ends(Client::connect(&plain, "bob")).await.is_err());
    for _ in 0..100 {
        if d.metrics
            .tls_handshakes_failed
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the failed handshakes were not counted");
}
