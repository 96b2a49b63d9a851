//! Machinery every protocol shares: the run header, signing and checking envelopes, replay
//! detection, the outbox, counting, and the "side" a member belongs to across cascades.
//!
//! # Sides: how every protocol survives cascaded events
//!
//! A member's *secure state* is what it kept from the last run it completed (a key tree, a list
//! of partial keys, pairwise channels). Its *side* is the set of members known to hold the very
//! same secure state: when a run completes, the side is the whole view; at every new view it
//! shrinks to `side ∩ transitional set`, because only members that moved together with us
//! delivered exactly the messages we delivered (virtual synchrony), so only they completed
//! exactly the runs we completed. Members that move together report equal transitional sets, so
//! every member of a side computes the same side.
//!
//! A new view always abandons the run in progress and starts from the secure state, restricted
//! to the side. Each side then acts as one of the merging groups of the paper's merge protocol
//! (a view whose only side is the whole view is a leave, a partition or a plain refresh). So a
//! view arriving at any round of any protocol is handled the same way as a view arriving
//! between runs, and no member is ever left waiting for a message of an abandoned run: those
//! messages carry the old view id and are refused as stale.

/// The `KeyAgreement` methods that every protocol answers from its [`Core`] alone.
macro_rules! forward_to_core {
    () => {
        fn me(&self) -> &str {
            &self.core.me
        }
        fn poll_transmit(&mut self) -> Option<crate::api::Transmit> {
            self.core.poll_transmit()
        }
        fn meter(&self) -> conclave_crypto::Meter {
            self.core.meter
        }
        fn in_progress(&self) -> bool {
            self.core.in_progress
        }
        fn clone_box(&self) -> Box<dyn crate::api::KeyAgreement> {
            Box::new(self.clone())
        }
    };
}

use crate::api::{
    Dest, GkaError, GroupViewId, MemberId, Order, SecureView, SharedDirectory, Transmit, View,
};
use crate::members::{in_order, MemberSet, Members};
use conclave_crypto::{GroupKey, Identity, Meter};
use conclave_wire::gka::{Envelope, ProtocolId, MAX_MEMBERS, MAX_NAME_BYTES};
use foldhash::fast::RandomState;
use hashbrown::{HashMap, HashSet};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::Arc;

/// The most messages one member may have applied in one run. The busiest sender is a TGDH
/// sponsor of a partition, with one broadcast per level of the tree; nothing needs more than one
/// a level plus two, so this bounds the replay set and the work a misbehaving member can cause.
pub const MAX_MESSAGES_PER_SENDER: u32 = conclave_wire::gka::MAX_PATH_BITS as u32 + 2;

/// State common to the five protocols.
#[derive(Clone)]
pub(crate) struct Core {
    pub me: MemberId,
    pub group: String,
    pub protocol: ProtocolId,
    pub identity: Identity,
    pub directory: SharedDirectory,
    pub meter: Meter,
    outbox: VecDeque<Transmit>,
    keys: VecDeque<SecureView>,
    pub view: Option<View>,
    /// The current view's members with their positions in its agreed order, built once per
    /// view: a message's sender is found in constant time, not by a walk through n names.
    pub member_set: Members,
    /// Members known to share this member's secure state (see the module doc).
    pub side: Members,
    /// Digests of the signatures of the messages already applied in the current run ([`seen_id`]).
    /// Both schemes sign deterministically, so a replayed message carries a signature seen
    /// before, and a signature identifies its message without hashing the whole message again.
    /// Fixed-size entries: a new view empties the set without freeing one allocation per
    /// message of the last run (after a merge of many members, thousands).
    seen: HashSet<[u8; 32], RandomState>,
    /// Messages applied from each sender in the current run, against [`MAX_MESSAGES_PER_SENDER`],
    /// by the sender's position in the view.
    per_sender: HashMap<u32, u32, RandomState>,
    pub in_progress: bool,
    /// The digest of the current view's member list, which every signature covers.
    members_hash: [u8; 32],
    /// Keys agreed so far (the last key's [`SecureView::epoch`]).
    epoch: u64,
}

