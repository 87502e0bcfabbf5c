//! `cargo bench --bench report`: runs every workload once against tasq and its peers, in one
//! process (memory in fresh child processes), and prints one markdown table of the figures with
//! tasq's ratio to each peer, then the targets met or missed.
//!
//! Progress goes to stderr, the tables to stdout. `TASQ_REPORT_ONLY=latency,burst` runs only
//! the workloads named (throughput, latency, delayed, memory, deep_queue, burst, idle); the
//! throughput workload includes the one with four producers submitting at once.
//! `TASQ_REPORT_ONLY=limits` runs the one workload not in the default run: tasq's throughput
//! with a concurrency limit on its type, beside the same pool without one.
//! `TASQ_REPORT_PROFILE=2` runs only tasq's throughput, with that many workers, on 200,000
//! tasks: for `valgrind --tool=callgrind` or `perf`.

mod common;

use std::env;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Deep, Kind, PROBE, Pool, percentile};

const THROUGHPUT_TASKS: usize = 1_000_000;
const THROUGHPUT_REPS: usize = 3;
/// The producers of the parallel-submit workload, and the tasks each submits.
const PRODUCERS: usize = 4;
const PER_PRODUCER: usize = 250_000;
const MEMORY_TASKS: usize = 1_000_000;
const DELAYED_TASKS: usize = 20_000;
const DELAYED_REPS: usize = 3;
const DELAYED_SPREAD: Duration = Duration::from_millis(500);
const BURST_TASKS: usize = 200;
const BURST_WORKERS: usize = 100;
const BURST_REPS: usize = 30;
/// The child-process switch of the memory workload.
const CHILD: &str = "TASQ_REPORT_MEMORY";

/// How a figure reads.
#[derive(Clone, Copy)]
enum Unit {
    /// Tasks per second: higher is better.
    Rate,
    /// Nanoseconds: lower is better.
    Nanos,
    /// Bytes: lower is better.
    Bytes,
    /// A count: lower is better.
    Count,
}

impl Unit {
    fn format(self, value: f64) -> String {
        match self {
            Unit::Rate if value >= 1e6 => format!("{:.2} M/s", value / 1e6),
            Unit::Rate => format!("{:.0} k/s", value / 1e3),
            Unit::Nanos if value >= 1e6 => format!("{:.2} ms", value / 1e6),
            Unit::Nanos if value >= 1e3 => format!("{:.1} µs", value / 1e3),
            Unit::Nanos => format!("{value:.0} ns"),
            Unit::Bytes | Unit::Count => format!("{value:.0}"),
        }
    }

    fn better(self) -> &'static str {
        match self {
            Unit::Rate => "higher",
            _ => "lower",
        }
    }
}

