//! Metrics: what the workers count per task type as they run (outcomes, timeouts, a run-time
//! histogram), the [`Metrics`] snapshot that joins them with the pool's [`Stats`], and its
//! rendering in the Prometheus text format.

use std::fmt::{self, Write as _};
use std::time::{Duration, Instant};

use crate::model::state::FailureReason;
use crate::observe::stats::{Stats, TypeStats};
use crate::sync::{AtomicU64, Ordering};

/// The run-time histogram's bucket bounds, in seconds (the last bucket is unbounded).
pub const RUN_TIME_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The same bounds in nanoseconds, to place a run without floating point.
const BUCKET_NANOS: [u64; 14] = [
    1_000_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
];

/// One type's counters in one worker's shard. Only that worker writes them (a plain load and
/// store, no read-modify-write: nothing to contend on, no locked instruction on the hot path);
/// anyone reads them. Aligned to two cache lines so that two workers' shards never share one,
/// nor a pair of lines that the hardware prefetches together.
#[derive(Default)]
#[repr(align(128))]
struct TypeRuns {
    succeeded: AtomicU64,
    retried: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    /// Per bucket (not cumulative); the last is the unbounded one.
    buckets: [AtomicU64; 15],
    sum_nanos: AtomicU64,
}

/// How a run ended, as the metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Succeeded,
    Retried,
    Failed,
}

/// A finished run, counted by the store once it has read the time the run ended
/// ([`Store::complete_and_claim`](crate::store::Store::complete_and_claim)).
pub(crate) struct RunEnd<'a> {
    pub(crate) metrics: &'a RunMetrics,
    pub(crate) worker: usize,
    pub(crate) type_index: u32,
    pub(crate) ended: Ended,
    pub(crate) timed_out: bool,
    pub(crate) claimed_at: Instant,
}

impl RunEnd<'_> {
    /// Counts the run as ended at `at`, on the pool's clock.
    #[inline]
    pub(crate) fn count(self, at: Instant) {
        let took = at.saturating_duration_since(self.claimed_at);
        self.metrics.record(
            self.worker,
            self.type_index,
            self.ended,
            took,
            self.timed_out,
        );
    }
}

/// Adds `by` to a counter that only the calling worker writes.
fn bump(counter: &AtomicU64, by: u64) {
    let value = counter.load(Ordering::Relaxed);
    counter.store(value.wrapping_add(by), Ordering::Relaxed);
}

/// What the workers count, per task type (by registry index), one shard per worker.
pub(crate) struct RunMetrics {
    /// Worker `w`'s counters of type `t` are at `w * types + t`.
    shards: Vec<TypeRuns>,
    types: usize,
    workers: usize,
}

impl RunMetrics {
    pub(crate) fn new(types: usize, workers: usize) -> Self {
        let workers = workers.max(1);
        RunMetrics {
            shards: (0..types * workers).map(|_| TypeRuns::default()).collect(),
            types,
            workers,
        }
    }

    /// Counts one run of type `type_index` that took `took` and ended as `outcome`, in the
    /// shard of worker `worker`: only that worker's thread may call this with its index.
    #[inline]
    pub(crate) fn record(
        &self,
        worker: usize,
        type_index: u32,
        ended: Ended,
        took: Duration,
        timed_out: bool,
    ) {
        debug_assert!(worker < self.workers, "a shard per worker");
        // Out of range (never, for a worker's index): not counted, not someone else's shard.
        let index = worker * self.types + type_index as usize;
        let Some(runs) = self.shards.get(index).filter(|_| worker < self.workers) else {
            return;
        };
        let counter = match ended {
            Ended::Succeeded => &runs.succeeded,
            Ended::Retried => &runs.retried,
            Ended::Failed => &runs.failed,
        };
        bump(counter, 1);
        if timed_out {
            bump(&runs.timed_out, 1);
        }
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BUCKET_NANOS
            .iter()
            .position(|&bound| nanos <= bound)
            .unwrap_or(BUCKET_NANOS.len());
        bump(&runs.buckets[bucket], 1);
        bump(&runs.sum_nanos, nanos);
    }

