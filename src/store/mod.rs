//! The seam between the pool and where tasks wait.
//!
//! [`Store`] is everything the layer above needs of a store, type-erased: the pool, its handles,
//! a handler's context and the worker runtime talk to a store only through it, and nothing above
//! this module knows which store it runs on. The typed side (task types, payloads, outputs,
//! handles) lives above, in `pool.rs`, `handle.rs` and `submit.rs`; a store sees a task's
//! payload and output as `dyn Any` and its type as an index into the [`Registry`].
//!
//! A store decides which task comes next, keeps every task's state, and carries out retries,
//! dead letters, dependencies, cancellation, retention and shutdown. The embedded store
//! (`memory`) keeps tasks in one process; a durable store sits beside it behind the same trait.

use std::any::Any;
use std::fmt;
use std::time::{Duration, Instant};

use crate::gates::breaker::Verdict;
use crate::model::cancel::CancelToken;
use crate::model::clock::Clock;
use crate::model::completion::Completion;
use crate::model::dead_letter::DeadLetter;
use crate::model::error::{CancelError, ResubmitError, SubmitErrorKind, WaitError};
use crate::model::id::TaskId;
use crate::model::pause::{PauseError, PauseTarget, Paused};
use crate::model::queue_limit::{QueueLimit, QueueLimitError};
use crate::model::schedule::ScheduleInfo;
use crate::model::state::{CancelOutcome, Failure, FailureReason, TaskState};
use crate::model::task::{Dependency, Start};
use crate::observe::console::overview::Overview;
use crate::observe::metrics::{Ended, RunEnd};
use crate::observe::stats::{Stats, TaskFilter, TaskInfo, Totals, TypeStats};
use crate::store::hub::Hub;
use crate::store::registry::{Registry, Settings};
use crate::store::schedule::{ScheduleDef, Tick};
use crate::sync::Arc;

pub(crate) mod hub;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod registry;
pub(crate) mod schedule;

/// The hub of a pool's handles (see `hub.rs`), handing out the store.
pub(crate) type StoreHub = Hub<dyn Store>;

/// A task on its way into a store. The store reads what it needs, and takes the payload out of
/// `payload` only once it has accepted the task: a refused or deduplicated task keeps it, so the
/// caller can hand the whole task back (or drop it outside any lock).
pub(crate) struct Submission<'a> {
    /// Checked against the registry by the caller.
    pub(crate) type_index: u32,
    pub(crate) priority: u8,
    /// When it may first run, turned into a due time on the store's own clock.
    pub(crate) start: Start,
    pub(crate) dependencies: &'a [Dependency],
    pub(crate) key: Option<&'a str>,
    /// The key deduplicates within windows of this length: the store keeps it as
    /// `{key}@{window}`, the window read on its own clock (see `Task::unique_per`).
    pub(crate) key_period: Option<Duration>,
    /// The task's settings, fixed now (see [`Settings`]).
    pub(crate) settings: Settings,
    pub(crate) payload: &'a mut dyn PayloadSlot,
}

/// Where a submitted task's payload waits until a store takes it.
pub(crate) trait PayloadSlot {
    /// Moves the payload out, boxed. Called at most once, by the store that accepts the task.
    fn take(&mut self) -> Box<dyn Any + Send>;

    /// The payload, still in place (a durable store serializes it from here).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn peek(&self) -> &(dyn Any + Send);
}

impl<P: Send + 'static> PayloadSlot for Option<P> {
    fn take(&mut self) -> Box<dyn Any + Send> {
        Box::new(Option::take(self).expect("a store takes a payload once"))
    }

    fn peek(&self) -> &(dyn Any + Send) {
        self.as_ref().expect("the payload is in place until taken")
    }
}

// ===== a schedule's slots, on their way in (see `schedule.rs`) =====

impl ScheduleDef {
    /// A submission of `payload` as this schedule's task.
    pub(crate) fn submission<'a>(&self, payload: &'a mut MadePayload) -> Submission<'a> {
        Submission {
            type_index: self.type_index,
            priority: self.priority,
            start: Start::Now,
            dependencies: &[],
            key: None,
            key_period: None,
            settings: self.settings,
            payload,
        }
    }
}

