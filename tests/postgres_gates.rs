//! Limits, breakers and aging on the durable store, shared by every pool on the database. Two
//! pools on one schema stand for two processes: they share nothing but the rows (and, for the
//! tests on a manual clock, the clock). Also: the schema's upgrade from version 1, the claim's
//! index after it, and a manual clock's time in a caller's transaction.
#![cfg(feature = "postgres")]

mod support_pg;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use support_pg::TestDb;
use tasq::postgres::testing;
use tasq::{
    Aging, Breaker, BreakerState, Event, HandlerError, ManualClock, Outcome, Pool, RateLimit,
    TaskId, TaskType, TypeOptions,
};

const LIMITED: TaskType<u32, ()> = TaskType::new("limited");
const FREE: TaskType<u32, ()> = TaskType::new("free");
const CALL: TaskType<u32, ()> = TaskType::new("call");
const JOB: TaskType<u32, ()> = TaskType::new("job");

/// Polls `done` until it holds; fails the test after `timeout`.
fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ===== concurrency limits =====

/// Two pools of four workers each (one prefetching), a limit of 2 on one type: never more than 2
/// of its handlers run at once across both pools, nor more than 2 of its rows are running
/// (claims not started count), while the other type runs freely; the limit is reached, not
/// undershot.
#[test]
fn a_concurrency_limit_holds_across_two_pools() {
    let Some(db) = TestDb::new() else { return };
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let build = |tag: usize| {
        let (running, most, ran) = (Arc::clone(&running), Arc::clone(&most), Arc::clone(&ran));
        Pool::builder()
            .postgres(db.url.clone())
            .workers(4)
            // Pool A claims beyond its workers: its claims waiting here count too.
            .prefetch(if tag == 0 { 3 } else { 0 })
            .poll_interval(Duration::from_millis(100))
            .register_with(
                LIMITED,
                TypeOptions::new().concurrency_limit(2),
                move |_, _: &u32| {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    running.fetch_sub(1, Ordering::SeqCst);
                    ran[tag].fetch_add(1, Ordering::SeqCst);
                    Ok::<_, HandlerError>(())
                },
            )
            .register(FREE, |_, _: &u32| Ok::<_, HandlerError>(()))
            .build()
            .unwrap()
    };
    let (a, b) = (build(0), build(1));

    // The rows' view, watched from outside: running rows of the type, claims included.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, mut client) = (Arc::clone(&stop), db.client());
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(Ordering::SeqCst) {
                let n: i64 = client
                    .query_one(
                        "SELECT count(*) FROM tasq_tasks WHERE type = 'limited' AND status = 'running'",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                most = most.max(n);
            }
            most
        })
    };
    let started = Instant::now();
    let limited = a
        .submit_batch((0..100).map(|n| LIMITED.task(n)).collect())
        .unwrap();
    let free = b
        .submit_batch((0..100).map(|n| FREE.task(n)).collect())
        .unwrap();
    for handle in limited.iter() {
        assert_eq!(
            handle.wait_timeout(Duration::from_secs(60)),
            Some(Outcome::Succeeded(()))
        );
    }
    for handle in free.iter() {
        assert_eq!(
            handle.wait_timeout(Duration::from_secs(60)),
            Some(Outcome::Succeeded(()))
        );
    }
    stop.store(true, Ordering::SeqCst);
    let most_rows = watcher.join().unwrap();
    let (ran_a, ran_b) = (ran[0].load(Ordering::SeqCst), ran[1].load(Ordering::SeqCst));
    println!(
        "concurrency: {ran_a} + {ran_b} runs, at most {} handlers and {most_rows} rows at once, \
         {:.2} s",
        most.load(Ordering::SeqCst),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(ran_a + ran_b, 100);
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "the limit is held, and reached"
    );
    assert!(most_rows <= 2, "{most_rows} rows running at once");
    a.check_invariants().unwrap();
    a.shutdown(Duration::from_secs(10));
    b.shutdown(Duration::from_secs(10));
}

// ===== rate limits =====

