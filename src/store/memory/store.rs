//! The embedded store's shared part: the one lock around the [`State`], the condition
//! variables, the intake, and the [`Store`] operations on them (the wake-up protocol of the
//! module docs of `store/memory` is kept here).

use std::any::Any;
use std::time::{Duration, Instant};

use super::intake::{Entry, Intake};
use super::queue::Epoch;
use super::record::Effects;
use super::schedules::Schedules;
use super::slots::Slots;
use super::state::{Lend, Retention, State};

use crate::model::cancel::CancelToken;
use crate::model::clock::{Clock, Wake};
use crate::model::completion::{Completion, Finished};
use crate::model::dead_letter::DeadLetter;
use crate::model::error::{CancelError, ResubmitError, SubmitErrorKind, WaitError};
use crate::model::id::TaskId;
use crate::model::pause::{PauseError, PauseTarget, Paused};
use crate::model::queue_limit::{QueueLimit, QueueLimitError};
use crate::model::schedule::ScheduleInfo;
use crate::model::state::{CancelOutcome, CancelReason, TaskState};
use crate::observe::console::overview::Overview;
use crate::observe::events::Events;
use crate::observe::metrics::RunEnd;
use crate::observe::stats::{Stats, TaskFilter, TaskInfo, Totals, TypeStats};
use crate::store::registry::Registry;
use crate::store::schedule::{ScheduleDef, Tick};
use crate::store::{
    Claim, CopyPayload, Drained, Revived, RunOutcome, Store, StoreHub, Submission, Submitted,
};
use crate::sync::{
    Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering, Weak, yield_now,
};
use crate::unwind;

/// The embedded store: what the pool, its workers and its handles share in one process.
pub(crate) struct MemoryStore {
    pub(super) state: Mutex<State>,
    /// Idle workers wait here (untimed).
    pub(super) work_cv: Condvar,
    /// The timer waits here until the earliest due time.
    pub(super) timer_cv: Condvar,
    /// `shutdown` waits here for the drain and for the workers to exit.
    pub(super) done_cv: Condvar,
    /// A take or resubmit of a dead letter whose payload another thread is copying waits here
    /// for it to come back (see `State::lend_dead_letter`).
    lend_cv: Condvar,
    /// Plain submits, on their way into the state (see `intake.rs`); also where task ids come
    /// from, and whether the pool is closed.
    pub(super) intake: Intake,
    /// The workers' slots: the plain tasks they took from the intake (see `slots.rs`).
    pub(super) slots: Slots,
    /// Whether (and until when) a worker may start a direct task without the lock: see
    /// `State::direct_hint`, written under the lock by [`publish_hint`](Self::publish_hint).
    pub(super) direct_hint: AtomicU64,
    /// By type index: whether the type's plain tasks may run direct (no gate of its own, in a
    /// pool without lanes; see `slots.rs`, rule 4), as registered...
    direct_types: Box<[bool]>,
    /// ...and now: no pause or queue limit holds the type (written under the lock by
    /// [`refresh_direct_types`](Self::refresh_direct_types)).
    pub(super) direct_now: Box<[AtomicBool]>,
    /// Bumped (under the lock) whenever tasks become ready or the pool closes: what spinning
    /// workers watch.
    pub(super) ready_epoch: AtomicU64,
    /// Workers spinning now.
    pub(super) spinners: AtomicUsize,
    /// The most searchers rule 1 wakes at once: the number of CPUs, at least 2.
    max_searchers: usize,
    pub(super) registry: Registry,
    pub(super) clock: Clock,
    /// The pool's start on its clock: what due times are stamped from.
    pub(super) epoch: Epoch,
    /// What the pool's handles share; where unread handles' drops arrive (see `hub.rs`).
    hub: Arc<StoreHub>,
    /// The pool's events, for what is told outside the lock (a plain submit); the state holds
    /// the same.
    pub(super) events: Events,
    latest_run_at: Instant,
    pub(super) pool_id: u64,
    /// The periodic tasks' watermarks and pauses, under a lock of their own.
    schedules: Schedules,
}

