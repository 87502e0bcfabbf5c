//! Delayed plain tasks. The embedded store keeps one that nothing has asked about in a third of
//! a record until it falls due (a "dormant" task); each question the API can ask of a task gives
//! it its record on the spot. These tests ask each question of a task still waiting for its
//! time, and check the answer and what follows when the clock reaches it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tasq::{
    CancelOutcome, CancelReason, HandlerError, ManualClock, Outcome, Pool, TaskHandle, TaskState,
    TaskType,
};

/// Bounds every wait for something that should happen at once; never slept.
const GUARD: Duration = Duration::from_secs(10);
const DELAY: Duration = Duration::from_secs(60);

/// A payload that counts its drops in the counter it names (one per test).
struct Counted(&'static AtomicUsize);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs once its time comes; its output is the payload's counter, read at the run.
const LATER: TaskType<Counted, usize> = TaskType::new("later");

fn pool(clock: &ManualClock) -> Pool {
    Pool::builder()
        .workers(2)
        .manual_clock(clock.clone())
        .register(LATER, |_, payload: &Counted| {
            Ok::<_, HandlerError>(payload.0.load(Ordering::SeqCst))
        })
        .build()
        .unwrap()
}

/// Submits a plain task due after [`DELAY`].
fn later(pool: &Pool, drops: &'static AtomicUsize) -> TaskHandle<usize> {
    pool.submit(LATER.task(Counted(drops)).delay(DELAY))
        .unwrap()
}

#[test]
fn a_waiting_task_answers_by_id_and_runs_when_due() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let due = clock.now() + DELAY;
    let handle = pool
        .submit(LATER.task(Counted(&DROPS)).delay(DELAY).priority(7))
        .unwrap();
    let id = handle.id();
    let info = pool.info(id).expect("the pool knows its waiting task");
    assert_eq!(
        (
            info.id,
            info.task_type,
            info.state,
            info.priority,
            info.attempts
        ),
        (id, "later", TaskState::Scheduled, 7, 0)
    );
    assert_eq!(info.run_at, Some(due));
    assert_eq!((info.last_error, info.resubmitted_as), (None, None));
    pool.check_invariants().unwrap();

    clock.advance(DELAY - Duration::from_millis(1));
    assert_eq!(pool.status(id), Some(TaskState::Scheduled), "not due yet");
    assert_eq!(handle.try_wait(), None);
    clock.advance(Duration::from_millis(1));
    assert_eq!(handle.wait_timeout(GUARD), Some(Outcome::Succeeded(0)));
    assert_eq!(pool.status(id), Some(TaskState::Succeeded));
    assert_eq!(pool.info(id).unwrap().attempts, 1);
    pool.check_invariants().unwrap();
}

/// A cancel by id ends the waiting task at once: its payload is dropped then, not when its
/// time would have come, and the clock reaching that time runs nothing.
#[test]
fn a_cancel_by_id_ends_a_waiting_task_at_once() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let handle = later(&pool, &DROPS);
    assert_eq!(pool.cancel(handle.id()), Ok(CancelOutcome::Cancelled));
    assert_eq!(
        DROPS.load(Ordering::SeqCst),
        1,
        "the payload goes with the cancel"
    );
    assert_eq!(pool.status(handle.id()), Some(TaskState::Cancelled));
    clock.advance(DELAY);
    pool.wait_idle();
    assert_eq!(
        handle.wait_timeout(GUARD),
        Some(Outcome::Cancelled(CancelReason::Requested))
    );
    let totals = pool.stats().totals;
    assert_eq!((totals.succeeded, totals.cancelled), (0, 1));
    pool.check_invariants().unwrap();
}

/// A task submitted after a waiting one waits for it: it runs once the first has run.
#[test]
fn a_waiting_task_can_be_depended_on() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let first = later(&pool, &DROPS);
    let second = pool
        .submit(LATER.task(Counted(&DROPS)).after([first.id()]))
        .unwrap();
    assert_eq!(second.status(), TaskState::Blocked);
    pool.check_invariants().unwrap();
    clock.advance(DELAY);
    assert_eq!(second.wait_timeout(GUARD), Some(Outcome::Succeeded(1)));
    assert_eq!(first.wait_timeout(GUARD), Some(Outcome::Succeeded(0)));
    pool.check_invariants().unwrap();
}

/// A waiting task's handle reads it (status, then a wait); another one's handle is dropped
/// unread: both run when due.
#[test]
fn handles_of_waiting_tasks_read_them_or_let_them_go() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let read = later(&pool, &DROPS);
    let dropped = later(&pool, &DROPS);
    let dropped_id = dropped.id();
    drop(dropped);
    assert_eq!(read.status(), TaskState::Scheduled);
    pool.check_invariants().unwrap();
    clock.advance(DELAY);
    assert!(matches!(
        read.wait_timeout(GUARD),
        Some(Outcome::Succeeded(_))
    ));
    pool.wait_idle();
    assert_eq!(pool.status(dropped_id), Some(TaskState::Succeeded));
    assert_eq!(pool.stats().totals.succeeded, 2);
    pool.check_invariants().unwrap();
}

