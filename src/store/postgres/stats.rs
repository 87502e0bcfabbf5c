//! The queue's figures (`Pool::stats`, `Pool::type_stats`, and the alerts and metrics that read
//! them every second or so) read in a few milliseconds at any table size.
//!
//! A queue table holds mostly rows that need no attention: finished ones kept for their keys and
//! outputs, and tasks due far ahead. Counting them all (a `GROUP BY` over the table) took 360 to
//! 490 ms at 1,000,000 rows. Here every count reads an index range and stops at [`CAP`] rows:
//!
//! * ready tasks are read one priority at a time (a skip scan of `tasq_dequeue`'s priorities,
//!   one index descent each), each priority's due range from its oldest end, so the tasks due
//!   far ahead are never read, only counted (up to the cap) in the range after now;
//! * blocked, running, finished and dead rows each through their own partial index.
//!
//! A count that reaches the cap is replaced by the planner's estimate of its kind (as Oban and
//! River's dashboards do for large queues), and the figures say so (`Stats::estimated`).
//!
//! Invariant: every statement here reads at most `CAP` rows of each range it names, and no
//! range that is not due (except to count it up to `CAP`); the test `periodic_queries_read_
//! indexes_at_a_million_rows` checks their plans on 1,000,000 rows.

use std::collections::HashMap;

use crate::observe::stats::{Stats, TypeStats};

use super::rows;
use super::store::PgStore;

/// Rows counted at most in one range; a count that reaches it becomes an estimate.
pub(super) const CAP: i64 = 10_000;

/// The queue's figures, one row each: `kind`, the priority (of ready tasks: the task's own,
/// not the one aging raised it to), the count (at most [`CAP`] per range), and the age of the
/// oldest in seconds. `$1`: [`CAP`].
pub(super) const STATS: &str = concat!(
    ready_priorities!(),
    ", due AS (
         SELECT d.own, d.run_at FROM prio, LATERAL (
             SELECT COALESCE(t.base_priority, t.priority) AS own, t.run_at FROM tasq_tasks t
             WHERE t.status = 'ready' AND t.priority = prio.p AND t.run_at <= tasq_now()
             ORDER BY t.run_at LIMIT $1) d
         WHERE prio.p IS NOT NULL
     )
     SELECT 'ready', own, count(*)::BIGINT,
            EXTRACT(EPOCH FROM tasq_now() - min(run_at))::FLOAT8
     FROM due GROUP BY own
     UNION ALL
     SELECT 'scheduled', p, (SELECT count(*) FROM (
                SELECT 1 FROM tasq_tasks t
                WHERE t.status = 'ready' AND t.priority = prio.p AND t.run_at > tasq_now()
                LIMIT $1) s)::BIGINT, NULL
     FROM prio WHERE p IS NOT NULL
     UNION ALL
     SELECT 'blocked', NULL, (SELECT count(*) FROM (
                SELECT 1 FROM tasq_tasks WHERE status = 'blocked' LIMIT $1) s)::BIGINT, NULL
     UNION ALL
     SELECT 'running', NULL, (SELECT count(*) FROM (
                SELECT 1 FROM tasq_tasks WHERE status = 'running' LIMIT $1) s)::BIGINT, NULL
     UNION ALL
     SELECT 'retained', NULL, ((SELECT count(*) FROM (
                SELECT 1 FROM tasq_tasks WHERE status = 'succeeded' ORDER BY id LIMIT $1) s)
            + (SELECT count(*) FROM (
                SELECT 1 FROM tasq_tasks WHERE status = 'failed' ORDER BY id LIMIT $1) s)
            + (SELECT count(*) FROM (
                SELECT 1 FROM tasq_tasks WHERE status = 'cancelled' ORDER BY id LIMIT $1) s))::BIGINT, NULL
     UNION ALL
     SELECT 'dead', NULL, (SELECT count(*) FROM (
                SELECT 1 FROM tasq_tasks WHERE dead LIMIT $1) s)::BIGINT, NULL"
);

/// Each of the types `$2`'s due ready tasks (at most [`CAP`] per priority) and running ones (at
/// most [`CAP`]): `type`, ready, running, the oldest ready's age in seconds.
pub(super) const TYPE_STATS: &str = concat!(
    ready_priorities!(),
    ", due AS (
         SELECT d.type, d.run_at FROM prio, LATERAL (
             SELECT t.type, t.run_at FROM tasq_tasks t
             WHERE t.status = 'ready' AND t.priority = prio.p AND t.run_at <= tasq_now()
               AND t.type = ANY($2)
             ORDER BY t.run_at LIMIT $1) d
         WHERE prio.p IS NOT NULL
     )
     SELECT type, count(*)::BIGINT, 0::BIGINT,
            EXTRACT(EPOCH FROM tasq_now() - min(run_at))::FLOAT8
     FROM due GROUP BY type
     UNION ALL
     SELECT type, 0, count(*)::BIGINT, NULL FROM (
         SELECT type FROM tasq_tasks WHERE status = 'running' AND type = ANY($2) LIMIT $1) r
     GROUP BY type"
);

