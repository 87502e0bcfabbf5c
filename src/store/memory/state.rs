//! The embedded store's state machine: task records, the ready queue, the delayed heap, the
//! gates' held queues, and every transition between them. Plain data under the pool's one lock:
//! no waiting, no user code.
//!
//! # Invariants
//!
//! 1. Every accepted task has exactly one record, from submit until retention drops it (only
//!    terminal records are dropped; a dead letter's only once it stops being one), except a
//!    dormant task: a plain task scheduled for later that nothing has asked about, which has a
//!    [`Dormant`] entry in `dormant` instead, and no record, until it falls due or is asked
//!    about (by id, by a handle, as a dependency, by a shutdown). A record changes state only
//!    through the methods here. Records are keyed by their task's sequence number; a
//!    [`TaskId`] of another pool never reaches them.
//! 2. A `Ready` task has exactly one live entry: in `ready` if its `gating` is `Free` or
//!    `Released`, in the held queue of its gate if it is `Held` (see `gate.rs`). A `Scheduled`
//!    task, recorded or dormant, has exactly one in `delayed`. Entries of tasks in any other state are stale and
//!    skipped when found.
//! 3. A `Blocked` task's `pending_dependencies` counts its dependencies that have not succeeded
//!    yet, is non-zero, and the task is listed in each such dependency's `dependents`. A
//!    `dependents` list may also name tasks that have ended since (cancelled while blocked) and
//!    that retention may already have forgotten: those are skipped, never looked up with
//!    `expect`.
//! 4. A `Running` task's payload is held by exactly one worker's [`Claim`], and its token is in
//!    `tokens` (no other task's is); every other non-terminal record holds its payload.
//! 5. `counts` equals the number of records in each non-terminal state (dormant tasks count as
//!    scheduled).
//! 6. A record reaches a terminal state at most once; in that same step its outcome is published
//!    (exactly once: to its completion, or into the record until a handle reads it), its
//!    dependents are released or cancelled, and its id is appended to `finished` (retention
//!    order).
//! 7. `closed` ⇒ no task is accepted. `stopping` ⇒ `closed`, and no task is blocked, scheduled or
//!    ready: workers exit as soon as they come back for work.
//! 8. `keys` maps a key to a task holding it that is live or succeeded; a task that fails or is
//!    cancelled gives its key up in the step that ends it.
//! 9. `dead` holds exactly the failed records that were not resubmitted and still hold their
//!    payload, or lent it to a thread that copies it outside the lock
//!    ([`lend_dead_letter`](State::lend_dead_letter)); a record in `dead` is kept until it
//!    leaves `dead`, retention or not. A lent record holds no payload, and is in `dead` unless a
//!    purge or the dead-letter limit took it out meanwhile (its payload is dropped when it
//!    comes back). Nothing else takes a lent payload: a take or a resubmit waits for it.
//! 10. A cancelled record holds its payload only if a dead letter's failure cancelled it (it
//!     names that dead letter in `cascade_root`), for `resubmit_with_dependents`.
//! 11. A record's `gating` is `Free` unless the task is `Ready`, and names only a gate its type
//!     has. Each held queue's live count is the number of tasks held in it, each gate's
//!     `released` the number of tasks released from it and still ready, and `Gates::held` the
//!     sum of the live counts. `counts.ready` counts held tasks too: they are ready.
//! 12. The `running` count of a type with a concurrency limit equals its running tasks and is
//!     never above the limit: a task of a gated type starts only through `Gates::admit`, which
//!     checks the limit and counts it in; `complete` and `abandon`, the only ways out of
//!     `Running`, count it out. (So do the token bucket and the breaker: every start of a
//!     rate-limited type takes a token, every start of a half-open downstream's type is its
//!     one probe.)
//! 13. No held task is forgotten: a gate that holds tasks and has released none is closed,
//!     and what opens it releases it: a concurrency gate is at its limit (a task of the type
//!     leaving `Running` releases it), a breaker is open (its cool-down is a due time of the
//!     timer) or half-open with its probe out (the probe's end releases it), a rate gate waits
//!     for its bucket's next token (a due time of the timer).
//! 14. A breaker's `probe_out` is set only while it is half-open, and every change of a
//!     breaker's state is emitted as an `Event::Breaker` in the step that makes it.
//! 15. The outcome of a task whose unread handle lives (see `hub.rs`) is kept: in its record
//!     (`unread_handle`, a dormant task's too), or, once retention forgot the record, in
//!     `orphans`, published. No
//!     task has both a record and an orphan. `early_drops` names only tasks still in the
//!     intake.
//!
//! [`State::check_invariants`] checks these (for tests; it reads every record; the time-based
//! halves of 12 and 13 are left to the tests of limits and breakers).

use std::any::Any;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::gate::{Gate, Gates, Wakes, ready_since};
use super::ids::{IdMap, Seq};
use super::intake::Entry;
use super::queue::{DelayedQueue, Epoch, ReadyQueue, Stamp};
use super::record::{Dormant, Effects, Gating, Outcome, Record};
use crate::gates::aging::Aging;
use crate::gates::breaker::Verdict;
use crate::model::cancel::{CancelToken, Interrupt};
use crate::model::clock::Clock;
use crate::model::completion::{Completion, Finished};
use crate::model::dead_letter::DeadLetter;
use crate::model::error::{CancelError, ResubmitError};
use crate::model::id::TaskId;
use crate::model::state::{CancelOutcome, CancelReason, Failure, FailureReason, TaskState};
use crate::model::task::Dependency;
use crate::observe::events::Events;
use crate::observe::stats::{Stats, TaskInfo, Totals, TypeStats};
use crate::store::registry::{Registry, Settings};
use crate::store::{Claim, RunOutcome};
use crate::sync::{Arc, AtomicU64, Ordering, ThreadId};

/// How long terminal records are remembered (for handles' status, keys and dead letters).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retention {
    pub(crate) max_count: usize,
    pub(crate) max_age: Option<Duration>,
    /// Dead letters kept until taken or resubmitted, at most this many (the oldest go first).
    pub(crate) max_dead_letters: usize,
}

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

/// What [`State::lend_dead_letter`] did.
pub(crate) enum Lend {
    /// The payload, out of its record until [`State::give_back`] brings it back.
    Lent(Box<dyn Any + Send>),
    /// Lent to another thread: wait for it to come back, and ask again.
    Busy,
    /// Not a dead letter of that type, or lent to the asking thread itself (whose copy of it
    /// asked again: it cannot wait for itself).
    Refused,
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
    /// Settings of its own, unlike its type's (kept in its extra).
    pub(crate) settings: Option<Settings>,
}

