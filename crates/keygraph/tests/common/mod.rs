//! A test world: one server, its members, and a transport that hands every message to every
//! current member (a member must apply exactly the messages addressed to it and refuse the rest).

#![allow(dead_code)]

use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{GroupKey, Identity, SigScheme};
use conclave_keygraph::seal::open;
use conclave_keygraph::{
    GraphKind, Member, MemberConfig, MemberError, Server, ServerConfig, ServerEvent, Signing,
    Strategy, Transmit, UserId,
};
use conclave_wire::lkh::{KeyRef, RekeyMessage};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::collections::BTreeMap;

pub struct World {
    pub server: Server,
    pub members: BTreeMap<u64, Member>,
    pub rng: ChaCha20Rng,
    /// Every rekey message sent, with its epoch.
    pub sent: Vec<(u64, Transmit)>,
    /// Every key each user ever held, and the epoch it left (if it did).
    pub held: BTreeMap<u64, BTreeMap<KeyRef, GroupKey>>,
    pub left_at: BTreeMap<u64, u64>,
    pub joined_at: BTreeMap<u64, u64>,
    /// Group keys by epoch.
    pub group_keys: Vec<(u64, GroupKey)>,
    /// Whether to remember every key for the secrecy checks (costly in large worlds).
    pub track_keys: bool,
}

pub fn config(
    graph: GraphKind,
    strategy: Strategy,
    signing: Signing,
    compact: bool,
) -> ServerConfig {
    let mut c = ServerConfig::new("lkh-test", graph);
    c.strategy = strategy;
    c.signing = signing;
    c.compact = compact;
    c.aead = AeadAlg::Aes256Gcm;
    c
}

impl World {
    pub fn new(cfg: ServerConfig, seed: u64) -> World {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let id = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
        World {
            server: Server::new(cfg, Some(id)).unwrap(),
            members: BTreeMap::new(),
            rng,
            sent: Vec::new(),
            held: BTreeMap::new(),
            left_at: BTreeMap::new(),
            joined_at: BTreeMap::new(),
            group_keys: Vec::new(),
            track_keys: true,
        }
    }

    /// A world whose server starts with `n` members (the initial key distribution done).
    pub fn with_members(cfg: ServerConfig, seed: u64, n: u64) -> World {
        let mut w = World::new(cfg, seed);
        let id = Identity::generate(SigScheme::Ed25519, &mut w.rng).unwrap();
        let mut members = Vec::new();
        for u in 0..n {
            let k = w.individual_key();
            members.push((UserId(u), *k.expose()));
        }
        w.server =
            Server::with_members(w.server.config().clone(), Some(id), members, &mut w.rng).unwrap();
        let shape = w.server.shape();
        for u in 0..n {
            let (slot, keys) = w.server.member_keys(UserId(u)).unwrap();
            let m = Member::with_keys(w.member_config(), UserId(u), slot, 0, keys, shape).unwrap();
            w.joined_at.insert(u, 0);
            w.members.insert(u, m);
        }
        w.check();
        w
    }

    pub fn member_config(&self) -> MemberConfig {
        let c = self.server.config();
        MemberConfig {
            group: c.group.clone(),
            graph: c.graph,
            aead: c.aead,
            server: if c.signing == Signing::None {
                None
            } else {
                self.server.public_identity()
            },
        }
    }

    fn individual_key(&mut self) -> GroupKey {
        let mut k = [0u8; 32];
        self.rng.fill_bytes(&mut k);
        GroupKey::from_bytes(k)
    }

    pub fn join(&mut self, u: u64) {
        // The server would rekey a pending batch first on its own; doing it here keeps one epoch
        // per delivery.
        self.flush();
        let k = self.individual_key();
        let ack = self.server.join(UserId(u), &k, &mut self.rng).unwrap();
        self.joined_at.insert(u, ack.epoch);
        let m = Member::new(self.member_config(), &ack, k).unwrap();
        self.members.insert(u, m);
        self.deliver();
    }

    pub fn leave(&mut self, u: u64) {
        self.flush();
        self.server.leave(UserId(u), &mut self.rng).unwrap();
        self.members.remove(&u);
        self.left_at.insert(u, self.server.epoch());
        self.deliver();
    }

    pub fn queue_join(&mut self, u: u64) {
        let k = self.individual_key();
        let ack = self.server.queue_join(UserId(u), &k).unwrap();
        self.joined_at.insert(u, ack.epoch);
        let m = Member::new(self.member_config(), &ack, k).unwrap();
        self.members.insert(u, m);
    }

    pub fn queue_leave(&mut self, u: u64) {
        self.server.queue_leave(UserId(u)).unwrap();
        if let Some(_m) = self.members.remove(&u) {
            self.left_at.insert(u, self.server.epoch() + 1);
        }
    }

