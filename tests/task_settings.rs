//! A task's own settings on the embedded store: attempts, retry policy and timeout set at
//! submit, in place of its type's, shown by `info`, kept by a resubmit, and checked.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tasq::{
    FailureReason, HandlerError, Outcome, Pool, RetryPolicy, SubmitErrorKind, TaskType, TypeOptions,
};

const FLAKY: TaskType<u32, u32> = TaskType::new("flaky");

const NOW: RetryPolicy = RetryPolicy::exponential(Duration::ZERO, Duration::ZERO);

fn failure(outcome: Outcome<u32>) -> tasq::Failure {
    match outcome {
        Outcome::Failed(failure) => failure,
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// A pool whose `FLAKY` allows 3 attempts and always fails; counts the runs.
fn pool(runs: &Arc<AtomicU32>) -> Pool {
    let runs = Arc::clone(runs);
    Pool::builder()
        .workers(2)
        .register_with(
            FLAKY,
            TypeOptions::new().max_attempts(3).retry_policy(NOW),
            move |ctx, _: &u32| {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<u32, _>(HandlerError::retryable(format!(
                    "max {}",
                    ctx.max_attempts()
                )))
            },
        )
        .build()
        .unwrap()
}

#[test]
fn a_task_s_own_attempts_replace_its_type_s() {
    let runs = Arc::new(AtomicU32::new(0));
    let pool = pool(&runs);
    let own = pool.submit(FLAKY.task(1).max_attempts(5)).unwrap();
    assert_eq!(pool.info(own.id()).unwrap().max_attempts, 5);
    let failed = failure(own.wait());
    assert_eq!(
        (failed.reason, failed.attempts),
        (FailureReason::Exhausted, 5)
    );
    assert_eq!(failed.error, "max 5");
    let plain = pool.submit(FLAKY.task(2)).unwrap();
    assert_eq!(failure(plain.wait()).attempts, 3);
    assert_eq!(runs.load(Ordering::SeqCst), 8);
    // Through a batch and with a key, too.
    let batch = pool
        .submit_batch(vec![FLAKY.task(3).max_attempts(1), FLAKY.task(4)])
        .unwrap();
    assert_eq!(failure(batch[0].wait()).attempts, 1);
    assert_eq!(failure(batch[1].wait()).attempts, 3);
    let keyed = pool.submit(FLAKY.task(5).key("k").max_attempts(2)).unwrap();
    assert_eq!(failure(keyed.wait()).attempts, 2);
    // A resubmit keeps them.
    let again = pool.resubmit(FLAKY, own.id()).unwrap();
    assert_eq!(pool.info(again.id()).unwrap().max_attempts, 5);
    assert_eq!(failure(again.wait()).attempts, 5);
    pool.check_invariants().unwrap();
}

/// A timeout of the task's own fires its token, on a pool whose types have none (its monitor
/// starts when such a task first runs).
#[test]
fn a_task_s_own_timeout_fires_on_a_pool_without_timeouts() {
    const WAIT: TaskType<(), ()> = TaskType::new("wait");
    let pool = Pool::builder()
        .workers(1)
        .register(WAIT, |ctx, _: &()| {
            ctx.token().wait();
            Ok::<_, HandlerError>(())
        })
        .build()
        .unwrap();
    let handle = pool
        .submit(
            WAIT.task(())
                .timeout(Duration::from_millis(20))
                .max_attempts(1),
        )
        .unwrap();
    let info = pool.info(handle.id()).unwrap();
    assert_eq!(info.timeout, Some(Duration::from_millis(20)));
    match handle.wait() {
        Outcome::Failed(failure) => assert_eq!(failure.reason, FailureReason::TimedOut),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn a_task_s_own_settings_are_checked_at_submit() {
    let runs = Arc::new(AtomicU32::new(0));
    let pool = pool(&runs);
    let refused = |kind: &SubmitErrorKind| match kind {
        SubmitErrorKind::InvalidSetting { setting, .. } => *setting,
        other => panic!("expected an invalid setting, got {other:?}"),
    };
    let error = pool.submit(FLAKY.task(9).max_attempts(0)).unwrap_err();
    assert_eq!(refused(error.kind()), "max_attempts");
    assert_eq!(error.into_task().into_payload(), 9);
    let error = pool
        .submit(FLAKY.task(9).timeout(Duration::ZERO))
        .unwrap_err();
    assert_eq!(refused(error.kind()), "timeout");
    let error = pool
        .submit(FLAKY.task(9).timeout(Duration::MAX))
        .unwrap_err();
    assert_eq!(refused(error.kind()), "timeout");
    let forever = RetryPolicy::exponential(Duration::ZERO, Duration::MAX);
    let error = pool
        .submit_batch(vec![FLAKY.task(1), FLAKY.task(2).retry_policy(forever)])
        .unwrap_err();
    assert_eq!(refused(error.kind()), "retry cap");
    assert_eq!(error.into_task().0, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
