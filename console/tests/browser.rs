//! The dashboard driven in a real headless browser (Chromium, through the DevTools protocol)
//! against a real server and real pools: its figures checked against the rows, a dead letter
//! retried and a queue paused by clicking, hostile payloads and errors that must not run, and
//! the requests it must refuse. Screenshots of the overview and a task's page are saved under
//! the target directory (`tmp/screenshots`).
//!
//! Without Chromium these tests say so loudly and pass, unless `TASQ_BROWSER_REQUIRED` is set
//! (as `.ci/run` sets it, after installing Chromium): then they fail.

#[path = "../../tests/support_pg/mod.rs"]
mod support_pg;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};
use support_pg::TestDb;
use tasq::postgres::Admin;
use tasq::{HandlerError, PauseTarget, Pool, TaskState, TaskType, TypeOptions};
use tasq_console::web::{Dashboard, Running, WebError};

const MAIL: TaskType<String, String> = TaskType::new("mail");
const REPORT: TaskType<u32, u32> = TaskType::new("report");
const HANG_GUARD: Duration = Duration::from_secs(20);

/// The one browser of this test binary, or `None` (after a loud message) without Chromium.
fn browser() -> Option<&'static Browser> {
    static BROWSER: OnceLock<Option<Browser>> = OnceLock::new();
    BROWSER
        .get_or_init(|| {
            let path = std::env::var_os("CHROME")
                .map(std::path::PathBuf::from)
                .or_else(|| {
                    [
                        "/usr/bin/chromium",
                        "/usr/bin/chromium-browser",
                        "/usr/bin/google-chrome",
                    ]
                    .iter()
                    .map(std::path::PathBuf::from)
                    .find(|p| p.exists())
                });
            let Some(path) = path else {
                if std::env::var_os("TASQ_BROWSER_REQUIRED").is_some() {
                    panic!("TASQ_BROWSER_REQUIRED is set, but no Chromium was found");
                }
                eprintln!(
                    "\n*** SKIPPING the browser tests: no Chromium (set CHROME to its path, or \
                     install Debian's chromium package). ***\n"
                );
                return None;
            };
            let options = LaunchOptions::default_builder()
                .path(Some(path))
                .headless(true)
                .sandbox(false)
                .window_size(Some((1280, 1000)))
                .idle_browser_timeout(Duration::from_secs(300))
                .build()
                .expect("browser options");
            Some(Browser::new(options).expect("launch Chromium"))
        })
        .as_ref()
}

fn tab(browser: &Browser) -> Arc<Tab> {
    let tab = browser.new_tab().expect("a tab");
    tab.set_default_timeout(HANG_GUARD);
    tab
}

fn open(tab: &Tab, url: &str) {
    tab.navigate_to(url)
        .unwrap()
        .wait_until_navigated()
        .unwrap();
}

fn text(tab: &Tab, selector: &str) -> String {
    tab.wait_for_element(selector)
        .unwrap_or_else(|e| panic!("{selector}: {e}"))
        .get_inner_text()
        .unwrap()
}

/// Evaluates `js` in the page, as JSON.
fn eval(tab: &Tab, js: &str) -> serde_json::Value {
    tab.evaluate(js, false)
        .unwrap()
        .value
        .unwrap_or(serde_json::Value::Null)
}

