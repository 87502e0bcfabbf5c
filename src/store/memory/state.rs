//! The embedded store's state machine: task records, the ready queue, the delayed heap, and every
//! transition between them. Plain data under the pool's one lock: no waiting, no user code.
//!
//! # Invariants
//!
//! 1. Every accepted task has exactly one record, from submit until retention drops it (only
//!    terminal records are dropped; a dead letter's only once it stops being one). A record
//!    changes state only through the methods here. Records are keyed by their task's sequence
//!    number; a [`TaskId`] of another pool never reaches them.
//! 2. A `Ready` task has exactly one live entry in `ready`; a `Scheduled` task exactly one in
//!    `delayed`. Entries of tasks in any other state are stale and skipped when found.
//! 3. A `Blocked` task's `pending_dependencies` counts its dependencies that have not succeeded
//!    yet, is non-zero, and the task is listed in each such dependency's `dependents`. A
//!    `dependents` list may also name tasks that have ended since (cancelled while blocked) and
//!    that retention may already have forgotten: those are skipped, never looked up with
//!    `expect`.
//! 4. A `Running` task's payload is held by exactly one worker's [`Claim`], and its token is in
//!    `tokens` (no other task's is); every other non-terminal record holds its payload.
//! 5. `counts` equals the number of records in each non-terminal state.
//! 6. A record reaches a terminal state at most once; in that same step its outcome is published
//!    to its completion (exactly once), its dependents are released or cancelled, and its id is
//!    appended to `finished` (retention order).
//! 7. `closed` ⇒ no task is accepted. `stopping` ⇒ `closed`, and no task is blocked, scheduled or
//!    ready: workers exit as soon as they come back for work.
//! 8. `keys` maps a key to a task holding it that is live or succeeded; a task that fails or is
//!    cancelled gives its key up in the step that ends it.
//! 9. `dead` holds exactly the failed records that still hold their payload and were not
//!    resubmitted; a record in `dead` is kept until it leaves `dead`, retention or not.
//! 10. A cancelled record holds its payload only if a dead letter's failure cancelled it (it
//!     names that dead letter in `cascade_root`), for `resubmit_with_dependents`.
//!
//! [`State::check_invariants`] checks these (for tests; it reads every record).

use std::any::Any;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use super::Seq;
use super::queue::{DelayedQueue, Epoch, ReadyQueue};
use super::record::{Effects, Record};
use crate::cancel::CancelToken;
use crate::clock::Clock;
use crate::event::Events;
use crate::completion::{Completion, Finished};
use crate::dead_letter::DeadLetter;
use crate::error::{CancelError, ResubmitError};
use crate::registry::Registry;
use crate::stats::{Stats, TaskInfo, Totals, TypeStats};
use crate::store::{Claim, RunOutcome};
use crate::sync::Arc;
use crate::task::{
    CancelOutcome, CancelReason, Dependency, Failure, FailureReason, TaskId, TaskState,
};

/// How long terminal records are remembered (for handles' status, keys and dead letters).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retention {
    pub(crate) max_count: usize,
    pub(crate) max_age: Option<Duration>,
    /// Dead letters kept until taken or resubmitted, at most this many (the oldest go first).
    pub(crate) max_dead_letters: usize,
}

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

type IdMap<V> = HashMap<Seq, V, BuildHasherDefault<IdHasher>>;

/// Records per non-terminal state (invariant 5).
#[derive(Default, Clone, Copy)]
struct Counts {
    blocked: usize,
    scheduled: usize,
    ready: usize,
    running: usize,
}

impl Counts {
    fn slot(&mut self, state: TaskState) -> Option<&mut usize> {
        match state {
            TaskState::Blocked => Some(&mut self.blocked),
            TaskState::Scheduled => Some(&mut self.scheduled),
            TaskState::Ready => Some(&mut self.ready),
            TaskState::Running => Some(&mut self.running),
            _ => None,
        }
    }

    fn enter(&mut self, state: TaskState) {
        if let Some(n) = self.slot(state) {
            *n += 1;
        }
    }

    fn leave(&mut self, state: TaskState) {
        if let Some(n) = self.slot(state) {
            *n -= 1;
        }
    }

    fn outstanding(&self) -> usize {
        self.blocked + self.scheduled + self.ready + self.running
    }
}

/// How a task ends.
enum End {
    Succeeded(Box<dyn Any + Send + Sync>),
    Failed(Failure),
    Cancelled(CancelReason),
}

/// A validated task, ready to insert.
pub(crate) struct NewTask {
    pub(crate) type_index: u32,
    pub(crate) payload: Box<dyn Any + Send>,
    pub(crate) priority: u8,
    pub(crate) run_at: Instant,
    /// The pool's own dependencies, checked by [`State::resolve_dependencies`].
    pub(crate) dependencies: Vec<Seq>,
    pub(crate) key: Option<Arc<str>>,
}

/// Everything the pool's lock guards.
pub(crate) struct State {
    records: IdMap<Record>,
    /// The tokens of running tasks (invariant 4), out of the records to keep those small.
    tokens: IdMap<CancelToken>,
    epoch: Epoch,
    ready: ReadyQueue,
    delayed: DelayedQueue,
    /// Idempotency keys of live and succeeded tasks.
    keys: HashMap<Arc<str>, Seq>,
    /// Terminal tasks, with when they finished, in that order: retention drops from the front
    /// (without reading the old record to learn its age).
    finished: VecDeque<(Seq, Instant)>,
    /// Dead letters: failed tasks not yet resubmitted or taken, in id order. Kept past
    /// retention, up to `retention.max_dead_letters`.
    dead: BTreeSet<Seq>,
    /// This pool's id: the first half of every [`TaskId`] it gives.
    pool: u64,
    /// Where dead letters are reported (a channel send: no user code runs under the lock).
    events: Events,
    /// The task types' names, by index.
    names: Vec<&'static str>,
    counts: Counts,
    totals: Totals,
    next_id: u64,
    retention: Retention,
    /// No more tasks are accepted (invariant 7).
    pub(crate) closed: bool,
    /// Workers exit when they come back for work (invariant 7).
    pub(crate) stopping: bool,
    /// Workers waiting, untimed, for work (wake-up protocol, see `mod.rs`).
    pub(crate) idle: usize,
    /// Idle workers notified and not yet running again (wake-up protocol).
    pub(crate) notified: usize,
    /// Whether one worker is sleeping until the earliest due time.
    pub(crate) timer_sleeping: bool,
    /// Whether that worker was notified and is not yet running again.
    pub(crate) timer_notified: bool,
    /// Worker threads that have not exited.
    pub(crate) live_workers: usize,
    /// Handlers blocked in `Pool::shutdown` of their own pool: their tasks cannot finish while
    /// the drain waits.
    pub(crate) handlers_in_shutdown: usize,
}

