//! Dropping a pool without `shutdown`: nothing hangs, queued tasks end cancelled, running
//! handlers see their tokens fire, and the worker threads exit.

mod support_b;

use std::thread;
use std::time::Duration;

use support_b::{
    DropSignal, Latch, assert_threads_gone, assert_threads_named, finished, recv, wait,
};
use tasq::{CancelError, CancelReason, ManualClock, Outcome, Pool, TaskState, TaskType};

const STUCK: TaskType<(), ()> = TaskType::new("stuck");
const JOB: TaskType<u32, u32> = TaskType::new("job");

#[test]
fn dropping_a_pool_cancels_queued_tasks_fires_tokens_and_lets_workers_exit() {
    let (gone_tx, gone) = crossbeam_channel::unbounded();
    let (started_tx, started) = crossbeam_channel::unbounded();
    let (fired_tx, fired) = crossbeam_channel::unbounded();
    let (ran_tx, ran) = crossbeam_channel::unbounded::<u32>();
    let pool = Pool::builder()
        .workers(2)
        .thread_name("tqdrop-main")
        .register(STUCK, {
            // Dropped with the registry, that is once the last worker has let go of the pool.
            let signal = DropSignal(gone_tx);
            move |ctx, _: &()| {
                let _owned = &signal;
                started_tx.send(ctx.id()).unwrap();
                ctx.token().wait();
                fired_tx.send(ctx.id()).unwrap();
                Ok(())
            }
        })
        .register(JOB, move |_, n: &u32| {
            ran_tx.send(*n).unwrap();
            Ok(*n)
        })
        .build()
        .unwrap();
    let stuck: Vec<_> = (0..2)
        .map(|_| pool.submit(STUCK.task(())).unwrap())
        .collect();
    for _ in &stuck {
        recv(&started, "both stuck handlers to start");
    }
    let queued: Vec<_> = (0..3).map(|n| pool.submit(JOB.task(n)).unwrap()).collect();
    let delayed = pool
        .submit(JOB.task(10).delay(Duration::from_secs(3600)))
        .unwrap();
    let blocked = pool.submit(JOB.task(11).after([delayed.id()])).unwrap();
    let after_running = pool.submit(JOB.task(12).after([stuck[0].id()])).unwrap();
    if cfg!(target_os = "linux") {
        assert_threads_named("tqdrop-main", 2);
    }

    drop(pool);

    // Whatever had not started is cancelled before drop returns.
    for handle in queued.iter().chain([&delayed, &blocked, &after_running]) {
        assert_eq!(
            finished(handle),
            Outcome::Cancelled(CancelReason::Shutdown),
            "{:?}",
            handle.id()
        );
    }
    for _ in &stuck {
        recv(&fired, "the running handlers to see their tokens fire");
    }
    for handle in &stuck {
        assert_eq!(wait(handle), Outcome::Cancelled(CancelReason::Shutdown));
    }
    recv(&gone, "the workers to release the pool");
    assert!(ran.is_empty(), "a queued task ran after the drop");
    assert_eq!(stuck[0].cancel(), Err(CancelError::PoolGone(stuck[0].id())));
    assert_eq!(stuck[0].status(), TaskState::Cancelled);
    if cfg!(target_os = "linux") {
        assert_threads_gone("tqdrop-main");
    }
}

#[test]
fn dropping_an_idle_pool_lets_its_workers_exit() {
    let (gone_tx, gone) = crossbeam_channel::unbounded();
    let signal = DropSignal(gone_tx);
    let pool = Pool::builder()
        .workers(4)
        .thread_name("tqdrop-idle")
        .register(JOB, move |_, n: &u32| {
            let _owned = &signal;
            Ok(*n)
        })
        .build()
        .unwrap();
    assert_eq!(
        wait(&pool.submit(JOB.task(1)).unwrap()),
        Outcome::Succeeded(1)
    );
    // One worker sleeps as the timer until this is due, the others wait for work.
    let delayed = pool
        .submit(JOB.task(2).delay(Duration::from_secs(3600)))
        .unwrap();

    drop(pool);

    assert_eq!(
        finished(&delayed),
        Outcome::Cancelled(CancelReason::Shutdown)
    );
    recv(&gone, "the idle workers to exit");
    if cfg!(target_os = "linux") {
        assert_threads_gone("tqdrop-idle");
    }
}

