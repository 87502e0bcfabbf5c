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
//! 4. A `Running` task's payload is held by exactly one worker's [`Claim`](crate::store::Claim), and its token is in
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
//!     never above the limit, and so is each lane's (its types' running tasks, at most its
//!     workers): a task of a gated type starts only through `Gates::admit`, which checks the
//!     limits and counts it in; `complete` and `abandon`, the only ways out of `Running`, count
//!     it out. (So do the token bucket and the breaker: every start of a
//!     rate-limited type takes a token, every start of a half-open downstream's type is its
//!     one probe.)
//! 13. No held task is forgotten: a gate that holds tasks and has released none is closed,
//!     and what opens it releases it: a concurrency gate is at its limit (a task of the type
//!     leaving `Running` releases it), so is a lane (a task of one of its types leaving
//!     `Running` releases it), a breaker is open (its cool-down is a due time of the
//!     timer) or half-open with its probe out (the probe's end releases it), a rate gate waits
//!     for its bucket's next token (a due time of the timer), a pause gate is closed while
//!     its type is paused (resuming releases it).
//! 14. A breaker's `probe_out` is set only while it is half-open, and every change of a
//!     breaker's state is emitted as an `Event::Breaker` in the step that makes it.
//! 15. The outcome of a task whose unread handle lives (see `hub.rs`) is kept: in its record
//!     (`unread_handle`, a dormant task's too), or, once retention forgot the record, in
//!     `orphans`, published. No
//!     task has both a record and an orphan. `early_drops` names only tasks still in the
//!     intake or in a worker's slot (invariant 17), none of them a record-less success.
//! 16. A task is held at its type's pause gate only while a pause in `pauses` covers the type
//!     (its own, or its queue's), and is never `Released` from one: resuming releases the whole
//!     held queue, free. Each type's pause gate is closed exactly when a pause covers it.
//!
//! 17. A plain task a worker popped from the intake (a *direct* task, see `slots.rs`) is in
//!     exactly one place: parked in its worker's slot (not started, no record), running in it
//!     (its token's clone in the slot; a record, `Running`, with its token in `tokens`,
//!     exactly when the slot marks it `recorded`), in its worker's done buffer (a success
//!     with a unit output, no record), in `done`, or a record like any other task's (once a
//!     lookup materialized it, or it ended otherwise). Each is counted in
//!     `totals.submitted` once, when the state first holds it (admitted, materialized or
//!     recorded as done).
//! 18. `done` holds exactly the record-less successes retention has not forgotten; none has a
//!     record, and each is listed once in `finished`, which retention reads for them as for
//!     records. A handle without a completion whose task is nowhere (no record, no orphan, not
//!     in `done`, in no slot or intake) is one of a forgotten record-less success: its outcome
//!     is a unit success (invariant 15 holds through this rule).
//!
//! [`State::check_invariants`] checks these (for tests; it reads every record; the time-based
//! halves of 12 and 13 are left to the tests of limits and breakers).

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use super::done::Done;
use super::gate::Gates;
use super::ids::{IdMap, Seq};
use super::intake::Entry;
use super::queue::{DelayedQueue, Epoch, ReadyQueue, Stamp};
use super::record::{Dormant, Effects, Gating, Outcome, Record};
use crate::gates::aging::Aging;
use crate::model::cancel::CancelToken;
use crate::model::completion::Completion;
use crate::model::id::TaskId;
use crate::model::pause::PauseTarget;
use crate::model::state::{CancelReason, Failure, TaskState};
use crate::model::task::Dependency;
use crate::observe::event::Event;
use crate::observe::events::Events;
use crate::observe::stats::Totals;
use crate::store::registry::{Registry, Settings};
use crate::sync::{Arc, AtomicU64, Ordering};

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
pub(super) struct Counts {
    pub(super) blocked: usize,
    pub(super) scheduled: usize,
    pub(super) ready: usize,
    pub(super) running: usize,
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

    pub(super) fn enter(&mut self, state: TaskState) {
        if let Some(n) = self.slot(state) {
            *n += 1;
        }
    }

    pub(super) fn leave(&mut self, state: TaskState) {
        if let Some(n) = self.slot(state) {
            *n -= 1;
        }
    }

    fn outstanding(&self) -> usize {
        self.blocked + self.scheduled + self.ready + self.running
    }
}