/// A payload made for a slot, until a store takes it; dropped quietly if none does.
pub(crate) struct MadePayload(Option<Box<dyn Any + Send>>);

impl MadePayload {
    pub(crate) fn new(payload: Box<dyn Any + Send>) -> MadePayload {
        MadePayload(Some(payload))
    }
}

impl PayloadSlot for MadePayload {
    fn take(&mut self) -> Box<dyn Any + Send> {
        self.0.take().expect("a store takes a payload once")
    }

    fn peek(&self) -> &(dyn Any + Send) {
        &**self
            .0
            .as_ref()
            .expect("the payload is in place until taken")
    }
}

impl Drop for MadePayload {
    fn drop(&mut self) {
        crate::unwind::drop_quietly(self.0.take());
    }
}

/// A schedule's task was submitted and nobody holds a handle to it: what a handle dropped unread
/// at once would do (see `hub.rs`), so the store need not keep its outcome.
pub(crate) fn release(hub: &StoreHub, submitted: Submitted) {
    let Submitted { id, completion, .. } = submitted;
    match completion {
        Some(completion) => crate::unwind::drop_quietly::<Arc<Completion>>(completion),
        None => crate::unwind::drop_quietly(
            hub.handle_dropped(id.seq(), |store| store.take_in_dropped()),
        ),
    }
}

/// Makes a copy of a payload (its type's `Clone`, behind `dyn Any`): `None` if the payload is of
/// another type. See [`Store::dead_letter_payload`].
pub(crate) type CopyPayload = dyn Fn(&(dyn Any + Send)) -> Option<Box<dyn Any + Send>>;

/// What a store made of a [`Submission`] it accepted.
pub(crate) struct Submitted {
    pub(crate) id: TaskId,
    /// `None`: made when the handle first reads the task (see `hub.rs`).
    pub(crate) completion: Option<Arc<Completion>>,
    /// The task's key belonged to a live or succeeded task: this is that task, and the
    /// submission's payload was not taken.
    pub(crate) duplicate: bool,
}

/// A dead letter brought back with its dependents (see `Pool::resubmit_with_dependents`).
pub(crate) struct Revived {
    pub(crate) id: TaskId,
    pub(crate) completion: Arc<Completion>,
    /// Each dependent brought back: its old id and its new one.
    pub(crate) dependents: Vec<(TaskId, TaskId)>,
}

/// A task taken by a worker: everything the runtime needs to run it once.
pub(crate) struct Claim {
    pub(crate) id: TaskId,
    pub(crate) type_index: u32,
    /// 1 for the first run.
    pub(crate) attempt: u32,
    pub(crate) token: CancelToken,
    pub(crate) payload: Box<dyn Any + Send>,
    /// The fencing token of this claim's lease, on a store that leases its claims.
    pub(crate) lease: Option<i64>,
    /// The lane of workers it was claimed for, on a store that claims for each lane (the
    /// durable store, `postgres/store.rs`); 0 on the others.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) lane: u32,
    /// The task's own settings, fixed at submit; `None`: its type's, as this pool registered
    /// it (every task of the embedded store that set none of its own).
    pub(crate) settings: Option<Settings>,
    /// When a worker took it, on the pool's clock: its run's time is measured from here (one
    /// reading of the clock per run instead of two).
    pub(crate) claimed_at: Instant,
}

/// What the runtime made of one run.
pub(crate) enum RunOutcome {
    Succeeded(Box<dyn Any + Send + Sync>),
    /// A retryable error with attempts left: run again after `delay`.
    Retry {
        delay: Duration,
        error: String,
    },
    /// A dead letter (the store fills in the attempts).
    Failed(Failure),
}

impl RunOutcome {
    /// How the metrics count the run.
    pub(crate) fn ended(&self) -> Ended {
        match self {
            RunOutcome::Succeeded(_) => Ended::Succeeded,
            RunOutcome::Retry { .. } => Ended::Retried,
            RunOutcome::Failed(_) => Ended::Failed,
        }
    }

