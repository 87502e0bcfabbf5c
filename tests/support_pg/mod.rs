//! How the tests reach PostgreSQL: each test gets its own schema in one database, migrated,
//! and dropped afterwards, so tests run in parallel without seeing each other's tasks.
//!
//! The server: `TASQ_PG_URL` (a key=value connection string) if set, else the local server at
//! 127.0.0.1:5432 (user postgres, database test) if it answers. Without either, the tests that
//! need it say so loudly and return; with `TASQ_PG_REQUIRED=1` (as `.ci/run` sets) they fail
//! instead, so a run that skipped them cannot pass.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use postgres::{Client, NoTls};

mod proxy;
pub use proxy::Proxy;

const LOCAL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=5";

/// The server's base connection string, if one answers.
fn base_url() -> Option<&'static str> {
    static URL: OnceLock<Option<String>> = OnceLock::new();
    URL.get_or_init(|| {
        let url = std::env::var("TASQ_PG_URL").unwrap_or_else(|_| LOCAL.to_owned());
        match Client::connect(&url, NoTls) {
            Ok(mut client) => {
                drop_stale_schemas(&mut client);
                Some(url)
            }
            Err(error) => {
                if std::env::var_os("TASQ_PG_REQUIRED").is_some() {
                    panic!(
                        "TASQ_PG_REQUIRED is set, but PostgreSQL at {url:?} is unreachable: {error}"
                    );
                }
                eprintln!(
                    "\n*** SKIPPING the PostgreSQL tests: no server at {url:?} ({error}). Set \
                     TASQ_PG_URL to a key=value connection string to run them. ***\n"
                );
                None
            }
        }
    })
    .as_deref()
}

/// Drops the schemas that test processes no longer running left behind (killed, or a failed
/// test's with `TASQ_KEEP_FAILED_SCHEMAS` set, which keeps them for a post-mortem look).
fn drop_stale_schemas(client: &mut Client) {
    let Ok(rows) = client.query(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tasq\\_test\\_%'",
        &[],
    ) else {
        return;
    };
    for row in rows {
        let schema: String = row.get(0);
        let pid = schema.split('_').nth(2).unwrap_or_default();
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }
}

/// Polls `done` every `poll_ms` milliseconds until it holds; fails naming `what` after 20 s (a
/// hang guard, far beyond anything the tests wait for).
pub fn eventually(poll_ms: u64, what: &str, mut done: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < give_up, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(poll_ms));
    }
}

/// CPU time (user + system) of this process's threads named `name` (as the kernel keeps it:
/// cut to 15 bytes), from `/proc/self/task`.
pub fn thread_cpu(name: &str) -> std::time::Duration {
    let ticks_per_second = 100.0; // USER_HZ on Linux
    let mut ticks = 0_u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // After the command's closing parenthesis: fields 3 onwards; utime and stime are 14, 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        for field in [11, 12] {
            ticks += fields
                .get(field)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    std::time::Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}

/// A schema of its own for one test, migrated; dropped with its tables when this is dropped.
pub struct TestDb {
    pub url: String,
    schema: String,
    base: &'static str,
}

impl TestDb {
    /// A fresh schema, or `None` (after a loud message) if no server answers.
    pub fn new() -> Option<TestDb> {
        TestDb::at_version(tasq::postgres::SCHEMA_VERSION)
    }

    /// A fresh schema migrated to schema version `version` only (for the tests of upgrades),
    /// or `None` as [`TestDb::new`].
    pub fn at_version(version: i32) -> Option<TestDb> {
        TestDb::make(version, 0)
    }

    /// A fresh schema whose name is the longest PostgreSQL allows (63 bytes), or `None` as
    /// [`TestDb::new`].
    pub fn with_longest_name() -> Option<TestDb> {
        TestDb::make(tasq::postgres::SCHEMA_VERSION, 63)
    }

    fn make(version: i32, length: usize) -> Option<TestDb> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = base_url()?;
        let mut schema = format!(
            "tasq_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        if schema.len() < length {
            schema.push('_');
            while schema.len() < length {
                schema.push('x');
            }
        }
        let mut client = Client::connect(base, NoTls).expect("connect to PostgreSQL");
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .expect("create the test schema");
        // Named after the schema, so a test can find (and terminate) its own connections.
        let url = format!("{base} application_name={schema} options='-c search_path={schema}'");
        if version == tasq::postgres::SCHEMA_VERSION {
            tasq::postgres::migrate(&url).expect("migrate the test schema");
        } else {
            tasq::postgres::testing::migrate_to(&url, version).expect("migrate the test schema");
        }
        Some(TestDb { url, schema, base })
    }

    /// A proxy in front of the server, and this test's connection string through it.
    pub fn through_proxy(&self) -> (Proxy, String) {
        let config: postgres::Config = self.base.parse().expect("parse the server's URL");
        let host = match config.get_hosts().first() {
            Some(postgres::config::Host::Tcp(host)) => host.clone(),
            _ => panic!("the proxy needs a TCP host"),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let proxy = Proxy::start(&host, port);
        let url = self
            .url
            .split(' ')
            .filter(|part| !part.starts_with("host=") && !part.starts_with("port="))
            .collect::<Vec<_>>()
            .join(" ");
        let url = format!("{url} host=127.0.0.1 port={}", proxy.port());
        (proxy, url)
    }

    /// The schema's name (also the `application_name` of the connections made with `url`).
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Terminates every connection this test's pools opened (as a server restart would), and
    /// returns once their server processes have gone: each connection's socket then holds the
    /// server's farewell, and the next statement sent on it is the first to learn of it.
    pub fn terminate_connections(&self) -> u64 {
        let mut client = Client::connect(self.base, NoTls).expect("connect to PostgreSQL");
        let pids: Vec<i32> = client
            .query(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&self.schema],
            )
            .expect("terminate the test's connections")
            .iter()
            .filter(|row| row.get::<_, bool>(1))
            .map(|row| row.get(0))
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let left: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)",
                    &[&pids],
                )
                .expect("look for the terminated connections")
                .get(0);
            if left == 0 {
                return pids.len() as u64;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{left} terminated connections still there after 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Changes the schema's policy (what every pool on it keeps).
    pub fn change_policy(
        &self,
        change: impl FnOnce(tasq::postgres::Policy) -> tasq::postgres::Policy,
    ) {
        let policy = tasq::postgres::policy(&self.url).expect("read the policy");
        tasq::postgres::set_policy(&self.url, &change(policy)).expect("set the policy");
    }

    /// The server's connection string, with no schema of its own (`search_path` the
    /// server's default).
    pub fn base_url(&self) -> &'static str {
        self.base
    }

    /// Whether a connection of this test's pools waits for a lock now, as `watcher` (a
    /// connection of the test's own) sees it.
    pub fn a_pool_waits_for_a_lock(&self, watcher: &mut Client) -> bool {
        watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&self.schema],
            )
            .unwrap()
            .get::<_, i64>(0)
            > 0
    }

    /// A client on this test's schema, to look at the rows.
    pub fn client(&self) -> Client {
        Client::connect(&self.url, NoTls).expect("connect to PostgreSQL")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var_os("TASQ_KEEP_FAILED_SCHEMAS").is_some() {
            eprintln!("kept schema {} for a post-mortem look", self.schema);
            return;
        }
        if let Ok(mut client) = Client::connect(self.base, NoTls) {
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}
