//! The durable store applying its gates (`gates.rs`): the gated claim, a run's verdict on its
//! type's breaker, the breakers' states, aging's turns, and the checks of the gates' rows.

use std::collections::HashMap;

use postgres::Row;

use super::conn::Sql;
use super::gates::{
    AGE, Allowances, CLAIM_KEPT, FAILED, GatedClaim, Gates, PICK, PICK_LANE, PICK_LIMITED, READ,
    SUCCEEDED, refilled,
};
use super::queue_limits::{Pick, Room};
use super::rows;
use super::store::PgStore;
use crate::gates::breaker::{BreakerState, Verdict};
use crate::observe::event::Event;

/// Claims up to `wanted` rows for a pool with gates, in one transaction (see the design note).
/// Only rows of what `pick` names (a limited queue's, within its room).
pub(super) fn claim(
    store: &PgStore,
    gates: &Gates,
    wanted: usize,
    pick: Pick<'_>,
) -> Result<GatedClaim, String> {
    let lease_us = rows::micros(store.lease);
    let queues = pick.queues();
    store.with_conn(|c| {
        let mut tx = c.transaction()?;
        let mut queue_busy = false;
        let wanted = match pick {
            Pick::Limited(queue) => match super::queue_limits::room(&mut tx, queue)? {
                Room::Busy => {
                    queue_busy = true;
                    0
                }
                Room::Rows(room) => room.min(wanted),
            },
            Pick::Every | Pick::Lane(_) => wanted,
        };
        let mut allow = Allowances::new(gates);
        let mut claimed: Vec<Row> = Vec::new();
        loop {
            let want = wanted.saturating_sub(claimed.len());
            let types: Vec<&str> = store
                .types
                .iter()
                .enumerate()
                .filter(|(i, _)| !allow.excluded.contains(&(*i as u32)))
                .map(|(_, name)| name.as_str())
                .collect();
            if want == 0 || types.is_empty() {
                break;
            }
            let limit = i64::try_from(want).unwrap_or(i64::MAX);
            let picked = match pick {
                Pick::Every => tx.query(PICK, &[&types, &limit, &lease_us, &gates.gated])?,
                Pick::Lane(_) => tx.query(
                    PICK_LANE,
                    &[&types, &limit, &lease_us, &gates.gated, &queues],
                )?,
                Pick::Limited(_) => tx.query(
                    PICK_LIMITED,
                    &[&types, &limit, &lease_us, &gates.gated, &queues],
                )?,
            };
            let full = picked.len() == want;
            let mut candidates: Vec<(i16, std::time::SystemTime, i64, u32)> = Vec::new();
            for row in picked {
                if row.get::<_, Option<i64>>(4).is_some() {
                    claimed.push(row);
                    continue;
                }
                // Always found: the pick takes only this pool's types.
                if let Some(index) = store.type_index(row.get(1)) {
                    candidates.push((row.get(5), row.get(6), row.get(0), index));
                }
            }
            if candidates.is_empty() {
                break;
            }
            // The claim's order (the statement returns its rows in any order).
            candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            let mut types: Vec<u32> = candidates.iter().map(|c| c.3).collect();
            types.sort_unstable();
            types.dedup();
            allow.read(&mut tx, &types)?;
            let probes_before = allow.probes.len();
            let mut kept = Vec::new();
            let mut dropped = false;
            for &(_, _, id, index) in &candidates {
                if allow.take(index, id) {
                    kept.push(id);
                } else {
                    dropped = true;
                }
            }
            if !kept.is_empty() {
                let (bucket_names, bucket_tokens) = allow.buckets();
                let new_probes = &allow.probes[probes_before..];
                let probe_names: Vec<&str> = new_probes
                    .iter()
                    .map(|&(d, _, _)| gates.downstreams[d].0)
                    .collect();
                let probe_ids: Vec<i64> = new_probes.iter().map(|&(_, id, _)| id).collect();
                claimed.extend(tx.query(
                    CLAIM_KEPT,
                    &[
                        &kept,
                        &lease_us,
                        &bucket_names,
                        &bucket_tokens,
                        &probe_names,
                        &probe_ids,
                    ],
                )?);
            }
            if !dropped || !full {
                break;
            }
        }
        tx.commit()?;
        let changes = allow
            .probes
            .iter()
            .filter(|&&(_, _, from_open)| from_open)
            .map(|&(d, _, _)| (gates.downstreams[d].0, BreakerState::HalfOpen))
            .collect();
        Ok(GatedClaim {
            rows: claimed,
            changes,
            hold: std::mem::take(&mut allow.hold),
            queue_busy,
        })
    })
}

/// Records what a run of task `seq`, leased as `lease`, says about downstream `downstream` (a
/// registry index), before its ending is written, at `ended_at` (the time the run ended, as
/// `PgStore::finish` takes it); reports a change of state. A run whose lease is lost or whose
/// cancel was asked for says nothing; so does a `Neither` run, whose probe slot (if it was the
/// probe) frees itself once its row stops running.
pub(super) fn record(
    store: &PgStore,
    downstream: usize,
    seq: i64,
    lease: i64,
    verdict: Verdict,
    ended_at: Option<i64>,
) {
    let Some(&(name, breaker)) = store.registry.downstreams.get(downstream) else {
        return;
    };
    let threshold = i32::try_from(breaker.failures()).unwrap_or(i32::MAX);
    let rows = match verdict {
        Verdict::Neither => return,
        Verdict::Success => {
            store.with_conn_at(ended_at, |c| c.query(SUCCEEDED, &[&name, &seq, &lease]))
        }
        Verdict::Failure => store.with_conn_at(ended_at, |c| {
            c.query(FAILED, &[&name, &seq, &lease, &threshold])
        }),
    };
    // A failed write loses one outcome at worst: the breaker stays as it was.
    let Ok(rows) = rows else {
        return;
    };
    for row in rows {
        let (before, after): (&str, &str) = (row.get(0), row.get(1));
        if before != after {
            store.events.emit(Event::Breaker {
                downstream: name,
                state: BreakerState::parse(after),
            });
        }
    }
}