/// How a task ends.
pub(super) enum End {
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
    pub(super) records: IdMap<Record>,
    /// Plain tasks scheduled for later that nothing has asked about (invariant 1): a delayed
    /// task costs a third of a record until it falls due.
    pub(super) dormant: IdMap<Dormant>,
    /// The tokens of running tasks (invariant 4), out of the records to keep those small.
    pub(super) tokens: IdMap<CancelToken>,
    pub(super) epoch: Epoch,
    pub(super) ready: ReadyQueue,
    pub(super) delayed: DelayedQueue,
    /// Idempotency keys of live and succeeded tasks.
    pub(super) keys: HashMap<Arc<str>, Seq>,
    /// Terminal tasks, with when they finished, in that order: retention drops from the front
    /// (without reading the old record to learn its age). Record-less successes too.
    pub(super) finished: VecDeque<(Seq, Stamp)>,
    /// Direct tasks that succeeded with a unit output: no record (invariant 18).
    pub(super) done: Done,
    /// Dead letters: failed tasks not yet resubmitted or taken, in id order. Kept past
    /// retention, up to `retention.max_dead_letters`.
    pub(super) dead: BTreeSet<Seq>,
    /// The last minutes' endings, for an operator's overview.
    pub(super) minutes: super::minutes::Minutes,
    /// The outcomes of forgotten tasks whose unread handle lives (invariant 15, see `hub.rs`).
    pub(super) orphans: IdMap<Arc<Completion>>,
    /// Tasks still in the intake or a slot whose unread handle was dropped already (its drop
    /// was taken in before the task).
    pub(super) early_drops: IdMap<()>,
    /// The last clock reading stamped, and its stamp (see [`State::stamp`]).
    stamp_memo: (Instant, Stamp),
    /// This pool's id: the first half of every [`TaskId`] it gives.
    pub(super) pool: u64,
    /// Where dead letters and breaker changes are reported (a channel send: no user code runs
    /// under the lock).
    pub(super) events: Events,
    /// The task types' names, by index.
    pub(super) names: Vec<&'static str>,
    /// The task types' queues, by index.
    pub(super) queues: Vec<&'static str>,
    /// The pauses in force, with when each was made (invariant 16).
    pub(super) pauses: BTreeMap<PauseTarget, SystemTime>,
    /// Concurrency limits, rate limits, circuit breakers, and the tasks they hold back.
    pub(super) gates: Gates,
    /// How ready tasks age, if they do.
    pub(super) aging: Option<Aging>,
    /// Whether claims go through the gates and aging (some type is gated, or tasks age): the
    /// one check an ungated pool pays per claim.
    pub(super) gated: bool,
    pub(super) counts: Counts,
    pub(super) totals: Totals,
    /// Where task ids come from: shared with the intake, whose submits take theirs without the
    /// lock.
    pub(super) next_seq: Arc<AtomicU64>,
    pub(super) retention: Retention,
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
            queues: registry.entries().iter().map(|e| e.queue).collect(),
            pauses: BTreeMap::new(),
            gates: Gates::new(registry, epoch),
            aging: registry.aging,
            gated: registry.has_gates() || registry.aging.is_some() || !registry.lanes.is_empty(),
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
            done: Done::default(),
            minutes: Default::default(),
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
    pub(super) fn record(&self, id: TaskId) -> Option<(Seq, &Record)> {
        let seq = self.local(id)?;
        self.records.get(&seq).map(|record| (seq, record))
    }

    /// Gives dormant task `seq` its record (invariant 1): something asks about it. Any other
    /// task is left as it is.
    pub(super) fn rouse(&mut self, seq: Seq) {
        if !self.dormant.is_empty() {
            if let Some(dormant) = self.dormant.remove(&seq) {
                self.records.insert(seq, dormant.into_record());
            }
        }
    }

    /// Gives every dormant task its record, for what reads or ends them all.
    pub(super) fn rouse_all(&mut self) {
        self.records
            .extend(self.dormant.drain().map(|(seq, d)| (seq, d.into_record())));
    }

    /// A new task's sequence number (they only grow: a dependent's is above its dependencies').
    pub(super) fn new_seq(&self) -> Seq {
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
    pub(super) fn stamp(&mut self, now: Instant) -> Stamp {
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
                // A record-less success (invariant 18): met, and listed as a dependency.
                None if self.done_type(dependency.id).is_some() => seqs.push(dependency.id.seq()),
                // Forgotten, seen succeeding by its handle.
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
        // Told first: before its start (no worker can claim it while this lock is held) and
        // before a cancel at once (a failed dependency) or any other ending.
        let task_type = self.names.get(task.type_index as usize).copied();
        self.events.lifecycle(|| Event::Submitted {
            id: TaskId::from_parts(self.pool, seq),
            task_type: task_type.unwrap_or("?"),
            priority: task.priority,
        });
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
            direct: _,
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
    pub(super) fn insert_as(
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
        // A dependency without a record is a record-less success (`resolve_dependencies`
        // checked each under this lock).
        let doomed =
            task.dependencies
                .iter()
                .find_map(|dep| match self.records.get(dep).map(|r| r.state) {
                    Some(TaskState::Failed) => Some(CancelReason::DependencyFailed(self.id(*dep))),
                    Some(TaskState::Cancelled) => {
                        Some(CancelReason::DependencyCancelled(self.id(*dep)))
                    }
                    _ => None,
                });
        let mut pending = 0;
        if doomed.is_none() {
            for dep in &task.dependencies {
                let Some(record) = self.records.get_mut(dep) else {
                    debug_assert!(self.done.contains(*dep), "dependencies checked");
                    continue;
                };
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
    pub(super) fn make_runnable(&mut self, id: Seq, now: Instant, effects: &mut Effects) {
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
}

#[cfg(all(test, not(tasq_loom)))]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::gate::{Gate, Wakes};
    use super::super::record::GateKind;
    use super::super::store::MemoryStore;
    use super::*;
    use crate::gates::breaker::{Breaker, BreakerState, Verdict};
    use crate::gates::limit::RateLimit;
    use crate::model::clock::Clock;
    use crate::model::completion::Finished;
    use crate::model::state::{CancelOutcome, FailureReason};
    use crate::model::task::TaskType;
    use crate::observe::event::Event;
    use crate::store::Store;
    use crate::store::registry::Entry;
    use crate::store::{Claim, RunOutcome};

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
        let events = Events::start(vec![hook], false, "gates-test").unwrap();
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
