//! A pool's view for an operator (`Pool::overview`, `task_page`, `task_detail`,
//! `retry_dead_letter`, `retry_dead`, `purge_dead`): what the dashboard of an embedded pool
//! shows and does, checked against what the test made, on both stores.

mod support_store;

use std::time::Duration;

use support_store::{TestPool, finish};
use tasq::console::{DeadFilter, TaskQuery, TaskRow};
use tasq::{
    CancelReason, HandlerError, PauseTarget, ResubmitError, TaskId, TaskState, TaskType,
    TypeOptions,
};

/// Succeeds with its payload, or fails for good for payload 0.
const JOB: TaskType<u32, u32> = TaskType::new("job");
/// The same, in queue `mail`.
const MAIL: TaskType<u32, u32> = TaskType::new("mail");

fn handler(_: &tasq::Context<'_>, n: &u32) -> Result<u32, HandlerError> {
    match n {
        0 => Err(HandlerError::permanent("zero <b>refused</b>")),
        n => Ok(*n),
    }
}

/// A pool of [`JOB`] in the default queue and [`MAIL`] in queue `mail`, a worker each, that
/// forgets no finished task.
fn two_queues(builder: support_store::TestBuilder) -> TestPool {
    builder
        .workers(1)
        .queue("mail", 1)
        .retention(usize::MAX, None)
        .register(JOB, handler)
        .register_with(MAIL, TypeOptions::new().queue("mail"), handler)
        .build()
}

/// [`two_queues`], which has run: three successes (job 1, job 2,
/// mail 3), two dead letters (job 0, mail 0); then, with queue `mail` paused and limited to 3
/// running, two ready mails
/// (5, and 6 keyed `k6`) and a job delayed an hour (7). Returns the ids by payload order
/// `[job 1, job 2, mail 3, job 0, mail 0, mail 5, mail 6, job 7]`.
fn made(builder: support_store::TestBuilder) -> (TestPool, Vec<TaskId>) {
    let pool = two_queues(builder);
    let mut ids = Vec::new();
    for task in [
        JOB.task(1),
        JOB.task(2),
        MAIL.task(3),
        JOB.task(0),
        MAIL.task(0),
    ] {
        let handle = pool.submit(task).unwrap();
        finish(&handle);
        ids.push(handle.id());
    }
    assert!(pool.pause(PauseTarget::queue("mail")).unwrap());
    assert_eq!(pool.set_queue_limit("mail", Some(3)).unwrap(), None);
    for task in [
        MAIL.task(5),
        MAIL.task(6).key("k6"),
        JOB.task(7).delay(Duration::from_secs(3_600)),
    ] {
        ids.push(pool.submit(task).unwrap().id());
    }
    (pool, ids)
}

fn row_ids(rows: &[TaskRow]) -> Vec<TaskId> {
    rows.iter().map(|r| r.id).collect()
}

