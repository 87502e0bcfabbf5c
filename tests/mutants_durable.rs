//! Tests of the durable store's claims, endings, heartbeat, notifications, cleaner and key
//! inserts in cases the other tests left open: each fails with a mutant that cargo-mutants found
//! surviving the durable tests (named in its doc comment), and passes without it.

mod support_pg;

use std::time::Duration;

use tasq::{HandlerError, Outcome, Pool, RateLimit, SubmitErrorKind, TaskType, TypeOptions};

use support_pg::{TestDb, eventually};

const JOB: TaskType<u32, u32> = TaskType::new("job");

/// A producer: no workers, `JOB` declared.
fn producer(db: &TestDb) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap()
}

/// The row id of the task whose payload is `n` (every test here submits distinct payloads).
fn row_of(sql: &mut postgres::Client, n: u32) -> i64 {
    sql.query_one(
        "SELECT id FROM tasq_tasks WHERE payload = $1",
        &[&serde_json::json!(n)],
    )
    .unwrap()
    .get(0)
}

/// A submit whose key's insert conflicts again and again while its lookup never finds the
/// holder (as if each holder ended between the two) gives up after 100 rounds with a store
/// error: it never loops for ever. A trigger made for the test rewrites the key `wanted` to
/// `held`, which another task holds, so every insert conflicts and every lookup of `wanted`
/// finds nothing; it counts the inserts tried in a sequence (not rolled back with the refused
/// submit). Kills the mutants of the round counter in `insert_task` (`rounds += 1` as `*=` or
/// `-=`: the submit never returns; `rounds == 100` as `!=`: it gives up after one round).
#[test]
fn a_key_that_changes_hands_for_ever_fails_the_submit_after_100_rounds() {
    let Some(db) = TestDb::new() else { return };
    let producer = std::sync::Arc::new(producer(&db));
    producer.submit(JOB.task(1).key("held")).unwrap();
    db.client()
        .batch_execute(
            "CREATE SEQUENCE tries;
             CREATE FUNCTION steal_key() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.key = 'wanted' THEN
                     PERFORM nextval('tries');
                     NEW.key := 'held';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER steal_key BEFORE INSERT ON tasq_tasks
                 FOR EACH ROW EXECUTE FUNCTION steal_key()",
        )
        .unwrap();
    let (sender, receiver) = crossbeam_channel::bounded(1);
    let submitting = std::sync::Arc::clone(&producer);
    std::thread::spawn(move || {
        let result = submitting.submit(JOB.task(2).key("wanted"));
        let _ = sender.send(
            result
                .map(|handle| handle.id())
                .map_err(|e| e.kind().clone()),
        );
    });
    let Ok(result) = receiver.recv_timeout(Duration::from_secs(30)) else {
        // The submit still loops, holding its locks: dropping the schema would wait for it.
        std::mem::forget(db);
        panic!("the submit never returned: it loops on the key for ever");
    };
    match result {
        Err(SubmitErrorKind::Store(error)) => assert!(
            error.contains("changed hands 100 times"),
            "another store error: {error}"
        ),
        other => panic!("the submit was not refused as it should be: {other:?}"),
    }
    let tries: i64 = db
        .client()
        .query_one("SELECT last_value FROM tries", &[])
        .unwrap()
        .get(0);
    assert_eq!(tries, 100, "inserts tried before giving up");
    db.client()
        .batch_execute("DROP TRIGGER steal_key ON tasq_tasks")
        .unwrap();
    producer.shutdown(Duration::from_secs(10));
}

