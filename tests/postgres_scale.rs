//! Issue 20, edge 7: the statements the durable store runs again and again (claims, the
//! reaper, the cleaner, the aging update, the figures behind stats and alerts, the waits'
//! polls) keep to index ranges on a table of 1,000,000 rows, 99% of them finished or due far
//! ahead. Each plan is read with `EXPLAIN (ANALYZE, BUFFERS)`: no sequential scan of the task
//! table, and no statement reads more than a bounded number of its rows. (The times are printed
//! for the note, not asserted: a loaded machine would make them lie.)

mod support_pg;

use postgres::types::ToSql;
use serde_json::Value;

use support_pg::TestDb;

/// Rows of the task table any one periodic statement may read, in all (the figures read up to
/// 10,000 in each of their ranges, of which this table has five full ones), and any one scan
/// (10,000 and the dead letters' limit's few more) may read; the table holds 1,000,000.
const READ_AT_MOST: f64 = 60_000.0;
const SCAN_READS_AT_MOST: f64 = 12_000.0;
/// The console's overview counts eight states, up to 10,000 rows each, and the last 15
/// minutes' outcomes: this table fills five states and one minute past the cap.
const CONSOLE_READS_AT_MOST: f64 = 120_000.0;

/// Fills the schema as a queue in its steady state: 970,000 succeeded (a fortieth of them past
/// the default day's retention, for the cleaner), 10,010 dead letters (10 past the limit of
/// 10,000), 15,000 tasks due a month ahead over four priorities, and the live ones: 3,000 due
/// (none yet a second old, the aging level), 1,000 running (100 of whose leases expired),
/// 1,000 blocked.
fn fill(sql: &mut postgres::Client) {
    sql.batch_execute(
        "INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, attempts,
                                 run_at, finished_at, created_at)
         SELECT 'job', '1', 0, 'succeeded', 3, 1, now() - interval '2 days',
                now() - (g % 40) * interval '1 hour', now() - interval '2 days'
         FROM generate_series(1, 970000) g;
         INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, attempts, dead,
                                 failure_reason, last_error, run_at, finished_at)
         SELECT 'job', '1', 0, 'failed', 3, 3, true, 'exhausted', 'no', now(), now()
         FROM generate_series(1, 10010) g;
         INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, run_at)
         SELECT 'job', '1', g % 4, 'ready', 3, now() + interval '30 days' + g * interval '1 s'
         FROM generate_series(1, 15000) g;
         INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, run_at)
         SELECT CASE WHEN g % 2 = 0 THEN 'job' ELSE 'gated' END, '1', g % 3, 'ready', 3,
                now() - g * interval '100 us'
         FROM generate_series(1, 3000) g;
         INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, attempts,
                                 lease_id, lease_until)
         SELECT 'job', '1', 0, 'running', 3, 1, g,
                now() + CASE WHEN g <= 100 THEN interval '-1 minute' ELSE interval '1 hour' END
         FROM generate_series(1, 1000) g;
         INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, pending_deps)
         SELECT 'job', '1', 0, 'blocked', 3, 1 FROM generate_series(1, 1000) g;
         UPDATE tasq_schema SET dead_letter_limit = 10000;",
    )
    .expect("fill the table");
    sql.batch_execute("VACUUM ANALYZE tasq_tasks")
        .expect("vacuum the table");
}

/// Every scan of a table or index in a plan: (node type, index or table, rows read in one
/// loop, rows read in all loops). Rows a filter removed count as read.
fn scans(plan: &Value, out: &mut Vec<(String, String, f64, f64)>) {
    let node = plan["Node Type"].as_str().unwrap_or_default();
    if let Some(relation) = plan["Relation Name"].as_str() {
        let per_loop = plan["Actual Rows"].as_f64().unwrap_or(0.0)
            + plan["Rows Removed by Filter"].as_f64().unwrap_or(0.0);
        let loops = plan["Actual Loops"].as_f64().unwrap_or(1.0);
        let name = plan["Index Name"].as_str().unwrap_or(relation);
        out.push((node.to_owned(), name.to_owned(), per_loop, per_loop * loops));
    }
    if let Some(children) = plan["Plans"].as_array() {
        for child in children {
            scans(child, out);
        }
    }
}