/// Clicks `selector` (a form's button) and waits for the page it leads to: a new document,
/// told from the old by a mark set on the old one before the click.
fn click(tab: &Tab, selector: &str) {
    let button = tab
        .wait_for_element(selector)
        .unwrap_or_else(|e| panic!("{selector}: {e}"));
    eval(tab, "window.tasqOldPage = true");
    // (The pages are short: every button is in the 1280 x 1000 window without scrolling.)
    let point = button.get_midpoint().unwrap();
    // A mouse click at the button, as a person's: the form's POST navigates the page away,
    // which may end the click's own call before it answers (the loop below tells).
    if let Err(error) = tab.click_point(point) {
        assert!(
            error.to_string().contains("navigated or closed"),
            "{selector}: {error}"
        );
    }
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        // Evaluating may fail while the page changes: then ask again.
        let old = tab
            .evaluate("window.tasqOldPage === true", false)
            .ok()
            .and_then(|r| r.value)
            .and_then(|v| v.as_bool())
            .unwrap_or(true);
        if !old {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{selector} led nowhere"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    tab.wait_until_navigated().unwrap();
}

/// The number of the task a retry made, as the page's message after the click names it.
fn retried_as(tab: &Tab) -> u64 {
    let flash = text(tab, "#flash");
    flash
        .strip_prefix("Retried as task ")
        .unwrap_or_else(|| panic!("{flash}"))
        .parse()
        .unwrap()
}

fn screenshot(tab: &Tab, name: &str) {
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
}

fn dashboard(db: &TestDb) -> Running {
    Dashboard::new(Admin::connect(&db.url).unwrap())
        .bind("127.0.0.1:0")
        .sample_every(Duration::from_millis(100))
        // A reload in the middle of a test would look like a click's page.
        .refresh_every(None)
        .start()
        .unwrap()
}

/// A raw HTTP request, for what a browser would not send: the response's status and body.
fn raw(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    (status, response)
}

/// A worker: mail fails for good at a `bad` address (the error holds the address); reports
/// succeed and are counted.
fn worker(db: &TestDb, fixed: Arc<AtomicU32>, reports: Arc<AtomicU32>) -> Pool {
    Pool::builder()
        .postgres(db.url.clone())
        .poll_interval(Duration::from_millis(50))
        .workers(2)
        .register_with(
            MAIL,
            TypeOptions::new().queue("mail"),
            move |_, to: &String| {
                if to.contains("bad") && fixed.load(Ordering::SeqCst) == 0 {
                    Err(HandlerError::permanent(format!("no such mailbox: {to}")))
                } else {
                    Ok(format!("sent to {to}"))
                }
            },
        )
        .register(REPORT, move |_, n: &u32| {
            reports.fetch_add(1, Ordering::SeqCst);
            Ok::<_, HandlerError>(*n)
        })
        .build()
        .unwrap()
}

/// A worker whose mail to a `bad` address always fails.
fn failing_worker(db: &TestDb) -> Pool {
    worker(db, Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)))
}

#[test]
fn the_overview_shows_the_rows_and_a_click_retries_a_dead_letter() {
    let Some(browser) = browser() else { return };
    let Some(db) = TestDb::new() else { return };
    let fixed = Arc::new(AtomicU32::new(0));
    let pool = worker(&db, fixed.clone(), Arc::new(AtomicU32::new(0)));
    let dead = pool
        .submit(MAIL.task("bad@example.com".to_owned()))
        .unwrap();
    assert_eq!(
        dead.wait_timeout(HANG_GUARD).unwrap().state(),
        TaskState::Failed
    );
    for i in 0..3 {
        let done = pool.submit(REPORT.task(i)).unwrap();
        done.wait_timeout(HANG_GUARD).unwrap();
    }
    pool.shutdown(HANG_GUARD);
    // Waiting work, with no worker: 5 reports ready, 2 of them urgent, 1 due in an hour.
    let producer = Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(REPORT, TypeOptions::new())
        .build()
        .unwrap();
    for i in 0..5 {
        producer
            .submit(REPORT.task(i).priority(if i < 2 { 9 } else { 0 }))
            .unwrap();
    }
    producer
        .submit(REPORT.task(9).delay(Duration::from_secs(3600)))
        .unwrap();
    let running = dashboard(&db);
    let base = format!("http://{}", running.addr());
    let tab = tab(browser);
    open(&tab, &format!("{base}/"));
    // The page's figures are the rows', counted here another way.
    let mut sql = db.client();
    let mut count = |predicate: &str| -> String {
        let n: i64 = sql
            .query_one(
                &format!("SELECT count(*) FROM tasq_tasks WHERE {predicate}"),
                &[],
            )
            .unwrap()
            .get(0);
        n.to_string()
    };
    assert_eq!(
        text(&tab, "#n-ready"),
        count("status = 'ready' AND run_at <= now()")
    );
    assert_eq!(
        text(&tab, "#n-scheduled"),
        count("status = 'ready' AND run_at > now()")
    );
    assert_eq!(text(&tab, "#n-succeeded"), count("status = 'succeeded'"));
    assert_eq!(text(&tab, "#n-dead"), count("dead"));
    assert_eq!(text(&tab, "#n-ready"), "5");
    assert!(text(&tab, "#types").contains("report"));
    assert_eq!(
        eval(&tab, "document.querySelectorAll('svg.plot').length").as_u64(),
        Some(4),
        "three plots, and one for queue default"
    );
    screenshot(&tab, "overview.png");

    // The dead letter's Retry button: the new task runs on a worker.
    fixed.store(1, Ordering::SeqCst);
    let pool = worker(&db, fixed, Arc::new(AtomicU32::new(0)));
    open(&tab, &format!("{base}/dead"));
    let seq = dead.id().seq();
    assert!(text(&tab, "#tasks").contains("no such mailbox: bad@example.com"));
    click(&tab, &format!("tr[data-id='{seq}'] button.retry"));
    let new = retried_as(&tab);
    let admin = Admin::connect(&db.url).unwrap();
    let handle = pool.handle(MAIL, admin.task_id(new)).expect("the new task");
    assert_eq!(
        handle.wait_timeout(HANG_GUARD).unwrap().succeeded(),
        Some("sent to bad@example.com".to_owned())
    );
    open(&tab, &format!("{base}/tasks/{new}"));
    assert_eq!(text(&tab, "#state"), "succeeded");
    screenshot(&tab, "task.png");
    producer.shutdown(HANG_GUARD);
    pool.shutdown(HANG_GUARD);
    running.stop();
}

