//! Pausing and resuming task types and queues: the pool's operator controls.

use crate::api::pool::Pool;
use crate::model::pause::{PauseError, PauseTarget, Paused};

impl Pool {
    /// Pauses a task type, or every type of a queue ([`TypeOptions::queue`](crate::TypeOptions::queue)):
    /// once this returns, none of its tasks starts until [`resume`](Pool::resume). Tasks
    /// already running finish; new ones are still accepted and wait, ready, burning no
    /// attempt. Returns `Ok(false)` if it was paused already.
    ///
    /// On the embedded store the name must be one of this pool's types or queues
    /// ([`PauseError::Unknown`] otherwise). On the durable store the pause is the whole
    /// fleet's, kept in the database (it survives restarts), and any valid name is taken:
    /// another process may run that type. When it returns, every claim of the fleet has either
    /// committed already or will see the pause; tasks claimed before (a process may hold a
    /// few for its busy workers) still run. A [graceful shutdown](Pool::shutdown) does not run
    /// paused tasks: at its deadline they are cancelled like any task that has not started.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, PauseTarget, Pool, TaskState, TaskType, TypeOptions};
    ///
    /// const SEND: TaskType<String, ()> = TaskType::new("send");
    /// let pool = Pool::builder()
    ///     .register_with(SEND, TypeOptions::new().queue("mail"), |_, _: &String| {
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .build()?;
    /// assert!(pool.pause(PauseTarget::queue("mail"))?);
    /// let handle = pool.submit(SEND.task("hello".into()))?;
    /// pool.wait_idle();
    /// assert_eq!(handle.status(), TaskState::Ready);
    /// pool.resume(PauseTarget::queue("mail"))?;
    /// assert_eq!(handle.wait().state(), TaskState::Succeeded);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pause(&self, target: PauseTarget) -> Result<bool, PauseError> {
        self.store.pause(&target)
    }

    /// Resumes a paused type or queue: its waiting tasks may start at once, and idle workers
    /// are woken for them (on the durable store, every process's, through a notification, or
    /// by its next poll if that is lost). A type paused both itself and through its queue stays
    /// paused until both are resumed. Returns `Ok(false)` if it was not paused.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, PauseTarget, Pool, TaskType};
    ///
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// assert!(!pool.resume(PauseTarget::task_type("job"))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resume(&self, target: PauseTarget) -> Result<bool, PauseError> {
        let resumed = self.store.resume(&target)?;
        if let (PauseTarget::Schedule(_), Some(scheduler)) = (&target, &self.scheduler) {
            // Its missed slots are decided now, not at its next slot.
            scheduler.kick();
        }
        Ok(resumed)
    }

    /// The pauses in force (on the durable store, the whole fleet's), types first, then
    /// queues, each by name.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, PauseTarget, Pool, TaskType};
    ///
    /// const JOB: TaskType<(), ()> = TaskType::new("job");
    /// let pool = Pool::builder().register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// pool.pause(PauseTarget::queue(tasq::DEFAULT_QUEUE))?;
    /// let targets: Vec<PauseTarget> = pool.paused()?.into_iter().map(|p| p.target).collect();
    /// assert_eq!(targets, [PauseTarget::queue("default")]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn paused(&self) -> Result<Vec<Paused>, PauseError> {
        self.store.paused()
    }
}
