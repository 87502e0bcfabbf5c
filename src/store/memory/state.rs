//! The embedded store's state machine: task records, the ready queue, the delayed heap, and every
//! transition between them. Plain data under the pool's one lock: no waiting, no user code.
//!
//! # Invariants
//!
//! 1. Every accepted task has exactly one record, from submit until retention drops it (only
//!    terminal records are dropped). A record changes state only through the methods here.
//! 2. A `Ready` task has exactly one live entry in `ready`; a `Scheduled` task exactly one in
//!    `delayed`. Entries of tasks in any other state are stale and skipped when found.
//! 3. A `Blocked` task's `pending_dependencies` counts its dependencies that have not succeeded
//!    yet, is non-zero, and the task is listed in each such dependency's `dependents`.
//! 4. A `Running` task's payload is held by exactly one worker's [`Claim`], and its token is in
//!    `tokens` (no other task's is); every other non-terminal record holds its payload.
//! 5. `counts` equals the number of records in each non-terminal state.
//! 6. A record reaches a terminal state at most once; in that same step its outcome is published
//!    to its completion (exactly once), its dependents are released or cancelled, and its id is
//!    appended to `finished` (retention order).
//! 7. `closed` ⇒ no task is accepted. `stopping` ⇒ `closed`, and no task is blocked, scheduled or
//!    ready: workers exit as soon as they come back for work.

use std::any::Any;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use super::queue::{DelayedQueue, Epoch, ReadyQueue};
use super::record::{Effects, Extra, Record};
use crate::cancel::CancelToken;
use crate::clock::Clock;
use crate::dead_letter::DeadLetter;
use crate::error::{CancelError, ResubmitError};
use crate::handle::{Completion, Finished};
use crate::pool::CancelOutcome;
use crate::registry::Registry;
use crate::stats::{Stats, TaskInfo, Totals};
use crate::store::{Claim, RunOutcome};
use crate::sync::Arc;
use crate::task::{CancelReason, Failure, TaskId, TaskState};

/// How long terminal records are remembered (for handles' status, keys and dead letters).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retention {
    pub(crate) max_count: usize,
    pub(crate) max_age: Option<Duration>,
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

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        const TAG: u64 = 0x7F << 57;
        self.0 = (n & !TAG) | (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) & TAG);
    }
}

type IdMap<V> = HashMap<TaskId, V, BuildHasherDefault<IdHasher>>;

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
    pub(crate) dependencies: Vec<TaskId>,
    pub(crate) key: Option<String>,
}

