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

/// The most tasks a page holds.
const MAX_PAGE: usize = 1_000;

/// Which tasks [`Admin::tasks`] lists: every filter given must hold.
///
/// # Examples
///
/// ```
/// use tasq::postgres::TaskQuery;
/// use tasq::TaskState;
///
/// let query = TaskQuery::new().state(TaskState::Failed).task_type("email").limit(50);
/// assert_eq!(query.get_limit(), 50);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskQuery {
    state: Option<TaskState>,
    task_type: Option<String>,
    queue: Option<String>,
    key: Option<String>,
    dead: bool,
    after: Option<TaskId>,
    limit: usize,
}

impl Default for TaskQuery {
    fn default() -> Self {
        TaskQuery {
            state: None,
            task_type: None,
            queue: None,
            key: None,
            dead: false,
            after: None,
            limit: 50,
        }
    }
}

impl TaskQuery {
    /// Every task, 50 a page.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::postgres::TaskQuery::new().get_limit(), 50);
    /// ```
    pub fn new() -> Self {
        TaskQuery::default()
    }

    /// Only tasks in `state`.
    ///
    /// # Examples
    ///
    /// ```
    /// let running = tasq::postgres::TaskQuery::new().state(tasq::TaskState::Running);
    /// # let _ = running;
    /// ```
    pub fn state(mut self, state: TaskState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only tasks of the type named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let emails = tasq::postgres::TaskQuery::new().task_type("email");
    /// # let _ = emails;
    /// ```
    pub fn task_type(mut self, name: impl Into<String>) -> Self {
        self.task_type = Some(name.into());
        self
    }

    /// Only tasks in the queue named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let slow = tasq::postgres::TaskQuery::new().queue("slow");
    /// # let _ = slow;
    /// ```
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queue = Some(name.into());
        self
    }

    /// Only tasks submitted with the idempotency key `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// let order = tasq::postgres::TaskQuery::new().key("order-42");
    /// # let _ = order;
    /// ```
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Only dead letters (failed tasks kept for an operator).
    ///
    /// # Examples
    ///
    /// ```
    /// let dead = tasq::postgres::TaskQuery::new().dead();
    /// # let _ = dead;
    /// ```
    pub fn dead(mut self) -> Self {
        self.dead = true;
        self.state = Some(TaskState::Failed);
        self
    }

    /// The page after the task `id` (the previous page's [`TaskPage::next`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let id = tasq::TaskId::from_parts(1, 100);
    /// let next = tasq::postgres::TaskQuery::new().after(id);
    /// # let _ = next;
    /// ```
    pub fn after(mut self, id: TaskId) -> Self {
        self.after = Some(id);
        self
    }

    /// At most `limit` tasks a page (1 to 1,000; 50 unless set).
    ///
    /// # Examples
    ///
    /// ```
    /// let query = tasq::postgres::TaskQuery::new().limit(5_000);
    /// assert_eq!(query.get_limit(), 1_000);
    /// ```
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit.clamp(1, MAX_PAGE);
        self
    }

    /// The page size.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tasq::postgres::TaskQuery::new().limit(0).get_limit(), 1);
    /// ```
    pub fn get_limit(&self) -> usize {
        self.limit
    }
}

/// One task as a list shows it.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// for row in admin.tasks(&tasq::postgres::TaskQuery::new())?.tasks {
///     println!("{} {} {:?} attempt {}/{}", row.id, row.task_type, row.state, row.attempts, row.max_attempts);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskRow {
    /// The task's id.
    pub id: TaskId,
    /// Its type's name, as its row holds it.
    pub task_type: String,
    /// Its queue.
    pub queue: String,
    /// Its state now, by the database's clock.
    pub state: TaskState,
    /// Whether it is a dead letter.
    pub dead: bool,
    /// Its own priority (not the one aging raised it to).
    pub priority: u8,
    /// Attempts started.
    pub attempts: u32,
    /// Attempts it may have.
    pub max_attempts: u32,
    /// When it is or was due.
    pub run_at: SystemTime,
    /// Its idempotency key.
    pub key: Option<String>,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When it was submitted.
    pub created_at: SystemTime,
    /// When it finished, if it has.
    pub finished_at: Option<SystemTime>,
}

