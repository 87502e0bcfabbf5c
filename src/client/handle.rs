//! The handle a submit returns: wait for a task's outcome, read its state, cancel it.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crate::client::current;
use crate::model::completion::{Completion, Finished};
use crate::model::error::{CancelError, TaskError};
use crate::model::id::TaskId;
use crate::model::state::{CancelOutcome, CancelReason, Failure, TaskState};
use crate::model::task::Dependency;
use crate::store::{Store, StoreHub};
use crate::sync::{Arc, Mutex};

/// How a task ended.
///
/// It displays as `succeeded: <output>`, `failed: <failure>` or `cancelled: <reason>` when the
/// output displays.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Outcome, Pool, TaskType};
///
/// const ADD: TaskType<(u32, u32), u32> = TaskType::new("add");
/// let pool = Pool::builder().workers(1).register(ADD, |_, (a, b): &(u32, u32)| Ok::<_, HandlerError>(a + b)).build()?;
/// let outcome = pool.submit(ADD.task((2, 3)))?.wait();
/// match &outcome {
///     Outcome::Succeeded(sum) => assert_eq!(*sum, 5),
///     Outcome::Failed(failure) => panic!("failed: {failure}"),
///     Outcome::Cancelled(reason) => panic!("cancelled: {reason}"),
/// }
/// assert_eq!(outcome.to_string(), "succeeded: 5");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<O> {
    /// The handler's output.
    Succeeded(O),
    /// The task was dead-lettered.
    Failed(Failure),
    /// The task was cancelled.
    Cancelled(CancelReason),
}

impl<O> Outcome<O> {
    /// The terminal state this outcome stands for.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{Outcome, TaskState};
    /// assert_eq!(Outcome::Succeeded(1).state(), TaskState::Succeeded);
    /// ```
    #[must_use]
    pub fn state(&self) -> TaskState {
        match self {
            Outcome::Succeeded(_) => TaskState::Succeeded,
            Outcome::Failed(_) => TaskState::Failed,
            Outcome::Cancelled(_) => TaskState::Cancelled,
        }
    }

    /// The output, if the task succeeded.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::Outcome::Succeeded(7).succeeded(), Some(7));
    /// ```
    #[must_use]
    pub fn succeeded(self) -> Option<O> {
        match self {
            Outcome::Succeeded(output) => Some(output),
            _ => None,
        }
    }

    /// Whether the task succeeded.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(tasq::Outcome::Succeeded(()).is_succeeded());
    /// ```
    #[must_use]
    pub fn is_succeeded(&self) -> bool {
        matches!(self, Outcome::Succeeded(_))
    }

    /// Whether the task was dead-lettered.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{CancelReason, Outcome};
    /// assert!(!Outcome::<()>::Cancelled(CancelReason::Requested).is_failed());
    /// ```
    #[must_use]
    pub fn is_failed(&self) -> bool {
        matches!(self, Outcome::Failed(_))
    }

    /// Whether the task was cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{CancelReason, Outcome};
    /// assert!(Outcome::<()>::Cancelled(CancelReason::Shutdown).is_cancelled());
    /// ```
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Outcome::Cancelled(_))
    }

    /// The output as `Ok`, or why there is none as `Err`: for `?`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const DOUBLE: TaskType<u32, u32> = TaskType::new("double");
    /// let pool = Pool::builder().workers(1).register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2)).build()?;
    /// let doubled: u32 = pool.submit(DOUBLE.task(21))?.wait().into_result()?;
    /// assert_eq!(doubled, 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_result(self) -> Result<O, TaskError> {
        match self {
            Outcome::Succeeded(output) => Ok(output),
            Outcome::Failed(failure) => Err(TaskError::Failed(failure)),
            Outcome::Cancelled(reason) => Err(TaskError::Cancelled(reason)),
        }
    }
}

impl<O: fmt::Display> fmt::Display for Outcome<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Succeeded(output) => write!(f, "succeeded: {output}"),
            Outcome::Failed(failure) => write!(f, "failed: {failure}"),
            Outcome::Cancelled(reason) => write!(f, "cancelled: {reason}"),
        }
    }
}

/// A handle to a submitted task: wait for its outcome, read its state, cancel it.
///
/// Handles are cheap to clone; any number of threads may wait on one task. A handle stays valid
/// after the pool forgets the task (see [`Builder::retention`](crate::Builder::retention)) and
/// after the pool is dropped: every task reaches a terminal state, so every wait returns.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, TaskType};
///
/// const SQUARE: TaskType<u64, u64> = TaskType::new("square");
/// let pool = Pool::builder().workers(2).register(SQUARE, |_, n: &u64| Ok::<_, HandlerError>(n * n)).build()?;
/// let handle = pool.submit(SQUARE.task(12))?;
/// let other = handle.clone();
/// let waiter = std::thread::spawn(move || other.wait().succeeded());
/// assert_eq!(handle.wait().succeeded(), Some(144));
/// assert_eq!(waiter.join().unwrap(), Some(144));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TaskHandle<O> {
    id: TaskId,
    /// Where the outcome is published. `None` until this handle first reads the task, for a
    /// plain submit on the embedded store (see `hub.rs`); a handle holding one is never the
    /// store's concern again.
    completion: Mutex<Option<Arc<Completion>>>,
    hub: Arc<StoreHub>,
    duplicate: bool,
    _output: PhantomData<fn() -> O>,
}

