//! Retries: the backoff policy (exponential with full jitter) and the handler's error, retryable or
//! permanent.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How long a failed task waits before its next attempt: exponential backoff with full jitter.
///
/// The delay before retry `n` (the wait after attempt `n` failed) is drawn uniformly from
/// `[0, min(cap, base · 2^(n-1))]`. The bound saturates at `cap` for every `n`, so it never
/// overflows. Defaults to a base of 100 ms and a cap of 10 s.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::RetryPolicy;
///
/// let policy = RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(10));
/// assert_eq!(policy.max_delay(1), Duration::from_millis(100));
/// assert_eq!(policy.max_delay(3), Duration::from_millis(400));
/// assert_eq!(policy.max_delay(1_000), Duration::from_secs(10));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    base: Duration,
    cap: Duration,
}

impl RetryPolicy {
    /// A policy whose bound starts at `base` and doubles with every retry up to `cap`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let policy = tasq::RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60));
    /// assert_eq!(policy.cap(), Duration::from_secs(60));
    /// ```
    pub const fn exponential(base: Duration, cap: Duration) -> Self {
        RetryPolicy { base, cap }
    }

    /// The first retry's bound.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::RetryPolicy::default().base(), std::time::Duration::from_millis(100));
    /// ```
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The largest bound.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::RetryPolicy::default().cap(), std::time::Duration::from_secs(10));
    /// ```
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// The upper bound of the delay before retry `retry` (1-based): `min(cap, base · 2^(retry-1))`.
    /// Retry 0 is treated as retry 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let policy = tasq::RetryPolicy::default();
    /// assert_eq!(policy.max_delay(2), Duration::from_millis(200));
    /// assert_eq!(policy.max_delay(u32::MAX), Duration::from_secs(10));
    /// ```
    pub fn max_delay(&self, retry: u32) -> Duration {
        let exponent = retry.saturating_sub(1);
        // In nanoseconds as u128: base fits in 94 bits, so base · 2^(n-1) is exact until it
        // overflows, and an overflow is certainly above any cap.
        let bound = 1u128
            .checked_shl(exponent)
            .and_then(|factor| self.base.as_nanos().checked_mul(factor))
            .map_or(self.cap, |nanos| {
                duration_from_nanos(nanos.min(self.cap.as_nanos()))
            });
        bound.min(self.cap)
    }

    /// The delay before retry `retry` that the pool would draw from a generator seeded with
    /// `seed`: uniform in `[0, max_delay(retry)]` over seeds. For tests and for seeing the
    /// policy's spread; the pool draws its own (see [`Builder::seed`](crate::Builder::seed)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let policy = tasq::RetryPolicy::default();
    /// let delay = policy.delay(4, 7);
    /// assert!(delay <= Duration::from_millis(800));
    /// assert_eq!(delay, policy.delay(4, 7));
    /// ```
    pub fn delay(&self, retry: u32, seed: u64) -> Duration {
        self.draw(retry, &mut SmallRng::seed_from_u64(seed))
    }

    /// Draws the delay before retry `retry` from `rng`.
    pub(crate) fn draw<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        let bound = self.max_delay(retry).as_nanos();
        duration_from_nanos(rng.random_range(0..=bound))
    }
}

/// The inverse of `Duration::as_nanos`, for values that came from a `Duration`.
fn duration_from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below 10^9.
    let subsec = (nanos % NANOS_PER_SEC) as u32;
    Duration::new(secs, subsec)
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(10))
    }
}

/// The error a handler returns: retryable (the default) or permanent.
///
/// Any `std::error::Error + Send + Sync + 'static` converts into a retryable `HandlerError`, so
/// `?` works in handlers. Mark errors that retrying cannot fix (bad input, a 4xx answer) with
/// [`HandlerError::permanent`]: the task then goes straight to the dead letters.
///
/// A panic in a handler is caught and dead-lettered too, but only after it has gone through the
/// process's panic hook, like any panic: with the default hook it is printed to stderr (with a
/// backtrace under `RUST_BACKTRACE=1`). [`Builder::quiet_panics`](crate::Builder::quiet_panics)
/// keeps a pool's expected panics off it; worker threads are named after
/// [`Builder::thread_name`](crate::Builder::thread_name).
///
/// `HandlerError` deliberately does not implement `std::error::Error` itself (that would clash with
/// the blanket conversion); [`source`](HandlerError::source) gives the wrapped error.
///
/// # Examples
///
/// ```
/// use tasq::HandlerError;
///
/// fn parse(input: &str) -> Result<u32, HandlerError> {
///     // A malformed number will never parse: do not retry it.
///     input.parse::<u32>().map_err(HandlerError::permanent)
/// }
///
/// assert!(parse("x").unwrap_err().is_permanent());
/// assert!(!HandlerError::retryable("timeout").is_permanent());
/// ```
pub struct HandlerError {
    error: Box<dyn Error + Send + Sync>,
    permanent: bool,
    retry_after: Option<Duration>,
}

