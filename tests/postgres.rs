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

const NOTE: TaskType<String, ()> = TaskType::new("note");

/// A task submitted inside the caller's transaction exists only if that transaction commits;
/// a refused submit leaves the transaction usable.
#[test]
fn a_task_submitted_in_a_transaction_exists_only_if_it_commits() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(NOTE, |_, _: &String| Ok::<_, HandlerError>(()))
        .build()
        .unwrap();
    let mut client = db.client();
    client
        .batch_execute("CREATE TABLE notes (text TEXT NOT NULL)")
        .unwrap();

    let mut tx = client.transaction().unwrap();
    tx.execute("INSERT INTO notes VALUES ('rolled back')", &[])
        .unwrap();
    let gone = pool
        .submit_in(&mut tx, NOTE.task("rolled back".into()))
        .unwrap()
        .id();
    tx.rollback().unwrap();
    assert_eq!(pool.status(gone), None, "a rolled-back task never existed");

    let mut tx = client.transaction().unwrap();
    tx.execute("INSERT INTO notes VALUES ('kept')", &[])
        .unwrap();
    let unknown = tasq::TaskId::from_parts(pool.id(), 999_999);
    let refused = pool
        .submit_in(&mut tx, NOTE.task("refused".into()).after([unknown]))
        .unwrap_err();
    assert_eq!(
        refused.kind(),
        &tasq::SubmitErrorKind::UnknownDependency(unknown)
    );
    let kept = pool.submit_in(&mut tx, NOTE.task("kept".into())).unwrap();
    assert!(!kept.is_duplicate());
    let kept = kept.id();
    tx.commit().unwrap();
    let handle = pool.handle(NOTE, kept).expect("committed");
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(()))
    );
    let notes: Vec<String> = client
        .query("SELECT text FROM notes", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(notes, ["kept"]);
    assert_eq!(pool.stats().totals.succeeded, 1);
    pool.check_invariants().unwrap();
}

/// `submit_in` says, as `submit` does, when a key made the task a duplicate: of a task added
/// earlier in the same transaction, of a committed one, and a plain submit of the key is a
/// duplicate of the task `submit_in` committed. A key in a rolled-back transaction was never
/// held.
#[test]
fn submit_in_says_whether_the_key_made_the_task_a_duplicate() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(NOTE, |_, _: &String| Ok::<_, HandlerError>(()))
        .build()
        .unwrap();
    let mut client = db.client();

    let mut tx = client.transaction().unwrap();
    let dropped = pool
        .submit_in(&mut tx, NOTE.task("rolled back".into()).key("k-0"))
        .unwrap();
    assert!(!dropped.is_duplicate());
    tx.rollback().unwrap();

    let mut tx = client.transaction().unwrap();
    let first = pool
        .submit_in(&mut tx, NOTE.task("first".into()).key("k-0"))
        .unwrap();
    assert!(!first.is_duplicate(), "the rolled-back key was never held");
    let same_tx = pool
        .submit_in(&mut tx, NOTE.task("second".into()).key("k-0"))
        .unwrap();
    assert_eq!((same_tx.id(), same_tx.is_duplicate()), (first.id(), true));
    let other = pool
        .submit_in(&mut tx, NOTE.task("other".into()).key("k-1"))
        .unwrap();
    assert!(!other.is_duplicate());
    assert_ne!(other.id(), first.id());
    tx.commit().unwrap();

    let mut tx = client.transaction().unwrap();
    let later = pool
        .submit_in(&mut tx, NOTE.task("later".into()).key("k-0"))
        .unwrap();
    tx.commit().unwrap();
    assert_eq!((later.id(), later.is_duplicate()), (first.id(), true));
    let plain = pool.submit(NOTE.task("plain".into()).key("k-0")).unwrap();
    assert_eq!((plain.id(), plain.is_duplicate()), (first.id(), true));

    let payloads: Vec<serde_json::Value> = client
        .query("SELECT payload FROM tasq_tasks ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        payloads,
        [serde_json::json!("first"), serde_json::json!("other")]
    );
    assert_eq!(pool.stats().ready, 2);
}

