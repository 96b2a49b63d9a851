//! Tree-based Group Diffie-Hellman (paper 000 §4.3, Figs 5-6).
//!
//! Every member keeps the key tree (`tree`): all blinded keys, and the keys on its own path. A
//! node's key is `K = H(BK_sibling^{K_child})` (the DH value hashed to an exponent, where the
//! paper uses the DH value mod p directly) and its blinded key `BK = g^K`; the root key is the
//! group secret.
//!
//! A view with one side (leave, partition) prunes the departed leaves; the shallowest rightmost
//! sponsor refreshes its leaf key. A view with several sides is a merge: each side's sponsor (its
//! rightmost member) broadcasts its side's tree, adding the blinded keys it can (its leaf's if it
//! is new, its side's old root's); every member then merges the trees, largest first, each
//! inserted at the shallowest rightmost node that does not increase the height, and the rightmost
//! member of the last inserted tree refreshes its leaf (unless that leaf was drawn in this run),
//! so that every run has a fresh contribution. In both cases members then compute up their paths
//! as far as they can; a member broadcasts the blinded keys it computed when it is the rightmost
//! member under the lowest node it newly computed, which makes exactly one sponsor per computable
//! subtree and repeats until all members hold the root key (one round for a leave, two for a join
//! or merge, up to `h` for a partition). A run completes when every blinded key below the root is
//! known, which all members observe alike (see `core`).
//!
//! Departures: §4.3 has every merging side's sponsor refresh its leaf and recompute its path in
//! round 1; we refresh one leaf per merge, after merging, which needs the same rounds and
//! messages and far fewer exponentiations. Receivers never recompute a blinded key a sponsor sent
//! (§5's optimization), and a member computes blinded keys only where it is the sponsor. Table
//! II's TGDH row counts `3h/2` exponentiations for a join, merge and leave, the cost for a sponsor
//! at mid depth; our critical path is about `3d` for a sponsor at depth `d`, so it is bounded by
//! `3h` (plus one for a leave), with `h` the height after the event. Cascades restart from the
//! newest view (see `core`).

use crate::api::{
    Dest, GkaError, KeyAgreement, MemberId, Order, SecureView, SharedDirectory, View,
};
use crate::core::Core;
use crate::ops;
use crate::tree::{Bk, BkData, Node};
use conclave_crypto::{CryptoRng, Group, Identity};
use conclave_wire::gka::{NodePath, ProtocolId, TgdhMsg};
use std::collections::BTreeSet;

const NODE_LABEL: &[u8] = b"conclave tgdh node";

#[derive(Clone)]
pub struct Tgdh<G: Group> {
    core: Core,
    /// The tree of the last completed run.
    secure: Option<Node<G>>,
    run: Option<Run<G>>,
}

struct Run<G: Group> {
    tree: Node<G>,
    collecting: bool,
    /// Merge round 1: whether this member has its own side's tree from its sponsor.
    got_own: bool,
    foreign: Vec<Node<G>>,
    covered: BTreeSet<MemberId>,
    done: bool,
    /// Whether this member's leaf key was drawn in this run.
    fresh_leaf: bool,
}

/// Gives `me` a fresh leaf key; returns the leaf's path and new blinded key.
fn refresh<G: Group>(
    tree: &mut Node<G>,
    me: &str,
    rng: &mut dyn CryptoRng,
    meter: &mut conclave_crypto::Meter,
) -> (NodePath, Bk<G>) {
    let path = tree.find(me).expect("member is in its own tree");
    let k = G::random_scalar(rng);
    let bk: Bk<G> = BkData::from_elem(ops::exp_g::<G>(meter, &k));
    let leaf = tree.at_mut(&path).expect("found above");
    leaf.set_key(Some(k));
    leaf.set_bk(Some(bk.clone()));
    tree.invalidate_above(&path);
    (path, bk)
}

/// Blinded keys by node path, as a sponsor broadcasts them.
type PathBks<G> = Vec<(NodePath, Bk<G>)>;

