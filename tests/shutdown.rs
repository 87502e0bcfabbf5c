//! Graceful shutdown: draining before the deadline, cancelling after it, refusing new tasks,
//! calling it twice, from two threads or from a handler, and joining every worker thread. On
//! both stores where they agree; the embedded drain, and the durable store's leaving what has
//! not started in the database, each on its own store.

mod support_b;
mod support_store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use crossbeam_channel::Receiver;
use support_b::{
    Latch, assert_threads_gone, assert_threads_named, finished, recv, retryable, wait,
    wait_until_closed,
};
use support_store::{Store, TestBuilder, TestPool};
use tasq::{
    CancelReason, ManualClock, Outcome, Pool, RetryPolicy, ShutdownReport, SubmitErrorKind, TaskId,
    TaskState, TaskType,
};

/// Holds a worker until the fixture's latch opens.
const GATE: TaskType<(), ()> = TaskType::new("gate");
/// Counts its runs and returns its payload.
const JOB: TaskType<u32, u32> = TaskType::new("job");
/// Fails its first attempt, succeeds on the second.
const FLAKY: TaskType<u32, u32> = TaskType::new("flaky");
/// Blocks in `ctx.token().wait()`, reports that the token fired, then returns Ok.
const STUCK: TaskType<(), ()> = TaskType::new("stuck");

struct Fixture {
    /// Shared, so that a shutdown can run on a thread of its own (see [`shutdown_while`]).
    pool: Arc<TestPool>,
    clock: ManualClock,
    gate: Latch,
    /// Ids of GATE and STUCK handlers as they start.
    started: Receiver<TaskId>,
    /// Ids of STUCK handlers whose token fired.
    fired: Receiver<TaskId>,
    /// JOB and FLAKY runs (attempts).
    runs: Arc<AtomicUsize>,
}

impl Fixture {
    /// `workers` threads named `{name}-{i}`, on a manual clock, retries 1 s apart at most.
    fn new(builder: TestBuilder, workers: usize, name: &str) -> Self {
        let clock = ManualClock::new();
        let gate = Latch::new();
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (fired_tx, fired) = crossbeam_channel::unbounded();
        let runs = Arc::new(AtomicUsize::new(0));
        let pool = builder
            .workers(workers)
            .thread_name(name.to_owned())
            .manual_clock(clock.clone())
            .seed(11)
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
                let runs = Arc::clone(&runs);
                move |_, n: &u32| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(*n)
                }
            })
            .register(FLAKY, {
                let runs = Arc::clone(&runs);
                move |ctx, n: &u32| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if ctx.attempt() == 1 {
                        Err(retryable("first attempt fails"))
                    } else {
                        Ok(*n)
                    }
                }
            })
            .register(STUCK, move |ctx, _: &()| {
                started_tx.send(ctx.id()).unwrap();
                ctx.token().wait();
                fired_tx.send(ctx.id()).unwrap();
                Ok(())
            })
            .build();
        Fixture {
            pool: Arc::new(pool),
            clock,
            gate,
            started,
            fired,
            runs,
        }
    }

    fn hold_worker(&self) -> tasq::TaskHandle<()> {
        let gate = self.pool.submit(GATE.task(())).unwrap();
        assert_eq!(recv(&self.started, "the gate task to start"), gate.id());
        gate
    }

    fn job(&self, n: u32) -> tasq::TaskHandle<u32> {
        self.pool.submit(JOB.task(n)).unwrap()
    }

    fn delayed_job(&self, n: u32, secs: u64) -> tasq::TaskHandle<u32> {
        self.pool
            .submit(JOB.task(n).delay(Duration::from_secs(secs)))
            .unwrap()
    }
}

/// A builder for the embedded store, for the tests that check its drain.
fn embedded() -> TestBuilder {
    TestBuilder::new(Store::Memory).expect("the embedded store always runs")
}

/// How a task ends whose handler returned `Ok` after the shutdown fired its token: the embedded
/// store cancels it; the durable store cancels nothing in the database, so the handler's
/// result stands.
fn interrupted(store: Store) -> Outcome<()> {
    match store {
        Store::Memory => Outcome::Cancelled(CancelReason::Shutdown),
        Store::Postgres => Outcome::Succeeded(()),
    }
}

/// Runs `pool.shutdown(timeout)` on another thread, waits until it has closed the pool, calls
/// `meanwhile`, and returns the report. A shutdown that does not return fails the test (its
/// thread is left behind) instead of hanging it.
fn shutdown_while(
    pool: &Arc<TestPool>,
    timeout: Duration,
    meanwhile: impl FnOnce(),
) -> ShutdownReport {
    let (report_tx, report) = crossbeam_channel::bounded(1);
    let stopping = Arc::clone(pool);
    thread::spawn(move || {
        let _ = report_tx.send(stopping.shutdown(timeout));
    });
    wait_until_closed(pool);
    meanwhile();
    recv(&report, "the shutdown to return")
}

// ===== the embedded store drains; the durable one leaves what has not started =====

