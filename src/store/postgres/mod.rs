//! The durable store: tasks in one PostgreSQL table, shared by worker processes on any number
//! of machines.
//!
//! # How a task moves
//!
//! * A submit inserts a row (`ready`, or `blocked` on its dependencies) in one transaction, and
//!   notifies the channel `tasq` so that an idle pool in another process claims it at once.
//! * A pool's *fetcher* thread claims up to as many ready, due rows as it has free workers, in
//!   one statement (`FOR UPDATE SKIP LOCKED` in a CTE, so no two claimers share a row and a
//!   claim of n never takes more than n), giving each a lease: a fencing token from the
//!   `tasq_lease` sequence and an expiry (`lease_until`), both set from the database's clock.
//!   A pool whose types have concurrency limits, rate limits or circuit breakers claims in one
//!   transaction instead, within the allowance of each gate, shared through rows by every
//!   process; aging raises the priorities of waiting rows in a periodic update (see `gates.rs`).
//! * A worker runs the handler and writes the outcome with `WHERE id = $1 AND lease_id = $2`:
//!   if the lease was lost (it expired and another worker took the task over), the write changes
//!   nothing and the outcome is dropped. Every write about a leased task carries that check.
//!   Successes are written in groups: the workers whose acks wait while one is in flight go out
//!   together in the next statement (see `acks.rs`).
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
//! code (payloads are decoded, outputs encoded and values dropped outside it).

/// The columns [`PgStore::info_of_row`] reads, of a row `t` of `tasq_tasks` (a macro, so that
/// statements `concat!` it).
macro_rules! info_columns {
    () => {
        "t.type, t.status, t.run_at <= tasq_now(), COALESCE(t.base_priority, t.priority), \
         t.attempts, EXTRACT(EPOCH FROM t.run_at - tasq_now())::FLOAT8, t.last_error, \
         t.resubmitted_as, t.max_attempts, t.retry_base_us, t.retry_cap_us, t.timeout_us, \
         ARRAY(SELECT dependency FROM tasq_deps WHERE dependent = t.id ORDER BY 1), t.id"
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
mod background;
mod conn;
mod declarations;
mod dispatch;
mod gates;
mod leader;
mod notifier;
mod policy;
mod rows;
mod schema;
mod stats;

pub use self::policy::{Policy, policy, policy_in, set_policy, set_policy_in};

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use postgres::{NoTls, Row};
use serde_json::Value;

use self::conn::Sql;
use crate::model::cancel::{CancelToken, Interrupt};
use crate::model::clock::Clock;
use crate::model::completion::{Completion, Finished};
use crate::model::dead_letter::DeadLetter;
use crate::model::error::{BuildError, CancelError, ResubmitError, SubmitErrorKind, WaitError};
use crate::model::id::TaskId;
use crate::model::state::{CancelOutcome, CancelReason, TaskState};
use crate::model::task::Start;
use crate::observe::events::Events;
use crate::observe::metrics::RunEnd;
use crate::observe::stats::{Stats, TaskFilter, TaskInfo, Totals, TypeStats};
use crate::store::registry::Registry;
use crate::store::{
    Claim, CopyPayload, Drained, Revived, RunOutcome, Store, StoreHub, Submission, Submitted,
};
use crate::sync::{Arc, Condvar, Mutex, Weak};
use crate::unwind;

/// The version of the durable store's schema that this crate reads and writes:
/// [`migrate`] brings a database to it.
///
/// # Examples
///
/// ```
/// assert!(tasq::postgres::SCHEMA_VERSION >= 1);
/// ```
pub const SCHEMA_VERSION: i32 = schema::VERSION;

type Db = r2d2::Pool<conn::Connector>;

/// How long the store waits for the database before an operation fails (see `error.rs`).
const PATIENCE: Duration = Duration::from_secs(60);

/// How long a reading of the queue's figures (`Pool::try_stats`, the alerts' and metrics'
/// samples) waits for the database before it says the store is away.
const READING_PATIENCE: Duration = Duration::from_secs(5);

/// The settings of a durable pool: where the database is, and how leases and polling behave.
/// Made by [`Builder::postgres`](crate::Builder::postgres); see the `Builder<Postgres>` methods.
///
/// # Examples
///
/// ```no_run
/// let builder = tasq::Pool::builder()
///     .postgres("host=127.0.0.1 user=postgres dbname=test")
///     .lease(std::time::Duration::from_secs(30));
/// # let _ = builder;
/// ```
#[derive(Clone, Debug)]
pub struct Postgres {
    pub(crate) url: String,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) connections: Option<u32>,
    pub(crate) prefetch: usize,
    pub(crate) schema: Option<String>,
}

impl Postgres {
    pub(crate) fn new(url: String) -> Self {
        Postgres {
            url,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            connections: None,
            prefetch: 0,
            schema: None,
        }
    }
}

/// Brings the database's tasq tables to the schema this version of the crate uses, creating
/// them if needed; returns the version it found (0 for none). Safe to call from several
/// processes at once, and again once done. A durable pool refuses to build until it has run.
///
/// # Errors
///
/// The database's error, if it could not connect or a migration failed (nothing of that
/// migration is kept).
///
/// # Examples
///
/// ```no_run
/// let found = tasq::postgres::migrate("host=127.0.0.1 user=postgres dbname=test")?;
/// assert!(found <= tasq::postgres::SCHEMA_VERSION);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn migrate(url: &str) -> Result<i32, postgres::Error> {
    let mut client = postgres::Client::connect(url, NoTls)?;
    schema::migrate(&mut client, None)
}

/// As [`migrate`], for the queue in schema `schema` (created if it does not exist): a pool
/// built with [`Builder::schema`](crate::Builder::schema) of that name uses it, whatever the
/// connection string's `search_path`. Everything the queue names derives from the schema: its
/// tables and functions live in it, and its notification channel is `tasq_` and its name.
///
/// # Errors
///
/// [`SchemaError::InvalidName`](crate::SchemaError::InvalidName) for a name tasq does not
/// take (1 to 63 bytes of a-z, 0-9 and `_`, not starting with a digit or `pg_`); the
/// database's error otherwise.
///
/// # Examples
///
/// ```no_run
/// let found = tasq::postgres::migrate_in("host=127.0.0.1 user=postgres dbname=test", "billing")?;
/// assert!(found <= tasq::postgres::SCHEMA_VERSION);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn migrate_in(url: &str, schema: &str) -> Result<i32, crate::SchemaError> {
    let mut client = conn::Target::new(url, Some(schema))?.connect()?;
    Ok(schema::migrate(&mut client, Some(schema))?)
}

/// For the crate's own tests and benchmarks: the store's statements, run as the store runs them.
#[doc(hidden)]
pub mod testing {
    /// The store's claim statement (see `dispatch::CLAIM`).
    pub const CLAIM: &str = super::dispatch::CLAIM;

    /// The store's ack of successes: `$1` row ids, `$2` their leases, `$3` their outputs
    /// (see `acks::ACK`).
    pub const ACK: &str = super::acks::ACK;

    /// The statement of a page of `Pool::tasks` in `state` (if given), of one type (if
    /// `by_type`): `$1` the id it starts after, `$2` the limit, `$3` the type's name.
    pub fn tasks_page(state: Option<crate::TaskState>, by_type: bool) -> String {
        super::tasks_page(state, by_type)
    }

    /// The gated claim's pick (see `gates::PICK`): `$1` types, `$2` limit, `$3` lease in
    /// microseconds, `$4` the gated types among `$1`.
    pub const GATED_PICK: &str = super::gates::PICK;

    /// The aging update (see `gates::AGE`): `$1` types, `$2` ceiling, `$3` microseconds a level.
    pub const AGE: &str = super::gates::AGE;

