//! What a handler receives besides its payload: the task's id, the attempt number and the
//! cancellation token.

use std::time::Duration;

use crate::cancel::{CancelToken, Cancelled};
use crate::task::TaskId;

/// The context a handler runs in.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, TaskType};
///
/// const FLAKY: TaskType<(), u32> = TaskType::new("flaky");
/// let pool = Pool::builder()
///     .workers(1)
///     .retry_policy(tasq::RetryPolicy::exponential(
///         std::time::Duration::from_millis(1),
///         std::time::Duration::from_millis(1),
///     ))
///     .register(FLAKY, |ctx, _: &()| {
///         if ctx.attempt() < 3 {
///             return Err(HandlerError::retryable("not yet"));
///         }
///         Ok(ctx.attempt())
///     })
///     .build()?;
/// assert_eq!(pool.submit(FLAKY.task(()))?.wait().succeeded(), Some(3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Context {
    id: TaskId,
    attempt: u32,
    task_type: &'static str,
    token: CancelToken,
}

impl Context {
    pub(crate) fn new(
        id: TaskId,
        attempt: u32,
        task_type: &'static str,
        token: CancelToken,
    ) -> Self {
        Context {
            id,
            attempt,
            task_type,
            token,
        }
    }

    /// Gives the token back to the worker, which may reuse it for its next task.
    pub(crate) fn into_token(self) -> CancelToken {
        self.token
    }

    /// The task's id.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskId, TaskType};
    /// const WHO: TaskType<(), TaskId> = TaskType::new("who");
    /// let pool = Pool::builder().workers(1).register(WHO, |ctx, _: &()| Ok::<_, HandlerError>(ctx.id())).build()?;
    /// let handle = pool.submit(WHO.task(()))?;
    /// assert_eq!(handle.wait().succeeded(), Some(handle.id()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Which attempt this is: 1 for the first run, 2 for the first retry, and so on.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const ONCE: TaskType<(), u32> = TaskType::new("once");
    /// let pool = Pool::builder().workers(1).register(ONCE, |ctx, _: &()| Ok::<_, HandlerError>(ctx.attempt())).build()?;
    /// assert_eq!(pool.submit(ONCE.task(()))?.wait().succeeded(), Some(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The task type's name.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const NAMED: TaskType<(), String> = TaskType::new("named");
    /// let pool = Pool::builder().workers(1).register(NAMED, |ctx, _: &()| Ok::<_, HandlerError>(ctx.task_type().to_owned())).build()?;
    /// assert_eq!(pool.submit(NAMED.task(()))?.wait().succeeded().as_deref(), Some("named"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn task_type(&self) -> &'static str {
        self.task_type
    }

    /// The task's cancellation token.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), bool> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |ctx, _: &()| Ok::<_, HandlerError>(ctx.token().is_cancelled())).build()?;
    /// assert_eq!(pool.submit(JOB.task(()))?.wait().succeeded(), Some(false));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn token(&self) -> &CancelToken {
        &self.token
    }

    /// Whether the task has been cancelled (or the shutdown deadline passed); short for
    /// `ctx.token().is_cancelled()`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), bool> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |ctx, _: &()| Ok::<_, HandlerError>(ctx.is_cancelled())).build()?;
    /// assert_eq!(pool.submit(JOB.task(()))?.wait().succeeded(), Some(false));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Sleeps on the pool's clock, returning early with `Err(Cancelled)` on cancellation; short for
    /// `ctx.token().sleep(duration)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |ctx, _: &()| {
    ///     ctx.sleep(Duration::from_millis(1))?;
    ///     Ok::<_, HandlerError>(())
    /// }).build()?;
    /// assert!(pool.submit(JOB.task(()))?.wait().is_succeeded());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sleep(&self, duration: Duration) -> Result<(), Cancelled> {
        self.token.sleep(duration)
    }
}