impl<O> TaskHandle<O> {
    pub(crate) fn new(
        id: TaskId,
        completion: Option<Arc<Completion>>,
        hub: Arc<StoreHub>,
        duplicate: bool,
    ) -> Self {
        TaskHandle {
            id,
            completion: Mutex::new(completion),
            hub,
            duplicate,
            _output: PhantomData,
        }
    }

    /// The completion, asked of the store (or, once it is gone, of the hub) the first time.
    fn completion(&self) -> Arc<Completion> {
        self.completion_in(self.hub.store().as_ref())
    }

    /// [`completion`](Self::completion), with the store as the hub gave it (`None` once it is
    /// gone). The caller holds that reference until after this returns: the last reference to
    /// the store may be it, and the store's `Drop` drops user values, never under this handle's
    /// lock.
    fn completion_in(&self, store: Option<&Arc<dyn Store>>) -> Arc<Completion> {
        let mut slot = self.completion.lock();
        if let Some(completion) = slot.as_ref() {
            return Arc::clone(completion);
        }
        let completion = match store {
            Some(store) => store.completion_for(self.id),
            None => self.hub.take_sealed(self.id.seq()),
        }
        .unwrap_or_else(|| {
            // A store keeps the outcome of every task whose unread handle lives, except a
            // record-less success of the embedded store (a direct run whose output is `()`, see
            // `store/memory/slots.rs`): one that is kept nowhere is one of those.
            Completion::ended(Finished::Succeeded(Some(Box::new(()))))
        });
        *slot = Some(Arc::clone(&completion));
        completion
    }

    /// The completion if this handle holds one already.
    fn held(&self) -> Option<Arc<Completion>> {
        self.completion.lock().clone()
    }

    /// Panics if the calling thread is running this task's handler: it would wait for itself.
    fn refuse_self_wait(&self, what: &str) {
        if current::current_task() == Some(self.id) {
            panic!(
                "TaskHandle::{what} called from the handler of {} on its own task: it would never \
                 return",
                self.id
            );
        }
    }

    /// Tells the store that someone waits for this task's outcome, unless it is known already:
    /// a store whose tasks may end in another process then makes sure to hear of it.
    fn watch(&self) -> Arc<Completion> {
        let store = self.hub.store();
        let completion = self.completion_in(store.as_ref());
        if let Some(store) = store.filter(|_| !completion.is_published()) {
            store.watch(self.id, &completion);
        }
        completion
    }

    /// Whether the submit that returned this handle was deduplicated: its idempotency key
    /// belonged to a task the pool already had, and this is that task's handle (its payload was
    /// dropped). Clones keep the flag.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<u8, u8> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, n: &u8| Ok::<_, HandlerError>(*n)).build()?;
    /// let first = pool.submit(JOB.task(1).key("report-2026-12"))?;
    /// let again = pool.submit(JOB.task(2).key("report-2026-12"))?;
    /// assert!(!first.is_duplicate() && again.is_duplicate());
    /// assert_eq!(again.id(), first.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn is_duplicate(&self) -> bool {
        self.duplicate
    }

    /// The task's id.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let handle = pool.submit(JOB.task(()))?;
    /// handle.wait();
    /// assert_eq!(pool.info(handle.id()).map(|info| info.id), Some(handle.id()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The task's current state.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskState, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let handle = pool.submit(JOB.task(()))?;
    /// handle.wait();
    /// assert_eq!(handle.status(), TaskState::Succeeded);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn status(&self) -> TaskState {
        if let Some(state) = self.held().and_then(|completion| completion.state()) {
            return state;
        }
        match self.hub.store().and_then(|pool| pool.status(self.id)) {
            Some(state) => state,
            // The pool forgot the task between the two reads: a record is dropped only once it is
            // terminal, and its outcome was published in that same step.
            None => self.completion().wait_state(),
        }
    }

    /// Whether the task has reached a terminal state (its outcome is available).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let handle = pool.submit(JOB.task(()))?;
    /// handle.wait();
    /// assert!(handle.is_finished());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn is_finished(&self) -> bool {
        if let Some(completion) = self.held() {
            return completion.state().is_some();
        }
        // Unread: the store knows, without making a completion.
        match self.hub.store().and_then(|pool| pool.status(self.id)) {
            Some(state) => state.is_terminal(),
            None => self.completion().state().is_some(),
        }
    }

    /// Cancels the task; the same as [`Pool::cancel`](crate::Pool::cancel) with this handle's id.
    ///
    /// # Errors
    ///
    /// [`CancelError::PoolGone`] if the pool was dropped, [`CancelError::UnknownTask`] if it
    /// no longer remembers the task.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{CancelReason, HandlerError, Outcome, Pool, TaskType};
    ///
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let handle = pool.submit(JOB.task(()).delay(Duration::from_secs(60)))?;
    /// handle.cancel()?;
    /// assert_eq!(handle.wait(), Outcome::Cancelled(CancelReason::Requested));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self) -> Result<CancelOutcome, CancelError> {
        let pool = self.hub.store().ok_or(CancelError::PoolGone(self.id))?;
        pool.cancel(self.id)
    }
}

