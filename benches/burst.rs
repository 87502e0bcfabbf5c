//! A burst: 200 tasks at once to 100 idle workers; the time from the first submit until the last
//! task starts.

mod common;

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};

use common::{Kind, Pool};

const TASKS: usize = 200;
const WORKERS: usize = 100;

fn burst(c: &mut Criterion) {
    let mut group = c.benchmark_group("burst");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for kind in Kind::ALL {
        let pool = Pool::new(kind, WORKERS, "burst");
        group.bench_with_input(BenchmarkId::new(kind.name(), TASKS), &pool, |b, pool| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        // Let every worker go idle again (not timed).
                        std::thread::sleep(Duration::from_millis(5));
                        common::burst(pool, TASKS)
                    })
                    .sum()
            });
        });
        pool.close();
    }
    group.finish();
}

criterion_group!(benches, burst);
criterion_main!(benches);
