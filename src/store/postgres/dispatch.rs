//! Claiming and ending tasks: the fetcher that claims batches for this pool's free workers,
//! the fenced writes of a run's outcome, and the cascades to dependents.

use std::any::Any;
use std::time::{Duration, Instant};

use postgres::Row;
use postgres::types::ToSql;
use serde_json::Value;

use super::conn::Sql;
use super::queue_limits::{Pick, Room, SOON};
use super::rows;
use super::store::PgStore;
use super::submit::notify;
use crate::model::cancel::{CancelToken, Interrupt};
use crate::model::state::{CancelReason, Failure, FailureReason, TaskState};
use crate::observe::event::Event;
use crate::store::{Claim, RunOutcome};
use crate::sync::{Arc, Weak};
use crate::unwind;

/// How a run ends, as the store writes it.
pub(super) enum Ending {
    Succeeded(Value, Box<dyn Any + Send + Sync>),
    Retry { delay: Duration, error: String },
    Failed(Failure),
}

/// The fetcher thread: claims up to as many due tasks as the pool has free slots (workers plus
/// prefetch), in one statement (a pool with gates: one transaction, see `gates.rs`), whenever it
/// is woken (a notification, a local submit, a freed worker, a manual clock's move), a gate
/// that held tasks back may have reopened, or a poll interval passes.
pub(super) fn fetch_loop(store: &Arc<PgStore>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::from_os_rng();
    let mut backoff = Duration::from_millis(50);
    loop {
        let wanted: Vec<(usize, usize)> = {
            let mut local = store.local.lock();
            loop {
                if local.closed || local.stopping {
                    return;
                }
                if local.wake && local.wants_claim(store.prefetch) {
                    local.wake = false;
                    break local.wanted(store.prefetch);
                }
                // Jittered (±10%), so idle pools started together do not poll together.
                let poll = Instant::now() + store.poll_interval.mul_f64(rng.random_range(0.9..1.1));
                let deadline = local.gate_wake.map_or(poll, |at| at.min(poll));
                // Timed: the poll is the fallback for a lost notification, and a bucket's next
                // token or a breaker's cool-down reopens a gate without any notification.
                store.fetch_cv.wait_until(&mut local, deadline);
                let now = Instant::now();
                if now >= deadline {
                    local.wake = true;
                    if local.gate_wake.is_some_and(|at| now >= at) {
                        local.gate_wake = None;
                    }
                }
            }
        };
        // Before the claim, so that it sees the priorities aged to the pool's clock.
        super::gating::age_if_due(store, true);
        store.refresh_limited();
        // Each claim of the round says when a gate or a limited queue's row may let it claim.
        store.local.lock().gate_wake = None;
        for (lane, wanted) in wanted {
            match claim_batch(store, lane, wanted) {
                Ok(claimed) => {
                    backoff = Duration::from_millis(50);
                    let full = claimed == wanted;
                    let mut local = store.local.lock();
                    local.totals.claims += 1;
                    local.totals.empty_claims += u64::from(claimed == 0);
                    // A full batch: there may be more right away.
                    local.wake |= full;
                }
                Err(_) => {
                    // The database is away: try again later (the poll wakes us anyway).
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    store.local.lock().wake = true;
                    break;
                }
            }
        }
    }
}

