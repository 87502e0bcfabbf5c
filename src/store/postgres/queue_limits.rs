//! Queue limits for the whole fleet: the rows of `tasq_queues`, changed under the pause fence,
//! and the claim of a limited queue's rows under its row's lock (schema version 8).
//!
//! # Design
//!
//! A limit is a row of the schema, so every process obeys the same one whatever it was built
//! with. Every claim reads the limited queues after the pause fence (`tasq_paused()`) and passes
//! their rows over; a limited queue's rows are claimed only by a claim of their own
//! ([`Pick::Limited`]), in a transaction that
//!
//! 1. takes the pause fence shared (first: a change of limits takes it exclusively and then the
//!    row, so both take them in the same order and never wait for each other in a circle);
//! 2. locks the queue's row, `SKIP LOCKED`: a claimer that finds it taken tries again a moment
//!    later ([`SOON`]) instead of waiting, so one stalled claimer (a process stopped mid-claim)
//!    holds back that queue only;
//! 3. counts the queue's running rows in a new statement, whose snapshot sees what the row's
//!    last holder committed (a row whose lease expired counts until the reaper takes it back);
//! 4. claims at most the limit minus that count, and commits.
//!
//! So at no moment do more than the limit of a queue's rows run, across the fleet, except
//! those running when a lower limit was set (they finish). A setting's change takes the fence
//! exclusively: once it returns, every claim that could not see it has committed. A raised or
//! lifted limit notifies the fleet; pools learn which queues are limited from their claims'
//! own reading, and refresh the list they claim limited queues from every [`REFRESH`] (a
//! queue limited since waits that long at most; it is never over-claimed meanwhile).
//!
//! A limited queue's rows are claimed in their own turn, best first within the queue:
//! priorities order tasks within a limited queue, not across it and the others. The limited
//! queues go after the others, except in the claim that follows one whose other rows filled
//! every free slot before a limited queue was reached ([`PgStore::limited_for`]): a pool whose
//! unlimited queues always have more ready rows than it has free slots (a busy machine, a
//! schedule that ticks faster than the pool runs it) still claims from its limited queues at
//! every other claim, and a limited queue, which goes first at most its limit's room, never
//! keeps the others from a claim of their own either. (With the others always first, such a
//! pool never reached a limited queue: the durable soak beside two CPU hogs left 190 tasks of
//! queue `slow` ready for minutes while pool B ran the ticks of a schedule.)

use std::time::{Duration, Instant};

use super::conn::{Connections, Sql};
use super::store::PgStore;
use crate::model::queue_limit::{QueueLimit, QueueLimitError};

/// A limited queue `$1`'s running rows (through `tasq_running_queues`).
pub(super) const RUNNING: &str =
    "SELECT count(*) FROM tasq_tasks WHERE status = 'running' AND queue = $1";

/// How often a pool reads which queues are limited.
pub(super) const REFRESH: Duration = Duration::from_secs(1);

/// How long a claimer that found a limited queue's row locked waits before trying again.
pub(super) const SOON: Duration = Duration::from_millis(20);

