//! Worker processes on the durable store, killed and stopped by the test: at-least-once
//! delivery through `kill -9`, fencing of a stale worker, and a connection loss.
//!
//! A worker process is this test binary run again with `--ignored --exact worker_process`; its
//! settings come in environment variables, its commands (`go`, `exit`) on its standard input.
#![cfg(feature = "postgres")]

mod support_pg;
mod support_proc;
mod support_rng;

use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use postgres::{Client, NoTls};
use support_pg::TestDb;
use support_rng::Rng;
use tasq::{Breaker, HandlerError, Outcome, PauseTarget, Pool, TaskHandle, TaskType, TypeOptions};

/// Records (task, lease, worker) in `effects`, then succeeds.
const EFFECT: TaskType<u64, ()> = TaskType::new("effect");
/// Records its effect, then holds its worker until the process reads `go`; returns the
/// worker's tag.
const HOLD: TaskType<u64, String> = TaskType::new("hold");
/// Records its effect with how many of its type's rows run at that moment, then succeeds; one
/// first attempt in four fails instead. At most [`LIMIT`] run at once across the processes, and
/// it calls the downstream "svc", whose breaker its failures open now and then.
const LIMITED: TaskType<u64, ()> = TaskType::new("limited");
/// The concurrency limit of [`LIMITED`].
const LIMIT: i64 = 3;
/// In queue `metered`, whose fleet limit the chaos test sets to [`METERED_LIMIT`]; records its
/// effect with how many of its queue's rows run at that moment. Half the worker processes give
/// the queue a worker of its own (`TASQ_WORKER_LANE`), the others run it on their shared ones.
const METERED: TaskType<u64, ()> = TaskType::new("metered");
/// The fleet's limit on queue `metered`.
const METERED_LIMIT: i64 = 2;
/// Records its run in `runs` (its attempt, the attempts its context allows, and whether its
/// lease was already lost as it started), then fails, to be retried 50 ms later: every task of
/// it ends a dead letter once its attempts are used up. Each worker process registers it with
/// attempts of its own (`TASQ_WORKER_ATTEMPTS`), which its tasks must not obey.
const FLAKY: TaskType<u64, ()> = TaskType::new("flaky");

/// Every run of a [`FLAKY`] task.
const RUNS_TABLE: &str = "CREATE TABLE runs (task BIGINT NOT NULL, lease BIGINT NOT NULL,
                                             attempt INT NOT NULL, allowed INT NOT NULL,
                                             stale BOOLEAN NOT NULL, worker TEXT NOT NULL)";

/// Every run's effect; `running`: for a [`LIMITED`] run, its type's running rows as it started.
const EFFECTS_TABLE: &str = "CREATE TABLE effects (task BIGINT NOT NULL, lease BIGINT NOT NULL,
                                                   worker TEXT NOT NULL, running BIGINT)";

// ===== the worker process =====

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// Connections for the handlers, taken and put back (a `static` is never dropped: a client
/// dropped in a thread-local destructor would abort the process, as its runtime needs TLS).
fn connections() -> &'static Mutex<Vec<Client>> {
    static CONNECTIONS: OnceLock<Mutex<Vec<Client>>> = OnceLock::new();
    CONNECTIONS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Inserts this run's effect, on a connection of the process's own.
fn record(url: &str, tag: &str, task: u64, lease: Option<i64>) -> Result<(), HandlerError> {
    insert_effect(
        url,
        "INSERT INTO effects VALUES ($1, $2, $3)",
        tag,
        task,
        lease,
    )
}

/// Inserts the effect of a [`LIMITED`] run, with its type's running rows now (its own counted).
fn record_limited(url: &str, tag: &str, task: u64, lease: Option<i64>) -> Result<(), HandlerError> {
    let sql = "INSERT INTO effects SELECT $1, $2, $3, (SELECT count(*) FROM tasq_tasks
                                                     WHERE type = 'limited' AND status = 'running')";
    insert_effect(url, sql, tag, task, lease)
}

fn record_metered(url: &str, tag: &str, task: u64, lease: Option<i64>) -> Result<(), HandlerError> {
    let sql = "INSERT INTO effects SELECT $1, $2, $3, (SELECT count(*) FROM tasq_tasks
                                                     WHERE queue = 'metered' AND status = 'running')";
    insert_effect(url, sql, tag, task, lease)
}

fn insert_effect(
    url: &str,
    sql: &str,
    tag: &str,
    task: u64,
    lease: Option<i64>,
) -> Result<(), HandlerError> {
    with_client(url, |client| {
        client.execute(sql, &[&(task as i64), &lease.unwrap_or(-1), &tag])
    })
}

/// Inserts a [`FLAKY`] run into `runs`, with whether the row's lease was already another as it
/// started.
fn insert_run(url: &str, tag: &str, ctx: &tasq::Context) -> Result<(), HandlerError> {
    let (task, lease) = (ctx.id().seq() as i64, ctx.lease_id().unwrap_or(-1));
    let (attempt, allowed) = (ctx.attempt() as i32, ctx.max_attempts() as i32);
    with_client(url, |client| {
        client.execute(
            "INSERT INTO runs SELECT $1, $2, $3, $4,
                 (SELECT lease_id FROM tasq_tasks WHERE id = $1) IS DISTINCT FROM $2, $5",
            &[&task, &lease, &attempt, &allowed, &tag],
        )
    })
}