    /// What the run says about its type's downstream (see `breaker.rs`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn verdict(&self) -> Verdict {
        match self {
            RunOutcome::Succeeded(_) => Verdict::Success,
            RunOutcome::Retry { .. } => Verdict::Failure,
            RunOutcome::Failed(failure) => match failure.reason {
                FailureReason::Exhausted | FailureReason::TimedOut => Verdict::Failure,
                _ => Verdict::Neither,
            },
        }
    }
}

/// What a shutdown's drain did.
pub(crate) struct Drained {
    pub(crate) deadline_reached: bool,
    /// The totals when the pool closed.
    pub(crate) before: Totals,
    /// The tasks still running when the drain ended, with their types' names.
    pub(crate) interrupted: Vec<(TaskId, &'static str)>,
}

/// Where tasks wait. Object-safe: the pool holds an `Arc<dyn Store>`; the worker runtime is
/// generic over the store it runs (the hot path, claim and complete, is not a virtual call).
///
/// Every method may be called from any thread, concurrently. None runs user code under a lock
/// of the store: a user value the store drops (a payload, an output, an error) is dropped after
/// the lock is released, inside `catch_unwind`.
pub(crate) trait Store: Send + Sync + fmt::Debug {
    // ===== identity =====

    /// The pool id: the first half of every [`TaskId`] this store gives out.
    fn pool_id(&self) -> u64;

    /// The task types, by the index a [`Submission`] and a [`Claim`] carry.
    fn registry(&self) -> &Registry;

    // ===== tasks =====

    /// Whether the store is closed to new tasks (a shutdown began, or the pool was dropped).
    fn is_closed(&self) -> bool;

