//! Pauses on the durable store are the fleet's: a pause waits for the claims that could not see
//! it, then no claim anywhere takes what it covers; it lives in the database (pools built later
//! see it); the queue a row was submitted with decides, whatever the claiming pool registered;
//! and a resume wakes the fleet's idle workers at once, not at their next poll.

mod support_pg;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use support_pg::{TestDb, eventually};
use tasq::{HandlerError, PauseTarget, Pool, TaskState, TaskType, TypeOptions};

const SEND: TaskType<u32, u32> = TaskType::new("send");

/// Long enough that a test passing within it cannot be waiting for a poll.
const SLOW_POLL: Duration = Duration::from_secs(60);

fn producer(db: &TestDb, queue: &'static str) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(SEND, TypeOptions::new().queue(queue))
        .build()
        .unwrap()
}

fn worker(db: &TestDb, queue: &'static str, poll: Duration, runs: &Arc<AtomicU32>) -> Pool {
    let runs = Arc::clone(runs);
    Pool::builder()
        .postgres(db.url.clone())
        .workers(2)
        .poll_interval(poll)
        .register_with(SEND, TypeOptions::new().queue(queue), move |_, n: &u32| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, HandlerError>(*n)
        })
        .build()
        .unwrap()
}

fn statuses(pool: &Pool, ids: &[tasq::TaskId]) -> Vec<TaskState> {
    ids.iter().map(|&id| pool.status(id).unwrap()).collect()
}

#[test]
fn a_pause_waits_for_the_claims_in_flight_and_no_later_claim_takes_its_tasks() {
    let Some(db) = TestDb::new() else { return };
    let runs = Arc::new(AtomicU32::new(0));
    let producer = producer(&db, "mail");
    let worker = worker(&db, "mail", Duration::from_millis(50), &runs);
    // A claim in flight: it read the pauses (taking the fence, shared) and has not committed.
    let mut claim = db.client();
    let mut in_flight = claim.transaction().unwrap();
    in_flight.query("SELECT * FROM tasq_paused()", &[]).unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let pauser = {
        let url = db.url.clone();
        std::thread::spawn(move || {
            let pool = Pool::builder().postgres(url).workers(0).build().unwrap();
            done_tx
                .send(pool.pause(PauseTarget::queue("mail")))
                .unwrap();
        })
    };
    let mut watcher = db.client();
    eventually(10, "the pause waits for the fence", || {
        db.a_pool_waits_for_a_lock(&mut watcher)
    });
    assert!(
        done_rx.try_recv().is_err(),
        "the pause returned with a claim in flight"
    );
    in_flight.commit().unwrap();
    let paused = done_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(paused, Ok(true));
    pauser.join().unwrap();

    let ids: Vec<_> = (0..20)
        .map(|n| producer.submit(SEND.task(n)).unwrap().id())
        .collect();
    worker.wait_idle();
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(statuses(&producer, &ids), vec![TaskState::Ready; 20]);
    assert_eq!(producer.resume(PauseTarget::queue("mail")), Ok(true));
    eventually(10, "every task ran once resumed", || {
        statuses(&producer, &ids) == vec![TaskState::Succeeded; 20]
    });
    assert_eq!(runs.load(Ordering::SeqCst), 20);
    worker.check_invariants().unwrap();
}

#[test]
fn a_pause_lives_in_the_database_and_pools_built_later_obey_it() {
    let Some(db) = TestDb::new() else { return };
    let runs = Arc::new(AtomicU32::new(0));
    {
        let first = producer(&db, "mail");
        first.pause(PauseTarget::task_type("send")).unwrap();
    }
    let producer = producer(&db, "other");
    let listed: Vec<PauseTarget> = producer
        .paused()
        .unwrap()
        .into_iter()
        .map(|p| p.target)
        .collect();
    assert_eq!(listed, [PauseTarget::task_type("send")]);
    let ids: Vec<_> = (0..5)
        .map(|n| producer.submit(SEND.task(n)).unwrap().id())
        .collect();
    let worker = worker(&db, "other", Duration::from_millis(50), &runs);
    worker.wait_idle();
    assert_eq!(statuses(&producer, &ids), vec![TaskState::Ready; 5]);
    assert_eq!(worker.resume(PauseTarget::task_type("send")), Ok(true));
    eventually(10, "the tasks ran", || {
        statuses(&producer, &ids) == vec![TaskState::Succeeded; 5]
    });
}

#[test]
fn the_queue_a_task_was_submitted_with_decides_not_the_claiming_pool_s() {
    let Some(db) = TestDb::new() else { return };
    let runs = Arc::new(AtomicU32::new(0));
    // Submitted in queue `a`; the worker (another version) puts the type in queue `b`.
    let producer = producer(&db, "a");
    let worker = worker(&db, "b", Duration::from_millis(50), &runs);
    producer.pause(PauseTarget::queue("a")).unwrap();
    let ids: Vec<_> = (0..5)
        .map(|n| producer.submit(SEND.task(n)).unwrap().id())
        .collect();
    worker.wait_idle();
    assert_eq!(statuses(&producer, &ids), vec![TaskState::Ready; 5]);
    // Pausing the worker's own queue for the type holds nothing submitted in `a`.
    producer.pause(PauseTarget::queue("b")).unwrap();
    producer.resume(PauseTarget::queue("a")).unwrap();
    eventually(10, "the tasks ran", || {
        statuses(&producer, &ids) == vec![TaskState::Succeeded; 5]
    });
    let mut sql = db.client();
    let queues: Vec<String> = sql
        .query("SELECT DISTINCT queue FROM tasq_tasks", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(queues, ["a"]);
}

#[test]
fn a_resume_wakes_idle_workers_across_the_fleet_at_once() {
    let Some(db) = TestDb::new() else { return };
    let runs = Arc::new(AtomicU32::new(0));
    let producer = producer(&db, "mail");
    producer.pause(PauseTarget::queue("mail")).unwrap();
    let worker = worker(&db, "mail", SLOW_POLL, &runs);
    let handles: Vec<_> = (0..5)
        .map(|n| producer.submit(SEND.task(n)).unwrap())
        .collect();
    worker.wait_idle();
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let started = std::time::Instant::now();
    producer.resume(PauseTarget::queue("mail")).unwrap();
    for handle in &handles {
        // Within the notification's time, far below the worker's minute-long poll.
        assert!(handle.wait_timeout(Duration::from_secs(20)).is_some());
    }
    assert!(started.elapsed() < SLOW_POLL);
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}
