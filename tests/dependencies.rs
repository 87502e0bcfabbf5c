//! Dependencies: a task waits for all its parents, and a failed or cancelled parent cancels its
//! dependents, transitively. On both stores.

mod support_b;
mod support_store;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support_b::{finished, wait};
use support_store::{Gate, TestBuilder, TestPool, gate_handler};
use tasq::{
    CancelOutcome, CancelReason, FailureReason, HandlerError, ManualClock, Outcome, TaskHandle,
    TaskState, TaskType,
};

/// One step of a dependency graph.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
struct Step {
    name: String,
    /// The handler blocks on this gate (by number) first.
    gate: Option<u64>,
    /// The handler fails permanently (after recording the run).
    fail: bool,
}

impl Step {
    fn new(name: &str) -> Self {
        Step {
            name: name.to_owned(),
            ..Step::default()
        }
    }

    fn gated(name: &str, gate: &Gate) -> Self {
        Step {
            gate: Some(gate.number()),
            ..Step::new(name)
        }
    }
}

/// Returns its step's name.
const STEP: TaskType<Step, String> = TaskType::new("step");

/// The outcome of a step named `name` that succeeded.
fn succeeded(name: &str) -> Outcome<String> {
    Outcome::Succeeded(name.to_owned())
}

/// A pool whose STEP handler records the order in which steps run.
struct Fixture {
    pool: TestPool,
    order: Arc<Mutex<Vec<String>>>,
}

impl Fixture {
    fn new(builder: TestBuilder, workers: usize, clock: Option<ManualClock>) -> Self {
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut builder = builder.workers(workers).register(STEP, {
            let order = Arc::clone(&order);
            move |ctx, step: &Step| {
                if let Some(gate) = step.gate {
                    gate_handler(ctx, &gate)?;
                }
                order.lock().unwrap().push(step.name.clone());
                if step.fail {
                    Err(HandlerError::permanent(format!("{} failed", step.name)))
                } else {
                    Ok(step.name.clone())
                }
            }
        });
        if let Some(clock) = clock {
            builder = builder.manual_clock(clock);
        }
        Fixture {
            pool: builder.build(),
            order,
        }
    }

    fn submit(&self, step: Step, after: &[&TaskHandle<String>]) -> TaskHandle<String> {
        self.pool
            .submit(STEP.task(step).after(after.iter().map(|h| h.id())))
            .unwrap()
    }

    fn order(&self) -> Vec<String> {
        self.order.lock().unwrap().clone()
    }
}

