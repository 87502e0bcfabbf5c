//! `Pool`: submit tasks, cancel them, read their state and the dead letters, shut down.

use std::fmt;
use std::time::{Duration, Instant};

use crate::client::current;
use crate::client::handle::TaskHandle;
use crate::model::error::{CancelError, StatsError, SubmitError, WaitError};
use crate::model::id::TaskId;
use crate::model::state::{CancelOutcome, TaskState};
use crate::model::task::{Task, TaskType};
use crate::observe::metrics::Metrics;
use crate::observe::stats::{ShutdownReport, Stats, TaskFilter, TaskInfo, TypeStats};
use crate::runtime::monitor::Monitor;
use crate::runtime::scheduler::Scheduler;
use crate::store::Store;
use crate::sync::{self, Arc, JoinHandle, Mutex, ThreadId};

/// A pool of worker threads running tasks from a priority queue, with retries, dead letters,
/// dependencies, cancellation and graceful shutdown.
///
/// Build one with [`Pool::builder`]. All methods take `&self`: share a pool between threads
/// with an `Arc` or a reference.
///
/// # Dropping a pool
///
/// Dropping a pool without [`shutdown`](Pool::shutdown) stops it at once without waiting: no new
/// task is accepted, every task that has not started ends [`Cancelled`](TaskState::Cancelled)
/// with [`CancelReason::Shutdown`](crate::CancelReason::Shutdown), and running handlers see their
/// tokens fire. The worker threads are not joined; each exits as soon as its current handler
/// returns. So a drop never hangs, and no thread outlives its last handler. Call `shutdown` to
/// let queued work finish and to wait for the threads.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tasq::{HandlerError, Pool, TaskType};
///
/// const WORD_COUNT: TaskType<String, usize> = TaskType::new("word_count");
///
/// let pool = Pool::builder()
///     .workers(4)
///     .register(WORD_COUNT, |_, text: &String| Ok::<_, HandlerError>(text.split_whitespace().count()))
///     .build()?;
/// let handle = pool.submit(WORD_COUNT.task("the quick brown fox".into()))?;
/// assert_eq!(handle.wait().succeeded(), Some(4));
/// let report = pool.shutdown(Duration::from_secs(5));
/// assert_eq!(report.succeeded, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Pool {
    /// Where the tasks are: the only way this pool reaches them.
    pub(super) store: Arc<dyn Store>,
    /// Events, metrics, timeouts and alerts: the same for every store.
    monitor: Arc<Monitor>,
    workers: Mutex<Vec<JoinHandle>>,
    worker_ids: Vec<ThreadId>,
    /// The thread that submits the periodic tasks' slots (a pool with schedules only).
    pub(super) scheduler: Option<Arc<Scheduler>>,
}

