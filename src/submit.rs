//! The typed side of a submit, shared by [`Pool`](crate::Pool) and a handler's
//! [`Context`](crate::Context): a typed task goes into a store as a [`Submission`], and a
//! typed handle comes back.

use crate::error::{SubmitError, SubmitErrorKind};
use crate::handle::TaskHandle;
use crate::store::{Store, Submission};
use crate::sync::Arc;
use crate::task::{Task, TaskId, TaskType};
use crate::unwind;

/// See [`Pool::submit`](crate::Pool::submit).
pub(crate) fn submit<P, O>(
    store: &Arc<dyn Store>,
    task: Task<P, O>,
) -> Result<TaskHandle<O>, SubmitError<Task<P, O>>>
where
    P: Send + 'static,
    O: Send + Sync + 'static,
{
    // A closed pool refuses every task as shut down, without looking further.
    if store.is_closed() {
        return Err(SubmitError::new(SubmitErrorKind::ShutDown, task));
    }
    let type_index = match store.registry().type_index(task.ty) {
        Ok(index) => index,
        Err(kind) => return Err(SubmitError::new(kind, task)),
    };
    let Task {
        ty,
        payload,
        priority,
        start,
        dependencies,
        key,
    } = task;
    let mut payload = Some(payload);
    let submitted = store.submit(Submission {
        type_index,
        priority,
        start,
        dependencies: &dependencies,
        key: key.as_deref(),
        payload: &mut payload,
    });
    match submitted {
        Ok(submitted) => {
            // What is left of the task is dropped here, outside the store's lock: a duplicate's
            // payload, and the dependencies' handles, whose completions may hold the last
            // reference to an output (user code, each dropped on its own).
            unwind::drop_quietly(payload);
            if !dependencies.is_empty() {
                dependencies.into_iter().for_each(unwind::drop_quietly);
            }
            Ok(TaskHandle::new(
                submitted.id,
                submitted.completion,
                Arc::downgrade(store),
                submitted.duplicate,
            ))
        }
        Err(kind) => {
            let payload = payload.expect("a refused task keeps its payload");
            let task = Task {
                ty,
                payload,
                priority,
                start,
                dependencies,
                key,
            };
            Err(SubmitError::new(kind, task))
        }
    }
}

/// See [`Pool::handle`](crate::Pool::handle).
pub(crate) fn handle<P: 'static, O: 'static>(
    store: &Arc<dyn Store>,
    ty: TaskType<P, O>,
    id: TaskId,
) -> Option<TaskHandle<O>> {
    let type_index = store.registry().type_index(ty).ok()?;
    let (index, completion) = store.completion_of(id)?;
    (index == type_index).then(|| TaskHandle::new(id, completion, Arc::downgrade(store), false))
}