impl State {
    /// `epoch`: the pool's start on its clock; no due time is earlier.
    pub(crate) fn new(
        retention: Retention,
        workers: usize,
        epoch: Instant,
        pool: u64,
        events: Events,
        names: Vec<&'static str>,
    ) -> Self {
        State {
            pool,
            events,
            names,
            records: IdMap::default(),
            tokens: IdMap::default(),
            epoch: Epoch(epoch),
            ready: ReadyQueue::new(),
            delayed: DelayedQueue::new(Epoch(epoch)),
            keys: HashMap::new(),
            finished: VecDeque::new(),
            dead: BTreeSet::new(),
            counts: Counts::default(),
            totals: Totals::default(),
            next_id: 1,
            retention,
            closed: false,
            stopping: false,
            idle: 0,
            notified: 0,
            timer_sleeping: false,
            timer_notified: false,
            live_workers: workers,
            handlers_in_shutdown: 0,
        }
    }

    /// Tasks that have not reached a terminal state.
    pub(crate) fn outstanding(&self) -> usize {
        self.counts.outstanding()
    }

    /// Whether a shutdown's drain is over: no task is ready, scheduled or running except the
    /// tasks of handlers waiting in `shutdown` themselves. Blocked tasks need not be counted:
    /// dependencies are acyclic, so every blocked task waits, through a chain, on a ready,
    /// scheduled or running one; if only handlers in shutdown run, nothing left can progress.
    ///
    /// If every live worker is such a handler, nothing queued can run either: the drain is over
    /// too, and what is left is cancelled.
    pub(crate) fn drained(&self) -> bool {
        let running_elsewhere = self
            .counts
            .running
            .saturating_sub(self.handlers_in_shutdown);
        let queued = self.counts.ready + self.counts.scheduled;
        let free_workers = self.live_workers.saturating_sub(self.handlers_in_shutdown);
        running_elsewhere == 0 && (queued == 0 || free_workers == 0)
    }

    /// Whether no task is ready or running, and none is due at `now`: what is left waits for a
    /// later run_at or for a dependency.
    pub(crate) fn is_idle(&mut self, now: Instant) -> bool {
        self.counts.ready == 0
            && self.counts.running == 0
            && self.earliest_due().is_none_or(|due| due > now)
    }

    /// Nothing ready or running (due times not looked at).
    pub(crate) fn counts_idle(&self) -> bool {
        self.counts.ready == 0 && self.counts.running == 0
    }

    pub(crate) fn has_scheduled(&self) -> bool {
        self.counts.scheduled > 0
    }

    pub(crate) fn totals(&self) -> Totals {
        self.totals
    }

    pub(crate) fn count_worker_panic(&mut self) {
        self.totals.worker_panics += 1;
    }

    // ===== submit =====

    /// The public id of this pool's task `seq`.
    pub(crate) fn id(&self, seq: Seq) -> TaskId {
        TaskId::from_parts(self.pool, seq)
    }

    /// `id`'s sequence number, if it is an id of this pool.
    pub(crate) fn local(&self, id: TaskId) -> Option<Seq> {
        (id.pool() == self.pool).then_some(id.seq())
    }

    /// The record of `id`, if it is this pool's and still remembered.
    fn record(&self, id: TaskId) -> Option<(Seq, &Record)> {
        let seq = self.local(id)?;
        self.records.get(&seq).map(|record| (seq, record))
    }

    /// The id the next accepted task gets.
    pub(crate) fn next_id(&self) -> TaskId {
        self.id(self.next_id)
    }

    /// The live or succeeded task holding `key` (invariant 8), and its type.
    pub(crate) fn find_key(&self, key: &str) -> Option<(TaskId, u32, Arc<Completion>)> {
        let seq = *self.keys.get(key)?;
        let record = &self.records[&seq];
        Some((
            self.id(seq),
            record.type_index,
            Arc::clone(&record.completion),
        ))
    }

    /// The dependencies still to wait for, by sequence number: one the pool forgot is satisfied
    /// if its handle saw it succeed. `Err` names the first that is foreign or unknown.
    pub(crate) fn resolve_dependencies(
        &self,
        dependencies: &[Dependency],
    ) -> Result<Vec<Seq>, TaskId> {
        if dependencies.is_empty() {
            return Ok(Vec::new());
        }
        let mut seqs = Vec::with_capacity(dependencies.len());
        for dependency in dependencies {
            match self.record(dependency.id) {
                Some((seq, _)) => seqs.push(seq),
                None if dependency.succeeded() && self.local(dependency.id).is_some() => {}
                None => return Err(dependency.id),
            }
        }
        Ok(seqs)
    }

