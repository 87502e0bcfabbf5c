//! How a claimed task's run ends: the fenced writes of its outcome (a success handed to the
//! completer, `completer.rs`; the others written by the worker), the cascades to dependents, what
//! follows a written ending (totals, events, local handles), and the worker's slot freed.

use std::time::{Duration, Instant};

use super::acks::{Ending, Litter, drop_litter};
use super::conn::Sql;
use super::rows;
use super::store::{Local, PgStore};
use super::submit::notify;
use crate::model::cancel::Interrupt;
use crate::model::completion::Finished;
use crate::model::state::{CancelReason, Failure, FailureReason, TaskState};
use crate::observe::event::Event;
use crate::store::{Claim, RunOutcome};
use crate::sync::Weak;
use crate::unwind;

impl PgStore {
    /// Records a claimed task's run (see [`Store::complete_and_claim`](crate::store::Store));
    /// `timed_out`: it ran past its timeout.
    pub(super) fn complete(&self, claim: Claim, outcome: RunOutcome, timed_out: bool) {
        // The run ended now: on a manual clock, its verdict and its ending are written at this
        // time, however late their statements run. Else a clock moved in between would split
        // them: a breaker opened at t, its retry due only after t + the move (with no further
        // move, never), which the embedded store, writing both under one lock, cannot do.
        let ended_at = self.manual_now_us();
        let seq = rows::local_seq(self.queue, claim.id).unwrap_or(0);
        let lease = claim.lease.unwrap_or(0);
        let claim_lane = claim.lane as usize;
        if claim.token.interrupt() == Some(Interrupt::Shutdown)
            && !timed_out
            && !matches!(outcome, RunOutcome::Succeeded(_))
        {
            // Stopped by this process's shutdown, not failed: the task goes back for another
            // process with the attempt not counted, as a claim that never started does; its
            // run says nothing about its downstream. Not a run past its timeout, though the
            // shutdown fired its token first: the handler overran its task's own limit, as it
            // would have without the shutdown, and the attempt counts (else a handler that
            // ignores its token and always overruns would never use its attempts up in a fleet
            // that restarts often).
            unwind::drop_quietly(outcome);
            self.give_back_run(seq, lease, claim.lane as usize);
            unwind::drop_quietly(claim.payload);
            return;
        }
        if let Some(downstream) = self.registry.entry(claim.type_index).downstream {
            // Before the ending: once the probe's row stops running, its breaker has already
            // closed or reopened (see `gates.rs`).
            let verdict = outcome.verdict();
            super::gating::record(self, downstream as usize, seq, lease, verdict, ended_at);
        }
        // The payload is dropped after the outcome is written and published: its `Drop` is user
        // code, and may wait for this very task (as on the embedded store).
        let payload = claim.payload;
        let ending = match outcome {
            RunOutcome::Succeeded(output) => {
                match self.codec(claim.type_index).encode_output(&*output) {
                    Ok(value) => {
                        let ack =
                            super::acks::Ack::new(seq, lease, value, output, payload, ended_at);
                        self.hand_over(ack, claim_lane);
                        return;
                    }
                    Err(error) => {
                        unwind::drop_quietly(output);
                        Ending::Failed(Failure::new(
                            FailureReason::BadPayload,
                            claim.attempt,
                            format!("the output could not be encoded: {error}"),
                            None,
                        ))
                    }
                }
            }
            RunOutcome::Retry { delay, error } => Ending::Retry {
                delay,
                error,
                attempt: claim.attempt,
            },
            RunOutcome::Failed(mut failure) => {
                failure.attempts = claim.attempt;
                Ending::Failed(failure)
            }
        };
        self.finish(seq, lease, claim_lane, ending, ended_at);
        unwind::drop_quietly(payload);
    }

