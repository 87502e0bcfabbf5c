//! Graceful shutdown: draining before the deadline, cancelling after it, refusing new tasks,
//! calling it twice, from two threads or from a handler, and joining every worker thread.

mod support_b;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use crossbeam_channel::Receiver;
use support_b::{
    Latch, assert_threads_gone, assert_threads_named, finished, recv, retryable, wait,
    wait_until_closed,
};
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
    pool: Pool,
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
    fn new(workers: usize, name: &str) -> Self {
        let clock = ManualClock::new();
        let gate = Latch::new();
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (fired_tx, fired) = crossbeam_channel::unbounded();
        let runs = Arc::new(AtomicUsize::new(0));
        let pool = Pool::builder()
            .workers(workers)
            .thread_name(name)
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
            .build()
            .unwrap();
        Fixture {
            pool,
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

/// Runs `pool.shutdown(timeout)` on another thread, waits until it has closed the pool, calls
/// `meanwhile`, and returns the report.
fn shutdown_while(pool: &Pool, timeout: Duration, meanwhile: impl FnOnce()) -> ShutdownReport {
    thread::scope(|s| {
        let shutdown = s.spawn(|| pool.shutdown(timeout));
        wait_until_closed(pool);
        meanwhile();
        shutdown.join().unwrap()
    })
}

#[test]
fn shutdown_before_its_deadline_drains_every_kind_of_waiting_task() {
    let f = Fixture::new(1, "sd-drain");
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

#[test]
fn shutdown_waits_for_delayed_tasks_and_retries_to_come_due() {
    let f = Fixture::new(1, "sd-due");
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

#[test]
fn shutdown_after_its_deadline_cancels_what_is_left_and_fires_running_tokens() {
    let f = Fixture::new(1, "sd-late");
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

#[test]
fn submit_during_and_after_shutdown_fails_and_hands_the_task_back() {
    let f = Fixture::new(1, "sd-submit");
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

#[test]
fn shutdown_called_twice_returns_both_times() {
    let f = Fixture::new(2, "sd-twice");
    let job = f.job(1);
    let first = f.pool.shutdown(Duration::from_secs(10));
    assert_eq!(finished(&job), Outcome::Succeeded(1));
    let second = f.pool.shutdown(Duration::from_secs(10));
    assert_eq!((first.succeeded, second.succeeded), (1, 1));
    assert!(!second.deadline_reached);
    assert_eq!(f.pool.stats().workers, 0);
}

#[test]
fn shutdown_called_from_two_threads_at_once_returns_in_both() {
    let f = Fixture::new(2, "sd-both");
    let gate = f.hold_worker();
    let queued = f.job(1);
    let (report_tx, reports) = crossbeam_channel::unbounded();
    let barrier = Barrier::new(3);
    thread::scope(|s| {
        for _ in 0..2 {
            let report_tx = report_tx.clone();
            let (pool, barrier) = (&f.pool, &barrier);
            s.spawn(move || {
                barrier.wait();
                report_tx
                    .send(pool.shutdown(Duration::from_secs(3600)))
                    .unwrap();
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
    });
    assert!(finished(&gate).is_succeeded());
    assert_eq!(finished(&queued), Outcome::Succeeded(1));
    assert_eq!(f.pool.stats().workers, 0);
}

#[test]
fn shutdown_joins_every_worker_thread() {
    const WORKERS: usize = 3;
    let pool = Pool::builder()
        .workers(WORKERS)
        .thread_name("sd-join")
        .register(GATE, {
            // Every handler waits for all the others: once they have all run, every worker thread
            // has started and named itself.
            let barrier = Arc::new(Barrier::new(WORKERS));
            move |_, _: &()| {
                barrier.wait();
                Ok(())
            }
        })
        .build()
        .unwrap();
    let handles: Vec<_> = (0..WORKERS)
        .map(|_| pool.submit(GATE.task(())).unwrap())
        .collect();
    for handle in &handles {
        assert!(wait(handle).is_succeeded());
    }
    if cfg!(target_os = "linux") {
        assert_threads_named("sd-join", WORKERS);
    }

    let report = pool.shutdown(Duration::from_secs(10));
    assert_eq!(report.succeeded, WORKERS as u64);
    assert_eq!(pool.stats().workers, 0);
    if cfg!(target_os = "linux") {
        assert_threads_gone("sd-join");
    }
}

/// Calls `shutdown` on its own pool, after meeting the other handlers on the barrier if it is
/// given one.
const SELF_STOP: TaskType<Option<Arc<Barrier>>, ()> = TaskType::new("self_stop");

/// A pool whose SELF_STOP handlers shut it down from inside, on a manual clock: the calls'
/// one-hour deadline passes only if the test advances the clock.
struct SelfStopping {
    pool: Arc<Pool>,
    clock: ManualClock,
    /// Each handler's shutdown report, and whether its own token had fired by then.
    reports: Receiver<(ShutdownReport, bool)>,
}

impl SelfStopping {
    fn new(workers: usize) -> Self {
        let clock = ManualClock::new();
        // The handlers reach their pool through a weak reference, so the pool's registry does
        // not keep the pool alive.
        let this: Arc<OnceLock<Weak<Pool>>> = Arc::new(OnceLock::new());
        let (report_tx, reports) = crossbeam_channel::unbounded();
        let pool = Arc::new(
            Pool::builder()
                .workers(workers)
                .manual_clock(clock.clone())
                .register(JOB, |_, n: &u32| Ok(*n))
                .register(SELF_STOP, {
                    let this = Arc::clone(&this);
                    move |ctx, meet: &Option<Arc<Barrier>>| {
                        let pool = this.get().and_then(Weak::upgrade).expect("pool alive");
                        if let Some(barrier) = meet {
                            barrier.wait();
                        }
                        let report = pool.shutdown(Duration::from_secs(3600));
                        report_tx.send((report, ctx.is_cancelled())).unwrap();
                        Ok(())
                    }
                })
                .build()
                .unwrap(),
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

#[test]
fn shutdown_from_inside_a_handler_does_not_deadlock() {
    let f = SelfStopping::new(2);
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

#[test]
fn shutdown_from_two_handlers_at_once_does_not_deadlock() {
    let f = SelfStopping::new(2);
    // Both handlers are running before either calls shutdown.
    let meet = Arc::new(Barrier::new(2));
    let stoppers: Vec<_> = (0..2)
        .map(|_| {
            f.pool
                .submit(SELF_STOP.task(Some(Arc::clone(&meet))))
                .unwrap()
        })
        .collect();

    let (first, _) = f.report();
    let (second, _) = f.report();
    assert!(!first.deadline_reached && !second.deadline_reached);
    for stopper in &stoppers {
        assert_eq!(wait(stopper), Outcome::Cancelled(CancelReason::Shutdown));
    }
}

#[test]
fn shutdown_from_a_handler_whose_task_has_dependents_does_not_deadlock() {
    let f = SelfStopping::new(2);
    let submitted = Arc::new(Barrier::new(2));
    let stopper = f
        .pool
        .submit(SELF_STOP.task(Some(Arc::clone(&submitted))))
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

#[test]
fn shutdown_with_a_timeout_too_long_to_represent_waits_for_the_drain() {
    let f = Fixture::new(1, "sd-forever");
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

#[test]
fn every_wait_returns_after_a_shutdown_past_its_deadline() {
    let f = Fixture::new(2, "sd-waits");
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
