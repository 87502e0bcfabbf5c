//! Submits: a task's row inserted (with its key, dependencies and settings) in one transaction
//! of the store's or the caller's, and the notify that wakes idle pools.

use std::collections::HashMap;
use std::time::Duration;

use postgres::Row;
use serde_json::Value;

use super::conn::Sql;
use super::store::{PgStore, leak_name};
use crate::model::completion::Completion;
use crate::model::error::SubmitErrorKind;
use crate::model::id::TaskId;
use crate::model::state::CancelReason;
use crate::model::task::Start;
use crate::observe::event::Event;
use crate::store::{Submission, Submitted};
use crate::sync::Arc;

/// A new row's `run_at`, from its delay in microseconds (the SQL expression `$delay`), or its
/// wall-clock due time in microseconds since the epoch (`$at`, NULL for none: see
/// [`PgStore::wall_clock_due`]), on the database's clock: the one text every insert uses.
macro_rules! run_at {
    ($delay:literal, $at:literal) => {
        concat!(
            "CASE WHEN ",
            $at,
            "::BIGINT IS NULL
                  THEN tasq_now() + interval '1 microsecond' * ",
            $delay,
            "::BIGINT
                  ELSE GREATEST(TIMESTAMPTZ 'epoch' + interval '1 microsecond' * ",
            $at,
            "::BIGINT,
                                tasq_now()) END"
        )
    };
}

/// What a submit inserts, computed outside the transaction.
pub(super) struct Insert<'a> {
    pub(super) type_name: &'static str,
    pub(super) payload: &'a Value,
    pub(super) priority: i16,
    pub(super) delay_us: i64,
    /// A wall-clock due time, in microseconds since the epoch, in place of the delay: the
    /// row's `run_at` is that time itself, or the database's now if that passed already (see
    /// [`PgStore::wall_clock_due`]).
    pub(super) at_us: Option<i64>,
    /// The task's settings as their columns (see `super::rows::settings_columns`).
    pub(super) settings: super::rows::SettingsColumns,
    pub(super) key: Option<&'a str>,
    /// The key deduplicates within windows of this many microseconds (see `Task::unique_per`).
    pub(super) key_period_us: Option<i64>,
    /// The queue the task belongs to, for good (pauses match it).
    pub(super) queue: &'a str,
}

