//! The burst tasq is built for: about 20,000 tasks from four producers, then a graceful shutdown.
//!
//! Run it with `cargo run --release --example demo`. It mixes priorities, delays, a flaky handler
//! that succeeds after retries, permanent failures, panics, dependency chains (some of whose heads
//! fail or are cancelled) and a few cancels; it prints the pool's counts every 250 ms and a summary
//! at the end. Every task's outcome is decided by its payload, so the summary is the same from run
//! to run (timings aside). It exits with status 1 if an accepted task did not reach a terminal
//! state or an outcome differs from the plan.

use std::collections::BTreeMap;
use std::process;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tasq::{
    CancelOutcome, CancelReason, Context, FailureReason, HandlerError, Outcome, Pool, RetryPolicy,
    TaskHandle, TaskType, TypeOptions,
};

// ===== the plan =====

const PRODUCERS: u64 = 4;
const TASKS_PER_PRODUCER: u64 = 5_000;
/// Each producer submits its share in this many bursts, `BURST_GAP` apart.
const BURSTS: u64 = 5;
const BURST_GAP: Duration = Duration::from_millis(100);
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);
/// Flaky tasks may run this many times.
const FLAKY_ATTEMPTS: u32 = 5;
/// Panics whose message contains this are expected: the panic hook keeps them off stderr.
const PANIC_MARKER: &str = "[expected panic]";

/// Plain work: a few microseconds of hashing.
const COMPUTE: TaskType<Job, u64> = TaskType::new("compute");
/// Fails with a retryable error until attempt `succeed_on`.
const FLAKY: TaskType<Flaky, u64> = TaskType::new("flaky");
/// Rejects its input with a permanent error.
const VALIDATE: TaskType<u64, u64> = TaskType::new("validate");
/// Panics on its input.
const PARSE: TaskType<u64, u64> = TaskType::new("parse");
/// One stage of a dependency chain; a failing head dooms the stages after it.
const STEP: TaskType<Step, u64> = TaskType::new("step");

struct Job {
    n: u64,
    submitted: Instant,
    /// Whether to record the dispatch latency (non-delayed tasks without dependencies).
    measure: bool,
    priority: u8,
}

struct Flaky {
    n: u64,
    /// The first attempt that succeeds (`u32::MAX`: none does).
    succeed_on: u32,
}

struct Step {
    n: u64,
    stage: u64,
    fail: bool,
}

/// What task number `n` of the burst is.
#[derive(Clone, Copy)]
enum Plan {
    Compute {
        delay: Option<Duration>,
    },
    Flaky {
        succeed_on: u32,
    },
    /// Flaky, but never succeeds: dead-lettered once its attempts are exhausted.
    Hopeless,
    Invalid,
    Corrupt,
    /// A head and `CHAIN_STEPS` dependents; the head fails if `head_fails`.
    Chain {
        head_fails: bool,
    },
    /// A head delayed by a minute and `CHAIN_STEPS` dependents; the head is cancelled.
    CancelledChain,
    /// Delayed by a minute, then cancelled.
    CancelledDelayed,
}

const CHAIN_STEPS: u64 = 3;

fn plan(n: u64) -> Plan {
    match n {
        n if n % 2_500 == 777 => Plan::CancelledChain,
        n if n % 2_000 == 1_234 => Plan::CancelledDelayed,
        n if n % 1_000 == 17 => Plan::Hopeless,
        n if n % 500 == 99 => Plan::Chain {
            head_fails: (n / 500) % 5 == 0,
        },
        n if n % 400 == 51 => Plan::Corrupt,
        n if n % 250 == 33 => Plan::Invalid,
        n if n % 50 == 7 => Plan::Flaky {
            succeed_on: 2 + (n % 3) as u32,
        },
        n if n % 10 == 3 => Plan::Compute {
            delay: Some(Duration::from_millis(100 + (n * 7919) % 900)),
        },
        _ => Plan::Compute { delay: None },
    }
}

fn priority(n: u64) -> u8 {
    match n % 16 {
        0 => 9,
        1..=3 => 5,
        4..=7 => 2,
        _ => 0,
    }
}

/// How a task should end, given its plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Succeed,
    Fail(FailureReason),
    Cancel(CancelKind),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum CancelKind {
    Requested,
    DependencyFailed,
    DependencyCancelled,
    Shutdown,
}

