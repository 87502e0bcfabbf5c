//! Pausing and resuming task types and queues, on both stores: once `pause` returns no task it
//! covers starts (running ones finish), tasks are still accepted and wait ready, `resume` lets
//! them all run, a type paused itself and through its queue needs both resumed, and the gates,
//! cancels and a handler that pauses its own pool all mix with it.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use support_store::{GATE, Gate, HANG_GUARD, Store, TestBuilder, assert_all_ran, finish};
use tasq::{
    CancelOutcome, HandlerError, PauseError, PauseTarget, Pool, TaskHandle, TaskState, TaskType,
    TypeOptions,
};

/// In queue `mail`.
const SEND: TaskType<u32, u32> = TaskType::new("send");
/// In queue `mail` too.
const BOUNCE: TaskType<u32, u32> = TaskType::new("bounce");
/// In the default queue.
const RESIZE: TaskType<u32, u32> = TaskType::new("resize");

/// A builder with `SEND` and `BOUNCE` in queue `mail` (`BOUNCE` limited to one at a time) and
/// `RESIZE` in the default one, each counting its runs in `runs`.
fn with_types(builder: TestBuilder, runs: &Arc<AtomicU32>) -> TestBuilder {
    let counted = |runs: &Arc<AtomicU32>| {
        let runs = Arc::clone(runs);
        move |_: &tasq::Context, n: &u32| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, HandlerError>(*n)
        }
    };
    builder
        .workers(3)
        .with_gates()
        .register_with(SEND, TypeOptions::new().queue("mail"), counted(runs))
        .register_with(
            BOUNCE,
            TypeOptions::new().queue("mail").concurrency_limit(1),
            counted(runs),
        )
        .register_with(RESIZE, TypeOptions::new(), counted(runs))
}

fn submit_many(pool: &Pool, ty: TaskType<u32, u32>, n: u32) -> Vec<TaskHandle<u32>> {
    (0..n).map(|i| pool.submit(ty.task(i)).unwrap()).collect()
}

fn assert_waiting(handles: &[TaskHandle<u32>]) {
    for handle in handles {
        assert_eq!(handle.status(), TaskState::Ready, "{}", handle.id());
    }
}