#[test]
fn a_click_pauses_a_queue_and_no_claim_of_it_starts() {
    let Some(browser) = browser() else { return };
    let Some(db) = TestDb::new() else { return };
    let reports = Arc::new(AtomicU32::new(0));
    let pool = worker(&db, Arc::new(AtomicU32::new(1)), reports.clone());
    // A first mail makes queue mail appear on the overview.
    let first = pool.submit(MAIL.task("ann".to_owned())).unwrap();
    first.wait_timeout(HANG_GUARD).unwrap();
    let admin = Admin::connect(&db.url).unwrap();
    admin.set_queue_limit("mail", Some(5)).unwrap();
    let running = dashboard(&db);
    let base = format!("http://{}", running.addr());
    let tab = tab(browser);
    open(&tab, &format!("{base}/"));
    click(&tab, "tr[data-queue='mail'] button.pause");
    assert_eq!(text(&tab, "#flash"), "queue mail: paused for the fleet");
    assert_eq!(
        admin.paused().unwrap()[0].target,
        PauseTarget::queue("mail")
    );
    // Paused: a mail waits while a report submitted after it runs (the worker claims).
    let held = pool.submit(MAIL.task("bob".to_owned())).unwrap();
    let report = pool.submit(REPORT.task(1)).unwrap();
    report.wait_timeout(HANG_GUARD).unwrap();
    assert!(held.wait_timeout(Duration::from_millis(200)).is_none());
    assert_eq!(
        admin.task(held.id()).unwrap().unwrap().row.state,
        TaskState::Ready
    );
    assert!(text(&tab, "tr[data-queue='mail']").contains("paused"));
    click(&tab, "tr[data-queue='mail'] button.resume");
    assert_eq!(text(&tab, "#flash"), "queue mail: resumed for the fleet");
    assert_eq!(
        held.wait_timeout(HANG_GUARD).unwrap().succeeded(),
        Some("sent to bob".to_owned())
    );
    pool.shutdown(HANG_GUARD);
    running.stop();
}

#[test]
fn payloads_errors_and_keys_are_text_never_markup() {
    let Some(browser) = browser() else { return };
    let Some(db) = TestDb::new() else { return };
    let pool = failing_worker(&db);
    let script = "<script>window.pwned = 1</script>";
    let image = "<img src=x onerror=\"window.pwned = 2\">";
    // The payload carries both; the error repeats the address; the key is markup too.
    let hostile = pool
        .submit(
            MAIL.task(format!("bad {script} {image}"))
                .key(format!("{image}{script}")),
        )
        .unwrap();
    assert_eq!(
        hostile.wait_timeout(HANG_GUARD).unwrap().state(),
        TaskState::Failed
    );
    let running = dashboard(&db);
    let base = format!("http://{}", running.addr());
    let tab = tab(browser);
    let seq = hostile.id().seq();
    let key = format!("{image}{script}");
    let key_page = tasq_console_link("/tasks", &key);
    for page in [
        format!("/tasks/{seq}"),
        "/dead".to_owned(),
        "/tasks".to_owned(),
        key_page,
    ] {
        open(&tab, &format!("{base}{page}"));
        tab.wait_for_element("main").unwrap();
        assert_eq!(
            eval(&tab, "typeof window.pwned").as_str(),
            Some("undefined"),
            "{page}"
        );
        assert_eq!(
            eval(
                &tab,
                "document.querySelectorAll('script, img, [onerror]').length"
            )
            .as_u64(),
            Some(0),
            "markup from a task became elements on {page}"
        );
        let body = text(&tab, "main");
        assert!(body.contains(script), "{page}: {body}");
        assert!(body.contains("onerror="), "{page}: {body}");
    }
    open(&tab, &format!("{base}/tasks/{seq}"));
    assert!(text(&tab, "#payload").contains(script));
    assert!(text(&tab, "#error").contains(image));
    assert_eq!(text(&tab, "#key"), key);
    pool.shutdown(HANG_GUARD);
    running.stop();
}