const CHARGE: TaskType<i64, i64> = TaskType::new("charge");

/// A handler that ends its task inside its own transaction: the side effect and the success
/// commit together; with the lease lost, `succeed_in` says so and the handler rolls back.
#[test]
fn a_handler_succeeds_in_its_own_transaction_fenced_by_its_lease() {
    let Some(db) = TestDb::new() else { return };
    db.client()
        .batch_execute("CREATE TABLE charges (task BIGINT NOT NULL, cents BIGINT NOT NULL)")
        .unwrap();
    let url = db.url.clone();
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(CHARGE, move |ctx, cents: &i64| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls)
                .map_err(HandlerError::retryable)?;
            if *cents < 0 {
                // Another worker took the task over: this lease is stale.
                client
                    .execute(
                        "UPDATE tasq_tasks SET lease_id = lease_id + 1000000 WHERE id = $1",
                        &[&(ctx.id().seq() as i64)],
                    )
                    .map_err(HandlerError::retryable)?;
            }
            let mut tx = client.transaction().map_err(HandlerError::retryable)?;
            tx.execute(
                "INSERT INTO charges VALUES ($1, $2)",
                &[&(ctx.id().seq() as i64), cents],
            )
            .map_err(HandlerError::retryable)?;
            if !ctx
                .succeed_in(&mut tx, cents)
                .map_err(HandlerError::retryable)?
            {
                return Err(HandlerError::permanent("the lease is lost"));
            }
            tx.commit().map_err(HandlerError::retryable)?;
            Ok(*cents)
        })
        .build()
        .unwrap();
    let paid = pool.submit(CHARGE.task(250)).unwrap();
    assert_eq!(
        paid.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(250))
    );
    let stale = pool.submit(CHARGE.task(-1)).unwrap();
    // The stale run's ending is fenced off too: the task stays running under the other lease
    // until that lease expires; the wait times out.
    assert_eq!(stale.wait_timeout(Duration::from_millis(500)), None);

    let mut client = db.client();
    let charges: Vec<(i64, i64)> = client
        .query("SELECT task, cents FROM charges ORDER BY task", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        charges,
        [(paid.id().seq() as i64, 250)],
        "one charge, committed once"
    );
    let row = client
        .query_one(
            "SELECT status, output FROM tasq_tasks WHERE id = $1",
            &[&(paid.id().seq() as i64)],
        )
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "succeeded");
    assert_eq!(row.get::<_, serde_json::Value>(1), serde_json::json!(250));
    assert_eq!(pool.stats().totals.succeeded, 1);
}

/// A handle outlives its durable pool: once another pool (here in the same process, on the same
/// schema) runs the task, the wait returns with its outcome.
#[test]
fn a_handle_returns_after_its_pool_is_dropped_when_another_pool_runs_the_task() {
    let Some(db) = TestDb::new() else { return };
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap();
    let handle = producer.submit(DOUBLE.task(8)).unwrap();
    drop(producer);
    assert_eq!(handle.wait_timeout(Duration::from_millis(200)), None);
    let worker = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(16))
    );
    worker.shutdown(Duration::from_secs(10));
}

const OTHER: TaskType<u32, u32> = TaskType::new("other");

