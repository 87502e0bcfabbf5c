//! What an operator asks of dead letters in bulk, and what a retry made.

use crate::model::id::TaskId;
use crate::observe::console::tasks::{TaskPage, TaskQuery};

/// The dead letters a bulk action takes: every filter given must hold.
///
/// # Examples
///
/// ```
/// use tasq::console::DeadFilter;
/// let timeouts = DeadFilter::new().task_type("email").error_contains("timed out");
/// # let _ = timeouts;
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadFilter {
    pub(crate) task_type: Option<String>,
    pub(crate) queue: Option<String>,
    pub(crate) error_contains: Option<String>,
}

impl DeadFilter {
    /// Every dead letter.
    ///
    /// # Examples
    ///
    /// ```
    /// let all = tasq::console::DeadFilter::new();
    /// # let _ = all;
    /// ```
    pub fn new() -> Self {
        DeadFilter::default()
    }

    /// Only dead letters of the type named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let emails = tasq::console::DeadFilter::new().task_type("email");
    /// # let _ = emails;
    /// ```
    pub fn task_type(mut self, name: impl Into<String>) -> Self {
        self.task_type = Some(name.into());
        self
    }

    /// Only dead letters in the queue named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let slow = tasq::console::DeadFilter::new().queue("slow");
    /// # let _ = slow;
    /// ```
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queue = Some(name.into());
        self
    }

    /// Only dead letters whose last error contains `text` (as written, case and all).
    ///
    /// # Examples
    ///
    /// ```
    /// let refused = tasq::console::DeadFilter::new().error_contains("connection refused");
    /// # let _ = refused;
    /// ```
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Whether a dead letter whose last error is `error` passes [`error_contains`](DeadFilter::error_contains)
    /// (the type and queue filters are applied by the listing).
    fn keeps(&self, error: Option<&str>) -> bool {
        self.error_contains
            .as_deref()
            .is_none_or(|text| error.is_some_and(|e| e.contains(text)))
    }
}

/// What a bulk action did (or, dry, would do).
///
/// # Examples
///
/// ```no_run
/// use tasq::console::DeadFilter;
/// use tasq::postgres::Admin;
/// let admin = Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let plan = admin.retry_dead(&DeadFilter::new().task_type("email"), true)?;
/// println!("would retry {} dead letters", plan.matched.len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BulkOutcome {
    /// The dead letters the filter kept.
    pub matched: Vec<TaskId>,
    /// Those acted on, with the new task a retry made (`None` for a purge); empty when dry.
    pub done: Vec<(TaskId, Option<TaskId>)>,
    /// Those left as they were, and why (another process retried or purged it meanwhile).
    pub refused: Vec<(TaskId, String)>,
}

/// A dead letter retried: its new task, and the dependents its failure had cancelled, brought
/// back (old id, new id).
///
/// # Examples
///
/// ```no_run
/// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
/// let retried = admin.retry(admin.task_id(12))?;
/// println!("now {}, with {} dependents", retried.id, retried.dependents.len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retried {
    /// The new task.
    pub id: TaskId,
    /// The dependents brought back with it: (old id, new id).
    pub dependents: Vec<(TaskId, TaskId)>,
}

/// A bulk action on either store: the dead letters `filter` keeps, read page by page with
/// `page`, each acted on by `act` (the new task, or why it was refused) unless `dry_run`. An
/// error of either stops the action there.
pub(crate) fn bulk<E>(
    filter: &DeadFilter,
    dry_run: bool,
    mut page: impl FnMut(&TaskQuery) -> Result<TaskPage, E>,
    act: impl Fn(TaskId) -> Result<Result<Option<TaskId>, String>, E>,
) -> Result<BulkOutcome, E> {
    let mut outcome = BulkOutcome::default();
    let mut query = TaskQuery::new().dead().limit(500);
    if let Some(name) = &filter.task_type {
        query = query.task_type(name.clone());
    }
    if let Some(name) = &filter.queue {
        query = query.queue(name.clone());
    }
    loop {
        let found = page(&query)?;
        for task in found.tasks {
            if !filter.keeps(task.last_error.as_deref()) {
                continue;
            }
            outcome.matched.push(task.id);
            if !dry_run {
                match act(task.id)? {
                    Ok(new) => outcome.done.push((task.id, new)),
                    Err(why) => outcome.refused.push((task.id, why)),
                }
            }
        }
        match found.next {
            Some(next) => query = query.after(next),
            None => return Ok(outcome),
        }
    }
}
