//! The command and the dashboard against a live fleet under kill -9: three worker processes
//! run a queue (3,000 jobs of 25 ms) while one is killed with SIGKILL every 0.3-0.8 s (for at
//! most 20 s) and started again, and an operator reads it with `tasq stats`, pages its tasks,
//! pauses and resumes it, and loads the dashboard. Every command succeeds and its figures add
//! up to what was submitted; afterwards every task ends once, and the dead letters the command
//! lists are exactly the tasks that fail for good. Run with `--nocapture` to see the operator's
//! session.

#[path = "../../tests/support_pg/mod.rs"]
mod support_pg;
#[path = "../../tests/support_proc/mod.rs"]
mod support_proc;

use std::io::{BufRead, Read, Write};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support_pg::TestDb;
use tasq::{HandlerError, Pool, TaskType, TypeOptions};

const JOB: TaskType<u64, u64> = TaskType::new("job");
const TASKS: u64 = 3_000;
/// Every job whose number is a multiple of this fails for good.
const FAILS_EVERY: u64 = 17;
/// Attempts enough that no job runs out of them by being killed.
const OPTIONS: TypeOptions = TypeOptions::new().max_attempts(50);

/// Not a test: the body of a worker process. Runs until its stdin closes or it is killed.
#[test]
#[ignore = "a worker process of the fleet test, started by it"]
fn fleet_worker() {
    let url = std::env::var("TASQ_FLEET_URL").expect("TASQ_FLEET_URL");
    let pool = Pool::builder()
        .postgres(url)
        .workers(3)
        .lease(Duration::from_millis(600))
        .poll_interval(Duration::from_millis(50))
        .register_with(JOB, OPTIONS, |_, n: &u64| {
            std::thread::sleep(Duration::from_millis(25));
            if n % FAILS_EVERY == 0 {
                return Err(HandlerError::permanent(format!("job {n} cannot be done")));
            }
            Ok(n * 2)
        })
        .build()
        .unwrap();
    println!("ready");
    let mut line = String::new();
    while std::io::stdin()
        .lock()
        .read_line(&mut line)
        .is_ok_and(|n| n > 0)
    {
        line.clear();
    }
    pool.shutdown(Duration::from_secs(10));
}

fn spawn(db: &TestDb) -> Child {
    let (child, stdin, lines) =
        support_proc::spawn("fleet_worker", &[("TASQ_FLEET_URL", db.url.clone())]);
    support_proc::expect_line(&lines, "ready");
    // Closing stdin would stop it: keep it open for the process's life.
    std::mem::forget(stdin);
    child
}

fn tasq(db: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tasq"))
        .env("TASQ_DATABASE_URL", &db.url)
        .env_remove("TASQ_SCHEMA")
        .args(args)
        .output()
        .unwrap()
}

fn json(db: &TestDb, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = tasq(db, &all);
    assert!(
        out.status.success(),
        "tasq {args:?} failed under chaos: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn total(stats: &Value) -> u64 {
    let s = &stats["states"];
    [
        "blocked",
        "scheduled",
        "ready",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
    .iter()
    .map(|k| s[k].as_u64().unwrap())
    .sum()
}

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn the_console_reads_and_steers_a_fleet_under_kill_9() {
    let Some(db) = TestDb::new() else { return };
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(JOB, OPTIONS)
        .build()
        .unwrap();
    let mut fleet: Vec<Child> = (0..3).map(|_| spawn(&db)).collect();
    let dashboard =
        tasq_console::web::Dashboard::new(tasq::postgres::Admin::connect(&db.url).unwrap())
            .bind("127.0.0.1:0")
            .sample_every(Duration::from_millis(200))
            .start()
            .unwrap();
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(100) {
        let batch = chunk.iter().map(|&n| JOB.task(n)).collect();
        assert!(producer.submit_batch(batch).is_ok(), "submit a batch");
    }
    let mut kills = 0;
    let mut reads = 0;
    let mut paused_once = false;
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let start = Instant::now();
    let mut next_kill = start;
    loop {
        let stats = json(&db, &["stats"]);
        reads += 1;
        assert_eq!(
            total(&stats),
            TASKS,
            "the figures lose or add tasks: {stats}"
        );
        let finished = stats["states"]["succeeded"].as_u64().unwrap()
            + stats["states"]["failed"].as_u64().unwrap();
        if reads == 1 {
            println!(
                "$ tasq stats\n{}",
                String::from_utf8_lossy(&tasq(&db, &["stats"]).stdout)
            );
        }
        // A page of what runs now, and one of the dead letters so far.
        let running = json(
            &db,
            &["tasks", "list", "--state", "running", "--limit", "20"],
        );
        assert!(
            running["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["state"] == "running")
        );
        let dead = json(&db, &["dead", "list", "--limit", "5"]);
        assert!(
            dead["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["dead"] == true)
        );
        let page = get(dashboard.addr(), "/");
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        if !paused_once && finished > TASKS / 3 {
            // Paused for the fleet, resumed at once: both return under chaos.
            let out = tasq(&db, &["pause", "--type", "job"]);
            assert!(out.status.success());
            println!(
                "$ tasq pause --type job\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
            assert_eq!(json(&db, &["stats"])["types"][0]["paused"], true);
            let out = tasq(&db, &["resume", "--type", "job"]);
            assert!(out.status.success());
            println!(
                "$ tasq resume --type job\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
            paused_once = true;
        }
        if finished == TASKS {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "the fleet did not finish: {stats}"
        );
        if Instant::now() >= next_kill && start.elapsed() < Duration::from_secs(20) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let victim = (rng % 3) as usize;
            fleet[victim].kill().unwrap();
            fleet[victim].wait().unwrap();
            kills += 1;
            fleet[victim] = spawn(&db);
            next_kill = Instant::now() + Duration::from_millis(300 + rng % 500);
        }
    }
    // Every task ended once; the dead letters are exactly the jobs that fail for good.
    let stats = json(&db, &["stats"]);
    let expected_dead = (0..TASKS).filter(|n| n % FAILS_EVERY == 0).count() as u64;
    assert_eq!(
        stats["states"]["dead"].as_u64(),
        Some(expected_dead),
        "{stats}"
    );
    assert_eq!(
        stats["states"]["succeeded"].as_u64(),
        Some(TASKS - expected_dead),
        "{stats}"
    );
    let dry = json(
        &db,
        &[
            "dead",
            "retry",
            "--all",
            "--error",
            "cannot be done",
            "--dry-run",
        ],
    );
    assert_eq!(
        dry["matched"].as_array().unwrap().len() as u64,
        expected_dead
    );
    println!(
        "$ tasq dead list --limit 3\n{}",
        String::from_utf8_lossy(&tasq(&db, &["dead", "list", "--limit", "3"]).stdout)
    );
    println!(
        "fleet: {TASKS} tasks, {kills} kills (SIGKILL), {reads} reads by the command and the dashboard, all consistent"
    );
    assert!(kills >= 8, "the chaos killed only {kills} processes");
    dashboard.stop();
    for mut child in fleet {
        let _ = child.kill();
        let _ = child.wait();
    }
    producer.shutdown(Duration::from_secs(10));
}
