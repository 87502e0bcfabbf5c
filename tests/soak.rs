//! Soak: a long randomized run that mixes every feature at once with a SMALL retention, then
//! checks the run's invariants.
//!
//! The worst bugs found so far were interactions that no single-feature test reached (issue 7,
//! item 0: retention forgot a cancelled blocked task that a pending dependency still listed, and
//! every worker died). So one producer submits hundreds of thousands of tasks of seven types,
//! each chosen at random: succeeding, failing retryably a few
//! times then succeeding, exhausting its retries, failing permanently, failing permanently only on
//! its first run ever (so resubmitting it succeeds), panicking, sleeping on its token, or
//! submitting a follow-up task from its handler (`Context::submit`); half the retryable failures
//! ask for their own delay (`HandlerError::retry_after`); about one task in eight has attempts
//! of its own (`Task::max_attempts`, 1–6, in place of its type's; a transient one fails fewer
//! times than that), and now and then one has a retry policy or a timeout of its own
//! (`Task::retry_policy`, `Task::timeout`: a minute, which on the timed type replaces its short
//! one, so its overruns succeed); with
//! priorities, delays, run_at times and wall-clock times (`run_at_system_time`, on the manual
//! clock too; some of each in the past), dependencies on 1–3 recent, delayed,
//! failing or long-forgotten tasks, given as ids or as handles (a refusal with
//! `UnknownDependency` is an accepted, counted outcome), and idempotency keys from a small set
//! (duplicates and cross-type conflicts happen). Meanwhile the producer lists dead letters (all,
//! by type, by page), copies some of their payloads (`dead_letter_payload`, now and then with
//! the wrong type), and resubmits them (now and then with the wrong type; half the time with the
//! dependents their failure cancelled, `resubmit_with_dependents`), takes or purges them, and
//! looks up who holds a key (`find_key`); a
//! canceller thread cancels random tasks (and the ones the producer marked: blocked, delayed and
//! ordinary ones), through the pool, a handle or a key (`cancel_key`), at random moments, and
//! reads `info`; a sampler thread watches
//! `stats()`, calls `wait_empty` with a zero timeout, and pages through the tasks of a state, a
//! type, both or neither (`Pool::tasks`); the workers' start and exit hooks count themselves and
//! call back into the pool (`stats`; a submit from an exit hook); and the run ends with a `shutdown` whose deadline is drawn at random (sometimes too
//! short to drain, sometimes while the producer is still submitting). The producer waits (briefly)
//! while more than a few thousand tasks are queued, so that delays, dependencies and cancels meet
//! a live pool rather than a queue a million deep.
//!
//! The mitigations are in the mix too (issue 9), on four of the seven types: `soak-guarded`
//! calls a downstream with a circuit breaker (a small threshold, a short cool-down) and has a
//! concurrency limit; `soak-limited` has a concurrency limit of 2; `soak-rated` a rate limit
//! (generous, so the run does not stall, but the producer now and then submits a burst of one
//! limited or rated type so that the limits bind); `soak-timed` has a timeout and calls the same
//! downstream, and some of its handlers overrun it: sleeping on their token (returning an error,
//! or `Ok`, once it fires), overrunning only their first attempt, or ignoring the token past the
//! grace (`Builder::stuck_after`, small). The producer starts "outages" of the downstream now
//! and then: while one lasts, the guarded and timed handlers fail retryably, and the breaker
//! opens, probes and closes. The pool ages its ready tasks (`Builder::aging`), checks three
//! alerts, and has two `on_event` hooks: one records every event, the other now and then calls
//! back into the pool (`stats`, `status` of a dead letter).
//!
//! Two tests: `count_retention` runs on the system clock with a retention of 16–64 records and
//! no age limit; `age_retention_on_a_manual_clock` runs on a `ManualClock` that a thread keeps
//! advancing (and now and then jumps past the age limit), with an age limit of 20 ms of pool time,
//! and keeps its handlers' panics off the panic hook (`quiet_panics`).
//! Both keep few dead letters (`dead_letter_limit`).
//!
//! Checked (all violations are collected, then reported together, with the seed): every accepted
//! task's handle returns a terminal outcome after shutdown (`wait_timeout`, so a hang becomes a
//! failure; a watchdog turns any other hang into a failure too); every handle of one id (clones,
//! deduplicated submits, `pool.handle`) gives the same outcome, and a duplicate's id is one of
//! the tasks that held its key; each outcome fits what the handler was told to do and how many
//! attempts it saw (an outage's runs shift its attempts; on the timed type a run the pool timed
//! out may add attempts, never more than the pool counted timeouts); attempts never exceed the
//! task's limit (its own, else its type's) and none is skipped or repeated (a task held by a
//! gate burns none), and every run's `ctx.max_attempts()` is that limit; `info` (sampled while a
//! task lives, and at the end) shows the task's own settings, else its type's; a delayed task
//! never started before its time (for a wall-clock time, as far as the producer can bound the
//! wall clock's advance during the submit); a task
//! cancelled before it started never started afterwards; a dependent never started before every
//! dependency's handler had
//! returned `Ok` and every dependency succeeded, and a task cancelled because of a dependency
//! never ran; the totals balance (submitted = succeeded + failed + cancelled), match the handles
//! and the shutdown report; the tasks the report calls interrupted ran and ended cancelled; the
//! dead letters are failed tasks with the same failure, neither taken, purged nor resubmitted, and
//! every refusal of a resubmit fits; a copy of a dead letter's payload is the job submitted (none
//! for the wrong type), and the letter stays listed unless the dead-letter limit pushed it out
//! (then the list is full and newer); `find_key` names a task that held the key and had not
//! freed it (failed or cancelled) before the lookup, and `cancel_key` returns such a task (live,
//! or succeeded if it finds it finished), its cancel checked as any other; every page of
//! `Pool::tasks` keeps to its limit and its filter, its ids (of this pool) increase across the
//! pages, and every task listed is one the run submitted, listed with its type and settings,
//! and in a terminal state only if it ended so; the start hook ran once per worker, on its
//! thread, and, once shutdown returned, so did the exit hook (no worker is ever replaced), and
//! their calls back into the pool did no harm (the exit hook's submit is refused as shut down);
//! `stats().workers` never dropped below the configured count
//! while the run lasted and `totals.worker_panics` stayed 0; the pool never forgot an unfinished
//! task; and the engine's own `check_invariants` holds every 10,000 submits and at the end.
//!
//! And of the mitigations: no more tasks of a limited type ever ran at once than its limit (a
//! counter in the handler); the rated type's starts (handler timestamps on the pool's clock)
//! never exceeded `burst + rate × t` over any window, give or take one task per worker between
//! the gate and the handler; a run whose token fired without a cancel, or that lasted its
//! timeout on the pool's clock (the timed type's short one: with a minute of its own, a run's
//! token never fires), never counts as the task's success: the task ends `TimedOut`,
//! succeeds on a later attempt or is cancelled; every task that ended failed was reported by exactly one `DeadLetter` event with
//! its type, reason, attempts and error, and no other task was; each downstream's breaker events
//! form a path of its state machine and end in the state `stats()` shows; each alert's events
//! alternate raised, cleared (each value on the right side of its threshold); `Stuck` events
//! name timed runs (on the short timeout) past their timeout and grace, once each, and
//! `stats().stuck` is 0 at the end; the runs the metrics count per type are the runs the
//! handlers saw, and no type but the timed one counts a timeout (a minute of a task's own
//! never fires).
//!
//! `TASQ_SOAK_TASKS` sets the number of tasks per test (default 300,000); `TASQ_SOAK_SEED`
//! replays a run (the seed is printed, and named in every failure; each task's choices come from
//! the seed and its number, what the pool does with them still depends on timing).
//! `TASQ_SOAK_WATCHDOG_SECS` (default 240) bounds each test's whole run.

mod support_b;

use support_b::{Rng, mix};

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, Sender};
use tasq::{
    Aging, Alert, AlertValue, Breaker, BreakerState, CancelError, CancelOutcome, CancelReason,
    Context, Event, FailureReason, HandlerError, ManualClock, Outcome, PauseTarget, Pool,
    RateLimit, ResubmitError, RetryPolicy, ShutdownReport, SubmitErrorKind, Task, TaskFilter,
    TaskHandle, TaskId, TaskState, TaskType, TypeOptions,
};

const PANIC_MARKER: &str = "tasq soak: expected panic";

/// Pool default: three attempts, the pool-wide retry policy.
const FAST: TaskType<Job, u64> = TaskType::new("soak-fast");
const FAST_ATTEMPTS: u32 = 3;
/// Five attempts, its own (even shorter) retry policy.
const PATIENT: TaskType<Job, u64> = TaskType::new("soak-patient");
const PATIENT_ATTEMPTS: u32 = 5;
const PATIENT_RETRY: RetryPolicy =
    RetryPolicy::exponential(Duration::from_micros(10), Duration::from_micros(200));
/// The pool's retry policy: every type but the patient one takes it.
const POOL_RETRY: RetryPolicy =
    RetryPolicy::exponential(Duration::from_micros(20), Duration::from_millis(1));
/// One attempt: any error dead-letters it.
const ONCE: TaskType<Job, u64> = TaskType::new("soak-once");
const ONCE_ATTEMPTS: u32 = 1;
/// Calls [`DOWNSTREAM`] (its breaker holds it back while open), at most [`GUARDED_LIMIT`] at once.
const GUARDED: TaskType<Job, u64> = TaskType::new("soak-guarded");
const GUARDED_ATTEMPTS: u32 = 4;
const GUARDED_LIMIT: u32 = 3;
/// The workers of queue `slow`'s own lane (`Builder::queue`), out of the pool's.
const SLOW_WORKERS: usize = 1;
/// The limit on queue `metered` (`Pool::set_queue_limit`), set as the pool starts.
const METERED_LIMIT: u32 = 2;
/// At most [`LIMITED_LIMIT`] at once.
const LIMITED: TaskType<Job, u64> = TaskType::new("soak-limited");
const LIMITED_LIMIT: u32 = 2;
/// At most `RATED_BURST + RATED_PER_SECOND × t` starts over any stretch `t`.
const RATED: TaskType<Job, u64> = TaskType::new("soak-rated");
const RATED_ATTEMPTS: u32 = 2;
const RATED_PER_SECOND: f64 = 10_000.0;
const RATED_BURST: u32 = 8;
/// Runs time out after [`TIMEOUT`]; also calls [`DOWNSTREAM`] (a timeout is a failure for its
/// breaker).
const TIMED: TaskType<Job, u64> = TaskType::new("soak-timed");
const TIMED_ATTEMPTS: u32 = 3;
const TIMEOUT: Duration = Duration::from_millis(1);
/// `Builder::stuck_after`: a handler still running this long past its timeout is stuck.
const STUCK_AFTER: Duration = Duration::from_millis(1);
/// How long past its timeout and grace a `Stubborn` handler ignores its token.
const STUBBORN_EXTRA: Duration = Duration::from_millis(1);

/// Settings of a task's own (`Task::max_attempts`, `retry_policy`, `timeout`), now and then:
/// about one task in [`OWN_ATTEMPTS_ONE_IN`] has attempts of its own, 1 to [`OWN_ATTEMPTS_MAX`];
/// one in [`OWN_OTHER_ONE_IN`] the retry policy [`OWN_RETRY`], one in as many the timeout
/// [`OWN_TIMEOUT`].
const OWN_ATTEMPTS_ONE_IN: u64 = 8;
const OWN_ATTEMPTS_MAX: u64 = 6;
const OWN_OTHER_ONE_IN: u64 = 32;
const OWN_RETRY: RetryPolicy = RetryPolicy::exponential(Duration::ZERO, Duration::from_micros(50));
/// Long enough never to fire (a minute of the pool's clock): on a task of the timed type it
/// replaces [`TIMEOUT`], so that its overruns succeed and its stubborn runs are not stuck.
const OWN_TIMEOUT: Duration = Duration::from_secs(60);

/// The downstream [`GUARDED`] and [`TIMED`] call: its breaker opens after a few failures in a
/// row and probes again soon.
/// The periodic task the run mixes in: a slot every [`TICK_EVERY`], every missed one caught
/// up, paused now and then by the pauser.
const TICK: TaskType<u64, ()> = TaskType::new("soak-tick");
const TICK_EVERY: Duration = Duration::from_millis(20);

/// Plain fire-and-forget tasks with a unit output (issue 24): in a pool without lanes they run
/// from the workers' slots without the pool's lock, and succeed without a record. See
/// [`Plains`].
const PLAIN: TaskType<u64, ()> = TaskType::new("soak-plain");

const DOWNSTREAM: &str = "soak-downstream";
const BREAKER: Breaker = Breaker::new(3, Duration::from_millis(1));
/// What a guarded handler returns while the downstream is out.
const OUTAGE_ERROR: &str = "downstream outage";

/// Aging: a ready task gains a level per millisecond waited, up to the priorities most tasks
/// use (0–3).
const AGING: Aging = Aging::new(Duration::from_millis(1), 3);
/// How often the monitor checks the alerts (on the pool's clock; a check of a per-type alert
/// reads every record under the pool's lock).
const MONITOR_INTERVAL: Duration = Duration::from_millis(25);
/// The alerts: the whole backlog's depth (the producer keeps it near `BACKLOG`), the age of the
/// guarded tasks an open breaker holds, the depth of priority 0.
const ALERTS: [Alert; 3] = [
    Alert::ready_depth(ALERT_DEPTH),
    Alert::oldest_ready(ALERT_AGE).task_type(GUARDED.name()),
    Alert::ready_depth(ALERT_DEPTH_P0).priority(0),
];
const ALERT_DEPTH: usize = 3000;
const ALERT_AGE: Duration = Duration::from_millis(5);
const ALERT_DEPTH_P0: usize = 500;

/// How long the end of the run waits for one unfinished handle before calling it a hang.
const HANDLE_WAIT: Duration = Duration::from_secs(30);
/// Submits between two calls of the engine's own invariant check.
const CHECK_EVERY: u64 = 10_000;

/// A cheap hash for the test's many maps keyed by task id (SipHash made the end-of-run checks
/// of a debug build take seconds).
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdBuild = BuildHasherDefault<IdHasher>;
type IdMap<V> = HashMap<TaskId, V, IdBuild>;
type IdSet = HashSet<TaskId, IdBuild>;

// ===== the tasks =====

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Ty {
    Fast,
    Patient,
    Once,
    Guarded,
    Limited,
    Rated,
    Timed,
}

impl Ty {
    const ALL: [Ty; 7] = [
        Ty::Fast,
        Ty::Patient,
        Ty::Once,
        Ty::Guarded,
        Ty::Limited,
        Ty::Rated,
        Ty::Timed,
    ];

    fn task_type(self) -> TaskType<Job, u64> {
        match self {
            Ty::Fast => FAST,
            Ty::Patient => PATIENT,
            Ty::Once => ONCE,
            Ty::Guarded => GUARDED,
            Ty::Limited => LIMITED,
            Ty::Rated => RATED,
            Ty::Timed => TIMED,
        }
    }

    fn limit(self) -> u32 {
        match self {
            Ty::Fast | Ty::Limited => FAST_ATTEMPTS,
            Ty::Patient => PATIENT_ATTEMPTS,
            Ty::Once => ONCE_ATTEMPTS,
            Ty::Guarded => GUARDED_ATTEMPTS,
            Ty::Rated => RATED_ATTEMPTS,
            Ty::Timed => TIMED_ATTEMPTS,
        }
    }

    /// How many of its tasks may run at once.
    fn concurrency(self) -> Option<u32> {
        match self {
            Ty::Guarded => Some(GUARDED_LIMIT),
            Ty::Limited => Some(LIMITED_LIMIT),
            _ => None,
        }
    }

    /// Whether its handler calls the downstream (and fails during an outage).
    fn calls_downstream(self) -> bool {
        matches!(self, Ty::Guarded | Ty::Timed)
    }

    fn index(self) -> usize {
        Ty::ALL.iter().position(|&t| t == self).expect("in ALL")
    }

    /// Another type (for resubmits with the wrong one).
    fn other(self) -> Ty {
        Ty::ALL[(self.index() + 1) % Ty::ALL.len()]
    }

    /// Its retry policy.
    fn retry(self) -> RetryPolicy {
        match self {
            Ty::Patient => PATIENT_RETRY,
            _ => POOL_RETRY,
        }
    }

    /// Its timeout.
    fn timeout(self) -> Option<Duration> {
        (self == Ty::Timed).then_some(TIMEOUT)
    }

    /// Its queue: `slow` for the patient and once-only types (a worker of their own), `metered`
    /// for the rated one (limited to [`METERED_LIMIT`] at once), else the default one.
    fn queue(self) -> &'static str {
        match self {
            Ty::Patient | Ty::Once => "slow",
            Ty::Rated => "metered",
            _ => tasq::DEFAULT_QUEUE,
        }
    }

    /// Its queue's index in `Recorder::queue_running`, for the queues with a bound.
    fn bounded_queue(self) -> Option<usize> {
        match self.queue() {
            "slow" => Some(0),
            "metered" => Some(1),
            _ => None,
        }
    }

    fn options(self) -> TypeOptions {
        let options = TypeOptions::new()
            .max_attempts(self.limit())
            .queue(self.queue());
        match self {
            Ty::Fast | Ty::Once => options,
            Ty::Patient => options.retry_policy(PATIENT_RETRY),
            Ty::Guarded => options
                .downstream(DOWNSTREAM)
                .concurrency_limit(GUARDED_LIMIT),
            Ty::Limited => options.concurrency_limit(LIMITED_LIMIT),
            Ty::Rated => {
                options.rate_limit(RateLimit::per_second(RATED_PER_SECOND).with_burst(RATED_BURST))
            }
            Ty::Timed => options.timeout(TIMEOUT).downstream(DOWNSTREAM),
        }
    }
}

/// What a task's handler does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Succeed,
    /// Fails retryably this many attempts (always fewer than the limit), then succeeds.
    Transient(u32),
    /// Fails retryably every time: dead-lettered as exhausted.
    Exhaust,
    Permanent,
    /// Fails permanently on the first run of its payload ever, succeeds on any later run (that
    /// is, once resubmitted).
    PermanentOnce,
    Panic,
    /// Sleeps this many microseconds on its token (pool clock), then succeeds.
    Slow(u32),
    /// Submits a follow-up task (a `Succeed` of the same type) from its handler, then succeeds.
    Spawn,
    /// (Timed only.) Sleeps three timeouts on its token; a retryable error once it fires.
    Overrun,
    /// (Timed only.) Sleeps three timeouts on its token, then returns `Ok` whether it fired or not.
    OverrunOk,
    /// (Timed only.) As `Overrun` on its first attempt; succeeds at once on the others.
    OverrunOnce,
    /// (Timed only.) On its first attempt ignores its token until past the timeout and the
    /// grace (`STUCK_AFTER`), then returns `Ok`; succeeds at once on the others.
    Stubborn,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Job {
    seq: u64,
    ty: Ty,
    kind: Kind,
    /// Its settings of its own (the payload carries them, so the handler and the checks know
    /// them; a resubmit keeps them, as the pool does).
    own: Own,
}

