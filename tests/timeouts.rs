//! Handler timeouts on both stores, on a manual clock: the timeout fires the run's token, the
//! run counts as a failed attempt (retried, or `TimedOut` on the last) whatever the handler
//! returns, a panic stays a panic, a handler that ignores its token is reported stuck once, and
//! the metrics count the runs that timed out.

mod support_store;

use std::panic;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use support_store::{EXPECTED, HANG_GUARD, TestBuilder, finish, silence_expected_panics};
use tasq::{
    Event, FailureReason, HandlerError, ManualClock, Outcome, RetryPolicy, TaskType, TypeOptions,
};

/// Every timed type's timeout.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The error text of a run that outlived its timeout.
const TIMED_OUT: &str = "the handler ran past its timeout of 10s";

/// What a handler tells the test, with the attempt it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Started(u32),
    /// Its token fired (it saw the cancellation).
    Cancelled(u32),
}

/// Sleeps an hour on its token; returns a retryable error when the token ends the sleep.
const SLEEPER: TaskType<(), ()> = TaskType::new("sleeper");
/// Waits for its token, then returns `Ok`.
const FINISHER: TaskType<(), bool> = TaskType::new("finisher");
/// Waits for its token, then panics.
const PANICKER: TaskType<(), ()> = TaskType::new("panicker");
/// Waits for its token, then ignores it: blocks until the test releases it.
const STUBBORN: TaskType<(), ()> = TaskType::new("stubborn");
/// Returns at once, well within its timeout.
const QUICK: TaskType<(), ()> = TaskType::new("quick");

/// A pool builder on a manual clock with one worker, retries due at once, and the five types
/// above (with their timeouts) whose handlers report to the returned receiver. `release` lets
/// a `STUBBORN` handler return.
fn timed(
    builder: TestBuilder,
    clock: &ManualClock,
    release: Receiver<()>,
) -> (TestBuilder, Receiver<Seen>) {
    silence_expected_panics();
    let (seen_tx, seen) = crossbeam_channel::unbounded::<Seen>();
    let options = |attempts| TypeOptions::new().timeout(TIMEOUT).max_attempts(attempts);
    let tell = |seen: &Sender<Seen>, what| {
        let _ = seen.send(what);
    };
    let (s1, s2, s3, s4) = (seen_tx.clone(), seen_tx.clone(), seen_tx.clone(), seen_tx);
    let builder = builder
        .workers(1)
        .manual_clock(clock.clone())
        .quiet_panics(true)
        .retry_policy(RetryPolicy::exponential(Duration::ZERO, Duration::ZERO))
        .register_with(SLEEPER, options(2), move |ctx, _: &()| {
            tell(&s1, Seen::Started(ctx.attempt()));
            ctx.sleep(Duration::from_secs(3600))
                .map_err(|_| HandlerError::retryable("woken by its token"))?;
            Ok(())
        })
        .register_with(FINISHER, options(1), move |ctx, _: &()| {
            tell(&s2, Seen::Started(ctx.attempt()));
            ctx.token().wait();
            tell(&s2, Seen::Cancelled(ctx.attempt()));
            Ok(true)
        })
        .register_with(PANICKER, options(3), move |ctx, _: &()| {
            tell(&s3, Seen::Started(ctx.attempt()));
            ctx.token().wait();
            panic!("{EXPECTED} boom after the timeout");
        })
        .register_with(STUBBORN, options(1), move |ctx, _: &()| {
            tell(&s4, Seen::Started(ctx.attempt()));
            ctx.token().wait();
            tell(&s4, Seen::Cancelled(ctx.attempt()));
            // From here on it ignores its token.
            let _ = release.recv_timeout(HANG_GUARD);
            Ok(())
        })
        .register_with(QUICK, options(1), |_, _: &()| Ok(()));
    (builder, seen)
}

/// The next thing a handler told, failing the test instead of hanging.
fn next(seen: &Receiver<Seen>) -> Seen {
    seen.recv_timeout(HANG_GUARD)
        .expect("the handler did not say anything")
}

/// The run counts of the type registered at `index` (in the order of [`timed`]).
fn runs(pool: &tasq::Pool, index: usize) -> tasq::RunCounts {
    pool.metrics().types[index].runs
}

