//! The durable store's claims against a real server: exact batch sizes, no row shared by
//! concurrent claimers, the partial index used on a large table, and how far a pool claims ahead
//! of its workers by default.
#![cfg(feature = "postgres")]

mod support_pg;

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use support_pg::TestDb;
use tasq::postgres::testing;
use tasq::{HandlerError, Outcome, Pool, TaskType};

/// Adds `ready` due rows of type `t` and `finished` succeeded ones, in one statement each.
fn fill(db: &TestDb, ready: i64, finished: i64) {
    let mut client = db.client();
    client
        .execute(
            "INSERT INTO tasq_tasks (type, payload, priority, status, run_at, max_attempts)
             SELECT 't', to_jsonb(n), (n % 10)::SMALLINT, 'ready', now() - interval '1 second', 3
             FROM generate_series(1, $1::BIGINT) AS n",
            &[&ready],
        )
        .unwrap();
    if finished > 0 {
        client
            .execute(
                "INSERT INTO tasq_tasks (type, payload, priority, status, run_at, max_attempts,
                                         finished_at)
                 SELECT 't', to_jsonb(n), (n % 10)::SMALLINT, 'succeeded', now(), 3, now()
                 FROM generate_series(1, $1::BIGINT) AS n",
                &[&finished],
            )
            .unwrap();
    }
    client.batch_execute("ANALYZE tasq_tasks").unwrap();
}

fn types() -> Vec<String> {
    vec!["t".to_owned()]
}

/// Claims of every size from 1 to 16, by 8 threads at once, each returns at most what it asked
/// for (PostgreSQL bug #15715 lets the `IN (... LIMIT n FOR UPDATE SKIP LOCKED)` form take more).
#[test]
fn a_claim_of_n_never_takes_more_than_n() {
    let Some(db) = TestDb::new() else { return };
    fill(&db, 4_000, 0);
    let db = Arc::new(db);
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            let (db, start) = (Arc::clone(&db), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut client = db.client();
                // Plans that rescan a subquery, as the `IN` form's bug needs: the statement must
                // hold its limit whatever plan the server picks.
                client
                    .batch_execute(
                        "SET enable_hashjoin = off; SET enable_mergejoin = off;
                         SET enable_material = off; SET enable_seqscan = off",
                    )
                    .unwrap();
                start.wait();
                let mut claimed = 0;
                for round in 0.. {
                    let limit = 1 + (round * 7 + thread) % 16;
                    let rows = testing::claim(&mut client, &types(), limit, 30_000_000).unwrap();
                    assert!(
                        rows.len() as i64 <= limit,
                        "a claim of {limit} took {}",
                        rows.len()
                    );
                    if rows.is_empty() {
                        break;
                    }
                    claimed += rows.len();
                }
                claimed
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 4_000, "every row claimed once");
}

/// 32 claimers drain 6,400 rows at once: each row is claimed by exactly one of them, and every
/// lease id is distinct.
#[test]
fn thirty_two_concurrent_claimers_never_share_a_row() {
    let Some(db) = TestDb::new() else { return };
    fill(&db, 6_400, 0);
    let db = Arc::new(db);
    let start = Arc::new(Barrier::new(32));
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let (db, start) = (Arc::clone(&db), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut client = db.client();
                start.wait();
                let mut mine = Vec::new();
                loop {
                    let rows = testing::claim(&mut client, &types(), 10, 30_000_000).unwrap();
                    if rows.is_empty() {
                        return mine;
                    }
                    mine.extend(rows);
                }
            })
        })
        .collect();
    let mut ids = HashSet::new();
    let mut leases = HashSet::new();
    for thread in threads {
        for (id, lease) in thread.join().unwrap() {
            assert!(ids.insert(id), "row {id} was claimed twice");
            assert!(leases.insert(lease), "lease {lease} was given twice");
        }
    }
    assert_eq!(ids.len(), 6_400);
    let running: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM tasq_tasks WHERE status = 'running'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(running, 6_400);
}

/// With a million rows, 99% of them finished, the claim reads the partial index of ready rows
/// (no sequential scan of the table).
#[test]
fn the_claim_uses_the_partial_index_on_a_million_rows() {
    let Some(db) = TestDb::new() else { return };
    fill(&db, 10_000, 990_000);
    let mut client = db.client();
    client
        .batch_execute(&format!(
            "PREPARE claim(TEXT[], BIGINT, BIGINT) AS {}",
            testing::CLAIM
        ))
        .unwrap();
    // Both the plans PostgreSQL may choose for a prepared statement: custom and generic.
    for mode in ["force_custom_plan", "force_generic_plan"] {
        client
            .batch_execute(&format!("SET plan_cache_mode = {mode}"))
            .unwrap();
        let plan: String = client
            .query("EXPLAIN EXECUTE claim('{t}', 10, 30000000)", &[])
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0) + "\n")
            .collect();
        assert!(
            plan.contains("tasq_dequeue"),
            "the claim does not use the dequeue index ({mode}):\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on tasq_tasks"),
            "the claim scans the whole table ({mode}):\n{plan}"
        );
    }
    let claimed = testing::claim(&mut client, &types(), 10, 30_000_000).unwrap();
    assert_eq!(claimed.len(), 10);
}

const SHORT: TaskType<u32, ()> = TaskType::new("short");
const BLOCK: TaskType<u32, ()> = TaskType::new("block");

/// A pool left to its default claims ahead of its one worker while a backlog lasts (more rows
/// running than it has workers), and only for its free workers once a claim comes back short:
/// a task submitted while its worker is busy is left for an idle pool elsewhere, which runs
/// it at once.
#[test]
fn a_default_pool_claims_ahead_only_while_a_backlog_lasts() {
    let Some(db) = TestDb::new() else { return };
    let (started_tx, started_rx) = crossbeam_channel::unbounded();
    let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
    let a = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(SHORT, |_, _: &u32| Ok::<_, HandlerError>(()))
        .register(BLOCK, move |_, _: &u32| {
            started_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            Ok::<_, HandlerError>(())
        })
        .build()
        .unwrap();
    let backlog: Vec<_> = (0..3_000).map(|n| SHORT.task(n)).collect();
    drop(a.submit_batch(backlog).unwrap());
    // The most rows the pool held at once while it drained the backlog.
    let mut client = db.client();
    let mut most = 0;
    loop {
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE status = 'running'),
                        count(*) FILTER (WHERE status IN ('ready', 'running'))
                 FROM tasq_tasks",
                &[],
            )
            .unwrap();
        let (running, left): (i64, i64) = (row.get(0), row.get(1));
        most = most.max(running);
        if left == 0 {
            break;
        }
    }
    assert!(most > 1, "one worker, and never more than {most} rows held");
    // The backlog is gone: the claim of the blocking task comes back short.
    let blocking = a.submit(BLOCK.task(0)).unwrap();
    started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let next = a.submit(SHORT.task(1)).unwrap();
    let b = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(SHORT, |_, _: &u32| Ok::<_, HandlerError>(()))
        .build()
        .unwrap();
    assert_eq!(
        next.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(())),
        "the task waited behind the busy worker"
    );
    release_tx.send(()).unwrap();
    assert_eq!(
        blocking.wait_timeout(Duration::from_secs(10)),
        Some(Outcome::Succeeded(()))
    );
    assert_eq!(b.shutdown(Duration::from_secs(10)).succeeded, 1);
    assert_eq!(a.shutdown(Duration::from_secs(10)).succeeded, 3_001);
    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}
