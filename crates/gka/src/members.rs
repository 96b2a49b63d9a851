//! Sets of member names as the protocols consult them: built once per view, shared by `Arc`, and
//! looked up by hashing. At n = 1,024 a view is installed by every member at every event, so a
//! set that compares names along a search tree, or copies every name it holds, costs more than
//! the event's exponentiations. A set is a table of positions into a list of names it shares
//! with the view: building one allocates no name.

use crate::api::MemberId;
use foldhash::fast::RandomState;
use hashbrown::HashTable;
use std::hash::BuildHasher;
use std::sync::Arc;

/// A set of members, each with its position in the view the set was built from.
#[derive(Clone, Default)]
pub(crate) struct MemberSet {
    /// The view's names (or a single name); the set holds the positions in `table`.
    names: Arc<[MemberId]>,
    table: HashTable<u32>,
    /// Seeded at random (per process from the operating system, and per set): names are chosen
    /// by clients, so their hashes must not be predictable. foldhash rather than SipHash: a
    /// member hashes every name of the view at each view change (at n = 1,024, thousands of
    /// hashes of short names), and SipHash made that a large share of a join's work. foldhash
    /// does not claim to withstand an attacker who can watch its timing and choose names until
    /// they collide; such names would cost at worst `MAX_MEMBERS`² comparisons per set built.
    hasher: RandomState,
}

/// The shared form every protocol holds.
pub(crate) type Members = Arc<MemberSet>;

impl MemberSet {
    /// A view's members with their positions; `None` if a name repeats.
    pub fn of_view(members: &Arc<[MemberId]>) -> Option<Self> {
        let mut set = MemberSet {
            names: members.clone(),
            table: HashTable::with_capacity(members.len()),
            hasher: RandomState::default(),
        };
        for i in 0..members.len() {
            if !set.add(i as u32) {
                return None;
            }
        }
        Some(set)
    }
    /// Just `me`.
    pub fn single(me: &str) -> Self {
        Self::of_view(&Arc::from([me.to_owned()])).expect("one name")
    }
    /// Adds the name at position `i` of `names`; false if it was there.
    fn add(&mut self, i: u32) -> bool {
        let names = &self.names;
        let hasher = &self.hasher;
        let name = names[i as usize].as_str();
        let hash = hasher.hash_one(name);
        match self.table.entry(
            hash,
            |&j| names[j as usize] == name,
            |&j| hasher.hash_one(names[j as usize].as_str()),
        ) {
            hashbrown::hash_table::Entry::Occupied(_) => false,
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(i);
                true
            }
        }
    }
    /// True if every member of this set is in `list`, found by walking both in order, without a
    /// lookup per name: when the set holds its whole list of names and `list` keeps their order
    /// (a view's transitional set lists the members of the view before in that view's order,
    /// and the side is that view's whole set after a completed run). False when the walk cannot
    /// tell, whatever the answer.
    pub fn in_order_within(&self, list: &[MemberId]) -> bool {
        self.is_whole_list() && in_order(&self.names, list, |_| {})
    }
    /// True when the set holds every name of its list: the whole view it was built from.
    pub fn is_whole_list(&self) -> bool {
        self.table.len() == self.names.len()
    }
    /// The list of names the set's positions refer to.
    pub fn names(&self) -> &[MemberId] {
        &self.names
    }
    /// The members at the positions `keep` accepts, found without hashing a name.
    pub fn filtered_by_position(&self, keep: impl Fn(usize) -> bool) -> Self {
        let mut table = self.table.clone();
        table.retain(|&mut i| keep(i as usize));
        MemberSet {
            names: self.names.clone(),
            table,
            hasher: self.hasher.clone(),
        }
    }
    /// The members `keep` accepts, with their positions.
    pub fn filtered(&self, keep: impl Fn(&str) -> bool) -> Self {
        let mut table = self.table.clone();
        table.retain(|&mut i| keep(&self.names[i as usize]));
        MemberSet {
            names: self.names.clone(),
            table,
            hasher: self.hasher.clone(),
        }
    }
    pub fn contains(&self, m: &str) -> bool {
        self.position(m).is_some()
    }
    /// `m`'s position in the view this set was built from.
    pub fn position(&self, m: &str) -> Option<usize> {
        self.table
            .find(self.hasher.hash_one(m), |&i| self.names[i as usize] == m)
            .map(|&i| i as usize)
    }
    /// True if every member of this set is one that `other` accepts.
    pub fn all(&self, other: impl Fn(&str) -> bool) -> bool {
        self.table.iter().all(|&i| other(&self.names[i as usize]))
    }
    pub fn len(&self) -> usize {
        self.table.len()
    }
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
    /// Adds `m`. A name the shared list lacks is appended to a copy of it (at a position past the
    /// view's: a position is only read from a view's own set).
    pub fn insert(&mut self, m: &str) {
        if self.contains(m) {
            return;
        }
        let at = match self.names.iter().position(|x| x == m) {
            Some(i) => i,
            None => {
                let mut names = self.names.to_vec();
                names.push(m.to_owned());
                self.names = names.into();
                self.names.len() - 1
            }
        };
        self.add(at as u32);
    }
}

