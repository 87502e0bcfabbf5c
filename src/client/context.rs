//! What a handler receives besides its payload: the task's id, the attempt number, the
//! cancellation token, and its pool (to submit follow-up tasks).

use std::fmt;
use std::time::{Duration, Instant};

use crate::client::handle::TaskHandle;
use crate::model::cancel::{CancelToken, Cancelled};
use crate::model::error::{CancelError, SubmitError};
use crate::model::id::TaskId;
use crate::model::pause::{PauseError, PauseTarget};
use crate::model::state::{CancelOutcome, TaskState};
use crate::model::task::{Task, TaskType};
use crate::store::Store;
use crate::sync::Arc;

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
pub struct Context<'a> {
    id: TaskId,
    attempt: u32,
    max_attempts: u32,
    task_type: &'static str,
    token: CancelToken,
    lease: Option<i64>,
    pool: &'a Arc<dyn Store>,
}

impl<'a> Context<'a> {
    pub(crate) fn new(
        id: TaskId,
        attempt: u32,
        max_attempts: u32,
        task_type: &'static str,
        token: CancelToken,
        lease: Option<i64>,
        pool: &'a Arc<dyn Store>,
    ) -> Self {
        Context {
            id,
            attempt,
            max_attempts,
            task_type,
            token,
            lease,
            pool,
        }
    }

    /// How many attempts the task has in all (its type's limit).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), (u32, bool)> = TaskType::new("job");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .max_attempts(4)
    ///     .register(JOB, |ctx, _: &()| Ok::<_, HandlerError>((ctx.max_attempts(), ctx.is_last_attempt())))
    ///     .build()?;
    /// assert_eq!(pool.submit(JOB.task(()))?.wait().succeeded(), Some((4, false)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether a retryable error from this attempt ends in the dead letters: no attempt is left.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const ONCE: TaskType<(), bool> = TaskType::new("once");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .max_attempts(1)
    ///     .register(ONCE, |ctx, _: &()| Ok::<_, HandlerError>(ctx.is_last_attempt()))
    ///     .build()?;
    /// assert_eq!(pool.submit(ONCE.task(()))?.wait().succeeded(), Some(true));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }

    /// Submits a follow-up task to this handler's pool, as [`Pool::submit`](crate::Pool::submit)
    /// does. The most common job-queue pattern: a task that discovers more work.
    ///
    /// # Errors
    ///
    /// As [`Pool::submit`](crate::Pool::submit); during shutdown,
    /// [`ShutDown`](crate::SubmitErrorKind::ShutDown).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// // Counts down: each task submits the next.
    /// const COUNTDOWN: TaskType<u32, ()> = TaskType::new("countdown");
    /// let pool = Pool::builder()
    ///     .workers(2)
    ///     .register(COUNTDOWN, |ctx, n: &u32| {
    ///         if *n > 0 {
    ///             ctx.submit(COUNTDOWN.task(n - 1)).map_err(|e| HandlerError::permanent(e.to_string()))?;
    ///         }
    ///         Ok(())
    ///     })
    ///     .build()?;
    /// pool.submit(COUNTDOWN.task(9))?;
    /// pool.wait_empty(None)?;
    /// assert_eq!(pool.stats().totals.succeeded, 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit<P, O>(&self, task: Task<P, O>) -> Result<TaskHandle<O>, SubmitError<Task<P, O>>>
    where
        P: Send + 'static,
        O: Send + Sync + 'static,
    {
        crate::client::submit::submit(self.pool, task)
    }

