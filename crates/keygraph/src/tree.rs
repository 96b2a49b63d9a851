//! Key trees (and stars, the trees of height 1): storage and the rekeying of paper 001 §3.3-§3.4.
//!
//! Joins follow Fig 6 (key-oriented), Fig 7 (group-oriented) and the user-oriented construction
//! of §3.3; leaves follow Figs 8 and 9 and the user-oriented construction of §3.4; a batch of joins
//! and leaves follows the marking algorithm of Li, Yang, Gouda and Lam (WWW 2001). Departures from
//! the paper:
//!
//! - Layout: every member sits at the same depth (see [`crate::index`]). A node with a single
//!   member below keeps its own key, so a joiner that opens a new branch receives one key more
//!   than the paper's tree would give it. Table 2's counts hold exactly whenever the joining point
//!   already has members, which a full tree guarantees.
//! - The joining point is the parent of the lowest free slot, which keeps the tree full and
//!   balanced (the paper's server "employs a heuristic that attempts to" do so, unspecified).
//! - When the root is left with one occupied child (offset 0) the tree drops a level; that child
//!   becomes the root and its key is renewed under its old one (one encryption), so that no group
//!   key serves two epochs.
//! - In a batch, a changed node none of whose departed members was below it sends its new key
//!   under its old key once, plus under each changed child for the joiners; other changed nodes
//!   send it under each occupied child's key, as Li et al. do.

use crate::index::{height_for, path, NodeIndex, Slot};
use crate::seal::{ItemId, Sealer};
use crate::Strategy;
use conclave_crypto::CryptoRng;
use conclave_wire::lkh::{GraphShape, KeyRef, Recipients};
use std::collections::{BTreeMap, BTreeSet};
use zeroize::{Zeroize, Zeroizing};

#[derive(Clone, Default)]
pub(crate) struct Node {
    pub key: [u8; 32],
    pub version: u64,
    /// Members below this node; 0 means the node is absent.
    pub users: u32,
}

/// One epoch's rekey, before authentication and encoding.
pub(crate) struct Rekey {
    pub shape: GraphShape,
    pub group_key: Option<KeyRef>,
    /// Each message's items, by id in the epoch's sealer.
    pub messages: Vec<(Recipients, Vec<ItemId>)>,
    /// Keys learned, summed over the members (paper 001 Fig 12 divides it by the group size).
    pub key_changes: u64,
}

/// A key tree of fixed degree.
pub struct KeyTree {
    degree: u32,
    height: u8,
    /// `levels[0]` are the individual keys; `levels[height]` holds the root.
    levels: Vec<Vec<Node>>,
}

impl Drop for KeyTree {
    fn drop(&mut self) {
        for level in &mut self.levels {
            for n in level.iter_mut() {
                n.key.zeroize();
            }
        }
    }
}

impl core::fmt::Debug for KeyTree {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "KeyTree(degree {}, height {}, {} members, keys redacted)",
            self.degree,
            self.height,
            self.users()
        )
    }
}

fn fresh_key(rng: &mut dyn CryptoRng) -> Zeroizing<[u8; 32]> {
    let mut k = Zeroizing::new([0u8; 32]);
    rng.fill_bytes(&mut k[..]);
    k
}

impl KeyTree {
    pub fn new(degree: u32) -> KeyTree {
        assert!(degree >= 2);
        KeyTree {
            degree,
            height: 1,
            levels: vec![Vec::new(), Vec::new()],
        }
    }

    pub fn degree(&self) -> u32 {
        self.degree
    }
    pub fn height(&self) -> u8 {
        self.height
    }
    pub fn users(&self) -> u32 {
        self.get(NodeIndex::root(self.height))
            .map_or(0, |n| n.users)
    }
    pub(crate) fn shape(&self) -> GraphShape {
        if self.degree == crate::index::STAR_DEGREE {
            GraphShape::Star
        } else {
            GraphShape::Tree {
                degree: self.degree,
                height: self.height,
            }
        }
    }

