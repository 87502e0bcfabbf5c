//! `cargo bench --features postgres --bench postgres`: the durable store against the design's raw
//! SQL on a PostgreSQL server, and prints markdown tables of the figures, then the targets
//! met or missed.
//!
//! The server: `TASQ_PG_URL` (a key=value connection string), else 127.0.0.1:5432, user
//! postgres, database `test`. Each run makes a schema of its own (`tasq_bench_<pid>`), migrates
//! it and drops it at the end. Every workload starts from an empty `tasq_tasks`.
//!
//! * the server's floor: one round trip, one committed one-row update (a WAL flush);
//! * dequeue + complete: N ready rows (the same fill each time), drained by a tasq pool with an
//!   empty handler, and by threads running the raw SQL loop, each on its own connection;
//! * submit: `Pool::submit` one at a time (and the raw insert, commit and notify, in one
//!   statement), and `Pool::submit_batch` of 1,000, on a pool with no workers;
//! * dispatch latency: this process submits at 200 tasks/s; a worker pool in a child process
//!   (this binary, run again with `TASQ_PG_BENCH_CHILD` set to the schema's URL) records when
//!   each handler started; the payload carries the submit time.
//!
//! `TASQ_PG_BENCH_TASKS` is the rows per dequeue run (default 3,000); the other counts scale
//! with it (at the default: 1,500 single submits, 20,000 batched, 2,000 latency samples). The
//! default took 41 s on a quiet 2-core VM (a commit's WAL flush 0.3 ms) and about 90 s when the
//! machine was busy (flushes of several ms).
//! `TASQ_PG_BENCH_ONLY=floor,dequeue,submit,latency` runs only the workloads named. Progress
//! goes to stderr, the tables to stdout.

use std::env;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls};
use tasq::{HandlerError, Pool, TaskType};

const LOCAL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=5";
/// The child-process switch of the latency workload (its value: the worker pool's URL).
const CHILD: &str = "TASQ_PG_BENCH_CHILD";
const DEFAULT_TASKS: usize = 3_000;
const WORKERS: [usize; 4] = [1, 4, 16, 32];
const SUBMIT_BATCH: usize = 1_000;
const LATENCY_RATE: f64 = 200.0;
const LATENCY_WORKERS: usize = 4;
/// Longest any one run may take before it is reported as stalled.
const STALL: Duration = Duration::from_secs(120);

/// The type tasq's pools run: an empty handler.
const EMPTY: TaskType<(), ()> = TaskType::new("bench_empty");
/// The latency workload's type: the payload is the submit time, in ns since the UNIX epoch.
const STAMP: TaskType<u64, ()> = TaskType::new("bench_stamp");
/// The raw loop's rows (no tasq pool claims them).
const RAW: &str = "bench_raw";

// ===== the design's raw SQL =====

/// The design's claim: ten ready, due rows, leased for 30 s.
const RAW_CLAIM: &str = "
    WITH picked AS (
        SELECT id FROM tasq_tasks
        WHERE status = 'ready' AND run_at <= now()
        ORDER BY priority DESC, run_at
        LIMIT 10
        FOR UPDATE SKIP LOCKED
    )
    UPDATE tasq_tasks t
    SET status = 'running', lease_id = nextval('tasq_lease'),
        lease_until = now() + interval '30 seconds', attempts = t.attempts + 1
    FROM picked WHERE t.id = picked.id
    RETURNING t.id, t.lease_id, t.type, t.payload, t.attempts";

/// The design's ack of one row, fenced by its lease.
const RAW_ACK: &str = "
    UPDATE tasq_tasks SET status = 'succeeded', finished_at = now(), lease_until = NULL
    WHERE id = $1 AND lease_id = $2";

/// The ack of a whole claim in one statement.
const RAW_ACK_BATCH: &str = "
    UPDATE tasq_tasks t SET status = 'succeeded', finished_at = now(), lease_until = NULL
    FROM unnest($1::BIGINT[], $2::BIGINT[]) AS done(id, lease)
    WHERE t.id = done.id AND t.lease_id = done.lease";

