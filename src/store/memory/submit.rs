//! A submit into the embedded store: the checks that need no lock, then one short critical
//! section.

use super::{Effects, MemoryStore, NewTask};
use crate::completion::Completion;
use crate::error::SubmitErrorKind;
use crate::store::{Store, Submission, Submitted};
use crate::sync::Arc;
use crate::task::Start;

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
}