    /// Cancels a task of this handler's pool, as [`Pool::cancel`](crate::Pool::cancel) does.
    ///
    /// # Errors
    ///
    /// [`CancelError::UnknownTask`] if the pool does not know the id.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{CancelOutcome, HandlerError, Pool, TaskId, TaskType};
    ///
    /// const REMINDER: TaskType<(), ()> = TaskType::new("reminder");
    /// const CANCEL: TaskType<TaskId, tasq::CancelOutcome> = TaskType::new("cancel");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(REMINDER, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .register(CANCEL, |ctx, id: &TaskId| ctx.cancel(*id).map_err(HandlerError::permanent))
    ///     .build()?;
    /// let reminder = pool.submit(REMINDER.task(()).delay(Duration::from_secs(3600)))?;
    /// let outcome = pool.submit(CANCEL.task(reminder.id()))?.wait().into_result()?;
    /// assert_eq!(outcome, CancelOutcome::Cancelled);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self, id: TaskId) -> Result<CancelOutcome, CancelError> {
        self.pool.cancel(id)
    }

    /// Pauses a type or queue of this handler's pool, as [`Pool::pause`](crate::Pool::pause)
    /// does: for example, a handler that finds its downstream gone for the day. A handler of
    /// the paused type finishes; the next ones wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, PauseTarget, Pool, TaskType};
    /// const STOP: TaskType<(), bool> = TaskType::new("stop");
    /// let pool = Pool::builder()
    ///     .register(STOP, |ctx, _: &()| {
    ///         ctx.pause(PauseTarget::task_type("stop")).map_err(HandlerError::permanent)
    ///     })
    ///     .build()?;
    /// assert_eq!(pool.submit(STOP.task(()))?.wait().succeeded(), Some(true));
    /// assert_eq!(pool.paused()?.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pause(&self, target: PauseTarget) -> Result<bool, PauseError> {
        self.pool.pause(&target)
    }

    /// Resumes a type or queue of this handler's pool, as [`Pool::resume`](crate::Pool::resume)
    /// does.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, PauseTarget, Pool, TaskType};
    /// const GO: TaskType<(), bool> = TaskType::new("go");
    /// let pool = Pool::builder()
    ///     .register(GO, |ctx, _: &()| {
    ///         ctx.resume(PauseTarget::queue("mail")).map_err(HandlerError::permanent)
    ///     })
    ///     .build()?;
    /// // No type of this pool is in queue `mail`.
    /// assert_eq!(pool.submit(GO.task(()))?.wait().state(), tasq::TaskState::Failed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resume(&self, target: PauseTarget) -> Result<bool, PauseError> {
        self.pool.resume(&target)
    }

    /// A task's state in this handler's pool, if the pool still remembers it.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskState, TaskType};
    /// const SELF: TaskType<(), Option<TaskState>> = TaskType::new("self");
    /// let pool = Pool::builder().workers(1).register(SELF, |ctx, _: &()| Ok::<_, HandlerError>(ctx.status(ctx.id()))).build()?;
    /// assert_eq!(pool.submit(SELF.task(()))?.wait().succeeded(), Some(Some(TaskState::Running)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn status(&self, id: TaskId) -> Option<TaskState> {
        self.pool.status(id)
    }

    /// A handle to a task of this handler's pool, as [`Pool::handle`](crate::Pool::handle)
    /// gives. Reading a finished dependency's output is the usual use (with
    /// [`try_wait`](TaskHandle::try_wait): a dependency has finished before its dependent runs).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskId, TaskType};
    ///
    /// const FETCH: TaskType<(), u32> = TaskType::new("fetch");
    /// const SUM: TaskType<TaskId, u32> = TaskType::new("sum");
    /// let pool = Pool::builder()
    ///     .workers(2)
    ///     .register(FETCH, |_, _: &()| Ok::<_, HandlerError>(20))
    ///     .register(SUM, |ctx, fetch: &TaskId| {
    ///         let fetched = ctx.handle(FETCH, *fetch).and_then(|h| h.try_wait()).and_then(|o| o.succeeded());
    ///         Ok::<_, HandlerError>(fetched.unwrap_or(0) + 1)
    ///     })
    ///     .build()?;
    /// let fetch = pool.submit(FETCH.task(()))?;
    /// let sum = pool.submit(SUM.task(fetch.id()).after([&fetch]))?;
    /// assert_eq!(sum.wait().succeeded(), Some(21));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn handle<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Option<TaskHandle<O>> {
        crate::client::submit::handle(self.pool, ty, id)
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
    #[must_use]
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The fencing token of this run, on the durable store: the id of the lease under which
    /// this worker holds the task, from a database sequence, so a later claim of any task has a
    /// larger one. Every write the pool makes about the task checks it; a handler can fence its
    /// own writes with it too (store it beside what it writes, and refuse a write whose token is
    /// smaller than the one stored). `None` on the embedded store, where a task has no lease.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), Option<i64>> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |ctx, _: &()| Ok::<_, HandlerError>(ctx.lease_id())).build()?;
    /// assert_eq!(pool.submit(JOB.task(()))?.wait().succeeded(), Some(None));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn lease_id(&self) -> Option<i64> {
        self.lease
    }

    /// Ends this task as succeeded with `output` inside the handler's own PostgreSQL
    /// transaction (feature `postgres`), so the handler's side effect and the task's success
    /// commit together, or neither does: the answer to "the side effect was done, but the ack
    /// was lost". Fenced by this run's lease: `Ok(false)` means the lease is lost (another
    /// worker owns the task now; roll back), or the pool is not durable. After it returns
    /// `Ok(true)`, commit, then return `Ok` with the same output; if the transaction rolls back
    /// instead, the pool records whatever the handler returns, as usual.
    ///
    /// # Errors
    ///
    /// [`SucceedInError::Database`](crate::SucceedInError::Database): the database's error; the
    /// transaction is then as it was before the call.
    /// [`SucceedInError::Unserializable`](crate::SucceedInError::Unserializable): the output's
    /// `Serialize` failed, and nothing was written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const CHARGE: TaskType<i64, i64> = TaskType::new("charge");
    /// let url = "host=127.0.0.1 user=postgres dbname=test";
    /// let pool = Pool::builder()
    ///     .postgres(url)
    ///     .register(CHARGE, move |ctx, cents: &i64| {
    ///         let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(HandlerError::retryable)?;
    ///         let mut tx = client.transaction().map_err(HandlerError::retryable)?;
    ///         tx.execute("INSERT INTO charges (cents) VALUES ($1)", &[cents]).map_err(HandlerError::retryable)?;
    ///         if !ctx.succeed_in(&mut tx, cents).map_err(HandlerError::retryable)? {
    ///             return Err(HandlerError::permanent("lease lost: another worker has this task"));
    ///         }
    ///         tx.commit().map_err(HandlerError::retryable)?;
    ///         Ok(*cents)
    ///     })
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "postgres")]
    pub fn succeed_in<O: serde::Serialize>(
        &self,
        tx: &mut postgres::Transaction<'_>,
        output: &O,
    ) -> Result<bool, crate::SucceedInError> {
        let Some(lease) = self.lease else {
            return Ok(false);
        };
        // The output's `Serialize` is user code, run on the handler's own thread.
        let output = serde_json::to_value(output)
            .map_err(|e| crate::SucceedInError::Unserializable(e.to_string()))?;
        Ok(self.pool.succeed_in(tx, self.id, lease, output)?)
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
    #[must_use]
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
    #[must_use]
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
    #[must_use]
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
    #[must_use]
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

    /// Sleeps until `deadline` on the pool's clock, returning early with `Err(Cancelled)` on
    /// cancellation; short for `ctx.token().sleep_until(deadline)` (see
    /// [`CancelToken::sleep_until`](crate::CancelToken::sleep_until)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |ctx, _: &()| {
    ///     ctx.sleep_until(Instant::now() + Duration::from_millis(1))?;
    ///     Ok::<_, HandlerError>(())
    /// }).build()?;
    /// assert!(pool.submit(JOB.task(()))?.wait().is_succeeded());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sleep_until(&self, deadline: Instant) -> Result<(), Cancelled> {
        self.token.sleep_until(deadline)
    }
}

impl fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .field("max_attempts", &self.max_attempts)
            .field("task_type", &self.task_type)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}
