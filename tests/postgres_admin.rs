//! The operator's face of the durable store (`tasq::postgres::Admin`), against a real server:
//! its figures checked against the rows, keyset pages by every filter, one task in full, and
//! its actions seen by running pools (a retried dead letter runs, a pause stops claims, a
//! cancel reaches a running handler), with typed errors for every bad input.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use support_store::support_pg::{TestDb, eventually};
use support_store::{HANG_GUARD, finish};
use tasq::console::{DeadFilter, TaskQuery};
use tasq::postgres::{Admin, AdminError};
use tasq::{
    CancelError, CancelOutcome, HandlerError, PauseError, PauseTarget, Pool, QueueLimitError,
    ResubmitError, TaskId, TaskState, TaskType, TypeOptions,
};

const MAIL: TaskType<String, String> = TaskType::new("mail");
const REPORT: TaskType<u32, u32> = TaskType::new("report");

/// A pool that only submits mail (queue `mail`) and reports (queue `default`).
fn producer(db: &TestDb) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(MAIL, TypeOptions::new().queue("mail"))
        .declare(REPORT, TypeOptions::new())
        .build()
        .unwrap()
}

/// A pool whose mail handler fails for good when the address holds `bad` (a dead letter) and
/// whose report handler succeeds.
fn worker(db: &TestDb) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .workers(2)
        .register_with(MAIL, TypeOptions::new().queue("mail"), |_, to: &String| {
            if to.contains("bad") {
                Err(HandlerError::permanent(format!("no such mailbox: {to}")))
            } else {
                Ok(format!("sent to {to}"))
            }
        })
        .register(REPORT, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap()
}