    /// Writes how task `seq`'s run under `lease` ended, fenced by the lease, with `tasq_now()`
    /// at `ended_at` (with a manual clock: the time the run ended, see `with_conn_at`); retried
    /// while the database is away. Then publishes the outcome to local handles, frees the
    /// worker's slot, and drops what the run left (on this thread: a worker's, or the
    /// fetcher's for a claim that never ran).
    pub(super) fn finish(
        &self,
        seq: i64,
        lease: i64,
        lane: usize,
        ending: Ending,
        ended_at: Option<i64>,
    ) {
        let (written, cascaded) =
            self.write_until_done(|store| store.write_ending(seq, lease, &ending, ended_at));
        let mut litter = Vec::new();
        let from_row = self.settle(seq, written, cascaded, ending, &mut litter);
        self.release(seq, lease, lane);
        self.after_release(seq, written, from_row);
        drop_litter(litter);
    }

    /// Runs `write` until it answers (the lost connection's outcome is retried until written
    /// or the lease is gone: then the write finds no row, and the task runs again elsewhere):
    /// the state written and the dependents cancelled, `None` if the lease was lost.
    pub(super) fn write_until_done(
        &self,
        mut write: impl FnMut(&PgStore) -> Result<Option<(TaskState, u64)>, String>,
    ) -> (Option<TaskState>, u64) {
        let mut delay = Duration::from_millis(20);
        loop {
            match write(self) {
                Ok(Some((state, cascaded))) => return (Some(state), cascaded),
                Ok(None) => return (None, 0),
                Err(_) => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// What follows a written ending (`written`: the state, `None` if the lease was lost;
    /// `cascaded`: dependents it cancelled): the totals, the lifecycle's events, the outcome
    /// published to a local handle. Call while the task is still in `Local::running`. The
    /// user values left over (the ending's output if no handle took it, the last reference to
    /// a completion) go to `litter`, for the caller to drop where user code may run. Returns
    /// whether the outcome must be read back from the row (see [`after_release`]).
    ///
    /// [`after_release`]: PgStore::after_release
    pub(super) fn settle(
        &self,
        seq: i64,
        written: Option<TaskState>,
        cascaded: u64,
        ending: Ending,
        litter: &mut Vec<Litter>,
    ) -> bool {
        // Counted first, as on the embedded store: a waiter that wakes sees its task in the
        // totals.
        let type_index = {
            let mut local = self.local.lock();
            match &written {
                Some(TaskState::Succeeded) => local.totals.succeeded += 1,
                Some(TaskState::Failed) => local.totals.failed += 1,
                Some(TaskState::Cancelled) => local.totals.cancelled += 1,
                Some(_) => local.totals.retried += 1,
                None => {}
            }
            // Dependents its ending cancelled.
            local.totals.cancelled += cascaded;
            local
                .running
                .get(&seq)
                .map(|held| (held.type_index, held.attempt))
        };
        if let Some((type_index, attempt)) = type_index {
            let (id, task_type) = (self.id(seq), self.registry.entry(type_index).name);
            match (written, &ending) {
                (Some(TaskState::Succeeded), _) => self.events.lifecycle(|| Event::Succeeded {
                    id,
                    task_type,
                    attempt,
                }),
                // A running row is cancelled only as asked (`cancel_row`).
                (Some(TaskState::Cancelled), _) => self.events.lifecycle(|| Event::Cancelled {
                    id,
                    task_type,
                    reason: CancelReason::Requested,
                }),
                (
                    Some(TaskState::Scheduled),
                    Ending::Retry {
                        delay,
                        error,
                        attempt,
                    },
                ) => {
                    self.events.lifecycle(|| Event::Retrying {
                        id,
                        task_type,
                        attempt: *attempt,
                        delay: *delay,
                        error: error.clone(),
                    });
                }
                // A dead letter is told below, whether or not the lifecycle is; a lost lease
                // is told nothing: this pool recorded nothing.
                _ => {}
            }
        }
        let type_index = type_index.map(|(index, _)| index);
        if let (Some(TaskState::Failed), Ending::Failed(failure)) = (&written, &ending) {
            let name = type_index.map_or("?", |index| self.registry.entry(index).name);
            self.events.dead_letter(self.id(seq), name, failure);
        }
        // Published while the task is still `running` here, so that a notification or the
        // poll, which skip such tasks (see `publish_row`), cannot publish a copy decoded from
        // the row first: local handles get the output itself.
        let terminal = written.is_some_and(TaskState::is_terminal);
        let waiter = terminal
            .then(|| self.waiters.lock().get(&seq).and_then(Weak::upgrade))
            .flatten();
        match (waiter, ending, written) {
            (Some(completion), Ending::Succeeded(_, output), Some(TaskState::Succeeded)) => {
                let finished = Finished::Succeeded(Some(output));
                litter.extend(completion.publish_first(finished).map(Litter::Finished));
                // The last reference, if every handle went meanwhile.
                litter.push(Litter::Completion(completion));
                false
            }
            (Some(completion), Ending::Failed(failure), Some(TaskState::Failed)) => {
                let finished = Finished::Failed(Box::new(failure));
                litter.extend(completion.publish_first(finished).map(Litter::Finished));
                litter.push(Litter::Completion(completion));
                false
            }
            // Cancelled instead: the row says why.
            (Some(completion), ending, _) => {
                litter.push(Litter::Ending(ending));
                litter.push(Litter::Completion(completion));
                true
            }
            (None, ending, _) => {
                litter.push(Litter::Ending(ending));
                false
            }
        }
    }

    /// After a run left `Local::running`: its outcome read back from the row for local
    /// handles if [`settle`](PgStore::settle) said so, else its waiter forgotten once terminal.
    pub(super) fn after_release(&self, seq: i64, written: Option<TaskState>, from_row: bool) {
        if from_row {
            self.publish_seq(seq);
        } else if written.is_some_and(TaskState::is_terminal) {
            self.waiters.lock().remove(&seq);
        }
    }

    /// Hands a success to the completer (`completer.rs`) and frees the worker's slot; the run stays
    /// in `Local::running` until its ack is written. Then drops what the completer left for a
    /// worker. Once the completer has stopped, writes the ack here.
    fn hand_over(&self, ack: super::acks::Ack, lane: usize) {
        let (seq, lease) = (ack.seq, ack.lease);
        let litter = {
            let mut local = self.local.lock();
            let started_at = match local.running.get_mut(&seq) {
                Some(held) if held.lease == lease => {
                    held.acking = true;
                    held.started_at
                }
                _ => None,
            };
            self.free_slot(&mut local, lane, started_at);
            std::mem::take(&mut local.litter)
        };
        drop_litter(litter);
        if let Err(ack) = self.acks.hand_over(ack) {
            let mut litter = Vec::new();
            super::completer::settle(self, ack, false, &mut litter);
            drop_litter(litter);
        }
    }

    /// Gives back the row of a run that this pool's shutdown interrupted (see `complete`), then
    /// frees the worker's slot. If the database is away the lease runs out instead, and the
    /// reaper returns the row (counting the attempt).
    fn give_back_run(&self, seq: i64, lease: i64, lane: usize) {
        self.give_back_leases(&[lease]);
        self.release(seq, lease, lane);
    }

    /// A run under `lease` of lane `lane` is over here: forgets its entry and frees its
    /// worker's slot (see [`forget_run`](PgStore::forget_run) and
    /// [`free_slot`](PgStore::free_slot)).
    fn release(&self, seq: i64, lease: i64, lane: usize) {
        let mut local = self.local.lock();
        let started_at = self.forget_run(&mut local, seq, lease);
        self.free_slot(&mut local, lane, started_at);
    }

    /// A run under `lease` has ended here and its ending is written: forgets its entry (only
    /// this lease's: a retry due at once may already have been claimed again by this pool's
    /// fetcher, under a new lease whose entry must stay: its heartbeat, its cancels, its
    /// type), and wakes the fetcher (its queue, if limited, may have room again) and whoever
    /// waits for the pool's runs to end. Returns when a worker took the claim.
    pub(super) fn forget_run(&self, local: &mut Local, seq: i64, lease: i64) -> Option<Instant> {
        let mut started_at = None;
        if let Some(held) = local.running.remove(&seq) {
            if held.lease == lease {
                started_at = held.started_at;
            } else {
                local.running.insert(seq, held);
            }
        }
        // Every idle limited queue is tried again (see `queue_limits.rs`): the row's queue may
        // not be the one this pool registers its type in.
        local.announce();
        local.wake = true;
        if local.wants_claim() {
            self.fetch_cv.notify_one();
        }
        self.done_cv.notify_all();
        started_at
    }

    /// A worker of lane `lane` is done with a claim it took at `started_at` (its run ended,
    /// or it handed its ack to the completer): its slot is free. Counts the turn for the
    /// lane's pace, and wakes the fetcher and a worker for a claim of the lane that waited.
    pub(super) fn free_slot(&self, local: &mut Local, lane: usize, started_at: Option<Instant>) {
        if let (Some(at), Some(pace)) = (started_at, &mut local.lanes[lane].pace) {
            pace.ran(at.elapsed());
        }
        local.run_ended(lane);
        local.wake = true;
        if local.wants_claim() {
            self.fetch_cv.notify_one();
        }
        if local.lanes.len() > 1 && !local.queue.is_empty() {
            // A claim of this lane may have waited for its worker (a pool with one lane never
            // holds a claim back: a worker that asks has a free slot).
            self.work_cv.notify_one();
        }
        self.done_cv.notify_all();
    }

    /// One attempt at writing an ending: the state written and how many dependents it
    /// cancelled. `Ok(None)`: the lease was lost, nothing written.
    fn write_ending(
        &self,
        seq: i64,
        lease: i64,
        ending: &Ending,
        ended_at: Option<i64>,
    ) -> Result<Option<(TaskState, u64)>, String> {
        // The common case in one statement: no cancel asked (checked on the row's latest
        // version, under its lock). A success never comes here: the completer writes it
        // (`completer.rs`); were one to, the general path would write it too.
        let fast = match ending {
            Ending::Retry { delay, error, .. } => self.with_conn_at(ended_at, |c| {
                c.execute(
                    "UPDATE tasq_tasks SET status = 'ready', last_error = $3, lease_id = NULL,
                            lease_until = NULL,
                            run_at = tasq_now() + interval '1 microsecond' * $4::BIGINT,
                            priority = COALESCE(base_priority, priority), base_priority = NULL
                     WHERE id = $1 AND lease_id = $2 AND status = 'running'
                       AND cancel_requested IS NULL",
                    &[&seq, &lease, error, &rows::micros(*delay)],
                )
            })?,
            Ending::Succeeded(..) | Ending::Failed(_) => 0,
        };
        if fast == 1 {
            return Ok(Some((TaskState::Scheduled, 0)));
        }
        self.write_general(seq, lease, ending, ended_at)
    }

    /// One attempt at the general ending ([`write_ending_tx`]) in a transaction of its own.
    pub(super) fn write_general(
        &self,
        seq: i64,
        lease: i64,
        ending: &Ending,
        ended_at: Option<i64>,
    ) -> Result<Option<(TaskState, u64)>, String> {
        self.with_conn_at(ended_at, |c| {
            let mut tx = c.transaction()?;
            let written = write_ending_tx(&mut tx, seq, lease, ending)?;
            tx.commit()?;
            Ok(written)
        })
    }
}

/// The general ending, in a transaction: fenced by the lease, a cancel asked for wins over the
/// handler's result, and dependents are released or cancelled in the same transaction.
pub(super) fn write_ending_tx(
    tx: &mut impl Sql,
    seq: i64,
    lease: i64,
    ending: &Ending,
) -> Result<Option<(TaskState, u64)>, postgres::Error> {
    let Some(row) = tx.query_opt(
        "SELECT cancel_requested, has_dependents FROM tasq_tasks
         WHERE id = $1 AND lease_id = $2 AND status = 'running' FOR UPDATE",
        &[&seq, &lease],
    )?
    else {
        // Not running under this lease any more: lost, unless the handler ended it itself, in
        // its own transaction (`Context::succeed_in`), which keeps the lease on the row.
        let ended = tx.query_opt(
            "SELECT status FROM tasq_tasks WHERE id = $1 AND lease_id = $2
             AND status IN ('succeeded', 'failed', 'cancelled')",
            &[&seq, &lease],
        )?;
        return Ok(ended.map(|row| (rows::state_of(row.get(0), true), 0)));
    };
    let cancel: Option<String> = row.get(0);
    let has_dependents: bool = row.get(1);
    let mut done = Vec::new();
    let mut ready = false;
    let state = match (cancel, ending) {
        (Some(reason), _) => {
            tx.execute(
                "UPDATE tasq_tasks SET status = 'cancelled', cancel_reason = $2,
                        finished_at = tasq_now(), lease_until = NULL
                 WHERE id = $1",
                &[&seq, &reason],
            )?;
            cascade_ended(tx, seq, "cancelled", has_dependents, &mut done)?;
            TaskState::Cancelled
        }
        (None, Ending::Succeeded(output, _)) => {
            tx.execute(
                "UPDATE tasq_tasks SET status = 'succeeded', output = $2, finished_at = tasq_now(),
                        lease_until = NULL
                 WHERE id = $1",
                &[&seq, output],
            )?;
            if has_dependents {
                // The dependents are locked in id order, as a submit locks its dependencies
                // (see `cascade`).
                let released = tx.query(
                    "WITH locked AS (
                         SELECT t.id FROM tasq_tasks t JOIN tasq_deps d ON t.id = d.dependent
                         WHERE d.dependency = $1 AND t.status = 'blocked'
                         ORDER BY t.id FOR UPDATE OF t
                     )
                     UPDATE tasq_tasks t SET pending_deps = t.pending_deps - 1,
                            status = CASE WHEN t.pending_deps = 1 THEN 'ready' ELSE 'blocked' END
                     FROM locked
                     WHERE t.id = locked.id AND t.status = 'blocked'
                     RETURNING t.status = 'ready' AND t.run_at <= tasq_now()",
                    &[&seq],
                )?;
                ready = released.iter().any(|r| r.get::<_, bool>(0));
            }
            done.push(seq);
            TaskState::Succeeded
        }
        (None, Ending::Retry { delay, error, .. }) => {
            tx.execute(
                "UPDATE tasq_tasks SET status = 'ready', last_error = $2, lease_id = NULL,
                        lease_until = NULL, run_at = tasq_now() + interval '1 microsecond' * $3::BIGINT,
                        priority = COALESCE(base_priority, priority), base_priority = NULL
                 WHERE id = $1",
                &[&seq, error, &rows::micros(*delay)],
            )?;
            TaskState::Scheduled
        }
        (None, Ending::Failed(failure)) => {
            tx.execute(
                "UPDATE tasq_tasks SET status = 'failed', dead = true, failure_reason = $2,
                        last_error = $3, attempts = CASE WHEN $4 > 0 THEN $4 ELSE attempts END,
                        finished_at = tasq_now(),
                        lease_until = NULL
                 WHERE id = $1",
                &[
                    &seq,
                    &rows::failure_reason_text(failure.reason),
                    &failure.error,
                    &i32::try_from(failure.attempts).unwrap_or(i32::MAX),
                ],
            )?;
            cascade_ended(tx, seq, "failed", has_dependents, &mut done)?;
            enforce_dead_letter_limit(tx)?;
            TaskState::Failed
        }
    };
    // Every ended task is announced; the dependents cancelled are all but this one.
    let cascaded = done.len() as u64 - u64::from(state.is_terminal());
    notify_changes(tx, ready, &done)?;
    Ok(Some((state, cascaded)))
}

/// Keeps the newest dead letters, as many as the queue's policy says (as the schema holds it
/// now, not as this process was built: see `policy.rs`); the older ones stop being dead letters
/// and lose their payloads (their rows then age out like any finished task's).
pub(super) fn enforce_dead_letter_limit(tx: &mut impl Sql) -> Result<u64, postgres::Error> {
    tx.execute(TRIM_DEAD_LETTERS, &[])
}

/// Cancels, transitively, the blocked dependents of `root` (which failed or was cancelled):
/// its direct dependents with `reason`, theirs with `dependency_cancelled`. Returns their ids.
///
/// One statement per level of dependents, not one recursive query: each statement reads the
/// edges committed before it starts. A submit that made a task of this level a dependency
/// holds that task's row lock until it commits its edge, so the level's update waits for it,
/// and the next level's statement sees the new edge (a recursive query, reading one snapshot
/// taken at its start, would miss it and leave the new task blocked forever).
///
/// Locks are taken in id order, as a submit locks its dependencies, so a submit naming two of
/// the doomed tasks and this cascade cannot each hold one and wait for the other: first every
/// dependent the recursive query finds (levels interleave in id order: a second-level task may
/// come before a first-level one), then each level's rows again as it is updated (only an edge
/// committed since adds a lock, in that level's order).
fn cascade(tx: &mut impl Sql, root: i64, reason: &str) -> Result<Vec<i64>, postgres::Error> {
    tx.query(
        "WITH RECURSIVE doomed(id) AS (
             SELECT dependent FROM tasq_deps WHERE dependency = $1
             UNION
             SELECT d.dependent FROM tasq_deps d JOIN doomed ON d.dependency = doomed.id
         )
         SELECT t.id FROM tasq_tasks t JOIN doomed USING (id)
         WHERE t.status = 'blocked' ORDER BY t.id FOR UPDATE OF t",
        &[&root],
    )?;
    let mut doomed = Vec::new();
    let mut level = vec![root];
    let mut reason = reason;
    while !level.is_empty() {
        let rows = tx.query(
            "WITH locked AS (
                 SELECT t.id FROM tasq_tasks t JOIN tasq_deps d ON t.id = d.dependent
                 WHERE d.dependency = ANY($1) AND t.status = 'blocked'
                 ORDER BY t.id FOR UPDATE OF t
             )
             UPDATE tasq_tasks t SET status = 'cancelled', cancel_reason = $2,
                    cancel_cause = d.dependency, finished_at = tasq_now()
             FROM tasq_deps d, locked
             WHERE d.dependency = ANY($1) AND t.id = d.dependent AND t.id = locked.id
               AND t.status = 'blocked'
             RETURNING t.id",
            &[&level, &reason],
        )?;
        level = rows.iter().map(|r| r.get(0)).collect();
        doomed.extend_from_slice(&level);
        reason = "dependency_cancelled";
    }
    Ok(doomed)
}

