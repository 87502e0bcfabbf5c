//! Which task's handler the calling thread runs: set by the worker around each handler, read
//! by a handle or a pool that must not wait for the very task it runs inside.

use std::cell::Cell;

use crate::model::id::TaskId;

crate::sync::thread_local! {
    // Not `const`-initialised: loom's `thread_local!` does not take that form.
    #[allow(clippy::missing_const_for_thread_local)]
    /// The task whose handler this thread is running, if any.
    static CURRENT: Cell<Option<TaskId>> = Cell::new(None);
}

/// The task whose handler the calling thread is running (`None` outside handlers).
pub(crate) fn current_task() -> Option<TaskId> {
    CURRENT.with(Cell::get)
}

/// Marks the calling thread as running `id`'s handler until dropped.
pub(crate) struct Running;

impl Running {
    pub(crate) fn enter(id: TaskId) -> Running {
        CURRENT.with(|c| c.set(Some(id)));
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(None));
    }
}
