//! Hostile and careless clients and peers against a running daemon: garbage, oversized and
//! truncated frames, silence, a flood of connections, a client that stops reading, and garbage
//! datagrams. Each gets a typed refusal or a closed connection, and the daemon goes on serving
//! everyone else.

use conclave_client::{Address, Client, ClientError, ClientEvent, ServiceType};
use conclave_daemon::AdminRequest;
use conclave_wire::client::{frame, next_frame, Refusal, Reply, Request};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::one_daemon;

/// Reads until the daemon closes the connection; the replies it sent before.
async fn replies_until_closed(s: &mut TcpStream) -> Vec<Reply> {
    let mut buf = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    assert!(r.is_ok(), "the daemon did not close the connection");
    let mut out = Vec::new();
    let mut rest = &buf[..];
    while let Ok(Some((m, used))) = next_frame(rest) {
        out.push(Reply::decode(m).unwrap());
        rest = &rest[used..];
    }
    out
}

/// A normal client still joins, sends and receives.
async fn still_serves(addr: &Address, name: &str) {
    let mut c = Client::connect(addr, name).await.unwrap();
    c.join("g").await.unwrap();
    c.multicast(ServiceType::Agreed, &["g"], b"still here")
        .await
        .unwrap();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), c.receive())
            .await
            .expect("an event in time")
            .unwrap();
        if let ClientEvent::Message { payload, .. } = ev {
            assert_eq!(&payload[..], b"still here");
            break;
        }
    }
    c.disconnect().await.unwrap();
}

fn tcp(addr: &Address) -> String {
    match addr {
        Address::Tcp(a) => a.clone(),
        Address::Tls(_) | Address::Unix(_) | Address::Shm(_) => unreachable!(),
    }
}

