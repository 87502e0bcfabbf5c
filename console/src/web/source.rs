//! Where the dashboard reads and acts: a queue behind [`Source`]. The durable store's
//! [`Admin`] is one; each method is one of its calls.

use tasq::postgres::{
    Admin, AdminError, BulkOutcome, DeadFilter, Overview, TaskDetail, TaskPage, TaskQuery,
};
use tasq::{CancelOutcome, PauseTarget, ScheduleInfo, TaskId};

/// A queue the dashboard shows and steers. Every method's error is a line for a person.
///
/// # Examples
///
/// ```no_run
/// use tasq_console::web::Source;
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let overview = Source::overview(&admin)?;
/// println!("{} ready", overview.states.ready);
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
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

impl Source for Admin {
    fn overview(&self) -> Result<Overview, String> {
        Admin::overview(self).map_err(text)
    }

    fn tasks(&self, query: &TaskQuery) -> Result<TaskPage, String> {
        Admin::tasks(self, query).map_err(text)
    }

    fn task(&self, id: TaskId) -> Result<Option<TaskDetail>, String> {
        Admin::task(self, id).map_err(text)
    }

    fn task_id(&self, seq: u64) -> TaskId {
        Admin::task_id(self, seq)
    }

    fn retry(&self, id: TaskId) -> Result<TaskId, String> {
        Admin::retry(self, id)
            .map(|retried| retried.id)
            .map_err(text)
    }

    fn purge(&self, id: TaskId) -> Result<bool, String> {
        Admin::purge(self, id).map_err(|e: AdminError| text(e))
    }

    fn retry_dead(&self, filter: &DeadFilter, dry_run: bool) -> Result<BulkOutcome, String> {
        Admin::retry_dead(self, filter, dry_run).map_err(text)
    }

    fn purge_dead(&self, filter: &DeadFilter, dry_run: bool) -> Result<BulkOutcome, String> {
        Admin::purge_dead(self, filter, dry_run).map_err(text)
    }

    fn cancel(&self, id: TaskId) -> Result<CancelOutcome, String> {
        Admin::cancel(self, id).map_err(text)
    }

    fn pause(&self, target: &PauseTarget) -> Result<bool, String> {
        Admin::pause(self, target).map_err(text)
    }

    fn resume(&self, target: &PauseTarget) -> Result<bool, String> {
        Admin::resume(self, target).map_err(text)
    }

    fn schedules(&self) -> Result<Vec<ScheduleInfo>, String> {
        Admin::schedules(self).map_err(text)
    }
}
