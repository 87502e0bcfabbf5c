//! Stress: many tasks from several producers, with retries, failures, panics, delays, dependency
//! chains, cancels at random moments and a shutdown at a random moment; every task must end
//! exactly once, and what the pool reports must match what the handlers did.
//!
//! `TASQ_STRESS_TASKS` sets the number of tasks (default 100,000); `TASQ_STRESS_SEED` replays a
//! run (the seed is printed).

mod support_b;

use support_b::{Rng, mix};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tasq::{
    CancelOutcome, CancelReason, Context, Failure, FailureReason, HandlerError, Outcome, Pool,
    RetryPolicy, SubmitErrorKind, TaskHandle, TaskId, TaskState, TaskType, TypeOptions,
};

const PANIC_MARKER: &str = "tasq stress: expected panic";
const PRODUCERS: u64 = 4;
const CANCELLERS: u64 = 2;
const WORKERS: usize = 8;
/// Tasks come in blocks of this many; the first `CHAIN` of each block form a dependency chain.
const BLOCK: u64 = 25;
const CHAIN: u64 = 5;

/// Pool default: three attempts.
const FAST: TaskType<Job, u64> = TaskType::new("stress-fast");
const FAST_ATTEMPTS: u32 = 3;
/// Registered with its own limit of five attempts.
const PATIENT: TaskType<Job, u64> = TaskType::new("stress-patient");
const PATIENT_ATTEMPTS: u32 = 5;

/// What a task's handler does, decided by its sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Succeed,
    /// Fails (retryably) this many attempts, then succeeds: always fewer than the limit.
    Transient(u32),
    /// Fails retryably every time: dead-lettered as exhausted.
    Exhaust,
    Permanent,
    Panic,
    /// Sleeps on its token a little, then succeeds.
    Slow,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Job {
    seq: u64,
    kind: Kind,
    patient: bool,
}

impl Job {
    fn new(seq: u64) -> Self {
        let h = mix(seq ^ 0x5EED);
        let patient = h & 1 == 1;
        let limit = if patient {
            PATIENT_ATTEMPTS
        } else {
            FAST_ATTEMPTS
        };
        let kind = match (h >> 8) % 1000 {
            0..700 => Kind::Succeed,
            700..800 => Kind::Transient(1 + ((h >> 20) % u64::from(limit - 1)) as u32),
            800..830 => Kind::Exhaust,
            830..880 => Kind::Permanent,
            880..900 => Kind::Panic,
            _ => Kind::Slow,
        };
        Job { seq, kind, patient }
    }

    fn hash(&self) -> u64 {
        mix(self.seq ^ 0xD1CE)
    }

    fn max_attempts(&self) -> u32 {
        if self.patient {
            PATIENT_ATTEMPTS
        } else {
            FAST_ATTEMPTS
        }
    }

    fn task_type(&self) -> TaskType<Job, u64> {
        if self.patient { PATIENT } else { FAST }
    }

    /// One task in twenty waits up to 5 ms first.
    fn delay(&self) -> Option<Duration> {
        let h = self.hash();
        (h % 20 == 0).then(|| Duration::from_micros((h >> 8) % 5_000))
    }

    fn priority(&self) -> u8 {
        ((self.hash() >> 32) % 4) as u8
    }

    /// Whether it depends on the task before it (same producer, same chain).
    fn in_chain(&self) -> bool {
        (1..CHAIN).contains(&(self.seq % BLOCK))
    }
}

/// What the handlers saw of one task.
#[derive(Clone, Copy, Debug)]
struct Runs {
    /// Highest attempt number seen.
    max_attempt: u32,
    /// Handler calls.
    runs: u32,
    /// Logical times of the first and the last handler start.
    first_start: u64,
    last_start: u64,
    /// A handler of this task saw its token fire.
    saw_token: bool,
}

/// The handlers' log, sharded by task id to keep eight workers from queueing on one lock.
struct Recorder {
    shards: Vec<Mutex<HashMap<TaskId, Runs>>>,
    /// A logical clock shared by handler starts and cancels, to order them.
    clock: AtomicU64,
}

