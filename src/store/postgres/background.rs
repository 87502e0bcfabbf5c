//! The durable store's maintenance thread: it listens on the `tasq` channel, extends the leases
//! of the tasks its pool runs, fires the tokens of tasks cancelled elsewhere, publishes outcomes
//! to local handles, returns expired leases (the reaper), deletes rows past retention, and ages
//! ready tasks (with `Builder::aging`).
//!
//! Notifications are only a shortcut: every one of these duties also runs on a timer, so a lost
//! notification or a dropped listening connection delays things by at most a poll interval.

use std::time::{Duration, Instant};

use super::conn::Sql;
use super::ending::{cascade_ended, enforce_dead_letter_limit, notify_changes};
use super::leader;
use super::notifier::Notifier;
use super::rows;
use super::store::PgStore;
use crate::model::cancel::Interrupt;
use crate::model::state::Failure;
use crate::sync::{self, Arc};

/// Starts a named thread running `body(store)`; the thread holds the store until `body` returns
/// (when the pool stops; for the maintenance thread, once no local handle waits any more).
pub(super) fn spawn(
    name: &'static str,
    store: &Arc<PgStore>,
    body: fn(&Arc<PgStore>),
) -> std::io::Result<sync::JoinHandle> {
    let store = Arc::clone(store);
    sync::spawn(name.to_owned(), None, move || {
        // The store's code, not the user's: a panic here is a bug, but must not go unseen nor
        // take the process down with it.
        if let Err(panic) = crate::unwind::catch(|| body(&store)) {
            eprintln!("tasq: the durable store's {name} thread panicked: {panic}");
        }
    })
}

/// When each duty last ran.
struct Timers {
    heartbeat: Instant,
    poll: Instant,
    reap: Instant,
    retain: Instant,
}

