//! Concurrency and rate limits: a limited type never runs more tasks at once, nor starts more in
//! a stretch of time, than its limit allows; the tasks held back stay ready, burn no attempt,
//! and start as soon as the limit lets them (no lost wake-up); other types run meanwhile.
//! On both stores.

mod support_rng;
mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use support_rng::Rng;
use support_store::{HANG_GUARD, Signal, TestPool, finish, raise, settle};
use tasq::{
    HandlerError, ManualClock, Outcome, RateLimit, TaskHandle, TaskState, TaskType, TypeOptions,
};

/// A task of a limited type; its handler holds its worker until the test lets it through.
const LIMITED: TaskType<u64, ()> = TaskType::new("limited");
/// A task of a type without limits.
const OTHER: TaskType<u64, u64> = TaskType::new("other");
/// A rate-limited task whose handler raises the signal its payload names.
const RATED: TaskType<u64, ()> = TaskType::new("rated");

/// Handlers that say when they start, then wait until the test lets one of them through.
struct Valve {
    started_tx: Sender<()>,
    started: Receiver<()>,
    open: Sender<()>,
    opened: Receiver<()>,
}

impl Valve {
    fn new() -> Valve {
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (open, opened) = crossbeam_channel::unbounded();
        Valve {
            started_tx,
            started,
            open,
            opened,
        }
    }

    /// The handler's side: says it started, waits for its turn to return.
    fn pass(started: &Sender<()>, opened: &Receiver<()>) {
        let _ = started.send(());
        opened
            .recv_timeout(HANG_GUARD)
            .expect("the test never let the handler through");
    }

    fn wait_started(&self, what: &str) {
        self.started
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|_| panic!("{what} never started"));
    }

    fn let_one_through(&self) {
        self.open.send(()).expect("the valve is open");
    }
}

/// Runs an unlimited task at priority 0 and waits for it. Submitted after higher-priority
/// limited tasks, it runs only once a worker has popped past every one of them: held them, or
/// started them.
fn run_other(pool: &TestPool, n: u64) {
    let other = pool.submit(OTHER.task(n)).unwrap();
    assert_eq!(finish(&other), Outcome::Succeeded(n * 2));
}

fn attempts<O>(pool: &TestPool, handle: &TaskHandle<O>) -> u32 {
    pool.info(handle.id())
        .expect("the task is remembered")
        .attempts
}