#[test]
fn connecting_reports_each_problem_by_kind() {
    let Some(db) = TestDb::new() else { return };
    // Nothing listens on port 1.
    let error =
        Admin::connect("host=127.0.0.1 port=1 user=postgres connect_timeout=2").unwrap_err();
    assert!(matches!(error, AdminError::Connect(_)), "{error}");
    assert!(
        error.to_string().starts_with("could not connect"),
        "{error}"
    );
    let error = Admin::connect_in(&db.url, "No-Such").unwrap_err();
    assert!(matches!(error, AdminError::Setting(_)), "{error}");
    let error = Admin::connect("this is not a url = = =").unwrap_err();
    assert!(
        matches!(error, AdminError::Connect(ref m) if m.contains("does not parse")),
        "{error}"
    );
    // A schema with no tables: told to migrate.
    let error = Admin::connect_in(&db.url, "tasq_admin_nothing_here").unwrap_err();
    match &error {
        AdminError::NotMigrated { schema } => assert_eq!(schema, "tasq_admin_nothing_here"),
        other => panic!("{other:?}"),
    }
    // An older schema: told to migrate; this one: connected.
    let old = TestDb::at_version(tasq::postgres::SCHEMA_VERSION - 1).unwrap();
    match Admin::connect(&old.url).unwrap_err() {
        AdminError::Version {
            found,
            expected,
            advice,
        } => {
            assert_eq!(
                (found, expected),
                (expected - 1, tasq::postgres::SCHEMA_VERSION)
            );
            assert!(advice.contains("migrate"), "{advice}");
        }
        other => panic!("{other:?}"),
    }
    let admin = Admin::connect(&db.url).unwrap();
    let mut sql = db.client();
    let queue: i64 = sql
        .query_one("SELECT queue_id FROM tasq_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(admin.queue_id(), queue as u64);
    assert_eq!(admin.schema(), None);
    let named = Admin::connect_in(&db.url, db.schema()).unwrap();
    assert_eq!(named.schema(), Some(db.schema()));
    assert_eq!(named.queue_id(), admin.queue_id());
}

#[test]
fn the_overview_counts_what_the_rows_hold() {
    let Some(db) = TestDb::new() else { return };
    let admin = Admin::connect(&db.url).unwrap();
    let empty = admin.overview().unwrap();
    assert_eq!(empty.states.total(), 0);
    assert!(empty.queues.is_empty() && empty.types.is_empty() && !empty.estimated);
    assert_eq!(empty.minutes.len(), 15);

    // Two dead letters and three successes, run by a worker, then stopped.
    let pool = worker(&db);
    let mut handles = Vec::new();
    for to in ["bad1", "bad2", "ann", "bob", "cy"] {
        handles.push(pool.submit(MAIL.task(to.to_owned())).unwrap());
    }
    for handle in &handles {
        finish(handle);
    }
    pool.shutdown(HANG_GUARD);
    // Then, with no worker: 4 mail ready (2 at priority 5), 3 reports ready, 2 due in an
    // hour, 1 blocked behind one of them; a pause and a limit.
    let producer = producer(&db);
    for i in 0..4 {
        let task = MAIL.task(format!("m{i}"));
        producer
            .submit(if i < 2 { task.priority(5) } else { task })
            .unwrap();
    }
    for i in 0..3 {
        producer.submit(REPORT.task(i)).unwrap();
    }
    let later = producer
        .submit(REPORT.task(10).delay(Duration::from_secs(3600)))
        .unwrap();
    producer
        .submit(REPORT.task(11).delay(Duration::from_secs(3600)))
        .unwrap();
    producer
        .submit(REPORT.task(12).after([later.id()]))
        .unwrap();
    assert!(admin.pause(&PauseTarget::queue("mail")).unwrap());
    assert!(
        !admin.pause(&PauseTarget::queue("mail")).unwrap(),
        "paused twice"
    );
    assert_eq!(admin.set_queue_limit("slow", Some(3)).unwrap(), None);

    let o = admin.overview().unwrap();
    assert!(!o.estimated);
    let s = o.states;
    assert_eq!(
        (s.ready, s.scheduled, s.blocked, s.running),
        (7, 2, 1, 0),
        "{s:?}"
    );
    assert_eq!((s.succeeded, s.failed, s.dead, s.cancelled), (3, 2, 2, 0));
    assert_eq!(s.total(), 15);
    assert_eq!(o.ready_by_priority, [(5, 2), (0, 5)]);
    assert!(o.oldest_ready.is_some());
    let queues: Vec<_> = o
        .queues
        .iter()
        .map(|q| (q.name.as_str(), q.ready, q.running, q.paused, q.limit))
        .collect();
    assert_eq!(
        queues,
        [
            ("default", 3, 0, false, None),
            ("mail", 4, 0, true, None),
            ("slow", 0, 0, false, Some(3)),
        ]
    );
    let types: Vec<_> = o
        .types
        .iter()
        .map(|t| (t.name.as_str(), t.ready, t.dead))
        .collect();
    assert_eq!(types, [("mail", 4, 2), ("report", 3, 0)]);
    // This minute (or, across a minute's turn, the one before) saw the five endings.
    let ended: usize = o.minutes.iter().map(|m| m.succeeded + m.failed).sum();
    assert_eq!(ended, 5);
    assert_eq!(o.minutes.iter().map(|m| m.failed).sum::<usize>(), 2);
    assert!(o.minutes.windows(2).all(|w| w[0].at < w[1].at));
    assert!(o.minutes.iter().all(|m| m.complete));
    // Five endings over the window, which began 14 to 15 minutes ago.
    assert!(
        o.throughput > 5.0 / 900.0 && o.throughput <= 5.0 / 840.0,
        "{}",
        o.throughput
    );
    assert_eq!(o.paused.len(), 1);
    // The figures agree with the rows, counted another way.
    let mut sql = db.client();
    let ready: i64 = sql
        .query_one(
            "SELECT count(*) FROM tasq_tasks WHERE status = 'ready' AND run_at <= now()",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(ready as usize, o.states.ready);
    producer.shutdown(HANG_GUARD);
}

#[test]
fn pages_follow_the_keyset_by_every_filter() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db);
    let admin = Admin::connect(&db.url).unwrap();
    let mut mail = Vec::new();
    let mut reports = Vec::new();
    for i in 0..130_u32 {
        if i % 3 == 0 {
            mail.push(
                producer
                    .submit(MAIL.task(format!("to{i}")).key(format!("k{i}")))
                    .unwrap()
                    .id(),
            );
        } else {
            reports.push(producer.submit(REPORT.task(i)).unwrap().id());
        }
    }
    // Every task once, in id order, 50 a page.
    let mut seen = Vec::new();
    let mut query = TaskQuery::new().limit(50);
    let mut pages = 0;
    loop {
        let page = admin.tasks(&query).unwrap();
        pages += 1;
        seen.extend(page.tasks.iter().map(|t| t.id));
        match page.next {
            Some(next) => query = query.after(next),
            None => break,
        }
    }
    let mut all: Vec<TaskId> = mail.iter().chain(&reports).copied().collect();
    all.sort();
    assert_eq!(seen, all);
    assert_eq!(pages, 3);
    // By type, by queue, by state and type, by key.
    let page = admin
        .tasks(&TaskQuery::new().task_type("mail").limit(1000))
        .unwrap();
    assert_eq!(page.tasks.iter().map(|t| t.id).collect::<Vec<_>>(), mail);
    assert_eq!(page.next, None);
    assert!(
        page.tasks
            .iter()
            .all(|t| t.queue == "mail" && t.state == TaskState::Ready)
    );
    // A page sifted by queue is full when there are enough: the sift reads past the limit.
    let five = admin
        .tasks(&TaskQuery::new().queue("mail").limit(5))
        .unwrap();
    assert_eq!(
        five.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        mail[..5]
    );
    assert_eq!(five.next, Some(mail[4]));
    let by_queue = admin
        .tasks(&TaskQuery::new().queue("mail").limit(1000))
        .unwrap();
    assert_eq!(
        by_queue.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        mail
    );
    let none = admin
        .tasks(
            &TaskQuery::new()
                .state(TaskState::Succeeded)
                .task_type("mail"),
        )
        .unwrap();
    assert!(none.tasks.is_empty() && none.next.is_none());
    let keyed = admin.tasks(&TaskQuery::new().key("k9")).unwrap();
    assert_eq!(keyed.tasks.len(), 1);
    assert_eq!(keyed.tasks[0].key.as_deref(), Some("k9"));
    assert_eq!(keyed.tasks[0].id, mail[3]);
    // A key that reads as SQL is only a key.
    let odd = admin.tasks(&TaskQuery::new().key("k1' OR '1'='1")).unwrap();
    assert!(odd.tasks.is_empty());
    // A cancelled row keeps its key, and a key search finds it.
    admin.cancel_key("k9").unwrap();
    let keyed = admin.tasks(&TaskQuery::new().key("k9")).unwrap();
    assert_eq!(keyed.tasks[0].state, TaskState::Cancelled);
    // An id of another queue starts at this one's beginning (or end).
    let first = admin
        .tasks(&TaskQuery::new().after(TaskId::from_parts(0, 5)).limit(1))
        .unwrap();
    assert_eq!(first.tasks[0].id, all[0]);
    let past = admin
        .tasks(&TaskQuery::new().after(TaskId::from_parts(u64::MAX, 5)))
        .unwrap();
    assert!(past.tasks.is_empty() && past.next.is_none());
    producer.shutdown(HANG_GUARD);
}

