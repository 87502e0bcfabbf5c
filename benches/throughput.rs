//! Throughput: 1,000,000 empty tasks from one producer, 1, 2, 8 and 64 workers, tasq against its
//! peers; the time from the first submit until every task has run.

mod common;

use std::time::Duration;

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

use common::{Kind, Pool};

const TASKS: usize = 1_000_000;

fn throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("throughput");
    // One iteration is a million tasks: a few seconds per pool and worker count is enough.
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(TASKS as u64));
    for workers in [1, 2, 8, 64] {
        for kind in Kind::ALL {
            let pool = Pool::new(kind, workers, "tput");
            group.bench_with_input(BenchmarkId::new(kind.name(), workers), &pool, |b, pool| {
                b.iter_custom(|iters| (0..iters).map(|_| common::throughput(pool, TASKS)).sum());
            });
            pool.close();
        }
    }
    group.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
