//! What gets submitted: task types, tasks and their dependencies.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::model::completion::Completion;
use crate::model::id::TaskId;
use crate::model::state::TaskState;

/// A kind of task: its name, its payload type `P` and its handler's output type `O`.
///
/// Declare one per kind of work, usually as a `const`, register a handler for it on the
/// [`Builder`](crate::Builder), and make tasks of it with [`task`](TaskType::task). The types
/// make a payload that does not fit its handler a compile error; the name ties the submit to the
/// handler at run time (an unregistered name is refused at submit).
///
/// # Examples
///
/// ```
/// use tasq::TaskType;
///
/// struct Email { to: String }
/// const SEND_EMAIL: TaskType<Email, ()> = TaskType::new("send_email");
/// assert_eq!(SEND_EMAIL.name(), "send_email");
/// ```
pub struct TaskType<P, O> {
    name: &'static str,
    // fn(P) -> O: the type is Send, Sync and Copy whatever P and O are.
    _types: PhantomData<fn(P) -> O>,
}

impl<P, O> TaskType<P, O> {
    /// Names a task type.
    ///
    /// # Examples
    ///
    /// ```
    /// const RESIZE: tasq::TaskType<Vec<u8>, Vec<u8>> = tasq::TaskType::new("resize");
    /// ```
    pub const fn new(name: &'static str) -> Self {
        TaskType {
            name,
            _types: PhantomData,
        }
    }

    /// The type's name.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::TaskType::<u8, u8>::new("double").name(), "double");
    /// ```
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// A task of this type carrying `payload`, with default options (priority 0, no delay, no
    /// dependencies, no idempotency key).
    ///
    /// # Examples
    ///
    /// ```
    /// const DOUBLE: tasq::TaskType<u32, u32> = tasq::TaskType::new("double");
    /// let task = DOUBLE.task(21).priority(3);
    /// assert_eq!(*task.payload(), 21);
    /// ```
    pub fn task(self, payload: P) -> Task<P, O> {
        Task::new(self, payload)
    }
}

impl<P, O> Clone for TaskType<P, O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P, O> Copy for TaskType<P, O> {}

impl<P, O> fmt::Debug for TaskType<P, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TaskType").field(&self.name).finish()
    }
}

/// A key that deduplicates within windows of `period` (see [`Task::unique_per`]), as the store
/// keeps it at wall-clock time `now`: `{key}@{window}`.
pub(crate) fn windowed_key(key: &str, period: Duration, now: std::time::SystemTime) -> String {
    let since = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let period_us = period.as_micros().max(1);
    format!("{key}@{}", since.as_micros() / period_us)
}

/// Whether a task's uniqueness period can be used: a zero one, or one without a key, cannot.
pub(crate) fn check_key_period(
    key: Option<&str>,
    period: Option<Duration>,
) -> Result<(), crate::model::error::SubmitErrorKind> {
    let invalid = |problem| crate::model::error::SubmitErrorKind::InvalidSetting {
        setting: "uniqueness period",
        problem,
    };
    match (key, period) {
        (_, None) => Ok(()),
        (None, Some(_)) => Err(invalid("needs a key")),
        (Some(_), Some(period)) if period.as_micros() == 0 => {
            Err(invalid("is under a microsecond"))
        }
        (Some(_), Some(_)) => Ok(()),
    }
}

/// When a task may first run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Start {
    Now,
    After(Duration),
    At(Instant),
    /// A wall-clock time (see [`Task::run_at_system_time`]).
    AtSystem(SystemTime),
}

impl Start {
    /// How long after `now_system` (the wall clock's reading at submit) a wall-clock start
    /// is: zero for a time in the past. `None` for the other starts.
    pub(crate) fn system_delay(self, now_system: SystemTime) -> Option<Duration> {
        match self {
            Start::AtSystem(at) => Some(at.duration_since(now_system).unwrap_or_default()),
            _ => None,
        }
    }
}