    /// A statement the store runs again and again whatever the queue holds (claims, the
    /// reaper, the cleaner, the aging update, the figures behind stats and alerts, the waits'
    /// polls), with parameters as a pool would give them: for a test that reads their plans
    /// on a large table. Some write: run them in a transaction that rolls back.
    pub struct Periodic {
        /// What it is.
        pub name: &'static str,
        /// Its text.
        pub sql: &'static str,
        /// Its parameters.
        pub params: Vec<Box<dyn postgres::types::ToSql + Sync>>,
    }

    impl std::fmt::Debug for Periodic {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Periodic")
                .field("name", &self.name)
                .field("params", &self.params)
                .finish_non_exhaustive()
        }
    }

    /// What the store sets on each of its connections (a test reading the plans of
    /// [`periodic`] statements on its own connection sets it too).
    pub const SESSION: &str = super::conn::SESSION;

    /// Every [`Periodic`] statement, for a queue whose types are `types` (the first aged, the
    /// second gated).
    pub fn periodic(types: &[&str]) -> Vec<Periodic> {
        let types: Vec<String> = types.iter().map(|&t| t.to_owned()).collect();
        let gated: Vec<String> = types.iter().skip(1).take(1).cloned().collect();
        let day_us: i64 = 24 * 60 * 60 * 1_000_000;
        let lease_us: i64 = 30_000_000;
        let p = |name, sql, params: Vec<Box<dyn postgres::types::ToSql + Sync>>| Periodic {
            name,
            sql,
            params,
        };
        vec![
            p(
                "claim",
                CLAIM,
                vec![
                    Box::new(types.clone()),
                    Box::new(10_i64),
                    Box::new(lease_us),
                ],
            ),
            p(
                "gated pick",
                GATED_PICK,
                vec![
                    Box::new(types.clone()),
                    Box::new(10_i64),
                    Box::new(lease_us),
                    Box::new(gated),
                ],
            ),
            p(
                "aging update",
                AGE,
                vec![
                    Box::new(types[..1].to_vec()),
                    Box::new(5_i32),
                    Box::new(60_000_000_i64),
                ],
            ),
            p("reaper", super::background::REAP, vec![]),
            p(
                "retention by age",
                super::background::RETAIN,
                vec![Box::new(None::<i64>), Box::new(Some(day_us))],
            ),
            p(
                "retention by count",
                super::background::RETAIN,
                vec![Box::new(Some(super::stats::CAP)), Box::new(None::<i64>)],
            ),
            p(
                "dead-letter trim",
                super::dispatch::TRIM_DEAD_LETTERS,
                vec![],
            ),
            p(
                "stats",
                super::stats::STATS,
                vec![Box::new(super::stats::CAP)],
            ),
            p(
                "type stats",
                super::stats::TYPE_STATS,
                vec![Box::new(super::stats::CAP), Box::new(types.clone())],
            ),
            p("wait_empty poll", super::EMPTY, vec![]),
            p(
                "wait_idle poll",
                super::IDLE,
                vec![Box::new(Vec::<String>::new())],
            ),
        ]
    }

    /// Brings the database's tasq tables to schema version `version` (at most
    /// [`SCHEMA_VERSION`](super::SCHEMA_VERSION)), as [`migrate`](super::migrate) does: for the
    /// tests of upgrades from an older version.
    pub fn migrate_to(url: &str, version: i32) -> Result<i32, postgres::Error> {
        let mut client = postgres::Client::connect(url, postgres::NoTls)?;
        super::schema::migrate_to(&mut client, version, None)
    }

    /// Runs the store's claim: up to `limit` ready, due tasks of `types`, each leased for
    /// `lease_us` microseconds. Returns (row id, lease id) of each.
    pub fn claim(
        client: &mut postgres::Client,
        types: &[String],
        limit: i64,
        lease_us: i64,
    ) -> Result<Vec<(i64, i64)>, postgres::Error> {
        let rows = client.query(CLAIM, &[&types, &limit, &lease_us])?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(4))).collect())
    }
}

/// A claimed task's lease as its pool holds it.
struct Held {
    lease: i64,
    token: CancelToken,
    type_index: u32,
    /// Until when the lease surely holds, on this process's monotonic clock: the lease's length
    /// from when the statement that took or last extended it was *sent* (the database set the
    /// expiry later than that, never earlier). A claim still waiting for a worker past this is
    /// never started: its lease may be lost (the process stalled, a SIGSTOP), and another
    /// worker may already run the task.
    valid_until: Instant,
}

/// The pool-local state: claims waiting for a worker, the tasks running here, the workers.
struct Local {
    /// Claimed, leased, not started yet (given back at shutdown).
    queue: VecDeque<Claim>,
    running: HashMap<i64, Held>,
    /// Slots (workers plus prefetch) neither running a task nor holding one in `queue`.
    free: usize,
    /// The fetcher should claim now (a notification, a local submit, a finished task).
    wake: bool,
    /// Closed to new tasks: the fetcher stops claiming.
    closed: bool,
    /// Workers exit once their handler returns.
    stopping: bool,
    live_workers: usize,
    handlers_in_shutdown: usize,
    totals: Totals,
    /// A gate held tasks back in the last claim and may reopen by itself then (a token, a
    /// cool-down's end): the fetcher claims again at this real instant.
    gate_wake: Option<Instant>,
}

impl Local {
    /// Nothing claimed by this pool is waiting or running: a claim leaves `running` only after
    /// its ending is written and published to this process's handles (see `finish`), so a
    /// wait that sees the database settled and this settled returns after every local
    /// handle of the tasks this pool ran has its outcome.
    fn settled(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty()
    }

    /// Whether the fetcher should claim (when woken): a slot is free and, with prefetch, a
    /// batch's worth of slots is, or the workers have nothing left to take.
    fn wants_claim(&self, prefetch: usize) -> bool {
        self.free > 0 && (self.free >= prefetch || self.queue.is_empty())
    }
}

/// Why a statement failed: no connection, or the database's error.
enum StoreFailure {
    Connect(String),
    Db(postgres::Error),
    /// The connection was lost before anything of the work could commit (see
    /// `Conn::lost_before_commit`): safe to run again.
    Lost(postgres::Error),
}

impl fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreFailure::Connect(text) => f.write_str(text),
            StoreFailure::Db(error) | StoreFailure::Lost(error) => {
                f.write_str(&conn::describe(error))
            }
        }
    }
}

/// The durable store of one pool.
pub(crate) struct PgStore {
    queue: u64,
    registry: Registry,
    db: Db,
    /// Where its connections go (the listener's too).
    target: conn::Target,
    lease: Duration,
    poll_interval: Duration,
    /// With a manual clock: the database's time when that clock was made, in microseconds since
    /// the epoch; `tasq_now()` is that plus how far the clock moved.
    manual_base_us: Option<i64>,
    /// Claims held beyond the free workers (see `Builder::prefetch`).
    prefetch: usize,
    /// The names of the types this pool runs (it claims no other).
    types: Vec<String>,
    local: Mutex<Local>,
    /// Workers wait here for claims.
    work_cv: Condvar,
    /// The fetcher waits here for free slots and wake-ups.
    fetch_cv: Condvar,
    /// `shutdown` waits here for running handlers and exiting workers.
    done_cv: Condvar,
    /// Handles waiting in this process, by row id.
    waiters: Mutex<HashMap<i64, Weak<Completion>>>,
    /// What the pool's handles share (they always hold their completion here).
    hub: Arc<StoreHub>,
    /// Successes waiting to be written together.
    acks: acks::Acks,
    clock: Clock,
    threads: Mutex<Vec<crate::sync::JoinHandle>>,
    /// Where dead letters and breaker changes are reported.
    events: Events,
    /// The limits and breakers of the pool's types; `None`: it claims with the plain statement.
    gates: Option<gates::Gates>,
    /// When the next aging update is due, and whether one is in flight (see `gates::age_if_due`).
    aging: Mutex<gates::AgingTurn>,
    /// The fetcher waits here for an aging update in flight in the maintenance thread.
    aging_cv: Condvar,
}

