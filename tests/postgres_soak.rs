//! Soak of the durable store: a long randomized run on PostgreSQL that mixes every feature at
//! once, then checks the run's invariants (the durable counterpart of `tests/soak.rs`).
//!
//! Two worker pools share one schema, as two processes would (pool A prefetches a fixed number,
//! pool B claims ahead as its pace says, the default), and a producer
//! pool without workers, which declares the types (no handlers), submits tasks of seven types.
//! Pool B registers the plain types with other attempts and retry policy than the producer
//! declares, as a process built at another time might: every task follows its own row. Three are plain (three, five and one
//! attempts; retries after a millisecond or so); four carry the mitigations, which the pools
//! share through the rows. REMOTE and RATED call a downstream whose circuit breaker opens after
//! three failures in a row and probes again after a short cool-down; an outage thread takes the
//! downstream out and brings it back at random, and their handlers fail retryably while it is
//! out. RATED also has a rate limit, LIMITED a concurrency limit, and TIMED a timeout that some
//! of its handlers overrun, sleeping on their token (then returning `Ok` or an error when it
//! fires) or ignoring it for a while (some long enough to be reported stuck). Every pool ages
//! its ready tasks, with the same settings, and records every event its hook hears. Each
//! payload says what its handler does: succeed, fail retryably k times then succeed, exhaust its
//! attempts, fail permanently, fail permanently only on the payload's first run ever (so a
//! resubmit succeeds), panic, sleep on its token (interrupted by a cancel or a shutdown
//! deadline, it fails retryably), or overrun (TIMED). Tasks go in alone or in batches, with
//! random priorities, some delays, idempotency keys from a small set shared by the types
//! (duplicates and key conflicts happen; the producer looks keys up with `find_key`), one plain
//! task in eight with attempts of its own (`Task::max_attempts`), and dependencies on 1–3 recent
//! tasks. A canceller thread cancels a share of them (through a pool, the handle, or
//! `cancel_key`) at random moments after their submit, so cancels meet blocked, delayed, ready,
//! held and running tasks. Now and then the producer lists the dead letters (all, by type, a
//! page), reads some payloads (`dead_letter_payload`) and resubmits some (with or without the
//! dependents their failure cancelled; now and then with the wrong type), takes or purges
//! others. A sampler pages through the tasks of each state and type (`Pool::tasks`). Late in the run pool A shuts down with a short random deadline (once one of its
//! handlers sleeps) while pool B carries on; the run ends when every handle has its outcome.
//!
//! Checked at the end (all violations are collected, then reported with the seed): every handle
//! returns, and all handles of one id (deduplicated submits, another pool's `handle`) agree; a
//! duplicate is a task that held its key; each outcome fits what its handler was told to do, the
//! cancels accepted and the dependencies' outcomes, or (the types with mitigations, whose runs
//! outages and timeouts add to) what its runs returned; a task's runs are attempts 1, 2, … in
//! turn, no more than its type allows, under increasing leases never used twice, none after a
//! run that ended it; a dependent never started before all its dependencies had succeeded, nor
//! ran if one did not; no task started after a cancel said `Cancelled`; no token fired while its
//! handler ran but on a cancel, the shutdown deadline or (TIMED) the timeout; pool A ran nothing
//! after its shutdown; the rows agree (none left unfinished; attempts; dead letters;
//! resubmissions; aging kept each task's own priority, and never lowered one nor lifted it past
//! the ceiling); a task's runs never exceed its own attempts, as its row keeps them, whichever
//! pool ran it; `find_key` names a key's holder (the task, or none once it ended failed or
//! cancelled); a dead letter's payload is its task's; a page of tasks is in id order after the
//! last and lists only its state and type; the worker start and exit hooks ran once per worker
//! of A and B; every pool's `check_invariants` holds; `stats().workers` stayed at the
//! configured count while a pool ran, with no worker panic and no store error; the three pools'
//! totals add up to the outcomes seen. And the mitigations ([`check_mitigations`]): LIMITED's
//! handlers never ran more than its limit at once across both pools; RATED's claims never
//! exceeded its burst plus its rate over any stretch of time, nor did its starts on pool B, and
//! no run started before its claim; every dead letter was reported by exactly one hook, once,
//! by the pool that ended it, as its outcome says; a run that timed out never counted as a
//! success, the last one made its task a `TimedOut` dead letter, and every `Stuck` report names
//! a run past its timeout and grace; the breaker's changes, in the order the database made them,
//! follow its state machine, each probe after the cool-down, and the hooks heard each change
//! once; aging raised priorities; no alert was raised (none is set).
//!
//! The database's side of the gates (the order of the breaker's changes, the claims the bucket
//! let through) is logged by triggers the test adds to its schema ([`install_logs`]).
//!
//! `TASQ_PG_SOAK_TASKS` sets the number of tasks (default [`DEFAULT_TASKS`]); `TASQ_PG_SOAK_SEED`
//! replays a run's choices (the seed is printed, and named in a failure; what the pools make of
//! the choices still depends on timing); `TASQ_PG_SOAK_WATCHDOG_SECS` (default 300) bounds it.
#![cfg(feature = "postgres")]

mod support_pg;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde::{Deserialize, Serialize};
use support_pg::TestDb;
use tasq::{
    Aging, Breaker, BreakerState, CancelOutcome, CancelReason, CancelToken, Context, Event,
    Failure, FailureReason, HandlerError, Outcome, PauseTarget, Pool, RateLimit, ResubmitError,
    RetryPolicy, ShutdownReport, SubmitErrorKind, TaskHandle, TaskId, TaskState, TaskType, Totals,
    TypeOptions,
};

/// About 25 s on two idle cores in a debug build; about 45 s beside another such run.
const DEFAULT_TASKS: u64 = 10_000;
/// Every panic the handlers cause on purpose starts with this; the panic hook keeps them quiet.
const MARKER: &str = "[pg soak: expected panic]";
const WORKERS_A: usize = 3;
const PREFETCH_A: usize = 4;
const WORKERS_B: usize = 3;
/// Long enough that no lease expires on a loaded machine: the reaper never runs a task twice.
const LEASE: Duration = Duration::from_secs(10);
/// How long the end waits for a handle while no other returns either, before calling it hung.
const HANDLE_STALL: Duration = Duration::from_secs(20);
/// The producer waits (on the oldest handle) while more tasks than this are unfinished.
const BACKLOG: usize = 300;

/// The downstream REMOTE and RATED call, and its breaker: a few failures in a row open it, and
/// the cool-down is short, so that it opens, probes and closes many times in a run.
/// The periodic task every pool runs (the three of them tick one schedule): a slot every
/// [`TICK_EVERY`], every missed one caught up.
const TICK: TaskType<u64, ()> = TaskType::new("pg-soak-tick");
const TICK_EVERY: Duration = Duration::from_millis(20);

const DOWNSTREAM: &str = "pg-soak-downstream";
const BREAKER: Breaker = Breaker::new(3, Duration::from_millis(80));
/// LIMITED's concurrency limit, across both pools.
const LIMIT: u32 = 3;
/// The fleet's limit on queue `slow` (`Pool::set_queue_limit`), set as the run starts. Pool A
/// also serves the queue with a worker of its own (`Builder::queue`); pool B registers its
/// types in the default queue and must still obey the limit (the rows keep `slow`).
const SLOW_LIMIT: u32 = 2;
/// RATED's rate: tight enough that its batches (up to six tasks) and its retries meet it.
const RATE: RateLimit = RateLimit::per_second(60.0).with_burst(4);
/// How far RATED's starts on pool B may exceed the rate: they lag their claims, which the bucket
/// meters, by the rest of the claim's transaction and the hand-off to a worker, and that lag
/// varies; one start is 17 ms of it.
const START_TOLERANCE: f64 = 1.0;
/// How far apart two readings of the system clock at one moment may be (seconds): the
/// handler's `SystemTime` and the database's `clock_timestamp()`.
const CLOCK_READING: f64 = 0.002;
/// TIMED's timeout; its quick handlers take well under a millisecond.
const TIMEOUT: Duration = Duration::from_millis(20);
/// Past its timeout, a handler still running this long is reported stuck.
const STUCK_AFTER: Duration = Duration::from_millis(10);
/// Every pool ages its ready tasks by one level per `every`, up to 9 (the highest priority used):
/// a task waiting in the backlog (about a second) gains a few levels.
const AGING: Aging = Aging::new(Duration::from_millis(200), 9);
/// How long the outage thread keeps the downstream up, then down (random, in ms).
const UP_MS: (u64, u64) = (150, 900);
const DOWN_MS: (u64, u64) = (40, 400);

// ===== the tasks =====

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Ty {
    Fast,
    Patient,
    Once,
    /// Calls the downstream: fails while it is out; held while its breaker is open.
    Remote,
    /// At most [`LIMIT`] run at once, in both pools together.
    Limited,
    /// Starts at [`RATE`] at most, and calls the downstream.
    Rated,
    /// Times out after [`TIMEOUT`].
    Timed,
}

impl Ty {
    const ALL: [Ty; 7] = [
        Ty::Fast,
        Ty::Patient,
        Ty::Once,
        Ty::Remote,
        Ty::Limited,
        Ty::Rated,
        Ty::Timed,
    ];
    /// How often each type is picked, in percent.
    const SHARE: [u64; 7] = [25, 21, 15, 11, 10, 9, 9];

    fn task_type(self) -> TaskType<Job, u64> {
        TaskType::new(
            [
                "pg-soak-fast",
                "pg-soak-patient",
                "pg-soak-once",
                "pg-soak-remote",
                "pg-soak-limited",
                "pg-soak-rated",
                "pg-soak-timed",
            ][self as usize],
        )
    }

    fn max_attempts(self) -> u32 {
        [3, 5, 1, 5, 3, 4, 3][self as usize]
    }

    /// Whether its handler calls the downstream (and fails while it is out).
    fn calls_downstream(self) -> bool {
        matches!(self, Ty::Remote | Ty::Rated)
    }

