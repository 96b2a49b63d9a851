//! STR, the stretched key tree (paper 000 §4.4, Figs 7-8).
//!
//! The chain has members `M_0..M_{n-1}` bottom up. Node 0 is `M_0`'s leaf; node `k >= 1` has
//! key `K_k = H(g^{K_{k-1} r_k})`, computed by `M_k` as `H(BK_{k-1}^{r_k})` and by members below
//! as `H(BK(leaf_k)^{K_{k-1}})`; `BK = g^K`. The root key `K_{n-1}` is the group secret.
//!
//! A view with one side (leave, partition) removes the departed leaves; the sponsor, the member
//! just below the lowest departed one (the bottom member if that was the bottom, the top member
//! for a plain refresh), refreshes its leaf, recomputes the blinded keys up to just below the
//! root and broadcasts them: one round. A view with several sides is a merge: in round 1 each
//! side's sponsor refreshes its leaf and broadcasts its side's chain (members as view indexes, the
//! node blinded keys it computed, and its members' leaf blinded keys unless the side is more than
//! half the view); the largest chain stays at the bottom and the others are stacked on it; in
//! round 2 the top member of the bottom chain computes the new nodes up to just below the root
//! and broadcasts them.
//!
//! A member at position `p` keeps the leaf blinded keys at and above `p` and the node blinded keys
//! from `p - 1` up, which is all it uses; it does not receive the others (see
//! docs/key-agreement.md).
//!
//! Departures: §4.4 has the merging sponsors exchange every blinded key; a side larger than half
//! the view, which can only be the bottom chain, sends none of its leaves' but its sponsor's, so a
//! joiner decodes two group elements, not `2n`. In a side that may be stacked, the sponsor (its
//! top member) does not hold the leaves below it, so the side's bottom member sends them in
//! round 1: one message more than Table I counts. When a single leaf is stacked (a join), round 2
//! has nothing to compute and is skipped: a join takes one round and two messages (Table I counts
//! 2 rounds, 3 messages).
//! Receivers never recompute a blinded key a sponsor sent (§5). Cascades restart from the newest
//! view (see `core`).

use crate::api::{
    Dest, GkaError, KeyAgreement, MemberId, Order, SecureView, SharedDirectory, View,
};
use crate::core::Core;
use crate::members::{MemberSet, Positions};
use crate::ops;
use crate::tree::{Bk, BkData, OwnCopies, TakeShared};
use conclave_crypto::{CryptoRng, Group, Identity, Meter};
use conclave_wire::gka::{ProtocolId, StrMsg};

const NODE_LABEL: &[u8] = b"conclave str node";

/// The chain as one member sees it.
struct Chain<G: Group> {
    /// Shared names: copying a chain copies no string.
    members: Vec<std::sync::Arc<str>>,
    leaf_bk: Vec<Option<Bk<G>>>,
    /// Blinded keys of nodes 1..n (index 0 unused: node 0 is leaf 0).
    node_bk: Vec<Option<Bk<G>>>,
    /// This member's leaf key.
    leaf_key: Option<G::Scalar>,
    /// This member's node keys (only at and above its position).
    node_key: Vec<Option<G::Scalar>>,
}

/// The leaf and node keys are secrets: wiped when the chain goes.
impl<G: Group> Drop for Chain<G> {
    fn drop(&mut self) {
        if let Some(k) = self.leaf_key.as_mut() {
            zeroize::Zeroize::zeroize(k);
        }
        self.node_key
            .iter_mut()
            .flatten()
            .for_each(zeroize::Zeroize::zeroize);
    }
}

impl<G: Group> Chain<G> {
    /// A copy sharing no name or blinded key with anything outside `copies` (see
    /// `KeyAgreement::own_copy`).
    fn own_copy(&self, copies: &mut OwnCopies<G>) -> Self {
        let mut bks = |v: &[Option<Bk<G>>]| -> Vec<Option<Bk<G>>> {
            v.iter().map(|b| b.as_ref().map(|b| copies.bk(b))).collect()
        };
        let (leaf_bk, node_bk) = (bks(&self.leaf_bk), bks(&self.node_bk));
        Chain {
            members: self.members.iter().map(|m| copies.name(m)).collect(),
            leaf_bk,
            node_bk,
            leaf_key: self.leaf_key.clone(),
            node_key: self.node_key.clone(),
        }
    }
}

