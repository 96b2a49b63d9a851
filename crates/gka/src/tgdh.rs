//! Tree-based Group Diffie-Hellman (paper 000 §4.3, Figs 5-6).
//!
//! A node's key is `K = H(BK_sibling^{K_child})` (the DH value hashed to an exponent, where the
//! paper uses the DH value mod p directly) and its blinded key `BK = g^K`; the root key is the
//! group secret. Every member keeps its tree's shape, the keys on its own path, and the blinded
//! keys of its path and its co-path (the siblings of its path's nodes): what it needs to compute
//! the root key and to act as a sponsor. It may hold more, but a newcomer gets no more than that.
//!
//! A membership event makes some nodes *stale* (see `tree`): the ancestors of departed leaves and
//! of inserted subtrees, and refreshed leaves with their ancestors. Every member marks the same
//! ones. A view with one side (leave, partition) prunes the departed leaves; every unchanged
//! subtree that moved up has its rightmost member refresh its leaf (so that the members of its
//! new sibling, who may not hold its blinded key, receive a new one), or, if none moved, the
//! rightmost member does. A view with several sides is a merge: in round 1 each side's rightmost
//! member broadcasts its side's shape, which nodes of it are stale, its root's blinded key and
//! whether a leaf of the side was drawn in this run; every member then merges the shapes,
//! largest first, each inserted at the shallowest rightmost node that does not increase the
//! height, as the left child of a new node over the subtree it displaces. If no leaf was drawn,
//! the rightmost member of the last displaced subtree refreshes its leaf, so every run has a
//! fresh contribution. In both cases members then compute up their paths as far as they can; a
//! member broadcasts the blinded keys it computed when it has just refreshed its leaf or is the
//! rightmost member under the lowest node it newly computed, which makes exactly one sponsor per
//! computable subtree and repeats until all members hold the root key (one round for a leave, two for a join or merge,
//! up to `h` for a partition). In a merge a sponsor's message also carries the blinded keys of
//! both children of each node it computed: the co-path the other sides' members lack. A run
//! completes when no node below the root is stale, which all members observe alike (see `core`).
//!
//! Departures: §4.3 has every member hold every blinded key and a merging sponsor broadcast its
//! whole tree with them; footnote 4 notes that a member needs less. Here a merge moves the shapes
//! and `O(h)` blinded keys, so a joiner receives and decodes `O(log n)` group elements, not
//! `O(n)`; what a member can no longer do is compute a node's key off its own path from
//! blinded keys it was never sent, which nothing in the protocol asks of it. The displaced
//! subtree goes on the right of the new node (the paper does not fix the side) so that its
//! member, who holds the blinded keys the newcomers lack, is the sponsor. §4.3 has every merging
//! side's sponsor refresh its leaf in round 1; we refresh one leaf per merge, after merging, and
//! none when a newcomer's leaf is fresh anyway. §4.3's partition has the shallowest rightmost
//! member refresh; we refresh under every subtree that moved up, which a member that may not
//! hold every blinded key needs. Receivers never recompute a blinded key a sponsor sent (§5's
//! optimization). Table II's TGDH row counts `3h/2` exponentiations for a join, merge and leave,
//! the cost for a sponsor at mid depth; our critical path is about `3d` for a sponsor at depth
//! `d`, so it is bounded by `3h` (plus one for a leave), with `h` the height after the event.
//! Cascades restart from the newest view (see `core`).

use crate::api::{Dest, GkaError, KeyAgreement, Order, SecureView, SharedDirectory, View};
use crate::core::Core;
use crate::members::Positions;
use crate::ops;
use crate::tree::{Bk, BkData, Node, OwnCopies, PathIndex};
use conclave_crypto::{CryptoRng, Group, Identity};
use conclave_wire::gka::{NodePath, ProtocolId, ShapeNode, TgdhMsg};
use std::collections::BTreeSet;

const NODE_LABEL: &[u8] = b"conclave tgdh node";