    /// Type `type_index`'s counters, its shards added up.
    fn snapshot(&self, type_index: usize) -> (RunCounts, Histogram) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut counts = RunCounts::default();
        let mut buckets = vec![0; BUCKET_NANOS.len() + 1];
        let mut sum_nanos = 0u64;
        let shards = self
            .shards
            .iter()
            .skip(type_index)
            .step_by(self.types.max(1));
        for runs in shards {
            counts.succeeded += load(&runs.succeeded);
            counts.retried += load(&runs.retried);
            counts.failed += load(&runs.failed);
            counts.timed_out += load(&runs.timed_out);
            for (total, bucket) in buckets.iter_mut().zip(&runs.buckets) {
                *total += load(bucket);
            }
            sum_nanos = sum_nanos.saturating_add(load(&runs.sum_nanos));
        }
        let histogram = Histogram {
            count: buckets.iter().sum(),
            buckets,
            sum: Duration::from_nanos(sum_nanos),
        };
        (counts, histogram)
    }
}

impl fmt::Debug for RunMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunMetrics")
            .field("types", &self.types)
            .finish()
    }
}

/// How the runs of one task type in this pool ended. A run is one attempt: a task retried
/// twice and then succeeded counts two `retried` and one `succeeded`.
///
/// # Examples
///
/// See [`Metrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunCounts {
    /// Runs that succeeded.
    pub succeeded: u64,
    /// Runs that failed with attempts left: the task runs again.
    pub retried: u64,
    /// Runs that made their task a dead letter.
    pub failed: u64,
    /// Runs that ran past their type's timeout (also counted as retried or failed).
    pub timed_out: u64,
}

/// How long one task type's runs took, in the buckets of [`RUN_TIME_BUCKETS`]. A run is timed
/// on the pool's clock from the moment a worker claims the task until its outcome is recorded:
/// the handler's time and a few microseconds of the pool's (on a manual clock, the time the
/// test advanced meanwhile).
///
/// # Examples
///
/// See [`Metrics`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Histogram {
    /// Runs per bucket, not cumulative: `buckets[i]` counts the runs that took at most
    /// `RUN_TIME_BUCKETS[i]` seconds and more than the bound before; the last counts the rest.
    pub buckets: Vec<u64>,
    /// Every run's time, added up.
    pub sum: Duration,
    /// Runs.
    pub count: u64,
}

/// One task type's figures in a [`Metrics`] snapshot.
///
/// # Examples
///
/// See [`Metrics`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TypeMetrics {
    /// The type's backlog.
    pub backlog: TypeStats,
    /// How its runs in this pool ended.
    pub runs: RunCounts,
    /// How long its runs in this pool took.
    pub run_time: Histogram,
}

/// A snapshot of everything the pool measures, from [`Pool::metrics`](crate::Pool::metrics):
/// its [`Stats`], per-type backlogs, run counts and run-time histograms, and dead letters by
/// reason. [`to_prometheus`](Metrics::to_prometheus) renders it for a scraper, so a program can
/// serve it from whatever HTTP server it already has.
///
/// Counters count since the pool started, in this process; gauges are the state now (on the
/// durable store, the whole queue's).
///
/// # Examples
///
/// ```
/// use tasq::{HandlerError, Pool, TaskType};
///
/// const JOB: TaskType<u32, u32> = TaskType::new("job");
/// let pool = Pool::builder().workers(1).register(JOB, |_, n: &u32| Ok::<_, HandlerError>(*n)).build()?;
/// pool.submit(JOB.task(1))?.wait();
/// let metrics = pool.metrics();
/// assert_eq!(metrics.types[0].runs.succeeded, 1);
/// assert_eq!(metrics.types[0].run_time.count, 1);
/// let text = metrics.to_prometheus();
/// assert!(text.contains("tasq_runs_total{type=\"job\",outcome=\"succeeded\"} 1\n"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// The pool's counts.
    pub stats: Stats,
    /// Each registered type, in registration order.
    pub types: Vec<TypeMetrics>,
    /// Dead letters this process ended, by reason.
    pub dead_letters_by_reason: Vec<(FailureReason, u64)>,
}

impl Metrics {
    pub(crate) fn new(
        stats: Stats,
        backlogs: Vec<TypeStats>,
        runs: &RunMetrics,
        dead_letters_by_reason: Vec<(FailureReason, u64)>,
    ) -> Metrics {
        let types = backlogs
            .into_iter()
            .enumerate()
            .map(|(index, backlog)| {
                let (runs, run_time) = runs.snapshot(index);
                TypeMetrics {
                    backlog,
                    runs,
                    run_time,
                }
            })
            .collect();
        Metrics {
            stats,
            types,
            dead_letters_by_reason,
        }
    }

