//! Cancelling tasks in every state: ready, scheduled, blocked, waiting to retry, running, finished.
//! On both stores.

mod support_b;
mod support_store;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use support_b::{Latch, finished, recv, retryable, wait};
use support_store::{TestBuilder, TestPool};
use tasq::{
    CancelError, CancelOutcome, CancelReason, HandlerError, ManualClock, Outcome, RetryPolicy,
    TaskId, TaskState, TaskType,
};

/// Holds a worker until the test opens the fixture's latch.
const GATE: TaskType<(), ()> = TaskType::new("gate");
/// Records its payload and returns it.
const JOB: TaskType<u32, u32> = TaskType::new("job");
/// Fails its first attempt (retryably), records every attempt.
const FLAKY: TaskType<u32, u32> = TaskType::new("flaky");
/// Always fails permanently.
const BROKEN: TaskType<u32, u32> = TaskType::new("broken");
/// Waits for its token, then ends as its payload says: 0 Ok, 1 permanent error, 2 retryable
/// error, 3 panic.
const STUBBORN: TaskType<u32, u32> = TaskType::new("stubborn");

const PANIC_MARKER: &str = "cancel.rs: expected panic after the token fired";

/// One worker on a manual clock, with every type above registered.
struct Fixture {
    pool: TestPool,
    clock: ManualClock,
    gate: Latch,
    /// The id of each handler run, as it starts (all types).
    started: Receiver<TaskId>,
    /// Payloads of JOB runs and of FLAKY attempts, in order.
    ran: Arc<Mutex<Vec<u32>>>,
    /// Sent by STUBBORN once its token has fired.
    saw_token: Receiver<TaskId>,
}

impl Fixture {
    fn new(builder: TestBuilder, workers: usize) -> Self {
        let clock = ManualClock::new();
        let gate = Latch::new();
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (saw_tx, saw_token) = crossbeam_channel::unbounded::<TaskId>();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let pool = builder
            .workers(workers)
            .manual_clock(clock.clone())
            .seed(7)
            .retry_policy(RetryPolicy::exponential(
                Duration::from_secs(1),
                Duration::from_secs(1),
            ))
            .register(GATE, {
                let (gate, started_tx) = (gate.clone(), started_tx.clone());
                move |ctx, _: &()| {
                    started_tx.send(ctx.id()).unwrap();
                    gate.wait();
                    Ok(())
                }
            })
            .register(JOB, {
                let (ran, started_tx) = (Arc::clone(&ran), started_tx.clone());
                move |ctx, n: &u32| {
                    started_tx.send(ctx.id()).unwrap();
                    ran.lock().unwrap().push(*n);
                    Ok(*n)
                }
            })
            .register(FLAKY, {
                let (ran, started_tx) = (Arc::clone(&ran), started_tx.clone());
                move |ctx, n: &u32| {
                    started_tx.send(ctx.id()).unwrap();
                    ran.lock().unwrap().push(*n);
                    if ctx.attempt() == 1 {
                        Err(retryable("first attempt fails"))
                    } else {
                        Ok(*n)
                    }
                }
            })
            .register(BROKEN, |_, _: &u32| {
                Err(HandlerError::permanent("broken on purpose"))
            })
            .register(STUBBORN, {
                let started_tx = started_tx.clone();
                move |ctx, how: &u32| stubborn(ctx, *how, &started_tx, &saw_tx)
            })
            .build();
        Fixture {
            pool,
            clock,
            gate,
            started,
            ran,
            saw_token,
        }
    }

    /// Submits a GATE task and waits until it holds a worker.
    fn hold_worker(&self) -> tasq::TaskHandle<()> {
        let gate = self.pool.submit(GATE.task(())).unwrap();
        assert_eq!(recv(&self.started, "the gate task to start"), gate.id());
        gate
    }

    fn ran(&self) -> Vec<u32> {
        self.ran.lock().unwrap().clone()
    }
}

