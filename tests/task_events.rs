//! A task's ordinary life told to the hooks (`Builder::lifecycle_events`), on both stores:
//! every task's submit, each start, each retry with its delay, its success, failure (its dead
//! letter) or cancel, once each and in order per attempt; nothing of it without the setting;
//! and a hook that calls back into its pool on every such event harms nothing.

mod support_store;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use crossbeam_channel::Receiver;
use support_store::{
    EXPECTED, GATE, Gate, HANG_GUARD, Store, TestBuilder, finish, silence_expected_panics,
};
use tasq::{CancelOutcome, CancelReason, Event, HandlerError, Pool, TaskId, TaskType};

/// What a `JOB` task does on each attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Behaviour {
    Succeed,
    /// Fails with a retryable error on its first attempt, then succeeds.
    RetryOnce,
    FailPermanently,
    Panic,
    /// Fails with a retryable error on every attempt: a dead letter after the last.
    AlwaysRetry,
}

const JOB: TaskType<(u32, Behaviour), u32> = TaskType::new("job");
/// Every `JOB` may run this many times.
const ATTEMPTS: u32 = 3;
/// The delay each retryable error asks for, so that the events can say it.
const BACKOFF: Duration = Duration::from_millis(5);

fn with_jobs(builder: TestBuilder) -> TestBuilder {
    silence_expected_panics();
    builder
        .max_attempts(ATTEMPTS)
        .quiet_panics(true)
        .with_gates()
        .register(
            JOB,
            |ctx, &(n, behaviour): &(u32, Behaviour)| match behaviour {
                Behaviour::Succeed => Ok(n),
                Behaviour::RetryOnce if ctx.attempt() == 1 => {
                    Err(HandlerError::retryable(format!("transient {n}")).retry_after(BACKOFF))
                }
                Behaviour::RetryOnce => Ok(n),
                Behaviour::FailPermanently => Err(HandlerError::permanent(format!("bad {n}"))),
                Behaviour::Panic => panic!("{EXPECTED} boom {n}"),
                Behaviour::AlwaysRetry => {
                    Err(HandlerError::retryable(format!("transient {n}")).retry_after(BACKOFF))
                }
            },
        )
}

/// One task's events, shortened to what the test compares.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Told {
    Submitted,
    Started(u32),
    Retrying(u32, Duration, String),
    Succeeded(u32),
    Failed(u32),
    Cancelled(CancelReason),
}

/// The events heard so far (the pool must be shut down: then all of them), by task, each
/// task's in the order heard; any event that is not about one task fails the test.
fn by_task(events: &Receiver<Event>) -> BTreeMap<TaskId, Vec<Told>> {
    let mut tasks: BTreeMap<TaskId, Vec<Told>> = BTreeMap::new();
    for event in events.try_iter() {
        let (id, told) = match event {
            Event::Submitted { id, task_type, .. } => {
                assert!(task_type == "job" || task_type == "gate", "{task_type}");
                (id, Told::Submitted)
            }
            Event::Started { id, attempt, .. } => (id, Told::Started(attempt)),
            Event::Retrying {
                id,
                attempt,
                delay,
                error,
                ..
            } => (id, Told::Retrying(attempt, delay, error)),
            Event::Succeeded { id, attempt, .. } => (id, Told::Succeeded(attempt)),
            Event::DeadLetter { id, attempts, .. } => (id, Told::Failed(attempts)),
            Event::Cancelled { id, reason, .. } => (id, Told::Cancelled(reason)),
            other => panic!("an event not about one task: {other}"),
        };
        tasks.entry(id).or_default().push(told);
    }
    tasks
}

/// The life a `JOB` of `behaviour` must be told, in order.
fn expected_life(n: u32, behaviour: Behaviour) -> Vec<Told> {
    let retry = |attempt| Told::Retrying(attempt, BACKOFF, format!("transient {n}"));
    let mut life = vec![Told::Submitted, Told::Started(1)];
    match behaviour {
        Behaviour::Succeed => life.push(Told::Succeeded(1)),
        Behaviour::RetryOnce => life.extend([retry(1), Told::Started(2), Told::Succeeded(2)]),
        Behaviour::FailPermanently | Behaviour::Panic => life.push(Told::Failed(1)),
        Behaviour::AlwaysRetry => {
            for attempt in 1..ATTEMPTS {
                life.extend([retry(attempt), Told::Started(attempt + 1)]);
            }
            life.push(Told::Failed(ATTEMPTS));
        }
    }
    life
}