/// A set of positions in a view, with its size: members named by where they stand rather than
/// by name, so that building, checking and dropping one hashes and frees no name.
#[derive(Clone, Default)]
pub(crate) struct Positions {
    at: Vec<bool>,
    count: usize,
}

impl Positions {
    pub fn contains(&self, i: usize) -> bool {
        self.at.get(i).copied().unwrap_or(false)
    }
    pub fn len(&self) -> usize {
        self.count
    }
    /// Adds (`on`) or removes the positions `all` of a view of `n` members (each below `n`).
    pub fn set(&mut self, all: &[usize], on: bool, n: usize) {
        self.at.resize(n, false);
        for &i in all {
            if std::mem::replace(&mut self.at[i], on) != on {
                if on {
                    self.count += 1;
                } else {
                    self.count -= 1;
                }
            }
        }
    }
}

/// Walks `within` once, finding each name of `names` in turn after the last one found, and calls
/// `found` with its position; false, having stopped, at the first name not found so.
pub(crate) fn in_order(
    names: &[MemberId],
    within: &[MemberId],
    mut found: impl FnMut(usize),
) -> bool {
    let mut at = 0;
    for name in names {
        match within[at..].iter().position(|m| m == name) {
            Some(i) => {
                found(at + i);
                at += i + 1;
            }
            None => return false,
        }
    }
    true
}

impl std::fmt::Debug for MemberSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self
            .table
            .iter()
            .map(|&i| self.names[i as usize].as_str())
            .collect();
        names.sort_unstable();
        f.debug_set().entries(names).finish()
    }
}

/// Equal when they hold the same names, whatever their positions.
impl PartialEq for MemberSet {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.all(|m| other.contains(m))
    }
}
impl Eq for MemberSet {}

#[cfg(test)]
impl<S: AsRef<str>> FromIterator<S> for MemberSet {
    /// Members in the order given, as if they were a view.
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let names: Vec<MemberId> = iter.into_iter().map(|m| m.as_ref().to_owned()).collect();
        Self::of_view(&names.into()).expect("distinct names")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> MemberSet {
        names.iter().collect()
    }

    #[test]
    fn positions_are_those_of_the_view() {
        let s = set(&["c", "a", "b"]);
        assert_eq!(s.position("c"), Some(0));
        assert_eq!(s.position("b"), Some(2));
        assert_eq!(s.position("d"), None);
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn a_walk_in_order_finds_a_subsequence_and_nothing_else() {
        let list: Vec<MemberId> = ["a", "b", "c", "d"].iter().map(|m| m.to_string()).collect();
        let names = |ms: &[&str]| -> Vec<MemberId> { ms.iter().map(|m| m.to_string()).collect() };
        let mut at = Vec::new();
        assert!(in_order(&names(&["b", "d"]), &list, |i| at.push(i)));
        assert_eq!(at, [1, 3]);
        // Out of order, repeated or absent: the walk cannot tell.
        for ms in [&["d", "b"][..], &["b", "b"], &["b", "x"]] {
            assert!(!in_order(&names(ms), &list, |_| {}));
        }
        assert!(set(&["a", "c"]).in_order_within(&list));
        assert!(!set(&["c", "a"]).in_order_within(&list));
        // A filtered set does not hold its whole list: the caller looks each name up.
        assert!(!set(&["a", "x", "c"])
            .filtered(|m| m != "x")
            .in_order_within(&list));
    }

    #[test]
    fn a_repeated_name_is_refused() {
        let names: Arc<[MemberId]> = vec!["a".into(), "b".into(), "a".into()].into();
        assert!(MemberSet::of_view(&names).is_none());
    }

    #[test]
    fn filtered_keeps_positions_and_insert_adds_any_name() {
        let s = set(&["a", "b", "c", "d"]);
        let mut f = s.filtered(|m| m != "b" && m != "c");
        assert_eq!(f.len(), 2);
        assert!(!f.contains("b"));
        assert_eq!(f.position("d"), Some(3));
        f.insert("b");
        f.insert("b");
        f.insert("z");
        assert_eq!(f.len(), 4);
        assert!(f.contains("b") && f.contains("z"));
        assert!(f.all(|m| m != "c"));
        assert_eq!(f, set(&["z", "d", "b", "a"]));
        assert_ne!(f, s);
        assert_eq!(format!("{:?}", MemberSet::single("x")), r#"{"x"}"#);
    }
}
