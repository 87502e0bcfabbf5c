//! `Builder`: workers, handlers, retry policy, retention, clock; `build()` starts the pool.

use std::fmt;
use std::time::{Duration, Instant};

use crate::api::pool::Pool;
use crate::api::type_options::TypeOptions;
use crate::client::context::Context;
use crate::client::schedule::Schedule;
use crate::gates::aging::Aging;
use crate::gates::breaker::Breaker;
use crate::model::clock::{Clock, ManualClock};
use crate::model::error::BuildError;
use crate::model::retry::{HandlerError, RetryPolicy};
use crate::model::task::TaskType;
use crate::observe::alert::{Alert, AlertScope};
use crate::observe::events::Hook;
use crate::runtime::handlers::{self, ErasedHandler, Handlers};
use crate::runtime::monitor::{Monitor, Watch};
use crate::runtime::scheduler::Scheduler;
use crate::runtime::worker;
use crate::store::Store;
use crate::store::memory::{MemoryStore, Retention};
use crate::store::registry::{Entry, Registry};
use crate::store::schedule::ScheduleDef;
use crate::sync::{Arc, Weak};

/// The settings that watch over a pool: hooks, alerts, breakers, aging and the monitor.
pub(crate) struct Oversight {
    pub(crate) hooks: Vec<Hook>,
    pub(crate) lifecycle: bool,
    pub(crate) alerts: Vec<Alert>,
    pub(crate) breakers: Vec<(&'static str, Breaker)>,
    pub(crate) aging: Option<Aging>,
    pub(crate) stuck_after: Duration,
    pub(crate) monitor_interval: Duration,
}

impl Default for Oversight {
    fn default() -> Self {
        Oversight {
            hooks: Vec::new(),
            lifecycle: false,
            alerts: Vec::new(),
            breakers: Vec::new(),
            aging: None,
            stuck_after: Duration::from_secs(10),
            monitor_interval: Duration::from_secs(1),
        }
    }
}

impl fmt::Debug for Oversight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Oversight")
            .field("hooks", &self.hooks.len())
            .field("lifecycle", &self.lifecycle)
            .field("alerts", &self.alerts)
            .field("breakers", &self.breakers)
            .field("aging", &self.aging)
            .field("stuck_after", &self.stuck_after)
            .field("monitor_interval", &self.monitor_interval)
            .finish()
    }
}

/// A handler waiting for the pool's defaults to be known.
pub(super) struct Pending {
    entry: Entry,
    /// `None` for a type declared without one.
    handler: Option<ErasedHandler>,
    options: TypeOptions,
}

/// Builds a [`Pool`]: how many workers, which handlers, how to retry, how long to remember
/// finished tasks.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Pool, TaskType, TypeOptions};
///
/// const UPLOAD: TaskType<Vec<u8>, usize> = TaskType::new("upload");
///
/// let pool = Pool::builder()
///     .workers(4)
///     .max_attempts(5)
///     .register_with(UPLOAD, TypeOptions::new().max_attempts(8), |_, bytes: &Vec<u8>| {
///         Ok::<_, HandlerError>(bytes.len())
///     })
///     .retention(1_000, Some(Duration::from_secs(600)))
///     .thread_name("uploader")
///     .build()?;
/// assert_eq!(pool.submit(UPLOAD.task(vec![1, 2, 3]))?.wait().succeeded(), Some(3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder<S = Embedded> {
    pub(super) workers: Option<usize>,
    /// The queues with workers of their own (`queues.rs`).
    pub(super) queues: Vec<(&'static str, usize)>,
    pub(super) max_attempts: u32,
    pub(super) retry: RetryPolicy,
    pub(super) pending: Vec<Pending>,
    /// The periodic tasks, checked by `build` (see `schedule.rs`).
    pub(super) schedules: Vec<Schedule>,
    pub(super) duplicate: Option<&'static str>,
    pub(super) retention: Retention,
    /// `retention` or `dead_letter_limit` was called: refused by a durable pool, whose policy is
    /// the schema's (`postgres::set_policy`).
    pub(super) retention_set: bool,
    pub(super) clock: Clock,
    pub(super) seed: Option<u64>,
    pub(super) thread_name: String,
    pub(super) stack_size: Option<usize>,
    pub(super) quiet_panics: bool,
    /// Run on each worker thread before its first claim, and after its last.
    pub(super) worker_start: Option<worker::WorkerHook>,
    pub(super) worker_exit: Option<worker::WorkerHook>,
    pub(super) oversight: Oversight,
    /// Which store the pool keeps its tasks in, and that store's own settings.
    pub(super) store: S,
}