/// `heard` is `expected`, in order; on the durable store the submit is told after its commit
/// (a worker may have started the task first) and the next attempt's start may come before the
/// previous attempt's retry is told (another worker claims the row once it is written): there,
/// each attempt's events must be in order among themselves, and the submit anywhere.
fn assert_life(store: Store, id: TaskId, heard: &[Told], expected: &[Told]) {
    match store {
        Store::Memory => assert_eq!(heard, expected, "{id}"),
        #[cfg(feature = "postgres")]
        Store::Postgres => {
            let mut heard_sorted = heard.to_vec();
            let mut expected_sorted = expected.to_vec();
            heard_sorted.sort_by_key(rank);
            expected_sorted.sort_by_key(rank);
            assert_eq!(heard_sorted, expected_sorted, "{id}: {heard:?}");
            // Within an attempt: started, then how it ended.
            let position = |told: &Told| heard.iter().position(|t| t == told).unwrap();
            for told in heard {
                if let Told::Retrying(attempt, ..)
                | Told::Succeeded(attempt)
                | Told::Failed(attempt) = told
                {
                    assert!(
                        position(&Told::Started(*attempt)) < position(told),
                        "{id}: {told:?} before its start: {heard:?}"
                    );
                }
            }
        }
    }
}

/// Orders one task's events by attempt, then start before ending.
fn rank(told: &Told) -> (u32, u8) {
    match told {
        Told::Submitted => (0, 0),
        Told::Started(attempt) => (*attempt, 1),
        Told::Retrying(attempt, ..) | Told::Succeeded(attempt) | Told::Failed(attempt) => {
            (*attempt, 2)
        }
        Told::Cancelled(_) => (u32::MAX, 2),
    }
}

fn shut_down(pool: &Pool) {
    let report = pool.shutdown(HANG_GUARD);
    assert!(
        !report.deadline_reached,
        "the pool did not drain: {report:?}"
    );
}

conformance! {
    fn every_task_s_life_is_told_once_in_order(builder) {
        let store = builder.store();
        let (builder, events) = with_jobs(builder).workers(2).lifecycle_events(true).events();
        let pool = builder.build();
        let behaviours = [
            Behaviour::Succeed,
            Behaviour::RetryOnce,
            Behaviour::FailPermanently,
            Behaviour::Panic,
            Behaviour::AlwaysRetry,
        ];
        let mut expected = BTreeMap::new();
        let mut handles = Vec::new();
        for n in 0..20u32 {
            let behaviour = behaviours[n as usize % behaviours.len()];
            let handle = pool.submit(JOB.task((n, behaviour)).priority((n % 3) as u8)).unwrap();
            expected.insert(handle.id(), expected_life(n, behaviour));
            handles.push(handle);
        }
        for handle in &handles {
            finish(handle);
        }
        shut_down(&pool);
        let heard = by_task(&events);
        assert_eq!(heard.len(), expected.len(), "{heard:?}");
        for (id, life) in &expected {
            assert_life(store, *id, &heard[id], life);
        }
    }

    fn without_the_setting_only_dead_letters_are_told(builder) {
        let (builder, events) = with_jobs(builder).workers(2).events();
        let pool = builder.build();
        let handles: Vec<_> = (0..10u32)
            .map(|n| {
                let behaviour = if n % 2 == 0 { Behaviour::RetryOnce } else { Behaviour::FailPermanently };
                pool.submit(JOB.task((n, behaviour))).unwrap()
            })
            .collect();
        for handle in &handles {
            finish(handle);
        }
        shut_down(&pool);
        let heard: Vec<Event> = events.try_iter().collect();
        assert_eq!(heard.len(), 5, "{heard:?}");
        assert!(heard.iter().all(|e| matches!(e, Event::DeadLetter { .. })), "{heard:?}");
    }

    fn cancels_are_told_with_their_reason(builder) {
        let store = builder.store();
        let (builder, events) = with_jobs(builder).workers(1).lifecycle_events(true).events();
        let pool = builder.build();
        // The only worker runs the gate: the job waits behind it.
        let gate = Gate::new();
        let running = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();
        let waiting = pool.submit(JOB.task((1, Behaviour::Succeed))).unwrap();
        assert_eq!(pool.cancel(waiting.id()).unwrap(), CancelOutcome::Cancelled);
        assert_eq!(pool.cancel(running.id()).unwrap(), CancelOutcome::Signalled);
        gate.open();
        assert!(finish(&running).is_cancelled());
        assert!(finish(&waiting).is_cancelled());
        shut_down(&pool);
        let heard = by_task(&events);
        assert_life(
            store,
            waiting.id(),
            &heard[&waiting.id()],
            &[Told::Submitted, Told::Cancelled(CancelReason::Requested)],
        );
        assert_life(
            store,
            running.id(),
            &heard[&running.id()],
            &[Told::Submitted, Told::Started(1), Told::Cancelled(CancelReason::Requested)],
        );
    }

    fn a_hook_that_calls_back_into_its_pool_on_every_event_harms_nothing(builder) {
        const TASKS: u32 = 10;
        let slot: Arc<OnceLock<Weak<Pool>>> = Arc::new(OnceLock::new());
        let reach = Arc::clone(&slot);
        let (follow_ups_tx, follow_ups) = crossbeam_channel::unbounded();
        let store = builder.store();
        let (builder, events) = with_jobs(builder)
            .workers(2)
            .lifecycle_events(true)
            .on_event(move |event: &Event| {
                let Some(pool) = reach.get().and_then(Weak::upgrade) else {
                    return;
                };
                // A read on every event; a follow-up task for each first task's success.
                let _ = pool.stats();
                if let Event::Succeeded { id, .. } = event {
                    assert_eq!(pool.status(*id), Some(tasq::TaskState::Succeeded));
                    if follow_ups_tx.len() < TASKS as usize {
                        let handle = pool.submit(JOB.task((1000, Behaviour::Succeed))).unwrap();
                        let _ = follow_ups_tx.send(handle.id());
                    }
                }
            })
            .events();
        let mut test_pool = builder.build();
        let pool = Arc::new(test_pool.take());
        slot.set(Arc::downgrade(&pool)).expect("set once");
        let handles: Vec<_> = (0..TASKS)
            .map(|n| pool.submit(JOB.task((n, Behaviour::RetryOnce))).unwrap())
            .collect();
        for handle in &handles {
            finish(handle);
        }
        let follow_ups: Vec<TaskId> = (0..TASKS)
            .map(|_| follow_ups.recv_timeout(HANG_GUARD).expect("the hook submitted a follow-up"))
            .collect();
        pool.wait_idle_timeout(Some(HANG_GUARD)).expect("the follow-ups ran");
        shut_down(&pool);
        let heard = by_task(&events);
        for (n, handle) in handles.iter().enumerate() {
            assert_life(store, handle.id(), &heard[&handle.id()], &expected_life(n as u32, Behaviour::RetryOnce));
        }
        for id in follow_ups {
            assert_life(store, id, &heard[&id], &expected_life(1000, Behaviour::Succeed));
        }
    }
}

