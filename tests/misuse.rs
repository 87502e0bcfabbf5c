//! Misuse that used to act on the wrong task or hang (issue 7 items 7 and 8): ids from another
//! pool, and handlers waiting on their own task or for their own pool. On both stores.

mod support_store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use support_store::{GATE, Gate, HANG_GUARD, Store, TestBuilder, TestPool, finish};
use tasq::{
    CancelError, FailureReason, HandlerError, Outcome, Pool, ResubmitError, SubmitErrorKind,
    TaskHandle, TaskId, TaskState, TaskType, WaitError,
};

const JOB: TaskType<u32, u32> = TaskType::new("job");

fn pool(builder: TestBuilder) -> TestPool {
    builder
        .workers(2)
        .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .with_gates()
        .build()
}

/// Another builder on `store`, for a second pool.
fn another(store: Store) -> TestBuilder {
    TestBuilder::new(store).expect("the store ran the first pool")
}

const SELF_WAIT: TaskType<(), ()> = TaskType::new("self_wait");

/// What a wait for the pool returned, as a serde value (`WaitError` is not one).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Waited {
    Done,
    TimedOut,
    FromHandler,
    Other(String),
}

impl From<Result<(), WaitError>> for Waited {
    fn from(result: Result<(), WaitError>) -> Waited {
        match result {
            Ok(()) => Waited::Done,
            Err(WaitError::TimedOut) => Waited::TimedOut,
            Err(WaitError::FromHandler) => Waited::FromHandler,
            Err(other) => Waited::Other(other.to_string()),
        }
    }
}

/// What `wait_idle_timeout` and `wait_empty` returned in the handler.
type Waits = (Waited, Waited);
const WAIT_POOL: TaskType<(), Waits> = TaskType::new("wait_pool");

// ===== payloads that wait on their own task when dropped =====

/// What a [`WaitsOnDrop`] payload reaches through its number.
struct DropWait {
    /// Its own task's handle, once the test has it.
    own: OnceLock<TaskHandle<()>>,
    /// Says the handle is in `own`.
    ready: Receiver<()>,
    report: Sender<bool>,
}

fn drop_waits() -> &'static Mutex<HashMap<u64, Arc<DropWait>>> {
    static WAITS: OnceLock<Mutex<HashMap<u64, Arc<DropWait>>>> = OnceLock::new();
    WAITS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn drop_wait(number: u64) -> Option<Arc<DropWait>> {
    drop_waits().lock().unwrap().get(&number).cloned()
}

/// A payload that, when the pool drops it (on the worker, after the task finished), waits on its
/// own task's handle: that wait must return at once, not be refused as a self-wait. It carries
/// the number of its [`DropWait`].
#[derive(serde::Serialize, serde::Deserialize)]
struct WaitsOnDrop(u64);

impl Drop for WaitsOnDrop {
    fn drop(&mut self) {
        let Some(wait) = drop_wait(self.0) else {
            return;
        };
        if let Some(own) = wait.own.get() {
            let returned =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| own.wait())).is_ok();
            let _ = wait.report.send(returned);
        }
    }
}

/// The test's end of a [`DropWait`]: removes it when dropped.
struct DropWaitEntry {
    number: u64,
    wait: Arc<DropWait>,
}

impl DropWaitEntry {
    fn new(ready: Receiver<()>, report: Sender<bool>) -> DropWaitEntry {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let wait = Arc::new(DropWait {
            own: OnceLock::new(),
            ready,
            report,
        });
        drop_waits()
            .lock()
            .unwrap()
            .insert(number, Arc::clone(&wait));
        DropWaitEntry { number, wait }
    }
}

impl Drop for DropWaitEntry {
    fn drop(&mut self) {
        drop_waits().lock().unwrap().remove(&self.number);
    }
}

const DROPS_LATER: TaskType<WaitsOnDrop, ()> = TaskType::new("drops_later");

