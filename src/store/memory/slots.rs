//! The workers' slots: where a plain task a worker took from the intake lives until it ends,
//! without a record (a *direct* task).
//!
//! # Why
//!
//! Most tasks are plain (no key, no dependency), due at once, and never looked at: nobody asks
//! their state, nobody cancels them, their handle is dropped or never read. Such a task needs
//! no record, no ready-queue entry, no completion and no retention entry of its own: a worker
//! can take it from the intake (`intake.rs`) and run it without the pool's lock, and its
//! success can be remembered as one mark in a range (`done.rs`). What must not change is what
//! anyone can observe: every lookup (a status, a cancel, a handle's wait, a dependency, a
//! listing, a shutdown) still finds every accepted task, in the state it is in.
//!
//! # The protocol
//!
//! Each worker has a slot, behind a lock of its own. It holds the entries the worker took from
//! the intake and has not started (`parked`), the direct task it runs (`running`, with a clone
//! of its token), and the direct tasks that succeeded and are not yet in the state (`done`).
//!
//! 1. **A worker pops the intake only while it holds its own slot's lock**, and leaves what it
//!    popped in the slot before it releases the lock. So an entry is always in the intake, in
//!    a slot, or in the state: never in a worker's hands alone.
//! 2. **Lock order: the pool's lock, then a slot's.** A worker never takes the pool's lock while
//!    it holds its slot's; a lookup holding the pool's lock may take any slot's.
//! 3. **A lookup materializes.** Everything that must see every task (every transition and read
//!    of the store, except a worker's own claim and completion) takes the pool's lock, moves
//!    the intake into the state, then takes each slot's lock in turn and moves what the slot
//!    holds into the state: parked entries are admitted like intake entries; the running task
//!    gets a `Running` record with its token in `State::tokens` (`recorded` is set, so its
//!    worker ends it through the state, as any recorded task); the done buffer is recorded as
//!    record-less successes (`State::done`). An entry pushed before the lookup began is in the
//!    intake when the lookup drains it, or was popped before, under a slot's lock, and is in
//!    that slot when the lookup takes the lock after it (rule 1): the lookup sees it.
//! 4. **A worker runs a parked entry without the pool's lock** only if the entry is eligible
//!    (`Entry::direct`: due when submitted, priority 0, of a type with no gate of its own in a
//!    pool without lanes), no ineligible entry waits in the intake (`Intake::ineligible`), its
//!    type is not paused or under a queue limit now (`MemoryStore::direct_now`), and the
//!    *direct hint* allows it: the pool is not stopping, the ready queue is empty, and no
//!    delayed task is due (`MemoryStore::direct_hint`). All of these are read after the pop,
//!    and written under the pool's lock by every transition that changes them, before it
//!    returns: so a pause, a priority submit or a stop that returned before a task was
//!    submitted is seen by whoever pops that task. Otherwise the worker takes the pool's lock
//!    and decides there: an ineligible entry (or one whose type is gated now, or any entry
//!    while an ineligible one waits, or while aging ranks ready tasks) is taken into the
//!    state with every slot's parked entries and the rest of the intake, by id; an eligible
//!    one runs there and then unless the ready queue holds a better task (a higher priority,
//!    or the same priority ready no later), which runs first while the entry stays parked.
//! 5. **A direct task's end.** A success with a unit output, not recorded, goes to the slot's
//!    done buffer under the slot's lock (and into the state in batches, under the pool's lock,
//!    or by the next lookup). Any other end (a failure, a retry, an output a handle may read,
//!    a recorded task) takes the pool's lock, materializes the task if no lookup has (its
//!    record is made, `Running`, then ended through the state as any record), and clears the
//!    slot under that lock.
//!
//! The invariants these keep are 17 and 18 of `state.rs`.

use std::collections::VecDeque;

use super::ids::Seq;
use super::intake::Entry;
use super::queue::Stamp;
use crate::model::cancel::CancelToken;
use crate::sync::{Mutex, MutexGuard};

/// How many record-less successes a slot holds before its worker moves them into the state.
pub(crate) const DONE_BATCH: usize = 64;

/// A direct task a worker runs.
pub(crate) struct DirectRun {
    pub(crate) seq: Seq,
    pub(crate) type_index: u32,
    /// When it started, on the pool's clock.
    pub(crate) started: Stamp,
    /// A clone of the run's token, for a lookup that materializes it (a cancel fires it).
    pub(crate) token: CancelToken,
    /// A lookup made it a record: it ends through the state.
    pub(crate) recorded: bool,
}

/// One worker's slot (see the module docs).
#[derive(Default)]
pub(crate) struct Slot {
    /// Popped from the intake, not started: in intake order.
    pub(crate) parked: VecDeque<Entry>,
    pub(crate) running: Option<DirectRun>,
    /// Record-less successes (id, type index) not yet in the state.
    pub(crate) done: Vec<(Seq, u32)>,
}

/// Every worker's slot, by worker index.
pub(crate) struct Slots(Box<[Mutex<Slot>]>);

impl Slots {
    pub(crate) fn new(workers: usize) -> Self {
        Slots((0..workers).map(|_| Mutex::new(Slot::default())).collect())
    }

    /// Worker `worker`'s slot, locked (rule 2: never while that worker holds the pool's lock
    /// and another slot's).
    pub(crate) fn lock(&self, worker: usize) -> MutexGuard<'_, Slot> {
        self.0[worker].lock()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}