    fn get(&self, ix: NodeIndex) -> Option<&Node> {
        self.levels
            .get(ix.level as usize)?
            .get(ix.offset as usize)
            .filter(|n| n.users > 0)
    }
    fn node_mut(&mut self, ix: NodeIndex) -> &mut Node {
        let level = &mut self.levels[ix.level as usize];
        let o = ix.offset as usize;
        if level.len() <= o {
            level.resize(o + 1, Node::default());
        }
        &mut level[o]
    }
    pub(crate) fn keyref(&self, ix: NodeIndex) -> Option<KeyRef> {
        self.get(ix).map(|n| KeyRef {
            id: ix.id(),
            version: n.version,
        })
    }
    pub(crate) fn key(&self, ix: NodeIndex) -> Option<&[u8; 32]> {
        self.get(ix).map(|n| &n.key)
    }
    pub fn group_key(&self) -> Option<(KeyRef, &[u8; 32])> {
        let r = NodeIndex::root(self.height);
        Some((self.keyref(r)?, self.key(r)?))
    }
    /// Heap bytes held by the tree.
    pub fn heap_bytes(&self) -> usize {
        self.levels
            .iter()
            .map(|l| l.capacity() * core::mem::size_of::<Node>())
            .sum::<usize>()
            + self.levels.capacity() * core::mem::size_of::<Vec<Node>>()
    }
    /// The keys a member at `slot` holds: its path, leaf first.
    pub(crate) fn path_keys(&self, slot: Slot) -> Vec<(KeyRef, [u8; 32])> {
        path(slot, self.degree, self.height)
            .filter_map(|ix| Some((self.keyref(ix)?, *self.key(ix)?)))
            .collect()
    }
    /// Occupied slots below `ix`, in order.
    pub(crate) fn slots_below(&self, ix: NodeIndex) -> Vec<Slot> {
        if self.get(ix).is_none() {
            return Vec::new();
        }
        let mut frontier = vec![ix];
        for _ in 0..ix.level {
            let mut next = Vec::new();
            for p in frontier {
                let len = self.levels[p.level as usize - 1].len();
                for o in p.children(self.degree, len) {
                    let c = NodeIndex {
                        level: p.level - 1,
                        offset: o as u32,
                    };
                    if self.get(c).is_some() {
                        next.push(c);
                    }
                }
            }
            frontier = next;
        }
        frontier
            .into_iter()
            .filter(|c| self.get(*c).is_some())
            .map(|c| Slot(c.offset))
            .collect()
    }
    fn occupied_children(&self, x: NodeIndex) -> Vec<NodeIndex> {
        let len = self.levels[x.level as usize - 1].len();
        x.children(self.degree, len)
            .map(|o| NodeIndex {
                level: x.level - 1,
                offset: o as u32,
            })
            .filter(|c| self.get(*c).is_some())
            .collect()
    }
    /// Leaf slots held, occupied or not.
    pub(crate) fn leaf_width(&self) -> usize {
        self.levels[0].len()
    }
    /// Empties every level above the leaves (a state a bug could save; tests check it is
    /// refused).
    #[cfg(test)]
    pub(crate) fn orphan_leaves_for_test(&mut self) {
        for l in 1..self.levels.len() {
            self.levels[l].clear();
        }
    }
    /// Gives the root the placeholder key of a node no operation keyed.
    #[cfg(test)]
    pub(crate) fn keyless_root_for_test(&mut self) {
        let top = self.levels.last_mut().expect("levels");
        top[0].key = [0; 32];
    }
    /// Occupies a second node at the root's level.
    #[cfg(test)]
    pub(crate) fn second_root_for_test(&mut self) {
        let top = self.levels.last_mut().expect("levels");
        let root = top[0].clone();
        top.push(root);
    }
    /// Nodes held, present or not.
    pub(crate) fn node_count(&self) -> usize {
        self.levels.iter().map(Vec::len).sum()
    }
    pub(crate) fn leaf_key(&self, slot: Slot) -> Option<[u8; 32]> {
        self.key(NodeIndex::leaf(slot)).copied()
    }

    fn grow_to(&mut self, height: u8) {
        while self.height < height {
            let users = self.users();
            self.height += 1;
            self.levels.push(Vec::new());
            if users > 0 {
                // The new root starts with the old root's members and no key: the operation that
                // grew the tree gives it one.
                self.node_mut(NodeIndex::root(self.height)).users = users;
            }
        }
    }