impl<G: Group> Clone for Chain<G> {
    fn clone(&self) -> Self {
        Chain {
            members: self.members.clone(),
            leaf_bk: self.leaf_bk.clone(),
            node_bk: self.node_bk.clone(),
            leaf_key: self.leaf_key.clone(),
            node_key: self.node_key.clone(),
        }
    }
}

impl<G: Group> Chain<G> {
    fn alone(me: MemberId) -> Self {
        Chain {
            members: vec![std::sync::Arc::from(me.as_str())],
            leaf_bk: vec![None],
            node_bk: vec![None],
            leaf_key: None,
            node_key: vec![None],
        }
    }
    fn len(&self) -> usize {
        self.members.len()
    }
    fn pos(&self, m: &str) -> Option<usize> {
        self.members.iter().position(|x| &**x == m)
    }
    fn bk_of_node(&self, k: usize) -> Option<&Bk<G>> {
        if k == 0 {
            self.leaf_bk[0].as_ref()
        } else {
            self.node_bk[k].as_ref()
        }
    }
    /// Clears node blinded keys and keys from node `from` up (node 0's blinded key is leaf 0's).
    fn invalidate_from(&mut self, from: usize) {
        for k in from.max(1)..self.len() {
            self.node_bk[k] = None;
        }
        for k in from..self.len() {
            self.node_key[k] = None;
        }
    }
    /// The chain of `keep` alone, and the position from which its nodes are invalid (its length
    /// if none).
    fn pruned(&self, keep: &MemberSet) -> (Self, usize) {
        let mut lowest = None;
        let n = keep.len().min(self.len());
        let mut out = Chain::<G> {
            members: Vec::with_capacity(n),
            leaf_bk: Vec::with_capacity(n),
            node_bk: Vec::with_capacity(n),
            leaf_key: self.leaf_key.clone(),
            node_key: Vec::with_capacity(n),
        };
        for i in 0..self.len() {
            if keep.contains(&self.members[i]) {
                out.members.push(self.members[i].clone());
                out.leaf_bk.push(self.leaf_bk[i].clone());
                out.node_bk.push(if lowest.is_none() {
                    self.node_bk[i].clone()
                } else {
                    None
                });
                out.node_key.push(if lowest.is_none() {
                    self.node_key[i].clone()
                } else {
                    None
                });
            } else if lowest.is_none() {
                lowest = Some(out.members.len());
            }
        }
        let from = match lowest {
            Some(l) => {
                out.invalidate_from(l.max(1).min(out.len()));
                l
            }
            None => out.len(),
        };
        (out, from)
    }
}

/// Computes this member's node keys as far as possible; if `sponsor`, also the blinded keys of
/// the nodes it computed, up to just below the root (or the root too, with `top_bk`). Returns the
/// blinded keys computed.
fn advance<G: Group>(
    c: &mut Chain<G>,
    me: &str,
    meter: &mut Meter,
    sponsor: bool,
    top_bk: bool,
) -> Result<Vec<(u32, Bk<G>)>, GkaError> {
    let p = c
        .pos(me)
        .ok_or(GkaError::Misplaced("member missing from its chain"))?;
    let leaf_key = c
        .leaf_key
        .clone()
        .ok_or(GkaError::Misplaced("no leaf key"))?;
    let n = c.len();
    let mut out = Vec::new();
    for k in p..n {
        if c.node_key[k].is_none() {
            let key = if k == 0 {
                leaf_key.clone()
            } else if k == p {
                let Some(b) = c.bk_of_node(k - 1) else { break };
                ops::to_scalar::<G>(NODE_LABEL, &ops::exp::<G>(meter, b.elem(), &leaf_key))
            } else {
                let below = c.node_key[k - 1].clone().expect("computed in order");
                let Some(b) = c.leaf_bk[k].as_ref() else {
                    break;
                };
                ops::to_scalar::<G>(NODE_LABEL, &ops::exp::<G>(meter, b.elem(), &below))
            };
            c.node_key[k] = Some(key);
        }
        if sponsor && k >= 1 && c.node_bk[k].is_none() && (k + 1 < n || top_bk) {
            let key = c.node_key[k].clone().expect("just computed");
            let bk: Bk<G> = BkData::from_elem(ops::exp_g::<G>(meter, &key));
            c.node_bk[k] = Some(bk.clone());
            out.push((k as u32, bk));
        }
    }
    Ok(out)
}

