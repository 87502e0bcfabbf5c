//! Testing retries and backoff without sleeping: the pool runs on a `ManualClock` with a seeded
//! jitter generator. `wait_idle` waits until the pool has done everything that is due, `info`
//! shows when the retry will run, and `advance` moves time on. A minute of backoff passes in
//! microseconds, and the same seed gives the same backoffs every run.
//!
//! Run it with `cargo run --example deterministic`.

use std::error::Error;
use std::time::{Duration, Instant};

use tasq::{HandlerError, ManualClock, Pool, RetryPolicy, TaskState, TaskType, TypeOptions};

/// Fails with a retryable error until attempt `FIRST_SUCCESS`, then returns the attempt number.
const SYNC: TaskType<(), u32> = TaskType::new("sync");
const FIRST_SUCCESS: u32 = 5;
/// Backoff bounds of 10 s, 20 s, 40 s, 80 s, … up to 5 minutes.
const POLICY: RetryPolicy =
    RetryPolicy::exponential(Duration::from_secs(10), Duration::from_secs(300));

/// Runs one SYNC task to success on a manual clock and returns the backoff before each retry.
fn backoffs(seed: u64) -> Result<Vec<Duration>, Box<dyn Error>> {
    let clock = ManualClock::new();
    let options = TypeOptions::new()
        .max_attempts(FIRST_SUCCESS)
        .retry_policy(POLICY);
    let pool = Pool::builder()
        .workers(1) // one worker draws the jitter in a fixed order: exactly repeatable
        .manual_clock(clock.clone())
        .seed(seed)
        .register_with(SYNC, options, |ctx, _: &()| {
            if ctx.attempt() < FIRST_SUCCESS {
                return Err(HandlerError::retryable("remote busy"));
            }
            Ok(ctx.attempt())
        })
        .build()?;

    let handle = pool.submit(SYNC.task(()))?;
    let mut chosen = Vec::new();
    for retry in 1..FIRST_SUCCESS {
        // Attempt `retry` has run and failed; its retry waits in the delayed heap for the clock.
        pool.wait_idle();
        let info = pool.info(handle.id()).ok_or("task forgotten")?;
        assert_eq!((info.state, info.attempts), (TaskState::Scheduled, retry));
        let run_at = info.run_at.expect("a scheduled task has a run_at");
        // The clock has not moved since the attempt failed, so this is the backoff it chose.
        let backoff = run_at - clock.now();
        let bound = POLICY.max_delay(retry);
        assert!(
            backoff <= bound,
            "retry {retry}: {backoff:?} exceeds {bound:?}"
        );
        chosen.push(backoff);

        // Not a moment early: just short of run_at, the retry still waits.
        if let Some(almost) = backoff.checked_sub(Duration::from_millis(1)) {
            clock.advance(almost);
            pool.wait_idle();
            assert_eq!(
                handle.status(),
                TaskState::Scheduled,
                "retry {retry} ran early"
            );
        }
        clock.advance(run_at - clock.now());
    }
    assert_eq!(handle.wait().succeeded(), Some(FIRST_SUCCESS));
    assert_eq!(pool.stats().totals.retried, u64::from(FIRST_SUCCESS - 1));
    Ok(chosen)
}

fn main() -> Result<(), Box<dyn Error>> {
    let started = Instant::now();
    let first = backoffs(7)?;
    let simulated: Duration = first.iter().sum();
    for (retry, backoff) in (1..).zip(&first) {
        let bound = POLICY.max_delay(retry);
        println!("retry {retry}: waited {backoff:>12.3?} (drawn from [0, {bound:?}])");
    }
    println!(
        "{simulated:.3?} of backoff simulated in {:.3?} of real time",
        started.elapsed()
    );

    // The same seed draws the same jitter: a failing test can be replayed exactly.
    assert_eq!(backoffs(7)?, first, "seed 7 should repeat its backoffs");
    println!("seed 7 again: same backoffs");
    let other = backoffs(8)?;
    assert_ne!(other, first, "seed 8 should draw other backoffs");
    println!("seed 8: {other:.3?}");
    Ok(())
}
