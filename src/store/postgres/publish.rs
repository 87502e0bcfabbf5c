//! What local handles and tokens see of rows: outcomes published to completions, tokens fired,
//! rows read back as `TaskInfo` and as pages of tasks.

use std::time::{Duration, Instant};

use postgres::Row;
use serde_json::Value;

use super::conn::Sql;
use super::store::{PgStore, leak_name};
use super::submit::notify;
use crate::model::cancel::Interrupt;
use crate::model::completion::{Completion, Finished};
use crate::model::error::{ResubmitError, WaitError};
use crate::model::id::TaskId;
use crate::model::state::TaskState;
use crate::observe::stats::TaskInfo;
use crate::store::{Revived, Store};
use crate::sync::{Arc, Weak};
use crate::unwind;

/// The statement of a page of [`Store::tasks`]: the rows in `state` (if given), of the type
/// `$3` (if `by_type`), after id `$1`, at most `$2`, by id, with [`info_columns!`].
///
/// Each shape reads an index from the key it starts after (schema version 4, see `schema.rs`),
/// never the table: by state, `tasq_states (status, id)`; by state and type,
/// `tasq_types (type, status, id)`, except for ready and scheduled tasks (status `ready`),
/// whose pages read `tasq_states` and keep the type's rows; by type alone, one range per
/// status, each cut at the limit, merged; neither, the primary key. Running tasks, which
/// neither index holds, are few: their pages read them all through an index of running rows
/// (`tasq_running` or `tasq_leases`) and sort them. The status is written into the text (one of six constants), so that even a generic
/// plan of the prepared statement knows it, and which partial index holds it. Ready and
/// scheduled tasks share the status `ready`: their pages keep the rows whose `run_at` is or is
/// not due, in id order as the index gives them.
pub(super) fn tasks_page(state: Option<TaskState>, by_type: bool) -> String {
    page_of(info_columns!(), state, by_type)
}

/// [`tasks_page`]'s shapes with other `columns` of the row `t` (constants, never input).
pub(super) fn page_of(columns: &str, state: Option<TaskState>, by_type: bool) -> String {
    const STATUSES: [&str; 6] = [
        "blocked",
        "ready",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ];
    let Some(state) = state else {
        if !by_type {
            return format!(
                "SELECT {columns} FROM tasq_tasks t WHERE t.id > $1 ORDER BY t.id LIMIT $2"
            );
        }
        let branches: Vec<String> = STATUSES
            .iter()
            .map(|status| {
                format!(
                    "(SELECT id FROM tasq_tasks WHERE type = $3 AND status = '{status}' \
                     AND id > $1 ORDER BY id LIMIT $2)"
                )
            })
            .collect();
        return format!(
            "WITH page AS (SELECT id FROM ({}) AS branches ORDER BY id LIMIT $2) \
             SELECT {columns} FROM page JOIN tasq_tasks t ON t.id = page.id ORDER BY t.id",
            branches.join(" UNION ALL ")
        );
    };
    let (status, due) = match state {
        TaskState::Blocked => ("blocked", ""),
        TaskState::Scheduled => ("ready", " AND t.run_at > tasq_now()"),
        TaskState::Ready => ("ready", " AND t.run_at <= tasq_now()"),
        TaskState::Running => ("running", ""),
        TaskState::Succeeded => ("succeeded", ""),
        TaskState::Failed => ("failed", ""),
        TaskState::Cancelled => ("cancelled", ""),
    };
    let of_type = if by_type { "t.type = $3 AND " } else { "" };
    format!(
        "SELECT {columns} FROM tasq_tasks t WHERE {of_type}t.status = '{status}'{due} \
         AND t.id > $1 ORDER BY t.id LIMIT $2"
    )
}

impl PgStore {
    /// The columns [`finished_of_row`](PgStore::finished_of_row) reads.
    pub(super) const OUTCOME_COLUMNS: &'static str = "id, status, type, output, attempts, failure_reason, \
        last_error, cancel_reason, cancel_cause";

    /// Publishes the outcome of a terminal row to the handles waiting for it in this process.
    ///
    /// Not for a task that a worker of this pool still holds: that worker publishes what it
    /// wrote (the output itself, not a copy decoded from the row) before it lets go of the
    /// task (see `finish`).
    pub(super) fn publish_row(&self, seq: i64, row: &Row) {
        if self.local.lock().running.contains_key(&seq) {
            return;
        }
        let completion = self.waiters.lock().remove(&seq);
        let Some(completion) = completion.and_then(|weak| weak.upgrade()) else {
            return;
        };
        let finished = self.finished_of_row(row);
        unwind::drop_quietly(completion.publish_first(finished));
        // If every handle went meanwhile, this is the last reference, holding the output.
        unwind::drop_quietly(completion);
    }