/// A bucket of 3 refilled at 10 a second, shared by two pools on one manual clock: at every
/// moment the starts so far are at most `3 + 10·t`, and each step of the clock lets exactly its
/// tokens' worth start (across both pools, not in each).
#[test]
fn a_rate_limit_holds_across_two_pools_on_a_manual_clock() {
    let Some(db) = TestDb::new() else { return };
    let clock = ManualClock::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let by_pool = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let build = |tag: usize| {
        let (starts, by_pool) = (Arc::clone(&starts), Arc::clone(&by_pool));
        Pool::builder()
            .postgres(db.url.clone())
            .workers(2)
            .poll_interval(Duration::from_millis(50))
            .manual_clock(clock.clone())
            .register_with(
                LIMITED,
                TypeOptions::new().rate_limit(RateLimit::per_second(10.0).with_burst(3)),
                move |_, _: &u32| {
                    starts.fetch_add(1, Ordering::SeqCst);
                    by_pool[tag].fetch_add(1, Ordering::SeqCst);
                    Ok::<_, HandlerError>(())
                },
            )
            .build()
            .unwrap()
    };
    let (a, b) = (build(0), build(1));
    let handles = a
        .submit_batch((0..30).map(|n| LIMITED.task(n)).collect())
        .unwrap();
    let step = Duration::from_millis(100);
    for k in 0..=28 {
        if k > 0 {
            clock.advance(step);
        }
        // Burst 3, then one token a step.
        let allowed = 3 + k;
        let expected = allowed.min(30);
        wait_until(
            &format!("{expected} starts at step {k}"),
            Duration::from_secs(20),
            || starts.load(Ordering::SeqCst) >= expected,
        );
        // Time for both fetchers to try again (they poll every 50 ms).
        std::thread::sleep(Duration::from_millis(120));
        let now = starts.load(Ordering::SeqCst);
        assert!(now <= allowed, "{now} starts by step {k}, over {allowed}");
    }
    for handle in &handles {
        assert_eq!(
            handle.wait_timeout(Duration::from_secs(10)),
            Some(Outcome::Succeeded(()))
        );
    }
    println!(
        "rate: pool A started {}, pool B {}",
        by_pool[0].load(Ordering::SeqCst),
        by_pool[1].load(Ordering::SeqCst)
    );
    a.shutdown(Duration::from_secs(10));
    b.shutdown(Duration::from_secs(10));
}

// ===== circuit breakers =====

/// What the `CALL` handlers do, set by the test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Fail,
    Succeed,
    /// Wait until the mode changes.
    Hold,
}

struct Control {
    mode: Mutex<Mode>,
    changed: Condvar,
    /// Every run: the pool's tag and the task's payload.
    runs: Mutex<Vec<(char, u32)>>,
}

impl Control {
    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
        self.changed.notify_all();
    }

    fn runs(&self) -> usize {
        self.runs.lock().unwrap().len()
    }

    fn run(&self, tag: char, n: u32) -> Result<(), HandlerError> {
        self.runs.lock().unwrap().push((tag, n));
        let mut mode = self.mode.lock().unwrap();
        while *mode == Mode::Hold {
            mode = self.changed.wait(mode).unwrap();
        }
        match *mode {
            Mode::Fail => Err(HandlerError::retryable("the downstream is down")),
            _ => Ok(()),
        }
    }
}