    /// Accepts a validated task (its dependencies are known, its key is free).
    pub(crate) fn insert(
        &mut self,
        mut task: NewTask,
        completion: Arc<Completion>,
        now: Instant,
        effects: &mut Effects,
    ) -> (TaskId, Arc<Completion>) {
        let id = self.next_id;
        self.next_id += 1;
        self.totals.submitted += 1;

        task.dependencies.sort_unstable();
        task.dependencies.dedup();
        // A dependency that already failed or was cancelled cancels this task at once.
        let doomed = task
            .dependencies
            .iter()
            .find_map(|dep| match self.records[dep].state {
                TaskState::Failed => Some(CancelReason::DependencyFailed(self.id(*dep))),
                TaskState::Cancelled => Some(CancelReason::DependencyCancelled(self.id(*dep))),
                _ => None,
            });
        let mut pending = 0;
        if doomed.is_none() {
            for dep in &task.dependencies {
                let record = self.records.get_mut(dep).expect("dependencies checked");
                if record.state != TaskState::Succeeded {
                    // Keeps invariant 3.
                    record.extra().dependents.push(id);
                    pending += 1;
                }
            }
        }

        let mut record = Record {
            state: TaskState::Blocked,
            type_index: task.type_index,
            priority: task.priority,
            attempts: 0,
            pending_dependencies: pending,
            since: self.epoch.stamp(task.run_at),
            payload: Some(task.payload),
            completion: Arc::clone(&completion),
            extra: None,
        };
        if let Some(key) = task.key {
            self.keys.insert(Arc::clone(&key), id);
            record.extra().key = Some(key);
        }
        if !task.dependencies.is_empty() {
            // Kept to bring the task back if a failed dependency cancels it.
            record.extra().dependencies = std::mem::take(&mut task.dependencies);
        }
        self.records.insert(id, record);
        self.counts.enter(TaskState::Blocked);
        // Cancelled at once by a dead letter, directly or through a task it cancelled: part of
        // what that dead letter brings back.
        let cascade_root = match doomed {
            Some(CancelReason::DependencyFailed(failed)) => Some(failed.seq()),
            Some(CancelReason::DependencyCancelled(cancelled)) => self
                .records
                .get(&cancelled.seq())
                .and_then(|r| r.extra.as_ref()?.cascade_root),
            _ => None,
        };
        if let Some(root) = cascade_root {
            if let Some(extra) = self.records.get_mut(&root).and_then(|r| r.extra.as_mut()) {
                extra.cascade.push(id);
            }
            if let Some(record) = self.records.get_mut(&id) {
                record.extra().cascade_root = Some(root);
            }
        }

        if let Some(reason) = doomed {
            self.finish(id, End::Cancelled(reason), now, effects);
        } else if pending == 0 {
            self.make_runnable(id, now, effects);
        }
        (self.id(id), completion)
    }

    /// A task with no dependency left becomes scheduled (due later) or ready.
    fn make_runnable(&mut self, id: Seq, now: Instant, effects: &mut Effects) {
        let now = self.epoch.stamp(now);
        let record = self.records.get_mut(&id).expect("record exists");
        let run_at = record.since;
        self.counts.leave(record.state);
        if run_at > now {
            record.state = TaskState::Scheduled;
            // Keeps invariant 2.
            effects.new_earliest |= self.delayed.push(run_at, id);
        } else {
            record.state = TaskState::Ready;
            record.since = now;
            self.ready.push(record.priority, id);
            effects.newly_ready += 1;
        }
        self.counts.enter(record.state);
    }

    // ===== claim and complete =====

    /// Moves every due scheduled task to the ready queue; returns how many.
    pub(crate) fn promote_due(&mut self, now: Instant) -> usize {
        let stamp = self.epoch.stamp(now);
        let mut promoted = 0;
        while let Some(id) = self.delayed.pop_due(now) {
            let Some(record) = self.records.get_mut(&id) else {
                continue;
            };
            if record.state != TaskState::Scheduled {
                continue; // stale entry (invariant 2)
            }
            self.counts.leave(TaskState::Scheduled);
            record.state = TaskState::Ready;
            record.since = stamp;
            self.ready.push(record.priority, id);
            self.counts.enter(TaskState::Ready);
            promoted += 1;
        }
        promoted
    }

    /// The earliest due time of a scheduled task.
    pub(crate) fn earliest_due(&mut self) -> Option<Instant> {
        let records = &self.records;
        self.delayed.earliest(|id| {
            records
                .get(&id)
                .is_some_and(|r| r.state == TaskState::Scheduled)
        })
    }

    /// Ready tasks.
    pub(crate) fn ready_len(&self) -> usize {
        self.counts.ready
    }

    /// Takes the next ready task for a worker, giving it `spare` as its token if there is one.
    pub(crate) fn claim_next(
        &mut self,
        now: Instant,
        clock: &Clock,
        spare: &mut Option<CancelToken>,
    ) -> Option<Claim> {
        let records = &self.records;
        let seq = self.ready.pop(|seq| {
            records
                .get(&seq)
                .is_some_and(|r| r.state == TaskState::Ready)
        })?;
        let id = self.id(seq);
        let record = self.records.get_mut(&seq)?;
        self.counts.leave(TaskState::Ready);
        self.counts.enter(TaskState::Running);
        record.state = TaskState::Running;
        record.since = self.epoch.stamp(now);
        record.attempts += 1;
        let token = spare
            .take()
            .unwrap_or_else(|| CancelToken::new(clock.clone()));
        self.tokens.insert(seq, token.clone());
        // Keeps invariant 4: a ready record holds its payload, so `take` finds one.
        let payload = record.payload.take()?;
        Some(Claim {
            id,
            type_index: record.type_index,
            attempt: record.attempts,
            token,
            payload,
            lease: None,
        })
    }

