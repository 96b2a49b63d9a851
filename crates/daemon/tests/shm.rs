//! Clients on the daemon's `shm` socket, whose replies travel through shared memory: the same
//! sessions as over a socket, the same order, and the same end for a reader that falls behind.

#![cfg(target_os = "linux")]

use conclave_client::{Address, Client, ClientError, ClientEvent, ServiceType};
use conclave_wire::client::{frame, ClientCommand, Request};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

mod common;
use common::one_daemon;

async fn ends<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("the call never ended")
}

async fn joined(c: &mut Client, group: &str, members: usize) {
    loop {
        match ends(c.receive()).await.unwrap() {
            ClientEvent::View {
                group: g,
                members: m,
                ..
            } if g == group && m.len() == members => return,
            _ => {}
        }
    }
}

/// A daemon with an `shm` socket of its own, and that socket's address for clients.
async fn daemon_with_shm(tag: &str) -> (conclave_daemon::Running, Address, Address) {
    daemon_with_shm_and(tag, |_| {}).await
}

/// [`daemon_with_shm`], its configuration edited by `edit`.
async fn daemon_with_shm_and(
    tag: &str,
    edit: impl FnOnce(&mut conclave_node::Config),
) -> (conclave_daemon::Running, Address, Address) {
    let path = std::env::temp_dir().join(format!("conclave-{tag}-{}.shm", std::process::id()));
    let p = path.clone();
    let (d, tcp, _) = one_daemon(move |cfg| {
        cfg.daemon[0].shm = Some(p);
        edit(cfg);
    })
    .await;
    (d, tcp, Address::Shm(path))
}

/// The payload of message `k` of sender `s`: sizes from a byte to 64 KiB, so that the ring wraps
/// in every way and fills.
fn payload(s: u8, k: u32) -> Vec<u8> {
    let len = match k % 5 {
        0 => 1,
        1 => 1_000,
        2 => 65_000,
        3 => 12_345,
        _ => 40,
    };
    let mut p = vec![s; len];
    p[..4.min(len)].copy_from_slice(&k.to_be_bytes()[..4.min(len)]);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_shared_memory_and_one_over_tcp_deliver_the_same_messages_in_one_order() {
    let (d, tcp, shm) = daemon_with_shm("order").await;
    let mut a = ends(Client::connect(&shm, "a")).await.unwrap();
    let mut b = ends(Client::connect(&tcp, "b")).await.unwrap();
    a.join("g").await.unwrap();
    joined(&mut a, "g", 1).await;
    b.join("g").await.unwrap();
    joined(&mut b, "g", 2).await;
    joined(&mut a, "g", 2).await;
    let n = 1_500u32;
    let (mut atx, arx) = a.split();
    let (mut btx, brx) = b.split();
    let collect = |mut rx: conclave_client::Receiver| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            while got.len() < 2 * n as usize {
                if let ClientEvent::Message {
                    sender, payload, ..
                } = rx.receive().await.unwrap()
                {
                    got.push((sender, payload.to_vec()));
                }
            }
            (got, rx)
        })
    };
    let (ga, gb) = (collect(arx), collect(brx));
    let sending = tokio::spawn(async move {
        for k in 0..n {
            atx.queue(ServiceType::Agreed, &["g"], &payload(1, k))
                .await
                .unwrap();
        }
        atx.flush().await.unwrap();
        atx
    });
    for k in 0..n {
        ends(btx.queue(ServiceType::Agreed, &["g"], &payload(2, k)))
            .await
            .unwrap();
    }
    btx.flush().await.unwrap();
    let (got_a, rx_a) = ends(ga).await.unwrap();
    let (got_b, _rx_b) = ends(gb).await.unwrap();
    let mut atx = ends(sending).await.unwrap();
    assert_eq!(got_a, got_b, "one order at both");
    for (who, s) in [("a#d1", 1u8), ("b#d1", 2)] {
        let theirs: Vec<&Vec<u8>> = got_a
            .iter()
            .filter(|(sender, _)| sender == who)
            .map(|(_, p)| p)
            .collect();
        assert_eq!(theirs.len(), n as usize, "{who}");
        for (k, p) in theirs.into_iter().enumerate() {
            assert_eq!(
                p,
                &payload(s, k as u32),
                "{who}'s message {k}, in its order"
            );
        }
    }
    // The client over shared memory leaves, and is told so, through the ring.
    let mut arx = rx_a;
    atx.disconnect().await.unwrap();
    let end = loop {
        if let Err(e) = ends(arx.receive()).await {
            break e;
        }
    };
    assert!(
        matches!(end, ClientError::Disconnected | ClientError::Closed(_)),
        "{end}"
    );
    d.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_ring_is_disconnected_and_the_group_goes_on() {
    let (d, _, shm) = daemon_with_shm_and("sluggard", |c| {
        c.sessions.max_unread_per_client = 2_000;
    })
    .await;
    // The sluggard takes its ring, joins, and then never reads a byte of it.
    let Address::Shm(p) = &shm else {
        unreachable!()
    };
    let (_ring, mut w) = conclave_shm::connect(p).await.unwrap();
    let hello = Request::Connect {
        name: "sluggard".into(),
    };
    w.write_all(&frame(&hello.encode())).await.unwrap();
    let join = Request::Command(ClientCommand::Join {
        group: "g".into(),
        vs: false,
    });
    w.write_all(&frame(&join.encode())).await.unwrap();
    let mut c = ends(Client::connect(&shm, "talker")).await.unwrap();
    c.join("g").await.unwrap();
    joined(&mut c, "g", 2).await;
    common::talk_until_a_slow_client_is_closed(&mut c, &d, "g").await;
    // The talker, itself on a ring, sees the sluggard leave.
    joined(&mut c, "g", 1).await;
    d.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_client_that_leaves_before_its_greeting_leaves_the_daemon_serving() {
    let (d, _tcp, shm) = daemon_with_shm("early").await;
    let Address::Shm(path) = &shm else {
        unreachable!()
    };
    for _ in 0..20 {
        drop(tokio::net::UnixStream::connect(path).await.unwrap());
    }
    let mut c = ends(Client::connect(&shm, "after")).await.unwrap();
    c.join("g").await.unwrap();
    joined(&mut c, "g", 1).await;
    d.shutdown().await.unwrap();
    assert!(
        !path.exists(),
        "the socket file is removed when the daemon stops"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_holds_no_more_rings_than_its_connection_limit() {
    let (d, _, shm) = daemon_with_shm_and("limit", |c| c.sessions.max_connections = 2).await;
    let Address::Shm(path) = shm.clone() else {
        unreachable!()
    };
    let mut a = ends(Client::connect(&shm, "a")).await.unwrap();
    let b = ends(Client::connect(&shm, "b")).await.unwrap();
    // A third is closed before any ring is made for it: no greeting.
    let e = ends(conclave_shm::connect(&path))
        .await
        .err()
        .expect("refused");
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    // One leaves, and its ring with it: another gets one.
    b.disconnect().await.unwrap();
    let mut again = None;
    for _ in 0..100 {
        if let Ok(c) = Client::connect(&shm, "c").await {
            again = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut c = again.expect("a ring freed by a session's end is given again");
    c.join("g").await.unwrap();
    joined(&mut c, "g", 1).await;
    a.join("g").await.unwrap();
    joined(&mut a, "g", 2).await;
    d.shutdown().await.unwrap();
}
