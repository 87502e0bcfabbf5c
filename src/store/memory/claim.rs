//! A worker's claim in the embedded store: a direct task without the lock if it can (see
//! `slots.rs`), else the best task under the lock, else a sleep by the wake-up protocol (see
//! `mod.rs`), spinning a little first.

use std::time::Instant;

use super::gate::Wakes;
use super::record::Effects;
use super::state::State;
use super::store::MemoryStore;
use crate::model::cancel::CancelToken;
use crate::store::Claim;
use crate::sync::{Ordering, yield_now};

/// Whether idle workers spin before they sleep (not under loom).
const SPIN: bool = cfg!(not(tasq_loom));
const MAX_SPINNERS: usize = 1;
/// Rounds of 1, 2, 4, … spin-loop hints: 127 in all.
const SPIN_ROUNDS: u32 = 7;

impl MemoryStore {
    /// See [`Store::claim`](crate::store::Store::claim): without the lock first (see
    /// `slots.rs`), then under it, then asleep by the wake-up protocol (see `mod.rs`). `now`: a
    /// fresh reading of the clock, if the caller has one.
    pub(super) fn claim_for(
        &self,
        worker: usize,
        spare: Option<CancelToken>,
        now: Option<Instant>,
    ) -> Option<Claim> {
        let mut spare = spare;
        let mut spun = false;
        let mut fresh = now;
        loop {
            // Without the lock first (see `slots.rs`); a worker woken comes back here too.
            if let Some(claim) = self.claim_direct(worker, &mut spare, fresh.take()) {
                return Some(claim);
            }
            let mut state = self.state.lock();
            if state.stopping {
                return None;
            }
            let now = self.clock.now();
            if let Some(claim) = self.take(&mut state, worker, now, &mut spare) {
                return Some(claim);
            }
            if !self.slots.lock(worker).parked.is_empty() {
                // Never asleep with an entry parked (nobody would wake this worker for it):
                // what kept it parked has changed, or will by the next look.
                continue;
            }
            if state.closed && state.outstanding() == 0 {
                return None;
            }
            let due = state.earliest_due(now);
            match due {
                Some(due) if !state.timer_sleeping => {
                    if !self.intake.try_sleep() {
                        // A submit arrived: take it first.
                        drop(state);
                        self.let_poppers_finish();
                        continue;
                    }
                    state.timer_sleeping = true;
                    self.clock.wait_until(&self.timer_cv, &mut state, Some(due));
                    self.intake.woke(state.timer_notified);
                    state.timer_sleeping = false;
                    state.timer_notified = false;
                }
                _ if SPIN && !spun => {
                    spun = true;
                    let epoch = self.ready_epoch.load(Ordering::Acquire);
                    drop(state);
                    self.spin_for_work(epoch);
                }
                _ => {
                    if !self.intake.try_sleep() {
                        drop(state);
                        self.let_poppers_finish();
                        continue;
                    }
                    state.idle += 1;
                    let standby = due.filter(|_| !state.standby);
                    state.standby |= standby.is_some();
                    self.clock.wait_until(&self.work_cv, &mut state, standby);
                    if standby.is_some() {
                        state.standby = false;
                    }
                    state.idle -= 1;
                    let notified = state.notified > 0;
                    state.notified = state.notified.saturating_sub(1);
                    self.intake.woke(notified);
                    spun = false;
                }
            }
        }
    }

    /// Before a worker that found an entry pending looks again: an entry another worker has
    /// popped and not yet counted out (`Intake::pop_into` pops, then subtracts) reads as
    /// pending while the intake is empty; the popper needs a moment, not the lock, to finish.
    /// One yield, so that a worker never spins on it (loom checks that it does not).
    fn let_poppers_finish(&self) {
        if self.intake.pending() > 0 && self.intake.is_empty() {
            yield_now();
        }
    }

    /// Spins for a microsecond or two, or until `ready_epoch` moves past `epoch`. At most one
    /// worker spins at a time: more would only take the CPU from the producers. It never yields:
    /// a spinner counts as a searcher, and a yield can cost a whole scheduler slice on a busy
    /// machine while a ready task waits for it.
    fn spin_for_work(&self, epoch: u64) {
        if self.spinners.fetch_add(1, Ordering::Acquire) >= MAX_SPINNERS {
            self.spinners.fetch_sub(1, Ordering::Release);
            return;
        }
        self.intake.start_spinning();
        for round in 0..SPIN_ROUNDS {
            if self.ready_epoch.load(Ordering::Acquire) != epoch || self.intake.pending() > 0 {
                break;
            }
            for _ in 0..(1u32 << round) {
                std::hint::spin_loop();
            }
        }
        self.intake.stop_spinning();
        self.spinners.fetch_sub(1, Ordering::Release);
    }

    /// Takes `worker`'s parked entry if it goes first (see `slots.rs`, rule 4), else promotes
    /// due tasks (and releases gates whose time has come) and takes the next ready one, waking
    /// sleepers for what is left (rule 2). Never waits.
    pub(super) fn take(
        &self,
        state: &mut State,
        worker: usize,
        now: Instant,
        spare: &mut Option<CancelToken>,
    ) -> Option<Claim> {
        let mut admitted = Effects::default();
        let parked = self.take_parked(state, worker, now, spare, &mut admitted);
        debug_assert!(admitted.holds_nothing(), "never called once stopping");
        if let Some(claim) = parked {
            if admitted.newly_ready > 0 {
                self.ready_epoch.fetch_add(1, Ordering::Release);
            }
            self.publish_hint(state);
            self.claimed(state);
            return Some(claim);
        }
        if admitted.new_earliest {
            // Rule 3: a sleeping timer re-reads the earliest due time; without one, this worker
            // becomes the timer if it finds nothing, and rule 2 below wakes one if it finds a task.
            self.wake_timer(state);
        }
        if state.promote_due(now) > 0 || admitted.newly_ready > 0 {
            self.ready_epoch.fetch_add(1, Ordering::Release);
        }
        let mut wakes = Wakes::default();
        let claim = state.claim_next(now, &self.clock, spare, &mut wakes);
        if wakes.newly_ready > 0 {
            self.ready_epoch.fetch_add(1, Ordering::Release);
        }
        if wakes.new_earliest {
            // Rule 3 for a gate held shut until a time: a sleeping timer re-reads the earliest
            // due time. Without one, this worker becomes the timer if it finds nothing, and
            // rule 2 below wakes one if it found a task.
            self.wake_timer(state);
        }
        if wakes.held && state.counts_idle() {
            // Rule 6: holding back the last ready task leaves nothing to run.
            self.done_cv.notify_all();
        }
        // Nothing ready any more (all of it held back, if anything was): a parked entry that
        // waited for the ready queue goes now, rather than sleep in the slot.
        let claim = claim.or_else(|| self.start_parked(state, worker, now, spare));
        self.publish_hint(state);
        let claim = claim?;
        self.claimed(state);
        Some(claim)
    }

    /// Rule 2, for a worker that has just taken a task: rule 1 for the tasks still ready, and a
    /// sleeper woken if due times have no timer.
    fn claimed(&self, state: &mut State) {
        self.wake_for_ready(state);
        if !state.timer_sleeping && state.has_timed() {
            self.wake_one(state);
        }
    }
}
