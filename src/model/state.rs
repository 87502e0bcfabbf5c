//! The states of a task's life, and how it ends when it does not succeed.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::model::id::TaskId;

/// Where a task is in its life.
///
/// ```text
/// submit ─┬─> Blocked ──(every dependency succeeded)──┬─> Scheduled ──(run_at reached)──┐
///         ├─> Scheduled                                └─> Ready <──────────────────────┘
///         └─> Ready ──> Running ─┬─> Succeeded
///                                ├─> Scheduled (a retry, after its backoff)
///                                ├─> Failed (a dead letter)
///                                └─> Cancelled
/// Blocked, Scheduled and Ready also go straight to Cancelled (a cancel, a failed or cancelled
/// dependency, the shutdown deadline).
/// ```
///
/// # Examples
///
/// ```
/// use tasq::TaskState;
/// assert!(TaskState::Failed.is_terminal());
/// assert!(!TaskState::Scheduled.is_terminal());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskState {
    /// Waiting for dependencies to succeed.
    Blocked,
    /// Waiting for its `run_at` (a delayed task, or a retry in its backoff).
    Scheduled,
    /// Waiting for a worker.
    Ready,
    /// A handler is running it.
    Running,
    /// Its handler returned `Ok`. Terminal.
    Succeeded,
    /// Dead-lettered: a permanent error, a panic, or attempts exhausted. Terminal.
    Failed,
    /// Cancelled before it could finish. Terminal.
    Cancelled,
}

impl TaskState {
    /// Whether the state is final: succeeded, failed or cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(tasq::TaskState::Cancelled.is_terminal());
    /// ```
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaskState::Blocked => "blocked",
            TaskState::Scheduled => "scheduled",
            TaskState::Ready => "ready",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        })
    }
}

/// Why a task was dead-lettered.
///
/// # Examples
///
/// ```
/// assert_eq!(tasq::FailureReason::Panicked.to_string(), "panicked");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureReason {
    /// The handler returned a [`HandlerError::permanent`](crate::HandlerError::permanent).
    Permanent,
    /// The handler panicked; the panic's message is the error.
    Panicked,
    /// Every allowed attempt failed with a retryable error.
    Exhausted,
    /// The durable store could not turn the stored payload back into the task type's payload
    /// (it no longer deserializes), or the handler's output into JSON. Never retried.
    BadPayload,
    /// The durable store: the last attempt's lease expired before its worker finished it (the
    /// worker's process died or stalled), so no attempt is left to run it again.
    LeaseExpired,
    /// The last allowed attempt ran past its type's timeout
    /// ([`TypeOptions::timeout`](crate::TypeOptions::timeout)); earlier attempts may have
    /// failed for other reasons.
    TimedOut,
}

impl FailureReason {
    /// Every reason, in a fixed order (the metrics list them so).
    pub(crate) const ALL: [FailureReason; 6] = [
        FailureReason::Permanent,
        FailureReason::Panicked,
        FailureReason::Exhausted,
        FailureReason::BadPayload,
        FailureReason::LeaseExpired,
        FailureReason::TimedOut,
    ];

    /// This reason's place in [`ALL`](FailureReason::ALL).
    pub(crate) fn index(self) -> usize {
        match self {
            FailureReason::Permanent => 0,
            FailureReason::Panicked => 1,
            FailureReason::Exhausted => 2,
            FailureReason::BadPayload => 3,
            FailureReason::LeaseExpired => 4,
            FailureReason::TimedOut => 5,
        }
    }

    /// A name for labels and columns: lower case, no spaces.
    pub(crate) fn label(self) -> &'static str {
        match self {
            FailureReason::Permanent => "permanent",
            FailureReason::Panicked => "panicked",
            FailureReason::Exhausted => "exhausted",
            FailureReason::BadPayload => "bad_payload",
            FailureReason::LeaseExpired => "lease_expired",
            FailureReason::TimedOut => "timed_out",
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureReason::Permanent => "permanent",
            FailureReason::Panicked => "panicked",
            FailureReason::Exhausted => "exhausted",
            FailureReason::BadPayload => "bad payload",
            FailureReason::LeaseExpired => "lease expired",
            FailureReason::TimedOut => "timed out",
        })
    }
}