    /// Records the outcome of a run.
    pub(crate) fn complete(
        &mut self,
        claim: Claim,
        outcome: RunOutcome,
        now: Instant,
        effects: &mut Effects,
    ) {
        let seq = claim.id.seq();
        self.tokens.remove(&seq);
        let Some(record) = self.records.get_mut(&seq) else {
            debug_assert!(false, "a running task has a record");
            return;
        };
        debug_assert_eq!(record.state, TaskState::Running);

        // A cancel (or the shutdown deadline) that reached the running task wins over whatever
        // the handler returned.
        if let Some(reason) = record.cancel_requested() {
            effects.drop_later(claim.payload);
            match outcome {
                RunOutcome::Succeeded(output) => effects.drop_later(output),
                RunOutcome::Failed(failure) => effects.drop_later(Box::new(failure)),
                RunOutcome::Retry { .. } => {}
            }
            self.finish(seq, End::Cancelled(reason), now, effects);
            return;
        }
        match outcome {
            RunOutcome::Succeeded(output) => {
                effects.drop_later(claim.payload);
                self.finish(seq, End::Succeeded(output), now, effects);
            }
            RunOutcome::Retry { delay, error } => {
                record.payload = Some(claim.payload);
                record.extra().last_error = Some(error);
                self.totals.retried += 1;
                // A delay past what a stamp holds waits as long as a stamp can say.
                record.since = match now.checked_add(delay) {
                    Some(at) => self.epoch.stamp(at),
                    None => u64::MAX,
                };
                self.make_runnable(seq, now, effects);
            }
            RunOutcome::Failed(mut failure) => {
                record.payload = Some(claim.payload);
                failure.attempts = record.attempts;
                self.finish(seq, End::Failed(failure), now, effects);
            }
        }
    }

    /// A worker panicked in the engine's own code while it held `id` (a bug): the task ends
    /// failed, as panicked, so that it reaches a terminal state and every wait on it returns.
    /// Its payload went with the worker's stack, so it cannot be resubmitted.
    pub(crate) fn abandon(
        &mut self,
        id: TaskId,
        message: String,
        now: Instant,
        effects: &mut Effects,
    ) {
        let seq = id.seq();
        self.tokens.remove(&seq);
        let Some(record) = self.records.get_mut(&seq) else {
            return;
        };
        if record.state != TaskState::Running {
            return;
        }
        let failure = Failure::new(FailureReason::Panicked, record.attempts, message, None);
        self.finish(seq, End::Failed(failure), now, effects);
    }

    // ===== endings =====

    /// Ends a task, then releases or cancels its dependents, transitively (invariant 6).
    fn finish(&mut self, seq: Seq, end: End, now: Instant, effects: &mut Effects) {
        let root = seq;
        // A dead letter's cascade keeps the payloads of the dependents it cancels, to bring them
        // back with it (`resubmit_with_dependents`).
        let keep_payloads = matches!(end, End::Failed(_));
        let mut cascade = Vec::new();
        // Cascades are rare: the stack allocates only when a dependent must be cancelled.
        let mut next = Some((seq, end));
        let mut work = Vec::new();
        while let Some((seq, end)) = next.take().or_else(|| work.pop()) {
            let Some(record) = self.records.get_mut(&seq) else {
                continue; // invariant 3: a dependent that ended and was forgotten
            };
            if record.state.is_terminal() {
                continue; // reached twice through two cancelled dependencies
            }
            if seq != root {
                cascade.push(seq);
            }
            if record.state == TaskState::Ready {
                self.ready.forget(record.priority);
            }
            self.counts.leave(record.state);
            record.since = self.epoch.stamp(now);
            let finished = match end {
                End::Succeeded(output) => {
                    record.state = TaskState::Succeeded;
                    self.totals.succeeded += 1;
                    Finished::Succeeded(Some(output))
                }
                End::Failed(failure) => {
                    // A dead letter keeps its payload, to be resubmitted (invariant 9).
                    record.state = TaskState::Failed;
                    self.totals.failed += 1;
                    if record.payload.is_some() {
                        self.dead.insert(seq);
                    }
                    record.extra().failure = Some(failure.clone());
                    let name = self.names.get(record.type_index as usize).copied();
                    self.events.dead_letter(
                        TaskId::from_parts(self.pool, seq),
                        name.unwrap_or("?"),
                        &failure,
                    );
                    Finished::Failed(Box::new(failure))
                }
                End::Cancelled(reason) => {
                    record.state = TaskState::Cancelled;
                    self.totals.cancelled += 1;
                    // So does a task submitted after such a cascade (cancelled here at once).
                    let keep = if seq == root {
                        record
                            .extra
                            .as_ref()
                            .is_some_and(|e| e.cascade_root.is_some())
                    } else {
                        keep_payloads
                    };
                    if keep && seq != root {
                        record.extra().cascade_root = Some(root);
                    }
                    if !keep {
                        if let Some(payload) = record.payload.take() {
                            effects.drop_later(payload);
                        }
                    }
                    Finished::Cancelled(reason)
                }
            };
            let state = record.state;
            let (dependents, key) = match record.extra.as_mut() {
                Some(extra) => (std::mem::take(&mut extra.dependents), extra.key.clone()),
                None => (Vec::new(), None),
            };
            // Published under the lock, in the same step as the state change: whoever sees the
            // task terminal (its dependents' handlers, `status`, `wait_idle`) finds its outcome.
            record.completion.publish(finished);
            self.finished.push_back((seq, now));
            if state != TaskState::Succeeded {
                // Keeps invariant 8.
                self.release_key(key.as_deref(), seq);
            }

            let id = self.id(seq);
            for dependent in dependents {
                // Invariant 3: a dependent that is no longer blocked (or no longer remembered)
                // was cancelled meanwhile.
                let Some(record) = self.records.get_mut(&dependent) else {
                    continue;
                };
                if record.state != TaskState::Blocked {
                    continue;
                }
                match state {
                    TaskState::Succeeded => {
                        record.pending_dependencies -= 1;
                        if record.pending_dependencies == 0 {
                            self.make_runnable(dependent, now, effects);
                        }
                    }
                    TaskState::Failed => work.push((
                        dependent,
                        End::Cancelled(CancelReason::DependencyFailed(id)),
                    )),
                    _ => work.push((
                        dependent,
                        End::Cancelled(CancelReason::DependencyCancelled(id)),
                    )),
                }
            }
        }
        if keep_payloads && !cascade.is_empty() {
            if let Some(record) = self.records.get_mut(&root) {
                record.extra().cascade = cascade;
            }
        }
        self.enforce_dead_letter_limit(effects);
        self.enforce_retention(now, effects);
    }

