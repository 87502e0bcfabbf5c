//! The durable store as one queue for a fleet of processes built with different settings: a
//! task's own settings are fixed when it is submitted and obeyed by every pool that claims,
//! retries, reaps or resubmits it, whatever that pool registered.

mod support_pg;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tasq::{
    FailureReason, HandlerError, Outcome, Pool, RetryPolicy, SubmitErrorKind, TaskState, TaskType,
    TypeOptions,
};

use support_pg::{TestDb, eventually};

const FLAKY: TaskType<u32, u32> = TaskType::new("flaky");

/// No backoff: the tests wait for retries, not for time.
const NOW: RetryPolicy = RetryPolicy::exponential(Duration::ZERO, Duration::ZERO);

/// A producer: no workers; `FLAKY` declared with `attempts`.
fn producer(db: &TestDb, attempts: u32) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(
            FLAKY,
            TypeOptions::new().max_attempts(attempts).retry_policy(NOW),
        )
        .build()
        .unwrap()
}

/// A worker registered with `attempts` whose handler always fails (retryably), counting its
/// runs and recording the `max_attempts` its context reports.
fn failing_worker(
    db: &TestDb,
    attempts: u32,
    runs: &Arc<AtomicU32>,
    seen: &Arc<AtomicU32>,
) -> Pool {
    let (runs, seen) = (Arc::clone(runs), Arc::clone(seen));
    Pool::builder()
        .postgres(db.url.clone())
        .workers(2)
        .poll_interval(Duration::from_millis(50))
        .register_with(
            FLAKY,
            TypeOptions::new().max_attempts(attempts).retry_policy(NOW),
            move |ctx, _: &u32| {
                runs.fetch_add(1, Ordering::SeqCst);
                seen.store(ctx.max_attempts(), Ordering::SeqCst);
                Err::<u32, _>(HandlerError::retryable("always"))
            },
        )
        .build()
        .unwrap()
}

fn failure(outcome: Outcome<u32>) -> tasq::Failure {
    match outcome {
        Outcome::Failed(failure) => failure,
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// The submitting pool's declaration (1 attempt) wins over the worker's registration (5): the
/// task runs once, its context says 1, `info` says 1.
#[test]
fn a_task_keeps_the_attempts_its_producer_gave_it() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db, 1);
    let (runs, seen) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let worker = failing_worker(&db, 5, &runs, &seen);
    let handle = producer.submit(FLAKY.task(1)).unwrap();
    assert_eq!(producer.info(handle.id()).unwrap().max_attempts, 1);
    let failed = failure(handle.wait());
    assert_eq!(
        (failed.reason, failed.attempts),
        (FailureReason::Exhausted, 1)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    worker.shutdown(Duration::from_secs(10));
}

/// A producer that allows 2, a worker that allows 8: the task's own 4 (set at submit) holds,
/// shown by `info` in both pools, and by the runs.
#[test]
fn a_task_set_at_submit_overrides_every_pool() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db, 2);
    let (runs, seen) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let worker = failing_worker(&db, 8, &runs, &seen);
    let policy = RetryPolicy::exponential(Duration::from_micros(7), Duration::from_micros(70));
    let handle = producer
        .submit(
            FLAKY
                .task(1)
                .max_attempts(4)
                .retry_policy(policy)
                .timeout(Duration::from_secs(60)),
        )
        .unwrap();
    let info = worker.info(handle.id()).unwrap();
    assert_eq!(info.max_attempts, 4);
    assert_eq!(info.retry_policy, policy);
    assert_eq!(info.timeout, Some(Duration::from_secs(60)));
    let failed = failure(handle.wait());
    assert_eq!(
        (failed.reason, failed.attempts),
        (FailureReason::Exhausted, 4)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(seen.load(Ordering::SeqCst), 4);
    worker.shutdown(Duration::from_secs(10));
}