/// A batch of two tasks whose dependencies come in descending id order locks them all in id
/// order before inserting anything, as an ending or an ack locks rows: a session that holds
/// the lower row and then takes the higher one (the store's own order) just waits for the batch
/// or makes it wait, and neither is ever a deadlock's victim. Without the lock in id order, the
/// batch took the higher row for its first task and waited for the lower for its second, the
/// session waited for the higher, and the server broke the deadlock by failing one of them
/// (the batch's transaction is run again, counted in `store_errors`). Kills
/// `with_dependencies > 1` as `== 1` in `insert_batch`.
#[test]
fn a_batch_locks_the_dependencies_of_its_tasks_in_id_order() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db);
    let low = producer.submit(JOB.task(1)).unwrap();
    let high = producer.submit(JOB.task(2)).unwrap();
    let mut sql = db.client();
    let (low_row, high_row) = (row_of(&mut sql, 1), row_of(&mut sql, 2));
    assert!(low_row < high_row);
    let mut watcher = db.client();
    let mut session = sql.transaction().unwrap();
    let lock = "SELECT id FROM tasq_tasks WHERE id = $1 FOR UPDATE";
    session.query(lock, &[&low_row]).unwrap();
    let (taken, batch) = std::thread::scope(|scope| {
        let batch = scope.spawn(|| {
            producer.submit_batch(vec![
                JOB.task(3).after([high.id()]),
                JOB.task(4).after([low.id()]),
            ])
        });
        eventually(2, "the batch waits for the lower row", || {
            db.a_pool_waits_for_a_lock(&mut watcher)
        });
        let taken = session.query(lock, &[&high_row]).map(|_| ());
        let committed = session.commit();
        (taken.and(committed), batch.join().unwrap())
    });
    taken.expect("the session took the higher row after the lower, and committed");
    let handles = batch.unwrap_or_else(|e| panic!("the batch failed: {e}"));
    assert_eq!(handles.len(), 2);
    assert_eq!(
        producer.stats().totals.store_errors,
        0,
        "the batch was a deadlock's victim, and ran again"
    );
    producer.check_invariants().unwrap();
    producer.shutdown(Duration::from_secs(10));
}

/// A claim that waits in a prefetching pool while the heartbeat extends its lease starts when
/// a worker takes it, under the lease it was claimed with: each beat moves the claim's own
/// validity with the lease, so only a claim whose lease the beats could not extend is given
/// back (`Totals::lapsed_claims`). One worker, prefetch 1, a 1 s lease: the first task runs
/// until the second, claimed with it, has waited more than twice its lease (by the database's
/// clock). Kills `held.lease == lease` as `!=` in `heartbeat`.
#[test]
fn a_prefetched_claim_whose_lease_the_heartbeat_extends_is_started() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db);
    let handles = producer
        .submit_batch(vec![JOB.task(1), JOB.task(2)])
        .unwrap();
    let (started, on_start) = crossbeam_channel::bounded::<()>(1);
    let (release, on_release) = crossbeam_channel::bounded::<()>(1);
    let worker = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .prefetch(1)
        .lease(Duration::from_secs(1))
        .register(JOB, move |_, n: &u32| {
            if *n == 1 {
                started.send(()).unwrap();
                on_release.recv_timeout(Duration::from_secs(30)).unwrap();
            }
            Ok::<_, HandlerError>(*n)
        })
        .build()
        .unwrap();
    on_start.recv_timeout(Duration::from_secs(20)).unwrap();
    let mut sql = db.client();
    let second = row_of(&mut sql, 2);
    let (lease, seen): (i64, std::time::SystemTime) = {
        let row = sql
            .query_one(
                "SELECT lease_id, now() FROM tasq_tasks WHERE id = $1 AND status = 'running'",
                &[&second],
            )
            .expect("the second task was claimed with the first");
        (row.get(0), row.get(1))
    };
    eventually(
        20,
        "the second claim waited twice its lease, its lease held",
        || {
            sql.query_one(
                "SELECT now() > $2::TIMESTAMPTZ + interval '2500 milliseconds' AND lease_id = $3
                    AND status = 'running'
             FROM tasq_tasks WHERE id = $1",
                &[&second, &seen, &lease],
            )
            .unwrap()
            .get(0)
        },
    );
    release.send(()).unwrap();
    for (n, handle) in (1..).zip(&handles) {
        assert_eq!(
            handle.wait_timeout(Duration::from_secs(20)),
            Some(Outcome::Succeeded(n))
        );
    }
    let ran_under: i64 = sql
        .query_one("SELECT lease_id FROM tasq_tasks WHERE id = $1", &[&second])
        .unwrap()
        .get(0);
    assert_eq!(ran_under, lease, "the second task ran under a later claim");
    assert_eq!(worker.stats().totals.lapsed_claims, 0);
    worker.shutdown(Duration::from_secs(10));
    producer.shutdown(Duration::from_secs(10));
}

