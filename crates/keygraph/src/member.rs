//! A member of a key-graph group: holds the keys of its path, verifies and applies rekey messages,
//! and yields the group key. A pure state machine: bytes in, keys out.
//!
//! A message is checked in this order, and any failure leaves the member as it was: it decodes;
//! it names this group; its authenticator verifies against the server's key (when the member
//! requires signatures); its epoch is the next one (stale or replayed messages are refused, and a
//! gap is reported so the caller can fetch what it missed); its graph shape fits the member's
//! graph; every item under a key the member holds opens (a forged item is refused, not skipped);
//! and afterwards the member holds the group key the message names.

use crate::index::{path, NodeIndex, Slot};
use crate::merkle::{digest_of, root_from_path, signed_message, signed_root};
use crate::seal::open;
use crate::server::{JoinAck, UserId};
use crate::GraphKind;
use conclave_crypto::aead::AeadAlg;
use conclave_crypto::{GroupKey, PublicIdentity};
use conclave_wire::lkh::{Auth, GraphShape, KeyRef, Recipients, RekeyMessage};
use conclave_wire::DecodeError;
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Debug)]
pub struct MemberConfig {
    pub group: String,
    pub graph: GraphKind,
    pub aead: AeadAlg,
    /// The server's key. `Some`: every message must carry a valid signature (one of its own or
    /// one over its batch). `None`: unsigned messages are accepted (paper 001's mode without
    /// signatures, in which a member could forge).
    pub server: Option<PublicIdentity>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    #[error("malformed rekey message: {0}")]
    Decode(#[from] DecodeError),
    #[error("message for group {0:?}")]
    WrongGroup(String),
    #[error("message carries no signature")]
    Unsigned,
    #[error("signature does not verify")]
    BadSignature,
    #[error("batch authentication path does not fit")]
    BadAuthPath,
    #[error("stale or replayed message: epoch {epoch}, expected {expected}")]
    Stale { epoch: u64, expected: u64 },
    #[error("missed rekeys: epoch {epoch}, expected {expected}")]
    Gap { epoch: u64, expected: u64 },
    #[error("graph shape {0:?} does not fit this member")]
    WrongShape(GraphShape),
    #[error("item {seq} does not open under the key it names")]
    Forged { seq: u32 },
    #[error("the message does not give this member the group key")]
    NotForMe,
    #[error("slot {0:?} is out of range for this graph")]
    BadSlot(Slot),
}

/// What applying a message did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub epoch: u64,
    /// Keys decrypted.
    pub keys_learned: usize,
}

type Keys = BTreeMap<u64, (u64, GroupKey)>;

/// One member's key state.
pub struct Member {
    cfg: MemberConfig,
    user: UserId,
    slot: Slot,
    /// The next epoch this member accepts.
    expected: u64,
    keys: Keys,
    shape: Option<GraphShape>,
    group_key: Option<KeyRef>,
    /// A move announced by the server, taken once a message of its epoch applies.
    relocation: Option<JoinAck>,
    /// The last batch root whose signature verified (leaf count, root): the other messages of
    /// the batch need only their path checked.
    verified_root: Option<(u32, [u8; 32])>,
}

impl core::fmt::Debug for Member {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Member({:?} in {}, slot {}, next epoch {}, {} keys redacted)",
            self.user,
            self.cfg.group,
            self.slot.0,
            self.expected,
            self.keys.len()
        )
    }
}

fn check_slot(graph: GraphKind, slot: Slot) -> Result<(), MemberError> {
    let max = match graph {
        GraphKind::Complete => crate::complete::MAX_COMPLETE_MEMBERS,
        _ => crate::server::MAX_MEMBERS,
    };
    if slot.0 as usize >= max {
        return Err(MemberError::BadSlot(slot));
    }
    Ok(())
}

fn leaf_id(graph: GraphKind, slot: Slot) -> u64 {
    match graph {
        GraphKind::Complete => 1u64 << slot.0,
        _ => NodeIndex::leaf(slot).id(),
    }
}

impl Member {
    /// A joining member: its individual key, and the ack the server gave when it admitted it.
    pub fn new(
        cfg: MemberConfig,
        ack: &JoinAck,
        individual_key: GroupKey,
    ) -> Result<Member, MemberError> {
        check_slot(cfg.graph, ack.slot)?;
        let mut keys = Keys::new();
        keys.insert(leaf_id(cfg.graph, ack.slot), (ack.epoch, individual_key));
        Ok(Member {
            cfg,
            user: ack.user,
            slot: ack.slot,
            expected: ack.epoch,
            keys,
            shape: None,
            group_key: None,
            relocation: None,
            verified_root: None,
        })
    }