/// One breaker shared by two pools on one manual clock: failures in pool A open it; pool B, built
/// after, holds the downstream's tasks too; after the cool-down exactly one probe runs across
/// both pools; its failure reopens the breaker; A goes away, and after the next cool-down B's
/// successful probe closes it and the rest run. Every change is reported once across both
/// pools, by the pool that made it.
#[test]
fn a_breaker_is_shared_by_two_pools() {
    let Some(db) = TestDb::new() else { return };
    let clock = ManualClock::new();
    let control = Arc::new(Control {
        mode: Mutex::new(Mode::Fail),
        changed: Condvar::new(),
        runs: Mutex::new(Vec::new()),
    });
    let events: Arc<Mutex<Vec<(char, Event)>>> = Arc::new(Mutex::new(Vec::new()));
    let cool_down = Duration::from_secs(10);
    let build = |tag: char, workers: usize| {
        let (control, events) = (Arc::clone(&control), Arc::clone(&events));
        Pool::builder()
            .postgres(db.url.clone())
            .workers(workers)
            .poll_interval(Duration::from_millis(50))
            .manual_clock(clock.clone())
            .quiet_panics(true)
            .breaker("svc", Breaker::new(3, cool_down))
            .on_event(move |event| {
                if matches!(event, Event::Breaker { .. }) {
                    events.lock().unwrap().push((tag, event.clone()));
                }
            })
            .register_with(
                CALL,
                TypeOptions::new().downstream("svc").max_attempts(1),
                move |_, n: &u32| control.run(tag, *n),
            )
            .build()
            .unwrap()
    };
    let states = |events: &[(char, Event)]| -> Vec<BreakerState> {
        events
            .iter()
            .map(|(_, e)| match e {
                Event::Breaker { state, .. } => *state,
                _ => unreachable!(),
            })
            .collect()
    };
    let wait_events = |n: usize| {
        wait_until(
            &format!("{n} breaker events"),
            Duration::from_secs(20),
            || events.lock().unwrap().len() >= n,
        )
    };

    // Three failures in pool A open it.
    let a = build('A', 1);
    let failing = a
        .submit_batch((0..3).map(|n| CALL.task(n)).collect())
        .unwrap();
    for handle in failing.iter() {
        let outcome = handle.wait_timeout(Duration::from_secs(20)).unwrap();
        assert!(outcome.is_failed(), "{outcome:?}");
    }
    wait_events(1);
    assert_eq!(events.lock().unwrap()[0].0, 'A', "A's failure opened it");
    assert_eq!(a.stats().breakers, [("svc", BreakerState::Open)]);

    // Pool B holds the downstream's tasks too, as A does.
    let b = build('B', 2);
    assert_eq!(b.stats().breakers, [("svc", BreakerState::Open)]);
    control.set(Mode::Hold);
    let held = b
        .submit_batch((10..14).map(|n| CALL.task(n)).collect())
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(control.runs(), 3, "nothing runs while the breaker is open");
    assert!(
        held.iter()
            .all(|h| b.status(h.id()) == Some(tasq::TaskState::Ready))
    );

    // After the cool-down, exactly one probe across both pools.
    clock.advance(cool_down);
    wait_until("the probe", Duration::from_secs(20), || control.runs() == 4);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(control.runs(), 4, "one probe, not one per pool");
    assert_eq!(a.stats().breakers, [("svc", BreakerState::HalfOpen)]);
    assert_eq!(b.stats().breakers, [("svc", BreakerState::HalfOpen)]);

    // The probe fails: open again, for another cool-down.
    control.set(Mode::Fail);
    wait_events(3);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        control.runs(),
        4,
        "nothing runs while the breaker is open again"
    );
    assert_eq!(b.stats().breakers, [("svc", BreakerState::Open)]);

    // Pool A goes away: B alone probes next, and reports what it changes.
    a.shutdown(Duration::from_secs(10));

    // The next probe succeeds: closed, and the rest run.
    control.set(Mode::Succeed);
    clock.advance(cool_down);
    let outcomes: Vec<Outcome<()>> = held
        .iter()
        .map(|h| h.wait_timeout(Duration::from_secs(20)).unwrap())
        .collect();
    let failed = outcomes.iter().filter(|o| o.is_failed()).count();
    let succeeded = outcomes
        .iter()
        .filter(|o| **o == Outcome::Succeeded(()))
        .count();
    assert_eq!((failed, succeeded), (1, 3), "only the first probe failed");
    wait_events(5);
    std::thread::sleep(Duration::from_millis(300));
    let seen = events.lock().unwrap().clone();
    println!("breaker events: {seen:?}");
    assert_eq!(
        states(&seen),
        [
            BreakerState::Open,
            BreakerState::HalfOpen,
            BreakerState::Open,
            BreakerState::HalfOpen,
            BreakerState::Closed
        ],
        "each change reported once, across both pools"
    );
    assert_eq!(seen[0].0, 'A');
    assert_eq!((seen[3].0, seen[4].0), ('B', 'B'), "B probed and closed it");
    // A's three, then each held task once (the failed probe was not retried: one attempt).
    assert_eq!(control.runs(), 3 + 4);
    assert_eq!(b.stats().breakers, [("svc", BreakerState::Closed)]);
    b.shutdown(Duration::from_secs(10));
}

