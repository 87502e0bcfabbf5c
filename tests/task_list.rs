//! `Pool::tasks`: the tasks of a state, a type or both, a page at a time in id order, on both
//! stores; and on the durable store, a page of a big table read through an index.

mod support_store;

use std::time::Duration;

use support_store::{GATE, Gate, TestPool, finish, settle_retention};
use tasq::{HandlerError, ManualClock, TaskFilter, TaskId, TaskInfo, TaskState, TaskType};

/// Succeeds, or fails permanently for payload 0.
const JOB: TaskType<u32, u32> = TaskType::new("job");
const OTHER: TaskType<u32, u32> = TaskType::new("other");

fn handler(_: &tasq::Context<'_>, n: &u32) -> Result<u32, HandlerError> {
    match n {
        0 => Err(HandlerError::permanent("zero")),
        n => Ok(*n),
    }
}

/// Every task `filter` keeps, read `page` at a time; checks each page is in id order and
/// starts after the last.
fn all_pages(pool: &TestPool, filter: &TaskFilter, page: usize) -> Vec<TaskInfo> {
    let mut all: Vec<TaskInfo> = Vec::new();
    let mut after = None;
    loop {
        let next = pool.tasks(filter, after, page);
        assert!(
            next.len() <= page,
            "a page of {} for a limit of {page}",
            next.len()
        );
        assert!(next.windows(2).all(|w| w[0].id < w[1].id), "in id order");
        if let (Some(last), Some(first)) = (all.last(), next.first()) {
            assert!(last.id < first.id, "a page starts after the last");
        }
        let Some(last) = next.last() else {
            return all;
        };
        after = Some(last.id);
        all.extend(next);
    }
}

fn ids(infos: &[TaskInfo]) -> Vec<TaskId> {
    infos.iter().map(|info| info.id).collect()
}