fn stubborn(
    ctx: &tasq::Context,
    how: u32,
    started: &Sender<TaskId>,
    saw_token: &Sender<TaskId>,
) -> Result<u32, HandlerError> {
    started.send(ctx.id()).unwrap();
    ctx.token().wait();
    saw_token.send(ctx.id()).unwrap();
    match how {
        0 => Ok(how),
        1 => Err(HandlerError::permanent("gave up after the token fired")),
        2 => Err(retryable("would like another attempt")),
        _ => panic!("{PANIC_MARKER}"),
    }
}

conformance! {
    fn a_ready_task_is_cancelled_at_once_and_never_runs(builder) {
        let f = Fixture::new(builder, 1);
        let gate = f.hold_worker();
        let job = f.pool.submit(JOB.task(1)).unwrap();
        assert_eq!(job.status(), TaskState::Ready);
        assert_eq!(f.pool.stats().ready, 1);

        assert_eq!(f.pool.cancel(job.id()), Ok(CancelOutcome::Cancelled));
        assert_eq!(
            finished(&job),
            Outcome::Cancelled(CancelReason::Requested),
            "the outcome is published before cancel returns"
        );
        assert_eq!(job.status(), TaskState::Cancelled);
        assert_eq!(f.pool.stats().ready, 0);

        f.gate.open();
        assert!(wait(&gate).is_succeeded());
        let report = f.pool.shutdown(Duration::from_secs(60));
        assert_eq!(f.ran(), Vec::<u32>::new(), "the cancelled task ran");
        assert_eq!((report.succeeded, report.cancelled), (1, 1));
    }

    fn a_scheduled_task_is_cancelled_at_once_and_never_runs_even_when_due(builder) {
        let f = Fixture::new(builder, 1);
        let doomed = f
            .pool
            .submit(JOB.task(1).delay(Duration::from_secs(60)))
            .unwrap();
        let control = f
            .pool
            .submit(JOB.task(2).delay(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(doomed.status(), TaskState::Scheduled);

        // Through the handle this time.
        assert_eq!(doomed.cancel(), Ok(CancelOutcome::Cancelled));
        assert_eq!(
            finished(&doomed),
            Outcome::Cancelled(CancelReason::Requested)
        );
        assert_eq!(f.pool.stats().scheduled, 1);

        f.clock.advance(Duration::from_secs(120));
        assert_eq!(wait(&control), Outcome::Succeeded(2));
        let report = f.pool.shutdown(Duration::from_secs(60));
        assert_eq!(f.ran(), vec![2], "only the control task may run");
        assert_eq!((report.succeeded, report.cancelled), (1, 1));
    }

    fn a_blocked_task_is_cancelled_at_once_and_its_parent_is_untouched(builder) {
        let f = Fixture::new(builder, 1);
        let parent = f
            .pool
            .submit(JOB.task(1).delay(Duration::from_secs(60)))
            .unwrap();
        let child = f.pool.submit(JOB.task(2).after([parent.id()])).unwrap();
        assert_eq!(child.status(), TaskState::Blocked);
        assert_eq!(f.pool.stats().blocked, 1);

        assert_eq!(f.pool.cancel(child.id()), Ok(CancelOutcome::Cancelled));
        assert_eq!(
            finished(&child),
            Outcome::Cancelled(CancelReason::Requested)
        );
        assert_eq!(f.pool.stats().blocked, 0);
        assert_eq!(parent.status(), TaskState::Scheduled);

        f.clock.advance(Duration::from_secs(60));
        assert_eq!(wait(&parent), Outcome::Succeeded(1));
        let _ = f.pool.shutdown(Duration::from_secs(60));
        assert_eq!(f.ran(), vec![1], "the cancelled child ran");
    }

    fn a_task_waiting_to_retry_is_cancelled_at_once_and_not_retried(builder) {
        let f = Fixture::new(builder, 1);
        let flaky = f.pool.submit(FLAKY.task(1)).unwrap();
        // One worker takes tasks first-in first-out: once the marker has run, the flaky task's first
        // attempt has failed and its retry waits on the (frozen) manual clock.
        let marker = f.pool.submit(JOB.task(2)).unwrap();
        assert_eq!(wait(&marker), Outcome::Succeeded(2));
        assert_eq!(flaky.status(), TaskState::Scheduled);
        let info = f.pool.info(flaky.id()).unwrap();
        assert_eq!(info.attempts, 1);
        assert_eq!(info.last_error.as_deref(), Some("first attempt fails"));

        assert_eq!(flaky.cancel(), Ok(CancelOutcome::Cancelled));
        assert_eq!(
            finished(&flaky),
            Outcome::Cancelled(CancelReason::Requested),
            "a cancelled retry is not a failure"
        );
        assert!(f.pool.dead_letters().is_empty());

        f.clock.advance(Duration::from_secs(60));
        let report = f.pool.shutdown(Duration::from_secs(60));
        assert_eq!(f.ran(), vec![1, 2], "the flaky task ran a second time");
        assert_eq!(f.pool.info(flaky.id()).unwrap().attempts, 1);
        assert_eq!((report.succeeded, report.cancelled), (1, 1));
    }

    fn a_running_task_sees_its_token_and_ends_cancelled_although_its_handler_succeeds(builder) {
        let f = Fixture::new(builder, 1);
        let task = f.pool.submit(STUBBORN.task(0)).unwrap();
        assert_eq!(recv(&f.started, "the handler to start"), task.id());
        assert_eq!(task.status(), TaskState::Running);

        assert_eq!(f.pool.cancel(task.id()), Ok(CancelOutcome::Signalled));
        assert_eq!(
            recv(&f.saw_token, "the handler to see its token"),
            task.id()
        );
        assert_eq!(wait(&task), Outcome::Cancelled(CancelReason::Requested));
        assert_eq!(f.pool.info(task.id()).unwrap().attempts, 1);
        assert_eq!(
            task.cancel(),
            Ok(CancelOutcome::AlreadyFinished(TaskState::Cancelled))
        );
        let report = f.pool.shutdown(Duration::from_secs(60));
        assert_eq!((report.succeeded, report.cancelled), (0, 1));
    }

    fn a_running_task_ends_cancelled_whatever_its_handler_returns(builder) {
        let f = Fixture::new(builder, 4);
        // Ok, a permanent error, a retryable error, a panic.
        let tasks: Vec<_> = (0..4)
            .map(|how| f.pool.submit(STUBBORN.task(how)).unwrap())
            .collect();
        for _ in &tasks {
            recv(&f.started, "every handler to start");
        }
        for task in &tasks {
            assert_eq!(
                task.cancel(),
                Ok(CancelOutcome::Signalled),
                "{:?}",
                task.id()
            );
        }
        for task in &tasks {
            assert_eq!(
                wait(task),
                Outcome::Cancelled(CancelReason::Requested),
                "{:?}",
                task.id()
            );
            assert_eq!(f.pool.info(task.id()).unwrap().attempts, 1, "retried");
        }
        assert!(f.pool.dead_letters().is_empty());
        let stats = f.pool.stats();
        assert_eq!(stats.totals.retried, 0);
        assert_eq!(stats.totals.failed, 0);
        assert_eq!(stats.totals.cancelled, 4);
    }

    fn cancelling_a_finished_task_reports_its_state_and_changes_nothing(builder) {
        let f = Fixture::new(builder, 1);
        let succeeded = f.pool.submit(JOB.task(1)).unwrap();
        let failed = f.pool.submit(BROKEN.task(2)).unwrap();
        let cancelled = f
            .pool
            .submit(JOB.task(3).delay(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(wait(&succeeded), Outcome::Succeeded(1));
        assert!(wait(&failed).is_failed());
        assert_eq!(cancelled.cancel(), Ok(CancelOutcome::Cancelled));

        for (handle, state) in [
            (&succeeded, TaskState::Succeeded),
            (&failed, TaskState::Failed),
            (&cancelled, TaskState::Cancelled),
        ] {
            let before = finished(handle);
            assert_eq!(
                f.pool.cancel(handle.id()),
                Ok(CancelOutcome::AlreadyFinished(state))
            );
            assert_eq!(handle.cancel(), Ok(CancelOutcome::AlreadyFinished(state)));
            assert_eq!(
                finished(handle),
                before,
                "a late cancel changed the outcome"
            );
            assert_eq!(handle.status(), state);
        }
        assert_eq!(
            f.pool.dead_letters().len(),
            1,
            "the dead letter was dropped"
        );
        let totals = f.pool.stats().totals;
        assert_eq!(
            (totals.succeeded, totals.failed, totals.cancelled),
            (1, 1, 1)
        );
    }

    fn cancelling_an_id_the_pool_does_not_know_is_an_error(builder) {
        let store = builder.store();
        let f = Fixture::new(builder, 1);
        // Ids count up from one in every pool: a second pool's fifth id is unknown to the first.
        let other = Fixture::new(TestBuilder::new(store).expect("a second pool on the store"), 1);
        let foreign = (0..5)
            .map(|n| {
                other
                    .pool
                    .submit(JOB.task(n).delay(Duration::from_secs(60)))
                    .unwrap()
                    .id()
            })
            .last()
            .unwrap();
        let _ = f.pool.submit(JOB.task(1)).unwrap();
        assert_eq!(
            f.pool.cancel(foreign),
            Err(CancelError::UnknownTask(foreign))
        );
    }

    fn dependents_of_a_cancelled_task_end_cancelled_with_its_id(builder) {
        let f = Fixture::new(builder, 1);
        let parent = f
            .pool
            .submit(JOB.task(1).delay(Duration::from_secs(60)))
            .unwrap();
        let other = f.pool.submit(JOB.task(2)).unwrap();
        assert_eq!(wait(&other), Outcome::Succeeded(2));
        let child = f.pool.submit(JOB.task(3).after([parent.id()])).unwrap();
        let grandchild = f.pool.submit(JOB.task(4).after([child.id()])).unwrap();
        let both = f
            .pool
            .submit(JOB.task(5).after([other.id(), parent.id()]))
            .unwrap();
        assert_eq!(f.pool.stats().blocked, 3);

        assert_eq!(parent.cancel(), Ok(CancelOutcome::Cancelled));
        assert_eq!(
            finished(&parent),
            Outcome::Cancelled(CancelReason::Requested)
        );
        assert_eq!(
            finished(&child),
            Outcome::Cancelled(CancelReason::DependencyCancelled(parent.id()))
        );
        assert_eq!(
            finished(&grandchild),
            Outcome::Cancelled(CancelReason::DependencyCancelled(child.id()))
        );
        assert_eq!(
            finished(&both),
            Outcome::Cancelled(CancelReason::DependencyCancelled(parent.id()))
        );
        assert_eq!(f.pool.stats().blocked, 0);

        f.clock.advance(Duration::from_secs(60));
        let report = f.pool.shutdown(Duration::from_secs(60));
        assert_eq!(f.ran(), vec![2]);
        assert_eq!((report.succeeded, report.cancelled), (1, 4));
    }

    fn dependents_of_a_cancelled_running_task_end_cancelled_when_it_returns(builder) {
        let f = Fixture::new(builder, 1);
        let parent = f.pool.submit(STUBBORN.task(0)).unwrap();
        assert_eq!(recv(&f.started, "the parent to start"), parent.id());
        let child = f.pool.submit(JOB.task(1).after([parent.id()])).unwrap();
        let grandchild = f.pool.submit(JOB.task(2).after([child.id()])).unwrap();

        assert_eq!(f.pool.cancel(parent.id()), Ok(CancelOutcome::Signalled));
        assert_eq!(wait(&parent), Outcome::Cancelled(CancelReason::Requested));
        // The worker publishes the parent's outcome first and its dependents' right after, outside
        // the lock: wait for them rather than expect them already published.
        assert_eq!(
            wait(&child),
            Outcome::Cancelled(CancelReason::DependencyCancelled(parent.id()))
        );
        assert_eq!(
            wait(&grandchild),
            Outcome::Cancelled(CancelReason::DependencyCancelled(child.id()))
        );
        let _ = f.pool.shutdown(Duration::from_secs(60));
        assert_eq!(f.ran(), Vec::<u32>::new());
    }
}
