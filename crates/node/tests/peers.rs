//! What a node refuses from the network is counted per peer and reason, and shown in the status
//! an admin asks for: no refusal is a silent drop. (Links off here, to reach the core with bad
//! packets; tests/links.rs has what sealed links refuse.)

use conclave_node::frag::split;
use conclave_node::{AdminRequest, Config, Node, NodeOptions, Time};
use conclave_wire::gcs::{Join, Packet};
use std::net::SocketAddr;

#[test]
fn refused_peer_input_is_counted_by_peer_and_reason() {
    let mut cfg = Config::local(2, 4800);
    cfg.links.mode = conclave_node::link::LinkMode::Off;
    let d2 = cfg.daemon[1].peer;
    let mut n = Node::new(cfg, "d1", NodeOptions::default(), Time::ZERO).unwrap();
    let stranger: SocketAddr = "127.0.0.1:9".parse().unwrap();
    n.handle_datagram(
        Time::from_micros(1),
        stranger,
        bytes::BytesMut::from(&[1u8, 0, 7][..]),
    );
    // Not a datagram at all.
    n.handle_datagram(
        Time::from_micros(2),
        d2,
        bytes::BytesMut::from(&[0xffu8][..]),
    );
    // A datagram carrying a packet that does not decode.
    n.handle_datagram(
        Time::from_micros(3),
        d2,
        bytes::BytesMut::from(&split(&[0xff, 0xee], 0).unwrap()[0][..]),
    );
    // A join of a ring no ring reaches.
    let join = Packet::Join(Join {
        sender: 2,
        incarnation: 0,
        ring_seq: u64::MAX,
        procs: vec![1, 2],
        failed: vec![],
    });
    for t in 4..6 {
        n.handle_datagram(
            Time::from_micros(t),
            d2,
            bytes::BytesMut::from(&split(&join.encode(), 0).unwrap()[0][..]),
        );
    }
    let status = n
        .handle_admin(Time::from_micros(6), AdminRequest::Status)
        .status
        .unwrap();
    let counts = &status.peer_refusals;
    assert_eq!(counts["unknown"]["unknown_sender"], 1, "{counts:?}");
    assert_eq!(counts["d2"]["bad_datagram"], 1, "{counts:?}");
    assert_eq!(counts["d2"]["undecodable"], 1, "{counts:?}");
    assert_eq!(counts["d2"]["ring_seq_out_of_range"], 2, "{counts:?}");
    let text = n.metrics().render();
    assert!(
        text.contains("conclave_peer_refusals{peer=\"d2\",reason=\"ring_seq_out_of_range\"} 2"),
        "{text}"
    );
}
