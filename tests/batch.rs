//! Submitting many tasks at once: every task accepted or none, handles in order, keys
//! deduplicated within the batch as across submits. On both stores.

mod support_store;

use support_store::{TestBuilder, TestPool, finish};
use tasq::{HandlerError, Outcome, SubmitErrorKind, TaskId, TaskState, TaskType};

const SQUARE: TaskType<u64, u64> = TaskType::new("square");
const OTHER: TaskType<u64, u64> = TaskType::new("other");

fn pool(builder: TestBuilder) -> TestPool {
    builder
        .workers(2)
        .register(SQUARE, |_, n: &u64| Ok::<_, HandlerError>(n * n))
        .register(OTHER, |_, n: &u64| Ok::<_, HandlerError>(*n))
        .build()
}

conformance! {
    fn a_batch_runs_every_task_and_hands_back_handles_in_order(builder) {
        let pool = pool(builder);
        let handles = pool
            .submit_batch((0..500).map(|n| SQUARE.task(n).priority((n % 3) as u8)).collect())
            .unwrap();
        assert_eq!(handles.len(), 500);
        for (n, handle) in (0..500u64).zip(&handles) {
            assert!(!handle.is_duplicate());
            assert_eq!(finish(handle), Outcome::Succeeded(n * n));
        }
        let ids: Vec<TaskId> = handles.iter().map(|h| h.id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 500, "every task has its own id");
        assert_eq!(pool.stats().totals.submitted, 500);
    }

    fn a_batch_with_one_bad_task_adds_nothing(builder) {
        let pool = pool(builder);
        let unknown = TaskId::from_parts(pool.id(), 1_000_000);
        let refused = pool
            .submit_batch(vec![
                SQUARE.task(1),
                SQUARE.task(2).key("two"),
                SQUARE.task(3).after([unknown]),
                SQUARE.task(4),
            ])
            .unwrap_err();
        assert_eq!(refused.kind(), &SubmitErrorKind::UnknownDependency(unknown));
        let (index, tasks) = refused.into_task();
        assert_eq!(index, 2);
        let payloads: Vec<u64> = tasks.into_iter().map(|t| t.into_payload()).collect();
        assert_eq!(payloads, [1, 2, 3, 4]);
        let stats = pool.stats();
        assert_eq!((stats.totals.submitted, stats.ready + stats.running), (0, 0));
        // The key was not taken by the refused batch.
        let two = pool.submit(SQUARE.task(2).key("two")).unwrap();
        assert!(!two.is_duplicate());
        assert_eq!(finish(&two), Outcome::Succeeded(4));
    }

    fn keys_are_deduplicated_within_a_batch_and_against_earlier_tasks(builder) {
        let pool = pool(builder);
        let earlier = pool.submit(SQUARE.task(10).key("ten")).unwrap();
        let handles = pool
            .submit_batch(vec![
                SQUARE.task(11).key("ten"),
                SQUARE.task(12).key("twelve"),
                SQUARE.task(13).key("twelve"),
            ])
            .unwrap();
        assert!(handles[0].is_duplicate());
        assert_eq!(handles[0].id(), earlier.id());
        assert!(!handles[1].is_duplicate());
        assert!(handles[2].is_duplicate());
        assert_eq!(handles[2].id(), handles[1].id());
        assert_eq!(finish(&handles[0]), Outcome::Succeeded(100));
        assert_eq!(finish(&handles[2]), Outcome::Succeeded(144));
        assert_eq!(pool.stats().totals.submitted, 2);
    }

    fn a_key_held_by_another_type_refuses_the_batch(builder) {
        let pool = pool(builder);
        let square = pool.submit(SQUARE.task(1).key("k")).unwrap();
        let refused = pool
            .submit_batch(vec![OTHER.task(2), OTHER.task(3).key("k")])
            .unwrap_err();
        assert_eq!(
            refused.kind(),
            &SubmitErrorKind::KeyConflict {
                key: "k".to_owned(),
                existing: square.id(),
                existing_type: "square",
            }
        );
        assert_eq!(refused.into_task().0, 1);
        // Within one batch too: the id named is the one the earlier task would have had.
        let refused = pool
            .submit_batch(vec![SQUARE.task(4).key("j"), OTHER.task(5).key("j")])
            .unwrap_err();
        assert!(matches!(
            refused.kind(),
            SubmitErrorKind::KeyConflict { existing_type: "square", .. }
        ));
        assert_eq!(refused.into_task().0, 1);
        assert_eq!(pool.stats().totals.submitted, 1);
        assert_eq!(finish(&square), Outcome::Succeeded(1));
    }

    fn a_batch_task_can_depend_on_an_earlier_submit(builder) {
        let pool = pool(builder);
        let first = pool.submit(SQUARE.task(3)).unwrap();
        let handles = pool
            .submit_batch(vec![SQUARE.task(4).after([&first]), SQUARE.task(5)])
            .unwrap();
        assert_eq!(finish(&handles[0]), Outcome::Succeeded(16));
        assert_eq!(finish(&handles[1]), Outcome::Succeeded(25));
        assert_eq!(first.status(), TaskState::Succeeded);
    }

    fn an_empty_batch_is_empty(builder) {
        let pool = pool(builder);
        assert!(pool.submit_batch(Vec::<tasq::Task<u64, u64>>::new()).unwrap().is_empty());
    }
}
