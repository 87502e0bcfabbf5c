//! The last minutes' endings, for an operator's overview: how many tasks succeeded, failed for
//! good and were cancelled in each minute of the pool's clock, the last [`MINUTES`] kept.
//!
//! Counted in `State::finish`, under the lock the ending already holds: a comparison and an
//! increment a task. A minute no task ended in has no entry; the overview fills the gaps.

use std::collections::VecDeque;

use super::queue::Stamp;
use crate::model::state::TaskState;

/// How many minutes an overview shows, the current one included.
pub(crate) const MINUTES: u64 = 15;

const NANOS_A_MINUTE: u64 = 60_000_000_000;

/// Endings a minute: `(minute, [succeeded, failed, cancelled])`, the minute as a count of
/// minutes since the pool's epoch, oldest first, no two alike, at most [`MINUTES`].
#[derive(Debug, Default)]
pub(crate) struct Minutes {
    counts: VecDeque<(u64, [usize; 3])>,
}

impl Minutes {
    /// Counts a task that ended at `at` in terminal state `state`.
    pub(crate) fn count(&mut self, at: Stamp, state: TaskState) {
        let slot = match state {
            TaskState::Succeeded => 0,
            TaskState::Failed => 1,
            TaskState::Cancelled => 2,
            _ => return,
        };
        let minute = at / NANOS_A_MINUTE;
        match self.counts.back_mut() {
            Some((last, counts)) if *last == minute => counts[slot] += 1,
            // A stamp never goes back (the pool's clock is monotonic, `State::stamp`).
            Some((last, _)) if *last > minute => {}
            _ => {
                let mut counts = [0; 3];
                counts[slot] = 1;
                self.counts.push_back((minute, counts));
                while self.counts.len() as u64 > MINUTES {
                    self.counts.pop_front();
                }
            }
        }
    }

    /// The last [`MINUTES`] minutes up to the one holding `now`, oldest first: each minute's
    /// start (nanoseconds before `now`) and its endings, zero where none ended.
    pub(crate) fn last(&self, now: Stamp) -> Vec<(u64, [usize; 3])> {
        let current = now / NANOS_A_MINUTE;
        let first = current.saturating_sub(MINUTES - 1);
        (first..=current)
            .map(|minute| {
                let counts = self
                    .counts
                    .iter()
                    .find(|(m, _)| *m == minute)
                    .map_or([0; 3], |(_, c)| *c);
                (now - minute * NANOS_A_MINUTE, counts)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = NANOS_A_MINUTE;

    #[test]
    fn endings_fall_in_their_minute_and_old_minutes_go() {
        let mut minutes = Minutes::default();
        minutes.count(MIN / 2, TaskState::Succeeded);
        minutes.count(MIN / 2 + 1, TaskState::Failed);
        minutes.count(3 * MIN, TaskState::Cancelled);
        minutes.count(3 * MIN + 5, TaskState::Succeeded);
        minutes.count(3 * MIN + 6, TaskState::Running);
        let last = minutes.last(3 * MIN + 10);
        assert_eq!(last.len(), 4, "minutes 0 to 3 since the epoch");
        assert_eq!(last[0], (3 * MIN + 10, [1, 1, 0]));
        assert_eq!(last[1], (2 * MIN + 10, [0, 0, 0]));
        assert_eq!(last[3], (10, [1, 0, 1]));
        let later = minutes.last(17 * MIN);
        assert_eq!(later.len() as u64, MINUTES);
        assert_eq!(
            later.iter().map(|(_, c)| c[0]).sum::<usize>(),
            1,
            "minute 3 is still shown"
        );
        for m in 4..40 {
            minutes.count(m * MIN, TaskState::Succeeded);
        }
        assert_eq!(minutes.counts.len() as u64, MINUTES, "at most MINUTES kept");
        assert_eq!(minutes.last(39 * MIN)[0].1, [1, 0, 0]);
    }
}