/// A task's own settings that make no sense are refused at submit, with the task handed back.
#[test]
fn a_task_s_own_settings_are_checked_at_submit() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db, 2);
    let error = producer.submit(FLAKY.task(7).max_attempts(0)).unwrap_err();
    assert!(matches!(
        error.kind(),
        SubmitErrorKind::InvalidSetting {
            setting: "max_attempts",
            ..
        }
    ));
    assert_eq!(error.into_task().into_payload(), 7);
    let error = producer
        .submit(FLAKY.task(8).timeout(Duration::ZERO))
        .unwrap_err();
    assert!(matches!(
        error.kind(),
        SubmitErrorKind::InvalidSetting {
            setting: "timeout",
            ..
        }
    ));
}

/// A row at its limit (inserted by hand as ready with every attempt used) is never claimed: no
/// handler runs, and the reaper ends it as an exhausted dead letter.
#[test]
fn a_row_with_no_attempt_left_is_never_claimed() {
    let Some(db) = TestDb::new() else { return };
    let (runs, seen) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let worker = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .lease(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(20))
        .register_with(FLAKY, TypeOptions::new().max_attempts(9), {
            let runs = Arc::clone(&runs);
            move |_, n: &u32| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(*n)
            }
        })
        .build()
        .unwrap();
    drop(seen);
    let mut client = db.client();
    let id: i64 = client
        .query_one(
            "INSERT INTO tasq_tasks (type, payload, priority, status, attempts, max_attempts)
             VALUES ('flaky', '5', 0, 'ready', 3, 3) RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    // A task inserted after it, with attempts left, runs: the claim passed over the first.
    let later = worker.submit(FLAKY.task(6)).unwrap();
    assert_eq!(later.wait().succeeded(), Some(6));
    let id = tasq::TaskId::from_parts(worker.id(), id as u64);
    let handle = worker.handle(FLAKY, id).unwrap();
    let failed = failure(handle.wait());
    assert_eq!(
        (failed.reason, failed.attempts),
        (FailureReason::Exhausted, 3)
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only the task with attempts left ran"
    );
    assert_eq!(worker.status(id), Some(TaskState::Failed));
    worker.shutdown(Duration::from_secs(10));
}

/// A resubmitted dead letter keeps the settings it was submitted with, whatever the
/// resubmitting pool registered.
#[test]
fn a_resubmit_keeps_the_task_s_settings() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db, 3);
    let (runs, seen) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let worker = failing_worker(&db, 6, &runs, &seen);
    let handle = producer.submit(FLAKY.task(1).max_attempts(2)).unwrap();
    assert_eq!(failure(handle.wait()).attempts, 2);
    let again = worker.resubmit(FLAKY, handle.id()).unwrap();
    assert_eq!(worker.info(again.id()).unwrap().max_attempts, 2);
    assert_eq!(failure(again.wait()).attempts, 2);
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    worker.shutdown(Duration::from_secs(10));
}

