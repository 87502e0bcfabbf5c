//! Metrics: what the workers count per task type as they run (outcomes, timeouts, a run-time
//! histogram), the [`Metrics`] snapshot that joins them with the pool's [`Stats`], and its
//! rendering in the Prometheus text format.

use std::fmt::{self, Write as _};
use std::time::Duration;

use crate::stats::{Stats, TypeStats};
use crate::store::RunOutcome;
use crate::sync::{AtomicU64, Ordering};
use crate::task::FailureReason;

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

/// How many copies of each type's counters the workers spread over, so that workers on
/// different cores do not fight over one cache line for every run.
const SHARDS: usize = 8;

/// One type's counters (one shard of them), updated by the workers without a lock. Aligned to
/// two cache lines so that neighbouring shards never share one.
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

/// What the workers count, per task type (by registry index), in [`SHARDS`] shards.
pub(crate) struct RunMetrics {
    /// Type `t`'s shard `s` is at `t * SHARDS + s`.
    shards: Vec<TypeRuns>,
    types: usize,
}

impl RunMetrics {
    pub(crate) fn new(types: usize) -> Self {
        RunMetrics {
            shards: (0..types * SHARDS).map(|_| TypeRuns::default()).collect(),
            types,
        }
    }

    /// Counts one run of type `type_index` that took `took` and ended as `outcome`, in the
    /// shard of worker `worker`.
    pub(crate) fn record(
        &self,
        worker: usize,
        type_index: u32,
        outcome: &RunOutcome,
        took: Duration,
        timed_out: bool,
    ) {
        let index = type_index as usize * SHARDS + worker % SHARDS;
        let Some(runs) = self.shards.get(index) else {
            return;
        };
        let counter = match outcome {
            RunOutcome::Succeeded(_) => &runs.succeeded,
            RunOutcome::Retry { .. } => &runs.retried,
            RunOutcome::Failed(_) => &runs.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if timed_out {
            runs.timed_out.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BUCKET_NANOS
            .iter()
            .position(|&bound| nanos <= bound)
            .unwrap_or(BUCKET_NANOS.len());
        runs.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        runs.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Type `type_index`'s counters, its shards added up.
    fn snapshot(&self, type_index: usize) -> (RunCounts, Histogram) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut counts = RunCounts::default();
        let mut buckets = vec![0; BUCKET_NANOS.len() + 1];
        let mut sum_nanos = 0u64;
        let shards = self.shards.iter().skip(type_index * SHARDS).take(SHARDS);
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

/// How long one task type's runs took, in the buckets of [`RUN_TIME_BUCKETS`].
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
        let runs = RunMetrics::new(1);
        let ok = RunOutcome::Succeeded(Box::new(()));
        runs.record(0, 0, &ok, Duration::from_micros(500), false);
        runs.record(1, 0, &ok, Duration::from_millis(1), false);
        runs.record(9, 0, &ok, Duration::from_secs(61), true);
        let (counts, histogram) = runs.snapshot(0);
        assert_eq!((counts.succeeded, counts.timed_out), (3, 1));
        assert_eq!(histogram.buckets[0], 2, "bounds are inclusive");
        assert_eq!(histogram.buckets[14], 1);
        assert_eq!(histogram.count, 3);

        let mut text = Text(String::new());
        text.sample("m", &[("type", "a\"b\\c\nd")], 1u64);
        assert_eq!(text.0, "m{type=\"a\\\"b\\\\c\\nd\"} 1\n");
    }
}
