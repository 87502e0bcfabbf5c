//! The conformance harness: one test body, run on each store.
//!
//! A test written with [`conformance!`] gets a [`TestBuilder`] for the embedded store in
//! `memory::<name>` and for PostgreSQL in `postgres::<name>` (feature `postgres`; a schema of
//! its own, see `support_pg`). A `TestBuilder` takes the settings every store shares, and task
//! types whose payloads and outputs are serde values, so the same body builds either pool.
//! Payloads cannot carry channels on the durable store: a [`Gate`] is named by a number that its
//! handler looks up in this process.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tasq::{
    BuildError, Builder, Context, HandlerError, ManualClock, Outcome, Pool, RetryPolicy,
    TaskHandle, TaskType, TypeOptions,
};

#[cfg(feature = "postgres")]
#[path = "../support_pg/mod.rs"]
pub mod support_pg;

/// Panics whose message contains this are expected: [`silence_expected_panics`] keeps them
/// off the test output.
pub const EXPECTED: &str = "[expected panic]";

/// Installs, once per test binary, a panic hook that silences the expected panics and hands
/// every other panic (a failing assertion) to the default hook.
pub fn silence_expected_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            if !message.is_some_and(|m| m.contains(EXPECTED)) {
                default(info);
            }
        }));
    });
}

/// How long a test waits for something that should happen soon before it fails instead of
/// hanging. Never slept: only a bound on waits for signals.
pub const HANG_GUARD: Duration = Duration::from_secs(20);

/// Which store a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Memory,
    Postgres,
}

/// A builder for either store, with the settings they share.
pub enum TestBuilder {
    Memory(Builder),
    #[cfg(feature = "postgres")]
    Postgres(Builder<tasq::postgres::Postgres>, support_pg::TestDb),
}