    /// A terminal row's outcome, with its output decoded (outside any lock: the output's
    /// `Deserialize` is user code).
    fn finished_of_row(&self, row: &Row) -> Finished {
        let status: &str = row.get("status");
        match status {
            "succeeded" => {
                let type_name: &str = row.get("type");
                let output: Option<Value> = row.get("output");
                let decoded = self
                    .type_index(type_name)
                    .ok_or_else(|| format!("task type {type_name} is not registered here"))
                    .and_then(|index| {
                        self.codec(index)
                            .decode_output(output.unwrap_or(Value::Null))
                    });
                match decoded {
                    Ok(output) => Finished::Succeeded(Some(output)),
                    Err(error) => Finished::Failed(Box::new(crate::model::state::Failure::new(
                        crate::model::state::FailureReason::BadPayload,
                        u32::try_from(row.get::<_, i32>("attempts")).unwrap_or(0),
                        format!("the task succeeded, but its output could not be decoded: {error}"),
                        None,
                    ))),
                }
            }
            "failed" => Finished::Failed(Box::new(super::rows::failure_of(
                row.get("failure_reason"),
                row.get("attempts"),
                row.get("last_error"),
            ))),
            _ => Finished::Cancelled(super::rows::cancel_reason_of(
                self.queue,
                row.get("cancel_reason"),
                row.get("cancel_cause"),
            )),
        }
    }

    /// Registers a waiter for `seq`; if the row is terminal already, publishes it at once.
    pub(super) fn watch_seq(&self, seq: i64, completion: &Arc<Completion>) {
        let (registered, live) = {
            let mut waiters = self.waiters.lock();
            let live = waiters.get(&seq).and_then(Weak::upgrade);
            let registered = match &live {
                Some(live) => Arc::ptr_eq(live, completion),
                None => {
                    waiters.insert(seq, Arc::downgrade(completion));
                    false
                }
            };
            (registered, live)
        };
        // Outside the lock: another completion's handles may have gone meanwhile, leaving
        // this the last reference to its output.
        unwind::drop_quietly(live);
        if !registered {
            // Newly registered (the poll forgot it, or the pool had published another
            // completion): the task may have ended meanwhile.
            self.publish_seq(seq);
        }
    }

    /// Fires the token of a task running here whose cancel was asked for.
    pub(super) fn fire_local(&self, seq: i64) {
        let token = self.local.lock().running.get(&seq).map(|h| h.token.clone());
        if let Some(token) = token {
            token.fire(Interrupt::Cancelled);
        }
    }

    /// Fires the token of the run of task `seq` under `lease`, if it is still running here:
    /// not that of a later attempt of the same task that a worker here claimed since.
    pub(super) fn fire_leased(&self, seq: i64, lease: i64, why: Interrupt) {
        let token = self
            .local
            .lock()
            .running
            .get(&seq)
            .filter(|h| h.lease == lease)
            .map(|h| h.token.clone());
        if let Some(token) = token {
            token.fire(why);
        }
    }

