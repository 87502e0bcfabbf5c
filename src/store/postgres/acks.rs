//! The completer's queue (`completer.rs` is the thread): the successes workers hand over, the
//! statements that write them in groups, and what a run leaves behind, as the store writes it
//! (`Ending`) and as a worker drops it (`Litter`).

use std::any::Any;
use std::collections::HashSet;

use serde_json::Value;

use std::time::Duration;

use super::conn::{Connections, Sql};
use crate::model::completion::{Completion, Finished};
use crate::model::state::Failure;
use crate::sync::{Arc, Condvar, Mutex};
use crate::unwind;

/// How a run ends, as the store writes it.
pub(super) enum Ending {
    Succeeded(Value, Box<dyn Any + Send + Sync>),
    /// `attempt`: the attempt that asked for it, for its event. Not read from the pool's entry
    /// for the row: once the retry is written, this pool's fetcher may claim the row again
    /// and put the next attempt's entry in its place before the event is told (beside two CPU
    /// hogs, a first attempt's retry was told as the second's).
    Retry {
        delay: Duration,
        error: String,
        attempt: u32,
    },
    Failed(Failure),
}

/// A user value a run left, for a thread that may run user code to drop (see `completer.rs`).
#[allow(dead_code)] // Held only to be dropped.
pub(super) enum Litter {
    Ending(Ending),
    Finished(Finished),
    Completion(Arc<Completion>),
    Payload(Box<dyn Any + Send>),
}

/// Drops each value on its own, inside `catch_unwind` (a second panic while a first unwinds
/// through a `Vec`'s drop would abort the process).
pub(super) fn drop_litter(litter: Vec<Litter>) {
    for value in litter {
        unwind::drop_quietly(value);
    }
}

/// Most acks in one statement: keeps the `done:<id> ...` notification under PostgreSQL's
/// 8,000-byte payload limit (25 bytes an id at most).
const MAX_BATCH: usize = 200;

/// Most acks unwritten (waiting or in flight) before a worker that hands one over waits.
const MAX_WAITING: usize = 2 * MAX_BATCH;

/// A success on its way to the database.
pub(super) struct Ack {
    pub(super) seq: i64,
    pub(super) lease: i64,
    /// The output as its row stores it.
    pub(super) value: Value,
    /// The output itself, for a local handle.
    pub(super) output: Option<Box<dyn Any + Send + Sync>>,
    /// The task's payload, dropped by a worker once the ack is settled.
    pub(super) payload: Option<Box<dyn Any + Send>>,
    /// With a manual clock, when the run ended (see `PgStore::complete`).
    pub(super) ended_at: Option<i64>,
}

impl Ack {
    /// The ack of task `seq`'s success under `lease`.
    pub(super) fn new(
        seq: i64,
        lease: i64,
        value: Value,
        output: Box<dyn Any + Send + Sync>,
        payload: Box<dyn Any + Send>,
        ended_at: Option<i64>,
    ) -> Ack {
        Ack {
            seq,
            lease,
            value,
            output: Some(output),
            payload: Some(payload),
            ended_at,
        }
    }
}

/// The acks waiting for the completer.
#[derive(Default)]
struct Queue {
    waiting: Vec<Ack>,
    /// Acks of the batch being written and settled.
    in_flight: usize,
    /// The completer exits once `waiting` is empty; later acks are written by their workers.
    stopped: bool,
}

/// The completer's queue of one pool.
#[derive(Default)]
pub(super) struct Acks {
    queue: Mutex<Queue>,
    /// The completer waits here for acks.
    ready: Condvar,
    /// Workers wait here for room (see [`MAX_WAITING`]).
    room: Condvar,
}

impl Acks {
    /// Hands `ack` to the completer, waiting for room first; gives it back if the completer
    /// has stopped (the caller writes it itself).
    pub(super) fn hand_over(&self, ack: Ack) -> Result<(), Ack> {
        let mut queue = self.queue.lock();
        // Every wait loops on its condition.
        while !queue.stopped && queue.waiting.len() + queue.in_flight >= MAX_WAITING {
            self.room.wait(&mut queue);
        }
        if queue.stopped {
            return Err(ack);
        }
        queue.waiting.push(ack);
        self.ready.notify_one();
        Ok(())
    }

    /// The completer's next batch; `None` once stopped with nothing waiting.
    pub(super) fn next_batch(&self) -> Option<Vec<Ack>> {
        let mut queue = self.queue.lock();
        queue.in_flight = 0;
        self.room.notify_all();
        loop {
            if !queue.waiting.is_empty() {
                let n = queue.waiting.len().min(MAX_BATCH);
                let batch: Vec<Ack> = queue.waiting.drain(..n).collect();
                queue.in_flight = batch.len();
                return Some(batch);
            }
            if queue.stopped {
                return None;
            }
            self.ready.wait(&mut queue);
        }
    }

    /// Stops the completer once the acks waiting are written (the pool stops).
    pub(super) fn stop(&self) {
        self.queue.lock().stopped = true;
        self.ready.notify_all();
        self.room.notify_all();
    }
}