    /// Frees `key` if `seq` holds it.
    fn release_key(&mut self, key: Option<&str>, seq: Seq) {
        if let Some(key) = key {
            if self.keys.get(key) == Some(&seq) {
                self.keys.remove(key);
            }
        }
    }

    /// Cancels a task: at once if it has not started, through its token if it runs.
    pub(crate) fn cancel(
        &mut self,
        id: TaskId,
        reason: CancelReason,
        now: Instant,
        effects: &mut Effects,
    ) -> Result<CancelOutcome, CancelError> {
        let seq = self.local(id).ok_or(CancelError::UnknownTask(id))?;
        let record = self
            .records
            .get_mut(&seq)
            .ok_or(CancelError::UnknownTask(id))?;
        match record.state {
            state if state.is_terminal() => Ok(CancelOutcome::AlreadyFinished(state)),
            TaskState::Running => {
                let extra = record.extra();
                if extra.cancel_requested.is_none() {
                    extra.cancel_requested = Some(reason);
                }
                if let Some(token) = self.tokens.get(&seq) {
                    token.cancel();
                }
                Ok(CancelOutcome::Signalled)
            }
            _ => {
                self.finish(seq, End::Cancelled(reason), now, effects);
                Ok(CancelOutcome::Cancelled)
            }
        }
    }

    /// The shutdown deadline passed (or the pool was dropped): every task that has not started is
    /// cancelled, every running one has its token fired, and workers exit (invariant 7). Returns
    /// the tasks still running.
    pub(crate) fn stop(&mut self, now: Instant, effects: &mut Effects) -> Vec<(TaskId, u32)> {
        self.closed = true;
        self.stopping = true;
        let mut waiting: Vec<Seq> = Vec::new();
        let mut running = Vec::new();
        for (&seq, record) in &mut self.records {
            match record.state {
                TaskState::Running => {
                    let extra = record.extra();
                    extra.cancel_requested.get_or_insert(CancelReason::Shutdown);
                    running.push((TaskId::from_parts(self.pool, seq), record.type_index));
                }
                state if !state.is_terminal() => waiting.push(seq),
                _ => {}
            }
        }
        for token in self.tokens.values() {
            token.cancel();
        }
        // Dependents have larger ids than their dependencies: cancelling from the largest id down
        // gives every task the reason `Shutdown` rather than a cascaded one.
        waiting.sort_unstable_by(|a, b| b.cmp(a));
        for seq in waiting {
            self.finish(seq, End::Cancelled(CancelReason::Shutdown), now, effects);
        }
        running.sort_unstable();
        running
    }

    // ===== dead letters and retention =====

    /// Runs a dead letter of type `type_index` again, as a new task with fresh attempts and the
    /// same key (if no other task took it meanwhile).
    pub(crate) fn resubmit(
        &mut self,
        id: TaskId,
        type_index: u32,
        now: Instant,
        effects: &mut Effects,
    ) -> Result<(TaskId, Arc<Completion>), ResubmitError> {
        if self.closed {
            return Err(ResubmitError::ShutDown);
        }
        let seq = self.local(id).ok_or(ResubmitError::UnknownTask(id))?;
        let record = self
            .records
            .get(&seq)
            .ok_or(ResubmitError::UnknownTask(id))?;
        if record.state != TaskState::Failed {
            return Err(ResubmitError::NotDeadLetter(id, record.state));
        }
        if let Some(new) = record.extra.as_ref().and_then(|e| e.resubmitted_as) {
            return Err(ResubmitError::AlreadyResubmitted(id, self.id(new)));
        }
        if record.payload.is_none() {
            return Err(ResubmitError::Taken(id));
        }
        if record.type_index != type_index {
            return Err(ResubmitError::TypeMismatch(id));
        }
        let key = record.key().cloned();
        if let Some(holder) = key.as_deref().and_then(|k| self.keys.get(k)) {
            return Err(ResubmitError::KeyTaken(id, self.id(*holder)));
        }
        let new_seq = self.next_id;
        let record = self.records.get_mut(&seq).expect("looked up above");
        let payload = record.payload.take().expect("checked above");
        let extra = record.extra();
        extra.resubmitted_as = Some(new_seq);
        let expired = extra.expired;
        let task = NewTask {
            type_index: record.type_index,
            payload,
            priority: record.priority,
            run_at: now,
            dependencies: Vec::new(),
            key,
        };
        self.dead.remove(&seq);
        if expired {
            self.forget(seq, effects);
        }
        // Allocated under the lock: resubmitting is rare.
        Ok(self.insert(task, Completion::new(), now, effects))
    }

