//! The binary key tree of TGDH (paper 000 §4.3): structure, node paths and blinded keys, kept
//! apart from the protocol logic.
//!
//! A node is addressed by its [`NodePath`] from the root (`false` = left). Internal nodes cache
//! their subtree's height and leaf count, so that choosing an insertion point, comparing trees and
//! counting members take `O(h)`, not `O(n)`.
//!
//! A member need not hold every blinded key (see `tgdh`): a node's blinded key may be unknown to
//! it, which is not the same as *stale*. A stale node is one whose key and blinded key a
//! membership event invalidated (an ancestor of a departed or inserted leaf, a refreshed leaf and
//! its ancestors); every member marks the same nodes stale, and a run is complete when no node
//! below the root is stale any more.

use crate::api::MemberId;
use crate::members::MemberSet;
use conclave_crypto::Group;
use conclave_wire::gka::{NodePath, ShapeNode, MAX_PATH_BITS};
use std::sync::Arc;

/// A group element kept with its encoding: a blinded key, or a GDH partial key. Received values
/// are decoded (so checked to be in the group) on arrival, so that all members accept or refuse a
/// message alike; the encoding is kept to send them on without encoding again.
#[derive(Clone)]
pub(crate) struct BkData<G: Group> {
    bytes: Box<[u8]>,
    elem: G::Element,
}

pub(crate) type Bk<G> = Arc<BkData<G>>;

impl<G: Group> BkData<G> {
    /// A value this member computed.
    pub fn from_elem(e: G::Element) -> Bk<G> {
        let bytes = G::encode(&e);
        Self::from_parts(e, bytes)
    }
    /// A value computed here, with the encoding computed alongside it.
    pub fn from_parts(elem: G::Element, bytes: Vec<u8>) -> Bk<G> {
        Arc::new(BkData {
            bytes: bytes.into_boxed_slice(),
            elem,
        })
    }
    /// Received bytes, decoded and checked to be in the group (counted in `m`).
    pub fn checked(
        m: &mut conclave_crypto::Meter,
        bytes: &[u8],
    ) -> Result<Bk<G>, conclave_crypto::GroupError> {
        let e = crate::ops::decode::<G>(m, bytes)?;
        Ok(Self::from_parts(e, bytes.to_vec()))
    }
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    pub fn elem(&self) -> &G::Element {
        &self.elem
    }
}

/// Copies of a member's shared values (nodes, blinded keys, names) for
/// `KeyAgreement::own_copy`: each value gets one new allocation, however many places of the
/// state share it (a run's tree shares most of its nodes with the last completed one), so the
/// copy shares within itself what the original did, and nothing with anything else.
pub(crate) struct OwnCopies<G: Group> {
    nodes: std::collections::HashMap<usize, Arc<Node<G>>>,
    bks: std::collections::HashMap<usize, Bk<G>>,
    names: std::collections::HashMap<usize, Arc<str>>,
}

impl<G: Group> Default for OwnCopies<G> {
    fn default() -> Self {
        OwnCopies {
            nodes: Default::default(),
            bks: Default::default(),
            names: Default::default(),
        }
    }
}

impl<G: Group> TakeShared<G> for OwnCopies<G> {
    fn node(&mut self, n: &Arc<Node<G>>) -> Arc<Node<G>> {
        let at = Arc::as_ptr(n) as usize;
        if let Some(c) = self.nodes.get(&at) {
            return c.clone();
        }
        let c = Arc::new(n.copy_with(self));
        self.nodes.insert(at, c.clone());
        c
    }
    fn bk(&mut self, b: &Bk<G>) -> Bk<G> {
        self.bks
            .entry(Arc::as_ptr(b) as usize)
            .or_insert_with(|| Arc::new(BkData::clone(b)))
            .clone()
    }
    fn name(&mut self, m: &Arc<str>) -> Arc<str> {
        self.names
            .entry(Arc::as_ptr(m) as *const u8 as usize)
            .or_insert_with(|| Arc::from(&**m))
            .clone()
    }
}

/// Members' paths in one tree shape. A join needs two or three, found by walking the tree (and
/// kept); a group that forms by merging singletons hears from a sponsor at many nodes, so once
/// lookups are many every path is indexed in one walk. At n = 1,024 a walk of a tree that has
/// left the cache costs more than an exponentiation, so a path known from an earlier shape
/// (see `tgdh`) is given rather than found.
#[derive(Clone, Default)]
pub(crate) struct PathIndex {
    all: Option<Arc<std::collections::HashMap<MemberId, NodePath>>>,
    found: Vec<(MemberId, NodePath)>,
    /// Walks made, a name not in the tree included.
    walks: usize,
}

