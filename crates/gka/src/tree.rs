//! The binary key tree of TGDH (paper 000 §4.3): structure, node paths and blinded keys, kept
//! apart from the protocol logic.
//!
//! A node is addressed by its [`NodePath`] from the root (`false` = left). Internal nodes cache
//! their subtree's height and leaf count, so that choosing an insertion point, comparing trees and
//! counting members take `O(h)`, not `O(n)`. Blinded keys are kept as received (encoded) and
//! decoded only when a member uses them, so that a member of a large group decodes `O(h)`
//! elements per run, not `O(n)`.

use crate::api::MemberId;
use conclave_crypto::Group;
use conclave_wire::gka::{NodePath, WireNode, MAX_PATH_BITS};
use std::collections::BTreeSet;
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

pub(crate) enum Node<G: Group> {
    Leaf {
        member: Arc<str>,
        bk: Option<Bk<G>>,
        key: Option<G::Scalar>,
    },
    Internal {
        bk: Option<Bk<G>>,
        key: Option<G::Scalar>,
        left: Arc<Node<G>>,
        right: Arc<Node<G>>,
        height: u32,
        size: u32,
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
    fn clone(&self) -> Self {
        match self {
            Node::Leaf { member, bk, key } => Node::Leaf {
                member: member.clone(),
                bk: bk.clone(),
                key: key.clone(),
            },
            Node::Internal {
                bk,
                key,
                left,
                right,
                height,
                size,
            } => Node::Internal {
                bk: bk.clone(),
                key: key.clone(),
                left: left.clone(),
                right: right.clone(),
                height: *height,
                size: *size,
            },
        }
    }
}

impl<G: Group> Node<G> {
    pub fn leaf(member: &str) -> Self {
        Node::Leaf {
            member: Arc::from(member),
            bk: None,
            key: None,
        }
    }
    /// A new internal node over two subtrees, without keys.
    pub fn join(left: Node<G>, right: Node<G>) -> Self {
        Self::join_with(None, None, left, right)
    }
    fn join_with(bk: Option<Bk<G>>, key: Option<G::Scalar>, left: Node<G>, right: Node<G>) -> Self {
        let height = 1 + left.height().max(right.height()) as u32;
        let size = (left.size() + right.size()) as u32;
        Node::Internal {
            bk,
            key,
            left: Arc::new(left),
            right: Arc::new(right),
            height,
            size,
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
    pub fn set_bk(&mut self, v: Option<Bk<G>>) {
        match self {
            Node::Leaf { bk, .. } | Node::Internal { bk, .. } => *bk = v,
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
    /// Clears keys and blinded keys of every proper ancestor of the node at `path`.
    pub fn invalidate_above(&mut self, path: &[bool]) {
        let mut n = self;
        for &b in path {
            n.set_bk(None);
            n.set_key(None);
            match n {
                Node::Internal { left, right, .. } => {
                    n = Arc::make_mut(if b { right } else { left })
                }
                Node::Leaf { .. } => return,
            }
        }
    }
    /// Removes the leaves not in `keep`; a removed leaf's sibling takes its parent's place, and
    /// every node above a removed leaf loses its keys. Returns `None` if no leaf is kept.
    pub fn prune(self, keep: &BTreeSet<MemberId>) -> Option<Node<G>> {
        Self::prune_arc(Arc::new(self), keep)
            .0
            .map(|a| Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()))
    }
    /// Unchanged subtrees come back as the same shared node: pruning copies only the paths above
    /// removed leaves.
    fn prune_arc(node: Arc<Node<G>>, keep: &BTreeSet<MemberId>) -> (Option<Arc<Node<G>>>, bool) {
        match &*node {
            Node::Leaf { member, .. } => {
                if keep.contains(&**member) {
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
                let (l, lc) = Self::prune_arc(left.clone(), keep);
                let (r, rc) = Self::prune_arc(right.clone(), keep);
                match (l, r) {
                    (Some(l), Some(r)) => {
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
                            })),
                            true,
                        )
                    }
                    (Some(x), None) | (None, Some(x)) => (Some(x), true),
                    (None, None) => {
                        let _ = (bk, key);
                        (None, true)
                    }
                }
            }
        }
    }
    /// Paths of internal nodes without a blinded key whose children both have one: where
    /// computation can start after a partition.
    pub fn frontier(&self) -> Vec<NodePath> {
        let mut out = Vec::new();
        self.frontier_inner(&mut Vec::new(), &mut out);
        out
    }
    fn frontier_inner(&self, at: &mut NodePath, out: &mut Vec<NodePath>) {
        if let Node::Internal {
            bk, left, right, ..
        } = self
        {
            if bk.is_some() {
                // A node with a blinded key has an intact subtree: nothing below needs work.
                return;
            }
            if left.bk().is_some() && right.bk().is_some() {
                out.push(at.clone());
            }
            at.push(false);
            left.frontier_inner(at, out);
            at.pop();
            at.push(true);
            right.frontier_inner(at, out);
            at.pop();
        }
    }
    /// Inserts `other` at the shallowest rightmost node where it does not increase the height
    /// (at the root if there is none), as paper 000 §4.3 and its note 5 describe. Returns the path
    /// of the new internal node, whose keys and ancestors' keys are cleared.
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
        *slot = Node::join(old, other);
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
    /// Preorder wire form (blinded keys only; keys never leave the member).
    pub fn to_wire(&self) -> Vec<WireNode> {
        let mut out = Vec::with_capacity(2 * self.size());
        self.to_wire_inner(&mut out);
        out
    }
    fn to_wire_inner(&self, out: &mut Vec<WireNode>) {
        match self {
            Node::Leaf { member, bk, .. } => out.push(WireNode::Leaf {
                member: member.to_string(),
                bk: bk.as_ref().map(|b| b.bytes().to_vec()),
            }),
            Node::Internal {
                bk, left, right, ..
            } => {
                out.push(WireNode::Internal {
                    bk: bk.as_ref().map(|b| b.bytes().to_vec()),
                });
                left.to_wire_inner(out);
                right.to_wire_inner(out);
            }
        }
    }
    /// Rebuilds a tree from its preorder wire form, checking it is exactly one well-formed tree
    /// with distinct members, no deeper than the path limit, and blinded keys of the right size.
    /// A blinded key with the bytes of one in `known` (a tree whose keys this member decoded
    /// and checked before) is taken from it; every other one is decoded and checked now. So all
    /// members accept or refuse a tree alike (an element is in the group or not whoever checks
    /// it), and a member decodes only what it has not seen: in a join, the sponsor's path, not
    /// the whole tree it holds already.
    pub fn from_wire(
        m: &mut conclave_crypto::Meter,
        nodes: &[WireNode],
        known: Option<&Node<G>>,
    ) -> Result<Node<G>, &'static str> {
        enum Frame<G: Group> {
            Open(Option<Bk<G>>),
            Half(Option<Bk<G>>, Node<G>),
        }
        let mut seen = BTreeSet::new();
        let mut stack: Vec<Frame<G>> = Vec::new();
        let mut done: Option<Node<G>> = None;
        let mut checked: std::collections::HashMap<&[u8], Bk<G>> = Default::default();
        if let Some(k) = known {
            k.collect_bks(&mut checked);
        }
        let mut check = |bk: &Option<Vec<u8>>| -> Result<Option<Bk<G>>, &'static str> {
            match bk {
                Some(b) if b.len() != G::ELEMENT_BYTES => Err("blinded key of the wrong size"),
                Some(b) => match checked.get(b.as_slice()) {
                    Some(known) => Ok(Some(known.clone())),
                    // Decoded now: every member must accept or refuse a tree alike (see `tgdh`).
                    None => BkData::checked(m, b)
                        .map(Some)
                        .map_err(|_| "blinded key not in the group"),
                },
                None => Ok(None),
            }
        };
        for n in nodes {
            if done.is_some() {
                return Err("nodes after the end of the tree");
            }
            let mut finished = match n {
                WireNode::Internal { bk } => {
                    if stack.len() >= MAX_PATH_BITS {
                        return Err("tree too deep");
                    }
                    stack.push(Frame::Open(check(bk)?));
                    continue;
                }
                WireNode::Leaf { member, bk } => {
                    if !seen.insert(member.as_str()) {
                        return Err("member appears twice in the tree");
                    }
                    Node::Leaf {
                        member: Arc::from(member.as_str()),
                        bk: check(bk)?,
                        key: None,
                    }
                }
            };
            loop {
                match stack.pop() {
                    None => {
                        done = Some(finished);
                        break;
                    }
                    Some(Frame::Open(bk)) => {
                        stack.push(Frame::Half(bk, finished));
                        break;
                    }
                    Some(Frame::Half(bk, left)) => {
                        finished = Node::join_with(bk, None, left, finished);
                    }
                }
            }
        }
        done.ok_or("incomplete tree")
    }
    /// Every blinded key of the tree, by its bytes.
    fn collect_bks<'a>(&'a self, into: &mut std::collections::HashMap<&'a [u8], Bk<G>>) {
        if let Some(bk) = self.bk() {
            into.insert(bk.bytes(), bk.clone());
        }
        if let Node::Internal { left, right, .. } = self {
            left.collect_bks(into);
            right.collect_bks(into);
        }
    }
    /// True if every node but the root has a blinded key.
    pub fn all_bks_known(&self) -> bool {
        fn below<G: Group>(n: &Node<G>) -> bool {
            n.bk().is_some() && children_ok(n)
        }
        fn children_ok<G: Group>(n: &Node<G>) -> bool {
            match n {
                Node::Leaf { .. } => true,
                Node::Internal { left, right, .. } => below(left) && below(right),
            }
        }
        children_ok(self)
    }
    /// True if both trees have the same shape and members.
    pub fn same_shape(&self, other: &Node<G>) -> bool {
        match (self, other) {
            (Node::Leaf { member: a, .. }, Node::Leaf { member: b, .. }) => a == b,
            (
                Node::Internal {
                    left: la,
                    right: ra,
                    ..
                },
                Node::Internal {
                    left: lb,
                    right: rb,
                    ..
                },
            ) => la.same_shape(lb) && ra.same_shape(rb),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_crypto::{Group, Ristretto255};
    type N = Node<Ristretto255>;

    fn build(names: &[&str]) -> N {
        let mut t = N::leaf(names[0]);
        for n in &names[1..] {
            t.insert(N::leaf(n));
        }
        t
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
        let keep: BTreeSet<MemberId> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let t = t.prune(&keep).unwrap();
        assert_eq!(t.size(), 3);
        assert!(t.bk().is_none());
        assert!(t.find("d").is_none());
        // The untouched half keeps its blinded key.
        let a = t.find("a").unwrap();
        assert!(t.at(&a[..1]).unwrap().bk().is_some() || t.at(&a[..1]).unwrap().size() == 1);
    }

    #[test]
    fn wire_round_trip_and_rejections() {
        let t = build(&["a", "b", "c", "d", "e"]);
        let w = t.to_wire();
        let mut m = conclave_crypto::Meter::default();
        let back = N::from_wire(&mut m, &w, None).unwrap();
        assert!(back.same_shape(&t));
        assert_eq!(back.size(), 5);
        assert!(N::from_wire(&mut m, &w[..w.len() - 1], None).is_err());
        let mut dup = w.clone();
        dup.push(WireNode::Leaf {
            member: "a".into(),
            bk: None,
        });
        assert!(N::from_wire(&mut m, &dup, None).is_err());
        assert!(N::from_wire(&mut m, &[], None).is_err());
    }

    #[test]
    fn known_blinded_keys_are_not_decoded_again_and_new_ones_are_checked() {
        use rand_chacha::rand_core::SeedableRng;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
        let mut t = build(&["a", "b", "c", "d"]);
        for name in ["a", "b", "c", "d"] {
            let p = t.find(name).unwrap();
            let e = Ristretto255::exp_g(&Ristretto255::random_scalar(&mut rng));
            t.at_mut(&p).unwrap().set_bk(Some(BkData::from_elem(e)));
        }
        let w = t.to_wire();
        let mut m = conclave_crypto::Meter::default();
        N::from_wire(&mut m, &w, None).unwrap();
        assert_eq!(m.decodes, 4, "a stranger decodes every blinded key");
        let mut m = conclave_crypto::Meter::default();
        N::from_wire(&mut m, &w, Some(&t)).unwrap();
        assert_eq!(m.decodes, 0, "a holder of the tree decodes none");
        // One key changed: only it is decoded; one not in the group: refused by both alike.
        let mut changed = t.clone();
        let e = Ristretto255::exp_g(&Ristretto255::random_scalar(&mut rng));
        let pa = t.find("a").unwrap();
        changed
            .at_mut(&pa)
            .unwrap()
            .set_bk(Some(BkData::from_elem(e)));
        let mut m = conclave_crypto::Meter::default();
        N::from_wire(&mut m, &changed.to_wire(), Some(&t)).unwrap();
        assert_eq!(m.decodes, 1);
        let mut bad = changed.to_wire();
        for n in bad.iter_mut() {
            if let WireNode::Leaf { member, bk } = n {
                if member == "a" {
                    *bk = Some(vec![0xff; Ristretto255::ELEMENT_BYTES]);
                }
            }
        }
        assert!(N::from_wire(&mut m, &bad, Some(&t)).is_err());
        assert!(N::from_wire(&mut m, &bad, None).is_err());
    }
}
