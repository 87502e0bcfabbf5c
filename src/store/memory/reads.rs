//! What the embedded store answers about its tasks without changing them: a task's state and
//! details, pages of tasks, and the queue's figures.

use std::time::{Duration, Instant};

use super::ids::Seq;
use super::record::{Dormant, Record};
use super::state::State;
use crate::model::id::TaskId;
use crate::model::state::TaskState;
use crate::observe::stats::{Stats, TaskInfo, TypeStats};
use crate::store::registry::Registry;
use crate::sync::Ordering;

impl State {
    pub(crate) fn status(&self, id: TaskId) -> Option<TaskState> {
        match self.record(id) {
            Some((_, record)) => Some(record.state),
            None if self.dormant(id).is_some() => Some(TaskState::Scheduled),
            None => self.done_type(id).map(|_| TaskState::Succeeded),
        }
    }

    /// The type of `id`, if it is a record-less success (invariant 18).
    pub(super) fn done_type(&self, id: TaskId) -> Option<u32> {
        self.done.get(self.local(id)?)
    }

    /// The dormant task `id`, if it is one.
    pub(super) fn dormant(&self, id: TaskId) -> Option<&Dormant> {
        self.dormant.get(&self.local(id)?)
    }

    pub(crate) fn info(&self, id: TaskId, registry: &Registry) -> Option<TaskInfo> {
        let Some((_, record)) = self.record(id) else {
            if let Some(type_index) = self.done_type(id) {
                // A direct task: plain, priority 0, its type's settings, one run, a success.
                let entry = registry.entry(type_index);
                let settings = entry.settings();
                return Some(TaskInfo {
                    id,
                    task_type: entry.name,
                    queue: entry.queue,
                    key: None,
                    state: TaskState::Succeeded,
                    priority: 0,
                    attempts: 1,
                    max_attempts: settings.max_attempts,
                    retry_policy: settings.retry,
                    timeout: settings.timeout,
                    run_at: None,
                    last_error: None,
                    resubmitted_as: None,
                    dependencies: Vec::new(),
                });
            }
            let dormant = self.dormant(id)?;
            // A dormant task is a plain one: its type's settings.
            let settings = registry.entry(dormant.type_index).settings();
            return Some(TaskInfo {
                id,
                task_type: registry.entry(dormant.type_index).name,
                queue: registry.entry(dormant.type_index).queue,
                key: None,
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
            queue: registry.entry(record.type_index).queue,
            key: record.key().map(|k| k.to_string()),
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
            None => match self.dormant.get(seq) {
                Some(dormant) => keeps(TaskState::Scheduled, dormant.type_index),
                None => self
                    .done
                    .get(*seq)
                    .is_some_and(|t| keeps(TaskState::Succeeded, t)),
            },
        };
        let from = after.saturating_add(1);
        let end = self.next_seq.load(Ordering::Acquire);
        let known = (self.records.len() + self.dormant.len() + self.done.len()) as u64;
        let seqs: Vec<Seq> = if end.saturating_sub(from) <= known.saturating_mul(2) {
            (from..end).filter(matches).take(limit).collect()
        } else {
            let mut smallest = std::collections::BinaryHeap::new();
            let candidates = (self.records.keys().chain(self.dormant.keys()).copied())
                .chain(self.done.iter_from(from).map(|(seq, _)| seq));
            for seq in candidates.filter(|&seq| seq >= from && matches(&seq)) {
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
}