/// The claim's text, with a lane's filter or none.
macro_rules! claim_statement {
    // Passes over the limited queues' rows (claimed only under their rows' locks).
    ($lane:literal) => {
        claim_statement!(
            $lane,
            "AND (queue || '') <> ALL((SELECT limited FROM paused)::TEXT[])"
        )
    };
    ($lane:literal, $limited:literal) => {
        concat!(
            "
    WITH paused AS MATERIALIZED (SELECT * FROM tasq_paused()),
    picked AS (
        SELECT id FROM tasq_tasks
        WHERE status = 'ready' AND run_at <= tasq_now() AND type = ANY($1) ",
            $lane,
            "
          -- `|| ''`: no statistics for the planner to read. With one type or one queue in
          -- the table, `column <> <unknown>` is estimated to keep no row, and the plan turns
          -- to a sequential scan and a sort (128 ms instead of 0.3 at 300,000 rows).
          AND (type || '') <> ALL((SELECT types FROM paused)::TEXT[])
          AND (queue || '') <> ALL((SELECT queues FROM paused)::TEXT[]) ",
            $limited,
            "
        ORDER BY priority DESC, run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    UPDATE tasq_tasks t
    SET status = 'running', lease_id = nextval('tasq_lease'),
        lease_until = now() + interval '1 microsecond' * $3::BIGINT,
        attempts = t.attempts + 1
    WHERE t.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING t.id, t.type, t.payload, t.attempts, t.lease_id, t.priority, t.run_at,
              t.max_attempts, t.retry_base_us, t.retry_cap_us, t.timeout_us"
        )
    };
}

/// The claim: up to `$2` ready, due rows of the types `$1`, highest priority first, oldest due
/// first, each leased for `$3` microseconds of the database's time. The rows are picked in a
/// CTE, not in `WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`: with that form,
/// PostgreSQL may run the subquery more than once and claim more than n rows (bug #15715).
/// `SKIP LOCKED` lets concurrent claimers pass over each other's rows instead of waiting. The
/// picked ids are updated through the primary key (`= ANY(ARRAY(...))`, evaluated once): a
/// join with the CTE would let a generic plan (the statement is prepared once per connection)
/// hash the whole table.
pub(crate) const CLAIM: &str = claim_statement!("");

/// The claim of a lane of workers (`Builder::queue`): as [`CLAIM`], of the rows in the queues
/// `$4` only (through `tasq_queue_dequeue`).
pub(crate) const CLAIM_LANE: &str = claim_statement!("AND queue = ANY($4)");

/// The claim of a limited queue's rows (`queue_limits.rs`): as [`CLAIM_LANE`], of the limited
/// queue `$4` (one), in the transaction that holds its row's lock.
pub(crate) const CLAIM_LIMITED: &str = claim_statement!("AND queue = ANY($4)", "");

/// Claims up to `wanted` rows from what `pick` names, through the gates if the pool has any;
/// `true` with them if a limited queue's row was another claimer's.
fn claim_rows(store: &PgStore, pick: Pick<'_>, wanted: usize) -> Result<(Vec<Row>, bool), String> {
    let limit = i64::try_from(wanted).unwrap_or(i64::MAX);
    let lease_us = rows::micros(store.lease);
    let (rows, wake, busy) = match &store.gates {
        None => store.with_conn(|c| {
            let queues = pick.queues();
            match pick {
                Pick::Every => Ok((
                    c.query(CLAIM, &[&store.types, &limit, &lease_us])?,
                    None,
                    false,
                )),
                Pick::Lane(_) => Ok((
                    c.query(CLAIM_LANE, &[&store.types, &limit, &lease_us, &queues])?,
                    None,
                    false,
                )),
                Pick::Limited(queue) => {
                    let mut tx = c.transaction()?;
                    let (rows, busy) = match super::queue_limits::room(&mut tx, queue)? {
                        Room::Busy => (Vec::new(), true),
                        Room::Rows(0) => (Vec::new(), false),
                        Room::Rows(room) => {
                            let limit = i64::try_from(room.min(wanted)).unwrap_or(i64::MAX);
                            let params: [&(dyn ToSql + Sync); 4] =
                                [&store.types, &limit, &lease_us, &queues];
                            (tx.query(CLAIM_LIMITED, &params)?, false)
                        }
                    };
                    tx.commit()?;
                    Ok((rows, busy.then(|| Instant::now() + SOON), busy))
                }
            }
        })?,
        Some(gates) => {
            let claim = super::gating::claim(store, gates, wanted, pick)?;
            // Reported once: this claim's transaction made the change, and it committed.
            for (downstream, state) in claim.changes {
                store.events.emit(Event::Breaker { downstream, state });
            }
            let manual = store.clock.manual_offset().is_some();
            let wake = claim.hold.wake_at(manual);
            let soon = claim.queue_busy.then(|| Instant::now() + SOON);
            (
                claim.rows,
                wake.into_iter().chain(soon).min(),
                claim.queue_busy,
            )
        }
    };
    if let Some(at) = wake {
        let mut local = store.local.lock();
        local.gate_wake = Some(local.gate_wake.map_or(at, |before| before.min(at)));
    }
    Ok((rows, busy))
}

/// Claims up to `wanted` rows for lane `lane`: from the queues that are not limited, and from
/// each limited queue in its own turn, the limited ones first after a claim of the lane whose
/// other rows left them no room (see `queue_limits.rs`). A claim that fails after others of the
/// round committed ends the round with the rows they took (they are this pool's to run;
/// dropped, they would wait for the reaper and cost an attempt); one that fails first is the
/// round's error.
fn claim_in_turns(store: &PgStore, lane: usize, wanted: usize) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    match claim_round(store, lane, wanted, &mut rows) {
        Err(error) if rows.is_empty() => Err(error),
        _ => Ok(rows),
    }
}

