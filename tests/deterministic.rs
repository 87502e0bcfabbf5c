//! The deterministic test mode: a manual clock moves every due time, `wait_idle` says when the
//! pool has caught up with it, and a seed repeats the jitter. On both stores.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use support_store::{GATE, Gate, HANG_GUARD, Store, TestBuilder, TestPool, finish, returns_within};
use tasq::{
    Breaker, HandlerError, ManualClock, Pool, RateLimit, RetryPolicy, TaskState, TaskType,
    TypeOptions, WaitError,
};

const FLAKY: TaskType<u32, u32> = TaskType::new("flaky");
/// Calls the downstream "down": fails (a failure of the downstream) if its payload is 0.
const CALL: TaskType<u32, ()> = TaskType::new("call");

/// A pool on `clock` whose handler fails until attempt `payload`, counting its runs.
fn flaky_pool(
    builder: TestBuilder,
    clock: &ManualClock,
    runs: &Arc<AtomicU32>,
    seed: u64,
) -> TestPool {
    let runs = Arc::clone(runs);
    let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60));
    builder
        .workers(1)
        .manual_clock(clock.clone())
        .seed(seed)
        .register_with(
            FLAKY,
            TypeOptions::new().max_attempts(6).retry_policy(policy),
            move |ctx, succeed_on: &u32| {
                runs.fetch_add(1, Ordering::SeqCst);
                if ctx.attempt() < *succeed_on {
                    return Err(HandlerError::retryable("not yet"));
                }
                Ok(ctx.attempt())
            },
        )
        .build()
}

/// Another builder on `store`, for another pool.
fn another(store: Store) -> TestBuilder {
    TestBuilder::new(store).expect("the store ran the first pool")
}

