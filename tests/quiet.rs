//! `Builder::quiet_panics`: a quiet pool's caught panics skip the process's panic hook, a loud
//! pool's still reach it. Its own test binary: the panic hook is process-wide. On both stores.

mod support_store;

use std::panic;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

use support_store::{TestBuilder, TestPool, finish};
use tasq::{FailureReason, HandlerError, Outcome, TaskType};

const BUGGY: TaskType<(), ()> = TaskType::new("buggy");

/// The message of BUGGY's panics: the hook counts these, and hands every other panic (a failing
/// assertion) to the default hook.
const EXPECTED: &str = "expected panic";

fn pool(builder: TestBuilder, quiet: bool) -> TestPool {
    builder
        .workers(1)
        .quiet_panics(quiet)
        .register(BUGGY, |_, _: &()| -> Result<(), HandlerError> {
            panic!("{EXPECTED}")
        })
        .build()
}

fn run_one(pool: &TestPool) {
    match finish(&pool.submit(BUGGY.task(())).unwrap()) {
        Outcome::Failed(failure) => {
            assert_eq!(failure.reason, FailureReason::Panicked);
            assert_eq!(failure.error, EXPECTED);
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// Taken by each test while it counts: the two stores' variants share the process's hook.
static COUNTING: Mutex<()> = Mutex::new(());

/// How many expected panics reached the process's panic hook. The counting hook is installed
/// once per process, before any pool here is built, and stays: the quiet pools' wrapper, also
/// installed once per process, wraps it.
fn reported() -> &'static AtomicUsize {
    static REPORTED: AtomicUsize = AtomicUsize::new(0);
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            if message == Some(EXPECTED) {
                REPORTED.fetch_add(1, Ordering::SeqCst);
            } else {
                default(info);
            }
        }));
    });
    &REPORTED
}

conformance! {
    fn quiet_pools_skip_the_panic_hook_and_loud_ones_do_not(builder) {
        // A variant that failed poisoned the lock; the count starts afresh below.
        let _counting = COUNTING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let second = TestBuilder::new(builder.store()).expect("the store ran the first pool");
        let reported = reported();
        reported.store(0, Ordering::SeqCst);

        let loud = pool(builder, false);
        run_one(&loud);
        assert_eq!(reported.load(Ordering::SeqCst), 1, "a loud pool reports");

        let quiet = pool(second, true);
        run_one(&quiet);
        run_one(&quiet);
        assert_eq!(reported.load(Ordering::SeqCst), 1, "a quiet pool does not");

        // The wrapper installed for the quiet pool still passes the loud pool's panics on.
        run_one(&loud);
        assert_eq!(reported.load(Ordering::SeqCst), 2);
    }
}
