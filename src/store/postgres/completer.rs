//! The completer: successes written in groups, off the workers' path.
//!
//! A worker whose handler succeeded hands its ack over (`acks.rs`, the queue) and goes on to its
//! next task: its slot is free at once (the fetcher may claim for it), while the task stays in
//! `Local::running`, marked `acking` (so the heartbeat keeps its lease, a shutdown waits for
//! it, and the pool is not settled) until its ack is written. One completer thread per pool
//! writes the acks waiting, up to `MAX_BATCH` in one statement, as soon as its previous
//! statement returned: the acks that arrive while one write is in flight go out together in the
//! next, so a pool makes far fewer round trips and commits (WAL flushes) than it has tasks, even
//! with one worker. Then it settles each as `finish` does: the totals, the lifecycle's events,
//! the outcome published to local handles.
//!
//! An ack the statement does not write (a cancel was asked for, the task has dependents, or
//! the lease was lost) takes the general path (`write_ending_tx`), on the completer too.
//!
//! # No user code on the completer
//!
//! The values a run leaves (its payload, its output when no local handle takes it, the last
//! reference to a handle's completion) are user values, whose `Drop` may call back into the
//! pool, even wait for a task whose ack waits behind them. The completer never drops one: they
//! go to `Local::litter`, and a worker drops them, at its next hand-over or as it waits for
//! work; a shutdown drops what is left. The completer's own code runs inside `catch_unwind`:
//! a batch whose write panicked takes the general path, ack by ack.
//!
//! # What it changes
//!
//! A success is durable shortly after its worker moves on, no longer before: a process killed
//! in between runs the task again elsewhere (at least once, as a kill during the handler
//! always did). Local handles, the events and the pool's totals see it once it is written.
//! A worker waits while `MAX_WAITING` acks are unwritten (the database is slow or away), so a
//! pool holds a bounded number. Once the completer has stopped (the pool shut down while a
//! handler that called `shutdown` was still running), a worker writes its own ack.

use std::collections::HashSet;

use super::acks::{Ack, Ending, Litter, write};
use super::store::PgStore;
use crate::model::state::TaskState;
use crate::sync::Arc;
use crate::unwind;

/// The completer thread (see the module docs), until the pool stops.
pub(super) fn complete_loop(store: &Arc<PgStore>) {
    while let Some(batch) = store.acks.next_batch() {
        // A panic here is the store's own: nothing written, each ack takes the general path.
        let written = unwind::catch(|| write_until_answered(store, &batch)).unwrap_or_default();
        let mut litter = Vec::new();
        for ack in batch {
            let done = written.contains(&ack.seq);
            let seq = ack.seq;
            if let Err(panic) = unwind::catch(|| settle(store, ack, done, &mut litter)) {
                eprintln!("tasq: settling the ack of task {seq} panicked: {panic}");
            }
        }
        if !litter.is_empty() {
            let mut local = store.local.lock();
            local.litter.append(&mut litter);
            // A worker waiting for work drops it (see `PgStore::claim`).
            store.work_cv.notify_one();
        }
    }
}

/// Writes `batch` until the database answers: the ids written.
fn write_until_answered(store: &PgStore, batch: &[Ack]) -> HashSet<i64> {
    let mut delay = std::time::Duration::from_millis(20);
    loop {
        match write(store, batch) {
            Ok(written) => return written,
            Err(_) => {
                // Retried until written, or until the leases are gone: then the rows are not
                // written, and the general path finds them lost.
                std::thread::sleep(delay);
                delay = (delay * 2).min(std::time::Duration::from_secs(2));
            }
        }
    }
}

/// What follows an ack's write: the general path if it was not written, then the run is
/// settled (see `PgStore::settle`) and forgotten here.
pub(super) fn settle(store: &PgStore, mut ack: Ack, written: bool, litter: &mut Vec<Litter>) {
    let output = ack
        .output
        .take()
        .expect("a handed-over ack carries its output");
    litter.extend(ack.payload.take().map(Litter::Payload));
    let ending = Ending::Succeeded(std::mem::take(&mut ack.value), output);
    let (state, cascaded) = if written {
        (Some(TaskState::Succeeded), 0)
    } else {
        store.write_until_done(|store| {
            store.write_general(ack.seq, ack.lease, &ending, ack.ended_at)
        })
    };
    let from_row = store.settle(ack.seq, state, cascaded, ending, litter);
    {
        let mut local = store.local.lock();
        store.forget_run(&mut local, ack.seq, ack.lease);
    }
    store.after_release(ack.seq, state, from_row);
}