#[test]
fn dropping_a_pool_does_not_wait_for_a_handler_that_ignores_its_token() {
    let (gone_tx, gone) = crossbeam_channel::unbounded();
    let (started_tx, started) = crossbeam_channel::unbounded();
    let release = Latch::new();
    let pool = Pool::builder()
        .workers(1)
        .register(STUCK, {
            let (signal, release) = (DropSignal(gone_tx), release.clone());
            move |_, _: &()| {
                let _owned = &signal;
                started_tx.send(()).unwrap();
                release.wait();
                Ok(())
            }
        })
        .build()
        .unwrap();
    let deaf = pool.submit(STUCK.task(())).unwrap();
    recv(&started, "the handler to start");

    // Dropped on another thread, so a hang fails the test instead of stalling it.
    let (dropped_tx, dropped) = crossbeam_channel::unbounded();
    thread::spawn(move || {
        drop(pool);
        dropped_tx.send(()).unwrap();
    });
    recv(&dropped, "drop to return");
    assert!(
        gone.is_empty(),
        "the registry went while its handler still ran"
    );
    assert_eq!(deaf.try_wait(), None);

    release.open();
    assert_eq!(
        wait(&deaf),
        Outcome::Cancelled(CancelReason::Shutdown),
        "its handler returned Ok after the drop"
    );
    recv(&gone, "the worker to exit once its handler returned");
}

#[test]
fn dropping_a_pool_wakes_a_handler_sleeping_on_a_manual_clock() {
    let clock = ManualClock::new();
    let (gone_tx, gone) = crossbeam_channel::unbounded();
    let (started_tx, started) = crossbeam_channel::unbounded();
    let (slept_tx, slept) = crossbeam_channel::unbounded();
    let pool = Pool::builder()
        .workers(1)
        .manual_clock(clock.clone())
        .register(STUCK, {
            let signal = DropSignal(gone_tx);
            move |ctx, _: &()| {
                let _owned = &signal;
                started_tx.send(()).unwrap();
                slept_tx.send(ctx.sleep(Duration::from_secs(3600))).unwrap();
                Ok(())
            }
        })
        .build()
        .unwrap();
    let sleeper = pool.submit(STUCK.task(())).unwrap();
    recv(&started, "the handler to start");

    drop(pool);

    assert_eq!(
        recv(&slept, "the sleep to end"),
        Err(tasq::Cancelled),
        "the sleep ended without its token firing"
    );
    assert_eq!(wait(&sleeper), Outcome::Cancelled(CancelReason::Shutdown));
    recv(&gone, "the worker to exit");
}

#[test]
fn a_thread_blocked_in_wait_returns_when_the_pool_is_dropped() {
    let pool = Pool::builder()
        .workers(1)
        .register(JOB, |_, n: &u32| Ok(*n))
        .build()
        .unwrap();
    let delayed = pool
        .submit(JOB.task(1).delay(Duration::from_secs(3600)))
        .unwrap();
    let (outcome_tx, outcome) = crossbeam_channel::unbounded();
    let (waiting_tx, waiting) = crossbeam_channel::unbounded();
    let waiter = {
        let delayed = delayed.clone();
        thread::spawn(move || {
            waiting_tx.send(()).unwrap();
            outcome_tx.send(delayed.wait()).unwrap();
        })
    };
    recv(&waiting, "the waiter to start");

    drop(pool);

    assert_eq!(
        recv(&outcome, "the waiter to return"),
        Outcome::Cancelled(CancelReason::Shutdown)
    );
    waiter.join().unwrap();
}
