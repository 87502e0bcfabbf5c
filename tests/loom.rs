//! loom models of the engine's wake-ups, cancels and shutdown, run on the engine's own code.
//!
//! Run with `RUSTFLAGS="--cfg tasq_loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom`
//! (`.ci/run` does, with debug assertions on). Each model builds a real pool with one or two
//! workers; under `cfg(tasq_loom)` its locks, condition variables, atomics and threads are loom's (see
//! `src/sync.rs`), so a lost wake-up shows as a deadlock and a wrong state as a failed assertion.
#![cfg(tasq_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use tasq::{
    CancelOutcome, CancelReason, HandlerError, ManualClock, Outcome, Pool, RateLimit, RetryPolicy,
    SubmitErrorKind, TaskState, TaskType, TypeOptions,
};

const JOB: TaskType<u32, u32> = TaskType::new("job");

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.max_branches = 100_000;
    builder.check(f);
}

/// A pool of `workers` on a manual clock, whose handler counts its runs and fails for payload 0.
fn pool(workers: usize, runs: &Arc<AtomicUsize>) -> (Pool, ManualClock) {
    let clock = ManualClock::new();
    let runs = Arc::clone(runs);
    let pool = Pool::builder()
        .workers(workers)
        .seed(1)
        .max_attempts(1)
        .manual_clock(clock.clone())
        .retry_policy(RetryPolicy::exponential(
            Duration::from_secs(1),
            Duration::from_secs(1),
        ))
        .register(JOB, move |_, n: &u32| {
            runs.fetch_add(1, Ordering::SeqCst);
            if *n == 0 {
                Err(HandlerError::permanent("zero"))
            } else {
                Ok(*n)
            }
        })
        .build()
        .expect("pool builds");
    (pool, clock)
}

/// Set by a handler, awaited by the model's threads: a wait that never goes through the pool.
#[derive(Default)]
struct Signal {
    count: loom::sync::Mutex<usize>,
    changed: loom::sync::Condvar,
}

impl Signal {
    fn add(&self) {
        *self.count.lock().unwrap() += 1;
        self.changed.notify_all();
    }

    fn wait_for(&self, n: usize) {
        let mut count = self.count.lock().unwrap();
        while *count < n {
            count = self.changed.wait(count).unwrap();
        }
    }
}

/// 1. A submit racing a worker that is about to sleep: the task always runs.
#[test]
fn submit_races_a_worker_going_to_sleep() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _clock) = pool(1, &runs);
        let handle = pool.submit(JOB.task(7)).unwrap();
        assert_eq!(handle.wait(), Outcome::Succeeded(7));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 2. Shutdown racing idle workers: every worker returns.
#[test]
fn shutdown_races_idle_workers() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _clock) = pool(2, &runs);
        let report = pool.shutdown(Duration::from_secs(1));
        assert!(!report.deadline_reached);
        assert_eq!(pool.stats().workers, 0);
    });
}

/// 3. A submit racing shutdown: refused and never run, or accepted and finished.
#[test]
fn submit_races_shutdown() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _clock) = pool(1, &runs);
        let pool = Arc::new(pool);
        let submitter = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.submit(JOB.task(3)).map_err(|e| e.kind().clone()))
        };
        let report = pool.shutdown(Duration::from_secs(1));
        match submitter.join().unwrap() {
            Ok(handle) => {
                let outcome = handle.wait();
                assert_eq!(outcome, Outcome::Succeeded(3));
                assert_eq!(report.succeeded, 1);
                assert_eq!(runs.load(Ordering::SeqCst), 1);
            }
            Err(kind) => {
                assert_eq!(kind, SubmitErrorKind::ShutDown);
                assert_eq!(runs.load(Ordering::SeqCst), 0);
                assert_eq!(report.succeeded + report.cancelled + report.failed, 0);
            }
        }
    });
}