/// A task's own settings, where it has them (its type's elsewhere).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Own {
    attempts: Option<u32>,
    retry: Option<RetryPolicy>,
    timeout: Option<Duration>,
}

impl Job {
    fn output(&self) -> u64 {
        self.seq * 2 + 1
    }

    /// How many attempts it may start: its own limit, else its type's.
    fn limit(&self) -> u32 {
        self.own.attempts.unwrap_or(self.ty.limit())
    }

    fn retry(&self) -> RetryPolicy {
        self.own.retry.unwrap_or(self.ty.retry())
    }

    fn timeout(&self) -> Option<Duration> {
        self.own.timeout.or(self.ty.timeout())
    }

    /// Whether its runs time out within the run: the timed type's short [`TIMEOUT`] applies
    /// ([`OWN_TIMEOUT`] never fires).
    fn timed(&self) -> bool {
        self.timeout() == Some(TIMEOUT)
    }

    /// The task to submit: of its type, with its own settings.
    fn task(self) -> Task<Job, u64> {
        let mut task = self.ty.task_type().task(self);
        if let Some(attempts) = self.own.attempts {
            task = task.max_attempts(attempts);
        }
        if let Some(retry) = self.own.retry {
            task = task.retry_policy(retry);
        }
        if let Some(timeout) = self.own.timeout {
            task = task.timeout(timeout);
        }
        task
    }
}

/// A task's type and what its handler does; `burst` forces the type.
fn make_job(rng: &mut Rng, seq: u64, burst: Option<Ty>) -> Job {
    let drawn = match rng.below(100) {
        0..42 => Ty::Fast,
        42..70 => Ty::Patient,
        70..82 => Ty::Once,
        82..89 => Ty::Guarded,
        89..94 => Ty::Limited,
        94..98 => Ty::Rated,
        _ => Ty::Timed,
    };
    let ty = burst.unwrap_or(drawn);
    // Settings of its own now and then; a transient job fails fewer times than its own limit.
    let own = Own {
        attempts: rng
            .chance(1, OWN_ATTEMPTS_ONE_IN)
            .then(|| 1 + rng.below(OWN_ATTEMPTS_MAX) as u32),
        retry: rng.chance(1, OWN_OTHER_ONE_IN).then_some(OWN_RETRY),
        timeout: rng.chance(1, OWN_OTHER_ONE_IN).then_some(OWN_TIMEOUT),
    };
    let limit = own.attempts.unwrap_or(ty.limit());
    let mut kind = match rng.below(1000) {
        700..820 if limit > 1 => Kind::Transient(1 + rng.below(u64::from(limit - 1)) as u32),
        820..850 => Kind::Exhaust,
        850..885 => Kind::Permanent,
        885..915 => Kind::PermanentOnce,
        915..935 => Kind::Panic,
        935..1000 => Kind::Slow(20 + rng.below(180) as u32),
        650..700 => Kind::Spawn,
        _ => Kind::Succeed,
    };
    if ty == Ty::Timed {
        kind = match rng.below(100) {
            0..2 => Kind::Overrun,
            2..4 => Kind::OverrunOk,
            4..6 => Kind::OverrunOnce,
            6..8 => Kind::Stubborn,
            // A run the pool times out may run again: its second run would succeed.
            _ if kind == Kind::PermanentOnce => Kind::Permanent,
            _ => kind,
        };
    }
    Job { seq, ty, kind, own }
}

// ===== what the handlers saw =====

#[derive(Clone, Copy, Debug)]
struct Runs {
    /// Handler calls.
    runs: u32,
    /// Highest attempt number seen.
    max_attempt: u32,
    /// Logical times of the first and the last handler start.
    first_start: u64,
    last_start: u64,
    /// When the first handler started, on the pool's clock.
    first_at: Instant,
    /// Logical time at which a handler of this task last returned `Ok`.
    last_ok: Option<u64>,
    /// A handler of this task saw its token fire.
    saw_token: bool,
    /// The last run's handler saw its token fire (before it returned).
    last_token: bool,
    /// Runs whose handler saw its token fire.
    token_runs: u32,
    /// Runs that failed because the downstream was out.
    outages: u32,
    /// The last run was one of those.
    last_outage: bool,
    /// The last run (of the timed type) returned after its timeout on the pool's clock, its
    /// token not fired yet.
    last_late: bool,
    /// A run of this task was the first run ever of its `PermanentOnce` payload (usually the
    /// first task's; a resubmit's if an outage failed every run of the first).
    first_ever: bool,
}

impl Runs {
    /// Whether the last run returned `Ok` (runs of one task never overlap).
    fn last_returned_ok(&self) -> bool {
        self.last_ok.is_some_and(|ok| ok > self.last_start)
    }
}

/// How one run went, for [`Recorder::returned`].
struct Returned {
    ok: bool,
    saw_token: bool,
    outage: bool,
    late: bool,
    first_ever: bool,
}

/// The handlers' log, sharded to keep the workers from queueing on one lock, with a logical
/// clock shared by handler starts, handler returns and cancels, to order them.
struct Recorder {
    shards: Vec<Mutex<IdMap<Runs>>>,
    clock: AtomicU64,
    /// Per payload `seq`: whether a `PermanentOnce` payload has run before.
    ran_once: Vec<AtomicBool>,
    /// The tasks `Spawn` handlers submitted.
    follow_ups: Mutex<Vec<(Job, TaskHandle<u64>)>>,
    /// The pool's clock.
    pool_clock: TestClock,
    /// The downstream is out: guarded and timed handlers fail (set by the producer).
    outage: AtomicBool,
    /// Per type (`Ty::index`): handlers running now, the most ever at once, handler runs.
    running: [AtomicU32; Ty::ALL.len()],
    most: [AtomicU32; Ty::ALL.len()],
    /// Handlers running, and the most at once, of queue `slow` (its lane of [`SLOW_WORKERS`])
    /// and of queue `metered` (its limit of [`METERED_LIMIT`]).
    queue_running: [AtomicU32; 2],
    queue_most: [AtomicU32; 2],
    type_runs: [AtomicU64; Ty::ALL.len()],
    /// When each rated handler started, on the pool's clock.
    rated_starts: Mutex<Vec<Instant>>,
    /// Runs whose `Context` showed another limit of attempts than the task's (its own, else
    /// its type's), and the first few of them.
    wrong_limits: AtomicU64,
    wrong_limit_examples: Mutex<Vec<String>>,
    /// Per type: a pause covers it now (set once `pause` returned, cleared before `resume`).
    paused: [AtomicBool; Ty::ALL.len()],
    /// Per type: handlers that started while a pause covered the type. Only tasks claimed
    /// before the pause returned may: at most one per worker per pause.
    started_paused: [AtomicU64; Ty::ALL.len()],
}

/// Counts a handler of a type as running until dropped (a panicking one too).
struct RunningGuard<'a>(&'a AtomicU32, Option<&'a AtomicU32>);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        if let Some(queue) = self.1 {
            queue.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Recorder {
    fn new(tasks: u64, pool_clock: TestClock) -> Self {
        Recorder {
            shards: (0..64).map(|_| Mutex::new(IdMap::default())).collect(),
            clock: AtomicU64::new(1),
            ran_once: (0..tasks).map(|_| AtomicBool::new(false)).collect(),
            follow_ups: Mutex::new(Vec::new()),
            pool_clock,
            outage: AtomicBool::new(false),
            running: Default::default(),
            most: Default::default(),
            type_runs: Default::default(),
            rated_starts: Mutex::new(Vec::new()),
            wrong_limits: AtomicU64::new(0),
            wrong_limit_examples: Mutex::new(Vec::new()),
            paused: Default::default(),
            started_paused: Default::default(),
            queue_running: Default::default(),
            queue_most: Default::default(),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn shard(&self, id: TaskId) -> &Mutex<IdMap<Runs>> {
        // The top bits: the multiply mixes low input bits upwards.
        &self.shards[(IdBuild::default().hash_one(id) >> 58) as usize]
    }

    /// A handler of `ty` starts: counted running, and its most at once.
    fn enter(&self, ty: Ty) -> RunningGuard<'_> {
        let index = ty.index();
        self.type_runs[index].fetch_add(1, Ordering::Relaxed);
        let now = self.running[index].fetch_add(1, Ordering::SeqCst) + 1;
        self.most[index].fetch_max(now, Ordering::SeqCst);
        let queue = ty.bounded_queue().map(|q| {
            let now = self.queue_running[q].fetch_add(1, Ordering::SeqCst) + 1;
            self.queue_most[q].fetch_max(now, Ordering::SeqCst);
            &self.queue_running[q]
        });
        RunningGuard(&self.running[index], queue)
    }

    /// A run starts (at `at` on the pool's clock); returns the outages of the task's runs
    /// before it.
    fn start(&self, id: TaskId, attempt: u32, at: Instant) -> u32 {
        let now = self.tick();
        let mut shard = self.shard(id).lock().unwrap();
        let runs = shard.entry(id).or_insert(Runs {
            runs: 0,
            max_attempt: 0,
            first_start: now,
            last_start: now,
            first_at: at,
            last_ok: None,
            saw_token: false,
            last_token: false,
            token_runs: 0,
            outages: 0,
            last_outage: false,
            last_late: false,
            first_ever: false,
        });
        runs.runs += 1;
        runs.max_attempt = runs.max_attempt.max(attempt);
        runs.last_start = now;
        // A run that panics never reports its return: it leaves these as a panic would.
        runs.last_token = false;
        runs.last_outage = false;
        runs.last_late = false;
        runs.outages
    }

    fn returned(&self, id: TaskId, run: Returned) {
        let now = self.tick();
        if let Some(runs) = self.shard(id).lock().unwrap().get_mut(&id) {
            if run.ok {
                runs.last_ok = Some(now);
            }
            runs.saw_token |= run.saw_token;
            runs.last_token = run.saw_token;
            runs.token_runs += u32::from(run.saw_token);
            runs.outages += u32::from(run.outage);
            runs.last_outage = run.outage;
            runs.last_late = run.late;
            runs.first_ever |= run.first_ever;
        }
    }

    fn get(&self, id: TaskId) -> Option<Runs> {
        self.shard(id).lock().unwrap().get(&id).copied()
    }
}

fn run_job(recorder: &Recorder, ctx: &Context, job: &Job) -> Result<u64, HandlerError> {
    // First thing: the rate limit's bound is on starts.
    let started = recorder.pool_clock.now();
    if job.ty == Ty::Rated {
        recorder.rated_starts.lock().unwrap().push(started);
    }
    if recorder.paused[job.ty.index()].load(Ordering::SeqCst) {
        recorder.started_paused[job.ty.index()].fetch_add(1, Ordering::SeqCst);
    }
    let _running = recorder.enter(job.ty);
    let outages = recorder.start(ctx.id(), ctx.attempt(), started);
    // The run knows its task's own limit (fixed at submit), else its type's.
    if ctx.max_attempts() != job.limit() {
        recorder.wrong_limits.fetch_add(1, Ordering::Relaxed);
        let mut examples = recorder.wrong_limit_examples.lock().unwrap();
        if examples.len() < 4 {
            examples.push(format!(
                "{} ({job:?}), attempt {}: ctx.max_attempts() {}",
                ctx.id(),
                ctx.attempt(),
                ctx.max_attempts()
            ));
        }
    }
    let outage = job.ty.calls_downstream() && recorder.outage.load(Ordering::SeqCst);
    // The attempt as the job's kind counts it: an outage's runs do not count.
    let attempt = ctx.attempt() - outages;
    let overrun = |ok_anyway: bool| match ctx.sleep(TIMEOUT * 3) {
        Ok(()) => Ok(job.output()),
        Err(tasq::Cancelled) if ok_anyway => Ok(job.output()),
        Err(tasq::Cancelled) => Err(HandlerError::retryable("interrupted")),
    };
    let mut first_ever = false;
    let result = match job.kind {
        _ if outage => Err(HandlerError::retryable(OUTAGE_ERROR)),
        Kind::Succeed => Ok(job.output()),
        Kind::Transient(fails) if attempt <= fails => {
            let error = HandlerError::retryable(format!("transient failure {attempt}"));
            // Half of them ask for their own retry delay, as a `Retry-After` would.
            if job.seq % 2 == 1 {
                Err(error.retry_after(Duration::from_micros(30)))
            } else {
                Err(error)
            }
        }
        Kind::Transient(_) => Ok(job.output()),
        Kind::Exhaust => Err(HandlerError::retryable("always fails")),
        Kind::Permanent => Err(HandlerError::permanent("permanent failure")),
        Kind::PermanentOnce => {
            if recorder.ran_once[job.seq as usize].swap(true, Ordering::SeqCst) {
                Ok(job.output())
            } else {
                first_ever = true;
                Err(HandlerError::permanent("first run fails"))
            }
        }
        Kind::Panic => panic!("{PANIC_MARKER} {}", job.seq),
        Kind::Slow(micros) => match ctx.sleep(Duration::from_micros(u64::from(micros))) {
            Ok(()) => Ok(job.output()),
            Err(tasq::Cancelled) => Err(HandlerError::retryable("interrupted")),
        },
        Kind::Spawn => {
            // Submitted without settings of its own.
            let child = Job {
                kind: Kind::Succeed,
                own: Own::default(),
                ..*job
            };
            match ctx.submit(job.ty.task_type().task(child)) {
                Ok(handle) => {
                    recorder.follow_ups.lock().unwrap().push((child, handle));
                    Ok(job.output())
                }
                // The pool is shutting down: the follow-up is refused, the task still succeeds.
                Err(e) if *e.kind() == SubmitErrorKind::ShutDown => Ok(job.output()),
                Err(e) => Err(HandlerError::permanent(format!("follow-up refused: {e}"))),
            }
        }
        Kind::Overrun => overrun(false),
        Kind::OverrunOk => overrun(true),
        Kind::OverrunOnce if attempt == 1 => overrun(false),
        Kind::Stubborn if attempt == 1 => {
            // Ignores the token: polls the pool's clock (a manual one moves in steps).
            let until = started + TIMEOUT + STUCK_AFTER + STUBBORN_EXTRA;
            loop {
                let now = recorder.pool_clock.now();
                if now >= until {
                    break;
                }
                match recorder.pool_clock {
                    TestClock::System => thread::sleep(until - now),
                    // The advancer's step.
                    TestClock::Manual(_) => thread::sleep(Duration::from_micros(100)),
                }
            }
            Ok(job.output())
        }
        Kind::OverrunOnce | Kind::Stubborn => Ok(job.output()),
    };
    let saw_token = ctx.is_cancelled();
    let late = job.timed()
        && !saw_token
        && recorder.pool_clock.now().saturating_duration_since(started) >= TIMEOUT;
    recorder.returned(
        ctx.id(),
        Returned {
            ok: result.is_ok(),
            saw_token,
            outage,
            late,
            first_ever,
        },
    );
    result
}

/// Keeps the expected panics' messages out of the output; every other panic (the engine's!)
/// still prints.
fn silence_expected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            if message.is_some_and(|m| m.contains(PANIC_MARKER)) {
                return;
            }
            default(info);
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic with a non-string payload".to_owned())
}

/// Runs a call into the pool from one of the test's own threads; an engine panic there (under
/// its lock, as in issue 7) becomes a finding instead of tearing the run down.
fn guarded<R>(
    findings: &Findings,
    what: impl FnOnce() -> String,
    f: impl FnOnce() -> R,
) -> Option<R> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(payload) => {
            let message = panic_message(&*payload);
            findings.add("engine panicked in a test thread", || {
                format!("{} panicked: {message}", what())
            });
            None
        }
    }
}

// ===== findings =====

/// Every violation of the run, counted by kind, with the first few of each kind spelled out.
#[derive(Default)]
struct Findings {
    inner: Mutex<FindingsInner>,
}

#[derive(Default)]
struct FindingsInner {
    by_kind: BTreeMap<&'static str, usize>,
    examples: Vec<String>,
}

impl Findings {
    fn add(&self, kind: &'static str, message: impl FnOnce() -> String) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let n = inner.by_kind.entry(kind).or_insert(0);
        *n += 1;
        if *n <= 4 && inner.examples.len() < 80 {
            let message = message();
            inner.examples.push(format!("[{kind}] {message}"));
        }
    }

    fn is_empty(&self) -> bool {
        self.inner.lock().unwrap().by_kind.is_empty()
    }

    fn summary(&self) -> String {
        let inner = self.inner.lock().unwrap();
        let mut out = String::from("violations by kind:\n");
        for (kind, n) in &inner.by_kind {
            out += &format!("  {n:>7} × {kind}\n");
        }
        out += "first examples:\n";
        for example in &inner.examples {
            out += &format!("  - {example}\n");
        }
        out
    }
}

/// The engine's own state-machine check (a hidden `Pool::check_invariants`).
fn engine_invariants(pool: &Pool, when: &str, findings: &Findings) {
    let result = guarded(
        findings,
        || format!("check_invariants ({when})"),
        || pool.check_invariants(),
    );
    if let Some(Err(broken)) = result {
        findings.add("check_invariants failed", || format!("{when}: {broken}"));
    }
}

// ===== the events =====

/// What the `on_event` hooks saw: every event, in the order delivered; and what the hook that
/// calls back into the pool found wrong there.
#[derive(Default)]
struct EventLog {
    events: Mutex<Vec<Event>>,
    callback_findings: Mutex<Vec<String>>,
    callbacks: AtomicU64,
}

/// The hook that records every event.
fn record_events(log: &Arc<EventLog>) -> impl FnMut(&Event) + Send + 'static {
    let log = Arc::clone(log);
    move |event: &Event| log.events.lock().unwrap().push(event.clone())
}

/// The hook that now and then calls back into the pool (a weak reference: the pool is built
/// after its hooks): the status of a dead letter it hears of, and `stats()`.
fn call_back(
    log: &Arc<EventLog>,
    pool: &Arc<OnceLock<Weak<Pool>>>,
) -> impl FnMut(&Event) + Send + 'static {
    let (log, pool) = (Arc::clone(log), Arc::clone(pool));
    let mut heard: u64 = 0;
    move |event: &Event| {
        heard += 1;
        if heard % 8 != 0 {
            return;
        }
        let Some(pool) = pool.get().and_then(Weak::upgrade) else {
            return;
        };
        log.callbacks.fetch_add(1, Ordering::Relaxed);
        let finding = match event {
            // Ended failed: it stays so until retention forgets it.
            Event::DeadLetter { id, .. } => match pool.status(*id) {
                None | Some(TaskState::Failed) => None,
                Some(other) => Some(format!("the dead letter {id} is {other} in status()")),
            },
            _ => {
                let stats = pool.stats();
                (stats.breakers.len() != 1 || stats.breakers[0].0 != DOWNSTREAM)
                    .then(|| format!("stats().breakers from a hook: {:?}", stats.breakers))
            }
        };
        if let Some(finding) = finding {
            log.callback_findings.lock().unwrap().push(finding);
        }
    }
}

// ===== the worker hooks =====

/// What the worker hooks saw: the index each start and each exit was called with, and what
/// their calls back into the pool found wrong.
#[derive(Default)]
struct WorkerLog {
    started: Mutex<Vec<usize>>,
    exited: Mutex<Vec<usize>>,
    findings: Mutex<Vec<String>>,
    /// Calls back into the pool from the hooks.
    callbacks: AtomicU64,
}

