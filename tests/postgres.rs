//! The durable store against a real PostgreSQL server: the basics of a durable pool.
#![cfg(feature = "postgres")]

mod support_pg;

use std::time::Duration;

use support_pg::TestDb;
use tasq::{HandlerError, Outcome, Pool, TaskState, TaskType};

const DOUBLE: TaskType<u32, u32> = TaskType::new("double");

#[test]
fn a_durable_task_runs_and_its_output_comes_back() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(2)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap();
    let handle = pool.submit(DOUBLE.task(21)).unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(42))
    );
    assert_eq!(pool.status(handle.id()), Some(TaskState::Succeeded));
    let row = db
        .client()
        .query_one(
            "SELECT status, payload, output FROM tasq_tasks WHERE id = $1",
            &[&(handle.id().seq() as i64)],
        )
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "succeeded");
    assert_eq!(row.get::<_, serde_json::Value>(1), serde_json::json!(21));
    assert_eq!(row.get::<_, serde_json::Value>(2), serde_json::json!(42));
    let report = pool.shutdown(Duration::from_secs(10));
    assert_eq!(report.succeeded, 1);
    pool.check_invariants().unwrap();
}