/// Everything the pool's lock guards.
pub(crate) struct State {
    records: IdMap<Record>,
    /// Plain tasks scheduled for later that nothing has asked about (invariant 1): a delayed
    /// task costs a third of a record until it falls due.
    dormant: IdMap<Dormant>,
    /// The tokens of running tasks (invariant 4), out of the records to keep those small.
    tokens: IdMap<CancelToken>,
    epoch: Epoch,
    ready: ReadyQueue,
    delayed: DelayedQueue,
    /// Idempotency keys of live and succeeded tasks.
    keys: HashMap<Arc<str>, Seq>,
    /// Terminal tasks, with when they finished, in that order: retention drops from the front
    /// (without reading the old record to learn its age).
    finished: VecDeque<(Seq, Stamp)>,
    /// Dead letters: failed tasks not yet resubmitted or taken, in id order. Kept past
    /// retention, up to `retention.max_dead_letters`.
    dead: BTreeSet<Seq>,
    /// The outcomes of forgotten tasks whose unread handle lives (invariant 15, see `hub.rs`).
    orphans: IdMap<Arc<Completion>>,
    /// Tasks still in the intake whose unread handle was dropped already (its drop was taken
    /// in before the task).
    early_drops: IdMap<()>,
    /// The last clock reading stamped, and its stamp (see [`State::stamp`]).
    stamp_memo: (Instant, Stamp),
    /// This pool's id: the first half of every [`TaskId`] it gives.
    pool: u64,
    /// Where dead letters and breaker changes are reported (a channel send: no user code runs
    /// under the lock).
    events: Events,
    /// The task types' names, by index.
    names: Vec<&'static str>,
    /// Concurrency limits, rate limits, circuit breakers, and the tasks they hold back.
    gates: Gates,
    /// How ready tasks age, if they do.
    aging: Option<Aging>,
    /// Whether claims go through the gates and aging (some type is gated, or tasks age): the
    /// one check an ungated pool pays per claim.
    gated: bool,
    counts: Counts,
    totals: Totals,
    /// Where task ids come from: shared with the intake, whose submits take theirs without the
    /// lock.
    next_seq: Arc<AtomicU64>,
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
    /// Whether one idle worker waits on `work_cv` until the earliest due time too (the standby
    /// timer, see `mod.rs`).
    pub(crate) standby: bool,
    /// Worker threads that have not exited.
    pub(crate) live_workers: usize,
    /// Handlers blocked in `Pool::shutdown` of their own pool: their tasks cannot finish while
    /// the drain waits.
    pub(crate) handlers_in_shutdown: usize,
}

