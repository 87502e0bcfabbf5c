//! Graceful shutdown with a deadline: `shutdown` lets the workers drain the queue (delayed tasks
//! included, when they come due), and when the deadline passes it fires the running handlers'
//! cancel tokens and cancels everything that has not started. Afterwards, `submit` hands the task
//! back.
//!
//! Run it with `cargo run --example shutdown`.

use std::error::Error;
use std::time::Duration;

use tasq::{CancelReason, HandlerError, Outcome, Pool, SubmitErrorKind, TaskType};

/// One step of work: a handler runs `steps` of them.
const STEP: Duration = Duration::from_millis(50);
const DEADLINE: Duration = Duration::from_millis(500);

/// Runs a job step by step and returns the number of steps done.
const JOB: TaskType<Job, u32> = TaskType::new("job");

struct Job {
    name: &'static str,
    steps: u32,
}

fn main() -> Result<(), Box<dyn Error>> {
    let pool = Pool::builder()
        .workers(2)
        .register(JOB, |ctx, job: &Job| {
            for _ in 0..job.steps {
                // Not `thread::sleep`: this returns `Err(Cancelled)` as soon as the task's token
                // fires (a cancel, or the shutdown deadline), and `?` ends the handler there.
                ctx.sleep(STEP)?;
            }
            Ok::<_, HandlerError>(job.steps)
        })
        .build()?;

    // (name, steps, delay): one job far longer than the deadline, short ones queued for the
    // other worker, a delayed one that comes due during the drain, and one due long after.
    let plan = [
        ("export", 40, Duration::ZERO),
        ("thumbnail 1", 1, Duration::ZERO),
        ("thumbnail 2", 1, Duration::ZERO),
        ("thumbnail 3", 1, Duration::ZERO),
        ("reminder", 1, Duration::from_millis(100)),
        ("digest", 1, Duration::from_secs(60)),
    ];
    let mut handles = Vec::new();
    for (name, steps, delay) in plan {
        let handle = pool.submit(JOB.task(Job { name, steps }).delay(delay))?;
        handles.push((name, handle));
    }

    let stats = pool.stats();
    let (now, later) = (stats.ready + stats.running, stats.scheduled);
    println!("shutting down within {DEADLINE:?}: {now} tasks to run now, {later} delayed");
    let report = pool.shutdown(DEADLINE);
    println!("{report:?}");
    assert!(report.deadline_reached, "the export cannot finish in time");
    assert_eq!(report.failed, 0);
    assert_eq!(report.succeeded + report.cancelled, plan.len() as u64);

    // Every task reached a terminal state, so every wait returns at once.
    for (name, handle) in &handles {
        let outcome = handle.wait();
        match &outcome {
            Outcome::Succeeded(steps) => println!("  {name:12} succeeded after {steps} step(s)"),
            Outcome::Failed(failure) => println!("  {name:12} failed: {failure}"),
            Outcome::Cancelled(reason) => println!("  {name:12} cancelled: {reason}"),
        }
        let cancelled = outcome == Outcome::Cancelled(CancelReason::Shutdown);
        match *name {
            // The export was running: its token fired and it ended cancelled, not failed.
            // The digest never started.
            "export" | "digest" => assert!(cancelled, "{name}: {outcome:?}"),
            // The drain runs the rest well within the deadline (on an overloaded machine the
            // deadline might still catch one of them, which is a correct outcome too).
            _ => assert!(outcome.is_succeeded() || cancelled, "{name}: {outcome:?}"),
        }
    }

    // The pool is closed now: a refused submit hands the task back, nothing is lost.
    let late = Job {
        name: "late report",
        steps: 1,
    };
    let Err(refused) = pool.submit(JOB.task(late)) else {
        panic!("a pool that has shut down must refuse new tasks");
    };
    assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
    println!("submit after shutdown: {refused}");
    let Job { name, steps } = refused.into_task().into_payload();
    println!("  got back {name:?} ({steps} step) to run elsewhere");
    Ok(())
}
