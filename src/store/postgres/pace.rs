//! How far a lane claims ahead of its workers when the pool was not told
//! (`Builder::prefetch` unset): enough that its workers never wait for a claim while a backlog
//! lasts, and nothing beyond its free workers once the backlog is gone.
//!
//! # The rule
//!
//! A claim costs a round trip. While it is in flight, each worker finishes about
//! `claim / turn` tasks, where `turn` is a worker's time per task as this lane sees it: from
//! taking a claim to its slot coming free (the handler, and the write of its ending). So a
//! lane that holds `workers × claim / turn` tasks beyond its workers (Little's law) keeps them
//! busy through the next claim on average; it holds twice that, for the claims and turns
//! longer than their mean, and a task waits here about two claims' round trips at most. Both
//! times are smoothed over the last runs and claims (an exponentially weighted mean).
//!
//! - A claim that saw **more** ready rows than it took (the claim's pick locks one row beyond
//!   its limit and leaves it): there is a backlog, and the next claim may take that many
//!   ahead, at most [`Pace::most`].
//! - A claim that saw no more: the ready rows ran out, and the next claims take only what the
//!   free workers can start, as a pool with no prefetch does. Tasks that arrive one by one
//!   then go to whichever pool is free, never wait here behind a busy worker while an idle
//!   pool elsewhere could run them (a claim that takes the one task there is, however many
//!   it asked for, is no backlog).
//! - The claims of a limited queue and those of a pool with gates never see more: claimed
//!   ahead, their rows would hold the fleet's room (a queue's limit, a type's) in this
//!   process while its workers are busy. Such a pool claims only for its free workers, unless
//!   `Builder::prefetch` says otherwise.
//! - Long tasks (a turn far above a claim's round trip) round down to no prefetch at all: the
//!   rows stay in the table for the idle pools of the fleet.
//!
//! Before its first runs have ended, a lane knows no turn, and claims only for its free
//! workers.

use std::time::Duration;

/// The weight of the newest sample in the smoothed means.
const WEIGHT: f64 = 0.2;
/// How many claims' worth of turns a lane holds ahead.
const SLACK: f64 = 2.0;
/// The most a lane claims ahead of its workers, per worker ...
const MOST_PER_WORKER: usize = 8;
/// ... and at least this many (one worker on short tasks: claims of 33).
const MOST_AT_LEAST: usize = 32;

/// A lane's pace: the smoothed times its prefetch follows.
#[derive(Clone, Debug)]
pub(super) struct Pace {
    workers: usize,
    /// A claim's round trip, in seconds.
    claim: Option<f64>,
    /// A worker's time per task, in seconds.
    turn: Option<f64>,
}

impl Pace {
    pub(super) fn new(workers: usize) -> Pace {
        Pace {
            workers,
            claim: None,
            turn: None,
        }
    }

    /// The most the lane claims ahead of its workers.
    pub(super) fn most(&self) -> usize {
        (self.workers * MOST_PER_WORKER).max(MOST_AT_LEAST)
    }

    /// A worker's turn ended: it took `took` from taking its claim to its slot coming free.
    pub(super) fn ran(&mut self, took: Duration) {
        smooth(&mut self.turn, took);
    }

    /// A claim took `took`, and saw `more` ready rows than it took (or not): the prefetch
    /// for the next (see the module docs).
    pub(super) fn claimed(&mut self, more: bool, took: Duration) -> usize {
        smooth(&mut self.claim, took);
        if !more {
            return 0;
        }
        let (Some(claim), Some(turn)) = (self.claim, self.turn) else {
            return 0;
        };
        // A turn of no measurable length (a clock's granularity) claims the most.
        let ahead = SLACK * self.workers as f64 * claim / turn.max(1e-9);
        let most = self.most();
        if ahead >= most as f64 {
            most
        } else {
            // Rounded down (past a float's error): a turn longer than the round trip holds
            // nothing ahead.
            (ahead * (1.0 + 1e-9)) as usize
        }
    }
}

fn smooth(mean: &mut Option<f64>, sample: Duration) {
    let sample = sample.as_secs_f64();
    *mean = Some(match *mean {
        Some(mean) => mean + WEIGHT * (sample - mean),
        None => sample,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn nothing_ahead_before_a_turn_is_known() {
        let mut pace = Pace::new(4);
        assert_eq!(pace.claimed(true, MS), 0);
    }

    #[test]
    fn short_turns_and_a_backlog_claim_a_round_trip_ahead() {
        let mut pace = Pace::new(2);
        // A turn of 0.5 ms, a claim of 1 ms: each worker ends 2 tasks per claim, and the lane
        // holds two claims' worth.
        pace.ran(MS / 2);
        assert_eq!(pace.claimed(true, MS), 8);
        // Longer turns hold fewer ahead: 2 x 2 workers x 1 ms / 2 ms.
        let mut pace = Pace::new(2);
        pace.ran(MS * 2);
        assert_eq!(pace.claimed(true, MS), 2);
    }

    #[test]
    fn a_claim_that_sees_no_more_ready_rows_ends_the_prefetch() {
        let mut pace = Pace::new(2);
        pace.ran(MS / 2);
        assert_eq!(pace.claimed(true, MS), 8);
        assert_eq!(pace.claimed(false, MS), 0);
        // The backlog is back: so is the prefetch.
        assert_eq!(pace.claimed(true, MS), 8);
    }

    #[test]
    fn long_turns_claim_nothing_ahead() {
        let mut pace = Pace::new(8);
        pace.ran(Duration::from_secs(1));
        assert_eq!(pace.claimed(true, MS), 0);
        // Just longer than 2 x 8 claims: still nothing.
        let mut pace = Pace::new(8);
        pace.ran(MS * 17);
        assert_eq!(pace.claimed(true, MS), 0);
    }

    #[test]
    fn the_prefetch_is_bounded() {
        let mut pace = Pace::new(1);
        pace.ran(Duration::ZERO);
        assert_eq!(pace.claimed(true, MS), MOST_AT_LEAST);
        let mut pace = Pace::new(10);
        pace.ran(Duration::from_nanos(1));
        assert_eq!(pace.claimed(true, MS), 10 * MOST_PER_WORKER);
    }

    #[test]
    fn the_means_follow_the_newest_samples() {
        let mut pace = Pace::new(1);
        pace.ran(MS * 2);
        // One slow claim among fast ones moves the mean a fifth of the way: 1 + (6 - 1) / 5.
        pace.claimed(true, MS);
        assert_eq!(pace.claimed(true, MS * 6), 2);
        for _ in 0..40 {
            pace.claimed(true, MS * 6);
        }
        // Close to 6 ms, never past it: 2 x 5.99.. / 2 rounds down.
        assert_eq!(pace.claimed(true, MS * 6), 5);
    }
}
