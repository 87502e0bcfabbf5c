//! Cancellation tokens are per task: a worker hands its token on to the next task only when
//! nobody else holds it and it has not fired. On both stores (the durable store never hands a
//! token on: each claim gets its own).
//!
//! A worker reuses a token only for a task that is already queued when the previous one ends, so
//! every test queues the next task first.

mod support_store;

use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};
use support_store::{HANG_GUARD, TestBuilder, TestPool, finish};
use tasq::{CancelReason, CancelToken, HandlerError, Outcome, TaskType};

/// What a `STEP` handler does.
#[derive(Clone, Copy, serde::Serialize, serde::Deserialize)]
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
    pool: TestPool,
    started: Receiver<()>,
    open: Sender<()>,
    kept: Arc<Mutex<Option<CancelToken>>>,
}

fn fixture(builder: TestBuilder) -> Fixture {
    let (started_tx, started) = crossbeam_channel::unbounded::<()>();
    let (open, gate) = crossbeam_channel::unbounded::<()>();
    let kept = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&kept);
    let pool = builder
        .workers(1)
        .register(STEP, move |ctx, step: &Step| {
            match step {
                Step::WaitToken => {
                    started_tx.send(()).unwrap();
                    ctx.token().wait();
                }
                Step::Gate => {
                    started_tx.send(()).unwrap();
                    gate.recv_timeout(HANG_GUARD).unwrap();
                }
                Step::Keep => *keep.lock().unwrap() = Some(ctx.token().clone()),
                Step::Quick => {}
            }
            Ok::<_, HandlerError>(ctx.is_cancelled())
        })
        .build();
    Fixture {
        pool,
        started,
        open,
        kept,
    }
}

conformance! {
    fn a_fired_token_is_not_handed_to_the_next_task(builder) {
        let f = fixture(builder);
        let cancelled = f.pool.submit(STEP.task(Step::WaitToken)).unwrap();
        f.started.recv_timeout(HANG_GUARD).unwrap();
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

    fn a_token_a_handler_kept_is_not_shared_with_the_next_task(builder) {
        let f = fixture(builder);
        let gate = f.pool.submit(STEP.task(Step::Gate)).unwrap();
        f.started.recv_timeout(HANG_GUARD).unwrap();
        let keeper = f.pool.submit(STEP.task(Step::Keep)).unwrap();
        let next = f.pool.submit(STEP.task(Step::WaitToken)).unwrap();
        f.open.send(()).unwrap();
        assert_eq!(finish(&gate), Outcome::Succeeded(false));
        assert_eq!(finish(&keeper), Outcome::Succeeded(false));
        f.started.recv_timeout(HANG_GUARD).unwrap();
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

    fn a_handed_on_token_still_fires_for_its_new_task(builder) {
        let f = fixture(builder);
        let gate = f.pool.submit(STEP.task(Step::Gate)).unwrap();
        f.started.recv_timeout(HANG_GUARD).unwrap();
        let quick: Vec<_> = (0..5)
            .map(|_| f.pool.submit(STEP.task(Step::Quick)).unwrap())
            .collect();
        let last = f.pool.submit(STEP.task(Step::WaitToken)).unwrap();
        f.open.send(()).unwrap();
        assert_eq!(finish(&gate), Outcome::Succeeded(false));
        for handle in &quick {
            assert_eq!(finish(handle), Outcome::Succeeded(false));
        }
        f.started.recv_timeout(HANG_GUARD).unwrap();
        last.cancel().unwrap();
        assert_eq!(finish(&last), Outcome::Cancelled(CancelReason::Requested));
    }
}
