//! Every bad input gets its typed error (and a refused task comes back), never a panic or a hang.
//! On both stores.

mod support_store;

use std::time::{Duration, Instant};

use support_store::{Store, TestBuilder, TestPool, finish};
use tasq::{
    BuildError, CancelError, HandlerError, Pool, ResubmitError, RetryPolicy, SubmitErrorKind,
    TaskId, TaskType, TypeOptions,
};

const DOUBLE: TaskType<u32, u32> = TaskType::new("double");
const NAME: TaskType<String, usize> = TaskType::new("name");

fn pool(builder: TestBuilder) -> TestPool {
    builder
        .workers(1)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .register(NAME, |_, s: &String| Ok::<_, HandlerError>(s.len()))
        .build()
}

/// Another builder on `store`, for a second pool.
fn another(store: Store) -> TestBuilder {
    TestBuilder::new(store).expect("the store ran the first pool")
}

/// An id this pool never issued: the third id of another pool (on the same store), when this
/// one has issued fewer.
fn foreign_id(store: Store) -> TaskId {
    let other = pool(another(store));
    let ids: Vec<_> = (0..3)
        .map(|n| other.submit(DOUBLE.task(n)).unwrap().id())
        .collect();
    ids[2]
}

// Embedded only: a durable pool may have zero workers (a producer that only submits and waits),
// so the durable builder accepts it on purpose.
#[test]
fn zero_workers_is_refused() {
    let built = Pool::builder()
        .workers(0)
        .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build();
    assert!(matches!(built, Err(BuildError::ZeroWorkers)), "{built:?}");
}

