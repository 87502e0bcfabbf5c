//! Circuit breakers: a downstream's breaker opens after its threshold of consecutive failed
//! runs; while it is open its types' tasks stay ready, do not run and burn no attempt, and
//! other types keep running; after the cool-down exactly one probe runs, whose success closes
//! the breaker (the held tasks run) and whose failure opens it again. Every change is an event
//! and shows in `stats().breakers`. On both stores.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use support_store::{HANG_GUARD, Store, TestBuilder, TestPool, finish};
use tasq::{
    Breaker, BreakerState, Event, HandlerError, ManualClock, Outcome, TaskHandle, TaskState,
    TaskType, TypeOptions,
};

/// Two task types that call the same downstream, "payments".
const CHARGE: TaskType<u64, ()> = TaskType::new("charge");
const REFUND: TaskType<u64, ()> = TaskType::new("refund");
/// A type that calls nothing the breaker watches.
const OTHER: TaskType<u64, u64> = TaskType::new("other");

const OK: u8 = 0;
const RETRYABLE: u8 = 1;
const PERMANENT: u8 = 2;

/// The downstream as the handlers see it: each run says it started, waits until the test
/// lets it through, then returns what `mode` says.
#[derive(Clone)]
struct Downstream {
    mode: Arc<AtomicU8>,
    runs: Arc<AtomicUsize>,
    started_tx: Sender<()>,
    started: Receiver<()>,
    open: Sender<()>,
    opened: Receiver<()>,
}

impl Downstream {
    fn new(mode: u8) -> Downstream {
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (open, opened) = crossbeam_channel::unbounded();
        Downstream {
            mode: Arc::new(AtomicU8::new(mode)),
            runs: Arc::new(AtomicUsize::new(0)),
            started_tx,
            started,
            open,
            opened,
        }
    }

    fn handler(&self) -> impl Fn(&tasq::Context, &u64) -> Result<(), HandlerError> + use<> {
        let this = self.clone();
        move |_, _| {
            this.runs.fetch_add(1, Ordering::SeqCst);
            let _ = this.started_tx.send(());
            this.opened
                .recv_timeout(HANG_GUARD)
                .expect("the test never let the run through");
            match this.mode.load(Ordering::SeqCst) {
                OK => Ok(()),
                RETRYABLE => {
                    Err(HandlerError::retryable("payments is down").retry_after(Duration::ZERO))
                }
                _ => Err(HandlerError::permanent("a bad request")),
            }
        }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn wait_started(&self, what: &str) {
        self.started
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|_| panic!("{what} never started"));
    }

    fn nothing_started(&self) -> bool {
        self.started.try_recv().is_err()
    }

    fn let_one_through(&self) {
        self.open.send(()).expect("the valve is open");
    }
}

/// The breaker events of a pool, in order.
struct BreakerLog {
    events: Receiver<Event>,
    seen: Vec<BreakerState>,
}

impl BreakerLog {
    /// Waits for the next breaker change (skipping other events) and checks it.
    fn expect(&mut self, state: BreakerState) {
        loop {
            match self.events.recv_timeout(HANG_GUARD) {
                Ok(Event::Breaker {
                    downstream,
                    state: got,
                }) => {
                    assert_eq!(downstream, "payments");
                    self.seen.push(got);
                    assert_eq!(got, state, "breaker changes so far: {:?}", self.seen);
                    return;
                }
                Ok(_) => {}
                Err(_) => panic!("no breaker change to {state}; so far {:?}", self.seen),
            }
        }
    }

    /// Every change, once the pool has shut down (which delivers every event first).
    fn all(mut self) -> Vec<BreakerState> {
        for event in self.events.try_iter() {
            if let Event::Breaker { state, .. } = event {
                self.seen.push(state);
            }
        }
        self.seen
    }
}

/// A two-worker pool on a manual clock whose "payments" breaker opens after `failures` and
/// cools down for `cool_down`; `CHARGE` and `REFUND` call it, each run at most `attempts` times.
fn payments(
    builder: TestBuilder,
    failures: u32,
    cool_down: Duration,
    attempts: u32,
    down: &Downstream,
) -> (TestPool, ManualClock, BreakerLog) {
    let clock = ManualClock::new();
    let (builder, events) = builder
        .workers(2)
        .manual_clock(clock.clone())
        .breaker("payments", Breaker::new(failures, cool_down))
        .events();
    let options = TypeOptions::new()
        .downstream("payments")
        .max_attempts(attempts);
    let pool = builder
        .register_with(CHARGE, options, down.handler())
        .register_with(REFUND, options, down.handler())
        .register(OTHER, |_, n: &u64| Ok::<_, HandlerError>(n * 2))
        .build();
    let log = BreakerLog {
        events,
        seen: Vec::new(),
    };
    (pool, clock, log)
}

