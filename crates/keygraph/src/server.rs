//! The key server as a pure state machine (paper 001 §3, with §4's batch signatures).
//!
//! Inputs are join and leave requests (at once, or queued and folded into one rekey when the
//! caller's rekey timer fires: batch rekeying); outputs are rekey messages, drained with
//! [`Server::poll_transmit`], each addressed to a set of key holders, and events for single
//! members ([`Server::poll_event`]: a member moved to another slot). Randomness is passed into
//! every call that makes keys; the server reads no clock. Individual keys come from the caller:
//! in the paper they are the session keys of the authentication exchange that admits a member.

use crate::complete::{CompleteGraph, MAX_COMPLETE_MEMBERS};
use crate::index::{NodeIndex, Slot, STAR_DEGREE};
use crate::merkle::{item_digest, message_digest, signed_message, signed_root, MerkleTree};
use crate::seal::{ItemId, Sealer};
use crate::tree::{KeyTree, Rekey};
use crate::{GraphKind, Signing, Strategy};
use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{CryptoRng, GroupKey, Identity, PublicIdentity, SigError};
use conclave_wire::lkh::{
    Auth, GraphShape, Item, KeyRef, Recipients, RekeyMessage, MAX_GROUP_NAME_BYTES, MAX_ITEMS,
};
use conclave_wire::{Reader, Writer};
use std::collections::{BTreeSet, HashMap, VecDeque};

/// Most members of one tree-graph group.
pub const MAX_MEMBERS: usize = 1 << 24;
/// Most members of a star (a group-oriented leave sends every other member one item).
pub const MAX_STAR_MEMBERS: usize = MAX_ITEMS;
/// Highest tree degree accepted.
pub const MAX_DEGREE: u32 = 1024;
/// A server built with members reserves room for `1 / GROWTH_ROOM_DIVISOR` more.
pub const GROWTH_ROOM_DIVISOR: usize = 8;
/// Most requests waiting for the next batch rekey.
pub const MAX_PENDING: usize = 1 << 20;

/// The layout of the saved state (see `persist`).
const STATE_VERSION: u8 = 1;

/// A member, as the server knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct UserId(pub u64);

const NO_USER: u64 = u64::MAX;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub group: String,
    pub graph: GraphKind,
    pub strategy: Strategy,
    pub signing: Signing,
    pub aead: AeadAlg,
    /// Move members down when the group would fit a tree one level lower (see `rebalance`).
    pub compact: bool,
}

impl ServerConfig {
    pub fn new(group: &str, graph: GraphKind) -> ServerConfig {
        ServerConfig {
            group: group.to_owned(),
            graph,
            strategy: Strategy::Key,
            signing: Signing::Batch,
            aead: AeadAlg::Aes256Gcm,
            compact: true,
        }
    }
    fn max_members(&self) -> usize {
        match self.graph {
            GraphKind::Tree { .. } => MAX_MEMBERS,
            GraphKind::Star => MAX_STAR_MEMBERS,
            GraphKind::Complete => MAX_COMPLETE_MEMBERS,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    #[error("group name must be 1 to {MAX_GROUP_NAME_BYTES} bytes")]
    BadGroupName,
    #[error("tree degree {0} is outside 2..={MAX_DEGREE}")]
    BadDegree(u32),
    #[error("signing requires a server identity")]
    NoIdentity,
    #[error("batch rekeying is not offered for complete key graphs")]
    BatchOnComplete,
    #[error("{0:?} is already a member")]
    AlreadyMember(UserId),
    #[error("{0:?} is not a member")]
    NotMember(UserId),
    #[error("user id {0:?} is reserved")]
    ReservedUser(UserId),
    #[error("the group is full ({max} members)")]
    Full { max: usize },
    #[error("{max} requests already wait for the next rekey")]
    TooManyPending { max: usize },
    #[error("signing failed: {0}")]
    Sign(#[from] SigError),
}

/// What a joining member learns over the channel that admitted it: where it sits and from which
/// epoch on its keys count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinAck {
    pub user: UserId,
    pub slot: Slot,
    /// The epoch whose rekey message carries the member's first keys.
    pub epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// A member moved to another slot; its keys from `ack.epoch` on follow the new slot.
    Relocated(JoinAck),
}

/// One encoded rekey message and whom it is for.
#[derive(Clone, Debug)]
pub struct Transmit {
    pub recipients: Recipients,
    pub bytes: Vec<u8>,
}

/// What one rekey cost the server and what it sent.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RekeyStats {
    pub epoch: u64,
    pub joins: u32,
    pub leaves: u32,
    /// Members moved down by compaction.
    pub moves: u32,
    pub height: u8,
    pub members: u64,
    /// Keys encrypted (paper 001 Table 2's server cost).
    pub keys_encrypted: u64,
    /// AEAD operations (one per item).
    pub items: u64,
    pub messages: u64,
    pub bytes_sent: u64,
    pub message_bytes_min: u64,
    pub message_bytes_max: u64,
    /// Messages times their recipients, and those recipients' bytes: Table 6's average per member.
    pub deliveries: u64,
    pub bytes_received: u64,
    /// Keys learned, summed over members (Fig 12).
    pub key_changes: u64,
    pub signatures: u64,
    pub digests: u64,
}

enum Graph {
    Tree(KeyTree),
    Complete(CompleteGraph),
}

/// The key-graph server of one group.
pub struct Server {
    cfg: ServerConfig,
    identity: Option<Identity>,
    graph: Graph,
    /// The member in each slot, `NO_USER` for a hole; no trailing holes.
    slots: Vec<u64>,
    /// Never iterated, so its order cannot reach the output.
    users: HashMap<u64, u32>,
    /// Holes below `slots.len()`.
    free: BTreeSet<u32>,
    epoch: u64,
    pending_leaves: Vec<Slot>,
    pending_joins: Vec<(Slot, [u8; 32])>,
    out: VecDeque<Transmit>,
    events: VecDeque<ServerEvent>,
    last: Option<RekeyStats>,
}

/// The individual keys of queued joiners are secrets too (the graph wipes its own keys).
impl Drop for Server {
    fn drop(&mut self) {
        for (_, k) in &mut self.pending_joins {
            zeroize::Zeroize::zeroize(k);
        }
    }
}

impl core::fmt::Debug for Server {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Server({}, {:?}, epoch {}, {} members)",
            self.cfg.group,
            self.cfg.graph,
            self.epoch,
            self.users.len()
        )
    }
}