    /// Accepts a task, or says why not (the submission keeps its payload then).
    fn submit(&self, task: Submission<'_>) -> Result<Submitted, SubmitErrorKind>;

    /// Accepts every task of `batch`, or none: the index of the first refused task and why.
    /// Tasks whose key another task holds (before the batch, or earlier in it) are that task.
    fn submit_batch(
        &self,
        batch: &mut [Submission<'_>],
    ) -> Result<Vec<Submitted>, (usize, SubmitErrorKind)>;

    fn cancel(&self, id: TaskId) -> Result<CancelOutcome, CancelError>;

    /// The live or succeeded task holding idempotency key `key`, if any.
    fn find_key(&self, key: &str) -> Option<TaskId>;

    /// Cancels the live or succeeded task holding `key`, as [`cancel`](Store::cancel) does, in
    /// one step with finding it; returns its id with what the cancel did.
    fn cancel_key(&self, key: &str) -> Result<(TaskId, CancelOutcome), CancelError>;

    fn status(&self, id: TaskId) -> Option<TaskState>;

    fn info(&self, id: TaskId) -> Option<TaskInfo>;

    /// A page of the tasks `filter` keeps, by id: at most `limit`, from the first after `after`
    /// (the first of all with `None`), as [`dead_letters`](Store::dead_letters) pages.
    fn tasks(&self, filter: &TaskFilter, after: Option<TaskId>, limit: usize) -> Vec<TaskInfo>;

    /// Someone waits for `id`'s outcome through `completion`, which is not published yet. A
    /// store whose tasks may end in another process makes sure the outcome reaches it; the
    /// embedded store publishes every outcome anyway.
    fn watch(&self, id: TaskId, completion: &Arc<Completion>) {
        let _ = (id, completion);
    }

    /// A task's type index and completion, to make a handle for it.
    fn completion_of(&self, id: TaskId) -> Option<(u32, Arc<Completion>)>;

    /// The completion of a task whose handle was made without one (see `hub.rs`), kept for
    /// that handle even if the store forgot the task meanwhile.
    fn completion_for(&self, id: TaskId) -> Option<Arc<Completion>> {
        self.completion_of(id).map(|(_, completion)| completion)
    }

    /// What this store's handles share.
    fn hub(&self) -> &Arc<StoreHub>;

    /// Takes in the drops of unread handles queued on the hub (see `hub.rs`), now: called by
    /// a handle's drop when many are queued and nobody took them in (an idle pool). Nothing to
    /// do for a store whose handles always hold their completion (they never queue a drop).
    fn take_in_dropped(&self) {}

    fn stats(&self) -> Stats;

    /// As [`stats`](Store::stats), or the reason the store could not be read (a durable
    /// store's database away).
    fn try_stats(&self) -> Result<Stats, String> {
        Ok(self.stats())
    }

    /// Each registered type's backlog, in registry order. May cost a scan of the ready tasks.
    fn type_stats(&self) -> Vec<TypeStats>;

    /// The queue's figures for an operator, or why they could not be read. The embedded store
    /// makes a pass over its records; the durable store reads what `postgres::Admin` reads.
    fn overview(&self) -> Result<Overview, String>;

    /// What the alerts check: [`stats`](Store::stats) and (if `types`)
    /// [`type_stats`](Store::type_stats), or `None` if the store could not read them (a
    /// durable store's database away), so no alert clears on a reading of zeros.
    fn backlog(&self, types: bool) -> Option<(Stats, Vec<TypeStats>)> {
        let type_stats = if types { self.type_stats() } else { Vec::new() };
        Some((self.stats(), type_stats))
    }

    // ===== dead letters =====

    fn dead_letters(
        &self,
        after: Option<TaskId>,
        type_index: Option<u32>,
        limit: usize,
    ) -> Vec<DeadLetter>;

    fn purge_dead_letter(&self, id: TaskId) -> bool;

    /// Runs dead letter `id`, of type `type_index`, again as a new task.
    fn resubmit(
        &self,
        id: TaskId,
        type_index: u32,
    ) -> Result<(TaskId, Arc<Completion>), ResubmitError>;

    fn resubmit_with_dependents(
        &self,
        id: TaskId,
        type_index: u32,
    ) -> Result<Revived, ResubmitError>;

    /// Moves a dead letter's payload out (the caller downcasts and drops it).
    fn take_dead_letter(&self, id: TaskId, type_index: u32) -> Option<Box<dyn Any + Send>>;

    /// A copy of dead letter `id`'s payload, if it is a dead letter of type `type_index`; the
    /// dead letter keeps its own. `copy` makes it from the payload (the type's `Clone`, user
    /// code: called outside any lock, inside `catch_unwind`; `None` if it panicked); a durable
    /// store decodes the stored JSON instead, a fresh value, and never calls it.
    fn dead_letter_payload(
        &self,
        id: TaskId,
        type_index: u32,
        copy: &CopyPayload,
    ) -> Option<Box<dyn Any + Send>>;

    // ===== pauses =====

    /// Pauses `target`: once this returns, no task it covers starts (tasks claimed before
    /// finish). `Ok(false)` if it was paused already.
    fn pause(&self, target: &PauseTarget) -> Result<bool, PauseError>;

    /// Resumes `target` and wakes workers for what it held. `Ok(false)` if it was not paused.
    fn resume(&self, target: &PauseTarget) -> Result<bool, PauseError>;

    /// The pauses in force, types first, then queues, each by name.
    fn paused(&self) -> Result<Vec<Paused>, PauseError>;

    // ===== queue limits =====

    /// Sets or lifts queue `queue`'s limit (checked by the caller); returns the one before.
    /// Once this returns, no start takes the queue past it (tasks running beyond a lowered
    /// limit finish).
    fn set_queue_limit(
        &self,
        queue: &str,
        limit: Option<u32>,
    ) -> Result<Option<u32>, QueueLimitError>;

    /// The queues' limits in force, by name.
    fn queue_limits(&self) -> Result<Vec<QueueLimit>, QueueLimitError>;

    // ===== schedules =====

    /// Starts keeping `schedules` (a durable store adds the definitions the fleet does not have
    /// yet), each from now: no slot before it runs.
    fn register_schedules(&self, schedules: &[ScheduleDef]) -> Result<(), String>;

    /// Decides `schedule`'s due slots and submits their tasks (see `schedule.rs`).
    fn tick_schedule(&self, schedule: &ScheduleDef) -> Result<Tick, String>;

    /// The schedules, by name (a durable store's: the fleet's).
    fn schedules(&self) -> Result<Vec<ScheduleInfo>, String>;

    // ===== waiting and shutdown =====

    /// Blocks until nothing can run without time passing (nothing running, nothing ready but
    /// what a gate holds until a time, nothing due), or until `deadline`, in real time
    /// (`Instant::now()`) whatever the store's clock. The caller has refused calls from this
    /// pool's own handlers.
    fn wait_idle(&self, deadline: Option<Instant>) -> Result<(), WaitError>;

    /// Blocks until nothing is left at all, or until `deadline`, in real time.
    fn wait_empty(&self, deadline: Option<Instant>) -> Result<(), WaitError>;

    /// The clock the store's times and deadlines are on.
    fn clock(&self) -> &Clock;

    /// Closes the store to new tasks, lets the workers drain what can still finish until
    /// `deadline`, then stops it: whatever is left is cancelled, running handlers see their
    /// tokens fire. `from_handler`: the caller is one of the pool's handlers.
    fn drain(&self, from_handler: bool, deadline: Option<Instant>) -> Drained;

    /// Waits until every worker has left its loop, except those whose handlers are themselves
    /// in `shutdown`; returns the totals then.
    fn wait_for_workers(&self, from_handler: bool) -> Totals;

    /// Stops at once (the pool is dropped): cancels what has not started, fires the tokens of
    /// what runs, does not wait.
    fn stop_now(&self);

    /// Checks the store's internal invariants, naming the first one broken.
    fn check_invariants(&self) -> Result<(), String>;

    // ===== the worker runtime =====

    /// Blocks until a task can run, and claims it for worker `worker` (its index, from 0);
    /// `None` when the worker should exit. `spare` is a token the claim may use instead of
    /// allocating one.
    fn claim(&self, worker: usize, spare: Option<CancelToken>) -> Option<Claim>;

    /// Records the outcome of a claimed task's run, then claims the next task as
    /// [`claim`](Store::claim) does (at once when a task is ready). `token` is the finished
    /// claim's token, which the next claim reuses if nobody else holds it. `run` is counted in
    /// the metrics at the time the store reads to record the outcome (the worker does not read
    /// the clock itself), before the outcome is published: whoever sees the outcome sees the
    /// run counted.
    fn complete_and_claim(
        &self,
        claim: Claim,
        outcome: RunOutcome,
        token: CancelToken,
        run: RunEnd<'_>,
    ) -> Option<Claim>;

    /// A worker's loop panicked while it held `held` (the engine's own bug): the task ends
    /// failed with `message`, and the panic is counted.
    fn worker_panicked(&self, held: Option<TaskId>, message: String);

    /// A worker's loop ended (or a worker never started).
    fn worker_exited(&self);

    // ===== the durable store's own =====

    /// Adds a task inside the caller's open transaction: it exists only if that transaction
    /// commits. Returns its id, and whether its key made it a duplicate of that task (the
    /// submission's payload was not taken then). Only the durable store can.
    #[cfg(feature = "postgres")]
    fn submit_in(
        &self,
        tx: &mut ::postgres::Transaction<'_>,
        task: Submission<'_>,
    ) -> Result<(TaskId, bool), SubmitErrorKind> {
        let _ = (tx, task);
        Err(SubmitErrorKind::NotDurable)
    }

    /// Ends task `id`, leased as `lease`, as succeeded with `output`, inside the handler's own
    /// transaction; `false` if the lease is lost (or the store has no leases).
    #[cfg(feature = "postgres")]
    fn succeed_in(
        &self,
        tx: &mut ::postgres::Transaction<'_>,
        id: TaskId,
        lease: i64,
        output: serde_json::Value,
    ) -> Result<bool, ::postgres::Error> {
        let _ = (tx, id, lease, output);
        Ok(false)
    }
}
