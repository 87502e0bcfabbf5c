//! Tasks as an operator lists them: a query, a page of rows, one task in full. A page is a
//! keyset page in id order (`after` the last one seen), never an offset.

use std::time::SystemTime;

use crate::model::id::TaskId;
use crate::model::state::TaskState;
use crate::observe::stats::TaskFilter;

/// Index entries a page of tasks reads at most on the durable store: a filter that matches
/// few rows returns a short page (possibly empty) with where to go on, rather than reading on.
pub const SCAN: usize = 5_000;

/// The most tasks a page holds.
pub(crate) const MAX_PAGE: usize = 1_000;

/// Which tasks a page of tasks lists ([`Pool::task_page`](crate::Pool::task_page), or
/// `postgres::Admin::tasks`): every filter given must hold.
///
/// # Examples
///
/// ```
/// use tasq::console::TaskQuery;
/// use tasq::TaskState;
///
/// let query = TaskQuery::new().state(TaskState::Failed).task_type("email").limit(50);
/// assert_eq!(query.get_limit(), 50);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskQuery {
    /// The state and type kept, as [`Pool::tasks`](crate::Pool::tasks) takes them.
    pub(crate) filter: TaskFilter,
    pub(crate) queue: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) dead: bool,
    pub(crate) after: Option<TaskId>,
    pub(crate) limit: usize,
}

impl Default for TaskQuery {
    fn default() -> Self {
        TaskQuery {
            filter: TaskFilter::new(),
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
    /// assert_eq!(tasq::console::TaskQuery::new().get_limit(), 50);
    /// ```
    pub fn new() -> Self {
        TaskQuery::default()
    }

    /// Only tasks in `state`.
    ///
    /// # Examples
    ///
    /// ```
    /// let running = tasq::console::TaskQuery::new().state(tasq::TaskState::Running);
    /// # let _ = running;
    /// ```
    pub fn state(mut self, state: TaskState) -> Self {
        self.filter = self.filter.state(state);
        self
    }

    /// Only tasks of the type named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let emails = tasq::console::TaskQuery::new().task_type("email");
    /// # let _ = emails;
    /// ```
    pub fn task_type(mut self, name: impl Into<String>) -> Self {
        self.filter = self.filter.task_type(name);
        self
    }

    /// Only tasks in the queue named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let slow = tasq::console::TaskQuery::new().queue("slow");
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
    /// let order = tasq::console::TaskQuery::new().key("order-42");
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
    /// let dead = tasq::console::TaskQuery::new().dead();
    /// # let _ = dead;
    /// ```
    pub fn dead(mut self) -> Self {
        self.dead = true;
        self.filter = self.filter.state(TaskState::Failed);
        self
    }

    /// The page after the task `id` (the previous page's [`TaskPage::next`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let id = tasq::TaskId::from_parts(1, 100);
    /// let next = tasq::console::TaskQuery::new().after(id);
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
    /// let query = tasq::console::TaskQuery::new().limit(5_000);
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
    /// assert_eq!(tasq::console::TaskQuery::new().limit(0).get_limit(), 1);
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
/// for row in admin.tasks(&tasq::console::TaskQuery::new())?.tasks {
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
    /// When it is or was due (on the embedded store, only while it waits for that time).
    pub run_at: Option<SystemTime>,
    /// Its idempotency key.
    pub key: Option<String>,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When it was submitted (the embedded store does not keep it).
    pub created_at: Option<SystemTime>,
    /// When it finished, if it has.
    pub finished_at: Option<SystemTime>,
}

/// A page of tasks, and where the next one starts.
///
/// # Examples
///
/// ```no_run
/// use tasq::console::TaskQuery;
/// use tasq::postgres::Admin;
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

/// Everything a task's row holds: what `postgres::Admin::task` reads.
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// if let Some(task) = admin.task(admin.task_id(1))? {
///     println!("{} {:?}: payload {:?}", task.row.task_type, task.row.state, task.payload);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TaskDetail {
    /// What a list shows of it.
    pub row: TaskRow,
    /// Its payload, as JSON text; `None` on the embedded store, which keeps it as the Rust
    /// value it was submitted as.
    pub payload: Option<String>,
    /// Its output as JSON text, once it succeeded (on the durable store).
    pub output: Option<String>,
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