/// A pool that declares a type without a handler never claims its tasks, workers or not.
#[test]
fn a_declared_type_is_not_claimed_by_its_declarer() {
    let Some(db) = TestDb::new() else { return };
    const OTHER: TaskType<u32, u32> = TaskType::new("other");
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .poll_interval(Duration::from_millis(20))
        .declare(FLAKY, TypeOptions::new())
        .register(OTHER, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let declared = pool.submit(FLAKY.task(1)).unwrap();
    // A task submitted after it runs: the pool claimed past the declared one.
    assert_eq!(
        pool.submit(OTHER.task(2)).unwrap().wait().succeeded(),
        Some(2)
    );
    assert_eq!(declared.status(), TaskState::Ready);
    let twice = Pool::builder()
        .postgres(db.url.clone())
        .declare(FLAKY, TypeOptions::new())
        .register(FLAKY, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build();
    assert!(matches!(
        twice,
        Err(tasq::BuildError::DuplicateType("flaky"))
    ));
    pool.shutdown(Duration::from_secs(10));
}

/// A run that a shutdown deadline interrupts on its last attempt is not a dead letter: its
/// row goes back to ready with the attempt not counted, its token said why, and another
/// process runs it.
#[test]
fn a_shutdown_costs_no_attempt() {
    let Some(db) = TestDb::new() else { return };
    const LONG: TaskType<u32, u32> = TaskType::new("long");
    let (tell, told) = std::sync::mpsc::channel();
    let (started, running) = std::sync::mpsc::channel();
    let tell = std::sync::Mutex::new(tell);
    let started = std::sync::Mutex::new(started);
    let first = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register_with(
            LONG,
            TypeOptions::new().max_attempts(1),
            move |ctx, _: &u32| {
                started.lock().unwrap().send(()).unwrap();
                ctx.token().wait();
                tell.lock().unwrap().send(ctx.token().interrupt()).unwrap();
                Err::<u32, _>(HandlerError::retryable("interrupted"))
            },
        )
        .build()
        .unwrap();
    let handle = first.submit(LONG.task(4)).unwrap();
    running.recv().unwrap();
    let report = first.shutdown(Duration::ZERO);
    assert_eq!(report.interrupted.len(), 1);
    assert_eq!(told.recv().unwrap(), Some(tasq::Interrupt::Shutdown));
    let row = db
        .client()
        .query_one(
            "SELECT status, attempts, dead FROM tasq_tasks WHERE id = $1",
            &[&(handle.id().seq() as i64)],
        )
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, i32>(1),
            row.get::<_, bool>(2)
        ),
        ("ready".to_owned(), 0, false)
    );
    let second = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .poll_interval(Duration::from_millis(20))
        .register_with(LONG, TypeOptions::new().max_attempts(1), |ctx, n: &u32| {
            Ok::<_, HandlerError>(*n + ctx.attempt())
        })
        .build()
        .unwrap();
    let again = second.handle(LONG, handle.id()).unwrap();
    assert_eq!(again.wait().succeeded(), Some(5));
    second.shutdown(Duration::from_secs(10));
}

/// A run past its timeout counts its attempt though a shutdown fired its token first: the
/// handler overran its task's own limit (it ignored the token), as it would have without the
/// shutdown, so its last attempt makes a `TimedOut` dead letter rather than going back.
#[test]
fn a_run_past_its_timeout_counts_though_a_shutdown_fired_first() {
    let Some(db) = TestDb::new() else { return };
    const OVERRUN: TaskType<u32, u32> = TaskType::new("overrun");
    const TIMEOUT: Duration = Duration::from_millis(40);
    let (started, running) = std::sync::mpsc::channel();
    let started = std::sync::Mutex::new(started);
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register_with(
            OVERRUN,
            TypeOptions::new().max_attempts(1).timeout(TIMEOUT),
            move |ctx, _: &u32| {
                let begun = std::time::Instant::now();
                started.lock().unwrap().send(()).unwrap();
                ctx.token().wait();
                // Told to stop, it goes on past its timeout, then fails as if interrupted.
                std::thread::sleep((TIMEOUT * 2).saturating_sub(begun.elapsed()));
                Err::<u32, _>(HandlerError::retryable("interrupted"))
            },
        )
        .build()
        .unwrap();
    let handle = pool.submit(OVERRUN.task(4)).unwrap();
    running.recv().unwrap();
    let report = pool.shutdown(Duration::ZERO);
    assert_eq!(report.interrupted.len(), 1);
    let row = db
        .client()
        .query_one(
            "SELECT status, attempts, dead, failure_reason FROM tasq_tasks WHERE id = $1",
            &[&(handle.id().seq() as i64)],
        )
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, i32>(1),
            row.get::<_, bool>(2),
            row.get::<_, Option<String>>(3)
        ),
        ("failed".to_owned(), 1, true, Some("timed_out".to_owned()))
    );
    assert!(matches!(
        handle.wait(),
        tasq::Outcome::Failed(failure) if failure.reason == tasq::FailureReason::TimedOut
    ));
}