/// A task ready to submit: a payload and its options.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Pool, TaskType};
///
/// const GREET: TaskType<String, String> = TaskType::new("greet");
///
/// let pool = Pool::builder()
///     .workers(2)
///     .register(GREET, |_, name: &String| Ok::<_, HandlerError>(format!("hello {name}")))
///     .build()?;
/// let first = pool.submit(GREET.task("ann".into()).priority(5))?;
/// let second = pool.submit(
///     GREET.task("bob".into())
///         .delay(Duration::from_millis(5))
///         .after([first.id()])
///         .key("greet-bob"),
/// )?;
/// assert_eq!(second.wait().succeeded().as_deref(), Some("hello bob"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a task does nothing until submitted"]
pub struct Task<P, O> {
    pub(crate) ty: TaskType<P, O>,
    pub(crate) payload: P,
    pub(crate) priority: u8,
    pub(crate) start: Start,
    pub(crate) dependencies: Vec<Dependency>,
    pub(crate) key: Option<String>,
    /// The key deduplicates within windows of this length (see [`Task::unique_per`]).
    pub(crate) key_period: Option<Duration>,
    /// Settings of this task's own, in place of its type's.
    pub(crate) own: Own,
}

/// The settings a task sets for itself ([`Task::max_attempts`], [`Task::retry_policy`],
/// [`Task::timeout`]); `None` takes the type's, as the submitting pool declares it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Own {
    pub(crate) max_attempts: Option<u32>,
    pub(crate) retry: Option<crate::RetryPolicy>,
    pub(crate) timeout: Option<Duration>,
}

impl<P, O> Task<P, O> {
    /// A task of type `ty` carrying `payload`; the same as `ty.task(payload)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{Task, TaskType};
    /// const ECHO: TaskType<u8, u8> = TaskType::new("echo");
    /// let task = Task::new(ECHO, 1);
    /// assert_eq!(task.task_type().name(), "echo");
    /// ```
    pub fn new(ty: TaskType<P, O>, payload: P) -> Self {
        Task {
            ty,
            payload,
            priority: 0,
            start: Start::Now,
            dependencies: Vec::new(),
            key: None,
            key_period: None,
            own: Own::default(),
        }
    }