    /// The snapshot in the Prometheus text exposition format (version 0.0.4): every metric
    /// named `tasq_*`, with `# HELP` and `# TYPE` lines, ready to serve with the content type
    /// `text/plain; version=0.0.4`.
    ///
    /// # Examples
    ///
    /// See [`Metrics`].
    pub fn to_prometheus(&self) -> String {
        let mut out = Text(String::with_capacity(4096));
        let s = &self.stats;
        out.family("tasq_workers", "gauge", "Worker threads.");
        out.sample("tasq_workers", &[], s.workers);
        out.family("tasq_tasks", "gauge", "Tasks by state, now.");
        for (state, n) in [
            ("blocked", s.blocked),
            ("scheduled", s.scheduled),
            ("ready", s.ready),
            ("running", s.running),
            ("retained", s.retained),
            ("dead_letter", s.dead_letters),
        ] {
            out.sample("tasq_tasks", &[("state", state)], n);
        }
        out.family(
            "tasq_ready_tasks",
            "gauge",
            "Ready tasks by priority (only priorities with ready tasks).",
        );
        for &(p, n) in &s.ready_by_priority {
            out.sample("tasq_ready_tasks", &[("priority", &p.to_string())], n);
        }
        out.family(
            "tasq_oldest_ready_seconds",
            "gauge",
            "How long the oldest ready task of each priority has waited.",
        );
        for &(p, age) in &s.oldest_ready_by_priority {
            out.sample_f64(
                "tasq_oldest_ready_seconds",
                &[("priority", &p.to_string())],
                age.as_secs_f64(),
            );
        }
        out.family(
            "tasq_stuck_handlers",
            "gauge",
            "Handlers running past their timeout and its grace.",
        );
        out.sample("tasq_stuck_handlers", &[], s.stuck);
        out.family(
            "tasq_breaker_state",
            "gauge",
            "Circuit breakers: 1 for the state each is in.",
        );
        for &(name, state) in &s.breakers {
            for candidate in [
                crate::BreakerState::Closed,
                crate::BreakerState::Open,
                crate::BreakerState::HalfOpen,
            ] {
                out.sample(
                    "tasq_breaker_state",
                    &[("downstream", name), ("state", candidate.as_str())],
                    usize::from(state == candidate),
                );
            }
        }
        out.family(
            "tasq_tasks_total",
            "counter",
            "Tasks submitted, and tasks ended by outcome, in this process.",
        );
        let t = &s.totals;
        for (event, n) in [
            ("submitted", t.submitted),
            ("succeeded", t.succeeded),
            ("failed", t.failed),
            ("cancelled", t.cancelled),
            ("retried", t.retried),
        ] {
            out.sample("tasq_tasks_total", &[("event", event)], n);
        }
        out.family(
            "tasq_worker_panics_total",
            "counter",
            "Panics in the engine's own code that a worker survived.",
        );
        out.sample("tasq_worker_panics_total", &[], t.worker_panics);
        out.family(
            "tasq_store_errors_total",
            "counter",
            "Store operations that failed and were retried.",
        );
        out.sample("tasq_store_errors_total", &[], t.store_errors);
        out.family(
            "tasq_lapsed_claims_total",
            "counter",
            "Claims given back unstarted because they waited past their lease.",
        );
        out.sample("tasq_lapsed_claims_total", &[], t.lapsed_claims);
        out.family(
            "tasq_claims_total",
            "counter",
            "Claims the durable store's fetcher ran, by whether they claimed anything.",
        );
        out.sample(
            "tasq_claims_total",
            &[("result", "some")],
            t.claims - t.empty_claims,
        );
        out.sample("tasq_claims_total", &[("result", "empty")], t.empty_claims);
        out.family(
            "tasq_dead_letters_total",
            "counter",
            "Dead letters this process ended, by reason.",
        );
        for &(reason, n) in &self.dead_letters_by_reason {
            out.sample("tasq_dead_letters_total", &[("reason", reason.label())], n);
        }
        out.family("tasq_type_ready_tasks", "gauge", "Ready tasks by type.");
        for t in &self.types {
            let labels = [("type", t.backlog.task_type)];
            out.sample("tasq_type_ready_tasks", &labels, t.backlog.ready);
        }
        out.family("tasq_type_running_tasks", "gauge", "Running tasks by type.");
        for t in &self.types {
            let labels = [("type", t.backlog.task_type)];
            out.sample("tasq_type_running_tasks", &labels, t.backlog.running);
        }
        out.family(
            "tasq_type_oldest_ready_seconds",
            "gauge",
            "How long the oldest ready task of each type has waited (types with ready tasks).",
        );
        for t in &self.types {
            if let Some(age) = t.backlog.oldest_ready {
                let labels = [("type", t.backlog.task_type)];
                out.sample_f64("tasq_type_oldest_ready_seconds", &labels, age.as_secs_f64());
            }
        }
        out.family(
            "tasq_runs_total",
            "counter",
            "Runs (attempts) by type and how they ended, in this process.",
        );
        for t in &self.types {
            for (outcome, n) in [
                ("succeeded", t.runs.succeeded),
                ("retried", t.runs.retried),
                ("failed", t.runs.failed),
            ] {
                let labels = [("type", t.backlog.task_type), ("outcome", outcome)];
                out.sample("tasq_runs_total", &labels, n);
            }
        }
        out.family(
            "tasq_timeouts_total",
            "counter",
            "Runs that ran past their type's timeout.",
        );
        for t in &self.types {
            let labels = [("type", t.backlog.task_type)];
            out.sample("tasq_timeouts_total", &labels, t.runs.timed_out);
        }
        out.family(
            "tasq_run_seconds",
            "histogram",
            "How long runs took, by type.",
        );
        for t in &self.types {
            let name = t.backlog.task_type;
            let mut cumulative = 0;
            for (i, &n) in t.run_time.buckets.iter().enumerate() {
                cumulative += n;
                let le = RUN_TIME_BUCKETS
                    .get(i)
                    .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
                out.sample(
                    "tasq_run_seconds_bucket",
                    &[("type", name), ("le", &le)],
                    cumulative,
                );
            }
            out.sample_f64(
                "tasq_run_seconds_sum",
                &[("type", name)],
                t.run_time.sum.as_secs_f64(),
            );
            out.sample(
                "tasq_run_seconds_count",
                &[("type", name)],
                t.run_time.count,
            );
        }
        out.0
    }
}