#[tokio::test]
async fn garbage_oversized_and_truncated_frames_close_only_their_connection() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    // Undecodable bytes in a well-formed frame: refused with the reason, then closed.
    let mut s = TcpStream::connect(tcp(&addr)).await.unwrap();
    s.write_all(&frame(&[0xff, 0x00, 0x13])).await.unwrap();
    let replies = replies_until_closed(&mut s).await;
    assert!(
        matches!(&replies[..], [Reply::Refused { request: 1, code: Refusal::BadRequest, reason }] if reason.contains("undecodable")),
        "{replies:?}"
    );
    // A frame length over the limit.
    let mut s = TcpStream::connect(tcp(&addr)).await.unwrap();
    s.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let replies = replies_until_closed(&mut s).await;
    assert!(
        matches!(&replies[..], [Reply::Refused { request: 1, code: Refusal::BadRequest, reason }] if reason.contains("frame")),
        "{replies:?}"
    );
    // A command before connecting.
    let mut s = TcpStream::connect(tcp(&addr)).await.unwrap();
    s.write_all(&frame(&Request::Disconnect.encode()))
        .await
        .unwrap();
    let replies = replies_until_closed(&mut s).await;
    assert!(
        matches!(
            &replies[..],
            [Reply::Refused {
                request: 1,
                code: Refusal::BadRequest,
                ..
            }]
        ),
        "{replies:?}"
    );
    // Half a frame, then the client goes.
    let mut s = TcpStream::connect(tcp(&addr)).await.unwrap();
    let hello = frame(
        &Request::Connect {
            name: "half".into(),
        }
        .encode(),
    );
    s.write_all(&hello[..hello.len() / 2]).await.unwrap();
    drop(s);
    // A bad name.
    let e = Client::connect(&addr, "a#b").await.err().unwrap();
    assert!(
        matches!(
            e,
            ClientError::Refused {
                code: Refusal::BadName,
                ..
            }
        ),
        "{e}"
    );
    still_serves(&addr, "fine").await;
    assert!(d.metrics.refusals.load(Relaxed) >= 2);
    d.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_silent_connection_is_closed_and_a_flood_of_connections_is_bounded() {
    let (d, addr, _) = one_daemon(|c| {
        c.sessions.handshake_ms = 200;
        c.sessions.max_connections = 20;
    })
    .await;
    let mut s = TcpStream::connect(tcp(&addr)).await.unwrap();
    let replies = replies_until_closed(&mut s).await;
    assert!(
        matches!(&replies[..], [Reply::Refused { code: Refusal::Timeout, reason, .. }] if reason.contains("in time")),
        "{replies:?}"
    );
    // 100 connections that say nothing: only 20 are kept, the others closed at once.
    let mut conns = Vec::new();
    for _ in 0..100 {
        conns.push(TcpStream::connect(tcp(&addr)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let open = d.metrics.connections.load(Relaxed);
    assert!(open <= 20, "{open} connections open");
    // Once the silent ones time out, everyone else is served again.
    drop(conns);
    tokio::time::sleep(Duration::from_millis(400)).await;
    still_serves(&addr, "after-the-flood").await;
    d.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_client_that_stops_reading_is_disconnected_and_the_group_goes_on() {
    let (d, addr, _) = one_daemon(|c| c.sessions.max_unread_per_client = 2_000).await;
    // The sluggard joins and then never reads a byte.
    let mut s = TcpStream::connect(tcp(&addr)).await.unwrap();
    let hello = Request::Connect {
        name: "sluggard".into(),
    };
    s.write_all(&frame(&hello.encode())).await.unwrap();
    let join = Request::Command(conclave_wire::client::ClientCommand::Join {
        group: "g".into(),
        vs: false,
    });
    s.write_all(&frame(&join.encode())).await.unwrap();
    let mut c = Client::connect(&addr, "talker").await.unwrap();
    c.join("g").await.unwrap();
    common::talk_until_a_slow_client_is_closed(&mut c, &d, "g").await;
    // The talker sees the sluggard leave.
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), c.receive())
            .await
            .expect("a view without the sluggard")
            .unwrap();
        if let ClientEvent::View { members, .. } = ev {
            if members[..] == ["talker#d1"] {
                break;
            }
        }
    }
    drop(s);
    still_serves(&addr, "fine").await;
    d.shutdown().await.unwrap();
}

#[tokio::test]
async fn garbage_datagrams_are_counted_and_ignored() {
    let (d, addr, cfg) = one_daemon(|_| {}).await;
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for k in 0..200u32 {
        let junk: Vec<u8> = (0..(k % 90)).map(|i| (i * k) as u8).collect();
        u.send_to(&junk, cfg.daemon[0].peer).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(d.metrics.bad_datagrams.load(Relaxed) >= 150);
    still_serves(&addr, "fine").await;
    d.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_admin_socket_refuses_bad_requests_and_applies_faults() {
    let (d, _, _) = one_daemon(|_| {}).await;
    let bad = d
        .admin(AdminRequest::Partition {
            sets: vec![vec!["nobody".into()]],
        })
        .await;
    assert!(!bad.ok && bad.error.unwrap().contains("nobody"));
    assert!(
        !d.admin(AdminRequest::Drop {
            rate: 2.0,
            peer: None
        })
        .await
        .ok
    );
    assert!(!d.admin(AdminRequest::Pause { ms: 3_600_000 }).await.ok);
    let r = d
        .admin(AdminRequest::Delay {
            ms: 5,
            jitter_ms: 1,
            peer: None,
        })
        .await;
    assert!(r.ok && r.status.unwrap().faults);
    let r = d.admin(AdminRequest::Clear).await;
    assert!(r.ok && !r.status.unwrap().faults);
    d.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lost_daemon_is_a_typed_error_at_the_client() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    let mut c = Client::connect(&addr, "left-behind").await.unwrap();
    c.join("g").await.unwrap();
    d.shutdown().await.unwrap();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), c.receive())
            .await
            .expect("the end in time")
        {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(end, ClientError::Closed(ref r) if r.contains("shutting down")),
        "{end}"
    );
    assert!(matches!(c.receive().await, Err(ClientError::Disconnected)));
    assert!(c
        .multicast(ServiceType::Agreed, &["g"], b"x")
        .await
        .is_err());
}

/// Requests written all at once are answered in their order, and a disconnection among them
/// loses none of the earlier ones' events.
#[tokio::test]
async fn replies_keep_the_order_of_requests_sent_together() {
    let (d, addr, _) = one_daemon(|_| {}).await;
    let mut s = TcpStream::connect(tcp(&addr)).await.unwrap();
    let cmd = |c| Request::Command(c);
    use conclave_wire::client::ClientCommand as C;
    let join = || C::Join {
        group: "g".into(),
        vs: false,
    };
    let mut bytes = Vec::new();
    for r in [
        Request::Connect {
            name: "eager".into(),
        },
        cmd(join()),
        cmd(join()),
        cmd(C::Leave { group: "g".into() }),
        Request::Disconnect,
    ] {
        bytes.extend(frame(&r.encode()));
    }
    s.write_all(&bytes).await.unwrap();
    let kinds: Vec<String> = replies_until_closed(&mut s)
        .await
        .into_iter()
        .map(|r| match r {
            Reply::Connected { .. } => "connected".to_string(),
            Reply::Challenge { .. } => "challenge".to_string(),
            Reply::Refused { .. } => "refused".to_string(),
            Reply::SentRun { .. } => "sent".to_string(),
            Reply::Event(ClientEvent::Joined { .. }) => "joined".to_string(),
            Reply::Event(ClientEvent::Left { .. }) => "left".to_string(),
            Reply::Event(e) => format!("{e:?}"),
        })
        .collect();
    assert_eq!(kinds, ["connected", "joined", "refused", "left"]);
    still_serves(&addr, "fine").await;
    d.shutdown().await.unwrap();
}
