//! `Pool`: submit tasks, cancel them, read their state and the dead letters, shut down.

use std::any::TypeId;
use std::fmt;
use std::time::{Duration, Instant};

use crate::builder::Builder;
use crate::dead_letter::DeadLetter;
use crate::error::{CancelError, ResubmitError, SubmitError, SubmitErrorKind};
use crate::handle::{Completion, TaskHandle};
use crate::stats::{ShutdownReport, Stats, TaskInfo};
use crate::store::memory::{Effects, NewTask, Shared, deadline_after};
use crate::sync::{self, Arc, JoinHandle, Mutex, ThreadId};
use crate::task::{Start, Task, TaskId, TaskState, TaskType};

/// What [`Pool::cancel`] did.
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
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle>>,
    worker_ids: Vec<ThreadId>,
}

impl Pool {
    pub(crate) fn new(shared: Arc<Shared>, handles: Vec<JoinHandle>) -> Self {
        let worker_ids = handles.iter().map(sync::thread_id).collect();
        Pool {
            shared,
            workers: Mutex::new(handles),
            worker_ids,
        }
    }

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

    /// Submits a task and returns its handle.
    ///
    /// The task starts blocked (it has dependencies that have not succeeded), scheduled (its
    /// run_at is in the future) or ready. A task with an idempotency key the pool still remembers
    /// is not added: the existing task's handle is returned.
    ///
    /// # Errors
    ///
    /// The task is handed back inside the [`SubmitError`], whose
    /// [`kind`](SubmitError::kind) says why: [`ShutDown`](SubmitErrorKind::ShutDown),
    /// [`UnknownType`](SubmitErrorKind::UnknownType),
    /// [`TypeMismatch`](SubmitErrorKind::TypeMismatch),
    /// [`UnknownDependency`](SubmitErrorKind::UnknownDependency),
    /// [`KeyConflict`](SubmitErrorKind::KeyConflict) or
    /// [`TimeOverflow`](SubmitErrorKind::TimeOverflow).
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
        if self.shared.is_closed() {
            return Err(SubmitError::new(SubmitErrorKind::ShutDown, task));
        }
        let type_index = match self.type_index(task.ty) {
            Ok(index) => index,
            Err(kind) => return Err(SubmitError::new(kind, task)),
        };
        let now = self.shared.clock().now();
        let run_at = match task.start {
            Start::Now => Some(now),
            Start::At(at) => Some(at),
            Start::After(delay) => now.checked_add(delay),
        };
        let Some(run_at) = run_at.filter(|&at| at <= self.shared.latest_run_at()) else {
            return Err(SubmitError::new(SubmitErrorKind::TimeOverflow, task));
        };