/// The exposition text being written.
struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.0.push_str(name);
        if labels.is_empty() {
            return;
        }
        self.0.push('{');
        for (i, (key, value)) in labels.iter().enumerate() {
            if i > 0 {
                self.0.push(',');
            }
            self.0.push_str(key);
            self.0.push_str("=\"");
            // The format's escapes: a label value may hold any text (a type's name).
            for c in value.chars() {
                match c {
                    '\\' => self.0.push_str("\\\\"),
                    '"' => self.0.push_str("\\\""),
                    '\n' => self.0.push_str("\\n"),
                    c => self.0.push(c),
                }
            }
            self.0.push('"');
        }
        self.0.push('}');
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl fmt::Display) {
        self.labels(name, labels);
        let _ = writeln!(self.0, " {value}");
    }

    fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.labels(name, labels);
        let _ = writeln!(self.0, " {value}");
    }
}

#[cfg(all(test, not(tasq_loom)))]
mod tests {
    use super::*;

    #[test]
    fn runs_land_in_their_buckets_and_label_values_are_escaped() {
        let runs = RunMetrics::new(2, 3);
        let ok = Ended::Succeeded;
        runs.record(0, 1, ok, Duration::from_micros(500), false);
        runs.record(1, 1, ok, Duration::from_millis(1), false);
        runs.record(2, 1, ok, Duration::from_secs(61), true);
        runs.record(2, 0, ok, Duration::from_secs(1), false);
        assert_eq!(runs.snapshot(0).0.succeeded, 1, "types apart");
        let (counts, histogram) = runs.snapshot(1);
        assert_eq!((counts.succeeded, counts.timed_out), (3, 1));
        assert_eq!(histogram.buckets[0], 2, "bounds are inclusive");
        assert_eq!(histogram.buckets[14], 1);
        assert_eq!(histogram.count, 3);

        let mut text = Text(String::new());
        text.sample("m", &[("type", "a\"b\\c\nd")], 1u64);
        assert_eq!(text.0, "m{type=\"a\\\"b\\\\c\\nd\"} 1\n");
    }
}
