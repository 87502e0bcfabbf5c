//! Task ids: the pool's id and a sequence number, and their text form.

use std::fmt;

/// The id a pool gives a task when it accepts it: the pool's own id and a sequence number,
/// unique within that pool and increasing with submission order.
///
/// An id names its pool, so an id from another pool is refused (as unknown) instead of acting on
/// an unrelated task of this one. Its text form, `task <pool>:<seq>`, parses back with
/// [`str::parse`], so a program can store ids and read them back; [`from_parts`](TaskId::from_parts)
/// builds one from its two numbers.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, TaskId, TaskType};
///
/// const NOOP: TaskType<(), ()> = TaskType::new("noop");
/// let pool = Pool::builder().workers(1).register(NOOP, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// let first = pool.submit(NOOP.task(()))?.id();
/// let second = pool.submit(NOOP.task(()))?.id();
/// assert!(first < second);
/// assert_eq!(first.to_string().parse::<TaskId>()?, first);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    pool: u64,
    seq: u64,
}

impl TaskId {
    /// The id of task `seq` of pool `pool`.
    ///
    /// # Examples
    ///
    /// ```
    /// let id = tasq::TaskId::from_parts(3, 7);
    /// assert_eq!((id.pool(), id.seq()), (3, 7));
    /// assert_eq!(id.to_string(), "task 3:7");
    /// ```
    pub const fn from_parts(pool: u64, seq: u64) -> Self {
        TaskId { pool, seq }
    }

    /// The id of the pool that accepted the task (see [`Pool::id`](crate::Pool::id)).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const NOOP: TaskType<(), ()> = TaskType::new("noop");
    /// let pool = Pool::builder().workers(1).register(NOOP, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// assert_eq!(pool.submit(NOOP.task(()))?.id().pool(), pool.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn pool(self) -> u64 {
        self.pool
    }

    /// The task's number within its pool: 1 for the first task submitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    ///
    /// const NOOP: TaskType<(), ()> = TaskType::new("noop");
    /// let pool = Pool::builder().workers(1).register(NOOP, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
    /// assert_eq!(pool.submit(NOOP.task(()))?.id().seq(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn seq(self) -> u64 {
        self.seq
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {}:{}", self.pool, self.seq)
    }
}

impl std::str::FromStr for TaskId {
    type Err = ParseTaskIdError;

    /// Parses `task <pool>:<seq>` (what `Display` writes) or just `<pool>:<seq>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let text = text.strip_prefix("task ").unwrap_or(text);
        let (pool, seq) = text
            .split_once(':')
            .ok_or_else(|| ParseTaskIdError(s.to_owned()))?;
        match (pool.parse(), seq.parse()) {
            (Ok(pool), Ok(seq)) => Ok(TaskId { pool, seq }),
            _ => Err(ParseTaskIdError(s.to_owned())),
        }
    }
}

/// A string that is not a [`TaskId`]'s text form, `task <pool>:<seq>`.
///
/// # Examples
///
/// ```
/// let err = "task seven".parse::<tasq::TaskId>().unwrap_err();
/// assert_eq!(err.to_string(), "`task seven` is not a task id (expected `task <pool>:<seq>`)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a task id (expected `task <pool>:<seq>`)")]
pub struct ParseTaskIdError(String);
