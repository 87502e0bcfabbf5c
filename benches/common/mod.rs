//! What the benches share: tasq and the pools it is compared with behind one adapter, the probe
//! every task reports to, and the workloads, each returning the figures it measured.
//!
//! Every pool runs the same work: a task that counts down (throughput, deep queue), a task that
//! stamps how long after a given instant it started (latency, lateness of delayed tasks, bursts),
//! and a gate task that holds a worker until it is opened (deep queue). The tasks report to one
//! process-wide [`Probe`], a `static`, so that a peer's closure captures nothing to clone or
//! drop: no pool pays for a reference count the others do not.

// Each bench target compiles this module and uses a part of it.
#![allow(dead_code)]

use std::fs;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};
use tasq::{HandlerError, TaskType};

// ===== the probe =====

/// The most stamps one run may take (the largest is the delayed workload's 20,000).
pub const MAX_STAMPS: usize = 1 << 16;

/// Where the tasks of every pool report: a countdown whose last tick wakes the waiting bench, one
/// stamp slot per task, and a gate.
pub struct Probe {
    remaining: AtomicUsize,
    done: Mutex<bool>,
    done_cv: Condvar,
    stamps: OnceLock<Box<[AtomicI64]>>,
    /// (a gate task has entered, the gate is open)
    gate: Mutex<(bool, bool)>,
    gate_cv: Condvar,
}

/// The one probe: workloads run one at a time.
pub static PROBE: Probe = Probe {
    remaining: AtomicUsize::new(0),
    done: Mutex::new(true),
    done_cv: Condvar::new(),
    stamps: OnceLock::new(),
    gate: Mutex::new((false, true)),
    gate_cv: Condvar::new(),
};

impl Probe {
    fn stamps(&self) -> &[AtomicI64] {
        self.stamps
            .get_or_init(|| (0..MAX_STAMPS).map(|_| AtomicI64::new(0)).collect())
    }

    /// Expects `tasks` calls of [`count`](Probe::count) or [`stamp`](Probe::stamp).
    pub fn arm(&self, tasks: usize) {
        assert!(tasks > 0);
        let _ = self.stamps();
        *self.done.lock().unwrap() = false;
        self.remaining.store(tasks, Ordering::Release);
    }

    /// One task has run; the last one wakes [`wait`](Probe::wait).
    #[inline]
    pub fn count(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.done.lock().unwrap() = true;
            self.done_cv.notify_all();
        }
    }

    /// Records, in slot `index`, how long after `since` this is (negative: before it); then counts.
    #[inline]
    pub fn stamp(&self, index: u32, since: Instant) {
        let now = Instant::now();
        let nanos = match now.checked_duration_since(since) {
            Some(late) => nanos(late),
            None => -nanos(since - now),
        };
        self.stamps()[index as usize].store(nanos, Ordering::Relaxed);
        self.count();
    }

    /// Tasks armed that have not run yet.
    pub fn remaining(&self) -> usize {
        self.remaining.load(Ordering::Acquire)
    }

    /// Waits until every armed task has run.
    pub fn wait(&self) {
        let mut done = self.done.lock().unwrap();
        while !*done {
            done = self.done_cv.wait(done).unwrap();
        }
    }

    /// The first `n` stamps, in nanoseconds. Call after [`wait`](Probe::wait).
    pub fn take_stamps(&self, n: usize) -> Vec<i64> {
        self.stamps()[..n]
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .collect()
    }

    /// Closes the gate: the next gate task holds its worker until [`open_gate`](Probe::open_gate).
    pub fn close_gate(&self) {
        *self.gate.lock().unwrap() = (false, false);
    }

    /// Run by a gate task.
    pub fn hold(&self) {
        let mut gate = self.gate.lock().unwrap();
        gate.0 = true;
        self.gate_cv.notify_all();
        while !gate.1 {
            gate = self.gate_cv.wait(gate).unwrap();
        }
    }

    /// Waits until a gate task holds its worker.
    pub fn wait_held(&self) {
        let mut gate = self.gate.lock().unwrap();
        while !gate.0 {
            gate = self.gate_cv.wait(gate).unwrap();
        }
    }

    pub fn open_gate(&self) {
        self.gate.lock().unwrap().1 = true;
        self.gate_cv.notify_all();
    }
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

// ===== the pools =====