impl Pool {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        monitor: Arc<Monitor>,
        handles: Vec<JoinHandle>,
    ) -> Self {
        let worker_ids = handles.iter().map(sync::thread_id).collect();
        Pool {
            store,
            monitor,
            workers: Mutex::new(handles),
            worker_ids,
            scheduler: None,
        }
    }

    /// Submits a task and returns its handle.
    ///
    /// The task starts blocked (it has dependencies that have not succeeded), scheduled (its
    /// run_at is in the future) or ready. A task whose idempotency key another task holds (see
    /// [`Task::key`]) is not added: that task's handle is returned, marked
    /// [`is_duplicate`](TaskHandle::is_duplicate).
    ///
    /// # Errors
    ///
    /// The task is handed back inside the [`SubmitError`], whose
    /// [`kind`](SubmitError::kind) says why: [`ShutDown`](crate::SubmitErrorKind::ShutDown),
    /// [`UnknownType`](crate::SubmitErrorKind::UnknownType),
    /// [`TypeMismatch`](crate::SubmitErrorKind::TypeMismatch),
    /// [`UnknownDependency`](crate::SubmitErrorKind::UnknownDependency),
    /// [`KeyConflict`](crate::SubmitErrorKind::KeyConflict) or
    /// [`TimeOverflow`](crate::SubmitErrorKind::TimeOverflow).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, SubmitErrorKind, TaskType};
    ///
    /// const PING: TaskType<(), &'static str> = TaskType::new("ping");
    /// let pool = Pool::builder().workers(1).register(PING, |_, _: &()| Ok::<_, HandlerError>("pong")).build()?;
    /// assert_eq!(pool.submit(PING.task(()))?.wait().succeeded(), Some("pong"));
    ///
    /// let too_late = pool.submit(PING.task(()).delay(Duration::MAX)).unwrap_err();
    /// assert_eq!(too_late.kind(), &SubmitErrorKind::TimeOverflow);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit<P, O>(&self, task: Task<P, O>) -> Result<TaskHandle<O>, SubmitError<Task<P, O>>>
    where
        P: Send + 'static,
        O: Send + Sync + 'static,
    {
        crate::client::submit::submit(&self.store, task)
    }

    /// Submits many tasks of one type at once: under one lock on the embedded store, in one
    /// transaction (and, for tasks without a key or dependencies, one statement) on the durable
    /// store. Either every task is accepted or none is. The handles come back in the order of
    /// `tasks`; a task whose idempotency key another task holds (before the batch, or earlier in
    /// it) is that task, as with [`submit`](Pool::submit).
    ///
    /// # Errors
    ///
    /// As [`submit`](Pool::submit), for the first task that cannot be accepted; the error hands
    /// back its index and every task of the batch. A key held by a task of another type earlier
    /// in the same batch is a [`KeyConflict`](crate::SubmitErrorKind::KeyConflict) naming the id
    /// that task would have had.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, SubmitErrorKind, TaskId, TaskType};
    ///
    /// const SQUARE: TaskType<u64, u64> = TaskType::new("square");
    /// let pool = Pool::builder().workers(2).register(SQUARE, |_, n: &u64| Ok::<_, HandlerError>(n * n)).build()?;
    /// let handles = pool.submit_batch((1..=4).map(|n| SQUARE.task(n)).collect())?;
    /// let squares: Vec<u64> = handles.iter().filter_map(|h| h.wait().succeeded()).collect();
    /// assert_eq!(squares, [1, 4, 9, 16]);
    ///
    /// let unknown = TaskId::from_parts(pool.id(), 1_000);
    /// let refused = pool
    ///     .submit_batch(vec![SQUARE.task(5), SQUARE.task(6).after([unknown])])
    ///     .unwrap_err();
    /// assert_eq!(refused.kind(), &SubmitErrorKind::UnknownDependency(unknown));
    /// let (index, tasks) = refused.into_task();
    /// assert_eq!((index, tasks.len()), (1, 2));
    /// assert_eq!(pool.stats().totals.submitted, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn submit_batch<P, O>(
        &self,
        tasks: Vec<Task<P, O>>,
    ) -> Result<Vec<TaskHandle<O>>, SubmitError<(usize, Vec<Task<P, O>>)>>
    where
        P: Send + 'static,
        O: Send + Sync + 'static,
    {
        crate::client::submit::submit_batch(&self.store, tasks)
    }

    /// Submits a task inside the caller's open PostgreSQL transaction (feature `postgres`): the
    /// task exists only if that transaction commits, so a program's own write and the task it
    /// causes commit together, or neither does. The transaction must be on the pool's database
    /// and schema. Returns a [`Receipt`](crate::Receipt) with the task's id; get a handle with
    /// [`handle`](Pool::handle) once the transaction has committed (a rolled-back task never
    /// existed: nothing would end a wait on it). A task whose key another task holds is not
    /// added: the receipt names that task and says it is a
    /// [duplicate](crate::Receipt::is_duplicate), as [`submit`](Pool::submit)'s handle does.
    ///
    /// # Errors
    ///
    /// As [`submit`](Pool::submit); [`NotDurable`](crate::SubmitErrorKind::NotDurable) on an
    /// embedded pool. A refusal leaves the caller's transaction as it was.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const WELCOME: TaskType<String, ()> = TaskType::new("welcome");
    /// let url = "host=127.0.0.1 user=postgres dbname=test";
    /// let pool = Pool::builder()
    ///     .postgres(url)
    ///     .register(WELCOME, |_, _: &String| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    /// let mut tx = client.transaction()?;
    /// tx.execute("INSERT INTO users (email) VALUES ($1)", &[&"ann@example.com"])?;
    /// let receipt = pool.submit_in(&mut tx, WELCOME.task("ann@example.com".into()).key("welcome-ann"))?;
    /// tx.commit()?;
    /// if !receipt.is_duplicate() {
    ///     pool.handle(WELCOME, receipt.id()).unwrap().wait();
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "postgres")]
    pub fn submit_in<P, O>(
        &self,
        tx: &mut postgres::Transaction<'_>,
        task: Task<P, O>,
    ) -> Result<crate::Receipt, SubmitError<Task<P, O>>>
    where
        P: Send + 'static,
        O: Send + Sync + 'static,
    {
        crate::client::submit::submit_in(&self.store, tx, task)
    }

    /// Cancels a task. One that has not started (blocked, scheduled, ready, or waiting to retry)
    /// ends [`Cancelled`](TaskState::Cancelled) at once and never runs; its dependents are
    /// cancelled too. A running one has its [`CancelToken`](crate::CancelToken) fired and ends
    /// cancelled when its handler returns, whatever the handler returns.
    ///
    /// # Errors
    ///
    /// [`CancelError::UnknownTask`] if the pool does not know the id.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{CancelOutcome, CancelReason, HandlerError, Outcome, Pool, TaskType};
    ///
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let parent = pool.submit(JOB.task(()).delay(Duration::from_secs(60)))?;
    /// let child = pool.submit(JOB.task(()).after([parent.id()]))?;
    /// assert_eq!(pool.cancel(parent.id())?, CancelOutcome::Cancelled);
    /// assert_eq!(child.wait(), Outcome::Cancelled(CancelReason::DependencyCancelled(parent.id())));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self, id: TaskId) -> Result<CancelOutcome, CancelError> {
        crate::observe::trace::cancelled(id);
        self.store.cancel(id)
    }

    /// The task holding idempotency key `key` (see [`Task::key`]): one that is live (not
    /// finished) or has succeeded and is still remembered. `None` if no such task holds it: never
    /// used, or its holder failed or was cancelled (which freed the key), or was forgotten by
    /// retention. On the durable store, any pool's task on the database (`None` too if the
    /// database cannot be read).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const CHARGE: TaskType<u32, ()> = TaskType::new("charge");
    /// let pool = Pool::builder().workers(1).register(CHARGE, |_, _: &u32| Ok::<_, HandlerError>(())).build()?;
    /// let later = pool.submit(CHARGE.task(500).key("order-17").delay(Duration::from_secs(60)))?;
    /// assert_eq!(pool.find_key("order-17"), Some(later.id()));
    /// assert_eq!(pool.find_key("order-18"), None);
    /// later.cancel()?; // frees the key
    /// assert_eq!(pool.find_key("order-17"), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn find_key(&self, key: &str) -> Option<TaskId> {
        self.store.find_key(key)
    }

    /// Cancels the task holding idempotency key `key`, as [`cancel`](Pool::cancel) does, in one
    /// step with finding it (no other task can take the key in between); returns the task's id
    /// and what the cancel did. The holder is the task [`find_key`](Pool::find_key) names: live,
    /// or succeeded ([`CancelOutcome::AlreadyFinished`] then). A task the cancel ends frees the
    /// key.
    ///
    /// # Errors
    ///
    /// [`CancelError::UnknownKey`] if no live or succeeded task holds `key`;
    /// [`CancelError::StoreByKey`] if the durable store could not reach its database.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{CancelError, CancelOutcome, HandlerError, Pool, TaskType};
    /// const CHARGE: TaskType<u32, ()> = TaskType::new("charge");
    /// let pool = Pool::builder().workers(1).register(CHARGE, |_, _: &u32| Ok::<_, HandlerError>(())).build()?;
    /// let later = pool.submit(CHARGE.task(500).key("order-17").delay(Duration::from_secs(60)))?;
    /// assert_eq!(pool.cancel_key("order-17"), Ok((later.id(), CancelOutcome::Cancelled)));
    /// assert!(later.wait().is_cancelled());
    /// assert_eq!(pool.cancel_key("order-17"), Err(CancelError::UnknownKey("order-17".into())));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel_key(&self, key: &str) -> Result<(TaskId, CancelOutcome), CancelError> {
        let (id, outcome) = self.store.cancel_key(key)?;
        crate::observe::trace::cancelled(id);
        Ok((id, outcome))
    }

    /// A task's state, if the pool still remembers it.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskState, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let handle = pool.submit(JOB.task(()))?;
    /// handle.wait();
    /// assert_eq!(pool.status(handle.id()), Some(TaskState::Succeeded));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn status(&self, id: TaskId) -> Option<TaskState> {
        self.store.status(id)
    }

    /// What the pool knows of a task, if it still remembers it.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let handle = pool.submit(JOB.task(()))?;
    /// handle.wait();
    /// assert_eq!(pool.info(handle.id()).unwrap().attempts, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn info(&self, id: TaskId) -> Option<TaskInfo> {
        self.store.info(id)
    }

    /// A page of the tasks the pool remembers that `filter` keeps (of one state, of one type,
    /// or both), in id order: at most `limit`, starting after `after` (from the first with
    /// `None`). Pass the last id of a page to get the next: a page starts where the last one
    /// ended (keyset paging), so tasks added or ended meanwhile shift no page, and the
    /// next page costs what the first did. Each task as [`info`](Pool::info) tells it.
    ///
    /// On the embedded store the page is read under the pool's lock, copying only what the
    /// pool itself made (states, counts, error texts; no payload or output), by walking the ids
    /// from `after` or, if fewer, the records (see `State::tasks`). On the durable store it is
    /// one statement over an index of state and id (or of type, state and id; schema version
    /// 4), starting at `after`: a page reads about `limit` index entries, not the table, except
    /// that ready and scheduled tasks share an index range (they differ only by their due
    /// time, which the page reads as it goes) and that running tasks, a few, are all read and
    /// sorted. It lists the tasks of every pool on the database; an empty page if the database
    /// cannot be read.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskFilter, TaskState, TaskType};
    ///
    /// const REPORT: TaskType<u32, ()> = TaskType::new("report");
    /// let pool = Pool::builder().workers(1).register(REPORT, |_, _: &u32| Ok::<_, HandlerError>(())).build()?;
    /// for n in 0..5 {
    ///     pool.submit(REPORT.task(n).delay(Duration::from_secs(3600)))?;
    /// }
    /// let scheduled = TaskFilter::new().state(TaskState::Scheduled).task_type(REPORT.name());
    /// let mut pages = Vec::new();
    /// let mut after = None;
    /// loop {
    ///     let page = pool.tasks(&scheduled, after, 2);
    ///     let Some(last) = page.last() else { break };
    ///     after = Some(last.id);
    ///     pages.push(page.len());
    /// }
    /// assert_eq!(pages, [2, 2, 1]);
    /// assert!(pool.tasks(&TaskFilter::new().state(TaskState::Running), None, 10).is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn tasks(&self, filter: &TaskFilter, after: Option<TaskId>, limit: usize) -> Vec<TaskInfo> {
        self.store.tasks(filter, after, limit)
    }

    /// A handle to a task the pool still remembers, for example a resubmitted dead letter.
    /// `None` if the id is unknown or the task is not of type `ty`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<u8, u8> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, n: &u8| Ok::<_, HandlerError>(*n)).build()?;
    /// let id = pool.submit(JOB.task(9))?.id();
    /// let again = pool.handle(JOB, id).unwrap();
    /// assert_eq!(again.wait().succeeded(), Some(9));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn handle<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Option<TaskHandle<O>> {
        crate::client::submit::handle(&self.store, ty, id)
    }

    /// This pool's id: the first half of every [`TaskId`] it gives, unique within the process.
    ///
    /// # Examples
    ///
    /// ```
    /// let a = tasq::Pool::builder().workers(1).build()?;
    /// let b = tasq::Pool::builder().workers(1).build()?;
    /// assert_ne!(a.id(), b.id());
    /// # Ok::<(), tasq::BuildError>(())
    /// ```
    #[must_use]
    pub fn id(&self) -> u64 {
        self.store.pool_id()
    }

    /// Blocks until nothing can run without time passing: no task is running, none is ready to
    /// start and none is due. Everything left waits for a later run_at (on the pool's clock),
    /// for a dependency, or for the time a gate opens: tasks held back by an open circuit
    /// breaker (until its cool-down ends) or by a rate limit (until its next token) count like
    /// scheduled ones, though their state stays [`Ready`](TaskState::Ready). (Tasks held by a
    /// concurrency limit wait for a running task: the pool is not idle while they wait.)
    /// Returns at once on an idle pool.
    ///
    /// Made for tests on a [`ManualClock`](crate::ManualClock): advance the clock, wait until
    /// the pool has done everything that became due, then look at the outcome. With tasks
    /// submitted from other threads meanwhile, the pool may be busy again by the time this
    /// returns. To wait until nothing at all is left, delayed tasks included, use
    /// [`wait_empty`](Pool::wait_empty).
    ///
    /// # Panics
    ///
    /// If called from one of this pool's handlers: that handler's own task is running, so the
    /// pool never becomes idle for it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, ManualClock, Pool, TaskState, TaskType};
    ///
    /// const TICK: TaskType<(), ()> = TaskType::new("tick");
    /// let clock = ManualClock::new();
    /// let pool = Pool::builder()
    ///     .workers(2)
    ///     .manual_clock(clock.clone())
    ///     .register(TICK, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// let soon = pool.submit(TICK.task(()).delay(Duration::from_secs(1)))?;
    /// let later = pool.submit(TICK.task(()).delay(Duration::from_secs(2)))?;
    /// clock.advance(Duration::from_secs(1));
    /// pool.wait_idle();
    /// assert_eq!(soon.status(), TaskState::Succeeded);
    /// assert_eq!(later.status(), TaskState::Scheduled);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_idle(&self) {
        if self.wait_idle_timeout(None) == Err(WaitError::FromHandler) {
            panic!(
                "Pool::wait_idle called from one of the pool's own handlers: it would never return"
            );
        }
    }

    /// Like [`wait_idle`](Pool::wait_idle), with a timeout (`None` waits as long as it takes).
    ///
    /// The timeout is real time, measured with [`Instant::now`] even on a
    /// [`ManualClock`](crate::ManualClock): it bounds how long the call blocks, and nobody may
    /// be moving a manual clock while it waits. (Due times stay on the pool's clock: advancing
    /// a manual clock is what makes delayed work due.)
    ///
    /// # Errors
    ///
    /// [`WaitError::TimedOut`], or [`WaitError::FromHandler`] if called from one of this pool's
    /// handlers.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let job = pool.submit(JOB.task(()))?;
    /// pool.wait_idle_timeout(Some(Duration::from_secs(10)))?;
    /// assert!(job.is_finished());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_idle_timeout(&self, timeout: Option<Duration>) -> Result<(), WaitError> {
        self.refuse_from_handler()?;
        // Real time, not the pool's clock (see above).
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.store.wait_idle(deadline)
    }

    /// Blocks until the pool has nothing left: no task blocked, scheduled (delayed or waiting
    /// to retry), ready or running. Unlike [`shutdown`](Pool::shutdown) it does not close the
    /// pool: submits go on being accepted, and what they add is waited for too. The timeout is
    /// real time, as [`wait_idle_timeout`](Pool::wait_idle_timeout)'s, even on a manual clock;
    /// `None` waits as long as it takes.
    ///
    /// The way for a batch program to wait for all its work before it reads the results.
    ///
    /// # Errors
    ///
    /// [`WaitError::TimedOut`], or [`WaitError::FromHandler`] if called from one of this pool's
    /// handlers.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<u32, ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(2).register(JOB, |_, _: &u32| Ok::<_, HandlerError>(())).build()?;
    /// for n in 0..100 {
    ///     let delay = Duration::from_millis(u64::from(n % 3));
    ///     drop(pool.submit(JOB.task(n).delay(delay))?);
    /// }
    /// pool.wait_empty(Some(Duration::from_secs(30)))?;
    /// assert_eq!(pool.stats().totals.succeeded, 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_empty(&self, timeout: Option<Duration>) -> Result<(), WaitError> {
        self.refuse_from_handler()?;
        // Real time, not the pool's clock (see `wait_idle_timeout`).
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.store.wait_empty(deadline)
    }

    /// Checks the engine's internal invariants (listed in `src/store/memory/state.rs`) and names
    /// the first one broken. For the crate's own tests: it reads every task under the lock.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.store.check_invariants()
    }

    /// A snapshot of the pool's counts.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = tasq::Pool::builder().workers(2).build()?;
    /// let stats = pool.stats();
    /// assert_eq!((stats.workers, stats.ready, stats.running), (2, 0, 0));
    /// # Ok::<(), tasq::BuildError>(())
    /// ```
    ///
    /// On the durable store, when the database cannot be read, the queue-wide figures are
    /// zeros: [`try_stats`](Pool::try_stats) says so instead.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let mut stats = self.store.stats();
        stats.stuck = self.monitor.stuck();
        stats
    }

    /// A snapshot of the pool's counts, or [`StatsError::StoreUnavailable`] when the durable
    /// store's database cannot be read within 5 seconds (never on the embedded store).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = tasq::Pool::builder().workers(1).build()?;
    /// let stats = pool.try_stats()?;
    /// assert_eq!(stats.ready, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_stats(&self) -> Result<Stats, StatsError> {
        let mut stats = self
            .store
            .try_stats()
            .map_err(StatsError::StoreUnavailable)?;
        stats.stuck = self.monitor.stuck();
        Ok(stats)
    }

    /// Each registered type's backlog: ready and running tasks, and how long its oldest ready
    /// task has waited. On the embedded store this reads every ready task (under the pool's
    /// lock); on the durable store it is one grouped query.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, ManualClock, Pool, TaskType};
    ///
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let clock = ManualClock::new();
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .manual_clock(clock.clone())
    ///     .register(JOB, |_, _: &()| Ok::<_, HandlerError>(()))
    ///     .build()?;
    /// pool.submit(JOB.task(()).delay(Duration::from_secs(5)))?;
    /// assert_eq!(pool.type_stats()[0].ready, 0); // scheduled, not ready
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn type_stats(&self) -> Vec<TypeStats> {
        self.store.type_stats()
    }

    /// A snapshot of everything the pool measures (see [`Metrics`]);
    /// [`Metrics::to_prometheus`] renders it for a Prometheus scraper. Costs a
    /// [`stats`](Pool::stats) and a [`type_stats`](Pool::type_stats).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let text = pool.metrics().to_prometheus();
    /// assert!(text.contains("# TYPE tasq_run_seconds histogram"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> Metrics {
        Metrics::new(
            self.stats(),
            self.store.type_stats(),
            &self.monitor.runs,
            self.monitor.events.dead_letters_by_reason(),
        )
    }

    /// Shuts the pool down gracefully and waits for its threads.
    ///
    /// At once, submits start failing with [`SubmitErrorKind::ShutDown`](crate::SubmitErrorKind::ShutDown). The workers then drain
    /// everything outstanding: ready tasks, delayed tasks when they come due, retries after their
    /// backoff, and blocked tasks whose dependencies succeed. If that is not done within
    /// `timeout` (on the pool's clock), every running handler's token fires, every task that has
    /// not started ends cancelled, and the pool waits for the running handlers to return (their
    /// tasks end cancelled). Every wait on every task returns.
    ///
    /// Calling it again, or from several threads, is safe: each call returns once the pool is
    /// stopped. A timeout too long to represent means no deadline.
    ///
    /// Called from one of the pool's own handlers, it drains what can still finish without that
    /// handler's task (tasks that depend on it are cancelled), waits for the other workers to
    /// leave, and returns; the calling task's token has then fired, and the task ends cancelled
    /// when its handler returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const STUCK: TaskType<(), ()> = TaskType::new("stuck");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(STUCK, |ctx, _: &()| {
    ///         ctx.token().wait(); // returns when the deadline fires the token
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .build()?;
    /// let handle = pool.submit(STUCK.task(()))?;
    /// let report = pool.shutdown(Duration::from_millis(20));
    /// assert!(report.deadline_reached);
    /// assert_eq!(report.cancelled, 1);
    /// assert!(handle.wait().is_cancelled());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&self, timeout: Duration) -> ShutdownReport {
        let started = Instant::now();
        crate::observe::trace::shutdown(timeout);
        let deadline = self.store.clock().deadline_after(timeout);
        // A handler that shuts its own pool down cannot wait for its own task, nor join any worker
        // (another handler may be in shutdown too, waiting for this one's thread).
        let from_handler = self.worker_ids.contains(&sync::current_thread_id());
        // No slot is submitted once the shutdown begins.
        if let Some(scheduler) = &self.scheduler {
            scheduler.stop_and_join();
        }
        let drained = self.store.drain(from_handler, deadline);
        if !from_handler {
            let handles = std::mem::take(&mut *self.workers.lock());
            for handle in handles {
                // A worker never panics out of its loop (handler panics are caught).
                let _ = handle.join();
            }
        }
        let totals = self.store.wait_for_workers(from_handler);
        // Every run has ended (but a handler's own, in shutdown from a handler): the monitor has
        // nothing left to time, and the hooks hear of every event before this returns.
        self.monitor.stop_and_join();
        self.monitor.events.flush();
        self.monitor.events.stop();
        ShutdownReport {
            succeeded: totals.succeeded,
            failed: totals.failed,
            cancelled: totals.cancelled,
            during: totals.since(drained.before),
            deadline_reached: drained.deadline_reached,
            interrupted: drained.interrupted,
            elapsed: started.elapsed(),
        }
    }
}

impl Pool {
    /// The pool's own handlers cannot wait for it to be idle or empty: their tasks are running,
    /// so it never is for them.
    fn refuse_from_handler(&self) -> Result<(), WaitError> {
        match current::current_task() {
            Some(id) if id.pool() == self.store.pool_id() => Err(WaitError::FromHandler),
            _ => Ok(()),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(scheduler) = &self.scheduler {
            scheduler.stop();
        }
        self.store.stop_now();
        self.monitor.stop();
        self.monitor.events.stop();
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("store", &self.store)
            .field("workers", &self.worker_ids.len())
            .finish()
    }
}