impl WorkerLog {
    fn finding(&self, finding: String) {
        self.findings.lock().unwrap().push(finding);
    }

    /// The pool, if it is built and still there.
    fn pool(slot: &OnceLock<Weak<Pool>>) -> Option<Arc<Pool>> {
        slot.get().and_then(Weak::upgrade)
    }

    /// Checks that a hook runs on its worker's thread, `{prefix}-{index}`.
    fn check_thread(&self, hook: &str, prefix: &str, index: usize) {
        let name = thread::current().name().map(str::to_owned);
        if name.as_deref() != Some(&format!("{prefix}-{index}")) {
            self.finding(format!(
                "the {hook} hook of worker {index} ran on thread {name:?}"
            ));
        }
    }
}

/// `on_worker_start`: counts the start; worker 0 waits (a little) for the pool to be built and
/// reads its `stats()`, the others do if it is built already.
fn worker_start(
    log: &Arc<WorkerLog>,
    slot: &Arc<OnceLock<Weak<Pool>>>,
    prefix: &'static str,
    workers: usize,
) -> impl Fn(usize) + Send + Sync + 'static {
    let (log, slot) = (Arc::clone(log), Arc::clone(slot));
    move |index| {
        log.started.lock().unwrap().push(index);
        log.check_thread("start", prefix, index);
        if index == 0 {
            let give_up = Instant::now() + Duration::from_secs(1);
            while slot.get().is_none() && Instant::now() < give_up {
                thread::sleep(Duration::from_micros(200));
            }
        }
        let Some(pool) = WorkerLog::pool(&slot) else {
            return;
        };
        log.callbacks.fetch_add(1, Ordering::Relaxed);
        match panic::catch_unwind(AssertUnwindSafe(|| pool.stats())) {
            Ok(stats) if stats.workers > workers => log.finding(format!(
                "stats() from the start hook of worker {index}: {} workers of {workers}",
                stats.workers
            )),
            Ok(_) => {}
            Err(payload) => log.finding(format!(
                "stats() from the start hook of worker {index} panicked: {}",
                panic_message(&*payload)
            )),
        }
    }
}

/// `on_worker_exit`: counts the exit (after that worker's start); now and then reads
/// `stats()` and submits a task, which the pool, closed by then, must refuse.
fn worker_exit(
    log: &Arc<WorkerLog>,
    slot: &Arc<OnceLock<Weak<Pool>>>,
    prefix: &'static str,
) -> impl Fn(usize) + Send + Sync + 'static {
    let (log, slot) = (Arc::clone(log), Arc::clone(slot));
    move |index| {
        log.check_thread("exit", prefix, index);
        if !log.started.lock().unwrap().contains(&index) {
            log.finding(format!("worker {index} exited before its start hook ran"));
        }
        log.exited.lock().unwrap().push(index);
        if index % 2 == 1 {
            return;
        }
        let Some(pool) = WorkerLog::pool(&slot) else {
            return;
        };
        log.callbacks.fetch_add(1, Ordering::Relaxed);
        let job = Job {
            seq: 0,
            ty: Ty::Fast,
            kind: Kind::Succeed,
            own: Own::default(),
        };
        let called = panic::catch_unwind(AssertUnwindSafe(|| {
            let _ = pool.stats();
            pool.submit(job.task())
                .map(|h| h.id())
                .map_err(|e| e.kind().clone())
        }));
        match called {
            Err(payload) => log.finding(format!(
                "a call back into the pool from the exit hook of worker {index} panicked: {}",
                panic_message(&*payload)
            )),
            Ok(Err(SubmitErrorKind::ShutDown)) => {}
            Ok(other) => log.finding(format!(
                "a submit from the exit hook of worker {index} (the pool closed): {other:?}"
            )),
        }
    }
}

// ===== the watchdog =====

/// Turns a hang anywhere in a test into a failure with a message: if the test has not finished
/// within its limit, it writes what it was doing to stderr (not captured by the test harness)
/// and exits the test binary.
struct Watchdog {
    done: Arc<AtomicBool>,
    phase: Arc<Mutex<String>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(
        name: &'static str,
        seed: u64,
        limit: Duration,
        last_stats: Arc<Mutex<String>>,
    ) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let phase = Arc::new(Mutex::new("starting".to_owned()));
        let thread = thread::spawn({
            let (done, phase) = (Arc::clone(&done), Arc::clone(&phase));
            move || {
                let started = Instant::now();
                while !done.load(Ordering::SeqCst) {
                    if started.elapsed() > limit {
                        let phase = phase.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        let stats = last_stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        let _ = writeln!(
                            std::io::stderr(),
                            "\nsoak {name}: WATCHDOG: the test did not finish within {limit:?} \
                             (hung?), still in phase `{phase}` (seed {seed}; replay with TASQ_SOAK_SEED={seed}).\n\
                             last stats() sample: {stats}\nexiting the test binary."
                        );
                        std::process::exit(101);
                    }
                    thread::sleep(Duration::from_millis(50));
                }
            }
        });
        Watchdog {
            done,
            phase,
            thread: Some(thread),
        }
    }

    fn phase(&self, phase: impl Into<String>) {
        *self.phase.lock().unwrap() = phase.into();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ===== the run =====

#[derive(Clone)]
enum TestClock {
    System,
    Manual(ManualClock),
}

impl TestClock {
    fn now(&self) -> Instant {
        match self {
            TestClock::System => Instant::now(),
            TestClock::Manual(clock) => clock.now(),
        }
    }
}

struct Config {
    name: &'static str,
    thread_name: &'static str,
    tasks: u64,
    seed: u64,
    workers: usize,
    retention_count: usize,
    max_age: Option<Duration>,
    dead_letter_limit: usize,
    clock: TestClock,
    /// Delays and run_at offsets are drawn below this.
    delay_max: Duration,
    /// The shutdown's timeout (on the pool's clock).
    shutdown_timeout: Duration,
    /// Shutdown begins once this many tasks were accepted (or when the producer is done).
    shutdown_after: u64,
    /// Whether queue `slow` has a lane of [`SLOW_WORKERS`] of its own. A pool with lanes runs
    /// no task direct (every type is gated by its lane): the run without them mixes the direct
    /// runs of plain tasks (`src/store/memory/slots.rs`) with everything else.
    lanes: bool,
}

/// An accepted task, as the producer knows it.
struct Accepted {
    job: Job,
    deps: Vec<TaskId>,
    key: Option<String>,
    /// The dead letter this task resubmits.
    resubmit_of: Option<TaskId>,
    handle: TaskHandle<u64>,
    /// A delayed task's earliest start, on the pool's clock, as the producer can bound it.
    not_before: Option<Instant>,
}

/// What the producer hands the canceller.
struct Msg {
    id: TaskId,
    job: Job,
    key: Option<String>,
    handle: TaskHandle<u64>,
    /// Cancel this one soon (a blocked, delayed or ordinary task picked by the producer).
    cancel_soon: bool,
}

#[derive(Debug)]
enum CancelResult {
    Done(CancelOutcome),
    /// `UnknownTask` (forgotten) or another error (a finding).
    Refused,
    Panicked,
}

#[derive(Debug)]
struct CancelRecord {
    id: TaskId,
    /// Logical times just before the call and just after it returned.
    before: u64,
    after: u64,
    /// `pool.status(id)` just before the call (`None` for a cancel by key).
    seen: Option<TaskState>,
    result: CancelResult,
    /// A cancel by key (`cancel_key`) that returned `id`.
    by_key: Option<String>,
}

#[derive(Default, Debug)]
struct Counters {
    accepted: u64,
    deduplicated: u64,
    unknown_dependency: u64,
    key_conflict: u64,
    refused_shut_down: u64,
    resubmitted: u64,
    /// Dependents brought back by `resubmit_with_dependents`.
    brought_back: u64,
    /// Of those, the ones that finished and were forgotten before the test got a handle.
    brought_back_unseen: u64,
    /// Tasks submitted by handlers (`Kind::Spawn`).
    followed_up: u64,
    resubmit_refused: BTreeMap<&'static str, u64>,
    taken: u64,
    purged: u64,
    with_dependencies: u64,
    delayed: u64,
    /// Outages of the downstream the producer started.
    outages: u64,
    /// Bursts of one limited or rated type.
    bursts: u64,
    /// Tasks with settings of their own (any of them), and with attempts of their own.
    own_settings: u64,
    own_attempts: u64,
    /// Delayed tasks due at a wall-clock time (`run_at_system_time`), in the future or past.
    system_time: u64,
    /// Dead letters' payloads copied (`dead_letter_payload`), and asked for with the wrong type.
    payloads_copied: u64,
    payloads_wrong_type: u64,
    /// `find_key` lookups that named a holder, and that named none.
    keys_found: u64,
    keys_not_found: u64,
}

/// The producer's results.
struct Produced {
    tasks: IdMap<Accepted>,
    /// Handles of deduplicated submits: (id, handle).
    extra_handles: Vec<(TaskId, TaskHandle<u64>)>,
    dead: DeadLetterLog,
    counters: Counters,
    /// Every task that held (or may have held) each key.
    ids_with_key: HashMap<String, Vec<TaskId>>,
}

struct Shared<'a> {
    pool: &'a Pool,
    ticks: &'a Ticks,
    plains: &'a Plains,
    recorder: &'a Recorder,
    findings: &'a Findings,
    /// Set just before the shutdown is triggered.
    shutting_down: &'a AtomicBool,
    /// Set once the producer, canceller and shutdown are done: stops the sampler and advancer.
    stop: &'a AtomicBool,
    last_stats: &'a Mutex<String>,
    /// Set by the sampler once a worker is gone: the producer stops waiting for the backlog.
    workers_lost: &'a AtomicBool,
    /// The pool's `dead_letter_limit`.
    dead_letter_limit: usize,
}

fn produce(
    sh: &Shared<'_>,
    cfg: &Config,
    msgs: Sender<Msg>,
    trigger: &Sender<()>,
    watchdog: &Watchdog,
) -> Produced {
    let (pool, findings) = (sh.pool, sh.findings);
    // The dead-letter step's draws depend on what the pool lists: its own stream, so that they
    // do not shift the tasks' choices.
    let mut dead_rng = Rng(mix(cfg.seed ^ 0xDEAD));
    // So do outages and bursts: they span many tasks.
    let mut spans_rng = Rng(mix(cfg.seed ^ 0xB0257));
    // And the lookups of keys.
    let mut keys_rng = Rng(mix(cfg.seed ^ 0x4E75));
    // And the plain tasks.
    let mut plain_rng = Rng(mix(cfg.seed ^ 0x9A1B));
    let mut outage_left: u64 = 0;
    let mut burst: Option<(Ty, u64)> = None;
    let mut tasks: IdMap<Accepted> =
        IdMap::with_capacity_and_hasher(cfg.tasks as usize * 11 / 10, IdBuild::default());
    let mut extra_handles = Vec::new();
    let mut dead = DeadLetterLog::default();
    let mut c = Counters::default();
    let mut ids_with_key: HashMap<String, Vec<TaskId>> = HashMap::new();
    // The keys of `ids_with_key`, to draw from.
    let mut keys: Vec<String> = Vec::new();
    // Rings of ids to depend on, cancel and resubmit.
    let mut recent: VecDeque<TaskId> = VecDeque::with_capacity(33);
    let mut waiting: VecDeque<TaskId> = VecDeque::with_capacity(17);
    let mut old: Vec<TaskId> = Vec::with_capacity(4096);
    let mut failing: VecDeque<TaskId> = VecDeque::with_capacity(65);
    let mut shutdown_sent = false;
    let send_trigger = |sent: &mut bool| {
        if !*sent {
            *sent = true;
            sh.shutting_down.store(true, Ordering::SeqCst);
            let _ = trigger.try_send(());
        }
    };
    let push_ring = |ring: &mut VecDeque<TaskId>, id: TaskId, cap: usize| {
        if ring.len() == cap {
            ring.pop_front();
        }
        ring.push_back(id);
    };

    for seq in 0..cfg.tasks {
        // Each task's choices come from its own stream: the same for a seed whatever the timing
        // (which ids they pick among still depends on what the pool did).
        let mut rng = Rng(mix(cfg.seed ^ mix(seq)));
        if seq % CHECK_EVERY == 0 && seq > 0 {
            watchdog.phase(format!("producing: {seq} of {} submits", cfg.tasks));
            engine_invariants(pool, &format!("after {seq} submits"), findings);
        }
        if c.accepted >= cfg.shutdown_after {
            send_trigger(&mut shutdown_sent);
        }
        if seq % 256 == 0 {
            wait_for_backlog(sh);
        }
        sh.plains.step(pool, &mut plain_rng, seq);

        // Now and then: resubmit, or take, a dead letter.
        if rng.chance(1, 150) {
            dead_letter_step(
                sh,
                &mut dead_rng,
                &mut tasks,
                &mut dead,
                &mut c,
                &mut ids_with_key,
                &mut failing,
                &msgs,
                shutdown_sent,
            );
        }

        // Now and then: who holds a key?
        if !keys.is_empty() && keys_rng.chance(1, 32) {
            let key = &keys[keys_rng.below(keys.len() as u64) as usize];
            find_key_step(sh, key, &tasks, &ids_with_key, &mut c);
        }

        // The downstream goes out for a few hundred submits now and then: the guarded and
        // timed handlers fail meanwhile, and the breaker opens, probes and closes.
        if outage_left > 0 {
            outage_left -= 1;
            if outage_left == 0 {
                sh.recorder.outage.store(false, Ordering::SeqCst);
            }
        } else if spans_rng.chance(1, 4000) {
            outage_left = 100 + spans_rng.below(500);
            c.outages += 1;
            sh.recorder.outage.store(true, Ordering::SeqCst);
        }
        // A burst of one limited type, back to back: the limits bind.
        let forced = match &mut burst {
            Some((ty, left)) if *left > 0 => {
                *left -= 1;
                Some(*ty)
            }
            _ => None,
        };
        if forced.is_none() && spans_rng.chance(1, 1500) {
            let ty = [Ty::Limited, Ty::Rated][spans_rng.below(2) as usize];
            burst = Some((ty, 16 + spans_rng.below(48)));
            c.bursts += 1;
        }
        let job = make_job(&mut rng, seq, forced);
        let mut task = job.task();
        task = task.priority(match rng.below(20) {
            0 => u8::MAX,
            1 => rng.below(256) as u8,
            n => (n % 4) as u8,
        });
        let now = sh_now(cfg);
        let mut waits = false;
        // The earliest start the submit allows, as far as the producer can tell.
        let mut not_before = None;
        // A wall-clock time, and how far ahead of the wall clock it was set: its earliest
        // start is bounded once the submit returned.
        let mut system_at: Option<(SystemTime, Duration)> = None;
        match rng.below(100) {
            0..8 => {
                let delay = rng.duration_below(cfg.delay_max);
                task = task.delay(delay);
                not_before = Some(now + delay);
                waits = true;
            }
            8..11 => {
                let at = now + rng.duration_below(cfg.delay_max);
                task = task.run_at(at);
                not_before = Some(at);
                waits = true;
            }
            11..13 => {
                // As far ahead of the pool's clock as of the wall clock (docs of
                // `run_at_system_time`; on the manual clock too).
                let ahead = rng.duration_below(cfg.delay_max);
                let wall = SystemTime::now();
                task = task.run_at_system_time(wall + ahead);
                system_at = Some((wall, ahead));
                waits = true;
            }
            13 => task = task.run_at(now.checked_sub(Duration::from_millis(1)).unwrap_or(now)),
            // A wall-clock time in the past: now.
            14 => task = task.run_at_system_time(SystemTime::UNIX_EPOCH),
            _ => {}
        }
        let mut deps = Vec::new();
        let mut deps_as_handles = false;
        if rng.chance(1, 5) && !recent.is_empty() {
            for _ in 0..1 + rng.below(3) {
                let pick = match rng.below(10) {
                    0..4 => recent[rng.below(recent.len() as u64) as usize],
                    4..7 if !waiting.is_empty() => {
                        waiting[rng.below(waiting.len() as u64) as usize]
                    }
                    7 if !failing.is_empty() => failing[rng.below(failing.len() as u64) as usize],
                    _ if !old.is_empty() => old[rng.below(old.len() as u64) as usize],
                    _ => recent[rng.below(recent.len() as u64) as usize],
                };
                deps.push(pick);
            }
            // As ids, or as handles (a forgotten dependency that a handle shows succeeded is
            // satisfied).
            deps_as_handles = rng.chance(1, 2);
            if deps_as_handles {
                let handles: Vec<&TaskHandle<u64>> =
                    deps.iter().map(|d| &tasks[d].handle).collect();
                task = task.after(handles);
            } else {
                task = task.after(deps.iter().copied());
            }
            waits = true;
        }
        let key = if rng.chance(6, 100) {
            Some(format!("{}-{}", job.ty.task_type().name(), rng.below(48)))
        } else if rng.chance(1, 200) {
            // Shared by every type: conflicts happen.
            Some(format!("shared-{}", rng.below(4)))
        } else {
            None
        };
        if let Some(key) = &key {
            task = task.key(key.clone());
        }
        let cancel_soon = if !deps.is_empty() {
            rng.chance(15, 100)
        } else if waits {
            rng.chance(10, 100)
        } else {
            rng.chance(2, 100)
        };

        let submitted = guarded(
            findings,
            || format!("submit of {job:?} after {deps:?}"),
            || pool.submit(task),
        );
        if let Some((wall, ahead)) = system_at {
            // The pool's due time is its clock at the submit (not before `now`) plus `ahead`
            // less the wall clock's advance from `wall` to the submit (at most to here).
            let slack = SystemTime::now().duration_since(wall).ok();
            not_before = slack
                .filter(|&slack| slack < ahead)
                .map(|slack| now + (ahead - slack));
        }
        let Some(submitted) = submitted else { continue };
        match submitted {
            Ok(handle) => {
                let id = handle.id();
                if handle.is_duplicate() != tasks.contains_key(&id) {
                    findings.add("is_duplicate() is wrong", || {
                        format!(
                            "{job:?} with key {key:?} got {id}, is_duplicate() {}, known {}",
                            handle.is_duplicate(),
                            tasks.contains_key(&id)
                        )
                    });
                }
                if tasks.contains_key(&id) {
                    // Deduplicated by its key: the handle must be that of a task that held it.
                    c.deduplicated += 1;
                    match &key {
                        None => findings
                            .add("a submit without a key returned a known task", || {
                                format!("{job:?} got {id} ({:?})", tasks[&id].job)
                            }),
                        Some(key) => {
                            if !ids_with_key.get(key).is_some_and(|ids| ids.contains(&id)) {
                                findings.add(
                                    "a duplicate matched a task that never held its key",
                                    || {
                                        format!(
                                            "key {key:?} returned {id}; holders: {:?}",
                                            ids_with_key.get(key)
                                        )
                                    },
                                );
                            }
                        }
                    }
                    extra_handles.push((id, handle));
                    continue;
                }
                c.accepted += 1;
                if !deps.is_empty() {
                    c.with_dependencies += 1;
                }
                if waits {
                    c.delayed += 1;
                    push_ring(&mut waiting, id, 16);
                }
                c.system_time += u64::from(system_at.is_some());
                c.own_settings += u64::from(job.own != Own::default());
                c.own_attempts += u64::from(job.own.attempts.is_some());
                push_ring(&mut recent, id, 32);
                if old.len() < 4096 {
                    old.push(id);
                } else {
                    old[(c.accepted % 4096) as usize] = id;
                }
                if matches!(
                    job.kind,
                    Kind::Exhaust
                        | Kind::Permanent
                        | Kind::PermanentOnce
                        | Kind::Panic
                        | Kind::Overrun
                        | Kind::OverrunOk
                ) {
                    push_ring(&mut failing, id, 64);
                }
                if let Some(key) = &key {
                    let holders = ids_with_key.entry(key.clone()).or_default();
                    if holders.is_empty() {
                        keys.push(key.clone());
                    }
                    holders.push(id);
                }
                let _ = msgs.send(Msg {
                    id,
                    job,
                    key: key.clone(),
                    handle: handle.clone(),
                    cancel_soon,
                });
                tasks.insert(
                    id,
                    Accepted {
                        job,
                        deps,
                        key,
                        resubmit_of: None,
                        handle,
                        not_before,
                    },
                );
            }
            Err(refused) => {
                let kind = refused.kind().clone();
                let back = refused.into_task().into_payload();
                if back != job {
                    findings.add("a refused submit handed back another payload", || {
                        format!("{job:?} came back as {back:?}")
                    });
                }
                match kind {
                    SubmitErrorKind::UnknownDependency(dep) => {
                        c.unknown_dependency += 1;
                        if !deps.contains(&dep) {
                            findings.add("UnknownDependency names a task not depended on", || {
                                format!("{dep} not in {deps:?}")
                            });
                        } else if let Some(acc) = tasks.get(&dep) {
                            // Forgotten is fine, but only once finished; and given as a handle,
                            // only if it did not succeed.
                            match acc.handle.try_wait() {
                                None => findings.add(
                                    "a dependency was forgotten before it finished",
                                    || {
                                        format!(
                                            "{dep} ({:?}) refused as unknown, handle says {}",
                                            acc.job,
                                            acc.handle.status()
                                        )
                                    },
                                ),
                                Some(outcome) if deps_as_handles && outcome.is_succeeded() => {
                                    findings.add(
                                        "a forgotten dependency given as a succeeded handle was refused",
                                        || format!("{dep} ({:?}): {outcome:?}", acc.job),
                                    )
                                }
                                Some(_) => {}
                            }
                        }
                    }
                    SubmitErrorKind::KeyConflict {
                        key: k,
                        existing,
                        existing_type,
                    } => {
                        c.key_conflict += 1;
                        let holders = ids_with_key.get(&k);
                        if Some(&k) != key.as_ref()
                            || !holders.is_some_and(|ids| ids.contains(&existing))
                            || existing_type == job.ty.task_type().name()
                        {
                            findings.add("a key conflict that does not fit", || {
                                format!("{job:?} with key {key:?}: conflict on {k:?} with {existing} of `{existing_type}`; holders {holders:?}")
                            });
                        }
                    }
                    SubmitErrorKind::ShutDown => {
                        c.refused_shut_down += 1;
                        if !shutdown_sent {
                            findings.add("submit refused as shut down before any shutdown", || {
                                format!("{job:?}")
                            });
                        }
                        break;
                    }
                    other => findings.add("an unexpected submit error", || {
                        format!("{job:?}: {other:?}")
                    }),
                }
            }
        }
    }
    send_trigger(&mut shutdown_sent);
    // The downstream is back for the drain.
    sh.recorder.outage.store(false, Ordering::SeqCst);
    Produced {
        tasks,
        extra_handles,
        dead,
        counters: c,
        ids_with_key,
    }
}