/// 4. A cancel by id racing a worker taking the task, the task perhaps still in the intake (the
/// cancel is by id, not through a clone of the handle, whose making would move the intake in
/// first): one terminal state, and a task cancelled before it started never runs.
#[test]
fn cancel_races_a_worker_taking_the_task() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _clock) = pool(1, &runs);
        let pool = Arc::new(pool);
        let handle = pool.submit(JOB.task(5)).unwrap();
        let canceller = {
            let (pool, id) = (Arc::clone(&pool), handle.id());
            thread::spawn(move || pool.cancel(id).unwrap())
        };
        let outcome = handle.wait();
        let cancel = canceller.join().unwrap();
        match cancel {
            CancelOutcome::Cancelled => {
                assert_eq!(outcome, Outcome::Cancelled(CancelReason::Requested));
                assert_eq!(
                    runs.load(Ordering::SeqCst),
                    0,
                    "a task cancelled before it started ran"
                );
            }
            CancelOutcome::Signalled => {
                // It was running: the cancel wins whatever the handler returned.
                assert_eq!(outcome, Outcome::Cancelled(CancelReason::Requested));
                assert_eq!(runs.load(Ordering::SeqCst), 1);
            }
            CancelOutcome::AlreadyFinished(state) => {
                assert_eq!(state, TaskState::Succeeded);
                assert_eq!(outcome, Outcome::Succeeded(5));
            }
            other => panic!("unexpected {other:?}"),
        }
        let report = pool.shutdown(Duration::from_secs(1));
        assert_eq!(report.succeeded + report.cancelled, 1);
    });
}

/// 5. A wait that begins before, during or after completion always returns.
#[test]
fn waits_always_return() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _clock) = pool(1, &runs);
        let handle = pool.submit(JOB.task(9)).unwrap();
        let waiter = {
            let handle = handle.clone();
            thread::spawn(move || handle.wait())
        };
        assert_eq!(handle.wait(), Outcome::Succeeded(9));
        assert_eq!(waiter.join().unwrap(), Outcome::Succeeded(9));
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 6. A dependent submitted while its dependency completes or fails: never early, never stranded.
#[test]
fn dependent_submitted_while_its_dependency_finishes() {
    for parent_payload in [0, 1] {
        model(move || {
            const STEP: TaskType<u32, u32> = TaskType::new("step");
            let parent_done = Arc::new(AtomicBool::new(false));
            let early = Arc::new(AtomicBool::new(false));
            let clock = ManualClock::new();
            let (done, seen_early) = (Arc::clone(&parent_done), Arc::clone(&early));
            let pool = Pool::builder()
                .workers(2)
                .seed(1)
                .max_attempts(1)
                .manual_clock(clock)
                .register(STEP, move |_, n: &u32| match *n {
                    0 => Err(HandlerError::permanent("parent fails")),
                    1 => {
                        done.store(true, Ordering::SeqCst);
                        Ok(1)
                    }
                    _ => {
                        if !done.load(Ordering::SeqCst) {
                            seen_early.store(true, Ordering::SeqCst);
                        }
                        Ok(2)
                    }
                })
                .build()
                .unwrap();
            let pool = Arc::new(pool);
            let parent = pool.submit(STEP.task(parent_payload)).unwrap();
            let child = {
                let pool = Arc::clone(&pool);
                let parent = parent.id();
                thread::spawn(move || pool.submit(STEP.task(2).after([parent])).unwrap())
            }
            .join()
            .unwrap();
            let parent_outcome = parent.wait();
            let child_outcome = child.wait();
            if parent_payload == 0 {
                assert!(parent_outcome.is_failed());
                assert_eq!(
                    child_outcome,
                    Outcome::Cancelled(CancelReason::DependencyFailed(parent.id()))
                );
            } else {
                assert_eq!(parent_outcome, Outcome::Succeeded(1));
                assert_eq!(child_outcome, Outcome::Succeeded(2));
            }
            assert!(
                !early.load(Ordering::SeqCst),
                "the dependent ran before its dependency succeeded"
            );
            pool.shutdown(Duration::from_secs(1));
        });
    }
}

/// 7. A task with an earlier run_at submitted while a worker sleeps until a later one: the worker
/// takes the earlier one when the manual clock reaches it.
#[test]
fn earlier_run_at_while_the_timer_sleeps() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, clock) = pool(1, &runs);
        let pool = Arc::new(pool);
        let late = pool
            .submit(JOB.task(2).delay(Duration::from_secs(10)))
            .unwrap();
        let early = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                pool.submit(JOB.task(1).delay(Duration::from_secs(1)))
                    .unwrap()
            })
        }
        .join()
        .unwrap();
        clock.advance(Duration::from_secs(1));
        assert_eq!(early.wait(), Outcome::Succeeded(1));
        assert_eq!(late.status(), TaskState::Scheduled);
        clock.advance(Duration::from_secs(9));
        assert_eq!(late.wait(), Outcome::Succeeded(2));
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 8. Two submits with the same idempotency key: one task, one run.
#[test]
fn same_key_submitted_twice() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _clock) = pool(1, &runs);
        let pool = Arc::new(pool);
        let other = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.submit(JOB.task(4).key("k")).unwrap())
        };
        let mine = pool.submit(JOB.task(4).key("k")).unwrap();
        let other = other.join().unwrap();
        assert_eq!(mine.id(), other.id());
        assert_eq!(mine.wait(), Outcome::Succeeded(4));
        assert_eq!(other.wait(), Outcome::Succeeded(4));
        pool.shutdown(Duration::from_secs(1));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    });
}