    /// Drops the root while it has one occupied child, the first; returns whether it did.
    fn shrink(&mut self) -> bool {
        let mut shrunk = false;
        while self.height > 1 {
            let root = NodeIndex::root(self.height);
            let below = NodeIndex::root(self.height - 1);
            let ru = self.get(root).map_or(0, |n| n.users);
            if ru == 0 || self.get(below).map_or(0, |n| n.users) != ru {
                break;
            }
            let mut top = self.levels.pop().expect("height + 1 levels");
            for n in &mut top {
                n.key.zeroize();
            }
            self.height -= 1;
            shrunk = true;
        }
        shrunk
    }

    fn add_leaf(&mut self, slot: Slot, key: &[u8; 32], version: u64) {
        let d = self.degree;
        let h = height_for(d, slot.0 as u64 + 1);
        self.grow_to(h);
        let leaf = self.node_mut(NodeIndex::leaf(slot));
        assert_eq!(leaf.users, 0, "slot {slot:?} taken");
        leaf.key = *key;
        leaf.version = version;
        leaf.users = 1;
        for ix in path(slot, d, self.height).skip(1) {
            self.node_mut(ix).users += 1;
        }
    }

    fn remove_leaf(&mut self, slot: Slot) {
        let d = self.degree;
        for ix in path(slot, d, self.height) {
            let n = self.node_mut(ix);
            assert!(n.users > 0, "removing an empty slot");
            n.users -= 1;
            if n.users == 0 {
                n.key.zeroize();
            }
        }
        if self.users() == 0 {
            // Empty: start again at height 1 (versions are epochs, so no key reference repeats).
            self.levels = vec![Vec::new(), Vec::new()];
            self.height = 1;
        }
    }

    fn set_key(&mut self, ix: NodeIndex, key: &[u8; 32], version: u64) {
        let n = self.node_mut(ix);
        n.key = *key;
        n.version = version;
    }

    /// Builds a tree over members in slots `0..keys.len()` with fresh internal keys, as a server
    /// does at start-up before any rekeying; every key gets version `epoch`.
    pub(crate) fn bulk(
        degree: u32,
        leaf_keys: impl ExactSizeIterator<Item = [u8; 32]>,
        epoch: u64,
        rng: &mut dyn CryptoRng,
    ) -> KeyTree {
        let n = leaf_keys.len();
        let mut t = KeyTree::new(degree);
        t.grow_to(height_for(degree, n as u64));
        let mut width = n;
        let room = n + n / crate::server::GROWTH_ROOM_DIVISOR;
        let mut leaves = Vec::with_capacity(room);
        leaves.extend(leaf_keys.map(|key| Node {
            key,
            version: epoch,
            users: 1,
        }));
        t.levels[0] = leaves;
        for l in 1..=t.height as usize {
            let below = &t.levels[l - 1];
            let up_width = if degree == crate::index::STAR_DEGREE {
                1.min(width)
            } else {
                width.div_ceil(degree as usize)
            };
            let mut up =
                Vec::with_capacity(up_width + up_width / crate::server::GROWTH_ROOM_DIVISOR + 1);
            for o in 0..up_width {
                let first = o as u64 * degree as u64;
                let end = (first + degree as u64).min(below.len() as u64);
                let users = below[first as usize..end as usize]
                    .iter()
                    .map(|c| c.users)
                    .sum();
                let mut key = [0u8; 32];
                rng.fill_bytes(&mut key);
                up.push(Node {
                    key,
                    version: epoch,
                    users,
                });
            }
            width = up_width;
            t.levels[l] = up;
        }
        t
    }

