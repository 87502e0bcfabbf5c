//! Dead letters: permanent errors and panics fail after one attempt, are listed, can be
//! resubmitted once; panics never cost the pool a worker. On both stores.

mod support_store;

use std::collections::HashMap;
use std::panic;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use support_store::{
    EXPECTED, GATE, Gate, Store, TestBuilder, TestPool, finish, settle_retention,
    silence_expected_panics,
};
use tasq::{FailureReason, HandlerError, Outcome, ResubmitError, RetryPolicy, TaskState, TaskType};

/// What a `JOB` task does when it runs.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
enum Behaviour {
    Succeed,
    FailPermanently,
    Panic,
    /// Fails permanently until the shared switch is on, then succeeds.
    FailUntilFixed,
}

const JOB: TaskType<(u32, Behaviour), u32> = TaskType::new("job");

/// A pool that would retry up to 5 times, with `JOB` registered; `fixed` is the switch of
/// [`Behaviour::FailUntilFixed`].
fn pool(builder: TestBuilder, workers: usize, fixed: Arc<AtomicBool>) -> TestPool {
    silence_expected_panics();
    builder
        .workers(workers)
        .max_attempts(5)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_micros(10),
            Duration::from_micros(10),
        ))
        .register(
            JOB,
            move |_, &(n, behaviour): &(u32, Behaviour)| match behaviour {
                Behaviour::Succeed => Ok(n),
                Behaviour::FailPermanently => {
                    Err(HandlerError::permanent(format!("bad input {n}")))
                }
                Behaviour::Panic => panic!("{EXPECTED} boom {n}"),
                Behaviour::FailUntilFixed if fixed.load(Ordering::SeqCst) => Ok(n),
                Behaviour::FailUntilFixed => Err(HandlerError::permanent("not fixed yet")),
            },
        )
        .build()
}

/// Another builder on the same store as `builder`, for a second pool.
fn another(builder: &TestBuilder) -> TestBuilder {
    TestBuilder::new(builder.store()).expect("the store ran the first pool")
}

// ===== payloads whose drops are counted =====

fn drop_counts() -> &'static Mutex<HashMap<u64, Arc<AtomicUsize>>> {
    static COUNTS: OnceLock<Mutex<HashMap<u64, Arc<AtomicUsize>>>> = OnceLock::new();
    COUNTS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A payload that counts its drops in the [`DropCounter`] whose number it carries.
#[derive(serde::Serialize, serde::Deserialize)]
struct Counted(u64);

