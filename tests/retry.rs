//! Retries: backoff delays stay inside their bounds and spread, retries wait for their run_at,
//! per-type options override the pool's, attempts run out exactly, seeds repeat backoffs. The
//! pools' tests run on both stores.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crossbeam_channel::Receiver;
use support_store::{HANG_GUARD, Store, TestBuilder, TestPool, finish, settle};
use tasq::{
    Failure, FailureReason, HandlerError, ManualClock, Outcome, RetryPolicy, TaskHandle, TaskState,
    TaskType, TypeOptions,
};

/// Fails every attempt, retryably; tells the test each attempt's number as it starts.
const ALWAYS_FAILS: TaskType<(), ()> = TaskType::new("always_fails");
/// Like `ALWAYS_FAILS`, registered with its own options.
const OVERRIDDEN: TaskType<(), ()> = TaskType::new("overridden");

/// Distinct seeds for `RetryPolicy::delay`, one per draw.
struct Seeds(u64);

impl Seeds {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        self.0
    }
}

/// `min(cap, base * 2^(n-1))`, computed independently of the crate, in nanoseconds.
fn bound_nanos(base: Duration, cap: Duration, n: u32) -> u128 {
    let factor = 1u128.checked_shl(n.saturating_sub(1)).unwrap_or(u128::MAX);
    base.as_nanos().saturating_mul(factor).min(cap.as_nanos())
}

/// Draws `policy.delay(n)` 400 times for n = 1..=40, some larger n and `u32::MAX`, and checks
/// every draw against the bound computed independently, and that the draws spread over it.
fn check_draws(policy: RetryPolicy, rng: &mut Seeds) {
    let retries = (1..=40).chain([41, 64, 65, 1_000, u32::MAX]);
    for n in retries {
        let bound = bound_nanos(policy.base(), policy.cap(), n);
        assert_eq!(policy.max_delay(n).as_nanos(), bound, "{policy:?} n={n}");
        let draws: Vec<u128> = (0..400)
            .map(|_| policy.delay(n, rng.next()).as_nanos())
            .collect();
        for &d in &draws {
            assert!(d <= bound, "{policy:?} n={n}: {d} ns > {bound} ns");
        }
        // Full jitter: over 400 uniform draws, some land in the bottom quarter and some in the
        // top quarter (each fails with probability 0.75^400).
        let low = draws.iter().filter(|&&d| d <= bound / 4).count();
        let high = draws.iter().filter(|&&d| d >= bound - bound / 4).count();
        assert!(low > 0, "{policy:?} n={n}: no draw in the bottom quarter");
        assert!(high > 0, "{policy:?} n={n}: no draw in the top quarter");
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        // At least three distinct values, or all of them when the bound is 0 or 1 ns.
        let wanted = 3.min(bound + 1) as usize;
        assert!(
            distinct.len() >= wanted,
            "{policy:?} n={n}: draws do not spread"
        );
    }
}

// ===== the backoff alone: a pure function, the same whatever the store =====

#[test]
fn delays_stay_within_their_bound_and_spread_over_it() {
    let mut rng = Seeds(0x5eed);
    // Each of these reaches its cap within 32 retries.
    for policy in [
        RetryPolicy::default(),
        RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(10)),
        RetryPolicy::exponential(Duration::from_millis(1), Duration::from_secs(3600)),
        RetryPolicy::exponential(Duration::from_nanos(3), Duration::from_nanos(1000)),
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(1)),
    ] {
        check_draws(policy, &mut rng);
    }
}

#[test]
fn a_bound_below_its_cap_keeps_doubling_past_32_retries() {
    // 1 ms doubled 32 times is about 50 days, still below a one-year cap: retry 33's bound is
    // those 50 days, not the cap. Likewise 1 ns with a cap of a century reaches the cap only at
    // retry 63.
    let mut rng = Seeds(0xcafe);
    for policy in [
        RetryPolicy::exponential(
            Duration::from_millis(1),
            Duration::from_secs(365 * 24 * 3600),
        ),
        RetryPolicy::exponential(
            Duration::from_nanos(1),
            Duration::from_secs(100 * 365 * 24 * 3600),
        ),
    ] {
        check_draws(policy, &mut rng);
    }
}

