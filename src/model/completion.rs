//! Where a task's outcome is published, once, for every handle to read: the one piece of a
//! task that both the stores (which publish) and the handles (which wait) hold.

use std::any::Any;
use std::time::Instant;

use crate::model::state::{CancelReason, Failure, TaskState};
use crate::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering};

/// A task's outcome as a store publishes it: the output is type-erased until a handle reads it.
pub(crate) enum Finished {
    /// `None` once [`TaskHandle::join`](crate::TaskHandle::join) took the output.
    Succeeded(Option<Box<dyn Any + Send + Sync>>),
    // Boxed: failures are rare, and every task's completion is as large as this enum.
    Failed(Box<Failure>),
    Cancelled(CancelReason),
}

impl Finished {
    pub(crate) fn state(&self) -> TaskState {
        match self {
            Finished::Succeeded(_) => TaskState::Succeeded,
            Finished::Failed(_) => TaskState::Failed,
            Finished::Cancelled(_) => TaskState::Cancelled,
        }
    }
}

/// Where a task's outcome is published, once, for every handle to read.
///
/// It has its own lock, so waiters never touch a store's lock while they wait or clone an
/// output, and a slow waiter never holds up a worker (it holds this lock only to read the
/// outcome). The state published is also kept outside that lock, in `state`: a store reads it
/// under its own lock (is a dependency done?), and must never wait there behind a reader whose
/// output's `Clone` (user code) calls back into the pool. It outlives the task's record
/// (retention may drop the record while handles remain).
pub(crate) struct Completion {
    outcome: Mutex<Option<Finished>>,
    /// The published state (see `encode`), 0 until published; set under `outcome`'s lock.
    state: AtomicUsize,
    cv: Condvar,
}

fn encode(state: TaskState) -> usize {
    match state {
        TaskState::Succeeded => 1,
        TaskState::Failed => 2,
        _ => 3,
    }
}

fn decode(code: usize) -> Option<TaskState> {
    match code {
        0 => None,
        1 => Some(TaskState::Succeeded),
        2 => Some(TaskState::Failed),
        _ => Some(TaskState::Cancelled),
    }
}

impl Completion {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Completion {
            outcome: Mutex::new(None),
            state: AtomicUsize::new(0),
            cv: Condvar::new(),
        })
    }

    /// A completion published at once with `finished`: for an outcome that waited elsewhere
    /// until a handle asked.
    pub(crate) fn ended(finished: Finished) -> Arc<Self> {
        let completion = Completion::new();
        completion.publish(finished);
        completion
    }

    /// Publishes the outcome and wakes every waiter. Called once per task, in the step that
    /// makes the task terminal: it runs no user code (the output is moved in), and waiters wake
    /// on this completion's own lock.
    pub(crate) fn publish(&self, finished: Finished) {
        let mut outcome = self.outcome.lock();
        debug_assert!(outcome.is_none(), "a task reached two terminal states");
        self.state
            .store(encode(finished.state()), Ordering::Release);
        *outcome = Some(finished);
        self.cv.notify_all();
    }

    /// Publishes `finished` unless an outcome is published already, which it then hands back
    /// for the caller to drop outside any lock. For a store that may hear of one ending by two
    /// routes (the durable store: its own worker, and a notification or poll racing a handle's
    /// re-registration); both carry the same terminal state, read from the same row.
    #[cfg(feature = "postgres")]
    pub(crate) fn publish_first(&self, finished: Finished) -> Option<Finished> {
        let mut outcome = self.outcome.lock();
        if outcome.is_some() {
            return Some(finished);
        }
        self.state
            .store(encode(finished.state()), Ordering::Release);
        *outcome = Some(finished);
        self.cv.notify_all();
        None
    }

    /// Blocks until the outcome is published, then returns what `read` makes of it (run under
    /// this completion's lock only).
    pub(crate) fn wait_with<R>(&self, read: impl FnOnce(&mut Finished) -> R) -> R {
        let mut outcome = self.outcome.lock();
        loop {
            if let Some(finished) = outcome.as_mut() {
                return read(finished);
            }
            self.cv.wait(&mut outcome);
        }
    }

    /// Like [`wait_with`](Completion::wait_with), giving up at `deadline`.
    pub(crate) fn wait_until_with<R>(
        &self,
        deadline: Instant,
        read: impl FnOnce(&mut Finished) -> R,
    ) -> Option<R> {
        let mut outcome = self.outcome.lock();
        loop {
            if let Some(finished) = outcome.as_mut() {
                return Some(read(finished));
            }
            if Instant::now() >= deadline {
                return None;
            }
            self.cv.wait_until(&mut outcome, deadline);
        }
    }

    /// What `read` makes of the outcome, if it is published.
    pub(crate) fn try_with<R>(&self, read: impl FnOnce(&mut Finished) -> R) -> Option<R> {
        self.outcome.lock().as_mut().map(read)
    }

    /// The state published, if any, without taking the lock.
    pub(crate) fn state(&self) -> Option<TaskState> {
        decode(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn is_published(&self) -> bool {
        self.state().is_some()
    }

    pub(crate) fn wait_state(&self) -> TaskState {
        match self.state() {
            Some(state) => state,
            None => self.wait_with(|finished| finished.state()),
        }
    }
}
