//! Issue 20, section 2: a pool names the schema that holds its queue, in the builder and in
//! `migrate_in`, whatever the connection string's `search_path`; the name is checked; and
//! everything derives from it, the notification channel too.

mod support_pg;

use std::time::Duration;

use tasq::postgres::{Policy, migrate_in, policy_in, set_policy_in};
use tasq::{BuildError, HandlerError, Outcome, Pool, SchemaError, TaskType, TypeOptions};

use support_pg::TestDb;

const JOB: TaskType<u32, u32> = TaskType::new("job");

/// Drops a schema when dropped, the test failing or not.
struct Dropped<'a>(&'a TestDb, String);

impl Drop for Dropped<'_> {
    fn drop(&mut self) {
        if let Ok(mut client) = postgres::Client::connect(self.0.base_url(), postgres::NoTls) {
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.1));
        }
    }
}

/// Two schemas of one database are two queues: `migrate_in` creates each, pools on the
/// server's plain connection string pick theirs with `Builder::schema`, a task runs in the
/// queue it was submitted to and no other, and a submit wakes the workers of its own queue at
/// once (its channel derives from the schema: the pools poll once a minute).
#[test]
fn pools_in_two_named_schemas_are_two_queues() {
    let Some(db) = TestDb::new() else { return };
    let names = [format!("{}_a", db.schema()), format!("{}_b", db.schema())];
    let _dropped: Vec<_> = names.iter().map(|n| Dropped(&db, n.clone())).collect();
    for name in &names {
        assert_eq!(migrate_in(db.base_url(), name).unwrap(), 0, "created");
        assert_eq!(
            migrate_in(db.base_url(), name).unwrap(),
            tasq::postgres::SCHEMA_VERSION,
            "and found the second time"
        );
    }
    let worker = |name: &str, add: u32| {
        Pool::builder()
            .postgres(db.base_url())
            .schema(name)
            .workers(1)
            .poll_interval(Duration::from_secs(60))
            .register(JOB, move |_, n: &u32| Ok::<_, HandlerError>(n + add))
            .build()
            .unwrap()
    };
    let (a, b) = (worker(&names[0], 1000), worker(&names[1], 2000));
    let producer = Pool::builder()
        .postgres(db.base_url())
        .schema(&names[1])
        .workers(0)
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap();
    // Woken by the notification on b's channel: a minute's poll would fail the wait.
    let handle = producer.submit(JOB.task(7)).unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(2007))
    );
    assert_eq!(a.stats().totals.succeeded, 0, "a ran nothing of b's");
    let mut sql = db.client();
    let count = |sql: &mut postgres::Client, schema: &str| -> i64 {
        sql.query_one(&format!("SELECT count(*) FROM {schema}.tasq_tasks"), &[])
            .unwrap()
            .get(0)
    };
    assert_eq!(
        (count(&mut sql, &names[0]), count(&mut sql, &names[1])),
        (0, 1)
    );
    assert_eq!(
        count(&mut sql, db.schema()),
        0,
        "nothing in the URL's schema"
    );
    let handle = a.submit(JOB.task(5)).unwrap();
    assert_eq!(
        handle.wait_timeout(Duration::from_secs(20)),
        Some(Outcome::Succeeded(1005))
    );
    for pool in [a, b, producer] {
        pool.shutdown(Duration::from_secs(10));
    }
}

/// A schema's policy is read and set by its name.
#[test]
fn a_named_schema_s_policy_is_its_own() {
    let Some(db) = TestDb::new() else { return };
    let name = format!("{}_p", db.schema());
    let _dropped = Dropped(&db, name.clone());
    migrate_in(db.base_url(), &name).unwrap();
    set_policy_in(
        db.base_url(),
        &name,
        &Policy::default().dead_letter_limit(Some(3)),
    )
    .unwrap();
    assert_eq!(
        policy_in(db.base_url(), &name)
            .unwrap()
            .dead_letter_limit_value(),
        Some(3)
    );
    assert_eq!(
        tasq::postgres::policy(&db.url)
            .unwrap()
            .dead_letter_limit_value(),
        Policy::default().dead_letter_limit_value(),
        "the URL's schema keeps its own"
    );
}

/// A name tasq does not take is refused before anything touches the database, by the
/// builder and by `migrate_in`; a schema never migrated fails the build, naming `migrate_in`.
#[test]
fn a_bad_or_unmigrated_schema_is_refused_with_a_clear_error() {
    let Some(db) = TestDb::new() else { return };
    for bad in [
        "",
        "Upper",
        "two words",
        "x\"; DROP TABLE tasq_tasks; --",
        "9lives",
    ] {
        let built = Pool::builder()
            .postgres(db.base_url())
            .schema(bad)
            .declare(JOB, TypeOptions::new())
            .build();
        assert!(
            matches!(
                built,
                Err(BuildError::InvalidSetting {
                    setting: "schema",
                    ..
                })
            ),
            "{bad:?}: {:?}",
            built.err()
        );
        assert!(
            matches!(
                migrate_in(db.base_url(), bad),
                Err(SchemaError::InvalidName { .. })
            ),
            "{bad:?}"
        );
    }
    let long = "x".repeat(64);
    assert!(matches!(
        migrate_in(db.base_url(), &long),
        Err(SchemaError::InvalidName { .. })
    ));
    let missing = format!("{}_never", db.schema());
    let error = Pool::builder()
        .postgres(db.base_url())
        .schema(&missing)
        .declare(JOB, TypeOptions::new())
        .build()
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("migrate_in") && text.contains(&missing),
        "{text}"
    );
    assert!(
        db.client()
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&missing])
            .unwrap()
            .is_none(),
        "a build creates no schema"
    );
}
