//! Hostile user code: regression tests for issue 7, items 0–6, and a hostile user type at each
//! place where the engine runs user code (an error's `Display`, a panic payload's `Drop`, a
//! payload's or output's `Drop`, an output's `Clone`, a handler calling `shutdown`).
//!
//! Every scenario runs on its own thread under a [`watchdog`]. If the pool deadlocks or loses a
//! task, the test fails with a message naming the bug instead of hanging the run. No test sleeps
//! to synchronise: handlers signal over channels, and the tests wait on handles (with a timeout),
//! on `wait_idle` and on a `ManualClock`.
//!
//! The hostile `Drop`s do nothing while their thread is already unwinding: a second panic there
//! would abort the whole test binary and hide every other result.

use std::error::Error;
use std::fmt;
use std::ops::Deref;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Once, Weak};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use tasq::{
    BuildError, Builder, CancelError, CancelOutcome, CancelReason, Context, Failure, FailureReason,
    HandlerError, ManualClock, Outcome, Pool, RetryPolicy, ShutdownReport, SubmitErrorKind,
    TaskHandle, TaskId, TaskState, TaskType, TypeOptions,
};

// ===== time bounds, panics, the watchdog =====

/// How long one scenario may take. After that, the test fails and blames a deadlock.
const WATCHDOG: Duration = Duration::from_secs(20);
/// How long one step of a scenario may take (a task's outcome, a handler's signal). This is a
/// bound on a wait, never a sleep.
const STEP: Duration = Duration::from_secs(10);
/// Every panic these tests cause on purpose carries this in its message (or is a
/// [`PanicsOnDrop`] payload). The panic hook keeps those panics quiet.
const EXPECTED: &str = "[hostile: expected panic]";

/// Installs, once for this test binary, a panic hook. It silences only the panics these tests
/// cause on purpose and passes every other panic (a failing assertion, say) to the default hook.
fn silence_expected_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let expected = info.payload().is::<PanicsOnDrop>()
                || panic_message(info.payload()).starts_with(EXPECTED);
            if !expected {
                default(info);
            }
        }));
    });
}

/// The message of a caught panic, for a test's own failure message.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}

/// Runs `scenario` on its own thread and re-raises its panic. If the scenario has not finished
/// within [`WATCHDOG`], the test fails with `bug` and the stuck thread is left behind.
#[track_caller]
fn watchdog(bug: &str, scenario: impl FnOnce() + Send + 'static) {
    silence_expected_panics();
    let (done_tx, done) = crossbeam_channel::bounded(1);
    thread::Builder::new()
        .name("hostile-scenario".to_owned())
        .spawn(move || {
            let _ = done_tx.send(panic::catch_unwind(AssertUnwindSafe(scenario)));
        })
        .expect("spawn the scenario thread");
    match done.recv_timeout(WATCHDOG) {
        Ok(Ok(())) => {}
        Ok(Err(payload)) => {
            // The hook kept a hostile value's own panic quiet: say that it escaped.
            let message = panic_message(&*payload);
            if payload.is::<PanicsOnDrop>() || message.starts_with(EXPECTED) {
                panic!("a hostile value's panic escaped into the scenario thread: {message}");
            }
            panic::resume_unwind(payload)
        }
        Err(_) => panic!("{bug} (the scenario did not finish within {WATCHDOG:?})"),
    }
}

/// Receives one message, failing with `what` if none comes within [`STEP`].
#[track_caller]
fn recv<T>(receiver: &Receiver<T>, what: &str) -> T {
    receiver
        .recv_timeout(STEP)
        .unwrap_or_else(|e| panic!("{what}: nothing within {STEP:?} ({e})"))
}

/// A task's outcome. Fails with `what` if the task has not finished within [`STEP`].
#[track_caller]
fn outcome<O: Clone + 'static>(handle: &TaskHandle<O>, what: &str) -> Outcome<O> {
    handle.wait_timeout(STEP).unwrap_or_else(|| {
        panic!(
            "lost task: {what} ({}) did not finish within {STEP:?}",
            handle.id()
        )
    })
}

// ===== the pool under test =====

/// The pool under test, in an `Arc` so that hostile values can call back into it through a
/// [`weak`](TestPool::weak) reference.
///
/// If the scenario panics (a failed assertion), the pool is leaked, not dropped. A broken engine
/// may hang or panic in `Drop for Pool`. A hang would hide the assertion's message behind the
/// watchdog's. A panic while unwinding would abort the whole test binary.
struct TestPool(Option<Arc<Pool>>);

impl TestPool {
    fn new(builder: Builder) -> Self {
        TestPool(Some(Arc::new(builder.build().expect("build the pool"))))
    }

    fn weak(&self) -> Weak<Pool> {
        Arc::downgrade(self.0.as_ref().expect("the pool is there"))
    }

    fn arc(&self) -> Arc<Pool> {
        Arc::clone(self.0.as_ref().expect("the pool is there"))
    }
}

impl Deref for TestPool {
    type Target = Pool;

    fn deref(&self) -> &Pool {
        self.0.as_ref().expect("the pool is there")
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        if thread::panicking() {
            std::mem::forget(self.0.take());
        }
    }
}

/// An ordinary task: its output is its payload.
const JOB: TaskType<u32, u32> = TaskType::new("job");
/// The payload of the `JOB`s that hostile values submit from inside their `Drop` or `Clone`.
const FROM_USER_CODE: u32 = 999;
/// Holds a worker until the test releases it (see [`hold`]).
const HOLD: TaskType<Hold, ()> = TaskType::new("hold");

/// A builder with `workers` workers, named `hostile-*`, and the `JOB` and `HOLD` types.
fn builder(workers: usize) -> Builder {
    silence_expected_panics();
    Pool::builder()
        .workers(workers)
        .thread_name("hostile")
        .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .register(HOLD, |_, hold: &Hold| {
            let _ = hold.arrived.send(());
            // Err once the test drops the sender: that is the release.
            let _ = hold.release.recv();
            Ok::<_, HandlerError>(())
        })
}

struct Hold {
    arrived: Sender<()>,
    release: Receiver<()>,
}

/// `HOLD` tasks submitted by [`hold`]. Dropping this releases them too.
struct Held {
    arrived: Receiver<()>,
    release: Option<Sender<()>>,
    handles: Vec<TaskHandle<()>>,
}

/// Submits `n` `HOLD` tasks at the top priority. Each one holds a worker until released.
fn hold(pool: &Pool, n: usize) -> Held {
    let (arrived_tx, arrived) = crossbeam_channel::unbounded();
    let (release, release_rx) = crossbeam_channel::bounded(0);
    let handles = (0..n)
        .map(|_| {
            let hold = Hold {
                arrived: arrived_tx.clone(),
                release: release_rx.clone(),
            };
            pool.submit(HOLD.task(hold).priority(255))
                .expect("submit a hold task")
        })
        .collect();
    Held {
        arrived,
        release: Some(release),
        handles,
    }
}

impl Held {
    /// Waits until every hold task is running. This proves that that many workers are alive
    /// at the same time.
    #[track_caller]
    fn wait_running(&self, what: &str) {
        for running in 0..self.handles.len() {
            if self.arrived.recv_timeout(STEP).is_err() {
                panic!(
                    "{what}: only {running} of {} hold tasks started within {STEP:?}",
                    self.handles.len()
                );
            }
        }
    }

    /// Lets the hold tasks return, then returns their outcomes.
    #[track_caller]
    fn release(mut self) -> Vec<Outcome<()>> {
        self.release.take();
        self.handles
            .iter()
            .map(|handle| outcome(handle, "a released hold task"))
            .collect()
    }
}

/// Asserts that `workers` workers are alive: as many tasks run at once, and `stats()` counts
/// them.
#[track_caller]
fn assert_workers_alive(pool: &Pool, workers: usize, when: &str) {
    let held = hold(pool, workers);
    held.wait_running(&format!("a worker died {when}"));
    for outcome in held.release() {
        assert_eq!(outcome, Outcome::Succeeded(()), "a roll-call task {when}");
    }
    assert_eq!(pool.stats().workers, workers, "stats().workers {when}");
}