/// The probe's process dies (here: its pool is dropped while the probe runs, so nothing extends
/// its lease): once the reaper takes the probe's row back, another pool runs a probe, whose
/// success closes the breaker. The dead probe, when its handler finally returns, changes
/// nothing.
#[test]
fn a_probe_whose_process_dies_lets_another_probe_run() {
    let Some(db) = TestDb::new() else { return };
    let clock = ManualClock::new();
    let control = Arc::new(Control {
        mode: Mutex::new(Mode::Fail),
        changed: Condvar::new(),
        runs: Mutex::new(Vec::new()),
    });
    let events: Arc<Mutex<Vec<(char, Event)>>> = Arc::new(Mutex::new(Vec::new()));
    let cool_down = Duration::from_secs(10);
    let build = |tag: char| {
        let (control, events) = (Arc::clone(&control), Arc::clone(&events));
        Pool::builder()
            .postgres(db.url.clone())
            .workers(1)
            .lease(Duration::from_millis(600))
            .poll_interval(Duration::from_millis(50))
            .manual_clock(clock.clone())
            .breaker("svc", Breaker::new(1, cool_down))
            .on_event(move |event| {
                if matches!(event, Event::Breaker { .. }) {
                    events.lock().unwrap().push((tag, event.clone()));
                }
            })
            .register_with(
                CALL,
                TypeOptions::new().downstream("svc").max_attempts(5),
                move |_, n: &u32| control.run(tag, *n),
            )
            .build()
            .unwrap()
    };
    let a = build('A');
    // One failure opens it (its retry waits for the breaker).
    let task = a.submit(CALL.task(1)).unwrap();
    wait_until("the breaker to open", Duration::from_secs(20), || {
        a.stats().breakers == [("svc", BreakerState::Open)]
    });
    // A's probe holds its worker; then A's process "dies".
    control.set(Mode::Hold);
    clock.advance(cool_down);
    wait_until("A's probe", Duration::from_secs(20), || control.runs() == 2);
    drop(a);
    let b = build('B');
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        control.runs(),
        2,
        "no second probe while the first one's lease holds"
    );
    assert_eq!(b.stats().breakers, [("svc", BreakerState::HalfOpen)]);
    // Once the lease expires, B's reaper takes the row back, and B probes with it.
    wait_until("B's probe", Duration::from_secs(20), || control.runs() == 3);
    assert_eq!(control.runs.lock().unwrap()[2].0, 'B');
    control.set(Mode::Succeed);
    let handle = b.handle(CALL, task.id()).unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(()))
    );
    wait_until("the close", Duration::from_secs(20), || {
        events.lock().unwrap().len() >= 3
    });
    std::thread::sleep(Duration::from_millis(300));
    let seen: Vec<(char, BreakerState)> = events
        .lock()
        .unwrap()
        .iter()
        .map(|(tag, e)| match e {
            Event::Breaker { state, .. } => (*tag, *state),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        seen,
        [
            ('A', BreakerState::Open),
            ('A', BreakerState::HalfOpen),
            ('B', BreakerState::Closed)
        ]
    );
    assert_eq!(b.stats().breakers, [("svc", BreakerState::Closed)]);
    assert_eq!(control.runs(), 3);
    b.shutdown(Duration::from_secs(10));
}

// ===== aging =====

/// Permits for the `JOB` handlers: each run records its start and waits for one.
struct Starts {
    clock: ManualClock,
    started: Mutex<Vec<(u32, Instant)>>,
    permits: Mutex<u32>,
    released: Condvar,
}

impl Starts {
    fn run(&self, n: u32) {
        self.started.lock().unwrap().push((n, self.clock.now()));
        let mut permits = self.permits.lock().unwrap();
        while *permits == 0 {
            permits = self.released.wait(permits).unwrap();
        }
        *permits -= 1;
    }