conformance! {
    fn a_paused_type_starts_nothing_until_it_is_resumed(builder) {
        let runs = Arc::new(AtomicU32::new(0));
        let pool = with_types(builder, &runs).build();
        assert_eq!(pool.pause(PauseTarget::task_type("send")), Ok(true));
        let sends = submit_many(&pool, SEND, 20);
        let resizes = submit_many(&pool, RESIZE, 10);
        assert_all_ran(&resizes);
        pool.wait_idle();
        assert_waiting(&sends);
        assert_eq!(runs.load(Ordering::SeqCst), 10, "only the resizes ran");
        assert_eq!(pool.resume(PauseTarget::task_type("send")), Ok(true));
        assert_all_ran(&sends);
        assert_eq!(runs.load(Ordering::SeqCst), 30);
        pool.check_invariants().unwrap();
    }

    fn a_paused_queue_holds_every_type_in_it_and_no_other(builder) {
        let runs = Arc::new(AtomicU32::new(0));
        let pool = with_types(builder, &runs).build();
        assert_eq!(pool.pause(PauseTarget::queue("mail")), Ok(true));
        let sends = submit_many(&pool, SEND, 10);
        let bounces = submit_many(&pool, BOUNCE, 10);
        let resizes = submit_many(&pool, RESIZE, 10);
        assert_all_ran(&resizes);
        pool.wait_idle();
        assert_waiting(&sends);
        assert_waiting(&bounces);
        pool.check_invariants().unwrap();
        assert_eq!(pool.resume(PauseTarget::queue("mail")), Ok(true));
        assert_all_ran(&sends);
        assert_all_ran(&bounces);
        pool.check_invariants().unwrap();
    }

    fn a_type_paused_itself_and_through_its_queue_runs_only_once_both_are_resumed(builder) {
        let runs = Arc::new(AtomicU32::new(0));
        let pool = with_types(builder, &runs).build();
        pool.pause(PauseTarget::task_type("bounce")).unwrap();
        pool.pause(PauseTarget::queue("mail")).unwrap();
        let bounces = submit_many(&pool, BOUNCE, 5);
        let sends = submit_many(&pool, SEND, 5);
        pool.wait_idle();
        assert_eq!(pool.resume(PauseTarget::queue("mail")), Ok(true));
        assert_all_ran(&sends);
        pool.wait_idle();
        assert_waiting(&bounces);
        assert_eq!(pool.resume(PauseTarget::task_type("bounce")), Ok(true));
        assert_all_ran(&bounces);
        pool.check_invariants().unwrap();
    }

    fn pause_resume_and_the_listing_say_what_changed(builder) {
        let runs = Arc::new(AtomicU32::new(0));
        let pool = with_types(builder, &runs).build();
        assert_eq!(pool.paused(), Ok(Vec::new()));
        assert_eq!(pool.pause(PauseTarget::queue("mail")), Ok(true));
        assert_eq!(pool.pause(PauseTarget::queue("mail")), Ok(false), "paused already");
        assert_eq!(pool.pause(PauseTarget::task_type("resize")), Ok(true));
        let listed: Vec<PauseTarget> = pool.paused().unwrap().into_iter().map(|p| p.target).collect();
        assert_eq!(listed, [PauseTarget::task_type("resize"), PauseTarget::queue("mail")]);
        for paused in pool.paused().unwrap() {
            let age = std::time::SystemTime::now().duration_since(paused.since).unwrap_or_default();
            assert!(age < HANG_GUARD, "{paused:?}");
        }
        assert_eq!(pool.resume(PauseTarget::queue("mail")), Ok(true));
        assert_eq!(pool.resume(PauseTarget::queue("mail")), Ok(false), "not paused");
        let listed: Vec<PauseTarget> = pool.paused().unwrap().into_iter().map(|p| p.target).collect();
        assert_eq!(listed, [PauseTarget::task_type("resize")]);
    }

    fn bad_names_are_refused_with_a_typed_error(builder) {
        let runs = Arc::new(AtomicU32::new(0));
        let store = builder.store();
        let pool = with_types(builder, &runs).build();
        for target in [
            PauseTarget::queue(""),
            PauseTarget::queue("has space"),
            PauseTarget::queue("q".repeat(64)),
            PauseTarget::task_type(""),
        ] {
            assert!(
                matches!(pool.pause(target.clone()), Err(PauseError::InvalidName { .. })),
                "{target:?}"
            );
            assert!(
                matches!(pool.resume(target.clone()), Err(PauseError::InvalidName { .. })),
                "{target:?}"
            );
        }
        let unknown = PauseTarget::queue("nowhere");
        match store {
            // The embedded store knows every type and queue there is.
            Store::Memory => {
                assert_eq!(pool.pause(unknown.clone()), Err(PauseError::Unknown(unknown)));
            }
            // Another process of the fleet may serve it.
            #[cfg(feature = "postgres")]
            Store::Postgres => assert_eq!(pool.pause(unknown), Ok(true)),
        }
        let sends = submit_many(&pool, SEND, 3);
        assert_all_ran(&sends);
    }

    fn a_running_task_finishes_and_a_waiting_one_can_be_cancelled(builder) {
        let runs = Arc::new(AtomicU32::new(0));
        let pool = with_types(builder, &runs).build();
        let gate = Gate::new();
        let running = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        pool.pause(PauseTarget::task_type("gate")).unwrap();
        let waiting = pool.submit(GATE.task(0)).unwrap();
        let cancelled = pool.submit(GATE.task(0)).unwrap();
        gate.open();
        assert!(finish(&running).succeeded().is_some(), "a running task finishes");
        pool.wait_idle();
        assert_eq!(waiting.status(), TaskState::Ready);
        assert_eq!(pool.cancel(cancelled.id()), Ok(CancelOutcome::Cancelled));
        pool.check_invariants().unwrap();
        pool.resume(PauseTarget::task_type("gate")).unwrap();
        assert!(finish(&waiting).succeeded().is_some());
        assert_eq!(cancelled.status(), TaskState::Cancelled);
        pool.check_invariants().unwrap();
    }

    fn a_handler_may_pause_and_resume_its_own_pool(builder) {
        const TOGGLE: TaskType<bool, ()> = TaskType::new("toggle");
        let runs = Arc::new(AtomicU32::new(0));
        let pool = with_types(builder, &runs)
            .register(TOGGLE, |ctx, &pause: &bool| {
                let target = PauseTarget::queue("mail");
                let changed = if pause { ctx.pause(target) } else { ctx.resume(target) };
                changed.map(|_| ()).map_err(|e| HandlerError::permanent(e.to_string()))
            })
            .build();
        finish(&pool.submit(TOGGLE.task(true)).unwrap());
        let sends = submit_many(&pool, SEND, 5);
        pool.wait_idle();
        assert_waiting(&sends);
        finish(&pool.submit(TOGGLE.task(false)).unwrap());
        assert_all_ran(&sends);
        pool.check_invariants().unwrap();
    }
}