    /// Resubmits a dead letter (as [`resubmit`](State::resubmit)), then brings back the
    /// dependents its failure cancelled, transitively, each as a new task with its payload,
    /// priority and key (if free), depending on the new tasks in place of the old ones. A
    /// dependency of theirs outside the cascade stays as it was; a dependent retention forgot,
    /// already brought back, or with a dependency outside the cascade that the pool forgot, is
    /// skipped (so are its own dependents, which wait for it). Returns the
    /// new task, and each dependent brought back with its new id.
    #[allow(clippy::type_complexity)]
    pub(crate) fn resubmit_with_dependents(
        &mut self,
        id: TaskId,
        type_index: u32,
        now: Instant,
        effects: &mut Effects,
    ) -> Result<(TaskId, Arc<Completion>, Vec<(TaskId, TaskId)>), ResubmitError> {
        let mut cascade = self
            .record(id)
            .and_then(|(_, r)| r.extra.as_ref())
            .map(|e| e.cascade.clone())
            .unwrap_or_default();
        let (new_id, completion) = self.resubmit(id, type_index, now, effects)?;
        // Dependencies have smaller ids than their dependents: in id order, each dependent's
        // dependencies in the cascade are back before it.
        cascade.sort_unstable();
        let mut renamed: HashMap<Seq, Seq> = HashMap::from([(id.seq(), new_id.seq())]);
        let mut brought_back = Vec::new();
        for old in cascade {
            let Some(record) = self.records.get(&old) else {
                continue;
            };
            let extra = record.extra.as_deref();
            if record.state != TaskState::Cancelled
                || record.payload.is_none()
                || extra.is_some_and(|e| e.resubmitted_as.is_some())
            {
                continue;
            }
            // A dependency outside the cascade that the pool forgot may have failed: such a
            // dependent cannot be brought back safely.
            let Some(dependencies) = extra
                .map(|e| e.dependencies.as_slice())
                .unwrap_or_default()
                .iter()
                .map(|dep| {
                    renamed
                        .get(dep)
                        .copied()
                        .or_else(|| self.records.contains_key(dep).then_some(*dep))
                })
                .collect::<Option<Vec<Seq>>>()
            else {
                continue;
            };
            let key = record
                .key()
                .filter(|k| !self.keys.contains_key(&***k))
                .cloned();
            let (type_index, priority) = (record.type_index, record.priority);
            let record = self.records.get_mut(&old).expect("looked up above");
            let payload = record.payload.take().expect("checked above");
            record.extra().resubmitted_as = Some(self.next_id);
            let task = NewTask {
                type_index,
                payload,
                priority,
                run_at: now,
                dependencies,
                key,
            };
            let (new, _) = self.insert(task, Completion::new(), now, effects);
            renamed.insert(old, new.seq());
            brought_back.push((self.id(old), new));
        }
        Ok((new_id, completion, brought_back))
    }

    /// Takes a dead letter's payload out, if it is of type `type_index`: the task stays failed
    /// but is no longer a dead letter.
    pub(crate) fn take_dead_letter(
        &mut self,
        id: TaskId,
        type_index: u32,
        effects: &mut Effects,
    ) -> Option<Box<dyn Any + Send>> {
        let seq = self.local(id)?;
        if !self.dead.contains(&seq) {
            return None;
        }
        let record = self.records.get_mut(&seq)?;
        if record.type_index != type_index {
            return None;
        }
        let payload = record.payload.take();
        let expired = record.extra().expired;
        self.dead.remove(&seq);
        if expired {
            self.forget(seq, effects);
        }
        payload
    }

    /// The dead letters, oldest first, from the first after `after` (if given), of type
    /// `type_index` (if given), at most `limit`.
    pub(crate) fn dead_letters(
        &self,
        registry: &Registry,
        after: Option<TaskId>,
        type_index: Option<u32>,
        limit: usize,
    ) -> Vec<DeadLetter> {
        let from = match after {
            Some(id) if id.pool() == self.pool => id.seq().saturating_add(1),
            Some(id) if id.pool() > self.pool => return Vec::new(),
            _ => 0,
        };
        self.dead
            .range(from..)
            .filter_map(|seq| {
                let record = &self.records[seq];
                if type_index.is_some_and(|t| t != record.type_index) {
                    return None;
                }
                let failure = record.extra.as_ref().and_then(|e| e.failure.clone())?;
                Some(DeadLetter {
                    id: self.id(*seq),
                    task_type: registry.entry(record.type_index).name,
                    priority: record.priority,
                    failure,
                    failed_at: self.epoch.instant(record.since),
                })
            })
            .take(limit)
            .collect()
    }

    /// Removes a dead letter and its record for good, dropping its payload once the lock is
    /// released. Returns whether it was one.
    pub(crate) fn purge_dead_letter(&mut self, id: TaskId, effects: &mut Effects) -> bool {
        let Some(seq) = self.local(id) else {
            return false;
        };
        if !self.dead.remove(&seq) {
            return false;
        }
        self.drop_dead_payload(seq, effects);
        true
    }

    /// A record that left `dead`: its payload goes (invariant 9), and the record too if
    /// retention already passed over it.
    fn drop_dead_payload(&mut self, seq: Seq, effects: &mut Effects) {
        let Some(record) = self.records.get_mut(&seq) else {
            return;
        };
        if let Some(payload) = record.payload.take() {
            effects.drop_later(payload);
        }
        if record.extra().expired {
            self.forget(seq, effects);
        }
    }

    /// Keeps at most `max_dead_letters`, dropping the oldest.
    fn enforce_dead_letter_limit(&mut self, effects: &mut Effects) {
        while self.dead.len() > self.retention.max_dead_letters {
            let Some(oldest) = self.dead.pop_first() else {
                break;
            };
            self.drop_dead_payload(oldest, effects);
        }
    }

    /// Drops a terminal record: its key if it still holds one, and the record itself once the
    /// lock is released (its payload, output and error are user values).
    fn forget(&mut self, seq: Seq, effects: &mut Effects) {
        let Some(record) = self.records.remove(&seq) else {
            return;
        };
        self.release_key(record.key().map(|k| &**k), seq);
        effects.drop_record_later(record);
    }

    /// Drops the oldest terminal records beyond the retention limits. A dead letter's record
    /// stays while it is one (invariant 9), marked expired.
    fn enforce_retention(&mut self, now: Instant, effects: &mut Effects) {
        while let Some(&(oldest, finished_at)) = self.finished.front() {
            let too_many = self.finished.len() > self.retention.max_count;
            let too_old = self
                .retention
                .max_age
                .is_some_and(|age| now.saturating_duration_since(finished_at) >= age);
            if !too_many && !too_old {
                break;
            }
            self.finished.pop_front();
            if self.dead.contains(&oldest) {
                if let Some(record) = self.records.get_mut(&oldest) {
                    record.extra().expired = true;
                }
            } else {
                self.forget(oldest, effects);
            }
        }
    }