/// The store of a [`Builder`] that keeps its tasks in memory, in this process: the default.
/// Its task types take any `Send` payload and output.
///
/// # Examples
///
/// ```
/// let builder: tasq::Builder<tasq::Embedded> = tasq::Pool::builder();
/// # let _ = builder;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Embedded;

// The pool's way in to its builder lives here, beside the builder: the pool itself never
// names it.
impl Pool {
    /// A [`Builder`] with the default settings.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = tasq::Pool::builder().workers(2).build()?;
    /// # Ok::<(), tasq::BuildError>(())
    /// ```
    pub fn builder() -> Builder {
        Builder::new()
    }
}

impl Builder<Embedded> {
    /// A builder with the defaults below.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tasq::Builder::new();
    /// # let _ = builder;
    /// ```
    pub fn new() -> Self {
        Builder {
            workers: None,
            queues: Vec::new(),
            max_attempts: 3,
            retry: RetryPolicy::default(),
            pending: Vec::new(),
            schedules: Vec::new(),
            duplicate: None,
            retention: Retention {
                max_count: 10_000,
                max_age: Some(Duration::from_secs(3600)),
                max_dead_letters: 10_000,
            },
            retention_set: false,
            clock: Clock::System,
            seed: None,
            thread_name: "tasq-worker".to_owned(),
            stack_size: None,
            quiet_panics: false,
            worker_start: None,
            worker_exit: None,
            oversight: Oversight::default(),
            store: Embedded,
        }
    }

    /// Registers the handler of task type `ty`, with the pool's default options.
    ///
    /// The handler gets the task's [`Context`] and a reference to its payload (the pool keeps the
    /// payload for retries and dead letters). It may capture state (a client, a connection pool);
    /// it runs on many threads at once, hence `Send + Sync`. State it keeps in a
    /// `thread_local!` instead is dropped when its worker thread ends, where a panicking `Drop`
    /// aborts the process: drop it in [`on_worker_exit`](Builder::on_worker_exit). Registering
    /// a name twice makes [`build`](Builder::build) fail with [`BuildError::DuplicateType`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const COUNT: TaskType<u64, u64> = TaskType::new("count");
    /// let total = Arc::new(AtomicU64::new(0));
    /// let sum = Arc::clone(&total);
    /// let pool = Pool::builder()
    ///     .register(COUNT, move |_, n: &u64| Ok::<_, HandlerError>(sum.fetch_add(*n, Ordering::SeqCst) + n))
    ///     .build()?;
    /// pool.submit(COUNT.task(5))?.wait();
    /// assert_eq!(total.load(Ordering::SeqCst), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register<P, O, F>(self, ty: TaskType<P, O>, handler: F) -> Self
    where
        P: Send + 'static,
        O: Send + Sync + 'static,
        F: Fn(&Context, &P) -> Result<O, HandlerError> + Send + Sync + 'static,
    {
        self.register_with(ty, TypeOptions::default(), handler)
    }