    fn release(&self, n: u32) {
        *self.permits.lock().unwrap() += n;
        self.released.notify_all();
    }

    fn count(&self) -> usize {
        self.started.lock().unwrap().len()
    }
}

/// Aging on the durable store, on a manual clock: a priority-0 task behind a stream of fresh
/// priority-5 work (the ceiling) starts within `(5 - 0) × every` plus one `every`; while it
/// waits, its own priority is what the pool reports, and its row's effective priority rises.
#[test]
fn aging_bounds_the_wait_on_the_durable_store() {
    let Some(db) = TestDb::new() else { return };
    let clock = ManualClock::new();
    let every = Duration::from_secs(1);
    let starts = Arc::new(Starts {
        clock: clock.clone(),
        started: Mutex::new(Vec::new()),
        permits: Mutex::new(0),
        released: Condvar::new(),
    });
    let pool = {
        let starts = Arc::clone(&starts);
        Pool::builder()
            .postgres(db.url.clone())
            .workers(1)
            .poll_interval(Duration::from_millis(50))
            .manual_clock(clock.clone())
            .aging(Aging::new(every, 5))
            .register(JOB, move |_, n: &u32| {
                starts.run(*n);
                Ok::<_, HandlerError>(())
            })
            .build()
            .unwrap()
    };
    // The worker is busy: what follows queues.
    let blocker = pool.submit(JOB.task(999).priority(9)).unwrap();
    wait_until("the blocker", Duration::from_secs(20), || {
        starts.count() == 1
    });
    let low = pool.submit(JOB.task(0).priority(0)).unwrap();
    let since = clock.now();
    let mut high = vec![
        pool.submit(JOB.task(100).priority(5)).unwrap(),
        pool.submit(JOB.task(101).priority(5)).unwrap(),
    ];
    let mut sql = db.client();
    let mut low_started = None;
    for step in 1..=10u32 {
        clock.advance(every);
        // Fresh work at the ceiling keeps coming.
        high.push(pool.submit(JOB.task(101 + step).priority(5)).unwrap());
        starts.release(1);
        wait_until(
            &format!("start {} (step {step})", step + 1),
            Duration::from_secs(20),
            || starts.count() == step as usize + 1,
        );
        let (n, at) = *starts.started.lock().unwrap().last().unwrap();
        if n == 0 {
            low_started = Some(at.duration_since(since));
            break;
        }
        if step == 3 {
            // The pool reports the task's own priority; the row carries the aged one.
            assert_eq!(pool.info(low.id()).unwrap().priority, 0);
            assert!(pool.stats().ready_by_priority.contains(&(0, 1)));
            let row = sql
                .query_one(
                    "SELECT priority, base_priority FROM tasq_tasks WHERE id = $1",
                    &[&(low.id().seq() as i64)],
                )
                .unwrap();
            let (effective, own): (i16, Option<i16>) = (row.get(0), row.get(1));
            assert_eq!((effective, own), (3, Some(0)), "aged by three levels");
        }
    }
    let waited = low_started.expect("the low-priority task never started");
    println!("aging: the priority-0 task started after {waited:?} of the clock");
    assert!(
        waited <= every * (5 + 1),
        "waited {waited:?}, over the bound of 6 × {every:?}"
    );
    assert!(
        waited >= every * 4,
        "started after {waited:?}: fresh priority-5 work should have gone first until then"
    );
    starts.release(1_000);
    assert_eq!(
        low.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(()))
    );
    assert_eq!(pool.info(low.id()).unwrap().priority, 0);
    for handle in high.iter().chain([&blocker]) {
        assert_eq!(
            handle.wait_timeout(Duration::from_secs(20)),
            Some(Outcome::Succeeded(()))
        );
    }
    pool.shutdown(Duration::from_secs(10));
}

