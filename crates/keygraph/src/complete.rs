//! Complete key graphs (paper 001 §2.2): one key for every non-empty subset of the members.
//!
//! Practical only for a handful of members (each holds `2^(n-1)` keys), so the graph is limited to
//! [`MAX_COMPLETE_MEMBERS`]. A key's id is its member set as a bit mask over slots. A join gives
//! every subset that gains the joiner a new key, sent to the old subset under its own key and to
//! the joiner in one bundle under its individual key; a leave deletes every key the leaver held and
//! sends no key at all, since the remaining members already share the key of their set.
//!
//! The paper tabulates only the costs of complete graphs (Table 2, from its report [21]), not
//! their messages. Exactly, with `n` members before a join, the server encrypts `2^(n+1) - 2` keys
//! (Table 2 rounds to `2^(n+1)`), the joiner decrypts `2^n - 1` (Table 2: `2^n`) and every other
//! member `2^(n-1)`. Each new key has its own old key, so key- and user-oriented rekeying coincide
//! here: one message per old member with the items it needs; group-oriented sends one multicast.

use crate::index::Slot;
use crate::seal::{ItemId, Sealer};
use crate::tree::Rekey;
use crate::Strategy;
use conclave_crypto::CryptoRng;
use conclave_wire::lkh::{GraphShape, KeyRef, Recipients};
use zeroize::{Zeroize, Zeroizing};

/// Most members of a complete key graph (the joiner's bundle then holds 4,095 keys).
pub const MAX_COMPLETE_MEMBERS: usize = 12;

#[derive(Clone, Default)]
struct Entry {
    key: [u8; 32],
    version: u64,
    live: bool,
}

pub struct CompleteGraph {
    members: u64,
    keys: Vec<Entry>,
}

impl Drop for CompleteGraph {
    fn drop(&mut self) {
        for e in &mut self.keys {
            e.key.zeroize();
        }
    }
}

impl core::fmt::Debug for CompleteGraph {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "CompleteGraph(members {:#x}, keys redacted)",
            self.members
        )
    }
}

/// Non-empty subsets of `mask`.
fn subsets(mask: u64) -> impl Iterator<Item = u64> {
    let mut s = mask;
    let mut done = mask == 0;
    core::iter::from_fn(move || {
        if done {
            return None;
        }
        let cur = s;
        s = (s.wrapping_sub(1)) & mask;
        if s == 0 {
            done = true;
        }
        Some(cur)
    })
}

impl Default for CompleteGraph {
    fn default() -> Self {
        CompleteGraph {
            members: 0,
            keys: vec![Entry::default(); 1 << MAX_COMPLETE_MEMBERS],
        }
    }
}

impl CompleteGraph {
    pub fn members(&self) -> u64 {
        self.members
    }
    pub fn users(&self) -> u32 {
        self.members.count_ones()
    }
    fn get(&self, mask: u64) -> Option<(KeyRef, &[u8; 32])> {
        let e = self.keys.get(mask as usize).filter(|e| e.live)?;
        Some((
            KeyRef {
                id: mask,
                version: e.version,
            },
            &e.key,
        ))
    }
    pub fn group_key(&self) -> Option<(KeyRef, &[u8; 32])> {
        self.get(self.members)
    }
    pub(crate) fn shape(&self) -> GraphShape {
        GraphShape::Complete {
            members: self.members,
        }
    }
    pub(crate) fn member_keys(&self, slot: Slot) -> Vec<(KeyRef, [u8; 32])> {
        let bit = 1u64 << slot.0;
        subsets(self.members)
            .filter(|s| s & bit != 0)
            .filter_map(|s| self.get(s).map(|(r, k)| (r, *k)))
            .collect()
    }
    pub(crate) fn leaf_key(&self, slot: Slot) -> Option<[u8; 32]> {
        self.get(1 << slot.0).map(|(_, k)| *k)
    }
    pub fn heap_bytes(&self) -> usize {
        self.keys.capacity() * core::mem::size_of::<Entry>()
    }

