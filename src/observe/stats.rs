//! Snapshots: the pool's counts, one task's details (and which tasks to list), and the
//! shutdown report.

use std::time::{Duration, Instant};

use crate::gates::breaker::BreakerState;
use crate::model::id::TaskId;
use crate::model::state::TaskState;

/// A snapshot of a pool, taken under its lock in time proportional to the number of priorities
/// in use.
///
/// # Two scopes
///
/// Its figures are of two scopes, which are one on the embedded store and differ on the durable
/// store, where many pools share a queue:
///
/// * **the queue's**: `blocked`, `scheduled`, `ready`, `running`, `retained`, `dead_letters`,
///   `ready_by_priority`, `oldest_ready`, `oldest_ready_by_priority`, `breakers` and
///   `estimated` count every task of the schema, whichever pool submitted or runs it (read in
///   a few milliseconds at any table size: see [`estimated`](Stats::estimated));
/// * **this pool's**: `workers`, `stuck`, `delayed_entries` and [`totals`](Stats::totals)
///   (what this pool, in this process, submitted, ran and saw end since it was built).
///
/// [`Pool::try_stats`](crate::Pool::try_stats) fails when the queue's figures cannot be read.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Pool, TaskType};
///
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// pool.submit(JOB.task(()).delay(Duration::from_secs(60)))?;
/// let stats = pool.stats();
/// assert_eq!(stats.scheduled, 1);
/// assert_eq!(stats.totals.submitted, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// This pool's worker threads that have not exited.
    pub workers: usize,
    /// The queue's tasks waiting for dependencies.
    pub blocked: usize,
    /// The queue's tasks waiting for their run_at (delayed, or a retry's backoff).
    pub scheduled: usize,
    /// The queue's tasks waiting for a worker.
    pub ready: usize,
    /// The queue's tasks being run (on the durable store: by any pool).
    pub running: usize,
    /// Terminal tasks the pool still remembers (see [`Builder::retention`](crate::Builder::retention)).
    pub retained: usize,
    /// Dead letters the pool still remembers.
    pub dead_letters: usize,
    /// Ready tasks per priority, highest priority first; only priorities with ready tasks.
    pub ready_by_priority: Vec<(u8, usize)>,
    /// How long the oldest ready task has waited for a worker.
    pub oldest_ready: Option<Duration>,
    /// How long the oldest ready task of each priority has waited, highest priority first;
    /// only priorities with ready tasks.
    pub oldest_ready_by_priority: Vec<(u8, Duration)>,
    /// Each downstream's circuit breaker (see [`Builder::breaker`](crate::Builder::breaker)),
    /// in the order they were set.
    pub breakers: Vec<(&'static str, BreakerState)>,
    /// Handlers still running past their timeout and the grace after it
    /// ([`Builder::stuck_after`](crate::Builder::stuck_after)): the workers they hold are lost
    /// to the pool until they return.
    pub stuck: usize,
    /// Entries in the delayed heap, including those of cancelled tasks not yet swept.
    pub delayed_entries: usize,
    /// Whether some queue-wide counts are estimates. The durable store counts each kind of
    /// task exactly up to 10,000 (and ready tasks up to 10,000 per priority), so that reading
    /// the figures costs a few milliseconds whatever the size of the table; a kind past that
    /// is PostgreSQL's estimate (`ready_by_priority` stays at 10,000 per priority). Always
    /// `false` on the embedded store.
    pub estimated: bool,
    /// This pool's counters since it was built (on the durable store: of this process only).
    pub totals: Totals,
}

/// Counters since the pool was built.
///
/// # Examples
///
/// ```
/// let totals = tasq::Totals::default();
/// assert_eq!(totals.submitted, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Totals {
    /// Tasks accepted (resubmitted dead letters count again).
    pub submitted: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks dead-lettered.
    pub failed: u64,
    /// Tasks cancelled.
    pub cancelled: u64,
    /// Retries scheduled.
    pub retried: u64,
    /// Panics in the engine's own code that a worker survived (a bug: please report it). The
    /// task the worker held ended failed. User code never counts here: its panics are caught
    /// where it runs.
    pub worker_panics: u64,
    /// Database operations of the durable store that failed (a lost connection, the server
    /// away): each was retried with backoff, or its error returned to the caller. Always 0 on
    /// the embedded store.
    pub store_errors: u64,
    /// Claims of the durable store that waited for a worker past their lease (the process
    /// stalled: a SIGSTOP, a long pause) and were given back unstarted, since another worker may
    /// already run their tasks. Always 0 on the embedded store.
    pub lapsed_claims: u64,
    /// Claim statements (or, with limits or breakers, claim transactions) this pool's fetcher
    /// ran on the durable store, and how many of them claimed nothing. Always 0 on the
    /// embedded store.
    pub claims: u64,
    /// See [`claims`](Totals::claims).
    pub empty_claims: u64,
    /// (Durable store.) Task types this pool declared otherwise than the last pool built with
    /// them on the schema, found when it was built (see `Event::DeclarationMismatch`).
    pub declaration_mismatches: u64,
}

