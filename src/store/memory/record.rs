//! One task as the embedded store keeps it, and the effects of a transition that must be carried
//! out after the lock is released.

use std::any::Any;

use super::ids::Seq;
use super::queue::Stamp;
use crate::model::completion::{Completion, Finished};
use crate::model::state::{CancelReason, Failure, TaskState};
use crate::sync::{Arc, ThreadId};
use crate::unwind;

/// A task's record. Kept small (80 bytes): what only some tasks need lives in [`Extra`], and
/// the cancellation tokens of running tasks in `State::tokens`.
pub(crate) struct Record {
    pub(crate) state: TaskState,
    /// Index of the task type in the registry.
    pub(crate) type_index: u32,
    pub(crate) priority: u8,
    /// Of a ready task of a gated type: whether a gate holds it, or released it (see `gate.rs`).
    /// `Free` in every other state.
    pub(crate) gating: Gating,
    /// Attempts started so far.
    pub(crate) attempts: u32,
    /// Dependencies that have not succeeded yet (non-zero only while blocked).
    pub(crate) pending_dependencies: u32,
    /// Blocked: the requested run_at. Scheduled: when it becomes due. Ready: since when it has
    /// been ready. Running: when it started. Terminal: when it finished.
    pub(crate) since: Stamp,
    /// `None` only while running (the worker holds it) or once dropped after the end.
    pub(crate) payload: Option<Box<dyn Any + Send>>,
    /// The outcome, for the handles (see `hub.rs`).
    pub(crate) outcome: Outcome,
    /// The plain submit's handle lives, has no completion yet, and its drop is not taken in:
    /// the outcome is kept for it, past retention if need be (in `State::orphans`).
    pub(crate) unread_handle: bool,
    pub(crate) extra: Option<Box<Extra>>,
}

/// A plain task from the intake, scheduled for later, that nothing has asked about yet: all it
/// needs until it falls due, in 32 bytes where a record takes 80 (see `State::dormant`).
pub(crate) struct Dormant {
    /// When it falls due.
    pub(crate) run_at: Stamp,
    pub(crate) payload: Box<dyn Any + Send>,
    pub(crate) type_index: u32,
    pub(crate) priority: u8,
    /// As [`Record::unread_handle`].
    pub(crate) unread_handle: bool,
}

impl Dormant {
    /// The record it becomes once it falls due or something asks about it: scheduled, nothing
    /// else changed.
    pub(crate) fn into_record(self) -> Record {
        Record {
            state: TaskState::Scheduled,
            type_index: self.type_index,
            priority: self.priority,
            gating: Gating::Free,
            attempts: 0,
            pending_dependencies: 0,
            since: self.run_at,
            payload: Some(self.payload),
            outcome: Outcome::Unread,
            unread_handle: self.unread_handle,
            extra: None,
        }
    }
}

/// Where a task's outcome goes. A completion (an allocation the handles share) is made only
/// once a handle reads the task; until then the outcome of a task that ended waits here.
pub(crate) enum Outcome {
    /// Not ended, and no handle has read the task.
    Unread,
    /// Succeeded before any handle read it: the output, as `Finished::Succeeded` carries it.
    Succeeded(Option<Box<dyn Any + Send + Sync>>),
    /// Failed or cancelled before any handle read it (boxed: rare, and the record stays small).
    Ended(Box<Finished>),
    /// Shared with the handles that read it; published once the task ends.
    Shared(Arc<Completion>),
}

impl Outcome {
    /// Publishes the task's ending: a step of the transition that makes it terminal.
    pub(crate) fn publish(&mut self, finished: Finished) {
        match self {
            Outcome::Shared(completion) => completion.publish(finished),
            _ => {
                debug_assert!(
                    matches!(self, Outcome::Unread),
                    "a task reached two terminal states"
                );
                *self = match finished {
                    Finished::Succeeded(output) => Outcome::Succeeded(output),
                    finished => Outcome::Ended(Box::new(finished)),
                };
            }
        }
    }

