//! The seam between the worker runtime and where tasks wait.
//!
//! The runtime in `worker.rs` only claims a task, runs its handler and completes it with the
//! classified outcome; a store decides which task comes next, keeps every task's state, and
//! carries out retries, dead letters, dependencies and cancellation. The embedded store
//! (`memory`) keeps tasks in one process; a durable store plugs in behind the same trait.

use std::any::Any;
use std::time::Duration;

use crate::cancel::CancelToken;
use crate::registry::Registry;
use crate::task::{Failure, TaskId};

pub(crate) mod memory;

/// A task taken by a worker: everything the runtime needs to run it once.
pub(crate) struct Claim {
    pub(crate) id: TaskId,
    pub(crate) type_index: u32,
    /// 1 for the first run.
    pub(crate) attempt: u32,
    pub(crate) token: CancelToken,
    pub(crate) payload: Box<dyn Any + Send>,
}

/// What the runtime made of one run.
pub(crate) enum RunOutcome {
    Succeeded(Box<dyn Any + Send + Sync>),
    /// A retryable error with attempts left: run again after `delay`.
    Retry {
        delay: Duration,
        error: String,
    },
    /// A dead letter (the store fills in the attempts).
    Failed(Failure),
}

/// Where tasks wait, as the worker runtime sees it.
pub(crate) trait Store: Send + Sync {
    /// The handlers, by the type index in each claim.
    fn registry(&self) -> &Registry;

    /// Blocks until a task can run, and claims it; `None` when the worker should exit. `spare`
    /// is a token the claim may use instead of allocating one.
    fn claim(&self, spare: Option<CancelToken>) -> Option<Claim>;

    /// Records the outcome of a claimed task's run, then claims the next task as
    /// [`claim`](Store::claim) does (under one lock when a task is ready at once). `token` is the
    /// finished claim's token, which the next claim reuses if nobody else holds it.
    fn complete_and_claim(
        &self,
        claim: Claim,
        outcome: RunOutcome,
        token: CancelToken,
    ) -> Option<Claim>;
}