/// `/tasks?key=<key>`, encoded as the dashboard's own links are.
fn tasq_console_link(path: &str, key: &str) -> String {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("key", key)
        .finish();
    format!("{path}?{query}")
}

#[test]
fn forged_and_unauthenticated_requests_are_refused() {
    let Some(browser) = browser() else { return };
    let Some(db) = TestDb::new() else { return };
    let admin = Admin::connect(&db.url).unwrap();
    let running = dashboard(&db);
    let addr = running.addr();
    // A POST without the CSRF token, or with another: refused, and nothing paused.
    let body = "kind=queue&name=mail";
    let forged = format!(
        "POST /pause HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, response) = raw(addr, &forged);
    assert_eq!(status, 403, "{response}");
    let body = "kind=queue&name=mail&csrf=0000";
    let guessed = format!(
        "POST /pause HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(raw(addr, &guessed).0, 403);
    assert!(admin.paused().unwrap().is_empty());
    // A page of another site that rebinds its name to this address: refused.
    let rebound = "GET / HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(addr, rebound).0, 421);
    running.stop();

    // Any address but a loopback one needs a token; with one, a request without it is refused.
    let error = Dashboard::new(Admin::connect(&db.url).unwrap())
        .bind("0.0.0.0:0")
        .start()
        .err()
        .expect("refused to start without a token");
    assert!(matches!(error, WebError::TokenRequired(_)), "{error}");
    let token = tasq_console::web::random_token();
    let open_bind = Dashboard::new(Admin::connect(&db.url).unwrap())
        .bind("0.0.0.0:0")
        .token(token.clone())
        .start()
        .unwrap();
    let port = open_bind.addr().port();
    let local: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let bare = format!("GET / HTTP/1.1\r\nHost: {local}\r\nConnection: close\r\n\r\n");
    let (status, response) = raw(local, &bare);
    assert_eq!(status, 401, "{response}");
    let wrong = format!(
        "GET / HTTP/1.1\r\nHost: {local}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        &token[..63]
    );
    assert_eq!(raw(local, &wrong).0, 401);
    let with = format!(
        "GET / HTTP/1.1\r\nHost: {local}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(raw(local, &with).0, 200);
    // In the browser: refused, then the token once in the address, kept as a cookie.
    let tab = tab(browser);
    open(&tab, &format!("http://{local}/tasks"));
    assert_eq!(text(&tab, "h1"), "Access token required");
    open(&tab, &format!("http://{local}/?token={token}"));
    assert_eq!(text(&tab, "h1"), "Overview");
    assert!(!tab.get_url().contains("token"), "{}", tab.get_url());
    open(&tab, &format!("http://{local}/tasks"));
    assert_eq!(text(&tab, "h1"), "Tasks");
    open_bind.stop();
}

#[test]
fn a_read_only_dashboard_has_no_buttons_and_refuses_actions() {
    let Some(browser) = browser() else { return };
    let Some(db) = TestDb::new() else { return };
    let pool = failing_worker(&db);
    let dead = pool.submit(MAIL.task("bad".to_owned())).unwrap();
    dead.wait_timeout(HANG_GUARD).unwrap();
    let running = Dashboard::new(Admin::connect(&db.url).unwrap())
        .bind("127.0.0.1:0")
        .read_only(true)
        .start()
        .unwrap();
    let base = format!("http://{}", running.addr());
    let tab = tab(browser);
    for page in [
        "/",
        "/dead",
        &format!("/tasks/{}", dead.id().seq()),
        "/schedules",
    ] {
        open(&tab, &format!("{base}{page}"));
        tab.wait_for_element("main").unwrap();
        assert_eq!(
            eval(
                &tab,
                "document.querySelectorAll('form[method=post]').length"
            )
            .as_u64(),
            Some(0),
            "{page}"
        );
    }
    assert_eq!(text(&tab, "nav .readonly"), "read-only");
    let body = "kind=queue&name=mail";
    let post = format!(
        "POST /pause HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        running.addr(),
        body.len()
    );
    assert_eq!(raw(running.addr(), &post).0, 403);
    pool.shutdown(HANG_GUARD);
    running.stop();
}

/// A pool in the test's own process (the embedded store), with its dashboard: mails fail
/// until `fixed` is set.
fn embedded(fixed: Arc<AtomicU32>) -> Arc<Pool> {
    let pool = Pool::builder()
        .workers(1)
        .queue("mail", 1)
        .register_with(
            MAIL,
            TypeOptions::new().queue("mail"),
            move |_, to: &String| {
                if fixed.load(Ordering::SeqCst) == 0 {
                    Err(HandlerError::permanent(format!("no such mailbox: {to}")))
                } else {
                    Ok(format!("sent to {to}"))
                }
            },
        )
        .register(REPORT, |_, n: &u32| Ok::<_, HandlerError>(n * 2))
        .build()
        .unwrap();
    Arc::new(pool)
}

#[test]
fn an_embedded_pool_s_dashboard_shows_its_figures_and_its_buttons_act_on_it() {
    let Some(browser) = browser() else { return };
    let fixed = Arc::new(AtomicU32::new(0));
    let pool = embedded(fixed.clone());
    let dead = pool
        .submit(MAIL.task("bad@example.com".to_owned()))
        .unwrap();
    assert!(dead.wait_timeout(HANG_GUARD).unwrap().is_failed());
    for i in 0..3 {
        pool.submit(REPORT.task(i))
            .unwrap()
            .wait_timeout(HANG_GUARD)
            .unwrap();
    }
    // Waiting work: three reports held by a pause of their type, one due in an hour.
    assert!(pool.pause(PauseTarget::task_type("report")).unwrap());
    let held: Vec<_> = (10..13)
        .map(|i| pool.submit(REPORT.task(i)).unwrap())
        .collect();
    pool.submit(REPORT.task(99).delay(Duration::from_secs(3600)))
        .unwrap();
    let running = Dashboard::new(Arc::clone(&pool))
        .bind("127.0.0.1:0")
        .sample_every(Duration::from_millis(100))
        .refresh_every(None)
        .start()
        .unwrap();
    let base = format!("http://{}", running.addr());
    let tab = tab(browser);
    open(&tab, &format!("{base}/"));
    // The page's figures are the pool's.
    let states = pool.overview().unwrap().states;
    assert_eq!(text(&tab, "#n-ready"), states.ready.to_string());
    assert_eq!(text(&tab, "#n-ready"), "3");
    assert_eq!(text(&tab, "#n-scheduled"), "1");
    assert_eq!(text(&tab, "#n-succeeded"), "3");
    assert_eq!(text(&tab, "#n-dead"), "1");
    assert!(text(&tab, "tr[data-type='report']").contains("paused"));
    assert!(text(&tab, "tr[data-queue='mail']").contains("mail"));
    screenshot(&tab, "embedded-overview.png");

    // Resume the reports by clicking: they run.
    click(&tab, "tr[data-type='report'] button.resume");
    assert_eq!(text(&tab, "#flash"), "type report: resumed");
    for handle in &held {
        assert!(handle.wait_timeout(HANG_GUARD).unwrap().is_succeeded());
    }
    assert!(pool.paused().unwrap().is_empty());

    // The dead letter's Retry button: the new task runs, and succeeds now.
    fixed.store(1, Ordering::SeqCst);
    open(&tab, &format!("{base}/dead"));
    assert!(text(&tab, "#tasks").contains("no such mailbox: bad@example.com"));
    click(
        &tab,
        &format!("tr[data-id='{}'] button.retry", dead.id().seq()),
    );
    let new = retried_as(&tab);
    let handle = pool
        .handle(MAIL, tasq::TaskId::from_parts(pool.id(), new))
        .expect("the new task");
    assert_eq!(
        handle.wait_timeout(HANG_GUARD).unwrap().succeeded(),
        Some("sent to bad@example.com".to_owned())
    );
    open(&tab, &format!("{base}/tasks/{new}"));
    assert_eq!(text(&tab, "#state"), "succeeded");
    assert_eq!(text(&tab, "#payload"), "kept by the pool as a Rust value");
    open(&tab, &format!("{base}/tasks/{}", dead.id().seq()));
    assert!(
        text(&tab, "main").contains(&new.to_string()),
        "the old task names the new one"
    );
    running.stop();
    pool.shutdown(HANG_GUARD);
}