    // ===== reading =====

    /// A task's type index and completion, to make a handle for it.
    pub(crate) fn completion_of(&self, id: TaskId) -> Option<(u32, Arc<Completion>)> {
        let (_, record) = self.record(id)?;
        Some((record.type_index, Arc::clone(&record.completion)))
    }

    pub(crate) fn status(&self, id: TaskId) -> Option<TaskState> {
        self.record(id).map(|(_, r)| r.state)
    }

    pub(crate) fn info(&self, id: TaskId, registry: &Registry) -> Option<TaskInfo> {
        let (_, record) = self.record(id)?;
        let extra = record.extra.as_deref();
        Some(TaskInfo {
            id,
            task_type: registry.entry(record.type_index).name,
            state: record.state,
            priority: record.priority,
            attempts: record.attempts,
            run_at: matches!(record.state, TaskState::Scheduled | TaskState::Blocked)
                .then_some(self.epoch.instant(record.since)),
            last_error: extra.and_then(|e| {
                e.failure
                    .as_ref()
                    .map(|f| f.error.clone())
                    .or(e.last_error.clone())
            }),
            resubmitted_as: extra.and_then(|e| e.resubmitted_as).map(|seq| self.id(seq)),
        })
    }

    pub(crate) fn stats(&mut self, now: Instant) -> Stats {
        let records = &self.records;
        let fronts = self.ready.fronts(|id| {
            records
                .get(&id)
                .is_some_and(|r| r.state == TaskState::Ready)
        });
        let oldest_ready_by_priority: Vec<(u8, Duration)> = fronts
            .iter()
            .map(|&(p, _, id)| {
                let since = self.epoch.instant(records[&id].since);
                (p, now.saturating_duration_since(since))
            })
            .collect();
        let oldest_ready = oldest_ready_by_priority.iter().map(|&(_, age)| age).max();
        Stats {
            workers: self.live_workers,
            blocked: self.counts.blocked,
            scheduled: self.counts.scheduled,
            ready: self.counts.ready,
            running: self.counts.running,
            retained: self.finished.len(),
            dead_letters: self.dead.len(),
            ready_by_priority: fronts.iter().map(|&(p, n, _)| (p, n)).collect(),
            oldest_ready,
            oldest_ready_by_priority,
            breakers: Vec::new(),
            stuck: 0,
            delayed_entries: self.delayed.entries(),
            totals: self.totals,
        }
    }

    /// Each type's ready and running tasks and oldest ready wait: a pass over every record.
    pub(crate) fn type_stats(&self, now: Instant) -> Vec<TypeStats> {
        let mut types: Vec<TypeStats> = self.names.iter().map(|&n| TypeStats::new(n)).collect();
        for record in self.records.values() {
            let Some(t) = types.get_mut(record.type_index as usize) else {
                continue;
            };
            match record.state {
                TaskState::Ready => {
                    t.ready += 1;
                    let since = self.epoch.instant(record.since);
                    let age = now.saturating_duration_since(since);
                    t.oldest_ready = Some(t.oldest_ready.map_or(age, |a| a.max(age)));
                }
                TaskState::Running => t.running += 1,
                _ => {}
            }
        }
        types
    }

    /// Takes every record out, for [`MemoryStore`](super::MemoryStore)'s `Drop` to drop quietly.
    pub(crate) fn take_records(&mut self) -> Vec<Record> {
        self.tokens.clear();
        self.records.drain().map(|(_, record)| record).collect()
    }

    // ===== checking =====