/// How a raw loop talks to the server.
#[derive(Clone, Copy, PartialEq)]
enum Raw {
    /// The design's statements, prepared once per connection: one round trip each.
    PerTask,
    /// As `PerTask`, the claim's ten rows acked in one statement.
    Batched,
}

// ===== the report =====

fn main() {
    if let Ok(url) = env::var(CHILD) {
        latency_child(&url);
        return;
    }
    let base = env::var("TASQ_PG_URL").unwrap_or_else(|_| LOCAL.to_owned());
    let Some(db) = BenchDb::new(&base) else {
        return;
    };
    let tasks: usize = env::var("TASQ_PG_BENCH_TASKS")
        .ok()
        .map(|n| {
            n.parse()
                .expect("TASQ_PG_BENCH_TASKS=<rows per dequeue run>")
        })
        .unwrap_or(DEFAULT_TASKS)
        .max(10);
    let scaled = |n: usize| n * tasks / DEFAULT_TASKS;
    let only = env::var("TASQ_PG_BENCH_ONLY").ok();
    let runs = |name: &str| {
        only.as_deref()
            .is_none_or(|only| only.split(',').any(|o| o == name))
    };
    let load_before = load_average();
    let started = Instant::now();
    let mut control = db.client();

    let floor = runs("floor").then(|| floor(&mut control, scaled(300).max(50)));
    let dequeue = runs("dequeue").then(|| dequeue(&db, &mut control, tasks));
    let submit = runs("submit").then(|| {
        let batched = (scaled(20_000) / SUBMIT_BATCH).max(1) * SUBMIT_BATCH;
        submit(&db, &mut control, scaled(1_500).max(10), batched)
    });
    let latency = runs("latency").then(|| latency(&db, &mut control, scaled(2_000).max(100)));
    let elapsed = started.elapsed();

    println!();
    if let Some(floor) = &floor {
        print_floor(floor);
    }
    if let Some(rows) = &dequeue {
        print_dequeue(rows, tasks);
    }
    if let Some(submit) = &submit {
        print_submit(submit);
    }
    if let Some(latency) = &latency {
        print_latency(latency);
    }
    if let (Some(d), Some(s), Some(l)) = (&dequeue, &submit, &latency) {
        targets(d, s, l);
    }
    println!();
    let mut show = |setting: &str| {
        control
            .query_one(&format!("SHOW {setting}"), &[])
            .map_or_else(|_| "?".to_owned(), |r| r.get::<_, String>(0))
    };
    let server = format!(
        "PostgreSQL {} on the same machine (synchronous_commit {}, fsync {}, wal_sync_method {})",
        show("server_version"),
        show("synchronous_commit"),
        show("fsync"),
        show("wal_sync_method")
    );
    println!(
        "Machine: {} cores, {}; {server}. Load average {} at the start, {} at the end; whole run \
         {:.0} s. The machine is shared with other work: absolute figures are noisy, ratios come \
         from one run.",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        load_before,
        load_average(),
        elapsed.as_secs_f64()
    );
}

/// A figure, or why there is none (the server refused connections, a run stalled).
type Figure = Result<f64, String>;

fn rate(figure: &Figure) -> String {
    match figure {
        Ok(v) => format!("{v:.0}/s"),
        Err(why) => format!("— ({why})"),
    }
}

// ===== the schema =====

/// This run's schema, migrated; dropped (with its tables) when this is dropped.
struct BenchDb {
    url: String,
    base: String,
    schema: String,
}

