//! The intake: where plain submits wait, outside the pool's lock, until a worker moves them into
//! the ready queue and the delayed heap.
//!
//! # Why
//!
//! A plain task (no dependencies, no key) needs nothing from the state under the lock to be
//! accepted: its id comes from an atomic counter, and its checks need no other task. So a submit
//! of one pushes it onto a lock-free queue and returns; producers never wait for each other or
//! for a worker. Workers move what arrived into the state in batches, under the lock they take
//! anyway to claim a task: once per batch instead of once per task.
//!
//! # The intake word
//!
//! One atomic word, `Intake::word`, holds three counts, so that each side reads the other's
//! with the same read-modify-write that publishes its own (no fences, and a total order that
//! loom checks exactly):
//!
//! * `pending`: entries announced minus entries moved into the state. A producer pushes its
//!   entry, *then* adds one (the announcement). Whoever pops entries (a worker into its slot,
//!   under the slot's lock; a lookup moving the whole intake into the state, under the pool's
//!   lock: see `slots.rs`) subtracts what it popped in the same call; a lookup pops until the
//!   queue is empty, announced or not: so every submit that returned before a lookup is in the
//!   state or in a slot after it. The count is a wrapping 32-bit field at the top of the word, read as signed: it
//!   is negative while entries popped before their announcement are still unannounced.
//! * `sleepers`: workers waiting on a condition variable and not yet notified
//!   (`State::idle - State::notified`, plus the timer if it sleeps un-notified), mirrored here
//!   under the pool's lock at every change.
//! * `searchers`: workers on their way to look for work: notified and not yet holding the lock,
//!   or spinning.
//!
//! # No lost wake-up
//!
//! * A producer whose announcement finds a sleeper and no searcher takes the lock and wakes one
//!   (as many as rule 1 of the wake-up protocol in `mod.rs` calls for, counting what is
//!   pending as ready). One that finds a searcher leaves it to that searcher: a searcher leaves
//!   the count (a read-modify-write after the announcement) before it pops the intake, so it
//!   sees the entry. One that finds no sleeper leaves it to the workers that are awake. A
//!   worker that pops its share and leaves more pending, with a sleeper and no searcher, wakes
//!   one too (`MemoryStore::wake_for_intake`).
//! * A worker about to wait adds itself to `sleepers`; if that read-modify-write finds `pending`
//!   above zero, it takes itself off again and pops the intake instead of waiting (yielding
//!   first if the queue is empty: another worker popped the entry and has not yet subtracted
//!   it). Of the two
//!   read-modify-writes (announcement, going to sleep), whichever comes second sees the other.
//!   An announcement that leaves `pending` at zero or below (a worker popped another producer's
//!   entry before it was announced) may find its own entry left for that other announcement,
//!   which comes, and which then counts above zero: a task can wait for a producer that was
//!   preempted between its push and its announcement, never longer.
//!
//! # Closing
//!
//! Whether a submit is accepted is decided when it takes its id: the top bit of the id counter
//! is the *closed* flag, set by the same kind of read-modify-write that hands out ids. A
//! producer whose id comes with the flag refuses its task, untouched; one whose id came before
//! it is accepted, and pushes and announces its task. Closing reads how many ids were handed
//! out before the flag, and waits (briefly: a producer between taking its id and announcing)
//! until that many tasks are in the state, so a drain that follows sees every accepted task
//! and none is accepted after.

use std::any::Any;
use std::collections::VecDeque;

use super::ids::Seq;
use super::queue::Stamp;
use crate::sync::{Arc, AtomicU64, Ordering, Queue};

/// A plain task in the intake: all the state needs to insert it. Its handle has no completion
/// yet (see `hub.rs`).
pub(crate) struct Entry {
    pub(crate) seq: Seq,
    /// When it is due, as a stamp of the pool's epoch: when it was submitted, if it was due
    /// then (`due`).
    pub(crate) run_at: Stamp,
    /// Due when submitted: ready as soon as a worker takes it in, whatever that worker's clock
    /// read before (a later submit's stamp may be past it).
    pub(crate) due: bool,
    pub(crate) payload: Box<dyn Any + Send>,
    pub(crate) type_index: u32,
    pub(crate) priority: u8,
    /// Eligible for a direct run (see `slots.rs`, rule 4): due when submitted, priority 0, of a
    /// type with no gate in a pool without aging or lanes.
    pub(crate) direct: bool,
}

