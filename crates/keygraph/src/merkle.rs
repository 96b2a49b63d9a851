//! One signature for a batch of rekey messages (paper 001 §4, after Merkle's certified signature).
//!
//! The leaves are the messages' digests, the inner nodes digests of their two children. A
//! message's digest covers its header and the digests of its items, so an item that several
//! messages share (key-oriented rekeying repeats the upper keys' items in every message) is hashed
//! once; this halves the hashing of a key-oriented leave. Every digest starts with a byte telling
//! what it is a digest of (the paper's MD5 scheme had no such prefix; without one a leaf could pose
//! as an inner node). A level with an odd
//! count carries its last node up unchanged, so an authentication path skips that level; the
//! verifier learns which levels to skip from the leaf's index and the leaf count, both signed
//! through the root. The server signs `"conclave lkh batch v1" || leaf count || root`.

use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

/// The digest of one encoded item.
pub fn item_digest(item: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([2u8]);
    h.update(item);
    h.finalize().into()
}

/// The digest of a message: its header (the authenticated bytes before the items) and its items'
/// digests in order.
pub fn message_digest<'a>(header: &[u8], items: impl IntoIterator<Item = &'a Hash>) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(header);
    for d in items {
        h.update(d);
    }
    h.finalize().into()
}

/// The digest of a decoded message, as its receiver computes it.
pub fn digest_of(msg: &conclave_wire::lkh::RekeyMessage, body: &[u8]) -> Hash {
    let items_len: usize = msg.items.iter().map(|i| i.encoded_len()).sum();
    let header = &body[..body.len() - items_len];
    let digests: Vec<Hash> = msg
        .items
        .iter()
        .map(|it| {
            let mut w = conclave_wire::Writer::with_capacity(it.encoded_len());
            it.write(&mut w);
            item_digest(w.as_slice())
        })
        .collect();
    message_digest(header, &digests)
}

fn node_hash(l: &Hash, r: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(l);
    h.update(r);
    h.finalize().into()
}

/// What the server signs for a batch.
pub fn signed_root(leaf_count: u32, root: &Hash) -> Vec<u8> {
    let mut m = b"conclave lkh batch v1".to_vec();
    m.extend_from_slice(&leaf_count.to_be_bytes());
    m.extend_from_slice(root);
    m
}

/// What the server signs for a message signed alone.
pub fn signed_message(digest: &Hash) -> Vec<u8> {
    let mut m = b"conclave lkh message v1".to_vec();
    m.extend_from_slice(digest);
    m
}

/// A Merkle tree over a batch of leaves.
pub struct MerkleTree {
    levels: Vec<Vec<Hash>>,
}

impl MerkleTree {
    /// Builds the tree; `leaves` must not be empty.
    pub fn new(leaves: Vec<Hash>) -> MerkleTree {
        assert!(!leaves.is_empty(), "a batch has at least one message");
        let mut levels = vec![leaves];
        while levels.last().map_or(0, Vec::len) > 1 {
            let below = levels.last().expect("non-empty");
            let mut up = Vec::with_capacity(below.len().div_ceil(2));
            for pair in below.chunks(2) {
                up.push(match pair {
                    [l, r] => node_hash(l, r),
                    [only] => *only,
                    _ => unreachable!("chunks of two"),
                });
            }
            levels.push(up);
        }
        MerkleTree { levels }
    }
    pub fn root(&self) -> Hash {
        self.levels.last().expect("non-empty")[0]
    }
    pub fn leaf_count(&self) -> usize {
        self.levels[0].len()
    }
    /// The sibling digests from leaf `index` up.
    pub fn path(&self, index: usize) -> Vec<Hash> {
        let mut out = Vec::with_capacity(self.levels.len());
        let mut i = index;
        for level in &self.levels[..self.levels.len() - 1] {
            let sib = i ^ 1;
            if sib < level.len() {
                out.push(level[sib]);
            }
            i /= 2;
        }
        out
    }
}

/// The root a leaf and its path lead to, or `None` if the path does not fit the index and count.
pub fn root_from_path(leaf: Hash, index: u32, count: u32, path: &[Hash]) -> Option<Hash> {
    if index >= count {
        return None;
    }
    let (mut i, mut n, mut h) = (index as u64, count as u64, leaf);
    let mut siblings = path.iter();
    while n > 1 {
        let sib = i ^ 1;
        if sib < n {
            let s = siblings.next()?;
            h = if i % 2 == 0 {
                node_hash(&h, s)
            } else {
                node_hash(s, &h)
            };
        }
        i /= 2;
        n = n.div_ceil(2);
    }
    siblings.next().is_none().then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_leaf_proves_the_root_and_nothing_else_does() {
        for count in 1..40u32 {
            let leaves: Vec<Hash> = (0..count).map(|i| item_digest(&i.to_be_bytes())).collect();
            let t = MerkleTree::new(leaves.clone());
            for (i, leaf) in leaves.iter().enumerate() {
                let p = t.path(i);
                assert_eq!(root_from_path(*leaf, i as u32, count, &p), Some(t.root()));
                let other = item_digest(b"forged");
                assert_ne!(root_from_path(other, i as u32, count, &p), Some(t.root()));
                if count > 1 {
                    let j = (i as u32 + 1) % count;
                    assert_ne!(root_from_path(*leaf, j, count, &p), Some(t.root()));
                }
                let mut longer = p.clone();
                longer.push([0; 32]);
                assert_eq!(root_from_path(*leaf, i as u32, count, &longer), None);
            }
            assert_eq!(root_from_path(leaves[0], count, count, &[]), None);
        }
    }
}