#[derive(Clone)]
pub struct Str<G: Group> {
    core: Core,
    secure: Option<Chain<G>>,
    run: Option<Run<G>>,
}

struct Run<G: Group> {
    chain: Chain<G>,
    collecting: bool,
    got_own: bool,
    foreign: Vec<Chain<G>>,
    /// Merge round 1: the members, by position in the view, that other sides' chains cover.
    covered: Positions,
    /// Merge round 1: leaf blinded keys sent by the bottom members of sides, by sender.
    leaves: std::collections::BTreeMap<MemberId, Vec<(u16, Bk<G>)>>,
    /// Merge round 1: whether this member's side's bottom member sends its leaves.
    own_leaves: bool,
    /// Round 2 sponsor (top of the bottom chain), when a round 2 is needed.
    round2: Option<MemberId>,
    done: bool,
}

/// Whether a side's bottom member sends its side's leaf blinded keys in a merge: when the side
/// may be stacked on another (at most half the view), has more than one member, and its sponsor
/// (who sends its own leaf) is not the bottom member (who holds every leaf's and sends them in
/// its chain).
fn sends_leaves(len: usize, view_len: usize, sponsor_pos: usize) -> bool {
    len >= 2 && 2 * len <= view_len && sponsor_pos != 0
}

impl<G: Group> Str<G> {
    pub fn new(me: &str, group: &str, identity: Identity, directory: SharedDirectory) -> Self {
        Str {
            core: Core::new(
                me.into(),
                group.into(),
                ProtocolId::Str,
                identity,
                directory,
            ),
            secure: None,
            run: None,
        }
    }

    fn refresh(&mut self, c: &mut Chain<G>, rng: &mut dyn CryptoRng) -> (u32, Bk<G>) {
        let p = c.pos(&self.core.me).expect("in own chain");
        let k = G::random_scalar(rng);
        let bk: Bk<G> = BkData::from_elem(ops::exp_g::<G>(&mut self.core.meter, &k));
        c.leaf_key = Some(k);
        c.leaf_bk[p] = Some(bk.clone());
        c.invalidate_from(p);
        (p as u32, bk)
    }

    /// Computes on `chain` and commits it; completes when the root key is known.
    fn settle(&mut self, mut chain: Chain<G>) -> Result<(), GkaError> {
        advance(
            &mut chain,
            &self.core.me,
            &mut self.core.meter,
            false,
            false,
        )?;
        let run = self.run.as_mut().expect("run in progress");
        let root = chain.node_key.last().cloned().flatten();
        run.chain = chain;
        // Complete only once every blinded key this member keeps is known (the leaves' at and
        // above its position, the nodes' from just below it to just below the root): the ones a
        // run recomputes come in the same messages for every member, so all members that move
        // together agree on whether the run completed (see `tgdh`).
        let p = run.chain.pos(&self.core.me).expect("in own chain");
        let len = run.chain.len();
        let all_known = run.chain.leaf_bk[p..].iter().all(Option::is_some)
            && (p.saturating_sub(1).max(1)..len.saturating_sub(1))
                .all(|k| run.chain.node_bk[k].is_some());
        if let (Some(root), false, true) = (root, run.done, all_known) {
            run.done = true;
            let secret = G::encode_scalar(&root);
            self.core.complete(&secret, b"")?;
        }
        Ok(())
    }