/// Bad rows in the table: a payload that no longer deserializes becomes a dead letter with a
/// clear reason (the worker carries on), and a task of a type no pool registered is left alone,
/// counted in the stats.
#[test]
fn bad_rows_become_dead_letters_or_are_left_alone() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .register(OTHER, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let mut sql = db.client();
    let bad: i64 = sql
        .query_one(
            "INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts)
             VALUES ('double', '\"not a number\"', 5, 'ready', 3) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    let unknown: i64 = sql
        .query_one(
            "INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts)
             VALUES ('from_a_newer_version', '1', 9, 'ready', 3) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    sql.execute("SELECT pg_notify(tasq_channel(), 'ready')", &[])
        .unwrap();
    let bad_id = tasq::TaskId::from_parts(pool.id(), bad as u64);
    let bad_handle = pool.handle(DOUBLE, bad_id).expect("a task of a known type");
    match bad_handle.wait_timeout(Duration::from_secs(10)) {
        Some(Outcome::Failed(failure)) => {
            assert_eq!(failure.reason, tasq::FailureReason::BadPayload);
            assert!(
                failure
                    .error
                    .starts_with("the payload could not be decoded"),
                "{}",
                failure.error
            );
        }
        other => panic!("expected a dead letter, got {other:?}"),
    }
    assert_eq!(pool.dead_letters()[0].id, bad_id);
    // Its payload cannot be taken as the type's payload, and trying loses nothing.
    assert_eq!(pool.take_dead_letter(DOUBLE, bad_id), None);
    assert_eq!(pool.dead_letters().len(), 1, "still a dead letter");
    assert_eq!(pool.dead_letters()[0].id, bad_id);
    // The worker carries on.
    let next = pool.submit(DOUBLE.task(4)).unwrap();
    assert_eq!(
        next.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(8))
    );
    let unknown_id = tasq::TaskId::from_parts(pool.id(), unknown as u64);
    assert_eq!(pool.status(unknown_id), Some(TaskState::Ready));
    assert_eq!(pool.handle(OTHER, unknown_id).map(|h| h.id()), None);
    let stats = pool.stats();
    assert_eq!(stats.ready, 1, "the unknown type's task waits, counted");
    assert_eq!(stats.ready_by_priority, vec![(9, 1)]);
    assert_eq!(stats.totals.worker_panics, 0);
    pool.shutdown(Duration::from_secs(10));
}

/// Eight processes' worth of `migrate` at once on an empty schema: one creates the tables, the
/// others wait for it and find nothing left to do; every call succeeds.
#[test]
fn migrations_run_once_when_many_callers_race() {
    let Some(db) = TestDb::new() else { return };
    db.client()
        .batch_execute(
            "DROP TABLE tasq_tasks, tasq_deps, tasq_schema, tasq_gates; DROP SEQUENCE tasq_lease;
             DROP FUNCTION tasq_now()",
        )
        .unwrap();
    let start = std::sync::Arc::new(std::sync::Barrier::new(8));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (url, start) = (db.url.clone(), std::sync::Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                tasq::postgres::migrate(&url)
            })
        })
        .collect();
    let found: Vec<i32> = callers
        .into_iter()
        .map(|c| c.join().unwrap().expect("migrate succeeds"))
        .collect();
    assert_eq!(found.iter().filter(|&&v| v == 0).count(), 1, "{found:?}");
    assert!(
        found
            .iter()
            .all(|&v| v == 0 || v == tasq::postgres::SCHEMA_VERSION)
    );
    let version: i32 = db
        .client()
        .query_one("SELECT version FROM tasq_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, tasq::postgres::SCHEMA_VERSION);
    // And a pool builds on it.
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap();
    assert_eq!(
        pool.submit(DOUBLE.task(1))
            .unwrap()
            .wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(2))
    );
}

