//! `Builder::quiet_panics`: a quiet pool's caught panics skip the process's panic hook, a loud
//! pool's still reach it. Its own test binary: the panic hook is process-wide.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tasq::{FailureReason, HandlerError, Outcome, Pool, TaskType};

const BUGGY: TaskType<(), ()> = TaskType::new("buggy");

fn pool(quiet: bool) -> Pool {
    Pool::builder()
        .workers(1)
        .quiet_panics(quiet)
        .register(BUGGY, |_, _: &()| -> Result<(), HandlerError> {
            panic!("expected panic")
        })
        .build()
        .unwrap()
}

fn run_one(pool: &Pool) {
    match pool.submit(BUGGY.task(())).unwrap().wait() {
        Outcome::Failed(failure) => {
            assert_eq!(failure.reason, FailureReason::Panicked);
            assert_eq!(failure.error, "expected panic");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn quiet_pools_skip_the_panic_hook_and_loud_ones_do_not() {
    let reported = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&reported);
    std::panic::set_hook(Box::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    }));

    let loud = pool(false);
    run_one(&loud);
    assert_eq!(reported.load(Ordering::SeqCst), 1, "a loud pool reports");

    let quiet = pool(true);
    run_one(&quiet);
    run_one(&quiet);
    assert_eq!(reported.load(Ordering::SeqCst), 1, "a quiet pool does not");

    // The wrapper installed for the quiet pool still passes the loud pool's panics on.
    run_one(&loud);
    assert_eq!(reported.load(Ordering::SeqCst), 2);
    let _ = std::panic::take_hook();
}
