//! Metrics on both stores: `Pool::metrics` counts what ran (runs by outcome per type, dead
//! letters by reason, one histogram entry per run), and `Metrics::to_prometheus` is valid
//! exposition text (every sample under its family's `# TYPE`, label values escaped, histogram
//! buckets cumulative up to `+Inf`). Then the build errors of every setting that makes no sense.

mod support_store;

use std::collections::{HashMap, HashSet};
use std::panic;
use std::time::Duration;

use support_store::{EXPECTED, TestBuilder, finish, silence_expected_panics};
use tasq::{
    Aging, Breaker, BuildError, FailureReason, HandlerError, Metrics, Outcome, Pool, RateLimit,
    RetryPolicy, TaskType, TypeOptions,
};

/// What a task does when it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Behaviour {
    Succeed,
    /// Fails with a retryable error on its first attempt, then succeeds.
    RetryOnce,
    /// Fails with a retryable error on every attempt: exhausted after the last.
    AlwaysRetry,
    FailPermanently,
    Panic,
}

/// Every task may run this many times.
const ATTEMPTS: u32 = 3;

const COUNTED: TaskType<Behaviour, ()> = TaskType::new("counted");
/// A name the exposition format must escape: a quote and a backslash.
const WEIRD_NAME: &str = "we\"ird\\type";
const WEIRD: TaskType<Behaviour, ()> = TaskType::new(WEIRD_NAME);

fn run(ctx: &tasq::Context, behaviour: &Behaviour) -> Result<(), HandlerError> {
    match behaviour {
        Behaviour::Succeed => Ok(()),
        Behaviour::RetryOnce if ctx.attempt() == 1 => Err(HandlerError::retryable("once")),
        Behaviour::RetryOnce => Ok(()),
        Behaviour::AlwaysRetry => Err(HandlerError::retryable("again")),
        Behaviour::FailPermanently => Err(HandlerError::permanent("never")),
        Behaviour::Panic => panic!("{EXPECTED} boom"),
    }
}

/// How many tasks of each behaviour a type gets.
struct Mix {
    succeed: u64,
    retry_once: u64,
    always_retry: u64,
    permanent: u64,
    panic: u64,
}

impl Mix {
    fn tasks(&self) -> Vec<Behaviour> {
        let mut tasks = Vec::new();
        for (n, behaviour) in [
            (self.succeed, Behaviour::Succeed),
            (self.retry_once, Behaviour::RetryOnce),
            (self.always_retry, Behaviour::AlwaysRetry),
            (self.permanent, Behaviour::FailPermanently),
            (self.panic, Behaviour::Panic),
        ] {
            tasks.extend((0..n).map(|_| behaviour));
        }
        tasks
    }

    /// (succeeded, retried, failed) runs.
    fn runs(&self) -> (u64, u64, u64) {
        (
            self.succeed + self.retry_once,
            self.retry_once + self.always_retry * u64::from(ATTEMPTS - 1),
            self.always_retry + self.permanent + self.panic,
        )
    }
}

const COUNTED_MIX: Mix = Mix {
    succeed: 5,
    retry_once: 4,
    always_retry: 3,
    permanent: 2,
    panic: 1,
};
const WEIRD_MIX: Mix = Mix {
    succeed: 2,
    retry_once: 1,
    always_retry: 1,
    permanent: 1,
    panic: 0,
};

