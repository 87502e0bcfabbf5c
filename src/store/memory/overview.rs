//! An embedded pool's figures for an operator ([`Overview`]): one pass over the records under
//! the lock, as `type_stats` makes, with the last minutes' endings from `minutes.rs`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use super::state::State;
use crate::model::pause::PauseTarget;
use crate::model::state::TaskState;
use crate::observe::console::overview::{
    BreakerOverview, Minute, Overview, QueueOverview, StateCounts, TypeOverview,
};

impl State {
    /// The pool's figures at `now`, `wall` the same moment by the wall clock. Every registered
    /// type and every queue of one is listed, whether it has tasks or not.
    pub(crate) fn overview(&mut self, now: Instant, wall: SystemTime) -> Overview {
        let stats = self.stats(now);
        let at_wall = |at: Instant| wall - now.saturating_duration_since(at);
        let mut types: Vec<TypeOverview> = self
            .names
            .iter()
            .map(|name| TypeOverview {
                name: (*name).to_owned(),
                ready: 0,
                running: 0,
                dead: 0,
                oldest_ready: None,
                paused: self
                    .pauses
                    .contains_key(&PauseTarget::Type((*name).to_owned())),
            })
            .collect();
        let mut states = StateCounts {
            blocked: stats.blocked,
            ready: stats.ready,
            scheduled: stats.scheduled,
            running: stats.running,
            dead: stats.dead_letters,
            // The record-less successes retention still remembers; the records' below.
            succeeded: self.done.len(),
            ..StateCounts::default()
        };
        for record in self.records.values() {
            let t = &mut types[record.type_index as usize];
            match record.state {
                TaskState::Ready => {
                    t.ready += 1;
                    let age = now.saturating_duration_since(self.epoch.instant(record.since));
                    t.oldest_ready = t.oldest_ready.max(Some(age));
                }
                TaskState::Running => t.running += 1,
                TaskState::Succeeded => states.succeeded += 1,
                TaskState::Failed => states.failed += 1,
                TaskState::Cancelled => states.cancelled += 1,
                TaskState::Blocked | TaskState::Scheduled => {}
            }
        }
        for &seq in &self.dead {
            if let Some(record) = self.records.get(&seq) {
                types[record.type_index as usize].dead += 1;
            }
        }
        let mut queues: BTreeMap<&str, QueueOverview> = BTreeMap::new();
        for (t, &name) in types.iter().zip(&self.queues) {
            let q = queues.entry(name).or_insert_with(|| QueueOverview {
                name: name.to_owned(),
                ready: 0,
                running: 0,
                oldest_ready: None,
                paused: self
                    .pauses
                    .contains_key(&PauseTarget::Queue(name.to_owned())),
                limit: None,
            });
            q.ready += t.ready;
            q.running += t.running;
            q.oldest_ready = q.oldest_ready.max(t.oldest_ready);
        }
        for limit in self.queue_limits() {
            if let Some(q) = queues.get_mut(limit.queue.as_str()) {
                q.limit = Some(limit.max_running);
            }
        }
        types.sort_by(|a, b| a.name.cmp(&b.name));
        let stamp = self.stamp(now);
        let minutes: Vec<Minute> = self
            .minutes
            .last(stamp)
            .into_iter()
            .map(|(back, [succeeded, failed, cancelled])| Minute {
                at: wall - Duration::from_nanos(back),
                succeeded,
                failed,
                cancelled,
                complete: true,
            })
            .collect();
        let ended: usize = minutes
            .iter()
            .map(|m| m.succeeded + m.failed + m.cancelled)
            .sum();
        let span = minutes.first().map_or(0.0, |m| {
            wall.duration_since(m.at).unwrap_or_default().as_secs_f64()
        });
        Overview {
            at: wall,
            states,
            estimated: false,
            oldest_ready: stats.oldest_ready,
            ready_by_priority: stats.ready_by_priority,
            queues: queues.into_values().collect(),
            types,
            minutes,
            throughput: if span > 0.0 { ended as f64 / span } else { 0.0 },
            paused: self.paused(),
            breakers: self
                .gates
                .breaker_cells()
                .into_iter()
                .map(|(name, state, consecutive, opened_at)| BreakerOverview {
                    downstream: name.to_owned(),
                    state,
                    consecutive_failures: consecutive,
                    opened_at: opened_at.map(at_wall),
                })
                .collect(),
        }
    }
}