/// Shuts the pool down from the test thread and checks that nothing was left behind. See
/// [`assert_nothing_left`].
#[track_caller]
fn shut_down(pool: &Pool) -> ShutdownReport {
    let report = pool.shutdown(STEP);
    assert!(!report.deadline_reached, "the drain timed out: {report:?}");
    assert_nothing_left(pool, &report);
    report
}

/// After a shutdown: no task is left unfinished, every accepted task was counted exactly once,
/// and every worker has exited.
#[track_caller]
fn assert_nothing_left(pool: &Pool, report: &ShutdownReport) {
    let stats = pool.stats();
    assert_eq!(
        (stats.blocked, stats.scheduled, stats.ready, stats.running),
        (0, 0, 0, 0),
        "tasks left after shutdown: {stats:?}"
    );
    assert_eq!(
        report.succeeded + report.failed + report.cancelled,
        stats.totals.submitted,
        "every accepted task ends exactly once: {report:?}, {stats:?}"
    );
    assert_eq!(stats.workers, 0, "workers left after shutdown");
}

/// A handle of any output type, to check that a list of handles have all finished.
trait AnyHandle {
    fn task(&self) -> TaskId;
    fn finished(&self) -> bool;
}

impl<O> AnyHandle for TaskHandle<O> {
    fn task(&self) -> TaskId {
        self.id()
    }

    fn finished(&self) -> bool {
        self.is_finished()
    }
}

#[track_caller]
fn assert_all_finished(handles: &[&dyn AnyHandle]) {
    for handle in handles {
        assert!(handle.finished(), "{} has not finished", handle.task());
    }
}

// ===== hostile user types =====

/// A handler error whose `Display` panics.
#[derive(Debug)]
struct PanickyDisplay;

impl fmt::Display for PanickyDisplay {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        panic!("{EXPECTED}: the Display of a handler error")
    }
}

impl Error for PanickyDisplay {}

/// Panics when dropped. It serves as a payload, as an output, as a handler's error and as a panic
/// payload. Its clones panic when dropped too.
#[derive(Clone, Debug, PartialEq)]
struct PanicsOnDrop(&'static str);

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if !thread::panicking() {
            panic!("{EXPECTED}: the Drop of {}", self.0);
        }
    }
}

impl fmt::Display for PanicsOnDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (panics when dropped)", self.0)
    }
}

impl Error for PanicsOnDrop {}

/// An output whose `Clone` panics. `wait` clones the output to hand it out.
#[derive(Debug)]
struct PanicsOnClone;

impl Clone for PanicsOnClone {
    fn clone(&self) -> Self {
        panic!("{EXPECTED}: the Clone of an output")
    }
}

/// What a value saw when it called back into the pool from its `Drop` or `Clone`.
#[derive(Debug)]
struct Reentered {
    workers: usize,
    submitted: Result<(), SubmitErrorKind>,
}

/// Where a value that calls back into the pool reaches it, and where it reports.
#[derive(Clone, Debug)]
struct Callback {
    pool: Weak<Pool>,
    report: Sender<Reentered>,
}

impl Callback {
    fn new(pool: &TestPool) -> (Self, Receiver<Reentered>) {
        let (report, reports) = crossbeam_channel::unbounded();
        let callback = Callback {
            pool: pool.weak(),
            report,
        };
        (callback, reports)
    }

    /// Reads `stats()` and submits a `JOB`, then reports both results.
    fn call(&self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let workers = pool.stats().workers;
        let submitted = pool
            .submit(JOB.task(FROM_USER_CODE))
            .map(drop)
            .map_err(|e| e.kind().clone());
        let _ = self.report.send(Reentered { workers, submitted });
    }
}

/// Waits for a hostile value's report of its call back into the pool (`what` names the
/// deadlock if it never comes): it saw the one worker alive, and its submit was accepted.
#[track_caller]
fn assert_reentered_alive(reports: &Receiver<Reentered>, what: &str) {
    let seen = recv(reports, what);
    assert_eq!(seen.workers, 1, "{seen:?}");
    assert_eq!(seen.submitted, Ok(()), "{seen:?}");
}

/// With four terminal records whose user values panic when dropped, all older than the
/// retention age of 1 s on `clock`: moves the clock past that age, and checks that the task whose
/// ending makes retention drop them runs, and the next one too (the worker is then past those
/// drops, and past counting a panic had one escaped), that only those two records are left, and
/// that the worker lives.
#[track_caller]
fn assert_retention_dropped_quietly(pool: &Pool, clock: &ManualClock) {
    clock.advance(Duration::from_secs(2));
    let last = pool.submit(JOB.task(5)).unwrap();
    assert_eq!(
        outcome(&last, "the task that ends retention's wait").succeeded(),
        Some(5)
    );
    let after = pool.submit(JOB.task(6)).unwrap();
    assert_eq!(outcome(&after, "the next task").succeeded(), Some(6));
    assert_eq!(pool.stats().totals.worker_panics, 0);
    assert_eq!(
        pool.stats().retained,
        2,
        "the four old records were dropped"
    );
    assert_workers_alive(pool, 1, "after retention");
}

/// Calls back into the pool when dropped. It serves as a payload and as an output.
#[derive(Debug)]
struct ReentersOnDrop(Callback);

impl Drop for ReentersOnDrop {
    fn drop(&mut self) {
        if !thread::panicking() {
            self.0.call();
        }
    }
}

/// An output whose `Clone` calls back into the pool.
#[derive(Debug)]
struct ReentersOnClone(Callback);

impl Clone for ReentersOnClone {
    fn clone(&self) -> Self {
        self.0.call();
        ReentersOnClone(self.0.clone())
    }
}

// ===== 0: a forgotten, cancelled dependent =====

/// Issue 7, item 0, the issue's reproduction on the default retention. A blocked task is
/// cancelled. Retention then forgets it while its dependency is still pending. When the
/// dependency runs, the dependency must succeed, and the worker, later tasks and `shutdown`
/// must not be affected. Before the fix, the worker panicked under the lock
/// (`records.get_mut(&dependent).expect(..)`): `stats().workers` fell to 0 and waits hung.
#[test]
fn item0_a_dependent_forgotten_by_retention_does_not_kill_the_worker() {
    watchdog(
        "deadlock: item 0, finishing a task whose cancelled dependent retention forgot",
        || {
            let clock = ManualClock::new();
            let pool = TestPool::new(builder(1).manual_clock(clock.clone()));
            let reminder = pool
                .submit(JOB.task(1).delay(Duration::from_secs(2 * 3600)))
                .unwrap();
            let follow_up = pool.submit(JOB.task(2).after([reminder.id()])).unwrap();
            assert_eq!(follow_up.cancel(), Ok(CancelOutcome::Cancelled));

            clock.advance(Duration::from_secs(3601));
            // Finishing a task makes retention drop follow_up's record (older than an hour).
            let third = pool.submit(JOB.task(3)).unwrap();
            assert_eq!(outcome(&third, "the third task"), Outcome::Succeeded(3));
            clock.advance(Duration::from_secs(3600));
            pool.wait_idle();

            assert_eq!(outcome(&reminder, "the reminder"), Outcome::Succeeded(1));
            assert_eq!(
                follow_up.try_wait(),
                Some(Outcome::Cancelled(CancelReason::Requested))
            );
            assert_eq!(pool.stats().workers, 1, "the reminder's worker died");
            let fresh = pool.submit(JOB.task(4)).unwrap();
            assert_eq!(outcome(&fresh, "a fresh task"), Outcome::Succeeded(4));
            assert_workers_alive(&pool, 1, "after the reminder finished");
            shut_down(&pool);
            assert_all_finished(&[&reminder, &follow_up, &third, &fresh]);
        },
    );
}

// ===== 1: an error's Display panics =====