impl PathIndex {
    /// Walks allowed before indexing every member.
    const WALKS: usize = 8;
    /// An index that knows `member`'s path, which the caller vouches for.
    pub fn knowing(member: &str, path: NodePath) -> Self {
        PathIndex {
            all: None,
            found: vec![(member.to_owned(), path)],
            walks: 0,
        }
    }
    /// A copy sharing nothing with this index (see `KeyAgreement::own_copy`; two indexes that
    /// shared their table each get a copy of it).
    pub fn own_copy(&self) -> Self {
        PathIndex {
            all: self.all.as_ref().map(|a| Arc::new(a.as_ref().clone())),
            found: self.found.clone(),
            walks: self.walks,
        }
    }
    /// `member`'s path in `tree`, which must have the shape of every tree asked about before.
    pub fn get<G: Group>(&mut self, tree: &Node<G>, member: &str) -> Option<NodePath> {
        if let Some((_, p)) = self.found.iter().find(|(m, _)| m == member) {
            debug_assert_eq!(
                tree.find(member).as_ref(),
                Some(p),
                "a stale path for {member}"
            );
            return Some(p.clone());
        }
        if self.all.is_none() && self.walks >= Self::WALKS {
            self.all = Some(Arc::new(tree.paths()));
        }
        match &self.all {
            Some(all) => all.get(member).cloned(),
            None => {
                self.walks += 1;
                let p = tree.find(member)?;
                self.found.push((member.to_owned(), p.clone()));
                Some(p)
            }
        }
    }
}

/// What [`Node::prune`] leaves.
pub(crate) struct Pruned<G: Group> {
    pub tree: Option<Node<G>>,
    /// The rightmost member of each unchanged subtree that moved up, with its path.
    pub promoted: Vec<(MemberId, NodePath)>,
    /// The tracked member's path, if its leaf is kept.
    pub tracked: Option<NodePath>,
}

pub(crate) enum Node<G: Group> {
    Leaf {
        member: Arc<str>,
        bk: Option<Bk<G>>,
        key: Option<G::Scalar>,
        stale: bool,
    },
    Internal {
        bk: Option<Bk<G>>,
        key: Option<G::Scalar>,
        left: Arc<Node<G>>,
        right: Arc<Node<G>>,
        height: u32,
        size: u32,
        stale: bool,
    },
}

/// Node keys are secrets: wiped when the node goes.
impl<G: Group> Drop for Node<G> {
    fn drop(&mut self) {
        if let Node::Leaf { key: Some(k), .. } | Node::Internal { key: Some(k), .. } = self {
            zeroize::Zeroize::zeroize(k);
        }
    }
}

impl<G: Group> Clone for Node<G> {
    /// Shares the children, names and blinded keys.
    fn clone(&self) -> Self {
        self.copy_with(&mut Shared)
    }
}

/// How a copy of a node takes the parts a node may share with others: its children, its
/// member's name and its blinded key.
pub(crate) trait TakeShared<G: Group> {
    fn node(&mut self, n: &Arc<Node<G>>) -> Arc<Node<G>>;
    fn bk(&mut self, b: &Bk<G>) -> Bk<G>;
    fn name(&mut self, m: &Arc<str>) -> Arc<str>;
}

/// A plain clone: every shared part stays shared.
struct Shared;

impl<G: Group> TakeShared<G> for Shared {
    fn node(&mut self, n: &Arc<Node<G>>) -> Arc<Node<G>> {
        n.clone()
    }
    fn bk(&mut self, b: &Bk<G>) -> Bk<G> {
        b.clone()
    }
    fn name(&mut self, m: &Arc<str>) -> Arc<str> {
        m.clone()
    }
}

