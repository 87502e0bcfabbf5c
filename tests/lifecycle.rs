//! Every transition of a task's life, each observed: blocked, scheduled, ready, running, and the
//! ends; waiting on a handle from many threads, and with a timeout. On both stores.

mod support_store;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use support_store::{GATE, Gate, HANG_GUARD, Signal, TestBuilder, TestPool, finish, raise, settle};
use tasq::{
    CancelOutcome, CancelReason, FailureReason, HandlerError, ManualClock, Outcome, RetryPolicy,
    TaskState, TaskType,
};

const NOOP: TaskType<(), ()> = TaskType::new("noop");
/// Fails its first attempt (retryably), succeeds on the second, returning the attempt.
const FLAKY: TaskType<(), u32> = TaskType::new("flaky");
/// Always fails, permanently.
const BROKEN: TaskType<(), ()> = TaskType::new("broken");
/// Raises its signal when it starts, then runs until cancelled; returns `Ok` even then.
const STUBBORN: TaskType<u64, ()> = TaskType::new("stubborn");
/// Returns its payload.
const ECHO: TaskType<String, String> = TaskType::new("echo");

/// A one-worker pool on `clock` with every type above registered.
fn pool(builder: TestBuilder, clock: &ManualClock) -> TestPool {
    builder
        .workers(1)
        // The durable pool claims only what its worker can start: a row waiting behind the
        // held worker stays ready (claimed ahead, it would be running, leased here).
        .prefetch(0)
        .manual_clock(clock.clone())
        .seed(1)
        .max_attempts(3)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ))
        .with_gates()
        .register(NOOP, |_, _: &()| Ok::<_, HandlerError>(()))
        .register(FLAKY, |ctx, _: &()| {
            if ctx.attempt() == 1 {
                Err(HandlerError::retryable("first attempt fails"))
            } else {
                Ok(ctx.attempt())
            }
        })
        .register(BROKEN, |_, _: &()| {
            Err::<(), _>(HandlerError::permanent("cannot work"))
        })
        .register(STUBBORN, |ctx, started: &u64| {
            raise(*started);
            ctx.token().wait();
            Ok::<_, HandlerError>(())
        })
        .register(ECHO, |_, text: &String| Ok::<_, HandlerError>(text.clone()))
        .build()
}

/// Holds the pool's one worker with a new gate task (of `priority`) until the gate opens.
fn hold(pool: &TestPool, priority: u8) -> Gate {
    let gate = Gate::new();
    let _ = pool
        .submit(GATE.task(gate.number()).priority(priority))
        .unwrap();
    gate
}

