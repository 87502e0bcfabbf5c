//! Queues with workers of their own (`Builder::queue`), on both stores: a queue never runs more
//! tasks at once than its workers, a slow queue holding all of its workers leaves the other
//! queues' workers free, its tasks wait ready (and can be cancelled) meanwhile, lanes mix with
//! a type's own limit and with pauses, and bad settings are typed build errors.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use support_store::{GATE, Gate, Store, TestBuilder, assert_all_ran, finish, gate_handler};
use tasq::{
    BuildError, CancelOutcome, HandlerError, PauseTarget, QueueLimitError, TaskHandle, TaskState,
    TaskType, TypeOptions,
};

/// In the default queue: runs on the shared workers.
const QUICK: TaskType<u32, u32> = TaskType::new("quick");
/// In queue `mail`, limited to one at a time of its own.
const SEND: TaskType<u32, u32> = TaskType::new("send");

/// `GATE` in queue `reports` (two workers of its own), `QUICK` on one shared worker, `SEND` in
/// queue `mail` (two workers of its own, the type limited to one).
fn lanes(builder: TestBuilder) -> TestBuilder {
    builder
        .workers(1)
        .queue("reports", 2)
        .queue("mail", 2)
        .register_with(GATE, TypeOptions::new().queue("reports"), gate_handler)
        .register(QUICK, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .register_with(
            SEND,
            TypeOptions::new().queue("mail").concurrency_limit(1),
            |_, n: &u32| Ok::<_, HandlerError>(*n),
        )
}

conformance! {
    fn a_slow_queue_takes_only_its_own_workers(builder) {
        let pool = lanes(builder).build();
        assert_eq!(pool.stats().workers, 5);
        let gates: Vec<Gate> = (0..5).map(|_| Gate::new()).collect();
        let reports: Vec<TaskHandle<()>> = gates
            .iter()
            .map(|gate| pool.submit(GATE.task(gate.number())).unwrap())
            .collect();
        gates[0].wait_started();
        gates[1].wait_started();
        // Both of its workers are busy: the other queues' tasks still run, on theirs.
        let quick: Vec<_> = (0..20).map(|i| pool.submit(QUICK.task(i)).unwrap()).collect();
        let sends: Vec<_> = (0..10).map(|i| pool.submit(SEND.task(i)).unwrap()).collect();
        assert_all_ran(&quick);
        assert_all_ran(&sends);
        // And the queue ran no more than its two.
        let waiting = reports.iter().filter(|h| h.status() == TaskState::Ready).count();
        assert_eq!(waiting, 3, "two reports run, three wait");
        // A waiting one can be cancelled; the rest run once the two end.
        assert_eq!(reports[4].cancel(), Ok(CancelOutcome::Cancelled));
        for gate in gates {
            gate.open();
        }
        for handle in &reports[..4] {
            assert_eq!(finish(handle).succeeded(), Some(()), "{}", handle.id());
        }
        assert_eq!(pool.check_invariants(), Ok(()));
    }

    fn a_queue_with_one_worker_runs_its_tasks_one_at_a_time(builder) {
        let running = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let (r, m) = (Arc::clone(&running), Arc::clone(&most));
        let pool = builder
            .workers(3)
            .queue("mail", 1)
            .register_with(SEND, TypeOptions::new().queue("mail"), move |_, n: &u32| {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                // Long enough for another worker to start one beside it, were it allowed.
                for _ in 0..50 {
                    std::thread::yield_now();
                }
                r.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(*n)
            })
            .build();
        let sends: Vec<_> = (0..60).map(|i| pool.submit(SEND.task(i)).unwrap()).collect();
        assert_all_ran(&sends);
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(pool.check_invariants(), Ok(()));
    }

    fn a_paused_queue_holds_its_lane_and_frees_no_other(builder) {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&runs);
        let pool = builder
            .workers(1)
            .queue("mail", 1)
            .register_with(SEND, TypeOptions::new().queue("mail"), move |_, n: &u32| {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(*n)
            })
            .register(QUICK, |_, n: &u32| Ok::<_, HandlerError>(*n))
            .build();
        assert_eq!(pool.pause(PauseTarget::queue("mail")), Ok(true));
        let sends: Vec<_> = (0..10).map(|i| pool.submit(SEND.task(i)).unwrap()).collect();
        let quick: Vec<_> = (0..10).map(|i| pool.submit(QUICK.task(i)).unwrap()).collect();
        assert_all_ran(&quick);
        pool.wait_idle();
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert!(sends.iter().all(|h| h.status() == TaskState::Ready));
        assert_eq!(pool.resume(PauseTarget::queue("mail")), Ok(true));
        assert_all_ran(&sends);
        assert_eq!(pool.check_invariants(), Ok(()));
    }

    fn a_pool_may_serve_only_the_queues_it_names(builder) {
        let pool = builder
            .workers(0)
            .queue("mail", 2)
            .register_with(SEND, TypeOptions::new().queue("mail"), |_, n: &u32| {
                Ok::<_, HandlerError>(*n)
            })
            .build();
        assert_eq!(pool.stats().workers, 2);
        let sends: Vec<_> = (0..10).map(|i| pool.submit(SEND.task(i)).unwrap()).collect();
        assert_all_ran(&sends);
    }

    fn bad_queue_settings_are_typed_build_errors(builder) {
        let store = builder.store();
        drop(builder);
        let fresh = || TestBuilder::new(store).expect("the store ran a moment ago");
        let send = |b: TestBuilder| {
            b.register_with(SEND, TypeOptions::new().queue("mail"), |_, n: &u32| {
                Ok::<_, HandlerError>(*n)
            })
        };
        let cases: Vec<(TestBuilder, &str, &str)> = vec![
            (send(fresh().queue("mail", 0)), "a queue's workers", "are zero"),
            (send(fresh().queue("mail", 1).queue("mail", 2)), "a queue's workers", "are set twice"),
            (send(fresh().queue("no spaces", 1)), "a queue name", ""),
            (send(fresh().queue("", 1)), "a queue name", ""),
            (
                send(fresh().workers(0).queue("reports", 1)),
                "a type's queue",
                "has no worker in this pool",
            ),
            (
                send(fresh().workers(1).queue("mail", 40_000)),
                "the number of workers",
                "is above 32,767",
            ),
        ];
        for (builder, setting, problem) in cases {
            match builder.try_build().err() {
                Some(BuildError::InvalidSetting { setting: s, problem: p, .. }) => {
                    assert_eq!(s, setting);
                    assert!(p.starts_with(problem), "{p}");
                }
                other => panic!("{setting}: {other:?}"),
            }
        }
        // Zero shared workers and no queue of its own is still no worker at all.
        if store == Store::Memory {
            assert!(matches!(
                send(fresh().workers(0)).try_build().err(),
                Some(BuildError::ZeroWorkers)
            ));
        }
    }
}