/// What a `BAD_ERROR` handler returns.
#[derive(Clone, Copy, Debug)]
enum BadError {
    /// `HandlerError::permanent(PanickyDisplay)`.
    Permanent,
    /// `HandlerError::retryable(PanickyDisplay)` on every attempt.
    Retryable,
    /// A plain retryable error, then `PanickyDisplay` on the last attempt.
    RetryableOnLastAttempt,
}

const BAD_ERROR: TaskType<BadError, ()> = TaskType::new("bad_error");
const BAD_ERROR_ATTEMPTS: u32 = 3;

fn bad_error_handler(ctx: &Context, kind: &BadError) -> Result<(), HandlerError> {
    Err(match kind {
        BadError::Permanent => HandlerError::permanent(PanickyDisplay),
        BadError::Retryable => HandlerError::retryable(PanickyDisplay),
        BadError::RetryableOnLastAttempt if ctx.attempt() < BAD_ERROR_ATTEMPTS => {
            HandlerError::retryable("not yet")
        }
        BadError::RetryableOnLastAttempt => HandlerError::retryable(PanickyDisplay),
    })
}

/// Runs one `BAD_ERROR` task of `kind`, then an ordinary task, on a one-worker pool, and
/// returns the bad task's failure. The task must end as a dead letter, the worker must survive,
/// the next task must run, and the shutdown must leave nothing running.
fn run_bad_error(kind: BadError) -> Failure {
    // Retries wait at most a millisecond.
    let fast = RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(1));
    let options = TypeOptions::new()
        .max_attempts(BAD_ERROR_ATTEMPTS)
        .retry_policy(fast);
    let pool = TestPool::new(builder(1).register_with(BAD_ERROR, options, bad_error_handler));
    let bad = pool.submit(BAD_ERROR.task(kind)).unwrap();
    let next = pool.submit(JOB.task(7)).unwrap();

    let failure = match outcome(&bad, "the task whose error's Display panics") {
        Outcome::Failed(failure) => failure,
        other => panic!("expected a dead letter, got {other:?}"),
    };
    assert!(
        pool.dead_letters().iter().any(|dead| dead.id == bad.id()),
        "the task is not among the dead letters"
    );
    assert_eq!(outcome(&next, "the task after it"), Outcome::Succeeded(7));
    assert_workers_alive(&pool, 1, "after an error's Display panicked");
    shut_down(&pool);
    assert_all_finished(&[&bad, &next]);
    failure
}

/// Issue 7, item 1: a handler returns `HandlerError::permanent(e)`, and `e`'s `Display` panics.
/// The task must become a dead letter, and the worker must survive. Before the fix, the message
/// was formatted outside `catch_unwind`: the worker died and the task stayed `Running`.
#[test]
fn item1_a_permanent_error_whose_display_panics_is_a_dead_letter() {
    watchdog(
        "deadlock: item 1, a permanent error's Display panicked",
        || {
            run_bad_error(BadError::Permanent);
        },
    );
}

/// Issue 7, item 1, the retryable form: every attempt returns `HandlerError::retryable(e)`, and
/// `e`'s `Display` panics. The task must end as a dead letter (at once or once its attempts run
/// out), and the worker must survive.
#[test]
fn item1_a_retryable_error_whose_display_panics_ends_as_a_dead_letter() {
    watchdog(
        "deadlock: item 1, a retryable error's Display panicked",
        || {
            run_bad_error(BadError::Retryable);
        },
    );
}

/// Issue 7, item 1, on the last attempt: the first attempts fail with plain retryable errors,
/// and the last fails with one whose `Display` panics. This is the exhausted-attempts branch.
/// The task must be a dead letter after all of its attempts.
#[test]
fn item1_a_retryable_error_whose_display_panics_on_the_last_attempt() {
    watchdog(
        "deadlock: item 1, the last attempt's error Display panicked",
        || {
            let failure = run_bad_error(BadError::RetryableOnLastAttempt);
            assert_eq!(failure.attempts, BAD_ERROR_ATTEMPTS, "{failure:?}");
        },
    );
}

// ===== 2: a panic payload's Drop panics =====

const BOMB: TaskType<(), ()> = TaskType::new("bomb");

/// Issue 7, item 2: a handler calls `panic_any(payload)`, and the payload's `Drop` panics. The
/// task must end `Failed` with reason `Panicked`, the worker must survive, and the next task
/// must run. Before the fix, the caught payload was dropped outside any `catch_unwind`, and the
/// worker died.
#[test]
fn item2_a_panic_payload_whose_drop_panics_does_not_kill_the_worker() {
    watchdog("deadlock: item 2, a panic payload's Drop panicked", || {
        let pool = TestPool::new(builder(1).register(BOMB, |_, _: &()| {
            panic::panic_any(PanicsOnDrop("a panic payload"))
        }));
        let bomb = pool.submit(BOMB.task(())).unwrap();
        let next = pool.submit(JOB.task(8)).unwrap();

        match outcome(&bomb, "the task that panicked") {
            Outcome::Failed(failure) => assert_eq!(failure.reason, FailureReason::Panicked),
            other => panic!("expected a dead letter, got {other:?}"),
        }
        assert_eq!(outcome(&next, "the task after it"), Outcome::Succeeded(8));
        assert_workers_alive(&pool, 1, "after a panic payload's Drop panicked");
        shut_down(&pool);
        assert_all_finished(&[&bomb, &next]);
    });
}

// ===== 3: a payload's Drop panics =====

/// A payload whose `Drop` panics. Its handler fails permanently if `fail` is set (the pool
/// then keeps the payload with the dead letter), and succeeds otherwise.
struct Fragile {
    fail: bool,
    _bomb: PanicsOnDrop,
}

impl Fragile {
    fn new(fail: bool) -> Self {
        Fragile {
            fail,
            _bomb: PanicsOnDrop("a payload"),
        }
    }
}

const FRAGILE: TaskType<Fragile, u32> = TaskType::new("fragile");

/// Its output panics when dropped.
const DOOMED_OUTPUT: TaskType<(), PanicsOnDrop> = TaskType::new("doomed_output");

fn fragile_handler(_: &Context, fragile: &Fragile) -> Result<u32, HandlerError> {
    if fragile.fail {
        Err(HandlerError::permanent("fragile task failed"))
    } else {
        Ok(1)
    }
}

/// Issue 7, item 3: tasks whose payloads panic when dropped (once the task has succeeded) run
/// mixed with ordinary tasks on two workers. Every wait must return a terminal outcome, no task
/// may stay `Running`, and both workers must survive. Before the fix, the payload was dropped
/// after the worker had claimed its next task: the worker died, and that unrelated task stayed
/// `Running` forever.
#[test]
fn item3_payloads_whose_drop_panics_lose_no_task_and_no_worker() {
    watchdog(
        "deadlock: item 3, a payload's Drop panicked after its task finished",
        || {
            let pool = TestPool::new(builder(2).register(FRAGILE, fragile_handler));
            let mut fragile = Vec::new();
            let mut ordinary = Vec::new();
            for n in 0..8 {
                fragile.push(pool.submit(FRAGILE.task(Fragile::new(false))).unwrap());
                ordinary.push(pool.submit(JOB.task(n)).unwrap());
            }

            for (n, handle) in (0..).zip(&ordinary) {
                assert_eq!(outcome(handle, "an ordinary task"), Outcome::Succeeded(n));
            }
            for handle in &fragile {
                assert_eq!(
                    outcome(handle, "a task whose payload panics when dropped"),
                    Outcome::Succeeded(1)
                );
            }
            assert_workers_alive(&pool, 2, "after payloads' Drops panicked");
            shut_down(&pool);
            let all: Vec<_> = fragile
                .iter()
                .chain(&ordinary)
                .map(|h| h as &dyn AnyHandle)
                .collect();
            assert_all_finished(&all);
        },
    );
}

