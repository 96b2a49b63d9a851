//! A pass that delivers much to one client hands its replies out in buffers of about
//! [`CHUNK_BYTES`] each, every one ending with a whole reply, rather than in one buffer grown by
//! doubling (which copied everything framed before at each step).

mod common;

use common::{network, Net};
use conclave_node::node::CHUNK_BYTES;
use conclave_wire::client::{ClientCommand, ClientEvent, Reply, Request};
use conclave_wire::gcs::ServiceType;

fn member(net: &mut Net, i: usize, id: u64, name: &str) {
    let now = net.time();
    net.nodes[i].open_session(now, id).unwrap();
    net.request(i, id, Request::Connect { name: name.into() });
    let join = ClientCommand::Join {
        group: "g".into(),
        vs: false,
    };
    net.request(i, id, Request::Command(join));
}

#[test]
fn a_long_pass_hands_a_clients_replies_out_in_chunks_in_order() {
    let (cfg, ids) = network(3, 5);
    let mut net = Net::new(&cfg, &ids);
    net.run(400);
    assert_eq!(net.ring(0).1, vec![1, 2, 3], "the ring formed");
    member(&mut net, 0, 1, "a");
    member(&mut net, 1, 1, "b");
    net.run(50);
    let before = net.handed_out.len();
    let replies_before = net.replies.len();
    let sent: Vec<Vec<u8>> = (0..600u32)
        .map(|k| {
            let mut p = vec![(k % 251) as u8; 1000 + k as usize % 40];
            p[..4].copy_from_slice(&k.to_be_bytes());
            p
        })
        .collect();
    for p in &sent {
        let send = ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["g".into()],
            payload: p.clone().into(),
        };
        net.request(0, 1, Request::Command(send));
    }
    net.run(100);
    // Every message reached b whole and in order.
    let got: Vec<Vec<u8>> = net.replies[replies_before..]
        .iter()
        .filter(|(i, id, _)| (*i, *id) == (1, 1))
        .filter_map(|(_, _, r)| match r {
            Reply::Event(ClientEvent::Message { payload, .. }) => Some(payload.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(got, sent);
    // b's buffers: none much past a chunk, and some full ones (600 KiB went in a few passes).
    let sizes: Vec<usize> = net.handed_out[before..]
        .iter()
        .filter(|(i, id, _)| (*i, *id) == (1, 1))
        .map(|(_, _, n)| *n)
        .collect();
    let frame_max = 1100;
    assert!(
        sizes.iter().all(|&n| n < CHUNK_BYTES + frame_max),
        "{sizes:?}"
    );
    assert!(
        sizes.iter().filter(|&&n| n >= CHUNK_BYTES).count() >= 4,
        "{sizes:?}"
    );
}