impl PgStore {
    /// Connects, checks the schema, and starts the fetcher and maintenance threads.
    pub(crate) fn start(
        registry: Registry,
        settings: Postgres,
        workers: usize,
        clock: Clock,
        events: Events,
    ) -> Result<Arc<PgStore>, BuildError> {
        if let Some(entry) = (0..registry.len())
            .map(|i| registry.entry(i))
            .find(|entry| entry.codec.is_none())
        {
            return Err(BuildError::NotDurable(entry.name));
        }
        let store_error = |e: postgres::Error| BuildError::Store(conn::describe(&e));
        let target =
            conn::Target::new(&settings.url, settings.schema.as_deref()).map_err(|error| {
                match error {
                    crate::SchemaError::InvalidName { problem, .. } => BuildError::InvalidSetting {
                        setting: "schema",
                        of: "the pool",
                        problem,
                    },
                    crate::SchemaError::Db(e) => store_error(e),
                }
            })?;
        // One connection first, to check the schema: an unreachable database or a wrong
        // name fails the build at once, with the server's message (the pool below retries
        // for its connection timeout).
        let mut client = target.connect().map_err(store_error)?;
        let queue = match schema::read(&mut client).map_err(store_error)? {
            Some((version, queue)) if version == SCHEMA_VERSION => queue,
            found => {
                let (migrate, place) = match target.schema() {
                    Some(name) => ("migrate_in", format!("schema {name}")),
                    None => ("migrate", "database".to_owned()),
                };
                return Err(BuildError::Store(format!(
                    "the {place}'s tasq tables are at version {}, this crate needs {}: call \
                     tasq::postgres::{migrate} first",
                    found.map_or(0, |(v, _)| v),
                    SCHEMA_VERSION
                )));
            }
        };
        // The types as this pool declares them, against the fleet's last declarations.
        let holder = format!("{}@{}", std::process::id(), host_name());
        let mismatches =
            declarations::record(&mut client, &registry, &holder).map_err(store_error)?;
        let manual_base_us = match clock.manual_offset() {
            Some(offset) => Some(manual_base(&mut client, &clock, offset).map_err(store_error)?),
            None => None,
        };
        drop(client);
        let connections = settings
            .connections
            .unwrap_or_else(|| u32::try_from(workers + 4).unwrap_or(u32::MAX));
        let db = r2d2::Pool::builder()
            .max_size(connections)
            .connection_timeout(Duration::from_secs(10))
            // No round trip to test a connection at each checkout: a broken one fails its
            // statement, which is retried (and r2d2 drops a connection that reports closed).
            .test_on_check_out(false)
            .build(conn::Connector::new(target.clone()))
            .map_err(|e| BuildError::Store(e.to_string()))?;
        let prefetch = settings.prefetch;
        // Only the types it has handlers for: a type declared without one is submitted here
        // and run elsewhere.
        let types = registry
            .entries()
            .iter()
            .filter(|entry| entry.runs_here)
            .map(|entry| entry.name.to_owned())
            .collect();
        let gates = gates::Gates::new(&registry);
        let store = Arc::new(PgStore {
            queue: queue as u64,
            registry,
            db,
            target,
            lease: settings.lease,
            poll_interval: settings.poll_interval,
            manual_base_us,
            prefetch,
            types,
            local: Mutex::new(Local {
                queue: VecDeque::new(),
                running: HashMap::new(),
                // A pool without workers claims nothing, prefetch or not.
                free: if workers == 0 { 0 } else { workers + prefetch },
                wake: true,
                closed: false,
                stopping: false,
                live_workers: workers,
                handlers_in_shutdown: 0,
                totals: Totals {
                    declaration_mismatches: mismatches.len() as u64,
                    ..Totals::default()
                },
                gate_wake: None,
            }),
            work_cv: Condvar::new(),
            fetch_cv: Condvar::new(),
            done_cv: Condvar::new(),
            waiters: Mutex::new(HashMap::new()),
            acks: acks::Acks::default(),
            clock,
            threads: Mutex::new(Vec::new()),
            events,
            gates,
            aging: Mutex::new(gates::AgingTurn::default()),
            aging_cv: Condvar::new(),
            hub: StoreHub::new(),
        });
        if let Some(gates) = &store.gates {
            // The rows every process shares: made by the first pool that uses them.
            store
                .with_conn(|c| gates::ensure_rows(c, gates))
                .map_err(BuildError::Store)?;
        }
        store.hub.attach(Arc::downgrade(&store) as Weak<PgStore>);
        for event in mismatches {
            store.events.emit(event);
        }
        let sleeper: Weak<PgStore> = Arc::downgrade(&store);
        store.clock.register(sleeper);
        // The fetcher is joined at shutdown. The maintenance thread is not: it outlives the
        // pool while handles of this process still wait (it publishes their outcomes, whichever
        // process ends their tasks), and exits after the last.
        let fetcher = background::spawn("tasq-pg-fetch", &store, dispatch::fetch_loop);
        match fetcher {
            Ok(handle) => store.threads.lock().push(handle),
            Err(error) => {
                store.stop_now();
                return Err(BuildError::Spawn(error));
            }
        }
        if let Err(error) = background::spawn("tasq-pg-maintain", &store, background::maintain_loop)
        {
            store.stop_now();
            store.join_threads();
            return Err(BuildError::Spawn(error));
        }
        Ok(store)
    }

    fn id(&self, seq: i64) -> TaskId {
        TaskId::from_parts(self.queue, seq as u64)
    }

    fn seq(&self, id: TaskId) -> Option<i64> {
        rows::local_seq(self.queue, id)
    }

