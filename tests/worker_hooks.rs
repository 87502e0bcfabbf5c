//! Worker hooks: `on_worker_start` runs on each worker thread before its first claim,
//! `on_worker_exit` after its last task; hostile hooks (one that panics, one that calls back
//! into the pool) cost the pool nothing; an exit hook keeps a thread-local whose `Drop` panics
//! from aborting the process at shutdown. On both stores.

mod support_store;

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use support_store::{
    EXPECTED, GATE, Gate, HANG_GUARD, TestPool, finish, gate_handler, silence_expected_panics,
};
use tasq::{HandlerError, Outcome, SubmitErrorKind, TaskId, TaskType};

/// Returns the name of the thread it ran on, or fails if that thread's start hook did not run
/// before it.
const WHERE: TaskType<u32, String> = TaskType::new("where");

thread_local! {
    /// Set by the start hook of the worker on this thread.
    static STARTED: Cell<Option<usize>> = const { Cell::new(None) };
    /// Runs of `WHERE` on this thread.
    static RUNS: Cell<u32> = const { Cell::new(0) };
}

fn where_handler(_: &tasq::Context<'_>, _: &u32) -> Result<String, HandlerError> {
    if STARTED.with(Cell::get).is_none() {
        return Err(HandlerError::permanent(
            "ran before its worker's start hook",
        ));
    }
    RUNS.with(|runs| runs.set(runs.get() + 1));
    Ok(std::thread::current().name().unwrap_or("").to_owned())
}

/// What a hook saw.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Started {
        index: usize,
        thread: String,
    },
    Exited {
        index: usize,
        thread: String,
        /// Runs of `WHERE` on its thread: every one was before the exit hook.
        runs: u32,
    },
}

fn thread_name() -> String {
    std::thread::current().name().unwrap_or("").to_owned()
}

