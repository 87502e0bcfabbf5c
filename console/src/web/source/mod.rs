//! Where the dashboard reads and acts: a queue behind [`Source`]. A durable queue's
//! `tasq::postgres::Admin` is one (`admin.rs`, feature `postgres`), and a pool of either store
//! in the program's own process, shared as an `Arc<Pool>`, is another (`pool.rs`); each method
//! is one of their calls.

#[cfg(feature = "postgres")]
mod admin;
mod pool;

use tasq::console::{BulkOutcome, DeadFilter, Overview, TaskDetail, TaskPage, TaskQuery};
use tasq::{CancelOutcome, PauseTarget, ScheduleInfo, TaskId};

/// A queue the dashboard shows and steers. Every method's error is a line for a person.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tasq::{HandlerError, Pool, TaskType};
/// use tasq_console::web::Source;
///
/// const JOB: TaskType<u32, ()> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, _: &u32| Ok::<_, HandlerError>(())).build()?;
/// let source = Arc::new(pool);
/// let overview = Source::overview(&source)?;
/// assert_eq!(overview.types[0].name, "job");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Source: Send + Sync + 'static {
    /// The queue's figures.
    fn overview(&self) -> Result<Overview, String>;
    /// A page of tasks.
    fn tasks(&self, query: &TaskQuery) -> Result<TaskPage, String>;
    /// One task in full, `None` if there is no such task.
    fn task(&self, id: TaskId) -> Result<Option<TaskDetail>, String>;
    /// The task numbered `seq` in this queue.
    fn task_id(&self, seq: u64) -> TaskId;
    /// Retries a dead letter; returns the new task.
    fn retry(&self, id: TaskId) -> Result<TaskId, String>;
    /// Purges a dead letter; `false` if it is not one.
    fn purge(&self, id: TaskId) -> Result<bool, String>;
    /// Retries (or, dry, lists) the dead letters `filter` keeps.
    fn retry_dead(&self, filter: &DeadFilter, dry_run: bool) -> Result<BulkOutcome, String>;
    /// Purges (or, dry, lists) the dead letters `filter` keeps.
    fn purge_dead(&self, filter: &DeadFilter, dry_run: bool) -> Result<BulkOutcome, String>;
    /// Cancels a task.
    fn cancel(&self, id: TaskId) -> Result<CancelOutcome, String>;
    /// Pauses a queue, type or schedule; `false` if it was paused.
    fn pause(&self, target: &PauseTarget) -> Result<bool, String>;
    /// Resumes it; `false` if it was not paused.
    fn resume(&self, target: &PauseTarget) -> Result<bool, String>;
    /// The periodic tasks.
    fn schedules(&self) -> Result<Vec<ScheduleInfo>, String>;
    /// Who a pause reaches, as the page says it after the verb: `" for the fleet"` for a
    /// durable queue, nothing where the source cannot tell.
    fn pause_reach(&self) -> &'static str {
        ""
    }
}
