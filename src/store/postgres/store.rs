//! The durable store's shared part: [`PgStore`], what its threads share (the connection pool,
//! the claims held for local workers, the local handles' completions), and how it takes a
//! connection (retrying through an outage, giving up after a patience).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use super::conn::Sql;
use crate::model::cancel::CancelToken;
use crate::model::clock::Clock;
use crate::model::completion::Completion;
use crate::model::id::TaskId;
use crate::observe::events::Events;
use crate::observe::stats::Totals;
use crate::store::registry::Registry;
use crate::store::{Claim, StoreHub};
use crate::sync::{Arc, Condvar, Mutex, Weak};
use crate::unwind;

type Db = r2d2::Pool<super::conn::Connector>;

/// How long the store waits for the database before an operation fails (see `error.rs`).
const PATIENCE: Duration = Duration::from_secs(60);

/// How long a reading of the queue's figures (`Pool::try_stats`, the alerts' and metrics'
/// samples) waits for the database before it says the store is away.
pub(super) const READING_PATIENCE: Duration = Duration::from_secs(5);

/// A claimed task's lease as its pool holds it.
pub(super) struct Held {
    pub(super) lease: i64,
    pub(super) token: CancelToken,
    pub(super) type_index: u32,
    /// The attempt the claim starts (for the lifecycle's events).
    pub(super) attempt: u32,
    /// The lane of workers it was claimed for (see [`Lane`]).
    pub(super) lane: usize,
    /// Until when the lease surely holds, on this process's monotonic clock: the lease's length
    /// from when the statement that took or last extended it was *sent* (the database set the
    /// expiry later than that, never earlier). A claim still waiting for a worker past this is
    /// never started: its lease may be lost (the process stalled, a SIGSTOP), and another
    /// worker may already run the task.
    pub(super) valid_until: Instant,
    /// When a worker took it, on this process's monotonic clock (the lane's pace times its
    /// turns: `pace.rs`).
    pub(super) started_at: Option<Instant>,
    /// Its handler succeeded, and its worker handed the ack to the completer (`completer.rs`): it
    /// runs no more, and holds no slot.
    pub(super) acking: bool,
}

/// A lane of the pool's workers (`Builder::queue`, `api/queues.rs`) as the fetcher and the
/// workers count it: a pool without lanes has one, of every worker and every queue.
///
/// Its claims held here are those `waiting` in `Local::queue` and the `started` ones; it may
/// hold `capacity()` (its workers plus its prefetch), and `free()` is what it may claim more.
/// The fetcher claims for a lane only its queues' rows, at most `free()`; a worker starts a
/// lane's claim only while `started < workers`. So no lane runs more tasks than its workers,
/// and the pool's threads (the sum of the lanes' workers) always have a free one for a lane
/// below its count: a lane's tasks never wait for another lane's.
pub(super) struct Lane {
    /// Claims a worker took, whose run has not ended here.
    pub(super) started: usize,
    /// Its claims waiting in `Local::queue` for a worker.
    pub(super) waiting: usize,
    /// At most this many of its claims run at once.
    pub(super) workers: usize,
    /// How many claims it may hold beyond its workers now: fixed (`Builder::prefetch`), or
    /// set by its [`Pace`](super::pace::Pace) after each claim.
    pub(super) prefetch: usize,
    /// How the prefetch follows the backlog and the lane's speed; `None` when it is fixed.
    pub(super) pace: Option<super::pace::Pace>,
    /// Whether the limited queues go first at its next claim that has any to claim from: its
    /// last one's other rows left them no room (the turns of `queue_limits.rs`).
    pub(super) limited_first: bool,
}

impl Lane {
    /// A lane of `workers` workers, with `prefetch` claims more (`None`: as many as its pace
    /// says, starting from none).
    pub(super) fn new(workers: usize, prefetch: Option<usize>) -> Lane {
        Lane {
            started: 0,
            waiting: 0,
            workers,
            prefetch: prefetch.unwrap_or(0),
            pace: prefetch.is_none().then(|| super::pace::Pace::new(workers)),
            limited_first: false,
        }
    }

    /// How many claims it may hold: its workers plus its prefetch (none for a lane without
    /// workers: it claims nothing, prefetch or not).
    pub(super) fn capacity(&self) -> usize {
        if self.workers == 0 {
            0
        } else {
            self.workers + self.prefetch
        }
    }

    /// How many more it may claim now (none while a lowered prefetch still leaves it holding
    /// more than its capacity).
    pub(super) fn free(&self) -> usize {
        self.capacity().saturating_sub(self.started + self.waiting)
    }

