//! A durable queue read through its rows: each method one of [`Admin`]'s.

use tasq::console::{BulkOutcome, DeadFilter, Overview, TaskDetail, TaskPage, TaskQuery};
use tasq::postgres::{Admin, AdminError};
use tasq::{CancelOutcome, PauseTarget, ScheduleInfo, TaskId};

use super::Source;

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

    fn pause_reach(&self) -> &'static str {
        " for the fleet"
    }
}