/// The predicate whose planner estimate stands for a count of `kind` that reached [`CAP`].
fn estimated_kind(kind: &str) -> &'static str {
    match kind {
        "ready" => "status = 'ready' AND run_at <= now()",
        "scheduled" => "status = 'ready' AND run_at > now()",
        "blocked" => "status = 'blocked'",
        "running" => "status = 'running'",
        "retained" => "status IN ('succeeded', 'failed', 'cancelled')",
        _ => "dead",
    }
}

/// The planner's estimate of how many rows `predicate` holds (from the table's statistics, kept
/// by autovacuum's `ANALYZE`); at least `CAP`, the count already seen.
fn estimate(c: &mut super::conn::Conn, predicate: &str) -> Result<usize, postgres::Error> {
    let rows = c.query_read(
        &format!("EXPLAIN (FORMAT JSON) SELECT 1 FROM tasq_tasks WHERE {predicate}"),
        &[],
    )?;
    let plan: serde_json::Value = rows
        .first()
        .map_or(serde_json::Value::Null, |row| row.get(0));
    let rows = plan[0]["Plan"]["Plan Rows"].as_f64().unwrap_or(0.0);
    Ok((rows as usize).max(CAP as usize))
}

fn count(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// The queue's figures with this pool's own (`workers`, `totals`); an error when the database
/// cannot be read.
pub(super) fn read(store: &PgStore) -> Result<Stats, String> {
    let (workers, totals) = {
        let local = store.local.lock();
        (local.live_workers, local.totals)
    };
    let mut stats = Stats::empty(workers, totals);
    let mut by_priority: HashMap<u8, (usize, f64)> = HashMap::new();
    // The kinds whose count reached the cap.
    let mut capped: Vec<String> = Vec::new();
    let rows = store.with_conn_within(super::store::READING_PATIENCE, |c| {
        c.query_read(STATS, &[&CAP])
    })?;
    for row in &rows {
        let kind: &str = row.get(0);
        let n: i64 = row.get(2);
        if n >= CAP && !capped.iter().any(|k| k == kind) {
            capped.push(kind.to_owned());
        }
        let n = count(n);
        match kind {
            "ready" => {
                let priority = u8::try_from(row.get::<_, i16>(1)).unwrap_or(0);
                let age: f64 = row.get(3);
                let entry = by_priority.entry(priority).or_insert((0, age));
                entry.0 += n;
                entry.1 = entry.1.max(age);
                stats.ready += n;
            }
            "scheduled" => stats.scheduled += n,
            "blocked" => stats.blocked = n,
            "running" => stats.running = n,
            "retained" => stats.retained = n,
            _ => stats.dead_letters = n,
        }
    }
    if !capped.is_empty() {
        stats.estimated = true;
        let estimates = store.with_conn_within(super::store::READING_PATIENCE, |c| {
            capped
                .iter()
                .map(|kind| estimate(c, estimated_kind(kind)))
                .collect::<Result<Vec<_>, postgres::Error>>()
        })?;
        for (kind, n) in capped.iter().zip(estimates) {
            let figure = match kind.as_str() {
                "ready" => &mut stats.ready,
                "scheduled" => &mut stats.scheduled,
                "blocked" => &mut stats.blocked,
                "running" => &mut stats.running,
                "retained" => &mut stats.retained,
                _ => &mut stats.dead_letters,
            };
            *figure = (*figure).max(n);
        }
    }
    let mut by_priority: Vec<(u8, (usize, f64))> = by_priority.into_iter().collect();
    by_priority.sort_unstable_by_key(|&(priority, _)| std::cmp::Reverse(priority));
    stats.ready_by_priority = by_priority.iter().map(|&(p, (n, _))| (p, n)).collect();
    stats.oldest_ready_by_priority = by_priority
        .iter()
        .map(|&(p, (_, a))| (p, rows::age(a)))
        .collect();
    stats.oldest_ready = stats.oldest_ready_by_priority.iter().map(|&(_, a)| a).max();
    if !store.registry.downstreams.is_empty() {
        stats.breakers = super::gating::breaker_states(store);
    }
    Ok(stats)
}

/// Every registered type with no backlog, in registry order.
pub(super) fn empty_types(store: &PgStore) -> Vec<TypeStats> {
    let entries = store.registry.entries();
    entries.iter().map(|e| TypeStats::new(e.name)).collect()
}

/// Each registered type's backlog, or the error that kept it from being read.
pub(super) fn read_types(store: &PgStore) -> Result<Vec<TypeStats>, String> {
    let mut types = empty_types(store);
    let rows = store.with_conn_within(super::store::READING_PATIENCE, |c| {
        c.query_read(TYPE_STATS, &[&CAP, &store.types])
    })?;
    for row in rows {
        let Some(index) = store.type_index(row.get(0)) else {
            continue;
        };
        let t = &mut types[index as usize];
        t.ready += count(row.get(1));
        t.running += count(row.get(2));
        if let Some(age) = row.get::<_, Option<f64>>(3) {
            t.oldest_ready = Some(rows::age(age));
        }
    }
    Ok(types)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_estimate() {
        let kinds = [
            "ready",
            "scheduled",
            "blocked",
            "running",
            "retained",
            "dead",
        ];
        let predicates: std::collections::HashSet<_> =
            kinds.iter().map(|k| estimated_kind(k)).collect();
        assert_eq!(predicates.len(), kinds.len());
    }
}
