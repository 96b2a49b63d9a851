//! A network of nodes in one test, datagrams arriving at once: what went between them and what
//! they framed for their clients is kept.
#![allow(dead_code)]

pub mod spread_client;

use conclave_node::config::Identities;
use conclave_node::{Config, Node, NodeOptions, SessionId, SessionOutput, Time};
use conclave_wire::client::{next_frame, Reply};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::net::SocketAddr;

pub struct Net {
    pub nodes: Vec<Node>,
    pub addrs: Vec<SocketAddr>,
    pub now: u64,
    /// Every datagram that went between the nodes: from, to, bytes.
    pub captured: Vec<(usize, usize, Vec<u8>)>,
    /// Every reply a node framed for a client: node, session, reply.
    pub replies: Vec<(usize, SessionId, Reply)>,
    /// Sessions that speak Spread's protocol: their bytes go to `raw`, not `replies`.
    pub spread: std::collections::HashSet<(usize, SessionId)>,
    pub raw: std::collections::HashMap<(usize, SessionId), Vec<u8>>,
    /// Sessions the nodes closed.
    pub closed: Vec<(usize, SessionId)>,
    /// The size of every buffer of framed replies a node handed out: node, session, bytes,
    /// and how many of its payloads are views of the buffers they arrived in.
    pub handed_out: Vec<(usize, SessionId, usize, usize)>,
    /// Sessions whose replies are read but not written: they wait in `unwritten`, as a client
    /// that does not read keeps them (until [`Net::write_all`]).
    pub hold_writes: std::collections::HashSet<(usize, SessionId)>,
    pub unwritten: Vec<(usize, SessionId, conclave_node::Frames, usize)>,
}

pub fn network(n: usize, seed: u64) -> (Config, Identities) {
    Config::local(n, 4800).with_identities(&mut ChaCha8Rng::seed_from_u64(seed))
}

pub fn node(cfg: &Config, ids: &Identities, name: &str, inc: u32) -> Node {
    let opts = NodeOptions {
        incarnation: inc,
        identity: ids.get(name),
        link_salt: inc ^ 0x5a5a,
        secret_rng: Some(conclave_node::SecretRng::seeded(7)),
        ..Default::default()
    };
    Node::new(cfg.clone(), name, opts, Time::ZERO).unwrap()
}

impl Net {
    pub fn new(cfg: &Config, ids: &Identities) -> Net {
        Net {
            nodes: cfg
                .daemon
                .iter()
                .map(|d| node(cfg, ids, &d.name, 1))
                .collect(),
            addrs: cfg.daemon.iter().map(|d| d.peer).collect(),
            now: 0,
            captured: Vec::new(),
            replies: Vec::new(),
            spread: Default::default(),
            raw: Default::default(),
            closed: Vec::new(),
            handed_out: Vec::new(),
            hold_writes: Default::default(),
            unwritten: Vec::new(),
        }
    }

    /// Writes every reply held back by `hold_writes`.
    pub fn write_all(&mut self) {
        for (i, id, frames, count) in std::mem::take(&mut self.unwritten) {
            self.nodes[i].handle_frames_written(id, frames, count);
        }
    }

    pub fn time(&self) -> Time {
        Time::from_micros(self.now)
    }

    /// Runs the network for `ms` milliseconds, datagrams arriving at once.
    pub fn run(&mut self, ms: u64) {
        for _ in 0..ms * 10 {
            self.now += 100;
            let now = self.time();
            for i in 0..self.nodes.len() {
                if self.nodes[i].poll_timeout().is_some_and(|t| t <= now) {
                    self.nodes[i].handle_timeout(now);
                }
            }
            let mut moved = true;
            while moved {
                moved = false;
                for i in 0..self.nodes.len() {
                    // As the daemon's driver does: a token passed on goes before anything else.
                    let token = self.nodes[i].poll_token();
                    while let Some((id, out)) = self.nodes[i].poll_session() {
                        moved = true;
                        if out == SessionOutput::Close {
                            self.closed.push((i, id));
                        }
                        if let SessionOutput::Bytes(frames, count) = out {
                            let b = frames.to_vec();
                            if self.spread.contains(&(i, id)) {
                                self.raw.entry((i, id)).or_default().extend_from_slice(&b);
                                self.nodes[i].handle_frames_written(id, frames, count);
                                continue;
                            }
                            let mut at = 0;
                            while let Some((body, used)) = next_frame(&b[at..]).unwrap() {
                                self.replies.push((i, id, Reply::decode(body).unwrap()));
                                at += used;
                            }
                            assert_eq!(at, b.len(), "a buffer ends with a whole reply");
                            self.handed_out.push((i, id, b.len(), frames.views()));
                            if self.hold_writes.contains(&(i, id)) {
                                self.unwritten.push((i, id, frames, count));
                            } else {
                                self.nodes[i].handle_frames_written(id, frames, count);
                            }
                        }
                    }
                    let rest = std::iter::from_fn(|| self.nodes[i].poll_datagram());
                    let datagrams: Vec<_> = token.into_iter().chain(rest).collect();
                    for (to, d) in datagrams {
                        moved = true;
                        let j = self.addrs.iter().position(|a| *a == to).unwrap();
                        self.captured.push((i, j, d.clone()));
                        self.nodes[j].handle_datagram(
                            now,
                            self.addrs[i],
                            bytes::BytesMut::from(&d[..]),
                        );
                    }
                }
            }
        }
    }

    /// Sends `req` on session `id` of node `i`.
    pub fn request(&mut self, i: usize, id: SessionId, req: conclave_wire::client::Request) {
        let now = self.time();
        let bytes = conclave_wire::client::frame(&req.encode());
        self.nodes[i].handle_session_shared(now, id, &bytes::Bytes::from(bytes));
    }

    /// What went from node `from` to node `to`, in order.
    pub fn sent(&self, from: usize, to: usize) -> Vec<Vec<u8>> {
        self.captured
            .iter()
            .filter(|(f, t, _)| (*f, *t) == (from, to))
            .map(|(_, _, d)| d.clone())
            .collect()
    }

    pub fn ring(&self, i: usize) -> (Option<conclave_wire::gcs::RingId>, Vec<u32>) {
        let m = self.nodes[i].core().membership();
        (m.ring(), m.ring_members())
    }

    pub fn refusals(&self, i: usize, peer: &str, reason: &str) -> u64 {
        self.nodes[i]
            .metrics()
            .peer_refusals()
            .iter()
            .filter(|((p, r), _)| p == peer && *r == reason)
            .map(|(_, n)| *n)
            .sum()
    }
}
