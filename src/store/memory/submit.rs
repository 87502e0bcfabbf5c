//! A submit into the embedded store: a plain task goes into the intake without the lock
//! (`intake.rs`); one with dependencies or a key takes the lock for its checks.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use super::intake::{Announced, Entry};
use super::record::Effects;
use super::state::NewTask;
use super::store::MemoryStore;
use crate::model::completion::Completion;
use crate::model::error::SubmitErrorKind;
use crate::model::id::TaskId;
use crate::model::task::Start;
use crate::observe::event::Event;
use crate::store::registry::Settings;
use crate::store::{Store, Submission, Submitted};
use crate::sync::Arc;

impl MemoryStore {
    /// When a task that starts at `start` is due, if the pool can hold that time.
    fn run_at(&self, start: Start, now: Instant) -> Result<Instant, SubmitErrorKind> {
        let run_at = match start {
            Start::Now => Some(now),
            Start::At(at) => Some(at),
            Start::After(delay) => now.checked_add(delay),
            // As far ahead of the pool's now as it is ahead of the wall clock's.
            Start::AtSystem(_) => start
                .system_delay(SystemTime::now())
                .and_then(|ahead| now.checked_add(ahead)),
        };
        run_at
            .filter(|&at| at <= self.latest_run_at())
            .ok_or(SubmitErrorKind::TimeOverflow)
    }

    /// A task's key as the store keeps it: with a uniqueness period, its window's name on the
    /// pool's wall clock (see `Task::unique_per`).
    fn stored_key(&self, key: &str, period: Option<Duration>) -> Arc<str> {
        match period {
            None => Arc::from(key),
            Some(period) => {
                let now = self.clock().wall_now();
                Arc::from(crate::model::task::windowed_key(key, period, now))
            }
        }
    }

    /// The refusal of a task whose `key` task `existing` of another type holds.
    fn key_conflict(&self, key: &str, existing: TaskId, existing_type: u32) -> SubmitErrorKind {
        SubmitErrorKind::KeyConflict {
            key: key.to_owned(),
            existing,
            existing_type: self.registry.entry(existing_type).name,
        }
    }

    /// A task's settings if they are its own, unlike its type's: kept in its record's extra
    /// (a task with none takes its type's when it runs).
    fn own_settings(&self, task: &Submission<'_>) -> Option<Settings> {
        Some(task.settings).filter(|s| *s != self.registry().entry(task.type_index).settings())
    }

    /// See [`Store::submit`].
    pub(super) fn submit_task(&self, task: Submission<'_>) -> Result<Submitted, SubmitErrorKind> {
        if self.is_closed() {
            return Err(SubmitErrorKind::ShutDown);
        }
        let now = self.clock().now();
        let run_at = self.run_at(task.start, now)?;
        let settings = self.own_settings(&task);
        if task.dependencies.is_empty() && task.key.is_none() && settings.is_none() {
            return self.submit_plain(task, now, run_at);
        }
        let completion = Completion::new();

        // Allocated before taking the lock, to keep the critical section short.
        let key: Option<Arc<str>> = task.key.map(|key| self.stored_key(key, task.key_period));
        let mut effects = Effects::default();
        let mut state = self.lock();
        if state.closed {
            return Err(SubmitErrorKind::ShutDown);
        }
        // What is in the intake is in the pool: a dependency may be there.
        self.flush(&mut state, now, &mut effects);
        if let Some(key) = &key {
            if let Some((existing, existing_type, completion)) = state.find_key(key) {
                drop(state);
                if existing_type != task.type_index {
                    return Err(self.key_conflict(key, existing, existing_type));
                }
                return Ok(Submitted {
                    id: existing,
                    completion: Some(completion),
                    duplicate: true,
                });
            }
        }
        let dependencies = match state.resolve_dependencies(task.dependencies) {
            Ok(dependencies) => dependencies,
            Err(unknown) => return Err(SubmitErrorKind::UnknownDependency(unknown)),
        };
        let new = NewTask {
            type_index: task.type_index,
            payload: task.payload.take(),
            priority: task.priority,
            run_at,
            dependencies,
            key,
            settings,
        };
        let (id, completion) = state.insert(new, completion, now, &mut effects);
        self.notify(&mut state, &effects);
        drop(state);
        effects.apply();
        Ok(Submitted {
            id,
            completion: Some(completion),
            duplicate: false,
        })
    }