    /// A member handed its keys by the initial key distribution (see `Server::member_keys`).
    pub fn with_keys(
        cfg: MemberConfig,
        user: UserId,
        slot: Slot,
        epoch: u64,
        keys: Vec<(KeyRef, GroupKey)>,
        shape: GraphShape,
    ) -> Result<Member, MemberError> {
        check_slot(cfg.graph, slot)?;
        let group_key = keys.last().map(|(r, _)| *r);
        let keys = keys
            .into_iter()
            .map(|(r, k)| (r.id, (r.version, k)))
            .collect();
        let mut m = Member {
            cfg,
            user,
            slot,
            expected: epoch + 1,
            keys,
            shape: Some(shape),
            group_key,
            relocation: None,
            verified_root: None,
        };
        if let GraphShape::Complete { members } = shape {
            m.group_key = m.keys.get(&members).map(|(v, _)| KeyRef {
                id: members,
                version: *v,
            });
        }
        Ok(m)
    }

    /// The server moved this member (compaction): from `ack.epoch` on its keys follow the new
    /// slot. Nothing changes until a message of that epoch applies.
    pub fn relocate(&mut self, ack: &JoinAck) -> Result<(), MemberError> {
        check_slot(self.cfg.graph, ack.slot)?;
        self.relocation = Some(*ack);
        Ok(())
    }

    pub fn user(&self) -> UserId {
        self.user
    }
    pub fn slot(&self) -> Slot {
        self.slot
    }
    /// The epoch of the last message applied, if any.
    pub fn epoch(&self) -> Option<u64> {
        self.group_key.map(|_| self.expected - 1)
    }
    pub fn group_key(&self) -> Option<(KeyRef, &GroupKey)> {
        let r = self.group_key?;
        let (v, k) = self.keys.get(&r.id)?;
        (*v == r.version).then_some((r, k))
    }
    /// Every key this member holds now.
    pub fn keys(&self) -> Vec<(KeyRef, GroupKey)> {
        self.keys
            .iter()
            .map(|(id, (v, k))| {
                (
                    KeyRef {
                        id: *id,
                        version: *v,
                    },
                    k.clone(),
                )
            })
            .collect()
    }

    fn check_auth(&mut self, msg: &RekeyMessage, body: &[u8]) -> Result<(), MemberError> {
        let Some(server) = &self.cfg.server else {
            return Ok(());
        };
        match &msg.auth {
            Auth::None => Err(MemberError::Unsigned),
            Auth::Signed { signature } => server
                .verify(&signed_message(&digest_of(msg, body)), signature)
                .map_err(|_| MemberError::BadSignature),
            Auth::Batch {
                leaf_index,
                leaf_count,
                path,
                signature,
            } => {
                let root = root_from_path(digest_of(msg, body), *leaf_index, *leaf_count, path)
                    .ok_or(MemberError::BadAuthPath)?;
                if self.verified_root == Some((*leaf_count, root)) {
                    return Ok(());
                }
                server
                    .verify(&signed_root(*leaf_count, &root), signature)
                    .map_err(|_| MemberError::BadSignature)?;
                self.verified_root = Some((*leaf_count, root));
                Ok(())
            }
        }
    }

    /// Whether key `id` belongs to this member under `shape`.
    fn wanted(&self, shape: GraphShape, slot: Slot, id: u64) -> bool {
        match shape {
            GraphShape::Complete { members } => id & (1 << slot.0) != 0 && id & !members == 0,
            GraphShape::Tree { degree, height } => NodeIndex::from_id(id).is_some_and(|ix| {
                ix.level <= height && NodeIndex::ancestor(slot, degree, ix.level) == ix
            }),
            GraphShape::Star => NodeIndex::from_id(id).is_some_and(|ix| {
                (ix.level == 0 && ix.offset == slot.0) || (ix.level == 1 && ix.offset == 0)
            }),
        }
    }

    fn shape_fits(&self, shape: GraphShape, slot: Slot, group_key: KeyRef) -> bool {
        match (self.cfg.graph, shape) {
            (GraphKind::Tree { degree }, GraphShape::Tree { degree: d, height }) => {
                d == degree
                    && height >= 1
                    && crate::index::capacity(degree, height) > slot.0 as u64
                    && group_key.id == NodeIndex::root(height).id()
            }
            (GraphKind::Star, GraphShape::Star) => group_key.id == NodeIndex::root(1).id(),
            (GraphKind::Complete, GraphShape::Complete { members }) => {
                members & (1 << slot.0) != 0 && group_key.id == members
            }
            _ => false,
        }
    }

    /// Whether the message is for this member (at the slot it has in the message's epoch).
    fn addressed(&self, msg: &RekeyMessage) -> bool {
        let slot = self
            .relocation
            .filter(|a| a.epoch == msg.epoch)
            .map_or(self.slot, |a| a.slot);
        let holds = |id: u64| match msg.shape {
            GraphShape::Complete { .. } => id & (1 << slot.0) != 0,
            _ => self.wanted(msg.shape, slot, id),
        };
        match msg.recipients {
            Recipients::All => true,
            Recipients::Holders(a) => holds(a),
            Recipients::HoldersExcept(a, b) => holds(a) && !holds(b),
        }
    }