/// The maintenance loop: until the pool stops and no handle of this process waits for a task.
pub(super) fn maintain_loop(store: &Arc<PgStore>) {
    let mut notifier = Notifier::new();
    let start = Instant::now();
    let mut timers = Timers {
        heartbeat: start,
        poll: start,
        reap: start,
        retain: start,
    };
    let heartbeat_every = (store.lease / 3).max(Duration::from_millis(50));
    let reap_every = (store.lease / 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let step = store.poll_interval.min(Duration::from_millis(200));
    let candidate = leader::Candidate::new();
    let mut resigned = false;
    loop {
        // Once the pool stops, only the outcomes of what local handles still wait for matter.
        let stopping = store.local.lock().stopping;
        if stopping && !resigned {
            // Another pool takes the roles at its next pass.
            candidate.resign(store, leader::CLEANER);
            resigned = true;
        }
        if stopping && !store.has_waiters() {
            return;
        }
        let words = notifier.receive(store, step, || {
            // Whatever was announced while nobody listened: look for it now.
            store.wake_fetcher();
            timers.poll = start;
        });
        handle_words(store, &words);
        let now = Instant::now();
        if !stopping && now.duration_since(timers.heartbeat) >= heartbeat_every {
            timers.heartbeat = now;
            let _ = heartbeat(store);
        }
        if now.duration_since(timers.poll) >= store.poll_interval {
            timers.poll = now;
            poll_waiters(store);
        }
        // The rest is for a pool that still runs tasks.
        if stopping {
            continue;
        }
        if now.duration_since(timers.reap) >= reap_every {
            timers.reap = now;
            let _ = reap(store);
        }
        if now.duration_since(timers.retain) >= Duration::from_secs(1) {
            timers.retain = now;
            // Looked at again: a pool stopped since the top of this pass leaves the role alone
            // (its next pass resigns it; taking it now would keep it from the others till then).
            if !store.local.lock().stopping && candidate.hold(store, leader::CLEANER) {
                let _ = retain(store);
            }
        }
        // Also before each claim: here it keeps the priorities aged while the fetcher waits,
        // for the processes that claim these types without aging of their own.
        super::gating::age_if_due(store, false);
    }
}

/// Acts on notification words: `ready`, `done:<id>`, `done:*` (some tasks ended, too many to
/// name), `cancel:<id>`.
fn handle_words(store: &PgStore, words: &[String]) {
    let (mut ready, mut all_ended) = (false, false);
    let mut ended = Vec::new();
    for word in words {
        if word == "ready" {
            ready = true;
        } else if word == "done:*" {
            all_ended = true;
        } else if let Some(id) = word.strip_prefix("done:").and_then(|s| s.parse().ok()) {
            ended.push(id);
        } else if let Some(id) = word.strip_prefix("cancel:").and_then(|s| s.parse().ok()) {
            store.fire_local(id);
        }
    }
    // Only new work wakes the fetcher. A task that ended elsewhere may have freed a slot that
    // a concurrency limit or a probe held, but the pool that ran it claims next anyway (its
    // worker is free): woken by it, every pool holding such tasks would claim at once and all
    // but one come back empty (10 pools, 300 tasks of a type limited to 2: 2,336 claim
    // transactions, 2,082 of them empty). The others find the slot at their next poll.
    if ready {
        store.wake_fetcher();
    }
    if all_ended {
        poll_waiters(store);
    } else {
        store.publish_ended(&ended);
    }
}

/// Extends the leases of the tasks running here; fires the tokens of those whose cancel was
/// asked for, or whose lease was lost (their outcome will not be written).
fn heartbeat(store: &PgStore) -> Result<(), String> {
    let (ids, leases): (Vec<i64>, Vec<i64>) = {
        let local = store.local.lock();
        local.running.iter().map(|(id, h)| (*id, h.lease)).unzip()
    };
    if ids.is_empty() {
        return Ok(());
    }
    let sent = Instant::now();
    let rows = store.with_conn(|c| {
        c.query(
            "UPDATE tasq_tasks t SET lease_until = now() + interval '1 microsecond' * $3::BIGINT
             FROM unnest($1::BIGINT[], $2::BIGINT[]) AS h(id, lease)
             WHERE t.id = h.id AND t.lease_id = h.lease AND t.status = 'running'
             RETURNING t.id, t.cancel_requested IS NOT NULL",
            &[&ids, &leases, &rows::micros(store.lease)],
        )
    })?;
    // Each token is fired under the lease this beat extended or lost: by the time the rows
    // come back, the run may have ended and a worker here claimed the task's next attempt,
    // whose token is not this run's to fire.
    let mut lost: std::collections::HashMap<i64, i64> =
        ids.iter().copied().zip(leases.iter().copied()).collect();
    {
        // The leases extended hold a lease's length from when the beat was sent.
        let mut local = store.local.lock();
        for row in &rows {
            let id: i64 = row.get(0);
            if let (Some(held), Some(&lease)) = (local.running.get_mut(&id), lost.get(&id)) {
                if held.lease == lease {
                    held.valid_until = sent + store.lease;
                }
            }
        }
    }
    for row in &rows {
        let id: i64 = row.get(0);
        let lease = lost.remove(&id);
        if let Some(lease) = lease.filter(|_| row.get::<_, bool>(1)) {
            store.fire_leased(id, lease, Interrupt::Cancelled);
        }
    }
    for (id, lease) in lost {
        store.fire_leased(id, lease, Interrupt::LeaseLost);
    }
    Ok(())
}

/// Publishes the outcomes of awaited tasks that ended (the fallback for a lost notification),
/// and forgets waiters whose handles are gone.
fn poll_waiters(store: &PgStore) {
    let ids: Vec<i64> = {
        let mut waiters = store.waiters.lock();
        waiters.retain(|_, w| w.strong_count() > 0);
        waiters.keys().copied().collect()
    };
    store.publish_ended(&ids);
}

/// The reaper: running tasks whose lease expired go back to `ready`, or end (failed with their
/// attempts used up, cancelled if a cancel was asked for), with their dependents, in one
/// transaction.
fn reap(store: &PgStore) -> Result<usize, String> {
    store.with_conn(|c| {
        let mut tx = c.transaction()?;
        let rows = tx.query(
            // Every decision comes from the row as this statement updates it (the SET's `t`,
            // which PostgreSQL re-reads once the row is locked), never from the snapshot the
            // statement started with: a cancel that committed between the two would otherwise
            // be lost (the row sent back to `ready` with its cancel request still set).
            REAP,
            &[],
        )?;
        let mut dead = Vec::new();
        let mut ready = false;
        let mut done = Vec::new();
        for row in &rows {
            let id: i64 = row.get(0);
            let status: &str = row.get(1);
            match status {
                "ready" => ready = true,
                _ => cascade_ended(&mut tx, id, status, row.get(2), &mut done)?,
            }
            if status == "failed" {
                dead.push((
                    id,
                    row.get::<_, String>(3),
                    row.get::<_, i32>(4),
                    row.get::<_, Option<String>>(5),
                    rows::failure_reason_of(row.get(6)),
                ));
            }
        }
        if rows.iter().any(|row| row.get::<_, &str>(1) == "failed") {
            enforce_dead_letter_limit(&mut tx)?;
        }
        notify_changes(&mut tx, ready, &done)?;
        tx.commit()?;
        // Reported by the process whose reaper ended them: once each.
        for (id, type_name, attempts, error, reason) in dead {
            let failure = Failure::new(
                reason,
                u32::try_from(attempts).unwrap_or(0),
                error.unwrap_or_default(),
                None,
            );
            let name = store.type_name(&type_name);
            store.events.dead_letter(store.id(id), name, &failure);
        }
        Ok(rows.len())
    })
}

/// The cleaner (run by the leader only, see `leader.rs`): applies the queue's policy as the
/// schema holds it now (see `policy.rs`): ends the dead letters beyond the limit, then deletes
/// finished rows (not dead letters) past the age or count, in batches of [`RETAIN_BATCH`], each through
/// the `tasq_finished` index from its oldest end.
fn retain(store: &PgStore) -> Result<(), String> {
    // The schedules' slots no definition can decide again (see `schedules.rs`).
    store.prune_schedules()?;
    let policy = store.with_conn(|c| {
        enforce_dead_letter_limit(c)?;
        let row = c.query_one(super::policy::READ, &[])?;
        Ok(super::policy::of_row(&row))
    })?;
    let max_age = policy.finished_max_age_value().map(rows::micros);
    let max_count = policy
        .finished_max_count_value()
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    if max_age.is_none() && max_count.is_none() {
        return Ok(());
    }
    loop {
        let deleted = store.with_conn(|c| {
            let mut tx = c.transaction()?;
            let rows = tx.query(RETAIN, &[&max_count, &max_age])?;
            let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            if !ids.is_empty() {
                tx.execute(
                    "DELETE FROM tasq_deps WHERE dependency = ANY($1) OR dependent = ANY($1)",
                    &[&ids],
                )?;
            }
            tx.commit()?;
            Ok(ids.len())
        })?;
        if deleted < RETAIN_BATCH {
            return Ok(());
        }
    }
}

/// The reaper's statement (see [`reap`]): every decision from the row as locked now.
pub(super) const REAP: &str = "WITH expired AS (
                 SELECT id FROM tasq_tasks
                 WHERE status = 'running' AND lease_until < now()
                 ORDER BY lease_until LIMIT 1000
                 FOR UPDATE SKIP LOCKED
             )
             UPDATE tasq_tasks t SET
                 status = CASE WHEN t.cancel_requested IS NOT NULL THEN 'cancelled'
                               WHEN t.attempts >= t.max_attempts THEN 'failed'
                               ELSE 'ready' END,
                 dead = t.cancel_requested IS NULL AND t.attempts >= t.max_attempts,
                 failure_reason = CASE WHEN t.cancel_requested IS NULL
                                        AND t.attempts >= t.max_attempts
                                       THEN 'lease_expired' END,
                 last_error = CASE WHEN t.cancel_requested IS NOT NULL THEN t.last_error
                     ELSE 'the lease expired before its worker finished (attempt '
                          || t.attempts || ')' END,
                 cancel_reason = t.cancel_requested,
                 finished_at = CASE WHEN t.cancel_requested IS NOT NULL
                                     OR t.attempts >= t.max_attempts THEN tasq_now() END,
                 run_at = CASE WHEN t.cancel_requested IS NULL AND t.attempts < t.max_attempts
                               THEN tasq_now() ELSE t.run_at END,
                 priority = COALESCE(t.base_priority, t.priority), base_priority = NULL,
                 lease_id = NULL, lease_until = NULL
             WHERE t.id = ANY(ARRAY(SELECT id FROM expired))
               AND t.status = 'running' AND t.lease_until < now()
             RETURNING t.id, t.status, t.has_dependents, t.type, t.attempts, t.last_error,
                       t.failure_reason";

/// Rows the cleaner deletes in one statement: a batch costs about 3 ms (7 us a row).
const RETAIN_BATCH: usize = 500;

/// The cleaner's pick and delete of finished rows (see [`retain`]), [`RETAIN_BATCH`] at most:
/// `$1` the count kept (or NULL), `$2` the age kept in microseconds (or NULL).
pub(super) const RETAIN: &str = "WITH old AS (
                     (SELECT id FROM tasq_tasks
                      WHERE status IN ('succeeded', 'failed', 'cancelled') AND NOT dead
                        AND $2::BIGINT IS NOT NULL
                        AND finished_at <= tasq_now() - interval '1 microsecond' * $2::BIGINT
                      ORDER BY finished_at LIMIT 500)
                     UNION
                     (SELECT id FROM tasq_tasks
                      WHERE status IN ('succeeded', 'failed', 'cancelled') AND NOT dead
                        AND $1::BIGINT IS NOT NULL
                      ORDER BY finished_at DESC OFFSET $1 LIMIT 500)
                 )
                 DELETE FROM tasq_tasks t USING old WHERE t.id = old.id RETURNING t.id";
