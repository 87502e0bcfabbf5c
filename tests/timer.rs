//! The timer and the clock: a sleeping handler wakes when a manual clock moves, a new earliest
//! due time shortens the timer's sleep, the timer role passes on while its worker runs a handler,
//! a shutdown called from a handler waits for the other workers, and an idle pool stays asleep.
//! Each of these was a wake-up that could be removed without any test noticing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tasq::{HandlerError, ManualClock, Pool, TaskState, TaskType};

/// Bounds every wait for something that should happen at once; never slept.
const GUARD: Duration = Duration::from_secs(10);

/// Sleeps on its token until the given instant of the pool's clock; returns whether the sleep
/// ended by the clock (not by a cancel).
const NAP: TaskType<(Instant, Sender<()>), bool> = TaskType::new("nap");

#[test]
fn a_handler_sleeping_on_a_manual_clock_wakes_when_the_clock_reaches_its_deadline() {
    let clock = ManualClock::new();
    let pool = Pool::builder()
        .workers(1)
        .manual_clock(clock.clone())
        .register(NAP, move |ctx, (until, started): &(Instant, Sender<()>)| {
            started.send(()).unwrap();
            // A deadline, not a duration: an advance that lands before the sleep starts ends
            // it at once, and none can push the deadline later (as `sleep(until - now)` could,
            // the clock moving between the read and the sleep).
            Ok::<_, HandlerError>(ctx.sleep_until(*until).is_ok())
        })
        .build()
        .unwrap();
    // Several rounds: in most the advance lands while the handler already sleeps, which only
    // the clock's wake-up of the token can end.
    for round in 0..20 {
        let (started_tx, started) = crossbeam_channel::bounded(1);
        let until = clock.now() + Duration::from_secs(60);
        let handle = pool.submit(NAP.task((until, started_tx))).unwrap();
        started.recv_timeout(GUARD).unwrap();
        clock.advance(Duration::from_secs(59));
        assert_eq!(
            handle.try_wait(),
            None,
            "round {round}: woke a second early"
        );
        clock.advance(Duration::from_secs(1));
        let outcome = handle
            .wait_timeout(GUARD)
            .unwrap_or_else(|| panic!("round {round}: the sleeper never woke"));
        assert_eq!(outcome.succeeded(), Some(true), "round {round}");
    }
}

const STAMP: TaskType<(), Instant> = TaskType::new("stamp");
/// Holds its worker until the test lets go (or the guard passes).
const HOLD: TaskType<(Sender<()>, Receiver<()>), ()> = TaskType::new("hold");

fn system_pool(workers: usize) -> Pool {
    Pool::builder()
        .workers(workers)
        .register(STAMP, |_, _: &()| Ok::<_, HandlerError>(Instant::now()))
        .register(
            HOLD,
            |_, (started, release): &(Sender<()>, Receiver<()>)| {
                started.send(()).unwrap();
                release
                    .recv_timeout(GUARD)
                    .map_err(|_| HandlerError::permanent("never released"))
            },
        )
        .build()
        .unwrap()
}

/// Wake-up rule 3 on the system clock: the timer sleeps until a task due in an hour; a task due
/// at once after it must wake the timer, not wait out the hour.
#[test]
fn a_new_earliest_due_time_wakes_the_sleeping_timer() {
    let pool = system_pool(1);
    let far = pool
        .submit(STAMP.task(()).delay(Duration::from_secs(3600)))
        .unwrap();
    // Let the worker go to sleep as the timer of the far task (nothing else to do).
    pool.wait_idle();
    let soon = pool
        .submit(STAMP.task(()).delay(Duration::from_millis(5)))
        .unwrap();
    assert!(
        soon.wait_timeout(GUARD).is_some(),
        "the timer slept through an earlier due time"
    );
    assert_eq!(far.status(), TaskState::Scheduled);
}

