//! Resubmitting a dead letter: the checks that may refuse it, the new row, and (when asked)
//! the dependents its failure cancelled, brought back waiting for the new rows.

use std::collections::HashMap;

use serde_json::Value;

use super::conn::Sql;
use super::rows;
use super::submit::{Insert, insert_task};
use crate::model::error::{ResubmitError, SubmitErrorKind};
use crate::model::id::TaskId;
use crate::model::state::TaskState;
use crate::model::task::Dependency;

/// Why a resubmit was refused, before the ids are made.
pub(super) enum Refusal {
    Unknown,
    NotDeadLetter(TaskState),
    AlreadyResubmitted(i64),
    Taken,
    TypeMismatch,
    KeyTaken(i64),
}

impl Refusal {
    pub(super) fn into_error(self, id: TaskId, to_id: impl Fn(i64) -> TaskId) -> ResubmitError {
        match self {
            Refusal::Unknown => ResubmitError::UnknownTask(id),
            Refusal::NotDeadLetter(state) => ResubmitError::NotDeadLetter(id, state),
            Refusal::AlreadyResubmitted(new) => ResubmitError::AlreadyResubmitted(id, to_id(new)),
            Refusal::Taken => ResubmitError::Taken(id),
            Refusal::TypeMismatch => ResubmitError::TypeMismatch(id),
            Refusal::KeyTaken(holder) => ResubmitError::KeyTaken(id, to_id(holder)),
        }
    }
}

/// A dead letter resubmitted: its new row, the dependents brought back (old row, new row),
/// and how many of those came back cancelled at once (another of their dependencies failed).
pub(super) struct Revival {
    pub(super) new: i64,
    pub(super) brought_back: Vec<(i64, i64)>,
    pub(super) back_cancelled: u64,
}

