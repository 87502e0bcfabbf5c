//! The embedded store's two queues: the ready queue (by priority, first-in first-out within one)
//! and the delayed heap (by due time).
//!
//! Both use lazy deletion: cancelling a queued task only changes its record, and the entry left
//! behind is skipped when it reaches the front. The callers pass an `is_live` check that reads the
//! task's record. The held queues of the gates (`gate.rs`) are ready queues too.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use super::ids::Seq;
use crate::gates::aging::Aging;

/// How aging ranks a bucket's front: effective priority, then ready longest (the earlier
/// stamp), then the lower id; the greatest key runs first.
type AgedKey = (u8, Reverse<Stamp>, Reverse<Seq>);

/// Ready tasks: strictly higher priority first, first-in first-out within a priority.
///
/// The order is that of a binary heap keyed by `(priority, Reverse(sequence))`, but with only 256
/// priorities one FIFO bucket per priority plus a bitmap of the non-empty buckets gives the same
/// order with O(1) push and pop, the depth of every priority for free, and the oldest ready task of
/// each priority at its bucket's front.
pub(crate) struct ReadyQueue {
    /// One queue per priority, allocated on first use; may hold stale entries (see module docs).
    buckets: Vec<VecDeque<Seq>>,
    /// Live (not cancelled) entries per priority.
    live: Box<[u32; 256]>,
    /// Bit `p` is set iff `live[p] > 0`.
    nonempty: [u64; 4],
    len: usize,
}

impl ReadyQueue {
    pub(crate) fn new() -> Self {
        ReadyQueue {
            buckets: (0..256).map(|_| VecDeque::new()).collect(),
            live: Box::new([0; 256]),
            nonempty: [0; 4],
            len: 0,
        }
    }

