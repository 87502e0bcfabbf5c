//! Periodic tasks for the whole fleet: each slot submitted once, however many processes run the
//! schedule, whatever their clocks, whoever is killed mid-submit (the tables are in
//! `schema.rs`, version 6).
//!
//! - `tasq_schedules` holds one row per schedule *definition* (its name, and its spec and
//!   policy as text) with the definition's watermark. A tick locks its row `FOR UPDATE`, reads
//!   the database's `tasq_now()`, decides the slots in `(watermark, now]` by the policy, and in
//!   the same transaction inserts each slot's task and moves the watermark. Killed mid-submit,
//!   the transaction rolls back whole: the slots are still undecided for the next tick, here or
//!   anywhere. Processes of one definition queue on its row lock; their clocks never enter
//!   into it (the database's decides, read after the lock).
//! - `tasq_schedule_slots` remembers each slot submitted, by name and time, with its task: a
//!   slot's row is inserted `ON CONFLICT DO NOTHING` before its task, so a slot is submitted
//!   once per *name* even while two definitions of it run side by side (a rolling deploy that
//!   changes the schedule: the slots of both run, each time once). Slots older than every live
//!   definition's watermark can never be decided again and are pruned, but a schedule's newest.
//! - A paused schedule's tick reads the pauses under the pause fence, shared, as claims do (see
//!   `pause.rs`): once `pause` returns, no tick that missed it is in flight, and the next one sees
//!   it. The watermark does not move while paused: on resume the policy decides what was missed.
//! - The tick's transaction ends itself on the server if its process stops in it
//!   (`idle_in_transaction_session_timeout`): a process stopped with SIGSTOP holds no schedule
//!   for longer than that, and the commit it attempts when it wakes fails.

use std::time::SystemTime;

use super::conn::{Connections, Sql, Tx};
use super::store::PgStore;
use super::submit::{due_now, insert_task, notify};
use crate::model::id::TaskId;
use crate::model::schedule::{self, ScheduleInfo, Spec};
use crate::observe::event::Event;
use crate::store::schedule::{ScheduleDef, Tick};
use crate::store::{MadePayload, Submission};

/// How long a tick's transaction may sit idle (its process stopped, or making a payload that
/// hangs) before the server ends it.
const IDLE_TIMEOUT: &str = "SET LOCAL idle_in_transaction_session_timeout = '10s'";

/// How long a definition may go unseen (no process ticking it) before its row is pruned.
const FORGET_DEFINITION: &str = "7 days";

/// A definition's identity: its spec and what it does with missed slots.
pub(super) fn definition(def: &ScheduleDef) -> String {
    let mut text = format!("{}; missed {}", def.spec.definition(), def.missed);
    if def.missed == crate::model::schedule::Missed::Skip {
        text.push_str(&format!(" after {}us", def.grace.as_micros()));
    }
    text
}

impl PgStore {
    /// Adds the rows of this pool's schedule definitions that the fleet does not have yet, each
    /// with its watermark at the database's now: no slot before a definition's first
    /// registration runs. A row that exists is left alone (not even locked: a tick may hold it).
    pub(super) fn register_schedules_in_fleet(&self, defs: &[ScheduleDef]) -> Result<(), String> {
        let holder = self.holder();
        self.with_conn(|client| {
            for def in defs {
                client.execute(
                    "INSERT INTO tasq_schedules (name, definition, spec, watermark, seen_at, seen_by)
                     VALUES ($1, $2, $3, tasq_now(), tasq_now(), $4)
                     ON CONFLICT (name, definition) DO NOTHING",
                    &[&def.name, &definition(def).as_str(), &def.spec.definition().as_str(), &holder],
                )?;
            }
            Ok(())
        })
    }

