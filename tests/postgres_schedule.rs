//! Periodic tasks across a fleet on the durable store: every slot submitted exactly once by
//! processes that run the same schedules while one is killed with SIGKILL every second or two
//! and the clocks of two are skewed; two versions of a schedule side by side (a rolling
//! deploy) submit the slots of both, each once; and a tick whose transaction stalls (a process
//! stopped in it) is ended by the server, and another process submits its slot, once.
//!
//! A schedule process is this test binary run again with `--ignored --exact schedule_process`;
//! its clock is a manual one that starts at `TASQ_SCHEDULE_START` (seconds since the epoch), and
//! the test moves it with `advance <seconds>` lines on its standard input.
#![cfg(feature = "postgres")]

mod support_pg;
mod support_proc;
mod support_rng;

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Receiver;
use support_pg::TestDb;
use support_rng::Rng;
use tasq::{HandlerError, ManualClock, Missed, Pool, Schedule, TaskType};

/// A slot's task: (schedule, slot in seconds since the epoch).
const SLOT: TaskType<(String, u64), ()> = TaskType::new("slot");

/// 2027-01-15T08:00:00Z: a whole hour.
const T0: u64 = 1_800_000_000;

/// The most slots a schedule catches up in one tick: more than the run can miss.
const CATCH_UP: u32 = 10_000;

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn schedules() -> [Schedule; 2] {
    [
        Schedule::every("second", Duration::from_secs(1), SLOT, |slot| {
            ("second".to_owned(), secs(slot))
        })
        .missed(Missed::CatchUp(CATCH_UP)),
        Schedule::cron("minute", "* * * * *", "UTC", SLOT, |slot| {
            ("minute".to_owned(), secs(slot))
        })
        .missed(Missed::CatchUp(CATCH_UP)),
    ]
}

// ===== the schedule process =====

#[test]
#[ignore = "a schedule process of the multi-process tests, started by them"]
fn schedule_process() {
    let url = std::env::var("TASQ_SCHEDULE_URL").unwrap();
    let start: u64 = std::env::var("TASQ_SCHEDULE_START")
        .unwrap()
        .parse()
        .unwrap();
    let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(start));
    let [second, minute] = schedules();
    let pool = Pool::builder()
        .postgres(url)
        .workers(2)
        .poll_interval(Duration::from_millis(100))
        .manual_clock(clock.clone())
        .register(SLOT, |_, _: &(String, u64)| Ok::<_, HandlerError>(()))
        .schedule(second)
        .schedule(minute)
        .build()
        .unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("advance") => {
                let by: u64 = words.next().unwrap().parse().unwrap();
                clock.advance(Duration::from_secs(by));
            }
            Some("exit") => break,
            _ => {}
        }
    }
    pool.shutdown(Duration::from_secs(10));
    println!("exited");
}

// ===== the test's side =====

/// A running schedule process.
struct Process {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Process {
    fn start(db: &TestDb, clock_at: u64) -> Process {
        let (child, stdin, lines) = support_proc::spawn(
            "schedule_process",
            &[
                ("TASQ_SCHEDULE_URL", db.url.clone()),
                ("TASQ_SCHEDULE_START", clock_at.to_string()),
            ],
        );
        let process = Process {
            child,
            stdin,
            lines,
        };
        process.expect_line("ready");
        process
    }

    fn expect_line(&self, wanted: &str) {
        support_proc::expect_line(&self.lines, wanted);
    }