conformance! {
    fn a_child_runs_only_after_all_its_parents_succeed(builder) {
        let f = Fixture::new(builder, 4, None);
        let (gate_a, gate_b) = (Gate::new(), Gate::new());
        let a = f.submit(Step::gated("a", &gate_a), &[]);
        let b = f.submit(Step::gated("b", &gate_b), &[]);
        // A repeated dependency counts once.
        let c = f.submit(Step::new("c"), &[&a, &b, &a]);
        assert_eq!(c.status(), TaskState::Blocked);
        assert_eq!(f.pool.stats().blocked, 1);

        gate_a.open();
        assert_eq!(wait(&a), succeeded("a"));
        assert_eq!(
            c.status(),
            TaskState::Blocked,
            "ran with a parent unfinished"
        );
        assert_eq!(f.pool.stats().blocked, 1);

        gate_b.open();
        assert_eq!(wait(&c), succeeded("c"));
        assert_eq!(f.order(), ["a", "b", "c"]);
        assert_eq!(f.pool.stats().blocked, 0);
    }

    fn a_diamond_runs_its_tip_last_and_each_step_once(builder) {
        let f = Fixture::new(builder, 4, None);
        let gate = Gate::new();
        let a = f.submit(Step::gated("a", &gate), &[]);
        let b = f.submit(Step::new("b"), &[&a]);
        let c = f.submit(Step::new("c"), &[&a]);
        let d = f.submit(Step::new("d"), &[&b, &c]);
        assert_eq!(f.pool.stats().blocked, 3);

        gate.open();
        assert_eq!(wait(&d), succeeded("d"));
        // A worker publishes an outcome just after it releases the lock, so d may have run before
        // b's or c's outcome reached their handles: wait rather than peek.
        assert_eq!(wait(&b), succeeded("b"));
        assert_eq!(wait(&c), succeeded("c"));
        let order = f.order();
        assert_eq!(order.len(), 4, "{order:?}");
        assert_eq!(order[0], "a");
        assert_eq!(order[3], "d");
        let mut middle = order[1..3].to_vec();
        middle.sort_unstable();
        assert_eq!(middle, ["b", "c"]);
    }

    fn a_dependency_that_already_succeeded_does_not_block(builder) {
        let f = Fixture::new(builder, 2, None);
        let done = f.submit(Step::new("done"), &[]);
        assert!(wait(&done).is_succeeded());

        let child = f.submit(Step::new("child"), &[&done]);
        assert_ne!(child.status(), TaskState::Blocked);
        assert_eq!(f.pool.stats().blocked, 0);
        assert_eq!(wait(&child), succeeded("child"));

        // Only the unfinished parent of two counts.
        let gate = Gate::new();
        let pending = f.submit(Step::gated("pending", &gate), &[]);
        let mixed = f.submit(Step::new("mixed"), &[&done, &pending]);
        assert_eq!(mixed.status(), TaskState::Blocked);
        gate.open();
        assert_eq!(wait(&mixed), succeeded("mixed"));
        assert_eq!(f.order(), ["done", "child", "pending", "mixed"]);
    }

    fn a_failure_cascades_through_a_chain_with_each_direct_parent_named(builder) {
        let f = Fixture::new(builder, 2, None);
        let gate = Gate::new();
        let head = f.submit(
            Step {
                fail: true,
                ..Step::gated("head", &gate)
            },
            &[],
        );
        let mut chain = vec![head];
        for name in ["t1", "t2", "t3", "t4", "t5"] {
            let parent = chain.last().unwrap();
            let next = f.submit(Step::new(name), &[parent]);
            chain.push(next);
        }
        assert_eq!(f.pool.stats().blocked, 5);

        gate.open();
        match wait(&chain[0]) {
            Outcome::Failed(failure) => {
                assert_eq!(failure.reason, FailureReason::Permanent);
                assert_eq!(failure.error, "head failed");
            }
            other => panic!("the head should fail: {other:?}"),
        }
        for (i, pair) in chain.windows(2).enumerate() {
            let (parent, child) = (&pair[0], &pair[1]);
            let expected = if i == 0 {
                CancelReason::DependencyFailed(parent.id())
            } else {
                CancelReason::DependencyCancelled(parent.id())
            };
            assert_eq!(wait(child), Outcome::Cancelled(expected), "link {}", i + 1);
        }
        assert_eq!(f.order(), ["head"], "a dependent of a failed task ran");
        let dead: Vec<_> = f.pool.dead_letters().iter().map(|d| d.id).collect();
        assert_eq!(dead, [chain[0].id()], "only the head is a dead letter");
        let report = f.pool.shutdown(Duration::from_secs(10));
        assert_eq!((report.failed, report.cancelled), (1, 5));
    }

    fn depending_on_a_failed_or_cancelled_task_cancels_at_once(builder) {
        let clock = ManualClock::new();
        let f = Fixture::new(builder, 1, Some(clock.clone()));
        let succeeded = f.submit(Step::new("ok"), &[]);
        let failed = f.submit(
            Step {
                fail: true,
                ..Step::new("failed")
            },
            &[],
        );
        let cancelled = f
            .pool
            .submit(
                STEP.task(Step::new("cancelled"))
                    .delay(Duration::from_secs(60)),
            )
            .unwrap();
        assert!(wait(&succeeded).is_succeeded());
        assert!(wait(&failed).is_failed());
        assert_eq!(cancelled.cancel(), Ok(CancelOutcome::Cancelled));

        let after_failed = f.submit(Step::new("after_failed"), &[&failed]);
        assert_eq!(
            finished(&after_failed),
            Outcome::Cancelled(CancelReason::DependencyFailed(failed.id()))
        );
        let after_cancelled = f.submit(Step::new("after_cancelled"), &[&cancelled]);
        assert_eq!(
            finished(&after_cancelled),
            Outcome::Cancelled(CancelReason::DependencyCancelled(cancelled.id()))
        );
        let after_both_kinds = f.submit(Step::new("after_ok_and_failed"), &[&succeeded, &failed]);
        assert_eq!(
            finished(&after_both_kinds),
            Outcome::Cancelled(CancelReason::DependencyFailed(failed.id()))
        );
        // A dependent of one of those, in turn.
        let second_hand = f.submit(Step::new("second_hand"), &[&after_failed]);
        assert_eq!(
            finished(&second_hand),
            Outcome::Cancelled(CancelReason::DependencyCancelled(after_failed.id()))
        );

        clock.advance(Duration::from_secs(120));
        let report = f.pool.shutdown(Duration::from_secs(10));
        assert_eq!(f.order(), ["ok", "failed"]);
        assert_eq!(f.pool.stats().blocked, 0);
        assert_eq!(
            (report.succeeded, report.failed, report.cancelled),
            (1, 1, 5)
        );
    }

    fn info_lists_the_dependencies_a_task_was_submitted_with(builder) {
        let clock = ManualClock::new();
        let f = Fixture::new(builder, 2, Some(clock.clone()));
        let gate = Gate::new();
        let a = f.submit(Step::gated("a", &gate), &[]);
        let b = f.submit(Step::new("b"), &[]);
        // Given out of order and twice: listed once each, by id.
        let c = f.submit(Step::new("c"), &[&b, &a, &b]);
        let dependencies = |handle: &TaskHandle<String>| {
            f.pool.info(handle.id()).expect("remembered").dependencies
        };
        assert_eq!(dependencies(&c), [a.id(), b.id()]);
        assert_eq!(dependencies(&a), []);
        // A plain delayed task (the embedded store keeps it dormant) has none either.
        let later = f
            .pool
            .submit(STEP.task(Step::new("later")).delay(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(dependencies(&later), []);

        gate.open();
        assert_eq!(wait(&c), succeeded("c"));
        assert_eq!(dependencies(&c), [a.id(), b.id()], "still listed once ended");

        // A dependent that a failure cancelled lists the failed task; brought back with it,
        // it lists the new task it waits for instead.
        let head = f.submit(
            Step {
                fail: true,
                ..Step::new("head")
            },
            &[],
        );
        let tail = f.submit(Step::new("tail"), &[&head, &b]);
        assert!(wait(&tail).is_cancelled());
        assert_eq!(dependencies(&tail), [b.id(), head.id()]);
        let again = f.pool.resubmit_with_dependents(STEP, head.id()).unwrap();
        let &[(old, new_tail)] = again.dependents.as_slice() else {
            panic!("one dependent comes back: {:?}", again.dependents);
        };
        assert_eq!(old, tail.id());
        assert_eq!(
            f.pool.info(new_tail).unwrap().dependencies,
            [b.id(), again.task.id()]
        );
        assert!(wait(&again.task).is_failed());
        clock.advance(Duration::from_secs(60));
        assert!(wait(&later).is_succeeded());
    }

    fn stats_count_the_blocked_tasks(builder) {
        let f = Fixture::new(builder, 2, None);
        let gate = Gate::new();
        let parent = f.submit(Step::gated("parent", &gate), &[]);
        let children: Vec<_> = ["c1", "c2", "c3"]
            .into_iter()
            .map(|name| f.submit(Step::new(name), &[&parent]))
            .collect();
        let grandchild = f.submit(Step::new("g"), &[&children[0]]);
        let stats = f.pool.stats();
        assert_eq!(stats.blocked, 4);
        assert_eq!(stats.ready + stats.running, 1);
        for child in &children {
            assert_eq!(child.status(), TaskState::Blocked);
        }

        gate.open();
        assert_eq!(wait(&grandchild), succeeded("g"));
        for child in &children {
            assert!(wait(child).is_succeeded());
        }
        assert_eq!(f.pool.stats().blocked, 0);
        assert_eq!(f.order().len(), 5);
    }

    fn a_delayed_dependent_waits_for_its_delay_after_its_parent(builder) {
        let clock = ManualClock::new();
        let f = Fixture::new(builder, 2, Some(clock.clone()));
        let parent = f
            .pool
            .submit(
                STEP.task(Step::new("parent"))
                    .delay(Duration::from_secs(10)),
            )
            .unwrap();
        let child = f
            .pool
            .submit(
                STEP.task(Step::new("child"))
                    .delay(Duration::from_secs(20))
                    .after([parent.id()]),
            )
            .unwrap();
        assert_eq!(child.status(), TaskState::Blocked);

        clock.advance(Duration::from_secs(10));
        assert_eq!(wait(&parent), succeeded("parent"));
        assert_eq!(child.status(), TaskState::Scheduled, "ran before its delay");
        assert_eq!(f.pool.stats().scheduled, 1);

        clock.advance(Duration::from_secs(10));
        assert_eq!(wait(&child), succeeded("child"));
        assert_eq!(f.order(), ["parent", "child"]);
    }

    fn a_delayed_dependent_whose_delay_passed_waits_for_its_parent(builder) {
        let clock = ManualClock::new();
        let f = Fixture::new(builder, 2, Some(clock.clone()));
        let gate = Gate::new();
        let parent = f.submit(Step::gated("parent", &gate), &[]);
        let child = f
            .pool
            .submit(
                STEP.task(Step::new("child"))
                    .delay(Duration::from_secs(5))
                    .after([parent.id()]),
            )
            .unwrap();

        clock.advance(Duration::from_secs(10));
        // The second worker is free: once it has run a control task, it would have run the child
        // too, had the child been runnable.
        let control = f.submit(Step::new("control"), &[]);
        assert!(wait(&control).is_succeeded());
        assert_eq!(child.status(), TaskState::Blocked, "ran before its parent");

        gate.open();
        assert_eq!(wait(&child), succeeded("child"));
        assert_eq!(f.order(), ["control", "parent", "child"]);
    }
}