/// 9. The shutdown deadline firing while a handler runs: the handler sees its token, the task
/// ends cancelled.
#[test]
fn shutdown_deadline_while_a_handler_runs() {
    model(|| {
        const BLOCK: TaskType<(), bool> = TaskType::new("block");
        let started = Arc::new(Signal::default());
        let saw_token = Arc::new(AtomicBool::new(false));
        let (signal, saw) = (Arc::clone(&started), Arc::clone(&saw_token));
        let pool = Pool::builder()
            .workers(1)
            .seed(1)
            .manual_clock(ManualClock::new())
            .register(BLOCK, move |ctx, _: &()| {
                signal.add();
                ctx.token().wait();
                saw.store(true, Ordering::SeqCst);
                Ok::<_, HandlerError>(true)
            })
            .build()
            .unwrap();
        let handle = pool.submit(BLOCK.task(())).unwrap();
        started.wait_for(1);
        let report = pool.shutdown(Duration::ZERO);
        assert!(report.deadline_reached);
        assert!(saw_token.load(Ordering::SeqCst));
        assert_eq!(handle.wait(), Outcome::Cancelled(CancelReason::Shutdown));
        assert_eq!(report.cancelled, 1);
    });
}

/// 10. A dependency's outcome is published before its dependent can start: the dependent's
/// handler reads it from the dependency's handle without waiting.
#[test]
fn a_dependent_sees_its_dependency_s_outcome() {
    model(|| {
        const PRODUCE: TaskType<u32, u32> = TaskType::new("produce");
        const CONSUME: TaskType<tasq::TaskHandle<u32>, bool> = TaskType::new("consume");
        let pool = Pool::builder()
            .workers(2)
            .seed(1)
            .manual_clock(ManualClock::new())
            .register(PRODUCE, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .register(CONSUME, |_, parent: &tasq::TaskHandle<u32>| {
                Ok::<_, HandlerError>(parent.try_wait() == Some(Outcome::Succeeded(3)))
            })
            .build()
            .unwrap();
        let parent = pool.submit(PRODUCE.task(3)).unwrap();
        let child = pool
            .submit(CONSUME.task(parent.clone()).after([parent.id()]))
            .unwrap();
        assert_eq!(
            child.wait(),
            Outcome::Succeeded(true),
            "the dependent ran before the outcome was published"
        );
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 11. A cancel racing a handler that waits on its token: whether the cancel lands before the
/// task starts, before the handler waits or while it waits, the wait ends and the task ends
/// cancelled.
#[test]
fn cancel_races_a_handler_waiting_on_its_token() {
    model(|| {
        const WAITS: TaskType<(), ()> = TaskType::new("waits");
        let pool = Pool::builder()
            .workers(1)
            .seed(1)
            .manual_clock(ManualClock::new())
            .register(WAITS, |ctx, _: &()| {
                ctx.token().wait();
                Ok::<_, HandlerError>(())
            })
            .build()
            .unwrap();
        let handle = pool.submit(WAITS.task(())).unwrap();
        let canceller = {
            let handle = handle.clone();
            thread::spawn(move || handle.cancel().unwrap())
        };
        assert_eq!(handle.wait(), Outcome::Cancelled(CancelReason::Requested));
        assert!(matches!(
            canceller.join().unwrap(),
            CancelOutcome::Cancelled | CancelOutcome::Signalled
        ));
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 12. `wait_idle` and `wait_empty` racing the workers that finish the last tasks: they return,
/// and only once every task submitted before them has finished.
#[test]
fn waits_for_the_pool_return_once_the_work_is_done() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _clock) = pool(2, &runs);
        let first = pool.submit(JOB.task(1)).unwrap();
        let second = pool.submit(JOB.task(2)).unwrap();
        pool.wait_idle();
        assert!(first.is_finished() && second.is_finished());
        let third = pool.submit(JOB.task(3)).unwrap();
        pool.wait_empty(None).unwrap();
        assert!(third.is_finished());
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 13. A task held by a rate limit while the worker goes to sleep: the manual clock reaching its
/// token wakes a worker for it (the gate's time is a due time of the timer).
#[test]
fn a_task_held_by_a_rate_limit_starts_when_its_token_comes() {
    model(|| {
        const RATED: TaskType<u32, u32> = TaskType::new("rated");
        let clock = ManualClock::new();
        let pool = Pool::builder()
            .workers(1)
            .seed(1)
            .manual_clock(clock.clone())
            .register_with(
                RATED,
                TypeOptions::new().rate_limit(RateLimit::per_second(1.0)),
                |_, n: &u32| Ok::<_, HandlerError>(*n),
            )
            .build()
            .unwrap();
        let first = pool.submit(RATED.task(1)).unwrap();
        let second = pool.submit(RATED.task(2)).unwrap();
        assert_eq!(first.wait(), Outcome::Succeeded(1));
        let advancer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(Duration::from_secs(1)))
        };
        assert_eq!(second.wait(), Outcome::Succeeded(2));
        advancer.join().unwrap();
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 14. A task held by a concurrency limit while the other worker runs the type's one slot: the
/// run's end releases it, whichever worker is asleep by then.
#[test]
fn a_task_held_by_a_concurrency_limit_starts_when_the_slot_frees() {
    model(|| {
        const LIMITED: TaskType<u32, u32> = TaskType::new("limited");
        let pool = Pool::builder()
            .workers(2)
            .seed(1)
            .manual_clock(ManualClock::new())
            .register_with(
                LIMITED,
                TypeOptions::new().concurrency_limit(1),
                |_, n: &u32| Ok::<_, HandlerError>(*n),
            )
            .build()
            .unwrap();
        let first = pool.submit(LIMITED.task(1)).unwrap();
        let second = pool.submit(LIMITED.task(2)).unwrap();
        assert_eq!(first.wait(), Outcome::Succeeded(1));
        assert_eq!(second.wait(), Outcome::Succeeded(2));
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 14b. Lanes (`Builder::queue`): a task of a queue with one worker of its own is held while
/// that lane's one slot runs, and its run's end releases it; the shared worker takes the other
/// queue's task meanwhile, whichever worker is asleep when.
#[test]
fn a_task_held_by_its_lane_starts_when_the_lane_s_worker_frees() {
    model(|| {
        const SLOW: TaskType<u32, u32> = TaskType::new("slow");
        let pool = Pool::builder()
            .workers(1)
            .queue("slow", 1)
            .seed(1)
            .manual_clock(ManualClock::new())
            .register_with(SLOW, TypeOptions::new().queue("slow"), |_, n: &u32| {
                Ok::<_, HandlerError>(*n)
            })
            .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .build()
            .unwrap();
        let first = pool.submit(SLOW.task(1)).unwrap();
        let second = pool.submit(SLOW.task(2)).unwrap();
        let other = pool.submit(JOB.task(3)).unwrap();
        assert_eq!(other.wait(), Outcome::Succeeded(3));
        assert_eq!(first.wait(), Outcome::Succeeded(1));
        assert_eq!(second.wait(), Outcome::Succeeded(2));
        assert_eq!(pool.check_invariants(), Ok(()));
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 14c. A queue limit lifted while a worker holds a task back at it (or is about to): the lift
/// releases the held task and wakes a worker for it, whichever worker is asleep by then.
#[test]
fn a_task_held_by_a_queue_limit_starts_when_the_limit_is_lifted() {
    model(|| {
        let pool = Arc::new(
            Pool::builder()
                .workers(2)
                .seed(1)
                .manual_clock(ManualClock::new())
                .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
                .build()
                .unwrap(),
        );
        assert_eq!(pool.set_queue_limit(tasq::DEFAULT_QUEUE, Some(1)), Ok(None));
        let first = pool.submit(JOB.task(1)).unwrap();
        let second = pool.submit(JOB.task(2)).unwrap();
        let lifter = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.set_queue_limit(tasq::DEFAULT_QUEUE, None))
        };
        assert_eq!(first.wait(), Outcome::Succeeded(1));
        assert_eq!(second.wait(), Outcome::Succeeded(2));
        assert_eq!(lifter.join().unwrap(), Ok(Some(1)));
        assert_eq!(pool.check_invariants(), Ok(()));
        pool.shutdown(Duration::from_secs(1));
    });
}

// ===== the intake (src/store/memory/intake.rs) =====
//
// Every model above submits through the intake too: 1 races a submit with the worker going to
// sleep, 3 a submit with shutdown (a producer between taking its id and announcing its task), 4
// a cancel with the worker moving the task in. These add two producers at once, and a submit
// while the only worker sleeps as the timer.

/// 15. Two producers submit while the one worker goes to sleep: one of them wakes it (the other
/// sees a searcher on its way, or no sleeper), and both tasks run.
#[test]
fn two_producers_race_a_worker_going_to_sleep() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _clock) = pool(1, &runs);
        let pool = Arc::new(pool);
        let other = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.submit(JOB.task(1)).unwrap().wait())
        };
        let mine = pool.submit(JOB.task(2)).unwrap();
        assert_eq!(mine.wait(), Outcome::Succeeded(2));
        assert_eq!(other.join().unwrap(), Outcome::Succeeded(1));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        let report = pool.shutdown(Duration::from_secs(1));
        assert_eq!(report.succeeded, 2);
    });
}

/// 16. A submit while the only worker sleeps as the timer (a delayed task is due later): the
/// submit wakes it, it runs the new task, and it still runs the delayed one when it is due.
#[test]
fn a_submit_wakes_the_timer() {
    model(|| {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, clock) = pool(1, &runs);
        let pool = Arc::new(pool);
        let later = pool
            .submit(JOB.task(2).delay(Duration::from_secs(10)))
            .unwrap();
        let now = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.submit(JOB.task(1)).unwrap().wait())
        };
        assert_eq!(now.join().unwrap(), Outcome::Succeeded(1));
        assert_eq!(later.status(), TaskState::Scheduled);
        clock.advance(Duration::from_secs(10));
        assert_eq!(later.wait(), Outcome::Succeeded(2));
        pool.shutdown(Duration::from_secs(1));
    });
}

/// An output that counts its drops.
#[derive(Clone, Debug)]
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const COUNTED: TaskType<(), Counted> = TaskType::new("counted");

/// One worker, retention 0 (a task is forgotten as it finishes), a task type whose output
/// counts its drops in `drops`, and `JOB`.
fn forgetful_pool(drops: &Arc<AtomicUsize>) -> Pool {
    let drops = Arc::clone(drops);
    Pool::builder()
        .workers(1)
        .seed(1)
        .retention(0, None)
        .manual_clock(ManualClock::new())
        .register(COUNTED, move |_, _: &()| {
            Ok::<_, HandlerError>(Counted(Arc::clone(&drops)))
        })
        .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .expect("pool builds")
}

/// 17. A plain submit's handle reads its task (it has no completion yet) while the worker runs
/// it and retention forgets it: the read finds the outcome in the record or among the orphans,
/// and nothing is kept once the handle is gone.
#[test]
fn an_unread_handle_reads_while_its_task_is_forgotten() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let pool = forgetful_pool(&drops);
        let handle = pool.submit(COUNTED.task(())).unwrap();
        assert!(handle.wait().is_succeeded());
        pool.shutdown(Duration::from_secs(1));
        pool.check_invariants().unwrap();
        let before = drops.load(Ordering::SeqCst);
        drop(handle);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            before + 1,
            "the handle held the last reference to the output"
        );
    });
}