impl Recorder {
    fn new() -> Self {
        Recorder {
            shards: (0..64).map(|_| Mutex::new(HashMap::new())).collect(),
            clock: AtomicU64::new(0),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn shard(&self, id: TaskId) -> &Mutex<HashMap<TaskId, Runs>> {
        &self.shards[(id.seq() % 64) as usize]
    }

    fn start(&self, id: TaskId, attempt: u32) {
        let now = self.tick();
        let mut shard = self.shard(id).lock().unwrap();
        let runs = shard.entry(id).or_insert(Runs {
            max_attempt: 0,
            runs: 0,
            first_start: now,
            last_start: now,
            saw_token: false,
        });
        runs.max_attempt = runs.max_attempt.max(attempt);
        runs.runs += 1;
        runs.last_start = now;
    }

    fn saw_token(&self, id: TaskId) {
        if let Some(runs) = self.shard(id).lock().unwrap().get_mut(&id) {
            runs.saw_token = true;
        }
    }

    fn get(&self, id: TaskId) -> Option<Runs> {
        self.shard(id).lock().unwrap().get(&id).copied()
    }
}

fn handle(recorder: &Recorder, ctx: &Context, job: &Job) -> Result<u64, HandlerError> {
    recorder.start(ctx.id(), ctx.attempt());
    let result = match job.kind {
        Kind::Succeed => Ok(job.seq * 2),
        Kind::Transient(fails) if ctx.attempt() <= fails => Err(HandlerError::retryable(format!(
            "transient failure {}",
            ctx.attempt()
        ))),
        Kind::Transient(_) => Ok(job.seq * 2),
        Kind::Exhaust => Err(HandlerError::retryable("always fails")),
        Kind::Permanent => Err(HandlerError::permanent("permanent failure")),
        Kind::Panic => panic!("{PANIC_MARKER} {}", job.seq),
        Kind::Slow => match ctx.sleep(Duration::from_micros(300)) {
            Ok(()) => Ok(job.seq * 2),
            Err(tasq::Cancelled) => Err(HandlerError::retryable("interrupted")),
        },
    };
    if ctx.is_cancelled() {
        recorder.saw_token(ctx.id());
    }
    result
}

/// Keeps the expected panics' messages out of the output; others still print.
fn silence_expected_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied());
        if message.is_some_and(|m| m.contains(PANIC_MARKER)) {
            return;
        }
        default(info);
    }));
}

struct Submitted {
    job: Job,
    handle: TaskHandle<u64>,
    parent: Option<TaskId>,
}

/// What the producers share.
struct Feed<'a> {
    pool: &'a Pool,
    accepted: AtomicUsize,
    /// The shutdown begins once this many tasks have been accepted.
    shutdown_after: usize,
    trigger: Sender<()>,
}

/// Submits the tasks `seqs` in order until the pool refuses one; sends each accepted id to the
/// cancellers.
fn produce(feed: &Feed<'_>, ids: Sender<TaskId>, seqs: std::ops::Range<u64>) -> Vec<Submitted> {
    let mut submitted = Vec::with_capacity((seqs.end - seqs.start) as usize);
    let mut previous: Option<TaskId> = None;
    for seq in seqs {
        let job = Job::new(seq);
        let mut task = job.task_type().task(job).priority(job.priority());
        if let Some(delay) = job.delay() {
            task = task.delay(delay);
        }
        let parent = if job.in_chain() {
            Some(previous.expect("a chain's tasks are submitted in order"))
        } else {
            None
        };
        task = task.after(parent);
        match feed.pool.submit(task) {
            Ok(handle) => {
                previous = Some(handle.id());
                ids.send(handle.id())
                    .expect("the cancellers outlive the producers");
                if feed.accepted.fetch_add(1, Ordering::SeqCst) + 1 == feed.shutdown_after {
                    let _ = feed.trigger.try_send(());
                }
                submitted.push(Submitted {
                    job,
                    handle,
                    parent,
                });
            }
            Err(refused) => {
                assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
                assert_eq!(refused.into_task().into_payload(), job, "not handed back");
                break;
            }
        }
    }
    submitted
}