/// A task that fails in one pool wakes the handle that waits for it in another pool at once,
/// through the notification of its ending (`done:<id>`), not at that pool's next poll (a
/// minute here). Kills `!ready && done.is_empty()` as `||` in `notify_changes` (an ending that
/// makes nothing ready is not announced) and `handle_words` as `()` (nothing announced is
/// heard).
#[test]
fn a_failure_elsewhere_wakes_a_waiting_handle_at_once() {
    let Some(db) = TestDb::new() else { return };
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .poll_interval(Duration::from_secs(60))
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap();
    let worker = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .poll_interval(Duration::from_millis(50))
        .register(JOB, |_, _: &u32| {
            Err::<u32, _>(HandlerError::permanent("refused"))
        })
        .build()
        .unwrap();
    let handle = producer.submit(JOB.task(1)).unwrap();
    match handle.wait_timeout(Duration::from_secs(20)) {
        Some(Outcome::Failed(failure)) => assert!(failure.error.contains("refused")),
        other => panic!("the producer's handle did not hear of the failure: {other:?}"),
    }
    worker.shutdown(Duration::from_secs(10));
    producer.shutdown(Duration::from_secs(10));
}

/// `check_invariants` reads the table as it is: a clean queue passes, and a row broken by hand
/// (a ready task carrying a cancel request, which a cancel never leaves behind) is named. Kills
/// `check_invariants` as `Ok(())` and its `broken != 0` as `== 0`.
#[test]
fn check_invariants_names_a_row_broken_by_hand() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db);
    producer.submit(JOB.task(1)).unwrap();
    producer.check_invariants().unwrap();
    db.client()
        .execute(
            "UPDATE tasq_tasks SET cancel_requested = 'requested' WHERE status = 'ready'",
            &[],
        )
        .unwrap();
    let error = producer.check_invariants().unwrap_err();
    assert!(
        error.contains("carries no cancel request") && error.contains("1 rows"),
        "{error}"
    );
    producer.shutdown(Duration::from_secs(10));
}

/// A pool that stopped with a handler still running past its shutdown's deadline (it ignores
/// its token) no longer extends that run's lease, even while a handle of that pool is still
/// held (its maintenance thread goes on): the lease runs out, and another pool takes the task
/// over and ends it, as it would a stalled process's. Kills `!stopping && ...` as `||` on the heartbeat in `maintain_loop`
/// (the stopped pool's heartbeat held the lease for as long as the handle lived).
#[test]
fn a_stopped_pool_lets_the_lease_of_a_handler_past_its_deadline_run_out() {
    let Some(db) = TestDb::new() else { return };
    let (started, on_start) = crossbeam_channel::bounded::<()>(1);
    let (release, on_release) = crossbeam_channel::bounded::<()>(1);
    let stopping = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .lease(Duration::from_secs(1))
        .register(JOB, move |_, n: &u32| {
            started.send(()).unwrap();
            // Past the deadline, whatever the token says.
            let _ = on_release.recv_timeout(Duration::from_secs(60));
            Ok::<_, HandlerError>(*n)
        })
        .build()
        .unwrap();
    let handle = stopping.submit(JOB.task(7)).unwrap();
    on_start.recv_timeout(Duration::from_secs(20)).unwrap();
    let (outcome, report) = std::thread::scope(|scope| {
        let shutdown = scope.spawn(|| stopping.shutdown(Duration::from_millis(50)));
        let other = Pool::builder()
            .postgres(db.url.clone())
            .workers(1)
            .lease(Duration::from_secs(1))
            .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(n + 100))
            .build()
            .unwrap();
        // Through the other pool: the stopped pool publishes the outcome to its own handle only
        // once its handler returns (it still counts the task as running here).
        let outcome = other
            .handle(JOB, handle.id())
            .unwrap()
            .wait_timeout(Duration::from_secs(20));
        release.send(()).unwrap();
        other.shutdown(Duration::from_secs(10));
        (outcome, shutdown.join().unwrap())
    });
    assert_eq!(
        outcome,
        Some(Outcome::Succeeded(107)),
        "the other pool never took the task over: its lease was still extended"
    );
    assert!(report.deadline_reached);
}

