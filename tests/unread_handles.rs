//! Handles that have not read their task yet. The embedded store makes a task's completion only
//! when a handle first reads the task (a plain submit's handle starts without one); it keeps
//! the outcome of a task whose unread handle lives, past retention and past the pool itself,
//! and lets it go once that handle is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tasq::{
    CancelError, CancelReason, HandlerError, ManualClock, Outcome, Pool, TaskState, TaskType,
};

/// An output that counts its drops in the counter it names (one per test).
#[derive(Clone, Debug)]
struct Counted(&'static AtomicUsize);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl PartialEq for Counted {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

const MAKE: TaskType<&'static AtomicUsize, Counted> = TaskType::new("make");

fn pool(retention: usize, clock: Option<ManualClock>) -> Pool {
    let mut builder = Pool::builder()
        .workers(1)
        .retention(retention, None)
        .register(MAKE, |_, drops: &&'static AtomicUsize| {
            Ok::<_, HandlerError>(Counted(drops))
        });
    if let Some(clock) = clock {
        builder = builder.manual_clock(clock);
    }
    builder.build().expect("the pool builds")
}

/// Retention forgets the tasks as they finish. The outputs of those whose handles were dropped
/// unread go: one dropped before its task ran, one after its task was forgotten (its output was
/// kept for it until the drop was taken in, by the shutdown at the latest). The last one's
/// output stays for its unread handle, which reads it after the pool forgot the task.
#[test]
fn an_unread_handle_keeps_its_outcome_past_retention_and_a_dropped_one_lets_it_go() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let pool = pool(0, None);
    let kept = pool.submit(MAKE.task(&DROPS)).unwrap();
    drop(pool.submit(MAKE.task(&DROPS)).unwrap());
    let late = pool.submit(MAKE.task(&DROPS)).unwrap();
    pool.wait_idle();
    assert_eq!(pool.status(kept.id()), None, "retention 0 forgets at once");
    assert_eq!(pool.status(late.id()), None);
    drop(late);
    pool.check_invariants().unwrap();
    // The shutdown joins the worker and takes the drops in: every drop due has happened.
    let report = pool.shutdown(Duration::from_secs(10));
    assert!(
        !report.deadline_reached && report.interrupted.is_empty(),
        "{report:?}"
    );
    assert_eq!(
        DROPS.load(Ordering::SeqCst),
        2,
        "the dropped handles' outputs go, the unread one's stays"
    );

    assert_eq!(kept.status(), TaskState::Succeeded);
    let Outcome::Succeeded(output) = kept.join() else {
        panic!("the task succeeded");
    };
    assert_eq!(DROPS.load(Ordering::SeqCst), 2);
    drop(output);
    assert_eq!(DROPS.load(Ordering::SeqCst), 3);
}

/// A handle dropped unread while its task waits: the task still runs, and its output is
/// dropped when retention forgets the task (nothing is kept for nobody).
#[test]
fn dropped_unread_handles_keep_nothing_once_retention_forgets_their_tasks() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let clock = ManualClock::new();
    let pool = pool(0, Some(clock.clone()));
    for _ in 0..100 {
        drop(
            pool.submit(MAKE.task(&DROPS).delay(Duration::from_secs(1)))
                .unwrap(),
        );
    }
    clock.advance(Duration::from_secs(1));
    pool.wait_empty(Some(Duration::from_secs(60))).unwrap();
    pool.shutdown(Duration::from_secs(10));
    assert_eq!(pool.stats().totals.succeeded, 100);
    assert_eq!(DROPS.load(Ordering::SeqCst), 100);
    pool.check_invariants().unwrap();
}

/// Unread handles outlive their pool: one reads the output of a task that succeeded, one the
/// cancel of a task the pool's end cut short, after the store itself is gone.
#[test]
fn unread_handles_read_their_outcomes_after_the_pool_is_dropped() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let pool = pool(10, None);
    let done = pool.submit(MAKE.task(&DROPS)).unwrap();
    let later = pool
        .submit(MAKE.task(&DROPS).delay(Duration::from_secs(3600)))
        .unwrap();
    pool.wait_idle();
    assert_eq!(pool.status(done.id()), Some(TaskState::Succeeded));
    // No wait for the delayed task: it is cancelled.
    pool.shutdown(Duration::ZERO);
    drop(pool);
    // The store went with the pool (its workers are joined): the handles cannot cancel any more.
    assert_eq!(later.cancel(), Err(CancelError::PoolGone(later.id())));

    assert!(done.is_finished() && later.is_finished());
    assert_eq!(later.wait(), Outcome::Cancelled(CancelReason::Shutdown));
    assert_eq!(done.wait(), Outcome::Succeeded(Counted(&DROPS)));
    let drops = DROPS.load(Ordering::SeqCst);
    drop(done);
    assert_eq!(
        DROPS.load(Ordering::SeqCst),
        drops + 1,
        "the output kept for the handle goes with it"
    );
}

/// A handler submits a task and drops its handle at once: the worker takes that drop in as it
/// finishes the handler's task, before it takes the new task in (the drop arrives before its
/// task). The task still runs, and its output is dropped when retention forgets it.
#[test]
fn a_handle_dropped_before_its_task_is_taken_in_keeps_nothing() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    const SPAWN: TaskType<(), ()> = TaskType::new("spawn");
    let pool = Pool::builder()
        .workers(1)
        .retention(0, None)
        .register(MAKE, |_, drops: &&'static AtomicUsize| {
            Ok::<_, HandlerError>(Counted(drops))
        })
        .register(SPAWN, |ctx, _: &()| {
            drop(
                ctx.submit(MAKE.task(&DROPS))
                    .map_err(HandlerError::permanent)?,
            );
            Ok::<_, HandlerError>(())
        })
        .build()
        .unwrap();
    assert!(pool.submit(SPAWN.task(())).unwrap().wait().is_succeeded());
    pool.wait_empty(Some(Duration::from_secs(60))).unwrap();
    pool.check_invariants().unwrap();
    pool.shutdown(Duration::from_secs(10));
    assert_eq!(pool.stats().totals.succeeded, 2);
    assert_eq!(DROPS.load(Ordering::SeqCst), 1, "nothing kept for nobody");
}

/// A clone of an unread handle shares its outcome, and either may be read first.
#[test]
fn clones_of_an_unread_handle_share_the_outcome() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let pool = pool(0, None);
    let first = pool.submit(MAKE.task(&DROPS)).unwrap();
    let second = first.clone();
    pool.wait_idle();
    drop(first);
    assert_eq!(second.wait(), Outcome::Succeeded(Counted(&DROPS)));
    pool.shutdown(Duration::from_secs(10));
    pool.check_invariants().unwrap();
}