/// 18. A plain submit's handle is dropped unread while the worker finishes the task before it,
/// then takes its task in, runs it and forgets it: whichever comes first (the drop taken in
/// before the task, before its end, or after retention kept its output as an orphan), the
/// output is dropped exactly once, by the shutdown at the latest.
#[test]
fn an_unread_handle_dropped_while_its_task_runs() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let pool = Arc::new(forgetful_pool(&drops));
        let first = pool.submit(JOB.task(1)).unwrap();
        let handle = pool.submit(COUNTED.task(())).unwrap();
        let dropper = thread::spawn(move || drop(handle));
        assert_eq!(first.wait(), Outcome::Succeeded(1));
        pool.wait_idle();
        dropper.join().unwrap();
        pool.shutdown(Duration::from_secs(1));
        pool.check_invariants().unwrap();
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "the output is dropped once"
        );
    });
}

const SIGNAL: TaskType<Arc<Signal>, ()> = TaskType::new("signal");

fn signal_pool() -> Pool {
    Pool::builder()
        .workers(1)
        .register(SIGNAL, |_, signal: &Arc<Signal>| {
            signal.add();
            Ok::<_, HandlerError>(())
        })
        .build()
        .expect("pool builds")
}

/// 19. A fire-and-forget submit racing the one worker going to sleep, awaited without the pool
/// (a handle's first read moves the intake in and wakes a worker itself, so the models above
/// would pass even if the submit never woke anyone): the submit's own announcement must wake
/// the worker, or the worker must see it pending before it sleeps. Fails when `try_sleep`
/// ignores a pending entry, or when a submit never wakes a sleeper.
#[test]
fn a_fire_and_forget_submit_wakes_the_worker_by_itself() {
    model(|| {
        let pool = signal_pool();
        let signal = Arc::new(Signal::default());
        drop(pool.submit(SIGNAL.task(Arc::clone(&signal))).unwrap());
        signal.wait_for(1);
        pool.shutdown(Duration::from_secs(1));
    });
}