/// tasq's task types: a unit payload that counts down; a stamp (slot, instant); a gate.
pub const COUNT: TaskType<(), ()> = TaskType::new("count");
pub const STAMP: TaskType<(u32, Instant), ()> = TaskType::new("stamp");
pub const GATE: TaskType<(), ()> = TaskType::new("gate");

/// The pools measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Tasq,
    ThreadPool,
    Rayon,
    Channel,
    Scheduled,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Tasq,
        Kind::ThreadPool,
        Kind::Rayon,
        Kind::Channel,
        Kind::Scheduled,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Tasq => "tasq",
            Kind::ThreadPool => "threadpool",
            Kind::Rayon => "rayon",
            Kind::Channel => "crossbeam-channel",
            Kind::Scheduled => "scheduled-thread-pool",
        }
    }

    /// Whether the pool can run a task at a given time (tasq, scheduled-thread-pool).
    pub fn delays(self) -> bool {
        matches!(self, Kind::Tasq | Kind::Scheduled)
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The plain pool users write themselves: N threads receiving boxed closures from one channel.
pub struct ChannelPool {
    sender: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl ChannelPool {
    pub fn new(workers: usize, name: &str) -> Self {
        let (sender, receiver) = crossbeam_channel::unbounded::<Job>();
        let threads = (0..workers)
            .map(|i| {
                let receiver = receiver.clone();
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        for job in receiver {
                            job();
                        }
                    })
                    .expect("spawn a channel worker")
            })
            .collect();
        ChannelPool {
            sender: Some(sender),
            threads,
        }
    }

    #[inline]
    pub fn execute(&self, job: impl FnOnce() + Send + 'static) {
        self.sender
            .as_ref()
            .expect("open until dropped")
            .send(Box::new(job))
            .expect("workers alive");
    }
}

