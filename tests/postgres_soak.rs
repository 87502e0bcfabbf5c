//! Soak of the durable store: a long randomized run on PostgreSQL that mixes every feature at
//! once, then checks the run's invariants (the durable counterpart of `tests/soak.rs`).
//!
//! Two worker pools share one schema, as two processes would (pool A prefetches), and a producer
//! pool without workers submits tasks of three types (three, five and one attempts; retries
//! after a millisecond or so). Each payload says what its handler does: succeed, fail retryably
//! k times then succeed, exhaust its attempts, fail permanently, fail permanently only on the
//! payload's first run ever (so a resubmit succeeds), panic, or sleep on its token (interrupted
//! by a cancel or a shutdown deadline, it fails retryably). Tasks go in alone or in batches, with
//! random priorities, some delays, idempotency keys from a small set shared by the types
//! (duplicates and key conflicts happen), and dependencies on 1–3 recent tasks. A canceller
//! thread cancels a share of them (through a pool or the handle) at random moments after their
//! submit, so cancels meet blocked, delayed, ready, held and running tasks. Now and then the
//! producer lists the dead letters (all, by type, a page) and resubmits some (with or without
//! the dependents their failure cancelled; now and then with the wrong type), takes or purges
//! others. Late in the run pool A shuts down with a short random deadline (once one of its
//! handlers sleeps) while pool B carries on; the run ends when every handle has its outcome.
//!
//! Checked at the end (all violations are collected, then reported with the seed): every handle
//! returns, and all handles of one id (deduplicated submits, another pool's `handle`) agree; a
//! duplicate is a task that held its key; each outcome fits what its handler was told to do, the
//! cancels accepted and the dependencies' outcomes; a task's runs are attempts 1, 2, … in turn,
//! no more than its type allows, under increasing leases never used twice, none after a run that
//! ended it; a dependent never started before all its dependencies had succeeded, nor ran if one
//! did not; no task started after a cancel said `Cancelled`; a token fired only on a cancel or
//! the shutdown deadline; pool A ran nothing after its shutdown; the rows agree (none left
//! unfinished; attempts; dead letters; resubmissions); every pool's `check_invariants` holds;
//! `stats().workers` stayed at the configured count while a pool ran, with no worker panic and
//! no store error; the three pools' totals add up to the outcomes seen.
//!
//! `TASQ_PG_SOAK_TASKS` sets the number of tasks (default [`DEFAULT_TASKS`]); `TASQ_PG_SOAK_SEED`
//! replays a run's choices (the seed is printed, and named in a failure; what the pools make of
//! the choices still depends on timing); `TASQ_PG_SOAK_WATCHDOG_SECS` (default 300) bounds it.
#![cfg(feature = "postgres")]