#[cfg(test)]
impl Entry {
    /// A due task of type 0 with an empty payload, for the unit tests.
    pub(crate) fn due_now(seq: Seq) -> Entry {
        Entry {
            seq,
            run_at: 0,
            due: true,
            payload: Box::new(()),
            type_index: 0,
            priority: 0,
            direct: true,
        }
    }
}

// The intake word's fields, from the lowest bit.
const SLEEPER: u64 = 1;
const SEARCHER: u64 = 1 << 16;
const PENDING: u64 = 1 << 32;
/// The closed flag, in the id counter.
const CLOSED: u64 = 1 << 63;
const FIELD: u64 = (1 << 15) - 1;

/// The most workers a pool can have: the intake word's `sleepers` and `searchers` fields hold
/// that many (15 bits each; 16 for `sleepers`, which also counts the timer).
pub(crate) const MAX_WORKERS: usize = FIELD as usize;

fn sleepers(word: u64) -> u64 {
    word & 0xFFFF
}

fn searchers(word: u64) -> u64 {
    (word >> 16) & FIELD
}

/// The signed `pending` count (see the module docs).
fn pending(word: u64) -> i32 {
    // The top 32 bits, reinterpreted: the field wraps.
    (word >> 32) as u32 as i32
}

/// What an announcement found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Announced {
    /// Someone awake will move the entry.
    Seen,
    /// A worker sleeps and none is on its way: wake one.
    Wake,
}

/// See the module docs.
pub(crate) struct Intake {
    queue: Queue<Entry>,
    word: AtomicU64,
    /// Entries pushed and not yet popped that may not run direct (see `slots.rs`, rule 4):
    /// counted before the push, uncounted by whoever pops them. While it is above zero, a
    /// worker starts no direct task without the lock, which then moves the intake into the
    /// state: so a task of a higher priority, or due later, submitted before a plain one, is
    /// ordered against it as it always was.
    ineligible: AtomicU64,
    /// The next task's sequence number, for every submit (plain or not): shared with the
    /// state, which takes the ids of the others under the lock.
    next_seq: Arc<AtomicU64>,
}

impl Intake {
    pub(crate) fn new(next_seq: Arc<AtomicU64>) -> Self {
        Intake {
            queue: Queue::new(),
            word: AtomicU64::new(0),
            ineligible: AtomicU64::new(0),
            next_seq,
        }
    }

    /// A new plain task's sequence number, or `None` if the pool is closed (see the module
    /// docs). Sequence numbers only grow: a dependent's is above its dependencies'.
    pub(crate) fn next_seq(&self) -> Option<Seq> {
        let seq = self.next_seq.fetch_add(1, Ordering::AcqRel);
        (seq & CLOSED == 0).then_some(seq)
    }