    /// Whether the fetcher should claim for it (when woken): a slot is free and, with
    /// prefetch, a batch's worth of slots is, or its workers have nothing left to take.
    fn wants_claim(&self) -> bool {
        let free = self.free();
        free > 0 && (free >= self.prefetch || self.waiting == 0)
    }
}

/// The pool-local state: claims waiting for a worker, the tasks running here, the workers.
pub(super) struct Local {
    /// Claimed, leased, not started yet (given back at shutdown), with their lane.
    pub(super) queue: VecDeque<(usize, Claim)>,
    pub(super) running: HashMap<i64, Held>,
    /// The lanes of workers, by index (one for a pool without lanes).
    pub(super) lanes: Vec<Lane>,
    /// The limited queues, as last read (`queue_limits.rs`), and when.
    pub(super) limited: Vec<String>,
    pub(super) limited_read: Option<Instant>,
    /// How many limits this pool has set: a reading of the limited queues under way when one
    /// was set is not kept (see [`PgStore::refresh_limited`]).
    pub(super) limits_set: u64,
    /// Limited queues whose last claim came back short (at their limit, or nothing ready),
    /// not claimed from again until the instant, new work, or a run of theirs ends here.
    pub(super) limited_idle: Vec<(String, Instant)>,
    /// How many times new work was announced here (each clears `limited_idle`): a claim that
    /// began before an announcement marks no queue idle (see [`PgStore::limited_idle`]).
    pub(super) announced: u64,
    /// The fetcher should claim now (a notification, a local submit, a finished task).
    pub(super) wake: bool,
    /// Closed to new tasks: the fetcher stops claiming.
    pub(super) closed: bool,
    /// Workers exit once their handler returns.
    pub(super) stopping: bool,
    pub(super) live_workers: usize,
    pub(super) handlers_in_shutdown: usize,
    pub(super) totals: Totals,
    /// A gate held tasks back in the last claim and may reopen by itself then (a token, a
    /// cool-down's end): the fetcher claims again at this real instant.
    pub(super) gate_wake: Option<Instant>,
    /// User values the completer left for a worker to drop (see `completer.rs`).
    pub(super) litter: Vec<super::acks::Litter>,
}

impl Local {
    /// Nothing claimed by this pool is waiting or running: a claim leaves `running` only after
    /// its ending is written and published to this process's handles (see `finish`), so a
    /// wait that sees the database settled and this settled returns after every local
    /// handle of the tasks this pool ran has its outcome.
    pub(super) fn settled(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty()
    }

    /// New work was announced here (a local submit, a notification, a run's end): every idle
    /// limited queue is tried again, and a limited claim already under way marks none idle
    /// (see [`PgStore::limited_idle`]).
    pub(super) fn announce(&mut self) {
        self.limited_idle.clear();
        self.announced += 1;
    }

    /// Whether the fetcher should claim for some lane (see [`Lane::wants_claim`]).
    pub(super) fn wants_claim(&self) -> bool {
        self.lanes.iter().any(Lane::wants_claim)
    }

    /// How many the fetcher should claim now, for each lane that wants a claim.
    pub(super) fn wanted(&self) -> Vec<(usize, usize)> {
        let lanes = self.lanes.iter().enumerate();
        lanes
            .filter(|(_, lane)| lane.wants_claim())
            .map(|(index, lane)| (index, lane.free()))
            .collect()
    }

    /// Takes the first waiting claim whose lane has a worker free, counting it started; with
    /// its lane.
    pub(super) fn start_next(&mut self) -> Option<(usize, Claim)> {
        let lanes = &self.lanes;
        let at = self
            .queue
            .iter()
            .position(|(lane, _)| lanes[*lane].started < lanes[*lane].workers)?;
        let (lane, claim) = self.queue.remove(at)?;
        self.lanes[lane].waiting -= 1;
        self.lanes[lane].started += 1;
        Some((lane, claim))
    }

    /// Checks each lane's counts (see [`Lane`]): its `waiting` claims are those in `queue`,
    /// and it runs no more than its workers (a claim whose payload does not decode counts as
    /// started until the fetcher has ended it: check between claims).
    pub(super) fn check_lanes(&self) -> Result<(), String> {
        for (index, lane) in self.lanes.iter().enumerate() {
            let waiting = self.queue.iter().filter(|(l, _)| *l == index).count();
            if lane.waiting != waiting {
                return Err(format!(
                    "lane {index} counts {} claims waiting, and {waiting} are",
                    lane.waiting
                ));
            }
            if lane.started > lane.workers {
                return Err(format!(
                    "lane {index} runs {} claims on {} workers",
                    lane.started, lane.workers
                ));
            }
        }
        Ok(())
    }

