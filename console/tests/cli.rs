//! The `tasq` command run as an operator runs it, a process against a real server: every
//! subcommand, its tables and its JSON, and the exit code and one-line message of every
//! failure a script must tell apart (never a panic or a stack trace).

#[path = "../../tests/support_pg/mod.rs"]
mod support_pg;

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use support_pg::TestDb;
use tasq::postgres::Admin;
use tasq::{HandlerError, PauseTarget, Pool, Schedule, TaskState, TaskType, TypeOptions};

const MAIL: TaskType<String, String> = TaskType::new("mail");
const HANG_GUARD: Duration = Duration::from_secs(20);

/// Runs `tasq` with `args` against `url` (none: no URL at all).
fn tasq(url: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tasq"));
    command
        .env_remove("TASQ_DATABASE_URL")
        .env_remove("TASQ_SCHEMA");
    if let Some(url) = url {
        command.arg("--url").arg(url);
    }
    command.args(args).output().expect("run tasq")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// Runs `tasq --json args` and reads its output, which must succeed.
fn json(db: &TestDb, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let output = tasq(Some(&db.url), &all);
    assert!(
        output.status.success(),
        "tasq {args:?}: {}",
        stderr(&output)
    );
    serde_json::from_str(&stdout(&output)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&output)))
}

/// Checks a failure: its exit code, a one-line message naming the problem, no panic.
fn fails(output: &Output, code: i32, says: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(says), "expected {says:?} in {err:?}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
    assert!(
        stdout(output).is_empty(),
        "a failure printed {}",
        stdout(output)
    );
}

/// A pool whose mail fails for good when the address holds `bad`.
fn worker(db: &TestDb) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .workers(2)
        .register(MAIL, |_, to: &String| {
            if to.contains("bad") {
                Err(HandlerError::permanent(format!("no such mailbox: {to}")))
            } else {
                Ok(format!("sent to {to}"))
            }
        })
        .build()
        .unwrap()
}

fn producer(db: &TestDb) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(MAIL, TypeOptions::new().queue("mail"))
        .build()
        .unwrap()
}