/// Looks up who holds `key` (`find_key`): a task that held it, and not one that had freed it
/// (failed or cancelled) before the lookup. Every task that takes a key is the producer's, so
/// `ids_with_key` knows them all.
fn find_key_step(
    sh: &Shared<'_>,
    key: &str,
    tasks: &IdMap<Accepted>,
    ids_with_key: &HashMap<String, Vec<TaskId>>,
    c: &mut Counters,
) {
    let holders = ids_with_key.get(key).map_or(&[][..], Vec::as_slice);
    // Ended failed or cancelled before the lookup: their key was free by then.
    let freed: Vec<TaskId> = holders
        .iter()
        .copied()
        .filter(|id| {
            tasks.get(id).is_some_and(|acc| {
                acc.handle
                    .try_wait()
                    .is_some_and(|o| o.is_failed() || o.is_cancelled())
            })
        })
        .collect();
    let Some(found) = guarded(
        sh.findings,
        || format!("find_key({key:?})"),
        || sh.pool.find_key(key),
    ) else {
        return;
    };
    let Some(id) = found else {
        c.keys_not_found += 1;
        return;
    };
    c.keys_found += 1;
    if !holders.contains(&id) {
        sh.findings
            .add("find_key named a task that never held the key", || {
                format!("{key:?}: {id}; holders {holders:?}")
            });
    } else if freed.contains(&id) {
        sh.findings.add(
            "find_key named a task that had freed the key (failed or cancelled)",
            || {
                format!(
                    "{key:?}: {id}, {:?}",
                    tasks.get(&id).and_then(|a| a.handle.try_wait())
                )
            },
        );
    }
}

/// Tasks not yet started above which the producer waits a little: without it, it outruns the
/// workers, the queue grows hundreds of thousands deep, delays stop mattering and the cancels
/// only ever find ready tasks.
const BACKLOG: usize = 4096;

/// Waits (at most 100 ms) for the backlog to shrink below [`BACKLOG`]; not at all once a
/// worker is gone (the backlog may never shrink then).
fn wait_for_backlog(sh: &Shared<'_>) {
    let give_up = Instant::now() + Duration::from_millis(100);
    while !sh.workers_lost.load(Ordering::SeqCst) && Instant::now() < give_up {
        let Some(stats) = guarded(sh.findings, || "stats()".to_owned(), || sh.pool.stats()) else {
            return;
        };
        if stats.blocked + stats.scheduled + stats.ready <= BACKLOG {
            return;
        }
        thread::sleep(Duration::from_micros(200));
    }
}

/// What the periodic task did: the slots its payload function made (in microseconds since the
/// epoch), the slots its handler ran, and the payloads made while the pauser held it paused.
#[derive(Default)]
struct Ticks {
    made: Mutex<Vec<u64>>,
    ran: Mutex<Vec<u64>>,
    paused: AtomicBool,
    made_while_paused: AtomicU64,
}

impl Ticks {
    fn schedule(ticks: &Arc<Ticks>) -> tasq::Schedule {
        let ticks = Arc::clone(ticks);
        tasq::Schedule::every("soak-tick", TICK_EVERY, TICK, move |slot| {
            if ticks.paused.load(Ordering::SeqCst) {
                ticks.made_while_paused.fetch_add(1, Ordering::SeqCst);
            }
            let micros = slot
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64;
            ticks.made.lock().unwrap().push(micros);
            micros
        })
        .missed(tasq::Missed::CatchUp(tasq::MAX_CATCH_UP))
    }

    /// Every slot made once, none skipped (catch-up), none while paused, each run at most once
    /// and only if made; returns how many were made.
    fn check(&self, findings: &Findings) -> u64 {
        let made = self.made.lock().unwrap().clone();
        let step = TICK_EVERY.as_micros() as u64;
        if let Some(pair) = made.windows(2).find(|w| w[1] != w[0] + step) {
            findings.add("a schedule's slots were skipped or made twice", || {
                format!(
                    "{} then {} (every {step} us); {} made",
                    pair[0],
                    pair[1],
                    made.len()
                )
            });
        }
        let while_paused = self.made_while_paused.load(Ordering::SeqCst);
        if while_paused > 0 {
            findings.add("a paused schedule made slots", || {
                format!("{while_paused} made")
            });
        }
        let mut ran = self.ran.lock().unwrap().clone();
        ran.sort_unstable();
        let made_set: HashSet<u64> = made.iter().copied().collect();
        if ran.windows(2).any(|w| w[0] == w[1]) || ran.iter().any(|r| !made_set.contains(r)) {
            findings.add("a schedule's slot ran twice, or ran unmade", || {
                format!("{} ran of {} made", ran.len(), made.len())
            });
        }
        println!(
            "soak ticks: {} slots made, {} ran, {while_paused} made while paused",
            made.len(),
            ran.len()
        );
        made.len() as u64
    }
}

/// The plain tasks the producer mixes in with the others (one step in three submits one): it
/// keeps half their handles and drops the others at once, looks a kept one up by id now and
/// then (a lookup must never lose a task that has not finished: a pool forgets only finished
/// ones), and cancels a few. At the end each ran at most once, a kept one that succeeded ran
/// exactly once, and none failed.
#[derive(Default)]
struct Plains {
    /// Runs of each plain task, by its number.
    runs: Mutex<HashMap<u64, u32>>,
    kept: Mutex<Vec<(u64, TaskHandle<()>)>>,
    /// Every plain task's id, for the pages of `tasks()`.
    ids: Mutex<IdSet>,
    submitted: AtomicU64,
    dropped: AtomicU64,
    lookups: AtomicU64,
    cancels: AtomicU64,
    /// Lookups that found nothing of a task whose handle had not finished.
    lost: Mutex<Vec<String>>,
    /// Refusals other than a shutdown's.
    refused: Mutex<Vec<String>>,
}

/// What the plain tasks added to the books (see [`check`]).
#[derive(Default, Debug)]
struct PlainBooks {
    submitted: u64,
    /// Handles dropped at once: their outcomes are in the totals only.
    unseen: u64,
    succeeded: u64,
    failed: u64,
    cancelled: u64,
    ids: IdSet,
    /// The kept handles' tasks whose outcome is not a cancel (an interrupted task's must be).
    not_cancelled: IdSet,
}

impl Plains {
    fn ran(&self, n: u64) {
        *self.runs.lock().unwrap().entry(n).or_default() += 1;
    }