    /// The completion the handles share, made now if none has been.
    pub(crate) fn shared(&mut self) -> Arc<Completion> {
        let completion = match std::mem::replace(self, Outcome::Unread) {
            Outcome::Shared(completion) => completion,
            Outcome::Unread => Completion::new(),
            Outcome::Succeeded(output) => Completion::ended(Finished::Succeeded(output)),
            Outcome::Ended(finished) => Completion::ended(*finished),
        };
        *self = Outcome::Shared(Arc::clone(&completion));
        completion
    }

    pub(crate) fn is_published(&self) -> bool {
        match self {
            Outcome::Unread => false,
            Outcome::Succeeded(_) | Outcome::Ended(_) => true,
            Outcome::Shared(completion) => completion.is_published(),
        }
    }
}

/// One of the gates a task type may have (`gate.rs` names the gate itself: the type's own
/// limit, or its downstream's breaker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GateKind {
    Breaker,
    Concurrency,
    Rate,
    /// The type, or its queue, is paused.
    Paused,
    /// Every worker of the type's lane runs a task.
    Lane,
    /// The type's queue runs as many tasks as its limit.
    Queue,
}

/// Where a ready task stands with its gates: what tells the queue it is in, and which count to
/// fix when it leaves (invariants 2 and 11 in `state.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Gating {
    /// In `ready`, not taken out of a gate's held queue (every ungated task).
    #[default]
    Free,
    /// In the held queue of this gate.
    Held(GateKind),
    /// In `ready` again, released from this gate's held queue and not popped since: it counts
    /// in that gate's `released`.
    Released(GateKind),
}

/// What only some tasks need.
#[derive(Default)]
pub(crate) struct Extra {
    /// Blocked tasks waiting for this one.
    pub(crate) dependents: Vec<Seq>,
    pub(crate) key: Option<Arc<str>>,
    /// The last retryable error, while a retry waits.
    pub(crate) last_error: Option<String>,
    /// A cancel asked for while running: the task ends cancelled whatever the handler returns.
    pub(crate) cancel_requested: Option<CancelReason>,
    /// The failure of a dead letter.
    pub(crate) failure: Option<Failure>,
    /// The task a dead letter was resubmitted as.
    pub(crate) resubmitted_as: Option<Seq>,
    /// The dependencies the task was submitted with (only while it has some), sorted: to bring
    /// it back after a failed dependency cancelled it, and for `TaskInfo::dependencies`.
    pub(crate) dependencies: Vec<Seq>,
    /// Of a dead letter: the dependents its failure cancelled, transitively, which keep their
    /// payloads until retention drops them.
    pub(crate) cascade: Vec<Seq>,
    /// Of a task in a dead letter's cascade: that dead letter.
    pub(crate) cascade_root: Option<Seq>,
    /// Settings of the task's own, unlike its type's (fixed at submit, kept by a resubmit).
    pub(crate) settings: Option<crate::store::registry::Settings>,
    /// A dead letter whose record retention has passed over: it is kept only while it stays a
    /// dead letter (until taken, resubmitted or pushed out by the dead-letter limit).
    pub(crate) expired: bool,
    /// A dead letter whose payload this thread took out to copy it outside the lock
    /// (`Pool::dead_letter_payload`): it comes back once copied (see `State::lend_dead_letter`).
    pub(crate) lent: Option<ThreadId>,
}

impl Record {
    pub(crate) fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Box::default)
    }

    pub(crate) fn cancel_requested(&self) -> Option<CancelReason> {
        self.extra.as_ref().and_then(|e| e.cancel_requested)
    }

    pub(crate) fn key(&self) -> Option<&Arc<str>> {
        self.extra.as_ref().and_then(|e| e.key.as_ref())
    }
}

