//! Tasks for an operator: a page at a time by state, type, queue or key, and one in full.
//!
//! A page is a keyset page in id order (`id > after`), read through the same index shapes as
//! `Pool::tasks` (see `tasks_page` in `publish.rs`); a key's rows through `tasq_live_keys` and
//! `tasq_ended_keys`. A queue, which no index of the finished rows holds, is kept from at
//! most [`SCAN`] rows of the shape, so a page that finds few returns short with where to go
//! on ([`TaskPage::next`]) rather than reading the table.

use std::time::SystemTime;

use serde_json::Value;

use super::connect::{Admin, AdminError, SCAN};
use crate::model::id::TaskId;
use crate::model::state::TaskState;
use crate::observe::console::tasks::{Moment, Related, TaskDetail, TaskPage, TaskQuery, TaskRow};
use crate::store::postgres::conn::Sql;
use crate::store::postgres::{publish, rows};

/// The columns of a [`TaskRow`], of the row `t`.
pub(super) const ROW_COLUMNS: &str = "t.id, t.type, t.queue, t.status, t.run_at <= tasq_now(), t.dead, \
     COALESCE(t.base_priority, t.priority), t.attempts, t.max_attempts, t.run_at, t.key, \
     t.last_error, t.created_at, t.finished_at";

/// A key's rows after `$1` (at most `$2`), by id, through the two indexes of keys.
pub(super) const BY_KEY: &str = "
    WITH k AS (
        (SELECT id FROM tasq_tasks WHERE key = $3
           AND status IN ('blocked', 'ready', 'running', 'succeeded') AND id > $1
         ORDER BY id LIMIT $2)
        UNION ALL
        (SELECT id FROM tasq_tasks WHERE key = $3
           AND status IN ('failed', 'cancelled') AND id > $1
         ORDER BY id LIMIT $2)
    )
    SELECT {columns} FROM k JOIN tasq_tasks t ON t.id = k.id ORDER BY t.id LIMIT $2";

/// The statements of [`Admin::task`]: the row (`$1` its id), its dependencies, its
/// dependents.
pub(super) fn detail_statements() -> (String, String, String) {
    let row = format!(
        "SELECT {ROW_COLUMNS}, t.payload, t.output, t.lease_id, t.lease_until, \
         t.failure_reason, t.cancel_reason, t.cancel_requested, t.resubmitted_as \
         FROM tasq_tasks t WHERE t.id = $1"
    );
    let related = "SELECT r.id, t.type, t.status, t.run_at <= tasq_now() FROM ( \
         SELECT {pick} AS id FROM tasq_deps WHERE {by} = $1 ORDER BY 1 LIMIT 100) r \
         LEFT JOIN tasq_tasks t ON t.id = r.id ORDER BY r.id";
    let dependencies = related
        .replace("{pick}", "dependency")
        .replace("{by}", "dependent");
    let dependents = related
        .replace("{pick}", "dependent")
        .replace("{by}", "dependency");
    (row, dependencies, dependents)
}

/// The statement of a page of rows of status `ready`, due or not (`$1` after, `$2` limit):
/// ready and scheduled tasks are told apart as they are read, so a page reads at most its
/// limit of index entries however many of the other kind sort before (the pool's own shape
/// filters by due time in the scan, which reads on past any number of the other kind).
pub(super) fn waiting_page() -> String {
    format!(
        "SELECT {ROW_COLUMNS} FROM tasq_tasks t WHERE t.status = 'ready' AND t.id > $1 \
         ORDER BY t.id LIMIT $2"
    )
}

/// The statement of a page of dead letters: `$1` after, `$2` limit.
pub(super) fn dead_page() -> String {
    format!(
        "SELECT {ROW_COLUMNS} FROM tasq_tasks t WHERE t.dead AND t.id > $1 ORDER BY t.id LIMIT $2"
    )
}

