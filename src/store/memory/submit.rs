//! The typed entry points of the embedded store, shared by `Pool` and a handler's `Context`:
//! submit, handles by id, and the typed dead-letter operations.

use std::any::TypeId;
use std::sync::Arc;

use super::{Effects, NewTask, Shared};
use crate::dead_letter::Resubmitted;
use crate::error::{ResubmitError, SubmitError, SubmitErrorKind};
use crate::handle::{Completion, TaskHandle};
use crate::store::Store;
use crate::task::{Start, Task, TaskId, TaskType};

impl Shared {
    /// See [`Pool::submit`](crate::Pool::submit).
    pub(crate) fn submit<P, O>(
        self: &Arc<Self>,
        task: Task<P, O>,
    ) -> Result<TaskHandle<O>, SubmitError<Task<P, O>>>
    where
        P: Send + 'static,
        O: Send + Sync + 'static,
    {
        if self.is_closed() {
            return Err(SubmitError::new(SubmitErrorKind::ShutDown, task));
        }
        let type_index = match self.type_index(task.ty) {
            Ok(index) => index,
            Err(kind) => return Err(SubmitError::new(kind, task)),
        };
        let now = self.clock().now();
        let run_at = match task.start {
            Start::Now => Some(now),
            Start::At(at) => Some(at),
            Start::After(delay) => now.checked_add(delay),
        };
        let Some(run_at) = run_at.filter(|&at| at <= self.latest_run_at()) else {
            return Err(SubmitError::new(SubmitErrorKind::TimeOverflow, task));
        };

        // Allocated before taking the lock, to keep the critical section short.
        let completion = Completion::new();
        let mut effects = Effects::default();
        let mut state = self.lock();
        if state.closed {
            drop(state);
            return Err(SubmitError::new(SubmitErrorKind::ShutDown, task));
        }
        if let Some(key) = &task.key {
            if let Some((existing, existing_type, completion)) = state.find_key(key) {
                drop(state);
                if existing_type != type_index {
                    let kind = SubmitErrorKind::KeyConflict {
                        key: key.clone(),
                        existing,
                        existing_type: self.registry().entry(existing_type).name,
                    };
                    return Err(SubmitError::new(kind, task));
                }
                // The duplicate's payload is dropped here, outside the lock (user code).
                crate::unwind::drop_quietly(task);
                return Ok(TaskHandle::new(
                    existing,
                    completion,
                    Arc::downgrade(self),
                    true,
                ));
            }
        }
        let dependencies = match state.resolve_dependencies(&task.dependencies) {
            Ok(dependencies) => dependencies,
            Err(unknown) => {
                drop(state);
                let kind = SubmitErrorKind::UnknownDependency(unknown);
                return Err(SubmitError::new(kind, task));
            }
        };
        let Task {
            payload,
            priority,
            key,
            dependencies: given,
            ..
        } = task;
        let new = NewTask {
            type_index,
            payload: Box::new(payload),
            priority,
            run_at,
            dependencies,
            key,
        };
        let (id, completion) = state.insert(new, completion, now, &mut effects);
        self.notify(&mut state, &effects);
        drop(state);
        // The handles among the dependencies hold completions: their last reference may be here.
        drop(given);
        effects.apply();
        Ok(TaskHandle::new(id, completion, Arc::downgrade(self), false))
    }

    /// The registry index of `ty`, checking its payload and output types.
    pub(crate) fn type_index<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
    ) -> Result<u32, SubmitErrorKind> {
        let registry = self.registry();
        let index = registry
            .index_of(ty.name())
            .ok_or(SubmitErrorKind::UnknownType(ty.name()))?;
        let entry = registry.entry(index);
        if entry.payload != TypeId::of::<P>() || entry.output != TypeId::of::<O>() {
            return Err(SubmitErrorKind::TypeMismatch(ty.name()));
        }
        Ok(index)
    }

    /// See [`Pool::handle`](crate::Pool::handle).
    pub(crate) fn handle<P: 'static, O: 'static>(
        self: &Arc<Self>,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Option<TaskHandle<O>> {
        let type_index = self.type_index(ty).ok()?;
        let (index, completion) = self.lock().completion_of(id)?;
        (index == type_index).then(|| TaskHandle::new(id, completion, Arc::downgrade(self), false))
    }

    /// See [`Pool::resubmit`](crate::Pool::resubmit).
    pub(crate) fn resubmit<P: 'static, O: 'static>(
        self: &Arc<Self>,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Result<TaskHandle<O>, ResubmitError> {
        let type_index = self
            .type_index(ty)
            .map_err(|_| ResubmitError::TypeMismatch(id))?;
        let (new, completion) =
            self.transition(|state, now, effects| state.resubmit(id, type_index, now, effects))?;
        Ok(TaskHandle::new(
            new,
            completion,
            Arc::downgrade(self),
            false,
        ))
    }

    /// See [`Pool::resubmit_with_dependents`](crate::Pool::resubmit_with_dependents).
    pub(crate) fn resubmit_with_dependents<P: 'static, O: 'static>(
        self: &Arc<Self>,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Result<Resubmitted<O>, ResubmitError> {
        let type_index = self
            .type_index(ty)
            .map_err(|_| ResubmitError::TypeMismatch(id))?;
        let (new, completion, dependents) = self.transition(|state, now, effects| {
            state.resubmit_with_dependents(id, type_index, now, effects)
        })?;
        Ok(Resubmitted {
            task: TaskHandle::new(new, completion, Arc::downgrade(self), false),
            dependents,
        })
    }

    /// See [`Pool::take_dead_letter`](crate::Pool::take_dead_letter).
    pub(crate) fn take_dead_letter<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Option<P> {
        let type_index = self.type_index(ty).ok()?;
        // Moved out under the lock; downcast outside it.
        let payload =
            self.transition(|state, _, effects| state.take_dead_letter(id, type_index, effects))?;
        match payload.downcast::<P>() {
            Ok(payload) => Some(*payload),
            Err(other) => {
                crate::unwind::drop_quietly(other);
                None
            }
        }
    }
}
