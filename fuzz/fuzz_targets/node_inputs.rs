//! A daemon node under hostile input: any bytes from client connections (native and Spread) and
//! any datagrams from a configured peer, at any times, are handled without panic, and every reply
//! the node frames for a native client decodes. Links are off, so that the datagrams reach the core (`link_datagram` fuzzes the
//! links).
#![no_main]
use conclave_node::{Config, Node, NodeOptions, SessionOutput};
use conclave_wire::client::{next_frame, Reply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut cfg = Config::local(2, 4800);
    cfg.links.mode = conclave_node::link::LinkMode::Off;
    let peer = cfg.daemon[1].peer;
    let Ok(mut node) = Node::new(cfg, "d1", NodeOptions::default(), conclave_node::Time::ZERO)
    else {
        return;
    };
    let mut now = conclave_node::Time::ZERO;
    let mut spread = std::collections::HashSet::new();
    // Each step: an op byte, a two-byte length, that many bytes.
    let mut rest = data;
    while rest.len() >= 3 {
        let op = rest[0];
        let n = u16::from_be_bytes([rest[1], rest[2]]) as usize;
        rest = &rest[3..];
        let bytes = &rest[..n.min(rest.len())];
        rest = &rest[bytes.len()..];
        let session = u64::from(op >> 4);
        match op & 0x7 {
            0 if op & 0x8 != 0 => {
                if node.open_spread_session(now, session).is_ok() {
                    spread.insert(session);
                }
            }
            0 => {
                if node.open_session(now, session).is_ok() {
                    spread.remove(&session);
                }
            }
            1 => node.handle_session_bytes(now, session, bytes),
            2 => node.handle_session_shared(now, session, &bytes::Bytes::copy_from_slice(bytes)),
            3 => node.close_session(now, session),
            4 | 5 => node.handle_datagram(now, peer, bytes::BytesMut::from(bytes)),
            _ => {
                now += std::time::Duration::from_millis(u64::from(
                    bytes.first().copied().unwrap_or(1),
                ));
                node.handle_timeout(now);
            }
        }
        // As the daemon drains a step: a token passed on first.
        let _ = node.poll_token();
        while let Some((id, out)) = node.poll_session() {
            if let SessionOutput::Bytes(frames, replies) = out {
                let b = frames.to_vec();
                if spread.contains(&id) {
                    node.handle_frames_written(id, frames, replies);
                    continue;
                }
                let mut at = 0;
                let mut count = 0;
                while let Ok(Some((body, used))) = next_frame(&b[at..]) {
                    assert!(Reply::decode(body).is_ok());
                    at += used;
                    count += 1;
                }
                assert_eq!((at, count), (b.len(), replies));
                node.handle_frames_written(id, frames, replies);
            }
        }
        while node.poll_datagram().is_some() {}
    }
});
