//! The durable store's tables, created and upgraded by versioned migrations that ship with the
//! crate and run only when a program calls [`migrate`](crate::postgres::migrate).
//!
//! The steps a database lacks run in one transaction under a transaction-scoped advisory lock,
//! so several processes may call `migrate` at once: one applies them all, the others wait for
//! it and then find nothing left to do, and no process ever sees a schema between two steps.

use postgres::GenericClient;

/// The schema version this crate's store reads and writes.
pub(crate) const VERSION: i32 = 9;

/// The advisory lock that serialises migrations (an arbitrary constant: "tasq" in ASCII).
const MIGRATION_LOCK: i64 = 0x7461_7371;

/// Migration `n` (1-based) takes the schema from version `n - 1` to `n`.
const MIGRATIONS: [&str; 9] = [V1, V2, V3, V4, V5, V6, V7, V8, V9];

/// Version 1: the task table, its indexes, the dependency edges, and the lease sequence.
///
/// * `status` is `blocked` (waiting for dependencies), `ready` (waiting for its `run_at`, or due),
///   `running`, or terminal: `succeeded`, `failed`, `cancelled`. A ready task whose `run_at` is
///   in the future is what the pool reports as scheduled.
/// * `lease_id` is the fencing token of a running task's current claim, from `tasq_lease`:
///   increasing, so a downstream system can also refuse a token older than the last it saw.
/// * `dead` marks a dead letter: a failed task kept, with its payload, until it is taken,
///   resubmitted or purged. Retention deletes other terminal rows once `finished_at` is old.
/// * `has_dependents` keeps the common completion to one statement: only a task that others
///   wait for (edges in `tasq_deps`) takes the longer path.
/// * A key is unique among live and succeeded tasks (the partial unique index): a failed or
///   cancelled task frees it.
const V1: &str = "
CREATE SEQUENCE tasq_lease;

CREATE TABLE tasq_tasks (
    id               BIGSERIAL PRIMARY KEY,
    key              TEXT,
    type             TEXT NOT NULL,
    payload          JSONB,
    priority         SMALLINT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN
                         ('blocked', 'ready', 'running', 'succeeded', 'failed', 'cancelled')),
    run_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts         INT NOT NULL DEFAULT 0,
    max_attempts     INT NOT NULL,
    lease_id         BIGINT,
    lease_until      TIMESTAMPTZ,
    last_error       TEXT,
    pending_deps     INT NOT NULL DEFAULT 0,
    cancel_requested TEXT,
    output           JSONB,
    failure_reason   TEXT,
    cancel_reason    TEXT,
    cancel_cause     BIGINT,
    dead             BOOLEAN NOT NULL DEFAULT false,
    resubmitted_as   BIGINT,
    has_dependents   BOOLEAN NOT NULL DEFAULT false,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ
);

-- The pool's clock: the database's, or a test's manual clock (a session setting holding the
-- microseconds since the epoch). STABLE and SQL, so the planner inlines it and the claim query
-- still uses its index.
CREATE FUNCTION tasq_now() RETURNS TIMESTAMPTZ LANGUAGE sql STABLE AS $$
    SELECT COALESCE(
        TIMESTAMPTZ 'epoch' + NULLIF(current_setting('tasq.manual_now_us', true), '')::BIGINT
                              * interval '1 microsecond',
        now())
$$;

