//! A submit into the embedded store: the checks that need no lock, then one short critical
//! section.

use std::collections::HashMap;

use super::{Effects, MemoryStore, NewTask};
use crate::completion::Completion;
use crate::error::SubmitErrorKind;
use crate::store::{Store, Submission, Submitted};
use crate::sync::Arc;
use crate::task::{Start, TaskId};

impl MemoryStore {
    /// See [`Store::submit`].
    pub(super) fn submit_task(&self, task: Submission<'_>) -> Result<Submitted, SubmitErrorKind> {
        if self.is_closed() {
            return Err(SubmitErrorKind::ShutDown);
        }
        let now = self.clock().now();
        let run_at = match task.start {
            Start::Now => Some(now),
            Start::At(at) => Some(at),
            Start::After(delay) => now.checked_add(delay),
        };
        let Some(run_at) = run_at.filter(|&at| at <= self.latest_run_at()) else {
            return Err(SubmitErrorKind::TimeOverflow);
        };

        // Allocated before taking the lock, to keep the critical section short.
        let completion = Completion::new();
        let key: Option<Arc<str>> = task.key.map(Arc::from);
        let mut effects = Effects::default();
        let mut state = self.lock();
        if state.closed {
            return Err(SubmitErrorKind::ShutDown);
        }
        if let Some(key) = &key {
            if let Some((existing, existing_type, completion)) = state.find_key(key) {
                drop(state);
                if existing_type != task.type_index {
                    return Err(SubmitErrorKind::KeyConflict {
                        key: key.to_string(),
                        existing,
                        existing_type: self.registry.entry(existing_type).name,
                    });
                }
                return Ok(Submitted {
                    id: existing,
                    completion,
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
        };
        let (id, completion) = state.insert(new, completion, now, &mut effects);
        self.notify(&mut state, &effects);
        drop(state);
        effects.apply();
        Ok(Submitted {
            id,
            completion,
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
            let run_at = match task.start {
                Start::Now => Some(now),
                Start::At(at) => Some(at),
                Start::After(delay) => now.checked_add(delay),
            };
            match run_at.filter(|&at| at <= self.latest_run_at()) {
                Some(run_at) => run_ats.push(run_at),
                None => return Err((index, SubmitErrorKind::TimeOverflow)),
            }
        }
        let keys: Vec<Option<Arc<str>>> = batch.iter().map(|t| t.key.map(Arc::from)).collect();
        let completions: Vec<_> = batch.iter().map(|_| Completion::new()).collect();
        let mut effects = Effects::default();
        let mut state = self.lock();
        if state.closed {
            return Err((0, SubmitErrorKind::ShutDown));
        }
        // Checks: nothing is added unless every task can be.
        let mut batch_keys: HashMap<&str, (u32, TaskId)> = HashMap::new();
        let mut next = state.next_id();
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
                        return refuse(SubmitErrorKind::KeyConflict {
                            key: key.to_owned(),
                            existing,
                            existing_type: self.registry.entry(existing_type).name,
                        });
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
                    completion,
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
            };
            let (id, completion) = state.insert(new, completion, now, &mut effects);
            submitted.push(Submitted {
                id,
                completion,
                duplicate: false,
            });
        }
        self.notify(&mut state, &effects);
        drop(state);
        effects.apply();
        Ok(submitted)
    }
}