/// Wake-up rule 2 on the system clock: the worker that was the timer takes the first delayed
/// task and holds it; the second delayed task must still run, so another worker must become the
/// timer.
#[test]
fn the_timer_role_passes_on_while_its_worker_runs_a_long_handler() {
    let pool = system_pool(2);
    let (started_tx, started) = crossbeam_channel::bounded(1);
    let (release_tx, release) = crossbeam_channel::bounded(1);
    let first = pool
        .submit(
            HOLD.task((started_tx, release))
                .delay(Duration::from_millis(5)),
        )
        .unwrap();
    let second = pool
        .submit(STAMP.task(()).delay(Duration::from_millis(20)))
        .unwrap();
    started.recv_timeout(GUARD).unwrap();
    let outcome = second.wait_timeout(GUARD);
    release_tx.send(()).unwrap();
    assert!(
        outcome.is_some(),
        "the second delayed task waited for the first to finish"
    );
    assert!(first.wait_timeout(GUARD).is_some_and(|o| o.is_succeeded()));
}

const SHUT_DOWN: TaskType<Arc<Pool>, ()> = TaskType::new("shut_down");

/// A shutdown called from a handler returns only once the other workers have left, which they
/// do only when their handlers return.
#[test]
fn a_shutdown_from_a_handler_waits_for_the_other_workers() {
    let returned = Arc::new(AtomicBool::new(false));
    let (entered_tx, entered) = crossbeam_channel::bounded(1);
    let (started_tx, started) = crossbeam_channel::bounded(1);
    let (release_tx, release) = crossbeam_channel::bounded(1);
    let (done_tx, done) = crossbeam_channel::bounded(1);
    let flag = Arc::clone(&returned);
    let pool = Arc::new(
        Pool::builder()
            .workers(2)
            .register(
                HOLD,
                |_, (started, release): &(Sender<()>, Receiver<()>)| {
                    started.send(()).unwrap();
                    release
                        .recv_timeout(GUARD)
                        .map_err(|_| HandlerError::permanent("never released"))
                },
            )
            .register(SHUT_DOWN, move |_, pool: &Arc<Pool>| {
                entered_tx.send(()).unwrap();
                let _ = pool.shutdown(Duration::MAX);
                flag.store(true, Ordering::SeqCst);
                done_tx.send(()).unwrap();
                Ok::<_, HandlerError>(())
            })
            .build()
            .unwrap(),
    );
    let held = pool.submit(HOLD.task((started_tx, release))).unwrap();
    started.recv_timeout(GUARD).unwrap();
    let shutter = pool.submit(SHUT_DOWN.task(Arc::clone(&pool))).unwrap();
    entered.recv_timeout(GUARD).unwrap();
    // The other worker still holds its task: the shutdown must not return yet. A bounded look,
    // not a synchronisation: a broken engine returns within microseconds.
    assert!(
        done.recv_timeout(Duration::from_millis(100)).is_err(),
        "shutdown from a handler returned while another worker ran"
    );
    assert!(!returned.load(Ordering::SeqCst));
    release_tx.send(()).unwrap();
    done.recv_timeout(GUARD)
        .expect("shutdown returned once the other worker left");
    assert!(held.wait_timeout(GUARD).is_some_and(|o| o.is_succeeded()));
    assert!(
        shutter
            .wait_timeout(GUARD)
            .is_some_and(|o| o.is_cancelled())
    );
}

/// A cancelled delayed task leaves a stale entry in the delayed heap until it reaches the top:
/// `Stats::delayed_entries` counts it, `Stats::scheduled` does not.
#[test]
fn stale_delayed_entries_are_counted_apart_from_scheduled_tasks() {
    let clock = ManualClock::new();
    let pool = Pool::builder()
        .workers(1)
        .manual_clock(clock.clone())
        .register(STAMP, |_, _: &()| Ok::<_, HandlerError>(Instant::now()))
        .build()
        .unwrap();
    let early = pool
        .submit(STAMP.task(()).delay(Duration::from_secs(10)))
        .unwrap();
    let late = pool
        .submit(STAMP.task(()).delay(Duration::from_secs(20)))
        .unwrap();
    late.cancel().unwrap();
    let stats = pool.stats();
    assert_eq!((stats.scheduled, stats.delayed_entries), (1, 2));
    early.cancel().unwrap();
    clock.advance(Duration::from_secs(30));
    pool.wait_idle();
    let stats = pool.stats();
    assert_eq!(stats.scheduled, 0);
    assert_eq!(stats.delayed_entries, 0, "stale entries leave once due");
}

