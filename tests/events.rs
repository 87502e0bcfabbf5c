//! Event hooks on both stores: each dead letter is reported once, with its type, reason,
//! attempts and error; a hook that panics, blocks, calls back into its pool (even to shut it
//! down) or whose captures panic when dropped harms neither the other hooks nor the pool; and
//! `shutdown` returns only once the hooks have seen every event.

mod support_store;

use std::collections::{HashMap, HashSet};
use std::panic;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use support_store::{
    EXPECTED, GATE, Gate, HANG_GUARD, Store, TestBuilder, TestPool, finish, silence_expected_panics,
};
use tasq::{
    Event, FailureReason, HandlerError, Outcome, Pool, RetryPolicy, TaskHandle, TaskId, TaskType,
};

/// What a `JOB` task does when it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Behaviour {
    Succeed,
    FailPermanently,
    Panic,
    /// Fails with a retryable error on every attempt: exhausted after the last.
    AlwaysRetry,
    /// Fails with a retryable error on its first attempt only.
    RetryOnce,
}

const JOB: TaskType<(u32, Behaviour), u32> = TaskType::new("job");

/// Every `JOB` task may run this many times.
const ATTEMPTS: u32 = 3;

/// `builder` with `JOB` registered, three attempts and retries due at once.
fn with_jobs(builder: TestBuilder) -> TestBuilder {
    silence_expected_panics();
    builder
        .max_attempts(ATTEMPTS)
        .retry_policy(RetryPolicy::exponential(Duration::ZERO, Duration::ZERO))
        .quiet_panics(true)
        .register(
            JOB,
            |ctx, &(n, behaviour): &(u32, Behaviour)| match behaviour {
                Behaviour::Succeed => Ok(n),
                Behaviour::FailPermanently => {
                    Err(HandlerError::permanent(format!("bad input {n}")))
                }
                Behaviour::Panic => panic!("{EXPECTED} boom {n}"),
                Behaviour::AlwaysRetry => Err(HandlerError::retryable(format!(
                    "transient {n} on attempt {}",
                    ctx.attempt()
                ))),
                Behaviour::RetryOnce if ctx.attempt() == 1 => {
                    Err(HandlerError::retryable(format!("transient {n}")))
                }
                Behaviour::RetryOnce => Ok(n),
            },
        )
}

/// The failure a `JOB` task of `behaviour` must end with, if it fails.
fn expected_failure(n: u32, behaviour: Behaviour) -> Option<(FailureReason, u32, String)> {
    match behaviour {
        Behaviour::Succeed | Behaviour::RetryOnce => None,
        Behaviour::FailPermanently => Some((FailureReason::Permanent, 1, format!("bad input {n}"))),
        Behaviour::Panic => Some((FailureReason::Panicked, 1, format!("{EXPECTED} boom {n}"))),
        Behaviour::AlwaysRetry => Some((
            FailureReason::Exhausted,
            ATTEMPTS,
            format!("transient {n} on attempt {ATTEMPTS}"),
        )),
    }
}

/// A mix of every behaviour, by number.
fn mixed(n: u32) -> Behaviour {
    match n % 6 {
        0 => Behaviour::Succeed,
        1 | 5 => Behaviour::FailPermanently,
        2 => Behaviour::Panic,
        3 => Behaviour::AlwaysRetry,
        _ => Behaviour::RetryOnce,
    }
}

/// The dead-letter events in `events` (after a shutdown: all of them), in order; any other
/// kind of event fails the test.
fn dead_letter_events(
    events: &Receiver<Event>,
) -> Vec<(TaskId, &'static str, FailureReason, u32, String)> {
    events
        .try_iter()
        .map(|event| match event {
            Event::DeadLetter {
                id,
                task_type,
                reason,
                attempts,
                error,
            } => (id, task_type, reason, attempts, error),
            other => panic!("an event nobody asked for: {other}"),
        })
        .collect()
}

/// Shuts `pool` down, failing the test if its tasks did not drain in time.
fn shut_down(pool: &Pool) {
    let report = pool.shutdown(HANG_GUARD);
    assert!(
        !report.deadline_reached,
        "the pool did not drain: {report:?}"
    );
}

/// How a hook reaches the pool it belongs to: set once the pool is built. Weak, so that the
/// hook (which the pool owns) does not keep its pool alive.
type PoolSlot = Arc<OnceLock<Weak<Pool>>>;