conformance! {
    fn a_concurrency_limit_is_never_exceeded_and_held_tasks_burn_no_attempt(builder) {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let valve = Valve::new();
        let (now, top) = (Arc::clone(&running), Arc::clone(&most));
        let (started, opened) = (valve.started_tx.clone(), valve.opened.clone());
        let pool = builder
            .workers(3)
            .with_gates()
            .register_with(LIMITED, TypeOptions::new().concurrency_limit(2), move |_, _: &u64| {
                top.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                Valve::pass(&started, &opened);
                now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(())
            })
            .register(OTHER, |_, n: &u64| Ok::<_, HandlerError>(n * 2))
            .build();

        let handles: Vec<_> = (0..10)
            .map(|n| pool.submit(LIMITED.task(n).priority(5)).unwrap())
            .collect();
        valve.wait_started("the first limited task");
        valve.wait_started("the second limited task");
        // The third worker runs this only after popping past the eight other limited tasks: had
        // it started one, it would be stuck in the valve and this would never run.
        run_other(&pool, 1);
        assert!(valve.started.try_recv().is_err(), "a third limited task started");
        let stats = pool.stats();
        assert_eq!((stats.running, stats.ready), (2, 8), "{stats:?}");
        let held: Vec<_> = handles
            .iter()
            .filter(|h| h.status() == TaskState::Ready)
            .collect();
        assert_eq!(held.len(), 8);
        for handle in &held {
            assert_eq!(attempts(&pool, handle), 0, "a held task burned an attempt");
        }

        // Other types keep the free worker busy at full speed meanwhile.
        let others: Vec<_> = (0..100).map(|n| pool.submit(OTHER.task(n)).unwrap()).collect();
        for (n, other) in (0..).zip(&others) {
            assert_eq!(finish(other), Outcome::Succeeded(n * 2));
        }

        // Each task that ends lets exactly one more start.
        for _ in 0..8 {
            valve.let_one_through();
            valve.wait_started("a held limited task");
        }
        run_other(&pool, 2);
        assert!(valve.started.try_recv().is_err(), "a third limited task started");
        valve.let_one_through();
        valve.let_one_through();
        for handle in &handles {
            assert!(finish(handle).is_succeeded());
            assert_eq!(attempts(&pool, handle), 1, "a held task burned an attempt");
        }
        assert_eq!(most.load(Ordering::SeqCst), 2, "the limit was exceeded or never reached");
        assert_eq!(pool.stats().ready, 0);
    }

    fn many_workers_never_run_more_than_the_limit(builder) {
        const LIMIT: usize = 3;
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (now, top) = (Arc::clone(&running), Arc::clone(&most));
        let pool = builder
            .workers(6)
            .register_with(
                LIMITED,
                TypeOptions::new().concurrency_limit(LIMIT as u32).max_attempts(3),
                move |ctx, n: &u64| {
                    top.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    // Long enough for the other workers to pile in, if the limit let them: a
                    // short sleep, not a spin of yields (beside CPU-bound jobs each yield can
                    // cost a whole time slice, and 300 tasks three at a time outran the guard).
                    std::thread::sleep(Duration::from_micros(300));
                    now.fetch_sub(1, Ordering::SeqCst);
                    // Some fail once: a retry holds its place under the limit too.
                    if n % 7 == 0 && ctx.attempt() == 1 {
                        return Err(HandlerError::retryable("once").retry_after(Duration::ZERO));
                    }
                    Ok::<_, HandlerError>(())
                },
            )
            .register(OTHER, |_, n: &u64| Ok::<_, HandlerError>(n * 2))
            .build();
        let handles: Vec<_> = (0..300u64)
            .map(|n| pool.submit(LIMITED.task(n).priority((n % 3) as u8)).unwrap())
            .collect();
        let others: Vec<_> = (0..300u64).map(|n| pool.submit(OTHER.task(n)).unwrap()).collect();
        for (n, handle) in (0..).zip(&handles) {
            assert!(finish(handle).is_succeeded());
            let expected = if n % 7 == 0 { 2 } else { 1 };
            assert_eq!(attempts(&pool, handle), expected, "task {n}");
        }
        for other in &others {
            assert!(finish(other).is_succeeded());
        }
        let most = most.load(Ordering::SeqCst);
        assert!((1..=LIMIT).contains(&most), "{most} ran at once, the limit is {LIMIT}");
    }

    fn a_cancelled_held_task_never_starts_and_frees_nothing_it_did_not_take(builder) {
        let valve = Valve::new();
        let (started, opened) = (valve.started_tx.clone(), valve.opened.clone());
        let pool = builder
            .workers(2)
            .with_gates()
            .register_with(LIMITED, TypeOptions::new().concurrency_limit(1), move |_, _: &u64| {
                Valve::pass(&started, &opened);
                Ok::<_, HandlerError>(())
            })
            .register(OTHER, |_, n: &u64| Ok::<_, HandlerError>(n * 2))
            .build();
        let handles: Vec<_> = (0..4)
            .map(|n| pool.submit(LIMITED.task(n).priority(5)).unwrap())
            .collect();
        valve.wait_started("the first limited task");
        run_other(&pool, 1);
        // Cancel two of the three held tasks: they end at once, without a run.
        let running = handles
            .iter()
            .position(|h| h.status() == TaskState::Running)
            .expect("one runs");
        let held: Vec<_> = (0..4).filter(|&i| i != running).collect();
        for &i in &held[..2] {
            assert_eq!(handles[i].cancel().unwrap(), tasq::CancelOutcome::Cancelled);
        }
        assert_eq!(pool.stats().ready, 1);
        // The running one ends: the last held one starts; then it ends too.
        valve.let_one_through();
        valve.wait_started("the last held task");
        run_other(&pool, 2);
        assert!(valve.started.try_recv().is_err(), "a cancelled task started");
        valve.let_one_through();
        assert!(finish(&handles[running]).is_succeeded());
        assert!(finish(&handles[held[2]]).is_succeeded());
        for &i in &held[..2] {
            assert!(finish(&handles[i]).is_cancelled());
            assert_eq!(attempts(&pool, &handles[i]), 0);
        }
        pool.wait_idle();
        assert_eq!(pool.check_invariants(), Ok(()));
    }

    fn a_rate_limit_starts_at_most_its_burst_plus_its_rate_over_any_stretch(builder) {
        const TASKS: usize = 12;
        const RATE: f64 = 2.0;
        const BURST: u32 = 3;
        let clock = ManualClock::new();
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&starts);
        let pool = builder
            .workers(1)
            .manual_clock(clock.clone())
            .with_gates()
            .register_with(
                RATED,
                TypeOptions::new().rate_limit(RateLimit::per_second(RATE).with_burst(BURST)),
                move |_, signal: &u64| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    raise(*signal);
                    Ok::<_, HandlerError>(())
                },
            )
            .build();
        let started = Signal::new();
        let handles: Vec<_> = (0..TASKS)
            .map(|_| pool.submit(RATED.task(started.number()).priority(5)).unwrap())
            .collect();

        // The bucket starts full: the burst starts at once, then nothing until the clock moves.
        let mut seen = 0;
        let mut elapsed = 0.0;
        let check = |elapsed: f64, seen: &mut usize| {
            let allowed = (f64::from(BURST) + RATE * elapsed).floor() as usize;
            let allowed = allowed.min(TASKS);
            // Held tasks start once their tokens are there: nobody needs to poke the pool.
            while *seen < allowed {
                started.wait("a start the rate allows");
                *seen += 1;
            }
            // The worker gets past every rated task before it runs the probe (priority 0).
            settle(&pool);
            let now = starts.load(Ordering::SeqCst);
            assert!(
                now <= allowed,
                "{now} starts after {elapsed} s: at most {BURST} + {RATE}/s × {elapsed} s allowed"
            );
            assert!(!started.try_wait(), "more starts than counted");
            let held = handles.iter().filter(|h| h.status() == TaskState::Ready).count();
            assert_eq!(held, TASKS - now, "held tasks stay ready");
        };
        check(elapsed, &mut seen);
        for step in [0.5, 0.5, 1.0, 0.25, 0.25, 1.5, 0.1, 10.0] {
            clock.advance(Duration::from_secs_f64(step));
            elapsed += step;
            check(elapsed, &mut seen);
        }
        for handle in &handles {
            assert!(finish(handle).is_succeeded());
            assert_eq!(attempts(&pool, handle), 1, "a held task burned an attempt");
        }
    }

    fn a_rate_limited_task_starts_on_time_while_the_timer_waits_for_a_later_one(builder) {
        // On the system clock: the timer first sleeps for an hour (a delayed task), then a
        // held task needs a token in 20 ms. The hold must shorten the timer's sleep.
        let pool = builder
            .workers(2)
            .register_with(
                RATED,
                TypeOptions::new().rate_limit(RateLimit::per_second(50.0)),
                |_, _: &u64| Ok::<_, HandlerError>(()),
            )
            .register(OTHER, |_, n: &u64| Ok::<_, HandlerError>(n * 2))
            .build();
        let late = pool
            .submit(OTHER.task(1).delay(Duration::from_secs(3600)))
            .unwrap();
        // One at a time: the first takes the burst; each next one is popped by the worker that
        // is not the timer, held, and that worker goes to sleep with nothing to do. Only the
        // timer can start it, if the hold woke it.
        for n in 0..4 {
            let handle = pool.submit(RATED.task(n)).unwrap();
            assert!(finish(&handle).is_succeeded(), "a held task was never woken for");
        }
        assert_eq!(late.status(), TaskState::Scheduled);
        late.cancel().unwrap();
    }
}

