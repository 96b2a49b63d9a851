//! A pass that delivers much to one client hands its replies out in buffers of about
//! [`CHUNK_BYTES`] each, every one ending with a whole reply, rather than in one buffer grown by
//! doubling (which copied everything framed before at each step).

mod common;

use common::{network, Net};
use conclave_node::node::CHUNK_BYTES;
use conclave_wire::client::{frame, ClientCommand, ClientEvent, Reply, Request};
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

/// A ring of three with member `a` at the first daemon and `b` at the second, both in group g.
fn ring_of_two_members() -> Net {
    ring_of_two_members_with(|_| {})
}

/// [`ring_of_two_members`] with the configuration `change` makes.
fn ring_of_two_members_with(change: impl FnOnce(&mut conclave_node::Config)) -> Net {
    let (mut cfg, ids) = network(3, 5);
    change(&mut cfg);
    let mut net = Net::new(&cfg, &ids);
    net.run(400);
    assert_eq!(net.ring(0).1, vec![1, 2, 3], "the ring formed");
    member(&mut net, 0, 1, "a");
    member(&mut net, 1, 1, "b");
    net.run(50);
    net
}

/// The payloads `b` received, in order, among the replies from `from` on.
fn payloads_at_b(net: &Net, from: usize) -> Vec<Vec<u8>> {
    net.replies[from..]
        .iter()
        .filter(|(i, id, _)| (*i, *id) == (1, 1))
        .filter_map(|(_, _, r)| match r {
            Reply::Event(ClientEvent::Message { payload, .. }) => Some(payload.to_vec()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_long_pass_hands_a_clients_replies_out_in_chunks_in_order() {
    let mut net = ring_of_two_members();
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
    let got = payloads_at_b(&net, replies_before);
    assert_eq!(got, sent);
    // b's buffers: none much past a chunk, and some full ones (600 KiB went in a few passes).
    let sizes: Vec<usize> = net.handed_out[before..]
        .iter()
        .filter(|(i, id, _, _)| (*i, *id) == (1, 1))
        .map(|(_, _, n, _)| *n)
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

/// A daemon keeps the payloads of the requests it reads as views of the buffer it read them
/// into: many requests in a few reads, one cut in two between reads, arrive whole and in order,
/// and once every daemon has them the node holds nothing of the buffers.
#[test]
fn payloads_read_in_shared_buffers_arrive_whole_and_the_buffers_are_let_go() {
    let mut net = ring_of_two_members();
    let replies_before = net.replies.len();
    let sent: Vec<Vec<u8>> = (0..300u32)
        .map(|k| {
            let mut p = vec![(k % 251) as u8; 1 + (k as usize * 37) % 3000];
            p[..1].copy_from_slice(&[(k % 256) as u8]);
            p
        })
        .collect();
    let mut stream = Vec::new();
    let mut starts = Vec::new();
    for p in &sent {
        let send = ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["g".into()],
            payload: p.clone().into(),
        };
        starts.push(stream.len());
        stream.extend(conclave_wire::client::frame(
            &Request::Command(send).encode(),
        ));
    }
    // Three reads, cut inside requests: the first cut inside a request's 4-byte length, the
    // second inside a body.
    let cuts = [0, starts[10] + 2, starts[150] + 30, stream.len()];
    let reads: Vec<bytes::Bytes> = cuts
        .windows(2)
        .map(|w| bytes::Bytes::copy_from_slice(&stream[w[0]..w[1]]))
        .collect();
    for r in &reads {
        let now = net.time();
        net.nodes[0].handle_session_shared(now, 1, r);
    }
    // Not copies: the messages waiting for the token hold views of the reads.
    assert!(!reads[0].is_unique() && !reads[2].is_unique());
    net.run(200);
    let got = payloads_at_b(&net, replies_before);
    assert_eq!(got, sent);
    for (k, r) in reads.into_iter().enumerate() {
        assert!(r.is_unique(), "read {k} is still held");
    }
}

/// A message that must wait (here for its client's join to take effect) keeps a copy of its
/// payload, not a view of the read it came in: what a client has held is bounded by its
/// payloads, and the read's buffer goes back to the daemon at once.
#[test]
fn a_held_message_keeps_no_view_of_its_read() {
    let (cfg, ids) = network(3, 5);
    let mut net = Net::new(&cfg, &ids);
    net.run(400);
    let now = net.time();
    net.nodes[0].open_session(now, 1).unwrap();
    net.request(0, 1, Request::Connect { name: "a".into() });
    net.run(10);
    let join = ClientCommand::Join {
        group: "g".into(),
        vs: false,
    };
    let send = |byte: u8| {
        conclave_wire::client::frame(
            &Request::Command(ClientCommand::Multicast {
                service: ServiceType::Agreed,
                groups: vec!["g".into()],
                payload: vec![byte; 500].into(),
            })
            .encode(),
        )
    };
    let mut stream = conclave_wire::client::frame(&Request::Command(join).encode());
    stream.extend(send(7));
    let read = bytes::Bytes::from(stream);
    let now = net.time();
    net.nodes[0].handle_session_shared(now, 1, &read);
    assert!(
        read.is_unique(),
        "the held message holds a view of its read"
    );
    let replies_before = net.replies.len();
    net.run(100);
    let got: Vec<_> = net.replies[replies_before..]
        .iter()
        .filter_map(|(_, _, r)| match r {
            Reply::Event(ClientEvent::Message { payload, .. }) => Some(payload.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![bytes::Bytes::from(vec![7u8; 500])]);
    // The same message once the client is in the group waits only for the token, with a view.
    let read = bytes::Bytes::from(send(8));
    let now = net.time();
    net.nodes[0].handle_session_shared(now, 1, &read);
    assert!(!read.is_unique(), "a message on its way keeps a view");
    net.run(100);
    assert!(read.is_unique(), "let go once every daemon has it");
}

/// While the ring takes no messages (here: it has not formed yet), a client's held messages keep
/// their views only up to the client library's window; past it each keeps a copy, so that a
/// client cannot make its daemon hold a read's buffer per tiny message.
#[test]
fn held_messages_keep_views_of_their_reads_only_up_to_a_window() {
    let (cfg, ids) = network(3, 5);
    let mut net = Net::new(&cfg, &ids);
    member(&mut net, 0, 1, "a");
    let reads: Vec<bytes::Bytes> = (0..300)
        .map(|_| {
            let send = ClientCommand::Multicast {
                service: ServiceType::Agreed,
                groups: vec!["g".into()],
                payload: vec![1u8; 100].into(),
            };
            conclave_wire::client::frame(&Request::Command(send).encode()).into()
        })
        .collect();
    let now = net.time();
    for r in &reads {
        net.nodes[0].handle_session_shared(now, 1, r);
    }
    let viewed = reads.iter().filter(|r| !r.is_unique()).count();
    // The join is held first, so 255 messages find fewer than 256 held before them.
    assert_eq!(viewed, 255);
    net.run(400);
    let got = net
        .replies
        .iter()
        .filter(|(_, _, r)| matches!(r, Reply::Event(ClientEvent::Message { .. })))
        .count();
    assert_eq!(got, 300, "every message delivered once the ring formed");
    assert!(reads.iter().all(|r| r.is_unique()), "every read let go");
}

/// The messages of a ring of two members, `a` sending `n` payloads of `len` bytes (each marked
/// with its number) to g, and what `b` received of them.
fn send_from_a(net: &mut Net, n: u32, len: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|k| {
            let mut p = vec![(k % 251) as u8; len];
            p[..4].copy_from_slice(&k.to_be_bytes());
            let send = ClientCommand::Multicast {
                service: ServiceType::Agreed,
                groups: vec!["g".into()],
                payload: p.clone().into(),
            };
            net.request(0, 1, Request::Command(send));
            p
        })
        .collect()
}

/// How many of the payloads handed out to `b` since `from` were views.
fn views_at_b(net: &Net, from: usize) -> usize {
    net.handed_out[from..]
        .iter()
        .filter(|(i, id, _, _)| (*i, *id) == (1, 1))
        .map(|(.., views)| *views)
        .sum()
}

/// A delivery's payload of 1 KiB goes out as a view of the buffer it arrived in, and one of
/// a few bytes as a copy; written, the views are let go.
#[test]
fn large_payloads_are_delivered_as_views_and_let_go_once_written() {
    let mut net = ring_of_two_members();
    let (replies_before, before) = (net.replies.len(), net.handed_out.len());
    let mut sent = send_from_a(&mut net, 200, 1024);
    net.run(50);
    assert_eq!(
        views_at_b(&net, before),
        200,
        "each of b's deliveries a view"
    );
    let small_from = net.handed_out.len();
    for k in 0..50u8 {
        let send = ClientCommand::Multicast {
            service: ServiceType::Agreed,
            groups: vec!["g".into()],
            payload: vec![k; 16].into(),
        };
        net.request(0, 1, Request::Command(send));
        sent.push(vec![k; 16]);
    }
    net.run(50);
    assert!(net.handed_out[small_from..].iter().all(|(.., v)| *v == 0));
    assert_eq!(payloads_at_b(&net, replies_before), sent);
    assert!(net.nodes.iter().all(|n| n.delivery_views() == 0));
}

/// A client that does not read keeps its deliveries' views only up to the budget: past it,
/// payloads are copied; every message still arrives whole, and once written nothing is held.
#[test]
fn unwritten_deliveries_hold_views_only_up_to_the_budget() {
    use conclave_node::frames::MAX_VIEWS;
    let mut net = ring_of_two_members();
    net.hold_writes.insert((1, 1));
    let (replies_before, before) = (net.replies.len(), net.handed_out.len());
    let n = MAX_VIEWS as u32 + 300;
    let mut sent = Vec::new();
    // In rounds: the daemons' flow control takes a few hundred messages at a time.
    for _ in 0..4 {
        sent.extend(send_from_a(&mut net, n / 4, 1024));
        net.run(50);
    }
    assert_eq!(
        views_at_b(&net, before),
        MAX_VIEWS,
        "views up to the budget, copies past it"
    );
    assert_eq!(net.nodes[1].delivery_views(), MAX_VIEWS);
    assert_eq!(payloads_at_b(&net, replies_before), sent);
    net.hold_writes.clear();
    net.write_all();
    assert!(net.nodes.iter().all(|n| n.delivery_views() == 0));
}

/// A client cut off for not reading lets go of the views its unsent replies held: those still
/// being written keep theirs until they are.
#[test]
fn a_client_cut_off_as_slow_lets_its_views_go() {
    let mut net = ring_of_two_members_with(|c| c.sessions.max_unread_per_client = 100);
    net.hold_writes.insert((1, 1));
    let before = net.handed_out.len();
    send_from_a(&mut net, 90, 1024);
    net.run(50);
    assert!(net.closed.is_empty());
    let held = views_at_b(&net, before);
    assert!(held > 0);
    assert_eq!(net.nodes[1].delivery_views(), held);
    // Past its 100 unread replies, b is cut off: what was framed for it and not handed out
    // goes, with its views; what was handed out keeps its views until it is dropped.
    send_from_a(&mut net, 60, 1024);
    net.run(50);
    assert!(net.closed.contains(&(1, 1)), "b was cut off");
    let handed: usize = net.unwritten.iter().map(|(_, _, f, _)| f.views()).sum();
    assert!(handed >= held);
    assert_eq!(net.nodes[1].delivery_views(), handed);
    net.unwritten.clear();
    assert_eq!(net.nodes[1].delivery_views(), 0);
}

/// A client's acknowledgements in a row, of one group, service and view, go out as one reply,
/// in their place among its other replies; a client's decoder hands them out one by one.
#[test]
fn acknowledgements_in_a_row_go_as_one_reply_in_their_place() {
    let mut net = ring_of_two_members();
    let join = ClientCommand::Join {
        group: "h".into(),
        vs: false,
    };
    net.request(0, 1, Request::Command(join));
    net.run(50);
    let from = net.replies.len();
    // One read: to g three times, to h twice, to g once more, with another service.
    let sends = [
        ("g", ServiceType::Agreed),
        ("g", ServiceType::Agreed),
        ("g", ServiceType::Agreed),
        ("h", ServiceType::Agreed),
        ("h", ServiceType::Agreed),
        ("g", ServiceType::Fifo),
    ];
    read_at_a(
        &mut net,
        sends.iter().flat_map(|(g, s)| multicast(g, *s)).collect(),
    );
    net.run(50);
    let acks: Vec<(String, ServiceType, u16)> = net.replies[from..]
        .iter()
        .filter(|(i, id, _)| (*i, *id) == (0, 1))
        .filter_map(|(_, _, r)| match r {
            Reply::SentRun {
                group,
                service,
                count,
                ..
            } => Some((group.clone(), *service, *count)),
            Reply::Event(ClientEvent::Sent { group, service, .. }) => {
                Some((group.clone(), *service, 1))
            }
            _ => None,
        })
        .collect();
    let want = [
        ("g", ServiceType::Agreed, 3),
        ("h", ServiceType::Agreed, 2),
        ("g", ServiceType::Fifo, 1),
    ];
    assert_eq!(
        acks,
        want.map(|(g, s, n)| (g.to_string(), s, n)),
        "three replies for six acknowledgements"
    );
    // Every acknowledgement came before the deliveries of the messages it acknowledged.
    let mine: Vec<&Reply> = net.replies[from..]
        .iter()
        .filter(|(i, id, _)| (*i, *id) == (0, 1))
        .map(|(_, _, r)| r)
        .collect();
    let first_message = mine
        .iter()
        .position(|r| matches!(r, Reply::Event(ClientEvent::Message { .. })))
        .unwrap();
    assert_eq!(first_message, 3);
    assert_eq!(mine.len(), 3 + 6);
}

/// Acknowledgements still waiting as a run when the client disconnects go out before the
/// connection closes.
#[test]
fn a_run_waiting_at_a_disconnect_goes_out_before_the_close() {
    let mut net = ring_of_two_members();
    let from = net.replies.len();
    let mut bytes = multicast("g", ServiceType::Agreed).repeat(3);
    bytes.extend(frame(&Request::Disconnect.encode()));
    read_at_a(&mut net, bytes);
    net.run(50);
    assert!(net.closed.contains(&(0, 1)));
    let acks: Vec<u16> = net.replies[from..]
        .iter()
        .filter(|(i, id, _)| (*i, *id) == (0, 1))
        .filter_map(|(_, _, r)| match r {
            Reply::SentRun { count, .. } => Some(*count),
            Reply::Event(ClientEvent::Sent { .. }) => Some(1),
            _ => None,
        })
        .collect();
    assert_eq!(acks, [3]);
}

/// A client cut off for not reading is handed nothing framed after the cut-off, not even the
/// acknowledgement that was waiting to start a run.
#[test]
fn a_client_cut_off_by_its_acknowledgements_is_handed_nothing_more() {
    let mut net = ring_of_two_members_with(|c| c.sessions.max_unread_per_client = 20);
    let join = ClientCommand::Join {
        group: "h".into(),
        vs: false,
    };
    net.request(0, 1, Request::Command(join));
    net.run(50);
    net.hold_writes.insert((0, 1));
    let from = net.replies.len();
    // Alternating groups: every acknowledgement breaks the run before it.
    let bytes = (0..30)
        .flat_map(|k| multicast(["g", "h"][k % 2], ServiceType::Agreed))
        .collect();
    read_at_a(&mut net, bytes);
    net.run(50);
    assert!(net.closed.contains(&(0, 1)), "a was cut off");
    // Handed out: the ten framed when half the limit was reached, with the acknowledgement
    // then waiting; what was framed after them went with the cut-off.
    let acks = net.replies[from..]
        .iter()
        .filter(|(i, id, r)| {
            (*i, *id) == (0, 1) && matches!(r, Reply::Event(ClientEvent::Sent { .. }))
        })
        .count();
    assert_eq!(acks, 11);
}

/// The replies of `a` (client 1 at the first daemon) from `from` on, and the buffers they were
/// handed out in from `buffers_from` on.
fn at_a(net: &Net, from: usize, buffers_from: usize) -> (Vec<&Reply>, usize) {
    let replies = net.replies[from..]
        .iter()
        .filter(|(i, id, _)| (*i, *id) == (0, 1))
        .map(|(_, _, r)| r)
        .collect();
    let buffers = net.handed_out[buffers_from..]
        .iter()
        .filter(|(i, id, ..)| (*i, *id) == (0, 1))
        .count();
    (replies, buffers)
}

/// A message of 100 bytes to `group`, framed.
fn multicast(group: &str, service: ServiceType) -> Vec<u8> {
    let send = ClientCommand::Multicast {
        service,
        groups: vec![group.into()],
        payload: vec![7; 100].into(),
    };
    frame(&Request::Command(send).encode())
}

/// `bytes` as one read of `a`'s connection (client 1 at the first daemon).
fn read_at_a(net: &mut Net, bytes: Vec<u8>) {
    let now = net.time();
    net.nodes[0].handle_session_shared(now, 1, &bytes::Bytes::from(bytes));
}

/// One message to `g` from `a`.
fn send_one(net: &mut Net, service: ServiceType) {
    read_at_a(net, multicast("g", service));
}

/// A sender's lone acknowledgement waits for the delivery of its message and goes with it: the
/// sender is woken once, not twice.
#[test]
fn a_lone_acknowledgement_goes_out_with_the_delivery_of_its_message() {
    for (delay_us, buffers_wanted) in [(1_000, 1), (0, 2)] {
        let mut net = ring_of_two_members_with(|c| c.sessions.ack_delay_us = delay_us);
        let (from, buffers_from) = (net.replies.len(), net.handed_out.len());
        send_one(&mut net, ServiceType::Agreed);
        net.run(20);
        let (replies, buffers) = at_a(&net, from, buffers_from);
        assert!(
            matches!(
                replies[..],
                [
                    Reply::Event(ClientEvent::Sent { .. }),
                    Reply::Event(ClientEvent::Message { .. })
                ]
            ),
            "{replies:?}"
        );
        assert_eq!(buffers, buffers_wanted, "with ack_delay_us = {delay_us}");
    }
}

/// An acknowledgement whose message is slow to be delivered goes out alone once `ack_delay_us`
/// has passed: the daemon sets its timer for it.
#[test]
fn a_lone_acknowledgement_waits_no_longer_than_the_delay() {
    let mut net = ring_of_two_members_with(|c| c.sessions.ack_delay_us = 2_000);
    // Every datagram between the daemons takes 5 ms, and a safe message waits for two rounds of
    // the token: the delivery takes longer than the delay.
    for i in 0..3 {
        let now = net.time();
        let delay = conclave_node::admin::AdminRequest::Delay {
            ms: 5,
            jitter_ms: 0,
            peer: None,
        };
        net.nodes[i].handle_admin(now, delay);
    }
    net.run(50);
    let (from, buffers_from) = (net.replies.len(), net.handed_out.len());
    let sent_at = net.time();
    send_one(&mut net, ServiceType::Safe);
    // Outputs are prepared on the first poll after the inputs (no records are kept here).
    assert!(net.nodes[0].poll_record().is_none());
    let due = net.nodes[0].poll_timeout().expect("a timer is set");
    assert!(
        due <= sent_at + std::time::Duration::from_millis(2),
        "{due:?}"
    );
    net.run(1);
    assert_eq!(at_a(&net, from, buffers_from).0.len(), 0, "held after 1 ms");
    net.run(2);
    let (replies, buffers) = at_a(&net, from, buffers_from);
    assert!(
        matches!(replies[..], [Reply::Event(ClientEvent::Sent { .. })]),
        "the acknowledgement alone after 3 ms: {replies:?}"
    );
    assert_eq!(buffers, 1);
    net.run(100);
    let (replies, _) = at_a(&net, from, buffers_from);
    assert!(
        matches!(replies[1..], [Reply::Event(ClientEvent::Message { .. })]),
        "then the delivery: {replies:?}"
    );
}

/// Two acknowledgements in a row go out at the end of their pass, without waiting for the
/// deliveries: their sender may be waiting on its window.
#[test]
fn a_run_of_acknowledgements_does_not_wait() {
    let mut net = ring_of_two_members();
    read_at_a(&mut net, multicast("g", ServiceType::Agreed).repeat(2));
    let handed = std::iter::from_fn(|| net.nodes[0].poll_session()).count();
    assert_eq!(
        handed, 1,
        "the run is handed out in the pass that framed it"
    );
}
