//! Direct runs: a worker takes a plain task from the intake into its slot and runs it without
//! the pool's lock, and a success with a unit output leaves no record (the protocol and its
//! rules are in `slots.rs`; the invariants, 17 and 18, in `state.rs`).

use std::time::Instant;

use super::ids::Seq;
use super::intake::Entry;
use super::queue::Stamp;
use super::record::{Effects, Gating, Outcome, Record};
use super::slots::{DONE_BATCH, DirectRun, Slot};
use super::state::State;
use super::store::MemoryStore;
use crate::model::cancel::CancelToken;
use crate::model::id::TaskId;
use crate::model::state::TaskState;
use crate::observe::event::Event;
use crate::observe::metrics::RunEnd;
use crate::store::{Claim, RunOutcome};
use crate::sync::Ordering;
use crate::unwind;

/// The most entries a worker pops from the intake at once.
const MAX_BATCH: usize = 8;

impl State {
    /// The direct hint (see `slots.rs`, rule 4): 0 if no direct task may start without the
    /// pool's lock (the pool stops, or the ready queue holds a task); else the stamp before
    /// which no delayed task falls due (`u64::MAX`: none).
    pub(crate) fn direct_hint(&self) -> u64 {
        if self.stopping || !self.ready.is_empty() {
            return 0;
        }
        self.delayed.peek_stamp().unwrap_or(u64::MAX)
    }

    /// Whether a parked direct entry of type `type_index` may start now, under the lock (rule 4
    /// of `slots.rs`): the pool does not stop and no gate (a pause, a queue limit) holds its
    /// type.
    pub(crate) fn may_start_direct(&self, type_index: u32) -> bool {
        !self.stopping && !self.gates.is_gated(type_index)
    }

    /// Whether a parked direct entry must be taken in and picked among the ready tasks rather
    /// than compared with the best of them: with aging, a ready task's rank depends on how long
    /// it waited, which [`ready_first`](Self::ready_first) does not weigh.
    pub(crate) fn ranks_by_age(&self) -> bool {
        self.aging.is_some() && !self.ready.is_empty()
    }

    /// Whether the ready queue holds a task to run before a parked direct entry (priority 0)
    /// submitted at `submitted`: one of a higher priority, or of priority 0 ready no later.
    pub(crate) fn ready_first(&mut self, submitted: Stamp) -> bool {
        let records = &self.records;
        let front = self.ready.front(|seq| {
            records
                .get(&seq)
                .is_some_and(|r| r.state == TaskState::Ready)
        });
        match front {
            None => false,
            Some((priority, seq)) => priority > 0 || records[&seq].since <= submitted,
        }
    }

    /// Gives running direct task `run` its record (invariant 17): a lookup sees it, or it ended
    /// otherwise than as a record-less success. Its worker ends it through the state.
    pub(crate) fn adopt(&mut self, run: &DirectRun) {
        self.totals.submitted += 1;
        let dropped = !self.early_drops.is_empty() && self.early_drops.remove(&run.seq).is_some();
        let record = Record {
            state: TaskState::Running,
            type_index: run.type_index,
            priority: 0,
            gating: Gating::Free,
            attempts: 1,
            pending_dependencies: 0,
            since: run.started,
            payload: None,
            outcome: Outcome::Unread,
            unread_handle: !dropped,
            extra: None,
        };
        self.records.insert(run.seq, record);
        self.counts.enter(TaskState::Running);
        self.tokens.insert(run.seq, run.token.clone());
    }

    /// Takes in a slot's record-less successes (invariant 18), finished at `now` as far as
    /// retention is concerned.
    pub(crate) fn record_done(
        &mut self,
        done: &mut Vec<(Seq, u32)>,
        now: Instant,
        effects: &mut Effects,
    ) {
        if done.is_empty() {
            return;
        }
        let stamp = self.stamp(now);
        for (seq, type_index) in done.drain(..) {
            self.totals.submitted += 1;
            self.totals.succeeded += 1;
            if !self.early_drops.is_empty() {
                self.early_drops.remove(&seq);
            }
            self.done.insert(seq, type_index);
            self.finished.push_back((seq, stamp));
            self.minutes.count(stamp, TaskState::Succeeded);
        }
        self.enforce_retention(now, effects);
    }
}