impl<G: Group> Node<G> {
    pub fn leaf(member: &str) -> Self {
        Node::Leaf {
            member: Arc::from(member),
            bk: None,
            key: None,
            stale: false,
        }
    }
    /// A new internal node over two subtrees, without keys: stale, if `stale`.
    pub fn join(left: Node<G>, right: Node<G>, stale: bool) -> Self {
        let height = 1 + left.height().max(right.height()) as u32;
        let size = (left.size() + right.size()) as u32;
        Node::Internal {
            bk: None,
            key: None,
            left: Arc::new(left),
            right: Arc::new(right),
            height,
            size,
            stale,
        }
    }
    /// A copy of the whole tree sharing no node, name or blinded key with anything outside
    /// `copies` (see [`OwnCopies`]).
    pub fn own_copy(&self, copies: &mut OwnCopies<G>) -> Self {
        self.copy_with(copies)
    }
    /// A copy of this node whose shared parts `take` provides.
    fn copy_with(&self, take: &mut impl TakeShared<G>) -> Self {
        match self {
            Node::Leaf {
                member,
                bk,
                key,
                stale,
            } => Node::Leaf {
                member: take.name(member),
                bk: bk.as_ref().map(|b| take.bk(b)),
                key: key.clone(),
                stale: *stale,
            },
            Node::Internal {
                bk,
                key,
                left,
                right,
                height,
                size,
                stale,
            } => Node::Internal {
                bk: bk.as_ref().map(|b| take.bk(b)),
                key: key.clone(),
                left: take.node(left),
                right: take.node(right),
                height: *height,
                size: *size,
                stale: *stale,
            },
        }
    }
    pub fn bk(&self) -> Option<&Bk<G>> {
        match self {
            Node::Leaf { bk, .. } | Node::Internal { bk, .. } => bk.as_ref(),
        }
    }
    pub fn key(&self) -> Option<&G::Scalar> {
        match self {
            Node::Leaf { key, .. } | Node::Internal { key, .. } => key.as_ref(),
        }
    }
    /// Sets the blinded key; a node given one is no longer stale.
    pub fn set_bk(&mut self, v: Option<Bk<G>>) {
        match self {
            Node::Leaf { bk, stale, .. } | Node::Internal { bk, stale, .. } => {
                *stale &= v.is_none();
                *bk = v
            }
        }
    }
    pub fn is_stale(&self) -> bool {
        match self {
            Node::Leaf { stale, .. } | Node::Internal { stale, .. } => *stale,
        }
    }
    /// Marks the root settled once its key is agreed (a root's blinded key is never sent).
    pub fn settle_root(&mut self) {
        let (Node::Leaf { stale, .. } | Node::Internal { stale, .. }) = self;
        *stale = false;
    }
    /// Forgets the node's key and blinded key and marks it stale.
    pub fn make_stale(&mut self) {
        match self {
            Node::Leaf { bk, key, stale, .. } | Node::Internal { bk, key, stale, .. } => {
                *bk = None;
                *key = None;
                *stale = true;
            }
        }
    }
    pub fn set_key(&mut self, v: Option<G::Scalar>) {
        match self {
            Node::Leaf { key, .. } | Node::Internal { key, .. } => *key = v,
        }
    }
    pub fn height(&self) -> usize {
        match self {
            Node::Leaf { .. } => 0,
            Node::Internal { height, .. } => *height as usize,
        }
    }
    /// Number of leaves.
    pub fn size(&self) -> usize {
        match self {
            Node::Leaf { .. } => 1,
            Node::Internal { size, .. } => *size as usize,
        }
    }
    pub fn leaves(&self) -> Vec<MemberId> {
        let mut out = Vec::with_capacity(self.size());
        self.collect_leaves(&mut out);
        out
    }
    fn collect_leaves(&self, out: &mut Vec<MemberId>) {
        match self {
            Node::Leaf { member, .. } => out.push(member.to_string()),
            Node::Internal { left, right, .. } => {
                left.collect_leaves(out);
                right.collect_leaves(out);
            }
        }
    }
    pub fn rightmost(&self) -> &str {
        match self {
            Node::Leaf { member, .. } => member,
            Node::Internal { right, .. } => right.rightmost(),
        }
    }
    /// The path of the rightmost leaf under the node at `from`.
    pub fn rightmost_path(&self, from: &[bool]) -> Option<NodePath> {
        let mut path = from.to_vec();
        let mut n = self.at(from)?;
        while let Node::Internal { right, .. } = n {
            path.push(true);
            n = right;
        }
        Some(path)
    }
    pub fn leftmost(&self) -> &str {
        match self {
            Node::Leaf { member, .. } => member,
            Node::Internal { left, .. } => left.leftmost(),
        }
    }
    pub fn find(&self, member: &str) -> Option<NodePath> {
        fn walk<G: Group>(n: &Node<G>, member: &str, path: &mut NodePath) -> bool {
            match n {
                Node::Leaf { member: m, .. } => &**m == member,
                Node::Internal { left, right, .. } => {
                    path.push(false);
                    if walk(left, member, path) {
                        return true;
                    }
                    path.pop();
                    path.push(true);
                    if walk(right, member, path) {
                        return true;
                    }
                    path.pop();
                    false
                }
            }
        }
        let mut path = Vec::new();
        walk(self, member, &mut path).then_some(path)
    }
    /// Every member's path, in one walk.
    pub fn paths(&self) -> std::collections::HashMap<MemberId, NodePath> {
        fn walk<G: Group>(
            n: &Node<G>,
            at: &mut NodePath,
            out: &mut std::collections::HashMap<MemberId, NodePath>,
        ) {
            match n {
                Node::Leaf { member, .. } => {
                    out.insert(member.to_string(), at.clone());
                }
                Node::Internal { left, right, .. } => {
                    at.push(false);
                    walk(left, at, out);
                    at.pop();
                    at.push(true);
                    walk(right, at, out);
                    at.pop();
                }
            }
        }
        let mut out = std::collections::HashMap::with_capacity(self.size());
        walk(self, &mut Vec::new(), &mut out);
        out
    }
    pub fn at(&self, path: &[bool]) -> Option<&Node<G>> {
        let mut n = self;
        for &b in path {
            match n {
                Node::Internal { left, right, .. } => n = if b { right } else { left },
                Node::Leaf { .. } => return None,
            }
        }
        Some(n)
    }
    pub fn at_mut(&mut self, path: &[bool]) -> Option<&mut Node<G>> {
        let mut n = self;
        for &b in path {
            match n {
                Node::Internal { left, right, .. } => {
                    n = Arc::make_mut(if b { right } else { left })
                }
                Node::Leaf { .. } => return None,
            }
        }
        Some(n)
    }
    /// Makes every proper ancestor of the node at `path` stale.
    pub fn invalidate_above(&mut self, path: &[bool]) {
        let mut n = self;
        for &b in path {
            n.make_stale();
            match n {
                Node::Internal { left, right, .. } => {
                    n = Arc::make_mut(if b { right } else { left })
                }
                Node::Leaf { .. } => return,
            }
        }
    }
    /// Removes the leaves not in `keep`; a removed leaf's sibling takes its parent's place, and
    /// every node above a removed leaf is stale. Returns no tree if no leaf is kept; the rightmost
    /// member of every unchanged subtree that moved up (whose new sibling's members may not know
    /// its blinded key), by name, with its path in the pruned tree; and the path of `track`'s
    /// leaf if it is kept. The paths come from the walk itself: at n = 1,024 another walk of the
    /// tree to find a leaf costs about as much as the whole prune.
    pub fn prune(self, keep: &MemberSet, track: &str) -> Pruned<G> {
        let mut out = Pruned {
            tree: None,
            promoted: Vec::new(),
            tracked: None,
        };
        out.tree = Self::prune_arc(Arc::new(self), keep, track, &mut out)
            .0
            .map(|a| Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()));
        // Paths were built from the leaf up.
        for (_, p) in &mut out.promoted {
            p.reverse();
        }
        if let Some(p) = &mut out.tracked {
            p.reverse();
        }
        out.promoted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out.promoted.dedup_by(|a, b| a.0 == b.0);
        out
    }
    /// The promoted members' names alone, as the walk found them before it gave paths: what
    /// the test of the paths compares with.
    #[cfg(test)]
    fn prune_names(self, keep: &MemberSet) -> Vec<MemberId> {
        fn walk<G: Group>(n: &Node<G>, keep: &MemberSet, out: &mut Vec<MemberId>) -> (bool, bool) {
            // (anything kept, anything changed)
            match n {
                Node::Leaf { member, .. } => (keep.contains(member), !keep.contains(member)),
                Node::Internal { left, right, .. } => {
                    let (lk, lc) = walk(left, keep, out);
                    let (rk, rc) = walk(right, keep, out);
                    if lk != rk {
                        let (x, changed) = if lk { (left, lc) } else { (right, rc) };
                        if !changed {
                            out.push(x.rightmost().to_owned());
                        }
                    }
                    (lk || rk, lc || rc || lk != rk)
                }
            }
        }
        let mut out = Vec::new();
        walk(&self, keep, &mut out);
        out.sort();
        out.dedup();
        out
    }
    /// Unchanged subtrees come back as the same shared node: pruning copies only the paths above
    /// removed leaves. Paths in `out` added under `node` are relative to what it returns, written
    /// leaf first; the second value says whether anything under `node` changed.
    fn prune_arc(
        node: Arc<Node<G>>,
        keep: &MemberSet,
        track: &str,
        out: &mut Pruned<G>,
    ) -> (Option<Arc<Node<G>>>, bool) {
        match &*node {
            Node::Leaf { member, .. } => {
                if keep.contains(member) {
                    if **member == *track && out.tracked.is_none() {
                        out.tracked = Some(NodePath::new());
                    }
                    (Some(node), false)
                } else {
                    (None, true)
                }
            }
            Node::Internal {
                bk,
                key,
                left,
                right,
                ..
            } => {
                let (p0, t0) = (out.promoted.len(), out.tracked.is_some());
                let (l, lc) = Self::prune_arc(left.clone(), keep, track, out);
                let (p1, t1) = (out.promoted.len(), out.tracked.is_some());
                let (r, rc) = Self::prune_arc(right.clone(), keep, track, out);
                let t2 = out.tracked.is_some();
                // Which side `track` was found under, if under this node.
                let tracked_side = match (t0, t1, t2) {
                    (false, true, _) => Some(false),
                    (false, false, true) => Some(true),
                    _ => None,
                };
                match (l, r) {
                    (Some(l), Some(r)) => {
                        // Both stay: each side's paths go one level down.
                        for (i, (_, p)) in out.promoted[p0..].iter_mut().enumerate() {
                            p.push(i >= p1 - p0);
                        }
                        if let (Some(b), Some(p)) = (tracked_side, out.tracked.as_mut()) {
                            p.push(b);
                        }
                        if !(lc || rc) {
                            return (Some(node), false);
                        }
                        let height = 1 + l.height().max(r.height()) as u32;
                        let size = (l.size() + r.size()) as u32;
                        (
                            Some(Arc::new(Node::Internal {
                                bk: None,
                                key: None,
                                left: l,
                                right: r,
                                height,
                                size,
                                stale: true,
                            })),
                            true,
                        )
                    }
                    // The survivor takes this node's place: its paths stand as they are.
                    (Some(x), None) => {
                        if !lc {
                            let path = x.rightmost_path(&[]).expect("the root");
                            out.promoted
                                .push((x.rightmost().to_owned(), path.into_iter().rev().collect()));
                        }
                        (Some(x), true)
                    }
                    (None, Some(x)) => {
                        if !rc {
                            let path = x.rightmost_path(&[]).expect("the root");
                            out.promoted
                                .push((x.rightmost().to_owned(), path.into_iter().rev().collect()));
                        }
                        (Some(x), true)
                    }
                    (None, None) => {
                        let _ = (bk, key);
                        (None, true)
                    }
                }
            }
        }
    }
    /// Inserts `other` at the shallowest rightmost node where it does not increase the height
    /// (at the root if there is none), as paper 000 §4.3 and its note 5 describe. The new internal
    /// node has `other` on its left and the subtree it displaced on its right, so that the
    /// rightmost member under it is one of the displaced subtree, which holds the blinded keys the
    /// newcomers lack (see `tgdh`). Returns the path of the new node, which is stale with its
    /// ancestors.
    pub fn insert(&mut self, other: Node<G>) -> NodePath {
        let h = self.height();
        let ho = other.height();
        // Breadth-first, right to left: the first fit is the shallowest rightmost. A subtree is
        // only searched if a fit can lie in it: not too deep, and not perfect (in a perfect
        // subtree every node lies on a longest path).
        let mut best: Option<NodePath> = None;
        let mut level: Vec<(NodePath, &Node<G>)> = vec![(Vec::new(), &*self)];
        let mut depth = 0;
        'search: while !level.is_empty() {
            for (p, n) in level.iter().rev() {
                if depth + 1 + n.height().max(ho) <= h {
                    best = Some(p.clone());
                    break 'search;
                }
            }
            if depth + 2 + ho > h {
                break;
            }
            let mut next = Vec::new();
            for (p, n) in &level {
                if let Node::Internal {
                    left,
                    right,
                    height,
                    size,
                    ..
                } = n
                {
                    if (*size as u64) == 1u64 << (*height).min(63) {
                        continue;
                    }
                    let mut pl = p.clone();
                    pl.push(false);
                    next.push((pl, left.as_ref()));
                    let mut pr = p.clone();
                    pr.push(true);
                    next.push((pr, right.as_ref()));
                }
            }
            level = next;
            depth += 1;
        }
        let path = best.unwrap_or_default();
        let slot = self.at_mut(&path).expect("path found in this tree");
        let old = std::mem::replace(slot, Node::leaf(""));
        *slot = Node::join(other, old, true);
        self.invalidate_above(&path);
        self.update_meta(&path);
        path
    }
    /// Recomputes cached heights and sizes along `path` after a change below it.
    fn update_meta(&mut self, path: &[bool]) {
        if let Node::Internal {
            left,
            right,
            height,
            size,
            ..
        } = self
        {
            if let Some((&b, rest)) = path.split_first() {
                if b {
                    Arc::make_mut(right).update_meta(rest);
                } else {
                    Arc::make_mut(left).update_meta(rest);
                }
            }
            *height = 1 + left.height().max(right.height()) as u32;
            *size = (left.size() + right.size()) as u32;
        }
    }
    /// The shape in preorder, leaves as their positions in the view whose members are `members`.
    pub fn to_shape(&self, members: &MemberSet) -> Result<Vec<ShapeNode>, &'static str> {
        let mut out = Vec::with_capacity(2 * self.size());
        self.to_shape_inner(members, &mut out)?;
        Ok(out)
    }
    fn to_shape_inner(
        &self,
        members: &MemberSet,
        out: &mut Vec<ShapeNode>,
    ) -> Result<(), &'static str> {
        match self {
            Node::Leaf { member, stale, .. } => out.push(ShapeNode::Leaf {
                index: members
                    .position(member)
                    .and_then(|i| u16::try_from(i).ok())
                    .ok_or("tree member outside the view")?,
                stale: *stale,
            }),
            Node::Internal {
                left, right, stale, ..
            } => {
                out.push(ShapeNode::Internal { stale: *stale });
                left.to_shape_inner(members, out)?;
                right.to_shape_inner(members, out)?;
            }
        }
        Ok(())
    }
    /// True if `nodes` is this tree's shape (what [`Node::to_shape`] gives) with leaves as
    /// positions in `members`: a member checks its own side's shape against its tree without
    /// building a second tree of n leaves.
    pub fn has_shape(&self, nodes: &[ShapeNode], members: &[MemberId]) -> bool {
        fn walk<G: Group>(
            n: &Node<G>,
            nodes: &mut std::slice::Iter<'_, ShapeNode>,
            members: &[MemberId],
        ) -> bool {
            match (n, nodes.next()) {
                (Node::Leaf { member, stale, .. }, Some(ShapeNode::Leaf { index, stale: s })) => {
                    stale == s
                        && members
                            .get(*index as usize)
                            .is_some_and(|m| **m == **member)
                }
                (
                    Node::Internal {
                        left, right, stale, ..
                    },
                    Some(ShapeNode::Internal { stale: s }),
                ) => stale == s && walk(left, nodes, members) && walk(right, nodes, members),
                _ => false,
            }
        }
        let mut it = nodes.iter();
        nodes.len() == 2 * self.size() - 1 && walk(self, &mut it, members) && it.next().is_none()
    }
    /// True if both trees have the same shape, members and stale nodes (what `to_shape` sends).
    #[cfg(test)]
    pub fn same_shape(&self, other: &Node<G>) -> bool {
        match (self, other) {
            (
                Node::Leaf {
                    member: a,
                    stale: sa,
                    ..
                },
                Node::Leaf {
                    member: b,
                    stale: sb,
                    ..
                },
            ) => a == b && sa == sb,
            (
                Node::Internal {
                    left: la,
                    right: ra,
                    stale: sa,
                    size: za,
                    ..
                },
                Node::Internal {
                    left: lb,
                    right: rb,
                    stale: sb,
                    size: zb,
                    ..
                },
            ) => sa == sb && za == zb && la.same_shape(lb) && ra.same_shape(rb),
            _ => false,
        }
    }
    /// Rebuilds a tree (no key, no blinded key) from its preorder shape, checking
    /// it is exactly one well-formed tree of distinct members of `members`, no deeper than the
    /// path limit, whose stale nodes have stale ancestors.
    pub fn from_shape(nodes: &[ShapeNode], members: &[MemberId]) -> Result<Node<G>, &'static str> {
        let mut seen = vec![false; members.len()];
        // Each open internal node, with its left subtree once that is complete.
        let mut stack: Vec<(bool, Option<Node<G>>)> = Vec::new();
        let mut done: Option<Node<G>> = None;
        for n in nodes {
            if done.is_some() {
                return Err("nodes after the end of the tree");
            }
            let mut finished = match n {
                ShapeNode::Internal { stale } => {
                    if stack.len() >= MAX_PATH_BITS {
                        return Err("tree too deep");
                    }
                    stack.push((*stale, None));
                    continue;
                }
                ShapeNode::Leaf { index, stale } => {
                    let member = members
                        .get(*index as usize)
                        .ok_or("leaf index outside the view")?;
                    if std::mem::replace(&mut seen[*index as usize], true) {
                        return Err("member appears twice in the tree");
                    }
                    let mut leaf = Node::leaf(member);
                    if *stale {
                        leaf.make_stale();
                    }
                    leaf
                }
            };
            loop {
                match stack.pop() {
                    None => {
                        done = Some(finished);
                        break;
                    }
                    Some((stale, None)) => {
                        stack.push((stale, Some(finished)));
                        break;
                    }
                    Some((stale, Some(left))) => {
                        // An event makes whole paths stale: a stale node's ancestors are stale.
                        if !stale && (left.is_stale() || finished.is_stale()) {
                            return Err("a stale node under one that is not");
                        }
                        finished = Node::join(left, finished, stale)
                    }
                }
            }
        }
        done.ok_or("incomplete tree")
    }
    /// True if no node below the root is stale. A stale node's ancestors are stale (an event
    /// makes whole paths stale) and a node's blinded key comes only after those below it (it is
    /// computed from them), so it is enough to look at the root's children.
    pub fn settled(&self) -> bool {
        fn below<G: Group>(n: &Node<G>) -> bool {
            !n.is_stale() && children_ok(n)
        }
        fn children_ok<G: Group>(n: &Node<G>) -> bool {
            match n {
                Node::Leaf { .. } => true,
                Node::Internal { left, right, .. } => below(left) && below(right),
            }
        }
        let quick = match self {
            Node::Leaf { .. } => true,
            Node::Internal { left, right, .. } => !left.is_stale() && !right.is_stale(),
        };
        debug_assert_eq!(quick, children_ok(self), "a settled node above a stale one");
        quick
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_crypto::{Group, Ristretto255};
    type N = Node<Ristretto255>;

    /// A tree of `names` in insertion order, with a blinded key at every node (nothing stale).
    fn build(names: &[&str]) -> N {
        fn settle(n: &mut N) {
            n.set_bk(Some(BkData::from_elem(Ristretto255::exp_g(
                &Ristretto255::scalar_from_u64(3),
            ))));
            if let Node::Internal { left, right, .. } = n {
                settle(Arc::make_mut(left));
                settle(Arc::make_mut(right));
            }
        }
        let mut t = N::leaf(names[0]);
        for n in &names[1..] {
            t.insert(N::leaf(n));
        }
        settle(&mut t);
        t
    }

    /// A tree's own copy is equal to it node for node but shares no node, name or blinded key.
    #[test]
    fn an_own_copy_shares_nothing() {
        fn check(a: &N, b: &N) {
            assert_eq!(a.bk().map(|k| k.bytes()), b.bk().map(|k| k.bytes()));
            if let (Some(x), Some(y)) = (a.bk(), b.bk()) {
                assert!(!Arc::ptr_eq(x, y));
            }
            match (a, b) {
                (Node::Leaf { member: m, .. }, Node::Leaf { member: n, .. }) => {
                    assert_eq!(m, n);
                    assert!(!Arc::ptr_eq(m, n));
                }
                (
                    Node::Internal { left, right, .. },
                    Node::Internal {
                        left: l, right: r, ..
                    },
                ) => {
                    assert!(!Arc::ptr_eq(left, l) && !Arc::ptr_eq(right, r));
                    check(left, l);
                    check(right, r);
                }
                _ => panic!("the copy's shape differs"),
            }
        }
        let names: Vec<String> = (0..11).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let t = build(&refs);
        let mut copies = OwnCopies::default();
        let c = t.own_copy(&mut copies);
        assert!(t.same_shape(&c));
        check(&t, &c);
        // Within the copy, what the original shared is shared again, once.
        let mut u = t.clone();
        let p = u.find("m3").unwrap();
        u.at_mut(&p).unwrap().set_key(None);
        let d = u.own_copy(&mut copies);
        let (Node::Internal { left: a, .. }, Node::Internal { left: b, .. }) = (&c, &d) else {
            panic!("a tree of 11 has an internal root");
        };
        let (Node::Internal { right: x, .. }, Node::Internal { right: y, .. }) = (&c, &d) else {
            unreachable!()
        };
        assert!(
            !Arc::ptr_eq(a, b) || !Arc::ptr_eq(x, y),
            "the changed side is copied apart"
        );
        assert!(
            Arc::ptr_eq(a, b) || Arc::ptr_eq(x, y),
            "the unchanged side is shared"
        );
    }

    #[test]
    fn insertion_keeps_the_tree_balanced() {
        let names: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let t = build(&refs);
        assert_eq!(t.size(), 100);
        assert_eq!(t.leaves().len(), 100);
        // Inserting one leaf at a time at the shallowest fitting node gives the minimal height.
        assert_eq!(t.height(), 7);
        for n in &refs {
            let p = t.find(n).unwrap();
            assert!(matches!(t.at(&p), Some(Node::Leaf { member, .. }) if &**member == *n));
        }
    }

    #[test]
    fn prune_promotes_siblings_and_clears_ancestors() {
        let mut t = build(&["a", "b", "c", "d"]);
        for p in [vec![], vec![false], vec![true]] {
            t.at_mut(&p)
                .unwrap()
                .set_bk(Some(BkData::from_elem(Ristretto255::exp_g(
                    &Ristretto255::scalar_from_u64(5),
                ))));
        }
        let keep: MemberSet = ["a", "b", "c"].into_iter().collect();
        let t = t.prune(&keep, "a").tree.unwrap();
        assert_eq!(t.size(), 3);
        assert!(t.bk().is_none());
        assert!(t.find("d").is_none());
        // The untouched half keeps its blinded key.
        let a = t.find("a").unwrap();
        assert!(t.at(&a[..1]).unwrap().bk().is_some() || t.at(&a[..1]).unwrap().size() == 1);
    }

    #[test]
    fn shape_round_trip_and_rejections() {
        let t = build(&["a", "b", "c", "d", "e"]);
        let view: std::sync::Arc<[MemberId]> = ["e", "d", "c", "b", "a", "z"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let set = MemberSet::of_view(&view).unwrap();
        let w = t.to_shape(&set).unwrap();
        assert!(t.has_shape(&w, &view));
        assert!(!t.has_shape(&w[..w.len() - 1], &view));
        assert!(!build(&["a", "b", "c", "e", "d"]).has_shape(&w, &view));
        let mut staler = t.clone();
        staler.make_stale();
        assert!(
            !staler.has_shape(&w, &view),
            "stale nodes are part of the shape"
        );
        let back = N::from_shape(&w, &view).unwrap();
        assert_eq!(back.to_shape(&set).unwrap(), w);
        assert!(back.same_shape(&t) && !back.same_shape(&build(&["a", "b", "c", "e", "d"])));
        assert_eq!(back.leaves(), t.leaves());
        assert_eq!(back.size(), 5);
        assert!(back.settled() && back.bk().is_none());
        assert!(N::from_shape(&w[..w.len() - 1], &view).is_err());
        let mut dup = w.clone();
        dup.push(ShapeNode::Leaf {
            index: 0,
            stale: false,
        });
        assert!(N::from_shape(&dup, &view).is_err());
        assert!(N::from_shape(&[], &view).is_err());
        let leaf = |index| ShapeNode::Leaf {
            index,
            stale: false,
        };
        assert!(N::from_shape(&[leaf(6)], &view).is_err());
        let twice = [ShapeNode::Internal { stale: false }, leaf(1), leaf(1)];
        assert!(N::from_shape(&twice, &view).is_err());
        let fewer = MemberSet::of_view(&view[1..].into()).unwrap();
        assert!(t.to_shape(&fewer).is_err(), "a member outside the view");
        // A stale node must have stale ancestors (an event makes whole paths stale).
        let stale_under_settled = [
            ShapeNode::Internal { stale: false },
            ShapeNode::Leaf {
                index: 0,
                stale: true,
            },
            leaf(1),
        ];
        assert!(N::from_shape(&stale_under_settled, &view).is_err());
        let stale_path = [
            ShapeNode::Internal { stale: true },
            ShapeNode::Leaf {
                index: 0,
                stale: true,
            },
            leaf(1),
        ];
        assert!(N::from_shape(&stale_path, &view).unwrap().is_stale());
    }

    #[test]
    fn pruning_names_the_subtrees_that_moved_up_and_marks_changed_nodes_stale() {
        let t = build(&["a", "b", "c", "d", "e"]);
        assert!(t.settled());
        let keep = |names: &[&str]| -> MemberSet { names.iter().collect() };
        let pair_of = |t: &N, m: &str| t.find(m).unwrap();
        let rightmost_of_sibling = {
            let p = pair_of(&t, "e");
            let mut s = p[..p.len() - 1].to_vec();
            s.push(!p[p.len() - 1]);
            t.at(&s).unwrap().rightmost().to_owned()
        };
        // Removing e moves its sibling up, unchanged.
        let out = t.clone().prune(&keep(&["a", "b", "c", "d"]), "a");
        let (pruned, promoted) = (out.tree.unwrap(), out.promoted);
        let names: Vec<&str> = promoted.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(names, vec![rightmost_of_sibling.as_str()]);
        // Stale: the nodes above e's parent, if it had any.
        assert_eq!(pruned.settled(), pair_of(&t, "e").len() <= 2);
        // Removing two leaves of different subtrees: two promotions, stale nodes above them.
        let out = t.prune(&keep(&["b", "c", "e"]), "e");
        let (pruned, promoted) = (out.tree.unwrap(), out.promoted);
        assert_eq!(pruned.size(), 3);
        assert_eq!(promoted.len(), 2, "{promoted:?}");
        assert!(!pruned.settled());
        assert_eq!(out.tracked, pruned.find("e"));
    }

    /// The paths a prune gives are those a walk of the pruned tree finds, whatever is removed:
    /// the promoted members' and the tracked member's (none when its leaf goes).
    #[test]
    fn pruned_paths_are_the_paths_in_the_pruned_tree() {
        let names: Vec<String> = (0..23).map(|i| format!("m{i:02}")).collect();
        let refs: Vec<&str> = names.iter().map(|m| m.as_str()).collect();
        let t = build(&refs);
        // Keep sets by bit patterns of a few shapes: single leaves, halves, scattered members.
        for pattern in [
            0x7ffffeu32,
            0x7fff00,
            0x0000ff,
            0x555555,
            0x3c3c3c,
            0x400001,
            0x7ffbff,
        ] {
            let kept: Vec<&str> = (0..names.len())
                .filter(|i| pattern >> i & 1 == 1)
                .map(|i| refs[i])
                .collect();
            let keep: MemberSet = kept.iter().collect();
            for track in [kept[0], kept[kept.len() - 1], "m05", "absent"] {
                let out = t.clone().prune(&keep, track);
                let pruned = out.tree.as_ref().unwrap();
                assert_eq!(out.tracked, pruned.find(track), "{pattern:x} {track}");
                for (m, p) in &out.promoted {
                    assert_eq!(pruned.find(m).as_ref(), Some(p), "{pattern:x} {m}");
                }
                let old = t.clone().prune_names(&keep);
                let got: Vec<&String> = out.promoted.iter().map(|(m, _)| m).collect();
                assert_eq!(got, old.iter().collect::<Vec<_>>(), "{pattern:x}");
            }
        }
    }
}
