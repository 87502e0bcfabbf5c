//! Dead letters: failed tasks kept for inspection and resubmission.

use std::time::Instant;

use crate::model::id::TaskId;
use crate::model::state::Failure;

/// A task that failed: a permanent error, a panic, or its attempts exhausted.
///
/// The pool keeps the payload of a dead letter, so
/// [`Pool::resubmit`](crate::Pool::resubmit) can run it again. A dead letter stays, whatever the
/// [`Builder::retention`](crate::Builder::retention) of finished tasks, until it is taken,
/// resubmitted or purged, up to [`Builder::dead_letter_limit`](crate::Builder::dead_letter_limit).
///
/// # Examples
///
/// ```
/// use tasq::{FailureReason, HandlerError, Pool, TaskType};
///
/// const BAD: TaskType<(), ()> = TaskType::new("bad");
/// let pool = Pool::builder().workers(1).register(BAD, |_, _: &()| -> Result<(), HandlerError> {
///     panic!("bug")
/// }).build()?;
/// let handle = pool.submit(BAD.task(()))?;
/// handle.wait();
/// let dead = pool.dead_letters();
/// assert_eq!(dead.len(), 1);
/// assert_eq!(dead[0].id, handle.id());
/// assert_eq!(dead[0].failure.reason, FailureReason::Panicked);
/// assert_eq!(dead[0].failure.error, "bug");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The failed task's id.
    pub id: TaskId,
    /// Its type's name.
    pub task_type: &'static str,
    /// Its priority.
    pub priority: u8,
    /// Why it failed, after how many attempts, and the last error.
    pub failure: Failure,
    /// When it failed, on the pool's clock.
    pub failed_at: Instant,
}