/// After migration 2 and an aging pass, on a million rows (99% finished): the plain claim, the
/// gated pick and the aging update all read the partial index of ready rows, in both the plans
/// a prepared statement may get.
#[test]
fn the_claims_and_the_aging_update_use_the_dequeue_index_on_a_million_rows() {
    let Some(db) = TestDb::new() else { return };
    let mut client = db.client();
    client
        .execute(
            "INSERT INTO tasq_tasks (type, payload, priority, status, run_at, max_attempts)
             SELECT 't', to_jsonb(n), (n % 10)::SMALLINT, 'ready', now() - interval '1 hour', 3
             FROM generate_series(1, 10000) AS n",
            &[],
        )
        .unwrap();
    client
        .execute(
            "INSERT INTO tasq_tasks (type, payload, priority, status, run_at, max_attempts,
                                     finished_at)
             SELECT 't', to_jsonb(n), (n % 10)::SMALLINT, 'succeeded', now(), 3, now()
             FROM generate_series(1, 990000) AS n",
            &[],
        )
        .unwrap();
    client.batch_execute("ANALYZE tasq_tasks").unwrap();
    // One level a second, ceiling 5: every ready row below 5 waited an hour, and reaches it.
    let aged = client
        .execute(testing::AGE, &[&vec!["t"], &5i32, &1_000_000i64])
        .unwrap();
    assert_eq!(aged, 5_000);
    let at_ceiling: i64 = client
        .query_one(
            "SELECT count(*) FROM tasq_tasks WHERE status = 'ready' AND priority = 5
             AND base_priority IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        at_ceiling, 5_000,
        "aged to the ceiling; the rows above it keep theirs"
    );
    client.batch_execute("ANALYZE tasq_tasks").unwrap();
    let statements = [
        (
            "claim",
            "TEXT[], BIGINT, BIGINT",
            testing::CLAIM,
            "'{t}', 10, 30000000",
        ),
        (
            "pick",
            "TEXT[], BIGINT, BIGINT, TEXT[]",
            testing::GATED_PICK,
            "'{t}', 10, 30000000, '{t}'",
        ),
        (
            "age",
            "TEXT[], INT, BIGINT",
            testing::AGE,
            "'{t}', 7, 1000000",
        ),
    ];
    for (name, types, sql, args) in statements {
        client
            .batch_execute(&format!("PREPARE {name}({types}) AS {sql}"))
            .unwrap();
        for mode in ["force_custom_plan", "force_generic_plan"] {
            client
                .batch_execute(&format!("SET plan_cache_mode = {mode}"))
                .unwrap();
            let plan: String = client
                .query(&format!("EXPLAIN EXECUTE {name}({args})"), &[])
                .unwrap()
                .iter()
                .map(|r| r.get::<_, String>(0) + "\n")
                .collect();
            assert!(
                plan.contains("tasq_dequeue"),
                "{name} does not use the dequeue index ({mode}):\n{plan}"
            );
            assert!(
                !plan.contains("Seq Scan on tasq_tasks"),
                "{name} scans the whole table ({mode}):\n{plan}"
            );
        }
    }
    let claimed = testing::claim(&mut client, &["t".to_owned()], 10, 30_000_000).unwrap();
    assert_eq!(claimed.len(), 10);
}

// ===== the schema's upgrade =====