/// Cancels a random recent task now and then; returns each cancel's result and the logical time
/// right after it returned.
fn cancel_randomly(
    pool: &Pool,
    recorder: &Recorder,
    ids: Receiver<TaskId>,
    seed: u64,
) -> Vec<(TaskId, CancelOutcome, u64)> {
    let mut rng = Rng(seed);
    let mut recent: Vec<TaskId> = Vec::with_capacity(256);
    let mut results = Vec::new();
    let mut cancel = |id: TaskId| {
        let outcome = pool.cancel(id).expect("retention keeps every task");
        results.push((id, outcome, recorder.tick()));
    };
    for (n, id) in ids.iter().enumerate() {
        if recent.len() < 256 {
            recent.push(id);
        } else {
            recent[n % 256] = id;
        }
        if rng.below(16) == 0 {
            cancel(recent[rng.below(recent.len() as u64) as usize]);
        }
    }
    // A last burst once the producers are done, while the pool may still be busy.
    for _ in 0..32 {
        if let Some(&id) = recent.get(rng.below(256) as usize) {
            cancel(id);
        }
    }
    results
}

#[test]
fn every_task_ends_exactly_once_and_the_books_balance() {
    silence_expected_panics();
    let tasks: u64 = std::env::var("TASQ_STRESS_TASKS")
        .ok()
        .map(|n| n.parse().expect("TASQ_STRESS_TASKS is a number"))
        // Miri runs code thousands of times slower: a token run there.
        .unwrap_or(if cfg!(miri) { 200 } else { 100_000 });
    let seed: u64 = std::env::var("TASQ_STRESS_SEED")
        .ok()
        .map(|n| n.parse().expect("TASQ_STRESS_SEED is a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let mut rng = Rng(seed);
    // Whole blocks per producer, so no chain straddles two producers.
    let per_producer = (tasks / PRODUCERS).max(BLOCK) / BLOCK * BLOCK;
    let total = per_producer * PRODUCERS;
    let shutdown_after = (total / 4 + rng.below(total)) as usize;
    // Two times in five the deadline is far enough for a full drain.
    let timeout = [0, 1, 20, 30_000, 30_000][rng.below(5) as usize];
    let timeout = Duration::from_millis(timeout);
    println!(
        "stress: seed {seed}, {total} tasks, shutdown after {shutdown_after} accepted, timeout {timeout:?}"
    );

    let recorder = Arc::new(Recorder::new());
    let pool = Pool::builder()
        .workers(WORKERS)
        .thread_name("tq-stress")
        .seed(seed)
        .max_attempts(FAST_ATTEMPTS)
        .retry_policy(RetryPolicy::exponential(
            Duration::from_millis(1),
            Duration::from_millis(4),
        ))
        .retention(usize::MAX, None)
        .register(FAST, {
            let recorder = Arc::clone(&recorder);
            move |ctx, job: &Job| handle(&recorder, ctx, job)
        })
        .register_with(
            PATIENT,
            TypeOptions::new().max_attempts(PATIENT_ATTEMPTS),
            {
                let recorder = Arc::clone(&recorder);
                move |ctx, job: &Job| handle(&recorder, ctx, job)
            },
        )
        .build()
        .unwrap();

    let started = Instant::now();
    let (ids_tx, ids_rx) = crossbeam_channel::unbounded();
    let (trigger_tx, trigger_rx) = crossbeam_channel::bounded(1);
    let feed = Feed {
        pool: &pool,
        accepted: AtomicUsize::new(0),
        shutdown_after,
        trigger: trigger_tx,
    };
    let (submitted, cancels, report) = thread::scope(|s| {
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (feed, ids) = (&feed, ids_tx.clone());
                s.spawn(move || produce(feed, ids, p * per_producer..(p + 1) * per_producer))
            })
            .collect();
        // The id channel closes, ending the cancellers, once every producer is done.
        drop(ids_tx);
        let cancellers: Vec<_> = (0..CANCELLERS)
            .map(|c| {
                let (pool, recorder, ids) = (&pool, &*recorder, ids_rx.clone());
                let seed = mix(seed ^ (c + 1));
                s.spawn(move || cancel_randomly(pool, recorder, ids, seed))
            })
            .collect();
        let shutdown = s.spawn(|| {
            trigger_rx.recv().expect("a trigger is sent");
            pool.shutdown(timeout)
        });

        let submitted: Vec<Submitted> = producers
            .into_iter()
            .flat_map(|p| p.join().unwrap())
            .collect();
        // Shut down now if the threshold was never reached.
        let _ = feed.trigger.try_send(());
        let cancels: Vec<_> = cancellers
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        (submitted, cancels, shutdown.join().unwrap())
    });
    let elapsed = started.elapsed();

    check(&pool, &recorder, &submitted, &cancels, &report);
    assert_eq!(pool.stats().workers, 0);
    if cfg!(target_os = "linux") {
        support_b::assert_threads_gone("tq-stress");
    }
    let by_kind = |f: fn(&CancelOutcome) -> bool| cancels.iter().filter(|(_, o, _)| f(o)).count();
    println!(
        "stress: {} accepted; cancels: {} before start, {} signalled, {} too late; {report:?}; \
         ran in {elapsed:?}",
        submitted.len(),
        by_kind(|o| *o == CancelOutcome::Cancelled),
        by_kind(|o| *o == CancelOutcome::Signalled),
        by_kind(|o| matches!(o, CancelOutcome::AlreadyFinished(_))),
    );
}

