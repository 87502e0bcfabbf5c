//! The embedded store's schedules: each one's watermark, its last slot, and its pause, under a
//! lock of their own (never the engine's). One thread ticks them, the pool's scheduler, so a slot
//! cannot be decided twice; the lock is for the listings and pauses other threads make.
//!
//! A tick decides its slots under the lock and marks the schedule `ticking`, then makes the
//! payloads (user code) and submits them with no lock held, checking the pause again before each
//! submit. [`pause`](Schedules::pause) waits for a tick in flight to end, so once it returns no
//! slot of the schedule is submitted; a pause from the scheduler's own thread (a payload function
//! that pauses) does not wait for itself, and the check before the next submit stops the tick.

use std::time::{Duration, SystemTime};

use crate::model::id::TaskId;
use crate::model::pause::{PauseError, PauseTarget, Paused};
use crate::model::schedule::{self, Missed, ScheduleInfo, Spec};
use crate::store::schedule::{ScheduleDef, Tick};
use crate::store::{MadePayload, Store};
use crate::sync::{Condvar, Mutex};

/// See the module docs.
#[derive(Default)]
pub(crate) struct Schedules {
    entries: Mutex<Vec<Entry>>,
    /// A pause waits here for a tick in flight.
    ticked: Condvar,
}

struct Entry {
    name: &'static str,
    spec: Spec,
    missed: Missed,
    grace: Duration,
    /// Every slot at or before it is decided.
    watermark: SystemTime,
    last_slot: Option<SystemTime>,
    last_task: Option<TaskId>,
    last_error: Option<String>,
    paused: Option<SystemTime>,
    /// A tick decided slots and has not finished submitting them.
    ticking: bool,
    /// The scheduler thread that ticks (a pause from it does not wait for its own tick).
    ticker: Option<crate::sync::ThreadId>,
}

impl Schedules {
    /// Starts keeping `defs`, each with its watermark at `now`: no slot before the pool's start
    /// runs.
    pub(crate) fn register(&self, defs: &[ScheduleDef], now: SystemTime) {
        let mut entries = self.entries.lock();
        for def in defs {
            if entries.iter().any(|e| e.name == def.name) {
                continue;
            }
            entries.push(Entry {
                name: def.name,
                spec: def.spec.clone(),
                missed: def.missed,
                grace: def.grace,
                watermark: now,
                last_slot: None,
                last_task: None,
                last_error: None,
                paused: None,
                ticking: false,
                ticker: None,
            });
        }
    }

    /// Pauses schedule `name`; see the module docs for when it returns.
    pub(crate) fn pause(&self, name: &str) -> Result<bool, PauseError> {
        let mut entries = self.entries.lock();
        let index = find(&entries, name)?;
        let fresh = entries[index].paused.is_none();
        if fresh {
            entries[index].paused = Some(SystemTime::now());
        }
        let me = crate::sync::current_thread_id();
        while entries[index].ticking && entries[index].ticker != Some(me) {
            self.ticked.wait(&mut entries);
        }
        Ok(fresh)
    }

    pub(crate) fn resume(&self, name: &str) -> Result<bool, PauseError> {
        let mut entries = self.entries.lock();
        let index = find(&entries, name)?;
        Ok(entries[index].paused.take().is_some())
    }

    /// The schedules paused, by name.
    pub(crate) fn paused(&self) -> Vec<Paused> {
        let entries = self.entries.lock();
        let mut paused: Vec<Paused> = entries
            .iter()
            .filter_map(|e| {
                e.paused.map(|since| Paused {
                    target: PauseTarget::Schedule(e.name.to_owned()),
                    since,
                })
            })
            .collect();
        paused.sort_by(|a, b| a.target.cmp(&b.target));
        paused
    }

    /// One tick of `def` at `now` (see the module docs).
    pub(crate) fn tick(&self, store: &dyn Store, def: &ScheduleDef, now: SystemTime) -> Tick {
        let due = {
            let mut entries = self.entries.lock();
            let Ok(index) = find(&entries, def.name) else {
                return Tick {
                    now,
                    next: None,
                    paused: false,
                };
            };
            let entry = &mut entries[index];
            if entry.paused.is_some() {
                return Tick {
                    now,
                    next: None,
                    paused: true,
                };
            }
            let due = schedule::due(&entry.spec, entry.missed, entry.grace, entry.watermark, now);
            entry.ticking = !due.submit.is_empty();
            entry.ticker = Some(crate::sync::current_thread_id());
            due
        };
        for &slot in &due.submit {
            let made = def.make(slot);
            let entries = self.entries.lock();
            let index = find(&entries, def.name).expect("schedules are never removed");
            if entries[index].paused.is_some() {
                // Paused while the payload was made: it is not submitted (and is dropped
                // quietly, after the lock).
                drop(entries);
                crate::unwind::drop_quietly(made);
                break;
            }
            drop(entries);
            let outcome = made.and_then(|payload| {
                let mut payload = MadePayload::new(payload);
                let submitted = store.submit(def.submission(&mut payload));
                drop(payload);
                submitted.map_err(|kind| format!("the submit was refused: {kind}"))
            });
            let mut entries = self.entries.lock();
            let entry = &mut entries[index];
            entry.last_slot = Some(slot);
            match outcome {
                Ok(submitted) => {
                    entry.last_task = Some(submitted.id);
                    entry.last_error = None;
                    drop(entries);
                    crate::store::release(store.hub(), submitted);
                }
                Err(error) => {
                    entry.last_task = None;
                    entry.last_error = Some(error);
                }
            }
        }
        let mut entries = self.entries.lock();
        let index = find(&entries, def.name).expect("schedules are never removed");
        let entry = &mut entries[index];
        entry.ticking = false;
        // Moved once the tick is done, so a listing's next slot says the tick is over (only
        // this thread ticks: nothing decides these slots meanwhile).
        entry.watermark = due.watermark;
        let next = entry.spec.next_after(entry.watermark);
        let paused = entry.paused.is_some();
        drop(entries);
        self.ticked.notify_all();
        Tick { now, next, paused }
    }

    /// The listing of [`Pool::schedules`](crate::Pool::schedules), by name.
    pub(crate) fn list(&self, store: &dyn Store) -> Vec<ScheduleInfo> {
        let mut listed: Vec<ScheduleInfo> = {
            let entries = self.entries.lock();
            entries
                .iter()
                .map(|e| ScheduleInfo {
                    name: e.name.to_owned(),
                    definition: e.spec.definition(),
                    next_slot: e.spec.next_after(e.watermark),
                    last_slot: e.last_slot,
                    last_task: e.last_task,
                    last_state: None,
                    last_error: e.last_error.clone(),
                    paused: e.paused.is_some(),
                })
                .collect()
        };
        // Read after the schedules' lock is released: `status` takes the engine's.
        for info in &mut listed {
            info.last_state = info.last_task.and_then(|id| store.status(id));
        }
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        listed
    }
}

fn find(entries: &[Entry], name: &str) -> Result<usize, PauseError> {
    entries
        .iter()
        .position(|e| e.name == name)
        .ok_or_else(|| PauseError::Unknown(PauseTarget::Schedule(name.to_owned())))
}