/// Runs `f` on a connection of the process's own (a spare one, or a new one), kept for the
/// next use if it worked; a database error is a retryable handler error.
fn with_client(
    url: &str,
    f: impl FnOnce(&mut Client) -> Result<u64, postgres::Error>,
) -> Result<(), HandlerError> {
    let spare = connections().lock().unwrap().pop();
    let mut client = match spare {
        Some(client) if !client.is_closed() => client,
        _ => Client::connect(url, NoTls).map_err(HandlerError::retryable)?,
    };
    f(&mut client).map_err(HandlerError::retryable)?;
    connections().lock().unwrap().push(client);
    Ok(())
}

/// `go` lines read from standard input, for `HOLD` handlers.
fn go() -> &'static (Sender<()>, Receiver<()>) {
    static GO: OnceLock<(Sender<()>, Receiver<()>)> = OnceLock::new();
    GO.get_or_init(crossbeam_channel::unbounded)
}

/// Not a test: the body of a worker process (see the module docs). Runs a durable pool until
/// it reads `exit`, then shuts it down.
#[test]
#[ignore = "a worker process of the multi-process tests, started by them"]
fn worker_process() {
    let url = env("TASQ_WORKER_URL");
    let tag = env("TASQ_WORKER_TAG");
    let workers: usize = env("TASQ_WORKER_THREADS").parse().unwrap();
    let lease = Duration::from_millis(env("TASQ_WORKER_LEASE_MS").parse().unwrap());
    // A number, or `pace`: the default, which claims ahead as the pool's pace says.
    let prefetch: Option<usize> = match std::env::var("TASQ_WORKER_PREFETCH").as_deref() {
        Ok("pace") => None,
        Ok(n) => Some(n.parse().unwrap()),
        Err(_) => Some(0),
    };
    let (effect_url, effect_tag) = (url.clone(), tag.clone());
    let (hold_url, hold_tag) = (url.clone(), tag.clone());
    let (limited_url, limited_tag) = (url.clone(), tag.clone());
    let (metered_url, metered_tag) = (url.clone(), tag.clone());
    let lane = std::env::var_os("TASQ_WORKER_LANE").is_some();
    let (flaky_url, flaky_tag) = (url.clone(), tag.clone());
    let flaky_attempts: u32 = std::env::var("TASQ_WORKER_ATTEMPTS")
        .ok()
        .map_or(3, |n| n.parse().unwrap());
    let builder = Pool::builder().postgres(url);
    let builder = if lane {
        builder.queue("metered", 1)
    } else {
        builder
    };
    let builder = match prefetch {
        Some(prefetch) => builder.prefetch(prefetch),
        None => builder,
    };
    let pool = builder
        .workers(workers)
        .lease(lease)
        .poll_interval(Duration::from_millis(100))
        .quiet_panics(true)
        .breaker("svc", Breaker::new(3, Duration::from_millis(100)))
        .register_with(
            LIMITED,
            TypeOptions::new()
                .concurrency_limit(LIMIT as u32)
                .downstream("svc")
                .max_attempts(20),
            move |ctx, n: &u64| {
                // (Its payloads are 9, 19, 29, ...: one in four fails.)
                if (n / 10) % 4 == 0 && ctx.attempt() == 1 {
                    let error = HandlerError::retryable("svc is flaky");
                    return Err(error.retry_after(Duration::from_millis(20)));
                }
                record_limited(&limited_url, &limited_tag, ctx.id().seq(), ctx.lease_id())?;
                // Long enough for the runs of several processes to overlap.
                std::thread::sleep(Duration::from_millis(2));
                Ok::<_, HandlerError>(())
            },
        )
        .register_with(
            METERED,
            TypeOptions::new().queue("metered"),
            move |ctx, _: &u64| {
                record_metered(&metered_url, &metered_tag, ctx.id().seq(), ctx.lease_id())?;
                // Long enough for the runs of several processes to overlap.
                std::thread::sleep(Duration::from_millis(2));
                Ok::<_, HandlerError>(())
            },
        )
        .register(EFFECT, move |ctx, n: &u64| {
            record(&effect_url, &effect_tag, ctx.id().seq(), ctx.lease_id())?;
            let _ = n;
            Ok::<_, HandlerError>(())
        })
        .register_with(
            FLAKY,
            TypeOptions::new().max_attempts(flaky_attempts),
            move |ctx, _: &u64| {
                insert_run(&flaky_url, &flaky_tag, ctx)?;
                Err(HandlerError::retryable("flaky").retry_after(Duration::from_millis(50)))
            },
        )
        .register(HOLD, move |ctx, _: &u64| {
            record(&hold_url, &hold_tag, ctx.id().seq(), ctx.lease_id())?;
            let _ = go().1.recv();
            Ok::<_, HandlerError>(hold_tag.clone())
        })
        .build()
        .unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().trim() {
            "go" => go().0.send(()).unwrap(),
            "totals" => {
                let totals = pool.stats().totals;
                println!("lapsed_claims={} totals", totals.lapsed_claims);
                std::io::stdout().flush().unwrap();
            }
            "exit" => break,
            _ => {}
        }
    }
    let totals = pool.stats().totals;
    pool.shutdown(Duration::from_secs(10));
    println!(
        "store_errors={} lapsed_claims={} exited",
        totals.store_errors, totals.lapsed_claims
    );
}

// ===== the test's side =====

