//! What an operator's console asks of a pool, on either store: the queue's overview, pages of
//! tasks, one task in full, and dead letters retried or purged without their task type in
//! hand. The dashboard of crate `tasq-console` shows an embedded pool through these.
//!
//! A page here is built from the pool's own listings ([`Pool::tasks`], the dead letters, the
//! keys), so on the durable store it reads what those read; `postgres::Admin` reads a durable
//! queue's pages in fewer statements, and also the payloads and timelines its rows keep.

use std::convert::Infallible;
use std::time::{Instant, SystemTime};

use crate::api::pool::Pool;
use crate::client::handle::TaskHandle;
use crate::model::error::{ResubmitError, StatsError};
use crate::model::id::TaskId;
use crate::model::state::TaskState;
use crate::observe::console::bulk::{self, BulkOutcome, DeadFilter, Retried};
use crate::observe::console::overview::Overview;
use crate::observe::console::tasks::{
    Moment, Related, SCAN, TaskDetail, TaskPage, TaskQuery, TaskRow,
};
use crate::observe::stats::TaskInfo;
use crate::sync::Arc;

impl Pool {
    /// The queue's figures for an operator: tasks by state, queue, type and priority, the
    /// oldest due task's age, the last minutes' outcomes and throughput, pauses, queue limits
    /// and breakers. The embedded store makes one pass over its records under its lock (as
    /// [`type_stats`](Pool::type_stats) does) and lists every registered type and queue; the
    /// durable store reads what `postgres::Admin::overview` reads.
    ///
    /// # Errors
    ///
    /// [`StatsError::StoreUnavailable`] when the durable store's database cannot be read.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const JOB: TaskType<u32, ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &u32| Ok::<_, HandlerError>(())).build()?;
    /// pool.submit(JOB.task(1))?.wait();
    /// let overview = pool.overview()?;
    /// assert_eq!(overview.states.succeeded, 1);
    /// assert_eq!(overview.minutes.last().unwrap().succeeded, 1);
    /// assert_eq!(overview.types[0].name, "job");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn overview(&self) -> Result<Overview, StatsError> {
        self.store.overview().map_err(StatsError::StoreUnavailable)
    }

    /// A page of tasks, by id: those after [`TaskQuery::after`] that every filter of `query`
    /// keeps. A page sifted by queue reads at most [`SCAN`] tasks, so it may come back short
    /// while [`TaskPage::next`] says where to go on. A key finds the live or succeeded task
    /// that holds it (a failed or cancelled one let its key go).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::console::TaskQuery;
    /// use tasq::{HandlerError, Pool, TaskState, TaskType};
    /// const JOB: TaskType<u32, ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &u32| Ok::<_, HandlerError>(())).build()?;
    /// let handle = pool.submit(JOB.task(7).key("order-7"))?;
    /// handle.wait();
    /// let page = pool.task_page(&TaskQuery::new().key("order-7"));
    /// assert_eq!(page.tasks[0].id, handle.id());
    /// assert_eq!(page.tasks[0].state, TaskState::Succeeded);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn task_page(&self, query: &TaskQuery) -> TaskPage {
        let keeps = |info: &TaskInfo| {
            query.queue.as_deref().is_none_or(|q| q == info.queue)
                && query.filter.keeps(info.state, info.task_type)
        };
        if let Some(key) = &query.key {
            let tasks = self
                .find_key(key)
                .filter(|&id| query.after.is_none_or(|after| id > after))
                .and_then(|id| self.info(id))
                .filter(|info| keeps(info) && (!query.dead || self.is_dead(info.id)))
                .map(|info| self.row_of(info))
                .into_iter()
                .collect();
            return TaskPage { tasks, next: None };
        }
        let mut tasks = Vec::new();
        let mut after = query.after;
        let mut read = 0;
        loop {
            let want = query.limit - tasks.len();
            let batch: Vec<TaskInfo> = if query.dead {
                let type_index = query
                    .filter
                    .get_task_type()
                    .and_then(|t| self.store.registry().index_of(t));
                self.store
                    .dead_letters(after, type_index, want)
                    .into_iter()
                    .filter_map(|letter| self.info(letter.id))
                    .collect()
            } else {
                self.tasks(&query.filter, after, want)
            };
            let full = batch.len() == want;
            read += batch.len();
            after = batch.last().map(|t| t.id).or(after);
            tasks.extend(
                batch
                    .into_iter()
                    .filter(|t| keeps(t))
                    .map(|t| self.row_of(t)),
            );
            if tasks.len() == query.limit {
                return TaskPage {
                    next: tasks.last().map(|t| t.id),
                    tasks,
                };
            }
            if !full {
                return TaskPage { tasks, next: None };
            }
            if read >= SCAN {
                return TaskPage { tasks, next: after };
            }
        }
    }

    /// Task `id` as an operator sees it, `None` if the pool does not know it (never
    /// submitted here, or forgotten by retention). The embedded store keeps payloads as the
    /// Rust values they were submitted as and no history of times, so its tasks come without
    /// payload, output or timeline beyond when a waiting task is due; `postgres::Admin::task`
    /// reads all of those from a durable row.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskState, TaskType};
    /// const JOB: TaskType<u32, ()> = TaskType::new("job");
    /// let pool = Pool::builder().workers(1).register(JOB, |_, _: &u32| Ok::<_, HandlerError>(())).build()?;
    /// let first = pool.submit(JOB.task(1))?;
    /// let second = pool.submit(JOB.task(2).after([&first]))?;
    /// second.wait();
    /// let detail = pool.task_detail(second.id()).unwrap();
    /// assert_eq!(detail.row.state, TaskState::Succeeded);
    /// assert_eq!(detail.dependencies[0].id, first.id());
    /// assert_eq!(detail.dependencies[0].task, Some(("job".to_owned(), TaskState::Succeeded)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn task_detail(&self, id: TaskId) -> Option<TaskDetail> {
        let info = self.info(id)?;
        let dependencies = info
            .dependencies
            .iter()
            .map(|&dep| Related {
                id: dep,
                task: self.info(dep).map(|d| (d.task_type.to_owned(), d.state)),
            })
            .collect();
        let resubmitted_as = info.resubmitted_as;
        let row = self.row_of(info);
        let timeline = row
            .run_at
            .map(|at| Moment { at, what: "due" })
            .into_iter()
            .collect();
        Some(TaskDetail {
            row,
            payload: None,
            output: None,
            lease_id: None,
            lease_until: None,
            failure_reason: None,
            cancel_reason: None,
            cancel_requested: None,
            resubmitted_as,
            dependencies,
            dependents: Vec::new(),
            timeline,
        })
    }

    /// Runs dead letter `id` again as a new task, with the dependents its failure cancelled
    /// brought back, as [`resubmit_with_dependents`](Pool::resubmit_with_dependents) does, for
    /// a caller that does not hold its task type (an operator's console): the pool finds the
    /// type from the task. The new task's handle is not kept; ask [`status`](Pool::status) or
    /// [`handle`](Pool::handle) of the returned id.
    ///
    /// # Errors
    ///
    /// As [`resubmit`](Pool::resubmit); [`ResubmitError::TypeMismatch`] when this pool does
    /// not register the task's type (a durable task of another program's).
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::{HandlerError, Pool, TaskState, TaskType};
    /// const BAD: TaskType<(), ()> = TaskType::new("bad");
    /// let pool = Pool::builder().workers(1).register(BAD, |_, _: &()| Err::<(), _>(HandlerError::permanent("no"))).build()?;
    /// let dead = pool.submit(BAD.task(()))?;
    /// dead.wait();
    /// let retried = pool.retry_dead_letter(dead.id())?;
    /// assert_ne!(retried.id, dead.id());
    /// assert!(pool.dead_letters().iter().all(|d| d.id != dead.id()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_dead_letter(&self, id: TaskId) -> Result<Retried, ResubmitError> {
        let info = self.info(id).ok_or(ResubmitError::UnknownTask(id))?;
        let type_index = self
            .store
            .registry()
            .index_of(info.task_type)
            .ok_or(ResubmitError::TypeMismatch(id))?;
        let revived = self.store.resubmit_with_dependents(id, type_index)?;
        // Dropped as a caller's unread handle is: the pool keeps nothing for it.
        drop(TaskHandle::<()>::new(
            revived.id,
            Some(revived.completion),
            Arc::clone(self.store.hub()),
            false,
        ));
        Ok(Retried {
            id: revived.id,
            dependents: revived.dependents,
        })
    }

    /// Retries every dead letter `filter` keeps (with [`retry_dead_letter`](Pool::retry_dead_letter)),
    /// or, if `dry_run`, only lists them.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::console::DeadFilter;
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const BAD: TaskType<u8, ()> = TaskType::new("bad");
    /// let pool = Pool::builder().workers(1).register(BAD, |_, _: &u8| Err::<(), _>(HandlerError::permanent("no"))).build()?;
    /// for n in 0..3 {
    ///     pool.submit(BAD.task(n))?.wait();
    /// }
    /// let plan = pool.retry_dead(&DeadFilter::new().error_contains("no"), true);
    /// assert_eq!((plan.matched.len(), plan.done.len()), (3, 0));
    /// let done = pool.retry_dead(&DeadFilter::new().task_type("bad"), false);
    /// assert_eq!(done.done.len(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_dead(&self, filter: &DeadFilter, dry_run: bool) -> BulkOutcome {
        self.bulk(filter, dry_run, |id| {
            self.retry_dead_letter(id)
                .map(|retried| Some(retried.id))
                .map_err(|e| e.to_string())
        })
    }

    /// Purges every dead letter `filter` keeps (with [`purge_dead_letter`](Pool::purge_dead_letter)),
    /// or, if `dry_run`, only lists them.
    ///
    /// # Examples
    ///
    /// ```
    /// use tasq::console::DeadFilter;
    /// use tasq::{HandlerError, Pool, TaskType};
    /// const BAD: TaskType<u8, ()> = TaskType::new("bad");
    /// let pool = Pool::builder().workers(1).register(BAD, |_, _: &u8| Err::<(), _>(HandlerError::permanent("no"))).build()?;
    /// pool.submit(BAD.task(1))?.wait();
    /// let purged = pool.purge_dead(&DeadFilter::new(), false);
    /// assert_eq!(purged.done.len(), 1);
    /// assert!(pool.dead_letters().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn purge_dead(&self, filter: &DeadFilter, dry_run: bool) -> BulkOutcome {
        self.bulk(filter, dry_run, |id| {
            if self.purge_dead_letter(id) {
                Ok(None)
            } else {
                Err("no longer a dead letter".to_owned())
            }
        })
    }

    /// The dead letters `filter` keeps, page by page, each acted on by `act` unless `dry_run`.
    fn bulk(
        &self,
        filter: &DeadFilter,
        dry_run: bool,
        act: impl Fn(TaskId) -> Result<Option<TaskId>, String>,
    ) -> BulkOutcome {
        let outcome: Result<BulkOutcome, Infallible> = bulk::bulk(
            filter,
            dry_run,
            |query| Ok(self.task_page(query)),
            |id| Ok(act(id)),
        );
        match outcome {
            Ok(outcome) => outcome,
        }
    }

    /// Whether task `id` is a dead letter now.
    fn is_dead(&self, id: TaskId) -> bool {
        let before = TaskId::from_parts(id.pool(), id.seq().saturating_sub(1));
        self.store
            .dead_letters(Some(before), None, 1)
            .first()
            .is_some_and(|letter| letter.id == id)
    }

    /// What a list shows of a task.
    fn row_of(&self, info: TaskInfo) -> TaskRow {
        let dead = info.state == TaskState::Failed && self.is_dead(info.id);
        TaskRow {
            id: info.id,
            task_type: info.task_type.to_owned(),
            queue: info.queue.to_owned(),
            state: info.state,
            dead,
            priority: info.priority,
            attempts: info.attempts,
            max_attempts: info.max_attempts,
            run_at: info.run_at.map(|at| self.wall_time(at)),
            key: info.key,
            last_error: info.last_error,
            created_at: None,
            finished_at: None,
        }
    }

    /// The wall-clock time of the pool's clock's reading `at`.
    fn wall_time(&self, at: Instant) -> SystemTime {
        let clock = self.store.clock();
        let (now, wall) = (clock.now(), clock.wall_now());
        if at >= now {
            wall + (at - now)
        } else {
            wall - (now - at)
        }
    }
}
