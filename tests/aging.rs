//! Aging: with `Builder::aging`, a low-priority task overtakes a flood of high-priority work
//! within the bound `Aging` documents; without it, strict priority holds it back for as long
//! as the flood lasts. On both stores.

mod support_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use support_store::{HANG_GUARD, TestBuilder, TestPool, finish};
use tasq::{Aging, HandlerError, ManualClock, TaskState, TaskType};

/// A task of the flood: each one submits the next, so the flood never runs dry.
const FLOOD: TaskType<u64, ()> = TaskType::new("flood");
/// The low-priority task.
const LOW: TaskType<u64, ()> = TaskType::new("low");

/// The flood's priority, and the aging ceiling.
const HIGH: u8 = 9;

/// A one-worker pool on a manual clock. Every run reports what it is (`true`: the low task)
/// and then holds the worker until the test lets it go, so the test moves the clock between
/// two runs and sees each pick the queue makes. Each flood task submits the next while
/// `flooding` holds.
struct Scene {
    pool: TestPool,
    clock: ManualClock,
    started: Receiver<bool>,
    open: Sender<()>,
    flooding: Arc<AtomicBool>,
}

impl Scene {
    fn new(builder: TestBuilder) -> Scene {
        let clock = ManualClock::new();
        let (started_tx, started) = crossbeam_channel::unbounded();
        let (open, opened) = crossbeam_channel::unbounded::<()>();
        let flooding = Arc::new(AtomicBool::new(true));
        let (flood_started, flood_opened) = (started_tx.clone(), opened.clone());
        let keep_flooding = Arc::clone(&flooding);
        // No claim ahead on the durable store: a task claimed ahead waits in the process for
        // its worker, and a flood task submitted after it cannot overtake it there.
        let pool = builder
            .workers(1)
            .prefetch(0)
            .manual_clock(clock.clone())
            .register(FLOOD, move |ctx, n: &u64| {
                if keep_flooding.load(Ordering::SeqCst) {
                    ctx.submit(FLOOD.task(n + 1).priority(HIGH))
                        .map_err(|e| HandlerError::permanent(e.to_string()))?;
                }
                let _ = flood_started.send(false);
                flood_opened.recv_timeout(HANG_GUARD).expect("never let go");
                Ok::<_, HandlerError>(())
            })
            .register(LOW, move |_, _: &u64| {
                let _ = started_tx.send(true);
                opened.recv_timeout(HANG_GUARD).expect("never let go");
                Ok::<_, HandlerError>(())
            })
            .build();
        Scene {
            pool,
            clock,
            started,
            open,
            flooding,
        }
    }

    /// Starts the flood: one flood task holds the worker; then the low task, then a few more
    /// flood tasks, all ready at the same time. Returns the low task.
    fn start(&self) -> tasq::TaskHandle<()> {
        self.pool.submit(FLOOD.task(0).priority(HIGH)).unwrap();
        assert!(!self.next_start(), "the flood starts");
        let low = self.pool.submit(LOW.task(0)).unwrap();
        for n in 100..104 {
            self.pool.submit(FLOOD.task(n).priority(HIGH)).unwrap();
        }
        low
    }

    /// Whether the next task to start is the low one.
    fn next_start(&self) -> bool {
        self.started
            .recv_timeout(HANG_GUARD)
            .expect("the worker started nothing")
    }

    /// Moves the clock by `step`, lets the running task end, and says whether the next one the
    /// worker starts is the low one.
    fn step(&self, step: Duration) -> bool {
        self.clock.advance(step);
        self.open.send(()).unwrap();
        self.next_start()
    }

    /// Ends the flood and lets every task left run to its end.
    fn drain(&self) {
        self.flooding.store(false, Ordering::SeqCst);
        for _ in 0..1000 {
            self.open.send(()).unwrap();
        }
    }
}

conformance! {
    fn with_aging_a_low_task_overtakes_a_flood_within_the_bound(builder) {
        // One level a second up to the flood's priority: a priority-0 task reaches it after
        // 9 s, and from then on nothing that became ready after it runs first. (The durable
        // store ages in a periodic update: its bound is one level longer.)
        let every = Duration::from_secs(1);
        let scene = Scene::new(builder.aging(Aging::new(every, HIGH)));
        let low = scene.start();
        let bound = usize::from(HIGH) + usize::from(scene.pool.store() == support_store::Store::Postgres);
        let mut waited = 0;
        loop {
            let is_low = scene.step(every);
            waited += 1;
            if is_low {
                break;
            }
            assert!(waited < bound + 1, "the low task waited {waited} s, past the bound of {bound} s");
            if waited == 5 {
                // Stats keep each ready task under its own priority, aged or not.
                let stats = scene.pool.stats();
                assert!(stats.ready_by_priority.contains(&(0, 1)), "{stats:?}");
                assert_eq!(low.status(), TaskState::Ready);
            }
        }
        assert!(
            waited >= usize::from(HIGH),
            "the low task ran after {waited} s, before aging could lift it to {HIGH}"
        );
        scene.drain();
        assert!(finish(&low).is_succeeded());
    }

    fn without_aging_a_flood_holds_a_low_task_back(builder) {
        let scene = Scene::new(builder);
        let low = scene.start();
        for second in 1..=60 {
            assert!(
                !scene.step(Duration::from_secs(1)),
                "the low task overtook the flood after {second} s under strict priority"
            );
        }
        assert_eq!(low.status(), TaskState::Ready);
        // The flood ends: then it runs.
        scene.drain();
        assert!(finish(&low).is_succeeded());
    }

    fn aging_keeps_first_in_first_out_among_equals(builder) {
        // With aging on and no time passing, the order is strict priority, then submission.
        let scene = Scene::new(builder.aging(Aging::new(Duration::from_secs(1), HIGH)));
        scene.flooding.store(false, Ordering::SeqCst);
        scene.pool.submit(FLOOD.task(0).priority(HIGH)).unwrap();
        assert!(!scene.next_start());
        let low = scene.pool.submit(LOW.task(0).priority(3)).unwrap();
        let first = scene.pool.submit(FLOOD.task(1).priority(4)).unwrap();
        let second = scene.pool.submit(FLOOD.task(2).priority(4)).unwrap();
        assert!(!scene.step(Duration::ZERO), "priority 4 first");
        assert_eq!(first.status(), TaskState::Running);
        assert!(!scene.step(Duration::ZERO));
        assert_eq!(second.status(), TaskState::Running);
        assert!(scene.step(Duration::ZERO));
        scene.drain();
        assert!(finish(&low).is_succeeded());
    }
}
