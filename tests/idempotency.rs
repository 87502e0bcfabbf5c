//! Idempotency keys: concurrent submits of one key make one task; a key is free again only once
//! retention has forgotten its task.

mod support_a;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use support_a::{GATE, finish, gate, gate_handler};
use tasq::{HandlerError, Outcome, Pool, TaskState, TaskType};

/// Counts its runs; returns the payload and the run number.
const CHARGE: TaskType<u32, (u32, usize)> = TaskType::new("charge");

fn pool(workers: usize, retention: Option<usize>) -> (Pool, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let mut builder = Pool::builder()
        .workers(workers)
        .register(GATE, gate_handler)
        .register(CHARGE, move |_, &cents: &u32| {
            let run = counter.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, HandlerError>((cents, run))
        });
    if let Some(max_count) = retention {
        builder = builder.retention(max_count, None);
    }
    (builder.build().expect("build the pool"), runs)
}

#[test]
fn sixteen_threads_submitting_one_key_at_once_make_one_task() {
    const THREADS: usize = 16;
    let (pool, runs) = pool(1, None);
    let pool = Arc::new(pool);
    // Hold the worker, so the task cannot start, let alone finish, while the submits race.
    let (gate, gate_task) = gate();
    let _ = pool.submit(GATE.task(gate_task)).unwrap();
    gate.wait_started();

    let start = Arc::new(Barrier::new(THREADS));
    let submitters: Vec<_> = (0..THREADS)
        .map(|i| {
            let pool = Arc::clone(&pool);
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                // Each thread offers its own payload: only the first submit's may run.
                pool.submit(CHARGE.task(500 + i as u32).key("order-17"))
                    .expect("submit")
            })
        })
        .collect();
    let handles: Vec<_> = submitters.into_iter().map(|t| t.join().unwrap()).collect();

    let id = handles[0].id();
    assert!(handles.iter().all(|h| h.id() == id), "one task for one key");
    assert_eq!(pool.stats().totals.submitted, 2, "the gate and one charge");
    assert_eq!(pool.stats().ready, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    gate.open();
    let outcomes: Vec<_> = handles.iter().map(finish).collect();
    let Outcome::Succeeded((cents, 1)) = outcomes[0] else {
        panic!("unexpected {:?}", outcomes[0]);
    };
    assert!((500..500 + THREADS as u32).contains(&cents));
    assert!(outcomes.iter().all(|o| *o == outcomes[0]), "{outcomes:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran exactly once"
    );
}

#[test]
fn a_remembered_key_keeps_returning_its_finished_task() {
    let (pool, runs) = pool(1, None);
    let first = pool.submit(CHARGE.task(100).key("k")).unwrap();
    assert_eq!(finish(&first), Outcome::Succeeded((100, 1)));

    let again = pool.submit(CHARGE.task(999).key("k")).unwrap();
    assert_eq!(again.id(), first.id());
    assert!(again.is_finished());
    assert_eq!(finish(&again), Outcome::Succeeded((100, 1)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(pool.stats().totals.submitted, 1);
}

#[test]
fn a_key_is_reusable_once_retention_forgot_its_task() {
    let (pool, runs) = pool(1, Some(0));
    let first = pool.submit(CHARGE.task(100).key("k")).unwrap();
    assert_eq!(finish(&first), Outcome::Succeeded((100, 1)));
    assert_eq!(pool.status(first.id()), None, "retention 0 forgets at once");

    let second = pool.submit(CHARGE.task(200).key("k")).unwrap();
    assert_ne!(second.id(), first.id());
    assert_eq!(finish(&second), Outcome::Succeeded((200, 2)));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The forgotten task's handle still has its outcome.
    assert_eq!(finish(&first), Outcome::Succeeded((100, 1)));
}

#[test]
fn a_key_stays_taken_until_its_task_is_the_oldest_beyond_retention() {
    let (pool, runs) = pool(1, Some(1));
    let keyed = pool.submit(CHARGE.task(1).key("k")).unwrap();
    finish(&keyed);
    // Still remembered (one record kept): deduplicated.
    assert_eq!(
        pool.submit(CHARGE.task(2).key("k")).unwrap().id(),
        keyed.id()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Another task finishing pushes the keyed one out.
    finish(&pool.submit(CHARGE.task(3)).unwrap());
    assert_eq!(pool.status(keyed.id()), None);
    let fresh = pool.submit(CHARGE.task(4).key("k")).unwrap();
    assert_ne!(fresh.id(), keyed.id());
    assert_eq!(finish(&fresh), Outcome::Succeeded((4, 3)));
}

#[test]
fn a_key_of_an_unfinished_task_is_deduplicated_whatever_its_state() {
    let (pool, runs) = pool(1, Some(0));
    let (gate, gate_task) = gate();
    let _ = pool.submit(GATE.task(gate_task)).unwrap();
    gate.wait_started();
    // Ready, behind the gate: retention 0 does not touch unfinished tasks.
    let queued = pool.submit(CHARGE.task(1).key("k")).unwrap();
    assert_eq!(queued.status(), TaskState::Ready);
    let again = pool.submit(CHARGE.task(2).key("k")).unwrap();
    assert_eq!(again.id(), queued.id());
    gate.open();
    assert_eq!(finish(&again), Outcome::Succeeded((1, 1)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
