//! The numbered invariants of the embedded state machine (`state.rs`), checked one by one.

use std::collections::HashMap;

use super::ids::Seq;
use super::record::{Gating, Record};
use super::slots::Slot;
use super::state::{Counts, State};
use crate::model::state::TaskState;

impl State {
    /// Takes every record out, for [`MemoryStore`](super::store::MemoryStore)'s `Drop` to drop quietly.
    pub(crate) fn take_records(&mut self) -> Vec<Record> {
        self.tokens.clear();
        self.rouse_all();
        self.records.drain().map(|(_, record)| record).collect()
    }

    // ===== checking =====

    /// Checks the invariants in the module docs against every record; `Err` names the first one
    /// broken. For tests: it reads the whole state.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let fail = |n: u32, what: String| Err(format!("invariant {n} broken: {what}"));
        let mut counts = Counts::default();
        let mut terminal = 0;
        // How many unfinished tasks list each task as a dependent.
        let mut listed: HashMap<Seq, usize> = HashMap::new();
        for record in self.records.values().filter(|r| !r.state.is_terminal()) {
            for &dependent in record.extra.iter().flat_map(|e| &e.dependents) {
                *listed.entry(dependent).or_default() += 1;
            }
        }
        for (&seq, record) in &self.records {
            let id = self.id(seq);
            counts.enter(record.state);
            let published = record.outcome.is_published();
            if record.state.is_terminal() {
                terminal += 1;
                if !published {
                    return fail(6, format!("{id} is {} but unpublished", record.state));
                }
            } else if published {
                return fail(6, format!("{id} is {} but published", record.state));
            }
            if record.gating != Gating::Free && record.state != TaskState::Ready {
                return fail(11, format!("{} {id} is {:?}", record.state, record.gating));
            }
            let holds_payload = record.payload.is_some();
            let token = self.tokens.contains_key(&seq);
            match record.state {
                TaskState::Running if holds_payload || !token => {
                    return fail(
                        4,
                        format!("running {id}: payload {holds_payload}, token {token}"),
                    );
                }
                TaskState::Running => {}
                state if token => return fail(4, format!("{state} {id} has a token")),
                state if !state.is_terminal() && !holds_payload => {
                    return fail(4, format!("{state} {id} lost its payload"));
                }
                _ => {}
            }
            if record.state == TaskState::Blocked {
                let listed = listed.get(&seq).copied().unwrap_or(0);
                if record.pending_dependencies == 0
                    || listed != record.pending_dependencies as usize
                {
                    return fail(
                        3,
                        format!(
                            "blocked {id} counts {} pending dependencies, {listed} list it",
                            record.pending_dependencies
                        ),
                    );
                }
            }
            let in_dead = self.dead.contains(&seq);
            let lent = record.extra.as_ref().is_some_and(|e| e.lent.is_some());
            let kept = record.state == TaskState::Failed
                && record
                    .extra
                    .as_ref()
                    .is_none_or(|e| e.resubmitted_as.is_none());
            // A lent record may have left `dead` meanwhile (a purge, the limit).
            let (must, may) = (kept && holds_payload, kept && (holds_payload || lent));
            if (in_dead && !may) || (!in_dead && must) {
                return fail(
                    9,
                    format!(
                        "{id} in dead letters: {in_dead}, holds its payload: {holds_payload}, lent: {lent}"
                    ),
                );
            }
            if lent && (holds_payload || record.state != TaskState::Failed) {
                return fail(
                    9,
                    format!(
                        "lent {id} is {}, holds its payload: {holds_payload}",
                        record.state
                    ),
                );
            }
            let in_cascade = record
                .extra
                .as_ref()
                .is_some_and(|e| e.cascade_root.is_some());
            if record.state == TaskState::Cancelled && holds_payload && !in_cascade {
                return fail(10, format!("cancelled {id} holds its payload"));
            }
            if let Some(key) = record.key() {
                let holds = self.keys.get(key) == Some(&seq);
                let may = matches!(record.state, TaskState::Failed | TaskState::Cancelled);
                if holds && may {
                    return fail(8, format!("{} {id} still holds key `{key}`", record.state));
                }
            }
        }
        for (key, seq) in &self.keys {
            if self.records.get(seq).and_then(Record::key).map(|k| &**k) != Some(&**key) {
                return fail(
                    8,
                    format!(
                        "key `{key}` names {}, which does not hold it",
                        self.id(*seq)
                    ),
                );
            }
        }
        for seq in self.dormant.keys() {
            counts.enter(TaskState::Scheduled);
            if self.records.contains_key(seq)
                || self.orphans.contains_key(seq)
                || self.early_drops.contains_key(seq)
            {
                return fail(
                    1,
                    format!("dormant {} has a record or is not taken in", self.id(*seq)),
                );
            }
        }
        for (what, n, expected) in [
            ("blocked", counts.blocked, self.counts.blocked),
            ("scheduled", counts.scheduled, self.counts.scheduled),
            ("ready", counts.ready, self.counts.ready),
            ("running", counts.running, self.counts.running),
        ] {
            if n != expected {
                return fail(5, format!("{n} {what} records, counted {expected}"));
            }
        }
        if self.tokens.len() != counts.running {
            return fail(
                4,
                format!("{} tokens, {} running", self.tokens.len(), counts.running),
            );
        }
        let live_ready = self.ready.len() + self.gates.held();
        if live_ready != counts.ready {
            return fail(
                2,
                format!(
                    "{live_ready} live ready and held entries, {} ready",
                    counts.ready
                ),
            );
        }
        // Each ready task in `ready` has one live entry there, unless a gate holds it.
        let mut in_ready = std::collections::HashSet::new();
        for (_, seq) in self.ready.entries() {
            let Some(record) = self.records.get(&seq) else {
                continue;
            };
            if record.state != TaskState::Ready {
                continue;
            }
            if matches!(record.gating, Gating::Held(_)) || !in_ready.insert(seq) {
                return fail(
                    2,
                    format!("{} has a stray or second entry in ready", self.id(seq)),
                );
            }
        }
        if let Err((n, what)) = self.gates.check(&self.records) {
            return fail(n, what);
        }
        self.check_pauses()?;
        let expired = self
            .records
            .values()
            .filter(|r| r.extra.as_ref().is_some_and(|e| e.expired))
            .count();
        if terminal + self.done.len() != self.finished.len() + expired {
            return fail(
                1,
                format!(
                    "{terminal} terminal records and {} record-less successes, {} retained and \
                     {expired} expired dead letters",
                    self.done.len(),
                    self.finished.len()
                ),
            );
        }
        if let Err(what) = self.done.check() {
            return fail(18, what);
        }
        for &(seq, _) in &self.finished {
            let record_less = self.done.contains(seq);
            let terminal = self.records.get(&seq).map(|r| r.state.is_terminal());
            if record_less && terminal.is_some() {
                return fail(
                    18,
                    format!("record-less success {} has a record", self.id(seq)),
                );
            }
            if !record_less && terminal != Some(true) {
                return fail(
                    6,
                    format!("{} is in retention but not terminal", self.id(seq)),
                );
            }
        }
        if self.stopping && (counts.blocked + counts.scheduled + counts.ready) > 0 {
            return fail(7, "stopping with tasks still queued".to_owned());
        }
        for (seq, completion) in &self.orphans {
            if self.records.contains_key(seq) || !completion.is_published() {
                return fail(
                    15,
                    format!("orphan {} has a record or no outcome", self.id(*seq)),
                );
            }
        }
        for seq in self.early_drops.keys() {
            if self.records.contains_key(seq)
                || self.orphans.contains_key(seq)
                || self.done.contains(*seq)
            {
                return fail(
                    15,
                    format!("early drop {} is not in the intake", self.id(*seq)),
                );
            }
        }
        Ok(())
    }

    /// Invariant 17 for one worker's slot (locked; the worker may have popped, started or
    /// ended direct tasks since a lookup materialized it).
    pub(crate) fn check_slot(&self, slot: &Slot) -> Result<(), String> {
        let fail = |what: String| Err(format!("invariant 17 broken: {what}"));
        for entry in &slot.parked {
            if self.records.contains_key(&entry.seq) || self.done.contains(entry.seq) {
                return fail(format!("parked {} is in the state", self.id(entry.seq)));
            }
        }
        if let Some(run) = &slot.running {
            let record = self.records.get(&run.seq);
            let running = record.is_some_and(|r| r.state == TaskState::Running)
                && self.tokens.contains_key(&run.seq);
            let fits = match run.recorded {
                true => running,
                false => record.is_none() && !self.done.contains(run.seq),
            };
            if !fits {
                return fail(format!(
                    "direct {} runs, recorded {}, its record {:?}",
                    self.id(run.seq),
                    run.recorded,
                    record.map(|r| r.state)
                ));
            }
        }
        for &(seq, _) in &slot.done {
            if self.records.contains_key(&seq) || self.done.contains(seq) {
                return fail(format!("done {} is in the state twice", self.id(seq)));
            }
        }
        Ok(())
    }
}