/// A page of [`Admin::tasks`].
///
/// # Examples
///
/// ```no_run
/// use tasq::postgres::{Admin, TaskQuery};
/// let admin = Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let mut query = TaskQuery::new().limit(100);
/// loop {
///     let page = admin.tasks(&query)?;
///     println!("{} tasks", page.tasks.len());
///     match page.next {
///         Some(next) => query = query.after(next),
///         None => break,
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskPage {
    /// The tasks, by id.
    pub tasks: Vec<TaskRow>,
    /// Where the next page starts (`TaskQuery::after`), if there may be one.
    pub next: Option<TaskId>,
}

/// A dependency or dependent of a task.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// if let Some(task) = admin.task(admin.task_id(1))? {
///     for dep in task.dependencies {
///         println!("waits for {} ({:?})", dep.id, dep.task);
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Related {
    /// Its id.
    pub id: TaskId,
    /// Its type and state, if its row is still kept.
    pub task: Option<(String, TaskState)>,
}

/// One moment of a task's life, as its row tells it.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// if let Some(task) = admin.task(admin.task_id(1))? {
///     for moment in task.timeline {
///         println!("{:?} {}", moment.at, moment.what);
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Moment {
    /// When.
    pub at: SystemTime,
    /// What: `submitted`, `due`, `lease ends`, `succeeded`, `failed`, `cancelled`.
    pub what: &'static str,
}

/// Everything a task's row holds: what [`Admin::task`] reads.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// if let Some(task) = admin.task(admin.task_id(1))? {
///     println!("{} {:?}: payload {}", task.row.task_type, task.row.state, task.payload);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TaskDetail {
    /// What a list shows of it.
    pub row: TaskRow,
    /// Its payload, as JSON.
    pub payload: Value,
    /// Its output, once it succeeded.
    pub output: Option<Value>,
    /// The lease it runs under, while it runs.
    pub lease_id: Option<i64>,
    /// When that lease ends unless renewed.
    pub lease_until: Option<SystemTime>,
    /// Why it failed for good (`error`, `panic`, `attempts`, `timeout`...).
    pub failure_reason: Option<String>,
    /// Why it was cancelled.
    pub cancel_reason: Option<String>,
    /// A cancel asked of the process that runs it, not yet seen.
    pub cancel_requested: Option<String>,
    /// The task a resubmit or retry made of it.
    pub resubmitted_as: Option<TaskId>,
    /// The tasks it waits for (at most 100).
    pub dependencies: Vec<Related>,
    /// The tasks that wait for it (at most 100).
    pub dependents: Vec<Related>,
    /// Its life so far, oldest first.
    pub timeline: Vec<Moment>,
}

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
    /// use tasq::postgres::{Admin, TaskQuery};
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
            && matches!(query.state, Some(TaskState::Ready | TaskState::Scheduled));
        // The dead letters' shape keeps neither a type nor a queue: those are kept here.
        let dead_sifted = query.dead && query.key.is_none() && query.task_type.is_some();
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
                let sql = publish::page_of(ROW_COLUMNS, query.state, query.task_type.is_some());
                self.run(|c| match &query.task_type {
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
            let keep = query.state.is_none_or(|s| s == task.state)
                && query
                    .task_type
                    .as_ref()
                    .is_none_or(|t| *t == task.task_type)
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
        let mut timeline = vec![Moment {
            at: task.created_at,
            what: "submitted",
        }];
        if task.run_at > task.created_at {
            timeline.push(Moment {
                at: task.run_at,
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
            payload: row.get::<_, Option<Value>>(14).unwrap_or(Value::Null),
            output: row.get(15),
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
            run_at: row.get(9),
            key: row.get(10),
            last_error: row.get(11),
            created_at: row.get(12),
            finished_at: row.get(13),
        }
    }
}