conformance! {
    /// Item 7: task 1 of pool `b` has the same number as task 1 of pool `a`; before ids named their
    /// pool, `a.cancel(b's id)` cancelled `a`'s task 1. Now every operation refuses it as unknown and
    /// `a`'s task is untouched.
    fn an_id_from_another_pool_is_unknown_everywhere(builder) {
        let store = builder.store();
        let a = pool(builder);
        let b = pool(another(store));
        let mine = a
            .submit(JOB.task(1).delay(Duration::from_secs(3600)))
            .unwrap();
        let theirs = b
            .submit(JOB.task(2).delay(Duration::from_secs(3600)))
            .unwrap();
        assert_eq!(
            mine.id().seq(),
            theirs.id().seq(),
            "same number, other pool"
        );
        assert_ne!(mine.id(), theirs.id());
        let foreign = theirs.id();

        assert_eq!(a.cancel(foreign), Err(CancelError::UnknownTask(foreign)));
        assert_eq!(a.status(foreign), None);
        assert_eq!(a.info(foreign), None);
        assert!(a.handle(JOB, foreign).is_none());
        assert_eq!(
            a.resubmit(JOB, foreign).err(),
            Some(ResubmitError::UnknownTask(foreign))
        );
        assert_eq!(a.take_dead_letter(JOB, foreign), None);
        assert!(!a.purge_dead_letter(foreign));
        let err = a.submit(JOB.task(3).after([foreign])).unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::UnknownDependency(foreign));
        // A handle of the other pool as a dependency is refused too, even once it succeeded.
        let done = b.submit(JOB.task(4)).unwrap();
        finish(&done);
        let err = a.submit(JOB.task(5).after([&done])).unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::UnknownDependency(done.id()));

        assert_eq!(mine.status(), TaskState::Scheduled, "a's task untouched");
        assert_eq!(theirs.status(), TaskState::Scheduled, "b's task untouched");
        a.check_invariants().unwrap();
        b.check_invariants().unwrap();
    }

    fn ids_round_trip_through_text(builder) {
        let a = pool(builder);
        let id = a.submit(JOB.task(1)).unwrap().id();
        let text = id.to_string();
        assert_eq!(text, format!("task {}:{}", a.id(), id.seq()));
        assert_eq!(text.parse::<TaskId>().unwrap(), id);
        assert_eq!(
            format!("{}:{}", a.id(), id.seq())
                .parse::<TaskId>()
                .unwrap(),
            id
        );
        assert_eq!(TaskId::from_parts(a.id(), id.seq()), id);
        for bad in [
            "", "task", "task 1", "1:", ":2", "task x:1", "1:2:3", "-1:2",
        ] {
            assert!(bad.parse::<TaskId>().is_err(), "{bad:?} parsed");
        }
        // A stored id read back finds the task again.
        assert_eq!(
            a.handle(JOB, text.parse().unwrap()).map(|h| finish(&h)),
            Some(Outcome::Succeeded(1))
        );
    }

    /// Item 8: a handler that waits on its own handle hung forever. Now the wait panics with a
    /// message that names the mistake, and the task fails with it.
    fn a_handler_waiting_on_its_own_task_fails_instead_of_hanging(builder) {
        let (tx, rx) = crossbeam_channel::bounded::<TaskHandle<()>>(1);
        let pool = builder
            .workers(1)
            .register(SELF_WAIT, move |_, _: &()| {
                let own = rx
                    .recv_timeout(HANG_GUARD)
                    .expect("the test sends the handle");
                own.wait();
                Ok::<_, HandlerError>(())
            })
            .build();
        let handle = pool.submit(SELF_WAIT.task(())).unwrap();
        tx.send(handle.clone()).unwrap();
        match finish(&handle) {
            Outcome::Failed(failure) => {
                assert_eq!(failure.reason, FailureReason::Panicked);
                assert!(
                    failure.error.contains("on its own task"),
                    "{}",
                    failure.error
                );
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(pool.stats().workers, 1);
    }

    /// Item 8: `wait_idle` from a handler hung forever (its own task keeps the pool busy). Now the
    /// timed forms return `WaitError::FromHandler` at once, and `wait_idle` panics.
    fn waiting_for_the_own_pool_from_a_handler_is_refused(builder) {
        let (tx, rx) = crossbeam_channel::bounded::<Arc<Pool>>(1);
        let (panic_tx, panic_rx) = crossbeam_channel::bounded::<bool>(1);
        let mut test_pool = builder
            .workers(1)
            .register(WAIT_POOL, move |_, _: &()| {
                let pool = rx
                    .recv_timeout(HANG_GUARD)
                    .expect("the test sends the pool");
                let idle = pool.wait_idle_timeout(None);
                let empty = pool.wait_empty(Some(Duration::from_secs(3600)));
                let panicked =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.wait_idle()))
                        .is_err();
                panic_tx.send(panicked).unwrap();
                Ok::<_, HandlerError>((Waited::from(idle), Waited::from(empty)))
            })
            .build();
        // The schema (on the durable store) stays with `test_pool` until the end of the test.
        let pool = Arc::new(test_pool.take());
        let handle = pool.submit(WAIT_POOL.task(())).unwrap();
        tx.send(Arc::clone(&pool)).unwrap();
        assert_eq!(
            finish(&handle).succeeded(),
            Some((Waited::FromHandler, Waited::FromHandler))
        );
        assert!(
            panic_rx.recv_timeout(HANG_GUARD).unwrap(),
            "wait_idle panics"
        );
    }

    /// A handler of one pool may wait for another pool: only its own is refused.
    fn a_handler_may_wait_for_another_pool(builder) {
        let store = builder.store();
        // The other pool's schema (on the durable store) stays with `other_pool` until the end
        // of the test.
        let mut other_pool = pool(builder);
        let other = Arc::new(other_pool.take());
        let queued = other.submit(JOB.task(7)).unwrap();
        let waited = Arc::clone(&other);
        const WAIT_OTHER: TaskType<(), bool> = TaskType::new("wait_other");
        let pool = another(store)
            .workers(1)
            .register(WAIT_OTHER, move |_, _: &()| {
                Ok::<_, HandlerError>(waited.wait_empty(Some(HANG_GUARD)).is_ok())
            })
            .build();
        assert_eq!(
            finish(&pool.submit(WAIT_OTHER.task(())).unwrap()).succeeded(),
            Some(true)
        );
        assert_eq!(finish(&queued).succeeded(), Some(7));
    }

    /// `wait_empty` waits for delayed tasks too (unlike `wait_idle`), without closing the pool, and
    /// times out while something is left.
    fn wait_empty_waits_for_everything_and_times_out_while_work_is_left(builder) {
        let clock = tasq::ManualClock::new();
        let pool = builder
            .workers(2)
            .manual_clock(clock.clone())
            .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .with_gates()
            .build();
        let later = pool
            .submit(JOB.task(1).delay(Duration::from_secs(10)))
            .unwrap();
        pool.wait_idle();
        assert_eq!(later.status(), TaskState::Scheduled);
        // On the manual clock a timeout passes only when the clock moves: a zero one at once.
        assert_eq!(
            pool.wait_empty(Some(Duration::ZERO)),
            Err(WaitError::TimedOut)
        );
        assert_eq!(later.status(), TaskState::Scheduled);
        std::thread::scope(|s| {
            s.spawn(|| clock.advance(Duration::from_secs(10)));
            assert_eq!(pool.wait_empty(None), Ok(()));
        });
        assert_eq!(later.status(), TaskState::Succeeded);
        // Still open.
        let again = pool.submit(JOB.task(2)).unwrap();
        assert_eq!(pool.wait_empty(None), Ok(()));
        assert_eq!(again.status(), TaskState::Succeeded);

        // A held worker keeps it from being empty.
        let gate = Gate::new();
        let held = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        assert_eq!(
            pool.wait_idle_timeout(Some(Duration::ZERO)),
            Err(WaitError::TimedOut)
        );
        gate.open();
        assert_eq!(pool.wait_empty(None), Ok(()));
        assert!(held.is_finished());
    }

    fn a_worker_is_not_marked_as_running_a_task_after_its_handler_returned(builder) {
        let (report, reported) = crossbeam_channel::bounded(1);
        let (ready_tx, ready) = crossbeam_channel::bounded(1);
        let entry = DropWaitEntry::new(ready, report);
        let pool = builder
            .workers(1)
            .register(DROPS_LATER, |_, payload: &WaitsOnDrop| {
                // Finish only once the test has put the handle in the payload.
                drop_wait(payload.0)
                    .ok_or_else(|| HandlerError::permanent("the test's entry is gone"))?
                    .ready
                    .recv_timeout(HANG_GUARD)
                    .map_err(|_| HandlerError::permanent("the test never sent the handle"))
            })
            .build();
        let handle = pool.submit(DROPS_LATER.task(WaitsOnDrop(entry.number))).unwrap();
        entry.wait.own.set(handle.clone()).unwrap();
        ready_tx.send(()).unwrap();
        assert!(finish(&handle).is_succeeded());
        assert_eq!(
            reported.recv_timeout(HANG_GUARD),
            Ok(true),
            "the wait in the payload's Drop was refused as a self-wait"
        );
    }
}
