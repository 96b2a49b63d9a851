//! What one connection can make a node hold, and when the node closes it: driven with bytes and
//! time, as the daemon's runtime and the simulator drive it.

use conclave_node::{Config, Node, NodeOptions, SessionOutput, Time};
use conclave_wire::client::{frame, next_frame, Refusal, Reply, Request, MAX_REQUEST_BYTES};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// A point of the node's clock, microseconds after its start.
fn t(us: u64) -> Time {
    Time::from_micros(us)
}

fn node(edit: impl FnOnce(&mut Config)) -> Node {
    let mut rng = <rand_chacha::ChaCha8Rng as rand_core::SeedableRng>::seed_from_u64(1);
    let (mut cfg, ids) = Config::local(1, 4800).with_identities(&mut rng);
    edit(&mut cfg);
    let opts = NodeOptions {
        identity: ids.get("d1"),
        secret_rng: Some(conclave_node::SecretRng::seeded(7)),
        ..Default::default()
    };
    Node::new(cfg, "d1", opts, Time::ZERO).unwrap()
}

/// Everything the node has for its connections: replies by session, and which it closed.
fn outputs(n: &mut Node) -> (Vec<(u64, Reply)>, Vec<u64>) {
    let (mut replies, mut closed) = (Vec::new(), Vec::new());
    while let Some((id, out)) = n.poll_session() {
        match out {
            SessionOutput::Bytes(frames, count) => {
                let b = frames.to_vec();
                let mut at = 0;
                while let Some((body, used)) = next_frame(&b[at..]).unwrap() {
                    replies.push((id, Reply::decode(body).unwrap()));
                    at += used;
                }
                assert_eq!(at, b.len());
                n.handle_frames_written(id, frames, count);
            }
            SessionOutput::Close => closed.push(id),
        }
    }
    (replies, closed)
}

fn connect(n: &mut Node, now: u64, id: u64, name: &str) {
    let now = t(now);
    n.open_session(now, id).unwrap();
    let hello = frame(
        &Request::Connect {
            name: name.to_owned(),
        }
        .encode(),
    );
    n.handle_session_bytes(now, id, &hello);
    let (replies, closed) = outputs(n);
    assert!(closed.is_empty());
    assert!(
        matches!(&replies[..], [(i, Reply::Connected { name })] if *i == id && name.ends_with("#d1"))
    );
}

fn refused_and_closed(n: &mut Node, id: u64, needle: &str) {
    let (replies, closed) = outputs(n);
    assert_eq!(closed, vec![id]);
    assert!(
        replies.iter().any(|(i, r)| *i == id
            && matches!(r, Reply::Refused { reason, .. } if reason.contains(needle))),
        "{replies:?}"
    );
}

#[test]
fn a_connection_that_does_not_connect_in_time_is_closed() {
    let mut n = node(|_| {});
    n.open_session(t(0), 1).unwrap();
    n.handle_session_bytes(t(10), 1, &[0, 0]);
    let handshake = Time::ZERO + Duration::from_millis(n.config().sessions.handshake_ms);
    assert!(n.poll_timeout().unwrap() <= handshake);
    n.handle_timeout(t(handshake.as_micros() - 1));
    assert!(outputs(&mut n).1.is_empty());
    n.handle_timeout(handshake);
    refused_and_closed(&mut n, 1, "no connect request in time");
}

#[test]
fn a_request_that_stops_arriving_is_dropped_with_its_connection() {
    let mut n = node(|_| {});
    connect(&mut n, 0, 1, "alice");
    // All but the last byte of the largest request a client may send, then silence.
    let mut bytes = (MAX_REQUEST_BYTES as u32).to_be_bytes().to_vec();
    bytes.resize(4 + MAX_REQUEST_BYTES - 1, 0);
    for (k, chunk) in bytes.chunks(64 * 1024).enumerate() {
        n.handle_session_bytes(t(k as u64), 1, chunk);
    }
    assert!(outputs(&mut n).1.is_empty());
    let held = n.metrics().incomplete_bytes.load(Relaxed) as usize;
    assert_eq!(held, bytes.len());
    let deadline = n.config().sessions.request_ms * 1000;
    n.handle_timeout(t(deadline - 1));
    assert!(outputs(&mut n).1.is_empty());
    n.handle_timeout(t(deadline));
    refused_and_closed(&mut n, 1, "did not arrive in time");
    assert_eq!(n.metrics().incomplete_bytes.load(Relaxed), 0);
}

#[test]
fn a_frame_longer_than_any_request_is_refused_before_its_body_arrives() {
    let mut n = node(|_| {});
    connect(&mut n, 0, 1, "alice");
    n.handle_session_bytes(t(1), 1, &(MAX_REQUEST_BYTES as u32 + 1).to_be_bytes());
    refused_and_closed(&mut n, 1, "bad frame");
}

#[test]
fn incomplete_requests_of_all_connections_share_one_budget() {
    let mut n = node(|c| c.sessions.max_incomplete_bytes = 1000);
    connect(&mut n, 0, 1, "alice");
    connect(&mut n, 0, 2, "bob");
    let partial = |len: usize| {
        let mut b = 5000u32.to_be_bytes().to_vec();
        b.resize(len, 0);
        b
    };
    n.handle_session_bytes(t(1), 1, &partial(600));
    assert!(outputs(&mut n).1.is_empty());
    n.handle_session_bytes(t(2), 2, &partial(600));
    refused_and_closed(&mut n, 2, "too many incomplete requests");
    assert_eq!(n.metrics().incomplete_bytes.load(Relaxed), 600);
    assert_eq!(n.metrics().closed_limits.load(Relaxed), 1);
}

