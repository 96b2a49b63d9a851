//! The links between daemons: every datagram authenticated and (by default) encrypted under a
//! key only its two ends hold, replays refused, and the daemons of an earlier run kept apart
//! from the present one (docs/links.md, which also gives the threat model).
//!
//! Keys. Each pair of configured daemons shares a static secret, the X25519 of their Ed25519
//! identities ([`conclave_crypto::StaticDh`]), bound to both names and keys. Each run of a
//! daemon has an *epoch* (its incarnation in the high 32 bits, random bits below). A datagram
//! from `i` to `j` is sealed under a key derived from the pair's secret, the direction and both
//! epochs: the sender's and the receiver's as the sender knows it. So a datagram recorded before
//! `j` restarted does not open in `j`'s new run, and one from an earlier run of `i` is refused
//! once `j` has heard `i`'s newer epoch. Within one pair of epochs the counter (the nonce) must
//! grow past an 8,128-datagram window, which refuses replays and tolerates reordering.
//!
//! Learning a peer's epoch. A daemon that does not know its peer's epoch (at start, or when the
//! peer restarted and refuses what is bound to its old one) cannot send it data: it sends a
//! *hello* instead, at most every [`HELLO_GAP`]. A hello bound to epoch 0 ("I do not know yours")
//! and a datagram bound to an earlier epoch of the receiver are checked like any other (an
//! outsider gets no answer) and answered with a hello bound to the sender's stated epoch; only a
//! datagram bound to the receiver's own epoch teaches it the sender's. Until the epochs are
//! known, data to that peer is dropped: the ring retransmits what it lost.
//!
//! Departure from paper 002 §V-B1, which signed and encrypted the membership messages with
//! public-key cryptography: a static Diffie-Hellman key per pair costs one AEAD per datagram
//! instead of a signature, at the price of forward secrecy for what is sent under it (the
//! daemons' contributory key, once agreed, replaces it for the ring's traffic).

use crate::frag::Room;
use conclave_crypto::aead::{Aead, AeadAlg};
use conclave_crypto::{kdf, PublicIdentity, StaticDh};
use conclave_gcs::Time;
use conclave_wire::gcs::DaemonId;
use conclave_wire::link::{LinkHeader, LinkKind, HEADER_BYTES, TAG_BYTES};
use serde::Deserialize;
use std::ops::Range;
use std::time::Duration;
use zeroize::Zeroizing;

/// How the links between daemons are protected (`[links] mode`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LinkMode {
    /// Authenticated and encrypted (AES-256-GCM): the default.
    #[default]
    Sealed,
    /// Authenticated, in the clear (a GMAC tag over header and body).
    Authenticated,
    /// Neither: any process that reaches the peer port can read and inject. For benchmarks and
    /// networks trusted as a whole; the daemon says so loudly at start.
    Off,
}

impl LinkMode {
    pub fn name(self) -> &'static str {
        match self {
            LinkMode::Sealed => "sealed",
            LinkMode::Authenticated => "authenticated",
            LinkMode::Off => "off",
        }
    }
}

/// Least time between two hellos to one peer.
pub const HELLO_GAP: Duration = Duration::from_millis(10);
/// Bytes a protected link adds to a datagram.
pub const OVERHEAD: usize = HEADER_BYTES + TAG_BYTES;

/// Why a datagram was refused by the link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefusal {
    #[error("not a protected datagram (malformed header, or the sender's links are off)")]
    Malformed,
    #[error("the header names another sender or receiver than the datagram's")]
    Misdirected,
    #[error("does not authenticate: forged, altered, or under a key the sender does not hold")]
    Forged,
    #[error("received before, or older than the replay window")]
    Replayed,
    #[error("from an earlier run of the sender")]
    OldEpoch,
    #[error("bound to an earlier run of this daemon (answered with a hello)")]
    Stale,
    #[error("under a daemons' key this daemon does not hold (yet, or any more)")]
    UnknownKey,
}

impl LinkRefusal {
    /// The refusal's name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            LinkRefusal::Malformed => "link_malformed",
            LinkRefusal::Misdirected => "link_misdirected",
            LinkRefusal::Forged => "link_forged",
            LinkRefusal::Replayed => "link_replayed",
            LinkRefusal::OldEpoch => "link_old_epoch",
            LinkRefusal::Stale => "link_stale",
            LinkRefusal::UnknownKey => "link_unknown_key",
        }
    }

    /// Whether only an attacker (or a misconfiguration) sends such a datagram; duplicates from
    /// the network and datagrams meant for a daemon's earlier run are not.
    pub fn hostile(self) -> bool {
        // A peer that has the daemons' new key a little before this daemon sends under it.
        !matches!(
            self,
            LinkRefusal::Replayed | LinkRefusal::Stale | LinkRefusal::UnknownKey
        )
    }
}

/// What an accepted datagram holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// Bytes for the core, at this range of the datagram.
    Data(Range<usize>),
    /// A hello: nothing for the core.
    Control,
}

