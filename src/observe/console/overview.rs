//! The figures of a whole queue for an operator: what [`Stats`](crate::Stats) gives, split
//! further (by state, queue, type and priority, with the last minutes' outcomes), and what a
//! fleet shares (pauses, queue limits, breakers). Read by [`Pool::overview`](crate::Pool::overview)
//! on either store, and by `postgres::Admin::overview` without a pool.

use std::time::{Duration, SystemTime};

use crate::gates::breaker::BreakerState;
use crate::model::pause::Paused;

/// Rows counted at most in one range of an [`Overview`] on the durable store; a count that
/// reaches it is shown as at least this many (`estimated`). The embedded store counts exactly.
pub const COUNT_CAP: usize = 10_000;

/// How many tasks are in each state. A figure that reached [`COUNT_CAP`] is the planner's
/// estimate instead, and [`Overview::estimated`] says so.
///
/// # Examples
///
/// ```
/// let counts = tasq::console::StateCounts::default();
/// assert_eq!(counts.total(), 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateCounts {
    /// Waiting for their dependencies.
    pub blocked: usize,
    /// Due, waiting for a worker.
    pub ready: usize,
    /// Due later (delayed, or a retry in its backoff).
    pub scheduled: usize,
    /// Held by a worker.
    pub running: usize,
    /// Succeeded and kept (retention).
    pub succeeded: usize,
    /// Failed and kept, the dead letters among them.
    pub failed: usize,
    /// Cancelled and kept.
    pub cancelled: usize,
    /// Dead letters: failed tasks kept for an operator to retry or purge.
    pub dead: usize,
}

impl StateCounts {
    /// Every row counted once (dead letters are among the failed).
    ///
    /// # Examples
    ///
    /// ```
    /// let mut counts = tasq::console::StateCounts::default();
    /// counts.ready = 2;
    /// counts.failed = 1;
    /// counts.dead = 1;
    /// assert_eq!(counts.total(), 3);
    /// ```
    pub fn total(&self) -> usize {
        self.blocked
            + self.ready
            + self.scheduled
            + self.running
            + self.succeeded
            + self.failed
            + self.cancelled
    }
}

/// One queue's backlog and what the fleet set for it.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// for queue in admin.overview()?.queues {
///     println!("{}: {} ready, {} running, paused: {}", queue.name, queue.ready, queue.running, queue.paused);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueOverview {
    /// The queue's name.
    pub name: String,
    /// Its due tasks waiting for a worker.
    pub ready: usize,
    /// Its tasks running now.
    pub running: usize,
    /// How long its oldest due task has waited.
    pub oldest_ready: Option<Duration>,
    /// Whether the fleet has paused it.
    pub paused: bool,
    /// The fleet's limit on its running tasks, if any.
    pub limit: Option<u32>,
}

/// One task type's backlog, running tasks and dead letters.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// for t in admin.overview()?.types {
///     println!("{}: {} ready, {} dead", t.name, t.ready, t.dead);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TypeOverview {
    /// The type's name, as its rows hold it.
    pub name: String,
    /// Its due tasks waiting for a worker.
    pub ready: usize,
    /// Its tasks running now.
    pub running: usize,
    /// Its dead letters.
    pub dead: usize,
    /// How long its oldest due task has waited.
    pub oldest_ready: Option<Duration>,
    /// Whether the fleet has paused it.
    pub paused: bool,
}

/// The tasks that finished in one minute (those still in the table: retention may have removed
/// some of an older minute's).
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let last = admin.overview()?.minutes.last().copied();
/// if let Some(minute) = last {
///     println!("{} succeeded, {} failed this minute", minute.succeeded, minute.failed);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Minute {
    /// The minute's start, by the database's clock.
    pub at: SystemTime,
    /// Tasks that succeeded in it.
    pub succeeded: usize,
    /// Tasks that failed for good in it (dead letters included).
    pub failed: usize,
    /// Tasks cancelled in it.
    pub cancelled: usize,
    /// Whether it was counted whole: in a queue that finished more than [`COUNT_CAP`] tasks
    /// in the last minutes, only the newest are read, and the older minutes are floors (or
    /// zero, unknown). [`Overview::throughput`] then measures the rate from those read.
    pub complete: bool,
}

/// A downstream's circuit breaker, as the fleet shares it.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// for breaker in admin.overview()?.breakers {
///     println!("{}: {:?} after {} failures", breaker.downstream, breaker.state, breaker.consecutive_failures);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerOverview {
    /// The downstream's name.
    pub downstream: String,
    /// Closed, open or half open.
    pub state: BreakerState,
    /// Failures in a row counted toward opening it.
    pub consecutive_failures: u32,
    /// When it last opened, if it is open or half open.
    pub opened_at: Option<SystemTime>,
}

/// A whole queue at a glance: what [`Pool::overview`](crate::Pool::overview) and `postgres::Admin::overview` reads.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let overview = admin.overview()?;
/// println!(
///     "{} ready (oldest {:?}), {} running, {} dead letters{}",
///     overview.states.ready,
///     overview.oldest_ready,
///     overview.states.running,
///     overview.states.dead,
///     if overview.estimated { " (estimated)" } else { "" },
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Overview {
    /// The database's time when the figures were read.
    pub at: SystemTime,
    /// Tasks in each state.
    pub states: StateCounts,
    /// Whether a figure reached [`COUNT_CAP`] and shows an estimate or a floor instead.
    pub estimated: bool,
    /// How long the oldest due task has waited.
    pub oldest_ready: Option<Duration>,
    /// Due tasks by priority, highest first.
    pub ready_by_priority: Vec<(u8, usize)>,
    /// Every queue with tasks ready or running, paused or limited, by name.
    pub queues: Vec<QueueOverview>,
    /// Every type with tasks ready or running, dead letters or a pause, by name.
    pub types: Vec<TypeOverview>,
    /// The last minutes' outcomes, oldest first (the current minute last, still counting).
    pub minutes: Vec<Minute>,
    /// Tasks finished a second, over the last minutes (or, in a queue busier than
    /// [`COUNT_CAP`] endings in that time, over the time its newest endings took).
    pub throughput: f64,
    /// What is paused, for the whole fleet.
    pub paused: Vec<Paused>,
    /// The downstreams' breakers.
    pub breakers: Vec<BreakerOverview>,
}