/// Inserts one task in `tx`: checks its key and dependencies, inserts the row and its edges.
/// Returns the row id and whether it is a duplicate, or why it was refused.
pub(super) fn insert_task(
    tx: &mut impl Sql,
    queue: u64,
    task: &Insert<'_>,
    dependencies: &[crate::model::task::Dependency],
) -> Result<Result<(i64, bool, &'static str), SubmitErrorKind>, postgres::Error> {
    // A key with a uniqueness period is kept as its window's name, on the database's clock.
    let windowed: Option<String> = match (task.key, task.key_period_us) {
        (Some(key), Some(period)) => Some(
            tx.query_one(
                "SELECT $1 || '@' || ((EXTRACT(EPOCH FROM tasq_now()) * 1000000)::BIGINT / $2)",
                &[&key, &period],
            )?
            .get(0),
        ),
        _ => None,
    };
    let key: Option<&str> = windowed.as_deref().or(task.key);
    if let Some(key) = key {
        let existing = tx.query_opt(
            "SELECT id, type FROM tasq_tasks WHERE key = $1
             AND status IN ('blocked', 'ready', 'running', 'succeeded') FOR SHARE",
            &[&key],
        )?;
        if let Some(row) = existing {
            return Ok(key_holder(queue, key, task.type_name, &row));
        }
    }
    let mut pending = Vec::new();
    let mut doomed: Option<(CancelReason, i64)> = None;
    let mut states: HashMap<i64, String> = HashMap::new();
    if !dependencies.is_empty() {
        let mut seqs = Vec::with_capacity(dependencies.len());
        for dependency in dependencies {
            match super::rows::local_seq(queue, dependency.id()) {
                Some(seq) => seqs.push(seq),
                None => return Ok(Err(SubmitErrorKind::UnknownDependency(dependency.id()))),
            }
        }
        // Locks the dependencies' rows: a dependency cannot end between this check and the
        // edge's insert (its ending waits for this transaction, then sees the edge). In id
        // order, as an ending locks its row and then its dependents' (whose ids are larger):
        // two such transactions never wait for each other in a cycle.
        let found = tx.query(
            "WITH locked AS (
                 SELECT id FROM tasq_tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE
             )
             UPDATE tasq_tasks t SET has_dependents = true FROM locked WHERE t.id = locked.id
             RETURNING t.id, t.status",
            &[&seqs],
        )?;
        states = found.iter().map(|row| (row.get(0), row.get(1))).collect();
        for (dependency, seq) in dependencies.iter().zip(&seqs) {
            match states.get(seq).map(String::as_str) {
                Some("succeeded") => {}
                Some("failed") => {
                    doomed.get_or_insert((CancelReason::DependencyFailed(dependency.id()), *seq));
                }
                Some("cancelled") => {
                    doomed
                        .get_or_insert((CancelReason::DependencyCancelled(dependency.id()), *seq));
                }
                Some(_) => pending.push(*seq),
                None if dependency.succeeded() => {}
                None => return Ok(Err(SubmitErrorKind::UnknownDependency(dependency.id()))),
            }
        }
        pending.sort_unstable();
        pending.dedup();
    }
    let (status, reason, cause) = match doomed {
        Some((reason, _)) => {
            let (kind, cause) = super::rows::cancel_reason_columns(reason);
            ("cancelled", Some(kind), cause)
        }
        None if !pending.is_empty() => ("blocked", None, None),
        None => ("ready", None, None),
    };
    let pending_count = i32::try_from(pending.len()).unwrap_or(i32::MAX);
    // Rounds: the key's holder may end or be deleted between the insert's conflict and the
    // lookup (it committed, then another transaction cancelled or pruned it). The key is free
    // again then, and the insert is tried again; a holder found is locked, so it stays until
    // this transaction commits.
    let mut rounds = 0;
    let row = loop {
        let inserted = tx.query_opt(
            concat!(
                "INSERT INTO tasq_tasks (key, type, payload, priority, status, run_at,
                                         max_attempts, pending_deps, cancel_reason, cancel_cause,
                                         finished_at, retry_base_us, retry_cap_us, timeout_us,
                                         queue)
                 VALUES ($1, $2, $3, $4, $5, ",
                run_at!("$6", "$14"),
                ", $7, $8, $9, $10,
                         CASE WHEN $5 = 'cancelled' THEN tasq_now() END, $11, $12, $13, $15)
                 ON CONFLICT (key) WHERE key IS NOT NULL
                     AND status IN ('blocked', 'ready', 'running', 'succeeded') DO NOTHING
                 RETURNING id"
            ),
            &[
                &key,
                &task.type_name,
                task.payload,
                &task.priority,
                &status,
                &task.delay_us,
                &task.settings.0,
                &pending_count,
                &reason,
                &cause,
                &task.settings.1,
                &task.settings.2,
                &task.settings.3,
                &task.at_us,
                &task.queue,
            ],
        )?;
        if let Some(row) = inserted {
            break row;
        }
        // Another transaction took the key since the check: that task is the one.
        let holder = tx.query_opt(
            "SELECT id, type FROM tasq_tasks WHERE key = $1
             AND status IN ('blocked', 'ready', 'running', 'succeeded') FOR SHARE",
            &[&key],
        )?;
        if let Some(row) = holder {
            let key = key.unwrap_or_default();
            return Ok(key_holder(queue, key, task.type_name, &row));
        }
        rounds += 1;
        if rounds == 100 {
            let error = "the idempotency key changed hands 100 times during one submit";
            return Ok(Err(SubmitErrorKind::Store(error.to_owned())));
        }
    };
    let id: i64 = row.get(0);
    // An edge from every dependency the table still has, ended or not: a dependency that failed
    // before this task came leads to it, to resubmit it with the dependency's dependents.
    let mut edges: Vec<i64> = states.keys().copied().collect();
    edges.sort_unstable();
    if !edges.is_empty() {
        tx.execute(
            "INSERT INTO tasq_deps (dependency, dependent) SELECT unnest($1::BIGINT[]), $2",
            &[&edges, &id],
        )?;
    }
    Ok(Ok((id, false, status)))
}