#[derive(Debug, thiserror::Error)]
pub enum LinkSetupError {
    #[error("links are {0} but this daemon has no identity (conclave keygen; --identity)")]
    NoIdentity(&'static str),
    #[error("daemon {0:?} has no key in the configuration")]
    NoKey(String),
    #[error("daemon {0:?}'s key cannot be used: {1}")]
    BadKey(String, conclave_crypto::DhError),
    #[error("this daemon's identity is not the key the configuration names for {0:?}")]
    WrongIdentity(String),
}

/// The link layer of one daemon.
pub struct Links {
    mode: LinkMode,
    me: DaemonId,
    epoch: u64,
    /// The nonce of the next datagram: one count for every peer and key, so never repeated.
    counter: u64,
    /// By daemon id from 1 (this daemon's own among them: a ring of one sends to itself);
    /// empty with links off.
    peers: Vec<PeerLink>,
    /// The daemons' keys this daemon holds, newest last: the current one, and the one before
    /// while datagrams under it may still be on their way.
    ring_keys: Vec<RingKey>,
    /// Ids of the last daemons' keys dropped: a peer that still sends under one is told what
    /// this daemon holds now.
    retired: std::collections::VecDeque<u64>,
    hellos: Vec<(DaemonId, Vec<u8>)>,
}

/// A key the daemons of a ring agreed among themselves ([`Links::install_ring_key`]).
struct RingKey {
    id: u64,
    secret: Zeroizing<[u8; 32]>,
    /// The daemons that hold it, by id.
    members: Vec<DaemonId>,
}

/// Daemons' keys held at once: the current one and its predecessor.
const RING_KEYS_KEPT: usize = 2;
/// Ids of dropped daemons' keys remembered.
const RETIRED_KEPT: usize = 8;

struct PeerLink {
    /// The pair's secret, bound to both names and keys.
    secret: Zeroizing<[u8; 32]>,
    /// The peer's epoch, learnt from a datagram bound to this daemon's own.
    epoch: Option<u64>,
    /// The key datagrams to the peer go under (by key id, 0 the pair's static key), bound to
    /// both current epochs.
    send: Option<(u64, Aead)>,
    /// Keys datagrams from the peer come under, bound to both current epochs, by key id.
    recv: Vec<(u64, Aead)>,
    /// The daemons' key the peer holds, as its latest hello or datagram under a daemons' key
    /// said (0: none): only under a key both ends hold can a datagram go.
    holds: u64,
    /// The counter of the datagram that said so (a hello reordered after a later one does not
    /// take it back).
    holds_said_at: u64,
    window: ReplayWindow,
    asked_at: Option<Time>,
    answered_at: Option<Time>,
    /// When a hello under the current daemons' key last went to the peer.
    key_offered_at: Option<Time>,
    /// The peer has sent data under this daemon's current daemons' key: it knows this one
    /// holds it, so no more hellos need say so.
    knows_mine: bool,
}

/// Why a hello goes out.
#[derive(Clone, Copy)]
enum Hello {
    /// This daemon does not know the peer's epoch (at most every [`HELLO_GAP`]).
    Ask,
    /// The peer sent something bound to no epoch or an old one of this daemon's (likewise).
    Answer,
    /// The peer's hello brought a new epoch of its: it may not know this one (once per epoch).
    Learnt,
}

impl Links {
    /// The links of daemon `me` (id from 1) in its run `epoch` (not 0), to the daemons of
    /// `roster` (by id from 1: name and public key).
    pub fn new(
        mode: LinkMode,
        me: DaemonId,
        epoch: u64,
        identity: Option<&StaticDh>,
        roster: &[(String, Option<PublicIdentity>)],
    ) -> Result<Links, LinkSetupError> {
        let mut peers = Vec::with_capacity(roster.len());
        if mode != LinkMode::Off {
            let dh = identity.ok_or(LinkSetupError::NoIdentity(mode.name()))?;
            let (my_name, my_key) = &roster[(me - 1) as usize];
            let my_key = my_key
                .as_ref()
                .ok_or_else(|| LinkSetupError::NoKey(my_name.clone()))?;
            if my_key.ed25519_bytes() != Some(dh.ed25519_public()) {
                return Err(LinkSetupError::WrongIdentity(my_name.clone()));
            }
            // This daemon is a peer of its own too: a ring of one sends its token to itself.
            for (name, key) in roster.iter() {
                let key = key
                    .as_ref()
                    .ok_or_else(|| LinkSetupError::NoKey(name.clone()))?;
                let shared = dh
                    .agree(key)
                    .map_err(|e| LinkSetupError::BadKey(name.clone(), e))?;
                let theirs = key.ed25519_bytes().expect("agree takes Ed25519 keys only");
                let mine = dh.ed25519_public();
                let (a, b) = if (my_name.as_bytes(), &mine) < (name.as_bytes(), &theirs) {
                    ((my_name.as_bytes(), mine), (name.as_bytes(), theirs))
                } else {
                    ((name.as_bytes(), theirs), (my_name.as_bytes(), mine))
                };
                let secret = kdf::derive::<32>(
                    b"conclave link pair v1",
                    shared.as_ref(),
                    &kdf::info(&[a.0, &a.1, b.0, &b.1]),
                );
                peers.push(PeerLink {
                    secret,
                    epoch: None,
                    send: None,
                    recv: Vec::new(),
                    holds: 0,
                    holds_said_at: 0,
                    window: ReplayWindow::default(),
                    asked_at: None,
                    answered_at: None,
                    key_offered_at: None,
                    knows_mine: false,
                });
            }
        }
        let mut links = Links {
            mode,
            me,
            epoch: epoch.max(1),
            counter: 0,
            peers,
            ring_keys: Vec::new(),
            retired: Default::default(),
            hellos: Vec::new(),
        };
        let epoch = links.epoch;
        if let Some(p) = links.peers.get_mut((me - 1) as usize) {
            p.epoch = Some(epoch);
        }
        Ok(links)
    }

    /// The daemons of a ring agreed `secret` (a key for the links, exported from their group
    /// key; docs/links.md "The daemons' key"); `members` hold it. From now on, a datagram to a
    /// member that has said it holds the key too goes under a key derived from both it and the
    /// pair's static secret; to anyone else, under the static one alone. Every hello names the
    /// key its sender holds, and one goes to every member now. The key id must not be 0.
    pub fn install_ring_key(
        &mut self,
        now: Time,
        id: u64,
        secret: Zeroizing<[u8; 32]>,
        mut members: Vec<DaemonId>,
    ) {
        if self.mode == LinkMode::Off || id == 0 || self.ring_keys.iter().any(|k| k.id == id) {
            return;
        }
        members.sort_unstable();
        members.dedup();
        self.ring_keys.push(RingKey {
            id,
            secret,
            members,
        });
        if self.ring_keys.len() > RING_KEYS_KEPT {
            let gone = self.ring_keys.remove(0).id;
            for p in &mut self.peers {
                p.recv.retain(|(k, _)| *k != gone);
                if p.send.as_ref().is_some_and(|(k, _)| *k == gone) {
                    p.send = None;
                }
            }
            if self.retired.len() == RETIRED_KEPT {
                self.retired.pop_front();
            }
            self.retired.push_back(gone);
        }
        let me = self.me;
        if let Some(p) = self.peers.get_mut((me - 1) as usize) {
            p.holds = id;
        }
        let members = self.ring_keys.last().expect("pushed").members.clone();
        for peer in members {
            if peer != me {
                if let Some(p) = self.peers.get_mut((peer as usize).wrapping_sub(1)) {
                    p.key_offered_at = None;
                    p.knows_mine = false;
                }
                self.offer_ring_key(now, peer);
            }
        }
    }

