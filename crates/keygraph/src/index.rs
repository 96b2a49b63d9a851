//! Key tree arithmetic, kept apart from keys and members.
//!
//! A key tree here is laid out by level from the bottom: level 0 holds the individual keys, one
//! per member slot, and node `(l, o)` has parent `(l + 1, o / d)`. Every member sits at the same
//! depth, the tree grows by adding a root above the old one and shrinks by removing it, and no
//! index ever moves when it does: a member's path is a function of its slot, the degree and the
//! height alone, which both the server and the member compute.

/// A member's place among the leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(pub u32);

/// A k-node of a key tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeIndex {
    pub level: u8,
    pub offset: u32,
}

/// The degree of a star key graph: a tree of height 1 whose root takes every member.
pub const STAR_DEGREE: u32 = u32::MAX;

impl NodeIndex {
    pub fn leaf(slot: Slot) -> NodeIndex {
        NodeIndex {
            level: 0,
            offset: slot.0,
        }
    }
    pub fn root(height: u8) -> NodeIndex {
        NodeIndex {
            level: height,
            offset: 0,
        }
    }
    pub fn parent(self, degree: u32) -> NodeIndex {
        NodeIndex {
            level: self.level + 1,
            offset: self.offset / degree,
        }
    }
    /// The offsets (one level down) of this node's children, clipped to `len` allocated nodes.
    pub fn children(self, degree: u32, len: usize) -> core::ops::Range<usize> {
        debug_assert!(self.level > 0);
        let first = self.offset as u64 * degree as u64;
        let end = first.saturating_add(degree as u64).min(len as u64);
        (first.min(len as u64) as usize)..(end as usize)
    }
    /// The wire id of this k-node.
    pub fn id(self) -> u64 {
        (self.level as u64) << 32 | self.offset as u64
    }
    pub fn from_id(id: u64) -> Option<NodeIndex> {
        let level = id >> 32;
        if level > u8::MAX as u64 {
            return None;
        }
        Some(NodeIndex {
            level: level as u8,
            offset: id as u32,
        })
    }
    /// The ancestor of `slot` at `level`.
    pub fn ancestor(slot: Slot, degree: u32, level: u8) -> NodeIndex {
        let mut o = slot.0 as u64;
        for _ in 0..level {
            o /= degree as u64;
        }
        NodeIndex {
            level,
            offset: o as u32,
        }
    }
}

/// The path of `slot` from its leaf to the root of a tree of `height`: `height + 1` nodes.
pub fn path(slot: Slot, degree: u32, height: u8) -> impl Iterator<Item = NodeIndex> {
    let mut next = Some(NodeIndex::leaf(slot));
    core::iter::from_fn(move || {
        let cur = next?;
        next = (cur.level < height).then(|| cur.parent(degree));
        Some(cur)
    })
}

/// Leaves a tree of `degree` and `height` can hold.
pub fn capacity(degree: u32, height: u8) -> u64 {
    let mut c: u64 = 1;
    for _ in 0..height {
        c = c.saturating_mul(degree as u64);
    }
    c
}

/// The least height (at least 1) whose tree holds slots `0..slots`.
pub fn height_for(degree: u32, slots: u64) -> u8 {
    let mut h = 1;
    while capacity(degree, h) < slots {
        h += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_heights() {
        assert_eq!(height_for(4, 1), 1);
        assert_eq!(height_for(4, 4), 1);
        assert_eq!(height_for(4, 5), 2);
        assert_eq!(height_for(4, 1 << 20), 10);
        assert_eq!(height_for(STAR_DEGREE, 1 << 24), 1);
        let p: Vec<_> = path(Slot(9), 3, 2).collect();
        assert_eq!(
            p,
            vec![
                NodeIndex {
                    level: 0,
                    offset: 9
                },
                NodeIndex {
                    level: 1,
                    offset: 3
                },
                NodeIndex {
                    level: 2,
                    offset: 1
                },
            ]
        );
        assert_eq!(
            NodeIndex::ancestor(Slot(9), 3, 2),
            NodeIndex {
                level: 2,
                offset: 1
            }
        );
        let n = NodeIndex {
            level: 3,
            offset: 77,
        };
        assert_eq!(NodeIndex::from_id(n.id()), Some(n));
        assert_eq!(
            NodeIndex {
                level: 1,
                offset: 2
            }
            .children(4, 10),
            8..10
        );
        assert_eq!(NodeIndex::root(1).children(STAR_DEGREE, 5), 0..5);
    }
}