impl BenchDb {
    fn new(base: &str) -> Option<BenchDb> {
        let mut client = match Client::connect(base, NoTls) {
            Ok(client) => client,
            Err(error) => {
                assert!(
                    env::var_os("TASQ_PG_REQUIRED").is_none(),
                    "TASQ_PG_REQUIRED is set, but PostgreSQL at {base:?} is unreachable: {error}"
                );
                eprintln!(
                    "\n*** SKIPPING the PostgreSQL bench: no server at {base:?} ({error}). Set \
                     TASQ_PG_URL to a key=value connection string. ***\n"
                );
                return None;
            }
        };
        let schema = format!("tasq_bench_{}", std::process::id());
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .expect("create the bench schema");
        let url = format!("{base} application_name={schema} options='-c search_path={schema}'");
        tasq::postgres::migrate(&url).expect("migrate the bench schema");
        Some(BenchDb {
            url,
            base: base.to_owned(),
            schema,
        })
    }

    fn client(&self) -> Client {
        Client::connect(&self.url, NoTls).expect("connect to PostgreSQL")
    }
}

impl Drop for BenchDb {
    fn drop(&mut self) {
        if let Ok(mut client) = Client::connect(&self.base, NoTls) {
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}

/// Inserts `n` ready rows of `type_name` and analyzes the table, in one transaction that also
/// notifies the queue's channel (so a tasq pool claims at once); returns when it committed.
fn fill(control: &mut Client, type_name: &str, n: usize) -> Instant {
    let mut tx = control.transaction().expect("begin");
    tx.execute(
        "INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts)
         SELECT $1, 'null'::JSONB, 0, 'ready', 3 FROM generate_series(1, $2::INT)",
        &[&type_name, &(n as i32)],
    )
    .expect("fill");
    tx.batch_execute("ANALYZE tasq_tasks").expect("analyze");
    tx.execute("SELECT pg_notify(tasq_channel(), 'ready')", &[])
        .expect("notify");
    let committed = Instant::now();
    tx.commit().expect("commit the fill");
    committed
}

/// Empties the tables between runs (no pool is live then).
fn truncate(control: &mut Client) {
    control
        .batch_execute("TRUNCATE tasq_tasks, tasq_deps")
        .expect("truncate");
}

/// How many ready rows a submit workload left; the table emptied for the next.
fn take_ready(control: &mut Client) -> i64 {
    let ready = count(
        control,
        "SELECT count(*) FROM tasq_tasks WHERE status = 'ready'",
    );
    truncate(control);
    ready
}

fn count(control: &mut Client, sql: &str) -> i64 {
    control.query_one(sql, &[]).expect("count").get(0)
}

// ===== the server's floor =====

/// Medians on one connection, ns: a round trip, a committed one-row update, the same update
/// with `synchronous_commit = off` (no wait for the WAL flush).
struct Floor {
    samples: usize,
    round_trip: i64,
    commit: i64,
    commit_async: i64,
}

fn floor(control: &mut Client, samples: usize) -> Floor {
    eprintln!("floor: {samples} round trips, committed updates, and updates without the flush");
    control
        .execute(
            "INSERT INTO tasq_tasks (type, priority, status, max_attempts)
             VALUES ('bench_floor', 0, 'succeeded', 1)",
            &[],
        )
        .expect("the floor's row");
    let select = control.prepare("SELECT 1").expect("prepare");
    let update = control
        .prepare("UPDATE tasq_tasks SET attempts = attempts + 1 WHERE type = 'bench_floor'")
        .expect("prepare");
    let median = |control: &mut Client, statement: &postgres::Statement| {
        let mut times: Vec<i64> = (0..samples)
            .map(|_| {
                let start = Instant::now();
                control.execute(statement, &[]).expect("floor statement");
                start.elapsed().as_nanos() as i64
            })
            .collect();
        times.sort_unstable();
        percentile(&times, 50.0)
    };
    let round_trip = median(control, &select);
    let commit = median(control, &update);
    control
        .batch_execute("SET synchronous_commit = off")
        .expect("set");
    let commit_async = median(control, &update);
    control
        .batch_execute("RESET synchronous_commit")
        .expect("reset");
    truncate(control);
    let floor = Floor {
        samples,
        round_trip,
        commit,
        commit_async,
    };
    eprintln!(
        "  round trip {}, commit {}, commit without the flush {}",
        nanos(floor.round_trip),
        nanos(floor.commit),
        nanos(floor.commit_async)
    );
    floor
}

fn print_floor(floor: &Floor) {
    println!(
        "The server's floor (one connection, median of {}): what one statement costs here.",
        floor.samples
    );
    println!();
    println!("| statement | median |");
    println!("|---|---:|");
    println!(
        "| round trip (prepared `SELECT 1`) | {} |",
        nanos(floor.round_trip)
    );
    println!(
        "| committed one-row update (waits for the WAL flush) | {} |",
        nanos(floor.commit)
    );
    println!(
        "| the same with `synchronous_commit = off` | {} |",
        nanos(floor.commit_async)
    );
    println!();
}

// ===== dequeue + complete =====

struct DequeueRow {
    workers: usize,
    /// The default: claims ahead as the lanes' pace says (`src/store/postgres/pace.rs`).
    tasq: Figure,
    /// `prefetch(0)`: claims for free workers only (the default before the pace).
    tasq_none: Figure,
    /// `prefetch(9)`: claims ten at a time, as the raw loop does.
    tasq_batch: Figure,
    raw: Figure,
    batched: Figure,
}

/// The raw loop's claim size, and what a tasq pool prefetches to claim as many at a time.
const RAW_BATCH: usize = 10;

fn dequeue(db: &BenchDb, control: &mut Client, tasks: usize) -> Vec<DequeueRow> {
    eprintln!("dequeue + complete: {tasks} ready rows per run, workers {WORKERS:?}");
    WORKERS
        .iter()
        .map(|&workers| {
            let row = DequeueRow {
                workers,
                tasq: tasq_dequeue(db, control, workers, None, tasks),
                tasq_none: tasq_dequeue(db, control, workers, Some(0), tasks),
                tasq_batch: tasq_dequeue(db, control, workers, Some(RAW_BATCH - 1), tasks),
                raw: raw_dequeue(db, control, workers, tasks, Raw::PerTask),
                batched: raw_dequeue(db, control, workers, tasks, Raw::Batched),
            };
            eprintln!(
                "  {workers} workers: tasq {}, tasq for free workers {}, tasq claiming {RAW_BATCH} \
                 {}, raw {}, raw batched {}",
                rate(&row.tasq),
                rate(&row.tasq_none),
                rate(&row.tasq_batch),
                rate(&row.raw),
                rate(&row.batched)
            );
            row
        })
        .collect()
}

/// A tasq pool of `workers` (claiming `prefetch` ahead, or as its pace says) drains `tasks`
/// rows filled while it waits: from the fill's commit until the last row is acked.
fn tasq_dequeue(
    db: &BenchDb,
    control: &mut Client,
    workers: usize,
    prefetch: Option<usize>,
    tasks: usize,
) -> Figure {
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran);
    let mut builder = Pool::builder().postgres(db.url.clone()).workers(workers);
    if let Some(prefetch) = prefetch {
        builder = builder.prefetch(prefetch);
    }
    let pool = builder
        .thread_name("pgbench")
        .register(EMPTY, move |_, _: &()| {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok::<_, HandlerError>(())
        })
        .build()
        .map_err(|e| e.to_string())?;
    let start = fill(control, EMPTY.name(), tasks);
    let result = (|| {
        while ran.load(Ordering::Relaxed) < tasks {
            if start.elapsed() > STALL {
                return Err(format!("stalled at {}", ran.load(Ordering::Relaxed)));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // The handlers ran; the last acks may still be on their way.
        while count(
            control,
            "SELECT count(*) FROM tasq_tasks WHERE status IN ('ready', 'running')",
        ) > 0
        {
            if start.elapsed() > STALL {
                return Err("stalled on the last acks".to_owned());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(tasks as f64 / start.elapsed().as_secs_f64())
    })();
    let report = pool.shutdown(Duration::from_secs(10));
    drop(pool);
    truncate(control);
    let rate = result?;
    if report.succeeded != tasks as u64 {
        return Err(format!("{} of {tasks} succeeded", report.succeeded));
    }
    Ok(rate)
}

/// `threads` threads, each on its own connection, run the raw loop until no ready row is left:
/// from when they all start until the last one finishes.
fn raw_dequeue(
    db: &BenchDb,
    control: &mut Client,
    threads: usize,
    tasks: usize,
    raw: Raw,
) -> Figure {
    let clients = (0..threads)
        .map(|_| Client::connect(&db.url, NoTls))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    fill(control, RAW, tasks);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let loops: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || raw_loop(client, &barrier, raw))
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let mut done = 0;
    let mut failure = None;
    for thread in loops {
        match thread.join().expect("a raw loop panicked") {
            Ok(n) => done += n,
            Err(error) => failure = Some(error),
        }
    }
    let elapsed = start.elapsed();
    let succeeded = count(
        control,
        "SELECT count(*) FROM tasq_tasks WHERE status = 'succeeded'",
    );
    truncate(control);
    if let Some(error) = failure {
        return Err(error.to_string());
    }
    if done != tasks || succeeded != tasks as i64 {
        return Err(format!("{done} acked, {succeeded} succeeded of {tasks}"));
    }
    Ok(tasks as f64 / elapsed.as_secs_f64())
}

/// One raw loop: claim ten, ack them, until a claim finds nothing. Returns the rows it acked.
fn raw_loop(mut client: Client, barrier: &Barrier, raw: Raw) -> Result<usize, postgres::Error> {
    let claim = client.prepare(RAW_CLAIM)?;
    let ack = client.prepare(RAW_ACK)?;
    let ack_batch = client.prepare(RAW_ACK_BATCH)?;
    barrier.wait();
    let mut done = 0;
    loop {
        let claimed: Vec<(i64, i64)> = client
            .query(&claim, &[])?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if claimed.is_empty() {
            return Ok(done);
        }
        done += claimed.len();
        match raw {
            Raw::PerTask => {
                for (id, lease) in claimed {
                    client.execute(&ack, &[&id, &lease])?;
                }
            }
            Raw::Batched => {
                let (ids, leases): (Vec<i64>, Vec<i64>) = claimed.into_iter().unzip();
                client.execute(&ack_batch, &[&ids, &leases])?;
            }
        }
    }
}

fn print_dequeue(rows: &[DequeueRow], tasks: usize) {
    println!(
        "Dequeue + complete, tasks/s ({tasks} ready rows per run, empty handler; the raw loops \
         claim {RAW_BATCH} at a time, one thread and one connection per worker; tasq's workers \
         group their acks, see src/store/postgres/acks.rs):"
    );
    println!();
    println!(
        "| workers | tasq, default (claims ahead by its pace) | tasq, `prefetch(0)` (claims for \
         free workers) | tasq, `prefetch({})` (claims {RAW_BATCH}) | raw loop, per-task acks | \
         default ÷ raw | raw loop, batched acks | default ÷ raw batched |",
        RAW_BATCH - 1
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let ratio = |tasq: &Figure, raw: &Figure| match (tasq, raw) {
        (Ok(t), Ok(r)) => format!("×{:.2}", t / r),
        _ => "—".to_owned(),
    };
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.workers,
            rate(&row.tasq),
            rate(&row.tasq_none),
            rate(&row.tasq_batch),
            rate(&row.raw),
            ratio(&row.tasq, &row.raw),
            rate(&row.batched),
            ratio(&row.tasq, &row.batched),
        );
    }
    println!();
}

// ===== submit =====

struct SubmitFigures {
    one: Figure,
    /// The raw single insert, its commit and its notify (one statement), as many.
    raw_one: Figure,
    one_tasks: usize,
    batch: Figure,
    batch_tasks: usize,
}

/// What a program would write by hand to submit one task: the row inserted and the pools
/// notified on the queue's channel, in one statement that commits as it runs.
const RAW_INSERT: &str = "
    WITH inserted AS (
        INSERT INTO tasq_tasks (type, payload, priority, status, run_at, max_attempts)
        VALUES ('bench_raw', 'null', 0, 'ready', now(), 3)
        RETURNING id
    )
    SELECT id, pg_notify(tasq_channel(), 'ready')::TEXT FROM inserted";

/// A pool with no workers: it submits, and listens on the queue's channel.
fn producer(db: &BenchDb) -> Result<Pool, String> {
    Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(EMPTY, |_, _: &()| Ok::<_, HandlerError>(()))
        .build()
        .map_err(|e| e.to_string())
}

/// `tasks` raw single inserts (see [`RAW_INSERT`]), one after the other on one connection,
/// with a pool listening on the queue's channel as in [`submit_run`] (each notification wakes
/// its listener, on this machine's two cores too).
fn raw_submit(db: &BenchDb, control: &mut Client, tasks: usize) -> Figure {
    let pool = producer(db)?;
    let mut client = Client::connect(&db.url, NoTls).map_err(|e| e.to_string())?;
    let insert = client.prepare(RAW_INSERT).map_err(|e| e.to_string())?;
    let start = Instant::now();
    for _ in 0..tasks {
        client.query_one(&insert, &[]).map_err(|e| e.to_string())?;
    }
    let rate = tasks as f64 / start.elapsed().as_secs_f64();
    pool.shutdown(Duration::from_secs(10));
    drop(pool);
    let ready = take_ready(control);
    if ready != tasks as i64 {
        return Err(format!("{ready} rows of {tasks}"));
    }
    Ok(rate)
}

fn submit(
    db: &BenchDb,
    control: &mut Client,
    one_tasks: usize,
    batch_tasks: usize,
) -> SubmitFigures {
    eprintln!(
        "submit: {one_tasks} one at a time, {batch_tasks} in batches of {SUBMIT_BATCH}, no workers"
    );
    let one = submit_run(db, control, one_tasks, 1);
    let raw_one = raw_submit(db, control, one_tasks);
    let batch = submit_run(db, control, batch_tasks, SUBMIT_BATCH);
    eprintln!(
        "  one at a time {} (raw {}), batched {}",
        rate(&one),
        rate(&raw_one),
        rate(&batch)
    );
    SubmitFigures {
        one,
        raw_one,
        one_tasks,
        batch,
        batch_tasks,
    }
}

/// Submits `tasks` empty tasks on a pool with no workers, `batch` at a time (1: `submit`).
fn submit_run(db: &BenchDb, control: &mut Client, tasks: usize, batch: usize) -> Figure {
    let pool = producer(db)?;
    let start = Instant::now();
    let result = (|| {
        if batch == 1 {
            for _ in 0..tasks {
                pool.submit(EMPTY.task(())).map_err(|e| e.to_string())?;
            }
        } else {
            for _ in 0..tasks / batch {
                let chunk = (0..batch).map(|_| EMPTY.task(())).collect();
                pool.submit_batch(chunk).map_err(|e| e.to_string())?;
            }
        }
        Ok::<_, String>(tasks as f64 / start.elapsed().as_secs_f64())
    })();
    pool.shutdown(Duration::from_secs(10));
    drop(pool);
    let ready = take_ready(control);
    let rate = result?;
    if ready != tasks as i64 {
        return Err(format!("{ready} rows of {tasks}"));
    }
    Ok(rate)
}

fn print_submit(submit: &SubmitFigures) {
    println!("Submit, tasks/s (a pool with no workers, one producer thread):");
    println!();
    println!("| workload | tasks/s |");
    println!("|---|---:|");
    println!(
        "| `submit`, one at a time ({} tasks) | {} |",
        submit.one_tasks,
        rate(&submit.one)
    );
    println!(
        "| raw insert + commit + notify, one statement at a time ({} tasks) | {} |",
        submit.one_tasks,
        rate(&submit.raw_one)
    );
    println!(
        "| `submit_batch` of {SUBMIT_BATCH} ({} tasks) | {} |",
        submit.batch_tasks,
        rate(&submit.batch)
    );
    println!();
}

// ===== dispatch latency =====

struct LatencyFigures {
    tasks: usize,
    /// Handler start minus submit time, ns, sorted.
    dispatch: Vec<i64>,
    /// How long each `submit` call took, ns, sorted.
    submit_call: Vec<i64>,
}

fn latency(db: &BenchDb, control: &mut Client, tasks: usize) -> Result<LatencyFigures, String> {
    eprintln!(
        "dispatch latency: {tasks} tasks at {LATENCY_RATE}/s, worker pool of {LATENCY_WORKERS} in \
         a child process"
    );
    let exe = env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .env(CHILD, &db.url)
        .env("TASQ_PG_BENCH_TASKS", tasks.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .register(STAMP, |_, _: &u64| Ok::<_, HandlerError>(()))
        .build()
        .map_err(|e| e.to_string())?;
    match lines.next() {
        Some(Ok(line)) if line == "ready" => {}
        other => return Err(format!("the worker process said {other:?}")),
    }
    let period = Duration::from_secs_f64(1.0 / LATENCY_RATE);
    let start = Instant::now();
    let mut submit_call = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let due = start + period * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let called = Instant::now();
        producer
            .submit(STAMP.task(epoch_nanos()))
            .map_err(|e| e.to_string())?;
        submit_call.push(called.elapsed().as_nanos() as i64);
    }
    let mut dispatch: Vec<i64> = lines
        .map_while(Result::ok)
        .filter_map(|line| line.trim().parse().ok())
        .collect();
    let status = child.wait().map_err(|e| e.to_string())?;
    producer.shutdown(Duration::from_secs(10));
    drop(producer);
    truncate(control);
    if !status.success() || dispatch.len() != tasks {
        return Err(format!(
            "the worker process reported {} of {tasks} tasks ({status})",
            dispatch.len()
        ));
    }
    dispatch.sort_unstable();
    submit_call.sort_unstable();
    eprintln!(
        "  p50 {}, p99 {}",
        nanos(percentile(&dispatch, 50.0)),
        nanos(percentile(&dispatch, 99.0))
    );
    Ok(LatencyFigures {
        tasks,
        dispatch,
        submit_call,
    })
}

/// In the child process: a worker pool that records, for each task, how long after its submit
/// its handler started; prints `ready` once listening, then one latency (ns) a line.
fn latency_child(url: &str) {
    let tasks: usize = env::var("TASQ_PG_BENCH_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .expect("TASQ_PG_BENCH_TASKS");
    let stamps = Arc::new(Mutex::new(Vec::with_capacity(tasks)));
    let record = Arc::clone(&stamps);
    let pool = Pool::builder()
        .postgres(url)
        .workers(LATENCY_WORKERS)
        .register(STAMP, move |_, sent: &u64| {
            let started = epoch_nanos();
            record.lock().unwrap().push(started as i64 - *sent as i64);
            Ok::<_, HandlerError>(())
        })
        .build()
        .expect("build the worker pool");
    // Time for the maintenance thread to connect and LISTEN.
    std::thread::sleep(Duration::from_secs(1));
    println!("ready");
    std::io::stdout().flush().expect("flush");
    let give_up = Instant::now() + STALL;
    while stamps.lock().unwrap().len() < tasks && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(10));
    }
    pool.shutdown(Duration::from_secs(10));
    let stamps = stamps.lock().unwrap();
    let mut out = std::io::stdout().lock();
    for stamp in stamps.iter() {
        writeln!(out, "{stamp}").expect("write");
    }
}

fn epoch_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_nanos() as u64
}

fn print_latency(latency: &Result<LatencyFigures, String>) {
    println!(
        "Dispatch latency at {LATENCY_RATE} tasks/s: producer pool here (no workers), worker pool \
         of {LATENCY_WORKERS} in a child process; latency = handler start − submit time:"
    );
    println!();
    match latency {
        Ok(l) => {
            println!("| figure (n={}) | p50 | p99 | max |", l.tasks);
            println!("|---|---:|---:|---:|");
            for (name, values) in [
                ("dispatch latency", &l.dispatch),
                ("the `submit` call alone", &l.submit_call),
            ] {
                println!(
                    "| {name} | {} | {} | {} |",
                    nanos(percentile(values, 50.0)),
                    nanos(percentile(values, 99.0)),
                    nanos(percentile(values, 100.0))
                );
            }
        }
        Err(why) => println!("not measured: {why}"),
    }
    println!();
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn nanos(value: i64) -> String {
    let value = value as f64;
    if value.abs() >= 1e6 {
        format!("{:.2} ms", value / 1e6)
    } else {
        format!("{:.1} µs", value / 1e3)
    }
}

// ===== targets =====

fn targets(
    dequeue: &[DequeueRow],
    submit: &SubmitFigures,
    latency: &Result<LatencyFigures, String>,
) {
    let mut lines: Vec<(String, String, Option<bool>)> = Vec::new();
    let mut compare = |target: String, tasq: &Figure, raw: &Figure, at_least: f64| {
        let (figure, met) = match (tasq, raw) {
            (Ok(t), Ok(r)) => (
                format!("×{:.2} ({t:.0} vs {r:.0}/s)", t / r),
                Some(t / r >= at_least),
            ),
            _ => ("not measured".to_owned(), None),
        };
        lines.push((target, figure, met));
    };
    for row in dequeue {
        let workers = row.workers;
        compare(
            format!("{workers} workers, the default: ≥ 1 × the raw loop with per-task acks"),
            &row.tasq,
            &row.raw,
            1.0,
        );
        compare(
            format!("{workers} workers, the default: ≥ 0.8 × the raw loop with batched acks"),
            &row.tasq,
            &row.batched,
            0.8,
        );
    }
    // Times per submit: tasq's time over the raw one's is the raw rate over tasq's.
    let (figure, met) = match (&submit.one, &submit.raw_one) {
        (Ok(t), Ok(r)) => (
            format!("×{:.2} ({:.0} µs vs {:.0} µs)", r / t, 1e6 / t, 1e6 / r),
            Some(r / t <= 1.5),
        ),
        _ => ("not measured".to_owned(), None),
    };
    lines.push((
        "one `submit` ≤ 1.5 × a raw insert with its commit and notify (time per submit)".into(),
        figure,
        met,
    ));
    lines.push((
        format!("bulk submit (batches of {SUBMIT_BATCH}) ≥ 100,000 tasks/s"),
        rate(&submit.batch),
        submit.batch.as_ref().ok().map(|&v| v >= 100_000.0),
    ));
    let (p50, p99) = match latency {
        Ok(l) => (
            Some(percentile(&l.dispatch, 50.0)),
            Some(percentile(&l.dispatch, 99.0)),
        ),
        Err(_) => (None, None),
    };
    lines.push((
        "dispatch p50 ≤ 2 ms".into(),
        p50.map_or("not measured".into(), nanos),
        p50.map(|v| v <= 2_000_000),
    ));
    lines.push((
        "dispatch p99 ≤ 10 ms".into(),
        p99.map_or("not measured".into(), nanos),
        p99.map(|v| v <= 10_000_000),
    ));
    println!("Targets from the issue (reported, not tuned for):");
    println!();
    println!("| target | measured | met |");
    println!("|---|---|---|");
    for (target, figure, met) in lines {
        let met = match met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        println!("| {target} | {figure} | {met} |");
    }
}

// ===== the machine =====

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}
