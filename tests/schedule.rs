//! Periodic tasks on both stores, on a manual clock: slots fall where the schedule says and run
//! once each, missed slots follow the schedule's policy, a pause holds every slot until the
//! resume, cron slots respect daylight saving, a payload function that panics or calls back into
//! the pool breaks nothing, and bad schedules fail the build with a reason.

mod support_store;

use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender};
use support_store::{HANG_GUARD, Store, TestBuilder, TestPool};
use tasq::{BuildError, HandlerError, ManualClock, Missed, PauseTarget, Schedule, TaskType};

/// A slot's task: its payload is (schedule, slot in seconds since the epoch).
const SLOT: TaskType<(String, u64), ()> = TaskType::new("slot");

/// Counts one call of a payload function when it returns (or unwinds).
struct CountOnReturn<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for CountOnReturn<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A payload whose `Drop` panics.
#[derive(serde::Serialize, serde::Deserialize)]
struct Loud(u64);

impl Drop for Loud {
    fn drop(&mut self) {
        panic!("[expected panic] a payload dropped");
    }
}

const LOUD: TaskType<Loud, ()> = TaskType::new("loud");

/// Panics when dropped (saying so in its flag first): captured by a payload function.
struct Bomb(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Bomb {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        panic!("[expected panic] a payload function's capture dropped");
    }
}

/// 2027-01-15T08:00:00Z: a whole hour, so slots of any period dividing an hour fall on
/// multiples of it from here.
const T0: u64 = 1_800_000_000;

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn clock_at(secs: u64) -> ManualClock {
    ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(secs))
}

/// A schedule of `SLOT` every `period` seconds, its payload naming it and its slot.
fn every(name: &'static str, period: u64) -> Schedule {
    Schedule::every(name, Duration::from_secs(period), SLOT, move |slot| {
        (name.to_owned(), secs(slot))
    })
}

/// A builder on `clock` whose `SLOT` handler reports each run on the returned channel.
fn slots(builder: TestBuilder, clock: &ManualClock) -> (TestBuilder, Receiver<(String, u64)>) {
    let (tx, rx): (Sender<(String, u64)>, _) = crossbeam_channel::unbounded();
    let builder = builder.workers(2).manual_clock(clock.clone()).register(
        SLOT,
        move |_, slot: &(String, u64)| {
            tx.send(slot.clone()).unwrap();
            Ok::<_, HandlerError>(())
        },
    );
    (builder, rx)
}