#[test]
fn an_unbounded_cap_still_bounds_each_retry_by_its_doubling() {
    // A cap of `Duration::MAX` cannot be used by a pool, but the pure function takes it. Only the
    // upper bound is checked: above 2^64 ns a draw cannot spread over the whole bound.
    let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::MAX);
    let mut rng = Seeds(0xbeef);
    for n in (1..=40).chain([64, 65, u32::MAX]) {
        let bound = bound_nanos(policy.base(), policy.cap(), n);
        assert_eq!(policy.max_delay(n).as_nanos(), bound, "n={n}");
        for _ in 0..400 {
            let d = policy.delay(n, rng.next()).as_nanos();
            assert!(d <= bound, "n={n}: {d} ns > {bound} ns");
        }
    }
}

#[test]
fn retry_zero_is_bounded_like_retry_one() {
    let policy = RetryPolicy::exponential(Duration::from_millis(7), Duration::from_secs(1));
    assert_eq!(policy.max_delay(0), Duration::from_millis(7));
    let mut rng = Seeds(3);
    for _ in 0..1000 {
        assert!(policy.delay(0, rng.next()) <= Duration::from_millis(7));
    }
}

// ===== pools: on both stores =====

/// The finest step of a store's time: the embedded store counts nanoseconds, the durable store
/// keeps due times (and reports them) in microseconds.
fn tick(store: Store) -> Duration {
    match store {
        Store::Memory => Duration::from_nanos(1),
        Store::Postgres => Duration::from_micros(1),
    }
}

/// `duration` to the nearest whole `tick`.
fn round_to(duration: Duration, tick: Duration) -> Duration {
    let ticks = (duration.as_nanos() + tick.as_nanos() / 2) / tick.as_nanos();
    Duration::from_nanos(u64::try_from(ticks * tick.as_nanos()).unwrap())
}

/// A one-worker pool on `clock` whose `ALWAYS_FAILS` (pool defaults) and `OVERRIDDEN` (`options`)
/// handlers send each attempt's number on the returned channel.
fn failing_pool(
    builder: TestBuilder,
    clock: &ManualClock,
    seed: u64,
    defaults: (u32, RetryPolicy),
    options: TypeOptions,
) -> (TestPool, Receiver<u32>) {
    let (attempt_tx, attempt_rx) = crossbeam_channel::unbounded();
    let other_tx = attempt_tx.clone();
    let pool = builder
        .workers(1)
        .manual_clock(clock.clone())
        .seed(seed)
        .max_attempts(defaults.0)
        .retry_policy(defaults.1)
        .with_gates()
        .register(ALWAYS_FAILS, move |ctx, _: &()| {
            attempt_tx.send(ctx.attempt()).unwrap();
            Err::<(), _>(HandlerError::retryable(format!(
                "attempt {}",
                ctx.attempt()
            )))
        })
        .register_with(OVERRIDDEN, options, move |ctx, _: &()| {
            other_tx.send(ctx.attempt()).unwrap();
            Err::<(), _>(HandlerError::retryable(format!(
                "attempt {}",
                ctx.attempt()
            )))
        })
        .build();
    (pool, attempt_rx)
}