/// Each breaker of the pool as its row says now, in registry order (no row yet: closed).
pub(super) fn breaker_states(store: &PgStore) -> Vec<(&'static str, BreakerState)> {
    let names: Vec<&'static str> = store
        .registry
        .downstreams
        .iter()
        .map(|&(name, _)| name)
        .collect();
    let rows = store
        .with_conn(|c| {
            c.query(
                "SELECT name, state FROM tasq_gates WHERE kind = 'downstream' AND name = ANY($1)",
                &[&names],
            )
        })
        .unwrap_or_default();
    let states: HashMap<&str, BreakerState> = rows
        .iter()
        .map(|row| (row.get(0), BreakerState::parse(row.get(1))))
        .collect();
    names
        .iter()
        .map(|&name| {
            (
                name,
                states.get(name).copied().unwrap_or(BreakerState::Closed),
            )
        })
        .collect()
}

/// The types of the pool whose ready tasks cannot start until the clock moves: an empty
/// bucket, a breaker open and cooling down. (A concurrency limit or a probe holds tasks back
/// only while others run.) For `wait_idle`.
pub(super) fn held_until_later(store: &PgStore, gates: &Gates) -> Result<Vec<String>, String> {
    let (types, downstreams) = gates.row_names();
    let rows = store.with_conn(|c| c.query(READ, &[&types, &downstreams, &Vec::<&str>::new()]))?;
    let mut held = Vec::new();
    for row in &rows {
        let kind: &str = row.get(0);
        let name: &str = row.get(1);
        if kind == "type" {
            let Some(gate) = gates.types.iter().find(|t| t.name == name) else {
                continue;
            };
            if let Some(rate) = gate.rate {
                if refilled(row, &rate) < 1.0 - 1e-9 {
                    held.push(name.to_owned());
                }
            }
        } else if let Some(d) = gates.downstreams.iter().position(|&(n, _)| n == name) {
            let cool_down = gates.downstreams[d].1.cool_down().as_secs_f64();
            let open = BreakerState::parse(row.get(4)) == BreakerState::Open
                && row.get::<_, Option<f64>>(5).unwrap_or(f64::INFINITY) < cool_down;
            if open {
                held.extend(
                    gates
                        .types
                        .iter()
                        .filter(|t| t.downstream == Some(d))
                        .map(|t| t.name.to_owned()),
                );
            }
        }
    }
    Ok(held)
}

/// The pool's concurrency limits hold over the rows (for `check_invariants`).
pub(super) fn check(store: &PgStore, gates: &Gates) -> Result<(), String> {
    for gate in &gates.types {
        let Some(limit) = gate.concurrency else {
            continue;
        };
        let running: i64 = store
            .with_conn(|c| {
                c.query_one(
                    "SELECT count(*) FROM tasq_tasks WHERE status = 'running' AND type = $1",
                    &[&gate.name],
                )
            })?
            .get(0);
        if running > i64::from(limit) {
            return Err(format!(
                "invariant broken: {running} tasks of {} run at once, over its limit of {limit}",
                gate.name
            ));
        }
    }
    Ok(())
}

/// Runs the aging update if one `every` of the pool's clock has passed since the last (see the
/// design note); called by the fetcher before a claim (`wait`) and by the maintenance thread.
///
/// When the fetcher's call returns, the rows are aged to at least the clock's time at the call:
/// the update that became due by then has committed, whichever thread ran it. So the fetcher
/// waits for an update in flight in the maintenance thread, which may have taken the turn of
/// the clock's latest move, rather than claim past it with the priorities of an `every` ago
/// (the maintenance thread, for which an update in flight will do, never waits). An update's
/// `tasq_now()` is read after the `now` that made it due, so it is never earlier.
pub(super) fn age_if_due(store: &PgStore, wait: bool) {
    let Some(aging) = store.registry.aging else {
        return;
    };
    {
        let mut turn = store.aging.lock();
        while turn.running {
            if !wait {
                return;
            }
            store.aging_cv.wait(&mut turn);
        }
        let now = store.clock.now();
        if turn.next.is_some_and(|at| now < at) {
            return;
        }
        turn.next = Some(now.checked_add(aging.every()).unwrap_or(now));
        turn.running = true;
    }
    // SQL never runs under the lock. The turn is handed back however this ends, a panic
    // included: a fetcher waiting for it must not wait forever.
    let mut turn = TurnEnd { store, aged: false };
    let ceiling = i32::from(aging.ceiling());
    let every_us = rows::micros(aging.every()).max(1);
    loop {
        match store.with_conn(|c| c.execute(AGE, &[&store.types, &ceiling, &every_us])) {
            Ok(n) if n < 5000 => {
                turn.aged = true;
                return;
            }
            Ok(_) => {}
            // Due again at once: tried at the next claim or maintenance step.
            Err(_) => return,
        }
    }
}

/// Ends an aging turn when dropped: no update in flight any more (due again at once if this
/// one did not finish), and the fetcher woken if it waits for the turn.
struct TurnEnd<'a> {
    store: &'a PgStore,
    aged: bool,
}

impl Drop for TurnEnd<'_> {
    fn drop(&mut self) {
        let mut turn = self.store.aging.lock();
        turn.running = false;
        if !self.aged {
            turn.next = None;
        }
        self.store.aging_cv.notify_all();
    }
}