impl MemoryStore {
    /// A store for `workers` workers, registered with its clock (a manual clock's advance wakes
    /// it, rule 5).
    pub(crate) fn start(
        registry: Registry,
        clock: Clock,
        retention: Retention,
        workers: usize,
        pool_id: u64,
        events: Events,
    ) -> Arc<Self> {
        let shared = Arc::new(MemoryStore::new(
            registry, clock, retention, workers, pool_id, events,
        ));
        shared
            .hub
            .attach(Arc::downgrade(&shared) as Weak<MemoryStore>);
        let sleeper: Weak<MemoryStore> = Arc::downgrade(&shared);
        shared.clock.register(sleeper);
        shared
    }

    pub(super) fn new(
        registry: Registry,
        clock: Clock,
        retention: Retention,
        workers: usize,
        pool_id: u64,
        events: Events,
    ) -> Self {
        let epoch = clock.now();
        // An Instant that far out always exists (Instants are at least 64-bit seconds).
        let latest_run_at = epoch + Duration::from_nanos(u64::MAX);
        let next_seq = Arc::new(AtomicU64::new(1));
        // Lanes count each lane's running tasks: every type of such a pool is gated.
        let plain_pool = registry.lanes.is_empty();
        let direct_types: Box<[bool]> = registry
            .entries()
            .iter()
            .map(|entry| plain_pool && !entry.is_gated())
            .collect();
        let direct_now = direct_types.iter().map(|&d| AtomicBool::new(d)).collect();
        MemoryStore {
            slots: Slots::new(workers),
            direct_hint: AtomicU64::new(u64::MAX),
            direct_types,
            direct_now,
            latest_run_at,
            epoch: Epoch(epoch),
            state: Mutex::new(State::new(
                retention,
                workers,
                epoch,
                pool_id,
                events.clone(),
                &registry,
                Arc::clone(&next_seq),
            )),
            pool_id,
            schedules: Schedules::default(),
            work_cv: Condvar::new(),
            timer_cv: Condvar::new(),
            done_cv: Condvar::new(),
            lend_cv: Condvar::new(),
            intake: Intake::new(next_seq),
            hub: StoreHub::new(),
            events,
            ready_epoch: AtomicU64::new(0),
            spinners: AtomicUsize::new(0),
            max_searchers: std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
            registry,
            clock,
        }
    }

