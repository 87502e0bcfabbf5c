//! Delayed tasks: lateness from the due time to the start, for 20,000 tasks due over 0–500 ms,
//! tasq against scheduled-thread-pool (`execute_after`). A task must never start early.
//!
//! One criterion iteration is one batch of 20,000 tasks, and its figure is the batch's p99
//! lateness. The early starts and the percentiles over every task criterion ran are printed after
//! the group.

mod common;

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};

use common::{Kind, Pool, percentile};

const TASKS: usize = 20_000;
const SPREAD: Duration = Duration::from_millis(500);

fn delayed(c: &mut Criterion) {
    let mut group = c.benchmark_group("delayed");
    // A batch takes the spread (half a second): one batch a sample.
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(5));
    let mut summary = Vec::new();
    for kind in [Kind::Tasq, Kind::Scheduled] {
        let pool = Pool::new(kind, 4, "delay");
        let mut all: Vec<i64> = Vec::new();
        group.bench_with_input(
            BenchmarkId::new(kind.name(), format!("p99_of_{TASKS}")),
            &pool,
            |b, pool| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            let mut batch = common::delayed(pool, TASKS, SPREAD).all;
                            all.extend_from_slice(&batch);
                            batch.sort_unstable();
                            Duration::from_nanos(percentile(&batch, 99.0).max(0) as u64)
                        })
                        .sum()
                });
            },
        );
        pool.close();
        all.sort_unstable();
        summary.push(format!(
            "{:>22}: early {}  p50 {} ns  p99 {} ns  max {} ns  (n={})",
            kind.name(),
            all.iter().filter(|&&l| l < 0).count(),
            percentile(&all, 50.0),
            percentile(&all, 99.0),
            percentile(&all, 100.0),
            all.len()
        ));
    }
    group.finish();
    println!("delayed tasks, every task criterion ran:");
    for line in summary {
        println!("  {line}");
    }
}

criterion_group!(benches, delayed);
criterion_main!(benches);
