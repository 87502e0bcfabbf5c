//! Idempotency keys: concurrent submits of one key make one task; a key matches only live and
//! succeeded tasks (a failed or cancelled one frees it), and a succeeded one's key is free again
//! once retention has forgotten the task; a deduplicated submit says so; a resubmitted dead
//! letter takes its key back; a key finds and cancels its holder. On both stores.

mod support_store;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use support_store::{GATE, Gate, TestBuilder, TestPool, finish, settle_retention};
use tasq::{CancelError, CancelOutcome, CancelReason, HandlerError, Outcome, TaskState, TaskType};

/// Counts its runs; returns the payload and the run number.
const CHARGE: TaskType<u32, (u32, usize)> = TaskType::new("charge");

fn pool(
    builder: TestBuilder,
    workers: usize,
    retention: Option<usize>,
) -> (TestPool, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let mut builder =
        builder
            .workers(workers)
            .with_gates()
            .register(CHARGE, move |_, &cents: &u32| {
                let run = counter.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, HandlerError>((cents, run))
            });
    if let Some(max_count) = retention {
        builder = builder.retention(max_count, None);
    }
    (builder.build(), runs)
}

/// Fails (permanently) for payload 0, succeeds otherwise.
const PICKY: TaskType<u32, u32> = TaskType::new("picky");

fn picky_pool(builder: TestBuilder) -> TestPool {
    builder
        .workers(1)
        .with_gates()
        .register(PICKY, |_, n: &u32| {
            if *n == 0 {
                Err(HandlerError::permanent("zero"))
            } else {
                Ok(*n)
            }
        })
        .build()
}