/// Successes that end together are written together (one statement, one transaction: their
/// rows share its `xmin`), and an ack in such a batch that the row refuses (a cancel was
/// asked for, or the task has dependents) takes the general path without holding up the
/// others: the cancelled task ends cancelled, the parent releases its dependent, the rest
/// succeed once each.
#[test]
fn acks_that_arrive_together_are_written_together_and_refusals_take_the_general_path() {
    const HELD: TaskType<u32, u32> = TaskType::new("held");
    const CHILD: TaskType<u32, u32> = TaskType::new("child");
    let Some(db) = TestDb::new() else { return };
    let workers = 8;
    let started = std::sync::Arc::new(std::sync::Barrier::new(workers + 1));
    let release = std::sync::Arc::new(std::sync::Barrier::new(workers + 1));
    let (s, r) = (started.clone(), release.clone());
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(workers)
        .register(HELD, move |_, n: &u32| {
            s.wait();
            r.wait();
            Ok::<_, HandlerError>(*n)
        })
        .register(CHILD, |_, n: &u32| Ok::<_, HandlerError>(n + 1))
        .build()
        .unwrap();
    let mut grouped = false;
    for round in 0..5 {
        let handles: Vec<_> = (0..workers as u32)
            .map(|i| pool.submit(HELD.task(round * 100 + i)).unwrap())
            .collect();
        let (parent, cancelled) = (&handles[0], &handles[1]);
        let child = pool.submit(CHILD.task(7).after([parent.id()])).unwrap();
        started.wait();
        pool.cancel(cancelled.id()).unwrap();
        release.wait();
        for (i, handle) in handles.iter().enumerate() {
            let outcome = handle.wait_timeout(Duration::from_secs(10));
            if i == 1 {
                assert!(
                    matches!(outcome, Some(Outcome::Cancelled(_))),
                    "{outcome:?}"
                );
            } else {
                assert_eq!(outcome, Some(Outcome::Succeeded(round * 100 + i as u32)));
            }
        }
        assert_eq!(
            child.wait_timeout(Duration::from_secs(10)),
            Some(Outcome::Succeeded(8))
        );
        let ids: Vec<i64> = handles.iter().map(|h| h.id().seq() as i64).collect();
        let shared: i64 = db
            .client()
            .query_one(
                // Rows one statement wrote share its transaction (their `xmin`); their
                // `finished_at` differ by a microsecond each (see the completer's `ACK`).
                "SELECT count(*) - count(DISTINCT xmin::TEXT) FROM tasq_tasks
                 WHERE id = ANY($1) AND status = 'succeeded'",
                &[&ids],
            )
            .unwrap()
            .get(0);
        grouped |= shared > 0;
    }
    assert!(
        grouped,
        "no two of eight simultaneous successes shared a commit in five rounds"
    );
    let report = pool.shutdown(Duration::from_secs(10));
    assert_eq!(report.succeeded, 5 * 8);
    assert_eq!(report.cancelled, 5);
    pool.check_invariants().unwrap();
}