    /// Rekeys for one join at `slot` (paper 001 §3.3, Figs 6-7).
    pub(crate) fn join(
        &mut self,
        slot: Slot,
        ind_key: &[u8; 32],
        strategy: Strategy,
        sealer: &mut Sealer<'_>,
        rng: &mut dyn CryptoRng,
    ) -> Rekey {
        let d = self.degree;
        let epoch = sealer.epoch;
        let old_height = self.height;
        let old_root = NodeIndex::root(old_height);
        // Before the join: the key each path node's old members share (x_0 .. x_j of Fig 6).
        let new_height = self.height.max(height_for(d, slot.0 as u64 + 1));
        let mut old: Vec<(NodeIndex, KeyRef, [u8; 32])> = Vec::new();
        let mut fresh_only: Vec<NodeIndex> = Vec::new();
        for l in (1..=new_height).rev() {
            let x = NodeIndex::ancestor(slot, d, l);
            // Above the old root only the first node of each level holds the old members.
            let cover = if l > old_height && self.users() > 0 && x.offset == 0 {
                Some(old_root)
            } else {
                self.get(x).map(|_| x)
            };
            match cover {
                Some(c) => old.push((
                    x,
                    self.keyref(c).expect("occupied"),
                    *self.key(c).expect("occupied"),
                )),
                None => fresh_only.push(x),
            }
        }
        self.add_leaf(slot, ind_key, epoch);
        let leaf = NodeIndex::leaf(slot);
        let leaf_ref = KeyRef {
            id: leaf.id(),
            version: epoch,
        };
        // New keys root first, for every node on the joiner's path.
        let path_nodes: Vec<NodeIndex> = old
            .iter()
            .map(|o| o.0)
            .chain(fresh_only.iter().copied())
            .collect();
        let new_keys: Vec<Zeroizing<[u8; 32]>> =
            path_nodes.iter().map(|_| fresh_key(rng)).collect();
        let refs: Vec<KeyRef> = path_nodes
            .iter()
            .map(|x| KeyRef {
                id: x.id(),
                version: epoch,
            })
            .collect();
        let pairs: Vec<(KeyRef, &[u8; 32])> = refs
            .iter()
            .copied()
            .zip(new_keys.iter().map(|k| &**k))
            .collect();
        let j = old.len();
        let next_id = |i: usize| {
            if i + 1 < j {
                old[i + 1].0.id()
            } else {
                leaf.id()
            }
        };
        let mut messages = Vec::new();
        match strategy {
            Strategy::User => {
                for i in 0..j {
                    let item = sealer.seal(old[i].1, &old[i].2, &pairs[..=i]);
                    messages.push((
                        Recipients::HoldersExcept(old[i].0.id(), next_id(i)),
                        vec![item],
                    ));
                }
            }
            Strategy::Key | Strategy::Group => {
                let items: Vec<ItemId> = (0..j)
                    .map(|i| sealer.seal(old[i].1, &old[i].2, &pairs[i..=i]))
                    .collect();
                if strategy == Strategy::Key {
                    for i in 0..j {
                        messages.push((
                            Recipients::HoldersExcept(old[i].0.id(), next_id(i)),
                            items[..=i].to_vec(),
                        ));
                    }
                } else if j > 0 {
                    messages.push((Recipients::HoldersExcept(old[0].0.id(), leaf.id()), items));
                }
            }
        }
        let bundle = sealer.seal(leaf_ref, ind_key, &pairs);
        messages.push((Recipients::Holders(leaf.id()), vec![bundle]));
        for (x, k) in path_nodes.iter().zip(&new_keys) {
            self.set_key(*x, k, epoch);
        }
        let key_changes = path_nodes
            .iter()
            .map(|x| self.get(*x).map_or(0, |n| n.users as u64))
            .sum();
        Rekey {
            shape: self.shape(),
            group_key: self.group_key().map(|g| g.0),
            messages,
            key_changes,
        }
    }

    /// A fresh root key under the old one, for when the tree dropped levels and the new root's
    /// key would otherwise become the group key unchanged: no departed member held it, but a group
    /// key must never serve two epochs.
    fn renew_root(&mut self, sealer: &mut Sealer<'_>, rng: &mut dyn CryptoRng) -> (ItemId, u64) {
        let root = NodeIndex::root(self.height);
        let (oref, okey) = (
            self.keyref(root).expect("members"),
            *self.key(root).expect("members"),
        );
        let k = fresh_key(rng);
        let nref = KeyRef {
            id: root.id(),
            version: sealer.epoch,
        };
        let item = sealer.seal(oref, &okey, &[(nref, &k)]);
        self.set_key(root, &k, sealer.epoch);
        (item, self.users() as u64)
    }

