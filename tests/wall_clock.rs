//! Tasks that start at a wall-clock time (`Task::run_at_system_time`): on the pool's clock when
//! it is a manual one (on both stores); on the durable store with the system clock, the row's
//! due time is the time itself, compared with the database's clock.

mod support_store;

use std::time::{Duration, SystemTime};

use support_store::{TestBuilder, finish};
use tasq::{HandlerError, ManualClock, SubmitErrorKind, TaskState, TaskType};

const JOB: TaskType<u32, u32> = TaskType::new("job");

const MINUTE: Duration = Duration::from_secs(60);

conformance! {
    fn a_wall_clock_time_is_a_due_time_on_the_pools_clock(builder) {
        let clock = ManualClock::new();
        let pool = builder
            .workers(1)
            .manual_clock(clock.clone())
            .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .build();
        let start = clock.now();
        let in_a_minute = pool
            .submit(JOB.task(1).run_at_system_time(SystemTime::now() + MINUTE))
            .unwrap();
        assert_eq!(in_a_minute.status(), TaskState::Scheduled);
        let run_at = pool.info(in_a_minute.id()).unwrap().run_at.expect("a due time");
        // As far ahead of the pool's now as of the wall clock's, less the time the submit took.
        assert!(run_at <= start + MINUTE, "{:?}", run_at - start);
        assert!(run_at > start + MINUTE - Duration::from_secs(5), "{:?}", run_at - start);

        // A time past, long past or before the epoch: now, on the manual clock that has not moved.
        let past = pool
            .submit(JOB.task(2).run_at_system_time(SystemTime::now() - Duration::from_secs(3600)))
            .unwrap();
        assert_eq!(finish(&past).succeeded(), Some(2));
        let batch = pool
            .submit_batch(vec![
                JOB.task(3).run_at_system_time(SystemTime::UNIX_EPOCH),
                JOB.task(4).run_at_system_time(SystemTime::now() + MINUTE),
            ])
            .unwrap();
        assert_eq!(finish(&batch[0]).succeeded(), Some(3));
        assert_eq!(batch[1].status(), TaskState::Scheduled);

        // More than 584 years ahead: refused, and the task handed back.
        let far = SystemTime::now() + Duration::from_secs(600 * 366 * 24 * 3600);
        let refused = pool.submit(JOB.task(5).run_at_system_time(far)).unwrap_err();
        assert_eq!(refused.kind(), &SubmitErrorKind::TimeOverflow);
        assert_eq!(refused.into_task().into_payload(), 5);

        clock.advance(MINUTE - Duration::from_secs(5));
        pool.wait_idle();
        assert_eq!(in_a_minute.status(), TaskState::Scheduled, "early");
        clock.advance(Duration::from_secs(5));
        assert_eq!(finish(&in_a_minute).succeeded(), Some(1));
        assert_eq!(finish(&batch[1]).succeeded(), Some(4));
        assert_eq!(pool.stats().totals.submitted, 4);
    }
}

/// On the durable store with the system clock, the row's due time is the wall-clock time
/// itself (to the microsecond), not the database's now plus this process's idea of the delay;
/// a time the database's clock passed is the database's now. Through `submit` and the batch's
/// one statement alike.
#[cfg(feature = "postgres")]
#[test]
fn on_the_durable_store_the_due_time_is_the_wall_clock_time_itself() {
    let Some(builder) = TestBuilder::new(support_store::Store::Postgres) else {
        return;
    };
    let pool = builder
        .workers(0)
        .register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build();
    let at = SystemTime::now() + Duration::from_secs(3600) + Duration::from_nanos(123_456_789);
    let at_us = i64::try_from(
        at.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap();
    let single = pool.submit(JOB.task(1).run_at_system_time(at)).unwrap();
    let batch = pool
        .submit_batch(vec![
            JOB.task(2).run_at_system_time(at),
            JOB.task(3)
                .run_at_system_time(SystemTime::UNIX_EPOCH + MINUTE),
        ])
        .unwrap();
    let mut sql = pool.sql().unwrap();
    let mut due = |id: tasq::TaskId| -> (i64, bool) {
        let row = sql
            .query_one(
                "SELECT (EXTRACT(EPOCH FROM run_at) * 1000000)::BIGINT, run_at = created_at
                 FROM tasq_tasks WHERE id = $1",
                &[&(id.seq() as i64)],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(due(single.id()).0, at_us);
    assert_eq!(due(batch[0].id()).0, at_us);
    assert!(
        due(batch[1].id()).1,
        "a time long past is the database's now"
    );
    assert_eq!(single.status(), TaskState::Scheduled);
    assert_eq!(batch[1].status(), TaskState::Ready);
}
