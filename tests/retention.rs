//! Retention: the pool forgets the oldest finished tasks beyond its limits, while their handles
//! keep their outcomes. On both stores: the embedded store applies the limits as each task
//! finishes, the durable store's cleaner about once a second (see [`settle_retention`]).

mod support_store;

use std::time::Duration;

use support_store::{finish, settle_retention};
use tasq::{CancelError, HandlerError, ManualClock, Outcome, SubmitErrorKind, TaskState, TaskType};

const SQUARE: TaskType<u64, u64> = TaskType::new("square");

conformance! {
    fn only_the_newest_finished_tasks_are_remembered(builder) {
        let pool = builder
            .workers(1)
            .retention(10, None)
            .register(SQUARE, |_, n: &u64| Ok::<_, HandlerError>(n * n))
            .build();
        let handles: Vec<_> = (0..100u64)
            .map(|n| pool.submit(SQUARE.task(n)).unwrap())
            .collect();
        for (n, handle) in (0..).zip(&handles) {
            assert_eq!(finish(handle), Outcome::Succeeded(n * n));
        }
        settle_retention(&pool);

        let stats = pool.stats();
        assert!(stats.retained <= 10, "{} retained", stats.retained);
        assert_eq!(stats.retained, 10, "the limit is used, not undershot");
        assert_eq!(stats.totals.succeeded, 100);

        // One worker finishes tasks in submission order: the first 90 are forgotten.
        for (n, handle) in handles.iter().enumerate() {
            let id = handle.id();
            if n < 90 {
                assert_eq!(pool.status(id), None, "task {n} should be forgotten");
                assert_eq!(pool.info(id), None);
                assert!(pool.handle(SQUARE, id).is_none());
                assert_eq!(handle.cancel(), Err(CancelError::UnknownTask(id)));
            } else {
                assert_eq!(pool.status(id), Some(TaskState::Succeeded), "task {n}");
            }
            // Handles keep their outcomes either way.
            assert_eq!(handle.status(), TaskState::Succeeded);
            let n = n as u64;
            assert_eq!(handle.try_wait(), Some(Outcome::Succeeded(n * n)));
            assert_eq!(handle.wait(), Outcome::Succeeded(n * n));
        }

        // A forgotten task cannot be depended on.
        let forgotten = handles[0].id();
        let err = pool.submit(SQUARE.task(1).after([forgotten])).unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::UnknownDependency(forgotten));
    }

    fn unfinished_tasks_are_never_forgotten(builder) {
        let clock = ManualClock::new();
        let pool = builder
            .workers(1)
            .manual_clock(clock.clone())
            .retention(0, Some(Duration::ZERO))
            .register(SQUARE, |_, n: &u64| Ok::<_, HandlerError>(n * n))
            .build();
        let later = pool
            .submit(SQUARE.task(3).delay(Duration::from_secs(5)))
            .unwrap();
        // Tasks finishing around it trigger retention, which must skip the scheduled one.
        for n in 0..5 {
            finish(&pool.submit(SQUARE.task(n)).unwrap());
        }
        settle_retention(&pool);
        assert_eq!(pool.status(later.id()), Some(TaskState::Scheduled));
        assert_eq!(pool.stats().retained, 0);
        clock.advance(Duration::from_secs(5));
        assert_eq!(finish(&later), Outcome::Succeeded(9));
        settle_retention(&pool);
        assert_eq!(pool.status(later.id()), None);
    }

    fn records_older_than_max_age_are_dropped_when_a_later_task_finishes(builder) {
        let clock = ManualClock::new();
        let pool = builder
            .workers(1)
            .manual_clock(clock.clone())
            .retention(1_000, Some(Duration::from_secs(60)))
            .register(SQUARE, |_, n: &u64| Ok::<_, HandlerError>(n * n))
            .build();
        let old = pool.submit(SQUARE.task(2)).unwrap();
        finish(&old);

        // Just under the age: still remembered when another task finishes.
        clock.advance(Duration::from_secs(60) - Duration::from_nanos(1));
        let young = pool.submit(SQUARE.task(3)).unwrap();
        finish(&young);
        settle_retention(&pool);
        assert_eq!(pool.status(old.id()), Some(TaskState::Succeeded));
        assert_eq!(pool.stats().retained, 2);

        // At the age: dropped by the next task's finish; the younger one stays.
        clock.advance(Duration::from_nanos(1));
        finish(&pool.submit(SQUARE.task(4)).unwrap());
        settle_retention(&pool);
        assert_eq!(pool.status(old.id()), None);
        assert_eq!(pool.status(young.id()), Some(TaskState::Succeeded));
        assert_eq!(pool.stats().retained, 2);
        assert_eq!(old.wait(), Outcome::Succeeded(4));
    }
}