/// A pool with both types, after running both mixes to the end.
fn ran(builder: TestBuilder) -> support_store::TestPool {
    silence_expected_panics();
    let pool = builder
        .workers(2)
        .max_attempts(ATTEMPTS)
        .retry_policy(RetryPolicy::exponential(Duration::ZERO, Duration::ZERO))
        .quiet_panics(true)
        .register(COUNTED, run)
        .register(WEIRD, run)
        .build();
    let mut handles = Vec::new();
    for behaviour in COUNTED_MIX.tasks() {
        handles.push((behaviour, pool.submit(COUNTED.task(behaviour)).unwrap()));
    }
    for behaviour in WEIRD_MIX.tasks() {
        handles.push((behaviour, pool.submit(WEIRD.task(behaviour)).unwrap()));
    }
    for (behaviour, handle) in &handles {
        let outcome = finish(handle);
        let succeeds = matches!(behaviour, Behaviour::Succeed | Behaviour::RetryOnce);
        assert_eq!(
            outcome == Outcome::Succeeded(()),
            succeeds,
            "{behaviour:?}: {outcome:?}"
        );
    }
    pool
}

// ===== a parser of the exposition format, strict enough to catch what a scraper rejects =====

#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Whether `name` is a valid metric or label name.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses one label set, after its `{`; returns the labels and what follows the `}`.
fn parse_labels(mut rest: &str, line: &str) -> (Vec<(String, String)>, String) {
    let mut labels = Vec::new();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return (labels, after.to_owned());
        }
        let (key, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("a label without =\": {line:?}"));
        assert!(valid_name(key), "the label name {key:?} in {line:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars
                .next()
                .unwrap_or_else(|| panic!("an unterminated label value: {line:?}"));
            match c {
                '"' => break i + 1,
                '\\' => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => panic!("the escape \\{other:?} in {line:?}"),
                },
                '\n' => panic!("a raw newline in a label value: {line:?}"),
                c => value.push(c),
            }
        };
        assert!(
            labels.iter().all(|(k, _)| k != key),
            "the label {key} twice in {line:?}"
        );
        labels.push((key.to_owned(), value));
        rest = &after[end..];
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else {
            assert!(rest.starts_with('}'), "no , or }} after a label: {line:?}");
        }
    }
}

fn parse_value(text: &str, line: &str) -> f64 {
    match text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => text
            .parse()
            .unwrap_or_else(|_| panic!("the value {text:?} in {line:?}")),
    }
}

/// The family a sample belongs to, given the families typed so far.
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    if types.contains_key(name) {
        return name;
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.get(base).is_some_and(|kind| kind == "histogram") {
                return base;
            }
        }
    }
    panic!("the sample {name} has no # TYPE line before it")
}

/// Parses the exposition text, checking what every scraper needs; returns the samples and
/// the families' types.
fn parse(text: &str) -> (Vec<Sample>, HashMap<String, String>) {
    assert!(text.ends_with('\n'), "the text ends with a newline");
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = Vec::new();
    let mut series = HashSet::new();
    // Families whose samples are over: a family's lines must be together.
    let mut done: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        assert!(!line.is_empty(), "an empty line");
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let keyword = parts.next().unwrap();
            let name = parts.next().unwrap_or_else(|| panic!("{line:?}"));
            let rest = parts.next().unwrap_or_else(|| panic!("{line:?}"));
            assert!(valid_name(name), "the metric name in {line:?}");
            match keyword {
                "TYPE" => {
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&rest),
                        "{line:?}"
                    );
                    assert!(
                        types.insert(name.to_owned(), rest.to_owned()).is_none(),
                        "a second # TYPE for {name}"
                    );
                    assert!(
                        !samples.iter().any(|s: &Sample| s.name.starts_with(name)
                            && family_of(&s.name, &types) == name),
                        "# TYPE {name} after its samples"
                    );
                }
                "HELP" => assert!(!rest.contains('\n'), "{line:?}"),
                _ => panic!("an unknown comment: {line:?}"),
            }
            continue;
        }
        let split = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("a sample without a value: {line:?}"));
        let name = &line[..split];
        assert!(valid_name(name), "the metric name in {line:?}");
        let (labels, rest) = if line[split..].starts_with('{') {
            parse_labels(&line[split + 1..], line)
        } else {
            (Vec::new(), line[split..].to_owned())
        };
        let value = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no space before the value: {line:?}"));
        assert!(
            !value.contains(' '),
            "a timestamp or junk after the value: {line:?}"
        );
        let value = parse_value(value, line);

        let family = family_of(name, &types).to_owned();
        if current.as_deref() != Some(family.as_str()) {
            assert!(
                !done.contains(&family),
                "the samples of {family} are not together"
            );
            if let Some(previous) = current.replace(family.clone()) {
                done.insert(previous);
            }
        }
        let mut key = labels.clone();
        key.sort();
        assert!(
            series.insert((name.to_owned(), key)),
            "the series {line:?} twice"
        );
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    (samples, types)
}