    /// Live entries in all priorities.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn push(&mut self, priority: u8, id: Seq) {
        let p = usize::from(priority);
        self.buckets[p].push_back(id);
        self.count_in(p);
    }

    /// Puts an entry back at the front of its priority: a task that was queued before every
    /// other of its priority (a held task released by its gate, see `gate.rs`).
    pub(crate) fn push_front(&mut self, priority: u8, id: Seq) {
        let p = usize::from(priority);
        self.buckets[p].push_front(id);
        self.count_in(p);
    }

    fn count_in(&mut self, p: usize) {
        self.live[p] += 1;
        self.nonempty[p / 64] |= 1 << (p % 64);
        self.len += 1;
    }

    /// A queued task of this priority left the ready state without being popped (it was
    /// cancelled); its entry is now stale.
    pub(crate) fn forget(&mut self, priority: u8) {
        let p = usize::from(priority);
        self.live[p] -= 1;
        self.len -= 1;
        if self.live[p] == 0 {
            self.clear_bucket(p);
        }
    }

    /// The highest-priority, oldest live entry and its priority, left in place (stale entries
    /// before it are dropped).
    pub(crate) fn front(&mut self, is_live: impl Fn(Seq) -> bool) -> Option<(u8, Seq)> {
        let p = self.highest()?;
        let bucket = &mut self.buckets[p];
        loop {
            let &id = bucket
                .front()
                .expect("a bucket with live entries is not empty");
            if is_live(id) {
                return Some((p as u8, id));
            }
            bucket.pop_front();
        }
    }

    /// Removes and returns the highest-priority, oldest live entry.
    pub(crate) fn pop(&mut self, is_live: impl Fn(Seq) -> bool) -> Option<Seq> {
        let p = self.highest()?;
        Some(self.pop_from(p, is_live))
    }

    /// Removes and returns the live entry with the highest effective priority under `aging` at
    /// stamp `now`; ties go to the task ready longest, then to the lower id. `since` gives a
    /// live entry's ready stamp, `None` for a stale one. Without aging, [`pop`](Self::pop).
    ///
    /// Each bucket is first-in first-out, so its front has waited longest and ages highest:
    /// comparing the fronts of the non-empty buckets finds the best entry, in at most 256 steps
    /// (a few, usually). A bucket above the ceiling never ages and nothing ages past it, so when
    /// the highest bucket is above the ceiling it wins at once.
    pub(crate) fn pop_by(
        &mut self,
        aging: Option<&Aging>,
        now: Stamp,
        since: impl Fn(Seq) -> Option<Stamp>,
    ) -> Option<Seq> {
        let Some(aging) = aging else {
            return self.pop(|id| since(id).is_some());
        };
        let highest = self.highest()?;
        if highest > usize::from(aging.ceiling()) {
            return Some(self.pop_from(highest, |id| since(id).is_some()));
        }
        // The best so far, and its bucket.
        let mut best: Option<(AgedKey, usize)> = None;
        for word in (0..4).rev() {
            let mut bits = self.nonempty[word];
            while bits != 0 {
                let bit = 63 - bits.leading_zeros() as usize;
                bits &= !(1 << bit);
                let p = word * 64 + bit;
                let bucket = &mut self.buckets[p];
                let (id, stamp) = loop {
                    let id = *bucket
                        .front()
                        .expect("a bucket with live entries is not empty");
                    match since(id) {
                        Some(stamp) => break (id, stamp),
                        None => {
                            bucket.pop_front();
                        }
                    }
                };
                let priority = u8::try_from(p).expect("256 buckets");
                let waited = Duration::from_nanos(now.saturating_sub(stamp));
                let key = (
                    aging.effective(priority, waited),
                    Reverse(stamp),
                    Reverse(id),
                );
                if best.as_ref().is_none_or(|(top, _)| key > *top) {
                    best = Some((key, p));
                }
            }
        }
        let (_, p) = best?;
        Some(self.pop_from(p, |id| since(id).is_some()))
    }

    /// Pops the first live entry of bucket `p`, which has one.
    fn pop_from(&mut self, p: usize, is_live: impl Fn(Seq) -> bool) -> Seq {
        let bucket = &mut self.buckets[p];
        loop {
            let id = bucket
                .pop_front()
                .expect("a bucket with live entries is not empty");
            if is_live(id) {
                self.live[p] -= 1;
                self.len -= 1;
                if self.live[p] == 0 {
                    self.clear_bucket(p);
                }
                return id;
            }
        }
    }

    /// Every entry, stale ones included, with its priority (for the invariant checks).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u8, Seq)> + '_ {
        self.buckets.iter().enumerate().flat_map(|(p, bucket)| {
            let priority = u8::try_from(p).expect("256 buckets");
            bucket.iter().map(move |&id| (priority, id))
        })
    }

    /// The oldest live entry of each non-empty priority, highest priority first, with its depth.
    /// Drops stale entries found at the fronts.
    pub(crate) fn fronts(&mut self, is_live: impl Fn(Seq) -> bool) -> Vec<(u8, usize, Seq)> {
        let mut out = Vec::new();
        for p in (0..256usize).rev() {
            if self.live[p] == 0 {
                continue;
            }
            let bucket = &mut self.buckets[p];
            while bucket.front().is_some_and(|&id| !is_live(id)) {
                bucket.pop_front();
            }
            let front = *bucket
                .front()
                .expect("a bucket with live entries is not empty");
            let priority = u8::try_from(p).expect("256 buckets");
            out.push((priority, self.live[p] as usize, front));
        }
        out
    }

    fn highest(&self) -> Option<usize> {
        (0..4)
            .rev()
            .find(|&word| self.nonempty[word] != 0)
            .map(|word| word * 64 + 63 - self.nonempty[word].leading_zeros() as usize)
    }

    /// Every entry left in bucket `p` is stale: drop them (and give back memory after a burst).
    fn clear_bucket(&mut self, p: usize) {
        self.nonempty[p / 64] &= !(1 << (p % 64));
        let bucket = &mut self.buckets[p];
        bucket.clear();
        if bucket.capacity() > 1024 {
            bucket.shrink_to(64);
        }
    }
}

/// One delayed task, in 16 bytes: due at stamp `at`; equal due times
/// run in submission (id) order. A task has at most one live entry, so `(at, id)` is unique
/// among live entries.
#[derive(PartialEq, Eq)]
struct DelayedEntry {
    at: Stamp,
    id: Seq,
}

impl Ord for DelayedEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.id).cmp(&(other.at, other.id))
    }
}