/// Issue 7, item 3, on cancel: a payload that panics when dropped belongs to a task cancelled
/// before it runs (through `pool.cancel` and `handle.cancel`). The cancel must return
/// `Ok(Cancelled)` without panicking in the caller, and the pool must keep working.
#[test]
fn item3_cancelling_a_task_whose_payload_drop_panics_does_not_panic_the_caller() {
    watchdog(
        "deadlock: item 3, a cancelled payload's Drop panicked",
        || {
            let pool = TestPool::new(builder(1).register(FRAGILE, fragile_handler));
            let held = hold(&pool, 1);
            held.wait_running("the hold task");
            let first = pool.submit(FRAGILE.task(Fragile::new(false))).unwrap();
            let second = pool.submit(FRAGILE.task(Fragile::new(false))).unwrap();

            let cancelled = |how: &str, cancel: &dyn Fn() -> Result<CancelOutcome, CancelError>| {
                let result = panic::catch_unwind(AssertUnwindSafe(cancel)).unwrap_or_else(|p| {
                    panic!(
                        "item 3: {how} panicked in the caller: {}",
                        panic_message(&*p)
                    )
                });
                assert_eq!(result, Ok(CancelOutcome::Cancelled), "{how}");
            };
            cancelled("pool.cancel", &|| pool.cancel(first.id()));
            cancelled("handle.cancel", &|| second.cancel());
            for handle in [&first, &second] {
                assert_eq!(
                    outcome(handle, "a cancelled task"),
                    Outcome::Cancelled(CancelReason::Requested)
                );
            }
            assert!(held.release().iter().all(Outcome::is_succeeded));
            let next = pool.submit(JOB.task(3)).unwrap();
            assert_eq!(
                outcome(&next, "a task after the cancels"),
                Outcome::Succeeded(3)
            );
            assert_workers_alive(&pool, 1, "after cancelled payloads' Drops panicked");
            shut_down(&pool);
            assert_all_finished(&[&first, &second, &next]);
        },
    );
}

/// Issue 7, item 3, at the shutdown deadline: the deadline cancels queued tasks whose payloads
/// panic when dropped. `shutdown` must return its report normally to its caller, and those
/// tasks must end `Cancelled(Shutdown)`.
#[test]
fn item3_a_shutdown_that_cancels_payloads_whose_drop_panics_returns_normally() {
    watchdog(
        "deadlock: item 3, shutdown cancelled payloads whose Drop panics",
        || {
            let pool = TestPool::new(builder(1).register(FRAGILE, fragile_handler));
            let held = hold(&pool, 1);
            held.wait_running("the hold task");
            let queued: Vec<_> = (0..3)
                .map(|_| pool.submit(FRAGILE.task(Fragile::new(false))).unwrap())
                .collect();

            // The hold task keeps the shutdown waiting, so it runs on a thread of its own.
            let shutting = pool.arc();
            let shutdown = thread::spawn(move || {
                panic::catch_unwind(AssertUnwindSafe(|| shutting.shutdown(Duration::ZERO)))
                    .map_err(|p| panic_message(&*p))
            });
            for handle in &queued {
                assert_eq!(
                    outcome(handle, "a task the deadline cancels"),
                    Outcome::Cancelled(CancelReason::Shutdown)
                );
            }
            // The deadline fired the hold task's token: it ends cancelled when it returns.
            assert!(held.release().iter().all(Outcome::is_cancelled));
            let report = shutdown
                .join()
                .expect("the shutdown thread")
                .unwrap_or_else(|m| panic!("item 3: shutdown panicked in its caller: {m}"));
            assert!(report.deadline_reached, "{report:?}");
            assert_nothing_left(&pool, &report);
            let all: Vec<_> = queued.iter().map(|h| h as &dyn AnyHandle).collect();
            assert_all_finished(&all);
        },
    );
}

/// Issue 7, item 3, when the pool is dropped: dropping a pool cancels queued tasks whose
/// payloads panic when dropped. The drop must not panic ("a drop never hangs", and it must not
/// panic either), and those tasks must end `Cancelled(Shutdown)`.
#[test]
fn item3_dropping_a_pool_with_payloads_whose_drop_panics_does_not_panic() {
    watchdog(
        "deadlock: item 3, dropping a pool with payloads whose Drop panics",
        || {
            let pool = TestPool::new(builder(1).register(FRAGILE, fragile_handler));
            let held = hold(&pool, 1);
            held.wait_running("the hold task");
            let queued: Vec<_> = (0..3)
                .map(|_| pool.submit(FRAGILE.task(Fragile::new(false))).unwrap())
                .collect();

            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(move || drop(pool))) {
                panic!("item 3: dropping the pool panicked: {}", panic_message(&*p));
            }
            for handle in &queued {
                assert_eq!(
                    outcome(handle, "a task the drop cancels"),
                    Outcome::Cancelled(CancelReason::Shutdown)
                );
            }
            assert!(held.release().iter().all(Outcome::is_cancelled));
            let all: Vec<_> = queued.iter().map(|h| h as &dyn AnyHandle).collect();
            assert_all_finished(&all);
        },
    );
}

/// Issue 7, item 3, at the pool's end: a shut-down pool still holds a dead letter's payload and
/// a remembered task's output, and both panic when dropped. Dropping the pool (the last
/// reference to its state, since the workers were joined) must not panic in the caller. This is
/// the pool's own cleanup, not the user dropping a value it got back.
#[test]
fn item3_dropping_a_shut_down_pool_that_holds_values_whose_drop_panics_does_not_panic() {
    watchdog(
        "deadlock: item 3, dropping a pool that holds values whose Drop panics",
        || {
            let pool = TestPool::new(
                builder(1)
                    .register(FRAGILE, fragile_handler)
                    .register(DOOMED_OUTPUT, |_, _: &()| {
                        Ok::<_, HandlerError>(PanicsOnDrop("an output"))
                    }),
            );
            let dead = pool.submit(FRAGILE.task(Fragile::new(true))).unwrap();
            // Its handle goes at once: only the pool's record keeps the output.
            drop(pool.submit(DOOMED_OUTPUT.task(())).unwrap());
            let last = pool.submit(JOB.task(1)).unwrap();
            assert!(outcome(&dead, "the dead letter").is_failed());
            assert_eq!(outcome(&last, "the last task"), Outcome::Succeeded(1));
            shut_down(&pool);

            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(move || drop(pool))) {
                panic!(
                    "item 3: dropping a shut-down pool panicked: {}",
                    panic_message(&*p)
                );
            }
            assert_all_finished(&[&dead, &last]);
        },
    );
}

// ===== 4: user Drops under the lock =====

/// Its output calls back into the pool when dropped.
const REENTRANT_OUTPUT: TaskType<Callback, ReentersOnDrop> = TaskType::new("reentrant_output");
/// Its payload calls back into the pool when dropped.
const REENTRANT_PAYLOAD: TaskType<ReentersOnDrop, ()> = TaskType::new("reentrant_payload");

/// Issue 7, item 4. With `.retention(0, None)`, a fire-and-forget task's output is dropped with
/// its record. The output's `Drop` calls `stats()` and `submit`. This must not deadlock: the
/// `Drop` returns, and later submits, cancels, `stats()` and the shutdown all return. Before
/// the fix, the output was dropped under the pool's lock, and the whole pool deadlocked.
#[test]
fn item4_an_output_whose_drop_calls_back_into_the_pool_does_not_deadlock() {
    watchdog(
        "deadlock: item 4, an output's Drop called back into the pool",
        || {
            let pool =
                TestPool::new(builder(1).retention(0, None).register(
                    REENTRANT_OUTPUT,
                    |_, callback: &Callback| {
                        Ok::<_, HandlerError>(ReentersOnDrop(callback.clone()))
                    },
                ));
            // The worker is held until the handle is gone: the task is fire-and-forget.
            let held = hold(&pool, 1);
            held.wait_running("the hold task");
            let (callback, reports) = Callback::new(&pool);
            drop(pool.submit(REENTRANT_OUTPUT.task(callback)).unwrap());
            assert!(held.release().iter().all(Outcome::is_succeeded));
            let after = pool.submit(JOB.task(5)).unwrap();

            assert_reentered_alive(
                &reports,
                "deadlock: item 4, the output's Drop never returned",
            );
            assert_eq!(
                outcome(&after, "a task after the output's Drop"),
                Outcome::Succeeded(5)
            );
            let delayed = pool
                .submit(JOB.task(6).delay(Duration::from_secs(3600)))
                .unwrap();
            assert_eq!(pool.cancel(delayed.id()), Ok(CancelOutcome::Cancelled));
            assert_workers_alive(&pool, 1, "after an output's Drop called back into the pool");
            shut_down(&pool);
            assert_all_finished(&[&after, &delayed]);
        },
    );
}