    fn send_update(
        &mut self,
        leaf: Option<(u32, Bk<G>)>,
        internal: Vec<(u32, Bk<G>)>,
    ) -> Result<(), GkaError> {
        let msg = StrMsg::Update {
            leaf: leaf.map(|(p, b)| (p, b.bytes().to_vec())),
            internal: internal
                .into_iter()
                .map(|(k, b)| (k, b.bytes().to_vec()))
                .collect(),
        };
        self.core
            .send(Dest::Broadcast, Order::Agreed, 2, msg.encode())
    }

    fn try_merge(&mut self) -> Result<(), GkaError> {
        let view_len = self.core.view()?.members.len();
        let run = self.run.as_ref().expect("run in progress");
        if !run.collecting || !run.got_own || run.covered.len() + self.core.side.len() != view_len {
            return Ok(());
        }
        // Every side's bottom member that sends its leaves must have been heard too.
        let lacking =
            |c: &Chain<G>| c.leaf_bk.iter().any(Option::is_none) && 2 * c.len() <= view_len;
        let bottom_heard = |c: &Chain<G>| run.leaves.contains_key(&*c.members[0]);
        if run.foreign.iter().any(|c| lacking(c) && !bottom_heard(c))
            || (run.own_leaves && !bottom_heard(&run.chain))
        {
            return Ok(());
        }
        // The leaves go into their chains (this member's own too: it may be stacked). Leaves from
        // a member that does not send them are left aside: refusing the message that completes
        // the round for them would stall the run for everyone.
        let mut chains: Vec<Chain<G>> = run.foreign.clone();
        chains.push(run.chain.clone());
        let own = chains.len() - 1;
        for (k, c) in chains.iter_mut().enumerate() {
            let expected = if k == own { run.own_leaves } else { lacking(c) };
            let Some(leaves) = run.leaves.get(&*c.members[0]).filter(|_| expected) else {
                continue;
            };
            for (index, bk) in leaves {
                let name = &self.core.view()?.members[*index as usize];
                let pos = c.pos(name).ok_or(GkaError::Misplaced(
                    "leaves of members outside the sender's side",
                ))?;
                if c.leaf_bk[pos]
                    .as_ref()
                    .is_some_and(|b| b.bytes() != bk.bytes())
                {
                    return Err(GkaError::Misplaced("a leaf's blinded key contradicted"));
                }
                c.leaf_bk[pos] = Some(bk.clone());
            }
        }

        chains.sort_by(|a, b| {
            b.len()
                .cmp(&a.len())
                .then_with(|| a.members[0].cmp(&b.members[0]))
        });
        let me = self.core.me.clone();
        let mut it = chains.into_iter();
        let mut merged = it.next().expect("at least this member's chain");
        let base_len = merged.len();
        let mine_is_base = merged.pos(&me).is_some();
        if !mine_is_base {
            merged.leaf_key = None;
            merged.node_key.iter_mut().for_each(|k| *k = None);
        }
        for c in it {
            if c.leaf_bk.iter().any(Option::is_none) {
                return Err(GkaError::Misplaced(
                    "a chain stacked on another without its leaves' blinded keys",
                ));
            }
            let is_mine = c.pos(&me).is_some();
            for i in 0..c.len() {
                merged.members.push(c.members[i].clone());
                merged.leaf_bk.push(c.leaf_bk[i].clone());
                merged.node_bk.push(None);
                merged.node_key.push(None);
            }
            if is_mine {
                merged.leaf_key = c.leaf_key.clone();
            }
        }
        let round2 =
            (merged.len() - base_len >= 2).then(|| merged.members[base_len - 1].to_string());
        if round2.as_deref() == Some(me.as_str()) {
            let bks = advance(&mut merged, &me, &mut self.core.meter, true, false)?;
            let bks: Vec<(u32, Bk<G>)> = bks
                .into_iter()
                .filter(|(k, _)| *k as usize >= base_len)
                .collect();
            self.send_update(None, bks)?;
        }
        self.settle(merged)?;
        // The run leaves its first round only once the merged chain is computed on.
        let run = self.run.as_mut().expect("run in progress");
        run.collecting = false;
        run.foreign.clear();
        run.leaves.clear();
        run.round2 = round2;
        Ok(())
    }
}