/// Waits (real time, at most [`HANG_GUARD`]) until every schedule of `pool` has decided its
/// slots up to `secs`: its next slot is after it.
fn decided_until(pool: &TestPool, secs_now: u64) {
    let give_up = Instant::now() + HANG_GUARD;
    loop {
        let listed = pool.schedules().unwrap();
        if listed
            .iter()
            .all(|s| s.paused || s.next_slot.is_some_and(|next| secs(next) > secs_now))
        {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "the schedules did not tick: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Everything run so far, once the pool is idle, sorted.
fn ran(pool: &TestPool, rx: &Receiver<(String, u64)>) -> Vec<(String, u64)> {
    pool.wait_idle();
    let mut ran: Vec<_> = rx.try_iter().collect();
    ran.sort();
    ran
}

fn named(name: &str, slots: &[u64]) -> Vec<(String, u64)> {
    slots.iter().map(|&s| (name.to_owned(), T0 + s)).collect()
}

conformance! {
    fn each_slot_of_an_interval_runs_once(builder) {
        let clock = clock_at(T0);
        let (builder, rx) = slots(builder, &clock);
        let pool = builder.schedule(every("ten", 10).missed(Missed::CatchUp(100))).build();
        decided_until(&pool, T0);
        assert_eq!(ran(&pool, &rx), vec![], "no slot before the pool's start runs");
        for step in 1..=5 {
            clock.advance(Duration::from_secs(10));
            decided_until(&pool, T0 + step * 10);
        }
        assert_eq!(ran(&pool, &rx), named("ten", &[10, 20, 30, 40, 50]));
        // Half a period: nothing due.
        clock.advance(Duration::from_secs(5));
        decided_until(&pool, T0 + 55);
        assert_eq!(ran(&pool, &rx), vec![]);
        let listed = pool.schedules().unwrap();
        assert_eq!(listed.len(), 1);
        let ten = &listed[0];
        assert_eq!(ten.name, "ten");
        assert_eq!(ten.last_slot.map(secs), Some(T0 + 50));
        assert_eq!(ten.next_slot.map(secs), Some(T0 + 60));
        assert!(ten.last_task.is_some());
        assert_eq!(ten.last_state, Some(tasq::TaskState::Succeeded));
        assert_eq!(ten.last_error, None);
        assert!(!ten.paused);
        assert!(ten.definition.starts_with("every 10000000us"), "{}", ten.definition);
    }

    fn missed_slots_follow_each_schedules_policy(builder) {
        let clock = clock_at(T0);
        let (builder, rx) = slots(builder, &clock);
        let pool = builder
            .schedule(every("once", 10).missed(Missed::RunOnce))
            .schedule(every("catch", 10).missed(Missed::CatchUp(3)))
            .schedule(every("skip", 10).missed(Missed::Skip).grace(Duration::from_secs(2)))
            .build();
        decided_until(&pool, T0);
        for name in ["once", "catch", "skip"] {
            assert_eq!(pool.pause(PauseTarget::schedule(name)), Ok(true));
        }
        // Five slots pass while paused (T0+10 to T0+50): none runs.
        clock.advance(Duration::from_secs(55));
        for name in ["once", "catch", "skip"] {
            assert_eq!(pool.resume(PauseTarget::schedule(name)), Ok(true));
        }
        decided_until(&pool, T0 + 55);
        let mut expected = named("catch", &[30, 40, 50]);
        expected.extend(named("once", &[50]));
        assert_eq!(ran(&pool, &rx), expected, "skip's newest slot is 5 s late, past its grace of 2");
        // Back on time: every policy runs the slot.
        clock.advance(Duration::from_secs(5));
        decided_until(&pool, T0 + 60);
        let mut expected = named("catch", &[60]);
        expected.extend(named("once", &[60]));
        expected.extend(named("skip", &[60]));
        assert_eq!(ran(&pool, &rx), expected);
    }

    fn a_paused_schedule_is_listed_and_resumes_where_its_policy_says(builder) {
        let clock = clock_at(T0);
        let (builder, rx) = slots(builder, &clock);
        let pool = builder.schedule(every("beat", 10).missed(Missed::CatchUp(10))).build();
        decided_until(&pool, T0);
        assert_eq!(pool.pause(PauseTarget::schedule("beat")), Ok(true));
        assert_eq!(pool.pause(PauseTarget::schedule("beat")), Ok(false), "paused already");
        let listed = pool.schedules().unwrap();
        assert!(listed[0].paused);
        assert!(
            pool.paused().unwrap().iter().any(|p| p.target == PauseTarget::schedule("beat")),
            "{:?}",
            pool.paused()
        );
        clock.advance(Duration::from_secs(30));
        // Nothing ran while paused (the catch-up below would show it twice otherwise).
        assert_eq!(pool.stats().totals.submitted, 0);
        assert_eq!(pool.resume(PauseTarget::schedule("beat")), Ok(true));
        assert_eq!(pool.resume(PauseTarget::schedule("beat")), Ok(false), "not paused");
        decided_until(&pool, T0 + 30);
        assert_eq!(ran(&pool, &rx), named("beat", &[10, 20, 30]));
    }

    fn a_payload_that_panics_is_listed_and_the_schedule_goes_on(builder) {
        support_store::silence_expected_panics();
        let clock = clock_at(T0);
        let (builder, rx) = slots(builder, &clock);
        let schedule = Schedule::every("odd", Duration::from_secs(10), SLOT, |slot| {
            let s = secs(slot);
            assert!(s % 20 == 0, "[expected panic] slot {s} is an odd one");
            ("odd".to_owned(), s)
        })
        .missed(Missed::CatchUp(10));
        let pool = builder.schedule(schedule).build();
        decided_until(&pool, T0);
        clock.advance(Duration::from_secs(10));
        decided_until(&pool, T0 + 10);
        let listed = pool.schedules().unwrap();
        assert_eq!(listed[0].last_slot.map(secs), Some(T0 + 10));
        assert_eq!(listed[0].last_task, None);
        let error = listed[0].last_error.clone().expect("the panic is listed");
        assert!(error.contains("odd one"), "{error}");
        clock.advance(Duration::from_secs(30));
        decided_until(&pool, T0 + 40);
        assert_eq!(ran(&pool, &rx), named("odd", &[20, 40]));
        assert_eq!(pool.schedules().unwrap()[0].last_error, None);
        pool.check_invariants().unwrap();
    }

    fn a_payload_function_that_calls_back_into_the_pool(builder) {
        // It lists the schedules, submits a task of its own, and at the third slot pauses its
        // own schedule: that slot is not submitted, nor any after it, and nothing deadlocks.
        let clock = clock_at(T0);
        let (builder, rx) = slots(builder, &clock);
        let cell: Arc<OnceLock<Weak<TestPool>>> = Arc::new(OnceLock::new());
        let seen = Arc::clone(&cell);
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let schedule = Schedule::every("meddler", Duration::from_secs(10), SLOT, move |slot| {
            let _count = CountOnReturn(&counted);
            let s = secs(slot);
            if let Some(pool) = seen.get().and_then(Weak::upgrade) {
                assert_eq!(pool.schedules().unwrap().len(), 1);
                pool.submit(SLOT.task(("extra".to_owned(), s))).unwrap();
                if s == T0 + 30 {
                    assert_eq!(pool.pause(PauseTarget::schedule("meddler")), Ok(true));
                }
            }
            ("meddler".to_owned(), s)
        })
        .missed(Missed::CatchUp(10));
        let pool = Arc::new(builder.schedule(schedule).build());
        cell.set(Arc::downgrade(&pool)).unwrap();
        decided_until(&pool, T0);
        clock.advance(Duration::from_secs(50));
        // The calls of the tick: three on the embedded store (it stops at the pause), five on
        // the durable one (it makes every payload before it reads the pauses).
        let made = match pool.store() {
            Store::Memory => 3,
            Store::Postgres => 5,
        };
        let give_up = Instant::now() + HANG_GUARD;
        while calls.load(std::sync::atomic::Ordering::SeqCst) < made {
            assert!(Instant::now() < give_up, "the payload function was not called {made} times");
            std::thread::sleep(Duration::from_millis(5));
        }
        let expected = match pool.store() {
            // Each slot is submitted as soon as its payload is made: the two before the pause.
            Store::Memory => {
                let mut expected = named("extra", &[10, 20, 30]);
                expected.extend(named("meddler", &[10, 20]));
                expected
            }
            // One tick makes the payloads of the five slots due, then reads the pauses and
            // commits its slots' tasks only if none covers it: none of them, as the pause
            // returned before that commit.
            Store::Postgres => named("extra", &[10, 20, 30, 40, 50]),
        };
        assert_eq!(ran(&pool, &rx), expected);
        assert!(pool.schedules().unwrap()[0].paused);
        pool.check_invariants().unwrap();
        // The tick that paused itself ended: the shutdown joins the scheduler thread.
        support_store::returns_within(&pool, "shutdown", |pool| {
            pool.shutdown(Duration::from_secs(5))
        });
    }

    fn hostile_payloads_and_captures_break_nothing(builder) {
        // A payload whose `Drop` panics (dropped by the store, by the worker, and unsubmitted
        // when a pause comes during the tick), and a payload function whose captures panic when
        // the pool drops it.
        support_store::silence_expected_panics();
        let clock = clock_at(T0);
        let (tx, rx) = crossbeam_channel::unbounded();
        let went_off = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let bomb = Bomb(Arc::clone(&went_off));
        let schedule = Schedule::every("loud", Duration::from_secs(10), LOUD, move |slot| {
            let _keep = &bomb;
            Loud(secs(slot))
        })
        .missed(Missed::CatchUp(10));
        let mut pool = builder
            .workers(1)
            .manual_clock(clock.clone())
            .register(LOUD, move |_, loud: &Loud| {
                tx.send(loud.0).unwrap();
                Ok::<_, HandlerError>(())
            })
            .schedule(schedule)
            .build();
        decided_until(&pool, T0);
        clock.advance(Duration::from_secs(30));
        decided_until(&pool, T0 + 30);
        pool.wait_idle();
        let mut ran: Vec<u64> = rx.try_iter().collect();
        ran.sort_unstable();
        assert_eq!(ran, vec![T0 + 10, T0 + 20, T0 + 30]);
        pool.check_invariants().unwrap();
        // The shutdown joins the scheduler thread: the pool's drop, here, drops the last
        // reference to the payload function, and its bomb goes off inside `catch_unwind`.
        let pool = pool.take();
        pool.shutdown(Duration::from_secs(5));
        drop(pool);
        assert!(went_off.load(std::sync::atomic::Ordering::SeqCst));
    }

    fn cron_slots_keep_to_local_time_through_daylight_saving(builder) {
        // Europe/Berlin: 02:30 does not exist on 2026-03-29 (it runs at 03:00 CEST, 01:00 UTC).
        let start = 1_774_699_200; // 2026-03-28T12:00:00Z
        let clock = clock_at(start);
        let (builder, rx) = slots(builder, &clock);
        let schedule = Schedule::cron("nightly", "30 2 * * *", "Europe/Berlin", SLOT, |slot| {
            ("nightly".to_owned(), secs(slot))
        })
        .missed(Missed::CatchUp(10));
        let pool = builder.schedule(schedule).build();
        decided_until(&pool, start);
        clock.advance(Duration::from_secs(2 * 86_400));
        decided_until(&pool, start + 2 * 86_400);
        assert_eq!(
            ran(&pool, &rx),
            vec![
                ("nightly".to_owned(), 1_774_746_000), // 2026-03-29T01:00:00Z = 03:00 CEST
                ("nightly".to_owned(), 1_774_830_600), // 2026-03-30T00:30:00Z = 02:30 CEST
            ]
        );
    }

    fn bad_schedules_fail_the_build_with_a_reason(builder) {
        const OTHER: TaskType<u8, ()> = TaskType::new("other");
        let cases: Vec<(Schedule, &str)> = vec![
            (Schedule::every("zero", Duration::ZERO, SLOT, |_| (String::new(), 0)), "under a millisecond"),
            (Schedule::every("nanos", Duration::from_nanos(1_000_500), SLOT, |_| (String::new(), 0)), "microseconds"),
            (Schedule::cron("zone", "* * * * *", "Mars/Olympus", SLOT, |_| (String::new(), 0)), "time zone"),
            (Schedule::cron("fields", "* * *", "UTC", SLOT, |_| (String::new(), 0)), "does not parse"),
            (Schedule::every("catch", Duration::from_secs(1), SLOT, |_| (String::new(), 0)).missed(Missed::CatchUp(0)), "catches up 0"),
            (Schedule::every("unknown", Duration::from_secs(1), OTHER, |_| 0), "cannot take"),
            (Schedule::every("bad name", Duration::from_secs(1), SLOT, |_| (String::new(), 0)), "has a name"),
        ];
        let mut builder = Some(builder);
        for (schedule, reason) in cases {
            let b = builder.take().unwrap();
            let store = b.store();
            let error = b
                .register(SLOT, |_, _: &(String, u64)| Ok::<_, HandlerError>(()))
                .schedule(schedule)
                .try_build()
                .err()
                .expect("the build fails");
            let text = error.to_string();
            assert!(matches!(error, BuildError::InvalidSchedule { .. }), "{error:?}");
            assert!(text.contains(reason), "{text} should say {reason}");
            builder = TestBuilder::new(store);
        }
        let twice = builder
            .unwrap()
            .register(SLOT, |_, _: &(String, u64)| Ok::<_, HandlerError>(()))
            .schedule(every("same", 1))
            .schedule(every("same", 2))
            .try_build()
            .err()
            .expect("the build fails");
        assert!(twice.to_string().contains("added twice"), "{twice}");
    }
}
