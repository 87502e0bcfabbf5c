//! The database goes away for 30 seconds in the middle of a run and comes back: every task ends
//! succeeded, each exactly once under its completing lease; a backlog alert raised before the
//! outage stays raised through it (the monitor cannot read the backlog, and must not read it as
//! zero) and clears once, after the database is back and the backlog is worked off.
//!
//! It stops the local server itself (`pg_ctlcluster`), so it is `#[ignore]`d: it would break
//! every other test that talks to the server meanwhile. `.ci/run` runs it alone, after the
//! suite: `cargo test --test postgres_outage -- --ignored`. A guard starts the server again
//! however the test ends.
#![cfg(feature = "postgres")]

mod support_pg;

use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use support_pg::TestDb;
use tasq::{Alert, AlertValue, Event, HandlerError, Outcome, Pool, TaskType};

/// Records (task, lease) in `effects` on a connection of its own, then succeeds; fails
/// retryably while the database is away.
const EFFECT: TaskType<u64, ()> = TaskType::new("effect");

fn connections() -> &'static Mutex<Vec<Client>> {
    static CONNECTIONS: OnceLock<Mutex<Vec<Client>>> = OnceLock::new();
    CONNECTIONS.get_or_init(|| Mutex::new(Vec::new()))
}

fn record(url: &str, task: u64, lease: Option<i64>) -> Result<(), HandlerError> {
    let spare = connections().lock().unwrap().pop();
    let mut client = match spare {
        Some(client) if !client.is_closed() => client,
        _ => Client::connect(url, NoTls).map_err(HandlerError::retryable)?,
    };
    client
        .execute(
            "INSERT INTO effects VALUES ($1, $2)",
            &[&(task as i64), &lease.unwrap_or(-1)],
        )
        .map_err(HandlerError::retryable)?;
    connections().lock().unwrap().push(client);
    Ok(())
}

/// `pg_ctlcluster <version> main <action>` for the local server.
fn cluster(action: &str) -> bool {
    let Ok(versions) = std::fs::read_dir("/etc/postgresql") else {
        return false;
    };
    let Some(version) = versions
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
    else {
        return false;
    };
    Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .args(if action == "stop" {
            &["-m", "fast"][..]
        } else {
            &[][..]
        })
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts the server again when dropped, however the test ends.
struct Restart;

impl Drop for Restart {
    fn drop(&mut self) {
        let _ = cluster("start");
    }
}

#[test]
#[ignore = "stops the local PostgreSQL server for 30 s: run alone (.ci/run does)"]
fn the_database_away_for_30_seconds_loses_nothing() {
    let Some(db) = TestDb::new() else { return };
    db.client()
        .batch_execute("CREATE TABLE effects (task BIGINT NOT NULL, lease BIGINT NOT NULL)")
        .unwrap();
    let url = db.url.clone();
    let (alerts, heard) = crossbeam_channel::unbounded();
    // Every row stays (the schema's policy, for every pool on it).
    db.change_policy(|p| p.finished_max_age(None));
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(2)
        .lease(Duration::from_secs(5))
        .poll_interval(Duration::from_millis(200))
        .retry_policy(tasq::RetryPolicy::exponential(
            Duration::from_millis(200),
            Duration::from_secs(2),
        ))
        .max_attempts(1_000)
        .quiet_panics(true)
        .alert(Alert::ready_depth(100))
        .monitor_interval(Duration::from_millis(100))
        .on_event(move |event| {
            if let Event::AlertRaised { value, .. } | Event::AlertCleared { value, .. } = event {
                let raised = matches!(event, Event::AlertRaised { .. });
                let _ = alerts.send((raised, *value, Instant::now()));
            }
        })
        .register(EFFECT, move |ctx, _: &u64| {
            record(&url, ctx.id().seq(), ctx.lease_id())
        })
        .build()
        .unwrap();
    let handles = pool
        .submit_batch((0..3_000).map(|n| EFFECT.task(n)).collect())
        .unwrap();
    // Mid-run: some tasks done, most not.
    for handle in &handles[..200] {
        assert!(matches!(
            handle.wait_timeout(Duration::from_secs(60)),
            Some(Outcome::Succeeded(()))
        ));
    }

    // The backlog (some 2,800 tasks) raised the alert.
    let (raised, value, _) = heard
        .recv_timeout(Duration::from_secs(60))
        .expect("the backlog alert was not raised");
    assert!(raised, "the first alert event is a clear: {value:?}");
    assert!(
        matches!(value, AlertValue::Depth(n) if n >= 100),
        "{value:?}"
    );

    let _restart = Restart;
    assert!(cluster("stop"), "could not stop the server");
    let stopped = Instant::now();
    // The outage itself: the scenario's 30 seconds, not a wait for anything.
    std::thread::sleep(Duration::from_secs(30));
    let restarted = Instant::now();
    assert!(cluster("start"), "could not start the server");
    let outage = stopped.elapsed();

    for handle in &handles {
        assert_eq!(
            handle.wait_timeout(Duration::from_secs(120)),
            Some(Outcome::Succeeded(())),
            "{} did not succeed after the outage",
            handle.id()
        );
    }
    let mut sql = db.client();
    let not_once: i64 = sql
        .query_one(
            "SELECT count(*) FROM tasq_tasks t
             WHERE t.status <> 'succeeded'
                OR (SELECT count(*) FROM effects e WHERE e.task = t.id AND e.lease = t.lease_id) <> 1",
            &[],
        )
        .unwrap()
        .get(0);
    let store_errors = pool.stats().totals.store_errors;
    println!(
        "outage of {:.1} s: 3,000 tasks succeeded, {store_errors} store errors reported",
        outage.as_secs_f64()
    );
    assert_eq!(
        not_once, 0,
        "a task not succeeded exactly once under its lease"
    );
    assert!(store_errors > 0, "the outage was not reported");
    // The backlog is gone: the alert clears, once, and not before the database came back.
    let (raised, value, at) = heard
        .recv_timeout(Duration::from_secs(60))
        .expect("the backlog alert did not clear");
    assert!(!raised, "the alert was raised twice: {value:?}");
    assert!(
        at >= restarted,
        "the alert cleared during the outage, on a backlog it could not read: {value:?}"
    );
    assert!(
        matches!(value, AlertValue::Depth(n) if n < 100),
        "{value:?}"
    );
    pool.check_invariants().unwrap();
    pool.shutdown(Duration::from_secs(10));
    let later: Vec<_> = heard.try_iter().collect();
    assert!(later.is_empty(), "alert events after the clear: {later:?}");
}
