//! The binary key tree of TGDH (paper 000 §4.3): structure, node paths and blinded keys, kept
//! apart from the protocol logic.
//!
//! A node is addressed by its [`NodePath`] from the root (`false` = left). Blinded keys are kept as
//! received (encoded) and decoded only when a member uses them, so that a member of a large group
//! decodes `O(h)` elements per run, not `O(n)`.

use crate::api::MemberId;
use conclave_crypto::Group;
use conclave_wire::gka::{NodePath, WireNode, MAX_PATH_BITS};
use std::collections::BTreeSet;
use std::sync::Arc;

/// An encoded blinded key.
pub(crate) type Bk = Arc<[u8]>;

pub(crate) enum Node<G: Group> {
    Leaf {
        member: MemberId,
        bk: Option<Bk>,
        key: Option<G::Scalar>,
    },
    Internal {
        bk: Option<Bk>,
        key: Option<G::Scalar>,
        left: Box<Node<G>>,
        right: Box<Node<G>>,
    },
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
            } => Node::Internal {
                bk: bk.clone(),
                key: key.clone(),
                left: left.clone(),
                right: right.clone(),
            },
        }
    }
}

impl<G: Group> Node<G> {
    pub fn leaf(member: MemberId) -> Self {
        Node::Leaf {
            member,
            bk: None,
            key: None,
        }
    }
    pub fn bk(&self) -> Option<&Bk> {
        match self {
            Node::Leaf { bk, .. } | Node::Internal { bk, .. } => bk.as_ref(),
        }
    }
    pub fn key(&self) -> Option<&G::Scalar> {
        match self {
            Node::Leaf { key, .. } | Node::Internal { key, .. } => key.as_ref(),
        }
    }
    pub fn set_bk(&mut self, v: Option<Bk>) {
        match self {
            Node::Leaf { bk, .. } | Node::Internal { bk, .. } => *bk = v,
        }
    }
    pub fn set_key(&mut self, v: Option<G::Scalar>) {
        match self {
            Node::Leaf { key, .. } | Node::Internal { key, .. } => *key = v,
        }
    }
    pub fn leaves(&self) -> Vec<MemberId> {
        let mut out = Vec::new();
        self.collect_leaves(&mut out);
        out
    }
    fn collect_leaves(&self, out: &mut Vec<MemberId>) {
        match self {
            Node::Leaf { member, .. } => out.push(member.clone()),
            Node::Internal { left, right, .. } => {
                left.collect_leaves(out);
                right.collect_leaves(out);
            }
        }
    }
    pub fn height(&self) -> usize {
        match self {
            Node::Leaf { .. } => 0,
            Node::Internal { left, right, .. } => 1 + left.height().max(right.height()),
        }
    }
    pub fn rightmost(&self) -> &MemberId {
        match self {
            Node::Leaf { member, .. } => member,
            Node::Internal { right, .. } => right.rightmost(),
        }
    }
    pub fn find(&self, member: &str) -> Option<NodePath> {
        match self {
            Node::Leaf { member: m, .. } => (m == member).then(Vec::new),
            Node::Internal { left, right, .. } => {
                if let Some(mut p) = left.find(member) {
                    p.insert(0, false);
                    Some(p)
                } else if let Some(mut p) = right.find(member) {
                    p.insert(0, true);
                    Some(p)
                } else {
                    None
                }
            }
        }
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
                Node::Internal { left, right, .. } => n = if b { right } else { left },
                Node::Leaf { .. } => return None,
            }
        }
        Some(n)
    }
    /// Clears keys and blinded keys of every proper ancestor of the node at `path`.
    pub fn invalidate_above(&mut self, path: &[bool]) {
        for d in 0..path.len() {
            if let Some(n) = self.at_mut(&path[..d]) {
                n.set_bk(None);
                n.set_key(None);
            }
        }
    }
    /// Removes the leaves not in `keep`; a removed leaf's sibling takes its parent's place, and
    /// every node above a removed leaf loses its keys. Returns `None` if no leaf is kept.
    pub fn prune(self, keep: &BTreeSet<MemberId>) -> Option<Node<G>> {
        self.prune_inner(keep).0
    }
    fn prune_inner(self, keep: &BTreeSet<MemberId>) -> (Option<Node<G>>, bool) {
        match self {
            Node::Leaf { ref member, .. } => {
                if keep.contains(member) {
                    (Some(self), false)
                } else {
                    (None, true)
                }
            }
            Node::Internal {
                bk,
                key,
                left,
                right,
            } => {
                let (l, lc) = left.prune_inner(keep);
                let (r, rc) = right.prune_inner(keep);
                match (l, r) {
                    (Some(l), Some(r)) => {
                        let changed = lc || rc;
                        let (bk, key) = if changed { (None, None) } else { (bk, key) };
                        (
                            Some(Node::Internal {
                                bk,
                                key,
                                left: Box::new(l),
                                right: Box::new(r),
                            }),
                            changed,
                        )
                    }
                    (Some(x), None) | (None, Some(x)) => (Some(x), true),
                    (None, None) => (None, true),
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
            if bk.is_none() && left.bk().is_some() && right.bk().is_some() {
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
        let mut best: Option<NodePath> = None;
        // Breadth-first, right to left: the first fit is the shallowest rightmost.
        let mut level: Vec<(NodePath, &Node<G>)> = vec![(Vec::new(), self)];
        let mut depth = 0;
        'search: while !level.is_empty() {
            for (p, n) in level.iter().rev() {
                if depth + 1 + n.height().max(ho) <= h {
                    best = Some(p.clone());
                    break 'search;
                }
            }
            let mut next = Vec::new();
            for (p, n) in &level {
                if let Node::Internal { left, right, .. } = n {
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
        let old = std::mem::replace(slot, Node::leaf(String::new()));
        *slot = Node::Internal {
            bk: None,
            key: None,
            left: Box::new(old),
            right: Box::new(other),
        };
        self.invalidate_above(&path);
        path
    }
    /// Preorder wire form (blinded keys only; keys never leave the member).
    pub fn to_wire(&self) -> Vec<WireNode> {
        let mut out = Vec::new();
        self.to_wire_inner(&mut out);
        out
    }
    fn to_wire_inner(&self, out: &mut Vec<WireNode>) {
        match self {
            Node::Leaf { member, bk, .. } => out.push(WireNode::Leaf {
                member: member.clone(),
                bk: bk.as_ref().map(|b| b.to_vec()),
            }),
            Node::Internal {
                bk, left, right, ..
            } => {
                out.push(WireNode::Internal {
                    bk: bk.as_ref().map(|b| b.to_vec()),
                });
                left.to_wire_inner(out);
                right.to_wire_inner(out);
            }
        }
    }
    /// Rebuilds a tree from its preorder wire form, checking it is exactly one well-formed tree
    /// with distinct members, no deeper than the path limit, and blinded keys of the right size.
    pub fn from_wire(nodes: &[WireNode]) -> Result<Node<G>, &'static str> {
        enum Frame<G: Group> {
            Open(Option<Bk>),
            Half(Option<Bk>, Node<G>),
        }
        let mut seen = BTreeSet::new();
        let mut stack: Vec<Frame<G>> = Vec::new();
        let mut done: Option<Node<G>> = None;
        let check = |bk: &Option<Vec<u8>>| -> Result<Option<Bk>, &'static str> {
            match bk {
                Some(b) if b.len() != G::ELEMENT_BYTES => Err("blinded key of the wrong size"),
                Some(b) => Ok(Some(Arc::from(b.as_slice()))),
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
                    if !seen.insert(member.clone()) {
                        return Err("member appears twice in the tree");
                    }
                    Node::Leaf {
                        member: member.clone(),
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
                        finished = Node::Internal {
                            bk,
                            key: None,
                            left: Box::new(left),
                            right: Box::new(finished),
                        };
                    }
                }
            }
        }
        done.ok_or("incomplete tree")
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