    /// Sets the priority: higher runs first; equal priorities run in the order they became
    /// ready, which for tasks due at once is submission order. A worker's next pick weighs every
    /// submit that returned before it, from any thread; a delayed task or a retry becomes ready
    /// when a worker next looks after it is due, a dependent when its last dependency succeeds.
    /// Defaults to 0, the lowest.
    ///
    /// # Examples
    ///
    /// ```
    /// const JOB: tasq::TaskType<(), ()> = tasq::TaskType::new("job");
    /// let urgent = JOB.task(()).priority(255);
    /// # let _ = urgent;
    /// ```
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Runs the task no earlier than `delay` after it is submitted (on the pool's clock).
    /// Replaces an earlier [`run_at`](Task::run_at). A delay so long that the due time cannot be
    /// represented (more than 584 years after the pool started) is refused at submit with
    /// [`SubmitErrorKind::TimeOverflow`](crate::SubmitErrorKind::TimeOverflow).
    ///
    /// # Examples
    ///
    /// ```
    /// const JOB: tasq::TaskType<(), ()> = tasq::TaskType::new("job");
    /// let later = JOB.task(()).delay(std::time::Duration::from_secs(30));
    /// # let _ = later;
    /// ```
    pub fn delay(mut self, delay: Duration) -> Self {
        self.start = Start::After(delay);
        self
    }

    /// Runs the task no earlier than `at` (an instant of the pool's clock). An instant in the past
    /// means now. Replaces an earlier [`delay`](Task::delay). An instant more than 584 years
    /// after the pool started is refused at submit with
    /// [`SubmitErrorKind::TimeOverflow`](crate::SubmitErrorKind::TimeOverflow).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// const JOB: tasq::TaskType<(), ()> = tasq::TaskType::new("job");
    /// let later = JOB.task(()).run_at(Instant::now() + Duration::from_secs(30));
    /// # let _ = later;
    /// ```
    pub fn run_at(mut self, at: Instant) -> Self {
        self.start = Start::At(at);
        self
    }

    /// Runs the task no earlier than `at`, a wall-clock time: "at 03:00 UTC", a time read from
    /// a database or a message. Replaces an earlier [`delay`](Task::delay) or
    /// [`run_at`](Task::run_at). A time in the past means now.
    ///
    /// On the embedded store, and on any pool with a [`ManualClock`](crate::ManualClock), the
    /// time is turned into a due time on the pool's clock when the task is submitted: as far
    /// ahead of the pool's now as `at` is ahead of [`SystemTime::now`] then (so a later change
    /// of the system's clock does not move it). On the durable store with the system clock,
    /// the due time is `at` itself, compared with the database's clock, the one clock every
    /// process of the fleet shares (a time the database already passed means now). A time more
    /// than 584 years ahead is refused at submit with
    /// [`SubmitErrorKind::TimeOverflow`](crate::SubmitErrorKind::TimeOverflow).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use tasq::{HandlerError, Pool, SubmitErrorKind, TaskState, TaskType};
    ///
    /// const REPORT: TaskType<(), ()> = TaskType::new("report");
    /// let pool = Pool::builder().workers(1).register(REPORT, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let tonight = SystemTime::now() + Duration::from_secs(6 * 3600);
    /// let later = pool.submit(REPORT.task(()).run_at_system_time(tonight))?;
    /// assert_eq!(later.status(), TaskState::Scheduled);
    ///
    /// let past = pool.submit(REPORT.task(()).run_at_system_time(SystemTime::UNIX_EPOCH))?;
    /// assert!(past.wait().is_succeeded());
    ///
    /// let far = SystemTime::now() + Duration::from_secs(600 * 366 * 24 * 3600);
    /// let refused = pool.submit(REPORT.task(()).run_at_system_time(far)).unwrap_err();
    /// assert_eq!(refused.kind(), &SubmitErrorKind::TimeOverflow);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_at_system_time(mut self, at: SystemTime) -> Self {
        self.start = Start::AtSystem(at);
        self
    }