    /// Rekeys for one leave at `slot` (paper 001 §3.4, Figs 8-9).
    pub(crate) fn leave(
        &mut self,
        slot: Slot,
        strategy: Strategy,
        sealer: &mut Sealer<'_>,
        rng: &mut dyn CryptoRng,
    ) -> Rekey {
        let d = self.degree;
        let epoch = sealer.epoch;
        self.remove_leaf(slot);
        self.shrink();
        // x_0 (root) .. x_j (leaving point): the path nodes that still have members.
        let xs: Vec<NodeIndex> = (1..=self.height)
            .rev()
            .map(|l| NodeIndex::ancestor(slot, d, l))
            .take_while(|x| self.get(*x).is_some())
            .collect();
        let new_keys: Vec<Zeroizing<[u8; 32]>> = xs.iter().map(|_| fresh_key(rng)).collect();
        let new_refs: Vec<KeyRef> = xs
            .iter()
            .map(|x| KeyRef {
                id: x.id(),
                version: epoch,
            })
            .collect();
        // L_i of Fig 9: x_i's new key under each occupied child's key, the changed child's new one.
        let mut messages = Vec::new();
        let mut chain: Vec<Option<ItemId>> = vec![None; xs.len()];
        let mut per_child: Vec<Vec<(NodeIndex, ItemId)>> = vec![Vec::new(); xs.len()];
        let mut user_items: Vec<(NodeIndex, ItemId)> = Vec::new();
        for i in (0..xs.len()).rev() {
            for c in self.occupied_children(xs[i]) {
                let changed = i + 1 < xs.len() && xs[i + 1] == c;
                if changed {
                    if strategy != Strategy::User {
                        chain[i] = Some(sealer.seal(
                            new_refs[i + 1],
                            &new_keys[i + 1],
                            &[(new_refs[i], &new_keys[i])],
                        ));
                    }
                    continue;
                }
                let (cref, ckey) = (
                    self.keyref(c).expect("occupied"),
                    *self.key(c).expect("occupied"),
                );
                if strategy == Strategy::User {
                    // {K'_i, ..., K'_0} under the unchanged child's key.
                    let keys: Vec<(KeyRef, &[u8; 32])> = (0..=i)
                        .rev()
                        .map(|k| (new_refs[k], &*new_keys[k]))
                        .collect();
                    user_items.push((c, sealer.seal(cref, &ckey, &keys)));
                } else {
                    per_child[i]
                        .push((c, sealer.seal(cref, &ckey, &[(new_refs[i], &new_keys[i])])));
                }
            }
        }
        match strategy {
            Strategy::User => {
                for (c, item) in user_items {
                    messages.push((Recipients::Holders(c.id()), vec![item]));
                }
            }
            Strategy::Key => {
                for i in (0..xs.len()).rev() {
                    for (c, item) in &per_child[i] {
                        let mut m = vec![*item];
                        m.extend((0..i).rev().map(|k| chain[k].expect("changed child")));
                        messages.push((Recipients::Holders(c.id()), m));
                    }
                }
            }
            Strategy::Group => {
                let mut all = Vec::new();
                for i in (0..xs.len()).rev() {
                    all.extend(per_child[i].iter().map(|(_, it)| *it));
                    all.extend(chain[i]);
                }
                messages.push((Recipients::All, all));
            }
        }
        for (x, k) in xs.iter().zip(&new_keys) {
            self.set_key(*x, k, epoch);
        }
        let mut key_changes = xs
            .iter()
            .map(|x| self.get(*x).map_or(0, |n| n.users as u64))
            .sum();
        if xs.is_empty() && self.users() > 0 {
            // The departed member's whole branch went with the old root; every member learns the
            // new shape and a fresh group key.
            let item;
            (item, key_changes) = self.renew_root(sealer, rng);
            messages = vec![(Recipients::All, vec![item])];
        }
        Rekey {
            shape: self.shape(),
            group_key: self.group_key().map(|g| g.0),
            messages,
            key_changes,
        }
    }