    /// The id of the current daemons' key (0: none agreed yet).
    pub fn ring_key(&self) -> u64 {
        self.ring_keys.last().map_or(0, |k| k.id)
    }

    /// The id of the key datagrams to `peer` go under now (0: the pair's static key).
    pub fn send_key(&self, peer: DaemonId) -> u64 {
        let Some(p) = self.peer(peer) else {
            return 0;
        };
        match self.ring_keys.last() {
            Some(k) if p.holds == k.id && k.members.binary_search(&peer).is_ok() => k.id,
            _ => 0,
        }
    }

    /// Peers (this daemon among them) that datagrams go to under the current daemons' key.
    pub fn peers_on_ring_key(&self) -> usize {
        let n = self.peers.len() as DaemonId;
        let current = self.ring_key();
        (1..=n)
            .filter(|&p| current != 0 && self.send_key(p) == current)
            .count()
    }

    /// A hello to `peer`, to say this daemon holds the current daemons' key, unless one went
    /// less than [`HELLO_GAP`] ago or the peer's epoch is not known yet (then the hellos that
    /// ask for it say so).
    fn offer_ring_key(&mut self, now: Time, peer: DaemonId) {
        let Some(p) = self.peers.get_mut((peer as usize).wrapping_sub(1)) else {
            return;
        };
        let Some(theirs) = p.epoch else {
            return;
        };
        if p.key_offered_at.is_some_and(|t| now < t + HELLO_GAP) {
            return;
        }
        p.key_offered_at = Some(now);
        self.send_hello(peer, theirs);
    }

