//! The figures of a whole queue for an operator, read in a few statements at any table size:
//! what [`Stats`](crate::Stats) gives a pool, split further (by state, queue, type and priority,
//! with the last minutes' throughput), and with what the fleet shares (pauses, queue limits,
//! breakers).
//!
//! Invariant: every statement here reads at most [`COUNT_CAP`] index entries of each range it
//! counts (a range: one state; one (queue, priority) pair's due tasks; one minute's finished
//! tasks), never a range of tasks due later but to count it up to the cap. The test
//! `overview_reads_indexes_at_a_million_rows` checks the plans.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::connect::{Admin, AdminError, COUNT_CAP};
use crate::gates::breaker::BreakerState;
use crate::model::pause::PauseTarget;
use crate::observe::console::overview::{
    BreakerOverview, Minute, Overview, QueueOverview, StateCounts, TypeOverview,
};
use crate::store::postgres::conn::{Connections, Sql};
use crate::store::postgres::rows;

/// How many minutes of throughput an [`Overview`] holds, the current one included.
pub(super) const MINUTES: i32 = 15;

/// Each state's count, `$1` the cap: `kind`, count. Each range is one partial index's, read
/// in its order (so that the planner stops at the cap rather than read a large state whole);
/// ready and scheduled tasks one priority at a time, as `stats.rs` reads them.
pub(super) const STATES: &str = concat!(
    ready_priorities!(),
    "
    SELECT 'ready', (SELECT count(*) FROM prio, LATERAL (SELECT 1 FROM tasq_tasks t
        WHERE t.status = 'ready' AND t.priority = prio.p AND t.run_at <= tasq_now()
        ORDER BY t.run_at LIMIT $1) d WHERE prio.p IS NOT NULL)
    UNION ALL SELECT 'scheduled', (SELECT count(*) FROM prio, LATERAL (SELECT 1 FROM tasq_tasks t
        WHERE t.status = 'ready' AND t.priority = prio.p AND t.run_at > tasq_now()
        ORDER BY t.run_at LIMIT $1) d WHERE prio.p IS NOT NULL)
    UNION ALL SELECT 'blocked', (SELECT count(*) FROM (SELECT 1 FROM tasq_tasks
        WHERE status = 'blocked' ORDER BY id LIMIT $1) s)
    UNION ALL SELECT 'running', (SELECT count(*) FROM (SELECT 1 FROM tasq_tasks
        WHERE status = 'running' LIMIT $1) s)
    UNION ALL SELECT 'succeeded', (SELECT count(*) FROM (SELECT 1 FROM tasq_tasks
        WHERE status = 'succeeded' ORDER BY id LIMIT $1) s)
    UNION ALL SELECT 'failed', (SELECT count(*) FROM (SELECT 1 FROM tasq_tasks
        WHERE status = 'failed' ORDER BY id LIMIT $1) s)
    UNION ALL SELECT 'cancelled', (SELECT count(*) FROM (SELECT 1 FROM tasq_tasks
        WHERE status = 'cancelled' ORDER BY id LIMIT $1) s)
    UNION ALL SELECT 'dead', (SELECT count(*) FROM (SELECT 1 FROM tasq_tasks
        WHERE dead ORDER BY id LIMIT $1) s)"
);