    /// Registers the handler of task type `ty` with its own options.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType, TypeOptions};
    ///
    /// const ONCE: TaskType<(), ()> = TaskType::new("once");
    /// let pool = Pool::builder()
    ///     .register_with(ONCE, TypeOptions::new().max_attempts(1), |_, _: &()| {
    ///         Err::<(), _>(HandlerError::retryable("no second chance"))
    ///     })
    ///     .build()?;
    /// assert!(pool.submit(ONCE.task(()))?.wait().is_failed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_with<P, O, F>(
        mut self,
        ty: TaskType<P, O>,
        options: TypeOptions,
        handler: F,
    ) -> Self
    where
        P: Send + 'static,
        O: Send + Sync + 'static,
        F: Fn(&Context, &P) -> Result<O, HandlerError> + Send + Sync + 'static,
    {
        self.push(
            Entry::new(ty, true),
            Some(handlers::erase(handler)),
            options,
        );
        self
    }

    /// Checks the configuration and starts the workers.
    ///
    /// # Errors
    ///
    /// [`BuildError::ZeroWorkers`], [`BuildError::DuplicateType`],
    /// [`BuildError::ZeroMaxAttempts`], [`BuildError::DurationOverflow`] (a retry cap),
    /// [`BuildError::InvalidThreadName`] (a NUL byte in the name), or
    /// [`BuildError::Spawn`] if a thread could not be started (the threads already started are
    /// stopped first).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{BuildError, HandlerError, Pool, TaskType};
    ///
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let twice = Pool::builder()
    ///     .register(JOB, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .register(JOB, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .build();
    /// assert!(matches!(twice, Err(BuildError::DuplicateType("job"))));
    /// ```
    pub fn build(self) -> Result<Pool, BuildError> {
        let (registry, threads, mut rest) = self.check(false)?;
        let monitor = Monitor::new(
            &mut rest.watch,
            &registry,
            threads.count,
            rest.clock.clone(),
            &threads.name,
        )
        .map_err(BuildError::Spawn)?;
        let timed = registry.entries().iter().any(|e| e.timeout.is_some());
        let store = MemoryStore::start(
            registry,
            rest.clock,
            rest.retention,
            threads.count,
            next_pool_id(),
            monitor.events.clone(),
        );
        start(store, monitor, rest.watch, timed, &threads, rest.schedules)
    }
}

/// What [`Builder::check`] leaves for the store.
pub(crate) struct Checked<S> {
    pub(crate) clock: Clock,
    pub(crate) retention: Retention,
    pub(crate) watch: Watch,
    pub(crate) schedules: Vec<ScheduleDef>,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) store: S,
}

impl<S> Builder<S> {
    /// Adds a periodic task (see [`Schedule`]). Its task type must be registered with the pool
    /// (a durable pool may declare it without a handler: another process runs it), and two
    /// schedules may not share a name; otherwise the build fails with
    /// [`BuildError::InvalidSchedule`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, Schedule, TaskType};
    ///
    /// const BEAT: TaskType<(), ()> = TaskType::new("beat");
    /// let pool = Pool::builder()
    ///     .register(BEAT, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .schedule(Schedule::every("beat", Duration::from_secs(30), BEAT, |_| ()))
    ///     .build()?;
    /// # let _ = pool;
    /// # Ok::<(), tasq::BuildError>(())
    /// ```
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Adds a registration; a name registered twice fails the build.
    pub(super) fn push(
        &mut self,
        entry: Entry,
        handler: Option<ErasedHandler>,
        options: TypeOptions,
    ) {
        if self.duplicate.is_none() && self.pending.iter().any(|p| p.entry.name == entry.name) {
            self.duplicate = Some(entry.name);
        }
        self.pending.push(Pending {
            entry,
            handler,
            options,
        });
    }