    /// Verifies and applies one rekey message.
    pub fn handle_rekey(&mut self, bytes: &[u8]) -> Result<Applied, MemberError> {
        let (msg, body_len) = RekeyMessage::decode(bytes)?;
        if msg.group != self.cfg.group {
            return Err(MemberError::WrongGroup(msg.group));
        }
        // A message of this epoch for other members is dropped before its signature is checked:
        // it would change nothing here, and with one message per set of members most are not
        // this member's (checked again below, once it is authentic).
        if msg.epoch == self.expected {
            let slot = self
                .relocation
                .filter(|a| a.epoch == msg.epoch)
                .map_or(self.slot, |a| a.slot);
            // Only a shape that fits this member's graph is read before the signature.
            if self.shape_fits(msg.shape, slot, msg.group_key) && !self.addressed(&msg) {
                return Err(MemberError::NotForMe);
            }
        }
        self.check_auth(&msg, &bytes[..body_len])?;
        if msg.epoch < self.expected {
            return Err(MemberError::Stale {
                epoch: msg.epoch,
                expected: self.expected,
            });
        }
        if msg.epoch > self.expected {
            return Err(MemberError::Gap {
                epoch: msg.epoch,
                expected: self.expected,
            });
        }
        // A relocation announced for this epoch takes effect with this message.
        let moving = self.relocation.filter(|a| a.epoch == msg.epoch);
        let slot = moving.map_or(self.slot, |a| a.slot);
        if !self.shape_fits(msg.shape, slot, msg.group_key) {
            return Err(MemberError::WrongShape(msg.shape));
        }
        if !self.addressed(&msg) {
            return Err(MemberError::NotForMe);
        }
        // Staged: nothing changes unless the whole message applies.
        let mut staged = self.keys.clone();
        if let Some(a) = moving {
            // The same individual key, under the new slot's name.
            if let Some((_, k)) = self.keys.get(&leaf_id(self.cfg.graph, self.slot)) {
                let k = k.clone();
                staged.insert(leaf_id(self.cfg.graph, a.slot), (a.epoch, k));
            }
        }
        let mut by_under: HashMap<(u64, u64), Vec<usize>> = HashMap::new();
        for (i, it) in msg.items.iter().enumerate() {
            by_under
                .entry((it.under.id, it.under.version))
                .or_default()
                .push(i);
        }
        // Keys to try, with their values: an old key may open items after its new value is staged.
        let mut work: Vec<((u64, u64), GroupKey)> = staged
            .iter()
            .map(|(id, (v, k))| ((*id, *v), k.clone()))
            .collect();
        let mut learned = 0;
        while let Some((k, under)) = work.pop() {
            let Some(items) = by_under.remove(&k) else {
                continue;
            };
            for i in items {
                let it = &msg.items[i];
                let keys = open(self.cfg.aead, &msg.group, msg.epoch, it, under.expose())
                    .map_err(|_| MemberError::Forged { seq: it.seq })?;
                for (r, key) in it.keys.iter().zip(keys) {
                    if !self.wanted(msg.shape, slot, r.id) {
                        continue;
                    }
                    if staged.get(&r.id).is_some_and(|(v, _)| *v >= r.version) {
                        continue;
                    }
                    let key = GroupKey::from_bytes(*key);
                    staged.insert(r.id, (r.version, key.clone()));
                    work.push(((r.id, r.version), key));
                    learned += 1;
                }
            }
        }
        let shape = msg.shape;
        staged.retain(|id, _| self.wanted(shape, slot, *id));
        if staged.get(&msg.group_key.id).map(|(v, _)| *v) != Some(msg.group_key.version) {
            return Err(MemberError::NotForMe);
        }
        // Every key the member should hold must be there: a missing one means a message meant
        // for other members (which may still carry the group key).
        let complete = match shape {
            GraphShape::Tree { degree, height } => {
                path(slot, degree, height).all(|ix| staged.contains_key(&ix.id()))
            }
            GraphShape::Complete { members } => {
                staged.len() as u64 == 1u64 << (members.count_ones() - 1)
            }
            GraphShape::Star => true,
        };
        if !complete {
            return Err(MemberError::NotForMe);
        }
        self.keys = staged;
        self.slot = slot;
        if moving.is_some() {
            self.relocation = None;
        }
        self.shape = Some(shape);
        self.group_key = Some(msg.group_key);
        self.expected = msg.epoch + 1;
        Ok(Applied {
            epoch: msg.epoch,
            keys_learned: learned,
        })
    }
}