/// A row that just ended (`failed` or `cancelled`) outside a worker's run, as the reaper and
/// a shutdown's give-back end them: its dependents are cancelled with it, and every id that
/// ended goes into `done` for the notification.
pub(super) fn cascade_ended(
    tx: &mut impl Sql,
    id: i64,
    status: &str,
    has_dependents: bool,
    done: &mut Vec<i64>,
) -> Result<(), postgres::Error> {
    if has_dependents {
        let reason = if status == "failed" {
            "dependency_failed"
        } else {
            "dependency_cancelled"
        };
        done.extend(cascade(tx, id, reason)?);
    }
    done.push(id);
    Ok(())
}

/// Longest notification payload sent: PostgreSQL refuses one of 8,000 bytes or more (and
/// with it the whole transaction).
const MAX_PAYLOAD: usize = 7_900;

/// Notifies, once, that tasks became ready (`ready`) and that tasks ended (` done:<id>` each),
/// if any. Too many ended tasks to name in one payload (a long cascade) are announced as
/// `done:*`: every listening pool then checks all the tasks its handles wait for.
pub(super) fn notify_changes(
    tx: &mut impl Sql,
    ready: bool,
    done: &[i64],
) -> Result<(), postgres::Error> {
    if !ready && done.is_empty() {
        return Ok(());
    }
    let mut payload = if ready {
        "ready".to_owned()
    } else {
        String::new()
    };
    for id in done {
        payload.push_str(" done:");
        payload.push_str(&id.to_string());
        if payload.len() > MAX_PAYLOAD {
            payload.truncate(if ready { "ready".len() } else { 0 });
            payload.push_str(" done:*");
            break;
        }
    }
    notify(tx, payload.trim_start())
}

/// Ends the dead letters beyond the schema's limit (see [`enforce_dead_letter_limit`]): those
/// up to the newest one past the limit, read through `tasq_dead` from its newest end (the limit's
/// entries, then only the rows it ends); nothing at all without a limit.
pub(super) const TRIM_DEAD_LETTERS: &str = "
    UPDATE tasq_tasks SET dead = false, payload = NULL
    WHERE dead AND (SELECT dead_letter_limit FROM tasq_schema) IS NOT NULL
      AND id <= (SELECT id FROM tasq_tasks WHERE dead ORDER BY id DESC
                 OFFSET (SELECT dead_letter_limit FROM tasq_schema) LIMIT 1)";