    /// Checks the settings shared by every store: the registry, the worker threads, and the
    /// rest for the store to start with.
    /// `producer_only`: zero workers is allowed (a durable pool that only submits and waits).
    pub(crate) fn check(
        self,
        producer_only: bool,
    ) -> Result<(Registry, worker::Threads, Checked<S>), BuildError> {
        let workers = match self.workers {
            Some(0) if !producer_only && self.queues.is_empty() => {
                return Err(BuildError::ZeroWorkers);
            }
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        if let Some(name) = self.duplicate {
            return Err(BuildError::DuplicateType(name));
        }
        if self.max_attempts == 0 {
            return Err(BuildError::ZeroMaxAttempts(None));
        }
        check_cap(&self.retry)?;
        if self.thread_name.contains('\0') {
            return Err(BuildError::InvalidThreadName(self.thread_name));
        }
        let oversight = self.oversight;
        let mut registry = Registry::default();
        for &(name, breaker) in &oversight.breakers {
            if registry.downstreams.iter().any(|&(n, _)| n == name) {
                return Err(invalid("a breaker", name, "is set twice"));
            }
            if breaker.failures() == 0 {
                return Err(invalid("a breaker", name, "opens after zero failures"));
            }
            check_duration(breaker.cool_down(), "a breaker's cool-down")?;
            registry.downstreams.push((name, breaker));
        }
        if let Some(aging) = oversight.aging {
            if aging.every().is_zero() {
                return Err(invalid(
                    "aging",
                    "the pool",
                    "earns a level every zero seconds",
                ));
            }
            registry.aging = Some(aging);
        }
        if oversight.monitor_interval.is_zero() {
            return Err(invalid("the monitor interval", "the pool", "is zero"));
        }
        check_duration(oversight.monitor_interval, "the monitor interval")?;
        let mut handlers = Vec::with_capacity(self.pending.len());
        for Pending {
            mut entry,
            handler,
            options,
        } in self.pending
        {
            entry.max_attempts = options.max_attempts.unwrap_or(self.max_attempts);
            if entry.max_attempts == 0 {
                return Err(BuildError::ZeroMaxAttempts(Some(entry.name)));
            }
            entry.retry = options.retry.unwrap_or(self.retry);
            check_cap(&entry.retry)?;
            if let Some(timeout) = options.timeout {
                if timeout.is_zero() {
                    return Err(invalid("a timeout", entry.name, "is zero"));
                }
                check_duration(timeout.saturating_add(oversight.stuck_after), "a timeout")?;
                entry.timeout = Some(timeout);
            }
            if let Some(name) = options.downstream {
                let index = registry
                    .downstreams
                    .iter()
                    .position(|&(n, _)| n == name)
                    .ok_or_else(|| invalid("a downstream", entry.name, "has no breaker"))?;
                entry.downstream = Some(index as u32);
            }
            if let Some(queue) = options.queue {
                if let Err(problem) = crate::model::pause::check_queue_name(queue) {
                    return Err(invalid("a queue name", entry.name, problem));
                }
                entry.queue = queue;
            }
            if let Some(limit) = options.concurrency {
                if limit == 0 {
                    return Err(invalid("a concurrency limit", entry.name, "is zero"));
                }
                entry.concurrency = Some(limit);
            }
            if let Some(rate) = options.rate {
                if !rate.is_valid() {
                    return Err(invalid(
                        "a rate limit",
                        entry.name,
                        "needs a positive, finite rate and a burst of at least 1",
                    ));
                }
                entry.rate = Some(rate);
            }
            registry
                .insert(entry)
                .expect("duplicates were refused above");
            handlers.push(handler);
        }
        for alert in &oversight.alerts {
            if let AlertScope::TaskType(name) = alert.scope() {
                if registry.index_of(name).is_none() {
                    return Err(invalid(
                        "an alert",
                        name,
                        "names a type the pool does not register",
                    ));
                }
            }
        }

        let workers = registry.set_lanes(workers, &self.queues)?;
        if workers > crate::store::memory::MAX_WORKERS {
            return Err(invalid(
                "the number of workers",
                "the pool",
                "is above 32,767",
            ));
        }
        // A std `Arc` even under loom: immutable, nothing to model.
        let handlers = std::sync::Arc::new(Handlers::new(handlers));
        registry.keep_alive = Some(std::sync::Arc::clone(&handlers) as _);
        let threads = worker::Threads {
            count: workers,
            name: self.thread_name,
            stack_size: self.stack_size,
            quiet_panics: self.quiet_panics,
            seed: self.seed,
            start_hook: self.worker_start,
            exit_hook: self.worker_exit,
            handlers: std::sync::Arc::clone(&handlers),
        };
        let schedules = crate::client::schedule::check_all(self.schedules, &registry)?;
        let rest = Checked {
            schedules,
            clock: self.clock,
            retention: self.retention,
            watch: Watch {
                hooks: oversight.hooks,
                lifecycle: oversight.lifecycle,
                alerts: oversight.alerts,
                stuck_after: oversight.stuck_after,
                interval: oversight.monitor_interval,
            },
            store: self.store,
        };
        Ok((registry, threads, rest))
    }

    /// Sets the number of worker threads. Defaults to the number of CPUs
    /// (`std::thread::available_parallelism`). Zero makes [`build`](Builder::build) fail with
    /// [`BuildError::ZeroWorkers`], more than 32,767 with [`BuildError::InvalidSetting`].
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = tasq::Pool::builder().workers(3).build()?;
    /// assert_eq!(pool.stats().workers, 3);
    /// # Ok::<(), tasq::BuildError>(())
    /// ```
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Sets how many times a task may run (the first run included) for types that do not set
    /// their own. Defaults to 3. Zero makes [`build`](Builder::build) fail with
    /// [`BuildError::ZeroMaxAttempts`].
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tasq::Pool::builder().max_attempts(10);
    /// # let _ = builder;
    /// ```
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Sets the backoff for types that do not set their own. Defaults to
    /// [`RetryPolicy::default`]: base 100 ms, cap 10 s. A cap so long that it overflows when added
    /// to the current time makes [`build`](Builder::build) fail with
    /// [`BuildError::DurationOverflow`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = tasq::Pool::builder()
    ///     .retry_policy(tasq::RetryPolicy::exponential(Duration::from_millis(50), Duration::from_secs(5)));
    /// # let _ = builder;
    /// ```
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Sets how many finished tasks the pool remembers, and for how long, for
    /// [`Pool::status`](crate::Pool::status) and [`Pool::info`](crate::Pool::info), the keys of
    /// succeeded tasks, and [`Pool::resubmit_with_dependents`](crate::Pool::resubmit_with_dependents).
    /// Records beyond `max_count`, or older than `max_age`, are dropped, oldest first, whenever
    /// a task finishes. Handles keep their outcomes regardless, and dead letters have their own
    /// limit ([`dead_letter_limit`](Builder::dead_letter_limit)). Defaults to 10,000 tasks and one
    /// hour. Embedded pools only: a durable pool's retention is its schema's policy, the same for
    /// every process (`tasq::postgres::set_policy`, feature `postgres`), and a durable builder
    /// given this refuses to build ([`BuildError::InvalidSetting`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = tasq::Pool::builder().retention(100_000, Some(Duration::from_secs(24 * 3600)));
    /// # let _ = builder;
    /// ```
    pub fn retention(mut self, max_count: usize, max_age: Option<Duration>) -> Self {
        self.retention.max_count = max_count;
        self.retention.max_age = max_age;
        self.retention_set = true;
        self
    }

    /// Whether panics in this pool's handlers (and in the `Drop` or `Display` of its payloads,
    /// outputs and errors) skip the process's panic hook. They are caught either way and end
    /// their tasks as [`FailureReason::Panicked`](crate::FailureReason::Panicked) dead letters
    /// with the panic's message; with the default hook, each is also printed to stderr. For
    /// handlers whose panics are expected, without replacing the hook for the whole program.
    /// Defaults to `false`.
    ///
    /// It works through a hook installed once per process that wraps the hook in place then and
    /// stays silent on this pool's worker threads; a hook the program sets afterwards replaces
    /// it.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const BUGGY: TaskType<(), ()> = TaskType::new("buggy");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .quiet_panics(true)
    ///     .register(BUGGY, |_, _: &()| -> Result<(), HandlerError> { panic!("expected, and not printed") })
    ///     .build()?;
    /// assert!(pool.submit(BUGGY.task(()))?.wait().is_failed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn quiet_panics(mut self, quiet: bool) -> Self {
        self.quiet_panics = quiet;
        self
    }