    /// The others take the pool's policy (base 1 ms); PATIENT retries faster still.
    /// Its queue as the producer (and pool A) declare it: `slow` for the patient and once-only
    /// types. Pool B registers every type in the default queue, as an older version would: the
    /// rows keep the producer's, and pauses of `slow` must hold them on B too.
    fn queue(self) -> &'static str {
        match self {
            Ty::Patient | Ty::Once => "slow",
            _ => tasq::DEFAULT_QUEUE,
        }
    }

    fn options(self) -> TypeOptions {
        let options = TypeOptions::new()
            .max_attempts(self.max_attempts())
            .queue(self.queue());
        let fast = RetryPolicy::exponential(Duration::from_micros(500), Duration::from_millis(4));
        match self {
            Ty::Patient => options.retry_policy(fast),
            Ty::Remote => options.downstream(DOWNSTREAM),
            Ty::Limited => options.concurrency_limit(LIMIT),
            Ty::Rated => options.rate_limit(RATE).downstream(DOWNSTREAM),
            Ty::Timed => options.timeout(TIMEOUT),
            Ty::Fast | Ty::Once => options,
        }
    }

    /// Its options as pool B registers it: the plain types with other attempts and another
    /// retry policy than the producer declares, as a process built at another time might. The
    /// tasks' rows keep the producer's, and B must obey them.
    fn options_on_b(self) -> TypeOptions {
        let slow = RetryPolicy::exponential(Duration::from_millis(2), Duration::from_millis(10));
        match self {
            Ty::Fast | Ty::Patient | Ty::Once => TypeOptions::new()
                .max_attempts(self.max_attempts() + 4)
                .retry_policy(slow),
            _ => self.options().queue(tasq::DEFAULT_QUEUE),
        }
    }

    /// A type with a mitigation: a breaker, a limit or a timeout.
    fn mitigated(self) -> bool {
        matches!(self, Ty::Remote | Ty::Limited | Ty::Rated | Ty::Timed)
    }

    fn pick(rng: &mut Rng) -> Ty {
        let mut roll = rng.below(Ty::SHARE.iter().sum());
        for (ty, share) in Ty::ALL.into_iter().zip(Ty::SHARE) {
            match roll.checked_sub(share) {
                Some(rest) => roll = rest,
                None => return ty,
            }
        }
        unreachable!("the shares add up to the roll's range")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Kind {
    Succeed,
    /// Fails retryably on attempts 1..=k (k below the type's limit), then succeeds.
    Transient(u32),
    Exhaust,
    Permanent,
    /// Fails permanently on the first run of its payload ever; succeeds on any later run.
    PermanentOnce,
    Panic,
    /// Sleeps this many ms on its token, then succeeds; interrupted, it fails retryably.
    Sleep(u32),
    /// (TIMED) Sleeps on its token far past the timeout, on attempts 1..=k (all of them if
    /// `k` is at the type's limit), and succeeds at once on the others. When the token fires it
    /// returns `Ok` if `ok`, else a retryable error: the timeout makes both a failure.
    Overrun {
        until: u32,
        ok: bool,
    },
    /// (TIMED) Ignores its token: blocks this many ms past the timeout, then returns `Ok`.
    Ignore(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Job {
    seq: u64,
    ty: Ty,
    kind: Kind,
    /// Attempts of its own (`Task::max_attempts`), which its row keeps and every pool obeys,
    /// instead of its type's as the producer declares it.
    own_attempts: Option<u32>,
}

impl Job {
    fn output(&self) -> u64 {
        self.seq * 2 + 1
    }

    /// The attempts its task may start: its own, else its type's.
    fn max_attempts(&self) -> u32 {
        self.own_attempts.unwrap_or(self.ty.max_attempts())
    }
}

fn make_job(rng: &mut Rng, seq: u64, ty: Ty) -> Job {
    // One plain task in eight has attempts of its own.
    let own_attempts = (!ty.mitigated() && rng.chance(12)).then(|| 1 + rng.below(6) as u32);
    let limit = own_attempts.unwrap_or(ty.max_attempts());
    let roll = rng.below(100);
    let kind = if ty == Ty::Timed {
        match roll {
            0..14 => Kind::Overrun {
                until: 1 + rng.below(u64::from(limit)) as u32,
                ok: rng.chance(50),
            },
            14..22 => Kind::Ignore(3 + rng.below(15) as u32),
            22..26 => Kind::Permanent,
            26..29 => Kind::Panic,
            // Well inside the timeout.
            29..35 => Kind::Sleep(1 + rng.below(4) as u32),
            _ => Kind::Succeed,
        }
    } else {
        match roll {
            // LIMITED's handlers hold their slot a while, so that its tasks queue for the limit.
            0..60 if ty == Ty::Limited => Kind::Sleep(3 + rng.below(20) as u32),
            0..12 if limit > 1 => Kind::Transient(1 + rng.below(u64::from(limit - 1)) as u32),
            12..17 => Kind::Exhaust,
            17..21 => Kind::Permanent,
            21..25 => Kind::PermanentOnce,
            25..28 => Kind::Panic,
            28..38 => Kind::Sleep(2 + rng.below(60) as u32),
            _ => Kind::Succeed,
        }
    };
    Job {
        seq,
        ty,
        kind,
        own_attempts,
    }
}

/// splitmix64: the test's choices, from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// ===== what the handlers saw =====

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Returned {
    Ok,
    Retryable,
    Permanent,
    Panicked,
}

/// One handler run; `start` and `end` are ticks of the recorder's clock, which the canceller
/// shares, so runs and cancels are ordered.
#[derive(Clone, Debug)]
struct Run {
    attempt: u32,
    lease: Option<i64>,
    start: u64,
    end: u64,
    returned: Returned,
    /// Its token fired during the sleep (a `Sleep` or an `Overrun`).
    interrupted: bool,
    /// The first run of this payload ever.
    first_of_seq: bool,
    /// On a worker of pool A.
    on_a: bool,
    /// The downstream was out when it started: it failed for that.
    outage: bool,
    /// When it started, on the system clock (for RATED's rate).
    wall: SystemTime,
    /// How long the handler took.
    took: Duration,
    /// Its token had fired when the handler returned.
    fired_while_running: bool,
    /// Its token, kept to see at the end whether it ever fired. A cancel, a shutdown deadline
    /// or a timeout fires it, and may do so after the handler returned: a timeout until the
    /// worker takes the run back from the monitor, a cancel (or the heartbeat, which fires the
    /// tokens of runs whose rows it no longer finds running) until the pool forgets the run,
    /// after writing its ending.
    token: CancelToken,
}

impl Run {
    /// Its token fired, while it ran or after.
    fn fired(&self) -> bool {
        self.token.is_cancelled()
    }
}

#[derive(Default)]
struct Recorder {
    clock: AtomicU64,
    runs: Mutex<HashMap<TaskId, Vec<Run>>>,
    /// Payload `seq`s that have run.
    ran: Mutex<HashSet<u64>>,
    /// Told when a sleeping task starts on pool A (armed just before A's shutdown).
    sleeping_on_a: Mutex<Option<Sender<()>>>,
    /// The downstream is out (the outage thread sets it).
    outage: AtomicBool,
    /// LIMITED's handlers running now, in both pools, and the most ever seen at once.
    limited_now: AtomicUsize,
    limited_most: AtomicUsize,
    /// Handlers of queue `slow` (as the rows have it) running now, in both pools, and the most
    /// ever seen at once.
    slow_now: AtomicUsize,
    slow_most: AtomicUsize,
    /// Every event a pool's hook heard: the pool, the event, the tick it was heard at.
    events: Mutex<Vec<(&'static str, Event, u64)>>,
    /// Per type (`Ty as usize`): a pause covers it now (set once `pause` returned, cleared
    /// before `resume`).
    paused: [AtomicBool; 7],
    /// Handlers that started while a pause covered their type: only tasks claimed before the
    /// pause returned may (held by a worker or prefetched).
    started_paused: AtomicU64,
    /// The lease sequence's last value read once the pause in force returned: every claim
    /// committed before that has a lease id at most this, every later one a greater.
    pause_lease: AtomicI64,
    /// Handlers that started while a pause covered their type under a later claim than the
    /// pause (a lease id above `pause_lease`), and the first of them.
    claimed_paused: AtomicU64,
    claimed_paused_examples: Mutex<Vec<String>>,
}

impl Recorder {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst) + 1
    }
}

fn run_job(rec: &Recorder, ctx: &Context, job: &Job) -> Result<u64, HandlerError> {
    // Counted before the start tick and uncounted after the end tick: the runs' intervals lie
    // inside what the counter saw.
    let limited = job.ty == Ty::Limited;
    if limited {
        let now = rec.limited_now.fetch_add(1, Ordering::SeqCst) + 1;
        rec.limited_most.fetch_max(now, Ordering::SeqCst);
    }
    let slow = job.ty.queue() == "slow";
    if slow {
        let now = rec.slow_now.fetch_add(1, Ordering::SeqCst) + 1;
        rec.slow_most.fetch_max(now, Ordering::SeqCst);
    }
    // Counted out however the handler ends (some panic).
    let _out = slow.then(|| Uncount(&rec.slow_now));
    run_counted(rec, ctx, job)
}

/// Counts a running handler out when dropped.
struct Uncount<'a>(&'a AtomicUsize);

impl Drop for Uncount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn run_counted(rec: &Recorder, ctx: &Context, job: &Job) -> Result<u64, HandlerError> {
    let limited = job.ty == Ty::Limited;
    if rec.paused[job.ty as usize].load(Ordering::SeqCst) {
        rec.started_paused.fetch_add(1, Ordering::SeqCst);
        let before = rec.pause_lease.load(Ordering::SeqCst);
        if ctx.lease_id().is_some_and(|lease| lease > before) {
            rec.claimed_paused.fetch_add(1, Ordering::SeqCst);
            let mut examples = rec.claimed_paused_examples.lock().unwrap();
            if examples.len() < 4 {
                examples.push(format!(
                    "{} ({:?}) lease {:?} > {before}",
                    ctx.id(),
                    job.ty,
                    ctx.lease_id()
                ));
            }
        }
    }
    let (start, wall, began) = (rec.tick(), SystemTime::now(), Instant::now());
    let on_a = thread::current()
        .name()
        .is_some_and(|n| n.starts_with("pg-soak-a-"));
    let first_of_seq = rec.ran.lock().unwrap().insert(job.seq);
    let outage = job.ty.calls_downstream() && rec.outage.load(Ordering::SeqCst);
    let mut interrupted = false;
    let retryable = |error: HandlerError| (Returned::Retryable, Err(error));
    let (returned, result) = match job.kind {
        _ if outage => retryable(HandlerError::retryable("the downstream is out")),
        Kind::Succeed => (Returned::Ok, Ok(job.output())),
        Kind::Transient(fails) if ctx.attempt() <= fails => {
            let error = HandlerError::retryable(format!("transient failure {}", ctx.attempt()));
            // Half of them ask for their own delay, as a `Retry-After` would.
            match job.seq % 2 {
                0 => retryable(error),
                _ => retryable(error.retry_after(Duration::from_millis(1))),
            }
        }
        Kind::Transient(_) => (Returned::Ok, Ok(job.output())),
        Kind::Exhaust => retryable(HandlerError::retryable("always fails")),
        Kind::Permanent => (Returned::Permanent, Err(HandlerError::permanent("no"))),
        Kind::PermanentOnce if first_of_seq => (
            Returned::Permanent,
            Err(HandlerError::permanent("first run")),
        ),
        Kind::PermanentOnce => (Returned::Ok, Ok(job.output())),
        Kind::Panic => (Returned::Panicked, Ok(0)),
        Kind::Sleep(ms) => {
            if let (true, Some(started)) = (on_a, &*rec.sleeping_on_a.lock().unwrap()) {
                let _ = started.try_send(());
            }
            match ctx.sleep(Duration::from_millis(u64::from(ms))) {
                Ok(()) => (Returned::Ok, Ok(job.output())),
                Err(_) => {
                    interrupted = true;
                    retryable(HandlerError::retryable("interrupted"))
                }
            }
        }
        Kind::Overrun { until, ok } if ctx.attempt() <= until => {
            // Bounded, so that a monitor that never fires cannot hang the run.
            match ctx.sleep(TIMEOUT * 20) {
                Err(_) if !ok => {
                    interrupted = true;
                    retryable(HandlerError::retryable("gave up at the timeout"))
                }
                Err(_) => {
                    interrupted = true;
                    (Returned::Ok, Ok(job.output()))
                }
                Ok(()) => (Returned::Ok, Ok(job.output())),
            }
        }
        Kind::Overrun { .. } => (Returned::Ok, Ok(job.output())),
        Kind::Ignore(ms) => {
            thread::sleep(TIMEOUT + Duration::from_millis(u64::from(ms)));
            (Returned::Ok, Ok(job.output()))
        }
    };
    let fired_while_running = ctx.is_cancelled();
    let (attempt, lease, end) = (ctx.attempt(), ctx.lease_id(), rec.tick());
    if limited {
        rec.limited_now.fetch_sub(1, Ordering::SeqCst);
    }
    let run = Run {
        attempt,
        lease,
        start,
        end,
        returned,
        interrupted,
        first_of_seq,
        on_a,
        outage,
        wall,
        took: began.elapsed(),
        fired_while_running,
        token: ctx.token().clone(),
    };
    rec.runs
        .lock()
        .unwrap()
        .entry(ctx.id())
        .or_default()
        .push(run);
    if returned == Returned::Panicked {
        panic!("{MARKER} task {}", job.seq);
    }
    result
}

fn silence_expected_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload.downcast_ref::<String>().map(String::as_str);
            let message = message.or_else(|| payload.downcast_ref::<&str>().copied());
            if !message.unwrap_or("").starts_with(MARKER) {
                default(info);
            }
        }));
    });
}

/// Which of the run's three pools to build.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// No workers: declares the types (no handlers), with the options its tasks carry.
    Producer,
    /// Registers the types with the producer's options.
    A,
    /// Registers the plain types with other options (see [`Ty::options_on_b`]).
    B,
}

/// Worker threads started and exited in pools A and B (their start and exit hooks).
#[derive(Default)]
struct WorkerHooks {
    started: [AtomicUsize; 2],
    exited: [AtomicUsize; 2],
}

fn build_pool(
    url: &str,
    (role, workers, prefetch): (Role, usize, Option<usize>),
    rec: &Arc<Recorder>,
    hooks: &Arc<WorkerHooks>,
    name: &'static str,
) -> Pool {
    let hook_rec = Arc::clone(rec);
    let builder = Pool::builder().postgres(url.to_owned());
    // Pool A serves queue `slow` with a worker of its own, out of its `workers`.
    let (builder, workers) = match role {
        Role::A => (builder.queue("slow", 1), workers - 1),
        Role::Producer | Role::B => (builder, workers),
    };
    // `None`: the default, which claims ahead as the pool's pace says.
    let builder = match prefetch {
        Some(prefetch) => builder.prefetch(prefetch),
        None => builder,
    };
    let mut builder = builder
        .workers(workers)
        .lease(LEASE)
        .poll_interval(Duration::from_millis(100))
        .retry_policy(RetryPolicy::exponential(
            Duration::from_millis(1),
            Duration::from_millis(8),
        ))
        .thread_name(name)
        // The same mitigations on every pool, as every process of one application would set.
        .breaker(DOWNSTREAM, BREAKER)
        .aging(AGING)
        .stuck_after(STUCK_AFTER)
        .on_event(move |event: &Event| {
            let tick = hook_rec.tick();
            let mut events = hook_rec.events.lock().unwrap();
            events.push((name, event.clone(), tick));
        });
    let side = usize::from(role == Role::B);
    let (started, exited) = (Arc::clone(hooks), Arc::clone(hooks));
    builder = builder
        .on_worker_start(move |_| {
            started.started[side].fetch_add(1, Ordering::SeqCst);
        })
        .on_worker_exit(move |_| {
            exited.exited[side].fetch_add(1, Ordering::SeqCst);
        });
    for ty in Ty::ALL {
        let rec = Arc::clone(rec);
        let handler = move |ctx: &Context, job: &Job| run_job(&rec, ctx, job);
        builder = match role {
            Role::Producer => builder.declare(ty.task_type(), ty.options()),
            Role::A => builder.register_with(ty.task_type(), ty.options(), handler),
            Role::B => builder.register_with(ty.task_type(), ty.options_on_b(), handler),
        };
    }
    builder = match role {
        Role::Producer => builder.declare(TICK, TypeOptions::new()),
        Role::A | Role::B => builder.register(TICK, |_, _: &u64| Ok::<_, HandlerError>(())),
    };
    let schedule = tasq::Schedule::every("pg-soak-tick", TICK_EVERY, TICK, |slot| {
        slot.duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    })
    .missed(tasq::Missed::CatchUp(tasq::MAX_CATCH_UP));
    builder
        .schedule(schedule)
        .build()
        .expect("build a durable pool")
}