conformance! {
    fn tasks_lists_a_page_at_a_time_by_state_and_type(builder) {
        let clock = ManualClock::new();
        let pool = builder
            .workers(1)
            .manual_clock(clock.clone())
            // Nothing forgotten when the clock moves an hour.
            .retention(usize::MAX, None)
            .with_gates()
            .register(JOB, handler)
            .register(OTHER, handler)
            .build();
        let hour = Duration::from_secs(3600);
        let succeeded = pool.submit(JOB.task(1)).unwrap();
        let failed = pool.submit(JOB.task(0)).unwrap();
        assert!(finish(&succeeded).is_succeeded() && finish(&failed).is_failed());
        let gate = Gate::new();
        let running = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        let ready_job = pool.submit(JOB.task(2)).unwrap();
        let ready_other = pool.submit(OTHER.task(3)).unwrap();
        let scheduled_job = pool.submit(JOB.task(4).delay(hour)).unwrap();
        let scheduled_other = pool.submit(OTHER.task(5).delay(hour)).unwrap();
        let blocked = pool.submit(JOB.task(6).after([&scheduled_job])).unwrap();
        let cancelled = pool.submit(OTHER.task(7).delay(hour)).unwrap();
        cancelled.cancel().unwrap();

        let in_state = |state| TaskFilter::new().state(state);
        let listed = |filter: &TaskFilter| ids(&all_pages(&pool, filter, 2));
        let everything = all_pages(&pool, &TaskFilter::new(), 3);
        assert_eq!(
            ids(&everything),
            [
                succeeded.id(), failed.id(), running.id(), ready_job.id(), ready_other.id(),
                scheduled_job.id(), scheduled_other.id(), blocked.id(), cancelled.id(),
            ]
        );
        for info in &everything {
            assert_eq!(Some(info), pool.info(info.id).as_ref(), "as info tells it");
        }
        assert_eq!(listed(&in_state(TaskState::Running)), [running.id()]);
        assert_eq!(listed(&in_state(TaskState::Ready)), [ready_job.id(), ready_other.id()]);
        assert_eq!(
            listed(&in_state(TaskState::Scheduled)),
            [scheduled_job.id(), scheduled_other.id()]
        );
        assert_eq!(listed(&in_state(TaskState::Blocked)), [blocked.id()]);
        assert_eq!(listed(&in_state(TaskState::Succeeded)), [succeeded.id()]);
        assert_eq!(listed(&in_state(TaskState::Failed)), [failed.id()]);
        assert_eq!(listed(&in_state(TaskState::Cancelled)), [cancelled.id()]);
        assert_eq!(
            listed(&in_state(TaskState::Ready).task_type(OTHER.name())),
            [ready_other.id()]
        );
        assert_eq!(
            listed(&in_state(TaskState::Scheduled).task_type(JOB.name())),
            [scheduled_job.id()]
        );
        assert_eq!(listed(&in_state(TaskState::Cancelled).task_type(JOB.name())), []);
        assert_eq!(
            listed(&TaskFilter::new().task_type(JOB.name())),
            [succeeded.id(), failed.id(), ready_job.id(), scheduled_job.id(), blocked.id()]
        );
        assert_eq!(listed(&TaskFilter::new().task_type("nope")), []);
        let infos = all_pages(&pool, &in_state(TaskState::Scheduled), 1);
        assert!(infos.iter().all(|i| i.state == TaskState::Scheduled && i.run_at.is_some()));

        // Limits and starting points.
        assert!(pool.tasks(&TaskFilter::new(), None, 0).is_empty());
        assert_eq!(ids(&pool.tasks(&TaskFilter::new(), None, 1)), [succeeded.id()]);
        assert_eq!(pool.tasks(&TaskFilter::new(), Some(cancelled.id()), 10), []);
        assert_eq!(
            ids(&pool.tasks(&TaskFilter::new(), Some(blocked.id()), 10)),
            [cancelled.id()]
        );
        let before_this_pool = TaskId::from_parts(pool.id() - 1, u64::MAX);
        assert_eq!(pool.tasks(&TaskFilter::new(), Some(before_this_pool), 10).len(), 9);
        let after_this_pool = TaskId::from_parts(pool.id() + 1, 0);
        assert_eq!(pool.tasks(&TaskFilter::new(), Some(after_this_pool), 10), []);

        // States move on: the pages follow.
        clock.advance(hour);
        gate.open();
        assert!(finish(&running).is_succeeded());
        for handle in [&ready_job, &ready_other, &scheduled_job, &scheduled_other] {
            assert!(finish(handle).is_succeeded());
        }
        assert!(finish(&blocked).is_succeeded());
        assert_eq!(listed(&in_state(TaskState::Scheduled)), []);
        assert_eq!(listed(&in_state(TaskState::Succeeded)).len(), 7);
    }

    fn a_page_passes_over_what_retention_forgot(builder) {
        let clock = ManualClock::new();
        let pool = builder
            .workers(1)
            .manual_clock(clock.clone())
            .retention(0, None)
            .register(JOB, handler)
            .build();
        // Many tasks finished and forgotten, among a few that wait: the embedded store finds
        // these few by a pass over its records rather than a walk over every id.
        let mut waiting = Vec::new();
        for round in 0..4 {
            let handles: Vec<_> = (1..=50).map(|n| pool.submit(JOB.task(n)).unwrap()).collect();
            for handle in &handles {
                assert!(finish(handle).is_succeeded());
            }
            let later = pool.submit(JOB.task(round + 1).delay(Duration::from_secs(60))).unwrap();
            waiting.push(later.id());
        }
        settle_retention(&pool);
        assert_eq!(ids(&all_pages(&pool, &TaskFilter::new(), 3)), waiting);
        assert_eq!(
            ids(&all_pages(&pool, &TaskFilter::new().state(TaskState::Scheduled), 1)),
            waiting
        );
        assert_eq!(ids(&pool.tasks(&TaskFilter::new(), Some(waiting[1]), 1)), [waiting[2]]);
        assert_eq!(all_pages(&pool, &TaskFilter::new().state(TaskState::Succeeded), 5), []);
    }
}