CREATE INDEX tasq_dequeue ON tasq_tasks (priority DESC, run_at, id) WHERE status = 'ready';
CREATE INDEX tasq_leases ON tasq_tasks (lease_until) WHERE status = 'running';
CREATE INDEX tasq_finished ON tasq_tasks (finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled') AND NOT dead;
CREATE INDEX tasq_dead ON tasq_tasks (id) WHERE dead;
CREATE UNIQUE INDEX tasq_live_keys ON tasq_tasks (key)
    WHERE key IS NOT NULL AND status IN ('blocked', 'ready', 'running', 'succeeded');

-- A queue table churns: every claim and ending leaves a dead row version, and the claim's index
-- scan must step over the dead entries until a vacuum removes them. Vacuum it early and without
-- throttling; leave room in each page for updates that touch no index (HOT).
ALTER TABLE tasq_tasks SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

CREATE TABLE tasq_deps (
    dependency BIGINT NOT NULL,
    dependent  BIGINT NOT NULL,
    PRIMARY KEY (dependency, dependent)
);
CREATE INDEX tasq_deps_dependent ON tasq_deps (dependent);
";

/// Version 2: the gates of limits, breakers and aging (see `gates.rs`).
///
/// * `base_priority` is a task's own priority while aging has raised `priority` (which the claim
///   orders by, through `tasq_dequeue`), and NULL otherwise: a row written by version 1, or by
///   anyone who inserts rows without it, keeps its own priority in `priority`. Readers of the
///   own priority take `COALESCE(base_priority, priority)`; every return to `ready` restores it.
///   No backfill: NULL already means "the same as `priority`", so the step rewrites no row.
/// * `tasq_gates` holds one row per gated task type (`kind = 'type'`: its token bucket, and the
///   row whose lock serialises the claims of the type across processes) and one per downstream
///   (`kind = 'downstream'`: its circuit breaker, shared by every process). Rows are made by the
///   pools that use them and never deleted.
/// * `tasq_running` makes counting a type's running rows (for its concurrency limit) read only
///   those rows.
const V2: &str = "
ALTER TABLE tasq_tasks ADD COLUMN base_priority SMALLINT;

CREATE INDEX tasq_running ON tasq_tasks (type) WHERE status = 'running';

-- IF NOT EXISTS: a schema whose task tables were dropped by hand (to start over) may keep its
-- gates; their rows stay valid for a new queue.
CREATE TABLE IF NOT EXISTS tasq_gates (
    kind        TEXT NOT NULL CHECK (kind IN ('type', 'downstream')),
    name        TEXT NOT NULL,
    -- A type's token bucket: the tokens it held at refilled_at (NULL: never drawn, full).
    tokens      FLOAT8,
    refilled_at TIMESTAMPTZ,
    -- A downstream's breaker, as BreakerCell keeps it; the probe is the task running under
    -- probe_lease (its row is probe_task): once that row no longer runs under it, the probe
    -- slot is free.
    state       TEXT NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half_open')),
    consecutive INT NOT NULL DEFAULT 0,
    opened_at   TIMESTAMPTZ,
    probe_task  BIGINT,
    probe_lease BIGINT,
    PRIMARY KEY (kind, name)
);
";

/// Version 3: a task's own settings, and the fleet's shared policy.
///
/// * `max_attempts` (from version 1), `retry_base_us`, `retry_cap_us` and `timeout_us` (0: none)
///   are the task's settings, fixed by the pool that submits it and obeyed by every process that
///   claims, retries, reaps or resubmits it (see `rows::settings_of`). NULL, in a row inserted
///   by hand or before this version, takes the claiming pool's registration. No backfill.
/// * `tasq_schema` holds the queue's policy (`policy.rs`): how long finished rows stay, how
///   many, and how many dead letters; `tasq_leader` the lease of the one process that applies it
///   (`leader.rs`).
/// * `tasq_channel()` names the queue's notification channel: `tasq_` and the schema's name, or,
///   for a name too long for that to fit PostgreSQL's 63-byte identifiers, `tasq_` and the
///   name's MD5 (before this version the channel was always `tasq_<schema>`, and every notify
///   in a schema with a name of 59 bytes or more failed, and with it the submit or ack that
///   sent it).
const V3: &str = "
ALTER TABLE tasq_tasks
    ADD COLUMN retry_base_us BIGINT,
    ADD COLUMN retry_cap_us BIGINT,
    ADD COLUMN timeout_us BIGINT;

-- The queue's policy (see `policy.rs`), one value for every process: what the cleaner keeps.
ALTER TABLE tasq_schema
    ADD COLUMN finished_max_age_us BIGINT DEFAULT 86400000000,
    ADD COLUMN finished_max_count BIGINT,
    ADD COLUMN dead_letter_limit BIGINT DEFAULT 10000;

-- Leases of the roles that one process of the fleet runs at a time (see `leader.rs`).
CREATE TABLE IF NOT EXISTS tasq_leader (
    role       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);

-- OR REPLACE: a schema whose tables were dropped by hand (to start over) may keep it.
CREATE OR REPLACE FUNCTION tasq_channel() RETURNS TEXT LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN octet_length(current_schema()) <= 58 THEN 'tasq_' || current_schema()
                ELSE 'tasq_' || md5(current_schema()) END
$$;
";

/// Version 4: the indexes behind `Pool::tasks`, the operator's list of tasks by state and type,
/// a page at a time in id order (see `tasks_page` in `mod.rs`). A page reads an index from the
/// key it starts after, never the table:
///
/// * `tasq_states (status, id)`: the tasks of one state. Ready and scheduled rows share the
///   status `ready` (a scheduled one's `run_at` is ahead): their pages keep the rows the range
///   gives, in id order, whose `run_at` is or is not due; so do the pages of one type's ready
///   or scheduled tasks, which keep that type's rows.
/// * `tasq_types (type, status, id)`: the tasks of one type and state; of one type in every
///   state, one range per status, merged.
///
/// Neither holds `running` rows, and `tasq_types` no `ready` ones either. The statements that
/// run the queue look for exactly those rows (the claim and the aging update for ready rows of
/// given types, the reaper, the heartbeat and the cancels for running ones): they keep to the
/// indexes made for them (`tasq_dequeue`, whose order and priority bound the claim and the
/// aging need; `tasq_leases`, `tasq_running`, the primary key) instead of being offered one
/// that matches their predicates without their order. Running rows are few (one per worker of
/// the fleet, and its prefetch): a page of them reads them all through an index of running
/// rows and sorts them.
///
/// Every change of a row's status writes these (as it writes the primary key) unless the row
/// becomes running (or, for `tasq_types`, ready): the price of listing a million-row queue
/// without reading it. `CREATE INDEX` holds off writes to the table while it builds: on a large
/// queue, migrate at a quiet time.
const V4: &str = "
CREATE INDEX tasq_states ON tasq_tasks (status, id) WHERE status <> 'running';
CREATE INDEX tasq_types ON tasq_tasks (type, status, id) WHERE status NOT IN ('ready', 'running');
";

/// Version 5: how each task type was last declared in the fleet (see `declarations.rs`): its
/// settings as the last pool built with it gave them, that pool, and when. A pool built with
/// other settings for a type says so (`Event::DeclarationMismatch`), and records its own.
const V5: &str = "
-- IF NOT EXISTS: a schema whose task tables were dropped by hand (to start over) may keep it;
-- its records stay valid for a new queue.
CREATE TABLE IF NOT EXISTS tasq_declarations (
    type        TEXT PRIMARY KEY,
    settings    JSONB NOT NULL,
    declared_by TEXT NOT NULL,
    declared_at TIMESTAMPTZ NOT NULL
);
";

/// Version 6: queues, pauses and periodic tasks.
///
/// * `queue`: the queue a task belongs to, from its type's options when it was submitted (rows
///   from before this version are in `default`).
/// * `tasq_pauses`: the types, queues and schedules paused for the whole fleet, until resumed.
/// * `tasq_paused()`: what every claim reads the pauses through. It first takes the pause
///   fence, a transaction-scoped advisory lock, shared (claims do not wait for each other),
///   then reads the pauses with a snapshot of its own (a `VOLATILE` function's statements take
///   theirs as they run, after the lock). A pause takes the fence exclusively before it writes
///   its row: so it returns only after every claim that read the pauses without it has
///   committed, and every claim after it reads its row. The fence's key is the table's oid in
///   a range of tasq's own (`0x74617371` in the high half), so each schema has its own.
/// * `tasq_schedules`: one row per schedule definition running in the fleet, with its
///   watermark; `tasq_schedule_slots`: the slots submitted, one row per (name, slot). How a
///   tick uses them is in `schedules.rs`.
const V6: &str = "
ALTER TABLE tasq_tasks ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';

CREATE TABLE IF NOT EXISTS tasq_pauses (
    kind      TEXT NOT NULL CHECK (kind IN ('type', 'queue', 'schedule')),
    name      TEXT NOT NULL,
    paused_at TIMESTAMPTZ NOT NULL,
    paused_by TEXT NOT NULL,
    PRIMARY KEY (kind, name)
);

CREATE OR REPLACE FUNCTION tasq_pause_fence() RETURNS BIGINT LANGUAGE sql STABLE AS $$
    SELECT (x'7461737100000000'::BIGINT) + 'tasq_pauses'::regclass::oid::BIGINT
$$;

-- A schema whose tables were dropped by hand keeps its functions: version 8's has other columns.
DROP FUNCTION IF EXISTS tasq_paused();

CREATE OR REPLACE FUNCTION tasq_paused(OUT types TEXT[], OUT queues TEXT[], OUT schedules TEXT[])
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(tasq_pause_fence());
    SELECT COALESCE(array_agg(name) FILTER (WHERE kind = 'type'), '{}'),
           COALESCE(array_agg(name) FILTER (WHERE kind = 'queue'), '{}'),
           COALESCE(array_agg(name) FILTER (WHERE kind = 'schedule'), '{}')
    INTO types, queues, schedules FROM tasq_pauses;
END
$$;

CREATE TABLE IF NOT EXISTS tasq_schedules (
    name       TEXT NOT NULL,
    definition TEXT NOT NULL,
    spec       TEXT NOT NULL,
    watermark  TIMESTAMPTZ NOT NULL,
    seen_at    TIMESTAMPTZ NOT NULL,
    seen_by    TEXT NOT NULL,
    PRIMARY KEY (name, definition)
);

CREATE TABLE IF NOT EXISTS tasq_schedule_slots (
    name    TEXT NOT NULL,
    slot    TIMESTAMPTZ NOT NULL,
    task    BIGINT,
    error   TEXT,
    made_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (name, slot)
);
";

/// Version 7: the claim of a lane of workers (`Builder::queue`) takes only its queues' ready
/// rows, in the claim's order, through `tasq_queue_dequeue`: without it, a lane whose queue
/// is quiet would read past every ready row of the busy queues at each claim (the very case
/// lanes are for). The index holds ready rows only, like `tasq_dequeue`; a row is written to
/// it as it becomes ready, never as it starts running.
const V7: &str = "
CREATE INDEX tasq_queue_dequeue ON tasq_tasks (queue, priority DESC, run_at, id)
WHERE status = 'ready';
";

/// Version 8: queue limits for the whole fleet (`Pool::set_queue_limit`, `queue_limits.rs`).
///
/// * `tasq_queues`: one row per limited queue, with its limit: a setting of the schema, never
///   of a process, so every pool obeys the same one. A pool claims a limited queue's rows only
///   under its row's lock, after counting its running rows (`tasq_running_queues`).
/// * `tasq_paused()` also returns the limited queues, read after the pause fence: the claims
///   that do not take a queue's lock pass its rows over, and setting a limit takes the fence
///   as a pause does, so once it returns no claim that could not see it is in flight.
const V8: &str = "
CREATE TABLE IF NOT EXISTS tasq_queues (
    name        TEXT PRIMARY KEY,
    max_running INT NOT NULL CHECK (max_running > 0),
    set_at      TIMESTAMPTZ NOT NULL,
    set_by      TEXT NOT NULL
);

CREATE INDEX tasq_running_queues ON tasq_tasks (queue) WHERE status = 'running';

DROP FUNCTION tasq_paused();

CREATE FUNCTION tasq_paused(OUT types TEXT[], OUT queues TEXT[], OUT schedules TEXT[],
                            OUT limited TEXT[])
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(tasq_pause_fence());
    SELECT COALESCE(array_agg(name) FILTER (WHERE kind = 'type'), '{}'),
           COALESCE(array_agg(name) FILTER (WHERE kind = 'queue'), '{}'),
           COALESCE(array_agg(name) FILTER (WHERE kind = 'schedule'), '{}')
    INTO types, queues, schedules FROM tasq_pauses;
    SELECT COALESCE(array_agg(name), '{}') INTO limited FROM tasq_queues;
END
$$;
";

/// Version 9: the keys of failed and cancelled rows, which `tasq_live_keys` leaves out, so that
/// the console finds every row of a key through an index (`Admin::tasks` with a key).
const V9: &str = "
CREATE INDEX tasq_ended_keys ON tasq_tasks (key, id)
WHERE key IS NOT NULL AND status IN ('failed', 'cancelled');
";

/// Whether tasq takes `name` as the name of a schema to keep a queue in: a PostgreSQL
/// identifier that needs no quoting (it reads the same in SQL, in `search_path` and in
/// `pg_namespace`): 1 to 63 bytes of lower-case ASCII letters, digits and `_`, not starting with
/// a digit. Otherwise, what is wrong with it.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > 63 {
        return Err("is longer than PostgreSQL's 63 bytes");
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("starts with a digit");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err("has a character other than a-z, 0-9 and _");
    }
    if name.starts_with("pg_") {
        return Err("starts with pg_, which PostgreSQL keeps for its own schemas");
    }
    Ok(())
}