/// Forwards a setting to whichever builder this is.
macro_rules! forward {
    ($($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            $(#[$meta])*
            pub fn $name(self, $($arg: $ty),*) -> Self {
                match self {
                    TestBuilder::Memory(b) => TestBuilder::Memory(b.$name($($arg),*)),
                    #[cfg(feature = "postgres")]
                    TestBuilder::Postgres(b, db) => TestBuilder::Postgres(b.$name($($arg),*), db),
                }
            }
        )*
    };
}

impl TestBuilder {
    /// A builder on `store`, or `None` if that store cannot run here (no PostgreSQL: the
    /// support code said so loudly, or failed the test under `TASQ_PG_REQUIRED`).
    pub fn new(store: Store) -> Option<TestBuilder> {
        match store {
            Store::Memory => Some(TestBuilder::Memory(Pool::builder())),
            #[cfg(feature = "postgres")]
            Store::Postgres => {
                let db = support_pg::TestDb::new()?;
                let builder = Pool::builder()
                    .postgres(db.url.clone())
                    // Short leases and polls: tests should not wait for fallbacks long.
                    .poll_interval(Duration::from_millis(100));
                Some(TestBuilder::Postgres(builder, db))
            }
            #[cfg(not(feature = "postgres"))]
            Store::Postgres => None,
        }
    }

    /// Which store this builds.
    pub fn store(&self) -> Store {
        match self {
            TestBuilder::Memory(_) => Store::Memory,
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(..) => Store::Postgres,
        }
    }

    forward! {
        fn workers(n: usize);
        fn max_attempts(n: u32);
        fn retry_policy(policy: RetryPolicy);
        fn manual_clock(clock: ManualClock);
        fn seed(seed: u64);
        fn quiet_panics(quiet: bool);
        fn thread_name(name: String);
        fn breaker(name: &'static str, breaker: tasq::Breaker);
        fn aging(aging: tasq::Aging);
        fn alert(alert: tasq::Alert);
        fn stuck_after(grace: Duration);
        fn monitor_interval(interval: Duration);
        fn lifecycle_events(on: bool);
        fn schedule(schedule: tasq::Schedule);
        fn queue(name: &'static str, workers: usize);
    }

    /// Sets how many tasks a durable pool claims ahead of its free workers (the embedded
    /// store has no claims: nothing to set).
    pub fn prefetch(self, tasks: usize) -> Self {
        match self {
            TestBuilder::Memory(b) => TestBuilder::Memory(b),
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(b, db) => TestBuilder::Postgres(b.prefetch(tasks), db),
        }
    }

    /// Sets how many finished tasks the pool remembers, and how long: the builder's on the
    /// embedded store, the schema's policy on the durable store (`usize::MAX`: no count limit).
    pub fn retention(self, max_count: usize, max_age: Option<Duration>) -> Self {
        match self {
            TestBuilder::Memory(b) => TestBuilder::Memory(b.retention(max_count, max_age)),
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(b, db) => {
                let count = (max_count != usize::MAX).then_some(max_count as u64);
                db.change_policy(|p| p.finished_max_count(count).finished_max_age(max_age));
                TestBuilder::Postgres(b, db)
            }
        }
    }

    /// Sets how many dead letters are kept: the builder's on the embedded store, the schema's
    /// policy on the durable store.
    pub fn dead_letter_limit(self, max: usize) -> Self {
        match self {
            TestBuilder::Memory(b) => TestBuilder::Memory(b.dead_letter_limit(max)),
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(b, db) => {
                db.change_policy(|p| p.dead_letter_limit(Some(max as u64)));
                TestBuilder::Postgres(b, db)
            }
        }
    }

    /// Calls `hook` with every event of the pool (see `Builder::on_event`).
    pub fn on_event<F>(self, hook: F) -> Self
    where
        F: FnMut(&tasq::Event) + Send + 'static,
    {
        match self {
            TestBuilder::Memory(b) => TestBuilder::Memory(b.on_event(hook)),
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(b, db) => TestBuilder::Postgres(b.on_event(hook), db),
        }
    }

    /// Runs `hook` on each worker thread before its first claim (see `Builder::on_worker_start`).
    pub fn on_worker_start<F>(self, hook: F) -> Self
    where
        F: Fn(usize) + Send + Sync + 'static,
    {
        match self {
            TestBuilder::Memory(b) => TestBuilder::Memory(b.on_worker_start(hook)),
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(b, db) => TestBuilder::Postgres(b.on_worker_start(hook), db),
        }
    }

    /// Runs `hook` on each worker thread after its last task (see `Builder::on_worker_exit`).
    pub fn on_worker_exit<F>(self, hook: F) -> Self
    where
        F: Fn(usize) + Send + Sync + 'static,
    {
        match self {
            TestBuilder::Memory(b) => TestBuilder::Memory(b.on_worker_exit(hook)),
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(b, db) => TestBuilder::Postgres(b.on_worker_exit(hook), db),
        }
    }

    /// Sends every event of the pool to the returned receiver.
    pub fn events(self) -> (Self, Receiver<tasq::Event>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let builder = self.on_event(move |event: &tasq::Event| {
            let _ = tx.send(event.clone());
        });
        (builder, rx)
    }

    pub fn register<P, O, F>(self, ty: TaskType<P, O>, handler: F) -> Self
    where
        P: Serialize + DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + Sync + 'static,
        F: Fn(&Context, &P) -> Result<O, HandlerError> + Send + Sync + 'static,
    {
        self.register_with(ty, TypeOptions::new(), handler)
    }

    pub fn register_with<P, O, F>(
        self,
        ty: TaskType<P, O>,
        options: TypeOptions,
        handler: F,
    ) -> Self
    where
        P: Serialize + DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + Sync + 'static,
        F: Fn(&Context, &P) -> Result<O, HandlerError> + Send + Sync + 'static,
    {
        match self {
            TestBuilder::Memory(b) => TestBuilder::Memory(b.register_with(ty, options, handler)),
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(b, db) => {
                TestBuilder::Postgres(b.register_with(ty, options, handler), db)
            }
        }
    }

    /// Registers [`GATE`] and [`PROBE`].
    pub fn with_gates(self) -> Self {
        self.register(GATE, gate_handler)
            .register(PROBE, |_, _: &()| Ok::<_, HandlerError>(()))
    }

    pub fn try_build(self) -> Result<TestPool, BuildError> {
        match self {
            TestBuilder::Memory(b) => Ok(TestPool {
                pool: Some(b.build()?),
                store: Store::Memory,
                #[cfg(feature = "postgres")]
                db: None,
            }),
            #[cfg(feature = "postgres")]
            TestBuilder::Postgres(b, db) => Ok(TestPool {
                pool: Some(b.build()?),
                store: Store::Postgres,
                db: Some(db),
            }),
        }
    }

    pub fn build(self) -> TestPool {
        self.try_build().expect("the pool builds")
    }
}

/// A pool under test, with the schema it lives in (dropped after the pool).
pub struct TestPool {
    pool: Option<Pool>,
    store: Store,
    #[cfg(feature = "postgres")]
    db: Option<support_pg::TestDb>,
}

impl TestPool {
    pub fn store(&self) -> Store {
        self.store
    }

    /// A client on the pool's own schema (PostgreSQL only), to look at or change the rows.
    #[cfg(feature = "postgres")]
    pub fn sql(&self) -> Option<postgres::Client> {
        self.db.as_ref().map(support_pg::TestDb::client)
    }

    /// Takes the pool out (to drop it, or move it into a thread); the schema stays until this
    /// is dropped.
    pub fn take(&mut self) -> Pool {
        self.pool.take().expect("the pool is there")
    }
}

impl Deref for TestPool {
    type Target = Pool;

    fn deref(&self) -> &Pool {
        self.pool.as_ref().expect("the pool is there")
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        // The pool first (its threads use the schema), then the schema.
        drop(self.pool.take());
    }
}

/// Instantiates each test body once per store: `memory::name` and `postgres::name`.
#[macro_export]
macro_rules! conformance {
    ($($(#[$meta:meta])* fn $name:ident($builder:ident) $body:block)*) => {
        mod memory {
            #[allow(unused_imports)]
            use super::*;
            $(
                $(#[$meta])*
                #[test]
                fn $name() {
                    let $builder = support_store::TestBuilder::new(support_store::Store::Memory)
                        .expect("the embedded store always runs");
                    $body
                }
            )*
        }

        #[cfg(feature = "postgres")]
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $(
                $(#[$meta])*
                #[test]
                fn $name() {
                    let Some($builder) =
                        support_store::TestBuilder::new(support_store::Store::Postgres)
                    else {
                        return;
                    };
                    $body
                }
            )*
        }
    };
}

// ===== gates: tasks that hold a worker until the test lets them go =====

/// A task that holds its worker until the test opens its [`Gate`]: its handler says when it has
/// started, then blocks until the gate opens (or is dropped). The payload is the gate's number.
pub const GATE: TaskType<u64, ()> = TaskType::new("gate");

/// A task that does nothing: see [`settle`].
pub const PROBE: TaskType<(), ()> = TaskType::new("probe");

type GateEnds = (Sender<()>, Receiver<()>);

fn gates() -> &'static Mutex<HashMap<u64, GateEnds>> {
    static GATES: OnceLock<Mutex<HashMap<u64, GateEnds>>> = OnceLock::new();
    GATES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The handler of [`GATE`].
pub fn gate_handler(_: &Context, number: &u64) -> Result<(), HandlerError> {
    let ends = gates().lock().unwrap().get(number).cloned();
    if let Some((started, open)) = ends {
        // The test may have stopped listening (it failed): nothing to do about it here.
        let _ = started.send(());
        // `Err` means the gate was dropped, which opens it too.
        let _ = open.recv();
    }
    Ok(())
}

/// The test's side of a gate.
#[derive(Debug)]
pub struct Gate {
    number: u64,
    started: Receiver<()>,
    open: Option<Sender<()>>,
}

impl Gate {
    /// A new gate; submit `GATE.task(gate.number())`.
    pub fn new() -> Gate {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let (started_tx, started_rx) = crossbeam_channel::unbounded();
        let (open_tx, open_rx) = crossbeam_channel::bounded(1);
        gates()
            .lock()
            .unwrap()
            .insert(number, (started_tx, open_rx));
        Gate {
            number,
            started: started_rx,
            open: Some(open_tx),
        }
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    /// Blocks until the gate's handler runs (so it holds a worker).
    pub fn wait_started(&self) {
        self.started
            .recv_timeout(HANG_GUARD)
            .expect("the gate task never started");
    }

    /// Whether the gate's handler has started (and has not been waited for).
    #[allow(dead_code)]
    pub fn started(&self) -> bool {
        self.started.try_recv().is_ok()
    }

    /// Lets the gate's handler return.
    pub fn open(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if let Some(open) = self.open.take() {
            let _ = open.send(());
        }
        gates().lock().unwrap().remove(&self.number);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}

/// Returns once the store has applied its retention limits, at the pool's current time, to
/// every task that finished before the call.
///
/// The embedded store applies them as each task finishes: nothing to wait for. The durable
/// store's cleaner runs in the background: this plants a finished row older than any other
/// (finished at the epoch: the first to go by age, and by count) and waits until a pass of the
/// cleaner has deleted it. That pass looked at every row the plant's insert saw.
pub fn settle_retention(pool: &TestPool) {
    match pool.store() {
        Store::Memory => {}
        #[cfg(feature = "postgres")]
        Store::Postgres => {
            use std::time::Instant;

            let mut sql = pool.sql().expect("a durable pool has a schema");
            let plant: i64 = sql
                .query_one(
                    "INSERT INTO tasq_tasks (type, priority, status, max_attempts, finished_at)
                     VALUES ('retention-plant', 0, 'succeeded', 1, TIMESTAMPTZ 'epoch')
                     RETURNING id",
                    &[],
                )
                .expect("plant a finished row")
                .get(0);
            let give_up = Instant::now() + HANG_GUARD;
            loop {
                let left: i64 = sql
                    .query_one("SELECT count(*) FROM tasq_tasks WHERE id = $1", &[&plant])
                    .expect("look for the planted row")
                    .get(0);
                if left == 0 {
                    return;
                }
                assert!(
                    Instant::now() < give_up,
                    "the cleaner deleted no row past retention within {HANG_GUARD:?}"
                );
                // Paces the poll (the cleaner runs about once a second): the loop checks the
                // row, the sleep orders nothing.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        #[cfg(not(feature = "postgres"))]
        Store::Postgres => unreachable!("no durable pool without the postgres feature"),
    }
}

/// Submits a [`PROBE`] and waits for it: with one worker, once it has finished, the worker has
/// also finished whatever it was doing before.
pub fn settle(pool: &Pool) {
    let probe = pool.submit(PROBE.task(())).expect("submit a probe");
    assert!(finish(&probe).is_succeeded(), "the probe did not succeed");
}

/// Runs `wait` on `pool` in a thread of its own and returns its result, failing the test
/// instead of hanging if it has not returned within [`HANG_GUARD`] (real time); a thread that
/// hangs is left behind.
pub fn returns_within<T: Send + 'static>(
    pool: &std::sync::Arc<TestPool>,
    what: &str,
    wait: impl FnOnce(&Pool) -> T + Send + 'static,
) -> T {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let pool = std::sync::Arc::clone(pool);
    std::thread::spawn(move || {
        let _ = tx.send(wait(&pool));
    });
    rx.recv_timeout(HANG_GUARD)
        .unwrap_or_else(|_| panic!("{what} did not return within {HANG_GUARD:?}"))
}

/// Waits for each of `handles` (the tasks of payloads `0..`, whose handlers return their
/// payload) and checks it succeeded with its own.
#[allow(dead_code)]
pub fn assert_all_ran(handles: &[TaskHandle<u32>]) {
    for (i, handle) in handles.iter().enumerate() {
        assert_eq!(
            finish(handle).succeeded(),
            Some(i as u32),
            "{}",
            handle.id()
        );
    }
}

/// Waits for a task's outcome, failing the test instead of hanging.
pub fn finish<O: Clone + 'static>(handle: &TaskHandle<O>) -> Outcome<O> {
    handle
        .wait_timeout(HANG_GUARD)
        .unwrap_or_else(|| panic!("{} did not finish", handle.id()))
}

// ===== signals: a handler tells the test something, by number =====

type SignalEnd = Sender<()>;

fn signals() -> &'static Mutex<HashMap<u64, SignalEnd>> {
    static SIGNALS: OnceLock<Mutex<HashMap<u64, SignalEnd>>> = OnceLock::new();
    SIGNALS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The test's end of a signal that a handler raises with [`raise`]: a payload carries its
/// number, so it works on the durable store too.
#[derive(Debug)]
pub struct Signal {
    number: u64,
    raised: Receiver<()>,
}

impl Signal {
    pub fn new() -> Signal {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = crossbeam_channel::unbounded();
        signals().lock().unwrap().insert(number, tx);
        Signal { number, raised: rx }
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    /// Blocks until the signal is raised (once more), failing the test instead of hanging.
    pub fn wait(&self, what: &str) {
        self.raised
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|_| panic!("{what} never happened"));
    }

    /// Whether it was raised (once more) already, without waiting.
    pub fn try_wait(&self) -> bool {
        self.raised.try_recv().is_ok()
    }
}

impl Drop for Signal {
    fn drop(&mut self) {
        signals().lock().unwrap().remove(&self.number);
    }
}

/// Raises signal `number` (from a handler); nothing if the test dropped it.
pub fn raise(number: u64) {
    let sender = signals().lock().unwrap().get(&number).cloned();
    if let Some(sender) = sender {
        let _ = sender.send(());
    }
}