/// Issue 7, item 4: with `.retention(0, None)`, fire-and-forget tasks' outputs panic when they
/// are dropped with their records. The worker must survive, and the next task must run.
#[test]
fn item4_an_output_whose_drop_panics_does_not_kill_the_worker() {
    watchdog("deadlock: item 4, an output's Drop panicked", || {
        let pool = TestPool::new(
            builder(1)
                .retention(0, None)
                .register(DOOMED_OUTPUT, |_, _: &()| {
                    Ok::<_, HandlerError>(PanicsOnDrop("an output"))
                }),
        );
        let held = hold(&pool, 1);
        held.wait_running("the hold task");
        for _ in 0..2 {
            drop(pool.submit(DOOMED_OUTPUT.task(())).unwrap());
        }
        let next = pool.submit(JOB.task(5)).unwrap();
        assert!(held.release().iter().all(Outcome::is_succeeded));

        assert_eq!(
            outcome(&next, "the task after the outputs"),
            Outcome::Succeeded(5)
        );
        assert_workers_alive(&pool, 1, "after an output's Drop panicked");
        shut_down(&pool);
        assert_all_finished(&[&next]);
    });
}

/// Issue 7, item 4, the cancelled form: a running task is cancelled, and its handler then
/// returns `Ok` with an output that panics when dropped. The output is discarded because the
/// task ends `Cancelled`. The worker must survive, and the task queued behind it must run.
#[test]
fn item4_a_discarded_output_of_a_cancelled_task_whose_drop_panics() {
    const DISCARDED: TaskType<Sender<()>, PanicsOnDrop> = TaskType::new("discarded");
    watchdog(
        "deadlock: item 4, a cancelled task's discarded output's Drop panicked",
        || {
            let pool =
                TestPool::new(builder(1).register(DISCARDED, |ctx, started: &Sender<()>| {
                    let _ = started.send(());
                    ctx.token().wait();
                    Ok::<_, HandlerError>(PanicsOnDrop("a discarded output"))
                }));
            let (started_tx, started) = crossbeam_channel::unbounded();
            let running = pool.submit(DISCARDED.task(started_tx)).unwrap();
            recv(&started, "the handler to start");
            let next = pool.submit(JOB.task(6)).unwrap();
            assert_eq!(pool.cancel(running.id()), Ok(CancelOutcome::Signalled));

            assert_eq!(
                outcome(&running, "the cancelled task"),
                Outcome::Cancelled(CancelReason::Requested)
            );
            assert_eq!(outcome(&next, "the task after it"), Outcome::Succeeded(6));
            assert_workers_alive(&pool, 1, "after a discarded output's Drop panicked");
            shut_down(&pool);
            assert_all_finished(&[&running, &next]);
        },
    );
}

/// Issue 10: an output kept for an unread handle after retention forgot its task (an
/// orphaned outcome) calls back into the pool when the handle's drop lets it go. The drop is
/// taken in by the worker, after its next task: the output is dropped there, outside the lock.
#[test]
fn issue10_an_output_kept_for_an_unread_handle_calls_back_into_the_pool_when_let_go() {
    watchdog(
        "deadlock: issue 10, an orphaned output's Drop called back into the pool",
        || {
            let pool =
                TestPool::new(builder(1).retention(0, None).register(
                    REENTRANT_OUTPUT,
                    |_, callback: &Callback| {
                        Ok::<_, HandlerError>(ReentersOnDrop(callback.clone()))
                    },
                ));
            let (callback, reports) = Callback::new(&pool);
            let unread = pool.submit(REENTRANT_OUTPUT.task(callback)).unwrap();
            pool.wait_idle();
            assert_eq!(
                pool.status(unread.id()),
                None,
                "forgotten, kept for the handle"
            );
            drop(unread);
            let after = pool.submit(JOB.task(5)).unwrap();

            assert_reentered_alive(
                &reports,
                "deadlock: issue 10, the orphaned output's Drop never returned",
            );
            assert_eq!(
                outcome(&after, "a task after the output's Drop"),
                Outcome::Succeeded(5)
            );
            assert_workers_alive(&pool, 1, "after an orphaned output's Drop called back");
            shut_down(&pool);
            assert_all_finished(&[&after]);
        },
    );
}

/// Issue 10: outputs kept for unread handles panic when dropped: one let go by its handle's
/// drop while the pool runs (dropped by a worker), one kept past the pool's end (dropped by the
/// handle's own `Drop`, on the test's thread), one still kept when the last handle and the pool
/// are gone (dropped with the hub). None of them may reach a worker or the caller.
#[test]
fn issue10_outputs_kept_for_unread_handles_whose_drop_panics() {
    watchdog(
        "deadlock: issue 10, an output kept for an unread handle panicked when dropped",
        || {
            let pool = TestPool::new(
                builder(1)
                    .retention(0, None)
                    .register(DOOMED_OUTPUT, |_, _: &()| {
                        Ok::<_, HandlerError>(PanicsOnDrop("an output kept for a handle"))
                    }),
            );
            let let_go = pool.submit(DOOMED_OUTPUT.task(())).unwrap();
            let outliving = pool.submit(DOOMED_OUTPUT.task(())).unwrap();
            pool.wait_idle();
            drop(let_go);
            let after = pool.submit(JOB.task(5)).unwrap();
            assert_eq!(
                outcome(&after, "a task after the drop"),
                Outcome::Succeeded(5)
            );
            assert_workers_alive(&pool, 1, "after a kept output's Drop panicked");
            shut_down(&pool);
            drop(pool);
            assert!(outliving.is_finished());
            drop(outliving);

            let pool = TestPool::new(
                builder(1)
                    .retention(0, None)
                    .register(DOOMED_OUTPUT, |_, _: &()| {
                        Ok::<_, HandlerError>(PanicsOnDrop("an output kept past the pool"))
                    }),
            );
            let last = pool.submit(DOOMED_OUTPUT.task(())).unwrap();
            pool.wait_idle();
            shut_down(&pool);
            drop(pool);
            drop(last);
        },
    );
}

/// Issue 20, item 11: on an idle pool, the drops of unread handles are taken in by the
/// dropping thread itself (every few hundred) and by `wait_idle`, not by a worker: the outputs
/// they let go are dropped on the test's thread, after the pool's lock is released. Outputs
/// that call back into the pool get through (no deadlock), and outputs that panic when dropped
/// reach neither the dropping thread nor `wait_idle`'s caller.
#[test]
fn issue20_outputs_let_go_on_an_idle_pool_call_back_or_panic_quietly() {
    const TASKS: usize = 300;
    watchdog(
        "deadlock: issue 20, an output let go by a handle's drop on an idle pool",
        || {
            let pool =
                TestPool::new(builder(1).retention(0, None).register(
                    REENTRANT_OUTPUT,
                    |_, callback: &Callback| {
                        Ok::<_, HandlerError>(ReentersOnDrop(callback.clone()))
                    },
                ));
            let (callback, reports) = Callback::new(&pool);
            let unread: Vec<_> = (0..TASKS)
                .map(|_| {
                    pool.submit(REENTRANT_OUTPUT.task(callback.clone()))
                        .unwrap()
                })
                .collect();
            pool.wait_idle();
            drop(unread);
            pool.wait_idle();
            for _ in 0..TASKS {
                assert_reentered_alive(
                    &reports,
                    "deadlock: issue 20, a let-go output's Drop never returned",
                );
            }
            assert_workers_alive(&pool, 1, "after let-go outputs called back");
            shut_down(&pool);

            let pool = TestPool::new(
                builder(1)
                    .retention(0, None)
                    .register(DOOMED_OUTPUT, |_, _: &()| {
                        Ok::<_, HandlerError>(PanicsOnDrop("an output let go on an idle pool"))
                    }),
            );
            let unread: Vec<_> = (0..TASKS)
                .map(|_| pool.submit(DOOMED_OUTPUT.task(())).unwrap())
                .collect();
            pool.wait_idle();
            drop(unread);
            pool.wait_idle();
            assert_workers_alive(&pool, 1, "after let-go outputs panicked");
            shut_down(&pool);
        },
    );
}