/// Resubmits dead letter `seq` as a new row, and with `dependents` the dependents its failure
/// cancelled (transitively, dependencies first), waiting for the new rows instead of the old;
/// a dependent whose key another task took comes back without it. With `type_name`, a dead
/// letter of another type is refused; without it (an operator's retry) any type is taken.
pub(super) fn revive(
    tx: &mut impl Sql,
    queue: u64,
    seq: i64,
    type_name: Option<&'static str>,
    dependents: bool,
) -> Result<Result<Revival, Refusal>, postgres::Error> {
    let Some(row) = tx.query_opt(
        "SELECT type, payload, COALESCE(base_priority, priority), key, dead, resubmitted_as,
                status, run_at <= tasq_now(),
                max_attempts, retry_base_us, retry_cap_us, timeout_us, queue
         FROM tasq_tasks WHERE id = $1 FOR UPDATE",
        &[&seq],
    )?
    else {
        return Ok(Err(Refusal::Unknown));
    };
    let status: &str = row.get(6);
    if status != "failed" {
        return Ok(Err(Refusal::NotDeadLetter(rows::state_of(
            status,
            row.get(7),
        ))));
    }
    if let Some(new) = row.get::<_, Option<i64>>(5) {
        return Ok(Err(Refusal::AlreadyResubmitted(new)));
    }
    let payload: Option<Value> = row.get(1);
    let (true, Some(payload)) = (row.get::<_, bool>(4), payload) else {
        return Ok(Err(Refusal::Taken));
    };
    let type_name = match type_name {
        Some(name) if name != row.get::<_, &str>(0) => return Ok(Err(Refusal::TypeMismatch)),
        Some(name) => name,
        None => super::store::leak_name(row.get(0)),
    };
    let key: Option<String> = row.get(3);
    // The dead letter's own settings, as it was submitted with them: fresh attempts, the same
    // limit.
    let insert = Insert {
        type_name,
        payload: &payload,
        priority: row.get(2),
        delay_us: 0,
        at_us: None,
        settings: (row.get(8), row.get(9), row.get(10), row.get(11)),
        key: key.as_deref(),
        key_period_us: None,
        queue: row.get(12),
    };
    let new = match insert_task(tx, queue, &insert, &[])? {
        Ok((new, false, _)) => new,
        Ok((holder, true, _)) => return Ok(Err(Refusal::KeyTaken(holder))),
        // Its key is held by a task of another type (no other refusal is possible without
        // dependencies).
        Err(SubmitErrorKind::KeyConflict { existing, .. }) => {
            let holder = rows::local_seq(queue, existing).unwrap_or_default();
            return Ok(Err(Refusal::KeyTaken(holder)));
        }
        Err(_) => return Ok(Err(Refusal::TypeMismatch)),
    };
    tx.execute(
        "UPDATE tasq_tasks SET dead = false, payload = NULL, resubmitted_as = $2 WHERE id = $1",
        &[&seq, &new],
    )?;
    let mut brought_back = Vec::new();
    let mut back_cancelled = 0;
    if dependents {
        let mut renamed = HashMap::from([(seq, new)]);
        // The dependents this failure cancelled: each cancelled because of the dead letter or
        // of another task of the cascade (`cancel_cause`), not a dependent that another failed
        // dependency had cancelled before.
        let cascade = tx.query(
            "WITH RECURSIVE doomed(id) AS (
                 SELECT $1::BIGINT
                 UNION
                 SELECT t.id FROM doomed
                 JOIN tasq_deps d ON d.dependency = doomed.id
                 JOIN tasq_tasks t ON t.id = d.dependent AND t.cancel_cause = doomed.id
                 WHERE t.status = 'cancelled'
                   AND t.cancel_reason IN ('dependency_failed', 'dependency_cancelled')
             )
             SELECT t.id, t.type, t.payload, COALESCE(t.base_priority, t.priority), t.key,
                    t.max_attempts,
                    ARRAY(SELECT dependency FROM tasq_deps WHERE dependent = t.id ORDER BY 1),
                    t.retry_base_us, t.retry_cap_us, t.timeout_us, t.queue
             FROM tasq_tasks t JOIN doomed ON t.id = doomed.id
             WHERE t.id <> $1 AND t.resubmitted_as IS NULL AND t.payload IS NOT NULL
             ORDER BY t.id",
            &[&seq],
        )?;
        for row in &cascade {
            let old: i64 = row.get(0);
            let type_name = super::store::leak_name(row.get(1));
            let payload: Value = row.get(2);
            let key: Option<String> = row.get(4);
            let deps: Vec<i64> = row.get(6);
            let dependencies: Vec<Dependency> = deps
                .iter()
                .map(|d| {
                    let d = renamed.get(d).copied().unwrap_or(*d);
                    Dependency::from(TaskId::from_parts(queue, d as u64))
                })
                .collect();
            let mut insert = Insert {
                type_name,
                payload: &payload,
                priority: row.get(3),
                delay_us: 0,
                at_us: None,
                settings: (row.get(5), row.get(7), row.get(8), row.get(9)),
                key: key.as_deref(),
                key_period_us: None,
                queue: row.get(10),
            };
            let mut inserted = insert_task(tx, queue, &insert, &dependencies)?;
            if matches!(
                inserted,
                Ok((_, true, _)) | Err(SubmitErrorKind::KeyConflict { .. })
            ) {
                // Its key is another task's now: it comes back without one.
                insert.key = None;
                inserted = insert_task(tx, queue, &insert, &dependencies)?;
            }
            // A dependent with another dependency gone stays as it is (and so do its own
            // dependents).
            if let Ok((new_dependent, false, status)) = inserted {
                tx.execute(
                    "UPDATE tasq_tasks SET resubmitted_as = $2 WHERE id = $1",
                    &[&old, &new_dependent],
                )?;
                renamed.insert(old, new_dependent);
                brought_back.push((old, new_dependent));
                // Back, and cancelled at once: another dependency of it failed meanwhile.
                back_cancelled += u64::from(status == "cancelled");
            }
        }
    }
    Ok(Ok(Revival {
        new,
        brought_back,
        back_cancelled,
    }))
}