/// A shutdown cancels the waiting tasks; the unread handle of one reads that cancel after the
/// pool is gone, and every payload is dropped.
#[test]
fn a_shutdown_cancels_waiting_tasks_and_their_unread_handles_read_it() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let clock = ManualClock::new();
    let pool = pool(&clock);
    let kept = later(&pool, &DROPS);
    let dropped = later(&pool, &DROPS);
    drop(dropped);
    let report = pool.shutdown(Duration::ZERO);
    assert!(report.interrupted.is_empty(), "{report:?}");
    assert_eq!(pool.stats().totals.cancelled, 2);
    pool.check_invariants().unwrap();
    drop(pool);
    assert_eq!(DROPS.load(Ordering::SeqCst), 2);
    assert_eq!(kept.wait(), Outcome::Cancelled(CancelReason::Shutdown));
}

/// A pool of one worker, and a way to keep that worker busy: [`Busy::hold`] returns once the
/// worker runs a task that blocks until [`Busy::release`]. Meanwhile plain submits wait in the
/// intake: nothing takes them in. The pool's `STEP` tasks record their payloads in `order` as
/// they run.
struct Busy {
    pool: Pool,
    clock: ManualClock,
    order: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    started: std::sync::mpsc::Receiver<()>,
    release: std::sync::mpsc::Sender<()>,
    busy: Option<TaskHandle<()>>,
}

const BUSY: TaskType<(), ()> = TaskType::new("busy");
const STEP: TaskType<u64, ()> = TaskType::new("step");

impl Busy {
    fn new() -> Self {
        use std::sync::{Arc, Mutex, mpsc};
        let clock = ManualClock::new();
        let (started_tx, started) = mpsc::channel::<()>();
        let (release, release_rx) = mpsc::channel::<()>();
        let (started_tx, release_rx) = (Mutex::new(started_tx), Mutex::new(release_rx));
        let order = Arc::new(Mutex::new(Vec::new()));
        let ran = Arc::clone(&order);
        let pool = Pool::builder()
            .workers(1)
            .manual_clock(clock.clone())
            .register(BUSY, move |_, _: &()| {
                started_tx.lock().unwrap().send(()).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
                Ok::<_, HandlerError>(())
            })
            .register(STEP, move |_, n: &u64| {
                ran.lock().unwrap().push(*n);
                Ok::<_, HandlerError>(())
            })
            .build()
            .unwrap();
        Busy {
            pool,
            clock,
            order,
            started,
            release,
            busy: None,
        }
    }

    fn hold(&mut self) {
        self.busy = Some(self.pool.submit(BUSY.task(())).unwrap());
        self.started
            .recv_timeout(GUARD)
            .expect("the worker runs the busy task");
    }

    fn release(&mut self) {
        self.release.send(()).unwrap();
        let busy = self.busy.take().expect("held");
        assert_eq!(busy.wait_timeout(GUARD), Some(Outcome::Succeeded(())));
    }

    fn step(&self, n: u64, delay: Duration) -> TaskHandle<()> {
        self.pool.submit(STEP.task(n).delay(delay)).unwrap()
    }

    /// Waits for `handles`, then returns the order their tasks ran in.
    fn ran(&self, handles: &[TaskHandle<()>]) -> Vec<u64> {
        for handle in handles {
            assert_eq!(handle.wait_timeout(GUARD), Some(Outcome::Succeeded(())));
        }
        self.pool.check_invariants().unwrap();
        self.order.lock().unwrap().clone()
    }
}

/// Delayed tasks that fall due while the only worker is busy run in due order (earliest first),
/// not in the order they were submitted: the order a task becomes ready is its due time. They
/// wait in the intake (nothing takes them in while the worker runs) until the worker is free.
#[test]
fn delayed_tasks_that_fall_due_while_the_worker_is_busy_run_in_due_order() {
    let mut busy = Busy::new();
    busy.hold();
    let handles: Vec<_> = [50, 40, 30, 20, 10]
        .into_iter()
        .map(|ms| busy.step(ms, Duration::from_millis(ms)))
        .collect();
    busy.clock.advance(Duration::from_millis(100));
    busy.release();
    assert_eq!(busy.ran(&handles), [10, 20, 30, 40, 50]);
}

/// Equal due times run in submission order; a task submitted for now takes its place among
/// delayed ones by when it was submitted, and one already taken in (waiting in the delayed
/// heap) by its due time too.
#[test]
fn tasks_falling_due_together_run_by_due_time_then_submission() {
    let mut busy = Busy::new();
    // Taken in before the worker is busy: it waits in the delayed heap, due at 25 ms.
    let early = busy.step(25, Duration::from_millis(25));
    assert_eq!(early.status(), TaskState::Scheduled);
    busy.hold();
    let mut handles = vec![early];
    handles.push(busy.step(20, Duration::from_millis(20)));
    handles.push(busy.step(10, Duration::from_millis(10)));
    handles.push(busy.step(11, Duration::from_millis(10)));
    busy.clock.advance(Duration::from_millis(15));
    // Submitted at 15 ms, due then.
    handles.push(busy.step(15, Duration::ZERO));
    busy.clock.advance(Duration::from_millis(100));
    busy.release();
    assert_eq!(busy.ran(&handles), [10, 11, 15, 20, 25]);
}
