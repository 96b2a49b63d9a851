//! The messages a ring member holds, by sequence number.
//!
//! The numbers held lie in a window a little wider than the ring's own (from the oldest message
//! not yet everywhere to the horizon past the member's `aru`), and nearly every number in it is
//! held. So they are kept in a ring buffer indexed by number rather than a search tree: a
//! message is put in, found and dropped in constant time, with no allocation per message.

use std::collections::VecDeque;

/// Values by sequence number, each at most once.
pub(crate) struct SeqBuffer<T> {
    /// The number of `slots[0]`; nothing below it is held.
    base: u64,
    slots: VecDeque<Option<T>>,
    len: usize,
}

impl<T> Default for SeqBuffer<T> {
    fn default() -> Self {
        SeqBuffer {
            base: 0,
            slots: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> SeqBuffer<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn index(&self, seq: u64) -> Option<usize> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        (i < self.slots.len()).then_some(i)
    }

    pub(crate) fn get(&self, seq: u64) -> Option<&T> {
        self.slots[self.index(seq)?].as_ref()
    }

    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.get(seq).is_some()
    }

    /// Holds `value` at `seq`, unless something is held there already. A number below what was
    /// dropped is not held again (the caller has delivered it). The caller bounds how far ahead
    /// `seq` may be: the slots up to it are made.
    pub(crate) fn insert(&mut self, seq: u64, value: T) {
        let Some(Ok(i)) = seq.checked_sub(self.base).map(usize::try_from) else {
            return;
        };
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || None);
        }
        if self.slots[i].is_none() {
            self.slots[i] = Some(value);
            self.len += 1;
        }
    }

    /// Drops everything numbered below `seq`; nothing below it is held again.
    pub(crate) fn drop_below(&mut self, seq: u64) {
        while self.base < seq {
            match self.slots.pop_front() {
                Some(slot) => {
                    if slot.is_some() {
                        self.len -= 1;
                    }
                    self.base += 1;
                }
                None => {
                    self.base = seq;
                    break;
                }
            }
        }
    }

    /// What is held from `seq` on, in order.
    pub(crate) fn from(&self, seq: u64) -> impl Iterator<Item = (u64, &T)> + '_ {
        let skip = seq.saturating_sub(self.base);
        let base = self.base;
        self.slots
            .iter()
            .enumerate()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
            .filter_map(move |(i, v)| Some((base + i as u64, v.as_ref()?)))
    }

    /// The highest number held.
    pub(crate) fn last(&self) -> Option<u64> {
        let i = self.slots.iter().rposition(Option::is_some)?;
        Some(self.base + i as u64)
    }

    /// Drops everything; later numbers may still come.
    pub(crate) fn clear(&mut self) {
        self.base += self.slots.len() as u64;
        self.slots.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Against a map, under a random mix of what the ring does to its buffer.
    #[test]
    fn behaves_as_a_map_of_the_numbers_held() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut b = SeqBuffer::default();
        let mut m = BTreeMap::new();
        let mut floor = 0u64;
        for step in 0..20_000u64 {
            match next(10) {
                0..=5 => {
                    let s = floor.saturating_sub(3) + next(40);
                    b.insert(s, step);
                    if s >= floor {
                        m.entry(s).or_insert(step);
                    }
                }
                6..=7 => {
                    floor += next(8);
                    b.drop_below(floor);
                    m.retain(|&s, _| s >= floor);
                }
                8 => {
                    let from = floor + next(20);
                    let got: Vec<_> = b.from(from).map(|(s, v)| (s, *v)).collect();
                    let want: Vec<_> = m.range(from..).map(|(s, v)| (*s, *v)).collect();
                    assert_eq!(got, want);
                }
                _ => {
                    if next(50) == 0 {
                        if let Some(l) = b.last() {
                            floor = floor.max(l + 1);
                        }
                        b.clear();
                        m.clear();
                    }
                }
            }
            assert_eq!(b.len(), m.len());
            assert_eq!(b.last(), m.last_key_value().map(|(s, _)| *s));
            let probe = floor.saturating_sub(2) + next(45);
            assert_eq!(b.get(probe), m.get(&probe));
        }
    }
}