impl<G: Group> Clone for Run<G> {
    fn clone(&self) -> Self {
        Run {
            chain: self.chain.clone(),
            collecting: self.collecting,
            got_own: self.got_own,
            foreign: self.foreign.clone(),
            covered: self.covered.clone(),
            leaves: self.leaves.clone(),
            own_leaves: self.own_leaves,
            round2: self.round2.clone(),
            done: self.done,
        }
    }
}

impl<G: Group> KeyAgreement for Str<G> {
    fn protocol(&self) -> ProtocolId {
        ProtocolId::Str
    }
    forward_to_core!();

    fn own_copy(&self) -> Box<dyn KeyAgreement> {
        let mut copies = OwnCopies::default();
        let mut c = self.clone();
        c.secure = self.secure.as_ref().map(|s| s.own_copy(&mut copies));
        if let Some(r) = c.run.as_mut() {
            r.chain = r.chain.own_copy(&mut copies);
            r.foreign = r.foreign.iter().map(|f| f.own_copy(&mut copies)).collect();
            for bks in r.leaves.values_mut() {
                for (_, bk) in bks.iter_mut() {
                    *bk = copies.bk(bk);
                }
            }
        }
        Box::new(c)
    }

    fn handle_view(&mut self, rng: &mut dyn CryptoRng, view: View) -> Result<(), GkaError> {
        self.core.install_view(view)?;
        if let Some(run) = self.run.take() {
            if run.done {
                self.secure = Some(run.chain);
            }
        }
        let me = self.core.me.clone();
        let side = self.core.side.clone();
        // The secure chain's members are the side it completed with, and a side only shrinks:
        // one of the same size is that side, and nothing need be pruned.
        let (mut chain, invalid_from) = match &self.secure {
            Some(c) if c.len() == side.len() => {
                debug_assert!(c.members.iter().all(|m| side.contains(m)));
                (c.clone(), c.len())
            }
            Some(c) => c.pruned(&side),
            None => (Chain::alone(me.clone()), 1),
        };
        if chain.len() != side.len() {
            return Err(GkaError::InvalidView(
                "side is not covered by the secure chain",
            ));
        }
        let n = self.core.view()?.members.len();
        let fresh_run = |chain| Run {
            chain,
            collecting: false,
            got_own: true,
            foreign: vec![],
            covered: Positions::default(),
            leaves: Default::default(),
            own_leaves: false,
            round2: None,
            done: false,
        };
        if n == 1 {
            let k = G::random_scalar(rng);
            let secret = G::encode_scalar(&k);
            let mut chain = Chain::alone(me);
            chain.leaf_key = Some(k.clone());
            chain.node_key[0] = Some(k);
            self.run = Some(Run {
                done: true,
                ..fresh_run(chain)
            });
            return self.core.complete(&secret, b"");
        }
        // The sponsor: just below the lowest removed member, or the top member.
        let sponsor_pos = if invalid_from < chain.len() {
            invalid_from.saturating_sub(1)
        } else {
            chain.len() - 1
        };
        let sponsor = chain.members[sponsor_pos].to_string();
        if self.core.single_side() {
            self.run = Some(fresh_run(Chain::alone(me.clone())));
            if sponsor == me {
                let leaf = self.refresh(&mut chain, rng);
                let bks = advance(&mut chain, &me, &mut self.core.meter, true, false)?;
                self.send_update(Some(leaf), bks)?;
            } else {
                chain.leaf_bk[sponsor_pos] = None;
                chain.invalidate_from(sponsor_pos);
            }
            return self.settle(chain);
        }
        // Merge, round 1: each side's sponsor refreshes its leaf and sends its side's chain, with
        // the node blinded keys it computed. The largest side goes at the bottom, and its leaves'
        // blinded keys are of use to nobody outside it; those of a chain stacked on it are needed
        // by everyone under them. A side larger than half the view can only be the largest; in
        // any other, the bottom member, who holds every leaf's blinded key, sends them (in its
        // chain if it is the sponsor, in a message of its own if not).
        let members = self.core.member_set.clone();
        let index = |m: &str| {
            members
                .position(m)
                .map(|i| i as u16)
                .ok_or(GkaError::Misplaced("chain member outside the view"))
        };
        let own_leaves = sends_leaves(chain.len(), n, sponsor_pos);
        if own_leaves && *chain.members[0] == *me {
            let leaves = (0..chain.len())
                .filter(|&i| i != sponsor_pos)
                .map(|i| {
                    let bk = chain.leaf_bk[i].as_ref().ok_or(GkaError::Misplaced(
                        "the bottom member lacks a leaf of its chain",
                    ))?;
                    Ok((index(&chain.members[i])?, bk.bytes().to_vec()))
                })
                .collect::<Result<_, GkaError>>()?;
            let msg = StrMsg::Leaves { leaves };
            self.core
                .send(Dest::Broadcast, Order::Agreed, msg.kind(), msg.encode())?;
        }
        if sponsor == me {
            let (sp, leaf) = self.refresh(&mut chain, rng);
            let nodes = advance(&mut chain, &me, &mut self.core.meter, true, true)?;
            let all = 2 * chain.len() <= n && sp == 0;
            let leaves = chain
                .members
                .iter()
                .zip(&chain.leaf_bk)
                .enumerate()
                .map(|(i, (m, b))| {
                    let bk = if i == sp as usize {
                        Some(leaf.bytes().to_vec())
                    } else if all {
                        b.as_ref().map(|b| b.bytes().to_vec())
                    } else {
                        None
                    };
                    index(m).map(|i| (i, bk))
                })
                .collect::<Result<_, _>>()?;
            let msg = StrMsg::Chain {
                leaves,
                nodes: nodes
                    .into_iter()
                    .map(|(k, b)| (k, b.bytes().to_vec()))
                    .collect(),
            };
            self.core
                .send(Dest::Broadcast, Order::Agreed, 1, msg.encode())?;
        } else {
            chain.leaf_bk[sponsor_pos] = None;
            chain.invalidate_from(sponsor_pos);
        }
        // This member waits for its side's bottom member's leaves, unless it sent them.
        let own_leaves = own_leaves && *chain.members[0] != *me;
        self.run = Some(Run {
            chain,
            collecting: true,
            got_own: sponsor == me,
            own_leaves,
            ..fresh_run(Chain::alone(me.clone()))
        });
        Ok(())
    }