impl CancelKind {
    fn of(reason: &CancelReason) -> Option<CancelKind> {
        match reason {
            CancelReason::Requested => Some(CancelKind::Requested),
            CancelReason::DependencyFailed(_) => Some(CancelKind::DependencyFailed),
            CancelReason::DependencyCancelled(_) => Some(CancelKind::DependencyCancelled),
            CancelReason::Shutdown => Some(CancelKind::Shutdown),
            _ => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            CancelKind::Requested => "cancel requested",
            CancelKind::DependencyFailed => "dependency failed",
            CancelKind::DependencyCancelled => "dependency cancelled",
            CancelKind::Shutdown => "shutdown deadline",
        }
    }
}

/// An accepted task: its handle, how it should end, and whether the demo cancels it.
struct Planned {
    n: u64,
    handle: TaskHandle<u64>,
    expect: Expect,
    cancel: bool,
}

// ===== handlers =====

/// A few microseconds of work that the optimizer cannot remove.
fn hash(seed: u64) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    for i in 0..400u64 {
        h = (h ^ i).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    std::hint::black_box(h)
}

/// Dispatch latencies (submit → the handler's first instruction), by priority.
type Latencies = Arc<Mutex<Vec<(u8, Duration)>>>;

fn build_pool(latencies: &Latencies) -> Pool {
    let recorder = Arc::clone(latencies);
    let flaky = TypeOptions::new()
        .max_attempts(FLAKY_ATTEMPTS)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_millis(5),
            Duration::from_millis(50),
        ));
    let built = Pool::builder()
        // Keep every finished task, so all dead letters can be listed at the end.
        .retention(100_000, None)
        .register(COMPUTE, move |ctx: &Context, job: &Job| {
            if job.measure && ctx.attempt() == 1 {
                let waited = job.submitted.elapsed();
                recorder.lock().unwrap().push((job.priority, waited));
            }
            Ok::<_, HandlerError>(hash(job.n))
        })
        .register_with(FLAKY, flaky, |ctx: &Context, job: &Flaky| {
            if ctx.attempt() < job.succeed_on {
                return Err(HandlerError::retryable(format!(
                    "upstream timed out (attempt {})",
                    ctx.attempt()
                )));
            }
            Ok(hash(job.n))
        })
        .register(VALIDATE, |_: &Context, n: &u64| {
            Err::<u64, _>(HandlerError::permanent(format!(
                "record {n}: invalid checksum"
            )))
        })
        .register(PARSE, |_: &Context, n: &u64| -> Result<u64, HandlerError> {
            panic!("{PANIC_MARKER} record {n}: truncated input")
        })
        .register(STEP, |_: &Context, step: &Step| {
            if step.fail {
                return Err(HandlerError::permanent(format!(
                    "chain {}: source file missing",
                    step.n
                )));
            }
            Ok(hash(step.n * 16 + step.stage))
        })
        .build();
    built.unwrap_or_else(|error| fail(&format!("could not build the pool: {error}")))
}

// ===== producers =====

/// Submits task numbers `first..first + count` in bursts; returns every accepted task.
fn produce(pool: &Pool, first: u64, count: u64) -> Vec<Planned> {
    let mut planned = Vec::with_capacity(count as usize + 64);
    let per_burst = count.div_ceil(BURSTS);
    for n in first..first + count {
        if n > first && (n - first) % per_burst == 0 {
            thread::sleep(BURST_GAP);
        }
        submit_one(pool, n, &mut planned);
    }
    planned
}