/// The value of the one sample named `name` with exactly `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && s.labels.len() == labels.len()
                && labels.iter().all(|&(k, v)| s.label(k) == Some(v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name}{labels:?}: {found:?}");
    found[0].value
}

/// Checks every histogram of `samples`: per series, buckets in rising order of `le`,
/// cumulative, ending with `+Inf`, equal to `_count`; a `_sum` beside them. Returns the
/// `_count` of each `type`.
fn check_histograms(samples: &[Sample], family: &str) -> HashMap<String, f64> {
    let mut buckets: HashMap<String, Vec<(f64, f64)>> = HashMap::new();
    let mut counts = HashMap::new();
    let mut sums = HashSet::new();
    for sample in samples {
        let Some(ty) = sample.label("type") else {
            continue;
        };
        let ty = ty.to_owned();
        if sample.name == format!("{family}_bucket") {
            let le = sample.label("le").expect("a bucket has an le");
            buckets
                .entry(ty)
                .or_default()
                .push((parse_value(le, le), sample.value));
        } else if sample.name == format!("{family}_count") {
            counts.insert(ty, sample.value);
        } else if sample.name == format!("{family}_sum") {
            assert!(sample.value >= 0.0);
            sums.insert(ty);
        }
    }
    assert!(!buckets.is_empty(), "no {family} buckets");
    for (ty, buckets) in &buckets {
        for pair in buckets.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{ty}: le not rising: {buckets:?}");
            assert!(
                pair[0].1 <= pair[1].1,
                "{ty}: buckets not cumulative: {buckets:?}"
            );
        }
        let &(last_le, last) = buckets.last().unwrap();
        assert_eq!(last_le, f64::INFINITY, "{ty}: the last bucket is +Inf");
        assert_eq!(Some(&last), counts.get(ty), "{ty}: +Inf equals _count");
        assert!(sums.contains(ty), "{ty}: a _sum");
    }
    assert_eq!(counts.len(), buckets.len());
    counts
}

fn dead_letters(metrics: &Metrics, reason: FailureReason) -> u64 {
    metrics
        .dead_letters_by_reason
        .iter()
        .find(|(r, _)| *r == reason)
        .map_or_else(|| panic!("no count for {reason}"), |&(_, n)| n)
}