impl PartialOrd for DelayedEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The pool's start on its clock. The engine keeps its times as [`Stamp`]s, nanoseconds after
/// it, in 8 bytes where an `Instant` takes 16. Submit refuses due times more than 584 years
/// after it, so every time the engine keeps fits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Epoch(pub(crate) Instant);

/// Nanoseconds after the pool's [`Epoch`].
pub(crate) type Stamp = u64;

impl Epoch {
    /// `at` as a stamp: instants before the epoch become 0, and the stamp saturates (584 years).
    pub(crate) fn stamp(self, at: Instant) -> Stamp {
        u64::try_from(at.saturating_duration_since(self.0).as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn instant(self, stamp: Stamp) -> Instant {
        self.0 + Duration::from_nanos(stamp)
    }
}

/// Scheduled tasks (delayed, or retrying after a backoff), earliest due first.
pub(crate) struct DelayedQueue {
    // `BinaryHeap` is a max-heap: `Reverse` makes the earliest due time the top.
    heap: BinaryHeap<Reverse<DelayedEntry>>,
    epoch: Epoch,
}

impl DelayedQueue {
    pub(crate) fn new(epoch: Epoch) -> Self {
        DelayedQueue {
            heap: BinaryHeap::new(),
            epoch,
        }
    }

    /// Adds an entry; returns whether it is now the earliest (a sleeping timer must re-check).
    pub(crate) fn push(&mut self, at: Stamp, id: Seq) -> bool {
        let earliest = self.heap.peek().is_none_or(|Reverse(top)| at < top.at);
        self.heap.push(Reverse(DelayedEntry { at, id }));
        earliest
    }

    /// The earliest due time among live entries, dropping stale entries from the top.
    pub(crate) fn earliest(&mut self, is_live: impl Fn(Seq) -> bool) -> Option<Instant> {
        while let Some(Reverse(top)) = self.heap.peek() {
            if is_live(top.id) {
                return Some(self.epoch.instant(top.at));
            }
            self.heap.pop();
        }
        if self.heap.capacity() > 1024 {
            self.heap.shrink_to(64);
        }
        None
    }

    /// The earliest entry's due stamp, live or stale: no live entry is due before it.
    pub(crate) fn peek_stamp(&self) -> Option<Stamp> {
        self.heap.peek().map(|Reverse(top)| top.at)
    }

    /// Removes and returns the earliest entry if it is due at `now` (live or stale: the caller
    /// checks).
    pub(crate) fn pop_due(&mut self, now: Stamp) -> Option<Seq> {
        let Reverse(top) = self.heap.peek()?;
        if top.at <= now {
            self.heap.pop().map(|Reverse(e)| e.id)
        } else {
            None
        }
    }

    /// Entries in the heap, stale ones included.
    pub(crate) fn entries(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_is_priority_then_fifo() {
        let mut q = ReadyQueue::new();
        for (i, p) in [0u8, 5, 5, 255, 0, 64, 63].into_iter().enumerate() {
            q.push(p, i as Seq);
        }
        let order: Vec<Seq> = std::iter::from_fn(|| q.pop(|_| true)).collect();
        assert_eq!(order, vec![3, 5, 6, 1, 2, 0, 4]);
        assert!(q.is_empty());
    }

    #[test]
    fn ready_skips_forgotten_entries() {
        let mut q = ReadyQueue::new();
        q.push(1, 1);
        q.push(1, 2);
        q.forget(1); // task 1 was cancelled
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop(|id| id != 1), Some(2));
        assert_eq!(q.pop(|_| true), None);
    }

    #[test]
    fn delayed_is_earliest_first_and_fifo_on_ties() {
        let t0 = Instant::now();
        let epoch = Epoch(t0);
        let mut q = DelayedQueue::new(epoch);
        let at = |secs| epoch.stamp(t0 + Duration::from_secs(secs));
        assert!(q.push(at(2), 1));
        assert!(q.push(at(1), 2));
        assert!(!q.push(at(1), 3));
        assert_eq!(q.earliest(|_| true), Some(t0 + Duration::from_secs(1)));
        assert_eq!(q.pop_due(at(0)), None);
        let due: Vec<_> = std::iter::from_fn(|| q.pop_due(at(5))).collect();
        assert_eq!(due, vec![2, 3, 1]);
    }
}
