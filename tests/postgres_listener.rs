//! Edge 5 of issue 20: the durable store's listening connection, killed again and again or
//! silently dead, is replaced within a bounded time and without burning CPU.

mod support_pg;

use std::time::{Duration, Instant};

use tasq::{HandlerError, Pool, TaskType, TypeOptions};

use support_pg::TestDb;

const JOB: TaskType<u32, u32> = TaskType::new("job");

/// The pid of the server process of this test's listening connection, once there is one.
fn listener_backend(db: &TestDb) -> Option<i32> {
    db.client()
        .query_opt(
            "SELECT pid FROM pg_stat_activity
             WHERE application_name = $1 AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()
             ORDER BY backend_start DESC LIMIT 1",
            &[&db.schema()],
        )
        .unwrap()
        .map(|row| row.get(0))
}

/// A listener whose server process is terminated every 100 ms for 3 s reconnects with backoff:
/// its thread stays nearly idle (before: it spun, 2.5 CPU-seconds in 3 s), and once the
/// killing stops a new listener serves notifications again.
#[test]
fn a_listener_killed_again_and_again_backs_off_without_spinning() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        // Only a notification starts a task within the test's time.
        .poll_interval(Duration::from_secs(60))
        .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let give_up = Instant::now() + Duration::from_secs(20);
    while listener_backend(&db).is_none() {
        assert!(Instant::now() < give_up, "no listener");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut admin = db.client();
    let cpu_before = support_pg::thread_cpu("tasq-pg-maintai");
    let until = Instant::now() + Duration::from_secs(3);
    let mut kills = 0;
    while Instant::now() < until {
        if let Some(pid) = listener_backend(&db) {
            admin
                .execute("SELECT pg_terminate_backend($1)", &[&pid])
                .unwrap();
            kills += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cpu = support_pg::thread_cpu("tasq-pg-maintai").saturating_sub(cpu_before);
    println!("{kills} listeners killed; the maintenance thread used {cpu:?} of CPU in 3 s");
    assert!(
        kills >= 3,
        "the listener was never replaced ({kills} kills)"
    );
    assert!(
        cpu < Duration::from_millis(600),
        "the maintenance thread spun: {cpu:?} of CPU in 3 s"
    );
    // Alive again: a task submitted elsewhere starts on its notification, not on the poll.
    let other = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap();
    let handle = other.submit(JOB.task(7)).unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(30)),
        Some(tasq::Outcome::Succeeded(7))
    );
    pool.shutdown(Duration::from_secs(10));
}

/// A listener whose server process stops (SIGSTOP: bytes swallowed, no FIN or RST, as behind a
/// half-open connection) hears nothing and reports no error. Its own ping does not come back,
/// so it is replaced, and a task submitted elsewhere starts on its notification within a
/// bounded time (the pool's poll is a minute). Before, tasks started only on the poll, for
/// ever.
#[test]
fn a_silent_listener_is_replaced() {
    let Some(db) = TestDb::new() else { return };
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .poll_interval(Duration::from_secs(60))
        .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let give_up = Instant::now() + Duration::from_secs(20);
    let stopped = loop {
        if let Some(pid) = listener_backend(&db) {
            break pid;
        }
        assert!(Instant::now() < give_up, "no listener");
        std::thread::sleep(Duration::from_millis(10));
    };
    let signal = |which: &str| {
        std::process::Command::new("kill")
            .args([which, &stopped.to_string()])
            .status()
            .unwrap()
    };
    assert!(signal("-STOP").success());
    // Resumed and ended whatever happens below.
    struct Resume<F: Fn(&str) -> std::process::ExitStatus>(F);
    impl<F: Fn(&str) -> std::process::ExitStatus> Drop for Resume<F> {
        fn drop(&mut self) {
            (self.0)("-CONT");
        }
    }
    let _resume = Resume(signal);
    let other = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap();
    let submitted = Instant::now();
    let handle = other.submit(JOB.task(9)).unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(40)),
        Some(tasq::Outcome::Succeeded(9)),
        "the task waited for the minute's poll: the silent listener was never replaced"
    );
    println!(
        "started {:.1} s after the submit, with the old listener stopped",
        submitted.elapsed().as_secs_f64()
    );
    assert_ne!(listener_backend(&db), Some(stopped), "a new listener");
    pool.shutdown(Duration::from_secs(10));
}
