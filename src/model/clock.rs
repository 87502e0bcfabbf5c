//! Where the engine reads the time: the system clock, or a [`ManualClock`] that tests move by hand.
//!
//! Every due time in the engine (a delayed task's `run_at`, a retry's backoff, the shutdown deadline,
//! [`CancelToken::sleep`](crate::CancelToken::sleep)) is read through [`Clock`]. With the system
//! clock, sleepers use timed waits. With a manual clock they wait without a timeout, and
//! [`ManualClock::advance`] wakes them, so a test or a loom model moves time without sleeping and no
//! progress ever depends on a timed wait firing.

use std::fmt;

use std::time::{Duration, Instant, SystemTime};

use crate::sync::{Arc, AtomicU64, Condvar, Mutex, MutexGuard, Ordering, Weak};

/// Something that sleeps on the clock and must re-check its due time when a manual clock moves.
pub(crate) trait Wake: Send + Sync {
    /// Wakes every sleeper so it re-reads the time. Takes the sleeper's own lock before notifying,
    /// so a sleeper between its check and its wait cannot miss the wake-up.
    fn wake(&self);
}

/// The clock a pool runs on.
#[derive(Clone, Debug, Default)]
pub(crate) enum Clock {
    /// `Instant::now()`, with timed waits.
    #[default]
    System,
    /// A clock that moves only when [`ManualClock::advance`] is called.
    Manual(ManualClock),
}

impl Clock {
    pub(crate) fn now(&self) -> Instant {
        match self {
            Clock::System => Instant::now(),
            Clock::Manual(clock) => clock.now(),
        }
    }

    /// `timeout` from now, `None` if it cannot be represented.
    pub(crate) fn deadline_after(&self, timeout: Duration) -> Option<Instant> {
        self.now().checked_add(timeout)
    }

    /// Waits on `cv` until notified or until this clock reaches `deadline` (`None`: no deadline).
    ///
    /// May return early (spurious wake-ups, or a manual clock that moved but not far enough):
    /// callers loop on their condition.
    pub(crate) fn wait_until<T>(
        &self,
        cv: &Condvar,
        guard: &mut MutexGuard<'_, T>,
        deadline: Option<Instant>,
    ) {
        match (self, deadline) {
            (Clock::System, Some(deadline)) => cv.wait_until(guard, deadline),
            // A manual clock's advance() notifies every registered sleeper.
            _ => cv.wait(guard),
        }
    }

    /// Registers a sleeper to be woken when a manual clock moves; nothing for the system clock.
    /// How far a manual clock has been advanced; `None` on the system clock.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn manual_offset(&self) -> Option<Duration> {
        match self {
            Clock::System => None,
            Clock::Manual(clock) => Some(clock.now().duration_since(clock.inner.start)),
        }
    }

    /// The wall-clock time now: the system's, or a manual clock's start on the wall clock plus
    /// how far it moved (see [`ManualClock::starting_at`]).
    pub(crate) fn wall_now(&self) -> SystemTime {
        match self {
            Clock::System => SystemTime::now(),
            Clock::Manual(clock) => clock.wall_now(),
        }
    }

    /// The wall-clock start a manual clock was given with [`ManualClock::starting_at`].
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn manual_wall_start(&self) -> Option<SystemTime> {
        match self {
            Clock::Manual(clock) if clock.inner.explicit => Some(clock.inner.wall_start),
            _ => None,
        }
    }

    pub(crate) fn register(&self, sleeper: Weak<dyn Wake>) {
        if let Clock::Manual(clock) = self {
            clock.register(sleeper);
        }
    }
}

/// A clock that only moves when told to: deterministic tests of delays, retries and deadlines.
///
/// Give it to [`Builder::manual_clock`](crate::Builder::manual_clock). The pool then reads all
/// due times from it, and [`advance`](ManualClock::advance) wakes every worker, handler sleep and
/// shutdown that waits on it. Clones share one time.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::ManualClock;
///
/// let clock = ManualClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now() - start, Duration::from_secs(5));
/// ```
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

