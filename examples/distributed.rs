//! One producer and three worker processes sharing one durable queue in PostgreSQL.
//!
//! ```sh
//! cargo run --example distributed
//! ```
//!
//! The example runs itself three more times as worker processes (`distributed worker`); the
//! producer, in the first process, builds a durable pool with no workers, submits tasks (one at
//! a time and in a batch, with priorities, a delay, a key and a dependency chain), waits for
//! their outcomes and prints which process ran what. The server: `TASQ_PG_URL` (a key=value
//! connection string), else the local one at 127.0.0.1:5432 (user postgres, database test). The
//! queue lives in the schema `tasq_example`, emptied at the start.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tasq::{HandlerError, Pool, TaskType, TypeOptions};

/// Resizes an image (pretends to): returns the pid of the process that ran it.
const RESIZE: TaskType<String, u32> = TaskType::new("resize");
/// Publishes an album once its images are resized.
const PUBLISH: TaskType<String, u32> = TaskType::new("publish");

const SCHEMA: &str = "tasq_example";

/// The options of both types, shared by the producer's declarations and the workers'
/// registrations.
const OPTIONS: TypeOptions = TypeOptions::new().max_attempts(5);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = std::env::var("TASQ_PG_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".to_owned());
    if std::env::args().nth(1).as_deref() == Some("worker") {
        return worker(&base);
    }

    // A fresh queue: the schema and its tables (`migrate_in` is safe to run from every process).
    let mut admin = postgres::Client::connect(&base, postgres::NoTls)?;
    admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))?;
    tasq::postgres::migrate_in(&base, SCHEMA)?;

    let workers: Vec<Child> = (0..3)
        .map(|_| {
            Command::new(std::env::current_exe()?)
                .arg("worker")
                .env("TASQ_PG_URL", &base)
                .stdin(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;

    // The producer: a durable pool with no workers of its own, declaring the types it submits
    // with the options the workers register them with (the tasks' settings come from here).
    let producer = Pool::builder()
        .postgres(&base)
        .schema(SCHEMA)
        .workers(0)
        .declare(RESIZE, OPTIONS)
        .declare(PUBLISH, OPTIONS)
        .build()?;
    let started = Instant::now();
    let batch = producer.submit_batch(
        (0..2_000)
            .map(|n| RESIZE.task(format!("img-{n}.png")).priority((n % 3) as u8))
            .collect(),
    )?;
    let urgent = producer.submit(RESIZE.task("cover.png".into()).priority(9))?;
    let later = producer.submit(
        RESIZE
            .task("thumb.png".into())
            .delay(Duration::from_millis(300)),
    )?;
    let once = producer.submit(RESIZE.task("logo.png".into()).key("logo"))?;
    let again = producer.submit(RESIZE.task("logo.png".into()).key("logo"))?;
    let album = producer.submit(PUBLISH.task("album".into()).after([&urgent, &later, &once]))?;

    let mut ran_by: BTreeMap<u32, usize> = BTreeMap::new();
    for handle in batch.iter().chain([&urgent, &later, &once]) {
        let pid = handle.wait().into_result()?;
        *ran_by.entry(pid).or_default() += 1;
    }
    let publisher = album.wait().into_result()?;
    println!(
        "{} tasks ran in {:.2} s across {} worker processes:",
        batch.len() + 4,
        started.elapsed().as_secs_f64(),
        ran_by.len()
    );
    for (pid, count) in &ran_by {
        println!("  process {pid}: {count} tasks");
    }
    println!(
        "the key deduplicated the second logo ({}), and the album was published by process \
         {publisher} once its three images were done",
        if again.is_duplicate() {
            "same task"
        } else {
            "a new task?"
        }
    );
    println!("stats seen from the producer: {:?}", producer.stats());

    // Closing their standard input tells the workers to shut down.
    for mut worker in workers {
        drop(worker.stdin.take());
        worker.wait()?;
    }
    producer.shutdown(Duration::from_secs(5));
    Ok(())
}

/// A worker process: a durable pool with two workers, until its standard input closes.
fn worker(base: &str) -> Result<(), Box<dyn std::error::Error>> {
    let pool = Pool::builder()
        .postgres(base)
        .schema(SCHEMA)
        .workers(2)
        .register_with(RESIZE, OPTIONS, |_, _: &String| {
            Ok::<_, HandlerError>(std::process::id())
        })
        .register_with(PUBLISH, OPTIONS, |_, _: &String| {
            Ok::<_, HandlerError>(std::process::id())
        })
        .build()?;
    for line in std::io::stdin().lock().lines() {
        line?;
    }
    let report = pool.shutdown(Duration::from_secs(10));
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "worker {} ran {} tasks",
        std::process::id(),
        report.succeeded
    )?;
    Ok(())
}