/// One line of the table: a figure for each pool measured (`None`: not measured for that pool).
struct Row {
    workload: String,
    unit: Unit,
    values: [Option<f64>; 5],
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn add(&mut self, workload: impl Into<String>, unit: Unit, values: [Option<f64>; 5]) {
        let row = Row {
            workload: workload.into(),
            unit,
            values,
        };
        eprintln!(
            "  {}: {}",
            row.workload,
            row.values
                .iter()
                .zip(Kind::ALL)
                .filter_map(|(v, k)| v.map(|v| format!("{} {}", k.name(), unit.format(v))))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.rows.push(row);
    }

    fn get(&self, workload: &str, kind: Kind) -> f64 {
        let row = self
            .rows
            .iter()
            .find(|r| r.workload == workload)
            .unwrap_or_else(|| panic!("no row {workload}"));
        row.values[index(kind)].unwrap_or(f64::NAN)
    }

    fn print(&self) {
        println!(
            "| workload | better | tasq | {} |",
            Kind::ALL[1..]
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(" | ")
        );
        println!("|---|---|---:|---:|---:|---:|---:|");
        for row in &self.rows {
            let ours = row.values[0];
            let mut cells = vec![ours.map_or("—".to_owned(), |v| row.unit.format(v))];
            for value in &row.values[1..] {
                cells.push(match (ours, value) {
                    (_, None) => "—".to_owned(),
                    (Some(ours), Some(peer)) if *peer != 0.0 => {
                        format!("{} (×{:.2})", row.unit.format(*peer), ours / peer)
                    }
                    (_, Some(peer)) => row.unit.format(*peer),
                });
            }
            println!(
                "| {} | {} | {} |",
                row.workload,
                row.unit.better(),
                cells.join(" | ")
            );
        }
    }
}

/// One workload: runs it and adds its rows.
type Workload = fn(&mut Report);

fn index(kind: Kind) -> usize {
    Kind::ALL.iter().position(|&k| k == kind).expect("a kind")
}

/// Runs `f` for each pool kind in `kinds`, filling a row's values.
fn each(kinds: &[Kind], mut f: impl FnMut(Kind) -> f64) -> [Option<f64>; 5] {
    let mut values = [None; 5];
    for &kind in kinds {
        values[index(kind)] = Some(f(kind));
    }
    values
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

fn main() {
    if let Ok(mode) = env::var(CHILD) {
        memory_child(&mode);
        return;
    }
    if let Ok(workers) = env::var("TASQ_REPORT_PROFILE") {
        let workers = workers.parse().expect("TASQ_REPORT_PROFILE=<workers>");
        let pool = Pool::new(Kind::Tasq, workers, "prof");
        let elapsed = common::throughput(&pool, 200_000);
        eprintln!("tasq, {workers} workers, 200,000 tasks: {elapsed:?}");
        pool.close();
        return;
    }

    // `TASQ_REPORT_ONLY=delayed,burst` runs only those workloads (and prints no targets).
    let only = env::var("TASQ_REPORT_ONLY").ok();
    let started = Instant::now();
    let mut report = Report::default();
    let workloads: [(&str, Workload); 7] = [
        ("throughput", throughput),
        ("latency", latency),
        ("delayed", delayed),
        ("memory", memory),
        ("deep_queue", deep_queue),
        ("burst", burst),
        ("idle", idle),
    ];
    for (name, run) in workloads {
        if only
            .as_deref()
            .is_none_or(|only| only.split(',').any(|o| o == name))
        {
            run(&mut report);
        }
    }
    if only
        .as_deref()
        .is_some_and(|only| only.split(',').any(|o| o == "limits"))
    {
        limits();
    }
    let elapsed = started.elapsed();

    println!();
    println!(
        "Each peer cell: the peer's figure (×tasq ÷ peer). `better` says which way a figure is good."
    );
    println!();
    report.print();
    if only.is_none() {
        println!();
        targets(&report);
    }
    println!();
    println!(
        "Machine: {} cores, {}. Whole run: {:.0} s. Timings share the machine with whatever else \
         ran: absolute figures are noisy; ratios come from one run.",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        elapsed.as_secs_f64()
    );
}

// ===== the workloads =====

fn throughput(report: &mut Report) {
    eprintln!(
        "throughput: {THROUGHPUT_TASKS} empty tasks, one producer, median of {THROUGHPUT_REPS}"
    );
    for workers in [1, 2, 8, 64] {
        let values = each(&Kind::ALL, |kind| {
            let pool = Pool::new(kind, workers, "tput");
            common::throughput(&pool, 10_000);
            let runs = (0..THROUGHPUT_REPS)
                .map(|_| common::throughput(&pool, THROUGHPUT_TASKS))
                .collect();
            pool.close();
            THROUGHPUT_TASKS as f64 / median(runs).as_secs_f64()
        });
        report.add(
            format!("throughput, {workers} workers (tasks/s)"),
            Unit::Rate,
            values,
        );
    }
    eprintln!(
        "throughput: {PRODUCERS} producers × {PER_PRODUCER} empty tasks, median of {THROUGHPUT_REPS}"
    );
    for workers in [2, 8] {
        let values = each(&Kind::ALL, |kind| {
            let pool = Pool::new(kind, workers, "tput");
            common::throughput_from(&pool, PRODUCERS, 2_500);
            let runs = (0..THROUGHPUT_REPS)
                .map(|_| common::throughput_from(&pool, PRODUCERS, PER_PRODUCER))
                .collect();
            pool.close();
            (PRODUCERS * PER_PRODUCER) as f64 / median(runs).as_secs_f64()
        });
        report.add(
            format!("throughput, {PRODUCERS} producers, {workers} workers (tasks/s)"),
            Unit::Rate,
            values,
        );
    }
}

/// tasq's throughput with a concurrency limit on the task type: one that never binds (the cost
/// of the check) and one at half the workers (tasks held back and released), beside no limit.
fn limits() {
    eprintln!("limits: {THROUGHPUT_TASKS} empty tasks, one producer, median of {THROUGHPUT_REPS}");
    println!();
    println!("| workers | no limit | limit = workers (never binds) | limit = workers / 2 |");
    println!("|---:|---:|---:|---:|");
    for workers in [2, 64] {
        let pools = [
            Pool::new(Kind::Tasq, workers, "tput"),
            Pool::tasq_limited(workers, workers as u32),
            Pool::tasq_limited(workers, (workers as u32 / 2).max(1)),
        ];
        let rates: Vec<f64> = pools
            .into_iter()
            .map(|pool| {
                common::throughput(&pool, 10_000);
                let runs = (0..THROUGHPUT_REPS)
                    .map(|_| common::throughput(&pool, THROUGHPUT_TASKS))
                    .collect();
                pool.close();
                THROUGHPUT_TASKS as f64 / median(runs).as_secs_f64()
            })
            .collect();
        println!(
            "| {workers} | {:.0}/s | {:.0}/s ({:.2}×) | {:.0}/s ({:.2}×) |",
            rates[0],
            rates[1],
            rates[1] / rates[0],
            rates[2],
            rates[2] / rates[0]
        );
    }
}

fn latency(report: &mut Report) {
    for (rate, secs) in [(200.0, 3.0), (10_000.0, 2.0)] {
        let tasks = (rate * secs) as usize;
        eprintln!("latency: open loop at {rate}/s, {tasks} tasks");
        for workers in [10, 100] {
            let mut p = [[None; 5]; 3];
            for kind in Kind::ALL {
                let pool = Pool::new(kind, workers, "lat");
                common::open_loop(&pool, 10_000.0, 200);
                let mut samples = common::open_loop(&pool, rate, tasks);
                pool.close();
                samples.sort_unstable();
                for (slot, q) in p.iter_mut().zip([50.0, 99.0, 99.9]) {
                    slot[index(kind)] = Some(percentile(&samples, q) as f64);
                }
            }
            for (values, q) in p.into_iter().zip(["p50", "p99", "p99.9"]) {
                report.add(
                    format!("latency {rate}/s, {workers} workers, {q} (n={tasks})"),
                    Unit::Nanos,
                    values,
                );
            }
        }
    }
}

fn delayed(report: &mut Report) {
    eprintln!(
        "delayed: {DELAYED_TASKS} tasks due over 0–{DELAYED_SPREAD:?}, 4 workers, {DELAYED_REPS} runs pooled"
    );
    let kinds = [Kind::Tasq, Kind::Scheduled];
    let mut runs = Vec::new();
    for kind in kinds {
        let pool = Pool::new(kind, 4, "delay");
        common::delayed(&pool, 1_000, Duration::from_millis(20));
        let (mut all, mut settled) = (Vec::new(), Vec::new());
        for _ in 0..DELAYED_REPS {
            let run = common::delayed(&pool, DELAYED_TASKS, DELAYED_SPREAD);
            all.extend(run.all);
            settled.extend(run.after_submits);
        }
        pool.close();
        all.sort_unstable();
        settled.sort_unstable();
        runs.push((kind, all, settled));
    }
    let stat = |after_submits: bool, f: &dyn Fn(&[i64]) -> f64| {
        let mut values = [None; 5];
        for (kind, all, settled) in &runs {
            values[index(*kind)] = Some(f(if after_submits { settled } else { all }));
        }
        values
    };
    let n = DELAYED_TASKS * DELAYED_REPS;
    report.add(
        format!("delayed: early starts (of {n})"),
        Unit::Count,
        stat(false, &|s| s.iter().filter(|&&l| l < 0).count() as f64),
    );
    report.add(
        "delayed: lateness p50",
        Unit::Nanos,
        stat(false, &|s| percentile(s, 50.0) as f64),
    );
    report.add(
        "delayed: lateness p99",
        Unit::Nanos,
        stat(false, &|s| percentile(s, 99.0) as f64),
    );
    report.add(
        "delayed: lateness max",
        Unit::Nanos,
        stat(false, &|s| percentile(s, 100.0) as f64),
    );
    report.add(
        "delayed: lateness p99, tasks due after the last submit",
        Unit::Nanos,
        stat(true, &|s| percentile(s, 99.0) as f64),
    );
}

fn memory(report: &mut Report) {
    eprintln!("memory: {MEMORY_TASKS} queued tasks, RSS delta in a fresh process each");
    let delayed = each(&[Kind::Tasq, Kind::Scheduled], |kind| {
        memory_of(&format!("delayed:{}", kind.name()))
    });
    report.add(
        format!("memory: bytes per delayed task ({MEMORY_TASKS}, unit payload, RSS delta)"),
        Unit::Bytes,
        delayed,
    );
    let ready = each(&Kind::ALL, |kind| {
        memory_of(&format!("ready:{}", kind.name()))
    });
    report.add(
        format!("memory: bytes per ready task ({MEMORY_TASKS} behind a held worker, RSS delta)"),
        Unit::Bytes,
        ready,
    );
    let flowing = each(&Kind::ALL, |kind| {
        memory_of(&format!("flow:{}", kind.name()))
    });
    report.add(
        format!(
            "memory: bytes per ready task ({MEMORY_TASKS} queued, then as many more while one worker runs them; RSS delta ÷ deepest)"
        ),
        Unit::Bytes,
        flowing,
    );
}

/// Runs this binary again in `mode` and reads the bytes per task it prints.
fn memory_of(mode: &str) -> f64 {
    let exe = env::current_exe().expect("current exe");
    let output = Command::new(exe)
        .env(CHILD, mode)
        .output()
        .expect("run the memory child");
    assert!(
        output.status.success(),
        "memory child {mode} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("memory child {mode} printed {text:?}"))
}

/// In a fresh process: queue [`MEMORY_TASKS`] tasks and print the resident memory they added,
/// per task. Exits without dropping them.
fn memory_child(mode: &str) {
    let (queue, name) = mode.split_once(':').expect("queue:pool");
    let kind = *Kind::ALL
        .iter()
        .find(|k| k.name() == name)
        .expect("a pool name");
    let pool = Pool::new(kind, 1, "mem");
    if queue == "ready" || queue == "flow" {
        PROBE.close_gate();
        pool.gate();
        PROBE.wait_held();
    }
    if queue == "flow" {
        // A queue that stays deep while tasks flow through it: every structure the tasks pass
        // through is touched, not only the part a fresh queue fills.
        let armed = usize::MAX / 2;
        PROBE.arm(armed);
        let before = common::resident_bytes();
        for _ in 0..MEMORY_TASKS {
            pool.count();
        }
        PROBE.open_gate();
        for _ in 0..MEMORY_TASKS {
            pool.count();
        }
        let after = common::resident_bytes();
        // Per task of the deepest the queue was (at least the first million: a pool whose
        // worker keeps up with the producer gets shallower, and its high-water mark stays).
        let ran = armed - PROBE.remaining();
        let deepest = MEMORY_TASKS.max(2 * MEMORY_TASKS - ran);
        println!(
            "{:.1}",
            after.saturating_sub(before) as f64 / deepest as f64
        );
        std::process::exit(0);
    }
    let before = common::resident_bytes();
    for _ in 0..MEMORY_TASKS {
        match queue {
            "delayed" => pool.count_after(Duration::from_secs(3600)),
            _ => pool.count(),
        }
    }
    let after = common::resident_bytes();
    println!(
        "{:.1}",
        after.saturating_sub(before) as f64 / MEMORY_TASKS as f64
    );
    // Skip dropping a million tasks: the process ends here.
    std::process::exit(0);
}

fn deep_queue(report: &mut Report) {
    for depth in [100_000, 1_000_000] {
        eprintln!("deep queue: {depth} tasks behind a held worker");
        let results: Vec<(Kind, Deep)> = Kind::ALL
            .iter()
            .map(|&kind| {
                let pool = Pool::new(kind, 1, "deep");
                common::deep_queue(&pool, 1_000);
                let deep = common::deep_queue(&pool, depth);
                pool.close();
                (kind, deep)
            })
            .collect();
        let pick = |f: &dyn Fn(&Deep) -> f64| {
            let mut values = [None; 5];
            for (kind, deep) in &results {
                values[index(*kind)] = Some(f(deep));
            }
            values
        };
        report.add(
            format!(
                "deep queue {depth}: one submit (median of {})",
                common::DEEP_PROBES
            ),
            Unit::Nanos,
            pick(&|d| d.submit.as_nanos() as f64),
        );
        report.add(
            format!("deep queue {depth}: fill, per task"),
            Unit::Nanos,
            pick(&|d| d.fill.as_nanos() as f64 / depth as f64),
        );
        report.add(
            format!("deep queue {depth}: drain, per task"),
            Unit::Nanos,
            pick(&|d| d.drain.as_nanos() as f64 / d.drained as f64),
        );
    }
}

fn burst(report: &mut Report) {
    eprintln!("burst: {BURST_TASKS} tasks to {BURST_WORKERS} idle workers, {BURST_REPS} bursts");
    let mut p50 = [None; 5];
    let mut max = [None; 5];
    for kind in Kind::ALL {
        let pool = Pool::new(kind, BURST_WORKERS, "burst");
        common::burst(&pool, BURST_TASKS);
        let mut runs: Vec<i64> = (0..BURST_REPS)
            .map(|_| {
                // Let every worker go idle again.
                std::thread::sleep(Duration::from_millis(20));
                common::burst(&pool, BURST_TASKS).as_nanos() as i64
            })
            .collect();
        pool.close();
        runs.sort_unstable();
        p50[index(kind)] = Some(percentile(&runs, 50.0) as f64);
        max[index(kind)] = Some(percentile(&runs, 100.0) as f64);
    }
    report.add("burst: until the last start, p50", Unit::Nanos, p50);
    report.add("burst: until the last start, max", Unit::Nanos, max);
}

fn idle(report: &mut Report) {
    eprintln!("idle: 8 workers, voluntary context switches over 1 s");
    let mut counter = 0;
    let mut measure = |kind: Kind, delayed: bool| {
        counter += 1;
        // Thread names are cut to 15 bytes: keep the prefix short and unique per pool.
        let prefix = format!("idle{counter}");
        let pool = Pool::new(kind, 8, &prefix);
        PROBE.arm(1_000);
        for _ in 0..1_000 {
            pool.count();
        }
        PROBE.wait();
        if delayed {
            pool.count_after(Duration::from_secs(3600));
        }
        std::thread::sleep(Duration::from_millis(300));
        let (threads, before) = common::context_switches(&prefix);
        std::thread::sleep(Duration::from_secs(1));
        let (_, after) = common::context_switches(&prefix);
        drop(pool);
        assert_eq!(threads, 8, "{} threads named {prefix}", kind.name());
        after.saturating_sub(before) as f64
    };
    let plain = each(&Kind::ALL, |kind| measure(kind, false));
    let delayed = each(&[Kind::Tasq, Kind::Scheduled], |kind| measure(kind, true));
    report.add(
        "idle, 8 workers: thread wake-ups in 1 s",
        Unit::Count,
        plain,
    );
    report.add(
        "idle, 8 workers, one task due in 1 h: wake-ups in 1 s",
        Unit::Count,
        delayed,
    );
}

// ===== targets =====

fn targets(report: &Report) {
    let tq = |w: &str| report.get(w, Kind::Tasq);
    let peer = |w: &str, k: Kind| report.get(w, k);
    let tp2 = "throughput, 2 workers (tasks/s)";
    let tp64 = "throughput, 64 workers (tasks/s)";
    let mut lines: Vec<(String, String, bool)> = Vec::new();
    let rate = |v: f64| Unit::Rate.format(v);
    lines.push((
        "throughput, 2 workers ≥ threadpool's".into(),
        format!("{} vs {}", rate(tq(tp2)), rate(peer(tp2, Kind::ThreadPool))),
        tq(tp2) >= peer(tp2, Kind::ThreadPool),
    ));
    lines.push((
        "throughput, 2 workers ≥ ½ crossbeam-channel pool's".into(),
        format!(
            "{} vs ½ × {}",
            rate(tq(tp2)),
            rate(peer(tp2, Kind::Channel))
        ),
        tq(tp2) >= 0.5 * peer(tp2, Kind::Channel),
    ));
    lines.push((
        "throughput, 64 workers ≥ 0.8 × our 2-worker figure".into(),
        format!("{} vs 0.8 × {}", rate(tq(tp64)), rate(tq(tp2))),
        tq(tp64) >= 0.8 * tq(tp2),
    ));
    for workers in [2, 8] {
        let w = format!("throughput, {PRODUCERS} producers, {workers} workers (tasks/s)");
        lines.push((
            format!("throughput, {PRODUCERS} producers, {workers} workers ≥ threadpool's"),
            format!("{} vs {}", rate(tq(&w)), rate(peer(&w, Kind::ThreadPool))),
            tq(&w) >= peer(&w, Kind::ThreadPool),
        ));
    }
    let deep = "deep queue 1000000: one submit (median of 101)";
    lines.push((
        "deep queue 1000000: one submit ≤ 2 × crossbeam-channel pool's".into(),
        format!(
            "{} vs 2 × {}",
            Unit::Nanos.format(tq(deep)),
            Unit::Nanos.format(peer(deep, Kind::Channel))
        ),
        tq(deep) <= 2.0 * peer(deep, Kind::Channel),
    ));
    lines.push((
        "throughput, 64 workers ≥ 5 × scheduled-thread-pool's".into(),
        format!(
            "{} vs 5 × {}",
            rate(tq(tp64)),
            rate(peer(tp64, Kind::Scheduled))
        ),
        tq(tp64) >= 5.0 * peer(tp64, Kind::Scheduled),
    ));
    let ns = |v: f64| Unit::Nanos.format(v);
    for workers in [10, 100] {
        let p50 = tq(&format!("latency 200/s, {workers} workers, p50 (n=600)"));
        let p99 = tq(&format!("latency 200/s, {workers} workers, p99 (n=600)"));
        lines.push((
            format!("latency 200/s, {workers} workers: p50 ≤ 50 µs"),
            ns(p50),
            p50 <= 50_000.0,
        ));
        lines.push((
            format!("latency 200/s, {workers} workers: p99 ≤ 250 µs"),
            ns(p99),
            p99 <= 250_000.0,
        ));
    }
    let early = tq(&format!(
        "delayed: early starts (of {})",
        DELAYED_TASKS * DELAYED_REPS
    ));
    lines.push((
        "delayed: never early".into(),
        format!("{early:.0} early"),
        early == 0.0,
    ));
    let late = "delayed: lateness p99";
    lines.push((
        "delayed: p99 lateness ≤ 2 × scheduled-thread-pool's".into(),
        format!(
            "{} vs 2 × {}",
            ns(tq(late)),
            ns(peer(late, Kind::Scheduled))
        ),
        tq(late) <= 2.0 * peer(late, Kind::Scheduled),
    ));
    let p999 = "latency 200/s, 100 workers, p99.9 (n=600)";
    lines.push((
        "latency 200/s, 100 workers: p99.9 ≤ 2 × threadpool's".into(),
        format!(
            "{} vs 2 × {}",
            ns(tq(p999)),
            ns(peer(p999, Kind::ThreadPool))
        ),
        tq(p999) <= 2.0 * peer(p999, Kind::ThreadPool),
    ));
    let burst = "burst: until the last start, max";
    lines.push((
        "burst: max ≤ 2 × threadpool's".into(),
        format!(
            "{} vs 2 × {}",
            ns(tq(burst)),
            ns(peer(burst, Kind::ThreadPool))
        ),
        tq(burst) <= 2.0 * peer(burst, Kind::ThreadPool),
    ));
    let bytes = tq(&format!(
        "memory: bytes per delayed task ({MEMORY_TASKS}, unit payload, RSS delta)"
    ));
    lines.push((
        "memory: ≤ 96 bytes per queued task (delayed)".into(),
        format!("{bytes:.0} B"),
        bytes <= 96.0,
    ));
    let ready = tq(&format!(
        "memory: bytes per ready task ({MEMORY_TASKS} behind a held worker, RSS delta)"
    ));
    lines.push((
        "memory: ≤ 96 bytes per queued task (ready)".into(),
        format!("{ready:.0} B"),
        ready <= 96.0,
    ));
    let flowing = tq(&format!(
        "memory: bytes per ready task ({MEMORY_TASKS} queued, then as many more while one worker runs them; RSS delta ÷ deepest)"
    ));
    lines.push((
        "memory: ≤ 96 bytes per queued task (ready, tasks flowing through)".into(),
        format!("{flowing:.0} B"),
        flowing <= 96.0,
    ));
    let wakes = tq("idle, 8 workers: thread wake-ups in 1 s");
    lines.push((
        "idle pool, nothing delayed: no thread wakes".into(),
        format!("{wakes:.0} wake-ups"),
        wakes == 0.0,
    ));
    println!("| target | tasq | met |");
    println!("|---|---|---|");
    for (target, figure, met) in lines {
        println!(
            "| {target} | {figure} | {} |",
            if met { "yes" } else { "**no**" }
        );
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}
