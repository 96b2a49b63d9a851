//! The secure groups of one session, by name.
//!
//! A member in hundreds of groups looks one up at every event, and at a configuration change
//! every one of them at once, each cold in the cache. Each group's state is boxed so the table
//! itself stays small, and the table is keyed by the name the state holds, so a lookup's one
//! comparison reads the memory the event's handling reads next, not a key copy elsewhere.

use conclave_secure::SecureGroup;
use hashbrown::HashTable;
use std::hash::BuildHasher;

#[derive(Default)]
pub(crate) struct GroupTable {
    table: HashTable<Box<SecureGroup>>,
    hasher: foldhash::fast::RandomState,
}

impl GroupTable {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&SecureGroup> {
        let h = self.hash(name);
        self.table.find(h, |g| g.group() == name).map(|g| &**g)
    }

    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut SecureGroup> {
        let h = self.hash(name);
        self.table
            .find_mut(h, |g| g.group() == name)
            .map(|g| &mut **g)
    }

    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Adds `g`, in place of any group of the same name.
    pub(crate) fn insert(&mut self, g: SecureGroup) {
        let h = self.hash(g.group());
        let hasher = &self.hasher;
        match self.table.entry(
            h,
            |x| x.group() == g.group(),
            |x| hasher.hash_one(x.group()),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut o) => **o.get_mut() = g,
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(Box::new(g));
            }
        }
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<SecureGroup> {
        let h = self.hash(name);
        match self.table.find_entry(h, |g| g.group() == name) {
            Ok(o) => Some(*o.remove().0),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_crypto::{Identity, SigScheme};
    use conclave_secure::SecureConfig;

    fn group(name: &str) -> SecureGroup {
        let id = Identity::generate(SigScheme::Ed25519, &mut rand_core::OsRng).unwrap();
        SecureGroup::join(
            name,
            "me",
            id,
            Default::default(),
            SecureConfig::default(),
            Box::new(rand_core::OsRng),
        )
    }

    #[test]
    fn groups_are_found_replaced_and_removed_by_name() {
        let mut t = GroupTable::default();
        for i in 0..300 {
            t.insert(group(&format!("g{i}")));
        }
        assert!(t.contains_key("g0") && t.contains_key("g299") && !t.contains_key("g300"));
        assert_eq!(
            t.get_mut("g42").map(|g| g.group().to_owned()),
            Some("g42".into())
        );
        t.insert(group("g42"));
        assert_eq!(
            t.table.len(),
            300,
            "a group of the same name replaces the old one"
        );
        assert_eq!(
            t.remove("g42").map(|g| g.group().to_owned()),
            Some("g42".into())
        );
        assert!(t.get("g42").is_none() && t.remove("g42").is_none());
        assert_eq!(t.table.len(), 299);
    }
}