/// Computes keys up `me`'s path as far as the known blinded keys allow. Returns the blinded keys
/// this member must broadcast (those it newly computed, when it is the rightmost member under
/// the lowest of them), and whether the root key is known.
fn advance<G: Group>(
    tree: &mut Node<G>,
    me: &str,
    meter: &mut conclave_crypto::Meter,
    top_bk: bool,
) -> Result<(PathBks<G>, bool), GkaError> {
    let path = tree
        .find(me)
        .ok_or(GkaError::Misplaced("member missing from its tree"))?;
    let mut computed: Vec<usize> = Vec::new();
    for d in (0..path.len()).rev() {
        if let Some(n) = tree.at(&path[..d]) {
            if n.key().is_some() {
                // A key known from an earlier run whose blinded key was never needed (an old root).
                if n.bk().is_none() && (d > 0 || top_bk) {
                    computed.push(d);
                }
                continue;
            }
        }
        let Some(child_key) = tree.at(&path[..d + 1]).and_then(|n| n.key()).cloned() else {
            break;
        };
        let mut sib = path[..d].to_vec();
        sib.push(!path[d]);
        let Some(sib_bk) = tree.at(&sib).and_then(|n| n.bk()).cloned() else {
            break;
        };
        let sib_el = sib_bk.elem().clone();
        let key = ops::to_scalar::<G>(NODE_LABEL, &ops::exp::<G>(meter, &sib_el, &child_key));
        let node = tree.at_mut(&path[..d]).expect("ancestor exists");
        let needs_bk = node.bk().is_none() && (d > 0 || top_bk);
        node.set_key(Some(key));
        if needs_bk {
            computed.push(d);
        }
    }
    let mut out = Vec::new();
    if let Some(&lowest) = computed.first() {
        if tree
            .at(&path[..lowest])
            .map(|n| n.rightmost() == me)
            .unwrap_or(false)
        {
            for d in computed {
                let node = tree.at_mut(&path[..d]).expect("ancestor exists");
                let key = node.key().cloned().expect("just computed");
                let bk: Bk<G> = BkData::from_elem(ops::exp_g::<G>(meter, &key));
                node.set_bk(Some(bk.clone()));
                out.push((path[..d].to_vec(), bk));
            }
        }
    }
    Ok((out, tree.key().is_some()))
}

impl<G: Group> Tgdh<G> {
    pub fn new(me: &str, group: &str, identity: Identity, directory: SharedDirectory) -> Self {
        Tgdh {
            core: Core::new(
                me.into(),
                group.into(),
                ProtocolId::Tgdh,
                identity,
                directory,
            ),
            secure: None,
            run: None,
        }
    }

    /// Computes on `tree`, sends what this member is sponsor for, and commits it as the run's tree.
    fn compute(&mut self, mut tree: Node<G>, mut extra: PathBks<G>) -> Result<(), GkaError> {
        let (bks, root) = advance(&mut tree, &self.core.me, &mut self.core.meter, false)?;
        extra.extend(bks);
        if !extra.is_empty() {
            let bks = extra
                .into_iter()
                .map(|(p, b)| (p, b.bytes().to_vec()))
                .collect();
            self.core.send(
                Dest::Broadcast,
                Order::Agreed,
                2,
                TgdhMsg::Update { bks }.encode(),
            )?;
        }
        let run = self.run.as_mut().expect("run in progress");
        run.tree = tree;
        // Complete only once every blinded key below the root is known: that depends only on the
        // broadcasts delivered, which members that move together share, so they all agree on
        // whether this run completed (a member could often compute the root earlier).
        if root && !run.done && run.tree.all_bks_known() {
            run.done = true;
            let secret = G::encode_scalar(run.tree.key().expect("root known"));
            self.core.complete(&secret, b"")?;
        }
        Ok(())
    }

    fn try_merge(&mut self, rng: &mut dyn CryptoRng) -> Result<(), GkaError> {
        let view_len = self.core.view()?.members.len();
        let run = self.run.as_ref().expect("run in progress");
        if !run.collecting || !run.got_own || run.covered.len() + self.core.side.len() != view_len {
            return Ok(());
        }
        let mut trees: Vec<Node<G>> = run.foreign.clone();
        trees.push(run.tree.clone());
        trees.sort_by(|a, b| {
            b.size()
                .cmp(&a.size())
                .then_with(|| a.leftmost().cmp(b.leftmost()))
        });
        let mut it = trees.into_iter();
        let mut merged = it.next().expect("at least this member's tree");
        let mut refresher = None;
        for t in it {
            refresher = Some(t.rightmost().to_owned());
            merged.insert(t);
        }
        // Node paths travel as at most MAX_PATH_BITS bits; a merge of hostile deep trees must not
        // produce a tree this member could not describe.
        if merged.height() >= conclave_wire::gka::MAX_PATH_BITS {
            return Err(GkaError::Misplaced("merged key tree too deep"));
        }
        // One fresh contribution per run keeps keys from repeating: the rightmost member of the
        // last inserted tree refreshes its leaf, unless that leaf is new in this run anyway.
        let me = self.core.me.clone();
        let fresh = self.run.as_ref().expect("run in progress").fresh_leaf;
        let mut extra = Vec::new();
        if let Some(r) = refresher {
            let rpath = merged.find(&r).expect("inserted above");
            merged.invalidate_above(&rpath);
            if r == me {
                if fresh {
                    let bk = merged
                        .at(&rpath)
                        .and_then(|n| n.bk().cloned())
                        .expect("a sponsor's leaf has a blinded key");
                    extra.push((rpath, bk));
                } else {
                    extra.push(refresh::<G>(&mut merged, &me, rng, &mut self.core.meter));
                }
            } else {
                merged.at_mut(&rpath).expect("found").set_bk(None);
            }
        }
        // The run leaves its first round only once the merged tree is computed on.
        self.compute(merged, extra)?;
        let run = self.run.as_mut().expect("run in progress");
        run.collecting = false;
        run.foreign.clear();
        Ok(())
    }
}