/// `prefetch(n)`: a pool claims up to n tasks beyond its free workers and holds them leased;
/// a cancel reaches a held task (it ends cancelled once a worker takes it), and shutdown gives
/// the held ones back to the queue for other pools.
#[test]
fn a_prefetching_pool_holds_claims_beyond_its_workers_and_gives_them_back() {
    const HELD: TaskType<u32, u32> = TaskType::new("held");
    let Some(db) = TestDb::new() else { return };
    let started = std::sync::Arc::new(std::sync::Barrier::new(2));
    let release = std::sync::Arc::new(std::sync::Barrier::new(2));
    let (s, r) = (started.clone(), release.clone());
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(HELD, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let handles: Vec<_> = (0..10)
        .map(|i| producer.submit(HELD.task(i)).unwrap())
        .collect();
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .prefetch(4)
        .register(HELD, move |ctx, n: &u32| {
            if *n == 0 {
                s.wait();
                r.wait();
            }
            if ctx.is_cancelled() {
                return Err(HandlerError::permanent("cancelled"));
            }
            Ok::<_, HandlerError>(*n)
        })
        .build()
        .unwrap();
    started.wait();
    let running = |db: &TestDb| -> i64 {
        db.client()
            .query_one(
                "SELECT count(*) FROM tasq_tasks WHERE status = 'running'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    // The claim of the other four happens right after the first; wait for it on the rows.
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while running(&db) < 5 && std::time::Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(running(&db), 5, "one worker and four prefetched");
    assert_eq!(producer.stats().ready, 5);
    // Task 1 is held here, not started: the cancel reaches it through its token.
    pool.cancel(handles[1].id()).unwrap();
    // Shutdown with task 0 still running: the held claims go back (task 1 ends cancelled),
    // then task 0 is let go and ends.
    let shutdown = std::thread::spawn(move || pool.shutdown(Duration::from_secs(10)));
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while running(&db) > 1 && std::time::Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        running(&db),
        1,
        "the held claims went back; task 0 still runs"
    );
    release.wait();
    let report = shutdown.join().unwrap();
    assert_eq!((report.succeeded, report.cancelled), (1, 1), "{report:?}");
    assert_eq!(
        handles[0].wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(0))
    );
    assert!(
        matches!(
            handles[1].wait_timeout(Duration::from_secs(10)),
            Some(Outcome::Cancelled(_))
        ),
        "a cancel of a held task ends it cancelled"
    );
    assert_eq!(running(&db), 0, "nothing stays leased");
    assert_eq!(
        producer.stats().ready,
        8,
        "the other held claims are back in the queue"
    );
    producer.shutdown(Duration::from_secs(10));
}

/// `succeed_in` with an output whose `Serialize` fails says so with a typed error (not as a
/// lost lease), writes nothing, and the task ends as its handler then returns.
#[test]
fn succeed_in_with_an_unserializable_output_is_a_typed_error() {
    let Some(db) = TestDb::new() else { return };
    let url = db.url.clone();
    let (said_tx, said) = crossbeam_channel::unbounded();
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(DOUBLE, move |ctx, n: &u32| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls)
                .map_err(HandlerError::retryable)?;
            let mut tx = client.transaction().map_err(HandlerError::retryable)?;
            // JSON object keys must be strings: this map does not serialize.
            let unserializable: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
            let _ = said_tx.send(ctx.succeed_in(&mut tx, &unserializable));
            drop(tx);
            Ok::<_, HandlerError>(n * 2)
        })
        .build()
        .unwrap();
    let handle = pool.submit(DOUBLE.task(4)).unwrap();
    match said.recv_timeout(Duration::from_secs(10)).unwrap() {
        Err(tasq::SucceedInError::Unserializable(message)) => {
            assert!(message.contains("key must be a string"), "{message}");
        }
        other => panic!("expected Unserializable, got {other:?}"),
    }
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(8)),
        "nothing was written by succeed_in; the handler's own result stands"
    );
    pool.shutdown(Duration::from_secs(10));
}

/// A cancel that cascades to more dependents than one notification can name (PostgreSQL's
/// payload limit is 8,000 bytes) still commits, and a handle waiting on a dependent in another
/// pool still hears of it.
#[test]
fn a_cascade_too_long_for_one_notification_still_ends_everything() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap();
    let root = pool.submit(DOUBLE.task(0)).unwrap();
    let dependents = pool
        .submit_batch(
            (1..=2_000)
                .map(|n| DOUBLE.task(n).after([root.id()]))
                .collect(),
        )
        .unwrap();
    let other = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap();
    let last = other.handle(DOUBLE, dependents[1_999].id()).unwrap();
    let waiter = std::thread::spawn(move || last.wait_timeout(Duration::from_secs(10)));
    assert_eq!(pool.cancel(root.id()), Ok(tasq::CancelOutcome::Cancelled));
    assert!(matches!(
        waiter.join().unwrap(),
        Some(Outcome::Cancelled(_))
    ));
    let cancelled: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM tasq_tasks WHERE status = 'cancelled'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(cancelled, 2_001);
    assert_eq!(pool.stats().totals.cancelled, 2_001);
    other.shutdown(Duration::from_secs(10));
    pool.shutdown(Duration::from_secs(10));
}