/// Moves the pool out of `test_pool` into an `Arc`, and gives `slot` a weak reference to it.
fn share(test_pool: &mut TestPool, slot: &PoolSlot) -> Arc<Pool> {
    let pool = Arc::new(test_pool.take());
    slot.set(Arc::downgrade(&pool))
        .expect("the slot is set once");
    pool
}

/// A hook's capture whose `Drop` says so, then panics.
struct PanicsOnDrop {
    name: &'static str,
    dropped: Sender<&'static str>,
}

impl PanicsOnDrop {
    fn touch(&self) {}
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        let _ = self.dropped.send(self.name);
        panic!("{EXPECTED} the drop of hook {}", self.name);
    }
}

/// A `tracing` subscriber whose every `info` or `warn` event of the crate calls back into the
/// pools it watches, as an operator's subscriber might (to log the stats with a dead letter).
/// Subscribers are user code: the pool must not emit them under one of its locks.
#[cfg(feature = "tracing")]
mod calls_back {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex, Once, Weak};

    use tasq::Pool;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Level, Metadata, Subscriber};

    static POOLS: Mutex<Vec<Weak<Pool>>> = Mutex::new(Vec::new());
    /// How many times the subscriber called back into a pool.
    pub static CALLS: AtomicUsize = AtomicUsize::new(0);

    struct CallsBack {
        next_span: AtomicU64,
    }

    impl Subscriber for CallsBack {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            metadata.target() == "tasq"
        }

        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(self.next_span.fetch_add(1, Ordering::Relaxed) + 1)
        }

        fn record(&self, _: &Id, _: &Record<'_>) {}

        fn record_follows_from(&self, _: &Id, _: &Id) {}

        fn event(&self, event: &tracing::Event<'_>) {
            // `Level` orders the verbose levels higher.
            if *event.metadata().level() > Level::INFO {
                return;
            }
            let pools: Vec<Arc<Pool>> = POOLS
                .lock()
                .unwrap()
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            for pool in pools {
                let _ = pool.stats();
                CALLS.fetch_add(1, Ordering::SeqCst);
            }
        }

        fn enter(&self, _: &Id) {}

        fn exit(&self, _: &Id) {}
    }

    /// Installs the subscriber, once per test binary: it is the global default, the only kind
    /// the pool's threads see. Before the pool is built, as a program would.
    pub fn install() {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            let subscriber = CallsBack {
                next_span: AtomicU64::new(0),
            };
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
        });
    }

    /// Has the subscriber call back into `pool`.
    pub fn watch(pool: &Arc<Pool>) {
        POOLS.lock().unwrap().push(Arc::downgrade(pool));
    }

    /// Stops calling back into `pool`.
    pub fn unwatch(pool: &Arc<Pool>) {
        POOLS
            .lock()
            .unwrap()
            .retain(|weak| !std::ptr::eq(weak.as_ptr(), Arc::as_ptr(pool)));
    }
}

/// Waits for its token (fired by its timeout).
#[cfg(feature = "tracing")]
const TIMED: TaskType<(), ()> = TaskType::new("timed");

