//! The client library against a running daemon, where its old bugs were: a command is checked
//! before it waits, a refused join is rolled back, and a client whose application does not take
//! its events is told instead of left hanging.

use conclave_client::{
    Client, ClientError, ClientEvent, Options as ClientOptions, Refusal, ServiceType,
};
use std::time::Duration;

mod common;
use common::one_daemon;

/// A call that should end: a hang fails the test instead of stalling it.
async fn ends<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the call never ended")
}

fn assert_not_member(e: &ClientError) {
    assert!(
        matches!(
            e,
            ClientError::Refused {
                code: Refusal::NotMember,
                ..
            }
        ),
        "{e}"
    );
}

/// The next event that is not an acknowledgement of the client's own requests.
async fn joined(c: &mut Client, group: &str) {
    loop {
        match ends(c.receive()).await.unwrap() {
            ClientEvent::View { group: g, .. } if g == group => return,
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_message_to_more_groups_than_the_window_fails_at_once() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    let mut c = Client::connect_with_window(&addr, "narrow", 2)
        .await
        .unwrap();
    for g in ["a", "b", "c"] {
        c.join(g).await.unwrap();
        joined(&mut c, g).await;
    }
    // Once this waited for three places of a window of two, for ever.
    let e = ends(c.multicast(ServiceType::Agreed, &["a", "b", "c"], b"x"))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Invalid(_)), "{e}");
    // Two groups fit.
    ends(c.multicast(ServiceType::Agreed, &["a", "b"], b"y"))
        .await
        .unwrap();
    c.disconnect().await.unwrap();
    d.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_message_refused_with_room_in_the_window_gives_its_places_back() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    let mut c = Client::connect_with_window(&addr, "narrow", 2)
        .await
        .unwrap();
    c.join("a").await.unwrap();
    joined(&mut c, "a").await;
    // Each would take both places; none may keep them.
    for _ in 0..3 {
        let e = ends(c.multicast(ServiceType::Agreed, &["a", "elsewhere"], b"x"))
            .await
            .unwrap_err();
        assert_not_member(&e);
    }
    // Had they kept them, this would wait for ever.
    for k in 0..4u8 {
        ends(c.multicast(ServiceType::Agreed, &["a"], &[k]))
            .await
            .unwrap();
    }
    c.disconnect().await.unwrap();
    d.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_join_the_daemon_refuses_is_rolled_back() {
    let (d, addr, _) = one_daemon(|c| c.core.max_groups_per_client = 2).await;
    let mut c = Client::connect(&addr, "greedy").await.unwrap();
    for g in ["a", "b"] {
        c.join(g).await.unwrap();
        joined(&mut c, g).await;
    }
    // Sent (the library cannot know the daemon's limit), and refused there.
    c.join("c").await.unwrap();
    let refusal = loop {
        if let Err(e) = ends(c.receive()).await {
            break e;
        }
    };
    assert!(
        matches!(
            refusal,
            ClientError::Refused {
                code: Refusal::TooManyGroups,
                ..
            }
        ),
        "{refusal}"
    );
    // Once the refused join stayed in the library's groups: a message to the group went to the
    // daemon (and was refused there), and joining again was refused here.
    let e = c
        .multicast(ServiceType::Agreed, &["c"], b"x")
        .await
        .unwrap_err();
    assert_not_member(&e);
    c.leave("a").await.unwrap();
    c.join("c").await.unwrap();
    joined(&mut c, "c").await;
    c.multicast(ServiceType::Agreed, &["c"], b"now")
        .await
        .unwrap();
    c.disconnect().await.unwrap();
    d.shutdown().await.unwrap();
}

/// A sender that never takes its events: once it hung for ever when the events it did not take
/// filled the library's queue (the library stopped reading, so the acknowledgements that make
/// room in the window never arrived). Now the session ends with a typed error, and the call
/// waiting returns it.
#[tokio::test]
async fn a_client_that_does_not_take_its_events_is_told() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    let opts = ClientOptions {
        window: 16,
        event_queue: 100,
        ..ClientOptions::default()
    };
    let mut c = Client::connect_with(&addr, "deaf", opts).await.unwrap();
    c.join("g").await.unwrap();
    let end = ends(async {
        for k in 0..5_000u32 {
            if let Err(e) = c
                .multicast(ServiceType::Agreed, &["g"], &k.to_be_bytes())
                .await
            {
                return e;
            }
        }
        panic!("5,000 messages went out with nobody taking the events");
    })
    .await;
    assert!(matches!(end, ClientError::Overflow { .. }), "{end}");
    // Every later call fails with the same reason.
    let again = c.join("h").await.unwrap_err();
    assert!(matches!(again, ClientError::Overflow { .. }), "{again}");
    // The events held are still there to take, then the reason.
    let mut taken = 0;
    let last = loop {
        match ends(c.receive()).await {
            Ok(_) => taken += 1,
            Err(e) => break e,
        }
    };
    assert!(taken > 0);
    assert!(matches!(last, ClientError::Overflow { .. }), "{last}");
    d.shutdown().await.unwrap();
}

/// The same sender that takes its events in a task of its own sends everything.
#[tokio::test]
async fn a_split_client_sends_and_receives_without_limit() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    let opts = ClientOptions {
        window: 16,
        event_queue: 100,
        ..ClientOptions::default()
    };
    let mut c = Client::connect_with(&addr, "split", opts).await.unwrap();
    c.join("g").await.unwrap();
    joined(&mut c, "g").await;
    let (mut tx, mut rx) = c.split();
    let n = 3_000u32;
    let reader = tokio::spawn(async move {
        let mut got = 0;
        while got < n {
            if let ClientEvent::Message { .. } = rx.receive().await.unwrap() {
                got += 1;
            }
        }
    });
    for k in 0..n {
        ends(tx.multicast(ServiceType::Agreed, &["g"], &k.to_be_bytes()))
            .await
            .unwrap();
    }
    ends(reader).await.unwrap();
    tx.disconnect().await.unwrap();
    d.shutdown().await.unwrap();
}