    pub fn flush(&mut self) {
        if self.server.rekey_batch(&mut self.rng).unwrap() {
            self.deliver();
        }
    }

    /// Hands every message to every member; checks who takes it.
    pub fn deliver(&mut self) {
        while let Some(ServerEvent::Relocated(ack)) = self.server.poll_event() {
            self.members
                .get_mut(&ack.user.0)
                .unwrap()
                .relocate(&ack)
                .unwrap();
        }
        let epoch = self.server.epoch();
        let mut applied: BTreeMap<u64, u32> = BTreeMap::new();
        while let Some(t) = self.server.poll_transmit() {
            let to: Vec<u64> = self
                .server
                .recipients(&t.recipients)
                .iter()
                .map(|u| u.0)
                .collect();
            for (u, m) in self.members.iter_mut() {
                let r = m.handle_rekey(&t.bytes);
                if to.contains(u) {
                    r.unwrap_or_else(|e| {
                        panic!("user {u} refused its message of epoch {epoch}: {e}")
                    });
                    *applied.entry(*u).or_default() += 1;
                } else {
                    assert!(
                        matches!(
                            r,
                            Err(MemberError::NotForMe) | Err(MemberError::Stale { .. })
                        ),
                        "user {u} on a message not for it: {r:?}"
                    );
                }
            }
            self.sent.push((epoch, t));
        }
        for (u, m) in &self.members {
            assert_eq!(
                applied.get(u).copied(),
                Some(1),
                "user {u} got one message in epoch {epoch}"
            );
            if self.track_keys {
                self.held.entry(*u).or_default().extend(m.keys());
            }
        }
        if let Some((_, k)) = self.server.group_key() {
            self.group_keys.push((epoch, k));
        }
        self.check();
    }

    /// Every member holds exactly the server's keys for it, and so the group key.
    pub fn check(&self) {
        let (gref, gkey) = match self.server.group_key() {
            Some(g) => g,
            None => {
                assert!(self.members.is_empty());
                return;
            }
        };
        for (u, m) in &self.members {
            let (slot, keys) = self.server.member_keys(UserId(*u)).unwrap();
            assert_eq!(m.slot(), slot, "user {u} slot");
            let mk = m.keys();
            assert_eq!(
                mk.iter().map(|k| k.0).collect::<Vec<_>>(),
                {
                    let mut v: Vec<_> = keys.iter().map(|k| k.0).collect();
                    v.sort();
                    v
                },
                "user {u} key refs"
            );
            for (a, b) in mk.iter().zip({
                let mut v = keys.clone();
                v.sort_by_key(|k| k.0);
                v
            }) {
                assert_eq!(a.1, b.1, "user {u} key {:?}", a.0);
            }
            let (r, k) = m.group_key().expect("member has the group key");
            assert_eq!((r, k), (gref, &gkey));
        }
    }

    /// Forward and backward secrecy against a curious member: starting from every key a member
    /// ever held, open every item of every message that can be opened, again and again; what it
    /// ends with must hold no group key of an epoch after it left or before it joined.
    pub fn check_secrecy(&self) {
        let alg = self.server.config().aead;
        let msgs: Vec<RekeyMessage> = self
            .sent
            .iter()
            .map(|(_, t)| RekeyMessage::decode(&t.bytes).unwrap().0)
            .collect();
        for (u, held) in &self.held {
            let left = self.left_at.get(u).copied();
            let joined = self.joined_at.get(u).copied();
            let mut known: BTreeMap<KeyRef, GroupKey> = held.clone();
            loop {
                let mut grew = false;
                for m in &msgs {
                    for it in &m.items {
                        let Some(k) = known.get(&it.under) else {
                            continue;
                        };
                        let Ok(keys) = open(alg, &m.group, m.epoch, it, k.expose()) else {
                            continue;
                        };
                        for (r, v) in it.keys.iter().zip(keys) {
                            if !known.contains_key(r) {
                                known.insert(*r, GroupKey::from_bytes(*v));
                                grew = true;
                            }
                        }
                    }
                }
                if !grew {
                    break;
                }
            }
            for (e, gk) in &self.group_keys {
                let forbidden = left.is_some_and(|l| *e >= l) || joined.is_some_and(|j| *e < j);
                if forbidden {
                    assert!(
                        known.values().all(|k| k != gk),
                        "user {u} (joined {joined:?}, left {left:?}) can derive the group key of epoch {e}"
                    );
                }
            }
        }
        // No two epochs share a group key.
        for (i, (e1, k1)) in self.group_keys.iter().enumerate() {
            for (e2, k2) in &self.group_keys[i + 1..] {
                if self.server.config().graph != GraphKind::Complete {
                    assert!(k1 != k2, "epochs {e1} and {e2} share a group key");
                }
            }
        }
    }
}