impl Admin {
    /// A page of tasks, by id: those after [`TaskQuery::after`] that every filter of `query`
    /// keeps. A page with a queue filter reads at most [`SCAN`] rows of its state or type, so
    /// it may hold fewer tasks than the limit while [`TaskPage::next`] says there may be more.
    ///
    /// # Errors
    ///
    /// [`AdminError::Db`] when the database cannot be read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::console::TaskQuery;
    /// use tasq::postgres::Admin;
    /// let admin = Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let dead = admin.tasks(&TaskQuery::new().dead().task_type("email"))?;
    /// assert!(dead.tasks.iter().all(|t| t.dead && t.task_type == "email"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tasks(&self, query: &TaskQuery) -> Result<TaskPage, AdminError> {
        // An id of another queue starts this one's from its beginning or its end.
        let after: i64 = match query.after {
            None => 0,
            Some(id) => self
                .seq(id)
                .unwrap_or(if id.pool() < self.queue { 0 } else { i64::MAX }),
        };
        let waiting = query.key.is_none()
            && matches!(
                query.filter.get_state(),
                Some(TaskState::Ready | TaskState::Scheduled)
            );
        // The dead letters' shape keeps neither a type nor a queue: those are kept here.
        let dead_sifted =
            query.dead && query.key.is_none() && query.filter.get_task_type().is_some();
        let sifted = query.queue.is_some() || dead_sifted || waiting;
        let read = if sifted { SCAN } else { query.limit } as i64;
        let rows = match &query.key {
            Some(key) => {
                let sql = BY_KEY.replace("{columns}", ROW_COLUMNS);
                self.run(|c| c.query(sql.as_str(), &[&after, &read, key]))?
            }
            None if waiting => {
                let sql = waiting_page();
                self.run(|c| c.query(sql.as_str(), &[&after, &read]))?
            }
            None if query.dead => {
                let sql = dead_page();
                self.run(|c| c.query(sql.as_str(), &[&after, &read]))?
            }
            None => {
                let by_type = query.filter.get_task_type();
                let sql =
                    publish::page_of(ROW_COLUMNS, query.filter.get_state(), by_type.is_some());
                self.run(|c| match &by_type {
                    Some(name) => c.query(sql.as_str(), &[&after, &read, name]),
                    None => c.query(sql.as_str(), &[&after, &read]),
                })?
            }
        };
        let scanned = rows.len();
        let last_scanned = rows.last().map(|row| row.get::<_, i64>(0));
        let mut tasks = Vec::with_capacity(query.limit.min(scanned));
        for row in &rows {
            let task = self.row_of(row);
            let keep = query.filter.keeps(task.state, &task.task_type)
                && query.queue.as_ref().is_none_or(|q| *q == task.queue)
                && (!query.dead || task.dead);
            if keep {
                tasks.push(task);
                if tasks.len() == query.limit {
                    break;
                }
            }
        }
        let next = if tasks.len() == query.limit {
            tasks.last().map(|t| t.id)
        } else if scanned as i64 == read {
            last_scanned.map(|seq| self.id(seq))
        } else {
            None
        };
        Ok(TaskPage { tasks, next })
    }

    /// The task `id` in full, or `None` when this queue holds no such row (never submitted
    /// here, or removed by retention or a purge).
    ///
    /// # Errors
    ///
    /// [`AdminError::Db`] when the database cannot be read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// assert!(admin.task(admin.task_id(u64::MAX >> 1))?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn task(&self, id: TaskId) -> Result<Option<TaskDetail>, AdminError> {
        let Some(seq) = self.seq(id) else {
            return Ok(None);
        };
        let (sql, dependencies, dependents) = detail_statements();
        let found = self.run(|c| {
            let Some(row) = c.query_opt(sql.as_str(), &[&seq])? else {
                return Ok(None);
            };
            let deps = c.query(dependencies.as_str(), &[&seq])?;
            let dependents = c.query(dependents.as_str(), &[&seq])?;
            Ok(Some((row, deps, dependents)))
        })?;
        let Some((row, deps, dependents)) = found else {
            return Ok(None);
        };
        let related = |rows: &[postgres::Row]| -> Vec<Related> {
            rows.iter()
                .map(|r| Related {
                    id: self.id(r.get(0)),
                    task: r
                        .get::<_, Option<String>>(1)
                        .map(|name| (name, rows::state_of(r.get(2), r.get(3)))),
                })
                .collect()
        };
        let task = self.row_of(&row);
        let lease_until: Option<SystemTime> = row.get(17);
        let (created_at, run_at): (SystemTime, SystemTime) = (row.get(12), row.get(9));
        let mut timeline = vec![Moment {
            at: created_at,
            what: "submitted",
        }];
        if run_at > created_at {
            timeline.push(Moment {
                at: run_at,
                what: "due",
            });
        }
        if let (TaskState::Running, Some(until)) = (task.state, lease_until) {
            timeline.push(Moment {
                at: until,
                what: "lease ends",
            });
        }
        if let Some(at) = task.finished_at {
            let what = match task.state {
                TaskState::Succeeded => "succeeded",
                TaskState::Cancelled => "cancelled",
                _ => "failed",
            };
            timeline.push(Moment { at, what });
        }
        timeline.sort_by_key(|m| m.at);
        Ok(Some(TaskDetail {
            payload: Some(
                row.get::<_, Option<Value>>(14)
                    .unwrap_or(Value::Null)
                    .to_string(),
            ),
            output: row.get::<_, Option<Value>>(15).map(|v| v.to_string()),
            lease_id: row.get(16),
            lease_until,
            failure_reason: row.get(18),
            cancel_reason: row.get(19),
            cancel_requested: row.get(20),
            resubmitted_as: row.get::<_, Option<i64>>(21).map(|s| self.id(s)),
            dependencies: related(&deps),
            dependents: related(&dependents),
            timeline,
            row: task,
        }))
    }

    /// A row read with [`ROW_COLUMNS`] first.
    fn row_of(&self, row: &postgres::Row) -> TaskRow {
        TaskRow {
            id: self.id(row.get(0)),
            task_type: row.get(1),
            queue: row.get(2),
            state: rows::state_of(row.get(3), row.get(4)),
            dead: row.get(5),
            priority: u8::try_from(row.get::<_, i16>(6)).unwrap_or(0),
            attempts: u32::try_from(row.get::<_, i32>(7)).unwrap_or(0),
            max_attempts: u32::try_from(row.get::<_, i32>(8)).unwrap_or(0),
            run_at: Some(row.get(9)),
            key: row.get(10),
            last_error: row.get(11),
            created_at: Some(row.get(12)),
            finished_at: row.get(13),
        }
    }
}