    /// Rekeys once for many joins and leaves (batch rekeying; one group-oriented message).
    /// Leaves are applied first, so joiners may take the slots just freed.
    pub(crate) fn batch(
        &mut self,
        leaves: &[Slot],
        joins: &[(Slot, [u8; 32])],
        sealer: &mut Sealer<'_>,
        rng: &mut dyn CryptoRng,
    ) -> Rekey {
        let d = self.degree;
        let epoch = sealer.epoch;
        let old_height = self.height;
        let old_root = NodeIndex::root(old_height);
        let old_root_key = self
            .keyref(old_root)
            .map(|r| (r, *self.key(old_root).expect("occupied")));
        // Marks: per node above a changed leaf, whether a departed member was below it.
        let mut departed_below: BTreeSet<NodeIndex> = BTreeSet::new();
        let mut old_keys: BTreeMap<NodeIndex, (KeyRef, Zeroizing<[u8; 32]>)> = BTreeMap::new();
        for &s in leaves {
            for x in path(s, d, self.height).skip(1) {
                departed_below.insert(x);
            }
        }
        // Remember the old keys of the nodes above joiners before anything moves.
        let joined_height = joins
            .iter()
            .map(|(s, _)| height_for(d, s.0 as u64 + 1))
            .max()
            .unwrap_or(1)
            .max(self.height);
        for (s, _) in joins {
            for l in 1..=old_height.min(joined_height) {
                let x = NodeIndex::ancestor(*s, d, l);
                if let (Some(r), Some(k)) = (self.keyref(x), self.key(x)) {
                    old_keys.entry(x).or_insert_with(|| (r, Zeroizing::new(*k)));
                }
            }
        }
        for &s in leaves {
            self.remove_leaf(s);
        }
        for (s, k) in joins {
            self.add_leaf(*s, k, epoch);
        }
        self.shrink();
        let mut changed: BTreeSet<NodeIndex> = BTreeSet::new();
        for s in leaves.iter().chain(joins.iter().map(|(s, _)| s)) {
            for l in 1..=self.height {
                let x = NodeIndex::ancestor(*s, d, l);
                if self.get(x).is_some() {
                    changed.insert(x);
                }
            }
        }
        // `grow_to` put the old members under a keyless node on every new level. Usually a joiner
        // lies below each of them; not when the joiners that would have filled a new level's first
        // branch left again before the batch, and those slots stay empty.
        for l in old_height + 1..=self.height {
            let x = NodeIndex {
                level: l,
                offset: 0,
            };
            if self.get(x).is_some() {
                changed.insert(x);
            }
        }
        let joined: BTreeSet<NodeIndex> = joins.iter().map(|(s, _)| NodeIndex::leaf(*s)).collect();
        // Bottom-up (BTreeSet orders by level first), so a child's new key exists before its parent's items.
        let mut new_keys: BTreeMap<NodeIndex, Zeroizing<[u8; 32]>> = BTreeMap::new();
        let mut items = Vec::new();
        let mut key_changes = 0u64;
        for &x in &changed {
            let k = fresh_key(rng);
            let xref = KeyRef {
                id: x.id(),
                version: epoch,
            };
            let cover = if departed_below.contains(&x) {
                None
            } else if x.level > old_height {
                // Above the old root: the members of the first node of each level share the old
                // root's key, unless one of them left; any other node there holds joiners only.
                if leaves.is_empty() && x.offset == 0 {
                    old_root_key.as_ref().map(|(r, k)| (*r, Zeroizing::new(*k)))
                } else {
                    None
                }
            } else {
                old_keys.get(&x).map(|(r, k)| (*r, k.clone()))
            };
            for c in self.occupied_children(x) {
                let child_changed = new_keys.contains_key(&c) || joined.contains(&c);
                if cover.is_some() && !child_changed {
                    continue;
                }
                let (cref, ckey) = match new_keys.get(&c) {
                    Some(nk) => (
                        KeyRef {
                            id: c.id(),
                            version: epoch,
                        },
                        **nk,
                    ),
                    None => (
                        self.keyref(c).expect("occupied"),
                        *self.key(c).expect("occupied"),
                    ),
                };
                items.push(sealer.seal(cref, &ckey, &[(xref, &k)]));
            }
            if let Some((r, ok)) = &cover {
                items.push(sealer.seal(*r, ok, &[(xref, &k)]));
            }
            key_changes += self.get(x).map_or(0, |n| n.users as u64);
            new_keys.insert(x, k);
        }
        for (x, k) in &new_keys {
            self.set_key(*x, k, epoch);
        }
        if self.users() > 0 && !changed.contains(&NodeIndex::root(self.height)) {
            let (item, changes) = self.renew_root(sealer, rng);
            items.push(item);
            key_changes += changes;
        }
        let messages = if self.users() > 0 {
            vec![(Recipients::All, items)]
        } else {
            Vec::new()
        };
        Rekey {
            shape: self.shape(),
            group_key: self.group_key().map(|g| g.0),
            messages,
            key_changes,
        }
    }