    pub fn mode(&self) -> LinkMode {
        self.mode
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The epoch this daemon knows for `peer`.
    pub fn peer_epoch(&self, peer: DaemonId) -> Option<u64> {
        self.peer(peer)?.epoch
    }

    fn peer(&self, id: DaemonId) -> Option<&PeerLink> {
        self.peers.get((id as usize).checked_sub(1)?)
    }

    /// The key of datagrams from `from` to `to` in epochs `ef` and `et`, under the daemons' key
    /// `key_id` (0: under the pair's static secret alone). `None` for a daemons' key not held.
    fn key(
        &self,
        pair: &[u8; 32],
        key_id: u64,
        from: DaemonId,
        to: DaemonId,
        ef: u64,
        et: u64,
    ) -> Option<Aead> {
        let info = kdf::info(&[
            &from.to_be_bytes(),
            &to.to_be_bytes(),
            &ef.to_be_bytes(),
            &et.to_be_bytes(),
            &key_id.to_be_bytes(),
        ]);
        let k = if key_id == 0 {
            kdf::derive::<32>(b"conclave link key v1", pair, &info)
        } else {
            // Both secrets: only the ring's daemons hold the first, so what goes under it is
            // closed to a daemon once it is out of the ring and rekeyed (and to whoever steals
            // an identity later); only the pair holds the second, so no daemon of the ring can
            // pose as another to a third.
            let ring = self.ring_keys.iter().find(|k| k.id == key_id)?;
            let mut ikm = Zeroizing::new([0u8; 64]);
            ikm[..32].copy_from_slice(&ring.secret[..]);
            ikm[32..].copy_from_slice(pair);
            kdf::derive::<32>(b"conclave link ring key v1", &ikm[..], &info)
        };
        Some(Aead::new(AeadAlg::Aes256Gcm, &k))
    }

    /// The key datagrams to `to` go under now, and its id: made again when the choice or an
    /// epoch changed.
    fn send_aead(&mut self, to: DaemonId) -> Option<(u64, &Aead)> {
        let id = self.send_key(to);
        let p = self.peer(to)?;
        let pe = p.epoch?;
        if p.send.as_ref().map(|(k, _)| *k) != Some(id) {
            let aead = self.key(&p.secret, id, self.me, to, self.epoch, pe)?;
            self.peers[(to - 1) as usize].send = Some((id, aead));
        }
        let (k, aead) = self.peer(to)?.send.as_ref()?;
        Some((*k, aead))
    }

    /// The datagram that carries `payload` to `to`, or `None` if its epoch is not known yet (a
    /// hello goes instead, from [`Links::poll_hello`]).
    pub fn seal(&mut self, now: Time, to: DaemonId, payload: Vec<u8>) -> Option<Vec<u8>> {
        let room = self.room();
        let mut framed = Vec::with_capacity(room.head + payload.len() + room.tail);
        framed.resize(room.head, 0);
        framed.extend_from_slice(&payload);
        self.seal_framed(now, to, framed)
    }

    /// What a datagram leaves free before and after its payload for [`Links::seal_framed`]: the
    /// link's header and tag (nothing when links are off).
    pub fn room(&self) -> Room {
        match self.mode {
            LinkMode::Off => Room::default(),
            LinkMode::Sealed | LinkMode::Authenticated => Room {
                head: HEADER_BYTES,
                tail: TAG_BYTES,
            },
        }
    }

    /// [`Links::seal`] of a payload laid out after [`Links::room`]'s head (whatever those
    /// bytes hold is overwritten), sealed where it lies: a datagram of up to 60,000 bytes is
    /// not copied again on its way out.
    pub fn seal_framed(&mut self, now: Time, to: DaemonId, mut framed: Vec<u8>) -> Option<Vec<u8>> {
        if self.mode == LinkMode::Off {
            return Some(framed);
        }
        debug_assert!(framed.len() >= HEADER_BYTES, "no room for the link header");
        let header = self.next_header(now, to)?;
        let mut head = Vec::with_capacity(HEADER_BYTES);
        header.encode_into(&mut head);
        framed[..HEADER_BYTES].copy_from_slice(&head);
        let mode = self.mode;
        let (_, aead) = self.send_aead(to)?;
        seal(mode, aead, &header, &mut framed);
        Some(framed)
    }

    /// The header of the next data datagram to `to`, its counter taken; `None` if `to`'s epoch
    /// is not known yet (a hello asks for it).
    fn next_header(&mut self, now: Time, to: DaemonId) -> Option<LinkHeader> {
        let Some(pe) = self.peer(to)?.epoch else {
            self.hello(now, to, 0, Hello::Ask);
            return None;
        };
        // Until the peer has shown it knows this daemon holds the current key (by sending under
        // it), a hello says so again every gap: one lost hello must not keep either direction
        // on the static key.
        let current = self.ring_key();
        let unsure = self
            .peer(to)
            .is_some_and(|p| self.send_key(to) != current || !p.knows_mine);
        if current != 0 && to != self.me && unsure {
            if let Some(k) = self.ring_keys.last() {
                if k.members.binary_search(&to).is_ok() {
                    self.offer_ring_key(now, to);
                }
            }
        }
        self.counter += 1;
        let counter = self.counter;
        let (me, epoch) = (self.me, self.epoch);
        let (key, _) = self.send_aead(to)?;
        Some(LinkHeader {
            kind: LinkKind::Data,
            from: me,
            to,
            from_epoch: epoch,
            to_epoch: pe,
            key,
            counter,
        })
    }

    /// [`Links::seal_framed`] of a copy of `framed`, which is left as it is. When the links
    /// encrypt, the copy is the ciphertext, written once: the datagrams of a visit go to every
    /// other daemon, and copying each for the second before sealing it was a pass over every
    /// byte the daemon sends.
    pub fn seal_framed_copy(&mut self, now: Time, to: DaemonId, framed: &[u8]) -> Option<Vec<u8>> {
        if self.mode != LinkMode::Sealed || framed.len() < HEADER_BYTES {
            let mut copy = Vec::with_capacity(framed.len() + self.room().tail);
            copy.extend_from_slice(framed);
            return self.seal_framed(now, to, copy);
        }
        let header = self.next_header(now, to)?;
        let mut out = vec![0u8; framed.len() + TAG_BYTES];
        let mut head = Vec::with_capacity(HEADER_BYTES);
        header.encode_into(&mut head);
        out[..HEADER_BYTES].copy_from_slice(&head);
        let (_, aead) = self.send_aead(to)?;
        aead.seal_into(
            header.nonce(),
            &head,
            &framed[HEADER_BYTES..],
            &mut out[HEADER_BYTES..],
        );
        Some(out)
    }

    /// Queues a hello to `to` bound to its epoch `theirs` (0: unknown), unless one went less
    /// than [`HELLO_GAP`] ago.
    fn hello(&mut self, now: Time, to: DaemonId, theirs: u64, why: Hello) {
        let Some(p) = self.peers.get_mut((to as usize).wrapping_sub(1)) else {
            return;
        };
        // Asking and answering have a limit each: sharing one, two daemons that start together
        // would each ask, and each be kept from answering by its own question.
        let last = match why {
            Hello::Ask => Some(&mut p.asked_at),
            Hello::Answer => Some(&mut p.answered_at),
            Hello::Learnt => None,
        };
        if let Some(last) = last {
            if last.is_some_and(|t| now < t + HELLO_GAP) {
                return;
            }
            *last = Some(now);
        }
        self.send_hello(to, theirs);
    }

    /// Queues a hello to `to` bound to its epoch `theirs`: under the pair's static key, naming
    /// the daemons' key this daemon holds.
    fn send_hello(&mut self, to: DaemonId, theirs: u64) {
        let Some(p) = self.peer(to) else {
            return;
        };
        let Some(aead) = self.key(&p.secret, 0, self.me, to, self.epoch, theirs) else {
            return;
        };
        let key_id = self.ring_key();
        self.counter += 1;
        let header = LinkHeader {
            kind: LinkKind::Hello,
            from: self.me,
            to,
            from_epoch: self.epoch,
            to_epoch: theirs,
            key: key_id,
            counter: self.counter,
        };
        let mut buf = Vec::with_capacity(OVERHEAD);
        header.encode_into(&mut buf);
        seal(self.mode, &aead, &header, &mut buf);
        self.hellos.push((to, buf));
    }

    /// A hello to send, and to whom.
    pub fn poll_hello(&mut self) -> Option<(DaemonId, Vec<u8>)> {
        self.hellos.pop()
    }

    /// Checks and opens a datagram that came from the address of daemon `from`. Nothing of this
    /// daemon's state changes unless the datagram authenticates, but for one thing: a datagram
    /// under a daemons' key this daemon dropped is answered (a rate-limited hello; see below).
    pub fn open(
        &mut self,
        now: Time,
        from: DaemonId,
        datagram: &mut [u8],
    ) -> Result<Opened, LinkRefusal> {
        if self.mode == LinkMode::Off {
            return Ok(Opened::Data(0..datagram.len()));
        }
        let h = LinkHeader::decode(datagram).map_err(|_| LinkRefusal::Malformed)?;
        if h.from != from || h.to != self.me {
            return Err(LinkRefusal::Misdirected);
        }
        let mode = self.mode;
        let me = self.me;
        let Some(p) = self.peer(from) else {
            return Err(LinkRefusal::Misdirected);
        };
        // A hello is always under the static key; its key id is what the sender holds.
        let under = match h.kind {
            LinkKind::Hello => 0,
            LinkKind::Data => h.key,
        };
        if under != 0 {
            let member = |k: &RingKey| k.id == under && k.members.binary_search(&from).is_ok();
            if !self.ring_keys.iter().any(member) {
                // A peer that missed the later keys believes this daemon still holds one it
                // dropped, and would send under it for ever: tell it what this one holds. The
                // datagram cannot be authenticated any more, so only a key this daemon did hold
                // is answered, by one static hello at most per gap, to the configured daemon
                // of that address, in the run this daemon knows for it.
                if self.retired.contains(&under) && p.epoch == Some(h.from_epoch) {
                    self.hello(now, from, h.from_epoch, Hello::Answer);
                }
                return Err(LinkRefusal::UnknownKey);
            }
        }
        if h.to_epoch != self.epoch {
            // Meant for an earlier run of this daemon, or the sender does not know this one:
            // if it is genuine, tell the sender this run's epoch.
            let k = self
                .key(&p.secret, under, from, me, h.from_epoch, h.to_epoch)
                .ok_or(LinkRefusal::UnknownKey)?;
            open(mode, &k, &h, datagram).ok_or(LinkRefusal::Forged)?;
            self.hello(now, from, h.from_epoch, Hello::Answer);
            return match (h.kind, h.to_epoch) {
                (LinkKind::Hello, 0) => Ok(Opened::Control),
                _ => Err(LinkRefusal::Stale),
            };
        }
        if p.epoch.is_some_and(|e| h.from_epoch < e) {
            return Err(LinkRefusal::OldEpoch);
        }
        let newer = p.epoch != Some(h.from_epoch);
        if !newer && !p.window.fresh(h.counter) {
            return Err(LinkRefusal::Replayed);
        }
        let cached = if newer {
            None
        } else {
            p.recv.iter().position(|(k, _)| *k == under)
        };
        let fresh = match cached {
            Some(_) => None,
            None => Some(
                self.key(&p.secret, under, from, me, h.from_epoch, h.to_epoch)
                    .ok_or(LinkRefusal::UnknownKey)?,
            ),
        };
        let aead = match (&fresh, cached) {
            (Some(k), _) => k,
            (None, Some(i)) => &p.recv[i].1,
            (None, None) => unreachable!("one of them"),
        };
        let len = open(mode, aead, &h, datagram).ok_or(LinkRefusal::Forged)?;
        let p = &mut self.peers[(from - 1) as usize];
        if newer {
            // The peer's new run: the window starts again, under keys bound to its epoch, and
            // it holds no daemons' key until it shows one.
            p.recv.clear();
            p.send = None;
            p.holds = 0;
            p.holds_said_at = 0;
            p.key_offered_at = None;
            p.knows_mine = false;
            p.epoch = Some(h.from_epoch);
            p.window = ReplayWindow::default();
        }
        if let Some(k) = fresh {
            p.recv.push((under, k));
        }
        p.window.mark(h.counter);
        // What the peer holds, as it said last (a hello says it outright; data under a
        // daemons' key shows it).
        let says = h.kind == LinkKind::Hello || h.key != 0;
        let learnt = says && h.counter > p.holds_said_at && p.holds != h.key;
        if says && h.counter > p.holds_said_at {
            p.holds = h.key;
            p.holds_said_at = h.counter;
        }
        let current = self.ring_keys.last().map_or(0, |k| k.id);
        if h.kind == LinkKind::Data && h.key != 0 && h.key == current {
            p.knows_mine = true;
        }
        if newer && h.kind == LinkKind::Hello {
            // It may not know this daemon's epoch yet. Once per new epoch of the peer, so no
            // limit is needed (and the one for hellos was likely spent asking).
            self.hello(now, from, h.from_epoch, Hello::Learnt);
        } else if learnt && h.kind == LinkKind::Hello && h.key != 0 && h.key == self.ring_key() {
            // It holds the key this one does: say this one holds it too (its own hello may have
            // been lost). Once per change of what the peer holds, so no limit is needed.
            self.send_hello(from, h.from_epoch);
        }
        Ok(match h.kind {
            LinkKind::Hello => Opened::Control,
            LinkKind::Data => Opened::Data(HEADER_BYTES..HEADER_BYTES + len),
        })
    }
}

fn seal(mode: LinkMode, aead: &Aead, header: &LinkHeader, buf: &mut Vec<u8>) {
    match mode {
        LinkMode::Sealed => {
            let mut aad = [0u8; HEADER_BYTES];
            aad.copy_from_slice(&buf[..HEADER_BYTES]);
            aead.seal_tail(header.nonce(), &aad, buf, HEADER_BYTES);
        }
        LinkMode::Authenticated => {
            let tag = aead.tag(header.nonce(), buf);
            buf.extend_from_slice(&tag);
        }
        LinkMode::Off => {}
    }
}

/// The length of the body, opened in place after the header; `None` if it does not
/// authenticate.
fn open(mode: LinkMode, aead: &Aead, header: &LinkHeader, datagram: &mut [u8]) -> Option<usize> {
    let nonce = header.nonce();
    match mode {
        LinkMode::Sealed => {
            let (head, body) = datagram.split_at_mut(HEADER_BYTES);
            aead.open_in_place(nonce, head, body).ok()
        }
        LinkMode::Authenticated => {
            let (signed, tag) = datagram.split_at_mut(datagram.len() - TAG_BYTES);
            aead.open_in_place(nonce, signed, tag).ok()?;
            Some(signed.len() - HEADER_BYTES)
        }
        LinkMode::Off => Some(datagram.len()),
    }
}

/// Counters seen from one peer in one epoch: the highest, and which of the last [`WINDOW`]
/// below it (a ring of bits, as WireGuard keeps it).
struct ReplayWindow {
    top: u64,
    bits: Box<[u64; WORDS]>,
}

const WORDS: usize = 128;
/// How far below the highest counter a datagram may come and still be taken.
pub const WINDOW: u64 = (WORDS as u64 - 1) * 64;

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            top: 0,
            bits: Box::new([0; WORDS]),
        }
    }
}