impl Server {
    /// A server for an empty group. `identity` signs rekey messages; it may be `None` only with
    /// `Signing::None`.
    pub fn new(cfg: ServerConfig, identity: Option<Identity>) -> Result<Server, ServerError> {
        if cfg.group.is_empty() || cfg.group.len() > MAX_GROUP_NAME_BYTES {
            return Err(ServerError::BadGroupName);
        }
        if cfg.signing != Signing::None && identity.is_none() {
            return Err(ServerError::NoIdentity);
        }
        let graph = match cfg.graph {
            GraphKind::Tree { degree } => {
                if !(2..=MAX_DEGREE).contains(&degree) {
                    return Err(ServerError::BadDegree(degree));
                }
                Graph::Tree(KeyTree::new(degree))
            }
            GraphKind::Star => Graph::Tree(KeyTree::new(STAR_DEGREE)),
            GraphKind::Complete => Graph::Complete(CompleteGraph::default()),
        };
        Ok(Server {
            cfg,
            identity,
            graph,
            slots: Vec::new(),
            users: HashMap::new(),
            free: BTreeSet::new(),
            epoch: 0,
            pending_leaves: Vec::new(),
            pending_joins: Vec::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            last: None,
        })
    }

    /// A server whose tree already holds `members` (slots in order), as after the initial key
    /// distribution; sends nothing. Individual keys come from `members`, the rest from `rng`.
    pub fn with_members(
        cfg: ServerConfig,
        identity: Option<Identity>,
        members: Vec<(UserId, [u8; 32])>,
        rng: &mut dyn CryptoRng,
    ) -> Result<Server, ServerError> {
        let mut s = Server::new(cfg, identity)?;
        if members.len() > s.cfg.max_members() {
            return Err(ServerError::Full {
                max: s.cfg.max_members(),
            });
        }
        // Room to grow by an eighth before any table is reallocated: rehashing a million-entry map
        // inside one join would stall that join for milliseconds.
        let room = members.len() + members.len() / GROWTH_ROOM_DIVISOR;
        s.users.reserve(room);
        s.slots.reserve_exact(room);
        for (i, (u, _)) in members.iter().enumerate() {
            if u.0 == NO_USER {
                return Err(ServerError::ReservedUser(*u));
            }
            if s.users.insert(u.0, i as u32).is_some() {
                return Err(ServerError::AlreadyMember(*u));
            }
            s.slots.push(u.0);
        }
        match &mut s.graph {
            Graph::Tree(t) => {
                *t = KeyTree::bulk(t.degree(), members.iter().map(|(_, k)| *k), 0, rng);
            }
            Graph::Complete(_) => {
                let mut sealer = Sealer::new(s.cfg.aead, &s.cfg.group, 0);
                let Graph::Complete(c) = &mut s.graph else {
                    unreachable!()
                };
                for (i, (_, k)) in members.iter().enumerate() {
                    c.join(Slot(i as u32), k, Strategy::Group, &mut sealer, rng);
                }
            }
        }
        Ok(s)
    }

    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }
    pub(crate) fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// Bytes the saved state will take, or a little more.
    pub(crate) fn state_size_hint(&self) -> usize {
        let graph = match &self.graph {
            Graph::Tree(t) => t.node_count() * 44 + 16 + 4 * (t.height() as usize + 1),
            Graph::Complete(_) => (1 << crate::complete::MAX_COMPLETE_MEMBERS) * 41 + 16,
        };
        // Version, group name, configuration, epoch and the counts of each list.
        128 + MAX_GROUP_NAME_BYTES
            + graph
            + self.slots.len() * 8
            + self.pending_joins.len() * 36
            + self.pending_leaves.len() * 4
            + self.out.iter().map(|t| t.bytes.len() + 4).sum::<usize>()
            + self.events.len() * 20
    }

    /// Everything [`Server::read_state`] needs (see `persist`). Secret: the caller seals it.
    pub(crate) fn write_state(&self, w: &mut Writer) {
        w.u8(STATE_VERSION);
        w.name(&self.cfg.group, MAX_GROUP_NAME_BYTES);
        match self.cfg.graph {
            GraphKind::Star => w.u8(0),
            GraphKind::Tree { degree } => {
                w.u8(1);
                w.u32(degree);
            }
            GraphKind::Complete => w.u8(2),
        }
        w.u8(match self.cfg.strategy {
            Strategy::User => 0,
            Strategy::Key => 1,
            Strategy::Group => 2,
        });
        w.u8(match self.cfg.signing {
            Signing::None => 0,
            Signing::PerMessage => 1,
            Signing::Batch => 2,
        });
        w.u8(match self.cfg.aead {
            AeadAlg::Aes256Gcm => 0,
            AeadAlg::ChaCha20Poly1305 => 1,
        });
        w.u8(self.cfg.compact as u8);
        w.u64(self.epoch);
        w.u32(self.slots.len() as u32);
        for &u in &self.slots {
            w.u64(u);
        }
        match &self.graph {
            Graph::Tree(t) => t.write_state(w),
            Graph::Complete(c) => c.write_state(w),
        }
        w.u32(self.pending_leaves.len() as u32);
        for s in &self.pending_leaves {
            w.u32(s.0);
        }
        w.u32(self.pending_joins.len() as u32);
        for (s, k) in &self.pending_joins {
            w.u32(s.0);
            w.raw(k);
        }
        w.u32(self.out.len() as u32);
        for t in &self.out {
            w.u32(t.bytes.len() as u32);
            w.raw(&t.bytes);
        }
        w.u32(self.events.len() as u32);
        for ServerEvent::Relocated(a) in &self.events {
            w.u64(a.user.0);
            w.u32(a.slot.0);
            w.u64(a.epoch);
        }
    }

    /// The members' slots, the queued requests and the graph agree: every later operation finds
    /// the leaves it expects.
    fn check_restored(&self) -> Result<(), crate::persist::StateError> {
        use crate::persist::StateError::Damaged;
        let occupied = |i: usize| self.slots.get(i).is_some_and(|&u| u != NO_USER);
        let leaving: BTreeSet<u32> = self.pending_leaves.iter().map(|s| s.0).collect();
        let joining: BTreeSet<u32> = self.pending_joins.iter().map(|s| s.0 .0).collect();
        if leaving.len() != self.pending_leaves.len() || joining.len() != self.pending_joins.len() {
            return Err(Damaged("a slot queued twice"));
        }
        match &self.graph {
            Graph::Tree(t) => {
                let width = t.leaf_width().max(self.slots.len());
                for i in 0..width {
                    let slot = i as u32;
                    // Until the batch, a leaver keeps its leaf and a joiner has none yet.
                    let expected =
                        leaving.contains(&slot) || (occupied(i) && !joining.contains(&slot));
                    if t.leaf_key(Slot(slot)).is_some() != expected {
                        return Err(Damaged("slots and key tree disagree"));
                    }
                }
                if leaving.iter().chain(&joining).any(|&s| s as usize >= width) {
                    return Err(Damaged("a queued slot outside the tree"));
                }
                // A queued leave frees its slot, which only a queued joiner may have taken since.
                if leaving
                    .iter()
                    .any(|&s| occupied(s as usize) && !joining.contains(&s))
                {
                    return Err(Damaged("a queued leave from a slot still held"));
                }
            }
            Graph::Complete(c) => {
                if !leaving.is_empty() || !joining.is_empty() {
                    return Err(Damaged("queued requests in a complete graph"));
                }
                if !c.consistent(occupied) {
                    return Err(Damaged("slots and complete graph disagree"));
                }
            }
        }
        Ok(())
    }

    /// A server from [`Server::write_state`]'s bytes, checked so that no later call can index
    /// out of bounds or mistake one member for another.
    pub(crate) fn read_state(
        bytes: &[u8],
        identity: Identity,
    ) -> Result<Server, crate::persist::StateError> {
        use crate::persist::StateError::Damaged;
        let mut r = Reader::new(bytes);
        let cut = |_| Damaged("truncated");
        if r.u8("version").map_err(cut)? != STATE_VERSION {
            return Err(Damaged("state format version"));
        }
        let group = r.name("group", MAX_GROUP_NAME_BYTES).map_err(cut)?;
        let graph = match r.u8("graph").map_err(cut)? {
            0 => GraphKind::Star,
            1 => GraphKind::Tree {
                degree: r.u32("degree").map_err(cut)?,
            },
            2 => GraphKind::Complete,
            _ => return Err(Damaged("graph kind")),
        };
        let strategy = match r.u8("strategy").map_err(cut)? {
            0 => Strategy::User,
            1 => Strategy::Key,
            2 => Strategy::Group,
            _ => return Err(Damaged("strategy")),
        };
        let signing = match r.u8("signing").map_err(cut)? {
            0 => Signing::None,
            1 => Signing::PerMessage,
            2 => Signing::Batch,
            _ => return Err(Damaged("signing")),
        };
        let aead = match r.u8("aead").map_err(cut)? {
            0 => AeadAlg::Aes256Gcm,
            1 => AeadAlg::ChaCha20Poly1305,
            _ => return Err(Damaged("aead")),
        };
        let compact = match r.u8("compact").map_err(cut)? {
            0 => false,
            1 => true,
            _ => return Err(Damaged("compaction flag")),
        };
        let cfg = ServerConfig {
            group,
            graph,
            strategy,
            signing,
            aead,
            compact,
        };
        let mut s = Server::new(cfg, Some(identity))?;
        s.epoch = r.u64("epoch").map_err(cut)?;
        if s.epoch == u64::MAX {
            // The next rekey could not number its epoch.
            return Err(Damaged("epoch"));
        }
        let slots = r.u32("slots").map_err(cut)? as usize;
        if slots > s.cfg.max_members() + MAX_PENDING || r.remaining() < slots * 8 {
            return Err(Damaged("slot count"));
        }
        for i in 0..slots {
            let u = r.u64("slot").map_err(cut)?;
            s.slots.push(u);
            if u == NO_USER {
                s.free.insert(i as u32);
            } else if s.users.insert(u, i as u32).is_some() {
                return Err(Damaged("a member in two slots"));
            }
        }
        if s.slots.last() == Some(&NO_USER) {
            return Err(Damaged("trailing hole"));
        }
        if s.users.len() > s.cfg.max_members() {
            return Err(Damaged("more members than the graph takes"));
        }
        match &mut s.graph {
            Graph::Tree(t) => {
                let tree = KeyTree::read_state(&mut r, s.cfg.max_members()).map_err(Damaged)?;
                if tree.degree() != t.degree() {
                    return Err(Damaged("tree degree differs from the configuration's"));
                }
                *t = tree;
            }
            Graph::Complete(c) => {
                *c = CompleteGraph::read_state(&mut r).map_err(Damaged)?;
                if slots > MAX_COMPLETE_MEMBERS {
                    return Err(Damaged("complete graph slots"));
                }
            }
        }
        let leaves = r.u32("pending leaves").map_err(cut)? as usize;
        if leaves > MAX_PENDING {
            return Err(Damaged("pending leaves"));
        }
        for _ in 0..leaves {
            let slot = r.u32("slot").map_err(cut)?;
            s.pending_leaves.push(Slot(slot));
        }
        let joins = r.u32("pending joins").map_err(cut)? as usize;
        if joins + leaves > MAX_PENDING {
            return Err(Damaged("pending joins"));
        }
        for _ in 0..joins {
            let slot = r.u32("slot").map_err(cut)?;
            let mut k = [0u8; 32];
            k.copy_from_slice(r.take(32, "key").map_err(cut)?);
            if s.slots.get(slot as usize).is_none_or(|&u| u == NO_USER) {
                return Err(Damaged("a pending join in an empty slot"));
            }
            s.pending_joins.push((Slot(slot), k));
        }
        s.check_restored()?;
        let out = r.u32("messages").map_err(cut)? as usize;
        for _ in 0..out {
            let len = r.u32("message length").map_err(cut)? as usize;
            let bytes = r.take(len, "message").map_err(cut)?.to_vec();
            let (msg, _) = RekeyMessage::decode(&bytes).map_err(|_| Damaged("saved message"))?;
            s.out.push_back(Transmit {
                recipients: msg.recipients,
                bytes,
            });
        }
        let events = r.u32("events").map_err(cut)? as usize;
        if r.remaining() != events * 20 {
            return Err(Damaged("events"));
        }
        for _ in 0..events {
            s.events.push_back(ServerEvent::Relocated(JoinAck {
                user: UserId(r.u64("user").map_err(cut)?),
                slot: Slot(r.u32("slot").map_err(cut)?),
                epoch: r.u64("epoch").map_err(cut)?,
            }));
        }
        r.finish().map_err(|_| Damaged("trailing bytes"))?;
        Ok(s)
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn members(&self) -> usize {
        self.users.len()
    }
    pub fn is_member(&self, user: UserId) -> bool {
        self.users.contains_key(&user.0)
    }
    pub fn height(&self) -> u8 {
        match &self.graph {
            Graph::Tree(t) => t.height(),
            Graph::Complete(_) => 1,
        }
    }
    /// The graph's shape as a rekey message would announce it now.
    pub fn shape(&self) -> GraphShape {
        match &self.graph {
            Graph::Tree(t) => t.shape(),
            Graph::Complete(c) => c.shape(),
        }
    }
    /// The current group key, if the group has members.
    pub fn group_key(&self) -> Option<(KeyRef, GroupKey)> {
        let (r, k) = match &self.graph {
            Graph::Tree(t) => t.group_key()?,
            Graph::Complete(c) => c.group_key()?,
        };
        Some((r, GroupKey::from_bytes(*k)))
    }
    /// The keys `user` holds now (its path), as the initial key distribution would hand them.
    pub fn member_keys(&self, user: UserId) -> Option<(Slot, Vec<(KeyRef, GroupKey)>)> {
        let slot = Slot(*self.users.get(&user.0)?);
        let keys = match &self.graph {
            Graph::Tree(t) => t.path_keys(slot),
            Graph::Complete(c) => c.member_keys(slot),
        };
        Some((
            slot,
            keys.into_iter()
                .map(|(r, k)| (r, GroupKey::from_bytes(k)))
                .collect(),
        ))
    }
    /// Heap bytes the server's graph and member tables hold (an estimate for the hash map).
    pub fn heap_bytes(&self) -> usize {
        let g = match &self.graph {
            Graph::Tree(t) => t.heap_bytes(),
            Graph::Complete(c) => c.heap_bytes(),
        };
        // hashbrown: one control byte and one (u64, u32) bucket per slot of capacity.
        g + self.slots.capacity() * 8 + self.users.capacity() * (16 + 1) + self.free.len() * 8
    }
    /// Statistics of the last rekey.
    pub fn last_rekey(&self) -> Option<&RekeyStats> {
        self.last.as_ref()
    }
    /// Members a message to `r` reaches.
    pub fn recipients(&self, r: &Recipients) -> Vec<UserId> {
        let slots: Vec<Slot> = match (&self.graph, r) {
            (_, Recipients::All) => (0..self.slots.len() as u32)
                .map(Slot)
                .filter(|s| self.slots[s.0 as usize] != NO_USER)
                .collect(),
            (Graph::Tree(t), Recipients::Holders(id)) => {
                NodeIndex::from_id(*id).map_or(Vec::new(), |ix| t.slots_below(ix))
            }
            (Graph::Tree(t), Recipients::HoldersExcept(a, b)) => {
                let minus: BTreeSet<Slot> = NodeIndex::from_id(*b)
                    .map_or(Vec::new(), |ix| t.slots_below(ix))
                    .into_iter()
                    .collect();
                NodeIndex::from_id(*a)
                    .map_or(Vec::new(), |ix| t.slots_below(ix))
                    .into_iter()
                    .filter(|s| !minus.contains(s))
                    .collect()
            }
            (Graph::Complete(c), Recipients::Holders(m)) => (0..MAX_COMPLETE_MEMBERS as u32)
                .filter(|i| m & c.members() & (1 << i) != 0)
                .map(Slot)
                .collect(),
            (Graph::Complete(c), Recipients::HoldersExcept(a, b)) => (0..MAX_COMPLETE_MEMBERS
                as u32)
                .filter(|i| a & !b & c.members() & (1 << i) != 0)
                .map(Slot)
                .collect(),
        };
        slots
            .into_iter()
            .filter_map(|s| self.slots.get(s.0 as usize).copied())
            .filter(|u| *u != NO_USER)
            .map(UserId)
            .collect()
    }
    fn count_recipients(&self, r: &Recipients) -> u64 {
        match (&self.graph, r) {
            (_, Recipients::All) => self.users.len() as u64,
            (Graph::Tree(t), Recipients::Holders(id)) => users_at(t, *id),
            (Graph::Tree(t), Recipients::HoldersExcept(a, b)) => {
                users_at(t, *a).saturating_sub(users_at(t, *b))
            }
            (Graph::Complete(c), Recipients::Holders(m)) => c.holders(*m),
            (Graph::Complete(c), Recipients::HoldersExcept(a, b)) => c.holders(a & !b),
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    fn check_join(&self, user: UserId) -> Result<(), ServerError> {
        if user.0 == NO_USER {
            return Err(ServerError::ReservedUser(user));
        }
        if self.users.contains_key(&user.0) {
            return Err(ServerError::AlreadyMember(user));
        }
        if self.users.len() >= self.cfg.max_members() {
            return Err(ServerError::Full {
                max: self.cfg.max_members(),
            });
        }
        Ok(())
    }
    fn alloc_slot(&mut self, user: UserId) -> Slot {
        let s = match self.free.pop_first() {
            Some(s) => s,
            None => {
                self.slots.push(NO_USER);
                (self.slots.len() - 1) as u32
            }
        };
        self.slots[s as usize] = user.0;
        self.users.insert(user.0, s);
        Slot(s)
    }
    fn free_slot(&mut self, user: UserId) -> Result<Slot, ServerError> {
        let s = self
            .users
            .remove(&user.0)
            .ok_or(ServerError::NotMember(user))?;
        self.slots[s as usize] = NO_USER;
        self.free.insert(s);
        while self.slots.last() == Some(&NO_USER) {
            self.slots.pop();
            self.free.remove(&(self.slots.len() as u32));
        }
        Ok(Slot(s))
    }
    fn leaf_key(&self, slot: Slot) -> Option<[u8; 32]> {
        match &self.graph {
            Graph::Tree(t) => t.leaf_key(slot),
            Graph::Complete(c) => c.leaf_key(slot),
        }
    }

    /// Admits `user` and rekeys at once. Queued requests are rekeyed first, in their own epoch.
    /// `individual_key` must be fresh (never given to another server or to this one before): items
    /// under it are numbered from each epoch, and epochs restart with a new server.
    pub fn join(
        &mut self,
        user: UserId,
        individual_key: &GroupKey,
        rng: &mut dyn CryptoRng,
    ) -> Result<JoinAck, ServerError> {
        self.check_join(user)?;
        self.rekey_batch(rng)?;
        let slot = self.alloc_slot(user);
        self.epoch += 1;
        let mut sealer = Sealer::new(self.cfg.aead, &self.cfg.group, self.epoch);
        let rekey = match &mut self.graph {
            Graph::Tree(t) => t.join(
                slot,
                individual_key.expose(),
                self.cfg.strategy,
                &mut sealer,
                rng,
            ),
            Graph::Complete(c) => c.join(
                slot,
                individual_key.expose(),
                self.cfg.strategy,
                &mut sealer,
                rng,
            ),
        };
        let (keys, items) = (sealer.keys_encrypted, sealer.items);
        self.emit(rekey, items, keys, 1, 0, 0)?;
        Ok(JoinAck {
            user,
            slot,
            epoch: self.epoch,
        })
    }

    /// Removes `user` and rekeys at once. Queued requests are rekeyed first, in their own epoch.
    pub fn leave(&mut self, user: UserId, rng: &mut dyn CryptoRng) -> Result<(), ServerError> {
        if !self.users.contains_key(&user.0) {
            return Err(ServerError::NotMember(user));
        }
        self.rekey_batch(rng)?;
        let slot = self.free_slot(user)?;
        if matches!(self.graph, Graph::Tree(_)) && self.cfg.compact {
            let moves = self.plan_moves(1);
            if !moves.is_empty() {
                // A compacting leave is rekeyed as one batch (the member's move is a leave and
                // a join of its own).
                let mut leaves = vec![slot];
                leaves.extend(moves.iter().map(|m| m.0));
                let joins: Vec<(Slot, [u8; 32])> = moves.iter().map(|m| (m.1, m.2)).collect();
                return self.rekey_batch_now(leaves, joins, 0, 1, moves.len() as u32, rng);
            }
        }
        self.epoch += 1;
        let mut sealer = Sealer::new(self.cfg.aead, &self.cfg.group, self.epoch);
        let rekey = match &mut self.graph {
            Graph::Tree(t) => t.leave(slot, self.cfg.strategy, &mut sealer, rng),
            Graph::Complete(c) => c.leave(slot),
        };
        let (keys, items) = (sealer.keys_encrypted, sealer.items);
        self.emit(rekey, items, keys, 0, 1, 0)
    }

    /// Queues a join for the next [`Server::rekey_batch`]; the member's keys come with that rekey.
    pub fn queue_join(
        &mut self,
        user: UserId,
        individual_key: &GroupKey,
    ) -> Result<JoinAck, ServerError> {
        if matches!(self.graph, Graph::Complete(_)) {
            return Err(ServerError::BatchOnComplete);
        }
        self.check_join(user)?;
        if self.pending_joins.len() + self.pending_leaves.len() >= MAX_PENDING {
            return Err(ServerError::TooManyPending { max: MAX_PENDING });
        }
        let slot = self.alloc_slot(user);
        self.pending_joins.push((slot, *individual_key.expose()));
        Ok(JoinAck {
            user,
            slot,
            epoch: self.epoch + 1,
        })
    }

    /// Queues a leave for the next [`Server::rekey_batch`]. The member's slot may go to a joiner
    /// of the same batch.
    pub fn queue_leave(&mut self, user: UserId) -> Result<(), ServerError> {
        if matches!(self.graph, Graph::Complete(_)) {
            return Err(ServerError::BatchOnComplete);
        }
        if self.pending_joins.len() + self.pending_leaves.len() >= MAX_PENDING {
            return Err(ServerError::TooManyPending { max: MAX_PENDING });
        }
        let slot = self.free_slot(user)?;
        if let Some(i) = self.pending_joins.iter().position(|(s, _)| *s == slot) {
            // Joined and left within one batch: it never enters the tree.
            self.pending_joins.swap_remove(i);
        } else {
            self.pending_leaves.push(slot);
        }
        Ok(())
    }

    /// Folds every queued request into one rekey (Li, Yang, Gouda, Lam 2001); `Ok(false)` if
    /// nothing was queued. The caller runs this on its rekey interval.
    pub fn rekey_batch(&mut self, rng: &mut dyn CryptoRng) -> Result<bool, ServerError> {
        if self.pending_joins.is_empty() && self.pending_leaves.is_empty() {
            return Ok(false);
        }
        let mut leaves = std::mem::take(&mut self.pending_leaves);
        let mut joins = std::mem::take(&mut self.pending_joins);
        let (nj, nl) = (joins.len() as u32, leaves.len() as u32);
        let mut moves = Vec::new();
        if self.cfg.compact {
            let pending: BTreeSet<Slot> = joins.iter().map(|j| j.0).collect();
            moves = self.plan_moves_avoiding(leaves.len(), &pending);
        }
        leaves.extend(moves.iter().map(|m| m.0));
        joins.extend(moves.iter().map(|m| (m.1, m.2)));
        self.rekey_batch_now(leaves, joins, nj, nl, moves.len() as u32, rng)?;
        Ok(true)
    }

    fn plan_moves(&mut self, max: usize) -> Vec<(Slot, Slot, [u8; 32])> {
        self.plan_moves_avoiding(max, &BTreeSet::new())
    }

    /// Compaction: while the members would fit a tree one level lower, move the member in the
    /// highest slot to the lowest hole, at most `max` of them (one per leave, so the cost spreads).
    fn plan_moves_avoiding(
        &mut self,
        max: usize,
        pending_joins: &BTreeSet<Slot>,
    ) -> Vec<(Slot, Slot, [u8; 32])> {
        let mut moves = Vec::new();
        let Graph::Tree(t) = &self.graph else {
            return moves;
        };
        let (degree, height) = (t.degree(), t.height());
        while moves.len() < max {
            if degree == STAR_DEGREE || height <= 1 {
                break;
            }
            let lower = crate::index::capacity(degree, height - 1);
            let Some(last) = self.slots.len().checked_sub(1) else {
                break;
            };
            if self.users.len() as u64 > lower || (last as u64) < lower {
                break;
            }
            let from = Slot(last as u32);
            if pending_joins.contains(&from) {
                break;
            }
            let Some(key) = self.leaf_key(from) else {
                break;
            };
            let user = UserId(self.slots[last]);
            let Ok(_) = self.free_slot(user) else { break };
            let to = self.alloc_slot(user);
            moves.push((from, to, key));
            self.events.push_back(ServerEvent::Relocated(JoinAck {
                user,
                slot: to,
                epoch: self.epoch + 1,
            }));
        }
        moves
    }

    fn rekey_batch_now(
        &mut self,
        leaves: Vec<Slot>,
        joins: Vec<(Slot, [u8; 32])>,
        nj: u32,
        nl: u32,
        moves: u32,
        rng: &mut dyn CryptoRng,
    ) -> Result<(), ServerError> {
        self.epoch += 1;
        let mut sealer = Sealer::new(self.cfg.aead, &self.cfg.group, self.epoch);
        let Graph::Tree(t) = &mut self.graph else {
            return Err(ServerError::BatchOnComplete);
        };
        let rekey = t.batch(&leaves, &joins, &mut sealer, rng);
        let (keys, items) = (sealer.keys_encrypted, sealer.items);
        self.emit(rekey, items, keys, nj, nl, moves)
    }

    /// Authenticates and encodes one epoch's messages (§4: one signature for the whole batch).
    /// Each item is encoded once; messages sharing it copy its bytes.
    fn emit(
        &mut self,
        rekey: Rekey,
        items: Vec<Item>,
        keys_encrypted: u64,
        joins: u32,
        leaves: u32,
        moves: u32,
    ) -> Result<(), ServerError> {
        let mut st = RekeyStats {
            epoch: self.epoch,
            joins,
            leaves,
            moves,
            height: self.height(),
            members: self.users.len() as u64,
            keys_encrypted,
            items: items.len() as u64,
            key_changes: rekey.key_changes,
            ..RekeyStats::default()
        };
        let Some(group_key) = rekey.group_key else {
            // The group is empty: nobody to tell.
            self.last = Some(st);
            return Ok(());
        };
        let mut encoded = Writer::with_capacity(items.iter().map(Item::encoded_len).sum());
        let mut spans = Vec::with_capacity(items.len());
        for it in &items {
            let start = encoded.as_slice().len();
            it.write(&mut encoded);
            spans.push(start..encoded.as_slice().len());
        }
        let encoded = encoded.into_vec();
        let item_digests: Vec<_> = if self.cfg.signing == Signing::None {
            Vec::new()
        } else {
            st.digests += spans.len() as u64;
            spans
                .iter()
                .map(|r| item_digest(&encoded[r.clone()]))
                .collect()
        };
        let mut messages = Vec::with_capacity(rekey.messages.len());
        for (recipients, ids) in rekey.messages {
            if ids.len() <= MAX_ITEMS {
                messages.push((recipients, ids));
                continue;
            }
            // A message over the item limit (a large batch, a large star) is cut by subtrees.
            let (degree, height) = match rekey.shape {
                GraphShape::Tree { degree, height } => (degree, height),
                GraphShape::Star => (STAR_DEGREE, 1),
                GraphShape::Complete { .. } => unreachable!("complete graphs stay under the limit"),
            };
            split_by_subtree(&items, ids, NodeIndex::root(height), degree, &mut messages);
        }
        let mut bodies = Vec::with_capacity(messages.len());
        let mut digests = Vec::with_capacity(messages.len());
        for (recipients, ids) in messages {
            let len: usize = ids.iter().map(|i| spans[*i as usize].len()).sum();
            let mut w = Writer::with_capacity(len + 200 + 32 * 24);
            RekeyMessage::write_header(
                &mut w,
                &self.cfg.group,
                self.epoch,
                rekey.shape,
                group_key,
                recipients,
                ids.len(),
            );
            if self.cfg.signing != Signing::None {
                st.digests += 1;
                digests.push(message_digest(
                    w.as_slice(),
                    ids.iter().map(|i| &item_digests[*i as usize]),
                ));
            }
            for i in ids {
                w.raw(&encoded[spans[i as usize].clone()]);
            }
            bodies.push((recipients, w));
        }
        let auths: Vec<Auth> = match self.cfg.signing {
            Signing::None => bodies.iter().map(|_| Auth::None).collect(),
            Signing::PerMessage => {
                let id = self.identity.as_ref().ok_or(ServerError::NoIdentity)?;
                let mut v = Vec::with_capacity(bodies.len());
                for d in &digests {
                    st.signatures += 1;
                    v.push(Auth::Signed {
                        signature: id.sign(&signed_message(d))?,
                    });
                }
                v
            }
            Signing::Batch => {
                let id = self.identity.as_ref().ok_or(ServerError::NoIdentity)?;
                let count = digests.len();
                let tree = MerkleTree::new(digests);
                st.digests += (count - 1) as u64;
                st.signatures += 1;
                let signature = id.sign(&signed_root(count as u32, &tree.root()))?;
                (0..count)
                    .map(|i| Auth::Batch {
                        leaf_index: i as u32,
                        leaf_count: count as u32,
                        path: tree.path(i),
                        signature: signature.clone(),
                    })
                    .collect()
            }
        };
        let mut min = u64::MAX;
        for ((recipients, mut w), auth) in bodies.into_iter().zip(auths) {
            RekeyMessage::write_auth(&auth, &mut w);
            let bytes = w.into_vec();
            let len = bytes.len() as u64;
            let reach = self.count_recipients(&recipients);
            st.messages += 1;
            st.bytes_sent += len;
            min = min.min(len);
            st.message_bytes_max = st.message_bytes_max.max(len);
            st.deliveries += reach;
            st.bytes_received += reach * len;
            self.out.push_back(Transmit { recipients, bytes });
        }
        st.message_bytes_min = if st.messages == 0 { 0 } else { min };
        self.last = Some(st);
        Ok(())
    }

    /// The server's public key, for members to verify rekey messages.
    pub fn public_identity(&self) -> Option<PublicIdentity> {
        self.identity.as_ref().map(Identity::public)
    }
}

/// Cuts one message's items into messages for the subtrees below `r`, each holding the items its
/// members need: those under a key inside the subtree and those under `r` or above.
fn split_by_subtree(
    items: &[Item],
    ids: Vec<ItemId>,
    r: NodeIndex,
    degree: u32,
    out: &mut Vec<(Recipients, Vec<ItemId>)>,
) {
    if ids.len() <= MAX_ITEMS || r.level == 0 {
        assert!(ids.len() <= MAX_ITEMS, "a leaf's items fit one message");
        out.push((Recipients::Holders(r.id()), ids));
        return;
    }
    let mut common = Vec::new();
    let mut by_child: std::collections::BTreeMap<u32, Vec<ItemId>> = Default::default();
    for id in ids {
        let u = NodeIndex::from_id(items[id as usize].under.id).expect("server-made ids");
        if u.level >= r.level {
            common.push(id);
        } else {
            let mut o = u.offset as u64;
            for _ in u.level..r.level - 1 {
                o /= degree as u64;
            }
            by_child.entry(o as u32).or_default().push(id);
        }
    }
    for (offset, mut v) in by_child {
        v.extend_from_slice(&common);
        let c = NodeIndex {
            level: r.level - 1,
            offset,
        };
        split_by_subtree(items, v, c, degree, out);
    }
}

fn users_at(t: &KeyTree, id: u64) -> u64 {
    NodeIndex::from_id(id).map_or(0, |ix| t.slots_below_count(ix))
}

#[cfg(test)]
mod state_tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    fn server() -> (Server, rand_chacha::ChaCha20Rng) {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
        let id = Identity::ed25519_from_seed(&[1; 32]).unwrap();
        let mut s = Server::new(
            ServerConfig::new("g", GraphKind::Tree { degree: 2 }),
            Some(id),
        )
        .unwrap();
        for u in 0..6 {
            s.join(UserId(u), &GroupKey::from_bytes([u as u8; 32]), &mut rng)
                .unwrap();
        }
        while s.poll_transmit().is_some() {}
        (s, rng)
    }

    fn reread(s: &Server) -> Result<Server, crate::persist::StateError> {
        let mut w = Writer::new();
        s.write_state(&mut w);
        Server::read_state(w.as_slice(), Identity::ed25519_from_seed(&[1; 32]).unwrap())
    }

    #[test]
    fn states_the_server_could_not_have_reached_are_refused() {
        let (s, _) = server();
        assert!(reread(&s).is_ok());

        // A queued leave from a slot a member still holds.
        let (mut bad, _) = server();
        bad.pending_leaves.push(Slot(2));
        assert!(reread(&bad).is_err());

        // The last epoch: the next rekey could not be numbered.
        let (mut bad, _) = server();
        bad.epoch = u64::MAX;
        assert!(reread(&bad).is_err());

        // A member in the slots whose leaf the tree does not hold, and the reverse.
        let (mut bad, _) = server();
        bad.slots.push(99);
        assert!(reread(&bad).is_err());
        let (mut bad, _) = server();
        bad.slots[1] = NO_USER;
        bad.free.insert(1);
        assert!(reread(&bad).is_err());

        // A tree whose leaves lost their parents, or with a second root.
        let (mut bad, _) = server();
        if let Graph::Tree(t) = &mut bad.graph {
            t.orphan_leaves_for_test();
        }
        assert!(reread(&bad).is_err());
        let (mut bad, _) = server();
        if let Graph::Tree(t) = &mut bad.graph {
            t.second_root_for_test();
        }
        assert!(reread(&bad).is_err());

        // A node with members and no key.
        let (mut bad, _) = server();
        if let Graph::Tree(t) = &mut bad.graph {
            t.keyless_root_for_test();
        }
        assert!(reread(&bad).is_err());
    }

    #[test]
    fn the_size_hint_covers_the_state() {
        let (s, _) = server();
        let mut w = Writer::new();
        s.write_state(&mut w);
        assert!(w.as_slice().len() <= s.state_size_hint());
    }
}
