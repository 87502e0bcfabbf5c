//! The durable store: tasks in one PostgreSQL table, shared by worker processes on any number
//! of machines.
//!
//! # How a task moves
//!
//! * A submit inserts a row (`ready`, or `blocked` on its dependencies) in one transaction, and
//!   notifies the channel `tasq` so that an idle pool in another process claims it at once (a
//!   task without a key or dependencies: one statement that inserts and notifies).
//! * A pool's *fetcher* thread claims up to as many ready, due rows as it has free workers,
//!   plus as many more as its lanes' pace says while a backlog lasts (`pace.rs`), in
//!   one statement (`FOR UPDATE SKIP LOCKED` in a CTE, so no two claimers share a row and a
//!   claim of n never takes more than n), giving each a lease: a fencing token from the
//!   `tasq_lease` sequence and an expiry (`lease_until`), both set from the database's clock.
//!   A pool whose types have concurrency limits, rate limits or circuit breakers claims in one
//!   transaction instead, within the allowance of each gate, shared through rows by every
//!   process; aging raises the priorities of waiting rows in a periodic update (see `gates.rs`).
//! * A worker runs the handler and writes the outcome with `WHERE id = $1 AND lease_id = $2`:
//!   if the lease was lost (it expired and another worker took the task over), the write changes
//!   nothing and the outcome is dropped. Every write about a leased task carries that check.
//!   Successes are written in groups, off the workers' path: a worker hands its ack to the
//!   pool's *completer* thread and takes its next task, and the acks that wait while one
//!   statement is in flight go out together in the next (see `completer.rs`).
//! * The *maintenance* thread listens on the channel, extends the leases of the tasks its pool
//!   runs (heartbeat), fires the tokens of tasks cancelled elsewhere, publishes outcomes to local
//!   handles, returns expired leases to `ready` (the reaper: at-least-once delivery), and deletes
//!   finished rows past retention.
//!
//! Every time in a lease, a `run_at` or an age comes from the database's clock, never a client's:
//! leases from `now()`, due times and ages from `tasq_now()`, which is `now()`, or, for a pool on a
//! [`ManualClock`](crate::ManualClock), the database's time when that clock was made plus how far
//! it moved (frozen in between), so tests move a durable pool's time as they move an embedded
//! one's, and pools that share one manual clock share one `tasq_now()` (their gates and due times
//! agree). That time reaches SQL as the session setting `tasq.manual_now_us`, set on a connection
//! each time the store takes it from the pool (and for the store's statements in a caller's
//! transaction), never left from an earlier use: a statement reads the clock's time as it started,
//! except a run's ending (its retry's due time, its breaker's verdict), written at the time the run
//! ended, as the embedded store writes it. Leases stay on real time: they measure whether a process
//! is alive.
//!
//! # Threads and locks
//!
//! `Local` is the only state under a lock here; SQL never runs while it is held, nor does user
//! code (payloads are decoded, outputs encoded and values dropped outside it). The acks'
//! queue (`acks.rs`) has a lock of its own, never taken while `Local`'s is held, nor the other
//! way round. The completer runs no user code: what it leaves, a worker drops.

/// The columns [`PgStore::info_of_row`](store::PgStore::info_of_row) reads, of a row `t` of `tasq_tasks` (a macro, so that
/// statements `concat!` it).
macro_rules! info_columns {
    () => {
        "t.type, t.status, t.run_at <= tasq_now(), COALESCE(t.base_priority, t.priority), \
         t.attempts, EXTRACT(EPOCH FROM t.run_at - tasq_now())::FLOAT8, t.last_error, \
         t.resubmitted_as, t.max_attempts, t.retry_base_us, t.retry_cap_us, t.timeout_us, \
         ARRAY(SELECT dependency FROM tasq_deps WHERE dependent = t.id ORDER BY 1), t.id, \
         t.queue, t.key"
    };
}

/// `WITH RECURSIVE prio(p)`: the priorities of ready tasks, highest first (those below a
/// bound, given as `"AND priority < ..."`), found by one index descent each through
/// `tasq_dequeue`: a skip scan, which PostgreSQL plans by itself only from version 18. A
/// statement then reads each priority's due range (`priority = prio.p AND run_at <= now`) from
/// its oldest end, never the tasks due far ahead that sort after it. `prio` ends with a NULL
/// row: read it `WHERE p IS NOT NULL`.
macro_rules! ready_priorities {
    () => {
        ready_priorities!("")
    };
    ($below:literal) => {
        concat!(
            "WITH RECURSIVE prio(p) AS (
                 (SELECT priority FROM tasq_tasks WHERE status = 'ready' ",
            $below,
            " ORDER BY priority DESC LIMIT 1)
                 UNION ALL
                 SELECT (SELECT t.priority FROM tasq_tasks t
                         WHERE t.status = 'ready' AND t.priority < prio.p
                         ORDER BY t.priority DESC LIMIT 1)
                 FROM prio WHERE prio.p IS NOT NULL
             )"
        )
    };
}

mod acks;
mod admin;
mod background;
mod cancel;
mod completer;
mod config;
mod conn;
mod declarations;
mod dispatch;
mod ending;
mod gates;
mod gating;
mod leader;
mod migrate;
mod notifier;
mod pace;
mod pause;
mod policy;
mod publish;
mod queue_limits;
mod resubmit;
mod rows;
mod schedules;
mod schema;
mod seam;
mod start;
mod stats;
pub(crate) mod store;
mod submit;
#[doc(hidden)]
pub mod testing;
mod time;

pub use admin::{Admin, AdminError};
pub use config::Postgres;
pub use migrate::{SCHEMA_VERSION, migrate, migrate_in};
pub use policy::{Policy, policy, policy_in, set_policy, set_policy_in};
