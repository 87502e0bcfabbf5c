//! Helpers shared by the cancel, dependencies, shutdown, drop and stress tests.

// Each test crate includes this module and uses only some of it.
#![allow(dead_code)]

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tasq::{HandlerError, Outcome, Pool, SubmitErrorKind, TaskType};

/// How long a test waits for something that should happen at once before it fails instead of
/// hanging.
pub const WAIT: Duration = Duration::from_secs(10);

/// A one-shot gate that handlers block on until the test opens it.
///
/// Built on a channel nobody sends on: opening drops the only sender, which wakes every receiver
/// at once and for good.
#[derive(Clone)]
pub struct Latch {
    sender: Arc<Mutex<Option<Sender<()>>>>,
    receiver: Receiver<()>,
}

impl Latch {
    pub fn new() -> Self {
        let (sender, receiver) = crossbeam_channel::bounded(0);
        Latch {
            sender: Arc::new(Mutex::new(Some(sender))),
            receiver,
        }
    }

    /// Lets every waiter through, now and later.
    pub fn open(&self) {
        self.sender.lock().unwrap().take();
    }

    /// Blocks until the latch is opened. Panics after [`WAIT`], so a test that forgets to open
    /// it fails (the handler's panic becomes a failed task) instead of hanging.
    pub fn wait(&self) {
        match self.receiver.recv_timeout(WAIT) {
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {}
            other => panic!("latch not opened within {WAIT:?}: {other:?}"),
        }
    }
}

impl Default for Latch {
    fn default() -> Self {
        Latch::new()
    }
}

/// Receives one message, failing the test if none comes within [`WAIT`].
#[track_caller]
pub fn recv<T>(receiver: &Receiver<T>, what: &str) -> T {
    receiver
        .recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("{what}: nothing within {WAIT:?} ({e})"))
}

/// A task type no test registers: submitting it tells whether the pool is closed
/// (`ShutDown`, checked first) or still open (`UnknownType`) without ever adding a task.
const PROBE: TaskType<(), ()> = TaskType::new("support_b-unregistered-probe");

/// Whether the pool has stopped accepting tasks. Never adds a task to the pool.
pub fn is_closed(pool: &Pool) -> bool {
    match pool.submit(PROBE.task(())) {
        Err(e) if *e.kind() == SubmitErrorKind::ShutDown => true,
        Err(e) if *e.kind() == SubmitErrorKind::UnknownType(PROBE.name()) => false,
        other => panic!("unexpected answer to the probe: {other:?}"),
    }
}

/// Spins until a `shutdown` running on another thread has closed the pool.
///
/// There is no signal for "shutdown has begun", so this polls the pool itself; the window is the
/// time the other thread takes to reach its first line.
#[track_caller]
pub fn wait_until_closed(pool: &Pool) {
    let give_up = Instant::now() + WAIT;
    while !is_closed(pool) {
        assert!(Instant::now() < give_up, "the pool did not close");
        thread::yield_now();
    }
}

/// How many threads of this process have a name starting with `prefix` (Linux only: reads
/// `/proc/self/task/*/comm`; names there are cut to 15 bytes).
///
/// One listing can miss threads: the kernel ends a listing early when the thread it stands on
/// exits meanwhile (other tests' threads do). So a count can be low, never high; the helpers
/// below poll and confirm.
pub fn threads_named(prefix: &str) -> usize {
    assert!(
        prefix.len() < 13,
        "keep prefixes short: names are cut to 15 bytes"
    );
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// Asserts that exactly `n` threads are named `prefix…`, retrying low counts (see
/// [`threads_named`]) for up to [`WAIT`].
#[track_caller]
pub fn assert_threads_named(prefix: &str, n: usize) {
    let give_up = Instant::now() + WAIT;
    loop {
        let found = threads_named(prefix);
        assert!(found <= n, "{found} threads named {prefix}*, expected {n}");
        if found == n {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "only {found} threads named {prefix}*, expected {n}"
        );
        thread::yield_now();
    }
}

/// Waits until no thread named `prefix…` is left, failing after [`WAIT`].
///
/// A joined thread can still be listed for a moment: the kernel wakes `pthread_join` before it
/// removes the thread's entry. There is no signal for that removal, so this polls; and since one
/// listing can miss threads, it wants several empty listings in a row.
#[track_caller]
pub fn assert_threads_gone(prefix: &str) {
    let give_up = Instant::now() + WAIT;
    let mut empty_in_a_row = 0;
    while empty_in_a_row < 5 {
        let left = threads_named(prefix);
        if left == 0 {
            empty_in_a_row += 1;
        } else {
            empty_in_a_row = 0;
            assert!(
                Instant::now() < give_up,
                "{left} thread(s) named {prefix}* still alive after {WAIT:?}"
            );
        }
        thread::yield_now();
    }
}

/// The outcome once the task has finished; fails the test if it has not finished yet.
#[track_caller]
pub fn finished<O: Clone + Debug + 'static>(handle: &tasq::TaskHandle<O>) -> Outcome<O> {
    handle
        .try_wait()
        .unwrap_or_else(|| panic!("{:?} has not finished ({})", handle.id(), handle.status()))
}

/// The outcome, waiting at most [`WAIT`].
#[track_caller]
pub fn wait<O: Clone + Debug + 'static>(handle: &tasq::TaskHandle<O>) -> Outcome<O> {
    handle
        .wait_timeout(WAIT)
        .unwrap_or_else(|| panic!("{:?} did not finish within {WAIT:?}", handle.id()))
}

/// A handler error for tests.
pub fn retryable(message: &str) -> HandlerError {
    HandlerError::retryable(message.to_owned())
}

/// Sends on its channel when dropped: proves that whatever owns it (a handler closure, hence
/// the pool's registry) has been dropped.
pub struct DropSignal(pub Sender<()>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// splitmix64: a well-mixed hash of `x`, used both as the seeded generator's step and to derive a
/// task's behaviour from its sequence number.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded generator (splitmix64), so that a randomized run replays from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `n / d`.
    pub fn chance(&mut self, n: u64, d: u64) -> bool {
        self.below(d) < n
    }

    pub fn duration_below(&mut self, max: Duration) -> Duration {
        Duration::from_nanos(self.below(max.as_nanos().max(1) as u64))
    }
}