/// Issue 7, item 4, for payloads: a payload's `Drop` calls `stats()` and `submit`. The payload
/// is dropped in four places, and none of them may deadlock: after its task succeeds; on a
/// cancel before the task runs; when a duplicate idempotency key refuses it; and when the
/// shutdown deadline cancels its task. In the last case, the submit must be refused as
/// `ShutDown`.
#[test]
fn item4_a_payload_whose_drop_calls_back_into_the_pool_does_not_deadlock() {
    watchdog(
        "deadlock: item 4, a payload's Drop called back into the pool",
        || {
            let pool = TestPool::new(
                builder(1)
                    .retention(0, None)
                    .register(REENTRANT_PAYLOAD, |_, _: &ReentersOnDrop| {
                        Ok::<_, HandlerError>(())
                    }),
            );
            let task = || {
                let (callback, reports) = Callback::new(&pool);
                (REENTRANT_PAYLOAD.task(ReentersOnDrop(callback)), reports)
            };
            let called_back = |reports: &Receiver<Reentered>, when: &str| {
                let seen = recv(
                    reports,
                    &format!("deadlock: item 4, a payload's Drop {when}"),
                );
                assert_eq!((seen.workers, seen.submitted), (1, Ok(())), "{when}");
            };

            let (succeeds, after_success) = task();
            let succeeded = pool.submit(succeeds).unwrap();
            assert_eq!(
                outcome(&succeeded, "a task whose payload calls back"),
                Outcome::Succeeded(())
            );
            called_back(&after_success, "after its task succeeded");

            let (delayed, on_cancel) = task();
            let delayed = pool
                .submit(delayed.delay(Duration::from_secs(3600)).key("k"))
                .unwrap();
            let (duplicate, on_duplicate) = task();
            let again = pool.submit(duplicate.key("k")).unwrap();
            assert_eq!(again.id(), delayed.id(), "the key did not deduplicate");
            called_back(&on_duplicate, "refused as a duplicate");
            assert_eq!(pool.cancel(delayed.id()), Ok(CancelOutcome::Cancelled));
            called_back(&on_cancel, "on cancel");

            let (pending, on_shutdown) = task();
            let pending = pool
                .submit(pending.delay(Duration::from_secs(3600)))
                .unwrap();
            assert_workers_alive(&pool, 1, "after payloads' Drops called back into the pool");
            let report = pool.shutdown(Duration::ZERO);
            let seen = recv(
                &on_shutdown,
                "deadlock: item 4, a payload's Drop at the deadline",
            );
            assert_eq!(seen.submitted, Err(SubmitErrorKind::ShutDown), "{seen:?}");
            assert_eq!(
                outcome(&pending, "the task the deadline cancelled"),
                Outcome::Cancelled(CancelReason::Shutdown)
            );
            assert_nothing_left(&pool, &report);
            assert_all_finished(&[&succeeded, &delayed, &again, &pending]);
        },
    );
}

// ===== issue 24: direct runs =====