/// What the pool knows of one task.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Pool, TaskState, TaskType};
///
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// let handle = pool.submit(JOB.task(()).priority(4).delay(Duration::from_secs(60)))?;
/// let info = pool.info(handle.id()).unwrap();
/// assert_eq!((info.state, info.priority, info.attempts), (TaskState::Scheduled, 4, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskInfo {
    /// The task's id.
    pub id: TaskId,
    /// Its type's name.
    pub task_type: &'static str,
    /// The queue it runs in (its type's, where it was submitted).
    pub queue: &'static str,
    /// Its idempotency key, if it was submitted with one.
    pub key: Option<String>,
    /// Its state.
    pub state: TaskState,
    /// Its priority.
    pub priority: u8,
    /// Attempts started so far.
    pub attempts: u32,
    /// How many attempts it may start: its own setting, fixed when it was submitted
    /// ([`Task::max_attempts`](crate::Task::max_attempts), else its type's in the submitting
    /// pool).
    pub max_attempts: u32,
    /// The backoff between its attempts, fixed when it was submitted, as `max_attempts`.
    pub retry_policy: crate::RetryPolicy,
    /// How long one run may take, fixed when it was submitted, as `max_attempts`.
    pub timeout: Option<std::time::Duration>,
    /// When a scheduled (or blocked) task may run, on the pool's clock.
    pub run_at: Option<Instant>,
    /// The last error: of the failed attempt a retry waits on, or of a dead letter.
    pub last_error: Option<String>,
    /// The task a dead letter was resubmitted as.
    pub resubmitted_as: Option<TaskId>,
    /// The tasks it was submitted to wait for ([`Task::after`](crate::Task::after)), by id,
    /// whatever became of them: those the pool knew when it was submitted (a dependency given
    /// by a handle that showed it succeeded after the pool forgot it is not listed). A dead
    /// letter resubmitted with its dependents names, in each dependent brought back, the new
    /// tasks it waits for. On the durable store, a dependency whose row retention deleted is
    /// no longer listed.
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const STEP: TaskType<u8, ()> = TaskType::new("step");
    /// let pool = Pool::builder().workers(1).register(STEP, |_, _: &u8| Ok::<_, HandlerError>(())).build()?;
    /// let fetch = pool.submit(STEP.task(1))?;
    /// let parse = pool.submit(STEP.task(2))?;
    /// let report = pool.submit(STEP.task(3).after([&parse, &fetch]))?;
    /// assert_eq!(pool.info(report.id()).unwrap().dependencies, [fetch.id(), parse.id()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub dependencies: Vec<TaskId>,
}

/// Which tasks [`Pool::tasks`](crate::Pool::tasks) lists: those in one state, of one type, or
/// both. Defaults to every task the pool remembers.
///
/// # Examples
///
/// ```
/// use tasq::{TaskFilter, TaskState};
/// let failed_imports = TaskFilter::new().state(TaskState::Failed).task_type("import");
/// assert_eq!(failed_imports.get_state(), Some(TaskState::Failed));
/// assert_eq!(failed_imports.get_task_type(), Some("import"));
/// assert_eq!(TaskFilter::new().get_state(), None);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskFilter {
    state: Option<TaskState>,
    task_type: Option<String>,
}

impl TaskFilter {
    /// Every task: no state, no type.
    ///
    /// # Examples
    ///
    /// ```
    /// let all = tasq::TaskFilter::new();
    /// assert_eq!((all.get_state(), all.get_task_type()), (None, None));
    /// ```
    pub fn new() -> Self {
        TaskFilter::default()
    }