impl Drop for ChannelPool {
    fn drop(&mut self) {
        drop(self.sender.take());
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One pool of any kind, running the probe's tasks.
pub enum Pool {
    Tasq(tasq::Pool),
    ThreadPool(threadpool::ThreadPool),
    Rayon(rayon::ThreadPool),
    Channel(ChannelPool),
    Scheduled(ScheduledThreadPool),
}

impl Pool {
    /// Starts a pool of `kind` with `workers` threads named after `name`.
    pub fn new(kind: Kind, workers: usize, name: &str) -> Pool {
        match kind {
            Kind::Tasq => Pool::Tasq(
                tasq::Pool::builder()
                    .workers(workers)
                    .thread_name(name)
                    .register(COUNT, |_, _: &()| {
                        PROBE.count();
                        Ok::<_, HandlerError>(())
                    })
                    .register(STAMP, |_, &(index, since): &(u32, Instant)| {
                        PROBE.stamp(index, since);
                        Ok::<_, HandlerError>(())
                    })
                    .register(GATE, |_, _: &()| {
                        PROBE.hold();
                        Ok::<_, HandlerError>(())
                    })
                    .build()
                    .expect("build a tasq pool"),
            ),
            Kind::ThreadPool => {
                Pool::ThreadPool(threadpool::ThreadPool::with_name(name.to_owned(), workers))
            }
            Kind::Rayon => {
                let name = name.to_owned();
                Pool::Rayon(
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(workers)
                        .thread_name(move |i| format!("{name}-{i}"))
                        .build()
                        .expect("build a rayon pool"),
                )
            }
            Kind::Channel => Pool::Channel(ChannelPool::new(workers, name)),
            Kind::Scheduled => Pool::Scheduled(
                ScheduledThreadPool::builder()
                    .num_threads(workers)
                    .thread_name_pattern(&format!("{name}-{{}}"))
                    .on_drop_behavior(OnPoolDropBehavior::DiscardPendingScheduled)
                    .build(),
            ),
        }
    }

    /// A tasq pool whose counting tasks run under a concurrency limit of `limit`.
    pub fn tasq_limited(workers: usize, limit: u32) -> Pool {
        Pool::Tasq(
            tasq::Pool::builder()
                .workers(workers)
                .thread_name("limited")
                .register_with(
                    COUNT,
                    tasq::TypeOptions::new().concurrency_limit(limit),
                    |_, _: &()| {
                        PROBE.count();
                        Ok::<_, HandlerError>(())
                    },
                )
                .build()
                .expect("build a tasq pool"),
        )
    }

    /// Runs `job` on a peer (not tasq: its tasks are typed).
    #[inline]
    fn execute(&self, job: impl FnOnce() + Send + 'static) {
        match self {
            Pool::Tasq(_) => unreachable!("tasq runs typed tasks"),
            Pool::ThreadPool(pool) => pool.execute(job),
            Pool::Rayon(pool) => pool.spawn(job),
            Pool::Channel(pool) => pool.execute(job),
            Pool::Scheduled(pool) => {
                pool.execute(job);
            }
        }
    }

    /// Submits one task that counts down.
    #[inline]
    pub fn count(&self) {
        match self {
            Pool::Tasq(pool) => {
                pool.submit(COUNT.task(())).expect("submit");
            }
            _ => self.execute(|| PROBE.count()),
        }
    }

    /// Submits one task that stamps how long after `since` it started, in slot `index`.
    #[inline]
    pub fn stamp(&self, index: u32, since: Instant) {
        match self {
            Pool::Tasq(pool) => {
                pool.submit(STAMP.task((index, since))).expect("submit");
            }
            _ => self.execute(move || PROBE.stamp(index, since)),
        }
    }

    /// Submits one task to run `delay` from now, stamping its lateness in slot `index`.
    pub fn stamp_after(&self, index: u32, delay: Duration) {
        let at = Instant::now() + delay;
        match self {
            Pool::Tasq(pool) => {
                pool.submit(STAMP.task((index, at)).run_at(at))
                    .expect("submit");
            }
            // It adds `delay` to its own, later, reading of the clock: its due time is at or
            // after `at`, so an early start cannot hide behind this.
            Pool::Scheduled(pool) => {
                pool.execute_after(delay, move || PROBE.stamp(index, at));
            }
            _ => unreachable!("only tasq and scheduled-thread-pool delay tasks"),
        }
    }

    /// Submits one counting task (a unit payload for tasq, a closure capturing nothing for the
    /// peers) due `delay` from now.
    pub fn count_after(&self, delay: Duration) {
        match self {
            Pool::Tasq(pool) => {
                pool.submit(COUNT.task(()).delay(delay)).expect("submit");
            }
            Pool::Scheduled(pool) => {
                pool.execute_after(delay, || PROBE.count());
            }
            _ => unreachable!("only tasq and scheduled-thread-pool delay tasks"),
        }
    }

    /// Submits a task that holds its worker until the probe's gate opens.
    pub fn gate(&self) {
        match self {
            Pool::Tasq(pool) => {
                pool.submit(GATE.task(())).expect("submit");
            }
            _ => self.execute(|| PROBE.hold()),
        }
    }

    /// Stops the pool and, where the pool allows it, waits for its threads.
    pub fn close(self) {
        match self {
            Pool::Tasq(pool) => {
                pool.shutdown(Duration::from_secs(10));
            }
            Pool::ThreadPool(pool) => pool.join(),
            other => drop(other),
        }
    }
}

// ===== the workloads =====

/// Submits `tasks` counting tasks from this thread; the time from the first submit until the last
/// task has run.
pub fn throughput(pool: &Pool, tasks: usize) -> Duration {
    PROBE.arm(tasks);
    let start = Instant::now();
    for _ in 0..tasks {
        pool.count();
    }
    PROBE.wait();
    start.elapsed()
}

/// Submits `per_producer` counting tasks from each of `producers` threads at once; the time from
/// the start until the last task has run.
pub fn throughput_from(pool: &Pool, producers: usize, per_producer: usize) -> Duration {
    PROBE.arm(producers * per_producer);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..producers {
            s.spawn(|| {
                for _ in 0..per_producer {
                    pool.count();
                }
            });
        }
    });
    PROBE.wait();
    start.elapsed()
}

/// Submits `tasks` stamping tasks at `rate` per second, paced by the clock (an open loop: a slow
/// task does not delay the next submit); each task's latency from just before its submit to its
/// handler's first instruction, in nanoseconds.
pub fn open_loop(pool: &Pool, rate: f64, tasks: usize) -> Vec<i64> {
    assert!(tasks <= MAX_STAMPS);
    PROBE.arm(tasks);
    let period = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    for i in 0..tasks {
        let due = start + period.mul_f64(i as f64);
        let now = Instant::now();
        if due > now {
            // Sleeping, not spinning: a spinning producer would take a core from the workers.
            std::thread::sleep(due - now);
        }
        pool.stamp(i as u32, Instant::now());
    }
    PROBE.wait();
    PROBE.take_stamps(tasks)
}