/// A checked, authenticated envelope of the current run.
pub(crate) struct Incoming {
    pub sender: MemberId,
    pub kind: u8,
    pub body: Vec<u8>,
    signature: Vec<u8>,
}

impl Core {
    pub fn new(
        me: MemberId,
        group: String,
        protocol: ProtocolId,
        identity: Identity,
        directory: SharedDirectory,
    ) -> Self {
        assert!(
            !me.is_empty() && me.len() <= MAX_NAME_BYTES,
            "member name length"
        );
        assert!(
            !group.is_empty() && group.len() <= MAX_NAME_BYTES,
            "group name length"
        );
        Core {
            me,
            group,
            protocol,
            identity,
            directory,
            meter: Meter::default(),
            outbox: VecDeque::new(),
            keys: VecDeque::new(),
            view: None,
            member_set: Default::default(),
            side: Default::default(),
            seen: Default::default(),
            per_sender: Default::default(),
            in_progress: false,
            members_hash: [0; 32],
            epoch: 0,
        }
    }

    /// Validates a view and installs it: drops the old run and narrows the side.
    pub fn install_view(&mut self, view: View) -> Result<(), GkaError> {
        if view.group != self.group {
            return Err(GkaError::InvalidView("view is for another group"));
        }
        if view.members.is_empty() || view.members.len() > MAX_MEMBERS {
            return Err(GkaError::InvalidView("member count out of range"));
        }
        let set =
            MemberSet::of_view(&view.members).ok_or(GkaError::InvalidView("duplicate member"))?;
        if view
            .members
            .iter()
            .any(|m| m.is_empty() || m.len() > MAX_NAME_BYTES)
        {
            return Err(GkaError::InvalidView("member name length"));
        }
        if !set.contains(&self.me) {
            return Err(GkaError::InvalidView("this member is not in the view"));
        }
        // The transitional set, by position in the view. It usually lists its members in the
        // view's order, and is then matched by walking both lists; otherwise by lookups, which
        // also check it.
        let mut in_trans = vec![false; view.members.len()];
        if !in_order(&view.transitional, &view.members, |i| in_trans[i] = true) {
            in_trans.fill(false);
            for m in &view.transitional {
                match set.position(m) {
                    Some(i) => in_trans[i] = true,
                    None => {
                        return Err(GkaError::InvalidView(
                            "transitional set must be a subset of the view containing this member",
                        ))
                    }
                }
            }
        }
        if !set.position(&self.me).is_some_and(|i| in_trans[i]) {
            return Err(GkaError::InvalidView(
                "transitional set must be a subset of the view containing this member",
            ));
        }
        if let Some(old) = &self.view {
            if view.view_id <= old.view_id {
                return Err(GkaError::InvalidView("view id does not increase"));
            }
        }
        // The side shrinks to the members that moved with this one; when none left it, the
        // shared set is kept as it is.
        let trans = |m: &str| set.position(m).is_some_and(|i| in_trans[i]);
        if self.side.is_empty() {
            self.side = Arc::new(MemberSet::single(&self.me));
        } else if self.side.len() <= view.transitional.len()
            && self.side.contains(&self.me)
            && self.side.in_order_within(&view.transitional)
        {
            // Everyone on the side moved with this member (a join): the side stays as it is.
        } else if self.side.is_whole_list()
            && in_order(&view.transitional, self.side.names(), |_| {})
        {
            // The side holds every name of its list (the whole view of a completed run, most
            // often) and the transitional set walks that list in order, so it lies within the
            // side: the new side is the transitional set, taken by position from the new view's
            // set without hashing a name (a leave or partition).
            self.side = Arc::new(set.filtered_by_position(|i| in_trans[i]));
        } else if !self.side.contains(&self.me) || !self.side.all(trans) {
            let mut side = self.side.filtered(trans);
            side.insert(&self.me);
            self.side = Arc::new(side);
        }
        self.outbox.retain(|t| t.view_id == view.view_id);
        self.seen.clear();
        self.per_sender.clear();
        self.member_set = Arc::new(set);
        self.members_hash = members_digest(&view.members);
        self.view = Some(view);
        self.in_progress = true;
        Ok(())
    }

