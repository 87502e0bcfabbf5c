//! Ready tasks run strictly by priority, first-in first-out within one; `stats()` shows the queue.
//! On both stores.

mod support_store;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support_store::{GATE, Gate, HANG_GUARD, TestBuilder, TestPool, finish};
use tasq::{HandlerError, ManualClock, TaskType};

/// A task that records its payload (priority, submission index) when it runs.
const WORK: TaskType<(u8, usize), ()> = TaskType::new("work");

/// The (priority, submission index) of each `WORK` task, in the order they ran.
type Log = Arc<Mutex<Vec<(u8, usize)>>>;

/// A one-worker pool whose `WORK` handler appends to the returned log.
fn recording_pool(builder: TestBuilder, clock: &ManualClock) -> (TestPool, Log) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&log);
    let pool = builder
        .workers(1)
        .manual_clock(clock.clone())
        .with_gates()
        .register(WORK, move |_, &entry: &(u8, usize)| {
            sink.lock().unwrap().push(entry);
            Ok::<_, HandlerError>(())
        })
        .build();
    (pool, log)
}

/// The order the queue promises: higher priority first, then submission order.
fn expected_order(submitted: &[(u8, usize)]) -> Vec<(u8, usize)> {
    let mut expected = submitted.to_vec();
    // A stable sort keeps submission order within one priority.
    expected.sort_by_key(|&(priority, _)| std::cmp::Reverse(priority));
    expected
}

conformance! {
    fn mixed_priorities_run_highest_first_and_fifo_within_one(builder) {
        let clock = ManualClock::new();
        let (pool, log) = recording_pool(builder, &clock);

        // Hold the only worker, so every task below is queued before any runs.
        let gate = Gate::new();
        let gate_handle = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();

        // Low priorities first; five seconds later, the urgent ones.
        let early = [0u8, 5, 63, 5, 0, 1, 64, 5];
        let late = [255u8, 1, 255, 0];
        let mut submitted = Vec::new();
        let mut handles = Vec::new();
        for priority in early {
            let entry = (priority, submitted.len());
            handles.push(pool.submit(WORK.task(entry).priority(priority)).unwrap());
            submitted.push(entry);
        }
        clock.advance(Duration::from_secs(3));
        for priority in late {
            let entry = (priority, submitted.len());
            handles.push(pool.submit(WORK.task(entry).priority(priority)).unwrap());
            submitted.push(entry);
        }
        clock.advance(Duration::from_secs(2));

        let stats = pool.stats();
        assert_eq!(stats.running, 1, "the gate holds the worker");
        assert_eq!(stats.ready, submitted.len());
        assert_eq!(
            stats.ready_by_priority,
            vec![(255, 2), (64, 1), (63, 1), (5, 3), (1, 2), (0, 3)]
        );
        // The oldest ready task is a low-priority one submitted 5 s ago, not the front of the
        // highest priority (2 s).
        assert_eq!(stats.oldest_ready, Some(Duration::from_secs(5)));
        assert!(log.lock().unwrap().is_empty(), "nothing ran past the gate");

        gate.open();
        assert!(finish(&gate_handle).is_succeeded());
        for handle in &handles {
            assert!(finish(handle).is_succeeded());
        }
        assert_eq!(*log.lock().unwrap(), expected_order(&submitted));

        let stats = pool.stats();
        assert_eq!((stats.ready, stats.running), (0, 0));
        assert!(stats.ready_by_priority.is_empty());
        assert_eq!(stats.oldest_ready, None);
    }

    fn equal_priorities_run_in_submission_order(builder) {
        let clock = ManualClock::new();
        let (pool, log) = recording_pool(builder, &clock);
        let gate = Gate::new();
        let _ = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();

        let handles: Vec<_> = (0..50)
            .map(|i| pool.submit(WORK.task((7, i)).priority(7)).unwrap())
            .collect();
        let stats = pool.stats();
        assert_eq!(stats.ready_by_priority, vec![(7, 50)]);
        // Nothing has waited yet on the manual clock.
        assert_eq!(stats.oldest_ready, Some(Duration::ZERO));

        gate.open();
        for handle in &handles {
            assert!(finish(handle).is_succeeded());
        }
        let expected: Vec<_> = (0..50).map(|i| (7, i)).collect();
        assert_eq!(*log.lock().unwrap(), expected);
    }

    fn a_task_submitted_later_with_a_higher_priority_overtakes_the_queue(builder) {
        let clock = ManualClock::new();
        let (pool, log) = recording_pool(builder, &clock);
        let gate = Gate::new();
        let _ = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();

        let mut handles: Vec<_> = (0..10)
            .map(|i| pool.submit(WORK.task((0, i))).unwrap())
            .collect();
        handles.push(pool.submit(WORK.task((1, 10)).priority(1)).unwrap());
        gate.open();
        for handle in &handles {
            assert!(handle.wait_timeout(HANG_GUARD).is_some());
        }
        let log = log.lock().unwrap();
        assert_eq!(log[0], (1, 10), "the priority-1 task runs first: {log:?}");
        assert_eq!(log.len(), 11);
    }

    /// Plain submits wait in the embedded store's intake until a worker picks its next task;
    /// submits with a key or in a batch go into the queue at once. Either way a worker's next
    /// pick sees every submit that returned before it, in submission order within a priority.
    fn every_kind_of_submit_reaches_the_next_pick_in_submission_order(builder) {
        let clock = ManualClock::new();
        let (pool, log) = recording_pool(builder, &clock);
        let gate = Gate::new();
        let _ = pool.submit(GATE.task(gate.number())).unwrap();
        gate.wait_started();

        let mut handles = vec![
            pool.submit(WORK.task((1, 0)).priority(1)).unwrap(),
            pool.submit(WORK.task((9, 1)).priority(9)).unwrap(),
            pool.submit(WORK.task((9, 2)).priority(9).key("keyed")).unwrap(),
            pool.submit(WORK.task((9, 3)).priority(9)).unwrap(),
        ];
        handles.extend(
            pool.submit_batch(vec![
                WORK.task((5, 4)).priority(5),
                WORK.task((9, 5)).priority(9),
            ])
            .unwrap(),
        );
        handles.push(pool.submit(WORK.task((9, 6)).priority(9)).unwrap());
        handles.push(pool.submit(WORK.task((1, 7)).priority(1)).unwrap());
        gate.open();
        for handle in &handles {
            assert!(finish(handle).is_succeeded());
        }
        assert_eq!(
            *log.lock().unwrap(),
            [(9, 1), (9, 2), (9, 3), (9, 5), (9, 6), (5, 4), (1, 0), (1, 7)]
        );
    }
}
