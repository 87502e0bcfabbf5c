//! Group commit of successes: the workers of a pool whose tasks succeeded write their acks
//! together, one statement for all the acks waiting, led by whichever worker arrives when no
//! write is in flight.
//!
//! A worker still returns only once its own ack is written (or refused), so nothing above this
//! file changes: a handler's outcome is durable before its worker moves on, and user code (the
//! output's and payload's `Drop`, a handle's wake-up) still runs on that worker's thread. One
//! worker alone writes batches of one; under load, the acks that arrive while a write is in
//! flight go out together in the next, so the pool makes fewer round trips and commits (and
//! fewer WAL flushes) than it has tasks.
//!
//! An ack that the statement does not write (a cancel was asked for, the task has dependents,
//! or the lease was lost) comes back to its worker, which takes the general path for it.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::conn::{Connections, Sql};
use crate::sync::{Condvar, Mutex};
use crate::unwind;

/// Most acks in one statement: keeps the `done:<id> ...` notification under PostgreSQL's
/// 8,000-byte payload limit (25 bytes an id at most).
const MAX_BATCH: usize = 200;

/// The successes of the common case, fenced by their leases: a row is written only if it is
/// still running under the ack's lease, with no cancel asked for and no dependents waiting.
/// One notification names every row written (`done:<id> ...`), for handles waiting in other
/// processes: NOTIFY serialises the commits of notifying transactions across the cluster, so
/// one per batch, not one per task, is what lets acks scale with the workers. `t.id = ANY($1)`
/// keeps the rows found through the primary key in the prepared statement's generic plan.
///
/// The rows are locked in id order first (`locked`), as a submit locks its dependencies: an
/// update joined to the batch would lock them in whatever order its plan meets them, and a
/// batch holding one dependency while a submit holds another would deadlock with it.
pub(crate) const ACK: &str = "
    WITH locked AS (
        SELECT id FROM tasq_tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE
    ), done AS (
        SELECT * FROM unnest($1::BIGINT[], $2::BIGINT[], $3::JSONB[]) AS d(id, lease, output)
    ), ended AS (
        UPDATE tasq_tasks t SET status = 'succeeded', output = done.output,
               finished_at = tasq_now(), lease_until = NULL
        FROM done JOIN locked USING (id)
        WHERE t.id = ANY($1) AND t.id = done.id AND t.lease_id = done.lease
          AND t.status = 'running'
          AND t.cancel_requested IS NULL AND NOT t.has_dependents
        RETURNING t.id
    )
    SELECT id, (SELECT pg_notify(tasq_channel(), string_agg('done:' || id, ' '))
                FROM ended)::TEXT
    FROM ended";

/// The acks waiting to be written and what became of those written.
#[derive(Default)]
struct State {
    pending: Vec<Pending>,
    /// A worker is writing a batch.
    flushing: bool,
    /// Results of written batches, until their workers take them.
    done: HashMap<i64, Done>,
}

struct Pending {
    seq: i64,
    lease: i64,
    output: Value,
}

/// What became of one ack; the output comes back when the ack was not written.
enum Done {
    Written,
    Refused(Value),
    Failed(Value, String),
}

/// The acks of one pool.
#[derive(Default)]
pub(super) struct Acks {
    state: Mutex<State>,
    written: Condvar,
}

impl Acks {
    /// Writes that task `seq` succeeded under `lease` with `output`, together with any other
    /// acks waiting. `Ok(true)`: written. `Ok(false)`: refused by the row (see the file's
    /// docs), `output` is back in place for the general path. `Err`: the database failed, and
    /// the caller tries again.
    pub(super) fn succeed(
        &self,
        store: &impl Connections,
        seq: i64,
        lease: i64,
        output: &mut Value,
    ) -> Result<bool, String> {
        let mut state = self.state.lock();
        state.pending.push(Pending {
            seq,
            lease,
            output: std::mem::take(output),
        });
        // Every wait loops on its condition: our result is in, or nobody writes and we lead.
        loop {
            if let Some(done) = state.done.remove(&seq) {
                drop(state);
                return match done {
                    Done::Written => Ok(true),
                    Done::Refused(value) => {
                        *output = value;
                        Ok(false)
                    }
                    Done::Failed(value, error) => {
                        *output = value;
                        Err(error)
                    }
                };
            }
            if state.flushing {
                self.written.wait(&mut state);
                continue;
            }
            state.flushing = true;
            let n = state.pending.len().min(MAX_BATCH);
            let batch: Vec<Pending> = state.pending.drain(..n).collect();
            drop(state);
            // The store's own code, but a panic here must not leave `flushing` set forever.
            let result = unwind::catch(|| write(store, &batch))
                .unwrap_or_else(|panic| Err(format!("the ack panicked: {panic}")));
            state = self.state.lock();
            state.flushing = false;
            match result {
                Ok(written) => {
                    for p in batch {
                        let done = if written.contains(&p.seq) {
                            Done::Written
                        } else {
                            Done::Refused(p.output)
                        };
                        state.done.insert(p.seq, done);
                    }
                }
                Err(error) => {
                    for p in batch {
                        state
                            .done
                            .insert(p.seq, Done::Failed(p.output, error.clone()));
                    }
                }
            }
            self.written.notify_all();
        }
    }
}

/// The ack of one success, as [`ACK`] writes each (a batch of one is the common case of a
/// pool with few workers, and this form costs the server less than the array join).
pub(crate) const ACK_ONE: &str = "
    WITH ended AS (
        UPDATE tasq_tasks SET status = 'succeeded', output = $3,
               finished_at = tasq_now(), lease_until = NULL
        WHERE id = $1 AND lease_id = $2 AND status = 'running'
          AND cancel_requested IS NULL AND NOT has_dependents
        RETURNING id
    )
    SELECT id, pg_notify(tasq_channel(), 'done:' || id)::TEXT FROM ended";

/// One statement for a batch: the ids it wrote.
fn write(store: &impl Connections, batch: &[Pending]) -> Result<HashSet<i64>, String> {
    let rows = match batch {
        [one] => store.with_conn(|c| c.query(ACK_ONE, &[&one.seq, &one.lease, &one.output]))?,
        _ => {
            let ids: Vec<i64> = batch.iter().map(|p| p.seq).collect();
            let leases: Vec<i64> = batch.iter().map(|p| p.lease).collect();
            let outputs: Vec<&Value> = batch.iter().map(|p| &p.output).collect();
            store.with_conn(|c| c.query(ACK, &[&ids, &leases, &outputs]))?
        }
    };
    Ok(rows.iter().map(|row| row.get(0)).collect())
}
