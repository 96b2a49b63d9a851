//! Secure groups through real daemons: two daemons in this process on free ports, clients over
//! TCP with the secure layer of the client library. A key per view (agreed by the members, or
//! handed by the daemons), data sealed under it, and a leaver that gets nothing after it left.

use conclave_client::secure::{
    KeySource, SecureClient, SecureClientError, SecureConfig, SecureEvent,
};
use conclave_client::{Address, Client, ServiceType};
use conclave_crypto::{Fingerprint, Identity, SigScheme};
use conclave_daemon::{AdminRequest, Config, Options, Running};
use conclave_gka::{Directory, ProtocolId};
use rand_chacha::rand_core::SeedableRng;
use std::time::Duration;

async fn two_daemons() -> (Vec<Running>, Vec<Address>) {
    let (cfg, ids) = Config::local_on_free_ports(2)
        .unwrap()
        .with_identities(&mut rand_core::OsRng);
    let mut running = Vec::new();
    for name in ["d1", "d2"] {
        let opts = Options {
            identity: ids.get(name),
            ..Options::default()
        };
        running.push(
            conclave_daemon::start(cfg.clone(), name, opts)
                .await
                .unwrap(),
        );
    }
    for _ in 0..1000 {
        let mut ready = true;
        for d in &running {
            let s = d.admin(AdminRequest::Status).await.status.unwrap();
            ready &= s.ready && s.members.len() == 2;
        }
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let addrs = cfg
        .daemon
        .iter()
        .map(|d| Address::Tcp(d.client.unwrap().to_string()))
        .collect();
    (running, addrs)
}

/// Receives until `f` returns something, for at most ten seconds.
async fn until<T>(s: &mut SecureClient, mut f: impl FnMut(&SecureEvent) -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ev = tokio::time::timeout_at(deadline, s.receive())
            .await
            .expect("in time")
            .expect("an event");
        if let Some(t) = f(&ev) {
            return t;
        }
    }
}

fn view_of(n: usize) -> impl FnMut(&SecureEvent) -> Option<Fingerprint> {
    move |e| match e {
        SecureEvent::View(v) if v.members.len() == n => Some(v.fingerprint),
        _ => None,
    }
}

fn message(e: &SecureEvent) -> Option<String> {
    match e {
        SecureEvent::Message { payload, .. } => Some(String::from_utf8_lossy(payload).into()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_group_over_two_daemons_rekeys_on_every_view() {
    rekeys_on_every_view(KeySource::Agreement).await
}

/// The same with the keys from the daemons (Integrated VS): no agreement among the members; the
/// daemons, which agreed their own key over sealed links, hand each view's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_keyed_by_the_daemons_rekeys_on_every_view() {
    rekeys_on_every_view(KeySource::Daemons).await
}

async fn rekeys_on_every_view(source: KeySource) {
    let (_daemons, addrs) = two_daemons().await;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
    let names = ["alice", "bob", "carol"];
    let ids: Vec<Identity> = names
        .iter()
        .map(|_| Identity::generate(SigScheme::Ed25519, &mut rng).unwrap())
        .collect();
    let mut directory = Directory::new();
    for (n, id) in names.iter().zip(&ids) {
        directory.insert(n.to_string(), id.public());
    }
    let mut members = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let c = Client::connect(&addrs[i % 2], n).await.unwrap();
        let mut s = SecureClient::new(c, ids[i].clone(), directory.clone());
        let cfg = SecureConfig {
            keys: source,
            protocol: ProtocolId::Tgdh,
            ..SecureConfig::default()
        };
        s.join_secure("g", cfg).await.unwrap();
        members.push(s);
    }
    let mut keys = Vec::new();
    for s in &mut members {
        keys.push(until(s, view_of(3)).await);
    }
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");

    members[0]
        .send("g", ServiceType::Agreed, b"to all three")
        .await
        .unwrap();
    for s in &mut members {
        assert_eq!(until(s, message).await, "to all three");
    }

    // Carol leaves: alice and bob get a new key, and what they send then never reaches her.
    members[2].leave("g").await.unwrap();
    let carol = members.pop().unwrap();
    let mut after = Vec::new();
    for s in &mut members {
        after.push(until(s, view_of(2)).await);
    }
    assert_eq!(after[0], after[1]);
    assert_ne!(after[0], keys[0]);
    members[1]
        .send("g", ServiceType::Safe, b"after carol left")
        .await
        .unwrap();
    assert_eq!(until(&mut members[0], message).await, "after carol left");
    let mut carol = carol;
    let late = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            match carol.receive().await {
                Ok(SecureEvent::Message { payload, .. }) => return Some(payload),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    })
    .await;
    assert!(!matches!(late, Ok(Some(_))), "carol got {late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_messages_arrive_in_order_and_a_failed_one_is_an_event_that_ends_nothing() {
    let (_daemons, addrs) = two_daemons().await;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(8);
    let names = ["alice", "bob"];
    let ids: Vec<Identity> = names
        .iter()
        .map(|_| Identity::generate(SigScheme::Ed25519, &mut rng).unwrap())
        .collect();
    let mut directory = Directory::new();
    for (n, id) in names.iter().zip(&ids) {
        directory.insert(n.to_string(), id.public());
    }
    let mut members = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let c = Client::connect(&addrs[i], n).await.unwrap();
        let mut s = SecureClient::new(c, ids[i].clone(), directory.clone());
        s.join_secure("q", SecureConfig::default()).await.unwrap();
        members.push(s);
    }
    for s in &mut members {
        until(s, view_of(2)).await;
    }
    // A group name the session refuses: the join's answer says so, and nothing is left joined.
    let long = "x".repeat(1000);
    let e = members[0]
        .join_secure(&long, SecureConfig::default())
        .await
        .unwrap_err();
    assert!(!e.is_final(), "{e}");
    let e = members[0]
        .send(&long, ServiceType::Agreed, b"x")
        .await
        .unwrap_err();
    assert!(matches!(e, SecureClientError::NotJoined(_)), "{e}");
    let (mut tx, mut rx) = members.remove(0).split();
    // Not a group of this client: the queue call succeeds, the failure comes back as an event.
    tx.queue("elsewhere", ServiceType::Agreed, b"lost")
        .await
        .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), rx.receive())
        .await
        .unwrap()
        .unwrap_err();
    assert!(!e.is_final(), "{e}");
    assert!(e.to_string().contains("elsewhere"), "{e}");
    const N: usize = 2_000;
    for i in 0..N {
        let mut payload = vec![b'.'; 1024];
        payload[..8].copy_from_slice(&(i as u64).to_be_bytes());
        tx.queue("q", ServiceType::Fifo, &payload).await.unwrap();
    }
    let bob = &mut members[0];
    for i in 0..N {
        let got = until(bob, |e| match e {
            SecureEvent::Message { payload, .. } => Some(payload.clone()),
            _ => None,
        })
        .await;
        assert_eq!(got.len(), 1024);
        assert_eq!(u64::from_be_bytes(got[..8].try_into().unwrap()), i as u64);
    }
    // The session goes on after the refusal: a confirmed send still works.
    tx.send("q", ServiceType::Agreed, b"still here")
        .await
        .unwrap();
    assert_eq!(until(bob, message).await, "still here");
}