conformance! {
    fn the_metrics_count_what_ran(builder) {
        let pool = ran(builder);
        let metrics = pool.metrics();
        let names: Vec<&str> = metrics.types.iter().map(|t| t.backlog.task_type).collect();
        assert_eq!(names, ["counted", WEIRD_NAME], "every type, in registration order");
        for (t, mix) in metrics.types.iter().zip([&COUNTED_MIX, &WEIRD_MIX]) {
            let name = t.backlog.task_type;
            let runs = t.runs;
            assert_eq!((runs.succeeded, runs.retried, runs.failed), mix.runs(), "{name}");
            assert_eq!(runs.timed_out, 0, "{name}");
            let (s, r, f) = mix.runs();
            assert_eq!(t.run_time.count, s + r + f, "{name}: one histogram entry per run");
            assert_eq!(t.run_time.buckets.len(), tasq::RUN_TIME_BUCKETS.len() + 1);
            assert_eq!(t.run_time.buckets.iter().sum::<u64>(), t.run_time.count, "{name}");
            assert_eq!((t.backlog.ready, t.backlog.running), (0, 0), "{name}");
        }
        let both = |f: fn(&Mix) -> u64| f(&COUNTED_MIX) + f(&WEIRD_MIX);
        assert_eq!(dead_letters(&metrics, FailureReason::Permanent), both(|m| m.permanent));
        assert_eq!(dead_letters(&metrics, FailureReason::Panicked), both(|m| m.panic));
        assert_eq!(dead_letters(&metrics, FailureReason::Exhausted), both(|m| m.always_retry));
        for reason in [FailureReason::BadPayload, FailureReason::LeaseExpired, FailureReason::TimedOut] {
            assert_eq!(dead_letters(&metrics, reason), 0, "{reason}");
        }
        let totals = metrics.stats.totals;
        let runs = |i: usize| [&COUNTED_MIX, &WEIRD_MIX][i].runs();
        assert_eq!(totals.submitted, both(|m| m.tasks().len() as u64));
        assert_eq!(totals.succeeded, runs(0).0 + runs(1).0);
        assert_eq!(totals.retried, runs(0).1 + runs(1).1);
        assert_eq!(totals.failed, runs(0).2 + runs(1).2);
        assert_eq!(metrics.stats.dead_letters as u64, totals.failed);
    }

    fn the_prometheus_text_is_valid_exposition_and_agrees_with_the_metrics(builder) {
        let pool = ran(builder);
        let metrics = pool.metrics();
        let text = metrics.to_prometheus();
        let (samples, types) = parse(&text);

        // The escaped name, as a scraper reads it back.
        assert!(
            text.contains("tasq_runs_total{type=\"we\\\"ird\\\\type\",outcome=\"succeeded\"} 3\n"),
            "{text}"
        );
        let type_labels: HashSet<&str> = samples.iter().filter_map(|s| s.label("type")).collect();
        assert_eq!(type_labels, HashSet::from(["counted", WEIRD_NAME]));

        for (t, mix) in metrics.types.iter().zip([&COUNTED_MIX, &WEIRD_MIX]) {
            let ty = t.backlog.task_type;
            let (s, r, f) = mix.runs();
            for (outcome, n) in [("succeeded", s), ("retried", r), ("failed", f)] {
                let labels = [("type", ty), ("outcome", outcome)];
                assert_eq!(value(&samples, "tasq_runs_total", &labels), n as f64, "{ty} {outcome}");
            }
            assert_eq!(value(&samples, "tasq_timeouts_total", &[("type", ty)]), 0.0);
            assert_eq!(value(&samples, "tasq_type_ready_tasks", &[("type", ty)]), 0.0);
        }
        assert_eq!(types.get("tasq_run_seconds").map(String::as_str), Some("histogram"));
        assert_eq!(types.get("tasq_runs_total").map(String::as_str), Some("counter"));
        let counts = check_histograms(&samples, "tasq_run_seconds");
        for t in &metrics.types {
            assert_eq!(counts.get(t.backlog.task_type), Some(&(t.run_time.count as f64)));
        }
        for (reason, n) in [("permanent", 3.0), ("panicked", 1.0), ("exhausted", 4.0), ("timed_out", 0.0)] {
            assert_eq!(value(&samples, "tasq_dead_letters_total", &[("reason", reason)]), n, "{reason}");
        }
        let dead = metrics.stats.dead_letters as f64;
        assert_eq!(value(&samples, "tasq_tasks", &[("state", "dead_letter")]), dead);
        assert_eq!(value(&samples, "tasq_workers", &[]), 2.0);
        assert_eq!(value(&samples, "tasq_stuck_handlers", &[]), 0.0);
        let submitted = metrics.stats.totals.submitted as f64;
        assert_eq!(value(&samples, "tasq_tasks_total", &[("event", "submitted")]), submitted);
    }
}

// ===== settings that make no sense fail the build =====

const JOB: TaskType<(), ()> = TaskType::new("job");

fn job(_: &tasq::Context, _: &()) -> Result<(), HandlerError> {
    Ok(())
}