impl State {
    /// `epoch`: the pool's start on its clock; no due time is earlier. The registry's types
    /// give the gates (buckets full at `epoch`) and the aging.
    pub(crate) fn new(
        retention: Retention,
        workers: usize,
        epoch: Instant,
        pool: u64,
        events: Events,
        registry: &Registry,
        next_seq: Arc<AtomicU64>,
    ) -> Self {
        State {
            pool,
            events,
            names: registry.entries().iter().map(|e| e.name).collect(),
            gates: Gates::new(registry, epoch),
            aging: registry.aging,
            gated: registry.has_gates() || registry.aging.is_some(),
            records: IdMap::default(),
            dormant: IdMap::default(),
            tokens: IdMap::default(),
            epoch: Epoch(epoch),
            ready: ReadyQueue::new(),
            delayed: DelayedQueue::new(Epoch(epoch)),
            keys: HashMap::new(),
            orphans: IdMap::default(),
            early_drops: IdMap::default(),
            stamp_memo: (epoch, 0),
            finished: VecDeque::new(),
            dead: BTreeSet::new(),
            counts: Counts::default(),
            totals: Totals::default(),
            next_seq,
            retention,
            closed: false,
            stopping: false,
            idle: 0,
            notified: 0,
            timer_sleeping: false,
            timer_notified: false,
            standby: false,
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

    /// Whether nothing can run at `now` without time passing: no task in the ready queue or
    /// running, and no due time reached. What is left waits for a later run_at, for a
    /// dependency, or, held back by a gate, for a time: an open breaker's cool-down, a rate
    /// limit's next token (a task held by a concurrency limit waits for a running task, so
    /// the pool is not idle then anyway). Held tasks count like scheduled ones, not as ready.
    pub(crate) fn is_idle(&mut self, now: Instant) -> bool {
        self.counts_idle() && self.earliest_due(now).is_none_or(|due| due > now)
    }

    /// Nothing in the ready queue and nothing running (due times not looked at; tasks their
    /// gates hold are not in the ready queue).
    pub(crate) fn counts_idle(&self) -> bool {
        self.ready.is_empty() && self.counts.running == 0
    }

    /// Whether something waits for a time: a scheduled task, or a gate that needs the timer
    /// (invariant 13).
    pub(crate) fn has_timed(&self) -> bool {
        self.counts.scheduled > 0 || (self.gated && self.gates.has_timer())
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

    /// Gives dormant task `seq` its record (invariant 1): something asks about it. Any other
    /// task is left as it is.
    fn rouse(&mut self, seq: Seq) {
        if !self.dormant.is_empty() {
            if let Some(dormant) = self.dormant.remove(&seq) {
                self.records.insert(seq, dormant.into_record());
            }
        }
    }

    /// Gives every dormant task its record, for what reads or ends them all.
    fn rouse_all(&mut self) {
        self.records
            .extend(self.dormant.drain().map(|(seq, d)| (seq, d.into_record())));
    }

    /// A new task's sequence number (they only grow: a dependent's is above its dependencies').
    fn new_seq(&self) -> Seq {
        debug_assert!(!self.closed, "a closed pool takes no task");
        self.next_seq.fetch_add(1, Ordering::AcqRel)
    }

    /// Whether every task given an id before the pool closed is in the state (see `intake.rs`):
    /// `given` ids were handed out then, and each one goes in exactly once.
    pub(crate) fn took_in(&self, given: u64) -> bool {
        self.totals.submitted >= given
    }

    /// `now` as a stamp of the pool's epoch. A transition passes the same reading of the clock
    /// to each of its steps; the subtraction behind a stamp is done once per reading (it was a
    /// tenth of an empty task's cost, done five times).
    fn stamp(&mut self, now: Instant) -> Stamp {
        if now != self.stamp_memo.0 {
            self.stamp_memo = (now, self.epoch.stamp(now));
        }
        self.stamp_memo.1
    }

    /// The live or succeeded task holding `key` (invariant 8), read only.
    pub(crate) fn key_holder(&self, key: &str) -> Option<TaskId> {
        self.keys.get(key).map(|&seq| self.id(seq))
    }

    /// The live or succeeded task holding `key` (invariant 8), and its type.
    pub(crate) fn find_key(&mut self, key: &str) -> Option<(TaskId, u32, Arc<Completion>)> {
        let seq = *self.keys.get(key)?;
        let id = self.id(seq);
        let record = self.records.get_mut(&seq).expect("invariant 8");
        Some((id, record.type_index, record.outcome.shared()))
    }

    /// The dependencies still to wait for, by sequence number: one the pool forgot is satisfied
    /// if its handle saw it succeed. `Err` names the first that is foreign or unknown.
    /// A dormant dependency gets its record: its dependents are listed there.
    pub(crate) fn resolve_dependencies(
        &mut self,
        dependencies: &[Dependency],
    ) -> Result<Vec<Seq>, TaskId> {
        if dependencies.is_empty() {
            return Ok(Vec::new());
        }
        let mut seqs = Vec::with_capacity(dependencies.len());
        for dependency in dependencies {
            if let Some(seq) = self.local(dependency.id) {
                self.rouse(seq);
            }
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
        task: NewTask,
        completion: Arc<Completion>,
        now: Instant,
        effects: &mut Effects,
    ) -> (TaskId, Arc<Completion>) {
        let seq = self.new_seq();
        self.insert_as(seq, task, completion, now, effects)
    }

    /// Takes in a plain task from the intake: ready or scheduled, or, if the pool has stopped
    /// (a producer that passed its check before the pool closed), cancelled at once. Returns
    /// whether it was a delayed task that has fallen due already: the caller then promotes the
    /// delayed heap up to `now` ([`promote_fallen_due`](Self::promote_fallen_due)) once the
    /// whole batch is in.
    ///
    /// The order tasks become ready in is their due order, whichever way they came in: a
    /// delayed task goes through the delayed heap even when it is due already (the worker was
    /// busy when it fell due), so a batch of them is promoted earliest due first, not in
    /// submission order; a task due when submitted first promotes what fell due before it was
    /// submitted. Intake entries come in submission order, and a delayed task falls due after
    /// it was submitted, so this merges the batch with the heap exactly.
    pub(crate) fn admit(&mut self, entry: Entry, now: Instant, effects: &mut Effects) -> bool {
        let Entry {
            seq,
            run_at,
            due,
            payload,
            type_index,
            priority,
        } = entry;
        self.totals.submitted += 1;
        let dropped = !self.early_drops.is_empty() && self.early_drops.remove(&seq).is_some();
        if !due && !self.stopping {
            // Scheduled, and nothing can have asked about it yet: dormant (invariant 1), due
            // or not.
            let dormant = Dormant {
                run_at,
                payload,
                type_index,
                priority,
                unread_handle: !dropped,
            };
            self.dormant.insert(seq, dormant);
            self.counts.enter(TaskState::Scheduled);
            // Keeps invariant 2.
            effects.new_earliest |= self.delayed.push(run_at, seq);
            return run_at <= self.stamp(now);
        }
        if due && !self.stopping && self.counts.scheduled > 0 {
            // What fell due before this task was submitted became ready before it.
            let since = run_at.min(self.stamp(now));
            effects.newly_ready += self.promote_delayed(run_at, since);
        }
        let record = Record {
            state: TaskState::Blocked,
            type_index,
            priority,
            gating: Gating::Free,
            attempts: 0,
            pending_dependencies: 0,
            since: run_at,
            payload: Some(payload),
            outcome: Outcome::Unread,
            unread_handle: !dropped,
            extra: None,
        };
        self.records.insert(seq, record);
        self.counts.enter(TaskState::Blocked);
        if self.stopping {
            self.finish(seq, End::Cancelled(CancelReason::Shutdown), now, effects);
        } else {
            // Ready since it was submitted, not since a worker took it in.
            self.make_runnable_since(seq, now, run_at, due, effects);
        }
        false
    }

    /// After a batch of [`admit`](Self::admit)s of which one took in a delayed task due
    /// already: promotes every scheduled task due at `now`, earliest due first.
    pub(crate) fn promote_fallen_due(&mut self, now: Instant, effects: &mut Effects) {
        let stamp = self.stamp(now);
        effects.newly_ready += self.promote_delayed(stamp, stamp);
    }

    /// [`insert`](Self::insert) as task `id`, a sequence number just taken.
    fn insert_as(
        &mut self,
        id: Seq,
        mut task: NewTask,
        completion: Arc<Completion>,
        now: Instant,
        effects: &mut Effects,
    ) -> (TaskId, Arc<Completion>) {
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
            gating: Gating::Free,
            attempts: 0,
            pending_dependencies: pending,
            since: self.epoch.stamp(task.run_at),
            payload: Some(task.payload),
            outcome: Outcome::Shared(Arc::clone(&completion)),
            unread_handle: false,
            extra: None,
        };
        if let Some(key) = task.key {
            self.keys.insert(Arc::clone(&key), id);
            record.extra().key = Some(key);
        }
        if task.settings.is_some() {
            record.extra().settings = task.settings;
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
        self.make_runnable_since(id, now, u64::MAX, false, effects);
    }

    /// [`make_runnable`](Self::make_runnable), ready since `since` at the latest; `due`: ready
    /// whatever `now` says.
    fn make_runnable_since(
        &mut self,
        id: Seq,
        now: Instant,
        since: Stamp,
        due: bool,
        effects: &mut Effects,
    ) {
        let now = self.stamp(now);
        let record = self.records.get_mut(&id).expect("record exists");
        let run_at = record.since;
        self.counts.leave(record.state);
        if run_at > now && !due {
            record.state = TaskState::Scheduled;
            // Keeps invariant 2.
            effects.new_earliest |= self.delayed.push(run_at, id);
        } else {
            record.state = TaskState::Ready;
            record.since = now.min(since);
            self.ready.push(record.priority, id);
            effects.newly_ready += 1;
        }
        self.counts.enter(record.state);
    }

    // ===== claim and complete =====

    /// Moves every due scheduled task to the ready queue, and releases every gate whose time has
    /// come (invariant 13); returns how many tasks became poppable.
    pub(crate) fn promote_due(&mut self, now: Instant) -> usize {
        if self.counts.scheduled == 0 && !(self.gated && self.gates.held() > 0) {
            // Nothing waits for a time: no clock arithmetic (every claim passes here).
            return 0;
        }
        let stamp = self.stamp(now);
        let mut promoted = self.promote_delayed(stamp, stamp);
        if self.gated && self.gates.held() > 0 && !self.stopping {
            promoted += self.gates.release_due(
                now,
                stamp,
                &mut self.records,
                &mut self.ready,
                self.aging.as_ref(),
            );
        }
        promoted
    }

    /// Moves the scheduled tasks due at `upto` to the ready queue, earliest due first, then by
    /// id (the delayed heap's order: so within a priority they run in due order), marking them
    /// ready since `since`; returns how many.
    fn promote_delayed(&mut self, upto: Stamp, since: Stamp) -> usize {
        let mut promoted = 0;
        while let Some(id) = self.delayed.pop_due(upto) {
            self.rouse(id);
            let Some(record) = self.records.get_mut(&id) else {
                continue;
            };
            if record.state != TaskState::Scheduled {
                continue; // stale entry (invariant 2)
            }
            self.counts.leave(TaskState::Scheduled);
            record.state = TaskState::Ready;
            record.since = since;
            self.ready.push(record.priority, id);
            self.counts.enter(TaskState::Ready);
            promoted += 1;
        }
        promoted
    }

    /// The earliest due time of a scheduled task, or of a gate that needs the timer (after
    /// `promote_due(now)`, later than `now`).
    pub(crate) fn earliest_due(&mut self, now: Instant) -> Option<Instant> {
        let (records, dormant) = (&self.records, &self.dormant);
        let due = self.delayed.earliest(|id| {
            records
                .get(&id)
                .is_some_and(|r| r.state == TaskState::Scheduled)
                || dormant.contains_key(&id)
        });
        match self.gates.earliest(now) {
            Some(gate) => Some(due.map_or(gate, |due| due.min(gate))),
            None => due,
        }
    }

    /// Ready tasks a worker can pop now: those in `ready`, not those held by their gates.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Takes the next ready task for a worker, giving it `spare` as its token if there is one.
    /// Through the gates and aging if the pool has them, holding back the tasks whose gates are
    /// closed; what that changed for the wake-up rules goes to `wakes`.
    pub(crate) fn claim_next(
        &mut self,
        now: Instant,
        clock: &Clock,
        spare: &mut Option<CancelToken>,
        wakes: &mut Wakes,
    ) -> Option<Claim> {
        let stamp = self.stamp(now);
        let seq = if self.gated {
            self.pop_admitted(now, wakes)?
        } else {
            let records = &self.records;
            self.ready.pop(|seq| {
                records
                    .get(&seq)
                    .is_some_and(|r| r.state == TaskState::Ready)
            })?
        };
        let id = self.id(seq);
        let record = self.records.get_mut(&seq)?;
        self.counts.leave(TaskState::Ready);
        self.counts.enter(TaskState::Running);
        record.state = TaskState::Running;
        record.since = stamp;
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
            settings: record.extra.as_ref().and_then(|extra| extra.settings),
            claimed_at: now,
        })
    }

    /// Pops ready tasks, best first (by effective priority under aging), until one whose gates
    /// let it start; holds back the others (see `gate.rs`). `None` once `ready` is empty.
    fn pop_admitted(&mut self, now: Instant, wakes: &mut Wakes) -> Option<Seq> {
        let stamp = self.stamp(now);
        loop {
            let records = &self.records;
            let seq = self
                .ready
                .pop_by(self.aging.as_ref(), stamp, |id| ready_since(records, id))?;
            let record = self
                .records
                .get_mut(&seq)
                .expect("a live entry has a record");
            let type_index = record.type_index;
            if !self.gates.is_gated(type_index) {
                return Some(seq);
            }
            // Keeps invariant 11: out of `ready`, no longer a placeholder of its gate.
            let was = std::mem::take(&mut record.gating);
            let came_from = match was {
                Gating::Released(kind) => {
                    let gate = self.gates.gate(type_index, kind);
                    self.gates.unrelease(gate);
                    Some(gate)
                }
                _ => None,
            };
            let admitted = match self.gates.admit(type_index, now, &self.events) {
                Ok(()) => true,
                Err(kind) => {
                    let gate = self.gates.gate(type_index, kind);
                    let timed_before = self.gates.needs_timer(gate);
                    // Keeps invariant 2: out of `ready`, into the held queue, marked. Back
                    // where it was if this gate released it.
                    record.gating = Gating::Held(kind);
                    let priority = record.priority;
                    let back = was == Gating::Released(kind);
                    self.gates.hold(gate, seq, priority, back);
                    wakes.held = true;
                    wakes.new_earliest |= !timed_before && self.gates.needs_timer(gate);
                    false
                }
            };
            if let Some(gate) = came_from {
                // One placeholder fewer: the gate may release another (invariant 13). It
                // released some, so it needed no timer before this.
                wakes.newly_ready += self.release(gate, now);
                wakes.new_earliest |= self.gates.needs_timer(gate);
            }
            if admitted {
                return Some(seq);
            }
        }
    }

    /// Releases tasks held at `gate` back to `ready` (see [`Gates::release`]), unless the pool
    /// stops; returns how many.
    fn release(&mut self, gate: Gate, now: Instant) -> usize {
        if self.stopping {
            return 0;
        }
        let stamp = self.stamp(now);
        self.gates.release(
            gate,
            now,
            stamp,
            &mut self.records,
            &mut self.ready,
            self.aging.as_ref(),
        )
    }

    /// A task of a gated type left `Running` with `verdict`: its gates count it out, and those
    /// that may have opened release what they can (invariants 12 to 14).
    fn run_ended(
        &mut self,
        type_index: u32,
        verdict: Verdict,
        now: Instant,
        effects: &mut Effects,
    ) {
        let breaker = self.gates.breaker_of(type_index);
        let timed_before = breaker.is_some_and(|gate| self.gates.needs_timer(gate));
        for gate in self
            .gates
            .run_ended(type_index, verdict, now, &self.events)
            .into_iter()
            .flatten()
        {
            effects.newly_ready += self.release(gate, now);
        }
        // A breaker that opened again over held tasks: the timer must wait for its cool-down
        // (a concurrency gate never needs the timer).
        effects.new_earliest |=
            !timed_before && breaker.is_some_and(|gate| self.gates.needs_timer(gate));
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

        // What the run says about the type's downstream: nothing if a cancel won.
        let gated = self.gated.then(|| {
            let verdict = match record.cancel_requested() {
                Some(_) => Verdict::Neither,
                None => outcome.verdict(),
            };
            (record.type_index, verdict)
        });
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
        } else {
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
        if let Some((type_index, verdict)) = gated {
            if self.gates.is_gated(type_index) {
                self.run_ended(type_index, verdict, now, effects);
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
        let type_index = record.type_index;
        let failure = Failure::new(FailureReason::Panicked, record.attempts, message, None);
        self.finish(seq, End::Failed(failure), now, effects);
        // A panic says nothing about the downstream.
        if self.gates.is_gated(type_index) {
            self.run_ended(type_index, Verdict::Neither, now, effects);
        }
    }

    // ===== endings =====

    /// Ends a task, then releases or cancels its dependents, transitively (invariant 6).
    fn finish(&mut self, seq: Seq, end: End, now: Instant, effects: &mut Effects) {
        let root = seq;
        // A dead letter's cascade keeps the payloads of the dependents it cancels, to bring them
        // back with it (`resubmit_with_dependents`).
        let keep_payloads = matches!(end, End::Failed(_));
        let stamp = self.stamp(now);
        let mut cascade = Vec::new();
        // A released task that ends leaves its gate one placeholder short (invariant 13).
        let mut reopen: Option<Gate> = None;
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
                // Keeps invariants 2 and 11: the entry it leaves is stale.
                match std::mem::take(&mut record.gating) {
                    Gating::Free => self.ready.forget(record.priority),
                    Gating::Held(kind) => {
                        let gate = self.gates.gate(record.type_index, kind);
                        self.gates.forget_held(gate, record.priority);
                    }
                    Gating::Released(kind) => {
                        self.ready.forget(record.priority);
                        let gate = self.gates.gate(record.type_index, kind);
                        self.gates.unrelease(gate);
                        // Only a root can be ready: a dependent is blocked until it ends.
                        debug_assert!(reopen.is_none(), "one ready task per finish");
                        reopen = Some(gate);
                    }
                }
            }
            self.counts.leave(record.state);
            record.since = stamp;
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
            record.outcome.publish(finished);
            self.finished.push_back((seq, stamp));
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
        if let Some(gate) = reopen {
            effects.newly_ready += self.release(gate, now);
            // It had released one, so it needed no timer before.
            effects.new_earliest |= self.gates.needs_timer(gate);
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
        self.rouse(seq);
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
                    token.fire(match reason {
                        CancelReason::Shutdown => Interrupt::Shutdown,
                        _ => Interrupt::Cancelled,
                    });
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
        self.rouse_all();
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
            token.fire(Interrupt::Shutdown);
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
        let new_seq = self.new_seq();
        let record = self.records.get_mut(&seq).expect("looked up above");
        let payload = record.payload.take().expect("checked above");
        let extra = record.extra();
        extra.resubmitted_as = Some(new_seq);
        let expired = extra.expired;
        let settings = extra.settings;
        let task = NewTask {
            type_index: record.type_index,
            payload,
            priority: record.priority,
            run_at: now,
            dependencies: Vec::new(),
            key,
            settings,
        };
        self.dead.remove(&seq);
        if expired {
            self.forget(seq, effects);
        }
        // Allocated under the lock: resubmitting is rare.
        Ok(self.insert_as(new_seq, task, Completion::new(), now, effects))
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
            let new_seq = self.new_seq();
            let record = self.records.get_mut(&old).expect("looked up above");
            let payload = record.payload.take().expect("checked above");
            let extra = record.extra();
            extra.resubmitted_as = Some(new_seq);
            let settings = extra.settings;
            let task = NewTask {
                type_index,
                payload,
                priority,
                run_at: now,
                dependencies,
                key,
                settings,
            };
            let (new, _) = self.insert_as(new_seq, task, Completion::new(), now, effects);
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

    /// Takes dead letter `id`'s payload (if it is a dead letter of type `type_index`) out of its
    /// record, for `lender` to copy it outside the lock: the record stays a dead letter, marked
    /// lent, and no one else takes the payload until [`give_back`](State::give_back) brings it
    /// back (a take or a resubmit waits; a purge or the dead-letter limit takes the record out
    /// of `dead` without the payload, which is dropped when it comes back). Keeps invariant 9.
    pub(crate) fn lend_dead_letter(
        &mut self,
        id: TaskId,
        type_index: u32,
        lender: ThreadId,
    ) -> Lend {
        let Some(seq) = self.local(id) else {
            return Lend::Refused;
        };
        if !self.dead.contains(&seq) {
            return Lend::Refused;
        }
        let Some(record) = self.records.get_mut(&seq) else {
            return Lend::Refused;
        };
        if record.type_index != type_index {
            return Lend::Refused;
        }
        match record.extra.as_ref().and_then(|e| e.lent) {
            Some(holder) if holder == lender => return Lend::Refused,
            Some(_) => return Lend::Busy,
            None => {}
        }
        let Some(payload) = record.payload.take() else {
            return Lend::Refused;
        };
        record.extra().lent = Some(lender);
        Lend::Lent(payload)
    }

    /// Brings back a payload [`lend_dead_letter`](State::lend_dead_letter) lent: into its
    /// record if that is still a dead letter, else returned, to be dropped once the lock is
    /// released.
    pub(crate) fn give_back(
        &mut self,
        id: TaskId,
        payload: Box<dyn Any + Send>,
    ) -> Option<Box<dyn Any + Send>> {
        let Some(seq) = self.local(id) else {
            return Some(payload);
        };
        let Some(record) = self.records.get_mut(&seq) else {
            return Some(payload);
        };
        if let Some(extra) = record.extra.as_mut() {
            extra.lent = None;
        }
        if self.dead.contains(&seq) {
            record.payload = Some(payload);
            None
        } else {
            Some(payload)
        }
    }

    /// The thread that holds dead letter `id`'s payload lent, if one does.
    pub(crate) fn lender(&self, id: TaskId) -> Option<ThreadId> {
        self.record(id)?.1.extra.as_ref()?.lent
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
        let Some(mut record) = self.records.remove(&seq) else {
            return;
        };
        self.release_key(record.key().map(|k| &**k), seq);
        if record.unread_handle {
            // Keeps invariant 15.
            self.orphans.insert(seq, record.outcome.shared());
        }
        effects.drop_record_later(record);
    }

    /// The unread handle of task `seq` was dropped (see `hub.rs`): its outcome need not be
    /// kept any more.
    pub(crate) fn handle_dropped(&mut self, seq: Seq, effects: &mut Effects) {
        if let Some(record) = self.records.get_mut(&seq) {
            record.unread_handle = false;
        } else if let Some(dormant) = self.dormant.get_mut(&seq) {
            dormant.unread_handle = false;
        } else if let Some(completion) = self.orphans.remove(&seq) {
            effects.drop_completion_later(completion);
        } else {
            // Only a task still in the intake has neither (the handle's drop was pushed after
            // its task, and taken in before it).
            self.early_drops.insert(seq, ());
        }
    }

    /// Drops the oldest terminal records beyond the retention limits. A dead letter's record
    /// stays while it is one (invariant 9), marked expired.
    fn enforce_retention(&mut self, now: Instant, effects: &mut Effects) {
        let now = self.stamp(now);
        while let Some(&(oldest, finished_at)) = self.finished.front() {
            let too_many = self.finished.len() > self.retention.max_count;
            let too_old = self
                .retention
                .max_age
                .is_some_and(|age| u128::from(now.saturating_sub(finished_at)) >= age.as_nanos());
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
    pub(crate) fn completion_of(&mut self, id: TaskId) -> Option<(u32, Arc<Completion>)> {
        let seq = self.local(id)?;
        self.rouse(seq);
        let record = self.records.get_mut(&seq)?;
        Some((record.type_index, record.outcome.shared()))
    }

    /// The completion for the unread handle of task `id`, which reads it now: from its record,
    /// or from the orphans once the record is forgotten (invariant 15).
    pub(crate) fn completion_for(&mut self, id: TaskId) -> Option<Arc<Completion>> {
        let seq = self.local(id)?;
        self.rouse(seq);
        match self.records.get_mut(&seq) {
            Some(record) => {
                record.unread_handle = false;
                Some(record.outcome.shared())
            }
            None => self.orphans.remove(&seq),
        }
    }

    /// Whether the unread handle of task `seq`, still in the intake, was dropped (forgotten
    /// once asked).
    pub(crate) fn early_dropped(&mut self, seq: Seq) -> bool {
        self.early_drops.remove(&seq).is_some()
    }

    /// For the store's `Drop`: the outcomes kept for unread handles, each published (a task
    /// that never ended is cancelled by the shutdown, as the pool was dropped).
    pub(crate) fn take_kept(&mut self) -> HashMap<Seq, Arc<Completion>> {
        self.rouse_all();
        let mut kept: HashMap<Seq, Arc<Completion>> = self.orphans.drain().collect();
        for (&seq, record) in &mut self.records {
            if record.unread_handle {
                let completion = record.outcome.shared();
                if !completion.is_published() {
                    completion.publish(Finished::Cancelled(CancelReason::Shutdown));
                }
                kept.insert(seq, completion);
            }
        }
        kept
    }

    pub(crate) fn status(&self, id: TaskId) -> Option<TaskState> {
        match self.record(id) {
            Some((_, record)) => Some(record.state),
            None => self.dormant(id).map(|_| TaskState::Scheduled),
        }
    }

    /// The dormant task `id`, if it is one.
    fn dormant(&self, id: TaskId) -> Option<&Dormant> {
        self.dormant.get(&self.local(id)?)
    }

    pub(crate) fn info(&self, id: TaskId, registry: &Registry) -> Option<TaskInfo> {
        let Some((_, record)) = self.record(id) else {
            let dormant = self.dormant(id)?;
            // A dormant task is a plain one: its type's settings.
            let settings = registry.entry(dormant.type_index).settings();
            return Some(TaskInfo {
                id,
                task_type: registry.entry(dormant.type_index).name,
                state: TaskState::Scheduled,
                priority: dormant.priority,
                attempts: 0,
                max_attempts: settings.max_attempts,
                retry_policy: settings.retry,
                timeout: settings.timeout,
                run_at: Some(self.epoch.instant(dormant.run_at)),
                last_error: None,
                resubmitted_as: None,
                dependencies: Vec::new(),
            });
        };
        let extra = record.extra.as_deref();
        let settings = extra
            .and_then(|e| e.settings)
            .unwrap_or_else(|| registry.entry(record.type_index).settings());
        Some(TaskInfo {
            id,
            task_type: registry.entry(record.type_index).name,
            state: record.state,
            priority: record.priority,
            attempts: record.attempts,
            max_attempts: settings.max_attempts,
            retry_policy: settings.retry,
            timeout: settings.timeout,
            run_at: matches!(record.state, TaskState::Scheduled | TaskState::Blocked)
                .then_some(self.epoch.instant(record.since)),
            last_error: extra.and_then(|e| {
                e.failure
                    .as_ref()
                    .map(|f| f.error.clone())
                    .or(e.last_error.clone())
            }),
            resubmitted_as: extra.and_then(|e| e.resubmitted_as).map(|seq| self.id(seq)),
            // Kept sorted (`insert_as`), as the durable store lists them.
            dependencies: extra.map_or_else(Vec::new, |e| {
                e.dependencies.iter().map(|&seq| self.id(seq)).collect()
            }),
        })
    }

    /// A page of [`Store::tasks`](crate::store::Store::tasks): the tasks after sequence number
    /// `after` (0: from the first) in `state` (if given) of type `type_index` (if given), at
    /// most `limit`, by id.
    ///
    /// Records are kept by id in a hash map, so the page is found one of two ways, whichever
    /// reads fewer entries: walking the ids from `after` up, one lookup each, until the page
    /// is full (a page of a common state costs about its length; the walk stops at the last
    /// id given), or one pass over every record keeping the `limit` smallest ids that match (in
    /// a heap). Only engine values are copied under the lock: no payload, no output.
    pub(crate) fn tasks(
        &self,
        registry: &Registry,
        state: Option<TaskState>,
        type_index: Option<u32>,
        after: Seq,
        limit: usize,
    ) -> Vec<TaskInfo> {
        if limit == 0 {
            return Vec::new();
        }
        let keeps = |task_state: TaskState, task_type: u32| {
            state.is_none_or(|s| s == task_state) && type_index.is_none_or(|t| t == task_type)
        };
        let matches = |seq: &Seq| match self.records.get(seq) {
            Some(record) => keeps(record.state, record.type_index),
            None => self
                .dormant
                .get(seq)
                .is_some_and(|d| keeps(TaskState::Scheduled, d.type_index)),
        };
        let from = after.saturating_add(1);
        let end = self.next_seq.load(Ordering::Acquire);
        let known = (self.records.len() + self.dormant.len()) as u64;
        let seqs: Vec<Seq> = if end.saturating_sub(from) <= known.saturating_mul(2) {
            (from..end).filter(matches).take(limit).collect()
        } else {
            let mut smallest = std::collections::BinaryHeap::new();
            let candidates = self.records.keys().chain(self.dormant.keys());
            for &seq in candidates.filter(|&&seq| seq >= from && matches(&seq)) {
                // A max-heap of the smallest ids so far: the largest goes when one more fits.
                smallest.push(seq);
                if smallest.len() > limit {
                    smallest.pop();
                }
            }
            smallest.into_sorted_vec()
        };
        seqs.into_iter()
            .filter_map(|seq| self.info(self.id(seq), registry))
            .collect()
    }

    pub(crate) fn stats(&mut self, now: Instant) -> Stats {
        let records = &self.records;
        let is_live = |id| {
            records
                .get(&id)
                .is_some_and(|r: &Record| r.state == TaskState::Ready)
        };
        let mut fronts = self.ready.fronts(is_live);
        let held = self.gates.fronts(is_live);
        if !held.is_empty() {
            // Held tasks are ready too (invariant 11), by their own priority: merge each
            // priority's depths, and keep its oldest front.
            fronts.extend(held);
            fronts.sort_by_key(|&(p, _, id)| (std::cmp::Reverse(p), records[&id].since));
            fronts.dedup_by(|later, first| {
                let same = later.0 == first.0;
                if same {
                    first.1 += later.1;
                }
                same
            });
        }
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
            breakers: self.gates.breakers(),
            stuck: 0,
            delayed_entries: self.delayed.entries(),
            estimated: false,
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

    /// Takes every record out, for [`MemoryStore`](super::store::MemoryStore)'s `Drop` to drop quietly.
    pub(crate) fn take_records(&mut self) -> Vec<Record> {
        self.tokens.clear();
        self.rouse_all();
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
            let published = record.outcome.is_published();
            if record.state.is_terminal() {
                terminal += 1;
                if !published {
                    return fail(6, format!("{id} is {} but unpublished", record.state));
                }
            } else if published {
                return fail(6, format!("{id} is {} but published", record.state));
            }
            if record.gating != Gating::Free && record.state != TaskState::Ready {
                return fail(11, format!("{} {id} is {:?}", record.state, record.gating));
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
            let lent = record.extra.as_ref().is_some_and(|e| e.lent.is_some());
            let kept = record.state == TaskState::Failed
                && record
                    .extra
                    .as_ref()
                    .is_none_or(|e| e.resubmitted_as.is_none());
            // A lent record may have left `dead` meanwhile (a purge, the limit).
            let (must, may) = (kept && holds_payload, kept && (holds_payload || lent));
            if (in_dead && !may) || (!in_dead && must) {
                return fail(
                    9,
                    format!(
                        "{id} in dead letters: {in_dead}, holds its payload: {holds_payload}, lent: {lent}"
                    ),
                );
            }
            if lent && (holds_payload || record.state != TaskState::Failed) {
                return fail(
                    9,
                    format!(
                        "lent {id} is {}, holds its payload: {holds_payload}",
                        record.state
                    ),
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
        for seq in self.dormant.keys() {
            counts.enter(TaskState::Scheduled);
            if self.records.contains_key(seq)
                || self.orphans.contains_key(seq)
                || self.early_drops.contains_key(seq)
            {
                return fail(
                    1,
                    format!("dormant {} has a record or is not taken in", self.id(*seq)),
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
        let live_ready = self.ready.len() + self.gates.held();
        if live_ready != counts.ready {
            return fail(
                2,
                format!(
                    "{live_ready} live ready and held entries, {} ready",
                    counts.ready
                ),
            );
        }
        // Each ready task in `ready` has one live entry there, unless a gate holds it.
        let mut in_ready = std::collections::HashSet::new();
        for (_, seq) in self.ready.entries() {
            let Some(record) = self.records.get(&seq) else {
                continue;
            };
            if record.state != TaskState::Ready {
                continue;
            }
            if matches!(record.gating, Gating::Held(_)) || !in_ready.insert(seq) {
                return fail(
                    2,
                    format!("{} has a stray or second entry in ready", self.id(seq)),
                );
            }
        }
        if let Err((n, what)) = self.gates.check(&self.records) {
            return fail(n, what);
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
        for (seq, completion) in &self.orphans {
            if self.records.contains_key(seq) || !completion.is_published() {
                return fail(
                    15,
                    format!("orphan {} has a record or no outcome", self.id(*seq)),
                );
            }
        }
        for seq in self.early_drops.keys() {
            if self.records.contains_key(seq) || self.orphans.contains_key(seq) {
                return fail(
                    15,
                    format!("early drop {} is not in the intake", self.id(*seq)),
                );
            }
        }
        Ok(())
    }
}

#[cfg(all(test, not(tasq_loom)))]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::record::GateKind;
    use super::super::store::MemoryStore;
    use super::*;
    use crate::gates::breaker::{Breaker, BreakerState};
    use crate::gates::limit::RateLimit;
    use crate::model::clock::Clock;
    use crate::model::task::TaskType;
    use crate::observe::event::Event;
    use crate::store::Store;
    use crate::store::registry::Entry;

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
            settings: None,
        }
    }

    /// The check names the invariant a corrupted state breaks (so the soak run's calls of it
    /// can fail).
    #[test]
    fn check_invariants_names_what_is_broken() {
        let shared = MemoryStore::new(
            Registry::default(),
            Clock::System,
            retention(),
            1,
            7,
            Events::none(),
        );
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
            let shared = MemoryStore::new(
                Registry::default(),
                Clock::System,
                retention(),
                1,
                7,
                Events::none(),
            );
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
        // Lent, yet ready and holding its payload.
        broken(
            |s, a, _| {
                let lender = crate::sync::current_thread_id();
                s.records.get_mut(&a).unwrap().extra().lent = Some(lender);
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
        broken(|s, a, _| s.finished.push_back((a, 0)), "invariant 1");
        broken(
            |s, a, _| {
                let record = s.records.get_mut(&a).unwrap();
                record
                    .outcome
                    .shared()
                    .publish(Finished::Cancelled(CancelReason::Requested));
            },
            "invariant 6",
        );
        broken(|s, _, _| s.stopping = true, "invariant 7");
        assert_eq!(second.pool(), 7);
    }

    // ===== gates =====

    /// What a gated test type has: a concurrency limit, a rate limit, a downstream index.
    type Limits = (Option<u32>, Option<RateLimit>, Option<u32>);

    /// A store whose type `i` has `types[i]`, with breakers `downstreams`, telling its events
    /// to the returned log.
    fn gated_store(
        types: &[Limits],
        downstreams: &[Breaker],
        aging: Option<Aging>,
    ) -> (MemoryStore, Events, Arc<crate::sync::Mutex<Vec<Event>>>) {
        const NAMES: [&str; 3] = ["a", "b", "c"];
        let mut registry = Registry::default();
        for (i, &(concurrency, rate, downstream)) in types.iter().enumerate() {
            let ty: TaskType<(), ()> = TaskType::new(NAMES[i]);
            let mut entry = Entry::new(ty, true);
            entry.max_attempts = 1;
            entry.concurrency = concurrency;
            entry.rate = rate;
            entry.downstream = downstream;
            registry.insert(entry).unwrap();
        }
        registry.downstreams = downstreams.iter().map(|&b| ("d", b)).collect();
        registry.aging = aging;
        let log = Arc::new(crate::sync::Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        let hook: crate::observe::events::Hook =
            Box::new(move |e: &Event| sink.lock().push(e.clone()));
        let events = Events::start(vec![hook], "gates-test").unwrap();
        let store = MemoryStore::new(registry, Clock::System, retention(), 1, 7, events.clone());
        (store, events, log)
    }

    /// The drop of a task's unread handle, taken in before the task itself (the task reached
    /// the intake just after a worker moved it in, its handle's drop just before that worker
    /// took the drops in): kept in `early_drops` until the task comes in, which then keeps
    /// nothing for the handle. A drop taken in after its task clears the record's flag; the
    /// task whose handle lives keeps its outcome for it.
    #[test]
    fn a_drop_taken_in_before_its_task_keeps_nothing_for_it() {
        let (store, _events, _log) = gated_store(&[(None, None, None)], &[], None);
        let now = Instant::now();
        let mut effects = Effects::default();
        let mut state = store.lock();
        let entry = super::super::intake::Entry::due_now;
        state.handle_dropped(1, &mut effects);
        assert!(
            state.early_drops.contains_key(&1),
            "task 1 is still in the intake"
        );
        for seq in 1..=3 {
            state.admit(entry(seq), now, &mut effects);
        }
        assert!(state.early_drops.is_empty(), "task 1 came in");
        state.handle_dropped(2, &mut effects);
        for _ in 1..=3 {
            let claim = claim(&mut state, now).expect("three tasks are ready");
            succeed(&mut state, claim, now).apply();
        }
        let unread = |seq| state.records[&seq].unread_handle;
        assert_eq!((unread(1), unread(2), unread(3)), (false, false, true));
        drop(state);
        assert_eq!(store.check_invariants(), Ok(()));
    }

    fn gated_task(type_index: u32, priority: u8, run_at: Instant) -> NewTask {
        NewTask {
            type_index,
            payload: Box::new(()),
            priority,
            run_at,
            dependencies: Vec::new(),
            key: None,
            settings: None,
        }
    }

    fn claim(state: &mut State, now: Instant) -> Option<Claim> {
        state.claim_next(now, &Clock::System, &mut None, &mut Wakes::default())
    }

    fn succeed(state: &mut State, claim: Claim, now: Instant) -> Effects {
        let mut effects = Effects::default();
        state.complete(
            claim,
            RunOutcome::Succeeded(Box::new(())),
            now,
            &mut effects,
        );
        effects
    }

    fn fail(state: &mut State, claim: Claim, now: Instant) -> Effects {
        let mut effects = Effects::default();
        let failure = Failure::new(FailureReason::Exhausted, 1, "down".into(), None);
        state.complete(claim, RunOutcome::Failed(failure), now, &mut effects);
        effects
    }

    /// A concurrency limit holds what it cannot start, releases one task per freed slot, and
    /// releases another when a released task is cancelled before a worker pops it.
    #[test]
    fn a_limit_holds_and_releases_one_task_per_slot() {
        let (store, _events, _) =
            gated_store(&[(Some(1), None, None), (None, None, None)], &[], None);
        let now = Instant::now();
        let mut state = store.lock();
        let mut effects = Effects::default();
        let ids: Vec<TaskId> = (0..3)
            .map(|_| {
                state
                    .insert(gated_task(0, 5, now), Completion::new(), now, &mut effects)
                    .0
            })
            .collect();
        let (free, _) = state.insert(gated_task(1, 0, now), Completion::new(), now, &mut effects);
        let first = claim(&mut state, now).expect("the first runs");
        assert_eq!(first.id, ids[0]);
        // The other two are held on the way to the free task.
        let other = claim(&mut state, now).expect("the free task runs");
        assert_eq!(other.id, free);
        assert_eq!(
            (state.ready_len(), state.gates.held(), state.counts.ready),
            (0, 2, 2)
        );
        assert!(claim(&mut state, now).is_none());
        assert_eq!(state.check_invariants(), Ok(()));
        assert_eq!(state.stats(now).ready_by_priority, [(5, 2)]);

        // A slot frees: one task (the oldest) is released, not both.
        let effects = succeed(&mut state, first, now);
        assert_eq!(effects.newly_ready, 1);
        assert_eq!(
            state.records[&ids[1].seq()].gating,
            Gating::Released(GateKind::Concurrency)
        );
        assert_eq!((state.ready_len(), state.gates.held()), (1, 1));
        assert_eq!(state.check_invariants(), Ok(()));

        // Cancelled before a worker pops it: the gate releases the next in its place.
        let mut effects = Effects::default();
        let outcome = state.cancel(ids[1], CancelReason::Requested, now, &mut effects);
        assert_eq!(outcome, Ok(CancelOutcome::Cancelled));
        assert_eq!(effects.newly_ready, 1);
        assert_eq!(state.check_invariants(), Ok(()));
        let last = claim(&mut state, now).expect("the last one runs");
        assert_eq!(last.id, ids[2]);
        assert_eq!(state.records[&ids[2].seq()].attempts, 1);
        assert_eq!(state.check_invariants(), Ok(()));
        succeed(&mut state, last, now);
        succeed(&mut state, other, now);
        assert_eq!(state.check_invariants(), Ok(()));
        assert!(state.counts_idle());
    }

    /// A rate-limited task held for a token is a due time of the timer, and starts when the
    /// token is there.
    #[test]
    fn a_held_task_waits_for_its_token_as_a_due_time() {
        let limit = RateLimit::per_second(1.0);
        let (store, _events, _) = gated_store(&[(None, Some(limit), None)], &[], None);
        let now = Instant::now();
        let mut state = store.lock();
        let mut effects = Effects::default();
        for _ in 0..2 {
            state.insert(gated_task(0, 0, now), Completion::new(), now, &mut effects);
        }
        let first = claim(&mut state, now).expect("the burst");
        let mut wakes = Wakes::default();
        assert!(
            state
                .claim_next(now, &Clock::System, &mut None, &mut wakes)
                .is_none()
        );
        assert!(wakes.new_earliest, "the hold must wake a sleeping timer");
        assert!(state.has_timed());
        let due = state.earliest_due(now).expect("the token's time");
        assert!(due > now + Duration::from_millis(999) && due <= now + Duration::from_millis(1001));
        assert_eq!(state.check_invariants(), Ok(()));
        // Not before it: nothing released.
        assert_eq!(state.promote_due(now + Duration::from_millis(900)), 0);
        assert_eq!(state.promote_due(due), 1);
        assert!(!state.has_timed());
        let second = claim(&mut state, due).expect("its token came");
        assert_eq!(state.check_invariants(), Ok(()));
        succeed(&mut state, first, due);
        succeed(&mut state, second, due);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    /// A breaker opens at its threshold (an event), holds its downstream's tasks (both types)
    /// until the cool-down, lets one probe through, and closes on its success.
    #[test]
    fn a_breaker_holds_probes_and_closes() {
        let settings = Breaker::new(1, Duration::from_secs(10));
        let (store, events, log) = gated_store(
            &[(None, None, Some(0)), (None, None, Some(0))],
            &[settings],
            None,
        );
        let now = Instant::now();
        let mut state = store.lock();
        let mut effects = Effects::default();
        let ids: Vec<TaskId> = (0..4)
            .map(|i| {
                let task = gated_task(i % 2, 0, now);
                state.insert(task, Completion::new(), now, &mut effects).0
            })
            .collect();
        let first = claim(&mut state, now).unwrap();
        let effects = fail(&mut state, first, now);
        assert!(!effects.new_earliest, "nothing held yet");
        assert_eq!(state.stats(now).breakers, [("d", BreakerState::Open)]);
        let mut wakes = Wakes::default();
        assert!(
            state
                .claim_next(now, &Clock::System, &mut None, &mut wakes)
                .is_none()
        );
        assert!(wakes.new_earliest);
        assert_eq!(state.gates.held(), 3);
        let reopens = now + Duration::from_secs(10);
        assert_eq!(state.earliest_due(now), Some(reopens));
        assert_eq!(state.check_invariants(), Ok(()));
        for id in &ids[1..] {
            assert_eq!(state.records[&id.seq()].attempts, 0);
        }

        // The cool-down ends: one probe, the oldest held task.
        assert_eq!(state.promote_due(reopens), 1);
        let probe = claim(&mut state, reopens).expect("the probe");
        assert_eq!(probe.id, ids[1]);
        assert!(claim(&mut state, reopens).is_none(), "one probe at a time");
        assert_eq!(
            state.stats(reopens).breakers,
            [("d", BreakerState::HalfOpen)]
        );
        assert_eq!(
            state.earliest_due(reopens),
            None,
            "the probe's end reopens, not time"
        );
        assert_eq!(state.check_invariants(), Ok(()));
        let effects = succeed(&mut state, probe, reopens);
        assert_eq!(effects.newly_ready, 2, "closed: every held task goes back");
        assert_eq!(state.check_invariants(), Ok(()));
        let a = claim(&mut state, reopens).unwrap();
        let b = claim(&mut state, reopens).unwrap();
        assert_eq!(
            (a.id, b.id),
            (ids[2], ids[3]),
            "in the order they were held"
        );
        succeed(&mut state, a, reopens);
        succeed(&mut state, b, reopens);
        drop(state);
        events.flush();
        let changes: Vec<BreakerState> = log
            .lock()
            .iter()
            .filter_map(|e| match e {
                Event::Breaker { state, .. } => Some(*state),
                _ => None,
            })
            .collect();
        use BreakerState::*;
        assert_eq!(changes, [Open, HalfOpen, Closed]);
        events.stop();
    }

    /// Aging: the pick is the highest effective priority, then the task ready longest.
    #[test]
    fn aging_picks_by_effective_priority_then_age() {
        let aging = Aging::new(Duration::from_secs(1), 9);
        let (store, _events, _) = gated_store(&[(None, None, None)], &[], Some(aging));
        let t0 = Instant::now();
        let mut state = store.lock();
        let mut effects = Effects::default();
        let mut insert = |state: &mut State, priority, at| {
            state
                .insert(
                    gated_task(0, priority, at),
                    Completion::new(),
                    at,
                    &mut effects,
                )
                .0
        };
        let low = insert(&mut state, 0, t0);
        let t5 = t0 + Duration::from_secs(5);
        let mid = insert(&mut state, 4, t5);
        let t9 = t0 + Duration::from_secs(9);
        let high = insert(&mut state, 9, t9);
        let top = insert(&mut state, 12, t9);
        // Stats keep each task under its own priority.
        let by_priority = state.stats(t9).ready_by_priority;
        assert_eq!(by_priority, [(12, 1), (9, 1), (4, 1), (0, 1)]);
        // At t9: top first (12, above the ceiling: it never ages, nothing ages past 9); then
        // low, aged to 9, ties with high and has waited longer; then high (9); then mid (4,
        // aged to 8).
        let order: Vec<TaskId> =
            std::iter::from_fn(|| claim(&mut state, t9).map(|c| c.id)).collect();
        assert_eq!(order, [top, low, high, mid]);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    /// The checks name the gate invariants a corrupted state breaks.
    #[test]
    fn check_invariants_names_broken_gates() {
        let limits = [(Some(1), None, None)];
        let now = Instant::now();
        let setup = |f: fn(&mut State, &[TaskId], Claim)| {
            let (store, _events, _) = gated_store(&limits, &[], None);
            let mut state = store.lock();
            let mut effects = Effects::default();
            let ids: Vec<TaskId> = (0..3)
                .map(|_| {
                    state
                        .insert(gated_task(0, 0, now), Completion::new(), now, &mut effects)
                        .0
                })
                .collect();
            let running = claim(&mut state, now).unwrap();
            assert!(claim(&mut state, now).is_none());
            assert_eq!(state.check_invariants(), Ok(()));
            f(&mut state, &ids, running);
            state.check_invariants().unwrap_err()
        };
        let err = setup(|s, ids, _| {
            s.records.get_mut(&ids[0].seq()).unwrap().gating = Gating::Held(GateKind::Rate);
        });
        assert!(err.starts_with("invariant 11"), "{err}");
        let err = setup(|s, ids, _| {
            s.records.get_mut(&ids[1].seq()).unwrap().gating = Gating::Free;
        });
        assert!(err.starts_with("invariant 11"), "{err}");
        // A slot freed without releasing a held task: it would wait forever.
        let err = setup(|s, _, running| {
            s.stopping = true;
            succeed(s, running, Instant::now());
            s.stopping = false;
        });
        assert!(err.starts_with("invariant 13"), "{err}");
        // A held task queued twice.
        let err = setup(|s, ids, _| {
            s.gates.forget_held(Gate::Concurrency(0), 0);
            s.gates.hold(Gate::Concurrency(0), ids[1].seq(), 0, false);
        });
        assert!(err.starts_with("invariant 2"), "{err}");
        // A running task counted out of its limit while it runs.
        let err = setup(|s, _, _| {
            s.gates
                .run_ended(0, Verdict::Neither, Instant::now(), &Events::none());
        });
        assert!(err.starts_with("invariant 12"), "{err}");
    }
}
