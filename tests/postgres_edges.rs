//! The edges a fleet lives on (issue 20, section 3), each reproduced against the real server:
//! a key holder that vanishes under a waiting submit, a reaper racing a cancel.

mod support_pg;

use std::time::{Duration, Instant};

use tasq::{HandlerError, Pool, TaskType, TypeOptions};

use support_pg::{TestDb, eventually};

const JOB: TaskType<u32, u32> = TaskType::new("job");

/// Edge 1. A submit of key K waits on another session's uncommitted insert of K; that session
/// commits, and at once the task is cancelled (or deleted, as retention would) before the
/// waiting submit looks its holder up. The submit must insert, or return the live holder;
/// before the fix it failed now and then with "query returned an unexpected number of rows".
/// Each round gives the race one chance; the rounds alternate a cancel and a delete.
#[test]
fn a_key_holder_that_vanishes_never_fails_a_submit() {
    let Some(db) = TestDb::new() else { return };
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap();
    let (mut holder, mut remover, mut watcher) = (db.client(), db.client(), db.client());
    let cancel = remover
        .prepare(
            "UPDATE tasq_tasks SET status = 'cancelled', cancel_reason = 'requested',
             finished_at = now() WHERE key = $1",
        )
        .unwrap();
    let delete = remover
        .prepare("DELETE FROM tasq_tasks WHERE key = $1")
        .unwrap();
    let (mut inserted, mut duplicates) = (0, 0);
    for round in 0..150_u32 {
        let key = format!("k{round}");
        let mut tx = holder.transaction().unwrap();
        tx.execute(
            "INSERT INTO tasq_tasks (key, type, payload, priority, status, max_attempts)
             VALUES ($1, 'job', '0', 0, 'ready', 3)",
            &[&key],
        )
        .unwrap();
        let submit = std::thread::scope(|scope| {
            let waiting = scope.spawn(|| producer.submit(JOB.task(round).key(key.clone())));
            // The submit's insert waits for the holder's transaction.
            eventually(2, "the submit waits for the uncommitted key", || {
                db.a_pool_waits_for_a_lock(&mut watcher)
            });
            tx.commit().unwrap();
            let vanish = if round % 2 == 0 { &cancel } else { &delete };
            remover.execute(vanish, &[&key]).unwrap();
            waiting.join().unwrap()
        });
        match submit {
            Ok(handle) if handle.is_duplicate() => duplicates += 1,
            Ok(_) => inserted += 1,
            Err(error) => panic!("round {round}: the submit failed: {error}"),
        }
    }
    println!("{inserted} inserted after the holder vanished, {duplicates} found it live");
    assert_eq!(inserted + duplicates, 150);
}