/// Four shared workers and `GATE` in queue `reports` (no workers of its own).
fn limited(builder: TestBuilder) -> TestBuilder {
    builder
        .workers(4)
        .register_with(GATE, TypeOptions::new().queue("reports"), gate_handler)
        .register(QUICK, |_, n: &u32| Ok::<_, HandlerError>(*n))
}

fn submit_gates(pool: &tasq::Pool, gates: &[Gate]) -> Vec<TaskHandle<()>> {
    let submit = |gate: &Gate| pool.submit(GATE.task(gate.number())).unwrap();
    gates.iter().map(submit).collect()
}

/// Runs quick tasks to their end: a free worker had every chance to start what it could.
fn run_quick(pool: &tasq::Pool) {
    let quick: Vec<_> = (0..8)
        .map(|i| pool.submit(QUICK.task(i)).unwrap())
        .collect();
    assert_all_ran(&quick);
}

/// Queue limits (`Pool::set_queue_limit`).
mod limits {
    use super::*;

    conformance! {
        fn a_queue_limit_holds_what_it_cannot_start_until_raised(builder) {
            let pool = limited(builder).build();
            assert_eq!(pool.set_queue_limit("reports", Some(1)), Ok(None));
            let gates: Vec<Gate> = (0..3).map(|_| Gate::new()).collect();
            let reports = submit_gates(&pool, &gates);
            gates[0].wait_started();
            run_quick(&pool);
            assert!(!gates[1].started() && !gates[2].started());
            assert_eq!(reports[2].status(), TaskState::Ready);
            let limits = pool.queue_limits().unwrap();
            assert_eq!(limits.len(), 1);
            assert_eq!((limits[0].queue.as_str(), limits[0].max_running), ("reports", 1));
            // Raised: one more starts; lifted: the rest.
            assert_eq!(pool.set_queue_limit("reports", Some(2)), Ok(Some(1)));
            gates[1].wait_started();
            run_quick(&pool);
            assert!(!gates[2].started());
            assert_eq!(pool.set_queue_limit("reports", None), Ok(Some(2)));
            gates[2].wait_started();
            assert_eq!(pool.queue_limits(), Ok(Vec::new()));
            for gate in gates {
                gate.open();
            }
            for handle in &reports {
                assert_eq!(finish(handle).succeeded(), Some(()));
            }
            assert_eq!(pool.check_invariants(), Ok(()));
        }

        fn a_lowered_limit_lets_running_tasks_finish_and_starts_none_until_below(builder) {
            let pool = limited(builder).build();
            let gates: Vec<Gate> = (0..5).map(|_| Gate::new()).collect();
            let first = submit_gates(&pool, &gates[..3]);
            for gate in &gates[..3] {
                gate.wait_started();
            }
            // Three run; the limit is one from now on.
            assert_eq!(pool.set_queue_limit("reports", Some(1)), Ok(None));
            let later = submit_gates(&pool, &gates[3..]);
            run_quick(&pool);
            assert!(!gates[3].started() && !gates[4].started());
            let mut gates = gates.into_iter();
            for _ in 0..2 {
                gates.next().unwrap().open();
            }
            assert_eq!(finish(&first[1]).succeeded(), Some(()));
            run_quick(&pool);
            // One still runs: at the limit.
            let (third, fourth, fifth) = (gates.next().unwrap(), gates.next().unwrap(), gates.next().unwrap());
            assert!(!fourth.started() && !fifth.started());
            third.open();
            fourth.wait_started();
            run_quick(&pool);
            assert!(!fifth.started());
            assert_eq!(later[1].status(), TaskState::Ready);
            fourth.open();
            fifth.wait_started();
            fifth.open();
            for handle in first.iter().chain(&later) {
                assert_eq!(finish(handle).succeeded(), Some(()));
            }
            assert_eq!(pool.check_invariants(), Ok(()));
        }

        // A pool whose other queues always have more ready tasks than it has free workers
        // still reaches a limited queue: here one worker, a limited task and then twenty
        // others, all ready as the worker frees; the limited one starts after one other at
        // most (the durable store claims the limited queues first at every other claim),
        // not after all twenty.
        fn a_backlog_in_other_queues_does_not_starve_a_limited_queue(builder) {
            const HOLD: TaskType<u64, ()> = TaskType::new("hold");
            const COUNTED: TaskType<u32, ()> = TaskType::new("counted");
            let ran = Arc::new(AtomicU32::new(0));
            let counter = Arc::clone(&ran);
            let pool = builder
                .workers(1)
                .register_with(GATE, TypeOptions::new().queue("reports"), gate_handler)
                .register(HOLD, gate_handler)
                .register(COUNTED, move |_, _: &u32| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, HandlerError>(())
                })
                .build();
            assert_eq!(pool.set_queue_limit("reports", Some(1)), Ok(None));
            let (hold, report) = (Gate::new(), Gate::new());
            let held = pool.submit(HOLD.task(hold.number())).unwrap();
            hold.wait_started();
            let limited = pool.submit(GATE.task(report.number())).unwrap();
            let others: Vec<_> = (0..20).map(|i| pool.submit(COUNTED.task(i)).unwrap()).collect();
            hold.open();
            report.wait_started();
            let before = ran.load(Ordering::SeqCst);
            assert!(before <= 1, "{before} of the others ran before the limited task");
            report.open();
            assert_eq!(finish(&limited).succeeded(), Some(()));
            assert_eq!(finish(&held).succeeded(), Some(()));
            for handle in &others {
                assert_eq!(finish(handle).succeeded(), Some(()));
            }
            assert_eq!(pool.check_invariants(), Ok(()));
        }

        fn bad_queue_limits_are_typed_errors(builder) {
            let store = builder.store();
            let pool = limited(builder).build();
            assert_eq!(
                pool.set_queue_limit("reports", Some(0)),
                Err(QueueLimitError::Zero("reports".to_owned()))
            );
            assert!(matches!(
                pool.set_queue_limit("no spaces", Some(1)),
                Err(QueueLimitError::InvalidName { .. })
            ));
            let elsewhere = pool.set_queue_limit("elsewhere", Some(1));
            if store == Store::Memory {
                assert_eq!(elsewhere, Err(QueueLimitError::Unknown("elsewhere".to_owned())));
            } else {
                // Another process of the fleet may serve it.
                assert_eq!(elsewhere, Ok(None));
            }
            assert!(pool.queue_limits().unwrap().iter().all(|l| l.queue != "reports"));
        }
    }
}