impl ReplayWindow {
    fn fresh(&self, c: u64) -> bool {
        if c == 0 {
            return false;
        }
        if c > self.top {
            return true;
        }
        if self.top - c >= WINDOW {
            return false;
        }
        let (w, b) = ((c / 64) as usize % WORDS, c % 64);
        self.bits[w] & (1 << b) == 0
    }

    fn mark(&mut self, c: u64) {
        if c > self.top {
            let (old, new) = (self.top / 64, c / 64);
            for w in (old + 1..=new).take(WORDS) {
                self.bits[w as usize % WORDS] = 0;
            }
            self.top = c;
        }
        let (w, b) = ((c / 64) as usize % WORDS, c % 64);
        self.bits[w] |= 1 << b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_crypto::Identity;

    struct Net {
        seeds: Vec<[u8; 32]>,
        roster: Vec<(String, Option<PublicIdentity>)>,
    }

    impl Net {
        fn new(n: usize) -> Net {
            let seeds: Vec<[u8; 32]> = (0..n).map(|i| [i as u8 + 1; 32]).collect();
            let roster = seeds
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let id = Identity::ed25519_from_seed(s).unwrap();
                    (format!("d{}", i + 1), Some(id.public()))
                })
                .collect();
            Net { seeds, roster }
        }

