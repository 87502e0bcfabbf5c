//! Task sequence numbers, and the hash maps the embedded store keys by them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A task's number within its pool: what the embedded store keys its records and queues by
/// (the public [`TaskId`](crate::TaskId) adds the pool's id).
pub(crate) type Seq = u64;

/// Hashes task ids (sequential `u64`s) for locality: the table finds a bucket from the hash's
/// low bits and tags it with its top 7 bits. The low bits are the id itself, so consecutive ids
/// (tasks submitted together, usually run together) sit in neighbouring buckets and share cache
/// lines; the top 7 bits come from a multiply, so tags still differ within a group.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    /// Only task sequence numbers are hashed with this: anything else is refused loudly, rather
    /// than hashed badly.
    fn write(&mut self, _: &[u8]) {
        unreachable!("IdHasher hashes task sequence numbers (u64) only")
    }

    fn write_u64(&mut self, n: u64) {
        const TAG: u64 = 0x7F << 57;
        self.0 = (n & !TAG) | (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) & TAG);
    }
}

pub(crate) type IdMap<V> = HashMap<Seq, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The low bits of an id's hash are the id (neighbours stay neighbours), and its top seven
    /// bits, the table's tag, spread over consecutive ids.
    #[test]
    fn id_hasher_keeps_locality_and_spreads_tags() {
        use std::hash::BuildHasher;
        let hasher = BuildHasherDefault::<IdHasher>::default();
        let low = u64::MAX >> 7;
        let mut tags = std::collections::HashSet::new();
        for id in (0..1024).chain([low, u64::MAX]) {
            let hash = hasher.hash_one(id);
            assert_eq!(hash & low, id & low, "the low bits of {id}'s hash");
            tags.insert(hash >> 57);
        }
        assert!(tags.len() > 100, "only {} tags over 1,024 ids", tags.len());
    }

    #[test]
    #[should_panic(expected = "hashes task sequence numbers (u64) only")]
    fn id_hasher_refuses_other_keys() {
        use std::hash::BuildHasher;
        BuildHasherDefault::<IdHasher>::default().hash_one("a string");
    }
}