impl HandlerError {
    /// A failure worth retrying (a timeout, a refused connection).
    ///
    /// # Examples
    ///
    /// ```
    /// let err = tasq::HandlerError::retryable("connection refused");
    /// assert_eq!(err.to_string(), "connection refused");
    /// ```
    pub fn retryable(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        HandlerError {
            error: error.into(),
            permanent: false,
            retry_after: None,
        }
    }

    /// A failure that retrying cannot fix: the task is dead-lettered after this attempt.
    ///
    /// # Examples
    ///
    /// ```
    /// let err = tasq::HandlerError::permanent("invalid address");
    /// assert!(err.is_permanent());
    /// ```
    pub fn permanent(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        HandlerError {
            error: error.into(),
            permanent: true,
            retry_after: None,
        }
    }

    /// Whether this error skips the remaining attempts.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!tasq::HandlerError::retryable("busy").is_permanent());
    /// ```
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The wrapped error.
    ///
    /// # Examples
    ///
    /// ```
    /// let err = tasq::HandlerError::retryable("busy");
    /// assert_eq!(err.source().to_string(), "busy");
    /// ```
    pub fn source(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The wrapped error, by value.
    ///
    /// # Examples
    ///
    /// ```
    /// let err = tasq::HandlerError::retryable("busy").into_source();
    /// assert_eq!(err.to_string(), "busy");
    /// ```
    pub fn into_source(self) -> Box<dyn Error + Send + Sync> {
        self.error
    }

    /// Asks for the retry after exactly `delay` instead of the policy's backoff (say, from an
    /// HTTP `Retry-After` header). Only a retry uses it: a permanent error, or the last attempt,
    /// still ends in the dead letters.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, ManualClock, Pool, TaskState, TaskType};
    ///
    /// const CALL: TaskType<(), ()> = TaskType::new("call");
    /// let clock = ManualClock::new();
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .manual_clock(clock.clone())
    ///     .register(CALL, |ctx, _: &()| match ctx.attempt() {
    ///         1 => Err(HandlerError::retryable("429 Too Many Requests").retry_after(Duration::from_secs(30))),
    ///         _ => Ok(()),
    ///     })
    ///     .build()?;
    /// let handle = pool.submit(CALL.task(()))?;
    /// pool.wait_idle();
    /// clock.advance(Duration::from_secs(29));
    /// pool.wait_idle();
    /// assert_eq!(handle.status(), TaskState::Scheduled);
    /// clock.advance(Duration::from_secs(1));
    /// assert!(handle.wait().is_succeeded());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// The delay asked for with [`retry_after`](HandlerError::retry_after).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let err = tasq::HandlerError::retryable("busy").retry_after(Duration::from_secs(2));
    /// assert_eq!(err.requested_delay(), Some(Duration::from_secs(2)));
    /// ```
    pub fn requested_delay(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// `?` for errors that are not `std::error::Error` (an `anyhow::Error`, a `&str`, a `String`):
/// mark them retryable or permanent where they occur.
///
/// `HandlerError` converts from any `std::error::Error` by itself, as retryable. Types such as
/// `anyhow::Error` cannot have that conversion (Rust's coherence rules forbid it), but they all
/// convert into `Box<dyn Error + Send + Sync>`, which is what this trait takes.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, ResultExt};
///
/// fn check(line: &str) -> Result<u32, HandlerError> {
///     let field = line.split(';').nth(1).ok_or("no second field").permanent()?;
///     let n = field.parse::<u32>().map_err(|e| e.to_string()).permanent()?;
///     Ok(n)
/// }
/// assert_eq!(check("a;7").unwrap(), 7);
/// assert!(check("a").unwrap_err().is_permanent());
/// ```
pub trait ResultExt<T> {
    /// The error, if any, as a retryable [`HandlerError`].
    fn retryable(self) -> Result<T, HandlerError>;
    /// The error, if any, as a permanent [`HandlerError`].
    fn permanent(self) -> Result<T, HandlerError>;
}

impl<T, E: Into<Box<dyn Error + Send + Sync>>> ResultExt<T> for Result<T, E> {
    fn retryable(self) -> Result<T, HandlerError> {
        self.map_err(HandlerError::retryable)
    }

    fn permanent(self) -> Result<T, HandlerError> {
        self.map_err(HandlerError::permanent)
    }
}

impl<E: Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        HandlerError::retryable(error)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("error", &self.error)
            .field("permanent", &self.permanent)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}
