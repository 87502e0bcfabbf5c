//! A deep queue: with the only worker held by a gate task, fill the queue to 100,000 and to
//! 1,000,000 tasks, submit one more, then drain it. One iteration is that whole round; criterion's
//! throughput is per queued task. `cargo bench --bench report` splits the round into the single
//! submit at depth, the fill and the drain.

mod common;

use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

use common::{Kind, PROBE, Pool};

/// Fills the held pool to `depth`, submits one more, opens the gate and waits for the drain.
fn round(pool: &Pool, depth: usize) -> Duration {
    PROBE.close_gate();
    pool.gate();
    PROBE.wait_held();
    PROBE.arm(depth + 1);
    let start = Instant::now();
    for _ in 0..=depth {
        pool.count();
    }
    PROBE.open_gate();
    PROBE.wait();
    start.elapsed()
}

fn deep_queue(c: &mut Criterion) {
    let mut group = c.benchmark_group("deep_queue");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(2));
    for depth in [100_000, 1_000_000] {
        group.throughput(Throughput::Elements(depth as u64 + 1));
        for kind in Kind::ALL {
            let pool = Pool::new(kind, 1, "deep");
            group.bench_with_input(BenchmarkId::new(kind.name(), depth), &pool, |b, pool| {
                b.iter_custom(|iters| (0..iters).map(|_| round(pool, depth)).sum());
            });
            pool.close();
        }
    }
    group.finish();
}

criterion_group!(benches, deep_queue);
criterion_main!(benches);