#[test]
fn a_task_is_shown_whole_with_its_dependencies_and_timeline() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db);
    let admin = Admin::connect(&db.url).unwrap();
    let first = producer.submit(REPORT.task(1)).unwrap();
    let second = producer
        .submit(
            MAIL.task("<script>alert(1)</script>".to_owned())
                .after([first.id()]),
        )
        .unwrap();
    let task = admin.task(second.id()).unwrap().expect("the row");
    assert_eq!(task.row.state, TaskState::Blocked);
    assert_eq!(task.row.task_type, "mail");
    assert_eq!(
        task.payload.as_deref(),
        Some(r#""<script>alert(1)</script>""#)
    );
    assert_eq!(task.dependencies.len(), 1);
    assert_eq!(task.dependencies[0].id, first.id());
    assert_eq!(
        task.dependencies[0].task,
        Some(("report".to_owned(), TaskState::Ready))
    );
    assert!(task.dependents.is_empty());
    assert_eq!(task.timeline[0].what, "submitted");
    let dependency = admin.task(first.id()).unwrap().unwrap();
    assert_eq!(dependency.dependents[0].id, second.id());
    let whats = |id: TaskId| -> Vec<&'static str> {
        let task = admin.task(id).unwrap().unwrap();
        task.timeline.iter().map(|m| m.what).collect()
    };
    assert_eq!(
        whats(first.id()),
        ["submitted"],
        "due as submitted: no second moment"
    );
    // A delayed task is due later; cancelled, it ends so.
    let later = producer
        .submit(REPORT.task(3).delay(Duration::from_secs(3600)))
        .unwrap();
    assert_eq!(whats(later.id()), ["submitted", "due"]);
    admin.cancel(later.id()).unwrap();
    assert_eq!(whats(later.id()), ["submitted", "cancelled", "due"]);
    // Run both: the timeline ends with the outcome; the output is shown.
    producer.shutdown(HANG_GUARD);
    let pool = worker(&db);
    let ran = pool
        .handle(MAIL, second.id())
        .expect("a handle of the mail");
    assert!(finish(&ran).succeeded().is_some());
    let done = admin.task(second.id()).unwrap().unwrap();
    assert_eq!(done.timeline.last().unwrap().what, "succeeded");
    assert_eq!(
        done.output,
        Some(r#""sent to <script>alert(1)</script>""#.to_owned())
    );
    assert!(done.row.finished_at.is_some());
    // Ids this queue does not hold.
    assert!(admin.task(admin.task_id(1 << 40)).unwrap().is_none());
    assert!(
        admin
            .task(TaskId::from_parts(admin.queue_id() ^ 1, 1))
            .unwrap()
            .is_none()
    );
    pool.shutdown(HANG_GUARD);
}