/// The periodic task three pools ticked at once: every slot from the first to the last
/// submitted once, with its task (a slot skipped or made twice is a finding).
fn check_ticks(f: &Findings, db: &TestDb) -> String {
    let mut client = db.client();
    let slots: Vec<(i64, Option<i64>)> = client
        .query(
            "SELECT (EXTRACT(EPOCH FROM slot) * 1000000)::BIGINT, task FROM tasq_schedule_slots
             WHERE name = 'pg-soak-tick' ORDER BY slot",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let step = TICK_EVERY.as_micros() as i64;
    // The cleaner prunes slots behind the watermark: what is left is contiguous.
    if let Some(pair) = slots.windows(2).find(|w| w[1].0 != w[0].0 + step) {
        f.add("a schedule's slots were skipped", || format!("{pair:?}"));
    }
    f.check(
        slots.iter().all(|s| s.1.is_some()),
        "a schedule's slot has no task",
        || format!("{slots:?}"),
    );
    let (tasks, distinct, first, last): (i64, i64, Option<i64>, Option<i64>) = {
        let row = client
            .query_one(
                "SELECT count(*), count(DISTINCT payload), min(payload::TEXT::BIGINT),
                        max(payload::TEXT::BIGINT)
                 FROM tasq_tasks WHERE type = 'pg-soak-tick'",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3))
    };
    f.check(
        tasks == distinct,
        "a schedule's slot was submitted twice",
        || format!("{tasks} tasks, {distinct} slots"),
    );
    // Every slot between the first and the last has its task (the rows are all kept).
    if let (Some(first), Some(last)) = (first, last) {
        f.check(
            (last - first) / step + 1 == distinct,
            "a schedule's slots were skipped",
            || format!("{distinct} slots from {first} to {last}, every {step} us"),
        );
    }
    format!("{tasks} scheduled tasks ({} slots kept)", slots.len())
}

/// Violations by kind: a count, and the first few spelled out.
#[derive(Default)]
struct Findings(Mutex<BTreeMap<&'static str, (usize, Vec<String>)>>);

impl Findings {
    fn add(&self, kind: &'static str, message: impl FnOnce() -> String) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (count, examples) = map.entry(kind).or_default();
        *count += 1;
        if examples.len() < 4 {
            examples.push(message());
        }
    }

    fn check(&self, ok: bool, kind: &'static str, message: impl FnOnce() -> String) {
        if !ok {
            self.add(kind, message);
        }
    }

    fn summary(&self) -> Option<String> {
        let map = self.0.lock().unwrap();
        let mut out = String::new();
        for (kind, (count, examples)) in map.iter() {
            out += &format!("  {count:>6} × {kind}\n");
            examples
                .iter()
                .for_each(|e| out += &format!("           - {e}\n"));
        }
        (!map.is_empty()).then_some(out)
    }
}

// ===== the run =====

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Submitted,
    /// A resubmitted dead letter.
    Resubmitted(TaskId),
    /// A dependent brought back by `resubmit_with_dependents`.
    BroughtBack(TaskId),
}

struct Accepted {
    job: Job,
    /// Its own priority (a resubmit keeps the dead letter's).
    priority: u8,
    deps: Vec<TaskId>,
    key: Option<String>,
    origin: Origin,
    handle: TaskHandle<u64>,
}

/// What the producer did.
#[derive(Default)]
struct Produced {
    tasks: HashMap<TaskId, Accepted>,
    /// Accepted ids in order.
    order: Vec<TaskId>,
    /// More handles of accepted ids: deduplicated submits', other pools'.
    extra: Vec<(TaskId, TaskHandle<u64>, &'static str)>,
    /// Each dead letter's failure as first listed.
    listed: HashMap<TaskId, Failure>,
    /// Old id → new id, of resubmitted dead letters and brought-back dependents.
    resubmitted: HashMap<TaskId, TaskId>,
    /// Dead letters taken or purged.
    taken: HashSet<TaskId>,
    page_after: Option<TaskId>,
    counts: BTreeMap<&'static str, u64>,
}

impl Produced {
    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    fn accept(
        &mut self,
        f: &Findings,
        handle: TaskHandle<u64>,
        task: (Job, u8, Vec<TaskId>, Option<String>, Origin),
    ) {
        let (id, (job, priority, deps, key, origin)) = (handle.id(), task);
        f.check(
            !self.tasks.contains_key(&id),
            "one id given to two tasks",
            || format!("{id}"),
        );
        self.order.push(id);
        self.tasks.insert(
            id,
            Accepted {
                job,
                priority,
                deps,
                key,
                origin,
                handle,
            },
        );
    }
}

/// A cancel the producer orders: when, which task, its handle, and its key (if it has one: a
/// cancel by key, now and then).
type CancelOrder = (Instant, TaskId, TaskHandle<u64>, Option<String>);

#[derive(Debug)]
struct CancelRecord {
    id: TaskId,
    /// Ticks just before the call and just after it returned.
    before: u64,
    after: u64,
    result: Result<CancelOutcome, tasq::CancelError>,
}

struct Cx<'a> {
    producer: &'a Pool,
    a: &'a Pool,
    b: &'a Pool,
    f: &'a Findings,
    tasks: u64,
}

fn produce(
    cx: &Cx<'_>,
    rng: &mut Rng,
    orders: Sender<CancelOrder>,
    close_a: (Sender<()>, u64),
) -> Produced {
    let mut p = Produced::default();
    let (mut recent, mut unfinished) = (VecDeque::new(), VecDeque::<TaskHandle<u64>>::new());
    let (mut close_a, close_a_after) = (Some(close_a.0), close_a.1);
    let (mut seq, mut next_dead_letter_pass) = (0, 50);
    while seq < cx.tasks {
        if seq >= close_a_after {
            // Pool A's handles are asked for only before this (see below).
            if let Some(go) = close_a.take() {
                let _ = go.send(());
            }
        }
        let ty = Ty::pick(rng);
        // LIMITED comes in batches more often, so that its tasks press on its limit.
        let batch = if ty == Ty::Limited { 60 } else { 25 };
        let count = if rng.chance(batch) {
            2 + rng.below(5)
        } else {
            1
        }
        .min(cx.tasks - seq);
        let (mut batch, mut meta) = (Vec::new(), Vec::new());
        for _ in 0..count {
            let job = make_job(rng, seq, ty);
            seq += 1;
            let priority = rng.below(10) as u8;
            let mut task = ty.task_type().task(job).priority(priority);
            if let Some(attempts) = job.own_attempts {
                task = task.max_attempts(attempts);
            }
            if rng.chance(10) {
                task = task.delay(Duration::from_millis(1 + rng.below(30)));
            }
            let key = rng.chance(15).then(|| format!("key-{}", rng.below(16)));
            if let Some(key) = &key {
                task = task.key(key.clone());
            }
            let mut deps = Vec::new();
            if !recent.is_empty() && rng.chance(25) {
                for _ in 0..1 + rng.below(3) {
                    let dep = recent[rng.below(recent.len() as u64) as usize];
                    if !deps.contains(&dep) {
                        deps.push(dep);
                    }
                }
                task = task.after(deps.iter().copied());
            }
            batch.push(task);
            meta.push((job, priority, deps, key));
        }
        let result = if count == 1 && rng.chance(70) {
            let submitted = cx.producer.submit(batch.pop().unwrap());
            submitted
                .map(|handle| vec![handle])
                .map_err(|e| e.kind().clone())
        } else {
            p.count("batches");
            cx.producer
                .submit_batch(batch)
                .map_err(|e| e.kind().clone())
        };
        let handles = match result {
            Ok(handles) => handles,
            Err(SubmitErrorKind::KeyConflict { .. }) => {
                p.count("submits refused: key held by another type");
                continue;
            }
            Err(kind) => {
                cx.f.add("a submit refused", || format!("seq {seq}: {kind:?}"));
                continue;
            }
        };
        for (handle, (job, priority, deps, key)) in handles.into_iter().zip(meta) {
            let id = handle.id();
            if handle.is_duplicate() {
                p.count("duplicates");
                let holder = p.tasks.get(&id).map(|t| &t.key);
                cx.f.check(
                    key.is_some() && holder == Some(&key),
                    "a duplicate is not a task that held its key",
                    || format!("{id}: key {key:?}, holder's {holder:?}"),
                );
                p.extra.push((id, handle, "a deduplicated submit's"));
                continue;
            }
            recent.push_back(id);
            if recent.len() > 24 {
                recent.pop_front();
            }
            unfinished.push_back(handle.clone());
            // Sleeping tasks are cancelled more often, to meet them running.
            let share = if matches!(job.kind, Kind::Sleep(_)) {
                35
            } else {
                6
            };
            if rng.chance(share) {
                let at = Instant::now() + Duration::from_micros(rng.below(30_000));
                orders.send((at, id, handle.clone(), key.clone())).unwrap();
            }
            // Another pool's handle: B's any time, A's only before it closes (a closed pool has
            // nobody to publish an outcome to a handle made after it stopped).
            if rng.chance(4) {
                let other = if close_a.is_some() && rng.chance(50) {
                    cx.a
                } else {
                    cx.b
                };
                match other.handle(ty.task_type(), id) {
                    Some(handle) => p.extra.push((id, handle, "another pool's")),
                    None => cx.f.add("another pool has no handle", || format!("{id}")),
                }
            }
            // Now and then its key looked up: this task holds it, unless it has already
            // ended failed or cancelled (only this thread submits).
            if let Some(key) = key.as_deref().filter(|_| rng.chance(50)) {
                p.count("find_key");
                let holder = cx.producer.find_key(key);
                let state = cx.producer.status(id);
                let fits = holder == Some(id)
                    || (holder.is_none()
                        && matches!(state, Some(TaskState::Failed | TaskState::Cancelled)));
                cx.f.check(fits, "find_key named the wrong holder", || {
                    format!("{id} (key {key}): found {holder:?}, the task is {state:?}")
                });
            }
            let task = (job, priority, deps, key, Origin::Submitted);
            p.accept(cx.f, handle, task);
        }
        if seq >= next_dead_letter_pass {
            next_dead_letter_pass += 40 + rng.below(40);
            dead_letter_pass(cx, rng, &mut p, &orders);
        }
        // Keep the queue short: wait on the oldest unfinished handle while there are too many.
        unfinished.retain(|h| !h.is_finished());
        let give_up = Instant::now() + Duration::from_secs(10);
        while unfinished.len() > BACKLOG && Instant::now() < give_up {
            let _ = unfinished[0].wait_timeout(Duration::from_millis(50));
            unfinished.retain(|h| !h.is_finished());
        }
    }
    if let Some(go) = close_a.take() {
        let _ = go.send(());
    }
    p
}

/// Lists dead letters and acts on some of them.
fn dead_letter_pass(cx: &Cx<'_>, rng: &mut Rng, p: &mut Produced, orders: &Sender<CancelOrder>) {
    let (pool, f) = (cx.producer, cx.f);
    let letters = match rng.below(3) {
        0 => pool.dead_letters(),
        1 => {
            let ty = Ty::ALL[rng.below(Ty::ALL.len() as u64) as usize];
            pool.dead_letters_of(ty.task_type(), None, 30)
        }
        _ => {
            let page = pool.dead_letters_after(p.page_after, 10);
            p.page_after = page.last().map(|letter| letter.id);
            page
        }
    };
    for letter in letters {
        let id = letter.id;
        let Some(task) = p.tasks.get(&id) else {
            f.add("a dead letter of no task", || format!("{letter:?}"));
            continue;
        };
        let (job, key, ty) = (task.job, task.key.clone(), task.job.ty.task_type());
        let (priority, timed) = (task.priority, job.ty == Ty::Timed);
        let reason = letter.failure.reason;
        let fits = letter.task_type == ty.name()
            && match reason {
                FailureReason::Exhausted | FailureReason::Permanent => true,
                FailureReason::Panicked => true,
                FailureReason::TimedOut => timed,
                _ => false,
            };
        f.check(fits, "a dead letter's type or reason is wrong", || {
            format!("{letter:?} of {job:?}")
        });
        // Aging raised its priority while it waited; the task's own stays its own.
        f.check(
            letter.priority == priority,
            "a dead letter's priority is not its own",
            || format!("{letter:?}: its own is {priority}"),
        );
        p.listed.entry(id).or_insert(letter.failure.clone());
        if rng.chance(15) {
            p.count("dead_letter_payload");
            let copy = pool.dead_letter_payload(ty, id);
            f.check(
                copy == Some(job),
                "a dead letter's payload is not its task's",
                || format!("{id}: {copy:?}, not {job:?}"),
            );
        }
        if !rng.chance(40) {
            continue;
        }
        match rng.below(20) {
            0..7 => {
                p.count("resubmit");
                match pool.resubmit(ty, id) {
                    Ok(handle) => {
                        p.resubmitted.insert(id, handle.id());
                        if rng.chance(10) {
                            let at = Instant::now() + Duration::from_micros(rng.below(10_000));
                            orders
                                .send((at, handle.id(), handle.clone(), key.clone()))
                                .unwrap();
                        }
                        let task = (job, priority, Vec::new(), key, Origin::Resubmitted(id));
                        p.accept(f, handle, task);
                    }
                    Err(error) => check_refusal(cx, p, id, error),
                }
            }
            7..14 => {
                p.count("resubmit_with_dependents");
                let revived = match pool.resubmit_with_dependents(ty, id) {
                    Ok(revived) => revived,
                    Err(error) => {
                        check_refusal(cx, p, id, error);
                        continue;
                    }
                };
                p.resubmitted.insert(id, revived.task.id());
                let mut renamed = HashMap::from([(id, revived.task.id())]);
                renamed.extend(revived.dependents.iter().copied());
                let task = (job, priority, Vec::new(), key, Origin::Resubmitted(id));
                p.accept(f, revived.task, task);
                for (old, new) in revived.dependents {
                    p.count("dependents brought back");
                    p.resubmitted.insert(old, new);
                    let Some(dependent) = p.tasks.get(&old) else {
                        f.add("brought back a task never submitted", || format!("{old}"));
                        continue;
                    };
                    let (job, key) = (dependent.job, dependent.key.clone());
                    let priority = dependent.priority;
                    let deps = dependent
                        .deps
                        .iter()
                        .map(|d| *renamed.get(d).unwrap_or(d))
                        .collect();
                    match pool.handle(job.ty.task_type(), new) {
                        Some(handle) => {
                            let task = (job, priority, deps, key, Origin::BroughtBack(old));
                            p.accept(f, handle, task)
                        }
                        None => f.add("no handle to a dependent brought back", || format!("{new}")),
                    }
                }
            }
            14 => {
                let n = Ty::ALL.len();
                let wrong = Ty::ALL[(job.ty as usize + 1 + rng.below(n as u64 - 1) as usize) % n];
                let result = pool.resubmit(wrong.task_type(), id).map(|h| h.id());
                let refused = matches!(result, Err(ResubmitError::TypeMismatch(i)) if i == id);
                f.check(
                    refused,
                    "a resubmit with the wrong type was not refused so",
                    || format!("{id}: {result:?}"),
                );
            }
            15..18 => {
                p.count("take_dead_letter");
                let payload = pool.take_dead_letter(ty, id);
                f.check(
                    payload == Some(job),
                    "take_dead_letter lost the payload",
                    || format!("{id}: {payload:?}, not {job:?}"),
                );
                p.taken.insert(id);
            }
            18 => {
                p.count("purge_dead_letter");
                f.check(
                    pool.purge_dead_letter(id),
                    "a purge of a listed dead letter failed",
                    || format!("{id}"),
                );
                p.taken.insert(id);
            }
            _ => {}
        }
    }
}

fn check_refusal(cx: &Cx<'_>, p: &mut Produced, id: TaskId, error: ResubmitError) {
    p.count("resubmits refused");
    let key = p.tasks.get(&id).and_then(|t| t.key.clone());
    let fits = match &error {
        // Another task took its key after it failed.
        ResubmitError::KeyTaken(_, holder) => {
            key.is_some() && p.tasks.get(holder).is_some_and(|h| h.key == key)
        }
        ResubmitError::AlreadyResubmitted(_, new) => p.resubmitted.get(&id) == Some(new),
        ResubmitError::Taken(_) => p.taken.contains(&id),
        _ => false,
    };
    cx.f.check(fits, "a resubmit refused for no reason", || {
        format!("{id} (key {key:?}): {error:?}")
    });
}

/// Cancels each ordered task at its time, through the producer, pool B or the handle.
fn cancel_loop(
    orders: Receiver<CancelOrder>,
    cx: &Cx<'_>,
    rec: &Recorder,
    mut rng: Rng,
) -> Vec<CancelRecord> {
    let (mut due, mut records, mut open) = (Vec::<CancelOrder>::new(), Vec::new(), true);
    loop {
        let now = Instant::now();
        let (ripe, later) = std::mem::take(&mut due)
            .into_iter()
            .partition(|o| o.0 <= now);
        due = later;
        for (_, id, handle, key) in ripe {
            let before = rec.tick();
            let (id, result) = match (rng.below(4), key) {
                // By its key: the key's holder now, which is this task unless it ended failed
                // or cancelled (freeing the key for another, whose cancel this then is).
                (3, Some(key)) => match cx.producer.cancel_key(&key) {
                    Ok((holder, outcome)) => (holder, Ok(outcome)),
                    Err(tasq::CancelError::UnknownKey(_)) => {
                        let state = cx.producer.status(id);
                        cx.f.check(
                            matches!(state, Some(TaskState::Failed | TaskState::Cancelled)),
                            "cancel_key found no holder of a live or succeeded task's key",
                            || format!("{id} (key {key}): {state:?}"),
                        );
                        continue;
                    }
                    Err(error) => (id, Err(error)),
                },
                (0, _) => (id, cx.producer.cancel(id)),
                (1, _) => (id, cx.b.cancel(id)),
                _ => (id, handle.cancel()),
            };
            records.push(CancelRecord {
                id,
                before,
                after: rec.tick(),
                result,
            });
        }
        let next = due.iter().map(|(at, _, _, _)| *at).min();
        let wait = next.map_or(Duration::from_secs(1), |at| {
            at.saturating_duration_since(now)
        });
        match (open, orders.recv_timeout(wait)) {
            (_, Ok(order)) => due.push(order),
            (_, Err(RecvTimeoutError::Timeout)) => {}
            (true, Err(RecvTimeoutError::Disconnected)) => open = false,
            // Nothing more will come: pace to the next cancel due.
            (false, Err(RecvTimeoutError::Disconnected)) if next.is_some() => thread::sleep(wait),
            (false, Err(RecvTimeoutError::Disconnected)) => return records,
        }
    }
}

/// Watches the worker pools until told to stop: every worker alive while its pool runs. And
/// pages through the queue's tasks of one state (or one type and state) now and then, a few
/// pages at a time: every page is in id order after the last, no longer than asked, and names
/// only tasks in the state asked for (one statement reads the page).
fn sample(cx: &Cx<'_>, a_closing: &AtomicBool, stop: Receiver<()>) {
    let states = [
        TaskState::Ready,
        TaskState::Running,
        TaskState::Scheduled,
        TaskState::Blocked,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
    ];
    let mut turn = 0_usize;
    loop {
        turn += 1;
        let state = states[turn % states.len()];
        let mut filter = tasq::TaskFilter::new().state(state);
        if turn % 3 == 0 {
            filter = filter.task_type(Ty::ALL[turn % Ty::ALL.len()].task_type().name());
        }
        let mut after = None;
        for _ in 0..3 {
            let page = cx.b.tasks(&filter, after, 40);
            let in_order = page.windows(2).all(|w| w[0].id < w[1].id)
                && after.is_none_or(|a| page.first().is_none_or(|t| t.id > a));
            cx.f.check(
                in_order && page.len() <= 40,
                "a page of tasks out of order or too long",
                || {
                    format!(
                        "{filter:?} after {after:?}: {:?}",
                        page.iter().map(|t| t.id).collect::<Vec<_>>()
                    )
                },
            );
            // Ready and scheduled tasks are told apart by the clock as the page is read.
            let due_apart = matches!(state, TaskState::Ready | TaskState::Scheduled);
            let wrong = page.iter().find(|t| {
                let apart = due_apart && matches!(t.state, TaskState::Ready | TaskState::Scheduled);
                (t.state != state && !apart)
                    || filter.get_task_type().is_some_and(|ty| t.task_type != ty)
            });
            cx.f.check(wrong.is_none(), "a page lists a task it should not", || {
                format!("{filter:?}: {wrong:?}")
            });
            match page.last() {
                Some(last) if page.len() == 40 => after = Some(last.id),
                _ => break,
            }
        }
        if turn % 5 == 0 {
            // What the dashboard of pool B reads: the overview (each state's count from one
            // statement, so a dead letter is among the failed), and a page of dead letters.
            match cx.b.overview() {
                Ok(o) => cx.f.check(
                    o.states.dead <= o.states.failed,
                    "an overview with more dead letters than failed tasks",
                    || format!("{:?}", o.states),
                ),
                Err(e) => cx.f.check(false, "overview() failed", || e.to_string()),
            }
            let dead =
                cx.b.task_page(&tasq::console::TaskQuery::new().dead().limit(20));
            cx.f.check(
                dead.tasks.len() <= 20 && dead.tasks.iter().all(|t| t.state == TaskState::Failed),
                "a console page of dead letters lists a task that is not failed",
                || format!("{dead:?}"),
            );
        }
        let (a, b) = (cx.a.stats(), cx.b.stats());
        // Read after the stats: if unset, they were taken before A's shutdown began.
        let a_open = !a_closing.load(Ordering::SeqCst);
        cx.f.check(
            !a_open || a.workers == WORKERS_A,
            "pool A lost a worker",
            || format!("{a:?}"),
        );
        cx.f.check(b.workers == WORKERS_B, "pool B lost a worker", || {
            format!("{b:?}")
        });
        if stop.recv_timeout(Duration::from_millis(100)) != Err(RecvTimeoutError::Timeout) {
            return;
        }
    }
}

/// Takes the downstream out and brings it back at random until told to stop; returns how many
/// outages there were. It is back when this returns.
/// Pauses a queue or type for the fleet now and then, through the producer, for a few
/// milliseconds each, marking the types it covers while it is in force; every pause is resumed
/// before the next, and before this returns. Returns the pauses made and what went wrong.
fn pauses(
    pool: &Pool,
    db: &TestDb,
    rec: &Recorder,
    mut rng: Rng,
    stop: Receiver<()>,
) -> (u64, Vec<String>) {
    let mut sql = db.client();
    let targets: [(PauseTarget, Vec<Ty>); 3] = [
        (
            PauseTarget::queue("slow"),
            Ty::ALL
                .into_iter()
                .filter(|t| t.queue() == "slow")
                .collect(),
        ),
        (
            PauseTarget::queue(tasq::DEFAULT_QUEUE),
            vec![Ty::Fast, Ty::Remote, Ty::Limited, Ty::Rated, Ty::Timed],
        ),
        (
            PauseTarget::task_type(Ty::Limited.task_type().name()),
            vec![Ty::Limited],
        ),
    ];
    let (mut made, mut wrong) = (0, Vec::new());
    let wait = |rng: &mut Rng, ms: u64| {
        stop.recv_timeout(Duration::from_millis(rng.below(ms))) != Err(RecvTimeoutError::Timeout)
    };
    loop {
        if wait(&mut rng, 200) {
            break;
        }
        let (target, covered) = &targets[rng.below(targets.len() as u64) as usize];
        match pool.pause(target.clone()) {
            Ok(true) => made += 1,
            other => wrong.push(format!("pause({target}) = {other:?}")),
        }
        let lease: i64 = sql
            .query_one("SELECT last_value FROM tasq_lease", &[])
            .unwrap()
            .get(0);
        rec.pause_lease.store(lease, Ordering::SeqCst);
        for ty in covered {
            rec.paused[*ty as usize].store(true, Ordering::SeqCst);
        }
        let stopped = wait(&mut rng, 40);
        for ty in covered {
            rec.paused[*ty as usize].store(false, Ordering::SeqCst);
        }
        match pool.resume(target.clone()) {
            Ok(true) => {}
            other => wrong.push(format!("resume({target}) = {other:?}")),
        }
        if stopped {
            break;
        }
    }
    match pool.paused() {
        Ok(left) if left.is_empty() => {}
        other => wrong.push(format!("paused() at the end = {other:?}")),
    }
    (made, wrong)
}

fn outages(rec: &Recorder, mut rng: Rng, stop: Receiver<()>) -> usize {
    let mut pause = |(lo, hi): (u64, u64)| Duration::from_millis(lo + rng.below(hi - lo));
    for outages in 0.. {
        if stop.recv_timeout(pause(UP_MS)) != Err(RecvTimeoutError::Timeout) {
            return outages;
        }
        rec.outage.store(true, Ordering::SeqCst);
        let stopped = stop.recv_timeout(pause(DOWN_MS)) != Err(RecvTimeoutError::Timeout);
        rec.outage.store(false, Ordering::SeqCst);
        if stopped {
            return outages + 1;
        }
    }
    unreachable!("the outages end when the producer is done")
}

/// Logs, in the test's schema, what the pools' handlers cannot see: each change of a breaker's
/// state and each claim of RATED, in the order the database made them. A trigger's insert runs
/// in the transaction that made the change, while it holds the lock of the row it changed, so
/// `seq` follows the order in which the changes of one row commit (one breaker's, or, for the
/// claims of RATED, its bucket's: a gated claim locks the type's gate row before it claims). A
/// transaction rolled back logs nothing. `tx_at` is the transaction's `now()`, the time the
/// store's gates reckon with (`tasq_now()`).
/// What the database and pool B hold when the end first waits [`HANDLE_STALL`] in vain for
/// task `id`: printed, so that a stall on a busy machine can be told from a lost task.
fn stall_report(db: &TestDb, pool_b: &Pool, id: TaskId) {
    let mut sql = db.client();
    let before = pool_b.stats().totals;
    let mut lines = vec![format!(
        "postgres soak: STALL on {id}; pool B: {:?}",
        pool_b.stats()
    )];
    let queries = [
        "SELECT status || ' ' || queue || ' ' || type || ': ' || count(*)
         FROM tasq_tasks WHERE status NOT IN ('succeeded', 'failed', 'cancelled')
         GROUP BY status, queue, type ORDER BY 1",
        "SELECT 'running ' || id || ' ' || queue || ' lease ' || lease_id || ' until ' ||
                (lease_until - now())::TEXT || ' attempts ' || attempts
         FROM tasq_tasks WHERE status = 'running' ORDER BY id",
        "SELECT 'ready ' || id || ' ' || queue || ' ' || type || ' due ' ||
                (run_at - tasq_now())::TEXT || ' prio ' || priority || ' attempts ' || attempts ||
                ' cancel ' || coalesce(cancel_requested, '-')
         FROM tasq_tasks WHERE status = 'ready' ORDER BY id LIMIT 20",
        "SELECT 'limit ' || name || ' ' || max_running FROM tasq_queues",
        "SELECT 'paused ' || coalesce(array_to_string(types, ','), '') || ' / ' ||
                coalesce(array_to_string(queues, ','), '') || ' / ' ||
                coalesce(array_to_string(limited, ','), '') FROM tasq_paused()",
        "SELECT 'leader ' || role || ' ' || holder || ' ' || (expires_at - now())::TEXT
         FROM tasq_leader",
        "SELECT 'queue row ' || name || ' xmax ' || xmax::TEXT FROM tasq_queues",
        "SELECT 'session ' || pid || ' ' || state || ' xid ' || coalesce(backend_xid::TEXT, '-')
                || ' wait ' || coalesce(wait_event_type || '/' || wait_event, '-') || ' for '
                || coalesce((now() - state_change)::TEXT, '-') || ' in tx for '
                || coalesce((now() - xact_start)::TEXT, '-') || ': ' || left(query, 160)
         FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'",
        "SELECT 'waits ' || l.pid || ' ' || l.locktype || ' ' || l.mode || ' on '
                || coalesce(l.relation::regclass::TEXT, '-')
         FROM pg_locks l WHERE NOT l.granted",
    ];
    for query in queries {
        match sql.query(query, &[]) {
            Ok(rows) => lines.extend(rows.iter().map(|row| row.get::<_, String>(0))),
            Err(error) => lines.push(format!("{query}: {error}")),
        }
    }
    // Whether B's fetcher still claims (its claims go on) or is stuck (they do not).
    thread::sleep(Duration::from_secs(1));
    let after = pool_b.stats().totals;
    lines.push(format!(
        "pool B over a second: {} claims ({} empty)",
        after.claims - before.claims,
        after.empty_claims - before.empty_claims
    ));
    eprintln!("{}", lines.join("\n  "));
}

fn install_logs(db: &TestDb) {
    let rated = Ty::Rated.task_type().name();
    db.client()
        .batch_execute(&format!(
            "CREATE TABLE soak_breaker_log (
                 seq BIGSERIAL PRIMARY KEY, name TEXT NOT NULL, old_state TEXT NOT NULL,
                 new_state TEXT NOT NULL, tx_at TIMESTAMPTZ NOT NULL, opened_at TIMESTAMPTZ,
                 probe_task BIGINT, probe_lease BIGINT);
             CREATE FUNCTION soak_log_breaker() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO soak_breaker_log
                     (name, old_state, new_state, tx_at, opened_at, probe_task, probe_lease)
                 VALUES (NEW.name, OLD.state, NEW.state, now(), NEW.opened_at, NEW.probe_task,
                         NEW.probe_lease);
                 RETURN NULL;
             END $$;
             CREATE TRIGGER soak_breaker_log AFTER UPDATE ON tasq_gates FOR EACH ROW
                 WHEN (NEW.kind = 'downstream' AND OLD.state IS DISTINCT FROM NEW.state)
                 EXECUTE FUNCTION soak_log_breaker();
             CREATE TABLE soak_claims (
                 seq BIGSERIAL PRIMARY KEY, id BIGINT NOT NULL, lease BIGINT,
                 tx_at TIMESTAMPTZ NOT NULL, at TIMESTAMPTZ NOT NULL);
             CREATE FUNCTION soak_log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO soak_claims (id, lease, tx_at, at)
                 VALUES (NEW.id, NEW.lease_id, now(), clock_timestamp());
                 RETURN NULL;
             END $$;
             CREATE TRIGGER soak_claims AFTER UPDATE ON tasq_tasks FOR EACH ROW
                 WHEN (NEW.type = '{rated}' AND NEW.status = 'running' AND OLD.status <> 'running')
                 EXECUTE FUNCTION soak_log_claim();"
        ))
        .expect("install the soak's logs");
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn durable_soak() {
    let Some(db) = TestDb::new() else { return };
    // Every row stays, for the checks; every dead letter too (the schema's policy, for every
    // pool on it).
    db.change_policy(|p| p.finished_max_age(None).dead_letter_limit(None));
    install_logs(&db);
    silence_expected_panics();
    let started = Instant::now();
    let tasks = env_u64("TASQ_PG_SOAK_TASKS").unwrap_or(DEFAULT_TASKS);
    let seed = env_u64("TASQ_PG_SOAK_SEED").unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        Rng(now.as_nanos() as u64 ^ u64::from(std::process::id())).next()
    });
    println!("postgres soak: {tasks} tasks, seed {seed} (replay with TASQ_PG_SOAK_SEED={seed})");
    // The watchdog: a hang anywhere becomes a failure with the phase it was in.
    let phase = Arc::new(Mutex::new("starting"));
    let (done, watched) = crossbeam_channel::bounded::<()>(0);
    let limit = Duration::from_secs(env_u64("TASQ_PG_SOAK_WATCHDOG_SECS").unwrap_or(300));
    let in_phase = Arc::clone(&phase);
    thread::spawn(move || {
        if watched.recv_timeout(limit) == Err(RecvTimeoutError::Timeout) {
            let phase = *in_phase.lock().unwrap_or_else(|e| e.into_inner());
            // Written past the test harness's capture (`eprintln!` is captured, and the capture
            // dies with the process), so the reason reaches the log.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\npostgres soak: WATCHDOG: not done in {limit:?}, in phase `{phase}` (seed {seed})"
            );
            std::process::exit(101);
        }
    });
    let set_phase = |now| *phase.lock().unwrap() = now;

    let rec = Arc::new(Recorder::default());
    let findings = Findings::default();
    let hooks = Arc::new(WorkerHooks::default());
    let producer = build_pool(
        &db.url,
        (Role::Producer, 0, Some(0)),
        &rec,
        &hooks,
        "pg-soak-producer",
    );
    let pool_a = build_pool(
        &db.url,
        (Role::A, WORKERS_A, Some(PREFETCH_A)),
        &rec,
        &hooks,
        "pg-soak-a",
    );
    let pool_b = build_pool(
        &db.url,
        (Role::B, WORKERS_B, None),
        &rec,
        &hooks,
        "pg-soak-b",
    );
    assert_eq!(producer.set_queue_limit("slow", Some(SLOW_LIMIT)), Ok(None));
    let cx = Cx {
        producer: &producer,
        a: &pool_a,
        b: &pool_b,
        f: &findings,
        tasks,
    };
    let mut rng = Rng(seed);
    let close_a_after = tasks * (50 + rng.below(45)) / 100;
    // Often too short for the handler then running (sleeps last up to 60 ms).
    let a_deadline = Duration::from_millis(rng.below(40));
    let a_closing = AtomicBool::new(false);

    set_phase("producing");
    let (order_tx, order_rx) = crossbeam_channel::unbounded();
    let (close_tx, close_rx) = crossbeam_channel::bounded::<()>(1);
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    let (outage_stop, outage_stopped) = crossbeam_channel::bounded::<()>(0);
    let (pause_stop, pause_stopped) = crossbeam_channel::bounded::<()>(0);
    let (cancel_rng, outage_rng) = (Rng(seed ^ 0xC0FF_EE00), Rng(seed ^ 0x0DD_BA11));
    let (p, cancels, (report_a, a_closed), outcomes, timeline) = thread::scope(|s| {
        let canceller = s.spawn(|| cancel_loop(order_rx, &cx, &rec, cancel_rng));
        let outage = s.spawn(|| outages(&rec, outage_rng, outage_stopped));
        let pauser =
            s.spawn(|| pauses(&producer, &db, &rec, Rng(seed ^ 0x9A05_E000), pause_stopped));
        let sampler = s.spawn(|| sample(&cx, &a_closing, stop_rx));
        let closer = s.spawn(|| {
            // When the producer says, once a handler of A sleeps (or after 2 s).
            let _ = close_rx.recv();
            let (sleeping, started) = crossbeam_channel::bounded(1);
            *rec.sleeping_on_a.lock().unwrap() = Some(sleeping);
            let _ = started.recv_timeout(Duration::from_secs(2));
            a_closing.store(true, Ordering::SeqCst);
            (pool_a.shutdown(a_deadline), rec.tick())
        });
        let p = produce(&cx, &mut rng, order_tx, (close_tx, close_a_after));
        // The downstream is back for the end: the breaker closes and what it held runs.
        drop(outage_stop);
        let outages = outage.join().unwrap();
        // Nothing stays paused for the end.
        drop(pause_stop);
        let (paused, pause_errors) = pauser.join().unwrap();
        let started_paused = rec.started_paused.load(Ordering::SeqCst);
        let claimed_paused = rec.claimed_paused.load(Ordering::SeqCst);
        findings.check(
            claimed_paused == 0 && pause_errors.is_empty(),
            "a claim after a pause took its task",
            || format!(
                "{claimed_paused} handlers under a lease taken after their pause returned: {:?}; {pause_errors:?}",
                rec.claimed_paused_examples.lock().unwrap()
            ),
        );
        println!("pauses: {paused}, {started_paused} handlers of tasks claimed before their pause");
        let cancels = canceller.join().unwrap();
        let a = closer.join().unwrap();

        set_phase("waiting for every handle");
        let produced = started.elapsed();
        let mut give_up = Instant::now() + HANDLE_STALL;
        let mut stalled = false;
        let mut outcomes: HashMap<TaskId, Outcome<u64>> = HashMap::new();
        for id in &p.order {
            let handle = &p.tasks[id].handle;
            let (now, pending) = (Instant::now(), !handle.is_finished());
            let left = give_up.saturating_duration_since(now);
            match handle.wait_timeout(left.max(Duration::from_millis(10))) {
                Some(outcome) => {
                    outcomes.insert(*id, outcome);
                    // Progress: the window starts again.
                    if pending {
                        give_up = Instant::now() + HANDLE_STALL;
                    }
                }
                None => {
                    if !stalled {
                        stalled = true;
                        stall_report(&db, &pool_b, *id);
                    }
                    findings.add("a handle never returned", || {
                        format!("{id} ({:?}): {:?}", p.tasks[id].job, producer.info(*id))
                    })
                }
            }
        }
        for (id, handle, what) in &p.extra {
            let outcome = handle.wait_timeout(Duration::from_secs(2));
            let canonical = outcomes.get(id);
            findings.check(
                outcome.as_ref() == canonical,
                "handles of one task disagree",
                || format!("{id}: {what} handle {outcome:?}, the submit's {canonical:?}"),
            );
        }
        drop(stop_tx);
        sampler.join().unwrap();
        (
            p,
            cancels,
            a,
            outcomes,
            (outages, produced, started.elapsed()),
        )
    });

    set_phase("shutting down");
    // Nothing is left to run: the breaker stays as it is.
    let breakers = pool_b.stats().breakers;
    let report_b = pool_b.shutdown(Duration::from_secs(30));
    producer.shutdown(Duration::from_secs(30));
    set_phase("checking");
    for (side, workers) in [WORKERS_A, WORKERS_B].into_iter().enumerate() {
        let (started, exited) = (
            hooks.started[side].load(Ordering::SeqCst),
            hooks.exited[side].load(Ordering::SeqCst),
        );
        findings.check(
            (started, exited) == (workers, workers),
            "worker start and exit hooks did not run once per worker",
            || {
                format!(
                    "pool {}: {started} starts, {exited} exits of {workers}",
                    ["A", "B"][side]
                )
            },
        );
    }
    check_run(
        &cx,
        &rec,
        &db,
        &p,
        &cancels,
        &outcomes,
        (&report_a, a_closed),
    );
    println!("postgres soak: {}", check_ticks(&findings, &db));
    let end = End {
        report_a: &report_a,
        a_closed,
        outages: timeline.0,
        breakers,
    };
    let mitigations = check_mitigations(&cx, &rec, &db, &p, &outcomes, &end);

    let runs: usize = rec.runs.lock().unwrap().values().map(Vec::len).sum();
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    outcomes
        .values()
        .for_each(|o| *states.entry(format!("{:?}", o.state())).or_default() += 1);
    let mut cancelled: BTreeMap<String, usize> = BTreeMap::new();
    cancels
        .iter()
        .for_each(|c| *cancelled.entry(format!("{:?}", c.result)).or_default() += 1);
    println!(
        "postgres soak (seed {seed}): {} tasks accepted, {runs} runs, outcomes {states:?}\n  {:?}\n  \
         cancels {cancelled:?}\n  pool A shut down after {close_a_after} submits, deadline \
         {a_deadline:?}: reached {}, {} interrupted; pool B's report: {} succeeded\n  \
         {mitigations}\n  produced in {:.1} s, every task ended at {:.1} s, {:.1} s in all",
        p.order.len(),
        p.counts,
        report_a.deadline_reached,
        report_a.interrupted.len(),
        report_b.succeeded,
        timeline.1.as_secs_f64(),
        timeline.2.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    drop(done);
    if let Some(summary) = findings.summary() {
        panic!(
            "postgres soak: violations (seed {seed}; replay with TASQ_PG_SOAK_SEED={seed}):\n{summary}"
        );
    }
}