    /// A connection from the pool that answers, retried with backoff while the database is
    /// unreachable (until `give_up`, a minute for most callers: past that the caller's
    /// operation fails). A connection idle
    /// for a while is checked first (see `conn::IDLE_CHECK`): one whose server process went
    /// away (an outage, a restart) is dropped and another taken, so no statement is sent on it.
    ///
    /// `check`: check it whether idle or not.
    fn conn(
        &self,
        check: bool,
        give_up: Instant,
    ) -> Result<r2d2::PooledConnection<conn::Connector>, String> {
        let mut delay = Duration::from_millis(50);
        // Broken idle connections met in a row: after an outage every idle one is; the next
        // may be good, so the first few are replaced at once.
        let mut broken = 0;
        loop {
            // r2d2 waits for a connection up to its own timeout: not past ours.
            let patience = give_up.saturating_duration_since(Instant::now());
            let error = match self.db.get_timeout(patience.max(Duration::from_millis(1))) {
                Ok(mut conn) => match conn.check_if_idle(check) {
                    Ok(()) => return Ok(conn),
                    // Broken: r2d2 drops it (its client reports closed) as it goes back.
                    Err(error) => {
                        broken += 1;
                        conn::describe(&error)
                    }
                },
                Err(error) => error.to_string(),
            };
            if Instant::now() >= give_up {
                return Err(error);
            }
            if broken == 0 || broken > 16 {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }

    /// Runs `f` on a connection; a database error is returned as text. A transaction that the
    /// server chose as a deadlock's victim, or whose session it terminated, is run again (twice
    /// at most): it did nothing.
    ///
    /// With a manual clock, `tasq_now()` is the clock's time as each attempt starts.
    fn with_conn<R>(
        &self,
        f: impl FnMut(&mut conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        self.with_conn_at(None, f)
    }

    /// As [`with_conn`](PgStore::with_conn), waiting for a connection `patience` at most
    /// instead of a minute: for a reading whose caller would rather hear the store is away.
    fn with_conn_within<R>(
        &self,
        patience: Duration,
        f: impl FnMut(&mut conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        self.with_conn_for(None, Instant::now() + patience, f)
    }

    /// As [`with_conn`](PgStore::with_conn), with `tasq_now()` at `at`, a time read earlier
    /// from a manual clock by [`manual_now_us`](PgStore::manual_now_us) (`None`: the clock's
    /// time as each attempt starts). For writes whose times belong to an earlier moment than
    /// their statement's: a run's ending is stamped with the time the run ended.
    fn with_conn_at<R>(
        &self,
        at: Option<i64>,
        f: impl FnMut(&mut conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        self.with_conn_for(at, Instant::now() + PATIENCE, f)
    }

    /// The body of the `with_conn` family: connections are waited for until `give_up`.
    fn with_conn_for<R>(
        &self,
        at: Option<i64>,
        give_up: Instant,
        mut f: impl FnMut(&mut conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        let mut attempts = 0;
        // After a terminated session, every connection is checked before use: its idle
        // neighbours in the pool likely died with it.
        let mut check = false;
        loop {
            attempts += 1;
            let error = match self.try_with_conn(at, check, give_up, &mut f) {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            // Reported in the totals (`store_errors`); the caller retries or returns it.
            self.count(|t| t.store_errors += 1);
            // Run again when the server says the work was not done: a deadlock's victim is
            // rolled back, and a session the server terminated (an outage, a restart,
            // `pg_terminate_backend`) ran nothing of this attempt that it did not roll back.
            // So did a connection lost before its work sent a commit. Any other error may come
            // after a commit, and is returned.
            use postgres::error::SqlState;
            let again = matches!(&error, StoreFailure::Lost(_))
                || matches!(&error, StoreFailure::Db(e) if e.code().is_some_and(|code| {
                    [
                        SqlState::T_R_DEADLOCK_DETECTED,
                        SqlState::ADMIN_SHUTDOWN,
                        SqlState::CRASH_SHUTDOWN,
                        SqlState::CANNOT_CONNECT_NOW,
                    ]
                    .contains(code)
                }));
            if !again || attempts == 3 {
                return Err(error.to_string());
            }
            check = true;
        }
    }

    fn try_with_conn<R>(
        &self,
        at: Option<i64>,
        check: bool,
        give_up: Instant,
        f: &mut impl FnMut(&mut conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, StoreFailure> {
        let mut conn = self.conn(check, give_up).map_err(StoreFailure::Connect)?;
        // A manual clock sets `tasq_now()` on this connection (a test's pool only), after the
        // checkout: the setting a connection kept from its last use is stale.
        if let Some(now) = at.or_else(|| self.manual_now_us()) {
            let set = format!("SET tasq.manual_now_us = '{now}'");
            // A setting commits nothing: lost here, the work can run on another connection.
            conn.client().batch_execute(&set).map_err(|error| {
                if conn::is_lost(&error) {
                    StoreFailure::Lost(error)
                } else {
                    StoreFailure::Db(error)
                }
            })?;
        }
        conn.start();
        f(&mut conn).map_err(|error| {
            if conn.lost_before_commit(&error) {
                StoreFailure::Lost(error)
            } else {
                StoreFailure::Db(error)
            }
        })
    }

    /// With a manual clock, its time now as `tasq_now()` reads it: microseconds since the
    /// epoch, on the database's time line (`None` on the system clock).
    fn manual_now_us(&self) -> Option<i64> {
        let (base, offset) = (self.manual_base_us?, self.clock.manual_offset()?);
        Some(base.saturating_add(rows::micros(offset)))
    }

    /// Gives the statements that follow in a caller's transaction (`submit_in`, `succeed_in`)
    /// the pool's `tasq_now()`: with a manual clock, sets its time until the transaction ends
    /// (`set_config(.., true)`) and returns the caller's value, for
    /// [`restore_callers_now`](PgStore::restore_callers_now). Run inside a savepoint: if that
    /// rolls back, so does the setting.
    fn set_callers_now(
        &self,
        tx: &mut postgres::Transaction<'_>,
    ) -> Result<Option<String>, postgres::Error> {
        let Some(now) = self.manual_now_us() else {
            return Ok(None);
        };
        let callers: Option<String> = tx
            .query_one("SELECT current_setting('tasq.manual_now_us', true)", &[])?
            .get(0);
        tx.execute(
            "SELECT set_config('tasq.manual_now_us', $1, true)",
            &[&now.to_string()],
        )?;
        // Unset and empty read alike (see `tasq_now()`).
        Ok(Some(callers.unwrap_or_default()))
    }

    /// Puts back the caller's value of the setting that
    /// [`set_callers_now`](PgStore::set_callers_now) replaced, so the rest of the caller's
    /// transaction reads its own `tasq_now()` again.
    fn restore_callers_now(
        tx: &mut postgres::Transaction<'_>,
        callers: Option<String>,
    ) -> Result<(), postgres::Error> {
        if let Some(value) = callers {
            tx.execute(
                "SELECT set_config('tasq.manual_now_us', $1, true)",
                &[&value],
            )?;
        }
        Ok(())
    }

    /// The codec of registered type `type_index` (every type of a durable pool has one: the
    /// build refuses others).
    fn codec(&self, type_index: u32) -> crate::model::codec::Codec {
        self.registry
            .entry(type_index)
            .codec
            .expect("durable types have codecs")
    }

    /// The type index of a row's type name, if this pool registered it.
    fn type_index(&self, name: &str) -> Option<u32> {
        self.registry.index_of(name)
    }

    /// A row's type name as a `&'static str`: the registered name, or (a type another pool
    /// runs) a leaked copy.
    fn type_name(&self, name: &str) -> &'static str {
        match self.type_index(name) {
            Some(index) => self.registry.entry(index).name,
            None => leak_name(name.to_owned()),
        }
    }

    /// Wakes the fetcher (a task became ready here, or a slot freed).
    fn wake_fetcher(&self) {
        let mut local = self.local.lock();
        local.wake = true;
        self.fetch_cv.notify_one();
    }

    /// Publishes the outcome of a terminal row to the handles waiting for it in this process.
    ///
    /// Not for a task that a worker of this pool still holds: that worker publishes what it
    /// wrote (the output itself, not a copy decoded from the row) before it lets go of the
    /// task (see `finish`).
    fn publish_row(&self, seq: i64, row: &Row) {
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
            "failed" => Finished::Failed(Box::new(rows::failure_of(
                row.get("failure_reason"),
                row.get("attempts"),
                row.get("last_error"),
            ))),
            _ => Finished::Cancelled(rows::cancel_reason_of(
                self.queue,
                row.get("cancel_reason"),
                row.get("cancel_cause"),
            )),
        }
    }

    /// The columns [`finished_of_row`](PgStore::finished_of_row) reads.
    const OUTCOME_COLUMNS: &'static str = "id, status, type, output, attempts, failure_reason, \
        last_error, cancel_reason, cancel_cause";

    /// Registers a waiter for `seq`; if the row is terminal already, publishes it at once.
    fn watch_seq(&self, seq: i64, completion: &Arc<Completion>) {
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
    fn fire_local(&self, seq: i64) {
        let token = self.local.lock().running.get(&seq).map(|h| h.token.clone());
        if let Some(token) = token {
            token.fire(Interrupt::Cancelled);
        }
    }

    /// Fires the token of the run of task `seq` under `lease`, if it is still running here:
    /// not that of a later attempt of the same task that a worker here claimed since.
    fn fire_leased(&self, seq: i64, lease: i64, why: Interrupt) {
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

    /// What a row read with [`info_columns!`] says of its task, with `now` the pool's clock's
    /// reading for its due time.
    fn info_of_row(&self, row: &Row, now: Instant) -> TaskInfo {
        let state = rows::state_of(row.get(1), row.get(2));
        let index = self.type_index(row.get(0));
        let task_type =
            index.map_or_else(|| leak_name(row.get(0)), |i| self.registry.entry(i).name);
        // A column left NULL (a row inserted by hand) takes the type's setting here; a type
        // this pool does not know, the defaults'.
        let defaults = index.map_or_else(crate::store::registry::Settings::unknown_type, |i| {
            self.registry.entry(i).settings()
        });
        let settings = rows::settings_of(defaults, row, 8);
        // As the embedded store: a due time only for a task that waits for one.
        let waiting = matches!(state, TaskState::Blocked | TaskState::Scheduled);
        TaskInfo {
            id: self.id(row.get(13)),
            task_type,
            state,
            priority: u8::try_from(row.get::<_, i16>(3)).unwrap_or(0),
            attempts: u32::try_from(row.get::<_, i32>(4)).unwrap_or(0),
            max_attempts: settings.max_attempts,
            retry_policy: settings.retry,
            timeout: settings.timeout,
            run_at: waiting.then(|| rows::instant_in(now, row.get(5))),
            last_error: row.get(6),
            resubmitted_as: row.get::<_, Option<i64>>(7).map(|s| self.id(s)),
            dependencies: row
                .get::<_, Vec<i64>>(12)
                .into_iter()
                .map(|s| self.id(s))
                .collect(),
        }
    }

    fn count(&self, f: impl FnOnce(&mut Totals)) {
        f(&mut self.local.lock().totals);
    }
}

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
fn tasks_page(state: Option<TaskState>, by_type: bool) -> String {
    const STATUSES: [&str; 6] = [
        "blocked",
        "ready",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ];
    let columns = info_columns!();
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

/// What a submit inserts, computed outside the transaction.
struct Insert<'a> {
    type_name: &'static str,
    payload: &'a Value,
    priority: i16,
    delay_us: i64,
    /// A wall-clock due time, in microseconds since the epoch, in place of the delay: the
    /// row's `run_at` is that time itself, or the database's now if that passed already (see
    /// [`PgStore::wall_clock_due`]).
    at_us: Option<i64>,
    /// The task's settings as their columns (see `rows::settings_columns`).
    settings: rows::SettingsColumns,
    key: Option<&'a str>,
}

/// Inserts one task in `tx`: checks its key and dependencies, inserts the row and its edges.
/// Returns the row id and whether it is a duplicate, or why it was refused.
fn insert_task(
    tx: &mut impl Sql,
    queue: u64,
    task: &Insert<'_>,
    dependencies: &[crate::model::task::Dependency],
) -> Result<Result<(i64, bool, &'static str), SubmitErrorKind>, postgres::Error> {
    if let Some(key) = task.key {
        let existing = tx.query_opt(
            "SELECT id, type FROM tasq_tasks WHERE key = $1
             AND status IN ('blocked', 'ready', 'running', 'succeeded') FOR SHARE",
            &[&key],
        )?;
        if let Some(row) = existing {
            return Ok(key_holder(queue, key, task.type_name, &row));
        }
    }
    let mut pending = Vec::new();
    let mut doomed: Option<(CancelReason, i64)> = None;
    let mut states: HashMap<i64, String> = HashMap::new();
    if !dependencies.is_empty() {
        let mut seqs = Vec::with_capacity(dependencies.len());
        for dependency in dependencies {
            match rows::local_seq(queue, dependency.id()) {
                Some(seq) => seqs.push(seq),
                None => return Ok(Err(SubmitErrorKind::UnknownDependency(dependency.id()))),
            }
        }
        // Locks the dependencies' rows: a dependency cannot end between this check and the
        // edge's insert (its ending waits for this transaction, then sees the edge). In id
        // order, as an ending locks its row and then its dependents' (whose ids are larger):
        // two such transactions never wait for each other in a cycle.
        let found = tx.query(
            "WITH locked AS (
                 SELECT id FROM tasq_tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE
             )
             UPDATE tasq_tasks t SET has_dependents = true FROM locked WHERE t.id = locked.id
             RETURNING t.id, t.status",
            &[&seqs],
        )?;
        states = found.iter().map(|row| (row.get(0), row.get(1))).collect();
        for (dependency, seq) in dependencies.iter().zip(&seqs) {
            match states.get(seq).map(String::as_str) {
                Some("succeeded") => {}
                Some("failed") => {
                    doomed.get_or_insert((CancelReason::DependencyFailed(dependency.id()), *seq));
                }
                Some("cancelled") => {
                    doomed
                        .get_or_insert((CancelReason::DependencyCancelled(dependency.id()), *seq));
                }
                Some(_) => pending.push(*seq),
                None if dependency.succeeded() => {}
                None => return Ok(Err(SubmitErrorKind::UnknownDependency(dependency.id()))),
            }
        }
        pending.sort_unstable();
        pending.dedup();
    }
    let (status, reason, cause) = match doomed {
        Some((reason, _)) => {
            let (kind, cause) = rows::cancel_reason_columns(reason);
            ("cancelled", Some(kind), cause)
        }
        None if !pending.is_empty() => ("blocked", None, None),
        None => ("ready", None, None),
    };
    let pending_count = i32::try_from(pending.len()).unwrap_or(i32::MAX);
    // Rounds: the key's holder may end or be deleted between the insert's conflict and the
    // lookup (it committed, then another transaction cancelled or pruned it). The key is free
    // again then, and the insert is tried again; a holder found is locked, so it stays until
    // this transaction commits.
    let mut rounds = 0;
    let row = loop {
        let inserted = tx.query_opt(
            "INSERT INTO tasq_tasks (key, type, payload, priority, status, run_at, max_attempts,
                                     pending_deps, cancel_reason, cancel_cause, finished_at,
                                     retry_base_us, retry_cap_us, timeout_us)
             VALUES ($1, $2, $3, $4, $5,
                     CASE WHEN $14::BIGINT IS NULL
                          THEN tasq_now() + interval '1 microsecond' * $6::BIGINT
                          ELSE GREATEST(TIMESTAMPTZ 'epoch' + interval '1 microsecond' * $14,
                                        tasq_now()) END,
                     $7, $8, $9, $10,
                     CASE WHEN $5 = 'cancelled' THEN tasq_now() END, $11, $12, $13)
             ON CONFLICT (key) WHERE key IS NOT NULL
                 AND status IN ('blocked', 'ready', 'running', 'succeeded') DO NOTHING
             RETURNING id",
            &[
                &task.key,
                &task.type_name,
                task.payload,
                &task.priority,
                &status,
                &task.delay_us,
                &task.settings.0,
                &pending_count,
                &reason,
                &cause,
                &task.settings.1,
                &task.settings.2,
                &task.settings.3,
                &task.at_us,
            ],
        )?;
        if let Some(row) = inserted {
            break row;
        }
        // Another transaction took the key since the check: that task is the one.
        let holder = tx.query_opt(
            "SELECT id, type FROM tasq_tasks WHERE key = $1
             AND status IN ('blocked', 'ready', 'running', 'succeeded') FOR SHARE",
            &[&task.key],
        )?;
        if let Some(row) = holder {
            let key = task.key.unwrap_or_default();
            return Ok(key_holder(queue, key, task.type_name, &row));
        }
        rounds += 1;
        if rounds == 100 {
            let error = "the idempotency key changed hands 100 times during one submit";
            return Ok(Err(SubmitErrorKind::Store(error.to_owned())));
        }
    };
    let id: i64 = row.get(0);
    // An edge from every dependency the table still has, ended or not: a dependency that failed
    // before this task came leads to it, to resubmit it with the dependency's dependents.
    let mut edges: Vec<i64> = states.keys().copied().collect();
    edges.sort_unstable();
    if !edges.is_empty() {
        tx.execute(
            "INSERT INTO tasq_deps (dependency, dependent) SELECT unnest($1::BIGINT[]), $2",
            &[&edges, &id],
        )?;
    }
    Ok(Ok((id, false, status)))
}

/// Whether an inserted row (id, duplicate, status) is a new task due now: the pools should
/// claim it.
fn due_now((_, duplicate, status): (i64, bool, &str), delay: Duration) -> bool {
    !duplicate && status == "ready" && delay.is_zero()
}

/// The task that holds `key` (its row: id, type), for a submit of `type_name` with that key:
/// a duplicate of it, or a conflict if it is of another type.
fn key_holder(
    queue: u64,
    key: &str,
    type_name: &str,
    row: &Row,
) -> Result<(i64, bool, &'static str), SubmitErrorKind> {
    let id: i64 = row.get(0);
    let existing_type: String = row.get(1);
    if existing_type != type_name {
        return Err(SubmitErrorKind::KeyConflict {
            key: key.to_owned(),
            existing: TaskId::from_parts(queue, id as u64),
            existing_type: leak_name(existing_type),
        });
    }
    Ok((id, true, ""))
}

/// Inserts a batch in `tx`: the tasks without a key or dependencies in one statement, the
/// others one by one, in order. The first refusal refuses the batch (the caller rolls back).
#[allow(clippy::type_complexity)]
fn insert_batch(
    tx: &mut impl Sql,
    queue: u64,
    inserts: &[Insert<'_>],
    batch: &[Submission<'_>],
) -> Result<Result<Vec<(i64, bool, &'static str)>, (usize, SubmitErrorKind)>, postgres::Error> {
    // Tasks without a key or dependencies go in one statement; the others one by one.
    let is_plain = |i: usize| inserts[i].key.is_none() && batch[i].dependencies.is_empty();
    let plain: Vec<usize> = (0..inserts.len()).filter(|&i| is_plain(i)).collect();
    let mut inserted = vec![(0, false, "ready"); inserts.len()];
    if !plain.is_empty() {
        let types: Vec<&str> = plain.iter().map(|&i| inserts[i].type_name).collect();
        let payloads: Vec<&Value> = plain.iter().map(|&i| inserts[i].payload).collect();
        let priorities: Vec<i16> = plain.iter().map(|&i| inserts[i].priority).collect();
        let delays: Vec<i64> = plain.iter().map(|&i| inserts[i].delay_us).collect();
        let attempts: Vec<i32> = plain.iter().map(|&i| inserts[i].settings.0).collect();
        let bases: Vec<Option<i64>> = plain.iter().map(|&i| inserts[i].settings.1).collect();
        let caps: Vec<Option<i64>> = plain.iter().map(|&i| inserts[i].settings.2).collect();
        let timeouts: Vec<Option<i64>> = plain.iter().map(|&i| inserts[i].settings.3).collect();
        let ats: Vec<Option<i64>> = plain.iter().map(|&i| inserts[i].at_us).collect();
        // ids come from the sequence in the select's order, so sorted ids follow the batch.
        let rows = tx.query(
            "INSERT INTO tasq_tasks (type, payload, priority, status, run_at, max_attempts,
                                     retry_base_us, retry_cap_us, timeout_us)
             SELECT t.type, t.payload, t.priority, 'ready',
                    CASE WHEN t.at IS NULL THEN tasq_now() + interval '1 microsecond' * t.delay
                         ELSE GREATEST(TIMESTAMPTZ 'epoch' + interval '1 microsecond' * t.at,
                                       tasq_now()) END,
                    t.max_attempts, t.base, t.cap, t.timeout
             FROM unnest($1::TEXT[], $2::JSONB[], $3::SMALLINT[], $4::BIGINT[], $5::INT[],
                         $6::BIGINT[], $7::BIGINT[], $8::BIGINT[], $9::BIGINT[])
                  WITH ORDINALITY AS t(type, payload, priority, delay, max_attempts, base, cap,
                                       timeout, at, n)
             ORDER BY t.n
             RETURNING id",
            &[
                &types,
                &payloads,
                &priorities,
                &delays,
                &attempts,
                &bases,
                &caps,
                &timeouts,
                &ats,
            ],
        )?;
        let mut ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        ids.sort_unstable();
        for (&index, id) in plain.iter().zip(ids) {
            inserted[index] = (id, false, "ready");
        }
    }
    // Each task locks its own dependencies in id order (`insert_task`); across the batch the
    // order would be the tasks', which an ending or an ack taking the same rows in id order
    // could meet the other way round. Locked together first, in id order, they are then only
    // locked again.
    let with_dependencies = batch.iter().filter(|t| !t.dependencies.is_empty()).count();
    if with_dependencies > 1 {
        let mut dependencies: Vec<i64> = batch
            .iter()
            .flat_map(|task| task.dependencies)
            .filter_map(|dependency| rows::local_seq(queue, dependency.id()))
            .collect();
        dependencies.sort_unstable();
        tx.query(
            "SELECT id FROM tasq_tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            &[&dependencies],
        )?;
    }
    for index in (0..inserts.len()).filter(|&i| !is_plain(i)) {
        match insert_task(tx, queue, &inserts[index], batch[index].dependencies)? {
            Ok(row) => inserted[index] = row,
            Err(kind) => return Ok(Err((index, kind))),
        }
    }
    Ok(Ok(inserted))
}

/// The database's time, in microseconds since the epoch, when the manual clock `clock` (moved
/// by `offset` so far) was made: the base of `tasq_now()` for the pools on it. Measured once per
/// clock in a process and kept, so that every pool sharing the clock shares one `tasq_now()`
/// exactly (their gates and due times agree to the microsecond).
fn manual_base(
    client: &mut postgres::Client,
    clock: &Clock,
    offset: Duration,
) -> Result<i64, postgres::Error> {
    static BASES: std::sync::Mutex<Vec<(Instant, i64)>> = std::sync::Mutex::new(Vec::new());
    // The real instant the clock was made: its reading less how far it moved (the same for
    // every clone of it).
    let made = clock.now().checked_sub(offset);
    let known = |made: Instant| {
        let bases = BASES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        bases
            .iter()
            .find(|(m, _)| *m == made)
            .map(|&(_, base)| base)
    };
    if let Some(base) = made.and_then(known) {
        return Ok(base);
    }
    let before = Instant::now();
    let now: i64 = client
        .query_one(
            "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT",
            &[],
        )?
        .get(0);
    let after = Instant::now();
    let read_at = before + after.duration_since(before) / 2;
    let Some(made) = made else {
        return Ok(now - rows::micros(offset));
    };
    let mut bases = BASES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Another pool on the clock may have measured it meanwhile: the first measure stands.
    if let Some(&(_, base)) = bases.iter().find(|(m, _)| *m == made) {
        return Ok(base);
    }
    let base = now - rows::micros(read_at.saturating_duration_since(made));
    bases.push((made, base));
    Ok(base)
}

/// A type name read from the database, as the `&'static str` the error types carry: leaked
/// once per distinct name (the names seen are kept and reused), so the memory is bounded by the
/// type names in the database.
fn leak_name(name: String) -> &'static str {
    static SEEN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = seen.iter().find(|n| **n == name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    seen.push(leaked);
    leaked
}

/// This machine's name, for a pool's name in the schema's records (`pid@host`).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map_or_else(|| "?".to_owned(), |name| name.trim().to_owned())
}

/// Notifies the queue's channel, `tasq_channel()` (`tasq_<schema>`, so that queues in other
/// schemas of the same database hear nothing of this one; see `schema.rs`): at most once per
/// transaction. The channel's name fits for every legal schema name and the payload stays under
/// PostgreSQL's limit (`dispatch::MAX_PAYLOAD`), so a notify cannot fail the work it rides on.
fn notify(client: &mut impl Sql, payload: &str) -> Result<(), postgres::Error> {
    client.execute("SELECT pg_notify(tasq_channel(), $1)", &[&payload])?;
    Ok(())
}

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
            Ok(Ok((inserted, completions, due))) => Ok(self.accepted(&inserted, completions, due)),
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
        let store_error = |e: postgres::Error| SubmitErrorKind::Store(conn::describe(&e));
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
        let ending = dispatch::Ending::Succeeded(output, Box::new(()));
        let written = dispatch::write_ending_tx(&mut savepoint, seq, lease, &ending)?;
        Self::restore_callers_now(&mut savepoint, callers_now)?;
        savepoint.commit()?;
        Ok(written.is_some_and(|(state, _)| state == TaskState::Succeeded))
    }

    fn cancel(&self, id: TaskId) -> Result<CancelOutcome, CancelError> {
        let seq = self.seq(id).ok_or(CancelError::UnknownTask(id))?;
        match self.cancel_row(
            "SELECT id, status, has_dependents FROM tasq_tasks WHERE id = $1 FOR UPDATE",
            &seq,
        ) {
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
        match self.cancel_row(
            "SELECT id, status, has_dependents FROM tasq_tasks WHERE key = $1
             AND status IN ('blocked', 'ready', 'running', 'succeeded') FOR UPDATE",
            &key,
        ) {
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
        Some(rows::state_of(row.get(0), row.get(1)))
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
        stats::read(self)
    }

    fn type_stats(&self) -> Vec<TypeStats> {
        stats::read_types(self).unwrap_or_else(|_| stats::empty_types(self))
    }

    /// Unlike [`stats`](Store::stats), says when the database could not be read: an alert must
    /// not clear on a reading of zeros taken while the database is away.
    fn backlog(&self, types: bool) -> Option<(Stats, Vec<TypeStats>)> {
        let stats = stats::read(self).ok()?;
        let types = if types {
            stats::read_types(self).ok()?
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
                    failure: rows::failure_of(row.get(3), row.get(4), row.get(5)),
                    failed_at: rows::instant_in(self.clock.now(), row.get(6)),
                }
            })
            .collect()
    }

    fn purge_dead_letter(&self, id: TaskId) -> bool {
        let Some(seq) = self.seq(id) else {
            return false;
        };
        self.with_conn(|c| {
            c.execute(
                "UPDATE tasq_tasks SET dead = false, payload = NULL WHERE id = $1 AND dead",
                &[&seq],
            )
        })
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

    fn wait_idle(&self, deadline: Option<Instant>) -> Result<(), WaitError> {
        self.poll_until(deadline, |store| {
            if !store.local.lock().settled() {
                return false;
            }
            // Ready tasks that a gate holds until the clock moves (an empty bucket, a breaker
            // cooling down) are not due work, as delayed tasks are not.
            let held = match &store.gates {
                Some(gates) => match gates::held_until_later(store, gates) {
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
        let interrupted: Vec<(TaskId, &'static str)> = local
            .running
            .iter()
            .map(|(seq, held)| (self.id(*seq), self.registry.entry(held.type_index).name))
            .collect();
        for held in local.running.values() {
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
        // those whose cancel was asked for: the totals are read once it has finished.
        self.join_threads();
        self.local.lock().totals
    }

    fn stop_now(&self) {
        let given_back = {
            let mut local = self.local.lock();
            local.closed = true;
            local.stopping = true;
            for held in local.running.values() {
                held.token.fire(Interrupt::Shutdown);
            }
            self.work_cv.notify_all();
            self.fetch_cv.notify_all();
            self.done_cv.notify_all();
            self.take_held(&mut local)
        };
        self.give_back(given_back, Vec::new());
    }

    fn check_invariants(&self) -> Result<(), String> {
        dispatch::check_invariants(self)?;
        match &self.gates {
            Some(gates) => gates::check(self, gates),
            None => Ok(()),
        }
    }

    fn claim(&self, spare: Option<CancelToken>) -> Option<Claim> {
        drop(spare);
        let mut local = self.local.lock();
        loop {
            if local.stopping {
                return None;
            }
            if let Some(mut claim) = local.queue.pop_front() {
                let seq = rows::local_seq(self.queue, claim.id).unwrap_or(0);
                let lost = local
                    .running
                    .get(&seq)
                    .is_none_or(|held| Instant::now() >= held.valid_until);
                if lost {
                    // Its lease may be gone: given back (fenced by the lease, so a row another
                    // worker took since is left alone), never started.
                    local.running.remove(&seq);
                    local.free += 1;
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
        run.count(self.clock.now());
        self.complete(claim, outcome);
        self.claim(None)
    }

    fn worker_panicked(&self, held: Option<TaskId>, message: String) {
        self.count(|t| t.worker_panics += 1);
        let Some(seq) = held.and_then(|id| self.seq(id)) else {
            return;
        };
        let lease = self.local.lock().running.get(&seq).map(|h| h.lease);
        if let Some(lease) = lease {
            let failure = crate::model::state::Failure::new(
                crate::model::state::FailureReason::Panicked,
                0,
                message,
                None,
            );
            let now = self.manual_now_us();
            self.finish(seq, lease, dispatch::Ending::Failed(failure), now);
        }
    }

    fn worker_exited(&self) {
        let mut local = self.local.lock();
        local.live_workers -= 1;
        self.done_cv.notify_all();
    }
}

impl PgStore {
    /// A submission's payload as JSON (its `Serialize` is user code, run inside
    /// `catch_unwind`), and its delay (for a wall-clock time, as far as this process's clock
    /// sees: the row takes the time itself, see [`wall_clock_due`](PgStore::wall_clock_due)).
    fn prepare(&self, task: &Submission<'_>) -> Result<(Value, Duration), SubmitErrorKind> {
        let codec = self.codec(task.type_index);
        let delay = match task.start {
            Start::Now => Duration::ZERO,
            Start::After(delay) => delay,
            Start::At(at) => at.saturating_duration_since(self.clock.now()),
            Start::AtSystem(_) => task
                .start
                .system_delay(std::time::SystemTime::now())
                .unwrap_or_default(),
        };
        // The embedded store's bound: 2^64 ns (about 584 years) from now.
        if delay > Duration::from_nanos(u64::MAX) || self.clock.now().checked_add(delay).is_none() {
            return Err(SubmitErrorKind::TimeOverflow);
        }
        let value = codec
            .encode_payload(task.payload.peek())
            .map_err(SubmitErrorKind::Unserializable)?;
        Ok((value, delay))
    }

    /// Cancels the task that `lookup` finds and locks (`$1` is `param`; it returns the row's
    /// `id, status, has_dependents`), as [`Store::cancel`] does: one not started ends cancelled
    /// with its dependents, a running one has its cancel asked for. `None` if no row matched.
    fn cancel_row(
        &self,
        lookup: &str,
        param: &(dyn postgres::types::ToSql + Sync),
    ) -> Result<Option<(i64, CancelOutcome)>, String> {
        let result = self.with_conn(|client| {
            let mut tx = client.transaction()?;
            let Some(row) = tx.query_opt(lookup, &[param])? else {
                return Ok(None);
            };
            let seq: i64 = row.get(0);
            let status: String = row.get(1);
            let mut done = Vec::new();
            let outcome = match status.as_str() {
                "blocked" | "ready" => {
                    tx.execute(
                        "UPDATE tasq_tasks SET status = 'cancelled', cancel_reason = 'requested',
                         finished_at = tasq_now() WHERE id = $1",
                        &[&seq],
                    )?;
                    dispatch::cascade_ended(&mut tx, seq, "cancelled", row.get(2), &mut done)?;
                    dispatch::notify_changes(&mut tx, false, &done)?;
                    CancelOutcome::Cancelled
                }
                "running" => {
                    tx.execute(
                        "UPDATE tasq_tasks SET cancel_requested = 'requested' WHERE id = $1
                         AND cancel_requested IS NULL",
                        &[&seq],
                    )?;
                    notify(&mut tx, &format!("cancel:{seq}"))?;
                    CancelOutcome::Signalled
                }
                other => CancelOutcome::AlreadyFinished(rows::state_of(other, true)),
            };
            tx.commit()?;
            Ok(Some((seq, outcome, done)))
        })?;
        let Some((seq, outcome, done)) = result else {
            return Ok(None);
        };
        match outcome {
            CancelOutcome::Cancelled => {
                // The task and the dependents it took with it.
                self.count(|t| t.cancelled += done.len() as u64);
                self.publish_ended(&done);
            }
            CancelOutcome::Signalled => self.fire_local(seq),
            CancelOutcome::AlreadyFinished(_) => {}
        }
        Ok(Some((seq, outcome)))
    }

    /// The due time of a task that starts at a wall-clock time, as the row keeps it: that time
    /// itself, in microseconds since the epoch. The database compares it with its own clock,
    /// which every process of the fleet shares, instead of this process's idea of how far
    /// away it is: with the row, `run_at = GREATEST(that time, tasq_now())`, so a time the
    /// database's clock already passed is now, and ready tasks keep their order. `None` for
    /// other starts, and on a manual clock, whose `tasq_now()` is a test's time: the delay, as
    /// far ahead of now as the time is ahead of the wall clock, stands in for it then, as on
    /// the embedded store. A time before the epoch is long past: now.
    fn wall_clock_due(&self, start: Start) -> Option<i64> {
        let Start::AtSystem(at) = start else {
            return None;
        };
        if self.manual_base_us.is_some() {
            return None;
        }
        let since_epoch = at.duration_since(std::time::UNIX_EPOCH).ok()?;
        // `prepare` refused what lies more than 584 years ahead: this fits.
        Some(rows::micros(since_epoch))
    }

    fn insert_parts<'a>(
        &self,
        task: &'a Submission<'_>,
        payload: &'a Value,
        delay: Duration,
    ) -> Insert<'a> {
        Insert {
            type_name: self.registry.entry(task.type_index).name,
            payload,
            priority: i16::from(task.priority),
            delay_us: rows::micros(delay),
            at_us: self.wall_clock_due(task.start),
            settings: rows::settings_columns(&task.settings),
            key: task.key,
        }
    }

    /// What the caller gets for rows a submit inserted (or found by their keys). The payloads
    /// stay in their slots: the caller drops them, outside any lock.
    fn accepted(
        &self,
        inserted: &[(i64, bool, &'static str)],
        completions: Vec<Arc<Completion>>,
        due: bool,
    ) -> Vec<Submitted> {
        let added = inserted
            .iter()
            .filter(|(_, duplicate, _)| !duplicate)
            .count();
        if added > 0 {
            self.count(|t| t.submitted += added as u64);
        }
        let cancelled = inserted
            .iter()
            .filter(|&&(_, duplicate, status)| !duplicate && status == "cancelled")
            .count();
        if cancelled > 0 {
            self.count(|t| t.cancelled += cancelled as u64);
        }
        if due {
            self.wake_fetcher();
        }
        // Cancelled at once by a failed or cancelled dependency, or a duplicate of a task that
        // may have ended: the rows say.
        let settled: Vec<i64> = inserted
            .iter()
            .filter(|&&(_, duplicate, status)| duplicate || status == "cancelled")
            .map(|&(seq, _, _)| seq)
            .collect();
        self.publish_ended(&settled);
        inserted
            .iter()
            .zip(completions)
            .map(|(&(seq, duplicate, _), completion)| Submitted {
                id: self.id(seq),
                completion: Some(completion),
                duplicate,
            })
            .collect()
    }

    /// The completion that the handles to task `seq` in this process share, registered so that
    /// the task's ending reaches it (the worker's own publish, a notification, or the poll).
    fn completion_for(&self, seq: i64) -> Arc<Completion> {
        let mut waiters = self.waiters.lock();
        if let Some(live) = waiters.get(&seq).and_then(Weak::upgrade) {
            return live;
        }
        let completion = Completion::new();
        waiters.insert(seq, Arc::downgrade(&completion));
        completion
    }

    fn completions_for(&self, rows: &[(i64, bool, &'static str)]) -> Vec<Arc<Completion>> {
        rows.iter()
            .map(|&(seq, _, _)| self.completion_for(seq))
            .collect()
    }

    /// Blocks until `done` holds, polling; `None` deadline waits as long as it takes.
    fn poll_until(
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

    /// Publishes a row that became terminal to local waiters (nothing if it is not terminal).
    fn publish_seq(&self, seq: i64) {
        self.publish_ended(&[seq]);
    }

    /// Publishes the rows among `seqs` that ended to the handles of this process waiting for
    /// them, in one query.
    fn publish_ended(&self, seqs: &[i64]) {
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

    /// Takes the claims waiting for a worker, to give them back: never started, so nothing
    /// runs for them here any more (and shutdown waits only for what runs).
    fn take_held(&self, local: &mut Local) -> Vec<Claim> {
        let held: Vec<Claim> = local.queue.drain(..).collect();
        local.free += held.len();
        for claim in &held {
            if let Some(seq) = rows::local_seq(self.queue, claim.id) {
                local.running.remove(&seq);
            }
        }
        held
    }

    /// Gives back the leases of claims that never started, and the `more` leases of rows this
    /// pool claimed but made no claim of: their rows go back to `ready`, the attempt not
    /// counted. Their payloads are dropped here, outside the lock.
    fn give_back(&self, claims: Vec<Claim>, more: Vec<i64>) {
        let mut leases = more;
        leases.extend(claims.iter().filter_map(|c| c.lease));
        self.give_back_leases(&leases);
        for claim in claims {
            unwind::drop_quietly(claim.payload);
        }
    }

    /// Returns the rows of never-started claims to `ready` (the attempt not counted), and
    /// tells the other pools. A row whose cancel was asked for while it was held ends
    /// cancelled instead, with its dependents, as the reaper ends it.
    fn give_back_leases(&self, leases: &[i64]) {
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
                dispatch::cascade_ended(&mut tx, row.get(0), "cancelled", row.get(2), &mut done)?;
            }
            dispatch::notify_changes(&mut tx, true, &done)?;
            tx.commit()?;
            Ok(done.len())
        });
        if let Ok(cancelled) = cancelled {
            self.count(|t| t.cancelled += cancelled as u64);
        }
    }

    /// Resubmits dead letter `id` (and, with `dependents`, the dependents its failure
    /// cancelled) as new rows, in one transaction.
    fn revive(
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
            let revived = match dispatch::revive(&mut tx, queue, seq, type_name, dependents)? {
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
                let dispatch::Revival {
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

    /// Whether a handle in this process still waits for a task that has not ended.
    fn has_waiters(&self) -> bool {
        let mut waiters = self.waiters.lock();
        waiters.retain(|_, w| w.strong_count() > 0);
        !waiters.is_empty()
    }

    fn join_threads(&self) {
        let threads = std::mem::take(&mut *self.threads.lock());
        let me = crate::sync::current_thread_id();
        for thread in threads {
            if crate::sync::thread_id(&thread) != me {
                let _ = thread.join();
            }
        }
    }
}

impl crate::model::clock::Wake for PgStore {
    /// A manual clock moved: tasks may have come due, and a shutdown's deadline may have
    /// passed.
    fn wake(&self) {
        let mut local = self.local.lock();
        local.wake = true;
        self.fetch_cv.notify_one();
        self.done_cv.notify_all();
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("queue", &self.queue)
            .field("registry", &self.registry)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// Whether the queue runs nothing and holds nothing due but the types `$1`, which gates hold
/// back (`wait_idle`'s poll): each priority's due range read until a task of another type.
pub(super) const IDLE: &str = concat!(
    ready_priorities!(),
    "SELECT NOT EXISTS (SELECT 1 FROM tasq_tasks WHERE status = 'running')
        AND NOT EXISTS (
            SELECT 1 FROM prio, LATERAL (
                SELECT 1 FROM tasq_tasks t
                WHERE t.status = 'ready' AND t.priority = prio.p AND t.run_at <= tasq_now()
                  AND t.type <> ALL($1)
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