/// What [`Pool::cancel`](crate::Pool::cancel) did.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{CancelOutcome, HandlerError, Pool, TaskType};
///
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// let handle = pool.submit(JOB.task(()).delay(Duration::from_secs(60)))?;
/// assert_eq!(pool.cancel(handle.id())?, CancelOutcome::Cancelled);
/// assert!(matches!(pool.cancel(handle.id())?, CancelOutcome::AlreadyFinished(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// The task had not started: it is now cancelled and will never run.
    Cancelled,
    /// The task is running: its token has fired, and it will end cancelled when its handler
    /// returns, whatever the handler returns.
    Signalled,
    /// The task had already finished, in this state.
    AlreadyFinished(TaskState),
}

/// Why a task was cancelled.
///
/// # Examples
///
/// ```
/// assert_eq!(tasq::CancelReason::Requested.to_string(), "cancel requested");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CancelReason {
    /// [`Pool::cancel`](crate::Pool::cancel) or [`TaskHandle::cancel`](crate::TaskHandle::cancel).
    Requested,
    /// The shutdown deadline passed, or the pool was dropped, before the task finished.
    Shutdown,
    /// This dependency failed.
    DependencyFailed(TaskId),
    /// This dependency was cancelled.
    DependencyCancelled(TaskId),
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CancelReason::Requested => f.write_str("cancel requested"),
            CancelReason::Shutdown => f.write_str("pool shut down"),
            CancelReason::DependencyFailed(id) => write!(f, "dependency {id} failed"),
            CancelReason::DependencyCancelled(id) => write!(f, "dependency {id} was cancelled"),
        }
    }
}

/// How a task failed: why, after how many attempts, and the last error's message.
///
/// # Examples
///
/// ```
/// use tasq::{FailureReason, HandlerError, Outcome, Pool, TaskType};
///
/// const CHECK: TaskType<u32, ()> = TaskType::new("check");
/// let pool = Pool::builder()
///     .workers(1)
///     .register(CHECK, |_, _: &u32| Err::<(), _>(HandlerError::permanent("bad input")))
///     .build()?;
/// match pool.submit(CHECK.task(1))?.wait() {
///     Outcome::Failed(failure) => {
///         assert_eq!(failure.reason, FailureReason::Permanent);
///         assert_eq!(failure.attempts, 1);
///         assert_eq!(failure.error, "bad input");
///     }
///     other => panic!("unexpected {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct Failure {
    /// Why the task failed.
    pub reason: FailureReason,
    /// How many attempts ran.
    pub attempts: u32,
    /// The last error's message (the panic message for a panic).
    pub error: String,
    /// The handler's error itself, for [`Error::source`] and downcasting.
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl Failure {
    pub(crate) fn new(
        reason: FailureReason,
        attempts: u32,
        error: String,
        source: Option<Arc<dyn Error + Send + Sync>>,
    ) -> Self {
        Failure {
            reason,
            attempts,
            error,
            source,
        }
    }

    /// The error the handler returned (`None` for a panic), to downcast to its own type.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::ParseIntError;
    /// use tasq::{HandlerError, Outcome, Pool, TaskType};
    ///
    /// const PARSE: TaskType<String, u32> = TaskType::new("parse");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(PARSE, |_, s: &String| s.parse::<u32>().map_err(HandlerError::permanent))
    ///     .build()?;
    /// let Outcome::Failed(failure) = pool.submit(PARSE.task("x".into()))?.wait() else { panic!() };
    /// assert!(failure.handler_error().unwrap().downcast_ref::<ParseIntError>().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn handler_error(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} after {} attempt(s): {}",
            self.reason, self.attempts, self.error
        )
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failure")
            .field("reason", &self.reason)
            .field("attempts", &self.attempts)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// Two failures are equal when their reasons, attempts and messages are: the handler's error is
/// not compared.
impl PartialEq for Failure {
    fn eq(&self, other: &Self) -> bool {
        (self.reason, self.attempts, &self.error) == (other.reason, other.attempts, &other.error)
    }
}

impl Eq for Failure {}

impl Error for Failure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

impl Error for CancelReason {}
