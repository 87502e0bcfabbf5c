//! A downstream outage, as an operator sees it: a payments service goes down for ten seconds
//! while the pool keeps taking work.
//!
//! Run it with `cargo run --release --example outage` (about 16 seconds). `charge` tasks call
//! the payments service, behind a circuit breaker (open after 5 failures in a row, probe every 2
//! seconds); `thumbnail` tasks call nothing and must not notice the outage. Two backlog alerts
//! watch the queue. The pool's events (breaker changes, alerts) are printed as they come, and
//! the metrics are printed before the outage and after it, as a Prometheus scraper would read
//! them. It exits with status 1 if a charge was lost or a thumbnail waited behind the outage.

use std::process;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tasq::{
    Alert, Breaker, Event, HandlerError, Metrics, Pool, RetryPolicy, TaskHandle, TaskType,
    TypeOptions,
};

const CHARGE: TaskType<u64, ()> = TaskType::new("charge");
/// Its payload is when it was submitted.
const THUMBNAIL: TaskType<Instant, ()> = TaskType::new("thumbnail");

/// How long the example submits work.
const RUN: Duration = Duration::from_secs(14);
/// When the payments service goes down, and for how long.
const OUTAGE_START: Duration = Duration::from_secs(2);
const OUTAGE: Duration = Duration::from_secs(10);

fn main() {
    let start = Instant::now();
    let payments_down = move || (OUTAGE_START..OUTAGE_START + OUTAGE).contains(&start.elapsed());
    let calls = Arc::new(AtomicU64::new(0));
    let calls_in_handler = Arc::clone(&calls);
    // The longest a thumbnail waited for a worker, in microseconds.
    let slowest = Arc::new(AtomicU64::new(0));
    let slowest_in_handler = Arc::clone(&slowest);

    let pool = Pool::builder()
        .workers(4)
        .thread_name("outage")
        .breaker("payments", Breaker::new(5, Duration::from_secs(2)))
        .alert(Alert::ready_depth(50).task_type("charge"))
        .alert(Alert::oldest_ready(Duration::from_secs(3)))
        .monitor_interval(Duration::from_millis(250))
        .on_event(move |event: &Event| match event {
            Event::Breaker { .. } | Event::AlertRaised { .. } | Event::AlertCleared { .. } => {
                println!("[{:5.1}s] {event}", start.elapsed().as_secs_f64());
            }
            _ => {}
        })
        .register_with(
            CHARGE,
            TypeOptions::new()
                .downstream("payments")
                .max_attempts(12)
                .retry_policy(RetryPolicy::exponential(
                    Duration::from_millis(100),
                    Duration::from_secs(1),
                )),
            move |_, _: &u64| {
                calls_in_handler.fetch_add(1, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(2));
                if payments_down() {
                    Err(HandlerError::retryable("payments: connection refused"))
                } else {
                    Ok(())
                }
            },
        )
        .register(THUMBNAIL, move |_, submitted: &Instant| {
            let waited = u64::try_from(submitted.elapsed().as_micros()).unwrap_or(u64::MAX);
            slowest_in_handler.fetch_max(waited, Ordering::Relaxed);
            thread::sleep(Duration::from_millis(1));
            Ok::<_, HandlerError>(())
        })
        .build()
        .expect("the pool builds");

    println!(
        "[  0.0s] submitting 20 charges and 40 thumbnails a second for {RUN:?}; payments goes down at {OUTAGE_START:?} for {OUTAGE:?}"
    );
    let mut charges: Vec<TaskHandle<()>> = Vec::new();
    let mut thumbnails: Vec<TaskHandle<()>> = Vec::new();
    let mut printed_before = false;
    let mut n = 0;
    while start.elapsed() < RUN {
        for _ in 0..2 {
            charges.push(pool.submit(CHARGE.task(n)).expect("accepted"));
            n += 1;
        }
        for _ in 0..4 {
            thumbnails.push(
                pool.submit(THUMBNAIL.task(Instant::now()))
                    .expect("accepted"),
            );
        }
        if !printed_before && start.elapsed() >= OUTAGE_START - Duration::from_millis(200) {
            printed_before = true;
            print_metrics("before the outage", &pool.metrics());
        }
        thread::sleep(Duration::from_millis(100));
    }

    // Every charge ends once payments is back; thumbnails were never held up.
    let mut failed_charges = 0;
    for handle in &charges {
        if !handle.wait().is_succeeded() {
            failed_charges += 1;
        }
    }
    let thumbnails_ok = thumbnails
        .iter()
        .filter(|h| h.wait().is_succeeded())
        .count();
    pool.wait_idle();
    println!("[{:5.1}s] every task ended", start.elapsed().as_secs_f64());
    print_metrics("after the outage", &pool.metrics());

    let report = pool.shutdown(Duration::from_secs(5));
    let runs = calls.load(Ordering::Relaxed);
    println!(
        "charges: {} submitted, {} succeeded, {failed_charges} failed, {runs} calls to payments \
         ({} beyond one per charge)",
        charges.len(),
        charges.len() - failed_charges,
        runs - charges.len() as u64,
    );
    let slowest = Duration::from_micros(slowest.load(Ordering::Relaxed));
    println!(
        "thumbnails: {} submitted, {thumbnails_ok} succeeded, the slowest waited {slowest:?} for a worker",
        thumbnails.len(),
    );
    println!(
        "in all: {} succeeded, {} failed, {} cancelled",
        report.succeeded, report.failed, report.cancelled
    );
    if failed_charges > 0 || thumbnails_ok < thumbnails.len() {
        eprintln!("FAILED: a charge or a thumbnail did not succeed");
        process::exit(1);
    }
    if slowest > Duration::from_secs(1) {
        eprintln!("FAILED: a thumbnail waited {slowest:?} behind the outage");
        process::exit(1);
    }
}

/// The lines of the Prometheus text an operator would look at.
fn print_metrics(title: &str, metrics: &Metrics) {
    println!("---- metrics {title} ----");
    let keep = [
        "tasq_tasks{state=\"ready\"}",
        "tasq_breaker_state",
        "tasq_type_ready_tasks",
        "tasq_runs_total",
        "tasq_dead_letters_total{reason=\"exhausted\"}",
    ];
    for line in metrics.to_prometheus().lines() {
        if !line.starts_with('#') && keep.iter().any(|k| line.starts_with(k)) {
            println!("  {line}");
        }
    }
    println!("----");
}
