//! Lanes of workers on the durable store (`Builder::queue`): a pool serves only the queues it
//! names, as each row's queue says (not as the pool registered the type), and prefetched
//! claims of a lane never start beyond its workers.

mod support_store;

use std::time::Duration;

use support_store::support_pg::TestDb;
use support_store::{GATE, Gate, HANG_GUARD, finish, gate_handler};
use tasq::{HandlerError, Pool, TaskHandle, TaskState, TaskType, TypeOptions};

const SEND: TaskType<u32, String> = TaskType::new("send");
const QUICK: TaskType<u32, u32> = TaskType::new("quick");

#[test]
fn a_pool_serving_some_queues_leaves_the_rows_of_the_others() {
    let Some(db) = TestDb::new() else { return };
    // A serves queue mail only; C registers the type in the default queue (another version
    // of the program) and serves every queue.
    let a = Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .workers(0)
        .queue("mail", 2)
        .register_with(SEND, TypeOptions::new().queue("mail"), |_, _: &u32| {
            Ok::<_, HandlerError>("a".to_owned())
        })
        .build()
        .unwrap();
    let c = Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .workers(1)
        .register(SEND, |_, _: &u32| Ok::<_, HandlerError>("c".to_owned()))
        .build()
        .unwrap();
    let mut from_c: Vec<TaskHandle<String>> = Vec::new();
    let mut from_a: Vec<TaskHandle<String>> = Vec::new();
    for i in 0..40 {
        from_c.push(c.submit(SEND.task(i)).unwrap());
        from_a.push(a.submit(SEND.task(i)).unwrap());
    }
    for handle in &from_c {
        assert_eq!(
            finish(handle).succeeded(),
            Some("c".to_owned()),
            "a default-queue row ran on A"
        );
    }
    for handle in &from_a {
        assert!(finish(handle).succeeded().is_some());
    }
    let mut sql = db.client();
    let by_queue: Vec<(String, i64)> = sql
        .query(
            "SELECT queue, count(*) FROM tasq_tasks GROUP BY queue ORDER BY queue",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        by_queue,
        [("default".to_owned(), 40), ("mail".to_owned(), 40)]
    );
    a.shutdown(HANG_GUARD);
    c.shutdown(HANG_GUARD);
}

#[test]
fn prefetched_claims_of_a_lane_start_only_on_its_workers() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .prefetch(4)
        .workers(1)
        .queue("reports", 1)
        .register_with(GATE, TypeOptions::new().queue("reports"), gate_handler)
        .register(QUICK, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let gates: Vec<Gate> = (0..3).map(|_| Gate::new()).collect();
    let reports: Vec<TaskHandle<()>> = gates
        .iter()
        .map(|gate| pool.submit(GATE.task(gate.number())).unwrap())
        .collect();
    gates[0].wait_started();
    // The lane holds the other two (prefetched, or still ready): the shared worker must not
    // start them, or the quick tasks would wait behind a gate that never opens.
    let quick: Vec<_> = (0..20)
        .map(|i| pool.submit(QUICK.task(i)).unwrap())
        .collect();
    for (i, handle) in quick.iter().enumerate() {
        assert_eq!(finish(handle).succeeded(), Some(i as u32));
    }
    assert!(!gates[1].started() && !gates[2].started());
    assert_eq!(pool.check_invariants(), Ok(()));
    for gate in gates {
        gate.open();
    }
    for handle in &reports {
        assert_eq!(finish(handle).succeeded(), Some(()));
    }
    assert_eq!(reports[2].status(), TaskState::Succeeded);
    pool.shutdown(HANG_GUARD);
}