#[test]
fn every_failure_has_its_exit_code_and_a_clear_line() {
    let Some(db) = TestDb::new() else { return };
    fails(&tasq(None, &["stats"]), 2, "TASQ_DATABASE_URL");
    fails(
        &tasq(
            Some("host=127.0.0.1 port=1 user=postgres connect_timeout=2"),
            &["stats"],
        ),
        5,
        "could not connect",
    );
    fails(
        &tasq(Some("this = = is not a url"), &["stats"]),
        5,
        "does not parse",
    );
    fails(
        &tasq(
            Some(&db.url),
            &["--schema", "tasq_cli_nothing_here", "stats"],
        ),
        5,
        "run `tasq migrate`",
    );
    fails(
        &tasq(Some(&db.url), &["--schema", "Bad-Name", "stats"]),
        2,
        "schema name",
    );
    let old = TestDb::at_version(tasq::postgres::SCHEMA_VERSION - 1).unwrap();
    fails(&tasq(Some(&old.url), &["stats"]), 5, "run `tasq migrate`");
    fails(
        &tasq(Some(&db.url), &["tasks", "show", "424242"]),
        3,
        "no task 424242",
    );
    fails(
        &tasq(Some(&db.url), &["tasks", "show", "x1"]),
        2,
        "is not a task id",
    );
    fails(
        &tasq(Some(&db.url), &["cancel", "--key", "nobody"]),
        3,
        "nobody",
    );
    fails(
        &tasq(Some(&db.url), &["pause", "--queue", "Bad Name"]),
        2,
        "Bad Name",
    );
    fails(
        &tasq(Some(&db.url), &["limit", "mail", "0"]),
        2,
        "pause the queue instead",
    );
    fails(
        &tasq(Some(&db.url), &["limit", "mail", "many"]),
        2,
        "not a limit",
    );
    // Bad usage is clap's: code 2 and its own message.
    let output = tasq(Some(&db.url), &["pause"]);
    assert_eq!(output.status.code(), Some(2));
    let output = tasq(Some(&db.url), &["dead", "retry", "--type", "mail"]);
    assert_eq!(output.status.code(), Some(2), "--type without --all");
    // The environment gives the URL and the schema.
    let output = Command::new(env!("CARGO_BIN_EXE_tasq"))
        .env("TASQ_DATABASE_URL", &db.url)
        .env("TASQ_SCHEMA", db.schema())
        .args(["--json", "stats"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn migrate_creates_then_finds_nothing_to_do() {
    let Some(db) = TestDb::new() else { return };
    let schema = format!("{}_cli", db.schema());
    let first = json(&db, &["--schema", &schema, "migrate"]);
    assert_eq!(first["from"], 0);
    assert_eq!(first["to"], tasq::postgres::SCHEMA_VERSION);
    let again = tasq(Some(&db.url), &["--schema", &schema, "migrate"]);
    assert!(
        stdout(&again).contains("nothing to do"),
        "{}",
        stdout(&again)
    );
    let stats = json(&db, &["--schema", &schema, "stats"]);
    assert_eq!(stats["states"]["ready"], 0);
    db.client()
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .unwrap();
}

#[test]
fn stats_lists_and_shows_what_the_rows_hold() {
    let Some(db) = TestDb::new() else { return };
    let pool = worker(&db);
    let dead = pool.submit(MAIL.task("bad".to_owned())).unwrap();
    assert_eq!(
        dead.wait_timeout(HANG_GUARD).unwrap().state(),
        TaskState::Failed
    );
    pool.shutdown(HANG_GUARD);
    let producer = producer(&db);
    let mut ids = Vec::new();
    for i in 0..7 {
        let task = MAIL.task(format!("to{i}")).key(format!("k{i}"));
        ids.push(producer.submit(task).unwrap().id());
    }
    // A payload that would move a terminal's cursor and clear its screen.
    let hostile = producer
        .submit(MAIL.task("\u{1b}[2J\u{1b}[Hgotcha\r".to_owned()))
        .unwrap();

    let stats = json(&db, &["stats"]);
    assert_eq!(stats["states"]["ready"], 8);
    assert_eq!(stats["states"]["dead"], 1);
    assert_eq!(stats["queues"].as_array().unwrap().len(), 1, "{stats}");
    assert_eq!(stats["queues"][0]["name"], "mail");
    assert_eq!(stats["queues"][0]["ready"], 8);
    assert_eq!(stats["types"][0]["dead"], 1);
    let table = stdout(&tasq(Some(&db.url), &["stats"]));
    assert!(table.contains("mail") && table.contains("ready"), "{table}");

    // Pages of 3, followed by --after, cover the ready mail once each.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["tasks", "list", "--state", "ready", "--limit", "3"];
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let page = json(&db, &args);
        for task in page["tasks"].as_array().unwrap() {
            seen.push(task["seq"].as_u64().unwrap());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    let mut expected: Vec<u64> = ids.iter().map(|id| id.seq()).collect();
    expected.push(hostile.id().seq());
    assert_eq!(seen, expected);
    let keyed = json(&db, &["tasks", "list", "--key", "k3"]);
    assert_eq!(keyed["tasks"][0]["seq"], ids[3].seq());
    let by_type = json(
        &db,
        &["tasks", "list", "--type", "mail", "--queue", "default"],
    );
    assert_eq!(
        by_type["tasks"].as_array().unwrap().len(),
        1,
        "the dead letter"
    );

    // One task: JSON keeps the payload exact; the table shows its control characters escaped.
    let seq = hostile.id().seq().to_string();
    let shown = json(&db, &["tasks", "show", &seq]);
    assert_eq!(shown["payload"], "\u{1b}[2J\u{1b}[Hgotcha\r");
    assert_eq!(shown["timeline"][0]["what"], "submitted");
    let text = stdout(&tasq(Some(&db.url), &["tasks", "show", &seq]));
    assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
    assert!(text.contains("\\u001b[2J"), "{text}");
    // The whole id works too.
    let whole = format!("{}:{}", hostile.id().pool(), hostile.id().seq());
    assert_eq!(
        json(&db, &["tasks", "show", &whole])["seq"],
        hostile.id().seq()
    );
    producer.shutdown(HANG_GUARD);
}

#[test]
fn dead_letters_are_listed_retried_and_purged() {
    let Some(db) = TestDb::new() else { return };
    let pool = worker(&db);
    let mut handles = Vec::new();
    for to in ["bad-a1", "bad-a2", "bad-b1", "bad-b2", "bad-b3"] {
        handles.push(pool.submit(MAIL.task(to.to_owned())).unwrap());
    }
    for handle in &handles {
        assert_eq!(
            handle.wait_timeout(HANG_GUARD).unwrap().state(),
            TaskState::Failed
        );
    }
    pool.shutdown(HANG_GUARD);
    let listed = json(&db, &["dead", "list"]);
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 5);
    let first = handles[0].id().seq().to_string();
    let shown = json(&db, &["dead", "show", &first]);
    assert_eq!(shown["last_error"], "no such mailbox: bad-a1");
    assert_eq!(shown["dead"], true);

    // A dry run lists and changes nothing.
    let dry = json(
        &db,
        &["dead", "retry", "--all", "--error", "bad-b", "--dry-run"],
    );
    assert_eq!(dry["matched"].as_array().unwrap().len(), 3);
    assert!(dry["done"].as_array().unwrap().is_empty());
    assert_eq!(json(&db, &["stats"])["states"]["dead"], 5);
    let done = json(&db, &["dead", "retry", "--all", "--error", "bad-b"]);
    assert_eq!(done["done"].as_array().unwrap().len(), 3);
    // One retry, then refused: it is no dead letter any more.
    let one = json(&db, &["dead", "retry", &first]);
    assert!(one["done"][0]["new"].is_string());
    fails(
        &tasq(Some(&db.url), &["dead", "retry", &first]),
        4,
        "not a dead letter",
    );
    // The last one purged: its payload gone, and a second purge refused.
    let last = handles[1].id().seq().to_string();
    let purged = json(&db, &["dead", "purge", &last]);
    assert_eq!(purged["done"].as_array().unwrap().len(), 1);
    fails(
        &tasq(Some(&db.url), &["dead", "purge", &last]),
        4,
        "not a dead letter",
    );
    let stats = json(&db, &["stats"]);
    assert_eq!(stats["states"]["dead"], 0);
    assert_eq!(
        stats["states"]["ready"], 4,
        "the four retried wait for a worker"
    );
    // A worker runs the retried mail (it still fails: the mailbox is bad).
    let pool = worker(&db);
    let admin = Admin::connect(&db.url).unwrap();
    support_pg::eventually(20, "the retried mail ran", || {
        admin.overview().unwrap().states.dead == 4
    });
    pool.shutdown(HANG_GUARD);
}

#[test]
fn cancel_pause_resume_and_limits_act_on_the_fleet() {
    let Some(db) = TestDb::new() else { return };
    let producer = producer(&db);
    let admin = Admin::connect(&db.url).unwrap();
    let a = producer.submit(MAIL.task("a".to_owned())).unwrap();
    producer
        .submit(MAIL.task("b".to_owned()).key("order-7"))
        .unwrap();
    let out = json(&db, &["cancel", &a.id().seq().to_string()]);
    assert_eq!(out["outcome"], "cancelled");
    assert_eq!(
        a.wait_timeout(HANG_GUARD).unwrap().state(),
        TaskState::Cancelled
    );
    let out = json(&db, &["cancel", &a.id().seq().to_string()]);
    assert_eq!(out["outcome"], "already finished");
    assert_eq!(
        json(&db, &["cancel", "--key", "order-7"])["outcome"],
        "cancelled"
    );

    let out = stdout(&tasq(Some(&db.url), &["pause", "--queue", "mail"]));
    assert!(out.contains("queue mail: paused for the fleet"), "{out}");
    assert_eq!(
        admin.paused().unwrap()[0].target,
        PauseTarget::queue("mail")
    );
    assert_eq!(json(&db, &["pause", "--queue", "mail"])["changed"], false);
    json(&db, &["pause", "--type", "mail"]);
    assert_eq!(admin.paused().unwrap().len(), 2);
    json(&db, &["resume", "--queue", "mail"]);
    json(&db, &["resume", "--type", "mail"]);
    assert!(admin.paused().unwrap().is_empty());

    let set = json(&db, &["limit", "mail", "3"]);
    assert_eq!(
        (set["limit"].as_u64(), set["before"].as_u64()),
        (Some(3), None)
    );
    assert_eq!(admin.queue_limits().unwrap()[0].max_running, 3);
    let listed = json(&db, &["limit"]);
    assert_eq!(listed[0]["queue"], "mail");
    let lifted = json(&db, &["limit", "mail", "none"]);
    assert_eq!(lifted["before"], 3);
    assert!(admin.queue_limits().unwrap().is_empty());
    producer.shutdown(HANG_GUARD);
}

#[test]
fn schedules_and_watch_show_the_live_queue() {
    let Some(db) = TestDb::new() else { return };
    assert!(stdout(&tasq(Some(&db.url), &["schedules"])).contains("no periodic tasks"));
    let pool = Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .workers(1)
        .register(MAIL, |_, to: &String| Ok::<_, HandlerError>(to.clone()))
        .schedule(Schedule::every(
            "digest",
            Duration::from_secs(3600),
            MAIL,
            |_| "digest@example.com".to_owned(),
        ))
        .build()
        .unwrap();
    let admin = Admin::connect(&db.url).unwrap();
    support_pg::eventually(20, "the schedule's row", || {
        !admin.schedules().unwrap().is_empty()
    });
    let listed = json(&db, &["schedules"]);
    assert_eq!(listed[0]["name"], "digest");
    assert!(listed[0]["next_slot"].is_string());
    json(&db, &["pause", "--schedule", "digest"]);
    assert_eq!(json(&db, &["schedules"])[0]["paused"], true);

    // Two frames of JSON, one a line.
    let output = tasq(
        Some(&db.url),
        &["--json", "watch", "--interval", "10ms", "--count", "2"],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let frames: Vec<Value> = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(frames.len(), 2);
    assert!(frames.iter().all(|f| f["states"].is_object()));
    // As a table, each frame clears the screen first.
    let output = tasq(
        Some(&db.url),
        &["watch", "--interval", "10ms", "--count", "2"],
    );
    assert_eq!(stdout(&output).matches("\u{1b}[2J").count(), 2);
    pool.shutdown(HANG_GUARD);
}

#[test]
fn web_serves_the_dashboard_and_refuses_an_open_bind_without_a_token() {
    use std::io::{BufRead, BufReader, Read, Write};
    let Some(db) = TestDb::new() else { return };
    fails(
        &tasq(Some(&db.url), &["web", "--bind", "0.0.0.0:0"]),
        2,
        "give an access token",
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_tasq"))
        .env_remove("TASQ_WEB_TOKEN")
        .args([
            "--url",
            &db.url,
            "web",
            "--bind",
            "127.0.0.1:0",
            "--read-only",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    assert!(line.contains("(read-only)"), "{line}");
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("<h1>Overview</h1>"));
    assert!(
        response.contains("http-equiv=\"refresh\" content=\"10\""),
        "the overview reloads itself"
    );
    assert!(
        !response.contains("method=\"post\""),
        "read-only has no forms"
    );
}