/// A task without a key or dependencies (as [`insert_batch`] inserts them), in one statement
/// that commits as it runs, with the notification that wakes idle pools if `$11` (it is due
/// now): one round trip, where a transaction takes four (`BEGIN`, the insert, the notify,
/// `COMMIT`). The notify rides on the insert and cannot fail it (see [`notify`]).
pub(super) const INSERT_PLAIN: &str = concat!(
    "
    WITH inserted AS (
        INSERT INTO tasq_tasks (type, payload, priority, status, run_at, max_attempts,
                                retry_base_us, retry_cap_us, timeout_us, queue)
        VALUES ($1, $2, $3, 'ready', ",
    run_at!("$4", "$9"),
    ", $5, $6, $7, $8, $10)
        RETURNING id
    )
    SELECT id, CASE WHEN $11::BOOL THEN pg_notify(tasq_channel(), 'ready')::TEXT END
    FROM inserted"
);

/// Inserts a task without a key or dependencies ([`INSERT_PLAIN`]): its row id.
///
/// The statement commits as it runs, so if its connection is lost without a word from the
/// server (a network cut, a proxy's), it may have committed, and cannot be run again: it is
/// sent only once a `SELECT 1` on the same connection answered. A connection that died while
/// idle fails that read instead, which commits nothing, and the submit runs again on another
/// (see `PgStore::with_conn`). The read costs a round trip (24 µs here), a tenth of the
/// commit's WAL flush.
pub(super) fn insert_plain(
    client: &mut super::conn::Conn,
    task: &Insert<'_>,
    due: bool,
) -> Result<i64, postgres::Error> {
    client.query_read("SELECT 1", &[])?;
    let row = client.query_one(
        INSERT_PLAIN,
        &[
            &task.type_name,
            task.payload,
            &task.priority,
            &task.delay_us,
            &task.settings.0,
            &task.settings.1,
            &task.settings.2,
            &task.settings.3,
            &task.at_us,
            &task.queue,
            &due,
        ],
    )?;
    Ok(row.get(0))
}

/// Whether an inserted row (id, duplicate, status) is a new task due now: the pools should
/// claim it.
pub(super) fn due_now((_, duplicate, status): (i64, bool, &str), delay: Duration) -> bool {
    !duplicate && status == "ready" && delay.is_zero()
}

/// The task that holds `key` (its row: id, type), for a submit of `type_name` with that key:
/// a duplicate of it, or a conflict if it is of another type.
fn key_holder(
    queue: u64,
    key: &str,
    type_name: &str,
    row: &Row,
) -> Result<(i64, bool, &'static str), SubmitErrorKind> {
    let id: i64 = row.get(0);
    let existing_type: String = row.get(1);
    if existing_type != type_name {
        return Err(SubmitErrorKind::KeyConflict {
            key: key.to_owned(),
            existing: TaskId::from_parts(queue, id as u64),
            existing_type: leak_name(existing_type),
        });
    }
    Ok((id, true, ""))
}

/// Inserts a batch in `tx`: the tasks without a key or dependencies in one statement, the
/// others one by one, in order. The first refusal refuses the batch (the caller rolls back).
#[allow(clippy::type_complexity)]
pub(super) fn insert_batch(
    tx: &mut impl Sql,
    queue: u64,
    inserts: &[Insert<'_>],
    batch: &[Submission<'_>],
) -> Result<Result<Vec<(i64, bool, &'static str)>, (usize, SubmitErrorKind)>, postgres::Error> {
    // Tasks without a key or dependencies go in one statement; the others one by one.
    let is_plain = |i: usize| inserts[i].key.is_none() && batch[i].dependencies.is_empty();
    let plain: Vec<usize> = (0..inserts.len()).filter(|&i| is_plain(i)).collect();
    let mut inserted = vec![(0, false, "ready"); inserts.len()];
    if !plain.is_empty() {
        let types: Vec<&str> = plain.iter().map(|&i| inserts[i].type_name).collect();
        let payloads: Vec<&Value> = plain.iter().map(|&i| inserts[i].payload).collect();
        let priorities: Vec<i16> = plain.iter().map(|&i| inserts[i].priority).collect();
        let delays: Vec<i64> = plain.iter().map(|&i| inserts[i].delay_us).collect();
        let attempts: Vec<i32> = plain.iter().map(|&i| inserts[i].settings.0).collect();
        let bases: Vec<Option<i64>> = plain.iter().map(|&i| inserts[i].settings.1).collect();
        let caps: Vec<Option<i64>> = plain.iter().map(|&i| inserts[i].settings.2).collect();
        let timeouts: Vec<Option<i64>> = plain.iter().map(|&i| inserts[i].settings.3).collect();
        let ats: Vec<Option<i64>> = plain.iter().map(|&i| inserts[i].at_us).collect();
        let queues: Vec<&str> = plain.iter().map(|&i| inserts[i].queue).collect();
        // ids come from the sequence in the select's order, so sorted ids follow the batch.
        let rows = tx.query(
            concat!(
                "INSERT INTO tasq_tasks (type, payload, priority, status, run_at, max_attempts,
                                         retry_base_us, retry_cap_us, timeout_us, queue)
                 SELECT t.type, t.payload, t.priority, 'ready', ",
                run_at!("t.delay", "t.at"),
                ", t.max_attempts, t.base, t.cap, t.timeout, t.queue
                 FROM unnest($1::TEXT[], $2::JSONB[], $3::SMALLINT[], $4::BIGINT[], $5::INT[],
                             $6::BIGINT[], $7::BIGINT[], $8::BIGINT[], $9::BIGINT[], $10::TEXT[])
                      WITH ORDINALITY AS t(type, payload, priority, delay, max_attempts, base,
                                           cap, timeout, at, queue, n)
                 ORDER BY t.n
                 RETURNING id"
            ),
            &[
                &types,
                &payloads,
                &priorities,
                &delays,
                &attempts,
                &bases,
                &caps,
                &timeouts,
                &ats,
                &queues,
            ],
        )?;
        let mut ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        ids.sort_unstable();
        for (&index, id) in plain.iter().zip(ids) {
            inserted[index] = (id, false, "ready");
        }
    }
    // Each task locks its own dependencies in id order (`insert_task`); across the batch the
    // order would be the tasks', which an ending or an ack taking the same rows in id order
    // could meet the other way round. Locked together first, in id order, they are then only
    // locked again.
    let with_dependencies = batch.iter().filter(|t| !t.dependencies.is_empty()).count();
    if with_dependencies > 1 {
        let mut dependencies: Vec<i64> = batch
            .iter()
            .flat_map(|task| task.dependencies)
            .filter_map(|dependency| super::rows::local_seq(queue, dependency.id()))
            .collect();
        dependencies.sort_unstable();
        tx.query(
            "SELECT id FROM tasq_tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            &[&dependencies],
        )?;
    }
    for index in (0..inserts.len()).filter(|&i| !is_plain(i)) {
        match insert_task(tx, queue, &inserts[index], batch[index].dependencies)? {
            Ok(row) => inserted[index] = row,
            Err(kind) => return Ok(Err((index, kind))),
        }
    }
    Ok(Ok(inserted))
}

/// Notifies the queue's channel, `tasq_channel()` (`tasq_<schema>`, so that queues in other
/// schemas of the same database hear nothing of this one; see `schema.rs`): at most once per
/// transaction. The channel's name fits for every legal schema name and the payload stays under
/// PostgreSQL's limit (`super::dispatch::MAX_PAYLOAD`), so a notify cannot fail the work it rides on.
pub(super) fn notify(client: &mut impl Sql, payload: &str) -> Result<(), postgres::Error> {
    client.execute("SELECT pg_notify(tasq_channel(), $1)", &[&payload])?;
    Ok(())
}

impl PgStore {
    /// A submission's payload as JSON (its `Serialize` is user code, run inside
    /// `catch_unwind`), and its delay (for a wall-clock time, as far as this process's clock
    /// sees: the row takes the time itself, see [`wall_clock_due`](PgStore::wall_clock_due)).
    pub(super) fn prepare(
        &self,
        task: &Submission<'_>,
    ) -> Result<(Value, Duration), SubmitErrorKind> {
        let codec = self.codec(task.type_index);
        let delay = match task.start {
            Start::Now => Duration::ZERO,
            Start::After(delay) => delay,
            Start::At(at) => at.saturating_duration_since(self.clock.now()),
            Start::AtSystem(_) => task
                .start
                .system_delay(std::time::SystemTime::now())
                .unwrap_or_default(),
        };
        // The embedded store's bound: 2^64 ns (about 584 years) from now.
        if delay > Duration::from_nanos(u64::MAX) || self.clock.now().checked_add(delay).is_none() {
            return Err(SubmitErrorKind::TimeOverflow);
        }
        let value = codec
            .encode_payload(task.payload.peek())
            .map_err(SubmitErrorKind::Unserializable)?;
        Ok((value, delay))
    }

    pub(super) fn insert_parts<'a>(
        &self,
        task: &'a Submission<'_>,
        payload: &'a Value,
        delay: Duration,
    ) -> Insert<'a> {
        Insert {
            type_name: self.registry.entry(task.type_index).name,
            payload,
            priority: i16::from(task.priority),
            delay_us: super::rows::micros(delay),
            at_us: self.wall_clock_due(task.start),
            settings: super::rows::settings_columns(&task.settings),
            key: task.key,
            key_period_us: task.key_period.map(super::rows::micros),
            queue: self.registry.entry(task.type_index).queue,
        }
    }

    /// Tells the lifecycle's hooks of the tasks a committed submit added (see
    /// `Events::lifecycle`). After the commit: a worker of this pool may have claimed one (and
    /// told its start) first.
    pub(super) fn tell_submitted(
        &self,
        inserted: &[(i64, bool, &'static str)],
        tasks: &[Submission<'_>],
    ) {
        for (&(seq, duplicate, _), task) in inserted.iter().zip(tasks) {
            if !duplicate {
                self.events.lifecycle(|| Event::Submitted {
                    id: self.id(seq),
                    task_type: self.registry.entry(task.type_index).name,
                    priority: task.priority,
                });
            }
        }
    }

    /// What the caller gets for rows a submit inserted (or found by their keys). The payloads
    /// stay in their slots: the caller drops them, outside any lock.
    pub(super) fn accepted(
        &self,
        inserted: &[(i64, bool, &'static str)],
        completions: Vec<Arc<Completion>>,
        due: bool,
    ) -> Vec<Submitted> {
        let added = inserted
            .iter()
            .filter(|(_, duplicate, _)| !duplicate)
            .count();
        if added > 0 {
            self.count(|t| t.submitted += added as u64);
        }
        let cancelled = inserted
            .iter()
            .filter(|&&(_, duplicate, status)| !duplicate && status == "cancelled")
            .count();
        if cancelled > 0 {
            self.count(|t| t.cancelled += cancelled as u64);
        }
        if due {
            self.wake_fetcher();
        }
        // Cancelled at once by a failed or cancelled dependency, or a duplicate of a task that
        // may have ended: the rows say.
        let settled: Vec<i64> = inserted
            .iter()
            .filter(|&&(_, duplicate, status)| duplicate || status == "cancelled")
            .map(|&(seq, _, _)| seq)
            .collect();
        self.publish_ended(&settled);
        inserted
            .iter()
            .zip(completions)
            .map(|(&(seq, duplicate, _), completion)| Submitted {
                id: self.id(seq),
                completion: Some(completion),
                duplicate,
            })
            .collect()
    }
}