/// A database at schema version 1, with rows in it: a pool refuses it; `migrate` upgrades it
/// (once), keeps every row, and a pool with gates and aging then runs the old ready task, lists
/// the old dead letter with its priority, and resubmits it.
#[test]
fn a_version_1_schema_upgrades_and_keeps_its_rows() {
    let Some(db) = TestDb::at_version(1) else {
        return;
    };
    let mut sql = db.client();
    let insert = |sql: &mut postgres::Client, columns: &str, values: &str| -> i64 {
        sql.query_one(
            &format!("INSERT INTO tasq_tasks ({columns}) VALUES ({values}) RETURNING id"),
            &[],
        )
        .unwrap()
        .get(0)
    };
    let ready = insert(
        &mut sql,
        "type, payload, priority, status, max_attempts",
        "'limited', '7', 4, 'ready', 3",
    );
    let dead = insert(
        &mut sql,
        "type, payload, priority, status, dead, failure_reason, attempts, max_attempts, \
         last_error, finished_at",
        "'limited', '8', 6, 'failed', true, 'exhausted', 3, 3, 'boom', now()",
    );
    let done = insert(
        &mut sql,
        "type, payload, priority, status, max_attempts, output, finished_at",
        "'limited', '9', 2, 'succeeded', 3, 'null', now()",
    );
    let build = || {
        Pool::builder()
            .postgres(db.url.clone())
            .workers(2)
            .poll_interval(Duration::from_millis(50))
            .aging(Aging::new(Duration::from_secs(60), 9))
            .register_with(
                LIMITED,
                TypeOptions::new()
                    .concurrency_limit(1)
                    .rate_limit(RateLimit::per_second(100.0).with_burst(5)),
                |_, _: &u32| Ok::<_, HandlerError>(()),
            )
    };
    assert!(
        build().build().is_err(),
        "a pool refuses a version-1 schema"
    );

    assert_eq!(tasq::postgres::migrate(&db.url).unwrap(), 1);
    assert_eq!(
        tasq::postgres::migrate(&db.url).unwrap(),
        tasq::postgres::SCHEMA_VERSION,
        "nothing left to do"
    );
    let (rows, own, version): (i64, i64, i32) = {
        let row = sql
            .query_one(
                "SELECT count(*), count(base_priority), (SELECT version FROM tasq_schema)
                 FROM tasq_tasks",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(
        (rows, own, version),
        (3, 0, tasq::postgres::SCHEMA_VERSION),
        "rows kept, priorities their own"
    );

    let pool = build().build().unwrap();
    let id = |seq: i64| TaskId::from_parts(pool.id(), seq as u64);
    assert_eq!(pool.info(id(ready)).unwrap().priority, 4);
    let old = pool.handle(LIMITED, id(ready)).unwrap();
    assert_eq!(
        old.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(()))
    );
    assert_eq!(
        pool.info(id(done)).unwrap().state,
        tasq::TaskState::Succeeded
    );
    let letters = pool.dead_letters();
    assert_eq!(letters.len(), 1);
    assert_eq!((letters[0].id, letters[0].priority), (id(dead), 6));
    let again = pool.resubmit(LIMITED, id(dead)).unwrap();
    assert_eq!(
        again.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(()))
    );
    assert_eq!(pool.info(again.id()).unwrap().priority, 6);
    pool.check_invariants().unwrap();
    pool.shutdown(Duration::from_secs(10));
}

// ===== the manual clock in SQL =====

/// A task submitted in the caller's own transaction by a pool on a manual clock is due on that
/// clock, as the store's own submits are (its `tasq_now()` is the clock's, not the database's
/// nor whatever the caller's session holds), and the caller's session keeps its setting.
#[test]
fn a_submit_in_the_callers_transaction_is_due_on_the_manual_clock() {
    let Some(db) = TestDb::new() else { return };
    let clock = ManualClock::new();
    // The manual time runs an hour ahead of the database's.
    clock.advance(Duration::from_secs(3600));
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .poll_interval(Duration::from_millis(50))
        .manual_clock(clock.clone())
        .register(JOB, |_, _: &u32| Ok::<_, HandlerError>(()))
        .build()
        .unwrap();
    let mut client = db.client();
    client
        .batch_execute("SET tasq.manual_now_us = '123'")
        .unwrap();
    const SETTING: &str = "SELECT current_setting('tasq.manual_now_us')";
    let mut tx = client.transaction().unwrap();
    let id = pool
        .submit_in(&mut tx, JOB.task(1).delay(Duration::from_secs(1800)))
        .unwrap()
        .id();
    let own: String = tx.query_one(SETTING, &[]).unwrap().get(0);
    assert_eq!(own, "123", "the caller's transaction reads its own");
    tx.commit().unwrap();
    let own: String = client.query_one(SETTING, &[]).unwrap().get(0);
    assert_eq!(own, "123", "the caller's session keeps its own");

    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        pool.status(id),
        Some(tasq::TaskState::Scheduled),
        "due in 30 minutes of the manual clock"
    );
    clock.advance(Duration::from_secs(1800));
    let handle = pool.handle(JOB, id).unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(()))
    );
    pool.shutdown(Duration::from_secs(10));
}
