//! The running side of the state machine: a claim (the pick through the gates), a run's end
//! (success, retry, dead letter), the finish that releases dependents and keys, cancels, and the stop.

use std::time::Instant;

use super::gate::{Gate, Wakes, ready_since};
use super::ids::Seq;
use super::record::{Effects, Gating};
use super::state::{End, State};
use crate::gates::breaker::Verdict;
use crate::model::cancel::{CancelToken, Interrupt};
use crate::model::clock::Clock;
use crate::model::completion::Finished;
use crate::model::error::CancelError;
use crate::model::id::TaskId;
use crate::model::state::{CancelOutcome, CancelReason, Failure, FailureReason, TaskState};
use crate::observe::event::Event;
use crate::store::{Claim, RunOutcome};

impl State {
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
            lane: 0,
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

    /// Releases tasks held at `gate` back to `ready` (see [`Gates::release`](super::gate::Gates::release)), unless the pool
    /// stops; returns how many.
    pub(super) fn release(&mut self, gate: Gate, now: Instant) -> usize {
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
                    let (names, attempt) = (&self.names, record.attempts);
                    let task_type = names.get(record.type_index as usize).copied();
                    self.events.lifecycle(|| Event::Retrying {
                        id: claim.id,
                        task_type: task_type.unwrap_or("?"),
                        attempt,
                        delay,
                        error: error.clone(),
                    });
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
    pub(super) fn finish(&mut self, seq: Seq, end: End, now: Instant, effects: &mut Effects) {
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
                    let task_type = self.names.get(record.type_index as usize).copied();
                    self.events.lifecycle(|| Event::Succeeded {
                        id: TaskId::from_parts(self.pool, seq),
                        task_type: task_type.unwrap_or("?"),
                        attempt: record.attempts,
                    });
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
                    let task_type = self.names.get(record.type_index as usize).copied();
                    self.events.lifecycle(|| Event::Cancelled {
                        id: TaskId::from_parts(self.pool, seq),
                        task_type: task_type.unwrap_or("?"),
                        reason,
                    });
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
            self.minutes.count(stamp, state);
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
    pub(super) fn release_key(&mut self, key: Option<&str>, seq: Seq) {
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
        let Some(record) = self.records.get_mut(&seq) else {
            return match self.done.contains(seq) {
                true => Ok(CancelOutcome::AlreadyFinished(TaskState::Succeeded)),
                false => Err(CancelError::UnknownTask(id)),
            };
        };
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
}