/// A pool that cannot reach its database says why, with the server's own message.
#[test]
fn a_build_error_carries_the_servers_message() {
    let Some(db) = TestDb::new() else { return };
    let url = format!("{} dbname=tasq_no_such_database", db.url);
    match Pool::builder()
        .postgres(url)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
    {
        Err(tasq::BuildError::Store(message)) => assert!(
            message.contains("tasq_no_such_database") && message.contains("does not exist"),
            "{message}"
        ),
        other => panic!("expected a store error, got {:?}", other.err()),
    }
}

/// A task made the dependent of a blocked task while a cancel's cascade runs is cancelled with
/// it, not left blocked forever: the cascade waits for the row the submit holds, then sees the
/// new edge. (A recursive query read the edges of one snapshot, taken before the submit
/// committed, and missed it.)
#[test]
fn a_dependent_added_while_a_cascade_runs_is_cancelled_with_it() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap();
    let root = pool
        .submit(DOUBLE.task(1).delay(Duration::from_secs(3600)))
        .unwrap();
    let blocked = pool.submit(DOUBLE.task(2).after([root.id()])).unwrap();
    let mut client = db.client();
    let mut tx = client.transaction().unwrap();
    // Holds `blocked`'s row until the commit below.
    let late = pool
        .submit_in(&mut tx, DOUBLE.task(3).after([blocked.id()]))
        .unwrap()
        .id();
    let cancelled = std::thread::scope(|scope| {
        let cancel = scope.spawn(|| pool.cancel(root.id()));
        // The cascade now reaches `blocked` and waits for its row lock.
        let mut watcher = db.client();
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    &[&db.schema()],
                )
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < give_up,
                "the cancel never waited for the submit's lock"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        tx.commit().unwrap();
        cancel.join().unwrap()
    });
    assert_eq!(cancelled, Ok(tasq::CancelOutcome::Cancelled));
    let late = pool.handle(DOUBLE, late).unwrap();
    assert!(matches!(
        late.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Cancelled(_))
    ));
    assert!(matches!(
        blocked.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Cancelled(_))
    ));
    pool.check_invariants().unwrap();
    pool.shutdown(Duration::from_secs(10));
}

const STEP: TaskType<u32, u32> = TaskType::new("step");

/// A worker whose handler succeeded moves on before its ack is written: with the task's row
/// locked by another transaction (the ack waits for the lock), the pool's one worker runs the
/// next task. Both handles see their tasks succeed once the lock goes (the acks behind the
/// waiting one wait with it), and a shutdown counts both.
#[test]
fn a_worker_moves_on_while_its_ack_is_written() {
    let Some(db) = TestDb::new() else { return };
    let (started_tx, started_rx) = crossbeam_channel::unbounded();
    let (go_tx, go_rx) = crossbeam_channel::unbounded::<()>();
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(STEP, move |_, &n: &u32| {
            started_tx.send(n).unwrap();
            if n == 1 {
                go_rx.recv().unwrap();
            }
            Ok::<_, HandlerError>(n * 10)
        })
        .build()
        .unwrap();
    let first = pool.submit(STEP.task(1)).unwrap();
    assert_eq!(started_rx.recv_timeout(Duration::from_secs(10)), Ok(1));
    // The first task's row, locked until this transaction ends.
    let mut client = db.client();
    let mut tx = client.transaction().unwrap();
    tx.query_one(
        "SELECT id FROM tasq_tasks WHERE id = $1 FOR UPDATE",
        &[&(first.id().seq() as i64)],
    )
    .unwrap();
    let second = pool.submit(STEP.task(2)).unwrap();
    go_tx.send(()).unwrap();
    assert_eq!(
        started_rx.recv_timeout(Duration::from_secs(10)),
        Ok(2),
        "the worker waited for its ack"
    );
    assert_eq!(
        first.status(),
        TaskState::Running,
        "its ack waits for the lock"
    );
    tx.commit().unwrap();
    assert_eq!(
        first.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(10))
    );
    assert_eq!(
        second.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(20))
    );
    assert_eq!(pool.shutdown(Duration::from_secs(10)).succeeded, 2);
    pool.check_invariants().unwrap();
}