/// What a transition leaves to do once the lock is released: drop user values (a payload's or
/// output's `Drop` is user code, never run under the lock), and wake workers.
///
/// Most transitions drop a payload and, through retention, one older record's completion (its
/// output, if no handle is left): those need no allocation.
#[derive(Default)]
pub(crate) struct Effects {
    drops_first: [Option<Box<dyn Any + Send>>; 2],
    drops_more: Vec<Box<dyn Any + Send>>,
    /// The completions and extras of records that retention dropped: an output, a handler's
    /// error and a payload kept for a cascade are user values.
    completion_first: Option<Arc<Completion>>,
    completions_more: Vec<Arc<Completion>>,
    // Boxed as the records hold them: unboxing would move each one.
    #[allow(clippy::vec_box)]
    extras: Vec<Box<Extra>>,
    /// Tasks that became ready: wake that many idle workers.
    pub(crate) newly_ready: usize,
    /// A task became the earliest delayed one: the timer must re-check its deadline.
    pub(crate) new_earliest: bool,
}

impl Effects {
    pub(crate) fn drop_later(&mut self, value: Box<dyn Any + Send>) {
        match self.drops_first.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(value),
            None => self.drops_more.push(value),
        }
    }

    /// Drops a completion later: the last reference to its output may be this one.
    pub(crate) fn drop_completion_later(&mut self, completion: Arc<Completion>) {
        match self.completion_first {
            None => self.completion_first = Some(completion),
            Some(_) => self.completions_more.push(completion),
        }
    }

    /// Drops an outcome later: it may hold an output, or be the last reference to one.
    pub(crate) fn drop_outcome_later(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Unread => {}
            Outcome::Succeeded(output) => {
                if let Some(output) = output {
                    self.drop_later(output);
                }
            }
            Outcome::Ended(finished) => self.drop_later(finished),
            Outcome::Shared(completion) => self.drop_completion_later(completion),
        }
    }

    /// Drops what a record holds of user values later: its payload, its completion (the last
    /// reference to its output may be this one), its extra (a handler's error).
    pub(crate) fn drop_record_later(&mut self, record: Record) {
        let Record {
            payload,
            outcome,
            extra,
            ..
        } = record;
        if let Some(payload) = payload {
            self.drop_later(payload);
        }
        self.drop_outcome_later(outcome);
        if let Some(extra) = extra {
            self.extras.push(extra);
        }
    }

    /// Whether no user value waits here to be dropped.
    pub(crate) fn holds_nothing(&self) -> bool {
        self.drops_first.iter().all(Option::is_none)
            && self.drops_more.is_empty()
            && self.completion_first.is_none()
            && self.completions_more.is_empty()
            && self.extras.is_empty()
    }

    /// Drops the values, each on its own inside `catch_unwind`: a `Drop` that panics loses only
    /// its own value (a second panic while the first unwinds would abort the process). Call
    /// without holding the pool lock.
    pub(crate) fn apply(self) {
        let Effects {
            drops_first: [first, second],
            drops_more,
            completion_first,
            completions_more,
            extras,
            ..
        } = self;
        if let Some(value) = first {
            unwind::drop_quietly(value);
        }
        if let Some(value) = second {
            unwind::drop_quietly(value);
        }
        if let Some(completion) = completion_first {
            unwind::drop_quietly(completion);
        }
        // Rare: most transitions leave these empty, and an empty `Vec` has nothing to free.
        if !drops_more.is_empty() {
            drops_more.into_iter().for_each(unwind::drop_quietly);
        }
        if !completions_more.is_empty() {
            completions_more.into_iter().for_each(unwind::drop_quietly);
        }
        if !extras.is_empty() {
            extras.into_iter().for_each(unwind::drop_quietly);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued task costs a hash-map slot of an id and a record: keep the record small. (80:
    /// the outcome is kept here, 24 bytes, and the unread-handle flag, in place of an 8-byte
    /// pointer to a completion of about 80 bytes that every task used to allocate.)
    #[test]
    fn a_record_stays_small() {
        assert!(
            std::mem::size_of::<Record>() <= 80,
            "{}",
            std::mem::size_of::<Record>()
        );
    }

    /// A task waiting for its due time costs a slot of an id and this, and a 16-byte entry in
    /// the delayed heap: 96 bytes per delayed task is the target (scheduled-thread-pool's).
    #[test]
    fn a_dormant_task_stays_smaller() {
        assert!(
            std::mem::size_of::<Dormant>() <= 32,
            "{}",
            std::mem::size_of::<Dormant>()
        );
    }
}
