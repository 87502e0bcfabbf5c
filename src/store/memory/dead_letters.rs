//! Dead letters in the embedded store: listed, lent out for a copy, taken, purged, resubmitted
//! (with their failed dependents), and kept within their limit.

use std::any::Any;
use std::collections::HashMap;
use std::time::Instant;

use super::ids::Seq;
use super::record::Effects;
use super::state::{Lend, NewTask, State};
use crate::model::completion::Completion;
use crate::model::dead_letter::DeadLetter;
use crate::model::error::ResubmitError;
use crate::model::id::TaskId;
use crate::model::state::TaskState;
use crate::store::registry::Registry;
use crate::sync::{Arc, ThreadId};

impl State {
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
        let Some(record) = self.records.get(&seq) else {
            // A record-less success (invariant 18) is remembered as any succeeded task is.
            return Err(match self.done.contains(seq) {
                true => ResubmitError::NotDeadLetter(id, TaskState::Succeeded),
                false => ResubmitError::UnknownTask(id),
            });
        };
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
                    renamed.get(dep).copied().or_else(|| {
                        // Remembered: a record, or a record-less success.
                        (self.records.contains_key(dep) || self.done.contains(*dep)).then_some(*dep)
                    })
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
    pub(super) fn enforce_dead_letter_limit(&mut self, effects: &mut Effects) {
        while self.dead.len() > self.retention.max_dead_letters {
            let Some(oldest) = self.dead.pop_first() else {
                break;
            };
            self.drop_dead_payload(oldest, effects);
        }
    }
}