/// The body of [`claim_in_turns`]: adds to `rows` what each claim of the round takes.
fn claim_round(
    store: &PgStore,
    lane: usize,
    wanted: usize,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let (limited, limited_first) = store.limited_for(lane);
    let others = |rows: &mut Vec<Row>| -> Result<(), String> {
        if rows.len() < wanted {
            let pick = Pick::of(store.lane_queues(lane));
            rows.extend(claim_rows(store, pick, wanted - rows.len())?.0);
        }
        Ok(())
    };
    if !limited_first {
        others(rows)?;
        if rows.len() >= wanted && !limited.is_empty() {
            // The others left the limited queues no room: they go first next time.
            store.local.lock().lanes[lane].limited_first = true;
        }
    }
    for queue in limited {
        if rows.len() >= wanted {
            break;
        }
        let asked = wanted - rows.len();
        let (more, busy) = claim_rows(store, Pick::Limited(&queue), asked)?;
        if more.len() < asked && !busy {
            store.limited_idle(queue);
        }
        rows.extend(more);
    }
    if limited_first {
        others(rows)?;
    }
    Ok(())
}

/// Claims up to `wanted` tasks for lane `lane` and queues them for its workers; returns how
/// many it claimed.
fn claim_batch(store: &Arc<PgStore>, lane: usize, wanted: usize) -> Result<usize, String> {
    // Each claim's lease is timed from before its statement is sent (see `Held::valid_until`).
    let requested = Instant::now();
    let rows = claim_in_turns(store, lane, wanted)?;
    let mut claimed: Vec<(i16, std::time::SystemTime, Claim)> = Vec::with_capacity(rows.len());
    let mut bad = Vec::new();
    // Every row claimed, as this pool holds it until it ends.
    let mut held = Vec::with_capacity(rows.len());
    for row in &rows {
        let seq: i64 = row.get(0);
        let type_name: &str = row.get(1);
        let payload: Option<Value> = row.get(2);
        let attempt = u32::try_from(row.get::<_, i32>(3)).unwrap_or(u32::MAX);
        let lease: i64 = row.get(4);
        // Always found: the claim takes only this pool's types.
        let Some(type_index) = store.type_index(type_name) else {
            continue;
        };
        let settings = rows::settings_of(store.registry.entry(type_index).settings(), row, 7);
        let token = CancelToken::new(store.clock.clone());
        held.push((
            seq,
            super::store::Held {
                lease,
                token: token.clone(),
                type_index,
                attempt,
                lane,
                valid_until: requested + store.lease,
            },
        ));
        if attempt > settings.max_attempts {
            // No attempt was left (a row inserted or edited by hand: every path of the store
            // keeps a ready row below its limit): never run, a dead letter at once. Claimed
            // rather than passed over by the claim's `WHERE`, which would cost the claim its
            // ordered index scan whenever the table's statistics are stale.
            let error = format!(
                "no attempt left: {} of {} already started",
                attempt - 1,
                settings.max_attempts
            );
            bad.push((seq, lease, settings.max_attempts, Err(error)));
            continue;
        }
        match store
            .codec(type_index)
            .decode_payload(payload.unwrap_or(Value::Null))
        {
            Ok(payload) => claimed.push((
                row.get(5),
                row.get(6),
                Claim {
                    id: store.id(seq),
                    type_index,
                    attempt,
                    token,
                    payload,
                    lease: Some(lease),
                    lane: lane as u32,
                    settings: Some(settings),
                    // Stamped again as a worker takes it from the local queue.
                    claimed_at: store.clock.now(),
                },
            )),
            Err(error) => bad.push((seq, lease, attempt, Ok(error))),
        }
    }
    // The claim's order: the statement returns its rows in any order.
    claimed.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.id.seq().cmp(&b.2.id.seq()))
    });
    let count = held.len();
    let claims = claimed.into_iter().map(|(_, _, claim)| claim);
    {
        let mut local = store.local.lock();
        if local.closed || local.stopping {
            // The pool closed while the claim was in flight: the rows go back at once.
            drop(local);
            let bad_leases = bad.iter().map(|&(_, lease, _, _)| lease).collect();
            store.give_back(claims.collect(), bad_leases);
            return Ok(0);
        }
        // The claim never takes more than asked for (the CTE; tested against the server).
        let slots = &mut local.lanes[lane];
        slots.free = slots.free.saturating_sub(count);
        // The bad ones are run here and now, as dead letters: their ending frees their slots.
        slots.started += bad.len();
        local.running.extend(held);
        for claim in claims {
            local.queue.push_back((lane, claim));
            store.work_cv.notify_one();
        }
    }
    // A payload that no longer decodes is a dead letter at once, never a worker's crash.
    for (seq, lease, attempt, error) in bad {
        let failure = match error {
            Ok(error) => Failure::new(
                FailureReason::BadPayload,
                attempt,
                format!("the payload could not be decoded: {error}"),
                None,
            ),
            Err(exhausted) => Failure::new(FailureReason::Exhausted, attempt, exhausted, None),
        };
        store.finish(
            seq,
            lease,
            lane,
            Ending::Failed(failure),
            store.manual_now_us(),
        );
    }
    Ok(count)
}

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
                    Ok(value) => Ending::Succeeded(value, output),
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
            RunOutcome::Retry { delay, error } => Ending::Retry { delay, error },
            RunOutcome::Failed(mut failure) => {
                failure.attempts = claim.attempt;
                Ending::Failed(failure)
            }
        };
        self.finish(seq, lease, claim_lane, ending, ended_at);
        unwind::drop_quietly(payload);
    }

    /// Writes how task `seq`'s run under `lease` ended, fenced by the lease, with `tasq_now()`
    /// at `ended_at` (with a manual clock: the time the run ended, see `with_conn_at`; a
    /// success grouped with others is stamped when written); retried while the database is
    /// away. Then frees the worker's slot and publishes the outcome to local handles.
    pub(super) fn finish(
        &self,
        seq: i64,
        lease: i64,
        lane: usize,
        mut ending: Ending,
        ended_at: Option<i64>,
    ) {
        let mut delay = Duration::from_millis(20);
        let (written, cascaded) = loop {
            match self.write_ending(seq, lease, &mut ending, ended_at) {
                Ok(Some((state, cascaded))) => break (Some(state), cascaded),
                Ok(None) => break (None, 0),
                Err(_) => {
                    // Lost connection: the outcome is retried until written or the lease is
                    // gone (then the write finds no row, and the task runs again elsewhere).
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        };
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
                (Some(TaskState::Scheduled), Ending::Retry { delay, error }) => {
                    self.events.lifecycle(|| Event::Retrying {
                        id,
                        task_type,
                        attempt,
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
        let from_row = match (waiter, ending, written) {
            (Some(completion), Ending::Succeeded(_, output), Some(TaskState::Succeeded)) => {
                let finished = crate::model::completion::Finished::Succeeded(Some(output));
                unwind::drop_quietly(completion.publish_first(finished));
                // The last reference, if every handle went meanwhile.
                unwind::drop_quietly(completion);
                false
            }
            (Some(completion), Ending::Failed(failure), Some(TaskState::Failed)) => {
                let finished = crate::model::completion::Finished::Failed(Box::new(failure));
                unwind::drop_quietly(completion.publish_first(finished));
                unwind::drop_quietly(completion);
                false
            }
            // Cancelled instead: the row says why.
            (Some(completion), ending, _) => {
                unwind::drop_quietly(ending);
                unwind::drop_quietly(completion);
                true
            }
            (None, ending, _) => {
                unwind::drop_quietly(ending);
                false
            }
        };
        self.release(seq, lease, lane);
        if from_row {
            self.publish_seq(seq);
        } else if terminal {
            self.waiters.lock().remove(&seq);
        }
    }

    /// Gives back the row of a run that this pool's shutdown interrupted (see `complete`), then
    /// frees the worker's slot. If the database is away the lease runs out instead, and the
    /// reaper returns the row (counting the attempt).
    fn give_back_run(&self, seq: i64, lease: i64, lane: usize) {
        self.give_back_leases(&[lease]);
        self.release(seq, lease, lane);
    }

    /// A run under `lease` of lane `lane` is over here: forgets its entry, frees its worker's
    /// slot, and wakes the fetcher, a worker for a claim of the lane that waited for it, and
    /// whoever waits for the pool's runs to end.
    fn release(&self, seq: i64, lease: i64, lane: usize) {
        let mut local = self.local.lock();
        // Only this lease's entry: a retry due at once may already have been claimed again by
        // this pool's fetcher, under a new lease whose entry must stay (its heartbeat, its
        // cancels, its type).
        if local
            .running
            .get(&seq)
            .is_some_and(|held| held.lease == lease)
        {
            local.running.remove(&seq);
        }
        // Its queue, if limited, may have room again (see `queue_limits.rs`). Every idle one is
        // tried again: the row's queue may not be the one this pool registers its type in.
        local.limited_idle.clear();
        local.run_ended(lane);
        local.wake = true;
        if local.wants_claim(self.prefetch) {
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
        ending: &mut Ending,
        ended_at: Option<i64>,
    ) -> Result<Option<(TaskState, u64)>, String> {
        // The common cases in one statement: no cancel asked, no dependents to release
        // (checked on the row's latest version, under its lock).
        let fast = match ending {
            // Grouped with other workers' successes (see acks.rs).
            Ending::Succeeded(output, _) => u64::from(self.acks.succeed(self, seq, lease, output)?),
            Ending::Retry { delay, error } => self.with_conn_at(ended_at, |c| {
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
            Ending::Failed(_) => 0,
        };
        if fast == 1 {
            let state = match ending {
                Ending::Succeeded(..) => TaskState::Succeeded,
                _ => TaskState::Scheduled,
            };
            return Ok(Some((state, 0)));
        }
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
        (None, Ending::Retry { delay, error }) => {
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

/// The durable store's invariants, checked over the whole table (for tests).
pub(super) fn check_invariants(store: &PgStore) -> Result<(), String> {
    store.local.lock().check_lanes()?;
    let checks: [(&str, &str); 7] = [
        (
            "a task waiting to run carries no cancel request (a cancel ends it at once)",
            "SELECT count(*) FROM tasq_tasks
             WHERE status IN ('blocked', 'ready') AND cancel_requested IS NOT NULL",
        ),
        (
            "a running task holds a lease",
            "SELECT count(*) FROM tasq_tasks WHERE status = 'running'
             AND (lease_id IS NULL OR lease_until IS NULL)",
        ),
        (
            "a finished task has finished_at",
            "SELECT count(*) FROM tasq_tasks
             WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at IS NULL",
        ),
        (
            "only a failed task is a dead letter, and it keeps its payload",
            "SELECT count(*) FROM tasq_tasks WHERE dead AND (status <> 'failed' OR payload IS NULL)",
        ),
        (
            "a blocked task waits for as many unfinished dependencies as its pending count",
            "SELECT count(*) FROM tasq_tasks t WHERE t.status = 'blocked' AND t.pending_deps <>
                 (SELECT count(*) FROM tasq_deps d JOIN tasq_tasks p ON p.id = d.dependency
                  WHERE d.dependent = t.id AND p.status IN ('blocked', 'ready', 'running'))",
        ),
        (
            "a blocked task has unfinished dependencies",
            "SELECT count(*) FROM tasq_tasks WHERE status = 'blocked' AND pending_deps <= 0",
        ),
        (
            "a task whose dependency failed or was cancelled is not blocked",
            "SELECT count(*) FROM tasq_tasks t JOIN tasq_deps d ON d.dependent = t.id
             JOIN tasq_tasks p ON p.id = d.dependency
             WHERE t.status = 'blocked' AND p.status IN ('failed', 'cancelled')",
        ),
    ];
    for (name, sql) in checks {
        let broken: i64 = store.with_conn(|c| c.query_one(sql, &[]))?.get(0);
        if broken != 0 {
            return Err(format!("invariant broken ({broken} rows): {name}"));
        }
    }
    Ok(())
}

/// Ends the dead letters beyond the schema's limit (see [`enforce_dead_letter_limit`]): those
/// up to the newest one past the limit, read through `tasq_dead` from its newest end (the limit's
/// entries, then only the rows it ends); nothing at all without a limit.
pub(super) const TRIM_DEAD_LETTERS: &str = "
    UPDATE tasq_tasks SET dead = false, payload = NULL
    WHERE dead AND (SELECT dead_letter_limit FROM tasq_schema) IS NOT NULL
      AND id <= (SELECT id FROM tasq_tasks WHERE dead ORDER BY id DESC
                 OFFSET (SELECT dead_letter_limit FROM tasq_schema) LIMIT 1)";

impl PgStore {
    /// Returns the rows of never-started claims to `ready` (the attempt not counted), and
    /// tells the other pools. A row whose cancel was asked for while it was held ends
    /// cancelled instead, with its dependents, as the reaper ends it.
    pub(super) fn give_back_leases(&self, leases: &[i64]) {
        if leases.is_empty() {
            return;
        }
        let cancelled = self.with_conn(|c| {
            let mut tx = c.transaction()?;
            let rows = tx.query(
                "UPDATE tasq_tasks SET
                     status = CASE WHEN cancel_requested IS NULL THEN 'ready' ELSE 'cancelled' END,
                     cancel_reason = cancel_requested,
                     finished_at = CASE WHEN cancel_requested IS NULL THEN NULL
                                        ELSE tasq_now() END,
                     lease_id = NULL, lease_until = NULL, attempts = attempts - 1,
                     priority = COALESCE(base_priority, priority), base_priority = NULL
                 WHERE lease_id = ANY($1) AND status = 'running'
                 RETURNING id, status, has_dependents",
                &[&leases],
            )?;
            let mut done = Vec::new();
            for row in rows
                .iter()
                .filter(|row| row.get::<_, &str>(1) == "cancelled")
            {
                super::dispatch::cascade_ended(
                    &mut tx,
                    row.get(0),
                    "cancelled",
                    row.get(2),
                    &mut done,
                )?;
            }
            super::dispatch::notify_changes(&mut tx, true, &done)?;
            tx.commit()?;
            Ok(done.len())
        });
        if let Ok(cancelled) = cancelled {
            self.count(|t| t.cancelled += cancelled as u64);
        }
    }
}