conformance! {
    fn hooks_run_on_each_worker_before_its_first_claim_and_after_its_last(builder) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (on_start, on_exit) = (Arc::clone(&seen), Arc::clone(&seen));
        let pool = builder
            .workers(2)
            .register(WHERE, where_handler)
            .on_worker_start(move |index| {
                STARTED.with(|s| s.set(Some(index)));
                let thread = thread_name();
                on_start.lock().unwrap().push(Seen::Started { index, thread });
            })
            .on_worker_exit(move |index| {
                assert_eq!(STARTED.with(Cell::get), Some(index), "on the same thread");
                let (thread, runs) = (thread_name(), RUNS.with(Cell::get));
                on_exit.lock().unwrap().push(Seen::Exited { index, thread, runs });
            })
            .build();
        let handles: Vec<_> = (0..20).map(|n| pool.submit(WHERE.task(n)).unwrap()).collect();
        for handle in &handles {
            match finish(handle) {
                Outcome::Succeeded(thread) => assert!(thread.starts_with("tasq-worker-"), "{thread}"),
                other => panic!("{other:?}"),
            }
        }
        let report = pool.shutdown(Duration::from_secs(10));
        assert!(!report.deadline_reached);
        // The shutdown waited for the exit hooks.
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let started: BTreeSet<(usize, String)> = seen
            .iter()
            .filter_map(|s| match s {
                Seen::Started { index, thread } => Some((*index, thread.clone())),
                Seen::Exited { .. } => None,
            })
            .collect();
        let expected: BTreeSet<(usize, String)> =
            (0..2).map(|i| (i, format!("tasq-worker-{i}"))).collect();
        assert_eq!(started, expected, "each worker's start hook, on its own thread: {seen:?}");
        let mut runs = 0;
        let mut exited = BTreeSet::new();
        for s in &seen {
            if let Seen::Exited { index, thread, runs: on_thread } = s {
                exited.insert((*index, thread.clone()));
                runs += on_thread;
            }
        }
        assert_eq!(exited, expected, "each worker's exit hook, on its own thread: {seen:?}");
        assert_eq!(runs, 20, "every run came before its worker's exit hook");
        assert_eq!(pool.stats().workers, 0);
    }

    fn a_panicking_hook_costs_no_worker_and_the_exit_hook_still_runs(builder) {
        silence_expected_panics();
        let exits = Arc::new(Mutex::new(BTreeSet::new()));
        let on_exit = Arc::clone(&exits);
        let pool = builder
            .workers(2)
            .register(GATE, gate_handler)
            .on_worker_start(|index| panic!("{EXPECTED} start hook {index}"))
            .on_worker_exit(move |index| {
                on_exit.lock().unwrap().insert(index);
                panic!("{EXPECTED} exit hook {index}");
            })
            .build();
        // Both workers run at once: neither died of its start hook.
        let (first, second) = (Gate::new(), Gate::new());
        let a = pool.submit(GATE.task(first.number())).unwrap();
        let b = pool.submit(GATE.task(second.number())).unwrap();
        first.wait_started();
        second.wait_started();
        assert_eq!(pool.stats().workers, 2);
        first.open();
        second.open();
        assert!(finish(&a).is_succeeded() && finish(&b).is_succeeded());
        let report = pool.shutdown(Duration::from_secs(10));
        assert!(!report.deadline_reached);
        assert_eq!(report.succeeded, 2);
        assert_eq!(*exits.lock().unwrap(), BTreeSet::from([0, 1]));
        let stats = pool.stats();
        assert_eq!((stats.workers, stats.totals.worker_panics), (0, 0));
    }

    fn hooks_may_call_back_into_the_pool(builder) {
        let slot: Arc<OnceLock<Weak<TestPool>>> = Arc::new(OnceLock::new());
        let (go, wait_for_pool) = crossbeam_channel::unbounded::<()>();
        let (tx, rx) = crossbeam_channel::unbounded::<(&str, usize, TaskId, usize)>();
        let (start_slot, exit_slot, start_tx) = (Arc::clone(&slot), Arc::clone(&slot), tx.clone());
        let pool = Arc::new(
            builder
                .workers(2)
                .register(WHERE, where_handler)
                .on_worker_start(move |index| {
                    STARTED.with(|s| s.set(Some(index)));
                    // Waits for the pool's handle: a start hook may block.
                    wait_for_pool.recv_timeout(HANG_GUARD).expect("the test sends the pool");
                    let pool = start_slot.get().and_then(Weak::upgrade).expect("the pool");
                    let handle = pool.submit(WHERE.task(index as u32)).expect("a start hook submits");
                    let workers = pool.stats().workers;
                    start_tx.send(("start", index, handle.id(), workers)).unwrap();
                })
                .on_worker_exit(move |index| {
                    let pool = exit_slot.get().and_then(Weak::upgrade).expect("the pool");
                    let refused = pool.submit(WHERE.task(99)).expect_err("the pool is closed");
                    assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
                    let stats = pool.stats();
                    // The first task a start hook submitted.
                    let id = TaskId::from_parts(pool.id(), 1);
                    assert!(pool.info(id).is_some(), "the exit hook reads a task");
                    tx.send(("exit", index, id, stats.workers)).unwrap();
                })
                .build(),
        );
        slot.set(Arc::downgrade(&pool)).unwrap();
        go.send(()).unwrap();
        go.send(()).unwrap();
        let mut submitted = Vec::new();
        for _ in 0..2 {
            let (what, index, id, workers) = rx.recv_timeout(HANG_GUARD).expect("a start hook");
            assert_eq!((what, workers), ("start", 2));
            submitted.push((index, id));
        }
        for &(index, id) in &submitted {
            let handle = pool.handle(WHERE, id).expect("the hook's task");
            assert!(finish(&handle).is_succeeded(), "task of start hook {index}");
        }
        let report = pool.shutdown(Duration::from_secs(10));
        assert!(!report.deadline_reached);
        assert_eq!(report.succeeded, 2);
        let exits: BTreeSet<usize> = rx.try_iter().map(|(what, index, _, _)| {
            assert_eq!(what, "exit");
            index
        }).collect();
        assert_eq!(exits, BTreeSet::from([0, 1]), "shutdown waited for both exit hooks");
    }

    fn an_exit_hook_drops_a_thread_local_whose_drop_panics(builder) {
        silence_expected_panics();
        // Without the exit hook, this thread-local's drop at the worker thread's end would
        // abort the test binary ("thread local panicked on drop").
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let in_hook = Arc::clone(&dropped);
        let pool = builder
            .workers(2)
            .register(WHERE, |ctx, n: &u32| {
                CLIENT.with(|c| {
                    c.borrow_mut().get_or_insert_with(|| Client);
                });
                where_handler(ctx, n)
            })
            .on_worker_start(|index| STARTED.with(|s| s.set(Some(index))))
            .on_worker_exit(move |index| {
                let client = CLIENT.with(|c| c.borrow_mut().take());
                in_hook.lock().unwrap().push((index, client.is_some()));
                drop(client); // panics: caught around the hook
            })
            .build();
        let handles: Vec<_> = (0..10).map(|n| pool.submit(WHERE.task(n)).unwrap()).collect();
        for handle in &handles {
            let outcome = finish(handle);
            assert!(outcome.is_succeeded(), "{outcome:?}");
        }
        let report = pool.shutdown(Duration::from_secs(10));
        assert!(!report.deadline_reached);
        let mut dropped = std::mem::take(&mut *dropped.lock().unwrap());
        dropped.sort_unstable();
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        assert!(dropped.iter().any(|&(_, had)| had), "some worker kept a client: {dropped:?}");
    }
}

/// A client kept in a thread-local, whose `Drop` panics (a connection that fails to close).
struct Client;

impl Drop for Client {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("{EXPECTED} the client's drop");
        }
    }
}

thread_local! {
    static CLIENT: RefCell<Option<Client>> = const { RefCell::new(None) };
}