conformance! {
    fn wait_idle_returns_once_due_work_is_done_and_nothing_runs_early(builder) {
        let clock = ManualClock::new();
        let runs = Arc::new(AtomicU32::new(0));
        let pool = flaky_pool(builder, &clock, &runs, 1);
        let handle = pool.submit(FLAKY.task(4)).unwrap();
        for attempt in 1..=3 {
            pool.wait_idle();
            let info = pool.info(handle.id()).unwrap();
            assert_eq!(info.state, TaskState::Scheduled, "after attempt {attempt}");
            assert_eq!(info.attempts, attempt);
            assert_eq!(runs.load(Ordering::SeqCst), attempt);
            let run_at = info.run_at.expect("a scheduled task has a run_at");
            let wait = run_at.saturating_duration_since(clock.now());
            assert!(
                wait <= Duration::from_secs(1 << (attempt - 1)),
                "backoff {wait:?} too long"
            );
            // Just short of the retry's due time nothing runs.
            if wait > Duration::from_nanos(1) {
                clock.advance(wait - Duration::from_nanos(1));
                pool.wait_idle();
                assert_eq!(
                    runs.load(Ordering::SeqCst),
                    attempt,
                    "retry {attempt} ran early"
                );
            }
            clock.advance(Duration::from_nanos(1));
        }
        assert_eq!(finish(&handle).succeeded(), Some(4));
        pool.wait_idle();
        assert_eq!(pool.stats().totals.retried, 3);
    }

    fn wait_idle_returns_at_once_on_an_idle_pool_and_waits_for_running_work(builder) {
        let clock = ManualClock::new();
        let runs = Arc::new(AtomicU32::new(0));
        let pool = flaky_pool(builder, &clock, &runs, 1);
        pool.wait_idle();
        let handles: Vec<_> = (0..50)
            .map(|_| pool.submit(FLAKY.task(1)).unwrap())
            .collect();
        pool.wait_idle();
        // Every task that was ready has run; their outcomes are published right after.
        assert_eq!(runs.load(Ordering::SeqCst), 50);
        for handle in &handles {
            assert_eq!(finish(handle).succeeded(), Some(1));
        }
    }

    fn a_seed_repeats_the_backoffs(builder) {
        let store = builder.store();
        let backoffs = |builder, seed| {
            let clock = ManualClock::new();
            let runs = Arc::new(AtomicU32::new(0));
            let pool = flaky_pool(builder, &clock, &runs, seed);
            let handle = pool.submit(FLAKY.task(6)).unwrap();
            let mut waits = Vec::new();
            for _ in 1..6 {
                pool.wait_idle();
                let run_at = pool.info(handle.id()).unwrap().run_at.unwrap();
                let wait = run_at.saturating_duration_since(clock.now());
                waits.push(wait);
                clock.advance(wait);
            }
            assert_eq!(finish(&handle).succeeded(), Some(6));
            waits
        };
        assert_eq!(backoffs(builder, 11), backoffs(another(store), 11));
        assert_ne!(backoffs(another(store), 11), backoffs(another(store), 12));
    }

    fn wait_idle_returns_while_an_open_breaker_holds_tasks_until_time_passes(builder) {
        let clock = ManualClock::new();
        let options = TypeOptions::new().downstream("down").max_attempts(1);
        let pool = Arc::new(
            builder
                .workers(1)
                .manual_clock(clock.clone())
                .breaker("down", Breaker::new(1, Duration::from_secs(60)))
                .register_with(CALL, options, |_, n: &u32| match n {
                    0 => Err(HandlerError::retryable("down is down")),
                    _ => Ok(()),
                })
                .build(),
        );
        assert!(finish(&pool.submit(CALL.task(0)).unwrap()).is_failed());
        let held: Vec<_> = (1..=3).map(|n| pool.submit(CALL.task(n)).unwrap()).collect();
        // Nothing can run before the cool-down ends: the pool is idle, as with delayed tasks.
        returns_within(&pool, "wait_idle with held tasks", Pool::wait_idle);
        for handle in &held {
            assert_eq!(handle.status(), TaskState::Ready, "held tasks stay ready");
            assert_eq!(pool.info(handle.id()).unwrap().attempts, 0);
        }
        // The cool-down ends: the probe runs and closes the breaker, the rest follow.
        clock.advance(Duration::from_secs(60));
        returns_within(&pool, "wait_idle after the cool-down", Pool::wait_idle);
        for handle in &held {
            assert!(finish(handle).is_succeeded());
        }
        assert_eq!(pool.stats().totals.succeeded, 3);
    }

    fn wait_idle_returns_while_a_rate_limit_holds_tasks_until_time_passes(builder) {
        let clock = ManualClock::new();
        let limit = RateLimit::per_second(1.0).with_burst(1);
        let pool = Arc::new(
            builder
                .workers(1)
                .manual_clock(clock.clone())
                .register_with(FLAKY, TypeOptions::new().rate_limit(limit), |_, n: &u32| {
                    Ok::<_, HandlerError>(*n)
                })
                .build(),
        );
        let handles: Vec<_> = (0..3).map(|n| pool.submit(FLAKY.task(n)).unwrap()).collect();
        for ran in 1..=3 {
            // One token a second: each second one more task runs, and the rest wait for time.
            returns_within(&pool, "wait_idle with rate-limited tasks", Pool::wait_idle);
            let done = handles
                .iter()
                .filter(|h| pool.status(h.id()) == Some(TaskState::Succeeded))
                .count();
            assert_eq!(done, ran, "one start per token");
            clock.advance(Duration::from_secs(1));
        }
        for (n, handle) in (0..).zip(&handles) {
            assert_eq!(finish(handle).succeeded(), Some(n));
        }
    }

    fn wait_timeouts_are_real_time_even_on_a_manual_clock(builder) {
        const TIMEOUT: Duration = Duration::from_millis(200);
        let clock = ManualClock::new();
        let pool = Arc::new(
            builder
                .workers(1)
                .manual_clock(clock.clone())
                .with_gates()
                .build(),
        );
        let gate = Gate::new();
        let running = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        // Nobody moves the clock: the timeouts still run out, in real time.
        type Wait = fn(&Pool) -> Result<(), WaitError>;
        let waits: [Wait; 2] = [
            |pool| pool.wait_idle_timeout(Some(TIMEOUT)),
            |pool| pool.wait_empty(Some(TIMEOUT)),
        ];
        for wait in waits {
            let (result, waited) = returns_within(&pool, "a wait with a timeout", move |pool| {
                let start = Instant::now();
                (wait(pool), start.elapsed())
            });
            assert_eq!(result, Err(WaitError::TimedOut));
            assert!(waited >= TIMEOUT, "timed out after {waited:?}");
            assert!(waited < HANG_GUARD, "timed out after {waited:?}");
        }
        gate.open();
        assert!(finish(&running).is_succeeded());
        assert_eq!(pool.wait_idle_timeout(Some(HANG_GUARD)), Ok(()));
        assert_eq!(pool.wait_empty(Some(HANG_GUARD)), Ok(()));
    }
}