/// Edge 2. The reaper returns expired leases while cancels of those very tasks commit: every
/// decision must come from the row as locked, so a task whose cancel committed is never sent
/// back to `ready` (with its cancel request still set, to run again). 60 rounds of 200 rows
/// with expired leases, cancelled by SQL as the pool's reaper runs; then no row may be ready or
/// blocked with a cancel request, and every cancelled one ended `cancelled`.
#[test]
fn the_reaper_decides_from_the_row_as_locked() {
    let Some(db) = TestDb::new() else { return };
    // The reaper runs every 100 ms; its claims never start (no handler runs a reaped task: the
    // pool registers another type).
    const OTHER: TaskType<u32, u32> = TaskType::new("other");
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .lease(Duration::from_millis(200))
        .register(OTHER, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let mut sql = db.client();
    let mut cancelled = 0_i64;
    let started = Instant::now();
    for _ in 0..60 {
        sql.batch_execute(
            "INSERT INTO tasq_tasks (type, payload, priority, status, attempts, max_attempts,
                                     lease_id, lease_until)
             SELECT 'job', '0', 0, 'running', 1, 3, nextval('tasq_lease'),
                    now() - interval '1 second'
             FROM generate_series(1, 200)",
        )
        .unwrap();
        // One row at a time, as cancels come in: each commits on its own, while the reaper
        // works through the same rows.
        for _ in 0..200 {
            let n = sql
                .execute(
                    // As the store's cancel: only a row still running gets the request (the
                    // statement rechecks that on the row as it locks it).
                    "UPDATE tasq_tasks SET cancel_requested = 'requested'
                     WHERE id = (SELECT id FROM tasq_tasks WHERE status = 'running'
                                 AND type = 'job' AND cancel_requested IS NULL LIMIT 1)
                       AND status = 'running'",
                    &[],
                )
                .unwrap();
            cancelled += n as i64;
        }
        eventually(2, "the reaper ends every expired lease", || {
            sql.query_one(
                "SELECT count(*) FROM tasq_tasks WHERE status = 'running' AND type = 'job'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
                == 0
        });
        let lost: i64 = sql
            .query_one(
                "SELECT count(*) FROM tasq_tasks
                 WHERE status IN ('ready', 'blocked') AND cancel_requested IS NOT NULL",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(lost, 0, "a cancel that committed was lost by the reaper");
        pool.check_invariants().unwrap();
        sql.batch_execute("DELETE FROM tasq_tasks WHERE type = 'job'")
            .unwrap();
    }
    println!(
        "{cancelled} cancels raced the reaper in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    pool.shutdown(Duration::from_secs(10));
}

/// Edge 8. Right after every connection of a pool dies, a submit still succeeds: the idle
/// pooled connection it gets is checked before use, or the work that failed on it runs again on
/// a new one. The rounds alternate two deaths: the server terminates the sessions (as a restart
/// does: each says farewell, "terminating connection due to administrator command"), and the
/// network cuts them with no word (the client finds only "connection closed"). Before, a submit
/// failed at once after either; after the first fix, still after the second (in CI).
#[test]
fn a_submit_right_after_the_connections_die_succeeds() {
    let Some(db) = TestDb::new() else { return };
    let (proxy, url) = db.through_proxy();
    let producer = Pool::builder()
        .postgres(url)
        .workers(0)
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap();
    for round in 0..8 {
        // Connections in use and idle ones both.
        let batch: Vec<_> = (0..4).map(|n| JOB.task(n)).collect();
        producer.submit_batch(batch).unwrap();
        if round % 2 == 0 {
            assert!(db.terminate_connections() > 0);
        } else {
            assert!(proxy.cut() > 0);
        }
        if round % 4 >= 2 {
            // Idle past the check's threshold.
            std::thread::sleep(Duration::from_millis(1_100));
        }
        producer
            .submit(JOB.task(round))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    let stats = producer.stats();
    println!("store errors: {}", stats.totals.store_errors);
    producer.shutdown(Duration::from_secs(10));
}

/// Edge 6. Ten pools share a type limited to 2 running at once; 300 tasks. Each task's ending
/// used to wake every pool holding such tasks, and all but one of their claims came back empty
/// (2,336 claim transactions for 300 tasks). Now the pool that ran a task claims next and the
/// others wait for their (jittered) poll: at most 1.5 claim transactions per task.
#[test]
fn a_limited_type_causes_no_stampede_of_claims() {
    let Some(db) = TestDb::new() else { return };
    const LIMITED: TaskType<u32, u32> = TaskType::new("limited");
    let options = TypeOptions::new().concurrency_limit(2);
    let pools: Vec<Pool> = (0..10)
        .map(|_| {
            Pool::builder()
                .postgres(db.url.clone())
                .workers(2)
                .register_with(LIMITED, options, |_, n: &u32| {
                    // Stands for a short call to a downstream.
                    std::thread::sleep(Duration::from_millis(2));
                    Ok::<_, HandlerError>(*n)
                })
                .build()
                .unwrap()
        })
        .collect();
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(LIMITED, options)
        .build()
        .unwrap();
    let before: u64 = pools.iter().map(|p| p.stats().totals.claims).sum();
    let handles = producer
        .submit_batch((0..300).map(|n| LIMITED.task(n)).collect())
        .unwrap();
    for (n, handle) in (0..).zip(&handles) {
        let outcome = handle.wait_timeout(Duration::from_secs(120));
        assert_eq!(outcome.and_then(|o| o.succeeded()), Some(n));
    }
    // Read once every pool has stopped: a pool counts an ending after its commit, which the
    // producer's handle may see first.
    for pool in &pools {
        assert!(!pool.shutdown(Duration::from_secs(10)).deadline_reached);
    }
    let totals: Vec<_> = pools.iter().map(|p| p.stats().totals).collect();
    let claims: u64 = totals.iter().map(|t| t.claims).sum::<u64>() - before;
    let empty: u64 = totals.iter().map(|t| t.empty_claims).sum();
    let ran: u64 = totals.iter().map(|t| t.succeeded).sum();
    println!("300 tasks: {claims} claim transactions, {empty} empty, in 10 pools");
    assert_eq!(ran, 300);
    assert!(
        claims * 2 <= 300 * 3,
        "{claims} claim transactions for 300 tasks ({empty} empty)"
    );
}

/// Section 2: `try_stats` says the store is away (within a few seconds: a reading waits 5 s for
/// the database, not the minute other work waits), where `stats` gives the queue's figures as
/// zeros and this pool's totals. Before, both returned zeros and said nothing.
#[test]
fn try_stats_says_when_the_store_is_away() {
    let Some(db) = TestDb::new() else { return };
    let (proxy, url) = db.through_proxy();
    let pool = Pool::builder()
        .postgres(url)
        .workers(0)
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap();
    pool.submit(JOB.task(1)).unwrap();
    assert_eq!(pool.try_stats().unwrap().ready, 1);
    // Every connection cut, and no new one accepted.
    drop(proxy);
    let asked = Instant::now();
    let error = pool.try_stats().unwrap_err();
    assert!(
        matches!(error, tasq::StatsError::StoreUnavailable(_)),
        "{error:?}"
    );
    assert!(asked.elapsed() < Duration::from_secs(30), "a hang guard");
    println!(
        "away: {error} after {:.1} s, {} store errors",
        asked.elapsed().as_secs_f64(),
        pool.stats().totals.store_errors
    );
    let stats = pool.stats();
    assert_eq!((stats.ready, stats.totals.submitted), (0, 1));
    pool.shutdown(Duration::from_secs(1));
}