/// Asserts that `built` failed with `InvalidSetting` for `setting` of `of`, saying `problem`.
#[track_caller]
fn assert_invalid(built: Result<Pool, BuildError>, setting: &str, of: &str, problem: &str) {
    match built {
        Err(error @ BuildError::InvalidSetting { .. }) => {
            let BuildError::InvalidSetting {
                setting: s,
                of: o,
                problem: p,
            } = error
            else {
                unreachable!()
            };
            assert_eq!((s, o), (setting, of));
            assert!(p.contains(problem), "{p:?} should say {problem:?}");
            assert_eq!(error.to_string(), format!("{s} of {o} {p}"));
        }
        Err(other) => panic!("the wrong error: {other}"),
        Ok(_) => panic!("a pool with a bad {setting} of {of} was built"),
    }
}

fn with_options(options: TypeOptions) -> Result<Pool, BuildError> {
    Pool::builder()
        .workers(1)
        .register_with(JOB, options, job)
        .build()
}

#[test]
fn a_zero_concurrency_limit_fails_the_build() {
    let built = with_options(TypeOptions::new().concurrency_limit(0));
    assert_invalid(built, "a concurrency limit", "job", "zero");
    assert!(with_options(TypeOptions::new().concurrency_limit(1)).is_ok());
}

#[test]
fn a_rate_limit_that_is_not_positive_and_finite_or_has_no_burst_fails_the_build() {
    for limit in [
        RateLimit::per_second(0.0),
        RateLimit::per_second(-1.0),
        RateLimit::per_second(f64::NAN),
        RateLimit::per_second(f64::INFINITY),
        RateLimit::per_second(10.0).with_burst(0),
    ] {
        let built = with_options(TypeOptions::new().rate_limit(limit));
        assert_invalid(built, "a rate limit", "job", "positive, finite");
    }
    assert!(with_options(TypeOptions::new().rate_limit(RateLimit::per_second(0.5))).is_ok());
}

#[test]
fn a_breaker_that_opens_after_zero_failures_or_is_set_twice_fails_the_build() {
    let cool_down = Duration::from_secs(1);
    let zero = Pool::builder()
        .workers(1)
        .breaker("db", Breaker::new(0, cool_down))
        .build();
    assert_invalid(zero, "a breaker", "db", "zero failures");
    let twice = Pool::builder()
        .workers(1)
        .breaker("db", Breaker::new(3, cool_down))
        .breaker("db", Breaker::new(3, cool_down))
        .build();
    assert_invalid(twice, "a breaker", "db", "twice");
}

#[test]
fn a_downstream_without_a_breaker_fails_the_build() {
    let built = with_options(TypeOptions::new().downstream("nowhere"));
    assert_invalid(built, "a downstream", "job", "no breaker");
    let with_breaker = Pool::builder()
        .workers(1)
        .breaker("somewhere", Breaker::new(3, Duration::from_secs(1)))
        .register_with(JOB, TypeOptions::new().downstream("somewhere"), job)
        .build();
    assert!(with_breaker.is_ok());
}

#[test]
fn a_zero_timeout_fails_the_build() {
    let built = with_options(TypeOptions::new().timeout(Duration::ZERO));
    assert_invalid(built, "a timeout", "job", "zero");
    assert!(with_options(TypeOptions::new().timeout(Duration::from_nanos(1))).is_ok());
}

#[test]
fn a_zero_monitor_interval_fails_the_build() {
    let built = Pool::builder()
        .workers(1)
        .monitor_interval(Duration::ZERO)
        .build();
    assert_invalid(built, "the monitor interval", "the pool", "zero");
}

#[test]
fn aging_every_zero_seconds_fails_the_build() {
    let built = Pool::builder()
        .workers(1)
        .aging(Aging::new(Duration::ZERO, 5))
        .build();
    assert_invalid(built, "aging", "the pool", "zero");
}