    /// `member`'s position in the current view's agreed order.
    pub fn position(&self, member: &str) -> Option<usize> {
        self.member_set.position(member)
    }

    pub fn view(&self) -> Result<&View, GkaError> {
        self.view.as_ref().ok_or(GkaError::NoView)
    }

    /// True when every member of the view shares our secure state: no merge is needed.
    pub fn single_side(&self) -> bool {
        self.view
            .as_ref()
            .is_some_and(|v| v.members.len() == self.side.len())
    }

    /// Signs and queues a message of the current run.
    pub fn send(
        &mut self,
        dest: Dest,
        order: Order,
        kind: u8,
        body: Vec<u8>,
    ) -> Result<(), GkaError> {
        let view_id = self.view()?.view_id;
        let mut env = Envelope {
            protocol: self.protocol,
            group: self.group.clone(),
            view: view_id,
            sender: self.me.clone(),
            kind,
            body,
            signature: Vec::new(),
        };
        env.signature = self
            .identity
            .sign(&signing_digest(&env.signed_part(), &self.members_hash))
            .map_err(|_| GkaError::Sign)?;
        self.meter.sigs += 1;
        self.outbox.push_back(Transmit {
            dest,
            order,
            payload: env.encode(),
            view_id,
        });
        Ok(())
    }

    /// Decodes a message and checks everything but the signature: protocol, group, run, sender.
    /// Cheap, so that a protocol can drop a message it does not need without verifying it.
    pub fn check(&self, from: &str, bytes: &[u8]) -> Result<(Envelope, usize), GkaError> {
        let view = self.view()?;
        let (env, signed_len) = Envelope::decode(bytes)?;
        if env.protocol != self.protocol {
            return Err(GkaError::WrongProtocol {
                expected: self.protocol,
                got: env.protocol,
            });
        }
        if env.group != self.group {
            return Err(GkaError::ForeignGroup(env.group));
        }
        if env.view < view.view_id {
            return Err(GkaError::Stale {
                got: env.view,
                current: view.view_id,
            });
        }
        if env.view > view.view_id {
            return Err(GkaError::Future {
                got: env.view,
                current: view.view_id,
            });
        }
        if env.sender != from {
            return Err(GkaError::SenderMismatch {
                claimed: env.sender,
                actual: from.to_owned(),
            });
        }
        let at = match self.member_set.position(&env.sender) {
            Some(at) if env.sender != self.me => at as u32,
            _ => return Err(GkaError::NotAMember(env.sender)),
        };
        if self.seen.contains(&seen_id(&env.signature)) {
            return Err(GkaError::Replay);
        }
        if self.per_sender.get(&at).copied().unwrap_or(0) >= MAX_MESSAGES_PER_SENDER {
            return Err(GkaError::TooManyMessages(env.sender));
        }
        Ok((env, signed_len))
    }

    /// Verifies the signature of a checked envelope.
    pub fn verify(
        &mut self,
        bytes: &[u8],
        env: Envelope,
        signed_len: usize,
    ) -> Result<Incoming, GkaError> {
        let digest = signing_digest(&bytes[..signed_len], &self.members_hash);
        let (key, known_good) = {
            let dir = self.directory.read().unwrap_or_else(|p| p.into_inner());
            let key = dir
                .get(&env.sender)
                .cloned()
                .ok_or_else(|| GkaError::UnknownMember(env.sender.clone()))?;
            (
                key,
                dir.verified_before(&env.sender, &digest, &env.signature),
            )
        };
        self.meter.verifs += 1;
        if known_good != Some(true) {
            key.verify(&digest, &env.signature)
                .map_err(|_| GkaError::BadSignature(env.sender.clone()))?;
            if known_good.is_some() {
                self.directory
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .remember_verified(&env.sender, &digest, &env.signature);
            }
        }
        Ok(Incoming {
            sender: env.sender,
            kind: env.kind,
            body: env.body,
            signature: env.signature,
        })
    }

    /// `check` then `verify`.
    pub fn open(&mut self, from: &str, bytes: &[u8]) -> Result<Incoming, GkaError> {
        let (env, len) = self.check(from, bytes)?;
        self.verify(bytes, env, len)
    }

