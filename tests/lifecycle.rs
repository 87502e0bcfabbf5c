//! Every transition of a task's life, each observed: blocked, scheduled, ready, running, and the
//! ends; waiting on a handle from many threads, and with a timeout.

mod support_a;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use crossbeam_channel::Sender;
use support_a::{GATE, HANG_GUARD, PROBE, finish, gate, gate_handler, probe_handler, settle};
use tasq::{
    CancelOutcome, CancelReason, FailureReason, HandlerError, ManualClock, Outcome, Pool,
    RetryPolicy, TaskState, TaskType,
};

const NOOP: TaskType<(), ()> = TaskType::new("noop");
/// Fails its first attempt (retryably), succeeds on the second, returning the attempt.
const FLAKY: TaskType<(), u32> = TaskType::new("flaky");
/// Always fails, permanently.
const BROKEN: TaskType<(), ()> = TaskType::new("broken");
/// Says when it starts, then runs until cancelled; returns `Ok` even then.
const STUBBORN: TaskType<Sender<()>, ()> = TaskType::new("stubborn");
/// Returns its payload.
const ECHO: TaskType<String, String> = TaskType::new("echo");

/// A one-worker pool on `clock` with every type above registered.
fn pool(clock: &ManualClock) -> Pool {
    Pool::builder()
        .workers(1)
        .manual_clock(clock.clone())
        .seed(1)
        .max_attempts(3)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ))
        .register(GATE, gate_handler)
        .register(PROBE, probe_handler)
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
        .register(STUBBORN, |ctx, started: &Sender<()>| {
            let _ = started.send(());
            ctx.token().wait();
            Ok::<_, HandlerError>(())
        })
        .register(ECHO, |_, text: &String| Ok::<_, HandlerError>(text.clone()))
        .build()
        .expect("build the pool")
}

#[test]
fn blocked_becomes_ready_when_its_dependency_succeeds() {
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let (first_gate, first_task) = gate();
    let _ = pool.submit(GATE.task(first_task)).unwrap();
    first_gate.wait_started();

    // With the worker held: the dependency runs first (priority 10), then a second gate
    // (priority 5) holds the worker again, leaving the dependent (priority 0) ready.
    let dependency = pool.submit(NOOP.task(()).priority(10)).unwrap();
    let (second_gate, second_task) = gate();
    let _ = pool.submit(GATE.task(second_task).priority(5)).unwrap();
    let dependent = pool.submit(NOOP.task(()).after([dependency.id()])).unwrap();
    assert_eq!(dependency.status(), TaskState::Ready);
    assert_eq!(dependent.status(), TaskState::Blocked);
    assert_eq!(pool.stats().blocked, 1);

    first_gate.open();
    second_gate.wait_started();
    assert_eq!(dependency.status(), TaskState::Succeeded);
    assert_eq!(dependent.status(), TaskState::Ready);
    let stats = pool.stats();
    assert_eq!((stats.blocked, stats.ready), (0, 1));

    second_gate.open();
    assert_eq!(finish(&dependent), Outcome::Succeeded(()));
}

#[test]
fn scheduled_becomes_ready_when_the_clock_reaches_its_run_at() {
    let clock = ManualClock::new();
    let pool = pool(&clock);
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
    let (first_gate, first_task) = gate();
    let _ = pool.submit(GATE.task(first_task)).unwrap();
    first_gate.wait_started();
    clock.advance(Duration::from_nanos(1));
    let (second_gate, second_task) = gate();
    let _ = pool.submit(GATE.task(second_task).priority(1)).unwrap();
    first_gate.open();
    second_gate.wait_started();
    let info = pool.info(delayed.id()).unwrap();
    assert_eq!(info.state, TaskState::Ready);
    assert_eq!(info.run_at, None);
    assert_eq!(pool.stats().ready_by_priority, vec![(0, 1)]);

    second_gate.open();
    assert_eq!(finish(&delayed), Outcome::Succeeded(()));
}

#[test]
fn scheduled_on_the_system_clock_runs_when_due_with_nothing_else_happening() {
    // An idle worker must notice a new due time by itself: no clock advance, no other task.
    let pool = Pool::builder()
        .workers(1)
        .register(PROBE, probe_handler)
        .register(NOOP, |_, _: &()| Ok::<_, HandlerError>(()))
        .build()
        .unwrap();
    // Let the worker go idle first.
    settle(&pool);
    let delayed = pool
        .submit(NOOP.task(()).delay(Duration::from_millis(20)))
        .unwrap();
    assert_eq!(finish(&delayed), Outcome::Succeeded(()));
}

#[test]
fn ready_becomes_running_while_its_handler_runs_then_succeeded() {
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let (first_gate, first_task) = gate();
    let _ = pool.submit(GATE.task(first_task)).unwrap();
    first_gate.wait_started();

    let (gate, gate_task) = gate();
    let handle = pool.submit(GATE.task(gate_task)).unwrap();
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

#[test]
fn running_becomes_scheduled_for_a_retry_then_succeeds() {
    let clock = ManualClock::new();
    let pool = pool(&clock);
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

#[test]
fn running_becomes_failed_on_a_permanent_error() {
    let clock = ManualClock::new();
    let pool = pool(&clock);
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

#[test]
fn running_becomes_cancelled_when_cancelled_even_if_the_handler_returns_ok() {
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let (started_tx, started_rx) = crossbeam_channel::bounded(1);
    let handle = pool.submit(STUBBORN.task(started_tx)).unwrap();
    started_rx
        .recv_timeout(HANG_GUARD)
        .expect("handler started");
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

#[test]
fn every_thread_waiting_on_one_handle_gets_the_outcome() {
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let (gate, gate_task) = gate();
    let _ = pool.submit(GATE.task(gate_task)).unwrap();
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

#[test]
fn wait_timeout_is_none_before_the_end_and_the_outcome_after() {
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let (gate, gate_task) = gate();
    let handle = pool.submit(GATE.task(gate_task)).unwrap();
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
