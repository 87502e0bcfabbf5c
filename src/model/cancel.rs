//! The cooperative cancellation token every handler receives.

use std::fmt;
use std::time::{Duration, Instant};

use crate::model::clock::{Clock, Wake};
use crate::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering, Weak};

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
    /// 0 until the token fires, then its [`Interrupt`] (`as usize + 1`): set once by the first
    /// to fire it, never cleared. Read without the lock on the fast path.
    fired: AtomicUsize,
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

/// Why a running task's [`CancelToken`] fired: [`CancelToken::interrupt`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Interrupt, Pool, TaskType, TypeOptions};
///
/// const SLOW: TaskType<(), Option<Interrupt>> = TaskType::new("slow");
/// let pool = Pool::builder()
///     .workers(1)
///     .register_with(SLOW, TypeOptions::new().timeout(Duration::from_millis(5)), |ctx, _: &()| {
///         ctx.token().wait();
///         // Returned past the timeout: retried, then a dead letter, whatever this says.
///         Ok::<_, HandlerError>(ctx.token().interrupt())
///     })
///     .build()?;
/// assert!(pool.submit(SLOW.task(()))?.wait().is_failed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Interrupt {
    /// The task was cancelled ([`Pool::cancel`](crate::Pool::cancel), a handle's cancel, or a
    /// cancel in another process of a durable pool): it ends cancelled whatever the handler
    /// returns.
    Cancelled,
    /// The run outlived its timeout ([`TypeOptions::timeout`](crate::TypeOptions::timeout)): it
    /// counts as a retryable failure whatever the handler returns.
    TimedOut,
    /// The pool's shutdown deadline passed (or the pool was dropped). On the embedded store the
    /// task ends cancelled; on the durable store, unless the handler succeeded or ran past its
    /// timeout (then the attempt counts, as a timeout), it goes back to the queue for another
    /// process with the attempt not counted.
    Shutdown,
    /// The durable store's lease of the run was lost (the process stalled past it, or the
    /// database was away): another worker may already run the task, and nothing this run
    /// writes will count.
    LeaseLost,
}

impl Interrupt {
    const ALL: [Interrupt; 4] = [
        Interrupt::Cancelled,
        Interrupt::TimedOut,
        Interrupt::Shutdown,
        Interrupt::LeaseLost,
    ];
}

impl CancelToken {
    pub(crate) fn new(clock: Clock) -> Self {
        CancelToken {
            inner: Arc::new(TokenInner {
                fired: AtomicUsize::new(0),
                lock: Mutex::new(false),
                cv: Condvar::new(),
                clock,
            }),
        }
    }

    /// Fires the token for `why` and wakes every thread sleeping on it. Firing twice is
    /// harmless: the first reason stays.
    pub(crate) fn fire(&self, why: Interrupt) {
        let code = why as usize + 1;
        let _ = self
            .inner
            .fired
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
        let _guard = self.inner.lock.lock();
        self.inner.cv.notify_all();
    }

    /// Why the token fired, or `None` while it has not.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Interrupt, Pool, TaskType};
    ///
    /// const BLOCK: TaskType<(), ()> = TaskType::new("block");
    /// let (tell, told) = std::sync::mpsc::channel();
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(BLOCK, move |ctx, _: &()| {
    ///         ctx.token().wait();
    ///         tell.send(ctx.token().interrupt()).unwrap();
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .build()?;
    /// let handle = pool.submit(BLOCK.task(()))?;
    /// while handle.status() != tasq::TaskState::Running {
    ///     std::thread::yield_now();
    /// }
    /// pool.shutdown(std::time::Duration::ZERO);
    /// assert_eq!(told.recv()?, Some(Interrupt::Shutdown));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn interrupt(&self) -> Option<Interrupt> {
        match self.inner.fired.load(Ordering::Acquire) {
            0 => None,
            code => Interrupt::ALL.get(code - 1).copied(),
        }
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
        self.inner.fired.load(Ordering::Acquire) != 0
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
            .field("interrupt", &self.interrupt())
            .finish()
    }
}
