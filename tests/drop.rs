//! Dropping a pool without `shutdown`: nothing hangs, queued tasks end cancelled, running
//! handlers see their tokens fire, and the worker threads exit. On both stores where they
//! agree; a dropped durable pool cancels nothing, and leaves what has not started in the
//! database.

mod support_b;
mod support_store;

use std::thread;
use std::time::Duration;

use support_b::{
    DropSignal, Latch, assert_threads_gone, assert_threads_named, finished, recv, wait,
};
use support_store::Store;
use tasq::{CancelError, CancelReason, ManualClock, Outcome, Pool, TaskState, TaskType};

const STUCK: TaskType<(), ()> = TaskType::new("stuck");
const JOB: TaskType<u32, u32> = TaskType::new("job");

/// How a task ends whose handler returned `Ok` after the drop fired its token: the embedded
/// store cancels it; the durable store cancels nothing in the database, so the handler's
/// result stands.
fn interrupted(store: Store) -> Outcome<()> {
    match store {
        Store::Memory => Outcome::Cancelled(CancelReason::Shutdown),
        Store::Postgres => Outcome::Succeeded(()),
    }
}

// Embedded only: a dropped durable pool cancels nothing (see the durable variant below).
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

// Embedded only: a dropped durable pool leaves its delayed task in the database.
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

// Embedded only: a dropped durable pool leaves the delayed task in the database, so there is
// no outcome for the waiter to return.
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

