//! Queues with workers of their own ([`Builder::queue`]) and queue limits
//! ([`Pool::set_queue_limit`]).
//!
//! The lanes themselves are made when the pool is built (`Registry::set_lanes`).
//!
//! A pool that names no queue has one set of workers serving every queue. Naming one gives the
//! pool *lanes*: lane 0, the shared one, has the [`Builder::workers`] threads and serves every
//! queue not named; each named queue has a lane of its own. The pool's threads are the sum. The
//! stores keep each lane to its workers: the embedded store with a concurrency gate per lane
//! (`store/memory/gate.rs`), the durable store by claiming for each lane only its queues' rows,
//! as many as it has free workers (`store/postgres/dispatch.rs`).

use super::builder::Builder;
use crate::api::pool::Pool;
use crate::model::queue_limit::{QueueLimit, QueueLimitError};

impl<S> Builder<S> {
    /// Gives queue `name` `workers` threads of its own in this pool: at most `workers` of its
    /// tasks run here at once, and they never wait for a worker busy with another queue, so one
    /// slow queue cannot take every worker (River's `Queues: {name: MaxWorkers}`, Oban's
    /// `queues: [name: limit]`). The pool's threads are these plus the
    /// [`workers`](Builder::workers) shared by every queue not named here.
    ///
    /// With `workers(0)`, the pool serves only the queues named here: on the durable store,
    /// the tasks of the other queues are left for the pools that serve them. A type this pool
    /// runs whose queue then has no worker, a zero, a queue named twice or a bad name (1 to 63
    /// ASCII letters, digits, `_`, `-`, `.`) makes [`build`](Builder::build) fail with
    /// [`BuildError::InvalidSetting`](crate::BuildError::InvalidSetting).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{Pool, TaskType, TypeOptions};
    ///
    /// const RESIZE: TaskType<u32, u32> = TaskType::new("resize");
    /// const MAIL: TaskType<String, ()> = TaskType::new("mail");
    ///
    /// let pool = Pool::builder()
    ///     .workers(2) // the shared workers: the "default" queue here
    ///     .queue("mail", 1) // one thread of its own for the mail queue
    ///     .register_with(MAIL, TypeOptions::new().queue("mail"), |_ctx, to: &String| {
    ///         assert!(to.contains('@'));
    ///         Ok(())
    ///     })
    ///     .register(RESIZE, |_ctx, width| Ok(width / 2))
    ///     .build()?;
    /// assert_eq!(pool.stats().workers, 3);
    /// assert_eq!(pool.submit(RESIZE.task(640))?.wait().succeeded(), Some(320));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue(mut self, name: &'static str, workers: usize) -> Self {
        self.queues.push((name, workers));
        self
    }
}

impl Pool {
    /// Limits how many tasks of queue `queue` run at once, or lifts its limit (`None`); returns
    /// the limit before. On the embedded store the limit is this pool's, and the queue must be
    /// one of its types' ([`QueueLimitError::Unknown`] otherwise). On the durable store it is
    /// the whole fleet's: kept in the database, obeyed by every process whatever it was built
    /// with, and it survives restarts; any valid name is taken. Once this returns no new start
    /// takes the queue past the limit (tasks running beyond a lowered one finish); a raised or
    /// lifted one lets waiting tasks start at once (on the durable store, at each pool's next
    /// claim).
    ///
    /// A zero is refused ([`QueueLimitError::Zero`]): [`pause`](Pool::pause) the queue instead.
    /// A queue's workers of its own in a pool ([`Builder::queue`]) bound it in that pool too;
    /// the lower of the two holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType, TypeOptions};
    ///
    /// const EXPORT: TaskType<u32, u32> = TaskType::new("export");
    /// let pool = Pool::builder()
    ///     .workers(4)
    ///     .register_with(EXPORT, TypeOptions::new().queue("exports"), |_, n: &u32| {
    ///         Ok::<_, HandlerError>(*n)
    ///     })
    ///     .build()?;
    /// assert_eq!(pool.set_queue_limit("exports", Some(1))?, None);
    /// let handles: Vec<_> = (0..3).map(|n| pool.submit(EXPORT.task(n))).collect::<Result<_, _>>()?;
    /// for (n, handle) in handles.iter().enumerate() {
    ///     assert_eq!(handle.wait().succeeded(), Some(n as u32)); // one at a time
    /// }
    /// assert_eq!(pool.set_queue_limit("exports", None)?, Some(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_queue_limit(
        &self,
        queue: &str,
        limit: Option<u32>,
    ) -> Result<Option<u32>, QueueLimitError> {
        crate::model::queue_limit::check(queue, limit)?;
        self.store.set_queue_limit(queue, limit)
    }

    /// The queues' limits in force (on the durable store, the fleet's), by name.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = tasq::Pool::builder().build()?;
    /// assert!(pool.queue_limits()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_limits(&self) -> Result<Vec<QueueLimit>, QueueLimitError> {
        self.store.queue_limits()
    }
}
