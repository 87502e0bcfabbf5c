//! Cancellation tokens are per task: a worker hands its token on to the next task only when
//! nobody else holds it and it has not fired.
//!
//! A worker reuses a token only for a task that is already queued when the previous one ends, so
//! every test queues the next task first.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use tasq::{CancelReason, CancelToken, HandlerError, Outcome, Pool, TaskHandle, TaskType};

const WAIT: Duration = Duration::from_secs(10);

/// What a `STEP` handler does.
#[derive(Clone, Copy)]
enum Step {
    /// Say it started, wait for its token to fire.
    WaitToken,
    /// Say it started, wait until the test opens the gate.
    Gate,
    /// Keep a clone of its token.
    Keep,
    /// Nothing.
    Quick,
}

/// Returns whether its token had fired when it returned.
const STEP: TaskType<Step, bool> = TaskType::new("step");

struct Fixture {
    pool: Pool,
    started: Receiver<()>,
    open: Sender<()>,
    kept: Arc<Mutex<Option<CancelToken>>>,
}

fn fixture() -> Fixture {
    let (started_tx, started) = crossbeam_channel::unbounded::<()>();
    let (open, gate) = crossbeam_channel::unbounded::<()>();
    let kept = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&kept);
    let pool = Pool::builder()
        .workers(1)
        .register(STEP, move |ctx, step: &Step| {
            match step {
                Step::WaitToken => {
                    started_tx.send(()).unwrap();
                    ctx.token().wait();
                }
                Step::Gate => {
                    started_tx.send(()).unwrap();
                    gate.recv_timeout(WAIT).unwrap();
                }
                Step::Keep => *keep.lock().unwrap() = Some(ctx.token().clone()),
                Step::Quick => {}
            }
            Ok::<_, HandlerError>(ctx.is_cancelled())
        })
        .build()
        .unwrap();
    Fixture {
        pool,
        started,
        open,
        kept,
    }
}

fn finish(handle: &TaskHandle<bool>) -> Outcome<bool> {
    handle.wait_timeout(WAIT).expect("the task finished")
}

#[test]
fn a_fired_token_is_not_handed_to_the_next_task() {
    let f = fixture();
    let cancelled = f.pool.submit(STEP.task(Step::WaitToken)).unwrap();
    f.started.recv_timeout(WAIT).unwrap();
    let next = f.pool.submit(STEP.task(Step::Quick)).unwrap();
    cancelled.cancel().unwrap();
    assert_eq!(
        finish(&cancelled),
        Outcome::Cancelled(CancelReason::Requested)
    );
    assert_eq!(
        finish(&next),
        Outcome::Succeeded(false),
        "the next task got a fired token"
    );
}

#[test]
fn a_token_a_handler_kept_is_not_shared_with_the_next_task() {
    let f = fixture();
    let gate = f.pool.submit(STEP.task(Step::Gate)).unwrap();
    f.started.recv_timeout(WAIT).unwrap();
    let keeper = f.pool.submit(STEP.task(Step::Keep)).unwrap();
    let next = f.pool.submit(STEP.task(Step::WaitToken)).unwrap();
    f.open.send(()).unwrap();
    assert_eq!(finish(&gate), Outcome::Succeeded(false));
    assert_eq!(finish(&keeper), Outcome::Succeeded(false));
    f.started.recv_timeout(WAIT).unwrap();
    next.cancel().unwrap();
    assert_eq!(finish(&next), Outcome::Cancelled(CancelReason::Requested));
    let kept = f
        .kept
        .lock()
        .unwrap()
        .take()
        .expect("the keeper kept its token");
    assert!(
        !kept.is_cancelled(),
        "cancelling the next task fired the keeper's token"
    );
}

#[test]
fn a_handed_on_token_still_fires_for_its_new_task() {
    let f = fixture();
    let gate = f.pool.submit(STEP.task(Step::Gate)).unwrap();
    f.started.recv_timeout(WAIT).unwrap();
    let quick: Vec<_> = (0..5)
        .map(|_| f.pool.submit(STEP.task(Step::Quick)).unwrap())
        .collect();
    let last = f.pool.submit(STEP.task(Step::WaitToken)).unwrap();
    f.open.send(()).unwrap();
    assert_eq!(finish(&gate), Outcome::Succeeded(false));
    for handle in &quick {
        assert_eq!(finish(handle), Outcome::Succeeded(false));
    }
    f.started.recv_timeout(WAIT).unwrap();
    last.cancel().unwrap();
    assert_eq!(finish(&last), Outcome::Cancelled(CancelReason::Requested));
}
