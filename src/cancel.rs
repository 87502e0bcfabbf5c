//! The cooperative cancellation token every handler receives.

use std::fmt;
use std::time::{Duration, Instant};

use crate::clock::{Clock, Wake};
use crate::sync::{Arc, AtomicBool, Condvar, Mutex, Ordering, Weak};

/// A cooperative cancellation token: set when the task is cancelled or the pool's shutdown
/// deadline passes.
///
/// A handler finds its token in its [`Context`](crate::Context). Long-running handlers should check
/// [`is_cancelled`](CancelToken::is_cancelled) between steps, and wait with
/// [`sleep`](CancelToken::sleep) rather than `std::thread::sleep`, so that they stop promptly. The
/// token can be cloned and moved to other threads the handler starts.
///
/// Once a running task's token has fired, the task ends
/// [`Cancelled`](crate::TaskState::Cancelled) whatever its handler returns.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Pool, TaskType};
///
/// const POLL: TaskType<u32, u32> = TaskType::new("poll");
///
/// let pool = Pool::builder()
///     .workers(1)
///     .register(POLL, |ctx, rounds: &u32| {
///         let mut done = 0;
///         for _ in 0..*rounds {
///             // Returns Err(Cancelled) as soon as the token fires.
///             ctx.token().sleep(Duration::from_millis(1))?;
///             done += 1;
///         }
///         Ok::<_, HandlerError>(done)
///     })
///     .build()?;
/// let handle = pool.submit(POLL.task(3))?;
/// assert_eq!(handle.wait().succeeded(), Some(3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct CancelToken {
    inner: Arc<TokenInner>,
}

struct TokenInner {
    /// Set once, never cleared. Read without the lock on the fast path.
    cancelled: AtomicBool,
    /// Guards sleeping: `cancel` and a manual clock's advance take it before notifying.
    lock: Mutex<bool>,
    cv: Condvar,
    clock: Clock,
}

/// Returned by [`CancelToken::sleep`] when the token fired before the sleep ended.
///
/// It converts into a [`HandlerError`](crate::HandlerError), so a handler can write
/// `ctx.token().sleep(d)?`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{CancelReason, Cancelled, HandlerError, Outcome, Pool, TaskType};
///
/// const NAP: TaskType<(), bool> = TaskType::new("nap");
/// let pool = Pool::builder()
///     .workers(1)
///     .register(NAP, |ctx, _: &()| {
///         // An hour, unless the task is cancelled first.
///         Ok::<_, HandlerError>(ctx.sleep(Duration::from_secs(3600)) == Err(Cancelled))
///     })
///     .build()?;
/// let handle = pool.submit(NAP.task(()))?;
/// while handle.status() != tasq::TaskState::Running {
///     std::thread::yield_now();
/// }
/// handle.cancel()?;
/// assert_eq!(handle.wait(), Outcome::Cancelled(CancelReason::Requested));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the task was cancelled")]
pub struct Cancelled;

impl CancelToken {
    pub(crate) fn new(clock: Clock) -> Self {
        CancelToken {
            inner: Arc::new(TokenInner {
                cancelled: AtomicBool::new(false),
                lock: Mutex::new(false),
                cv: Condvar::new(),
                clock,
            }),
        }
    }

    /// Fires the token and wakes every thread sleeping on it. Firing twice is harmless.
    pub(crate) fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::Release);
        let _guard = self.inner.lock.lock();
        self.inner.cv.notify_all();
    }

    /// Whether this is the only handle to the token and it has not fired: it can serve another
    /// task. (A manual clock may hold a weak reference; waking an unfired token is harmless.)
    pub(crate) fn reusable(&self) -> bool {
        Arc::strong_count(&self.inner) == 1 && !self.is_cancelled()
    }

    /// Whether the token has fired.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const STEP: TaskType<(), bool> = TaskType::new("step");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(STEP, |ctx, _: &()| Ok::<_, HandlerError>(ctx.token().is_cancelled()))
    ///     .build()?;
    /// assert_eq!(pool.submit(STEP.task(()))?.wait().succeeded(), Some(false));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::Acquire)
    }

    /// Sleeps for `duration` on the pool's clock, returning early with `Err(Cancelled)` if the token
    /// fires. A duration too long to represent sleeps until the token fires.
    ///
    /// With a [`ManualClock`](crate::ManualClock), the sleep ends when the clock is advanced past it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const NAP: TaskType<(), ()> = TaskType::new("nap");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(NAP, |ctx, _: &()| {
    ///         ctx.token().sleep(Duration::from_millis(2))?;
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .build()?;
    /// assert!(pool.submit(NAP.task(()))?.wait().is_succeeded());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sleep(&self, duration: Duration) -> Result<(), Cancelled> {
        self.sleep_to(self.inner.clock.now().checked_add(duration))
    }

    /// Sleeps until `deadline` on the pool's clock (the time of [`Instant::now`], or of the
    /// pool's [`ManualClock`](crate::ManualClock)), returning early with `Err(Cancelled)` if the
    /// token fires. Unlike `sleep(deadline - now)`, it cannot overshoot when the clock moves
    /// between reading it and going to sleep.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const NAP: TaskType<(), ()> = TaskType::new("nap");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(NAP, |ctx, _: &()| {
    ///         ctx.token().sleep_until(Instant::now() + Duration::from_millis(2))?;
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .build()?;
    /// assert!(pool.submit(NAP.task(()))?.wait().is_succeeded());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sleep_until(&self, deadline: Instant) -> Result<(), Cancelled> {
        self.sleep_to(Some(deadline))
    }

    /// Sleeps until `deadline` (`None`: one too far to represent, so until cancelled).
    fn sleep_to(&self, deadline: Option<Instant>) -> Result<(), Cancelled> {
        let clock = &self.inner.clock;
        let mut registered = self.inner.lock.lock();
        loop {
            if self.is_cancelled() {
                return Err(Cancelled);
            }
            if deadline.is_some_and(|d| clock.now() >= d) {
                return Ok(());
            }
            if !*registered {
                // First sleep on a manual clock: ask to be woken when it moves.
                *registered = true;
                let weak: Weak<TokenInner> = Arc::downgrade(&self.inner);
                clock.register(weak);
            }
            clock.wait_until(&self.inner.cv, &mut registered, deadline);
        }
    }

    /// Blocks until the token fires.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const BLOCK: TaskType<(), ()> = TaskType::new("block");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(BLOCK, |ctx, _: &()| {
    ///         ctx.token().wait();
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .build()?;
    /// let handle = pool.submit(BLOCK.task(()))?;
    /// handle.cancel()?;
    /// assert!(handle.wait().is_cancelled());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(&self) {
        let mut guard = self.inner.lock.lock();
        while !self.is_cancelled() {
            self.inner.cv.wait(&mut guard);
        }
    }
}

impl Wake for TokenInner {
    fn wake(&self) {
        let _guard = self.lock.lock();
        self.cv.notify_all();
    }
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
