//! Sets of member names as the protocols consult them: built once per view, shared by `Arc`, and
//! looked up by hashing. At n = 1,024 a view is installed by every member at every event, so a
//! set that compares names along a search tree, or is rebuilt from owned names each time it
//! changes hands, costs more than the event's exponentiations.

use crate::api::MemberId;
use std::collections::HashMap;
use std::sync::Arc;

/// A set of members, each with its position in the view the set was built from.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub(crate) struct MemberSet(HashMap<MemberId, usize>);

/// The shared form every protocol holds.
pub(crate) type Members = Arc<MemberSet>;

impl MemberSet {
    /// A view's members with their positions; `None` if a name repeats.
    pub fn of_view(members: &[MemberId]) -> Option<Self> {
        let mut map = HashMap::with_capacity(members.len());
        for (i, m) in members.iter().enumerate() {
            if map.insert(m.clone(), i).is_some() {
                return None;
            }
        }
        Some(MemberSet(map))
    }
    /// Just `me`.
    pub fn single(me: &str) -> Self {
        MemberSet(HashMap::from([(me.to_owned(), 0)]))
    }
    /// The members `keep` accepts.
    pub fn filtered(&self, keep: impl Fn(&str) -> bool) -> Self {
        MemberSet(
            self.0
                .iter()
                .filter(|(m, _)| keep(m))
                .map(|(m, &i)| (m.clone(), i))
                .collect(),
        )
    }
    pub fn contains(&self, m: &str) -> bool {
        self.0.contains_key(m)
    }
    /// `m`'s position in the view this set was built from.
    pub fn position(&self, m: &str) -> Option<usize> {
        self.0.get(m).copied()
    }
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Adds `m` (at position 0 if it is new: a position is only read from a view's own set).
    pub fn insert(&mut self, m: &str) {
        if !self.0.contains_key(m) {
            self.0.insert(m.to_owned(), 0);
        }
    }
}

#[cfg(test)]
impl<S: AsRef<str>> FromIterator<S> for MemberSet {
    /// Members in the order given, as if they were a view.
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        MemberSet(
            iter.into_iter()
                .enumerate()
                .map(|(i, m)| (m.as_ref().to_owned(), i))
                .collect(),
        )
    }
}