    /// Checks the invariants in the module docs against every record; `Err` names the first one
    /// broken. For tests: it reads the whole state.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let fail = |n: u32, what: String| Err(format!("invariant {n} broken: {what}"));
        let mut counts = Counts::default();
        let mut terminal = 0;
        // How many unfinished tasks list each task as a dependent.
        let mut listed: HashMap<Seq, usize> = HashMap::new();
        for record in self.records.values().filter(|r| !r.state.is_terminal()) {
            for &dependent in record.extra.iter().flat_map(|e| &e.dependents) {
                *listed.entry(dependent).or_default() += 1;
            }
        }
        for (&seq, record) in &self.records {
            let id = self.id(seq);
            counts.enter(record.state);
            let published = record.completion.is_published();
            if record.state.is_terminal() {
                terminal += 1;
                if !published {
                    return fail(6, format!("{id} is {} but unpublished", record.state));
                }
            } else if published {
                return fail(6, format!("{id} is {} but published", record.state));
            }
            let holds_payload = record.payload.is_some();
            let token = self.tokens.contains_key(&seq);
            match record.state {
                TaskState::Running if holds_payload || !token => {
                    return fail(
                        4,
                        format!("running {id}: payload {holds_payload}, token {token}"),
                    );
                }
                TaskState::Running => {}
                state if token => return fail(4, format!("{state} {id} has a token")),
                state if !state.is_terminal() && !holds_payload => {
                    return fail(4, format!("{state} {id} lost its payload"));
                }
                _ => {}
            }
            if record.state == TaskState::Blocked {
                let listed = listed.get(&seq).copied().unwrap_or(0);
                if record.pending_dependencies == 0
                    || listed != record.pending_dependencies as usize
                {
                    return fail(
                        3,
                        format!(
                            "blocked {id} counts {} pending dependencies, {listed} list it",
                            record.pending_dependencies
                        ),
                    );
                }
            }
            let in_dead = self.dead.contains(&seq);
            let should = record.state == TaskState::Failed
                && holds_payload
                && record
                    .extra
                    .as_ref()
                    .is_none_or(|e| e.resubmitted_as.is_none());
            if in_dead != should {
                return fail(
                    9,
                    format!("{id} in dead letters: {in_dead}, should be: {should}"),
                );
            }
            let in_cascade = record
                .extra
                .as_ref()
                .is_some_and(|e| e.cascade_root.is_some());
            if record.state == TaskState::Cancelled && holds_payload && !in_cascade {
                return fail(10, format!("cancelled {id} holds its payload"));
            }
            if let Some(key) = record.key() {
                let holds = self.keys.get(key) == Some(&seq);
                let may = matches!(record.state, TaskState::Failed | TaskState::Cancelled);
                if holds && may {
                    return fail(8, format!("{} {id} still holds key `{key}`", record.state));
                }
            }
        }
        for (key, seq) in &self.keys {
            if self.records.get(seq).and_then(Record::key).map(|k| &**k) != Some(&**key) {
                return fail(
                    8,
                    format!(
                        "key `{key}` names {}, which does not hold it",
                        self.id(*seq)
                    ),
                );
            }
        }
        for (what, n, expected) in [
            ("blocked", counts.blocked, self.counts.blocked),
            ("scheduled", counts.scheduled, self.counts.scheduled),
            ("ready", counts.ready, self.counts.ready),
            ("running", counts.running, self.counts.running),
        ] {
            if n != expected {
                return fail(5, format!("{n} {what} records, counted {expected}"));
            }
        }
        if self.tokens.len() != counts.running {
            return fail(
                4,
                format!("{} tokens, {} running", self.tokens.len(), counts.running),
            );
        }
        let live_ready = self.ready.len();
        if live_ready != counts.ready {
            return fail(
                2,
                format!("{live_ready} live ready entries, {} ready", counts.ready),
            );
        }
        let expired = self
            .records
            .values()
            .filter(|r| r.extra.as_ref().is_some_and(|e| e.expired))
            .count();
        if terminal != self.finished.len() + expired {
            return fail(
                1,
                format!(
                    "{terminal} terminal records, {} retained and {expired} expired dead letters",
                    self.finished.len()
                ),
            );
        }
        for &(seq, _) in &self.finished {
            if !self
                .records
                .get(&seq)
                .is_some_and(|r| r.state.is_terminal())
            {
                return fail(
                    6,
                    format!("{} is in retention but not terminal", self.id(seq)),
                );
            }
        }
        if self.stopping && (counts.blocked + counts.scheduled + counts.ready) > 0 {
            return fail(7, "stopping with tasks still queued".to_owned());
        }
        Ok(())
    }
}

#[cfg(all(test, not(tasq_loom)))]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::MemoryStore;
    use super::*;
    use crate::clock::Clock;
    use crate::store::Store;

    fn retention() -> Retention {
        Retention {
            max_count: 10,
            max_age: None,
            max_dead_letters: 10,
        }
    }

    fn task(dependencies: Vec<Seq>) -> NewTask {
        NewTask {
            type_index: 0,
            payload: Box::new(()),
            priority: 0,
            run_at: Instant::now(),
            dependencies,
            key: Some("k".into()),
        }
    }

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

    /// The check names the invariant a corrupted state breaks (so the soak run's calls of it
    /// can fail).
    #[test]
    fn check_invariants_names_what_is_broken() {
        let shared = MemoryStore::new(Registry::default(), Clock::System, retention(), 1, 7, Events::none());
        let now = Instant::now();
        let mut effects = Effects::default();
        let (first, _) =
            shared
                .lock()
                .insert(task(Vec::new()), Completion::new(), now, &mut effects);
        let dependent = NewTask {
            key: None,
            ..task(vec![first.seq()])
        };
        let (second, _) = shared
            .lock()
            .insert(dependent, Completion::new(), now, &mut effects);
        assert_eq!(shared.check_invariants(), Ok(()));

        let broken = |f: fn(&mut State, Seq, Seq), invariant: &str| {
            let shared = MemoryStore::new(Registry::default(), Clock::System, retention(), 1, 7, Events::none());
            let mut effects = Effects::default();
            let mut state = shared.lock();
            let (a, _) = state.insert(task(Vec::new()), Completion::new(), now, &mut effects);
            let (b, _) = state.insert(
                NewTask {
                    key: None,
                    ..task(vec![a.seq()])
                },
                Completion::new(),
                now + Duration::from_secs(1),
                &mut effects,
            );
            f(&mut state, a.seq(), b.seq());
            drop(state);
            let err = shared.check_invariants().unwrap_err();
            assert!(err.starts_with(invariant), "{err}");
        };
        broken(|s, _, _| s.counts.ready += 1, "invariant 5");
        broken(
            |s, a, _| {
                s.records.get_mut(&a).unwrap().payload = None;
            },
            "invariant 4",
        );
        broken(
            |s, _, b| s.records.get_mut(&b).unwrap().pending_dependencies = 2,
            "invariant 3",
        );
        broken(
            |s, a, _| {
                s.keys.insert("other".into(), a);
            },
            "invariant 8",
        );
        broken(
            |s, a, _| {
                s.dead.insert(a);
            },
            "invariant 9",
        );
        broken(|s, a, _| s.ready.push(0, a), "invariant 2");
        broken(
            |s, a, _| {
                s.tokens.insert(a, CancelToken::new(Clock::System));
            },
            "invariant 4",
        );
        broken(
            |s, a, _| s.finished.push_back((a, Instant::now())),
            "invariant 1",
        );
        broken(
            |s, a, _| {
                let completion = Arc::clone(&s.records[&a].completion);
                completion.publish(Finished::Cancelled(CancelReason::Requested));
            },
            "invariant 6",
        );
        broken(|s, _, _| s.stopping = true, "invariant 7");
        assert_eq!(second.pool(), 7);
    }
}