impl MemoryStore {
    /// Publishes the direct hint for the state as it is now (call with the lock held, after a
    /// change of what the hint reads).
    pub(super) fn publish_hint(&self, state: &State) {
        self.direct_hint
            .store(state.direct_hint(), Ordering::Release);
    }

    /// How many entries a worker pops at once: its share of what waits, 1 to [`MAX_BATCH`]
    /// (one while the intake is short, so that idle workers get their share of a burst).
    fn batch(&self) -> usize {
        let pending = usize::try_from(self.intake.pending()).unwrap_or(0);
        (pending / (2 * self.slots.len())).clamp(1, MAX_BATCH)
    }

    /// Takes a task without the pool's lock (rules 1 and 4 of `slots.rs`): the first parked
    /// entry of `worker`'s slot, or the first of a batch popped from the intake, if it may
    /// start now. `None`: the worker takes the lock (what it popped stays parked).
    /// `now`: the clock's reading, if the caller has a fresh one (the end of the worker's last
    /// run).
    pub(super) fn claim_direct(
        &self,
        worker: usize,
        spare: &mut Option<CancelToken>,
        now: Option<Instant>,
    ) -> Option<Claim> {
        let mut slot = self.slots.lock(worker);
        let mut popped = 0;
        if slot.parked.is_empty() {
            popped = self.intake.pop_into(&mut slot.parked, self.batch());
            if popped == 0 {
                return None;
            }
        }
        let now = now.unwrap_or_else(|| self.clock.now());
        let stamp = self.epoch.stamp(now);
        // Read after the pop (rule 4).
        let open =
            stamp < self.direct_hint.load(Ordering::Acquire) && !self.intake.holds_ineligible();
        let startable = |entry: &Entry| entry.direct && self.runs_direct_now(entry.type_index);
        if !open || !slot.parked.front().is_some_and(startable) {
            return None;
        }
        let entry = slot.parked.pop_front().expect("a parked entry");
        let claim = self.start_direct(&mut slot, entry, now, stamp, spare);
        drop(slot);
        if popped > 0 && self.intake.wants_searcher() {
            self.wake_for_intake();
        }
        Some(claim)
    }

    /// Starts parked `entry` as a direct task in `slot` (its worker's, locked), at `now`
    /// (`stamp` on the pool's epoch).
    pub(super) fn start_direct(
        &self,
        slot: &mut Slot,
        entry: Entry,
        now: Instant,
        stamp: Stamp,
        spare: &mut Option<CancelToken>,
    ) -> Claim {
        let token = spare
            .take()
            .unwrap_or_else(|| CancelToken::new(self.clock.clone()));
        debug_assert!(slot.running.is_none(), "one running task per slot");
        slot.running = Some(DirectRun {
            seq: entry.seq,
            type_index: entry.type_index,
            started: stamp,
            token: token.clone(),
            recorded: false,
        });
        Claim {
            id: TaskId::from_parts(self.pool_id, entry.seq),
            type_index: entry.type_index,
            attempt: 1,
            token,
            payload: entry.payload,
            lease: None,
            lane: 0,
            settings: None,
            claimed_at: now,
        }
    }

    /// Moves the intake, then what every slot holds, into the state (rule 3 of `slots.rs`):
    /// parked entries are taken in with the intake's, by id; running direct tasks get records;
    /// done buffers are recorded as record-less successes.
    pub(super) fn materialize(&self, state: &mut State, now: Instant, effects: &mut Effects) {
        let mut entries = Vec::new();
        // The intake first (rule 3): an entry popped after this is in its slot below.
        self.intake.drain(|entry| entries.push(entry));
        for worker in 0..self.slots.len() {
            let mut slot = self.slots.lock(worker);
            entries.extend(slot.parked.drain(..));
            if let Some(run) = slot.running.as_mut().filter(|run| !run.recorded) {
                state.adopt(run);
                run.recorded = true;
            }
            state.record_done(&mut slot.done, now, effects);
        }
        self.take_in(state, entries, now, effects);
    }