    /// The sequence number the next task would get (no task has it yet).
    pub(crate) fn peek_seq(&self) -> Seq {
        self.next_seq.load(Ordering::Relaxed) & !CLOSED
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.next_seq.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Entries announced and not yet moved into the state (see the module docs: it may be
    /// below zero).
    pub(crate) fn pending(&self) -> i32 {
        pending(self.word.load(Ordering::Acquire))
    }

    /// Pushes `entry` and announces it.
    pub(crate) fn push(&self, entry: Entry) -> Announced {
        if !entry.direct {
            self.ineligible.fetch_add(1, Ordering::AcqRel);
        }
        self.queue.push(entry);
        let before = self.word.fetch_add(PENDING, Ordering::AcqRel);
        if sleepers(before) > 0 && searchers(before) == 0 {
            Announced::Wake
        } else {
            Announced::Seen
        }
    }

    /// Pops up to `max` entries, announced or not, onto the back of `into`; returns how many.
    /// A worker calls it holding its slot's lock, `into` being the slot's parked entries (see
    /// `slots.rs`, rule 1). Every pop, here or in [`drain`](Self::drain), subtracts itself from
    /// `pending` in the same call: concurrent poppers keep the count exact between calls.
    pub(crate) fn pop_into(&self, into: &mut VecDeque<Entry>, max: usize) -> usize {
        let mut n = 0;
        let mut ineligible = 0;
        while n < max {
            let Some(entry) = self.queue.pop() else {
                break;
            };
            ineligible += u64::from(!entry.direct);
            into.push_back(entry);
            n += 1;
        }
        self.popped(n as u64, ineligible);
        n
    }

    /// Whether the queue holds no entry now (announced or not).
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether an entry that may not run direct waits in the intake (or is being pushed).
    pub(crate) fn holds_ineligible(&self) -> bool {
        self.ineligible.load(Ordering::Acquire) > 0
    }

    /// `n` entries were popped, `ineligible` of them not eligible for a direct run.
    fn popped(&self, n: u64, ineligible: u64) {
        if ineligible > 0 {
            self.ineligible.fetch_sub(ineligible, Ordering::AcqRel);
        }
        if n > 0 {
            // Wraps within the top field (see `pending`).
            self.word.fetch_sub(n * PENDING, Ordering::AcqRel);
        }
    }

    /// Whether entries wait, a worker sleeps and none is on its way: a worker that has just
    /// popped its share should wake one (with the pool's lock, `MemoryStore::wake_for_intake`).
    pub(crate) fn wants_searcher(&self) -> bool {
        let word = self.word.load(Ordering::Acquire);
        pending(word) > 0 && sleepers(word) > 0 && searchers(word) == 0
    }

    /// Pops every entry in the queue, announced or not, handing each to `insert`; returns how
    /// many. Called under the pool's lock, by a lookup (see `slots.rs`, rule 3); workers pop
    /// meanwhile into their slots ([`pop_into`](Self::pop_into)).
    pub(crate) fn drain(&self, mut insert: impl FnMut(Entry)) -> u64 {
        let mut n = 0;
        let mut ineligible = 0;
        while let Some(entry) = self.queue.pop() {
            ineligible += u64::from(!entry.direct);
            insert(entry);
            n += 1;
        }
        self.popped(n, ineligible);
        n
    }

    /// Closes the pool to plain submits; returns how many tasks were given ids before (the
    /// first call's answer is the one that counts: refused submits still move the counter).
    pub(crate) fn close(&self) -> u64 {
        let next = self.next_seq.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED;
        next - 1
    }

    /// A worker is about to wait (under the pool's lock): counts it as a sleeper, unless an entry
    /// is pending, in which case it must move the intake instead (returns `false`).
    pub(crate) fn try_sleep(&self) -> bool {
        let before = self.word.fetch_add(SLEEPER, Ordering::AcqRel);
        if pending(before) <= 0 {
            return true;
        }
        self.word.fetch_sub(SLEEPER, Ordering::AcqRel);
        false
    }

    /// A sleeper was notified (under the pool's lock): from `sleepers` to `searchers`.
    pub(crate) fn notified(&self) {
        self.word.fetch_add(SEARCHER - SLEEPER, Ordering::AcqRel);
    }

    /// A sleeper woke (under the pool's lock), taking a notification (`State::notified`) or
    /// not (a broadcast, a timeout, a spurious wake-up): off `searchers` or off `sleepers`.
    pub(crate) fn woke(&self, notified: bool) {
        let field = if notified { SEARCHER } else { SLEEPER };
        self.word.fetch_sub(field, Ordering::AcqRel);
    }

    /// A worker starts spinning: it counts as a searcher.
    pub(crate) fn start_spinning(&self) {
        self.word.fetch_add(SEARCHER, Ordering::AcqRel);
    }

    /// A spinner stops (it will lock, move the intake, and look for work before it sleeps).
    pub(crate) fn stop_spinning(&self) {
        self.word.fetch_sub(SEARCHER, Ordering::AcqRel);
    }

    /// The word's counts, for the invariant checks: (pending, sleepers, searchers).
    pub(crate) fn counts(&self) -> (i32, u64, u64) {
        let word = self.word.load(Ordering::Acquire);
        (pending(word), sleepers(word), searchers(word))
    }
}

/// The intake word's rules, one read-modify-write at a time (the loom models check them raced).
#[cfg(test)]
mod tests {
    use super::*;

    fn intake() -> Intake {
        Intake::new(Arc::new(AtomicU64::new(1)))
    }

    fn entry(seq: Seq) -> Entry {
        Entry::due_now(seq)
    }

    #[test]
    fn a_submit_wakes_only_a_sleeper_nobody_else_is_looking_for() {
        let intake = intake();
        // Nobody sleeps: the workers awake will see the entry.
        assert_eq!(intake.push(entry(1)), Announced::Seen);
        assert_eq!(intake.drain(|_| ()), 1);
        // A sleeper, and nobody searching: wake one.
        assert!(intake.try_sleep());
        assert_eq!(intake.push(entry(2)), Announced::Wake);
        // Once it is notified it is a searcher: later submits leave the entry to it.
        intake.notified();
        assert_eq!(intake.counts(), (1, 0, 1));
        assert_eq!(intake.push(entry(3)), Announced::Seen);
        // It wakes, moves both entries in, and goes back to sleep.
        intake.woke(true);
        assert_eq!(intake.drain(|_| ()), 2);
        assert!(intake.try_sleep());
        assert_eq!(intake.counts(), (0, 1, 0));
        // A spinner is a searcher too.
        intake.start_spinning();
        assert_eq!(intake.push(entry(4)), Announced::Seen);
        intake.stop_spinning();
        assert_eq!(intake.push(entry(5)), Announced::Wake);
    }

    #[test]
    fn the_word_counts_each_field_apart() {
        let intake = intake();
        assert_eq!(intake.counts(), (0, 0, 0));
        assert!(intake.try_sleep());
        assert!(intake.try_sleep());
        assert_eq!(intake.counts(), (0, 2, 0));
        intake.notified();
        assert_eq!(intake.counts(), (0, 1, 1));
        intake.start_spinning();
        assert_eq!(intake.counts(), (0, 1, 2));
        intake.woke(true);
        intake.woke(false);
        intake.stop_spinning();
        assert_eq!(intake.counts(), (0, 0, 0));
        // Two announced, three popped (one pushed, not yet announced): below zero until the
        // third producer announces.
        intake.push(entry(1));
        intake.push(entry(2));
        assert_eq!(intake.pending(), 2);
        intake.queue.push(entry(3));
        assert_eq!(intake.drain(|_| ()), 3);
        assert_eq!(intake.counts(), (-1, 0, 0));
        intake.word.fetch_add(PENDING, Ordering::AcqRel);
        assert_eq!(intake.pending(), 0);
    }

    #[test]
    fn a_worker_with_an_entry_pending_moves_the_intake_instead_of_sleeping() {
        let intake = intake();
        intake.push(entry(1));
        assert!(!intake.try_sleep());
        assert_eq!(intake.counts(), (1, 0, 0));
        let mut moved = Vec::new();
        assert_eq!(intake.drain(|e| moved.push(e.seq)), 1);
        assert_eq!(moved, [1]);
        assert!(intake.try_sleep());
        assert_eq!(intake.counts(), (0, 1, 0));
    }

    #[test]
    fn closing_refuses_every_later_id_and_counts_the_ones_before() {
        let intake = intake();
        assert_eq!(intake.next_seq(), Some(1));
        assert_eq!(intake.next_seq(), Some(2));
        assert!(!intake.is_closed());
        assert_eq!(intake.close(), 2);
        assert!(intake.is_closed());
        assert_eq!(intake.next_seq(), None);
        assert_eq!(intake.peek_seq(), 4);
        // A second close answers from the counter refused submits moved on.
        assert_eq!(intake.close(), 3);
    }
}