const SLEEPER_INDEX: usize = 0;
const FINISHER_INDEX: usize = 1;
const PANICKER_INDEX: usize = 2;
const STUBBORN_INDEX: usize = 3;
const QUICK_INDEX: usize = 4;

conformance! {
    fn a_timeout_fires_the_token_counts_an_attempt_and_ends_timed_out_on_the_last(builder) {
        let clock = ManualClock::new();
        let (builder, seen) = timed(builder, &clock, crossbeam_channel::never());
        let pool = builder.build();
        let handle = pool.submit(SLEEPER.task(())).unwrap();
        assert_eq!(next(&seen), Seen::Started(1));
        assert_eq!(pool.info(handle.id()).unwrap().attempts, 1);

        clock.advance(TIMEOUT - Duration::from_secs(1));
        // A bounded look, not a synchronisation: a token fired early wakes the handler at once.
        assert!(
            seen.recv_timeout(Duration::from_millis(50)).is_err(),
            "the token fired before the timeout"
        );
        clock.advance(Duration::from_secs(1));
        // The sleep ended by the token; the run is a failed attempt, retried at once.
        assert_eq!(next(&seen), Seen::Started(2));
        let info = pool.info(handle.id()).unwrap();
        assert_eq!(info.attempts, 2);
        assert_eq!(info.last_error.as_deref(), Some(TIMED_OUT));
        assert_eq!(handle.try_wait(), None);

        clock.advance(TIMEOUT);
        let Outcome::Failed(failure) = finish(&handle) else {
            panic!("expected a failure");
        };
        assert_eq!(
            (failure.reason, failure.attempts, failure.error.as_str()),
            (FailureReason::TimedOut, 2, TIMED_OUT)
        );
        let counts = runs(&pool, SLEEPER_INDEX);
        assert_eq!(
            (counts.succeeded, counts.retried, counts.failed, counts.timed_out),
            (0, 1, 1, 2)
        );
        assert_eq!(pool.stats().totals.retried, 1);
    }

    fn a_handler_that_returns_ok_after_its_timeout_still_timed_out(builder) {
        let clock = ManualClock::new();
        let (builder, seen) = timed(builder, &clock, crossbeam_channel::never());
        let pool = builder.build();
        let handle = pool.submit(FINISHER.task(())).unwrap();
        assert_eq!(next(&seen), Seen::Started(1));
        clock.advance(TIMEOUT);
        assert_eq!(next(&seen), Seen::Cancelled(1));
        let Outcome::Failed(failure) = finish(&handle) else {
            panic!("a success past the timeout counted as a success");
        };
        assert_eq!(
            (failure.reason, failure.attempts, failure.error.as_str()),
            (FailureReason::TimedOut, 1, TIMED_OUT)
        );
        let counts = runs(&pool, FINISHER_INDEX);
        assert_eq!(
            (counts.succeeded, counts.retried, counts.failed, counts.timed_out),
            (0, 0, 1, 1)
        );
        let metrics = pool.metrics();
        let timed_out = metrics
            .dead_letters_by_reason
            .iter()
            .find(|(reason, _)| *reason == FailureReason::TimedOut)
            .map(|&(_, n)| n);
        assert_eq!(timed_out, Some(1));
        assert!(
            metrics
                .to_prometheus()
                .contains("tasq_timeouts_total{type=\"finisher\"} 1\n"),
            "the exposition counts the timeout"
        );
    }

    fn a_panic_after_the_timeout_stays_a_panic(builder) {
        let clock = ManualClock::new();
        let (builder, seen) = timed(builder, &clock, crossbeam_channel::never());
        let pool = builder.build();
        let handle = pool.submit(PANICKER.task(())).unwrap();
        assert_eq!(next(&seen), Seen::Started(1));
        clock.advance(TIMEOUT);
        let Outcome::Failed(failure) = finish(&handle) else {
            panic!("expected a failure");
        };
        assert_eq!(
            (failure.reason, failure.attempts, failure.error.as_str()),
            (
                FailureReason::Panicked,
                1,
                "[expected panic] boom after the timeout"
            ),
            "not retried, not turned into a timeout"
        );
        assert!(seen.try_recv().is_err(), "it ran once");
        let counts = runs(&pool, PANICKER_INDEX);
        assert_eq!(
            (counts.succeeded, counts.retried, counts.failed, counts.timed_out),
            (0, 0, 1, 1)
        );
    }

    fn a_handler_that_ignores_its_token_is_reported_stuck_once(builder) {
        const GRACE: Duration = Duration::from_secs(5);
        let clock = ManualClock::new();
        let (release_tx, release) = crossbeam_channel::bounded(1);
        let (builder, seen) = timed(builder, &clock, release);
        let (builder, events) = builder.stuck_after(GRACE).events();
        let pool = builder.build();
        let handle = pool.submit(STUBBORN.task(())).unwrap();
        assert_eq!(next(&seen), Seen::Started(1));
        assert_eq!(pool.stats().stuck, 0);

        clock.advance(TIMEOUT);
        assert_eq!(next(&seen), Seen::Cancelled(1));
        clock.advance(GRACE - Duration::from_secs(1));
        assert_eq!(pool.stats().stuck, 0);
        clock.advance(Duration::from_secs(1));
        let event = events.recv_timeout(HANG_GUARD).expect("a stuck report");
        let Event::Stuck { id, task_type, attempt, running_for } = event else {
            panic!("expected a stuck report, got {event}");
        };
        assert_eq!((id, task_type, attempt), (handle.id(), "stubborn", 1));
        assert_eq!(running_for, TIMEOUT + GRACE, "reported at the end of its grace, not before");
        assert_eq!(pool.stats().stuck, 1);
        let metrics = pool.metrics();
        assert_eq!(metrics.stats.stuck, 1);
        assert!(metrics.to_prometheus().contains("\ntasq_stuck_handlers 1\n"));

        // Long after, it is still stuck, and reported no more.
        for _ in 0..5 {
            clock.advance(Duration::from_secs(60));
            assert_eq!(pool.stats().stuck, 1);
        }
        release_tx.send(()).unwrap();
        let Outcome::Failed(failure) = finish(&handle) else {
            panic!("expected a failure");
        };
        assert_eq!(
            (failure.reason, failure.attempts, failure.error.as_str()),
            (FailureReason::TimedOut, 1, TIMED_OUT)
        );
        assert_eq!(pool.stats().stuck, 0, "back to zero once it returned");
        let report = pool.shutdown(HANG_GUARD);
        assert!(!report.deadline_reached);

        let rest: Vec<Event> = events.try_iter().collect();
        assert!(
            matches!(
                rest.as_slice(),
                [Event::DeadLetter { reason: FailureReason::TimedOut, .. }]
            ),
            "one stuck report, then the dead letter: {rest:?}"
        );
        let counts = runs(&pool, STUBBORN_INDEX);
        assert_eq!((counts.failed, counts.timed_out), (1, 1));
    }

    fn runs_within_their_timeout_neither_time_out_nor_leave_a_timer_behind(builder) {
        let clock = ManualClock::new();
        let (builder, seen) = timed(builder, &clock, crossbeam_channel::never());
        let pool = builder.build();
        for _ in 0..5 {
            assert!(finish(&pool.submit(QUICK.task(())).unwrap()).is_succeeded());
        }
        // Their timeouts pass: nothing is fired, nothing counted.
        clock.advance(TIMEOUT * 3);
        let handle = pool.submit(FINISHER.task(())).unwrap();
        assert_eq!(next(&seen), Seen::Started(1));
        // The earlier runs' timers must not reach this run's token.
        clock.advance(TIMEOUT - Duration::from_secs(1));
        assert!(
            seen.recv_timeout(Duration::from_millis(50)).is_err(),
            "the token fired before the timeout"
        );
        clock.advance(Duration::from_secs(1));
        assert_eq!(next(&seen), Seen::Cancelled(1));
        assert!(finish(&handle).is_failed());

        let counts = runs(&pool, QUICK_INDEX);
        assert_eq!(
            (counts.succeeded, counts.retried, counts.failed, counts.timed_out),
            (5, 0, 0, 0)
        );
        assert_eq!(pool.metrics().types[QUICK_INDEX].run_time.count, 5);
        assert_eq!(runs(&pool, FINISHER_INDEX).timed_out, 1);
        assert_eq!(pool.stats().stuck, 0);
    }
}
