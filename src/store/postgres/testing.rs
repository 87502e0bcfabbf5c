//! For the crate's own tests and benchmarks: the store's statements, run as the store runs
//! them.

/// The store's claim statement (see `dispatch::CLAIM`).
pub const CLAIM: &str = super::dispatch::CLAIM;

/// The store's ack of successes: `$1` row ids, `$2` their leases, `$3` their outputs
/// (see `acks::ACK`).
pub const ACK: &str = super::acks::ACK;

/// The statement of a page of `Pool::tasks` in `state` (if given), of one type (if
/// `by_type`): `$1` the id it starts after, `$2` the limit, `$3` the type's name.
pub fn tasks_page(state: Option<crate::TaskState>, by_type: bool) -> String {
    super::publish::tasks_page(state, by_type)
}

/// The gated claim's pick (see `gates::PICK`): `$1` types, `$2` limit, `$3` lease in
/// microseconds, `$4` the gated types among `$1`.
pub const GATED_PICK: &str = super::gates::PICK;

/// The aging update (see `gates::AGE`): `$1` types, `$2` ceiling, `$3` microseconds a level.
pub const AGE: &str = super::gates::AGE;

/// A statement the store runs again and again whatever the queue holds (claims, the
/// reaper, the cleaner, the aging update, the figures behind stats and alerts, the waits'
/// polls), with parameters as a pool would give them: for a test that reads their plans
/// on a large table. Some write: run them in a transaction that rolls back.
pub struct Periodic {
    /// What it is.
    pub name: &'static str,
    /// Its text.
    pub sql: &'static str,
    /// Its parameters.
    pub params: Vec<Box<dyn postgres::types::ToSql + Sync>>,
}

impl std::fmt::Debug for Periodic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Periodic")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

/// Every statement the console ([`Admin`](crate::postgres::Admin)) reads with, with
/// parameters as it gives them (`ty`: a type's name), for the test that reads their plans.
pub fn console(ty: &str) -> Vec<Periodic> {
    super::admin::statements(ty)
        .into_iter()
        .map(|(name, sql, params)| Periodic {
            name,
            // Leaked: a handful of strings, once per test.
            sql: String::leak(sql),
            params,
        })
        .collect()
}

/// What the store sets on each of its connections (a test reading the plans of
/// [`periodic`] statements on its own connection sets it too).
pub const SESSION: &str = super::conn::SESSION;

/// Every [`Periodic`] statement, for a queue whose types are `types` (the first aged, the
/// second gated).
pub fn periodic(types: &[&str]) -> Vec<Periodic> {
    let types: Vec<String> = types.iter().map(|&t| t.to_owned()).collect();
    let gated: Vec<String> = types.iter().skip(1).take(1).cloned().collect();
    let day_us: i64 = 24 * 60 * 60 * 1_000_000;
    let lease_us: i64 = 30_000_000;
    let p = |name, sql, params: Vec<Box<dyn postgres::types::ToSql + Sync>>| Periodic {
        name,
        sql,
        params,
    };
    vec![
        p(
            "claim",
            CLAIM,
            vec![
                Box::new(types.clone()),
                Box::new(10_i64),
                Box::new(lease_us),
            ],
        ),
        p(
            "gated pick",
            GATED_PICK,
            vec![
                Box::new(types.clone()),
                Box::new(10_i64),
                Box::new(lease_us),
                Box::new(gated.clone()),
            ],
        ),
        // A lane of a queue with no row ready, beside a busy one.
        p(
            "lane claim",
            super::dispatch::CLAIM_LANE,
            vec![
                Box::new(types.clone()),
                Box::new(10_i64),
                Box::new(lease_us),
                Box::new(vec!["quiet".to_owned()]),
            ],
        ),
        p(
            "lane gated pick",
            super::gates::PICK_LANE,
            vec![
                Box::new(types.clone()),
                Box::new(10_i64),
                Box::new(lease_us),
                Box::new(gated.clone()),
                Box::new(vec!["quiet".to_owned()]),
            ],
        ),
        p(
            "limited claim",
            super::dispatch::CLAIM_LIMITED,
            vec![
                Box::new(types.clone()),
                Box::new(10_i64),
                Box::new(lease_us),
                Box::new(vec!["quiet".to_owned()]),
            ],
        ),
        p(
            "limited queue's running rows",
            super::queue_limits::RUNNING,
            vec![Box::new("default".to_owned())],
        ),
        p(
            "aging update",
            AGE,
            vec![
                Box::new(types[..1].to_vec()),
                Box::new(5_i32),
                Box::new(60_000_000_i64),
            ],
        ),
        p("reaper", super::background::REAP, vec![]),
        p(
            "retention by age",
            super::background::RETAIN,
            vec![Box::new(None::<i64>), Box::new(Some(day_us))],
        ),
        p(
            "retention by count",
            super::background::RETAIN,
            vec![Box::new(Some(super::stats::CAP)), Box::new(None::<i64>)],
        ),
        p("dead-letter trim", super::ending::TRIM_DEAD_LETTERS, vec![]),
        p(
            "stats",
            super::stats::STATS,
            vec![Box::new(super::stats::CAP)],
        ),
        p(
            "type stats",
            super::stats::TYPE_STATS,
            vec![Box::new(super::stats::CAP), Box::new(types.clone())],
        ),
        p("wait_empty poll", super::seam::EMPTY, vec![]),
        p(
            "wait_idle poll",
            super::seam::IDLE,
            vec![Box::new(Vec::<String>::new())],
        ),
    ]
}

/// Brings the database's tasq tables to schema version `version` (at most
/// [`SCHEMA_VERSION`](super::migrate::SCHEMA_VERSION)), as [`migrate`](super::migrate::migrate) does: for the
/// tests of upgrades from an older version.
pub fn migrate_to(url: &str, version: i32) -> Result<i32, postgres::Error> {
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    super::schema::migrate_to(&mut client, version, None)
}

/// Runs the store's claim: up to `limit` ready, due tasks of `types`, each leased for
/// `lease_us` microseconds. Returns (row id, lease id) of each.
pub fn claim(
    client: &mut postgres::Client,
    types: &[String],
    limit: i64,
    lease_us: i64,
) -> Result<Vec<(i64, i64)>, postgres::Error> {
    let rows = client.query(CLAIM, &[&types, &limit, &lease_us])?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(4))).collect())
}