/// The successes of the common case, fenced by their leases: a row is written only if it is
/// still running under the ack's lease, with no cancel asked for and no dependents waiting.
/// One notification names every row written (`done:<id> ...`), for handles waiting in other
/// processes: NOTIFY serialises the commits of notifying transactions across the cluster, so
/// one per batch, not one per task, is what lets acks scale with the workers. `t.id = ANY($1)`
/// keeps the rows found through the primary key in the prepared statement's generic plan.
///
/// Each row's `finished_at` is a microsecond after the one handed over before it: one
/// statement's `tasq_now()` would give the batch one time, and retention by count (which keeps
/// the newest rows by `finished_at`) would then keep any of them.
///
/// The rows are locked in id order first (`locked`), as a submit locks its dependencies: an
/// update joined to the batch would lock them in whatever order its plan meets them, and a
/// batch holding one dependency while a submit holds another would deadlock with it.
pub(crate) const ACK: &str = "
    WITH locked AS (
        SELECT id FROM tasq_tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE
    ), done AS (
        SELECT * FROM unnest($1::BIGINT[], $2::BIGINT[], $3::JSONB[])
            WITH ORDINALITY AS d(id, lease, output, ord)
    ), ended AS (
        UPDATE tasq_tasks t SET status = 'succeeded', output = done.output,
               finished_at = tasq_now() + interval '1 microsecond' * (done.ord - 1),
               lease_until = NULL
        FROM done JOIN locked USING (id)
        WHERE t.id = ANY($1) AND t.id = done.id AND t.lease_id = done.lease
          AND t.status = 'running'
          AND t.cancel_requested IS NULL AND NOT t.has_dependents
        RETURNING t.id
    )
    SELECT id, (SELECT pg_notify(tasq_channel(), string_agg('done:' || id, ' '))
                FROM ended)::TEXT
    FROM ended";

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
pub(super) fn write(store: &impl Connections, batch: &[Ack]) -> Result<HashSet<i64>, String> {
    let rows = match batch {
        [one] => store.with_conn(|c| c.query(ACK_ONE, &[&one.seq, &one.lease, &one.value]))?,
        _ => {
            let ids: Vec<i64> = batch.iter().map(|p| p.seq).collect();
            let leases: Vec<i64> = batch.iter().map(|p| p.lease).collect();
            let outputs: Vec<&Value> = batch.iter().map(|p| &p.value).collect();
            store.with_conn(|c| c.query(ACK, &[&ids, &leases, &outputs]))?
        }
    };
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    fn ack(seq: i64) -> Ack {
        Ack {
            seq,
            lease: 1,
            value: Value::Null,
            output: None,
            payload: None,
            ended_at: None,
        }
    }

    /// A queue holding as many unwritten acks as it takes, all waiting.
    fn full() -> Arc<Acks> {
        let acks = Arc::new(Acks::default());
        for seq in 0..MAX_WAITING as i64 {
            assert!(acks.hand_over(ack(seq)).is_ok());
        }
        acks
    }

    /// Hands one ack over on another thread; the receiver hears when it was taken (`Ok`) or
    /// given back (`Err`).
    fn hand_over_elsewhere(acks: &Arc<Acks>, seq: i64) -> mpsc::Receiver<Result<(), i64>> {
        let (sent, heard) = mpsc::channel();
        let acks = Arc::clone(acks);
        std::thread::spawn(move || {
            let _ = sent.send(acks.hand_over(ack(seq)).map_err(|ack| ack.seq));
        });
        heard
    }

    /// How long a hand-over that must wait is watched for returning anyway. Its return would
    /// be the bug: a slow machine can only hide it, never report it falsely.
    const WATCH: Duration = Duration::from_millis(200);

    #[test]
    fn a_worker_waits_while_the_unwritten_acks_reach_the_bound() {
        let acks = full();
        // All of them waiting, none in flight: the next one waits.
        let heard = hand_over_elsewhere(&acks, -1);
        assert!(heard.recv_timeout(WATCH).is_err(), "taken past the bound");
        // A batch in flight still counts until the completer asks for the next.
        let first = acks.next_batch().expect("acks waiting");
        assert_eq!(first.len(), MAX_BATCH);
        assert!(heard.recv_timeout(WATCH).is_err(), "taken while in flight");
        let second = acks.next_batch().expect("acks waiting");
        assert_eq!(second.len(), MAX_WAITING - MAX_BATCH);
        assert_eq!(heard.recv_timeout(Duration::from_secs(10)), Ok(Ok(())));
        assert_eq!(acks.next_batch().map(|b| b[0].seq), Some(-1));
    }

    #[test]
    fn once_stopped_the_queue_empties_then_gives_acks_back() {
        let acks = full();
        // A worker waiting for room when the pool stops writes its own ack.
        let heard = hand_over_elsewhere(&acks, -1);
        acks.stop();
        assert_eq!(heard.recv_timeout(Duration::from_secs(10)), Ok(Err(-1)));
        assert_eq!(acks.hand_over(ack(-2)).map_err(|ack| ack.seq), Err(-2));
        // What was handed over before the stop is still written, then the completer ends.
        let mut written = 0;
        while let Some(batch) = acks.next_batch() {
            written += batch.len();
        }
        assert_eq!(written, MAX_WAITING);
    }
}