conformance! {
    fn each_dead_letter_is_reported_once_with_its_type_reason_attempts_and_error(builder) {
        const TASKS: u32 = 120;
        let (builder, events) = with_jobs(builder).workers(4).events();
        let pool = builder.build();
        let handles: Vec<_> = (0..TASKS)
            .map(|n| (n, pool.submit(JOB.task((n, mixed(n)))).unwrap()))
            .collect();

        let mut failed = HashMap::new();
        for (n, handle) in &handles {
            let behaviour = mixed(*n);
            match (finish(handle), expected_failure(*n, behaviour)) {
                (Outcome::Succeeded(out), None) => assert_eq!(out, *n),
                (Outcome::Failed(failure), Some(expected)) => {
                    let got = (failure.reason, failure.attempts, failure.error.clone());
                    assert_eq!(got, expected, "task {n} ({behaviour:?})");
                    failed.insert(handle.id(), expected);
                }
                (outcome, expected) => {
                    panic!("task {n} ({behaviour:?}) ended {outcome:?}, expected {expected:?}")
                }
            }
        }
        let listed: HashSet<TaskId> = pool.dead_letters().iter().map(|d| d.id).collect();
        let by_reason = pool.metrics().dead_letters_by_reason;
        shut_down(&pool);

        let mut reported: HashMap<TaskId, usize> = HashMap::new();
        for (id, task_type, reason, attempts, error) in dead_letter_events(&events) {
            *reported.entry(id).or_default() += 1;
            assert_eq!(task_type, "job", "the event of {id}: {:?}", failed.get(&id));
            let expected = failed
                .get(&id)
                .unwrap_or_else(|| panic!("a dead-letter event for {id}, which did not fail"));
            assert_eq!(&(reason, attempts, error), expected, "the event of {id}");
        }
        let twice: Vec<_> = reported.iter().filter(|&(_, &n)| n > 1).collect();
        assert!(twice.is_empty(), "reported more than once: {twice:?}");
        let reported: HashSet<TaskId> = reported.into_keys().collect();
        let failed_ids: HashSet<TaskId> = failed.keys().copied().collect();
        assert_eq!(reported, failed_ids, "every dead letter is reported, and only those");
        assert_eq!(listed, failed_ids, "the events and the dead-letter list agree");

        for (reason, count) in by_reason {
            let expected = failed.values().filter(|f| f.0 == reason).count() as u64;
            assert_eq!(count, expected, "dead letters that ended {reason}");
        }
    }

    fn tasks_retried_at_once_are_reported_with_their_type_when_exhausted(builder) {
        // Each retry is due at once, so the pool may claim a task's next attempt while the
        // worker that ran the last one is still recording it: the report must still name the
        // task's type.
        const TASKS: u32 = 100;
        let (builder, events) = with_jobs(builder).workers(8).events();
        let pool = builder.build();
        let handles: Vec<_> = (0..TASKS)
            .map(|n| pool.submit(JOB.task((n, Behaviour::AlwaysRetry))).unwrap())
            .collect();
        for handle in &handles {
            assert!(finish(handle).is_failed());
        }
        shut_down(&pool);
        let reported = dead_letter_events(&events);
        assert_eq!(reported.len(), TASKS as usize);
        for (id, task_type, reason, attempts, _) in reported {
            assert_eq!((task_type, reason, attempts), ("job", FailureReason::Exhausted, ATTEMPTS), "{id}");
        }
    }

    fn a_panicking_hook_misses_nothing_after_its_panic_nor_do_the_other_hooks(builder) {
        let (first_tx, first) = crossbeam_channel::unbounded();
        let builder = with_jobs(builder).workers(2).on_event(move |event: &Event| {
            let _ = first_tx.send(event.clone());
            panic!("{EXPECTED} a hook's own panic");
        });
        let (builder, events) = builder.events();
        let pool = builder.build();

        let mut failed = Vec::new();
        for n in 0..20 {
            let behaviour = if n % 2 == 0 { Behaviour::FailPermanently } else { Behaviour::Panic };
            let handle = pool.submit(JOB.task((n, behaviour))).unwrap();
            assert!(finish(&handle).is_failed());
            failed.push(handle.id());
        }
        // The pool keeps working after its hook panicked twenty times.
        let ok = pool.submit(JOB.task((100, Behaviour::Succeed))).unwrap();
        assert_eq!(finish(&ok), Outcome::Succeeded(100));
        let late = pool.submit(JOB.task((101, Behaviour::FailPermanently))).unwrap();
        assert!(finish(&late).is_failed());
        failed.push(late.id());
        shut_down(&pool);

        let panicking: Vec<TaskId> = first
            .try_iter()
            .map(|event| match event {
                Event::DeadLetter { id, .. } => id,
                other => panic!("an event nobody asked for: {other}"),
            })
            .collect();
        let other: Vec<TaskId> = dead_letter_events(&events).into_iter().map(|e| e.0).collect();
        let sorted = |ids: &[TaskId]| {
            let mut ids = ids.to_vec();
            ids.sort();
            ids
        };
        assert_eq!(sorted(&other), sorted(&failed), "the hook after the panicking one heard every event");
        assert_eq!(panicking, other, "the panicking hook heard every event too, in the same order");
    }

    fn a_hook_may_submit_cancel_wait_and_read_stats_without_deadlock_or_loss(builder) {
        /// Dead letters numbered below this get a follow-up, numbered 10 higher, that fails too.
        const CHAIN_BELOW: u32 = 20;
        let slot = PoolSlot::default();
        let hook_slot = Arc::clone(&slot);
        let (follow_tx, follow_ups) = crossbeam_channel::unbounded::<TaskHandle<u32>>();
        let (report_tx, reports) = crossbeam_channel::unbounded();
        let builder = with_jobs(builder).workers(2).on_event(move |event: &Event| {
            let Event::DeadLetter { error, .. } = event else {
                return;
            };
            let pool = hook_slot
                .get()
                .and_then(Weak::upgrade)
                .expect("the pool lives while its hooks run");
            let stats = pool.stats();
            // A task far off that the hook cancels at once, then waits for.
            let parked = pool
                .submit(JOB.task((0, Behaviour::Succeed)).delay(Duration::from_secs(3600)))
                .expect("a hook may submit");
            let cancelled = pool.cancel(parked.id()).is_ok();
            let ended_cancelled = parked.wait_timeout(HANG_GUARD).map(|o| o.is_cancelled());
            let n: u32 = error
                .strip_prefix("bad input ")
                .and_then(|n| n.parse().ok())
                .expect("a JOB's permanent error");
            if n < CHAIN_BELOW {
                let next = pool
                    .submit(JOB.task((n + 10, Behaviour::FailPermanently)))
                    .expect("a hook may submit");
                let _ = follow_tx.send(next);
            }
            let _ = report_tx.send((stats.workers, cancelled, ended_cancelled));
        });
        let (builder, events) = builder.events();
        let mut test_pool = builder.build();
        let pool = share(&mut test_pool, &slot);

        let mut failed = Vec::new();
        for n in 0..10 {
            let handle = pool.submit(JOB.task((n, Behaviour::FailPermanently))).unwrap();
            failed.push(handle);
        }
        // Three generations: 0..10 from the test, 10..20 and 20..30 from the hook.
        for _ in 0..20 {
            let next = follow_ups
                .recv_timeout(HANG_GUARD)
                .expect("the hook submitted a follow-up");
            failed.push(next);
        }
        for handle in &failed {
            assert!(finish(handle).is_failed());
        }
        for _ in 0..30 {
            let report = reports.recv_timeout(HANG_GUARD).expect("the hook finished a call");
            assert_eq!(report, (2, true, Some(true)), "stats, cancel and wait from a hook");
        }
        shut_down(&pool);

        assert!(follow_ups.try_recv().is_err(), "no fourth generation");
        let mut reported: Vec<TaskId> = dead_letter_events(&events).into_iter().map(|e| e.0).collect();
        let mut expected: Vec<TaskId> = failed.iter().map(TaskHandle::id).collect();
        reported.sort();
        expected.sort();
        assert_eq!(reported, expected, "every dead letter reported once, none lost");
        let totals = pool.stats().totals;
        assert_eq!((totals.failed, totals.cancelled), (30, 30));
    }

    fn a_hook_may_shut_its_own_pool_down(builder) {
        const TASKS: u32 = 10;
        let slot = PoolSlot::default();
        let hook_slot = Arc::clone(&slot);
        let (report_tx, report) = crossbeam_channel::bounded(1);
        let mut shut = false;
        let builder = with_jobs(builder)
            .workers(1)
            .with_gates()
            .on_event(move |event: &Event| {
                if shut || !matches!(event, Event::DeadLetter { .. }) {
                    return;
                }
                shut = true;
                let pool = hook_slot
                    .get()
                    .and_then(Weak::upgrade)
                    .expect("the pool lives while its hooks run");
                let _ = report_tx.send(pool.shutdown(HANG_GUARD));
            });
        let (builder, events) = builder.events();
        let mut test_pool = builder.build();
        let pool = share(&mut test_pool, &slot);

        // Hold the only worker, so that every task is queued when the first one fails and the
        // hook's shutdown has the rest to drain.
        let gate = Gate::new();
        let held = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        let handles: Vec<_> = (0..TASKS)
            .map(|n| pool.submit(JOB.task((n, Behaviour::FailPermanently))).unwrap())
            .collect();
        gate.open();

        let report = report
            .recv_timeout(HANG_GUARD)
            .expect("the shutdown called from the hook returned");
        assert!(!report.deadline_reached, "{report:?}");
        assert!(finish(&held).is_succeeded());
        // The embedded store drains its queue; the durable one stops claiming and leaves what
        // it has not claimed in the table, for another pool.
        let ended: Vec<TaskId> = handles
            .iter()
            .filter_map(|handle| {
                let outcome = handle.try_wait()?;
                assert!(outcome.is_failed(), "{outcome:?}");
                Some(handle.id())
            })
            .collect();
        match test_pool.store() {
            Store::Memory => assert_eq!(ended.len(), TASKS as usize, "the queue was drained"),
            Store::Postgres => assert!(!ended.is_empty()),
        }
        assert_eq!(
            (report.succeeded, report.failed),
            (1, ended.len() as u64),
            "{report:?}"
        );
        // A second shutdown, from the test, returns too; then every event has been seen.
        shut_down(&pool);
        let mut reported: Vec<TaskId> = dead_letter_events(&events).into_iter().map(|e| e.0).collect();
        let mut expected = ended;
        reported.sort();
        expected.sort();
        assert_eq!(reported, expected, "the events after the hook's shutdown were delivered");
    }

    fn shutdown_returns_only_after_the_hooks_saw_every_event(builder) {
        const TASKS: usize = 10;
        let seen = Arc::new(AtomicUsize::new(0));
        let (entered_tx, entered) = crossbeam_channel::bounded(1);
        let (release_tx, release) = crossbeam_channel::bounded::<()>(1);
        let counter = Arc::clone(&seen);
        let builder = with_jobs(builder).workers(2).on_event(move |event: &Event| {
            if counter.load(Ordering::SeqCst) == 0 {
                let _ = entered_tx.send(());
                let _ = release.recv_timeout(HANG_GUARD);
            }
            if matches!(event, Event::DeadLetter { .. }) {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        let pool = builder.build();
        let handles: Vec<_> = (0..TASKS)
            .map(|n| pool.submit(JOB.task((n as u32, Behaviour::FailPermanently))).unwrap())
            .collect();
        for handle in &handles {
            assert!(finish(handle).is_failed());
        }
        entered.recv_timeout(HANG_GUARD).expect("the hook heard of the first dead letter");

        let (done_tx, done) = crossbeam_channel::bounded(1);
        thread::scope(|scope| {
            let pool = &*pool;
            let seen = &seen;
            scope.spawn(move || {
                let report = pool.shutdown(HANG_GUARD);
                let _ = done_tx.send((seen.load(Ordering::SeqCst), report));
            });
            // A bounded look, not a synchronisation: a shutdown that does not wait for the
            // hook returns within microseconds.
            assert!(
                done.recv_timeout(Duration::from_millis(100)).is_err(),
                "shutdown returned while a hook was still to see {TASKS} events"
            );
            release_tx.send(()).unwrap();
            let (seen_at_return, report) = done
                .recv_timeout(HANG_GUARD)
                .expect("shutdown returned once the hook was released");
            assert!(!report.deadline_reached);
            assert_eq!(seen_at_return, TASKS, "the hooks saw every event before shutdown returned");
        });
    }

    fn hooks_whose_captures_panic_on_drop_are_dropped_quietly_at_shutdown(builder) {
        let (dropped_tx, dropped) = crossbeam_channel::unbounded();
        let a = PanicsOnDrop { name: "a", dropped: dropped_tx.clone() };
        let b = PanicsOnDrop { name: "b", dropped: dropped_tx };
        let builder = with_jobs(builder)
            .workers(1)
            .on_event(move |_: &Event| a.touch())
            .on_event(move |_: &Event| b.touch());
        let (builder, events) = builder.events();
        let pool = builder.build();
        let handle = pool.submit(JOB.task((1, Behaviour::FailPermanently))).unwrap();
        assert!(finish(&handle).is_failed());
        shut_down(&pool);

        let mut names = vec![
            dropped.recv_timeout(HANG_GUARD).expect("the first hook was dropped"),
            dropped.recv_timeout(HANG_GUARD).expect("the second hook was dropped, after the first's panic"),
        ];
        names.sort_unstable();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(dead_letter_events(&events).len(), 1);
        // The pool still answers, and a second shutdown returns.
        assert_eq!(pool.stats().totals.failed, 1);
        shut_down(&pool);
    }

    fn hooks_whose_captures_panic_on_drop_are_dropped_quietly_with_the_pool(builder) {
        let (dropped_tx, dropped) = crossbeam_channel::unbounded();
        let a = PanicsOnDrop { name: "a", dropped: dropped_tx.clone() };
        let b = PanicsOnDrop { name: "b", dropped: dropped_tx };
        let (builder, events) = with_jobs(builder)
            .workers(1)
            .on_event(move |_: &Event| a.touch())
            .on_event(move |_: &Event| b.touch())
            .events();
        let mut pool = builder.build();
        let handle = pool.submit(JOB.task((1, Behaviour::FailPermanently))).unwrap();
        assert!(finish(&handle).is_failed());
        drop(pool.take());

        let mut names = vec![
            dropped.recv_timeout(HANG_GUARD).expect("the first hook was dropped"),
            dropped.recv_timeout(HANG_GUARD).expect("the second hook was dropped, after the first's panic"),
        ];
        names.sort_unstable();
        assert_eq!(names, ["a", "b"]);
        // The recorder, a hook after them, was dropped too (its channel closed), once it had
        // heard of the dead letter.
        let mut heard = Vec::new();
        loop {
            match events.recv_timeout(HANG_GUARD) {
                Ok(event) => heard.push(event),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                Err(timeout) => panic!("the last hook was never dropped: {timeout}"),
            }
        }
        assert_eq!(heard.len(), 1, "one dead letter, reported once: {heard:?}");
    }

    fn a_blocked_hook_does_not_hold_up_the_workers(builder) {
        const TASKS: u32 = 40;
        let seen = Arc::new(AtomicUsize::new(0));
        let (entered_tx, entered) = crossbeam_channel::bounded(1);
        let (release_tx, release) = crossbeam_channel::bounded::<()>(1);
        let counter = Arc::clone(&seen);
        let builder = with_jobs(builder).workers(2).on_event(move |_: &Event| {
            if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = entered_tx.send(());
                let _ = release.recv_timeout(HANG_GUARD);
            }
        });
        let pool = builder.build();
        let first = pool.submit(JOB.task((0, Behaviour::FailPermanently))).unwrap();
        assert!(finish(&first).is_failed());
        entered.recv_timeout(HANG_GUARD).expect("the hook heard of the first dead letter");

        // The hook is blocked: tasks still run and end, failures too (their events queue up).
        let handles: Vec<_> = (1..=TASKS)
            .map(|n| pool.submit(JOB.task((n, mixed(n)))).unwrap())
            .collect();
        let mut failures = 1;
        for (n, handle) in (1..=TASKS).zip(&handles) {
            let outcome = finish(handle);
            assert_eq!(outcome.is_failed(), expected_failure(n, mixed(n)).is_some(), "task {n}");
            failures += usize::from(outcome.is_failed());
        }
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the hook is still blocked in its first call");

        release_tx.send(()).unwrap();
        shut_down(&pool);
        assert_eq!(seen.load(Ordering::SeqCst), failures, "then it heard every event");
    }

    #[cfg(feature = "tracing")]
    fn a_tracing_subscriber_that_calls_back_into_the_pool_does_not_deadlock(builder) {
        let builder = with_jobs(builder).workers(2).register_with(
            TIMED,
            tasq::TypeOptions::new()
                .timeout(Duration::from_millis(1))
                .max_attempts(1),
            |ctx, _: &()| {
                ctx.token().wait();
                Ok::<_, HandlerError>(())
            },
        );
        calls_back::install();
        let mut test_pool = builder.build();
        let pool = Arc::new(test_pool.take());
        calls_back::watch(&pool);
        let before = calls_back::CALLS.load(Ordering::SeqCst);
        let failing: Vec<_> = [
            Behaviour::FailPermanently,
            Behaviour::Panic,
            Behaviour::AlwaysRetry,
        ]
        .into_iter()
        .enumerate()
        .map(|(n, behaviour)| pool.submit(JOB.task((n as u32, behaviour))).unwrap())
        .collect();
        let timed = pool.submit(TIMED.task(())).unwrap();
        for handle in &failing {
            assert!(finish(handle).is_failed());
        }
        let Outcome::Failed(failure) = finish(&timed) else {
            panic!("expected a timeout");
        };
        assert_eq!(failure.reason, FailureReason::TimedOut);
        shut_down(&pool);
        calls_back::unwatch(&pool);
        assert!(
            calls_back::CALLS.load(Ordering::SeqCst) > before,
            "the subscriber heard of the dead letters and the timeout"
        );
    }
}