    pub(crate) fn join(
        &mut self,
        slot: Slot,
        ind_key: &[u8; 32],
        strategy: Strategy,
        sealer: &mut Sealer<'_>,
        rng: &mut dyn CryptoRng,
    ) -> Rekey {
        assert!((slot.0 as usize) < MAX_COMPLETE_MEMBERS);
        let bit = 1u64 << slot.0;
        let epoch = sealer.epoch;
        let old = self.members;
        let olds: Vec<u64> = subsets(old).collect();
        let new_keys: Vec<Zeroizing<[u8; 32]>> = olds
            .iter()
            .map(|_| {
                let mut k = Zeroizing::new([0u8; 32]);
                rng.fill_bytes(&mut k[..]);
                k
            })
            .collect();
        let new_refs: Vec<KeyRef> = olds
            .iter()
            .map(|s| KeyRef {
                id: s | bit,
                version: epoch,
            })
            .collect();
        let items: Vec<ItemId> = olds
            .iter()
            .zip(new_refs.iter().zip(&new_keys))
            .map(|(s, (r, k))| {
                let (oref, okey) = self.get(*s).expect("live subset key");
                let okey = *okey;
                sealer.seal(oref, &okey, &[(*r, k)])
            })
            .collect();
        let mut messages = Vec::new();
        match strategy {
            Strategy::Group => {
                if old != 0 {
                    messages.push((Recipients::Holders(old), items));
                }
            }
            Strategy::Key | Strategy::User => {
                for v in 0..MAX_COMPLETE_MEMBERS as u32 {
                    let vb = 1u64 << v;
                    if old & vb == 0 {
                        continue;
                    }
                    let mine: Vec<ItemId> = olds
                        .iter()
                        .zip(&items)
                        .filter(|(s, _)| *s & vb != 0)
                        .map(|(_, it)| *it)
                        .collect();
                    messages.push((Recipients::Holders(vb), mine));
                }
            }
        }
        let leaf_ref = KeyRef {
            id: bit,
            version: epoch,
        };
        let pairs: Vec<(KeyRef, &[u8; 32])> = new_refs
            .iter()
            .copied()
            .zip(new_keys.iter().map(|k| &**k))
            .collect();
        if pairs.is_empty() {
            messages.push((Recipients::Holders(bit), Vec::new()));
        } else {
            let bundle = sealer.seal(leaf_ref, ind_key, &pairs);
            messages.push((Recipients::Holders(bit), vec![bundle]));
        }
        self.keys[bit as usize] = Entry {
            key: *ind_key,
            version: epoch,
            live: true,
        };
        for (r, k) in new_refs.iter().zip(&new_keys) {
            self.keys[r.id as usize] = Entry {
                key: **k,
                version: epoch,
                live: true,
            };
        }
        self.members |= bit;
        let n = old.count_ones() as u64;
        let key_changes = if n == 0 {
            0
        } else {
            n * (1 << (n - 1)) + (1 << n) - 1
        };
        Rekey {
            shape: self.shape(),
            group_key: self.group_key().map(|g| g.0),
            messages,
            key_changes,
        }
    }

    pub(crate) fn leave(&mut self, slot: Slot) -> Rekey {
        let bit = 1u64 << slot.0;
        for s in subsets(self.members).filter(|s| s & bit != 0) {
            let e = &mut self.keys[s as usize];
            e.key.zeroize();
            e.live = false;
        }
        self.members &= !bit;
        let messages = if self.members != 0 {
            vec![(Recipients::All, Vec::new())]
        } else {
            Vec::new()
        };
        Rekey {
            shape: self.shape(),
            group_key: self.group_key().map(|g| g.0),
            messages,
            key_changes: 0,
        }
    }

    pub(crate) fn holders(&self, mask: u64) -> u64 {
        (mask & self.members).count_ones() as u64
    }
}

impl CompleteGraph {
    /// Whether the members are exactly the slots `occupied` says, and every subset of them has
    /// its key (what a restored graph must be before any operation).
    pub(crate) fn consistent(&self, occupied: impl Fn(usize) -> bool) -> bool {
        (0..MAX_COMPLETE_MEMBERS).all(|i| (self.members >> i & 1 == 1) == occupied(i))
            && subsets(self.members).all(|s| self.keys[s as usize].live)
    }

    /// The graph as the server's saved state holds it. Secret: the caller seals it.
    pub(crate) fn write_state(&self, w: &mut conclave_wire::Writer) {
        w.u64(self.members);
        w.u32(self.keys.len() as u32);
        for e in &self.keys {
            w.raw(&e.key);
            w.u64(e.version);
            w.u8(e.live as u8);
        }
    }

    pub(crate) fn read_state(
        r: &mut conclave_wire::Reader<'_>,
    ) -> Result<CompleteGraph, &'static str> {
        let bad = |_| "truncated complete graph";
        let members = r.u64("members").map_err(bad)?;
        let count = r.u32("keys").map_err(bad)? as usize;
        if members >> MAX_COMPLETE_MEMBERS != 0 || count != 1 << MAX_COMPLETE_MEMBERS {
            return Err("complete graph of a wrong size");
        }
        // Filled in place, so that the graph's drop wipes whatever was read if a check fails.
        let mut g = CompleteGraph {
            members,
            keys: Vec::with_capacity(count),
        };
        for _ in 0..count {
            let mut key = [0u8; 32];
            key.copy_from_slice(r.take(32, "key").map_err(bad)?);
            let entry_key = key;
            key.zeroize();
            let version = r.u64("version").map_err(bad)?;
            let live = match r.u8("live").map_err(bad)? {
                0 => false,
                1 => true,
                _ => return Err("complete graph entry flag"),
            };
            g.keys.push(Entry {
                key: entry_key,
                version,
                live,
            });
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::subsets;
    #[test]
    fn subsets_enumerates_each_once() {
        let v: Vec<u64> = subsets(0b1011).collect();
        assert_eq!(v.len(), 7);
        assert!(subsets(0).next().is_none());
    }
}