#[test]
fn periodic_queries_read_indexes_at_a_million_rows() {
    let Some(db) = TestDb::new() else { return };
    let mut sql = db.client();
    fill(&mut sql);
    if std::env::var_os("TASQ_KEEP_SCALE").is_some() {
        println!("schema {}", db.schema());
        std::mem::forget(db);
        return;
    }
    sql.batch_execute(tasq::postgres::testing::SESSION).unwrap();
    let mut report = Vec::new();
    // The store's own statements, then the console's (issue 23: every page of the dashboard
    // and the command reads a bounded number of rows, never the table).
    let console = tasq::postgres::testing::console("job");
    let console_names: Vec<&str> = console.iter().map(|s| s.name).collect();
    for statement in tasq::postgres::testing::periodic(&["job", "gated"])
        .into_iter()
        .chain(console)
    {
        let params: Vec<&(dyn ToSql + Sync)> =
            statement.params.iter().map(|p| p.as_ref()).collect();
        // Each run in a transaction that rolls back: the writers find the same rows each time.
        let mut run = |sql_text: &str| -> Value {
            let mut tx = sql.transaction().unwrap();
            let row = tx.query_one(sql_text, &params).unwrap();
            tx.rollback().unwrap();
            row.get(0)
        };
        // Timed without the per-node clocks (which slow a plan that reads many rows), after a
        // first run that warms the cache, as in a running pool.
        let timed = format!(
            "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {}",
            statement.sql
        );
        let _ = run(&timed);
        let ms = run(&timed)[0]["Execution Time"].as_f64().unwrap();
        let plan = run(&format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
            statement.sql
        ));
        let mut found = Vec::new();
        scans(&plan[0]["Plan"], &mut found);
        let read: f64 = found.iter().map(|(_, _, _, rows)| rows).sum();
        println!(
            "{:>20}: {ms:8.2} ms, {read:8.0} index or table rows read",
            statement.name
        );
        for (node, relation, per_loop, rows) in &found {
            println!(
                "{:>24}{node} on {relation}: {per_loop} a loop, {rows} in all",
                ""
            );
        }
        report.push((statement.name, ms, read, found, plan));
    }
    for (name, _, read, found, plan) in &report {
        let seq: Vec<_> = found
            .iter()
            .filter(|(node, relation, _, _)| node == "Seq Scan" && relation == "tasq_tasks")
            .collect();
        assert!(
            seq.is_empty(),
            "{name} reads the whole task table: {}",
            serde_json::to_string_pretty(plan).unwrap()
        );
        assert!(
            found
                .iter()
                .all(|(_, _, per_loop, _)| *per_loop <= SCAN_READS_AT_MOST)
                && *read
                    <= if console_names.contains(name) {
                        CONSOLE_READS_AT_MOST
                    } else {
                        READ_AT_MOST
                    },
            "{name} reads {read} rows: {}",
            serde_json::to_string_pretty(plan).unwrap()
        );
    }
}

/// Past 10,000 of a kind, the figures are PostgreSQL's estimates, and say so; below, they are
/// exact.
#[test]
fn counts_past_the_cap_are_estimates_and_say_so() {
    let Some(db) = TestDb::new() else { return };
    const JOB: tasq::TaskType<u32, u32> = tasq::TaskType::new("job");
    let pool = tasq::Pool::builder()
        .postgres(db.url.clone())
        .workers(0)
        .declare(JOB, tasq::TypeOptions::new())
        .build()
        .unwrap();
    for n in 0..5 {
        pool.submit(JOB.task(n)).unwrap();
    }
    let stats = pool.try_stats().unwrap();
    assert_eq!(
        (stats.ready, stats.retained, stats.estimated),
        (5, 0, false)
    );
    let mut sql = db.client();
    sql.batch_execute(
        "INSERT INTO tasq_tasks (type, payload, priority, status, max_attempts, finished_at)
         SELECT 'job', '1', 0, 'succeeded', 3, now() FROM generate_series(1, 12000);",
    )
    .unwrap();
    sql.batch_execute("ANALYZE tasq_tasks").unwrap();
    let stats = pool.try_stats().unwrap();
    assert!(stats.estimated, "{stats:?}");
    assert!(
        (10_000..=15_000).contains(&stats.retained),
        "an estimate near 12,000: {}",
        stats.retained
    );
    assert_eq!(stats.ready, 5, "the kinds below the cap stay exact");
    pool.shutdown(std::time::Duration::from_secs(5));
}