struct ManualInner {
    /// The real instant this clock started at; `now()` is `start + offset`.
    start: Instant,
    offset_nanos: AtomicU64,
    /// The wall-clock time `start` stands for.
    wall_start: SystemTime,
    /// `wall_start` was given ([`ManualClock::starting_at`]), not read from the system.
    explicit: bool,
    sleepers: Mutex<Vec<Weak<dyn Wake>>>,
}

impl ManualClock {
    /// Creates a manual clock that reads the current instant until it is advanced.
    ///
    /// # Examples
    ///
    /// ```
    /// let clock = tasq::ManualClock::new();
    /// assert_eq!(clock.now(), clock.now());
    /// ```
    pub fn new() -> Self {
        ManualClock::with_start(SystemTime::now(), false)
    }

    /// Creates a manual clock whose wall-clock time starts at `at`: what periodic tasks (see
    /// [`Schedule`](crate::Schedule)) read as the time now, and, on the durable store, the
    /// database's `tasq_now()` for the pool. A test of a schedule across a daylight-saving
    /// change starts its clock just before it. ([`new`](ManualClock::new) starts at the system's
    /// time.)
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let clock = tasq::ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    /// clock.advance(Duration::from_secs(60));
    /// assert_eq!(clock.wall_now(), UNIX_EPOCH + Duration::from_secs(1_800_000_060));
    /// ```
    pub fn starting_at(at: SystemTime) -> Self {
        ManualClock::with_start(at, true)
    }

    fn with_start(wall_start: SystemTime, explicit: bool) -> Self {
        ManualClock {
            inner: Arc::new(ManualInner {
                start: Instant::now(),
                offset_nanos: AtomicU64::new(0),
                wall_start,
                explicit,
                sleepers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The clock's wall-clock time: its start on the wall clock (the system's time when it was
    /// made, or the one given to [`starting_at`](ManualClock::starting_at)) plus how far it moved.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let clock = tasq::ManualClock::new();
    /// let before = clock.wall_now();
    /// clock.advance(Duration::from_secs(3600));
    /// assert_eq!(clock.wall_now().duration_since(before).unwrap(), Duration::from_secs(3600));
    /// ```
    pub fn wall_now(&self) -> SystemTime {
        let offset = Duration::from_nanos(self.inner.offset_nanos.load(Ordering::SeqCst));
        self.inner.wall_start + offset
    }

    /// The clock's current time.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let clock = tasq::ManualClock::new();
    /// let before = clock.now();
    /// clock.advance(Duration::from_millis(1));
    /// assert!(clock.now() > before);
    /// ```
    pub fn now(&self) -> Instant {
        let offset = Duration::from_nanos(self.inner.offset_nanos.load(Ordering::SeqCst));
        self.inner.start + offset
    }

    /// Moves the clock forward by `by` and wakes everything that sleeps on it.
    ///
    /// The clock saturates about 584 years after it was created.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let clock = tasq::ManualClock::new();
    /// let start = clock.now();
    /// clock.advance(Duration::from_secs(1));
    /// clock.advance(Duration::from_secs(2));
    /// assert_eq!(clock.now() - start, Duration::from_secs(3));
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let mut current = self.inner.offset_nanos.load(Ordering::SeqCst);
        loop {
            let next = current.saturating_add(by);
            match self.inner.offset_nanos.compare_exchange(
                current,
                next,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        // Collect the live sleepers, then wake them without holding the list's lock: a sleeper's
        // wake() takes that sleeper's own lock.
        let live: Vec<Arc<dyn Wake>> = {
            let mut sleepers = self.inner.sleepers.lock();
            sleepers.retain(|s| s.strong_count() > 0);
            sleepers.iter().filter_map(Weak::upgrade).collect()
        };
        for sleeper in live {
            sleeper.wake();
        }
    }

    fn register(&self, sleeper: Weak<dyn Wake>) {
        let mut sleepers = self.inner.sleepers.lock();
        // Keep the list from growing with sleepers that are gone (tokens of finished tasks).
        if sleepers.len() >= 64 && sleepers.len().is_power_of_two() {
            sleepers.retain(|s| s.strong_count() > 0);
        }
        sleepers.push(sleeper);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field(
                "offset",
                &Duration::from_nanos(self.inner.offset_nanos.load(Ordering::SeqCst)),
            )
            .finish()
    }
}