fn submit_one(pool: &Pool, n: u64, out: &mut Vec<Planned>) {
    let p = priority(n);
    let mut push = |handle: TaskHandle<u64>, expect: Expect, cancel: bool| {
        out.push(Planned {
            n,
            handle,
            expect,
            cancel,
        });
    };
    let job = |measure| Job {
        n,
        submitted: Instant::now(),
        measure,
        priority: p,
    };
    match plan(n) {
        Plan::Compute { delay: None } => {
            let handle = submit(pool, COMPUTE.task(job(true)).priority(p));
            push(handle, Expect::Succeed, false);
        }
        Plan::Compute { delay: Some(delay) } => {
            let handle = submit(pool, COMPUTE.task(job(false)).priority(p).delay(delay));
            push(handle, Expect::Succeed, false);
        }
        Plan::CancelledDelayed => {
            let task = COMPUTE.task(job(false)).priority(p);
            let handle = submit(pool, task.delay(Duration::from_secs(60)));
            push(handle, Expect::Cancel(CancelKind::Requested), true);
        }
        Plan::Flaky { succeed_on } => {
            let handle = submit(pool, FLAKY.task(Flaky { n, succeed_on }).priority(p));
            push(handle, Expect::Succeed, false);
        }
        Plan::Hopeless => {
            let task = FLAKY.task(Flaky {
                n,
                succeed_on: u32::MAX,
            });
            let handle = submit(pool, task.priority(p));
            push(handle, Expect::Fail(FailureReason::Exhausted), false);
        }
        Plan::Invalid => {
            let handle = submit(pool, VALIDATE.task(n).priority(p));
            push(handle, Expect::Fail(FailureReason::Permanent), false);
        }
        Plan::Corrupt => {
            let handle = submit(pool, PARSE.task(n).priority(p));
            push(handle, Expect::Fail(FailureReason::Panicked), false);
        }
        Plan::Chain { head_fails } => {
            let head = Step {
                n,
                stage: 0,
                fail: head_fails,
            };
            let mut previous = submit(pool, STEP.task(head).priority(p));
            let head_expect = if head_fails {
                Expect::Fail(FailureReason::Permanent)
            } else {
                Expect::Succeed
            };
            push(previous.clone(), head_expect, false);
            for stage in 1..=CHAIN_STEPS {
                let step = Step {
                    n,
                    stage,
                    fail: false,
                };
                let task = STEP.task(step).priority(p).after([previous.id()]);
                previous = submit(pool, task);
                // A task is cancelled for its own dependency's ending: the stage right after a
                // failed head for its failure, the later ones for their predecessor's cancel.
                let expect = match (head_fails, stage) {
                    (false, _) => Expect::Succeed,
                    (true, 1) => Expect::Cancel(CancelKind::DependencyFailed),
                    (true, _) => Expect::Cancel(CancelKind::DependencyCancelled),
                };
                push(previous.clone(), expect, false);
            }
        }
        Plan::CancelledChain => {
            let task = COMPUTE.task(job(false)).priority(p);
            let mut previous = submit(pool, task.delay(Duration::from_secs(60)));
            push(
                previous.clone(),
                Expect::Cancel(CancelKind::Requested),
                true,
            );
            for stage in 1..=CHAIN_STEPS {
                let step = Step {
                    n,
                    stage,
                    fail: false,
                };
                let task = STEP.task(step).priority(p).after([previous.id()]);
                previous = submit(pool, task);
                push(
                    previous.clone(),
                    Expect::Cancel(CancelKind::DependencyCancelled),
                    false,
                );
            }
        }
    }
}

fn submit<P: Send + 'static>(pool: &Pool, task: tasq::Task<P, u64>) -> TaskHandle<u64> {
    pool.submit(task)
        .unwrap_or_else(|error| fail(&format!("submit refused: {error}")))
}

// ===== progress =====

/// Prints the pool's counts every 250 ms until `stop` says otherwise.
fn report_progress(pool: &Pool, started: Instant, stop: &mpsc::Receiver<()>) {
    loop {
        match stop.recv_timeout(Duration::from_millis(250)) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let s = pool.stats();
        let t = s.totals;
        println!(
            "[{:>5.2}s] ready {:>6}  running {:>2}  scheduled {:>5}  blocked {:>3} | \
             succeeded {:>6}  failed {:>3}  cancelled {:>3}  retries {:>4}",
            started.elapsed().as_secs_f64(),
            s.ready,
            s.running,
            s.scheduled,
            s.blocked,
            t.succeeded,
            t.failed,
            t.cancelled,
            t.retried,
        );
    }
}

// ===== main =====

