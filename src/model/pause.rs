//! Pausing: what can be paused (a task type, or a queue of types), what a listing of pauses
//! says, why a pause or resume is refused, and the rules for a queue's name.

use std::fmt;
use std::time::SystemTime;

/// The queue of a type that names none ([`TypeOptions::queue`](crate::TypeOptions::queue)).
///
/// # Examples
///
/// ```
/// assert_eq!(tasq::DEFAULT_QUEUE, "default");
/// ```
pub const DEFAULT_QUEUE: &str = "default";

/// The longest name a queue may have, in bytes.
pub(crate) const MAX_QUEUE_NAME: usize = 63;

/// What a pause holds back: every task of one type, or of every type in one queue.
///
/// # Examples
///
/// ```
/// use tasq::PauseTarget;
///
/// let target = PauseTarget::queue("mail");
/// assert_eq!(target.to_string(), "queue mail");
/// assert_eq!(PauseTarget::task_type("resize").name(), "resize");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PauseTarget {
    /// Every task of the task type of this name.
    Type(String),
    /// Every task of the types in the queue of this name.
    Queue(String),
    /// The periodic task of this name (see [`Schedule`](crate::Schedule)): no slot of it is
    /// submitted while it is paused; on resume, its missed slots follow its
    /// [`Missed`](crate::Missed) policy.
    Schedule(String),
}

impl PauseTarget {
    /// The task type named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let target = tasq::PauseTarget::task_type("resize");
    /// assert_eq!(target, tasq::PauseTarget::Type("resize".into()));
    /// ```
    pub fn task_type(name: impl Into<String>) -> Self {
        PauseTarget::Type(name.into())
    }

    /// The queue named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let target = tasq::PauseTarget::queue("mail");
    /// assert_eq!(target, tasq::PauseTarget::Queue("mail".into()));
    /// ```
    pub fn queue(name: impl Into<String>) -> Self {
        PauseTarget::Queue(name.into())
    }

    /// The schedule named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let target = tasq::PauseTarget::schedule("nightly");
    /// assert_eq!(target.to_string(), "schedule nightly");
    /// ```
    pub fn schedule(name: impl Into<String>) -> Self {
        PauseTarget::Schedule(name.into())
    }

    /// The type's, the queue's or the schedule's name.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::PauseTarget::queue("mail").name(), "mail");
    /// ```
    pub fn name(&self) -> &str {
        match self {
            PauseTarget::Type(name) | PauseTarget::Queue(name) | PauseTarget::Schedule(name) => {
                name
            }
        }
    }

    /// `"type"`, `"queue"` or `"schedule"`: how the durable store's rows name the kind.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            PauseTarget::Type(_) => "type",
            PauseTarget::Queue(_) => "queue",
            PauseTarget::Schedule(_) => "schedule",
        }
    }

    /// Checks the name: a queue's by [`check_queue_name`]; a type's must not be empty.
    pub(crate) fn check(&self) -> Result<(), PauseError> {
        let problem = match self {
            PauseTarget::Type(name) if name.is_empty() => Some("is empty"),
            PauseTarget::Type(_) => None,
            PauseTarget::Queue(name) | PauseTarget::Schedule(name) => check_queue_name(name).err(),
        };
        match problem {
            Some(problem) => Err(PauseError::InvalidName {
                target: self.clone(),
                problem,
            }),
            None => Ok(()),
        }
    }
}

impl fmt::Display for PauseTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.name())
    }
}

/// One pause in force, as [`Pool::paused`](crate::Pool::paused) lists it.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, PauseTarget, Pool, TaskType};
///
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// pool.pause(PauseTarget::task_type("job"))?;
/// let paused = pool.paused()?;
/// assert_eq!(paused[0].target, PauseTarget::task_type("job"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Paused {
    /// What is paused.
    pub target: PauseTarget,
    /// When it was paused: by this process's clock on the embedded store, by the database's
    /// on the durable one.
    pub since: SystemTime,
}

/// Why a pause, a resume or a listing of pauses was refused.
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, PauseError, PauseTarget, Pool, TaskType};
///
/// const JOB: TaskType<(), ()> = TaskType::new("job");
/// let pool = Pool::builder().register(JOB, |_, _: &()| Ok::<_, HandlerError>(())).build()?;
/// let missing = PauseTarget::task_type("nope");
/// assert_eq!(pool.pause(missing.clone()), Err(PauseError::Unknown(missing)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PauseError {
    /// The embedded store knows no such type or queue (its pool registered none). The durable
    /// store takes any valid name: another process of the fleet may serve it.
    #[error("this pool has no {0}")]
    Unknown(PauseTarget),
    /// The name is not one a type or queue can have.
    #[error("the name of {target} {problem}")]
    InvalidName {
        /// What was named.
        target: PauseTarget,
        /// What is wrong with the name.
        problem: &'static str,
    },
    /// The durable store failed; a pause or resume that fails this way changed nothing, unless
    /// the connection broke as it committed (then [`Pool::paused`](crate::Pool::paused) says).
    #[error("the store failed: {0}")]
    Store(String),
}

/// Whether `name` is a queue's name: 1 to 63 bytes of ASCII letters, digits, `_`, `-` and
/// `.`. Otherwise, what is wrong with it.
pub(crate) fn check_queue_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > MAX_QUEUE_NAME {
        return Err("is longer than 63 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err("has a character other than ASCII letters, digits, _, - and .");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_checked() {
        assert_eq!(check_queue_name("mail-2.eu_west"), Ok(()));
        assert_eq!(check_queue_name(""), Err("is empty"));
        assert!(check_queue_name(&"q".repeat(63)).is_ok());
        assert!(check_queue_name(&"q".repeat(64)).is_err());
        assert!(check_queue_name("a b").is_err());
        assert!(check_queue_name("é").is_err());
        assert!(PauseTarget::task_type("").check().is_err());
        assert!(PauseTarget::task_type("any thing").check().is_ok());
    }
}