/// A name the daemons know a key for (`[[client]]`) is taken only by who proves it holds the
/// key; with `require_client_keys`, no other name connects. Each refusal says why.
#[tokio::test]
async fn a_listed_name_is_taken_only_with_its_key() {
    use conclave_crypto::identity_file::public_text;
    use conclave_crypto::{Identity, SigScheme};
    let alice = Identity::generate(SigScheme::Ed25519, &mut rand_core::OsRng).unwrap();
    let other = Identity::generate(SigScheme::Ed25519, &mut rand_core::OsRng).unwrap();
    let key = public_text(&alice.public());
    let (d, addr, _) = one_daemon(|c| {
        c.client = vec![conclave_daemon::config::ClientEntry {
            name: "alice".into(),
            key,
        }];
        c.sessions.require_client_keys = true;
    })
    .await;
    let with = |identity: Option<Identity>| ClientOptions {
        identity,
        ..ClientOptions::default()
    };
    let c = Client::connect_with(&addr, "alice", with(Some(alice.clone())))
        .await
        .unwrap();
    assert_eq!(c.name(), "alice#d1");
    // Alice is connected: a second session under her name is refused as taken, proof or not.
    let again = Client::connect_with(&addr, "alice", with(Some(alice))).await;
    assert!(
        matches!(
            &again,
            Err(ClientError::Refused {
                code: Refusal::NameTaken,
                ..
            })
        ),
        "{:?}",
        again.as_ref().err()
    );
    drop(c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let wrong = Client::connect_with(&addr, "alice", with(Some(other))).await;
    assert!(
        matches!(&wrong, Err(ClientError::Refused { code: Refusal::NotAllowed, reason })
            if reason.contains("does not verify")),
        "{:?}",
        wrong.as_ref().err()
    );
    let none = Client::connect_with(&addr, "alice", with(None)).await;
    assert!(
        matches!(&none, Err(ClientError::Invalid(why)) if why.contains("proof")),
        "{:?}",
        none.as_ref().err()
    );
    let bob = Client::connect(&addr, "bob").await;
    assert!(
        matches!(&bob, Err(ClientError::Refused { code: Refusal::NotAllowed, reason })
            if reason.contains("only known clients")),
        "{:?}",
        bob.as_ref().err()
    );
    assert_eq!(
        d.metrics
            .client_proofs_refused
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

/// A sender of large messages whose receiving half takes its events slowly: the session ends
/// once the messages held for it pass the library's byte budget (or the daemon closes it as a
/// slow client, whichever comes first) and both halves are told; neither waits for ever, and
/// the library holds megabytes, not the gigabytes its count of events would allow.
#[tokio::test]
async fn a_slow_reader_of_large_messages_ends_both_halves() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    let opts = ClientOptions {
        event_queue_bytes: 8 << 20,
        ..ClientOptions::default()
    };
    let mut c = Client::connect_with(&addr, "slow", opts).await.unwrap();
    c.join("g").await.unwrap();
    joined(&mut c, "g").await;
    let (mut tx, mut rx) = c.split();
    let sending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let slow = sending.clone();
    let reader = tokio::spawn(async move {
        loop {
            match rx.receive().await {
                // Slow while the sender sends; then it takes what is held, and the reason.
                Ok(_) if slow.load(std::sync::atomic::Ordering::Relaxed) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Ok(_) => {}
                Err(e) => return e,
            }
        }
    });
    let payload = vec![7u8; 64 * 1024];
    let end = ends(async {
        for _ in 0..100_000u32 {
            if let Err(e) = tx.queue(ServiceType::Agreed, &["g"], &payload).await {
                return e;
            }
        }
        panic!("100,000 large messages went out to a reader that sleeps");
    })
    .await;
    sending.store(false, std::sync::atomic::Ordering::Relaxed);
    let ended = |e: &ClientError| {
        matches!(
            e,
            ClientError::Closed(_) | ClientError::Disconnected | ClientError::Overflow { .. }
        )
    };
    assert!(ended(&end), "{end}");
    // 8 MiB of 64 KiB messages: the budget, not the count of 65,536 events, ended it.
    if let ClientError::Overflow { waiting } = end {
        assert!(waiting < 1_000, "{waiting} events held");
    }
    let last = ends(reader).await.unwrap();
    assert!(ended(&last), "{last}");
    d.shutdown().await.unwrap();
}

/// A sender whose receiving half was dropped (nothing reads the daemon's acknowledgements any
/// more) is told as soon as it would wait for room in the window, instead of waiting for ever.
#[tokio::test]
async fn a_sender_whose_receiver_was_dropped_is_told() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    let opts = ClientOptions {
        window: 4,
        ..ClientOptions::default()
    };
    let mut c = Client::connect_with(&addr, "alone", opts).await.unwrap();
    c.join("g").await.unwrap();
    joined(&mut c, "g").await;
    let (mut tx, rx) = c.split();
    drop(rx);
    let end = ends(async {
        for k in 0..1_000u32 {
            if let Err(e) = tx
                .multicast(ServiceType::Agreed, &["g"], &k.to_be_bytes())
                .await
            {
                return e;
            }
        }
        panic!("1,000 messages acknowledged with nothing reading the acknowledgements");
    })
    .await;
    assert!(
        matches!(&end, ClientError::Invalid(why) if why.contains("receiving half")),
        "{end}"
    );
    d.shutdown().await.unwrap();
}
