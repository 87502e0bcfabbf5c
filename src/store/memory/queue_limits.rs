//! Queue limits in the embedded store: the pool's own (the gate is in `gate.rs`, its count is
//! invariant 12 in `state.rs`).

use std::time::Instant;

use super::gate::Gate;
use super::record::Effects;
use super::state::State;
use crate::model::queue_limit::{QueueLimit, QueueLimitError};
use crate::model::state::TaskState;

impl State {
    /// Sets or lifts queue `queue`'s limit; returns the one before. Raising or lifting it
    /// releases what it held (workers are woken for them); lowering it starts nothing new
    /// until fewer than the limit run.
    pub(crate) fn set_queue_limit(
        &mut self,
        queue: &str,
        limit: Option<u32>,
        now: Instant,
        effects: &mut Effects,
    ) -> Result<Option<u32>, QueueLimitError> {
        let index = self
            .gates
            .queue_index(queue)
            .ok_or_else(|| QueueLimitError::Unknown(queue.to_owned()))?;
        if limit.is_some() && !self.gates.is_counted(index) {
            // Keeps invariant 12: counted from the records once, then at every start and end.
            let gates = &self.gates;
            let running = self
                .records
                .values()
                .filter(|r| r.state == TaskState::Running && gates.in_queue(r.type_index, index))
                .count();
            self.gates
                .start_counting(index, u32::try_from(running).unwrap_or(u32::MAX));
            // Its types' tasks now start through the gate: on the gated path only.
            self.gated = true;
        }
        let before = self.gates.set_queue_limit(index, limit);
        effects.newly_ready += self.release(Gate::Queue(index), now);
        Ok(before)
    }

    /// The queues' limits in force, by name.
    pub(crate) fn queue_limits(&self) -> Vec<QueueLimit> {
        self.gates
            .queue_limits()
            .into_iter()
            .map(|(queue, max_running)| QueueLimit {
                queue: queue.to_owned(),
                max_running,
            })
            .collect()
    }
}