/// Each queue's due ready tasks by priority (at most `$1` each), found by a skip scan of
/// `tasq_queue_dequeue`'s (queue, priority) pairs: queue, priority, count, the oldest's age in
/// seconds.
pub(super) const QUEUES: &str = "
    WITH RECURSIVE qp(q, p) AS (
        (SELECT queue, priority FROM tasq_tasks WHERE status = 'ready'
         ORDER BY queue, priority DESC LIMIT 1)
        UNION ALL
        SELECT n.queue, n.priority FROM qp, LATERAL (
            (SELECT t.queue, t.priority FROM tasq_tasks t
             WHERE t.status = 'ready' AND t.queue = qp.q AND t.priority < qp.p
             ORDER BY t.priority DESC LIMIT 1)
            UNION ALL
            (SELECT t.queue, t.priority FROM tasq_tasks t
             WHERE t.status = 'ready' AND t.queue > qp.q
             ORDER BY t.queue, t.priority DESC LIMIT 1)
            LIMIT 1) n
    )
    SELECT qp.q, qp.p,
        (SELECT count(*) FROM (SELECT 1 FROM tasq_tasks t
             WHERE t.status = 'ready' AND t.queue = qp.q AND t.priority = qp.p
               AND t.run_at <= tasq_now() LIMIT $1) s),
        EXTRACT(EPOCH FROM tasq_now() - (SELECT t.run_at FROM tasq_tasks t
             WHERE t.status = 'ready' AND t.queue = qp.q AND t.priority = qp.p
               AND t.run_at <= tasq_now() ORDER BY t.run_at LIMIT 1))::FLOAT8
    FROM qp";

/// The running tasks (at most `$1`) by queue and type: queue, type, count.
pub(super) const RUNNING: &str = "
    SELECT queue, type, count(*) FROM (
        SELECT queue, type FROM tasq_tasks WHERE status = 'running' LIMIT $1) r
    GROUP BY queue, type";

/// The due ready tasks by type, at most `$1` per priority: type, count, the oldest's age.
pub(super) const READY_TYPES: &str = concat!(
    ready_priorities!(),
    " SELECT d.type, count(*), EXTRACT(EPOCH FROM tasq_now() - min(d.run_at))::FLOAT8
      FROM prio, LATERAL (
          SELECT t.type, t.run_at FROM tasq_tasks t
          WHERE t.status = 'ready' AND t.priority = prio.p AND t.run_at <= tasq_now()
          ORDER BY t.run_at LIMIT $1) d
      WHERE prio.p IS NOT NULL
      GROUP BY d.type"
);

/// The dead letters (at most `$1`) by type: type, count.
pub(super) const DEAD_TYPES: &str = "
    SELECT type, count(*) FROM (SELECT type FROM tasq_tasks WHERE dead LIMIT $1) d
    GROUP BY type";

/// The tasks finished in each of the last `$2` minutes (the current one last): the minute,
/// endings, failures kept (not dead letters), dead letters, cancels, and the oldest ending read;
/// `$1` the cap.
///
/// The endings are the newest `$1` entries of `tasq_finished (finished_at)` in the window, read
/// backward from now (so the read stops at the cap however busy the queue); when it stopped
/// there, the minutes before the oldest read are not known, and the one that holds it only in
/// part. Failures and cancels, few beside successes, are told apart from the newest `$1`
/// failed and cancelled rows (by id, through `tasq_states`), which also hold the dead letters
/// that `tasq_finished` leaves out.
pub(super) const MINUTES_SQL: &str = "
    WITH m AS (
        SELECT date_trunc('minute', tasq_now()) - g * interval '1 minute' AS at
        FROM generate_series(0, $2::INT - 1) g
    ), recent AS MATERIALIZED (
        SELECT finished_at FROM tasq_tasks
        WHERE status IN ('succeeded', 'failed', 'cancelled') AND NOT dead
          AND finished_at >= (SELECT min(at) FROM m)
        ORDER BY finished_at DESC LIMIT $1
    ), failed AS MATERIALIZED (
        SELECT finished_at, dead FROM tasq_tasks WHERE status = 'failed'
        ORDER BY id DESC LIMIT $1
    ), cancelled AS MATERIALIZED (
        SELECT finished_at FROM tasq_tasks WHERE status = 'cancelled'
        ORDER BY id DESC LIMIT $1
    )
    SELECT m.at,
        (SELECT count(*) FROM recent r
         WHERE r.finished_at >= m.at AND r.finished_at < m.at + interval '1 minute'),
        (SELECT count(*) FILTER (WHERE NOT f.dead) FROM failed f
         WHERE f.finished_at >= m.at AND f.finished_at < m.at + interval '1 minute'),
        (SELECT count(*) FILTER (WHERE f.dead) FROM failed f
         WHERE f.finished_at >= m.at AND f.finished_at < m.at + interval '1 minute'),
        (SELECT count(*) FROM cancelled c
         WHERE c.finished_at >= m.at AND c.finished_at < m.at + interval '1 minute'),
        (SELECT CASE WHEN count(*) >= $1 THEN min(finished_at) END FROM recent)
    FROM m ORDER BY m.at";

