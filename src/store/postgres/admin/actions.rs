//! What an operator changes: dead letters retried or purged (one, or every one a filter keeps),
//! tasks cancelled, queues and types paused and resumed, queue limits set. Each goes through
//! the statements the pools use, so the fleet sees it as it sees a pool's own.

use super::connect::{Admin, AdminError};
use crate::model::error::{CancelError, ResubmitError};
use crate::model::id::TaskId;
use crate::model::pause::{PauseError, PauseTarget, Paused};
use crate::model::queue_limit::{QueueLimit, QueueLimitError};
use crate::model::schedule::ScheduleInfo;
use crate::model::state::CancelOutcome;
use crate::observe::console::bulk::{self, BulkOutcome, DeadFilter, Retried};
use crate::store::postgres::conn::Sql;
use crate::store::postgres::{cancel, pause, queue_limits, resubmit, schedules, submit};

impl Admin {
    /// Retries dead letter `id`: a new task of its type, payload, priority, queue, key and
    /// settings, with fresh attempts, and the dependents its failure cancelled brought back
    /// waiting for it (as [`Pool::resubmit_with_dependents`](crate::Pool::resubmit_with_dependents)).
    /// Any pool of the fleet that registers its type runs it; the pools are told at once.
    ///
    /// # Errors
    ///
    /// [`ResubmitError::UnknownTask`] for an id this queue does not hold,
    /// [`ResubmitError::NotDeadLetter`], [`ResubmitError::AlreadyResubmitted`],
    /// [`ResubmitError::Taken`] (purged), [`ResubmitError::KeyTaken`], and
    /// [`ResubmitError::Store`] when the database fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::ResubmitError;
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// match admin.retry(admin.task_id(12)) {
    ///     Ok(retried) => println!("retried as {}", retried.id),
    ///     Err(ResubmitError::NotDeadLetter(id, state)) => println!("{id} is {state:?}"),
    ///     Err(other) => return Err(other.into()),
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry(&self, id: TaskId) -> Result<Retried, ResubmitError> {
        let seq = self.seq(id).ok_or(ResubmitError::UnknownTask(id))?;
        let queue = self.queue;
        let result = self.run(|client| {
            let mut tx = client.transaction()?;
            let revived = match resubmit::revive(&mut tx, queue, seq, None, true)? {
                Ok(revived) => revived,
                Err(refusal) => return Ok(Err(refusal)),
            };
            submit::notify(&mut tx, "ready")?;
            tx.commit()?;
            Ok(Ok(revived))
        });
        match result {
            Ok(Ok(revival)) => Ok(Retried {
                id: self.id(revival.new),
                dependents: revival
                    .brought_back
                    .into_iter()
                    .map(|(old, new)| (self.id(old), self.id(new)))
                    .collect(),
            }),
            Ok(Err(refusal)) => Err(refusal.into_error(id, |s| self.id(s))),
            Err(error) => Err(ResubmitError::Store(id, error.to_string())),
        }
    }