/// A handler that runs for many leases keeps its lease: the heartbeat extends it every third of
/// the lease however long each of the maintenance thread's passes takes (here a 300 ms lease,
/// beats due every 100 ms, passes of up to 200 ms while nothing is announced). The task runs
/// once, under the lease it was claimed with. Kills `>=` as `<` in the heartbeat's timer in
/// `maintain_loop` (a beat ran only on a pass shorter than its interval: after one long pass,
/// never again, and the reaper took the task back).
#[test]
fn a_handler_running_many_leases_long_keeps_its_lease() {
    let Some(db) = TestDb::new() else { return };
    let (started, on_start) = crossbeam_channel::bounded::<()>(1);
    let (release, on_release) = crossbeam_channel::bounded::<()>(1);
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .lease(Duration::from_millis(300))
        .register(JOB, move |_, n: &u32| {
            started.send(()).unwrap();
            on_release.recv_timeout(Duration::from_secs(30)).unwrap();
            Ok::<_, HandlerError>(*n)
        })
        .build()
        .unwrap();
    let handle = pool.submit(JOB.task(1)).unwrap();
    on_start.recv_timeout(Duration::from_secs(20)).unwrap();
    let mut sql = db.client();
    let row = row_of(&mut sql, 1);
    let (lease, seen): (i64, std::time::SystemTime) = {
        let found = sql
            .query_one(
                "SELECT lease_id, now() FROM tasq_tasks WHERE id = $1",
                &[&row],
            )
            .unwrap();
        (found.get(0), found.get(1))
    };
    eventually(20, "four leases went by", || {
        sql.query_one(
            "SELECT now() > $1::TIMESTAMPTZ + interval '1200 milliseconds'",
            &[&seen],
        )
        .unwrap()
        .get(0)
    });
    let (status, held): (String, Option<i64>) = {
        let found = sql
            .query_one(
                "SELECT status, lease_id FROM tasq_tasks WHERE id = $1",
                &[&row],
            )
            .unwrap();
        (found.get(0), found.get(1))
    };
    release.send(()).unwrap();
    assert_eq!(
        (status.as_str(), held),
        ("running", Some(lease)),
        "the lease ran out under a running handler"
    );
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(1))
    );
    assert_eq!(pool.info(handle.id()).unwrap().attempts, 1);
    pool.shutdown(Duration::from_secs(10));
}

/// A cancel asked for in one pool reaches the handler running the task in another at once,
/// through the notification `cancel:<id>`, not at that pool's next heartbeat (every 20 s with
/// its 60 s lease). Kills `word == "done:*"` as `!=` in `handle_words` (every other word was
/// taken for `done:*`, and `cancel:<id>` was never read) and `handle_words` as `()`.
#[test]
fn a_cancel_elsewhere_reaches_a_running_handler_at_once() {
    let Some(db) = TestDb::new() else { return };
    let (started, on_start) = crossbeam_channel::bounded::<()>(1);
    let worker = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .lease(Duration::from_secs(60))
        .register(JOB, move |ctx, n: &u32| {
            started.send(()).unwrap();
            match ctx.token().sleep(Duration::from_secs(30)) {
                Ok(()) => Ok(*n),
                Err(_) => Err(HandlerError::retryable("interrupted")),
            }
        })
        .build()
        .unwrap();
    let producer = producer(&db);
    let handle = producer.submit(JOB.task(1)).unwrap();
    on_start.recv_timeout(Duration::from_secs(20)).unwrap();
    producer.cancel(handle.id()).unwrap();
    match handle.wait_timeout(Duration::from_secs(10)) {
        Some(Outcome::Cancelled(_)) => {}
        other => panic!("the running handler did not hear of the cancel: {other:?}"),
    }
    worker.shutdown(Duration::from_secs(10));
    producer.shutdown(Duration::from_secs(10));
}

/// The cleaner deletes the dependency edges of the rows it deletes: once retention has removed
/// a finished task and its finished dependent, `tasq_deps` holds nothing of them. Kills the
/// deleted `!` of `!ids.is_empty()` in `retain` (edges left behind for ever).
#[test]
fn retention_deletes_the_edges_of_the_rows_it_deletes() {
    let Some(db) = TestDb::new() else { return };
    db.change_policy(|policy| policy.finished_max_age(Some(Duration::ZERO)));
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let first = pool.submit(JOB.task(1)).unwrap();
    let second = pool.submit(JOB.task(2).after([first.id()])).unwrap();
    assert_eq!(
        second.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(2))
    );
    let mut sql = db.client();
    assert_eq!(
        sql.query_one("SELECT count(*) FROM tasq_deps", &[])
            .unwrap()
            .get::<_, i64>(0),
        1,
        "the edge, before retention"
    );
    eventually(20, "retention deleted both rows", || {
        sql.query_one("SELECT count(*) FROM tasq_tasks", &[])
            .unwrap()
            .get::<_, i64>(0)
            == 0
    });
    let edges: i64 = sql
        .query_one("SELECT count(*) FROM tasq_deps", &[])
        .unwrap()
        .get(0);
    assert_eq!(edges, 0, "edges left behind by retention");
    pool.shutdown(Duration::from_secs(10));
}