/// A running worker process.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Worker {
    fn start(db: &TestDb, tag: &str, threads: usize, lease: Duration) -> Worker {
        Worker::start_prefetching(db, tag, threads, 0, lease)
    }

    /// A worker process whose pool claims ahead as its pace says (the default).
    fn start_paced(db: &TestDb, tag: &str, threads: usize, lease: Duration, lane: bool) -> Worker {
        Worker::start_with(db, tag, threads, None, lease, 3, lane)
    }

    fn start_prefetching(
        db: &TestDb,
        tag: &str,
        threads: usize,
        prefetch: usize,
        lease: Duration,
    ) -> Worker {
        Worker::start_with(db, tag, threads, Some(prefetch), lease, 3, false)
    }

    /// A worker process whose pool registers [`FLAKY`] with `attempts`, and claims `prefetch`
    /// ahead (`None`: as its pace says).
    fn start_with(
        db: &TestDb,
        tag: &str,
        threads: usize,
        prefetch: Option<usize>,
        lease: Duration,
        attempts: u32,
        lane: bool,
    ) -> Worker {
        let mut env = vec![
            ("TASQ_WORKER_URL", db.url.clone()),
            ("TASQ_WORKER_TAG", tag.to_owned()),
            ("TASQ_WORKER_THREADS", threads.to_string()),
            ("TASQ_WORKER_LEASE_MS", lease.as_millis().to_string()),
            (
                "TASQ_WORKER_PREFETCH",
                prefetch.map_or("pace".to_owned(), |n| n.to_string()),
            ),
            ("TASQ_WORKER_ATTEMPTS", attempts.to_string()),
        ];
        if lane {
            env.push(("TASQ_WORKER_LANE", "1".to_owned()));
        }
        let (child, stdin, lines) = support_proc::spawn("worker_process", &env);
        let worker = Worker {
            child,
            stdin,
            lines,
        };
        let _ = worker.expect_line("ready");
        worker
    }

    fn expect_line(&self, wanted: &str) -> String {
        support_proc::expect_line(&self.lines, wanted)
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Shuts its pool down, waits for it to exit, and returns how many store errors its pool
    /// reported.
    fn exit(self) -> u64 {
        self.exit_with_totals().0
    }

    /// Shuts its pool down, waits for it to exit, and returns its store errors and lapsed
    /// claims.
    fn exit_with_totals(mut self) -> (u64, u64) {
        self.send("exit");
        let line = self.expect_line("exited");
        self.child.wait().unwrap();
        let total = |name: &str| -> u64 {
            line.split(name)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("the worker reports {name} in {line:?}"))
        };
        (total("store_errors="), total("lapsed_claims="))
    }
}

