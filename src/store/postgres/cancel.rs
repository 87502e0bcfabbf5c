//! Cancelling a task by id or key: one not started ends cancelled with its dependents, a
//! running one has its cancel asked for, and the process that runs it is told (a hint: its
//! heartbeat reads the request too).

use super::conn::{Connections, Sql};
use super::store::PgStore;
use super::submit::notify;
use crate::model::state::{CancelOutcome, CancelReason};
use crate::observe::event::Event;

/// The lookup of a cancel by id (`$1`): the row locked, as [`cancel_locked`] reads it.
pub(super) const BY_ID: &str =
    "SELECT id, status, has_dependents, type FROM tasq_tasks WHERE id = $1 FOR UPDATE";

/// The lookup of a cancel by key (`$1`): the key's live or succeeded holder, locked as it is
/// found (it holds the key until the cancel commits).
pub(super) const BY_KEY: &str =
    "SELECT id, status, has_dependents, type FROM tasq_tasks WHERE key = $1
     AND status IN ('blocked', 'ready', 'running', 'succeeded') FOR UPDATE";

/// A dead letter purged (`$1` its row): its payload dropped, a dead letter no more.
pub(super) const PURGE: &str =
    "UPDATE tasq_tasks SET dead = false, payload = NULL WHERE id = $1 AND dead";

impl PgStore {
    /// Cancels the task that `lookup` finds and locks (`$1` is `param`; it returns the row's
    /// `id, status, has_dependents, type`), as [`Store::cancel`](crate::store::Store::cancel) does: one not started ends cancelled
    /// with its dependents, a running one has its cancel asked for. `None` if no row matched.
    pub(super) fn cancel_row(
        &self,
        lookup: &str,
        param: &(dyn postgres::types::ToSql + Sync),
    ) -> Result<Option<(i64, CancelOutcome)>, String> {
        let result = cancel_locked(self, lookup, param)?;
        let Some(Cancelled {
            seq,
            outcome,
            done,
            type_name,
        }) = result
        else {
            return Ok(None);
        };
        match outcome {
            CancelOutcome::Cancelled => {
                // The task and the dependents it took with it.
                self.count(|t| t.cancelled += done.len() as u64);
                self.events.lifecycle(|| Event::Cancelled {
                    id: self.id(seq),
                    task_type: self.type_name(&type_name),
                    reason: CancelReason::Requested,
                });
                self.publish_ended(&done);
            }
            CancelOutcome::Signalled => self.fire_local(seq),
            CancelOutcome::AlreadyFinished(_) => {}
        }
        Ok(Some((seq, outcome)))
    }
}

/// A cancel's transaction done: the row, the outcome, the rows that ended with it (the task
/// and its dependents, if it had not started), and its type.
pub(super) struct Cancelled {
    pub(super) seq: i64,
    pub(super) outcome: CancelOutcome,
    pub(super) done: Vec<i64>,
    pub(super) type_name: String,
}

/// The transaction of a cancel (see [`PgStore::cancel_row`]): the row that `lookup` finds and
/// locks cancelled with its dependents, or its running task's cancel asked for (and the process
/// running it told). `None` if no row matched.
pub(super) fn cancel_locked(
    conns: &impl Connections,
    lookup: &str,
    param: &(dyn postgres::types::ToSql + Sync),
) -> Result<Option<Cancelled>, String> {
    conns.with_conn(|client| {
        let mut tx = client.transaction()?;
        let Some(row) = tx.query_opt(lookup, &[param])? else {
            return Ok(None);
        };
        let seq: i64 = row.get(0);
        let status: String = row.get(1);
        let type_name: String = row.get(3);
        let mut done = Vec::new();
        let outcome = match status.as_str() {
            "blocked" | "ready" => {
                tx.execute(
                    "UPDATE tasq_tasks SET status = 'cancelled', cancel_reason = 'requested',
                     finished_at = tasq_now() WHERE id = $1",
                    &[&seq],
                )?;
                super::ending::cascade_ended(&mut tx, seq, "cancelled", row.get(2), &mut done)?;
                super::ending::notify_changes(&mut tx, false, &done)?;
                CancelOutcome::Cancelled
            }
            "running" => {
                tx.execute(
                    "UPDATE tasq_tasks SET cancel_requested = 'requested' WHERE id = $1
                     AND cancel_requested IS NULL",
                    &[&seq],
                )?;
                notify(&mut tx, &format!("cancel:{seq}"))?;
                CancelOutcome::Signalled
            }
            other => CancelOutcome::AlreadyFinished(super::rows::state_of(other, true)),
        };
        tx.commit()?;
        Ok(Some(Cancelled {
            seq,
            outcome,
            done,
            type_name,
        }))
    })
}