/// Drives a task that always fails through all its attempts on a manual clock, checking at each
/// retry that its delay is within `bound(attempt)` and that it does not run a tick (see [`tick`])
/// early. Returns the delays drawn.
fn drive_to_exhaustion(
    pool: &TestPool,
    clock: &ManualClock,
    attempts: &Receiver<u32>,
    handle: &TaskHandle<()>,
    bound: impl Fn(u32) -> Duration,
) -> Vec<Duration> {
    let tick = tick(pool.store());
    let mut delays = Vec::new();
    let mut attempt = 0;
    loop {
        let started = attempts
            .recv_timeout(HANG_GUARD)
            .expect("the next attempt never started");
        attempt += 1;
        assert_eq!(started, attempt, "attempts run in order, once each");
        // Submitted while the attempt runs, the probe finishes after it is recorded.
        settle(pool);
        if handle.is_finished() {
            return delays;
        }

        let info = pool.info(handle.id()).expect("the task is remembered");
        assert_eq!(info.state, TaskState::Scheduled, "after attempt {attempt}");
        assert_eq!(info.attempts, attempt);
        assert_eq!(info.last_error, Some(format!("attempt {attempt}")));
        let run_at = info.run_at.expect("a scheduled retry has a run_at");
        // A reported instant is exact to the store's tick only.
        let delay = round_to(run_at - clock.now(), tick);
        assert!(
            delay <= bound(attempt),
            "retry {attempt}: {delay:?} > {:?}",
            bound(attempt)
        );
        assert!(
            delay > Duration::ZERO,
            "a zero delay is possible but not with these seeds"
        );
        delays.push(delay);

        // A tick early: the worker looks (it runs the probe) but must leave the task.
        clock.advance(delay - tick);
        settle(pool);
        let info = pool.info(handle.id()).unwrap();
        assert_eq!(
            (info.state, info.attempts),
            (TaskState::Scheduled, attempt),
            "retry {attempt} ran before its run_at"
        );
        assert!(attempts.try_recv().is_err(), "retry {attempt} ran early");

        clock.advance(tick);
    }
}

/// The delays one seeded one-worker pool draws for a task that always fails.
fn backoffs(builder: TestBuilder, seed: u64) -> Vec<Duration> {
    let clock = ManualClock::new();
    let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(30));
    let (pool, attempts) = failing_pool(builder, &clock, seed, (8, policy), TypeOptions::new());
    let handle = pool.submit(ALWAYS_FAILS.task(())).unwrap();
    let delays = drive_to_exhaustion(&pool, &clock, &attempts, &handle, |n| policy.max_delay(n));
    assert!(finish(&handle).is_failed());
    delays
}

/// Another builder on the same store as `builder`, for a second pool.
fn another(builder: &TestBuilder) -> TestBuilder {
    TestBuilder::new(builder.store()).expect("the store ran the first pool")
}