/// What a claim takes rows from.
#[derive(Clone, Copy, Debug)]
pub(super) enum Pick<'a> {
    /// Every queue that is not limited (a pool without lanes).
    Every,
    /// The queues of a lane, those not limited.
    Lane(&'a [String]),
    /// One limited queue, under its row's lock.
    Limited(&'a str),
}

impl<'a> Pick<'a> {
    /// The pick of a lane's queues, or of every queue for a pool without lanes.
    pub(super) fn of(lane: Option<&'a Vec<String>>) -> Pick<'a> {
        lane.map_or(Pick::Every, |queues| Pick::Lane(queues))
    }

    /// The queues a statement's lane parameter takes (none for `Every`).
    pub(super) fn queues(self) -> Option<Vec<String>> {
        match self {
            Pick::Every => None,
            Pick::Lane(queues) => Some(queues.to_vec()),
            Pick::Limited(queue) => Some(vec![queue.to_owned()]),
        }
    }
}

/// How many rows a limited queue's claim may take.
pub(super) enum Room {
    /// Its row is another claimer's now: try again [`SOON`].
    Busy,
    /// Its limit minus its running rows (zero at or over the limit, or if the limit is gone:
    /// then the ordinary claims take its rows).
    Rows(usize),
}

/// Steps 1 to 3 of the design note, in `tx`, for queue `queue`.
pub(super) fn room(tx: &mut impl Sql, queue: &str) -> Result<Room, postgres::Error> {
    tx.execute(
        "SELECT pg_advisory_xact_lock_shared(tasq_pause_fence())",
        &[],
    )?;
    let Some(row) = tx.query_opt(
        "SELECT max_running FROM tasq_queues WHERE name = $1 FOR UPDATE SKIP LOCKED",
        &[&queue],
    )?
    else {
        let exists = tx.query_opt("SELECT 1 FROM tasq_queues WHERE name = $1", &[&queue])?;
        return Ok(if exists.is_some() {
            Room::Busy
        } else {
            Room::Rows(0)
        });
    };
    let limit: i32 = row.get(0);
    let running: i64 = tx.query_one(RUNNING, &[&queue])?.get(0);
    let room = i64::from(limit).saturating_sub(running).max(0);
    Ok(Room::Rows(usize::try_from(room).unwrap_or(0)))
}

/// Sets or lifts queue `queue`'s limit for the fleet (see
/// [`Store::set_queue_limit`](crate::store::Store::set_queue_limit)), in the name of `holder`;
/// returns the limit it replaced.
pub(super) fn set_limit(
    conns: &impl Connections,
    holder: &str,
    queue: &str,
    limit: Option<u32>,
) -> Result<Option<u32>, QueueLimitError> {
    let limit = limit.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
    let before = super::pause::under_fence(conns, &format!("the limit of queue {queue}"), |tx| {
        let before: Option<i32> = tx
            .query_opt(
                "SELECT max_running FROM tasq_queues WHERE name = $1 FOR UPDATE",
                &[&queue],
            )?
            .map(|row| row.get(0));
        match limit {
            Some(limit) => tx.execute(
                "INSERT INTO tasq_queues (name, max_running, set_at, set_by)
                 VALUES ($1, $2, tasq_now(), $3)
                 ON CONFLICT (name) DO UPDATE
                 SET max_running = EXCLUDED.max_running, set_at = EXCLUDED.set_at,
                     set_by = EXCLUDED.set_by",
                &[&queue, &limit, &holder],
            )?,
            None => tx.execute("DELETE FROM tasq_queues WHERE name = $1", &[&queue])?,
        };
        let raised = match (before, limit) {
            (Some(_), None) => true,
            (Some(before), Some(limit)) => limit > before,
            (None, _) => false,
        };
        if raised {
            // A hint: a pool that misses it claims at its next poll.
            super::submit::notify(tx, "ready")?;
        }
        Ok(before)
    })
    .map_err(QueueLimitError::Store)?;
    Ok(before.map(|n| u32::try_from(n).unwrap_or(0)))
}

/// The fleet's queue limits, by name.
pub(super) fn limits(conns: &impl Connections) -> Result<Vec<QueueLimit>, QueueLimitError> {
    let rows = conns
        .with_conn(|client| {
            client.query(
                "SELECT name, max_running FROM tasq_queues ORDER BY name",
                &[],
            )
        })
        .map_err(QueueLimitError::Store)?;
    Ok(rows
        .iter()
        .map(|row| QueueLimit {
            queue: row.get(0),
            max_running: u32::try_from(row.get::<_, i32>(1)).unwrap_or(0),
        })
        .collect())
}

impl PgStore {
    /// Sets or lifts queue `queue`'s limit for the fleet, and reads the limited queues again
    /// at the next claim.
    pub(super) fn set_fleet_queue_limit(
        &self,
        queue: &str,
        limit: Option<u32>,
    ) -> Result<Option<u32>, QueueLimitError> {
        let before = set_limit(self, self.holder(), queue, limit)?;
        let mut local = self.local.lock();
        local.limited_read = None;
        local.limits_set += 1;
        Ok(before)
    }

    /// Reads which queues are limited if the list is older than [`REFRESH`] (a pool that
    /// cannot read it keeps the list it has: the ordinary claims pass limited queues over
    /// whatever it holds).
    ///
    /// A reading is kept only if this pool set no limit while it was under way: its snapshot
    /// may predate the new row, and kept, it would stand for a whole [`REFRESH`] (a limit set
    /// here as the pool started went unseen that long, and twenty tasks of other queues ran
    /// before the limited one beside two CPU hogs). Not kept, the next claim reads again.
    pub(super) fn refresh_limited(&self) {
        let set_before = {
            let local = self.local.lock();
            if local.limited_read.is_some_and(|at| at.elapsed() < REFRESH) {
                return;
            }
            local.limits_set
        };
        let read = self
            .with_conn(|client| client.query("SELECT name FROM tasq_queues ORDER BY name", &[]));
        if let Ok(rows) = read {
            let names: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
            let mut local = self.local.lock();
            if local.limits_set == set_before {
                local.limited = names;
                local.limited_read = Some(Instant::now());
            }
        }
    }

    /// The limited queues lane `lane` claims from: those the last reading found limited (of
    /// the lane's queues, for a pool with lanes; all of them for a pool without, which serves
    /// every queue: a row keeps the queue it was submitted with, which may not be the one this
    /// pool registers its type in), but not those idle (see
    /// [`limited_idle`](PgStore::limited_idle)); and whether they go first in this claim: they
    /// do once after a claim whose other rows left them no room (the turns of the design
    /// note).
    pub(super) fn limited_for(&self, lane: usize) -> (Vec<String>, bool) {
        let served = self.lane_queues(lane);
        let mut local = self.local.lock();
        let now = Instant::now();
        local.limited_idle.retain(|&(_, until)| until > now);
        let queues: Vec<String> = {
            let local = &*local;
            let idle = |q: &String| local.limited_idle.iter().any(|(idle, _)| idle == q);
            let limited = local.limited.iter();
            limited
                .filter(|q| served.is_none_or(|served| served.contains(q)) && !idle(q))
                .cloned()
                .collect()
        };
        let first = !queues.is_empty() && local.lanes[lane].limited_first;
        if first {
            local.lanes[lane].limited_first = false;
        }
        (queues, first)
    }

    /// A claim of limited queue `queue` came back short: it is at its limit or has nothing
    /// ready. The fetcher does not claim from it again until new work is announced (a local
    /// submit, a notification), a run ends here (the row's queue may not be the one this pool
    /// registers its type in: any run), or a poll interval passes: without
    /// this, every fetch of a busy pool would open a transaction for a queue that cannot give.
    ///
    /// `announced` is [`Local::announced`](super::store::Local::announced) as it was before that claim's statement: if new work
    /// was announced since, the claim's snapshot may not have seen it, and the queue is not
    /// idle (marked idle after the announcement had cleared the marks, the queue would wait a
    /// poll interval, or for the next run here to end, with a task ready).
    pub(super) fn limited_idle(&self, queue: String, announced: u64) {
        let until = Instant::now() + self.poll_interval;
        let mut local = self.local.lock();
        if local.announced == announced {
            local.limited_idle.push((queue, until));
        }
    }
}