/// The minutes read with [`MINUTES_SQL`], and the rate of endings a second; `now` the
/// database's time.
fn minutes_of(rows: &[postgres::Row], now: SystemTime, estimated: &mut bool) -> (Vec<Minute>, f64) {
    // Where the read of endings stopped at the cap, if it did.
    let cut: Option<SystemTime> = rows.first().and_then(|row| row.get(5));
    let mut total = 0;
    let minutes: Vec<Minute> = rows
        .iter()
        .map(|row| {
            let at: SystemTime = row.get(0);
            let ended = count(row.get(1), &mut false);
            let kept_failed = count(row.get(2), &mut false);
            let dead = count(row.get(3), &mut false);
            let cancelled = count(row.get(4), &mut false);
            total += ended + dead;
            Minute {
                at,
                succeeded: ended.saturating_sub(kept_failed + cancelled),
                failed: kept_failed + dead,
                cancelled,
                complete: cut.is_none_or(|cut| cut < at),
            }
        })
        .collect();
    let since = match (cut, minutes.first()) {
        (Some(cut), _) => {
            *estimated = true;
            cut
        }
        (None, Some(first)) => first.at,
        (None, None) => now,
    };
    let span = now.duration_since(since).unwrap_or_default().as_secs_f64();
    let throughput = if span > 0.0 { total as f64 / span } else { 0.0 };
    (minutes, throughput)
}

/// The entry of queue `name`, made empty if it is new.
fn queue<'a>(queues: &'a mut BTreeMap<String, QueueOverview>, name: &str) -> &'a mut QueueOverview {
    queues
        .entry(name.to_owned())
        .or_insert_with(|| QueueOverview {
            name: name.to_owned(),
            ready: 0,
            running: 0,
            oldest_ready: None,
            paused: false,
            limit: None,
        })
}

/// The entry of type `name`, made empty if it is new.
fn of_type<'a>(types: &'a mut BTreeMap<String, TypeOverview>, name: &str) -> &'a mut TypeOverview {
    types
        .entry(name.to_owned())
        .or_insert_with(|| TypeOverview {
            name: name.to_owned(),
            ready: 0,
            running: 0,
            dead: 0,
            oldest_ready: None,
            paused: false,
        })
}

fn count(n: i64, capped: &mut bool) -> usize {
    if n >= COUNT_CAP as i64 {
        *capped = true;
    }
    usize::try_from(n).unwrap_or(0)
}

impl Admin {
    /// The queue's figures: tasks by state, queue, type and priority, the oldest due task's
    /// age, the last minutes' throughput and failures, pauses, queue limits and breakers.
    ///
    /// # Errors
    ///
    /// [`AdminError::Db`] when the database cannot be read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let admin = tasq::postgres::Admin::connect("host=127.0.0.1 user=postgres dbname=test")?;
    /// let overview = admin.overview()?;
    /// assert!(overview.states.dead <= overview.states.failed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn overview(&self) -> Result<Overview, AdminError> {
        read(self).map_err(AdminError::Db)
    }
}