conformance! {
    fn each_retry_waits_within_its_bound_and_never_runs_before_its_run_at(builder) {
        let clock = ManualClock::new();
        let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(8));
        let (pool, attempts) = failing_pool(builder, &clock, 11, (7, policy), TypeOptions::new());
        let handle = pool.submit(ALWAYS_FAILS.task(())).unwrap();

        let delays =
            drive_to_exhaustion(&pool, &clock, &attempts, &handle, |n| policy.max_delay(n));
        assert_eq!(delays.len(), 6);
        // The bounds are 1, 2, 4, 8, 8, 8 s: with these draws at least one retry uses more than
        // the base, which shows the bound grows.
        assert!(
            delays.iter().any(|&d| d > Duration::from_secs(1)),
            "{delays:?}"
        );

        let Outcome::Failed(failure) = finish(&handle) else {
            panic!("expected a failure");
        };
        assert_eq!(failure.reason, FailureReason::Exhausted);
        assert_eq!(failure.attempts, 7);
        assert_eq!(failure.error, "attempt 7");
        assert_eq!(pool.stats().totals.retried, 6);
    }

    fn a_pool_with_many_attempts_keeps_each_retry_within_its_doubling_bound(builder) {
        // 40 retries of a 1 ms base under a one-year cap: from retry 33 on, the bound is
        // 1 ms * 2^(n-1) (about 50 days at retry 33), well below the cap.
        let clock = ManualClock::new();
        let base = Duration::from_millis(1);
        let cap = Duration::from_secs(365 * 24 * 3600);
        let policy = RetryPolicy::exponential(base, cap);
        let (pool, attempts) = failing_pool(builder, &clock, 3, (41, policy), TypeOptions::new());
        let handle = pool.submit(ALWAYS_FAILS.task(())).unwrap();
        let delays = drive_to_exhaustion(&pool, &clock, &attempts, &handle, |n| {
            Duration::from_nanos(u64::try_from(bound_nanos(base, cap, n)).unwrap())
        });
        assert_eq!(delays.len(), 40);
        assert!(finish(&handle).is_failed());
    }

    fn per_type_options_override_the_pool_defaults(builder) {
        let clock = ManualClock::new();
        let slow = RetryPolicy::exponential(Duration::from_secs(1000), Duration::from_secs(1000));
        let fast = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(1));
        let (pool, attempts) = failing_pool(
            builder,
            &clock,
            5,
            (2, slow),
            TypeOptions::new().max_attempts(5).retry_policy(fast),
        );

        // The overridden type: five attempts, each retry within 1 s. Were the pool's 1000 s
        // policy used, four draws all below 1 s would have probability 10^-12.
        let overridden = pool.submit(OVERRIDDEN.task(())).unwrap();
        let delays = drive_to_exhaustion(&pool, &clock, &attempts, &overridden, |_| {
            Duration::from_secs(1)
        });
        assert_eq!(delays.len(), 4);
        match finish(&overridden) {
            Outcome::Failed(Failure {
                reason, attempts, ..
            }) => assert_eq!((reason, attempts), (FailureReason::Exhausted, 5)),
            other => panic!("unexpected {other:?}"),
        }

        // The type without options: the pool's two attempts and 1000 s bound.
        let defaulted = pool.submit(ALWAYS_FAILS.task(())).unwrap();
        let delays = drive_to_exhaustion(&pool, &clock, &attempts, &defaulted, |_| {
            Duration::from_secs(1000)
        });
        assert_eq!(delays.len(), 1);
        assert!(delays[0] > Duration::from_secs(1), "{delays:?}");
        match finish(&defaulted) {
            Outcome::Failed(Failure {
                reason, attempts, ..
            }) => assert_eq!((reason, attempts), (FailureReason::Exhausted, 2)),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn attempts_run_out_after_exactly_max_attempts(builder) {
        const FAILS: TaskType<(), ()> = TaskType::new("fails");
        let runs = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&runs);
        let pool = builder
            .workers(2)
            .max_attempts(4)
            .retry_policy(RetryPolicy::exponential(
                Duration::from_micros(10),
                Duration::from_micros(100),
            ))
            .register(FAILS, move |_, _: &()| {
                let run = counter.fetch_add(1, Ordering::SeqCst) + 1;
                Err::<(), _>(HandlerError::retryable(format!("run {run}")))
            })
            .build();
        let handle = pool.submit(FAILS.task(())).unwrap();
        let Outcome::Failed(failure) = finish(&handle) else {
            panic!("expected a failure");
        };
        assert_eq!(failure.reason, FailureReason::Exhausted);
        assert_eq!(failure.attempts, 4);
        assert_eq!(failure.error, "run 4");
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        let dead = pool.dead_letters();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].failure.reason, FailureReason::Exhausted);
    }

    fn a_flaky_handler_succeeds_on_its_third_attempt(builder) {
        const FLAKY: TaskType<u32, u32> = TaskType::new("flaky");
        let runs = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&runs);
        let pool = builder
            .workers(1)
            .max_attempts(5)
            .retry_policy(RetryPolicy::exponential(
                Duration::from_micros(10),
                Duration::from_micros(100),
            ))
            .register(FLAKY, move |ctx, &succeed_on: &u32| {
                counter.fetch_add(1, Ordering::SeqCst);
                if ctx.attempt() < succeed_on {
                    Err(HandlerError::retryable("not yet"))
                } else {
                    Ok(ctx.attempt())
                }
            })
            .build();
        let handle = pool.submit(FLAKY.task(3)).unwrap();
        assert_eq!(finish(&handle), Outcome::Succeeded(3));
        assert_eq!(runs.load(Ordering::SeqCst), 3, "no run after the success");
        let info = pool.info(handle.id()).unwrap();
        assert_eq!((info.state, info.attempts), (TaskState::Succeeded, 3));
        assert_eq!(pool.stats().totals.retried, 2);
        assert!(pool.dead_letters().is_empty());
    }

    fn a_seeded_pool_repeats_its_backoffs(builder) {
        let again = another(&builder);
        let other = another(&builder);
        let first = backoffs(builder, 7);
        assert_eq!(first.len(), 7);
        assert_eq!(backoffs(again, 7), first, "same seed, same backoffs");
        assert_ne!(backoffs(other, 8), first, "another seed draws other backoffs");
    }
}