    /// How many dead letters the pool keeps: each stays, whatever the
    /// [`retention`](Builder::retention) of finished tasks, until it is taken
    /// ([`Pool::take_dead_letter`]), resubmitted ([`Pool::resubmit`]) or purged
    /// ([`Pool::purge_dead_letter`]); past this many, the oldest are dropped. Defaults to 10,000.
    /// Embedded pools only, as [`retention`](Builder::retention).
    ///
    /// [`Pool::take_dead_letter`]: crate::Pool::take_dead_letter
    /// [`Pool::resubmit`]: crate::Pool::resubmit
    /// [`Pool::purge_dead_letter`]: crate::Pool::purge_dead_letter
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const BAD: TaskType<u32, ()> = TaskType::new("bad");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .retention(0, None) // forget finished tasks at once…
    ///     .dead_letter_limit(2) // …but keep the last two dead letters
    ///     .register(BAD, |_, _: &u32| Err::<(), _>(HandlerError::permanent("no")))
    ///     .build()?;
    /// for n in 0..3 {
    ///     pool.submit(BAD.task(n))?.wait();
    /// }
    /// let kept: Vec<u32> = pool.dead_letters().iter().filter_map(|d| pool.take_dead_letter(BAD, d.id)).collect();
    /// assert_eq!(kept, [1, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dead_letter_limit(mut self, max: usize) -> Self {
        self.retention.max_dead_letters = max;
        self.retention_set = true;
        self
    }

    /// Runs the pool on a [`ManualClock`]: delays, retries, handler sleeps and the shutdown
    /// deadline then move only when the clock is advanced. For deterministic tests. Defaults to
    /// the system clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, ManualClock, Pool, TaskState, TaskType};
    ///
    /// const LATER: TaskType<(), ()> = TaskType::new("later");
    /// let clock = ManualClock::new();
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .manual_clock(clock.clone())
    ///     .register(LATER, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// let handle = pool.submit(LATER.task(()).delay(Duration::from_secs(3600)))?;
    /// assert_eq!(handle.status(), TaskState::Scheduled);
    /// clock.advance(Duration::from_secs(3600));
    /// assert!(handle.wait().is_succeeded());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn manual_clock(mut self, clock: ManualClock) -> Self {
        self.clock = Clock::Manual(clock);
        self
    }

    /// Seeds the random source of the retry jitter, so that backoffs repeat from run to run
    /// (exactly so with one worker). Defaults to a seed from the operating system.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tasq::Pool::builder().seed(42);
    /// # let _ = builder;
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Sets the worker threads' name prefix; each is named `{prefix}-{index}`. Defaults to
    /// `tasq-worker`.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tasq::Pool::builder().thread_name("mailer");
    /// # let _ = builder;
    /// ```
    pub fn thread_name(mut self, prefix: impl Into<String>) -> Self {
        self.thread_name = prefix.into();
        self
    }

    /// Sets the worker threads' stack size in bytes. Defaults to the standard library's.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tasq::Pool::builder().stack_size(4 << 20);
    /// # let _ = builder;
    /// ```
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = Some(bytes);
        self
    }

    /// Calls `hook` on each worker thread as it starts, before it claims its first task, with
    /// the worker's index (`0..workers`, as in its thread name `{prefix}-{index}`): to set up
    /// what the thread's handlers share, a thread-local client or a thread's name in a log.
    /// Replaces an earlier hook. Defaults to none.
    ///
    /// The hook runs inside `catch_unwind`, never under a lock of the pool, and may call back
    /// into the pool (submit, read stats). A hook that panics is caught (the panic goes to the
    /// process's panic hook, unless [`quiet_panics`](Builder::quiet_panics)), and its worker
    /// starts as if it had returned: the pool keeps all its workers, and the worker's
    /// [exit hook](Builder::on_worker_exit) still runs at the end. So do what a handler cannot do
    /// without (a connection) in the handler, or check in the handler that the hook did it. A
    /// hook that blocks holds back its worker's first claim; [`build`](Builder::build) does not
    /// wait for the hooks.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use tasq::Pool;
    ///
    /// let (started, rx) = mpsc::channel();
    /// let pool = Pool::builder()
    ///     .workers(2)
    ///     .on_worker_start(move |index| started.send(index).unwrap())
    ///     .build()?;
    /// let mut indexes = vec![rx.recv()?, rx.recv()?];
    /// indexes.sort_unstable();
    /// assert_eq!(indexes, [0, 1]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_worker_start<F>(mut self, hook: F) -> Self
    where
        F: Fn(usize) + Send + Sync + 'static,
    {
        self.worker_start = Some(std::sync::Arc::new(hook));
        self
    }

    /// Calls `hook` on each worker thread as it leaves, after its last task and before the
    /// thread ends, with the worker's index (as [`on_worker_start`](Builder::on_worker_start)):
    /// to close what the thread's handlers kept. Replaces an earlier hook. Defaults to none.
    ///
    /// It runs once the worker's loop is over: during [`Pool::shutdown`](crate::Pool::shutdown),
    /// which waits for it (a hook that blocks holds the shutdown past its deadline), or after the
    /// pool was dropped, which does not wait. Like the start hook it runs inside `catch_unwind`
    /// and never under a lock: one that panics is caught, and the worker exits as it would
    /// have. It may call back into the pool, which is closed by then (a submit is refused with
    /// [`ShutDown`](crate::SubmitErrorKind::ShutDown)).
    ///
    /// **Thread-locals in handlers.** A value a handler keeps in a `thread_local!` (a database
    /// client, say) is dropped when its worker thread ends, outside any `catch_unwind`: if its
    /// `Drop` panics there, Rust aborts the whole process ("thread local panicked on drop"), and
    /// the shutdown's deadline never applies. Take such values out of the thread-local in this
    /// hook and drop them here, where a panic is caught.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::cell::RefCell;
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// struct Client; // a connection whose Drop may panic
    /// thread_local! {
    ///     static CLIENT: RefCell<Option<Client>> = const { RefCell::new(None) };
    /// }
    ///
    /// const QUERY: TaskType<u32, ()> = TaskType::new("query");
    /// let pool = Pool::builder()
    ///     .workers(2)
    ///     .register(QUERY, |_, _: &u32| {
    ///         CLIENT.with(|c| {
    ///             let mut client = c.borrow_mut();
    ///             let _client: &mut Client = client.get_or_insert_with(|| Client); // connect once
    ///         });
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     // Dropped here, inside catch_unwind, not by the thread's end.
    ///     .on_worker_exit(|_| drop(CLIENT.with(|c| c.borrow_mut().take())))
    ///     .build()?;
    /// pool.submit(QUERY.task(1))?.wait();
    /// pool.shutdown(Duration::from_secs(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_worker_exit<F>(mut self, hook: F) -> Self
    where
        F: Fn(usize) + Send + Sync + 'static,
    {
        self.worker_exit = Some(std::sync::Arc::new(hook));
        self
    }
}