#[test]
fn a_retried_dead_letter_runs_with_its_dependents() {
    let Some(db) = TestDb::new() else { return };
    let admin = Admin::connect(&db.url).unwrap();
    // The mailbox is bad until the operator fixes it.
    let fixed = Arc::new(AtomicU32::new(0));
    let seen = fixed.clone();
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .workers(2)
        .register(MAIL, move |_, to: &String| {
            if seen.load(Ordering::SeqCst) == 0 {
                Err(HandlerError::permanent(format!("no such mailbox: {to}")))
            } else {
                Ok(to.clone())
            }
        })
        .register(REPORT, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .build()
        .unwrap();
    let mail = pool.submit(MAIL.task("ann".to_owned())).unwrap();
    let report = pool.submit(REPORT.task(7).after([mail.id()])).unwrap();
    assert_eq!(finish(&mail).state(), TaskState::Failed);
    assert_eq!(finish(&report).state(), TaskState::Cancelled);
    // Not dead letters, unknown ids: refused by kind.
    assert!(matches!(
        admin.retry(report.id()),
        Err(ResubmitError::NotDeadLetter(_, TaskState::Cancelled))
    ));
    assert!(matches!(
        admin.retry(admin.task_id(1 << 40)),
        Err(ResubmitError::UnknownTask(_))
    ));
    fixed.store(1, Ordering::SeqCst);
    let retried = admin.retry(mail.id()).unwrap();
    assert_eq!(retried.dependents.len(), 1);
    assert_eq!(retried.dependents[0].0, report.id());
    assert!(matches!(
        admin.retry(mail.id()),
        Err(ResubmitError::AlreadyResubmitted(_, new)) if new == retried.id
    ));
    // A pool runs them: it was told, and its handles find the new rows.
    let new_report = retried.dependents[0].1;
    let handle = pool
        .handle(REPORT, new_report)
        .expect("a handle of the new report");
    assert_eq!(finish(&handle).succeeded(), Some(7));
    let shown = admin.task(mail.id()).unwrap().unwrap();
    assert_eq!(shown.resubmitted_as, Some(retried.id));
    assert!(!shown.row.dead);
    pool.shutdown(HANG_GUARD);
}

#[test]
fn bulk_actions_take_what_the_filter_keeps_and_a_dry_run_changes_nothing() {
    let Some(db) = TestDb::new() else { return };
    let admin = Admin::connect(&db.url).unwrap();
    let pool = worker(&db);
    let mut handles = Vec::new();
    for i in 0..12 {
        let to = if i % 3 == 0 {
            format!("bad-x{i}")
        } else {
            format!("bad-y{i}")
        };
        handles.push(pool.submit(MAIL.task(to)).unwrap());
    }
    for handle in &handles {
        assert_eq!(finish(handle).state(), TaskState::Failed);
    }
    pool.shutdown(HANG_GUARD);
    let x = DeadFilter::new().task_type("mail").error_contains("bad-x");
    let dry = admin.retry_dead(&x, true).unwrap();
    assert_eq!(dry.matched.len(), 4);
    assert!(dry.done.is_empty() && dry.refused.is_empty());
    assert_eq!(
        admin.overview().unwrap().states.dead,
        12,
        "a dry run changed rows"
    );
    let none = admin
        .retry_dead(&DeadFilter::new().task_type("report"), false)
        .unwrap();
    assert!(none.matched.is_empty());
    let done = admin.retry_dead(&x, false).unwrap();
    assert_eq!(done.matched, dry.matched);
    assert_eq!(done.done.len(), 4);
    assert!(done.done.iter().all(|(_, new)| new.is_some()));
    let elsewhere = admin
        .purge_dead(&DeadFilter::new().queue("default"), false)
        .unwrap();
    assert!(elsewhere.matched.is_empty(), "the mail is in queue mail");
    let purged = admin
        .purge_dead(&DeadFilter::new().queue("mail"), false)
        .unwrap();
    assert_eq!(purged.done.len(), 8);
    let o = admin.overview().unwrap();
    assert_eq!((o.states.dead, o.states.ready), (0, 4));
    // One purge: a dead letter no more, and then not again.
    assert!(!admin.purge(handles[0].id()).unwrap());
    assert!(!admin.purge(admin.task_id(1 << 40)).unwrap());
}

#[test]
fn a_cancel_reaches_a_running_handler_and_a_pause_stops_claims() {
    let Some(db) = TestDb::new() else { return };
    let admin = Admin::connect(&db.url).unwrap();
    let started = Arc::new(AtomicU32::new(0));
    let counter = started.clone();
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .workers(1)
        .register(REPORT, move |cx, n: &u32| {
            counter.fetch_add(1, Ordering::SeqCst);
            if *n == 0 {
                // Runs until cancelled.
                cx.token().wait();
                return Err(HandlerError::permanent("cancelled"));
            }
            Ok(*n)
        })
        .build()
        .unwrap();
    let long = pool.submit(REPORT.task(0)).unwrap();
    eventually(10, "the long task started", || {
        started.load(Ordering::SeqCst) == 1
    });
    assert_eq!(admin.cancel(long.id()).unwrap(), CancelOutcome::Signalled);
    assert_eq!(finish(&long).state(), TaskState::Cancelled);
    assert!(matches!(
        admin.cancel(admin.task_id(1 << 40)),
        Err(CancelError::UnknownTask(_))
    ));
    assert!(matches!(
        admin.cancel_key("nobody"),
        Err(CancelError::UnknownKey(_))
    ));
    // Paused: no claim of a report starts; resumed: it runs at once.
    assert!(admin.pause(&PauseTarget::task_type("report")).unwrap());
    let held = pool.submit(REPORT.task(5)).unwrap();
    assert!(held.wait_timeout(Duration::from_millis(300)).is_none());
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert_eq!(admin.paused().unwrap().len(), 1);
    assert!(admin.resume(&PauseTarget::task_type("report")).unwrap());
    assert!(!admin.resume(&PauseTarget::task_type("report")).unwrap());
    assert_eq!(finish(&held).succeeded(), Some(5));
    pool.shutdown(HANG_GUARD);
}

#[test]
fn bad_arguments_are_typed_errors() {
    let Some(db) = TestDb::new() else { return };
    let admin = Admin::connect(&db.url).unwrap();
    assert!(matches!(
        admin.pause(&PauseTarget::queue("Bad Name")),
        Err(PauseError::InvalidName { .. })
    ));
    assert!(matches!(
        admin.pause(&PauseTarget::task_type("")),
        Err(PauseError::InvalidName { .. })
    ));
    assert!(matches!(
        admin.set_queue_limit("mail", Some(0)),
        Err(QueueLimitError::Zero(_))
    ));
    assert!(matches!(
        admin.set_queue_limit("", Some(2)),
        Err(QueueLimitError::InvalidName { .. })
    ));
    assert_eq!(admin.set_queue_limit("mail", Some(2)).unwrap(), None);
    assert_eq!(admin.set_queue_limit("mail", None).unwrap(), Some(2));
    assert!(admin.queue_limits().unwrap().is_empty());
    assert!(admin.schedules().unwrap().is_empty());
}

#[test]
fn the_last_minutes_tell_outcomes_apart_and_stop_at_the_cap() {
    let Some(db) = TestDb::new() else { return };
    let admin = Admin::connect(&db.url).unwrap();
    let mut sql = db.client();
    // This minute: 3 succeeded, a failure kept (not a dead letter), a dead letter, 2 cancelled.
    sql.batch_execute(
        "INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, dead, finished_at)
         SELECT 'job', '1', 0, s, 3, d, now()
         FROM (VALUES ('succeeded', false), ('succeeded', false), ('succeeded', false),
                      ('failed', false), ('failed', true),
                      ('cancelled', false), ('cancelled', false)) v(s, d)",
    )
    .unwrap();
    let o = admin.overview().unwrap();
    // Summed over the minutes: the one they fell in may have turned since.
    let sum = |f: fn(&tasq::console::Minute) -> usize| o.minutes.iter().map(f).sum::<usize>();
    assert_eq!(
        (
            sum(|m| m.succeeded),
            sum(|m| m.failed),
            sum(|m| m.cancelled)
        ),
        (3, 2, 2)
    );
    assert!(o.minutes.iter().all(|m| m.complete) && !o.estimated);
    // Past the cap: 6,000 endings two minutes ago and 6,000 now; the newest 10,000 are read,
    // so the minutes after the oldest of those are whole, and the rest are floors.
    sql.batch_execute(
        "INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, finished_at)
         SELECT 'job', '1', 0, 'succeeded', 3,
                CASE WHEN g <= 6000 THEN now() - interval '2 minutes' ELSE now() END
         FROM generate_series(1, 12000) g",
    )
    .unwrap();
    let o = admin.overview().unwrap();
    assert!(o.estimated);
    // The minutes after the cut (two, or three if a minute turned since the insert) are whole
    // and hold the newest rows; those before are not.
    let whole: Vec<_> = o.minutes.iter().filter(|m| m.complete).collect();
    assert!((2..=3).contains(&whole.len()), "{:?}", o.minutes);
    assert!(
        o.minutes
            .ends_with(&whole.iter().map(|m| **m).collect::<Vec<_>>())
    );
    assert_eq!(whole.iter().map(|m| m.succeeded).sum::<usize>(), 6_003);
    // 10,000 read (and the dead letter) over about two minutes.
    assert!(
        o.throughput > 10_000.0 / 180.0 && o.throughput < 10_001.0 / 60.0,
        "{}",
        o.throughput
    );
}
