//! Retries and dead letters: a flaky fetch that succeeds on its third attempt, an outage that
//! exhausts its attempts, a permanent 404, a panicking handler, and a dead letter resubmitted
//! once its cause is fixed.
//!
//! Run it with `cargo run --example retries`.

use std::collections::HashMap;
use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tasq::{FailureReason, HandlerError, Outcome, Pool, RetryPolicy, TaskType, TypeOptions};

/// Fetches a page from a (simulated) server and returns its body.
const FETCH: TaskType<&'static str, String> = TaskType::new("fetch");

/// The simulated server's status for `GET url` on this attempt.
fn respond(url: &str, attempt: u32, reports_up: bool) -> u16 {
    match url {
        "/flaky" if attempt < 3 => 503,   // overloaded for a moment
        "/reports" if !reports_up => 503, // an outage that outlasts the retries
        "/missing" => 404,
        "/moved" => 301,
        _ => 200,
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    // Handler panics still go through the panic hook: keep them short, without a backtrace.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| match std::thread::current().name() {
        Some(name) if name.starts_with("tasq-worker") => eprintln!("{name} {info}"),
        _ => default_hook(info),
    }));

    let reports_up = Arc::new(AtomicBool::new(false));
    let up = Arc::clone(&reports_up);
    // Four attempts per fetch, with backoffs drawn from [0, 10 ms], [0, 20 ms], [0, 40 ms].
    let backoff = RetryPolicy::exponential(Duration::from_millis(10), Duration::from_millis(40));
    let options = TypeOptions::new().max_attempts(4).retry_policy(backoff);
    let pool = Pool::builder()
        .workers(2)
        .register_with(FETCH, options, move |ctx, url: &&'static str| {
            match respond(url, ctx.attempt(), up.load(Ordering::SeqCst)) {
                200 => Ok(format!("<html>{url}</html>")),
                // Server errors may go away: retry them, after a backoff.
                status @ 500..=599 => Err(HandlerError::retryable(format!("HTTP {status}"))),
                // Client errors will not: straight to the dead letters.
                status @ 400..=499 => Err(HandlerError::permanent(format!("HTTP {status}"))),
                // A bug in the handler: the pool catches the panic and dead-letters the task.
                status => panic!("no handling for HTTP {status} from {url}"),
            }
        })
        .build()?;

    // Each URL with how it should end: `None` for success, and the attempts it should take.
    let expected = [
        ("/flaky", None, 3),
        ("/reports", Some(FailureReason::Exhausted), 4),
        ("/missing", Some(FailureReason::Permanent), 1),
        ("/moved", Some(FailureReason::Panicked), 1),
    ];
    let urls = expected.map(|(url, ..)| url);
    let mut handles = Vec::new();
    for url in urls {
        handles.push(pool.submit(FETCH.task(url))?);
    }

    println!("outcomes:");
    for ((url, reason, attempts), handle) in expected.into_iter().zip(&handles) {
        let outcome = handle.wait();
        let ran = pool.info(handle.id()).ok_or("task forgotten")?.attempts;
        let failed = match outcome {
            Outcome::Succeeded(body) => {
                println!("  {url:8} succeeded after {ran} attempts: {body}");
                None
            }
            Outcome::Failed(failure) => {
                println!("  {url:8} failed: {failure}");
                Some(failure.reason)
            }
            Outcome::Cancelled(why) => panic!("{url} was cancelled ({why})"),
        };
        assert_eq!((failed, ran), (reason, attempts), "{url}");
    }

    // A dead letter keeps its payload for `resubmit` but does not show it: find ours by id.
    // Its failure reads "<reason> after <n> attempt(s): <last error>".
    let url_of: HashMap<_, _> = handles.iter().map(|h| h.id()).zip(urls).collect();
    let dead = pool.dead_letters();
    println!("dead letters:");
    for letter in &dead {
        let url = url_of[&letter.id];
        println!("  {} ({url}): {}", letter.id, letter.failure);
    }
    assert_eq!(dead.len(), 3, "three fetches should be dead letters");

    // The outage is over: run the /reports fetch again, as a new task with fresh attempts.
    reports_up.store(true, Ordering::SeqCst);
    let old = handles[1].id(); // the /reports fetch
    let handle = pool.resubmit(FETCH, old)?;
    let Outcome::Succeeded(body) = handle.wait() else {
        panic!("the resubmitted fetch should succeed once the outage is over");
    };
    println!("resubmitted {old} as {} after the fix: {body}", handle.id());
    let left = pool.dead_letters().len();
    assert_eq!(left, 2, "a resubmitted dead letter leaves the list");
    Ok(())
}