conformance! {
    fn an_unknown_task_type_is_refused_and_handed_back(builder) {
        const UNKNOWN: TaskType<String, ()> = TaskType::new("unknown");
        let pool = pool(builder);
        let err = pool
            .submit(UNKNOWN.task("payload".to_owned()).priority(4))
            .unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::UnknownType("unknown"));
        let task = err.into_task();
        assert_eq!(task.task_type().name(), "unknown");
        assert_eq!(task.into_payload(), "payload");
        assert_eq!(pool.stats().totals.submitted, 0);
    }

    fn a_registered_name_with_other_types_is_a_type_mismatch(builder) {
        let pool = pool(builder);
        const OTHER_PAYLOAD: TaskType<String, u32> = TaskType::new("double");
        const OTHER_OUTPUT: TaskType<u32, String> = TaskType::new("double");

        let err = pool.submit(OTHER_PAYLOAD.task("x".to_owned())).unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::TypeMismatch("double"));
        assert_eq!(err.into_task().into_payload(), "x");

        let err = pool.submit(OTHER_OUTPUT.task(5)).unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::TypeMismatch("double"));
        assert_eq!(err.into_task().into_payload(), 5);
        assert_eq!(pool.stats().totals.submitted, 0);

        // A handle of the wrong types is refused too.
        let id = pool.submit(DOUBLE.task(1)).unwrap().id();
        assert!(pool.handle(OTHER_OUTPUT, id).is_none());
        assert!(pool.handle(NAME, id).is_none());
        assert!(pool.handle(DOUBLE, id).is_some());
    }

    fn a_handler_registered_twice_is_refused(builder) {
        const SAME_NAME_OTHER_TYPES: TaskType<String, String> = TaskType::new("double");
        let built = builder
            .workers(1)
            .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .register(NAME, |_, s: &String| Ok::<_, HandlerError>(s.len()))
            .register(SAME_NAME_OTHER_TYPES, |_, s: &String| {
                Ok::<_, HandlerError>(s.clone())
            })
            .try_build()
            .err();
        assert!(
            matches!(built, Some(BuildError::DuplicateType("double"))),
            "{built:?}"
        );
    }

    fn zero_max_attempts_is_refused_for_the_pool_and_for_a_type(builder) {
        let store = builder.store();
        let built = builder
            .workers(1)
            .max_attempts(0)
            .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .try_build()
            .err();
        assert!(
            matches!(built, Some(BuildError::ZeroMaxAttempts(None))),
            "{built:?}"
        );

        let built = another(store)
            .workers(1)
            .register(NAME, |_, s: &String| Ok::<_, HandlerError>(s.len()))
            .register_with(DOUBLE, TypeOptions::new().max_attempts(0), |_, n: &u32| {
                Ok::<_, HandlerError>(*n)
            })
            .try_build()
            .err();
        assert!(
            matches!(built, Some(BuildError::ZeroMaxAttempts(Some("double")))),
            "{built:?}"
        );
    }

    fn a_retry_cap_that_overflows_is_refused_for_the_pool_and_for_a_type(builder) {
        let store = builder.store();
        let forever = RetryPolicy::exponential(Duration::from_secs(1), Duration::MAX);
        let built = builder
            .workers(1)
            .retry_policy(forever)
            .register(DOUBLE, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .try_build()
            .err();
        assert!(
            matches!(built, Some(BuildError::DurationOverflow(_))),
            "{built:?}"
        );

        let built = another(store)
            .workers(1)
            .register_with(
                DOUBLE,
                TypeOptions::new().retry_policy(forever),
                |_, n: &u32| Ok::<_, HandlerError>(*n),
            )
            .try_build()
            .err();
        assert!(
            matches!(built, Some(BuildError::DurationOverflow(_))),
            "{built:?}"
        );
    }

    fn a_dependency_on_an_unknown_task_is_refused(builder) {
        let store = builder.store();
        let pool = pool(builder);
        let known = pool.submit(DOUBLE.task(1)).unwrap();
        let foreign = foreign_id(store);
        let err = pool
            .submit(DOUBLE.task(2).after([known.id(), foreign]))
            .unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::UnknownDependency(foreign));
        assert_eq!(err.into_task().into_payload(), 2);
        assert_eq!(pool.stats().totals.submitted, 1, "nothing was added");
        assert_eq!(finish(&known).succeeded(), Some(2));
    }

    fn a_due_time_too_far_to_represent_is_refused(builder) {
        // 600 years: an Instant can hold it, the delayed heap's 64-bit nanoseconds cannot.
        let far = Duration::from_secs(600 * 365 * 24 * 3600);
        let pool = pool(builder);
        let err = pool
            .submit(NAME.task("delay".to_owned()).delay(far))
            .unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::TimeOverflow);
        let at = Instant::now() + far;
        let err = pool
            .submit(NAME.task("run_at".to_owned()).run_at(at))
            .unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::TimeOverflow);
        assert_eq!(err.into_task().into_payload(), "run_at");
        // 500 years is fine.
        let handle = pool
            .submit(
                NAME.task("later".to_owned())
                    .delay(Duration::from_secs(500 * 365 * 24 * 3600)),
            )
            .unwrap();
        assert_eq!(pool.stats().scheduled, 1);
        handle.cancel().unwrap();
    }

    fn a_delay_that_overflows_is_refused(builder) {
        let pool = pool(builder);
        let err = pool
            .submit(NAME.task("later".to_owned()).delay(Duration::MAX))
            .unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::TimeOverflow);
        assert_eq!(err.into_task().into_payload(), "later");
        let stats = pool.stats();
        assert_eq!((stats.totals.submitted, stats.scheduled), (0, 0));
        // The pool still works.
        assert_eq!(
            finish(&pool.submit(DOUBLE.task(4)).unwrap()).succeeded(),
            Some(8)
        );
    }

    fn a_submit_after_shutdown_is_refused_and_handed_back(builder) {
        let pool = pool(builder);
        let before = pool.submit(DOUBLE.task(3)).unwrap();
        if pool.store() == Store::Postgres {
            // A durable pool's shutdown does not drain the queue (what is left stays in the
            // database for the other processes): the task ends first. The embedded pool's
            // shutdown drains it.
            assert_eq!(finish(&before).succeeded(), Some(6));
        }
        let report = pool.shutdown(Duration::from_secs(5));
        assert_eq!(report.succeeded, 1);
        assert_eq!(finish(&before).succeeded(), Some(6));

        let err = pool.submit(NAME.task("too late".to_owned())).unwrap_err();
        assert_eq!(err.kind(), &SubmitErrorKind::ShutDown);
        assert_eq!(err.into_task().into_payload(), "too late");
        // Unknown types are refused as shut down too, without looking further.
        const UNKNOWN: TaskType<u8, ()> = TaskType::new("unknown");
        assert_eq!(
            pool.submit(UNKNOWN.task(1)).unwrap_err().kind(),
            &SubmitErrorKind::ShutDown
        );
        assert_eq!(
            pool.resubmit(DOUBLE, before.id()).err(),
            Some(ResubmitError::ShutDown)
        );
    }

    fn a_key_held_by_another_type_is_a_conflict(builder) {
        let pool = pool(builder);
        let holder = pool.submit(DOUBLE.task(5).key("order-1")).unwrap();
        let err = pool
            .submit(NAME.task("mine".to_owned()).key("order-1"))
            .unwrap_err();
        assert_eq!(
            err.kind(),
            &SubmitErrorKind::KeyConflict {
                key: "order-1".to_owned(),
                existing: holder.id(),
                existing_type: "double",
            }
        );
        assert_eq!(err.into_task().into_payload(), "mine");
        assert_eq!(pool.stats().totals.submitted, 1);
    }

    fn cancel_and_resubmit_of_an_unknown_id_are_refused(builder) {
        let store = builder.store();
        let pool = pool(builder);
        let foreign = foreign_id(store);
        assert_eq!(pool.cancel(foreign), Err(CancelError::UnknownTask(foreign)));
        assert_eq!(
            pool.resubmit(DOUBLE, foreign).err(),
            Some(ResubmitError::UnknownTask(foreign))
        );
        assert_eq!(pool.status(foreign), None);
        assert_eq!(pool.info(foreign), None);
        assert!(pool.handle(DOUBLE, foreign).is_none());
    }
}

/// A pool has at most 32,767 workers (the intake word counts sleepers and searchers in 15-bit
/// fields): 32,768 are refused before any thread is spawned. (Were they not, the pool would
/// try to spawn them: the build fails, or the process runs out of memory mappings and aborts;
/// either way the test fails. The small stacks keep that attempt cheap.)
#[test]
fn more_than_32767_workers_are_refused() {
    let refused = tasq::Pool::builder()
        .workers(32_768)
        .stack_size(256 << 10)
        .build()
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(
            refused,
            tasq::BuildError::InvalidSetting {
                setting: "the number of workers",
                of: "the pool",
                ..
            }
        ),
        "{refused:?}"
    );
}
