//! Wake-ups: a burst of long tasks gets every worker running, even though the pool wakes only a
//! few sleepers at a time (as many as there are CPUs) and lets each woken worker wake the next.

use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use tasq::{HandlerError, Pool, TaskType};

const WAIT: Duration = Duration::from_secs(10);

/// Says it started, then holds its worker until the test lets go.
const HOLD: TaskType<(Sender<()>, Receiver<()>), ()> = TaskType::new("hold");

fn pool(workers: usize) -> Pool {
    Pool::builder()
        .workers(workers)
        .register(
            HOLD,
            |_, (started, release): &(Sender<()>, Receiver<()>)| {
                started.send(()).unwrap();
                release
                    .recv_timeout(WAIT)
                    .map_err(|_| HandlerError::permanent("never released"))
            },
        )
        .build()
        .unwrap()
}

/// Submits `tasks` holding tasks at once and checks that `tasks` workers run them together.
fn all_start_together(workers: usize, tasks: usize) {
    let pool = pool(workers);
    let (started_tx, started) = crossbeam_channel::unbounded();
    let (release_tx, release) = crossbeam_channel::unbounded();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            pool.submit(HOLD.task((started_tx.clone(), release.clone())))
                .unwrap()
        })
        .collect();
    // None can finish before it is released: each start is a worker busy at the same time.
    for n in 0..tasks {
        started
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("only {n} of {tasks} tasks started"));
    }
    assert_eq!(pool.stats().running, tasks);
    for _ in 0..tasks {
        release_tx.send(()).unwrap();
    }
    for handle in handles {
        assert!(handle.wait().is_succeeded());
    }
}

#[test]
fn a_burst_gets_every_worker_running() {
    all_start_together(32, 32);
}

#[test]
fn a_burst_larger_than_the_pool_keeps_every_worker_busy() {
    // 48 tasks, 16 workers: the first 16 start together, the rest as workers free up.
    let pool = pool(16);
    let (started_tx, started) = crossbeam_channel::unbounded();
    let (release_tx, release) = crossbeam_channel::unbounded();
    let handles: Vec<_> = (0..48)
        .map(|_| {
            pool.submit(HOLD.task((started_tx.clone(), release.clone())))
                .unwrap()
        })
        .collect();
    for n in 0..16 {
        started
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("only {n} of 16 workers started a task"));
    }
    assert_eq!(pool.stats().running, 16);
    for _ in 0..48 {
        release_tx.send(()).unwrap();
    }
    for handle in handles {
        assert!(handle.wait().is_succeeded());
    }
    assert_eq!(started.try_iter().count(), 32);
}

#[test]
fn tasks_submitted_one_by_one_to_idle_workers_all_run_together() {
    // Each submit finds the others' workers busy and the rest asleep.
    let pool = pool(8);
    let (started_tx, started) = crossbeam_channel::unbounded();
    let (release_tx, release) = crossbeam_channel::unbounded();
    let mut handles = Vec::new();
    for n in 0..8 {
        handles.push(
            pool.submit(HOLD.task((started_tx.clone(), release.clone())))
                .unwrap(),
        );
        started
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("task {n} did not start while {n} others ran"));
    }
    for _ in 0..8 {
        release_tx.send(()).unwrap();
    }
    for handle in handles {
        assert!(handle.wait().is_succeeded());
    }
}