    /// Records that a message was applied, so that a replay of it is refused.
    pub fn applied(&mut self, msg: &Incoming) {
        self.seen.insert(seen_id(&msg.signature));
        if let Some(at) = self.member_set.position(&msg.sender) {
            *self.per_sender.entry(at as u32).or_insert(0) += 1;
        }
    }

    /// Marks the run complete: the whole view becomes this member's side.
    pub fn complete(&mut self, secret: &[u8], key_context: &[u8]) -> Result<(), GkaError> {
        let view = self.view()?;
        let key = derive_group_key(self.protocol, view, &self.members_hash, secret, key_context);
        let secret_fp = GroupKey::from_bytes(Sha256::digest(secret).into()).fingerprint();
        let secure = SecureView {
            group: view.group.clone(),
            view_id: view.view_id,
            epoch: self.epoch + 1,
            members: view.members.clone(),
            key,
            secret_fingerprint: secret_fp,
        };
        self.epoch += 1;
        self.keys.push_back(secure);
        self.side = self.member_set.clone();
        self.in_progress = false;
        Ok(())
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.pop_front()
    }
    pub fn poll_key(&mut self) -> Option<SecureView> {
        self.keys.pop_front()
    }
}

/// The group key of a view: HKDF over the agreed secret, bound to protocol, group, view and
/// members, so that a key can never be mistaken for another view's even if a secret repeated.
/// The members enter as the digest signatures already cover (`members_hash`, of `view`'s
/// members), not name by name: hashing 1,024 names again would cost more than the event's
/// exponentiations.
pub(crate) fn derive_group_key(
    protocol: ProtocolId,
    view: &View,
    members_hash: &[u8; 32],
    secret: &[u8],
    ctx: &[u8],
) -> GroupKey {
    let info = conclave_crypto::kdf::info(&[
        b"conclave group key v2",
        &[protocol as u8],
        view.group.as_bytes(),
        &view_id_bytes(&view.view_id),
        members_hash,
        ctx,
    ]);
    let okm = conclave_crypto::kdf::derive::<32>(b"conclave", secret, &info);
    GroupKey::from_bytes(*okm)
}

/// A view id as the key derivation binds it: ring seq, rep and incarnation, then index, each
/// fixed-width big-endian, so that two ids never give the same bytes. Written out here rather than
/// borrowed from the wire codec, so that a change of wire format can never change a key.
fn view_id_bytes(id: &GroupViewId) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[..8].copy_from_slice(&id.ring.seq.to_be_bytes());
    b[8..12].copy_from_slice(&id.ring.rep.to_be_bytes());
    b[12..16].copy_from_slice(&id.ring.inc.to_be_bytes());
    b[16..].copy_from_slice(&id.index.to_be_bytes());
    b
}

/// Signs an envelope as `identity` for a view of `members` and encodes it: what `Core::send`
/// does, available to tests that play a misbehaving insider.
pub fn seal(
    identity: &Identity,
    mut env: Envelope,
    members: &[MemberId],
) -> Result<Vec<u8>, GkaError> {
    env.signature = identity
        .sign(&signing_digest(
            &env.signed_part(),
            &members_digest(members),
        ))
        .map_err(|_| GkaError::Sign)?;
    Ok(env.encode())
}

/// A view's member list as signatures cover it: SHA-256 over each name, length first, in the
/// view's order.
pub(crate) fn members_digest(members: &[MemberId]) -> [u8; 32] {
    // Gathered first and hashed in one call: a call per name costs more than the hashing.
    let mut bytes = Vec::with_capacity(members.iter().map(|m| 4 + m.len()).sum());
    for m in members {
        bytes.extend_from_slice(&(m.len() as u32).to_be_bytes());
        bytes.extend_from_slice(m.as_bytes());
    }
    let mut h = conclave_crypto::hash::Sha256::new();
    h.update(b"conclave gka members v1");
    h.update(&bytes);
    h.finish()
}

/// What identifies an applied message in [`Core`]'s replay set: its signature's digest.
fn seen_id(signature: &[u8]) -> [u8; 32] {
    Sha256::digest(signature).into()
}