/// The payload of an [`UNRULY`] task: its `Drop` panics, or calls back into the pool.
#[derive(Debug)]
enum Unruly {
    Panics(#[allow(dead_code)] PanicsOnDrop),
    CallsBack(#[allow(dead_code)] ReentersOnDrop),
}

/// A type whose plain tasks run direct: a unit output, on a pool without lanes or gates.
const UNRULY: TaskType<Unruly, ()> = TaskType::new("unruly");

/// Issue 24: plain tasks of a unit output (no key, dependency, delay or priority, on a pool
/// without lanes or gates) run direct: from the worker's slot, without the pool's lock, their
/// successes kept in the slot's done buffer with no record. Their payloads are dropped on that
/// path, once the slot's lock is let go: half panic, half call back into the pool (its
/// `stats()`, which takes every slot's lock and the pool's, and a submit). Every task
/// succeeds, each call back sees both workers and is accepted, and no panic escapes.
#[test]
fn issue24_direct_runs_whose_payloads_panic_or_call_back_when_dropped() {
    watchdog(
        "deadlock: issue 24, a direct run's payload Drop called back into the pool",
        || {
            const TASKS: u32 = 200;
            let pool = TestPool::new(
                builder(2).register(UNRULY, |_, _: &Unruly| Ok::<_, HandlerError>(())),
            );
            let (callback, reports) = Callback::new(&pool);
            let mut kept = Vec::new();
            for n in 0..TASKS {
                let payload = if n % 2 == 0 {
                    Unruly::Panics(PanicsOnDrop("a direct run's payload"))
                } else {
                    Unruly::CallsBack(ReentersOnDrop(callback.clone()))
                };
                let handle = pool.submit(UNRULY.task(payload)).unwrap();
                // Half the handles dropped at once, half read at the end.
                if n % 4 < 2 {
                    kept.push(handle);
                }
            }
            drop(callback);
            for handle in &kept {
                assert_eq!(outcome(handle, "a direct run"), Outcome::Succeeded(()));
            }
            for _ in 0..TASKS / 2 {
                let seen = recv(&reports, "deadlock: issue 24, a direct run's payload Drop");
                assert_eq!(seen.workers, 2, "{seen:?}");
                assert_eq!(seen.submitted, Ok(()), "{seen:?}");
            }
            assert_workers_alive(&pool, 2, "after direct runs' payloads panicked");
            let report = shut_down(&pool);
            // The tasks, the jobs their payloads submitted, and the roll call's two.
            assert_eq!(
                report.succeeded,
                u64::from(TASKS + TASKS / 2) + 2,
                "{report:?}"
            );
            assert_eq!(pool.stats().totals.worker_panics, 0);
            assert_eq!(pool.check_invariants(), Ok(()));
        },
    );
}

// ===== 5: shutdown from inside a handler =====

/// A task whose handler calls `pool.shutdown(Duration::MAX)` and reports what it returned.
const SHUT_DOWN_INSIDE: TaskType<Shutter, ()> = TaskType::new("shut_down_inside");

struct Shutter {
    pool: Weak<Pool>,
    started: Sender<()>,
    go: Receiver<()>,
    report: Sender<ShutdownReport>,
}

fn shutter_handler(_: &Context, shutter: &Shutter) -> Result<(), HandlerError> {
    let _ = shutter.started.send(());
    // Err once the test drops the sender: that is the signal to go.
    let _ = shutter.go.recv();
    if let Some(pool) = shutter.pool.upgrade() {
        let _ = shutter.report.send(pool.shutdown(Duration::MAX));
    }
    Ok(())
}

/// Runs `callers` tasks on a pool of `callers` workers. Each handler calls
/// `shutdown(Duration::MAX)` while three ordinary tasks are queued behind them. Every call must
/// return. The queued tasks must end `Cancelled(Shutdown)`, because no worker is left to run
/// them. The callers' own tasks must end cancelled.
fn shutdown_from_every_worker(callers: usize) {
    let pool = TestPool::new(builder(callers).register(SHUT_DOWN_INSIDE, shutter_handler));
    let (started_tx, started) = crossbeam_channel::unbounded();
    let (go, go_rx) = crossbeam_channel::bounded::<()>(0);
    let (report_tx, reports) = crossbeam_channel::unbounded();
    let shutters: Vec<_> = (0..callers)
        .map(|_| {
            let shutter = Shutter {
                pool: pool.weak(),
                started: started_tx.clone(),
                go: go_rx.clone(),
                report: report_tx.clone(),
            };
            pool.submit(SHUT_DOWN_INSIDE.task(shutter)).unwrap()
        })
        .collect();
    for _ in 0..callers {
        recv(&started, "a shutting-down handler to start");
    }
    let queued: Vec<_> = (0..3).map(|n| pool.submit(JOB.task(n)).unwrap()).collect();
    drop(go);

    for _ in 0..callers {
        recv(
            &reports,
            "deadlock: item 5, shutdown(Duration::MAX) from a handler never returned",
        );
    }
    for handle in &queued {
        assert_eq!(
            outcome(handle, "a queued task"),
            Outcome::Cancelled(CancelReason::Shutdown)
        );
    }
    for handle in &shutters {
        assert!(outcome(handle, "a task that called shutdown").is_cancelled());
    }
    assert!(
        pool.submit(JOB.task(9))
            .is_err_and(|e| *e.kind() == SubmitErrorKind::ShutDown)
    );
    let report = pool.shutdown(STEP);
    assert_nothing_left(&pool, &report);
    assert_eq!(
        (report.succeeded, report.failed, report.cancelled),
        (0, 0, 3 + callers as u64),
        "{report:?}"
    );
    let queued = queued.iter().map(|h| h as &dyn AnyHandle);
    let all: Vec<_> = queued
        .chain(shutters.iter().map(|h| h as &dyn AnyHandle))
        .collect();
    assert_all_finished(&all);
}

/// Issue 7, item 5: the only worker's handler calls `shutdown(Duration::MAX)` while other tasks
/// are queued. Before the fix, nothing could run what was queued, so the call never returned.
#[test]
fn item5_shutdown_from_the_only_worker_returns() {
    watchdog(
        "deadlock: item 5, shutdown(Duration::MAX) from the only worker",
        || shutdown_from_every_worker(1),
    );
}

/// Issue 7, item 5, with two workers: both handlers call `shutdown(Duration::MAX)` at once
/// while other tasks are queued.
#[test]
fn item5_shutdown_from_every_worker_returns() {
    watchdog(
        "deadlock: item 5, shutdown(Duration::MAX) from both workers",
        || shutdown_from_every_worker(2),
    );
}

// ===== 6: a thread name with a NUL byte =====

/// Issue 7, item 6: a thread name containing a NUL byte must make `build()` return an error,
/// not panic inside the standard library.
#[test]
fn item6_a_thread_name_with_a_nul_byte_is_a_build_error() {
    let built = panic::catch_unwind(|| Pool::builder().workers(1).thread_name("bad\0name").build())
        .unwrap_or_else(|p| panic!("item 6: build() panicked: {}", panic_message(&*p)));
    let error = built.expect_err("a NUL byte in the thread name was accepted");
    assert!(
        matches!(&error, BuildError::InvalidThreadName(name) if name == "bad\0name"),
        "{error:?}"
    );
    assert!(!error.to_string().is_empty());
}

// ===== outputs' Clone =====

/// An output's `Clone` panics when `wait` hands it out. The panic must reach the waiting thread
/// only. A second wait must not hang (the panic left no lock held). The task stays `Succeeded`,
/// and the pool keeps running tasks.
#[test]
fn an_output_whose_clone_panics_panics_only_the_waiter() {
    const CLONE_PANICS: TaskType<(), PanicsOnClone> = TaskType::new("clone_panics");
    watchdog("deadlock: an output's Clone panicked in wait()", || {
        let pool = TestPool::new(builder(1).register(CLONE_PANICS, |_, _: &()| {
            Ok::<_, HandlerError>(PanicsOnClone)
        }));
        let handle = pool.submit(CLONE_PANICS.task(())).unwrap();
        let waited = panic::catch_unwind(AssertUnwindSafe(|| handle.wait()));
        assert!(
            waited.is_err(),
            "wait() handed out an output whose Clone panics"
        );
        // From another thread too, and try_wait: the first panic left no lock held.
        let other = handle.clone();
        let again =
            thread::spawn(move || panic::catch_unwind(AssertUnwindSafe(|| other.wait())).is_err());
        assert!(
            again.join().expect("the second waiter"),
            "the second wait did not panic"
        );
        assert!(panic::catch_unwind(AssertUnwindSafe(|| handle.try_wait())).is_err());
        assert_eq!(handle.status(), TaskState::Succeeded);

        let next = pool.submit(JOB.task(2)).unwrap();
        assert_eq!(
            outcome(&next, "a task after the panicking Clone"),
            Outcome::Succeeded(2)
        );
        assert_workers_alive(&pool, 1, "after an output's Clone panicked");
        shut_down(&pool);
        assert_all_finished(&[&handle, &next]);
    });
}

/// An output's `Clone` calls back into the pool (`stats()` and `submit`) when `wait` hands it
/// out. Two threads wait at once while the pool runs other tasks. Neither may deadlock.
#[test]
fn an_output_whose_clone_calls_back_into_the_pool_does_not_deadlock() {
    const CLONE_REENTERS: TaskType<Callback, ReentersOnClone> = TaskType::new("clone_reenters");
    watchdog(
        "deadlock: an output's Clone called back into the pool in wait()",
        || {
            let pool = TestPool::new(
                builder(2).register(CLONE_REENTERS, |_, callback: &Callback| {
                    Ok::<_, HandlerError>(ReentersOnClone(callback.clone()))
                }),
            );
            let (callback, reports) = Callback::new(&pool);
            let handle = pool.submit(CLONE_REENTERS.task(callback)).unwrap();
            let jobs: Vec<_> = (0..20).map(|n| pool.submit(JOB.task(n)).unwrap()).collect();
            let other = handle.clone();
            let waiter = thread::spawn(move || other.wait().is_succeeded());
            assert!(outcome(&handle, "the task whose output calls back").is_succeeded());
            assert!(
                waiter.join().expect("the other waiter"),
                "the other wait did not succeed"
            );
            for _ in 0..2 {
                let seen = recv(&reports, "deadlock: an output's Clone never returned");
                assert_eq!((seen.workers, seen.submitted), (2, Ok(())));
            }

            for (n, job) in (0..).zip(&jobs) {
                assert_eq!(outcome(job, "an ordinary task"), Outcome::Succeeded(n));
            }
            assert_workers_alive(
                &pool,
                2,
                "after an output's Clone called back into the pool",
            );
            shut_down(&pool);
            assert_all_finished(&[&handle]);
        },
    );
}

/// An output whose `Clone` submits a task that depends on the very task it is the output of:
/// the submit looks at that task's state while `wait` is handing the output out. Neither the
/// wait nor the submit may deadlock, and the dependent runs.
#[test]
fn an_output_whose_clone_submits_a_dependent_of_its_own_task_does_not_deadlock() {
    /// The handle of the task whose output this is, given to its `Clone`.
    type Own = Arc<std::sync::Mutex<Option<TaskHandle<SubmitsDependent>>>>;
    #[derive(Debug)]
    struct SubmitsDependent {
        own: Own,
        pool: Weak<Pool>,
        submitted: Sender<TaskHandle<u32>>,
    }
    impl Clone for SubmitsDependent {
        fn clone(&self) -> Self {
            let own = self.own.lock().unwrap().clone();
            if let (Some(pool), Some(own)) = (self.pool.upgrade(), own) {
                // By handle: with retention 0 the task's record is gone, and the submit asks
                // the handle's completion, which `wait` holds while it clones.
                let dependent = pool.submit(JOB.task(FROM_USER_CODE).after([&own]));
                let _ = self
                    .submitted
                    .send(dependent.expect("the dependent is accepted"));
            }
            SubmitsDependent {
                own: Arc::clone(&self.own),
                pool: self.pool.clone(),
                submitted: self.submitted.clone(),
            }
        }
    }
    const SELF_DEPENDENT: TaskType<(), SubmitsDependent> = TaskType::new("self_dependent");
    watchdog(
        "deadlock: an output's Clone submitted a dependent of its own task in wait()",
        || {
            let (submitted_tx, submitted) = crossbeam_channel::unbounded();
            let own: Own = Arc::default();
            let pool_slot: Arc<std::sync::Mutex<Weak<Pool>>> = Arc::default();
            let (own_for_handler, pool_for_handler) = (Arc::clone(&own), Arc::clone(&pool_slot));
            let gate = Arc::new(std::sync::Barrier::new(2));
            let handler_gate = Arc::clone(&gate);
            let pool = TestPool::new(builder(2).retention(0, None).register(
                SELF_DEPENDENT,
                move |_, _: &()| {
                    // Starts once the test has stored the handle.
                    handler_gate.wait();
                    Ok::<_, HandlerError>(SubmitsDependent {
                        own: Arc::clone(&own_for_handler),
                        pool: pool_for_handler.lock().unwrap().clone(),
                        submitted: submitted_tx.clone(),
                    })
                },
            ));
            *pool_slot.lock().unwrap() = pool.weak();
            let handle = pool.submit(SELF_DEPENDENT.task(())).unwrap();
            *own.lock().unwrap() = Some(handle.clone());
            gate.wait();
            assert!(outcome(&handle, "the task whose output submits").is_succeeded());
            let dependent = recv(&submitted, "the Clone's submit never returned");
            assert_eq!(
                outcome(&dependent, "the dependent submitted from Clone"),
                Outcome::Succeeded(FROM_USER_CODE)
            );
            *own.lock().unwrap() = None;
            assert_workers_alive(&pool, 2, "after an output's Clone submitted a dependent");
            shut_down(&pool);
        },
    );
}

// ===== many user values dropped by one transition =====

/// A cancel that cascades drops every cancelled task's payload in one transition (more than the
/// two that need no allocation): each payload's panicking `Drop` is contained on its own, and the
/// caller of `cancel` sees none of them.
#[test]
fn a_cascading_cancel_drops_many_panicking_payloads_quietly() {
    watchdog(
        "deadlock: a cancel cascading over payloads whose Drop panics",
        || {
            let pool = TestPool::new(builder(1).register(FRAGILE, fragile_handler));
            let root = pool
                .submit(
                    FRAGILE
                        .task(Fragile::new(false))
                        .delay(Duration::from_secs(3600)),
                )
                .unwrap();
            let dependents: Vec<_> = (0..4)
                .map(|_| {
                    pool.submit(FRAGILE.task(Fragile::new(false)).after([&root]))
                        .unwrap()
                })
                .collect();
            let cancelled =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.cancel(root.id())));
            assert!(
                matches!(cancelled, Ok(Ok(tasq::CancelOutcome::Cancelled))),
                "cancel panicked or failed in its caller"
            );
            for handle in dependents.iter().chain([&root]) {
                assert!(outcome(handle, "a cancelled fragile task").is_cancelled());
            }
            assert_workers_alive(&pool, 1, "after the cascade");
            assert_eq!(pool.stats().totals.worker_panics, 0);
        },
    );
}