    /// One step of the producer's: maybe a submit, maybe a lookup or a cancel.
    fn step(&self, pool: &Pool, rng: &mut Rng, n: u64) {
        if rng.below(3) == 0 {
            match pool.submit(PLAIN.task(n)) {
                Ok(handle) => {
                    self.submitted.fetch_add(1, Ordering::SeqCst);
                    self.ids.lock().unwrap().insert(handle.id());
                    if rng.below(2) == 0 {
                        self.kept.lock().unwrap().push((n, handle));
                    } else {
                        drop(handle);
                        self.dropped.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Err(error) if *error.kind() == SubmitErrorKind::ShutDown => {}
                Err(error) => self.refused.lock().unwrap().push(error.to_string()),
            }
        }
        let pick = rng.below(16);
        if pick > 1 {
            return;
        }
        let kept = self.kept.lock().unwrap();
        let Some((n, handle)) = kept.get(rng.below(kept.len().max(1) as u64) as usize) else {
            return;
        };
        let id = handle.id();
        if pick == 0 {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            let status = pool.status(id);
            let info = pool.info(id);
            // Forgotten only once finished, and a handle's outcome never goes.
            if (status.is_none() || info.is_none()) && !handle.is_finished() {
                self.lost.lock().unwrap().push(format!(
                    "plain {n} ({id}): status {status:?}, info {}, unfinished",
                    info.is_some()
                ));
            }
            if let Some(info) = info.filter(|info| info.task_type != PLAIN.name()) {
                self.lost
                    .lock()
                    .unwrap()
                    .push(format!("plain {n} ({id}): {info:?}"));
            }
        } else {
            self.cancels.fetch_add(1, Ordering::SeqCst);
            let _ = pool.cancel(id);
        }
    }

    /// The end-of-run checks; what the plain tasks add to the totals.
    fn check(&self, findings: &Findings) -> PlainBooks {
        let runs = self.runs.lock().unwrap().clone();
        if let Some((n, times)) = runs.iter().find(|&(_, &times)| times > 1) {
            findings.add("a plain task ran more than once", || {
                format!("plain {n}: {times} runs")
            });
        }
        let mut books = PlainBooks {
            submitted: self.submitted.load(Ordering::SeqCst),
            unseen: self.dropped.load(Ordering::SeqCst),
            ids: std::mem::take(&mut *self.ids.lock().unwrap()),
            ..PlainBooks::default()
        };
        for (n, handle) in self.kept.lock().unwrap().iter() {
            let ran = runs.get(n).copied().unwrap_or(0);
            let outcome = handle.wait_timeout(HANDLE_WAIT);
            if !outcome.as_ref().is_some_and(Outcome::is_cancelled) {
                books.not_cancelled.insert(handle.id());
            }
            match outcome {
                Some(Outcome::Succeeded(())) if ran == 1 => books.succeeded += 1,
                Some(Outcome::Cancelled(_)) if ran <= 1 => books.cancelled += 1,
                outcome => {
                    books.failed += u64::from(matches!(outcome, Some(Outcome::Failed(_))));
                    findings.add("a plain task's outcome does not fit its runs", || {
                        format!("plain {n} ({}): {outcome:?} after {ran} runs", handle.id())
                    });
                }
            }
        }
        for lost in self.lost.lock().unwrap().iter().take(1) {
            findings.add("a lookup lost a plain task", || lost.clone());
        }
        for refused in self.refused.lock().unwrap().iter().take(1) {
            findings.add("a plain task was refused", || refused.clone());
        }
        println!(
            "soak plain tasks: {} submitted, {} handles dropped at once, {} lookups, {} cancels; \
             kept: {} succeeded, {} cancelled",
            books.submitted,
            books.unseen,
            self.lookups.load(Ordering::SeqCst),
            self.cancels.load(Ordering::SeqCst),
            books.succeeded,
            books.cancelled
        );
        books
    }
}

/// What the pauser did: pauses made (each returned `Ok(true)`), and refusals it did not expect.
#[derive(Default, Debug)]
struct Pausing {
    pauses: u64,
    wrong: Vec<String>,
}

/// Pauses a type or queue now and then while the producer runs, for a few milliseconds each,
/// marking the types it covers in the recorder while it is in force; every pause is resumed
/// before it returns (and no later than the shutdown's start).
fn pause_randomly(sh: &Shared<'_>, mut rng: Rng) -> Pausing {
    let targets: [(PauseTarget, Vec<Ty>); 5] = [
        (PauseTarget::schedule("soak-tick"), vec![]),
        (
            PauseTarget::queue(tasq::DEFAULT_QUEUE),
            Ty::ALL
                .into_iter()
                .filter(|t| t.queue() == tasq::DEFAULT_QUEUE)
                .collect(),
        ),
        (
            PauseTarget::queue("slow"),
            Ty::ALL
                .into_iter()
                .filter(|t| t.queue() == "slow")
                .collect(),
        ),
        (PauseTarget::task_type(RATED.name()), vec![Ty::Rated]),
        (PauseTarget::task_type(LIMITED.name()), vec![Ty::Limited]),
    ];
    let mut pausing = Pausing::default();
    let done = || sh.shutting_down.load(Ordering::SeqCst) || sh.stop.load(Ordering::SeqCst);
    while !done() {
        // Load, not synchronisation: the pool runs unpaused for a while.
        thread::sleep(rng.duration_below(Duration::from_millis(30)));
        if done() {
            break;
        }
        let (target, covered) = &targets[rng.below(targets.len() as u64) as usize];
        match sh.pool.pause(target.clone()) {
            Ok(true) => pausing.pauses += 1,
            other => pausing.wrong.push(format!("pause({target}) = {other:?}")),
        }
        let schedule = matches!(target, PauseTarget::Schedule(_));
        if schedule {
            sh.ticks.paused.store(true, Ordering::SeqCst);
        }
        for ty in covered {
            sh.recorder.paused[ty.index()].store(true, Ordering::SeqCst);
        }
        thread::sleep(rng.duration_below(Duration::from_millis(15)));
        for ty in covered {
            sh.recorder.paused[ty.index()].store(false, Ordering::SeqCst);
        }
        sh.ticks.paused.store(false, Ordering::SeqCst);
        match sh.pool.resume(target.clone()) {
            Ok(true) => {}
            other => pausing.wrong.push(format!("resume({target}) = {other:?}")),
        }
    }
    match sh.pool.paused() {
        Ok(left) if left.is_empty() => {}
        other => pausing
            .wrong
            .push(format!("paused() at the end = {other:?}")),
    }
    pausing
}

fn sh_now(cfg: &Config) -> Instant {
    cfg.clock.now()
}

/// Acts on a dead letter: resubmits it (now and then with the wrong type), takes its payload, or
/// purges it. The target is one listed by `dead_letters()`, `dead_letters_of` or
/// `dead_letters_after`, or a task the producer made to fail (which may not have failed yet, or
/// be forgotten already).
#[allow(clippy::too_many_arguments)]
fn dead_letter_step(
    sh: &Shared<'_>,
    rng: &mut Rng,
    tasks: &mut IdMap<Accepted>,
    dead: &mut DeadLetterLog,
    c: &mut Counters,
    ids_with_key: &mut HashMap<String, Vec<TaskId>>,
    failing: &mut VecDeque<TaskId>,
    msgs: &Sender<Msg>,
    shutdown_sent: bool,
) {
    let (pool, findings) = (sh.pool, sh.findings);
    let target = if rng.chance(2, 3) {
        let listing = rng.below(3);
        let ty = Ty::ALL[rng.below(Ty::ALL.len() as u64) as usize];
        let Some(letters) = guarded(
            findings,
            || "listing the dead letters".to_owned(),
            || match listing {
                0 => pool.dead_letters(),
                1 => pool.dead_letters_of(ty.task_type(), None, 64),
                _ => pool.dead_letters_after(None, 64),
            },
        ) else {
            return;
        };
        if listing > 0 && letters.len() > 64 {
            findings.add("a page of dead letters longer than asked", || {
                format!("{} letters", letters.len())
            });
        }
        if listing > 0 && letters.windows(2).any(|w| w[0].id >= w[1].id) {
            findings.add("a page of dead letters out of order", || {
                format!("{:?}", letters.iter().map(|d| d.id).collect::<Vec<_>>())
            });
        }
        for letter in &letters {
            let fits_job = |job: &Job, handle: &TaskHandle<u64>| {
                job.ty.task_type().name() == letter.task_type
                    && (listing != 1 || job.ty == ty)
                    && handle.try_wait().is_some_and(|o| o.is_failed())
            };
            let fits = match tasks.get(&letter.id) {
                // A handler's follow-up (the test learns of them at the end): an outage
                // fails them too.
                None => sh
                    .recorder
                    .follow_ups
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|(job, handle)| handle.id() == letter.id && fits_job(job, handle)),
                Some(acc) => fits_job(&acc.job, &acc.handle),
            };
            if !fits || dead.gone.contains(&letter.id) {
                findings.add("a listed dead letter that does not fit its task", || {
                    format!(
                        "{letter:?} (listing {listing}, {ty:?}): {:?}",
                        tasks.get(&letter.id).map(|a| (a.job, a.handle.try_wait()))
                    )
                });
            }
        }
        if letters.is_empty() {
            return;
        }
        if rng.chance(1, 2) {
            copy_dead_letters(sh, rng, &letters, tasks, c);
        }
        letters[rng.below(letters.len() as u64) as usize].id
    } else if let Some(&id) = failing.get(rng.below(failing.len().max(1) as u64) as usize) {
        id
    } else {
        return;
    };
    let Some(acc) = tasks.get(&target) else {
        return;
    };
    let job = acc.job;
    let state_of =
        |tasks: &IdMap<Accepted>, id: TaskId| tasks[&id].handle.try_wait().map(|o| o.state());

    match rng.below(20) {
        0..4 => {
            let got = guarded(
                findings,
                || format!("take_dead_letter({target})"),
                || pool.take_dead_letter(job.ty.task_type(), target),
            );
            if let Some(Some(payload)) = got {
                c.taken += 1;
                if payload != job {
                    findings.add("take_dead_letter gave another payload", || {
                        format!("{target}: {payload:?}, submitted {job:?}")
                    });
                }
                if state_of(tasks, target) != Some(TaskState::Failed) {
                    findings.add("took the payload of a task that did not fail", || {
                        format!("{target}: {:?}", state_of(tasks, target))
                    });
                }
                if !dead.gone.insert(target) {
                    findings.add("a dead letter was taken or purged twice", || {
                        format!("{target}")
                    });
                }
            }
            return;
        }
        4..6 => {
            let purged = guarded(
                findings,
                || format!("purge_dead_letter({target})"),
                || pool.purge_dead_letter(target),
            );
            if purged == Some(true) {
                c.purged += 1;
                if state_of(tasks, target) != Some(TaskState::Failed) {
                    findings.add("purged a task that did not fail", || {
                        format!("{target}: {:?}", state_of(tasks, target))
                    });
                }
                if !dead.gone.insert(target) {
                    findings.add("a dead letter was taken or purged twice", || {
                        format!("{target}")
                    });
                }
            }
            return;
        }
        _ => {}
    }

    // Now and then with the wrong type: that must never be accepted.
    let wrong_type = rng.chance(1, 10);
    let ty = if wrong_type { job.ty.other() } else { job.ty };
    // Half the time, with the dependents its failure cancelled.
    let with_dependents = rng.chance(1, 2);
    let Some(result) = guarded(
        findings,
        || format!("resubmit({target}, with dependents: {with_dependents})"),
        || {
            if with_dependents {
                pool.resubmit_with_dependents(ty.task_type(), target)
                    .map(|r| (r.task, r.dependents))
            } else {
                pool.resubmit(ty.task_type(), target)
                    .map(|h| (h, Vec::new()))
            }
        },
    ) else {
        return;
    };
    let refused =
        |c: &mut Counters, what: &'static str| *c.resubmit_refused.entry(what).or_insert(0) += 1;
    let key = acc.key.clone();
    match result {
        Ok((handle, dependents)) => {
            let new = handle.id();
            if wrong_type {
                findings.add("resubmit accepted the wrong task type", || {
                    format!("{target} ({job:?}) as {ty:?} → {new}")
                });
            }
            if tasks.contains_key(&new) {
                findings.add("resubmit returned a known id", || {
                    format!("{target} → {new}")
                });
                return;
            }
            if state_of(tasks, target) != Some(TaskState::Failed) {
                findings.add("resubmitted a task that did not fail", || {
                    format!("{target}: {:?}", state_of(tasks, target))
                });
            }
            if dead.gone.contains(&target) {
                findings.add("resubmitted a dead letter that was taken or purged", || {
                    format!("{target}")
                });
            }
            c.resubmitted += 1;
            if let Some(key) = &key {
                ids_with_key.entry(key.clone()).or_default().push(new);
            }
            let _ = msgs.send(Msg {
                id: new,
                job,
                key: key.clone(),
                handle: handle.clone(),
                cancel_soon: false,
            });
            if failing.len() == 64 {
                failing.pop_front();
            }
            failing.push_back(new);
            tasks.insert(
                new,
                Accepted {
                    job,
                    deps: Vec::new(),
                    key,
                    resubmit_of: Some(target),
                    handle,
                    not_before: None,
                },
            );
            // The dependents brought back: new tasks, waiting for the new ones in place of
            // the old, and for their other dependencies as before.
            let mut renamed = HashMap::from([(target, new)]);
            for (old, brought) in dependents {
                c.brought_back += 1;
                let Some(acc) = tasks.get(&old) else {
                    findings.add("brought back a task the test never submitted", || {
                        format!("{old} → {brought}")
                    });
                    continue;
                };
                let (job, old_deps, key) = (acc.job, acc.deps.clone(), acc.key.clone());
                if acc.handle.status() != TaskState::Cancelled {
                    findings.add("brought back a task that was not cancelled", || {
                        format!("{old}: {:?}", acc.handle.status())
                    });
                }
                if tasks.contains_key(&brought) {
                    findings.add("a brought-back dependent got a known id", || {
                        format!("{old} → {brought}")
                    });
                    continue;
                }
                let Some(handle) = pool.handle(job.ty.task_type(), brought) else {
                    // Already finished and forgotten by retention: nothing to check it by, but
                    // it counts in the totals.
                    c.brought_back_unseen += 1;
                    dead.unseen.insert(brought);
                    continue;
                };
                let deps = old_deps
                    .iter()
                    .map(|d| renamed.get(d).copied().unwrap_or(*d))
                    .collect();
                renamed.insert(old, brought);
                // It takes its key back if no other task holds it.
                if let Some(key) = &key {
                    ids_with_key.entry(key.clone()).or_default().push(brought);
                }
                let _ = msgs.send(Msg {
                    id: brought,
                    job,
                    key: key.clone(),
                    handle: handle.clone(),
                    cancel_soon: false,
                });
                tasks.insert(
                    brought,
                    // Not a resubmit: the cancelled task never ran, so this is its first run.
                    Accepted {
                        job,
                        deps,
                        key,
                        resubmit_of: None,
                        handle,
                        not_before: None,
                    },
                );
            }
        }
        Err(ResubmitError::UnknownTask(id)) => {
            refused(c, "UnknownTask");
            if id != target {
                findings.add("resubmit refused another id", || {
                    format!("{target}: UnknownTask({id})")
                });
            } else if state_of(tasks, target).is_none() {
                findings.add("the pool forgot an unfinished task", || {
                    format!("resubmit({target}): UnknownTask")
                });
            }
        }
        Err(ResubmitError::NotDeadLetter(id, state)) => {
            refused(c, "NotDeadLetter");
            if id != target || state == TaskState::Failed {
                findings.add("resubmit: NotDeadLetter that does not fit", || {
                    format!("{target}: NotDeadLetter({id}, {state})")
                });
            }
            if state.is_terminal() && state_of(tasks, target).is_some_and(|s| s != state) {
                findings.add(
                    "resubmit saw another terminal state than the handle",
                    || {
                        format!(
                            "{target}: pool says {state}, handle {:?}",
                            state_of(tasks, target)
                        )
                    },
                );
            }
        }
        Err(ResubmitError::AlreadyResubmitted(id, new)) => {
            refused(c, "AlreadyResubmitted");
            if id != target
                || tasks
                    .get(&new)
                    .is_none_or(|a| a.resubmit_of != Some(target))
            {
                findings.add("resubmit: AlreadyResubmitted that does not fit", || {
                    format!("{target}: AlreadyResubmitted({id}, {new})")
                });
            }
        }
        Err(ResubmitError::Taken(id)) => {
            // Taken or purged by the test, or dropped by the dead-letter limit while retention
            // still keeps the record.
            refused(
                c,
                if dead.gone.contains(&target) {
                    "Taken (by the test)"
                } else {
                    "Taken (dropped by the dead-letter limit)"
                },
            );
            if id != target || state_of(tasks, target) != Some(TaskState::Failed) {
                findings.add("resubmit: Taken that does not fit", || {
                    format!("{target}: Taken({id}), {:?}", state_of(tasks, target))
                });
            }
        }
        Err(ResubmitError::TypeMismatch(id)) => {
            refused(c, "TypeMismatch");
            if id != target || !wrong_type {
                findings.add("resubmit: TypeMismatch for the right type", || {
                    format!("{target} ({job:?}) as {ty:?}: TypeMismatch({id})")
                });
            }
        }
        Err(ResubmitError::KeyTaken(id, holder)) => {
            refused(c, "KeyTaken");
            let fits = id == target
                && key
                    .as_ref()
                    .and_then(|k| ids_with_key.get(k))
                    .is_some_and(|ids| ids.contains(&holder) && holder != target);
            if !fits {
                findings.add("resubmit: KeyTaken that does not fit", || {
                    format!("{target} with key {key:?}: KeyTaken({id}, {holder})")
                });
            }
        }
        Err(ResubmitError::ShutDown) => {
            refused(c, "ShutDown");
            if !shutdown_sent {
                findings.add("resubmit refused as shut down before any shutdown", || {
                    format!("{target}")
                });
            }
        }
        Err(other) => {
            refused(c, "other");
            findings.add("an unexpected resubmit error", || {
                format!("{target}: {other:?}")
            });
        }
    }
}

/// The dead letters the producer took or purged; and the dependents brought back that the
/// test never got a handle to (finished and forgotten at once).
#[derive(Default)]
struct DeadLetterLog {
    gone: IdSet,
    unseen: IdSet,
}

/// Copies the payloads of a few listed dead letters (`dead_letter_payload`), now and then
/// asking with the wrong type: each copy is the job submitted, and the letter stays listed.
/// Only the producer (this thread) takes, purges or resubmits dead letters, so a letter that
/// left the list meanwhile was pushed out by the dead-letter limit: the oldest (lowest id)
/// first, so every letter listed then is newer, and the list is full.
fn copy_dead_letters(
    sh: &Shared<'_>,
    rng: &mut Rng,
    letters: &[tasq::DeadLetter],
    tasks: &IdMap<Accepted>,
    c: &mut Counters,
) {
    let (pool, findings) = (sh.pool, sh.findings);
    let mut picked: Vec<TaskId> = (0..1 + rng.below(3))
        .map(|_| letters[rng.below(letters.len() as u64) as usize].id)
        .collect();
    picked.sort_unstable();
    picked.dedup();
    // (id, whether a copy came back)
    let mut copied: Vec<(TaskId, bool)> = Vec::new();
    for id in picked {
        // A handler's follow-up is in `follow_ups` until the end of the run.
        let job = tasks.get(&id).map(|acc| acc.job).or_else(|| {
            let follow_ups = sh.recorder.follow_ups.lock().unwrap();
            follow_ups
                .iter()
                .find(|(_, handle)| handle.id() == id)
                .map(|(job, _)| *job)
        });
        // Not a task of the run: already a finding.
        let Some(job) = job else { continue };
        let wrong_type = rng.chance(1, 8);
        let ty = if wrong_type { job.ty.other() } else { job.ty };
        let Some(copy) = guarded(
            findings,
            || format!("dead_letter_payload({ty:?}, {id})"),
            || pool.dead_letter_payload(ty.task_type(), id),
        ) else {
            continue;
        };
        match copy {
            Some(copy) if wrong_type => findings.add(
                "dead_letter_payload copied a payload for the wrong type",
                || format!("{id} ({job:?}) as {ty:?}: {copy:?}"),
            ),
            None if wrong_type => c.payloads_wrong_type += 1,
            Some(copy) => {
                c.payloads_copied += 1;
                if copy != job {
                    findings.add("dead_letter_payload copied another payload", || {
                        format!("{id}: {copy:?}, submitted {job:?}")
                    });
                }
                copied.push((id, true));
            }
            None => copied.push((id, false)),
        }
    }
    if copied.is_empty() {
        return;
    }
    let Some(now_listed) = guarded(
        findings,
        || "dead_letters() after copies".to_owned(),
        || pool.dead_letters(),
    ) else {
        return;
    };
    for (id, got_copy) in copied {
        let listed = now_listed.iter().any(|l| l.id == id);
        if listed && !got_copy {
            findings.add(
                "dead_letter_payload gave no copy of a dead letter still listed",
                || format!("{id}"),
            );
        }
        let pushed_out =
            now_listed.len() >= sh.dead_letter_limit && now_listed.iter().all(|l| l.id > id);
        if !listed && !pushed_out {
            findings.add(
                "a dead letter left the list after a copy of its payload, and not by the limit",
                || {
                    format!(
                        "{id} (copied: {got_copy}); listed now {} of limit {}: {:?}",
                        now_listed.len(),
                        sh.dead_letter_limit,
                        now_listed.iter().map(|l| l.id).collect::<Vec<_>>()
                    )
                },
            );
        }
    }
}

/// Cancels random recent tasks, and the ones the producer marked, at random moments; also
/// reads `info` and makes extra handles now and then.
fn cancel_randomly(
    sh: &Shared<'_>,
    msgs: Receiver<Msg>,
    seed: u64,
) -> (Vec<CancelRecord>, Vec<(TaskId, TaskHandle<u64>)>) {
    let (pool, findings, recorder) = (sh.pool, sh.findings, sh.recorder);
    let mut rng = Rng(seed);
    let mut recent: Vec<(TaskId, Job, TaskHandle<u64>)> = Vec::with_capacity(256);
    let mut marked: VecDeque<(u64, TaskId, TaskHandle<u64>)> = VecDeque::new();
    // Recent keys, to cancel by.
    let mut keys: Vec<String> = Vec::with_capacity(64);
    let mut records = Vec::new();
    let mut key_records = Vec::new();
    let mut extra = Vec::new();
    let mut cancel = |rng: &mut Rng, id: TaskId, handle: &TaskHandle<u64>| {
        let before = recorder.tick();
        let by_handle = rng.chance(1, 2);
        // The state just before (racy: it may change before the cancel takes the lock, but a
        // terminal state cannot).
        let seen = pool.status(id);
        let result = guarded(
            findings,
            || format!("cancel({id})"),
            || {
                if by_handle {
                    handle.cancel()
                } else {
                    pool.cancel(id)
                }
            },
        );
        let after = recorder.tick();
        let result = match result {
            None => CancelResult::Panicked,
            Some(Ok(outcome)) => {
                if let Some(state) = seen.filter(|s| s.is_terminal()) {
                    if outcome != CancelOutcome::AlreadyFinished(state) {
                        findings.add("a cancel acted on a finished task", || {
                            format!("{id} was {state}, cancel returned {outcome:?}")
                        });
                    }
                }
                CancelResult::Done(outcome)
            }
            Some(Err(CancelError::UnknownTask(unknown))) => {
                if unknown != id {
                    findings.add("cancel refused another id", || {
                        format!("{id}: UnknownTask({unknown})")
                    });
                }
                if handle.try_wait().is_none() {
                    findings.add("the pool forgot an unfinished task", || {
                        format!("cancel({id}): UnknownTask, handle says {}", handle.status())
                    });
                }
                CancelResult::Refused
            }
            Some(Err(other)) => {
                findings.add("an unexpected cancel error", || format!("{id}: {other:?}"));
                CancelResult::Refused
            }
        };
        records.push(CancelRecord {
            id,
            before,
            after,
            seen,
            result,
            by_key: None,
        });
    };
    let mut received: u64 = 0;
    for msg in msgs.iter() {
        received += 1;
        if msg.cancel_soon {
            marked.push_back((received + rng.below(64), msg.id, msg.handle.clone()));
        }
        if let Some(key) = msg.key {
            if keys.len() < 64 {
                keys.push(key);
            } else {
                keys[rng.below(64) as usize] = key;
            }
        }
        if !keys.is_empty() && rng.chance(1, 48) {
            let key = &keys[rng.below(keys.len() as u64) as usize];
            if let Some(record) = cancel_key(sh, key) {
                key_records.push(record);
            }
        }
        let entry = (msg.id, msg.job, msg.handle);
        if recent.len() < 256 {
            recent.push(entry);
        } else {
            recent[rng.below(256) as usize] = entry;
        }
        while marked.front().is_some_and(|(due, _, _)| *due <= received) {
            let (_, id, handle) = marked.pop_front().unwrap();
            cancel(&mut rng, id, &handle);
        }
        if rng.chance(1, 20) {
            let (id, _, handle) = &recent[rng.below(recent.len() as u64) as usize];
            cancel(&mut rng, *id, handle);
        }
        if rng.chance(1, 64) {
            let (id, job, handle) = &recent[rng.below(recent.len() as u64) as usize];
            let info = guarded(findings, || format!("info({id})"), || pool.info(*id)).flatten();
            match info {
                Some(info) => {
                    if info.attempts > job.limit() {
                        findings.add("more attempts than the limit (info)", || {
                            format!("{id} ({job:?}): {info:?}")
                        });
                    }
                    // The task's own settings, else its type's.
                    if !info_fits(&info, job) {
                        findings.add("info() shows other settings than the task's", || {
                            format!("{id} ({job:?}): {info:?}")
                        });
                    }
                }
                None if handle.try_wait().is_none() => findings
                    .add("the pool forgot an unfinished task", || {
                        format!("info({id}) is None, handle says {}", handle.status())
                    }),
                None => {}
            }
        }
        if rng.chance(1, 256) {
            let (id, job, _) = &recent[rng.below(recent.len() as u64) as usize];
            let ty = job.ty;
            if let Some(Some(handle)) = guarded(
                findings,
                || format!("handle({id})"),
                || pool.handle(ty.task_type(), *id),
            ) {
                extra.push((*id, handle));
            }
        }
    }
    // The producer is done: the marked ones, then a last burst, while the pool is busy (or shutting
    // down).
    for (_, id, handle) in std::mem::take(&mut marked) {
        cancel(&mut rng, id, &handle);
    }
    for _ in 0..64 {
        if recent.is_empty() {
            break;
        }
        let (id, _, handle) = &recent[rng.below(recent.len() as u64) as usize];
        cancel(&mut rng, *id, handle);
    }
    records.extend(key_records);
    (records, extra)
}

/// Whether `info` shows the type and the settings of `job`'s task: its own, else its type's.
fn info_fits(info: &tasq::TaskInfo, job: &Job) -> bool {
    (
        info.task_type,
        info.max_attempts,
        info.retry_policy,
        info.timeout,
    ) == (
        job.ty.task_type().name(),
        job.limit(),
        job.retry(),
        job.timeout(),
    )
}

/// Cancels the task holding `key` (`cancel_key`), recorded as a cancel of the id it returns
/// (the end of the run checks that id held the key). A holder is live or succeeded: a cancel
/// that finds it finished finds it succeeded.
fn cancel_key(sh: &Shared<'_>, key: &str) -> Option<CancelRecord> {
    let (pool, findings, recorder) = (sh.pool, sh.findings, sh.recorder);
    let before = recorder.tick();
    let result = guarded(
        findings,
        || format!("cancel_key({key:?})"),
        || pool.cancel_key(key),
    )?;
    let after = recorder.tick();
    match result {
        Ok((id, outcome)) => {
            if matches!(outcome, CancelOutcome::AlreadyFinished(state) if state != TaskState::Succeeded)
            {
                findings.add(
                    "cancel_key found a holder that had freed its key (failed or cancelled)",
                    || format!("{key:?}: {id}, {outcome:?}"),
                );
            }
            Some(CancelRecord {
                id,
                before,
                after,
                seen: None,
                result: CancelResult::Done(outcome),
                by_key: Some(key.to_owned()),
            })
        }
        Err(CancelError::UnknownKey(unknown)) => {
            if unknown != key {
                findings.add("cancel_key refused another key", || {
                    format!("{key:?}: UnknownKey({unknown:?})")
                });
            }
            None
        }
        Err(other) => {
            findings.add("an unexpected cancel_key error", || {
                format!("{key:?}: {other:?}")
            });
            None
        }
    }
}

/// A task a page of `Pool::tasks` listed, as it listed it.
#[derive(Debug)]
struct Listed {
    id: TaskId,
    task_type: &'static str,
    state: TaskState,
    attempts: u32,
    max_attempts: u32,
    retry_policy: RetryPolicy,
    timeout: Option<Duration>,
}

/// What the sampler's walks through `Pool::tasks` listed, checked against the run at its end
/// (a page may list a task whose submit the producer has not recorded yet).
#[derive(Default)]
struct Listing {
    listed: Vec<Listed>,
    walks: u64,
    pages: u64,
}

/// At most this many pages a walk, and this many tasks kept for the end of the run.
const WALK_PAGES: usize = 16;
const LISTED_KEPT: usize = 200_000;

/// Pages through the tasks of one state, one type, both or neither (`Pool::tasks`), a few
/// pages: every page within its limit and its filter, its ids of this pool, increasing across
/// the pages.
fn walk_tasks(sh: &Shared<'_>, rng: &mut Rng, listing: &mut Listing) {
    const STATES: [TaskState; 7] = [
        TaskState::Blocked,
        TaskState::Scheduled,
        TaskState::Ready,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
    ];
    let (pool, findings) = (sh.pool, sh.findings);
    let state = rng
        .chance(3, 4)
        .then(|| STATES[rng.below(STATES.len() as u64) as usize]);
    let ty = rng
        .chance(1, 2)
        .then(|| Ty::ALL[rng.below(Ty::ALL.len() as u64) as usize]);
    let mut filter = TaskFilter::new();
    if let Some(state) = state {
        filter = filter.state(state);
    }
    if let Some(ty) = ty {
        filter = filter.task_type(ty.task_type().name());
    }
    let limit = 1 + rng.below(64) as usize;
    listing.walks += 1;
    let mut after: Option<TaskId> = None;
    for _ in 0..WALK_PAGES {
        let Some(page) = guarded(
            findings,
            || format!("tasks({filter:?}, {after:?}, {limit})"),
            || pool.tasks(&filter, after, limit),
        ) else {
            return;
        };
        listing.pages += 1;
        if page.len() > limit {
            findings.add("a page of tasks longer than its limit", || {
                format!("{filter:?}, limit {limit}: {} tasks", page.len())
            });
        }
        let mut last = after;
        for info in &page {
            if last.is_some_and(|last| info.id <= last) {
                findings.add(
                    "a page of tasks out of order, or not after the last",
                    || format!("{filter:?}, after {after:?}: {} after {last:?}", info.id),
                );
            }
            last = Some(info.id);
            let fits = info.id.pool() == pool.id()
                && state.is_none_or(|s| info.state == s)
                && ty.is_none_or(|t| info.task_type == t.task_type().name());
            if !fits {
                findings.add("a page of tasks lists one its filter does not keep", || {
                    format!("{filter:?}: {info:?}")
                });
            }
            if listing.listed.len() < LISTED_KEPT {
                listing.listed.push(Listed {
                    id: info.id,
                    task_type: info.task_type,
                    state: info.state,
                    attempts: info.attempts,
                    max_attempts: info.max_attempts,
                    retry_policy: info.retry_policy,
                    timeout: info.timeout,
                });
            }
        }
        if page.len() < limit {
            return;
        }
        after = last;
    }
}

/// What the dashboard of the pool reads (`Pool::overview`, `Pool::task_page`), checked
/// against itself: one overview is one reading under the lock, so its types' and queues'
/// ready and running tasks add up to its states', and a dead letter is a failed task; a page
/// keeps to its filter and its limit.
fn look_as_an_operator(sh: &Shared<'_>, rng: &mut Rng) {
    let (pool, findings) = (sh.pool, sh.findings);
    let Some(Ok(o)) = guarded(findings, || "overview()".to_owned(), || pool.overview()) else {
        findings.add("overview() failed on the embedded store", String::new);
        return;
    };
    let s = o.states;
    let types_ready: usize = o.types.iter().map(|t| t.ready).sum();
    let types_running: usize = o.types.iter().map(|t| t.running).sum();
    let queues_ready: usize = o.queues.iter().map(|q| q.ready).sum();
    let types_dead: usize = o.types.iter().map(|t| t.dead).sum();
    if (types_ready, types_running, queues_ready, types_dead)
        != (s.ready, s.running, s.ready, s.dead)
        || s.dead > s.failed
        || o.estimated
    {
        findings.add("an overview that does not add up", || format!("{o:?}"));
    }
    let mut query = tasq::console::TaskQuery::new().limit(1 + rng.below(40) as usize);
    let ty = Ty::ALL[rng.below(Ty::ALL.len() as u64) as usize];
    let kind = rng.below(3);
    query = match kind {
        0 => query.dead(),
        1 => query.task_type(ty.task_type().name()),
        _ => query.queue(tasq::DEFAULT_QUEUE),
    };
    let Some(page) = guarded(
        findings,
        || format!("task_page({query:?})"),
        || pool.task_page(&query),
    ) else {
        return;
    };
    let fits = page.tasks.len() <= query.get_limit()
        && page.tasks.windows(2).all(|w| w[0].id < w[1].id)
        && page.tasks.iter().all(|t| match kind {
            // (A dead letter the producer resubmits meanwhile is read as no longer dead.)
            0 => t.state == TaskState::Failed,
            1 => t.task_type == ty.task_type().name(),
            _ => t.queue == tasq::DEFAULT_QUEUE,
        });
    if !fits {
        findings.add("a console page out of its limit, order or filter", || {
            format!("{query:?}: {page:?}")
        });
    }
}

/// Samples `stats()` until shutdown begins: the worker count must never drop. Now and then
/// walks through the tasks (`walk_tasks`).
fn sample(sh: &Shared<'_>, cfg: &Config) -> (usize, u64, Listing) {
    let mut min_workers = usize::MAX;
    let mut worker_panics = 0;
    let mut samples = 0;
    let mut rng = Rng(mix(cfg.seed ^ 0x7A5C));
    let mut listing = Listing::default();
    let started = Instant::now();
    while !sh.stop.load(Ordering::SeqCst) {
        let stats = guarded(sh.findings, || "stats()".to_owned(), || sh.pool.stats());
        // A sample taken once shutdown began may rightly see workers leave.
        if sh.shutting_down.load(Ordering::SeqCst) {
            break;
        }
        let Some(stats) = stats else {
            thread::sleep(Duration::from_millis(1));
            continue;
        };
        samples += 1;
        // A wait for the pool to empty, from outside the pool, returns at once here.
        match guarded(
            sh.findings,
            || "wait_empty(0)".to_owned(),
            || sh.pool.wait_empty(Some(Duration::ZERO)),
        ) {
            None | Some(Ok(())) | Some(Err(tasq::WaitError::TimedOut)) => {}
            Some(Err(other)) => sh
                .findings
                .add("wait_empty from outside the pool refused", || {
                    format!("{other:?}")
                }),
        }
        if stats.workers < cfg.workers && stats.workers < min_workers {
            sh.workers_lost.store(true, Ordering::SeqCst);
            let elapsed = started.elapsed();
            sh.findings
                .add("stats().workers dropped below the configured count", || {
                    format!(
                        "{} of {} workers after {elapsed:?}: {stats:?}",
                        stats.workers, cfg.workers
                    )
                });
        }
        min_workers = min_workers.min(stats.workers);
        if stats.running > cfg.workers {
            sh.findings
                .add("more tasks running than workers", || format!("{stats:?}"));
        }
        // Each holds a worker.
        if stats.stuck > cfg.workers {
            sh.findings
                .add("more stuck handlers than workers", || format!("{stats:?}"));
        }
        if stats.retained > cfg.retention_count + stats.dead_letters {
            sh.findings.add("more records retained than the limit", || {
                format!("limit {}: {stats:?}", cfg.retention_count)
            });
        }
        if stats.totals.worker_panics > worker_panics {
            worker_panics = stats.totals.worker_panics;
            sh.findings.add(
                "the engine panicked in a worker (totals.worker_panics)",
                || format!("{stats:?}"),
            );
        }
        if stats.dead_letters > cfg.dead_letter_limit {
            sh.findings.add("more dead letters than the limit", || {
                format!("limit {}: {stats:?}", cfg.dead_letter_limit)
            });
        }
        *sh.last_stats.lock().unwrap() = format!("{stats:?}");
        if samples % 8 == 0 {
            walk_tasks(sh, &mut rng, &mut listing);
        }
        if samples % 64 == 0 {
            look_as_an_operator(sh, &mut rng);
        }
        thread::sleep(Duration::from_millis(1));
    }
    (min_workers, samples, listing)
}

/// Keeps a manual clock moving: small steps, a jump past the age limit now and then, and big
/// steps once shutdown began (so that its deadline, on this clock, comes soon in real time).
fn advance(sh: &Shared<'_>, clock: &ManualClock, max_age: Duration) {
    let mut steps: u64 = 0;
    while !sh.stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_micros(100));
        steps += 1;
        if sh.shutting_down.load(Ordering::SeqCst) {
            clock.advance(Duration::from_millis(5));
        } else if steps % 500 == 0 {
            clock.advance(max_age + Duration::from_millis(1));
        } else {
            clock.advance(Duration::from_micros(250));
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
    })
}

