//! Queues with workers of their own (`Builder::queue`), on both stores: a queue never runs more
//! tasks at once than its workers, a slow queue holding all of its workers leaves the other
//! queues' workers free, its tasks wait ready (and can be cancelled) meanwhile, lanes mix with
//! a type's own limit and with pauses, and bad settings are typed build errors.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use support_store::{GATE, Gate, Store, TestBuilder, assert_all_ran, finish, gate_handler};
use tasq::{
    BuildError, CancelOutcome, HandlerError, PauseTarget, TaskHandle, TaskState, TaskType,
    TypeOptions,
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