    /// Purges dead letter `id`: its payload is dropped and it is a dead letter no more (the
    /// failed row stays until retention removes it, so its outcome can still be read). `false`
    /// if it is not a dead letter (any more).
    ///
    /// # Errors
    ///
    /// [`AdminError::Db`] when the database fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// if !admin.purge(admin.task_id(12))? {
    ///     println!("not a dead letter");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn purge(&self, id: TaskId) -> Result<bool, AdminError> {
        let Some(seq) = self.seq(id) else {
            return Ok(false);
        };
        let n = self.run(|c| c.execute(cancel::PURGE, &[&seq]))?;
        Ok(n == 1)
    }

    /// Retries every dead letter that `filter` keeps, each as [`retry`](Admin::retry) does; with
    /// `dry_run`, only lists them.
    ///
    /// # Errors
    ///
    /// [`AdminError::Db`] when the database fails (the dead letters retried before stay
    /// retried, and a second run takes the rest).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::console::DeadFilter;
    /// use tasq::postgres::Admin;
    /// let admin = Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let done = admin.retry_dead(&DeadFilter::new().error_contains("timed out"), false)?;
    /// println!("retried {}, {} refused", done.done.len(), done.refused.len());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_dead(
        &self,
        filter: &DeadFilter,
        dry_run: bool,
    ) -> Result<BulkOutcome, AdminError> {
        self.bulk(filter, dry_run, |id| match self.retry(id) {
            Ok(retried) => Ok(Ok(Some(retried.id))),
            Err(ResubmitError::Store(_, error)) => Err(AdminError::Db(error)),
            Err(refused) => Ok(Err(refused.to_string())),
        })
    }

    /// Purges every dead letter that `filter` keeps, each as [`purge`](Admin::purge) does; with
    /// `dry_run`, only lists them.
    ///
    /// # Errors
    ///
    /// [`AdminError::Db`] when the database fails (those purged before stay purged).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::console::DeadFilter;
    /// use tasq::postgres::Admin;
    /// let admin = Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let gone = admin.purge_dead(&DeadFilter::new().task_type("thumbnail"), false)?;
    /// println!("purged {}", gone.done.len());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn purge_dead(
        &self,
        filter: &DeadFilter,
        dry_run: bool,
    ) -> Result<BulkOutcome, AdminError> {
        self.bulk(filter, dry_run, |id| {
            Ok(if self.purge(id)? {
                Ok(None)
            } else {
                Err("not a dead letter any more".to_owned())
            })
        })
    }

    /// The dead letters `filter` keeps, page by page, each acted on by `act` unless `dry_run`.
    fn bulk(
        &self,
        filter: &DeadFilter,
        dry_run: bool,
        act: impl Fn(TaskId) -> Result<Result<Option<TaskId>, String>, AdminError>,
    ) -> Result<BulkOutcome, AdminError> {
        bulk::bulk(filter, dry_run, |query| self.tasks(query), act)
    }

    /// Cancels task `id` as [`Pool::cancel`](crate::Pool::cancel) does: one not started ends
    /// cancelled with its dependents; a running one has its cancel asked for, and the process
    /// running it is told at once (its heartbeat reads the request too).
    ///
    /// # Errors
    ///
    /// [`CancelError::UnknownTask`] for an id this queue does not hold, [`CancelError::Store`]
    /// when the database fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// println!("{:?}", admin.cancel(admin.task_id(12))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self, id: TaskId) -> Result<CancelOutcome, CancelError> {
        let seq = self.seq(id).ok_or(CancelError::UnknownTask(id))?;
        match cancel::cancel_locked(self, cancel::BY_ID, &seq) {
            Ok(Some(cancelled)) => Ok(cancelled.outcome),
            Ok(None) => Err(CancelError::UnknownTask(id)),
            Err(error) => Err(CancelError::Store(id, error)),
        }
    }

    /// Cancels the live or succeeded task that holds idempotency key `key`, as
    /// [`Pool::cancel_key`](crate::Pool::cancel_key) does.
    ///
    /// # Errors
    ///
    /// [`CancelError::UnknownKey`] when no such task holds it, [`CancelError::StoreByKey`] when
    /// the database fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let (id, outcome) = admin.cancel_key("order-42")?;
    /// println!("{id}: {outcome:?}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel_key(&self, key: &str) -> Result<(TaskId, CancelOutcome), CancelError> {
        match cancel::cancel_locked(self, cancel::BY_KEY, &key) {
            Ok(Some(cancelled)) => Ok((self.id(cancelled.seq), cancelled.outcome)),
            Ok(None) => Err(CancelError::UnknownKey(key.to_owned())),
            Err(error) => Err(CancelError::StoreByKey(key.to_owned(), error)),
        }
    }

    /// Pauses a queue, a type or a schedule for the whole fleet, as
    /// [`Pool::pause`](crate::Pool::pause) does: once it returns, no new claim of its tasks
    /// starts anywhere (running ones finish). `false` if it was paused already.
    ///
    /// # Errors
    ///
    /// [`PauseError::InvalidName`] for an empty name, [`PauseError::Store`] when the database
    /// fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::PauseTarget;
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// admin.pause(&PauseTarget::queue("mail"))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pause(&self, target: &PauseTarget) -> Result<bool, PauseError> {
        target.check()?;
        pause::pause(self, &self.holder, target)
    }

    /// Resumes what [`pause`](Admin::pause) paused; every pool's workers are woken at once.
    /// `false` if it was not paused.
    ///
    /// # Errors
    ///
    /// As [`pause`](Admin::pause).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use tasq::PauseTarget;
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// admin.resume(&PauseTarget::queue("mail"))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resume(&self, target: &PauseTarget) -> Result<bool, PauseError> {
        target.check()?;
        pause::resume(self, target)
    }

    /// What the fleet has paused, and since when.
    ///
    /// # Errors
    ///
    /// [`PauseError::Store`] when the database fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// for paused in admin.paused()? {
    ///     println!("{:?} since {:?}", paused.target, paused.since);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn paused(&self) -> Result<Vec<Paused>, PauseError> {
        pause::pauses(self)
    }

    /// Sets (or with `None` lifts) the fleet's limit on queue `queue`'s running tasks, as
    /// [`Pool::set_queue_limit`](crate::Pool::set_queue_limit) does; returns the limit it
    /// replaced.
    ///
    /// # Errors
    ///
    /// [`QueueLimitError::InvalidName`] or [`QueueLimitError::Zero`] for a bad argument,
    /// [`QueueLimitError::Store`] when the database fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// admin.set_queue_limit("mail", Some(4))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_queue_limit(
        &self,
        queue: &str,
        limit: Option<u32>,
    ) -> Result<Option<u32>, QueueLimitError> {
        crate::model::queue_limit::check(queue, limit)?;
        queue_limits::set_limit(self, &self.holder, queue, limit)
    }

    /// The fleet's queue limits.
    ///
    /// # Errors
    ///
    /// [`QueueLimitError::Store`] when the database fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// for limit in admin.queue_limits()? {
    ///     println!("{}: at most {}", limit.queue, limit.max_running);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_limits(&self) -> Result<Vec<QueueLimit>, QueueLimitError> {
        queue_limits::limits(self)
    }

    /// The periodic tasks the fleet runs: each definition, its next and last slot, the last
    /// slot's task and outcome, whether it is paused.
    ///
    /// # Errors
    ///
    /// [`AdminError::Db`] when the database fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// for schedule in admin.schedules()? {
    ///     println!("{} next {:?}", schedule.name, schedule.next_slot);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>, AdminError> {
        schedules::list(self, self.queue).map_err(AdminError::Db)
    }
}