    /// Runs the task only after every task in `dependencies` has succeeded. If one fails or is
    /// cancelled, this task ends cancelled. Adds to earlier calls.
    ///
    /// Each dependency is a [`TaskId`] or a [`TaskHandle`](crate::TaskHandle) (by reference or by value). A handle
    /// is better where it is at hand: a dependency that has succeeded and that retention has
    /// since made the pool forget is refused as unknown when given by id, but accepted as
    /// satisfied when its handle shows it succeeded.
    ///
    /// A task's outcome is published before its dependents can start, so a dependent's handler
    /// can read a dependency's output from its handle (passed in the payload) with
    /// [`TaskHandle::try_wait`](crate::TaskHandle::try_wait), without waiting.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const STEP: TaskType<u8, u8> = TaskType::new("step");
    /// let pool = Pool::builder().workers(2).register(STEP, |_, n: &u8| Ok::<_, HandlerError>(*n)).build()?;
    /// let fetch = pool.submit(STEP.task(1))?;
    /// let parse = pool.submit(STEP.task(2).after([fetch.id()]))?;
    /// let report = pool.submit(STEP.task(3).after([&fetch, &parse]))?;
    /// assert_eq!(report.wait().succeeded(), Some(3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn after<D: Into<Dependency>>(mut self, dependencies: impl IntoIterator<Item = D>) -> Self {
        self.dependencies
            .extend(dependencies.into_iter().map(Into::into));
        self
    }

    /// Sets an idempotency key: while a task with this key is unfinished, or has succeeded and
    /// the pool still remembers it, submitting another returns that task's handle (with
    /// [`TaskHandle::is_duplicate`](crate::TaskHandle::is_duplicate) set) instead of running the
    /// work again, and drops the new payload. A task that fails or is cancelled frees its key,
    /// so the work can be submitted again. A key held by a task of another type is refused
    /// ([`KeyConflict`](crate::SubmitErrorKind::KeyConflict)).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const CHARGE: TaskType<u32, u32> = TaskType::new("charge");
    /// let pool = Pool::builder().workers(1).register(CHARGE, |_, cents: &u32| Ok::<_, HandlerError>(*cents)).build()?;
    /// let first = pool.submit(CHARGE.task(500).key("order-17"))?;
    /// let again = pool.submit(CHARGE.task(500).key("order-17"))?;
    /// assert_eq!(first.id(), again.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Makes the task's [`key`](Task::key) deduplicate within windows of `period`, instead of
    /// for as long as a task holds it: at most one live or succeeded task with the key per
    /// window (Oban's `unique: [period: ..]`, River's `ByPeriod`). Windows are aligned to the
    /// Unix epoch on the store's clock (the database's on the durable store, so every process
    /// agrees where one ends): a task submitted in the next window is a new task, even while the
    /// earlier one still runs. A task that fails or is cancelled frees its window, as it frees a
    /// key. The store keeps the key as `{key}@{window}` (the number of whole periods since the
    /// epoch), which is what [`Pool::find_key`](crate::Pool::find_key) and
    /// [`Pool::cancel_key`](crate::Pool::cancel_key) take.
    ///
    /// A zero period, or one without a key, is refused at submit with
    /// [`SubmitErrorKind::InvalidSetting`](crate::SubmitErrorKind::InvalidSetting).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use tasq::{HandlerError, ManualClock, Pool, TaskType};
    ///
    /// const DIGEST: TaskType<u32, ()> = TaskType::new("digest");
    /// // 2027-01-15 08:00 UTC: a whole hour.
    /// let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    /// let pool = Pool::builder()
    ///     .manual_clock(clock.clone())
    ///     .register(DIGEST, |_, _: &u32| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// let hour = Duration::from_secs(3600);
    /// let first = pool.submit(DIGEST.task(7).key("user-7").unique_per(hour))?;
    /// clock.advance(Duration::from_secs(3599));
    /// let again = pool.submit(DIGEST.task(7).key("user-7").unique_per(hour))?;
    /// assert!(again.is_duplicate() && again.id() == first.id());
    /// clock.advance(Duration::from_secs(1));
    /// let next = pool.submit(DIGEST.task(7).key("user-7").unique_per(hour))?;
    /// assert!(!next.is_duplicate());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unique_per(mut self, period: Duration) -> Self {
        self.key_period = Some(period);
        self
    }

    /// How many times this task may run, the first run included, in place of its type's
    /// [`TypeOptions::max_attempts`](crate::TypeOptions::max_attempts). Like every setting of a
    /// task, it is fixed when the task is submitted and kept with it: on the durable store every
    /// process that runs, retries or reaps the task obeys it, whatever that process registered.
    /// Zero is refused at submit with
    /// [`SubmitErrorKind::InvalidSetting`](crate::SubmitErrorKind::InvalidSetting).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const FLAKY: TaskType<(), u32> = TaskType::new("flaky");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .retry_policy(tasq::RetryPolicy::exponential(std::time::Duration::ZERO, std::time::Duration::ZERO))
    ///     .register(FLAKY, |ctx, _: &()| {
    ///         if ctx.is_last_attempt() { Ok(ctx.attempt()) } else { Err(HandlerError::retryable("not yet")) }
    ///     })
    ///     .build()?;
    /// let handle = pool.submit(FLAKY.task(()).max_attempts(5))?;
    /// assert_eq!(handle.wait().succeeded(), Some(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.own.max_attempts = Some(attempts);
        self
    }

    /// The backoff between this task's attempts, in place of its type's
    /// [`TypeOptions::retry_policy`](crate::TypeOptions::retry_policy); fixed at submit and kept
    /// with the task, as [`max_attempts`](Task::max_attempts). A cap too long to add to the
    /// current time is refused at submit with
    /// [`SubmitErrorKind::InvalidSetting`](crate::SubmitErrorKind::InvalidSetting).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// const JOB: tasq::TaskType<(), ()> = tasq::TaskType::new("job");
    /// let patient = JOB.task(()).retry_policy(tasq::RetryPolicy::exponential(
    ///     Duration::from_secs(1),
    ///     Duration::from_secs(600),
    /// ));
    /// # let _ = patient;
    /// ```
    pub fn retry_policy(mut self, policy: crate::RetryPolicy) -> Self {
        self.own.retry = Some(policy);
        self
    }

    /// How long one run of this task may take, in place of its type's
    /// [`TypeOptions::timeout`](crate::TypeOptions::timeout) (which says what a timeout does);
    /// fixed at submit and kept with the task, as [`max_attempts`](Task::max_attempts). Zero is
    /// refused at submit with
    /// [`SubmitErrorKind::InvalidSetting`](crate::SubmitErrorKind::InvalidSetting).
    ///
    /// # Examples
    ///
    /// ```
    /// const JOB: tasq::TaskType<(), ()> = tasq::TaskType::new("job");
    /// let quick = JOB.task(()).timeout(std::time::Duration::from_secs(5));
    /// # let _ = quick;
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.own.timeout = Some(timeout);
        self
    }

    /// The task's type.
    ///
    /// # Examples
    ///
    /// ```
    /// const JOB: tasq::TaskType<(), ()> = tasq::TaskType::new("job");
    /// assert_eq!(JOB.task(()).task_type().name(), "job");
    /// ```
    pub fn task_type(&self) -> TaskType<P, O> {
        self.ty
    }

    /// The payload.
    ///
    /// # Examples
    ///
    /// ```
    /// const JOB: tasq::TaskType<u8, ()> = tasq::TaskType::new("job");
    /// assert_eq!(*JOB.task(4).payload(), 4);
    /// ```
    pub fn payload(&self) -> &P {
        &self.payload
    }

    /// Takes the payload back, for example from a refused submit.
    ///
    /// # Examples
    ///
    /// ```
    /// const JOB: tasq::TaskType<String, ()> = tasq::TaskType::new("job");
    /// assert_eq!(JOB.task("x".to_owned()).into_payload(), "x");
    /// ```
    pub fn into_payload(self) -> P {
        self.payload
    }
}