/// Retention by age drops many finished records in one transition; their outputs, whose handles
/// are gone, panic when dropped: each is contained on its own, on the worker, which neither dies
/// nor fails the task whose ending pushed them out.
#[test]
fn retention_dropping_many_panicking_outputs_at_once_costs_nothing() {
    watchdog(
        "deadlock: retention dropping outputs whose Drop panics",
        || {
            let clock = ManualClock::new();
            let pool = TestPool::new(
                builder(1)
                    .manual_clock(clock.clone())
                    .retention(100, Some(Duration::from_secs(1)))
                    .register(DOOMED_OUTPUT, |_, _: &()| {
                        Ok::<_, HandlerError>(PanicsOnDrop("an output"))
                    }),
            );
            for _ in 0..4 {
                // Dropped at once: the record's completion holds the last reference to the
                // output (reading it would clone it, and the clone would panic here).
                drop(pool.submit(DOOMED_OUTPUT.task(())).unwrap());
            }
            pool.wait_idle();
            assert_eq!(pool.stats().retained, 4);
            assert_retention_dropped_quietly(&pool, &clock);
        },
    );
}

/// With no room for dead letters, a failed task's record stays until retention drops it, and it
/// holds the handler's error. Retention by age then drops several failed records in one
/// transition, each error's `Drop` panicking once the handles are gone: each is contained on its
/// own, and the worker neither dies nor fails the task whose ending pushed them out.
#[test]
fn retention_dropping_many_failed_records_whose_errors_panic_on_drop() {
    const DOOMED_ERROR: TaskType<(), ()> = TaskType::new("doomed_error");
    watchdog(
        "deadlock: retention dropping handler errors whose Drop panics",
        || {
            let clock = ManualClock::new();
            let pool = TestPool::new(
                builder(1)
                    .manual_clock(clock.clone())
                    .retention(100, Some(Duration::from_secs(1)))
                    .dead_letter_limit(0)
                    .register(DOOMED_ERROR, |_, _: &()| {
                        Err(HandlerError::permanent(PanicsOnDrop("a handler error")))
                    }),
            );
            for _ in 0..4 {
                // Dropped at once: the record holds the last reference to the error.
                drop(pool.submit(DOOMED_ERROR.task(())).unwrap());
            }
            pool.wait_idle();
            assert_eq!(pool.stats().retained, 4);
            assert!(pool.dead_letters().is_empty(), "the limit is zero");
            assert_retention_dropped_quietly(&pool, &clock);
        },
    );
}

// ===== the handlers' own captures =====

/// A handler's capture whose `Drop` reports that it ran, then panics.
struct ReportsThenPanics(&'static str, Sender<&'static str>);

impl Drop for ReportsThenPanics {
    fn drop(&mut self) {
        let _ = self.1.send(self.0);
        if !thread::panicking() {
            panic!("{EXPECTED}: the Drop of the capture of handler {}", self.0);
        }
    }
}

/// The handlers are user closures, and their captures' `Drop`s are user code. Dropping the pool
/// drops them (the workers were joined: the pool holds the last reference); two that panic
/// must not panic the caller, and the second must still be dropped after the first's panic.
#[test]
fn handlers_whose_captures_panic_on_drop_are_dropped_quietly_with_the_pool() {
    const FIRST: TaskType<(), ()> = TaskType::new("first");
    const SECOND: TaskType<(), ()> = TaskType::new("second");
    watchdog("deadlock: dropping handlers whose captures panic", || {
        let (dropped_tx, dropped) = crossbeam_channel::unbounded();
        let first = ReportsThenPanics("first", dropped_tx.clone());
        let second = ReportsThenPanics("second", dropped_tx);
        let pool = TestPool::new(
            builder(1)
                .register(FIRST, move |_, _: &()| {
                    let _ = &first;
                    Ok::<_, HandlerError>(())
                })
                .register(SECOND, move |_, _: &()| {
                    let _ = &second;
                    Ok::<_, HandlerError>(())
                }),
        );
        let ran = [
            pool.submit(FIRST.task(())).unwrap(),
            pool.submit(SECOND.task(())).unwrap(),
        ];
        for handle in &ran {
            assert_eq!(outcome(handle, "a handler's task"), Outcome::Succeeded(()));
        }
        shut_down(&pool);

        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(move || drop(pool))) {
            panic!(
                "dropping a pool whose handlers' captures panic panicked: {}",
                panic_message(&*p)
            );
        }
        let mut names = vec![
            recv(&dropped, "the first capture dropped"),
            recv(
                &dropped,
                "the second capture dropped, after the first's panic",
            ),
        ];
        names.sort_unstable();
        assert_eq!(names, ["first", "second"]);
    });
}