/// A claim round whose limited queue's claim fails after the other queues' claim committed
/// still runs what that claim took (dropped, its rows would wait for their lease to run out and
/// cost an attempt): here the limited queue's row cannot be read (its column renamed under the
/// pool), and the lease is far longer than the wait.
#[test]
fn rows_claimed_before_a_failed_claim_of_the_round_still_run() {
    let Some(db) = TestDb::new() else { return };
    const PLAIN: TaskType<u32, u32> = TaskType::new("plain");
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(2)
        .lease(Duration::from_secs(600))
        .register(PLAIN, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    assert_eq!(pool.set_queue_limit("elsewhere", Some(1)), Ok(None));
    db.client()
        .batch_execute("ALTER TABLE tasq_queues RENAME COLUMN max_running TO broken")
        .unwrap();
    let handle = pool.submit(PLAIN.task(7)).unwrap();
    let outcome = handle.wait_timeout(Duration::from_secs(60));
    assert_eq!(outcome.and_then(tasq::Outcome::succeeded), Some(7));
    let attempts: i32 = db
        .client()
        .query_one(
            "SELECT attempts FROM tasq_tasks WHERE id = $1",
            &[&(handle.id().seq() as i64)],
        )
        .unwrap()
        .get(0);
    assert_eq!(attempts, 1);
    // The round that took the row may not have known the queue was limited yet (a reading of
    // the limited queues that began before `set_queue_limit` committed stands for a second):
    // then a later round's limited claim fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.stats().totals.store_errors == 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert!(
        pool.stats().totals.store_errors > 0,
        "the limited claim never failed"
    );
    pool.shutdown(Duration::from_secs(10));
}

/// A cancel from another pool fires the token with its reason.
#[test]
fn a_cancel_from_another_pool_says_so() {
    let Some(db) = TestDb::new() else { return };
    const LONG: TaskType<u32, u32> = TaskType::new("long");
    let (tell, told) = std::sync::mpsc::channel();
    let (started, running) = std::sync::mpsc::channel();
    let (tell, started) = (std::sync::Mutex::new(tell), std::sync::Mutex::new(started));
    let worker = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(LONG, move |ctx, _: &u32| {
            started.lock().unwrap().send(()).unwrap();
            ctx.token().wait();
            tell.lock().unwrap().send(ctx.token().interrupt()).unwrap();
            Ok::<_, HandlerError>(0)
        })
        .build()
        .unwrap();
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(LONG, TypeOptions::new())
        .build()
        .unwrap();
    let handle = producer.submit(LONG.task(1)).unwrap();
    running.recv().unwrap();
    handle.cancel().unwrap();
    assert_eq!(told.recv().unwrap(), Some(tasq::Interrupt::Cancelled));
    assert!(handle.wait().is_cancelled());
    worker.shutdown(Duration::from_secs(10));
}

/// A schema with the longest legal name (63 bytes): before schema version 3 its channel name,
/// `tasq_` and the schema's, was too long, and every submit failed with it. Now submits and
/// acks work, and the notifications reach a listener.
#[test]
fn a_schema_with_the_longest_legal_name_notifies() {
    let Some(db) = TestDb::with_longest_name() else {
        return;
    };
    assert_eq!(db.schema().len(), 63);
    let mut listener = db.client();
    let channel: String = listener
        .query_one("SELECT tasq_channel()", &[])
        .unwrap()
        .get(0);
    assert!(channel.len() <= 63, "{channel}");
    listener
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .unwrap();
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(FLAKY, |_, n: &u32| Ok::<_, HandlerError>(n + 1))
        .build()
        .unwrap();
    assert_eq!(
        pool.submit(FLAKY.task(1)).unwrap().wait().succeeded(),
        Some(2)
    );
    let mut words = Vec::new();
    let mut notifications = listener.notifications();
    let mut arriving = notifications.timeout_iter(Duration::from_secs(10));
    use postgres::fallible_iterator::FallibleIterator;
    while !words.iter().any(|w: &String| w.starts_with("done:")) {
        let Some(notification) = arriving.next().unwrap() else {
            panic!("no ending announced; heard {words:?}");
        };
        words.extend(notification.payload().split_whitespace().map(str::to_owned));
    }
    assert!(words.contains(&"ready".to_owned()), "{words:?}");
    pool.shutdown(Duration::from_secs(10));
}