    /// A claim of `lane` that a worker took never ran (it was lost): its slot is free.
    pub(super) fn unstart(&mut self, lane: usize) {
        self.lanes[lane].started -= 1;
    }

    /// A run of `lane` ended here: its worker and its slot are free.
    pub(super) fn run_ended(&mut self, lane: usize) {
        self.unstart(lane);
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
                f.write_str(&super::conn::describe(error))
            }
        }
    }
}

/// The durable store of one pool.
pub(crate) struct PgStore {
    pub(super) queue: u64,
    pub(super) registry: Registry,
    pub(super) db: Db,
    /// Where its connections go (the listener's too).
    pub(super) target: super::conn::Target,
    pub(super) lease: Duration,
    pub(super) poll_interval: Duration,
    /// With a manual clock: the database's time when that clock was made, in microseconds since
    /// the epoch; `tasq_now()` is that plus how far the clock moved.
    pub(super) manual_base_us: Option<i64>,
    /// The names of the types this pool runs (it claims no other).
    pub(super) types: Vec<String>,
    /// This pool's name in the schema's records: `pid@host`.
    pub(super) holder: String,
    /// The queues of each lane of workers (`Local::lanes`), if the pool has lanes; empty if
    /// its workers serve every queue.
    pub(super) lane_queues: Vec<Vec<String>>,
    pub(super) local: Mutex<Local>,
    /// Workers wait here for claims.
    pub(super) work_cv: Condvar,
    /// The fetcher waits here for free slots and wake-ups.
    pub(super) fetch_cv: Condvar,
    /// `shutdown` waits here for running handlers and exiting workers.
    pub(super) done_cv: Condvar,
    /// Handles waiting in this process, by row id.
    pub(super) waiters: Mutex<HashMap<i64, Weak<Completion>>>,
    /// What the pool's handles share (they always hold their completion here).
    pub(super) hub: Arc<StoreHub>,
    /// Successes waiting to be written together.
    pub(super) acks: super::acks::Acks,
    pub(super) clock: Clock,
    pub(super) threads: Mutex<Vec<crate::sync::JoinHandle>>,
    /// Where dead letters and breaker changes are reported.
    pub(super) events: Events,
    /// The limits and breakers of the pool's types; `None`: it claims with the plain statement.
    pub(super) gates: Option<super::gates::Gates>,
    /// When the next aging update is due, and whether one is in flight (see `super::gating::age_if_due`).
    pub(super) aging: Mutex<super::gates::AgingTurn>,
    /// The fetcher waits here for an aging update in flight in the maintenance thread.
    pub(super) aging_cv: Condvar,
}

/// A type name read from the database, as the `&'static str` the error types carry: leaked
/// once per distinct name (the names seen are kept and reused), so the memory is bounded by the
/// type names in the database.
pub(super) fn leak_name(name: String) -> &'static str {
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
pub(super) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map_or_else(|| "?".to_owned(), |name| name.trim().to_owned())
}

