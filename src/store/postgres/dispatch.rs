//! Claiming tasks: the fetcher that claims batches for this pool's free workers (and, as
//! their pace says, ahead of them), the statements it runs, and the store's invariants. How a
//! claimed task's run ends is `ending.rs`.

use std::time::{Duration, Instant};

use postgres::Row;
use postgres::types::ToSql;
use serde_json::Value;

use super::acks::Ending;
use super::conn::Sql;
use super::queue_limits::{Pick, Room, SOON};
use super::rows;
use super::store::PgStore;
use crate::model::cancel::CancelToken;
use crate::model::state::{Failure, FailureReason};
use crate::observe::event::Event;
use crate::store::Claim;
use crate::sync::Arc;

/// The fetcher thread: claims up to as many due tasks as the pool has free slots (workers plus
/// prefetch, fixed or as each lane's pace says: `pace.rs`), in one statement (a pool with gates: one transaction, see `gates.rs`), whenever it
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
                if local.wake && local.wants_claim() {
                    local.wake = false;
                    break local.wanted();
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
            let sent = Instant::now();
            match claim_batch(store, lane, wanted) {
                Ok((claimed, more)) => {
                    backoff = Duration::from_millis(50);
                    let full = claimed == wanted;
                    let mut local = store.local.lock();
                    let slots = &mut local.lanes[lane];
                    if let Some(pace) = &mut slots.pace {
                        slots.prefetch = pace.claimed(more, sent.elapsed());
                    }
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
        SELECT id, priority, run_at FROM tasq_tasks
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
        LIMIT $2::BIGINT + 1
        FOR UPDATE SKIP LOCKED
    )
    UPDATE tasq_tasks t
    SET status = 'running', lease_id = nextval('tasq_lease'),
        lease_until = now() + interval '1 microsecond' * $3::BIGINT,
        attempts = t.attempts + 1
    WHERE t.id = ANY(ARRAY(SELECT id FROM picked ORDER BY priority DESC, run_at, id LIMIT $2))
    RETURNING t.id, t.type, t.payload, t.attempts, t.lease_id, t.priority, t.run_at,
              t.max_attempts, t.retry_base_us, t.retry_cap_us, t.timeout_us,
              (SELECT count(*) FROM picked) > $2"
        )
    };
}

/// The claim: up to `$2` ready, due rows of the types `$1`, highest priority first, oldest due
/// first, each leased for `$3` microseconds of the database's time; its last column says
/// whether a row more was ready (the backlog the lane's pace follows, `pace.rs`: the pick
/// locks one row beyond the claim, until the statement ends, and leaves it). The rows are picked in a
/// CTE, not in `WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`: with that form,
/// PostgreSQL may run the subquery more than once and claim more than n rows (bug #15715).
/// `SKIP LOCKED` lets concurrent claimers pass over each other's rows instead of waiting; it
/// passes over a ready row any other transaction holds at that instant too (a dependent's
/// submit locks its dependency's row, a cancel the row it cancels), which the next claim then
/// takes: the order is strict among the rows no one holds. The
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

/// What one claim took.
struct Claimed {
    rows: Vec<Row>,
    /// A limited queue's row was another claimer's.
    busy: bool,
    /// More rows were ready than it took: a backlog the pool may claim ahead of (only the
    /// claims of unlimited queues without gates say so, see `pace.rs`).
    more: bool,
}

/// Claims up to `wanted` rows from what `pick` names, through the gates if the pool has any.
fn claim_rows(store: &PgStore, pick: Pick<'_>, wanted: usize) -> Result<Claimed, String> {
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
    // Claimed ahead, a limited queue's rows or a gated type's would hold the fleet's room for
    // them (a queue's limit, a type's) in this process while its workers are busy.
    let peeked = store.gates.is_none() && !matches!(pick, Pick::Limited(_));
    let more = peeked && rows.first().is_some_and(|row| row.get::<_, bool>(11));
    Ok(Claimed { rows, busy, more })
}

/// Claims up to `wanted` rows for lane `lane`: from the queues that are not limited, and from
/// each limited queue in its own turn, the limited ones first after a claim of the lane whose
/// other rows left them no room (see `queue_limits.rs`). A claim that fails after others of the
/// round committed ends the round with the rows they took (they are this pool's to run;
/// dropped, they would wait for the reaper and cost an attempt); one that fails first is the
/// round's error.
fn claim_in_turns(store: &PgStore, lane: usize, wanted: usize) -> Result<(Vec<Row>, bool), String> {
    let (mut rows, mut more) = (Vec::new(), false);
    match claim_round(store, lane, wanted, &mut rows, &mut more) {
        Err(error) if rows.is_empty() => Err(error),
        _ => Ok((rows, more)),
    }
}

/// The body of [`claim_in_turns`]: adds to `rows` what each claim of the round takes; sets
/// `more` if a claim saw more ready rows than it took.
fn claim_round(
    store: &PgStore,
    lane: usize,
    wanted: usize,
    rows: &mut Vec<Row>,
    more: &mut bool,
) -> Result<(), String> {
    let (limited, limited_first) = store.limited_for(lane);
    let others = |rows: &mut Vec<Row>, more: &mut bool| -> Result<(), String> {
        if rows.len() < wanted {
            let pick = Pick::of(store.lane_queues(lane));
            let claimed = claim_rows(store, pick, wanted - rows.len())?;
            *more |= claimed.more;
            rows.extend(claimed.rows);
        }
        Ok(())
    };
    if !limited_first {
        others(rows, more)?;
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
        let announced = store.local.lock().announced;
        let claimed = claim_rows(store, Pick::Limited(&queue), asked)?;
        if claimed.rows.len() < asked && !claimed.busy {
            store.limited_idle(queue, announced);
        }
        rows.extend(claimed.rows);
    }
    if limited_first {
        others(rows, more)?;
    }
    Ok(())
}

/// Claims up to `wanted` tasks for lane `lane` and queues them for its workers; returns how
/// many it claimed, and whether more were ready.
fn claim_batch(store: &Arc<PgStore>, lane: usize, wanted: usize) -> Result<(usize, bool), String> {
    // Each claim's lease is timed from before its statement is sent (see `Held::valid_until`).
    let requested = Instant::now();
    let (rows, more) = claim_in_turns(store, lane, wanted)?;
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
                started_at: None,
                acking: false,
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
            return Ok((0, false));
        }
        // The claim never takes more than asked for (the CTE; tested against the server).
        // The bad ones are run here and now, as dead letters: their ending frees their slots.
        local.lanes[lane].started += bad.len();
        local.running.extend(held);
        for claim in claims {
            local.lanes[lane].waiting += 1;
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
    Ok((count, more))
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
                super::ending::cascade_ended(
                    &mut tx,
                    row.get(0),
                    "cancelled",
                    row.get(2),
                    &mut done,
                )?;
            }
            super::ending::notify_changes(&mut tx, true, &done)?;
            tx.commit()?;
            Ok(done.len())
        });
        if let Ok(cancelled) = cancelled {
            self.count(|t| t.cancelled += cancelled as u64);
        }
    }
}