/// An idle pool wakes no thread: its workers use no CPU and switch context no more while
/// nothing happens, with nothing queued and with one task due in an hour. Linux only: it reads
/// each worker thread's counters in /proc.
#[cfg(target_os = "linux")]
#[test]
fn an_idle_pool_wakes_no_thread() {
    const NAME: &str = "idle-probe";
    let pool = Pool::builder()
        .workers(4)
        .thread_name(NAME)
        .register(STAMP, |_, _: &()| Ok::<_, HandlerError>(Instant::now()))
        .build()
        .unwrap();
    // Run something first, so the workers have been through the wake-up paths.
    let ran = pool.submit(STAMP.task(())).unwrap();
    assert!(ran.wait_timeout(GUARD).is_some());
    for delayed in [false, true] {
        let _far = delayed.then(|| {
            pool.submit(STAMP.task(()).delay(Duration::from_secs(3600)))
                .unwrap()
        });
        pool.wait_idle();
        // A spinning worker may still be finishing its microsecond: let it settle.
        let settle = Instant::now();
        let mut before = worker_counters(NAME);
        while settle.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(50));
            let now = worker_counters(NAME);
            if now == before {
                break;
            }
            before = now;
        }
        assert_eq!(before.len(), 4, "four worker threads");
        // The observation window: nothing is signalled in it, so it can only be a sleep.
        std::thread::sleep(Duration::from_millis(300));
        let after = worker_counters(NAME);
        assert_eq!(
            before, after,
            "idle workers woke (delayed task: {delayed}): (switches, cpu ticks) before/after"
        );
    }
}

/// Tasks run one at a time on a pool of eight idle workers cost a couple of worker context
/// switches each (the one worker that runs it wakes, then sleeps), not one per worker. A coarse
/// guard against waking every idle worker for each task: parking_lot's `notify_all` moves
/// waiters to the mutex's queue one at a time, so even a broadcast on every transition costs
/// less than one extra switch per task here, and only a pool that woke its workers far more
/// often fails it. Counted, not timed. Linux only, like the test above.
#[cfg(target_os = "linux")]
#[test]
fn tasks_one_at_a_time_cost_few_context_switches() {
    const NAME: &str = "one-each";
    const TASKS: u64 = 200;
    let pool = Pool::builder()
        .workers(8)
        .thread_name(NAME)
        .register(STAMP, |_, _: &()| Ok::<_, HandlerError>(Instant::now()))
        .build()
        .unwrap();
    // The threads start on their own: count them all.
    let started = Instant::now();
    while worker_counters(NAME).len() < 8 {
        assert!(started.elapsed() < GUARD, "the workers did not start");
        std::thread::yield_now();
    }
    pool.wait_idle();
    let switches = || -> u64 { worker_counters(NAME).values().map(|&(s, _)| s).sum() };
    let before = switches();
    for _ in 0..TASKS {
        let handle = pool.submit(STAMP.task(())).unwrap();
        assert!(handle.wait_timeout(GUARD).is_some());
    }
    let per_task = (switches() - before) as f64 / TASKS as f64;
    assert!(
        per_task < 5.0,
        "{per_task:.1} worker context switches per task: idle workers were woken for nothing"
    );
    // The pool's Debug names what it runs.
    let debug = format!("{pool:?}");
    assert!(
        debug.contains("stamp") && debug.contains("workers: 8"),
        "{debug}"
    );
}

/// (voluntary + involuntary context switches, user + system CPU ticks) of each thread whose
/// name starts with `prefix`, by thread id.
#[cfg(target_os = "linux")]
fn worker_counters(prefix: &str) -> std::collections::BTreeMap<u64, (u64, u64)> {
    let mut counters = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = entry.unwrap().path();
        let Ok(name) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if !name.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        let switches: u64 = status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // Fields after the parenthesised name; utime and stime are the 14th and 15th fields.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        let tid = dir.file_name().unwrap().to_str().unwrap().parse().unwrap();
        counters.insert(tid, (switches, ticks));
    }
    counters
}