conformance! {
    fn the_overview_counts_what_the_pool_holds(builder) {
        let (pool, _) = made(builder);
        let o = pool.overview().unwrap();
        let s = o.states;
        assert_eq!(
            (s.succeeded, s.failed, s.dead, s.cancelled),
            (3, 2, 2, 0),
            "{s:?}"
        );
        assert_eq!((s.ready, s.scheduled, s.running, s.blocked), (2, 1, 0, 0), "{s:?}");
        assert_eq!(s.total(), 8);
        assert!(!o.estimated);
        assert!(o.oldest_ready.is_some(), "two mails wait");
        assert_eq!(o.ready_by_priority, [(0, 2)]);

        let mail = o.queues.iter().find(|q| q.name == "mail").expect("queue mail");
        assert_eq!((mail.ready, mail.running, mail.paused), (2, 0, true));
        assert_eq!(mail.limit, Some(3));
        assert!(mail.oldest_ready.is_some_and(|age| age <= o.oldest_ready.unwrap()));
        assert!(o.queues.iter().filter(|q| q.name != "mail").all(|q| q.ready == 0 && !q.paused));
        let of_type = |name: &str| o.types.iter().find(|t| t.name == name).cloned();
        let mail = of_type("mail").expect("type mail");
        assert_eq!((mail.ready, mail.dead, mail.paused), (2, 1, false));
        assert!(mail.oldest_ready.is_some());
        assert!(of_type("job").is_none_or(|job| job.oldest_ready.is_none() && job.ready == 0));
        assert_eq!(of_type("job").expect("type job").dead, 1);
        assert!(o.paused.iter().any(|p| p.target == PauseTarget::queue("mail")));

        let sum = |f: fn(&tasq::console::Minute) -> usize| o.minutes.iter().map(f).sum::<usize>();
        assert_eq!((sum(|m| m.succeeded), sum(|m| m.failed), sum(|m| m.cancelled)), (3, 2, 0));
        assert!(o.minutes.windows(2).all(|w| w[0].at < w[1].at), "oldest first");
        assert!(o.minutes.iter().all(|m| m.at <= o.at && m.complete), "{:?} at {:?}", o.minutes, o.at);
        assert!(o.throughput > 0.0);
    }

    fn pages_of_tasks_filter_and_go_on(builder) {
        let (pool, ids) = made(builder);
        let succeeded = TaskQuery::new().state(TaskState::Succeeded).limit(2);
        let first = pool.task_page(&succeeded);
        assert_eq!(row_ids(&first.tasks), &ids[..2]);
        assert_eq!(first.next, Some(ids[1]));
        let second = pool.task_page(&succeeded.clone().after(ids[1]));
        assert_eq!(row_ids(&second.tasks), [ids[2]]);
        assert_eq!(second.next, None);

        // Sifted by queue over several reads: never more than the limit, going on after it.
        let two = pool.task_page(&TaskQuery::new().queue("mail").limit(2));
        assert_eq!(row_ids(&two.tasks), [ids[2], ids[4]]);
        assert_eq!(two.next, Some(ids[4]));
        let mail = pool.task_page(&TaskQuery::new().queue("mail"));
        assert_eq!(row_ids(&mail.tasks), [ids[2], ids[4], ids[5], ids[6]]);
        assert!(mail.tasks.iter().all(|t| t.queue == "mail" && t.task_type == "mail"));
        let jobs = pool.task_page(&TaskQuery::new().task_type("job").limit(3));
        assert_eq!(row_ids(&jobs.tasks), [ids[0], ids[1], ids[3]]);
        assert_eq!(jobs.next, Some(ids[3]));

        let keyed = pool.task_page(&TaskQuery::new().key("k6"));
        assert_eq!(row_ids(&keyed.tasks), [ids[6]]);
        assert_eq!(keyed.tasks[0].key.as_deref(), Some("k6"));
        assert_eq!(keyed.tasks[0].state, TaskState::Ready);
        assert!(pool.task_page(&TaskQuery::new().key("k6").after(ids[6])).tasks.is_empty());
        assert_eq!(row_ids(&pool.task_page(&TaskQuery::new().key("k6").after(ids[5])).tasks), [ids[6]]);
        let other_state = TaskQuery::new().key("k6").state(TaskState::Succeeded);
        assert!(pool.task_page(&other_state).tasks.is_empty(), "a key's task kept to the filter");
        assert!(pool.task_page(&TaskQuery::new().key("nobody")).tasks.is_empty());

        let dead = pool.task_page(&TaskQuery::new().dead());
        assert_eq!(row_ids(&dead.tasks), [ids[3], ids[4]]);
        assert!(dead.tasks.iter().all(|t| t.dead && t.state == TaskState::Failed));
        assert_eq!(dead.tasks[0].last_error.as_deref(), Some("zero <b>refused</b>"));
        let dead_mail = pool.task_page(&TaskQuery::new().dead().task_type("mail"));
        assert_eq!(row_ids(&dead_mail.tasks), [ids[4]]);
        let all = pool.task_page(&TaskQuery::new());
        assert_eq!(row_ids(&all.tasks), ids);
        let delayed = all.tasks.iter().find(|t| t.id == ids[7]).unwrap();
        assert_eq!(delayed.state, TaskState::Scheduled);
        let due = delayed.run_at.expect("a delayed task's due time");
        let ahead = due.duration_since(std::time::SystemTime::now()).unwrap();
        assert!(ahead > Duration::from_secs(3_000), "due in an hour, not {ahead:?}");
        assert!(all.tasks.iter().filter(|t| t.id != ids[3] && t.id != ids[4]).all(|t| !t.dead));
    }

    fn a_dead_letter_is_retried_with_its_dependents_and_bulk_actions_take_what_the_filter_keeps(builder) {
        let pool = two_queues(builder);
        let dead = pool.submit(JOB.task(0)).unwrap();
        let dependent = pool.submit(JOB.task(4).after([&dead])).unwrap();
        assert!(matches!(finish(&dependent), tasq::Outcome::Cancelled(CancelReason::DependencyFailed(id)) if id == dead.id()));
        let detail = pool.task_detail(dependent.id()).unwrap();
        assert_eq!(detail.row.state, TaskState::Cancelled);
        assert_eq!(detail.dependencies.len(), 1);
        assert_eq!(detail.dependencies[0].id, dead.id());
        assert_eq!(detail.dependencies[0].task, Some(("job".to_owned(), TaskState::Failed)));

        let retried = pool.retry_dead_letter(dead.id()).unwrap();
        assert_eq!(retried.dependents.len(), 1, "the cancelled dependent comes back");
        assert_eq!(retried.dependents[0].0, dependent.id());
        assert_eq!(pool.info(dead.id()).unwrap().resubmitted_as, Some(retried.id));
        assert_eq!(pool.task_detail(dead.id()).unwrap().resubmitted_as, Some(retried.id));
        // Payload 0 fails again: the retry ran, and its dependent was cancelled again.
        let again = pool.handle(JOB, retried.id).unwrap();
        assert!(finish(&again).is_failed());
        assert_eq!(
            pool.retry_dead_letter(dead.id()).unwrap_err(),
            ResubmitError::AlreadyResubmitted(dead.id(), retried.id)
        );
        let unknown = TaskId::from_parts(dead.id().pool(), 1 << 40);
        assert_eq!(pool.retry_dead_letter(unknown).unwrap_err(), ResubmitError::UnknownTask(unknown));
        let ok = pool.submit(JOB.task(1)).unwrap();
        finish(&ok);
        assert_eq!(pool.retry_dead_letter(ok.id()).unwrap_err(), ResubmitError::NotDeadLetter(ok.id(), TaskState::Succeeded));

        for n in [0, 0] {
            finish(&pool.submit(MAIL.task(n)).unwrap());
        }
        let letters = pool.task_page(&TaskQuery::new().dead());
        assert_eq!(letters.tasks.len(), 3, "the retried job and two mails");
        let plan = pool.retry_dead(&DeadFilter::new().queue("mail"), true);
        assert_eq!(plan.matched.len(), 2);
        assert!(plan.done.is_empty() && plan.refused.is_empty(), "a dry run does nothing");
        assert_eq!(pool.retry_dead(&DeadFilter::new().error_contains("nothing like it"), true).matched, []);
        assert_eq!(pool.retry_dead(&DeadFilter::new().task_type("job"), true).matched, [retried.id]);

        let purged = pool.purge_dead(&DeadFilter::new().queue("mail").error_contains("refused"), false);
        assert_eq!(purged.done.len(), 2);
        assert!(purged.done.iter().all(|(_, new)| new.is_none()));
        let done = pool.retry_dead(&DeadFilter::new(), false);
        assert_eq!(done.matched, [retried.id]);
        let (old, new) = done.done[0];
        assert_eq!(old, retried.id);
        assert!(finish(&pool.handle(JOB, new.unwrap()).unwrap()).is_failed());
        assert_eq!(row_ids(&pool.task_page(&TaskQuery::new().dead()).tasks), [new.unwrap()]);
    }

    fn a_page_sifted_by_queue_reads_at_most_scan_tasks_and_says_where_to_go_on(builder) {
        let pool = two_queues(builder);
        let hour = Duration::from_secs(3_600);
        let jobs: Vec<_> = (1..=tasq::console::SCAN as u32 + 100)
            .map(|n| JOB.task(n).delay(hour))
            .collect();
        let jobs = pool.submit_batch(jobs).unwrap();
        let mail = pool.submit(MAIL.task(1).delay(hour)).unwrap();
        let first = pool.task_page(&TaskQuery::new().queue("mail"));
        assert!(first.tasks.is_empty(), "no mail among the first {} tasks", tasq::console::SCAN);
        assert_eq!(first.next, Some(jobs[tasq::console::SCAN - 1].id()));
        let second = pool.task_page(&TaskQuery::new().queue("mail").after(first.next.unwrap()));
        assert_eq!(row_ids(&second.tasks), [mail.id()]);
        assert_eq!(second.next, None);
    }
}