/// Runs one `CHARGE` to its end, failing it or not.
fn charge(pool: &TestPool, down: &Downstream, mode: u8) -> Outcome<()> {
    down.set(mode);
    down.let_one_through();
    let handle = pool.submit(CHARGE.task(0)).unwrap();
    down.wait_started("a charge");
    finish(&handle)
}

/// Runs an `OTHER` task at priority 0 and waits for it: it runs only once a worker has popped
/// past every ready task of higher priority (and held those the breaker holds).
fn run_other(pool: &TestPool, n: u64) {
    let other = pool.submit(OTHER.task(n)).unwrap();
    assert_eq!(finish(&other), Outcome::Succeeded(n * 2));
}

fn attempts<O>(pool: &TestPool, handle: &TaskHandle<O>) -> u32 {
    pool.info(handle.id())
        .expect("the task is remembered")
        .attempts
}

fn breakers(pool: &TestPool) -> Vec<(&'static str, BreakerState)> {
    pool.stats().breakers
}

conformance! {
    fn opens_after_consecutive_failures_holds_its_tasks_and_a_good_probe_closes_it(builder) {
        let down = Downstream::new(OK);
        let (pool, clock, mut log) = payments(builder, 3, Duration::from_secs(10), 1, &down);
        assert_eq!(breakers(&pool), [("payments", BreakerState::Closed)]);

        // Failures count only while consecutive: a success in between starts over.
        assert!(charge(&pool, &down, RETRYABLE).is_failed());
        assert!(charge(&pool, &down, RETRYABLE).is_failed());
        assert!(charge(&pool, &down, OK).is_succeeded());
        assert!(charge(&pool, &down, RETRYABLE).is_failed());
        assert!(charge(&pool, &down, RETRYABLE).is_failed());
        assert_eq!(breakers(&pool), [("payments", BreakerState::Closed)]);
        assert!(charge(&pool, &down, RETRYABLE).is_failed());
        log.expect(BreakerState::Open);
        assert_eq!(breakers(&pool), [("payments", BreakerState::Open)]);
        let runs = down.runs();

        // Open: both types of the downstream wait, ready, without a run or an attempt.
        let held: Vec<_> = (0..4)
            .map(|n| {
                let task = if n % 2 == 0 { CHARGE.task(n) } else { REFUND.task(n) };
                pool.submit(task.priority(5)).unwrap()
            })
            .collect();
        run_other(&pool, 1);
        assert_eq!(down.runs(), runs, "a task ran while the breaker was open");
        for handle in &held {
            assert_eq!(handle.status(), TaskState::Ready);
            assert_eq!(attempts(&pool, handle), 0, "a held task burned an attempt");
        }
        let stats = pool.stats();
        assert_eq!((stats.ready, stats.running), (4, 0), "{stats:?}");
        // Other types keep running.
        for n in 2..50 {
            run_other(&pool, n);
        }

        // Not before the cool-down ends.
        clock.advance(Duration::from_secs(9));
        run_other(&pool, 50);
        assert_eq!(down.runs(), runs);

        // Then exactly one probe.
        down.set(OK);
        clock.advance(Duration::from_secs(1));
        down.wait_started("the probe");
        log.expect(BreakerState::HalfOpen);
        run_other(&pool, 51);
        assert!(down.nothing_started(), "a second task started while the probe ran");
        assert_eq!(down.runs(), runs + 1);
        assert_eq!(breakers(&pool), [("payments", BreakerState::HalfOpen)]);
        let stats = pool.stats();
        assert_eq!((stats.ready, stats.running), (3, 1), "{stats:?}");

        // Its success closes the breaker, and the held tasks run.
        down.let_one_through();
        log.expect(BreakerState::Closed);
        for _ in 0..3 {
            down.let_one_through();
        }
        for handle in &held {
            assert!(finish(handle).is_succeeded());
            assert_eq!(attempts(&pool, handle), 1, "a held task burned an attempt");
        }
        assert_eq!(down.runs(), runs + 4);
        assert_eq!(breakers(&pool), [("payments", BreakerState::Closed)]);
        pool.shutdown(Duration::from_secs(10));
        use BreakerState::*;
        assert_eq!(log.all(), [Open, HalfOpen, Closed]);
    }

    fn a_failed_probe_opens_it_again_for_another_cool_down(builder) {
        let down = Downstream::new(OK);
        let (pool, clock, mut log) = payments(builder, 1, Duration::from_secs(5), 1, &down);
        assert!(charge(&pool, &down, RETRYABLE).is_failed());
        log.expect(BreakerState::Open);
        let held: Vec<_> = (0..3)
            .map(|n| {
                let task = if n == 0 { CHARGE.task(n) } else { REFUND.task(n) };
                pool.submit(task.priority(5)).unwrap()
            })
            .collect();
        run_other(&pool, 1);
        assert_eq!(down.runs(), 1);

        // The probe fails: open again, for a whole cool-down from then.
        clock.advance(Duration::from_secs(5));
        down.wait_started("the first probe");
        log.expect(BreakerState::HalfOpen);
        down.let_one_through();
        log.expect(BreakerState::Open);
        let probe = held
            .iter()
            .position(|h| h.status() != TaskState::Ready)
            .expect("one of them was the probe");
        assert!(finish(&held[probe]).is_failed());
        run_other(&pool, 2);
        assert!(down.nothing_started());
        assert_eq!(breakers(&pool), [("payments", BreakerState::Open)]);
        clock.advance(Duration::from_secs(4));
        run_other(&pool, 3);
        assert!(down.nothing_started(), "a task started before the new cool-down ended");
        assert_eq!(down.runs(), 2);

        // The next probe succeeds: the last one runs too.
        down.set(OK);
        clock.advance(Duration::from_secs(1));
        down.wait_started("the second probe");
        log.expect(BreakerState::HalfOpen);
        down.let_one_through();
        log.expect(BreakerState::Closed);
        down.let_one_through();
        for (i, handle) in held.iter().enumerate() {
            if i != probe {
                assert!(finish(handle).is_succeeded());
                assert_eq!(attempts(&pool, handle), 1);
            }
        }
        pool.shutdown(Duration::from_secs(10));
        use BreakerState::*;
        assert_eq!(log.all(), [Open, HalfOpen, Open, HalfOpen, Closed]);
    }

    fn a_probe_that_says_nothing_lets_another_probe_run(builder) {
        let down = Downstream::new(OK);
        let (pool, clock, mut log) = payments(builder, 1, Duration::from_secs(5), 1, &down);
        assert!(charge(&pool, &down, RETRYABLE).is_failed());
        log.expect(BreakerState::Open);
        let held: Vec<_> = (0..3)
            .map(|n| pool.submit(CHARGE.task(n).priority(5)).unwrap())
            .collect();
        run_other(&pool, 1);
        clock.advance(Duration::from_secs(5));
        down.wait_started("the first probe");
        log.expect(BreakerState::HalfOpen);
        // A permanent error says nothing about the downstream: still half-open, and another
        // task may probe, with no further cool-down.
        down.set(PERMANENT);
        down.let_one_through();
        down.wait_started("the second probe");
        run_other(&pool, 2);
        assert!(down.nothing_started(), "two probes at once");
        assert_eq!(breakers(&pool), [("payments", BreakerState::HalfOpen)]);
        down.set(OK);
        down.let_one_through();
        log.expect(BreakerState::Closed);
        down.let_one_through();
        let outcomes: Vec<_> = held.iter().map(finish).collect();
        assert_eq!(outcomes.iter().filter(|o| o.is_failed()).count(), 1, "{outcomes:?}");
        assert_eq!(outcomes.iter().filter(|o| o.is_succeeded()).count(), 2, "{outcomes:?}");
        pool.shutdown(Duration::from_secs(10));
        use BreakerState::*;
        assert_eq!(log.all(), [Open, HalfOpen, Closed]);
    }

    fn a_retry_held_by_an_open_breaker_keeps_its_attempts(builder) {
        let down = Downstream::new(RETRYABLE);
        let (pool, clock, mut log) = payments(builder, 1, Duration::from_secs(10), 3, &down);
        down.let_one_through();
        let handle = pool.submit(CHARGE.task(7).priority(5)).unwrap();
        down.wait_started("the first attempt");
        log.expect(BreakerState::Open);
        // Its retry is due at once, and held: one attempt, however long the breaker stays open.
        run_other(&pool, 1);
        assert_eq!(handle.status(), TaskState::Ready);
        assert_eq!(attempts(&pool, &handle), 1);
        clock.advance(Duration::from_secs(9));
        run_other(&pool, 2);
        assert_eq!(attempts(&pool, &handle), 1);
        down.set(OK);
        down.let_one_through();
        clock.advance(Duration::from_secs(1));
        assert!(finish(&handle).is_succeeded());
        assert_eq!(attempts(&pool, &handle), 2);
        log.expect(BreakerState::HalfOpen);
        log.expect(BreakerState::Closed);
    }
}

/// The embedded store cancels what an open breaker holds at shutdown, like any ready task (the
/// durable store leaves its queued tasks in the database).
#[test]
fn embedded_shutdown_cancels_what_an_open_breaker_holds() {
    let builder = TestBuilder::new(Store::Memory).expect("the embedded store always runs");
    let down = Downstream::new(OK);
    let (pool, _clock, mut log) = payments(builder, 1, Duration::from_secs(60), 1, &down);
    assert!(charge(&pool, &down, RETRYABLE).is_failed());
    log.expect(BreakerState::Open);
    let held: Vec<_> = (0..3)
        .map(|n| pool.submit(CHARGE.task(n).priority(5)).unwrap())
        .collect();
    run_other(&pool, 1);
    let report = pool.shutdown(Duration::ZERO);
    assert_eq!(report.cancelled, 3);
    for handle in &held {
        assert!(finish(handle).is_cancelled());
        assert_eq!(attempts(&pool, handle), 0);
    }
    assert_eq!(down.runs(), 1);
}