fn main() {
    silence_expected_panics();
    let latencies: Latencies = Arc::new(Mutex::new(Vec::with_capacity(20_000)));
    let pool = build_pool(&latencies);
    let workers = pool.stats().workers;
    println!(
        "tasq demo: {} producers × {} tasks in {} bursts, {} workers, shutdown deadline {:?}",
        PRODUCERS,
        group(TASKS_PER_PRODUCER),
        BURSTS,
        workers,
        SHUTDOWN_DEADLINE
    );
    println!();

    let started = Instant::now();
    let (stop_tx, stop_rx) = mpsc::channel();
    let (planned, submit_time, cancel_surprises, report) = thread::scope(|scope| {
        let pool = &pool;
        scope.spawn(move || report_progress(pool, started, &stop_rx));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let first = p * TASKS_PER_PRODUCER;
                scope.spawn(move || produce(pool, first, TASKS_PER_PRODUCER))
            })
            .collect();
        let mut planned = Vec::new();
        for producer in producers {
            match producer.join() {
                Ok(mut tasks) => planned.append(&mut tasks),
                Err(_) => fail("a producer thread panicked"),
            }
        }
        let submit_time = started.elapsed();

        // A few cancels: ten delayed tasks, and the delayed heads of eight chains.
        let mut cancel_surprises = Vec::new();
        for task in planned.iter().filter(|t| t.cancel) {
            match task.handle.cancel() {
                Ok(CancelOutcome::Cancelled) => {}
                other => cancel_surprises.push(format!("task #{}: {other:?}", task.n)),
            }
        }

        let report = pool.shutdown(SHUTDOWN_DEADLINE);
        // Dropping the sender ends the reporter.
        drop(stop_tx);
        (planned, submit_time, cancel_surprises, report)
    });
    let total_time = started.elapsed();

    // ===== checks =====

    let accepted = planned.len() as u64;
    let mut unfinished = Vec::new();
    let mut mismatches = Vec::new();
    let mut succeeded = 0u64;
    let mut failed = 0u64;
    let mut cancelled_by: BTreeMap<CancelKind, u64> = BTreeMap::new();
    let mut cancelled = 0u64;
    for task in &planned {
        let Some(outcome) = task.handle.try_wait() else {
            unfinished.push(task.handle.id());
            continue;
        };
        let got = match &outcome {
            Outcome::Succeeded(_) => {
                succeeded += 1;
                Some(Expect::Succeed)
            }
            Outcome::Failed(failure) => {
                failed += 1;
                Some(Expect::Fail(failure.reason))
            }
            Outcome::Cancelled(reason) => {
                cancelled += 1;
                let kind = CancelKind::of(reason);
                if let Some(kind) = kind {
                    *cancelled_by.entry(kind).or_default() += 1;
                }
                kind.map(Expect::Cancel)
            }
        };
        if got != Some(task.expect) {
            mismatches.push(format!(
                "task #{} ({}): expected {:?}, got {:?}",
                task.n,
                task.handle.id(),
                task.expect,
                outcome
            ));
        }
    }
    let expected = |e: Expect| planned.iter().filter(|t| t.expect == e).count() as u64;
    let expected_cancelled = planned
        .iter()
        .filter(|t| matches!(t.expect, Expect::Cancel(_)))
        .count() as u64;
    let expected_failed = planned
        .iter()
        .filter(|t| matches!(t.expect, Expect::Fail(_)))
        .count() as u64;
    let expected_retries: u64 = (0..PRODUCERS * TASKS_PER_PRODUCER)
        .map(|n| match plan(n) {
            Plan::Flaky { succeed_on } => u64::from(succeed_on - 1),
            Plan::Hopeless => u64::from(FLAKY_ATTEMPTS - 1),
            _ => 0,
        })
        .sum();

    let stats = pool.stats();
    let dead = pool.dead_letters();
    let mut dead_by: BTreeMap<(String, &'static str), (u64, u32)> = BTreeMap::new();
    for letter in &dead {
        let entry = dead_by
            .entry((letter.failure.reason.to_string(), letter.task_type))
            .or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(letter.failure.attempts);
    }

    // ===== summary =====

    println!();
    println!("== summary ==");
    println!(
        "accepted            {:>7}   (pool counted {})",
        group(accepted),
        group(stats.totals.submitted)
    );
    println!(
        "succeeded           {:>7}   (planned {})",
        group(succeeded),
        group(expected(Expect::Succeed))
    );
    println!(
        "failed (dead)       {:>7}   (planned {})",
        group(failed),
        group(expected_failed)
    );
    println!(
        "cancelled           {:>7}   (planned {})",
        group(cancelled),
        group(expected_cancelled)
    );
    println!(
        "retries             {:>7}   (planned {})",
        group(stats.totals.retried),
        group(expected_retries)
    );
    println!();
    println!("dead letters ({}), by reason:", dead.len());
    for ((reason, task_type), (count, attempts)) in &dead_by {
        println!(
            "  {reason:<10} {task_type:<9} {count:>5}   ({attempts} attempt{})",
            if *attempts == 1 { "" } else { "s" }
        );
    }
    println!("cancelled, by reason:");
    for (kind, count) in &cancelled_by {
        println!("  {:<21} {count:>4}", kind.label());
    }
    println!();

    let throughput = accepted as f64 / total_time.as_secs_f64();
    println!(
        "submitting          {:>7.0} ms  ({} producers, {} bursts {} ms apart)",
        ms(submit_time),
        PRODUCERS,
        BURSTS,
        BURST_GAP.as_millis()
    );
    println!(
        "first submit → done {:>7.0} ms  (delays of up to 1 s included)",
        ms(total_time)
    );
    println!(
        "throughput          {:>7} tasks/s  (accepted ÷ first submit → done)",
        group(throughput as u64)
    );
    println!(
        "shutdown            {:>7.0} ms  (drain after the cancels; deadline {:?} {})",
        ms(report.elapsed),
        SHUTDOWN_DEADLINE,
        if report.deadline_reached {
            "REACHED"
        } else {
            "not reached"
        }
    );
    println!();
    print_latencies(&latencies.lock().unwrap());
    println!();

    // ===== verdict =====

    let mut problems = Vec::new();
    if !unfinished.is_empty() {
        problems.push(format!(
            "{} accepted task(s) did not reach a terminal state, e.g. {}",
            unfinished.len(),
            unfinished[0]
        ));
    }
    if succeeded + failed + cancelled != accepted - unfinished.len() as u64
        || stats.totals.submitted != accepted
    {
        problems.push(format!(
            "counts do not add up: {succeeded} + {failed} + {cancelled} vs {accepted} accepted \
             ({} counted by the pool)",
            stats.totals.submitted
        ));
    }
    if (report.succeeded, report.failed, report.cancelled) != (succeeded, failed, cancelled) {
        problems.push(format!(
            "the shutdown report ({} / {} / {}) disagrees with the handles",
            report.succeeded, report.failed, report.cancelled
        ));
    }
    if dead.len() as u64 != failed {
        problems.push(format!(
            "{} dead letters for {failed} failed tasks",
            dead.len()
        ));
    }
    if stats.totals.retried != expected_retries {
        problems.push(format!(
            "{} retries, {expected_retries} planned",
            stats.totals.retried
        ));
    }
    for surprise in cancel_surprises {
        problems.push(format!("cancel did not find a waiting task: {surprise}"));
    }
    if !mismatches.is_empty() {
        problems.push(format!(
            "{} outcome(s) differ from the plan, e.g. {}",
            mismatches.len(),
            mismatches[0]
        ));
    }
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("error: {problem}");
        }
        process::exit(1);
    }
    println!(
        "ok: all {} accepted tasks reached a terminal state, each as planned",
        group(accepted)
    );
}