// Embedded only: a durable pool's shutdown drains nothing that has not started.
#[test]
fn shutdown_before_its_deadline_drains_every_kind_of_waiting_task() {
    let f = Fixture::new(embedded(), 1, "sd-drain");
    // One worker runs tasks first-in first-out: once the marker ran, the flaky task's first
    // attempt has failed and its retry waits on the manual clock.
    let flaky = f.pool.submit(FLAKY.task(100)).unwrap();
    let marker = f.job(101);
    assert_eq!(wait(&marker), Outcome::Succeeded(101));
    assert_eq!(flaky.status(), TaskState::Scheduled);

    let gate = f.hold_worker();
    let ready: Vec<_> = (0..5).map(|n| f.job(n)).collect();
    let delayed: Vec<_> = (10..13).map(|n| f.delayed_job(n, 10)).collect();
    let blocked = [
        f.pool
            .submit(JOB.task(20).after([delayed[0].id()]))
            .unwrap(),
        f.pool
            .submit(JOB.task(21).after([ready[0].id(), flaky.id()]))
            .unwrap(),
    ];
    let stats = f.pool.stats();
    assert_eq!(
        (stats.ready, stats.scheduled, stats.blocked, stats.running),
        (5, 4, 2, 1)
    );

    let report = shutdown_while(&f.pool, Duration::from_secs(3600), || {
        // Nothing can finish while the gate holds the only worker.
        assert_eq!(f.runs.load(Ordering::SeqCst), 2);
        f.gate.open();
        // Everything delayed (the retry too) comes due; the deadline is far off.
        f.clock.advance(Duration::from_secs(10));
    });

    assert!(!report.deadline_reached);
    assert_eq!(
        (report.succeeded, report.failed, report.cancelled),
        (13, 0, 0)
    );
    assert_eq!(finished(&gate), Outcome::Succeeded(()));
    assert_eq!(finished(&flaky), Outcome::Succeeded(100));
    assert_eq!(f.pool.info(flaky.id()).unwrap().attempts, 2);
    for (handle, n) in ready.iter().zip(0..) {
        assert_eq!(finished(handle), Outcome::Succeeded(n));
    }
    for (handle, n) in delayed.iter().zip(10..) {
        assert_eq!(finished(handle), Outcome::Succeeded(n));
    }
    assert_eq!(finished(&blocked[0]), Outcome::Succeeded(20));
    assert_eq!(finished(&blocked[1]), Outcome::Succeeded(21));
    assert_eq!(f.runs.load(Ordering::SeqCst), 13);
    assert_eq!(f.pool.stats().workers, 0);
}

// Embedded only: a durable pool's shutdown does not wait for due times.
#[test]
fn shutdown_waits_for_delayed_tasks_and_retries_to_come_due() {
    let f = Fixture::new(embedded(), 1, "sd-due");
    let flaky = f.pool.submit(FLAKY.task(1)).unwrap();
    let marker = f.job(2);
    assert_eq!(wait(&marker), Outcome::Succeeded(2));
    assert_eq!(flaky.status(), TaskState::Scheduled);
    let delayed = f.delayed_job(3, 10);

    // Nothing is ready or running when the shutdown begins: only due times keep it waiting.
    let report = shutdown_while(&f.pool, Duration::from_secs(3600), || {
        assert_eq!(flaky.status(), TaskState::Scheduled);
        assert_eq!(delayed.status(), TaskState::Scheduled);
        f.clock.advance(Duration::from_secs(10));
    });

    assert!(!report.deadline_reached);
    assert_eq!(finished(&flaky), Outcome::Succeeded(1));
    assert_eq!(finished(&delayed), Outcome::Succeeded(3));
    assert_eq!((report.succeeded, report.cancelled), (3, 0));
}

// Embedded only: a durable pool's shutdown cancels nothing that has not started.
#[test]
fn shutdown_after_its_deadline_cancels_what_is_left_and_fires_running_tokens() {
    let f = Fixture::new(embedded(), 1, "sd-late");
    let stuck = f.pool.submit(STUCK.task(())).unwrap();
    assert_eq!(recv(&f.started, "the stuck handler to start"), stuck.id());
    let ready: Vec<_> = (0..3).map(|n| f.job(n)).collect();
    let delayed: Vec<_> = (10..12).map(|n| f.delayed_job(n, 60)).collect();
    let blocked = [
        f.pool
            .submit(JOB.task(20).after([delayed[0].id()]))
            .unwrap(),
        // Its parent is the running task.
        f.pool.submit(JOB.task(21).after([stuck.id()])).unwrap(),
    ];

    let report = shutdown_while(&f.pool, Duration::from_secs(10), || {
        assert!(f.fired.is_empty(), "the token fired before the deadline");
        // The deadline passes; the delayed tasks are still not due.
        f.clock.advance(Duration::from_secs(10));
        assert_eq!(recv(&f.fired, "the running token to fire"), stuck.id());
    });

    assert!(report.deadline_reached);
    assert_eq!(
        (report.succeeded, report.failed, report.cancelled),
        (0, 0, 8)
    );
    assert_eq!(
        finished(&stuck),
        Outcome::Cancelled(CancelReason::Shutdown),
        "its handler returned Ok"
    );
    for handle in ready.iter().chain(&delayed).chain(&blocked) {
        assert_eq!(
            finished(handle),
            Outcome::Cancelled(CancelReason::Shutdown),
            "{:?}",
            handle.id()
        );
    }
    assert_eq!(f.runs.load(Ordering::SeqCst), 0);
    assert_eq!(f.pool.stats().workers, 0);
}

