//! Dead letters: failed tasks kept for inspection and resubmission.

use std::time::Instant;

use crate::handle::TaskHandle;
use crate::task::{Failure, TaskId};

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

/// What [`Pool::resubmit_with_dependents`](crate::Pool::resubmit_with_dependents) did: the dead
/// letter's new task, and the dependents its failure had cancelled, brought back.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use tasq::{HandlerError, Pool, TaskType};
///
/// static UP: AtomicBool = AtomicBool::new(false);
/// const FETCH: TaskType<(), u32> = TaskType::new("fetch");
/// const PARSE: TaskType<(), ()> = TaskType::new("parse");
/// let pool = Pool::builder()
///     .workers(1)
///     .register(FETCH, |_, _: &()| {
///         if UP.load(Ordering::SeqCst) { Ok(7) } else { Err(HandlerError::permanent("down")) }
///     })
///     .register(PARSE, |_, _: &()| Ok::<_, HandlerError>(()))
///     .build()?;
/// let fetch = pool.submit(FETCH.task(()))?;
/// let parse = pool.submit(PARSE.task(()).after([&fetch]))?;
/// assert!(parse.wait().is_cancelled());
///
/// UP.store(true, Ordering::SeqCst);
/// let again = pool.resubmit_with_dependents(FETCH, fetch.id())?;
/// assert_eq!(again.task.wait().succeeded(), Some(7));
/// assert_eq!(again.dependents.len(), 1);
/// let (old, new) = again.dependents[0];
/// assert_eq!(old, parse.id());
/// assert!(pool.handle(PARSE, new).unwrap().wait().is_succeeded());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Resubmitted<O> {
    /// The dead letter's new task.
    pub task: TaskHandle<O>,
    /// Each dependent brought back: its old id and its new one, dependencies first.
    pub dependents: Vec<(TaskId, TaskId)>,
}
