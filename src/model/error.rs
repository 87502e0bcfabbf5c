//! The public error types, one per operation.

use std::fmt;

use crate::model::id::TaskId;
use crate::model::state::{CancelReason, Failure, TaskState};

/// Why [`Builder::build`](crate::Builder::build) refused to build a pool.
///
/// # Examples
///
/// ```
/// use tasq::{BuildError, Pool};
/// assert!(matches!(Pool::builder().workers(0).build(), Err(BuildError::ZeroWorkers)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A pool needs at least one worker.
    #[error("a pool needs at least one worker")]
    ZeroWorkers,
    /// Two handlers were registered for one task type name.
    #[error("a handler is already registered for task type `{0}`")]
    DuplicateType(&'static str),
    /// A task type (or the pool default, `None`) was given `max_attempts(0)`.
    #[error("max attempts must be at least 1 (task type {})", .0.unwrap_or("default"))]
    ZeroMaxAttempts(Option<&'static str>),
    /// A duration so long that adding it to the current time overflows (a retry cap, say).
    #[error("the duration for {0} is too long to add to the current time")]
    DurationOverflow(&'static str),
    /// The operating system refused to start a worker thread.
    #[error("could not spawn a worker thread")]
    Spawn(#[source] std::io::Error),
    /// The thread name prefix contains a NUL byte, which thread names cannot hold.
    #[error("the thread name {0:?} contains a NUL byte")]
    InvalidThreadName(String),
    /// A durable pool's task type was registered before [`Builder::postgres`](crate::Builder::postgres)
    /// was called, so it has no JSON form: call `postgres` first, then register.
    #[error(
        "task type `{0}` was registered without serde support: call Builder::postgres before registering"
    )]
    NotDurable(&'static str),
    /// The durable store could not start: the database is unreachable, the URL is malformed, or
    /// the schema is missing or from another version (see [`crate::postgres::migrate`]).
    #[error("the store could not start: {0}")]
    Store(String),
    /// A schedule ([`Builder::schedule`](crate::Builder::schedule)) that cannot run: a bad
    /// period, cron expression or time zone, a task type the pool does not register, a name
    /// used twice.
    #[error("schedule {schedule} {problem}")]
    InvalidSchedule {
        /// The schedule's name.
        schedule: &'static str,
        /// What is wrong with it.
        problem: String,
    },

    /// A setting that makes no sense: a zero limit or timeout, a breaker that opens after zero
    /// failures, a downstream without a breaker, an alert on a type the pool does not register.
    #[error("{setting} of {of} {problem}")]
    InvalidSetting {
        /// Which setting.
        setting: &'static str,
        /// Whose: a task type's or downstream's name, or "the pool".
        of: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// Why a submit was refused. It hands the task back: [`into_task`](SubmitError::into_task).
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, SubmitErrorKind, TaskType};
///
/// const KNOWN: TaskType<u8, ()> = TaskType::new("known");
/// const UNKNOWN: TaskType<u8, ()> = TaskType::new("unknown");
/// let pool = Pool::builder().workers(1).register(KNOWN, |_, _: &u8| Ok::<_, HandlerError>(())).build()?;
/// let err = pool.submit(UNKNOWN.task(9)).unwrap_err();
/// assert_eq!(err.kind(), &SubmitErrorKind::UnknownType("unknown"));
/// assert_eq!(err.into_task().into_payload(), 9);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(thiserror::Error)]
#[error("submit refused: {kind}")]
pub struct SubmitError<T> {
    kind: SubmitErrorKind,
    // Boxed, so that a `Result` carrying it stays small whatever the task's size (the box is
    // only made when a submit is refused).
    task: Box<T>,
}

impl<T> SubmitError<T> {
    pub(crate) fn new(kind: SubmitErrorKind, task: T) -> Self {
        SubmitError {
            kind,
            task: Box::new(task),
        }
    }

    /// Why the submit was refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, SubmitErrorKind, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// pool.shutdown(std::time::Duration::from_secs(1));
    /// let err = pool.submit(JOB.task(())).unwrap_err();
    /// assert_eq!(err.kind(), &SubmitErrorKind::ShutDown);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn kind(&self) -> &SubmitErrorKind {
        &self.kind
    }

    /// The refused task, to retry elsewhere or inspect.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<String, ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &String| Ok::<_, HandlerError>(())).build()?;
    /// pool.shutdown(std::time::Duration::ZERO);
    /// let task = pool.submit(JOB.task("keep me".into())).unwrap_err().into_task();
    /// assert_eq!(task.payload(), "keep me");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_task(self) -> T {
        *self.task
    }
}

impl<T> fmt::Debug for SubmitError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitError")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// The reason inside a [`SubmitError`].
///
/// # Examples
///
/// ```
/// use tasq::SubmitErrorKind;
/// assert_eq!(SubmitErrorKind::ShutDown.to_string(), "the pool is shut down (or shutting down)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitErrorKind {
    /// Shutdown has begun (or the pool was dropped): no new tasks are accepted.
    #[error("the pool is shut down (or shutting down)")]
    ShutDown,
    /// No handler is registered for this task type name.
    #[error("no handler is registered for task type `{0}`")]
    UnknownType(&'static str),
    /// A handler is registered under this name, but for other payload or output types.
    #[error("task type `{0}` is registered with other payload or output types")]
    TypeMismatch(&'static str),
    /// A dependency the pool does not know (never submitted, or already forgotten by retention).
    #[error("dependency {0} is unknown to this pool")]
    UnknownDependency(TaskId),
    /// The idempotency key belongs to a task of another type.
    #[error("idempotency key `{key}` belongs to {existing}, of task type `{existing_type}`")]
    KeyConflict {
        /// The key.
        key: String,
        /// The task that holds it.
        existing: TaskId,
        /// That task's type.
        existing_type: &'static str,
    },
    /// The delay or run_at is too far away: now + delay cannot be represented, or the due time
    /// is more than 584 years after the pool started (due times are kept in 64-bit nanoseconds).
    #[error("the due time is too far in the future to represent")]
    TimeOverflow,
    /// The durable store could not turn the payload into JSON (its `Serialize` failed).
    #[error("the payload does not serialize: {0}")]
    Unserializable(String),
    /// The durable store failed: no working connection within a minute (one is sought with
    /// backoff, and idle ones are checked before use), or the statement failed (it runs again
    /// first when the server reports it did nothing: a deadlock's victim, a session the server
    /// terminated). The task was not added, unless the connection broke as its transaction
    /// committed; a key makes the submit safe to try again.
    #[error("the store failed: {0}")]
    Store(String),
    /// Only a durable pool can do this (submit inside a database transaction).
    #[error("only a pool on the durable store can submit inside a transaction")]
    NotDurable,
    /// A setting of the task's own makes no sense: zero attempts, a zero timeout, or a
    /// duration too long to add to the current time.
    #[error("the task's {setting} {problem}")]
    InvalidSetting {
        /// Which setting: "max_attempts", "timeout" or "retry cap".
        setting: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// Why a cancel could not be carried out.
///
/// # Examples
///
/// ```
/// use tasq::{CancelError, HandlerError, Pool, TaskType};
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// let other = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// // An id from another pool means nothing here.
/// let foreign = other.submit(JOB.task(()))?.id();
/// assert_eq!(pool.cancel(foreign), Err(CancelError::UnknownTask(foreign)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CancelError {
    /// The pool has no record of this task (never submitted here, or forgotten by retention).
    #[error("{0} is unknown to this pool")]
    UnknownTask(TaskId),
    /// The pool behind this handle was dropped.
    #[error("the pool of {0} is gone")]
    PoolGone(TaskId),
    /// The durable store failed, as [`SubmitErrorKind::Store`] says; the task's state is
    /// unchanged unless the connection broke as the cancel committed.
    #[error("cancelling {0} failed in the store: {1}")]
    Store(TaskId, String),
    /// No live or succeeded task holds this idempotency key (see
    /// [`Pool::cancel_key`](crate::Pool::cancel_key)).
    #[error("no live or succeeded task holds the key `{0}`")]
    UnknownKey(String),
    /// As [`Store`](CancelError::Store), for a cancel by key (the first string): the key's
    /// holder, if any, is unchanged.
    #[error("cancelling the task with key `{0}` failed in the store: {1}")]
    StoreByKey(String, String),
}

/// Why a dead letter could not be resubmitted.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, ResubmitError, TaskState, TaskType};
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// let handle = pool.submit(JOB.task(()))?;
/// handle.wait();
/// assert_eq!(
///     pool.resubmit(JOB, handle.id()).err(),
///     Some(ResubmitError::NotDeadLetter(handle.id(), TaskState::Succeeded))
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResubmitError {
    /// The pool has no record of this task.
    #[error("{0} is unknown to this pool")]
    UnknownTask(TaskId),
    /// The task is not a dead letter: it is in this state.
    #[error("{0} is not a dead letter (it is {1})")]
    NotDeadLetter(TaskId, TaskState),
    /// The dead letter was already resubmitted, as the second task.
    #[error("{0} was already resubmitted as {1}")]
    AlreadyResubmitted(TaskId, TaskId),
    /// The dead letter's payload is gone: taken with
    /// [`Pool::take_dead_letter`](crate::Pool::take_dead_letter), purged with
    /// [`Pool::purge_dead_letter`](crate::Pool::purge_dead_letter), or dropped by the
    /// [`Builder::dead_letter_limit`](crate::Builder::dead_letter_limit), or it died with a
    /// worker (see [`Totals::worker_panics`](crate::Totals::worker_panics)).
    #[error("the payload of dead letter {0} is gone (taken, purged or over the dead-letter limit)")]
    Taken(TaskId),
    /// The dead letter is of another task type than the one given.
    #[error("dead letter {0} is of another task type")]
    TypeMismatch(TaskId),
    /// Another task holds the dead letter's idempotency key now (the second id).
    #[error("the idempotency key of dead letter {0} now belongs to {1}")]
    KeyTaken(TaskId, TaskId),
    /// Shutdown has begun.
    #[error("the pool is shut down (or shutting down)")]
    ShutDown,
    /// The durable store failed, as [`SubmitErrorKind::Store`] says; nothing changed unless the
    /// connection broke as the resubmit committed.
    #[error("resubmitting {0} failed in the store: {1}")]
    Store(TaskId, String),
    /// The dead letter's payload is being copied by
    /// [`Pool::dead_letter_payload`](crate::Pool::dead_letter_payload) on this very thread:
    /// its `Clone` called back into the pool to resubmit it (embedded store). Nothing changed;
    /// resubmit it once the copy returned. (Another thread's copy is waited for.)
    #[error("the payload of dead letter {0} is being copied on this thread")]
    PayloadInUse(TaskId),
}

/// Why a task has no output: it failed or was cancelled. What
/// [`Outcome::into_result`](crate::Outcome::into_result) returns as `Err`.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, TaskError, TaskType};
/// const BAD: TaskType<(), ()> = TaskType::new("bad");
/// let pool = Pool::builder().workers(1).register(BAD, |_, _: &()| Err::<(), _>(HandlerError::permanent("no"))).build()?;
/// let err = pool.submit(BAD.task(()))?.wait().into_result().unwrap_err();
/// assert!(matches!(err, TaskError::Failed(_)));
/// assert_eq!(err.to_string(), "the task failed: permanent after 1 attempt(s): no");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// The task failed; its dead letter has the details.
    #[error("the task failed: {0}")]
    Failed(#[source] Failure),
    /// The task was cancelled.
    #[error("the task was cancelled: {0}")]
    Cancelled(#[source] CancelReason),
}

/// Why a wait for the pool ([`Pool::wait_empty`](crate::Pool::wait_empty),
/// [`Pool::wait_idle_timeout`](crate::Pool::wait_idle_timeout)) returned before the pool got
/// there.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Pool, TaskType, WaitError};
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// let _later = pool.submit(JOB.task(()).delay(Duration::from_secs(3600)))?;
/// assert_eq!(pool.wait_empty(Some(Duration::from_millis(1))), Err(WaitError::TimedOut));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The timeout passed first.
    #[error("timed out waiting for the pool")]
    TimedOut,
    /// Called from one of the pool's own handlers, whose task keeps the pool busy: the wait
    /// could never end.
    #[error("a handler cannot wait for its own pool to be idle or empty")]
    FromHandler,
}

/// Why [`Pool::try_stats`](crate::Pool::try_stats) could not read the queue's figures.
///
/// # Examples
///
/// ```
/// use tasq::StatsError;
/// let error = StatsError::StoreUnavailable("connection refused".to_owned());
/// assert_eq!(error.to_string(), "the store could not be read: connection refused");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StatsError {
    /// The durable store's database could not be read (after a minute of retries).
    #[error("the store could not be read: {0}")]
    StoreUnavailable(String),
}

/// Why a schema could not be migrated or its policy read or set (feature `postgres`; see
/// [`postgres::migrate_in`](crate::postgres::migrate_in)).
///
/// # Examples
///
/// ```
/// let error = tasq::postgres::migrate_in("host=127.0.0.1 user=postgres", "Billing").unwrap_err();
/// assert!(matches!(error, tasq::SchemaError::InvalidName { .. }));
/// assert_eq!(
///     error.to_string(),
///     "the schema name \"Billing\" has a character other than a-z, 0-9 and _"
/// );
/// ```
#[cfg(feature = "postgres")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The name is not one tasq takes: 1 to 63 bytes of a-z, 0-9 and `_`, not starting with
    /// a digit or `pg_` (a name that reads the same quoted or not).
    #[error("the schema name {name:?} {problem}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The database's error: it could not be reached, the connection string is wrong, or (to
    /// read or set a policy) the schema was never migrated.
    #[error("the database failed: {0}")]
    Db(#[from] postgres::Error),
}

/// Why [`Context::succeed_in`](crate::Context::succeed_in) could not record the success
/// (feature `postgres`).
///
/// # Examples
///
/// ```
/// use tasq::SucceedInError;
/// let error = SucceedInError::Unserializable("key must be a string".to_owned());
/// assert_eq!(error.to_string(), "the output could not be serialized: key must be a string");
/// ```
#[cfg(feature = "postgres")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SucceedInError {
    /// The output's `Serialize` returned an error; nothing was written.
    #[error("the output could not be serialized: {0}")]
    Unserializable(String),
    /// The database's error; the transaction is then as it was before the call.
    #[error(transparent)]
    Database(#[from] postgres::Error),
}