fn tasks_and_seed() -> (u64, u64) {
    let tasks = env_u64("TASQ_SOAK_TASKS").unwrap_or(300_000);
    let seed = env_u64("TASQ_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    (tasks, seed)
}

fn run(cfg: Config) {
    silence_expected_panics();
    let watchdog_limit = Duration::from_secs(env_u64("TASQ_SOAK_WATCHDOG_SECS").unwrap_or(240));
    println!(
        "soak {}: seed {} (replay with TASQ_SOAK_SEED={}), {} tasks, {} workers, retention ({}, {:?}), dead-letter limit {}, \
         shutdown after {} accepted with timeout {:?}, lanes {}",
        cfg.name,
        cfg.seed,
        cfg.seed,
        cfg.tasks,
        cfg.workers,
        cfg.retention_count,
        cfg.max_age,
        cfg.dead_letter_limit,
        cfg.shutdown_after,
        cfg.shutdown_timeout,
        cfg.lanes
    );
    let last_stats = Arc::new(Mutex::new(String::from("(none yet)")));
    let watchdog = Watchdog::start(cfg.name, cfg.seed, watchdog_limit, Arc::clone(&last_stats));
    let findings = Findings::default();
    let recorder = Arc::new(Recorder::new(cfg.tasks, cfg.clock.clone()));
    let events = Arc::new(EventLog::default());
    let worker_log = Arc::new(WorkerLog::default());
    let pool_slot: Arc<OnceLock<Weak<Pool>>> = Arc::new(OnceLock::new());

    let mut builder = Pool::builder().thread_name(cfg.thread_name);
    builder = if cfg.lanes {
        // The threads stay `cfg.workers`: one of them is the slow queue's own.
        builder
            .workers(cfg.workers - SLOW_WORKERS)
            .queue("slow", SLOW_WORKERS)
    } else {
        builder.workers(cfg.workers)
    };
    let mut builder = builder
        .seed(cfg.seed)
        .retry_policy(POOL_RETRY)
        .retention(cfg.retention_count, cfg.max_age)
        .dead_letter_limit(cfg.dead_letter_limit)
        // One run keeps its handlers' panics off the hook by itself.
        .quiet_panics(matches!(cfg.clock, TestClock::Manual(_)))
        .breaker(DOWNSTREAM, BREAKER)
        .aging(AGING)
        .stuck_after(STUCK_AFTER)
        .monitor_interval(MONITOR_INTERVAL)
        .on_event(record_events(&events))
        .on_event(call_back(&events, &pool_slot))
        .on_worker_start(worker_start(
            &worker_log,
            &pool_slot,
            cfg.thread_name,
            cfg.workers,
        ))
        .on_worker_exit(worker_exit(&worker_log, &pool_slot, cfg.thread_name));
    for alert in ALERTS {
        builder = builder.alert(alert);
    }
    if let TestClock::Manual(clock) = &cfg.clock {
        builder = builder.manual_clock(clock.clone());
    }
    let handler = |recorder: &Arc<Recorder>| {
        let recorder = Arc::clone(recorder);
        move |ctx: &Context, job: &Job| run_job(&recorder, ctx, job)
    };
    // The fast type takes the pool's defaults.
    builder = builder.register(FAST, handler(&recorder));
    let ticks = Arc::new(Ticks::default());
    {
        let ticks = Arc::clone(&ticks);
        builder = builder.register(TICK, move |_, slot: &u64| {
            ticks.ran.lock().unwrap().push(*slot);
            Ok::<_, HandlerError>(())
        });
    }
    builder = builder.schedule(Ticks::schedule(&ticks));
    let plains = Arc::new(Plains::default());
    {
        let plains = Arc::clone(&plains);
        builder = builder.register(PLAIN, move |_, n: &u64| {
            plains.ran(*n);
            Ok::<_, HandlerError>(())
        });
    }
    for ty in Ty::ALL.into_iter().filter(|&ty| ty != Ty::Fast) {
        builder = builder.register_with(ty.task_type(), ty.options(), handler(&recorder));
    }
    let pool = Arc::new(builder.build().expect("the pool builds"));
    assert_eq!(
        pool.set_queue_limit("metered", Some(METERED_LIMIT)),
        Ok(None)
    );
    pool_slot
        .set(Arc::downgrade(&pool))
        .expect("the slot is set once");

    // The shutdown runs on its own thread, so that one that never returns is a finding, not a
    // hang of the test.
    let (trigger_tx, trigger_rx) = crossbeam_channel::bounded::<()>(1);
    let (report_tx, report_rx) = crossbeam_channel::bounded::<Result<ShutdownReport, String>>(1);
    {
        let pool = Arc::clone(&pool);
        let timeout = cfg.shutdown_timeout;
        thread::spawn(move || {
            if trigger_rx.recv().is_err() {
                return;
            }
            let result = panic::catch_unwind(AssertUnwindSafe(|| pool.shutdown(timeout)))
                .map_err(|payload| panic_message(&*payload));
            drop(pool);
            let _ = report_tx.send(result);
        });
    }

    let shutting_down = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let workers_lost = AtomicBool::new(false);
    let sh = Shared {
        pool: &pool,
        ticks: &ticks,
        plains: &plains,
        recorder: &recorder,
        findings: &findings,
        shutting_down: &shutting_down,
        stop: &stop,
        last_stats: &last_stats,
        workers_lost: &workers_lost,
        dead_letter_limit: cfg.dead_letter_limit,
    };
    let started = Instant::now();
    let (msgs_tx, msgs_rx) = crossbeam_channel::unbounded();
    let (
        produced,
        (cancels, canceller_handles),
        (min_workers, samples, listing),
        report,
        shutdown_wait,
        pausing,
    ) = thread::scope(|s| {
        let canceller = s.spawn(|| cancel_randomly(&sh, msgs_rx, mix(cfg.seed ^ 0xCA)));
        let pauser = s.spawn(|| pause_randomly(&sh, Rng(mix(cfg.seed ^ 0x9A))));
        let sampler = s.spawn(|| sample(&sh, &cfg));
        if let (TestClock::Manual(clock), Some(age)) = (&cfg.clock, cfg.max_age) {
            let sh = &sh;
            s.spawn(move || advance(sh, clock, age));
        }
        watchdog.phase("producing");
        let produced = produce(&sh, &cfg, msgs_tx, &trigger_tx, &watchdog);
        watchdog.phase("waiting for the canceller");
        let cancels = canceller.join().expect("the canceller does not panic");
        let pausing = pauser.join().expect("the pauser does not panic");
        let sampled = sampler.join().expect("the sampler does not panic");
        watchdog.phase(format!("waiting for shutdown({:?})", cfg.shutdown_timeout));
        // On a manual clock the advancer moves 50 times faster than real time meanwhile.
        let real_timeout = match cfg.clock {
            TestClock::System => cfg.shutdown_timeout,
            TestClock::Manual(_) => cfg.shutdown_timeout / 50,
        };
        let shutdown_started = Instant::now();
        let report = report_rx.recv_timeout(real_timeout + Duration::from_secs(20));
        let shutdown_wait = shutdown_started.elapsed();
        stop.store(true, Ordering::SeqCst);
        (produced, cancels, sampled, report, shutdown_wait, pausing)
    });
    // Pauses: once one returned, only tasks claimed before it started (one per worker).
    let started_paused: u64 = recorder
        .started_paused
        .iter()
        .map(|n| n.load(Ordering::SeqCst))
        .sum();
    if started_paused > pausing.pauses * cfg.workers as u64 || !pausing.wrong.is_empty() {
        findings.add("a pause let tasks start", || {
            format!(
                "{started_paused} handlers started under {} pauses of {} workers; {:?}",
                pausing.pauses, cfg.workers, pausing.wrong
            )
        });
    }
    println!(
        "soak {}: {} pauses, {started_paused} handlers of tasks claimed before their pause",
        cfg.name, pausing.pauses
    );
    let run_time = started.elapsed();
    // The tasks handlers submitted are accepted tasks too.
    let mut produced = produced;
    for (job, handle) in recorder.follow_ups.lock().unwrap().drain(..) {
        produced.counters.followed_up += 1;
        produced.tasks.insert(
            handle.id(),
            Accepted {
                job,
                deps: Vec::new(),
                key: None,
                resubmit_of: None,
                handle,
                not_before: None,
            },
        );
    }

    watchdog.phase("checking");
    let checking = Instant::now();
    let report = match report {
        Ok(Ok(report)) => Some(report),
        Ok(Err(message)) => {
            findings.add("shutdown panicked", || message);
            None
        }
        Err(_) => {
            findings.add("shutdown hung", || {
                format!(
                    "shutdown({:?}) had not returned {shutdown_wait:?} after the producer finished",
                    cfg.shutdown_timeout
                )
            });
            None
        }
    };
    engine_invariants(&pool, "after shutdown", &findings);
    let stats = guarded(
        &findings,
        || "stats() after shutdown".to_owned(),
        || pool.stats(),
    );

    let checked = check(
        &cfg,
        &pool,
        &recorder,
        &findings,
        &produced,
        &cancels,
        &canceller_handles,
        report.as_ref(),
        stats.as_ref(),
        &events,
        &listing,
        (
            ticks.check(&findings),
            ticks.ran.lock().unwrap().len() as u64,
        ),
        &plains.check(&findings),
    );
    let hooks = check_worker_hooks(&cfg, &findings, &worker_log, report.is_some());
    let check_time = checking.elapsed();

    if min_workers < cfg.workers {
        // Already a finding (with the first drop's stats); say how far it went.
        findings.add("stats().workers dropped below the configured count", || {
            format!("lowest sample {min_workers} of {} workers", cfg.workers)
        });
    }
    if report.is_some() {
        if let Some(stats) = &stats {
            if stats.workers != 0 {
                findings.add("workers left after shutdown", || format!("{stats:?}"));
            }
        }
        if cfg!(target_os = "linux") {
            let prefix = cfg.thread_name;
            guarded(
                &findings,
                || format!("assert_threads_gone({prefix})"),
                || support_b::assert_threads_gone(prefix),
            );
        }
    }

    let c = &produced.counters;
    let by_cancel = |f: fn(&CancelResult) -> bool| cancels.iter().filter(|r| f(&r.result)).count();
    // Which states the cancels that took effect found their tasks in (just before the call).
    let mut effective: BTreeMap<String, usize> = BTreeMap::new();
    for record in &cancels {
        if let CancelResult::Done(outcome @ (CancelOutcome::Cancelled | CancelOutcome::Signalled)) =
            record.result
        {
            let seen = match (&record.by_key, record.seen) {
                (Some(_), _) => "found by key".to_owned(),
                (None, seen) => seen.map_or("forgotten".to_owned(), |s| s.to_string()),
            };
            *effective
                .entry(format!("{outcome:?} when {seen}"))
                .or_default() += 1;
        }
    }
    println!(
        "soak {}: ran {run_time:?}, checked in {check_time:?} ({samples} stats samples; shutdown returned after {shutdown_wait:?}); {c:?}; \
         outcomes {checked}; {hooks}; cancels: {} before start, {} signalled, {} too late, {} of forgotten tasks, {} panicked; \
         effective cancels by prior state {effective:?}; report {report:?}",
        cfg.name,
        by_cancel(|r| matches!(r, CancelResult::Done(CancelOutcome::Cancelled))),
        by_cancel(|r| matches!(r, CancelResult::Done(CancelOutcome::Signalled))),
        by_cancel(|r| matches!(r, CancelResult::Done(CancelOutcome::AlreadyFinished(_)))),
        by_cancel(|r| matches!(r, CancelResult::Refused)),
        by_cancel(|r| matches!(r, CancelResult::Panicked)),
    );

    // Drop the pool (its Drop stops it; if the engine is broken that can panic too) before
    // failing, so a panic there cannot abort the process during the failure's unwinding.
    watchdog.phase("dropping the pool");
    match Arc::try_unwrap(pool) {
        Ok(pool) => {
            guarded(&findings, || "drop(pool)".to_owned(), || drop(pool));
        }
        // The shutdown thread still holds it (shutdown hung): leave it be.
        Err(pool) => std::mem::forget(pool),
    }
    drop(watchdog);
    if !findings.is_empty() {
        panic!(
            "soak {} FAILED (seed {}; replay with TASQ_SOAK_SEED={} TASQ_SOAK_TASKS={}):\n{}",
            cfg.name,
            cfg.seed,
            cfg.seed,
            cfg.tasks,
            findings.summary()
        );
    }
}

/// Every end-of-run check; returns a line of outcome counts.
#[allow(clippy::too_many_arguments)]
fn check(
    cfg: &Config,
    pool: &Pool,
    recorder: &Recorder,
    findings: &Findings,
    produced: &Produced,
    cancels: &[CancelRecord],
    canceller_handles: &[(TaskId, TaskHandle<u64>)],
    report: Option<&ShutdownReport>,
    stats: Option<&tasq::Stats>,
    events: &EventLog,
    listing: &Listing,
    ticks: (u64, u64),
    plain: &PlainBooks,
) -> String {
    // 1. Every handle returns a terminal outcome. One wait of HANDLE_WAIT at most: once one
    //    handle timed out, the others are only polled.
    let mut gave_up = false;
    let mut outcome_of = |handle: &TaskHandle<u64>| -> Option<Outcome<u64>> {
        if let Some(outcome) = handle.try_wait() {
            return Some(outcome);
        }
        if gave_up {
            return None;
        }
        let outcome = handle.wait_timeout(HANDLE_WAIT);
        gave_up = outcome.is_none();
        outcome
    };
    let mut outcomes: IdMap<Outcome<u64>> =
        IdMap::with_capacity_and_hasher(produced.tasks.len(), IdBuild::default());
    let mut unfinished = 0u64;
    for (&id, acc) in &produced.tasks {
        let handle = &acc.handle;
        match outcome_of(handle) {
            Some(outcome) => {
                if !outcome.state().is_terminal() {
                    findings.add("a wait returned a non-terminal outcome", || {
                        format!("{id}: {outcome:?}")
                    });
                }
                outcomes.insert(id, outcome);
            }
            None => {
                unfinished += 1;
                findings.add("a handle never finished (wait_timeout(30 s) returned None after shutdown)", || {
                    format!(
                        "{id} ({:?}, after {:?}): handle status {}, pool status {:?}, info {:?}",
                        acc.job,
                        acc.deps,
                        handle.status(),
                        pool.status(id),
                        pool.info(id)
                    )
                });
            }
        }
    }

    // 2. Every other handle of an id agrees with it.
    for (id, handle) in produced.extra_handles.iter().chain(canceller_handles) {
        let Some(first) = outcomes.get(id) else {
            continue;
        };
        match outcome_of(handle) {
            Some(other) if other != *first => findings
                .add("two handles of one task disagree", || {
                    format!("{id}: {first:?} and {other:?}")
                }),
            Some(_) => {}
            None => findings.add("two handles of one task disagree", || {
                format!("{id}: {first:?} and unfinished")
            }),
        }
    }

    // 3. The books balance.
    let count = |state: TaskState| outcomes.values().filter(|o| o.state() == state).count() as u64;
    let (succeeded, failed, cancelled) = (
        count(TaskState::Succeeded),
        count(TaskState::Failed),
        count(TaskState::Cancelled),
    );
    let c = &produced.counters;
    if let Some(stats) = stats {
        let t = stats.totals;
        // The periodic task's slots are submitted by the pool itself: at least every slot that
        // ran, at most every slot made (one made as a pause began is dropped unsubmitted).
        let others = c.accepted + c.resubmitted + c.brought_back + c.followed_up + plain.submitted;
        let scheduled = t.submitted.saturating_sub(others);
        if t.submitted < others || scheduled > ticks.0 || scheduled < ticks.1 {
            findings.add("totals.submitted differs from the accepted tasks", || {
                format!(
                    "{t:?}, accepted {} + resubmitted {} + brought back {} + followed up {} \
                     + plain {} + scheduled between {} ran and {} made",
                    c.accepted,
                    c.resubmitted,
                    c.brought_back,
                    c.followed_up,
                    plain.submitted,
                    ticks.1,
                    ticks.0
                )
            });
        }
        if t.worker_panics != 0 {
            findings.add(
                "the engine panicked in a worker (totals.worker_panics)",
                || format!("{t:?}"),
            );
        }
        if t.succeeded + t.failed + t.cancelled != t.submitted {
            findings.add(
                "totals do not balance: submitted != succeeded + failed + cancelled",
                || format!("{t:?}"),
            );
        }
        // Brought-back dependents the test never got a handle to are in the totals only.
        let unseen = c.brought_back_unseen + scheduled + plain.unseen;
        let (succeeded, failed, cancelled) = (
            succeeded + plain.succeeded,
            failed + plain.failed,
            cancelled + plain.cancelled,
        );
        let seen = succeeded + failed + cancelled;
        if unfinished == 0
            && (t.succeeded < succeeded
                || t.failed < failed
                || t.cancelled < cancelled
                || t.succeeded + t.failed + t.cancelled != seen + unseen)
        {
            findings.add("totals differ from the handles' outcomes", || {
                format!(
                    "{t:?}; handles: {succeeded} succeeded, {failed} failed, {cancelled} cancelled"
                )
            });
        }
        if let Some(report) = report {
            if (report.succeeded, report.failed, report.cancelled)
                != (t.succeeded, t.failed, t.cancelled)
            {
                findings.add("the shutdown report differs from the totals", || {
                    format!("{report:?} vs {t:?}")
                });
            }
            // The tasks the deadline interrupted ran, and ended cancelled.
            if !report.deadline_reached && !report.interrupted.is_empty() {
                findings.add("a drained shutdown reports interrupted tasks", || {
                    format!("{report:?}")
                });
            }
            for (id, type_name) in &report.interrupted {
                let fits = produced.tasks.get(id).is_some_and(|acc| {
                    acc.job.ty.task_type().name() == *type_name
                        && recorder.get(*id).is_some()
                        && outcomes.get(id).is_none_or(Outcome::is_cancelled)
                });
                // A plain task (the plain producer's books): its kept handle, if any, reads a
                // cancel.
                let fits = fits
                    || (*type_name == PLAIN.name()
                        && plain.ids.contains(id)
                        && !plain.not_cancelled.contains(id));
                if !fits {
                    findings.add("an interrupted task that does not fit", || {
                        format!(
                            "{id} ({type_name}): {:?}, runs {:?}, outcome {:?}",
                            produced.tasks.get(id).map(|a| a.job),
                            recorder.get(*id),
                            outcomes.get(id)
                        )
                    });
                }
            }
            if (stats.blocked, stats.scheduled, stats.ready, stats.running) != (0, 0, 0, 0) {
                findings.add("tasks left after shutdown", || format!("{stats:?}"));
            }
        }
    }

    // 4. Each task: its outcome fits its job, its attempts, its cancels and its dependencies.
    let mut cancels_of: IdMap<Vec<&CancelRecord>> = IdMap::default();
    for record in cancels {
        cancels_of.entry(record.id).or_default().push(record);
    }
    let deadline_reached = report.is_none_or(|r| r.deadline_reached);
    // Timeouts the timed tasks' attempts and handlers account for (each at most the runs the
    // pool timed out), and successes whose last run lasted its timeout on the pool's clock
    // without its token firing (the monitor thread came late): each is a finding, as the pool
    // times a run by its length, not by when the monitor woke.
    let (mut timeouts_needed, mut late_successes) = (0u64, 0u64);
    for (&id, outcome) in &outcomes {
        let acc = &produced.tasks[&id];
        let job = acc.job;
        // Its own limit and timeout where it has them.
        let limit = job.limit();
        let timed = job.timed();
        let runs = recorder.get(id);
        // Runs of this task the pool must have timed out: attempts beyond what its handlers
        // made necessary (timed type only).
        let mut extra = 0;
        let context = || {
            format!(
                "{id} {job:?} after {:?} (resubmit of {:?}): {outcome:?}; runs {runs:?}",
                acc.deps, acc.resubmit_of
            )
        };
        if let Some(runs) = runs {
            if runs.max_attempt > limit {
                findings.add("more attempts than the limit", context);
            }
            // Also: a task a gate held back burned no attempt.
            if runs.runs != runs.max_attempt {
                findings.add("an attempt ran twice, or one was skipped", context);
            }
            // Only a cancel fires the token of an untimed run.
            if !timed && runs.saw_token && !outcome.is_cancelled() {
                findings.add(
                    "a handler saw its token fire, yet the task was not cancelled",
                    context,
                );
            }
        }
        // A delayed task never started before its time.
        if let (Some(not_before), Some(runs)) = (acc.not_before, runs) {
            if runs.first_at < not_before {
                findings.add("a delayed task started before its time", || {
                    format!(
                        "{}; started {:?} before it",
                        context(),
                        not_before - runs.first_at
                    )
                });
            }
        }
        if let Some(info) = pool.info(id) {
            if info.attempts != runs.map_or(0, |r| r.max_attempt)
                || info.state != outcome.state()
                || !info_fits(&info, &job)
            {
                findings.add("info() disagrees with the handlers and the handle", || {
                    format!("{}; {info:?}", context())
                });
            }
        }
        match outcome {
            Outcome::Succeeded(value) => {
                let Some(runs) = runs else {
                    findings.add("succeeded without running", context);
                    continue;
                };
                if *value != job.output() {
                    findings.add("a wrong output", context);
                }
                // On the timed type, runs the pool timed out may come on top.
                match expected_end(acc, &runs) {
                    Ok(attempts) if runs.max_attempt == attempts => {}
                    Ok(attempts) if timed && runs.max_attempt > attempts => {
                        extra = runs.max_attempt - attempts;
                    }
                    _ => findings.add(
                        "succeeded when it should not have, or after the wrong number of attempts",
                        context,
                    ),
                }
                if runs.last_token {
                    findings.add(
                        "a run that timed out (its token fired, no cancel) counted as the task's success",
                        context,
                    );
                } else if !runs.last_returned_ok() {
                    findings.add("succeeded, yet its last run returned an error", context);
                }
                if runs.last_late {
                    late_successes += 1;
                    findings.add(
                        "a run that lasted its timeout or longer counted as the task's success",
                        context,
                    );
                }
            }
            Outcome::Failed(failure) => {
                let Some(runs) = runs else {
                    findings.add("failed without running", context);
                    continue;
                };
                let fits = if failure.reason == FailureReason::TimedOut {
                    // Whatever its last run returned (a panic stays a panic).
                    extra = 1;
                    let panicked = job.kind == Kind::Panic && !runs.last_outage;
                    timed
                        && failure.attempts == limit
                        && failure.error
                            == format!("the handler ran past its timeout of {TIMEOUT:?}")
                        && !panicked
                } else {
                    if timed && runs.last_token && failure.reason != FailureReason::Panicked {
                        findings.add(
                            "a run that timed out (its token fired, no cancel) ended its task failed, but not TimedOut",
                            context,
                        );
                    }
                    match expected_end(acc, &runs) {
                        Err((reason, attempts, error)) => {
                            // A permanent error in a run the pool timed out is retried.
                            extra = failure.attempts.saturating_sub(attempts);
                            (reason, error) == (failure.reason, failure.error.clone())
                                && (failure.attempts == attempts
                                    || (timed
                                        && reason == FailureReason::Permanent
                                        && failure.attempts > attempts))
                        }
                        Ok(_) => false,
                    }
                };
                if !fits || failure.attempts != runs.max_attempt {
                    findings.add(
                        "failed when it should not have, or with the wrong failure",
                        context,
                    );
                }
            }
            Outcome::Cancelled(reason) => match reason {
                CancelReason::Requested => {
                    if !cancels_of.get(&id).is_some_and(|c| {
                        c.iter().any(|r| {
                            matches!(
                                r.result,
                                CancelResult::Done(
                                    CancelOutcome::Cancelled | CancelOutcome::Signalled
                                ) | CancelResult::Panicked
                            )
                        })
                    }) {
                        findings.add("cancelled as requested, but no cancel reached it", context);
                    }
                }
                CancelReason::Shutdown => {
                    if !deadline_reached {
                        findings.add("cancelled by the shutdown, which drained without reaching its deadline", context);
                    }
                }
                CancelReason::DependencyFailed(dep) | CancelReason::DependencyCancelled(dep) => {
                    if runs.is_some() {
                        findings.add("a task cancelled because of a dependency had run", context);
                    }
                    if !acc.deps.contains(dep) {
                        findings.add("cancelled because of a task it did not depend on", context);
                    } else {
                        let expected = if matches!(reason, CancelReason::DependencyFailed(_)) {
                            TaskState::Failed
                        } else {
                            TaskState::Cancelled
                        };
                        if let Some(dep_outcome) = outcomes.get(dep) {
                            if dep_outcome.state() != expected {
                                findings.add(
                                    "the dependency named in a cancel did not end that way",
                                    || format!("{}; dependency {dep}: {dep_outcome:?}", context()),
                                );
                            }
                        }
                    }
                }
                other => findings.add("an unknown cancel reason", || {
                    format!("{}: {other:?}", context())
                }),
            },
        }
        // A `PermanentOnce` payload's first run ever is its first task's own first run, or a
        // resubmit's whose original never got past an outage.
        if let (Kind::PermanentOnce, Some(runs)) = (job.kind, runs) {
            let fits = match acc.resubmit_of {
                None => runs.first_ever || runs.runs == runs.outages,
                Some(original) => {
                    !runs.first_ever
                        || recorder
                            .get(original)
                            .is_some_and(|o| !o.first_ever && o.last_outage)
                }
            };
            if !fits {
                findings.add(
                    "a payload's first run ever was not its first task's, nor after an outage",
                    context,
                );
            }
        }
        // Without a cancel, only the pool's timeouts fire a timed run's token.
        if timed && !outcome.is_cancelled() {
            let seen = runs.map_or(0, |r| r.token_runs);
            timeouts_needed += u64::from(extra.max(seen));
        }

        // A dependent ran only after every dependency's handler returned Ok, and only if every
        // dependency succeeded.
        if let Some(runs) = runs {
            for dep in &acc.deps {
                let dep_outcome = outcomes.get(dep);
                let dep_runs = recorder.get(*dep);
                let ok_before = dep_runs
                    .and_then(|r| r.last_ok)
                    .is_some_and(|ok| ok < runs.first_start);
                if dep_outcome.is_some_and(|o| !o.is_succeeded()) || !ok_before {
                    findings.add("a dependent ran before its dependency succeeded", || {
                        format!(
                            "{}; dependency {dep}: {dep_outcome:?}, runs {dep_runs:?}",
                            context()
                        )
                    });
                }
            }
        }

        // Cancels: a task cancelled before it started never started afterwards.
        for record in cancels_of.get(&id).into_iter().flatten() {
            match &record.result {
                CancelResult::Done(CancelOutcome::Cancelled) => {
                    if *outcome != Outcome::Cancelled(CancelReason::Requested) {
                        findings.add(
                            "a cancel said Cancelled, yet the task ended otherwise",
                            context,
                        );
                    }
                    if runs.is_some_and(|r| r.last_start > record.after) {
                        findings.add("a task cancelled before it started ran afterwards", || {
                            format!(
                                "{}; cancelled at ticks {}..{}",
                                context(),
                                record.before,
                                record.after
                            )
                        });
                    }
                }
                CancelResult::Done(CancelOutcome::Signalled) => {
                    if !outcome.is_cancelled() {
                        findings.add(
                            "a cancel signalled a running task, yet it was not cancelled",
                            context,
                        );
                    }
                }
                CancelResult::Done(CancelOutcome::AlreadyFinished(state)) => {
                    if *state != outcome.state() {
                        findings.add(
                            "a cancel saw another terminal state than the handle",
                            || format!("{}; cancel saw {state}", context()),
                        );
                    }
                }
                CancelResult::Done(other) => findings.add("an unknown cancel outcome", || {
                    format!("{}: {other:?}", context())
                }),
                CancelResult::Refused | CancelResult::Panicked => {}
            }
        }
    }

    // 5. The dead letters the pool still lists are failed tasks, with the same failure, neither
    //    taken nor resubmitted.
    if let Some(dead) = guarded(
        findings,
        || "dead_letters() after shutdown".to_owned(),
        || pool.dead_letters(),
    ) {
        let resubmitted: IdSet = produced
            .tasks
            .values()
            .filter_map(|a| a.resubmit_of)
            .collect();
        if dead.len() > cfg.dead_letter_limit {
            findings.add("more dead letters than the limit", || {
                format!("{} > {}", dead.len(), cfg.dead_letter_limit)
            });
        }
        for letter in dead {
            let fits = match (produced.tasks.get(&letter.id), outcomes.get(&letter.id)) {
                (Some(acc), Some(Outcome::Failed(failure))) => {
                    *failure == letter.failure && acc.job.ty.task_type().name() == letter.task_type
                }
                (Some(_), None) => true, // unfinished: reported above
                _ => false,
            };
            if !fits || produced.dead.gone.contains(&letter.id) || resubmitted.contains(&letter.id)
            {
                findings.add("a dead letter that does not fit its task", || {
                    format!("{letter:?}: outcome {:?}", outcomes.get(&letter.id))
                });
            }
        }
    }
    // 6. The handlers saw each task's own limit (`ctx.max_attempts()`).
    let wrong_limits = recorder.wrong_limits.load(Ordering::Relaxed);
    if wrong_limits > 0 {
        let examples = recorder.wrong_limit_examples.lock().unwrap().clone();
        findings.add(
            "a handler's ctx.max_attempts() is not its task's limit",
            || format!("{wrong_limits} runs, first {examples:?}"),
        );
    }

    // 7. Each cancel by key returned a task that held the key.
    let mut key_cancels = 0u64;
    for record in cancels {
        let Some(key) = &record.by_key else { continue };
        key_cancels += 1;
        let held = produced
            .ids_with_key
            .get(key)
            .is_some_and(|ids| ids.contains(&record.id));
        if !held || !produced.tasks.contains_key(&record.id) {
            findings.add("cancel_key returned a task that never held the key", || {
                format!(
                    "{key:?}: {record:?}; holders {:?}",
                    produced.ids_with_key.get(key)
                )
            });
        }
    }

    // 8. Every task a page of `tasks()` listed is one of the run's, listed with its type and
    //    settings, within its limit, and in a terminal state only if it ended so.
    for listed in &listing.listed {
        let Some(acc) = produced.tasks.get(&listed.id) else {
            if listed.task_type == PLAIN.name() {
                // A plain task: one run at most, never a dead letter.
                if !plain.ids.contains(&listed.id)
                    || listed.attempts > 1
                    || listed.state == TaskState::Failed
                {
                    findings.add(
                        "a page of tasks lists a plain task otherwise than it is",
                        || format!("{listed:?}"),
                    );
                }
                continue;
            }
            // The periodic task's, which the pool submits itself (checked by `Ticks::check`).
            if listed.task_type != TICK.name() && !produced.dead.unseen.contains(&listed.id) {
                findings.add(
                    "a page of tasks lists a task the run never submitted",
                    || format!("{listed:?}"),
                );
            }
            continue;
        };
        let job = acc.job;
        let fits = listed.task_type == job.ty.task_type().name()
            && listed.max_attempts == job.limit()
            && listed.retry_policy == job.retry()
            && listed.timeout == job.timeout()
            && listed.attempts <= job.limit()
            && (!listed.state.is_terminal()
                || outcomes
                    .get(&listed.id)
                    .is_none_or(|o| o.state() == listed.state));
        if !fits {
            findings.add("a page of tasks lists a task otherwise than it is", || {
                format!(
                    "{listed:?}: {job:?}, outcome {:?}",
                    outcomes.get(&listed.id)
                )
            });
        }
    }

    // 9. The mitigations.
    let mitigations = check_mitigations(
        cfg,
        pool,
        recorder,
        findings,
        produced,
        &outcomes,
        events,
        report.is_some(),
        stats,
        (timeouts_needed, late_successes),
    );
    format!(
        "{succeeded} succeeded, {failed} failed, {cancelled} cancelled, {unfinished} unfinished; \
         {key_cancels} cancels by key; tasks() {} walks, {} pages, {} tasks listed; {mitigations}",
        listing.walks,
        listing.pages,
        listing.listed.len(),
    )
}

/// The worker hooks: once shutdown returned, each worker started once and exited once, on its
/// own thread (no worker is ever replaced: a panic is caught, and the worker carries on), and
/// their calls back into the pool found nothing wrong. Returns a line of what they did.
fn check_worker_hooks(
    cfg: &Config,
    findings: &Findings,
    log: &WorkerLog,
    shut_down: bool,
) -> String {
    let mut started = log.started.lock().unwrap().clone();
    let mut exited = log.exited.lock().unwrap().clone();
    started.sort_unstable();
    exited.sort_unstable();
    let every: Vec<usize> = (0..cfg.workers).collect();
    if started != every {
        findings.add("the start hook did not run once per worker", || {
            format!("{} workers, started {started:?}", cfg.workers)
        });
    }
    // Shutdown waits for the exit hooks.
    if shut_down && exited != every {
        findings.add("the exit hook did not run once per worker", || {
            format!("{} workers, exited {exited:?}", cfg.workers)
        });
    }
    for finding in log.findings.lock().unwrap().drain(..) {
        findings.add("a worker hook saw something wrong", || finding);
    }
    format!(
        "worker hooks: {} starts, {} exits, {} calls back",
        started.len(),
        exited.len(),
        log.callbacks.load(Ordering::Relaxed)
    )
}

/// The mitigations' invariants: limits, the rate, timeouts against the metrics, and every
/// event the hooks heard (complete only if `shut_down` returned: it waits for the hooks).
/// Returns a line of what they did.
#[allow(clippy::too_many_arguments)]
fn check_mitigations(
    cfg: &Config,
    pool: &Pool,
    recorder: &Recorder,
    findings: &Findings,
    produced: &Produced,
    outcomes: &IdMap<Outcome<u64>>,
    log: &EventLog,
    shut_down: bool,
    stats: Option<&tasq::Stats>,
    (timeouts_needed, late_successes): (u64, u64),
) -> String {
    // The queues' bounds: the slow queue's lane, the metered queue's limit.
    let mut most_queued = Vec::new();
    let lane = cfg.lanes.then_some((0, "slow", SLOW_WORKERS as u32));
    for (q, name, bound) in lane.into_iter().chain([(1, "metered", METERED_LIMIT)]) {
        let seen = recorder.queue_most[q].load(Ordering::SeqCst);
        most_queued.push(format!("{name} {seen}/{bound}"));
        if seen > bound {
            findings.add("more tasks of a queue ran at once than its bound", || {
                format!("{seen} of queue {name} at once, bound {bound}")
            });
        }
    }
    // Concurrency: the handlers' own count never passed the limit.
    let mut most = Vec::new();
    for ty in Ty::ALL {
        let seen = recorder.most[ty.index()].load(Ordering::SeqCst);
        if let Some(limit) = ty.concurrency() {
            most.push(format!("{ty:?} {seen}/{limit}"));
            if seen > limit {
                findings.add(
                    "more tasks of a limited type ran at once than its limit",
                    || format!("{seen} of {ty:?} at once, limit {limit}"),
                );
            }
        }
    }

    // The rate: over any window of starts [t_i, t_j], at most burst + rate × (t_j - t_i) of
    // them, plus one per worker: a start is the gate's, the timestamp the handler's, and each
    // task between the two holds a worker. With f(k) = k - rate × t_k the window's excess is
    // f(j) - f(i) + 1: one pass, keeping the lowest f so far.
    let mut starts = std::mem::take(&mut *recorder.rated_starts.lock().unwrap());
    starts.sort_unstable();
    let mut worst = 0.0f64;
    if let Some(&first) = starts.first() {
        let mut lowest = f64::INFINITY;
        for (k, t) in starts.iter().enumerate() {
            let f = k as f64 - RATED_PER_SECOND * t.duration_since(first).as_secs_f64();
            lowest = lowest.min(f);
            worst = worst.max(f - lowest + 1.0);
        }
    }
    let allowed = f64::from(RATED_BURST) + cfg.workers as f64;
    if worst > allowed + 1e-6 {
        findings.add("the rated type started faster than its rate limit", || {
            format!(
                "{} starts; a window held {worst:.2} more than rate × its length \
                 (at most burst {RATED_BURST} + {} workers)",
                starts.len(),
                cfg.workers
            )
        });
    }

    // The metrics count the runs the handlers saw, and the timeouts the outcomes need.
    let metrics = guarded(findings, || "metrics()".to_owned(), || pool.metrics());
    let mut timed_out = 0;
    for ty in Ty::ALL {
        let Some(m) = metrics.as_ref().and_then(|m| {
            m.types
                .iter()
                .find(|t| t.backlog.task_type == ty.task_type().name())
        }) else {
            findings.add("a type missing from the metrics", || format!("{ty:?}"));
            continue;
        };
        let runs = m.runs.succeeded + m.runs.retried + m.runs.failed;
        let seen = recorder.type_runs[ty.index()].load(Ordering::SeqCst);
        if runs != seen {
            findings.add("the metrics count other runs than the handlers saw", || {
                format!("{ty:?}: {:?}, handlers ran {seen}", m.runs)
            });
        }
        if ty == Ty::Timed {
            timed_out = m.runs.timed_out;
            if timed_out < timeouts_needed || timed_out > runs {
                findings.add(
                    "the timed type's attempts and handlers need other timeouts than the metrics count",
                    || format!("{:?}; the outcomes need at least {timeouts_needed}", m.runs),
                );
            }
        } else if m.runs.timed_out != 0 {
            findings.add("a type without a timeout timed out", || {
                format!("{ty:?}: {:?}", m.runs)
            });
        }
    }

    // Whatever the calling-back hook found.
    for finding in log.callback_findings.lock().unwrap().drain(..) {
        findings.add(
            "a hook's call back into the pool saw something wrong",
            || finding,
        );
    }

    let events = std::mem::take(&mut *log.events.lock().unwrap());
    let mut dead: IdMap<Vec<(&'static str, FailureReason, u32, &str)>> = IdMap::default();
    let mut dead_events = 0u64;
    let mut stuck: HashSet<(TaskId, u32)> = HashSet::new();
    let mut breaker = BreakerState::Closed;
    let mut breaker_changes: BTreeMap<String, u64> = BTreeMap::new();
    let mut alerts: Vec<Option<bool>> = vec![None; ALERTS.len()];
    let (mut raised, mut cleared) = (0u64, 0u64);
    for event in &events {
        match event {
            Event::DeadLetter {
                id,
                task_type,
                reason,
                attempts,
                error,
            } => {
                dead_events += 1;
                dead.entry(*id)
                    .or_default()
                    .push((*task_type, *reason, *attempts, error));
            }
            Event::Stuck {
                id,
                task_type,
                attempt,
                running_for,
            } => {
                let runs = recorder.get(*id);
                let fits = *task_type == TIMED.name()
                    && produced.tasks.get(id).is_none_or(|a| a.job.timed())
                    && runs.is_some_and(|r| *attempt >= 1 && *attempt <= r.max_attempt)
                    && *running_for >= TIMEOUT + STUCK_AFTER;
                if !fits {
                    findings.add("a stuck event that does not fit a timed run", || {
                        format!("{event:?}; runs {runs:?}")
                    });
                }
                if !stuck.insert((*id, *attempt)) {
                    findings.add("a run reported stuck twice", || format!("{event:?}"));
                }
            }
            Event::Breaker { downstream, state } => {
                // The state machine: closed → open → half-open → closed or open. A run that
                // started before the breaker opened may still end while it is open or
                // half-open: its failure opens it again from half-open, and its success closes
                // it, from half-open or straight from open (both stores do so: "a success is a
                // success", `BreakerCell::record`; the docs describe only the probe's).
                let valid = *downstream == DOWNSTREAM
                    && matches!(
                        (breaker, *state),
                        (BreakerState::Closed, BreakerState::Open)
                            | (BreakerState::Open, BreakerState::HalfOpen)
                            | (BreakerState::Open, BreakerState::Closed)
                            | (BreakerState::HalfOpen, BreakerState::Closed)
                            | (BreakerState::HalfOpen, BreakerState::Open)
                    );
                if !valid {
                    findings.add("a breaker change the state machine does not have", || {
                        format!("{downstream}: {breaker:?} → {state:?}")
                    });
                }
                *breaker_changes
                    .entry(format!("{breaker:?}→{state:?}"))
                    .or_default() += 1;
                breaker = *state;
            }
            Event::AlertRaised { alert, value } | Event::AlertCleared { alert, value } => {
                let now_raised = matches!(event, Event::AlertRaised { .. });
                if now_raised {
                    raised += 1;
                } else {
                    cleared += 1;
                }
                let Some(index) = ALERTS.iter().position(|a| a == alert) else {
                    findings.add("an event of an alert the pool was not given", || {
                        format!("{event:?}")
                    });
                    continue;
                };
                // Raised first, then cleared, raised... each on its side of the threshold.
                if alerts[index] == Some(now_raised) || (alerts[index].is_none() && !now_raised) {
                    findings.add("an alert's events do not alternate raised, cleared", || {
                        format!("{event:?} after {:?}", alerts[index])
                    });
                }
                alerts[index] = Some(now_raised);
                let over = match (index, value) {
                    (0, AlertValue::Depth(n)) => *n >= ALERT_DEPTH,
                    (1, AlertValue::Age(age)) => *age >= ALERT_AGE,
                    (2, AlertValue::Depth(n)) => *n >= ALERT_DEPTH_P0,
                    _ => !now_raised,
                };
                if over != now_raised {
                    findings.add(
                        "an alert's value is on the wrong side of its threshold",
                        || format!("{event:?}"),
                    );
                }
            }
            other => findings.add("an event of an unknown kind", || format!("{other:?}")),
        }
    }

    // Once shutdown returned, every run has ended and the hooks heard every event.
    if let Some(stats) = stats.filter(|_| shut_down) {
        if stats.stuck != 0 {
            findings.add("stuck handlers left after shutdown", || {
                format!("{stats:?}")
            });
        }
        if stats.breakers != [(DOWNSTREAM, breaker)] {
            findings.add(
                "stats().breakers differs from the last breaker event",
                || format!("{:?}; the events end {breaker:?}", stats.breakers),
            );
        }
    }

    // Every dead letter was reported once, as it ended; no other task was. Complete only once
    // shutdown returned (after the hooks heard every event).
    if shut_down {
        for (&id, outcome) in outcomes {
            let heard = dead.remove(&id).unwrap_or_default();
            let Outcome::Failed(failure) = outcome else {
                if !heard.is_empty() {
                    findings.add("a dead-letter event for a task that did not fail", || {
                        format!("{id}: {outcome:?}; events {heard:?}")
                    });
                }
                continue;
            };
            let name = produced.tasks[&id].job.ty.task_type().name();
            let expected = (
                name,
                failure.reason,
                failure.attempts,
                failure.error.as_str(),
            );
            if heard != [expected] {
                findings.add(
                    "a dead letter not reported exactly once, with its type, reason, attempts and error",
                    || format!("{id}: {failure:?}; events {heard:?}"),
                );
            }
        }
        // The rest: tasks without an outcome (unfinished: reported above), or brought back
        // and forgotten before the test got a handle.
        let unseen = dead
            .keys()
            .filter(|id| !produced.tasks.contains_key(id))
            .count() as u64;
        if unseen > produced.counters.brought_back_unseen {
            findings.add("dead-letter events for tasks nobody submitted", || {
                format!(
                    "{unseen} ids, {} brought back unseen: {:?}",
                    produced.counters.brought_back_unseen,
                    dead.keys().take(4).collect::<Vec<_>>()
                )
            });
        }
        if let Some(stats) = stats {
            if dead_events != stats.totals.failed {
                findings.add("dead-letter events differ from totals.failed", || {
                    format!("{dead_events} events, {:?}", stats.totals)
                });
            }
        }
    }

    format!(
        "mitigations: most at once {most:?}, queues {most_queued:?}; rated {} starts, worst window {worst:.1} over \
         rate × length (burst {RATED_BURST}); breaker {breaker_changes:?}; {} stuck; alerts \
         {raised} raised, {cleared} cleared; {dead_events} dead-letter events; {} hook \
         callbacks; timed out {timed_out} (outcomes need {timeouts_needed}), {late_successes} \
         successes overran their timeout",
        starts.len(),
        stuck.len(),
        log.callbacks.load(Ordering::Relaxed),
    )
}

/// How a task ends if none of its runs times out: `Ok` with the attempt it succeeds on, or
/// `Err` with its failure's reason, attempts and error. An outage's runs fail before the job's
/// own behaviour, which counts its attempts without them (`run_job`). A `PermanentOnce` job
/// fails on its payload's first run ever: a first task's, or a resubmit's if outages failed
/// every run of the first (the handler says which).
fn expected_end(acc: &Accepted, runs: &Runs) -> Result<u32, (FailureReason, u32, String)> {
    let (job, limit, outages) = (acc.job, acc.job.limit(), runs.outages);
    if runs.last_outage {
        return Err((FailureReason::Exhausted, limit, OUTAGE_ERROR.to_owned()));
    }
    match job.kind {
        Kind::Transient(fails) if fails + outages >= limit => Err((
            FailureReason::Exhausted,
            limit,
            format!("transient failure {}", limit - outages),
        )),
        Kind::Transient(fails) => Ok(fails + 1 + outages),
        Kind::Exhaust => Err((FailureReason::Exhausted, limit, "always fails".to_owned())),
        Kind::Permanent => Err((
            FailureReason::Permanent,
            1 + outages,
            "permanent failure".to_owned(),
        )),
        Kind::PermanentOnce if runs.first_ever => Err((
            FailureReason::Permanent,
            1 + outages,
            "first run fails".to_owned(),
        )),
        Kind::Panic => Err((
            FailureReason::Panicked,
            1 + outages,
            format!("{PANIC_MARKER} {}", job.seq),
        )),
        Kind::Succeed
        | Kind::PermanentOnce
        | Kind::Slow(_)
        | Kind::Spawn
        | Kind::Overrun
        | Kind::OverrunOk
        | Kind::OverrunOnce
        | Kind::Stubborn => Ok(1 + outages),
    }
}

#[test]
fn count_retention() {
    let (tasks, seed) = tasks_and_seed();
    let mut rng = Rng(mix(seed ^ 0xC0));
    let cfg = Config {
        name: "count_retention",
        thread_name: "tq-soak-c",
        tasks,
        seed,
        workers: 4 + rng.below(5) as usize,
        retention_count: 16 + rng.below(49) as usize,
        max_age: None,
        dead_letter_limit: 8 + rng.below(121) as usize,
        clock: TestClock::System,
        delay_max: Duration::from_millis(3),
        // Two times in five the deadline is long enough to drain.
        shutdown_timeout: [0, 1, 20, 10_000, 10_000].map(Duration::from_millis)
            [rng.below(5) as usize],
        // Often while the producer is still submitting.
        shutdown_after: tasks * 3 / 4 + rng.below(tasks / 2 + 1),
        lanes: true,
    };
    run(cfg);
}

#[test]
fn age_retention_on_a_manual_clock() {
    let (tasks, seed) = tasks_and_seed();
    let mut rng = Rng(mix(seed ^ 0xA6E));
    let max_age = Duration::from_millis(20);
    let cfg = Config {
        name: "age_retention_on_a_manual_clock",
        thread_name: "tq-soak-m",
        tasks,
        seed,
        workers: 4 + rng.below(5) as usize,
        retention_count: 512,
        max_age: Some(max_age),
        dead_letter_limit: 64,
        clock: TestClock::Manual(ManualClock::new()),
        // Up to three ages: a blocked task cancelled meanwhile ages out before its dependency ends.
        delay_max: max_age * 3,
        shutdown_timeout: [0, 1, 20, 10_000, 10_000].map(Duration::from_millis)
            [rng.below(5) as usize],
        shutdown_after: tasks * 3 / 4 + rng.below(tasks / 2 + 1),
        lanes: false,
    };
    run(cfg);
}