/// Everything the pool's lock guards.
pub(crate) struct State {
    records: IdMap<Record>,
    /// The tokens of running tasks (invariant 4), out of the records to keep those small.
    tokens: IdMap<CancelToken>,
    epoch: Epoch,
    ready: ReadyQueue,
    delayed: DelayedQueue,
    keys: HashMap<Arc<str>, TaskId>,
    /// Terminal tasks, with when they finished, in that order: retention drops from the front
    /// (without reading the old record to learn its age).
    finished: VecDeque<(TaskId, Instant)>,
    /// Failed tasks not yet resubmitted, in id order.
    dead: BTreeSet<TaskId>,
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
    pub(crate) fn new(retention: Retention, workers: usize, epoch: Instant) -> Self {
        State {
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
    pub(crate) fn drained(&self) -> bool {
        let active = self.counts.ready + self.counts.scheduled + self.counts.running;
        active <= self.handlers_in_shutdown
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

    // ===== submit =====

    /// The task holding `key`, and its type, if the pool still remembers one.
    pub(crate) fn find_key(&self, key: &str) -> Option<(TaskId, u32, Arc<Completion>)> {
        let id = *self.keys.get(key)?;
        let record = &self.records[&id];
        Some((id, record.type_index, Arc::clone(&record.completion)))
    }

    /// The first dependency the pool does not know.
    pub(crate) fn unknown_dependency(&self, dependencies: &[TaskId]) -> Option<TaskId> {
        dependencies
            .iter()
            .copied()
            .find(|id| !self.records.contains_key(id))
    }

    /// Accepts a validated task (its dependencies are known, its key is free).
    pub(crate) fn insert(
        &mut self,
        mut task: NewTask,
        completion: Arc<Completion>,
        now: Instant,
        effects: &mut Effects,
    ) -> (TaskId, Arc<Completion>) {
        let id = TaskId(self.next_id);
        self.next_id += 1;
        self.totals.submitted += 1;

        task.dependencies.sort_unstable();
        task.dependencies.dedup();
        // A dependency that already failed or was cancelled cancels this task at once.
        let doomed = task
            .dependencies
            .iter()
            .find_map(|dep| match self.records[dep].state {
                TaskState::Failed => Some(CancelReason::DependencyFailed(*dep)),
                TaskState::Cancelled => Some(CancelReason::DependencyCancelled(*dep)),
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
            let key: Arc<str> = key.into();
            self.keys.insert(Arc::clone(&key), id);
            record.extra().key = Some(key);
        }
        self.records.insert(id, record);
        self.counts.enter(TaskState::Blocked);

        if let Some(reason) = doomed {
            self.finish(id, End::Cancelled(reason), now, effects);
        } else if pending == 0 {
            self.make_runnable(id, now, effects);
        }
        (id, completion)
    }

    /// A task with no dependency left becomes scheduled (due later) or ready.
    fn make_runnable(&mut self, id: TaskId, now: Instant, effects: &mut Effects) {
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
        let id = self.ready.pop(|id| {
            records
                .get(&id)
                .is_some_and(|r| r.state == TaskState::Ready)
        })?;
        let record = self.records.get_mut(&id).expect("live entry has a record");
        self.counts.leave(TaskState::Ready);
        self.counts.enter(TaskState::Running);
        record.state = TaskState::Running;
        record.since = self.epoch.stamp(now);
        record.attempts += 1;
        let token = spare
            .take()
            .unwrap_or_else(|| CancelToken::new(clock.clone()));
        self.tokens.insert(id, token.clone());
        Some(Claim {
            id,
            type_index: record.type_index,
            attempt: record.attempts,
            token,
            // Keeps invariant 4.
            payload: record
                .payload
                .take()
                .expect("a ready task holds its payload"),
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
        let id = claim.id;
        self.tokens.remove(&id);
        let record = self
            .records
            .get_mut(&id)
            .expect("a running task has a record");
        debug_assert_eq!(record.state, TaskState::Running);

        // A cancel (or the shutdown deadline) that reached the running task wins over whatever
        // the handler returned.
        if let Some(reason) = record.cancel_requested() {
            effects.drop_later(claim.payload);
            if let RunOutcome::Succeeded(output) = outcome {
                effects.drop_later(output);
            }
            self.finish(id, End::Cancelled(reason), now, effects);
            return;
        }
        match outcome {
            RunOutcome::Succeeded(output) => {
                effects.drop_later(claim.payload);
                self.finish(id, End::Succeeded(output), now, effects);
            }
            RunOutcome::Retry { delay, error } => {
                record.payload = Some(claim.payload);
                record.extra().last_error = Some(error);
                self.totals.retried += 1;
                // The retry cap was checked against overflow when the pool was built.
                record.since = self.epoch.stamp(now.checked_add(delay).unwrap_or(now));
                self.make_runnable(id, now, effects);
            }
            RunOutcome::Failed { reason, error } => {
                record.payload = Some(claim.payload);
                let failure = Failure {
                    reason,
                    attempts: record.attempts,
                    error,
                };
                self.finish(id, End::Failed(failure), now, effects);
            }
        }
    }

    // ===== endings =====

    /// Ends a task, then releases or cancels its dependents, transitively (invariant 6).
    fn finish(&mut self, id: TaskId, end: End, now: Instant, effects: &mut Effects) {
        // Cascades are rare: the stack allocates only when a dependent must be cancelled.
        let mut next = Some((id, end));
        let mut work = Vec::new();
        while let Some((id, end)) = next.take().or_else(|| work.pop()) {
            let record = self.records.get_mut(&id).expect("record exists");
            if record.state.is_terminal() {
                continue; // reached twice through two cancelled dependencies
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
                    Finished::Succeeded(output)
                }
                End::Failed(failure) => {
                    // A dead letter keeps its payload, to be resubmitted.
                    record.state = TaskState::Failed;
                    self.totals.failed += 1;
                    self.dead.insert(id);
                    record.extra().failure = Some(failure.clone());
                    Finished::Failed(Box::new(failure))
                }
                End::Cancelled(reason) => {
                    record.state = TaskState::Cancelled;
                    self.totals.cancelled += 1;
                    if let Some(payload) = record.payload.take() {
                        effects.drop_later(payload);
                    }
                    Finished::Cancelled(reason)
                }
            };
            let state = record.state;
            let dependents = record
                .extra
                .as_mut()
                .map(|e| std::mem::take(&mut e.dependents));
            // Published under the lock, in the same step as the state change: whoever sees the
            // task terminal (its dependents' handlers, `status`, `wait_idle`) finds its outcome.
            record.completion.publish(finished);
            self.finished.push_back((id, now));

            for dependent in dependents.into_iter().flatten() {
                let record = self
                    .records
                    .get_mut(&dependent)
                    .expect("blocked records are kept");
                if record.state != TaskState::Blocked {
                    continue; // cancelled meanwhile
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
        self.enforce_retention(now, effects);
    }

    /// Cancels a task: at once if it has not started, through its token if it runs.
    pub(crate) fn cancel(
        &mut self,
        id: TaskId,
        reason: CancelReason,
        now: Instant,
        effects: &mut Effects,
    ) -> Result<CancelOutcome, CancelError> {
        let record = self
            .records
            .get_mut(&id)
            .ok_or(CancelError::UnknownTask(id))?;
        match record.state {
            state if state.is_terminal() => Ok(CancelOutcome::AlreadyFinished(state)),
            TaskState::Running => {
                let extra = record.extra();
                if extra.cancel_requested.is_none() {
                    extra.cancel_requested = Some(reason);
                }
                if let Some(token) = self.tokens.get(&id) {
                    token.cancel();
                }
                Ok(CancelOutcome::Signalled)
            }
            _ => {
                self.finish(id, End::Cancelled(reason), now, effects);
                Ok(CancelOutcome::Cancelled)
            }
        }
    }

    /// The shutdown deadline passed (or the pool was dropped): every task that has not started is
    /// cancelled, every running one has its token fired, and workers exit (invariant 7).
    pub(crate) fn stop(&mut self, now: Instant, effects: &mut Effects) {
        self.closed = true;
        self.stopping = true;
        let mut waiting: Vec<TaskId> = Vec::new();
        for (id, record) in &mut self.records {
            match record.state {
                TaskState::Running => {
                    let extra = record.extra();
                    extra.cancel_requested.get_or_insert(CancelReason::Shutdown);
                }
                state if !state.is_terminal() => waiting.push(*id),
                _ => {}
            }
        }
        for token in self.tokens.values() {
            token.cancel();
        }
        // Dependents have larger ids than their dependencies: cancelling from the largest id down
        // gives every task the reason `Shutdown` rather than a cascaded one.
        waiting.sort_unstable_by(|a, b| b.cmp(a));
        for id in waiting {
            self.finish(id, End::Cancelled(CancelReason::Shutdown), now, effects);
        }
    }

    // ===== dead letters and retention =====

    /// Runs a dead letter again, as a new task with fresh attempts.
    pub(crate) fn resubmit(
        &mut self,
        id: TaskId,
        now: Instant,
        effects: &mut Effects,
    ) -> Result<TaskId, ResubmitError> {
        if self.closed {
            return Err(ResubmitError::ShutDown);
        }
        let record = self
            .records
            .get_mut(&id)
            .ok_or(ResubmitError::UnknownTask(id))?;
        if record.state != TaskState::Failed {
            return Err(ResubmitError::NotDeadLetter(id, record.state));
        }
        if let Some(new) = record.extra.as_ref().and_then(|e| e.resubmitted_as) {
            return Err(ResubmitError::AlreadyResubmitted(id, new));
        }
        let Some(payload) = record.payload.take() else {
            return Err(ResubmitError::Taken(id));
        };
        let new_id = TaskId(self.next_id);
        record.extra().resubmitted_as = Some(new_id);
        let key = record.key().map(|k| k.to_string());
        let task = NewTask {
            type_index: record.type_index,
            payload,
            priority: record.priority,
            run_at: now,
            dependencies: Vec::new(),
            key,
        };
        self.dead.remove(&id);
        // Allocated under the lock: resubmitting is rare.
        let (inserted, _) = self.insert(task, Completion::new(), now, effects);
        debug_assert_eq!(inserted, new_id);
        Ok(new_id)
    }

    /// Takes a dead letter's payload out, if it is of type `type_index`: the task stays failed
    /// but is no longer a dead letter.
    pub(crate) fn take_dead_letter(
        &mut self,
        id: TaskId,
        type_index: u32,
    ) -> Option<Box<dyn Any + Send>> {
        if !self.dead.contains(&id) {
            return None;
        }
        let record = self.records.get_mut(&id)?;
        if record.type_index != type_index {
            return None;
        }
        self.dead.remove(&id);
        record.payload.take()
    }

    pub(crate) fn dead_letters(&self, registry: &Registry) -> Vec<DeadLetter> {
        self.dead
            .iter()
            .map(|id| {
                let record = &self.records[id];
                let failure = record
                    .extra
                    .as_ref()
                    .and_then(|e| e.failure.clone())
                    .expect("a dead letter records its failure");
                DeadLetter {
                    id: *id,
                    task_type: registry.entry(record.type_index).name,
                    priority: record.priority,
                    failure,
                    failed_at: self.epoch.instant(record.since),
                }
            })
            .collect()
    }

    /// Drops the oldest terminal records beyond the retention limits.
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
            let record = self
                .records
                .remove(&oldest)
                .expect("finished records exist");
            self.dead.remove(&oldest);
            if let Some(Extra { key: Some(key), .. }) = record.extra.as_deref() {
                if self.keys.get(key) == Some(&oldest) {
                    self.keys.remove(key);
                }
            }
            if let Some(payload) = record.payload {
                effects.drop_later(payload);
            }
        }
    }

    // ===== reading =====

    /// A task's type index and completion, to make a handle for it.
    pub(crate) fn completion_of(&self, id: TaskId) -> Option<(u32, Arc<Completion>)> {
        let record = self.records.get(&id)?;
        Some((record.type_index, Arc::clone(&record.completion)))
    }

    pub(crate) fn status(&self, id: TaskId) -> Option<TaskState> {
        self.records.get(&id).map(|r| r.state)
    }

    pub(crate) fn info(&self, id: TaskId, registry: &Registry) -> Option<TaskInfo> {
        let record = self.records.get(&id)?;
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
            resubmitted_as: extra.and_then(|e| e.resubmitted_as),
        })
    }

    pub(crate) fn stats(&mut self, now: Instant) -> Stats {
        let records = &self.records;
        let fronts = self.ready.fronts(|id| {
            records
                .get(&id)
                .is_some_and(|r| r.state == TaskState::Ready)
        });
        let oldest_ready = fronts
            .iter()
            .map(|&(_, _, id)| {
                now.saturating_duration_since(self.epoch.instant(records[&id].since))
            })
            .max();
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
            delayed_entries: self.delayed.entries(),
            totals: self.totals,
        }
    }
}
