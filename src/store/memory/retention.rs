//! Retention: which finished records the embedded store forgets, and the outcomes it keeps for
//! handles that have not read them (invariant 15).

use std::collections::HashMap;
use std::time::Instant;

use super::ids::Seq;
use super::record::Effects;
use super::state::State;
use crate::model::completion::{Completion, Finished};
use crate::model::id::TaskId;
use crate::model::state::CancelReason;
use crate::sync::Arc;

impl State {
    /// Drops a terminal record: its key if it still holds one, and the record itself once the
    /// lock is released (its payload, output and error are user values).
    pub(super) fn forget(&mut self, seq: Seq, effects: &mut Effects) {
        let Some(mut record) = self.records.remove(&seq) else {
            // A record-less success (invariant 18): its unread handle, if one lives, finds
            // it nowhere, which means a unit success.
            self.done.remove(seq);
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
        } else if !self.done.contains(seq) {
            // Only a task still in the intake or in a worker's slot has none of these (the
            // handle's drop was pushed after its task, and taken in before it): forgotten when
            // the state takes the task in (`admit`, `adopt`, `record_done`).
            self.early_drops.insert(seq, ());
        }
    }

    /// Drops the oldest terminal records beyond the retention limits. A dead letter's record
    /// stays while it is one (invariant 9), marked expired.
    pub(super) fn enforce_retention(&mut self, now: Instant, effects: &mut Effects) {
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
        match self.records.get_mut(&seq) {
            Some(record) => Some((record.type_index, record.outcome.shared())),
            None => Some((self.done.get(seq)?, unit_success())),
        }
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
            // Kept for it; else a record-less success, remembered or forgotten (invariant 18).
            None => Some(self.orphans.remove(&seq).unwrap_or_else(unit_success)),
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
}

/// The outcome of a record-less success: a direct task's output is `()` (see `slots.rs`).
pub(crate) fn unit_success() -> Arc<Completion> {
    Completion::ended(Finished::Succeeded(Some(Box::new(()))))
}