impl<G: Group> Clone for Run<G> {
    fn clone(&self) -> Self {
        Run {
            tree: self.tree.clone(),
            collecting: self.collecting,
            got_own: self.got_own,
            foreign: self.foreign.clone(),
            covered: self.covered.clone(),
            done: self.done,
            fresh_leaf: self.fresh_leaf,
        }
    }
}

impl<G: Group> KeyAgreement for Tgdh<G> {
    fn protocol(&self) -> ProtocolId {
        ProtocolId::Tgdh
    }
    forward_to_core!();

    fn handle_view(&mut self, rng: &mut dyn CryptoRng, view: View) -> Result<(), GkaError> {
        self.core.install_view(view)?;
        if let Some(run) = self.run.take() {
            if run.done {
                self.secure = Some(run.tree);
            }
        }
        let me = self.core.me.clone();
        let side = self.core.side.clone();
        let mut tree = self
            .secure
            .clone()
            .and_then(|t| t.prune(&side))
            .unwrap_or_else(|| Node::leaf(&me));
        if tree.size() != side.len() {
            return Err(GkaError::InvalidView(
                "side is not covered by the secure tree",
            ));
        }
        let n = self.core.view()?.members.len();
        if n == 1 {
            let k = G::random_scalar(rng);
            let secret = G::encode_scalar(&k);
            let tree = Node::Leaf {
                member: std::sync::Arc::from(me.as_str()),
                bk: None,
                key: Some(k),
            };
            self.run = Some(Run {
                tree,
                collecting: false,
                got_own: true,
                foreign: vec![],
                covered: BTreeSet::new(),
                done: true,
                fresh_leaf: true,
            });
            return self.core.complete(&secret, b"");
        }
        if self.core.single_side() {
            // Leave or partition: the shallowest rightmost sponsor refreshes its leaf.
            let frontier = tree.frontier();
            let refresher = match frontier
                .iter()
                .min_by(|a, b| a.len().cmp(&b.len()).then_with(|| b.cmp(a)))
            {
                Some(p) => tree.at(p).expect("frontier path").rightmost().to_owned(),
                None => tree.rightmost().to_owned(),
            };
            let rpath = tree.find(&refresher).expect("refresher is in the tree");
            let leaf = tree.at_mut(&rpath).expect("found");
            leaf.set_bk(None);
            leaf.set_key(None);
            tree.invalidate_above(&rpath);
            let mut extra = Vec::new();
            if refresher == me {
                extra.push(refresh::<G>(&mut tree, &me, rng, &mut self.core.meter));
            }
            self.run = Some(Run {
                tree: Node::leaf(&me),
                collecting: false,
                got_own: true,
                foreign: vec![],
                covered: BTreeSet::new(),
                done: false,
                fresh_leaf: false,
            });
            return self.compute(tree, extra);
        }
        // Merge, round 1: each side's rightmost member broadcasts the side's tree, with the blinded
        // keys it can add (a new member's leaf, the side's old root).
        let sponsor = tree.rightmost().to_owned();
        let mut fresh_leaf = false;
        if tree
            .find(&me)
            .and_then(|p| tree.at(&p).and_then(|n| n.key().cloned()))
            .is_none()
        {
            let p = tree.find(&me).expect("in own tree");
            tree.at_mut(&p)
                .expect("found")
                .set_key(Some(G::random_scalar(rng)));
            fresh_leaf = true;
        }
        if sponsor == me {
            advance(&mut tree, &me, &mut self.core.meter, true)?;
            if let Some(p) = tree.find(&me) {
                let leaf = tree.at_mut(&p).expect("found");
                if leaf.bk().is_none() {
                    let k = leaf.key().cloned().expect("leaf key set above");
                    leaf.set_bk(Some(BkData::from_elem(ops::exp_g::<G>(
                        &mut self.core.meter,
                        &k,
                    ))));
                }
            }
            self.core.send(
                Dest::Broadcast,
                Order::Agreed,
                1,
                TgdhMsg::Tree {
                    nodes: tree.to_wire(),
                }
                .encode(),
            )?;
        }
        self.run = Some(Run {
            tree,
            collecting: true,
            got_own: sponsor == me,
            foreign: vec![],
            covered: BTreeSet::new(),
            done: false,
            fresh_leaf,
        });
        Ok(())
    }

