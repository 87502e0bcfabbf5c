//! The deterministic test mode: a manual clock moves every due time, `wait_idle` says when the
//! pool has caught up with it, and a seed repeats the jitter. On both stores.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use support_store::{Store, TestBuilder, TestPool, finish};
use tasq::{HandlerError, ManualClock, RetryPolicy, TaskState, TaskType, TypeOptions};

const FLAKY: TaskType<u32, u32> = TaskType::new("flaky");

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
}