/// The embedded store's cascade and shutdown cancels are told too.
#[test]
fn embedded_cascades_and_shutdown_cancels_are_told() {
    let (builder, events) = with_jobs(TestBuilder::new(Store::Memory).unwrap())
        .workers(1)
        .lifecycle_events(true)
        .events();
    let mut test_pool = builder.build();
    let pool = &*test_pool;
    let gate = Gate::new();
    let running = pool.submit(GATE.task(gate.number())).unwrap();
    gate.wait_started();
    let doomed = pool
        .submit(JOB.task((1, Behaviour::FailPermanently)))
        .unwrap();
    let dependent = pool
        .submit(JOB.task((2, Behaviour::Succeed)).after([&doomed]))
        .unwrap();
    gate.open();
    assert!(finish(&doomed).is_failed());
    assert!(finish(&dependent).is_cancelled());
    assert!(finish(&running).is_succeeded());
    // Held behind a second gate, then cancelled by the shutdown's deadline.
    let gate = Gate::new();
    let _holder = pool.submit(GATE.task(gate.number())).unwrap();
    gate.wait_started();
    let queued = pool.submit(JOB.task((3, Behaviour::Succeed))).unwrap();
    let pool = Arc::new(test_pool.take());
    let stopping = Arc::clone(&pool);
    // Past its deadline at once: the queued task is cancelled; the shutdown then waits for
    // the gate, which ignores its token.
    let shutdown = std::thread::spawn(move || stopping.shutdown(Duration::ZERO));
    assert!(finish(&queued).is_cancelled());
    gate.open();
    assert!(shutdown.join().unwrap().deadline_reached);
    let heard = by_task(&events);
    assert_eq!(
        heard[&dependent.id()],
        [
            Told::Submitted,
            Told::Cancelled(CancelReason::DependencyFailed(doomed.id()))
        ]
    );
    assert_eq!(
        heard[&queued.id()],
        [Told::Submitted, Told::Cancelled(CancelReason::Shutdown)]
    );
}
