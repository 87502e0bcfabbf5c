//! Record-less successes: the direct runs (`slots.rs`) that succeeded with a unit output,
//! remembered by id range instead of one record each.
//!
//! A success is all a direct run's ending needs to leave behind: its state (succeeded), its
//! type (for `info` and listings; every other detail of a direct task is its type's), and its
//! place in retention. So the store keeps, per range of [`RANGE`] consecutive ids, one type
//! index per id (`NONE` where the id is not a record-less success), and lists each success in
//! `State::finished` like a record's ending; retention forgets it through
//! [`remove`](Done::remove). A range is freed once it holds no success.
//!
//! Invariant (18 of `state.rs`): `Done` holds exactly the record-less successes that retention
//! has not forgotten; none of them has a record; `len` is their number.

use std::collections::BTreeMap;

use super::ids::Seq;

/// Ids per range.
const RANGE: u64 = 1 << 12;
/// No record-less success at this id.
const NONE: u32 = u32::MAX;

/// See the module docs.
#[derive(Default)]
pub(crate) struct Done {
    /// By range number (`seq / RANGE`): each id's type index, or `NONE`, and how many are set.
    ranges: BTreeMap<u64, Range>,
    len: usize,
}

struct Range {
    types: Box<[u32]>,
    count: u32,
}

fn split(seq: Seq) -> (u64, usize) {
    (seq / RANGE, (seq % RANGE) as usize)
}

impl Done {
    /// Remembers task `seq`, of type `type_index`, as a record-less success.
    pub(crate) fn insert(&mut self, seq: Seq, type_index: u32) {
        debug_assert_ne!(type_index, NONE, "a type index, not the empty mark");
        let (range, at) = split(seq);
        let range = self.ranges.entry(range).or_insert_with(|| Range {
            types: vec![NONE; RANGE as usize].into_boxed_slice(),
            count: 0,
        });
        if range.types[at] == NONE {
            range.count += 1;
            self.len += 1;
        }
        range.types[at] = type_index;
    }

    /// The type of record-less success `seq`, if it is one.
    pub(crate) fn get(&self, seq: Seq) -> Option<u32> {
        let (range, at) = split(seq);
        let type_index = self.ranges.get(&range)?.types[at];
        (type_index != NONE).then_some(type_index)
    }

    pub(crate) fn contains(&self, seq: Seq) -> bool {
        self.get(seq).is_some()
    }

    /// Forgets record-less success `seq` (retention); returns whether it was one.
    pub(crate) fn remove(&mut self, seq: Seq) -> bool {
        let (number, at) = split(seq);
        let Some(range) = self.ranges.get_mut(&number) else {
            return false;
        };
        if range.types[at] == NONE {
            return false;
        }
        range.types[at] = NONE;
        range.count -= 1;
        self.len -= 1;
        if range.count == 0 {
            self.ranges.remove(&number);
        }
        true
    }

    /// How many record-less successes are remembered.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every remembered success from `from` up, by id, with its type.
    pub(crate) fn iter_from(&self, from: Seq) -> impl Iterator<Item = (Seq, u32)> + '_ {
        let (first, _) = split(from);
        self.ranges
            .range(first..)
            .flat_map(|(&number, range)| {
                range
                    .types
                    .iter()
                    .enumerate()
                    .filter(|&(_, &t)| t != NONE)
                    .map(move |(at, &t)| (number * RANGE + at as u64, t))
            })
            .filter(move |&(seq, _)| seq >= from)
    }

    /// For the invariant checks: whether `len` and every range's count match its marks.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut total = 0;
        for (number, range) in &self.ranges {
            let marked = range.types.iter().filter(|&&t| t != NONE).count();
            if marked != range.count as usize || marked == 0 {
                return Err(format!(
                    "range {number} of the record-less successes counts {} and marks {marked}",
                    range.count
                ));
            }
            total += marked;
        }
        if total != self.len {
            return Err(format!(
                "the record-less successes count {} and mark {total}",
                self.len
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successes_are_kept_by_range_and_freed_with_their_last() {
        let mut done = Done::default();
        assert!(!done.contains(5));
        done.insert(5, 2);
        done.insert(RANGE + 1, 0);
        done.insert(5, 2);
        assert_eq!(done.len(), 2);
        assert_eq!(done.get(5), Some(2));
        assert_eq!(done.get(RANGE + 1), Some(0));
        assert_eq!(done.get(6), None);
        assert_eq!(done.ranges.len(), 2);
        assert_eq!(
            done.iter_from(0).collect::<Vec<_>>(),
            [(5, 2), (RANGE + 1, 0)]
        );
        assert_eq!(done.iter_from(6).collect::<Vec<_>>(), [(RANGE + 1, 0)]);
        done.check().unwrap();
        assert!(done.remove(5));
        assert!(!done.remove(5));
        assert!(!done.remove(3 * RANGE));
        assert_eq!(done.ranges.len(), 1, "an empty range is freed");
        assert_eq!(done.len(), 1);
        done.check().unwrap();
    }

    #[test]
    fn check_names_a_range_whose_count_is_wrong() {
        let mut done = Done::default();
        done.insert(1, 0);
        done.ranges.get_mut(&0).unwrap().count = 2;
        assert!(done.check().unwrap_err().contains("range 0"));
        let mut done = Done::default();
        done.insert(1, 0);
        done.len = 3;
        assert!(done.check().unwrap_err().contains("count 3"));
    }
}