/// 20. Two fire-and-forget submits from two threads racing the one worker going to sleep,
/// awaited without the pool: one announcement wakes the worker, the other finds it on its way
/// (a searcher) or awake, and both tasks run.
#[test]
fn two_fire_and_forget_submits_wake_the_worker_by_themselves() {
    model(|| {
        let pool = Arc::new(signal_pool());
        let signal = Arc::new(Signal::default());
        let other = {
            let (pool, signal) = (Arc::clone(&pool), Arc::clone(&signal));
            thread::spawn(move || drop(pool.submit(SIGNAL.task(signal)).unwrap()))
        };
        drop(pool.submit(SIGNAL.task(Arc::clone(&signal))).unwrap());
        other.join().unwrap();
        signal.wait_for(2);
        pool.shutdown(Duration::from_secs(1));
    });
}

// ===== direct runs (src/store/memory/slots.rs) =====
//
// A plain task due at once, of an ungated type, runs from the worker's slot without the pool's
// lock, and a success with a unit output leaves no record (every fire-and-forget model above
// runs that way too). These race the lookups that must still find such a task.

/// 21. A lookup by id racing the worker taking a plain task from the intake into its slot and
/// running it without the lock: the lookup finds the task (ready, running or succeeded),
/// never nothing. Fails when a worker pops the intake without holding its slot's lock (rule 1
/// of `slots.rs`), or a lookup takes the slots before the intake (rule 3).
#[test]
fn a_lookup_finds_a_task_a_worker_takes_without_the_lock() {
    model(|| {
        let pool = Arc::new(signal_pool());
        let signal = Arc::new(Signal::default());
        let id = pool.submit(SIGNAL.task(Arc::clone(&signal))).unwrap().id();
        let looker = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.status(id))
        };
        let seen = looker.join().unwrap();
        assert!(seen.is_some(), "the lookup lost {id}");
        signal.wait_for(1);
        pool.shutdown(Duration::from_secs(1));
        pool.check_invariants().unwrap();
        assert_eq!(pool.status(id), Some(TaskState::Succeeded));
    });
}

/// 22. A lookup and a handle's first read racing the end of a direct run (the success going
/// into the worker's done buffer, then into the state): the task is running or succeeded,
/// never unknown, and the handle reads a success. Fails when a direct task leaves its slot
/// before its success is in the done buffer under the same lock (rule 5 of `slots.rs`).
#[test]
fn a_lookup_races_the_end_of_a_direct_run() {
    model(|| {
        let pool = Arc::new(signal_pool());
        let signal = Arc::new(Signal::default());
        let handle = pool.submit(SIGNAL.task(Arc::clone(&signal))).unwrap();
        let id = handle.id();
        signal.wait_for(1);
        let reader = thread::spawn(move || handle.wait());
        let seen = pool.status(id);
        assert!(
            matches!(seen, Some(TaskState::Running | TaskState::Succeeded)),
            "{id} was {seen:?}"
        );
        assert_eq!(reader.join().unwrap(), Outcome::Succeeded(()));
        pool.shutdown(Duration::from_secs(1));
        pool.check_invariants().unwrap();
    });
}