conformance! {
    fn dropping_a_pool_does_not_wait_for_a_handler_that_ignores_its_token(builder) {
        let store = builder.store();
        let (gone_tx, gone) = crossbeam_channel::unbounded();
        let (started_tx, started) = crossbeam_channel::unbounded();
        let release = Latch::new();
        let mut pool = builder
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
            .build();
        let deaf = pool.submit(STUCK.task(())).unwrap();
        recv(&started, "the handler to start");

        // Dropped on another thread, so a hang fails the test instead of stalling it.
        let (dropped_tx, dropped) = crossbeam_channel::unbounded();
        let taken = pool.take();
        thread::spawn(move || {
            drop(taken);
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
            interrupted(store),
            "its handler returned Ok after the drop"
        );
        recv(&gone, "the worker to exit once its handler returned");
    }

    fn dropping_a_pool_wakes_a_handler_sleeping_on_a_manual_clock(builder) {
        let store = builder.store();
        let clock = ManualClock::new();
        let (gone_tx, gone) = crossbeam_channel::unbounded();
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (slept_tx, slept) = crossbeam_channel::unbounded();
        let mut pool = builder
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
            .build();
        let sleeper = pool.submit(STUCK.task(())).unwrap();
        recv(&started, "the handler to start");

        drop(pool.take());

        assert_eq!(
            recv(&slept, "the sleep to end"),
            Err(tasq::Cancelled),
            "the sleep ended without its token firing"
        );
        assert_eq!(wait(&sleeper), interrupted(store));
        recv(&gone, "the worker to exit");
    }
}

// ===== the durable store: a drop cancels nothing in the database =====

#[cfg(feature = "postgres")]
mod durable {
    use super::*;
    use support_store::TestBuilder;
    use tasq::TaskId;

    /// A task's row: its status, whether it is due, and whether it holds a lease.
    fn row(sql: &mut ::postgres::Client, id: TaskId) -> (String, bool, bool) {
        let seq = i64::try_from(id.seq()).unwrap();
        let row = sql
            .query_one(
                "SELECT status, run_at <= now(), lease_until IS NOT NULL
                 FROM tasq_tasks WHERE id = $1",
                &[&seq],
            )
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    fn ready(due: bool) -> (String, bool, bool) {
        ("ready".to_owned(), due, false)
    }

    /// Dropping a durable pool fires the running tokens and gives nothing up: the queued,
    /// delayed and blocked tasks stay in the database as they were, the running ones end as
    /// their handlers say, and the workers exit.
    #[test]
    fn dropping_a_durable_pool_fires_tokens_leaves_queued_tasks_and_lets_workers_exit() {
        let Some(builder) = TestBuilder::new(Store::Postgres) else {
            return;
        };
        let (gone_tx, gone) = crossbeam_channel::unbounded();
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (fired_tx, fired) = crossbeam_channel::unbounded();
        let (ran_tx, ran) = crossbeam_channel::unbounded::<u32>();
        let mut pool = builder
            .workers(2)
            .thread_name("tqdrop-pg".to_owned())
            .register(STUCK, {
                // Dropped with the registry, that is once the last thread has let go of the
                // pool.
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
            .build();
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
            assert_threads_named("tqdrop-pg", 2);
        }

        drop(pool.take());

        for _ in &stuck {
            recv(&fired, "the running handlers to see their tokens fire");
        }
        for handle in &stuck {
            assert_eq!(wait(handle), interrupted(Store::Postgres));
        }
        if cfg!(target_os = "linux") {
            assert_threads_gone("tqdrop-pg");
        }
        let mut sql = pool.sql().expect("a durable pool has rows");
        for handle in &queued {
            assert_eq!(row(&mut sql, handle.id()), ready(true), "{:?}", handle.id());
        }
        assert_eq!(row(&mut sql, delayed.id()), ready(false));
        let (status, _, leased) = row(&mut sql, blocked.id());
        assert_eq!((status.as_str(), leased), ("blocked", false));
        assert_eq!(
            row(&mut sql, after_running.id()),
            ready(true),
            "released by its parent's success"
        );
        for handle in queued.iter().chain([&delayed, &blocked, &after_running]) {
            assert_eq!(handle.try_wait(), None, "{:?}", handle.id());
        }
        // Handles to unfinished tasks keep the pool's maintenance thread (which publishes their
        // outcomes, whoever ends them) and so the registry; once they go, it exits.
        drop((queued, delayed, blocked, after_running));
        recv(&gone, "the pool's threads to release it");
        assert!(ran.is_empty(), "a queued task ran after the drop");
        assert_eq!(stuck[0].cancel(), Err(CancelError::PoolGone(stuck[0].id())));
        assert_eq!(stuck[0].status(), TaskState::Succeeded);
    }

    /// An idle durable pool's workers, fetcher and maintenance thread all exit when it is
    /// dropped; its delayed task stays in the database.
    #[test]
    fn dropping_an_idle_durable_pool_lets_its_threads_exit_and_leaves_its_delayed_task() {
        let Some(builder) = TestBuilder::new(Store::Postgres) else {
            return;
        };
        let (gone_tx, gone) = crossbeam_channel::unbounded();
        let signal = DropSignal(gone_tx);
        let mut pool = builder
            .workers(4)
            .thread_name("tqdrop-pgidl".to_owned())
            .register(JOB, move |_, n: &u32| {
                let _owned = &signal;
                Ok(*n)
            })
            .build();
        assert_eq!(
            wait(&pool.submit(JOB.task(1)).unwrap()),
            Outcome::Succeeded(1)
        );
        let delayed = pool
            .submit(JOB.task(2).delay(Duration::from_secs(3600)))
            .unwrap();

        drop(pool.take());

        if cfg!(target_os = "linux") {
            assert_threads_gone("tqdrop-pgidl");
        }
        assert_eq!(delayed.try_wait(), None);
        let mut sql = pool.sql().expect("a durable pool has rows");
        assert_eq!(row(&mut sql, delayed.id()), ready(false));
        // The maintenance thread stays while a handle may wait for an outcome.
        drop(delayed);
        recv(&gone, "the pool's threads to exit");
    }

    /// A thread blocked in `wait` on a task that a dropped durable pool left in the database
    /// returns once another pool (here on the same schema, in this process) runs the task.
    #[test]
    fn a_thread_blocked_in_wait_returns_when_another_pool_runs_the_task_after_the_drop() {
        let Some(builder) = TestBuilder::new(Store::Postgres) else {
            return;
        };
        let url = match &builder {
            TestBuilder::Postgres(_, db) => db.url.clone(),
            TestBuilder::Memory(_) => unreachable!("a durable builder"),
        };
        let mut pool = builder
            .workers(1)
            .register(JOB, |_, n: &u32| Ok(*n))
            .build();
        let delayed = pool
            .submit(JOB.task(1).delay(Duration::from_secs(3600)))
            .unwrap();
        let (outcome_tx, outcome) = crossbeam_channel::unbounded();
        let (waiting_tx, waiting) = crossbeam_channel::unbounded();
        {
            let delayed = delayed.clone();
            thread::spawn(move || {
                waiting_tx.send(()).unwrap();
                outcome_tx.send(delayed.wait()).unwrap();
            });
        }
        recv(&waiting, "the waiter to start");

        drop(pool.take());

        assert_eq!(delayed.status(), TaskState::Scheduled);
        assert!(
            outcome.is_empty(),
            "the waiter returned with the task still scheduled"
        );
        let clock = ManualClock::new();
        let other = Pool::builder()
            .postgres(url)
            .poll_interval(Duration::from_millis(100))
            .workers(1)
            .manual_clock(clock.clone())
            .register(JOB, |_, n: &u32| Ok::<_, tasq::HandlerError>(n * 10))
            .build()
            .unwrap();
        // An hour later for the other pool: the task is due.
        clock.advance(Duration::from_secs(3600));
        assert_eq!(
            recv(&outcome, "the waiter to return"),
            Outcome::Succeeded(10)
        );
        assert_eq!(other.shutdown(Duration::from_secs(10)).succeeded, 1);
    }
}