#[derive(Clone)]
pub struct Tgdh<G: Group> {
    core: Core,
    /// The tree of the last completed run.
    secure: Option<Node<G>>,
    /// Paths known in `secure`: a view that keeps its shape needs no walk to find this member.
    secure_paths: PathIndex,
    run: Option<Run<G>>,
}

struct Run<G: Group> {
    tree: Node<G>,
    /// Merge round 1: waiting for the sides' shapes.
    collecting: bool,
    /// Merge round 1: whether this member has its own side's root blinded key from its sponsor.
    got_own: bool,
    foreign: Vec<Node<G>>,
    /// Merge round 1: the members, by position in the view, that other sides' shapes cover.
    /// Positions rather than names: after a merge of many members the run ends holding
    /// hundreds, and a set of names cost a free per name at the next view.
    covered: Positions,
    /// Whether this run merges sides: its sponsors send the co-path newcomers lack.
    merge: bool,
    /// Whether some side drew a leaf key in this run (a newcomer, or a refresh after departures).
    fresh: bool,
    /// Whether this member's side did (what its sponsor's shape must say).
    side_fresh: bool,
    /// Merge round 1: this member refreshes its leaf once the trees are merged.
    refresh_me: bool,
    /// Members' paths in the run's tree, once its shape is settled.
    paths: PathIndex,
    done: bool,
}

/// Gives the leaf at `path` (this member's) a fresh key; returns the path and new blinded key.
fn refresh<G: Group>(
    tree: &mut Node<G>,
    path: NodePath,
    rng: &mut dyn CryptoRng,
    meter: &mut conclave_crypto::Meter,
) -> (NodePath, Bk<G>) {
    let k = G::random_scalar(rng);
    let bk: Bk<G> = BkData::from_elem(ops::exp_g::<G>(meter, &k));
    let leaf = tree.at_mut(&path).expect("this member's leaf");
    leaf.set_key(Some(k));
    leaf.set_bk(Some(bk.clone()));
    tree.invalidate_above(&path);
    (path, bk)
}

/// Marks the leaf at `path` and everything above it stale: its member is about to refresh it.
fn mark_refresh<G: Group>(tree: &mut Node<G>, path: &[bool]) {
    if let Some(leaf) = tree.at_mut(path) {
        leaf.make_stale();
        tree.invalidate_above(path);
    }
}

/// Blinded keys by node path, as a sponsor broadcasts them.
type PathBks<G> = Vec<(NodePath, Bk<G>)>;

/// What one step of computation up a member's path gave.
struct Advance<G: Group> {
    /// The blinded keys this member must broadcast: those it newly computed, when it is the
    /// rightmost member under the lowest of them.
    bks: PathBks<G>,
    /// Depths on the path of the nodes whose keys it computed in this step.
    keyed: Vec<usize>,
    /// Whether the root key is known.
    root: bool,
}