conformance! {
    fn sixteen_threads_submitting_one_key_at_once_make_one_task(builder) {
        const THREADS: usize = 16;
        let (pool, runs) = pool(builder, 1, None);
        // Hold the worker, so the task cannot start, let alone finish, while the submits race.
        let gate = Gate::new();
        let _ = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();

        let start = Barrier::new(THREADS);
        let handles: Vec<_> = std::thread::scope(|scope| {
            let submitters: Vec<_> = (0..THREADS)
                .map(|i| {
                    let (pool, start) = (&pool, &start);
                    scope.spawn(move || {
                        start.wait();
                        // Each thread offers its own payload: only the first submit's may run.
                        pool.submit(CHARGE.task(500 + i as u32).key("order-17"))
                            .expect("submit")
                    })
                })
                .collect();
            submitters.into_iter().map(|t| t.join().unwrap()).collect()
        });

        let id = handles[0].id();
        assert!(handles.iter().all(|h| h.id() == id), "one task for one key");
        assert_eq!(pool.stats().totals.submitted, 2, "the gate and one charge");
        assert_eq!(pool.stats().ready, 1);
        assert_eq!(runs.load(Ordering::SeqCst), 0);

        gate.open();
        let outcomes: Vec<_> = handles.iter().map(finish).collect();
        let Outcome::Succeeded((cents, 1)) = outcomes[0] else {
            panic!("unexpected {:?}", outcomes[0]);
        };
        assert!((500..500 + THREADS as u32).contains(&cents));
        assert!(outcomes.iter().all(|o| *o == outcomes[0]), "{outcomes:?}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the handler ran exactly once"
        );
    }

    fn a_remembered_key_keeps_returning_its_finished_task(builder) {
        let (pool, runs) = pool(builder, 1, None);
        let first = pool.submit(CHARGE.task(100).key("k")).unwrap();
        assert_eq!(finish(&first), Outcome::Succeeded((100, 1)));

        assert!(!first.is_duplicate());
        let again = pool.submit(CHARGE.task(999).key("k")).unwrap();
        assert_eq!(again.id(), first.id());
        assert!(again.is_duplicate() && again.clone().is_duplicate());
        assert!(again.is_finished());
        assert_eq!(finish(&again), Outcome::Succeeded((100, 1)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(pool.stats().totals.submitted, 1);
    }

    fn a_key_is_reusable_once_retention_forgot_its_task(builder) {
        let (pool, runs) = pool(builder, 1, Some(0));
        let first = pool.submit(CHARGE.task(100).key("k")).unwrap();
        assert_eq!(finish(&first), Outcome::Succeeded((100, 1)));
        settle_retention(&pool);
        assert_eq!(pool.status(first.id()), None, "retention 0 forgets at once");

        let second = pool.submit(CHARGE.task(200).key("k")).unwrap();
        assert_ne!(second.id(), first.id());
        assert_eq!(finish(&second), Outcome::Succeeded((200, 2)));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // The forgotten task's handle still has its outcome.
        assert_eq!(finish(&first), Outcome::Succeeded((100, 1)));
    }

    fn a_key_stays_taken_until_its_task_is_the_oldest_beyond_retention(builder) {
        let (pool, runs) = pool(builder, 1, Some(1));
        let keyed = pool.submit(CHARGE.task(1).key("k")).unwrap();
        finish(&keyed);
        settle_retention(&pool);
        // Still remembered (one record kept): deduplicated.
        assert_eq!(
            pool.submit(CHARGE.task(2).key("k")).unwrap().id(),
            keyed.id()
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // Another task finishing pushes the keyed one out.
        finish(&pool.submit(CHARGE.task(3)).unwrap());
        settle_retention(&pool);
        assert_eq!(pool.status(keyed.id()), None);
        let fresh = pool.submit(CHARGE.task(4).key("k")).unwrap();
        assert_ne!(fresh.id(), keyed.id());
        assert_eq!(finish(&fresh), Outcome::Succeeded((4, 3)));
    }

    fn a_key_of_an_unfinished_task_is_deduplicated_whatever_its_state(builder) {
        let (pool, runs) = pool(builder, 1, Some(0));
        let gate = Gate::new();
        let _ = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        // Ready, behind the gate: retention 0 does not touch unfinished tasks.
        let queued = pool.submit(CHARGE.task(1).key("k")).unwrap();
        assert_eq!(queued.status(), TaskState::Ready);
        let again = pool.submit(CHARGE.task(2).key("k")).unwrap();
        assert_eq!(again.id(), queued.id());
        gate.open();
        assert_eq!(finish(&again), Outcome::Succeeded((1, 1)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    fn a_failed_or_cancelled_task_frees_its_key(builder) {
        let pool = picky_pool(builder);
        let failed = pool.submit(PICKY.task(0).key("k")).unwrap();
        assert!(finish(&failed).is_failed());
        // A program can run the key again after a failure, with another payload.
        let retry = pool.submit(PICKY.task(5).key("k")).unwrap();
        assert!(!retry.is_duplicate());
        assert_ne!(retry.id(), failed.id());
        assert_eq!(finish(&retry), Outcome::Succeeded(5));

        let cancelled = pool
            .submit(
                PICKY
                    .task(6)
                    .key("c")
                    .delay(std::time::Duration::from_secs(3600)),
            )
            .unwrap();
        cancelled.cancel().unwrap();
        let again = pool.submit(PICKY.task(7).key("c")).unwrap();
        assert!(!again.is_duplicate());
        assert_eq!(finish(&again), Outcome::Succeeded(7));
        pool.check_invariants().unwrap();
    }

    fn find_key_names_the_live_or_succeeded_holder_of_a_key(builder) {
        let pool = picky_pool(builder);
        assert_eq!(pool.find_key("k"), None, "never used");
        let hour = std::time::Duration::from_secs(3600);
        let later = pool.submit(PICKY.task(1).key("later").delay(hour)).unwrap();
        assert_eq!(pool.find_key("later"), Some(later.id()));
        let done = pool.submit(PICKY.task(2).key("done")).unwrap();
        assert_eq!(finish(&done), Outcome::Succeeded(2));
        assert_eq!(pool.find_key("done"), Some(done.id()), "a succeeded holder");
        let failed = pool.submit(PICKY.task(0).key("failed")).unwrap();
        assert!(finish(&failed).is_failed());
        assert_eq!(pool.find_key("failed"), None, "a failure frees the key");
        // A plain task has no key to find.
        let plain = pool.submit(PICKY.task(3)).unwrap();
        assert_eq!(finish(&plain), Outcome::Succeeded(3));
        assert_eq!(pool.find_key(""), None);
        later.cancel().unwrap();
        assert_eq!(pool.find_key("later"), None, "a cancel frees the key");
    }

    fn cancel_key_cancels_the_holder_of_a_key_as_cancel_does(builder) {
        let pool = picky_pool(builder);
        let hour = std::time::Duration::from_secs(3600);
        assert_eq!(pool.cancel_key("k"), Err(CancelError::UnknownKey("k".to_owned())));

        // Not started: cancelled at once, with its dependents, and the key is free again.
        let later = pool.submit(PICKY.task(1).key("later").delay(hour)).unwrap();
        let child = pool.submit(PICKY.task(2).after([later.id()])).unwrap();
        assert_eq!(pool.cancel_key("later"), Ok((later.id(), CancelOutcome::Cancelled)));
        assert_eq!(finish(&later), Outcome::Cancelled(CancelReason::Requested));
        assert_eq!(
            finish(&child),
            Outcome::Cancelled(CancelReason::DependencyCancelled(later.id()))
        );
        assert_eq!(pool.find_key("later"), None);
        assert_eq!(pool.cancel_key("later"), Err(CancelError::UnknownKey("later".to_owned())));
        let again = pool.submit(PICKY.task(3).key("later")).unwrap();
        assert!(!again.is_duplicate());
        assert_eq!(finish(&again), Outcome::Succeeded(3));

        // Succeeded: still the holder, nothing to cancel.
        assert_eq!(
            pool.cancel_key("later"),
            Ok((again.id(), CancelOutcome::AlreadyFinished(TaskState::Succeeded)))
        );
        assert_eq!(pool.find_key("later"), Some(again.id()));

        // Running: its token fires, and it ends cancelled.
        let gate = Gate::new();
        let running = pool.submit(GATE.task(gate.number()).key("running")).unwrap();
        gate.wait_started();
        assert_eq!(pool.cancel_key("running"), Ok((running.id(), CancelOutcome::Signalled)));
        gate.open();
        assert_eq!(finish(&running), Outcome::Cancelled(CancelReason::Requested));
        assert_eq!(pool.find_key("running"), None);
        pool.check_invariants().unwrap();
    }

    fn a_resubmitted_dead_letter_takes_its_key_back_unless_another_task_holds_it(builder) {
        let pool = picky_pool(builder);
        let failed = pool.submit(PICKY.task(0).key("k")).unwrap();
        assert!(finish(&failed).is_failed());
        // Hold the worker, so the resubmitted task waits, ready, holding the key.
        let gate = Gate::new();
        let _ = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        let resubmitted = pool.resubmit(PICKY, failed.id()).unwrap();
        let dup = pool.submit(PICKY.task(9).key("k")).unwrap();
        assert!(dup.is_duplicate(), "the resubmitted task holds the key");
        assert_eq!(dup.id(), resubmitted.id());
        gate.open();
        // Payload 0 fails again, and frees the key.
        assert!(finish(&resubmitted).is_failed());

        // Another task takes the key: resubmitting the new dead letter is refused, not run
        // keyless.
        let holder = pool
            .submit(
                PICKY
                    .task(3)
                    .key("k")
                    .delay(std::time::Duration::from_secs(3600)),
            )
            .unwrap();
        assert!(!holder.is_duplicate());
        assert_eq!(
            pool.resubmit(PICKY, resubmitted.id()).err(),
            Some(tasq::ResubmitError::KeyTaken(resubmitted.id(), holder.id()))
        );
        // Once the holder is gone, the dead letter can run again with its key.
        holder.cancel().unwrap();
        let again = pool.resubmit(PICKY, resubmitted.id()).unwrap();
        assert!(finish(&again).is_failed());
        pool.check_invariants().unwrap();
    }
}

/// A key held by a task of another type earlier in the same batch refuses the batch, naming
/// the id that earlier task would have had: the id it gets when it is submitted next, after a
/// plain submit took an id before the batch.
#[test]
fn a_key_conflict_within_a_batch_names_the_id_the_earlier_task_gets() {
    const SQUARE: tasq::TaskType<u64, u64> = tasq::TaskType::new("square");
    const OTHER: tasq::TaskType<u64, u64> = tasq::TaskType::new("other");
    let pool = tasq::Pool::builder()
        .workers(1)
        .register(SQUARE, |_, n: &u64| Ok::<_, tasq::HandlerError>(n * n))
        .register(OTHER, |_, n: &u64| Ok::<_, tasq::HandlerError>(*n))
        .build()
        .unwrap();
    let before = pool.submit(SQUARE.task(1)).unwrap();
    let refused = pool
        .submit_batch(vec![SQUARE.task(2).key("j"), OTHER.task(3).key("j")])
        .unwrap_err();
    let tasq::SubmitErrorKind::KeyConflict {
        existing,
        existing_type,
        ..
    } = refused.kind().clone()
    else {
        panic!("a key conflict: {:?}", refused.kind());
    };
    assert_eq!(existing_type, "square");
    assert_eq!(refused.into_task().0, 1);

    let accepted = pool.submit_batch(vec![SQUARE.task(2).key("j")]).unwrap();
    assert_eq!(
        accepted[0].id(),
        existing,
        "the id named is the one it gets"
    );
    assert!(existing > before.id());
    assert_eq!(accepted[0].wait(), tasq::Outcome::Succeeded(4));
    assert_eq!(before.wait(), tasq::Outcome::Succeeded(1));
}
