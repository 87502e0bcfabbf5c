//! Uniqueness over a time window, on both stores: a key with a period deduplicates the tasks
//! submitted in one window of it (windows aligned to the Unix epoch, on the store's clock), a
//! later window takes the key anew even while the earlier task runs, a task that fails or is
//! cancelled frees its window, and bad periods are refused with a typed error.

mod support_store;

use std::time::{Duration, UNIX_EPOCH};

use support_store::{GATE, Gate, TestBuilder, finish};
use tasq::{HandlerError, ManualClock, SubmitErrorKind, TaskType};

const ECHO: TaskType<u32, u32> = TaskType::new("echo");
const FAIL: TaskType<u32, u32> = TaskType::new("fail");

/// 2027-01-15T08:00:00Z, a whole hour: windows of a minute start on it.
const T0: u64 = 1_800_000_000;

fn built(builder: TestBuilder, clock: &ManualClock) -> support_store::TestPool {
    builder
        .workers(2)
        .manual_clock(clock.clone())
        .with_gates()
        .register(ECHO, |_, n: &u32| Ok::<_, HandlerError>(*n))
        .register(FAIL, |_, _: &u32| {
            Err(HandlerError::permanent("[expected] it fails"))
        })
        .build()
}

conformance! {
    fn a_key_with_a_period_deduplicates_within_its_window(builder) {
        let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(T0));
        let pool = built(builder, &clock);
        let minute = Duration::from_secs(60);
        let first = pool.submit(ECHO.task(1).key("report").unique_per(minute)).unwrap();
        assert!(!first.is_duplicate());
        assert_eq!(finish(&first).succeeded(), Some(1));
        // Succeeded, in the same window: still the one.
        clock.advance(Duration::from_secs(59));
        let again = pool.submit(ECHO.task(2).key("report").unique_per(minute)).unwrap();
        assert!(again.is_duplicate());
        assert_eq!(again.id(), first.id());
        // The next window: a new task.
        clock.advance(Duration::from_secs(1));
        let next = pool.submit(ECHO.task(3).key("report").unique_per(minute)).unwrap();
        assert!(!next.is_duplicate());
        assert_ne!(next.id(), first.id());
        assert_eq!(finish(&next).succeeded(), Some(3));
        // The key as the store keeps it names its window.
        let window = T0 / 60 + 1;
        assert_eq!(pool.find_key(&format!("report@{window}")), Some(next.id()));
        // The same key without a period is another key.
        let plain = pool.submit(ECHO.task(4).key("report")).unwrap();
        assert!(!plain.is_duplicate());
    }

    fn a_later_window_takes_the_key_while_the_first_task_still_runs(builder) {
        let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(T0));
        let pool = built(builder, &clock);
        let ten = Duration::from_secs(10);
        let gate = Gate::new();
        let held = pool.submit(GATE.task(gate.number()).key("sync").unique_per(ten)).unwrap();
        gate.wait_started();
        let same = pool.submit(GATE.task(gate.number()).key("sync").unique_per(ten)).unwrap();
        assert_eq!(same.id(), held.id(), "a running task holds its window");
        clock.advance(ten);
        let later = Gate::new();
        let next = pool.submit(GATE.task(later.number()).key("sync").unique_per(ten)).unwrap();
        assert!(!next.is_duplicate(), "the next window's task runs beside the first");
        later.wait_started();
        gate.open();
        later.open();
        assert!(finish(&held).is_succeeded());
        assert!(finish(&next).is_succeeded());
    }

    fn a_task_that_fails_frees_its_window(builder) {
        support_store::silence_expected_panics();
        let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(T0));
        let pool = built(builder, &clock);
        let hour = Duration::from_secs(3600);
        let failed = pool.submit(FAIL.task(1).key("import").unique_per(hour)).unwrap();
        assert!(finish(&failed).is_failed());
        let again = pool.submit(FAIL.task(2).key("import").unique_per(hour)).unwrap();
        assert!(!again.is_duplicate());
        assert_ne!(again.id(), failed.id());
        // In one batch: the second is the first.
        let batch = pool
            .submit_batch(vec![
                ECHO.task(5).key("batch").unique_per(hour),
                ECHO.task(6).key("batch").unique_per(hour),
            ])
            .unwrap();
        assert_eq!(batch[0].id(), batch[1].id());
        assert!(batch[1].is_duplicate());
    }

    fn bad_periods_are_refused_with_a_typed_error(builder) {
        let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(T0));
        let pool = built(builder, &clock);
        let zero = pool.submit(ECHO.task(1).key("k").unique_per(Duration::ZERO)).unwrap_err();
        assert!(
            matches!(zero.kind(), SubmitErrorKind::InvalidSetting { setting: "uniqueness period", .. }),
            "{zero}"
        );
        let keyless = pool.submit(ECHO.task(1).unique_per(Duration::from_secs(1))).unwrap_err();
        assert!(
            matches!(keyless.kind(), SubmitErrorKind::InvalidSetting { problem: "needs a key", .. }),
            "{keyless}"
        );
        // The task comes back whole.
        assert_eq!(*keyless.into_task().payload(), 1);
        pool.check_invariants().unwrap();
    }
}