/// The lateness of delayed tasks (start minus due time; negative: early), in nanoseconds.
pub struct Lateness {
    /// Every task's.
    pub all: Vec<i64>,
    /// Those of the tasks due after the last submit returned: what the timer does with nobody
    /// submitting.
    pub after_submits: Vec<i64>,
}

/// Submits `tasks` delayed tasks, due over `0..spread` in a scrambled order, and measures how
/// late each one starts.
pub fn delayed(pool: &Pool, tasks: usize, spread: Duration) -> Lateness {
    assert!(tasks <= MAX_STAMPS);
    PROBE.arm(tasks);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut due = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let delay = spread.mul_f64(rng.unit());
        due.push(Instant::now() + delay);
        pool.stamp_after(i as u32, delay);
    }
    let submitted = Instant::now();
    PROBE.wait();
    let all = PROBE.take_stamps(tasks);
    let after_submits = all
        .iter()
        .zip(&due)
        .filter(|&(_, &at)| at > submitted)
        .map(|(&late, _)| late)
        .collect();
    Lateness { all, after_submits }
}

/// What a deep queue costs.
#[derive(Clone, Copy, Debug)]
pub struct Deep {
    /// Median time of one submit at the depth (over [`DEEP_PROBES`] submits).
    pub submit: Duration,
    /// Time from opening the gate until every queued task has run.
    pub drain: Duration,
    /// The tasks drained.
    pub drained: usize,
    /// Time to fill the queue to the depth.
    pub fill: Duration,
}

/// Submits timed one at a time at depth.
pub const DEEP_PROBES: usize = 101;

/// With a one-worker `pool` held by a gate task: fills its queue with `depth` counting tasks,
/// times single submits at that depth, then opens the gate and times the drain.
pub fn deep_queue(pool: &Pool, depth: usize) -> Deep {
    PROBE.close_gate();
    pool.gate();
    PROBE.wait_held();
    let total = depth + DEEP_PROBES;
    PROBE.arm(total);
    let fill_start = Instant::now();
    for _ in 0..depth {
        pool.count();
    }
    let fill = fill_start.elapsed();
    let mut submits: Vec<Duration> = (0..DEEP_PROBES)
        .map(|_| {
            let start = Instant::now();
            pool.count();
            start.elapsed()
        })
        .collect();
    submits.sort_unstable();
    let start = Instant::now();
    PROBE.open_gate();
    PROBE.wait();
    Deep {
        submit: submits[DEEP_PROBES / 2],
        drain: start.elapsed(),
        drained: total,
        fill,
    }
}

/// Submits `tasks` stamping tasks at once (the workers should be idle); the time from the first
/// submit until the last task started.
pub fn burst(pool: &Pool, tasks: usize) -> Duration {
    PROBE.arm(tasks);
    let start = Instant::now();
    for i in 0..tasks {
        pool.stamp(i as u32, start);
    }
    PROBE.wait();
    let last = PROBE.take_stamps(tasks).into_iter().max().unwrap_or(0);
    Duration::from_nanos(u64::try_from(last).unwrap_or(0))
}

// ===== measuring =====

/// The nearest-rank percentile `p` (0..=100) of sorted `values`.
pub fn percentile(sorted: &[i64], p: f64) -> i64 {
    assert!(!sorted.is_empty());
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The process's resident memory, in bytes (`VmRSS` of `/proc/self/status`: the resident pages
/// of `/proc/self/statm`, already multiplied by the page size).
pub fn resident_bytes() -> u64 {
    let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .expect("VmRSS in kB")
        * 1024
}

/// The number of this process's threads whose name starts with `prefix`, and the sum of their
/// voluntary context switches.
pub fn context_switches(prefix: &str) -> (usize, u64) {
    let mut threads = 0;
    let mut switches = 0;
    for entry in fs::read_dir("/proc/self/task").expect("read /proc/self/task") {
        let dir = entry.expect("a task entry").path();
        let Ok(comm) = fs::read_to_string(dir.join("comm")) else {
            continue; // the thread exited meanwhile
        };
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let Ok(status) = fs::read_to_string(dir.join("status")) else {
            continue;
        };
        if let Some(n) = status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
        {
            threads += 1;
            switches += n;
        }
    }
    (threads, switches)
}

/// A small deterministic generator (xorshift64*), so every run schedules the same delays.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
