//! The [`Store`] seam on the durable store: each operation the pool, its workers and handles
//! call, built from the roles in this folder.

use std::any::Any;
use std::time::Instant;

use serde_json::Value;

use super::conn::Sql;
use super::publish::tasks_page;
use super::store::{PgStore, leak_name};
use super::submit::{Insert, due_now, insert_batch, insert_task, notify};
use crate::model::cancel::{CancelToken, Interrupt};
use crate::model::clock::Clock;
use crate::model::completion::Completion;
use crate::model::dead_letter::DeadLetter;
use crate::model::error::{CancelError, ResubmitError, SubmitErrorKind, WaitError};
use crate::model::id::TaskId;
use crate::model::pause::{PauseError, PauseTarget, Paused};
use crate::model::queue_limit::{QueueLimit, QueueLimitError};
use crate::model::schedule::ScheduleInfo;
use crate::model::state::{CancelOutcome, TaskState};
use crate::observe::console::overview::Overview;
use crate::observe::metrics::RunEnd;
use crate::observe::stats::{Stats, TaskFilter, TaskInfo, Totals, TypeStats};
use crate::store::registry::Registry;
use crate::store::schedule::{ScheduleDef, Tick};
use crate::store::{
    Claim, CopyPayload, Drained, Revived, RunOutcome, Store, StoreHub, Submission, Submitted,
};
use crate::sync::Arc;
use crate::unwind;

impl Store for PgStore {
    fn pool_id(&self) -> u64 {
        self.queue
    }

    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn is_closed(&self) -> bool {
        self.local.lock().closed
    }

    fn submit(&self, task: Submission<'_>) -> Result<Submitted, SubmitErrorKind> {
        let (payload, delay) = self.prepare(&task)?;
        let insert = self.insert_parts(&task, &payload, delay);
        if task.key.is_none() && task.dependencies.is_empty() {
            // One statement, no transaction. Its completion is registered once the row exists:
            // an ending announced before that (a pool elsewhere claimed and ran the task within
            // the microseconds between) reaches the handle at the next poll of the waiters.
            let due = delay.is_zero();
            let seq = self
                .with_conn(|client| super::submit::insert_plain(client, &insert, due))
                .map_err(SubmitErrorKind::Store)?;
            let inserted = (seq, false, "ready");
            let completions = self.completions_for(&[inserted]);
            self.tell_submitted(&[inserted], std::slice::from_ref(&task));
            return Ok(self.accepted(&[inserted], completions, due).remove(0));
        }
        let queue = self.queue;
        let result = self.with_conn(|client| {
            let mut tx = client.transaction()?;
            let inserted = insert_task(&mut tx, queue, &insert, task.dependencies)?;
            let completions = match inserted {
                Ok(row) => {
                    if due_now(row, delay) {
                        notify(&mut tx, "ready")?;
                    }
                    // Registered before the commit: no ending can be announced before it.
                    self.completions_for(&[row])
                }
                // Refused: nothing of it is kept (dropping the transaction rolls it back).
                Err(kind) => return Ok(Err(kind)),
            };
            tx.commit()?;
            Ok(Ok((inserted.expect("accepted above"), completions)))
        });
        match result {
            Ok(Ok((inserted, completions))) => {
                self.tell_submitted(&[inserted], std::slice::from_ref(&task));
                let due = due_now(inserted, delay);
                Ok(self.accepted(&[inserted], completions, due).remove(0))
            }
            Ok(Err(kind)) => Err(kind),
            Err(error) => Err(SubmitErrorKind::Store(error)),
        }
    }