/// The cleaner's role as its row holds it: (holder, whether its term is still running).
fn cleaner(db: &TestDb) -> Option<(String, bool)> {
    db.client()
        .query_opt(
            "SELECT holder, expires_at > now() FROM tasq_leader WHERE role = 'cleaner'",
            &[],
        )
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

fn echo_pool(db: &TestDb) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .poll_interval(Duration::from_millis(20))
        .register(FLAKY, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap()
}

/// Retention and the dead-letter limit are the schema's: a durable builder given its own
/// refuses to build, the policy reads back as set, and a pool built with the defaults keeps
/// what the fleet's policy keeps (a succeeded key still deduplicates after its cleaner ran).
#[test]
fn a_pool_with_the_defaults_deletes_nothing_the_fleet_keeps() {
    let Some(db) = TestDb::new() else { return };
    for builder in [
        Pool::builder().retention(10, None).postgres(db.url.clone()),
        Pool::builder()
            .postgres(db.url.clone())
            .dead_letter_limit(1),
    ] {
        let refused = builder
            .register(FLAKY, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .build();
        assert!(
            matches!(refused, Err(tasq::BuildError::InvalidSetting { .. })),
            "{refused:?}"
        );
    }
    let keep_all = tasq::postgres::Policy::default()
        .finished_max_age(None)
        .dead_letter_limit(None);
    tasq::postgres::set_policy(&db.url, &keep_all).unwrap();
    assert_eq!(tasq::postgres::policy(&db.url).unwrap(), keep_all);

    let fleet = echo_pool(&db);
    let charged = fleet.submit(FLAKY.task(1).key("order-17")).unwrap();
    assert_eq!(charged.wait().succeeded(), Some(1));
    // Old enough for the default policy (24 hours) to delete it.
    db.client()
        .execute(
            "UPDATE tasq_tasks SET finished_at = now() - interval '30 days'",
            &[],
        )
        .unwrap();
    fleet.shutdown(Duration::from_secs(10));
    let stray = echo_pool(&db);
    // The stray pool leads the cleaner (the fleet's pool gave it up), and has renewed its term
    // after a pass.
    eventually(20, "the stray pool holds the cleaner", || {
        cleaner(&db).is_some_and(|(_, running)| running)
    });
    let (holder, _) = cleaner(&db).unwrap();
    let first: std::time::SystemTime = db
        .client()
        .query_one(
            "SELECT expires_at FROM tasq_leader WHERE role = 'cleaner'",
            &[],
        )
        .unwrap()
        .get(0);
    eventually(20, "the stray pool renews its term after a pass", || {
        let later: std::time::SystemTime = db
            .client()
            .query_one(
                "SELECT expires_at FROM tasq_leader WHERE role = 'cleaner'",
                &[],
            )
            .unwrap()
            .get(0);
        later > first
    });
    assert_eq!(cleaner(&db).unwrap().0, holder);
    let again = stray.submit(FLAKY.task(1).key("order-17")).unwrap();
    assert!(again.is_duplicate(), "the order was charged twice");
    assert_eq!(again.id(), charged.id());
    stray.shutdown(Duration::from_secs(10));
}

/// The dead-letter limit is the schema's, applied as each task fails, whatever the pool.
#[test]
fn the_dead_letter_limit_is_the_schema_s() {
    let Some(db) = TestDb::new() else { return };
    db.change_policy(|p| p.dead_letter_limit(Some(2)));
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .register(FLAKY, |_, _: &u32| {
            Err::<u32, _>(HandlerError::permanent("no"))
        })
        .build()
        .unwrap();
    let ids: Vec<_> = (0..3)
        .map(|n| {
            let handle = pool.submit(FLAKY.task(n)).unwrap();
            assert!(handle.wait().is_failed());
            handle.id()
        })
        .collect();
    let kept: Vec<_> = pool.dead_letters().iter().map(|d| d.id).collect();
    assert_eq!(kept, ids[1..].to_vec());
    pool.shutdown(Duration::from_secs(10));
}

/// One pool at a time holds the cleaner; a pool that shuts down gives it up, and a lease left
/// by a dead process is taken over once its term runs out.
#[test]
fn one_pool_at_a_time_runs_the_cleaner_with_fail_over() {
    let Some(db) = TestDb::new() else { return };
    let pools: Vec<Pool> = (0..3).map(|_| echo_pool(&db)).collect();
    eventually(20, "a pool holds the cleaner", || cleaner(&db).is_some());
    let (first, _) = cleaner(&db).unwrap();
    let count: i64 = db
        .client()
        .query_one("SELECT count(*) FROM tasq_leader", &[])
        .unwrap()
        .get(0);
    assert_eq!(count, 1);
    for pool in pools {
        pool.shutdown(Duration::from_secs(10));
    }
    eventually(20, "the last pool to stop gave the role up", || {
        cleaner(&db).is_none()
    });

    // A process that died holding the role: its term runs out, then a live pool takes it.
    db.client()
        .execute(
            // An upsert: a stopped pool's maintenance thread may still be taking its last
            // pass (it resigns on the next).
            "INSERT INTO tasq_leader VALUES ('cleaner', 'dead:0', now() + interval '1 second')
             ON CONFLICT (role) DO UPDATE SET holder = EXCLUDED.holder,
                                              expires_at = EXCLUDED.expires_at",
            &[],
        )
        .unwrap();
    let pool = echo_pool(&db);
    eventually(20, "a live pool took over from the dead one", || {
        cleaner(&db).is_some_and(|(holder, running)| holder != "dead:0" && running)
    });
    assert_ne!(cleaner(&db).unwrap().0, first);
    pool.shutdown(Duration::from_secs(10));
}

/// Section 1: a producer and a worker that declare a type differently are reported, never
/// silent. The first pool built with a type records its declaration; a pool built with other
/// settings for it reports each difference at build (`Event::DeclarationMismatch`, counted in
/// `Totals::declaration_mismatches`) and records its own; one built like the last reports
/// nothing. Before, a producer's 3 attempts capped the tasks of workers registered with 20, and
/// nobody heard of it.
#[test]
fn a_type_declared_otherwise_than_the_fleet_is_reported() {
    let Some(db) = TestDb::new() else { return };
    let build = |options: TypeOptions, events: Option<crossbeam_channel::Sender<tasq::Event>>| {
        let mut builder = Pool::builder()
            .postgres(db.url.clone())
            .workers(0)
            .declare(FLAKY, options);
        if let Some(events) = events {
            builder = builder.on_event(move |event: &tasq::Event| {
                let _ = events.send(event.clone());
            });
        }
        builder.build().unwrap()
    };
    let producer = build(TypeOptions::new().max_attempts(3), None);
    assert_eq!(
        producer.stats().totals.declaration_mismatches,
        0,
        "the first"
    );
    let (tx, rx) = crossbeam_channel::unbounded();
    let worker = build(
        TypeOptions::new()
            .max_attempts(20)
            .concurrency_limit(2)
            .queue("mail"),
        Some(tx),
    );
    assert_eq!(worker.stats().totals.declaration_mismatches, 1);
    match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
        tasq::Event::DeclarationMismatch {
            task_type,
            differences,
            declared_by,
        } => {
            assert_eq!(task_type, "flaky");
            assert_eq!(
                differences,
                r#"concurrency 2 (null), max_attempts 20 (3), queue "mail" (null)"#
            );
            let pid = std::process::id().to_string();
            assert!(declared_by.starts_with(&format!("{pid}@")), "{declared_by}");
        }
        other => panic!("{other:?}"),
    }
    let like_the_worker = build(
        TypeOptions::new()
            .max_attempts(20)
            .concurrency_limit(2)
            .queue("mail"),
        None,
    );
    assert_eq!(like_the_worker.stats().totals.declaration_mismatches, 0);
    let like_the_producer = build(TypeOptions::new().max_attempts(3), None);
    assert_eq!(
        like_the_producer.stats().totals.declaration_mismatches,
        1,
        "against the last declaration, the worker's"
    );
    for pool in [producer, worker, like_the_worker, like_the_producer] {
        pool.shutdown(Duration::from_secs(5));
    }
}