// ===== the checks =====

/// Whether a run's ending may let its task run again if attempts are left: a retryable error,
/// or (TIMED) anything but a panic if it may have timed out (see [`timed_out`]).
fn retries(ty: Ty, run: &Run) -> bool {
    let timed_out = ty == Ty::Timed
        && timed_out(run, true).contains(&true)
        && run.returned != Returned::Panicked;
    run.returned == Returned::Retryable || timed_out
}

/// How much longer than the handler's own measure the pool's measure of a run may be: the
/// worker reads the clock just before the handler starts and just after it returns.
const RUN_SLACK: Duration = Duration::from_millis(5);

/// Whether a run of TIMED timed out, as far as the test can tell. The pool times a run out if
/// its token fired (the timeout, before the worker took the run back) or the run lasted the
/// timeout. So: `[true]` if the handler itself took the timeout or longer, or the token fired
/// while the handler ran with no cancel asked for and no shutdown deadline (`deadline`) to fire
/// it; `[false]` if the token never fired and the run was well short of the timeout; either if
/// the token fired only after the handler returned (a timeout late by a hair, or the heartbeat's
/// firing of a run whose ending it saw written), or the deadline may have fired it, or the run
/// came within [`RUN_SLACK`] of the timeout.
///
/// A `[false]` rests on the worker's clock readings lying within [`RUN_SLACK`] of the
/// handler's: on a machine loaded far past its cores, the worker's thread may be descheduled
/// longer than the timeout between its reading and the handler's, and the pool then rightly
/// times out a run the handler measured as quick. So a quick run is `[false]` here only as far
/// as a run can tell: [`preempted`] names the quick runs the pool evidently timed out, and
/// `check_mitigations` holds each of them to a timeout the pools counted.
fn timed_out(run: &Run, deadline: bool) -> &'static [bool] {
    if run.took >= TIMEOUT {
        return &[true];
    }
    match (run.fired(), run.fired_while_running && !deadline) {
        (false, _) if quick(run) => &[false, true],
        (true, true) => &[true],
        _ => &[true, false],
    }
}