    /// Ends `claim` in `worker`'s slot if it is a direct task that succeeded with a unit output
    /// and no lookup recorded it (rule 5 of `slots.rs`): its success goes to the slot's done
    /// buffer, and the run is counted first; returns the time it read for that. Returns the
    /// claim, outcome and run back otherwise, for the state to end; the slot then still names
    /// the task (see [`settle_direct`](Self::settle_direct)).
    #[allow(clippy::result_large_err)] // `Err` is what the caller passed in, given back
    pub(super) fn end_direct<'a>(
        &self,
        worker: usize,
        claim: Claim,
        outcome: RunOutcome,
        run: RunEnd<'a>,
    ) -> Result<Instant, (Claim, RunOutcome, RunEnd<'a>)> {
        let mut slot = self.slots.lock(worker);
        let seq = claim.id.seq();
        let mine = slot
            .running
            .as_ref()
            .is_some_and(|r| r.seq == seq && !r.recorded);
        let unit = matches!(&outcome, RunOutcome::Succeeded(output) if output.is::<()>());
        if !mine || !unit {
            return Err((claim, outcome, run));
        }
        let now = self.clock.now();
        // Before the success is public: whoever sees it sees the run counted.
        run.count(now);
        let ended = slot.running.take();
        slot.done.push((seq, claim.type_index));
        let full = slot.done.len() >= DONE_BATCH;
        drop(slot);
        // The slot's clone of the token: the worker's may be reused.
        drop(ended);
        let task_type = self.registry.entry(claim.type_index).name;
        self.events.lifecycle(|| Event::Succeeded {
            id: claim.id,
            task_type,
            attempt: 1,
        });
        // User values, dropped with no lock held, inside `catch_unwind`.
        unwind::drop_quietly(outcome);
        unwind::drop_quietly(claim.payload);
        if full {
            self.transition_worker(worker, |_, _, _| ());
        }
        Ok(now)
    }

    /// Under the pool's lock, for a run `worker` ends through the state: a direct task still in
    /// its slot gets its record now if no lookup gave it one, and leaves the slot (rule 5 of
    /// `slots.rs`). The slot's done buffer goes into the state on the way.
    pub(super) fn settle_direct(
        &self,
        state: &mut State,
        worker: usize,
        seq: Seq,
        now: Instant,
        effects: &mut Effects,
    ) {
        let mut slot = self.slots.lock(worker);
        if slot.running.as_ref().is_some_and(|r| r.seq == seq) {
            let run = slot.running.take().expect("checked");
            if !run.recorded {
                state.adopt(&run);
            }
        }
        state.record_done(&mut slot.done, now, effects);
    }

    /// A transition of `worker`'s own: its slot's done buffer goes into the state first, then
    /// `f` runs, then the wake-up rules (no lookup: the other slots and the intake stay as
    /// they are).
    pub(super) fn transition_worker(
        &self,
        worker: usize,
        f: impl FnOnce(&mut State, Instant, &mut Effects),
    ) {
        let mut effects = Effects::default();
        {
            let mut state = self.lock();
            let now = self.clock.now();
            {
                let mut slot = self.slots.lock(worker);
                state.record_done(&mut slot.done, now, &mut effects);
            }
            f(&mut state, now, &mut effects);
            self.notify(&mut state, &effects);
        }
        effects.apply();
    }

    /// Takes `worker`'s parked entries under the pool's lock (rule 4 of `slots.rs`), popping a
    /// batch from the intake first if it has none: starts the first as a direct task unless
    /// the ready queue holds a better one (then it stays parked, and the caller claims from the
    /// ready queue); admits them, with every other slot's and the rest of the intake, if it
    /// may not start now or the intake holds an entry that may not run direct. Never called
    /// once the pool stops.
    pub(super) fn take_parked(
        &self,
        state: &mut State,
        worker: usize,
        now: Instant,
        spare: &mut Option<CancelToken>,
        effects: &mut Effects,
    ) -> Option<Claim> {
        let mut slot = self.slots.lock(worker);
        if slot.parked.is_empty() {
            self.intake.pop_into(&mut slot.parked, self.batch());
        }
        let (direct, type_index, submitted) = slot
            .parked
            .front()
            .map(|front| (front.direct, front.type_index, front.run_at))?;
        if self.may_start_parked(state, direct, type_index) {
            if state.promote_due(now) > 0 {
                self.ready_epoch.fetch_add(1, Ordering::Release);
            }
            if state.ready_first(submitted) {
                return None;
            }
            let entry = slot.parked.pop_front().expect("a parked entry");
            let stamp = state.stamp(now);
            return Some(self.start_direct(&mut slot, entry, now, stamp, spare));
        }
        drop(slot);
        // Every slot's parked entries, with the rest of the intake, by id: an entry another
        // worker popped first is taken in first (a gate lets the first submitted through).
        let mut parked: Vec<Entry> = Vec::new();
        for worker in 0..self.slots.len() {
            parked.extend(self.slots.lock(worker).parked.drain(..));
        }
        self.take_in(state, parked, now, effects);
        None
    }

    /// Starts `worker`'s first parked entry if it may start and nothing is ready before it:
    /// what [`take_parked`](Self::take_parked) left parked for the ready queue, once that has
    /// nothing left to start. Pops nothing and takes nothing in (what it would take in would
    /// need the wake-up rules the caller has already applied).
    pub(super) fn start_parked(
        &self,
        state: &mut State,
        worker: usize,
        now: Instant,
        spare: &mut Option<CancelToken>,
    ) -> Option<Claim> {
        let mut slot = self.slots.lock(worker);
        let front = slot.parked.front()?;
        let (direct, type_index, submitted) = (front.direct, front.type_index, front.run_at);
        if !self.may_start_parked(state, direct, type_index) || state.ready_first(submitted) {
            return None;
        }
        let entry = slot.parked.pop_front().expect("a parked entry");
        let stamp = state.stamp(now);
        Some(self.start_direct(&mut slot, entry, now, stamp, spare))
    }

    /// Whether a parked entry (eligible: `direct`, of type `type_index`) may start under the
    /// lock rather than be taken in (rule 4 of `slots.rs`), if nothing ready goes first: no
    /// ineligible entry waits in the intake, no gate holds its type now, aging does not rank
    /// the ready tasks.
    fn may_start_parked(&self, state: &State, direct: bool, type_index: u32) -> bool {
        direct
            && !self.intake.holds_ineligible()
            && state.may_start_direct(type_index)
            && !state.ranks_by_age()
    }

    /// Wakes sleepers for what waits in the intake and the ready queue (rule 1 of `mod.rs`,
    /// counting intake entries as ready tasks): a producer's announcement that found a sleeper
    /// and no searcher, or a worker that popped its share and left more.
    pub(super) fn wake_for_intake(&self) {
        let mut state = self.lock();
        let pending = usize::try_from(self.intake.pending()).unwrap_or(0);
        self.wake_searchers(&mut state, pending);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::model::clock::Clock;
    use crate::model::completion::{Completion, Finished};
    use crate::model::error::{CancelError, ResubmitError};
    use crate::model::state::CancelOutcome;
    use crate::model::task::{Dependency, TaskType};
    use crate::observe::events::Events;
    use crate::store::Store;
    use crate::store::memory::state::Retention;
    use crate::store::registry::{Entry as TypeEntry, Registry};

    const UNIT: TaskType<(), ()> = TaskType::new("unit");

    /// A one-worker store with one type, remembering `max_count` finished tasks.
    fn store(max_count: usize) -> MemoryStore {
        let mut registry = Registry::default();
        registry.insert(TypeEntry::new(UNIT, true)).unwrap();
        let retention = Retention {
            max_count,
            max_age: None,
            max_dead_letters: 10,
        };
        MemoryStore::new(registry, Clock::System, retention, 1, 7, Events::none())
    }

    /// A record-less success answers every lookup as a succeeded task of its type would, and
    /// retention forgets it like a record (invariant 18).
    #[test]
    fn a_record_less_success_answers_every_lookup() {
        let store = store(2);
        let now = Instant::now();
        let mut effects = Effects::default();
        let id = |seq| TaskId::from_parts(7, seq);
        {
            let mut state = store.lock();
            // Ids 1 to 3 handed out, by the intake as it would (4 is the dependent's below).
            state.next_seq.store(4, Ordering::SeqCst);
            state.record_done(&mut vec![(1, 0), (2, 0)], now, &mut effects);
            assert_eq!(state.totals.submitted, 2);
            assert_eq!(state.totals.succeeded, 2);
        }
        assert_eq!(store.status(id(1)), Some(TaskState::Succeeded));
        let overview = store.overview().expect("the embedded store's");
        assert_eq!(overview.states.succeeded, 2);
        assert_eq!(overview.minutes.last().map(|m| m.succeeded), Some(2));
        let info = store.info(id(2)).expect("remembered");
        assert_eq!(
            (info.task_type, info.state, info.attempts),
            ("unit", TaskState::Succeeded, 1)
        );
        assert_eq!(
            store.cancel(id(1)),
            Ok(CancelOutcome::AlreadyFinished(TaskState::Succeeded))
        );
        assert_eq!(
            store.resubmit(id(1), 0).err(),
            Some(ResubmitError::NotDeadLetter(id(1), TaskState::Succeeded))
        );
        assert_eq!(
            store.resubmit(id(4), 0).err(),
            Some(ResubmitError::UnknownTask(id(4)))
        );
        let listed: Vec<_> = store
            .tasks(&crate::observe::stats::TaskFilter::default(), None, 10)
            .into_iter()
            .map(|info| info.id)
            .collect();
        assert_eq!(listed, [id(1), id(2)]);
        let completion = store.completion_for(id(1)).expect("an outcome");
        let unit = completion.try_with(
            |finished| matches!(finished, Finished::Succeeded(Some(output)) if output.is::<()>()),
        );
        assert_eq!(unit, Some(true));
        {
            let mut state = store.lock();
            // A dependency on it is met at once, and listed as the dependent's.
            let dependency = Dependency::from(id(2));
            let dependencies = state.resolve_dependencies(&[dependency]);
            assert_eq!(dependencies, Ok(vec![2]));
            let dependent = crate::store::memory::state::NewTask {
                type_index: 0,
                payload: Box::new(()),
                priority: 0,
                run_at: now,
                dependencies: dependencies.unwrap(),
                key: None,
                settings: None,
            };
            let (child, _) = state.insert(dependent, Completion::new(), now, &mut effects);
            assert_eq!(state.status(child), Some(TaskState::Ready));
            let info = state.info(child, &store.registry).expect("just inserted");
            assert_eq!(info.dependencies, [id(2)]);
            // A third success pushes the first out: retention counts them as records.
            state.record_done(&mut vec![(3, 0)], now, &mut effects);
            assert_eq!(state.done.len(), 2);
            assert!(!state.done.contains(1));
        }
        assert_eq!(store.status(id(1)), None);
        assert_eq!(store.cancel(id(1)), Err(CancelError::UnknownTask(id(1))));
        assert_eq!(store.check_invariants(), Ok(()));
        effects.apply();
    }

    /// A running direct task a lookup finds gets a running record holding the slot's token
    /// (invariant 17), counted once.
    #[test]
    fn adopt_gives_a_running_record_with_its_token() {
        let store = store(10);
        let token = CancelToken::new(Clock::System);
        let run = DirectRun {
            seq: 5,
            type_index: 0,
            started: 0,
            token: token.clone(),
            recorded: false,
        };
        let mut state = store.lock();
        state.adopt(&run);
        assert_eq!(
            state.status(TaskId::from_parts(7, 5)),
            Some(TaskState::Running)
        );
        assert_eq!((state.counts.running, state.totals.submitted), (1, 1));
        assert!(state.tokens.contains_key(&5));
        assert!(state.records[&5].unread_handle);
    }

    /// A parked entry waits for a ready task of a higher priority, or of its own ready no
    /// later than it was submitted, and goes before a later one.
    #[test]
    fn the_ready_queue_goes_first_by_priority_then_age() {
        let store = store(10);
        let mut state = store.lock();
        assert!(!state.ready_first(10));
        state.records.insert(1, ready_record(0, 20));
        state.ready.push(0, 1);
        state.counts.enter(TaskState::Ready);
        assert!(!state.ready_first(10), "ready later than the entry");
        assert!(state.ready_first(20), "ready as early as the entry");
        state.records.insert(2, ready_record(1, 30));
        state.ready.push(1, 2);
        assert!(state.ready_first(10), "a higher priority");
        assert_eq!(state.direct_hint(), 0, "the ready queue holds tasks");
    }

    fn ready_record(priority: u8, since: Stamp) -> Record {
        Record {
            state: TaskState::Ready,
            type_index: 0,
            priority,
            gating: Gating::Free,
            attempts: 0,
            pending_dependencies: 0,
            since,
            payload: Some(Box::new(())),
            outcome: Outcome::Unread,
            unread_handle: false,
            extra: None,
        }
    }

    /// The hint: open until the earliest delayed entry, shut while the pool stops.
    #[test]
    fn the_hint_closes_for_a_due_time_and_a_stop() {
        let store = store(10);
        let mut state = store.lock();
        assert_eq!(state.direct_hint(), u64::MAX);
        state.delayed.push(500, 9);
        assert_eq!(state.direct_hint(), 500);
        state.stopping = true;
        assert_eq!(state.direct_hint(), 0);
    }
}