        // Allocated before taking the lock, to keep the critical section short.
        let completion = Completion::new();
        let mut effects = Effects::default();
        let mut state = self.shared.lock();
        if state.closed {
            drop(state);
            return Err(SubmitError::new(SubmitErrorKind::ShutDown, task));
        }
        if let Some(key) = &task.key {
            if let Some((existing, existing_type, completion)) = state.find_key(key) {
                drop(state);
                if existing_type != type_index {
                    let kind = SubmitErrorKind::KeyConflict {
                        key: key.clone(),
                        existing,
                        existing_type: self.shared_type_name(existing_type),
                    };
                    return Err(SubmitError::new(kind, task));
                }
                // The duplicate's payload is dropped here, outside the lock.
                return Ok(TaskHandle::new(
                    existing,
                    completion,
                    Arc::downgrade(&self.shared),
                ));
            }
        }
        if let Some(unknown) = state.unknown_dependency(&task.dependencies) {
            drop(state);
            return Err(SubmitError::new(
                SubmitErrorKind::UnknownDependency(unknown),
                task,
            ));
        }
        let Task {
            payload,
            priority,
            dependencies,
            key,
            ..
        } = task;
        let new = NewTask {
            type_index,
            payload: Box::new(payload),
            priority,
            run_at,
            dependencies,
            key,
        };
        let (id, completion) = state.insert(new, completion, now, &mut effects);
        self.shared.notify(&mut state, &effects);
        drop(state);
        effects.apply();
        Ok(TaskHandle::new(
            id,
            completion,
            Arc::downgrade(&self.shared),
        ))
    }

    fn type_index<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
    ) -> Result<u32, SubmitErrorKind> {
        let registry = crate::store::Store::registry(&*self.shared);
        let index = registry
            .index_of(ty.name())
            .ok_or(SubmitErrorKind::UnknownType(ty.name()))?;
        let entry = registry.entry(index);
        if entry.payload != TypeId::of::<P>() || entry.output != TypeId::of::<O>() {
            return Err(SubmitErrorKind::TypeMismatch(ty.name()));
        }
        Ok(index)
    }

    fn shared_type_name(&self, index: u32) -> &'static str {
        crate::store::Store::registry(&*self.shared)
            .entry(index)
            .name
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
        self.shared.cancel(id)
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
    pub fn status(&self, id: TaskId) -> Option<TaskState> {
        self.shared.status(id)
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
    pub fn info(&self, id: TaskId) -> Option<TaskInfo> {
        self.shared.info(id)
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
    pub fn handle<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Option<TaskHandle<O>> {
        let type_index = self.type_index(ty).ok()?;
        let (index, completion) = self.shared.lock().completion_of(id)?;
        (index == type_index).then(|| TaskHandle::new(id, completion, Arc::downgrade(&self.shared)))
    }

    /// Blocks until no task is ready or running and none is due: everything left waits for a
    /// later run_at (on the pool's clock) or for a dependency. Returns at once on an idle pool.
    ///
    /// Made for tests on a [`ManualClock`](crate::ManualClock): advance the clock, wait until
    /// the pool has done everything that became due, then look at the outcome. With tasks
    /// submitted from other threads meanwhile, the pool may be busy again by the time this
    /// returns.
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
        self.shared.wait_idle();
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
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The dead letters the pool remembers, oldest id first.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{FailureReason, HandlerError, Pool, TaskType};
    /// const BAD: TaskType<(), ()> = TaskType::new("bad");
    /// let pool = Pool::builder().workers(1).register(BAD, |_, _: &()| Err::<(), _>(HandlerError::permanent("no"))).build()?;
    /// pool.submit(BAD.task(()))?.wait();
    /// assert_eq!(pool.dead_letters()[0].failure.reason, FailureReason::Permanent);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.shared.dead_letters()
    }

    /// Runs a dead letter again as a new task (same type, payload, priority and key; fresh
    /// attempts; no dependencies, no delay). Returns the new task's id; use
    /// [`handle`](Pool::handle) to wait on it. The dead letter leaves the list.
    ///
    /// # Errors
    ///
    /// [`ResubmitError::UnknownTask`], [`ResubmitError::NotDeadLetter`],
    /// [`ResubmitError::AlreadyResubmitted`] or [`ResubmitError::ShutDown`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const FETCH: TaskType<(), ()> = TaskType::new("fetch");
    /// static UP: AtomicBool = AtomicBool::new(false);
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(FETCH, |_, _: &()| {
    ///         if UP.load(Ordering::SeqCst) { Ok(()) } else { Err(HandlerError::permanent("down")) }
    ///     })
    ///     .build()?;
    /// let first = pool.submit(FETCH.task(()))?;
    /// assert!(first.wait().is_failed());
    /// UP.store(true, Ordering::SeqCst);
    /// let again = pool.resubmit(first.id())?;
    /// assert!(pool.handle(FETCH, again).unwrap().wait().is_succeeded());
    /// assert!(pool.dead_letters().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resubmit(&self, id: TaskId) -> Result<TaskId, ResubmitError> {
        self.shared.resubmit(id)
    }

    /// Takes a dead letter's payload out of the pool, to inspect it, store it elsewhere or
    /// drop it: the task stays [`Failed`](TaskState::Failed) but leaves the dead letters, and can
    /// no longer be resubmitted. `None` if `id` is not a dead letter of type `ty` (unknown,
    /// not failed, already resubmitted or taken, or of another type).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const IMPORT: TaskType<String, ()> = TaskType::new("import");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(IMPORT, |_, row: &String| Err::<(), _>(HandlerError::permanent(format!("bad row {row}"))))
    ///     .build()?;
    /// let handle = pool.submit(IMPORT.task("a;b;;".to_owned()))?;
    /// handle.wait();
    /// assert_eq!(pool.take_dead_letter(IMPORT, handle.id()).as_deref(), Some("a;b;;"));
    /// assert!(pool.dead_letters().is_empty());
    /// assert_eq!(pool.take_dead_letter(IMPORT, handle.id()), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take_dead_letter<P: 'static, O: 'static>(
        &self,
        ty: TaskType<P, O>,
        id: TaskId,
    ) -> Option<P> {
        let type_index = self.type_index(ty).ok()?;
        // Moved out under the lock; downcast (and, on a mismatch that cannot happen, dropped)
        // outside it.
        let payload = self.shared.lock().take_dead_letter(id, type_index)?;
        payload.downcast::<P>().ok().map(|payload| *payload)
    }

    /// Shuts the pool down gracefully and waits for its threads.
    ///
    /// At once, submits start failing with [`SubmitErrorKind::ShutDown`]. The workers then drain
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
        let deadline = deadline_after(self.shared.clock(), timeout);
        // A handler that shuts its own pool down cannot wait for its own task, nor join any worker
        // (another handler may be in shutdown too, waiting for this one's thread).
        let from_handler = self.worker_ids.contains(&sync::current_thread_id());
        let deadline_reached = self.shared.drain(from_handler, deadline);
        if !from_handler {
            let handles = std::mem::take(&mut *self.workers.lock());
            for handle in handles {
                // A worker never panics out of its loop (handler panics are caught).
                let _ = handle.join();
            }
        }
        let totals = self.shared.wait_for_workers(from_handler);
        ShutdownReport {
            succeeded: totals.succeeded,
            failed: totals.failed,
            cancelled: totals.cancelled,
            deadline_reached,
            elapsed: started.elapsed(),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop_now();
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("shared", &self.shared)
            .field("workers", &self.worker_ids.len())
            .finish()
    }
}