/// `Totals::empty_claims` counts the claims that came back with nothing: before any task is
/// submitted, every claim a pool made was empty; once one task ran, all but one. Kills
/// `claimed == 0` as `!=` in `fetch_loop`.
#[test]
fn empty_claims_count_the_claims_that_found_nothing() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .poll_interval(Duration::from_millis(20))
        .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    eventually(5, "the pool claimed", || pool.stats().totals.claims >= 2);
    let totals = pool.stats().totals;
    assert_eq!(totals.empty_claims, totals.claims, "{totals:?}");
    let handle = pool.submit(JOB.task(1)).unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(1))
    );
    // The fetcher counts a claim once it has handed its tasks to the workers: the task may
    // have ended first.
    eventually(
        5,
        "one claim found the task, every other found nothing",
        || {
            let totals = pool.stats().totals;
            totals.empty_claims + 1 == totals.claims
        },
    );
    pool.shutdown(Duration::from_secs(10));
}

/// A fetcher whose workers are all busy waits, even once the time its gate named for a new
/// token has passed: it claims again when a worker frees or at its poll, and does not spin. One
/// worker runs a slow task claimed while a rate limit (one a second) held a task of higher
/// priority back; the slow task runs 2.5 s, past the next token, and the fetcher thread uses
/// next to no CPU meanwhile. Kills `now >= at` as `<` in `fetch_loop` (the gate's wake time
/// was kept once past, and the fetcher's every wait ended at once: one core spent until the
/// worker freed).
#[test]
fn a_fetcher_with_busy_workers_waits_past_a_gate_s_wake_time() {
    let Some(db) = TestDb::new() else { return };
    const RATED: TaskType<u32, u32> = TaskType::new("rated");
    const SLOW: TaskType<u32, u32> = TaskType::new("slow");
    let (started, on_start) = crossbeam_channel::bounded::<()>(1);
    let (release, on_release) = crossbeam_channel::bounded::<()>(1);
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        // Longer than the gate's wait: the gate's wake time, not the poll, ends the wait.
        .poll_interval(Duration::from_secs(5))
        .register_with(
            RATED,
            TypeOptions::new().rate_limit(RateLimit::per_second(1.0).with_burst(1)),
            |_, n: &u32| Ok::<_, HandlerError>(*n),
        )
        .register(SLOW, move |_, n: &u32| {
            started.send(()).unwrap();
            on_release.recv_timeout(Duration::from_secs(30)).unwrap();
            Ok::<_, HandlerError>(*n)
        })
        .build()
        .unwrap();
    // The bucket's one token, spent.
    let first = pool.submit(RATED.task(1)).unwrap();
    assert_eq!(
        first.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(1))
    );
    // Held back (no token for about a second), first in the claim's order: the claim that
    // takes the slow task names the token's time as the fetcher's wake.
    let held = pool.submit(RATED.task(2).priority(9)).unwrap();
    let slow = pool.submit(SLOW.task(3)).unwrap();
    on_start.recv_timeout(Duration::from_secs(20)).unwrap();
    let before = support_pg::thread_cpu("tasq-pg-fetch");
    let mut sql = db.client();
    let seen: std::time::SystemTime = sql.query_one("SELECT now()", &[]).unwrap().get(0);
    eventually(20, "the slow task ran 2.5 s", || {
        sql.query_one(
            "SELECT now() > $1::TIMESTAMPTZ + interval '2500 milliseconds'",
            &[&seen],
        )
        .unwrap()
        .get(0)
    });
    let spent = support_pg::thread_cpu("tasq-pg-fetch") - before;
    release.send(()).unwrap();
    assert!(
        spent < Duration::from_millis(300),
        "the fetcher spun while its worker was busy: {spent:?} of CPU in 2.5 s"
    );
    for (n, handle) in [(3, &slow), (2, &held)] {
        assert_eq!(
            handle.wait_timeout(Duration::from_secs(20)),
            Some(Outcome::Succeeded(n))
        );
    }
    pool.shutdown(Duration::from_secs(10));
}