/// The figures of the queue `conns` reach: [`Admin::overview`], and a durable pool's
/// `Pool::overview`.
pub(crate) fn read(conns: &impl Connections) -> Result<Overview, String> {
    let cap = COUNT_CAP as i64;
    let (at, state_rows, queue_rows, running_rows, type_rows, dead_rows, minute_rows) = conns
        .with_conn(|c| {
            let at: SystemTime = c.query_one("SELECT tasq_now()", &[])?.get(0);
            Ok((
                at,
                c.query(STATES, &[&cap])?,
                c.query(QUEUES, &[&cap])?,
                c.query(RUNNING, &[&cap])?,
                c.query(READY_TYPES, &[&cap])?,
                c.query(DEAD_TYPES, &[&cap])?,
                c.query(MINUTES_SQL, &[&cap, &MINUTES])?,
            ))
        })?;
    let mut estimated = false;
    let mut states = StateCounts::default();
    for row in &state_rows {
        let n = count(row.get(1), &mut estimated);
        match row.get::<_, &str>(0) {
            "ready" => states.ready = n,
            "scheduled" => states.scheduled = n,
            "blocked" => states.blocked = n,
            "running" => states.running = n,
            "succeeded" => states.succeeded = n,
            "failed" => states.failed = n,
            "cancelled" => states.cancelled = n,
            _ => states.dead = n,
        }
    }
    let paused = crate::store::postgres::pause::pauses(conns).map_err(|e| e.to_string())?;
    let limits = crate::store::postgres::queue_limits::limits(conns).map_err(|e| e.to_string())?;
    let is_paused = |target: PauseTarget| paused.iter().any(|p| p.target == target);

    let mut queues: BTreeMap<String, QueueOverview> = BTreeMap::new();
    let mut by_priority: BTreeMap<u8, usize> = BTreeMap::new();
    let mut oldest_ready: Option<Duration> = None;
    for row in &queue_rows {
        let name: &str = row.get(0);
        let priority = u8::try_from(row.get::<_, i16>(1)).unwrap_or(0);
        let n = count(row.get(2), &mut estimated);
        let age = row.get::<_, Option<f64>>(3).map(rows::age);
        let q = queue(&mut queues, name);
        q.ready += n;
        q.oldest_ready = q.oldest_ready.max(age);
        *by_priority.entry(priority).or_default() += n;
        oldest_ready = oldest_ready.max(age);
    }
    let mut types: BTreeMap<String, TypeOverview> = BTreeMap::new();
    for row in &running_rows {
        let (name, task_type): (&str, &str) = (row.get(0), row.get(1));
        let n = count(row.get(2), &mut estimated);
        of_type(&mut types, task_type).running += n;
        queue(&mut queues, name).running += n;
    }
    for row in &type_rows {
        let t = of_type(&mut types, row.get(0));
        t.ready += count(row.get(1), &mut estimated);
        t.oldest_ready = t
            .oldest_ready
            .max(row.get::<_, Option<f64>>(2).map(rows::age));
    }
    for row in &dead_rows {
        of_type(&mut types, row.get(0)).dead += count(row.get(1), &mut estimated);
    }
    for p in &paused {
        match &p.target {
            PauseTarget::Queue(name) => {
                queue(&mut queues, name);
            }
            PauseTarget::Type(name) => {
                of_type(&mut types, name);
            }
            _ => {}
        }
    }
    for limit in &limits {
        queue(&mut queues, &limit.queue).limit = Some(limit.max_running);
    }
    for q in queues.values_mut() {
        q.paused = is_paused(PauseTarget::Queue(q.name.clone()));
    }
    for t in types.values_mut() {
        t.paused = is_paused(PauseTarget::Type(t.name.clone()));
    }
    let (minutes, throughput) = minutes_of(&minute_rows, at, &mut estimated);
    Ok(Overview {
        at,
        states,
        estimated,
        oldest_ready,
        ready_by_priority: by_priority.into_iter().rev().collect(),
        queues: queues.into_values().collect(),
        types: types.into_values().collect(),
        minutes,
        throughput,
        paused,
        breakers: breakers(conns)?,
    })
}

/// The downstreams' circuit breakers, by name.
fn breakers(conns: &impl Connections) -> Result<Vec<BreakerOverview>, String> {
    let rows = conns.with_conn(|c| {
        c.query(
            "SELECT name, state, consecutive, opened_at FROM tasq_gates
                 WHERE kind = 'downstream' ORDER BY name",
            &[],
        )
    })?;
    Ok(rows
        .iter()
        .map(|row| BreakerOverview {
            downstream: row.get(0),
            state: BreakerState::parse(row.get(1)),
            consecutive_failures: u32::try_from(row.get::<_, i32>(2)).unwrap_or(0),
            opened_at: row.get(3),
        })
        .collect())
}