/// A run of TIMED whose token never fired and whose handler took well under the timeout.
fn quick(run: &Run) -> bool {
    !run.fired() && run.took + RUN_SLACK < TIMEOUT
}

/// Whether the pool evidently timed out quick run `i` of `runs` (see [`timed_out`]): it did
/// not end its task though it returned `Ok` or a permanent error (another run followed), or it
/// was the last and its task ended a `TimedOut` dead letter.
fn preempted(runs: &[Run], i: usize, outcome: Option<&Outcome<u64>>) -> bool {
    let run = &runs[i];
    let ending = matches!(run.returned, Returned::Ok | Returned::Permanent);
    let timed_out_for_good = i + 1 == runs.len()
        && matches!(outcome, Some(Outcome::Failed(f)) if f.reason == FailureReason::TimedOut);
    quick(run) && ((ending && i + 1 < runs.len()) || timed_out_for_good)
}

/// Whether a task of a type with mitigations ended as its runs say: as the last one returned,
/// unless (TIMED) it timed out, which makes anything but a panic a failed attempt, never a
/// success; a failed attempt with none left is a dead letter (`Exhausted`, or `TimedOut`).
/// `deadline`: its last run was on pool A when the shutdown deadline fired the tokens there.
fn ends_as_its_runs_say(job: Job, runs: &[Run], outcome: &Outcome<u64>, deadline: bool) -> bool {
    let Some(last) = runs.last() else {
        return false;
    };
    let (n, max) = (runs.len() as u32, job.max_attempts());
    let fits = |timed_out: bool| match outcome {
        Outcome::Succeeded(output) => {
            *output == job.output() && last.returned == Returned::Ok && !timed_out
        }
        Outcome::Failed(failure) => {
            failure.attempts == n
                && match failure.reason {
                    FailureReason::Permanent => last.returned == Returned::Permanent && !timed_out,
                    FailureReason::Panicked => {
                        last.returned == Returned::Panicked && failure.error.starts_with(MARKER)
                    }
                    FailureReason::Exhausted => {
                        last.returned == Returned::Retryable && !timed_out && n == max
                    }
                    FailureReason::TimedOut => {
                        timed_out && last.returned != Returned::Panicked && n == max
                    }
                    _ => false,
                }
        }
        Outcome::Cancelled(_) => false,
    };
    match job.ty {
        Ty::Timed => timed_out(last, deadline).iter().any(|&t| fits(t)),
        _ => fits(false),
    }
}