    /// Whether plain tasks of type `type_index` may run direct, as registered (see `slots.rs`,
    /// rule 4).
    pub(super) fn runs_direct(&self, type_index: u32) -> bool {
        self.direct_types
            .get(type_index as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Whether plain tasks of type `type_index` may start direct now, without the lock (read
    /// after the pop: see `slots.rs`, rule 4).
    pub(super) fn runs_direct_now(&self, type_index: u32) -> bool {
        self.direct_now
            .get(type_index as usize)
            .is_some_and(|now| now.load(Ordering::Acquire))
    }

    /// Rewrites [`direct_now`](Self::direct_now) after a pause, a resume or a queue limit
    /// (under the lock, before the change is visible to anyone else).
    fn refresh_direct_types(&self, state: &State) {
        for (index, now) in self.direct_now.iter().enumerate() {
            let index = index as u32;
            now.store(
                self.runs_direct(index) && state.may_start_direct(index),
                Ordering::Release,
            );
        }
    }

    /// The latest due time the delayed heap can represent (64-bit nanoseconds after the start).
    pub(crate) fn latest_run_at(&self) -> Instant {
        self.latest_run_at
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    // ===== wake-ups =====

    /// Wakes a sleeper (see the module docs); returns whether one was notified.
    pub(super) fn wake_one(&self, state: &mut State) -> bool {
        self.wake_idle(state) || self.wake_timer(state)
    }

    /// Wakes an idle worker not yet notified, if there is one.
    fn wake_idle(&self, state: &mut State) -> bool {
        if state.idle <= state.notified {
            return false;
        }
        state.notified += 1;
        self.intake.notified();
        self.work_cv.notify_one();
        true
    }

    /// Wakes the timer, if it sleeps and was not notified yet (a notified timer re-reads the
    /// earliest due time anyway).
    pub(super) fn wake_timer(&self, state: &mut State) -> bool {
        if !state.timer_sleeping || state.timer_notified {
            return false;
        }
        state.timer_notified = true;
        self.intake.notified();
        self.timer_cv.notify_one();
        true
    }

    /// Rule 1: as many searchers as ready tasks.
    pub(super) fn wake_for_ready(&self, state: &mut State) {
        self.wake_searchers(state, 0);
    }

    /// Rule 1, counting `waiting` more tasks (intake entries) as ready.
    pub(super) fn wake_searchers(&self, state: &mut State, waiting: usize) {
        loop {
            let searchers = state.notified
                + usize::from(state.timer_notified)
                + self.spinners.load(Ordering::Acquire);
            let wanted = (state.ready_len() + waiting).min(self.max_searchers);
            if searchers >= wanted || !self.wake_one(state) {
                return;
            }
        }
    }

    /// Applies the wake-up rules for what a transition did; call with the lock held.
    pub(crate) fn notify(&self, state: &mut State, effects: &Effects) {
        if effects.newly_ready > 0 {
            self.ready_epoch.fetch_add(1, Ordering::Release);
            self.wake_for_ready(state);
        }
        if effects.new_earliest {
            // Rule 3.
            if state.timer_sleeping {
                self.wake_timer(state);
            } else {
                self.wake_idle(state);
            }
        }
        if state.closed && state.drained() {
            self.wake_all();
        } else if state.counts_idle() {
            // Rule 6 (waiters re-check due times themselves).
            self.done_cv.notify_all();
        }
        self.publish_hint(state);
    }

    /// Rule 4.
    fn wake_all(&self) {
        self.ready_epoch.fetch_add(1, Ordering::Release);
        self.work_cv.notify_all();
        self.timer_cv.notify_all();
        self.done_cv.notify_all();
    }

    /// Runs a transition under the lock, applies the wake-up rules, then drops the user values it
    /// set aside once the lock is released. The intake is moved in first: every task accepted
    /// so far is in the state when `f` looks.
    pub(crate) fn transition<R>(
        &self,
        f: impl FnOnce(&mut State, Instant, &mut Effects) -> R,
    ) -> R {
        let mut effects = Effects::default();
        let result = {
            let mut state = self.state.lock();
            let now = self.clock.now();
            self.flush(&mut state, now, &mut effects);
            let result = f(&mut state, now, &mut effects);
            self.notify(&mut state, &effects);
            result
        };
        effects.apply();
        result
    }

    // ===== the intake =====

    /// Moves what the intake holds into the state (see `intake.rs`), after `first` (entries
    /// popped before, parked in a slot). A closed pool still takes it in (those producers
    /// passed their check before it closed): a stopped one cancels it at once.
    ///
    /// Entries go in by id (the order they were submitted in, give or take producers racing),
    /// wherever they waited. Delayed tasks that fell due while they waited are promoted in due
    /// order, merged with the delayed heap (see `State::admit`).
    pub(super) fn take_in(
        &self,
        state: &mut State,
        mut first: Vec<Entry>,
        now: Instant,
        effects: &mut Effects,
    ) {
        self.intake.drain(|entry| first.push(entry));
        if !first.is_sorted_by_key(|entry| entry.seq) {
            first.sort_by_key(|entry| entry.seq);
        }
        let mut fell_due = false;
        for entry in first {
            fell_due |= state.admit(entry, now, effects);
        }
        if fell_due {
            state.promote_fallen_due(now, effects);
        }
    }

    /// Takes in the drops of unread handles (see `hub.rs`); the outcomes kept for them go to
    /// `effects`, to be dropped once the lock is released.
    pub(super) fn take_dropped(&self, state: &mut State, effects: &mut Effects) {
        self.hub
            .take_dropped(|seq| state.handle_dropped(seq, effects));
    }

    /// What a lookup does first (rule 3 of `slots.rs`): the intake and the slots' contents
    /// ([`materialize`](Self::materialize)), then [`take_dropped`](Self::take_dropped). Every
    /// task accepted so far is in the state after.
    pub(crate) fn flush(&self, state: &mut State, now: Instant, effects: &mut Effects) {
        self.materialize(state, now, effects);
        self.take_dropped(state, effects);
    }

    /// [`materialize`](Self::materialize), with the wake-up
    /// rules applied to what became ready or due; what retention forgets goes to `effects`.
    /// Nothing to do once the pool has stopped: `stop` moved the intake and the slots in after
    /// every task accepted before the close was in one of them (`close`), and nothing is
    /// accepted after.
    fn flush_locked(&self, state: &mut State, now: Instant, effects: &mut Effects) {
        if state.stopping {
            return;
        }
        self.materialize(state, now, effects);
        self.notify(state, effects);
    }

    /// A read of the state: the intake and the slots moved in first, so that every task
    /// accepted so far is in the state. What retention forgot meanwhile is dropped once the
    /// lock is released.
    fn read<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let mut effects = Effects::default();
        let result = {
            let mut state = self.state.lock();
            let now = self.clock.now();
            self.flush_locked(&mut state, now, &mut effects);
            f(&mut state, now)
        };
        effects.apply();
        result
    }

    /// Closes the pool to new tasks (idempotent), once every task accepted before is in the
    /// state (see `intake.rs`). Returns the lock.
    fn close(&self, effects: &mut Effects) -> MutexGuard<'_, State> {
        let mut state = self.state.lock();
        if !state.closed {
            let given = self.intake.close();
            // A producer that took its id before the flag may still be pushing its task: it
            // needs no lock for that, so this waits with the lock held, and nobody sees the
            // pool closed (a worker exits when it is closed and empty) before its task is in.
            loop {
                self.flush_locked(&mut state, self.clock.now(), effects);
                if state.took_in(given) {
                    break;
                }
                yield_now();
            }
            state.closed = true;
        }
        // Idle workers re-check whether anything is left to drain.
        self.wake_all();
        state
    }

    /// Stops the pool (`State::stop`), wakes everyone, and drops what it cancelled (and what
    /// `effects` held already) once the lock is released. Returns the tasks still running, with
    /// their type indexes.
    fn stop(&self, mut state: MutexGuard<'_, State>, mut effects: Effects) -> Vec<(TaskId, u32)> {
        let now = self.clock.now();
        // What is still in the intake or parked in a slot is cancelled with the rest; running
        // direct tasks get records, whose tokens the stop fires.
        self.flush(&mut state, now, &mut effects);
        let running = state.stop(now, &mut effects);
        self.publish_hint(&state);
        self.wake_all();
        drop(state);
        effects.apply();
        running
    }

    /// Runs `f` as a transition once dead letter `id`'s payload is not lent to another thread
    /// (`dead_letter_payload` copying it), waiting for it to come back; `None` if the calling
    /// thread holds it lent (a `Clone` that calls back into the pool: it cannot wait for
    /// itself). A lend is checked under the same lock as `f` runs.
    fn unlent<R>(
        &self,
        id: TaskId,
        mut f: impl FnMut(&mut State, Instant, &mut Effects) -> R,
    ) -> Option<R> {
        let me = crate::sync::current_thread_id();
        loop {
            let done = self.transition(|state, now, effects| match state.lender(id) {
                None => Ok(f(state, now, effects)),
                Some(lender) => Err(lender == me),
            });
            match done {
                Ok(result) => return Some(result),
                Err(true) => return None,
                Err(false) => {
                    let mut state = self.state.lock();
                    while state.lender(id).is_some_and(|lender| lender != me) {
                        self.lend_cv.wait(&mut state);
                    }
                }
            }
        }
    }

    /// Blocks until `done(state, now)` holds or `deadline` passes. The deadline is in real time
    /// (`Instant::now()`), whatever the pool's clock: it bounds how long the caller blocks, and
    /// on a manual clock nobody may move the pool's time. Changes of the state and a manual
    /// clock's advance notify `done_cv` (rules 5 and 6); the timed wait only marks the deadline.
    ///
    /// Takes in the drops of unread handles as it goes: an idle pool has no worker finishing
    /// tasks to do it, and a caller waiting for the pool to settle expects what it let go to
    /// be gone. The outcomes they free are dropped once the lock is released.
    fn wait_until_done(
        &self,
        deadline: Option<Instant>,
        done: impl Fn(&mut State, Instant) -> bool,
    ) -> Result<(), WaitError> {
        let mut dropped = Effects::default();
        let result = {
            let mut state = self.state.lock();
            loop {
                let now = self.clock.now();
                self.flush_locked(&mut state, now, &mut dropped);
                self.take_dropped(&mut state, &mut dropped);
                if done(&mut state, now) {
                    break Ok(());
                }
                match deadline {
                    Some(deadline) if Instant::now() >= deadline => {
                        break Err(WaitError::TimedOut);
                    }
                    Some(deadline) => self.done_cv.wait_until(&mut state, deadline),
                    None => self.done_cv.wait(&mut state),
                }
            }
        };
        dropped.apply();
        result
    }
}

impl Store for MemoryStore {
    fn pool_id(&self) -> u64 {
        self.pool_id
    }

    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn is_closed(&self) -> bool {
        self.intake.is_closed()
    }

    fn submit(&self, task: Submission<'_>) -> Result<Submitted, SubmitErrorKind> {
        self.submit_task(task)
    }

    fn submit_batch(
        &self,
        batch: &mut [Submission<'_>],
    ) -> Result<Vec<Submitted>, (usize, SubmitErrorKind)> {
        self.submit_tasks(batch)
    }

    fn cancel(&self, id: TaskId) -> Result<CancelOutcome, CancelError> {
        self.transition(|state, now, effects| {
            state.cancel(id, CancelReason::Requested, now, effects)
        })
    }

    fn find_key(&self, key: &str) -> Option<TaskId> {
        self.read(|state, _| state.key_holder(key))
    }

    fn cancel_key(&self, key: &str) -> Result<(TaskId, CancelOutcome), CancelError> {
        // Found and cancelled under one lock: no other task can take the key in between.
        let cancelled = self.transition(|state, now, effects| {
            let id = state.key_holder(key)?;
            Some(
                state
                    .cancel(id, CancelReason::Requested, now, effects)
                    .map(|outcome| (id, outcome)),
            )
        });
        cancelled.unwrap_or_else(|| Err(CancelError::UnknownKey(key.to_owned())))
    }

    fn status(&self, id: TaskId) -> Option<TaskState> {
        self.read(|state, _| state.status(id))
    }

    fn info(&self, id: TaskId) -> Option<TaskInfo> {
        self.read(|state, _| state.info(id, &self.registry))
    }

    fn tasks(&self, filter: &TaskFilter, after: Option<TaskId>, limit: usize) -> Vec<TaskInfo> {
        // Ids run in pool order, as the dead letters' pages do.
        let after = match after {
            Some(id) if id.pool() == self.pool_id => id.seq(),
            Some(id) if id.pool() > self.pool_id => return Vec::new(),
            _ => 0,
        };
        let type_index = match filter.get_task_type() {
            Some(name) => match self.registry.index_of(name) {
                Some(index) => Some(index),
                // A type this pool does not register has no task here.
                None => return Vec::new(),
            },
            None => None,
        };
        self.read(|state, _| {
            state.tasks(&self.registry, filter.get_state(), type_index, after, limit)
        })
    }

    fn completion_of(&self, id: TaskId) -> Option<(u32, Arc<Completion>)> {
        self.read(|state, _| state.completion_of(id))
    }

    fn completion_for(&self, id: TaskId) -> Option<Arc<Completion>> {
        self.read(|state, _| state.completion_for(id))
    }

    fn hub(&self) -> &Arc<StoreHub> {
        &self.hub
    }

    /// A transition that does nothing but move the intake in (so that the drops find their
    /// tasks' records, as after a finished task) and take the drops in; the outcomes go once
    /// the lock is released.
    fn take_in_dropped(&self) {
        let mut effects = Effects::default();
        {
            let mut state = self.state.lock();
            self.take_dropped(&mut state, &mut effects);
        }
        effects.apply();
    }

    fn stats(&self) -> Stats {
        self.read(|state, now| state.stats(now))
    }

    fn type_stats(&self) -> Vec<TypeStats> {
        self.read(|state, now| state.type_stats(now))
    }

    fn overview(&self) -> Result<Overview, String> {
        let wall = self.clock.wall_now();
        let mut overview = self.read(|state, now| state.overview(now, wall));
        overview.paused.extend(self.schedules.paused());
        Ok(overview)
    }

    fn dead_letters(
        &self,
        after: Option<TaskId>,
        type_index: Option<u32>,
        limit: usize,
    ) -> Vec<DeadLetter> {
        self.read(|state, _| state.dead_letters(&self.registry, after, type_index, limit))
    }

    fn purge_dead_letter(&self, id: TaskId) -> bool {
        // No wait for a lent payload: it is dropped when it comes back.
        self.transition(|state, _, effects| state.purge_dead_letter(id, effects))
    }

    fn resubmit(
        &self,
        id: TaskId,
        type_index: u32,
    ) -> Result<(TaskId, Arc<Completion>), ResubmitError> {
        self.unlent(id, |state, now, effects| {
            state.resubmit(id, type_index, now, effects)
        })
        .unwrap_or(Err(ResubmitError::PayloadInUse(id)))
    }

    fn resubmit_with_dependents(
        &self,
        id: TaskId,
        type_index: u32,
    ) -> Result<Revived, ResubmitError> {
        let (id, completion, dependents) = self
            .unlent(id, |state, now, effects| {
                state.resubmit_with_dependents(id, type_index, now, effects)
            })
            .unwrap_or(Err(ResubmitError::PayloadInUse(id)))?;
        Ok(Revived {
            id,
            completion,
            dependents,
        })
    }

    fn take_dead_letter(&self, id: TaskId, type_index: u32) -> Option<Box<dyn Any + Send>> {
        self.unlent(id, |state, _, effects| {
            state.take_dead_letter(id, type_index, effects)
        })?
    }

    /// Lends the payload out of its record under the lock, copies it outside the lock, and
    /// brings it back (see `State::lend_dead_letter`): user code (the `Clone`) never runs under
    /// the lock, and it may call back into the pool. Another thread's copy of the same dead
    /// letter is waited for; a copy asked for from inside this thread's own copy is refused.
    fn dead_letter_payload(
        &self,
        id: TaskId,
        type_index: u32,
        copy: &CopyPayload,
    ) -> Option<Box<dyn Any + Send>> {
        let me = crate::sync::current_thread_id();
        let payload = {
            let mut state = self.state.lock();
            loop {
                match state.lend_dead_letter(id, type_index, me) {
                    Lend::Lent(payload) => break payload,
                    Lend::Refused => return None,
                    // Every wait loops on its condition: lent again by the time it wakes, it
                    // waits again.
                    Lend::Busy => self.lend_cv.wait(&mut state),
                }
            }
        };
        // User code, with no lock held, inside `catch_unwind` (see `unwind.rs`); a copy that
        // panics leaves the payload as it was, and it goes back.
        let copied = unwind::catch(|| copy(&*payload)).ok().flatten();
        let left = {
            let mut state = self.state.lock();
            let left = state.give_back(id, payload);
            self.lend_cv.notify_all();
            left
        };
        // Purged or pushed out while lent: dropped here, outside the lock.
        unwind::drop_quietly(left);
        copied
    }

    fn pause(&self, target: &PauseTarget) -> Result<bool, PauseError> {
        target.check()?;
        if let PauseTarget::Schedule(name) = target {
            return self.schedules.pause(name);
        }
        self.transition(|state, _, _| {
            let paused = state.pause(target);
            self.refresh_direct_types(state);
            paused
        })
    }

    fn resume(&self, target: &PauseTarget) -> Result<bool, PauseError> {
        target.check()?;
        if let PauseTarget::Schedule(name) = target {
            return self.schedules.resume(name);
        }
        self.transition(|state, now, effects| {
            let resumed = state.resume(target, now, effects);
            self.refresh_direct_types(state);
            resumed
        })
    }

    fn paused(&self) -> Result<Vec<Paused>, PauseError> {
        let mut paused = self.lock().paused();
        paused.extend(self.schedules.paused());
        Ok(paused)
    }

    fn set_queue_limit(
        &self,
        queue: &str,
        limit: Option<u32>,
    ) -> Result<Option<u32>, QueueLimitError> {
        self.transition(|state, now, effects| {
            let before = state.set_queue_limit(queue, limit, now, effects);
            self.refresh_direct_types(state);
            before
        })
    }

    fn queue_limits(&self) -> Result<Vec<QueueLimit>, QueueLimitError> {
        Ok(self.lock().queue_limits())
    }

    fn register_schedules(&self, schedules: &[ScheduleDef]) -> Result<(), String> {
        self.schedules.register(schedules, self.clock.wall_now());
        Ok(())
    }

    fn tick_schedule(&self, schedule: &ScheduleDef) -> Result<Tick, String> {
        Ok(self.schedules.tick(self, schedule, self.clock.wall_now()))
    }

    fn schedules(&self) -> Result<Vec<ScheduleInfo>, String> {
        Ok(self.schedules.list(self))
    }

    fn wait_idle(&self, deadline: Option<Instant>) -> Result<(), WaitError> {
        self.wait_until_done(deadline, |state, now| state.is_idle(now))
    }

    fn wait_empty(&self, deadline: Option<Instant>) -> Result<(), WaitError> {
        self.wait_until_done(deadline, |state, _| state.outstanding() == 0)
    }

    fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Closes the pool, lets the workers drain it until nothing can make progress any more (see
    /// [`State::drained`]) or `deadline` passes (on the pool's clock; `None` waits for the drain
    /// however long it takes), then stops it: whatever is left is cancelled and running handlers
    /// see their tokens fire.
    ///
    /// `from_handler`: the caller is one of the pool's handlers, whose own task cannot finish
    /// while it waits here.
    fn drain(&self, from_handler: bool, deadline: Option<Instant>) -> Drained {
        let mut effects = Effects::default();
        let mut state = self.close(&mut effects);
        let before = state.totals();
        if from_handler {
            state.handlers_in_shutdown += 1;
        }
        let mut deadline_reached = false;
        loop {
            self.flush_locked(&mut state, self.clock.now(), &mut effects);
            if state.drained() {
                break;
            }
            if deadline.is_some_and(|d| self.clock.now() >= d) {
                deadline_reached = true;
                break;
            }
            self.clock.wait_until(&self.done_cv, &mut state, deadline);
        }
        let running = self.stop(state, effects);
        Drained {
            deadline_reached,
            before,
            interrupted: running
                .into_iter()
                .map(|(id, index)| (id, self.registry.entry(index).name))
                .collect(),
        }
    }

    /// Stops the pool at once (used when it is dropped): cancels every task that has not started
    /// and fires the tokens of running ones; does not wait.
    fn stop_now(&self) {
        let mut effects = Effects::default();
        let state = self.close(&mut effects);
        self.stop(state, effects);
    }

    /// Waits until every worker has left its loop, except those whose handlers are themselves
    /// in `shutdown` (with `from_handler`, the caller's own is one of them and leaves the count
    /// on return).
    fn wait_for_workers(&self, from_handler: bool) -> Totals {
        let mut state = self.state.lock();
        while state.live_workers > state.handlers_in_shutdown {
            self.done_cv.wait(&mut state);
        }
        if from_handler {
            state.handlers_in_shutdown -= 1;
            self.done_cv.notify_all();
        }
        state.totals()
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.read(|state, _| {
            state.check_invariants()?;
            // The intake word's sleepers mirror the state's (they change under the lock only).
            let (_, sleepers, _) = self.intake.counts();
            let expected = state.idle - state.notified
                + usize::from(state.timer_sleeping && !state.timer_notified);
            if sleepers != expected as u64 {
                return Err(format!(
                    "the intake counts {sleepers} sleepers, the state {expected}"
                ));
            }
            if state.standby && state.idle == 0 {
                return Err("a standby timer, and no idle worker".to_owned());
            }
            // Invariant 17, for what the slots hold (a worker may have parked more since the
            // read materialized them).
            for worker in 0..self.slots.len() {
                let slot = self.slots.lock(worker);
                state.check_slot(&slot)?;
            }
            Ok(())
        })
    }

    fn claim(&self, worker: usize, spare: Option<CancelToken>) -> Option<Claim> {
        self.claim_for(worker, spare, None)
    }

    fn worker_panicked(&self, held: Option<TaskId>, message: String) {
        self.transition(|state, now, effects| {
            state.count_worker_panic();
            if let Some(id) = held {
                // The flush gave a direct task its record; it leaves its slot here.
                for worker in 0..self.slots.len() {
                    let mut slot = self.slots.lock(worker);
                    if slot.running.as_ref().is_some_and(|r| r.seq == id.seq()) {
                        slot.running = None;
                    }
                }
                state.abandon(id, message, now, effects);
            }
        });
    }

    /// A worker's loop ended.
    fn worker_exited(&self) {
        let mut state = self.state.lock();
        state.live_workers -= 1;
        self.done_cv.notify_all();
    }

    fn complete_and_claim(
        &self,
        claim: Claim,
        outcome: RunOutcome,
        token: CancelToken,
        run: RunEnd<'_>,
    ) -> Option<Claim> {
        let worker = run.worker;
        // A direct task's success, without the lock (rule 5 of `slots.rs`).
        let (claim, outcome, run) = match self.end_direct(worker, claim, outcome, run) {
            Ok(now) => {
                let spare = token.reusable().then_some(token);
                return self.claim_for(worker, spare, Some(now));
            }
            Err(back) => back,
        };
        let mut effects = Effects::default();
        let next = {
            let mut state = self.state.lock();
            let now = self.clock.now();
            // A few relaxed stores to the worker's own counters, before the outcome is public.
            run.count(now);
            // A direct task gets its record here if no lookup gave it one.
            self.settle_direct(&mut state, worker, claim.id.seq(), now, &mut effects);
            state.complete(claim, outcome, now, &mut effects);
            // The record and the claim have dropped their clones of the token: if the handler
            // kept none either, the next task can have it.
            let mut spare = token.reusable().then_some(token);
            let next = if state.stopping {
                None
            } else {
                self.take(&mut state, worker, now, &mut spare)
            };
            if next.is_some() {
                // take() already woke sleepers for every task still ready.
                effects.newly_ready = 0;
            }
            self.take_dropped(&mut state, &mut effects);
            self.notify(&mut state, &effects);
            next
        };
        effects.apply();
        // Nothing to take at once: drop the user values first (above), then wait for work.
        next.or_else(|| self.claim(worker, None))
    }
}

impl Wake for MemoryStore {
    /// Rule 5.
    fn wake(&self) {
        let mut state = self.state.lock();
        self.timer_cv.notify_all();
        self.done_cv.notify_all();
        if !state.timer_sleeping && state.has_timed() {
            self.wake_one(&mut state);
        }
    }
}

impl Drop for MemoryStore {
    /// The last reference to the pool's state may go on any thread (the pool's owner, a worker
    /// that exits last, a handle's upgrade): the user values it still holds (dead letters'
    /// payloads, remembered outputs) are dropped one by one inside `catch_unwind`, never into
    /// the thread that happened to drop it.
    ///
    /// The outcomes kept for unread handles go to the hub, for those handles (see `hub.rs`).
    fn drop(&mut self) {
        let mut effects = Effects::default();
        let state = self.state.get_mut();
        self.hub
            .take_dropped(|seq| state.handle_dropped(seq, &mut effects));
        let mut kept = state.take_kept();
        // Left in the intake or parked in a slot (never, once the pool stopped: `stop` took
        // them in): cancelled.
        let mut left = Vec::new();
        self.intake.drain(|entry| left.push(entry));
        for worker in 0..self.slots.len() {
            left.extend(self.slots.lock(worker).parked.drain(..));
        }
        for entry in left {
            if !state.early_dropped(entry.seq) {
                let cancelled = Completion::ended(Finished::Cancelled(CancelReason::Shutdown));
                kept.insert(entry.seq, cancelled);
            }
            effects.drop_later(entry.payload);
        }
        for record in state.take_records() {
            effects.drop_record_later(record);
        }
        self.hub.seal(kept);
        effects.apply();
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("registry", &self.registry)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}
