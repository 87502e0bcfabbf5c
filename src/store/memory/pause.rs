//! Pausing and resuming task types and queues in the embedded store: the pauses in force, and
//! each type's pause gate kept in step with them (invariant 16 in `state.rs`; the gate itself
//! is in `gate.rs`).

use std::time::{Instant, SystemTime};

use super::gate::Gate;
use super::record::Effects;
use super::state::State;
use crate::model::pause::{PauseError, PauseTarget, Paused};

impl State {
    /// The types `target` covers; `Unknown` if this pool has no such type or queue.
    fn covered(&self, target: &PauseTarget) -> Result<Vec<u32>, PauseError> {
        target.check()?;
        let covered: Vec<u32> = (0..self.names.len() as u32)
            .filter(|&t| match target {
                PauseTarget::Type(name) => self.names[t as usize] == name,
                PauseTarget::Queue(name) => self.queues[t as usize] == name,
                // Kept by the schedules (`schedules.rs`), never here.
                PauseTarget::Schedule(_) => false,
            })
            .collect();
        if covered.is_empty() {
            return Err(PauseError::Unknown(target.clone()));
        }
        Ok(covered)
    }

    /// Whether a pause covers type `t`: its own, or its queue's.
    fn is_paused(&self, t: u32) -> bool {
        self.pauses
            .contains_key(&PauseTarget::Type(self.names[t as usize].to_owned()))
            || self
                .pauses
                .contains_key(&PauseTarget::Queue(self.queues[t as usize].to_owned()))
    }

    /// Pauses `target`: from now on no task it covers starts (see `gate.rs`). `Ok(false)` if
    /// it was paused already.
    pub(crate) fn pause(&mut self, target: &PauseTarget) -> Result<bool, PauseError> {
        let covered = self.covered(target)?;
        if self.pauses.contains_key(target) {
            return Ok(false);
        }
        self.pauses.insert(target.clone(), SystemTime::now());
        for t in covered {
            // Keeps invariant 16: the gate closes with the pause.
            self.gates.set_paused(t, true);
        }
        // The paused types' tasks are held as workers pop them: on the gated path only.
        self.gated = true;
        Ok(true)
    }

    /// Resumes `target`: the types it covered that no other pause covers release what their
    /// pause gates held, and workers are woken for them. `Ok(false)` if it was not paused.
    pub(crate) fn resume(
        &mut self,
        target: &PauseTarget,
        now: Instant,
        effects: &mut Effects,
    ) -> Result<bool, PauseError> {
        let covered = self.covered(target)?;
        if self.pauses.remove(target).is_none() {
            return Ok(false);
        }
        for t in covered {
            // Keeps invariant 16: a gate opens with the last pause covering it, and gives
            // back all it held.
            if !self.is_paused(t) && self.gates.set_paused(t, false) {
                effects.newly_ready += self.release(Gate::Paused(t), now);
            }
        }
        Ok(true)
    }

    /// The pauses in force, in the order types first, then queues, each by name.
    pub(crate) fn paused(&self) -> Vec<Paused> {
        self.pauses
            .iter()
            .map(|(target, &since)| Paused {
                target: target.clone(),
                since,
            })
            .collect()
    }

    /// Checks invariant 16's half that the gates cannot see: each gate is closed exactly when
    /// a pause covers its type.
    pub(crate) fn check_pauses(&self) -> Result<(), String> {
        for t in 0..self.names.len() as u32 {
            if self.gates.is_paused(t) != self.is_paused(t) {
                return Err(format!(
                    "invariant 16: type {}'s pause gate says paused = {}, the pauses {}",
                    self.names[t as usize],
                    self.gates.is_paused(t),
                    self.is_paused(t)
                ));
            }
        }
        Ok(())
    }
}