/// Every check of the run, once the pool has shut down.
fn check(
    pool: &Pool,
    recorder: &Recorder,
    submitted: &[Submitted],
    cancels: &[(TaskId, CancelOutcome, u64)],
    report: &tasq::ShutdownReport,
) {
    // Every accepted task reached exactly one terminal state, and every wait returns.
    let outcomes: HashMap<TaskId, (Job, Outcome<u64>, Option<TaskId>)> = submitted
        .iter()
        .map(|s| {
            let outcome = s.handle.try_wait().unwrap_or_else(|| {
                panic!(
                    "{:?} ({:?}) unfinished after shutdown: {}",
                    s.handle.id(),
                    s.job,
                    s.handle.status()
                )
            });
            assert_eq!(s.handle.wait(), outcome);
            (s.handle.id(), (s.job, outcome, s.parent))
        })
        .collect();
    assert_eq!(outcomes.len(), submitted.len(), "an id was given twice");

    let count = |state: TaskState| {
        outcomes
            .values()
            .filter(|(_, outcome, _)| outcome.state() == state)
            .count() as u64
    };
    let (succeeded, failed, cancelled) = (
        count(TaskState::Succeeded),
        count(TaskState::Failed),
        count(TaskState::Cancelled),
    );
    assert_eq!(
        succeeded + failed + cancelled,
        submitted.len() as u64,
        "an outcome outside the three terminal states"
    );
    assert_eq!(
        (report.succeeded, report.failed, report.cancelled),
        (succeeded, failed, cancelled),
        "the report disagrees with the handles"
    );
    let stats = pool.stats();
    assert_eq!(stats.totals.submitted, submitted.len() as u64);
    assert_eq!(
        (stats.blocked, stats.scheduled, stats.ready, stats.running),
        (0, 0, 0, 0),
        "tasks left after shutdown"
    );

    let mut cancels_of: HashMap<TaskId, Vec<(CancelOutcome, u64)>> = HashMap::new();
    for &(id, outcome, at) in cancels {
        cancels_of.entry(id).or_default().push((outcome, at));
    }

    let mut shutdown_cancelled = 0;
    for (&id, (job, outcome, parent)) in &outcomes {
        let runs = recorder.get(id);
        let context = format!("{id:?} {job:?}: {outcome:?}, runs {runs:?}");
        assert_eq!(
            pool.info(id).map(|info| info.attempts),
            Some(runs.map_or(0, |r| r.max_attempt)),
            "the pool counts other attempts than the handlers saw: {context}"
        );
        if let Some(runs) = runs {
            assert!(
                runs.max_attempt <= job.max_attempts(),
                "more attempts than allowed: {context}"
            );
            assert_eq!(
                runs.runs, runs.max_attempt,
                "an attempt ran twice: {context}"
            );
            if runs.saw_token {
                assert!(outcome.is_cancelled(), "token fired, yet {context}");
            }
        }
        let parent_outcome = parent.map(|p| &outcomes[&p].1);
        match outcome {
            Outcome::Succeeded(value) => {
                assert_eq!(*value, job.seq * 2, "{context}");
                let runs = runs.expect("a success ran");
                let attempts = match job.kind {
                    Kind::Succeed | Kind::Slow => 1,
                    Kind::Transient(fails) => fails + 1,
                    _ => panic!("a task meant to fail succeeded: {context}"),
                };
                assert_eq!(runs.max_attempt, attempts, "{context}");
                if let Some(parent) = parent {
                    assert!(
                        parent_outcome.is_some_and(Outcome::is_succeeded),
                        "ran although its parent did not succeed: {context}"
                    );
                    let parent_runs = recorder.get(*parent).expect("the parent ran");
                    assert!(
                        runs.first_start > parent_runs.last_start,
                        "ran before its parent: {context}"
                    );
                }
            }
            Outcome::Failed(failure) => {
                let runs = runs.expect("a failure ran");
                assert_eq!(failure.attempts, runs.max_attempt, "{context}");
                let (reason, attempts) = match job.kind {
                    Kind::Permanent => (FailureReason::Permanent, 1),
                    Kind::Panic => (FailureReason::Panicked, 1),
                    Kind::Exhaust => (FailureReason::Exhausted, job.max_attempts()),
                    _ => panic!("a task meant to succeed failed: {context}"),
                };
                assert_eq!(
                    (failure.reason, failure.attempts),
                    (reason, attempts),
                    "{context}"
                );
                let error = match job.kind {
                    Kind::Permanent => "permanent failure".to_owned(),
                    Kind::Panic => format!("{PANIC_MARKER} {}", job.seq),
                    _ => "always fails".to_owned(),
                };
                assert_eq!(failure.error, error, "{context}");
            }
            Outcome::Cancelled(reason) => match reason {
                CancelReason::Requested => assert!(
                    cancels_of
                        .get(&id)
                        .is_some_and(|c| c.iter().any(|(o, _)| matches!(
                            o,
                            CancelOutcome::Cancelled | CancelOutcome::Signalled
                        ))),
                    "cancelled as requested, but no cancel reached it: {context}"
                ),
                CancelReason::Shutdown => shutdown_cancelled += 1,
                CancelReason::DependencyFailed(p) | CancelReason::DependencyCancelled(p) => {
                    assert_eq!(
                        Some(*p),
                        *parent,
                        "names a task it did not depend on: {context}"
                    );
                    let expected = if matches!(reason, CancelReason::DependencyFailed(_)) {
                        TaskState::Failed
                    } else {
                        TaskState::Cancelled
                    };
                    assert_eq!(
                        parent_outcome.map(Outcome::state),
                        Some(expected),
                        "{context}"
                    );
                    assert!(runs.is_none(), "a blocked task ran: {context}");
                }
                _ => panic!("unknown cancel reason: {context}"),
            },
        }

        for &(cancel, at) in cancels_of.get(&id).into_iter().flatten() {
            match cancel {
                CancelOutcome::Cancelled => {
                    assert_eq!(
                        *outcome,
                        Outcome::Cancelled(CancelReason::Requested),
                        "{context}"
                    );
                    assert!(
                        runs.is_none_or(|r| r.last_start < at),
                        "a handler started after the task was cancelled: {context}"
                    );
                }
                CancelOutcome::Signalled => {
                    assert!(outcome.is_cancelled(), "signalled, yet {context}")
                }
                CancelOutcome::AlreadyFinished(state) => {
                    assert_eq!(state, outcome.state(), "{context}")
                }
                _ => panic!("unknown cancel outcome: {context}"),
            }
        }
    }
    if !report.deadline_reached {
        assert_eq!(shutdown_cancelled, 0, "drained, yet tasks were cancelled");
    }

    // The dead letters are exactly the failed tasks, with the same failures.
    let dead: HashMap<TaskId, (&'static str, Failure)> = pool
        .dead_letters()
        .into_iter()
        .map(|d| (d.id, (d.task_type, d.failure)))
        .collect();
    let failed: HashMap<TaskId, (&'static str, Failure)> = outcomes
        .iter()
        .filter_map(|(&id, (job, outcome, _))| match outcome {
            Outcome::Failed(failure) => Some((id, (job.task_type().name(), failure.clone()))),
            _ => None,
        })
        .collect();
    assert_eq!(dead.len(), failed.len());
    assert!(dead == failed, "the dead letters are not the failed tasks");
}
