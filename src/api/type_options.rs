//! [`TypeOptions`]: one task type's settings, given to the builder with its handler.

use std::time::Duration;

use crate::gates::limit::RateLimit;
use crate::model::retry::RetryPolicy;

/// Options for one task type, given to [`Builder::register_with`](crate::Builder::register_with). Unset options fall back to
/// the pool's ([`Builder::max_attempts`](crate::Builder::max_attempts), [`Builder::retry_policy`](crate::Builder::retry_policy)).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{RetryPolicy, TypeOptions};
///
/// let options = TypeOptions::new()
///     .max_attempts(10)
///     .retry_policy(RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60)));
/// # let _ = options;
/// ```
#[derive(Clone, Copy, Debug, Default)]
#[must_use = "options do nothing until passed to `Builder::register_with`"]
pub struct TypeOptions {
    pub(super) max_attempts: Option<u32>,
    pub(super) retry: Option<RetryPolicy>,
    pub(super) timeout: Option<Duration>,
    pub(super) downstream: Option<&'static str>,
    pub(super) concurrency: Option<u32>,
    pub(super) rate: Option<RateLimit>,
    pub(super) queue: Option<&'static str>,
}

impl TypeOptions {
    /// Options that all fall back to the pool's.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = tasq::TypeOptions::new();
    /// # let _ = options;
    /// ```
    pub const fn new() -> Self {
        TypeOptions {
            max_attempts: None,
            retry: None,
            timeout: None,
            downstream: None,
            concurrency: None,
            rate: None,
            queue: None,
        }
    }

    /// How many times a task of this type may run (the first run included). Must be at least 1.
    ///
    /// # Examples
    ///
    /// ```
    /// let once = tasq::TypeOptions::new().max_attempts(1);
    /// # let _ = once;
    /// ```
    pub const fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// The backoff between this type's attempts.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let fast = tasq::TypeOptions::new()
    ///     .retry_policy(tasq::RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(50)));
    /// # let _ = fast;
    /// ```
    pub const fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// How long one run of this type may take. At the timeout the run's token fires
    /// ([`Context::is_cancelled`](crate::Context::is_cancelled), [`CancelToken::sleep`](crate::CancelToken::sleep)). A run
    /// that lasts its timeout or longer (on the pool's clock) counts as a retryable failure
    /// whatever the handler returns, even if it returned before the token could be fired, and
    /// once no attempt is left the task is a dead letter with
    /// [`FailureReason::TimedOut`](crate::FailureReason::TimedOut). A panic stays a panic.
    ///
    /// A thread cannot be killed: a handler that ignores its token keeps its worker until it
    /// returns. One still running [`Builder::stuck_after`](crate::Builder::stuck_after) past its timeout is reported as stuck
    /// ([`Event::Stuck`](crate::Event::Stuck), [`Stats::stuck`](crate::Stats::stuck)). Zero makes
    /// the build fail with [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting). Defaults to no timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{FailureReason, HandlerError, Outcome, Pool, TaskType, TypeOptions};
    ///
    /// const SLOW: TaskType<(), ()> = TaskType::new("slow");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register_with(SLOW, TypeOptions::new().timeout(Duration::from_millis(10)).max_attempts(1), |ctx, _: &()| {
    ///         ctx.token().wait(); // until the timeout fires the token
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .build()?;
    /// match pool.submit(SLOW.task(()))?.wait() {
    ///     Outcome::Failed(failure) => assert_eq!(failure.reason, FailureReason::TimedOut),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The downstream this type's handler calls (a service, a database), whose circuit
    /// breaker ([`Builder::breaker`](crate::Builder::breaker)) holds the type's tasks back while it is open. Several
    /// types may name one downstream. A name without a breaker makes the build fail with
    /// [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting). Defaults to none.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = tasq::TypeOptions::new().downstream("payments");
    /// # let _ = options;
    /// ```
    pub const fn downstream(mut self, name: &'static str) -> Self {
        self.downstream = Some(name);
        self
    }

    /// The queue this type belongs to: a name of 1 to 63 bytes of ASCII letters, digits, `_`,
    /// `-` and `.` (another makes the build fail with
    /// [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting)). A queue is what an
    /// operator pauses and resumes as one ([`Pool::pause`](crate::Pool::pause)). On the durable
    /// store each task keeps the queue its type had when it was submitted. Defaults to
    /// [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE).
    ///
    /// # Examples
    ///
    /// ```
    /// let options = tasq::TypeOptions::new().queue("mail");
    /// # let _ = options;
    /// ```
    pub const fn queue(mut self, name: &'static str) -> Self {
        self.queue = Some(name);
        self
    }

    /// At most `tasks` of this type run at once (in this pool; on the durable store, in every
    /// pool on the database). The others wait ready, burning no attempt. Zero makes the build
    /// fail with [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting). Defaults to no limit.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = tasq::TypeOptions::new().concurrency_limit(2);
    /// # let _ = options;
    /// ```
    pub const fn concurrency_limit(mut self, tasks: u32) -> Self {
        self.concurrency = Some(tasks);
        self
    }

    /// How fast this type's tasks may start (in this pool; on the durable store, in every pool
    /// on the database, metered as claims: see [`RateLimit`]). The others wait ready, burning
    /// no attempt. Defaults to no limit.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = tasq::TypeOptions::new().rate_limit(tasq::RateLimit::per_second(50.0));
    /// # let _ = options;
    /// ```
    pub const fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate = Some(limit);
        self
    }
}