mod support_pg;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde::{Deserialize, Serialize};
use support_pg::TestDb;
use tasq::{
    CancelOutcome, CancelReason, Context, Failure, FailureReason, HandlerError, Outcome, Pool,
    ResubmitError, RetryPolicy, ShutdownReport, SubmitErrorKind, TaskHandle, TaskId, TaskState,
    TaskType, Totals, TypeOptions,
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

// ===== the tasks =====

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Ty {
    Fast,
    Patient,
    Once,
}

impl Ty {
    const ALL: [Ty; 3] = [Ty::Fast, Ty::Patient, Ty::Once];

    fn task_type(self) -> TaskType<Job, u64> {
        TaskType::new(["pg-soak-fast", "pg-soak-patient", "pg-soak-once"][self as usize])
    }

    fn max_attempts(self) -> u32 {
        [3, 5, 1][self as usize]
    }

    /// The others take the pool's policy (base 1 ms); PATIENT retries faster still.
    fn options(self) -> TypeOptions {
        let options = TypeOptions::new().max_attempts(self.max_attempts());
        let fast = RetryPolicy::exponential(Duration::from_micros(500), Duration::from_millis(4));
        if self == Ty::Patient {
            options.retry_policy(fast)
        } else {
            options
        }
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Job {
    seq: u64,
    ty: Ty,
    kind: Kind,
}

impl Job {
    fn output(&self) -> u64 {
        self.seq * 2 + 1
    }
}

fn make_job(rng: &mut Rng, seq: u64, ty: Ty) -> Job {
    let limit = ty.max_attempts();
    let kind = match rng.below(100) {
        0..12 if limit > 1 => Kind::Transient(1 + rng.below(u64::from(limit - 1)) as u32),
        12..17 => Kind::Exhaust,
        17..21 => Kind::Permanent,
        21..25 => Kind::PermanentOnce,
        25..28 => Kind::Panic,
        28..38 => Kind::Sleep(2 + rng.below(60) as u32),
        _ => Kind::Succeed,
    };
    Job { seq, ty, kind }
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
#[derive(Clone, Copy, Debug)]
struct Run {
    attempt: u32,
    lease: Option<i64>,
    start: u64,
    end: u64,
    returned: Returned,
    /// Its token fired during the sleep.
    interrupted: bool,
    /// The first run of this payload ever.
    first_of_seq: bool,
    /// On a worker of pool A.
    on_a: bool,
}

#[derive(Default)]
struct Recorder {
    clock: AtomicU64,
    runs: Mutex<HashMap<TaskId, Vec<Run>>>,
    /// Payload `seq`s that have run.
    ran: Mutex<HashSet<u64>>,
    /// Told when a sleeping task starts on pool A (armed just before A's shutdown).
    sleeping_on_a: Mutex<Option<Sender<()>>>,
}

impl Recorder {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst) + 1
    }
}

fn run_job(rec: &Recorder, ctx: &Context, job: &Job) -> Result<u64, HandlerError> {
    let start = rec.tick();
    let on_a = thread::current()
        .name()
        .is_some_and(|n| n.starts_with("pg-soak-a-"));
    let first_of_seq = rec.ran.lock().unwrap().insert(job.seq);
    let mut interrupted = false;
    let retryable = |error: HandlerError| (Returned::Retryable, Err(error));
    let (returned, result) = match job.kind {
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
    };
    let (attempt, lease, end) = (ctx.attempt(), ctx.lease_id(), rec.tick());
    let run = Run {
        attempt,
        lease,
        start,
        end,
        returned,
        interrupted,
        first_of_seq,
        on_a,
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

fn build_pool(url: &str, workers: usize, prefetch: usize, rec: &Arc<Recorder>, name: &str) -> Pool {
    let mut builder = Pool::builder()
        .postgres(url.to_owned())
        .workers(workers)
        .prefetch(prefetch)
        .lease(LEASE)
        .poll_interval(Duration::from_millis(100))
        .retry_policy(RetryPolicy::exponential(
            Duration::from_millis(1),
            Duration::from_millis(8),
        ))
        // Every row stays, for the checks; every dead letter too.
        .retention(usize::MAX, None)
        .dead_letter_limit(1_000_000)
        .thread_name(name);
    for ty in Ty::ALL {
        let rec = Arc::clone(rec);
        let handler = move |ctx: &Context, job: &Job| run_job(&rec, ctx, job);
        builder = builder.register_with(ty.task_type(), ty.options(), handler);
    }
    builder.build().expect("build a durable pool")
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
        task: (Job, Vec<TaskId>, Option<String>, Origin),
    ) {
        let (id, (job, deps, key, origin)) = (handle.id(), task);
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
                deps,
                key,
                origin,
                handle,
            },
        );
    }
}

/// A cancel the producer orders: when, which task, and its handle.
type CancelOrder = (Instant, TaskId, TaskHandle<u64>);

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
        let ty = Ty::ALL[rng.below(3) as usize];
        let count = if rng.chance(25) { 2 + rng.below(5) } else { 1 }.min(cx.tasks - seq);
        let (mut batch, mut meta) = (Vec::new(), Vec::new());
        for _ in 0..count {
            let job = make_job(rng, seq, ty);
            seq += 1;
            let mut task = ty.task_type().task(job).priority(rng.below(10) as u8);
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
            meta.push((job, deps, key));
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
        for (handle, (job, deps, key)) in handles.into_iter().zip(meta) {
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
                orders.send((at, id, handle.clone())).unwrap();
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
            p.accept(cx.f, handle, (job, deps, key, Origin::Submitted));
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
        1 => pool.dead_letters_of(Ty::ALL[rng.below(3) as usize].task_type(), None, 30),
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
        let reasons = [
            FailureReason::Exhausted,
            FailureReason::Permanent,
            FailureReason::Panicked,
        ];
        let fits = letter.task_type == ty.name() && reasons.contains(&letter.failure.reason);
        f.check(fits, "a dead letter's type or reason is wrong", || {
            format!("{letter:?} of {job:?}")
        });
        p.listed.entry(id).or_insert(letter.failure.clone());
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
                            orders.send((at, handle.id(), handle.clone())).unwrap();
                        }
                        p.accept(f, handle, (job, Vec::new(), key, Origin::Resubmitted(id)));
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
                p.accept(
                    f,
                    revived.task,
                    (job, Vec::new(), key, Origin::Resubmitted(id)),
                );
                for (old, new) in revived.dependents {
                    p.count("dependents brought back");
                    p.resubmitted.insert(old, new);
                    let Some(dependent) = p.tasks.get(&old) else {
                        f.add("brought back a task never submitted", || format!("{old}"));
                        continue;
                    };
                    let (job, key) = (dependent.job, dependent.key.clone());
                    let deps = dependent
                        .deps
                        .iter()
                        .map(|d| *renamed.get(d).unwrap_or(d))
                        .collect();
                    match pool.handle(job.ty.task_type(), new) {
                        Some(handle) => {
                            p.accept(f, handle, (job, deps, key, Origin::BroughtBack(old)))
                        }
                        None => f.add("no handle to a dependent brought back", || format!("{new}")),
                    }
                }
            }
            14 => {
                let wrong = Ty::ALL[(job.ty as usize + 1 + rng.below(2) as usize) % 3];
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
        for (_, id, handle) in ripe {
            let before = rec.tick();
            let result = match rng.below(3) {
                0 => cx.producer.cancel(id),
                1 => cx.b.cancel(id),
                _ => handle.cancel(),
            };
            records.push(CancelRecord {
                id,
                before,
                after: rec.tick(),
                result,
            });
        }
        let next = due.iter().map(|(at, _, _)| *at).min();
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

/// Watches the worker pools until told to stop: every worker alive while its pool runs.
fn sample(cx: &Cx<'_>, a_closing: &AtomicBool, stop: Receiver<()>) {
    loop {
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

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn durable_soak() {
    let Some(db) = TestDb::new() else { return };
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
            eprintln!(
                "\npostgres soak: WATCHDOG: not done in {limit:?}, in phase `{phase}` (seed {seed})"
            );
            std::process::exit(101);
        }
    });
    let set_phase = |now| *phase.lock().unwrap() = now;

    let rec = Arc::new(Recorder::default());
    let findings = Findings::default();
    let producer = build_pool(&db.url, 0, 0, &rec, "pg-soak-producer");
    let pool_a = build_pool(&db.url, WORKERS_A, PREFETCH_A, &rec, "pg-soak-a");
    let pool_b = build_pool(&db.url, WORKERS_B, 0, &rec, "pg-soak-b");
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
    let cancel_rng = Rng(seed ^ 0xC0FF_EE00);
    let (p, cancels, (report_a, a_closed), outcomes) = thread::scope(|s| {
        let canceller = s.spawn(|| cancel_loop(order_rx, &cx, &rec, cancel_rng));
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
        let cancels = canceller.join().unwrap();
        let a = closer.join().unwrap();

        set_phase("waiting for every handle");
        let mut give_up = Instant::now() + HANDLE_STALL;
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
                None => findings.add("a handle never returned", || {
                    format!("{id} ({:?}): {:?}", p.tasks[id].job, producer.info(*id))
                }),
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
        (p, cancels, a, outcomes)
    });

    set_phase("shutting down");
    let report_b = pool_b.shutdown(Duration::from_secs(30));
    producer.shutdown(Duration::from_secs(30));
    set_phase("checking");
    check_run(
        &cx,
        &rec,
        &db,
        &p,
        &cancels,
        &outcomes,
        (&report_a, a_closed),
    );

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
         {a_deadline:?}: reached {}, {} interrupted; pool B's report: {} succeeded\n  {:.1} s",
        p.order.len(),
        p.counts,
        report_a.deadline_reached,
        report_a.interrupted.len(),
        report_b.succeeded,
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
    let all_runs = rec.runs.lock().unwrap();
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
    let sql = "SELECT id, status, attempts, max_attempts, dead, resubmitted_as FROM tasq_tasks";
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
        let (job, runs, max) = (task.job, runs_of(id), task.job.ty.max_attempts());
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
            let retried = pair[0].returned == Returned::Retryable;
            expect(retried, "a task ran again after a run that ended it");
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
        for run in runs.iter().filter(|r| r.interrupted) {
            let why = requested || (run.on_a && interrupted.contains(id));
            expect(
                why,
                "a token fired without a cancel or the shutdown deadline",
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
    for (what, counted, seen) in [
        ("submitted", sum(|t| t.submitted), p.order.len() as u64),
        (
            "succeeded",
            sum(|t| t.succeeded),
            seen(TaskState::Succeeded),
        ),
        ("failed", sum(|t| t.failed), seen(TaskState::Failed)),
        (
            "cancelled",
            sum(|t| t.cancelled),
            seen(TaskState::Cancelled),
        ),
    ] {
        f.check(counted == seen, "the pools' totals do not add up", || {
            format!(
                "{what}: the pools counted {counted}, the handles saw {seen}; {totals:?}; the \
                 cancelled tasks: {cancelled_by_origin:?}"
            )
        });
    }
    // A retryable run before the last attempt is a retry, unless a cancel ended it.
    let retryable = all_runs
        .iter()
        .flat_map(|(id, runs)| runs.iter().map(move |r| (id, r)));
    let retryable = retryable.filter(|(id, r)| {
        r.returned == Returned::Retryable && r.attempt < p.tasks[id].job.ty.max_attempts()
    });
    let (retryable, retried) = (retryable.count() as u64, sum(|t| t.retried));
    let cancelled = seen(TaskState::Cancelled);
    let fits = retried <= retryable && retried + cancelled >= retryable;
    f.check(fits, "the retries counted do not fit the runs", || {
        format!("retried {retried}, retryable runs {retryable}, cancelled {cancelled}")
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