#[test]
fn requests_split_anywhere_are_read_whole_and_in_order() {
    let mut bytes = frame(
        &Request::Connect {
            name: "alice".into(),
        }
        .encode(),
    );
    // Requests refused in order after the connect: not members of these groups.
    let groups: Vec<String> = (0..6).map(|g| format!("g{g}")).collect();
    for g in &groups {
        let leave = conclave_wire::client::ClientCommand::Leave { group: g.clone() };
        bytes.extend(frame(&Request::Command(leave).encode()));
    }
    for chunk in [1, 2, 3, 4, 5, 7, 11, 64, bytes.len()] {
        let mut n = node(|_| {});
        n.open_session(t(0), 1).unwrap();
        for b in bytes.chunks(chunk) {
            n.handle_session_bytes(t(1), 1, b);
        }
        let (replies, closed) = outputs(&mut n);
        assert!(closed.is_empty());
        assert!(matches!(replies[0].1, Reply::Connected { .. }));
        let reasons: Vec<&str> = replies[1..]
            .iter()
            .enumerate()
            .map(|(k, (_, r))| match r {
                Reply::Refused {
                    request,
                    code,
                    reason,
                } => {
                    // The connect is request 1; each refusal names its own request.
                    assert_eq!(*request, k as u64 + 2);
                    assert_eq!(*code, Refusal::NotMember);
                    reason.as_str()
                }
                r => panic!("{r:?}"),
            })
            .collect();
        assert_eq!(
            reasons.len(),
            groups.len(),
            "chunks of {chunk}: {reasons:?}"
        );
        for (reason, g) in reasons.iter().zip(&groups) {
            assert!(
                reason.contains(&format!("{g:?}")),
                "chunks of {chunk}: {reasons:?}"
            );
        }
        assert_eq!(n.metrics().incomplete_bytes.load(Relaxed), 0);
    }
}

#[test]
fn past_the_connection_limit_a_connection_is_refused() {
    let mut n = node(|c| c.sessions.max_connections = 2);
    n.open_session(t(0), 1).unwrap();
    n.open_session(t(0), 2).unwrap();
    assert!(n.open_session(t(0), 3).is_err());
    n.close_session(t(1), 1);
    n.open_session(t(2), 3).unwrap();
}

#[test]
fn a_client_may_not_join_or_send_to_the_daemons_groups() {
    use conclave_wire::client::{ClientCommand, Refusal};
    use conclave_wire::gcs::ServiceType;
    let mut n = node(|_| {});
    connect(&mut n, 0, 1, "mallory");
    let commands = [
        ClientCommand::Join {
            group: "#daemons".into(),
            vs: true,
        },
        ClientCommand::Multicast {
            groups: vec!["chat".into(), "#anything".into()],
            service: ServiceType::Agreed,
            payload: b"x".to_vec().into(),
        },
    ];
    for cmd in commands {
        n.handle_session_bytes(t(1), 1, &frame(&Request::Command(cmd).encode()));
        let (replies, closed) = outputs(&mut n);
        assert!(closed.is_empty());
        assert!(
            matches!(
                &replies[..],
                [(1, Reply::Refused { code: Refusal::NotAllowed, reason, .. })]
                    if reason.contains("daemons")
            ),
            "{replies:?}"
        );
    }
    assert_eq!(n.metrics().refusals.load(Relaxed), 2);
    // The daemon's own member is no client.
    assert_eq!(n.status().clients, 1);
}

/// On a TLS connection a name's proof must sign the connection's channel binding: a proof made
/// for the same nonce without it (as one relayed from another connection would be) is refused.
#[test]
fn a_proof_on_a_tls_connection_signs_its_channel_binding() {
    use conclave_crypto::identity_file::public_text;
    use conclave_wire::client::proof_message;
    let alice = conclave_crypto::Identity::ed25519_from_seed(&[9; 32]).unwrap();
    let mut n = node(|c| {
        c.client = vec![conclave_node::config::ClientEntry {
            name: "alice".into(),
            key: public_text(&alice.public()),
        }];
    });
    let binding = [5u8; 32];
    for (id, signed) in [(1, None), (2, Some([6u8; 32])), (3, Some(binding))] {
        n.open_bound_session(t(0), id, Some(binding)).unwrap();
        let hello = Request::Connect {
            name: "alice".into(),
        };
        n.handle_session_bytes(t(0), id, &frame(&hello.encode()));
        let (replies, _) = outputs(&mut n);
        let Some((_, Reply::Challenge { name, nonce })) = replies.first() else {
            panic!("{replies:?}");
        };
        let msg = proof_message(name, nonce, signed.as_ref());
        let prove = Request::Prove {
            signature: alice.sign(&msg).unwrap(),
        };
        n.handle_session_bytes(t(0), id, &frame(&prove.encode()));
        if signed == Some(binding) {
            let (replies, closed) = outputs(&mut n);
            assert!(closed.is_empty());
            assert!(
                matches!(&replies[..], [(3, Reply::Connected { .. })]),
                "{replies:?}"
            );
        } else {
            refused_and_closed(&mut n, id, "does not verify");
        }
    }
}