impl Drop for Worker {
    /// A test that fails leaves no worker process behind (it would hold the test's output
    /// open, and its schema's connections): killed (and resumed first, if stopped).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// Held by a test that starts a fleet of worker processes: two such fleets at once (about 45
/// database connections each) would crowd the server's default limit of 100 connections.
fn one_fleet_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static FLEET: Mutex<()> = Mutex::new(());
    FLEET
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How the tasks left to end have gone down: a hang guard that measures progress, not time,
/// so a run on a busy machine is slower but never fails for it.
struct Progress {
    /// The fewest tasks left seen so far, and when that many were first seen.
    fewest: i64,
    since: Instant,
    /// How long the tasks left may stay without one ending.
    stall: Duration,
}

impl Progress {
    fn new(stall: Duration) -> Progress {
        Progress {
            fewest: i64::MAX,
            since: Instant::now(),
            stall,
        }
    }
}

/// Whether every task has ended; fails once no task has ended for `progress.stall` (a task
/// lost, or the fleet stuck).
fn all_ended(sql: &mut Client, progress: &mut Progress) -> bool {
    let left: i64 = sql
        .query_one(
            "SELECT count(*) FROM tasq_tasks
             WHERE status NOT IN ('succeeded', 'failed', 'cancelled')",
            &[],
        )
        .unwrap()
        .get(0);
    if left < progress.fewest {
        progress.fewest = left;
        progress.since = Instant::now();
    }
    assert!(
        left == 0 || progress.since.elapsed() < progress.stall,
        "{left} tasks left, and none ended in the last {:?}",
        progress.stall
    );
    left == 0
}

/// Polls `sql` (a count) until it returns at least `n`: the test waits on another process's
/// writes, which it can only see in the database.
fn wait_for_count(client: &mut Client, sql: &str, n: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut delay = Duration::from_millis(5);
    loop {
        let count: i64 = client.query_one(sql, &[]).unwrap().get(0);
        if count >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {count} of {n} after a minute"
        );
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

/// Waits until every handle's task has succeeded. No deadline for the whole batch: a task whose
/// run the connection loss interrupted goes back behind every task still ready, and waits for
/// them at whatever pace the machine allows (on a loaded 2-core CI box, longer than a minute).
/// The wait fails when no task at all ends for a minute (a stall, not slowness), or when one
/// ends otherwise than succeeded.
fn wait_all_succeeded(handles: &[TaskHandle<()>]) {
    const STALL: Duration = Duration::from_secs(60);
    let mut ended = 0;
    let mut progress_at = Instant::now();
    for handle in handles {
        let outcome = loop {
            if let Some(outcome) = handle.wait_timeout(Duration::from_secs(1)) {
                break outcome;
            }
            let now_ended = handles.iter().filter(|h| h.is_finished()).count();
            if now_ended > ended {
                (ended, progress_at) = (now_ended, Instant::now());
            }
            assert!(
                progress_at.elapsed() < STALL,
                "no task ended for a minute: {ended} of {} ended, {} still waits",
                handles.len(),
                handle.id()
            );
        };
        assert_eq!(
            outcome,
            Outcome::Succeeded(()),
            "{} did not succeed",
            handle.id()
        );
    }
}

/// A producer: a durable pool with no workers, in the test's process.
fn producer(db: &TestDb) -> Pool {
    // Every row stays: the test counts them at the end (the schema's policy, for every pool).
    db.change_policy(|p| p.finished_max_age(None));
    Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(EFFECT, TypeOptions::new())
        .declare(HOLD, TypeOptions::new())
        // The task's settings are the producer's: its attempts as the workers register them.
        .declare(LIMITED, TypeOptions::new().max_attempts(20))
        .declare(METERED, TypeOptions::new().queue("metered"))
        .declare(FLAKY, TypeOptions::new().max_attempts(4))
        .build()
        .unwrap()
}

/// 6 worker processes with 2 s leases work through the tasks while a random one is killed
/// with SIGKILL every 1-3 s and restarted. Nothing is lost, nothing unexpected runs, every task
/// ends succeeded exactly once, and every duplicate effect belongs to a lease that never
/// completed its task. A tenth of the tasks are of a type limited to 3 running at once across
/// the processes, whose downstream's breaker its failures open now and then (its probes die with
/// their processes too): no run, and no look at the rows, ever sees more than 3 of its rows
/// running. Another tenth are in queue `metered`, limited to 2 running across the fleet by the
/// schema, which half the processes serve with a worker of its own and half on their shared
/// workers: no run and no look ever sees more than 2 of its rows running.
#[test]
fn kill_9_chaos_loses_nothing() {
    let _fleet = one_fleet_at_a_time();
    let Some(db) = TestDb::new() else { return };
    let tasks: u64 = std::env::var("TASQ_CHAOS_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        // About three minutes on a 2-core machine; the full run is 50,000 tasks (about
        // eight minutes: `TASQ_CHAOS_TASKS=50000`).
        .unwrap_or(15_000);
    let seed: u64 = std::env::var("TASQ_CHAOS_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0x5EED);
    let mut sql = db.client();
    sql.batch_execute(EFFECTS_TABLE).unwrap();
    let lease = Duration::from_secs(2);
    // Processes built differently: half serve queue `metered` with a worker of its own, a
    // third claim ahead as their pace says (the others only for their free workers).
    let start = |i: usize, tag: &str| match i % 3 {
        2 => Worker::start_paced(&db, tag, 2, lease, i % 2 == 1),
        _ => Worker::start_with(&db, tag, 2, Some(0), lease, 3, i % 2 == 1),
    };
    let mut workers: Vec<Worker> = (0..6).map(|i| start(i, &format!("w{i}"))).collect();
    let producer = producer(&db);
    assert_eq!(
        producer.set_queue_limit("metered", Some(METERED_LIMIT as u32)),
        Ok(None)
    );
    for chunk in (0..tasks).collect::<Vec<_>>().chunks(5_000) {
        let limited = |n: &&u64| **n % 10 == 9;
        let metered = |n: &&u64| **n % 10 == 8;
        producer
            .submit_batch(
                chunk
                    .iter()
                    .filter(|n| !limited(n) && !metered(n))
                    .map(|&n| EFFECT.task(n))
                    .collect(),
            )
            .unwrap();
        producer
            .submit_batch(
                chunk
                    .iter()
                    .filter(metered)
                    .map(|&n| METERED.task(n))
                    .collect(),
            )
            .unwrap();
        producer
            .submit_batch(
                chunk
                    .iter()
                    .filter(limited)
                    .map(|&n| LIMITED.task(n))
                    .collect(),
            )
            .unwrap();
    }
    // The rows' view of the limit, watched all along.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, mut client) = (Arc::clone(&stop), db.client());
        std::thread::spawn(move || {
            let (mut most, mut most_metered) = (0, 0);
            while !stop.load(Ordering::SeqCst) {
                let row = client
                    .query_one(
                        "SELECT count(*) FILTER (WHERE type = 'limited'),
                                count(*) FILTER (WHERE queue = 'metered')
                         FROM tasq_tasks WHERE status = 'running'",
                        &[],
                    )
                    .unwrap();
                most = most.max(row.get::<_, i64>(0));
                most_metered = most_metered.max(row.get::<_, i64>(1));
                std::thread::sleep(Duration::from_millis(1));
            }
            (most, most_metered)
        })
    };
    let mut rng = Rng(seed | 1);
    let mut kills = 0;
    // Every third round pauses the `effect` type for the fleet around its kill: the lease ids
    // handed out while each pause was in force, `(after pause returned, before resume]`.
    let mut paused: (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
    let last_lease = |sql: &mut Client| -> i64 {
        sql.query_one("SELECT last_value FROM tasq_lease", &[])
            .unwrap()
            .get(0)
    };
    let started = Instant::now();
    let mut progress = Progress::new(Duration::from_secs(120));
    while !all_ended(&mut sql, &mut progress) {
        // The chaos schedule: a kill every 1 to 3 seconds.
        std::thread::sleep(Duration::from_millis(1_000 + rng.below(2_000)));
        let pause = kills % 3 == 1;
        if pause {
            assert_eq!(producer.pause(PauseTarget::task_type("effect")), Ok(true));
            paused.0.push(last_lease(&mut sql));
        }
        let victim = rng.below(workers.len() as u64) as usize;
        let tag = format!("w{victim}-{kills}");
        let dead = std::mem::replace(&mut workers[victim], start(victim, &tag));
        dead.kill();
        kills += 1;
        if pause {
            std::thread::sleep(Duration::from_millis(200 + rng.below(600)));
            paused.1.push(last_lease(&mut sql));
            assert_eq!(producer.resume(PauseTarget::task_type("effect")), Ok(true));
        }
    }
    for worker in workers {
        let _ = worker.exit();
    }
    stop.store(true, Ordering::SeqCst);
    let (most_rows, most_metered_rows) = watcher.join().unwrap();

    let count =
        |sql: &mut Client, query: &str| -> i64 { sql.query_one(query, &[]).unwrap().get(0) };
    let lost = count(
        &mut sql,
        "SELECT count(*) FROM tasq_tasks WHERE status <> 'succeeded'",
    );
    let total = count(&mut sql, "SELECT count(*) FROM tasq_tasks");
    let unexpected = count(
        &mut sql,
        "SELECT count(*) FROM effects e
         WHERE NOT EXISTS (SELECT 1 FROM tasq_tasks t WHERE t.id = e.task)",
    );
    // The completing run of each task: exactly one effect under the task's final lease.
    let completions_without_one_effect = count(
        &mut sql,
        "SELECT count(*) FROM tasq_tasks t
         WHERE (SELECT count(*) FROM effects e WHERE e.task = t.id AND e.lease = t.lease_id) <> 1",
    );
    let duplicates = count(
        &mut sql,
        "SELECT count(*) FROM effects e JOIN tasq_tasks t ON t.id = e.task
         WHERE e.lease <> t.lease_id",
    );
    // A duplicate's lease completed no task: it is nobody's final lease.
    let duplicate_leases_that_completed = count(
        &mut sql,
        "SELECT count(*) FROM effects e JOIN tasq_tasks t ON t.id = e.task
         WHERE e.lease <> t.lease_id
           AND EXISTS (SELECT 1 FROM tasq_tasks c WHERE c.lease_id = e.lease)",
    );
    let duplicate_leases = count(
        &mut sql,
        "SELECT count(DISTINCT e.lease) FROM effects e JOIN tasq_tasks t ON t.id = e.task
         WHERE e.lease <> t.lease_id",
    );
    let most_seen_by = |sql: &mut Client, ty: &str| -> i64 {
        sql.query_one(
            "SELECT COALESCE(max(e.running), 0) FROM effects e JOIN tasq_tasks t ON t.id = e.task
             WHERE t.type = $1",
            &[&ty],
        )
        .unwrap()
        .get(0)
    };
    let most_seen_by_runs = most_seen_by(&mut sql, "limited");
    let most_metered_by_runs = most_seen_by(&mut sql, "metered");
    // Runs of `effect` under a lease taken while a pause of it was in force.
    let claimed_while_paused: i64 = sql
        .query_one(
            "SELECT count(*) FROM effects e JOIN tasq_tasks t ON t.id = e.task,
                 unnest($1::BIGINT[], $2::BIGINT[]) AS p(after, until)
             WHERE t.type = 'effect' AND e.lease > p.after AND e.lease <= p.until",
            &[&paused.0, &paused.1],
        )
        .unwrap()
        .get(0);
    // And of the other type meanwhile: the pause held back only what it named.
    let others_while_paused: i64 = sql
        .query_one(
            "SELECT count(*) FROM effects e JOIN tasq_tasks t ON t.id = e.task,
                 unnest($1::BIGINT[], $2::BIGINT[]) AS p(after, until)
             WHERE t.type <> 'effect' AND e.lease > p.after AND e.lease <= p.until",
            &[&paused.0, &paused.1],
        )
        .unwrap()
        .get(0);
    let limited_retried = count(
        &mut sql,
        "SELECT count(*) FROM tasq_tasks WHERE type = 'limited' AND attempts > 1",
    );
    // When each type's last task ended, from the first submit: the limited type's tail.
    let spans: Vec<String> = sql
        .query(
            "SELECT type, EXTRACT(EPOCH FROM max(finished_at) - min(created_at))::FLOAT8
             FROM tasq_tasks GROUP BY type ORDER BY type",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| format!("{} {:.1} s", row.get::<_, &str>(0), row.get::<_, f64>(1)))
        .collect();
    let breaker: (String, i32) = {
        let row = sql
            .query_one(
                "SELECT state, consecutive FROM tasq_gates WHERE kind = 'downstream' AND name = 'svc'",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    println!(
        "chaos: {total} tasks, {kills} kills, {} pauses ({claimed_while_paused} effects claimed \
         while paused, {others_while_paused} of the other type), {duplicates} duplicate effects under \
         {duplicate_leases} leases that never completed, {lost} lost, {unexpected} unexpected, \
         {:.1} s; limited: at most {most_seen_by_runs} running seen by a run and {most_rows} by \
         the watcher (limit {LIMIT}), {limited_retried} retried, breaker {breaker:?}; metered: at \
         most {most_metered_by_runs} running seen by a run and {most_metered_rows} by the \
         watcher (fleet limit {METERED_LIMIT}); last ending per type: {}",
        paused.0.len(),
        started.elapsed().as_secs_f64(),
        spans.join(", ")
    );
    assert_eq!(total, tasks as i64);
    assert_eq!(
        claimed_while_paused, 0,
        "a task of a paused type was claimed"
    );
    assert!(!paused.0.is_empty(), "the run ended before the first pause");
    assert_eq!(lost, 0, "tasks that did not succeed");
    assert_eq!(unexpected, 0, "effects of tasks that do not exist");
    assert_eq!(
        completions_without_one_effect, 0,
        "a completed lease without exactly one effect"
    );
    assert_eq!(
        duplicate_leases_that_completed, 0,
        "a duplicate under a completing lease"
    );
    assert!(
        kills > 0,
        "the run ended before the first kill: too few tasks"
    );
    assert!(
        most_seen_by_runs <= LIMIT && most_rows <= LIMIT,
        "the concurrency limit of {LIMIT} was exceeded: {most_seen_by_runs} seen by a run, \
         {most_rows} by the watcher"
    );
    assert!(most_seen_by_runs >= 1, "no limited task recorded its count");
    assert!(
        most_metered_by_runs <= METERED_LIMIT && most_metered_rows <= METERED_LIMIT,
        "the queue limit of {METERED_LIMIT} was exceeded: {most_metered_by_runs} seen by a run, \
         {most_metered_rows} by the watcher"
    );
    assert!(
        most_metered_by_runs >= 1,
        "no metered task recorded its count"
    );
    producer.shutdown(Duration::from_secs(10));
    drop(db);
}

/// Worker A leases a task and is stopped (SIGSTOP) past its lease; B takes the task over; A
/// resumes: none of A's writes about the task changes anything while B holds it, and B's
/// completion stands.
#[test]
fn a_stopped_worker_is_fenced_off_when_it_resumes() {
    let Some(db) = TestDb::new() else { return };
    let mut sql = db.client();
    sql.batch_execute(EFFECTS_TABLE).unwrap();
    let lease = Duration::from_secs(2);
    let mut a = Worker::start(&db, "A", 1, lease);
    let producer = producer(&db);
    let task = producer.submit(HOLD.task(1)).unwrap();
    let seq = task.id().seq() as i64;
    wait_for_count(
        &mut sql,
        "SELECT count(*) FROM effects WHERE worker = 'A'",
        1,
        "A's run",
    );
    signal(a.pid(), "-STOP");
    let a_lease: i64 = sql
        .query_one("SELECT lease FROM effects WHERE worker = 'A'", &[])
        .unwrap()
        .get(0);

    // B: the task comes back when A's lease expires, and B's run holds it.
    let mut b = Worker::start(&db, "B", 1, lease);
    wait_for_count(
        &mut sql,
        "SELECT count(*) FROM effects WHERE worker = 'B'",
        1,
        "B's run",
    );
    let b_lease: i64 = sql
        .query_one("SELECT lease FROM effects WHERE worker = 'B'", &[])
        .unwrap()
        .get(0);
    assert!(b_lease > a_lease, "fencing tokens increase");
    let row = |sql: &mut Client| -> (String, Option<i64>) {
        let row = sql
            .query_one(
                "SELECT status, lease_id FROM tasq_tasks WHERE id = $1",
                &[&seq],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let held_by_b = row(&mut sql);
    assert_eq!(held_by_b, ("running".to_owned(), Some(b_lease)));
    let b_until: std::time::SystemTime = sql
        .query_one("SELECT lease_until FROM tasq_tasks WHERE id = $1", &[&seq])
        .unwrap()
        .get(0);

    // A resumes, its handler returns, its pool writes the outcome and shuts down: every write
    // of A about the task (heartbeat, completion) must change nothing.
    signal(a.pid(), "-CONT");
    a.send("go");
    let _ = a.exit();
    assert_eq!(row(&mut sql), held_by_b, "A's writes changed B's task");
    let until_now: std::time::SystemTime = sql
        .query_one("SELECT lease_until FROM tasq_tasks WHERE id = $1", &[&seq])
        .unwrap()
        .get(0);
    assert!(until_now >= b_until, "A moved B's lease");

    // B finishes: its completion stands.
    b.send("go");
    assert_eq!(
        task.wait_timeout(Duration::from_secs(30)),
        Some(Outcome::Succeeded("B".to_owned()))
    );
    assert_eq!(row(&mut sql), ("succeeded".to_owned(), Some(b_lease)));
    let _ = b.exit();
    producer.shutdown(Duration::from_secs(10));
}

/// Edge 3. A prefetching process is stopped (SIGSTOP) past its lease, holding claims no worker
/// has started; another process runs those tasks; when the first resumes, it starts none of its
/// held claims (their leases are lost, timed on its monotonic clock from when they were
/// requested): it gives them back, and counts them. Before, it ran all of them again.
#[test]
fn a_resumed_process_starts_no_claim_whose_lease_is_lost() {
    let Some(db) = TestDb::new() else { return };
    let mut sql = db.client();
    sql.batch_execute(EFFECTS_TABLE).unwrap();
    let lease = Duration::from_secs(2);
    let mut a = Worker::start_prefetching(&db, "A", 1, 4, lease);
    let producer = producer(&db);
    let hold = producer.submit(HOLD.task(1)).unwrap();
    wait_for_count(
        &mut sql,
        "SELECT count(*) FROM effects WHERE worker = 'A'",
        1,
        "A's run of the held task",
    );
    let effects = producer
        .submit_batch((0..4).map(|n| EFFECT.task(n)).collect())
        .unwrap();
    // A's only worker is busy: the four wait in A's queue, claimed.
    wait_for_count(
        &mut sql,
        "SELECT count(*) FROM tasq_tasks WHERE type = 'effect' AND status = 'running'",
        4,
        "A's prefetch of the four",
    );
    signal(a.pid(), "-STOP");
    let mut b = Worker::start(&db, "B", 2, lease);
    wait_all_succeeded(&effects);
    signal(a.pid(), "-CONT");
    // A's worker returns from the held task and takes its four claims, one way or the other.
    a.send("go");
    let ran_by_a = |sql: &mut Client| -> i64 {
        sql.query_one(
            "SELECT count(*) FROM effects e JOIN tasq_tasks t ON t.id = e.task
             WHERE e.worker = 'A' AND t.type = 'effect'",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let give_up = Instant::now() + Duration::from_secs(60);
    let lapsed = loop {
        a.send("totals");
        let line = a.expect_line("totals");
        let lapsed: i64 = line
            .split("lapsed_claims=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        if lapsed + ran_by_a(&mut sql) == 4 {
            break lapsed;
        }
        assert!(Instant::now() < give_up, "A never took its four claims");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        ran_by_a(&mut sql),
        0,
        "A started claims whose leases it had lost"
    );
    assert_eq!(lapsed, 4, "A gave back its four held claims");
    let _ = a.exit();
    b.send("go");
    assert!(hold.wait_timeout(Duration::from_secs(30)).is_some());
    let _ = b.exit();
    producer.shutdown(Duration::from_secs(10));
}

/// Every connection of a running pool is terminated (as a server restart does): the pool
/// reconnects, and every task ends succeeded exactly once.
#[test]
fn terminated_connections_lose_nothing() {
    let Some(db) = TestDb::new() else { return };
    let mut sql = db.client();
    sql.batch_execute(EFFECTS_TABLE).unwrap();
    let mut worker = Worker::start(&db, "w", 2, Duration::from_secs(2));
    let producer = producer(&db);
    let handles = producer
        .submit_batch((0..3_000).map(|n| EFFECT.task(n)).collect())
        .unwrap();
    wait_for_count(
        &mut sql,
        "SELECT count(*) FROM effects",
        500,
        "the first runs",
    );
    let terminated = db.terminate_connections();
    assert!(terminated > 0, "no connection was terminated");
    let restarted = Instant::now();
    let mut sql = db.client();
    // Resumed within 10 s: new effects appear.
    let before: i64 = sql
        .query_one("SELECT count(*) FROM effects", &[])
        .unwrap()
        .get(0);
    wait_for_count(
        &mut sql,
        "SELECT count(*) FROM effects",
        (before + 1).min(3_000),
        "runs after the connections were terminated",
    );
    assert!(
        restarted.elapsed() < Duration::from_secs(10),
        "resumed too late"
    );
    wait_all_succeeded(&handles);
    let not_once: i64 = sql
        .query_one(
            "SELECT count(*) FROM tasq_tasks t
             WHERE t.status <> 'succeeded'
                OR (SELECT count(*) FROM effects e WHERE e.task = t.id AND e.lease = t.lease_id) <> 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(not_once, 0, "a task not succeeded exactly once");
    worker.send("noop");
    let store_errors = worker.exit();
    assert!(store_errors > 0, "the lost connections were not reported");
    producer.check_invariants().unwrap();
    producer.shutdown(Duration::from_secs(10));
}

/// Issue 20, section 5: a fleet built differently keeps one truth. Three worker processes
/// register `flaky` with 1, 3 and 20 attempts (one of them prefetching), a producer declares it
/// with 4 and submits a third of its tasks with that and the rest with attempts of their own
/// (1 to 6), and an ops pool built with the defaults runs all along, while the schema's policy
/// keeps every row. Every 0.4 to 1 s a worker is killed (kill -9) and restarted, or the
/// prefetching one is stopped (SIGSTOP) past its lease and resumed. In the end:
///
/// * every `flaky` task ran as its own row says: it ended a dead letter with exactly its
///   attempts used, and each of its runs saw those attempts in its context, whichever process
///   ran it (before, each worker's registration decided);
/// * nothing the fleet keeps was deleted: every row and every dead letter is there (before, a
///   pool built with the defaults trimmed them to its own limits), and a tool built with limits
///   of its own is refused;
/// * no claim started under a lease already lost: a stopped process resumes at most the runs
///   it was in the middle of (2 threads), never its prefetched claims;
/// * every `effect` task succeeded once, duplicates only under leases that never completed.
#[test]
fn a_fleet_built_differently_keeps_one_truth_through_kills_and_stops() {
    let _fleet = one_fleet_at_a_time();
    let Some(db) = TestDb::new() else { return };
    let mut sql = db.client();
    sql.batch_execute(EFFECTS_TABLE).unwrap();
    sql.batch_execute(RUNS_TABLE).unwrap();
    let producer = producer(&db);
    db.change_policy(|p| p.finished_max_age(None).dead_letter_limit(None));
    for stray in [
        Pool::builder().postgres(db.url.clone()).retention(10, None),
        Pool::builder()
            .postgres(db.url.clone())
            .dead_letter_limit(1),
    ] {
        assert!(matches!(
            stray.build(),
            Err(tasq::BuildError::InvalidSetting { .. })
        ));
    }
    let ops = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .build()
        .unwrap();
    let lease = Duration::from_secs(2);
    let registered = [1_u32, 3, 20];
    let prefetching = 2;
    let start = |i: usize, tag: &str| {
        let prefetch = if i == prefetching { 4 } else { 0 };
        Worker::start_with(&db, tag, 2, Some(prefetch), lease, registered[i], i == 1)
    };
    let mut workers: Vec<Worker> = (0..3).map(|i| start(i, &format!("w{i}"))).collect();
    let flaky: Vec<(u64, Option<u32>)> = (0..600)
        .map(|n| (n, (n % 3 != 0).then_some(1 + (n % 6) as u32)))
        .collect();
    let mut expected = std::collections::HashMap::new();
    let handles = producer
        .submit_batch(
            flaky
                .iter()
                .map(|&(n, own)| match own {
                    Some(attempts) => FLAKY.task(n).max_attempts(attempts),
                    None => FLAKY.task(n),
                })
                .collect(),
        )
        .unwrap();
    for (handle, &(_, own)) in handles.iter().zip(&flaky) {
        expected.insert(handle.id().seq() as i64, own.unwrap_or(4) as i32);
    }
    let effects = producer
        .submit_batch((0..5_000).map(|n| EFFECT.task(n)).collect())
        .unwrap();
    let mut rng = Rng(0xF1EE7);
    let (mut kills, mut stops) = (0_i64, 0_i64);
    let started = Instant::now();
    let mut progress = Progress::new(Duration::from_secs(120));
    while !all_ended(&mut sql, &mut progress) {
        std::thread::sleep(Duration::from_millis(400 + rng.below(600)));
        if rng.below(3) == 0 {
            // Stopped past its lease: the others take its claims over.
            let pid = workers[prefetching].pid();
            signal(pid, "-STOP");
            std::thread::sleep(lease + Duration::from_millis(1_500));
            signal(pid, "-CONT");
            stops += 1;
        } else {
            let victim = rng.below(3) as usize;
            let tag = format!("w{victim}-{kills}");
            let dead = std::mem::replace(&mut workers[victim], start(victim, &tag));
            dead.kill();
            kills += 1;
        }
    }
    let mut lapsed = 0;
    for worker in workers {
        lapsed += worker.exit_with_totals().1;
    }
    wait_all_succeeded(&effects);
    let count =
        |sql: &mut Client, query: &str| -> i64 { sql.query_one(query, &[]).unwrap().get(0) };

    // Attempts follow each row.
    let rows = sql
        .query(
            "SELECT id, status, dead, attempts, max_attempts FROM tasq_tasks WHERE type = 'flaky'",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), flaky.len());
    for row in &rows {
        let (id, status, dead): (i64, &str, bool) = (row.get(0), row.get(1), row.get(2));
        let (attempts, max): (i32, i32) = (row.get(3), row.get(4));
        assert_eq!(max, expected[&id], "task {id}'s row keeps its own attempts");
        assert_eq!(
            (status, dead, attempts),
            ("failed", true, max),
            "task {id} ended with its own attempts used"
        );
    }
    let runs = count(&mut sql, "SELECT count(*) FROM runs");
    let wrong_context = count(
        &mut sql,
        "SELECT count(*) FROM runs r JOIN tasq_tasks t ON t.id = r.task
         WHERE r.allowed <> t.max_attempts OR r.attempt > t.max_attempts",
    );
    assert_eq!(
        wrong_context, 0,
        "a run whose context did not follow its row"
    );
    let repeated_attempts = count(
        &mut sql,
        "SELECT count(*) FROM (SELECT task, attempt FROM runs GROUP BY 1, 2
                               HAVING count(*) > 1) x",
    );
    assert_eq!(repeated_attempts, 0, "an attempt that ran twice");

    // Nothing kept was deleted.
    let total = count(&mut sql, "SELECT count(*) FROM tasq_tasks");
    let dead_letters = count(&mut sql, "SELECT count(*) FROM tasq_tasks WHERE dead");
    assert_eq!(total, (flaky.len() + effects.len()) as i64, "rows deleted");
    assert_eq!(dead_letters, flaky.len() as i64, "dead letters trimmed");
    assert_eq!(ops.dead_letters().len(), flaky.len());

    // No claim started under a lost lease.
    let stale = count(&mut sql, "SELECT count(*) FROM runs WHERE stale");
    assert!(
        stale <= stops * 2,
        "{stale} runs started under a lease already lost, after {stops} stops of a process \
         with 2 threads"
    );
    let duplicates = count(
        &mut sql,
        "SELECT count(*) FROM effects e JOIN tasq_tasks t ON t.id = e.task
         WHERE e.lease <> t.lease_id",
    );
    println!(
        "fleet: {} tasks, {runs} flaky runs, {kills} kills, {stops} stops, {lapsed} claims \
         given back unstarted, {stale} runs under a lost lease, {duplicates} duplicate effects, \
         {:.1} s",
        total,
        started.elapsed().as_secs_f64()
    );
    assert!(kills + stops > 0, "the run ended before the first kill");
    ops.shutdown(Duration::from_secs(10));
    producer.shutdown(Duration::from_secs(10));
}