/// A new pool id, unique within the process (ids start at 1).
fn next_pool_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Starts the workers and the monitor on a started store, and makes the pool.
pub(super) fn start<S: Store + 'static>(
    store: Arc<S>,
    monitor: Arc<Monitor>,
    watch: Watch,
    timed: bool,
    threads: &worker::Threads,
    schedules: Vec<ScheduleDef>,
) -> Result<Pool, BuildError> {
    let handles = worker::spawn(&store, &monitor, threads).map_err(BuildError::Spawn)?;
    let store: Arc<dyn Store> = store;
    let weak = Arc::downgrade(&store);
    let clock = store.clock().clone();
    let mut pool = Pool::new(store, Arc::clone(&monitor), handles);
    if !schedules.is_empty() {
        // Dropped on failure: the pool stops its workers.
        pool.store
            .register_schedules(&schedules)
            .map_err(BuildError::Store)?;
        pool.scheduler = Scheduler::start(Weak::clone(&weak), schedules, clock, &threads.name)
            .map_err(BuildError::Spawn)?;
    }
    // Dropped on failure: the pool stops its workers.
    monitor
        .start(weak, watch.alerts, timed, &threads.name)
        .map_err(BuildError::Spawn)?;
    Ok(pool)
}

/// A setting that makes no sense.
pub(super) fn invalid(
    setting: &'static str,
    of: &'static str,
    problem: &'static str,
) -> BuildError {
    BuildError::InvalidSetting {
        setting,
        of,
        problem,
    }
}