impl super::conn::Connections for PgStore {
    fn with_conn<R>(
        &self,
        f: impl FnMut(&mut super::conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        PgStore::with_conn(self, f)
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

impl PgStore {
    pub(super) fn id(&self, seq: i64) -> TaskId {
        TaskId::from_parts(self.queue, seq as u64)
    }

    pub(super) fn seq(&self, id: TaskId) -> Option<i64> {
        super::rows::local_seq(self.queue, id)
    }

    /// A connection from the pool that answers, retried with backoff while the database is
    /// unreachable (until `give_up`, a minute for most callers: past that the caller's
    /// operation fails). A connection idle
    /// for a while is checked first (see `super::conn::IDLE_CHECK`): one whose server process went
    /// away (an outage, a restart) is dropped and another taken, so no statement is sent on it.
    ///
    /// `check`: check it whether idle or not.
    fn conn(
        &self,
        check: bool,
        give_up: Instant,
    ) -> Result<r2d2::PooledConnection<super::conn::Connector>, String> {
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
                        super::conn::describe(&error)
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
    pub(super) fn with_conn<R>(
        &self,
        f: impl FnMut(&mut super::conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        self.with_conn_at(None, f)
    }

    /// As [`with_conn`](PgStore::with_conn), waiting for a connection `patience` at most
    /// instead of a minute: for a reading whose caller would rather hear the store is away.
    pub(super) fn with_conn_within<R>(
        &self,
        patience: Duration,
        f: impl FnMut(&mut super::conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        self.with_conn_for(None, Instant::now() + patience, f)
    }

    /// As [`with_conn`](PgStore::with_conn), with `tasq_now()` at `at`, a time read earlier
    /// from a manual clock by [`manual_now_us`](PgStore::manual_now_us) (`None`: the clock's
    /// time as each attempt starts). For writes whose times belong to an earlier moment than
    /// their statement's: a run's ending is stamped with the time the run ended.
    pub(super) fn with_conn_at<R>(
        &self,
        at: Option<i64>,
        f: impl FnMut(&mut super::conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, String> {
        self.with_conn_for(at, Instant::now() + PATIENCE, f)
    }

    /// The body of the `with_conn` family: connections are waited for until `give_up`.
    fn with_conn_for<R>(
        &self,
        at: Option<i64>,
        give_up: Instant,
        mut f: impl FnMut(&mut super::conn::Conn) -> Result<R, postgres::Error>,
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
        f: &mut impl FnMut(&mut super::conn::Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, StoreFailure> {
        let mut conn = self.conn(check, give_up).map_err(StoreFailure::Connect)?;
        // A manual clock sets `tasq_now()` on this connection (a test's pool only), after the
        // checkout: the setting a connection kept from its last use is stale.
        if let Some(now) = at.or_else(|| self.manual_now_us()) {
            let set = format!("SET tasq.manual_now_us = '{now}'");
            // A setting commits nothing: lost here, the work can run on another connection.
            conn.client().batch_execute(&set).map_err(|error| {
                if super::conn::is_lost(&error) {
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

    /// The codec of registered type `type_index` (every type of a durable pool has one: the
    /// build refuses others).
    pub(super) fn codec(&self, type_index: u32) -> crate::model::codec::Codec {
        self.registry
            .entry(type_index)
            .codec
            .expect("durable types have codecs")
    }

    /// The type index of a row's type name, if this pool registered it.
    pub(super) fn type_index(&self, name: &str) -> Option<u32> {
        self.registry.index_of(name)
    }

    /// A row's type name as a `&'static str`: the registered name, or (a type another pool
    /// runs) a leaked copy.
    pub(super) fn type_name(&self, name: &str) -> &'static str {
        match self.type_index(name) {
            Some(index) => self.registry.entry(index).name,
            None => leak_name(name.to_owned()),
        }
    }

    /// Wakes the fetcher (a task became ready here, or a slot freed).
    pub(super) fn wake_fetcher(&self) {
        let mut local = self.local.lock();
        local.wake = true;
        local.announce();
        self.fetch_cv.notify_one();
    }

    /// This pool's name in the schema's records (`pid@host`).
    pub(super) fn holder(&self) -> &str {
        &self.holder
    }

    /// The queues lane `lane` claims from; `None` for every queue (a pool without lanes).
    pub(super) fn lane_queues(&self, lane: usize) -> Option<&Vec<String>> {
        self.lane_queues.get(lane)
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut Totals)) {
        f(&mut self.local.lock().totals);
    }

    /// Takes the claims waiting for a worker, to give them back: never started, so nothing
    /// runs for them here any more (and shutdown waits only for what runs).
    pub(super) fn take_held(&self, local: &mut Local) -> Vec<Claim> {
        let mut held = Vec::with_capacity(local.queue.len());
        while let Some((lane, claim)) = local.queue.pop_front() {
            local.lanes[lane].waiting -= 1;
            held.push(claim);
        }
        for claim in &held {
            if let Some(seq) = super::rows::local_seq(self.queue, claim.id) {
                local.running.remove(&seq);
            }
        }
        held
    }

    /// Gives back the leases of claims that never started, and the `more` leases of rows this
    /// pool claimed but made no claim of: their rows go back to `ready`, the attempt not
    /// counted. Their payloads are dropped here, outside the lock.
    pub(super) fn give_back(&self, claims: Vec<Claim>, more: Vec<i64>) {
        let mut leases = more;
        leases.extend(claims.iter().filter_map(|c| c.lease));
        self.give_back_leases(&leases);
        for claim in claims {
            unwind::drop_quietly(claim.payload);
        }
    }

    /// Whether a handle in this process still waits for a task that has not ended.
    pub(super) fn has_waiters(&self) -> bool {
        let mut waiters = self.waiters.lock();
        waiters.retain(|_, w| w.strong_count() > 0);
        !waiters.is_empty()
    }

    pub(super) fn join_threads(&self) {
        let threads = std::mem::take(&mut *self.threads.lock());
        let me = crate::sync::current_thread_id();
        for thread in threads {
            if crate::sync::thread_id(&thread) != me {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Local {
    /// What the completer left and no worker took (a pool dropped without a shutdown): each
    /// value dropped on its own (see `acks::drop_litter`).
    fn drop(&mut self) {
        super::acks::drop_litter(std::mem::take(&mut self.litter));
    }
}
