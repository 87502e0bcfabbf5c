//! A pool in the program's own process, of either store, shared with the dashboard as an
//! `Arc<Pool>`: each method one of the pool's.

use std::sync::Arc;

use tasq::console::{BulkOutcome, DeadFilter, Overview, TaskDetail, TaskPage, TaskQuery};
use tasq::{CancelOutcome, PauseTarget, Pool, ScheduleInfo, TaskId};

use super::Source;

impl Source for Arc<Pool> {
    fn overview(&self) -> Result<Overview, String> {
        Pool::overview(self).map_err(|e| e.to_string())
    }

    fn tasks(&self, query: &TaskQuery) -> Result<TaskPage, String> {
        Ok(self.task_page(query))
    }

    fn task(&self, id: TaskId) -> Result<Option<TaskDetail>, String> {
        Ok(self.task_detail(id))
    }

    fn task_id(&self, seq: u64) -> TaskId {
        TaskId::from_parts(self.id(), seq)
    }

    fn retry(&self, id: TaskId) -> Result<TaskId, String> {
        self.retry_dead_letter(id)
            .map(|retried| retried.id)
            .map_err(|e| e.to_string())
    }

    fn purge(&self, id: TaskId) -> Result<bool, String> {
        Ok(self.purge_dead_letter(id))
    }

    fn retry_dead(&self, filter: &DeadFilter, dry_run: bool) -> Result<BulkOutcome, String> {
        Ok(Pool::retry_dead(self, filter, dry_run))
    }

    fn purge_dead(&self, filter: &DeadFilter, dry_run: bool) -> Result<BulkOutcome, String> {
        Ok(Pool::purge_dead(self, filter, dry_run))
    }

    fn cancel(&self, id: TaskId) -> Result<CancelOutcome, String> {
        Pool::cancel(self, id).map_err(|e| e.to_string())
    }

    fn pause(&self, target: &PauseTarget) -> Result<bool, String> {
        Pool::pause(self, target.clone()).map_err(|e| e.to_string())
    }

    fn resume(&self, target: &PauseTarget) -> Result<bool, String> {
        Pool::resume(self, target.clone()).map_err(|e| e.to_string())
    }

    fn schedules(&self) -> Result<Vec<ScheduleInfo>, String> {
        Pool::schedules(self).map_err(|e| e.to_string())
    }
}