/// What a member signs: a domain-separated SHA-256 of the envelope's signed part (protocol,
/// group, view id, sender, step and body) and of the view's member list, which the envelope does
/// not carry: a message is good only for members that agree on who is in the view. Signing the
/// digest rather than the message keeps a signature's cost independent of the message size
/// (Ed25519 would hash a 70 KB key tree twice with SHA-512).
pub(crate) fn signing_digest(signed_part: &[u8], members_hash: &[u8; 32]) -> [u8; 32] {
    let mut h = conclave_crypto::hash::Sha256::new();
    h.update(b"conclave gka signature v2");
    h.update(signed_part);
    h.update(members_hash);
    h.finish()
}

/// Position of `m` in `list`.
pub(crate) fn index_of(list: &[MemberId], m: &str) -> Option<usize> {
    list.iter().position(|x| x == m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Reason, RingId};
    use conclave_crypto::SigScheme;
    use rand_chacha::rand_core::SeedableRng;

    /// A BD member `me` of group `g`, with an identity drawn from `seed`.
    fn core(me: &str, seed: u64) -> Core {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
        let identity = Identity::generate(SigScheme::Ed25519, &mut rng).unwrap();
        Core::new(
            me.into(),
            "g".into(),
            ProtocolId::Bd,
            identity,
            Default::default(),
        )
    }

    fn view(seq: u64, index: u64) -> View {
        View {
            group: "g".into(),
            view_id: GroupViewId {
                ring: RingId {
                    seq,
                    rep: 1,
                    inc: 1,
                },
                index,
            },
            members: vec!["a".into()].into(),
            reason: Reason::Network,
            transitional: vec!["a".into()],
        }
    }

    /// The daemons restart a group's index on every new ring; a view of a newer ring is newer
    /// whatever its index, and the same view or an older one is refused.
    #[test]
    fn views_are_ordered_by_ring_then_index() {
        let mut core = core("a", 1);
        core.install_view(view(4, 7)).unwrap();
        core.install_view(view(4, 8)).unwrap();
        core.install_view(view(8, 0)).unwrap();
        for stale in [view(8, 0), view(4, 9)] {
            assert_eq!(
                core.install_view(stale),
                Err(GkaError::InvalidView("view id does not increase"))
            );
        }
    }

    /// A message applied once is refused again as a replay, and a sender is cut off after
    /// [`MAX_MESSAGES_PER_SENDER`] messages in a run; a new view starts both afresh.
    #[test]
    fn replays_and_too_many_messages_are_refused_until_the_next_view() {
        let mut core = core("a", 2);
        let two = |index| View {
            members: vec!["a".into(), "b".into()].into(),
            transitional: vec!["a".into(), "b".into()],
            ..view(4, index)
        };
        core.install_view(two(1)).unwrap();
        let message = |core: &Core, n: u32| {
            let mut signature = vec![0; 64];
            signature[..4].copy_from_slice(&n.to_be_bytes());
            Envelope {
                protocol: ProtocolId::Bd,
                group: "g".into(),
                view: core.view().unwrap().view_id,
                sender: "b".into(),
                kind: 1,
                body: vec![],
                signature,
            }
            .encode()
        };
        let apply = |core: &mut Core, n: u32| {
            let (env, _) = core.check("b", &message(core, n))?;
            core.applied(&Incoming {
                sender: env.sender,
                kind: env.kind,
                body: env.body,
                signature: env.signature,
            });
            Ok::<_, GkaError>(())
        };
        apply(&mut core, 0).unwrap();
        assert_eq!(apply(&mut core, 0), Err(GkaError::Replay));
        for n in 1..MAX_MESSAGES_PER_SENDER {
            apply(&mut core, n).unwrap();
        }
        assert_eq!(
            apply(&mut core, MAX_MESSAGES_PER_SENDER),
            Err(GkaError::TooManyMessages("b".into()))
        );
        assert!(matches!(
            core.check("a", &message(&core, MAX_MESSAGES_PER_SENDER + 1)),
            Err(GkaError::SenderMismatch { .. })
        ));
        core.install_view(two(2)).unwrap();
        apply(&mut core, 0).unwrap();
    }

    /// A transitional set in another order than the view's is found by lookups, and one that
    /// names a member outside the view is refused, as when it is in order.
    #[test]
    fn a_transitional_set_in_any_order_is_taken_and_a_foreign_one_refused() {
        let mut core = core("b", 3);
        let with = |index, transitional: &[&str]| View {
            members: vec!["a".into(), "b".into(), "c".into()].into(),
            transitional: transitional.iter().map(|m| m.to_string()).collect(),
            ..view(4, index)
        };
        core.install_view(with(1, &["b"])).unwrap();
        core.install_view(with(2, &["c", "b", "a"])).unwrap();
        assert_eq!(core.side.len(), 1);
        core.install_view(with(3, &["a", "b", "c"])).unwrap();
        assert_eq!(
            core.install_view(with(4, &["b", "x"])),
            Err(GkaError::InvalidView(
                "transitional set must be a subset of the view containing this member"
            ))
        );
    }

    /// Over random views, completed runs and cascades, the side is always
    /// `(side ∩ transitional set) ∪ {me}` (the whole view after a completed run), whichever way
    /// `install_view` finds it: transitional sets in order or not, repeating a name, or naming a
    /// member of the view that was not in the one before.
    #[test]
    fn the_side_is_the_old_side_within_the_transitional_set() {
        use rand_chacha::rand_core::RngCore;
        use std::collections::BTreeSet;
        let universe = ["a", "b", "c", "d", "e", "f"];
        let me = "c";
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let mut core = core(me, 4);
        let mut expected: BTreeSet<String> = BTreeSet::new();
        let mut old: Vec<String> = Vec::new();
        for index in 1..3000u64 {
            let mut bits = rng.next_u32();
            // The view, in name order as the daemons give it, always with this member.
            let members: Vec<String> = universe
                .iter()
                .filter(|m| **m == me || bits & (1 << (m.as_bytes()[0] - b'a')) != 0)
                .map(|m| m.to_string())
                .collect();
            bits >>= 6;
            // Mostly members that were in the view before too; now and then one that was not.
            let mut transitional: Vec<String> = members
                .iter()
                .filter(|m| {
                    let keep = *m == me
                        || (bits & 1 != 0 && (old.contains(m) || bits & 2 != 0 && index % 7 == 0));
                    bits = bits.rotate_right(2);
                    keep
                })
                .cloned()
                .collect();
            match rng.next_u32() % 8 {
                0 => transitional.reverse(),
                1 => {
                    let again = transitional[0].clone();
                    transitional.push(again);
                }
                _ => {}
            }
            let view = View {
                members: members.clone().into(),
                transitional: transitional.clone(),
                ..view(4, index)
            };
            core.install_view(view).unwrap();
            expected = if expected.is_empty() {
                BTreeSet::from([me.to_owned()])
            } else {
                let trans: BTreeSet<String> = transitional.iter().cloned().collect();
                let mut side: BTreeSet<String> = expected.intersection(&trans).cloned().collect();
                side.insert(me.to_owned());
                side
            };
            for m in universe {
                assert_eq!(
                    core.side.contains(m),
                    expected.contains(m),
                    "view {index}: {m} (members {members:?}, transitional {transitional:?})"
                );
            }
            assert_eq!(core.side.len(), expected.len(), "view {index}");
            if rng.next_u32() % 3 != 0 {
                core.complete(b"secret", b"").unwrap();
                expected = members.iter().cloned().collect();
            }
            old = members;
        }
    }

    #[test]
    fn the_key_binds_every_part_of_the_view_id() {
        let changes: [fn(&mut GroupViewId); 4] = [
            |id| id.ring.seq += 1,
            |id| id.ring.rep += 1,
            |id| id.ring.inc += 1,
            |id| id.index += 1,
        ];
        let key = |v: &View| {
            derive_group_key(
                ProtocolId::Bd,
                v,
                &members_digest(&v.members),
                b"secret",
                b"",
            )
            .fingerprint()
        };
        let mut keys = std::collections::BTreeSet::from([key(&view(4, 7)).to_string()]);
        for change in changes {
            let mut v = view(4, 7);
            change(&mut v.view_id);
            assert!(keys.insert(key(&v).to_string()));
        }
    }
}
