//! Handles that have not read their task yet. The embedded store makes a task's completion only
//! when a handle first reads the task (a plain submit's handle starts without one); it keeps
//! the outcome of a task whose unread handle lives, past retention and past the pool itself,
//! and lets it go once that handle is dropped.

mod support_rng;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support_rng::Rng;

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

/// A handler submits a task and drops its handle at once: the worker takes both in as it
/// finishes the handler's task (the task first, then the drop: the state unit test
/// `a_drop_taken_in_before_its_task_keeps_nothing_for_it` covers the other order, which a race
/// with another producer can give). The task still runs, and its output is dropped when
/// retention forgets it.
#[test]
fn a_handle_dropped_by_the_handler_that_submitted_it_keeps_nothing() {
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

/// Outputs made (by the handler and by every clone) and dropped, for the randomized run.
static MADE: AtomicUsize = AtomicUsize::new(0);
static GONE: AtomicUsize = AtomicUsize::new(0);

/// An output that counts itself in [`MADE`] and [`GONE`].
#[derive(Debug)]
struct Tracked(u64);

impl Tracked {
    fn new(n: u64) -> Self {
        MADE.fetch_add(1, Ordering::SeqCst);
        Tracked(n)
    }
}

impl Clone for Tracked {
    fn clone(&self) -> Self {
        Tracked::new(self.0)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        GONE.fetch_add(1, Ordering::SeqCst);
    }
}

/// Payload `n`: ends by `n % 10` (0 permanent failure, 1 panic, else success with `n`).
const WORK: TaskType<u64, Tracked> = TaskType::new("work");

/// Every way a handle can go, mixed at random over many tasks with a small retention, delays,
/// dependencies, keys, cancels and a shutdown whose deadline is drawn at random: handles dropped
/// unread at once or later on another thread, read at once, cloned, or kept unread to the end.
/// Checked: every kept handle's wait returns an outcome that fits its task; the totals balance;
/// the engine's invariants hold throughout; and once the pool and every handle are gone, every
/// output ever made was dropped exactly once (nothing kept for nobody, nothing dropped twice).
#[test]
fn a_randomized_mix_of_kept_read_cloned_and_dropped_handles() {
    let seed = support_rng::seed("TASQ_UNREAD_SEED");
    let tasks: u64 = std::env::var("TASQ_UNREAD_TASKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300_000);
    eprintln!("seed {seed} (replay with TASQ_UNREAD_SEED={seed}), {tasks} tasks");
    let mut rng = Rng(seed);
    let retention = rng.below(17) as usize;
    let pool = Pool::builder()
        .workers(3)
        .retention(retention, None)
        .max_attempts(1)
        .quiet_panics(true)
        .register(WORK, |_, n: &u64| match n % 10 {
            0 => Err(HandlerError::permanent("zero")),
            1 => panic!("one"),
            _ => Ok(Tracked::new(*n)),
        })
        .build()
        .unwrap();
    let (later, dropped_later) = crossbeam_channel::unbounded::<tasq::TaskHandle<Tracked>>();
    let dropper = std::thread::spawn(move || {
        for handle in dropped_later {
            if handle.id().seq() % 3 == 0 {
                let _ = handle.try_wait();
            }
            drop(handle);
        }
    });
    let mut kept: Vec<(u64, tasq::TaskHandle<Tracked>)> = Vec::new();
    let (mut refused, mut duplicates) = (0, 0);
    for i in 0..tasks {
        let n = rng.below(1_000_000);
        let mut task = WORK.task(n);
        match rng.below(8) {
            0 => task = task.delay(Duration::from_micros(rng.below(500))),
            1 if !kept.is_empty() => {
                let dependency = kept[rng.below(kept.len() as u64) as usize].1.id();
                task = task.after([dependency]);
            }
            2 => task = task.key(format!("key-{}", rng.below(50))),
            _ => {}
        }
        let handle = match pool.submit(task) {
            Ok(handle) => handle,
            Err(error) => {
                // A dependency retention already forgot.
                assert!(
                    matches!(error.kind(), tasq::SubmitErrorKind::UnknownDependency(_)),
                    "seed {seed}: {error}"
                );
                refused += 1;
                continue;
            }
        };
        duplicates += u64::from(handle.is_duplicate());
        match rng.below(6) {
            0 => drop(handle),
            1 => later.send(handle).unwrap(),
            2 => {
                let _ = handle.try_wait();
                kept.push((n, handle));
            }
            3 => {
                later.send(handle.clone()).unwrap();
                kept.push((n, handle));
            }
            _ => kept.push((n, handle)),
        }
        if rng.below(50) == 0 && !kept.is_empty() {
            let id = kept[rng.below(kept.len() as u64) as usize].1.id();
            let _ = pool.cancel(id);
        }
        if i % 10_000 == 0 {
            pool.check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
        if kept.len() > 4_000 {
            // The oldest are read (some long forgotten by the pool) and let go.
            for (n, handle) in kept.drain(..2_000) {
                check_outcome(seed, n, &handle);
            }
        }
    }
    drop(later);
    dropper.join().unwrap();
    pool.shutdown(Duration::from_millis(rng.below(50)));
    pool.check_invariants()
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    for (n, handle) in &kept {
        check_outcome(seed, *n, handle);
    }
    let totals = pool.stats().totals;
    assert_eq!(
        totals.submitted,
        totals.succeeded + totals.failed + totals.cancelled,
        "seed {seed}: {totals:?}"
    );
    assert_eq!(
        totals.submitted + refused + duplicates,
        tasks,
        "seed {seed}: each submit is accepted, refused or deduplicated"
    );
    // Every handle gone, and their drops taken in (a cancel moves them in first): the pool
    // holds no output but those of the tasks it still remembers.
    let last = kept.last().map(|(_, handle)| handle.id());
    drop(kept);
    if let Some(id) = last {
        let _ = pool.cancel(id);
    }
    let held = MADE.load(Ordering::SeqCst) - GONE.load(Ordering::SeqCst);
    assert!(
        held <= retention,
        "seed {seed}: {held} outputs held with every handle gone, retention {retention}"
    );
    drop(pool);
    assert_eq!(
        MADE.load(Ordering::SeqCst),
        GONE.load(Ordering::SeqCst),
        "seed {seed}: every output is dropped exactly once"
    );
}

/// A kept handle's outcome: it returns, and fits what payload `n` told the handler (a
/// deduplicated submit reads the task that held the key; a cancel or a failed dependency may
/// end any task).
fn check_outcome(seed: u64, n: u64, handle: &tasq::TaskHandle<Tracked>) {
    let outcome = handle
        .wait_timeout(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("seed {seed}: {} never ended", handle.id()));
    if handle.is_duplicate() {
        return;
    }
    match outcome {
        Outcome::Succeeded(output) => {
            assert_eq!(output.0, n, "seed {seed}: {}", handle.id());
            assert!(n % 10 >= 2, "seed {seed}: {} succeeded", handle.id());
        }
        Outcome::Failed(_) => assert!(n % 10 < 2, "seed {seed}: {} failed", handle.id()),
        Outcome::Cancelled(_) => {}
    }
}

/// Unread handles dropped on an idle pool let their outputs go without waiting for another
/// task to end: the dropping thread takes the drops in itself every few hundred, and
/// `wait_idle` takes in the rest. Only the outputs of the tasks retention still remembers stay
/// (in their records, until retention forgets them).
#[test]
fn an_idle_pool_lets_the_outputs_of_dropped_unread_handles_go() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    const TASKS: usize = 10_000;
    const RETENTION: usize = 10;
    let pool = pool(RETENTION, None);
    let handles: Vec<_> = (0..TASKS)
        .map(|_| pool.submit(MAKE.task(&DROPS)).unwrap())
        .collect();
    pool.wait_idle();
    assert_eq!(pool.stats().totals.succeeded, TASKS as u64);
    assert_eq!(
        DROPS.load(Ordering::SeqCst),
        0,
        "kept for the unread handles"
    );
    let live = || TASKS - DROPS.load(Ordering::SeqCst);

    drop(handles);
    // No task runs any more: the dropping thread took most drops in.
    assert!(live() < 1000, "{} outputs live after the drops", live());
    pool.wait_idle();
    assert_eq!(live(), RETENTION, "only the remembered tasks' outputs stay");
    pool.check_invariants().unwrap();
    pool.shutdown(Duration::from_secs(10));
    drop(pool);
    assert_eq!(live(), 0);
}

/// On an idle pool (every task finished and forgotten, each output kept for its unread
/// handle), the dropping thread takes the drops in itself exactly once per 256: the 255 drops
/// before that take no lock and let no output go, the 256th lets all 256 go, and the count
/// starts again from zero (the next drops wait for a take-in: here, the shutdown's).
#[test]
fn an_idle_pool_takes_drops_in_once_every_256_drops() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    const TASKS: usize = 300;
    let drops = || DROPS.load(Ordering::SeqCst);
    let pool = pool(0, None);
    let handles: Vec<_> = (0..TASKS)
        .map(|_| pool.submit(MAKE.task(&DROPS)).unwrap())
        .collect();
    // The worker takes drops in only after a task it finished: it has none left after this.
    pool.wait_idle();
    assert_eq!(pool.stats().totals.succeeded, TASKS as u64);
    assert_eq!(drops(), 0, "kept for the unread handles");

    // Oldest first: the worker may still hold a reference to the last task's outcome for a
    // moment after `wait_idle` returns (it drops what it set aside once it left the lock).
    let mut handles = handles.into_iter();
    for n in 1..256 {
        drop(handles.next());
        assert_eq!(
            drops(),
            0,
            "a drop below the threshold ({n}) takes nothing in"
        );
    }
    drop(handles.next());
    assert_eq!(drops(), 256, "the 256th drop takes all 256 in");

    // The count started again: the next drops take nothing in themselves.
    for (n, handle) in handles.enumerate() {
        drop(handle);
        assert_eq!(
            drops(),
            256,
            "{} drops after a take-in take nothing in",
            n + 1
        );
    }
    pool.check_invariants().unwrap();
    // The shutdown takes the rest in (and joins the worker).
    pool.shutdown(Duration::from_secs(10));
    assert_eq!(drops(), TASKS);
}

/// Unread handles outliving their pool: one dropped unread lets its output go at once (the
/// hub hands back what the store kept for it), though another handle still keeps the hub
/// alive; that other one still takes its own output.
#[test]
fn an_unread_handle_dropped_after_its_pool_lets_its_output_go_at_once() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let drops = || DROPS.load(Ordering::SeqCst);
    let pool = pool(10, None);
    let first = pool.submit(MAKE.task(&DROPS)).unwrap();
    let second = pool.submit(MAKE.task(&DROPS)).unwrap();
    pool.wait_idle();
    let report = pool.shutdown(Duration::from_secs(10));
    assert_eq!(report.succeeded, 2, "{report:?}");
    // The store goes with the pool (its workers are joined): the hub is sealed.
    drop(pool);
    assert_eq!(drops(), 0, "both outputs kept for their unread handles");

    drop(first);
    assert_eq!(drops(), 1, "the dropped handle's output goes with it");
    let Outcome::Succeeded(output) = second.join() else {
        panic!("the task succeeded");
    };
    assert_eq!(
        drops(),
        1,
        "the joined handle's output is handed out, not dropped"
    );
    drop(output);
    assert_eq!(drops(), 2);
}