    fn handle_message(
        &mut self,
        rng: &mut dyn CryptoRng,
        from: &str,
        bytes: &[u8],
    ) -> Result<(), GkaError> {
        let inc = self.core.open(from, bytes)?;
        let msg = TgdhMsg::decode(inc.kind, &inc.body)?;
        self.apply(msg, &inc.sender, rng)?;
        self.core.applied(&inc);
        Ok(())
    }

    fn poll_key(&mut self) -> Option<SecureView> {
        self.core.poll_key()
    }
    fn tree_height(&self) -> Option<usize> {
        self.run
            .as_ref()
            .map(|r| r.tree.height())
            .or_else(|| self.secure.as_ref().map(|t| t.height()))
    }
}

impl<G: Group> Tgdh<G> {
    fn apply(
        &mut self,
        msg: TgdhMsg,
        sender: &str,
        rng: &mut dyn CryptoRng,
    ) -> Result<(), GkaError> {
        let me = self.core.me.clone();
        let members = self.core.member_set.clone();
        let side = self.core.side.clone();
        let run = self
            .run
            .as_ref()
            .ok_or(GkaError::Misplaced("no TGDH run in progress"))?;
        match msg {
            TgdhMsg::Tree { nodes } => {
                if !run.collecting {
                    return Err(GkaError::Misplaced(
                        "tree outside the first round of a merge",
                    ));
                }
                let t = Node::<G>::from_wire(&mut self.core.meter, &nodes, Some(&run.tree))
                    .map_err(GkaError::Misplaced)?;
                let leaves = t.leaves();
                if t.rightmost() != sender {
                    return Err(GkaError::Misplaced("tree not sent by its sponsor"));
                }
                if side.contains(sender) {
                    if run.got_own || !t.same_shape(&run.tree) {
                        return Err(GkaError::Misplaced(
                            "unexpected tree from this member's own side",
                        ));
                    }
                    // Take the sponsor's blinded keys, keep this member's keys below the sponsor's path.
                    let mut mine = t;
                    let my_path = run.tree.find(&me).expect("in own tree");
                    for d in 0..=my_path.len() {
                        if let Some(k) = run.tree.at(&my_path[..d]).and_then(|n| n.key()).cloned() {
                            mine.at_mut(&my_path[..d])
                                .expect("same shape")
                                .set_key(Some(k));
                        }
                    }
                    let run = self.run.as_mut().expect("checked");
                    let old = std::mem::replace(&mut run.tree, mine);
                    run.got_own = true;
                    if let Err(e) = self.try_merge(rng) {
                        // Leave the run as it was before this message.
                        let run = self.run.as_mut().expect("checked");
                        run.tree = old;
                        run.got_own = false;
                        return Err(e);
                    }
                    Ok(())
                } else {
                    if leaves.iter().any(|m| {
                        !members.contains(m) || side.contains(m) || run.covered.contains(m)
                    }) {
                        return Err(GkaError::Misplaced(
                            "tree names members outside the view or twice",
                        ));
                    }
                    let run = self.run.as_mut().expect("checked");
                    run.covered.extend(leaves.iter().cloned());
                    run.foreign.push(t);
                    if let Err(e) = self.try_merge(rng) {
                        let run = self.run.as_mut().expect("checked");
                        run.foreign.pop();
                        for m in &leaves {
                            run.covered.remove(m);
                        }
                        return Err(e);
                    }
                    Ok(())
                }
            }
            TgdhMsg::Update { bks } => {
                if run.collecting {
                    return Err(GkaError::Misplaced(
                        "blinded keys before the trees were merged",
                    ));
                }
                let mut tree = run.tree.clone();
                let sender_path = tree
                    .find(sender)
                    .ok_or(GkaError::Misplaced("sender not in the tree"))?;
                for (p, bk) in &bks {
                    if !sender_path.starts_with(p) {
                        return Err(GkaError::Misplaced(
                            "blinded key for a node the sender is not under",
                        ));
                    }
                    if bk.len() != G::ELEMENT_BYTES {
                        return Err(GkaError::Misplaced("blinded key of the wrong size"));
                    }
                    let node = tree.at_mut(p).ok_or(GkaError::Misplaced("no such node"))?;
                    if node
                        .bk()
                        .map(|b| b.bytes() != bk.as_slice())
                        .unwrap_or(true)
                    {
                        node.set_bk(Some(BkData::checked(&mut self.core.meter, bk)?));
                        // Keys computed from the old value are stale.
                        for d in 0..p.len() {
                            if let Some(n) = tree.at_mut(&p[..d]) {
                                n.set_key(None);
                            }
                        }
                    }
                }
                self.compute(tree, Vec::new())
            }
        }
    }
}
