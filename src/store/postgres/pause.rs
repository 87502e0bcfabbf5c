//! Pausing and resuming types and queues for the whole fleet: the rows of `tasq_pauses`, and
//! the fence that makes a pause wait for the claims that could not see it (the design is in
//! `schema.rs`, version 6).

use std::time::{Duration, SystemTime};

use super::conn::{Connections, Sql};
use crate::model::pause::{PauseError, PauseTarget, Paused};

/// How long one try of a pause waits for the claims in flight to end. Claims queue behind a
/// pause that waits, so the wait is short, and tried again: a claim transaction held open
/// (its process stopped mid-claim) holds off pauses, not the fleet's claims.
const FENCE_WAIT: &str = "SET LOCAL lock_timeout = '500ms'";

/// Tries of the fence before a pause gives up (about 30 s of waiting, with the pauses between).
const FENCE_TRIES: u32 = 40;

/// Pauses `target` for the fleet (see [`Store::pause`](crate::store::Store::pause)), in the
/// name of `holder` (the pool's process, or an operator's console).
pub(super) fn pause(
    conns: &impl Connections,
    holder: &str,
    target: &PauseTarget,
) -> Result<bool, PauseError> {
    target.check()?;
    under_fence(conns, &target.to_string(), |tx| {
        let added = tx.execute(
            "INSERT INTO tasq_pauses (kind, name, paused_at, paused_by)
                 VALUES ($1, $2, tasq_now(), $3) ON CONFLICT DO NOTHING",
            &[&target.kind(), &target.name(), &holder],
        )?;
        Ok(added == 1)
    })
    .map_err(PauseError::Store)
}

/// Runs `change` (of what `what` names) in a transaction that holds the pause fence
/// exclusively, and commits it: every claim that read the pauses and limits without this
/// change has committed before `change` runs, and every later one waits for its commit.
/// The fence is waited for briefly and tried again, so that a claim transaction held open
/// (its process stopped mid-claim) holds off such changes, not the fleet's claims.
pub(super) fn under_fence<R>(
    conns: &impl Connections,
    what: &str,
    mut change: impl FnMut(&mut super::conn::Tx<'_>) -> Result<R, postgres::Error>,
) -> Result<R, String> {
    for attempt in 1..=FENCE_TRIES {
        let result = conns.with_conn(|client| {
            let mut tx = client.transaction()?;
            tx.execute(FENCE_WAIT, &[])?;
            match tx.execute("SELECT pg_advisory_xact_lock(tasq_pause_fence())", &[]) {
                Ok(_) => {}
                Err(e) if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
            let done = change(&mut tx)?;
            tx.commit()?;
            Ok(Some(done))
        });
        match result {
            Ok(Some(done)) => return Ok(done),
            Ok(None) => std::thread::sleep(Duration::from_millis(u64::from(attempt.min(10)) * 10)),
            Err(e) => return Err(e),
        }
    }
    Err(format!(
        "{what} could not be changed: claims held the pause fence through {FENCE_TRIES} \
             tries (a claim transaction left open?)"
    ))
}

/// Resumes `target` for the fleet, and tells every pool to look for work.
pub(super) fn resume(conns: &impl Connections, target: &PauseTarget) -> Result<bool, PauseError> {
    target.check()?;
    conns
        .with_conn(|client| {
            let mut tx = client.transaction()?;
            let removed = tx.execute(
                "DELETE FROM tasq_pauses WHERE kind = $1 AND name = $2",
                &[&target.kind(), &target.name()],
            )?;
            if removed > 0 {
                super::submit::notify(&mut tx, "ready")?;
            }
            tx.commit()?;
            Ok(removed > 0)
        })
        .map_err(PauseError::Store)
}

/// The fleet's pauses, types first, then queues, each by name.
pub(super) fn pauses(conns: &impl Connections) -> Result<Vec<Paused>, PauseError> {
    let rows = conns
        .with_conn(|client| {
            client.query(
                "SELECT kind, name, paused_at FROM tasq_pauses
                     ORDER BY kind = 'queue', kind = 'schedule', name",
                &[],
            )
        })
        .map_err(PauseError::Store)?;
    Ok(rows
        .iter()
        .map(|row| {
            let name: String = row.get(1);
            let since: SystemTime = row.get(2);
            let target = match row.get::<_, &str>(0) {
                "queue" => PauseTarget::Queue(name),
                "schedule" => PauseTarget::Schedule(name),
                _ => PauseTarget::Type(name),
            };
            Paused { target, since }
        })
        .collect())
}