fn check_run(
    cx: &Cx<'_>,
    rec: &Recorder,
    db: &TestDb,
    p: &Produced,
    cancels: &[CancelRecord],
    outcomes: &HashMap<TaskId, Outcome<u64>>,
    (report_a, a_closed): (&ShutdownReport, u64),
) {
    let f = cx.f;
    // A run that pool A's shutdown deadline interrupted, that did not succeed and did not run
    // past its timeout, was given back with its attempt not counted: the task's next run is
    // that attempt again. Whether a run of TIMED ran past its timeout the pool's monitor
    // decided (see `timed_out`); where the run cannot tell, the next run's attempt does. The
    // checks of attempts and leases below look at the counted runs.
    let given_back = |ty: Ty, r: &Run, next: Option<&Run>| {
        if r.token.interrupt() != Some(tasq::Interrupt::Shutdown) || r.returned == Returned::Ok {
            return false;
        }
        match (ty == Ty::Timed).then(|| timed_out(r, true)) {
            None | Some([false]) => true,
            Some([true]) => false,
            Some(_) => next.is_some_and(|n| n.attempt == r.attempt),
        }
    };
    let all_runs: HashMap<TaskId, Vec<Run>> = rec
        .runs
        .lock()
        .unwrap()
        .iter()
        .map(|(id, runs)| {
            let ty = p.tasks.get(id).map_or(Ty::Fast, |t| t.job.ty);
            let counted = runs
                .iter()
                .enumerate()
                .filter(|&(i, r)| !given_back(ty, r, runs.get(i + 1)))
                .map(|(_, r)| r.clone())
                .collect();
            (*id, counted)
        })
        .collect();
    let runs_of = |id: &TaskId| all_runs.get(id).map_or(&[][..], Vec::as_slice);
    let mut cancels_of: HashMap<TaskId, Vec<&CancelRecord>> = HashMap::new();
    cancels
        .iter()
        .for_each(|c| cancels_of.entry(c.id).or_default().push(c));
    let interrupted: HashSet<TaskId> = report_a.interrupted.iter().map(|&(id, _)| id).collect();
    let mut leases = HashSet::new();
    for (id, runs) in all_runs.iter() {
        f.check(
            p.tasks.contains_key(id),
            "a run of a task never submitted",
            || id.to_string(),
        );
        for run in runs {
            let own = run.lease.is_some_and(|lease| leases.insert(lease));
            f.check(own, "a run without a lease of its own", || {
                format!("{id}: {run:?}")
            });
            let late = run.on_a && run.start > a_closed;
            f.check(!late, "pool A ran a task after its shutdown", || {
                format!("{id}: {run:?}")
            });
        }
    }
    let sql = "SELECT id, status, attempts, max_attempts, dead, resubmitted_as, priority, \
               base_priority FROM tasq_tasks WHERE type <> 'pg-soak-tick'";
    let rows = db.client().query(sql, &[]).expect("read the rows");
    let counts = format!("{} rows, {} tasks", rows.len(), p.order.len());
    f.check(
        rows.len() == p.order.len(),
        "rows and tasks differ in number",
        || counts,
    );
    let rows: HashMap<i64, _> = rows.iter().map(|row| (row.get::<_, i64>(0), row)).collect();
    let dead_letters: HashSet<TaskId> = cx.producer.dead_letters().iter().map(|d| d.id).collect();

    for id in &p.order {
        let task = &p.tasks[id];
        let (job, runs, max) = (task.job, runs_of(id), task.job.max_attempts());
        let row = rows.get(&(id.seq() as i64));
        let Some(outcome) = outcomes.get(id) else {
            let status = row.map(|row| row.get::<_, String>(1));
            f.add("a task left unfinished", || {
                format!("{id} {job:?}: {status:?}")
            });
            continue;
        };
        let cancels = cancels_of.get(id).map_or(&[][..], Vec::as_slice);
        let deps: Vec<_> = task.deps.iter().map(|d| (d, outcomes.get(d))).collect();
        let expect = |ok: bool, kind: &'static str| {
            f.check(ok, kind, || {
                let origin = task.origin;
                format!("{id} {job:?} {origin:?}: {outcome:?}; runs {runs:?}; deps {deps:?}; cancels {cancels:?}")
            });
        };

        // The runs: attempts 1, 2, ... in turn, under increasing leases; all but the last
        // failed retryably.
        expect(
            runs.len() as u32 <= max,
            "more runs than the type's attempts",
        );
        let in_turn = runs
            .iter()
            .enumerate()
            .all(|(i, r)| r.attempt == i as u32 + 1);
        expect(in_turn, "runs' attempts are not 1, 2, 3, ...");
        for pair in runs.windows(2) {
            expect(pair[0].end < pair[1].start, "two runs of one task overlap");
            expect(
                pair[0].lease < pair[1].lease,
                "a later run has an older lease",
            );
            expect(
                retries(job.ty, &pair[0]),
                "a task ran again after a run that ended it",
            );
        }

        // Dependencies: a dependent starts only after all of them succeeded, and never runs if
        // one did not.
        for &(dep, dep_outcome) in &deps {
            let succeeded = matches!(dep_outcome, Some(Outcome::Succeeded(_)));
            let last_ok = runs_of(dep)
                .iter()
                .rev()
                .find(|r| r.returned == Returned::Ok);
            if let Some(first) = runs.first() {
                let ok = succeeded && last_ok.is_some_and(|r| r.end < first.start);
                expect(ok, "a dependent started before its dependency succeeded");
            }
            if dep_outcome.is_some() && !succeeded {
                let ok = outcome.is_cancelled() && runs.is_empty();
                expect(
                    ok,
                    "a task whose dependency did not succeed ran or was not cancelled",
                );
            }
        }

        // Cancels: an accepted one (`Cancelled`, `Signalled`) wins over the handler's result.
        let mut requested = false;
        for cancel in cancels {
            match &cancel.result {
                Ok(CancelOutcome::Cancelled) => {
                    requested = true;
                    let late = runs.iter().any(|r| r.start > cancel.after);
                    expect(!late, "a task started after a cancel said Cancelled");
                    // A handler that ran all through the call: its task was running.
                    let ran = runs
                        .iter()
                        .any(|r| r.start < cancel.before && r.end > cancel.after);
                    expect(!ran, "a cancel said Cancelled while the task ran");
                }
                Ok(CancelOutcome::Signalled) => requested = true,
                Ok(CancelOutcome::AlreadyFinished(state)) => {
                    expect(
                        *state == outcome.state(),
                        "a cancel said AlreadyFinished wrongly",
                    );
                }
                _ => expect(false, "a cancel failed"),
            }
        }
        // While it ran. (After it returned, see `Run::token`: that changes nothing.)
        for run in runs
            .iter()
            .filter(|r| r.interrupted || r.fired_while_running)
        {
            let why = requested || (run.on_a && interrupted.contains(id)) || job.ty == Ty::Timed;
            expect(
                why,
                "a token fired without a cancel, the shutdown deadline or a timeout",
            );
        }

        // The outcome fits the behaviour.
        let n = runs.len() as u32;
        let last = runs.last();
        let dep_ended = |d: &TaskId, state| {
            task.deps.contains(d) && n == 0 && outcomes.get(d).map(Outcome::state) == Some(state)
        };
        let fits = match outcome {
            Outcome::Cancelled(CancelReason::Requested) => requested,
            Outcome::Cancelled(CancelReason::DependencyFailed(d)) => {
                dep_ended(d, TaskState::Failed)
            }
            Outcome::Cancelled(CancelReason::DependencyCancelled(d)) => {
                dep_ended(d, TaskState::Cancelled)
            }
            Outcome::Cancelled(_) => false,
            _ if requested => false,
            // The types with mitigations: what the runs returned, the timeout and the attempts
            // say how it ends (the handlers follow their payloads; outages add failures).
            _ if job.ty.mitigated() => {
                let deadline = last.is_some_and(|r| r.on_a) && interrupted.contains(id);
                ends_as_its_runs_say(job, runs, outcome, deadline)
            }
            Outcome::Succeeded(output) => {
                *output == job.output()
                    && last.is_some_and(|r| r.returned == Returned::Ok)
                    && match job.kind {
                        Kind::Succeed => n == 1,
                        Kind::Transient(k) => n == k + 1,
                        Kind::PermanentOnce => n == 1 && !runs[0].first_of_seq,
                        // Run again only after an interruption (checked above).
                        Kind::Sleep(_) => true,
                        _ => false,
                    }
            }
            Outcome::Failed(failure) => {
                let (reason, attempts) = (failure.reason, failure.attempts);
                let once = attempts == 1 && n == 1;
                let exhausted = reason == FailureReason::Exhausted && attempts == max && n == max;
                let permanent = reason == FailureReason::Permanent && once;
                match job.kind {
                    Kind::Exhaust => exhausted,
                    Kind::Permanent => permanent,
                    Kind::PermanentOnce => permanent && runs[0].first_of_seq,
                    Kind::Panic => {
                        reason == FailureReason::Panicked
                            && once
                            && failure.error.starts_with(MARKER)
                    }
                    // Interrupted by the shutdown deadline on its last attempt.
                    Kind::Sleep(_) => exhausted && last.is_some_and(|r| r.interrupted),
                    _ => false,
                }
            }
        };
        expect(fits, "an outcome does not fit the task's behaviour");
        if let (Some(listed), Outcome::Failed(failure)) = (p.listed.get(id), outcome) {
            expect(
                listed == failure,
                "a dead letter's failure differs from its outcome",
            );
        }
        if let Origin::BroughtBack(old) = task.origin {
            let by_dependency = match outcomes.get(&old) {
                Some(Outcome::Cancelled(reason)) => !matches!(reason, CancelReason::Requested),
                _ => false,
            };
            expect(
                by_dependency,
                "brought back a task not cancelled by a dependency",
            );
        }

        // Its row.
        let Some(row) = row else {
            expect(false, "an accepted task has no row");
            continue;
        };
        let (status, attempts, row_max): (&str, i32, i32) = (row.get(1), row.get(2), row.get(3));
        let (dead, resubmitted_as): (bool, Option<i64>) = (row.get(4), row.get(5));
        // Aging raises `priority` and keeps the task's own in `base_priority`; it never lowers
        // a priority, nor lifts one past the ceiling.
        let (priority, base): (i16, Option<i16>) = (row.get(6), row.get(7));
        let own = i16::from(task.priority);
        let ceiling = i16::from(AGING.ceiling()).max(own);
        f.check(
            base.unwrap_or(priority) == own && (own..=ceiling).contains(&priority),
            "aging lost a task's own priority or went past the ceiling",
            || format!("{id}: priority {priority}, base {base:?}; its own is {own}"),
        );
        let dead_letter =
            outcome.is_failed() && !p.taken.contains(id) && !p.resubmitted.contains_key(id);
        let fits = status == format!("{:?}", outcome.state()).to_lowercase()
            && (attempts as u32, row_max as u32) == (n, max)
            && dead == dead_letter
            && dead_letters.contains(id) == dead_letter
            && resubmitted_as == p.resubmitted.get(id).map(|new| new.seq() as i64);
        f.check(fits, "a row disagrees with the run", || {
            let taken = p.taken.contains(id);
            format!(
                "{id}: row ({status}, attempts {attempts}/{row_max}, dead {dead}, resubmitted as \
                 {resubmitted_as:?}); {outcome:?}, {n} runs, taken {taken}, resubmitted as {:?}",
                p.resubmitted.get(id)
            )
        });
    }

    for (name, pool) in [("producer", cx.producer), ("A", cx.a), ("B", cx.b)] {
        let result = pool.check_invariants();
        f.check(result.is_ok(), "check_invariants failed", || {
            format!("{name}: {result:?}")
        });
    }

    // Totals: each pool counts what it did; together they count every task once.
    let totals: Vec<Totals> = [cx.producer, cx.a, cx.b]
        .iter()
        .map(|p| p.stats().totals)
        .collect();
    let sum = |field: fn(&Totals) -> u64| totals.iter().map(field).sum::<u64>();
    let seen = |state| outcomes.values().filter(|o| o.state() == state).count() as u64;
    // Where the cancelled tasks came from, to tell a miscount's source.
    let mut cancelled_by_origin: BTreeMap<String, u64> = BTreeMap::new();
    for (id, _) in outcomes.iter().filter(|(_, o)| o.is_cancelled()) {
        let origin = format!("{:?}", p.tasks[id].origin);
        let ran = if runs_of(id).is_empty() {
            "never ran"
        } else {
            "ran"
        };
        let origin = format!("{}, {ran}", origin.split('(').next().unwrap());
        *cancelled_by_origin.entry(origin).or_default() += 1;
    }
    // The periodic task's tasks, which no handle sees: counted from their rows.
    let ticks = |status: &str| -> u64 {
        db.client()
            .query_one(
                "SELECT count(*) FROM tasq_tasks WHERE type = 'pg-soak-tick'
                 AND ($1 = 'any' OR status = $1)",
                &[&status],
            )
            .map_or(0, |row| row.get::<_, i64>(0) as u64)
    };
    for (what, counted, seen) in [
        (
            "submitted",
            sum(|t| t.submitted),
            p.order.len() as u64 + ticks("any"),
        ),
        (
            "succeeded",
            sum(|t| t.succeeded),
            seen(TaskState::Succeeded) + ticks("succeeded"),
        ),
        (
            "failed",
            sum(|t| t.failed),
            seen(TaskState::Failed) + ticks("failed"),
        ),
        (
            "cancelled",
            sum(|t| t.cancelled),
            seen(TaskState::Cancelled) + ticks("cancelled"),
        ),
    ] {
        f.check(counted == seen, "the pools' totals do not add up", || {
            format!(
                "{what}: the pools counted {counted}, the handles saw {seen}; {totals:?}; the \
                 cancelled tasks: {cancelled_by_origin:?}"
            )
        });
    }
    // A retryable run before the last attempt is a retry, unless a cancel ended it. (Some runs
    // of TIMED may or may not have timed out: see `timed_out`.)
    let (mut retryable, mut unsure) = (0, 0);
    for (id, r) in all_runs
        .iter()
        .flat_map(|(id, runs)| runs.iter().map(move |r| (id, r)))
    {
        let job = p.tasks[id].job;
        if !retries(job.ty, r) || r.attempt >= job.max_attempts() {
            continue;
        }
        let deadline = r.on_a && interrupted.contains(id);
        match r.returned == Returned::Retryable || timed_out(r, deadline) == [true] {
            true => retryable += 1,
            false => unsure += 1,
        }
    }
    let (retried, cancelled) = (sum(|t| t.retried), seen(TaskState::Cancelled));
    let fits = retried <= retryable + unsure && retried + cancelled >= retryable;
    f.check(fits, "the retries counted do not fit the runs", || {
        format!(
            "retried {retried}, retryable runs {retryable} (and {unsure} unsure), cancelled \
             {cancelled}"
        )
    });
    for (name, t) in ["producer", "A", "B"].iter().zip(&totals) {
        let clean = t.worker_panics == 0 && t.store_errors == 0;
        f.check(clean, "engine panics or store errors", || {
            format!("{name}: {t:?}")
        });
    }
    let a = (report_a.succeeded, report_a.failed, report_a.cancelled);
    let counted = (totals[1].succeeded, totals[1].failed, totals[1].cancelled);
    f.check(
        a == counted,
        "pool A's shutdown report differs from its totals",
        || format!("{report_a:?} vs {:?}", totals[1]),
    );
}