// Embedded only: a durable pool's shutdown cancels nothing that has not started.
#[test]
fn a_short_real_deadline_fires_the_tokens_of_running_handlers() {
    let fired = Arc::new(AtomicUsize::new(0));
    let (started_tx, started) = crossbeam_channel::unbounded();
    let pool = Pool::builder()
        .workers(2)
        .register(STUCK, {
            let fired = Arc::clone(&fired);
            move |ctx, _: &()| {
                started_tx.send(()).unwrap();
                ctx.token().wait();
                fired.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .register(JOB, |_, n: &u32| Ok(*n))
        .build()
        .unwrap();
    let stuck: Vec<_> = (0..2)
        .map(|_| pool.submit(STUCK.task(())).unwrap())
        .collect();
    for _ in &stuck {
        recv(&started, "both stuck handlers to start");
    }
    let queued = pool.submit(JOB.task(1)).unwrap();
    let delayed = pool
        .submit(JOB.task(2).delay(Duration::from_secs(3600)))
        .unwrap();

    let report = pool.shutdown(Duration::from_millis(50));

    assert!(report.deadline_reached);
    assert!(report.elapsed >= Duration::from_millis(50), "{report:?}");
    assert_eq!(fired.load(Ordering::SeqCst), 2);
    for handle in &stuck {
        assert_eq!(finished(handle), Outcome::Cancelled(CancelReason::Shutdown));
    }
    assert_eq!(
        finished(&queued),
        Outcome::Cancelled(CancelReason::Shutdown)
    );
    assert_eq!(
        finished(&delayed),
        Outcome::Cancelled(CancelReason::Shutdown)
    );
    assert_eq!((report.succeeded, report.cancelled), (0, 4));
}

// Embedded only: the queued task drains (a durable pool leaves it in the database).
#[test]
fn submit_during_and_after_shutdown_fails_and_hands_the_task_back() {
    let f = Fixture::new(embedded(), 1, "sd-submit");
    let gate = f.hold_worker();
    let queued = f.job(1);

    let report = shutdown_while(&f.pool, Duration::from_secs(3600), || {
        let refused = f.pool.submit(JOB.task(2).priority(9)).unwrap_err();
        assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
        assert_eq!(refused.into_task().into_payload(), 2);
        let refused = f
            .pool
            .submit(JOB.task(3).delay(Duration::from_secs(1)).key("k"))
            .unwrap_err();
        assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
        assert_eq!(*refused.into_task().payload(), 3);
        f.gate.open();
    });

    let refused = f.pool.submit(JOB.task(4)).unwrap_err();
    assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
    assert_eq!(refused.into_task().into_payload(), 4);
    assert!(finished(&gate).is_succeeded());
    assert_eq!(finished(&queued), Outcome::Succeeded(1));
    assert_eq!(report.succeeded, 2);
    assert_eq!(f.pool.stats().totals.submitted, 2);
}

// Embedded only: the delayed task drains (a durable pool leaves it in the database).
#[test]
fn shutdown_with_a_timeout_too_long_to_represent_waits_for_the_drain() {
    let f = Fixture::new(embedded(), 1, "sd-forever");
    let gate = f.hold_worker();
    let delayed = f.delayed_job(1, 3600);
    let report = shutdown_while(&f.pool, Duration::MAX, || {
        f.gate.open();
        f.clock.advance(Duration::from_secs(3600));
    });
    assert!(!report.deadline_reached);
    assert!(finished(&gate).is_succeeded());
    assert_eq!(finished(&delayed), Outcome::Succeeded(1));
    assert_eq!(report.succeeded, 2);
}

// Embedded only: a durable pool leaves the queued tasks in the database (see the durable
// variant).
#[test]
fn every_wait_returns_after_a_shutdown_past_its_deadline() {
    let f = Fixture::new(embedded(), 2, "sd-waits");
    let stuck: Vec<_> = (0..2)
        .map(|_| f.pool.submit(STUCK.task(())).unwrap())
        .collect();
    for _ in 0..2 {
        recv(&f.started, "both stuck handlers to start");
    }
    let queued: Vec<_> = (0..4).map(|n| f.job(n)).collect();
    let outcomes = Mutex::new(Vec::new());
    // Threads waiting (most likely already blocked in wait()) when the shutdown begins.
    let ready = Barrier::new(queued.len() + 1);
    thread::scope(|s| {
        for handle in &queued {
            let (outcomes, ready) = (&outcomes, &ready);
            s.spawn(move || {
                ready.wait();
                outcomes.lock().unwrap().push(handle.wait());
            });
        }
        ready.wait();
        let report = shutdown_while(&f.pool, Duration::from_secs(1), || {
            f.clock.advance(Duration::from_secs(1));
        });
        assert!(report.deadline_reached);
        assert_eq!(report.cancelled, 6);
    });
    let outcomes = outcomes.into_inner().unwrap();
    assert_eq!(outcomes.len(), 4);
    assert!(
        outcomes
            .iter()
            .all(|o| *o == Outcome::Cancelled(CancelReason::Shutdown))
    );
    for handle in &stuck {
        assert_eq!(finished(handle), Outcome::Cancelled(CancelReason::Shutdown));
    }
    assert_eq!(f.runs.load(Ordering::SeqCst), 0);
}

// ===== shutting down from inside a handler =====

/// Calls `shutdown` on its own pool, after meeting the others on the [`Meeting`] it names, if
/// any.
const SELF_STOP: TaskType<Option<u64>, ()> = TaskType::new("self_stop");

fn meetings() -> &'static Mutex<HashMap<u64, Arc<Barrier>>> {
    static MEETINGS: OnceLock<Mutex<HashMap<u64, Arc<Barrier>>>> = OnceLock::new();
    MEETINGS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A barrier that a payload names by number (payloads are serde values, so that they can go
/// through the durable store).
struct Meeting {
    number: u64,
    barrier: Arc<Barrier>,
}

impl Meeting {
    /// A meeting of `n` threads.
    fn new(n: usize) -> Meeting {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let barrier = Arc::new(Barrier::new(n));
        meetings()
            .lock()
            .unwrap()
            .insert(number, Arc::clone(&barrier));
        Meeting { number, barrier }
    }

    fn number(&self) -> u64 {
        self.number
    }

    /// Blocks until all `n` have come.
    fn wait(&self) {
        self.barrier.wait();
    }
}

impl Drop for Meeting {
    fn drop(&mut self) {
        meetings().lock().unwrap().remove(&self.number);
    }
}

/// Waits at meeting `number` (from a handler); nothing if the test dropped it.
fn meet(number: u64) {
    let barrier = meetings().lock().unwrap().get(&number).cloned();
    if let Some(barrier) = barrier {
        barrier.wait();
    }
}

/// A pool whose SELF_STOP handlers shut it down from inside, on a manual clock: the calls'
/// one-hour deadline passes only if the test advances the clock.
struct SelfStopping {
    pool: Arc<TestPool>,
    clock: ManualClock,
    /// Each handler's shutdown report, and whether its own token had fired by then.
    reports: Receiver<(ShutdownReport, bool)>,
}

impl SelfStopping {
    fn new(builder: TestBuilder, workers: usize) -> Self {
        let clock = ManualClock::new();
        // The handlers reach their pool through a weak reference, so the pool's registry does
        // not keep the pool alive.
        let this: Arc<OnceLock<Weak<TestPool>>> = Arc::new(OnceLock::new());
        let (report_tx, reports) = crossbeam_channel::unbounded();
        let pool = Arc::new(
            builder
                .workers(workers)
                .manual_clock(clock.clone())
                .register(JOB, |_, n: &u32| Ok(*n))
                .register(SELF_STOP, {
                    let this = Arc::clone(&this);
                    move |ctx, meeting: &Option<u64>| {
                        let pool = this.get().and_then(Weak::upgrade).expect("pool alive");
                        if let Some(number) = *meeting {
                            meet(number);
                        }
                        let report = pool.shutdown(Duration::from_secs(3600));
                        report_tx.send((report, ctx.is_cancelled())).unwrap();
                        Ok(())
                    }
                })
                .build(),
        );
        this.set(Arc::downgrade(&pool)).unwrap();
        SelfStopping {
            pool,
            clock,
            reports,
        }
    }

    /// The next handler's report. If none comes within 10 s, passes the calls' deadline (so no
    /// thread stays stuck) and fails.
    #[track_caller]
    fn report(&self) -> (ShutdownReport, bool) {
        match self.reports.recv_timeout(Duration::from_secs(10)) {
            Ok(report) => report,
            Err(_) => {
                self.clock.advance(Duration::from_secs(3600));
                panic!("shutdown called from a handler still blocked after 10 s");
            }
        }
    }
}

// Embedded only: the other tasks drain (a durable pool leaves those not started in the
// database).
#[test]
fn shutdown_from_inside_a_handler_does_not_deadlock() {
    let f = SelfStopping::new(embedded(), 2);
    let others: Vec<_> = (0..3)
        .map(|n| f.pool.submit(JOB.task(n)).unwrap())
        .collect();
    let stopper = f.pool.submit(SELF_STOP.task(None)).unwrap();

    let (report, token_fired) = f.report();
    assert!(!report.deadline_reached, "{report:?}");
    assert_eq!((report.succeeded, report.cancelled), (3, 0), "{report:?}");
    // The other worker publishes an outcome just after it releases the lock, which may be after
    // the drain saw the task end: wait rather than peek.
    for (handle, n) in others.iter().zip(0..) {
        assert_eq!(wait(handle), Outcome::Succeeded(n));
    }
    // The caller's own task cannot be drained: its token fires, and it ends cancelled although
    // its handler returns Ok.
    assert!(token_fired, "the caller's token did not fire");
    assert_eq!(wait(&stopper), Outcome::Cancelled(CancelReason::Shutdown));
    assert!(
        f.pool
            .submit(JOB.task(0))
            .is_err_and(|e| *e.kind() == SubmitErrorKind::ShutDown)
    );
}

// Embedded only: the dependent is cancelled (a durable pool leaves it in the database).
#[test]
fn shutdown_from_a_handler_whose_task_has_dependents_does_not_deadlock() {
    let f = SelfStopping::new(embedded(), 2);
    let submitted = Meeting::new(2);
    let stopper = f
        .pool
        .submit(SELF_STOP.task(Some(submitted.number())))
        .unwrap();
    // It can only run if the stopper succeeds, which it cannot while it waits in shutdown.
    let dependent = f.pool.submit(JOB.task(1).after([stopper.id()])).unwrap();
    submitted.wait();

    let (report, _) = f.report();
    assert!(!report.deadline_reached, "{report:?}");
    assert_eq!(wait(&stopper), Outcome::Cancelled(CancelReason::Shutdown));
    let outcome = wait(&dependent);
    assert!(
        matches!(
            outcome,
            Outcome::Cancelled(CancelReason::Shutdown | CancelReason::DependencyCancelled(_))
        ),
        "{outcome:?}"
    );
}

// ===== the same on both stores =====

conformance! {
    fn shutdown_called_twice_returns_both_times(builder) {
        let f = Fixture::new(builder, 2, "sd-twice");
        // Running when the first call begins: both stores let it finish.
        let gate = f.hold_worker();
        let first = shutdown_while(&f.pool, Duration::from_secs(10), || f.gate.open());
        assert_eq!(finished(&gate), Outcome::Succeeded(()));
        let second = f.pool.shutdown(Duration::from_secs(10));
        assert_eq!((first.succeeded, second.succeeded), (1, 1));
        assert!(!first.deadline_reached);
        assert!(!second.deadline_reached);
        assert_eq!(f.pool.stats().workers, 0);
    }

    fn shutdown_called_from_two_threads_at_once_returns_in_both(builder) {
        let f = Fixture::new(builder, 2, "sd-both");
        let gate = f.hold_worker();
        let queued = f.job(1);
        // The other worker runs it at once; done before the shutdown begins, as a durable pool
        // does not drain what it has not started.
        assert_eq!(wait(&queued), Outcome::Succeeded(1));
        let (report_tx, reports) = crossbeam_channel::unbounded();
        let barrier = Arc::new(Barrier::new(3));
        for _ in 0..2 {
            // Threads of their own, not scoped: a shutdown that hangs fails the test below.
            let report_tx = report_tx.clone();
            let (pool, barrier) = (Arc::clone(&f.pool), Arc::clone(&barrier));
            thread::spawn(move || {
                barrier.wait();
                let _ = report_tx.send(pool.shutdown(Duration::from_secs(3600)));
            });
        }
        barrier.wait();
        wait_until_closed(&f.pool);
        // The gate still holds a worker and there is no deadline in sight: neither may return.
        assert!(reports.is_empty(), "a shutdown returned while a task ran");
        f.gate.open();
        for _ in 0..2 {
            let report = recv(&reports, "both shutdown calls to return");
            assert!(!report.deadline_reached);
            assert_eq!((report.succeeded, report.cancelled), (2, 0));
        }
        assert!(finished(&gate).is_succeeded());
        assert_eq!(finished(&queued), Outcome::Succeeded(1));
        assert_eq!(f.pool.stats().workers, 0);
    }

    fn shutdown_joins_every_worker_thread(builder) {
        const WORKERS: usize = 3;
        // Both stores' variants run at once in this process: each names its threads apart.
        let prefix = match builder.store() {
            Store::Memory => "sd-join-m",
            Store::Postgres => "sd-join-p",
        };
        let pool = builder
            .workers(WORKERS)
            .thread_name(prefix.to_owned())
            .register(GATE, {
                // Every handler waits for all the others: once they have all run, every worker
                // thread has started and named itself.
                let barrier = Arc::new(Barrier::new(WORKERS));
                move |_, _: &()| {
                    barrier.wait();
                    Ok(())
                }
            })
            .build();
        let handles: Vec<_> = (0..WORKERS)
            .map(|_| pool.submit(GATE.task(())).unwrap())
            .collect();
        for handle in &handles {
            assert!(wait(handle).is_succeeded());
        }
        if cfg!(target_os = "linux") {
            assert_threads_named(prefix, WORKERS);
        }

        let report = pool.shutdown(Duration::from_secs(10));
        assert_eq!(report.succeeded, WORKERS as u64);
        assert_eq!(pool.stats().workers, 0);
        if cfg!(target_os = "linux") {
            assert_threads_gone(prefix);
        }
    }

    fn shutdown_from_two_handlers_at_once_does_not_deadlock(builder) {
        let store = builder.store();
        let f = SelfStopping::new(builder, 2);
        // Both handlers are running before either calls shutdown.
        let meet = Meeting::new(2);
        let stoppers: Vec<_> = (0..2)
            .map(|_| f.pool.submit(SELF_STOP.task(Some(meet.number()))).unwrap())
            .collect();

        let (first, _) = f.report();
        let (second, _) = f.report();
        assert!(!first.deadline_reached && !second.deadline_reached);
        for stopper in &stoppers {
            assert_eq!(wait(stopper), interrupted(store));
        }
    }
}

// ===== the durable store: what has not started stays in the database =====

#[cfg(feature = "postgres")]
mod durable {
    use super::*;

    /// A builder on a schema of its own, or `None` without PostgreSQL (the support code said
    /// so).
    fn durable() -> Option<TestBuilder> {
        TestBuilder::new(Store::Postgres)
    }

    /// The connection string of the schema `builder` builds its pool on, for a second pool on
    /// the same rows.
    fn schema_url(builder: &TestBuilder) -> String {
        match builder {
            TestBuilder::Postgres(_, db) => db.url.clone(),
            TestBuilder::Memory(_) => unreachable!("a durable builder"),
        }
    }

    /// Runs `pool.shutdown(timeout)` on another thread as [`shutdown_while`] does, but calls
    /// `meanwhile` only once that thread sleeps (on Linux; elsewhere once the pool is closed):
    /// the shutdown then waits for its running handlers, and only what `meanwhile` does may
    /// wake it.
    fn shutdown_once_waiting(
        pool: &Arc<TestPool>,
        timeout: Duration,
        meanwhile: impl FnOnce(),
    ) -> ShutdownReport {
        let (report_tx, report) = crossbeam_channel::bounded(1);
        let (task_tx, task) = crossbeam_channel::bounded(1);
        let stopping = Arc::clone(pool);
        thread::spawn(move || {
            // "<pid>/task/<tid>", relative to /proc.
            let _ = task_tx.send(std::fs::read_link("/proc/thread-self").ok());
            let _ = report_tx.send(stopping.shutdown(timeout));
        });
        let task = recv(&task, "the shutdown's thread to start");
        wait_until_closed(pool);
        if let Some(task) = task {
            wait_until_asleep(&std::path::Path::new("/proc").join(task).join("stat"));
        }
        meanwhile();
        recv(&report, "the shutdown to return")
    }

    /// Polls a thread's `/proc/.../stat` until its state is `S` (asleep, here in a wait).
    fn wait_until_asleep(stat: &std::path::Path) {
        let give_up = std::time::Instant::now() + support_b::WAIT;
        loop {
            let text = std::fs::read_to_string(stat).expect("read the thread's state");
            // The state follows the thread's name, which is in parentheses and may hold spaces.
            let state = text
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if state == Some('S') {
                return;
            }
            assert!(
                std::time::Instant::now() < give_up,
                "the shutdown never waited: {text}"
            );
            thread::yield_now();
        }
    }

    /// How many rows have each status, and how many of them still hold a lease (a finished
    /// row keeps its lease id, but not its expiry).
    fn rows_by_status(pool: &TestPool) -> Vec<(String, i64, i64)> {
        let mut sql = pool.sql().expect("a durable pool has rows");
        sql.query(
            "SELECT status, count(*), count(lease_until) FROM tasq_tasks
             GROUP BY status ORDER BY status",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
    }

    fn counts(expected: &[(&str, i64)]) -> Vec<(String, i64, i64)> {
        expected
            .iter()
            .map(|&(status, n)| (status.to_owned(), n, 0))
            .collect()
    }

    /// Ready, delayed, retrying and blocked tasks are neither run nor cancelled: they stay in
    /// the database as they were, without leases, and a second pool on the same schema runs
    /// every one of them.
    #[test]
    fn shutdown_before_its_deadline_leaves_every_kind_of_waiting_task_for_another_pool() {
        let Some(builder) = durable() else { return };
        let url = schema_url(&builder);
        let f = Fixture::new(builder, 1, "sd-leave");
        // One worker runs tasks first-in first-out: once the marker ran, the flaky task's first
        // attempt has failed and its retry waits on the manual clock.
        let flaky = f.pool.submit(FLAKY.task(100)).unwrap();
        let marker = f.job(101);
        assert_eq!(wait(&marker), Outcome::Succeeded(101));
        assert_eq!(flaky.status(), TaskState::Scheduled);

        let gate = f.hold_worker();
        let ready: Vec<_> = (0..5).map(|n| f.job(n)).collect();
        let delayed: Vec<_> = (10..13).map(|n| f.delayed_job(n, 10)).collect();
        let blocked = [
            f.pool
                .submit(JOB.task(20).after([delayed[0].id()]))
                .unwrap(),
            f.pool
                .submit(JOB.task(21).after([ready[0].id(), flaky.id()]))
                .unwrap(),
        ];
        let stats = f.pool.stats();
        assert_eq!(
            (stats.ready, stats.scheduled, stats.blocked, stats.running),
            (5, 4, 2, 1)
        );

        let report = shutdown_while(&f.pool, Duration::from_secs(3600), || {
            assert_eq!(f.runs.load(Ordering::SeqCst), 2);
            f.gate.open();
        });

        assert!(!report.deadline_reached);
        assert_eq!(
            (report.succeeded, report.failed, report.cancelled),
            (2, 0, 0),
            "only the marker and the gate ended"
        );
        assert_eq!(finished(&gate), Outcome::Succeeded(()));
        assert_eq!(f.runs.load(Ordering::SeqCst), 2);
        assert_eq!(f.pool.stats().workers, 0);
        for handle in &ready {
            assert_eq!(f.pool.status(handle.id()), Some(TaskState::Ready));
        }
        for handle in delayed.iter().chain([&flaky]) {
            assert_eq!(f.pool.status(handle.id()), Some(TaskState::Scheduled));
        }
        for handle in &blocked {
            assert_eq!(f.pool.status(handle.id()), Some(TaskState::Blocked));
        }
        assert_eq!(
            rows_by_status(&f.pool),
            counts(&[("blocked", 2), ("ready", 9), ("succeeded", 2)])
        );

        // Another pool on the same schema (another process, as far as the rows can tell).
        let clock = ManualClock::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let second = Pool::builder()
            .postgres(url)
            .poll_interval(Duration::from_millis(100))
            .workers(2)
            .manual_clock(clock.clone())
            .register(JOB, {
                let runs = Arc::clone(&runs);
                move |_, n: &u32| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(*n)
                }
            })
            .register(FLAKY, {
                let runs = Arc::clone(&runs);
                move |ctx, n: &u32| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if ctx.attempt() == 1 {
                        Err(retryable("first attempt fails"))
                    } else {
                        Ok(*n)
                    }
                }
            })
            .build()
            .unwrap();
        // Its clock started later than the first pool's: the same advance makes it all due.
        clock.advance(Duration::from_secs(10));
        // The first pool's handles outlive its shutdown: they get the outcomes too.
        for (handle, n) in ready.iter().zip(0..) {
            assert_eq!(wait(handle), Outcome::Succeeded(n));
        }
        for (handle, n) in delayed.iter().zip(10..) {
            assert_eq!(wait(handle), Outcome::Succeeded(n));
        }
        assert_eq!(wait(&flaky), Outcome::Succeeded(100));
        assert_eq!(second.info(flaky.id()).unwrap().attempts, 2);
        assert_eq!(wait(&blocked[0]), Outcome::Succeeded(20));
        assert_eq!(wait(&blocked[1]), Outcome::Succeeded(21));
        let again = second
            .handle(JOB, ready[0].id())
            .expect("the second pool knows it");
        assert_eq!(wait(&again), Outcome::Succeeded(0));
        assert_eq!(runs.load(Ordering::SeqCst), 11);
        assert_eq!(second.shutdown(Duration::from_secs(10)).succeeded, 11);
        assert_eq!(f.runs.load(Ordering::SeqCst), 2, "the first pool ran more");
    }

    /// With nothing ready or running, a durable shutdown returns at once: delayed tasks and
    /// retries stay scheduled in the database.
    #[test]
    fn shutdown_does_not_wait_for_delayed_tasks_and_retries_to_come_due() {
        let Some(builder) = durable() else { return };
        let f = Fixture::new(builder, 1, "sd-due-pg");
        let flaky = f.pool.submit(FLAKY.task(1)).unwrap();
        let marker = f.job(2);
        assert_eq!(wait(&marker), Outcome::Succeeded(2));
        assert_eq!(flaky.status(), TaskState::Scheduled);
        let delayed = f.delayed_job(3, 10);

        // The clock stands still: a shutdown that waited for due times would not return.
        let report = shutdown_while(&f.pool, Duration::from_secs(3600), || {});

        assert!(!report.deadline_reached);
        assert_eq!((report.succeeded, report.cancelled), (1, 0));
        assert_eq!(flaky.status(), TaskState::Scheduled);
        assert_eq!(delayed.status(), TaskState::Scheduled);
        f.clock.advance(Duration::from_secs(10));
        assert_eq!(
            flaky.status(),
            TaskState::Ready,
            "due, and left for another pool"
        );
        assert_eq!(delayed.status(), TaskState::Ready);
        assert_eq!(f.runs.load(Ordering::SeqCst), 2);
        assert_eq!(
            rows_by_status(&f.pool),
            counts(&[("ready", 2), ("succeeded", 1)])
        );
    }

    /// Past the deadline, a durable shutdown fires the running tokens and lists the running
    /// tasks as interrupted; it cancels nothing: the ready, delayed and blocked tasks stay in
    /// the database, and the interrupted task ends as its handler said (here `Ok`).
    #[test]
    fn shutdown_after_its_deadline_fires_running_tokens_and_leaves_the_rest_in_the_database() {
        let Some(builder) = durable() else { return };
        let f = Fixture::new(builder, 1, "sd-late-pg");
        let stuck = f.pool.submit(STUCK.task(())).unwrap();
        assert_eq!(recv(&f.started, "the stuck handler to start"), stuck.id());
        let ready: Vec<_> = (0..3).map(|n| f.job(n)).collect();
        let delayed: Vec<_> = (10..12).map(|n| f.delayed_job(n, 60)).collect();
        let blocked = [
            f.pool
                .submit(JOB.task(20).after([delayed[0].id()]))
                .unwrap(),
            // Its parent is the running task.
            f.pool.submit(JOB.task(21).after([stuck.id()])).unwrap(),
        ];

        // Once the shutdown waits for the running handler, only the clock can end its wait.
        let report = shutdown_once_waiting(&f.pool, Duration::from_secs(10), || {
            assert!(f.fired.is_empty(), "the token fired before the deadline");
            // The deadline passes; the delayed tasks are still not due.
            f.clock.advance(Duration::from_secs(10));
            assert_eq!(recv(&f.fired, "the running token to fire"), stuck.id());
        });

        assert!(report.deadline_reached);
        assert_eq!(report.interrupted, vec![(stuck.id(), "stuck")]);
        assert_eq!(
            (report.succeeded, report.failed, report.cancelled),
            (1, 0, 0)
        );
        assert_eq!(wait(&stuck), interrupted(Store::Postgres));
        for handle in &ready {
            assert_eq!(f.pool.status(handle.id()), Some(TaskState::Ready));
        }
        for handle in &delayed {
            assert_eq!(f.pool.status(handle.id()), Some(TaskState::Scheduled));
        }
        assert_eq!(f.pool.status(blocked[0].id()), Some(TaskState::Blocked));
        assert_eq!(
            f.pool.status(blocked[1].id()),
            Some(TaskState::Ready),
            "released by its parent's success"
        );
        assert_eq!(f.runs.load(Ordering::SeqCst), 0);
        assert_eq!(f.pool.stats().workers, 0);
        assert_eq!(
            rows_by_status(&f.pool),
            counts(&[("blocked", 1), ("ready", 6), ("succeeded", 1)])
        );
    }

    /// A real deadline fires the tokens of the running handlers; the queued and delayed tasks
    /// stay in the database.
    #[test]
    fn a_short_real_deadline_fires_the_tokens_of_running_handlers_and_leaves_the_rest() {
        let Some(builder) = durable() else { return };
        let fired = Arc::new(AtomicUsize::new(0));
        let (started_tx, started) = crossbeam_channel::unbounded();
        let pool = builder
            .workers(2)
            .register(STUCK, {
                let fired = Arc::clone(&fired);
                move |ctx, _: &()| {
                    started_tx.send(()).unwrap();
                    ctx.token().wait();
                    fired.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .register(JOB, |_, n: &u32| Ok(*n))
            .build();
        let stuck: Vec<_> = (0..2)
            .map(|_| pool.submit(STUCK.task(())).unwrap())
            .collect();
        for _ in &stuck {
            recv(&started, "both stuck handlers to start");
        }
        let queued = pool.submit(JOB.task(1)).unwrap();
        let delayed = pool
            .submit(JOB.task(2).delay(Duration::from_secs(3600)))
            .unwrap();

        let report = pool.shutdown(Duration::from_millis(50));

        assert!(report.deadline_reached);
        assert!(report.elapsed >= Duration::from_millis(50), "{report:?}");
        assert_eq!(report.interrupted.len(), 2, "{report:?}");
        assert_eq!(fired.load(Ordering::SeqCst), 2);
        for handle in &stuck {
            assert_eq!(wait(handle), interrupted(Store::Postgres));
        }
        assert_eq!(queued.status(), TaskState::Ready);
        assert_eq!(delayed.status(), TaskState::Scheduled);
        assert_eq!((report.succeeded, report.cancelled), (2, 0));
        assert_eq!(
            rows_by_status(&pool),
            counts(&[("ready", 2), ("succeeded", 2)])
        );
    }

    /// Submits are refused from the moment a durable shutdown begins; the queued task is left
    /// in the database.
    #[test]
    fn submit_during_and_after_a_durable_shutdown_fails_and_hands_the_task_back() {
        let Some(builder) = durable() else { return };
        let f = Fixture::new(builder, 1, "sd-submit-pg");
        let gate = f.hold_worker();
        let queued = f.job(1);

        let report = shutdown_while(&f.pool, Duration::from_secs(3600), || {
            let refused = f.pool.submit(JOB.task(2).priority(9)).unwrap_err();
            assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
            assert_eq!(refused.into_task().into_payload(), 2);
            let refused = f
                .pool
                .submit(JOB.task(3).delay(Duration::from_secs(1)).key("k"))
                .unwrap_err();
            assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
            assert_eq!(*refused.into_task().payload(), 3);
            f.gate.open();
        });

        let refused = f.pool.submit(JOB.task(4)).unwrap_err();
        assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
        assert_eq!(refused.into_task().into_payload(), 4);
        assert!(finished(&gate).is_succeeded());
        assert_eq!(queued.status(), TaskState::Ready);
        assert_eq!(report.succeeded, 1);
        assert_eq!(f.pool.stats().totals.submitted, 2);
        assert_eq!(
            rows_by_status(&f.pool),
            counts(&[("ready", 1), ("succeeded", 1)])
        );
    }

    /// Past a durable shutdown's deadline, the waits on the running tasks return; those on the
    /// queued tasks, left in the database, return once another pool runs them.
    #[test]
    fn every_wait_returns_once_another_pool_runs_what_a_durable_shutdown_left() {
        let Some(builder) = durable() else { return };
        let url = schema_url(&builder);
        let f = Fixture::new(builder, 2, "sd-waits-pg");
        let stuck: Vec<_> = (0..2)
            .map(|_| f.pool.submit(STUCK.task(())).unwrap())
            .collect();
        for _ in 0..2 {
            recv(&f.started, "both stuck handlers to start");
        }
        let queued: Vec<_> = (0..4).map(|n| f.job(n)).collect();
        let (outcome_tx, outcomes) = crossbeam_channel::unbounded();
        // Threads waiting (most likely already blocked in wait()) when the shutdown begins; not
        // scoped, so that a wait that never returns fails the test instead of hanging it.
        let lined_up = Arc::new(Barrier::new(queued.len() + 1));
        for handle in &queued {
            let (handle, outcome_tx) = (handle.clone(), outcome_tx.clone());
            let lined_up = Arc::clone(&lined_up);
            thread::spawn(move || {
                lined_up.wait();
                let _ = outcome_tx.send((handle.id(), handle.wait()));
            });
        }
        lined_up.wait();
        // A deadline reached at once (this test is not about the clock).
        let report = shutdown_while(&f.pool, Duration::ZERO, || {});
        assert!(report.deadline_reached);
        assert_eq!(report.interrupted.len(), 2, "{report:?}");
        assert_eq!(report.cancelled, 0);
        for handle in &stuck {
            assert_eq!(wait(handle), interrupted(Store::Postgres));
        }
        assert!(
            outcomes.is_empty(),
            "a wait returned with its task still queued"
        );

        let second = Pool::builder()
            .postgres(url)
            .poll_interval(Duration::from_millis(100))
            .workers(2)
            .register(JOB, |_, n: &u32| Ok::<_, tasq::HandlerError>(n + 100))
            .build()
            .unwrap();
        let mut returned: Vec<_> = (0..queued.len())
            .map(|_| recv(&outcomes, "every wait to return"))
            .collect();
        returned.sort_by_key(|&(id, _)| id.seq());
        let expected: Vec<_> = queued
            .iter()
            .zip(100..)
            .map(|(handle, n)| (handle.id(), Outcome::Succeeded(n)))
            .collect();
        assert_eq!(returned, expected);
        assert_eq!(f.runs.load(Ordering::SeqCst), 0);
        assert_eq!(second.shutdown(Duration::from_secs(10)).succeeded, 4);
    }

    /// No deadline: the shutdown waits for the running handler however long it takes, and
    /// leaves the delayed task, due by then, in the database.
    #[test]
    fn shutdown_with_a_timeout_too_long_to_represent_waits_for_running_handlers() {
        let Some(builder) = durable() else { return };
        let f = Fixture::new(builder, 1, "sd-forever-pg");
        let gate = f.hold_worker();
        let delayed = f.delayed_job(1, 3600);
        let report = shutdown_while(&f.pool, Duration::MAX, || {
            f.clock.advance(Duration::from_secs(3600));
            f.gate.open();
        });
        assert!(!report.deadline_reached);
        assert!(report.interrupted.is_empty(), "{report:?}");
        assert!(finished(&gate).is_succeeded());
        assert_eq!(delayed.status(), TaskState::Ready);
        assert_eq!(report.succeeded, 1);
    }

    /// Called from the pool's only handler, a durable shutdown has nothing to wait for: it
    /// returns at once, its caller's token fired; the tasks submitted meanwhile stay in the
    /// database, and the caller's success releases its dependent there.
    #[test]
    fn shutdown_from_the_only_durable_handler_returns_and_leaves_the_rest_in_the_database() {
        let Some(builder) = durable() else { return };
        let f = SelfStopping::new(builder, 1);
        let submitted = Meeting::new(2);
        let stopper = f
            .pool
            .submit(SELF_STOP.task(Some(submitted.number())))
            .unwrap();
        // Its dependent first: that submit locks the stopper's row, and a claim meanwhile
        // passes it over (`SKIP LOCKED`) for the next ready row, which would then start before
        // the stopper. Oldest first then: the stopper holds the only worker, and the others
        // wait behind it.
        let dependent = f.pool.submit(JOB.task(9).after([stopper.id()])).unwrap();
        let others: Vec<_> = (0..3)
            .map(|n| f.pool.submit(JOB.task(n)).unwrap())
            .collect();
        submitted.wait();

        let (report, token_fired) = f.report();
        assert!(!report.deadline_reached, "{report:?}");
        assert_eq!((report.succeeded, report.cancelled), (0, 0), "{report:?}");
        assert!(token_fired, "the caller's token did not fire");
        assert_eq!(wait(&stopper), interrupted(Store::Postgres));
        for handle in &others {
            assert_eq!(f.pool.status(handle.id()), Some(TaskState::Ready));
        }
        assert_eq!(f.pool.status(dependent.id()), Some(TaskState::Ready));
        assert!(
            f.pool
                .submit(JOB.task(0))
                .is_err_and(|e| *e.kind() == SubmitErrorKind::ShutDown)
        );
    }
}