// ===== helpers =====

/// Prints the dispatch latency percentiles, overall and per priority.
fn print_latencies(samples: &[(u8, Duration)]) {
    let mut all: Vec<Duration> = samples.iter().map(|&(_, d)| d).collect();
    all.sort_unstable();
    println!(
        "dispatch latency (submit → handler start; {} non-delayed compute tasks; queueing in \
         the burst included)",
        group(all.len() as u64)
    );
    println!("  {:<12} {:>9} {:>9}", "", "p50", "p99");
    println!(
        "  {:<12} {:>9} {:>9}",
        "all",
        pretty(percentile(&all, 50)),
        pretty(percentile(&all, 99))
    );
    let mut by_priority: BTreeMap<u8, Vec<Duration>> = BTreeMap::new();
    for &(p, d) in samples {
        by_priority.entry(p).or_default().push(d);
    }
    for (p, mut durations) in by_priority.into_iter().rev() {
        durations.sort_unstable();
        println!(
            "  {:<12} {:>9} {:>9}",
            format!("priority {p}"),
            pretty(percentile(&durations, 50)),
            pretty(percentile(&durations, 99))
        );
    }
}

/// The `pct`-th percentile of sorted samples (nearest rank).
fn percentile(sorted: &[Duration], pct: usize) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (sorted.len() * pct).div_ceil(100).max(1);
    Some(sorted[rank - 1])
}

fn pretty(d: Option<Duration>) -> String {
    match d {
        None => "-".to_owned(),
        Some(d) if d < Duration::from_millis(1) => format!("{} µs", d.as_micros()),
        Some(d) => format!("{:.1} ms", ms(d)),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// 20000 → "20,000".
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Keeps the expected panics (those carrying `PANIC_MARKER`) off stderr; others print as usual.
fn silence_expected_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        if !message.is_some_and(|m| m.contains(PANIC_MARKER)) {
            default(info);
        }
    }));
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    process::exit(1)
}