    fn submit_batch(
        &self,
        batch: &mut [Submission<'_>],
    ) -> Result<Vec<Submitted>, (usize, SubmitErrorKind)> {
        if self.is_closed() {
            return Err((0, SubmitErrorKind::ShutDown));
        }
        let mut prepared = Vec::with_capacity(batch.len());
        for (index, task) in batch.iter().enumerate() {
            prepared.push(self.prepare(task).map_err(|kind| (index, kind))?);
        }
        let inserts: Vec<Insert<'_>> = batch
            .iter()
            .zip(&prepared)
            .map(|(task, (payload, delay))| self.insert_parts(task, payload, *delay))
            .collect();
        let queue = self.queue;
        let result = self.with_conn(|client| {
            let mut tx = client.transaction()?;
            let rows = match insert_batch(&mut tx, queue, &inserts, batch)? {
                Ok(rows) => rows,
                // Refused: nothing of it is kept (dropping the transaction rolls it back).
                Err(refused) => return Ok(Err(refused)),
            };
            let due = rows
                .iter()
                .zip(&prepared)
                .any(|(&row, &(_, delay))| due_now(row, delay));
            if due {
                notify(&mut tx, "ready")?;
            }
            // Registered before the commit: no ending can be announced before it.
            let completions = self.completions_for(&rows);
            tx.commit()?;
            Ok(Ok((rows, completions, due)))
        });
        match result {
            Ok(Ok((inserted, completions, due))) => {
                self.tell_submitted(&inserted, batch);
                Ok(self.accepted(&inserted, completions, due))
            }
            Ok(Err(refused)) => Err(refused),
            Err(error) => Err((0, SubmitErrorKind::Store(error))),
        }
    }

    fn submit_in(
        &self,
        tx: &mut postgres::Transaction<'_>,
        task: Submission<'_>,
    ) -> Result<(TaskId, bool), SubmitErrorKind> {
        if self.is_closed() {
            return Err(SubmitErrorKind::ShutDown);
        }
        let (payload, delay) = self.prepare(&task)?;
        let insert = self.insert_parts(&task, &payload, delay);
        // A savepoint: a refusal leaves the caller's transaction as it was.
        let store_error = |e: postgres::Error| SubmitErrorKind::Store(super::conn::describe(&e));
        let mut savepoint = tx.savepoint("tasq_submit").map_err(store_error)?;
        let callers_now = self.set_callers_now(&mut savepoint).map_err(store_error)?;
        let inserted = insert_task(&mut savepoint, self.queue, &insert, task.dependencies)
            .map_err(store_error)?;
        let row = inserted?;
        if due_now(row, delay) {
            // Delivered when (and if) the caller commits.
            notify(&mut savepoint, "ready").map_err(store_error)?;
        }
        Self::restore_callers_now(&mut savepoint, callers_now).map_err(store_error)?;
        savepoint.commit().map_err(store_error)?;
        Ok((self.id(row.0), row.1))
    }

    fn succeed_in(
        &self,
        tx: &mut postgres::Transaction<'_>,
        id: TaskId,
        lease: i64,
        output: Value,
    ) -> Result<bool, postgres::Error> {
        let Some(seq) = self.seq(id) else {
            return Ok(false);
        };
        let mut savepoint = tx.savepoint("tasq_succeed")?;
        let callers_now = self.set_callers_now(&mut savepoint)?;
        let ending = super::acks::Ending::Succeeded(output, Box::new(()));
        let written = super::ending::write_ending_tx(&mut savepoint, seq, lease, &ending)?;
        Self::restore_callers_now(&mut savepoint, callers_now)?;
        savepoint.commit()?;
        Ok(written.is_some_and(|(state, _)| state == TaskState::Succeeded))
    }

    fn cancel(&self, id: TaskId) -> Result<CancelOutcome, CancelError> {
        let seq = self.seq(id).ok_or(CancelError::UnknownTask(id))?;
        match self.cancel_row(super::cancel::BY_ID, &seq) {
            Ok(Some((_, outcome))) => Ok(outcome),
            Ok(None) => Err(CancelError::UnknownTask(id)),
            Err(error) => Err(CancelError::Store(id, error)),
        }
    }

    fn find_key(&self, key: &str) -> Option<TaskId> {
        let row = self
            .with_conn(|c| {
                c.query_opt(
                    "SELECT id FROM tasq_tasks WHERE key = $1
                     AND status IN ('blocked', 'ready', 'running', 'succeeded')",
                    &[&key],
                )
            })
            .ok()??;
        Some(self.id(row.get(0)))
    }

    fn cancel_key(&self, key: &str) -> Result<(TaskId, CancelOutcome), CancelError> {
        // The holder is locked as it is found: it holds the key until the cancel commits.
        match self.cancel_row(super::cancel::BY_KEY, &key) {
            Ok(Some((seq, outcome))) => Ok((self.id(seq), outcome)),
            Ok(None) => Err(CancelError::UnknownKey(key.to_owned())),
            Err(error) => Err(CancelError::StoreByKey(key.to_owned(), error)),
        }
    }

    fn status(&self, id: TaskId) -> Option<TaskState> {
        let seq = self.seq(id)?;
        let row = self
            .with_conn(|c| {
                c.query_opt(
                    "SELECT status, run_at <= tasq_now() FROM tasq_tasks WHERE id = $1",
                    &[&seq],
                )
            })
            .ok()??;
        Some(super::rows::state_of(row.get(0), row.get(1)))
    }

    fn info(&self, id: TaskId) -> Option<TaskInfo> {
        let seq = self.seq(id)?;
        let row = self
            .with_conn(|c| {
                c.query_opt(
                    concat!(
                        "SELECT ",
                        info_columns!(),
                        " FROM tasq_tasks t WHERE t.id = $1"
                    ),
                    &[&seq],
                )
            })
            .ok()??;
        Some(self.info_of_row(&row, self.clock.now()))
    }

    fn tasks(&self, filter: &TaskFilter, after: Option<TaskId>, limit: usize) -> Vec<TaskInfo> {
        // Pages run in id order across pools, as on the embedded store.
        let after = match after {
            Some(id) if id.pool() == self.queue => i64::try_from(id.seq()).unwrap_or(i64::MAX),
            Some(id) if id.pool() > self.queue => return Vec::new(),
            _ => 0,
        };
        if limit == 0 {
            return Vec::new();
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = tasks_page(filter.get_state(), filter.get_task_type().is_some());
        let rows = self
            .with_conn(|c| match filter.get_task_type() {
                Some(name) => c.query(&sql, &[&after, &limit, &name]),
                None => c.query(&sql, &[&after, &limit]),
            })
            .unwrap_or_default();
        let now = self.clock.now();
        rows.iter().map(|row| self.info_of_row(row, now)).collect()
    }

    fn watch(&self, id: TaskId, completion: &Arc<Completion>) {
        if let Some(seq) = self.seq(id) {
            self.watch_seq(seq, completion);
        }
    }

    fn hub(&self) -> &Arc<StoreHub> {
        &self.hub
    }

    fn completion_of(&self, id: TaskId) -> Option<(u32, Arc<Completion>)> {
        let seq = self.seq(id)?;
        let sql = format!(
            "SELECT {} FROM tasq_tasks WHERE id = $1",
            Self::OUTCOME_COLUMNS
        );
        let row = self.with_conn(|c| c.query_opt(&sql, &[&seq])).ok()??;
        let type_index = self.type_index(row.get("type"))?;
        let completion = self.completion_for(seq);
        let status: &str = row.get("status");
        if matches!(status, "succeeded" | "failed" | "cancelled") {
            self.publish_row(seq, &row);
        }
        Some((type_index, completion))
    }

    fn stats(&self) -> Stats {
        self.try_stats().unwrap_or_else(|_| {
            // The database is away: what this process knows.
            let local = self.local.lock();
            Stats::empty(local.live_workers, local.totals)
        })
    }

    fn try_stats(&self) -> Result<Stats, String> {
        super::stats::read(self)
    }

    fn type_stats(&self) -> Vec<TypeStats> {
        super::stats::read_types(self).unwrap_or_else(|_| super::stats::empty_types(self))
    }

    /// Unlike [`stats`](Store::stats), says when the database could not be read: an alert must
    /// not clear on a reading of zeros taken while the database is away.
    fn backlog(&self, types: bool) -> Option<(Stats, Vec<TypeStats>)> {
        let stats = super::stats::read(self).ok()?;
        let types = if types {
            super::stats::read_types(self).ok()?
        } else {
            Vec::new()
        };
        Some((stats, types))
    }

    fn dead_letters(
        &self,
        after: Option<TaskId>,
        type_index: Option<u32>,
        limit: usize,
    ) -> Vec<DeadLetter> {
        // Pages run in id order across pools, as on the embedded store.
        let after = match after {
            Some(id) if id.pool() == self.queue => i64::try_from(id.seq()).unwrap_or(i64::MAX),
            Some(id) if id.pool() > self.queue => return Vec::new(),
            _ => 0,
        };
        let type_name = type_index.map(|i| self.registry.entry(i).name);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .with_conn(|c| {
                c.query(
                    "SELECT id, type, COALESCE(base_priority, priority), failure_reason, attempts,
                            last_error,
                            EXTRACT(EPOCH FROM finished_at - tasq_now())::FLOAT8
                     FROM tasq_tasks WHERE dead AND id > $1
                       AND ($2::TEXT IS NULL OR type = $2)
                     ORDER BY id LIMIT $3",
                    &[&after, &type_name, &limit],
                )
            })
            .unwrap_or_default();
        rows.iter()
            .map(|row| {
                let name: String = row.get(1);
                DeadLetter {
                    id: self.id(row.get(0)),
                    task_type: self
                        .type_index(&name)
                        .map_or_else(|| leak_name(name), |i| self.registry.entry(i).name),
                    priority: u8::try_from(row.get::<_, i16>(2)).unwrap_or(0),
                    failure: super::rows::failure_of(row.get(3), row.get(4), row.get(5)),
                    failed_at: super::rows::instant_in(self.clock.now(), row.get(6)),
                }
            })
            .collect()
    }

    fn purge_dead_letter(&self, id: TaskId) -> bool {
        let Some(seq) = self.seq(id) else {
            return false;
        };
        self.with_conn(|c| c.execute(super::cancel::PURGE, &[&seq]))
            .is_ok_and(|n| n == 1)
    }

    fn resubmit(
        &self,
        id: TaskId,
        type_index: u32,
    ) -> Result<(TaskId, Arc<Completion>), ResubmitError> {
        let revived = self.revive(id, type_index, false)?;
        Ok((revived.id, revived.completion))
    }

    fn resubmit_with_dependents(
        &self,
        id: TaskId,
        type_index: u32,
    ) -> Result<Revived, ResubmitError> {
        self.revive(id, type_index, true)
    }

    fn take_dead_letter(&self, id: TaskId, type_index: u32) -> Option<Box<dyn Any + Send>> {
        let seq = self.seq(id)?;
        let entry = self.registry.entry(type_index);
        let codec = entry.codec?;
        // Decoded before the row lets go of it: a payload that no longer decodes stays a dead
        // letter (listed, and resubmittable after a fix), instead of being lost.
        self.with_conn(|c| {
            let mut tx = c.transaction()?;
            let Some(row) = tx.query_opt(
                "SELECT payload FROM tasq_tasks WHERE id = $1 AND dead AND type = $2 FOR UPDATE",
                &[&seq, &entry.name],
            )?
            else {
                return Ok(None);
            };
            // The payload's `Deserialize` is user code; no lock of ours is held.
            let Ok(payload) = codec.decode_payload(row.get(0)) else {
                return Ok(None);
            };
            let taken = tx.execute(
                "UPDATE tasq_tasks SET dead = false, payload = NULL WHERE id = $1",
                &[&seq],
            );
            match taken.and_then(|_| tx.commit()) {
                Ok(()) => Ok(Some(payload)),
                Err(error) => {
                    unwind::drop_quietly(payload);
                    Err(error)
                }
            }
        })
        .ok()?
    }

    /// Decodes the row's JSON: a fresh value, no `Clone` needed and no lock of ours held
    /// (the `Deserialize` runs inside `catch_unwind`). A payload that no longer decodes is
    /// `None`, as for `take_dead_letter`, and stays a dead letter.
    fn dead_letter_payload(
        &self,
        id: TaskId,
        type_index: u32,
        _copy: &CopyPayload,
    ) -> Option<Box<dyn Any + Send>> {
        let seq = self.seq(id)?;
        let entry = self.registry.entry(type_index);
        let codec = entry.codec?;
        let row = self
            .with_conn(|c| {
                c.query_opt(
                    "SELECT payload FROM tasq_tasks WHERE id = $1 AND dead AND type = $2",
                    &[&seq, &entry.name],
                )
            })
            .ok()??;
        codec.decode_payload(row.get(0)).ok()
    }

    fn pause(&self, target: &PauseTarget) -> Result<bool, PauseError> {
        super::pause::pause(self, self.holder(), target)
    }

    fn resume(&self, target: &PauseTarget) -> Result<bool, PauseError> {
        super::pause::resume(self, target)
    }

    fn paused(&self) -> Result<Vec<Paused>, PauseError> {
        super::pause::pauses(self)
    }

    fn set_queue_limit(
        &self,
        queue: &str,
        limit: Option<u32>,
    ) -> Result<Option<u32>, QueueLimitError> {
        self.set_fleet_queue_limit(queue, limit)
    }

    fn queue_limits(&self) -> Result<Vec<QueueLimit>, QueueLimitError> {
        super::queue_limits::limits(self)
    }

    fn register_schedules(&self, schedules: &[ScheduleDef]) -> Result<(), String> {
        self.register_schedules_in_fleet(schedules)
    }

    fn tick_schedule(&self, schedule: &ScheduleDef) -> Result<Tick, String> {
        self.tick_fleet_schedule(schedule)
    }

    fn schedules(&self) -> Result<Vec<ScheduleInfo>, String> {
        self.list_schedules()
    }

    fn overview(&self) -> Result<Overview, String> {
        super::admin::overview(self)
    }

    fn wait_idle(&self, deadline: Option<Instant>) -> Result<(), WaitError> {
        self.poll_until(deadline, |store| {
            if !store.local.lock().settled() {
                return false;
            }
            // Ready tasks that a gate holds until the clock moves (an empty bucket, a breaker
            // cooling down) are not due work, as delayed tasks are not.
            let held = match &store.gates {
                Some(gates) => match super::gating::held_until_later(store, gates) {
                    Ok(held) => held,
                    Err(_) => return false,
                },
                None => Vec::new(),
            };
            store
                .with_conn(|c| c.query_one(IDLE, &[&held]))
                .is_ok_and(|row| row.get::<_, bool>(0))
        })
    }

    fn wait_empty(&self, deadline: Option<Instant>) -> Result<(), WaitError> {
        self.poll_until(deadline, |store| {
            if !store.local.lock().settled() {
                return false;
            }
            store
                .with_conn(|c| c.query_one(EMPTY, &[]))
                .is_ok_and(|row| row.get::<_, bool>(0))
        })
    }

    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn drain(&self, from_handler: bool, deadline: Option<Instant>) -> Drained {
        let mut local = self.local.lock();
        let before = local.totals;
        local.closed = true;
        if from_handler {
            local.handlers_in_shutdown += 1;
        }
        let given_back = self.take_held(&mut local);
        self.work_cv.notify_all();
        self.fetch_cv.notify_all();
        drop(local);
        self.give_back(given_back, Vec::new());
        let mut local = self.local.lock();
        let mut deadline_reached = false;
        while local.running.len() > local.handlers_in_shutdown {
            if deadline.is_some_and(|d| self.clock.now() >= d) {
                deadline_reached = true;
                break;
            }
            self.clock.wait_until(&self.done_cv, &mut local, deadline);
        }
        local.stopping = true;
        // Not the runs whose handler succeeded, and whose ack the completer still writes.
        let interrupted: Vec<(TaskId, &'static str)> = local
            .running
            .iter()
            .filter(|(_, held)| !held.acking)
            .map(|(seq, held)| (self.id(*seq), self.registry.entry(held.type_index).name))
            .collect();
        for held in local.running.values().filter(|held| !held.acking) {
            held.token.fire(Interrupt::Shutdown);
        }
        self.work_cv.notify_all();
        self.fetch_cv.notify_all();
        Drained {
            deadline_reached,
            before,
            interrupted,
        }
    }

    fn wait_for_workers(&self, from_handler: bool) -> Totals {
        let mut local = self.local.lock();
        while local.live_workers > local.handlers_in_shutdown {
            self.done_cv.wait(&mut local);
        }
        if from_handler {
            local.handlers_in_shutdown -= 1;
            self.done_cv.notify_all();
        }
        drop(local);
        // The fetcher may still give back claims it fetched as the pool stopped, and count
        // those whose cancel was asked for, and the completer writes the acks still waiting:
        // the totals are read once both have finished. An ack handed over later (by a handler
        // that called this) is written by its worker.
        self.acks.stop();
        self.join_threads();
        let (totals, litter) = {
            let mut local = self.local.lock();
            (local.totals, std::mem::take(&mut local.litter))
        };
        super::acks::drop_litter(litter);
        totals
    }

    fn stop_now(&self) {
        let given_back = {
            let mut local = self.local.lock();
            local.closed = true;
            local.stopping = true;
            for held in local.running.values().filter(|held| !held.acking) {
                held.token.fire(Interrupt::Shutdown);
            }
            self.work_cv.notify_all();
            self.fetch_cv.notify_all();
            self.done_cv.notify_all();
            self.take_held(&mut local)
        };
        self.acks.stop();
        self.give_back(given_back, Vec::new());
    }

    fn check_invariants(&self) -> Result<(), String> {
        super::dispatch::check_invariants(self)?;
        match &self.gates {
            Some(gates) => super::gating::check(self, gates),
            None => Ok(()),
        }
    }

    fn claim(&self, _worker: usize, spare: Option<CancelToken>) -> Option<Claim> {
        drop(spare);
        let mut local = self.local.lock();
        loop {
            if !local.litter.is_empty() {
                // What the completer left (`completer.rs`): dropped here, where user code may run.
                let litter = std::mem::take(&mut local.litter);
                drop(local);
                super::acks::drop_litter(litter);
                local = self.local.lock();
                continue;
            }
            if local.stopping {
                return None;
            }
            if let Some((lane, mut claim)) = local.start_next() {
                let seq = super::rows::local_seq(self.queue, claim.id).unwrap_or(0);
                let now = Instant::now();
                let lost = match local.running.get_mut(&seq) {
                    Some(held) if now < held.valid_until => {
                        held.started_at = Some(now);
                        false
                    }
                    _ => true,
                };
                if lost {
                    // Its lease may be gone: given back (fenced by the lease, so a row another
                    // worker took since is left alone), never started.
                    local.running.remove(&seq);
                    local.unstart(lane);
                    local.wake = true;
                    self.fetch_cv.notify_one();
                    drop(local);
                    self.count(|t| t.lapsed_claims += 1);
                    self.give_back(vec![claim], Vec::new());
                    local = self.local.lock();
                    continue;
                }
                claim.claimed_at = self.clock.now();
                return Some(claim);
            }
            if local.closed {
                return None;
            }
            self.work_cv.wait(&mut local);
        }
    }

    fn complete_and_claim(
        &self,
        claim: Claim,
        outcome: RunOutcome,
        token: CancelToken,
        run: RunEnd<'_>,
    ) -> Option<Claim> {
        drop(token);
        let (timed_out, worker) = (run.timed_out, run.worker);
        run.count(self.clock.now());
        self.complete(claim, outcome, timed_out);
        self.claim(worker, None)
    }

    fn worker_panicked(&self, held: Option<TaskId>, message: String) {
        self.count(|t| t.worker_panics += 1);
        let Some(seq) = held.and_then(|id| self.seq(id)) else {
            return;
        };
        let held = self
            .local
            .lock()
            .running
            .get(&seq)
            .map(|h| (h.lease, h.lane));
        if let Some((lease, lane)) = held {
            let failure = crate::model::state::Failure::new(
                crate::model::state::FailureReason::Panicked,
                0,
                message,
                None,
            );
            let now = self.manual_now_us();
            self.finish(seq, lease, lane, super::acks::Ending::Failed(failure), now);
        }
    }

    fn worker_exited(&self) {
        let mut local = self.local.lock();
        local.live_workers -= 1;
        self.done_cv.notify_all();
    }
}

/// Whether the queue runs nothing and holds nothing due but the types `$1`, which gates hold
/// back, and the paused types and queues (`wait_idle`'s poll): each priority's due range read
/// until a task of another type.
pub(super) const IDLE: &str = concat!(
    ready_priorities!(),
    "SELECT NOT EXISTS (SELECT 1 FROM tasq_tasks WHERE status = 'running')
        AND NOT EXISTS (
            SELECT 1 FROM prio, LATERAL (
                SELECT 1 FROM tasq_tasks t
                WHERE t.status = 'ready' AND t.priority = prio.p AND t.run_at <= tasq_now()
                  AND t.type <> ALL($1)
                  AND NOT EXISTS (SELECT 1 FROM tasq_pauses p
                                  WHERE (p.kind = 'type' AND p.name = t.type)
                                     OR (p.kind = 'queue' AND p.name = t.queue))
                LIMIT 1) x
            WHERE prio.p IS NOT NULL)"
);

/// Whether the queue holds no unfinished task (`wait_empty`'s poll): one lookup in each
/// state's partial index (one `IN` over the three let the planner pick a sequential scan,
/// which reads every finished row before the first live one).
pub(super) const EMPTY: &str = "
    SELECT NOT EXISTS (SELECT 1 FROM tasq_tasks WHERE status = 'running')
       AND NOT EXISTS (SELECT 1 FROM tasq_tasks WHERE status = 'ready')
       AND NOT EXISTS (SELECT 1 FROM tasq_tasks WHERE status = 'blocked')";