    fn advance(&mut self, by: u64) {
        // A process killed a moment ago: its pipe is closed; the test restarts it.
        let _ = writeln!(self.stdin, "advance {by}").and_then(|()| self.stdin.flush());
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn exit(mut self) {
        writeln!(self.stdin, "exit").unwrap();
        self.stdin.flush().unwrap();
        self.expect_line("exited");
        self.child.wait().unwrap();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A pool on `db` with one worker for [`SLOT`] and `schedule`, on `clock`.
fn pool_on(db: &TestDb, clock: &ManualClock, schedule: Schedule) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .workers(1)
        .poll_interval(Duration::from_millis(100))
        .manual_clock(clock.clone())
        .register(SLOT, |_, _: &(String, u64)| Ok::<_, HandlerError>(()))
        .schedule(schedule)
        .build()
        .unwrap()
}

/// The slots submitted, by schedule: (slot, tasks that carry it).
fn submitted(db: &TestDb, name: &str) -> Vec<(u64, i64)> {
    db.client()
        .query(
            "SELECT (payload->>1)::BIGINT, count(*) FROM tasq_tasks
             WHERE type = 'slot' AND payload->>0 = $1 GROUP BY 1 ORDER BY 1",
            &[&name],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get::<_, i64>(0) as u64, row.get(1)))
        .collect()
}

/// The newest watermark of schedule `name`, in seconds.
fn watermark(db: &TestDb, name: &str) -> u64 {
    let at: SystemTime = db
        .client()
        .query_one(
            "SELECT max(watermark) FROM tasq_schedules WHERE name = $1",
            &[&name],
        )
        .unwrap()
        .get(0);
    secs(at)
}

/// Four processes run the same two schedules ("second": every second; "minute": a cron every
/// minute), each on a manual clock the test moves by two seconds every 20 ms; two of the four
/// clocks run 7 and 23 seconds ahead. Every second or two of real time one process is killed
/// with SIGKILL and a new one started in its place on the same clock. At the end, every slot
/// up to the newest watermark was submitted exactly once: none twice, none missed.
#[test]
fn four_processes_submit_every_slot_once_through_kills_and_skewed_clocks() {
    let Some(db) = TestDb::new() else {
        return;
    };
    tasq::postgres::migrate(&db.url).unwrap();
    let skews = [0, 0, 7, 23];
    let seed = support_rng::seed("TASQ_SCHEDULE_SEED");
    eprintln!("schedule chaos seed {seed} (TASQ_SCHEDULE_SEED)");
    let mut rng = Rng(seed);
    // The unskewed ones first: the schedules' first watermark is T0.
    let mut fleet: Vec<Option<Process>> = skews
        .iter()
        .map(|&skew| Some(Process::start(&db, T0 + skew)))
        .collect();
    let mut elapsed = 0;
    let mut kills = 0;
    let run_for = Duration::from_secs(
        std::env::var("TASQ_SCHEDULE_CHAOS_SECS")
            .ok()
            .map_or(20, |s| s.parse().unwrap()),
    );
    let started = Instant::now();
    let mut next_kill = started + Duration::from_millis(500 + rng.below(1500));
    while started.elapsed() < run_for {
        elapsed += 2;
        for process in fleet.iter_mut().flatten() {
            process.advance(2);
        }
        if Instant::now() >= next_kill {
            let victim = rng.below(fleet.len() as u64) as usize;
            if let Some(process) = fleet[victim].take() {
                process.kill();
                kills += 1;
            }
            // Its successor starts on the same clock as the rest of the fleet.
            fleet[victim] = Some(Process::start(&db, T0 + skews[victim] + elapsed));
            next_kill = Instant::now() + Duration::from_millis(500 + rng.below(1500));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every process alive and caught up to its clock's end: the fastest decides the last slot.
    let end = T0 + elapsed + skews.iter().max().unwrap();
    let give_up = Instant::now() + Duration::from_secs(60);
    while watermark(&db, "second") < end {
        assert!(
            Instant::now() < give_up,
            "the fleet did not catch up to {end}: {}",
            watermark(&db, "second")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for process in fleet.into_iter().flatten() {
        process.exit();
    }
    let mut report = Vec::new();
    for (name, every) in [("second", 1), ("minute", 60)] {
        let last = watermark(&db, name);
        let expected: BTreeSet<u64> = (T0 + 1..=last).filter(|s| s % every == 0).collect();
        let got = submitted(&db, name);
        let duplicates: i64 = got.iter().map(|&(_, n)| n - 1).sum();
        let seen: BTreeSet<u64> = got.iter().map(|&(s, _)| s).collect();
        let missed: Vec<_> = expected.difference(&seen).copied().collect();
        let extra: Vec<_> = seen.difference(&expected).copied().collect();
        report.push(format!(
            "{name}: {} slots, {duplicates} duplicates, {} missed, {} outside",
            expected.len(),
            missed.len(),
            extra.len()
        ));
        assert_eq!(duplicates, 0, "{name}: slots submitted twice");
        assert!(missed.is_empty(), "{name}: slots missed: {missed:?}");
        assert!(
            extra.is_empty(),
            "{name}: slots outside (T0, watermark]: {extra:?}"
        );
        assert!(expected.len() > 1, "{name}: too short a run to tell");
    }
    eprintln!(
        "schedule chaos: {kills} kills over {elapsed} s of schedule time; {}",
        report.join("; ")
    );
    assert!(kills > 0, "the run ended before the first kill");
}

/// A rolling deploy that changes a schedule: the old version (every 10 s) and the new (every
/// 15 s) run side by side on one clock. The slots of both are submitted, a slot of both (every
/// 30 s) once; the listing shows both definitions.
#[test]
fn two_versions_of_a_schedule_side_by_side_submit_each_slot_once() {
    let Some(db) = TestDb::new() else {
        return;
    };
    let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(T0));
    let version = |period: u64| {
        let schedule = Schedule::every("report", Duration::from_secs(period), SLOT, |slot| {
            ("report".to_owned(), secs(slot))
        });
        pool_on(&db, &clock, schedule.missed(Missed::CatchUp(100)))
    };
    let old = version(10);
    let new = version(15);
    let listed = new.schedules().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    for step in 1..=12 {
        clock.advance(Duration::from_secs(5));
        let now = T0 + step * 5;
        let give_up = Instant::now() + Duration::from_secs(20);
        while new
            .schedules()
            .unwrap()
            .iter()
            .any(|s| s.next_slot.is_none_or(|next| secs(next) <= now))
        {
            assert!(Instant::now() < give_up, "the schedules did not tick");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    old.wait_idle();
    new.wait_idle();
    let got = submitted(&db, "report");
    let expected: Vec<(u64, i64)> = (T0 + 1..=T0 + 60)
        .filter(|s| s % 10 == 0 || s % 15 == 0)
        .map(|s| (s, 1))
        .collect();
    assert_eq!(got, expected);
}

/// A tick that stalls in its transaction (here its payload function blocks, as a process
/// stopped with SIGSTOP would) holds its schedule's row until the server ends the transaction
/// (`idle_in_transaction_session_timeout`, 10 s); then another pool submits the slot. When the
/// stalled one wakes, its commit fails and its retry finds the slot decided: one task.
#[test]
fn a_stalled_tick_is_ended_and_another_pool_submits_its_slot_once() {
    let Some(db) = TestDb::new() else {
        return;
    };
    let clock = ManualClock::starting_at(UNIX_EPOCH + Duration::from_secs(T0));
    let (stalled_tx, stalled) = crossbeam_channel::bounded::<()>(1);
    let (wake, woken) = crossbeam_channel::bounded::<()>(1);
    let once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pool = |stall: bool| {
        let (stalled_tx, woken, once) = (stalled_tx.clone(), woken.clone(), once.clone());
        let schedule = Schedule::every("stall", Duration::from_secs(10), SLOT, move |slot| {
            if stall && !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                // This pool's first payload: stall until the test wakes it.
                let _ = stalled_tx.send(());
                let _ = woken.recv_timeout(Duration::from_secs(60));
            }
            ("stall".to_owned(), secs(slot))
        });
        pool_on(&db, &clock, schedule.missed(Missed::CatchUp(10)))
    };
    let first = pool(true);
    clock.advance(Duration::from_secs(10));
    stalled
        .recv_timeout(Duration::from_secs(20))
        .expect("the first pool's tick stalls");
    let second = pool(false);
    let give_up = Instant::now() + Duration::from_secs(40);
    while submitted(&db, "stall").is_empty() {
        assert!(Instant::now() < give_up, "no pool submitted the slot");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The first pool's payload function has not returned: the second pool made the slot, once
    // the server ended the stalled transaction (it could not lock the row before).
    wake.send(()).unwrap();
    // The stalled tick's retry finds the slot decided: its next tick is the next slot's.
    clock.advance(Duration::from_secs(10));
    let give_up = Instant::now() + Duration::from_secs(20);
    while submitted(&db, "stall").len() < 2 {
        assert!(Instant::now() < give_up, "the next slot was not submitted");
        std::thread::sleep(Duration::from_millis(50));
    }
    first.wait_idle();
    second.wait_idle();
    assert_eq!(submitted(&db, "stall"), vec![(T0 + 10, 1), (T0 + 20, 1)]);
}