impl<O: 'static> TaskHandle<O> {
    /// Blocks until the task reaches a terminal state, and returns its outcome, moving the
    /// output out of the pool: no `Clone` needed. For outputs that cannot (or should not) be
    /// cloned.
    ///
    /// # Panics
    ///
    /// If the output was already taken by `join` on another handle to the task, and, like
    /// [`wait`](TaskHandle::wait), if called from the task's own handler. Later
    /// [`wait`](TaskHandle::wait)s on other handles to a task whose output was taken panic too.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::fs::File;
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const OPEN: TaskType<(), File> = TaskType::new("open");
    /// let pool = Pool::builder()
    ///     .workers(1)
    ///     .register(OPEN, |_, _: &()| Ok::<_, HandlerError>(tempfile()?))
    ///     .build()?;
    /// let file: File = pool.submit(OPEN.task(()))?.join().into_result()?;
    /// # fn tempfile() -> std::io::Result<File> { File::open(std::env::current_exe()?) }
    /// # let _ = file;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join(self) -> Outcome<O> {
        self.refuse_self_wait("join");
        let completion = self.watch();
        let id = self.id;
        match completion.wait_with(|finished| take(finished, id)) {
            Outcome::Succeeded(output) => Outcome::Succeeded(
                *output
                    .downcast::<O>()
                    .unwrap_or_else(|_| unreachable!("output type checked at submit")),
            ),
            Outcome::Failed(failure) => Outcome::Failed(failure),
            Outcome::Cancelled(reason) => Outcome::Cancelled(reason),
        }
    }
}

impl<O: Clone + 'static> TaskHandle<O> {
    /// Blocks until the task reaches a terminal state, and returns its outcome.
    ///
    /// # Waiting from a handler
    ///
    /// A handler that waits on another task of its own pool holds a worker while it waits: if
    /// every worker waits so, or the task waited on is queued behind the waiting handler, the
    /// wait lasts until the pool's shutdown deadline cancels what is queued. Express such an
    /// order with [`Task::after`](crate::Task::after) instead. A handler waiting on its *own*
    /// task can never return: that panics, failing the task with a message that says so.
    ///
    /// # Panics
    ///
    /// If called from the task's own handler, or if the output was taken by
    /// [`join`](TaskHandle::join). A panic in the output's `Clone` reaches the caller (the pool
    /// is not involved: the clone runs on the waiting thread, under the task's own small lock,
    /// never the pool's). That `Clone` may call the pool, but not read this same task's handles:
    /// it would wait for itself.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const NEG: TaskType<i32, i32> = TaskType::new("neg");
    /// let pool = Pool::builder().workers(1).register(NEG, |_, n: &i32| Ok::<_, HandlerError>(-n)).build()?;
    /// assert_eq!(pool.submit(NEG.task(4))?.wait().succeeded(), Some(-4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(&self) -> Outcome<O> {
        self.refuse_self_wait("wait");
        let completion = self.watch();
        let id = self.id;
        completion.wait_with(|finished| read(finished, id))
    }

    /// Like [`wait`](TaskHandle::wait), but gives up after `timeout` (real time, not the pool's
    /// clock) and returns `None`. A timeout too long to represent waits without one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let later = pool.submit(JOB.task(()).delay(Duration::from_secs(60)))?;
    /// assert_eq!(later.wait_timeout(Duration::from_millis(1)), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Outcome<O>> {
        let Some(deadline) = Instant::now().checked_add(timeout) else {
            return Some(self.wait());
        };
        self.refuse_self_wait("wait_timeout");
        let completion = self.watch();
        let id = self.id;
        completion.wait_until_with(deadline, |finished| read(finished, id))
    }

    /// The outcome if the task has finished, without blocking.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// let later = pool.submit(JOB.task(()).delay(Duration::from_secs(60)))?;
    /// assert_eq!(later.try_wait(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn try_wait(&self) -> Option<Outcome<O>> {
        let completion = self.watch();
        let id = self.id;
        completion.try_with(|finished| read(finished, id))
    }
}