impl<P, O> fmt::Debug for Task<P, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("type", &self.ty.name)
            .field("priority", &self.priority)
            .field("start", &self.start)
            .field("dependencies", &self.dependencies)
            .field("key", &self.key)
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

/// A task another task waits for: made from a [`TaskId`] or a [`TaskHandle`](crate::TaskHandle), for
/// [`Task::after`].
///
/// # Examples
///
/// ```
/// use tasq::{Dependency, TaskId};
///
/// let id = TaskId::from_parts(1, 7);
/// assert_eq!(Dependency::from(id).id(), id);
/// ```
#[derive(Clone)]
pub struct Dependency {
    pub(crate) id: TaskId,
    /// Set when made from a handle: says whether the task succeeded after the pool forgot it.
    completion: Option<Arc<Completion>>,
}

impl Dependency {
    /// The task depended on.
    ///
    /// # Examples
    ///
    /// ```
    /// let id = tasq::TaskId::from_parts(2, 3);
    /// assert_eq!(tasq::Dependency::from(id).id(), id);
    /// ```
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// A dependency on the task a handle stands for.
    pub(crate) fn of_handle(id: TaskId, completion: Arc<Completion>) -> Self {
        Dependency {
            id,
            completion: Some(completion),
        }
    }

    /// Whether a handle to the task showed it succeeded.
    pub(crate) fn succeeded(&self) -> bool {
        self.completion
            .as_ref()
            .is_some_and(|c| c.state() == Some(TaskState::Succeeded))
    }
}

impl From<TaskId> for Dependency {
    fn from(id: TaskId) -> Self {
        Dependency {
            id,
            completion: None,
        }
    }
}

impl fmt::Debug for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.id, f)
    }
}