    fn handle_message(
        &mut self,
        _rng: &mut dyn CryptoRng,
        from: &str,
        bytes: &[u8],
    ) -> Result<(), GkaError> {
        let inc = self.core.open(from, bytes)?;
        let msg = StrMsg::decode(inc.kind, &inc.body)?;
        let me = self.core.me.clone();
        let side = self.core.side.clone();
        if self.run.is_none() {
            return Err(GkaError::Misplaced("no STR run in progress"));
        }
        self.apply(msg, &inc.sender, &me, &side)?;
        self.core.applied(&inc);
        Ok(())
    }

    fn poll_key(&mut self) -> Option<SecureView> {
        self.core.poll_key()
    }
    fn tree_height(&self) -> Option<usize> {
        self.run.as_ref().map(|r| r.chain.len() - 1)
    }
}

impl<G: Group> Str<G> {
    fn apply(
        &mut self,
        msg: StrMsg,
        sender: &str,
        me: &str,
        side: &MemberSet,
    ) -> Result<(), GkaError> {
        let run = self.run.as_ref().expect("checked by caller");
        let size_ok = |b: &[u8]| b.len() == G::ELEMENT_BYTES;
        match msg {
            StrMsg::Chain { leaves, nodes } => {
                if !run.collecting {
                    return Err(GkaError::Misplaced(
                        "chain outside the first round of a merge",
                    ));
                }
                let len = leaves.len();
                let view_members = self.core.view()?.members.clone();
                // Members as view positions, each at most once: checked without a name copied.
                let mut listed = vec![false; view_members.len()];
                for (i, _) in &leaves {
                    let seen = listed
                        .get_mut(*i as usize)
                        .ok_or(GkaError::Misplaced("chain member outside the view"))?;
                    if std::mem::replace(seen, true) {
                        return Err(GkaError::Misplaced("member appears twice in the chain"));
                    }
                }
                if len == 0 {
                    return Err(GkaError::Misplaced("member appears twice in the chain"));
                }
                let name = |k: usize| view_members[leaves[k].0 as usize].as_str();
                // The node blinded keys the sponsor computed: increasing positions up to the top
                // (whose blinded key is the bottom leaf's in a chain of one).
                let positions_ok = nodes.windows(2).all(|w| w[0].0 < w[1].0)
                    && match nodes.last() {
                        None => len == 1 && leaves[0].1.is_some(),
                        Some((top, _)) => *top as usize == len - 1 && nodes[0].0 >= 1,
                    };
                if !positions_ok
                    || leaves
                        .iter()
                        .filter_map(|(_, b)| b.as_ref())
                        .any(|b| !size_ok(b))
                    || nodes.iter().any(|(_, b)| !size_ok(b))
                {
                    return Err(GkaError::Misplaced("malformed chain"));
                }
                if side.contains(sender) {
                    if run.got_own
                        || len != run.chain.len()
                        || !(0..len).all(|k| *run.chain.members[k] == *name(k))
                    {
                        return Err(GkaError::Misplaced(
                            "unexpected chain from this member's own side",
                        ));
                    }
                    // What the sponsor sent replaces what this member held; keys below the sponsor
                    // stay valid (those above were cleared with the view). A value this member
                    // holds already at that place was decoded when it came; any other is decoded
                    // now, as every member of every side decodes it, so that all accept or refuse
                    // the chain alike.
                    let mut mine = run.chain.clone();
                    let meter = &mut self.core.meter;
                    let mut take = |slot: &mut Option<Bk<G>>, b: &[u8]| {
                        if slot.as_ref().map(|x| x.bytes()) != Some(b) {
                            *slot = Some(BkData::checked(meter, b)?);
                        }
                        Ok::<_, GkaError>(())
                    };
                    for (k, (_, b)) in leaves.iter().enumerate() {
                        if let Some(b) = b {
                            take(&mut mine.leaf_bk[k], b)?;
                        }
                    }
                    for (k, b) in &nodes {
                        take(&mut mine.node_bk[*k as usize], b)?;
                    }
                    let run = self.run.as_mut().expect("checked");
                    let old = std::mem::replace(&mut run.chain, mine);
                    run.got_own = true;
                    if let Err(e) = self.try_merge() {
                        // Leave the run as it was before this message.
                        let run = self.run.as_mut().expect("checked");
                        run.chain = old;
                        run.got_own = false;
                        return Err(e);
                    }
                    Ok(())
                } else {
                    // Each leaf's view position was checked above, once: the names are the
                    // view's, and the chain's positions are its members.
                    let at: Vec<usize> = leaves.iter().map(|(i, _)| *i as usize).collect();
                    if at
                        .iter()
                        .any(|&i| side.contains(&view_members[i]) || run.covered.contains(i))
                    {
                        return Err(GkaError::Misplaced(
                            "chain names members outside the view or twice",
                        ));
                    }
                    let meter = &mut self.core.meter;
                    let leaf_bk: Vec<Option<Bk<G>>> = leaves
                        .iter()
                        .map(|(_, b)| b.as_ref().map(|b| BkData::checked(meter, b)).transpose())
                        .collect::<Result<_, _>>()?;
                    let mut node_bk: Vec<Option<Bk<G>>> = vec![None; len];
                    for (k, b) in &nodes {
                        node_bk[*k as usize] = Some(BkData::checked(meter, b)?);
                    }
                    let c = Chain::<G> {
                        members: (0..len).map(|k| std::sync::Arc::from(name(k))).collect(),
                        leaf_bk,
                        node_bk,
                        leaf_key: None,
                        node_key: vec![None; len],
                    };
                    let run = self.run.as_mut().expect("checked");
                    run.covered.set(&at, true, view_members.len());
                    run.foreign.push(c);
                    if let Err(e) = self.try_merge() {
                        let run = self.run.as_mut().expect("checked");
                        run.foreign.pop();
                        run.covered.set(&at, false, view_members.len());
                        return Err(e);
                    }
                    Ok(())
                }
            }
            StrMsg::Leaves { leaves } => {
                if !run.collecting {
                    return Err(GkaError::Misplaced(
                        "leaves outside the first round of a merge",
                    ));
                }
                if run.leaves.contains_key(sender) || leaves.is_empty() {
                    return Err(GkaError::Misplaced("unexpected leaves"));
                }
                let n = self.core.view()?.members.len();
                if leaves.iter().any(|(i, b)| *i as usize >= n || !size_ok(b)) || leaves.len() >= n
                {
                    return Err(GkaError::Misplaced("malformed leaves"));
                }
                // Decoded now, as a chain's (see above).
                let known: std::collections::HashMap<&[u8], &Bk<G>> = run
                    .chain
                    .leaf_bk
                    .iter()
                    .flatten()
                    .map(|b| (b.bytes(), b))
                    .collect();
                let mut decoded = Vec::with_capacity(leaves.len());
                for (i, b) in &leaves {
                    decoded.push((
                        *i,
                        match known.get(b.as_slice()) {
                            Some(k) => (*k).clone(),
                            None => BkData::checked(&mut self.core.meter, b)?,
                        },
                    ));
                }
                let run = self.run.as_mut().expect("checked");
                run.leaves.insert(sender.to_owned(), decoded);
                if let Err(e) = self.try_merge() {
                    let run = self.run.as_mut().expect("checked");
                    run.leaves.remove(sender);
                    return Err(e);
                }
                Ok(())
            }
            StrMsg::Update { leaf, internal } => {
                if run.collecting {
                    return Err(GkaError::Misplaced("update before the chains were merged"));
                }
                let mut c = run.chain.clone();
                let sp = c
                    .pos(sender)
                    .ok_or(GkaError::Misplaced("sender not in the chain"))?;
                let mp = c.pos(me).expect("in own chain");
                let mut lowest_changed = c.len();
                if let Some((pos, b)) = &leaf {
                    if *pos as usize != sp || !size_ok(b) {
                        return Err(GkaError::Misplaced(
                            "leaf update not for the sender's own leaf",
                        ));
                    }
                    if c.leaf_bk[sp].as_ref().map(|x| x.bytes()) != Some(b.as_slice()) {
                        c.leaf_bk[sp] = Some(BkData::checked(&mut self.core.meter, b)?);
                        lowest_changed = lowest_changed.min(sp.max(1));
                    }
                }
                for (k, b) in &internal {
                    let k = *k as usize;
                    if k == 0 || k >= c.len() || k < sp || !size_ok(b) {
                        return Err(GkaError::Misplaced(
                            "node update the sender cannot have computed",
                        ));
                    }
                    if c.node_bk[k].as_ref().map(|x| x.bytes()) != Some(b.as_slice()) {
                        c.node_bk[k] = Some(BkData::checked(&mut self.core.meter, b)?);
                        lowest_changed = lowest_changed.min(k + 1);
                    }
                }
                for k in lowest_changed.max(mp)..c.len() {
                    if k != 0 {
                        c.node_key[k] = None;
                    }
                }
                self.settle(c)
            }
        }
    }
}