/// What the end of the run hands to [`check_mitigations`].
struct End<'a> {
    report_a: &'a ShutdownReport,
    /// The tick when pool A's shutdown returned.
    a_closed: u64,
    /// How many outages there were.
    outages: usize,
    /// The breakers as pool B saw them at the end.
    breakers: Vec<(&'static str, BreakerState)>,
}

/// The invariants of the mitigations (see the module docs); returns what the run did with them,
/// to print.
fn check_mitigations(
    cx: &Cx<'_>,
    rec: &Recorder,
    db: &TestDb,
    p: &Produced,
    outcomes: &HashMap<TaskId, Outcome<u64>>,
    end: &End<'_>,
) -> String {
    let f = cx.f;
    let all_runs = rec.runs.lock().unwrap();
    let events = rec.events.lock().unwrap();
    let mut client = db.client();
    let runs_of = |id: &TaskId| all_runs.get(id).map_or(&[][..], Vec::as_slice);
    let runs_of_type = |ty: Ty| {
        all_runs
            .iter()
            .filter(move |(id, _)| p.tasks.get(id).is_some_and(|t| t.job.ty == ty))
            .flat_map(|(id, runs)| runs.iter().map(move |r| (*id, r)))
    };
    let pool_of = |run: &Run| if run.on_a { "pg-soak-a" } else { "pg-soak-b" };
    let mut did = Vec::new();

    // ----- LIMITED: never more than its limit at once, across both pools -----
    // The limit counts running rows. A run whose lease was lost (the reaper gave its task to a
    // new run while it still ran) is a second run of one row: the store does not count it, so
    // such runs are set aside, and the counter may exceed the limit by as many. (With a lease of
    // 10 s there are none.)
    let limited: Vec<(TaskId, &Run)> = runs_of_type(Ty::Limited).collect();
    let lost_lease = |id: &TaskId, run: &Run| {
        runs_of(id)
            .iter()
            .any(|o| o.lease > run.lease && o.start < run.end)
    };
    let most_at_once = |live_only: bool| {
        let mut steps: Vec<(u64, i64)> = Vec::new();
        for (id, run) in &limited {
            if !(live_only && lost_lease(id, run)) {
                steps.extend([(run.start, 1), (run.end, -1)]);
            }
        }
        // Ticks are unique: the order is total.
        steps.sort_unstable();
        let (mut now, mut most) = (0i64, 0i64);
        for (_, step) in steps {
            now += step;
            most = most.max(now);
        }
        most as usize
    };
    let lost = limited.iter().filter(|(id, r)| lost_lease(id, r)).count();
    let (live, overlapping) = (most_at_once(true), most_at_once(false));
    let counted = rec.limited_most.load(Ordering::SeqCst);
    let limit = LIMIT as usize;
    f.check(
        live <= limit,
        "LIMITED ran more than its limit at once",
        || format!("{live} runs at once (limit {limit}); the counter saw {counted}"),
    );
    f.check(
        counted <= limit + lost,
        "LIMITED's handlers counted more than its limit at once",
        || format!("{counted} (limit {limit}, runs whose lease was lost {lost})"),
    );
    // The runs' ticks lie inside what the counter counted: it saw every overlap they show.
    f.check(
        overlapping <= counted,
        "LIMITED's counter missed an overlap of its runs",
        || format!("the runs overlap {overlapping} at once; the counter saw {counted}"),
    );
    if limited.len() >= 300 {
        f.check(
            counted == limit,
            "LIMITED never reached its limit (not tested)",
            || format!("{counted} at once at most, in {} runs", limited.len()),
        );
    }
    did.push(format!(
        "LIMITED: {} runs, at most {counted} at once (limit {limit}), {lost} lost leases",
        limited.len()
    ));

    // ----- queue `slow`: never more than the fleet's limit at once, across both pools -----
    let slow_most = rec.slow_most.load(Ordering::SeqCst);
    f.check(
        slow_most <= SLOW_LIMIT as usize,
        "queue slow ran more than its fleet limit at once",
        || format!("{slow_most} at once (limit {SLOW_LIMIT})"),
    );
    did.push(format!(
        "queue slow: at most {slow_most} at once (fleet limit {SLOW_LIMIT})"
    ));

    // ----- RATED: at most burst + rate × t starts over any stretch t -----
    let (burst, per_second) = (f64::from(RATE.burst()), RATE.starts_per_second());
    // The largest excess over the bound of the starts at `times` (sorted), in starts.
    let excess = |times: &[f64]| {
        let mut worst = f64::NEG_INFINITY;
        for i in 0..times.len() {
            for j in i..times.len() {
                let allowed = burst + per_second * (times[j] - times[i]);
                worst = worst.max((j - i + 1) as f64 - allowed);
            }
        }
        worst
    };
    // The claims, in the order the bucket saw them: each draws one token, earned up to the
    // latest transaction time the bucket has seen (`refilled_at` only moves forward).
    let claims = client
        .query(
            // Times since the first claim: small numbers, exact to the microsecond as floats.
            "SELECT EXTRACT(EPOCH FROM tx_at - first)::FLOAT8, lease,
                    EXTRACT(EPOCH FROM at - first)::FLOAT8, EXTRACT(EPOCH FROM first)::FLOAT8
             FROM soak_claims, (SELECT min(tx_at) AS first FROM soak_claims) AS f ORDER BY seq",
            &[],
        )
        .expect("read the claims of RATED");
    let mut latest = f64::NEG_INFINITY;
    let claimed_at: Vec<f64> = claims
        .iter()
        .map(|row| {
            latest = latest.max(row.get::<_, f64>(0));
            latest
        })
        .collect();
    let by_claims = excess(&claimed_at);
    f.check(
        by_claims <= 1e-6,
        "RATED was claimed faster than its rate",
        || format!("{by_claims:.3} claims over burst + rate × t"),
    );
    // Each claim's lease, and when it was made (the database's clock: the system's).
    let first: f64 = claims.first().map_or(0.0, |row| row.get(3));
    let claimed: HashMap<i64, f64> = claims
        .iter()
        .filter_map(|row| Some((row.get::<_, Option<i64>>(1)?, row.get::<_, f64>(2))))
        .collect();
    let rated: Vec<(TaskId, &Run)> = runs_of_type(Ty::Rated).collect();
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
    };
    let mut lag = [0f64; 2];
    for (id, run) in &rated {
        let claim = run.lease.and_then(|lease| claimed.get(&lease));
        f.check(
            claim.is_some(),
            "a run of RATED whose claim the log missed",
            || format!("{id}: {run:?}"),
        );
        if let Some(&at) = claim {
            let since = (secs(run.wall) - first) - at;
            // Both read the system clock (the database's `clock_timestamp()` as it claimed).
            f.check(
                since >= -CLOCK_READING,
                "a run of RATED started before its claim",
                || format!("{id}: {:.1} ms before; {run:?}", -since * 1e3),
            );
            let lag = &mut lag[usize::from(run.on_a)];
            *lag = lag.max(since);
        }
    }
    // What the handlers saw, on the system clock. A start lags its claim: on pool B by the
    // hand-off to a free worker (a few ms at most, the tolerance), on pool A by as long as a
    // prefetched claim waits for a worker, which lets starts bunch past the bound (the bucket
    // meters claims): only B's starts are held to it.
    let starts = |on_a: Option<bool>| {
        let mut starts: Vec<f64> = rated
            .iter()
            .filter(|(_, r)| on_a.is_none_or(|a| r.on_a == a))
            .map(|(_, r)| secs(r.wall))
            .collect();
        starts.sort_by(f64::total_cmp);
        excess(&starts)
    };
    let (by_starts_b, by_starts) = (starts(Some(false)), starts(None));
    f.check(
        by_starts_b <= START_TOLERANCE,
        "RATED started on pool B faster than its rate",
        || format!("{by_starts_b:.3} starts over burst + rate × t"),
    );
    did.push(format!(
        "RATED: {} claims, {} runs; starts over burst + rate × t: claims {by_claims:.3}, starts \
         on B {by_starts_b:.3}, all starts {by_starts:.3}; claim to start at most {:.1} ms on A, \
         {:.1} ms on B",
        claims.len(),
        rated.len(),
        lag[1] * 1e3,
        lag[0] * 1e3,
    ));

    // ----- dead letters: each reported once, by the process that ended it -----
    let mut reported: HashMap<TaskId, Vec<(&str, &Event)>> = HashMap::new();
    for (pool, event, _) in events.iter() {
        if let Event::DeadLetter { id, .. } = event {
            reported.entry(*id).or_default().push((pool, event));
        }
    }
    let mut dead_letters = 0;
    for (id, outcome) in outcomes {
        let Outcome::Failed(failure) = outcome else {
            continue;
        };
        dead_letters += 1;
        let reports = reported.remove(id).unwrap_or_default();
        f.check(
            reports.len() == 1,
            "a dead letter not reported exactly once",
            || format!("{id} {failure:?}: reported {reports:?}"),
        );
        let ty = p.tasks[id].job.ty.task_type().name();
        let last_on = runs_of(id).last().map(pool_of);
        for (pool, event) in reports {
            let fits = match event {
                Event::DeadLetter {
                    task_type,
                    reason,
                    attempts,
                    error,
                    ..
                } => {
                    (*task_type, *reason, *attempts, error)
                        == (ty, failure.reason, failure.attempts, &failure.error)
                }
                _ => false,
            };
            f.check(fits, "a dead letter reported unlike its outcome", || {
                format!("{id}: {event:?} by {pool}; {failure:?}")
            });
            let by_its_process = failure.reason == FailureReason::LeaseExpired
                || last_on.is_some_and(|on| on == pool);
            f.check(
                by_its_process,
                "a dead letter reported by a pool that did not end it",
                || format!("{id}: reported by {pool}, its last run on {last_on:?}"),
            );
        }
    }
    for (id, reports) in reported {
        f.add(
            "a dead letter reported for a task that did not fail",
            || format!("{id}: {reports:?}; {:?}", outcomes.get(&id)),
        );
    }

    // ----- TIMED: stuck reports, and runs far past the timeout -----
    let timed: Vec<(TaskId, &Run)> = runs_of_type(Ty::Timed).collect();
    let mut stuck = HashSet::new();
    for (pool, event, _) in events.iter() {
        let Event::Stuck {
            id,
            task_type,
            attempt,
            running_for,
        } = event
        else {
            continue;
        };
        // An attempt given back by A's shutdown ran again on B.
        let run = runs_of(id)
            .iter()
            .find(|r| r.attempt == *attempt && pool_of(r) == *pool);
        let fits = *task_type == Ty::Timed.task_type().name()
            && *running_for >= TIMEOUT + STUCK_AFTER
            && run.is_some_and(|r| r.fired())
            && stuck.insert((*id, *attempt, *pool));
        f.check(
            fits,
            "a stuck report of no run stuck past its timeout",
            || format!("{event:?} by {pool}; the run {run:?}"),
        );
    }
    for (id, run) in &timed {
        let kind = p.tasks[id].job.kind;
        // It slept 20 timeouts on its token: the timeout had all that time to fire it.
        let overran = matches!(kind, Kind::Overrun { until, .. } if run.attempt <= until);
        f.check(
            !overran || run.fired() || run.outage,
            "a run far past its timeout was not timed out",
            || format!("{id} {kind:?}: {run:?}"),
        );
    }
    let fired = timed.iter().filter(|(_, r)| r.fired()).count();
    // Fired while the handler ran, sooner than the timeout after it started: by something else
    // (a cancel, the deadline, or a lease the heartbeat no longer found).
    let early = timed
        .iter()
        .filter(|(_, r)| r.fired_while_running && r.took < TIMEOUT)
        .count();
    let timed_out = outcomes
        .values()
        .filter(|o| matches!(o, Outcome::Failed(f) if f.reason == FailureReason::TimedOut))
        .count();
    // The quick runs the pool evidently timed out (see `timed_out`): each is a timeout the
    // pools counted.
    let timed_ids: HashSet<TaskId> = timed.iter().map(|(id, _)| *id).collect();
    let preempted_runs: usize = timed_ids
        .iter()
        .map(|id| {
            let runs = runs_of(id);
            (0..runs.len())
                .filter(|&i| preempted(runs, i, outcomes.get(id)))
                .count()
        })
        .sum();
    let counted: u64 = [cx.a, cx.b]
        .iter()
        .flat_map(|pool| pool.metrics().types)
        .filter(|t| t.backlog.task_type == Ty::Timed.task_type().name())
        .map(|t| t.runs.timed_out)
        .sum();
    f.check(
        preempted_runs as u64 <= counted,
        "a quick run timed out that no pool counted as a timeout",
        || format!("{preempted_runs} quick runs timed out, {counted} timeouts counted"),
    );
    did.push(format!(
        "TIMED: {} runs, {fired} tokens fired ({early} while running, before the timeout), \
         {timed_out} timed out for good, {preempted_runs} quick runs timed out (their worker \
         descheduled past the timeout), {} stuck reports; {dead_letters} dead letters reported",
        timed.len(),
        stuck.len()
    ));

    // ----- the breaker: its changes, in the database's order, follow its state machine -----
    let log = client
        .query(
            "SELECT name, old_state, new_state,
                    EXTRACT(EPOCH FROM tx_at - opened_at)::FLOAT8, probe_task
             FROM soak_breaker_log ORDER BY seq",
            &[],
        )
        .expect("read the breaker's log");
    let by_seq: HashMap<i64, TaskId> = p.order.iter().map(|id| (id.seq() as i64, *id)).collect();
    let mut state = "closed";
    let mut made: BTreeMap<String, usize> = BTreeMap::new();
    for (i, row) in log.iter().enumerate() {
        let (name, old, new): (&str, &str, &str) = (row.get(0), row.get(1), row.get(2));
        let change = || format!("change {i}: {name} {old} → {new}, after {state}");
        f.check(name == DOWNSTREAM, "a breaker of no downstream set", change);
        f.check(
            old == state,
            "a breaker change does not start where the last ended",
            change,
        );
        let allowed = matches!(
            (old, new),
            ("closed", "open")
                | ("open", "half_open")
                | ("open", "closed")
                | ("half_open", "open")
                | ("half_open", "closed")
        );
        f.check(
            allowed,
            "a breaker change its state machine does not allow",
            change,
        );
        if new == "half_open" {
            // Reckoned on the time the claim that took the probe reckons with.
            let since: Option<f64> = row.get(3);
            let cooled = since.is_some_and(|s| s >= BREAKER.cool_down().as_secs_f64() - 1e-6);
            f.check(cooled, "a breaker probed before its cool-down", || {
                format!("{}: {since:?} s after it opened", change())
            });
            let probe: Option<i64> = row.get(4);
            let ty = probe
                .and_then(|seq| by_seq.get(&seq))
                .map(|id| p.tasks[id].job.ty);
            f.check(
                ty.is_some_and(Ty::calls_downstream),
                "a breaker's probe is no task of its downstream",
                || format!("{}: probe {probe:?} of {ty:?}", change()),
            );
        }
        *made.entry(new.to_owned()).or_default() += 1;
        state = new;
    }
    let mut heard: BTreeMap<String, usize> = BTreeMap::new();
    for (pool, event, _) in events.iter() {
        if let Event::Breaker { downstream, state } = event {
            let name = *downstream == DOWNSTREAM;
            f.check(name, "a breaker event of no downstream set", || {
                format!("{event:?} by {pool}")
            });
            let state = match state {
                BreakerState::Closed => "closed",
                BreakerState::Open => "open",
                BreakerState::HalfOpen => "half_open",
                _ => "?",
            };
            *heard.entry(state.to_owned()).or_default() += 1;
        }
    }
    f.check(
        heard == made,
        "the hooks did not hear each breaker change once",
        || format!("heard {heard:?}; the database made {made:?}"),
    );
    let row: String = client
        .query_one(
            "SELECT state FROM tasq_gates WHERE kind = 'downstream' AND name = $1",
            &[&DOWNSTREAM],
        )
        .map(|row| row.get(0))
        .unwrap_or_default();
    let seen = end.breakers.iter().find(|(name, _)| *name == DOWNSTREAM);
    let stats = seen.map(|(_, s)| s.to_string().replace('-', "_"));
    f.check(
        row == state && stats.as_deref() == Some(state),
        "the breaker's last change is not its state",
        || format!("the log ends {state}; the row says {row}, the stats {seen:?}"),
    );
    let outage_runs = all_runs.values().flatten().filter(|r| r.outage).count();
    if outage_runs >= 50 {
        f.check(
            made.contains_key("open"),
            "the breaker never opened in the outages",
            || format!("{outage_runs} runs failed in {} outages", end.outages),
        );
    }
    did.push(format!(
        "breaker: {} outages, {outage_runs} runs failed in them; changes {made:?}",
        end.outages
    ));

    // ----- the events: no alert (none is set); pool A's hooks quiet after its shutdown -----
    for (pool, event, tick) in events.iter() {
        let alert = matches!(
            event,
            Event::AlertRaised { .. } | Event::AlertCleared { .. }
        );
        f.check(!alert, "an alert event with no alert set", || {
            format!("{event:?} by {pool}")
        });
        let late = *pool == "pg-soak-a" && *tick > end.a_closed;
        f.check(
            !late,
            "pool A's hook heard an event after its shutdown",
            || format!("{event:?}"),
        );
    }

    // ----- aging: it raised some priorities (the rows' checks: never past the ceiling) -----
    let aged: i64 = client
        .query_one(
            "SELECT count(*) FROM tasq_tasks WHERE priority > COALESCE(base_priority, priority)",
            &[],
        )
        .map(|row| row.get(0))
        .unwrap_or(0);
    if p.order.len() >= 1000 {
        f.check(aged > 0, "aging never raised a priority", || {
            format!("{} tasks", p.order.len())
        });
    }
    did.push(format!(
        "aging raised {aged} tasks; pool A's deadline interrupted {}",
        end.report_a.interrupted.len()
    ));
    did.join("\n  ")
}