    /// Members below `ix` (0 if absent).
    pub(crate) fn slots_below_count(&self, ix: NodeIndex) -> u64 {
        self.get(ix).map_or(0, |n| n.users as u64)
    }
}

/// Most levels a saved tree may have (a degree-2 tree of `MAX_MEMBERS` members has 25).
const MAX_SAVED_LEVELS: usize = 64;

impl KeyTree {
    /// The tree as the server's saved state holds it: degree, height, then every level's nodes
    /// (key, version, members below). Secret: the caller seals it.
    pub(crate) fn write_state(&self, w: &mut conclave_wire::Writer) {
        w.u32(self.degree);
        w.u8(self.height);
        w.u32(self.levels.len() as u32);
        for level in &self.levels {
            w.u32(level.len() as u32);
            for n in level {
                w.raw(&n.key);
                w.u64(n.version);
                w.u32(n.users);
            }
        }
    }

    /// A tree from [`KeyTree::write_state`]'s bytes, checked enough that no later operation can
    /// index out of bounds or miscount: `height + 1` levels (one below a star's root), every
    /// node's member count the sum of its children's, every level holding as many members as the
    /// root (so every occupied node has its parent), and only the root occupied at the top.
    /// (Levels may be wider than their occupied nodes: they keep their length when members leave
    /// or the tree shrinks.)
    pub(crate) fn read_state(
        r: &mut conclave_wire::Reader<'_>,
        max_width: usize,
    ) -> Result<KeyTree, &'static str> {
        let bad = |_| "truncated key tree";
        let degree = r.u32("degree").map_err(bad)?;
        let height = r.u8("height").map_err(bad)?;
        let count = r.u32("levels").map_err(bad)? as usize;
        let star = degree == crate::index::STAR_DEGREE;
        if degree < 2
            || height == 0
            || (star && height != 1)
            || count != height as usize + 1
            || count > MAX_SAVED_LEVELS
        {
            return Err("key tree of a wrong shape");
        }
        let mut t = KeyTree {
            degree,
            height,
            levels: Vec::with_capacity(count),
        };
        let mut total = None;
        for l in 0..count {
            let width = r.u32("level width").map_err(bad)? as usize;
            if width > max_width || r.remaining() < width * 44 {
                return Err("key tree level too wide");
            }
            // Filled in place, so that the tree's drop wipes whatever was read if a check fails.
            t.levels.push(Vec::with_capacity(width));
            for _ in 0..width {
                let mut key = [0u8; 32];
                key.copy_from_slice(r.take(32, "key").map_err(bad)?);
                let node = Node {
                    key,
                    version: r.u64("version").map_err(bad)?,
                    users: r.u32("users").map_err(bad)?,
                };
                key.zeroize();
                // A node above the leaves (whose keys the members gave) with members and the
                // all-zero placeholder key: a batch before a fix could save one (see `batch`),
                // and anything sealed under it is open to all.
                let keyless = l > 0 && node.users > 0 && node.key.iter().all(|&b| b == 0);
                t.levels[l].push(node);
                if keyless {
                    return Err("an occupied node without a key");
                }
            }
            let (below, level) = match l {
                0 => (None, &t.levels[0]),
                _ => (Some(&t.levels[l - 1]), &t.levels[l]),
            };
            match below {
                None if level.iter().any(|n| n.users > 1) => {
                    return Err("a leaf with several members")
                }
                None => {}
                Some(below) => {
                    for (o, n) in level.iter().enumerate() {
                        let node = NodeIndex {
                            level: l as u8,
                            offset: o as u32,
                        };
                        let sum: u64 = node
                            .children(degree, below.len())
                            .map(|c| below[c].users as u64)
                            .sum();
                        if sum != n.users as u64 {
                            return Err("key tree member counts disagree");
                        }
                    }
                }
            }
            // Every occupied node has a parent: each level holds all the members.
            let members: u64 = level.iter().map(|n| n.users as u64).sum();
            if *total.get_or_insert(members) != members {
                return Err("a key tree level misses members");
            }
        }
        if t.levels[height as usize]
            .iter()
            .skip(1)
            .any(|n| n.users > 0)
        {
            return Err("a second root");
        }
        Ok(t)
    }
}