/// On a durable table of 100,000 rows, the page of ready tasks (of every type or one), of failed
/// tasks of one type, and of one type in every state reads an index from where the page starts,
/// never the table, whether the prepared statement is planned for its parameters or
/// generically; the page of running tasks (a few rows) reads the index of running rows.
#[cfg(feature = "postgres")]
#[test]
fn a_durable_page_reads_an_index_not_the_table() {
    let Some(builder) = support_store::TestBuilder::new(support_store::Store::Postgres) else {
        return;
    };
    let pool = builder.workers(0).register(JOB, handler).build();
    let mut sql = pool.sql().unwrap();
    // One row in ten of type `job`; one in a hundred ready, one in a hundred failed, ten
    // running (leased for an hour: no reaper takes them back); the rest succeeded.
    sql.batch_execute(
        "INSERT INTO tasq_tasks (type, priority, status, max_attempts, finished_at, attempts,
                                 lease_id, lease_until)
         SELECT CASE WHEN g % 10 = 0 THEN 'job' ELSE 'other' END, 0, s.status, 3,
                CASE WHEN s.status IN ('ready', 'running') THEN NULL ELSE now() END,
                CASE WHEN s.status = 'running' THEN 1 ELSE 0 END,
                CASE WHEN s.status = 'running' THEN nextval('tasq_lease') END,
                CASE WHEN s.status = 'running' THEN now() + interval '1 hour' END
         FROM generate_series(1, 100000) AS g,
              LATERAL (SELECT CASE WHEN g % 100 = 1 THEN 'ready' WHEN g % 100 = 2 THEN 'failed'
                                   WHEN g % 10000 = 3 THEN 'running' ELSE 'succeeded' END
                              AS status) AS s;
         ANALYZE tasq_tasks",
    )
    .unwrap();
    let after = 50_000i64;
    let limit = 10i64;
    // The plan of the page's statement: for these parameters, or (`generic`) the generic plan
    // that a statement prepared and run many times may settle on, whatever its parameters.
    let plan = |sql: &mut ::postgres::Client, state: Option<TaskState>, by_type: bool, generic| {
        let page = tasq::postgres::testing::tasks_page(state, by_type);
        let lines = if generic {
            let (types, args) = if by_type {
                ("BIGINT, BIGINT, TEXT", format!("{after}, {limit}, 'job'"))
            } else {
                ("BIGINT, BIGINT", format!("{after}, {limit}"))
            };
            sql.batch_execute(&format!(
                "SET plan_cache_mode = force_generic_plan; PREPARE page ({types}) AS {page}"
            ))
            .unwrap();
            let lines = sql.query(&format!("EXPLAIN EXECUTE page({args})"), &[]);
            sql.batch_execute("DEALLOCATE page; RESET plan_cache_mode")
                .unwrap();
            lines
        } else if by_type {
            sql.query(&format!("EXPLAIN {page}"), &[&after, &limit, &JOB.name()])
        } else {
            sql.query(&format!("EXPLAIN {page}"), &[&after, &limit])
        };
        let lines: Vec<String> = lines.unwrap().iter().map(|r| r.get(0)).collect();
        lines.join("\n")
    };
    for generic in [false, true] {
        for (state, by_type, indexes) in [
            (Some(TaskState::Ready), false, &["tasq_states"][..]),
            (Some(TaskState::Ready), true, &["tasq_states"]),
            (Some(TaskState::Failed), true, &["tasq_types"]),
            (None, true, &["tasq_types"]),
            // The running rows, all of them (a few): any index of running rows.
            (
                Some(TaskState::Running),
                false,
                &["tasq_running", "tasq_leases", "tasq_running_queues"],
            ),
        ] {
            let plan = plan(&mut sql, state, by_type, generic);
            assert!(
                indexes
                    .iter()
                    .any(|index| plan.contains(&format!("using {index} on tasq_tasks"))),
                "generic {generic}, {state:?}, by type {by_type}: not through {indexes:?}:\n{plan}"
            );
            assert!(
                !plan.contains("Seq Scan on tasq_tasks"),
                "generic {generic}, {state:?}, by type {by_type}: reads the table:\n{plan}"
            );
        }
    }
    let ready = pool.tasks(
        &TaskFilter::new().state(TaskState::Ready),
        Some(TaskId::from_parts(pool.id(), after as u64)),
        3,
    );
    let seqs: Vec<u64> = ready.iter().map(|i| i.id.seq()).collect();
    assert_eq!(seqs, [50_001, 50_101, 50_201]);
    let failed_jobs = pool.tasks(
        &TaskFilter::new()
            .state(TaskState::Failed)
            .task_type(JOB.name()),
        None,
        usize::MAX,
    );
    assert!(failed_jobs.is_empty(), "g % 100 = 2 is never g % 10 = 0");
    let running = pool.tasks(&TaskFilter::new().state(TaskState::Running), None, 100);
    let seqs: Vec<u64> = running.iter().map(|i| i.id.seq()).collect();
    assert_eq!(seqs, (0..10).map(|n| n * 10_000 + 3).collect::<Vec<u64>>());
    let jobs = pool.tasks(&TaskFilter::new().task_type(JOB.name()), None, 2);
    let seqs: Vec<u64> = jobs.iter().map(|i| i.id.seq()).collect();
    assert_eq!(seqs, [10, 20]);
}
