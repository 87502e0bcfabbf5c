//! Limits on how many tasks of a queue run at once: a pool's on the embedded store, the whole
//! fleet's on the durable store ([`Pool::set_queue_limit`](crate::Pool::set_queue_limit)).

use super::pause::check_queue_name;

/// A queue's limit in force: at most `max_running` of its tasks run at once (in the pool on
/// the embedded store, across every process on the durable store). Listed by
/// [`Pool::queue_limits`](crate::Pool::queue_limits).
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, QueueLimit, TaskType, TypeOptions};
///
/// const MAIL: TaskType<(), ()> = TaskType::new("mail");
/// let pool = Pool::builder()
///     .register_with(MAIL, TypeOptions::new().queue("mail"), |_, _: &()| Ok::<_, HandlerError>(()))
///     .build()?;
/// pool.set_queue_limit("mail", Some(2))?;
/// let limits: Vec<QueueLimit> = pool.queue_limits()?;
/// assert_eq!((limits[0].queue.as_str(), limits[0].max_running), ("mail", 2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueLimit {
    /// The queue's name.
    pub queue: String,
    /// At most this many of its tasks run at once.
    pub max_running: u32,
}

/// Why a queue's limit could not be set or read.
///
/// # Examples
///
/// ```
/// use tasq::{Pool, QueueLimitError};
///
/// let pool = Pool::builder().build()?;
/// assert_eq!(
///     pool.set_queue_limit("mail", Some(0)),
///     Err(QueueLimitError::Zero("mail".to_owned()))
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueLimitError {
    /// The embedded store knows no such queue (no type of its pool is in it). The durable
    /// store takes any valid name: another process of the fleet may serve it.
    #[error("this pool has no queue {0:?}")]
    Unknown(String),
    /// The name is not one a queue can have.
    #[error("the queue name {queue:?} {problem}")]
    InvalidName {
        /// The name given.
        queue: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A limit of zero: to start none of a queue's tasks, pause it
    /// ([`Pool::pause`](crate::Pool::pause)).
    #[error("a limit of zero on queue {0:?}: pause the queue instead")]
    Zero(String),
    /// The durable store failed; a change that fails this way changed nothing, unless the
    /// connection broke as it committed (then [`Pool::queue_limits`](crate::Pool::queue_limits)
    /// says).
    #[error("the store failed: {0}")]
    Store(String),
}

/// Checks a queue's name and a limit before either store applies them.
pub(crate) fn check(queue: &str, limit: Option<u32>) -> Result<(), QueueLimitError> {
    if let Err(problem) = check_queue_name(queue) {
        return Err(QueueLimitError::InvalidName {
            queue: queue.to_owned(),
            problem,
        });
    }
    if limit == Some(0) {
        return Err(QueueLimitError::Zero(queue.to_owned()));
    }
    Ok(())
}
