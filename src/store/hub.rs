//! Where a pool's handles find their store, and their tasks' outcomes once the store is gone.
//!
//! The embedded store makes a task's [`Completion`] lazily: a plain submit's handle starts
//! without one, and asks the store for it the first time it reads the task (a wait, a status,
//! a clone). A task whose handle was dropped unread never needs one, which saves an allocation
//! and about 80 bytes per queued task. The store must then know, when it forgets a finished
//! task (retention) or is itself dropped, whether that unread handle still lives, and keep the
//! outcome for it if so. The hub is how it learns, and where the outcome waits:
//!
//! - A handle dropped unread pushes its sequence number onto [`dropped`](Hub::dropped), with no
//!   lock; the store takes the queue in under its lock (after its intake, see
//!   `store/memory/intake.rs`), and stops keeping outcomes for those tasks. Workers take it in
//!   after each task they finish, and `wait_idle`/`wait_empty` and every transition of the
//!   store take it in too. An idle pool has no worker finishing tasks: so the drops queued and
//!   not taken in are counted ([`queued`](Hub::queued)), and the drop that brings them to
//!   [`TAKE_IN_AT`] takes them in itself (the store's `take_in_dropped`, which takes the
//!   store's lock, and drops the outcomes after releasing it). On a pool nobody touches, fewer than
//!   that many outcomes outlive their handles; a busy pool's workers take the drops in long
//!   before, and the dropping thread never takes the lock.
//! - When the store is dropped, it hands every outcome still kept for a live handle to
//!   [`seal`](Hub::seal). A handle whose store is gone waits until the hub is sealed (the
//!   store's `Drop` runs right after its last reference goes), then takes its outcome there. A
//!   handle dropped unread after that takes its outcome out and drops it (a drop pushed while
//!   the store sealed the hub is found by one of the two: the handle re-checks the seal after
//!   its push, the seal drains the queue after it is set). What is left when the hub goes is
//!   dropped then, each value inside `catch_unwind` (outputs are user values).
//!
//! Invariant: every handle without a completion can get its task's outcome, from the store
//! while it lives and from the hub after. The store keeps an unread handle's outcome (in the
//! task's record, or among its orphans once retention forgot the record) until the handle's
//! drop is taken in or the handle takes the outcome.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::model::completion::Completion;
use crate::sync::{Arc, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering, Queue, Weak};
use crate::unwind;

/// How many drops may wait in [`Hub::dropped`] before the dropping thread takes them in
/// itself: a lock taken once per this many drops at most, and a bound on the outcomes an idle
/// pool keeps for handles already gone.
const TAKE_IN_AT: usize = 256;

/// What a pool's handles share (one per pool). `S` is the store (`dyn Store`): the hub only
/// hands it out, so it need not know what a store is.
pub(crate) struct Hub<S: ?Sized> {
    store: OnceLock<Weak<S>>,
    /// Sequence numbers of tasks whose unread handle was dropped, for the store to take in.
    dropped: Queue<u64>,
    /// Drops pushed onto `dropped` minus drops taken in: a wrapping count, read as signed (a
    /// drop may be popped before its push is counted). Only a trigger: nothing relies on it
    /// being exact.
    queued: AtomicUsize,
    /// `Some` once the store is gone: the outcomes it kept for live handles.
    sealed: Mutex<Option<HashMap<u64, Arc<Completion>>>>,
    /// Set (after `sealed`) once the store is gone.
    is_sealed: AtomicBool,
    sealed_cv: Condvar,
}

impl<S: ?Sized> Hub<S> {
    pub(crate) fn new() -> Arc<Hub<S>> {
        Arc::new(Hub {
            store: OnceLock::new(),
            dropped: Queue::new(),
            queued: AtomicUsize::new(0),
            sealed: Mutex::new(None),
            is_sealed: AtomicBool::new(false),
            sealed_cv: Condvar::new(),
        })
    }

    /// Ties the hub to its store, once, as the store is made.
    pub(crate) fn attach(&self, store: Weak<S>) {
        let attached = self.store.set(store).is_ok();
        debug_assert!(attached, "a hub serves one store");
    }

    /// The store, while it lives.
    pub(crate) fn store(&self) -> Option<Arc<S>> {
        self.store.get().and_then(Weak::upgrade)
    }

    /// A handle to task `seq` was dropped without its completion (no lock while the store
    /// lives, except once per [`TAKE_IN_AT`] drops not taken in: see the module docs). Once
    /// the store is gone, the outcome kept for the handle, for the caller to drop outside any
    /// lock. `take_in` is the store's way to take the drops in (see the module docs).
    pub(crate) fn handle_dropped(
        &self,
        seq: u64,
        take_in: impl FnOnce(&S),
    ) -> Option<Arc<Completion>> {
        self.dropped.push(seq);
        if self.is_sealed.load(Ordering::SeqCst) {
            return self.take_kept(seq);
        }
        let queued = self.queued.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        // Signed: below zero while drops popped before they were counted are uncounted.
        if queued as isize >= TAKE_IN_AT as isize {
            // Nobody took the drops in for a while (an idle pool): take them in here. The
            // store, while it lives (its `Drop` takes in what is left).
            if let Some(store) = self.store() {
                take_in(&store);
            }
        }
        None
    }

    /// The outcome the store kept for task `seq`, if the hub is sealed.
    fn take_kept(&self, seq: u64) -> Option<Arc<Completion>> {
        self.sealed
            .lock()
            .as_mut()
            .and_then(|kept| kept.remove(&seq))
    }

    /// Pops every dropped handle's task, handing each to `take`, for the store to take in
    /// (under its lock).
    pub(crate) fn take_dropped(&self, mut take: impl FnMut(u64)) {
        let mut n: usize = 0;
        while let Some(seq) = self.dropped.pop() {
            take(seq);
            n += 1;
        }
        if n > 0 {
            // Wraps (see `queued`).
            self.queued.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// The store is gone: `kept` are the outcomes it kept for live handles. (Called by the
    /// store's `Drop`, after it took in the drops queued so far.)
    pub(crate) fn seal(&self, kept: HashMap<u64, Arc<Completion>>) {
        *self.sealed.lock() = Some(kept);
        self.is_sealed.store(true, Ordering::SeqCst);
        self.sealed_cv.notify_all();
        // Handles dropped while the store sealed: they may not have seen the seal.
        while let Some(seq) = self.dropped.pop() {
            unwind::drop_quietly(self.take_kept(seq));
        }
    }

    /// Task `seq`'s completion, for a handle whose store is gone: waits for the store's `Drop`
    /// to seal the hub (it is under way once no reference to the store is left). `None` if the
    /// store kept nothing for it (a store whose handles always hold their completion).
    pub(crate) fn take_sealed(&self, seq: u64) -> Option<Arc<Completion>> {
        let mut sealed = self.sealed.lock();
        loop {
            if let Some(kept) = sealed.as_mut() {
                return kept.remove(&seq);
            }
            self.sealed_cv.wait(&mut sealed);
        }
    }
}

impl<S: ?Sized> Drop for Hub<S> {
    /// The outcomes still kept hold user values (outputs): each is dropped on its own.
    fn drop(&mut self) {
        if let Some(kept) = self.sealed.get_mut().take() {
            kept.into_values().for_each(unwind::drop_quietly);
        }
    }
}