/// A duration the engine adds to the current time must not overflow.
fn check_duration(duration: Duration, what: &'static str) -> Result<(), BuildError> {
    match Instant::now().checked_add(duration) {
        Some(_) => Ok(()),
        None => Err(BuildError::DurationOverflow(what)),
    }
}

/// The retry cap is added to the current time for every retry: it must not overflow.
fn check_cap(policy: &RetryPolicy) -> Result<(), BuildError> {
    check_duration(policy.cap(), "the retry cap")
}

impl Default for Builder<Embedded> {
    fn default() -> Self {
        Builder::new()
    }
}

impl<S: fmt::Debug> fmt::Debug for Builder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("workers", &self.workers)
            .field("max_attempts", &self.max_attempts)
            .field("retry", &self.retry)
            .field(
                "types",
                &self
                    .pending
                    .iter()
                    .map(|p| p.entry.name)
                    .collect::<Vec<_>>(),
            )
            .field(
                "schedules",
                &self
                    .schedules
                    .iter()
                    .map(Schedule::name)
                    .collect::<Vec<_>>(),
            )
            .field("retention", &self.retention)
            .field("clock", &self.clock)
            .field("seed", &self.seed)
            .field("thread_name", &self.thread_name)
            .field("quiet_panics", &self.quiet_panics)
            .field("on_worker_start", &self.worker_start.is_some())
            .field("on_worker_exit", &self.worker_exit.is_some())
            .field("oversight", &self.oversight)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}