    /// Only tasks in `state` (replaces an earlier state). [`Scheduled`](TaskState::Scheduled)
    /// and [`Ready`](TaskState::Ready) are told apart by the pool's clock as the page is read.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{TaskFilter, TaskState};
    /// let running = TaskFilter::new().state(TaskState::Running);
    /// assert_eq!(running.get_state(), Some(TaskState::Running));
    /// ```
    pub fn state(mut self, state: TaskState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only tasks of the type named `name` (replaces an earlier type): a
    /// [`TaskType::name`](crate::TaskType::name), or, on the durable store, any type name in
    /// the database.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{TaskFilter, TaskType};
    /// const EMAIL: TaskType<String, ()> = TaskType::new("email");
    /// let emails = TaskFilter::new().task_type(EMAIL.name());
    /// assert_eq!(emails.get_task_type(), Some("email"));
    /// ```
    pub fn task_type(mut self, name: impl Into<String>) -> Self {
        self.task_type = Some(name.into());
        self
    }

    /// The state it keeps, if it keeps one.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{TaskFilter, TaskState};
    /// assert_eq!(TaskFilter::new().state(TaskState::Ready).get_state(), Some(TaskState::Ready));
    /// ```
    pub fn get_state(&self) -> Option<TaskState> {
        self.state
    }

    /// The type name it keeps, if it keeps one.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::TaskFilter::new().task_type("email").get_task_type(), Some("email"));
    /// ```
    pub fn get_task_type(&self) -> Option<&str> {
        self.task_type.as_deref()
    }

    /// Whether a task in `state` of type `task_type` is one this filter keeps.
    pub(crate) fn keeps(&self, state: TaskState, task_type: &str) -> bool {
        self.state.is_none_or(|s| s == state)
            && self.task_type.as_deref().is_none_or(|t| t == task_type)
    }
}

/// What [`Pool::shutdown`](crate::Pool::shutdown) did.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Pool, TaskType};
///
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(2).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// for _ in 0..10 {
///     pool.submit(JOB.task(()))?;
/// }
/// let report = pool.shutdown(Duration::from_secs(10));
/// assert_eq!(report.succeeded, 10);
/// assert!(!report.deadline_reached && report.interrupted.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Tasks that succeeded over the pool's life.
    pub succeeded: u64,
    /// Tasks dead-lettered over the pool's life.
    pub failed: u64,
    /// Tasks cancelled over the pool's life (those the deadline cancelled included).
    pub cancelled: u64,
    /// What happened from the moment this shutdown closed the pool until it returned: the
    /// tasks that finished during the drain, and those the deadline cancelled.
    pub during: Totals,
    /// Whether the deadline passed before the pool drained.
    pub deadline_reached: bool,
    /// The tasks still running when the drain ended (the deadline fired their tokens), with
    /// their types' names, by id. Empty when the pool drained.
    pub interrupted: Vec<(TaskId, &'static str)>,
    /// How long the shutdown took (real time).
    pub elapsed: Duration,
}

impl Stats {
    /// No task anywhere: a store fills in what it counts.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn empty(workers: usize, totals: Totals) -> Stats {
        Stats {
            workers,
            blocked: 0,
            scheduled: 0,
            ready: 0,
            running: 0,
            retained: 0,
            dead_letters: 0,
            ready_by_priority: Vec::new(),
            oldest_ready: None,
            oldest_ready_by_priority: Vec::new(),
            breakers: Vec::new(),
            stuck: 0,
            delayed_entries: 0,
            estimated: false,
            totals,
        }
    }
}

impl Totals {
    /// What happened between `earlier` and `self`, counter by counter.
    pub(crate) fn since(self, earlier: Totals) -> Totals {
        Totals {
            submitted: self.submitted - earlier.submitted,
            succeeded: self.succeeded - earlier.succeeded,
            failed: self.failed - earlier.failed,
            cancelled: self.cancelled - earlier.cancelled,
            retried: self.retried - earlier.retried,
            worker_panics: self.worker_panics - earlier.worker_panics,
            store_errors: self.store_errors - earlier.store_errors,
            lapsed_claims: self.lapsed_claims - earlier.lapsed_claims,
            claims: self.claims - earlier.claims,
            empty_claims: self.empty_claims - earlier.empty_claims,
            declaration_mismatches: self.declaration_mismatches - earlier.declaration_mismatches,
        }
    }
}

/// One task type's backlog, from [`Pool::type_stats`](crate::Pool::type_stats) and in
/// [`Metrics`](crate::Metrics).
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, TaskType};
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// let types = pool.type_stats();
/// assert_eq!((types[0].task_type, types[0].ready), ("job", 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TypeStats {
    /// The type's name.
    pub task_type: &'static str,
    /// Its tasks waiting for a worker (including those a limit or a breaker holds back).
    pub ready: usize,
    /// Its tasks being run (on the durable store: by every pool on the database).
    pub running: usize,
    /// How long its oldest ready task has waited.
    pub oldest_ready: Option<Duration>,
}

impl TypeStats {
    pub(crate) fn new(task_type: &'static str) -> Self {
        TypeStats {
            task_type,
            ready: 0,
            running: 0,
            oldest_ready: None,
        }
    }
}