    /// A task with no dependencies and no key, through the intake: no lock unless a worker must
    /// be woken (see `intake.rs`).
    fn submit_plain(
        &self,
        task: Submission<'_>,
        now: Instant,
        run_at: Instant,
    ) -> Result<Submitted, SubmitErrorKind> {
        // Accepted or refused here, by the id (see `intake.rs`).
        let seq = self.intake.next_seq().ok_or(SubmitErrorKind::ShutDown)?;
        let id = TaskId::from_parts(self.pool_id, seq);
        // Told before the push: no worker can have claimed it (and told its start) yet.
        self.events.lifecycle(|| Event::Submitted {
            id,
            task_type: self.registry.entry(task.type_index).name,
            priority: task.priority,
        });
        let entry = Entry {
            seq,
            run_at: self.epoch.stamp(run_at),
            due: run_at <= now,
            payload: task.payload.take(),
            type_index: task.type_index,
            priority: task.priority,
            direct: run_at <= now && task.priority == 0 && self.runs_direct(task.type_index),
        };
        if self.intake.push(entry) == Announced::Wake {
            // Wakes whom the intake calls for; they take it (see `slots.rs`).
            self.wake_for_intake();
        }
        Ok(Submitted {
            id,
            completion: None,
            duplicate: false,
        })
    }

    /// See [`Store::submit_batch`]: every check first, then every insert, under one lock.
    pub(super) fn submit_tasks(
        &self,
        batch: &mut [Submission<'_>],
    ) -> Result<Vec<Submitted>, (usize, SubmitErrorKind)> {
        if self.is_closed() {
            return Err((0, SubmitErrorKind::ShutDown));
        }
        let now = self.clock().now();
        let mut run_ats = Vec::with_capacity(batch.len());
        for (index, task) in batch.iter().enumerate() {
            run_ats.push(self.run_at(task.start, now).map_err(|kind| (index, kind))?);
        }
        let keys: Vec<Option<Arc<str>>> = batch
            .iter()
            .map(|t| t.key.map(|key| self.stored_key(key, t.key_period)))
            .collect();
        let completions: Vec<_> = batch.iter().map(|_| Completion::new()).collect();
        let mut effects = Effects::default();
        let mut state = self.lock();
        if state.closed {
            return Err((0, SubmitErrorKind::ShutDown));
        }
        self.flush(&mut state, now, &mut effects);
        // Checks: nothing is added unless every task can be. The ids of the batch's own tasks
        // named in a refusal are those they would have had (plain submits may take some
        // meanwhile: the ids given out are taken as each task goes in).
        let mut batch_keys: HashMap<&str, (u32, TaskId)> = HashMap::new();
        let mut next = TaskId::from_parts(self.pool_id, self.intake.peek_seq());
        let mut dependencies = Vec::with_capacity(batch.len());
        for (index, task) in batch.iter().enumerate() {
            let refuse = |kind| Err((index, kind));
            if let Some(key) = keys[index].as_deref() {
                let holder = match state.find_key(key) {
                    Some((existing, existing_type, _)) => Some((existing_type, existing)),
                    None => batch_keys.get(key).copied(),
                };
                match holder {
                    Some((existing_type, existing)) if existing_type != task.type_index => {
                        return refuse(self.key_conflict(key, existing, existing_type));
                    }
                    Some(_) => {
                        dependencies.push(Vec::new());
                        continue;
                    }
                    None => {
                        batch_keys.insert(key, (task.type_index, next));
                    }
                }
            }
            match state.resolve_dependencies(task.dependencies) {
                Ok(resolved) => dependencies.push(resolved),
                Err(unknown) => return refuse(SubmitErrorKind::UnknownDependency(unknown)),
            }
            next = TaskId::from_parts(next.pool(), next.seq() + 1);
        }
        let mut submitted = Vec::with_capacity(batch.len());
        let mut completions = completions.into_iter();
        let mut dependencies = dependencies.into_iter();
        for ((task, key), run_at) in batch.iter_mut().zip(keys).zip(run_ats) {
            let completion = completions.next().expect("one per task");
            let dependencies = dependencies.next().expect("one per task");
            // A key held before the batch, or by an earlier task of it: that task.
            if let Some((existing, _, completion)) = key.as_deref().and_then(|k| state.find_key(k))
            {
                submitted.push(Submitted {
                    id: existing,
                    completion: Some(completion),
                    duplicate: true,
                });
                continue;
            }
            let new = NewTask {
                type_index: task.type_index,
                payload: task.payload.take(),
                priority: task.priority,
                run_at,
                dependencies,
                key,
                settings: self.own_settings(task),
            };
            let (id, completion) = state.insert(new, completion, now, &mut effects);
            submitted.push(Submitted {
                id,
                completion: Some(completion),
                duplicate: false,
            });
        }
        self.notify(&mut state, &effects);
        drop(state);
        effects.apply();
        Ok(submitted)
    }
}