        fn links(&self, mode: LinkMode, me: DaemonId, epoch: u64) -> Links {
            let dh = StaticDh::from_ed25519_seed(&self.seeds[(me - 1) as usize]);
            Links::new(mode, me, epoch, Some(&dh), &self.roster).unwrap()
        }
    }

    fn t(ms: u64) -> Time {
        Time::from_micros(ms * 1000)
    }

    /// Hellos between `a` and `b` until both know each other's epoch.
    fn introduce(a: &mut Links, b: &mut Links, now: Time) {
        for _ in 0..4 {
            hellos(a, b, now);
            hellos(b, a, now);
        }
    }

    fn connected(mode: LinkMode) -> (Links, Links) {
        let net = Net::new(3);
        let (mut a, mut b) = (net.links(mode, 1, 10 << 32), net.links(mode, 2, 20 << 32));
        assert!(a.seal(t(0), 2, b"early".to_vec()).is_none());
        introduce(&mut a, &mut b, t(0));
        assert_eq!(a.peer_epoch(2), Some(20 << 32));
        assert_eq!(b.peer_epoch(1), Some(10 << 32));
        (a, b)
    }

    /// A datagram from d1 to d2 (epochs 10 and 20) that daemon `c` makes with what it holds:
    /// not the pair's static secret (zeros in its place), and the daemons' key `key_id`.
    fn forge(c: &Links, key_id: u64, counter: u64) -> Vec<u8> {
        let k = c.key(&[0; 32], key_id, 1, 2, 10 << 32, 20 << 32).unwrap();
        let h = LinkHeader {
            kind: LinkKind::Data,
            from: 1,
            to: 2,
            from_epoch: 10 << 32,
            to_epoch: 20 << 32,
            key: key_id,
            counter,
        };
        let mut forged = Vec::new();
        h.encode_into(&mut forged);
        forged.extend_from_slice(b"forged");
        seal(LinkMode::Sealed, &k, &h, &mut forged);
        forged
    }

    fn body(d: &[u8], o: Opened) -> Vec<u8> {
        match o {
            Opened::Data(r) => d[r].to_vec(),
            Opened::Control => panic!("a hello"),
        }
    }

    #[test]
    fn data_flows_once_epochs_are_known_and_is_encrypted() {
        for mode in [LinkMode::Sealed, LinkMode::Authenticated] {
            let (mut a, mut b) = connected(mode);
            let mut d = a.seal(t(1), 2, b"token and messages".to_vec()).unwrap();
            let visible = d.windows(5).any(|w| w == b"token");
            assert_eq!(visible, mode == LinkMode::Authenticated);
            let o = b.open(t(1), 1, &mut d).unwrap();
            assert_eq!(body(&d, o), b"token and messages");
            let mut back = b.seal(t(1), 1, b"reply".to_vec()).unwrap();
            let o = a.open(t(1), 2, &mut back).unwrap();
            assert_eq!(body(&back, o), b"reply");
        }
    }

    #[test]
    fn a_copy_sealed_for_another_peer_opens_there_and_the_plaintext_then_for_the_first() {
        for mode in [LinkMode::Sealed, LinkMode::Authenticated, LinkMode::Off] {
            let net = Net::new(3);
            let mut a = net.links(mode, 1, 10 << 32);
            let mut b = net.links(mode, 2, 20 << 32);
            let mut c = net.links(mode, 3, 30 << 32);
            // A first datagram to each asks for its epoch.
            a.seal(t(0), 2, b"early".to_vec());
            introduce(&mut a, &mut b, t(0));
            a.seal(t(0), 3, b"early".to_vec());
            introduce(&mut a, &mut c, t(0));
            let room = a.room();
            let mut framed = vec![0xee; room.head];
            framed.extend_from_slice(b"the visit's messages");
            let plain = framed.clone();
            let mut to_c = a.seal_framed_copy(t(1), 3, &framed).unwrap();
            if mode == LinkMode::Sealed {
                let visible = to_c.windows(9).any(|w| w == b"the visit");
                assert!(!visible, "the copy is encrypted");
            }
            let mut to_b = a.seal_framed(t(1), 2, framed).unwrap();
            for (peer, d) in [(&mut b, &mut to_b), (&mut c, &mut to_c)] {
                let o = peer.open(t(1), 1, d).unwrap();
                assert_eq!(body(d, o), b"the visit's messages");
            }
            // Each copy is its peer's alone.
            let mut again = a.seal_framed_copy(t(1), 3, &plain).unwrap();
            if mode != LinkMode::Off {
                assert!(b.open(t(1), 1, &mut again).is_err());
            }
        }
        // Before the peer's epoch is known there is nothing to seal, and a hello asks for it.
        let net = Net::new(2);
        let mut a = net.links(LinkMode::Sealed, 1, 10 << 32);
        assert!(a.seal_framed_copy(t(0), 2, &[0; 64]).is_none());
        assert!(a.poll_hello().is_some());
    }

    #[test]
    fn a_daemon_reaches_itself_at_once() {
        let net = Net::new(1);
        let mut a = net.links(LinkMode::Sealed, 1, 10 << 32);
        let mut d = a.seal(t(0), 1, b"token".to_vec()).unwrap();
        let o = a.open(t(0), 1, &mut d).unwrap();
        assert_eq!(body(&d, o), b"token");
    }

    #[test]
    fn two_daemons_that_ask_at_once_learn_each_others_epochs() {
        let net = Net::new(2);
        let (mut a, mut b) = (
            net.links(LinkMode::Sealed, 1, 10 << 32),
            net.links(LinkMode::Sealed, 2, 20 << 32),
        );
        assert!(a.seal(t(0), 2, b"x".to_vec()).is_none());
        assert!(b.seal(t(0), 1, b"y".to_vec()).is_none());
        // Both questions cross; each is answered although each daemon just asked.
        let (_, mut qa) = a.poll_hello().unwrap();
        let (_, mut qb) = b.poll_hello().unwrap();
        assert_eq!(b.open(t(1), 1, &mut qa), Ok(Opened::Control));
        assert_eq!(a.open(t(1), 2, &mut qb), Ok(Opened::Control));
        introduce(&mut a, &mut b, t(1));
        assert_eq!(a.peer_epoch(2), Some(20 << 32));
        assert_eq!(b.peer_epoch(1), Some(10 << 32));
    }

    #[test]
    fn forged_altered_replayed_and_misdirected_datagrams_change_nothing() {
        let (mut a, mut b) = connected(LinkMode::Sealed);
        let d = a.seal(t(1), 2, b"payload".to_vec()).unwrap();
        // Altered anywhere: header or body or tag.
        for i in [0, 5, 20, 33, 41, 42, d.len() - 1] {
            let mut x = d.clone();
            x[i] ^= 0x40;
            let e = b.open(t(1), 1, &mut x).unwrap_err();
            // A key id altered names a key the receiver does not hold: refused before any
            // work, as a peer's key that is a little ahead is.
            let expected = (33..41).contains(&i) && e == LinkRefusal::UnknownKey;
            assert!(e.hostile() || expected, "byte {i}: {e:?}");
        }
        // From another daemon's address, or as if to another.
        assert_eq!(
            b.open(t(1), 3, &mut d.clone()),
            Err(LinkRefusal::Misdirected)
        );
        // A third daemon's forgery: it holds no key of the pair (1, 2).
        let net = Net::new(3);
        let mut c = net.links(LinkMode::Sealed, 3, 30 << 32);
        c.peers[1].epoch = Some(20 << 32);
        let mut forged = forge(&c, 0, 99);
        assert_eq!(b.open(t(1), 1, &mut forged), Err(LinkRefusal::Forged));
        // The genuine one, then its replay.
        let mut genuine = d.clone();
        let o = b.open(t(1), 1, &mut genuine).unwrap();
        assert_eq!(body(&genuine, o), b"payload");
        assert_eq!(b.open(t(1), 1, &mut d.clone()), Err(LinkRefusal::Replayed));
        // Garbage and datagrams of links that are off.
        assert_eq!(b.open(t(1), 1, &mut [1, 2, 3]), Err(LinkRefusal::Malformed));
        assert_eq!(b.open(t(1), 1, &mut [1; 200]), Err(LinkRefusal::Malformed));
        // None of it disturbed the link.
        let mut ok = a.seal(t(2), 2, b"still fine".to_vec()).unwrap();
        let o = b.open(t(2), 1, &mut ok).unwrap();
        assert_eq!(body(&ok, o), b"still fine");
    }

    #[test]
    fn reordering_within_the_window_is_taken_and_older_is_refused() {
        let (mut a, mut b) = connected(LinkMode::Sealed);
        let ds: Vec<Vec<u8>> = (0..WINDOW + 10)
            .map(|i| a.seal(t(1), 2, i.to_be_bytes().to_vec()).unwrap())
            .collect();
        let last = ds.len() - 1;
        b.open(t(1), 1, &mut ds[last].clone()).unwrap();
        // Within the window below the highest: taken once.
        b.open(t(1), 1, &mut ds[last - 5].clone()).unwrap();
        assert_eq!(
            b.open(t(1), 1, &mut ds[last - 5].clone()),
            Err(LinkRefusal::Replayed)
        );
        // Past it: refused even though never seen.
        assert_eq!(
            b.open(t(1), 1, &mut ds[0].clone()),
            Err(LinkRefusal::Replayed)
        );
    }

    #[test]
    fn a_restarted_daemon_refuses_its_old_runs_traffic_and_both_learn_the_new_epochs() {
        let net = Net::new(2);
        let (mut a, mut b) = connected(LinkMode::Sealed);
        let old = a.seal(t(1), 2, b"before the restart".to_vec()).unwrap();
        b.open(t(1), 1, &mut old.clone()).unwrap();
        // b restarts: a's recorded datagram, and a's next ones, are bound to b's old run.
        let mut b2 = net.links(LinkMode::Sealed, 2, 21 << 32);
        assert_eq!(
            b2.open(t(200), 1, &mut old.clone()),
            Err(LinkRefusal::Stale)
        );
        let (to, mut hello) = b2.poll_hello().expect("b2 answers with its epoch");
        assert_eq!(to, 1);
        // A hello is not answered twice within the gap.
        assert_eq!(
            b2.open(t(200), 1, &mut old.clone()),
            Err(LinkRefusal::Stale)
        );
        assert!(b2.poll_hello().is_none());
        assert_eq!(a.open(t(200), 2, &mut hello), Ok(Opened::Control));
        assert_eq!(a.peer_epoch(2), Some(21 << 32));
        let mut d = a.seal(t(300), 2, b"after".to_vec()).unwrap();
        let o = b2.open(t(300), 1, &mut d).unwrap();
        assert_eq!(body(&d, o), b"after");
        // a restarts: b2 learns its newer epoch, then refuses what a's old run sent.
        let mut a2 = net.links(LinkMode::Sealed, 1, 11 << 32);
        let from_old_a = a.seal(t(400), 2, b"old run".to_vec()).unwrap();
        assert!(a2.seal(t(400), 2, b"x".to_vec()).is_none());
        introduce(&mut a2, &mut b2, t(400));
        assert_eq!(b2.peer_epoch(1), Some(11 << 32));
        assert_eq!(
            b2.open(t(500), 1, &mut from_old_a.clone()),
            Err(LinkRefusal::OldEpoch)
        );
    }

    #[test]
    fn setup_checks_the_identity_against_the_configuration() {
        let net = Net::new(2);
        let wrong = StaticDh::from_ed25519_seed(&[9; 32]);
        assert!(matches!(
            Links::new(LinkMode::Sealed, 1, 1, Some(&wrong), &net.roster),
            Err(LinkSetupError::WrongIdentity(_))
        ));
        assert!(matches!(
            Links::new(LinkMode::Sealed, 1, 1, None, &net.roster),
            Err(LinkSetupError::NoIdentity(_))
        ));
        let mut roster = net.roster.clone();
        roster[1].1 = None;
        let dh = StaticDh::from_ed25519_seed(&net.seeds[0]);
        assert!(matches!(
            Links::new(LinkMode::Sealed, 1, 1, Some(&dh), &roster),
            Err(LinkSetupError::NoKey(_))
        ));
        // Off needs nothing, and passes bytes through.
        let mut off = Links::new(LinkMode::Off, 1, 1, None, &roster).unwrap();
        assert_eq!(off.seal(t(0), 2, vec![1, 2]).unwrap(), vec![1, 2]);
        assert_eq!(off.open(t(0), 2, &mut [1, 2]), Ok(Opened::Data(0..2)));
    }

    fn ring_secret(b: u8) -> Zeroizing<[u8; 32]> {
        Zeroizing::new([b; 32])
    }

    /// Delivers every hello queued at `a` to `b`.
    fn hellos(a: &mut Links, b: &mut Links, now: Time) {
        while let Some((to, mut d)) = a.poll_hello() {
            assert_eq!(to, b.me);
            let _ = b.open(now, a.me, &mut d);
        }
    }

    #[test]
    fn a_daemons_key_is_used_once_both_ends_hold_it_and_mixes_in_the_pair_key() {
        let (mut a, mut b) = connected(LinkMode::Sealed);
        a.install_ring_key(t(1), 77, ring_secret(1), vec![1, 2]);
        // b does not hold it yet: a's hello says a holds it, and data still goes static.
        hellos(&mut a, &mut b, t(1));
        assert_eq!(a.send_key(2), 0);
        let d = a.seal(t(1), 2, b"static".to_vec()).unwrap();
        assert_eq!(LinkHeader::decode(&d).unwrap().key, 0);
        // b installs it: it knows a holds it already, and tells a.
        b.install_ring_key(t(2), 77, ring_secret(1), vec![1, 2]);
        assert_eq!(b.send_key(1), 77);
        hellos(&mut b, &mut a, t(2));
        assert_eq!(a.send_key(2), 77);
        let mut d = a.seal(t(3), 2, b"under the daemons' key".to_vec()).unwrap();
        assert_eq!(LinkHeader::decode(&d).unwrap().key, 77);
        let o = b.open(t(3), 1, &mut d).unwrap();
        assert_eq!(body(&d, o), b"under the daemons' key");
        // A third daemon that holds the same daemons' key but not the pair's static secret
        // cannot pose as a to b.
        let net = Net::new(3);
        let mut c = net.links(LinkMode::Sealed, 3, 30 << 32);
        c.install_ring_key(t(3), 77, ring_secret(1), vec![1, 2, 3]);
        let mut forged = forge(&c, 77, 1 << 40);
        assert_eq!(b.open(t(3), 1, &mut forged), Err(LinkRefusal::Forged));
    }

    #[test]
    fn a_peer_that_missed_later_keys_is_told_and_goes_back_to_the_static_key() {
        let (mut a, mut b) = connected(LinkMode::Sealed);
        a.install_ring_key(t(1), 77, ring_secret(1), vec![1, 2]);
        b.install_ring_key(t(1), 77, ring_secret(1), vec![1, 2]);
        hellos(&mut a, &mut b, t(1));
        hellos(&mut b, &mut a, t(1));
        assert_eq!(a.send_key(2), 77);
        // b goes on through two rings without a, and drops key 77; a heard none of it.
        b.install_ring_key(t(2), 78, ring_secret(2), vec![2]);
        b.install_ring_key(t(3), 79, ring_secret(3), vec![2, 3]);
        while b.poll_hello().is_some() {}
        let mut d = a.seal(t(40), 2, b"under 77".to_vec()).unwrap();
        assert_eq!(b.open(t(40), 1, &mut d), Err(LinkRefusal::UnknownKey));
        // b said what it holds: a sends static from now on, and b takes it.
        hellos(&mut b, &mut a, t(40));
        assert_eq!(a.send_key(2), 0);
        let mut d = a.seal(t(50), 2, b"static again".to_vec()).unwrap();
        let o = b.open(t(50), 1, &mut d).unwrap();
        assert_eq!(body(&d, o), b"static again");
        // A key id b never held gets no answer.
        let mut d = a.seal(t(60), 2, b"x".to_vec()).unwrap();
        d[33] ^= 1;
        assert_eq!(b.open(t(100), 1, &mut d), Err(LinkRefusal::UnknownKey));
        assert!(b.poll_hello().is_none());
    }
}