    /// The name of queue `name`: a registered type's, or one leaked once (as a type's name).
    fn queue_name(&self, name: String) -> &'static str {
        self.registry
            .entries()
            .iter()
            .map(|e| e.queue)
            .find(|q| *q == name)
            .unwrap_or_else(|| leak_name(name))
    }

    /// What a row read with [`info_columns!`] says of its task, with `now` the pool's clock's
    /// reading for its due time.
    pub(super) fn info_of_row(&self, row: &Row, now: Instant) -> TaskInfo {
        let state = super::rows::state_of(row.get(1), row.get(2));
        let index = self.type_index(row.get(0));
        let task_type =
            index.map_or_else(|| leak_name(row.get(0)), |i| self.registry.entry(i).name);
        // A column left NULL (a row inserted by hand) takes the type's setting here; a type
        // this pool does not know, the defaults'.
        let defaults = index.map_or_else(crate::store::registry::Settings::unknown_type, |i| {
            self.registry.entry(i).settings()
        });
        let settings = super::rows::settings_of(defaults, row, 8);
        // As the embedded store: a due time only for a task that waits for one.
        let waiting = matches!(state, TaskState::Blocked | TaskState::Scheduled);
        TaskInfo {
            id: self.id(row.get(13)),
            task_type,
            queue: self.queue_name(row.get(14)),
            key: row.get(15),
            state,
            priority: u8::try_from(row.get::<_, i16>(3)).unwrap_or(0),
            attempts: u32::try_from(row.get::<_, i32>(4)).unwrap_or(0),
            max_attempts: settings.max_attempts,
            retry_policy: settings.retry,
            timeout: settings.timeout,
            run_at: waiting.then(|| super::rows::instant_in(now, row.get(5))),
            last_error: row.get(6),
            resubmitted_as: row.get::<_, Option<i64>>(7).map(|s| self.id(s)),
            dependencies: row
                .get::<_, Vec<i64>>(12)
                .into_iter()
                .map(|s| self.id(s))
                .collect(),
        }
    }

    /// Publishes a row that became terminal to local waiters (nothing if it is not terminal).
    pub(super) fn publish_seq(&self, seq: i64) {
        self.publish_ended(&[seq]);
    }

    /// Publishes the rows among `seqs` that ended to the handles of this process waiting for
    /// them, in one query.
    pub(super) fn publish_ended(&self, seqs: &[i64]) {
        let waited: Vec<i64> = {
            let waiters = self.waiters.lock();
            seqs.iter()
                .copied()
                .filter(|seq| waiters.contains_key(seq))
                .collect()
        };
        if waited.is_empty() {
            return;
        }
        let sql = format!(
            "SELECT {} FROM tasq_tasks WHERE id = ANY($1)
             AND status IN ('succeeded', 'failed', 'cancelled')",
            Self::OUTCOME_COLUMNS
        );
        // If this fails, the poll publishes them later.
        if let Ok(rows) = self.with_conn(|c| c.query(&sql, &[&waited])) {
            for row in &rows {
                self.publish_row(row.get("id"), row);
            }
        }
    }

    /// The completion that the handles to task `seq` in this process share, registered so that
    /// the task's ending reaches it (the worker's own publish, a notification, or the poll).
    pub(super) fn completion_for(&self, seq: i64) -> Arc<Completion> {
        let mut waiters = self.waiters.lock();
        if let Some(live) = waiters.get(&seq).and_then(Weak::upgrade) {
            return live;
        }
        let completion = Completion::new();
        waiters.insert(seq, Arc::downgrade(&completion));
        completion
    }

    pub(super) fn completions_for(
        &self,
        rows: &[(i64, bool, &'static str)],
    ) -> Vec<Arc<Completion>> {
        rows.iter()
            .map(|&(seq, _, _)| self.completion_for(seq))
            .collect()
    }

    /// Blocks until `done` holds, polling; `None` deadline waits as long as it takes.
    pub(super) fn poll_until(
        &self,
        deadline: Option<Instant>,
        done: impl Fn(&PgStore) -> bool,
    ) -> Result<(), WaitError> {
        let mut delay = Duration::from_millis(2);
        loop {
            if done(self) {
                return Ok(());
            }
            // In real time, whatever the pool's clock (see `Store::wait_idle`).
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(WaitError::TimedOut);
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(50));
        }
    }

    /// Resubmits dead letter `id` (and, with `dependents`, the dependents its failure
    /// cancelled) as new rows, in one transaction.
    pub(super) fn revive(
        &self,
        id: TaskId,
        type_index: u32,
        dependents: bool,
    ) -> Result<Revived, ResubmitError> {
        let seq = self.seq(id).ok_or(ResubmitError::UnknownTask(id))?;
        if self.is_closed() {
            return Err(ResubmitError::ShutDown);
        }
        let type_name = self.registry.entry(type_index).name;
        let queue = self.queue;
        let result = self.with_conn(|client| {
            let mut tx = client.transaction()?;
            let revived =
                match super::resubmit::revive(&mut tx, queue, seq, Some(type_name), dependents)? {
                    Ok(revived) => revived,
                    // Refused: nothing changed (dropping the transaction rolls it back).
                    Err(refusal) => return Ok(Err(refusal)),
                };
            notify(&mut tx, "ready")?;
            // Registered before the commit: no ending can be announced before it.
            let completion = self.completion_for(revived.new);
            tx.commit()?;
            Ok(Ok((revived, completion)))
        });
        match result {
            Ok(Ok((revival, completion))) => {
                let super::resubmit::Revival {
                    new,
                    brought_back,
                    back_cancelled,
                } = revival;
                self.count(|t| {
                    t.submitted += 1 + brought_back.len() as u64;
                    t.cancelled += back_cancelled;
                });
                self.wake_fetcher();
                Ok(Revived {
                    id: self.id(new),
                    completion,
                    dependents: brought_back
                        .into_iter()
                        .map(|(old, new)| (self.id(old), self.id(new)))
                        .collect(),
                })
            }
            Ok(Err(kind)) => Err(kind.into_error(id, |s| self.id(s))),
            Err(error) => Err(ResubmitError::Store(id, error)),
        }
    }
}