/// Computes keys up `me`'s path as far as the known blinded keys allow. A member that has just
/// refreshed its leaf (`refreshed`) sends every blinded key it computed: nobody else can compute
/// a node above a refreshed leaf before it has sent them.
fn advance<G: Group>(
    tree: &mut Node<G>,
    me: &str,
    path: &[bool],
    meter: &mut conclave_crypto::Meter,
    refreshed: bool,
) -> Result<Advance<G>, GkaError> {
    let mut computed: Vec<usize> = Vec::new();
    let mut keyed: Vec<usize> = Vec::new();
    for d in (0..path.len()).rev() {
        if let Some(n) = tree.at(&path[..d]) {
            if n.key().is_some() {
                // A key computed earlier whose blinded key no sponsor has sent yet.
                if n.is_stale() && d > 0 {
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
        let needs_bk = node.is_stale() && d > 0;
        node.set_key(Some(key));
        keyed.push(d);
        if needs_bk {
            computed.push(d);
        }
    }
    let mut bks = Vec::new();
    if let Some(&lowest) = computed.first() {
        if refreshed
            || tree
                .at(&path[..lowest])
                .map(|n| n.rightmost() == me)
                .unwrap_or(false)
        {
            // Blinded all at once: one field inversion encodes the lot (ristretto255). Collected
            // in one allocation of the exact size: a vector that grew would leave node keys in
            // the buffers it outgrew, which nothing wipes.
            let keys: Vec<G::Scalar> = computed
                .iter()
                .map(|&d| {
                    tree.at(&path[..d])
                        .and_then(|n| n.key())
                        .cloned()
                        .expect("just computed")
                })
                .collect();
            let (elems, encodings) = ops::exp_g_batch::<G>(meter, &keys);
            for ((d, elem), bytes) in computed.into_iter().zip(elems).zip(encodings) {
                let bk: Bk<G> = BkData::from_parts(elem, bytes);
                let node = tree.at_mut(&path[..d]).expect("ancestor exists");
                node.set_bk(Some(bk.clone()));
                bks.push((path[..d].to_vec(), bk));
            }
        }
    }
    Ok(Advance {
        bks,
        keyed,
        root: tree.key().is_some(),
    })
}

/// Adds to `out` the blinded keys of both children of the nodes at `depths` on `path` that
/// `tree` holds and `out` lacks: the co-path a merged side's members need.
fn add_children<G: Group>(tree: &Node<G>, path: &[bool], depths: &[usize], out: &mut PathBks<G>) {
    let mut have: BTreeSet<NodePath> = out.iter().map(|(p, _)| p.clone()).collect();
    for &d in depths {
        for side in [false, true] {
            let mut c = path[..d].to_vec();
            c.push(side);
            if let Some(bk) = tree.at(&c).and_then(|n| n.bk()) {
                if have.insert(c.clone()) {
                    out.push((c, bk.clone()));
                }
            }
        }
    }
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
            secure_paths: PathIndex::default(),
            run: None,
        }
    }

    /// Computes on `tree`, sends what this member is sponsor for, and commits it as the run's tree.
    fn compute(&mut self, mut tree: Node<G>, mut extra: PathBks<G>) -> Result<(), GkaError> {
        let me = self.core.me.clone();
        let run = self.run.as_mut().expect("run in progress");
        let path = run
            .paths
            .get(&tree, &me)
            .ok_or(GkaError::Misplaced("member missing from its tree"))?;
        let merge = run.merge;
        let step = advance(
            &mut tree,
            &me,
            &path,
            &mut self.core.meter,
            !extra.is_empty(),
        )?;
        extra.extend(step.bks);
        if !extra.is_empty() {
            if merge {
                let mut depths = step.keyed;
                depths.extend(
                    extra
                        .iter()
                        .map(|(p, _)| p.len())
                        .filter(|&d| d < path.len()),
                );
                depths.sort_unstable();
                depths.dedup();
                add_children(&tree, &path, &depths, &mut extra);
            }
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
        // Complete only once no node below the root is stale: that depends only on the
        // broadcasts delivered, which members that move together share, so they all agree on
        // whether this run completed (a member could often compute the root earlier).
        if step.root && !run.done && run.tree.settled() {
            run.done = true;
            run.tree.settle_root();
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
        let me = self.core.me.clone();
        let run = self.run.as_mut().expect("run in progress");
        let own_path = run
            .paths
            .get(&run.tree, &me)
            .ok_or(GkaError::Misplaced("member missing from its tree"))?;
        let mut trees: Vec<(Node<G>, bool)> =
            run.foreign.iter().map(|t| (t.clone(), false)).collect();
        trees.push((run.tree.clone(), true));
        trees.sort_by(|a, b| {
            b.0.size()
                .cmp(&a.0.size())
                .then_with(|| a.0.leftmost().cmp(b.0.leftmost()))
        });
        let mut it = trees.into_iter();
        let (mut merged, first_is_own) = it.next().expect("at least this member's tree");
        // This member's path, followed through the insertions rather than found again by a
        // walk: an inserted tree goes left of the subtree it displaces, which goes right.
        let mut mine = first_is_own.then(|| own_path.clone());
        let mut last = None;
        for (t, is_own) in it {
            let p = merged.insert(t);
            if is_own {
                let mut m = p.clone();
                m.push(false);
                m.extend_from_slice(&own_path);
                mine = Some(m);
            } else if let Some(m) = mine.as_mut().filter(|m| m.starts_with(&p)) {
                m.insert(p.len(), true);
            }
            last = Some(p);
        }
        let mine = mine.expect("this member's tree was merged");
        // Node paths travel as at most MAX_PATH_BITS bits; a merge of hostile deep trees must not
        // produce a tree this member could not describe.
        if merged.height() >= conclave_wire::gka::MAX_PATH_BITS {
            return Err(GkaError::Misplaced("merged key tree too deep"));
        }
        let run = self.run.as_ref().expect("run in progress");
        let mut refresh_me = run.refresh_me;
        // One fresh contribution per run keeps keys from repeating: without a new leaf, the
        // rightmost member of the last displaced subtree refreshes its own.
        if !run.fresh {
            if let Some(p) = last {
                let r = merged.rightmost_path(&p).expect("inserted above");
                refresh_me |= r == mine;
                merged.at_mut(&r).expect("found above").make_stale();
                merged.invalidate_above(&r);
            }
        }
        let mut extra = Vec::new();
        if refresh_me {
            extra.push(refresh::<G>(
                &mut merged,
                mine.clone(),
                rng,
                &mut self.core.meter,
            ));
        }
        // The run leaves its first round only once the merged tree is computed on. Should that
        // fail, the run keeps the unmerged tree, so it must keep that tree's paths too.
        let run = self.run.as_mut().expect("run in progress");
        let unmerged = std::mem::replace(&mut run.paths, PathIndex::knowing(&me, mine));
        if let Err(e) = self.compute(merged, extra) {
            self.run.as_mut().expect("run in progress").paths = unmerged;
            return Err(e);
        }
        let run = self.run.as_mut().expect("run in progress");
        run.collecting = false;
        run.refresh_me = false;
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
            merge: self.merge,
            fresh: self.fresh,
            side_fresh: self.side_fresh,
            refresh_me: self.refresh_me,
            paths: self.paths.clone(),
            done: self.done,
        }
    }
}

impl<G: Group> KeyAgreement for Tgdh<G> {
    fn protocol(&self) -> ProtocolId {
        ProtocolId::Tgdh
    }
    forward_to_core!();

    fn own_copy(&self) -> Box<dyn KeyAgreement> {
        let mut copies = OwnCopies::default();
        let mut c = self.clone();
        c.secure = self.secure.as_ref().map(|t| t.own_copy(&mut copies));
        c.secure_paths = self.secure_paths.own_copy();
        if let Some(r) = c.run.as_mut() {
            r.tree = r.tree.own_copy(&mut copies);
            r.foreign = r.foreign.iter().map(|t| t.own_copy(&mut copies)).collect();
            r.paths = r.paths.own_copy();
        }
        Box::new(c)
    }

    fn handle_view(&mut self, rng: &mut dyn CryptoRng, view: View) -> Result<(), GkaError> {
        self.core.install_view(view)?;
        if let Some(run) = self.run.take() {
            if run.done {
                self.secure = Some(run.tree);
                self.secure_paths = run.paths;
            }
        }
        let me = self.core.me.clone();
        let side = self.core.side.clone();
        let (tree, mut refreshers, mut paths) = match self.secure.clone() {
            // The secure tree's leaves are the side it completed with, and a side only shrinks:
            // one of the same size is that side, and nothing need be pruned.
            Some(t) if t.size() == side.len() => {
                debug_assert!(t.leaves().iter().all(|m| side.contains(m)));
                (Some(t), Vec::new(), self.secure_paths.clone())
            }
            Some(t) => {
                let pruned = t.prune(&side, &me);
                let paths = match pruned.tracked {
                    Some(p) => PathIndex::knowing(&me, p),
                    None => PathIndex::default(),
                };
                (pruned.tree, pruned.promoted, paths)
            }
            None => (None, Vec::new(), PathIndex::default()),
        };
        let mut tree = tree.unwrap_or_else(|| Node::leaf(&me));
        if tree.size() != side.len() {
            return Err(GkaError::InvalidView(
                "side is not covered by the secure tree",
            ));
        }
        let n = self.core.view()?.members.len();
        let new_run = |tree, merge, fresh, refresh_me, paths| Run {
            tree,
            collecting: merge,
            got_own: !merge,
            foreign: vec![],
            covered: Positions::default(),
            merge,
            fresh,
            side_fresh: fresh,
            refresh_me,
            paths,
            done: false,
        };
        if n == 1 {
            let k = G::random_scalar(rng);
            let secret = G::encode_scalar(&k);
            let mut tree = Node::leaf(&me);
            tree.set_key(Some(k));
            let mut run = new_run(tree, false, true, false, PathIndex::default());
            run.done = true;
            self.run = Some(run);
            return self.core.complete(&secret, b"");
        }
        if self.core.single_side() {
            // Leave or partition: a fresh leaf under every subtree that moved up, or at the
            // rightmost member if none did.
            if refreshers.is_empty() {
                let path = tree.rightmost_path(&[]).expect("the root");
                refreshers.push((tree.rightmost().to_owned(), path));
            }
            for (_, p) in &refreshers {
                mark_refresh(&mut tree, p);
            }
            let mut extra = Vec::new();
            if refreshers.iter().any(|(m, _)| *m == me) {
                let p = paths
                    .get(&tree, &me)
                    .ok_or(GkaError::Misplaced("member missing from its tree"))?;
                extra.push(refresh::<G>(&mut tree, p, rng, &mut self.core.meter));
            }
            // `paths` are the pruned tree's, which `compute` makes the run's.
            self.run = Some(new_run(Node::leaf(&me), false, true, false, paths));
            return self.compute(tree, extra);
        }
        // Merge, round 1: each side's rightmost member broadcasts the side's shape and its root's
        // blinded key (unless departures made the root stale).
        for (_, p) in &refreshers {
            mark_refresh(&mut tree, p);
        }
        let refresh_me = refreshers.iter().any(|(m, _)| *m == me);
        let mut fresh = !refreshers.is_empty();
        if !refresh_me {
            let p = paths
                .get(&tree, &me)
                .ok_or(GkaError::Misplaced("member missing from its tree"))?;
            let leaf = tree.at_mut(&p).expect("found");
            if leaf.key().is_none() {
                leaf.set_key(Some(G::random_scalar(rng)));
                fresh = true;
            }
        }
        let sponsor = tree.rightmost().to_owned();
        if sponsor == me {
            let root_bk = if tree.is_stale() {
                None
            } else {
                if tree.bk().is_none() {
                    let k = tree
                        .key()
                        .cloned()
                        .ok_or(GkaError::Misplaced("the side's root key is not known"))?;
                    tree.set_bk(Some(BkData::from_elem(ops::exp_g::<G>(
                        &mut self.core.meter,
                        &k,
                    ))));
                }
                tree.bk().map(|b| b.bytes().to_vec())
            };
            let nodes = tree
                .to_shape(&self.core.member_set)
                .map_err(GkaError::Misplaced)?;
            self.core.send(
                Dest::Broadcast,
                Order::Agreed,
                1,
                TgdhMsg::Shape {
                    nodes,
                    root_bk,
                    fresh,
                }
                .encode(),
            )?;
        }
        self.run = Some(Run {
            got_own: sponsor == me,
            ..new_run(tree, true, fresh, refresh_me, paths)
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
        let side = self.core.side.clone();
        let run = self
            .run
            .as_ref()
            .ok_or(GkaError::Misplaced("no TGDH run in progress"))?;
        match msg {
            TgdhMsg::Shape {
                nodes,
                root_bk,
                fresh,
            } => {
                if !run.collecting {
                    return Err(GkaError::Misplaced(
                        "tree outside the first round of a merge",
                    ));
                }
                let view_members = self.core.view()?.members.clone();
                if side.contains(sender) {
                    // This member's own side: the shape must be the tree it holds, which is
                    // checked in place rather than rebuilt (at n = 1,024 a second tree of n
                    // leaves costs more than the event's exponentiations).
                    if run.got_own
                        || fresh != run.side_fresh
                        || run.tree.rightmost() != sender
                        || !run.tree.has_shape(&nodes, &view_members)
                    {
                        return Err(GkaError::Misplaced(
                            "unexpected tree from this member's own side",
                        ));
                    }
                    if root_bk.is_some() == run.tree.is_stale() {
                        return Err(GkaError::Misplaced(
                            "a side's root blinded key must come exactly when the root is not stale",
                        ));
                    }
                    let mut mine = run.tree.clone();
                    if let Some(b) = root_bk {
                        if mine.bk().map(|k| k.bytes() != b.as_slice()).unwrap_or(true) {
                            mine.set_bk(Some(BkData::checked(&mut self.core.meter, &b)?));
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
                    let mut t = Node::<G>::from_shape(&nodes, &view_members)
                        .map_err(GkaError::Misplaced)?;
                    if t.rightmost() != sender {
                        return Err(GkaError::Misplaced("tree not sent by its sponsor"));
                    }
                    if root_bk.is_some() == t.is_stale() {
                        return Err(GkaError::Misplaced(
                            "a side's root blinded key must come exactly when the root is not stale",
                        ));
                    }
                    // `from_shape` took each leaf from the view, once: its index is its position.
                    let leaves: Vec<usize> = nodes
                        .iter()
                        .filter_map(|n| match n {
                            ShapeNode::Leaf { index, .. } => Some(*index as usize),
                            ShapeNode::Internal { .. } => None,
                        })
                        .collect();
                    if leaves
                        .iter()
                        .any(|&i| side.contains(&view_members[i]) || run.covered.contains(i))
                    {
                        return Err(GkaError::Misplaced(
                            "tree names members outside the view or twice",
                        ));
                    }
                    if let Some(b) = root_bk {
                        t.set_bk(Some(BkData::checked(&mut self.core.meter, &b)?));
                    }
                    let run = self.run.as_mut().expect("checked");
                    let was_fresh = run.fresh;
                    run.fresh |= fresh;
                    run.covered.set(&leaves, true, view_members.len());
                    run.foreign.push(t);
                    if let Err(e) = self.try_merge(rng) {
                        let run = self.run.as_mut().expect("checked");
                        run.foreign.pop();
                        run.fresh = was_fresh;
                        run.covered.set(&leaves, false, view_members.len());
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
                let run = self.run.as_mut().expect("checked");
                let mut tree = run.tree.clone();
                let sender_path = run
                    .paths
                    .get(&tree, sender)
                    .ok_or(GkaError::Misplaced("sender not in the tree"))?;
                for (p, bk) in &bks {
                    // A node on the sender's path, or a child of one (its co-path, in a merge).
                    if p.is_empty() || !sender_path.starts_with(&p[..p.len() - 1]) {
                        return Err(GkaError::Misplaced(
                            "blinded key for a node off the sender's path and co-path",
                        ));
                    }
                    if bk.len() != G::ELEMENT_BYTES {
                        return Err(GkaError::Misplaced("blinded key of the wrong size"));
                    }
                    let node = tree.at_mut(p).ok_or(GkaError::Misplaced("no such node"))?;
                    // A blinded key is computed from those below it: one that comes before them
                    // would let this member complete while others wait (see `Node::settled`).
                    if let Node::Internal { left, right, .. } = &*node {
                        if left.is_stale() || right.is_stale() {
                            return Err(GkaError::Misplaced(
                                "blinded key for a node above a stale one",
                            ));
                        }
                    }
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