impl Drop for Counted {
    fn drop(&mut self) {
        let count = drop_counts().lock().unwrap().get(&self.0).cloned();
        if let Some(count) = count {
            count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The test's end of a drop count: the [`Counted`] payloads it makes add to it when dropped.
struct DropCounter {
    number: u64,
    count: Arc<AtomicUsize>,
}

impl DropCounter {
    fn new() -> DropCounter {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let count = Arc::new(AtomicUsize::new(0));
        drop_counts()
            .lock()
            .unwrap()
            .insert(number, Arc::clone(&count));
        DropCounter { number, count }
    }

    fn payload(&self) -> Counted {
        Counted(self.number)
    }

    fn dropped(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

impl Drop for DropCounter {
    fn drop(&mut self) {
        drop_counts().lock().unwrap().remove(&self.number);
    }
}

/// How many payloads `pool` still keeps. The embedded store keeps the values (the drops of
/// `dropped`'s payloads tell how many went: `submitted` in all); the durable store keeps them in
/// its rows, and drops a decoded copy after every run, so only the rows tell.
fn payloads_kept(pool: &TestPool, dropped: &DropCounter, submitted: usize) -> usize {
    match pool.store() {
        Store::Memory => submitted - dropped.dropped(),
        Store::Postgres => stored_payloads(pool),
    }
}

#[cfg(feature = "postgres")]
fn stored_payloads(pool: &TestPool) -> usize {
    let mut sql = pool.sql().expect("a durable pool has rows");
    let row = sql
        .query_one(
            "SELECT count(*) FROM tasq_tasks WHERE payload IS NOT NULL",
            &[],
        )
        .unwrap();
    usize::try_from(row.get::<_, i64>(0)).unwrap()
}

#[cfg(not(feature = "postgres"))]
fn stored_payloads(_: &TestPool) -> usize {
    unreachable!("no durable pool without the postgres feature")
}

/// Fails every task permanently; counts the payloads dropped.
const DOOMED: TaskType<Counted, ()> = TaskType::new("doomed");

fn doomed_pool(builder: TestBuilder, limit: usize) -> TestPool {
    builder
        .workers(1)
        .retention(0, None)
        .dead_letter_limit(limit)
        .register(DOOMED, |_, _: &Counted| {
            Err::<(), _>(HandlerError::permanent("doomed"))
        })
        .build()
}

conformance! {
    fn permanent_errors_and_panics_fail_after_one_attempt_and_are_listed(builder) {
        let pool = pool(builder, 2, Arc::default());
        let ok = pool.submit(JOB.task((1, Behaviour::Succeed))).unwrap();
        let permanent = pool
            .submit(JOB.task((2, Behaviour::FailPermanently)).priority(3))
            .unwrap();
        let panicked = pool.submit(JOB.task((3, Behaviour::Panic))).unwrap();

        assert_eq!(finish(&ok), Outcome::Succeeded(1));
        let Outcome::Failed(failure) = finish(&permanent) else {
            panic!("expected a failure");
        };
        assert_eq!(
            (failure.reason, failure.attempts, failure.error.as_str()),
            (FailureReason::Permanent, 1, "bad input 2")
        );
        let Outcome::Failed(failure) = finish(&panicked) else {
            panic!("expected a failure");
        };
        assert_eq!(
            (failure.reason, failure.attempts),
            (FailureReason::Panicked, 1)
        );
        assert_eq!(
            failure.error,
            format!("{EXPECTED} boom 3"),
            "the panic message is kept"
        );
        assert_eq!(pool.stats().totals.retried, 0);

        let dead = pool.dead_letters();
        let ids: Vec<_> = dead.iter().map(|d| d.id).collect();
        assert_eq!(ids, vec![permanent.id(), panicked.id()], "oldest id first");
        assert_eq!(dead[0].task_type, "job");
        assert_eq!(dead[0].priority, 3);
        assert_eq!(dead[0].failure.reason, FailureReason::Permanent);
        assert_eq!(dead[0].failure.error, "bad input 2");
        assert_eq!(dead[1].failure.reason, FailureReason::Panicked);
        assert_eq!(dead[1].failure.attempts, 1);
        assert_eq!(pool.stats().dead_letters, 2);
        assert_eq!(pool.stats().totals.failed, 2);
    }

    fn a_resubmitted_dead_letter_runs_again_once(builder) {
        let fixed = Arc::new(AtomicBool::new(false));
        let pool = pool(builder, 1, Arc::clone(&fixed));
        let first = pool
            .submit(JOB.task((7, Behaviour::FailUntilFixed)).priority(9))
            .unwrap();
        assert!(finish(&first).is_failed());
        assert_eq!(pool.dead_letters().len(), 1);

        fixed.store(true, Ordering::SeqCst);
        let handle = pool
            .resubmit(JOB, first.id())
            .expect("resubmit the dead letter");
        let again = handle.id();
        assert_ne!(again, first.id(), "a resubmit is a new task");
        assert_eq!(finish(&handle), Outcome::Succeeded(7));
        let info = pool.info(again).unwrap();
        assert_eq!(
            (info.attempts, info.priority),
            (1, 9),
            "fresh attempts, same priority"
        );

        assert!(pool.dead_letters().is_empty(), "it left the list");
        assert_eq!(pool.stats().dead_letters, 0);
        // The old task stays failed, and points at its successor.
        let old = pool.info(first.id()).unwrap();
        assert_eq!(old.state, TaskState::Failed);
        assert_eq!(old.resubmitted_as, Some(again));
        assert_eq!(first.status(), TaskState::Failed);

        assert_eq!(
            pool.resubmit(JOB, first.id()).err(),
            Some(ResubmitError::AlreadyResubmitted(first.id(), again))
        );
        assert_eq!(
            pool.resubmit(JOB, again).err(),
            Some(ResubmitError::NotDeadLetter(again, TaskState::Succeeded))
        );
        let ok = pool.submit(JOB.task((8, Behaviour::Succeed))).unwrap();
        finish(&ok);
        assert_eq!(
            pool.resubmit(JOB, ok.id()).err(),
            Some(ResubmitError::NotDeadLetter(ok.id(), TaskState::Succeeded))
        );
        assert_eq!(pool.stats().totals.submitted, 3);
    }

    fn a_resubmitted_dead_letter_that_fails_again_is_a_new_dead_letter(builder) {
        let pool = pool(builder, 1, Arc::default());
        let first = pool.submit(JOB.task((4, Behaviour::Panic))).unwrap();
        assert!(finish(&first).is_failed());
        let handle = pool.resubmit(JOB, first.id()).unwrap();
        let again = handle.id();
        assert!(finish(&handle).is_failed());
        let ids: Vec<_> = pool.dead_letters().iter().map(|d| d.id).collect();
        assert_eq!(ids, vec![again]);
    }

    fn a_thousand_panics_leave_every_worker_alive(builder) {
        silence_expected_panics();
        const WORKERS: usize = 4;
        let pool = builder
            .workers(WORKERS)
            .with_gates()
            .register(
                JOB,
                |_, &(n, _): &(u32, Behaviour)| -> Result<u32, HandlerError> {
                    panic!("{EXPECTED} panic {n}")
                },
            )
            .build();
        assert_eq!(pool.stats().workers, WORKERS);

        let handles: Vec<_> = (0..1000)
            .map(|n| pool.submit(JOB.task((n, Behaviour::Panic))).unwrap())
            .collect();
        for handle in &handles {
            match finish(handle) {
                Outcome::Failed(failure) => {
                    assert_eq!(failure.reason, FailureReason::Panicked);
                    assert_eq!(failure.attempts, 1);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let stats = pool.stats();
        assert_eq!(stats.workers, WORKERS);
        assert_eq!(stats.dead_letters, 1000);
        assert_eq!(stats.totals.failed, 1000);

        // Every worker still runs tasks: four gates that each hold their worker can only all
        // start together if four workers are alive.
        let gates: Vec<_> = (0..WORKERS).map(|_| Gate::new()).collect();
        let held: Vec<_> = gates
            .iter()
            .map(|gate| pool.submit(GATE.task(gate.number())).unwrap())
            .collect();
        for gate in &gates {
            gate.wait_started();
        }
        assert_eq!(pool.stats().running, WORKERS);
        for gate in gates {
            gate.open();
        }
        for handle in &held {
            assert_eq!(finish(handle), Outcome::Succeeded(()));
        }
        assert_eq!(pool.stats().workers, WORKERS);
    }

    fn a_dead_letter_s_payload_can_be_taken_once(builder) {
        const ROW: TaskType<String, ()> = TaskType::new("row");
        const OTHER: TaskType<String, ()> = TaskType::new("other");
        let pool = builder
            .workers(1)
            .register(ROW, |_, row: &String| {
                if row.is_empty() {
                    Ok(())
                } else {
                    Err(HandlerError::permanent("bad row"))
                }
            })
            .register(OTHER, |_, _: &String| Ok::<_, HandlerError>(()))
            .build();
        let bad = pool.submit(ROW.task("x;y".to_owned())).unwrap();
        let good = pool.submit(ROW.task(String::new())).unwrap();
        assert!(finish(&bad).is_failed());
        assert!(finish(&good).is_succeeded());

        // Only a dead letter, and only with its own type.
        assert_eq!(pool.take_dead_letter(ROW, good.id()), None);
        assert_eq!(pool.take_dead_letter(OTHER, bad.id()), None);
        assert_eq!(pool.dead_letters().len(), 1);

        assert_eq!(pool.take_dead_letter(ROW, bad.id()).as_deref(), Some("x;y"));
        assert!(pool.dead_letters().is_empty());
        assert_eq!(pool.status(bad.id()), Some(tasq::TaskState::Failed));
        assert_eq!(pool.take_dead_letter(ROW, bad.id()), None);
        assert_eq!(
            pool.resubmit(ROW, bad.id()).err(),
            Some(tasq::ResubmitError::Taken(bad.id()))
        );
    }

    fn a_dead_letter_s_payload_can_be_read_and_stays(builder) {
        let fixed = Arc::new(AtomicBool::new(false));
        let pool = pool(builder, 1, Arc::clone(&fixed));
        let bad = pool.submit(JOB.task((7, Behaviour::FailUntilFixed))).unwrap();
        let good = pool.submit(JOB.task((8, Behaviour::Succeed))).unwrap();
        assert!(finish(&bad).is_failed());
        assert!(finish(&good).is_succeeded());
        const OTHER: TaskType<(u32, Behaviour), u32> = TaskType::new("other");

        // Only a dead letter, and only with its own type.
        assert!(pool.dead_letter_payload(JOB, good.id()).is_none());
        assert!(pool.dead_letter_payload(OTHER, bad.id()).is_none());
        let unknown = tasq::TaskId::from_parts(pool.id(), 1_000_000);
        assert!(pool.dead_letter_payload(JOB, unknown).is_none());

        // Read twice: it stays a dead letter, payload and all.
        for _ in 0..2 {
            let (n, behaviour) = pool.dead_letter_payload(JOB, bad.id()).expect("a copy");
            assert_eq!(n, 7);
            assert!(matches!(behaviour, Behaviour::FailUntilFixed));
            let listed: Vec<_> = pool.dead_letters().iter().map(|d| d.id).collect();
            assert_eq!(listed, [bad.id()]);
        }
        pool.check_invariants().unwrap();
        fixed.store(true, Ordering::SeqCst);
        let again = pool.resubmit(JOB, bad.id()).unwrap();
        assert_eq!(finish(&again), Outcome::Succeeded(7));
        assert!(pool.dead_letter_payload(JOB, bad.id()).is_none(), "resubmitted");

        // Taken: nothing left to read.
        let taken = pool.submit(JOB.task((9, Behaviour::FailPermanently))).unwrap();
        assert!(finish(&taken).is_failed());
        assert_eq!(pool.dead_letter_payload(JOB, taken.id()).map(|p| p.0), Some(9));
        assert_eq!(pool.take_dead_letter(JOB, taken.id()).map(|p| p.0), Some(9));
        assert!(pool.dead_letter_payload(JOB, taken.id()).is_none());
        pool.check_invariants().unwrap();
    }

    /// A dead letter brought back with the dependents its failure cancelled: the direct ones, the
    /// ones cancelled in cascade, and those submitted after the failure (cancelled at once,
    /// directly or through another); they run again in dependency order, with their payloads,
    /// and their old records point at the new ones.
    fn a_dead_letter_comes_back_with_the_dependents_its_failure_cancelled(builder) {
        silence_expected_panics();
        let fixed = Arc::new(AtomicBool::new(false));
        let switch = Arc::clone(&fixed);
        let pool = builder
            .workers(2)
            .with_gates()
            .register(
                JOB,
                move |_, &(n, behaviour): &(u32, Behaviour)| match behaviour {
                    Behaviour::FailUntilFixed if !switch.load(Ordering::SeqCst) => {
                        Err(HandlerError::permanent("not fixed yet"))
                    }
                    _ => Ok(n),
                },
            )
            .build();
        // The root waits for a held task, so its dependents are all submitted before it fails.
        let gate = Gate::new();
        let hold = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        let root = pool
            .submit(JOB.task((1, Behaviour::FailUntilFixed)).after([&hold]))
            .unwrap();
        let other = pool.submit(JOB.task((2, Behaviour::Succeed))).unwrap();
        let child = pool
            .submit(
                JOB.task((3, Behaviour::Succeed))
                    .after([&root])
                    .key("child"),
            )
            .unwrap();
        let grandchild = pool
            .submit(JOB.task((4, Behaviour::Succeed)).after([&child, &other]))
            .unwrap();
        gate.open();
        assert!(finish(&root).is_failed());
        assert!(finish(&grandchild).is_cancelled());
        // Submitted after the failure: cancelled at once, directly and through `late`.
        let late = pool
            .submit(JOB.task((5, Behaviour::Succeed)).after([&root]))
            .unwrap();
        let later = pool
            .submit(JOB.task((6, Behaviour::Succeed)).after([&late]))
            .unwrap();
        assert!(finish(&later).is_cancelled(), "a dependency already failed");
        // Unrelated: cancelled by a cancel, not by the failure.
        let unrelated = pool
            .submit(
                JOB.task((7, Behaviour::Succeed))
                    .delay(Duration::from_secs(3600)),
            )
            .unwrap();
        unrelated.cancel().unwrap();

        fixed.store(true, Ordering::SeqCst);
        let again = pool.resubmit_with_dependents(JOB, root.id()).unwrap();
        let old: Vec<_> = again.dependents.iter().map(|&(old, _)| old).collect();
        assert_eq!(
            old,
            vec![child.id(), grandchild.id(), late.id(), later.id()]
        );
        assert_eq!(finish(&again.task), Outcome::Succeeded(1));
        let outputs: Vec<_> = again
            .dependents
            .iter()
            .map(|&(_, new)| finish(&pool.handle(JOB, new).expect("known")))
            .collect();
        let expected: Vec<_> = [3, 4, 5, 6].into_iter().map(Outcome::Succeeded).collect();
        assert_eq!(outputs, expected);
        for &(old, new) in &again.dependents {
            assert_eq!(pool.info(old).unwrap().resubmitted_as, Some(new));
        }
        // The brought-back child holds its key again.
        let dup = pool
            .submit(JOB.task((9, Behaviour::Succeed)).key("child"))
            .unwrap();
        assert!(dup.is_duplicate());
        assert_eq!(dup.id(), again.dependents[0].1);
        // A second time finds nothing left to bring back.
        assert_eq!(
            pool.resubmit_with_dependents(JOB, root.id()).err(),
            Some(ResubmitError::AlreadyResubmitted(
                root.id(),
                again.task.id()
            ))
        );
        pool.check_invariants().unwrap();
    }

    /// A dead letter whose key a task of another type took meanwhile is refused as
    /// `KeyTaken`, naming that task (not as a type mismatch: the dead letter's type is right).
    fn a_dead_letter_whose_key_another_type_took_is_refused_as_key_taken(builder) {
        const OTHER: TaskType<u32, u32> = TaskType::new("other");
        let pool = builder
            .workers(1)
            .register(JOB, |_, &(n, _): &(u32, Behaviour)| {
                Err::<u32, _>(HandlerError::permanent(format!("bad input {n}")))
            })
            .register(OTHER, |_, &n: &u32| Ok::<_, HandlerError>(n))
            .build();
        let failed = pool
            .submit(JOB.task((1, Behaviour::FailPermanently)).key("k"))
            .unwrap();
        assert!(finish(&failed).is_failed());
        let holder = pool
            .submit(OTHER.task(2).key("k").delay(Duration::from_secs(3600)))
            .unwrap();
        assert!(!holder.is_duplicate(), "a failed task frees its key");
        assert_eq!(
            pool.resubmit(JOB, failed.id()).err(),
            Some(ResubmitError::KeyTaken(failed.id(), holder.id()))
        );
        assert_eq!(pool.dead_letters().len(), 1, "still a dead letter");
    }

    /// A dependent brought back by `resubmit_with_dependents` whose other dependency failed
    /// too comes back cancelled at once, and is counted so: the totals still balance.
    fn a_dependent_brought_back_cancelled_at_once_is_counted_cancelled(builder) {
        silence_expected_panics();
        let pool = pool(builder, 1, Arc::new(AtomicBool::new(false)));
        let first = pool.submit(JOB.task((1, Behaviour::FailPermanently))).unwrap();
        let second = pool.submit(JOB.task((2, Behaviour::FailPermanently))).unwrap();
        let both = pool
            .submit(JOB.task((3, Behaviour::Succeed)).after([&first, &second]))
            .unwrap();
        assert!(finish(&first).is_failed());
        assert!(finish(&second).is_failed());
        assert!(finish(&both).is_cancelled());
        // One worker: the first failed first, and its failure cancelled `both`.
        let again = pool.resubmit_with_dependents(JOB, first.id()).unwrap();
        assert_eq!(again.dependents.len(), 1);
        assert_eq!(again.dependents[0].0, both.id());
        let back = pool.handle(JOB, again.dependents[0].1).unwrap();
        assert!(finish(&back).is_cancelled(), "its other dependency failed");
        assert!(finish(&again.task).is_failed());
        let totals = pool.stats().totals;
        assert_eq!(totals.submitted, 5);
        assert_eq!(
            totals.submitted,
            totals.succeeded + totals.failed + totals.cancelled,
            "{totals:?}"
        );
        assert_eq!((totals.failed, totals.cancelled), (3, 2));
    }

    /// A dependent whose key another task took while it was cancelled comes back without it.
    fn a_dependent_whose_key_was_taken_comes_back_without_it(builder) {
        silence_expected_panics();
        let fixed = Arc::new(AtomicBool::new(false));
        let pool = pool(builder, 1, Arc::clone(&fixed));
        let root = pool.submit(JOB.task((1, Behaviour::FailUntilFixed))).unwrap();
        let child = pool
            .submit(JOB.task((2, Behaviour::Succeed)).after([&root]).key("c"))
            .unwrap();
        assert!(finish(&child).is_cancelled());
        let taker = pool.submit(JOB.task((3, Behaviour::Succeed)).key("c")).unwrap();
        assert!(!taker.is_duplicate());
        assert_eq!(finish(&taker), Outcome::Succeeded(3));
        fixed.store(true, Ordering::SeqCst);
        let again = pool.resubmit_with_dependents(JOB, root.id()).unwrap();
        assert_eq!(again.dependents.len(), 1, "the child comes back");
        let (old, new) = again.dependents[0];
        assert_eq!(old, child.id());
        assert_ne!(new, taker.id());
        assert_eq!(finish(&pool.handle(JOB, new).unwrap()), Outcome::Succeeded(2));
        // The key stays the taker's.
        let dup = pool.submit(JOB.task((4, Behaviour::Succeed)).key("c")).unwrap();
        assert_eq!(dup.id(), taker.id());
    }

    /// Dead letters outlive the retention of finished tasks (here none), up to their own limit:
    /// the oldest go first, with their payloads; a purge removes one for good, once.
    fn dead_letters_stay_past_retention_up_to_their_own_limit(builder) {
        let dropped = DropCounter::new();
        let pool = doomed_pool(builder, 3);
        let ids: Vec<_> = (0..5)
            .map(|_| {
                let handle = pool.submit(DOOMED.task(dropped.payload())).unwrap();
                assert!(finish(&handle).is_failed());
                handle.id()
            })
            .collect();
        let kept: Vec<_> = pool.dead_letters().iter().map(|d| d.id).collect();
        assert_eq!(kept, ids[2..].to_vec(), "the newest three stay");
        assert_eq!(
            payloads_kept(&pool, &dropped, 5),
            3,
            "the two oldest payloads went"
        );
        assert_eq!(pool.stats().dead_letters, 3);

        assert!(pool.purge_dead_letter(ids[3]));
        assert!(!pool.purge_dead_letter(ids[3]), "only once");
        assert!(!pool.purge_dead_letter(ids[0]), "already over the limit");
        assert_eq!(payloads_kept(&pool, &dropped, 5), 2);
        let kept: Vec<_> = pool.dead_letters().iter().map(|d| d.id).collect();
        assert_eq!(kept, vec![ids[2], ids[4]]);
        // Gone from the pool entirely (retention 0): unknown now.
        settle_retention(&pool);
        assert_eq!(pool.status(ids[3]), None);
        assert_eq!(
            pool.resubmit(DOOMED, ids[3]).err(),
            Some(ResubmitError::UnknownTask(ids[3]))
        );
        pool.check_invariants().unwrap();
    }

    /// Paging goes by id order, which orders pools first: from an id of an older pool, a page
    /// starts at the first dead letter; from an id of a newer pool, there is nothing after it.
    fn dead_letter_pages_follow_id_order_across_pools(builder) {
        let dropped = DropCounter::new();
        let second = another(&builder);
        let (first, second) = (doomed_pool(builder, 10), doomed_pool(second, 10));
        // The embedded store numbers its pools in the order they are built. A durable pool's
        // id is its queue's, drawn when its schema was made: "older" is then the lower id.
        if first.store() == Store::Memory {
            assert!(first.id() < second.id());
        }
        let (older, newer) = if first.id() < second.id() {
            (first, second)
        } else {
            (second, first)
        };
        assert!(older.id() < newer.id());
        let fail = |pool: &TestPool| {
            let handle = pool.submit(DOOMED.task(dropped.payload())).unwrap();
            assert!(finish(&handle).is_failed());
            handle.id()
        };
        let old_ids = [fail(&older), fail(&older)];
        let new_ids = [fail(&newer), fail(&newer), fail(&newer)];
        let page = |pool: &TestPool, after| -> Vec<_> {
            pool.dead_letters_after(after, 10)
                .iter()
                .map(|d| d.id)
                .collect()
        };
        assert_eq!(page(&newer, Some(old_ids[1])), new_ids.to_vec());
        assert_eq!(page(&older, Some(new_ids[0])), vec![]);
        assert_eq!(page(&newer, Some(new_ids[0])), new_ids[1..].to_vec());
        assert_eq!(page(&newer, None), new_ids.to_vec());
        let of_type: Vec<_> = newer
            .dead_letters_of(DOOMED, Some(new_ids[1]), 1)
            .iter()
            .map(|d| d.id)
            .collect();
        assert_eq!(of_type, vec![new_ids[2]]);
    }
}