#[test]
fn limits_of_zero_are_refused() {
    let built = tasq::Pool::builder()
        .register_with(
            LIMITED,
            TypeOptions::new().concurrency_limit(0),
            |_, _: &u64| Ok::<_, HandlerError>(()),
        )
        .build();
    assert!(
        matches!(built, Err(tasq::BuildError::InvalidSetting { .. })),
        "{built:?}"
    );
}

// ===== every gate at once, with everything else =====

/// A randomized run on the embedded store mixing concurrency limits, rate limits, a breaker
/// shared by two types, aging, retries, permanent failures, panics, delays, dependencies and
/// cancels, on a manual clock a thread keeps moving; the engine's invariants are checked all
/// along. At the end: every task finished, no limit was ever exceeded, no task cancelled before
/// it started ran afterwards, no task ran more often than its attempts allow, and the totals
/// balance.
#[test]
fn embedded_gates_mixed_with_everything() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;
    use tasq::{Aging, Breaker, CancelOutcome, Context, Pool, RetryPolicy, TaskId};

    const A: TaskType<u64, u64> = TaskType::new("mixed-a");
    const B: TaskType<u64, u64> = TaskType::new("mixed-b");
    const C: TaskType<u64, u64> = TaskType::new("mixed-c");
    const D: TaskType<u64, u64> = TaskType::new("mixed-d");
    const TASKS: usize = 3000;
    let seed = support_rng::seed("TASQ_LIMITS_SEED");
    println!("seed {seed} (replay with TASQ_LIMITS_SEED={seed})");

    /// What the handlers share: runs per task, tasks running per type, the most ever.
    #[derive(Default)]
    struct Watch {
        runs: Mutex<HashMap<TaskId, u32>>,
        running: [AtomicUsize; 4],
        most: [AtomicUsize; 4],
    }
    let watch = Arc::new(Watch::default());
    let handler = |index: usize, watch: &Arc<Watch>| {
        let watch = Arc::clone(watch);
        move |ctx: &Context, job: &u64| {
            *watch.runs.lock().unwrap().entry(ctx.id()).or_default() += 1;
            let now = watch.running[index].fetch_add(1, Ordering::SeqCst) + 1;
            watch.most[index].fetch_max(now, Ordering::SeqCst);
            std::thread::yield_now();
            watch.running[index].fetch_sub(1, Ordering::SeqCst);
            match job % 8 {
                4 => Err(HandlerError::retryable("flaky")),
                5 => Err(HandlerError::permanent("bad")),
                6 => panic!("mixed: expected panic"),
                7 if ctx.attempt() == 1 => Err(HandlerError::retryable("once")),
                _ => Ok(*job),
            }
        }
    };
    let retry = RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(4));
    let clock = ManualClock::new();
    let opened = Arc::new(AtomicUsize::new(0));
    let opens = Arc::clone(&opened);
    let pool = Pool::builder()
        .workers(4)
        .seed(seed)
        .on_event(move |event| {
            if let tasq::Event::Breaker {
                state: tasq::BreakerState::Open,
                ..
            } = event
            {
                opens.fetch_add(1, Ordering::SeqCst);
            }
        })
        .quiet_panics(true)
        .manual_clock(clock.clone())
        .retry_policy(retry)
        .breaker("d", Breaker::new(4, Duration::from_millis(5)))
        .aging(Aging::new(Duration::from_millis(2), 6))
        .register_with(
            A,
            TypeOptions::new()
                .concurrency_limit(2)
                .downstream("d")
                .max_attempts(3),
            handler(0, &watch),
        )
        .register_with(
            B,
            TypeOptions::new()
                .rate_limit(RateLimit::per_second(2000.0).with_burst(4))
                .downstream("d")
                .max_attempts(2),
            handler(1, &watch),
        )
        .register_with(
            C,
            TypeOptions::new()
                .concurrency_limit(1)
                .rate_limit(RateLimit::per_second(1000.0))
                .max_attempts(1),
            handler(2, &watch),
        )
        .register_with(D, TypeOptions::new().max_attempts(2), handler(3, &watch))
        .build()
        .unwrap();
    let attempts_of = |ty: &str| match ty {
        "mixed-a" => 3,
        "mixed-b" | "mixed-d" => 2,
        _ => 1,
    };

    // Time moves on its own, in small steps, as it would on the system clock.
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (clock, stop) = (clock.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                clock.advance(Duration::from_micros(500));
                // Paces the clock; nothing waits on this sleep.
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };

    let mut rng = Rng(seed);
    let mut handles: Vec<TaskHandle<u64>> = Vec::new();
    // Tasks cancelled before they started, with their runs then.
    let mut cancelled: Vec<(TaskId, u32)> = Vec::new();
    for n in 0..TASKS {
        let ty = [A, B, C, D][rng.below(4) as usize];
        let mut task = ty.task(rng.below(1000)).priority(rng.below(9) as u8);
        if rng.below(10) == 0 {
            task = task.delay(Duration::from_millis(1 + rng.below(20)));
        }
        if rng.below(10) == 0 && !handles.is_empty() {
            let dep = handles[rng.below(handles.len() as u64) as usize].id();
            task = task.after([dep]);
        }
        if let Ok(handle) = pool.submit(task) {
            handles.push(handle);
        }
        if rng.below(20) == 0 && !handles.is_empty() {
            let handle = &handles[rng.below(handles.len() as u64) as usize];
            if handle.cancel() == Ok(CancelOutcome::Cancelled) {
                let runs = watch.runs.lock().unwrap().get(&handle.id()).copied();
                cancelled.push((handle.id(), runs.unwrap_or(0)));
            }
        }
        if n % 250 == 0 {
            assert_eq!(pool.check_invariants(), Ok(()), "seed {seed}");
        }
    }
    for handle in &handles {
        handle
            .wait_timeout(HANG_GUARD)
            .unwrap_or_else(|| panic!("{} never finished (seed {seed})", handle.id()));
    }
    assert_eq!(pool.check_invariants(), Ok(()), "seed {seed}");
    let stats = pool.stats();
    assert_eq!(
        stats.ready + stats.running + stats.scheduled + stats.blocked,
        0
    );
    let runs = watch.runs.lock().unwrap().clone();
    for (id, before) in cancelled {
        assert_eq!(
            runs.get(&id).copied().unwrap_or(0),
            before,
            "{id} ran after its cancel (seed {seed})"
        );
    }
    for handle in &handles {
        let info = pool.info(handle.id()).expect("remembered");
        let ran = runs.get(&handle.id()).copied().unwrap_or(0);
        assert!(
            ran <= attempts_of(info.task_type),
            "{} ran {ran} times (seed {seed})",
            handle.id()
        );
        assert_eq!(info.attempts, ran, "{} (seed {seed})", handle.id());
    }
    for (index, limit) in [(0, 2), (2, 1)] {
        let most = watch.most[index].load(Ordering::SeqCst);
        assert!(
            most <= limit,
            "{most} of type {index} ran at once, limit {limit} (seed {seed})"
        );
    }
    let totals = stats.totals;
    assert_eq!(
        totals.submitted,
        totals.succeeded + totals.failed + totals.cancelled
    );
    stop.store(true, Ordering::SeqCst);
    mover.join().unwrap();
    let report = pool.shutdown(Duration::from_secs(1));
    assert!(!report.deadline_reached);
    // Failures come often enough in a row that the breaker opened (and so held tasks).
    assert!(
        opened.load(Ordering::SeqCst) > 0,
        "the breaker never opened (seed {seed})"
    );
}