/// Brings the schema to [`VERSION`]; returns the version it found. With `create`, first
/// creates the schema of that name if it does not exist (under the migrations' lock, so that
/// processes migrating at once do not race to create it).
pub(crate) fn migrate(
    client: &mut impl GenericClient,
    create: Option<&str>,
) -> Result<i32, postgres::Error> {
    migrate_to(client, VERSION, create)
}

/// Brings the schema to version `target` (at most [`VERSION`]; an older one only for the tests
/// of upgrades); returns the version it found. `create` as [`migrate`].
pub(crate) fn migrate_to(
    client: &mut impl GenericClient,
    target: i32,
    create: Option<&str>,
) -> Result<i32, postgres::Error> {
    let target = target.clamp(1, VERSION);
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    if let Some(name) = create {
        // Checked by `check_name`: nothing to quote.
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {name}; SET LOCAL search_path TO {name}"
        ))?;
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS tasq_schema (
             version  INT NOT NULL,
             queue_id BIGINT NOT NULL
         )",
    )?;
    let found = current(&mut tx)?;
    for (step, sql) in (1..=target).zip(MIGRATIONS) {
        if found.unwrap_or(0) < step {
            tx.batch_execute(sql)?;
        }
    }
    match found {
        // The queue's id: the first half of every task id, the same in every process.
        None => tx.execute(
            "INSERT INTO tasq_schema (version, queue_id)
             VALUES ($1, 1 + (random() * 4.6e18)::BIGINT)",
            &[&target],
        )?,
        Some(version) if version < target => {
            tx.execute("UPDATE tasq_schema SET version = $1", &[&target])?
        }
        Some(_) => 0,
    };
    tx.commit()?;
    Ok(found.unwrap_or(0))
}