conformance! {
    fn blocked_becomes_ready_when_its_dependency_succeeds(builder) {
        let clock = ManualClock::new();
        let pool = pool(builder, &clock);
        let first_gate = hold(&pool, 0);
        first_gate.wait_started();

        // With the worker held: the dependency runs first (priority 10), then a second gate
        // (priority 5) holds the worker again, leaving the dependent (priority 0) ready.
        let dependency = pool.submit(NOOP.task(()).priority(10)).unwrap();
        let second_gate = hold(&pool, 5);
        let dependent = pool.submit(NOOP.task(()).after([dependency.id()])).unwrap();
        assert_eq!(dependency.status(), TaskState::Ready);
        assert_eq!(dependent.status(), TaskState::Blocked);
        assert_eq!(pool.stats().blocked, 1);

        first_gate.open();
        second_gate.wait_started();
        // On the durable store the worker moves on while the dependency's success is written
        // behind it: its handle hears of it once the row says so.
        assert_eq!(finish(&dependency), Outcome::Succeeded(()));
        assert_eq!(dependency.status(), TaskState::Succeeded);
        assert_eq!(dependent.status(), TaskState::Ready);
        let stats = pool.stats();
        assert_eq!((stats.blocked, stats.ready), (0, 1));

        second_gate.open();
        assert_eq!(finish(&dependent), Outcome::Succeeded(()));
    }

    fn scheduled_becomes_ready_when_the_clock_reaches_its_run_at(builder) {
        let clock = ManualClock::new();
        let pool = pool(builder, &clock);
        let delayed = pool
            .submit(NOOP.task(()).delay(Duration::from_secs(60)))
            .unwrap();
        let info = pool.info(delayed.id()).unwrap();
        assert_eq!(info.state, TaskState::Scheduled);
        assert_eq!(info.run_at, Some(clock.now() + Duration::from_secs(60)));

        // Not due a nanosecond early, though the worker is idle and looks.
        clock.advance(Duration::from_secs(60) - Duration::from_nanos(1));
        settle(&pool);
        assert_eq!(delayed.status(), TaskState::Scheduled);

        // Hold the worker, then make the task due: no worker looks until the first gate opens. The
        // worker then promotes the due task and claims the second gate (a higher priority), which
        // leaves the task ready.
        let first_gate = hold(&pool, 0);
        first_gate.wait_started();
        clock.advance(Duration::from_nanos(1));
        let second_gate = hold(&pool, 1);
        first_gate.open();
        second_gate.wait_started();
        let info = pool.info(delayed.id()).unwrap();
        assert_eq!(info.state, TaskState::Ready);
        assert_eq!(info.run_at, None);
        assert_eq!(pool.stats().ready_by_priority, vec![(0, 1)]);

        second_gate.open();
        assert_eq!(finish(&delayed), Outcome::Succeeded(()));
    }

    fn scheduled_on_the_system_clock_runs_when_due_with_nothing_else_happening(builder) {
        // An idle worker must notice a new due time by itself: no clock advance, no other task.
        let pool = builder
            .workers(1)
            .with_gates()
            .register(NOOP, |_, _: &()| Ok::<_, HandlerError>(()))
            .build();
        // Let the worker go idle first.
        settle(&pool);
        let delayed = pool
            .submit(NOOP.task(()).delay(Duration::from_millis(20)))
            .unwrap();
        assert_eq!(finish(&delayed), Outcome::Succeeded(()));
    }

    fn ready_becomes_running_while_its_handler_runs_then_succeeded(builder) {
        let clock = ManualClock::new();
        let pool = pool(builder, &clock);
        let first_gate = hold(&pool, 0);
        first_gate.wait_started();

        let gate = Gate::new();
        let handle = pool.submit(GATE.task(gate.number())).unwrap();
        assert_eq!(handle.status(), TaskState::Ready);
        assert_eq!(pool.info(handle.id()).unwrap().attempts, 0);

        first_gate.open();
        gate.wait_started();
        assert_eq!(handle.status(), TaskState::Running);
        let info = pool.info(handle.id()).unwrap();
        assert_eq!((info.state, info.attempts), (TaskState::Running, 1));
        assert_eq!(pool.stats().running, 1);
        assert_eq!(handle.try_wait(), None);

        gate.open();
        assert_eq!(finish(&handle), Outcome::Succeeded(()));
        assert_eq!(handle.status(), TaskState::Succeeded);
        assert_eq!(pool.status(handle.id()), Some(TaskState::Succeeded));
        assert_eq!(pool.stats().totals.succeeded, 2);
    }

    fn running_becomes_scheduled_for_a_retry_then_succeeds(builder) {
        let clock = ManualClock::new();
        let pool = pool(builder, &clock);
        let handle = pool.submit(FLAKY.task(())).unwrap();
        // The probe runs after the first attempt has been recorded (one worker).
        settle(&pool);

        let info = pool.info(handle.id()).unwrap();
        assert_eq!(info.state, TaskState::Scheduled);
        assert_eq!(info.attempts, 1);
        assert_eq!(info.last_error.as_deref(), Some("first attempt fails"));
        let run_at = info.run_at.expect("a scheduled retry has a run_at");
        assert!(run_at >= clock.now());
        assert!(run_at - clock.now() <= Duration::from_secs(10));
        assert_eq!(pool.stats().totals.retried, 1);

        clock.advance(run_at - clock.now());
        assert_eq!(finish(&handle), Outcome::Succeeded(2));
        assert_eq!(pool.info(handle.id()).unwrap().attempts, 2);
    }

    fn running_becomes_failed_on_a_permanent_error(builder) {
        let clock = ManualClock::new();
        let pool = pool(builder, &clock);
        let handle = pool.submit(BROKEN.task(())).unwrap();
        let Outcome::Failed(failure) = finish(&handle) else {
            panic!("expected a failure");
        };
        assert_eq!(failure.reason, FailureReason::Permanent);
        assert_eq!(failure.attempts, 1);
        assert_eq!(handle.status(), TaskState::Failed);
        let info = pool.info(handle.id()).unwrap();
        assert_eq!(info.state, TaskState::Failed);
        assert_eq!(info.last_error.as_deref(), Some("cannot work"));
    }

    fn running_becomes_cancelled_when_cancelled_even_if_the_handler_returns_ok(builder) {
        let clock = ManualClock::new();
        let pool = pool(builder, &clock);
        let started = Signal::new();
        let handle = pool.submit(STUBBORN.task(started.number())).unwrap();
        started.wait("the handler's start");
        assert_eq!(handle.status(), TaskState::Running);

        assert_eq!(handle.cancel(), Ok(CancelOutcome::Signalled));
        assert_eq!(finish(&handle), Outcome::Cancelled(CancelReason::Requested));
        assert_eq!(handle.status(), TaskState::Cancelled);
        let info = pool.info(handle.id()).unwrap();
        assert_eq!((info.state, info.attempts), (TaskState::Cancelled, 1));
        assert_eq!(
            pool.cancel(handle.id()),
            Ok(CancelOutcome::AlreadyFinished(TaskState::Cancelled))
        );
    }

    fn every_thread_waiting_on_one_handle_gets_the_outcome(builder) {
        let clock = ManualClock::new();
        let pool = pool(builder, &clock);
        let gate = hold(&pool, 0);
        gate.wait_started();
        let handle = pool.submit(ECHO.task("shared output".to_owned())).unwrap();

        const WAITERS: usize = 8;
        let lined_up = Arc::new(Barrier::new(WAITERS + 1));
        let early = Arc::new(AtomicBool::new(false));
        let (outcome_tx, outcome_rx) = crossbeam_channel::unbounded();
        for _ in 0..WAITERS {
            let handle = handle.clone();
            let lined_up = Arc::clone(&lined_up);
            let early = Arc::clone(&early);
            let outcome_tx = outcome_tx.clone();
            std::thread::spawn(move || {
                if handle.try_wait().is_some() {
                    early.store(true, Ordering::SeqCst);
                }
                lined_up.wait();
                // An untimed wait: a waiter that misses the wake-up hangs, and the test fails below.
                outcome_tx.send(handle.wait()).unwrap();
            });
        }
        lined_up.wait();
        assert!(
            !early.load(Ordering::SeqCst),
            "the task finished before the gate opened"
        );
        gate.open();

        for waiter in 0..WAITERS {
            let outcome = outcome_rx
                .recv_timeout(HANG_GUARD)
                .unwrap_or_else(|_| panic!("only {waiter} of {WAITERS} waiters woke up"));
            assert_eq!(outcome, Outcome::Succeeded("shared output".to_owned()));
        }
        assert_eq!(
            finish(&handle),
            Outcome::Succeeded("shared output".to_owned())
        );
    }

    fn wait_timeout_is_none_before_the_end_and_the_outcome_after(builder) {
        let clock = ManualClock::new();
        let pool = pool(builder, &clock);
        let gate = Gate::new();
        let handle = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();

        assert_eq!(handle.wait_timeout(Duration::from_millis(20)), None);
        assert_eq!(handle.wait_timeout(Duration::ZERO), None);
        assert_eq!(handle.try_wait(), None);
        assert!(!handle.is_finished());

        gate.open();
        assert_eq!(
            handle.wait_timeout(HANG_GUARD),
            Some(Outcome::Succeeded(()))
        );
        // Once finished, even a zero timeout returns the outcome.
        assert_eq!(
            handle.wait_timeout(Duration::ZERO),
            Some(Outcome::Succeeded(()))
        );
        assert_eq!(handle.try_wait(), Some(Outcome::Succeeded(())));
    }
}