/// The outcome, with a clone of the output (user code, run on the reader's thread under the
/// completion's lock only).
fn read<O: Clone + 'static>(finished: &mut Finished, id: TaskId) -> Outcome<O> {
    match finished {
        Finished::Succeeded(output) => Outcome::Succeeded(
            output
                .as_ref()
                .unwrap_or_else(|| taken(id))
                .downcast_ref::<O>()
                .expect("output type checked at submit")
                .clone(),
        ),
        Finished::Failed(failure) => Outcome::Failed(Failure::clone(failure)),
        Finished::Cancelled(reason) => Outcome::Cancelled(*reason),
    }
}

/// Moves the outcome out (the output, if any, is taken for good), as a box to be downcast
/// outside the lock.
fn take(finished: &mut Finished, id: TaskId) -> Outcome<Box<dyn Any + Send + Sync>> {
    match finished {
        Finished::Succeeded(output) => {
            Outcome::Succeeded(output.take().unwrap_or_else(|| taken(id)))
        }
        Finished::Failed(failure) => Outcome::Failed(Failure::clone(failure)),
        Finished::Cancelled(reason) => Outcome::Cancelled(*reason),
    }
}

impl<O> From<&TaskHandle<O>> for Dependency {
    fn from(handle: &TaskHandle<O>) -> Self {
        Dependency::of_handle(handle.id(), handle.completion())
    }
}

impl<O> From<TaskHandle<O>> for Dependency {
    fn from(handle: TaskHandle<O>) -> Self {
        Dependency::from(&handle)
    }
}

/// What [`Pool::resubmit_with_dependents`](crate::Pool::resubmit_with_dependents) did: the dead
/// letter's new task, and the dependents its failure had cancelled, brought back.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use tasq::{HandlerError, Pool, TaskType};
///
/// static UP: AtomicBool = AtomicBool::new(false);
/// const FETCH: TaskType<(), u32> = TaskType::new("fetch");
/// const PARSE: TaskType<(), ()> = TaskType::new("parse");
/// let pool = Pool::builder()
///     .workers(1)
///     .register(FETCH, |_, _: &()| {
///         if UP.load(Ordering::SeqCst) { Ok(7) } else { Err(HandlerError::permanent("down")) }
///     })
///     .register(PARSE, |_, _: &()| Ok::<_, HandlerError>(()))
///     .build()?;
/// let fetch = pool.submit(FETCH.task(()))?;
/// let parse = pool.submit(PARSE.task(()).after([&fetch]))?;
/// assert!(parse.wait().is_cancelled());
///
/// UP.store(true, Ordering::SeqCst);
/// let again = pool.resubmit_with_dependents(FETCH, fetch.id())?;
/// assert_eq!(again.task.wait().succeeded(), Some(7));
/// assert_eq!(again.dependents.len(), 1);
/// let (old, new) = again.dependents[0];
/// assert_eq!(old, parse.id());
/// assert!(pool.handle(PARSE, new).unwrap().wait().is_succeeded());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Resubmitted<O> {
    /// The dead letter's new task.
    pub task: TaskHandle<O>,
    /// Each dependent brought back: its old id and its new one, dependencies first.
    pub dependents: Vec<(TaskId, TaskId)>,
}

/// The panic of a read after [`TaskHandle::join`] took the output.
fn taken(id: TaskId) -> ! {
    panic!("the output of {id} was already taken by TaskHandle::join")
}

impl<O> Clone for TaskHandle<O> {
    fn clone(&self) -> Self {
        // The clones share one completion, made now if this handle had none: the store keeps
        // an outcome for one unread handle per task, not for a count of them.
        TaskHandle {
            id: self.id,
            completion: Mutex::new(Some(self.completion())),
            hub: Arc::clone(&self.hub),
            duplicate: self.duplicate,
            _output: PhantomData,
        }
    }
}

impl<O> Drop for TaskHandle<O> {
    /// An unread handle tells the store it is gone, so that it stops keeping the outcome. The
    /// completion this handle drops (its own, or the one kept for it once the pool is gone)
    /// may be the last reference to the output, whose `Drop` is user code: dropped inside
    /// `catch_unwind`, as the pool drops every user value.
    fn drop(&mut self) {
        match self.completion.get_mut().take() {
            Some(completion) => crate::unwind::drop_quietly(completion),
            None => crate::unwind::drop_quietly(
                self.hub
                    .handle_dropped(self.id.seq(), |store| store.take_in_dropped()),
            ),
        }
    }
}

impl<O> fmt::Debug for TaskHandle<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("id", &self.id)
            .field("finished", &self.is_finished())
            .finish()
    }
}