/// The schema version and queue id, if the schema exists.
pub(crate) fn read(client: &mut impl GenericClient) -> Result<Option<(i32, i64)>, postgres::Error> {
    let exists: bool = client
        .query_one("SELECT to_regclass('tasq_schema') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let row = client.query_opt("SELECT version, queue_id FROM tasq_schema", &[])?;
    Ok(row.map(|row| (row.get(0), row.get(1))))
}

fn current(client: &mut impl GenericClient) -> Result<Option<i32>, postgres::Error> {
    let row = client.query_opt("SELECT version FROM tasq_schema", &[])?;
    Ok(row.map(|row| row.get(0)))
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn schema_names_are_checked() {
        assert_eq!(check_name("billing_2"), Ok(()));
        assert_eq!(check_name(&"x".repeat(63)), Ok(()));
        assert_eq!(check_name(""), Err("is empty"));
        assert_eq!(
            check_name(&"x".repeat(64)),
            Err("is longer than PostgreSQL's 63 bytes")
        );
        assert_eq!(check_name("2fast"), Err("starts with a digit"));
        for bad in ["Billing", "a-b", "a b", "a\"b", "é", "a;drop"] {
            assert_eq!(
                check_name(bad),
                Err("has a character other than a-z, 0-9 and _"),
                "{bad}"
            );
        }
        assert!(check_name("pg_temp").is_err());
    }
}