    /// One tick of `def` (see the module docs).
    pub(super) fn tick_fleet_schedule(&self, def: &ScheduleDef) -> Result<Tick, String> {
        let text = definition(def);
        let holder = self.holder();
        // The tasks the committed tick added (cleared by each attempt).
        let mut added: Vec<i64> = Vec::new();
        let tick = self.with_conn(|client| {
            // An attempt that failed rolled back what it added.
            added.clear();
            let mut tx = client.transaction()?;
            tx.execute(IDLE_TIMEOUT, &[])?;
            let Some(row) = tx.query_opt(
                "SELECT watermark, tasq_now() FROM tasq_schedules
                 WHERE name = $1 AND definition = $2 FOR UPDATE",
                &[&def.name, &text.as_str()],
            )?
            else {
                // Pruned while this process was away for a week: registered again, from now.
                tx.execute(
                    "INSERT INTO tasq_schedules (name, definition, spec, watermark, seen_at, seen_by)
                     VALUES ($1, $2, $3, tasq_now(), tasq_now(), $4) ON CONFLICT DO NOTHING",
                    &[&def.name, &text.as_str(), &def.spec.definition().as_str(), &holder],
                )?;
                let now: SystemTime = tx.query_one("SELECT tasq_now()", &[])?.get(0);
                tx.commit()?;
                return Ok(Tick {
                    now,
                    next: def.spec.next_after(now),
                    paused: false,
                });
            };
            let watermark: SystemTime = row.get(0);
            let now: SystemTime = row.get(1);
            let due = schedule::due(&def.spec, def.missed, def.grace, watermark, now);
            // The payloads first, before the pause fence: a payload function (user code) that
            // pauses its own schedule must not wait for this transaction's share of the fence.
            let made: Vec<(SystemTime, Result<MadePayload, String>)> = due
                .submit
                .iter()
                .map(|&slot| (slot, def.make(slot).map(MadePayload::new)))
                .collect();
            let paused: bool = tx
                .query_one(
                    "SELECT $1 = ANY((SELECT schedules FROM tasq_paused())::TEXT[])",
                    &[&def.name],
                )?
                .get(0);
            if paused {
                tx.execute(
                    "UPDATE tasq_schedules SET seen_at = tasq_now(), seen_by = $3
                     WHERE name = $1 AND definition = $2",
                    &[&def.name, &text.as_str(), &holder],
                )?;
                tx.commit()?;
                return Ok(Tick {
                    now,
                    next: None,
                    paused: true,
                });
            }
            for (slot, payload) in made {
                let fresh = tx.execute(
                    "INSERT INTO tasq_schedule_slots (name, slot, made_at) VALUES ($1, $2, tasq_now())
                     ON CONFLICT DO NOTHING",
                    &[&def.name, &slot],
                )?;
                if fresh == 0 {
                    continue; // another definition of the name made this slot
                }
                let (task, error) = match payload {
                    Err(panicked) => (None, Some(panicked)),
                    Ok(mut payload) => {
                        let submission = def.submission(&mut payload);
                        match self.insert_slot_task(&mut tx, &submission)? {
                            Ok(seq) => {
                                added.push(seq);
                                (Some(seq), None)
                            }
                            Err(error) => (None, Some(error)),
                        }
                    }
                };
                tx.execute(
                    "UPDATE tasq_schedule_slots SET task = $3, error = $4 WHERE name = $1 AND slot = $2",
                    &[&def.name, &slot, &task, &error],
                )?;
            }
            tx.execute(
                "UPDATE tasq_schedules SET watermark = $3, seen_at = tasq_now(), seen_by = $4
                 WHERE name = $1 AND definition = $2",
                &[&def.name, &text.as_str(), &due.watermark, &holder],
            )?;
            tx.commit()?;
            Ok(Tick {
                now,
                next: def.spec.next_after(due.watermark),
                paused: false,
            })
        })?;
        if !added.is_empty() {
            self.count(|t| t.submitted += added.len() as u64);
            for &seq in &added {
                self.events.lifecycle(|| Event::Submitted {
                    id: self.id(seq),
                    task_type: self.registry.entry(def.type_index).name,
                    priority: def.priority,
                });
            }
        }
        Ok(tick)
    }

    /// Inserts a slot's task in the tick's transaction: its row id, or why the task was refused
    /// (its payload could not be serialized). Only the caller's commit makes it exist.
    fn insert_slot_task(
        &self,
        tx: &mut Tx<'_>,
        task: &Submission<'_>,
    ) -> Result<Result<i64, String>, postgres::Error> {
        let (payload, delay) = match self.prepare(task) {
            Ok(prepared) => prepared,
            Err(kind) => return Ok(Err(format!("the submit was refused: {kind}"))),
        };
        let insert = self.insert_parts(task, &payload, delay);
        match insert_task(tx, self.queue, &insert, task.dependencies)? {
            Ok(row) => {
                if due_now(row, delay) {
                    notify(tx, "ready")?;
                }
                Ok(Ok(row.0))
            }
            Err(kind) => Ok(Err(format!("the submit was refused: {kind}"))),
        }
    }

    /// The fleet's schedules, one entry per definition running (see [`ScheduleInfo`]).
    pub(super) fn list_schedules(&self) -> Result<Vec<ScheduleInfo>, String> {
        list(self, self.queue)
    }

    /// Forgets definitions no process has ticked for a week, and slots no definition can decide
    /// again (older than every remaining watermark of their name), but each name's newest.
    pub(super) fn prune_schedules(&self) -> Result<u64, String> {
        self.with_conn(|client| {
            client.execute(
                &format!(
                    "DELETE FROM tasq_schedules WHERE seen_at < tasq_now() - interval '{FORGET_DEFINITION}'"
                ),
                &[],
            )?;
            client.execute(
                "DELETE FROM tasq_schedule_slots s
                 WHERE s.slot < (SELECT max(slot) FROM tasq_schedule_slots n WHERE n.name = s.name)
                   AND s.slot <= COALESCE((SELECT min(watermark) FROM tasq_schedules d WHERE d.name = s.name),
                                          'infinity')",
                &[],
            )
        })
    }
}

/// The fleet's schedules, one entry per definition running (see [`ScheduleInfo`]).
pub(super) fn list(conns: &impl Connections, queue: u64) -> Result<Vec<ScheduleInfo>, String> {
    let rows = conns.with_conn(|client| {
        client.query(
            "SELECT d.name, d.definition, d.spec, d.watermark, l.slot, l.task, l.error,
                    t.status, t.run_at <= tasq_now(),
                    EXISTS (SELECT 1 FROM tasq_pauses p WHERE p.kind = 'schedule' AND p.name = d.name)
             FROM tasq_schedules d
             LEFT JOIN LATERAL (SELECT slot, task, error FROM tasq_schedule_slots s
                                WHERE s.name = d.name ORDER BY slot DESC LIMIT 1) l ON true
             LEFT JOIN tasq_tasks t ON t.id = l.task
             ORDER BY d.name, d.definition",
            &[],
        )
    })?;
    Ok(rows
        .iter()
        .map(|row| {
            let watermark: SystemTime = row.get(3);
            let task: Option<i64> = row.get(5);
            let status: Option<&str> = row.get(7);
            ScheduleInfo {
                name: row.get(0),
                definition: row.get(1),
                next_slot: Spec::from_definition(row.get(2))
                    .and_then(|spec| spec.next_after(watermark)),
                last_slot: row.get(4),
                last_task: task.map(|seq| TaskId::from_parts(queue, seq as u64)),
                last_state: status.map(|status| {
                    super::rows::state_of(status, row.get::<_, Option<bool>>(8).unwrap_or(true))
                }),
                last_error: row.get(6),
                paused: row.get(9),
            }
        })
        .collect())
}
