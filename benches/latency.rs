//! Dispatch latency: from just before a submit to the handler's first instruction, in an open
//! loop (submits paced by the clock, not by completions) at 200/s and 10,000/s, with 10 and 100
//! workers.
//!
//! criterion reports the mean latency per task; the percentiles (p50, p99, p99.9) of every task
//! it ran are printed after each group. `cargo bench --bench report` prints the same percentiles
//! for all pools in one table.

mod common;

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};

use common::{Kind, Pool, percentile};

fn latency(c: &mut Criterion) {
    for rate in [200u32, 10_000] {
        let mut group = c.benchmark_group(format!("latency_{rate}_per_s"));
        // A sample at 200/s takes 5 ms a task: keep each configuration to about two seconds.
        group
            .sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2));
        let mut summary = Vec::new();
        for workers in [10, 100] {
            for kind in Kind::ALL {
                let pool = Pool::new(kind, workers, "lat");
                let mut all: Vec<i64> = Vec::new();
                group.bench_with_input(BenchmarkId::new(kind.name(), workers), &pool, |b, pool| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        let mut left = iters as usize;
                        while left > 0 {
                            let n = left.min(common::MAX_STAMPS);
                            let samples = common::open_loop(pool, f64::from(rate), n);
                            total += samples
                                .iter()
                                .map(|&ns| Duration::from_nanos(ns.max(0) as u64))
                                .sum::<Duration>();
                            all.extend(samples);
                            left -= n;
                        }
                        total
                    });
                });
                pool.close();
                if all.is_empty() {
                    continue; // filtered out on the command line: criterion never ran it
                }
                all.sort_unstable();
                summary.push(format!(
                    "{:>22} {workers:>3} workers: p50 {:>8} ns  p99 {:>8} ns  p99.9 {:>8} ns  (n={})",
                    kind.name(),
                    percentile(&all, 50.0),
                    percentile(&all, 99.0),
                    percentile(&all, 99.9),
                    all.len()
                ));
            }
        }
        group.finish();
        println!("latency at {rate}/s, every task criterion ran:");
        for line in summary {
            println!("  {line}");
        }
    }
}

criterion_group!(benches, latency);
criterion_main!(benches);
